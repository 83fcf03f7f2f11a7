//! The ringfs descriptors of the process: kernel descriptor numbers, each holding a
//! placeholder, mapped to the open file they stand for.
//!
//! Every ringfs open reserves a kernel descriptor — a *placeholder* — and hands out its
//! number, so ringfs and kernel descriptors can never collide, and what the kernel keeps per
//! descriptor is the kernel's own doing: the close-on-exec flag, `dup2` onto a number in use,
//! the lowest free number. A placeholder starts as `/dev/null` opened with `O_PATH` (copied
//! with `F_DUPFD` from one base placeholder: 0.5 µs), and the file position lives in the
//! [`OpenDescription`]. When the process is about to share its descriptors with another one
//! (`fork`, `exec`), each placeholder is replaced by an empty `memfd` sealed against writes
//! and growth (10 µs) whose kernel offset holds the position from then on: the kernel shares
//! it between the processes as POSIX wants (`(ls; ls) > /ringfs/out` appends the second
//! listing after the first). A program that reaches a placeholder behind the library's back
//! (a direct system call) reads nothing and cannot write, never another file's bytes.
//!
//! Several descriptors (`dup`, `fcntl(F_DUPFD)`) share one [`OpenDescription`] — its position
//! and status flags — as POSIX says. Invariant: no lock of this module is held while the
//! client or the C library is called (the client's own sockets pass through this library).

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use ringfs_sync::Mutex;

use ringfs_cglue::call::errno;
use ringfs_cglue::locks::{description_owner, forget_owners};
use ringfs_client::{Client, Errno, Fd, FileId, OpenFlags, Stat};
use ringfs_config::env;

use crate::real::real;
use crate::state::{client, generation};

/// One entry of a directory listing, as `readdir` and `getdents64` give it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ListedEntry {
    pub name: std::ffi::CString,
    pub ino: u64,
    /// `DT_*` type.
    pub kind: u8,
}

/// An open file of ringfs: what the descriptors of one `open` share.
pub(crate) struct OpenDescription {
    /// The ringfs path it was opened by (its name may change; the file stays).
    pub path: String,
    pub file: FileId,
    pub is_directory: bool,
    /// The open's flags (`O_ACCMODE`, `O_APPEND`, `O_NONBLOCK`, …), as `F_GETFL` reports them.
    pub status_flags: AtomicI32,
    /// The position (for a directory, the index of the next entry `getdents64` gives); once
    /// `shared_position`, the placeholder's kernel offset is, and this lock only serializes
    /// this process's reads, writes and seeks.
    pub position: Mutex<u64>,
    /// The position is the placeholder's offset (a memfd), shared with other processes.
    shared_position: AtomicBool,
    /// The client's descriptor of a regular file, with the generation it was opened in (a
    /// child after `fork` opens the file again by id). `None` for directories, `O_PATH`
    /// opens and other kinds: they are reached by file id.
    handle: Mutex<Option<(u64, Fd)>>,
    /// A directory's listing, taken when `getdents64` starts at position 0.
    pub listing: Mutex<Vec<ListedEntry>>,
}

impl OpenDescription {
    pub(crate) fn new(path: String, stat: &Stat, flags: i32, handle: Option<Fd>) -> OpenDescription {
        OpenDescription {
            path,
            file: stat.file,
            is_directory: stat.is_dir(),
            status_flags: AtomicI32::new(flags & !(libc::O_CLOEXEC | libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOCTTY)),
            position: Mutex::new(0),
            shared_position: AtomicBool::new(false),
            handle: Mutex::new(handle.map(|fd| (generation(), fd))),
            listing: Mutex::new(Vec::new()),
        }
    }

