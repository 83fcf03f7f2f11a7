//! The client side of a link: many requests in flight, answered in any order.
//!
//! Any number of threads share one [`Connection`]. A caller writes its request frame and then
//! waits for the response with the same request id. Whoever waits first and finds no other
//! thread reading becomes the *reader* (leader/follower): it reads one frame from the socket,
//! hands it to the thread that asked for it, and gives the reader role back. A single-threaded
//! caller therefore costs exactly one `write` and one `read` per request, with no thread
//! switch; measured on this class of machine that is ~5x cheaper than an event-loop client
//! (docs/PERFORMANCE.md).
//!
//! Inline response data can be delivered straight into a buffer the caller lends with the
//! request ([`Connection::start`]); the borrow lasts as long as the [`PendingCall`], so the
//! reader can never write into a buffer its owner has already taken back.
//!
//! Every request has a deadline. A request that gets no answer in time fails with
//! [`RpcError::Timeout`]; a connection whose peer closes or stops in the middle of a frame is
//! *broken*, and all its requests fail at once.
//!
//! Over UCX (`ucx://` endpoints) the same holds; the reader then takes responses from the
//! connection's inbox, where whichever thread progressed the process's UCX worker put them
//! (and their data into the lent buffer), and large data may move by RMA ([`crate::ucx`]). A
//! request that lent memory for RMA and is given up breaks the connection.

use ringfs_sync::{Condvar, Mutex};
use std::cell::RefCell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ringfs_proto::{FrameHeader, Hello, HelloReply, PROTOCOL_VERSION, Request, Response};

use crate::frame_io::{FrameReadError, FrameReader, PollBudget, write_frame};
use crate::memory::{ProcessMemory, memory_probe};
use crate::transport::{self, Endpoint, WriteHalf};
use crate::ucx::{
    self,
    client::{Channel, Received},
};
use crate::{RpcError, abandon};

/// How often a waiting reader wakes up to check deadlines.
const TICK: Duration = Duration::from_millis(50);

/// What a client needs to open connections.
#[derive(Clone, Debug)]
pub struct ConnectionConfig {
    /// The job's secret, checked by the server in the handshake.
    pub secret: Vec<u8>,
    /// Deadline of every request (and of connecting).
    pub timeout: Duration,
    /// Identifies this host (see `Member::host_id`).
    pub host_id: u64,
    /// Set when a server connects to another server.
    pub from_server: bool,
    /// How long to poll for a response before sleeping (see `frame_io`); zero: never.
    pub poll: Duration,
    /// Identifies this client process to servers, which keep its open files alive while it
    /// has connections (0 for servers).
    pub client_id: u64,
    /// Whom this connection's requests act for (servers: root, unused).
    pub credentials: ringfs_proto::Credentials,
}

/// Default poll budget of clients and servers.
pub const DEFAULT_POLL: Duration = Duration::from_micros(50);

/// A response and its data section.
#[derive(Debug)]
pub struct Reply {
    pub response: Response,
    /// Data section, unless it was delivered into the caller's buffer.
    pub data: Vec<u8>,
    /// Length of the data section (also when it went into the caller's buffer).
    pub data_len: usize,
}

/// Raw view of a caller's buffer, valid while its [`PendingCall`] lives.
#[derive(Clone, Copy)]
struct Destination {
    pointer: *mut u8,
    len: usize,
}

// SAFETY: the pointer is only dereferenced by the reader thread while the owning PendingCall
// (which holds the exclusive borrow) waits for it; see `PendingCall::drop`.
unsafe impl Send for Destination {}

enum Slot {
    Waiting(Option<Destination>),
    /// The reader is copying the data section into the caller's buffer.
    Receiving,
    Done(Result<Reply, RpcError>),
}

#[derive(Default)]
struct Pending {
    slots: HashMap<u64, Slot>,
    reader_busy: bool,
    broken: Option<RpcError>,
    /// Threads blocked on `wakeup`. Notifying costs a system call even when nobody waits,
    /// so it is skipped when this is 0 (the single-threaded case).
    sleepers: usize,
    /// Requests given up (timed out or dropped) whose responses have not arrived: the server
    /// is still working on them, so a new request would queue behind them.
    abandoned: usize,
}

