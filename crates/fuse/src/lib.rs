//! ringfs as a FUSE mount (`ringfs mount DIR`): every ringfs operation through the kernel's
//! file interface, so `ls`, `cp`, `tar`, `rsync`, editors, Python and MPI programs work.
//!
//! [`RingfsFilesystem`] implements `fuser::Filesystem` over a [`ringfs_client::Client`].
//! Inode numbers are file ids (see [`inodes`]): a file is opened, examined and changed by its
//! id, so what the kernel holds stays the same file whatever happens to its names (a file
//! renamed over or unlinked while open keeps serving its open descriptors); names are looked up
//! by path. The kernel may cache attributes and names for
//! [`MountOptions::attr_timeout`] (1 s by default); file data goes through the page cache,
//! which is dropped whenever a file is opened (close-to-open consistency), or bypasses it with
//! [`MountOptions::direct_io`]. Requests run on several threads; writes and reads travel in
//! pieces of up to 1 MiB (the kernel's limit). A dead server makes calls fail with EIO after
//! the client's request deadline; the mount never hangs on it.
//!
//! ```no_run
//! use ringfs_fuse::{MountOptions, mount};
//! let client = ringfs_client::Client::from_env().unwrap();
//! let mounted = mount(client, "/mnt/ringfs".as_ref(), &MountOptions::default()).unwrap();
//! // ... the file system is usable under /mnt/ringfs ...
//! mounted.unmount().unwrap();
//! ```

pub mod directories;
pub mod inodes;
pub mod watch;

use parking_lot::Mutex;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BackgroundSession, Config, Errno as FuseErrno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, MountOption, OpenFlags as FuseOpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, SessionACL,
    TimeOrNow, WriteFlags,
};
use ringfs_client::{Client, Credentials, DirEntry, Errno, Fd, FileKind, LockKind, LockRange, OpenFlags, Stat};
use thiserror::Error;

use crate::directories::{Listed, OpenDirectories};
use crate::inodes::{InodeTable, ROOT_INODE};
use crate::watch::Watch;

/// Largest read or write the kernel sends in one request.
const MAX_TRANSFER: u32 = 1 << 20;

/// How a mount behaves.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// How long the kernel may cache attributes and names. Default 60 s: changes made
    /// elsewhere are dropped from the kernel's caches as the mount learns of them (see
    /// `watch_interval`).
    pub attr_timeout: Duration,
    /// How often the mount asks the servers what other clients changed (see [`watch`]);
    /// zero: never (then only `attr_timeout` bounds how stale the kernel's caches are).
    /// Default 100 ms.
    pub watch_interval: Duration,
    /// The most questions a second the watch asks all servers together: with more servers
    /// than the interval allows at this rate, each is asked less often (so that a job with
    /// a mount on each node costs each server this many questions a second at most). Default
    /// 1000: every 100 ms up to 100 servers, every 1 s with 1,000.
    pub watch_budget: u32,
    /// Bypass the page cache: every read and write goes to ringfs (mmap does not work).
    pub direct_io: bool,
    /// Let the kernel collect small writes in the page cache and send them later (faster
    /// small writes; data reaches ringfs at close, fsync or memory pressure).
    pub writeback_cache: bool,
    /// Threads that serve kernel requests. Default 4.
    pub threads: usize,
    /// Let other users (and root) access the mount (needs `user_allow_other` in
    /// /etc/fuse.conf when not mounted by root).
    pub allow_other: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            attr_timeout: Duration::from_secs(60),
            watch_interval: Duration::from_millis(100),
            watch_budget: 1000,
            direct_io: false,
            writeback_cache: false,
            threads: 4,
            allow_other: false,
        }
    }
}

#[derive(Debug, Error)]
pub enum MountError {
    #[error("cannot mount on {path}: {source}")]
    Mount { path: String, source: std::io::Error },
    #[error("unmounting failed: {0}")]
    Unmount(std::io::Error),
}

/// The ringfs file system, as the kernel sees it.
pub struct RingfsFilesystem {
    client: Client,
    inodes: Arc<InodeTable>,
    /// Drops from the kernel's caches what changed elsewhere (see [`watch`]).
    watch: Arc<Watch>,
    options: MountOptions,
    /// Open directories and where their listings stand (see [`directories`]).
    directories: OpenDirectories,
    /// The kernel's lock owners that took advisory locks, by inode, each with the file handle
    /// it took them through: a process's close (flush) gives back its locks on the file, and
    /// the release of a handle those of every owner that took locks through it (OFD locks
    /// and `flock`, whose owner is the open file description; a process's record locks went
    /// at its close already). No request is sent for an owner that took none.
    lock_owners: Mutex<HashMap<u64, Vec<(u64, FileHandle)>>>,
    /// Tells the kernel to drop what it caches of a file (set once the session runs).
    notifier: Arc<OnceLock<fuser::Notifier>>,
}

