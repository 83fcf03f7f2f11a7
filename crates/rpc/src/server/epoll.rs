//! The few Linux calls the event loop needs (epoll, eventfd, timerfd), wrapped so that the
//! rest of the server never touches a raw system call.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Readiness events a connection or listener is armed for: input, or the peer closing.
pub const READABLE: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
/// Delivered to one waiting thread, then disarmed until [`Epoll::rearm`]: whoever receives
/// the event owns the connection until it arms it again.
pub const ONE_SHOT: u32 = libc::EPOLLONESHOT as u32;

fn check(result: libc::c_int) -> io::Result<libc::c_int> {
    if result < 0 { Err(io::Error::last_os_error()) } else { Ok(result) }
}

/// An epoll instance.
pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 has no memory arguments; the result is a new descriptor we own.
        let fd = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
        Ok(Epoll { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    fn control(&self, operation: libc::c_int, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        let mut event = libc::epoll_event { events, u64: token };
        // SAFETY: `event` is a valid epoll_event for the duration of the call.
        check(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), operation, fd, &mut event) }).map(drop)
    }

    /// Starts watching `fd` for `events`, reporting `token`.
    pub fn add(&self, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        self.control(libc::EPOLL_CTL_ADD, fd, token, events)
    }

    /// Arms `fd` again (after a one-shot event); reports at once if it is ready already.
    pub fn rearm(&self, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        self.control(libc::EPOLL_CTL_MOD, fd, token, events)
    }

    /// Readable while one of the watched descriptors is ready: an epoll set can be watched
    /// by another.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Stops watching `fd`.
    pub fn remove(&self, fd: RawFd) {
        // Fails only if `fd` is not watched, which changes nothing.
        let _ = self.control(libc::EPOLL_CTL_DEL, fd, 0, 0);
    }

    /// Waits for one event, at most `timeout`: `(token, events)`, or `None` on timeout. The
    /// kernel wakes one waiting thread per event, the one that waited last first.
    pub fn wait_one(&self, timeout: Duration) -> io::Result<Option<(u64, u32)>> {
        let mut event = libc::epoll_event { events: 0, u64: 0 };
        let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: room for exactly one event, as maxevents says.
        let count = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), &mut event, 1, timeout_ms) };
        match count {
            0 => Ok(None),
            1 => Ok(Some((event.u64, event.events))),
            _ => Err(io::Error::last_os_error()),
        }
    }
}

/// An eventfd: a counter whose being non-zero makes it readable.
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd has no memory arguments; the result is a new descriptor we own.
        let fd = check(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
        Ok(EventFd { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Makes it readable (and wakes a waiter) until drained.
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one`. Fails only if the counter would overflow.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Takes the count, so that it is quiet again until the next signal.
    pub fn drain(&self) {
        let mut count: u64 = 0;
        // SAFETY: reads at most 8 bytes into `count`; EAGAIN when it is zero already.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut count).cast(), 8) };
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A periodic timer that makes its descriptor readable.
pub struct TimerFd {
    fd: OwnedFd,
}

impl TimerFd {
    pub fn new() -> io::Result<TimerFd> {
        // SAFETY: timerfd_create has no memory arguments; the result is a new descriptor.
        let fd = check(unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC | libc::TFD_NONBLOCK) })?;
        // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
        Ok(TimerFd { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Fires every `period` from now on (`None`: stops).
    pub fn set_period(&self, period: Option<Duration>) {
        let period = period.unwrap_or(Duration::ZERO);
        let spec = libc::timespec { tv_sec: period.as_secs() as libc::time_t, tv_nsec: period.subsec_nanos() as libc::c_long };
        let setting = libc::itimerspec { it_interval: spec, it_value: spec };
        // SAFETY: `setting` is valid for the call; the old setting is not asked for.
        unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &setting, std::ptr::null_mut()) };
    }

    /// Takes the expirations counted so far, so that the descriptor is quiet again.
    pub fn drain(&self) {
        let mut expirations: u64 = 0;
        // SAFETY: reads at most 8 bytes into `expirations`; EAGAIN when none are counted.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), (&raw mut expirations).cast(), 8) };
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The soft limit on open files of this process (`ulimit -n`).
pub fn open_file_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into `limit`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 1024;
    }
    limit.rlim_cur
}

/// Raises the soft limit on open files to the hard limit (what an unprivileged process may
/// do by itself); returns the new soft limit.
pub fn raise_open_file_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into `limit`; setrlimit reads it.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
    open_file_limit()
}
