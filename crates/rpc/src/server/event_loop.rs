//! The event loop: a pool of threads that wait on one epoll set and serve whatever becomes
//! ready — new connections on the listeners, handshakes, requests — in place.
//!
//! Leader/followers: idle threads wait in `epoll_wait` (one event each; the kernel wakes one
//! waiter per event, the one that waited last first, so hot threads stay hot and extra
//! ones time out). The thread that receives a connection's event serves it itself, with no
//! hand-off to another thread (on this VM a cross-vCPU wake-up costs more than a small
//! request): it reads a frame, answers it, and keeps polling that connection for the
//! adaptive budget while requests keep coming. When the connection goes quiet with nothing
//! buffered, the thread arms it again and goes back to waiting. Connections are armed
//! one-shot, so one connection is served by at most one thread at a time: its requests are
//! answered in order and its session needs no lock.
//!
//! The pool grows when a thread takes a request and no other thread is left waiting: at
//! once up to a few threads (as many as may poll, and the minimum), beyond that when no
//! thread has come back to wait for a millisecond (`occupancy`). So a handler that blocks
//! (on another server, on a lock) never keeps other connections from being served, while
//! requests that are merely short do not multiply threads on a busy CPU. The pool is capped
//! at [`super::ServerLimits::max_threads`]. Accepting and handshakes never block and never
//! grow it: a storm of new clients is served by the threads there are. Threads above
//! [`MIN_THREADS`] that wait [`IDLE_THREAD_EXIT`] for an event end. Threads therefore follow
//! the number of *busy* connections, never the number of connections.
//!
//! Accepting is backpressured: while [`super::ServerLimits::max_handshakes`] connections
//! are in their handshake, or the process is out of descriptors, the listeners are not
//! armed and new connections wait in the kernel's accept queue.

use ringfs_sync::{Mutex, MutexGuard};
use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::epoll::{Epoll, EventFd, ONE_SHOT, READABLE, TimerFd};
use super::handshake::{HandshakeProgress, PendingHandshake};
use super::occupancy::Occupancy;
use super::registry::{FIRST_SPECIAL_TOKEN, Registry, Token};
use super::requests::{Scratch, Served, ServedConnection};
use super::{CONNECTION_STACK_BYTES, SERVER_TICK, STALL_LIMIT, Service, Shared};
use crate::transport::{Link, Listener};

/// Threads the pool keeps however idle the server is.
pub const MIN_THREADS: usize = 2;
/// A thread above [`MIN_THREADS`] that waited this long for an event ends.
pub const IDLE_THREAD_EXIT: Duration = Duration::from_secs(5);
/// Connections one thread accepts before it lets the listener fire again.
const ACCEPT_BATCH: usize = 64;
/// How often handshake deadlines are checked while handshakes are pending, and how often
/// a paused listener is looked at again.
const HOUSEKEEPING_PERIOD: Duration = Duration::from_millis(50);
/// After accepting failed for want of descriptors or memory, accepting waits this long.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

const WAKE_TOKEN: u64 = u64::MAX;
const TIMER_TOKEN: u64 = u64::MAX - 1;
/// Listener `i` reports `FIRST_LISTENER_TOKEN + i`.
const FIRST_LISTENER_TOKEN: u64 = FIRST_SPECIAL_TOKEN;

/// A registered connection: in its handshake, or served.
enum Peer<Session> {
    Handshake(PendingHandshake),
    Served(ServedConnection<Session>),
}

impl<Session> Peer<Session> {
    fn fd(&self) -> Option<std::os::fd::RawFd> {
        match self {
            Peer::Handshake(handshake) => handshake.link.reader.poll_fd(),
            Peer::Served(served) => served.reader.poll_fd(),
        }
    }
}

/// Timing work: handshake deadlines and paused accepting.
#[derive(Default)]
struct Housekeeping {
    /// Handshakes by deadline (all have the same length, so this is in order).
    deadlines: VecDeque<(Instant, Token)>,
    timer_running: bool,
    /// Accepting is paused; it may resume once this instant has passed (and fewer than
    /// the maximum of connections are in their handshake).
    accept_paused_until: Option<Instant>,
}

