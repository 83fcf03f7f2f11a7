//! The worker: one thread's UCX progress engine, its event file descriptor, and the active
//! messages it has received.
//!
//! UCX calls back into this module from inside `ucp_worker_progress` (an active message
//! arrived, an endpoint failed, a connection request came in). The callbacks only record what
//! happened (a queue entry, a failure status); the owner of the worker acts on it after
//! [`Worker::progress`] returns. No `RefCell` borrow is ever held across a call into UCX, so a
//! callback can always take one.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::ptr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::context::Context;
use crate::endpoint::{self, Endpoint, Listener};
use crate::memory::MemoryRegion;
use crate::operation::{Anchors, Operation};
use crate::sys::{self, Functions};
use crate::{Error, check};

/// How long a wait spins before sleeping, unless [`Worker::set_spin`] says otherwise.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// A UCX worker, owned by the thread that created it. Cheap to clone (a shared handle).
#[derive(Clone)]
pub struct Worker {
    pub(crate) inner: Rc<WorkerInner>,
}

/// Failure status of one endpoint, written by UCX's error callback.
#[derive(Default)]
pub(crate) struct EndpointState {
    pub(crate) failure: Cell<Option<sys::ucs_status_t>>,
}

/// A request whose owner went away before UCX finished with it: its buffers stay here until
/// the request completes.
struct Orphan {
    request: *mut c_void,
    _keep: Box<dyn Any>,
}

/// The argument of one active-message handler: the worker and the message id.
struct HandlerArgument {
    worker: *const WorkerInner,
    id: u16,
}

pub(crate) struct WorkerInner {
    pub(crate) context: Context,
    pub(crate) handle: sys::ucp_worker_h,
    pub(crate) functions: &'static Functions,
    event_fd: RawFd,
    spin: Cell<Duration>,
    messages: RefCell<VecDeque<RawMessage>>,
    /// Endpoints by UCX handle, for the error callback (which only gets the handle).
    pub(crate) endpoints: RefCell<HashMap<usize, Rc<EndpointState>>>,
    /// Keys of endpoints that failed since [`Worker::take_failed_endpoints`] was last called.
    failed: RefCell<Vec<usize>>,
    orphans: RefCell<Vec<Orphan>>,
    /// Boxed: UCX keeps their addresses, which must not move when the vector grows.
    #[allow(clippy::vec_box, reason = "the boxes give the handler arguments stable addresses")]
    handlers: RefCell<Vec<Box<HandlerArgument>>>,
}

/// How the payload of a received active message can be reached.
enum Payload {
    /// Copied out of UCX's buffer during the callback.
    Copied(Vec<u8>),
    /// Held in UCX's receive buffer until released (`ucp_am_data_release`).
    Held { descriptor: *mut c_void, length: usize },
    /// Still at the sender: fetched by `ucp_am_recv_data_nbx` (rendezvous protocol).
    Rendezvous { descriptor: *mut c_void, length: usize },
}

struct RawMessage {
    id: u16,
    reply_endpoint: sys::ucp_ep_h,
    header: Vec<u8>,
    payload: Payload,
}

impl Worker {
    /// Creates a worker for the calling thread.
    pub fn new(context: &Context) -> Result<Worker, Error> {
        Self::with_thread_mode(context, sys::UCS_THREAD_MODE_SINGLE)
    }

    /// Creates a worker that several threads use one at a time: its owner keeps the worker and
    /// everything made from it (endpoints, operations, messages) inside one lock and never
    /// lets a clone out of it, so every call into UCX is serialized by that lock.
    pub fn new_serialized(context: &Context) -> Result<Worker, Error> {
        Self::with_thread_mode(context, sys::UCS_THREAD_MODE_SERIALIZED)
    }