    /// The client's descriptor of this open file, opened again by id in a child after `fork`.
    /// EBADF for opens without one (directories: EISDIR is the caller's to say).
    pub(crate) fn handle(&self, client: &Client) -> Result<Fd, Errno> {
        let mut handle = self.handle.lock();
        let (opened_in, fd) = handle.ok_or(if self.is_directory { Errno::EISDIR } else { Errno::EBADF })?;
        let now = generation();
        if opened_in == now {
            return Ok(fd);
        }
        let flags = OpenFlags::from_posix(self.status_flags.load(Ordering::Relaxed) & libc::O_ACCMODE);
        let fd = client.open_file(self.file, flags)?;
        *handle = Some((now, fd));
        Ok(fd)
    }

    /// An open file inherited through `exec`: the client's descriptor is opened by id on
    /// first use (as after `fork`).
    pub(crate) fn inherited(path: String, file: FileId, is_directory: bool, flags: i32, shared_position: bool) -> OpenDescription {
        OpenDescription {
            path,
            file,
            is_directory,
            status_flags: AtomicI32::new(flags),
            position: Mutex::new(0),
            shared_position: AtomicBool::new(shared_position),
            // Generation 0 is never current: the first use opens the file.
            handle: Mutex::new((!is_directory && flags & libc::O_PATH == 0).then_some((0, Fd(0)))),
            listing: Mutex::new(Vec::new()),
        }
    }

    /// The position of descriptor `fd` of this open file; `held` is the locked
    /// [`OpenDescription::position`].
    pub(crate) fn position_at(&self, held: &u64, fd: i32) -> Result<u64, Errno> {
        if !self.shared_position.load(Ordering::Acquire) {
            return Ok(*held);
        }
        let at = real!("lseek64", fn(libc::c_int, libc::off_t, libc::c_int) -> libc::off_t; fd, 0, libc::SEEK_CUR);
        u64::try_from(at).map_err(|_| Errno(errno()))
    }

    /// Moves the position of descriptor `fd` of this open file to `at`.
    pub(crate) fn move_to(&self, held: &mut u64, fd: i32, at: u64) -> Result<(), Errno> {
        *held = at;
        if self.shared_position.load(Ordering::Acquire) {
            let offset = libc::off_t::try_from(at).map_err(|_| Errno::EFBIG)?;
            if real!("lseek64", fn(libc::c_int, libc::off_t, libc::c_int) -> libc::off_t; fd, offset, libc::SEEK_SET) < 0 {
                return Err(Errno(errno()));
            }
        }
        Ok(())
    }

    /// The file's attributes.
    pub(crate) fn stat(&self, client: &Client) -> Result<Stat, Errno> {
        if self.has_handle() { client.fstat(self.handle(client)?) } else { client.stat_id(self.file) }
    }

    fn has_handle(&self) -> bool {
        self.handle.lock().is_some()
    }

    pub(crate) fn flags(&self) -> i32 {
        self.status_flags.load(Ordering::Relaxed)
    }

    pub(crate) fn readable(&self) -> bool {
        self.flags() & libc::O_ACCMODE != libc::O_WRONLY && self.flags() & libc::O_PATH == 0
    }

    /// A number that tells this open file description from every other one alive (its
    /// address), for the owner of its OFD locks and `flock`.
    pub(crate) fn identity(&self) -> u64 {
        self as *const OpenDescription as u64
    }

    pub(crate) fn writable(&self) -> bool {
        matches!(self.flags() & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR) && self.flags() & libc::O_PATH == 0
    }
}

impl Drop for OpenDescription {
    /// The last descriptor of the open file went: the client closes it (in the generation it
    /// was opened in; an inherited one is the parent's to close).
    fn drop(&mut self) {
        let handle = self.handle.get_mut().take();
        if let Some((opened_in, fd)) = handle
            && opened_in == generation()
            && opened_in != 0
            && let Ok(client) = client()
        {
            let own = description_owner(self.identity());
            for owner in forget_owners(self.file, |owner| owner == own) {
                let _ = client.release_locks(fd, owner);
            }
            let _ = client.close(fd);
        }
    }
}

