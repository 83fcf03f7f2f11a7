//! Endpoints (one side of a connection) and listeners (which turn connection requests into
//! endpoints), both made from socket addresses in UCX's client-server mode.
//!
//! Every endpoint is created with peer error handling: when the peer dies or becomes
//! unreachable, UCX fails the endpoint's operations and calls back, and the endpoint reports
//! the failure ([`Endpoint::failure`]). Operations that borrow a caller's buffer
//! ([`Endpoint::send_and_wait`], [`Endpoint::get_and_wait`], [`Endpoint::put_and_wait`]) never
//! return before UCX is done with it: on a timeout they close the endpoint, which completes
//! the operation with an error.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::ffi::{CStr, c_char, c_void};
use std::net::SocketAddr;
use std::ptr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::handle::{EndpointShared, WorkerInner};
use crate::memory::{MemoryRegion, RemoteKey};
use crate::operation::{Anchors, Operation, StableBuffer};
use crate::sockaddr;
use crate::sys;
use crate::{Error, check};

/// How long a closed endpoint may take to complete the operations that borrow a caller's
/// buffer before the process aborts rather than return the buffer while UCX may still use it.
const CLOSE_GRACE: Duration = Duration::from_secs(30);

/// The buffers of a sent active message, given back when the send completes.
pub struct MessageBuffers<B = Vec<u8>> {
    pub header: Vec<u8>,
    pub body: Vec<u8>,
    pub data: B,
}

/// One side of a connection. Cheap to clone; the connection closes when the last clone drops
/// or at [`Endpoint::close`], at once: operations still in progress fail, and the peer sees its
/// endpoint fail. ([`Endpoint::flush`] first lets them finish. UCX's graceful close is not
/// used: a worker destroyed while one waits for an unresponsive peer aborts inside UCX 1.13.)
#[derive(Clone)]
pub struct Endpoint {
    pub(crate) shared: Rc<EndpointShared>,
}

fn create(worker: &Rc<WorkerInner>, params: &sys::ucp_ep_params_t, peer: String) -> Result<Endpoint, Error> {
    Ok(Endpoint { shared: EndpointShared::create(worker, params, peer)? })
}

pub(crate) fn connect(worker: &Rc<WorkerInner>, address: SocketAddr) -> Result<Endpoint, Error> {
    let (storage, length) = sockaddr::to_c(&address);
    // SAFETY: plain data; zero leaves the optional fields unset.
    let mut params: sys::ucp_ep_params_t = unsafe { std::mem::zeroed() };
    params.field_mask = sys::UCP_EP_PARAM_FIELD_FLAGS
        | sys::UCP_EP_PARAM_FIELD_SOCK_ADDR
        | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
        | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.flags = sys::UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr = sys::ucs_sock_addr_t { addr: (&raw const storage).cast(), addrlen: length };
    params.err_mode = sys::UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler = worker.error_handler();
    create(worker, &params, address.to_string())
}

/// Longest worker address accepted (UCX's are a few hundred bytes; more with many devices).
pub const MAX_WORKER_ADDRESS: usize = 64 << 10;

pub(crate) fn connect_to_address(worker: &Rc<WorkerInner>, address: &[u8], peer: &str) -> Result<Endpoint, Error> {
    if address.is_empty() || address.len() > MAX_WORKER_ADDRESS {
        return Err(Error::Protocol(format!("a UCX worker address of {} bytes", address.len())));
    }
    // UCX parses the address without knowing its length: a zero-padded copy keeps a malformed
    // one from making it read past the bytes received.
    let mut padded = vec![0u8; address.len() + 4096];
    padded[..address.len()].copy_from_slice(address);
    // SAFETY: plain data; zero leaves the optional fields unset.
    let mut params: sys::ucp_ep_params_t = unsafe { std::mem::zeroed() };
    params.field_mask =
        sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = padded.as_ptr().cast();
    params.err_mode = sys::UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler = worker.error_handler();
    create(worker, &params, peer.to_string())
}

impl Endpoint {
    /// Identifies this connection on its worker (equal to [`crate::IncomingMessage::endpoint_key`]
    /// of the messages that came through it); 0 once closed.
    pub fn key(&self) -> usize {
        self.shared.handle() as usize
    }

    /// The peer's address as given or reported when the endpoint was made.
    pub fn peer(&self) -> &str {
        &self.shared.peer
    }

