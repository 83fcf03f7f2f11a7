//! Locks for the code that runs inside users' processes — the client and its connections, the
//! C, LD_PRELOAD and Python libraries, a global-memory rank: the standard library's locks,
//! behind the API the servers' `parking_lot` locks have (no poisoning, a condition variable
//! that waits on `&mut guard`), so that code reads the same on both sides.
//!
//! Why not `parking_lot` here: it keeps every waiting thread in one global table, and a
//! `fork` taken while another thread parks or wakes leaves the child's copy of that table
//! inconsistent; the child's first contended lock then crashes. Programs fork with threads
//! running (shells, `rsync`, Python's `multiprocessing`, MPI launchers), and under the
//! LD_PRELOAD library `rsync` died in 6 of 15 runs (`null pointer dereference` in
//! `parking_lot_core::park`, from a close in the forked child). The standard library's locks
//! are a futex word each, with no shared state: a lock the child never saw held works in the
//! child. The servers, their stores and the FUSE daemon do not fork and keep `parking_lot`.
//!
//! A panic while a lock is held does not poison it here either: the data is taken as it is
//! (the code keeps its invariants at every point where it could panic, as with `parking_lot`).
//!
//! ```
//! use ringfs_sync::{Condvar, Mutex};
//! use std::time::Duration;
//! let ready = Mutex::new(false);
//! let changed = Condvar::new();
//! let mut guard = ready.lock();
//! while !*guard {
//!     if changed.wait_for(&mut guard, Duration::from_millis(1)).timed_out() {
//!         *guard = true;
//!     }
//! }
//! assert!(*guard);
//! ```

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{self, PoisonError, TryLockError};
use std::time::Duration;

pub use std::sync::{RwLockReadGuard, RwLockWriteGuard};

/// A mutual-exclusion lock (`std::sync::Mutex` without poisoning).
#[derive(Default)]
pub struct Mutex<T: ?Sized>(sync::Mutex<T>);

impl<T> Mutex<T> {
    pub const fn new(value: T) -> Mutex<T> {
        Mutex(sync::Mutex::new(value))
    }

    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized> Mutex<T> {
    pub fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard { mutex: self, guard: Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)) }
    }

    /// The lock if it is free now.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let guard = match self.0.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(MutexGuard { mutex: self, guard: Some(guard) })
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A held [`Mutex`]. (The guard is an `Option` only so that [`Condvar`] can hand it to the
/// standard library's wait, which takes it by value, and put the new one back.)
pub struct MutexGuard<'a, T: ?Sized> {
    mutex: &'a Mutex<T>,
    guard: Option<sync::MutexGuard<'a, T>>,
}

impl<'a, T: ?Sized> MutexGuard<'a, T> {
    /// Runs `body` with the lock given back, and takes it again before returning.
    pub fn unlocked<U>(this: &mut MutexGuard<'a, T>, body: impl FnOnce() -> U) -> U {
        this.guard = None;
        let result = body();
        this.guard = Some(this.mutex.0.lock().unwrap_or_else(PoisonError::into_inner));
        result
    }

    fn take(&mut self) -> sync::MutexGuard<'a, T> {
        self.guard.take().expect("a MutexGuard holds its lock outside Condvar waits")
    }
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.guard.as_deref().expect("a MutexGuard holds its lock outside Condvar waits")
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.guard.as_deref_mut().expect("a MutexGuard holds its lock outside Condvar waits")
    }
}

/// A reader-writer lock (`std::sync::RwLock` without poisoning).
#[derive(Default)]
pub struct RwLock<T: ?Sized>(sync::RwLock<T>);

impl<T> RwLock<T> {
    pub const fn new(value: T) -> RwLock<T> {
        RwLock(sync::RwLock::new(value))
    }
}

impl<T: ?Sized> RwLock<T> {
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A condition variable whose waits take the guard by reference.
#[derive(Debug, Default)]
pub struct Condvar(sync::Condvar);

/// Whether a [`Condvar::wait_for`] ended by its timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    pub fn timed_out(self) -> bool {
        self.0
    }
}

impl Condvar {
    pub const fn new() -> Condvar {
        Condvar(sync::Condvar::new())
    }

    /// Gives the lock back, waits for a notification (or a spurious wake-up), takes it again.
    pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        let held = guard.take();
        guard.guard = Some(self.0.wait(held).unwrap_or_else(PoisonError::into_inner));
    }

    /// [`Condvar::wait`], for at most `timeout`.
    pub fn wait_for<T>(&self, guard: &mut MutexGuard<'_, T>, timeout: Duration) -> WaitTimeoutResult {
        let held = guard.take();
        let (held, result) = self.0.wait_timeout(held, timeout).unwrap_or_else(PoisonError::into_inner);
        guard.guard = Some(held);
        WaitTimeoutResult(result.timed_out())
    }

    pub fn notify_one(&self) {
        self.0.notify_one();
    }

    pub fn notify_all(&self) {
        self.0.notify_all();
    }
}