impl Pending {
    /// A response nobody waits for arrived: one of a request given up, or (if none was given
    /// up) one this connection never sent, which a transport delivered to the wrong
    /// connection — logged, since it is a bug worth seeing.
    fn forget_response(&mut self, request_id: u64, endpoint: &Endpoint) {
        if self.abandoned == 0 {
            log::warn!("{endpoint}: dropping a response to request {request_id}, which this connection is not waiting for");
        }
        self.abandoned = self.abandoned.saturating_sub(1);
    }
}

/// How a connection's frames travel.
enum Wire {
    /// A byte stream (TCP, Unix socket, simulated): frames are written and read as bytes.
    Stream { writer: Mutex<Box<dyn WriteHalf>>, reader: Mutex<FrameReader> },
    /// UCX messages (and RMA for large data).
    Ucx(Channel),
}

/// Request ids of this process, never the same on two connections (1 is every connection's
/// `Hello`): a response that reached the wrong connection (a transport's fault) matches no
/// call there and is dropped, instead of answering whichever call had its number.
static NEXT_REQUEST_ID: AtomicU64 = AtomicU64::new(2);

fn new_request_id() -> u64 {
    NEXT_REQUEST_ID.fetch_add(1, Ordering::Relaxed)
}

/// A connection to one server.
pub struct Connection {
    endpoint: Endpoint,
    wire: Wire,
    pending: Mutex<Pending>,
    wakeup: Condvar,
    timeout: Duration,
    /// Membership epoch sent with requests.
    local_epoch: AtomicU64,
    /// Highest membership epoch the server has reported.
    peer_epoch: AtomicU64,
    server: HelloReply,
    /// Present when this process may read the server's memory (same host, probe verified).
    server_memory: Option<ProcessMemory>,
}

