//! The UCX worker of a process, shared by its threads one at a time, and the inboxes that hand
//! what it received to the connection it is for.
//!
//! UCX workers are cheapest used from one thread, while ringfs threads share connections (a
//! client) or serve any connection (a server's event loop). A process has one worker, for its
//! client connections and its servers alike (see [`super`] for why not one each), inside an
//! [`Engine`]'s lock together with every UCX object made from it — endpoints, listeners,
//! operations, received messages — none of which ever leaves the lock. Whoever needs the
//! worker takes the lock, progresses it, and *routes* what arrived: each message goes, as
//! plain bytes, to the [`Inbox`] of its connection, which makes the connection's event
//! descriptor readable. Nobody waits for a message meant for someone else, and nobody misses
//! one: a thread that sleeps arms the worker first and sleeps on its connection's descriptor
//! together with the worker's (a server's event loop has both in its epoll set).
//!
//! What a message means is the business of the engine's [`Protocol`], the client's or the
//! server's half (`client.rs`, `server.rs`, which build on this module; it knows neither).

use ringfs_sync::{Mutex, MutexGuard};
use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ringfs_ucx::{Context, ContextConfig, Endpoint, HeldPayload, IncomingMessage, Operation, RegistrationCache, Worker};

use super::Settings;
use crate::server::epoll::EventFd;

/// Registrations a process keeps (a client lends few distinct buffers at a time; a server
/// registers its pooled buffers).
const CACHED_REGISTRATIONS: usize = 64;
/// How long an endpoint being closed may take to send what was queued on it.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The process's UCX context, made on first use (again in a forked child: UCX state does not
/// survive `fork`).
pub(crate) fn context() -> Result<Context, ringfs_ucx::Error> {
    static CONTEXT: Mutex<Option<(u32, Context)>> = Mutex::new(None);
    let mut slot = CONTEXT.lock();
    let pid = std::process::id();
    match &*slot {
        Some((owner, context)) if *owner == pid => Ok(context.clone()),
        _ => {
            // UCX reads UCX_TLS, UCX_NET_DEVICES, … from the environment itself.
            let context = Context::new(&ContextConfig::default())?;
            if let Some((_, inherited)) = slot.replace((pid, context.clone())) {
                // Made by the parent: never touch it again in this process.
                std::mem::forget(inherited);
            }
            Ok(context)
        }
    }
}

/// Who needs a connection's event descriptor to be readable while messages wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Watch {
    /// A server's event loop watches it in its epoll set whenever nobody serves the
    /// connection: it is signalled unless the thread serving the connection is taking the
    /// messages itself ([`Inbox::serve`]).
    EventLoop,
    /// Only threads of [`Engine::wait_until`] sleep on it (a client's connection): it is
    /// signalled only while one of them sleeps. The others progress the worker themselves
    /// and see the queue, so most responses cost no `write` and `read` on the descriptor.
    Sleepers,
}

/// Messages for one connection, outside the engine's lock, and the descriptor that is
/// readable while some wait (or the connection ended) and someone may be watching it.
///
/// Invariant (kept under the queue's lock): for [`Watch::EventLoop`], a queue with
/// messages or an end is signalled whenever no thread is serving it; for
/// [`Watch::Sleepers`], whenever a thread sleeps on it.
pub(crate) struct Inbox<T> {
    queue: Mutex<Queue<T>>,
    wakeup: EventFd,
    watch: Watch,
}

pub(crate) struct Queue<T> {
    pub(crate) items: VecDeque<T>,
    /// Why the connection ended, once it did.
    pub(crate) closed: Option<String>,
    /// The descriptor was made readable and not drained since.
    signalled: bool,
    /// Threads sleeping on the descriptor ([`Watch::Sleepers`]).
    sleepers: usize,
    /// The thread serving the connection is taking its messages itself ([`Inbox::serve`]).
    serving: bool,
}

impl<T> Queue<T> {
    fn has_news(&self) -> bool {
        !self.items.is_empty() || self.closed.is_some()
    }
}

impl<T> Inbox<T> {
    pub(crate) fn new(watch: Watch) -> std::io::Result<Arc<Inbox<T>>> {
        let queue = Queue { items: VecDeque::new(), closed: None, signalled: false, sleepers: 0, serving: false };
        Ok(Arc::new(Inbox { queue: Mutex::new(queue), wakeup: EventFd::new()?, watch }))
    }

