//! Waits that end when the program they are for is being killed.
//!
//! A request waits for its answer until its deadline — seconds, long enough for a server
//! that is slow, too long for a program killed meanwhile. The FUSE mount answers other
//! processes' system calls, and the kernel keeps a program whose request the mount is
//! serving waiting, even after `kill -9`, until the mount answers. So the mount serves such
//! a request [`on_behalf_of`] its caller, with a test of whether that caller is being killed:
//! a wait for a server that has lasted [`FIRST_LOOK`] asks it every [`LOOK_EVERY`], and once
//! it says yes, this wait and every later request made on behalf of that caller end at once
//! with [`crate::RpcError::Abandoned`] (the requests already sent still run at their servers;
//! their answers are dropped when they come).
//!
//! Some requests must not be given up: their outcome has to be known (a create whose open
//! is registered at a server, to be closed if the caller never gets it). Those run
//! [`releasing_for`] their caller: once it is found being killed, a release runs instead —
//! the mount answers the caller there — and the waits go on to their answers.
//!
//! Outside [`on_behalf_of`] and [`releasing_for`] (every other client, every server)
//! nothing changes.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

/// How long a wait goes on before it first asks whether its caller is being killed: a
/// request answered sooner costs nothing more.
pub const FIRST_LOOK: Duration = Duration::from_millis(200);

/// How often a longer wait asks again.
pub const LOOK_EVERY: Duration = Duration::from_millis(50);

/// The caller a thread now serves, and the test of whether it is being killed.
#[derive(Clone, Copy)]
struct Caller {
    id: u32,
    being_killed: fn(u32) -> bool,
    /// Found being killed, the caller is released ([`RELEASE`]) and the waits go on.
    releases: bool,
    /// The test said yes once: every later wait ends at once (or, for a caller that is
    /// released, no wait asks again).
    given_up: bool,
}

/// What releases a caller served [`releasing_for`].
type Release = Box<dyn FnOnce()>;

thread_local! {
    static CALLER: Cell<Option<Caller>> = const { Cell::new(None) };
    /// The release of the caller served [`releasing_for`], until it has run.
    static RELEASE: RefCell<Option<Release>> = const { RefCell::new(None) };
}

/// Runs `work` as `caller`'s (with `release` for it, if any), then makes the thread's caller
/// before its own again, also when `work` unwinds.
fn serving<T>(caller: Caller, release: Option<Release>, work: impl FnOnce() -> T) -> T {
    struct Restore(Option<Caller>, Option<Release>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CALLER.set(self.0);
            RELEASE.set(self.1.take());
        }
    }
    let _restore = Restore(CALLER.replace(Some(caller)), RELEASE.replace(release));
    work()
}

/// Runs `work` (which makes requests) for caller `id`; its waits end when `being_killed(id)`
/// says so. Nests: the caller before is the thread's again when `work` returns or unwinds.
pub fn on_behalf_of<T>(id: u32, being_killed: fn(u32) -> bool, work: impl FnOnce() -> T) -> T {
    serving(Caller { id, being_killed, releases: false, given_up: false }, None, work)
}

/// Runs `work` (which makes requests) for caller `id` to its end: when a wait finds
/// `being_killed(id)`, `release` runs once, inside that wait, and the wait goes on. (A
/// release should not block: it runs while the connection's state is locked.)
pub fn releasing_for<T>(id: u32, being_killed: fn(u32) -> bool, release: impl FnOnce() + 'static, work: impl FnOnce() -> T) -> T {
    serving(Caller { id, being_killed, releases: true, given_up: false }, Some(Box::new(release)), work)
}

/// When a wait next asks whether its caller is being killed. It goes by the times its
/// waiting loop reads anyway: no clock read of its own.
#[derive(Default)]
pub(crate) struct Looks {
    /// Unset until the wait's first turn, which sets it [`FIRST_LOOK`] later.
    next: Option<Instant>,
}

impl Looks {
    /// Whether the wait should end, at `now`, because its caller is being killed: asked at
    /// most every [`LOOK_EVERY`] once [`FIRST_LOOK`] has passed since the first turn,
    /// `false` in between.
    pub(crate) fn caller_being_killed(&mut self, now: Instant) -> bool {
        match self.next {
            None => {
                self.next = Some(now + FIRST_LOOK);
                false
            }
            Some(next) if now < next => false,
            Some(_) => {
                self.next = Some(now + LOOK_EVERY);
                caller_being_killed()
            }
        }
    }
}

/// Whether the thread's caller was found being killed already and its waits end (no new
/// test).
pub(crate) fn given_up() -> bool {
    CALLER.get().is_some_and(|caller| caller.given_up && !caller.releases)
}

/// Whether the thread's waits for its caller end because the caller is being killed (a
/// test, remembered once it says yes). A caller served [`releasing_for`] is released
/// instead, and its waits go on.
fn caller_being_killed() -> bool {
    let Some(mut caller) = CALLER.get() else { return false };
    if !caller.given_up && (caller.being_killed)(caller.id) {
        caller.given_up = true;
        CALLER.set(Some(caller));
        if caller.releases
            && let Some(release) = RELEASE.take()
        {
            release();
        }
    }
    caller.given_up && !caller.releases
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    static TESTS: AtomicU32 = AtomicU32::new(0);

    fn killed_when_odd(id: u32) -> bool {
        TESTS.fetch_add(1, Ordering::Relaxed);
        id % 2 == 1
    }

    #[test]
    fn a_caller_found_being_killed_stays_given_up_and_the_scope_ends_with_the_work() {
        assert!(!caller_being_killed(), "no caller, nothing to give up");
        on_behalf_of(2, killed_when_odd, || {
            assert!(!caller_being_killed());
            assert!(!given_up());
            on_behalf_of(3, killed_when_odd, || {
                assert!(caller_being_killed());
                let tests = TESTS.load(Ordering::Relaxed);
                assert!(given_up());
                assert!(caller_being_killed());
                assert_eq!(TESTS.load(Ordering::Relaxed), tests, "once given up, no new test");
            });
            assert!(!given_up(), "the outer caller is served again");
        });
        assert!(!given_up());
        let unwound = std::panic::catch_unwind(|| on_behalf_of(5, killed_when_odd, || panic!("work failed")));
        assert!(unwound.is_err());
        assert!(!caller_being_killed(), "a scope that unwound is gone too");
    }

    #[test]
    fn a_caller_found_being_killed_is_released_once_and_its_waits_go_on() {
        let released = std::rc::Rc::new(Cell::new(0));
        let count = released.clone();
        releasing_for(
            3,
            killed_when_odd,
            move || count.set(count.get() + 1),
            || {
                assert!(!caller_being_killed(), "a released caller's waits go on");
                assert_eq!(released.get(), 1);
                let tests = TESTS.load(Ordering::Relaxed);
                assert!(!caller_being_killed());
                assert!(!given_up(), "later requests are made too");
                assert_eq!(released.get(), 1, "released once");
                assert_eq!(TESTS.load(Ordering::Relaxed), tests, "once released, no new test");
                // A scope inside gives up as before, and the outer one is released no more.
                on_behalf_of(5, killed_when_odd, || assert!(caller_being_killed()));
                assert!(!caller_being_killed());
            },
        );
        let kept = std::rc::Rc::new(Cell::new(false));
        let flag = kept.clone();
        releasing_for(4, killed_when_odd, move || flag.set(true), || assert!(!caller_being_killed()));
        assert!(!kept.get(), "a caller not being killed is not released");
        assert!(RELEASE.take().is_none(), "a release not run goes with its scope");
    }
}