thread_local! {
    static BODY: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Connection {
    /// Connects and performs the handshake.
    pub fn open(endpoint: &Endpoint, config: &ConnectionConfig) -> Result<Connection, RpcError> {
        match endpoint {
            Endpoint::Ucx(address) => Self::open_ucx(endpoint, address, config),
            _ => Self::open_stream(endpoint, config),
        }
    }

    fn open_stream(endpoint: &Endpoint, config: &ConnectionConfig) -> Result<Connection, RpcError> {
        let connect_error = |reason: String| RpcError::Connect { endpoint: endpoint.to_string(), reason };
        let timed_out = || RpcError::Timeout { endpoint: endpoint.to_string(), timeout_ms: config.timeout.as_millis() as u64 };
        let link = transport::connect(endpoint, config.timeout).map_err(|error| match error.kind() {
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => timed_out(),
            _ => connect_error(error.to_string()),
        })?;
        let mut writer = link.writer;
        writer.set_write_timeout(Some(config.timeout)).map_err(|error| connect_error(error.to_string()))?;
        let mut reader = FrameReader::new(link.reader, TICK, config.timeout, PollBudget::fixed(config.poll))
            .map_err(|error| connect_error(error.to_string()))?;

        let same_host = link.peer.pid.is_some();
        let (header, body) = hello_frame(config, same_host);
        write_frame(writer.as_mut(), &header, &body, &[]).map_err(|error| connect_error(error.to_string()))?;

        let deadline = Instant::now() + config.timeout;
        let mut looks = abandon::Looks::default();
        let header = loop {
            match reader.next_header() {
                Ok(Some(header)) => break header,
                Ok(None) if looks.caller_being_killed(Instant::now()) => {
                    return Err(RpcError::Abandoned { endpoint: endpoint.to_string() });
                }
                Ok(None) if Instant::now() < deadline => continue,
                Ok(None) => return Err(timed_out()),
                Err(error) => return Err(connect_error(format!("handshake failed: {error}"))),
            }
        };
        let mut body = vec![0u8; header.body_len as usize];
        reader.read_exact(&mut body).map_err(|error| connect_error(error.to_string()))?;
        reader.skip(header.data_len as usize).map_err(|error| connect_error(error.to_string()))?;
        let server = hello_reply(endpoint, &body)?;
        let server_memory = match (link.peer.pid, server.memory_probe) {
            (Some(pid), Some(probe)) => Some(ProcessMemory::new(pid)).filter(|memory| memory.verify_probe(probe)),
            _ => None,
        };
        let wire = Wire::Stream { writer: Mutex::new(writer), reader: Mutex::new(reader) };
        Ok(Connection::established(endpoint, wire, config, server, server_memory, header.epoch))
    }

    fn open_ucx(endpoint: &Endpoint, address: &str, config: &ConnectionConfig) -> Result<Connection, RpcError> {
        let connect_error = |reason: String| RpcError::Connect { endpoint: endpoint.to_string(), reason };
        let deadline = Instant::now() + config.timeout;
        let channel = wire_up_ucx(address, config.poll, deadline).map_err(|error| connect_error(error.to_string()))?;
        let (header, body) = hello_frame(config, false);
        channel.send(header, &body, &[], None, deadline).map_err(|error| connect_error(error.to_string()))?;
        let mut looks = abandon::Looks::default();
        let reply = loop {
            match channel.receive(deadline.saturating_duration_since(Instant::now()).min(TICK)) {
                Ok(Some(received)) if received.frame.request_id == header.request_id => break received,
                Ok(_) if looks.caller_being_killed(Instant::now()) => return Err(RpcError::Abandoned { endpoint: endpoint.to_string() }),
                Ok(_) if Instant::now() < deadline => continue,
                Ok(_) => return Err(RpcError::Timeout { endpoint: endpoint.to_string(), timeout_ms: config.timeout.as_millis() as u64 }),
                Err(reason) => return Err(connect_error(format!("handshake failed: {reason}"))),
            }
        };
        let server = hello_reply(endpoint, &reply.body)?;
        channel.handshake_done();
        Ok(Connection::established(endpoint, Wire::Ucx(channel), config, server, None, reply.frame.epoch))
    }

    fn established(
        endpoint: &Endpoint,
        wire: Wire,
        config: &ConnectionConfig,
        server: HelloReply,
        server_memory: Option<ProcessMemory>,
        epoch: u64,
    ) -> Connection {
        Connection {
            endpoint: endpoint.clone(),
            wire,
            pending: Mutex::new(Pending::default()),
            wakeup: Condvar::new(),
            timeout: config.timeout,
            local_epoch: AtomicU64::new(0),
            peer_epoch: AtomicU64::new(epoch),
            server,
            server_memory,
        }
    }

    /// Connects to a cluster member: through its Unix socket when it runs on this host (which
    /// also enables cross-memory attach), otherwise, or if that fails, through TCP.
    pub fn open_member(member: &ringfs_proto::Member, config: &ConnectionConfig) -> Result<Connection, RpcError> {
        if member.host_id == config.host_id && !member.unix_path.is_empty() {
            match Connection::open(&Endpoint::Unix(member.unix_path.clone().into()), config) {
                Ok(connection) => return Ok(connection),
                // The server is there but silent (stopped, overloaded): TCP would wait again.
                Err(error) if error.is_timeout() => return Err(error),
                // No socket (another host after all, or the socket file is gone): try TCP.
                Err(_) => {}
            }
        }
        let endpoint =
            Endpoint::parse(&member.tcp_address).map_err(|reason| RpcError::Connect { endpoint: member.tcp_address.clone(), reason })?;
        Connection::open(&endpoint, config)
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The server's name, from the handshake.
    pub fn server_name(&self) -> &str {
        &self.server.server_name
    }

    /// True if the server can pull write data out of this process (`WriteSource::Remote`).
    pub fn server_reads_our_memory(&self) -> bool {
        self.server.memory_access
    }

    /// Access to the server's memory, for copying leased bytes; `None` unless same host.
    pub fn server_memory(&self) -> Option<ProcessMemory> {
        self.server_memory
    }

    /// The membership epoch to announce in request headers.
    pub fn set_local_epoch(&self, epoch: u64) {
        self.local_epoch.store(epoch, Ordering::Relaxed);
    }

    /// The highest membership epoch the server has announced.
    pub fn peer_epoch(&self) -> u64 {
        self.peer_epoch.load(Ordering::Relaxed)
    }

    /// True once the connection failed: a request on it failed, or (over UCX) the engine
    /// closed it because its endpoint failed — an idle connection to a peer that went away
    /// is not handed out again for a request that would only fail.
    pub fn is_broken(&self) -> bool {
        self.pending.lock().broken.is_some() || matches!(&self.wire, Wire::Ucx(channel) if channel.is_closed())
    }

    /// True if the server hung up this connection while it owed it nothing (its process
    /// ended: a server killed and restarted at once, before anyone noticed), seen without
    /// sending anything: a request on it would fail. Costs a non-blocking read; false while
    /// a request is in flight or another thread reads.
    pub fn hung_up(&self) -> bool {
        if !self.is_idle() {
            return false;
        }
        match &self.wire {
            Wire::Stream { reader, .. } => reader.try_lock().is_some_and(|mut reader| reader.closed_while_idle()),
            Wire::Ucx(_) => false,
        }
    }

    /// True when the connection works and the server owes it no response: a new request on
    /// it is answered without queuing behind an earlier one.
    pub fn is_idle(&self) -> bool {
        let pending = self.pending.lock();
        pending.broken.is_none() && pending.slots.is_empty() && pending.abandoned == 0
    }

    /// Sends a request and waits for its response.
    pub fn call(&self, request: &Request, data: &[u8]) -> Result<Reply, RpcError> {
        self.start(request, data, None)?.wait()
    }

    /// Sends a request and waits for its response for at most `timeout` (instead of the
    /// connection's deadline): failure-detection pings must not wait as long as requests.
    pub fn call_within(&self, request: &Request, timeout: Duration) -> Result<Reply, RpcError> {
        let mut call = self.start(request, &[], None)?;
        call.deadline = call.deadline.min(Instant::now() + timeout);
        call.wait()
    }

    /// Sends a request without waiting. Response data up to `destination.len()` bytes is
    /// written into `destination`; larger data arrives in [`Reply::data`].
    pub fn start<'a>(&'a self, request: &Request, data: &[u8], destination: Option<&'a mut [u8]>) -> Result<PendingCall<'a>, RpcError> {
        if abandon::given_up() {
            return Err(RpcError::Abandoned { endpoint: self.endpoint.to_string() });
        }
        let request_id = new_request_id();
        let lent = {
            let mut pending = self.pending.lock();
            if let Some(broken) = &pending.broken {
                return Err(broken.clone());
            }
            let destination = destination.map(|buffer| Destination { pointer: buffer.as_mut_ptr(), len: buffer.len() });
            // The reader of a stream delivers into the destination; over UCX the engine does.
            let (read_into, lent) = match self.wire {
                Wire::Stream { .. } => (destination, None),
                Wire::Ucx(_) => (None, destination),
            };
            pending.slots.insert(request_id, Slot::Waiting(read_into));
            lent
        };
        let call =
            PendingCall { connection: self, request_id, deadline: Instant::now() + self.timeout, finished: false, _buffer: PhantomData };
        if let Err(error) = self.send(request, data, request_id, lent) {
            let error = self.break_connection(format!("sending failed: {error}"));
            drop(call);
            return Err(error);
        }
        Ok(call)
    }

    /// Sends a request that gets no response (request id 0).
    pub fn send_one_way(&self, request: &Request) -> Result<(), RpcError> {
        if let Some(broken) = &self.pending.lock().broken {
            return Err(broken.clone());
        }
        self.send(request, &[], 0, None).map_err(|error| self.break_connection(format!("sending failed: {error}")))
    }

    /// The UCX transports this connection uses (`None` for other transports).
    pub fn ucx_lanes(&self) -> Option<String> {
        match &self.wire {
            Wire::Ucx(channel) => Some(channel.lanes()),
            Wire::Stream { .. } => None,
        }
    }

    /// Writes a request frame; over UCX, `destination` is where its response data may go.
    fn send(&self, request: &Request, data: &[u8], request_id: u64, destination: Option<Destination>) -> std::io::Result<()> {
        let encode_and_write = |body: &mut Vec<u8>| {
            body.clear();
            request.encode(body);
            let header = FrameHeader {
                body_len: body.len() as u32,
                data_len: data.len() as u32,
                request_id,
                epoch: self.local_epoch.load(Ordering::Relaxed),
            };
            match &self.wire {
                Wire::Stream { writer, .. } => write_frame(writer.lock().as_mut(), &header, body, data),
                Wire::Ucx(channel) => {
                    let lent = destination.map(|lent| ucx::client::Destination { pointer: lent.pointer, len: lent.len });
                    channel.send(header, body, data, lent, Instant::now() + self.timeout)
                }
            }
        };
        match BODY.try_with(|body| encode_and_write(&mut body.borrow_mut())) {
            Ok(sent) => sent,
            // The thread is exiting and its buffer is gone: a client called from an exit
            // handler (a program flushing its stdout at exit under the LD_PRELOAD library).
            Err(_) => encode_and_write(&mut Vec::new()),
        }
    }

    /// Marks the connection broken: every waiting request fails with the returned error.
    fn break_connection(&self, reason: String) -> RpcError {
        let mut pending = self.pending.lock();
        let error = self.fail_all(&mut pending, reason);
        let sleepers = pending.sleepers;
        drop(pending);
        self.shut_down();
        if sleepers > 0 {
            self.wakeup.notify_all();
        }
        error
    }

    fn fail_all(&self, pending: &mut Pending, reason: String) -> RpcError {
        let error =
            pending.broken.get_or_insert_with(|| RpcError::Broken { endpoint: self.endpoint.to_string(), reason: reason.into() }).clone();
        for slot in pending.slots.values_mut() {
            if matches!(slot, Slot::Waiting(_)) {
                *slot = Slot::Done(Err(error.clone()));
            }
        }
        error
    }

    /// Waits for the response to `request_id` until `deadline`, or until the caller the
    /// thread serves is found being killed (see [`abandon`]).
    fn finish(&self, request_id: u64, deadline: Instant) -> Result<Reply, RpcError> {
        let mut looks = abandon::Looks::default();
        let mut pending = self.pending.lock();
        loop {
            match pending.slots.get(&request_id) {
                Some(Slot::Done(_)) => match pending.slots.remove(&request_id) {
                    Some(Slot::Done(result)) => return result,
                    _ => unreachable!("slot was just seen done"),
                },
                Some(Slot::Waiting(_)) => {
                    let now = Instant::now();
                    let given_up = if now >= deadline {
                        Some(RpcError::Timeout { endpoint: self.endpoint.to_string(), timeout_ms: self.timeout.as_millis() as u64 })
                    } else if looks.caller_being_killed(now) {
                        Some(RpcError::Abandoned { endpoint: self.endpoint.to_string() })
                    } else {
                        None
                    };
                    if let Some(error) = given_up {
                        pending.slots.remove(&request_id);
                        pending.abandoned += 1;
                        drop(pending);
                        self.forget(request_id);
                        return Err(error);
                    }
                }
                Some(_) => {}
                None => return Err(RpcError::Broken { endpoint: self.endpoint.to_string(), reason: "request lost".into() }),
            }
            if pending.reader_busy {
                let wait = deadline.saturating_duration_since(Instant::now()).clamp(Duration::from_millis(1), TICK);
                pending.sleepers += 1;
                self.wakeup.wait_for(&mut pending, wait);
                pending.sleepers -= 1;
                continue;
            }
            pending.reader_busy = true;
            drop(pending);
            let received = self.receive_one();
            pending = self.pending.lock();
            pending.reader_busy = false;
            if let Err(error) = received {
                self.fail_all(&mut pending, error.to_string());
                self.shut_down();
            }
            if pending.sleepers > 0 {
                self.wakeup.notify_all();
            }
        }
    }

    /// Closes the link: the peer sees the connection end, a blocked reader wakes.
    fn shut_down(&self) {
        match &self.wire {
            Wire::Stream { writer, .. } => writer.lock().shutdown(),
            Wire::Ucx(channel) => channel.close(),
        }
    }

    /// Request `request_id` was given up: over UCX its response must no longer touch what it
    /// lent, and if it lent memory for RMA the connection is closed (broken).
    fn forget(&self, request_id: u64) {
        if let Wire::Ucx(channel) = &self.wire
            && channel.forget(request_id)
        {
            self.break_connection("a request that lent memory to the server was given up".into());
        }
    }

    /// Reads one frame (or waits one tick) and delivers it. Called by the current reader only.
    fn receive_one(&self) -> Result<(), FrameReadError> {
        let reader = match &self.wire {
            Wire::Stream { reader, .. } => reader,
            Wire::Ucx(channel) => return self.receive_message(channel),
        };
        let mut reader = reader.lock();
        let Some(header) = reader.next_header()? else { return Ok(()) };
        self.peer_epoch.fetch_max(header.epoch, Ordering::Relaxed);
        let mut body = vec![0u8; header.body_len as usize];
        reader.read_exact(&mut body)?;
        let response = Response::decode(&body).map_err(|error| {
            FrameReadError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("malformed response: {error}")))
        })?;
        let data_len = header.data_len as usize;

        let destination = {
            let mut pending = self.pending.lock();
            match pending.slots.get_mut(&header.request_id) {
                Some(slot @ Slot::Waiting(_)) => match std::mem::replace(slot, Slot::Receiving) {
                    Slot::Waiting(Some(destination)) if destination.len >= data_len => Some(Some(destination)),
                    _ => Some(None),
                },
                // Nobody waits for this response any more (timed out): drop its data.
                _ => {
                    pending.forget_response(header.request_id, &self.endpoint);
                    None
                }
            }
        };
        let outcome = match destination {
            None => return reader.skip(data_len),
            Some(Some(destination)) => {
                // SAFETY: the slot is `Receiving`, so its PendingCall cannot return (and end the
                // borrow of this buffer) until the slot is `Done`; `data_len <= destination.len`.
                let buffer = unsafe { std::slice::from_raw_parts_mut(destination.pointer, data_len) };
                reader.read_exact(buffer).map(|()| Vec::new())
            }
            Some(None) => {
                let mut data = vec![0u8; data_len];
                reader.read_exact(&mut data).map(|()| data)
            }
        };
        let mut pending = self.pending.lock();
        match outcome {
            Ok(data) => {
                pending.slots.insert(header.request_id, Slot::Done(Ok(Reply { response, data, data_len })));
                Ok(())
            }
            Err(error) => {
                let failure = RpcError::Broken { endpoint: self.endpoint.to_string(), reason: error.to_string().into() };
                pending.slots.insert(header.request_id, Slot::Done(Err(failure)));
                Err(error)
            }
        }
    }
}

