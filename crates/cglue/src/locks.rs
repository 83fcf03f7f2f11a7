//! `fcntl` lock commands and `flock` operations resolved to what [`Client::set_lock`] and
//! [`Client::test_lock`] take (an owner, a kind, a byte range), the `F_GETLK` answer, and
//! the files this process holds locks on.
//!
//! Owners as Linux has them: `fcntl` record locks (`F_SETLK`, `F_SETLKW`, `F_GETLK`) belong
//! to the process, [`PROCESS_OWNER`]; OFD locks (`F_OFD_*`) and `flock` to the open file
//! description, [`description_owner`] of a number the caller picks for it.
//!
//! [`Client::set_lock`]: ringfs_client::Client::set_lock
//! [`Client::test_lock`]: ringfs_client::Client::test_lock

use std::collections::HashMap;
use std::ffi::c_int;

use ringfs_client::{Errno, FileId, LockConflict, LockKind, LockRange};
use ringfs_sync::Mutex;

/// The owner of the process's record locks.
pub const PROCESS_OWNER: u64 = 0;

/// The owner of an open file description's OFD locks and `flock`, from a number that tells
/// descriptions apart (never [`PROCESS_OWNER`]).
pub fn description_owner(description: u64) -> u64 {
    (1 << 63) | description
}

/// Whose lock an `fcntl` command is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockOwner {
    Process,
    Description,
}

impl LockOwner {
    /// The owner number of this kind, for the description numbered `description`.
    pub fn id(self, description: u64) -> u64 {
        match self {
            LockOwner::Process => PROCESS_OWNER,
            LockOwner::Description => description_owner(description),
        }
    }
}

/// What an `fcntl` lock command does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockAction {
    /// `F_GETLK`: report the lock in the way, if any.
    Test,
    /// `F_SETLK`: take or give back; EAGAIN if a lock is in the way.
    Set,
    /// `F_SETLKW`: take or give back, waiting for a lock in the way to go.
    SetAndWait,
}

/// What `l_start` counts from (`l_whence`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `SEEK_SET`: offset 0.
    Start,
    /// `SEEK_CUR`: the descriptor's position.
    Position,
    /// `SEEK_END`: the file's size.
    End,
}

/// An `fcntl(fd, cmd, &lock)` lock command, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockRequest {
    pub owner: LockOwner,
    pub action: LockAction,
    pub kind: LockKind,
    pub origin: Origin,
    /// `l_start`, relative to [`origin`](LockRequest::origin).
    pub start: i64,
    /// `l_len`: 0 to the end of the file, however long it grows; negative: the bytes before
    /// the start.
    pub len: i64,
}

impl LockRequest {
    /// Decodes `cmd` (`F_GETLK`, `F_SETLK`, `F_SETLKW` and their `F_OFD_` forms) and `lock`.
    /// EINVAL for another command, an OFD command with a non-zero `l_pid`, an unknown
    /// `l_type` or `l_whence`, or `F_UNLCK` to a `GETLK` command.
    pub fn from_fcntl(cmd: c_int, lock: &libc::flock) -> Result<LockRequest, Errno> {
        let (owner, action) = match cmd {
            libc::F_GETLK => (LockOwner::Process, LockAction::Test),
            libc::F_SETLK => (LockOwner::Process, LockAction::Set),
            libc::F_SETLKW => (LockOwner::Process, LockAction::SetAndWait),
            libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW if lock.l_pid != 0 => return Err(Errno::EINVAL),
            libc::F_OFD_GETLK => (LockOwner::Description, LockAction::Test),
            libc::F_OFD_SETLK => (LockOwner::Description, LockAction::Set),
            libc::F_OFD_SETLKW => (LockOwner::Description, LockAction::SetAndWait),
            _ => return Err(Errno::EINVAL),
        };
        let kind = ringfs_client::lock_kind_of(c_int::from(lock.l_type))?;
        if action == LockAction::Test && kind == LockKind::Unlock {
            return Err(Errno::EINVAL);
        }
        let origin = match c_int::from(lock.l_whence) {
            libc::SEEK_SET => Origin::Start,
            libc::SEEK_CUR => Origin::Position,
            libc::SEEK_END => Origin::End,
            _ => return Err(Errno::EINVAL),
        };
        Ok(LockRequest { owner, action, kind, origin, start: lock.l_start, len: lock.l_len })
    }