    fn with_thread_mode(context: &Context, thread_mode: sys::ucs_thread_mode_t) -> Result<Worker, Error> {
        let functions = context.inner.functions;
        // SAFETY: plain data; zero leaves every optional field unset.
        let mut params: sys::ucp_worker_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        params.thread_mode = thread_mode;
        let mut handle: sys::ucp_worker_h = ptr::null_mut();
        // SAFETY: valid context and params; UCX writes the handle.
        check("ucp_worker_create", unsafe { (functions.ucp_worker_create)(context.inner.handle, &params, &mut handle) })?;
        let mut event_fd: RawFd = -1;
        // SAFETY: valid worker; UCX writes the descriptor.
        if let Err(error) = check("ucp_worker_get_efd", unsafe { (functions.ucp_worker_get_efd)(handle, &mut event_fd) }) {
            // SAFETY: the worker was just created and has nothing attached.
            unsafe { (functions.ucp_worker_destroy)(handle) };
            return Err(error);
        }
        Ok(Worker {
            inner: Rc::new(WorkerInner {
                context: context.clone(),
                handle,
                functions,
                event_fd,
                spin: Cell::new(DEFAULT_SPIN),
                messages: RefCell::new(VecDeque::new()),
                endpoints: RefCell::new(HashMap::new()),
                failed: RefCell::new(Vec::new()),
                orphans: RefCell::new(Vec::new()),
                handlers: RefCell::new(Vec::new()),
            }),
        })
    }

