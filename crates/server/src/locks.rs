//! What keeps concurrent name operations apart: name locks and the namespace gate.
//!
//! - **Name locks.** A rename or a link changes two names, held by (possibly) two servers. Its
//!   coordinator locks both, in path order (so two renames never wait on each other in a
//!   circle), at the servers that own them; creates, unlinks, rmdirs and other renames of a
//!   locked name wait until it is released. A lock carries a token (only its holder's steps
//!   pass it) and a lease: a coordinator that dies leaves locks that expire.
//! - **The namespace gate.** A directory rename moves every entry below the directory from
//!   server to server. While it does, the two subtrees (old and new path) are *frozen* on every
//!   server: operations on names inside them wait (except the rename's own steps, which carry
//!   its token), and operations already under way finish before the freeze is in place, so no
//!   name is created, removed or looked up half-way through the move. Freezes have a lease too.
//!
//! Waiting is bounded: an operation that waits longer than [`WAIT_LIMIT`] fails with EBUSY.
//!
//! **Nothing waits while holding a gate pass.** A freeze waits for the passes held, and the
//! rename that holds a name may need to pass the gate (here or elsewhere) to finish: an
//! operation that held a pass while waiting for that name closed a circle (operation → name
//! lock → rename → gate → freeze → operation) that only a deadline broke. So an operation
//! first takes its name (a short hold, [`NameLocks::hold`], waiting for any rename of it),
//! then the pass, and gives both back when its local step is done ([`ServerState::enter_name`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use ringfs_proto::Errno;
use ringfs_proto::path;

/// Longest an operation waits for a name lock or a freeze to end.
pub const WAIT_LIMIT: Duration = Duration::from_secs(20);
/// A wait longer than this is logged (it usually means a stall worth understanding).
const SLOW_WAIT: Duration = Duration::from_secs(1);
/// A lock or freeze whose holder neither renews nor releases it lapses after this long.
pub const LEASE: Duration = Duration::from_secs(30);