    /// Why the endpoint is unusable (the peer failed, or it was closed), if it is.
    pub fn failure(&self) -> Option<Error> {
        self.shared.failure()
    }

    /// Closes the connection now: operations in progress complete with an error, and the
    /// peer sees its endpoint fail.
    pub fn close(&self) {
        self.shared.close(sys::UCP_EP_CLOSE_FLAG_FORCE);
    }

    /// What UCX reports about the endpoint: its lanes and the transports (`tcp/lo`,
    /// `posix/memory`, `rc_mlx5/mlx5_0:1`, …) each uses.
    pub fn describe(&self) -> String {
        let handle = self.shared.handle();
        if handle.is_null() {
            return "closed".into();
        }
        let mut text: *mut c_char = ptr::null_mut();
        let mut size: libc::size_t = 0;
        // SAFETY: open_memstream allocates the text and updates the pointers on fclose.
        let stream = unsafe { libc::open_memstream(&mut text, &mut size) };
        if stream.is_null() {
            return String::new();
        }
        // SAFETY: valid endpoint and stream; the stream is closed once, then the text freed once.
        unsafe {
            (self.shared.worker.functions.ucp_ep_print_info)(handle, stream);
            libc::fclose(stream);
            let description = if text.is_null() { String::new() } else { CStr::from_ptr(text).to_string_lossy().into_owned() };
            libc::free(text.cast());
            description
        }
    }

    /// The lanes UCX chose for this endpoint (known once the connection is established: after
    /// the first message went through).
    pub fn lanes(&self) -> Vec<Lane> {
        parse_lanes(&self.describe())
    }

    /// True if one of the endpoint's RMA lanes does RMA in hardware or in the kernel (RDMA
    /// verbs, `cma`, `knem`, `xpmem`), not emulated by messages over TCP.
    pub fn has_native_rma(&self) -> bool {
        self.lanes().iter().any(|lane| lane.rma && !lane.transport.starts_with("tcp/"))
    }

    /// Sends an active message with `id`, `header` and `payload`; the operation returns both
    /// buffers. The receiver's [`crate::IncomingMessage::endpoint_key`] names its side of this
    /// connection.
    pub fn send(&self, id: u16, header: Vec<u8>, payload: Vec<u8>) -> Result<Operation<MessageBuffers>, Error> {
        self.send_parts(id, header, payload, Vec::new(), false)
    }

    /// Sends an active message whose payload is `body` followed by `data`, without joining
    /// them (UCX gathers the parts). `eager`: send it eagerly even when large (the receiver gets
    /// it whole, in UCX's buffers) instead of by UCX's rendezvous protocol.
    pub fn send_parts<B: StableBuffer>(
        &self,
        id: u16,
        header: Vec<u8>,
        body: Vec<u8>,
        data: B,
        eager: bool,
    ) -> Result<Operation<MessageBuffers<B>>, Error> {
        let parts = [body.as_slice(), data.as_ref()];
        // SAFETY: as in send().
        let (pointer, anchors) = unsafe { self.start_send(id, &header, &parts, eager) }?;
        Operation::started(self.shared.worker.clone(), "ucp_am_send_nbx", pointer, Some(MessageBuffers { header, body, data }), anchors)
    }

    /// Sends an active message from borrowed buffers and waits until UCX is done with them
    /// (usually at once: small messages are copied out). On a timeout the endpoint is closed.
    pub fn send_and_wait(&self, id: u16, header: &[u8], payload: &[u8], deadline: Instant) -> Result<(), Error> {
        self.send_parts_and_wait(id, header, &[payload], false, deadline)
    }

    /// Like [`Endpoint::send_parts`] from borrowed buffers, waiting as
    /// [`Endpoint::send_and_wait`] does.
    pub fn send_parts_and_wait(&self, id: u16, header: &[u8], parts: &[&[u8]], eager: bool, deadline: Instant) -> Result<(), Error> {
        // SAFETY: the buffers are borrowed until finish_borrowed returns, which is after UCX
        // completed the operation.
        let operation = unsafe { self.send_parts_borrowed(id, header, parts, eager) }?;
        self.finish_borrowed(operation, deadline)
    }

