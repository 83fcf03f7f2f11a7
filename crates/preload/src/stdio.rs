//! stdio streams on ringfs files: `fopen`, `fopen64` and `fdopen`.
//!
//! glibc's `fopen` opens with an internal `open` that no preloaded library can see, and its
//! streams read and write the descriptor with internal calls too. So a ringfs stream is a
//! `fopencookie` stream whose read, write, seek and close functions are this library's
//! descriptor functions; `fileno` gives its ringfs descriptor.

use std::ffi::{CStr, c_char, c_int, c_void};

use ringfs_client::Errno;

use crate::descriptors;
use crate::files::{close, failed, lseek, open_ringfs, read, write};
use crate::paths::{Route, route_at};
use crate::real::real;
use crate::ringfs_call;

/// `open(2)` flags of an `fopen` mode string (`r`, `w+`, `ab`, `re`, `wx`, …).
pub(crate) fn mode_flags(mode: &[u8]) -> Option<c_int> {
    let plus = mode.contains(&b'+');
    let mut flags = match (mode.first()?, plus) {
        (b'r', false) => libc::O_RDONLY,
        (b'r', true) => libc::O_RDWR,
        (b'w', false) => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        (b'w', true) => libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
        (b'a', false) => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        (b'a', true) => libc::O_RDWR | libc::O_CREAT | libc::O_APPEND,
        _ => return None,
    };
    for modifier in &mode[1..] {
        match modifier {
            b'e' => flags |= libc::O_CLOEXEC,
            b'x' => flags |= libc::O_EXCL,
            b',' => break,
            _ => {}
        }
    }
    Some(flags)
}

unsafe extern "C" fn cookie_read(cookie: *mut c_void, buffer: *mut c_char, size: usize) -> isize {
    // SAFETY: glibc passes its buffer of `size` bytes.
    unsafe { read(cookie as usize as c_int, buffer.cast(), size) }
}

unsafe extern "C" fn cookie_write(cookie: *mut c_void, buffer: *const c_char, size: usize) -> isize {
    // SAFETY: glibc passes `size` bytes.
    let written = unsafe { write(cookie as usize as c_int, buffer.cast(), size) };
    // glibc's cookie streams take 0 as an error; -1 is one too.
    if written < 0 { 0 } else { written }
}

unsafe extern "C" fn cookie_seek(cookie: *mut c_void, offset: *mut i64, whence: c_int) -> c_int {
    // SAFETY: glibc passes a valid offset.
    let position = lseek(cookie as usize as c_int, unsafe { *offset }, whence);
    if position < 0 {
        return -1;
    }
    // SAFETY: as above.
    unsafe { *offset = position };
    0
}

unsafe extern "C" fn cookie_close(cookie: *mut c_void) -> c_int {
    close(cookie as usize as c_int)
}

/// glibc's `cookie_io_functions_t`.
#[repr(C)]
struct CookieFunctions {
    read: unsafe extern "C" fn(*mut c_void, *mut c_char, usize) -> isize,
    write: unsafe extern "C" fn(*mut c_void, *const c_char, usize) -> isize,
    seek: unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int,
    close: unsafe extern "C" fn(*mut c_void) -> c_int,
}

/// Offset of `_fileno` in glibc's `struct _IO_FILE` on 64-bit targets: `int _flags`, twelve
/// pointers, `_chain`.
const FILENO_OFFSET: usize = 112;

/// A stream over ringfs descriptor `fd`, whose `fileno` is `fd`.
fn cookie_stream(fd: c_int, mode: *const c_char) -> *mut libc::FILE {
    let functions = CookieFunctions { read: cookie_read, write: cookie_write, seek: cookie_seek, close: cookie_close };
    let stream = real!("fopencookie", fn(*mut c_void, *const c_char, CookieFunctions) -> *mut libc::FILE; fd as usize as *mut c_void, mode, functions);
    if !stream.is_null() && cfg!(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64")) {
        // glibc marks a cookie stream's descriptor -2 ("open, no descriptor"); giving it the
        // ringfs descriptor lets `fileno` (and `fstat(fileno(f))`) work. Only that value is
        // replaced, so another layout is left alone.
        // SAFETY: the stream is a glibc FILE, larger than the offset; the field is an int.
        unsafe {
            let fileno = stream.cast::<u8>().add(FILENO_OFFSET).cast::<c_int>();
            if *fileno == -2 {
                *fileno = fd;
            }
        }
    }
    stream
}

