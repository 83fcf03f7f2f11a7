//! The server side of the frame transport: accepts connections, receives requests, moves
//! their bulk data by RMA, asks the [`Service`] for answers and sends them back, all from one
//! thread that sleeps on its worker's event descriptor when idle.
//!
//! Each request goes through up to three steps, each an [`Operation`] the loop polls: fetch
//! its data (a rendezvous payload, or a `get` from the client's source), then answer it, then
//! place the response data (a `put` into the client's destination and a flush) and send the
//! response. A connection that breaks the protocol, fails, or lets an RMA step exceed the
//! timeout is closed; the others go on.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ringfs_proto::FrameHeader;

use super::wire::{Descriptor, RequestHeader, ResponseHeader};
use super::{FrameConfig, REQUEST, RESPONSE};
use crate::{Endpoint, Error, IncomingMessage, Listener, MessageBuffers, Operation, RegistrationCache, RemoteKey, StableBuffer, Worker};

/// Remote keys kept per connection (a client lends few distinct buffers at a time).
const KEYS_PER_CONNECTION: usize = 8;

/// Requests a server works on at once (fetching data, placing it, sending the response): more
/// wait in the worker's queue, so that clients cannot make a server hold unbounded buffers.
const MAX_REQUESTS_IN_FLIGHT: usize = 64;

/// What a frame server does with requests.
pub trait Service {
    /// Per-connection state.
    type Session: Default;

    /// Answers one request: the response body goes to `outgoing.body`, response data to
    /// `outgoing.data` (both come empty).
    fn handle(&mut self, session: &mut Self::Session, incoming: &Incoming<'_>, outgoing: &mut Outgoing);

    /// Called once when a connection ends.
    fn closed(&mut self, _session: &mut Self::Session) {}
}

/// A request as the service sees it.
pub struct Incoming<'a> {
    pub frame: FrameHeader,
    pub body: &'a [u8],
    pub data: &'a [u8],
    /// Bytes of response data the client can take in its destination.
    pub destination_len: usize,
    /// The client's address.
    pub peer: &'a str,
}

/// A response being built.
#[derive(Default)]
pub struct Outgoing {
    /// The membership epoch for the frame header.
    pub epoch: u64,
    pub body: Vec<u8>,
    pub data: Vec<u8>,
    /// Instead of `data`: bytes the service keeps in memory anyway (a chunk), sent from there
    /// without a copy.
    pub shared: Option<SharedData>,
}

/// A range of bytes shared with the service.
#[derive(Clone, Debug)]
pub struct SharedData {
    pub bytes: Arc<[u8]>,
    pub range: Range<usize>,
}

/// Response data on its way out: the server's buffer or the service's shared bytes.
enum ReplyData {
    Owned(Vec<u8>),
    Shared(SharedData),
}

// SAFETY: both variants own heap memory that does not move with the value.
unsafe impl StableBuffer for ReplyData {}

impl AsRef<[u8]> for ReplyData {
    fn as_ref(&self) -> &[u8] {
        match self {
            ReplyData::Owned(buffer) => buffer,
            ReplyData::Shared(shared) => &shared.bytes[shared.range.clone()],
        }
    }
}

struct Peer<Session> {
    endpoint: Endpoint,
    session: Session,
    keys: Vec<(Vec<u8>, RemoteKey)>,
}

impl<Session> Peer<Session> {
    /// The unpacked form of `packed`, unpacked once per connection.
    fn remote_key(&mut self, packed: &[u8]) -> Result<RemoteKey, Error> {
        if let Some(position) = self.keys.iter().position(|(bytes, _)| bytes == packed) {
            let entry = self.keys.remove(position);
            let key = entry.1.clone();
            self.keys.push(entry);
            return Ok(key);
        }
        let key = self.endpoint.unpack_key(packed)?;
        if self.keys.len() == KEYS_PER_CONNECTION {
            self.keys.remove(0);
        }
        self.keys.push((packed.to_vec(), key.clone()));
        Ok(key)
    }
}

/// One request on its way through the server.
struct Work {
    connection: usize,
    request: RequestHeader,
    started: Instant,
    step: Step,
}

