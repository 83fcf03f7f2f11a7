//! A simulated network inside one process, for tests that drive servers and clients through
//! faults: endpoints `sim:NAME`, links made of in-memory queues, and a fault plan that delays,
//! reorders, drops and duplicates whole frames, isolates servers and pauses them — decided by
//! a seeded generator, so a failing run names the seed that makes the same decisions.
//!
//! Faults act on whole frames (the unit the layers above send), so the byte stream of a link
//! never desynchronises: a dropped frame is a message lost, a delayed one may overtake or be
//! overtaken by the frames around it (the protocol lets responses come in any order, and a
//! server handles a connection's requests in the order it reads them), a duplicated one
//! arrives twice. A link belongs to the server it was opened to (the name in `sim:NAME`):
//! isolating or pausing that server affects both directions of all its links. Links have no
//! file descriptor and no process id, so the layers above poll them and send bytes inline.
//!
//! Real TCP never duplicates, reorders or silently drops within a connection; ringfs sends
//! each request once and does not retry, so duplication would break it by design (a link
//! count raised twice). Tests turn on duplication only to show that; reordering across frames
//! of one link and loss are stand-ins for a congested or failing network.

use parking_lot::{Condvar, Mutex};
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::io::{self, Read, Write};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{Duration, Instant};

use ringfs_proto::message::mutate::Rng;
use ringfs_proto::{FrameHeader, HEADER_LEN};

use crate::transport::{Link, PeerIdentity, ReadHalf, WriteHalf};

/// What the network does to frames; all off by default.
#[derive(Clone, Copy, Debug, Default)]
pub struct FaultPlan {
    /// Each frame is held back by a random time up to this (so frames reorder).
    pub max_delay: Duration,
    /// Chance, in millionths, that a frame is lost.
    pub drop_per_million: u32,
    /// Chance, in millionths, that a frame arrives twice.
    pub duplicate_per_million: u32,
}

struct NetworkState {
    listeners: HashMap<String, mpsc::Sender<Link>>,
    plan: FaultPlan,
    rng: Rng,
    isolated: HashSet<String>,
    paused: HashSet<String>,
    stats: SimStats,
}

/// What the network did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    pub frames: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub delayed: u64,
    /// Frames handed to a reader.
    pub delivered: u64,
}

/// The process's simulated network (one per process: endpoints are global names).
pub struct SimNetwork {
    state: Mutex<NetworkState>,
    /// Signalled when a server is resumed, so paused readers look again.
    resumed: Condvar,
}

/// The simulated network of this process.
pub fn network() -> &'static SimNetwork {
    static NETWORK: OnceLock<SimNetwork> = OnceLock::new();
    NETWORK.get_or_init(|| SimNetwork {
        state: Mutex::new(NetworkState {
            listeners: HashMap::new(),
            plan: FaultPlan::default(),
            rng: Rng::new(1),
            isolated: HashSet::new(),
            paused: HashSet::new(),
            stats: SimStats::default(),
        }),
        resumed: Condvar::new(),
    })
}

impl SimNetwork {
    /// Sets the fault plan and the seed of the decisions that follow.
    pub fn set_plan(&self, plan: FaultPlan, seed: u64) {
        let mut state = self.state.lock();
        state.plan = plan;
        state.rng = Rng::new(seed);
    }

    /// Cuts `server` off: its frames (both ways) are lost and new links to it time out.
    pub fn isolate(&self, server: &str, isolated: bool) {
        let mut state = self.state.lock();
        if isolated {
            state.isolated.insert(server.to_string());
        } else {
            state.isolated.remove(server);
        }
    }

    /// Stops delivering `server`'s frames (both ways) until resumed, as a stopped process or a
    /// stalled link would: nothing is lost.
    pub fn pause(&self, server: &str, paused: bool) {
        let mut state = self.state.lock();
        if paused {
            state.paused.insert(server.to_string());
        } else {
            state.paused.remove(server);
        }
        drop(state);
        self.resumed.notify_all();
    }

    pub fn stats(&self) -> SimStats {
        self.state.lock().stats
    }

    fn is_paused(&self, server: &str) -> bool {
        self.state.lock().paused.contains(server)
    }