    /// Starts sending like [`Endpoint::send_parts`] from borrowed buffers and returns at once:
    /// the caller waits for the operation itself (progressing the worker, or letting others
    /// do it), and gives it up only through [`Endpoint::give_up_borrowed`].
    ///
    /// # Safety
    /// `header` and `parts` must stay valid and unchanged until the operation has completed
    /// (its result is known); dropping the operation earlier does not release them.
    pub unsafe fn send_parts_borrowed(&self, id: u16, header: &[u8], parts: &[&[u8]], eager: bool) -> Result<Operation<()>, Error> {
        // SAFETY: the caller keeps the buffers until the operation completes.
        let (pointer, anchors) = unsafe { self.start_send(id, header, parts, eager) }?;
        Operation::<()>::started(self.shared.worker.clone(), "ucp_am_send_nbx", pointer, None, anchors)
    }

    /// Gives up an operation on borrowed buffers: closes the endpoint and progresses the worker
    /// until UCX has let go of them (which the force close makes it do at once; a process
    /// whose UCX still holds them after a grace period is aborted, since they can be neither
    /// given back nor kept). The operation's result, an error.
    pub fn give_up_borrowed(&self, operation: &Operation<()>) -> Error {
        let failure = self.failure();
        self.close();
        let grace = Instant::now() + CLOSE_GRACE;
        let result = loop {
            if let Some(result) = operation.result() {
                break result;
            }
            self.shared.worker.progress();
            if Instant::now() > grace {
                log::error!("a UCX operation on a borrowed buffer did not complete after its endpoint was closed; aborting");
                std::process::abort();
            }
        };
        failure.or(result.err()).unwrap_or_else(|| Error::Invalid("the operation was given up".into()))
    }

    /// Starts `ucp_am_send_nbx` of `header` and the concatenation of `parts`.
    ///
    /// # Safety
    /// The header and parts must stay valid and unchanged until the returned request completes.
    unsafe fn start_send(&self, id: u16, header: &[u8], parts: &[&[u8]], eager: bool) -> Result<(sys::ucs_status_ptr_t, Anchors), Error> {
        let handle = self.shared.live_handle()?;
        let functions = self.shared.worker.functions;
        let non_empty: Vec<&[u8]> = parts.iter().copied().filter(|part| !part.is_empty()).collect();
        // SAFETY: plain data; zero means no callback.
        let mut param: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        param.op_attr_mask = sys::UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = sys::UCP_AM_SEND_FLAG_REPLY | if eager { sys::UCP_AM_SEND_FLAG_EAGER } else { 0 };
        let mut anchors = Anchors::default();
        let (buffer, count): (*const c_void, usize) = match non_empty.as_slice() {
            [] => (ptr::null(), 0),
            [only] => (only.as_ptr().cast(), only.len()),
            several => {
                let list: Box<[sys::ucp_dt_iov_t]> =
                    several.iter().map(|part| sys::ucp_dt_iov_t { buffer: part.as_ptr().cast_mut().cast(), length: part.len() }).collect();
                param.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_DATATYPE;
                param.datatype = sys::UCP_DATATYPE_IOV;
                let pointer = (list.as_ptr().cast(), list.len());
                anchors.parts = Some(list);
                pointer
            }
        };
        // SAFETY: a live endpoint; the caller keeps the buffers valid until completion, and the
        // scatter-gather list lives in the anchors that the operation keeps.
        let pointer =
            unsafe { (functions.ucp_am_send_nbx)(handle, id as u32, header.as_ptr().cast(), header.len(), buffer, count, &param) };
        Ok((pointer, anchors))
    }

    /// Makes a packed remote key (from the peer's [`MemoryRegion::pack_key`]) usable on this
    /// endpoint.
    pub fn unpack_key(&self, packed: &[u8]) -> Result<RemoteKey, Error> {
        RemoteKey::unpack(&self.shared, packed)
    }

    /// Reads `length` bytes at `remote_address` of the peer (covered by `key`) into `buffer`
    /// (registered in `region`, if given); the operation returns the buffer.
    pub fn get(
        &self,
        mut buffer: Vec<u8>,
        length: usize,
        remote_address: u64,
        key: &RemoteKey,
        region: Option<Arc<MemoryRegion>>,
    ) -> Result<Operation<Vec<u8>>, Error> {
        let handle = self.rma_handle(buffer.len(), length, key, region.as_deref(), buffer.as_ptr())?;
        let pointer = buffer.as_mut_ptr();
        let anchors = Anchors { region: region.clone(), key: Some(key.clone()), ..Anchors::default() };
        let worker = &self.shared.worker;
        Operation::start(worker, "ucp_get_nbx", region.as_deref(), 0, Some(buffer), anchors, |param| {
            // SAFETY: the buffer (length checked) and key are owned by the operation until completion.
            unsafe { (worker.functions.ucp_get_nbx)(handle, pointer.cast(), length, remote_address, key.handle(), param) }
        })
    }

