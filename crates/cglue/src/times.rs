//! The two timespecs of `utimensat(2)` and `futimens(2)` (access time, then modification
//! time) as the change they ask for.

use ringfs_client::Errno;

const NANOS_PER_SECOND: i64 = 1_000_000_000;

/// The times a `utimensat` sets: `None` leaves one as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeChange {
    pub atime_ns: Option<i64>,
    pub mtime_ns: Option<i64>,
    /// Whether a time was given as a value (not `UTIME_NOW` or `UTIME_OMIT`): setting such a
    /// time needs ownership of the file, setting "now" only write access.
    pub explicit: bool,
}

/// Nanoseconds since the epoch now (0 if the clock is before it).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos() as i64)
}

/// `times` with `now_ns` for `UTIME_NOW`. EINVAL for a `tv_nsec` that is neither in
/// `0..1e9` nor `UTIME_NOW`/`UTIME_OMIT`; seconds too large for nanoseconds in an `i64`
/// (year 2262) clamp to the largest (smallest) time, as the kernel clamps to its range.
pub fn decode(times: &[libc::timespec; 2], now_ns: i64) -> Result<TimeChange, Errno> {
    let value = |time: &libc::timespec| match time.tv_nsec {
        libc::UTIME_OMIT => Ok(None),
        libc::UTIME_NOW => Ok(Some(now_ns)),
        nanos if (0..NANOS_PER_SECOND).contains(&nanos) => Ok(Some(time.tv_sec.saturating_mul(NANOS_PER_SECOND).saturating_add(nanos))),
        _ => Err(Errno::EINVAL),
    };
    let explicit = times.iter().any(|time| time.tv_nsec != libc::UTIME_NOW && time.tv_nsec != libc::UTIME_OMIT);
    Ok(TimeChange { atime_ns: value(&times[0])?, mtime_ns: value(&times[1])?, explicit })
}

/// The change a caller's `times` argument asks for: NULL sets both times to now.
///
/// # Safety
/// `times` must be NULL or point to two timespecs.
pub unsafe fn from_c(times: *const libc::timespec) -> Result<TimeChange, Errno> {
    let now = now_ns();
    if times.is_null() {
        return Ok(TimeChange { atime_ns: Some(now), mtime_ns: Some(now), explicit: false });
    }
    // SAFETY: the caller passes two timespecs.
    decode(unsafe { &*times.cast::<[libc::timespec; 2]>() }, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(tv_sec: i64, tv_nsec: i64) -> libc::timespec {
        libc::timespec { tv_sec, tv_nsec }
    }

    #[test]
    fn values_are_explicit_nanoseconds() {
        let change = decode(&[time(1, 5), time(-2, 999_999_999)], 77);
        assert_eq!(change, Ok(TimeChange { atime_ns: Some(1_000_000_005), mtime_ns: Some(-1_000_000_001), explicit: true }));
    }

    #[test]
    fn utime_now_is_now_and_not_explicit() {
        let change = decode(&[time(9, libc::UTIME_NOW), time(0, libc::UTIME_NOW)], 77);
        assert_eq!(change, Ok(TimeChange { atime_ns: Some(77), mtime_ns: Some(77), explicit: false }));
    }

    #[test]
    fn utime_omit_leaves_a_time_and_ignores_its_seconds() {
        let change = decode(&[time(-5, libc::UTIME_OMIT), time(3, 0)], 77);
        assert_eq!(change, Ok(TimeChange { atime_ns: None, mtime_ns: Some(3_000_000_000), explicit: true }));
        let both = decode(&[time(0, libc::UTIME_OMIT), time(0, libc::UTIME_NOW)], 77);
        assert_eq!(both, Ok(TimeChange { atime_ns: None, mtime_ns: Some(77), explicit: false }));
    }

    #[test]
    fn nanoseconds_out_of_range_are_einval() {
        assert_eq!(decode(&[time(0, 1_000_000_000), time(0, 0)], 0), Err(Errno::EINVAL));
        assert_eq!(decode(&[time(0, 0), time(0, -1)], 0), Err(Errno::EINVAL));
        assert!(decode(&[time(0, 999_999_999), time(0, 0)], 0).is_ok());
    }

    #[test]
    fn seconds_past_the_range_clamp() {
        let change = decode(&[time(i64::MAX, 0), time(i64::MIN, 0)], 0).expect("valid nanoseconds");
        assert_eq!((change.atime_ns, change.mtime_ns), (Some(i64::MAX), Some(i64::MIN)));
    }

    #[test]
    fn null_times_set_both_to_now() {
        // SAFETY: NULL is allowed.
        let change = unsafe { from_c(std::ptr::null()) }.expect("NULL is valid");
        assert!(!change.explicit && change.atime_ns.is_some() && change.atime_ns == change.mtime_ns);
        let times = [time(1, 0), time(2, libc::UTIME_OMIT)];
        // SAFETY: two timespecs.
        assert_eq!(unsafe { from_c(times.as_ptr()) }.map(|change| change.atime_ns), Ok(Some(1_000_000_000)));
    }
}
