//! Names: `unlink`, `mkdir`, `rmdir`, `rename`, `link`, `symlink`, `readlink`.

use std::ffi::{c_char, c_int};

use ringfs_client::{Client, Errno};

use ringfs_cglue::arguments::{c_str, offset};
use ringfs_cglue::call::{failed, guard};

use super::by_path;
use crate::paths::{Route, route_at};
use crate::real::real;
use crate::state::{client, masked};

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { unlinkat(libc::AT_FDCWD, path, 0) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    let remove =
        |client: &Client, path: &str| if flags & libc::AT_REMOVEDIR != 0 { client.rmdir(path) } else { client.unlink(path) }.map(|()| 0);
    // SAFETY: forwarded contract.
    unsafe { by_path(dirfd, path, remove, |dirfd, path| real!("unlinkat", fn(c_int, *const c_char, c_int) -> c_int; dirfd, path, flags)) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { unlinkat(libc::AT_FDCWD, path, libc::AT_REMOVEDIR) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: libc::mode_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { mkdirat(libc::AT_FDCWD, path, mode) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: libc::mode_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        by_path(
            dirfd,
            path,
            |client, path| client.mkdir(path, masked(mode)).map(|()| 0),
            |dirfd, path| real!("mkdirat", fn(c_int, *const c_char, libc::mode_t) -> c_int; dirfd, path, mode),
        )
    }
}

/// Where the two paths of a rename or link lead: both ringfs paths, or both the kernel's
/// (rewritten where needed); one of each is EXDEV.
///
/// # Safety
/// Both paths must be NULL or NUL-terminated.
unsafe fn two_paths(
    from_dirfd: c_int,
    from: *const c_char,
    to_dirfd: c_int,
    to: *const c_char,
    ringfs: impl FnOnce(&Client, &str, &str) -> Result<c_int, Errno>,
    kernel: impl FnOnce(c_int, *const c_char, c_int, *const c_char) -> c_int,
) -> c_int {
    // SAFETY: forwarded contract.
    let (from_route, to_route) = unsafe { (route_at(from_dirfd, from), route_at(to_dirfd, to)) };
    let kernel_side = |route: &Route, dirfd: c_int, path: *const c_char| match route {
        Route::Kernel => Some((dirfd, path)),
        Route::KernelPath(path) => Some((libc::AT_FDCWD, path.as_ptr())),
        _ => None,
    };
    match (&from_route, &to_route) {
        (Route::Error(errno), _) | (_, Route::Error(errno)) => failed(*errno),
        (Route::Ringfs(from), Route::Ringfs(to)) => guard(-1, || ringfs(&client()?, from, to)),
        (Route::Ringfs(_), _) | (_, Route::Ringfs(_)) => failed(Errno::EXDEV),
        _ => match (kernel_side(&from_route, from_dirfd, from), kernel_side(&to_route, to_dirfd, to)) {
            (Some((from_dirfd, from)), Some((to_dirfd, to))) => kernel(from_dirfd, from, to_dirfd, to),
            _ => failed(Errno::EINVAL),
        },
    }
}

/// # Safety
/// Both paths must be NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rename(from: *const c_char, to: *const c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { renameat2(libc::AT_FDCWD, from, libc::AT_FDCWD, to, 0) }
}

/// # Safety
/// Both paths must be NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn renameat(from_dirfd: c_int, from: *const c_char, to_dirfd: c_int, to: *const c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { renameat2(from_dirfd, from, to_dirfd, to, 0) }
}

/// # Safety
/// Both paths must be NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn renameat2(
    from_dirfd: c_int,
    from: *const c_char,
    to_dirfd: c_int,
    to: *const c_char,
    flags: libc::c_uint,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        two_paths(
            from_dirfd,
            from,
            to_dirfd,
            to,
            |client, from, to| client.rename_with_flags(from, to, flags).map(|()| 0),
            |from_dirfd, from, to_dirfd, to| {
                if flags == 0 {
                    real!("renameat", fn(c_int, *const c_char, c_int, *const c_char) -> c_int; from_dirfd, from, to_dirfd, to)
                } else {
                    real!("renameat2", fn(c_int, *const c_char, c_int, *const c_char, libc::c_uint) -> c_int; from_dirfd, from, to_dirfd, to, flags)
                }
            },
        )
    }
}

/// # Safety
/// Both paths must be NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn link(from: *const c_char, to: *const c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { linkat(libc::AT_FDCWD, from, libc::AT_FDCWD, to, 0) }
}

/// # Safety
/// Both paths must be NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn linkat(from_dirfd: c_int, from: *const c_char, to_dirfd: c_int, to: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        two_paths(
            from_dirfd,
            from,
            to_dirfd,
            to,
            |client, from, to| client.link(from, to).map(|()| 0),
            |from_dirfd, from, to_dirfd, to| real!("linkat", fn(c_int, *const c_char, c_int, *const c_char, c_int) -> c_int; from_dirfd, from, to_dirfd, to, flags),
        )
    }
}

/// # Safety
/// Both arguments must be NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symlink(target: *const c_char, link_path: *const c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { symlinkat(target, libc::AT_FDCWD, link_path) }
}

/// The link's target is stored as written; ringfs resolves it inside ringfs.
///
/// # Safety
/// Both arguments must be NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symlinkat(target: *const c_char, dirfd: c_int, link_path: *const c_char) -> c_int {
    // SAFETY: the caller's string.
    let ringfs = |client: &Client, path: &str| client.symlink(unsafe { c_str(target) }?, path).map(|()| 0);
    let kernel = |dirfd, path| real!("symlinkat", fn(*const c_char, c_int, *const c_char) -> c_int; target, dirfd, path);
    // SAFETY: forwarded contract.
    unsafe { by_path(dirfd, link_path, ringfs, kernel) }
}

/// # Safety
/// `path` must be a NUL-terminated string, `buffer` `size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readlink(path: *const c_char, buffer: *mut c_char, size: usize) -> isize {
    // SAFETY: forwarded contract.
    unsafe { readlinkat(libc::AT_FDCWD, path, buffer, size) }
}

/// # Safety
/// `path` must be a NUL-terminated string, `buffer` `size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readlinkat(dirfd: c_int, path: *const c_char, buffer: *mut c_char, size: usize) -> isize {
    let ringfs = |client: &Client, path: &str| {
        let target = client.readlink(path)?;
        let count = target.len().min(size);
        if count > 0 && buffer.is_null() {
            return Err(Errno::EFAULT);
        }
        // SAFETY: the caller's buffer holds `size` bytes.
        unsafe { std::ptr::copy_nonoverlapping(target.as_ptr(), buffer.cast(), count) };
        Ok(count as isize)
    };
    // SAFETY: forwarded contract.
    unsafe {
        by_path(
            dirfd,
            path,
            ringfs,
            |dirfd, path| real!("readlinkat", fn(c_int, *const c_char, *mut c_char, usize) -> isize; dirfd, path, buffer, size),
        )
    }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn truncate(path: *const c_char, length: libc::off_t) -> c_int {
    let ringfs = |client: &Client, path: &str| client.truncate(path, offset(length)?).map(|()| 0);
    // SAFETY: forwarded contract.
    unsafe { by_path(libc::AT_FDCWD, path, ringfs, |_, path| real!("truncate64", fn(*const c_char, libc::off_t) -> c_int; path, length)) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn truncate64(path: *const c_char, length: libc::off_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { truncate(path, length) }
}