    /// Writes the first `length` bytes of `buffer` to `remote_address` of the peer; the
    /// operation returns the buffer. Completion means the buffer may be reused, not that the
    /// bytes arrived: [`Endpoint::flush`] says that.
    pub fn put<B: StableBuffer>(
        &self,
        buffer: B,
        length: usize,
        remote_address: u64,
        key: &RemoteKey,
        region: Option<Arc<MemoryRegion>>,
    ) -> Result<Operation<B>, Error> {
        let bytes = buffer.as_ref();
        let handle = self.rma_handle(bytes.len(), length, key, region.as_deref(), bytes.as_ptr())?;
        let pointer = bytes.as_ptr();
        let anchors = Anchors { region: region.clone(), key: Some(key.clone()), ..Anchors::default() };
        let worker = &self.shared.worker;
        Operation::start(worker, "ucp_put_nbx", region.as_deref(), 0, Some(buffer), anchors, |param| {
            // SAFETY: as in get().
            unsafe { (worker.functions.ucp_put_nbx)(handle, pointer.cast(), length, remote_address, key.handle(), param) }
        })
    }

    /// Like [`Endpoint::get`] into a borrowed buffer, waiting for completion.
    pub fn get_and_wait(&self, destination: &mut [u8], remote_address: u64, key: &RemoteKey, deadline: Instant) -> Result<(), Error> {
        let handle = self.rma_handle(destination.len(), destination.len(), key, None, destination.as_ptr())?;
        let worker = &self.shared.worker;
        let operation = Operation::<()>::start(worker, "ucp_get_nbx", None, 0, None, Anchors::default(), |param| {
            // SAFETY: the buffer is borrowed until finish_borrowed returns, after completion.
            unsafe {
                (worker.functions.ucp_get_nbx)(
                    handle,
                    destination.as_mut_ptr().cast(),
                    destination.len(),
                    remote_address,
                    key.handle(),
                    param,
                )
            }
        })?;
        self.finish_borrowed(operation, deadline)
    }

    /// Like [`Endpoint::put`] from a borrowed buffer, waiting for local completion.
    pub fn put_and_wait(&self, source: &[u8], remote_address: u64, key: &RemoteKey, deadline: Instant) -> Result<(), Error> {
        let handle = self.rma_handle(source.len(), source.len(), key, None, source.as_ptr())?;
        let worker = &self.shared.worker;
        let operation = Operation::<()>::start(worker, "ucp_put_nbx", None, 0, None, Anchors::default(), |param| {
            // SAFETY: as in get_and_wait().
            unsafe { (worker.functions.ucp_put_nbx)(handle, source.as_ptr().cast(), source.len(), remote_address, key.handle(), param) }
        })?;
        self.finish_borrowed(operation, deadline)
    }

    /// Completes when every operation started on this endpoint before it has completed at the
    /// peer (a `put` followed by a flush has landed).
    pub fn flush(&self) -> Result<Operation<()>, Error> {
        let handle = self.shared.live_handle()?;
        let worker = &self.shared.worker;
        Operation::<()>::start(worker, "ucp_ep_flush_nbx", None, 0, None, Anchors::default(), |param| {
            // SAFETY: valid endpoint; no buffer involved.
            unsafe { (worker.functions.ucp_ep_flush_nbx)(handle, param) }
        })
    }

    /// Checks an RMA call's arguments: the buffer holds `length` bytes, the key belongs to this
    /// endpoint, and the registration (if any) covers the buffer.
    fn rma_handle(
        &self,
        capacity: usize,
        length: usize,
        key: &RemoteKey,
        region: Option<&MemoryRegion>,
        buffer: *const u8,
    ) -> Result<sys::ucp_ep_h, Error> {
        let handle = self.shared.live_handle()?;
        if length > capacity {
            return Err(Error::Invalid(format!("{length} bytes do not fit a buffer of {capacity}")));
        }
        if !key.belongs_to(&self.shared) {
            return Err(Error::Invalid("a remote key is used on an endpoint it was not unpacked on".into()));
        }
        if let Some(region) = region
            && !region.covers(buffer as usize, length)
        {
            return Err(Error::Invalid("the memory registration does not cover the buffer".into()));
        }
        Ok(handle)
    }

