//! Connections from this server to the other servers (for forwarding and coordination).
//!
//! **Each call in flight has a connection of its own.** A server answers the requests of one
//! connection in order, and some server-to-server requests wait in their handler (for a name
//! lock, the namespace lock, a frozen subtree). Had two calls to the same server shared one
//! connection, the second would queue behind the first's wait — and if the first waits for
//! something only the second can finish (the lock holder's next step, a thaw, a ping that
//! proves we are alive), both stall until a deadline and fail with EIO. So a call borrows an
//! idle connection from a small pool, or opens one, and gives it back when it is done:
//! concurrent calls never queue behind each other, and a lone caller keeps reusing one
//! connection. A pooled connection is checked for a hang-up before it is lent (a server
//! killed and restarted at once left its peers holding dead connections, and their next
//! calls failed with EIO).
//!
//! [`Peers`] is the production [`Outbound`]: every request to another server leaves through it.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringfs_proto::{Errno, Member, PeerTransport, Request, Response};
use ringfs_rpc::{Connection, ConnectionConfig, Reply, RpcError};

use crate::outbound::{Outbound, OutboundCall};

/// Idle connections kept per server; connections returned beyond that are closed.
const IDLE_PER_PEER: usize = 8;

/// Opens connections to other servers on demand and keeps the idle ones.
pub struct Peers {
    config: ConnectionConfig,
    idle: Mutex<HashMap<String, Vec<Connection>>>,
    /// Connections to the caches of global-memory ranks, by endpoint (shared by concurrent
    /// calls: a rank's cache answers each at once, without waiting for others).
    ranks: Mutex<HashMap<String, Arc<Connection>>>,
    /// The transports UCX chose for the last connection opened to each server (by name, in
    /// order: `ringfs status` lists them so).
    transports: Mutex<BTreeMap<String, String>>,
}

/// A connection lent to one caller; it returns to the pool when dropped (unless broken).
pub struct PeerConnection<'a> {
    peers: &'a Peers,
    member: String,
    connection: Option<Connection>,
    /// Whether the connection goes back to the pool when dropped.
    keep: bool,
}

impl Peers {
    pub fn new(config: ConnectionConfig) -> Peers {
        Peers { config, idle: Mutex::new(HashMap::new()), ranks: Mutex::new(HashMap::new()), transports: Mutex::new(BTreeMap::new()) }
    }

    /// A working connection to `member` (Unix socket when it is on this host) for the
    /// caller's use alone, until the returned guard is dropped.
    pub fn connection(&self, member: &Member) -> Result<PeerConnection<'_>, RpcError> {
        self.connection_within(member, None)
    }

    /// [`Peers::connection`], opening a new connection within `open_timeout` instead of the
    /// request deadline: a failure-detection ping to a stopped server must not wait for a
    /// handshake as long as a request may. Such a connection is not kept for later calls
    /// (its requests would have the short deadline too).
    pub fn connection_within(&self, member: &Member, open_timeout: Option<Duration>) -> Result<PeerConnection<'_>, RpcError> {
        let reused = {
            let mut idle = self.idle.lock();
            let pool = idle.entry(member.name.clone()).or_default();
            pool.retain(|connection| !connection.is_broken());
            // A member that died (and maybe came back at once) hung up its connections: each
            // is checked before it is lent, or the call on it would fail with EIO. (One
            // restarted elsewhere and not yet hung up fails its call, and is dropped then.)
            std::iter::from_fn(|| pool.pop()).find(|connection| !connection.hung_up())
        };
        if let Some(connection) = reused {
            return Ok(PeerConnection { peers: self, member: member.name.clone(), connection: Some(connection), keep: true });
        }
        let (connection, keep) = match open_timeout {
            None => (Connection::open_member(member, &self.config)?, true),
            Some(timeout) => {
                let config = ConnectionConfig { timeout: timeout.min(self.config.timeout), ..self.config.clone() };
                (Connection::open_member(member, &config)?, false)
            }
        };
        // Known once the handshake is answered; asked once per connection opened (UCX
        // describes an endpoint by printing it).
        if let Some(lanes) = connection.ucx_lanes() {
            self.transports.lock().insert(member.name.clone(), lanes);
        }
        Ok(PeerConnection { peers: self, member: member.name.clone(), connection: Some(connection), keep })
    }
}

