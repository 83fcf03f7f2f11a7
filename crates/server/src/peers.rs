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
//! connection.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::Mutex;
use std::time::Duration;

use ringfs_proto::Member;
use ringfs_rpc::{Connection, ConnectionConfig, RpcError};

/// Idle connections kept per server; connections returned beyond that are closed.
const IDLE_PER_PEER: usize = 8;

/// Opens connections to other servers on demand and keeps the idle ones.
pub struct Peers {
    config: ConnectionConfig,
    idle: Mutex<HashMap<String, Vec<Connection>>>,
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
        Peers { config, idle: Mutex::new(HashMap::new()) }
    }

    /// How connections to other servers are made.
    pub fn config(&self) -> &ConnectionConfig {
        &self.config
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
            let mut idle = self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let pool = idle.entry(member.name.clone()).or_default();
            pool.retain(|connection| !connection.is_broken());
            // A member restarted elsewhere: its old connections are broken or go elsewhere;
            // broken ones were dropped above, the rest fail their call and are dropped then.
            pool.pop()
        };
        let (connection, keep) = match (reused, open_timeout) {
            (Some(connection), _) => (connection, true),
            (None, None) => (Connection::open_member(member, &self.config)?, true),
            (None, Some(timeout)) => {
                let config = ConnectionConfig { timeout: timeout.min(self.config.timeout), ..self.config.clone() };
                (Connection::open_member(member, &config)?, false)
            }
        };
        Ok(PeerConnection { peers: self, member: member.name.clone(), connection: Some(connection), keep })
    }
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
        let mut idle = self.peers.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let pool = idle.entry(std::mem::take(&mut self.member)).or_default();
        if pool.len() < IDLE_PER_PEER {
            pool.push(connection);
        }
    }
}