    /// The context this worker belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.context
    }

    /// Lets UCX make progress (send, receive, call back); returns the number of events it
    /// handled (0: nothing was pending).
    pub fn progress(&self) -> usize {
        self.inner.progress()
    }

    /// Makes the event descriptor readable (from any thread): a thread sleeping on it wakes,
    /// and the next [`Worker::arm`] reports events pending.
    pub fn signal(&self) -> Result<(), Error> {
        // SAFETY: valid worker; ucp_worker_signal may be called from any thread.
        check("ucp_worker_signal", unsafe { (self.inner.functions.ucp_worker_signal)(self.inner.handle) })
    }

    /// The keys ([`Endpoint::key`]) of endpoints that failed since the last call: their peer
    /// died or became unreachable (reported by UCX during [`Worker::progress`]).
    pub fn take_failed_endpoints(&self) -> Vec<usize> {
        std::mem::take(&mut *self.inner.failed.borrow_mut())
    }

    /// The descriptor that becomes readable when the worker has events; see [`Worker::wait`].
    pub fn event_fd(&self) -> RawFd {
        self.inner.event_fd
    }

    /// Arms the event descriptor. `Ok(true)`: armed, safe to sleep on [`Worker::event_fd`];
    /// `Ok(false)`: events are pending, call [`Worker::progress`] first.
    pub fn arm(&self) -> Result<bool, Error> {
        // SAFETY: valid worker.
        match unsafe { (self.inner.functions.ucp_worker_arm)(self.inner.handle) } {
            sys::UCS_OK => Ok(true),
            sys::UCS_ERR_BUSY => Ok(false),
            status => Err(Error::status("ucp_worker_arm", status)),
        }
    }

    /// Sleeps until the worker has events or `timeout` passes, without spinning: arms the
    /// event descriptor and polls it. Returns at once if events are already pending. The caller
    /// then calls [`Worker::progress`].
    pub fn wait(&self, timeout: Duration) -> Result<(), Error> {
        if !self.arm()? {
            return Ok(());
        }
        let mut descriptor = libc::pollfd { fd: self.inner.event_fd, events: libc::POLLIN, revents: 0 };
        let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut descriptor, 1, timeout_ms) };
        if ready < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::Invalid(format!("poll on the UCX event descriptor: {error}")));
            }
        }
        Ok(())
    }

    /// How long waits spin (progressing without sleeping) after the last event before they
    /// sleep on the event descriptor; see [`Worker::set_spin`].
    pub fn spin(&self) -> Duration {
        self.inner.spin.get()
    }

    /// Sets the spin time of waits ([`DEFAULT_SPIN`] at first). Spinning picks up a reply that
    /// comes soon without the cost of a sleep and a wake-up, and burns the CPU meanwhile.
    pub fn set_spin(&self, spin: Duration) {
        self.inner.spin.set(spin);
    }

    /// Progresses until `done` says so or `deadline` passes: spins for [`Worker::spin`] after
    /// the last event, then sleeps on the event descriptor. `Ok(false)` when the deadline
    /// passed first.
    pub fn progress_until(&self, deadline: Instant, mut done: impl FnMut() -> bool) -> Result<bool, Error> {
        let spin = self.inner.spin.get();
        let mut last_event = Instant::now();
        loop {
            if self.progress() > 0 {
                last_event = Instant::now();
            }
            if done() {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            if now.duration_since(last_event) >= spin {
                self.wait((deadline - now).min(Duration::from_millis(100)))?;
                last_event = Instant::now();
            }
        }
    }

    /// Listens for connections on `address` (port 0 picks a free port).
    pub fn listen(&self, address: SocketAddr) -> Result<Listener, Error> {
        endpoint::listen(self, address)
    }

    /// Connects to a [`Listener`] at `address`. The connection is made in the background:
    /// a failure shows on the endpoint (and on its operations) after some progress.
    pub fn connect(&self, address: SocketAddr) -> Result<Endpoint, Error> {
        endpoint::connect(self, address)
    }

    /// This worker's UCX address: every transport it can be reached by. A peer that has it
    /// connects with [`Worker::connect_to_address`] (ringfs passes it over the TCP connection
    /// that carries the handshake).
    pub fn address(&self) -> Result<Vec<u8>, Error> {
        let mut address: *mut c_void = ptr::null_mut();
        let mut length: libc::size_t = 0;
        // SAFETY: valid worker; UCX allocates the address, released once after the copy.
        check("ucp_worker_get_address", unsafe {
            (self.inner.functions.ucp_worker_get_address)(self.inner.handle, &mut address, &mut length)
        })?;
        // SAFETY: UCX wrote `length` bytes at `address`.
        let bytes = unsafe { std::slice::from_raw_parts(address.cast::<u8>(), length) }.to_vec();
        // SAFETY: the address came from ucp_worker_get_address of this worker.
        unsafe { (self.inner.functions.ucp_worker_release_address)(self.inner.handle, address) };
        Ok(bytes)
    }

    /// Connects to the worker whose [`Worker::address`] is `address`.
    pub fn connect_to_address(&self, address: &[u8], peer: &str) -> Result<Endpoint, Error> {
        endpoint::connect_to_address(self, address, peer)
    }

    /// Delivers active messages with `id` to this worker's queue ([`Worker::next_message`]).
    pub fn accept_messages(&self, id: u16) -> Result<(), Error> {
        let argument = Box::new(HandlerArgument { worker: Rc::as_ptr(&self.inner), id });
        let param = sys::ucp_am_handler_param_t {
            field_mask: sys::UCP_AM_HANDLER_PARAM_FIELD_ID
                | sys::UCP_AM_HANDLER_PARAM_FIELD_FLAGS
                | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
                | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG,
            id: id as u32,
            flags: sys::UCP_AM_FLAG_WHOLE_MSG,
            cb: Some(message_arrived),
            arg: (&*argument as *const HandlerArgument).cast_mut().cast(),
        };
        // SAFETY: valid worker; the argument lives in `handlers` as long as the worker.
        check("ucp_worker_set_am_recv_handler", unsafe {
            (self.inner.functions.ucp_worker_set_am_recv_handler)(self.inner.handle, &param)
        })?;
        self.inner.handlers.borrow_mut().push(argument);
        Ok(())
    }

    /// The oldest received active message not taken yet.
    pub fn next_message(&self) -> Option<IncomingMessage> {
        let raw = self.inner.messages.borrow_mut().pop_front()?;
        Some(IncomingMessage { worker: self.inner.clone(), raw: Some(raw) })
    }

    /// True if received messages wait in the queue.
    pub fn has_messages(&self) -> bool {
        !self.inner.messages.borrow().is_empty()
    }

    /// Gives back a payload taken with [`IncomingMessage::into_held`] to UCX (on the
    /// worker's thread, or under the lock that serializes it).
    pub fn release(&self, payload: HeldPayload) {
        release_payload(self.inner.functions, self.inner.handle, &Payload::Held { descriptor: payload.descriptor, length: payload.length });
    }

    /// Number of requests still owned by the worker because their owners let go early.
    pub fn orphan_count(&self) -> usize {
        self.inner.orphans.borrow().len()
    }
}

