//! Where a request handler waits: condition variables, pauses between retries.
//!
//! Every such wait in the coordinators goes through [`wait_timeout`] or [`pause`]. In a server
//! they are the plain waits they look like. A test that decides the order of the cluster's
//! steps (`testing::Schedule`: one step at a time, chosen by a seed) installs a [`Turns`] on
//! each of its threads; a wait then gives the turn to another step instead of blocking, so a
//! seed replays the same interleaving.

use std::cell::RefCell;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
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

/// `condvar.wait_timeout` on `guard` of `mutex`, waking at most after `timeout` (callers
/// check their condition again, as after any wake-up). Under a test scheduler: the lock is
/// given back, another step runs, and the lock is taken again.
pub fn wait_timeout<'a, T>(condvar: &Condvar, mutex: &'a Mutex<T>, guard: MutexGuard<'a, T>, timeout: Duration) -> MutexGuard<'a, T> {
    match turns() {
        None => condvar.wait_timeout(guard, timeout).unwrap_or_else(|poisoned| poisoned.into_inner()).0,
        Some(turns) => {
            drop(guard);
            turns.yield_turn();
            mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
        }
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
