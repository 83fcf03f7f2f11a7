//! Advisory locks on ringfs descriptors (`fcntl` record and OFD locks, `flock`), kept by the
//! servers ([`Client::set_lock`]) so that they hold among all processes of the job.
//!
//! Owners as Linux has them: record locks belong to the process (closing any descriptor of
//! the file ends them), OFD locks and `flock` to the open file description (its last close
//! ends them; `descriptors.rs` gives those back). The files this process locked are
//! remembered ([`ringfs_cglue::locks::remember_owner`]), so a close sends nothing when there
//! is nothing to give back.

use std::ffi::c_int;

use ringfs_cglue::call::guard;
use ringfs_cglue::locks::{self as c_locks, LockAction, LockOwner, LockRequest, Origin, PROCESS_OWNER, description_owner};
use ringfs_client::{Client, Errno, LockKind, LockRange};

use crate::descriptors::{self, OpenDescription};
use crate::real::real;

/// A descriptor of `description` is being closed: the process's record locks on its file end.
pub(crate) fn release_process_locks(description: &OpenDescription) {
    let owners = c_locks::forget_owners(description.file, |owner| owner == PROCESS_OWNER);
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
    let request = LockRequest::from_fcntl(cmd, lock)?;
    let origin_offset = match request.origin {
        Origin::Start => 0,
        Origin::Position => {
            let held = description.position.lock();
            description.position_at(&held, descriptor)? as i64
        }
        Origin::End => description.stat(client)?.size as i64,
    };
    let range = request.range(origin_offset)?;
    let owner = request.owner.id(description.identity());
    if request.action == LockAction::Test {
        c_locks::report_conflict(lock, client.test_lock(fd, owner, request.kind, range)?, request.owner == LockOwner::Process);
        return Ok(0);
    }
    request.check_access(description.readable(), description.writable())?;
    client.set_lock(fd, owner, request.kind, range, request.action == LockAction::SetAndWait)?;
    if request.kind != LockKind::Unlock {
        c_locks::remember_owner(description.file, owner);
    }
    Ok(0)
}

/// `flock(fd, operation)`: a whole-file lock of the open file description.
#[unsafe(no_mangle)]
pub extern "C" fn flock(fd: c_int, operation: c_int) -> c_int {
    let Some(description) = descriptors::lookup(fd) else {
        return real!("flock", fn(c_int, c_int) -> c_int; fd, operation);
    };
    guard(-1, || {
        let client = crate::state::client()?;
        let (kind, wait) = c_locks::flock_operation(operation)?;
        let owner = description_owner(description.identity());
        client.set_lock(description.handle(&client)?, owner, kind, LockRange::WHOLE, wait)?;
        if kind != LockKind::Unlock {
            c_locks::remember_owner(description.file, owner);
        }
        Ok(0)
    })
}