thread_local! {
    /// When the caller of the request this thread serves stops waiting for the answer.
    static REQUEST_DEADLINE: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// Runs `body` (the handling of one request) with waits for names and freezes ending at
/// `deadline` too, and [`past_request_deadline`] telling whether it has passed: a request
/// whose caller has given up must not begin a change after the caller's next requests.
pub fn with_request_deadline<T>(deadline: Option<Instant>, body: impl FnOnce() -> T) -> T {
    let outer = REQUEST_DEADLINE.with(|cell| cell.replace(deadline));
    let result = body();
    REQUEST_DEADLINE.with(|cell| cell.set(outer));
    result
}

/// Runs `body` with no request deadline: the steps of a change past its point of no return
/// (a rename whose new name is installed, a directory rename whose names have begun to
/// move) must all be done, however long the caller has waited; failing one because the
/// caller gave up would leave a file with two names or names under a directory that is gone.
pub fn past_point_of_no_return<T>(body: impl FnOnce() -> T) -> T {
    with_request_deadline(None, body)
}

/// Whether the caller of the request being handled has stopped waiting (or nearly): a
/// change of names not begun yet is not begun then (ETIMEDOUT).
pub fn past_request_deadline() -> bool {
    REQUEST_DEADLINE.with(|cell| cell.get()).is_some_and(|deadline| Instant::now() >= deadline)
}

/// When the caller of the request this thread serves stops waiting: its deadline, or
/// `otherwise` from now for a request without one.
pub fn request_deadline_or(otherwise: Duration) -> Instant {
    REQUEST_DEADLINE.with(|cell| cell.get()).unwrap_or_else(|| Instant::now() + otherwise)
}

/// The end of a wait begun at `started`: [`WAIT_LIMIT`] later, or the request's deadline.
pub(crate) fn wait_end(started: Instant) -> Instant {
    let limit = started + WAIT_LIMIT;
    REQUEST_DEADLINE.with(|cell| cell.get()).map_or(limit, |deadline| deadline.min(limit))
}

/// How a wait that ran out fails: ETIMEDOUT when the caller has given up (the request's
/// deadline), EBUSY after [`WAIT_LIMIT`].
pub(crate) fn wait_failure() -> Errno {
    if past_request_deadline() { Errno::ETIMEDOUT } else { Errno::EBUSY }
}

fn humantime(duration: Duration) -> String {
    format!("{:.3}s", duration.as_secs_f64())
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct Held {
    token: u64,
    until: Instant,
    /// Held across requests to other servers (by a rename, a link or an rmdir), not just for
    /// one local step ([`NameLocks::hold`]).
    across_servers: bool,
}

/// The names this server holds that renames and links have locked.
#[derive(Default)]
pub struct NameLocks {
    held: Mutex<HashMap<String, Held>>,
    released: Condvar,
    /// Threads waiting on `released` (changed under `held`'s lock): a give-back wakes
    /// nobody when there is nobody to wake, as for nearly every create.
    waiting: AtomicUsize,
    /// Renames whose locks were given back: an acquisition of theirs that arrives late (it
    /// was overtaken by the release, or its server was paused) must not take a lock nobody
    /// will release.
    ended: EndedTokens,
}

/// Tokens (of renames, directory-rename attempts) that have ended, remembered for a lease.
#[derive(Default)]
pub struct EndedTokens {
    ended: Mutex<HashMap<u64, Instant>>,
}

impl EndedTokens {
    pub fn end(&self, token: u64) {
        let now = Instant::now();
        let mut ended = lock(&self.ended);
        if ended.len() >= 4096 {
            ended.retain(|_, until| *until > now);
        }
        ended.insert(token, now + LEASE);
    }

    pub fn has_ended(&self, token: u64) -> bool {
        lock(&self.ended).get(&token).is_some_and(|until| *until > Instant::now())
    }
}

impl NameLocks {
    /// Takes the lock of `path` for `token` (again, if the token holds it already), waiting
    /// while another token holds it.
    pub fn acquire(&self, path: &str, token: u64) -> Result<(), Errno> {
        if self.ended.has_ended(token) {
            return Err(Errno::ETIMEDOUT);
        }
        self.take(path, token, true)
    }

    fn take(&self, path: &str, token: u64, across_servers: bool) -> Result<(), Errno> {
        let started = Instant::now();
        let deadline = wait_end(started);
        let mut warned = false;
        let mut held = lock(&self.held);
        loop {
            let now = Instant::now();
            if across_servers && self.ended.has_ended(token) {
                // Released while it waited: its coordinator gave up on it. Taking the lock
                // now would hold it for a token nobody will release.
                return Err(Errno::ETIMEDOUT);
            }
            match held.get(path) {
                Some(other) if other.token != token && other.until > now => {
                    if !warned && now - started > SLOW_WAIT {
                        warned = true;
                        log::warn!("waiting {:?} for the name {path}, held by {:x}", now - started, other.token);
                    }
                }
                _ => {
                    held.insert(path.to_string(), Held { token, until: now + LEASE, across_servers });
                    return Ok(());
                }
            }
            if now >= deadline {
                return Err(wait_failure());
            }
            held = self.wait(held, deadline - now);
        }
    }

    fn wait<'a>(&self, held: MutexGuard<'a, HashMap<String, Held>>, limit: Duration) -> MutexGuard<'a, HashMap<String, Held>> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let held = self.released.wait_timeout(held, limit).unwrap_or_else(|poisoned| poisoned.into_inner()).0;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        held
    }

    /// Gives the lock of `path` back, if `token` holds it.
    pub fn release(&self, path: &str, token: u64) {
        self.ended.end(token);
        self.give_back(path, token);
        // An acquisition of this token still waiting gives up now.
        let _held = lock(&self.held);
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.released.notify_all();
        }
    }

    /// [`NameLocks::release`] of a lock only this server knows (an operation's hold).
    fn give_back(&self, path: &str, token: u64) {
        let mut held = lock(&self.held);
        if held.get(path).is_some_and(|holder| holder.token == token) {
            held.remove(path);
            if self.waiting.load(Ordering::Relaxed) > 0 {
                self.released.notify_all();
            }
        }
    }

    /// Holds `path` for the length of one local operation (waiting while a rename or link
    /// holds it), so that no rename takes the name half-way through the operation.
    pub fn hold(&self, path: &str) -> Result<NameHold<'_>, Errno> {
        let token = crate::names::new_token();
        self.take(path, token, false)?;
        Ok(NameHold { locks: self, path: path.to_string(), token })
    }

    /// Like [`NameLocks::hold`], for an operation that asks other servers while it holds the
    /// name (an rmdir checking that no server holds a name inside): renames of the name wait
    /// for it, and directory renames around it back off as they do for renames.
    pub fn hold_across_servers(&self, path: &str) -> Result<NameHold<'_>, Errno> {
        let token = crate::names::new_token();
        self.take(path, token, true)?;
        Ok(NameHold { locks: self, path: path.to_string(), token })
    }

    /// Whether a rename, link or rmdir other than `token` holds a name at or below one of
    /// `roots`.
    /// A directory rename must not move such a name: the other rename would then remove or
    /// install it at a path where it no longer is (two names for one link, or none).
    pub fn renamed_inside(&self, roots: [&str; 2], token: u64) -> Option<String> {
        let now = Instant::now();
        lock(&self.held)
            .iter()
            .find(|(path, held)| {
                held.across_servers
                    && held.token != token
                    && held.until > now
                    && roots.iter().any(|root| *path == root || path::is_inside(path, root))
            })
            .map(|(path, held)| format!("{path} (held by {:x}, {} ago)", held.token, humantime(LEASE.saturating_sub(held.until - now))))
    }

    /// Admits a step of the rename or link `token` at `path` (installing or removing the
    /// name): waits while another token holds the name, then checks that `token` still does.
    /// A step that arrives after its lock was given back or lapsed — held up in the network
    /// while its coordinator gave up on it, answered the client and released the name — is
    /// refused (ETIMEDOUT): it would change a name after the rename had answered, under the
    /// client's later operations.
    pub fn admit_step(&self, path: &str, token: u64) -> Result<(), Errno> {
        self.wait_free(path, token)?;
        match lock(&self.held).get(path) {
            Some(holder) if holder.token == token && holder.until > Instant::now() => Ok(()),
            _ => {
                log::warn!("refusing a late step of {token:x} at {path}: its name lock is not held any more");
                Err(Errno::ETIMEDOUT)
            }
        }
    }

    /// Waits until `path` is not locked by another token than `token` (0: any lock counts).
    pub fn wait_free(&self, path: &str, token: u64) -> Result<(), Errno> {
        let deadline = wait_end(Instant::now());
        let mut held = lock(&self.held);
        loop {
            let now = Instant::now();
            match held.get(path) {
                Some(other) if other.token != token && other.until > now => {}
                _ => return Ok(()),
            }
            if now >= deadline {
                return Err(wait_failure());
            }
            held = self.wait(held, deadline - now);
        }
    }
}