impl WorkerInner {
    fn progress(&self) -> usize {
        // SAFETY: valid worker, used on its own thread (Worker is !Send).
        let events = unsafe { (self.functions.ucp_worker_progress)(self.handle) } as usize;
        if !self.orphans.borrow().is_empty() {
            self.reap_orphans();
        }
        events
    }

    fn reap_orphans(&self) {
        let finished: Vec<Orphan> = {
            let mut orphans = self.orphans.borrow_mut();
            let (finished, waiting) = orphans.drain(..).partition(|orphan| {
                // SAFETY: the request is live (not freed yet).
                unsafe { (self.functions.ucp_request_check_status)(orphan.request) != sys::UCS_INPROGRESS }
            });
            *orphans = waiting;
            finished
        };
        for orphan in finished {
            // SAFETY: completed request, freed once; its buffers drop after.
            unsafe { (self.functions.ucp_request_free)(orphan.request) };
        }
    }

    /// Keeps `keep` alive until `request` completes, then frees both.
    pub(crate) fn adopt(&self, request: *mut c_void, keep: Box<dyn Any>) {
        self.orphans.borrow_mut().push(Orphan { request, _keep: keep });
    }

    /// Starts a non-blocking operation: `start` receives the request parameters and returns
    /// UCX's status pointer.
    pub(crate) fn operation<B: 'static>(
        self: &Rc<Self>,
        name: &'static str,
        region: Option<&MemoryRegion>,
        flags: u32,
        buffer: Option<B>,
        anchors: Anchors,
        start: impl FnOnce(&mut sys::ucp_request_param_t) -> sys::ucs_status_ptr_t,
    ) -> Result<Operation<B>, Error> {
        // SAFETY: plain data; zero means no callback and no optional field.
        let mut param: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        if flags != 0 {
            param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_FLAGS;
            param.flags = flags;
        }
        if let Some(region) = region {
            param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_MEMH;
            param.memh = region.handle();
        }
        let pointer = start(&mut param);
        Operation::started(self.clone(), name, pointer, buffer, anchors)
    }
}

/// UCX's active-message callback: records the message for [`Worker::next_message`].
unsafe extern "C" fn message_arrived(
    argument: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: the argument is the HandlerArgument registered with this callback, which lives
    // as long as the worker; UCX only calls back from inside progress on the worker's thread.
    let argument = unsafe { &*(argument as *const HandlerArgument) };
    // SAFETY: as above; the worker outlives its handlers.
    let worker = unsafe { &*argument.worker };
    // SAFETY: UCX passes a valid parameter struct.
    let param = unsafe { &*param };
    let header = if header_length == 0 || header.is_null() {
        Vec::new()
    } else {
        // SAFETY: UCX passes header_length readable bytes, valid during the callback.
        unsafe { std::slice::from_raw_parts(header.cast::<u8>(), header_length) }.to_vec()
    };
    let (payload, status) = if param.recv_attr & sys::UCP_AM_RECV_ATTR_FLAG_RNDV != 0 {
        (Payload::Rendezvous { descriptor: data, length }, sys::UCS_INPROGRESS)
    } else if param.recv_attr & sys::UCP_AM_RECV_ATTR_FLAG_DATA != 0 && length > 0 {
        (Payload::Held { descriptor: data, length }, sys::UCS_INPROGRESS)
    } else if length == 0 || data.is_null() {
        (Payload::Copied(Vec::new()), sys::UCS_OK)
    } else {
        // SAFETY: `length` bytes at `data`, valid during the callback.
        (Payload::Copied(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), length) }.to_vec()), sys::UCS_OK)
    };
    let reply_endpoint = if param.recv_attr & sys::UCP_AM_RECV_ATTR_FIELD_REPLY_EP != 0 { param.reply_ep } else { ptr::null_mut() };
    worker.messages.borrow_mut().push_back(RawMessage { id: argument.id, reply_endpoint, header, payload });
    status
}

