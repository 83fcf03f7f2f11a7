//! What each kernel request does, written once for both ways requests arrive: read from
//! `/dev/fuse` by fuser (`dev_fuse.rs`) or taken from the kernel's io_uring queues
//! (`ring/`). Each operation takes plain arguments and returns plain results
//! (`Result<_, Errno>`); the channel decodes the request and encodes the answer.

use std::ffi::OsStr;
use std::time::{Duration, SystemTime};

use fuser::{FileAttr, FileType, FopenFlags, INodeNo, TimeOrNow};
use ringfs_client::{Client, Credentials, DirEntry, Errno, Fd, LockKind, OpenFlags, Stat, WaitEnds};

use crate::directories::Listed;
use crate::inodes::{Handing, ROOT_INODE};
use crate::kernel::KernelDrop;
use crate::{RingfsFilesystem, file_attr, lock_range, name_str, nanoseconds, supplementary_groups};

/// Who sent a request (from the request's header).
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// An answer that hands the kernel an inode (or, with inode 0, a name known to be missing):
/// its attributes and how long the kernel may keep them and the name.
#[derive(Clone, Debug)]
pub struct Entry {
    pub attr: FileAttr,
    pub valid_for: Duration,
}

/// An answer to an open: the handle the kernel passes with later requests, and how the
/// kernel treats the open file.
#[derive(Clone, Copy, Debug)]
pub struct Opened {
    pub handle: u64,
    pub flags: FopenFlags,
}

/// An answer to `getxattr`/`listxattr`: the size asked for, or the bytes.
#[derive(Clone, Debug, PartialEq)]
pub enum Xattr {
    Size(u32),
    Data(Vec<u8>),
}

/// An answer to `statfs`, in blocks of `block_size` bytes.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    pub blocks: u64,
    pub free: u64,
    pub files: u64,
    pub files_free: u64,
    pub block_size: u32,
    pub name_max: u32,
}

/// An answer to `getlk`: the lock found in the way (type `F_UNLCK`: none).
#[derive(Clone, Copy, Debug)]
pub struct LockFound {
    pub start: u64,
    pub end: u64,
    pub typ: i32,
    pub pid: u32,
}

/// A `setlk` as the kernel sends it: lock (`typ` `F_RDLCK`, `F_WRLCK`) or unlock
/// (`F_UNLCK`) bytes `start..=end` of `inode`, for `owner`, through the open `handle`.
#[derive(Clone, Copy, Debug)]
pub struct LockRequest {
    pub inode: u64,
    pub handle: u64,
    pub owner: u64,
    pub start: u64,
    pub end: u64,
    pub typ: i32,
}

/// The changes a `setattr` asks for.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttributeChanges {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeOrNow>,
    pub mtime: Option<TimeOrNow>,
    pub handle: Option<u64>,
}

/// One name of a directory listing as the kernel gets it: what `list` and `list_plus` hand
/// their `add` (which returns `true` when the reply is full).
pub struct Listing<'a> {
    pub name: &'a str,
    pub ino: u64,
    pub cookie: u64,
    pub kind: FileType,
}

pub(crate) fn fd_of(handle: u64) -> Fd {
    Fd(handle as u32)
}

/// Whether a change that failed with `errno` may have been made all the same: its answer
/// was lost (EIO, ETIMEDOUT: a server stopped or was cut off while it worked), or the mount
/// stopped waiting for it because its caller is being killed (EINTR, see
/// [`crate::interrupts`]; the request may still reach its server).
fn outcome_unknown(errno: Errno) -> bool {
    matches!(errno, Errno::EIO | Errno::ETIMEDOUT | Errno::EINTR)
}

impl RingfsFilesystem {
    pub(crate) fn child_path(&self, parent: u64, name: &OsStr) -> Result<String, Errno> {
        Ok(ringfs_proto::path::join(&self.inodes.path(parent)?, name_str(name)?))
    }

    /// Attributes of `path` for a reply that hands the kernel a reference to its inode. A
    /// looked-up file stays alive while the kernel holds it (until `forget`: the mount keeps
    /// it open, see [`crate::inodes`]), so that its later open by inode finds it even if its
    /// name was removed or replaced meanwhile.
    fn entry(&self, path: &str) -> Result<FileAttr, Errno> {
        let (stat, held) = self.client.lookup_held(path)?;
        if let Some(surplus) = self.inodes.remember(stat.file, path, held) {
            let _ = self.client.close(surplus);
        }
        Ok(self.read(&stat))
    }

