//! `ringfs_fcntl_lock` and `ringfs_flock`: advisory locks with the owners and the release
//! rules of Linux, on top of [`Client::set_lock`].
//!
//! The owner of `fcntl` record locks is the process (one client per process): closing *any*
//! descriptor of a file ends the process's record locks on it, as POSIX says. OFD locks and
//! `flock` belong to the open file description, which for the C library is the descriptor
//! (there is no `dup`): closing it ends them. `flock` is kept as a whole-file lock in the
//! same space as record locks (as the Linux NFS client does), so a process that mixes
//! `flock` and `fcntl` locks on one file may see them conflict where a local file system
//! would not. The files this process took locks on are remembered here, so that a close
//! sends nothing when there is nothing to give back.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_int;
use std::io::SeekFrom;

use ringfs_client::{Client, Errno, Fd, FileId, LockKind, LockRange};

use crate::{client, descriptor, guard};

/// The owner of the process's record locks.
const PROCESS_OWNER: u64 = 0;

/// The owner of the OFD locks and `flock` of a descriptor.
fn description_owner(fd: Fd) -> u64 {
    (1 << 63) | u64::from(fd.0)
}

/// The owners that took locks, by file.
static LOCKING: Mutex<Option<HashMap<FileId, Vec<u64>>>> = Mutex::new(None);

fn remember(file: FileId, owner: u64) {
    let mut locking = LOCKING.lock();
    let owners = locking.get_or_insert_with(HashMap::new).entry(file).or_default();
    if !owners.contains(&owner) {
        owners.push(owner);
    }
}

/// Gives back what closing `fd` ends: the process's record locks on its file and the
/// descriptor's own locks.
pub(crate) fn release_at_close(client: &Client, fd: Fd) -> Result<(), Errno> {
    let Ok(file) = client.file_id(fd) else { return Ok(()) };
    let ending: Vec<u64> = {
        let mut locking = LOCKING.lock();
        let Some(owners) = locking.as_mut().and_then(|files| files.get_mut(&file)) else { return Ok(()) };
        let ending: Vec<u64> = owners.iter().copied().filter(|owner| *owner == PROCESS_OWNER || *owner == description_owner(fd)).collect();
        owners.retain(|owner| !ending.contains(owner));
        if owners.is_empty() {
            locking.as_mut().map(|files| files.remove(&file));
        }
        ending
    };
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
        let (owner, test, wait) = match cmd {
            libc::F_GETLK => (PROCESS_OWNER, true, false),
            libc::F_SETLK => (PROCESS_OWNER, false, false),
            libc::F_SETLKW => (PROCESS_OWNER, false, true),
            libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW if lock.l_pid != 0 => return Err(Errno::EINVAL),
            libc::F_OFD_GETLK => (description_owner(fd), true, false),
            libc::F_OFD_SETLK => (description_owner(fd), false, false),
            libc::F_OFD_SETLKW => (description_owner(fd), false, true),
            _ => return Err(Errno::EINVAL),
        };
        let kind = ringfs_client::lock_kind_of(c_int::from(lock.l_type))?;
        let base = match c_int::from(lock.l_whence) {
            libc::SEEK_SET => 0,
            libc::SEEK_CUR => client.seek(fd, SeekFrom::Current(0))? as i64,
            libc::SEEK_END => client.fstat(fd)?.size as i64,
            _ => return Err(Errno::EINVAL),
        };
        let range = LockRange::from_flock(base.checked_add(lock.l_start).ok_or(Errno::EOVERFLOW)?, lock.l_len)?;
        if test {
            if kind == LockKind::Unlock {
                return Err(Errno::EINVAL);
            }
            ringfs_client::report_conflict(lock, client.test_lock(fd, owner, kind, range)?, owner == PROCESS_OWNER);
            return Ok(0);
        }
        let (readable, writable) = client.access_mode(fd)?;
        if (kind == LockKind::Read && !readable) || (kind == LockKind::Write && !writable) {
            return Err(Errno::EBADF);
        }
        client.set_lock(fd, owner, kind, range, wait)?;
        if kind != LockKind::Unlock {
            remember(client.file_id(fd)?, owner);
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
        let kind = match operation & !libc::LOCK_NB {
            libc::LOCK_SH => LockKind::Read,
            libc::LOCK_EX => LockKind::Write,
            libc::LOCK_UN => LockKind::Unlock,
            _ => return Err(Errno::EINVAL),
        };
        let owner = description_owner(fd);
        client.set_lock(fd, owner, kind, LockRange::WHOLE, operation & libc::LOCK_NB == 0)?;
        if kind != LockKind::Unlock {
            remember(client.file_id(fd)?, owner);
        }
        Ok(0)
    })
}
