//! The ringfs C library: `libringfs.so` / `libringfs.a` with `include/ringfs.h`.
//!
//! Each `ringfs_*` function wraps one method of [`ringfs_client::Client`]: it converts the C
//! arguments, calls the client, and turns an error into `-1` with `errno` set. One client per
//! process is created by [`ringfs_init`]; all functions are thread-safe. A panic never
//! crosses into C: it becomes EIO.
//!
//! ```c
//! ringfs_init(NULL);
//! int fd = ringfs_create("/hello", O_WRONLY, 0644);
//! ringfs_write(fd, "hi", 2);
//! ringfs_close(fd);
//! ```

use parking_lot::RwLock;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::io::SeekFrom;
use std::panic::{AssertUnwindSafe, catch_unwind};

use ringfs_client::{Client, ClientConfig, ConnectError, Errno, Fd, OpenFlags, Stat};
use ringfs_config::env;

mod gmem;
mod locks;

static CLIENT: RwLock<Option<Client>> = RwLock::new(None);

fn set_errno(errno: Errno) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = errno.code() };
}

/// Runs `body`, returning its value, or `failure` with errno set when it fails or panics.
fn guard<T>(failure: T, body: impl FnOnce() -> Result<T, Errno>) -> T {
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

fn client() -> Result<Client, Errno> {
    CLIENT.read().clone().ok_or(Errno::EINVAL)
}

/// A C string argument as UTF-8 (EFAULT for NULL, EINVAL for other encodings).
///
/// # Safety
/// `text` must be NULL or point to a NUL-terminated string.
unsafe fn string<'a>(text: *const c_char) -> Result<&'a str, Errno> {
    if text.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(text) }.to_str().map_err(|_| Errno::EINVAL)
}

fn descriptor(fd: c_int) -> Result<Fd, Errno> {
    u32::try_from(fd).map(Fd).map_err(|_| Errno::EBADF)
}

fn fill_stat(stat: &Stat, destination: *mut libc::stat) -> Result<(), Errno> {
    if destination.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: all-zero is a valid `struct stat`.
    let mut out: libc::stat = unsafe { std::mem::zeroed() };
    out.st_mode = stat.mode;
    out.st_uid = stat.uid;
    out.st_gid = stat.gid;
    out.st_size = stat.size as libc::off_t;
    out.st_blksize = stat.chunk_size as libc::blksize_t;
    out.st_blocks = stat.blocks() as libc::blkcnt_t;
    out.st_ino = stat.ino;
    out.st_nlink = stat.nlink as libc::nlink_t;
    out.st_atime = stat.atime_ns.div_euclid(1_000_000_000);
    out.st_atime_nsec = stat.atime_ns.rem_euclid(1_000_000_000);
    out.st_mtime = stat.mtime_ns.div_euclid(1_000_000_000);
    out.st_mtime_nsec = stat.mtime_ns.rem_euclid(1_000_000_000);
    out.st_ctime = stat.ctime_ns.div_euclid(1_000_000_000);
    out.st_ctime_nsec = stat.ctime_ns.rem_euclid(1_000_000_000);
    // SAFETY: checked non-null; the caller passes a `struct stat`.
    unsafe { *destination = out };
    Ok(())
}