enum Step {
    /// A rendezvous payload (body and inline data) being received.
    Payload(Operation<Vec<u8>>),
    /// The body, while the write data is fetched from the client's source.
    Source { body: Vec<u8>, fetch: Operation<Vec<u8>> },
    /// Response data being put into the client's destination.
    Placing { put: Operation<ReplyData>, flush: Operation<()>, body: Vec<u8>, epoch: u64, data_len: usize },
    /// The response being sent.
    Replying(Operation<MessageBuffers<ReplyData>>),
}

/// A frame server on one thread.
pub struct Server<S: Service> {
    worker: Worker,
    listener: Listener,
    service: S,
    cache: Arc<RegistrationCache>,
    config: FrameConfig,
    connections: HashMap<usize, Peer<S::Session>>,
    work: Vec<Work>,
    /// Buffers for incoming data (their whole length is initialised and reused).
    spare: Vec<Vec<u8>>,
    /// Buffers for response data (cleared, their capacity reused).
    reply_buffers: Vec<Vec<u8>>,
    last_activity: Instant,
}

/// Buffers kept in each pool for reuse: reusing them avoids the page faults of fresh memory,
/// which cost more than the copy itself on virtual machines (docs/PERFORMANCE.md).
const POOLED_BUFFERS: usize = 16;

impl<S: Service> Server<S> {
    /// Listens on `address` with `worker`, answering with `service`.
    pub fn bind(
        worker: &Worker,
        address: SocketAddr,
        service: S,
        cache: Arc<RegistrationCache>,
        config: FrameConfig,
    ) -> Result<Server<S>, Error> {
        worker.accept_messages(REQUEST)?;
        let listener = worker.listen(address)?;
        Ok(Server {
            worker: worker.clone(),
            listener,
            service,
            cache,
            config,
            connections: HashMap::new(),
            work: Vec::new(),
            spare: Vec::new(),
            reply_buffers: Vec::new(),
            last_activity: Instant::now(),
        })
    }

    /// The address clients connect to.
    pub fn address(&self) -> SocketAddr {
        self.listener.address()
    }

    /// Open connections.
    pub fn connection_count(&self) -> usize {
        self.connections.len()
    }

    pub fn service(&self) -> &S {
        &self.service
    }

    /// Serves until `stop` is set (checked at least every 100 ms).
    pub fn run(&mut self, stop: &AtomicBool) -> Result<(), Error> {
        while !stop.load(Ordering::Relaxed) {
            self.run_once(Duration::from_millis(100))?;
        }
        Ok(())
    }

    /// One round: progress, accept, answer, advance transfers; when nothing happened for the
    /// worker's spin time, sleep on the event descriptor for at most `timeout`.
    pub fn run_once(&mut self, timeout: Duration) -> Result<(), Error> {
        let mut active = self.worker.progress() > 0;
        while let Some(accepted) = self.listener.accept() {
            active = true;
            match accepted {
                Ok(endpoint) => {
                    let peer = Peer { endpoint, session: S::Session::default(), keys: Vec::new() };
                    self.connections.insert(peer.endpoint.key(), peer);
                }
                Err(error) => log::debug!("cannot accept a UCX connection: {error}"),
            }
        }
        while self.work.len() < MAX_REQUESTS_IN_FLIGHT {
            let Some(message) = self.worker.next_message() else { break };
            active = true;
            self.receive(message);
        }
        active |= self.advance();
        self.close_failed();
        let now = Instant::now();
        if active {
            self.last_activity = now;
        } else if now.duration_since(self.last_activity) >= self.worker.spin() {
            self.worker.wait(timeout)?;
        }
        Ok(())
    }

    /// Closes a connection and tells the service.
    fn close(&mut self, connection: usize, reason: &Error) {
        if let Some(mut peer) = self.connections.remove(&connection) {
            log::debug!("closing the UCX connection from {}: {reason}", peer.endpoint.peer());
            peer.endpoint.close();
            self.service.closed(&mut peer.session);
        }
        self.work.retain(|work| work.connection != connection);
    }

    fn close_failed(&mut self) {
        let failed: Vec<(usize, Error)> =
            self.connections.iter().filter_map(|(key, peer)| peer.endpoint.failure().map(|error| (*key, error))).collect();
        for (key, error) in failed {
            self.close(key, &error);
        }
    }

    /// A buffer of at least `length` bytes (its first `length` bytes are used).
    fn buffer(&mut self, length: usize) -> Vec<u8> {
        match self.spare.iter().position(|buffer| buffer.len() >= length) {
            Some(position) => self.spare.swap_remove(position),
            None => vec![0u8; length],
        }
    }

