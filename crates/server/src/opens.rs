//! Which clients have which files open, on the server that holds the files' inodes.
//!
//! A file whose last name is removed stays while it is open (POSIX), so the inode's server
//! counts opens (in the inode) and remembers who made them (here). A client is known by the id
//! it sends in its `Hello`; its opens last while it has a connection to this server, and for
//! [`GRACE`] after its last one closes — long enough to reconnect after a broken connection,
//! short enough that the files a crashed client had open do not hold space for long. A client
//! that registered an open without a connection of its own (through another server) is treated
//! as disconnected from that moment. The advisory locks a client holds here (`file_locks.rs`)
//! end with its opens, so a client that took a lock is remembered the same way.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use ringfs_proto::FileId;

/// How long the opens of a client without connections are kept.
pub const GRACE: Duration = Duration::from_secs(30);

#[derive(Default)]
struct ClientOpens {
    connections: u32,
    /// When the last connection closed (`None` while connected).
    gone_since: Option<Instant>,
    files: HashMap<FileId, u32>,
    /// The client has taken advisory locks here (they end when it expires).
    locking: bool,
}

impl ClientOpens {
    /// Nothing to remember once its connections are gone.
    fn is_forgettable(&self) -> bool {
        self.files.is_empty() && !self.locking
    }
}

/// What [`OpenRegistry::expire`] ended.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Expired {
    /// Each file with the number of opens to end.
    pub files: Vec<(FileId, u32)>,
    /// The clients that had taken locks here: their locks end.
    pub locking_clients: Vec<u64>,
}

/// The opens of every client, by client id.
#[derive(Default)]
pub struct OpenRegistry {
    clients: Mutex<HashMap<u64, ClientOpens>>,
}

impl OpenRegistry {
    fn clients(&self) -> parking_lot::MutexGuard<'_, HashMap<u64, ClientOpens>> {
        self.clients.lock()
    }

    /// A connection of `client` was established.
    pub fn connected(&self, client: u64) {
        let mut clients = self.clients();
        let opens = clients.entry(client).or_default();
        opens.connections += 1;
        opens.gone_since = None;
    }

    /// A connection of `client` ended.
    pub fn disconnected(&self, client: u64) {
        let mut clients = self.clients();
        let Some(opens) = clients.get_mut(&client) else { return };
        opens.connections = opens.connections.saturating_sub(1);
        if opens.connections == 0 {
            if opens.is_forgettable() {
                clients.remove(&client);
            } else {
                opens.gone_since = Some(crate::sched::now());
            }
        }
    }

    /// `client` opened `file` (the inode counted it already).
    pub fn opened(&self, client: u64, file: FileId) {
        let mut clients = self.clients();
        let opens = Self::known(&mut clients, client);
        *opens.files.entry(file).or_default() += 1;
    }

    /// `client` took an advisory lock here.
    pub fn took_lock(&self, client: u64) {
        let mut clients = self.clients();
        Self::known(&mut clients, client).locking = true;
    }

    /// The entry of `client`, made if needed (a client without a connection here is gone
    /// from now on).
    fn known(clients: &mut HashMap<u64, ClientOpens>, client: u64) -> &mut ClientOpens {
        let opens = clients.entry(client).or_default();
        if opens.connections == 0 && opens.gone_since.is_none() {
            opens.gone_since = Some(crate::sched::now());
        }
        opens
    }

    /// `client` closed `file`; false if it had no open of it registered here (the inode must
    /// then not be told).
    pub fn closed(&self, client: u64, file: FileId) -> bool {
        let mut clients = self.clients();
        let Some(opens) = clients.get_mut(&client) else { return false };
        let Some(count) = opens.files.get_mut(&file) else { return false };
        *count -= 1;
        if *count == 0 {
            opens.files.remove(&file);
        }
        if opens.is_forgettable() && opens.connections == 0 {
            clients.remove(&client);
        }
        true
    }

    /// Takes out the opens of clients gone for longer than `grace`: each file with the number
    /// of opens to end, and the clients whose locks end.
    pub fn expire(&self, grace: Duration) -> Expired {
        let mut clients = self.clients();
        let now = crate::sched::now();
        let expired: Vec<u64> = clients
            .iter()
            .filter(|(_, opens)| opens.gone_since.is_some_and(|since| now.duration_since(since) >= grace))
            .map(|(id, _)| *id)
            .collect();
        let mut ended = Expired::default();
        for client in expired {
            if let Some(opens) = clients.remove(&client) {
                if !opens.files.is_empty() {
                    log::info!("client {client:016x} is gone; ending its {} open files", opens.files.len());
                }
                ended.files.extend(opens.files);
                if opens.locking {
                    ended.locking_clients.push(client);
                }
            }
        }
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(serial: u64) -> FileId {
        FileId { anchor: 1, serial }
    }

    #[test]
    fn opens_of_a_client_end_after_its_connections_are_gone_for_the_grace_period() {
        let registry = OpenRegistry::default();
        registry.connected(1);
        registry.opened(1, file(1));
        registry.opened(1, file(1));
        registry.opened(1, file(2));
        assert!(registry.closed(1, file(2)));
        assert!(!registry.closed(1, file(2)), "closed once only");
        assert!(!registry.closed(9, file(1)), "another client's close does not count");
        assert_eq!(registry.expire(Duration::ZERO), Expired::default(), "connected clients keep their opens");
        registry.disconnected(1);
        registry.connected(1);
        assert_eq!(registry.expire(Duration::ZERO), Expired::default(), "a reconnect keeps them too");
        registry.disconnected(1);
        assert_eq!(registry.expire(Duration::from_secs(60)), Expired::default(), "within the grace period");
        assert_eq!(registry.expire(Duration::ZERO).files, vec![(file(1), 2)]);
        assert_eq!(registry.expire(Duration::ZERO), Expired::default());
    }

    #[test]
    fn an_open_registered_without_a_connection_of_the_client_expires() {
        let registry = OpenRegistry::default();
        registry.opened(5, file(3));
        assert_eq!(registry.expire(Duration::ZERO).files, vec![(file(3), 1)]);
    }

    #[test]
    fn a_client_that_took_locks_is_remembered_until_it_expires() {
        let registry = OpenRegistry::default();
        registry.connected(4);
        registry.took_lock(4);
        registry.disconnected(4);
        assert_eq!(registry.expire(Duration::from_secs(60)), Expired::default(), "within the grace period");
        assert_eq!(registry.expire(Duration::ZERO), Expired { files: vec![], locking_clients: vec![4] });
    }
}
