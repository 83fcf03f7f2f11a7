//! The server side of UCX connections: a [`UcxListener`] the event loop watches like a socket
//! listener (its descriptor watches the worker's event descriptor and the listener's notice),
//! and the connections it accepts as [`Link`]s whose halves read the frames routed to their
//! inbox and send responses.
//!
//! A request's frame reaches its connection's inbox whole: inline data with it, data the
//! client lent fetched by `get` first — only from a client whose handshake succeeded (no RMA
//! for strangers). A response whose request lent a destination and whose data is large
//! enough is `put` there and flushed before the response says so; otherwise the data travels
//! in the response. Both sides' buffers come from a pool, so that their registrations are
//! reused. A request that breaks the transport's rules closes its connection only.

use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringfs_proto::{FrameHeader, HEADER_LEN, Response};
use ringfs_ucx::frames::RESPONSE;
use ringfs_ucx::frames::wire::{Descriptor, RequestHeader, ResponseHeader};
use ringfs_ucx::{Endpoint, IncomingMessage, Operation, RemoteKey, StableBuffer};

use super::engine::{Held, Inbox, Link as EngineLink, Notice, Watch};
use super::{Engine, Settings, Side, State, io_error, process_engine, resolve};
use crate::link::{Link, PeerIdentity, ReadHalf, WriteHalf};
use crate::server::epoll::{Epoll, READABLE};

/// Rounds of progress a listener makes while UCX says the worker is busy before it lets go
/// of the worker and comes back through the event loop ([`UcxListener::stay_busy`]).
const BUSY_ROUNDS: usize = 64;
/// Remote keys kept per connection (a client lends few distinct buffers at a time).
const KEYS_PER_CONNECTION: usize = 8;
/// Read destinations a connection may lend at once (a client pipelines a few hundred
/// requests to a server at most; one descriptor is ~100 bytes).
const MAX_LENT_DESTINATIONS: usize = 65_536;

/// Bytes of a frame in a connection's inbox, read from `read` on.
pub(crate) struct Segment {
    bytes: SegmentBytes,
    read: usize,
}

enum SegmentBytes {
    Owned(Vec<u8>),
    /// A large request payload left in UCX's receive buffer: the reader copies it once, to
    /// where the frame's data goes, instead of once more into the inbox on arrival.
    Held(Held),
}

impl Segment {
    fn owned(bytes: Vec<u8>) -> Segment {
        Segment { bytes: SegmentBytes::Owned(bytes), read: 0 }
    }

    fn bytes(&self) -> &[u8] {
        match &self.bytes {
            SegmentBytes::Owned(bytes) => bytes,
            SegmentBytes::Held(held) => held.bytes(),
        }
    }
}

/// An operation of the server's that owns buffers and has not completed, and what to do when
/// it has.
pub(crate) enum Transfer {
    /// A message sent from owned buffers: the frame buffer goes back to the pool.
    Sent(Operation<ringfs_ucx::MessageBuffers<FrameBytes>>),
    /// Fetching a request's write data.
    Fetch(Fetch),
    /// Placing a response's data in the client's buffer.
    Place(Place),
}

impl Transfer {
    /// The connection it works for (none for a send that only holds buffers).
    pub(crate) fn connection(&self) -> Option<usize> {
        match self {
            Transfer::Sent(_) => None,
            Transfer::Fetch(fetch) => Some(fetch.connection),
            Transfer::Place(place) => Some(place.connection),
        }
    }
}

/// A connection accepted by a [`UcxListener`], as the engine sees it.
pub(crate) struct ServerSide {
    pub(crate) inbox: Arc<Inbox<Segment>>,
    /// Read destinations lent with requests not answered yet, by request id.
    destinations: HashMap<u64, Descriptor>,
    keys: Vec<(Vec<u8>, RemoteKey)>,
    /// The first response (to the handshake) has been sent.
    answered: bool,
    /// It accepted the handshake: RMA is allowed from now on.
    authenticated: bool,
}