thread_local! {
    /// Per-thread read buffer, reused so that large reads touch no new pages.
    static READ_BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn fuse_errno(errno: Errno) -> FuseErrno {
    FuseErrno::from_i32(errno.code())
}

fn system_time(nanoseconds: i64) -> SystemTime {
    if nanoseconds >= 0 {
        UNIX_EPOCH + Duration::from_nanos(nanoseconds as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(nanoseconds.unsigned_abs())
    }
}

/// The supplementary groups of process `pid` (the kernel does not pass them with a request;
/// the servers' checks and set-group-ID rules need them). None if the process is gone.
fn supplementary_groups(pid: u32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return Vec::new() };
    status
        .lines()
        .find_map(|line| line.strip_prefix("Groups:"))
        .map(|groups| groups.split_whitespace().filter_map(|group| group.parse().ok()).collect())
        .unwrap_or_default()
}

/// A time the kernel gives, in nanoseconds since the epoch (`now_ns` for "now").
fn nanoseconds(time: TimeOrNow, now_ns: i64) -> i64 {
    let time = match time {
        TimeOrNow::SpecificTime(time) => time,
        TimeOrNow::Now => return now_ns,
    };
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_nanos() as i64,
        Err(before) => -(before.duration().as_nanos() as i64),
    }
}