/// A server's event loop.
pub struct EventLoop<S: Service> {
    shared: Arc<Shared<S>>,
    epoll: Epoll,
    wake: EventFd,
    timer: TimerFd,
    listeners: Vec<Arc<Listener>>,
    registry: Registry<Peer<S::Session>>,
    housekeeping: Mutex<Housekeeping>,
    /// Mirrors `housekeeping.accept_paused_until.is_some()`, read without the lock.
    accept_paused: AtomicBool,
    threads: AtomicUsize,
    /// Threads in `epoll_wait`, and the watch that adds threads when they are stuck.
    occupancy: Occupancy,
    /// A thread was added and has not begun to wait yet.
    spawning: AtomicBool,
}

fn listener_token(index: usize) -> u64 {
    FIRST_LISTENER_TOKEN + index as u64
}

impl<S: Service> EventLoop<S> {
    /// Registers the (pollable) `listeners` and starts the pool's first threads.
    pub fn start(shared: Arc<Shared<S>>, listeners: Vec<Arc<Listener>>) -> io::Result<Arc<EventLoop<S>>> {
        let event_loop = Arc::new(EventLoop {
            shared,
            epoll: Epoll::new()?,
            wake: EventFd::new()?,
            timer: TimerFd::new()?,
            listeners,
            registry: Registry::new(),
            housekeeping: Mutex::new(Housekeeping::default()),
            accept_paused: AtomicBool::new(false),
            threads: AtomicUsize::new(0),
            occupancy: Occupancy::default(),
            spawning: AtomicBool::new(false),
        });
        // The wake-up descriptor is level-triggered and never drained: once signalled, every
        // thread sees it.
        event_loop.epoll.add(event_loop.wake.raw_fd(), WAKE_TOKEN, READABLE)?;
        event_loop.epoll.add(event_loop.timer.raw_fd(), TIMER_TOKEN, READABLE | ONE_SHOT)?;
        for (index, listener) in event_loop.listeners.iter().enumerate() {
            let fd = listener.poll_fd().ok_or_else(|| io::Error::other("an event loop needs pollable listeners"))?;
            listener.set_nonblocking()?;
            event_loop.epoll.add(fd, listener_token(index), READABLE | ONE_SHOT)?;
        }
        for _ in 0..MIN_THREADS {
            event_loop.threads.fetch_add(1, Ordering::SeqCst);
            event_loop.spawn_thread()?;
        }
        let weak = Arc::downgrade(&event_loop);
        event_loop.shared.carriers.set_watch_again(Box::new(move || {
            if let Some(event_loop) = weak.upgrade() {
                event_loop.watch_carriers();
            }
        }));
        let watched = event_loop.clone();
        let threads = &event_loop.shared.threads;
        threads.spawn("ringfs-rpc-watch", None, move || watched.occupancy.watch(|| watched.grow()))?;
        if event_loop.listeners.iter().any(|listener| listener.carries_connections()) {
            let watched = event_loop.clone();
            threads.spawn("ringfs-rpc-carrier", None, move || watched.shared.carriers.watchdog())?;
        }
        Ok(event_loop)
    }

    /// Threads in the pool now.
    pub fn threads(&self) -> usize {
        self.threads.load(Ordering::Relaxed)
    }

    /// Stops serving: threads end, idle connections are closed now, busy ones when their
    /// thread is done with them.
    pub fn stop(&self) {
        self.occupancy.stop();
        self.shared.carriers.stop();
        self.wake.signal();
        for peer in self.registry.drain_idle() {
            self.end_peer(*peer);
        }
    }

    /// Starts one more thread; the caller has counted it.
    fn spawn_thread(self: &Arc<Self>) -> io::Result<()> {
        let event_loop = self.clone();
        let spawned = self.shared.threads.spawn("ringfs-rpc", Some(CONNECTION_STACK_BYTES), move || event_loop.run_thread());
        if let Err(error) = &spawned {
            self.threads.fetch_sub(1, Ordering::SeqCst);
            self.shared.refusals.over_limit.log(log::Level::Error, format_args!("cannot start a server thread: {error}"));
        }
        spawned
    }

