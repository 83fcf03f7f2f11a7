//! Processes: what `fork` and `exec` do to the ringfs state.
//!
//! A child after `fork` has the parent's descriptors (the kernel copies the placeholders and
//! this library's table is copied with the memory), but not the parent's client: its
//! connections are shared with the parent and its background thread is not running. The
//! child therefore connects anew on first use, and reopens each inherited file by id when it
//! first touches it (`OpenDescription::handle`); positions stay shared (the kernel keeps them
//! as the placeholders' offsets, see `descriptors.rs`). Every lock of the library is held
//! across the `fork` by the forking thread (taken in `prepare`, given back in `parent` and
//! `child`), so that the child never inherits one taken by another thread: the client's,
//! the descriptor table's, then the small ones no other lock is taken under (lock owners,
//! directory streams, the working directory, `vfork` changes). A child that inherited the
//! lock owners' table taken hung at its first close (`tests/preload.rs`).
//!
//! Across `exec`, a working directory inside ringfs is handed on in the environment
//! (`RINGFS_PRELOAD_CWD`), set on `chdir` (for `execvp`, `posix_spawn`, `system`, which pass
//! the process's environment) and added by `execve` to the environment it is given (shells
//! pass their own). The ringfs descriptors that are not close-on-exec are handed on the same
//! way (`RINGFS_PRELOAD_FDS`: number, flags, file id and path of each), so that
//! `sh -c 'cmd > /ringfs/out'` and `tar -z` (whose `gzip` writes to tar's descriptor) work:
//! the new program reopens each file by id on first use, and takes a ringfs standard stream
//! into its stdio (`stdio::adopt_standard_streams`).

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int};
use std::sync::Once;

use ringfs_cglue::call::{failed, guard};
use ringfs_client::Errno;
use ringfs_config::env;

use crate::descriptors::OpenDescription;
use crate::paths::{Route, route_at};
use crate::programs::{MAX_INTERPRETERS, Program, program_at, script_arguments};
use crate::real::real;

static INSTALLED: Once = Once::new();

