//! Requests read from `/dev/fuse` by fuser: each `fuser::Filesystem` method decodes nothing
//! itself (fuser has) and answers with what the operation of the same request returns (see
//! [`crate::operations`]). With FUSE over io_uring ([`crate::ring`]) this path still serves
//! `INIT`, `FORGET` and whatever arrives before the kernel's queues are ready.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::SystemTime;

use fuser::{
    AccessFlags, Errno as FuseErrno, FileHandle, Filesystem, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner,
    OpenFlags as FuseOpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyLock, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use ringfs_client::Errno;

use crate::interrupts::{releasing_for, waiting_for};
use crate::operations::{AttributeChanges, Caller, Entry, LockFound, LockRequest, Opened, Usage, Xattr};
use crate::{MAX_TRANSFER, RingfsFilesystem};

thread_local! {
    /// Per-thread read buffer, reused so that large reads touch no new pages.
    static READ_BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn fuse_errno(errno: Errno) -> FuseErrno {
    FuseErrno::from_i32(errno.code())
}

fn caller(request: &Request) -> Caller {
    Caller { uid: request.uid(), gid: request.gid(), pid: request.pid() }
}

/// How a fuser reply answers an operation's result.
trait Answer<T> {
    fn answer(self, result: Result<T, Errno>);
}

/// Answers `reply` with what `work`, run for thread `caller`, returns — or, once the caller
/// is found being killed while `work` waits for a server, with EINTR at once, `work` going on
/// to its end (see [`crate::interrupts::releasing_for`]); `unanswered` then gets the result
/// the kernel never saw, to undo what only the kernel would have ended (an open).
fn answer_or_release<T, R: Answer<T> + 'static>(
    caller: u32,
    reply: R,
    work: impl FnOnce() -> Result<T, Errno>,
    unanswered: impl FnOnce(Result<T, Errno>),
) {
    let reply = std::rc::Rc::new(std::cell::Cell::new(Some(reply)));
    let released = reply.clone();
    let release = move || {
        if let Some(reply) = released.take() {
            reply.answer(Err(Errno::EINTR));
        }
    };
    let result = releasing_for(caller, release, work);
    match reply.take() {
        Some(reply) => reply.answer(result),
        None => unanswered(result),
    }
}

impl Answer<Entry> for ReplyEntry {
    fn answer(self, result: Result<Entry, Errno>) {
        match result {
            Ok(entry) => self.entry(&entry.valid_for, &entry.attr, Generation(0)),
            Err(errno) => self.error(fuse_errno(errno)),
        }
    }
}

impl Answer<Entry> for ReplyAttr {
    fn answer(self, result: Result<Entry, Errno>) {
        match result {
            Ok(entry) => self.attr(&entry.valid_for, &entry.attr),
            Err(errno) => self.error(fuse_errno(errno)),
        }
    }
}

impl Answer<()> for ReplyEmpty {
    fn answer(self, result: Result<(), Errno>) {
        match result {
            Ok(()) => self.ok(),
            Err(errno) => self.error(fuse_errno(errno)),
        }
    }
}

impl Answer<Opened> for ReplyOpen {
    fn answer(self, result: Result<Opened, Errno>) {
        match result {
            Ok(opened) => self.opened(FileHandle(opened.handle), opened.flags),
            Err(errno) => self.error(fuse_errno(errno)),
        }
    }
}

impl Answer<(Entry, Opened)> for ReplyCreate {
    fn answer(self, result: Result<(Entry, Opened), Errno>) {
        match result {
            Ok((entry, opened)) => self.created(&entry.valid_for, &entry.attr, Generation(0), FileHandle(opened.handle), opened.flags),
            Err(errno) => self.error(fuse_errno(errno)),
        }
    }
}

impl Answer<u32> for ReplyWrite {
    fn answer(self, result: Result<u32, Errno>) {
        match result {
            Ok(count) => self.written(count),
            Err(errno) => self.error(fuse_errno(errno)),
        }
    }
}

impl Answer<Xattr> for ReplyXattr {
    fn answer(self, result: Result<Xattr, Errno>) {
        match result {
            Ok(Xattr::Size(size)) => self.size(size),
            Ok(Xattr::Data(data)) => self.data(&data),
            Err(errno) => self.error(fuse_errno(errno)),
        }
    }
}

impl Answer<Usage> for ReplyStatfs {
    fn answer(self, result: Result<Usage, Errno>) {
        match result {
            Ok(usage) => self.statfs(
                usage.blocks,
                usage.free,
                usage.free,
                usage.files,
                usage.files_free,
                usage.block_size,
                usage.name_max,
                usage.block_size,
            ),
            Err(errno) => self.error(fuse_errno(errno)),
        }
    }
}

impl Answer<LockFound> for ReplyLock {
    fn answer(self, result: Result<LockFound, Errno>) {
        match result {
            Ok(found) => self.locked(found.start, found.end, found.typ, found.pid),
            Err(errno) => self.error(fuse_errno(errno)),
        }
    }
}

impl Answer<String> for ReplyData {
    fn answer(self, result: Result<String, Errno>) {
        match result {
            Ok(text) => self.data(text.as_bytes()),
            Err(errno) => self.error(fuse_errno(errno)),
        }
    }
}

/// The mount as fuser serves it (the state is shared with the ring threads, see
/// [`crate::ring`]).
pub struct DevFuse {
    fs: Arc<RingfsFilesystem>,
    /// Request threads now dropping a file's cache before they answer a lock taken
    /// ([`DevFuse::grant`]), and how many may at once: one fewer than there are threads.
    dropping: AtomicUsize,
    most_dropping: usize,
    /// Locks taken, to be answered by the grants thread once the kernel dropped its cache
    /// of their files.
    grants: mpsc::Sender<(u64, ReplyEmpty)>,
}

impl DevFuse {
    pub fn new(fs: Arc<RingfsFilesystem>) -> DevFuse {
        let (grants, granted) = mpsc::channel::<(u64, ReplyEmpty)>();
        // (The thread ends with the session.)
        let filesystem = fs.clone();
        let started = std::thread::Builder::new().name("ringfs-grants".into()).spawn(move || {
            for (inode, reply) in granted {
                filesystem.forget_cached(inode);
                reply.ok();
            }
        });
        if let Err(error) = started {
            log::warn!("no thread for lock grants ({error}): request threads drop the caches");
        }
        let most_dropping = fs.options.threads.saturating_sub(1);
        DevFuse { fs, dropping: AtomicUsize::new(0), most_dropping, grants }
    }

    /// Answers a lock taken once the kernel has dropped its cache of the file. The drop
    /// waits for pages that reads hold locked until their `READ` is answered: drops on all
    /// of fuser's request threads at once left those reads unanswered for ever
    /// (`tests/locks.rs: reads_beside_lock_grants_keep_going`). So a request thread drops
    /// and answers itself only while another thread stays free for the reads; past that,
    /// the grants thread does (a hand-off that cost uncontended locks ~13 %).
    fn grant(&self, inode: u64, reply: ReplyEmpty) {
        if self.dropping.fetch_add(1, Ordering::AcqRel) < self.most_dropping {
            self.fs.forget_cached(inode);
            self.dropping.fetch_sub(1, Ordering::AcqRel);
            reply.ok();
            return;
        }
        self.dropping.fetch_sub(1, Ordering::AcqRel);
        if let Err(mpsc::SendError((inode, reply))) = self.grants.send((inode, reply)) {
            // (No grants thread: dropped here, as it was before there was one.)
            self.fs.forget_cached(inode);
            reply.ok();
        }
    }
}

impl Filesystem for DevFuse {
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
        if self.fs.options.writeback_cache {
            wanted |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        for flag in wanted.iter() {
            if config.add_capabilities(flag).is_err() {
                log::info!("the kernel does not offer FUSE capability {flag:?}");
            }
        }
        if self.fs.options.io_uring {
            let offered = config.add_capabilities(InitFlags::FUSE_OVER_IO_URING).is_ok();
            if !offered {
                log::warn!(
                    "the kernel does not offer FUSE over io_uring (as root: echo Y > {}); serving /dev/fuse",
                    crate::ring::ENABLE_PARAMETER
                );
            }
            let _ = self.fs.ring_offered.set(offered);
        }
        Ok(())
    }

    fn lookup(&self, request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        reply.answer(waiting_for(request.pid(), || self.fs.lookup_entry(parent.0, name)));
    }

    fn forget(&self, _request: &Request, inode: INodeNo, lookups: u64) {
        self.fs.forget_inode(inode.0, lookups);
    }

    fn getattr(&self, request: &Request, inode: INodeNo, handle: Option<FileHandle>, reply: ReplyAttr) {
        reply.answer(waiting_for(request.pid(), || self.fs.attributes(inode.0, handle.map(|handle| handle.0))));
    }

    fn setattr(
        &self,
        request: &Request,
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
        let changes = AttributeChanges { mode, uid, gid, size, atime, mtime, handle: handle.map(|handle| handle.0) };
        reply.answer(waiting_for(request.pid(), || self.fs.set_attributes(inode.0, changes)));
    }

    fn readlink(&self, request: &Request, inode: INodeNo, reply: ReplyData) {
        reply.answer(waiting_for(request.pid(), || self.fs.link_target(inode.0)));
    }

    fn mkdir(&self, request: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        reply.answer(waiting_for(request.pid(), || self.fs.make_directory(caller(request), parent.0, name, mode, umask)));
    }

    fn unlink(&self, request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply.answer(waiting_for(request.pid(), || self.fs.remove_name(parent.0, name)));
    }

    fn rmdir(&self, request: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply.answer(waiting_for(request.pid(), || self.fs.remove_directory(parent.0, name)));
    }

    fn symlink(&self, request: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        reply.answer(waiting_for(request.pid(), || self.fs.make_symlink(caller(request), parent.0, link_name, target.as_os_str())));
    }

    fn mknod(&self, request: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        reply.answer(waiting_for(request.pid(), || self.fs.make_node(caller(request), parent.0, name, mode, umask, rdev)));
    }

    fn link(&self, request: &Request, inode: INodeNo, new_parent: INodeNo, new_name: &OsStr, reply: ReplyEntry) {
        reply.answer(waiting_for(request.pid(), || self.fs.make_link(inode.0, new_parent.0, new_name)));
    }

    fn rename(
        &self,
        request: &Request,
        parent: INodeNo,
        name: &OsStr,
        new_parent: INodeNo,
        new_name: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let work = || self.fs.rename_entry(parent.0, name, new_parent.0, new_name, flags.bits());
        answer_or_release(request.pid(), reply, work, |result| self.fs.unanswered_rename(parent.0, name, new_parent.0, new_name, result));
    }

    fn open(&self, request: &Request, inode: INodeNo, flags: FuseOpenFlags, reply: ReplyOpen) {
        let work = || self.fs.open_file(inode.0, flags.0);
        answer_or_release(request.pid(), reply, work, |result| self.fs.unanswered_open(inode.0, result));
    }

    fn create(&self, request: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        let work = || self.fs.create_file(caller(request), parent.0, name, mode, umask, flags);
        answer_or_release(request.pid(), reply, work, |result| self.fs.unanswered_create(parent.0, name, result));
    }

    fn read(
        &self,
        request: &Request,
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
            match waiting_for(request.pid(), || self.fs.read_into(handle.0, offset, &mut buffer[..size as usize])) {
                Ok(count) => reply.data(&buffer[..count]),
                Err(errno) => reply.error(fuse_errno(errno)),
            }
        });
    }

    fn write(
        &self,
        request: &Request,
        inode: INodeNo,
        handle: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: FuseOpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.answer(waiting_for(request.pid(), || self.fs.write_at(inode.0, handle.0, offset, data)));
    }

    fn flush(&self, _request: &Request, inode: INodeNo, handle: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.answer(self.fs.flush_handle(inode.0, handle.0, lock_owner.0));
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
        reply.answer(self.fs.release_handle(inode.0, handle.0));
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
        reply: ReplyLock,
    ) {
        reply.answer(self.fs.find_lock(handle.0, lock_owner.0, start, end, typ));
    }

    fn setlk(
        &self,
        request: &Request,
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
        let lock = LockRequest { inode: inode.0, handle: handle.0, owner: lock_owner.0, start, end, typ };
        match self.fs.set_lock_keeping_cache(lock, None) {
            Ok(true) => self.grant(lock.inode, reply),
            Ok(false) => reply.ok(),
            Err(Errno::EAGAIN) if sleep => {
                // The wait goes to a thread of its own: on one of the few request threads
                // it would hold back every other request — the holder's unlock among them,
                // once as many owners wait as there are threads.
                let (filesystem, waiter) = (self.fs.clone(), request.pid());
                let waiting = std::thread::Builder::new().name("ringfs-lock-wait".into()).spawn(move || {
                    reply.answer(filesystem.set_lock(lock, Some(waiter)));
                });
                if let Err(error) = waiting {
                    // (The reply went with the closure: fuser answers a dropped reply EIO.)
                    log::warn!("no thread to wait for a lock: {error}");
                }
            }
            Err(errno) => reply.answer(Err::<(), _>(errno)),
        }
    }

    fn fsync(&self, request: &Request, inode: INodeNo, handle: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply.answer(waiting_for(request.pid(), || self.fs.sync_file(inode.0, handle.0)));
    }

    fn fallocate(&self, request: &Request, inode: INodeNo, handle: FileHandle, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        reply.answer(waiting_for(request.pid(), || self.fs.allocate(inode.0, handle.0, offset, length, mode)));
    }

    fn opendir(&self, request: &Request, inode: INodeNo, _flags: FuseOpenFlags, reply: ReplyOpen) {
        reply.answer(waiting_for(request.pid(), || self.fs.open_directory(inode.0)));
    }

    fn readdir(&self, request: &Request, _inode: INodeNo, handle: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let listed = waiting_for(request.pid(), || {
            self.fs.list(handle.0, offset, |listing| reply.add(INodeNo(listing.ino), listing.cookie, listing.kind, listing.name))
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(fuse_errno(errno)),
        }
    }

    fn readdirplus(&self, request: &Request, inode: INodeNo, handle: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let listed = waiting_for(request.pid(), || {
            self.fs.list_plus(inode.0, handle.0, offset, |listing, entry| {
                reply.add(INodeNo(listing.ino), listing.cookie, listing.name, &entry.valid_for, &entry.attr, Generation(0))
            })
        });
        match listed {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(fuse_errno(errno)),
        }
    }

    fn releasedir(&self, _request: &Request, _inode: INodeNo, handle: FileHandle, _flags: FuseOpenFlags, reply: ReplyEmpty) {
        self.fs.release_directory(handle.0);
        reply.ok();
    }

    fn fsyncdir(&self, request: &Request, inode: INodeNo, _handle: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply.answer(waiting_for(request.pid(), || self.fs.sync_directory(inode.0)));
    }

    fn statfs(&self, request: &Request, _inode: INodeNo, reply: ReplyStatfs) {
        reply.answer(waiting_for(request.pid(), || self.fs.usage()));
    }

    fn setxattr(&self, request: &Request, inode: INodeNo, name: &OsStr, value: &[u8], flags: i32, _position: u32, reply: ReplyEmpty) {
        reply.answer(waiting_for(request.pid(), || self.fs.set_xattr(inode.0, name, value, flags)));
    }

    fn getxattr(&self, request: &Request, inode: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        reply.answer(waiting_for(request.pid(), || self.fs.xattr(inode.0, name, size)));
    }

    fn listxattr(&self, request: &Request, inode: INodeNo, size: u32, reply: ReplyXattr) {
        reply.answer(waiting_for(request.pid(), || self.fs.xattr_names(caller(request), inode.0, size)));
    }

    fn removexattr(&self, request: &Request, inode: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply.answer(waiting_for(request.pid(), || self.fs.remove_xattr(inode.0, name)));
    }

    fn access(&self, request: &Request, inode: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        reply.answer(waiting_for(request.pid(), || self.fs.check_access(inode.0, mask.bits() as u32)));
    }

    // (fuser's own answer, ENOSYS, logged a warning for every file Python opened.)
    #[allow(clippy::too_many_arguments)]
    fn ioctl(&self, _: &Request, _: INodeNo, _: FileHandle, _: IoctlFlags, _: u32, _: &[u8], _: u32, reply: ReplyIoctl) {
        if let Err(errno) = self.fs.control() {
            reply.error(fuse_errno(errno));
        }
    }
}