    fn lock(&self) -> MutexGuard<'_, Queue<T>> {
        self.queue.lock()
    }

    /// Makes the descriptor readable if the queue has news and someone may be watching.
    fn settle(&self, queue: &mut Queue<T>) {
        let watched = match self.watch {
            Watch::EventLoop => !queue.serving,
            Watch::Sleepers => queue.sleepers > 0,
        };
        if watched && !queue.signalled && queue.has_news() {
            queue.signalled = true;
            self.wakeup.signal();
        }
    }

    /// Adds a message and wakes the connection's waiter.
    pub(crate) fn push(&self, item: T) {
        let mut queue = self.lock();
        queue.items.push_back(item);
        self.settle(&mut queue);
    }

    /// Marks the connection ended (once); its waiter wakes and, after the messages left,
    /// sees why.
    pub(crate) fn close(&self, reason: &str) {
        let mut queue = self.lock();
        if queue.closed.is_none() {
            queue.closed = Some(reason.to_string());
            self.settle(&mut queue);
        }
    }

    /// Works on the queue; afterwards the descriptor is quiet if nothing is left to see.
    pub(crate) fn with<R>(&self, work: impl FnOnce(&mut Queue<T>) -> R) -> R {
        let mut queue = self.lock();
        let result = work(&mut queue);
        if queue.signalled && !queue.has_news() {
            queue.signalled = false;
            self.wakeup.drain();
        }
        self.settle(&mut queue);
        result
    }

    /// Runs `take` (which progresses the worker and takes what arrived for this connection)
    /// as the thread serving the connection: messages routed meanwhile do not signal the
    /// descriptor, since this thread takes them; whatever it leaves is signalled after.
    pub(crate) fn serve<R>(&self, take: impl FnOnce() -> R) -> R {
        self.lock().serving = true;
        let result = take();
        let mut queue = self.lock();
        queue.serving = false;
        self.settle(&mut queue);
        result
    }

    /// True if a message or the end waits.
    pub(crate) fn is_ready(&self) -> bool {
        self.lock().has_news()
    }

    /// Counts the caller as sleeping on the descriptor unless news wait; true if they do
    /// (then the caller must not sleep). Called with the engine's lock held, so that a
    /// message routed after this sees the sleeper and signals.
    fn begin_sleep(&self) -> bool {
        let mut queue = self.lock();
        if queue.has_news() {
            return true;
        }
        queue.sleepers += 1;
        false
    }

    fn end_sleep(&self) {
        let mut queue = self.lock();
        queue.sleepers -= 1;
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.wakeup.raw_fd()
    }
}

/// Payloads given back by their readers, for the worker's owner to release to UCX.
type Releases = Arc<Mutex<Vec<HeldPayload>>>;

/// A payload in UCX's receive buffer, read outside the engine's lock; given back to UCX at
/// the worker's next progress once dropped.
pub(crate) struct Held {
    payload: Option<HeldPayload>,
    releases: Releases,
}

impl Held {
    pub(crate) fn bytes(&self) -> &[u8] {
        self.payload.as_ref().map_or(&[], HeldPayload::bytes)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(payload) = self.payload.take() {
            self.releases.lock().push(payload);
        }
    }
}

/// The half of the protocol an engine speaks — the client's (`client.rs`) or the server's
/// (`server.rs`): what it keeps per connection, the transfers it has under way, and what it
/// does with what arrives. The engine moves messages and keeps UCX objects in one place; its
/// protocol gives the messages meaning.
pub(crate) trait Protocol: Sized + 'static {
    /// What the engine keeps for each connection (its inbox among it).
    type Side;
    /// An operation under way that owns buffers, advanced by [`Protocol::advance_transfers`].
    type Transfer;

    /// Handles a message that arrived on connection `key`.
    fn route(state: &mut State<Self>, key: usize, message: IncomingMessage);

    /// Advances the transfers under way; the number of events handled.
    fn advance_transfers(state: &mut State<Self>) -> usize;

    /// Connection `side` has ended: its waiter learns `reason`.
    fn close_side(side: &Self::Side, reason: &str);

    /// The connection a transfer works for (none for one that only holds buffers).
    fn transfer_connection(transfer: &Self::Transfer) -> Option<usize>;
}

