//! The server side: accept connections and answer their requests.
//!
//! Each authenticated connection gets its own thread, which reads a request, calls the
//! [`Service`], and writes the response, in a loop. Blocking I/O on a dedicated thread answers
//! a small request in about a fifth of the CPU time of an event loop on this class of machine
//! (docs/PERFORMANCE.md), and keeps handlers simple: a handler may block on a call to another
//! server without stalling other connections. Requests of one connection are answered in the
//! order they arrive; clients must not rely on that (the protocol allows any order).
//!
//! **Before authentication a peer costs a small fixed amount.** Accepted connections first go
//! to one *handshake thread*, which watches all of them with `poll` and reads each one's first
//! frame into a buffer of at most [`MAX_HELLO_FRAME`] bytes. A connection whose first frame
//! announces more, is not complete by [`ServerLimits::handshake_deadline`], or arrives while
//! [`ServerLimits::max_handshakes`] others are pending, is closed. Only a complete `Hello`
//! frame gets a thread, which asks [`Service::hello`] to accept or refuse it (wrong secret or
//! version). At most [`ServerLimits::max_connections`] connections are served at once.
//! Refusals are logged at most once per [`REFUSAL_LOG_INTERVAL`] per kind.
//!
//! A frame that breaks the size limits or does not decode closes that connection only.

use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use ringfs_proto::{Errno, FrameHeader, HEADER_LEN, Hello, HelloReply, Request, Response};

use crate::frame_io::{FrameReadError, FrameReader, PollBudget, write_frame};
use crate::log_limit::RateLimitedLog;
use crate::transport::{Link, Listener, PeerIdentity, WriteHalf};

/// How often an idle connection thread wakes to notice a shutdown.
const SERVER_TICK: Duration = Duration::from_millis(500);
/// A frame that has started must complete within this time.
const STALL_LIMIT: Duration = Duration::from_secs(30);
const CONNECTION_STACK_BYTES: usize = 512 * 1024;
/// Largest first frame (header and body, no data) a connection may send: a `Hello` with a
/// secret of a few hundred bytes fits many times over.
pub const MAX_HELLO_FRAME: usize = 4096;
/// Refused connections of one kind are logged at most this often.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// How far a connection thread's poll budget may grow above the configured one while a
/// client's requests keep arriving just after it gave up (see `frame_io`): 50 µs → 200 µs.
const MAX_POLL_GROWTH: u32 = 4;

/// How often the handshake thread checks links that cannot be polled (test transports).
const UNPOLLABLE_CHECK: Duration = Duration::from_millis(5);

/// What one peer, or many, can cost a server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections served at once (after their handshake); more are refused. Default 4096.
    pub max_connections: usize,
    /// Connections in their handshake at once; more are closed at once. Default 1024 (at most
    /// [`MAX_HELLO_FRAME`] bytes of buffer each, and no thread).
    pub max_handshakes: usize,
    /// A connection must have sent its whole `Hello` within this time of being accepted.
    /// Default 5 s.
    pub handshake_deadline: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits { max_connections: 4096, max_handshakes: 1024, handshake_deadline: Duration::from_secs(5) }
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

/// State shared by the accept, handshake and connection threads of one server.
struct Shared<S> {
    service: Arc<S>,
    stopping: AtomicBool,
    limits: ServerLimits,
    poll: Duration,
    connections: AtomicUsize,
    refusals: RefusalLogs,
}

/// A running server: listener threads, the handshake thread and one thread per connection.
pub struct RpcServer {
    listeners: Vec<Arc<Listener>>,
    stopping: Box<dyn Fn() + Send + Sync>,
}