    /// The kernel's attributes of a file the kernel holds, just read from ringfs for an
    /// answer that hands over its inode (noted in the inode table, see [`crate::inodes`]);
    /// if they differ from what the kernel was handed last, it drops those first.
    fn read(&self, stat: &Stat) -> FileAttr {
        let mut stale = Vec::new();
        let attr = self.read_noting_stale(stat, Handing::WithInode, &mut stale);
        self.drop_stale_attributes(stale);
        attr
    }

    /// [`Self::read`] for an answer that hands the attributes over as `handing` says, the
    /// drop of stale attributes left to the caller: the inode and the
    /// generation of its stale mark are added to `stale` (see [`crate::inodes`], "Answers
    /// the kernel applies late").
    fn read_noting_stale(&self, stat: &Stat, handing: Handing, stale: &mut Vec<(u64, u64)>) -> FileAttr {
        let attr = file_attr(stat);
        if let Some(generation) = self.inodes.read_attr(&attr, stat.has_xattrs, handing) {
            stale.push((attr.ino.0, generation));
        }
        attr
    }

    /// Has the kernel drop the attributes of the inodes in `stale` (each with the generation
    /// of its stale mark), before the answer that found them stale is given.
    fn drop_stale_attributes(&self, stale: Vec<(u64, u64)>) {
        let Some(drops) = self.drops.get() else { return };
        for (inode, generation) in stale {
            drops.stale_attributes(inode, generation);
        }
    }

    /// The client acting for `caller`: what it creates belongs to the caller (the kernel
    /// has checked the caller may create there: `default_permissions`).
    fn client_for(&self, caller: Caller) -> Client {
        let own = self.client.credentials();
        if own.uid == caller.uid && own.gid == caller.gid {
            return self.client.clone();
        }
        let groups = supplementary_groups(caller.pid);
        self.client.as_user(Credentials { uid: caller.uid, gid: caller.gid, groups })
    }

    /// Attributes of `path` just created in `parent` here, for a reply that hands the kernel
    /// its inode (not kept open: a later open of an inode whose file went fails with ESTALE,
    /// on which the kernel looks the name up again).
    fn created_entry(&self, parent: u64, path: &str) -> Result<FileAttr, Errno> {
        let stat = self.client.lstat(path)?;
        self.inodes.remember(stat.file, path, None);
        let attr = self.read(&stat);
        // The new name's time is the change's (a link's too: it sets the file's ctime).
        self.inodes.names_changed(parent, attr.ctime, i32::from(attr.kind == FileType::Directory));
        self.inodes.name_added(parent, ringfs_proto::path::file_name(path));
        if attr.kind == FileType::Directory {
            self.inodes.made_directory(attr.ino.0);
        }
        Ok(attr)
    }

    /// The client's open flags for the kernel's. With the writeback cache the kernel also
    /// reads through descriptors opened write-only (to fill a page a write covers in part)
    /// and places appends itself: such opens become read-write, without append.
    fn kernel_open_flags(&self, flags: i32) -> OpenFlags {
        if !self.options.writeback_cache {
            return OpenFlags::from_posix(flags);
        }
        let flags = (flags & !libc::O_APPEND & !libc::O_ACCMODE)
            | if flags & libc::O_ACCMODE == libc::O_RDONLY { libc::O_RDONLY } else { libc::O_RDWR };
        OpenFlags::from_posix(flags)
    }

    /// A change of the name `name` in `parent` failed with `errno` (passed on): if it may
    /// have been made all the same, the mount forgets what it assumed of the directory (its
    /// names, times and link count) and has the kernel drop the name, whose next lookup asks
    /// a server.
    fn name_change_failed(&self, parent: u64, name: &OsStr, errno: Errno) -> Errno {
        if errno == Errno::EEXIST {
            // (Made elsewhere, and not told yet: the mount's account of the names lacks it.)
            self.inodes.lose_names(parent);
        }
        if outcome_unknown(errno) {
            self.inodes.lose_names(parent);
            self.inodes.forget_attr(parent);
            self.kernel_drop_later(KernelDrop::Name(parent, name.to_os_string()));
        }
        errno
    }

    /// A change of the file `inode` failed with `errno` (passed on): if it may have been
    /// made all the same, the kernel drops the file's attributes (its size) and pages.
    fn file_change_failed(&self, inode: u64, errno: Errno) -> Errno {
        if outcome_unknown(errno) {
            self.inodes.forget_attr(inode);
            self.kernel_drop_later(KernelDrop::File(inode));
        }
        errno
    }

    /// Has the kernel drop `what` from the drops thread ([`crate::kernel::KernelDrops`]),
    /// once the request being answered is: until its answer the kernel holds the
    /// directory's lock (a name's drop waits for it) and the pages being written (a file's
    /// drop waits for those).
    fn kernel_drop_later(&self, what: KernelDrop) {
        if let Some(drops) = self.drops.get() {
            drops.later(what);
        }
    }