/// A name held by one operation; given back when dropped.
pub struct NameHold<'a> {
    locks: &'a NameLocks,
    path: String,
    token: u64,
}

impl Drop for NameHold<'_> {
    fn drop(&mut self) {
        self.locks.give_back(&self.path, self.token);
    }
}

struct Freeze {
    token: u64,
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
    pub fn pass(&self, paths: &[&str], token: u64) -> Result<GatePass<'_>, Errno> {
        // Nothing frozen (nearly always): the pass is a read lock. A freeze counts itself
        // before it waits for the passes, so a pass taken after that sees the count.
        if self.frozen_count.load(Ordering::SeqCst) == 0 {
            let running = self.running.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            if self.frozen_count.load(Ordering::SeqCst) == 0 {
                return Ok(GatePass { _running: running });
            }
        }
        let started = Instant::now();
        let deadline = wait_end(started);
        let mut warned = false;
        loop {
            {
                let mut frozen = lock(&self.frozen);
                loop {
                    let now = Instant::now();
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
                    frozen =
                        self.thawed.wait_timeout(frozen, (deadline - now).min(LEASE)).unwrap_or_else(|poisoned| poisoned.into_inner()).0;
                }
            }
            let running = self.running.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            // A freeze may have come in between: check again while holding the pass.
            let frozen = lock(&self.frozen);
            let now = Instant::now();
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
    pub fn freeze(&self, token: u64, from: &str, to: &str) {
        if self.thawed_tokens.has_ended(token) {
            return; // overtaken by its thaw: that attempt is over
        }
        {
            let mut frozen = lock(&self.frozen);
            frozen.retain(|freeze| freeze.token != token);
            frozen.push(Freeze { token, roots: [from.to_string(), to.to_string()], until: Instant::now() + LEASE });
            self.frozen_count.store(frozen.len(), Ordering::SeqCst);
        }
        let started = Instant::now();
        drop(self.running.write().unwrap_or_else(|poisoned| poisoned.into_inner()));
        if started.elapsed() > SLOW_WAIT {
            log::warn!("the freeze of {from} and {to} waited {:?} for running operations", started.elapsed());
        }
    }

    /// Ends the freeze of `token`.
    pub fn thaw(&self, token: u64) {
        self.thawed_tokens.end(token);
        let mut frozen = lock(&self.frozen);
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

    #[test]
    fn a_name_lock_excludes_other_tokens_until_released() {
        let locks = Arc::new(NameLocks::default());
        locks.acquire("/a", 1).unwrap();
        locks.acquire("/a", 1).unwrap();
        assert!(locks.wait_free("/a", 1).is_ok());
        let waiter = {
            let locks = locks.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                locks.acquire("/a", 2).unwrap();
                started.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        locks.release("/a", 1);
        assert!(waiter.join().unwrap() >= Duration::from_millis(40));
        locks.release("/a", 1);
        assert!(locks.wait_free("/a", 2).is_ok());
    }

    #[test]
    fn an_acquisition_whose_release_comes_while_it_waits_takes_no_lock() {
        // Found by the simulation under CPU load: a coordinator that gave up on a slow
        // acquisition releases it; the acquisition, still waiting at the name's server, then
        // took the lock for a token nobody would release — for a whole lease, and the next
        // waiters did the same.
        let locks = Arc::new(NameLocks::default());
        locks.acquire("/a", 1).unwrap();
        let waiter = {
            let locks = locks.clone();
            std::thread::spawn(move || locks.acquire("/a", 2))
        };
        std::thread::sleep(Duration::from_millis(30));
        locks.release("/a", 2);
        locks.release("/a", 1);
        assert_eq!(waiter.join().unwrap(), Err(Errno::ETIMEDOUT));
        assert!(locks.wait_free("/a", 0).is_ok(), "nobody holds /a");
    }

    #[test]
    fn a_step_whose_lock_was_given_back_is_refused() {
        // Found by the network-namespace soak (seed 49809): an install of a rename's new name,
        // held up in TCP while a link was down, arrived after the coordinator had given up on
        // it and released the names: it installed the name then, after the rename had failed
        // and the client had removed the temporary name — the file's last link.
        let locks = NameLocks::default();
        assert_eq!(locks.admit_step("/a", 7), Err(Errno::ETIMEDOUT), "never locked");
        locks.acquire("/a", 7).unwrap();
        assert_eq!(locks.admit_step("/a", 7), Ok(()));
        locks.release("/a", 7);
        assert_eq!(locks.admit_step("/a", 7), Err(Errno::ETIMEDOUT), "given back");
        locks.acquire("/a", 8).unwrap();
        locks.release("/a", 8);
        assert!(locks.wait_free("/a", 0).is_ok());
    }

    #[test]
    fn an_acquisition_overtaken_by_its_release_takes_no_lock() {
        let locks = NameLocks::default();
        locks.release("/a", 5);
        assert_eq!(locks.acquire("/a", 5), Err(Errno::ETIMEDOUT));
        assert!(locks.wait_free("/a", 0).is_ok(), "nobody holds /a");
        let gate = NamespaceGate::default();
        gate.thaw(9);
        gate.freeze(9, "/x", "/y");
        assert!(gate.pass(&["/x/z"], 0).is_ok(), "a freeze overtaken by its thaw freezes nothing");
    }

    #[test]
    fn a_freeze_holds_off_names_inside_its_subtrees_only() {
        let gate = Arc::new(NamespaceGate::default());
        gate.freeze(7, "/from", "/to");
        assert!(gate.pass(&["/other"], 0).is_ok());
        assert!(gate.pass(&["/fromage"], 0).is_ok());
        assert!(gate.pass(&["/from/x"], 7).is_ok(), "the rename's own steps pass");
        let waiter = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                drop(gate.pass(&["/to/y"], 0).unwrap());
                started.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        gate.thaw(7);
        assert!(waiter.join().unwrap() >= Duration::from_millis(40));
    }

    #[test]
    fn a_freeze_waits_for_running_operations() {
        let gate = Arc::new(NamespaceGate::default());
        let pass = gate.pass(&["/from/x"], 0).unwrap();
        let freezer = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                gate.freeze(1, "/from", "/to");
                started.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        drop(pass);
        assert!(freezer.join().unwrap() >= Duration::from_millis(40));
    }
}
