//! Writing dirty data back to the backend (cache mode): the flush policies, the I/O monitor
//! behind I/O-aware flushing, the flusher thread, and `sync`.
//!
//! Every server decides alone. With the `io-aware` policy (CHFS/Cache's CACHE-A) a server
//! starts flushing once it has seen no file-system request for the idle interval, and stops
//! as soon as one arrives: between two chunks, or between two pieces of one chunk
//! ([`ringfs_store::backend::FLUSH_PIECE_BYTES`]). Applications that alternate computing and
//! I/O thus get their flushing done while they compute. `immediate` flushes whenever there is
//! work (CACHE-I); `none` only on `sync` and at shutdown.

use parking_lot::{Mutex, MutexGuard};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ringfs_proto::{Errno, Request, Response};
use ringfs_store::{FlushOutcome, FlushPace, QueuedWork, StoreError};

use crate::files::Files;
use crate::node::Node;

/// When a server writes dirty data to the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushPolicy {
    /// After the idle interval without requests; stops when a request arrives.
    IoAware,
    /// Whenever there is dirty data.
    Immediate,
    /// Only on `sync` and at shutdown.
    None,
}

impl fmt::Display for FlushPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FlushPolicy::IoAware => "io-aware",
            FlushPolicy::Immediate => "immediate",
            FlushPolicy::None => "none",
        })
    }
}

impl FromStr for FlushPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<FlushPolicy, String> {
        match text {
            "io-aware" => Ok(FlushPolicy::IoAware),
            "immediate" => Ok(FlushPolicy::Immediate),
            "none" => Ok(FlushPolicy::None),
            other => Err(format!("unknown flush policy {other:?}: expected io-aware, immediate or none")),
        }
    }
}

/// How a cache-mode server flushes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushConfig {
    pub policy: FlushPolicy,
    /// `io-aware`: how long the server must see no request before it flushes. Default 1 s.
    pub idle: Duration,
}

impl Default for FlushConfig {
    fn default() -> Self {
        FlushConfig { policy: FlushPolicy::IoAware, idle: Duration::from_secs(1) }
    }
}

/// A sync answers after about this long with how much is left (and the client asks again).
const SYNC_STEP: Duration = Duration::from_secs(1);
/// How long the flusher waits before retrying after a failed flush.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// Failed attempts at one unit of work after which a sync answers EIO (the work stays queued).
const SYNC_GIVES_UP_AFTER: u32 = 10;
/// Deferrals after which a chunk whose file has no entry is taken for a chunk a failed
/// removal left behind, and dropped from the queue: at least 30 s of retries (a sync retries
/// every 50 ms, the flusher every 200 ms), while a rename installs its entry within
/// milliseconds or fails at the client's deadline.
const ORPHAN_AFTER: u32 = 600;
/// How often an idle flusher looks for work.
const WORK_POLL: Duration = Duration::from_millis(20);

/// Whether a request is application I/O (which stops I/O-aware flushing). Membership,
/// statistics, a mount's questions about changes and the servers' own flushing traffic are
/// not.
pub fn counts_as_io(request: &Request) -> bool {
    !matches!(
        request,
        Request::Hello(_)
            | Request::Ping
            | Request::GetMembers
            | Request::Join(_)
            | Request::PushMembers(_)
            | Request::MemberDigest(_)
            | Request::Stats
            | Request::Changes(_)
            | Request::Shutdown(_)
            | Request::Sync(_)
            | Request::FlushPrepare(_)
    )
}

/// What request handling tells the flusher: requests in progress, when the last one ended,
/// and when one arrived during a flush.
pub struct IoMonitor {
    started: Instant,
    in_flight: AtomicU64,
    arrivals: AtomicU64,
    last_end_us: AtomicU64,
    flushing: AtomicBool,
    /// When the first request arrived during the current flush round (0: none yet).
    interrupted_at_us: AtomicU64,
    longest_stop_us: AtomicU64,
}

impl Default for IoMonitor {
    fn default() -> Self {
        IoMonitor {
            started: Instant::now(),
            in_flight: AtomicU64::new(0),
            arrivals: AtomicU64::new(0),
            last_end_us: AtomicU64::new(0),
            flushing: AtomicBool::new(false),
            interrupted_at_us: AtomicU64::new(0),
            longest_stop_us: AtomicU64::new(0),
        }
    }
}

