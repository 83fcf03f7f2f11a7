//! The deadline of the request a thread is handling, and the bounds of every wait in a
//! handler.
//!
//! A client says in its `Hello` how long it waits for an answer; a request is handled with
//! that deadline (less the time it spent on the way, estimated from the client's clock
//! stamps: [`client_deadline`]). Waits for a name lock or a frozen subtree end at the
//! deadline or after [`WAIT_LIMIT`], and a change not begun when the caller has given up is
//! not begun at all ([`past_request_deadline`]). The deadline lives in a thread-local so that
//! the waits deep inside a handler see it without every function passing it along.

use std::time::{Duration, Instant};

use ringfs_proto::{Errno, Request};

use crate::session::{CLOCK_SAMPLES, Session};

/// Longest an operation waits for a name lock or a freeze to end.
pub const WAIT_LIMIT: Duration = Duration::from_secs(20);

thread_local! {
    /// When the caller of the request this thread serves stops waiting for the answer.
    static REQUEST_DEADLINE: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// Runs `body` (the handling of one request) with waits for names and freezes ending at
/// `deadline` too, and [`past_request_deadline`] telling whether it has passed: a request
/// whose caller has given up must not begin a change after the caller's next requests.
pub fn with_request_deadline<T>(deadline: Option<Instant>, body: impl FnOnce() -> T) -> T {
    let outer = REQUEST_DEADLINE.with(|cell| cell.replace(deadline));
    let result = body();
    REQUEST_DEADLINE.with(|cell| cell.set(outer));
    result
}

/// Runs `body` with no request deadline: the steps of a change past its point of no return
/// (a rename whose new name is installed, a directory rename whose names have begun to
/// move) must all be done, however long the caller has waited; failing one because the
/// caller gave up would leave a file with two names or names under a directory that is gone.
pub fn past_point_of_no_return<T>(body: impl FnOnce() -> T) -> T {
    with_request_deadline(None, body)
}

/// Whether the caller of the request being handled has stopped waiting (or nearly): a
/// change of names not begun yet is not begun then (ETIMEDOUT).
pub fn past_request_deadline() -> bool {
    REQUEST_DEADLINE.with(|cell| cell.get()).is_some_and(|deadline| crate::sched::now() >= deadline)
}

/// When the caller of the request this thread serves stops waiting: its deadline, or
/// `otherwise` from now for a request without one.
pub fn request_deadline_or(otherwise: Duration) -> Instant {
    REQUEST_DEADLINE.with(|cell| cell.get()).unwrap_or_else(|| crate::sched::now() + otherwise)
}

/// The end of a wait begun at `started`: [`WAIT_LIMIT`] later, or the request's deadline.
pub(crate) fn wait_end(started: Instant) -> Instant {
    let limit = started + WAIT_LIMIT;
    REQUEST_DEADLINE.with(|cell| cell.get()).map_or(limit, |deadline| deadline.min(limit))
}

/// How a wait that ran out fails: ETIMEDOUT when the caller has given up (the request's
/// deadline), EBUSY after [`WAIT_LIMIT`].
pub(crate) fn wait_failure() -> Errno {
    if past_request_deadline() { Errno::ETIMEDOUT } else { Errno::EBUSY }
}

/// When the client of `session` stops waiting for `request`: `patience` after it sent it,
/// or after it arrived when the request carries no time stamp or the client's clock is not
/// known. How long ago it was sent is its clock sample less the smallest recent one (see
/// `Session::clock_samples`): the delay a request spent in the network or in a socket — a
/// link down, TCP retransmitting, this server paused — counts, and a `Hello` that was itself
/// delayed makes no request look late.
pub fn client_deadline(session: &mut Session, request: &Request, patience: Duration) -> Instant {
    const BEYOND_REASON_NS: i64 = 60_000_000_000;
    let now = crate::sched::now();
    let (Some(sent), false) = (request.client_time_ns(), session.clock_samples.is_empty()) else { return now + patience };
    let sample = ringfs_rpc::wall_clock_ns().saturating_sub(sent);
    if session.clock_samples.len() == CLOCK_SAMPLES {
        session.clock_samples.pop_front();
    }
    session.clock_samples.push_back(sample);
    let offset = session.clock_samples.iter().copied().min().unwrap_or(sample);
    let delay_ns = sample.saturating_sub(offset);
    if !(0..BEYOND_REASON_NS).contains(&delay_ns) {
        return now + patience;
    }
    now + patience.saturating_sub(Duration::from_nanos(delay_ns as u64))
}