/// See `ringfs.h`.
///
/// # Safety
/// `servers` must be NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_init(servers: *const c_char) -> c_int {
    guard(-1, || {
        let mut slot = CLIENT.write();
        if slot.is_some() {
            return Ok(0);
        }
        let servers = if servers.is_null() {
            std::env::var(env::SERVER).unwrap_or_default()
        } else {
            // SAFETY: non-null, NUL-terminated by contract.
            unsafe { string(servers) }?.to_string()
        };
        let servers = ringfs_client::split_servers(&servers);
        if servers.is_empty() {
            return Err(Errno::EINVAL);
        }
        let config = ClientConfig::new(servers, Vec::new()).with_environment().map_err(|_| Errno::EINVAL)?;
        let client = Client::connect(config).map_err(|error| match error {
            ConnectError::Config(_) => Errno::EINVAL,
            ConnectError::Unreachable(_) => Errno::EIO,
            ConnectError::Refused(errno) => errno,
        })?;
        *slot = Some(client);
        Ok(0)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ringfs_term() -> c_int {
    guard(-1, || {
        CLIENT.write().take();
        Ok(0)
    })
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_create(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { ringfs_open(path, flags | libc::O_CREAT | libc::O_TRUNC, mode) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_open(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let path = unsafe { string(path) }?;
        let fd = client()?.open(path, OpenFlags::from_posix(flags), mode)?;
        c_int::try_from(fd.0).map_err(|_| Errno::EMFILE)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ringfs_close(fd: c_int) -> c_int {
    guard(-1, || {
        let client = client()?;
        let fd = descriptor(fd)?;
        let released = locks::release_at_close(&client, fd);
        client.close(fd)?;
        released.map(|()| 0)
    })
}

/// # Safety
/// `buffer` must point to `size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_read(fd: c_int, buffer: *mut c_void, size: usize) -> isize {
    guard(-1, || {
        // SAFETY: the caller provides `size` writable bytes (checked non-null when size > 0).
        let buffer = unsafe { mutable_bytes(buffer, size) }?;
        client()?.read(descriptor(fd)?, buffer).map(|count| count as isize)
    })
}

/// # Safety
/// `buffer` must point to `size` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_write(fd: c_int, buffer: *const c_void, size: usize) -> isize {
    guard(-1, || {
        // SAFETY: the caller provides `size` readable bytes.
        let buffer = unsafe { bytes(buffer, size) }?;
        client()?.write(descriptor(fd)?, buffer).map(|count| count as isize)
    })
}

/// # Safety
/// `buffer` must point to `size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_pread(fd: c_int, buffer: *mut c_void, size: usize, offset: libc::off_t) -> isize {
    guard(-1, || {
        let offset = u64::try_from(offset).map_err(|_| Errno::EINVAL)?;
        // SAFETY: the caller provides `size` writable bytes.
        let buffer = unsafe { mutable_bytes(buffer, size) }?;
        client()?.pread(descriptor(fd)?, buffer, offset).map(|count| count as isize)
    })
}

/// # Safety
/// `buffer` must point to `size` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_pwrite(fd: c_int, buffer: *const c_void, size: usize, offset: libc::off_t) -> isize {
    guard(-1, || {
        let offset = u64::try_from(offset).map_err(|_| Errno::EINVAL)?;
        // SAFETY: the caller provides `size` readable bytes.
        let buffer = unsafe { bytes(buffer, size) }?;
        client()?.pwrite(descriptor(fd)?, buffer, offset).map(|count| count as isize)
    })
}

/// # Safety
/// `buffer` must be NULL with `size` 0, or point to `size` readable bytes.
unsafe fn bytes<'a>(buffer: *const c_void, size: usize) -> Result<&'a [u8], Errno> {
    if size == 0 {
        return Ok(&[]);
    }
    if buffer.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: non-null, `size` readable bytes by contract.
    Ok(unsafe { std::slice::from_raw_parts(buffer.cast::<u8>(), size) })
}

/// # Safety
/// `buffer` must be NULL with `size` 0, or point to `size` writable bytes.
unsafe fn mutable_bytes<'a>(buffer: *mut c_void, size: usize) -> Result<&'a mut [u8], Errno> {
    if size == 0 {
        return Ok(&mut []);
    }
    if buffer.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: non-null, `size` writable bytes by contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(buffer.cast::<u8>(), size) })
}

#[unsafe(no_mangle)]
pub extern "C" fn ringfs_seek(fd: c_int, offset: libc::off_t, whence: c_int) -> libc::off_t {
    guard(-1, || {
        let to = match whence {
            libc::SEEK_SET => SeekFrom::Start(u64::try_from(offset).map_err(|_| Errno::EINVAL)?),
            libc::SEEK_CUR => SeekFrom::Current(offset),
            libc::SEEK_END => SeekFrom::End(offset),
            _ => return Err(Errno::EINVAL),
        };
        let position = client()?.seek(descriptor(fd)?, to)?;
        libc::off_t::try_from(position).map_err(|_| Errno::EOVERFLOW)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ringfs_fsync(fd: c_int) -> c_int {
    guard(-1, || client()?.fsync(descriptor(fd)?).map(|()| 0))
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_truncate(path: *const c_char, length: libc::off_t) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let path = unsafe { string(path) }?;
        client()?.truncate(path, u64::try_from(length).map_err(|_| Errno::EINVAL)?).map(|()| 0)
    })
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_chmod(path: *const c_char, mode: libc::mode_t) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let path = unsafe { string(path) }?;
        client()?.chmod(path, mode).map(|()| 0)
    })
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_chown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let path = unsafe { string(path) }?;
        let given = |id: u32| (id != u32::MAX).then_some(id);
        client()?.chown(path, given(uid), given(gid)).map(|()| 0)
    })
}