    /// The fate of one frame to or from `server`: how many copies arrive, after what delay.
    fn fate(&self, server: &str) -> (u32, Duration) {
        let mut state = self.state.lock();
        state.stats.frames += 1;
        if state.isolated.contains(server) {
            state.stats.dropped += 1;
            return (0, Duration::ZERO);
        }
        let plan = state.plan;
        let lost = state.rng.below(1_000_000) < u64::from(plan.drop_per_million);
        let doubled = state.rng.below(1_000_000) < u64::from(plan.duplicate_per_million);
        let delay_us = state.rng.below(plan.max_delay.as_micros() as u64 + 1);
        if lost {
            state.stats.dropped += 1;
            return (0, Duration::ZERO);
        }
        if doubled {
            state.stats.duplicated += 1;
        }
        if delay_us > 0 {
            state.stats.delayed += 1;
        }
        (if doubled { 2 } else { 1 }, Duration::from_micros(delay_us))
    }

    pub(crate) fn bind(&self, name: &str) -> io::Result<SimListener> {
        let (sender, receiver) = mpsc::channel();
        let mut state = self.state.lock();
        if state.listeners.contains_key(name) {
            return Err(io::Error::new(io::ErrorKind::AddrInUse, format!("sim:{name} is taken")));
        }
        state.listeners.insert(name.to_string(), sender);
        Ok(SimListener { name: name.to_string(), accepted: Mutex::new(Some(receiver)) })
    }

    pub(crate) fn connect(&self, name: &str, timeout: Duration) -> io::Result<Link> {
        let sender = {
            let state = self.state.lock();
            if state.isolated.contains(name) {
                drop(state);
                std::thread::sleep(timeout.min(Duration::from_millis(200)));
                return Err(io::Error::new(io::ErrorKind::TimedOut, format!("sim:{name} is cut off")));
            }
            state.listeners.get(name).cloned()
        };
        let sender = sender.ok_or_else(|| io::Error::new(io::ErrorKind::ConnectionRefused, format!("nobody listens at sim:{name}")))?;
        let to_server = Arc::new(Pipe::default());
        let to_client = Arc::new(Pipe::default());
        let server_side = Link {
            reader: Box::new(SimReader::new(to_server.clone(), name)),
            writer: Box::new(SimWriter::new(to_client.clone(), to_server.clone(), name)),
            peer: PeerIdentity { pid: None },
        };
        sender.send(server_side).map_err(|_| io::Error::new(io::ErrorKind::ConnectionRefused, format!("sim:{name} closed")))?;
        Ok(Link {
            reader: Box::new(SimReader::new(to_client.clone(), name)),
            writer: Box::new(SimWriter::new(to_server, to_client, name)),
            peer: PeerIdentity { pid: None },
        })
    }

    fn unbind(&self, name: &str) {
        self.state.lock().listeners.remove(name);
    }
}

/// A listening endpoint `sim:NAME`.
pub struct SimListener {
    name: String,
    accepted: Mutex<Option<mpsc::Receiver<Link>>>,
}

impl SimListener {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn accept(&self) -> io::Result<Link> {
        let receiver = self.accepted.lock().take().ok_or_else(|| io::Error::other("listener shut down"))?;
        let link = receiver.recv().map_err(|_| io::Error::other("listener shut down"));
        // Put the receiver back unless the listener was shut down meanwhile.
        let mut slot = self.accepted.lock();
        if slot.is_none() && link.is_ok() {
            *slot = Some(receiver);
        }
        link
    }

    pub(crate) fn shutdown(&self) {
        network().unbind(&self.name);
    }
}

impl Drop for SimListener {
    fn drop(&mut self) {
        network().unbind(&self.name);
    }
}

/// Frames in flight in one direction of a link, with the bytes a reader has begun.
#[derive(Default)]
struct Pipe {
    state: Mutex<PipeState>,
    arrived: Condvar,
}

#[derive(Default)]
struct PipeState {
    /// By delivery time (earliest first), then order of sending.
    in_flight: BinaryHeap<std::cmp::Reverse<(Instant, u64, Vec<u8>)>>,
    sent: u64,
    current: VecDeque<u8>,
    closed: bool,
}

struct SimReader {
    pipe: Arc<Pipe>,
    server: String,
    timeout: Option<Duration>,
}