impl Connection {
    /// Takes one response routed to this UCX connection (or waits one tick) and delivers it.
    fn receive_message(&self, channel: &Channel) -> Result<(), FrameReadError> {
        let received: Received = match channel.receive(TICK) {
            Ok(Some(received)) => received,
            Ok(None) => return Ok(()),
            Err(reason) => return Err(FrameReadError::Io(std::io::Error::new(std::io::ErrorKind::ConnectionReset, reason))),
        };
        self.peer_epoch.fetch_max(received.frame.epoch, Ordering::Relaxed);
        let response = Response::decode(&received.body).map_err(|error| {
            FrameReadError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("malformed response: {error}")))
        })?;
        let mut pending = self.pending.lock();
        match pending.slots.get_mut(&received.frame.request_id) {
            Some(slot @ Slot::Waiting(_)) => {
                *slot = Slot::Done(Ok(Reply { response, data: received.data, data_len: received.data_len }));
            }
            // Nobody waits for this response any more (timed out).
            _ => pending.forget_response(received.frame.request_id, &self.endpoint),
        }
        Ok(())
    }
}

/// The shortest first try at wiring a UCX endpoint up (a quarter of the connection's timeout
/// if longer); each later try may take twice as long as the one before.
const UCX_WIRE_UP_FIRST_TRY: Duration = Duration::from_secs(1);