fn file_type(stat: &Stat) -> FileType {
    match stat.kind() {
        Some(FileKind::Directory) => FileType::Directory,
        Some(FileKind::Symlink) => FileType::Symlink,
        Some(FileKind::Fifo) => FileType::NamedPipe,
        Some(FileKind::CharDevice) => FileType::CharDevice,
        Some(FileKind::BlockDevice) => FileType::BlockDevice,
        Some(FileKind::Socket) => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

fn file_attr(stat: &Stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(stat.ino),
        size: stat.size,
        blocks: stat.blocks(),
        atime: system_time(stat.atime_ns),
        mtime: system_time(stat.mtime_ns),
        ctime: system_time(stat.ctime_ns),
        crtime: system_time(stat.ctime_ns),
        kind: file_type(stat),
        perm: (stat.mode & 0o7777) as u16,
        nlink: stat.nlink,
        uid: stat.uid,
        gid: stat.gid,
        rdev: stat.rdev as u32,
        blksize: stat.chunk_size,
        flags: 0,
    }
}

fn name_str(name: &OsStr) -> Result<&str, Errno> {
    name.to_str().ok_or(Errno::EINVAL)
}

/// A kernel lock range (`end` inclusive, `OFFSET_MAX` for "to the end").
fn lock_range(start: u64, end: u64) -> LockRange {
    LockRange { start, end: if end >= i64::MAX as u64 { u64::MAX } else { end } }
}

fn fd_of(handle: FileHandle) -> Fd {
    Fd(handle.0 as u32)
}

impl RingfsFilesystem {
    pub fn new(client: Client, options: MountOptions) -> RingfsFilesystem {
        RingfsFilesystem {
            client,
            inodes: Arc::new(InodeTable::default()),
            watch: Arc::new(Watch::default()),
            options,
            directories: OpenDirectories::default(),
            lock_owners: Mutex::new(HashMap::new()),
            notifier: Arc::new(OnceLock::new()),
        }
    }

    fn child_path(&self, parent: INodeNo, name: &OsStr) -> Result<String, Errno> {
        Ok(ringfs_proto::path::join(&self.inodes.path(parent.0)?, name_str(name)?))
    }

    /// Attributes of `path` for a reply that hands the kernel a reference to its inode. A
    /// looked-up file stays alive while the kernel holds it (until `forget`: the mount keeps
    /// it open, see [`inodes`]), so that its later open by inode finds it even if its name
    /// was removed or replaced meanwhile.
    fn entry(&self, path: &str) -> Result<FileAttr, Errno> {
        let (stat, held) = self.client.lookup_held(path)?;
        if let Some(surplus) = self.inodes.remember(stat.file, path, held) {
            let _ = self.client.close(surplus);
        }
        Ok(self.read(&stat))
    }

    /// The kernel's attributes of a file the kernel holds, just read from ringfs (noted in
    /// the inode table, see [`inodes`]).
    fn read(&self, stat: &Stat) -> FileAttr {
        let attr = file_attr(stat);
        self.inodes.read_attr(&attr, stat.has_xattrs);
        attr
    }

    /// The client acting for the caller of `request`: what it creates belongs to the caller
    /// (the kernel has checked the caller may create there: `default_permissions`).
    fn caller(&self, request: &Request) -> Client {
        let own = self.client.credentials();
        if own.uid == request.uid() && own.gid == request.gid() {
            return self.client.clone();
        }
        let groups = supplementary_groups(request.pid());
        self.client.as_user(Credentials { uid: request.uid(), gid: request.gid(), groups })
    }

    /// Attributes of `path` just created in `parent` here, for a reply that hands the kernel
    /// its inode (not kept open: a later open of an inode whose file went fails with ESTALE,
    /// on which the kernel looks the name up again).
    fn created_entry(&self, parent: INodeNo, path: &str) -> Result<FileAttr, Errno> {
        let stat = self.client.lstat(path)?;
        self.inodes.remember(stat.file, path, None);
        let attr = self.read(&stat);
        // The new name's time is the change's (a link's too: it sets the file's ctime).
        self.inodes.names_changed(parent.0, attr.ctime, i32::from(attr.kind == FileType::Directory));
        self.inodes.name_added(parent.0, ringfs_proto::path::file_name(path));
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

    fn open_flags(&self) -> FopenFlags {
        if self.options.direct_io { FopenFlags::FOPEN_DIRECT_IO } else { FopenFlags::empty() }
    }

    /// How long the kernel may keep an answer read from the servers since the watch's count
    /// of drops was `dropped_before` (see [`watch`]).
    fn cache_time(&self, dropped_before: u64) -> Duration {
        self.watch.cache_time(dropped_before, self.options.attr_timeout)
    }

    fn reply_entry(&self, reply: ReplyEntry, dropped_before: u64, result: Result<FileAttr, Errno>) {
        match result {
            Ok(attr) => reply.entry(&self.cache_time(dropped_before), &attr, Generation(0)),
            Err(errno) => reply.error(fuse_errno(errno)),
        }
    }

    /// `size` 0 asks how large the value is; a value larger than `size` is ERANGE.
    fn reply_xattr(reply: ReplyXattr, size: u32, result: Result<Vec<u8>, Errno>) {
        match result {
            Ok(value) if size == 0 => reply.size(value.len() as u32),
            Ok(value) if value.len() > size as usize => reply.error(fuse_errno(Errno::ERANGE)),
            Ok(value) => reply.data(&value),
            Err(errno) => reply.error(fuse_errno(errno)),
        }
    }

    fn reply_empty(reply: ReplyEmpty, result: Result<(), Errno>) {
        match result {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(fuse_errno(errno)),
        }
    }

    fn set_attributes(
        &self,
        inode: INodeNo,
        mode: Option<u32>,
        owner: (Option<u32>, Option<u32>),
        size: Option<u64>,
        times: (Option<TimeOrNow>, Option<TimeOrNow>),
        handle: Option<FileHandle>,
    ) -> Result<FileAttr, Errno> {
        let file = self.inodes.file(inode.0)?;
        if let Some(size) = size {
            match handle {
                Some(handle) => self.client.ftruncate(fd_of(handle), size)?,
                None => self.client.truncate_id(file, size)?,
            }
        }
        let changes_attributes = mode.is_some() || owner.0.is_some() || owner.1.is_some() || times.0.is_some() || times.1.is_some();
        if changes_attributes {
            self.client.set_attr_id(file, |change| {
                change.mode = mode.map(|mode| mode & 0o7777);
                change.uid = owner.0;
                change.gid = owner.1;
                // "Now" is the change's own time, so that mtime and ctime are equal after it.
                let now = change.time_ns;
                change.atime_ns = times.0.map(|time| nanoseconds(time, now));
                change.mtime_ns = times.1.map(|time| nanoseconds(time, now));
                change.times_explicit =
                    matches!(times.0, Some(TimeOrNow::SpecificTime(_))) || matches!(times.1, Some(TimeOrNow::SpecificTime(_)));
            })?;
        }
        Ok(self.read(&self.client.stat_id(file)?))
    }

    /// Opens directory `inode` for listing: its handle.
    fn open_directory(&self, inode: INodeNo) -> Result<u64, Errno> {
        let path = self.inodes.path(inode.0)?;
        let directory = self.client.open_directory(&path)?;
        if directory.stat.file != self.inodes.file(inode.0)? {
            // The directory was renamed (or replaced) by another client since the kernel
            // looked it up: the kernel looks its name up again.
            return Err(Errno::ESTALE);
        }
        let parent = match ringfs_proto::path::parent(&directory.path) {
            Some(parent) if parent != directory.path => self.client.lstat(parent)?.ino,
            _ => directory.stat.ino,
        };
        let own = directory.stat.ino;
        Ok(self.directories.insert(directory, [own, parent]))
    }

    /// Answers a `READDIR(PLUS)` of `handle` continuing after cookie `offset`: a page read
    /// from the servers now (see [`directories`]), given to the kernel through `add` (a
    /// name, its cookie and what it is; `true` when the reply is full).
    fn list_page(&self, handle: FileHandle, offset: u64, add: impl FnMut(&str, u64, Listed<'_, DirEntry>) -> bool) -> Result<(), Errno> {
        let (directory, resume) = self.directories.resume(handle.0, offset).ok_or(Errno::EBADF)?;
        let Some(resume) = resume else { return Ok(()) };
        let page = self.client.list_page(&directory, resume.after.as_deref(), resume.wanted)?;
        let given = self.directories.give(handle.0, &resume, &page.entries, |entry| entry.name.as_str(), page.more, add);
        if given { Ok(()) } else { Err(Errno::EBADF) }
    }

    /// Makes the kernel drop its cached pages and attributes of `inode` and the names it
    /// knows in the same directory (a database's journal beside it may have been removed and
    /// made again through another mount).
    fn forget_cached(&self, inode: INodeNo) {
        let Some(notifier) = self.notifier.get() else { return };
        if let Err(error) = notifier.inval_inode(inode, 0, 0) {
            log::debug!("the kernel did not drop its cache of inode {}: {error}", inode.0);
        }
        let Some((directory, names)) = self.inodes.names_beside(inode.0) else { return };
        for name in names {
            // (ENOENT: the kernel had dropped that name already.)
            let _ = notifier.inval_entry(INodeNo(directory), OsStr::new(&name));
        }
    }

    /// Gives back the advisory locks on `inode` of the owners that `chosen` picks (given
    /// the owner and the handle it took locks through), asking through `handle`.
    fn release_locks(&self, inode: INodeNo, handle: FileHandle, chosen: impl Fn(u64, FileHandle) -> bool) -> Result<(), Errno> {
        let mut released: Vec<u64> = Vec::new();
        {
            let mut owners = self.lock_owners.lock();
            let Some(list) = owners.get_mut(&inode.0) else { return Ok(()) };
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
                owners.remove(&inode.0);
            }
        }
        released.into_iter().try_for_each(|owner| self.client.release_locks(fd_of(handle), owner))
    }
}

impl Filesystem for RingfsFilesystem {
    fn init(&mut self, _request: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_TRANSFER);
        let _ = config.set_max_readahead(MAX_TRANSFER);
        let mut wanted = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_AUTO_INVAL_DATA
            | InitFlags::FUSE_ASYNC_DIO
            // Advisory locks go to the servers, so that they hold across mounts and nodes.
            | InitFlags::FUSE_POSIX_LOCKS
            | InitFlags::FUSE_FLOCK_LOCKS;
        if self.options.writeback_cache {
            wanted |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        for flag in wanted.iter() {
            if config.add_capabilities(flag).is_err() {
                log::info!("the kernel does not offer FUSE capability {flag:?}");
            }
        }
        Ok(())
    }

    fn lookup(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let dropped = self.watch.dropped();
        let result = self.child_path(parent, name).and_then(|path| {
            let short = name.len() <= ringfs_proto::path::MAX_NAME_BYTES && path.len() <= ringfs_proto::path::MAX_PATH_BYTES;
            if short && self.inodes.surely_missing(parent.0, &name.to_string_lossy()) {
                // (A directory made here, whose names all came through here: see `inodes`.)
                return Err(Errno::ENOENT);
            }
            self.entry(&path)
        });
        if result == Err(Errno::ENOENT) && self.inodes.note_missing(parent.0, &name.to_string_lossy(), self.options.attr_timeout) {
            // A missing name is remembered as long as names are (inode 0: none); a name made
            // through this mount replaces it at once, one made elsewhere shows as late as
            // other changes.
            let missing = FileAttr { ino: INodeNo(0), ..file_attr(&Stat::default()) };
            return reply.entry(&self.cache_time(dropped), &missing, Generation(0));
        }
        self.reply_entry(reply, dropped, result);
    }

    fn forget(&self, _request: &Request, inode: INodeNo, lookups: u64) {
        if let Some(held) = self.inodes.forget(inode.0, lookups) {
            let _ = self.client.close(held);
        }
    }

    fn getattr(&self, _request: &Request, inode: INodeNo, handle: Option<FileHandle>, reply: ReplyAttr) {
        let dropped = self.watch.dropped();
        // (A directory's, read lately and changed since by this mount: see `inodes`.)
        if let Some((attr, valid_for)) = self.inodes.directory_attr(inode.0, self.options.attr_timeout) {
            return reply.attr(&valid_for, &attr);
        }
        let stat = match handle {
            Some(handle) if inode.0 != ROOT_INODE => self.client.fstat(fd_of(handle)),
            _ => self.inodes.file(inode.0).and_then(|file| self.client.stat_id(file)),
        };
        match stat {
            Ok(stat) => reply.attr(&self.cache_time(dropped), &self.read(&stat)),
            Err(errno) => reply.error(fuse_errno(errno)),
        }
    }

    fn setattr(
        &self,
        _request: &Request,
        inode: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        handle: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self.set_attributes(inode, mode, (uid, gid), size, (atime, mtime), handle) {
            Ok(attr) => reply.attr(&self.options.attr_timeout, &attr),
            Err(errno) => reply.error(fuse_errno(errno)),
        }
    }

    fn readlink(&self, _request: &Request, inode: INodeNo, reply: ReplyData) {
        match self.inodes.file(inode.0).and_then(|file| self.client.readlink_file(file)) {
            Ok(target) => reply.data(target.as_bytes()),
            Err(errno) => reply.error(fuse_errno(errno)),
        }
    }

    fn mkdir(&self, request: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let dropped = self.watch.dropped();
        let result = self.child_path(parent, name).and_then(|path| {
            self.caller(request).mkdir(&path, mode & !umask)?;
            self.created_entry(parent, &path)
        });
        self.reply_entry(reply, dropped, result);
    }

    fn unlink(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let time = SystemTime::now();
        // (The mount closes the file it keeps when the kernel forgets it, after this.)
        let result = self.child_path(parent, name).and_then(|path| self.client.unlink_leaving_closes_batched(&path));
        if result.is_ok() {
            self.inodes.names_changed(parent.0, time, 0);
            self.inodes.name_removed(parent.0, &name.to_string_lossy());
        }
        Self::reply_empty(reply, result);
    }

    fn rmdir(&self, _request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let time = SystemTime::now();
        let result = self.child_path(parent, name).and_then(|path| self.client.rmdir(&path));
        if result.is_ok() {
            self.inodes.names_changed(parent.0, time, -1);
            self.inodes.name_removed(parent.0, &name.to_string_lossy());
        }
        Self::reply_empty(reply, result);
    }

    fn symlink(&self, request: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let dropped = self.watch.dropped();
        let result = self.child_path(parent, link_name).and_then(|path| {
            self.caller(request).symlink(target.to_str().ok_or(Errno::EINVAL)?, &path)?;
            self.created_entry(parent, &path)
        });
        self.reply_entry(reply, dropped, result);
    }

    fn mknod(&self, request: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        let dropped = self.watch.dropped();
        let result = self.child_path(parent, name).and_then(|path| {
            let mode = (mode & 0o170000) | (mode & 0o7777 & !umask);
            self.caller(request).mknod(&path, mode, rdev as u64)?;
            self.created_entry(parent, &path)
        });
        self.reply_entry(reply, dropped, result);
    }

    fn link(&self, _request: &Request, inode: INodeNo, new_parent: INodeNo, new_name: &OsStr, reply: ReplyEntry) {
        let dropped = self.watch.dropped();
        let result = (|| {
            // By id: the file the kernel holds, whatever its names are now (the name this
            // mount saw last may be gone while others remain).
            let file = self.inodes.file(inode.0)?;
            let to = self.child_path(new_parent, new_name)?;
            self.client.link_file(file, &to)?;
            self.created_entry(new_parent, &to)
        })();
        self.reply_entry(reply, dropped, result);
    }

    fn rename(
        &self,
        _request: &Request,
        parent: INodeNo,
        name: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let result = (|| {
            let from = self.child_path(parent, name)?;
            let to = self.child_path(new_parent, new_name)?;
            let mut ringfs_flags = 0;
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                ringfs_flags |= ringfs_client::RenameFlags::NOREPLACE;
            }
            let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
            if exchange {
                ringfs_flags |= ringfs_client::RenameFlags::EXCHANGE;
            }
            if flags.contains(RenameFlags::RENAME_WHITEOUT) {
                return Err(Errno::EINVAL);
            }
            if let Err(errno) = self.client.rename_leaving_closes_batched(&from, &to, ringfs_flags) {
                if errno == Errno::EIO || errno == Errno::ETIMEDOUT {
                    // (It may have happened.)
                    self.inodes.lose_names(parent.0);
                    self.inodes.lose_names(new_parent.0);
                }
                return Err(errno);
            }
            if !exchange {
                self.inodes.name_removed(parent.0, &name.to_string_lossy());
                self.inodes.name_added(new_parent.0, &new_name.to_string_lossy());
            }
            self.inodes.renamed(&from, &to, exchange);
            // (The parents' link counts depend on what moved: they are read again.)
            self.inodes.forget_attr(parent.0);
            self.inodes.forget_attr(new_parent.0);
            Ok(())
        })();
        Self::reply_empty(reply, result);
    }

    fn open(&self, _request: &Request, inode: INodeNo, flags: FuseOpenFlags, reply: ReplyOpen) {
        // By id: the file the kernel holds, whatever its names are now; beside the
        // descriptor the mount keeps on it if there is one (no round trip: see `inodes`).
        let flags = self.kernel_open_flags(flags.0);
        let result = match self.inodes.held(inode.0) {
            Some(held) => self.client.open_beside(held, flags),
            None => self.inodes.file(inode.0).and_then(|file| self.client.open_file(file, flags)),
        };
        match result {
            Ok(fd) => reply.opened(FileHandle(fd.0 as u64), self.open_flags()),
            Err(errno) => reply.error(fuse_errno(errno)),
        }
    }

    fn create(&self, request: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        let dropped = self.watch.dropped();
        let result = self.child_path(parent, name).and_then(|path| {
            let (fd, stat) =
                self.caller(request).open_with_stat(&path, self.kernel_open_flags(flags) | OpenFlags::CREATE, mode & !umask)?;
            self.inodes.remember(stat.file, &path, None);
            let attr = self.read(&stat);
            self.inodes.names_changed(parent.0, attr.ctime, 0);
            self.inodes.name_added(parent.0, &name.to_string_lossy());
            Ok((fd, attr))
        });
        match result {
            Ok((fd, attr)) => reply.created(&self.cache_time(dropped), &attr, Generation(0), FileHandle(fd.0 as u64), self.open_flags()),
            Err(errno) => reply.error(fuse_errno(errno)),
        }
    }

    fn read(
        &self,
        _request: &Request,
        _inode: INodeNo,
        handle: FileHandle,
        offset: u64,
        size: u32,
        _flags: FuseOpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        READ_BUFFER.with(|buffer| {
            let mut buffer = buffer.borrow_mut();
            if buffer.len() < size as usize {
                buffer.resize(size as usize, 0);
            }
            match self.client.pread(fd_of(handle), &mut buffer[..size as usize], offset) {
                Ok(count) => reply.data(&buffer[..count]),
                Err(errno) => reply.error(fuse_errno(errno)),
            }
        });
    }

    fn write(
        &self,
        _request: &Request,
        _inode: INodeNo,
        handle: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: FuseOpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.client.pwrite(fd_of(handle), data, offset) {
            Ok(count) => reply.written(count as u32),
            Err(errno) => reply.error(fuse_errno(errno)),
        }
    }

    fn flush(&self, _request: &Request, inode: INodeNo, handle: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        // POSIX: a process's close of any descriptor of a file ends its record locks on it.
        Self::reply_empty(reply, self.release_locks(inode, handle, |owner, _| owner == lock_owner.0));
    }

    fn release(
        &self,
        _request: &Request,
        inode: INodeNo,
        handle: FileHandle,
        _flags: FuseOpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // The last close of an open file description ends its `flock` and OFD locks.
        let released = self.release_locks(inode, handle, |_, through| through == handle);
        // The first registered open of an inode the mount keeps no descriptor on becomes
        // the one it keeps (later opens need no round trip).
        let fd = fd_of(handle);
        let kept = self.client.registers_open(fd) && self.inodes.keep(inode.0, fd);
        let closed = if kept { Ok(()) } else { self.client.close(fd) };
        Self::reply_empty(reply, released.and(closed));
    }

    fn getlk(
        &self,
        _request: &Request,
        _inode: INodeNo,
        handle: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: fuser::ReplyLock,
    ) {
        let outcome = ringfs_client::lock_kind_of(typ)
            .and_then(|kind| self.client.test_lock(fd_of(handle), lock_owner.0, kind, lock_range(start, end)));
        match outcome {
            Ok(Some(conflict)) => {
                let typ = if conflict.kind == LockKind::Write { libc::F_WRLCK } else { libc::F_RDLCK };
                let end = if conflict.range.end == u64::MAX { i64::MAX as u64 } else { conflict.range.end };
                reply.locked(conflict.range.start, end, typ, conflict.pid);
            }
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
            Err(errno) => reply.error(fuse_errno(errno)),
        }
    }

    fn setlk(
        &self,
        _request: &Request,
        inode: INodeNo,
        handle: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let outcome = ringfs_client::lock_kind_of(typ).and_then(|kind| {
            if kind != LockKind::Unlock {
                let mut owners = self.lock_owners.lock();
                let owners = owners.entry(inode.0).or_default();
                if !owners.contains(&(lock_owner.0, handle)) {
                    owners.push((lock_owner.0, handle));
                }
            }
            self.client.set_lock(fd_of(handle), lock_owner.0, kind, lock_range(start, end), sleep)?;
            if kind != LockKind::Unlock {
                // What the lock protects may have been changed through another mount (node)
                // while this one cached it: the kernel drops its pages and attributes of the
                // file before the lock is granted (as NFS revalidates on locking).
                self.forget_cached(inode);
            }
            Ok(())
        });
        Self::reply_empty(reply, outcome);
    }

    fn fsync(&self, _request: &Request, inode: INodeNo, handle: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // The name the mount last saw the file at: its server syncs the name's journal.
        let result = match self.inodes.path(inode.0) {
            Ok(path) => self.client.fsync_at(fd_of(handle), &path),
            Err(_) => self.client.fsync(fd_of(handle)),
        };
        Self::reply_empty(reply, result);
    }

    fn fallocate(&self, _request: &Request, _inode: INodeNo, handle: FileHandle, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        Self::reply_empty(reply, self.client.fallocate(fd_of(handle), mode as u32, offset, length));
    }

    fn opendir(&self, _request: &Request, inode: INodeNo, _flags: FuseOpenFlags, reply: ReplyOpen) {
        match self.open_directory(inode) {
            Ok(handle) => reply.opened(FileHandle(handle), FopenFlags::empty()),
            Err(errno) => reply.error(fuse_errno(errno)),
        }
    }

    fn readdir(&self, _request: &Request, _inode: INodeNo, handle: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let listed = self.list_page(handle, offset, |name, cookie, listed| match listed {
            Listed::Dot(ino) => reply.add(INodeNo(ino), cookie, FileType::Directory, name),
            Listed::Entry(entry) => reply.add(INodeNo(entry.stat.ino), cookie, file_type(&entry.stat), name),
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(fuse_errno(errno)),
        }
    }

    fn readdirplus(&self, _request: &Request, inode: INodeNo, handle: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let Ok(directory_path) = self.inodes.path(inode.0) else { return reply.error(FuseErrno::ESTALE) };
        let dropped = self.watch.dropped();
        let listed = self.list_page(handle, offset, |name, cookie, listed| match listed {
            // (The kernel takes no attributes from the dot entries.)
            Listed::Dot(ino) => {
                let attr = FileAttr { ino: INodeNo(ino), kind: FileType::Directory, ..file_attr(&Stat::default()) };
                reply.add(INodeNo(ino), cookie, name, &Duration::ZERO, &attr, Generation(0))
            }
            Listed::Entry(entry) => {
                let timeout = self.cache_time(dropped);
                let full = reply.add(INodeNo(entry.stat.ino), cookie, name, &timeout, &file_attr(&entry.stat), Generation(0));
                if !full {
                    // The kernel now holds a reference to the entry's inode.
                    self.inodes.remember(entry.stat.file, &ringfs_proto::path::join(&directory_path, name), None);
                    self.read(&entry.stat);
                }
                full
            }
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(fuse_errno(errno)),
        }
    }

    fn releasedir(&self, _request: &Request, _inode: INodeNo, handle: FileHandle, _flags: FuseOpenFlags, reply: ReplyEmpty) {
        self.directories.remove(handle.0);
        reply.ok();
    }

    fn fsyncdir(&self, _request: &Request, inode: INodeNo, _handle: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // A directory's names are spread over every server: each makes its journal durable.
        let result = self.inodes.file(inode.0).and_then(|file| self.client.fsync_everywhere(file));
        Self::reply_empty(reply, result);
    }

    fn statfs(&self, _request: &Request, _inode: INodeNo, reply: ReplyStatfs) {
        const BLOCK: u64 = 4096;
        match self.client.usage() {
            Ok(usage) => {
                let blocks = usage.capacity_bytes / BLOCK;
                let free = usage.capacity_bytes.saturating_sub(usage.used_bytes) / BLOCK;
                let files = usage.entries + (1 << 30);
                reply.statfs(blocks, free, free, files, files - usage.entries, BLOCK as u32, 255, BLOCK as u32);
            }
            Err(errno) => reply.error(fuse_errno(errno)),
        }
    }

    // Extended attributes: the kernel has checked namespaces and permissions (the VFS's
    // `xattr_permission`, with `default_permissions`); ACLs are not enabled, so the kernel
    // answers `system.posix_acl_*` itself (EOPNOTSUPP).

    fn setxattr(&self, _request: &Request, inode: INodeNo, name: &OsStr, value: &[u8], flags: i32, _position: u32, reply: ReplyEmpty) {
        let result = (|| {
            let name = name.to_str().ok_or(Errno::EINVAL)?;
            self.inodes.forget_attr(inode.0);
            self.client.set_xattr_id(self.inodes.file(inode.0)?, name, value, flags as u32)
        })();
        Self::reply_empty(reply, result);
    }

    fn getxattr(&self, _request: &Request, inode: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if self.inodes.has_no_xattrs(inode.0, self.options.attr_timeout) {
            // (The kernel asks for `security.capability` before every write.)
            return reply.error(FuseErrno::ENODATA);
        }
        let result = (|| {
            let name = name.to_str().ok_or(Errno::ENODATA)?;
            self.client.get_xattr_id(self.inodes.file(inode.0)?, name)
        })();
        Self::reply_xattr(reply, size, result);
    }

    fn listxattr(&self, request: &Request, inode: INodeNo, size: u32, reply: ReplyXattr) {
        if self.inodes.has_no_xattrs(inode.0, self.options.attr_timeout) {
            return Self::reply_xattr(reply, size, Ok(Vec::new()));
        }
        let result = self.inodes.file(inode.0).and_then(|file| self.client.list_xattrs_id(file)).map(|names| {
            let mut list = Vec::new();
            // `trusted.` names are listed to root only (as file systems do; the kernel leaves
            // the filtering to them).
            for name in names.into_iter().filter(|name| request.uid() == 0 || !name.starts_with("trusted.")) {
                list.extend_from_slice(name.as_bytes());
                list.push(0);
            }
            list
        });
        Self::reply_xattr(reply, size, result);
    }

    fn removexattr(&self, _request: &Request, inode: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = (|| {
            let name = name.to_str().ok_or(Errno::ENODATA)?;
            self.inodes.forget_attr(inode.0);
            self.client.remove_xattr_id(self.inodes.file(inode.0)?, name)
        })();
        Self::reply_empty(reply, result);
    }

    fn access(&self, _request: &Request, inode: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let result = self.inodes.path(inode.0).and_then(|path| self.client.access(&path, mask.bits() as u32));
        Self::reply_empty(reply, result);
    }
}

/// A mounted file system; unmounts when [`MountedFs::unmount`] is called or it is dropped.
pub struct MountedFs {
    session: Option<BackgroundSession>,
    /// The thread watching for changes elsewhere, and how to stop it.
    watching: Option<(Arc<Watch>, std::thread::JoinHandle<()>)>,
}

impl MountedFs {
    /// True once the session has ended (for example, someone ran `umount`).
    pub fn is_finished(&self) -> bool {
        self.session.as_ref().is_none_or(|session| session.guard.is_finished())
    }

    /// Unmounts and waits for the request threads to finish.
    pub fn unmount(mut self) -> Result<(), MountError> {
        self.stop_watching();
        match self.session.take() {
            Some(session) => session.umount_and_join().map_err(MountError::Unmount),
            None => Ok(()),
        }
    }

    fn stop_watching(&mut self) {
        if let Some((watch, thread)) = self.watching.take() {
            watch.stop();
            let _ = thread.join();
        }
    }
}

impl Drop for MountedFs {
    fn drop(&mut self) {
        self.stop_watching();
        if let Some(session) = self.session.take()
            && let Err(error) = session.umount_and_join()
        {
            log::warn!("unmounting failed: {error}");
        }
    }
}

/// Mounts ringfs at `directory` and serves it on background threads.
pub fn mount(client: Client, directory: &Path, options: &MountOptions) -> Result<MountedFs, MountError> {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("ringfs".into()),
        MountOption::Subtype("ringfs".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
    ];
    if options.allow_other {
        config.acl = SessionACL::All;
    }
    config.n_threads = Some(options.threads.max(1));
    config.clone_fd = true;
    let watching = !options.watch_interval.is_zero();
    let position = watching.then(|| watch::start_position(&client));
    let filesystem = RingfsFilesystem::new(client.clone(), options.clone());
    let (notifier, watch, inodes) = (filesystem.notifier.clone(), filesystem.watch.clone(), filesystem.inodes.clone());
    let session = fuser::spawn_mount(filesystem, directory, &config)
        .map_err(|source| MountError::Mount { path: directory.display().to_string(), source })?;
    let _ = notifier.set(session.notifier());
    let watching = position.map(|position| {
        let pace = watch::Pace { interval: options.watch_interval, budget: options.watch_budget };
        let thread = watch::spawn(watch.clone(), client, position, inodes, session.notifier(), pace);
        (watch, thread)
    });
    Ok(MountedFs { session: Some(session), watching })
}
