//! The one way a server reaches the other servers: [`Outbound`].
//!
//! Every server-to-server request — a coordinator's step, a forwarded client request, a
//! broadcast, a failure-detection ping — leaves through this trait, so a test can stand
//! between the servers and hurt exactly the message it names (drop, delay, duplicate or hold
//! the second `InstallEntry` to server 2; see `testing.rs`), in the spirit of TiKV's
//! `transport_simulate.rs`. Production uses `Peers` (pooled connections, `peers.rs`).
//!
//! The trait only carries messages to *other* servers; a request a server makes of itself is
//! executed in place by the dispatcher (`Node` decides which is which), so the
//! coordinators never see the difference.

use std::time::{Duration, Instant};

use ringfs_proto::{Errno, Member, PeerTransport, Request};
use ringfs_rpc::Reply;

/// One request to another server: to whom, what, and its data section.
#[derive(Clone, Copy)]
pub struct OutboundCall<'a> {
    pub to: &'a Member,
    pub request: &'a Request,
    pub data: &'a [u8],
}

/// How a server sends requests to the other servers.
pub trait Outbound: Send + Sync {
    /// Sends every call at once, runs `meanwhile` (the caller's own step, done while the
    /// others are on their way), then waits for the answers until `until` at the latest
    /// (`None`: the transport's request deadline). The answers come in the order of `calls`;
    /// an error answer (`Response::Error`) and a transport failure (EIO: the peer is dead,
    /// unreachable or too slow) are both `Err`.
    fn call_each(&self, calls: &[OutboundCall<'_>], until: Option<Instant>, meanwhile: &mut dyn FnMut()) -> Vec<Result<Reply, Errno>>;

    /// Sends one call and waits for its answer (see [`Outbound::call_each`]).
    fn call(&self, call: OutboundCall<'_>) -> Result<Reply, Errno> {
        self.call_until(call, None)
    }

    /// Sends one call and waits for its answer until `until` at the latest (see
    /// [`Outbound::call_each`]).
    fn call_until(&self, call: OutboundCall<'_>, until: Option<Instant>) -> Result<Reply, Errno> {
        self.call_each(&[call], until, &mut || {}).pop().unwrap_or(Err(Errno::EIO))
    }

    /// Sends `request` to the cache of a global-memory rank at `endpoint` (a home's
    /// coherence step) and waits for its answer, as the rank gave it (an error answer is
    /// `Ok`); `Err` only when the rank could not be reached.
    fn call_rank(&self, endpoint: &str, request: &Request, data: &[u8]) -> Result<Reply, Errno>;

    /// Whether `member` answers a ping within `timeout` (failure detection: a short deadline
    /// of its own, whatever the request deadline is).
    fn ping(&self, member: &Member, timeout: Duration) -> bool;

    /// How the connections to the other servers are carried, where the transport can say
    /// (UCX's lanes, `ringfs status`); empty otherwise.
    fn transports(&self) -> Vec<PeerTransport> {
        Vec::new()
    }
}

/// Runs an idempotent step again while it fails with EIO (its answer may have been lost, or
/// its server cut off for a moment), for about two seconds.
pub fn retry_uncertain<T>(step: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
    retry_uncertain_for(Duration::from_secs(2), step)
}

/// [`retry_uncertain`] for up to `limit`.
pub fn retry_uncertain_for<T>(limit: Duration, mut step: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
    let deadline = crate::sched::now() + limit;
    let mut pause = Duration::from_millis(20);
    loop {
        match step() {
            Err(Errno::EIO) if crate::sched::now() + pause < deadline => {
                crate::sched::pause(pause);
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            outcome => return outcome,
        }
    }
}
