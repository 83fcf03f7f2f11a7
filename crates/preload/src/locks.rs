//! Advisory locks on ringfs descriptors (`fcntl` record and OFD locks, `flock`), kept by the
//! servers ([`Client::set_lock`]) so that they hold among all processes of the job.
//!
//! Owners as Linux has them: record locks belong to the process (closing any descriptor of
//! the file ends them), OFD locks and `flock` to the open file description (its last close
//! ends them). The files this process locked are remembered, so a close sends nothing when
//! there is nothing to give back.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::Mutex;

use ringfs_client::{Client, Errno, Fd, FileId, LockKind, LockRange};

use crate::descriptors::{self, OpenDescription};
use crate::real::real;

/// The owner of the process's record locks.
const PROCESS_OWNER: u64 = 0;

/// The owner of an open file description's OFD locks and `flock`.
fn description_owner(description: &OpenDescription) -> u64 {
    (1 << 63) | (description as *const OpenDescription as u64)
}

/// The owners that took locks, by file.
static LOCKING: Mutex<Option<HashMap<FileId, Vec<u64>>>> = Mutex::new(None);

fn remember(file: FileId, owner: u64) {
    let mut locking = LOCKING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let owners = locking.get_or_insert_with(HashMap::new).entry(file).or_default();
    if !owners.contains(&owner) {
        owners.push(owner);
    }
}

/// Takes out of the remembered owners of `file` those `ending` selects.
fn forget(file: FileId, ending: impl Fn(u64) -> bool) -> Vec<u64> {
    let mut locking = LOCKING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some(files) = locking.as_mut() else { return Vec::new() };
    let Some(owners) = files.get_mut(&file) else { return Vec::new() };
    let ended: Vec<u64> = owners.iter().copied().filter(|owner| ending(*owner)).collect();
    owners.retain(|owner| !ended.contains(owner));
    if owners.is_empty() {
        files.remove(&file);
    }
    ended
}

/// A descriptor of `description` is being closed: the process's record locks on its file end.
pub(crate) fn release_process_locks(description: &OpenDescription) {
    let owners = forget(description.file, |owner| owner == PROCESS_OWNER);
    if owners.is_empty() {
        return;
    }
    let Ok(client) = crate::state::client() else { return };
    for owner in owners {
        if let Ok(fd) = description.handle(&client) {
            let _ = client.release_locks(fd, owner);
        }
    }
}

/// The last descriptor of `description` (client descriptor `fd` of `file`) went: its own
/// locks end.
pub(crate) fn release_at_close(client: &Client, file: FileId, fd: Fd, description: &OpenDescription) {
    let own = description_owner(description);
    for owner in forget(file, |owner| owner == own) {
        let _ = client.release_locks(fd, owner);
    }
}

/// `fcntl(fd, cmd, lock)` for the lock commands on a ringfs descriptor.
pub(crate) fn fcntl_lock(
    client: &Client,
    description: &OpenDescription,
    descriptor: c_int,
    cmd: c_int,
    lock: *mut libc::flock,
) -> Result<c_int, Errno> {
    if lock.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: non-null; the caller passes a `struct flock`.
    let lock = unsafe { &mut *lock };
    let fd = description.handle(client)?;
    let (owner, test, wait) = match cmd {
        libc::F_GETLK => (PROCESS_OWNER, true, false),
        libc::F_SETLK => (PROCESS_OWNER, false, false),
        libc::F_SETLKW => (PROCESS_OWNER, false, true),
        _ if lock.l_pid != 0 => return Err(Errno::EINVAL),
        libc::F_OFD_GETLK => (description_owner(description), true, false),
        libc::F_OFD_SETLK => (description_owner(description), false, false),
        libc::F_OFD_SETLKW => (description_owner(description), false, true),
        _ => return Err(Errno::EINVAL),
    };
    let kind = ringfs_client::lock_kind_of(c_int::from(lock.l_type))?;
    let base = match c_int::from(lock.l_whence) {
        libc::SEEK_SET => 0,
        libc::SEEK_CUR => {
            let held = description.position.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            description.position_at(&held, descriptor)? as i64
        }
        libc::SEEK_END => description.stat(client)?.size as i64,
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
    if (kind == LockKind::Read && !description.readable()) || (kind == LockKind::Write && !description.writable()) {
        return Err(Errno::EBADF);
    }
    client.set_lock(fd, owner, kind, range, wait)?;
    if kind != LockKind::Unlock {
        remember(description.file, owner);
    }
    Ok(0)
}

/// `flock(fd, operation)`: a whole-file lock of the open file description.
#[unsafe(no_mangle)]
pub extern "C" fn flock(fd: c_int, operation: c_int) -> c_int {
    let Some(description) = descriptors::lookup(fd) else {
        return real!("flock", fn(c_int, c_int) -> c_int; fd, operation);
    };
    crate::ringfs_call(-1, || {
        let client = crate::state::client()?;
        let kind = match operation & !libc::LOCK_NB {
            libc::LOCK_SH => LockKind::Read,
            libc::LOCK_EX => LockKind::Write,
            libc::LOCK_UN => LockKind::Unlock,
            _ => return Err(Errno::EINVAL),
        };
        let owner = description_owner(&description);
        client.set_lock(description.handle(&client)?, owner, kind, LockRange::WHOLE, operation & libc::LOCK_NB == 0)?;
        if kind != LockKind::Unlock {
            remember(description.file, owner);
        }
        Ok(0)
    })
}
