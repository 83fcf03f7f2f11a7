//! Names and attributes: the `stat` family (with glibc's older `__xstat` entry points and
//! `statx`), `access`, `unlink`, `mkdir`, `rmdir`, `rename`, `link`, `symlink`, `readlink`,
//! `chmod`, `chown`, the `utime` family, `truncate`, extended attributes and `statfs`: one
//! module each, over the two routing helpers here.

mod attributes;
mod names;
mod stat;
mod statfs;
mod xattr;

use std::ffi::{c_char, c_int};

use ringfs_client::{Client, Errno};

use ringfs_cglue::call::{failed, guard};

use crate::descriptors::{self, OpenDescription};
use crate::paths::{Route, following, route_at};
use crate::state::client;

/// Routes `path` relative to `dirfd` and runs `ringfs` for a ringfs path, or `kernel` with the
/// directory and path the kernel should see (`AT_FDCWD` and an absolute path when it was
/// written relative to a ringfs directory, or when `ringfs` followed a symbolic link out of
/// ringfs).
///
/// # Safety
/// `path` must be NULL or a NUL-terminated string.
pub(crate) unsafe fn by_path<T: From<i8>>(
    dirfd: c_int,
    path: *const c_char,
    ringfs: impl FnOnce(&Client, &str) -> Result<T, Errno>,
    kernel: impl FnOnce(c_int, *const c_char) -> T,
) -> T {
    // SAFETY: forwarded contract.
    match unsafe { route_at(dirfd, path) } {
        Route::Kernel => kernel(dirfd, path),
        Route::KernelPath(path) => kernel(libc::AT_FDCWD, path.as_ptr()),
        Route::Error(errno) => T::from(failed(errno) as i8),
        Route::Ringfs(path) => {
            following(T::from(-1), &path, || ringfs(&client()?, &path), |kernel_path| kernel(libc::AT_FDCWD, kernel_path.as_ptr()))
        }
    }
}

/// Runs `ringfs` with the open file of ringfs descriptor `fd`, or `kernel`.
pub(crate) fn by_descriptor<T: From<i8>>(
    fd: c_int,
    ringfs: impl FnOnce(&Client, &OpenDescription) -> Result<T, Errno>,
    kernel: impl FnOnce() -> T,
) -> T {
    match descriptors::lookup(fd) {
        Some(description) => guard(T::from(-1), || ringfs(&client()?, &description)),
        None => kernel(),
    }
}
