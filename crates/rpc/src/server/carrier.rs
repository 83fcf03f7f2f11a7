//! Listeners that carry their connections' traffic — UCX's: one worker descriptor signals new
//! connections and every message of every connection — are not watched while threads serve
//! those connections.
//!
//! A thread serving a carried connection polls it between requests, and each poll moves the
//! worker on itself (routing what it finds for other connections to their inboxes, which wake
//! other threads). A watched listener would wake a second thread through the descriptor for
//! every message the serving thread takes anyway: on a busy CPU that hand-off cost a UCX
//! request more than the request itself (docs/PERFORMANCE.md, "ringfs over UCX against
//! ucx_perftest"). So while such threads are at work, a listener that finished accepting
//! leaves its watch owed here, and it is watched again
//! - by the last serving thread to stop (its connection went quiet or ended), or
//! - by the watchdog, once a whole [`CARRIER_TICK`] passed with nobody polling (every serving
//!   thread is inside a handler, perhaps one that waits on another server: someone must move
//!   the worker on for the other connections meanwhile), or
//! - at once by a polling thread whose progress took in a new connection, which only the
//!   listener's watcher accepts ([`CarrierWatch::watch_now`]; before, a connection opened
//!   beside one that never went quiet waited for it to pause: seconds on a busy machine).
//!
//! The watch is left to the serving threads only while one of them polls; so a message for
//! another connection waits at most about a tick, once, when the thread that polled enters a
//! handler that blocks.
//!
//! Exactly one of them pays a debt. The listener's thread checks for serving threads after
//! recording the debt, and a stopping thread clears the debt after uncounting itself, so a
//! debt is never left with nobody to pay it.

use ringfs_sync::{Condvar, Mutex};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// How long nobody may poll a carried connection, while its listener's watch is owed,
/// before the watchdog watches the listener again.
pub const CARRIER_TICK: Duration = Duration::from_micros(500);

/// Threads serving carried connections, and whether a carrying listener waits to be watched.
#[derive(Default)]
pub struct CarrierWatch {
    /// Threads serving a carried connection (between their first poll and parking it).
    serving: AtomicUsize,
    /// Threads polling a carried connection right now.
    polling: AtomicUsize,
    /// Polls begun so far (the watchdog's sign of life).
    polls: AtomicU64,
    owed: AtomicBool,
    /// Watches every carrying listener again (set by the event loop that owns them).
    watch_again: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Times a carrying listener's descriptor woke a thread (for tests and status).
    wakeups: AtomicU64,
    /// The watchdog sleeps here while no debt is owed; true once stopped.
    stopped: Mutex<bool>,
    debt: Condvar,
}

/// A thread serving a carried connection; dropping it ends the service.
pub struct CarrierService<'a>(&'a CarrierWatch);

/// A thread polling a carried connection; dropping it ends the poll.
pub struct CarrierPoll<'a>(&'a CarrierWatch);

impl CarrierWatch {
    /// Sets how the carrying listeners are watched again (once, by their event loop).
    pub fn set_watch_again(&self, watch_again: Box<dyn Fn() + Send + Sync>) {
        let _ = self.watch_again.set(watch_again);
    }

    /// Counts a thread serving a carried connection until the returned guard drops.
    pub fn serve(&self) -> CarrierService<'_> {
        self.serving.fetch_add(1, Ordering::SeqCst);
        CarrierService(self)
    }

    /// Counts a thread polling a carried connection until the returned guard drops.
    pub fn poll(&self) -> CarrierPoll<'_> {
        self.polling.fetch_add(1, Ordering::SeqCst);
        self.polls.fetch_add(1, Ordering::SeqCst);
        CarrierPoll(self)
    }

    /// Counts a wake-up by a carrying listener's descriptor.
    pub fn count_wakeup(&self) {
        self.wakeups.fetch_add(1, Ordering::Relaxed);
    }

    pub fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    /// Called by a carrying listener's thread when it is done accepting, instead of watching
    /// the listener again: true if the watch is left to the serving threads (then the caller
    /// must not watch it), false if the caller watches it now. It is left to them only while
    /// one of them polls: if all are inside handlers, the listener watches for the others.
    pub fn leave_watch_to_servers(&self) -> bool {
        self.owed.store(true, Ordering::SeqCst);
        if self.polling.load(Ordering::SeqCst) > 0 {
            let _stopped = self.stopped.lock();
            self.debt.notify_one();
            return true;
        }
        // Nobody polls: watch now — unless a thread that just stopped serving took the debt
        // (it watches instead).
        !self.owed.swap(false, Ordering::SeqCst)
    }

    /// Watches the listener again now if its watch is owed (a polling thread took in a new
    /// connection: under a connection that never goes quiet the watch would otherwise wait
    /// for that connection to pause — seconds, on a busy machine).
    pub fn watch_now(&self) {
        self.pay();
    }

    /// Pays the debt, if one is owed.
    fn pay(&self) {
        if self.owed.swap(false, Ordering::SeqCst)
            && let Some(watch_again) = self.watch_again.get()
        {
            watch_again();
        }
    }

    /// The watchdog (a thread of its own, until [`CarrierWatch::stop`]): while a debt is
    /// owed, pays it once a whole [`CARRIER_TICK`] passed with nobody polling.
    pub fn watchdog(&self) {
        let mut stopped = self.stopped.lock();
        loop {
            while !*stopped && !self.owed.load(Ordering::SeqCst) {
                self.debt.wait(&mut stopped);
            }
            if *stopped {
                return;
            }
            let polls = self.polls.load(Ordering::SeqCst);
            self.debt.wait_for(&mut stopped, CARRIER_TICK);
            if *stopped {
                return;
            }
            if self.polling.load(Ordering::SeqCst) == 0 && self.polls.load(Ordering::SeqCst) == polls {
                drop(stopped);
                self.pay();
                stopped = self.stopped.lock();
            }
        }
    }

    /// Ends [`CarrierWatch::watchdog`].
    pub fn stop(&self) {
        *self.stopped.lock() = true;
        self.debt.notify_all();
    }
}

