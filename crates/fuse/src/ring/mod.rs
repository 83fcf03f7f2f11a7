//! FUSE over io_uring (`ringfs mount --io-uring`): the kernel hands requests to the mount
//! through io_uring queues, one per CPU, instead of `/dev/fuse` reads and writes. A request
//! from a process on CPU *n* goes to queue *n*; a thread of the mount, pinned to *n*, holds
//! one ring entry there (a header buffer and a payload buffer registered with the kernel),
//! takes the request from it, answers it with the same operation the `/dev/fuse` path calls
//! ([`crate::operations`]) and commits the answer and fetches the next request in one
//! system call. A request and its answer thus cost one `io_uring_enter` instead of a `read`,
//! a `write` and two wake-ups (docs/PERFORMANCE.md, "FUSE over io_uring").
//!
//! The kernel switches to the queues once every CPU's queue has an entry; it still sends
//! `FORGET` and interrupts through `/dev/fuse`, which fuser's threads keep serving. Each
//! thread holds one entry, so a thread busy with a request leaves its CPU's other threads'
//! entries to the next requests, and a queue whose threads have all been busy for 50 ms
//! gets another (`QueueServer::watch`: a request may wait on another request of the same
//! CPU). Needs the `fuse` module's `enable_uring` parameter ([`ENABLE_PARAMETER`]).

pub mod abi;
pub mod dispatch;
pub mod uring;

use parking_lot::Mutex;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zerocopy::{FromBytes, FromZeros, IntoBytes};

use self::abi::{InHeader, OutHeader, RingCommand, RingHeader};
use self::dispatch::Access;
use self::uring::Uring;
use crate::{MAX_TRANSFER, RingfsFilesystem};

/// The switch of the kernel's FUSE over io_uring (Linux 6.14 on; off by default).
pub const ENABLE_PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";

/// Room for the largest request or answer the mount negotiates (`max_write` and
/// `max_pages` of 1 MiB; directory pages and names are smaller).
const PAYLOAD_SIZE: usize = MAX_TRANSFER as usize;

/// A queue whose every thread has been busy with one request this long gets another thread.
const STUCK: Duration = Duration::from_millis(50);
/// How often the queues are looked at.
const MONITOR_PERIOD: Duration = Duration::from_millis(10);
/// The most threads a queue gets.
const MAX_PER_QUEUE: usize = 64;

/// The ring threads of a mount.
pub struct Ring {
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// Requests answered through the queues.
    answered: Arc<AtomicU64>,
    /// The thread that adds threads to stuck queues, and its stop.
    monitor: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
}

impl Ring {
    /// Waits up to `limit` for the threads to end (they do when the kernel ends the
    /// connection at unmount).
    pub fn join(mut self, limit: Duration) {
        if let Some((stop, monitor)) = self.monitor.take() {
            stop.store(true, Ordering::Release);
            let _ = monitor.join();
        }
        let deadline = Instant::now() + limit;
        let threads = std::mem::take(&mut *self.threads.lock());
        for thread in threads {
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if thread.is_finished() {
                let _ = thread.join();
            } else {
                log::warn!("a FUSE ring thread did not end with the mount");
            }
        }
        log::info!("{} requests were answered through io_uring queues", self.answered.load(Ordering::Relaxed));
    }
}

/// The number of queues the kernel keeps: one per possible CPU.
fn queue_count() -> io::Result<usize> {
    let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let last = possible.trim().rsplit([',', '-']).next().and_then(|last| last.parse::<usize>().ok());
    last.map(|last| last + 1).ok_or_else(|| io::Error::other(format!("cannot read the possible CPUs from {possible:?}")))
}

