//! What a server keeps per connection: who the peer is, what it may do, and what it was lent.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use ringfs_proto::{Credentials, LeaseId};
use ringfs_rpc::memory::ProcessMemory;

/// Clock samples kept per session (see `Session::clock_samples`).
pub const CLOCK_SAMPLES: usize = 32;

/// Per-connection state.
#[derive(Default)]
pub struct Session {
    /// Memory of a client on this host that proved we can read it.
    pub client_memory: Option<ProcessMemory>,
    /// The peer is another server: its requests are never forwarded again.
    pub from_server: bool,
    /// Another server's host id and process id (from its `Hello`): whose renames and links
    /// take name locks here.
    pub server_process: Option<(u64, u32)>,
    /// The client's id (from its `Hello`), whose opens this connection keeps alive.
    pub client_id: Option<u64>,
    /// Buffers lent to the client by leased reads (of chunks and of global-memory blocks),
    /// until it releases them.
    pub leases: HashMap<LeaseId, Arc<dyn std::any::Any + Send + Sync>>,
    next_lease_id: u64,
    /// How long a client waits for an answer, less a margin (from its `Hello`): requests are
    /// handled with that deadline (`deadline::client_deadline`).
    pub patience: Option<Duration>,
    /// Recent samples of this server's clock less the client's stamp on a request (the
    /// `Hello` first): each is the clocks' offset plus that message's delay on the way, so
    /// their minimum is the best estimate of the offset, and a request's sample above it is
    /// its delay. A few dozen are kept, so that a clock set back is forgotten soon.
    pub clock_samples: VecDeque<i64>,
    /// Whom a client's requests act for (from its `Hello`); `None` for another server, whose
    /// requests are steps of requests checked already.
    pub credentials: Option<Arc<Credentials>>,
}

impl Session {
    /// A session for a request this server makes of itself (a coordination step it owns).
    pub fn local() -> Session {
        Session { from_server: true, ..Session::default() }
    }

    /// The client gives back the buffers of `leases`.
    pub fn release(&mut self, leases: &[LeaseId]) {
        for lease in leases {
            self.leases.remove(lease);
        }
    }

    /// Lends `buffer` to the client until it releases the returned lease id.
    pub fn lend(&mut self, buffer: Arc<dyn std::any::Any + Send + Sync>) -> LeaseId {
        let lease_id = LeaseId(self.next_lease_id);
        self.next_lease_id += 1;
        self.leases.insert(lease_id, buffer);
        lease_id
    }
}