/// UCX's endpoint error callback: marks the endpoint failed.
pub(crate) unsafe extern "C" fn endpoint_failed(argument: *mut c_void, endpoint: sys::ucp_ep_h, status: sys::ucs_status_t) {
    // SAFETY: the argument is the worker's WorkerInner (registered with every endpoint it
    // creates); the worker outlives its endpoints.
    let worker = unsafe { &*(argument as *const WorkerInner) };
    match worker.endpoints.try_borrow() {
        Ok(endpoints) => {
            if let Some(state) = endpoints.get(&(endpoint as usize)) {
                state.failure.set(Some(status));
                if let Ok(mut failed) = worker.failed.try_borrow_mut() {
                    failed.push(endpoint as usize);
                }
            }
        }
        Err(_) => log::error!("UCX endpoint error callback re-entered the endpoint table; failure {status} not recorded"),
    }
}

impl Drop for WorkerInner {
    fn drop(&mut self) {
        // Give closing endpoints and orphaned requests a moment to finish cleanly, then let
        // ucp_worker_destroy purge the rest; buffers are freed only after UCX is gone.
        let deadline = Instant::now() + Duration::from_millis(500);
        while !self.orphans.borrow().is_empty() && Instant::now() < deadline {
            self.progress();
        }
        for message in self.messages.get_mut().drain(..) {
            release_payload(self.functions, self.handle, &message.payload);
        }
        // SAFETY: valid worker; nothing uses it after this (every handle that refers to it
        // holds this WorkerInner alive, and it is being dropped).
        unsafe { (self.functions.ucp_worker_destroy)(self.handle) };
        // The requests went with the worker; only their buffers are left to drop.
        self.orphans.get_mut().clear();
    }
}

fn release_payload(functions: &Functions, worker: sys::ucp_worker_h, payload: &Payload) {
    if let Payload::Held { descriptor, .. } | Payload::Rendezvous { descriptor, .. } = payload {
        // SAFETY: a descriptor UCX handed over with UCS_INPROGRESS, released once.
        unsafe { (functions.ucp_am_data_release)(worker, *descriptor) };
    }
}

/// A received payload taken out of its message ([`IncomingMessage::into_held`]) and still in
/// UCX's receive buffer, readable without a copy by any thread until it is given back with
/// [`Worker::release`]. Dropping it instead leaks the buffer until the worker is destroyed.
pub struct HeldPayload {
    descriptor: *mut c_void,
    length: usize,
}

// SAFETY: the bytes are UCX's receive buffer, which UCX neither moves nor touches until the
// payload is released, and which this type only reads; releasing goes through the worker.
unsafe impl Send for HeldPayload {}
// SAFETY: as above: shared references only read the bytes.
unsafe impl Sync for HeldPayload {}

impl HeldPayload {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: UCX keeps `length` bytes at the descriptor until the payload is released,
        // which takes the payload by value.
        unsafe { std::slice::from_raw_parts(self.descriptor.cast::<u8>(), self.length) }
    }
}

/// An active message taken from a worker's queue.
pub struct IncomingMessage {
    worker: Rc<WorkerInner>,
    raw: Option<RawMessage>,
}

