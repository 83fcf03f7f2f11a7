//! Opening files and moving bytes: `open` and its variants, `close`, `read`/`write` and their
//! positioned and vectored forms, `lseek`, `fsync`, `ftruncate`, `fallocate`, and the calls that would reach the placeholder descriptor behind a
//! ringfs descriptor (`ioctl`, `copy_file_range`, `sendfile`, `mmap`).

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::Arc;

use ringfs_cglue::arguments::{self, bytes, bytes_mut, offset};
use ringfs_cglue::call::{errno, failed, guard, set_errno};
use ringfs_client::{Client, Errno, OpenFlags};

use crate::descriptors::{self, OpenDescription};
use crate::paths::{Route, route_at};
use crate::real::real;
use crate::state::{client, masked};

type Mode = c_uint;

/// The mode argument of an open: passed only with `O_CREAT` or `O_TMPFILE`.
fn creation_mode(flags: c_int, mode: Mode) -> Mode {
    if flags & libc::O_CREAT != 0 || flags & libc::O_TMPFILE == libc::O_TMPFILE { mode } else { 0 }
}

/// `openat` for every open variant.
///
/// # Safety
/// `path` must be NULL or a NUL-terminated string.
unsafe fn open_at(dirfd: c_int, path: *const c_char, flags: c_int, mode: Mode) -> c_int {
    let mode = creation_mode(flags, mode);
    // SAFETY: forwarded contract.
    match unsafe { route_at(dirfd, path) } {
        Route::Kernel => real!("openat64", fn(c_int, *const c_char, c_int, Mode) -> c_int; dirfd, path, flags, mode),
        Route::KernelPath(path) => {
            real!("openat64", fn(c_int, *const c_char, c_int, Mode) -> c_int; libc::AT_FDCWD, path.as_ptr(), flags, mode)
        }
        Route::Error(errno) => failed(errno),
        Route::Ringfs(path) => crate::paths::following(
            -1,
            &path,
            || open_ringfs(&path, flags, mode),
            |outside| real!("openat64", fn(c_int, *const c_char, c_int, Mode) -> c_int; libc::AT_FDCWD, outside.as_ptr(), flags, mode),
        ),
    }
}

/// Opens ringfs path `path` like `open(2)`; the new descriptor.
pub(crate) fn open_ringfs(path: &str, flags: c_int, mode: Mode) -> Result<c_int, Errno> {
    let client = client()?;
    if flags & libc::O_TMPFILE == libc::O_TMPFILE {
        return Err(Errno::EOPNOTSUPP);
    }
    let cloexec = flags & libc::O_CLOEXEC != 0;
    let writable = matches!(flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR);
    let no_follow = flags & libc::O_NOFOLLOW != 0;
    let by_name_only = flags & (libc::O_PATH | libc::O_DIRECTORY) != 0;
    if by_name_only || (no_follow && flags & libc::O_CREAT == 0) {
        let stat = if no_follow { client.lstat(path) } else { client.stat(path) }?;
        if flags & libc::O_DIRECTORY != 0 && !stat.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        let is_link = stat.mode & libc::S_IFMT == libc::S_IFLNK;
        if is_link && flags & libc::O_PATH == 0 {
            return Err(Errno(libc::ELOOP));
        }
        if stat.is_dir() && writable {
            return Err(Errno::EISDIR);
        }
        if by_name_only || stat.is_dir() {
            let description = OpenDescription::new(path.to_string(), &stat, flags, None);
            return descriptors::allocate(Arc::new(description), cloexec);
        }
    }
    let (fd, stat) = client.open_with_stat(path, OpenFlags::from_posix(flags), masked(mode))?;
    let handle = if stat.is_dir() {
        // Directories are reached by id; the client's descriptor is not needed.
        client.close(fd)?;
        None
    } else {
        Some(fd)
    };
    // (If no descriptor number is left, dropping the description closes the file.)
    descriptors::allocate(Arc::new(OpenDescription::new(path.to_string(), &stat, flags, handle)), cloexec)
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: Mode) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_at(libc::AT_FDCWD, path, flags, mode) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: Mode) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_at(libc::AT_FDCWD, path, flags, mode) }
}

