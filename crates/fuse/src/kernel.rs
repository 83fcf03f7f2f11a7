//! Telling the kernel to drop what it caches, and knowing whether it held it.
//!
//! The mount writes the notifications to `/dev/fuse` itself ([`KernelCache`]) rather than
//! through fuser's `Notifier`, which answers "done" when the kernel did not hold the inode:
//! here that answer matters. The kernel applies an answer in the requester's own time, after
//! the mount wrote it; an inode that only such an answer still on its way hands the kernel
//! is not there yet to be dropped, and would arrive with what was dropped (see
//! [`crate::inodes`], "Answers the kernel applies late"). Such a drop is tried again, by the
//! thread of [`KernelDrops`], until the kernel holds the inode.
//!
//! [`KernelDrops`] also takes the drops that must wait until the request being answered is
//! (after a change of unknown outcome: until its answer the kernel holds the directory's
//! lock, which a name's drop waits for, and the pages being written, which a file's waits
//! for).

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::inodes::{InodeTable, StaleDrop};

/// `fuse_notify_code` values (Linux `include/uapi/linux/fuse.h`).
const NOTIFY_INVAL_INODE: i32 = 2;
const NOTIFY_INVAL_ENTRY: i32 = 3;

/// `/dev/fuse` of one mount, to write notifications to.
pub struct KernelCache {
    device: OwnedFd,
}

impl KernelCache {
    /// `device`: a descriptor of the mount's connection (a duplicate of the session's).
    pub fn new(device: OwnedFd) -> KernelCache {
        KernelCache { device }
    }

    /// Has the kernel drop the attributes of `inode` (with `pages`, its cached pages too):
    /// `Ok(false)` if the kernel does not hold the inode (never had it, has forgotten it,
    /// or an answer handing it over is still on its way).
    pub fn drop_inode(&self, inode: u64, pages: bool) -> io::Result<bool> {
        // `fuse_notify_inval_inode_out`: the inode, and the range of pages (offset < 0:
        // attributes only; length 0: to the end).
        let mut body = Vec::with_capacity(24);
        body.extend_from_slice(&inode.to_ne_bytes());
        body.extend_from_slice(&(if pages { 0i64 } else { -1i64 }).to_ne_bytes());
        body.extend_from_slice(&0i64.to_ne_bytes());
        self.notify(NOTIFY_INVAL_INODE, &body)
    }

    /// Has the kernel drop the name `name` in directory `directory`: `Ok(false)` if it did
    /// not hold it.
    pub fn drop_name(&self, directory: u64, name: &OsStr) -> io::Result<bool> {
        // `fuse_notify_inval_entry_out`: parent, name length, flags; then the name and a NUL.
        let name = name.as_bytes();
        let length = u32::try_from(name.len()).map_err(|_| io::Error::from_raw_os_error(libc::ENAMETOOLONG))?;
        let mut body = Vec::with_capacity(16 + name.len() + 1);
        body.extend_from_slice(&directory.to_ne_bytes());
        body.extend_from_slice(&length.to_ne_bytes());
        body.extend_from_slice(&0u32.to_ne_bytes());
        body.extend_from_slice(name);
        body.push(0);
        self.notify(NOTIFY_INVAL_ENTRY, &body)
    }

    /// Writes one notification (`fuse_out_header` with unique 0 and the code as its error,
    /// then `body`).
    fn notify(&self, code: i32, body: &[u8]) -> io::Result<bool> {
        let length = 16 + body.len();
        let mut message = Vec::with_capacity(length);
        message.extend_from_slice(&(length as u32).to_ne_bytes());
        message.extend_from_slice(&code.to_ne_bytes());
        message.extend_from_slice(&0u64.to_ne_bytes());
        message.extend_from_slice(body);
        // SAFETY: a write of a buffer this function owns, of its length, to a descriptor it owns.
        let written = unsafe { libc::write(self.device.as_raw_fd(), message.as_ptr().cast(), message.len()) };
        if written >= 0 {
            return Ok(true);
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::ENOENT) { Ok(false) } else { Err(error) }
    }
}

/// What the kernel is told to drop from the drops thread.
pub(crate) enum KernelDrop {
    /// A name in a directory, and the directory's attributes.
    Name(u64, OsString),
    /// A file's attributes and pages.
    File(u64),
    /// The attributes of an inode an answer on its way may hand the kernel stale, marked so
    /// in the inode table with this generation ([`InodeTable::stale_attributes`]): tried
    /// until the kernel holds the inode, while the mark stands.
    StaleAttributes(u64, u64),
}

/// The first wait before a stale inode's drop is tried again, doubled at each try up to
/// [`MOST_RETRY_WAIT`]; after [`RETRY_FOR`] the drops thread gives up (the inode's next
/// open still drops them: [`InodeTable::stale_attributes`] keeps the mark).
const FIRST_RETRY_WAIT: Duration = Duration::from_micros(200);
const MOST_RETRY_WAIT: Duration = Duration::from_millis(50);
const RETRY_FOR: Duration = Duration::from_secs(5);