/// A UCX connection to `address` wired up by `deadline`. Under heavy load UCX 1.13 now and
/// then leaves an endpoint's wire-up stalled for good — the server accepted it, but not a
/// byte follows (docs/TESTING.md, "A global-memory home that reused a connection to a rank
/// that had ended"): an endpoint not wired up within its try is closed and a new one tried,
/// as TCP sends its SYN again.
fn wire_up_ucx(address: &str, spin: Duration, deadline: Instant) -> std::io::Result<Channel> {
    let mut try_for = (deadline.saturating_duration_since(Instant::now()) / 4).max(UCX_WIRE_UP_FIRST_TRY);
    loop {
        let channel = Channel::connect(address, spin)?;
        let try_deadline = deadline.min(Instant::now() + try_for);
        match channel.wait_connected(try_deadline) {
            Err(error) if error.kind() == std::io::ErrorKind::TimedOut && Instant::now() < deadline => {
                log::info!("UCX did not wire up a connection to {address} in {try_for:?}; trying a new endpoint");
                try_for *= 2;
            }
            outcome => return outcome.map(|()| channel),
        }
    }
}

/// The handshake's first frame (request id 1): the `Hello` of `config`.
fn hello_frame(config: &ConnectionConfig, same_host: bool) -> (FrameHeader, Vec<u8>) {
    let hello = Request::Hello(Hello {
        version: PROTOCOL_VERSION,
        secret: config.secret.clone(),
        client_pid: std::process::id(),
        host_id: config.host_id,
        from_server: config.from_server,
        memory_probe: same_host.then(memory_probe),
        client_id: config.client_id,
        timeout_ms: u32::try_from(config.timeout.as_millis()).unwrap_or(u32::MAX),
        clock_ns: wall_clock_ns(),
        credentials: config.credentials.clone(),
    });
    let mut body = Vec::new();
    hello.encode(&mut body);
    (FrameHeader { body_len: body.len() as u32, data_len: 0, request_id: 1, epoch: 0 }, body)
}

