//! `errno`, and the guard every exported function runs its body in: a value, or `-1` (or the
//! function's failure value) with `errno` set; a panic never crosses into C.

use std::panic::{AssertUnwindSafe, catch_unwind};

use ringfs_client::Errno;

/// This thread's `errno`.
pub fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets this thread's `errno`.
pub fn set_errno(errno: Errno) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = errno.code() };
}

/// Sets `errno` and returns -1, for a C function that fails.
pub fn failed(errno: Errno) -> libc::c_int {
    set_errno(errno);
    -1
}

/// Runs `body` for a C caller: its value, or `failure` with `errno` set when it fails. A
/// panic becomes EIO.
pub fn guard<T>(failure: T, body: impl FnOnce() -> Result<T, Errno>) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => value,
        Ok(Err(errno)) => {
            set_errno(errno);
            failure
        }
        Err(_) => {
            set_errno(Errno::EIO);
            failure
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_returns_the_value_or_the_failure_with_errno_set() {
        assert_eq!(guard(-1, || Ok(7)), 7);
        assert_eq!(guard(-1, || Err(Errno::ENOENT)), -1);
        assert_eq!(errno(), libc::ENOENT);
        assert_eq!(failed(Errno::EXDEV), -1);
        assert_eq!(errno(), libc::EXDEV);
    }

    #[test]
    fn a_panic_becomes_eio() {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let value = guard(-1, || -> Result<i32, Errno> { panic!("inside a C call") });
        std::panic::set_hook(previous);
        assert_eq!((value, errno()), (-1, libc::EIO));
    }
}
