//! The server side: accept connections and answer their requests.
//!
//! **Idle connections cost no thread and no buffer.** A pool of threads waits on one epoll
//! set holding the listeners and every connection (`event_loop`); the thread that receives
//! a connection's event serves it in place — reads a frame, calls the [`Service`], writes
//! the response — and keeps polling that connection briefly while requests keep coming
//! (see `frame_io`), then arms it again and waits for the next event. Read and write buffers
//! belong to the threads; an idle authenticated connection is a small struct (its link, its
//! session, its poll budget). The pool grows when no thread is left waiting, so a handler
//! may block (on another server, on a lock) without stalling other connections, up to
//! [`ServerLimits::max_threads`]; idle threads above a small minimum end. A connection is
//! served by one thread at a time: its requests are answered in the order they arrive
//! (clients must not rely on that: the protocol allows any order).
//!
//! **Before authentication a peer costs a small fixed amount.** A new connection's first
//! frame is read, as it arrives and without waiting, into a buffer of at most
//! [`MAX_HELLO_FRAME`] bytes. A connection whose first frame announces more, or is not
//! complete by [`ServerLimits::handshake_deadline`], is closed. While
//! [`ServerLimits::max_handshakes`] connections are in their handshake the server stops
//! accepting for a moment (the kernel's accept queue holds the rest), so a storm of clients
//! is slowed, not refused. A complete `Hello` is given to [`Service::hello`], which accepts
//! or refuses it (wrong secret or version); at most [`ServerLimits::max_connections`]
//! connections are served at once, and more are refused with EMFILE. Refusals are logged at
//! most once per [`REFUSAL_LOG_INTERVAL`] per kind.
//!
//! Links without a file descriptor (the simulated network of tests) get a thread each
//! instead (`unpollable`). A frame that breaks the size limits or does not decode closes
//! that connection only.
//!
//! A listener that carries its connections' traffic (UCX's worker descriptor) is not watched
//! while a thread polls one of its connections (`carrier`).

mod carrier;
pub(crate) mod epoll;
mod event_loop;
mod handshake;
mod occupancy;
mod registry;
mod requests;
pub(crate) mod threads;
mod unpollable;

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use ringfs_proto::{Errno, Hello, HelloReply, Request, Response};

pub use epoll::{open_file_limit, raise_open_file_limit};

use crate::log_limit::RateLimitedLog;
use crate::transport::{Listener, PeerIdentity};
use carrier::CarrierWatch;
use event_loop::EventLoop;
pub use threads::ThreadGroup;

/// How often a thread waiting in the middle of a frame looks at the stall limit, and how
/// often a connection thread of an unpollable link notices a shutdown.
const SERVER_TICK: Duration = Duration::from_millis(500);
/// A frame that has started must complete within this time.
const STALL_LIMIT: Duration = Duration::from_secs(30);
const CONNECTION_STACK_BYTES: usize = 512 * 1024;
/// Largest first frame (header and body, no data) a connection may send: a `Hello` with a
/// secret of a few hundred bytes fits many times over.
pub const MAX_HELLO_FRAME: usize = 4096;
/// How long dropping an [`RpcServer`] waits for its threads to end.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);
/// Refused connections of one kind are logged at most this often.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// How far a connection's poll budget may grow above the configured one while a client's
/// requests keep arriving just after it gave up (see `frame_io`): 50 µs → 200 µs.
const MAX_POLL_GROWTH: u32 = 4;
/// File descriptors left to the rest of the server (chunk files, connections to other
/// servers, logs) when the connection limit is derived from the open-file limit.
pub const RESERVED_DESCRIPTORS: usize = 1024;

