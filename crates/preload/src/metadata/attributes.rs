//! Attributes: `chmod`, `chown`, the `utime` family and `truncate`.

use std::ffi::{c_char, c_int};

use ringfs_client::{Client, Errno};
use ringfs_proto::SetAttr;

use ringfs_cglue::times::{self, TimeChange};

use super::{by_descriptor, by_path};
use crate::descriptors::{self, OpenDescription};
use crate::paths::{Route, route_at};
use crate::real::real;
use crate::state::remember_umask;

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: libc::mode_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fchmodat(libc::AT_FDCWD, path, mode, 0) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchmodat(dirfd: c_int, path: *const c_char, mode: libc::mode_t, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        by_path(
            dirfd,
            path,
            |client, path| change_mode(client, path, mode, flags),
            |dirfd, path| real!("fchmodat", fn(c_int, *const c_char, libc::mode_t, c_int) -> c_int; dirfd, path, mode, flags),
        )
    }
}

/// `chmod`; with `AT_SYMLINK_NOFOLLOW` a symbolic link's mode cannot change (EOPNOTSUPP, as
/// on Linux).
fn change_mode(client: &Client, path: &str, mode: libc::mode_t, flags: c_int) -> Result<c_int, Errno> {
    if flags & libc::AT_SYMLINK_NOFOLLOW != 0 {
        let stat = client.lstat(path)?;
        if stat.mode & libc::S_IFMT == libc::S_IFLNK {
            return Err(Errno::EOPNOTSUPP);
        }
        return client.set_attr_id(stat.file, |change| change.mode = Some(mode & 0o7777)).map(|()| 0);
    }
    client.chmod(path, mode).map(|()| 0)
}

/// Changes attributes of the file `path` names, or of the link itself when `follow` is false.
fn change_attributes(client: &Client, path: &str, follow: bool, change: impl FnOnce(&mut SetAttr)) -> Result<c_int, Errno> {
    let file = if follow { client.stat(path) } else { client.lstat(path) }?.file;
    client.set_attr_id(file, change).map(|()| 0)
}

#[unsafe(no_mangle)]
pub extern "C" fn fchmod(fd: c_int, mode: libc::mode_t) -> c_int {
    by_descriptor(
        fd,
        |client, description| client.set_attr_id(description.file, |change| change.mode = Some(mode & 0o7777)).map(|()| 0),
        || real!("fchmod", fn(c_int, libc::mode_t) -> c_int; fd, mode),
    )
}

/// `(uid_t)-1` leaves one unchanged.
fn owner_change(uid: libc::uid_t, gid: libc::gid_t) -> (Option<u32>, Option<u32>) {
    ((uid != u32::MAX).then_some(uid), (gid != u32::MAX).then_some(gid))
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn chown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fchownat(libc::AT_FDCWD, path, uid, gid, 0) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lchown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fchownat(libc::AT_FDCWD, path, uid, gid, libc::AT_SYMLINK_NOFOLLOW) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchownat(dirfd: c_int, path: *const c_char, uid: libc::uid_t, gid: libc::gid_t, flags: c_int) -> c_int {
    let (new_uid, new_gid) = owner_change(uid, gid);
    // SAFETY: forwarded contract.
    unsafe {
        by_path(
            dirfd,
            path,
            |client, path| {
                change_attributes(client, path, flags & libc::AT_SYMLINK_NOFOLLOW == 0, |request| {
                    request.uid = new_uid;
                    request.gid = new_gid;
                })
            },
            |dirfd, path| real!("fchownat", fn(c_int, *const c_char, libc::uid_t, libc::gid_t, c_int) -> c_int; dirfd, path, uid, gid, flags),
        )
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    let (new_uid, new_gid) = owner_change(uid, gid);
    let change = |request: &mut SetAttr| {
        request.uid = new_uid;
        request.gid = new_gid;
    };
    by_descriptor(
        fd,
        |client, description| client.set_attr_id(description.file, change).map(|()| 0),
        || real!("fchown", fn(c_int, libc::uid_t, libc::gid_t) -> c_int; fd, uid, gid),
    )
}

/// Sets the times `change` asks for in a `SetAttr` request.
fn set_times(request: &mut SetAttr, change: TimeChange) {
    request.atime_ns = change.atime_ns;
    request.mtime_ns = change.mtime_ns;
    request.times_explicit = change.explicit;
}

fn set_times_of(client: &Client, description: &OpenDescription, times: *const libc::timespec) -> Result<c_int, Errno> {
    // SAFETY: the caller's times.
    let change = unsafe { times::from_c(times) }?;
    client.set_attr_id(description.file, |request| set_times(request, change)).map(|()| 0)
}

/// `utimensat`; with a NULL path (glibc's `futimens`), the descriptor's file.
///
/// # Safety
/// `path` must be NULL or NUL-terminated, `times` NULL or two timespecs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn utimensat(dirfd: c_int, path: *const c_char, times: *const libc::timespec, flags: c_int) -> c_int {
    let kernel =
        |dirfd, path| real!("utimensat", fn(c_int, *const c_char, *const libc::timespec, c_int) -> c_int; dirfd, path, times, flags);
    // SAFETY: `path` is NUL-terminated when non-null.
    if path.is_null() || (flags & libc::AT_EMPTY_PATH != 0 && unsafe { *path } == 0) {
        return by_descriptor(dirfd, |client, description| set_times_of(client, description, times), || kernel(dirfd, path));
    }
    let ringfs = |client: &Client, path: &str| {
        // SAFETY: the caller's times.
        let change = unsafe { times::from_c(times) }?;
        change_attributes(client, path, flags & libc::AT_SYMLINK_NOFOLLOW == 0, |request| set_times(request, change))
    };
    // SAFETY: forwarded contract.
    unsafe { by_path(dirfd, path, ringfs, kernel) }
}

/// # Safety
/// `times` must be NULL or two timespecs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn futimens(fd: c_int, times: *const libc::timespec) -> c_int {
    by_descriptor(
        fd,
        |client, description| set_times_of(client, description, times),
        || real!("futimens", fn(c_int, *const libc::timespec) -> c_int; fd, times),
    )
}

