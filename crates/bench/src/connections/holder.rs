//! A holder process of `ringfs bench connections`: thousands of authenticated connections
//! opened at once with non-blocking sockets (a real client would spend a thread and buffers
//! on each), held idle, and made to send small requests on demand.
//!
//! Driven over standard input like every benchmark worker: `open COUNT SOURCE` (connect
//! COUNT times from the address SOURCE, send each a `Hello`, wait for every answer),
//! `chatter PERIOD_MS` (from now on each connection sends a `Ping` every PERIOD_MS, one at
//! a time), `quiet` (stop, and report the answers), `close`.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringfs_proto::{FrameHeader, HEADER_LEN, Hello, PROTOCOL_VERSION, Request, Response};

use crate::workers::{WorkerResult, number};

/// Longest an `open` waits for its last answer.
const OPEN_DEADLINE: Duration = Duration::from_secs(60);
/// The chatter thread sends a slice of its pings this often.
const CHATTER_TICK: Duration = Duration::from_millis(10);

fn check(result: libc::c_int) -> io::Result<libc::c_int> {
    if result < 0 { Err(io::Error::last_os_error()) } else { Ok(result) }
}

/// A small epoll set (level-triggered).
struct EventSet {
    fd: OwnedFd,
}

impl EventSet {
    fn new() -> io::Result<EventSet> {
        // SAFETY: no memory arguments; the new descriptor is owned here.
        let fd = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by the kernel.
        Ok(EventSet { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    fn control(&self, operation: libc::c_int, fd: RawFd, token: usize, events: libc::c_int) -> io::Result<()> {
        let mut event = libc::epoll_event { events: events as u32, u64: token as u64 };
        // SAFETY: `event` is valid for the call.
        check(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), operation, fd, &mut event) }).map(drop)
    }

    /// Up to `events.len()` ready (token, events) pairs within `timeout`.
    fn wait(&self, events: &mut [libc::epoll_event], timeout: Duration) -> Vec<(usize, u32)> {
        // SAFETY: `events` has room for the count passed.
        let count = unsafe {
            libc::epoll_wait(self.fd.as_raw_fd(), events.as_mut_ptr(), events.len() as libc::c_int, timeout.as_millis() as libc::c_int)
        };
        events[..count.max(0) as usize].iter().map(|event| (event.u64 as usize, event.events)).collect()
    }
}

