//! C arguments as Rust values: a NUL-terminated string as `&str`, a pointer and a length as
//! a slice (EFAULT for NULL with a length), an offset or length as `u64`; and results
//! written back: a value copied out with `getxattr`'s size rules, a structure stored through
//! the caller's pointer.

use std::ffi::{CStr, c_char, c_void};

use ringfs_client::Errno;

/// A C string argument as UTF-8: EFAULT for NULL, EINVAL for other encodings.
///
/// # Safety
/// `text` must be NULL or point to a NUL-terminated string that outlives `'a`.
pub unsafe fn c_str<'a>(text: *const c_char) -> Result<&'a str, Errno> {
    if text.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(text) }.to_str().map_err(|_| Errno::EINVAL)
}

/// The caller's `len` readable bytes at `buffer` (empty for `len` 0, whatever `buffer` is;
/// EFAULT for NULL otherwise).
///
/// # Safety
/// `buffer` must be NULL or point to `len` bytes readable for `'a`.
pub unsafe fn bytes<'a>(buffer: *const c_void, len: usize) -> Result<&'a [u8], Errno> {
    if len == 0 {
        return Ok(&[]);
    }
    if buffer.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: non-null, `len` readable bytes by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(buffer.cast(), len) })
}

/// The caller's `len` writable bytes at `buffer`, as [`bytes`].
///
/// # Safety
/// `buffer` must be NULL or point to `len` bytes writable for `'a`, used by nothing else.
pub unsafe fn bytes_mut<'a>(buffer: *mut c_void, len: usize) -> Result<&'a mut [u8], Errno> {
    if len == 0 {
        return Ok(&mut []);
    }
    if buffer.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: non-null, `len` writable bytes by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(buffer.cast(), len) })
}

/// An offset or length argument (`off_t`) as `u64`: EINVAL when negative.
pub fn offset(value: libc::off_t) -> Result<u64, Errno> {
    u64::try_from(value).map_err(|_| Errno::EINVAL)
}

/// Stores `value` through the caller's pointer (EFAULT for NULL); 0, as the C call returns.
///
/// # Safety
/// `destination` must be NULL or point to a writable `T`.
pub unsafe fn store<T>(destination: *mut T, value: T) -> Result<i32, Errno> {
    if destination.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: non-null, and a writable `T` by the caller's contract.
    unsafe { destination.write(value) };
    Ok(0)
}

/// Copies `value` into the caller's buffer like `getxattr(2)` and `listxattr(2)`: `size` 0
/// asks for the length only; a value longer than `size` is ERANGE. The value's length.
///
/// # Safety
/// `buffer` must be NULL or point to `size` writable bytes.
pub unsafe fn copy_value(value: &[u8], buffer: *mut c_void, size: usize) -> Result<isize, Errno> {
    if size == 0 {
        return Ok(value.len() as isize);
    }
    if value.len() > size {
        return Err(Errno::ERANGE);
    }
    // SAFETY: `size` writable bytes by the caller's contract.
    let buffer = unsafe { bytes_mut(buffer, size) }?;
    buffer[..value.len()].copy_from_slice(value);
    Ok(value.len() as isize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_utf8_and_never_null() {
        // SAFETY: NULL, or NUL-terminated literals.
        unsafe {
            assert_eq!(c_str(std::ptr::null()), Err(Errno::EFAULT));
            assert_eq!(c_str(c"/a/b".as_ptr()), Ok("/a/b"));
            assert_eq!(c_str(c"\xff".as_ptr()), Err(Errno::EINVAL));
        }
    }

    #[test]
    fn an_empty_buffer_may_be_null_a_longer_one_may_not() {
        let mut storage = [1u8, 2, 3];
        // SAFETY: NULL with length 0 or 1 (refused), or `storage`'s 3 bytes.
        unsafe {
            assert_eq!(bytes(std::ptr::null(), 0), Ok(&[][..]));
            assert_eq!(bytes(std::ptr::null(), 1), Err(Errno::EFAULT));
            assert_eq!(bytes_mut(std::ptr::null_mut(), 1).map(|_| ()), Err(Errno::EFAULT));
            assert_eq!(bytes(storage.as_ptr().cast(), 3), Ok(&[1u8, 2, 3][..]));
            bytes_mut(storage.as_mut_ptr().cast(), 2).expect("non-null")[1] = 9;
        }
        assert_eq!(storage, [1, 9, 3]);
    }

    #[test]
    fn negative_offsets_are_einval() {
        assert_eq!(offset(0), Ok(0));
        assert_eq!(offset(libc::off_t::MAX), Ok(i64::MAX as u64));
        assert_eq!(offset(-1), Err(Errno::EINVAL));
    }

    #[test]
    fn storing_through_null_is_efault() {
        let mut slot = 0u32;
        // SAFETY: NULL, or a `u32` of this frame.
        unsafe {
            assert_eq!(store(std::ptr::null_mut(), 5u32), Err(Errno::EFAULT));
            assert_eq!(store(&mut slot, 5), Ok(0));
        }
        assert_eq!(slot, 5);
    }

    #[test]
    fn values_copy_out_with_getxattr_size_rules() {
        let mut buffer = [0u8; 4];
        // SAFETY: NULL with size 0, or `buffer`'s 4 bytes (or fewer).
        unsafe {
            assert_eq!(copy_value(b"abc", std::ptr::null_mut(), 0), Ok(3));
            assert_eq!(copy_value(b"abc", buffer.as_mut_ptr().cast(), 2), Err(Errno::ERANGE));
            assert_eq!(copy_value(b"abc", std::ptr::null_mut(), 3), Err(Errno::EFAULT));
            assert_eq!(copy_value(b"abc", buffer.as_mut_ptr().cast(), 4), Ok(3));
        }
        assert_eq!(&buffer, b"abc\0");
    }
}
