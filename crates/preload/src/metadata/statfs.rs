//! File system statistics: `statfs` and `statvfs`.

use std::ffi::{CStr, CString, c_char, c_int};

use ringfs_client::{Client, Errno};

use ringfs_cglue::call::{failed, guard};
use ringfs_cglue::stat::DEVICE;

use super::{by_descriptor, by_path};
use crate::paths::{Route, route_at};
use crate::real::real;
use crate::state::client;

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
    out.f_fsid = DEVICE;
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
            let checked = guard(-1, || client()?.stat(&ringfs_path).map(|_| 0));
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
