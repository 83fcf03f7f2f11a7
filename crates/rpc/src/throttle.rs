//! Emulated hardware: a device or link of limited bandwidth and fixed latency, slowed down
//! by sleeping (not by burning CPU), so that one small machine can reproduce the ratios of a
//! cluster's DRAM, SSDs and network (the global memory's benchmarks, `ringfs bench gmem`).
//!
//! Transfers through one [`Throttle`] queue behind each other for its bandwidth (a token
//! bucket that never saves tokens up), and each also waits the latency, which overlaps with
//! other transfers (a device with a deep queue). Long waits sleep; the last 100–200 µs of a
//! wait yield the CPU in a loop, as a thread's wake-up from sleep takes tens of
//! microseconds here, more than a network latency to emulate.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Bandwidth and latency of an emulated device or link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceModel {
    pub bytes_per_second: u64,
    pub latency: Duration,
}

impl DeviceModel {
    /// How long `bytes` take at this bandwidth, latency aside.
    pub fn transfer_time(&self, bytes: u64) -> Duration {
        if self.bytes_per_second == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos((u128::from(bytes) * 1_000_000_000 / u128::from(self.bytes_per_second)) as u64)
    }
}

/// One emulated device or link.
#[derive(Debug)]
pub struct Throttle {
    model: DeviceModel,
    /// When the transfers queued so far are through.
    busy_until: Mutex<Instant>,
}

impl Throttle {
    pub fn new(model: DeviceModel) -> Throttle {
        Throttle { model, busy_until: Mutex::new(Instant::now()) }
    }

    pub fn model(&self) -> DeviceModel {
        self.model
    }

    /// Waits as long as moving `bytes` takes, behind the transfers queued before.
    pub fn pass(&self, bytes: u64) {
        let done = {
            let mut busy_until = self.busy_until.lock();
            let start = (*busy_until).max(Instant::now());
            *busy_until = start + self.model.transfer_time(bytes);
            *busy_until
        };
        wait_until(done + self.model.latency);
    }
}

thread_local! {
    static PRECISE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes this thread's sleeps end when asked (Linux lets a sleep run 50 µs late by default,
/// the "timer slack", which would swamp an emulated latency of a few microseconds).
fn precise_sleeps() {
    PRECISE.with(|precise| {
        if !precise.replace(true) {
            // SAFETY: a plain prctl(2) on this thread.
            unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64) };
        }
    });
}

/// Below this, a wait yields the CPU in a loop instead of sleeping: waking a sleeping
/// thread takes tens of microseconds under a hypervisor, more than the latencies emulated.
const SHORTEST_SLEEP: Duration = Duration::from_micros(200);

/// Waits until `until`: sleeping while far from it, then yielding the CPU (which costs
/// nothing when another thread wants it).
fn wait_until(until: Instant) {
    loop {
        let now = Instant::now();
        if now >= until {
            return;
        }
        let left = until - now;
        if left > SHORTEST_SLEEP {
            precise_sleeps();
            std::thread::sleep(left - SHORTEST_SLEEP / 2);
        } else {
            std::thread::yield_now();
        }
    }
}

/// Passes `bytes` through `throttle`, if there is one.
pub fn pass(throttle: Option<&Throttle>, bytes: u64) {
    if let Some(throttle) = throttle {
        throttle.pass(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfers_queue_for_bandwidth_and_each_waits_the_latency() {
        let model = DeviceModel { bytes_per_second: 100 << 20, latency: Duration::from_millis(2) };
        assert_eq!(model.transfer_time(1 << 20), Duration::from_millis(10));
        let throttle = Throttle::new(model);
        let started = Instant::now();
        std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(|| throttle.pass(1 << 20));
            }
        });
        // Three 10 ms transfers one after the other, the last one's latency on top.
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(32), "{took:?}");
    }
}