impl ServerSide {
    /// The unpacked form of `packed` on `endpoint`, unpacked once per connection.
    fn remote_key(&mut self, endpoint: &Endpoint, packed: &[u8]) -> Result<RemoteKey, String> {
        if let Some(position) = self.keys.iter().position(|(bytes, _)| bytes == packed) {
            let entry = self.keys.remove(position);
            let key = entry.1.clone();
            self.keys.push(entry);
            return Ok(key);
        }
        let key = endpoint.unpack_key(packed).map_err(|error| error.to_string())?;
        if self.keys.len() == KEYS_PER_CONNECTION {
            self.keys.remove(0);
        }
        self.keys.push((packed.to_vec(), key.clone()));
        Ok(key)
    }
}

/// A frame buffer of which a part (`range`) is sent or put.
pub(crate) struct FrameBytes {
    bytes: Vec<u8>,
    range: Range<usize>,
}

impl AsRef<[u8]> for FrameBytes {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[self.range.clone()]
    }
}

// SAFETY: the bytes live in the vector's heap allocation, which moving the value does not move.
unsafe impl StableBuffer for FrameBytes {}

/// A request's write data being fetched from the client.
pub(crate) struct Fetch {
    pub(crate) connection: usize,
    frame: FrameHeader,
    body: Vec<u8>,
    operation: Operation<Vec<u8>>,
    started: Instant,
}

/// A response's data being put into the client's destination (then flushed).
pub(crate) struct Place {
    pub(crate) connection: usize,
    put: Operation<FrameBytes>,
    flush: Operation<()>,
    frame: FrameHeader,
    body: Vec<u8>,
    started: Instant,
}

impl State {
    /// Hands a request to its connection's inbox (after fetching its data, if lent); a
    /// request that breaks the rules ends the connection.
    pub(crate) fn route_request(&mut self, key: usize, message: IncomingMessage) {
        if let Err(reason) = self.accept_request(key, message) {
            self.close_link(key, &reason, false);
        }
    }

    fn accept_request(&mut self, key: usize, message: IncomingMessage) -> Result<(), String> {
        let header = RequestHeader::decode(message.header(), message.len()).map_err(|error| format!("a malformed request: {error}"))?;
        let payload = message.data().ok_or("a request sent by rendezvous (ringfs clients send eagerly)")?;
        let fetching = header.source.as_ref().map(|source| (self.buffer(source.length as usize), self.cache(), payload.to_vec()));
        let inline = if fetching.is_none() { Some(self.inline_segments(&header.frame, message)) } else { None };
        let Some(EngineLink { endpoint, side: Side::Server(server) }) = self.links.get_mut(&key) else { return Ok(()) };
        if (header.source.is_some() || header.destination.is_some()) && !server.authenticated {
            return Err("RMA before the handshake".into());
        }
        if let Some(destination) = &header.destination {
            if server.destinations.len() >= MAX_LENT_DESTINATIONS {
                return Err(format!("more than {MAX_LENT_DESTINATIONS} destinations lent at once"));
            }
            server.destinations.insert(header.frame.request_id, destination.clone());
        }
        let (Some(source), Some((buffer, cache, body))) = (&header.source, fetching) else {
            if let Some((frame, data)) = inline {
                server.inbox.push(frame);
                if let Some(data) = data {
                    server.inbox.push(data);
                }
            }
            return Ok(());
        };
        let length = source.length as usize;
        let remote = server.remote_key(endpoint, &source.key)?;
        let region = cache.register(&buffer[..length]).map_err(|error| error.to_string())?;
        let operation = endpoint.get(buffer, length, source.address, &remote, Some(region)).map_err(|error| error.to_string())?;
        let fetch = Fetch { connection: key, frame: header.frame, body, operation, started: Instant::now() };
        self.in_flight.push(Transfer::Fetch(fetch));
        Ok(())
    }