/// Joins `thread` unless it is the calling thread: a pool or client dropped by one of its own
/// threads (a job that drops the last handle) must not wait for itself, which would never
/// return. `None` when it was the calling thread.
pub fn join_unless_current<T>(thread: std::thread::JoinHandle<T>) -> Option<std::thread::Result<T>> {
    (thread.thread().id() != std::thread::current().id()).then(|| thread.join())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_lock_held_by_a_thread_that_panicked_is_taken_as_it_is() {
        let shared = Arc::new(Mutex::new(1));
        let other = shared.clone();
        let _ = std::thread::spawn(move || {
            let mut guard = other.lock();
            *guard = 2;
            panic!("while holding the lock");
        })
        .join();
        assert_eq!(*shared.lock(), 2);
        let lock = RwLock::new(3);
        assert_eq!(*lock.read(), 3);
        *lock.write() = 4;
        assert_eq!(*lock.read(), 4);
    }

    #[test]
    fn a_wait_gives_the_lock_back_until_notified_and_unlocked_gives_it_back_for_a_while() {
        let state = Arc::new((Mutex::new(0), Condvar::new()));
        let waiter = {
            let state = state.clone();
            std::thread::spawn(move || {
                let (count, changed) = &*state;
                let mut guard = count.lock();
                while *guard == 0 {
                    changed.wait(&mut guard);
                }
                *guard
            })
        };
        {
            let (count, changed) = &*state;
            let mut guard = count.lock();
            // The waiter cannot see the change before the lock is given back.
            MutexGuard::unlocked(&mut guard, || assert!(count.try_lock().is_some()));
            *guard = 7;
            changed.notify_all();
        }
        assert_eq!(waiter.join().unwrap(), 7);
        let (count, changed) = &*state;
        assert!(changed.wait_for(&mut count.lock(), Duration::from_millis(1)).timed_out());
    }

    /// The reason this crate exists: a child forked while other threads wait on locks (as a
    /// client's connection threads do) starts threads of its own and contends for new locks.
    /// With `parking_lot` in place of this crate, children hang (the global table of waiting
    /// threads the child inherits points into the stacks of threads the child does not have,
    /// which its new threads reuse).
    #[test]
    fn a_child_forked_while_threads_wait_can_contend_for_locks() {
        let sleepers: Vec<Arc<(Mutex<bool>, Condvar)>> = (0..8).map(|_| Arc::new((Mutex::new(false), Condvar::new()))).collect();
        let threads: Vec<_> = sleepers
            .iter()
            .cloned()
            .map(|sleeper| {
                std::thread::spawn(move || {
                    let (done, changed) = &*sleeper;
                    let mut guard = done.lock();
                    while !*guard {
                        changed.wait_for(&mut guard, Duration::from_millis(3));
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        let mut failures = Vec::new();
        for attempt in 0..100 {
            // SAFETY: fork; the child runs only the code below and leaves with _exit.
            let pid = unsafe { fork() };
            if pid == 0 {
                let shared = Arc::new((Mutex::new(0u64), Condvar::new()));
                let workers: Vec<_> = (0..8)
                    .map(|_| {
                        let shared = shared.clone();
                        std::thread::spawn(move || {
                            let (count, changed) = &*shared;
                            for _ in 0..300 {
                                let mut guard = count.lock();
                                *guard += 1;
                                changed.notify_all();
                                changed.wait_for(&mut guard, Duration::from_micros(20));
                            }
                        })
                    })
                    .collect();
                let whole = workers.into_iter().all(|worker| worker.join().is_ok()) && *shared.0.lock() == 2400;
                // SAFETY: ends the forked child without running the parent's destructors.
                unsafe { _exit(if whole { 0 } else { 1 }) };
            }
            assert!(pid > 0, "fork failed");
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let mut status = 0;
            // SAFETY: waits for (and if need be kills) the child just forked, by its pid.
            while unsafe {
                waitpid(pid, &mut status, 1 /* WNOHANG */)
            } == 0
            {
                if std::time::Instant::now() > deadline {
                    unsafe { kill(pid, 9) };
                    unsafe { waitpid(pid, &mut status, 0) };
                    status = -1;
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            if status != 0 {
                failures.push((attempt, status));
                if failures.len() == 3 {
                    break;
                }
            }
        }
        for sleeper in &sleepers {
            *sleeper.0.lock() = true;
            sleeper.1.notify_all();
        }
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(failures.is_empty(), "children that failed (attempt, wait status; -1: hung 10 s): {failures:?}");
    }

    unsafe extern "C" {
        fn fork() -> i32;
        fn _exit(code: i32) -> !;
        fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
        fn kill(pid: i32, signal: i32) -> i32;
    }

    #[test]
    fn a_thread_never_joins_itself() {
        let other = std::thread::spawn(|| 7);
        assert_eq!(super::join_unless_current(other).map(|result| result.ok()), Some(Some(7)));
        // A thread handed its own handle (as a pool's worker that drops the pool) returns at
        // once instead of waiting for itself.
        let (handle_send, handle_receive) = std::sync::mpsc::channel::<std::thread::JoinHandle<()>>();
        let (result_send, result_receive) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let own = handle_receive.recv().expect("its own handle");
            let _ = result_send.send(super::join_unless_current(own).is_none());
        });
        handle_send.send(thread).expect("the thread waits for its handle");
        assert_eq!(result_receive.recv_timeout(std::time::Duration::from_secs(10)), Ok(true));
    }
}
