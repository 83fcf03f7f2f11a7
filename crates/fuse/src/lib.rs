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

pub mod dev_fuse;
pub mod directories;
pub mod inodes;
pub mod interrupts;
pub mod kernel;
pub mod operations;
pub mod ring;
pub mod watch;

use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{BackgroundSession, Config, FileAttr, FileType, INodeNo, MountOption, SessionACL, TimeOrNow};
use ringfs_client::{Client, Errno, FileKind, LockRange, Stat};
use thiserror::Error;

use crate::directories::OpenDirectories;
use crate::inodes::InodeTable;
use crate::kernel::{KernelCache, KernelDrops};
use crate::watch::Watch;

/// Largest read or write the kernel sends in one request.
pub(crate) const MAX_TRANSFER: u32 = 1 << 20;

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
    /// Take requests from the kernel's io_uring queues (FUSE over io_uring, see [`ring`]):
    /// a request and its answer cost one system call of a thread on the requester's CPU
    /// instead of a read and a write of `/dev/fuse` with two wake-ups. Needs the `fuse`
    /// module's `enable_uring` parameter (root: `echo Y >
    /// /sys/module/fuse/parameters/enable_uring`); without it the mount serves `/dev/fuse`
    /// and says so in its log.
    pub io_uring: bool,
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
            io_uring: false,
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
    lock_owners: Mutex<HashMap<u64, Vec<(u64, u64)>>>,
    /// Tells the kernel to drop what it caches, at once or from a thread of its own (set
    /// once the kernel's `INIT` is answered; see [`kernel`]).
    drops: OnceLock<Arc<KernelDrops>>,
    /// Whether the kernel took FUSE over io_uring at `INIT` (set then, when asked for).
    ring_offered: OnceLock<bool>,
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

impl RingfsFilesystem {
    pub fn new(client: Client, options: MountOptions) -> RingfsFilesystem {
        RingfsFilesystem {
            client,
            inodes: Arc::new(InodeTable::default()),
            watch: Arc::new(Watch::new(options.writeback_cache)),
            options,
            directories: OpenDirectories::default(),
            lock_owners: Mutex::new(HashMap::new()),
            drops: OnceLock::new(),
            ring_offered: OnceLock::new(),
        }
    }
}

/// A mounted file system; unmounts when [`MountedFs::unmount`] is called or it is dropped.
pub struct MountedFs {
    session: Option<BackgroundSession>,
    /// The threads serving the kernel's io_uring queues, if the mount uses them.
    ring: Option<ring::Ring>,
    /// The thread watching for changes elsewhere, and how to stop it.
    watching: Option<(Arc<Watch>, std::thread::JoinHandle<()>)>,
}

impl MountedFs {
    /// True once the session has ended (for example, someone ran `umount`).
    pub fn is_finished(&self) -> bool {
        self.session.as_ref().is_none_or(|session| session.guard.is_finished())
    }

    /// Whether requests come through the kernel's io_uring queues ([`MountOptions::io_uring`]).
    pub fn uses_io_uring(&self) -> bool {
        self.ring.is_some()
    }

    /// Unmounts and waits for the request threads to finish.
    pub fn unmount(mut self) -> Result<(), MountError> {
        self.stop_watching();
        let unmounted = match self.session.take() {
            Some(session) => session.umount_and_join().map_err(MountError::Unmount),
            None => Ok(()),
        };
        self.stop_ring();
        unmounted
    }

    fn stop_watching(&mut self) {
        if let Some((watch, thread)) = self.watching.take() {
            watch.stop();
            let _ = thread.join();
        }
    }

    /// (After the unmount: the kernel ends the queues with the connection.)
    fn stop_ring(&mut self) {
        if let Some(ring) = self.ring.take() {
            ring.join(Duration::from_secs(5));
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
        self.stop_ring();
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
    let filesystem = Arc::new(RingfsFilesystem::new(client.clone(), options.clone()));
    let mount_error = |source| MountError::Mount { path: directory.display().to_string(), source };
    // (`Session::new` mounts and answers the kernel's `INIT`.)
    let session = fuser::Session::new(dev_fuse::DevFuse::new(filesystem.clone()), directory, &config).map_err(mount_error)?;
    let device = std::os::fd::AsFd::as_fd(&session).try_clone_to_owned().map_err(mount_error)?;
    let drops = Arc::new(KernelDrops::new(KernelCache::new(device), filesystem.inodes.clone()));
    let _ = filesystem.drops.set(drops.clone());
    let ring = if filesystem.ring_offered.get() == Some(&true) { start_ring(&filesystem, &session, directory, options) } else { None };
    let session = session.spawn().map_err(mount_error)?;
    let watching = position.map(|position| {
        let pace = watch::Pace { interval: options.watch_interval, budget: options.watch_budget };
        let thread = watch::spawn(filesystem.watch.clone(), client, position, filesystem.inodes.clone(), drops, pace);
        (filesystem.watch.clone(), thread)
    });
    Ok(MountedFs { session: Some(session), ring, watching })
}

/// Starts serving the kernel's io_uring queues of `session` (none if that fails: fuser's
/// threads serve `/dev/fuse` then, as without the option).
fn start_ring(
    filesystem: &Arc<RingfsFilesystem>,
    session: &fuser::Session<dev_fuse::DevFuse>,
    directory: &Path,
    options: &MountOptions,
) -> Option<ring::Ring> {
    use std::os::fd::AsFd;
    // SAFETY: `geteuid` has no preconditions.
    let access = ring::dispatch::Access { owner: unsafe { libc::geteuid() }, anyone: options.allow_other };
    let cpus = std::thread::available_parallelism().map_or(1, |cpus| cpus.get());
    let per_queue = options.threads.div_ceil(cpus).max(1);
    let started =
        session.as_fd().try_clone_to_owned().and_then(|device| ring::start(filesystem.clone(), device, directory, access, per_queue));
    match started {
        Ok(ring) => {
            log::info!("serving FUSE requests through io_uring queues ({per_queue} threads a CPU)");
            Some(ring)
        }
        Err(error) => {
            log::warn!("cannot serve FUSE over io_uring ({error}); serving /dev/fuse");
            None
        }
    }
}