    /// A request's frame as inbox segments: its header and payload copied into one buffer,
    /// or, for a large payload UCX holds in its receive buffer, the header and the payload
    /// where it is.
    fn inline_segments(&mut self, frame: &FrameHeader, message: IncomingMessage) -> (Segment, Option<Segment>) {
        let mut message = message;
        if message.len() >= self.settings.rma_threshold {
            match message.into_held() {
                Ok(payload) => {
                    return (
                        Segment::owned(frame.encode().to_vec()),
                        Some(Segment { bytes: SegmentBytes::Held(self.hold(payload)), read: 0 }),
                    );
                }
                Err(returned) => message = returned,
            }
        }
        let payload = message.data().unwrap_or_default();
        let length = HEADER_LEN + payload.len();
        let mut bytes = if length >= self.settings.rma_threshold { self.empty_buffer(length) } else { Vec::with_capacity(length) };
        bytes.extend_from_slice(&frame.encode());
        bytes.extend_from_slice(payload);
        (Segment::owned(bytes), None)
    }

    /// Keeps the servers' event loops awake while operations are in flight: a large send
    /// over shared memory moves on only when its sender progresses, and nothing would wake
    /// them for that.
    fn keep_progressing(&self) {
        if !self.in_flight.is_empty() {
            for listening in self.listeners.values() {
                listening.notice.signal();
            }
            if self.listeners.is_empty() {
                let _ = self.worker.signal();
            }
        }
    }

    /// Polls every operation in flight once; the number that finished.
    pub(crate) fn advance_transfers(&mut self) -> usize {
        let mut finished = 0;
        for operation in std::mem::take(&mut self.in_flight) {
            match self.advance(operation) {
                Some(waiting) => self.in_flight.push(waiting),
                None => finished += 1,
            }
        }
        finished
    }

    /// Moves one operation on: `Some` if it still waits.
    fn advance(&mut self, operation: Transfer) -> Option<Transfer> {
        let timeout = self.settings.transfer_timeout;
        match operation {
            Transfer::Sent(mut sending) => match sending.take() {
                None => Some(Transfer::Sent(sending)),
                Some(result) => {
                    // A failed send shows as its endpoint's failure.
                    if let Ok(buffers) = result {
                        self.recycle(buffers.data.bytes);
                    }
                    None
                }
            },
            Transfer::Fetch(mut fetch) => {
                let result = match fetch.operation.take() {
                    None if fetch.started.elapsed() < timeout => return Some(Transfer::Fetch(fetch)),
                    None => Err("fetching a request's data timed out".to_string()),
                    Some(result) => result.map_err(|error| format!("fetching a request's data failed: {error}")),
                };
                match result {
                    Ok(data) => self.deliver_fetched(fetch, data),
                    Err(reason) => self.close_link(fetch.connection, &reason, false),
                }
                None
            }
            Transfer::Place(mut place) => {
                if !(place.put.is_complete() && place.flush.is_complete()) {
                    if place.started.elapsed() < timeout {
                        return Some(Transfer::Place(place));
                    }
                    self.close_link(place.connection, "placing a response's data timed out", false);
                    return None;
                }
                let put = place.put.take().unwrap_or_else(|| Err(ringfs_ucx::Error::Invalid("an incomplete put".into())));
                let placed = put.and_then(|bytes| place.flush.result().unwrap_or(Ok(())).map(|()| bytes));
                match placed {
                    Ok(bytes) => {
                        self.recycle(bytes.bytes);
                        let body = std::mem::take(&mut place.body);
                        if let Err(reason) = self.send_response(place.connection, place.frame, body, None) {
                            self.close_link(place.connection, &reason, false);
                        }
                    }
                    Err(error) => self.close_link(place.connection, &format!("placing a response's data failed: {error}"), false),
                }
                None
            }
        }
    }

    fn deliver_fetched(&mut self, fetch: Fetch, data: Vec<u8>) {
        let Some(EngineLink { side: Side::Server(server), .. }) = self.links.get(&fetch.connection) else { return };
        let mut bytes = Vec::with_capacity(HEADER_LEN + fetch.body.len());
        bytes.extend_from_slice(&fetch.frame.encode());
        bytes.extend_from_slice(&fetch.body);
        server.inbox.push(Segment::owned(bytes));
        server.inbox.push(Segment::owned(data));
    }

