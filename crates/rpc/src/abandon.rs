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
//! Outside [`on_behalf_of`] (every other client, every server) nothing changes.

use std::cell::Cell;
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
    /// The test said yes once: every later wait ends at once.
    given_up: bool,
}

thread_local! {
    static CALLER: Cell<Option<Caller>> = const { Cell::new(None) };
}

/// Runs `work` (which makes requests) for caller `id`; its waits end when `being_killed(id)`
/// says so. Nests: the caller before is the thread's again when `work` returns or unwinds.
pub fn on_behalf_of<T>(id: u32, being_killed: fn(u32) -> bool, work: impl FnOnce() -> T) -> T {
    struct Restore(Option<Caller>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CALLER.set(self.0);
        }
    }
    let _restore = Restore(CALLER.replace(Some(Caller { id, being_killed, given_up: false })));
    work()
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

/// Whether the thread's caller was found being killed already (no new test).
pub(crate) fn given_up() -> bool {
    CALLER.get().is_some_and(|caller| caller.given_up)
}

/// Whether the thread's caller is being killed (a test, remembered once it says yes).
fn caller_being_killed() -> bool {
    let Some(mut caller) = CALLER.get() else { return false };
    if !caller.given_up && (caller.being_killed)(caller.id) {
        caller.given_up = true;
        CALLER.set(Some(caller));
    }
    caller.given_up
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
}
