//! The handle layer under the safe API: a worker's state ([`WorkerInner`]: its UCX handle,
//! progress loop, received-message queue, requests orphaned by their owners) and an
//! endpoint's ([`EndpointShared`]: its UCX handle and failure status), with the callbacks UCX
//! makes into them. `worker`, `endpoint`, `memory` and `operation` build on these; nothing
//! here names them.
//!
//! UCX calls back into this module from inside `ucp_worker_progress` (an active message
//! arrived, an endpoint failed). The callbacks only record what happened (a queue entry, a
//! failure status); the owner of the worker acts on it after [`WorkerInner::progress`]
//! returns. No `RefCell` borrow is ever held across a call into UCX, so a callback can always
//! take one. Handles keep what they use alive: an endpoint, a remote key, an operation or a
//! message holds an `Rc` of its worker's state, so the worker is destroyed last.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::os::fd::RawFd;
use std::ptr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::context::Context;
use crate::sys::{self, Functions};
use crate::{Error, check};

/// A worker's state, shared by the [`crate::Worker`] handles and by everything made from the
/// worker (endpoints, listeners, operations, messages), which keep it alive.
pub(crate) struct WorkerInner {
    pub(crate) context: Context,
    pub(crate) handle: sys::ucp_worker_h,
    pub(crate) functions: &'static Functions,
    pub(crate) event_fd: RawFd,
    /// How long waits spin after the last event before they sleep.
    pub(crate) spin: Cell<Duration>,
    /// Received active messages not taken yet, oldest first.
    pub(crate) messages: RefCell<VecDeque<RawMessage>>,
    /// Endpoints by UCX handle, for the error callback (which only gets the handle).
    endpoints: RefCell<HashMap<usize, Rc<EndpointState>>>,
    /// Keys of endpoints that failed since the owner last took them.
    pub(crate) failed: RefCell<Vec<usize>>,
    orphans: RefCell<Vec<Orphan>>,
    /// Boxed: UCX keeps their addresses, which must not move when the vector grows.
    #[allow(clippy::vec_box, reason = "the boxes give the handler arguments stable addresses")]
    handlers: RefCell<Vec<Box<HandlerArgument>>>,
}

/// Failure status of one endpoint, written by UCX's error callback.
#[derive(Default)]
struct EndpointState {
    failure: Cell<Option<sys::ucs_status_t>>,
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

/// How the payload of a received active message can be reached.
pub(crate) enum Payload {
    /// Copied out of UCX's buffer during the callback.
    Copied(Vec<u8>),
    /// Held in UCX's receive buffer until released (`ucp_am_data_release`).
    Held { descriptor: *mut c_void, length: usize },
    /// Still at the sender: fetched by `ucp_am_recv_data_nbx` (rendezvous protocol).
    Rendezvous { descriptor: *mut c_void, length: usize },
}

/// A received active message as the callback recorded it.
pub(crate) struct RawMessage {
    pub(crate) id: u16,
    pub(crate) reply_endpoint: sys::ucp_ep_h,
    pub(crate) header: Vec<u8>,
    pub(crate) payload: Payload,
}

impl WorkerInner {
    /// Creates a UCX worker with `thread_mode`, whose waits spin for `spin` at first.
    pub(crate) fn create(context: &Context, thread_mode: sys::ucs_thread_mode_t, spin: Duration) -> Result<Rc<WorkerInner>, Error> {
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
        Ok(Rc::new(WorkerInner {
            context: context.clone(),
            handle,
            functions,
            event_fd,
            spin: Cell::new(spin),
            messages: RefCell::new(VecDeque::new()),
            endpoints: RefCell::new(HashMap::new()),
            failed: RefCell::new(Vec::new()),
            orphans: RefCell::new(Vec::new()),
            handlers: RefCell::new(Vec::new()),
        }))
    }