/// Starts `per_queue` ring threads on every queue of the connection `device` (a
/// `/dev/fuse` descriptor whose `INIT` took FUSE over io_uring). Returns once every thread
/// has registered its entry (the kernel then sends requests to the queues) or one failed.
pub fn start(fs: Arc<RingfsFilesystem>, device: OwnedFd, mount_point: &Path, access: Access, per_queue: usize) -> io::Result<Ring> {
    let queues = queue_count()?;
    let mount_point = CString::new(mount_point.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let server = QueueServer {
        mount_point: Arc::new(mount_point),
        fs,
        device: Arc::new(device),
        access,
        answered: Arc::new(AtomicU64::new(0)),
        threads: Arc::default(),
        busy: Arc::new((0..queues).map(|_| Mutex::new(Vec::new())).collect()),
        epoch: Instant::now(),
    };
    let (registered, registrations) = mpsc::channel();
    let mut started = 0;
    for queue in 0..queues {
        for _ in 0..per_queue.max(1) {
            server.spawn(queue as u16, registered.clone())?;
            started += 1;
        }
    }
    drop(registered);
    for _ in 0..started {
        match registrations.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(error),
            Err(_) => return Err(io::Error::other("a FUSE ring thread did not register")),
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (server, stop) = (server.clone(), stop.clone());
        std::thread::Builder::new().name("ringfs-ring-watch".into()).spawn(move || server.watch(&stop))?
    };
    Ok(Ring { threads: server.threads, answered: server.answered, monitor: Some((stop, monitor)) })
}

/// What every ring thread shares.
#[derive(Clone)]
struct QueueServer {
    fs: Arc<RingfsFilesystem>,
    /// Where the mount is (see [`QueueServer::poke`]).
    mount_point: Arc<CString>,
    device: Arc<OwnedFd>,
    access: Access,
    /// Requests answered through the queues.
    answered: Arc<AtomicU64>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// For each queue, when each of its threads took the request it works on (nanoseconds
    /// since `epoch`; 0 while it waits for one).
    busy: Arc<Vec<Mutex<Vec<Arc<AtomicU64>>>>>,
    epoch: Instant,
}

impl QueueServer {
    /// Starts a thread serving `queue`; it reports on `registered` whether its entry is
    /// registered.
    fn spawn(&self, queue: u16, registered: mpsc::Sender<io::Result<()>>) -> io::Result<()> {
        let server = self.clone();
        let since = Arc::new(AtomicU64::new(0));
        self.busy[queue as usize].lock().push(since.clone());
        let thread =
            std::thread::Builder::new().name(format!("ringfs-ring-{queue}")).spawn(move || server.serve(queue, registered, &since))?;
        self.threads.lock().push(thread);
        Ok(())
    }

    fn now(&self) -> u64 {
        (self.epoch.elapsed().as_nanos() as u64).max(1)
    }

    /// Adds a thread to every queue whose threads have all been busy for [`STUCK`], until
    /// `stop`. The kernel hands a CPU's requests to that CPU's queue only, so requests that
    /// wait — for a lock another owner holds (its unlock may come from the same CPU), for a
    /// page a read holds while the kernel drops a file's pages on the mount's word, for a
    /// server past its deadline — would otherwise leave the requests behind them unserved.
    fn watch(&self, stop: &AtomicBool) {
        while !stop.load(Ordering::Acquire) {
            std::thread::sleep(MONITOR_PERIOD);
            let now = self.now();
            for (queue, threads) in self.busy.iter().enumerate() {
                let stuck = {
                    let threads = threads.lock();
                    threads.len() < MAX_PER_QUEUE
                        && threads.iter().all(|since| {
                            let since = since.load(Ordering::Acquire);
                            since != 0 && now.saturating_sub(since) > STUCK.as_nanos() as u64
                        })
                };
                if stuck {
                    let (registered, registration) = mpsc::channel();
                    match self.spawn(queue as u16, registered) {
                        Ok(()) => {
                            log::debug!("FUSE ring queue {queue}: every thread busy for {STUCK:?}, one more started");
                            if matches!(registration.recv_timeout(Duration::from_secs(1)), Ok(Ok(()))) {
                                self.poke(queue);
                            }
                        }
                        Err(error) => log::warn!("cannot start a FUSE ring thread for a busy queue: {error}"),
                    }
                }
            }
        }
    }

    /// Has the kernel hand the requests waiting in `queue` to the entry just registered
    /// there: it gives a new entry none of them until another request comes to the queue
    /// (and then that one), and gives the next waiting one to an entry as it commits an
    /// answer. So a thread pinned to the queue's CPU asks for the mount's `statfs`: its
    /// request goes to the new entry, whose thread answers it and takes the next waiting
    /// request with the commit.
    fn poke(&self, queue: usize) {
        let mount_point = self.mount_point.clone();
        let poker = std::thread::Builder::new().name("ringfs-ring-poke".into()).spawn(move || {
            pin_to(queue);
            // SAFETY: a NUL-terminated path and a `statfs` to fill.
            unsafe {
                let mut buffer: libc::statfs = std::mem::zeroed();
                libc::statfs(mount_point.as_ptr(), &mut buffer);
            }
        });
        if let Err(error) = poker {
            log::warn!("cannot start a thread to wake FUSE ring queue {queue}: {error}");
        }
    }

    fn serve(&self, queue: u16, registered: mpsc::Sender<io::Result<()>>, since: &AtomicU64) {
        pin_to(queue as usize);
        let mut buffers = Buffers { header: Box::new(RingHeader::new_zeroed()), payload: vec![0u8; PAYLOAD_SIZE] };
        let iovecs = [
            libc::iovec { iov_base: (&mut *buffers.header as *mut RingHeader).cast(), iov_len: size_of::<RingHeader>() },
            libc::iovec { iov_base: buffers.payload.as_mut_ptr().cast(), iov_len: buffers.payload.len() },
        ];
        let (mut ring, mut first) = match register(&self.device, queue, &iovecs) {
            Ok(registered_ring) => {
                let _ = registered.send(Ok(()));
                registered_ring
            }
            Err(error) => {
                let _ = registered.send(Err(error));
                return;
            }
        };
        loop {
            let result = match first.take().map_or_else(|| ring.wait(), Ok) {
                Ok(result) => result,
                Err(error) => {
                    log::warn!("FUSE ring queue {queue}: {error}");
                    return;
                }
            };
            if result < 0 {
                // The connection ended (unmount): ENOTCONN, or ECANCELED as the ring goes.
                if result != -libc::ENOTCONN && result != -libc::ECANCELED {
                    log::warn!("FUSE ring queue {queue}: {}", io::Error::from_raw_os_error(-result));
                }
                return;
            }
            since.store(self.now(), Ordering::Release);
            let commit_id = buffers.header.entry.commit_id;
            let (in_header, _) = InHeader::read_from_prefix(&buffers.header.in_out).expect("the header area holds a fuse_in_header");
            let payload_len = (buffers.header.entry.payload_size as usize).min(buffers.payload.len());
            let op_in = buffers.header.op_in;
            let request = dispatch::Request { header: &in_header, op_in: &op_in, payload_len };
            let (error, len) = match dispatch::answer(&self.fs, self.access, &request, &mut buffers.payload) {
                Ok(len) => (0, len),
                Err(errno) => (-errno.code(), 0),
            };
            let out = OutHeader { len: (size_of::<OutHeader>() + len) as u32, error, unique: in_header.unique };
            buffers.header.in_out[..size_of::<OutHeader>()].copy_from_slice(out.as_bytes());
            buffers.header.entry.payload_size = len as u32;
            self.answered.fetch_add(1, Ordering::Relaxed);
            let command = RingCommand { commit_id, queue, ..RingCommand::default() };
            let entry = uring::command_entry(self.device.as_raw_fd(), abi::URING_CMD_COMMIT_AND_FETCH, 0, 0, command.as_bytes());
            if let Err(error) = ring.push(&entry) {
                log::warn!("FUSE ring queue {queue}: {error}");
                return;
            }
            since.store(0, Ordering::Release);
        }
    }
}

/// Pins the calling thread to `cpu` (requests from there come to its queue).
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed CPU set filled with the libc macros, for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            log::debug!("cannot pin a FUSE ring thread to CPU {cpu}: {}", io::Error::last_os_error());
        }
    }
}

/// A ring entry's buffers, at addresses that stay put while the kernel holds them.
struct Buffers {
    header: Box<RingHeader>,
    payload: Vec<u8>,
}

/// A ring of this thread with its entry registered on `queue`, and the first request's
/// completion if it came already (else [`Uring::wait`] awaits it).
fn register(device: &OwnedFd, queue: u16, iovecs: &[libc::iovec; 2]) -> io::Result<(Uring, Option<i32>)> {
    let mut ring = Uring::new(4)?;
    let command = RingCommand { queue, ..RingCommand::default() };
    let entry = uring::command_entry(device.as_raw_fd(), abi::URING_CMD_REGISTER, iovecs.as_ptr() as u64, 2, command.as_bytes());
    ring.push(&entry)?;
    ring.submit()?;
    // A refused registration completes at once; an accepted one when a request comes.
    match ring.completed() {
        Some(result) if result < 0 => Err(io::Error::from_raw_os_error(-result)),
        first => Ok((ring, first)),
    }
}