/// The fortified `open` (`_FORTIFY_SOURCE`), which takes no mode.
///
/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_at(libc::AT_FDCWD, path, flags, 0) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_at(libc::AT_FDCWD, path, flags, 0) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: Mode) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_at(dirfd, path, flags, mode) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: Mode) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_at(dirfd, path, flags, mode) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_at(dirfd, path, flags, 0) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_at(dirfd, path, flags, 0) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn creat(path: *const c_char, mode: Mode) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { open_at(libc::AT_FDCWD, path, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, mode) }
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: Mode) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { creat(path, mode) }
}

#[unsafe(no_mangle)]
pub extern "C" fn close(fd: c_int) -> c_int {
    if descriptors::lookup(fd).is_some() && descriptors::in_vfork_child() {
        descriptors::changed_in_vfork_child(fd, None);
        return real!("close", fn(c_int) -> c_int; fd);
    }
    // The description (and with its last descriptor, the client's open) goes after the
    // placeholder: the number stays taken until the ringfs state is gone.
    let description = descriptors::remove(fd);
    descriptors::kernel_descriptor_closed(fd);
    let closed = real!("close", fn(c_int) -> c_int; fd);
    if let Some(description) = description {
        crate::locks::release_process_locks(&description);
    }
    closed
}

/// Runs `body` with the open file of ringfs descriptor `fd`, or returns `None` for a kernel
/// descriptor.
fn with_description<T>(fd: c_int, failure: T, body: impl FnOnce(&Client, &OpenDescription) -> Result<T, Errno>) -> Option<T> {
    let description = descriptors::lookup(fd)?;
    Some(guard(failure, || body(&client()?, &description)))
}

/// Reads at `offset` into `buffer`; the count.
fn read_at(client: &Client, description: &OpenDescription, buffer: &mut [u8], offset: u64) -> Result<usize, Errno> {
    if !description.readable() {
        return Err(Errno::EBADF);
    }
    client.pread(description.handle(client)?, buffer, offset)
}

/// Writes at `offset` — at the end for a descriptor opened with `O_APPEND`, as Linux's
/// `pwrite(2)` does; where the bytes went, and how many.
fn write_at(client: &Client, description: &OpenDescription, bytes: &[u8], offset: u64) -> Result<(u64, usize), Errno> {
    if !description.writable() {
        return Err(Errno::EBADF);
    }
    if bytes.is_empty() {
        return Ok((offset, 0));
    }
    let handle = description.handle(client)?;
    if description.flags() & libc::O_APPEND != 0 {
        // (Placed by the file's inode server: appends from other nodes never overlap it.)
        return client.append_to(handle, bytes);
    }
    client.pwrite(handle, bytes, offset).map(|count| (offset, count))
}

/// Reads at the position of descriptor `fd`, which advances.
fn read_here(client: &Client, description: &OpenDescription, fd: c_int, buffer: &mut [u8]) -> Result<usize, Errno> {
    let mut held = description.position.lock();
    let at = description.position_at(&held, fd)?;
    let count = read_at(client, description, buffer, at)?;
    description.move_to(&mut held, fd, at + count as u64)?;
    Ok(count)
}

/// Writes at the position of descriptor `fd` (at the end with `O_APPEND`), which advances.
fn write_here(client: &Client, description: &OpenDescription, fd: c_int, bytes: &[u8]) -> Result<usize, Errno> {
    let mut held = description.position.lock();
    let at = description.position_at(&held, fd)?;
    let (at, count) = write_at(client, description, bytes, at)?;
    description.move_to(&mut held, fd, at + count as u64)?;
    Ok(count)
}

/// # Safety
/// `buffer` must point to `count` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buffer: *mut c_void, count: usize) -> isize {
    // SAFETY: the caller's buffer.
    with_description(fd, -1, |client, description| {
        read_here(client, description, fd, unsafe { bytes_mut(buffer, count) }?).map(|n| n as isize)
    })
    .unwrap_or_else(|| real!("read", fn(c_int, *mut c_void, usize) -> isize; fd, buffer, count))
}

/// # Safety
/// `buffer` must point to `count` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, bytes: *const c_void, count: usize) -> isize {
    // SAFETY: the caller's buffer.
    with_description(fd, -1, |client, description| {
        write_here(client, description, fd, unsafe { arguments::bytes(bytes, count) }?).map(|n| n as isize)
    })
    .unwrap_or_else(|| real!("write", fn(c_int, *const c_void, usize) -> isize; fd, bytes, count))
}

