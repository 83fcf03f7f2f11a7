//! Name locks: what keeps concurrent changes of one name apart.
//!
//! A rename or a link changes two names, held by (possibly) two servers. Its coordinator
//! locks both, in path order (so two renames never wait on each other in a circle), at the
//! servers that own them; creates, unlinks, rmdirs and other renames of a locked name wait
//! until it is released. A lock carries a token (only its holder's steps pass it) and a
//! lease: a coordinator that dies leaves locks that expire. An ordinary operation *holds* its
//! name for its local step the same way ([`NameLocks::hold`]), so a rename never takes a name
//! half-way through an operation. Waits are bounded (see `deadline`).

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ringfs_proto::Errno;
use ringfs_proto::RenameToken;
use ringfs_proto::path;
use ringfs_rpc::memory::fast_random_u64;

use crate::deadline::{wait_end, wait_failure};

/// A wait longer than this is logged (it usually means a stall worth understanding).
pub const SLOW_WAIT: Duration = Duration::from_secs(1);
/// A lock or freeze whose holder neither renews nor releases it lapses after this long.
pub const LEASE: Duration = Duration::from_secs(30);

/// Draws the token of a rename or link (its locks and steps carry it).
pub fn new_token() -> RenameToken {
    RenameToken(fast_random_u64() | 1)
}

fn humantime(duration: Duration) -> String {
    format!("{:.3}s", duration.as_secs_f64())
}

/// The server process whose rename or link took a lock (its member name and process id),
/// as this server's member list knew it then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Coordinator {
    pub name: String,
    pub pid: u32,
}

struct Held {
    token: RenameToken,
    until: Instant,
    /// Another server's rename or link: when that server is back as a new process, the lock
    /// goes at once ([`NameLocks::release_locks_of`]) instead of at the end of its lease.
    coordinator: Option<Coordinator>,
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
    ended: Mutex<HashMap<RenameToken, Instant>>,
}

impl EndedTokens {
    pub fn end(&self, token: RenameToken) {
        let now = crate::sched::now();
        let mut ended = self.ended.lock();
        if ended.len() >= 4096 {
            ended.retain(|_, until| *until > now);
        }
        ended.insert(token, now + LEASE);
    }

    pub fn has_ended(&self, token: RenameToken) -> bool {
        self.ended.lock().get(&token).is_some_and(|until| *until > crate::sched::now())
    }
}

impl NameLocks {
    /// Takes the lock of `path` for `token` (again, if the token holds it already), waiting
    /// while another token holds it; `coordinator`: the other server whose rename or link
    /// asks (`None`: this one).
    pub fn acquire(&self, path: &str, token: RenameToken, coordinator: Option<Coordinator>) -> Result<(), Errno> {
        if self.ended.has_ended(token) {
            return Err(Errno::ETIMEDOUT);
        }
        self.take(path, token, true, coordinator)
    }

    /// Releases the locks whose coordinator `is_gone` says has ended (a server back as a new
    /// process: the rename or link it coordinated died with the old one, and its locks would
    /// keep their names from every change until their lease ran out). How many.
    pub fn release_locks_of(&self, is_gone: impl Fn(&Coordinator) -> bool) -> usize {
        let gone: Vec<(String, RenameToken)> = self
            .held
            .lock()
            .iter()
            .filter(|(_, held)| held.coordinator.as_ref().is_some_and(&is_gone))
            .map(|(path, held)| (path.clone(), held.token))
            .collect();
        for (path, token) in &gone {
            self.release(path, *token);
        }
        gone.len()
    }

    fn take(&self, path: &str, token: RenameToken, across_servers: bool, coordinator: Option<Coordinator>) -> Result<(), Errno> {
        let started = crate::sched::now();
        let deadline = wait_end(started);
        let mut warned = false;
        let mut held = self.held.lock();
        loop {
            let now = crate::sched::now();
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
                    held.insert(path.to_string(), Held { token, until: now + LEASE, coordinator, across_servers });
                    return Ok(());
                }
            }
            if now >= deadline {
                return Err(wait_failure());
            }
            self.wait(&mut held, deadline - now);
        }
    }

    fn wait(&self, held: &mut MutexGuard<'_, HashMap<String, Held>>, limit: Duration) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        crate::sched::wait_timeout(&self.released, held, limit);
        self.waiting.fetch_sub(1, Ordering::Relaxed);
    }

    /// Gives the lock of `path` back, if `token` holds it.
    pub fn release(&self, path: &str, token: RenameToken) {
        self.ended.end(token);
        self.give_back(path, token);
        // An acquisition of this token still waiting gives up now.
        let _held = self.held.lock();
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.released.notify_all();
        }
    }

    /// [`NameLocks::release`] of a lock only this server knows (an operation's hold).
    fn give_back(&self, path: &str, token: RenameToken) {
        let mut held = self.held.lock();
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
        let token = new_token();
        self.take(path, token, false, None)?;
        Ok(NameHold { locks: self, path: path.to_string(), token })
    }

    /// Like [`NameLocks::hold`], for an operation that asks other servers while it holds the
    /// name (an rmdir checking that no server holds a name inside): renames of the name wait
    /// for it, and directory renames around it back off as they do for renames.
    pub fn hold_across_servers(&self, path: &str) -> Result<NameHold<'_>, Errno> {
        let token = new_token();
        self.take(path, token, true, None)?;
        Ok(NameHold { locks: self, path: path.to_string(), token })
    }

    /// Whether a rename, link or rmdir other than `token` holds a name at or below one of
    /// `roots`.
    /// A directory rename must not move such a name: the other rename would then remove or
    /// install it at a path where it no longer is (two names for one link, or none).
    pub fn renamed_inside(&self, roots: [&str; 2], token: RenameToken) -> Option<String> {
        let now = crate::sched::now();
        self.held
            .lock()
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
    pub fn admit_step(&self, path: &str, token: RenameToken) -> Result<(), Errno> {
        self.wait_free(path, token)?;
        match self.held.lock().get(path) {
            Some(holder) if holder.token == token && holder.until > crate::sched::now() => Ok(()),
            _ => {
                log::warn!("refusing a late step of {token:x} at {path}: its name lock is not held any more");
                Err(Errno::ETIMEDOUT)
            }
        }
    }

    /// Waits until `path` is not locked by another token than `token` (0: any lock counts).
    pub fn wait_free(&self, path: &str, token: RenameToken) -> Result<(), Errno> {
        let deadline = wait_end(crate::sched::now());
        let mut held = self.held.lock();
        loop {
            let now = crate::sched::now();
            match held.get(path) {
                Some(other) if other.token != token && other.until > now => {}
                _ => return Ok(()),
            }
            if now >= deadline {
                return Err(wait_failure());
            }
            self.wait(&mut held, deadline - now);
        }
    }
}