impl IoMonitor {
    fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64 + 1
    }

    /// An I/O request arrived.
    pub fn begin(&self) {
        self.arrivals.fetch_add(1, Ordering::SeqCst);
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        if self.flushing.load(Ordering::SeqCst) {
            let _ = self.interrupted_at_us.compare_exchange(0, self.now_us(), Ordering::SeqCst, Ordering::SeqCst);
        }
    }

    /// An I/O request was answered.
    pub fn end(&self) {
        self.last_end_us.store(self.now_us(), Ordering::SeqCst);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// How long no I/O request has been in progress (zero while one is).
    fn idle_for(&self) -> Duration {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        Duration::from_micros(self.now_us().saturating_sub(self.last_end_us.load(Ordering::SeqCst)))
    }

    fn arrivals(&self) -> u64 {
        self.arrivals.load(Ordering::SeqCst)
    }

    fn start_round(&self) {
        self.interrupted_at_us.store(0, Ordering::SeqCst);
        self.flushing.store(true, Ordering::SeqCst);
    }

    /// Ends a flush round; if a request stopped it (`stopped_by_request`), records how long
    /// stopping took.
    fn end_round(&self, stopped_by_request: bool) {
        self.flushing.store(false, Ordering::SeqCst);
        let arrived = self.interrupted_at_us.swap(0, Ordering::SeqCst);
        if stopped_by_request && arrived > 0 {
            self.longest_stop_us.fetch_max(self.now_us().saturating_sub(arrived), Ordering::SeqCst);
        }
    }

    pub fn is_flushing(&self) -> bool {
        self.flushing.load(Ordering::SeqCst)
    }

    pub fn longest_stop_us(&self) -> u64 {
        self.longest_stop_us.load(Ordering::SeqCst)
    }
}

/// Cache mode: this server's flushing (its policy, what it sees of application I/O, and the
/// lock that lets one flush step at a time run, the flusher's or a sync's).
pub struct Flusher {
    node: Arc<Node>,
    files: Arc<Files>,
    pub config: FlushConfig,
    pub io_monitor: IoMonitor,
    flush_lock: Mutex<()>,
}

impl Flusher {
    pub fn new(node: Arc<Node>, files: Arc<Files>, config: FlushConfig) -> Flusher {
        Flusher { node, files, config, io_monitor: IoMonitor::default(), flush_lock: Mutex::new(()) }
    }