impl IncomingMessage {
    fn raw(&self) -> &RawMessage {
        self.raw.as_ref().expect("a message's contents are present until it is consumed")
    }

    /// The active-message id it was sent with.
    pub fn id(&self) -> u16 {
        self.raw().id
    }

    /// The user header (always delivered with the message).
    pub fn header(&self) -> &[u8] {
        &self.raw().header
    }

    /// The payload length.
    pub fn len(&self) -> usize {
        match &self.raw().payload {
            Payload::Copied(bytes) => bytes.len(),
            Payload::Held { length, .. } | Payload::Rendezvous { length, .. } => *length,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The payload, if it has arrived (`None`: a rendezvous payload, fetch it with
    /// [`IncomingMessage::receive`]).
    pub fn data(&self) -> Option<&[u8]> {
        match &self.raw().payload {
            Payload::Copied(bytes) => Some(bytes),
            // SAFETY: UCX keeps `length` bytes at the descriptor until it is released (on drop).
            Payload::Held { descriptor, length } => Some(unsafe { std::slice::from_raw_parts(descriptor.cast::<u8>(), *length) }),
            Payload::Rendezvous { .. } => None,
        }
    }

    /// Identifies the endpoint the message came through (the sender's connection), as
    /// [`Endpoint::key`] does; 0 if the sender asked for no reply endpoint.
    pub fn endpoint_key(&self) -> usize {
        self.raw().reply_endpoint as usize
    }

    /// The payload, taken out of the message without a copy, if UCX holds it in its receive
    /// buffer (`Err(self)`: it was copied out, or it is a rendezvous payload).
    pub fn into_held(mut self) -> Result<HeldPayload, IncomingMessage> {
        match self.raw.take() {
            Some(RawMessage { payload: Payload::Held { descriptor, length }, .. }) => Ok(HeldPayload { descriptor, length }),
            raw => {
                self.raw = raw;
                Err(self)
            }
        }
    }

    /// Fetches a rendezvous payload (or copies an arrived one) into `buffer`, which must hold
    /// [`IncomingMessage::len`] bytes; the operation returns the buffer.
    pub fn receive(mut self, mut buffer: Vec<u8>, region: Option<std::sync::Arc<MemoryRegion>>) -> Result<Operation<Vec<u8>>, Error> {
        let length = self.len();
        if buffer.len() < length {
            return Err(Error::Invalid(format!("a payload of {length} bytes does not fit a buffer of {}", buffer.len())));
        }
        let raw = self.raw.take().expect("a message's contents are present until it is consumed");
        let descriptor = match raw.payload {
            Payload::Rendezvous { descriptor, .. } => descriptor,
            Payload::Copied(bytes) => {
                buffer[..length].copy_from_slice(&bytes);
                return Ok(Operation::finished(self.worker.clone(), buffer));
            }
            Payload::Held { descriptor, length } => {
                // SAFETY: as in data().
                buffer[..length].copy_from_slice(unsafe { std::slice::from_raw_parts(descriptor.cast::<u8>(), length) });
                release_payload(self.worker.functions, self.worker.handle, &Payload::Held { descriptor, length });
                return Ok(Operation::finished(self.worker.clone(), buffer));
            }
        };
        let destination = buffer.as_mut_ptr();
        let anchors = Anchors { region: region.clone(), ..Anchors::default() };
        let worker = self.worker.clone();
        worker.operation("ucp_am_recv_data_nbx", region.as_deref(), 0, Some(buffer), anchors, |param| {
            // SAFETY: the descriptor came with this message and is consumed once; the buffer
            // holds `length` bytes and is owned by the operation until UCX completes it.
            unsafe { (worker.functions.ucp_am_recv_data_nbx)(worker.handle, descriptor, destination.cast(), length, param) }
        })
    }
}

impl Drop for IncomingMessage {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            release_payload(self.worker.functions, self.worker.handle, &raw.payload);
        }
    }
}
