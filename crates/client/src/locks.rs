//! Advisory locks (`fcntl` record locks, OFD locks, `flock`), kept by each file's inode
//! server so that they hold among all clients of the job (see the server's `file_locks.rs`
//! for the rules).
//!
//! The caller names the *owner* of a lock, a number of its own: the FUSE mount passes the
//! kernel's lock owner, the C library the process for `fcntl` locks and an open file
//! description for OFD locks and `flock`. Owners of different clients never mix.

use std::time::Duration;

use ringfs_proto::{Errno, FileLock, LockKind, Request, Response};

use crate::{Client, Fd, Result};

/// Longest pause between two tries of a lock that waits for a conflicting one to go.
const LONGEST_PAUSE: Duration = Duration::from_millis(50);

/// A byte range of a lock: `start..=end`, `end` [`u64::MAX`] meaning "to the end of the file,
/// however long it grows".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockRange {
    pub start: u64,
    pub end: u64,
}

impl LockRange {
    /// The whole file (`flock`).
    pub const WHOLE: LockRange = LockRange { start: 0, end: u64::MAX };

    /// The range of a `struct flock` whose start is resolved to `start` (an absolute offset)
    /// and whose length is `len` (0: to the end; negative: the `-len` bytes before `start`).
    /// EINVAL when the range begins before offset 0, EOVERFLOW when it ends past
    /// `i64::MAX`.
    pub fn from_flock(start: i64, len: i64) -> Result<LockRange> {
        let (first, last) = match len {
            0 => (start, i64::MAX),
            len if len > 0 => (start, start.checked_add(len - 1).ok_or(Errno::EOVERFLOW)?),
            len => (start.checked_add(len).ok_or(Errno::EINVAL)?, start - 1),
        };
        if first < 0 || last < first {
            return Err(Errno::EINVAL);
        }
        let end = if len == 0 { u64::MAX } else { last as u64 };
        Ok(LockRange { start: first as u64, end })
    }

    /// The length of a `struct flock` for this range (0: to the end).
    pub fn flock_len(&self) -> i64 {
        if self.end == u64::MAX { 0 } else { (self.end - self.start + 1) as i64 }
    }
}

/// The lock kind of a `struct flock`'s `l_type` (`F_RDLCK`, `F_WRLCK`, `F_UNLCK`); EINVAL
/// for anything else. (For the C library, the preload library and the FUSE mount.)
pub fn lock_kind_of(l_type: libc::c_int) -> Result<LockKind> {
    match l_type {
        libc::F_RDLCK => Ok(LockKind::Read),
        libc::F_WRLCK => Ok(LockKind::Write),
        libc::F_UNLCK => Ok(LockKind::Unlock),
        _ => Err(Errno::EINVAL),
    }
}

/// A lock standing in the way (`F_GETLK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockConflict {
    /// `Read` or `Write`.
    pub kind: LockKind,
    pub range: LockRange,
    /// The process that took it (on its own node).
    pub pid: u32,
}

/// What ends a lock wait before the lock comes free (EINTR).
#[derive(Clone, Copy)]
pub enum WaitEnds<'a> {
    /// A signal handler ran in the waiting thread: `F_SETLKW` in a program that handles a
    /// signal (an `alarm` set as the wait's time limit, say).
    OnSignalHandled,
    /// `interrupted()` answers true between two tries: a FUSE mount waiting on behalf of
    /// another process asks whether that one still waits.
    When(&'a dyn Fn() -> bool),
}

/// Sleeps for `pause`; false if a signal handler of this thread cut the sleep short.
fn pause_unless_signalled(pause: Duration) -> bool {
    let time = libc::timespec { tv_sec: pause.as_secs() as libc::time_t, tv_nsec: pause.subsec_nanos() as libc::c_long };
    // SAFETY: `time` is a valid timespec; no remainder is asked for.
    unsafe { libc::nanosleep(&time, std::ptr::null_mut()) == 0 }
}