/// A connection as the engine sees it.
pub(crate) struct Link<P: Protocol> {
    pub(crate) endpoint: Endpoint,
    pub(crate) side: P::Side,
}

/// An endpoint being closed once what was queued on it has been sent.
struct Closing {
    endpoint: Endpoint,
    flush: Option<Operation<()>>,
    until: Instant,
}

/// Everything made from one worker; only ever touched under the engine's lock.
pub(crate) struct State<P: Protocol> {
    pub(crate) worker: Worker,
    /// The connections, by an id never reused: UCX reuses a closed endpoint's address (its
    /// key) at once, and a connection's owner may still name its ended link.
    pub(crate) links: HashMap<usize, Link<P>>,
    /// The id of the link of each endpoint key (what messages and failures name).
    link_of_endpoint: HashMap<usize, usize>,
    next_link: usize,
    /// The listeners of the process's servers, by an id never reused.
    pub(crate) listeners: HashMap<usize, Listening>,
    next_listener: usize,
    pub(crate) in_flight: Vec<P::Transfer>,
    closing: Vec<Closing>,
    cache: Option<Arc<RegistrationCache>>,
    /// Payloads read outside the lock and given back, to release to UCX.
    releases: Releases,
    /// Buffers of requests' and responses' data, reused so that their registrations are too.
    pub(crate) spare: Vec<Vec<u8>>,
    pub(crate) settings: Settings,
}

/// A listener of the worker and the notice its server's event loop watches.
pub(crate) struct Listening {
    pub(crate) listener: ringfs_ucx::Listener,
    pub(crate) notice: Arc<Notice>,
}

/// What a server's event loop watches besides the worker's descriptor: readable while
/// connection requests wait for its listener or its transfers need progress. Only that event
/// loop drains it — unlike the worker's descriptor, which any thread of the process that
/// sleeps on the worker (a client thread awaiting a reply) drains when it arms the worker,
/// so that a signal there may reach the wrong sleeper.
pub(crate) struct Notice {
    wakeup: EventFd,
    /// The listener holds connection requests that its event loop has not accepted yet
    /// (moved in by whoever progressed the worker).
    waiting: AtomicBool,
}

impl Notice {
    pub(crate) fn new() -> std::io::Result<Arc<Notice>> {
        Ok(Arc::new(Notice { wakeup: EventFd::new()?, waiting: AtomicBool::new(false) }))
    }

    pub(crate) fn signal(&self) {
        self.wakeup.signal();
    }

    /// Quiet until the next signal.
    pub(crate) fn drain(&self) {
        self.wakeup.drain();
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.wakeup.raw_fd()
    }

    /// True while connection requests wait to be accepted.
    pub(crate) fn connections_waiting(&self) -> bool {
        self.waiting.load(Ordering::Relaxed)
    }

    /// The event loop found none left waiting.
    pub(crate) fn none_waiting(&self) {
        self.waiting.store(false, Ordering::SeqCst);
    }
}

// SAFETY: the worker and every UCX object made from it (endpoints, listener, operations,
// messages, remote keys; they share the worker through `Rc`s) live in this struct and never
// leave it, and the struct is only reached through the engine's mutex: one thread at a time
// touches them (the worker is created in UCX's serialized thread mode for this), so moving
// the struct between threads is sound. (The protocol's sides and transfers are reached the
// same way.)
unsafe impl<P: Protocol> Send for State<P> {}

/// Buffers kept for reuse, and the largest kept.
const SPARE_BUFFERS: usize = 16;
const LARGEST_SPARE: usize = 64 << 20;

impl<P: Protocol> State<P> {
    /// The registration cache, made on first use (it hooks the process's memory unmapping).
    pub(crate) fn cache(&mut self) -> Arc<RegistrationCache> {
        let context = self.worker.context().clone();
        self.cache.get_or_insert_with(|| RegistrationCache::new(&context, CACHED_REGISTRATIONS)).clone()
    }