    /// Sends the response frame in `frame` (header, body, data) on connection `key`: its data
    /// into the destination the request lent, if large enough, else inside the message.
    fn respond(&mut self, key: usize, frame: Vec<u8>) -> io::Result<()> {
        let mut header_bytes = [0u8; HEADER_LEN];
        header_bytes.copy_from_slice(&frame[..HEADER_LEN]);
        let header = FrameHeader::decode(&header_bytes).map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error.to_string()))?;
        let body_end = HEADER_LEN + header.body_len as usize;
        let data_len = header.data_len as usize;
        let threshold = self.settings.rma_threshold;
        let cache = (data_len >= threshold).then(|| self.cache());
        let Some(EngineLink { endpoint, side: Side::Server(server) }) = self.links.get_mut(&key) else {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "the connection was closed"));
        };
        if !server.answered {
            server.answered = true;
            server.authenticated = matches!(Response::decode(&frame[HEADER_LEN..body_end]), Ok(Response::Hello(_)));
        }
        let body = frame[HEADER_LEN..body_end].to_vec();
        let destination = server.destinations.remove(&header.request_id);
        let place_into = destination.filter(|destination| server.authenticated && data_len as u64 <= destination.length);
        let (Some(destination), Some(cache)) = (place_into, cache) else {
            let data = FrameBytes { range: body_end..frame.len(), bytes: frame };
            return self.send_response(key, header, body, Some(data)).map_err(|reason| io::Error::new(io::ErrorKind::BrokenPipe, reason));
        };
        let placing = || -> Result<Place, String> {
            let remote = server.remote_key(endpoint, &destination.key)?;
            let data = FrameBytes { range: body_end..frame.len(), bytes: frame };
            let region = cache.register(data.as_ref()).map_err(|error| error.to_string())?;
            let put = endpoint.put(data, data_len, destination.address, &remote, Some(region)).map_err(|error| error.to_string())?;
            let flush = endpoint.flush().map_err(|error| error.to_string())?;
            Ok(Place { connection: key, put, flush, frame: header, body, started: Instant::now() })
        };
        match placing() {
            Ok(place) => {
                self.in_flight.push(Transfer::Place(place));
                self.keep_progressing();
                Ok(())
            }
            Err(reason) => {
                self.close_link(key, &reason, false);
                Err(io::Error::new(io::ErrorKind::BrokenPipe, reason))
            }
        }
    }

    /// Sends a response message: `data` inside it, or (`None`) its `frame.data_len` bytes
    /// already placed in the client's destination.
    fn send_response(&mut self, key: usize, frame: FrameHeader, body: Vec<u8>, data: Option<FrameBytes>) -> Result<(), String> {
        let Some(link) = self.links.get(&key) else { return Err("the connection was closed".into()) };
        let mut header = Vec::with_capacity(HEADER_LEN + 1);
        ResponseHeader { frame, placed: data.is_none() }.encode(&mut header);
        let data = data.unwrap_or(FrameBytes { bytes: Vec::new(), range: 0..0 });
        let mut sending = link.endpoint.send_parts(RESPONSE, header, body, data, true).map_err(|error| error.to_string())?;
        match sending.take() {
            Some(Ok(buffers)) => self.recycle(buffers.data.bytes),
            Some(Err(error)) => return Err(error.to_string()),
            None => {
                self.in_flight.push(Transfer::Sent(sending));
                self.keep_progressing();
            }
        }
        Ok(())
    }
}

/// A UCX listener served by an RPC server's event loop (see the module's documentation).
pub struct UcxListener {
    engine: Arc<Engine>,
    /// Its key in the engine's listeners.
    id: usize,
    notice: Arc<Notice>,
    /// Readable when the worker's descriptor or the notice is: what the event loop watches.
    watched: Epoll,
    address: SocketAddr,
}

impl UcxListener {
    /// Listens on `address` (`host:port`; port 0 picks a free one) on the process's worker.
    pub fn bind(address: &str) -> io::Result<UcxListener> {
        let socket = resolve(address)?;
        let engine = process_engine().map_err(io_error)?;
        let notice = Notice::new()?;
        let watched = Epoll::new()?;
        watched.add(engine.worker_fd(), 0, READABLE)?;
        watched.add(notice.raw_fd(), 1, READABLE)?;
        let (id, address) = {
            let mut state = engine.lock();
            let listener = state.worker.listen(socket).map_err(io_error)?;
            let bound = listener.address();
            (state.add_listener(listener, notice.clone()), bound)
        };
        Ok(UcxListener { engine, id, notice, watched, address })
    }

