//! New numbers for an open file and its flags: the `dup` family and `fcntl` on ringfs
//! descriptors (the kernel copies the placeholder; the descriptor table follows), with the
//! lock commands handed to `locks.rs`. Its own module because a `dup2` onto a standard
//! descriptor also replaces the C library's standard stream (`stdio.rs`), which is built on
//! the file calls of `files.rs`.

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use ringfs_cglue::call::guard;

use crate::real::real;
use crate::state::client;
use crate::{descriptors, locks, stdio};

#[unsafe(no_mangle)]
pub extern "C" fn dup(fd: c_int) -> c_int {
    let description = descriptors::lookup(fd);
    let new_fd = real!("dup", fn(c_int) -> c_int; fd);
    if let Some(description) = description
        && new_fd >= 0
    {
        if descriptors::in_vfork_child() {
            descriptors::changed_in_vfork_child(new_fd, Some(&description));
        } else {
            descriptors::duplicated(new_fd, description);
        }
    }
    new_fd
}

/// `dup2` and `dup3`: the kernel copies the placeholder onto `new_fd` (closing what was
/// there), and the table follows.
fn duplicate_onto(fd: c_int, new_fd: c_int, flags: c_int, with_flags: bool) -> c_int {
    let description = descriptors::lookup(fd);
    let result = if with_flags {
        real!("dup3", fn(c_int, c_int, c_int) -> c_int; fd, new_fd, flags)
    } else {
        real!("dup2", fn(c_int, c_int) -> c_int; fd, new_fd)
    };
    if result >= 0 && fd != new_fd && (description.is_some() || descriptors::lookup(new_fd).is_some()) && descriptors::in_vfork_child() {
        descriptors::changed_in_vfork_child(new_fd, description.as_ref());
        return result;
    }
    if result >= 0 && fd != new_fd {
        descriptors::kernel_descriptor_closed(new_fd);
        match description {
            Some(description) => {
                descriptors::duplicated(new_fd, description);
                stdio::adopt_standard_stream(new_fd);
            }
            None => drop(descriptors::remove(new_fd)),
        }
    }
    result
}

#[unsafe(no_mangle)]
pub extern "C" fn dup2(fd: c_int, new_fd: c_int) -> c_int {
    duplicate_onto(fd, new_fd, 0, false)
}

#[unsafe(no_mangle)]
pub extern "C" fn dup3(fd: c_int, new_fd: c_int, flags: c_int) -> c_int {
    duplicate_onto(fd, new_fd, flags, true)
}

/// `fcntl(fd, cmd, argument)`: the argument is an integer or a pointer, as `cmd` says.
#[unsafe(no_mangle)]
pub extern "C" fn fcntl(fd: c_int, cmd: c_int, argument: usize) -> c_int {
    let Some(description) = descriptors::lookup(fd) else {
        return real!("fcntl64", fn(c_int, c_int, usize) -> c_int; fd, cmd, argument);
    };
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            // (The new number was free: it cannot be the base placeholder.)
            let new_fd = real!("fcntl64", fn(c_int, c_int, usize) -> c_int; fd, cmd, argument);
            if new_fd >= 0 && descriptors::in_vfork_child() {
                descriptors::changed_in_vfork_child(new_fd, Some(&description));
            } else if new_fd >= 0 {
                descriptors::duplicated(new_fd, description);
            }
            new_fd
        }
        libc::F_GETFL => description.flags(),
        libc::F_SETFL => {
            // Only O_APPEND and O_NONBLOCK (and the flags Linux ignores) may change.
            let changeable = libc::O_APPEND | libc::O_NONBLOCK | libc::O_ASYNC | libc::O_DIRECT | libc::O_NOATIME;
            let new = (description.flags() & !changeable) | (argument as c_int & changeable);
            description.status_flags.store(new, Ordering::Relaxed);
            0
        }
        libc::F_GETLK | libc::F_SETLK | libc::F_SETLKW | libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW => {
            guard(-1, || locks::fcntl_lock(&client()?, &description, fd, cmd, argument as *mut libc::flock))
        }
        // F_GETFD and F_SETFD (close-on-exec) and the rest: the placeholder answers.
        _ => {
            let result = real!("fcntl64", fn(c_int, c_int, usize) -> c_int; fd, cmd, argument);
            if cmd == libc::F_SETFD {
                descriptors::descriptors_changed();
            }
            result
        }
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn fcntl64(fd: c_int, cmd: c_int, argument: usize) -> c_int {
    fcntl(fd, cmd, argument)
}