    /// A buffer of exactly `length` bytes (its contents are not meaningful), from the pool
    /// where one is large enough.
    pub(crate) fn buffer(&mut self, length: usize) -> Vec<u8> {
        let mut buffer = self.spare_of(length);
        if buffer.len() < length {
            buffer.resize(length, 0);
        } else {
            buffer.truncate(length);
        }
        buffer
    }

    /// An empty buffer of at least `capacity` bytes, from the pool where one is large enough.
    pub(crate) fn empty_buffer(&mut self, capacity: usize) -> Vec<u8> {
        let mut buffer = self.spare_of(capacity);
        buffer.clear();
        buffer.reserve(capacity);
        buffer
    }

    /// The smallest pooled buffer of at least `capacity` bytes, or a new one.
    fn spare_of(&mut self, capacity: usize) -> Vec<u8> {
        let fitting = self.spare.iter().enumerate().filter(|(_, buffer)| buffer.capacity() >= capacity);
        match fitting.min_by_key(|(_, buffer)| buffer.capacity()).map(|(position, _)| position) {
            Some(position) => self.spare.swap_remove(position),
            None => Vec::with_capacity(capacity),
        }
    }

    /// Keeps a large buffer for reuse (with its contents: refilling it touches no new page).
    pub(crate) fn recycle(&mut self, buffer: Vec<u8>) {
        let capacity = buffer.capacity();
        if self.spare.len() < SPARE_BUFFERS && capacity >= self.settings.rma_threshold && capacity <= LARGEST_SPARE {
            self.spare.push(buffer);
        }
    }

    /// Keeps `payload` in UCX's receive buffer for a reader outside the lock.
    pub(crate) fn hold(&self, payload: HeldPayload) -> Held {
        Held { payload: Some(payload), releases: self.releases.clone() }
    }

    /// Progresses the worker and routes what arrived; the number of events handled.
    pub(crate) fn progress(&mut self) -> usize {
        let released = std::mem::take(&mut *self.releases.lock());
        for payload in released {
            self.worker.release(payload);
        }
        let mut events = self.worker.progress();
        for listening in self.listeners.values() {
            if listening.listener.pending() > 0 && !listening.notice.waiting.swap(true, Ordering::SeqCst) {
                // Only the listener's event loop accepts them.
                listening.notice.signal();
            }
        }
        while let Some(message) = self.worker.next_message() {
            events += 1;
            let Some(&key) = self.link_of_endpoint.get(&message.endpoint_key()) else { continue };
            // (None: from a connection that ended, or a peer that asked for no reply endpoint.)
            if self.links.contains_key(&key) {
                P::route(self, key, message);
            }
        }
        if !self.in_flight.is_empty() {
            events += P::advance_transfers(self);
        }
        for endpoint_key in self.worker.take_failed_endpoints() {
            let Some(&key) = self.link_of_endpoint.get(&endpoint_key) else { continue };
            let Some(failure) = self.links.get(&key).and_then(|link| link.endpoint.failure()) else { continue };
            self.close_link(key, &failure.to_string(), false);
        }
        if !self.closing.is_empty() {
            self.reap_closing();
        }
        events
    }

    /// Adds a listener; its id (the key of [`State::listeners`]).
    pub(crate) fn add_listener(&mut self, listener: ringfs_ucx::Listener, notice: Arc<Notice>) -> usize {
        let id = self.next_listener;
        self.next_listener += 1;
        self.listeners.insert(id, Listening { listener, notice });
        id
    }

    /// Adds a connection; its id (the key of [`State::links`]).
    pub(crate) fn add_link(&mut self, endpoint: Endpoint, side: P::Side) -> usize {
        let key = self.next_link;
        self.next_link += 1;
        self.link_of_endpoint.insert(endpoint.key(), key);
        self.links.insert(key, Link { endpoint, side });
        key
    }

    /// Ends a connection: its waiter learns `reason`; `graceful`: what was queued on it is
    /// sent first (a refusal, the last responses).
    pub(crate) fn close_link(&mut self, key: usize, reason: &str, graceful: bool) {
        let Some(link) = self.links.remove(&key) else { return };
        self.link_of_endpoint.remove(&link.endpoint.key());
        log::debug!("closing the UCX connection with {}: {reason}", link.endpoint.peer());
        P::close_side(&link.side, reason);
        self.in_flight.retain(|transfer| P::transfer_connection(transfer) != Some(key));
        let flush = if graceful && link.endpoint.failure().is_none() { link.endpoint.flush().ok() } else { None };
        match flush {
            Some(flush) => self.closing.push(Closing { endpoint: link.endpoint, flush: Some(flush), until: Instant::now() + CLOSE_GRACE }),
            None => link.endpoint.close(),
        }
    }