/// What one peer, or many, can cost a server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections served at once (after their handshake); more are refused with EMFILE.
    /// Default: the process's open-file limit less [`RESERVED_DESCRIPTORS`] (18,976 with
    /// `ulimit -n` 20,000), each connection holding one descriptor.
    pub max_connections: usize,
    /// Connections in their handshake at once; while this many are, the server stops
    /// accepting for a moment. Default 1024 (at most [`MAX_HELLO_FRAME`] bytes of buffer
    /// each, and no thread).
    pub max_handshakes: usize,
    /// A connection must have sent its whole `Hello` within this time of being accepted.
    /// Default 5 s.
    pub handshake_deadline: Duration,
    /// Threads serving connections at once (each busy in a request, or polling one
    /// connection); more requests wait in the kernel. Default 4096.
    pub max_threads: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        let descriptors = usize::try_from(open_file_limit()).unwrap_or(usize::MAX);
        ServerLimits {
            max_connections: descriptors.saturating_sub(RESERVED_DESCRIPTORS).max(64),
            max_handshakes: 1024,
            handshake_deadline: Duration::from_secs(5),
            max_threads: 4096,
        }
    }
}

/// What a server does with requests.
pub trait Service: Send + Sync + 'static {
    /// Per-connection state (for example, leases granted to that client).
    type Session: Default + Send;

    /// Checks a connection's `Hello`; an error refuses the connection.
    fn hello(&self, hello: &Hello, peer: &PeerIdentity, session: &mut Self::Session) -> Result<HelloReply, Errno>;

    /// Answers one request. `data` is the request's data section; response data is appended
    /// to `reply_data`.
    fn handle(&self, session: &mut Self::Session, request: Request, data: &[u8], reply_data: &mut Vec<u8>) -> Response;

    /// The membership epoch to put in response headers.
    fn epoch(&self) -> u64;

    /// Called once when a connection ends.
    fn closed(&self, _session: &mut Self::Session) {}
}

/// Log limiters for the kinds of refusals a stranger can cause.
struct RefusalLogs {
    handshake: RateLimitedLog,
    over_limit: RateLimitedLog,
}

/// State shared by every thread of one server.
struct Shared<S> {
    service: Arc<S>,
    stopping: AtomicBool,
    limits: ServerLimits,
    poll: Duration,
    /// Connections served (after their handshake).
    connections: AtomicUsize,
    /// Connections in their handshake.
    handshakes: AtomicUsize,
    /// Threads polling a quiet connection, at most `max_pollers`.
    pollers: AtomicUsize,
    max_pollers: usize,
    /// Threads polling connections whose listener carries their traffic (UCX).
    carriers: CarrierWatch,
    refusals: RefusalLogs,
    /// Every thread serving this server, counted until it has ended.
    threads: Arc<ThreadGroup>,
}

impl<S: Service> Shared<S> {
    fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }

    fn count_handshake(&self) {
        self.handshakes.fetch_add(1, Ordering::SeqCst);
    }

    fn uncount_handshake(&self) {
        self.handshakes.fetch_sub(1, Ordering::SeqCst);
    }

    /// Counts one more served connection; false (and not counted) at the limit.
    fn count_connection(&self) -> bool {
        self.connections
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |count| (count < self.limits.max_connections).then_some(count + 1))
            .is_ok()
    }

    fn uncount_connection(&self) {
        self.connections.fetch_sub(1, Ordering::SeqCst);
    }

    /// The service forgets a session whose connection ends.
    fn end_session(&self, session: &mut S::Session) {
        self.service.closed(session);
        self.uncount_connection();
    }
}

/// How many connections a server holds right now, and with how many threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RpcCounters {
    /// Authenticated connections being served.
    pub connections: usize,
    /// Connections in their handshake.
    pub handshakes: usize,
    /// Threads of the event loop (links without a descriptor have a thread each besides).
    pub threads: usize,
    /// Every thread of the server still running: the event loop's, its watchers', those of
    /// links without a descriptor (0 once a stopped server's threads have all ended).
    pub running_threads: usize,
    /// Times a listener that carries its connections' traffic (UCX) woke a thread: its new
    /// connections, and messages no thread polling a connection took first.
    pub carrier_wakeups: u64,
}

/// What [`RpcServer`] needs from its running parts, whatever the service type.
trait Running: Send + Sync {
    fn stop(&self);
    fn wait_ended(&self, limit: Duration) -> bool;
    fn counters(&self) -> RpcCounters;
}

