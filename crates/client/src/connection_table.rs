//! The client's connections to servers: opened when first needed, given back when idle.
//!
//! A process holds a connection only to the servers it talks to (a rank that writes its own
//! file and reads a few others touches a few servers, not all of them), and a connection that
//! stayed unused for the configured idle time is closed (the next request to that server
//! opens a new one, transparently). A server keeps a client's opens — and the locks taken
//! through them — only while the client has a connection to it, and for a grace period
//! after (`crates/server/src/opens.rs`): so nothing is closed while this process holds any
//! open or reference (*holds*, counted by the callers that register them).

use ringfs_sync::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ringfs_rpc::Connection;

/// How long a connection must have been unused before it is checked for a server that hung
/// up (a non-blocking read; requests in quick succession do not pay it, and no server is
/// killed and back again that fast).
const HANGUP_CHECK_AFTER: Duration = Duration::from_millis(2);

/// A connection and when it was last handed out.
struct Pooled {
    connection: Arc<Connection>,
    last_used: Instant,
}

/// Connections by server name.
#[derive(Default)]
pub(crate) struct ConnectionTable {
    entries: Mutex<HashMap<String, Pooled>>,
    /// Opens and references this process has registered at servers and not yet closed.
    holds: AtomicUsize,
}

impl ConnectionTable {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Pooled>> {
        self.entries.lock()
    }

    /// The working connection to `server`, if there is one (it counts as used now). One
    /// unused for [`HANGUP_CHECK_AFTER`] is first checked for a server that hung up (one
    /// killed and restarted at once: the next request on it would fail with EIO); then the
    /// caller opens a new one.
    pub fn usable(&self, server: &str) -> Option<Arc<Connection>> {
        let mut entries = self.lock();
        let pooled = entries.get_mut(server).filter(|pooled| !pooled.connection.is_broken())?;
        if pooled.last_used.elapsed() >= HANGUP_CHECK_AFTER && pooled.connection.hung_up() {
            return None;
        }
        pooled.last_used = Instant::now();
        Some(pooled.connection.clone())
    }

    /// Keeps `connection` as the one to `server`.
    pub fn insert(&self, server: String, connection: Arc<Connection>) {
        self.lock().insert(server, Pooled { connection, last_used: Instant::now() });
    }

    /// Calls `visit` on every connection held.
    pub fn for_each(&self, mut visit: impl FnMut(&Connection)) {
        for pooled in self.lock().values() {
            visit(&pooled.connection);
        }
    }

    /// An open or reference was registered at a server.
    pub fn hold(&self) {
        self.holds.fetch_add(1, Ordering::SeqCst);
    }

    /// An open or reference registered before is being closed.
    pub fn release(&self) {
        let _ = self.holds.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |holds| holds.checked_sub(1));
    }

    /// Closes the connections unused for `idle_for` that owe no answer and that nobody is
    /// using, unless this process holds opens; the names of the servers they went to.
    pub fn close_idle(&self, idle_for: Duration) -> Vec<String> {
        if self.holds.load(Ordering::SeqCst) > 0 {
            return Vec::new();
        }
        let mut entries = self.lock();
        let idle: Vec<String> = entries
            .iter()
            .filter(|(_, pooled)| {
                pooled.last_used.elapsed() >= idle_for && Arc::strong_count(&pooled.connection) == 1 && pooled.connection.is_idle()
            })
            .map(|(server, _)| server.clone())
            .collect();
        for server in &idle {
            entries.remove(server);
        }
        idle
    }
}
