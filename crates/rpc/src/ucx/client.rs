//! The client side of UCX connections: a [`Channel`] per connection sends request frames and
//! receives the responses the process's engine routed to its inbox.
//!
//! Response data goes where the caller asked, as on TCP: into the buffer lent with the
//! request if it fits, else into the reply. The engine copies it there while routing (under
//! its lock, which a caller giving up its request also takes, so the copy never lands in a
//! buffer taken back), or the server `put` it there by RMA. Memory the server may access by
//! RMA is lent until the response: a request given up before it (timed out, dropped) closes
//! the connection, so that no late `get` or `put` can touch a buffer its owner reuses.

use ringfs_sync::MutexGuard;
use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringfs_proto::FrameHeader;
use ringfs_ucx::frames::wire::{Descriptor, RequestHeader, ResponseHeader};
use ringfs_ucx::frames::{BulkTransfer, REQUEST};
use ringfs_ucx::{IncomingMessage, MemoryRegion};

use super::engine::{Inbox, Link, Watch};
use super::{Engine, Side, State, describe_lanes, io_error, process_engine, resolve};

/// A response as the engine routed it.
pub(crate) struct Received {
    pub(crate) frame: FrameHeader,
    pub(crate) body: Vec<u8>,
    /// The data section, unless it went into the request's destination.
    pub(crate) data: Vec<u8>,
    pub(crate) data_len: usize,
}

/// Where a request's response data may go: the caller's buffer, lent until the response.
#[derive(Clone, Copy)]
pub(crate) struct Destination {
    pub(crate) pointer: *mut u8,
    pub(crate) len: usize,
}

/// What a request in flight lent.
struct Lending {
    destination: Option<Destination>,
    /// The server may access this request's memory by RMA until it answers.
    exposed: bool,
    /// Registrations of that memory, kept until the response.
    _regions: Vec<Arc<MemoryRegion>>,
}

/// A client connection as the engine sees it.
pub(crate) struct ClientSide {
    pub(crate) inbox: Arc<Inbox<Received>>,
    /// Requests in flight that lent a destination or memory, by request id.
    lent: HashMap<u64, Lending>,
    /// Whether large data moves by RMA (decided when the handshake completed).
    rma: bool,
}

impl State {
    /// Hands a response to its connection's inbox (its data into the lent destination if it
    /// fits); a malformed one ends the connection.
    pub(crate) fn route_response(&mut self, key: usize, message: IncomingMessage) {
        if let Err(reason) = self.deliver_response(key, &message) {
            self.close_link(key, &reason, false);
        }
    }

    fn deliver_response(&mut self, key: usize, message: &IncomingMessage) -> Result<(), String> {
        let header = ResponseHeader::decode(message.header(), message.len()).map_err(|error| format!("a malformed response: {error}"))?;
        let payload = message.data().ok_or("a response sent by rendezvous (eager was asked for)")?;
        let Some(Link { side: Side::Client(client), .. }) = self.links.get_mut(&key) else { return Ok(()) };
        let lending = client.lent.remove(&header.frame.request_id);
        let (body, data) = payload.split_at(header.frame.body_len as usize);
        let data_len = header.frame.data_len as usize;
        let mut received = Received { frame: header.frame, body: body.to_vec(), data: Vec::new(), data_len };
        let (destination, exposed) = lending.map_or((None, false), |lending| (lending.destination, lending.exposed));
        match destination {
            Some(destination) if header.placed && exposed && data_len <= destination.len => {}
            _ if header.placed => return Err(format!("{data_len} bytes placed in memory the request did not lend")),
            Some(destination) if data.len() <= destination.len => {
                // SAFETY: the destination is lent until its request is answered or forgotten,
                // both of which happen under the engine's lock held here.
                let buffer = unsafe { std::slice::from_raw_parts_mut(destination.pointer, destination.len) };
                buffer[..data.len()].copy_from_slice(data);
            }
            _ => received.data = data.to_vec(),
        }
        client.inbox.push(received);
        Ok(())
    }
}

/// How often a connection being wired up is progressed.
const CONNECT_POLL: Duration = Duration::from_micros(50);
/// A send UCX has not finished is progressed this many times at once (a large message over
/// a live connection finishes within them), then every [`SEND_POLL`].
const SEND_SPINS: u32 = 1000;
const SEND_POLL: Duration = Duration::from_micros(100);