struct RunningServer<S: Service> {
    shared: Arc<Shared<S>>,
    event_loop: Option<Arc<EventLoop<S>>>,
    listeners: Vec<Arc<Listener>>,
}

impl<S: Service> Running for RunningServer<S> {
    fn stop(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        for listener in &self.listeners {
            listener.shutdown();
        }
        if let Some(event_loop) = &self.event_loop {
            event_loop.stop();
        }
    }

    fn wait_ended(&self, limit: Duration) -> bool {
        self.shared.threads.wait_ended(limit)
    }

    fn counters(&self) -> RpcCounters {
        RpcCounters {
            connections: self.shared.connections.load(Ordering::Relaxed),
            handshakes: self.shared.handshakes.load(Ordering::Relaxed),
            threads: self.event_loop.as_ref().map_or(0, |event_loop| event_loop.threads()),
            running_threads: self.shared.threads.running(),
            carrier_wakeups: self.shared.carriers.wakeups(),
        }
    }
}

/// A running server: its event loop (and a thread per unpollable listener or link). Dropping
/// it stops it and waits (at most [`SHUTDOWN_WAIT`]) until its threads have ended.
pub struct RpcServer {
    running: Box<dyn Running>,
}

impl RpcServer {
    /// Starts accepting on every listener with the default [`ServerLimits`]. Connections are
    /// polled for `poll` before their thread waits for other work (see `frame_io`).
    pub fn start<S: Service>(service: Arc<S>, listeners: Vec<Listener>, poll: Duration) -> io::Result<RpcServer> {
        RpcServer::start_with_limits(service, listeners, poll, ServerLimits::default())
    }

    /// [`RpcServer::start`] with explicit limits.
    pub fn start_with_limits<S: Service>(
        service: Arc<S>,
        listeners: Vec<Listener>,
        poll: Duration,
        limits: ServerLimits,
    ) -> io::Result<RpcServer> {
        let shared = Arc::new(Shared {
            service,
            stopping: AtomicBool::new(false),
            limits,
            poll,
            connections: AtomicUsize::new(0),
            handshakes: AtomicUsize::new(0),
            pollers: AtomicUsize::new(0),
            max_pollers: requests::max_pollers(),
            carriers: CarrierWatch::default(),
            refusals: RefusalLogs {
                handshake: RateLimitedLog::new(REFUSAL_LOG_INTERVAL),
                over_limit: RateLimitedLog::new(REFUSAL_LOG_INTERVAL),
            },
            threads: Arc::new(ThreadGroup::default()),
        });
        let listeners: Vec<Arc<Listener>> = listeners.into_iter().map(Arc::new).collect();
        let (pollable, unpollable): (Vec<_>, Vec<_>) = listeners.iter().cloned().partition(|listener| listener.poll_fd().is_some());
        let event_loop = if pollable.is_empty() { None } else { Some(EventLoop::start(shared.clone(), pollable)?) };
        for listener in unpollable {
            unpollable::serve_listener(shared.clone(), listener)?;
        }
        Ok(RpcServer { running: Box::new(RunningServer { shared, event_loop, listeners }) })
    }

    /// Stops accepting connections, closes the idle ones, and asks threads to finish
    /// (a connection in the middle of a request ends when it is answered).
    pub fn shutdown(&self) {
        self.running.stop();
    }

    /// [`RpcServer::shutdown`], then waits until every thread of the server has ended (a
    /// connection in the middle of a request ends when it is answered), for at most `limit`;
    /// true if they all did. Then nothing of the server runs any more: a process may exit,
    /// or destroy what the server used (a UCX worker), without a thread of it still inside.
    pub fn shutdown_and_wait(&self, limit: Duration) -> bool {
        self.running.stop();
        self.running.wait_ended(limit)
    }

    /// Connections and threads right now.
    pub fn counters(&self) -> RpcCounters {
        self.running.counters()
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        if !self.shutdown_and_wait(SHUTDOWN_WAIT) {
            log::warn!("a server's threads were still running {SHUTDOWN_WAIT:?} after it was stopped");
        }
    }
}

#[cfg(test)]
mod tests;
