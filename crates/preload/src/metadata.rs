//! Names and attributes: the `stat` family (with glibc's older `__xstat` entry points and
//! `statx`), `access`, `unlink`, `mkdir`, `rmdir`, `rename`, `link`, `symlink`, `readlink`,
//! `chmod`, `chown`, the `utime` family, `truncate`, extended attributes and `statfs`.

use std::ffi::{CStr, CString, c_char, c_int, c_void};

use ringfs_client::{Client, Errno, Stat};
use ringfs_proto::SetAttr;

use crate::descriptors::{self, OpenDescription};
use crate::files::failed;
use crate::paths::{Route, following, route_at};
use crate::real::real;
use crate::state::{client, masked, remember_umask};
use crate::{ringfs_call, store_stat};

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
        Some(description) => ringfs_call(T::from(-1), || ringfs(&client()?, &description)),
        None => kernel(),
    }
}

/// The caller's string argument (EFAULT for NULL, EINVAL if not UTF-8).
///
/// # Safety
/// `text` must be NULL or NUL-terminated.
pub(crate) unsafe fn text<'a>(text: *const c_char) -> Result<&'a str, Errno> {
    if text.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: non-null and NUL-terminated by contract.
    unsafe { CStr::from_ptr(text) }.to_str().map_err(|_| Errno::EINVAL)
}

// ---- stat ----

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
        |client, description| store_stat(&description.stat(client)?, buf),
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

fn store_statx(stat: &Stat, destination: *mut libc::statx) -> Result<c_int, Errno> {
    if destination.is_null() {
        return Err(Errno::EFAULT);
    }
    let timestamp = |ns: i64| {
        // SAFETY: all-zero is a valid `struct statx_timestamp`.
        let mut time: libc::statx_timestamp = unsafe { std::mem::zeroed() };
        time.tv_sec = ns.div_euclid(1_000_000_000);
        time.tv_nsec = ns.rem_euclid(1_000_000_000) as u32;
        time
    };
    // SAFETY: all-zero is a valid `struct statx`.
    let mut out: libc::statx = unsafe { std::mem::zeroed() };
    out.stx_mask = libc::STATX_BASIC_STATS;
    out.stx_blksize = stat.chunk_size.max(512);
    out.stx_nlink = stat.nlink;
    out.stx_uid = stat.uid;
    out.stx_gid = stat.gid;
    out.stx_mode = stat.mode as u16;
    out.stx_ino = stat.ino;
    out.stx_size = stat.size;
    out.stx_blocks = stat.blocks();
    out.stx_atime = timestamp(stat.atime_ns);
    out.stx_mtime = timestamp(stat.mtime_ns);
    out.stx_ctime = timestamp(stat.ctime_ns);
    out.stx_rdev_major = libc::major(stat.rdev);
    out.stx_rdev_minor = libc::minor(stat.rdev);
    out.stx_dev_major = libc::major(crate::DEVICE);
    out.stx_dev_minor = libc::minor(crate::DEVICE);
    // SAFETY: non-null; the caller passes a `struct statx`.
    unsafe { destination.write(out) };
    Ok(0)
}