impl Outbound for Peers {
    fn call_each(&self, calls: &[OutboundCall<'_>], until: Option<Instant>, meanwhile: &mut dyn FnMut()) -> Vec<Result<Reply, Errno>> {
        // Every call is on the wire before the first answer is awaited. Calls bounded by
        // `until` are best effort (their callers report what did not arrive): not warned of.
        let level = if until.is_some() { log::Level::Debug } else { log::Level::Warn };
        let connections: Vec<Result<PeerConnection<'_>, Errno>> = calls
            .iter()
            .map(|call| {
                self.connection(call.to).map_err(|error| {
                    log::log!(level, "cannot reach server {}: {error}", call.to.name);
                    error.errno()
                })
            })
            .collect();
        let started: Vec<_> = connections
            .iter()
            .zip(calls)
            .map(|(connection, call)| {
                let connection = connection.as_ref().map_err(|errno| *errno)?;
                connection.start(call.request, call.data, None).map_err(|error| failed(call.to, &error, level))
            })
            .collect();
        meanwhile();
        started
            .into_iter()
            .zip(calls)
            .map(|(pending, call)| {
                let reply = match until {
                    Some(until) => pending?.wait_until(until),
                    None => pending?.wait(),
                };
                let reply = reply.map_err(|error| failed(call.to, &error, level))?;
                match reply.response {
                    Response::Error(errno) => Err(errno),
                    _ => Ok(reply),
                }
            })
            .collect()
    }

    fn call_rank(&self, endpoint: &str, request: &Request, data: &[u8]) -> Result<Reply, Errno> {
        self.rank_connection(endpoint)?.call(request, data).map_err(|error| {
            log::warn!("a request to the rank cache at {endpoint} failed: {error}");
            error.errno()
        })
    }

    fn transports(&self) -> Vec<PeerTransport> {
        let transports = self.transports.lock();
        transports.iter().map(|(server, transports)| PeerTransport { server: server.clone(), transports: transports.clone() }).collect()
    }

    fn ping(&self, member: &Member, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        match self.connection_within(member, Some(timeout)) {
            Ok(connection) => {
                let left = deadline.saturating_duration_since(Instant::now());
                !left.is_zero() && connection.call_within(&Request::Ping, left).is_ok()
            }
            Err(error) => {
                log::debug!("cannot reach server {}: {error}", member.name);
                false
            }
        }
    }
}

impl Peers {
    /// A connection to a rank's cache at `endpoint`.
    fn rank_connection(&self, endpoint: &str) -> Result<Arc<Connection>, Errno> {
        let mut ranks = self.ranks.lock();
        if let Some(connection) = ranks.get(endpoint)
            && !connection.is_broken()
        {
            return Ok(connection.clone());
        }
        let parsed = ringfs_rpc::Endpoint::parse(endpoint).map_err(|_| Errno::EINVAL)?;
        let connection = Arc::new(Connection::open(&parsed, &self.config).map_err(|error| {
            log::warn!("cannot connect to the rank cache at {endpoint}: {error}");
            error.errno()
        })?);
        ranks.insert(endpoint.to_string(), connection.clone());
        Ok(connection)
    }
}

/// A call to `to` that got no answer: logged, and EIO (or the errno of a refusal).
fn failed(to: &Member, error: &RpcError, level: log::Level) -> Errno {
    log::log!(level, "request to server {} failed: {error}", to.name);
    error.errno()
}

impl Deref for PeerConnection<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.connection.as_ref().expect("a lent connection is present until dropped")
    }
}

impl Drop for PeerConnection<'_> {
    fn drop(&mut self) {
        let Some(connection) = self.connection.take() else { return };
        if !self.keep || !connection.is_idle() {
            // Broken, or the server still works on a request we gave up on.
            return;
        }
        let mut idle = self.peers.idle.lock();
        let pool = idle.entry(std::mem::take(&mut self.member)).or_default();
        if pool.len() < IDLE_PER_PEER {
            pool.push(connection);
        }
    }
}
