//! The `stat` family (with glibc's older `__xstat` entry points and `statx`) and `access`.

use std::ffi::{c_char, c_int};

use ringfs_client::{Client, Errno, Stat};

use ringfs_cglue::stat::{store_stat, store_statx};

use super::{by_descriptor, by_path};
use crate::descriptors::{self};
use crate::real::real;

fn stat_path(client: &Client, path: &str, follow: bool) -> Result<Stat, Errno> {
    if follow { client.stat(path) } else { client.lstat(path) }
}

/// # Safety
/// `path` must be a NUL-terminated string, `buf` a `struct stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stat(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        by_path(
            libc::AT_FDCWD,
            path,
            |client, path| store_stat(&client.stat(path)?, buf),
            |_, path| real!("stat", fn(*const c_char, *mut libc::stat) -> c_int; path, buf),
        )
    }
}

/// # Safety
/// As for `stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stat64(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { stat(path, buf) }
}

/// # Safety
/// As for `stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lstat(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        by_path(
            libc::AT_FDCWD,
            path,
            |client, path| store_stat(&client.lstat(path)?, buf),
            |_, path| real!("lstat", fn(*const c_char, *mut libc::stat) -> c_int; path, buf),
        )
    }
}

/// # Safety
/// As for `stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lstat64(path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { lstat(path, buf) }
}

/// # Safety
/// `buf` must be a `struct stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstat(fd: c_int, buf: *mut libc::stat) -> c_int {
    by_descriptor(
        fd,
        // SAFETY: `buf` is the caller's `struct stat`.
        |client, description| unsafe { store_stat(&description.stat(client)?, buf) },
        || real!("fstat", fn(c_int, *mut libc::stat) -> c_int; fd, buf),
    )
}

/// # Safety
/// As for `fstat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstat64(fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fstat(fd, buf) }
}

/// # Safety
/// `path` must be a NUL-terminated string, `buf` a `struct stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatat(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
    // SAFETY: `path` is NUL-terminated when non-null.
    if flags & libc::AT_EMPTY_PATH != 0 && !path.is_null() && unsafe { *path } == 0 && descriptors::lookup(dirfd).is_some() {
        // SAFETY: forwarded contract.
        return unsafe { fstat(dirfd, buf) };
    }
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    // SAFETY: forwarded contract.
    unsafe {
        by_path(
            dirfd,
            path,
            |client, path| store_stat(&stat_path(client, path, follow)?, buf),
            |dirfd, path| real!("fstatat64", fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int; dirfd, path, buf, flags),
        )
    }
}

/// # Safety
/// As for `fstatat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatat64(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fstatat(dirfd, path, buf, flags) }
}

// glibc before 2.33 compiled `stat` calls into these (the version argument is 1, the
// `struct stat` of the 64-bit targets); programs built then still call them.

/// # Safety
/// As for `stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __xstat(_version: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { stat(path, buf) }
}

/// # Safety
/// As for `stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __xstat64(_version: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { stat(path, buf) }
}

/// # Safety
/// As for `stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __lxstat(_version: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { lstat(path, buf) }
}

/// # Safety
/// As for `stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __lxstat64(_version: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { lstat(path, buf) }
}

/// # Safety
/// As for `fstat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstat(_version: c_int, fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fstat(fd, buf) }
}

/// # Safety
/// As for `fstat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstat64(_version: c_int, fd: c_int, buf: *mut libc::stat) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fstat(fd, buf) }
}

/// # Safety
/// As for `fstatat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstatat(_version: c_int, dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fstatat(dirfd, path, buf, flags) }
}

/// # Safety
/// As for `fstatat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstatat64(_version: c_int, dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fstatat(dirfd, path, buf, flags) }
}

/// # Safety
/// `path` must be a NUL-terminated string, `buf` a `struct statx`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: libc::c_uint, buf: *mut libc::statx) -> c_int {
    // SAFETY: `path` is NUL-terminated when non-null.
    if flags & libc::AT_EMPTY_PATH != 0 && !path.is_null() && unsafe { *path } == 0 {
        return by_descriptor(
            dirfd,
            // SAFETY: `buf` is the caller's `struct statx`.
            |client, description| unsafe { store_statx(&description.stat(client)?, buf) },
            || real!("statx", fn(c_int, *const c_char, c_int, libc::c_uint, *mut libc::statx) -> c_int; dirfd, path, flags, mask, buf),
        );
    }
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    // SAFETY: forwarded contract.
    unsafe {
        by_path(
            dirfd,
            path,
            |client, path| store_statx(&stat_path(client, path, follow)?, buf),
            |dirfd, path| real!("statx", fn(c_int, *const c_char, c_int, libc::c_uint, *mut libc::statx) -> c_int; dirfd, path, flags, mask, buf),
        )
    }
}

// ---- access ----

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { faccessat(libc::AT_FDCWD, path, mode, 0) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        by_path(
            dirfd,
            path,
            |client, path| client.access(path, mode as u32).map(|()| 0),
            |dirfd, path| real!("faccessat", fn(c_int, *const c_char, c_int, c_int) -> c_int; dirfd, path, mode, flags),
        )
    }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn euidaccess(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { faccessat(libc::AT_FDCWD, path, mode, libc::AT_EACCESS) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn eaccess(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { faccessat(libc::AT_FDCWD, path, mode, libc::AT_EACCESS) }
}
