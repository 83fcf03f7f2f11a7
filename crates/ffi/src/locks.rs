//! `ringfs_fcntl_lock` and `ringfs_flock`: advisory locks with the owners and the release
//! rules of Linux, on top of [`Client::set_lock`].
//!
//! The owner of `fcntl` record locks is the process (one client per process): closing *any*
//! descriptor of a file ends the process's record locks on it, as POSIX says. OFD locks and
//! `flock` belong to the open file description, which for the C library is the descriptor
//! (there is no `dup`): closing it ends them. `flock` is kept as a whole-file lock in the
//! same space as record locks (as the Linux NFS client does), so a process that mixes
//! `flock` and `fcntl` locks on one file may see them conflict where a local file system
//! would not. The files this process took locks on are remembered
//! ([`ringfs_cglue::locks::remember_owner`]), so that a close sends nothing when there is
//! nothing to give back.

use std::ffi::c_int;
use std::io::SeekFrom;

use ringfs_cglue::call::guard;
use ringfs_cglue::locks::{self as c_locks, LockAction, LockOwner, LockRequest, Origin, PROCESS_OWNER, description_owner};
use ringfs_client::{Client, Errno, Fd, LockKind, LockRange};

use crate::{client, descriptor};

/// The number that tells a descriptor's open file description apart: the descriptor (the C
/// library has no `dup`).
fn description(fd: Fd) -> u64 {
    u64::from(fd.0)
}

/// Gives back what closing `fd` ends: the process's record locks on its file and the
/// descriptor's own locks.
pub(crate) fn release_at_close(client: &Client, fd: Fd) -> Result<(), Errno> {
    let Ok(file) = client.file_id(fd) else { return Ok(()) };
    let own = description_owner(description(fd));
    let ending = c_locks::forget_owners(file, |owner| owner == PROCESS_OWNER || owner == own);
    ending.into_iter().try_for_each(|owner| client.release_locks(fd, owner))
}

/// `fcntl(fd, cmd, lock)` for the lock commands: `F_GETLK`, `F_SETLK`, `F_SETLKW` (owner:
/// the process) and `F_OFD_GETLK`, `F_OFD_SETLK`, `F_OFD_SETLKW` (owner: the descriptor;
/// `l_pid` must be 0). `l_whence` may be `SEEK_SET`, `SEEK_CUR` or `SEEK_END`. A lock in
/// the way: EAGAIN for the `SETLK` commands, a wait for the `SETLKW` ones; the `GETLK` ones
/// fill `lock` with it (`l_type` `F_UNLCK` if none).
///
/// # Safety
/// `lock` must point to a valid, writable `struct flock`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_fcntl_lock(fd: c_int, cmd: c_int, lock: *mut libc::flock) -> c_int {
    guard(-1, || {
        if lock.is_null() {
            return Err(Errno::EFAULT);
        }
        // SAFETY: non-null, and valid by the caller's contract.
        let lock = unsafe { &mut *lock };
        let client = client()?;
        let fd = descriptor(fd)?;
        let request = LockRequest::from_fcntl(cmd, lock)?;
        let origin_offset = match request.origin {
            Origin::Start => 0,
            Origin::Position => client.seek(fd, SeekFrom::Current(0))? as i64,
            Origin::End => client.fstat(fd)?.size as i64,
        };
        let range = request.range(origin_offset)?;
        let owner = request.owner.id(description(fd));
        if request.action == LockAction::Test {
            c_locks::report_conflict(lock, client.test_lock(fd, owner, request.kind, range)?, request.owner == LockOwner::Process);
            return Ok(0);
        }
        let (readable, writable) = client.access_mode(fd)?;
        request.check_access(readable, writable)?;
        client.set_lock(fd, owner, request.kind, range, request.action == LockAction::SetAndWait)?;
        if request.kind != LockKind::Unlock {
            c_locks::remember_owner(client.file_id(fd)?, owner);
        }
        Ok(0)
    })
}

/// `flock(fd, operation)`: `LOCK_SH`, `LOCK_EX` or `LOCK_UN`, with `LOCK_NB` not to wait
/// (EWOULDBLOCK). A whole-file lock of the descriptor (see the module doc).
#[unsafe(no_mangle)]
pub extern "C" fn ringfs_flock(fd: c_int, operation: c_int) -> c_int {
    guard(-1, || {
        let client = client()?;
        let fd = descriptor(fd)?;
        let (kind, wait) = c_locks::flock_operation(operation)?;
        let owner = description_owner(description(fd));
        client.set_lock(fd, owner, kind, LockRange::WHOLE, wait)?;
        if kind != LockKind::Unlock {
            c_locks::remember_owner(client.file_id(fd)?, owner);
        }
        Ok(0)
    })
}
