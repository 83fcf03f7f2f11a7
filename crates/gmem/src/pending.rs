//! Operations that complete later: a small pool of worker threads runs them, handles
//! ([`GetHandle`], [`PutHandle`]) wait for one, and the *implicit* ones (the `_nbi`
//! calls) are counted so that [`crate::World::quiet`] can wait for them all.

use ringfs_sync::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};

use ringfs_proto::Errno;

use crate::Result;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The jobs waiting, and whether the pool is closing; with the condition variable that
/// wakes the workers.
type Queue = Arc<(Mutex<(VecDeque<Job>, bool)>, Condvar)>;

/// Worker threads taking jobs in order; they end at [`Pool::finish`] (or when the pool is
/// dropped), once every job queued before has run.
pub(crate) struct Pool {
    queue: Queue,
    workers: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Pool {
    pub fn new(threads: usize) -> Pool {
        let queue: Queue = Arc::default();
        let workers = (0..threads)
            .map(|index| {
                let queue = queue.clone();
                std::thread::Builder::new()
                    .name(format!("ringfs-gmem-{index}"))
                    .spawn(move || {
                        loop {
                            let job = {
                                let (jobs, ready) = &*queue;
                                let mut jobs = jobs.lock();
                                loop {
                                    if let Some(job) = jobs.0.pop_front() {
                                        break job;
                                    }
                                    if jobs.1 {
                                        return;
                                    }
                                    ready.wait(&mut jobs);
                                }
                            };
                            job();
                        }
                    })
                    .expect("a worker thread starts")
            })
            .collect();
        Pool { queue, workers: Mutex::new(workers) }
    }

    /// Runs `job` on a worker thread (on this one once the pool is finished).
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        let (jobs, ready) = &*self.queue;
        let mut queued = jobs.lock();
        if queued.1 {
            drop(queued);
            job();
            return;
        }
        queued.0.push_back(Box::new(job));
        ready.notify_one();
    }

    /// Runs the jobs queued, then ends the workers and waits for them.
    pub fn finish(&self) {
        let (jobs, ready) = &*self.queue;
        jobs.lock().1 = true;
        ready.notify_all();
        for worker in std::mem::take(&mut *self.workers.lock()) {
            // (A worker never waits for itself, should the pool be dropped by one of its jobs.)
            let _ = ringfs_sync::join_unless_current(worker);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A non-blocking get under way: [`GetHandle::wait`] gives the bytes.
pub struct GetHandle {
    receiver: Receiver<Result<Vec<u8>>>,
    done: Option<Result<Vec<u8>>>,
}

/// A non-blocking put under way: [`PutHandle::wait`] returns once the put is complete (a
/// get by anyone that begins after sees it); the source buffer comes back.
pub struct PutHandle {
    receiver: Receiver<Result<Vec<u8>>>,
    done: Option<Result<Vec<u8>>>,
}

macro_rules! handle_methods {
    ($handle:ident) => {
        impl $handle {
            pub(crate) fn new() -> ($handle, Sender<Result<Vec<u8>>>) {
                let (sender, receiver) = channel();
                ($handle { receiver, done: None }, sender)
            }

            /// Whether the operation completed (then [`Self::wait`] returns at once).
            pub fn test(&mut self) -> bool {
                if self.done.is_none() {
                    self.done = self.receiver.try_recv().ok();
                }
                self.done.is_some()
            }

            /// Waits for the operation; its bytes (the data got, or the buffer put).
            pub fn wait(mut self) -> Result<Vec<u8>> {
                match self.done.take() {
                    Some(outcome) => outcome,
                    None => self.receiver.recv().unwrap_or(Err(Errno::EIO)),
                }
            }
        }
    };
}

handle_methods!(GetHandle);
handle_methods!(PutHandle);

/// The implicit (`_nbi`) operations of a world: how many are under way, and the first
/// error among those completed since the last [`Implicit::quiet`].
#[derive(Default)]
pub(crate) struct Implicit {
    state: Mutex<(usize, Option<Errno>)>,
    idle: Condvar,
}

impl Implicit {
    pub fn begin(&self) {
        self.state.lock().0 += 1;
    }

    pub fn end(&self, outcome: Result<()>) {
        let mut state = self.state.lock();
        state.0 -= 1;
        if let Err(errno) = outcome {
            state.1.get_or_insert(errno);
        }
        if state.0 == 0 {
            self.idle.notify_all();
        }
    }

    /// Waits until none is under way; the first error since the last call, if any.
    pub fn quiet(&self) -> Result<()> {
        let mut state = self.state.lock();
        while state.0 > 0 {
            self.idle.wait(&mut state);
        }
        state.1.take().map_or(Ok(()), Err)
    }
}