/// # Safety
/// `path` must be a NUL-terminated string, `buf` a `struct statx`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: libc::c_uint, buf: *mut libc::statx) -> c_int {
    // SAFETY: `path` is NUL-terminated when non-null.
    if flags & libc::AT_EMPTY_PATH != 0 && !path.is_null() && unsafe { *path } == 0 {
        return by_descriptor(
            dirfd,
            |client, description| store_statx(&description.stat(client)?, buf),
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

// ---- names ----

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
        (Route::Ringfs(from), Route::Ringfs(to)) => ringfs_call(-1, || ringfs(&client()?, from, to)),
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
    let ringfs = |client: &Client, path: &str| client.symlink(unsafe { text(target) }?, path).map(|()| 0);
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
    let ringfs = |client: &Client, path: &str| client.truncate(path, u64::try_from(length).map_err(|_| Errno::EINVAL)?).map(|()| 0);
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

// ---- attributes ----

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

/// The times of `utimensat` as (atime, mtime, explicit): `None` leaves one unchanged.
///
/// # Safety
/// `times` must be NULL or two timespecs.
unsafe fn time_change(times: *const libc::timespec) -> Result<(Option<i64>, Option<i64>, bool), Errno> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos() as i64);
    if times.is_null() {
        return Ok((Some(now), Some(now), false));
    }
    // SAFETY: the caller passes two timespecs.
    let times = unsafe { std::slice::from_raw_parts(times, 2) };
    let explicit = times.iter().any(|time| time.tv_nsec != libc::UTIME_NOW && time.tv_nsec != libc::UTIME_OMIT);
    let value = |time: &libc::timespec| match time.tv_nsec {
        libc::UTIME_OMIT => Ok(None),
        libc::UTIME_NOW => Ok(Some(now)),
        nanos if (0..1_000_000_000).contains(&nanos) => Ok(Some(time.tv_sec * 1_000_000_000 + nanos)),
        _ => Err(Errno::EINVAL),
    };
    Ok((value(&times[0])?, value(&times[1])?, explicit))
}

fn set_times_of(client: &Client, description: &OpenDescription, times: *const libc::timespec) -> Result<c_int, Errno> {
    // SAFETY: the caller's times.
    let (atime, mtime, explicit) = unsafe { time_change(times) }?;
    client
        .set_attr_id(description.file, |request| {
            request.atime_ns = atime;
            request.mtime_ns = mtime;
            request.times_explicit = explicit;
        })
        .map(|()| 0)
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
        let (atime, mtime, explicit) = unsafe { time_change(times) }?;
        change_attributes(client, path, flags & libc::AT_SYMLINK_NOFOLLOW == 0, |request| {
            request.atime_ns = atime;
            request.mtime_ns = mtime;
            request.times_explicit = explicit;
        })
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

// ---- extended attributes ----

/// Copies `value` to the caller's buffer with `getxattr`'s size rules.
fn give_value(value: &[u8], destination: *mut c_void, size: usize) -> Result<isize, Errno> {
    if size == 0 {
        return Ok(value.len() as isize);
    }
    if value.len() > size {
        return Err(Errno(libc::ERANGE));
    }
    if destination.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: the caller's buffer holds `size` bytes.
    unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), destination.cast(), value.len()) };
    Ok(value.len() as isize)
}

fn name_list(names: Vec<String>) -> Vec<u8> {
    names.into_iter().flat_map(|name| name.into_bytes().into_iter().chain([0])).collect()
}

/// # Safety
/// C strings and a buffer of `size` bytes.
unsafe fn get_xattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: usize, follow: bool) -> isize {
    let ringfs = |client: &Client, path: &str| {
        // SAFETY: the caller's string.
        let name = unsafe { text(name) }?;
        give_value(&if follow { client.get_xattr(path, name) } else { client.lget_xattr(path, name) }?, value, size)
    };
    let kernel = |_, path| {
        if follow {
            real!("getxattr", fn(*const c_char, *const c_char, *mut c_void, usize) -> isize; path, name, value, size)
        } else {
            real!("lgetxattr", fn(*const c_char, *const c_char, *mut c_void, usize) -> isize; path, name, value, size)
        }
    };
    // SAFETY: forwarded contract.
    unsafe { by_path(libc::AT_FDCWD, path, ringfs, kernel) }
}

/// # Safety
/// C strings and a buffer of `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getxattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: usize) -> isize {
    // SAFETY: forwarded contract.
    unsafe { get_xattr(path, name, value, size, true) }
}

/// # Safety
/// C strings and a buffer of `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lgetxattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: usize) -> isize {
    // SAFETY: forwarded contract.
    unsafe { get_xattr(path, name, value, size, false) }
}

/// # Safety
/// A C string and a buffer of `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fgetxattr(fd: c_int, name: *const c_char, value: *mut c_void, size: usize) -> isize {
    by_descriptor(
        fd,
        // SAFETY: the caller's string.
        |client, description| give_value(&client.get_xattr_id(description.file, unsafe { text(name) }?)?, value, size),
        || real!("fgetxattr", fn(c_int, *const c_char, *mut c_void, usize) -> isize; fd, name, value, size),
    )
}