/// A non-blocking TCP socket from `source` (port chosen by the kernel), connecting to `server`.
fn start_connect(source: Ipv4Addr, server: SocketAddrV4) -> io::Result<OwnedFd> {
    // SAFETY: no memory arguments; the new descriptor is owned here.
    let fd = check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` was just returned by the kernel.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: libc::c_int = 1;
    // SAFETY: the option value is a c_int of the size given.
    unsafe { libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, (&raw const one).cast(), 4) };
    if !source.is_unspecified() {
        let local = socket_address(SocketAddrV4::new(source, 0));
        // SAFETY: `local` is a sockaddr_in of the size given.
        check(unsafe { libc::bind(fd, (&raw const local).cast(), size_of::<libc::sockaddr_in>() as libc::socklen_t) })?;
    }
    let remote = socket_address(server);
    // SAFETY: `remote` is a sockaddr_in of the size given.
    let connected = unsafe { libc::connect(fd, (&raw const remote).cast(), size_of::<libc::sockaddr_in>() as libc::socklen_t) };
    if connected < 0 {
        let error = io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(error);
        }
    }
    Ok(socket)
}

fn socket_address(address: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: address.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*address.ip()).to_be() },
        sin_zero: [0; 8],
    }
}

/// The pending error of a socket whose connect finished.
fn socket_error(fd: RawFd) -> i32 {
    let mut error: libc::c_int = 0;
    let mut length = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `length` bytes into `error`.
    unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, (&raw mut error).cast(), &mut length) };
    error
}

fn send_all(fd: RawFd, bytes: &[u8]) -> bool {
    // SAFETY: reads `bytes.len()` bytes of `bytes`. Small frames fit an empty socket buffer.
    let sent = unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    sent == bytes.len() as isize
}

/// Reads what has arrived on `fd` into `inbox`: false if the peer closed or failed.
fn receive(fd: RawFd, inbox: &mut Vec<u8>) -> bool {
    let mut buffer = [0u8; 4096];
    // SAFETY: recv writes at most buffer.len() bytes into the buffer.
    let count = unsafe { libc::recv(fd, buffer.as_mut_ptr().cast(), buffer.len(), libc::MSG_DONTWAIT) };
    if count > 0 {
        inbox.extend_from_slice(&buffer[..count as usize]);
        return true;
    }
    count < 0 && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock
}

/// Takes the first complete frame's body out of `inbox`, if one is complete.
fn take_frame(inbox: &mut Vec<u8>) -> Option<Result<Response, String>> {
    let header: &[u8; HEADER_LEN] = inbox.get(..HEADER_LEN)?.try_into().ok()?;
    let header = match FrameHeader::decode(header) {
        Ok(header) => header,
        Err(error) => return Some(Err(error.to_string())),
    };
    let body_end = HEADER_LEN + header.body_len as usize;
    let frame_end = body_end + header.data_len as usize;
    if inbox.len() < frame_end {
        return None;
    }
    let response = Response::decode(&inbox[HEADER_LEN..body_end]).map_err(|error| error.to_string());
    inbox.drain(..frame_end);
    Some(response)
}

fn frame(request: &Request, request_id: u64) -> Vec<u8> {
    let mut body = Vec::new();
    request.encode(&mut body);
    let header = FrameHeader { body_len: body.len() as u32, data_len: 0, request_id, epoch: 0 };
    [header.encode().as_slice(), &body].concat()
}

/// Where one connection being opened stands.
enum Opening {
    Connecting,
    AwaitingAnswer(Vec<u8>),
}

/// The connections of one holder process.
pub struct Holder {
    server: SocketAddrV4,
    hello: Vec<u8>,
    held: Vec<OwnedFd>,
    chatter: Option<Chatter>,
}

impl Holder {
    /// A holder for the server at `server` (`host:port`, IPv4), with the job's `secret`.
    pub fn new(server: &str, secret: &[u8], client_id: u64) -> Result<Holder, String> {
        let server: SocketAddrV4 = server.parse().map_err(|_| format!("{server:?} is not an IPv4 host:port"))?;
        let hello = Request::Hello(Hello {
            version: PROTOCOL_VERSION,
            secret: secret.to_vec(),
            client_pid: std::process::id(),
            host_id: 0,
            from_server: false,
            memory_probe: None,
            client_id,
            timeout_ms: 10_000,
            clock_ns: 0,
            credentials: Default::default(),
        });
        Ok(Holder { server, hello: frame(&hello, 1), held: Vec::new(), chatter: None })
    }

    /// Runs one command of the coordinator.
    pub fn command(&mut self, words: &[&str]) -> Result<WorkerResult, String> {
        match words.first().copied() {
            Some("open") => {
                let count = number(words, 1)? as usize;
                let source: Ipv4Addr = words.get(2).and_then(|word| word.parse().ok()).ok_or("open COUNT SOURCE_ADDRESS")?;
                self.open(count, source).map_err(|error| error.to_string())
            }
            Some("chatter") => {
                self.stop_chatter();
                let period = Duration::from_millis(number(words, 1)?.max(1));
                self.chatter = Some(Chatter::start(self.held.iter().map(AsRawFd::as_raw_fd).collect(), period));
                Ok(WorkerResult::default())
            }
            Some("quiet") => Ok(self.stop_chatter()),
            Some("close") => {
                self.stop_chatter();
                let count = self.held.len() as u64;
                self.held.clear();
                Ok(WorkerResult { ops: count, ..WorkerResult::default() })
            }
            _ => Err(format!("unknown command {words:?}")),
        }
    }

    fn stop_chatter(&mut self) -> WorkerResult {
        self.chatter.take().map(Chatter::stop).unwrap_or_default()
    }

    /// Connects `count` times from `source` at once and says `Hello` on each; the result's
    /// `ops` are the connections accepted, `bytes` the ones refused or failed, `elapsed` the
    /// time until the last answer.
    fn open(&mut self, count: usize, source: Ipv4Addr) -> io::Result<WorkerResult> {
        let started = Instant::now();
        let events = EventSet::new()?;
        let mut opening: HashMap<usize, (OwnedFd, Opening)> = HashMap::with_capacity(count);
        let mut failed = 0u64;
        for token in 0..count {
            match start_connect(source, self.server) {
                Ok(socket) => {
                    events.control(libc::EPOLL_CTL_ADD, socket.as_raw_fd(), token, libc::EPOLLOUT | libc::EPOLLIN | libc::EPOLLRDHUP)?;
                    opening.insert(token, (socket, Opening::Connecting));
                }
                Err(_) => failed += 1,
            }
        }
        let mut accepted = 0u64;
        let mut last_answer = started;
        let mut ready = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
        while !opening.is_empty() && started.elapsed() < OPEN_DEADLINE {
            for (token, flags) in events.wait(&mut ready, Duration::from_millis(100)) {
                let Some((socket, stage)) = opening.get_mut(&token) else { continue };
                match self.advance(&events, socket.as_raw_fd(), token, stage, flags) {
                    Some(true) => {
                        accepted += 1;
                        last_answer = Instant::now();
                        let (socket, _) = opening.remove(&token).expect("present");
                        events.control(libc::EPOLL_CTL_DEL, socket.as_raw_fd(), token, 0)?;
                        self.held.push(socket);
                    }
                    Some(false) => {
                        failed += 1;
                        opening.remove(&token);
                    }
                    None => {}
                }
            }
        }
        failed += opening.len() as u64;
        Ok(WorkerResult { elapsed: last_answer - started, ops: accepted, bytes: failed })
    }

    /// Moves one connection on: `Some(true)` accepted, `Some(false)` refused or failed.
    fn advance(&self, events: &EventSet, fd: RawFd, token: usize, stage: &mut Opening, flags: u32) -> Option<bool> {
        match stage {
            Opening::Connecting => {
                if flags & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0 || socket_error(fd) != 0 {
                    return Some(false);
                }
                if flags & libc::EPOLLOUT as u32 == 0 {
                    return None;
                }
                if !send_all(fd, &self.hello) || events.control(libc::EPOLL_CTL_MOD, fd, token, libc::EPOLLIN | libc::EPOLLRDHUP).is_err() {
                    return Some(false);
                }
                *stage = Opening::AwaitingAnswer(Vec::new());
                None
            }
            Opening::AwaitingAnswer(inbox) => {
                if !receive(fd, inbox) {
                    return Some(false);
                }
                match take_frame(inbox)? {
                    Ok(Response::Hello(_)) => Some(true),
                    _ => Some(false),
                }
            }
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.stop_chatter();
    }
}

/// The thread that makes held connections send pings.
struct Chatter {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<WorkerResult>,
}

impl Chatter {
    /// Every connection of `sockets` sends a `Ping` every `period` (spread evenly), one in
    /// flight at a time. The sockets stay owned by the holder, which stops this first.
    fn start(sockets: Vec<RawFd>, period: Duration) -> Chatter {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || chatter(&sockets, period, &stopping).unwrap_or_default());
        Chatter { stop, thread }
    }

    /// Stops; `ops` are the answers received, `elapsed` the time it ran.
    fn stop(self) -> WorkerResult {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap_or_default()
    }
}

fn chatter(sockets: &[RawFd], period: Duration, stop: &AtomicBool) -> io::Result<WorkerResult> {
    let started = Instant::now();
    let events = EventSet::new()?;
    for (token, fd) in sockets.iter().enumerate() {
        events.control(libc::EPOLL_CTL_ADD, *fd, token, libc::EPOLLIN)?;
    }
    let ping = frame(&Request::Ping, 2);
    let mut in_flight = vec![false; sockets.len()];
    let mut inboxes: HashMap<usize, Vec<u8>> = HashMap::new();
    let per_tick = ((sockets.len() as f64) * CHATTER_TICK.as_secs_f64() / period.as_secs_f64()).ceil() as usize;
    let (mut next, mut answers) = (0usize, 0u64);
    let mut ready = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
    let mut next_tick = Instant::now();
    while !stop.load(Ordering::SeqCst) && !sockets.is_empty() {
        if Instant::now() >= next_tick {
            for _ in 0..per_tick.min(sockets.len()) {
                if !in_flight[next] && send_all(sockets[next], &ping) {
                    in_flight[next] = true;
                }
                next = (next + 1) % sockets.len();
            }
            next_tick += CHATTER_TICK;
        }
        let wait = next_tick.saturating_duration_since(Instant::now());
        for (token, _) in events.wait(&mut ready, wait) {
            let inbox = inboxes.entry(token).or_default();
            if !receive(sockets[token], inbox) {
                events.control(libc::EPOLL_CTL_DEL, sockets[token], token, 0)?;
                continue;
            }
            while let Some(answer) = take_frame(inbox) {
                answers += u64::from(answer.is_ok());
                in_flight[token] = false;
            }
            if inbox.is_empty() {
                inboxes.remove(&token);
            }
        }
    }
    Ok(WorkerResult { elapsed: started.elapsed(), ops: answers, bytes: 0 })
}