/// Two timevals as two timespecs (NULL stays NULL).
///
/// # Safety
/// `times` must be NULL or two timevals.
unsafe fn timespecs(times: *const libc::timeval) -> Option<[libc::timespec; 2]> {
    if times.is_null() {
        return None;
    }
    // SAFETY: the caller passes two timevals.
    let times = unsafe { std::slice::from_raw_parts(times, 2) };
    let convert = |time: &libc::timeval| libc::timespec { tv_sec: time.tv_sec, tv_nsec: time.tv_usec * 1000 };
    Some([convert(&times[0]), convert(&times[1])])
}

/// # Safety
/// `path` must be a NUL-terminated string, `times` NULL or two timevals.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn utimes(path: *const c_char, times: *const libc::timeval) -> c_int {
    // SAFETY: forwarded contract.
    match unsafe { route_at(libc::AT_FDCWD, path) } {
        Route::Kernel => real!("utimes", fn(*const c_char, *const libc::timeval) -> c_int; path, times),
        _ => {
            // SAFETY: forwarded contract.
            let converted = unsafe { timespecs(times) };
            // SAFETY: forwarded contract.
            unsafe { utimensat(libc::AT_FDCWD, path, converted.as_ref().map_or(std::ptr::null(), |times| times.as_ptr()), 0) }
        }
    }
}

/// # Safety
/// `path` must be a NUL-terminated string, `times` NULL or a `struct utimbuf`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn utime(path: *const c_char, times: *const libc::utimbuf) -> c_int {
    // SAFETY: forwarded contract.
    match unsafe { route_at(libc::AT_FDCWD, path) } {
        Route::Kernel => real!("utime", fn(*const c_char, *const libc::utimbuf) -> c_int; path, times),
        _ => {
            // SAFETY: the caller's utimbuf.
            let converted = (!times.is_null()).then(|| unsafe {
                [libc::timespec { tv_sec: (*times).actime, tv_nsec: 0 }, libc::timespec { tv_sec: (*times).modtime, tv_nsec: 0 }]
            });
            // SAFETY: forwarded contract.
            unsafe { utimensat(libc::AT_FDCWD, path, converted.as_ref().map_or(std::ptr::null(), |times| times.as_ptr()), 0) }
        }
    }
}

/// # Safety
/// `times` must be NULL or two timevals.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn futimes(fd: c_int, times: *const libc::timeval) -> c_int {
    if descriptors::lookup(fd).is_none() {
        return real!("futimes", fn(c_int, *const libc::timeval) -> c_int; fd, times);
    }
    // SAFETY: forwarded contract.
    let converted = unsafe { timespecs(times) };
    // SAFETY: NULL or two timespecs.
    unsafe { futimens(fd, converted.as_ref().map_or(std::ptr::null(), |times| times.as_ptr())) }
}

/// # Safety
/// `path` must be a NUL-terminated string, `times` NULL or two timevals.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lutimes(path: *const c_char, times: *const libc::timeval) -> c_int {
    // SAFETY: forwarded contract.
    match unsafe { route_at(libc::AT_FDCWD, path) } {
        Route::Kernel => real!("lutimes", fn(*const c_char, *const libc::timeval) -> c_int; path, times),
        _ => {
            // SAFETY: forwarded contract.
            let converted = unsafe { timespecs(times) };
            // SAFETY: forwarded contract.
            unsafe {
                utimensat(
                    libc::AT_FDCWD,
                    path,
                    converted.as_ref().map_or(std::ptr::null(), |times| times.as_ptr()),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            }
        }
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn umask(mask: libc::mode_t) -> libc::mode_t {
    let previous = real!("umask", fn(libc::mode_t) -> libc::mode_t; mask);
    remember_umask(mask);
    previous
}
