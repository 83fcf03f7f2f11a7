//! Backend holds: parts of the backend that must not change for a moment.
//!
//! A directory rename in the cached tree moves the directory in the backend too, and every
//! server then points its inodes and removal records at the new paths. Between the backend
//! move and the last server's update, a flush could land at a path that no longer (or not
//! yet) holds the file. So each server *holds* both paths for the rename: while a hold
//! covers a path, flushes of it are put back ([`super::FlushOutcome::Held`]) and an inode's
//! pending operation there is not applied (EBUSY). Reads that find a backend file missing
//! while a hold was taken or released are tried again by the server
//! (`ServerState::across_backend_moves`). A hold lapses by itself after its lease, like the
//! freeze it goes with.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ringfs_proto::path;

struct Hold {
    token: u64,
    paths: Vec<String>,
    until: Instant,
}

#[derive(Default)]
pub(crate) struct BackendHolds {
    holds: Mutex<Vec<Hold>>,
    /// Counts holds taken and released: a read that failed while it changed is tried again.
    generation: AtomicU64,
}

impl BackendHolds {
    fn lock(&self) -> parking_lot::MutexGuard<'_, Vec<Hold>> {
        let mut holds = self.holds.lock();
        let now = Instant::now();
        holds.retain(|hold| hold.until > now);
        holds
    }

    /// Holds `paths` (and everything below them) for `token`, for at most `lease`.
    pub fn hold(&self, token: u64, paths: &[&str], lease: Duration) {
        let mut holds = self.lock();
        self.generation.fetch_add(1, Ordering::SeqCst);
        holds.retain(|hold| hold.token != token);
        holds.push(Hold { token, paths: paths.iter().map(|path| path.to_string()).collect(), until: Instant::now() + lease });
    }

    pub fn release(&self, token: u64) {
        let mut holds = self.lock();
        let before = holds.len();
        holds.retain(|hold| hold.token != token);
        if holds.len() != before {
            self.generation.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Whether a hold covers `path`.
    pub fn covers(&self, path: &str) -> bool {
        self.lock().iter().any(|hold| hold.paths.iter().any(|held| path == held || path::is_inside(path, held)))
    }

    /// Whether any hold is in force.
    pub fn any(&self) -> bool {
        !self.lock().is_empty()
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_covers_its_paths_and_below_until_released_or_lapsed() {
        let holds = BackendHolds::default();
        holds.hold(7, &["/a/b", "/c"], Duration::from_secs(60));
        assert!(holds.covers("/a/b") && holds.covers("/a/b/x/y") && holds.covers("/c/d"));
        assert!(!holds.covers("/a") && !holds.covers("/a/bc") && !holds.covers("/cd"));
        let generation = holds.generation();
        holds.release(8);
        assert_eq!(holds.generation(), generation, "another token's release changes nothing");
        holds.release(7);
        assert!(!holds.covers("/a/b") && !holds.any());
        assert!(holds.generation() > generation);
        holds.hold(9, &["/e"], Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(5));
        assert!(!holds.covers("/e"), "a hold lapses after its lease");
    }
}