/// # Safety
/// C strings and a buffer of `size` bytes.
unsafe fn set_xattr(path: *const c_char, name: *const c_char, value: *const c_void, size: usize, flags: c_int, follow: bool) -> c_int {
    let ringfs = |client: &Client, path: &str| {
        // SAFETY: the caller's string and value.
        let (name, value) = unsafe { (text(name)?, value_bytes(value, size)?) };
        if follow { client.set_xattr(path, name, value, flags as u32) } else { client.lset_xattr(path, name, value, flags as u32) }
            .map(|()| 0)
    };
    let kernel = |_, path| {
        if follow {
            real!("setxattr", fn(*const c_char, *const c_char, *const c_void, usize, c_int) -> c_int; path, name, value, size, flags)
        } else {
            real!("lsetxattr", fn(*const c_char, *const c_char, *const c_void, usize, c_int) -> c_int; path, name, value, size, flags)
        }
    };
    // SAFETY: forwarded contract.
    unsafe { by_path(libc::AT_FDCWD, path, ringfs, kernel) }
}

/// # Safety
/// `value` must be NULL or `size` readable bytes.
unsafe fn value_bytes<'a>(value: *const c_void, size: usize) -> Result<&'a [u8], Errno> {
    if size == 0 {
        return Ok(&[]);
    }
    if value.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: by contract.
    Ok(unsafe { std::slice::from_raw_parts(value.cast(), size) })
}

/// # Safety
/// C strings and a value of `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn setxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: usize, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { set_xattr(path, name, value, size, flags, true) }
}

/// # Safety
/// C strings and a value of `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lsetxattr(path: *const c_char, name: *const c_char, value: *const c_void, size: usize, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { set_xattr(path, name, value, size, flags, false) }
}

/// # Safety
/// A C string and a value of `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fsetxattr(fd: c_int, name: *const c_char, value: *const c_void, size: usize, flags: c_int) -> c_int {
    by_descriptor(
        fd,
        |client, description| {
            // SAFETY: the caller's string and value.
            let (name, value) = unsafe { (text(name)?, value_bytes(value, size)?) };
            client.set_xattr_id(description.file, name, value, flags as u32).map(|()| 0)
        },
        || real!("fsetxattr", fn(c_int, *const c_char, *const c_void, usize, c_int) -> c_int; fd, name, value, size, flags),
    )
}

/// # Safety
/// A C string and a buffer of `size` bytes.
unsafe fn list_xattrs(path: *const c_char, list: *mut c_char, size: usize, follow: bool) -> isize {
    let ringfs = |client: &Client, path: &str| {
        let names = if follow { client.list_xattrs(path) } else { client.llist_xattrs(path) }?;
        give_value(&name_list(names), list.cast(), size)
    };
    let kernel = |_, path| {
        if follow {
            real!("listxattr", fn(*const c_char, *mut c_char, usize) -> isize; path, list, size)
        } else {
            real!("llistxattr", fn(*const c_char, *mut c_char, usize) -> isize; path, list, size)
        }
    };
    // SAFETY: forwarded contract.
    unsafe { by_path(libc::AT_FDCWD, path, ringfs, kernel) }
}

/// # Safety
/// A C string and a buffer of `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn listxattr(path: *const c_char, list: *mut c_char, size: usize) -> isize {
    // SAFETY: forwarded contract.
    unsafe { list_xattrs(path, list, size, true) }
}

/// # Safety
/// A C string and a buffer of `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llistxattr(path: *const c_char, list: *mut c_char, size: usize) -> isize {
    // SAFETY: forwarded contract.
    unsafe { list_xattrs(path, list, size, false) }
}

/// # Safety
/// A buffer of `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flistxattr(fd: c_int, list: *mut c_char, size: usize) -> isize {
    by_descriptor(
        fd,
        |client, description| give_value(&name_list(client.list_xattrs_id(description.file)?), list.cast(), size),
        || real!("flistxattr", fn(c_int, *mut c_char, usize) -> isize; fd, list, size),
    )
}

