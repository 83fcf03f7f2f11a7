//! The backend directory of cache mode: where ringfs paths under the mount path live on the
//! parallel file system, and the file operations the cache performs there.
//!
//! A ringfs path `MOUNT/x/y` maps to `BACKEND/x/y`. ringfs paths are canonical (no `.` or
//! `..` components, see `ringfs_proto::path`), so a mapped path never leaves the backend
//! directory. Everything here is plain POSIX file access; when and why it happens is decided
//! by the store (loading, flushing) and the server (the flush policy).

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ringfs_proto::path;
use ringfs_proto::{Attr, ChunkIndex, EntryFlags, FileId, FileKind};

/// Times an operation denied for want of write permission tries again while another server
/// has the permission lent (1 ms apart).
const LEND_ATTEMPTS: usize = 20;

/// Bytes one backend write covers at most; the flusher checks between pieces whether it
/// must stop for application I/O.
pub const FLUSH_PIECE_BYTES: usize = 256 << 10;

/// The backend directory and the ringfs directory it appears at.
#[derive(Clone, Debug)]
pub struct BackendDir {
    root: PathBuf,
    /// The backend directory, held open: lookups resolve paths beneath it.
    root_fd: Arc<OwnedFd>,
    /// Canonical ringfs path the backend appears at (`/` for the whole name space).
    mount: String,
}

/// What kind of entry a pending removal removes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemovalKind {
    File,
    Directory,
}

fn not_found(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::NotFound
}