    fn recycle(&mut self, buffer: Vec<u8>) {
        if self.spare.len() < POOLED_BUFFERS && !buffer.is_empty() {
            self.spare.push(buffer);
        }
    }

    fn recycle_reply_buffer(&mut self, mut buffer: Vec<u8>) {
        if self.reply_buffers.len() < POOLED_BUFFERS && buffer.capacity() > 0 {
            buffer.clear();
            self.reply_buffers.push(buffer);
        }
    }

    fn receive(&mut self, message: IncomingMessage) {
        let connection = message.endpoint_key();
        if !self.connections.contains_key(&connection) {
            return;
        }
        let request = match RequestHeader::decode(message.header(), message.len()) {
            Ok(request) => request,
            Err(error) => return self.close(connection, &error),
        };
        let started = Instant::now();
        let body_len = request.frame.body_len as usize;
        match (message.data(), &request.source) {
            (Some(payload), None) => {
                let (body, data) = payload.split_at(body_len);
                self.answer(connection, &request, body, data);
            }
            (Some(payload), Some(source)) => {
                let body = payload.to_vec();
                let source = source.clone();
                match self.fetch(connection, &source) {
                    Ok(fetch) => self.work.push(Work { connection, request, started, step: Step::Source { body, fetch } }),
                    Err(error) => self.close(connection, &error),
                }
            }
            (None, _) => {
                let buffer = self.buffer(message.len());
                match message.receive(buffer, None) {
                    Ok(receiving) => self.work.push(Work { connection, request, started, step: Step::Payload(receiving) }),
                    Err(error) => self.close(connection, &error),
                }
            }
        }
    }

    /// Starts reading the client's write data.
    fn fetch(&mut self, connection: usize, source: &Descriptor) -> Result<Operation<Vec<u8>>, Error> {
        let length = source.length as usize;
        let buffer = self.buffer(length);
        let region = self.cache.register(&buffer[..length])?;
        let peer = self.connections.get_mut(&connection).ok_or_else(|| Error::Invalid("no such connection".into()))?;
        let key = peer.remote_key(&source.key)?;
        peer.endpoint.get(buffer, length, source.address, &key, Some(region))
    }

    /// Asks the service and starts the response.
    fn answer(&mut self, connection: usize, request: &RequestHeader, body: &[u8], data: &[u8]) {
        let Some(peer) = self.connections.get_mut(&connection) else { return };
        let reply_data = self.reply_buffers.pop().unwrap_or_default();
        let mut outgoing = Outgoing { epoch: 0, body: Vec::new(), data: reply_data, shared: None };
        let incoming = Incoming {
            frame: request.frame,
            body,
            data,
            destination_len: request.destination.as_ref().map_or(0, |destination| destination.length as usize),
            peer: peer.endpoint.peer(),
        };
        self.service.handle(&mut peer.session, &incoming, &mut outgoing);
        let Outgoing { epoch, body, data, shared } = outgoing;
        let data = match shared {
            Some(shared) => {
                self.recycle_reply_buffer(data);
                ReplyData::Shared(shared)
            }
            None => ReplyData::Owned(data),
        };
        let data_len = data.as_ref().len();
        let result = match &request.destination {
            Some(destination) if data_len >= self.config.rma_threshold && data_len as u64 <= destination.length => {
                self.place(connection, request, destination, epoch, body, data)
            }
            _ => self.send_reply(connection, request, epoch, body, Some(data), data_len),
        };
        if let Err(error) = result {
            self.close(connection, &error);
        }
    }

    fn recycle_data(&mut self, data: ReplyData) {
        if let ReplyData::Owned(buffer) = data {
            self.recycle_reply_buffer(buffer);
        }
    }

    /// Puts the response data into the client's destination, then flushes.
    fn place(
        &mut self,
        connection: usize,
        request: &RequestHeader,
        destination: &Descriptor,
        epoch: u64,
        body: Vec<u8>,
        data: ReplyData,
    ) -> Result<(), Error> {
        let data_len = data.as_ref().len();
        let region = self.cache.register(data.as_ref())?;
        let peer = self.connections.get_mut(&connection).ok_or_else(|| Error::Invalid("no such connection".into()))?;
        let key = peer.remote_key(&destination.key)?;
        let put = peer.endpoint.put(data, data_len, destination.address, &key, Some(region))?;
        let flush = peer.endpoint.flush()?;
        let step = Step::Placing { put, flush, body, epoch, data_len };
        self.work.push(Work { connection, request: request.clone(), started: Instant::now(), step });
        Ok(())
    }