/// One UCX connection of this process to a server.
pub(crate) struct Channel {
    engine: Arc<Engine>,
    key: usize,
    inbox: Arc<Inbox<Received>>,
    /// How long a wait for a response progresses before it sleeps.
    spin: Duration,
}

fn broken(reason: &str) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, reason.to_string())
}

impl Channel {
    /// Starts connecting to the UCX listener at `address` (`host:port`); a failure shows when
    /// the first response is awaited.
    pub(crate) fn connect(address: &str, spin: Duration) -> io::Result<Channel> {
        let engine = process_engine().map_err(io_error)?;
        let socket = resolve(address)?;
        let inbox = Inbox::new(Watch::Sleepers)?;
        let key = {
            let mut state = engine.lock();
            let endpoint = state.worker.connect(socket).map_err(io_error)?;
            let side = Side::Client(ClientSide { inbox: inbox.clone(), lent: HashMap::new(), rma: false });
            state.add_link(endpoint, side)
        };
        Ok(Channel { engine, key, inbox, spin })
    }

    /// Waits until UCX has wired the connection up (its lanes chosen and connected), or it
    /// failed, or `deadline` passed. A message sent before that is replayed on the final lanes
    /// later, and UCX 1.13 then fails some small ones over shared memory ("Invalid
    /// am_short_iov length: 114 (expected: <= 100)").
    pub(crate) fn wait_connected(&self, deadline: Instant) -> io::Result<()> {
        let mut state = self.engine.lock();
        let flush = match state.links.get(&self.key) {
            Some(link) => link.endpoint.flush().map_err(io_error)?,
            None => return Err(broken("the connection was closed")),
        };
        // (`flush` is only touched, and dropped, with the lock held: it is declared after it.)
        loop {
            state.progress();
            let Some(link) = state.links.get(&self.key) else {
                // Closed during the progress (its endpoint failed): say why.
                let reason = self.inbox.with(|queue| queue.closed.clone());
                return Err(broken(reason.as_deref().unwrap_or("the connection was closed")));
            };
            if let Some(failure) = link.endpoint.failure() {
                return Err(io_error(failure));
            }
            if flush.is_complete() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "UCX did not connect in time"));
            }
            MutexGuard::unlocked(&mut state, || std::thread::sleep(CONNECT_POLL));
        }
    }

    /// Called once the handshake is answered (UCX has chosen the connection's lanes): from now
    /// on large data moves by RMA if [`Settings::bulk`] says so for these lanes.
    pub(crate) fn handshake_done(&self) {
        let mut state = self.engine.lock();
        let bulk = state.settings.bulk;
        if let Some(Link { endpoint, side: Side::Client(client) }) = state.links.get_mut(&self.key) {
            client.rma = match bulk {
                BulkTransfer::Rma => true,
                BulkTransfer::Inline => false,
                BulkTransfer::Auto => endpoint.has_native_rma(),
            };
        }
    }

    /// Sends a request frame. Data at least the RMA threshold long, and a `destination` as
    /// long, are lent to the server by RMA where the connection moves data so (never for
    /// one-way requests, id 0); smaller data travels in the message. Gives up (and closes the
    /// connection) if UCX has not taken the message by `deadline`.
    pub(crate) fn send(
        &self,
        frame: FrameHeader,
        body: &[u8],
        data: &[u8],
        destination: Option<Destination>,
        deadline: Instant,
    ) -> io::Result<()> {
        let mut state = self.engine.lock();
        let threshold = state.settings.rma_threshold;
        let wants_rma = match state.links.get(&self.key) {
            Some(Link { side: Side::Client(client), .. }) => client.rma && frame.request_id != 0,
            _ => return Err(broken("the connection was closed")),
        };
        let cache = wants_rma.then(|| state.cache());
        let mut regions = Vec::new();
        let mut describe = |memory: &[u8]| -> io::Result<Option<Descriptor>> {
            let Some(cache) = &cache else { return Ok(None) };
            if memory.len() < threshold {
                return Ok(None);
            }
            let region = cache.register(memory).map_err(io_error)?;
            let descriptor = Descriptor { address: memory.as_ptr() as u64, length: memory.len() as u64, key: region.pack_key().to_vec() };
            regions.push(region);
            Ok(Some(descriptor))
        };
        let source = describe(data)?;
        let placed = match destination {
            // SAFETY: the caller lends the destination for the life of the request.
            Some(lent) => describe(unsafe { std::slice::from_raw_parts(lent.pointer, lent.len) })?,
            None => None,
        };
        let header = RequestHeader { frame, source, destination: placed, eager_reply: true };
        let mut header_bytes = Vec::with_capacity(64);
        header.encode(&mut header_bytes);
        let inline = &data[..header.inline_data()];
        let Some(Link { endpoint, side: Side::Client(client) }) = state.links.get_mut(&self.key) else {
            return Err(broken("the connection was closed"));
        };
        if frame.request_id != 0 && (destination.is_some() || !regions.is_empty()) {
            let lending = Lending { destination, exposed: !regions.is_empty(), _regions: regions };
            client.lent.insert(frame.request_id, lending);
        }
        let endpoint = endpoint.clone();
        // SAFETY: the buffers outlive `sending`: this function returns only once UCX has
        // completed it, or let go of them when it was given up.
        let sending = unsafe { endpoint.send_parts_borrowed(REQUEST, &header_bytes, &[body, inline], true) };
        // (`endpoint` and `sending` are only touched, and dropped, with the lock held.)
        let error = match sending {
            Ok(sending) => match Self::finish_sending(&mut state, &endpoint, &sending, deadline) {
                Ok(()) => return Ok(()),
                Err(error) => error,
            },
            Err(error) => error,
        };
        state.close_link(self.key, &format!("sending failed: {error}"), false);
        Err(io_error(error))
    }

    /// Waits until UCX has sent `sending` (usually at once: small messages are copied out),
    /// letting the process's other threads use the worker meanwhile — a large message to a
    /// peer that stopped reading waits for it, and must not hold up the other connections
    /// and servers of the process, which share the worker. Gives it up at `deadline`.
    fn finish_sending(
        state: &mut MutexGuard<'_, State>,
        endpoint: &ringfs_ucx::Endpoint,
        sending: &ringfs_ucx::Operation<()>,
        deadline: Instant,
    ) -> Result<(), ringfs_ucx::Error> {
        let started = Instant::now();
        let mut rounds = 0u32;
        loop {
            if let Some(result) = sending.result() {
                return result;
            }
            if endpoint.failure().is_some() {
                return Err(endpoint.give_up_borrowed(sending));
            }
            if Instant::now() >= deadline {
                endpoint.give_up_borrowed(sending);
                let timeout_ms = deadline.saturating_duration_since(started).as_millis() as u64;
                return Err(ringfs_ucx::Error::Timeout { operation: "sending a request", timeout_ms });
            }
            rounds += 1;
            MutexGuard::unlocked(state, || if rounds < SEND_SPINS { std::thread::yield_now() } else { std::thread::sleep(SEND_POLL) });
            state.progress();
        }
    }

    /// The next response routed to this connection, waiting at most `wait`; `Err` with the
    /// reason once the connection ended and every response was taken.
    pub(crate) fn receive(&self, wait: Duration) -> Result<Option<Received>, String> {
        let deadline = Instant::now() + wait;
        self.engine.wait_until(&self.inbox, deadline, self.spin);
        self.inbox.with(|queue| match queue.items.pop_front() {
            Some(received) => Ok(Some(received)),
            None => queue.closed.clone().map_or(Ok(None), Err),
        })
    }

    /// Whether the engine has closed the connection (its endpoint failed, or it broke the
    /// protocol): known without sending, as soon as any thread of the process progressed
    /// the worker after the failure.
    pub(crate) fn is_closed(&self) -> bool {
        self.inbox.with(|queue| queue.closed.is_some())
    }

    /// Forgets request `request_id` (given up: timed out or dropped): its response will not
    /// touch the destination it lent. True if it had lent memory to the server, which closed
    /// the connection (nothing else can keep a late RMA access away from that memory).
    pub(crate) fn forget(&self, request_id: u64) -> bool {
        let mut state = self.engine.lock();
        let Some(Link { side: Side::Client(client), .. }) = state.links.get_mut(&self.key) else { return false };
        let exposed = client.lent.remove(&request_id).is_some_and(|lending| lending.exposed);
        if exposed {
            state.close_link(self.key, "a request that lent memory to the server was given up", false);
        }
        exposed
    }

    /// Closes the connection (after what was sent on it has left).
    pub(crate) fn close(&self) {
        self.engine.lock().close_link(self.key, "closed by the client", true);
    }

    /// The UCX transports the connection uses, e.g. `tcp/lo (am, rma)`.
    pub(crate) fn lanes(&self) -> String {
        match self.engine.lock().links.get(&self.key) {
            Some(link) => describe_lanes(&link.endpoint.lanes()),
            None => "closed".into(),
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.close();
    }
}