impl RpcServer {
    /// Starts accepting on every listener with the default [`ServerLimits`]. Connection
    /// threads poll for `poll` before they sleep waiting for the next request (see `frame_io`).
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
            refusals: RefusalLogs {
                handshake: RateLimitedLog::new(REFUSAL_LOG_INTERVAL),
                over_limit: RateLimitedLog::new(REFUSAL_LOG_INTERVAL),
            },
        });
        let (handshakes, accepted) = mpsc::channel::<Link>();
        let (wake_reader, wake_writer) = std::os::unix::net::UnixStream::pair()?;
        wake_reader.set_nonblocking(true)?;
        wake_writer.set_nonblocking(true)?;
        let wake_writer = Arc::new(wake_writer);
        let listeners: Vec<Arc<Listener>> = listeners.into_iter().map(Arc::new).collect();
        {
            let shared = shared.clone();
            thread::Builder::new().name("ringfs-handshake".into()).spawn(move || handshake_loop(&shared, &accepted, &wake_reader))?;
        }
        for listener in &listeners {
            let listener = listener.clone();
            let shared = shared.clone();
            let handshakes = handshakes.clone();
            let wake_writer = wake_writer.clone();
            thread::Builder::new()
                .name("ringfs-accept".into())
                .spawn(move || accept_loop(&listener, &shared, &handshakes, &wake_writer))?;
        }
        let stopping = {
            let shared = shared.clone();
            Box::new(move || {
                shared.stopping.store(true, Ordering::SeqCst);
                let _ = io::Write::write(&mut &*wake_writer, &[1]);
            })
        };
        Ok(RpcServer { listeners, stopping })
    }

    /// Stops accepting connections and asks connection threads to finish.
    pub fn shutdown(&self) {
        (self.stopping)();
        for listener in &self.listeners {
            listener.shutdown();
        }
    }
}

fn accept_loop<S: Service>(
    listener: &Listener,
    shared: &Shared<S>,
    handshakes: &mpsc::Sender<Link>,
    wake: &std::os::unix::net::UnixStream,
) {
    while !shared.stopping.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok(link) => {
                if handshakes.send(link).is_err() {
                    break;
                }
                let _ = io::Write::write(&mut &*wake, &[1]);
            }
            Err(_) if shared.stopping.load(Ordering::SeqCst) => break,
            Err(error) => {
                // Out of file descriptors, for example: do not spin.
                shared.refusals.over_limit.log(log::Level::Warn, format_args!("accept failed: {error}"));
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// A connection whose first frame is still arriving.
struct PendingHandshake {
    link: Link,
    /// The bytes of the first frame so far (never more than [`MAX_HELLO_FRAME`]).
    frame: Vec<u8>,
    /// Header and body length, once the header is in.
    frame_len: Option<usize>,
    deadline: Instant,
}

enum HandshakeProgress {
    Waiting,
    Complete,
    /// The peer broke a rule or closed; why (for the log), if worth logging.
    Refused(Option<String>),
}

impl PendingHandshake {
    /// Reads what has arrived, never past the end of the first frame.
    fn advance(&mut self) -> HandshakeProgress {
        loop {
            let wanted = self.frame_len.unwrap_or(HEADER_LEN);
            if self.frame.len() == wanted {
                if self.frame_len.is_some() {
                    return HandshakeProgress::Complete;
                }
                let mut header = [0u8; HEADER_LEN];
                header.copy_from_slice(&self.frame);
                match FrameHeader::decode(&header) {
                    Ok(header) if header.data_len == 0 && HEADER_LEN + header.body_len as usize <= MAX_HELLO_FRAME => {
                        self.frame_len = Some(HEADER_LEN + header.body_len as usize);
                        continue;
                    }
                    Ok(header) => {
                        return HandshakeProgress::Refused(Some(format!(
                            "first frame announces {} body and {} data bytes",
                            header.body_len, header.data_len
                        )));
                    }
                    Err(error) => return HandshakeProgress::Refused(Some(format!("invalid first frame: {error}"))),
                }
            }
            let start = self.frame.len();
            self.frame.resize(wanted, 0);
            match self.link.reader.read_available(&mut self.frame[start..]) {
                Ok(0) => {
                    self.frame.truncate(start);
                    return HandshakeProgress::Refused(None);
                }
                Ok(count) => self.frame.truncate(start + count),
                Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
                    self.frame.truncate(start);
                    return HandshakeProgress::Waiting;
                }
                Err(error) => {
                    self.frame.truncate(start);
                    return HandshakeProgress::Refused(Some(error.to_string()));
                }
            }
        }
    }
}

/// Watches every connection in its handshake; starts a connection thread for each complete
/// `Hello` frame.
fn handshake_loop<S: Service>(shared: &Arc<Shared<S>>, accepted: &mpsc::Receiver<Link>, wake: &std::os::unix::net::UnixStream) {
    let mut pending: Vec<PendingHandshake> = Vec::new();
    while !shared.stopping.load(Ordering::SeqCst) {
        wait_for_handshake_input(&pending, wake);
        let mut drain = [0u8; 64];
        while matches!(io::Read::read(&mut &*wake, &mut drain), Ok(count) if count > 0) {}
        while let Ok(link) = accepted.try_recv() {
            if pending.len() >= shared.limits.max_handshakes {
                shared
                    .refusals
                    .over_limit
                    .log(log::Level::Warn, format_args!("closing a new connection: {} connections are in their handshake", pending.len()));
                link.writer.shutdown();
                continue;
            }
            let deadline = Instant::now() + shared.limits.handshake_deadline;
            pending.push(PendingHandshake { link, frame: Vec::with_capacity(HEADER_LEN), frame_len: None, deadline });
        }
        let now = Instant::now();
        let mut index = 0;
        while index < pending.len() {
            let progress = match pending[index].advance() {
                HandshakeProgress::Waiting if now >= pending[index].deadline => {
                    HandshakeProgress::Refused(Some("handshake not complete before its deadline".into()))
                }
                progress => progress,
            };
            match progress {
                HandshakeProgress::Waiting => index += 1,
                HandshakeProgress::Refused(reason) => {
                    let handshake = pending.swap_remove(index);
                    if let Some(reason) = reason {
                        shared.refusals.handshake.log(log::Level::Warn, format_args!("closing a connection in its handshake: {reason}"));
                    }
                    handshake.link.writer.shutdown();
                }
                HandshakeProgress::Complete => {
                    let handshake = pending.swap_remove(index);
                    start_connection(shared, handshake);
                }
            }
        }
    }
    for handshake in pending {
        handshake.link.writer.shutdown();
    }
}

/// Blocks until a pending connection or the wake-up socket has input, the nearest deadline
/// passes, or a short interval (links without a file descriptor are checked by reading).
fn wait_for_handshake_input(pending: &[PendingHandshake], wake: &std::os::unix::net::UnixStream) {
    use std::os::fd::AsRawFd;
    let mut fds = vec![libc::pollfd { fd: wake.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
    let mut unpollable = false;
    for handshake in pending {
        match handshake.link.reader.poll_fd() {
            Some(fd) => fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 }),
            None => unpollable = true,
        }
    }
    let now = Instant::now();
    let mut timeout = pending.iter().map(|handshake| handshake.deadline.saturating_duration_since(now)).min().unwrap_or(SERVER_TICK);
    if unpollable {
        timeout = timeout.min(UNPOLLABLE_CHECK);
    }
    let timeout_ms = timeout.as_millis().clamp(1, SERVER_TICK.as_millis()) as libc::c_int;
    // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures for the whole call.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
}

/// Counts a served connection for as long as it lives.
struct ConnectionSlot<'a>(&'a AtomicUsize);