/// # Safety
/// `buffer` must point to `count` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pread(fd: c_int, buffer: *mut c_void, count: usize, at: libc::off_t) -> isize {
    with_description(fd, -1, |client, description| {
        // SAFETY: the caller's buffer.
        read_at(client, description, unsafe { bytes_mut(buffer, count) }?, offset(at)?).map(|n| n as isize)
    })
    .unwrap_or_else(|| real!("pread64", fn(c_int, *mut c_void, usize, libc::off_t) -> isize; fd, buffer, count, at))
}

/// # Safety
/// `buffer` must point to `count` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pread64(fd: c_int, buffer: *mut c_void, count: usize, at: libc::off_t) -> isize {
    // SAFETY: forwarded contract.
    unsafe { pread(fd, buffer, count, at) }
}

/// # Safety
/// `bytes` must point to `count` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwrite(fd: c_int, bytes: *const c_void, count: usize, at: libc::off_t) -> isize {
    with_description(fd, -1, |client, description| {
        // SAFETY: the caller's buffer.
        write_at(client, description, unsafe { arguments::bytes(bytes, count) }?, offset(at)?).map(|(_, n)| n as isize)
    })
    .unwrap_or_else(|| real!("pwrite64", fn(c_int, *const c_void, usize, libc::off_t) -> isize; fd, bytes, count, at))
}

/// # Safety
/// `bytes` must point to `count` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwrite64(fd: c_int, bytes: *const c_void, count: usize, at: libc::off_t) -> isize {
    // SAFETY: forwarded contract.
    unsafe { pwrite(fd, bytes, count, at) }
}

/// The caller's `iovec` array.
///
/// # Safety
/// `vectors` must point to `count` iovecs.
unsafe fn iovecs<'a>(vectors: *const libc::iovec, count: c_int) -> Result<&'a [libc::iovec], Errno> {
    let count = usize::try_from(count).map_err(|_| Errno::EINVAL)?;
    if count == 0 {
        return Ok(&[]);
    }
    if vectors.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(vectors, count) })
}

/// Reads into the vectors in turn starting at `at`, stopping at the end of the file.
fn read_vectors(client: &Client, description: &OpenDescription, vectors: &[libc::iovec], mut at: u64) -> Result<usize, Errno> {
    let mut total = 0;
    for vector in vectors {
        // SAFETY: each iovec describes the caller's writable memory.
        let part = unsafe { bytes_mut(vector.iov_base, vector.iov_len) }?;
        let count = read_at(client, description, part, at)?;
        total += count;
        at += count as u64;
        if count < part.len() {
            break;
        }
    }
    Ok(total)
}

/// Writes the vectors' bytes at `at` in one write (gathered first).
fn write_vectors(client: &Client, description: &OpenDescription, vectors: &[libc::iovec], at: u64) -> Result<usize, Errno> {
    let mut gathered = Vec::with_capacity(vectors.iter().map(|vector| vector.iov_len).sum());
    for vector in vectors {
        // SAFETY: each iovec describes the caller's readable memory.
        gathered.extend_from_slice(unsafe { bytes(vector.iov_base, vector.iov_len) }?);
    }
    write_at(client, description, &gathered, at).map(|(_, count)| count)
}

/// # Safety
/// `vectors` must point to `count` iovecs of writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, vectors: *const libc::iovec, count: c_int) -> isize {
    with_description(fd, -1, |client, description| {
        // SAFETY: the caller's vectors.
        let vectors = unsafe { iovecs(vectors, count) }?;
        let mut held = description.position.lock();
        let at = description.position_at(&held, fd)?;
        let total = read_vectors(client, description, vectors, at)?;
        description.move_to(&mut held, fd, at + total as u64)?;
        Ok(total as isize)
    })
    .unwrap_or_else(|| real!("readv", fn(c_int, *const libc::iovec, c_int) -> isize; fd, vectors, count))
}