/// # Safety
/// C strings.
unsafe fn remove_xattr(path: *const c_char, name: *const c_char, follow: bool) -> c_int {
    let ringfs = |client: &Client, path: &str| {
        // SAFETY: the caller's string.
        let name = unsafe { text(name) }?;
        if follow { client.remove_xattr(path, name) } else { client.lremove_xattr(path, name) }.map(|()| 0)
    };
    let kernel = |_, path| {
        if follow {
            real!("removexattr", fn(*const c_char, *const c_char) -> c_int; path, name)
        } else {
            real!("lremovexattr", fn(*const c_char, *const c_char) -> c_int; path, name)
        }
    };
    // SAFETY: forwarded contract.
    unsafe { by_path(libc::AT_FDCWD, path, ringfs, kernel) }
}

/// # Safety
/// C strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn removexattr(path: *const c_char, name: *const c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { remove_xattr(path, name, true) }
}

/// # Safety
/// C strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lremovexattr(path: *const c_char, name: *const c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { remove_xattr(path, name, false) }
}

/// # Safety
/// A C string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fremovexattr(fd: c_int, name: *const c_char) -> c_int {
    by_descriptor(
        fd,
        // SAFETY: the caller's string.
        |client, description| client.remove_xattr_id(description.file, unsafe { text(name) }?).map(|()| 0),
        || real!("fremovexattr", fn(c_int, *const c_char) -> c_int; fd, name),
    )
}

// ---- file system statistics ----

/// `f_type` of ringfs ("RING").
const RINGFS_MAGIC: i64 = 0x5249_4e47;
const BLOCK_SIZE: u64 = 4096;

fn store_statfs(client: &Client, destination: *mut libc::statfs) -> Result<c_int, Errno> {
    if destination.is_null() {
        return Err(Errno::EFAULT);
    }
    let usage = client.usage()?;
    // SAFETY: all-zero is a valid `struct statfs`.
    let mut out: libc::statfs = unsafe { std::mem::zeroed() };
    out.f_type = RINGFS_MAGIC;
    out.f_bsize = BLOCK_SIZE as i64;
    out.f_frsize = BLOCK_SIZE as i64;
    out.f_blocks = usage.capacity_bytes / BLOCK_SIZE;
    out.f_bfree = usage.capacity_bytes.saturating_sub(usage.used_bytes) / BLOCK_SIZE;
    out.f_bavail = out.f_bfree;
    out.f_files = usage.entries.max(1) * 2;
    out.f_ffree = usage.entries.max(1);
    out.f_namelen = 255;
    // SAFETY: non-null; the caller passes a `struct statfs`.
    unsafe { destination.write(out) };
    Ok(0)
}

fn store_statvfs(client: &Client, destination: *mut libc::statvfs) -> Result<c_int, Errno> {
    if destination.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: all-zero is a valid `struct statfs`.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    store_statfs(client, &mut fs)?;
    // SAFETY: all-zero is a valid `struct statvfs`.
    let mut out: libc::statvfs = unsafe { std::mem::zeroed() };
    out.f_bsize = fs.f_bsize as u64;
    out.f_frsize = fs.f_frsize as u64;
    out.f_blocks = fs.f_blocks;
    out.f_bfree = fs.f_bfree;
    out.f_bavail = fs.f_bavail;
    out.f_files = fs.f_files;
    out.f_ffree = fs.f_ffree;
    out.f_favail = fs.f_ffree;
    out.f_fsid = crate::DEVICE;
    out.f_namemax = 255;
    // SAFETY: non-null; the caller passes a `struct statvfs`.
    unsafe { destination.write(out) };
    Ok(0)
}

/// # Safety
/// A C string and a `struct statfs`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn statfs(path: *const c_char, buf: *mut libc::statfs) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        by_path(
            libc::AT_FDCWD,
            path,
            |client, path| client.stat(path).and_then(|_| store_statfs(client, buf)),
            |_, path| real!("statfs64", fn(*const c_char, *mut libc::statfs) -> c_int; path, buf),
        )
    }
}