    /// Adds a thread unless the pool is at its cap or a thread just added has not begun to
    /// wait yet (it will be the waiter; without this, under a backlog of short requests
    /// every new thread would take an event at once, find nobody waiting, and add another).
    fn grow(self: &Arc<Self>) {
        if self.spawning.swap(true, Ordering::SeqCst) {
            return;
        }
        let grown = self
            .threads
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |threads| (threads < self.shared.limits.max_threads).then_some(threads + 1));
        if grown.is_err() || self.spawn_thread().is_err() {
            self.spawning.store(false, Ordering::SeqCst);
        }
    }

    /// Uncounts an idle thread, if the pool has more than its minimum; true if it should end.
    fn retire(&self) -> bool {
        self.threads.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |threads| (threads > MIN_THREADS).then_some(threads - 1)).is_ok()
    }

    fn run_thread(self: Arc<Self>) {
        let mut scratch = Scratch::new(self.shared.poll);
        while !self.shared.is_stopping() {
            self.occupancy.begin_wait();
            self.spawning.store(false, Ordering::SeqCst);
            let event = self.epoll.wait_one(IDLE_THREAD_EXIT);
            let others_waiting = self.occupancy.end_wait();
            match event {
                Ok(Some((WAKE_TOKEN, _))) => {}
                Ok(Some((token, _))) => self.dispatch(token, others_waiting, &mut scratch),
                Ok(None) if self.retire() => return,
                Ok(None) => {}
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    self.shared.refusals.over_limit.log(log::Level::Error, format_args!("epoll_wait failed: {error}"));
                    thread::sleep(Duration::from_millis(10));
                }
            }
        }
        self.threads.fetch_sub(1, Ordering::SeqCst);
        // Pass the stop on, in case the kernel woke only this thread.
        self.wake.signal();
    }

    /// Handles one event; `others_waiting` threads were left waiting when it was taken.
    fn dispatch(self: &Arc<Self>, raw: u64, others_waiting: usize, scratch: &mut Scratch) {
        if raw == TIMER_TOKEN {
            self.housekeep();
        } else if raw >= FIRST_LISTENER_TOKEN {
            self.accept_from((raw - FIRST_LISTENER_TOKEN) as usize);
        } else if let Some(token) = Token::from_event(raw)
            && let Some(peer) = self.registry.take(token)
        {
            // A request's handler may block: someone must be left to wait for other events.
            // (Accepting and handshakes never wait, and do not grow the pool.)
            if others_waiting == 0 && matches!(*peer, Peer::Served(_)) && !self.shared.is_stopping() {
                if self.threads() < MIN_THREADS + self.shared.max_pollers {
                    self.grow();
                }
                self.occupancy.saturated();
            }
            self.serve(token, peer, scratch);
        }
    }

    /// Serves a connection whose event this thread received.
    fn serve(&self, token: Token, mut peer: Box<Peer<S::Session>>, scratch: &mut Scratch) {
        if let Peer::Served(connection) = &mut *peer {
            match self.shared.answer_requests(connection, scratch, false) {
                Served::Quiet => self.park(token, peer, Arming::Again),
                Served::Ended => self.close(token, *peer),
            }
            return;
        }
        let Peer::Handshake(mut handshake) = *peer else { unreachable!("served connections returned above") };
        match handshake.advance_until_deadline() {
            HandshakeProgress::Waiting => self.park(token, Box::new(Peer::Handshake(handshake)), Arming::Again),
            HandshakeProgress::Refused(reason) => {
                self.log_refusal(reason);
                self.close(token, Peer::Handshake(handshake));
            }
            HandshakeProgress::Complete => match self.complete_handshake(handshake) {
                Some(connection) => self.park(token, Box::new(Peer::Served(connection)), Arming::Again),
                None => self.registry.release(token),
            },
        }
    }

    /// Answers a complete `Hello`: the connection to serve, or `None` (refused and closed).
    fn complete_handshake(&self, mut handshake: PendingHandshake) -> Option<ServedConnection<S::Session>> {
        self.handshake_ended();
        let session = self.shared.answer_hello(&mut handshake);
        match session {
            Some(session) => Some(ServedConnection::new(handshake.link, session, self.shared.poll)),
            None => {
                self.forget_link(&handshake.link);
                None
            }
        }
    }

    fn log_refusal(&self, reason: Option<String>) {
        if let Some(reason) = reason {
            self.shared.refusals.handshake.log(log::Level::Warn, format_args!("closing a connection in its handshake: {reason}"));
        }
    }

    /// Parks a connection and arms it; closes it if the server stops or arming fails.
    fn park(&self, token: Token, peer: Box<Peer<S::Session>>, arming: Arming) {
        let Some(fd) = peer.fd() else { unreachable!("only pollable links are registered") };
        let arm = |_: &Peer<S::Session>| {
            if self.shared.is_stopping() {
                return Err(io::Error::other("the server is stopping"));
            }
            match arming {
                Arming::First => self.epoll.add(fd, token.raw(), READABLE | ONE_SHOT),
                Arming::Again => self.epoll.rearm(fd, token.raw(), READABLE | ONE_SHOT),
            }
        };
        if let Err((peer, error)) = self.registry.park(token, peer, arm) {
            if !self.shared.is_stopping() {
                log::warn!("closing a connection that cannot be watched: {error}");
            }
            self.close(token, *peer);
        }
    }

    /// Closes a connection taken as `token`.
    fn close(&self, token: Token, peer: Peer<S::Session>) {
        self.end_peer(peer);
        self.registry.release(token);
    }

    /// Closes a connection that is no longer registered.
    fn end_peer(&self, peer: Peer<S::Session>) {
        match peer {
            Peer::Handshake(handshake) => {
                self.handshake_ended();
                handshake.link.writer.shutdown();
                self.forget_link(&handshake.link);
            }
            Peer::Served(connection) => {
                if let Some(fd) = connection.reader.poll_fd() {
                    self.epoll.remove(fd);
                }
                self.shared.end_connection(connection);
            }
        }
    }

    /// Stops watching a link about to be dropped.
    fn forget_link(&self, link: &Link) {
        if let Some(fd) = link.reader.poll_fd() {
            self.epoll.remove(fd);
        }
    }

    /// Accepts what waits on listener `index`, a batch at a time, unless accepting must
    /// pause; arms the listener again afterwards.
    fn accept_from(self: &Arc<Self>, index: usize) {
        let Some(listener) = self.listeners.get(index) else { return };
        if listener.carries_connections() {
            self.shared.carriers.count_wakeup();
        }
        for _ in 0..ACCEPT_BATCH {
            if self.shared.is_stopping() {
                return;
            }
            if self.shared.handshakes() >= self.shared.limits.max_handshakes {
                self.pause_accepting(Instant::now());
                self.keep_serving(index);
                return;
            }
            match listener.accept() {
                Ok(link) => self.admit(link),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if is_out_of_resources(&error) => {
                    self.shared.refusals.over_limit.log(log::Level::Warn, format_args!("accepting paused: {error}"));
                    self.pause_accepting(Instant::now() + ACCEPT_PAUSE);
                    self.keep_serving(index);
                    return;
                }
                // The peer gave up before it was accepted, or a signal came: next one.
                Err(error) if matches!(error.kind(), io::ErrorKind::ConnectionAborted | io::ErrorKind::Interrupted) => {}
                Err(error) => {
                    self.shared.refusals.over_limit.log(log::Level::Warn, format_args!("accept failed: {error}"));
                    break;
                }
            }
        }
        if listener.carries_connections() && self.shared.carriers.leave_watch_to_servers() {
            return;
        }
        self.arm_listener(index);
    }

    /// Watches again the listeners that carry their connections' traffic (the last thread
    /// serving one of their connections stopped, or nobody polled them for a tick; see
    /// `carrier`).
    fn watch_carriers(&self) {
        for (index, listener) in self.listeners.iter().enumerate() {
            if listener.carries_connections() {
                self.arm_listener(index);
            }
        }
    }

    /// While accepting pauses, a listener whose descriptor also brings the traffic of
    /// established connections (UCX's worker) is served and watched all the same.
    fn keep_serving(&self, index: usize) {
        let listener = &self.listeners[index];
        if listener.carries_connections() {
            listener.serve_connections();
            self.arm_listener(index);
        }
    }

    fn arm_listener(&self, index: usize) {
        if let Some(fd) = self.listeners[index].poll_fd()
            && let Err(error) = self.epoll.rearm(fd, listener_token(index), READABLE | ONE_SHOT)
        {
            log::error!("cannot watch a listener again: {error}");
        }
    }

    /// Takes in a new connection: its handshake is tried at once (the `Hello` often came
    /// with the connection), and it is registered to wait for the rest.
    fn admit(self: &Arc<Self>, link: Link) {
        if link.reader.poll_fd().is_none() {
            super::unpollable::serve_link(self.shared.clone(), link);
            return;
        }
        let mut link = link;
        if let Err(error) = link.reader.set_read_timeout(Some(SERVER_TICK)).and_then(|()| link.writer.set_write_timeout(Some(STALL_LIMIT)))
        {
            log::warn!("cannot set up a connection: {error}");
            return;
        }
        self.shared.count_handshake();
        let mut handshake = PendingHandshake::new(link, Instant::now() + self.shared.limits.handshake_deadline);
        match handshake.advance() {
            HandshakeProgress::Waiting => {
                let deadline = handshake.deadline;
                let token = self.registry.reserve();
                self.park(token, Box::new(Peer::Handshake(handshake)), Arming::First);
                self.watch_deadline(deadline, token);
            }
            HandshakeProgress::Refused(reason) => {
                self.log_refusal(reason);
                self.end_peer(Peer::Handshake(handshake));
            }
            HandshakeProgress::Complete => {
                if let Some(connection) = self.complete_handshake(handshake) {
                    let token = self.registry.reserve();
                    self.park(token, Box::new(Peer::Served(connection)), Arming::First);
                }
            }
        }
    }

    fn housekeeping(&self) -> MutexGuard<'_, Housekeeping> {
        self.housekeeping.lock()
    }

    /// Starts the housekeeping timer if it is not running.
    fn run_timer(&self, housekeeping: &mut Housekeeping) {
        if !housekeeping.timer_running {
            housekeeping.timer_running = true;
            self.timer.set_period(Some(HOUSEKEEPING_PERIOD));
        }
    }

    fn watch_deadline(&self, deadline: Instant, token: Token) {
        let mut housekeeping = self.housekeeping();
        housekeeping.deadlines.push_back((deadline, token));
        self.run_timer(&mut housekeeping);
    }

    /// Stops arming the listeners until `until` has passed and the handshakes are below
    /// their maximum (the listener that found this is left unarmed by its caller).
    fn pause_accepting(&self, until: Instant) {
        let mut housekeeping = self.housekeeping();
        let until = housekeeping.accept_paused_until.map_or(until, |paused| paused.max(until));
        housekeeping.accept_paused_until = Some(until);
        self.accept_paused.store(true, Ordering::SeqCst);
        self.run_timer(&mut housekeeping);
    }

    /// Arms the listeners again if accepting was paused and may resume.
    fn resume_accepting(&self) {
        if !self.accept_paused.load(Ordering::SeqCst) || self.shared.handshakes() >= self.shared.limits.max_handshakes {
            return;
        }
        {
            let mut housekeeping = self.housekeeping();
            match housekeeping.accept_paused_until {
                Some(until) if until <= Instant::now() => housekeeping.accept_paused_until = None,
                _ => return,
            }
            self.accept_paused.store(false, Ordering::SeqCst);
        }
        for index in 0..self.listeners.len() {
            self.arm_listener(index);
            self.listeners[index].wake();
        }
    }

    fn handshake_ended(&self) {
        self.shared.uncount_handshake();
        self.resume_accepting();
    }

    /// On every tick of the timer: closes handshakes past their deadline, resumes accepting,
    /// and stops the timer when nothing needs it.
    fn housekeep(&self) {
        self.timer.drain();
        let now = Instant::now();
        let expired: Vec<Token> = {
            let mut housekeeping = self.housekeeping();
            let due = housekeeping.deadlines.iter().take_while(|(deadline, _)| *deadline <= now).count();
            housekeeping.deadlines.drain(..due).map(|(_, token)| token).collect()
        };
        for token in expired {
            // A busy one is being advanced by its thread, which checks the deadline itself.
            if let Some(peer) = self.registry.take_if(token, |peer| matches!(peer, Peer::Handshake(_))) {
                let received = match &*peer {
                    Peer::Handshake(handshake) => handshake.received(),
                    Peer::Served(_) => 0,
                };
                self.log_refusal(Some(format!("handshake not complete before its deadline ({received} bytes of its first frame came)")));
                self.close(token, *peer);
            }
        }
        self.resume_accepting();
        {
            let mut housekeeping = self.housekeeping();
            if housekeeping.deadlines.is_empty() && housekeeping.accept_paused_until.is_none() {
                housekeeping.timer_running = false;
                self.timer.set_period(None);
            }
        }
        if let Err(error) = self.epoll.rearm(self.timer.raw_fd(), TIMER_TOKEN, READABLE | ONE_SHOT) {
            log::error!("cannot watch the server's timer again: {error}");
        }
    }
}

/// How [`EventLoop::park`] arms a connection.
#[derive(Clone, Copy)]
enum Arming {
    /// Not in the epoll set yet.
    First,
    /// In the set, disarmed by its last event.
    Again,
}

/// Accepting failed for want of descriptors or kernel memory: pause rather than spin.
fn is_out_of_resources(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}