/// # Safety
/// `path` must be a NUL-terminated string; `times` NULL or two timespecs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_utimens(path: *const c_char, times: *const libc::timespec) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let path = unsafe { string(path) }?;
        let client = client()?;
        if times.is_null() {
            return client.touch(path).map(|()| 0);
        }
        // SAFETY: the caller passes two timespecs.
        let times = unsafe { std::slice::from_raw_parts(times, 2) };
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos() as i64);
        let explicit = times.iter().any(|time| time.tv_nsec != libc::UTIME_NOW && time.tv_nsec != libc::UTIME_OMIT);
        let value = |time: &libc::timespec| match time.tv_nsec {
            libc::UTIME_OMIT => Ok(None),
            libc::UTIME_NOW => Ok(Some(now)),
            nanos if (0..1_000_000_000).contains(&nanos) => Ok(Some(time.tv_sec * 1_000_000_000 + nanos)),
            _ => Err(Errno::EINVAL),
        };
        let (atime, mtime) = (value(&times[0])?, value(&times[1])?);
        client.set_times(path, atime, mtime, explicit).map(|()| 0)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ringfs_ftruncate(fd: c_int, length: libc::off_t) -> c_int {
    guard(-1, || client()?.ftruncate(descriptor(fd)?, u64::try_from(length).map_err(|_| Errno::EINVAL)?).map(|()| 0))
}

/// # Safety
/// `path` must be a NUL-terminated string and `st` point to a `struct stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_stat(path: *const c_char, st: *mut libc::stat) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let path = unsafe { string(path) }?;
        fill_stat(&client()?.stat(path)?, st).map(|()| 0)
    })
}

/// # Safety
/// `path` must be a NUL-terminated string and `st` point to a `struct stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_lstat(path: *const c_char, st: *mut libc::stat) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let path = unsafe { string(path) }?;
        fill_stat(&client()?.lstat(path)?, st).map(|()| 0)
    })
}

/// # Safety
/// `st` must point to a `struct stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_fstat(fd: c_int, st: *mut libc::stat) -> c_int {
    guard(-1, || fill_stat(&client()?.fstat(descriptor(fd)?)?, st).map(|()| 0))
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_access(path: *const c_char, mode: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let path = unsafe { string(path) }?;
        client()?.access(path, u32::try_from(mode).map_err(|_| Errno::EINVAL)?).map(|()| 0)
    })
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_unlink(path: *const c_char) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let path = unsafe { string(path) }?;
        client()?.unlink(path).map(|()| 0)
    })
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_mkdir(path: *const c_char, mode: libc::mode_t) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let path = unsafe { string(path) }?;
        client()?.mkdir(path, mode).map(|()| 0)
    })
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_rmdir(path: *const c_char) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let path = unsafe { string(path) }?;
        client()?.rmdir(path).map(|()| 0)
    })
}

/// Called by [`ringfs_readdir`] for every entry (`fuse_fill_dir_t`'s signature).
pub type Filler = Option<unsafe extern "C" fn(*mut c_void, *const c_char, *const libc::stat, libc::off_t) -> c_int>;

/// # Safety
/// `path` must be a NUL-terminated string; `filler` a valid function or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_readdir(path: *const c_char, context: *mut c_void, filler: Filler) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let path = unsafe { string(path) }?;
        let filler = filler.ok_or(Errno::EFAULT)?;
        for (index, entry) in client()?.readdir(path)?.into_iter().enumerate() {
            let name = std::ffi::CString::new(entry.name).map_err(|_| Errno::EINVAL)?;
            // SAFETY: all-zero is a valid `struct stat`, then filled.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            fill_stat(&entry.stat, &mut st)?;
            // SAFETY: the caller's filler, with a valid name and stat for the call's duration.
            if unsafe { filler(context, name.as_ptr(), &st, (index + 1) as libc::off_t) } != 0 {
                break;
            }
        }
        Ok(0)
    })
}