    fn reap_closing(&mut self) {
        let now = Instant::now();
        self.closing.retain(|closing| {
            let done = closing.flush.as_ref().is_none_or(|flush| flush.is_complete()) || now >= closing.until;
            if done {
                closing.endpoint.close();
            }
            !done
        });
    }
}

/// Engines (and so UCX workers) alive in this process: see [`super::live_workers`].
static LIVE_ENGINES: AtomicUsize = AtomicUsize::new(0);

/// UCX workers of this process's connections and servers alive now.
pub(crate) fn live_engines() -> usize {
    LIVE_ENGINES.load(Ordering::SeqCst)
}

/// A worker and what is made from it, shared by threads (see the module's documentation).
pub(crate) struct Engine<P: Protocol> {
    state: Mutex<State<P>>,
    /// The worker's event descriptor: readable when it has something to progress.
    worker_fd: RawFd,
}

impl<P: Protocol> Drop for Engine<P> {
    fn drop(&mut self) {
        LIVE_ENGINES.fetch_sub(1, Ordering::SeqCst);
    }
}

impl<P: Protocol> Engine<P> {
    /// An engine with a worker of its own on the process's context.
    pub(crate) fn new(settings: Settings) -> Result<Arc<Engine<P>>, ringfs_ucx::Error> {
        let worker = Worker::new_serialized(&context()?)?;
        let worker_fd = worker.event_fd();
        let state = State {
            worker,
            links: HashMap::new(),
            link_of_endpoint: HashMap::new(),
            next_link: 1,
            listeners: HashMap::new(),
            next_listener: 1,
            in_flight: Vec::new(),
            closing: Vec::new(),
            cache: None,
            releases: Arc::new(Mutex::new(Vec::new())),
            spare: Vec::new(),
            settings,
        };
        LIVE_ENGINES.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(Engine { state: Mutex::new(state), worker_fd }))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State<P>> {
        self.state.lock()
    }

    /// Progresses the worker if no other thread is using it (that thread routes for us).
    pub(crate) fn try_progress(&self) {
        if let Some(mut state) = self.state.try_lock() {
            state.progress();
        }
    }

    pub(crate) fn worker_fd(&self) -> RawFd {
        self.worker_fd
    }

    /// Progresses until `inbox` has news or `deadline` passes: spinning for `spin` after
    /// the last event, then sleeping on the worker's and the inbox's descriptors (the inbox
    /// is filled by whoever progresses). True if the inbox has news.
    pub(crate) fn wait_until<T>(&self, inbox: &Inbox<T>, deadline: Instant, spin: Duration) -> bool {
        let mut last_event = Instant::now();
        loop {
            if inbox.is_ready() {
                return true;
            }
            let armed = {
                let mut state = self.lock();
                if state.progress() > 0 {
                    last_event = Instant::now();
                }
                if inbox.is_ready() {
                    return true;
                }
                let now = Instant::now();
                if now >= deadline {
                    return false;
                }
                // Busy: events are pending, progress again at once.
                let armed = now.duration_since(last_event) >= spin && state.worker.arm().unwrap_or(false);
                // Counted as a sleeper under the engine's lock: whoever routes next signals.
                if armed && inbox.begin_sleep() {
                    return true;
                }
                armed
            };
            if armed {
                sleep_on(&[self.worker_fd, inbox.raw_fd()], deadline.saturating_duration_since(Instant::now()));
                inbox.end_sleep();
                last_event = Instant::now();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// Sleeps until one of `descriptors` is readable or `timeout` passes.
pub(crate) fn sleep_on(descriptors: &[RawFd], timeout: Duration) {
    let mut polled: Vec<libc::pollfd> = descriptors.iter().map(|fd| libc::pollfd { fd: *fd, events: libc::POLLIN, revents: 0 }).collect();
    let timeout_ms = timeout.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: `polled` holds `polled.len()` valid pollfd entries for the call.
    unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, timeout_ms) };
}
