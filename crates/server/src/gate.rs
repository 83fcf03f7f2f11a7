//! The namespace gate: subtrees frozen by directory renames.
//!
//! A directory rename moves every entry below the directory from server to server. While it
//! does, the two subtrees (old and new path) are *frozen* on every server: operations on
//! names inside them wait (except the rename's own steps, which carry its token), and
//! operations already under way finish before the freeze is in place, so no name is created,
//! removed or looked up half-way through the move. Freezes have a lease.
//!
//! **Nothing waits while holding a gate pass.** A freeze waits for the passes held, and the
//! rename that holds a name may need to pass the gate (here or elsewhere) to finish: an
//! operation that held a pass while waiting for that name closed a circle (operation → name
//! lock → rename → gate → freeze → operation) that only a deadline broke. So an operation
//! first takes its name (a short hold, `NameLocks::hold`, waiting for any rename of it),
//! then the pass, and gives both back when its local step is done (`Names::enter_name`).

use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use ringfs_proto::Errno;
use ringfs_proto::RenameToken;
use ringfs_proto::path;

use crate::deadline::{wait_end, wait_failure};
use crate::name_locks::{EndedTokens, LEASE, SLOW_WAIT};

struct Freeze {
    token: RenameToken,
    roots: [String; 2],
    until: Instant,
}

impl Freeze {
    fn covers(&self, path: &str) -> bool {
        self.roots.iter().any(|root| path == root || path::is_inside(path, root))
    }
}

/// The subtrees frozen on this server by directory renames (see the module documentation).
#[derive(Default)]
pub struct NamespaceGate {
    /// Directory-rename attempts thawed: a freeze of theirs arriving late is ignored.
    thawed_tokens: EndedTokens,
    frozen: Mutex<Vec<Freeze>>,
    /// `frozen.len()`, readable without the lock (the pass's fast path when nothing is frozen).
    frozen_count: AtomicUsize,
    thawed: Condvar,
    /// Operations on names hold it shared while they run; a freeze takes it exclusively for a
    /// moment, so operations under way finish before the freeze is in place.
    running: RwLock<()>,
}

/// Held while an operation on names runs (see [`NamespaceGate::pass`]).
pub struct GatePass<'a> {
    _running: RwLockReadGuard<'a, ()>,
}

impl NamespaceGate {
    /// Waits until none of `paths` lies in a subtree frozen by another rename than `token` (0:
    /// none), then lets the caller run its local step (keep the pass only for that step: never
    /// across a request to another server).
    pub fn pass(&self, paths: &[&str], token: RenameToken) -> Result<GatePass<'_>, Errno> {
        // Nothing frozen (nearly always): the pass is a read lock. A freeze counts itself
        // before it waits for the passes, so a pass taken after that sees the count.
        if self.frozen_count.load(Ordering::SeqCst) == 0 {
            let running = self.running.read();
            if self.frozen_count.load(Ordering::SeqCst) == 0 {
                return Ok(GatePass { _running: running });
            }
        }
        let started = crate::sched::now();
        let deadline = wait_end(started);
        let mut warned = false;
        loop {
            {
                let mut frozen = self.frozen.lock();
                loop {
                    let now = crate::sched::now();
                    frozen.retain(|freeze| freeze.until > now);
                    self.frozen_count.store(frozen.len(), Ordering::SeqCst);
                    let blocked = frozen.iter().any(|freeze| freeze.token != token && paths.iter().any(|path| freeze.covers(path)));
                    if !blocked {
                        break;
                    }
                    if now >= deadline {
                        return Err(wait_failure());
                    }
                    if !warned && now - started > SLOW_WAIT {
                        warned = true;
                        log::warn!("waiting {:?} for a thaw of {paths:?}", now - started);
                    }
                    crate::sched::wait_timeout(&self.thawed, &mut frozen, (deadline - now).min(LEASE));
                }
            }
            let running = self.running.read();
            // A freeze may have come in between: check again while holding the pass.
            let frozen = self.frozen.lock();
            let now = crate::sched::now();
            let blocked =
                frozen.iter().any(|freeze| freeze.token != token && freeze.until > now && paths.iter().any(|path| freeze.covers(path)));
            drop(frozen);
            if !blocked {
                return Ok(GatePass { _running: running });
            }
        }
    }

    /// Freezes the subtrees `from` and `to` for `token`; returns once every operation that was
    /// running has finished.
    pub fn freeze(&self, token: RenameToken, from: &str, to: &str) {
        if self.thawed_tokens.has_ended(token) {
            return; // overtaken by its thaw: that attempt is over
        }
        {
            let mut frozen = self.frozen.lock();
            frozen.retain(|freeze| freeze.token != token);
            frozen.push(Freeze { token, roots: [from.to_string(), to.to_string()], until: crate::sched::now() + LEASE });
            self.frozen_count.store(frozen.len(), Ordering::SeqCst);
        }
        let started = crate::sched::now();
        drop(self.running.write());
        if crate::sched::since(started) > SLOW_WAIT {
            log::warn!("the freeze of {from} and {to} waited {:?} for running operations", crate::sched::since(started));
        }
    }

    /// Ends the freeze of `token`.
    pub fn thaw(&self, token: RenameToken) {
        self.thawed_tokens.end(token);
        let mut frozen = self.frozen.lock();
        frozen.retain(|freeze| freeze.token != token);
        self.frozen_count.store(frozen.len(), Ordering::SeqCst);
        drop(frozen);
        self.thawed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_freeze_holds_off_names_inside_its_subtrees_only() {
        let gate = Arc::new(NamespaceGate::default());
        gate.freeze(RenameToken(7), "/from", "/to");
        assert!(gate.pass(&["/other"], RenameToken::NONE).is_ok());
        assert!(gate.pass(&["/fromage"], RenameToken::NONE).is_ok());
        assert!(gate.pass(&["/from/x"], RenameToken(7)).is_ok(), "the rename's own steps pass");
        let waiter = {
            let gate = gate.clone();
            std::thread::spawn(move || drop(gate.pass(&["/to/y"], RenameToken::NONE).unwrap()))
        };
        // (Not a measured wait, which a loaded machine stretches: the waiter must still be
        // waiting when the rename thaws, however late it started.)
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "a name inside a frozen subtree passed the gate");
        gate.thaw(RenameToken(7));
        waiter.join().unwrap();
    }

    #[test]
    fn a_freeze_waits_for_running_operations() {
        let gate = Arc::new(NamespaceGate::default());
        let pass = gate.pass(&["/from/x"], RenameToken::NONE).unwrap();
        let freezer = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                let started = crate::sched::now();
                gate.freeze(RenameToken(1), "/from", "/to");
                crate::sched::since(started)
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        drop(pass);
        assert!(freezer.join().unwrap() >= Duration::from_millis(40));
    }

    #[test]
    fn a_freeze_overtaken_by_its_thaw_freezes_nothing() {
        let gate = NamespaceGate::default();
        gate.thaw(RenameToken(9));
        gate.freeze(RenameToken(9), "/x", "/y");
        assert!(gate.pass(&["/x/z"], RenameToken::NONE).is_ok(), "a freeze overtaken by its thaw freezes nothing");
    }
}