    /// The byte range, where the [`origin`](LockRequest::origin) is at `origin_offset`.
    /// EOVERFLOW when the start or end is past `i64::MAX`, EINVAL when the range begins
    /// before offset 0.
    pub fn range(&self, origin_offset: i64) -> Result<LockRange, Errno> {
        LockRange::from_flock(origin_offset.checked_add(self.start).ok_or(Errno::EOVERFLOW)?, self.len)
    }

    /// `fcntl` takes a read lock only through a descriptor open for reading and a write lock
    /// only through one open for writing (EBADF otherwise).
    pub fn check_access(&self, readable: bool, writable: bool) -> Result<(), Errno> {
        match self.kind {
            LockKind::Read if !readable => Err(Errno::EBADF),
            LockKind::Write if !writable => Err(Errno::EBADF),
            _ => Ok(()),
        }
    }
}

/// `flock(fd, operation)`: the kind (`LOCK_SH`, `LOCK_EX`, `LOCK_UN`) and whether to wait
/// (not with `LOCK_NB`); EINVAL for anything else.
pub fn flock_operation(operation: c_int) -> Result<(LockKind, bool), Errno> {
    let kind = match operation & !libc::LOCK_NB {
        libc::LOCK_SH => LockKind::Read,
        libc::LOCK_EX => LockKind::Write,
        libc::LOCK_UN => LockKind::Unlock,
        _ => return Err(Errno::EINVAL),
    };
    Ok((kind, operation & libc::LOCK_NB == 0))
}

/// Fills an `F_GETLK` answer into `lock`: the lock standing in the way, with its process
/// id when `show_pid` (a process's own `fcntl` lock; -1 for OFD locks, as Linux reports), or
/// `F_UNLCK` when none does.
pub fn report_conflict(lock: &mut libc::flock, conflict: Option<LockConflict>, show_pid: bool) {
    match conflict {
        Some(conflict) => {
            lock.l_type = if conflict.kind == LockKind::Write { libc::F_WRLCK } else { libc::F_RDLCK } as libc::c_short;
            lock.l_whence = libc::SEEK_SET as libc::c_short;
            lock.l_start = conflict.range.start as libc::off_t;
            lock.l_len = conflict.range.flock_len();
            lock.l_pid = if show_pid { conflict.pid as libc::pid_t } else { -1 };
        }
        None => lock.l_type = libc::F_UNLCK as libc::c_short,
    }
}

/// The owners in this process that took locks, by file: a close sends nothing when there is
/// nothing to give back.
static LOCKING: Mutex<Option<HashMap<FileId, Vec<u64>>>> = Mutex::new(None);

/// The owners table's lock, for a library's `fork` handler to hold across the `fork` (so
/// that the child never inherits it taken by another thread).
pub fn lock_owners_for_fork() -> impl std::any::Any {
    LOCKING.lock()
}

/// `owner` took a lock on `file`.
pub fn remember_owner(file: FileId, owner: u64) {
    let mut locking = LOCKING.lock();
    let owners = locking.get_or_insert_with(HashMap::new).entry(file).or_default();
    if !owners.contains(&owner) {
        owners.push(owner);
    }
}

