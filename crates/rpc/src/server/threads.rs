//! The threads of one server, counted, so that stopping a server can wait until none of them
//! runs any more.
//!
//! A stopped server whose threads were still running once crashed the processes it lived in:
//! a global-memory rank stops its cache's server and exits, and a thread of that server still
//! progressing its UCX worker while `exit` ran UCX's library destructors corrupted the heap
//! (`malloc_consolidate(): invalid chunk size`, or SIGSEGV in `free`). Every thread a server
//! starts goes through [`ThreadGroup::spawn`]; [`ThreadGroup::wait_ended`] returns once the
//! last has finished its work, dropped what it held (its clone of the server's state, its
//! listener) and is joined: gone from the process.

use std::io;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ringfs_sync::{Condvar, Mutex};

/// Counts a server's running threads, and keeps their handles to join them.
#[derive(Default)]
pub struct ThreadGroup {
    running: Mutex<usize>,
    ended: Condvar,
    /// Handles of threads not joined yet (those that ended are pruned as others start).
    handles: Mutex<Vec<thread::JoinHandle<()>>>,
}

/// Held by a running thread; uncounts it when dropped (also when the thread panics).
struct Running(Arc<ThreadGroup>);

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = self.0.running.lock();
        *running -= 1;
        if *running == 0 {
            self.0.ended.notify_all();
        }
    }
}

impl ThreadGroup {
    /// Starts a thread named `name` (with `stack` bytes of stack, if given) running `body`,
    /// counted until `body` has returned and everything it captured is dropped.
    pub fn spawn(self: &Arc<Self>, name: &str, stack: Option<usize>, body: impl FnOnce() + Send + 'static) -> io::Result<()> {
        *self.running.lock() += 1;
        let running = Running(self.clone());
        let mut builder = thread::Builder::new().name(name.into());
        if let Some(bytes) = stack {
            builder = builder.stack_size(bytes);
        }
        // `body` is consumed (and what it captured dropped) before `running` drops.
        let handle = builder.spawn(move || {
            let _running = running;
            body();
        })?;
        // (A failed spawn dropped the closure, and `running` with it: uncounted.)
        let mut handles = self.handles.lock();
        handles.retain(|handle| !handle.is_finished());
        handles.push(handle);
        Ok(())
    }

    /// Threads running now.
    pub fn running(&self) -> usize {
        *self.running.lock()
    }

    /// Waits until no thread of the group runs, for at most `limit`, then joins them; true
    /// if none runs. (A thread of the group calling this does not wait for itself.)
    pub fn wait_ended(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let current = thread::current().id();
        let me = usize::from(self.handles.lock().iter().any(|handle| handle.thread().id() == current));
        let mut running = self.running.lock();
        while *running > me {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.ended.wait_for(&mut running, left);
        }
        drop(running);
        let handles = std::mem::take(&mut *self.handles.lock());
        for handle in handles {
            if handle.thread().id() == current {
                self.handles.lock().push(handle);
            } else {
                // The thread has returned from its body: this waits only for it to exit.
                let _ = handle.join();
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn waiting_ends_when_the_last_thread_has_dropped_what_it_held() {
        let group = Arc::new(ThreadGroup::default());
        let held = Arc::new(());
        let release = Arc::new(AtomicBool::new(false));
        for _ in 0..3 {
            let (held, release) = (held.clone(), release.clone());
            group
                .spawn("test", None, move || {
                    let _held = held;
                    while !release.load(Ordering::SeqCst) {
                        thread::sleep(Duration::from_millis(1));
                    }
                })
                .unwrap();
        }
        assert_eq!(group.running(), 3);
        assert!(!group.wait_ended(Duration::from_millis(50)), "the threads still run");
        release.store(true, Ordering::SeqCst);
        assert!(group.wait_ended(Duration::from_secs(10)));
        assert_eq!(group.running(), 0);
        assert_eq!(Arc::strong_count(&held), 1, "the threads' clones were dropped before they were uncounted");
    }

    #[test]
    fn a_thread_that_panics_is_uncounted() {
        let group = Arc::new(ThreadGroup::default());
        group.spawn("test", Some(64 << 10), || panic!("on purpose")).unwrap();
        assert!(group.wait_ended(Duration::from_secs(10)));
    }
}