/// # Safety
/// `vectors` must point to `count` iovecs of readable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, vectors: *const libc::iovec, count: c_int) -> isize {
    with_description(fd, -1, |client, description| {
        // SAFETY: the caller's vectors.
        let vectors = unsafe { iovecs(vectors, count) }?;
        let mut gathered = Vec::new();
        for vector in vectors {
            // SAFETY: each iovec describes the caller's readable memory.
            gathered.extend_from_slice(unsafe { bytes(vector.iov_base, vector.iov_len) }?);
        }
        write_here(client, description, fd, &gathered).map(|n| n as isize)
    })
    .unwrap_or_else(|| real!("writev", fn(c_int, *const libc::iovec, c_int) -> isize; fd, vectors, count))
}

/// # Safety
/// `vectors` must point to `count` iovecs of writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn preadv(fd: c_int, vectors: *const libc::iovec, count: c_int, at: libc::off_t) -> isize {
    with_description(fd, -1, |client, description| {
        // SAFETY: the caller's vectors.
        read_vectors(client, description, unsafe { iovecs(vectors, count) }?, offset(at)?).map(|n| n as isize)
    })
    .unwrap_or_else(|| real!("preadv64", fn(c_int, *const libc::iovec, c_int, libc::off_t) -> isize; fd, vectors, count, at))
}

/// # Safety
/// `vectors` must point to `count` iovecs of writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn preadv64(fd: c_int, vectors: *const libc::iovec, count: c_int, at: libc::off_t) -> isize {
    // SAFETY: forwarded contract.
    unsafe { preadv(fd, vectors, count, at) }
}

/// # Safety
/// `vectors` must point to `count` iovecs of readable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwritev(fd: c_int, vectors: *const libc::iovec, count: c_int, at: libc::off_t) -> isize {
    with_description(fd, -1, |client, description| {
        // SAFETY: the caller's vectors.
        write_vectors(client, description, unsafe { iovecs(vectors, count) }?, offset(at)?).map(|n| n as isize)
    })
    .unwrap_or_else(|| real!("pwritev64", fn(c_int, *const libc::iovec, c_int, libc::off_t) -> isize; fd, vectors, count, at))
}

/// # Safety
/// `vectors` must point to `count` iovecs of readable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwritev64(fd: c_int, vectors: *const libc::iovec, count: c_int, at: libc::off_t) -> isize {
    // SAFETY: forwarded contract.
    unsafe { pwritev(fd, vectors, count, at) }
}

/// `lseek` of a ringfs descriptor. `SEEK_DATA` and `SEEK_HOLE` see one extent of data
/// covering the file.
fn seek(client: &Client, description: &OpenDescription, fd: c_int, offset: libc::off_t, whence: c_int) -> Result<libc::off_t, Errno> {
    let mut position = description.position.lock();
    let current = description.position_at(&position, fd)?;
    let size = || -> Result<i64, Errno> { Ok(description.stat(client)?.size as i64) };
    let target = match whence {
        libc::SEEK_SET => offset,
        libc::SEEK_CUR => (current as i64).checked_add(offset).ok_or(Errno::EINVAL)?,
        libc::SEEK_END => size()?.checked_add(offset).ok_or(Errno::EINVAL)?,
        libc::SEEK_DATA if offset >= 0 && offset < size()? => offset,
        libc::SEEK_HOLE if offset >= 0 && offset < size()? => size()?,
        libc::SEEK_DATA | libc::SEEK_HOLE => return Err(Errno(libc::ENXIO)),
        _ => return Err(Errno::EINVAL),
    };
    if target < 0 {
        return Err(Errno::EINVAL);
    }
    description.move_to(&mut position, fd, target as u64)?;
    Ok(target)
}

#[unsafe(no_mangle)]
pub extern "C" fn lseek(fd: c_int, offset: libc::off_t, whence: c_int) -> libc::off_t {
    with_description(fd, -1, |client, description| seek(client, description, fd, offset, whence))
        .unwrap_or_else(|| real!("lseek64", fn(c_int, libc::off_t, c_int) -> libc::off_t; fd, offset, whence))
}

#[unsafe(no_mangle)]
pub extern "C" fn lseek64(fd: c_int, offset: libc::off_t, whence: c_int) -> libc::off_t {
    lseek(fd, offset, whence)
}

fn sync_description(client: &Client, description: &OpenDescription) -> Result<c_int, Errno> {
    if description.is_directory {
        client.fsync_everywhere(description.file)?;
    } else {
        client.fsync(description.handle(client)?)?;
    }
    Ok(0)
}