    /// The answer to an open with the caller's `flags`. An `O_APPEND` open (without the
    /// writeback cache) bypasses the kernel's page cache: the kernel sends an append at the
    /// end it last knew of, the client appends at the file's real end (placed with other
    /// nodes' appends: `Client::append_to`), and the bytes the kernel would have cached at
    /// its own offset would be wrong there.
    fn opened(&self, fd: Fd, flags: i32) -> Opened {
        let appends = flags & libc::O_APPEND != 0 && !self.options.writeback_cache;
        let flags = if self.options.direct_io || appends { FopenFlags::FOPEN_DIRECT_IO } else { FopenFlags::empty() };
        Opened { handle: u64::from(fd.0), flags }
    }

    /// How long the kernel may keep an answer read from the servers since the watch's count
    /// of drops was `dropped_before` (see [`crate::watch`]).
    fn cache_time(&self, dropped_before: u64) -> Duration {
        self.watch.cache_time(dropped_before, self.options.attr_timeout)
    }

    /// An entry answer from a result read since the watch's count of drops was `dropped`.
    fn entry_answer(&self, dropped: u64, result: Result<FileAttr, Errno>) -> Result<Entry, Errno> {
        result.map(|attr| Entry { attr, valid_for: self.cache_time(dropped) })
    }

    pub fn lookup_entry(&self, parent: u64, name: &OsStr) -> Result<Entry, Errno> {
        let dropped = self.watch.dropped();
        let result = self.child_path(parent, name).and_then(|path| {
            let short = name.len() <= ringfs_proto::path::MAX_NAME_BYTES && path.len() <= ringfs_proto::path::MAX_PATH_BYTES;
            if short && self.inodes.surely_missing(parent, &name.to_string_lossy()) {
                // (A directory made here, whose names all came through here: see `inodes`.)
                return Err(Errno::ENOENT);
            }
            self.entry(&path)
        });
        if result == Err(Errno::ENOENT) && self.inodes.note_missing(parent, &name.to_string_lossy(), self.options.attr_timeout) {
            // A missing name is remembered as long as names are (inode 0: none); a name made
            // through this mount replaces it at once, one made elsewhere shows as late as
            // other changes.
            let missing = FileAttr { ino: INodeNo(0), ..file_attr(&Stat::default()) };
            return Ok(Entry { attr: missing, valid_for: self.cache_time(dropped) });
        }
        self.entry_answer(dropped, result)
    }

    pub fn forget_inode(&self, inode: u64, lookups: u64) {
        if let Some(held) = self.inodes.forget(inode, lookups) {
            let _ = self.client.close(held);
        }
    }

    pub fn attributes(&self, inode: u64, handle: Option<u64>) -> Result<Entry, Errno> {
        let dropped = self.watch.dropped();
        // (A directory's, read lately and changed since by this mount: see `inodes`.)
        if let Some((attr, valid_for)) = self.inodes.directory_attr(inode, self.options.attr_timeout) {
            return Ok(Entry { attr, valid_for });
        }
        let stat = match handle {
            Some(handle) if inode != ROOT_INODE => self.client.fstat(fd_of(handle)),
            _ => self.inodes.file(inode).and_then(|file| self.client.stat_id(file)),
        };
        // (Never stale: see `Handing::ToGetattr`.)
        let attr = stat.map(|stat| self.read_noting_stale(&stat, Handing::ToGetattr, &mut Vec::new()))?;
        Ok(Entry { attr, valid_for: self.cache_time(dropped) })
    }

    pub fn set_attributes(&self, inode: u64, changes: AttributeChanges) -> Result<Entry, Errno> {
        self.change_attributes(inode, changes).map_err(|errno| self.file_change_failed(inode, errno))
    }

    fn change_attributes(&self, inode: u64, changes: AttributeChanges) -> Result<Entry, Errno> {
        let file = self.inodes.file(inode)?;
        if let Some(size) = changes.size {
            match changes.handle {
                Some(handle) => self.client.ftruncate(fd_of(handle), size)?,
                None => self.client.truncate_id(file, size)?,
            }
        }
        let AttributeChanges { mode, uid, gid, atime, mtime, .. } = changes;
        if mode.is_some() || uid.is_some() || gid.is_some() || atime.is_some() || mtime.is_some() {
            self.client.set_attr_id(file, |change| {
                change.mode = mode.map(|mode| mode & 0o7777);
                change.uid = uid;
                change.gid = gid;
                // "Now" is the change's own time, so that mtime and ctime are equal after it.
                let now = change.time_ns;
                change.atime_ns = atime.map(|time| nanoseconds(time, now));
                change.mtime_ns = mtime.map(|time| nanoseconds(time, now));
                change.times_explicit =
                    matches!(atime, Some(TimeOrNow::SpecificTime(_))) || matches!(mtime, Some(TimeOrNow::SpecificTime(_)));
            })?;
        }
        self.inodes.changed_here(inode);
        let attr = self.read(&self.client.stat_id(file)?);
        Ok(Entry { attr, valid_for: self.options.attr_timeout })
    }