    /// Waits for an operation on borrowed buffers; if it does not complete by `deadline` (or
    /// the endpoint fails), closes the endpoint and waits for UCX to give the buffers up.
    fn finish_borrowed(&self, operation: Operation<()>, deadline: Instant) -> Result<(), Error> {
        let worker = &self.shared.worker;
        let started = Instant::now();
        worker.progress_until(deadline, || operation.is_complete() || self.failure().is_some())?;
        if let Some(result) = operation.result() {
            return result;
        }
        let timed_out = self.failure().is_none();
        let error = self.give_up_borrowed(&operation);
        Err(if timed_out {
            Error::Timeout { operation: "UCX operation", timeout_ms: deadline.saturating_duration_since(started).as_millis() as u64 }
        } else {
            error
        })
    }
}

/// One lane of an endpoint: a transport and what UCX uses it for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lane {
    /// Transport and device, e.g. `tcp/lo`, `sysv/memory`, `rc_mlx5/mlx5_0:1`.
    pub transport: String,
    /// Carries active messages.
    pub active_messages: bool,
    /// Carries RMA (`get`, `put`, and the rendezvous protocol's bulk data).
    pub rma: bool,
}

/// The lanes in UCX's endpoint description, lines such as
/// `lane[1]:  2:sysv/memory.0 md[1] -> md[1]/sysv/sysdev[255] am am_bw#0 keepalive`.
fn parse_lanes(description: &str) -> Vec<Lane> {
    description
        .lines()
        .filter_map(|line| {
            let (_, rest) = line.split_once("lane[")?;
            let (_, rest) = rest.split_once("]:")?;
            let (local, remote) = rest.split_once("->")?;
            let first = local.split_whitespace().next()?;
            let transport = first.split_once(':').map_or(first, |(_, name)| name);
            let transport = match transport.rsplit_once('.') {
                Some((name, index)) if index.chars().all(|c| c.is_ascii_digit()) => name,
                _ => transport,
            };
            let uses: Vec<&str> = remote.split_whitespace().skip(1).collect();
            Some(Lane {
                transport: transport.to_string(),
                active_messages: uses.iter().any(|usage| *usage == "am" || usage.starts_with("am_bw")),
                rma: uses.iter().any(|usage| usage.starts_with("rma_bw") || usage.starts_with("rma")),
            })
        })
        .collect()
}

/// Accepts connections on a socket address.
pub struct Listener {
    shared: Box<ListenerShared>,
}

struct ListenerShared {
    worker: Rc<WorkerInner>,
    handle: Cell<sys::ucp_listener_h>,
    requests: RefCell<VecDeque<sys::ucp_conn_request_h>>,
}

/// UCX's connection-request callback: queues the request for [`Listener::accept`].
unsafe extern "C" fn connection_requested(request: sys::ucp_conn_request_h, argument: *mut c_void) {
    // SAFETY: the argument is the listener's boxed state, alive until ucp_listener_destroy;
    // called from progress on the worker's thread.
    let shared = unsafe { &*(argument as *const ListenerShared) };
    shared.requests.borrow_mut().push_back(request);
}

pub(crate) fn listen(worker: &Rc<WorkerInner>, address: SocketAddr) -> Result<Listener, Error> {
    let shared =
        Box::new(ListenerShared { worker: worker.clone(), handle: Cell::new(ptr::null_mut()), requests: RefCell::new(VecDeque::new()) });
    let (storage, length) = sockaddr::to_c(&address);
    let params = sys::ucp_listener_params_t {
        field_mask: sys::UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | sys::UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
        sockaddr: sys::ucs_sock_addr_t { addr: (&raw const storage).cast(), addrlen: length },
        accept_handler: sys::ucp_listener_accept_handler_t { cb: None, arg: ptr::null_mut() },
        conn_handler: sys::ucp_listener_conn_handler_t {
            cb: Some(connection_requested),
            arg: (&*shared as *const ListenerShared).cast_mut().cast(),
        },
    };
    let mut handle: sys::ucp_listener_h = ptr::null_mut();
    let functions = worker.functions;
    // SAFETY: valid worker and parameters; the callback argument lives in the returned Listener.
    check("ucp_listener_create", unsafe { (functions.ucp_listener_create)(worker.handle, &params, &mut handle) })?;
    shared.handle.set(handle);
    Ok(Listener { shared })
}