#[unsafe(no_mangle)]
pub extern "C" fn fsync(fd: c_int) -> c_int {
    with_description(fd, -1, sync_description).unwrap_or_else(|| real!("fsync", fn(c_int) -> c_int; fd))
}

#[unsafe(no_mangle)]
pub extern "C" fn fdatasync(fd: c_int) -> c_int {
    with_description(fd, -1, sync_description).unwrap_or_else(|| real!("fdatasync", fn(c_int) -> c_int; fd))
}

#[unsafe(no_mangle)]
pub extern "C" fn ftruncate(fd: c_int, length: libc::off_t) -> c_int {
    with_description(fd, -1, |client, description| {
        if !description.writable() {
            return Err(Errno::EINVAL);
        }
        client.ftruncate(description.handle(client)?, offset(length)?).map(|()| 0)
    })
    .unwrap_or_else(|| real!("ftruncate64", fn(c_int, libc::off_t) -> c_int; fd, length))
}

#[unsafe(no_mangle)]
pub extern "C" fn ftruncate64(fd: c_int, length: libc::off_t) -> c_int {
    ftruncate(fd, length)
}

#[unsafe(no_mangle)]
pub extern "C" fn fallocate(fd: c_int, mode: c_int, at: libc::off_t, len: libc::off_t) -> c_int {
    with_description(fd, -1, |client, description| {
        client.fallocate(description.handle(client)?, mode as u32, offset(at)?, offset(len)?).map(|()| 0)
    })
    .unwrap_or_else(|| real!("fallocate64", fn(c_int, c_int, libc::off_t, libc::off_t) -> c_int; fd, mode, at, len))
}

#[unsafe(no_mangle)]
pub extern "C" fn fallocate64(fd: c_int, mode: c_int, at: libc::off_t, len: libc::off_t) -> c_int {
    fallocate(fd, mode, at, len)
}