    pub fn link_target(&self, inode: u64) -> Result<String, Errno> {
        self.inodes.file(inode).and_then(|file| self.client.readlink_file(file))
    }

    pub fn make_directory(&self, caller: Caller, parent: u64, name: &OsStr, mode: u32, umask: u32) -> Result<Entry, Errno> {
        let dropped = self.watch.dropped();
        let result = self.child_path(parent, name).and_then(|path| {
            self.client_for(caller).mkdir(&path, mode & !umask)?;
            self.created_entry(parent, &path)
        });
        self.entry_answer(dropped, result.map_err(|errno| self.name_change_failed(parent, name, errno)))
    }

    pub fn remove_name(&self, parent: u64, name: &OsStr) -> Result<(), Errno> {
        let time = SystemTime::now();
        // (The mount closes the file it keeps when the kernel forgets it, after this.)
        self.child_path(parent, name)
            .and_then(|path| self.client.unlink_leaving_closes_batched(&path))
            .map_err(|errno| self.name_change_failed(parent, name, errno))?;
        self.inodes.names_changed(parent, time, 0);
        self.inodes.name_removed(parent, &name.to_string_lossy());
        Ok(())
    }

    pub fn remove_directory(&self, parent: u64, name: &OsStr) -> Result<(), Errno> {
        let time = SystemTime::now();
        self.child_path(parent, name)
            .and_then(|path| self.client.rmdir(&path))
            .map_err(|errno| self.name_change_failed(parent, name, errno))?;
        self.inodes.names_changed(parent, time, -1);
        self.inodes.name_removed(parent, &name.to_string_lossy());
        Ok(())
    }

    pub fn make_symlink(&self, caller: Caller, parent: u64, name: &OsStr, target: &OsStr) -> Result<Entry, Errno> {
        let dropped = self.watch.dropped();
        let result = self.child_path(parent, name).and_then(|path| {
            self.client_for(caller).symlink(target.to_str().ok_or(Errno::EINVAL)?, &path)?;
            self.created_entry(parent, &path)
        });
        self.entry_answer(dropped, result.map_err(|errno| self.name_change_failed(parent, name, errno)))
    }

    pub fn make_node(&self, caller: Caller, parent: u64, name: &OsStr, mode: u32, umask: u32, rdev: u32) -> Result<Entry, Errno> {
        let dropped = self.watch.dropped();
        let result = self.child_path(parent, name).and_then(|path| {
            let mode = (mode & 0o170000) | (mode & 0o7777 & !umask);
            self.client_for(caller).mknod(&path, mode, u64::from(rdev))?;
            self.created_entry(parent, &path)
        });
        self.entry_answer(dropped, result.map_err(|errno| self.name_change_failed(parent, name, errno)))
    }

    pub fn make_link(&self, inode: u64, new_parent: u64, new_name: &OsStr) -> Result<Entry, Errno> {
        let dropped = self.watch.dropped();
        let result = (|| {
            // By id: the file the kernel holds, whatever its names are now (the name this
            // mount saw last may be gone while others remain).
            let file = self.inodes.file(inode)?;
            let to = self.child_path(new_parent, new_name)?;
            self.client.link_file(file, &to)?;
            self.created_entry(new_parent, &to)
        })();
        // (The file's link count may have changed too.)
        let result = result.map_err(|errno| self.file_change_failed(inode, self.name_change_failed(new_parent, new_name, errno)));
        self.entry_answer(dropped, result)
    }

    /// `flags`: the kernel's `RENAME_*` flags.
    pub fn rename_entry(&self, parent: u64, name: &OsStr, new_parent: u64, new_name: &OsStr, flags: u32) -> Result<(), Errno> {
        let from = self.child_path(parent, name)?;
        let to = self.child_path(new_parent, new_name)?;
        if flags & libc::RENAME_WHITEOUT != 0 {
            return Err(Errno::EINVAL);
        }
        let mut ringfs_flags = 0;
        if flags & libc::RENAME_NOREPLACE != 0 {
            ringfs_flags |= ringfs_client::RenameFlags::NOREPLACE;
        }
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        if exchange {
            ringfs_flags |= ringfs_client::RenameFlags::EXCHANGE;
        }
        if let Err(errno) = self.client.rename_leaving_closes_batched(&from, &to, ringfs_flags) {
            return Err(self.name_change_failed(new_parent, new_name, self.name_change_failed(parent, name, errno)));
        }
        if !exchange {
            self.inodes.name_removed(parent, &name.to_string_lossy());
            self.inodes.name_added(new_parent, &new_name.to_string_lossy());
        }
        self.inodes.renamed(&from, &to, exchange);
        // (The parents' link counts depend on what moved: they are read again.)
        self.inodes.forget_attr(parent);
        self.inodes.forget_attr(new_parent);
        Ok(())
    }

