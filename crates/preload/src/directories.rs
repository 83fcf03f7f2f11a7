//! Directories: `DIR` streams (`opendir`, `fdopendir`, `readdir`, …), `getdents64`, and
//! the working directory (`chdir`, `fchdir`, `getcwd`).
//!
//! A ringfs `DIR` is this module's own [`DirectoryStream`], told apart from the C library's
//! by a registry of the streams handed out. A listing is taken when the stream opens (or
//! rewinds): a snapshot, with `.` and `..` first.

use std::collections::HashSet;
use std::ffi::{CString, c_char, c_int, c_long};
use std::sync::atomic::{AtomicUsize, Ordering};

use ringfs_sync::Mutex;

use ringfs_cglue::call::{failed, guard};
use ringfs_client::{Client, Errno};

use crate::descriptors::{self, ListedEntry, OpenDescription};
use crate::entry_type;
use crate::files::open_ringfs;
use crate::paths::{Route, following, route_at, set_working_directory, working_directory};
use crate::real::real;
use crate::state::client;

/// The entries of a directory, `.` and `..` first: names, inode numbers and types, as
/// `getdents` gives them (no attributes: a program that wants them calls `stat`).
pub(crate) fn listing(client: &Client, description: &OpenDescription) -> Result<Vec<ListedEntry>, Errno> {
    let entries = client.readdir_names(&description.path)?;
    let mut listing = Vec::with_capacity(entries.len() + 2);
    listing.push(ListedEntry { name: c".".to_owned(), ino: description.file.ino(), kind: libc::DT_DIR });
    listing.push(ListedEntry { name: c"..".to_owned(), ino: 1, kind: libc::DT_DIR });
    for entry in entries {
        let Ok(name) = CString::new(entry.name) else { continue };
        let kind = entry.kind.map_or(libc::DT_UNKNOWN, |kind| entry_type(kind.mode_bits()));
        listing.push(ListedEntry { name, ino: entry.file.ino(), kind });
    }
    Ok(listing)
}

/// A ringfs `DIR`.
struct DirectoryStream {
    /// The ringfs descriptor of the directory (`dirfd`); closed with the stream.
    fd: c_int,
    entries: Vec<ListedEntry>,
    next: usize,
    /// What the last `readdir` returned points here.
    entry: libc::dirent64,
}

/// The streams handed out, by address.
static STREAMS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);
static STREAM_COUNT: AtomicUsize = AtomicUsize::new(0);

/// The streams' lock, for the `fork` handler to hold across the `fork` (see `process.rs`).
pub(crate) fn lock_for_fork() -> impl std::any::Any {
    STREAMS.lock()
}

/// The ringfs stream behind `dir`, if it is one.
fn stream(dir: *mut libc::DIR) -> Option<&'static mut DirectoryStream> {
    if STREAM_COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    let streams = STREAMS.lock();
    if !streams.as_ref().is_some_and(|streams| streams.contains(&(dir as usize))) {
        return None;
    }
    // SAFETY: a live stream this module allocated; a DIR is used by one thread at a time.
    Some(unsafe { &mut *dir.cast::<DirectoryStream>() })
}