/// Descriptor number → open file. Indexed by the kernel descriptor number.
///
/// A `std` lock used directly (the others here are `ringfs_sync`'s, which are `std`'s too,
/// for the fork safety that crate explains): the thread that forks holds it across `fork`
/// in a guard of its own and lets it go in the child, so that no other thread holds it at
/// the moment the child is copied. (`state.rs`'s client lock is kept the same way.) A panic
/// while it is held cannot leave the table half-changed, so a poisoned lock is used as it is.
static TABLE: RwLock<Vec<Option<Arc<OpenDescription>>>> = RwLock::new(Vec::new());
/// How many ringfs descriptors are open: calls on kernel descriptors skip the table while
/// there are none.
static OPEN_COUNT: AtomicUsize = AtomicUsize::new(0);

/// The open file behind `fd`, if it is a ringfs descriptor.
pub(crate) fn lookup(fd: i32) -> Option<Arc<OpenDescription>> {
    if fd < 0 || OPEN_COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    let table = TABLE.read().unwrap_or_else(|poisoned| poisoned.into_inner());
    table.get(fd as usize).and_then(Option::clone)
}

/// Makes `fd` (a placeholder the caller holds) stand for `description`; returns what it
/// stood for before, for the caller to drop outside the lock.
fn install(fd: i32, description: Arc<OpenDescription>) -> Option<Arc<OpenDescription>> {
    let mut table = TABLE.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    let index = fd as usize;
    if table.len() <= index {
        table.resize(index + 1, None);
    }
    let previous = table[index].replace(description);
    if previous.is_none() {
        OPEN_COUNT.fetch_add(1, Ordering::AcqRel);
    }
    previous
}

/// Every ringfs descriptor with its open file.
pub(crate) fn all() -> Vec<(i32, Arc<OpenDescription>)> {
    let table = TABLE.read().unwrap_or_else(|poisoned| poisoned.into_inner());
    table.iter().enumerate().filter_map(|(fd, slot)| Some((fd as i32, slot.clone()?))).collect()
}

/// Makes inherited descriptor `fd` (its placeholder came through `exec`) stand for
/// `description`.
pub(crate) fn adopt(fd: i32, description: OpenDescription) {
    drop(install(fd, Arc::new(description)));
}

/// Forgets `fd`; the open file it stood for, if any.
pub(crate) fn remove(fd: i32) -> Option<Arc<OpenDescription>> {
    if fd < 0 || OPEN_COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    let mut table = TABLE.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    let removed = table.get_mut(fd as usize).and_then(Option::take);
    drop(table);
    if removed.is_some() {
        OPEN_COUNT.fetch_sub(1, Ordering::AcqRel);
        descriptors_changed();
    }
    removed
}

/// The seals of a placeholder: it stays empty and cannot be written.
pub(crate) const PLACEHOLDER_SEALS: libc::c_int = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;

/// A placeholder that can hold a position: a sealed, empty memfd (close-on-exec).
fn new_shared_placeholder() -> Result<i32, Errno> {
    let flags = libc::MFD_ALLOW_SEALING | libc::MFD_CLOEXEC;
    let fd = real!("memfd_create", fn(*const libc::c_char, libc::c_uint) -> libc::c_int; c"ringfs-placeholder".as_ptr(), flags);
    if fd < 0 {
        return Err(Errno(errno()));
    }
    if real!("fcntl64", fn(libc::c_int, libc::c_int, usize) -> libc::c_int; fd, libc::F_ADD_SEALS, PLACEHOLDER_SEALS as usize) != 0 {
        let errno = errno();
        real!("close", fn(libc::c_int) -> libc::c_int; fd);
        return Err(Errno(errno));
    }
    Ok(fd)
}