/// Registers the `fork` handlers, once: at load, whenever `RINGFS_MOUNT` names a prefix
/// (the only case in which a client ever connects).
pub(crate) fn install_fork_handlers() {
    INSTALLED.call_once(|| {
        // SAFETY: registering handlers with the C library; they are plain functions.
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
}

thread_local! {
    /// The library's locks, held by the forking thread across a `fork`.
    static HELD_ACROSS_FORK: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

fn hold_across_fork(guard: impl Any) {
    HELD_ACROSS_FORK.with(|held| held.borrow_mut().push(Box::new(guard)));
}

/// Gives back the locks taken in `prepare`, the last taken first.
fn release_after_fork() {
    HELD_ACROSS_FORK.with(|held| {
        let mut held = held.borrow_mut();
        while let Some(guard) = held.pop() {
            drop(guard);
        }
    });
}

extern "C" fn prepare() {
    // Parent and child will share the positions of their descriptors.
    crate::descriptors::share_positions();
    // (In the order the library nests them: the client's, the table's, then the others,
    // under which no lock is taken.)
    hold_across_fork(crate::state::lock_client_for_fork());
    hold_across_fork(crate::descriptors::lock_for_fork());
    hold_across_fork(ringfs_cglue::locks::lock_owners_for_fork());
    hold_across_fork(crate::directories::lock_for_fork());
    hold_across_fork(crate::paths::lock_for_fork());
}

extern "C" fn parent() {
    release_after_fork();
}

extern "C" fn child() {
    release_after_fork();
    crate::state::forget_client_after_fork();
    crate::descriptors::note_process();
    crate::descriptors::note_fork_child();
}

/// Runs when the library is loaded: a working directory inside ringfs inherited through
/// `exec` becomes this process's.
#[used]
#[unsafe(link_section = ".init_array")]
static INITIALIZE: extern "C" fn() = initialize;

extern "C" fn initialize() {
    crate::descriptors::note_process();
    let Some(config) = crate::state::config() else { return };
    // Before any descriptor is inherited or opened: a fork child must know it is one (a
    // process id that is not the table's owner otherwise means a vfork child).
    install_fork_handlers();
    if let Ok(encoded) = std::env::var(env::PRELOAD_FDS) {
        // Programs this one executes by other means than `execve` (`execvp`, `posix_spawn`)
        // must not take the list for theirs: the numbers may mean other files by then.
        // SAFETY: a NUL-terminated name; no other thread runs yet.
        unsafe { libc::unsetenv(crate::descriptors::descriptors_variable().as_ptr()) };
        for (fd, (path, file, directory, flags)) in encoded.split(';').filter_map(crate::descriptors::decode_descriptor) {
            if let Some(shared_position) = placeholder_kind(fd) {
                crate::descriptors::adopt(fd, OpenDescription::inherited(path, file, directory, flags, shared_position));
            }
        }
        crate::stdio::adopt_standard_streams();
    }
    if let Ok(directory) = std::env::var(env::PRELOAD_CWD)
        && let Some(path) = crate::paths::inside(&config.mount, &directory)
    {
        crate::paths::adopt_working_directory(&path);
    }
}

/// What kind of placeholder `fd` is open on, as an inherited ringfs descriptor must be:
/// `Some(true)` for one holding the position (a sealed, empty memfd), `Some(false)` for
/// `/dev/null` with `O_PATH`, `None` for anything else.
fn placeholder_kind(fd: c_int) -> Option<bool> {
    // SAFETY: all-zero is a valid `struct stat`; fstat fills it.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if real!("fstat", fn(c_int, *mut libc::stat) -> c_int; fd, &mut stat) != 0 {
        return None;
    }
    let kind = stat.st_mode & libc::S_IFMT;
    if kind == libc::S_IFCHR && stat.st_rdev == libc::makedev(1, 3) {
        let flags = real!("fcntl64", fn(c_int, c_int, usize) -> c_int; fd, libc::F_GETFL, 0);
        return (flags >= 0 && flags & libc::O_PATH != 0).then_some(false);
    }
    let seals = real!("fcntl64", fn(c_int, c_int, usize) -> c_int; fd, libc::F_GET_SEALS, 0);
    (kind == libc::S_IFREG && stat.st_size == 0 && seals == crate::descriptors::PLACEHOLDER_SEALS).then_some(true)
}

/// `execve`: the program gets the working directory inside ringfs, if this process has one,
/// in `RINGFS_PRELOAD_CWD` (and not a stale one otherwise). A ringfs path runs
/// what [`programs`](crate::programs) finds there.
///
/// # Safety
/// As `execve(2)`: NUL-terminated strings and NULL-terminated arrays.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { execute(path, argv, envp, 0) }
}

/// [`execve`] of `path`, reached through `interpreters` scripts' `#!` lines so far.
///
/// # Safety
/// As `execve(2)`.
unsafe fn execute(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char, interpreters: usize) -> c_int {
    let kernel = |path: *const c_char| {
        // SAFETY: forwarded contract.
        unsafe {
            with_handed_on_environment(
                envp,
                |envp| real!("execve", fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int; path, argv, envp),
            )
        }
    };
    // SAFETY: forwarded contract.
    let ringfs_path = match unsafe { route_at(libc::AT_FDCWD, path) } {
        Route::Kernel => return kernel(path),
        Route::KernelPath(path) => return kernel(path.as_ptr()),
        Route::Error(errno) => return failed(errno),
        Route::Ringfs(ringfs_path) => ringfs_path,
    };
    match guard(Err(()), || program_at(&ringfs_path).map(Ok)) {
        Err(()) => -1,
        Ok(Program::Kernel(program)) => kernel(program.as_ptr()),
        Ok(Program::Script { .. }) if interpreters == MAX_INTERPRETERS => failed(Errno(libc::ELOOP)),
        Ok(Program::Script { interpreter, argument }) => {
            // SAFETY: forwarded contract; the strings live until the call returns.
            unsafe {
                let arguments = script_arguments(&interpreter, argument.as_deref(), path, argv);
                execute(interpreter.as_ptr(), arguments.as_ptr(), envp, interpreters + 1)
            }
        }
    }
}

/// Calls `exec` with `envp` plus what this process hands on to the program it executes (its
/// working directory inside ringfs, its inheritable ringfs descriptors), minus stale values.
///
/// # Safety
/// `envp` must be NULL or a NULL-terminated array of NUL-terminated strings.
unsafe fn with_handed_on_environment(envp: *const *const c_char, exec: impl FnOnce(*const *const c_char) -> c_int) -> c_int {
    if crate::state::config().is_none() || envp.is_null() {
        return exec(envp);
    }
    if !crate::descriptors::in_vfork_child() {
        // The program will share the positions of the descriptors it inherits.
        crate::descriptors::share_positions();
    }
    let prefix = format!("{}=", env::PRELOAD_CWD);
    let descriptors_prefix = format!("{}=", env::PRELOAD_FDS);
    // SAFETY: a NULL-terminated array of NUL-terminated strings, by contract.
    let entries: Vec<*const c_char> = unsafe {
        let mut entries = Vec::new();
        let mut at = envp;
        while !(*at).is_null() {
            entries.push(*at);
            at = at.add(1);
        }
        entries
    };
    let ours = |entry: &*const c_char| {
        // SAFETY: each entry is NUL-terminated.
        let entry = unsafe { CStr::from_ptr(*entry) }.to_bytes();
        entry.starts_with(prefix.as_bytes()) || entry.starts_with(descriptors_prefix.as_bytes())
    };
    let directory = crate::paths::working_directory().and_then(|directory| CString::new(format!("{prefix}{directory}")).ok());
    let descriptors = Some(crate::descriptors::inherited_descriptors()).filter(|encoded| !encoded.is_empty());
    let descriptors = descriptors.and_then(|encoded| CString::new(format!("{descriptors_prefix}{encoded}")).ok());
    if directory.is_none() && descriptors.is_none() && !entries.iter().any(ours) {
        return exec(envp);
    }
    let mut environment: Vec<*const c_char> = entries.into_iter().filter(|entry| !ours(entry)).collect();
    environment.extend(directory.iter().chain(&descriptors).map(|entry| entry.as_ptr()));
    environment.push(std::ptr::null());
    exec(environment.as_ptr())
}

/// `execv`: [`execve`] with the process's environment.
///
/// # Safety
/// As `execv(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: forwarded contract; `environ` is the process's environment.
    unsafe { execve(path, argv, environ) }
}

