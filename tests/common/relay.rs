//! `Relays`: fault-injecting TCP proxies on 127.0.0.1, one per server, through which every
//! connection to that server passes — from clients and from the other servers alike.
//!
//! A server is started with `--advertise <its relay> --no-unix-socket`
//! ([`Relays::server_arguments`]): the address the cluster knows it by is its relay's, and no
//! peer on this host takes the Unix-socket shortcut. The relay finds the process behind it by
//! that argument (`/proc/*/cmdline`) and its listening port in `/proc/PID/net/tcp`, and
//! finds it again after a restart. It learns who is calling from the first frame of each
//! connection (the handshake names the caller's process), so a fault on a server applies to
//! every link with that server at one end: the connections to it and those it opens.
//!
//! | fault       | open connections                                     | new connections                    |
//! |-------------|------------------------------------------------------|------------------------------------|
//! | `Delay`     | every chunk of bytes waits a random 0..=max ms       | the same                           |
//! | `Pause`     | nothing is forwarded until it ends; nothing is lost  | held, then forwarded when it ends  |
//! | `Partition` | cut (both sides closed) when it begins               | silent, then closed when it ends   |
//!
//! Each direction of a connection is one thread that reads a chunk, waits, and writes it, so
//! bytes keep their order. TCP hides lost, duplicated and reordered packets from the stream; a
//! relay that reordered or repeated bytes would show a fault TCP never shows. Duplicated or
//! reordered *messages* (a request delivered twice, or overtaking an earlier one) are out of
//! scope too: they come from senders that retry or spread requests over several connections,
//! not from the network, and a byte relay could only make them by parsing and re-sending
//! frames. Across connections, order is up to timing, as on a real network.
//!
//! Faults are time windows on one clock. A schedule — (time, server, fault, duration) — comes
//! from a seed ([`ScheduledFault::random_schedule`]), so the same seed replays the same
//! faults; how threads interleave with them is not replayed.

use std::collections::{HashMap, HashSet};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringfs_proto::{FrameHeader, HEADER_LEN, Request};

use super::Random;

/// What a relay does to the links of one server while a fault lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Every chunk of bytes waits a random 0..=`max_ms` milliseconds before it is forwarded.
    Delay { max_ms: u64 },
    /// Nothing is forwarded, and nothing closed, until the fault ends.
    Pause,
    /// Open connections are cut; new ones stay silent and are closed when the fault ends.
    Partition,
}

/// One entry of a fault schedule.
#[derive(Clone, Copy, Debug)]
pub struct ScheduledFault {
    /// When the fault begins, after the schedule starts.
    pub at: Duration,
    pub server: usize,
    pub fault: Fault,
    pub duration: Duration,
}

impl ScheduledFault {
    /// `count` faults on random servers, each beginning and ending within `span`: delays of up
    /// to `max_delay_ms`, pauses and partitions, each lasting 0.2 s to a third of `span`.
    pub fn random_schedule(random: &mut Random, servers: usize, span: Duration, count: usize, max_delay_ms: u64) -> Vec<ScheduledFault> {
        let span_ms = span.as_millis() as u64;
        let mut schedule: Vec<ScheduledFault> = (0..count)
            .map(|_| {
                let duration_ms = 200 + random.below(span_ms / 3 - 200);
                let at_ms = random.below(span_ms - duration_ms);
                let fault = match random.below(3) {
                    0 => Fault::Delay { max_ms: 1 + random.below(max_delay_ms) },
                    1 => Fault::Pause,
                    _ => Fault::Partition,
                };
                let server = random.below(servers as u64) as usize;
                ScheduledFault { at: Duration::from_millis(at_ms), server, fault, duration: Duration::from_millis(duration_ms) }
            })
            .collect();
        schedule.sort_by_key(|entry| entry.at);
        schedule
    }
}

/// A fault in force from `start` until `end`.
#[derive(Clone, Copy, Debug)]
struct Window {
    server: usize,
    fault: Fault,
    start: Instant,
    end: Instant,
}

