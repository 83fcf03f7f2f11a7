//! Requests sent to chosen servers, for libraries built on the client that have messages
//! and placement of their own (the global memory, `crates/gmem`): they share the client's
//! connections, member list and failure handling.

use std::sync::Arc;

use ringfs_proto::Errno;
use ringfs_rpc::{Connection, PendingCall, Reply};

use crate::{Client, Result};

impl Client {
    /// A connection to the server named `server` (EIO if it is not a live member or cannot
    /// be reached).
    pub fn connection_to(&self, server: &str) -> Result<Arc<Connection>> {
        let cluster = &self.inner.cluster;
        let member = cluster.member_list().members.into_iter().find(|member| member.name == server).ok_or(Errno::EIO)?;
        cluster.connection(&member)
    }

    /// The settings of this client's connections (the job's secret, the request deadline),
    /// for connections to peers that are not servers (the global memory's rank caches).
    pub fn connection_config(&self) -> ringfs_rpc::ConnectionConfig {
        self.inner.cluster.connection_config()
    }

    /// Waits for `call`, started on `connection`: an error answer or a transport failure
    /// becomes an errno, and the member list follows what the server reports.
    pub fn finish_call(&self, connection: &Connection, call: std::result::Result<PendingCall<'_>, ringfs_rpc::RpcError>) -> Result<Reply> {
        self.inner.cluster.finish(connection, call)
    }

    /// Gives back leases `connection`'s server lent (with its next read, or in a batch).
    pub fn release_leases(&self, connection: &Connection, leases: Vec<ringfs_proto::LeaseId>) {
        self.inner.cluster.defer_releases(connection, leases);
    }

    /// The server that owns `key` by placement (as it owns a path's entry): the same for
    /// every client with the same member list.
    pub fn server_for_key(&self, key: &str) -> String {
        self.inner.cluster.owner_of_path(key).name
    }

    /// This host's identity, as the servers on it report it (`Member::host_id`).
    pub fn host_id(&self) -> u64 {
        self.inner.cluster.host_id()
    }

    /// How long a request may take before it fails with EIO.
    pub fn request_timeout(&self) -> std::time::Duration {
        self.inner.cluster.timeout()
    }
}
