//! The worker: one thread's UCX progress engine, its event file descriptor, and the active
//! messages it has received.
//!
//! UCX calls back from inside `ucp_worker_progress` (an active message arrived, an endpoint
//! failed, a connection request came in) into the worker's state in `handle.rs` (or the
//! listener's in `endpoint.rs`). The callbacks only record what happened (a queue entry, a
//! failure status); the owner of the worker acts on it after [`Worker::progress`] returns.

use std::ffi::c_void;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::ptr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::context::Context;
use crate::endpoint::{self, Endpoint, Listener};
use crate::handle::{Payload, RawMessage, WorkerInner};
use crate::memory::MemoryRegion;
use crate::operation::{Anchors, Operation};
use crate::sys;
use crate::{Error, check};

/// How long a wait spins before sleeping, unless [`Worker::set_spin`] says otherwise.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// A UCX worker, owned by the thread that created it. Cheap to clone (a shared handle).
#[derive(Clone)]
pub struct Worker {
    pub(crate) inner: Rc<WorkerInner>,
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
        Ok(Worker { inner: WorkerInner::create(context, thread_mode, DEFAULT_SPIN)? })
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
        self.inner.arm()
    }

    /// Sleeps until the worker has events or `timeout` passes, without spinning: arms the
    /// event descriptor and polls it. Returns at once if events are already pending. The caller
    /// then calls [`Worker::progress`].
    pub fn wait(&self, timeout: Duration) -> Result<(), Error> {
        self.inner.wait(timeout)
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
    pub fn progress_until(&self, deadline: Instant, done: impl FnMut() -> bool) -> Result<bool, Error> {
        self.inner.progress_until(deadline, done)
    }

    /// Listens for connections on `address` (port 0 picks a free port).
    pub fn listen(&self, address: SocketAddr) -> Result<Listener, Error> {
        endpoint::listen(&self.inner, address)
    }

    /// Connects to a [`Listener`] at `address`. The connection is made in the background:
    /// a failure shows on the endpoint (and on its operations) after some progress.
    pub fn connect(&self, address: SocketAddr) -> Result<Endpoint, Error> {
        endpoint::connect(&self.inner, address)
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
        endpoint::connect_to_address(&self.inner, address, peer)
    }

    /// Delivers active messages with `id` to this worker's queue ([`Worker::next_message`]).
    pub fn accept_messages(&self, id: u16) -> Result<(), Error> {
        self.inner.accept_messages(id)
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
        self.inner.release(&Payload::Held { descriptor: payload.descriptor, length: payload.length });
    }

    /// Number of requests still owned by the worker because their owners let go early.
    pub fn orphan_count(&self) -> usize {
        self.inner.orphan_count()
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
                self.worker.release(&Payload::Held { descriptor, length });
                return Ok(Operation::finished(self.worker.clone(), buffer));
            }
        };
        let destination = buffer.as_mut_ptr();
        let anchors = Anchors { region: region.clone(), ..Anchors::default() };
        let worker = &self.worker;
        Operation::start(worker, "ucp_am_recv_data_nbx", region.as_deref(), 0, Some(buffer), anchors, |param| {
            // SAFETY: the descriptor came with this message and is consumed once; the buffer
            // holds `length` bytes and is owned by the operation until UCX completes it.
            unsafe { (worker.functions.ucp_am_recv_data_nbx)(worker.handle, descriptor, destination.cast(), length, param) }
        })
    }
}

impl Drop for IncomingMessage {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            self.worker.release(&raw.payload);
        }
    }
}
