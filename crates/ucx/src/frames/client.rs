//! The client side of the frame transport: one [`Client`] per thread (its worker, its
//! registration cache, the responses that arrived), one [`Connection`] per server.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use ringfs_proto::{FrameHeader, MAX_BODY_LEN, MAX_DATA_LEN};

use super::wire::{Descriptor, RequestHeader, ResponseHeader};
use super::{BulkTransfer, FrameConfig, REQUEST, RESPONSE};
use crate::{Endpoint, Error, IncomingMessage, MemoryRegion, RegistrationCache, Worker};

/// The frame transport's client state of one thread: connections to any number of servers
/// share its worker. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    shared: Rc<ClientShared>,
}

struct ClientShared {
    worker: Worker,
    cache: Arc<RegistrationCache>,
    config: FrameConfig,
    next_request_id: Cell<u64>,
    /// Responses by (endpoint key, request id), taken by the call waiting for them.
    arrived: RefCell<HashMap<(usize, u64), (ResponseHeader, IncomingMessage)>>,
    /// Endpoints whose server broke the protocol, by key.
    broken: RefCell<HashMap<usize, Error>>,
    header: RefCell<Vec<u8>>,
}

/// One request: the frame body, its data section, and where response data should go.
pub struct Request<'a> {
    /// The membership epoch for the frame header.
    pub epoch: u64,
    pub body: &'a [u8],
    pub data: &'a [u8],
    /// Response data up to this buffer's length lands here (by RMA when large enough).
    pub destination: Option<&'a mut [u8]>,
}

/// A response.
#[derive(Debug)]
pub struct Reply {
    pub frame: FrameHeader,
    pub body: Vec<u8>,
    /// The data section, unless it went into the request's destination.
    pub data: Vec<u8>,
    /// Length of the data section (also when it went into the destination).
    pub data_len: usize,
    /// The data section is in the request's destination (the first `data_len` bytes).
    pub in_destination: bool,
}

impl Client {
    /// A client on `worker` (which it makes accept responses), registering buffers in `cache`.
    pub fn new(worker: &Worker, cache: Arc<RegistrationCache>, config: FrameConfig) -> Result<Client, Error> {
        worker.accept_messages(RESPONSE)?;
        Ok(Client {
            shared: Rc::new(ClientShared {
                worker: worker.clone(),
                cache,
                config,
                next_request_id: Cell::new(1),
                arrived: RefCell::new(HashMap::new()),
                broken: RefCell::new(HashMap::new()),
                header: RefCell::new(Vec::new()),
            }),
        })
    }

    /// Connects to a frame server.
    pub fn connect(&self, address: SocketAddr) -> Result<Connection, Error> {
        Ok(Connection { client: self.shared.clone(), endpoint: self.shared.worker.connect(address)?, native_rma: Cell::new(None) })
    }

    pub fn worker(&self) -> &Worker {
        &self.shared.worker
    }
}

impl ClientShared {
    /// Moves received responses from the worker's queue to `arrived`.
    fn collect_responses(&self) {
        while let Some(message) = self.worker.next_message() {
            let endpoint_key = message.endpoint_key();
            match ResponseHeader::decode(message.header(), message.len()) {
                Ok(header) => {
                    self.arrived.borrow_mut().insert((endpoint_key, header.frame.request_id), (header, message));
                }
                Err(error) => {
                    log::debug!("a UCX frame server sent a malformed response: {error}");
                    self.broken.borrow_mut().insert(endpoint_key, error);
                }
            }
        }
    }
}

/// A connection to one frame server.
pub struct Connection {
    client: Rc<ClientShared>,
    endpoint: Endpoint,
    /// Whether the connection's lanes do RMA natively, once known (after the first reply).
    native_rma: Cell<Option<bool>>,
}

