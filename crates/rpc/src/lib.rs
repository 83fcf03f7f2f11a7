//! Moving ringfs frames between processes.
//!
//! - [`transport`]: TCP and Unix-socket links behind small traits, so other transports can be
//!   added without touching anything above; [`ucx`] carries the same frames over UCX (RDMA,
//!   UCX's TCP and shared memory): `ucx://host:port` endpoints.
//! - [`frame_io`]: buffered frame reading and vectored frame writing.
//! - [`Connection`]: the client side; many threads, many requests in flight, deadlines.
//! - [`RpcServer`] and [`Service`]: the server side; an event loop whose pool of threads
//!   serves ready connections in place, so idle connections cost no thread.
//! - [`memory`]: cross-memory attach for same-host bulk copies.
//!
//! This crate knows the frame layout and the handshake, not what requests mean: the file
//! system lives in `ringfs-server` (a [`Service`]) and `ringfs-client` (a user of
//! [`Connection`]).
//!
//! ```no_run
//! use ringfs_rpc::{Connection, ConnectionConfig, Endpoint};
//! use ringfs_proto::Request;
//! let config = ConnectionConfig { secret: b"job-secret".to_vec(), timeout: std::time::Duration::from_secs(10), host_id: 0, from_server: false, poll: ringfs_rpc::DEFAULT_POLL, client_id: 1, credentials: Default::default() };
//! let connection = Connection::open(&Endpoint::parse("127.0.0.1:7000").unwrap(), &config).unwrap();
//! let reply = connection.call(&Request::Ping, &[]).unwrap();
//! println!("{:?}", reply.response);
//! ```

pub mod abandon;
mod connection;
pub mod frame_io;
pub mod link;
pub mod log_limit;
pub mod memory;
mod server;
#[cfg(feature = "testing")]
pub mod sim;
pub mod throttle;
pub mod transport;
pub mod ucx;

pub use connection::{Connection, ConnectionConfig, DEFAULT_POLL, PendingCall, Reply, SharedConnection, wall_clock_ns};
pub use server::{
    MAX_HELLO_FRAME, REFUSAL_LOG_INTERVAL, RESERVED_DESCRIPTORS, RpcCounters, RpcServer, SHUTDOWN_WAIT, ServerLimits, Service, ThreadGroup,
    open_file_limit, raise_open_file_limit,
};
pub use transport::{Endpoint, Link, Listener, PeerIdentity};

use std::sync::Arc;

use ringfs_proto::Errno;
use thiserror::Error;

/// Why a request did not get a response.
#[derive(Clone, Debug, Error)]
pub enum RpcError {
    #[error("cannot connect to {endpoint}: {reason}")]
    Connect { endpoint: String, reason: String },
    #[error("{endpoint} refused the connection: {errno}")]
    Refused { endpoint: String, errno: Errno },
    #[error("connection to {endpoint} lost: {reason}")]
    Broken { endpoint: String, reason: Arc<str> },
    #[error("no answer from {endpoint} within {timeout_ms} ms")]
    Timeout { endpoint: String, timeout_ms: u64 },
    /// The wait was given up because the program it was for is being killed (see
    /// [`abandon`]); the request may still run at the server.
    #[error("gave up waiting for {endpoint}: the caller is being killed")]
    Abandoned { endpoint: String },
}

impl RpcError {
    /// The peer did not answer in time (it may be stopped, overloaded or cut off), as opposed
    /// to refusing or closing the connection.
    pub fn is_timeout(&self) -> bool {
        matches!(self, RpcError::Timeout { .. })
    }

    /// The caller gave up waiting (see [`abandon`]): nothing is known of the server.
    pub fn is_abandoned(&self) -> bool {
        matches!(self, RpcError::Abandoned { .. })
    }

    /// What a file-system caller sees: EIO for every transport failure (the server is dead,
    /// unreachable or too slow), the server's own errno when it refused the connection, EINTR
    /// for a wait given up for a caller being killed (who never sees it).
    pub fn errno(&self) -> Errno {
        match self {
            RpcError::Refused { errno, .. } => *errno,
            RpcError::Abandoned { .. } => Errno::EINTR,
            _ => Errno::EIO,
        }
    }
}