    /// A rename whose caller was answered EINTR while it went on (the caller was being
    /// killed: see [`crate::interrupts`]): the mount applied its outcome; the kernel, told it
    /// failed, drops both names.
    pub fn unanswered_rename(&self, parent: u64, name: &OsStr, new_parent: u64, new_name: &OsStr, result: Result<(), Errno>) {
        if result.is_ok() {
            self.kernel_drop_later(KernelDrop::Name(parent, name.to_os_string()));
            self.kernel_drop_later(KernelDrop::Name(new_parent, new_name.to_os_string()));
        }
    }

    /// An open whose caller was answered EINTR while it went on: the kernel never got the
    /// handle, so the mount ends the open itself, as at the kernel's release (an `O_TRUNC`
    /// may have cut the file: the kernel drops what it cached of it).
    pub fn unanswered_open(&self, inode: u64, result: Result<Opened, Errno>) {
        if let Ok(opened) = result {
            if let Err(errno) = self.release_handle(inode, opened.handle) {
                log::debug!("closing an open its caller never got: {errno}");
            }
            self.kernel_drop_later(KernelDrop::File(inode));
        }
    }

    /// A create whose caller was answered EINTR while it went on: the kernel got neither the
    /// inode nor the handle. The mount ends the open, gives back the lookup it counted for
    /// the kernel, and has the kernel drop the name (which it may hold as missing).
    pub fn unanswered_create(&self, parent: u64, name: &OsStr, result: Result<(Entry, Opened), Errno>) {
        if let Ok((entry, opened)) = result {
            let inode = entry.attr.ino.0;
            if let Err(errno) = self.release_handle(inode, opened.handle) {
                log::debug!("closing a create's open its caller never got: {errno}");
            }
            self.forget_inode(inode, 1);
            self.kernel_drop_later(KernelDrop::Name(parent, name.to_os_string()));
        }
    }

    /// `flags`: the caller's `open` flags.
    pub fn open_file(&self, inode: u64, flags: i32) -> Result<Opened, Errno> {
        // By id: the file the kernel holds, whatever its names are now; beside the
        // descriptor the mount keeps on it if there is one (no round trip: see `inodes`).
        let open_flags = self.kernel_open_flags(flags);
        if let Some(generation) = self.inodes.attributes_stale(inode) {
            // (A drop that could not reach the kernel before it held the inode: it holds it now.)
            self.drop_stale_attributes(vec![(inode, generation)]);
        }
        if flags & libc::O_TRUNC != 0 {
            self.inodes.changed_here(inode);
        }
        let fd = match self.inodes.held(inode) {
            Some(held) => self.client.open_beside(held, open_flags),
            None => self.inodes.file(inode).and_then(|file| self.client.open_file(file, open_flags)),
        }?;
        Ok(self.opened(fd, flags))
    }

    pub fn create_file(
        &self,
        caller: Caller,
        parent: u64,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Entry, Opened), Errno> {
        let dropped = self.watch.dropped();
        let path = self.child_path(parent, name)?;
        let (fd, stat) = self
            .client_for(caller)
            .open_with_stat(&path, self.kernel_open_flags(flags) | OpenFlags::CREATE, mode & !umask)
            .map_err(|errno| self.name_change_failed(parent, name, errno))?;
        self.inodes.remember(stat.file, &path, None);
        let attr = self.read(&stat);
        self.inodes.names_changed(parent, attr.ctime, 0);
        self.inodes.name_added(parent, &name.to_string_lossy());
        Ok((Entry { attr, valid_for: self.cache_time(dropped) }, self.opened(fd, flags)))
    }

    /// Reads into `buffer` from `offset`: the count read.
    pub fn read_into(&self, handle: u64, offset: u64, buffer: &mut [u8]) -> Result<usize, Errno> {
        self.client.pread(fd_of(handle), buffer, offset)
    }

    pub fn write_at(&self, inode: u64, handle: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let written = self.client.pwrite(fd_of(handle), data, offset).map_err(|errno| self.file_change_failed(inode, errno))?;
        self.inodes.changed_here(inode);
        Ok(written as u32)
    }