    /// Sends a response: `data` inside it, or (`None`) with its `data_len` bytes already put
    /// into the client's destination.
    fn send_reply(
        &mut self,
        connection: usize,
        request: &RequestHeader,
        epoch: u64,
        body: Vec<u8>,
        data: Option<ReplyData>,
        data_len: usize,
    ) -> Result<(), Error> {
        let request_id = request.frame.request_id;
        let frame = FrameHeader { body_len: body.len() as u32, data_len: data_len as u32, request_id, epoch };
        let mut header = Vec::with_capacity(32);
        ResponseHeader { frame, placed: data.is_none() }.encode(&mut header);
        let data = data.unwrap_or(ReplyData::Owned(Vec::new()));
        let peer = self.connections.get(&connection).ok_or_else(|| Error::Invalid("no such connection".into()))?;
        let mut sending = peer.endpoint.send_parts(RESPONSE, header, body, data, request.eager_reply)?;
        match sending.take() {
            Some(result) => {
                let data = result?.data;
                self.recycle_data(data);
            }
            None => self.work.push(Work {
                connection,
                request: placeholder_request(request_id),
                started: Instant::now(),
                step: Step::Replying(sending),
            }),
        }
        Ok(())
    }

    /// Polls every request in flight once; true if any moved on.
    fn advance(&mut self) -> bool {
        let mut moved = false;
        for work in std::mem::take(&mut self.work) {
            if work.started.elapsed() > self.config.timeout {
                self.close(
                    work.connection,
                    &Error::Timeout { operation: "RMA transfer", timeout_ms: self.config.timeout.as_millis() as u64 },
                );
                moved = true;
                continue;
            }
            match self.step(work) {
                Ok(Some(waiting)) => self.work.push(waiting),
                Ok(None) => moved = true,
                Err((connection, error)) => {
                    self.close(connection, &error);
                    moved = true;
                }
            }
        }
        moved
    }

    /// Moves one request on: `Some` if it still waits.
    fn step(&mut self, mut work: Work) -> Result<Option<Work>, (usize, Error)> {
        let connection = work.connection;
        let failed = |error| (connection, error);
        match &mut work.step {
            Step::Payload(receiving) => {
                let Some(result) = receiving.take() else { return Ok(Some(work)) };
                let buffer = result.map_err(failed)?;
                let (body, data) = buffer[..work.request.frame.body_len as usize + work.request.inline_data()]
                    .split_at(work.request.frame.body_len as usize);
                self.answer(connection, &work.request, body, data);
                self.recycle(buffer);
            }
            Step::Source { body, fetch } => {
                let Some(result) = fetch.take() else { return Ok(Some(work)) };
                let buffer = result.map_err(failed)?;
                let body = std::mem::take(body);
                self.answer(connection, &work.request, &body, &buffer[..work.request.frame.data_len as usize]);
                self.recycle(buffer);
            }
            Step::Placing { put, flush, body, epoch, data_len } => {
                if !(put.is_complete() && flush.is_complete()) {
                    return Ok(Some(work));
                }
                let data = put.take().unwrap_or_else(|| Err(Error::Invalid("incomplete put".into()))).map_err(failed)?;
                flush.result().unwrap_or(Ok(())).map_err(failed)?;
                self.recycle_data(data);
                let body = std::mem::take(body);
                self.send_reply(connection, &work.request, *epoch, body, None, *data_len).map_err(failed)?;
            }
            Step::Replying(sending) => {
                let Some(result) = sending.take() else { return Ok(Some(work)) };
                let data = result.map_err(failed)?.data;
                self.recycle_data(data);
            }
        }
        Ok(None)
    }
}

/// The request header kept with a response being sent (only its id matters then).
fn placeholder_request(request_id: u64) -> RequestHeader {
    RequestHeader {
        frame: FrameHeader { body_len: 1, data_len: 0, request_id, epoch: 0 },
        source: None,
        destination: None,
        eager_reply: false,
    }
}