    /// The address clients connect to (with the real port if 0 was asked for).
    pub fn local_address(&self) -> SocketAddr {
        self.address
    }

    /// Readable when the worker has something to progress (messages, new connections) or
    /// connections wait to be accepted.
    pub fn poll_fd(&self) -> RawFd {
        self.watched.raw_fd()
    }

    /// Progresses the worker (routing messages to the connections' inboxes) and takes the
    /// next new connection; `WouldBlock` (with the worker armed, so that the descriptor
    /// fires on the next event) when none waits.
    pub fn accept(&self) -> io::Result<Link> {
        let mut state = self.engine.lock();
        state.progress();
        for _ in 0..BUSY_ROUNDS {
            if let Some(accepted) = state.listeners.get(&self.id).and_then(|listening| listening.listener.accept()) {
                let link = self.admit(&mut state, accepted.map_err(io_error)?)?;
                // More may be waiting: keep the descriptor readable for the next call.
                self.notice.signal();
                return Ok(link);
            }
            if state.worker.arm().map_err(io_error)? {
                // (Under the engine's lock, as every signal of the notice.)
                self.notice.drain();
                self.notice.none_waiting();
                state.keep_progressing();
                return Err(io::ErrorKind::WouldBlock.into());
            }
            state.progress();
        }
        self.stay_busy();
        Err(io::ErrorKind::WouldBlock.into())
    }

    /// The worker stays busy — an operation that cannot move on, such as a client thread's
    /// send to a peer that stopped reading, keeps UCX from arming it: the event loop comes
    /// back through its descriptor, and the process's other threads get the worker meanwhile.
    fn stay_busy(&self) {
        self.notice.signal();
    }

    /// Routes what arrived for the connections but accepts none (the server is not accepting
    /// now), then arms the worker. Connections that wait stay unnoticed until [`Self::wake`].
    pub fn progress(&self) {
        let mut state = self.engine.lock();
        for _ in 0..BUSY_ROUNDS {
            state.progress();
            if state.worker.arm().unwrap_or(true) {
                self.notice.drain();
                state.keep_progressing();
                return;
            }
        }
        self.stay_busy();
    }

    /// Makes the descriptor readable, so that connections waiting are accepted.
    pub fn wake(&self) {
        let _state = self.engine.lock();
        self.notice.signal();
    }

    /// Stops listening: new connections are refused (established ones go on).
    pub fn shutdown(&self) {
        self.engine.lock().listeners.remove(&self.id);
    }

    fn admit(&self, state: &mut State, endpoint: Endpoint) -> io::Result<Link> {
        let inbox = match Inbox::new(Watch::EventLoop) {
            Ok(inbox) => inbox,
            Err(error) => {
                endpoint.close();
                return Err(error);
            }
        };
        let side = Side::Server(ServerSide {
            inbox: inbox.clone(),
            destinations: HashMap::new(),
            keys: Vec::new(),
            answered: false,
            authenticated: false,
        });
        let key = state.add_link(endpoint, side);
        let reader = ServerReader { engine: self.engine.clone(), notice: self.notice.clone(), inbox, read_timeout: None };
        let writer = ServerWriter { engine: self.engine.clone(), key, frame: Vec::new() };
        Ok(Link { reader: Box::new(reader), writer: Box::new(writer), peer: PeerIdentity { pid: None } })
    }
}