/// One proxied connection: which server's relay it came in through, which server (if any)
/// opened it, and when.
#[derive(Clone, Copy)]
struct Link {
    relay: usize,
    caller: Option<usize>,
    opened: Instant,
}

/// The server process behind a relay, as last found.
#[derive(Clone, Copy, Debug)]
struct ServerProcess {
    pid: u32,
    address: SocketAddr,
}

/// How often blocked relay threads look at the faults and at `stopping`.
const TICK: Duration = Duration::from_millis(10);
/// How long a relay waits for the first frame of a new connection (to learn the caller).
const FIRST_FRAME_WAIT: Duration = Duration::from_secs(1);
/// A first frame larger than this is not a handshake: forward it without looking.
const MAX_FIRST_FRAME: usize = 64 * 1024;

struct Shared {
    /// The relays' listening addresses, by server index.
    addresses: Vec<SocketAddr>,
    windows: Mutex<Vec<Window>>,
    /// By server index: the process behind the relay, once found.
    servers: Mutex<Vec<Option<ServerProcess>>>,
    /// Random delays; seeded, though which chunk gets which delay depends on timing.
    random: Mutex<Random>,
    /// Bytes forwarded to each server, and from it.
    forwarded: Vec<AtomicU64>,
    /// Both sockets of every open connection, to close them when the relays stop.
    open: Mutex<HashMap<u64, [TcpStream; 2]>>,
    next_link: AtomicU64,
    stopping: AtomicBool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn is_transient(error: &std::io::Error) -> bool {
    matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted)
}

/// Relays for the servers of one test cluster. Dropping them closes every connection.
pub struct Relays {
    shared: Arc<Shared>,
    acceptors: Vec<JoinHandle<()>>,
}

impl Relays {
    /// Starts `count` relays on free ports of 127.0.0.1; `seed` drives the random delays.
    pub fn start(count: usize, seed: u64) -> Relays {
        let listeners: Vec<TcpListener> = (0..count).map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a relay")).collect();
        let shared = Arc::new(Shared {
            addresses: listeners.iter().map(|listener| listener.local_addr().expect("relay address")).collect(),
            windows: Mutex::new(Vec::new()),
            servers: Mutex::new(vec![None; count]),
            random: Mutex::new(Random::new(seed ^ 0x5e1a_7e1a)),
            forwarded: (0..count).map(|_| AtomicU64::new(0)).collect(),
            open: Mutex::new(HashMap::new()),
            next_link: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
        });
        let acceptors = listeners
            .into_iter()
            .enumerate()
            .map(|(relay, listener)| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("relay-{relay}"))
                    .spawn(move || accept_loop(&shared, relay, &listener))
                    .expect("start a relay thread")
            })
            .collect();
        Relays { shared, acceptors }
    }

    /// The address server `server` advertises: its relay's.
    pub fn address(&self, server: usize) -> String {
        self.shared.addresses[server].to_string()
    }

    /// Arguments that put server `server` behind its relay.
    pub fn server_arguments(&self, server: usize) -> Vec<String> {
        vec!["--advertise".into(), self.address(server), "--no-unix-socket".into()]
    }

    /// Puts `fault` on every link of `server` from now on, for `duration`.
    pub fn inject(&self, server: usize, fault: Fault, duration: Duration) {
        let start = Instant::now();
        lock(&self.shared.windows).push(Window { server, fault, start, end: start + duration });
    }

    /// Registers every fault of `schedule`, its times counted from `origin`.
    pub fn play(&self, schedule: &[ScheduledFault], origin: Instant) {
        let mut windows = lock(&self.shared.windows);
        for entry in schedule {
            let start = origin + entry.at;
            windows.push(Window { server: entry.server, fault: entry.fault, start, end: start + entry.duration });
        }
    }

    /// Ends every fault now (and drops those not begun yet).
    pub fn heal(&self) {
        let now = Instant::now();
        let mut windows = lock(&self.shared.windows);
        windows.retain(|window| window.start <= now);
        for window in windows.iter_mut() {
            window.end = window.end.min(now);
        }
    }

    /// Bytes the relay of `server` has forwarded, both ways.
    pub fn forwarded_bytes(&self, server: usize) -> u64 {
        self.shared.forwarded[server].load(Ordering::Relaxed)
    }
}

