//! Extended attributes: the `getxattr`, `setxattr`, `listxattr` and `removexattr` families.

use std::ffi::{c_char, c_int, c_void};

use ringfs_client::Client;

use ringfs_cglue::arguments::{bytes, c_str, copy_value};

use super::{by_descriptor, by_path};
use crate::real::real;

fn name_list(names: Vec<String>) -> Vec<u8> {
    names.into_iter().flat_map(|name| name.into_bytes().into_iter().chain([0])).collect()
}

/// # Safety
/// C strings and a buffer of `size` bytes.
unsafe fn get_xattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: usize, follow: bool) -> isize {
    let ringfs = |client: &Client, path: &str| {
        // SAFETY: the caller's string.
        let name = unsafe { c_str(name) }?;
        // SAFETY: the caller's buffer of `size` bytes.
        unsafe { copy_value(&if follow { client.get_xattr(path, name) } else { client.lget_xattr(path, name) }?, value, size) }
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
        |client, description| {
            // SAFETY: the caller's string and buffer of `size` bytes.
            unsafe { copy_value(&client.get_xattr_id(description.file, c_str(name)?)?, value, size) }
        },
        || real!("fgetxattr", fn(c_int, *const c_char, *mut c_void, usize) -> isize; fd, name, value, size),
    )
}

/// # Safety
/// C strings and a buffer of `size` bytes.
unsafe fn set_xattr(path: *const c_char, name: *const c_char, value: *const c_void, size: usize, flags: c_int, follow: bool) -> c_int {
    let ringfs = |client: &Client, path: &str| {
        // SAFETY: the caller's string and value.
        let (name, value) = unsafe { (c_str(name)?, bytes(value, size)?) };
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
            let (name, value) = unsafe { (c_str(name)?, bytes(value, size)?) };
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
        // SAFETY: the caller's buffer of `size` bytes.
        unsafe { copy_value(&name_list(names), list.cast(), size) }
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
        // SAFETY: the caller's buffer of `size` bytes.
        |client, description| unsafe { copy_value(&name_list(client.list_xattrs_id(description.file)?), list.cast(), size) },
        || real!("flistxattr", fn(c_int, *mut c_char, usize) -> isize; fd, list, size),
    )
}

/// # Safety
/// C strings.
unsafe fn remove_xattr(path: *const c_char, name: *const c_char, follow: bool) -> c_int {
    let ringfs = |client: &Client, path: &str| {
        // SAFETY: the caller's string.
        let name = unsafe { c_str(name) }?;
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
        |client, description| client.remove_xattr_id(description.file, unsafe { c_str(name) }?).map(|()| 0),
        || real!("fremovexattr", fn(c_int, *const c_char) -> c_int; fd, name),
    )
}