impl SimReader {
    fn new(pipe: Arc<Pipe>, server: &str) -> SimReader {
        SimReader { pipe, server: server.to_string(), timeout: None }
    }

    fn read_until(&mut self, buffer: &mut [u8], deadline: Option<Instant>) -> io::Result<usize> {
        let mut state = self.pipe.state.lock();
        loop {
            if !state.current.is_empty() {
                let count = buffer.len().min(state.current.len());
                for (slot, byte) in buffer.iter_mut().zip(state.current.drain(..count)) {
                    *slot = byte;
                }
                return Ok(count);
            }
            let now = Instant::now();
            let paused = network().is_paused(&self.server);
            let due = state.in_flight.peek().map(|std::cmp::Reverse((at, _, _))| *at);
            match due {
                Some(at) if at <= now && !paused => {
                    let std::cmp::Reverse((_, _, frame)) = state.in_flight.pop().expect("peeked");
                    state.current.extend(frame);
                    network().state.lock().stats.delivered += 1;
                    continue;
                }
                None if state.closed => return Ok(0),
                _ => {}
            }
            if deadline.is_some_and(|deadline| now >= deadline) {
                return Err(io::Error::new(io::ErrorKind::WouldBlock, "no frame yet"));
            }
            let mut wait = Duration::from_millis(10);
            if let Some(at) = due.filter(|_| !paused) {
                wait = wait.min(at.saturating_duration_since(now));
            }
            if let Some(deadline) = deadline {
                wait = wait.min(deadline.saturating_duration_since(now));
            }
            self.pipe.arrived.wait_for(&mut state, wait.max(Duration::from_micros(50)));
        }
    }
}

impl Read for SimReader {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let deadline = self.timeout.map(|timeout| Instant::now() + timeout);
        self.read_until(buffer, deadline)
    }
}

impl ReadHalf for SimReader {
    fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.timeout = timeout;
        Ok(())
    }

    fn read_available(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        self.read_until(buffer, Some(Instant::now()))
    }
}

struct SimWriter {
    peer: Arc<Pipe>,
    /// Our own receiving pipe, closed with the link.
    own: Arc<Pipe>,
    server: String,
    /// Bytes of a frame not complete yet.
    pending: Vec<u8>,
}

impl SimWriter {
    fn new(peer: Arc<Pipe>, own: Arc<Pipe>, server: &str) -> SimWriter {
        SimWriter { peer, own, server: server.to_string(), pending: Vec::new() }
    }

    /// Sends every complete frame in `pending`, each with the fate the network gives it.
    fn send_complete_frames(&mut self) {
        loop {
            if self.pending.len() < HEADER_LEN {
                return;
            }
            let header_bytes: [u8; HEADER_LEN] = self.pending[..HEADER_LEN].try_into().expect("length checked");
            let frame_len = match FrameHeader::decode(&header_bytes) {
                Ok(header) => HEADER_LEN + header.body_len as usize + header.data_len as usize,
                // Not a frame the protocol allows: pass the bytes on as they are.
                Err(_) => self.pending.len(),
            };
            if self.pending.len() < frame_len {
                return;
            }
            let frame: Vec<u8> = self.pending.drain(..frame_len).collect();
            let (copies, delay) = network().fate(&self.server);
            let mut state = self.peer.state.lock();
            if state.closed {
                return;
            }
            let at = Instant::now() + delay;
            for _ in 0..copies {
                state.sent += 1;
                let order = state.sent;
                state.in_flight.push(std::cmp::Reverse((at, order, frame.clone())));
            }
            drop(state);
            self.peer.arrived.notify_all();
        }
    }
}

impl Write for SimWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if self.peer.state.lock().closed {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "link closed"));
        }
        self.pending.extend_from_slice(bytes);
        self.send_complete_frames();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl WriteHalf for SimWriter {
    fn set_write_timeout(&mut self, _timeout: Option<Duration>) -> io::Result<()> {
        Ok(())
    }

    fn shutdown(&self) {
        for pipe in [&self.peer, &self.own] {
            pipe.state.lock().closed = true;
            pipe.arrived.notify_all();
        }
    }
}

impl Drop for SimWriter {
    fn drop(&mut self) {
        self.shutdown();
    }
}