/// Before this process shares its descriptors (`fork`, `exec`): every open file whose
/// position still lives in this process gets a placeholder that holds it in the kernel, on
/// all its descriptor numbers (each keeping its close-on-exec flag). Directories keep theirs
/// (a listing index). Best effort: a placeholder that cannot be made leaves the position here.
pub(crate) fn share_positions() {
    let descriptors = all();
    for (index, (_, description)) in descriptors.iter().enumerate() {
        let first = descriptors.iter().position(|(_, other)| Arc::ptr_eq(other, description)) == Some(index);
        if !first || description.is_directory || description.shared_position.load(Ordering::Acquire) {
            continue;
        }
        let held = description.position.lock();
        let Ok(placeholder) = new_shared_placeholder() else { continue };
        let offset = libc::off_t::try_from(*held).unwrap_or(0);
        real!("lseek64", fn(libc::c_int, libc::off_t, libc::c_int) -> libc::off_t; placeholder, offset, libc::SEEK_SET);
        for (fd, _) in descriptors.iter().filter(|(_, other)| Arc::ptr_eq(other, description)) {
            let fd_flags = real!("fcntl64", fn(libc::c_int, libc::c_int, usize) -> libc::c_int; *fd, libc::F_GETFD, 0);
            let cloexec = if fd_flags >= 0 && fd_flags & libc::FD_CLOEXEC != 0 { libc::O_CLOEXEC } else { 0 };
            real!("dup3", fn(libc::c_int, libc::c_int, libc::c_int) -> libc::c_int; placeholder, *fd, cloexec);
        }
        real!("close", fn(libc::c_int) -> libc::c_int; placeholder);
        description.shared_position.store(true, Ordering::Release);
    }
}

/// The first placeholder, which new ones are copied from (`F_DUPFD` costs a sixth of an
/// `open` of `/dev/null`); -1 until needed, or after the program closed its number.
static BASE_PLACEHOLDER: AtomicI32 = AtomicI32::new(-1);

fn open_placeholder(flags: libc::c_int) -> libc::c_int {
    real!("open", fn(*const libc::c_char, libc::c_int, libc::c_uint) -> libc::c_int; c"/dev/null".as_ptr(), libc::O_PATH | flags, 0)
}

/// The base placeholder's number, or -1.
pub(crate) fn base_placeholder() -> i32 {
    BASE_PLACEHOLDER.load(Ordering::Acquire)
}

/// The program closed (or replaced) kernel descriptor `fd`: if it was the base placeholder,
/// a new one is opened when next needed.
pub(crate) fn kernel_descriptor_closed(fd: i32) {
    let _ = BASE_PLACEHOLDER.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Acquire);
}

/// A new descriptor for `description`: reserves a kernel descriptor number (close-on-exec
/// when `cloexec`) and maps it.
pub(crate) fn allocate(description: Arc<OpenDescription>, cloexec: bool) -> Result<i32, Errno> {
    let mut base = BASE_PLACEHOLDER.load(Ordering::Acquire);
    if base < 0 {
        base = open_placeholder(libc::O_CLOEXEC);
        if base < 0 {
            return Err(Errno(errno()));
        }
        if let Err(other) = BASE_PLACEHOLDER.compare_exchange(-1, base, Ordering::AcqRel, Ordering::Acquire) {
            real!("close", fn(libc::c_int) -> libc::c_int; base);
            base = other;
        }
    }
    let command = if cloexec { libc::F_DUPFD_CLOEXEC } else { libc::F_DUPFD };
    let mut fd = real!("fcntl64", fn(libc::c_int, libc::c_int, usize) -> libc::c_int; base, command, 0);
    if fd < 0 && errno() == libc::EBADF {
        // Closed behind the library's back (a direct system call): open one afresh.
        kernel_descriptor_closed(base);
        fd = open_placeholder(if cloexec { libc::O_CLOEXEC } else { 0 });
    }
    if fd < 0 {
        return Err(Errno(errno()));
    }
    drop(install(fd, description));
    reserve_vfork_room();
    descriptors_changed();
    Ok(fd)
}

/// After the kernel made `new_fd` a copy of `old_fd`'s placeholder (`dup`, `dup2`,
/// `F_DUPFD`): `new_fd` shares the open file of `old_fd`. What `new_fd` stood for before is
/// dropped (the kernel closed it).
pub(crate) fn duplicated(new_fd: i32, description: Arc<OpenDescription>) {
    drop(install(new_fd, description));
    descriptors_changed();
}

