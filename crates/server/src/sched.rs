//! Where a request handler waits: condition variables, pauses between retries.
//!
//! Every such wait in the coordinators goes through [`wait_timeout`] or [`pause`]. In a server
//! they are the plain waits they look like. A test that decides the order of the cluster's
//! steps (`testing::Schedule`: one step at a time, chosen by a seed) installs a [`Turns`] on
//! each of its threads; a wait then gives the turn to another step instead of blocking, so a
//! seed replays the same interleaving.

use parking_lot::{Condvar, MutexGuard};
use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

/// A test's scheduler, as a thread it runs sees it.
pub trait Turns: Send + Sync {
    /// Gives the turn to another step, and returns when this thread has it again.
    fn yield_turn(&self);
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