/// Takes out of the remembered owners of `file` those `ending` selects, and returns them
/// (their locks are for the caller to give back).
pub fn forget_owners(file: FileId, ending: impl Fn(u64) -> bool) -> Vec<u64> {
    let mut locking = LOCKING.lock();
    let Some(files) = locking.as_mut() else { return Vec::new() };
    let Some(owners) = files.get_mut(&file) else { return Vec::new() };
    let ended: Vec<u64> = owners.iter().copied().filter(|owner| ending(*owner)).collect();
    owners.retain(|owner| !ended.contains(owner));
    if owners.is_empty() {
        files.remove(&file);
    }
    ended
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flock(l_type: c_int, l_whence: c_int, l_start: i64, l_len: i64) -> libc::flock {
        // SAFETY: all-zero is a valid `struct flock`.
        let mut lock: libc::flock = unsafe { std::mem::zeroed() };
        (lock.l_type, lock.l_whence, lock.l_start, lock.l_len) = (l_type as libc::c_short, l_whence as libc::c_short, l_start, l_len);
        lock
    }

    #[test]
    fn commands_pick_owner_and_action() {
        let lock = flock(libc::F_WRLCK, libc::SEEK_SET, 0, 0);
        let decoded = |cmd| LockRequest::from_fcntl(cmd, &lock).map(|request| (request.owner, request.action));
        assert_eq!(decoded(libc::F_GETLK), Ok((LockOwner::Process, LockAction::Test)));
        assert_eq!(decoded(libc::F_SETLK), Ok((LockOwner::Process, LockAction::Set)));
        assert_eq!(decoded(libc::F_SETLKW), Ok((LockOwner::Process, LockAction::SetAndWait)));
        assert_eq!(decoded(libc::F_OFD_GETLK), Ok((LockOwner::Description, LockAction::Test)));
        assert_eq!(decoded(libc::F_OFD_SETLK), Ok((LockOwner::Description, LockAction::Set)));
        assert_eq!(decoded(libc::F_OFD_SETLKW), Ok((LockOwner::Description, LockAction::SetAndWait)));
        assert_eq!(decoded(libc::F_GETFL), Err(Errno::EINVAL));
    }

    #[test]
    fn ofd_commands_want_l_pid_zero_record_commands_ignore_it() {
        let lock = libc::flock { l_pid: 42, ..flock(libc::F_RDLCK, libc::SEEK_SET, 0, 0) };
        assert_eq!(LockRequest::from_fcntl(libc::F_OFD_SETLK, &lock), Err(Errno::EINVAL));
        assert!(LockRequest::from_fcntl(libc::F_SETLK, &lock).is_ok());
    }

    #[test]
    fn bad_type_whence_or_unlock_to_getlk_is_einval() {
        assert_eq!(LockRequest::from_fcntl(libc::F_SETLK, &flock(99, libc::SEEK_SET, 0, 0)), Err(Errno::EINVAL));
        assert_eq!(LockRequest::from_fcntl(libc::F_SETLK, &flock(libc::F_RDLCK, 7, 0, 0)), Err(Errno::EINVAL));
        assert_eq!(LockRequest::from_fcntl(libc::F_GETLK, &flock(libc::F_UNLCK, libc::SEEK_SET, 0, 0)), Err(Errno::EINVAL));
        assert!(LockRequest::from_fcntl(libc::F_SETLK, &flock(libc::F_UNLCK, libc::SEEK_SET, 0, 0)).is_ok());
    }

    #[test]
    fn ranges_count_from_the_origin() {
        let request =
            |whence, start, len| LockRequest::from_fcntl(libc::F_SETLK, &flock(libc::F_WRLCK, whence, start, len)).expect("valid");
        assert_eq!(request(libc::SEEK_SET, 10, 5).origin, Origin::Start);
        assert_eq!(request(libc::SEEK_CUR, 0, 0).origin, Origin::Position);
        let at_end = request(libc::SEEK_END, -4, 4);
        assert_eq!(at_end.origin, Origin::End);
        assert_eq!(at_end.range(100), Ok(LockRange { start: 96, end: 99 }));
        assert_eq!(request(libc::SEEK_CUR, 10, 0).range(5), Ok(LockRange { start: 15, end: u64::MAX }));
    }

    #[test]
    fn a_negative_length_locks_the_bytes_before_the_start() {
        let request = LockRequest::from_fcntl(libc::F_SETLK, &flock(libc::F_RDLCK, libc::SEEK_SET, 10, -4)).expect("valid");
        assert_eq!(request.range(0), Ok(LockRange { start: 6, end: 9 }));
        assert_eq!(request.range(-8), Err(Errno::EINVAL), "would begin before offset 0");
    }

    #[test]
    fn a_start_past_i64_max_is_eoverflow() {
        let request = LockRequest::from_fcntl(libc::F_SETLK, &flock(libc::F_RDLCK, libc::SEEK_END, i64::MAX, 1)).expect("valid");
        assert_eq!(request.range(1), Err(Errno::EOVERFLOW));
        assert_eq!(request.range(0), Ok(LockRange { start: i64::MAX as u64, end: i64::MAX as u64 }));
    }

    #[test]
    fn locks_need_the_matching_access() {
        let request = |l_type| LockRequest::from_fcntl(libc::F_SETLK, &flock(l_type, libc::SEEK_SET, 0, 0)).expect("valid");
        assert_eq!(request(libc::F_RDLCK).check_access(false, true), Err(Errno::EBADF));
        assert_eq!(request(libc::F_WRLCK).check_access(true, false), Err(Errno::EBADF));
        assert_eq!(request(libc::F_WRLCK).check_access(false, true), Ok(()));
        assert_eq!(request(libc::F_UNLCK).check_access(false, false), Ok(()));
    }

    #[test]
    fn flock_operations_decode() {
        assert_eq!(flock_operation(libc::LOCK_SH), Ok((LockKind::Read, true)));
        assert_eq!(flock_operation(libc::LOCK_EX | libc::LOCK_NB), Ok((LockKind::Write, false)));
        assert_eq!(flock_operation(libc::LOCK_UN), Ok((LockKind::Unlock, true)));
        assert_eq!(flock_operation(libc::LOCK_SH | libc::LOCK_EX), Err(Errno::EINVAL));
        assert_eq!(flock_operation(0), Err(Errno::EINVAL));
    }

    #[test]
    fn owners_of_descriptions_never_meet_the_process() {
        assert_eq!(LockOwner::Process.id(5), PROCESS_OWNER);
        assert_eq!(LockOwner::Description.id(0), description_owner(0));
        assert_ne!(description_owner(0), PROCESS_OWNER);
    }

    #[test]
    fn conflicts_fill_the_getlk_answer() {
        let mut lock = flock(libc::F_RDLCK, libc::SEEK_CUR, 3, 3);
        let conflict = LockConflict { kind: LockKind::Write, range: LockRange { start: 4, end: u64::MAX }, pid: 77 };
        report_conflict(&mut lock, Some(conflict), true);
        assert_eq!(
            (c_int::from(lock.l_type), c_int::from(lock.l_whence), lock.l_start, lock.l_len, lock.l_pid),
            (libc::F_WRLCK, libc::SEEK_SET, 4, 0, 77)
        );
        report_conflict(&mut lock, Some(conflict), false);
        assert_eq!(lock.l_pid, -1);
        report_conflict(&mut lock, None, true);
        assert_eq!(c_int::from(lock.l_type), libc::F_UNLCK);
    }

    #[test]
    fn remembered_owners_are_forgotten_once() {
        let file = FileId { anchor: 0xc61e, serial: 1 };
        remember_owner(file, PROCESS_OWNER);
        remember_owner(file, description_owner(3));
        remember_owner(file, description_owner(3));
        assert_eq!(forget_owners(file, |owner| owner == description_owner(3)), vec![description_owner(3)]);
        assert_eq!(forget_owners(file, |owner| owner == description_owner(3)), Vec::<u64>::new());
        assert_eq!(forget_owners(file, |_| true), vec![PROCESS_OWNER]);
        assert_eq!(forget_owners(file, |_| true), Vec::<u64>::new());
    }
}