    pub fn flush_handle(&self, inode: u64, handle: u64, lock_owner: u64) -> Result<(), Errno> {
        // POSIX: a process's close of any descriptor of a file ends its record locks on it.
        self.release_locks(inode, handle, |owner, _| owner == lock_owner)
    }

    pub fn release_handle(&self, inode: u64, handle: u64) -> Result<(), Errno> {
        // The last close of an open file description ends its `flock` and OFD locks.
        let released = self.release_locks(inode, handle, |_, through| through == handle);
        // The first registered open of an inode the mount keeps no descriptor on becomes
        // the one it keeps (later opens need no round trip).
        let fd = fd_of(handle);
        let kept = self.client.registers_open(fd) && self.inodes.keep(inode, fd);
        let closed = if kept { Ok(()) } else { self.client.close(fd) };
        released.and(closed)
    }

    /// `end` inclusive (`OFFSET_MAX`: to the end); `typ` an `F_*LCK`.
    pub fn find_lock(&self, handle: u64, lock_owner: u64, start: u64, end: u64, typ: i32) -> Result<LockFound, Errno> {
        let kind = ringfs_client::lock_kind_of(typ)?;
        Ok(match self.client.test_lock(fd_of(handle), lock_owner, kind, lock_range(start, end))? {
            Some(conflict) => LockFound {
                start: conflict.range.start,
                end: if conflict.range.end == u64::MAX { i64::MAX as u64 } else { conflict.range.end },
                typ: if conflict.kind == LockKind::Write { libc::F_WRLCK } else { libc::F_RDLCK },
                pid: conflict.pid,
            },
            None => LockFound { start, end, typ: libc::F_UNLCK, pid: 0 },
        })
    }

    /// Takes or gives back a lock (`SETLK`), or with `waiter` (`SETLKW`: the thread the
    /// kernel sent the request for) waits for a lock in the way to go — until the waiter
    /// has a signal to handle or is gone (EINTR: see [`crate::interrupts`]). A lock taken,
    /// the kernel drops what it cached of the file ([`RingfsFilesystem::forget_cached`]).
    pub fn set_lock(&self, lock: LockRequest, waiter: Option<u32>) -> Result<(), Errno> {
        if self.set_lock_keeping_cache(lock, waiter)? {
            self.forget_cached(lock.inode);
        }
        Ok(())
    }

    /// [`RingfsFilesystem::set_lock`] without the drop of the kernel's cache: whether a lock
    /// was taken (rather than given back), in which case the caller has the cache dropped
    /// before it answers.
    pub fn set_lock_keeping_cache(&self, lock: LockRequest, waiter: Option<u32>) -> Result<bool, Errno> {
        let LockRequest { inode, handle, owner, start, end, typ } = lock;
        let kind = ringfs_client::lock_kind_of(typ)?;
        if kind != LockKind::Unlock {
            let mut owners = self.lock_owners.lock();
            let owners = owners.entry(inode).or_default();
            if !owners.contains(&(owner, handle)) {
                owners.push((owner, handle));
            }
        }
        let (fd, range) = (fd_of(handle), lock_range(start, end));
        match waiter {
            None => self.client.set_lock(fd, owner, kind, range, false)?,
            Some(thread) => {
                let interrupted = || crate::interrupts::signal_pending(thread);
                self.client.set_lock_waiting(fd, owner, kind, range, WaitEnds::When(&interrupted))?
            }
        }
        Ok(kind != LockKind::Unlock)
    }

    pub fn sync_file(&self, inode: u64, handle: u64) -> Result<(), Errno> {
        // The name the mount last saw the file at: its server syncs the name's journal.
        match self.inodes.path(inode) {
            Ok(path) => self.client.fsync_at(fd_of(handle), &path),
            Err(_) => self.client.fsync(fd_of(handle)),
        }
    }

    pub fn allocate(&self, inode: u64, handle: u64, offset: u64, length: u64, mode: i32) -> Result<(), Errno> {
        self.client.fallocate(fd_of(handle), mode as u32, offset, length).map_err(|errno| self.file_change_failed(inode, errno))?;
        self.inodes.changed_here(inode);
        Ok(())
    }

    /// Opens directory `inode` for listing: its handle.
    pub fn open_directory(&self, inode: u64) -> Result<Opened, Errno> {
        let path = self.inodes.path(inode)?;
        let directory = self.client.open_directory(&path)?;
        if directory.stat.file != self.inodes.file(inode)? {
            // The directory was renamed (or replaced) by another client since the kernel
            // looked it up: the kernel looks its name up again.
            return Err(Errno::ESTALE);
        }
        let parent = match ringfs_proto::path::parent(&directory.path) {
            Some(parent) if parent != directory.path => self.client.lstat(parent)?.ino,
            _ => directory.stat.ino,
        };
        let own = directory.stat.ino;
        Ok(Opened { handle: self.directories.insert(directory, [own, parent]), flags: FopenFlags::empty() })
    }

