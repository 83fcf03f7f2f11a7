//! How many of the pool's threads wait for events, and the watch that adds a thread when
//! none has come back to wait for a while.
//!
//! A thread that takes a request while no other thread waits adds one at once, up to a small
//! number; beyond that, adding threads for requests that are merely short would not help a
//! busy CPU (under a backlog every new thread would take an event at once, find nobody
//! waiting, and add another). Instead the *watch* looks every [`WATCH_TICK`] while nobody
//! waits: if no thread came back to wait during a whole tick, the busy ones are stuck (in
//! handlers waiting on other servers or locks), and it adds a thread. So handlers that
//! block never keep other connections from being served for more than about a tick each.

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// How long nobody may come back to wait before the watch adds a thread.
pub const WATCH_TICK: Duration = Duration::from_millis(1);

/// The waiting threads of a pool.
#[derive(Default)]
pub struct Occupancy {
    waiting: AtomicUsize,
    /// Times a thread began to wait (progress, as the watch sees it).
    returns: AtomicU64,
    /// The watch is looking (nobody waited when a request was last taken).
    watching: AtomicBool,
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl Occupancy {
    fn stopped(&self) -> MutexGuard<'_, bool> {
        self.stopped.lock()
    }

    /// A thread begins to wait for an event.
    pub fn begin_wait(&self) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        self.returns.fetch_add(1, Ordering::Relaxed);
    }

    /// A thread stopped waiting; how many others still wait.
    pub fn end_wait(&self) -> usize {
        self.waiting.fetch_sub(1, Ordering::SeqCst) - 1
    }

    /// A request was taken while nobody else waits: the watch starts looking.
    pub fn saturated(&self) {
        if !self.watching.swap(true, Ordering::SeqCst) {
            let _stopped = self.stopped();
            self.wake.notify_one();
        }
    }

    /// Ends [`Occupancy::watch`].
    pub fn stop(&self) {
        *self.stopped() = true;
        self.wake.notify_all();
    }

    /// The watch (a thread of its own, until stopped): calls `grow` whenever nobody waited
    /// and nobody came back to wait for a whole tick.
    pub fn watch(&self, grow: impl Fn()) {
        let mut stopped = self.stopped();
        loop {
            while !*stopped && !self.watching.load(Ordering::SeqCst) {
                self.wake.wait(&mut stopped);
            }
            if *stopped {
                return;
            }
            let returns = self.returns.load(Ordering::Relaxed);
            self.wake.wait_for(&mut stopped, WATCH_TICK);
            if *stopped {
                return;
            }
            if self.waiting.load(Ordering::SeqCst) > 0 {
                self.watching.store(false, Ordering::SeqCst);
                // A request taken meanwhile may have found nobody waiting and seen the watch
                // still on: look again rather than miss it.
                if self.waiting.load(Ordering::SeqCst) == 0 {
                    self.watching.store(true, Ordering::SeqCst);
                }
            } else if self.returns.load(Ordering::Relaxed) == returns {
                drop(stopped);
                grow();
                stopped = self.stopped();
            }
        }
    }
}
