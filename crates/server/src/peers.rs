//! Connections from this server to the other servers (for forwarding and coordination).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ringfs_proto::Member;
use ringfs_rpc::{Connection, ConnectionConfig, RpcError};

/// Opens connections to other servers on demand and keeps them.
pub struct Peers {
    config: ConnectionConfig,
    connections: Mutex<HashMap<String, Arc<Connection>>>,
}

impl Peers {
    pub fn new(config: ConnectionConfig) -> Peers {
        Peers { config, connections: Mutex::new(HashMap::new()) }
    }

    /// How connections to other servers are made.
    pub fn config(&self) -> &ConnectionConfig {
        &self.config
    }

    /// A working connection to `member` (Unix socket when it is on this host).
    pub fn connection(&self, member: &Member) -> Result<Arc<Connection>, RpcError> {
        if let Some(connection) = self.connections.lock().unwrap_or_else(|p| p.into_inner()).get(&member.name)
            && !connection.is_broken()
        {
            return Ok(connection.clone());
        }
        let connection = Arc::new(Connection::open_member(member, &self.config)?);
        self.connections.lock().unwrap_or_else(|p| p.into_inner()).insert(member.name.clone(), connection.clone());
        Ok(connection)
    }
}