impl Drop for UcxListener {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Reads the frames routed to a connection's inbox.
struct ServerReader {
    engine: Arc<Engine>,
    /// Its listener's.
    notice: Arc<Notice>,
    inbox: Arc<Inbox<Segment>>,
    read_timeout: Option<Duration>,
}

impl ServerReader {
    /// Copies what the inbox holds into `buffer`: `None` if it holds nothing (and the
    /// connection goes on), `Some(0)` once the connection ended.
    fn take_arrived(&self, buffer: &mut [u8]) -> Option<usize> {
        let mut emptied = Vec::new();
        let count = self.inbox.with(|queue| {
            let mut count = 0;
            while count < buffer.len() {
                let Some(segment) = queue.items.front_mut() else { break };
                let bytes = segment.bytes();
                let step = (bytes.len() - segment.read).min(buffer.len() - count);
                buffer[count..count + step].copy_from_slice(&bytes[segment.read..segment.read + step]);
                let finished = segment.read + step == bytes.len();
                segment.read += step;
                count += step;
                // (A held payload goes back to UCX when dropped here.)
                if finished && let Some(Segment { bytes: SegmentBytes::Owned(bytes), .. }) = queue.items.pop_front() {
                    emptied.push(bytes);
                }
            }
            match count {
                0 if queue.closed.is_some() => Some(0),
                0 => None,
                count => Some(count),
            }
        });
        let threshold = Settings::from_env().rma_threshold;
        let large: Vec<Vec<u8>> = emptied.into_iter().filter(|bytes| bytes.capacity() >= threshold).collect();
        if !large.is_empty() {
            let mut state = self.engine.lock();
            for bytes in large {
                state.recycle(bytes);
            }
        }
        count
    }
}

impl Read for ServerReader {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let deadline = Instant::now() + self.read_timeout.unwrap_or(Duration::from_secs(1));
        loop {
            if let Some(count) = self.take_arrived(buffer) {
                return Ok(count);
            }
            if Instant::now() >= deadline {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.engine.wait_until(&self.inbox, deadline, Duration::ZERO);
        }
    }
}

impl ReadHalf for ServerReader {
    fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.read_timeout = timeout;
        Ok(())
    }

    fn read_available(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        if let Some(count) = self.take_arrived(buffer) {
            return Ok(count);
        }
        // Route what the worker holds (unless another thread is at it, routing for us) and
        // take it, as the connection's server: no wake-up through the descriptor for that.
        let taken = self.inbox.serve(|| {
            self.engine.try_progress();
            self.take_arrived(buffer)
        });
        taken.ok_or_else(|| io::ErrorKind::WouldBlock.into())
    }

    fn poll_fd(&self) -> Option<RawFd> {
        Some(self.inbox.raw_fd())
    }

    fn carried_by_listener(&self) -> bool {
        true
    }

    fn listener_has_waiting(&self) -> bool {
        self.notice.connections_waiting()
    }
}

/// Collects the bytes of response frames and sends each frame once it is whole.
struct ServerWriter {
    engine: Arc<Engine>,
    key: usize,
    /// The frame being written (empty between frames: an idle connection holds no buffer).
    frame: Vec<u8>,
}

impl ServerWriter {
    /// Length of the first frame in `bytes`, if it is all there.
    fn complete_frame(bytes: &[u8]) -> io::Result<Option<usize>> {
        if bytes.len() < HEADER_LEN {
            return Ok(None);
        }
        let mut header = [0u8; HEADER_LEN];
        header.copy_from_slice(&bytes[..HEADER_LEN]);
        let header = FrameHeader::decode(&header).map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error.to_string()))?;
        let length = HEADER_LEN + header.body_len as usize + header.data_len as usize;
        Ok((bytes.len() >= length).then_some(length))
    }
}

impl Write for ServerWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(bytes)])
    }

    fn write_vectored(&mut self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        let total: usize = slices.iter().map(|slice| slice.len()).sum();
        if self.frame.capacity() == 0 {
            self.frame =
                if total < Settings::from_env().rma_threshold { Vec::with_capacity(total) } else { self.engine.lock().empty_buffer(total) };
        }
        for slice in slices {
            self.frame.extend_from_slice(slice);
        }
        while let Some(length) = Self::complete_frame(&self.frame)? {
            let rest = self.frame.split_off(length);
            let frame = std::mem::replace(&mut self.frame, rest);
            self.engine.lock().respond(self.key, frame)?;
        }
        Ok(total)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl WriteHalf for ServerWriter {
    fn set_write_timeout(&mut self, _timeout: Option<Duration>) -> io::Result<()> {
        // Sending never blocks: UCX takes the message (a slow peer holds the buffer, not us).
        Ok(())
    }

    fn shutdown(&self) {
        self.engine.lock().close_link(self.key, "closed by the server", true);
    }
}

impl Drop for ServerWriter {
    fn drop(&mut self) {
        self.shutdown();
    }
}