    /// Lets UCX make progress (send, receive, call back), then frees the orphaned requests
    /// that completed; returns the number of events UCX handled.
    pub(crate) fn progress(&self) -> usize {
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

    /// Number of requests still owned by the worker because their owners let go early.
    pub(crate) fn orphan_count(&self) -> usize {
        self.orphans.borrow().len()
    }

    /// Arms the event descriptor: `Ok(true)` when it is safe to sleep on it, `Ok(false)` when
    /// events are pending.
    pub(crate) fn arm(&self) -> Result<bool, Error> {
        // SAFETY: valid worker.
        match unsafe { (self.functions.ucp_worker_arm)(self.handle) } {
            sys::UCS_OK => Ok(true),
            sys::UCS_ERR_BUSY => Ok(false),
            status => Err(Error::status("ucp_worker_arm", status)),
        }
    }

    /// Sleeps on the event descriptor until the worker has events or `timeout` passes;
    /// returns at once if events are already pending.
    pub(crate) fn wait(&self, timeout: Duration) -> Result<(), Error> {
        if !self.arm()? {
            return Ok(());
        }
        let mut descriptor = libc::pollfd { fd: self.event_fd, events: libc::POLLIN, revents: 0 };
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

    /// Progresses until `done` says so or `deadline` passes: spins for the spin time after
    /// the last event, then sleeps on the event descriptor. `Ok(false)` when the deadline
    /// passed first.
    pub(crate) fn progress_until(&self, deadline: Instant, mut done: impl FnMut() -> bool) -> Result<bool, Error> {
        let spin = self.spin.get();
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

    /// Queues active messages with `id` in [`WorkerInner::messages`].
    pub(crate) fn accept_messages(self: &Rc<Self>, id: u16) -> Result<(), Error> {
        let argument = Box::new(HandlerArgument { worker: Rc::as_ptr(self), id });
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
        check("ucp_worker_set_am_recv_handler", unsafe { (self.functions.ucp_worker_set_am_recv_handler)(self.handle, &param) })?;
        self.handlers.borrow_mut().push(argument);
        Ok(())
    }

    /// Gives a payload that UCX holds (held or rendezvous) back to UCX; nothing for a copy.
    pub(crate) fn release(&self, payload: &Payload) {
        if let Payload::Held { descriptor, .. } | Payload::Rendezvous { descriptor, .. } = payload {
            // SAFETY: a descriptor UCX handed over with UCS_INPROGRESS, released once.
            unsafe { (self.functions.ucp_am_data_release)(self.handle, *descriptor) };
        }
    }

    /// The error handler that marks this worker's endpoints failed (`endpoint_failed`).
    pub(crate) fn error_handler(self: &Rc<Self>) -> sys::ucp_err_handler_t {
        sys::ucp_err_handler_t { cb: Some(endpoint_failed), arg: Rc::as_ptr(self).cast_mut().cast() }
    }
}

/// UCX's active-message callback: records the message in the worker's queue.
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
unsafe extern "C" fn endpoint_failed(argument: *mut c_void, endpoint: sys::ucp_ep_h, status: sys::ucs_status_t) {
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
        for message in std::mem::take(self.messages.get_mut()) {
            self.release(&message.payload);
        }
        // SAFETY: valid worker; nothing uses it after this (every handle that refers to it
        // holds this WorkerInner alive, and it is being dropped).
        unsafe { (self.functions.ucp_worker_destroy)(self.handle) };
        // The requests went with the worker; only their buffers are left to drop.
        self.orphans.get_mut().clear();
    }
}

/// An endpoint's state, shared by the [`crate::Endpoint`] handles and the remote keys unpacked
/// on it; the connection closes when the last of them drops.
pub(crate) struct EndpointShared {
    pub(crate) worker: Rc<WorkerInner>,
    /// UCX's handle; null once closed.
    handle: Cell<sys::ucp_ep_h>,
    state: Rc<EndpointState>,
    pub(crate) peer: String,
}

impl EndpointShared {
    /// Creates a UCX endpoint on `worker` from `params` (which must name the worker's
    /// [`WorkerInner::error_handler`]), recorded for the error callback.
    pub(crate) fn create(worker: &Rc<WorkerInner>, params: &sys::ucp_ep_params_t, peer: String) -> Result<Rc<EndpointShared>, Error> {
        let mut handle: sys::ucp_ep_h = ptr::null_mut();
        // SAFETY: valid worker and parameters (their pointers live for the call).
        check("ucp_ep_create", unsafe { (worker.functions.ucp_ep_create)(worker.handle, params, &mut handle) })?;
        let state = Rc::new(EndpointState::default());
        worker.endpoints.borrow_mut().insert(handle as usize, state.clone());
        Ok(Rc::new(EndpointShared { worker: worker.clone(), handle: Cell::new(handle), state, peer }))
    }

    /// UCX's handle, null once closed.
    pub(crate) fn handle(&self) -> sys::ucp_ep_h {
        self.handle.get()
    }

    /// Why the endpoint is unusable (the peer failed, or it was closed), if it is.
    pub(crate) fn failure(&self) -> Option<Error> {
        let text = if self.handle.get().is_null() { "closed".to_string() } else { sys::status_text(self.state.failure.get()?) };
        Some(Error::EndpointFailed { peer: self.peer.clone(), text })
    }

    /// UCX's handle while the endpoint is usable, its failure otherwise.
    pub(crate) fn live_handle(&self) -> Result<sys::ucp_ep_h, Error> {
        match self.failure() {
            Some(error) => Err(error),
            None => Ok(self.handle.get()),
        }
    }

    /// Closes the endpoint (once; later calls do nothing).
    pub(crate) fn close(&self, flags: u32) {
        debug_assert_eq!(flags, sys::UCP_EP_CLOSE_FLAG_FORCE, "only forced closes (see Endpoint)");
        let handle = self.handle.replace(ptr::null_mut());
        if handle.is_null() {
            return;
        }
        self.worker.endpoints.borrow_mut().remove(&(handle as usize));
        // SAFETY: plain data.
        let mut param: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        param.op_attr_mask = sys::UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = flags;
        // SAFETY: a live endpoint, closed once (the handle was cleared above).
        let pointer = unsafe { (self.worker.functions.ucp_ep_close_nbx)(handle, &param) };
        if !pointer.is_null() && !sys::pointer_is_error(pointer) {
            self.worker.adopt(pointer, Box::new(()));
        }
    }
}

impl Drop for EndpointShared {
    fn drop(&mut self) {
        self.close(sys::UCP_EP_CLOSE_FLAG_FORCE);
    }
}
