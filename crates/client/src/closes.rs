//! Closes sent in batches.
//!
//! Servers count the opens of every file (a file unlinked while open lives until its last
//! close), so each close must reach the file's inode server. It need not reach it at once: a
//! close only ever lets a server free an unlinked file sooner. Sending one message per close
//! cost creating programs (create, write, close, …) about a tenth of their rate, so closes
//! wait here and go out together: one `Close` per server, once [`BATCH`] have gathered or
//! the oldest has waited [`DELAY`] (a background thread sends them then), and whatever is
//! left when the client goes. The same thread, when it has nothing to send for
//! [`IDLE_CHECK`], closes the connections the client has not used for a while.

use ringfs_sync::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ringfs_proto::{ChunkKey, Close, FileId, Request};

use crate::cluster::Cluster;

/// Closes sent in one go at most (a batch this large goes out at once).
const BATCH: usize = 256;
/// Longest a close waits before it is sent.
pub(crate) const DELAY: Duration = Duration::from_millis(2);
/// How often idle connections are looked for.
const IDLE_CHECK: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Pending {
    files: Vec<FileId>,
    /// When the oldest of `files` was closed.
    since: Option<Instant>,
    /// The client is gone: the sender thread ends.
    ended: bool,
}

#[derive(Default)]
pub(crate) struct CloseQueue {
    pending: Mutex<Pending>,
    wake: Condvar,
    /// The sender thread, joined by [`CloseQueue::end`].
    sender: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl CloseQueue {
    fn lock(&self) -> ringfs_sync::MutexGuard<'_, Pending> {
        self.pending.lock()
    }

    /// Starts the thread that sends closes that have waited [`DELAY`]; it ends when the
    /// cluster is dropped.
    pub fn start(self: &Arc<Self>, cluster: Weak<Cluster>, client: u64) {
        let queue = Arc::clone(self);
        let spawned = std::thread::Builder::new().name("ringfs-closes".into()).spawn(move || {
            loop {
                let due = {
                    let mut pending = queue.lock();
                    loop {
                        if pending.ended {
                            return;
                        }
                        match pending.since {
                            Some(since) if since.elapsed() >= DELAY => break std::mem::take(&mut *pending).files,
                            Some(since) => {
                                let wait = DELAY - since.elapsed();
                                queue.wake.wait_for(&mut pending, wait);
                            }
                            None => {
                                let waited = queue.wake.wait_for(&mut pending, IDLE_CHECK);
                                if waited.timed_out() && pending.since.is_none() && !pending.ended {
                                    let Some(cluster) = cluster.upgrade() else { return };
                                    ringfs_sync::MutexGuard::unlocked(&mut pending, || cluster.close_idle_connections());
                                }
                            }
                        }
                    }
                };
                match cluster.upgrade() {
                    Some(cluster) => send(&cluster, client, due),
                    None => return,
                }
            }
        });
        match spawned {
            Ok(sender) => *self.sender.lock() = Some(sender),
            Err(error) => {
                log::warn!("no thread for batched closes ({error}): closes go out as they come");
                self.lock().ended = true;
            }
        }
    }

    /// Queues a close; sends the batch now if it is full or due (or if no thread sends).
    pub fn close(&self, cluster: &Cluster, client: u64, file: FileId) {
        let mut pending = self.lock();
        pending.files.push(file);
        let since = *pending.since.get_or_insert_with(Instant::now);
        if pending.files.len() >= BATCH || since.elapsed() >= DELAY || pending.ended {
            let files = std::mem::take(&mut pending.files);
            pending.since = None;
            drop(pending);
            send(cluster, client, files);
        } else if pending.files.len() == 1 {
            self.wake.notify_one();
        }
    }

    /// Sends every close waiting now (before the client goes, or before an operation that
    /// should see them).
    pub fn flush(&self, cluster: &Cluster, client: u64) {
        let files = {
            let mut pending = self.lock();
            pending.since = None;
            std::mem::take(&mut pending.files)
        };
        send(cluster, client, files);
    }

    /// Ends the sender thread and waits for it: a client being dropped is then torn down
    /// in the thread dropping it, never in the sender (which may hold the cluster for a
    /// moment) while that thread goes on, perhaps to exit the process.
    pub fn end(&self) {
        self.lock().ended = true;
        self.wake.notify_one();
        let sender = self.sender.lock().take();
        if let Some(sender) = sender {
            let _ = ringfs_sync::join_unless_current(sender);
        }
    }
}

/// One `Close` per inode server for `files`.
fn send(cluster: &Cluster, client: u64, files: Vec<FileId>) {
    let mut by_home: HashMap<String, (ringfs_proto::Member, Vec<FileId>)> = HashMap::new();
    for file in files {
        let home = cluster.owner_of_chunk(ChunkKey::inode(file));
        by_home.entry(home.name.clone()).or_insert_with(|| (home, Vec::new())).1.push(file);
    }
    for (_, (home, files)) in by_home {
        cluster.send_to(&home, &Request::Close(Close { client, files }));
    }
}