    /// Answers a `READDIR(PLUS)` of `handle` continuing after cookie `offset`: a page read
    /// from the servers now (see [`crate::directories`]), given to the kernel through `add` (a
    /// name, its cookie and what it is; `true` when the reply is full).
    fn list_page(&self, handle: u64, offset: u64, add: impl FnMut(&str, u64, Listed<'_, DirEntry>) -> bool) -> Result<(), Errno> {
        let (directory, resume) = self.directories.resume(handle, offset).ok_or(Errno::EBADF)?;
        let Some(resume) = resume else { return Ok(()) };
        let page = self.client.list_page(&directory, resume.after.as_deref(), resume.wanted)?;
        // A name listed that the mount's account of the directory lacks was made elsewhere,
        // and the watch has not told yet: the account must not answer lookups any more.
        self.inodes.listed(directory.stat.ino, page.entries.iter().map(|entry| entry.name.as_str()));
        let given = self.directories.give(handle, &resume, &page.entries, |entry| entry.name.as_str(), page.more, add);
        if given { Ok(()) } else { Err(Errno::EBADF) }
    }

    /// `READDIR`: the names after cookie `offset`, each handed to `add` until it says the
    /// reply is full.
    pub fn list(&self, handle: u64, offset: u64, mut add: impl FnMut(Listing<'_>) -> bool) -> Result<(), Errno> {
        self.list_page(handle, offset, |name, cookie, listed| match listed {
            Listed::Dot(ino) => add(Listing { name, ino, cookie, kind: FileType::Directory }),
            Listed::Entry(entry) => add(Listing { name, ino: entry.stat.ino, cookie, kind: crate::file_type(&entry.stat) }),
        })
    }

    /// `READDIRPLUS`: as [`Self::list`], each name with its attributes; the kernel holds a
    /// reference to the inode of every name that fitted.
    pub fn list_plus(&self, inode: u64, handle: u64, offset: u64, mut add: impl FnMut(Listing<'_>, Entry) -> bool) -> Result<(), Errno> {
        let directory_path = self.inodes.path(inode).map_err(|_| Errno::ESTALE)?;
        let dropped = self.watch.dropped();
        let mut stale = Vec::new();
        let listed = self.list_page(handle, offset, |name, cookie, listed| match listed {
            Listed::Dot(ino) => {
                // (The kernel takes no attributes from the dot entries.)
                let attr = FileAttr { ino: INodeNo(ino), kind: FileType::Directory, ..file_attr(&Stat::default()) };
                add(Listing { name, ino, cookie, kind: FileType::Directory }, Entry { attr, valid_for: Duration::ZERO })
            }
            Listed::Entry(entry) => {
                let attr = file_attr(&entry.stat);
                let listing = Listing { name, ino: entry.stat.ino, cookie, kind: attr.kind };
                let full = add(listing, Entry { attr, valid_for: self.cache_time(dropped) });
                if !full {
                    // The kernel now holds a reference to the entry's inode.
                    self.inodes.remember(entry.stat.file, &ringfs_proto::path::join(&directory_path, name), None);
                    self.read_noting_stale(&entry.stat, Handing::WithInode, &mut stale);
                }
                full
            }
        });
        // (Outside the listing's lock, before the reply.)
        self.drop_stale_attributes(stale);
        listed
    }

    pub fn release_directory(&self, handle: u64) {
        self.directories.remove(handle);
    }

    pub fn sync_directory(&self, inode: u64) -> Result<(), Errno> {
        // A directory's names are spread over every server: each makes its journal durable.
        self.inodes.file(inode).and_then(|file| self.client.fsync_everywhere(file))
    }

    pub fn usage(&self) -> Result<Usage, Errno> {
        const BLOCK: u64 = 4096;
        let usage = self.client.usage()?;
        let free = usage.capacity_bytes.saturating_sub(usage.used_bytes) / BLOCK;
        let files = usage.entries + (1 << 30);
        Ok(Usage {
            blocks: usage.capacity_bytes / BLOCK,
            free,
            files,
            files_free: files - usage.entries,
            block_size: BLOCK as u32,
            name_max: 255,
        })
    }

    // Extended attributes: the kernel has checked namespaces and permissions (the VFS's
    // `xattr_permission`, with `default_permissions`); ACLs are not enabled, so the kernel
    // answers `system.posix_acl_*` itself (EOPNOTSUPP).

    pub fn set_xattr(&self, inode: u64, name: &OsStr, value: &[u8], flags: i32) -> Result<(), Errno> {
        let name = name.to_str().ok_or(Errno::EINVAL)?;
        self.inodes.forget_attr(inode);
        self.client.set_xattr_id(self.inodes.file(inode)?, name, value, flags as u32)
    }

    /// `size` 0 asks how large the value is; a value larger than `size` is ERANGE.
    fn xattr_answer(size: u32, value: Vec<u8>) -> Result<Xattr, Errno> {
        if size == 0 {
            Ok(Xattr::Size(value.len() as u32))
        } else if value.len() > size as usize {
            Err(Errno::ERANGE)
        } else {
            Ok(Xattr::Data(value))
        }
    }

    pub fn xattr(&self, inode: u64, name: &OsStr, size: u32) -> Result<Xattr, Errno> {
        if self.inodes.has_no_xattrs(inode, self.options.attr_timeout) {
            // (The kernel asks for `security.capability` before every write.)
            return Err(Errno::ENODATA);
        }
        let name = name.to_str().ok_or(Errno::ENODATA)?;
        Self::xattr_answer(size, self.client.get_xattr_id(self.inodes.file(inode)?, name)?)
    }

    pub fn xattr_names(&self, caller: Caller, inode: u64, size: u32) -> Result<Xattr, Errno> {
        if self.inodes.has_no_xattrs(inode, self.options.attr_timeout) {
            return Self::xattr_answer(size, Vec::new());
        }
        let names = self.inodes.file(inode).and_then(|file| self.client.list_xattrs_id(file))?;
        let mut list = Vec::new();
        // `trusted.` names are listed to root only (as file systems do; the kernel leaves the
        // filtering to them).
        for name in names.into_iter().filter(|name| caller.uid == 0 || !name.starts_with("trusted.")) {
            list.extend_from_slice(name.as_bytes());
            list.push(0);
        }
        Self::xattr_answer(size, list)
    }

    pub fn remove_xattr(&self, inode: u64, name: &OsStr) -> Result<(), Errno> {
        let name = name.to_str().ok_or(Errno::ENODATA)?;
        self.inodes.forget_attr(inode);
        self.client.remove_xattr_id(self.inodes.file(inode)?, name)
    }

    /// An `ioctl` on a file of the mount: ringfs files are no devices, so none applies
    /// (ENOTTY, as a local file system answers — Python asks every file it opens whether
    /// it is a terminal, `TCGETS`).
    pub fn control(&self) -> Result<(), Errno> {
        Err(Errno::ENOTTY)
    }

    pub fn check_access(&self, inode: u64, mask: u32) -> Result<(), Errno> {
        self.inodes.path(inode).and_then(|path| self.client.access(&path, mask))
    }

    /// Has the kernel drop what it cached of `inode` (pages, attributes) and of the names
    /// beside it, before a lock on it is granted: what the lock protects may have been
    /// changed through another mount (node) meanwhile (as NFS revalidates on locking). The
    /// drop waits for pages that reads hold locked until their `READ` is answered, so it
    /// must not run where it keeps those answers from being given (dev_fuse.rs hands it
    /// to a thread of its own).
    pub fn forget_cached(&self, inode: u64) {
        let Some(drops) = self.drops.get() else { return };
        let kernel = drops.cache();
        if let Err(error) = kernel.drop_inode(inode, true) {
            log::debug!("the kernel did not drop its cache of inode {inode}: {error}");
        }
        let Some((directory, names)) = self.inodes.names_beside(inode) else { return };
        for name in names {
            // (`false`: the kernel had dropped that name already.)
            let _ = kernel.drop_name(directory, OsStr::new(&name));
        }
    }

    /// Gives back the advisory locks on `inode` of the owners that `chosen` picks (given
    /// the owner and the handle it took locks through), asking through `handle`.
    fn release_locks(&self, inode: u64, handle: u64, chosen: impl Fn(u64, u64) -> bool) -> Result<(), Errno> {
        let mut released: Vec<u64> = Vec::new();
        {
            let mut owners = self.lock_owners.lock();
            let Some(list) = owners.get_mut(&inode) else { return Ok(()) };
            list.retain(|(owner, through)| {
                if !chosen(*owner, *through) {
                    return true;
                }
                if !released.contains(owner) {
                    released.push(*owner);
                }
                false
            });
            // An owner released is released through every handle.
            list.retain(|(owner, _)| !released.contains(owner));
            if list.is_empty() {
                owners.remove(&inode);
            }
        }
        released.into_iter().try_for_each(|owner| self.client.release_locks(fd_of(handle), owner))
    }
}
