//! Where a request handler waits, and the clock it goes by: condition variables, pauses
//! between retries, [`now`].
//!
//! Every such wait in the coordinators goes through [`wait_timeout`] or [`pause`], and every
//! deadline, lease and cache age they keep is read with [`now`]. In a server they are the
//! plain waits and the clock they look like. A test that decides the order of the cluster's
//! steps (`testing::Schedule`: one step at a time, chosen by a seed) installs a [`Turns`] on
//! each of its threads; a wait then gives the turn to another step instead of blocking, and
//! the clock advances by a fixed step per turn given, so that a seed replays the same
//! interleaving — timeouts, lease ends and cache expiries included — however fast or loaded
//! the machine is.

use parking_lot::{Condvar, MutexGuard};
use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A test's scheduler, as a thread it runs sees it.
pub trait Turns: Send + Sync {
    /// Gives the turn to another step, and returns when this thread has it again.
    fn yield_turn(&self);

    /// The scheduler's clock (it advances with the turns given, not with time).
    fn now(&self) -> Instant;
}

thread_local! {
    static TURNS: RefCell<Option<Arc<dyn Turns>>> = const { RefCell::new(None) };
}

/// Runs `body` on this thread with its waits handed to `turns` (tests only).
#[cfg(any(test, feature = "testing"))]
pub fn with_turns<T>(turns: Arc<dyn Turns>, body: impl FnOnce() -> T) -> T {
    let outer = TURNS.with(|cell| cell.replace(Some(turns)));
    let result = body();
    TURNS.with(|cell| cell.replace(outer));
    result
}

/// This thread's scheduler, if a test installed one.
fn turns() -> Option<Arc<dyn Turns>> {
    TURNS.with(|cell| cell.borrow().clone())
}

/// Gives the turn away if a test scheduler runs this thread (a point where another step may
/// run: a message is about to leave).
#[cfg(any(test, feature = "testing"))]
pub fn yield_point() {
    if let Some(turns) = turns() {
        turns.yield_turn();
    }
}

/// The time: the clock, or a test scheduler's clock on a thread it runs.
pub fn now() -> Instant {
    match turns() {
        None => Instant::now(),
        Some(turns) => turns.now(),
    }
}

/// How long ago `earlier` was, by [`now`].
pub fn since(earlier: Instant) -> Duration {
    now().saturating_duration_since(earlier)
}

/// `condvar.wait_for` on `guard`, waking at most after `timeout` (callers check their
/// condition again, as after any wake-up). Under a test scheduler: the lock is given back,
/// another step runs, and the lock is taken again.
pub fn wait_timeout<T>(condvar: &Condvar, guard: &mut MutexGuard<'_, T>, timeout: Duration) {
    match turns() {
        None => drop(condvar.wait_for(guard, timeout)),
        Some(turns) => MutexGuard::unlocked(guard, || turns.yield_turn()),
    }
}

/// A pause before trying again. Under a test scheduler another step runs instead (the
/// time a retry waits for is other steps' progress).
pub fn pause(duration: Duration) {
    match turns() {
        None => std::thread::sleep(duration),
        Some(turns) => turns.yield_turn(),
    }
}