/// A name held by one operation; given back when dropped.
pub struct NameHold<'a> {
    locks: &'a NameLocks,
    path: String,
    token: RenameToken,
}

impl Drop for NameHold<'_> {
    fn drop(&mut self) {
        self.locks.give_back(&self.path, self.token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_name_lock_excludes_other_tokens_until_released() {
        let locks = Arc::new(NameLocks::default());
        locks.acquire("/a", RenameToken(1), None).unwrap();
        locks.acquire("/a", RenameToken(1), None).unwrap();
        assert!(locks.wait_free("/a", RenameToken(1)).is_ok());
        let waiter = {
            let locks = locks.clone();
            std::thread::spawn(move || {
                let started = crate::sched::now();
                locks.acquire("/a", RenameToken(2), None).unwrap();
                crate::sched::since(started)
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        locks.release("/a", RenameToken(1));
        assert!(waiter.join().unwrap() >= Duration::from_millis(40));
        locks.release("/a", RenameToken(1));
        assert!(locks.wait_free("/a", RenameToken(2)).is_ok());
    }

    #[test]
    fn an_acquisition_whose_release_comes_while_it_waits_takes_no_lock() {
        // Found by the simulation under CPU load: a coordinator that gave up on a slow
        // acquisition releases it; the acquisition, still waiting at the name's server, then
        // took the lock for a token nobody would release — for a whole lease, and the next
        // waiters did the same.
        let locks = Arc::new(NameLocks::default());
        locks.acquire("/a", RenameToken(1), None).unwrap();
        let waiter = {
            let locks = locks.clone();
            std::thread::spawn(move || locks.acquire("/a", RenameToken(2), None))
        };
        std::thread::sleep(Duration::from_millis(30));
        locks.release("/a", RenameToken(2));
        locks.release("/a", RenameToken(1));
        assert_eq!(waiter.join().unwrap(), Err(Errno::ETIMEDOUT));
        assert!(locks.wait_free("/a", RenameToken::NONE).is_ok(), "nobody holds /a");
    }

    #[test]
    fn a_step_whose_lock_was_given_back_is_refused() {
        // Found by the network-namespace soak (seed 49809): an install of a rename's new name,
        // held up in TCP while a link was down, arrived after the coordinator had given up on
        // it and released the names: it installed the name then, after the rename had failed
        // and the client had removed the temporary name — the file's last link.
        let locks = NameLocks::default();
        assert_eq!(locks.admit_step("/a", RenameToken(7)), Err(Errno::ETIMEDOUT), "never locked");
        locks.acquire("/a", RenameToken(7), None).unwrap();
        assert_eq!(locks.admit_step("/a", RenameToken(7)), Ok(()));
        locks.release("/a", RenameToken(7));
        assert_eq!(locks.admit_step("/a", RenameToken(7)), Err(Errno::ETIMEDOUT), "given back");
        locks.acquire("/a", RenameToken(8), None).unwrap();
        locks.release("/a", RenameToken(8));
        assert!(locks.wait_free("/a", RenameToken::NONE).is_ok());
    }

    #[test]
    fn an_acquisition_overtaken_by_its_release_takes_no_lock() {
        let locks = NameLocks::default();
        locks.release("/a", RenameToken(5));
        assert_eq!(locks.acquire("/a", RenameToken(5), None), Err(Errno::ETIMEDOUT));
        assert!(locks.wait_free("/a", RenameToken::NONE).is_ok(), "nobody holds /a");
    }

    #[test]
    fn the_locks_of_a_coordinator_back_as_a_new_process_go_at_once() {
        let locks = NameLocks::default();
        let server = |pid| Some(Coordinator { name: "server-1".into(), pid });
        let locked = |path: &str| locks.held.lock().contains_key(path);
        locks.acquire("/a", RenameToken(1), server(100)).unwrap();
        locks.acquire("/b", RenameToken(2), None).unwrap();
        assert_eq!(locks.release_locks_of(|coordinator| coordinator.pid != 100), 0, "the same process: kept");
        assert!(locked("/a"));
        assert_eq!(locks.release_locks_of(|coordinator| coordinator.pid != 101), 1, "back as process 101");
        assert!(!locked("/a"));
        assert_eq!(locks.acquire("/a", RenameToken(1), server(100)), Err(Errno::ETIMEDOUT), "its token has ended");
        assert!(locked("/b"), "this server's own lock stays");
    }
}
