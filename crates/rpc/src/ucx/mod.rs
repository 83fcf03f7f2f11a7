//! ringfs connections over UCX (RDMA, and UCX's TCP and shared-memory transports): the
//! `ucx://host:port` endpoints of clusters started with `--transport ucx`.
//!
//! A frame travels as the active messages of `ringfs_ucx::frames` (one per request, one per
//! response; headers in `ringfs_ucx::frames::wire`), so a server speaks the same protocol
//! whether a peer reaches it by TCP or UCX: the same handshake, the same requests, the same
//! [`crate::Service`]. Bulk data moves by RMA where the connection's lanes do RMA natively
//! ([`BulkTransfer::Auto`], decided from the lanes UCX chose when the handshake completes): the
//! client lends its buffers — write data the server `get`s, a read destination the server
//! `put`s into — until the response comes; elsewhere data travels inside the messages.
//!
//! A process has one UCX worker for its client connections ([`client`]) and one per RPC
//! server listening on UCX ([`server`]). Threads share a worker one at a time ([`engine`]):
//! whoever waits — a client thread for its reply, a server thread polling its connection, the
//! server's event loop woken by the worker's event descriptor — progresses it and hands each
//! message to the *inbox* of its connection, whose event descriptor wakes the connection's
//! waiter. On the server a UCX connection is therefore an ordinary [`crate::link::Link`]
//! to the event loop, registered in its epoll set like a socket, with the same handshake,
//! limits and threads; an idle server sleeps in `epoll_wait`, never spins. The descriptor is
//! only signalled when someone may be sleeping on it (a client thread asleep; the event loop,
//! unless the thread serving the connection takes the message itself), and large request
//! payloads stay in UCX's receive buffer until the reader copies them where the frame's data
//! goes (`engine::Held`): measured in docs/PERFORMANCE.md ("ringfs over UCX against
//! ucx_perftest").

pub(crate) mod client;
pub(crate) mod engine;
pub(crate) mod server;

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::OnceLock;
use std::time::Duration;

pub use ringfs_ucx::frames::BulkTransfer;
pub use server::UcxListener;

/// The environment variable that forces how clients move large data over UCX: `auto` (the
/// default: RMA where the lanes do it natively), `rma` (always, also where UCX emulates it,
/// as tests do) or `inline` (never).
pub const BULK_VARIABLE: &str = "RINGFS_UCX_BULK";

/// How this process moves data over UCX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Data sections of at least this many bytes may move by RMA (measured: PERFORMANCE.md).
    pub rma_threshold: usize,
    /// Whether they do (clients decide; servers follow each request).
    pub bulk: BulkTransfer,
    /// A server's RMA transfer (fetching write data, placing read data) that takes longer
    /// than this closes its connection.
    pub transfer_timeout: Duration,
}

impl Settings {
    /// The defaults, with [`BULK_VARIABLE`] applied (read once per process).
    pub fn from_env() -> Settings {
        static SETTINGS: OnceLock<Settings> = OnceLock::new();
        *SETTINGS.get_or_init(|| {
            let bulk = match std::env::var(BULK_VARIABLE).as_deref() {
                Ok("rma") => BulkTransfer::Rma,
                Ok("inline") => BulkTransfer::Inline,
                Ok("auto") | Err(_) => BulkTransfer::Auto,
                Ok(other) => {
                    log::warn!("{BULK_VARIABLE}={other:?} is not auto, rma or inline; using auto");
                    BulkTransfer::Auto
                }
            };
            Settings { rma_threshold: ringfs_ucx::frames::DEFAULT_RMA_THRESHOLD, bulk, transfer_timeout: Duration::from_secs(30) }
        })
    }
}

/// UCX workers alive in this process for ringfs (one per process for its client connections
/// while it has any, one per server listening on UCX while it runs). 0 once every connection
/// and server is dropped: nothing of ringfs is then inside UCX when the process exits and the
/// libraries' destructors run (which once corrupted the heap of a rank still polling).
pub fn live_workers() -> usize {
    engine::live_engines()
}

/// True if UCX (`libucp.so.0`) can be used in this process.
pub fn is_available() -> bool {
    ringfs_ucx::is_available()
}

/// Why UCX cannot be used here, if it cannot.
pub fn unavailable_reason() -> Option<String> {
    match ringfs_ucx::version() {
        Ok(_) => None,
        Err(error) => Some(error.to_string()),
    }
}

/// The first socket address `host:port` resolves to.
pub(crate) fn resolve(address: &str) -> std::io::Result<SocketAddr> {
    address
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("{address} resolves to no address")))
}

/// A UCX error as an I/O error (what the transports above see).
pub(crate) fn io_error(error: ringfs_ucx::Error) -> std::io::Error {
    use std::io::ErrorKind;
    let kind = match &error {
        ringfs_ucx::Error::Unavailable(_) => ErrorKind::Unsupported,
        ringfs_ucx::Error::EndpointFailed { .. } => ErrorKind::ConnectionReset,
        ringfs_ucx::Error::Timeout { .. } => ErrorKind::TimedOut,
        ringfs_ucx::Error::Protocol(_) | ringfs_ucx::Error::Invalid(_) => ErrorKind::InvalidData,
        ringfs_ucx::Error::Status { .. } => ErrorKind::Other,
    };
    std::io::Error::new(kind, error.to_string())
}

/// The lanes of an endpoint in a line: `tcp/lo (am, rma)`, `sysv/memory (am), cma/memory (rma)`.
pub(crate) fn describe_lanes(lanes: &[ringfs_ucx::Lane]) -> String {
    let mut described: Vec<String> = Vec::new();
    for lane in lanes {
        let mut uses = Vec::new();
        if lane.active_messages {
            uses.push("am");
        }
        if lane.rma {
            uses.push("rma");
        }
        if uses.is_empty() {
            continue;
        }
        let text = format!("{} ({})", lane.transport, uses.join(", "));
        if !described.contains(&text) {
            described.push(text);
        }
    }
    if described.is_empty() { "no lanes yet".into() } else { described.join(", ") }
}