impl Drop for Relays {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        for address in &self.shared.addresses {
            // Wakes the acceptor, which then sees `stopping`.
            let _ = TcpStream::connect_timeout(address, Duration::from_secs(1));
        }
        for acceptor in self.acceptors.drain(..) {
            let _ = acceptor.join();
        }
        for sockets in lock(&self.shared.open).values() {
            for socket in sockets {
                let _ = socket.shutdown(Shutdown::Both);
            }
        }
    }
}

fn accept_loop(shared: &Arc<Shared>, relay: usize, listener: &TcpListener) {
    for incoming in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(incoming) = incoming else {
            // Out of file descriptors, say: try again shortly rather than spin.
            std::thread::sleep(TICK);
            continue;
        };
        let shared = shared.clone();
        let spawned = std::thread::Builder::new().name(format!("relay-{relay}-link")).spawn(move || serve(&shared, relay, incoming));
        if spawned.is_err() {
            eprintln!("relay {relay}: cannot start a connection thread; dropping the connection");
        }
    }
}

/// Proxies one connection until either side closes it or a fault cuts it.
fn serve(shared: &Arc<Shared>, relay: usize, incoming: TcpStream) {
    let opened = Instant::now();
    if configure(&incoming).is_err() {
        return;
    }
    let first_frame = read_first_frame(shared, &incoming);
    let caller = handshake_pid(&first_frame).and_then(|pid| shared.server_of_pid(pid));
    let link = Link { relay, caller, opened };
    match connect_through(shared, &link, &first_frame) {
        Some(outgoing) => proxy(shared, link, incoming, outgoing),
        None => {
            let _ = incoming.shutdown(Shutdown::Both);
        }
    }
}

/// Waits out the faults in force as a connection opens, connects to the server behind the
/// relay and passes the first frame on; `None` if the connection is to be dropped.
fn connect_through(shared: &Shared, link: &Link, first_frame: &[u8]) -> Option<TcpStream> {
    if shared.partition_over(link, Instant::now()).is_some() {
        // Opened during a partition: nobody answers until the partition ends, and then the
        // connection is closed (as a connect that timed out).
        while let Some(end) = shared.partition_over(link, Instant::now()) {
            if !shared.sleep_until(end) {
                break;
            }
        }
        return None;
    }
    std::thread::sleep(shared.wait_to_forward(link)?);
    // No server behind the relay (killed, not restarted yet): the caller sees a closed
    // connection, as it would see a refused one.
    let outgoing = shared.connect_to_server(link.relay)?;
    (configure(&outgoing).is_ok() && shared.send(link, &outgoing, first_frame)).then_some(outgoing)
}

/// Forwards both directions of an established connection until it ends.
fn proxy(shared: &Arc<Shared>, link: Link, incoming: TcpStream, outgoing: TcpStream) {
    let id = shared.next_link.fetch_add(1, Ordering::Relaxed);
    let (Ok(incoming_copy), Ok(outgoing_copy)) = (incoming.try_clone(), outgoing.try_clone()) else { return };
    lock(&shared.open).insert(id, [incoming_copy, outgoing_copy]);
    let backward = {
        let shared = shared.clone();
        let (from, to) = (outgoing.try_clone(), incoming.try_clone());
        std::thread::Builder::new().name(format!("relay-{}-back", link.relay)).spawn(move || {
            if let (Ok(from), Ok(to)) = (from, to) {
                pump(&shared, &link, from, to);
            }
        })
    };
    if backward.is_ok() {
        pump(shared, &link, incoming, outgoing);
    }
    lock(&shared.open).remove(&id);
}

fn configure(socket: &TcpStream) -> std::io::Result<()> {
    socket.set_nodelay(true)?;
    socket.set_read_timeout(Some(TICK))?;
    socket.set_write_timeout(Some(TICK))
}