impl Listener {
    /// The address the listener is bound to (with the real port if 0 was asked for).
    pub fn address(&self) -> SocketAddr {
        // SAFETY: plain data.
        let mut attributes: sys::ucp_listener_attr_t = unsafe { std::mem::zeroed() };
        attributes.field_mask = sys::UCP_LISTENER_ATTR_FIELD_SOCKADDR;
        let functions = self.shared.worker.functions;
        // SAFETY: valid listener; UCX fills the attributes.
        let status = unsafe { (functions.ucp_listener_query)(self.shared.handle.get(), &mut attributes) };
        let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
        if status != sys::UCS_OK {
            return unspecified;
        }
        sockaddr::from_c(&attributes.sockaddr).unwrap_or(unspecified)
    }

    /// Connection requests waiting for [`Listener::accept`] or [`Listener::reject`].
    pub fn pending(&self) -> usize {
        self.shared.requests.borrow().len()
    }

    /// Turns the oldest connection request into an endpoint (`None`: no request waiting;
    /// requests arrive during [`Worker::progress`](crate::Worker::progress)).
    pub fn accept(&self) -> Option<Result<Endpoint, Error>> {
        let request = self.shared.requests.borrow_mut().pop_front()?;
        let functions = self.shared.worker.functions;
        // SAFETY: plain data.
        let mut attributes: sys::ucp_conn_request_attr_t = unsafe { std::mem::zeroed() };
        attributes.field_mask = sys::UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
        // SAFETY: a pending connection request of this listener.
        let status = unsafe { (functions.ucp_conn_request_query)(request, &mut attributes) };
        let peer = match (status, sockaddr::from_c(&attributes.client_address)) {
            (sys::UCS_OK, Some(address)) => address.to_string(),
            _ => "unknown client".to_string(),
        };
        // SAFETY: plain data.
        let mut params: sys::ucp_ep_params_t = unsafe { std::mem::zeroed() };
        params.field_mask =
            sys::UCP_EP_PARAM_FIELD_CONN_REQUEST | sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER;
        params.conn_request = request;
        params.err_mode = sys::UCP_ERR_HANDLING_MODE_PEER;
        params.err_handler = self.shared.worker.error_handler();
        Some(create(&self.shared.worker, &params, peer))
    }

    /// Refuses the oldest connection request; false if none was waiting.
    pub fn reject(&self) -> bool {
        let Some(request) = self.shared.requests.borrow_mut().pop_front() else {
            return false;
        };
        let functions = self.shared.worker.functions;
        // SAFETY: a pending connection request of this listener, consumed once.
        unsafe { (functions.ucp_listener_reject)(self.shared.handle.get(), request) };
        true
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        while self.reject() {}
        let functions = self.shared.worker.functions;
        // SAFETY: a live listener, destroyed once; no callback comes after this returns.
        unsafe { (functions.ucp_listener_destroy)(self.shared.handle.get()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_are_read_from_the_endpoint_description() {
        let description = "#\n#                 lane[0]: cm rdmacm\n\
            #                 lane[1]:  2:sysv/memory.0 md[1]           -> md[1]/sysv/sysdev[255] am am_bw#0 keepalive\n\
            #                 lane[2]:  1:tcp/lo.0 md[0]                -> md[0]/tcp/sysdev[255] rma_bw#0 wireup\n\
            #                 lane[3]:  4:rc_mlx5/mlx5_0:1 md[3]        -> md[3]/ib/sysdev[0] rma_bw#1\n\
            #                 am_send: 0..<egr/short>..93..<egr/bcopy>..8256..<rndv>..(inf)\n";
        let lanes = parse_lanes(description);
        assert_eq!(
            lanes,
            vec![
                Lane { transport: "sysv/memory".into(), active_messages: true, rma: false },
                Lane { transport: "tcp/lo".into(), active_messages: false, rma: true },
                Lane { transport: "rc_mlx5/mlx5_0:1".into(), active_messages: false, rma: true },
            ]
        );
    }
}