/// `execvp`: [`execvpe`] with the process's environment.
///
/// # Safety
/// As `execvp(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { execvpe(file, argv, environ) }
}

/// `execvpe`: the C library searches `PATH`, with the environment [`execve`] would give.
///
/// # Safety
/// As `execvpe(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    // SAFETY: `file` is NUL-terminated by contract.
    if !file.is_null() && unsafe { CStr::from_ptr(file) }.to_bytes().contains(&b'/') {
        // A path, not a name to search: for a ringfs path the C library would call its own
        // `execve`, which cannot run it.
        // SAFETY: forwarded contract.
        if let Route::Ringfs(_) = unsafe { route_at(libc::AT_FDCWD, file) } {
            // SAFETY: forwarded contract.
            return unsafe { execve(file, argv, envp) };
        }
    }
    // SAFETY: forwarded contract.
    unsafe {
        with_handed_on_environment(
            envp,
            |envp| real!("execvpe", fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int; file, argv, envp),
        )
    }
}

unsafe extern "C" {
    static environ: *const *const c_char;
}

/// `vfork` is `fork` under the library (POSIX allows it): a `vfork` child runs in its
/// parent's memory, where the library's state is the parent's, and a wrapper cannot return
/// twice from its own frame. Costs the copy of the page tables `vfork` avoids.
#[unsafe(no_mangle)]
pub extern "C" fn vfork() -> libc::pid_t {
    // SAFETY: fork has no preconditions; the caller expects a child either way.
    unsafe { libc::fork() }
}