impl BackendDir {
    pub fn new(root: PathBuf, mount: &str) -> Result<BackendDir, String> {
        let mount = path::canonicalize(mount).map_err(|errno| format!("invalid mount path {mount:?}: {errno}"))?;
        if !root.is_dir() {
            return Err(format!("backend {} is not a directory", root.display()));
        }
        let root_fd = File::open(&root).map_err(|error| format!("backend {}: {error}", root.display()))?;
        Ok(BackendDir { root, root_fd: Arc::new(root_fd.into()), mount })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn mount_path(&self) -> &str {
        &self.mount
    }

    /// Whether `path` (canonical) lies in the cached tree: the mount path or below it.
    pub fn covers(&self, path: &str) -> bool {
        path == self.mount || path::is_inside(path, &self.mount)
    }

    /// The backend location of a ringfs path in the cached tree.
    pub fn locate(&self, path: &str) -> Option<PathBuf> {
        if path == self.mount {
            return Some(self.root.clone());
        }
        let relative = path.strip_prefix(self.mount.as_str())?.trim_start_matches('/');
        (self.covers(path) && !relative.is_empty()).then(|| self.root.join(relative))
    }

    fn location(&self, path: &str) -> io::Result<PathBuf> {
        self.locate(path).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{path} is outside the cached tree")))
    }

    /// The attributes of the backend entry at `path` as a cached ringfs entry would carry
    /// them, or `None` if there is none (or it is of a type ringfs does not store).
    pub fn entry_attr(&self, path: &str, chunk_size: u32) -> io::Result<Option<Attr>> {
        Ok(self.entry(path, chunk_size)?.map(|(attr, _)| attr))
    }

    /// [`BackendDir::entry_attr`], with which backend file it is (device, inode).
    pub fn entry(&self, path: &str, chunk_size: u32) -> io::Result<Option<(Attr, (u64, u64))>> {
        match self.metadata_beneath(path) {
            Ok(metadata) => Ok(attr_of(&metadata, chunk_size).map(|attr| (attr, identity(&metadata)))),
            // A symbolic link on the way (ELOOP): ringfs paths do not go through links.
            Err(error) if not_found(&error) || matches!(error.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR | libc::EXDEV)) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The metadata of the backend entry at `path`, found without following symbolic links
    /// on the way (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`): a link in the
    /// backend is an entry of its own, never a way out of the backend directory.
    fn metadata_beneath(&self, path: &str) -> io::Result<fs::Metadata> {
        let location = self.location(path)?;
        let relative = location.strip_prefix(&self.root).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        if relative.as_os_str().is_empty() {
            return fs::metadata(&self.root);
        }
        let relative = CString::new(relative.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `open_how` is plain data; all-zero is its empty value.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64;
        how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;
        // SAFETY: a valid directory descriptor, NUL-terminated path and `open_how` of the size
        // passed; the descriptor returned is owned by the `File` made from it.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.root_fd.as_raw_fd(),
                relative.as_ptr(),
                &how as *const libc::open_how,
                size_of::<libc::open_how>(),
            )
        };
        if fd < 0 {
            let error = io::Error::last_os_error();
            // Kernels before 5.6 lack openat2, and some container sandboxes refuse it (EPERM):
            // look the path up as it is.
            return match error.raw_os_error() {
                Some(libc::ENOSYS | libc::EPERM) => fs::symlink_metadata(&location),
                _ => Err(error),
            };
        }
        // SAFETY: `fd` is a new descriptor nobody else owns.
        unsafe { File::from_raw_fd(fd as RawFd) }.metadata()
    }

    /// Target of the backend symbolic link at `path`.
    pub fn read_link(&self, path: &str) -> io::Result<String> {
        let target = fs::read_link(self.location(path)?)?;
        target.into_os_string().into_string().map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "link target is not UTF-8"))
    }

    /// Reads up to `buffer.len()` bytes of the backend file at `offset`; fewer at its end.
    pub fn read_at(&self, path: &str, offset: u64, buffer: &mut [u8]) -> io::Result<usize> {
        let file = File::open(self.location(path)?)?;
        let mut done = 0;
        while done < buffer.len() {
            match file.read_at(&mut buffer[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(count) => done += count,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        Ok(done)
    }

    /// Reads the backend directory `dir`; a missing directory reads as empty.
    fn read_dir(&self, dir: &str) -> io::Result<Option<fs::ReadDir>> {
        match fs::read_dir(self.location(dir)?) {
            Ok(entries) => Ok(Some(entries)),
            Err(error) if not_found(&error) || error.raw_os_error() == Some(libc::ENOTDIR) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The entries of the backend directory `dir` that ringfs shows (every type, with valid
    /// names), sorted by name, with their attributes. A missing directory lists as empty.
    pub fn list(&self, dir: &str, chunk_size: u32) -> io::Result<Vec<(String, Attr)>> {
        let Some(entries) = self.read_dir(dir)? else { return Ok(Vec::new()) };
        let mut listing = Vec::new();
        for entry in entries {
            let entry = entry?;
            let Ok(name) = entry.file_name().into_string() else { continue };
            if path::validate(&path::join(dir, &name)).is_err() || is_temporary(&name) {
                continue;
            }
            match entry.metadata() {
                Ok(metadata) => listing.extend(attr_of(&metadata, chunk_size).map(|attr| (name, attr))),
                Err(error) if not_found(&error) => {}
                Err(error) => return Err(error),
            }
        }
        listing.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(listing)
    }

    /// Every name in the backend directory `dir`, those ringfs does not show included (names
    /// that are not UTF-8 come lossily converted, so no ringfs name matches them).
    pub fn all_names(&self, dir: &str) -> io::Result<Vec<String>> {
        let Some(entries) = self.read_dir(dir)? else { return Ok(Vec::new()) };
        let names: io::Result<Vec<String>> =
            entries.map(|entry| entry.map(|entry| entry.file_name().to_string_lossy().into_owned())).collect();
        Ok(names?.into_iter().filter(|name| !is_temporary(name)).collect())
    }

    // ----- flushing -------------------------------------------------------------------------

    /// Creates the parent directories of `location` as needed.
    fn make_parents(location: &Path) -> io::Result<()> {
        match location.parent() {
            Some(parent) => fs::create_dir_all(parent),
            None => Ok(()),
        }
    }

    /// Removes whatever is at `location` (a whole tree for a directory); nothing there is fine.
    fn remove_location(location: &Path) -> io::Result<()> {
        let outcome = match fs::symlink_metadata(location) {
            Ok(metadata) if metadata.is_dir() => fs::remove_dir_all(location),
            Ok(_) => fs::remove_file(location),
            Err(error) => Err(error),
        };
        match outcome {
            Err(error) if not_found(&error) => Ok(()),
            other => other,
        }
    }

    /// Makes `path` a new empty regular file with `mode`, replacing what is there. The file
    /// is a new inode, so a flush that opened the old file cannot write into the new one; it
    /// is made under a temporary name and renamed over the old one, so the two exist at once
    /// and the new one never takes the old one's inode number (a flush of the old file that
    /// still knows its number then never mistakes the new one for it).
    ///
    /// The temporary name is the file's own (`owner`): a server that died between making
    /// the file and renaming it finds it again when it applies the creation once more after
    /// its restart, and replaces it (a name of its own per attempt was left behind for good).
    pub fn create_file(&self, path: &str, mode: u32, owner: FileId) -> io::Result<()> {
        let location = self.location(path)?;
        with_write_permission(parent_of(&location), || {
            if fs::symlink_metadata(&location).is_ok_and(|metadata| metadata.is_dir()) {
                Self::remove_location(&location)?;
            }
            let temporary = temporary_beside(&location, NEW_FILE_PREFIX, owner);
            let open = || OpenOptions::new().write(true).create_new(true).mode(mode & 0o7777).open(&temporary);
            retry_over_leftover(&temporary, || match open() {
                Err(error) if not_found(&error) => {
                    Self::make_parents(&location)?;
                    open().map(drop)
                }
                other => other.map(drop),
            })?;
            fs::rename(&temporary, &location).inspect_err(|_| {
                let _ = fs::remove_file(&temporary);
            })
        })
    }

    /// Makes `path` a directory (creating parents; replacing a non-directory) with `mode`.
    pub fn make_dir(&self, path: &str, mode: u32) -> io::Result<()> {
        let location = self.location(path)?;
        with_write_permission(parent_of(&location), || {
            if fs::symlink_metadata(&location).is_ok_and(|metadata| !metadata.is_dir()) {
                fs::remove_file(&location)?;
            }
            fs::create_dir_all(&location)
        })?;
        fs::set_permissions(&location, fs::Permissions::from_mode(mode & 0o7777))
    }

    /// Makes `path` a symbolic link to `target`, replacing what is there.
    pub fn make_symlink(&self, path: &str, target: &str) -> io::Result<()> {
        let location = self.location(path)?;
        with_write_permission(parent_of(&location), || {
            Self::remove_location(&location)?;
            match std::os::unix::fs::symlink(target, &location) {
                Err(error) if not_found(&error) => {
                    Self::make_parents(&location)?;
                    std::os::unix::fs::symlink(target, &location)
                }
                other => other,
            }
        })
    }

    /// Makes `path` a FIFO, device or socket node (`mknod`), replacing what is there.
    pub fn make_special(&self, path: &str, mode: u32, rdev: u64) -> io::Result<()> {
        let location = self.location(path)?;
        let name = CString::new(location.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let make = || {
            // SAFETY: a valid NUL-terminated path.
            match unsafe { libc::mknod(name.as_ptr(), mode as libc::mode_t, rdev as libc::dev_t) } {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            }
        };
        with_write_permission(parent_of(&location), || {
            Self::remove_location(&location)?;
            match make() {
                Err(error) if not_found(&error) => {
                    Self::make_parents(&location)?;
                    make()
                }
                other => other,
            }
        })
    }

    /// Cuts the backend file at `path` to at most `len` bytes (a missing file is fine).
    pub fn trim(&self, path: &str, len: u64, identity: Option<(u64, u64)>) -> io::Result<()> {
        let location = self.location(path)?;
        match with_write_permission(&location, || OpenOptions::new().write(true).open(&location)) {
            Ok(file) => {
                if !is_file(&file, identity)? {
                    // Another file's now: the cut is not for it.
                    return Err(io::Error::from_raw_os_error(libc::EAGAIN));
                }
                if file.metadata()?.len() > len {
                    file.set_len(len)?;
                }
                Ok(())
            }
            Err(error) if not_found(&error) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Sets the permission bits of the backend entry at `path`.
    pub fn set_mode(&self, path: &str, mode: u32) -> io::Result<()> {
        fs::set_permissions(self.location(path)?, fs::Permissions::from_mode(mode & 0o7777))
    }

    /// Opens the existing backend file at `path` for writing.
    pub fn open_existing(&self, path: &str) -> io::Result<File> {
        let location = self.location(path)?;
        with_write_permission(&location, || OpenOptions::new().write(true).open(&location))
    }

    /// Which backend file is at `path` now (device, inode), not following a final link;
    /// `None` if nothing is.
    pub fn identity_of(&self, path: &str) -> io::Result<Option<(u64, u64)>> {
        match fs::symlink_metadata(self.location(path)?) {
            Ok(metadata) => Ok(Some(identity(&metadata))),
            Err(error) if not_found(&error) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Forces everything written to the backend's file system to stable storage (`syncfs`:
    /// one call, however many files changed).
    pub fn sync_all(&self) -> io::Result<()> {
        // SAFETY: a valid descriptor held open by `self`.
        match unsafe { libc::syncfs(self.root_fd.as_raw_fd()) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// Moves the backend entry at `from` (a whole tree for a directory) to `to`, for a
    /// directory rename in ringfs. What is at `to` goes first: ringfs allowed the rename only
    /// over an absent name or an empty directory, so anything the backend still holds there
    /// was removed in ringfs. Parents of `to` are made as needed. Nothing at `from` is fine:
    /// the tree was not flushed yet. With `exchange`, the two entries swap places (either may
    /// be missing in the backend).
    pub fn move_entry(&self, from: &str, to: &str, exchange: bool) -> io::Result<()> {
        if from == self.mount || to == self.mount {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        let (source, target) = (self.location(from)?, self.location(to)?);
        let present = |location: &Path| fs::symlink_metadata(location).is_ok();
        with_write_permission(parent_of(&source), || {
            with_write_permission(parent_of(&target), || {
                if !exchange {
                    Self::remove_location(&target)?;
                }
                match (present(&source), present(&target)) {
                    (false, false) => Ok(()),
                    (true, false) => {
                        Self::make_parents(&target)?;
                        fs::rename(&source, &target)
                    }
                    (false, true) => {
                        Self::make_parents(&source)?;
                        fs::rename(&target, &source)
                    }
                    (true, true) => exchange_locations(&source, &target),
                }
            })
        })
    }

    /// Moves the file at `from` to `to` (a file's backend file moving with its name in
    /// ringfs). A file already at `to` (the backend file of the file the rename replaces)
    /// is exchanged with it, not removed: it goes with the removal of the old name `from`
    /// once the rename is done, and comes back by the same exchange if the rename fails. A
    /// directory at `to` is left alone (EISDIR), and a missing parent of `to` is not made
    /// (ENOENT): the rename may yet fail for want of it in ringfs, and a directory made here
    /// would then appear in ringfs from the backend. The caller takes another way.
    pub fn move_file(&self, from: &str, to: &str) -> io::Result<()> {
        let (source, target) = (self.location(from)?, self.location(to)?);
        with_write_permission(parent_of(&source), || {
            with_write_permission(parent_of(&target), || match fs::symlink_metadata(&target) {
                Ok(metadata) if metadata.is_dir() => Err(io::Error::from_raw_os_error(libc::EISDIR)),
                Ok(_) => exchange_locations(&source, &target),
                Err(error) if not_found(&error) => fs::rename(&source, &target),
                Err(error) => Err(error),
            })
        })
    }

    /// Makes `to` another name of the backend file at `from` (a hard link; a symbolic link
    /// is linked itself, not followed), replacing what is at `to`: it was removed or replaced
    /// in ringfs. Parents of `to` are made as needed. The link is made under a temporary name
    /// and renamed into place, so `to` never shows nothing (the temporary name is the file's
    /// own, `owner`: see [`BackendDir::create_file`]).
    ///
    /// With `identity`, the link is made only to that file: `from` is opened, checked and
    /// linked through the descriptor, so a file put at `from` meanwhile (another file's
    /// link or move, made by another server's flush) is never linked instead; EAGAIN if the
    /// file at `from` is another.
    pub fn link_replacing(&self, from: &str, to: &str, owner: FileId, identity: Option<(u64, u64)>) -> io::Result<()> {
        let (source, target) = (self.location(from)?, self.location(to)?);
        // The file to link, held open (not following a final symbolic link) and checked.
        let held = OpenOptions::new().read(true).custom_flags(libc::O_PATH | libc::O_NOFOLLOW).open(&source)?;
        if identity.is_some() && Some(self::identity(&held.metadata()?)) != identity {
            return Err(io::Error::from_raw_os_error(libc::EAGAIN));
        }
        #[cfg(test)]
        crate::testing::run(&crate::testing::BEFORE_LINK);
        let linked = PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd()));
        with_write_permission(parent_of(&target), || {
            if fs::symlink_metadata(&target).is_ok_and(|metadata| metadata.is_dir()) {
                Self::remove_location(&target)?;
            }
            Self::make_parents(&target)?;
            let temporary = temporary_beside(&target, NEW_LINK_PREFIX, owner);
            retry_over_leftover(&temporary, || match link_following(&linked, &temporary) {
                // The file lost its last name meanwhile: nothing to link.
                Err(error) if identity.is_some() && not_found(&error) => Err(io::Error::from_raw_os_error(libc::EAGAIN)),
                other => other,
            })?;
            let renamed = fs::rename(&temporary, &target);
            // A rename onto another name of the same file does nothing: the temporary name
            // is then still there (and after a failed rename too).
            let _ = fs::remove_file(&temporary);
            renamed
        })
    }

    /// The extended attributes of the backend entry at `path` that ringfs mirrors (`user.`
    /// and `trusted.`); none where the backend keeps none.
    pub fn read_xattrs(&self, path: &str) -> io::Result<std::collections::BTreeMap<String, Vec<u8>>> {
        let entry = XattrEntry::Path(c_location(&self.location(path)?)?);
        let mut xattrs = std::collections::BTreeMap::new();
        for name in entry.names()? {
            if !is_mirrored(&name) {
                continue;
            }
            let c_name = CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
            // Removed meanwhile, or not ours to read: left out.
            if let Ok(value) = entry.get(&c_name) {
                xattrs.insert(name, value);
            }
        }
        Ok(xattrs)
    }

    /// Makes the mirrored extended attributes of the backend entry at `path` exactly
    /// `xattrs` (see [`write_mirrored_xattrs`]).
    pub fn write_xattrs(&self, path: &str, xattrs: Option<&std::collections::BTreeMap<String, Vec<u8>>>) -> io::Result<()> {
        write_mirrored_xattrs(&XattrEntry::Path(c_location(&self.location(path)?)?), path, xattrs)
    }

    /// Removes the backend entry at `path`: a file or link, or a directory with everything in
    /// it (ringfs removed the directory only once it was empty in the merged view, so what is
    /// left inside was removed in ringfs too).
    pub fn remove(&self, path: &str) -> io::Result<()> {
        if path == self.mount {
            return Ok(());
        }
        let location = self.location(path)?;
        with_write_permission(parent_of(&location), || Self::remove_location(&location))
    }
}

/// Which backend file `metadata` describes: its (device, inode).
pub(crate) fn identity(metadata: &fs::Metadata) -> (u64, u64) {
    (metadata.dev(), metadata.ino())
}

/// Whether the open backend file `file` is the one `identity` names (`None`: not known, so
/// taken to be; no `fstat` then).
pub(crate) fn is_file(file: &File, identity: Option<(u64, u64)>) -> io::Result<bool> {
    match identity {
        Some(identity) => Ok(self::identity(&file.metadata()?) == identity),
        None => Ok(true),
    }
}

/// Prefixes of the temporary names new backend files (`create_file`) and links
/// (`link_replacing`) are made under before they are renamed into place.
const NEW_FILE_PREFIX: &str = ".ringfs-new-";
const NEW_LINK_PREFIX: &str = ".ringfs-link-";

/// The temporary name beside `location` of the file `owner` (file ids are unique in a
/// cluster, and a file's backend names change only at its inode, one at a time).
fn temporary_beside(location: &Path, prefix: &str, owner: FileId) -> PathBuf {
    location.with_file_name(format!("{prefix}{:08x}-{:016x}", owner.anchor, owner.serial))
}

/// Makes `to` a hard link of what `from` names, following `from` once (`from` is a
/// descriptor's `/proc/self/fd` entry: the link is to the file the descriptor holds, even if
/// that is a symbolic link).
fn link_following(from: &Path, to: &Path) -> io::Result<()> {
    let (from, to) = (c_location(from)?, c_location(to)?);
    // SAFETY: two valid NUL-terminated paths.
    match unsafe { libc::linkat(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::AT_SYMLINK_FOLLOW) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Runs `make` (which makes `temporary`); if something is there already — left by an
/// earlier attempt that died before renaming it, or by an earlier job with the same file
/// id — removes it and runs `make` once more.
fn retry_over_leftover(temporary: &Path, mut make: impl FnMut() -> io::Result<()>) -> io::Result<()> {
    match make() {
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
            log::info!("{} was left by an attempt that did not finish: replaced", temporary.display());
            fs::remove_file(temporary)?;
            make()
        }
        other => other,
    }
}

/// Whether `name` is one of those temporary names: never shown, and not counted against an
/// empty directory (one left by a crash stays behind).
fn is_temporary(name: &str) -> bool {
    name.starts_with(NEW_FILE_PREFIX) || name.starts_with(NEW_LINK_PREFIX)
}

/// The namespaces of extended attributes ringfs keeps in step with the backend (`security.`
/// and `system.` belong to the backend's own security modules and ACLs).
const MIRRORED_XATTRS: [&str; 2] = ["user.", "trusted."];

fn c_location(location: &Path) -> io::Result<CString> {
    CString::new(location.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// Whether ringfs mirrors the extended attribute `name` between its files and the backend's.
fn is_mirrored(name: &str) -> bool {
    MIRRORED_XATTRS.iter().any(|prefix| name.starts_with(prefix))
}

/// Makes the mirrored extended attributes of the backend `entry` (ringfs path `path`, for
/// the log) exactly `xattrs`; those of other namespaces are left alone. A backend without
/// extended attributes, or one that refuses `trusted.` to a server that is not root, is left
/// as it is (logged).
pub fn write_mirrored_xattrs(
    entry: &XattrEntry<'_>,
    path: &str,
    xattrs: Option<&std::collections::BTreeMap<String, Vec<u8>>>,
) -> io::Result<()> {
    let empty = std::collections::BTreeMap::new();
    let xattrs = xattrs.unwrap_or(&empty);
    let refused = |error: &io::Error| matches!(error.raw_os_error(), Some(libc::ENOTSUP | libc::EPERM));
    let c_name = |name: &str| CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidData));
    for name in entry.names()?.into_iter().filter(|name| is_mirrored(name) && !xattrs.contains_key(name)) {
        if let Err(error) = entry.remove(&c_name(&name)?)
            && !refused(&error)
            && error.raw_os_error() != Some(libc::ENODATA)
        {
            return Err(error);
        }
    }
    for (name, value) in xattrs.iter().filter(|(name, _)| is_mirrored(name)) {
        if let Err(error) = entry.set(&c_name(name)?, value) {
            if !refused(&error) {
                return Err(error);
            }
            log::info!("the backend keeps no extended attribute {name} of {path}: {error}");
        }
    }
    Ok(())
}

/// A backend entry whose extended attributes are read or written: by path (not following a
/// final link), or through a descriptor already open on it (then a rename of another file
/// over its path cannot redirect the calls).
pub enum XattrEntry<'a> {
    Path(CString),
    Open(&'a File),
}

impl XattrEntry<'_> {
    /// Turns a `-1` return of an xattr call into the error it set.
    fn checked(result: isize) -> io::Result<usize> {
        match result {
            count if count >= 0 => Ok(count as usize),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// The names of the entry's extended attributes (none where the file system keeps none).
    fn names(&self) -> io::Result<Vec<String>> {
        let mut buffer = vec![0u8; 4096];
        loop {
            let (data, len) = (buffer.as_mut_ptr().cast(), buffer.len());
            // SAFETY: a valid path or descriptor; the buffer's length is passed.
            let result = Self::checked(unsafe {
                match self {
                    XattrEntry::Path(path) => libc::llistxattr(path.as_ptr(), data, len),
                    XattrEntry::Open(file) => libc::flistxattr(file.as_raw_fd(), data, len),
                }
            });
            match result {
                Ok(count) => {
                    buffer.truncate(count);
                    break;
                }
                Err(error) if error.raw_os_error() == Some(libc::ERANGE) && buffer.len() < (1 << 20) => buffer.resize(buffer.len() * 4, 0),
                Err(error) if error.raw_os_error() == Some(libc::ENOTSUP) => return Ok(Vec::new()),
                Err(error) => return Err(error),
            }
        }
        Ok(buffer.split(|byte| *byte == 0).filter(|name| !name.is_empty()).map(|name| String::from_utf8_lossy(name).into_owned()).collect())
    }

    /// The value of the attribute `name`.
    fn get(&self, name: &CString) -> io::Result<Vec<u8>> {
        let mut value = vec![0u8; ringfs_proto::XATTR_VALUE_MAX];
        let (data, len) = (value.as_mut_ptr().cast(), value.len());
        // SAFETY: a valid path or descriptor and name; the buffer's length is passed.
        let count = Self::checked(unsafe {
            match self {
                XattrEntry::Path(path) => libc::lgetxattr(path.as_ptr(), name.as_ptr(), data, len),
                XattrEntry::Open(file) => libc::fgetxattr(file.as_raw_fd(), name.as_ptr(), data, len),
            }
        })?;
        value.truncate(count);
        Ok(value)
    }

    /// Sets the attribute `name` to `value`.
    fn set(&self, name: &CString, value: &[u8]) -> io::Result<()> {
        let (data, len) = (value.as_ptr().cast(), value.len());
        // SAFETY: a valid path or descriptor and name; the value's length is passed.
        let result = unsafe {
            match self {
                XattrEntry::Path(path) => libc::lsetxattr(path.as_ptr(), name.as_ptr(), data, len, 0),
                XattrEntry::Open(file) => libc::fsetxattr(file.as_raw_fd(), name.as_ptr(), data, len, 0),
            }
        };
        Self::checked(result as isize).map(|_| ())
    }

    /// Removes the attribute `name`.
    fn remove(&self, name: &CString) -> io::Result<()> {
        // SAFETY: a valid path or descriptor and name.
        let result = unsafe {
            match self {
                XattrEntry::Path(path) => libc::lremovexattr(path.as_ptr(), name.as_ptr()),
                XattrEntry::Open(file) => libc::fremovexattr(file.as_raw_fd(), name.as_ptr()),
            }
        };
        Self::checked(result as isize).map(|_| ())
    }
}

/// Swaps two existing entries: atomically where the file system can (`renameat2` with
/// `RENAME_EXCHANGE`), otherwise by three renames through a temporary name beside `first`.
fn exchange_locations(first: &Path, second: &Path) -> io::Result<()> {
    let c_path = |location: &Path| CString::new(location.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
    let (first_c, second_c) = (c_path(first)?, c_path(second)?);
    // SAFETY: two valid NUL-terminated paths, resolved from the working directory (they are
    // absolute).
    let exchanged = unsafe { libc::renameat2(libc::AT_FDCWD, first_c.as_ptr(), libc::AT_FDCWD, second_c.as_ptr(), libc::RENAME_EXCHANGE) };
    if exchanged == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    if !matches!(error.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)) {
        return Err(error);
    }
    let mut aside = first.as_os_str().to_os_string();
    aside.push(format!(".ringfs-exchange-{}", std::process::id()));
    let aside = PathBuf::from(aside);
    fs::rename(first, &aside)?;
    fs::rename(second, first)?;
    fs::rename(&aside, second)
}

/// The directory holding `location`.
fn parent_of(location: &Path) -> &Path {
    location.parent().unwrap_or(location)
}

/// Runs `operation`, which needs write permission on `target` (a file it writes, or the
/// directory whose names it changes). Entries made read-only in ringfs are read-only in the
/// backend too, and a server that is not root may not write them: then the owner's write
/// permission is lent for the operation and taken back.
fn with_write_permission<T>(target: &Path, operation: impl Fn() -> io::Result<T>) -> io::Result<T> {
    let mut denied = None;
    for _ in 0..LEND_ATTEMPTS {
        match operation() {
            Err(error) if error.kind() == io::ErrorKind::PermissionDenied => denied = Some(error),
            other => return other,
        }
        let Ok(metadata) = fs::symlink_metadata(target) else { break };
        let mode = metadata.permissions().mode() & 0o7777;
        let lent = if metadata.is_dir() { 0o300 } else { 0o200 };
        if mode & lent == lent {
            // Another server lent it and is about to take it back (or the owner's permission
            // is not what is missing, and the attempts run out): try again.
            std::thread::sleep(std::time::Duration::from_millis(1));
            continue;
        }
        fs::set_permissions(target, fs::Permissions::from_mode(mode | lent))?;
        let outcome = operation();
        // Taken back only if the mode is still the lent one: a chmod flushed meanwhile wins.
        if fs::symlink_metadata(target).is_ok_and(|now| now.permissions().mode() & 0o7777 == mode | lent) {
            fs::set_permissions(target, fs::Permissions::from_mode(mode))?;
        }
        return outcome;
    }
    Err(denied.unwrap_or_else(|| io::Error::from(io::ErrorKind::PermissionDenied)))
}

/// Makes `file` at least `len` bytes long (the extension reads as zeros).
pub fn extend_to(file: &File, len: u64) -> io::Result<()> {
    if file.metadata()?.len() < len {
        file.set_len(len)?;
    }
    Ok(())
}

/// A backend timestamp in nanoseconds since the epoch, saturating for times beyond the years
/// 1678–2262 that fit.
fn nanoseconds(seconds: i64, nanoseconds: i64) -> i64 {
    seconds.saturating_mul(1_000_000_000).saturating_add(nanoseconds)
}

/// The attributes a cached entry gets from backend metadata. Its identity is derived from the
/// backend inode, so the same file gets the same id (and FUSE inode number) wherever it is
/// first seen.
fn attr_of(metadata: &fs::Metadata, chunk_size: u32) -> Option<Attr> {
    let file_type = metadata.file_type();
    let kind = FileKind::from_mode(metadata.mode())?;
    let _ = file_type;
    let size = metadata.len();
    let chunk = chunk_size.max(1) as u64;
    let mut flags = EntryFlags::BACKED | EntryFlags::IN_BACKEND;
    let (len, backend_len) = match kind {
        FileKind::Regular => {
            flags |= EntryFlags::BACKEND_DATA;
            (size.min(chunk), size)
        }
        FileKind::Symlink => {
            flags |= EntryFlags::BACKEND_DATA;
            (size, 0)
        }
        _ => (0, 0),
    };
    let identity = xxhash_rust::xxh3::xxh3_64(&[metadata.dev().to_le_bytes(), metadata.ino().to_le_bytes()].concat());
    Some(Attr {
        mode: kind.mode_bits() | (metadata.mode() & 0o7777),
        uid: metadata.uid(),
        gid: metadata.gid(),
        chunk_size,
        len,
        // The anchor is the placement hash of the path, which the store fills in.
        file_id: FileId { anchor: 0, serial: identity | 1 },
        // A backend directory's own count of its subdirectories (2 + them), where its file
        // system keeps one; names made or removed in ringfs change it from there.
        nlink: if kind == FileKind::Directory { (metadata.nlink().min(u64::from(u32::MAX - 1)) as u32).max(2) } else { 1 },
        rdev: if matches!(kind, FileKind::CharDevice | FileKind::BlockDevice) { metadata.rdev() } else { 0 },
        atime_ns: nanoseconds(metadata.atime(), metadata.atime_nsec()),
        mtime_ns: nanoseconds(metadata.mtime(), metadata.mtime_nsec()),
        ctime_ns: nanoseconds(metadata.ctime(), metadata.ctime_nsec()),
        flags,
        backend_len,
        // A backend file's chunks are those of its size (0 for all but regular files).
        last_chunk: ChunkIndex::last_of(backend_len, chunk),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ringfs-backend-{tag}-{}-{:x}", std::process::id(), rand_u64()));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn rand_u64() -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(7)
    }

    #[test]
    fn paths_map_under_the_mount_only() {
        let root = scratch("map");
        let backend = BackendDir::new(root.clone(), "/cache").unwrap();
        assert_eq!(backend.locate("/cache"), Some(root.clone()));
        assert_eq!(backend.locate("/cache/a/b"), Some(root.join("a/b")));
        assert_eq!(backend.locate("/cached"), None);
        assert_eq!(backend.locate("/other"), None);
        assert!(backend.covers("/cache/x") && !backend.covers("/"));
        let everything = BackendDir::new(root.clone(), "/").unwrap();
        assert_eq!(everything.locate("/a"), Some(root.join("a")));
        assert!(BackendDir::new(root.join("missing"), "/").is_err());
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn entries_listings_and_flush_operations() {
        let root = scratch("ops");
        let backend = BackendDir::new(root.clone(), "/").unwrap();
        fs::write(root.join("data"), vec![7u8; 3000]).unwrap();
        let attr = backend.entry_attr("/data", 1024).unwrap().unwrap();
        assert!(attr.is_regular() && attr.is_extended() && attr.has(EntryFlags::BACKEND_DATA | EntryFlags::IN_BACKEND));
        assert_eq!((attr.len, attr.backend_len), (1024, 3000));
        assert_eq!(backend.entry_attr("/data", 1024).unwrap().unwrap().file_id, attr.file_id, "identity is stable");
        assert_eq!(backend.entry_attr("/missing", 1024).unwrap(), None);
        // A link in the backend is an entry of its own, never a way out of the backend.
        let outside = scratch("outside");
        fs::write(outside.join("secret"), b"not in the backend").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("exit")).unwrap();
        assert_eq!(backend.entry_attr("/exit", 1024).unwrap().unwrap().kind(), Some(FileKind::Symlink));
        assert_eq!(backend.entry_attr("/exit/secret", 1024).unwrap(), None);
        fs::remove_file(root.join("exit")).unwrap();
        fs::remove_dir_all(outside).unwrap();
        // A timestamp beyond what nanoseconds in an i64 hold (the year 2603) saturates.
        let far_future = std::time::UNIX_EPOCH + std::time::Duration::from_secs(20_000_000_000);
        File::options().write(true).open(root.join("data")).unwrap().set_modified(far_future).unwrap();
        assert_eq!(backend.entry_attr("/data", 1024).unwrap().unwrap().mtime_ns, i64::MAX);
        let mut buffer = [0u8; 100];
        assert_eq!(backend.read_at("/data", 2950, &mut buffer).unwrap(), 50);

        let owner = FileId { anchor: 1, serial: 2 };
        backend.create_file("/new/deep/file", 0o600, owner).unwrap();
        // What a server that died between making a file and renaming it left: the file's
        // next creation replaces it, and nothing is left beside.
        fs::write(root.join("new/deep/.ringfs-new-00000001-0000000000000002"), b"left").unwrap();
        backend.create_file("/new/deep/again", 0o600, owner).unwrap();
        let mut names: Vec<String> =
            fs::read_dir(root.join("new/deep")).unwrap().map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(names, ["again", "file"]);
        assert_eq!(fs::read(root.join("new/deep/again")).unwrap(), b"");
        let file = backend.open_existing("/new/deep/file").unwrap();
        file.write_all_at(&[1u8; 20], 5).unwrap();
        extend_to(&file, 1 << 20).unwrap();
        assert_eq!(fs::metadata(root.join("new/deep/file")).unwrap().len(), 1 << 20);
        backend.trim("/new/deep/file", 10, None).unwrap();
        assert_eq!(fs::read(root.join("new/deep/file")).unwrap(), [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]);
        assert!(backend.open_existing("/not/there").is_err());

        backend.make_dir("/d/e", 0o750).unwrap();
        backend.make_symlink("/d/link", "../data").unwrap();
        assert_eq!(backend.read_link("/d/link").unwrap(), "../data");
        let names: Vec<String> = backend.list("/d", 1024).unwrap().into_iter().map(|(name, _)| name).collect();
        assert_eq!(names, ["e", "link"]);
        assert!(backend.list("/nothing", 1024).unwrap().is_empty());

        backend.sync_all().unwrap();

        backend.create_file("/d", 0o644, owner).unwrap();
        assert!(root.join("d").is_file(), "a file replaces a directory tree");
        backend.remove("/new").unwrap();
        backend.remove("/new").unwrap();
        assert!(!root.join("new").exists());
        fs::remove_dir_all(root).unwrap();
    }
}