    fn flush_lock(&self) -> MutexGuard<'_, ()> {
        self.flush_lock.lock()
    }

    /// Waits until the flush step under way here (if any) has ended: steps after it see the
    /// backend holds taken before this call.
    pub fn wait_for_flush_step(&self) {
        drop(self.flush_lock());
    }

    /// Flushes the next unit of work queued at or before `up_to`; `None` if there is none.
    /// Work not done goes back to the queue; the outcome comes with the work's failed
    /// attempts so far.
    fn flush_one(&self, up_to: u64, pace: FlushPace<'_>) -> Option<(Result<FlushOutcome, StoreError>, u32)> {
        let _serialized = self.flush_lock();
        let mut queued: QueuedWork = self.node.store.next_work(up_to)?;
        let prepare = |file: ringfs_proto::FileId| self.files.prepare_at_home(file);
        let outcome = self.node.store.flush(&queued.item, &prepare, pace);
        log::debug!("flush of {:?} (queued at {}): {outcome:?}", queued.item, queued.since);
        match &outcome {
            Ok(FlushOutcome::Flushed { clean: true, .. } | FlushOutcome::Skipped) => return Some((outcome, queued.failures)),
            Ok(FlushOutcome::Interrupted | FlushOutcome::Flushed { clean: false, .. } | FlushOutcome::Held) => {}
            Ok(FlushOutcome::Deferred) => queued.deferrals += 1,
            Err(error) => {
                log::warn!("flushing {:?} failed: {error}", queued.item);
                queued.failures += 1;
            }
        }
        let failures = queued.failures;
        if queued.deferrals >= ORPHAN_AFTER {
            log::warn!(
                "{:?} is dropped from the flush queue: for long its file had no entry, or no backend file (a chunk a failed removal left, or a backend file deleted behind ringfs's back)",
                queued.item
            );
        } else {
            self.node.store.requeue(queued);
        }
        Some((outcome, failures))
    }

    /// One step of a sync: flushes the work queued before the sync began (`ticket` 0: now)
    /// for about a second, then answers how much of it is left.
    pub fn sync(&self, ticket: u64) -> Result<Response, Errno> {
        use ringfs_proto::SyncProgress;
        let up_to = if ticket == 0 { self.node.store.work_sequence() } else { ticket };
        let deadline = Instant::now() + SYNC_STEP;
        while Instant::now() < deadline {
            match self.flush_one(up_to, FlushPace::Complete) {
                None => break,
                Some((Err(error), failures)) if failures >= SYNC_GIVES_UP_AFTER => {
                    log::error!("sync gives up after {failures} failed attempts: {error}");
                    return Err(Errno::EIO);
                }
                Some((Err(_) | Ok(FlushOutcome::Deferred | FlushOutcome::Held), _)) => crate::sched::pause(RETRY_PAUSE / 4),
                Some((Ok(_), _)) => {}
            }
        }
        // Counted under the flush lock: work the flusher thread has taken from the queue is
        // back in it or done.
        let _serialized = self.flush_lock();
        let remaining = self.node.store.work_left(up_to);
        log::debug!("sync of the work queued up to {up_to}: {remaining} left");
        if remaining == 0 {
            // Everything is in the backend: make it durable there before saying so.
            self.node.store.make_backend_durable().map_err(|error| {
                log::error!("sync could not make the backend durable: {error}");
                Errno::EIO
            })?;
        }
        Ok(Response::SyncProgress(SyncProgress { ticket: up_to, remaining }))
    }

    /// Flushes everything queued now (at shutdown), giving up on work that keeps failing.
    pub fn flush_everything(&self) {
        let mut ticket = 0;
        for _ in 0..3600 {
            match self.sync(ticket) {
                Ok(Response::SyncProgress(progress)) if progress.remaining == 0 => return,
                Ok(Response::SyncProgress(ringfs_proto::SyncProgress { ticket: next, remaining })) => {
                    log::info!("flushing before shutdown: {remaining} left");
                    ticket = next;
                }
                other => {
                    log::error!("could not flush everything before shutdown: {other:?}");
                    return;
                }
            }
        }
    }

    /// The flusher thread: applies the flush policy until shutdown.
    pub fn flush_loop(&self) {
        let config = self.config;
        let monitor = &self.io_monitor;
        while !self.node.shutdown.is_requested() {
            if config.policy == FlushPolicy::None || !self.node.store.has_work() {
                self.node.shutdown.wait(WORK_POLL);
                continue;
            }
            if config.policy == FlushPolicy::IoAware {
                let idle = monitor.idle_for();
                if idle < config.idle {
                    self.node.shutdown.wait((config.idle - idle).max(Duration::from_millis(1)));
                    continue;
                }
            }
            // A flush round: until the work is done, or (io-aware) a request arrives.
            let arrivals = monitor.arrivals();
            let undisturbed = || config.policy != FlushPolicy::IoAware || monitor.arrivals() == arrivals;
            let keep_going = || undisturbed() && !self.node.shutdown.is_requested();
            monitor.start_round();
            // A failed or deferred flush ends the round and waits before the next.
            let mut pause = false;
            while keep_going() {
                match self.flush_one(u64::MAX, FlushPace::Yielding(&keep_going)) {
                    None => break,
                    Some((Err(_) | Ok(FlushOutcome::Deferred | FlushOutcome::Held), _)) => {
                        pause = true;
                        break;
                    }
                    Some((Ok(_), _)) => {}
                }
            }
            // Only the io-aware flusher stops for requests; the others carry on.
            monitor.end_round(config.policy == FlushPolicy::IoAware);
            if pause {
                self.node.shutdown.wait(RETRY_PAUSE);
            }
        }
    }
}