/// # Safety
/// A C string and a `struct statfs`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn statfs64(path: *const c_char, buf: *mut libc::statfs) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { statfs(path, buf) }
}

/// # Safety
/// A `struct statfs`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatfs(fd: c_int, buf: *mut libc::statfs) -> c_int {
    by_descriptor(fd, |client, _| store_statfs(client, buf), || real!("fstatfs64", fn(c_int, *mut libc::statfs) -> c_int; fd, buf))
}

/// # Safety
/// A `struct statfs`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatfs64(fd: c_int, buf: *mut libc::statfs) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fstatfs(fd, buf) }
}

/// # Safety
/// A C string and a `struct statvfs`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn statvfs(path: *const c_char, buf: *mut libc::statvfs) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        by_path(
            libc::AT_FDCWD,
            path,
            |client, path| client.stat(path).and_then(|_| store_statvfs(client, buf)),
            |_, path| real!("statvfs64", fn(*const c_char, *mut libc::statvfs) -> c_int; path, buf),
        )
    }
}

/// # Safety
/// A C string and a `struct statvfs`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn statvfs64(path: *const c_char, buf: *mut libc::statvfs) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { statvfs(path, buf) }
}

/// # Safety
/// A `struct statvfs`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatvfs(fd: c_int, buf: *mut libc::statvfs) -> c_int {
    by_descriptor(fd, |client, _| store_statvfs(client, buf), || real!("fstatvfs64", fn(c_int, *mut libc::statvfs) -> c_int; fd, buf))
}

/// # Safety
/// A `struct statvfs`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatvfs64(fd: c_int, buf: *mut libc::statvfs) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { fstatvfs(fd, buf) }
}

/// `realpath` of a path inside ringfs: resolved lexically (symbolic links inside ringfs are
/// not followed, except one in the last component that leads out of ringfs: the kernel
/// resolves where it leads), checked to exist. glibc's own resolves through internal calls
/// that never reach this library.
///
/// # Safety
/// `path` must be a NUL-terminated string, `resolved` NULL or `PATH_MAX` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn realpath(path: *const c_char, resolved: *mut c_char) -> *mut c_char {
    let kernel = |path: *const c_char| real!("realpath", fn(*const c_char, *mut c_char) -> *mut c_char; path, resolved);
    // SAFETY: forwarded contract.
    let path_route = unsafe { route_at(libc::AT_FDCWD, path) };
    match path_route {
        Route::Kernel => kernel(path),
        Route::KernelPath(path) => kernel(path.as_ptr()),
        Route::Error(errno) => {
            failed(errno);
            std::ptr::null_mut()
        }
        Route::Ringfs(ringfs_path) => {
            if let Ok(Some(outside)) = crate::paths::where_links_lead_out(&ringfs_path) {
                return kernel(outside.as_ptr());
            }
            let checked = ringfs_call(-1, || client()?.stat(&ringfs_path).map(|_| 0));
            let Some(config) = crate::state::config() else { return std::ptr::null_mut() };
            let full = crate::paths::full_path(&config.mount, &ringfs_path);
            match CString::new(full) {
                Ok(full) if checked == 0 => copy_out_path(&full, resolved),
                Ok(_) => std::ptr::null_mut(),
                Err(_) => {
                    failed(Errno::EINVAL);
                    std::ptr::null_mut()
                }
            }
        }
    }
}

/// Copies a path to `destination` (`PATH_MAX` bytes) or, when NULL, to new `malloc` memory.
fn copy_out_path(path: &CStr, destination: *mut c_char) -> *mut c_char {
    let bytes = path.to_bytes_with_nul();
    if bytes.len() > libc::PATH_MAX as usize {
        failed(Errno::ENAMETOOLONG);
        return std::ptr::null_mut();
    }
    // SAFETY: malloc of the path's size; either buffer holds `bytes.len()` bytes.
    unsafe {
        let destination = if destination.is_null() { libc::malloc(bytes.len()).cast::<c_char>() } else { destination };
        if destination.is_null() {
            failed(Errno::ENOMEM);
            return destination;
        }
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), destination.cast(), bytes.len());
        destination
    }
}
