//! UCX for ringfs: RDMA (and UCX's TCP and shared-memory transports) between processes.
//!
//! The crate has three layers:
//! - [`sys`]: the part of the UCP C interface ringfs uses, declared by hand and looked up in the
//!   system's `libucp.so.0` when first needed, so that every ringfs build carries UCX support and
//!   a machine without UCX simply reports [`Error::Unavailable`] (see `sys.rs` for why not
//!   bindgen).
//! - a small safe API: a [`Context`] per process, a [`Worker`] per thread (with its event file
//!   descriptor, so an idle thread sleeps in `poll` instead of spinning), [`Listener`]s and
//!   [`Endpoint`]s made from socket addresses, active messages ([`IncomingMessage`]), memory
//!   registration with a [`RegistrationCache`], remote keys and `get`/`put`, each non-blocking
//!   call returning an [`Operation`] that owns its buffers until UCX is done with them.
//!   Its modules depend one way, each only on those listed before it (and on `sys`, `sockaddr`):
//!   `context` (the per-process context); `handle` (the state that the API's handles share
//!   and keep alive: a worker's UCX handle, progress loop, message queue and orphaned
//!   requests, an endpoint's UCX handle and failure status, and the callbacks UCX makes into
//!   them); `memory` (registrations, and remote keys unpacked on an endpoint's handle);
//!   `operation` (a started request and its buffers, progressed on its worker's handle);
//!   `endpoint` (endpoints and listeners); `worker` (the [`Worker`], which makes listeners and
//!   endpoints and hands out received messages).
//! - [`frames`]: a request/response transport carrying ringfs frames (header, body, data), with
//!   bulk data above a threshold moved by RMA: the client registers its buffer and sends its
//!   remote key, the server `get`s write data from it and `put`s read data into it.
//!
//! Workers, endpoints and operations belong to the thread that made their worker (they are
//! `!Send`); the context and memory registrations are shared by all threads.
//!
//! ```no_run
//! use ringfs_ucx::{Context, ContextConfig, Worker};
//! let context = Context::new(&ContextConfig { transports: Some("tcp".into()) }).unwrap();
//! let worker = Worker::new(&context).unwrap();
//! let listener = worker.listen("127.0.0.1:0".parse().unwrap()).unwrap();
//! let endpoint = worker.connect(listener.address()).unwrap();
//! endpoint.send_and_wait(7, b"header", b"payload", std::time::Instant::now() + std::time::Duration::from_secs(5)).unwrap();
//! ```

mod context;
mod endpoint;
pub mod frames;
mod handle;
mod memory;
mod operation;
mod sockaddr;
pub mod sys;
mod worker;

pub use context::{Context, ContextConfig, is_available, version};
pub use endpoint::{Endpoint, Lane, Listener, MessageBuffers};
pub use memory::{MemoryRegion, RegistrationCache, RemoteKey};
pub use operation::{Operation, StableBuffer};
pub use worker::{DEFAULT_SPIN, HeldPayload, IncomingMessage, Worker};

use thiserror::Error;

/// What went wrong in a UCX call.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum Error {
    /// `libucp.so.0` cannot be loaded here.
    #[error("UCX is not available: {0}")]
    Unavailable(String),
    /// A UCX function returned an error status.
    #[error("{operation} failed: {text} (UCX status {status})")]
    Status { operation: &'static str, status: i32, text: String },
    /// The endpoint failed (the peer is gone or unreachable) or was closed.
    #[error("endpoint to {peer} failed: {text}")]
    EndpointFailed { peer: String, text: String },
    /// An operation did not complete in time.
    #[error("{operation} did not complete within {timeout_ms} ms")]
    Timeout { operation: &'static str, timeout_ms: u64 },
    /// A peer sent something that breaks the transport's rules.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A caller passed something unusable.
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl Error {
    /// The error for status `status` of `operation`.
    pub(crate) fn status(operation: &'static str, status: sys::ucs_status_t) -> Error {
        Error::Status { operation, status, text: sys::status_text(status) }
    }
}

/// `Ok` for `UCS_OK`, the error otherwise.
pub(crate) fn check(operation: &'static str, status: sys::ucs_status_t) -> Result<(), Error> {
    if status == sys::UCS_OK { Ok(()) } else { Err(Error::status(operation, status)) }
}