impl Client {
    /// Takes (`Read`, `Write`) or gives back (`Unlock`) an advisory lock on `fd`'s file for
    /// `owner`. A lock in the way gives EAGAIN, or with `wait` is waited for (`F_SETLKW`;
    /// there is no deadlock detection; a signal handler that runs in the waiting
    /// thread ends the wait with EINTR, as it ends `F_SETLKW`). Any descriptor may take any lock (as `flock`
    /// allows); `fcntl` refuses a read lock through a descriptor not open for reading and a
    /// write lock through one not open for writing (EBADF): callers that follow `fcntl` check
    /// that with [`Client::access_mode`].
    pub fn set_lock(&self, fd: Fd, owner: u64, kind: LockKind, range: LockRange, wait: bool) -> Result<()> {
        if wait { self.set_lock_waiting(fd, owner, kind, range, WaitEnds::OnSignalHandled) } else { self.try_lock(fd, owner, kind, range) }
    }

    /// [`Client::set_lock`] that waits for a lock in the way to go, unless `ends` says the
    /// caller stopped waiting first: EINTR then, and the lock is not taken.
    pub fn set_lock_waiting(&self, fd: Fd, owner: u64, kind: LockKind, range: LockRange, ends: WaitEnds<'_>) -> Result<()> {
        let mut pause = Duration::from_millis(1);
        loop {
            match self.try_lock(fd, owner, kind, range) {
                Err(Errno::EAGAIN) => {
                    let signal_handled = !pause_unless_signalled(pause);
                    let interrupted = match ends {
                        WaitEnds::OnSignalHandled => signal_handled,
                        WaitEnds::When(interrupted) => interrupted(),
                    };
                    if interrupted {
                        return Err(Errno::EINTR);
                    }
                    pause = (pause * 2).min(LONGEST_PAUSE);
                }
                result => return result,
            }
        }
    }

    fn try_lock(&self, fd: Fd, owner: u64, kind: LockKind, range: LockRange) -> Result<()> {
        let open = self.file(fd)?;
        let request = Request::SetLock(self.lock_request(open.file, owner, kind, range));
        match self.inner.cluster.call_home(open.file, &request)? {
            Response::Done => Ok(()),
            _ => Err(Errno::EPROTO),
        }
    }

    /// The lock that stands in the way of `owner` taking `kind` over `range` on `fd`'s file,
    /// if any (`F_GETLK`).
    pub fn test_lock(&self, fd: Fd, owner: u64, kind: LockKind, range: LockRange) -> Result<Option<LockConflict>> {
        let open = self.file(fd)?;
        let request = Request::TestLock(self.lock_request(open.file, owner, kind, range));
        match self.inner.cluster.call_home(open.file, &request)? {
            Response::LockHolder(holder) => Ok(holder.map(|lock| LockConflict {
                kind: lock.kind,
                range: LockRange { start: lock.start, end: lock.end },
                pid: lock.pid,
            })),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Gives back every lock `owner` holds on `fd`'s file.
    pub fn release_locks(&self, fd: Fd, owner: u64) -> Result<()> {
        let open = self.file(fd)?;
        let request = Request::SetLock(self.lock_request(open.file, owner, LockKind::Unlock, LockRange::WHOLE));
        self.inner.cluster.call_home(open.file, &request).map(drop)
    }

    /// The file `fd` has open (no request: for callers that keep track of their locks).
    pub fn file_id(&self, fd: Fd) -> Result<ringfs_proto::FileId> {
        Ok(self.file(fd)?.file)
    }

    /// Whether `fd` is open for reading and for writing.
    pub fn access_mode(&self, fd: Fd) -> Result<(bool, bool)> {
        let open = self.file(fd)?;
        Ok((open.readable, open.writable))
    }

    fn lock_request(&self, file: ringfs_proto::FileId, owner: u64, kind: LockKind, range: LockRange) -> FileLock {
        FileLock { file, client: self.inner.client_id, owner, kind, start: range.start, end: range.end, pid: std::process::id() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flock_ranges_follow_fcntl() {
        assert_eq!(LockRange::from_flock(10, 0), Ok(LockRange { start: 10, end: u64::MAX }));
        assert_eq!(LockRange::from_flock(10, 5), Ok(LockRange { start: 10, end: 14 }));
        assert_eq!(LockRange::from_flock(10, -5), Ok(LockRange { start: 5, end: 9 }));
        assert_eq!(LockRange::from_flock(3, -5), Err(Errno::EINVAL));
        assert_eq!(LockRange::from_flock(-1, 1), Err(Errno::EINVAL));
        assert_eq!(LockRange::from_flock(i64::MAX, 2), Err(Errno::EOVERFLOW));
        assert_eq!(LockRange::from_flock(10, 5).unwrap().flock_len(), 5);
        assert_eq!(LockRange::WHOLE.flock_len(), 0);
    }
}
