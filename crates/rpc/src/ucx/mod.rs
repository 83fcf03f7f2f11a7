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
//! A process has one UCX worker, for its client connections ([`client`]) and for the RPC
//! servers it runs on UCX ([`server`]) alike: a server's calls to other servers, a
//! global-memory rank's cache beside its client. One worker each would be simpler, but UCX
//! 1.13 (Debian's) aborts a process with two workers that open and close connections at the
//! same time (`async.c:643 Assertion 'handler->async == async' failed`, fixed in UCX 1.17,
//! openucx/ucx#9942; shown by `crates/ucx/tests/async_contexts.rs`): it queues a socket's
//! events that came while a worker was busy, keeps them when the socket closes, and hands
//! them later to whatever handler the reused descriptor number then belongs to — another
//! worker's. One cluster start in about 300 lost a server to it.
//! Threads share the worker one at a time ([`engine`]):
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

use ringfs_sync::Mutex;
use ringfs_ucx::IncomingMessage;
use ringfs_ucx::frames::{REQUEST, RESPONSE};
use std::sync::{Arc, Weak};

/// What the process's engine keeps for a connection: the client's half (a connection this
/// process opened) or the server's (one a listener of this process accepted).
pub(crate) enum Side {
    Client(client::ClientSide),
    Server(server::ServerSide),
}

/// The protocol of the process's worker: responses on the connections it opened
/// ([`client`]), requests on those it accepted ([`server`]).
pub(crate) struct Node;

pub(crate) type Engine = engine::Engine<Node>;
pub(crate) type State = engine::State<Node>;

impl engine::Protocol for Node {
    type Side = Side;
    /// Only servers move data themselves (a client lends its memory).
    type Transfer = server::Transfer;

    fn route(state: &mut State, key: usize, message: IncomingMessage) {
        match state.links.get(&key).map(|link| &link.side) {
            Some(Side::Client(_)) => state.route_response(key, message),
            Some(Side::Server(_)) => state.route_request(key, message),
            None => {}
        }
    }

    fn advance_transfers(state: &mut State) -> usize {
        state.advance_transfers()
    }

    fn close_side(side: &Side, reason: &str) {
        match side {
            Side::Client(client) => client.inbox.close(reason),
            Side::Server(server) => server.inbox.close(reason),
        }
    }

    fn transfer_connection(transfer: &server::Transfer) -> Option<usize> {
        transfer.connection()
    }
}

/// The process's engine, shared by its connections and servers and destroyed with the last of
/// them (the next one makes a new one): a process done with ringfs leaves no UCX worker for
/// the libraries' destructors at `exit` to find in use. Made again in a forked child.
pub(crate) fn process_engine() -> Result<Arc<Engine>, ringfs_ucx::Error> {
    static ENGINE: Mutex<Option<(u32, Weak<Engine>)>> = Mutex::new(None);
    let mut slot = ENGINE.lock();
    let pid = std::process::id();
    if let Some((owner, engine)) = &*slot
        && *owner == pid
        && let Some(engine) = engine.upgrade()
    {
        return Ok(engine);
    }
    let engine = Engine::new(Settings::from_env())?;
    {
        let state = engine.lock();
        state.worker.accept_messages(RESPONSE)?;
        state.worker.accept_messages(REQUEST)?;
    }
    if let Some((owner, inherited)) = slot.replace((pid, Arc::downgrade(&engine)))
        && owner != pid
        && let Some(inherited) = inherited.upgrade()
    {
        // The parent's worker, still held by connections this child inherited: never
        // destroyed here (UCX state does not survive `fork`), whatever they do.
        std::mem::forget(inherited);
    }
    Ok(engine)
}

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

/// UCX workers alive in this process for ringfs: one while it has a UCX connection or server,
/// 0 once every connection and server is dropped: nothing of ringfs is then inside UCX when
/// the process exits and the libraries' destructors run (which once corrupted the heap of a
/// rank still polling).
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
