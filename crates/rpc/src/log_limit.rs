//! Logging that an outside peer cannot turn into a flood.
//!
//! A server logs refused connections (wrong secret, malformed handshake, over the connection
//! cap). Anyone who can reach its port can cause those, so each kind of message is written at
//! most once per interval, with the number of messages left out since the last one.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// At most one log line per interval; the others are counted.
pub struct RateLimitedLog {
    interval: Duration,
    state: Mutex<LimitState>,
}

struct LimitState {
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimitedLog {
    pub const fn new(interval: Duration) -> RateLimitedLog {
        RateLimitedLog { interval, state: Mutex::new(LimitState { last: None, suppressed: 0 }) }
    }

    /// `Some(n)` if a line may be written now (`n` lines were left out before it), `None`
    /// if this one must be left out.
    pub fn admit(&self) -> Option<u64> {
        let mut state = self.state.lock();
        let now = Instant::now();
        if state.last.is_some_and(|last| now.duration_since(last) < self.interval) {
            state.suppressed += 1;
            return None;
        }
        state.last = Some(now);
        Some(std::mem::take(&mut state.suppressed))
    }

    /// Logs `message` at `level` if the limit allows, noting how many were left out.
    pub fn log(&self, level: log::Level, message: std::fmt::Arguments<'_>) {
        if let Some(suppressed) = self.admit() {
            if suppressed > 0 {
                log::log!(level, "{message} ({suppressed} more like this since the last report)");
            } else {
                log::log!(level, "{message}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_a_count_of_the_rest() {
        let limiter = RateLimitedLog::new(Duration::from_millis(50));
        assert_eq!(limiter.admit(), Some(0));
        for _ in 0..10 {
            assert_eq!(limiter.admit(), None);
        }
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(limiter.admit(), Some(10));
        assert_eq!(limiter.admit(), None);
    }
}