impl Drop for ConnectionSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn start_connection<S: Service>(shared: &Arc<Shared<S>>, handshake: PendingHandshake) {
    if shared.connections.fetch_add(1, Ordering::SeqCst) >= shared.limits.max_connections {
        shared.connections.fetch_sub(1, Ordering::SeqCst);
        shared
            .refusals
            .over_limit
            .log(log::Level::Warn, format_args!("refusing a connection: {} connections are served already", shared.limits.max_connections));
        handshake.link.writer.shutdown();
        return;
    }
    let thread_shared = shared.clone();
    let spawned = thread::Builder::new().name("ringfs-conn".into()).stack_size(CONNECTION_STACK_BYTES).spawn(move || {
        let _slot = ConnectionSlot(&thread_shared.connections);
        serve_connection(&thread_shared, handshake.link, &handshake.frame);
    });
    if let Err(error) = spawned {
        shared.connections.fetch_sub(1, Ordering::SeqCst);
        shared.refusals.over_limit.log(log::Level::Error, format_args!("cannot start a connection thread: {error}"));
    }
}

/// Reads the next frame: header, body, and data section into `data`. `Ok(None)`: the server
/// is stopping.
fn next_frame(
    reader: &mut FrameReader,
    body: &mut Vec<u8>,
    data: &mut Vec<u8>,
    stopping: &AtomicBool,
) -> Result<Option<FrameHeader>, FrameReadError> {
    let header = loop {
        match reader.next_header()? {
            Some(header) => break header,
            None if stopping.load(Ordering::Relaxed) => return Ok(None),
            None => continue,
        }
    };
    body.resize(header.body_len as usize, 0);
    reader.read_exact(body)?;
    // Reused across requests: after the first large write, no new pages are touched.
    data.resize(header.data_len as usize, 0);
    reader.read_exact(data)?;
    Ok(Some(header))
}