/// A drop of stale attributes the kernel could not apply yet.
struct Retry {
    inode: u64,
    generation: u64,
    at: Instant,
    wait: Duration,
    until: Instant,
}

/// The mount's drops of kernel caches: made at once ([`KernelDrops::cache`]) or handed to a
/// thread of their own (`ringfs-drops`, started at the first, gone with the mount: it ends
/// when this is dropped).
pub struct KernelDrops {
    cache: Arc<KernelCache>,
    inodes: Arc<InodeTable>,
    thread: OnceLock<Sender<KernelDrop>>,
}

impl KernelDrops {
    pub fn new(cache: KernelCache, inodes: Arc<InodeTable>) -> KernelDrops {
        KernelDrops { cache: Arc::new(cache), inodes, thread: OnceLock::new() }
    }

    /// The notifications, to send at once.
    pub fn cache(&self) -> &KernelCache {
        &self.cache
    }

    /// Drops the attributes of `inode` that the inode table marked stale with `generation`,
    /// now if the kernel holds the inode, else from the drops thread once it does.
    pub fn stale_attributes(&self, inode: u64, generation: u64) {
        match self.inodes.drop_if_stale(inode, generation, || self.cache.drop_inode(inode, false)) {
            Ok(StaleDrop::NotHeld) => self.later(KernelDrop::StaleAttributes(inode, generation)),
            Ok(StaleDrop::Dropped | StaleDrop::NotStale) => {}
            Err(error) => log::debug!("the kernel did not drop the attributes of inode {inode}: {error}"),
        }
    }

    /// Hands `what` to the drops thread.
    pub(crate) fn later(&self, what: KernelDrop) {
        let thread = self.thread.get_or_init(|| {
            let (sender, drops) = mpsc::channel::<KernelDrop>();
            let dropper = Dropper { cache: self.cache.clone(), inodes: self.inodes.clone() };
            let started = std::thread::Builder::new().name("ringfs-drops".into()).spawn(move || dropper.serve(drops));
            if let Err(error) = started {
                log::warn!("no thread to have the kernel drop what it must drop later: {error}");
            }
            sender
        });
        // (Fails only if the thread could not start: the kernel's caches then expire.)
        let _ = thread.send(what);
    }
}

/// What the drops thread works with.
struct Dropper {
    cache: Arc<KernelCache>,
    inodes: Arc<InodeTable>,
}

impl Dropper {
    /// Drops what it is handed, and tries again the stale attributes of inodes the kernel
    /// did not hold yet, until the channel closes.
    fn serve(self, drops: mpsc::Receiver<KernelDrop>) {
        let mut retries: Vec<Retry> = Vec::new();
        loop {
            let next = retries.iter().map(|retry| retry.at).min();
            let received = match next {
                Some(at) => drops.recv_timeout(at.saturating_duration_since(Instant::now())),
                None => drops.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match received {
                Ok(what) => self.drop_now(what, &mut retries),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            let now = Instant::now();
            retries.retain_mut(|retry| retry.at > now || self.try_again(retry, now));
        }
    }

    fn drop_now(&self, what: KernelDrop, retries: &mut Vec<Retry>) {
        // (`false` from the kernel: it held nothing to drop.)
        match what {
            KernelDrop::Name(directory, name) => {
                let _ = self.cache.drop_name(directory, &name);
                let _ = self.cache.drop_inode(directory, true);
            }
            KernelDrop::File(inode) => {
                let _ = self.cache.drop_inode(inode, true);
            }
            KernelDrop::StaleAttributes(inode, generation) => {
                let now = Instant::now();
                let mut retry = Retry { inode, generation, at: now, wait: FIRST_RETRY_WAIT, until: now + RETRY_FOR };
                if self.try_again(&mut retry, now) {
                    retries.push(retry);
                }
            }
        }
    }

    /// Tries a stale inode's drop again: whether to keep trying.
    fn try_again(&self, retry: &mut Retry, now: Instant) -> bool {
        let inode = retry.inode;
        match self.inodes.drop_if_stale(inode, retry.generation, || self.cache.drop_inode(inode, false)) {
            // (Not stale: dropped meanwhile — its open did it —, or forgotten by the kernel.)
            Ok(StaleDrop::Dropped | StaleDrop::NotStale) => false,
            Ok(StaleDrop::NotHeld) if now < retry.until => {
                retry.at = now + retry.wait;
                retry.wait = (retry.wait * 2).min(MOST_RETRY_WAIT);
                true
            }
            Ok(StaleDrop::NotHeld) => {
                log::debug!("inode {inode} never reached the kernel to drop its attributes");
                false
            }
            Err(error) => {
                log::debug!("the kernel did not drop the attributes of inode {inode}: {error}");
                false
            }
        }
    }
}