/// # Safety
/// `path` and `mode` must be NUL-terminated strings.
unsafe fn open_stream(
    path: *const c_char,
    mode: *const c_char,
    real_fopen: impl FnOnce(*const c_char) -> *mut libc::FILE,
) -> *mut libc::FILE {
    // SAFETY: forwarded contract.
    match unsafe { route_at(libc::AT_FDCWD, path) } {
        Route::Kernel => real_fopen(path),
        Route::KernelPath(path) => real_fopen(path.as_ptr()),
        Route::Error(errno) => {
            failed(errno);
            std::ptr::null_mut()
        }
        Route::Ringfs(path) => {
            // SAFETY: the caller's mode string.
            let Some(flags) = (!mode.is_null()).then(|| mode_flags(unsafe { CStr::from_ptr(mode) }.to_bytes())).flatten() else {
                failed(Errno::EINVAL);
                return std::ptr::null_mut();
            };
            let fd = ringfs_call(-1, || open_ringfs(&path, flags, 0o666));
            if fd < 0 {
                return std::ptr::null_mut();
            }
            let stream = cookie_stream(fd, mode);
            if stream.is_null() {
                let errno = crate::errno();
                close(fd);
                crate::set_errno(errno);
            }
            stream
        }
    }
}

/// # Safety
/// `path` and `mode` must be NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: forwarded contract.
    unsafe { open_stream(path, mode, |path| real!("fopen", fn(*const c_char, *const c_char) -> *mut libc::FILE; path, mode)) }
}

/// # Safety
/// `path` and `mode` must be NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: forwarded contract.
    unsafe { open_stream(path, mode, |path| real!("fopen64", fn(*const c_char, *const c_char) -> *mut libc::FILE; path, mode)) }
}

/// # Safety
/// `mode` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE {
    let Some(description) = descriptors::lookup(fd) else {
        return real!("fdopen", fn(c_int, *const c_char) -> *mut libc::FILE; fd, mode);
    };
    // SAFETY: the caller's mode string.
    let Some(flags) = (!mode.is_null()).then(|| mode_flags(unsafe { CStr::from_ptr(mode) }.to_bytes())).flatten() else {
        failed(Errno::EINVAL);
        return std::ptr::null_mut();
    };
    let wants_read = flags & libc::O_ACCMODE != libc::O_WRONLY;
    let wants_write = flags & libc::O_ACCMODE != libc::O_RDONLY;
    if (wants_read && !description.readable()) || (wants_write && !description.writable()) {
        failed(Errno::EINVAL);
        return std::ptr::null_mut();
    }
    cookie_stream(fd, mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fopen_modes_give_open_flags() {
        assert_eq!(mode_flags(b"r"), Some(libc::O_RDONLY));
        assert_eq!(mode_flags(b"rb+"), Some(libc::O_RDWR));
        assert_eq!(mode_flags(b"w"), Some(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC));
        assert_eq!(mode_flags(b"a+e"), Some(libc::O_RDWR | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC));
        assert_eq!(mode_flags(b"wx"), Some(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL));
        assert_eq!(mode_flags(b"q"), None);
    }
}

unsafe extern "C" {
    static mut stdin: *mut libc::FILE;
    static mut stdout: *mut libc::FILE;
    static mut stderr: *mut libc::FILE;
}

/// A program executed with a ringfs file as its standard input, output or error (`ls >
/// /ringfs/list`) would read or write it through glibc's own stream, whose internal calls
/// never reach this library: that stream is replaced by a ringfs one (called when the
/// library is loaded, after the inherited descriptors are adopted; stderr stays unbuffered).
pub(crate) fn adopt_standard_streams() {
    for fd in 0..=2 {
        let Some(description) = descriptors::lookup(fd) else { continue };
        let mode = match fd {
            0 if description.readable() => c"r",
            1 | 2 if description.writable() => c"a",
            _ => continue,
        };
        let stream = cookie_stream(fd, mode.as_ptr());
        if stream.is_null() {
            continue;
        }
        // SAFETY: the C library's standard stream variables, replaced before `main` runs (no
        // other thread exists yet); the old streams stay valid, unused.
        unsafe {
            match fd {
                0 => stdin = stream,
                1 => stdout = stream,
                _ => {
                    real!("setvbuf", fn(*mut libc::FILE, *mut c_char, c_int, usize) -> c_int; stream, std::ptr::null_mut(), libc::_IONBF, 0);
                    stderr = stream;
                }
            }
        }
    }
}
