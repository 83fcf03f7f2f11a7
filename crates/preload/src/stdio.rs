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
use crate::paths::{Route, following, route_at};
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
            let open_ringfs_stream = || {
                let fd = open_ringfs(&path, flags, 0o666)?;
                let stream = cookie_stream(fd, mode);
                if stream.is_null() {
                    let errno = Errno(crate::errno());
                    close(fd);
                    return Err(errno);
                }
                Ok(stream)
            };
            following(std::ptr::null_mut(), &path, open_ringfs_stream, |outside| real_fopen(outside.as_ptr()))
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

/// Which standard streams were replaced by ringfs ones.
static ADOPTED: [std::sync::atomic::AtomicBool; 3] = [const { std::sync::atomic::AtomicBool::new(false) }; 3];

/// A program executed with a ringfs file as its standard input, output or error (`ls >
/// /ringfs/list`), or that makes one of them a ringfs file (`sort -o`: `dup2` onto 1),
/// would read or write it through glibc's own stream, whose internal calls never reach this
/// library: that stream is replaced by a ringfs one, which reaches whatever the descriptor
/// is from then on (this library's `read` and `write` route by descriptor). stderr stays
/// unbuffered.
pub(crate) fn adopt_standard_stream(fd: c_int) {
    let Some(adopted) = usize::try_from(fd).ok().and_then(|index| ADOPTED.get(index)) else { return };
    let Some(description) = descriptors::lookup(fd) else { return };
    let mode = match fd {
        0 if description.readable() => c"r",
        1 | 2 if description.writable() => c"a",
        _ => return,
    };
    if adopted.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return;
    }
    let stream = cookie_stream(fd, mode.as_ptr());
    if stream.is_null() {
        adopted.store(false, std::sync::atomic::Ordering::Release);
        return;
    }
    // SAFETY: the C library's standard stream variables; the old streams stay valid, unused
    // (a program that keeps a copy of the old pointer writes through glibc to the placeholder).
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

/// [`adopt_standard_stream`] for each inherited standard descriptor (at load, before `main`).
pub(crate) fn adopt_standard_streams() {
    (0..=2).for_each(adopt_standard_stream);
}

// ---- temporary files ----
//
// glibc's `mkstemp` family and `mkdtemp` create with internal calls: for a template under
// the prefix they are done here (`sed -i` makes its temporary file beside the one it edits).

/// Characters of the random part of a temporary name.
const NAME_CHARACTERS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
/// Names tried before giving up with EEXIST.
const NAME_ATTEMPTS: usize = 100;

/// Fills the six `X` before the last `suffix_len` bytes of `template` with new random
/// characters, then runs `create` with the ringfs path it names, until one does not exist.
///
/// # Safety
/// `template` must be a writable NUL-terminated string.
unsafe fn make_temporary<T>(template: *mut c_char, suffix_len: usize, create: impl Fn(&str) -> Result<T, Errno>) -> Result<T, Errno> {
    // SAFETY: by contract.
    let length = unsafe { CStr::from_ptr(template) }.to_bytes().len();
    let end = length.checked_sub(suffix_len).filter(|end| *end >= 6).ok_or(Errno::EINVAL)?;
    // SAFETY: within the string.
    let name = unsafe { std::slice::from_raw_parts_mut(template.cast::<u8>(), length) };
    if name[end - 6..end].iter().any(|byte| *byte != b'X') {
        return Err(Errno::EINVAL);
    }
    let mut state = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |time| time.as_nanos() as u64)
        ^ (u64::from(std::process::id()) << 32)
        ^ (template as u64);
    for _ in 0..NAME_ATTEMPTS {
        for byte in &mut name[end - 6..end] {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = NAME_CHARACTERS[(state % NAME_CHARACTERS.len() as u64) as usize];
        }
        // SAFETY: still the caller's NUL-terminated string.
        let Route::Ringfs(path) = (unsafe { route_at(libc::AT_FDCWD, template) }) else { return Err(Errno::EINVAL) };
        match create(&path) {
            Err(errno) if errno == Errno::EEXIST => continue,
            outcome => return outcome,
        }
    }
    Err(Errno::EEXIST)
}

/// Whether `template` names a ringfs path.
///
/// # Safety
/// `template` must be NULL or NUL-terminated.
unsafe fn is_ringfs_template(template: *const c_char) -> bool {
    // SAFETY: forwarded contract.
    matches!(unsafe { route_at(libc::AT_FDCWD, template) }, Route::Ringfs(_))
}

/// # Safety
/// As `mkostemps(3)`.
unsafe fn make_temporary_file(template: *mut c_char, suffix_len: c_int, flags: c_int) -> c_int {
    let suffix_len = usize::try_from(suffix_len).unwrap_or(usize::MAX);
    let flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
    // SAFETY: forwarded contract.
    ringfs_call(-1, || unsafe { make_temporary(template, suffix_len, |path| open_ringfs(path, flags, 0o600)) })
}

/// # Safety
/// As `mkstemp(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkstemp(template: *mut c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        if !is_ringfs_template(template) {
            return real!("mkstemp", fn(*mut c_char) -> c_int; template);
        }
        make_temporary_file(template, 0, 0)
    }
}

/// # Safety
/// As `mkstemp(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkstemp64(template: *mut c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { mkstemp(template) }
}

/// # Safety
/// As `mkostemp(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkostemp(template: *mut c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        if !is_ringfs_template(template) {
            return real!("mkostemp", fn(*mut c_char, c_int) -> c_int; template, flags);
        }
        make_temporary_file(template, 0, flags)
    }
}

/// # Safety
/// As `mkostemp(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkostemp64(template: *mut c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { mkostemp(template, flags) }
}

/// # Safety
/// As `mkstemps(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkstemps(template: *mut c_char, suffix_len: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        if !is_ringfs_template(template) {
            return real!("mkstemps", fn(*mut c_char, c_int) -> c_int; template, suffix_len);
        }
        make_temporary_file(template, suffix_len, 0)
    }
}

/// # Safety
/// As `mkostemps(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkostemps(template: *mut c_char, suffix_len: c_int, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        if !is_ringfs_template(template) {
            return real!("mkostemps", fn(*mut c_char, c_int, c_int) -> c_int; template, suffix_len, flags);
        }
        make_temporary_file(template, suffix_len, flags)
    }
}

/// # Safety
/// As `mkdtemp(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkdtemp(template: *mut c_char) -> *mut c_char {
    // SAFETY: forwarded contract.
    unsafe {
        if !is_ringfs_template(template) {
            return real!("mkdtemp", fn(*mut c_char) -> *mut c_char; template);
        }
        let made = ringfs_call(-1, || make_temporary(template, 0, |path| crate::state::client()?.mkdir(path, 0o700).map(|()| 0)));
        if made == 0 { template } else { std::ptr::null_mut() }
    }
}