/// The first frame of a connection — its handshake — or what arrived of it in time.
fn read_first_frame(shared: &Shared, mut socket: &TcpStream) -> Vec<u8> {
    let deadline = Instant::now() + FIRST_FRAME_WAIT;
    let mut bytes = Vec::new();
    let mut wanted = HEADER_LEN;
    let mut buffer = [0u8; 4096];
    while bytes.len() < wanted && Instant::now() < deadline && !shared.stopping.load(Ordering::Relaxed) {
        let limit = (wanted - bytes.len()).min(buffer.len());
        match socket.read(&mut buffer[..limit]) {
            Ok(0) => break,
            Ok(count) => bytes.extend_from_slice(&buffer[..count]),
            Err(error) if is_transient(&error) => continue,
            Err(_) => break,
        }
        if bytes.len() == HEADER_LEN && wanted == HEADER_LEN {
            let header: [u8; HEADER_LEN] = bytes[..].try_into().expect("exactly a header");
            let Ok(header) = FrameHeader::decode(&header) else { break };
            let frame_len = HEADER_LEN + header.body_len as usize + header.data_len as usize;
            if frame_len > MAX_FIRST_FRAME {
                break;
            }
            wanted = frame_len;
        }
    }
    bytes
}

/// The process id a handshake frame announces.
fn handshake_pid(frame: &[u8]) -> Option<u32> {
    let header: [u8; HEADER_LEN] = frame.get(..HEADER_LEN)?.try_into().ok()?;
    let header = FrameHeader::decode(&header).ok()?;
    let body = frame.get(HEADER_LEN..HEADER_LEN + header.body_len as usize)?;
    match Request::decode(body).ok()? {
        Request::Hello(hello) => Some(hello.client_pid),
        _ => None,
    }
}

/// Forwards one direction of a connection, chunk by chunk, in order.
fn pump(shared: &Shared, link: &Link, mut from: TcpStream, to: TcpStream) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        if shared.stopping.load(Ordering::Relaxed) {
            break;
        }
        let count = match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(count) => count,
            Err(error) if is_transient(&error) => {
                if shared.is_cut(link, Instant::now()) {
                    break;
                }
                continue;
            }
            Err(_) => break,
        };
        let Some(delay) = shared.wait_to_forward(link) else { break };
        std::thread::sleep(delay);
        if !shared.send(link, &to, &buffer[..count]) {
            break;
        }
    }
    // Half-closes are not passed on (ringfs does not use them): either side ending ends both.
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

impl Shared {
    fn touches(window: &Window, link: &Link) -> bool {
        window.server == link.relay || Some(window.server) == link.caller
    }

    /// Whether a partition of one of the link's ends began after the link was opened.
    fn is_cut(&self, link: &Link, now: Instant) -> bool {
        lock(&self.windows).iter().any(|window| {
            window.fault == Fault::Partition && Shared::touches(window, link) && link.opened < window.start && window.start <= now
        })
    }

    /// The end of a partition of one of the link's ends in force at `now`, if any.
    fn partition_over(&self, link: &Link, now: Instant) -> Option<Instant> {
        self.end_of(Fault::Partition, link, now)
    }

    fn end_of(&self, fault: Fault, link: &Link, now: Instant) -> Option<Instant> {
        lock(&self.windows)
            .iter()
            .filter(|window| window.fault == fault && Shared::touches(window, link) && window.start <= now && now < window.end)
            .map(|window| window.end)
            .max()
    }

    /// Waits out pauses; then the delay to apply to the next chunk, or `None` if the link
    /// is cut (or the relays stop).
    fn wait_to_forward(&self, link: &Link) -> Option<Duration> {
        loop {
            let now = Instant::now();
            if self.is_cut(link, now) {
                return None;
            }
            match self.end_of(Fault::Pause, link, now) {
                Some(end) => {
                    if !self.sleep_until(end.min(now + TICK)) {
                        return None;
                    }
                }
                None => break,
            }
        }
        let now = Instant::now();
        let max_ms = lock(&self.windows)
            .iter()
            .filter_map(|window| match window.fault {
                Fault::Delay { max_ms } if Shared::touches(window, link) && window.start <= now && now < window.end => Some(max_ms),
                _ => None,
            })
            .max();
        Some(max_ms.map_or(Duration::ZERO, |max_ms| Duration::from_millis(lock(&self.random).below(max_ms + 1))))
    }

