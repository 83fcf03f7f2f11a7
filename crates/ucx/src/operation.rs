//! A non-blocking UCX operation and the buffers it uses.
//!
//! UCX reads or writes an operation's buffers until the operation completes, so an
//! [`Operation`] owns them: they come back from [`Operation::wait`] or
//! [`Operation::into_buffer`]. An operation dropped before it completes is handed to its
//! worker, which keeps the buffers alive until UCX reports completion (closing the endpoint
//! completes every operation on it, with an error).

use std::cell::Cell;
use std::ffi::c_void;
use std::ptr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use crate::Error;
use crate::handle::WorkerInner;
use crate::memory::{MemoryRegion, RemoteKey};
use crate::sys;

/// A buffer whose bytes stay at the same address when the buffer value moves (it owns a heap
/// allocation), so that UCX may keep using them while an [`Operation`] holds the buffer.
///
/// # Safety
/// `as_ref()` must return the same memory for the life of the value, wherever it is moved.
pub unsafe trait StableBuffer: AsRef<[u8]> + 'static {}

// SAFETY: the bytes live in a heap allocation owned by the value.
unsafe impl StableBuffer for Vec<u8> {}
// SAFETY: as above.
unsafe impl StableBuffer for Box<[u8]> {}
// SAFETY: as above (shared, never moved while a reference exists).
unsafe impl StableBuffer for Arc<[u8]> {}

/// What an operation keeps alive besides its buffer: the registration of its local memory and
/// the remote key of its target.
#[derive(Default)]
#[allow(dead_code, reason = "the fields are kept alive, never read")]
pub(crate) struct Anchors {
    pub(crate) region: Option<Arc<MemoryRegion>>,
    pub(crate) key: Option<RemoteKey>,
    /// The scatter-gather list of a vectored send.
    pub(crate) parts: Option<Box<[crate::sys::ucp_dt_iov_t]>>,
}

/// A started operation that owns its buffer `B` until it completes.
pub struct Operation<B: 'static = ()> {
    worker: Rc<WorkerInner>,
    name: &'static str,
    /// UCX's request, null once completed and freed.
    request: Cell<*mut c_void>,
    /// The final status once known.
    status: Cell<Option<sys::ucs_status_t>>,
    buffer: Option<B>,
    anchors: Anchors,
}

impl<B: 'static> Operation<B> {
    /// Starts a non-blocking operation on `worker`: `start` receives the request parameters
    /// (with `flags` and the memory handle of `region`, if any) and returns UCX's status
    /// pointer.
    pub(crate) fn start(
        worker: &Rc<WorkerInner>,
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
        Operation::started(worker.clone(), name, pointer, buffer, anchors)
    }

    /// Wraps UCX's answer to a `*_nbx` call.
    pub(crate) fn started(
        worker: Rc<WorkerInner>,
        name: &'static str,
        pointer: sys::ucs_status_ptr_t,
        buffer: Option<B>,
        anchors: Anchors,
    ) -> Result<Operation<B>, Error> {
        if sys::pointer_is_error(pointer) {
            return Err(Error::status(name, sys::pointer_status(pointer)));
        }
        let status = if pointer.is_null() { Some(sys::UCS_OK) } else { None };
        Ok(Operation { worker, name, request: Cell::new(pointer), status: Cell::new(status), buffer, anchors })
    }

    /// An operation that completed without UCX (the data was already here).
    pub(crate) fn finished(worker: Rc<WorkerInner>, buffer: B) -> Operation<B> {
        Operation {
            worker,
            name: "copy",
            request: Cell::new(ptr::null_mut()),
            status: Cell::new(Some(sys::UCS_OK)),
            buffer: Some(buffer),
            anchors: Anchors::default(),
        }
    }

    /// The result once the operation completed, `None` while it is in progress. Does not
    /// progress the worker.
    pub fn result(&self) -> Option<Result<(), Error>> {
        let status = match self.status.get() {
            Some(status) => status,
            None => {
                let request = self.request.get();
                // SAFETY: a live request of this worker.
                let status = unsafe { (self.worker.functions.ucp_request_check_status)(request) };
                if status == sys::UCS_INPROGRESS {
                    return None;
                }
                // SAFETY: completed; freed once (the pointer is cleared).
                unsafe { (self.worker.functions.ucp_request_free)(request) };
                self.request.set(ptr::null_mut());
                self.status.set(Some(status));
                status
            }
        };
        Some(if status == sys::UCS_OK { Ok(()) } else { Err(Error::status(self.name, status)) })
    }

    /// True once completed (successfully or not).
    pub fn is_complete(&self) -> bool {
        self.result().is_some()
    }

    /// The buffer back, once the operation completed successfully; the operation itself if it
    /// is still in progress.
    pub fn into_buffer(mut self) -> Result<Result<B, Error>, Operation<B>> {
        match self.take() {
            None => Err(self),
            Some(result) => Ok(result),
        }
    }

    /// The buffer once the operation completed (`None` while in progress). After the buffer
    /// was taken, later calls report [`Error::Invalid`].
    pub fn take(&mut self) -> Option<Result<B, Error>> {
        Some(
            self.result()?
                .and_then(|()| self.buffer.take().ok_or_else(|| Error::Invalid("the operation's buffer was already taken".into()))),
        )
    }

    /// Progresses the worker until the operation completes or `deadline` passes. On a
    /// timeout the operation is dropped: its worker keeps the buffer until UCX is done with it.
    pub fn wait(self, deadline: Instant) -> Result<B, Error> {
        let started = Instant::now();
        let completed = self.worker.progress_until(deadline, || self.is_complete())?;
        if !completed {
            let timeout_ms = deadline.saturating_duration_since(started).as_millis() as u64;
            return Err(Error::Timeout { operation: self.name, timeout_ms });
        }
        let mut operation = self;
        operation.take().unwrap_or_else(|| Err(Error::Invalid("a completed operation has no result".into())))
    }
}

impl<B: 'static> Drop for Operation<B> {
    fn drop(&mut self) {
        if self.result().is_some() {
            return;
        }
        let keep: Box<dyn std::any::Any> = Box::new((self.buffer.take(), std::mem::take(&mut self.anchors)));
        self.worker.adopt(self.request.replace(ptr::null_mut()), keep);
    }
}