/// A request sent and not answered yet; [`PendingCall::wait`] gets its reply. Dropping it
/// waits too, so that the buffers it lent the server are free again when it is gone.
pub struct PendingCall<'a> {
    connection: &'a Connection,
    request_id: u64,
    deadline: Instant,
    destination: Option<(*mut u8, usize)>,
    /// The server may access the caller's memory by RMA until the reply comes.
    exposed: bool,
    /// Registrations of the lent buffers, kept until the reply.
    _regions: Vec<Arc<MemoryRegion>>,
    finished: bool,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl Connection {
    /// Sends `request` and waits for its reply (or the configured timeout).
    pub fn call(&self, request: Request<'_>) -> Result<Reply, Error> {
        // SAFETY: the pending call is waited for here, before the borrows of `request` end.
        unsafe { self.start(request) }?.wait()
    }

    /// Sends `request` without waiting, so that several can be in flight.
    ///
    /// # Safety
    /// The returned call must be waited for or dropped, not leaked (`mem::forget`): the server
    /// may read `request.data` and write `request.destination` until then.
    pub unsafe fn start<'a>(&'a self, request: Request<'a>) -> Result<PendingCall<'a>, Error> {
        self.check()?;
        let client = &self.client;
        let config = client.config;
        if request.body.is_empty() || request.body.len() > MAX_BODY_LEN as usize || request.data.len() > MAX_DATA_LEN as usize {
            return Err(Error::Invalid(format!("a frame with a body of {} and data of {} bytes", request.body.len(), request.data.len())));
        }
        let request_id = client.next_request_id.get();
        client.next_request_id.set(request_id + 1);
        let rma = self.uses_rma();
        let mut regions = Vec::new();
        let mut describe = |memory: &[u8]| -> Result<Option<Descriptor>, Error> {
            if !rma || memory.len() < config.rma_threshold || memory.is_empty() {
                return Ok(None);
            }
            let region = client.cache.register(memory)?;
            let descriptor = Descriptor { address: memory.as_ptr() as u64, length: memory.len() as u64, key: region.pack_key().to_vec() };
            regions.push(region);
            Ok(Some(descriptor))
        };
        let source = describe(request.data)?;
        let destination = match &request.destination {
            Some(buffer) => describe(buffer)?,
            None => None,
        };
        let frame =
            FrameHeader { body_len: request.body.len() as u32, data_len: request.data.len() as u32, request_id, epoch: request.epoch };
        let header = RequestHeader { frame, source, destination, eager_reply: !rma };
        let deadline = Instant::now() + config.timeout;
        {
            let mut header_bytes = client.header.borrow_mut();
            header.encode(&mut header_bytes);
            let parts = [request.body, &request.data[..header.inline_data()]];
            self.endpoint.send_parts_and_wait(REQUEST, &header_bytes, &parts, !rma, deadline)?;
        }
        Ok(PendingCall {
            connection: self,
            request_id,
            deadline,
            destination: request.destination.map(|buffer| (buffer.as_mut_ptr(), buffer.len())),
            exposed: !regions.is_empty(),
            _regions: regions,
            finished: false,
            _borrow: PhantomData,
        })
    }

    /// True if large data of the next request moves by RMA (see [`BulkTransfer`]).
    pub fn uses_rma(&self) -> bool {
        match self.client.config.bulk {
            BulkTransfer::Rma => true,
            BulkTransfer::Inline => false,
            BulkTransfer::Auto => self.native_rma.get().unwrap_or(false),
        }
    }

    /// The endpoint (for its transports, [`Endpoint::describe`]).
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// `Err` if the connection is unusable (the server failed or broke the protocol).
    pub fn check(&self) -> Result<(), Error> {
        if let Some(failure) = self.endpoint.failure() {
            return Err(failure);
        }
        match self.client.broken.borrow().get(&self.endpoint.key()) {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }
}

impl PendingCall<'_> {
    /// Waits for the reply.
    pub fn wait(mut self) -> Result<Reply, Error> {
        self.finish()
    }

    fn finish(&mut self) -> Result<Reply, Error> {
        self.finished = true;
        let connection = self.connection;
        let client = &connection.client;
        let key = (connection.endpoint.key(), self.request_id);
        client.worker.progress_until(self.deadline, || {
            client.collect_responses();
            client.arrived.borrow().contains_key(&key) || connection.check().is_err()
        })?;
        let arrived = client.arrived.borrow_mut().remove(&key);
        let Some((header, message)) = arrived else {
            // No reply in time, or the connection failed: the server must not touch the lent
            // buffers after this returns, and a late reply must not be mistaken for another.
            let error = connection
                .check()
                .err()
                .unwrap_or(Error::Timeout { operation: "frame call", timeout_ms: client.config.timeout.as_millis() as u64 });
            connection.endpoint.close();
            return Err(error);
        };
        if connection.native_rma.get().is_none() {
            connection.native_rma.set(Some(connection.endpoint.has_native_rma()));
        }
        self.read_reply(header, message)
    }

    fn read_reply(&mut self, header: ResponseHeader, message: IncomingMessage) -> Result<Reply, Error> {
        let data_len = header.frame.data_len as usize;
        let body_len = header.frame.body_len as usize;
        let destination_len = self.destination.map_or(0, |(_, length)| length);
        if header.placed && (!self.exposed || data_len > destination_len) {
            self.connection.endpoint.close();
            return Err(Error::Protocol(format!("{data_len} bytes placed in a destination of {destination_len}")));
        }
        let payload = match message.data() {
            Some(_) => message,
            None => return self.read_rendezvous_reply(header, message),
        };
        let bytes = payload.data().expect("an arrived payload");
        let (body, data) = bytes.split_at(body_len);
        let mut reply = Reply { frame: header.frame, body: body.to_vec(), data: Vec::new(), data_len, in_destination: header.placed };
        if !header.placed {
            self.deliver(data, &mut reply);
        }
        Ok(reply)
    }

    /// A reply whose payload is large enough for UCX's rendezvous protocol (inline data the
    /// destination could not take).
    fn read_rendezvous_reply(&mut self, header: ResponseHeader, message: IncomingMessage) -> Result<Reply, Error> {
        let length = message.len();
        let mut bytes = message.receive(vec![0u8; length], None)?.wait(self.deadline)?;
        let data = bytes.split_off(header.frame.body_len as usize);
        let mut reply = Reply { frame: header.frame, body: bytes, data: Vec::new(), data_len: data.len(), in_destination: false };
        self.deliver(&data, &mut reply);
        Ok(reply)
    }

    /// Puts inline response data into the destination if it fits, else into the reply.
    fn deliver(&mut self, data: &[u8], reply: &mut Reply) {
        match self.destination {
            Some((pointer, length)) if data.len() <= length => {
                // SAFETY: the destination is borrowed mutably for the life of this call.
                let destination = unsafe { std::slice::from_raw_parts_mut(pointer, length) };
                destination[..data.len()].copy_from_slice(data);
                reply.in_destination = true;
            }
            _ => reply.data = data.to_vec(),
        }
    }
}

impl Drop for PendingCall<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.finish();
        }
    }
}