fn reply(writer: &mut dyn WriteHalf, request_id: u64, epoch: u64, response: &Response, data: &[u8], body: &mut Vec<u8>) -> io::Result<()> {
    body.clear();
    response.encode(body);
    let header = FrameHeader { body_len: body.len() as u32, data_len: data.len() as u32, request_id, epoch };
    write_frame(writer, &header, body, data)
}

/// Answers the handshake (`hello_frame`: the complete first frame) and then serves requests
/// until the peer leaves or the server stops.
fn serve_connection<S: Service>(shared: &Shared<S>, link: Link, hello_frame: &[u8]) {
    let service = shared.service.as_ref();
    let Link { reader, mut writer, peer } = link;
    if let Err(error) = writer.set_write_timeout(Some(STALL_LIMIT)) {
        log::warn!("cannot set up a connection: {error}");
        return;
    }
    let mut session = S::Session::default();
    let mut out_body = Vec::new();

    let mut header_bytes = [0u8; HEADER_LEN];
    header_bytes.copy_from_slice(&hello_frame[..HEADER_LEN]);
    let request_id = FrameHeader::decode(&header_bytes).map(|header| header.request_id).unwrap_or(0);
    let accepted = match Request::decode(&hello_frame[HEADER_LEN..]) {
        Ok(Request::Hello(hello)) => service.hello(&hello, &peer, &mut session),
        Ok(_) => Err(Errno::EPROTO),
        Err(error) => {
            shared.refusals.handshake.log(log::Level::Warn, format_args!("malformed handshake, closing the connection: {error}"));
            Err(Errno::EPROTO)
        }
    };
    let response = match &accepted {
        Ok(hello_reply) => Response::Hello(hello_reply.clone()),
        Err(errno) => Response::Error(*errno),
    };
    if reply(writer.as_mut(), request_id, service.epoch(), &response, &[], &mut out_body).is_err() || accepted.is_err() {
        writer.shutdown();
        return;
    }

    let poll = PollBudget::adaptive(shared.poll, shared.poll * MAX_POLL_GROWTH);
    let mut reader = match FrameReader::new(reader, SERVER_TICK, STALL_LIMIT, poll) {
        Ok(reader) => reader,
        Err(error) => {
            log::warn!("cannot set up a connection: {error}");
            writer.shutdown();
            return;
        }
    };
    let mut body = Vec::new();
    let mut data = Vec::new();
    let mut reply_data = Vec::new();
    loop {
        let header = match next_frame(&mut reader, &mut body, &mut data, &shared.stopping) {
            Ok(Some(header)) => header,
            Ok(None) | Err(FrameReadError::Closed) => break,
            Err(error) => {
                log::warn!("closing a connection: {error}");
                break;
            }
        };
        let request = match Request::decode(&body) {
            Ok(request) => request,
            Err(error) => {
                log::warn!("malformed request, closing the connection: {error}");
                break;
            }
        };
        reply_data.clear();
        let handled = catch_unwind(AssertUnwindSafe(|| service.handle(&mut session, request, &data, &mut reply_data)));
        let response = handled.unwrap_or_else(|_| {
            log::error!("a request handler panicked; answering EIO");
            reply_data.clear();
            Response::Error(Errno::EIO)
        });
        if header.request_id == 0 {
            continue;
        }
        if let Err(error) = reply(writer.as_mut(), header.request_id, service.epoch(), &response, &reply_data, &mut out_body) {
            log::debug!("cannot answer, closing the connection: {error}");
            break;
        }
        // Keep big buffers from one large request from pinning memory forever.
        if reply_data.capacity() > 64 << 20 {
            reply_data = Vec::new();
        }
    }
    service.closed(&mut session);
    writer.shutdown();
}