/// The table's lock and the `vfork` changes' lock, for the `fork` handler to hold across
/// the `fork` (see `process.rs`).
pub(crate) fn lock_for_fork() -> impl std::any::Any {
    let table = TABLE.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    (table, VFORK_CHANGES.lock())
}

// ---- vfork children ----
//
// A `vfork` child (Python's `subprocess`, `posix_spawn`) runs in its parent's memory until it
// executes a program: changing the table there would change the parent's. So in such a child
// the kernel's descriptors change as asked, and the table's changes are noted aside, by the
// child's process id, for `exec` to hand on; the parent's table stays as it was.

/// The process id this library's state belongs to (set at load and after `fork`).
static PROCESS_ID: AtomicI32 = AtomicI32::new(0);

/// Records the id of the process the state belongs to.
pub(crate) fn note_process() {
    // SAFETY: getpid has no preconditions.
    PROCESS_ID.store(unsafe { libc::getpid() }, Ordering::Release);
}

/// Whether this is a `vfork` child running in the memory of the process that owns the table.
pub(crate) fn in_vfork_child() -> bool {
    let owner = PROCESS_ID.load(Ordering::Acquire);
    // SAFETY: getpid has no preconditions.
    owner != 0 && unsafe { libc::getpid() } != owner
}

/// A change of descriptor `fd` made by `vfork` child `pid`: now `description`, or closed.
struct VforkChange {
    pid: i32,
    fd: i32,
    description: Option<std::sync::Weak<OpenDescription>>,
}

/// Room is reserved while the owner runs, so a `vfork` child never allocates for it.
const VFORK_CHANGES_ROOM: usize = 64;
static VFORK_CHANGES: Mutex<Vec<VforkChange>> = Mutex::new(Vec::new());

fn reserve_vfork_room() {
    let mut changes = VFORK_CHANGES.lock();
    if changes.capacity() < VFORK_CHANGES_ROOM {
        changes.reserve_exact(VFORK_CHANGES_ROOM);
    }
}

/// In a `vfork` child: notes that `fd` now stands for `description` (`None`: closed).
pub(crate) fn changed_in_vfork_child(fd: i32, description: Option<&Arc<OpenDescription>>) {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut changes = VFORK_CHANGES.lock();
    // Changes of earlier children are stale; their weak references free nothing.
    changes.retain(|change| change.pid == pid && change.fd != fd);
    if changes.len() < changes.capacity() {
        changes.push(VforkChange { pid, fd, description: description.map(Arc::downgrade) });
    }
}