/// Makes a stream for ringfs directory descriptor `fd`.
fn open_stream(client: &Client, fd: c_int) -> Result<*mut libc::DIR, Errno> {
    let description = descriptors::lookup(fd).ok_or(Errno::EBADF)?;
    if !description.is_directory {
        return Err(Errno::ENOTDIR);
    }
    let entries = listing(client, &description)?;
    // SAFETY: all-zero is a valid dirent64.
    let entry = unsafe { std::mem::zeroed() };
    let stream = Box::into_raw(Box::new(DirectoryStream { fd, entries, next: 0, entry }));
    STREAMS.lock().get_or_insert_with(HashSet::new).insert(stream as usize);
    STREAM_COUNT.fetch_add(1, Ordering::AcqRel);
    Ok(stream.cast())
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut libc::DIR {
    let kernel = |path| real!("opendir", fn(*const c_char) -> *mut libc::DIR; path);
    // SAFETY: forwarded contract.
    match unsafe { route_at(libc::AT_FDCWD, path) } {
        Route::Kernel => kernel(path),
        Route::KernelPath(path) => kernel(path.as_ptr()),
        Route::Error(errno) => {
            failed(errno);
            std::ptr::null_mut()
        }
        Route::Ringfs(path) => {
            let open_ringfs_stream = || {
                let fd = open_ringfs(&path, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC, 0)?;
                client().and_then(|client| open_stream(&client, fd)).inspect_err(|_| {
                    crate::files::close(fd);
                })
            };
            following(std::ptr::null_mut(), &path, open_ringfs_stream, |outside| kernel(outside.as_ptr()))
        }
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn fdopendir(fd: c_int) -> *mut libc::DIR {
    if descriptors::lookup(fd).is_none() {
        return real!("fdopendir", fn(c_int) -> *mut libc::DIR; fd);
    }
    guard(std::ptr::null_mut(), || open_stream(&client()?, fd))
}

/// Fills the stream's entry with the next one; NULL at the end.
fn next_entry(stream: &mut DirectoryStream) -> *mut libc::dirent64 {
    let Some(listed) = stream.entries.get(stream.next) else { return std::ptr::null_mut() };
    stream.next += 1;
    let entry = &mut stream.entry;
    entry.d_ino = listed.ino;
    entry.d_off = stream.next as i64;
    entry.d_reclen = std::mem::size_of::<libc::dirent64>() as u16;
    entry.d_type = listed.kind;
    let name = listed.name.as_bytes_with_nul();
    let length = name.len().min(entry.d_name.len());
    for (slot, byte) in entry.d_name.iter_mut().zip(&name[..length]) {
        *slot = *byte as c_char;
    }
    entry.d_name[entry.d_name.len() - 1] = 0;
    entry
}

#[unsafe(no_mangle)]
pub extern "C" fn readdir(dir: *mut libc::DIR) -> *mut libc::dirent64 {
    match stream(dir) {
        Some(stream) => next_entry(stream),
        None => real!("readdir", fn(*mut libc::DIR) -> *mut libc::dirent64; dir),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn readdir64(dir: *mut libc::DIR) -> *mut libc::dirent64 {
    match stream(dir) {
        Some(stream) => next_entry(stream),
        None => real!("readdir64", fn(*mut libc::DIR) -> *mut libc::dirent64; dir),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn closedir(dir: *mut libc::DIR) -> c_int {
    let Some(stream) = stream(dir) else {
        return real!("closedir", fn(*mut libc::DIR) -> c_int; dir);
    };
    let fd = stream.fd;
    if let Some(streams) = STREAMS.lock().as_mut() {
        streams.remove(&(dir as usize));
    }
    STREAM_COUNT.fetch_sub(1, Ordering::AcqRel);
    // SAFETY: allocated by `open_stream` with Box; no longer registered.
    drop(unsafe { Box::from_raw(dir.cast::<DirectoryStream>()) });
    crate::files::close(fd)
}

#[unsafe(no_mangle)]
pub extern "C" fn dirfd(dir: *mut libc::DIR) -> c_int {
    match stream(dir) {
        Some(stream) => stream.fd,
        None => real!("dirfd", fn(*mut libc::DIR) -> c_int; dir),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn rewinddir(dir: *mut libc::DIR) {
    let Some(stream) = stream(dir) else {
        return real!("rewinddir", fn(*mut libc::DIR) -> (); dir);
    };
    stream.next = 0;
    if let Some(description) = descriptors::lookup(stream.fd)
        && let Ok(entries) = client().and_then(|client| listing(&client, &description))
    {
        stream.entries = entries;
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn telldir(dir: *mut libc::DIR) -> c_long {
    match stream(dir) {
        Some(stream) => stream.next as c_long,
        None => real!("telldir", fn(*mut libc::DIR) -> c_long; dir),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn seekdir(dir: *mut libc::DIR, position: c_long) {
    match stream(dir) {
        Some(stream) => stream.next = usize::try_from(position).unwrap_or(0),
        None => real!("seekdir", fn(*mut libc::DIR, c_long) -> (); dir, position),
    }
}

/// Size of a `linux_dirent64` record with a name of `name_len` bytes (8-byte aligned).
fn record_len(name_len: usize) -> usize {
    (19 + name_len + 1).next_multiple_of(8)
}

/// `getdents64` of a ringfs directory: records from the description's position (an entry
/// index); the listing is taken again when it starts over at 0.
fn directory_entries(client: &Client, description: &OpenDescription, buffer: &mut [u8]) -> Result<isize, Errno> {
    if !description.is_directory {
        return Err(Errno::ENOTDIR);
    }
    let mut position = description.position.lock();
    let mut entries = description.listing.lock();
    if *position == 0 {
        *entries = listing(client, description)?;
    }
    let mut written = 0;
    while let Some(entry) = entries.get(*position as usize) {
        let name = entry.name.as_bytes();
        let length = record_len(name.len());
        if written + length > buffer.len() {
            if written == 0 {
                return Err(Errno::EINVAL);
            }
            break;
        }
        let record = &mut buffer[written..written + length];
        record.fill(0);
        record[0..8].copy_from_slice(&entry.ino.to_ne_bytes());
        record[8..16].copy_from_slice(&(*position as i64 + 1).to_ne_bytes());
        record[16..18].copy_from_slice(&(length as u16).to_ne_bytes());
        record[18] = entry.kind;
        record[19..19 + name.len()].copy_from_slice(name);
        written += length;
        *position += 1;
    }
    Ok(written as isize)
}

/// # Safety
/// `buffer` must be `size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getdents64(fd: c_int, buffer: *mut libc::c_void, size: usize) -> isize {
    let Some(description) = descriptors::lookup(fd) else {
        return real!("getdents64", fn(c_int, *mut libc::c_void, usize) -> isize; fd, buffer, size);
    };
    guard(-1, || {
        if buffer.is_null() {
            return Err(Errno::EFAULT);
        }
        // SAFETY: the caller's buffer of `size` bytes.
        let buffer = unsafe { std::slice::from_raw_parts_mut(buffer.cast::<u8>(), size) };
        directory_entries(&client()?, &description, buffer)
    })
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    let kernel = |path| {
        let changed = real!("chdir", fn(*const c_char) -> c_int; path);
        if changed == 0 {
            set_working_directory(None);
        }
        changed
    };
    // SAFETY: forwarded contract.
    match unsafe { route_at(libc::AT_FDCWD, path) } {
        Route::Kernel => kernel(path),
        Route::KernelPath(path) => kernel(path.as_ptr()),
        Route::Error(errno) => failed(errno),
        Route::Ringfs(path) => following(
            -1,
            &path,
            || {
                let client = client()?;
                if !client.stat(&path)?.is_dir() {
                    return Err(Errno::ENOTDIR);
                }
                client.access(&path, libc::X_OK as u32)?;
                set_working_directory(Some(&path));
                Ok(0)
            },
            |outside| kernel(outside.as_ptr()),
        ),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn fchdir(fd: c_int) -> c_int {
    match descriptors::lookup(fd) {
        Some(description) if description.is_directory => {
            set_working_directory(Some(&description.path));
            0
        }
        Some(_) => failed(Errno::ENOTDIR),
        None => {
            let changed = real!("fchdir", fn(c_int) -> c_int; fd);
            if changed == 0 {
                set_working_directory(None);
            }
            changed
        }
    }
}

/// # Safety
/// `buffer` must be NULL or `size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn getcwd(buffer: *mut c_char, size: usize) -> *mut c_char {
    let Some(directory) = working_directory() else {
        return real!("getcwd", fn(*mut c_char, usize) -> *mut c_char; buffer, size);
    };
    let bytes = directory.as_bytes();
    let needed = bytes.len() + 1;
    // SAFETY: a buffer of at least `needed` bytes is written (the caller's, or malloc'd).
    unsafe {
        let destination = if buffer.is_null() { libc::malloc(needed.max(size)).cast::<c_char>() } else { buffer };
        if destination.is_null() {
            failed(Errno::ENOMEM);
            return destination;
        }
        if !buffer.is_null() && size < needed {
            failed(Errno(if size == 0 { libc::EINVAL } else { libc::ERANGE }));
            return std::ptr::null_mut();
        }
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), destination.cast(), bytes.len());
        *destination.add(bytes.len()) = 0;
        destination
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirent_records_are_eight_byte_aligned() {
        assert_eq!(record_len(1), 24);
        assert_eq!(record_len(4), 24);
        assert_eq!(record_len(5), 32);
    }
}
