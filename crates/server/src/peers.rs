//! Connections from this server to the other servers (for forwarding and coordination).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ringfs_proto::Member;
use ringfs_rpc::{Connection, ConnectionConfig, Endpoint, RpcError};

/// Opens connections to other servers on demand and keeps them.
pub struct Peers {
    config: ConnectionConfig,
    connections: Mutex<HashMap<String, Arc<Connection>>>,
}

impl Peers {
    pub fn new(config: ConnectionConfig) -> Peers {
        Peers { config, connections: Mutex::new(HashMap::new()) }
    }

    /// A working connection to `member` (Unix socket when it is on this host).
    pub fn connection(&self, member: &Member) -> Result<Arc<Connection>, RpcError> {
        if let Some(connection) = self.connections.lock().unwrap_or_else(|p| p.into_inner()).get(&member.name)
            && !connection.is_broken()
        {
            return Ok(connection.clone());
        }
        let connection = Arc::new(open(member, &self.config)?);
        self.connections.lock().unwrap_or_else(|p| p.into_inner()).insert(member.name.clone(), connection.clone());
        Ok(connection)
    }
}

/// Connects to a member, preferring its Unix socket when it runs on this host.
pub fn open(member: &Member, config: &ConnectionConfig) -> Result<Connection, RpcError> {
    if member.host_id == config.host_id
        && !member.unix_path.is_empty()
        && let Ok(connection) = Connection::open(&Endpoint::Unix(member.unix_path.clone().into()), config)
    {
        return Ok(connection);
    }
    let endpoint = Endpoint::parse(&member.tcp_address).map_err(|reason| RpcError::Connect { endpoint: member.tcp_address.clone(), reason })?;
    Connection::open(&endpoint, config)
}