    /// Writes all of `bytes` (a timed-out write resumes where it stopped, so nothing is lost
    /// or repeated); false if the socket failed or a fault cut the link.
    fn send(&self, link: &Link, mut socket: &TcpStream, bytes: &[u8]) -> bool {
        let mut sent = 0;
        while sent < bytes.len() {
            match socket.write(&bytes[sent..]) {
                Ok(0) => return false,
                Ok(count) => sent += count,
                Err(error) if is_transient(&error) => {
                    if self.stopping.load(Ordering::Relaxed) || self.is_cut(link, Instant::now()) {
                        return false;
                    }
                }
                Err(_) => return false,
            }
        }
        self.forwarded[link.relay].fetch_add(bytes.len() as u64, Ordering::Relaxed);
        true
    }

    /// Sleeps until `until`, a tick at a time; false if the relays stop meanwhile.
    fn sleep_until(&self, until: Instant) -> bool {
        loop {
            if self.stopping.load(Ordering::Relaxed) {
                return false;
            }
            let now = Instant::now();
            if now >= until {
                return true;
            }
            std::thread::sleep((until - now).min(TICK));
        }
    }

    /// A connection to the server behind relay `relay`: at the address it was last found
    /// at, else wherever it listens now.
    fn connect_to_server(&self, relay: usize) -> Option<TcpStream> {
        let known = lock(&self.servers)[relay].map(|process| process.address);
        let connect = |address: SocketAddr| TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok();
        if let Some(stream) = known.and_then(connect) {
            return Some(stream);
        }
        self.find_server(relay).and_then(|process| connect(process.address))
    }

    /// Looks for the process advertising relay `relay`'s address and records it.
    fn find_server(&self, relay: usize) -> Option<ServerProcess> {
        let address = self.addresses[relay].to_string();
        let found = processes_advertising(&address).into_iter().find_map(|pid| {
            let address = listening_address(pid)?;
            Some(ServerProcess { pid, address })
        });
        lock(&self.servers)[relay] = found;
        found
    }

    /// The server whose process is `pid` (None for this test process and strangers).
    fn server_of_pid(&self, pid: u32) -> Option<usize> {
        if pid == std::process::id() {
            return None;
        }
        let known =
            |servers: &[Option<ServerProcess>]| servers.iter().position(|process| process.is_some_and(|process| process.pid == pid));
        if let Some(server) = known(&lock(&self.servers)) {
            return Some(server);
        }
        for relay in 0..self.addresses.len() {
            self.find_server(relay);
        }
        known(&lock(&self.servers))
    }
}

/// Processes whose command line holds `--advertise ADDRESS`.
fn processes_advertising(address: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let command_line = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let arguments: Vec<&[u8]> = command_line.split(|byte| *byte == 0).collect();
            arguments.windows(2).any(|pair| pair[0] == b"--advertise" && pair[1] == address.as_bytes())
        })
        .collect()
}

/// The IPv4 TCP address process `pid` listens on (a ringfs server listens on one).
fn listening_address(pid: u32) -> Option<SocketAddr> {
    let sockets: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| std::fs::read_link(entry.path()).ok())
        .filter_map(|target| target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(str::to_string))
        .collect();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).ok()?;
    // Columns: sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
    table.lines().skip(1).find_map(|line| {
        let columns: Vec<&str> = line.split_whitespace().collect();
        const LISTEN: &str = "0A";
        if columns.len() < 10 || columns[3] != LISTEN || !sockets.contains(columns[9]) {
            return None;
        }
        let (ip, port) = columns[1].split_once(':')?;
        // The kernel prints the address in host byte order (little-endian here).
        let ip = Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.to_le_bytes());
        Some(SocketAddr::from((ip, u16::from_str_radix(port, 16).ok()?)))
    })
}