/// `posix_fallocate` returns the error number instead of setting errno.
#[unsafe(no_mangle)]
pub extern "C" fn posix_fallocate(fd: c_int, at: libc::off_t, len: libc::off_t) -> c_int {
    match descriptors::lookup(fd) {
        Some(_) if fallocate(fd, 0, at, len) == 0 => 0,
        Some(_) => errno(),
        None => real!("posix_fallocate64", fn(c_int, libc::off_t, libc::off_t) -> c_int; fd, at, len),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn posix_fallocate64(fd: c_int, at: libc::off_t, len: libc::off_t) -> c_int {
    posix_fallocate(fd, at, len)
}

/// Advice is taken and ignored for ringfs files (it is advice).
#[unsafe(no_mangle)]
pub extern "C" fn posix_fadvise(fd: c_int, at: libc::off_t, len: libc::off_t, advice: c_int) -> c_int {
    match descriptors::lookup(fd) {
        Some(_) => 0,
        None => real!("posix_fadvise64", fn(c_int, libc::off_t, libc::off_t, c_int) -> c_int; fd, at, len, advice),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn posix_fadvise64(fd: c_int, at: libc::off_t, len: libc::off_t, advice: c_int) -> c_int {
    posix_fadvise(fd, at, len, advice)
}

/// `ioctl` on a ringfs descriptor: no device controls (ENOTTY), which makes `cp` give up on
/// cloning (`FICLONE`) and copy.
#[unsafe(no_mangle)]
pub extern "C" fn ioctl(fd: c_int, request: libc::c_ulong, argument: usize) -> c_int {
    match descriptors::lookup(fd) {
        Some(_) => failed(Errno(libc::ENOTTY)),
        None => real!("ioctl", fn(c_int, libc::c_ulong, usize) -> c_int; fd, request, argument),
    }
}

/// In-kernel copies cannot involve a ringfs descriptor: EXDEV, after which `cp` and
/// Python's `shutil` copy by reading and writing.
#[unsafe(no_mangle)]
pub extern "C" fn copy_file_range(
    fd_in: c_int,
    offset_in: *mut i64,
    fd_out: c_int,
    offset_out: *mut i64,
    len: usize,
    flags: c_uint,
) -> isize {
    if descriptors::lookup(fd_in).is_some() || descriptors::lookup(fd_out).is_some() {
        return failed(Errno::EXDEV) as isize;
    }
    real!("copy_file_range", fn(c_int, *mut i64, c_int, *mut i64, usize, c_uint) -> isize; fd_in, offset_in, fd_out, offset_out, len, flags)
}

/// `sendfile` with a ringfs descriptor: EINVAL (the caller falls back to read and write).
#[unsafe(no_mangle)]
pub extern "C" fn sendfile(fd_out: c_int, fd_in: c_int, offset_in: *mut libc::off_t, count: usize) -> isize {
    if descriptors::lookup(fd_in).is_some() || descriptors::lookup(fd_out).is_some() {
        return failed(Errno::EINVAL) as isize;
    }
    real!("sendfile64", fn(c_int, c_int, *mut libc::off_t, usize) -> isize; fd_out, fd_in, offset_in, count)
}

#[unsafe(no_mangle)]
pub extern "C" fn sendfile64(fd_out: c_int, fd_in: c_int, offset_in: *mut libc::off_t, count: usize) -> isize {
    sendfile(fd_out, fd_in, offset_in, count)
}

/// `mmap` of a ringfs file: a private copy of its bytes (read-only or copy-on-write maps
/// behave as on a local file until the file changes); a shared writable map fails with
/// ENODEV, as on file systems without shared maps.
#[unsafe(no_mangle)]
pub extern "C" fn mmap(address: *mut c_void, len: usize, protection: c_int, flags: c_int, fd: c_int, at: libc::off_t) -> *mut c_void {
    let real_mmap = |address, fd, flags, at| real!("mmap64", fn(*mut c_void, usize, c_int, c_int, c_int, libc::off_t) -> *mut c_void; address, len, protection, flags, fd, at);
    let Some(description) = (if flags & libc::MAP_ANONYMOUS != 0 { None } else { descriptors::lookup(fd) }) else {
        return real_mmap(address, fd, flags, at);
    };
    if flags & libc::MAP_SHARED != 0 && protection & libc::PROT_WRITE != 0 {
        set_errno(Errno(libc::ENODEV));
        return libc::MAP_FAILED;
    }
    let private = (flags & !(libc::MAP_SHARED | libc::MAP_SHARED_VALIDATE)) | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    let writable = protection | libc::PROT_WRITE;
    let map =
        real!("mmap64", fn(*mut c_void, usize, c_int, c_int, c_int, libc::off_t) -> *mut c_void; address, len, writable, private, -1, 0);
    if map == libc::MAP_FAILED {
        return map;
    }
    let filled = guard(-1, || {
        let client = client()?;
        // SAFETY: `map` is `len` writable bytes just mapped.
        let bytes = unsafe { std::slice::from_raw_parts_mut(map.cast::<u8>(), len) };
        read_at(&client, &description, bytes, offset(at)?).map(|_| 0)
    });
    if filled != 0
        || (protection & libc::PROT_WRITE == 0 && real!("mprotect", fn(*mut c_void, usize, c_int) -> c_int; map, len, protection) != 0)
    {
        let errno = errno();
        real!("munmap", fn(*mut c_void, usize) -> c_int; map, len);
        set_errno(Errno(errno));
        return libc::MAP_FAILED;
    }
    map
}

#[unsafe(no_mangle)]
pub extern "C" fn mmap64(address: *mut c_void, len: usize, protection: c_int, flags: c_int, fd: c_int, at: libc::off_t) -> *mut c_void {
    mmap(address, len, protection, flags, fd, at)
}

/// `close_range`: the ringfs descriptors in the range are closed like `close` closes them.
#[unsafe(no_mangle)]
pub extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let ringfs: Vec<c_int> =
        descriptors::all().into_iter().map(|(fd, _)| fd).filter(|fd| (first..=last).contains(&(*fd as c_uint))).collect();
    let result = real!("close_range", fn(c_uint, c_uint, c_int) -> c_int; first, last, flags);
    if !ringfs.is_empty() && descriptors::in_vfork_child() {
        if result == 0 && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
            ringfs.into_iter().for_each(|fd| descriptors::changed_in_vfork_child(fd, None));
        }
        return result;
    }
    if result == 0 && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        for fd in ringfs {
            drop(descriptors::remove(fd));
        }
    }
    let base = descriptors::base_placeholder();
    if result == 0 && base >= 0 && (first..=last).contains(&(base as c_uint)) && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        descriptors::kernel_descriptor_closed(base);
    }
    result
}