/// The server's answer to the handshake: accepted, or why not.
fn hello_reply(endpoint: &Endpoint, body: &[u8]) -> Result<HelloReply, RpcError> {
    let connect_error = |reason: String| RpcError::Connect { endpoint: endpoint.to_string(), reason };
    match Response::decode(body) {
        Ok(Response::Hello(reply)) => Ok(reply),
        Ok(Response::Error(errno)) => Err(RpcError::Refused { endpoint: endpoint.to_string(), errno }),
        Ok(other) => Err(connect_error(format!("unexpected handshake reply {other:?}"))),
        Err(error) => Err(connect_error(format!("malformed handshake reply: {error}"))),
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// A request that has been sent; [`PendingCall::wait`] collects the response. Dropping it
/// without waiting abandons the request (waiting only if its data is being delivered into the
/// lent buffer right now).
pub struct PendingCall<'a> {
    connection: &'a Connection,
    request_id: u64,
    deadline: Instant,
    finished: bool,
    _buffer: PhantomData<&'a mut [u8]>,
}

impl PendingCall<'_> {
    pub fn wait(mut self) -> Result<Reply, RpcError> {
        self.finished = true;
        self.connection.finish(self.request_id, self.deadline)
    }

    /// [`PendingCall::wait`], giving up at `deadline` if that comes before the connection's
    /// deadline (the response is then dropped when it arrives; the connection stays usable).
    pub fn wait_until(mut self, deadline: Instant) -> Result<Reply, RpcError> {
        self.deadline = self.deadline.min(deadline);
        self.wait()
    }
}

impl Drop for PendingCall<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut pending = self.connection.pending.lock();
        while matches!(pending.slots.get(&self.request_id), Some(Slot::Receiving)) {
            pending.sleepers += 1;
            self.connection.wakeup.wait(&mut pending);
            pending.sleepers -= 1;
        }
        if let Some(Slot::Waiting(_)) = pending.slots.remove(&self.request_id) {
            pending.abandoned += 1;
            drop(pending);
            self.connection.forget(self.request_id);
        }
    }
}

/// Shared handle to a connection.
pub type SharedConnection = Arc<Connection>;

/// This machine's wall clock, in nanoseconds since the epoch.
pub fn wall_clock_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|elapsed| elapsed.as_nanos() as i64).unwrap_or(0)
}