impl Drop for CarrierService<'_> {
    fn drop(&mut self) {
        if self.0.serving.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.pay();
        }
    }
}

impl Drop for CarrierPoll<'_> {
    fn drop(&mut self) {
        self.0.polling.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    /// A watch whose listener watches are counted.
    fn counted() -> (Arc<CarrierWatch>, Arc<AtomicUsize>) {
        let watch = Arc::new(CarrierWatch::default());
        let watched = Arc::new(AtomicUsize::new(0));
        let counter = watched.clone();
        watch.set_watch_again(Box::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        }));
        (watch, watched)
    }

    fn with_watchdog(watch: &Arc<CarrierWatch>) -> std::thread::JoinHandle<()> {
        let watchdog = watch.clone();
        std::thread::spawn(move || watchdog.watchdog())
    }

    #[test]
    fn without_pollers_the_listener_watches_itself() {
        let (watch, watched) = counted();
        assert!(!watch.leave_watch_to_servers());
        let service = watch.serve();
        assert!(!watch.leave_watch_to_servers(), "serving but inside a handler");
        drop(service);
        assert_eq!(watched.load(Ordering::SeqCst), 0, "no debt: the server watches nothing");
    }

    #[test]
    fn the_last_server_to_stop_watches_once() {
        let (watch, watched) = counted();
        let first = watch.serve();
        let second = watch.serve();
        let poll = watch.poll();
        assert!(watch.leave_watch_to_servers());
        assert!(watch.leave_watch_to_servers());
        drop(poll);
        drop(first);
        assert_eq!(watched.load(Ordering::SeqCst), 0, "a thread still serves");
        drop(second);
        assert_eq!(watched.load(Ordering::SeqCst), 1);
        drop(watch.serve());
        assert_eq!(watched.load(Ordering::SeqCst), 1, "the debt was paid");
    }

    /// A thread serving but not polling (inside a handler that waits) does not keep the
    /// listener unwatched for longer than about a tick; one that keeps polling does.
    #[test]
    fn the_watchdog_pays_when_nobody_polls() {
        let (watch, watched) = counted();
        let watchdog = with_watchdog(&watch);
        let service = watch.serve();
        let poll = watch.poll();
        assert!(watch.leave_watch_to_servers());
        std::thread::sleep(CARRIER_TICK * 20);
        assert_eq!(watched.load(Ordering::SeqCst), 0, "a thread was polling all along");
        drop(poll);
        let waiting_since = Instant::now();
        while watched.load(Ordering::SeqCst) == 0 {
            assert!(waiting_since.elapsed() < Duration::from_secs(2), "the watchdog never paid");
            std::thread::sleep(CARRIER_TICK / 4);
        }
        drop(service);
        assert_eq!(watched.load(Ordering::SeqCst), 1, "paid once");
        watch.stop();
        watchdog.join().unwrap();
    }

    /// Listener threads and serving threads racing: no debt is left unpaid when all stop.
    #[test]
    fn racing_listeners_and_servers_leave_no_debt() {
        for seed in 0..50u64 {
            let (watch, _) = counted();
            let threads: Vec<_> = (0..4)
                .map(|thread| {
                    let watch = watch.clone();
                    std::thread::spawn(move || {
                        for round in 0..2_000u64 {
                            if (round * 31 + thread * 7 + seed) % 3 == 0 {
                                watch.leave_watch_to_servers();
                            } else {
                                let service = watch.serve();
                                drop(watch.poll());
                                drop(service);
                            }
                        }
                    })
                })
                .collect();
            for thread in threads {
                thread.join().unwrap();
            }
            assert!(!watch.owed.load(Ordering::SeqCst), "seed {seed}: a debt left unpaid");
            assert_eq!(watch.serving.load(Ordering::SeqCst), 0);
        }
    }
}