/// The ringfs descriptors of this process as an `exec` sees them: the table, with the
/// changes a `vfork` child made.
pub(crate) fn all_for_exec() -> Vec<(i32, Arc<OpenDescription>)> {
    let mut descriptors = all();
    if !in_vfork_child() {
        return descriptors;
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let changes = VFORK_CHANGES.lock();
    for change in changes.iter().filter(|change| change.pid == pid) {
        descriptors.retain(|(fd, _)| *fd != change.fd);
        if let Some(description) = change.description.as_ref().and_then(std::sync::Weak::upgrade) {
            descriptors.push((change.fd, description));
        }
    }
    descriptors
}

// ---- handed on across `exec` ----
//
// The ringfs descriptors that are not close-on-exec travel to the executed program in
// `RINGFS_PRELOAD_FDS` (see `process.rs`, which sets it for `execve` and reads it at load).

/// The name of the variable that hands ringfs descriptors to executed programs, for
/// `setenv`.
pub(crate) fn descriptors_variable() -> CString {
    CString::new(env::PRELOAD_FDS).expect("a variable name holds no NUL")
}

/// `fd,flags,anchor,serial,directory,hex(path)` of a descriptor handed on (its position
/// travels as its placeholder's offset).
fn encode_descriptor(fd: i32, description: &OpenDescription) -> String {
    let path: String = description.path.bytes().map(|byte| format!("{byte:02x}")).collect();
    let file = description.file;
    format!("{fd},{},{},{},{},{path}", description.flags(), file.anchor, file.serial, u8::from(description.is_directory))
}

/// A handed-on descriptor: its number, and the path, file id, kind and flags of its open file.
pub(crate) fn decode_descriptor(text: &str) -> Option<(i32, (String, FileId, bool, i32))> {
    let fields: Vec<&str> = text.split(',').collect();
    let [fd, flags, anchor, serial, directory, path] = fields[..] else { return None };
    let path = (0..path.len())
        .step_by(2)
        .map(|at| path.get(at..at + 2).and_then(|hex| u8::from_str_radix(hex, 16).ok()))
        .collect::<Option<Vec<u8>>>()
        .and_then(|bytes| String::from_utf8(bytes).ok())?;
    let file = FileId { anchor: anchor.parse().ok()?, serial: serial.parse().ok()? };
    Some((fd.parse().ok()?, (path, file, directory == "1", flags.parse().ok()?)))
}

/// The ringfs descriptors an `exec` keeps (not close-on-exec), encoded.
pub(crate) fn inherited_descriptors() -> String {
    all_for_exec()
        .into_iter()
        .filter(|(fd, _)| {
            let flags = real!("fcntl64", fn(libc::c_int, libc::c_int, usize) -> libc::c_int; *fd, libc::F_GETFD, 0);
            flags >= 0 && flags & libc::FD_CLOEXEC == 0
        })
        .map(|(fd, description)| encode_descriptor(fd, &description))
        .collect::<Vec<_>>()
        .join(";")
}

/// Whether this process is the child of a `fork` (its next step is often an `exec`).
static FORKED: AtomicBool = AtomicBool::new(false);

/// In a `fork` child: hands the descriptors on from now on (see [`descriptors_changed`]).
pub(crate) fn note_fork_child() {
    FORKED.store(true, Ordering::Relaxed);
    descriptors_changed();
}

/// In the child of a `fork`, the ringfs descriptors an `exec` would keep are also written
/// to the process's environment after every change, for the `exec` variants that reach the
/// kernel without passing through this library (`execl`, `execlp`: glibc calls its internal
/// `execve`). `tar -z` runs `gzip` that way on its archive's descriptor.
pub(crate) fn descriptors_changed() {
    // (A vfork child shares its parent's environment: it must not change it.)
    if !FORKED.load(Ordering::Relaxed) || in_vfork_child() {
        return;
    }
    let encoded = inherited_descriptors();
    let name = descriptors_variable();
    // SAFETY: NUL-terminated strings; a forked child normally runs one thread.
    unsafe {
        match CString::new(encoded) {
            Ok(value) if !value.is_empty() => libc::setenv(name.as_ptr(), value.as_ptr(), 1),
            _ => libc::unsetenv(name.as_ptr()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handed_on_descriptor_decodes_to_what_was_encoded() {
        let file = FileId { anchor: 7, serial: 9 };
        let description = OpenDescription::inherited("/in put/ü,;".to_string(), file, false, libc::O_RDWR | libc::O_APPEND, false);
        let encoded = encode_descriptor(5, &description);
        assert!(!encoded.contains(';') && encoded.matches(',').count() == 5, "{encoded}");
        assert_eq!(decode_descriptor(&encoded), Some((5, ("/in put/ü,;".to_string(), file, false, libc::O_RDWR | libc::O_APPEND))));
    }

    #[test]
    fn a_malformed_handed_on_descriptor_is_ignored() {
        assert_eq!(decode_descriptor("5,2,7,9,0"), None);
        assert_eq!(decode_descriptor("5,2,7,9,0,2f6"), None, "odd hex");
        assert_eq!(decode_descriptor("5,2,7,9,0,ff"), None, "not UTF-8");
        assert_eq!(decode_descriptor("x,2,7,9,0,2f"), None);
    }
}