/// # Safety
/// `target` and `link_path` must be NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_symlink(target: *const c_char, link_path: *const c_char) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let (target, link_path) = unsafe { (string(target)?, string(link_path)?) };
        client()?.symlink(target, link_path).map(|()| 0)
    })
}

/// # Safety
/// `path` must be a NUL-terminated string and `buffer` point to `size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_readlink(path: *const c_char, buffer: *mut c_char, size: usize) -> isize {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let path = unsafe { string(path) }?;
        let target = client()?.readlink(path)?;
        // SAFETY: `size` writable bytes by contract.
        let buffer = unsafe { mutable_bytes(buffer.cast(), size) }?;
        let count = target.len().min(buffer.len());
        buffer[..count].copy_from_slice(&target.as_bytes()[..count]);
        Ok(count as isize)
    })
}

/// # Safety
/// `from` and `to` must be NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_rename(from: *const c_char, to: *const c_char) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let (from, to) = unsafe { (string(from)?, string(to)?) };
        client()?.rename(from, to).map(|()| 0)
    })
}

/// `fallocate(2)` on an open descriptor: `mode` 0 or `FALLOC_FL_KEEP_SIZE` (1).
#[unsafe(no_mangle)]
pub extern "C" fn ringfs_fallocate(fd: c_int, mode: c_int, offset: libc::off_t, len: libc::off_t) -> c_int {
    guard(-1, || {
        let (offset, len) = (u64::try_from(offset).map_err(|_| Errno::EINVAL)?, u64::try_from(len).map_err(|_| Errno::EINVAL)?);
        client()?.fallocate(descriptor(fd)?, u32::try_from(mode).map_err(|_| Errno::EOPNOTSUPP)?, offset, len).map(|()| 0)
    })
}

/// Copies `value` into `buffer` like `getxattr(2)`: `size` 0 asks for the length only; a
/// value longer than `size` is ERANGE.
///
/// # Safety
/// `buffer` must be NULL with `size` 0, or point to `size` writable bytes.
unsafe fn copy_out(value: &[u8], buffer: *mut c_void, size: usize) -> Result<isize, Errno> {
    if size == 0 {
        return Ok(value.len() as isize);
    }
    if value.len() > size {
        return Err(Errno::ERANGE);
    }
    // SAFETY: `size` writable bytes by contract.
    let buffer = unsafe { mutable_bytes(buffer, size) }?;
    buffer[..value.len()].copy_from_slice(value);
    Ok(value.len() as isize)
}

/// # Safety
/// `path` and `name` must be NUL-terminated strings; `value` NULL with `size` 0, or `size`
/// writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_getxattr(path: *const c_char, name: *const c_char, value: *mut c_void, size: usize) -> isize {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let (path, name) = unsafe { (string(path)?, string(name)?) };
        let found = client()?.get_xattr(path, name)?;
        // SAFETY: forwarded contract.
        unsafe { copy_out(&found, value, size) }
    })
}

/// # Safety
/// `path` and `name` must be NUL-terminated strings; `value` NULL with `size` 0, or `size`
/// readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_setxattr(
    path: *const c_char,
    name: *const c_char,
    value: *const c_void,
    size: usize,
    flags: c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let (path, name, value) = unsafe { (string(path)?, string(name)?, bytes(value, size)?) };
        client()?.set_xattr(path, name, value, u32::try_from(flags).map_err(|_| Errno::EINVAL)?).map(|()| 0)
    })
}

/// # Safety
/// `path` must be a NUL-terminated string; `list` NULL with `size` 0, or `size` writable
/// bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_listxattr(path: *const c_char, list: *mut c_char, size: usize) -> isize {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let path = unsafe { string(path) }?;
        let mut names = Vec::new();
        for name in client()?.list_xattrs(path)? {
            names.extend_from_slice(name.as_bytes());
            names.push(0);
        }
        // SAFETY: forwarded contract.
        unsafe { copy_out(&names, list.cast(), size) }
    })
}

/// # Safety
/// `path` and `name` must be NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ringfs_removexattr(path: *const c_char, name: *const c_char) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let (path, name) = unsafe { (string(path)?, string(name)?) };
        client()?.remove_xattr(path, name).map(|()| 0)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ringfs_sync() -> c_int {
    guard(-1, || client()?.sync().map(|()| 0))
}

#[unsafe(no_mangle)]
pub extern "C" fn ringfs_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
