//! Which paths are ringfs's: an absolute path under the mount prefix, a relative one while
//! the working directory is inside it, or one relative to a ringfs directory descriptor.
//!
//! The working directory inside ringfs is kept here (the kernel's stays where it was): the
//! kernel has no such directory. Paths are resolved lexically (`..` removes a component), as
//! the kernel does not see these names either.
//!
//! Symbolic links in ringfs resolve as a mount at the prefix would resolve them (the client
//! is told the prefix): an absolute target under the prefix is ringfs's, any other is the
//! kernel's. A call that follows a link leading out of ringfs is done by the kernel, at the
//! path the link leads to ([`following`]).

use std::ffi::{CStr, CString, c_char, c_int};
use std::sync::atomic::{AtomicBool, Ordering};

use ringfs_sync::RwLock;

use ringfs_cglue::call::guard;
use ringfs_client::{Errno, LEADS_OUT, LinkDestination};
use ringfs_config::env;

use crate::descriptors;
use crate::real::real;
use crate::state::{client, config};

/// Where a path argument leads.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// A ringfs path (`/dir/file`, absolute inside ringfs).
    Ringfs(String),
    /// The kernel's, unchanged.
    Kernel,
    /// The kernel's, but written relative to the ringfs working directory or directory
    /// descriptor, which the kernel does not know: here made absolute.
    KernelPath(CString),
    /// The path cannot be used (relative to a ringfs descriptor that is not a directory).
    Error(Errno),
}

/// The working directory when it is inside ringfs: the full path, prefix included.
static WORKING_DIRECTORY: RwLock<Option<String>> = RwLock::new(None);
static IN_RINGFS_DIRECTORY: AtomicBool = AtomicBool::new(false);

/// The ringfs path of `absolute` (a canonical absolute path) under `mount`, if it is one.
pub(crate) fn inside(mount: &str, absolute: &str) -> Option<String> {
    let rest = absolute.strip_prefix(mount)?;
    if rest.is_empty() {
        Some("/".to_string())
    } else if rest.starts_with('/') {
        Some(rest.to_string())
    } else {
        None
    }
}

/// `path` resolved against `base` (an absolute path) lexically; canonical.
pub(crate) fn resolve(base: &str, path: &str) -> Result<String, Errno> {
    if path.starts_with('/') { ringfs_proto::path::canonicalize(path) } else { ringfs_proto::path::canonicalize(&format!("{base}/{path}")) }
}

/// Routes an absolute or relative `path` for a call relative to `dirfd` (`AT_FDCWD`: the
/// working directory).
///
/// # Safety
/// `path` must be NULL or a NUL-terminated string.
pub(crate) unsafe fn route_at(dirfd: c_int, path: *const c_char) -> Route {
    let Some(config) = config() else { return Route::Kernel };
    if path.is_null() {
        return Route::Kernel;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    let Ok(text) = std::str::from_utf8(bytes) else { return Route::Kernel };
    route_text(&config.mount, dirfd, text)
}

fn route_text(mount: &str, dirfd: c_int, text: &str) -> Route {
    if text.starts_with('/') {
        if !text.starts_with(mount) {
            // Quick exit for the common case; `..` could still lead inside (`/x/../ringfs`).
            if !text.contains("/..") {
                return Route::Kernel;
            }
        }
        return match ringfs_proto::path::canonicalize(text) {
            Ok(absolute) => match inside(mount, &absolute) {
                Some(path) => Route::Ringfs(path),
                // `/ringfs/..`: the kernel has no `/ringfs` to go up from.
                None if inside(mount, text).is_some() => CString::new(absolute).map_or(Route::Kernel, Route::KernelPath),
                None => Route::Kernel,
            },
            Err(_) => Route::Kernel,
        };
    }
    if text.is_empty() {
        // AT_EMPTY_PATH and friends are the caller's to handle; the kernel says ENOENT.
        return Route::Kernel;
    }
    let ringfs_base = if dirfd == libc::AT_FDCWD {
        working_directory()
    } else {
        match descriptors::lookup(dirfd) {
            Some(description) if description.is_directory => Some(full_path(mount, &description.path)),
            Some(_) => return Route::Error(Errno::ENOTDIR),
            None => None,
        }
    };
    let Some(base) = ringfs_base else { return route_from_kernel_directory(mount, dirfd, text) };
    match resolve(&base, text) {
        Ok(absolute) => match inside(mount, &absolute) {
            Some(path) => Route::Ringfs(path),
            None => CString::new(absolute).map_or(Route::Error(Errno::EINVAL), Route::KernelPath),
        },
        Err(errno) => Route::Error(errno),
    }
}

/// A relative `text` from a directory of the kernel's (the working directory, or directory
/// descriptor `dirfd`): ringfs's where it leads under the prefix (`ringfs/x` from `/`; rsync
/// opens its destination one component at a time from a descriptor of `/`), as a mount at
/// the prefix would have it; the kernel's otherwise, unchanged. Only a path that may lead
/// there costs a look at where the directory is.
fn route_from_kernel_directory(mount: &str, dirfd: c_int, text: &str) -> Route {
    if !may_lead_into(mount, text) {
        return Route::Kernel;
    }
    let Some(base) = kernel_directory(dirfd) else { return Route::Kernel };
    match resolve(&base, text).ok().and_then(|absolute| inside(mount, &absolute)) {
        Some(path) => Route::Ringfs(path),
        None => Route::Kernel,
    }
}

/// Whether relative `text` may lead from some directory into `mount`: it goes up (`..`), or
/// its first component is one of the prefix's.
fn may_lead_into(mount: &str, text: &str) -> bool {
    let first = text.split('/').next().unwrap_or_default();
    text.split('/').any(|component| component == "..") || mount.split('/').any(|component| !component.is_empty() && component == first)
}

/// Where the kernel's directory `dirfd` (or its working directory, for `AT_FDCWD`) is, as
/// the kernel reports it; `None` if that is not a path (a directory removed since).
fn kernel_directory(dirfd: c_int) -> Option<String> {
    let mut buffer = vec![0u8; libc::PATH_MAX as usize + 1];
    let len = if dirfd == libc::AT_FDCWD {
        let found = real!("getcwd", fn(*mut c_char, usize) -> *mut c_char; buffer.as_mut_ptr().cast(), buffer.len());
        if found.is_null() {
            return None;
        }
        buffer.iter().position(|byte| *byte == 0)?
    } else {
        let link = CString::new(format!("/proc/self/fd/{dirfd}")).ok()?;
        let len =
            real!("readlink", fn(*const c_char, *mut c_char, usize) -> isize; link.as_ptr(), buffer.as_mut_ptr().cast(), buffer.len());
        usize::try_from(len).ok().filter(|len| *len < buffer.len())?
    };
    let path = std::str::from_utf8(&buffer[..len]).ok()?;
    (path.starts_with('/') && !path.ends_with(" (deleted)")).then(|| path.to_string())
}

/// Runs `ringfs`, an operation on ringfs path `path` that follows its symbolic links, for a C
/// caller (as [`ringfs_call`]); when a link leads out of ringfs, runs `kernel` instead with
/// the kernel's path it leads to.
pub(crate) fn following<T>(failure: T, path: &str, ringfs: impl FnOnce() -> Result<T, Errno>, kernel: impl FnOnce(&CStr) -> T) -> T {
    let mut outside = None;
    let value = guard(failure, || match ringfs() {
        Err(LEADS_OUT) => {
            outside = where_links_lead_out(path)?;
            Err(LEADS_OUT)
        }
        other => other,
    });
    match outside {
        Some(kernel_path) => kernel(&kernel_path),
        None => value,
    }
}

/// The kernel's path the symbolic links at ringfs path `path` lead to, if they lead out of
/// ringfs.
pub(crate) fn where_links_lead_out(path: &str) -> Result<Option<CString>, Errno> {
    match client()?.resolve_links(path)? {
        LinkDestination::Outside(kernel_path) => CString::new(kernel_path).map(Some).map_err(|_| Errno::EINVAL),
        LinkDestination::Ringfs(_) => Ok(None),
    }
}

/// The path the program sees for ringfs path `path`.
pub(crate) fn full_path(mount: &str, path: &str) -> String {
    if path == "/" { mount.to_string() } else { format!("{mount}{path}") }
}

/// Makes ringfs path `path` the working directory (`None`: the kernel's is again), and tells
/// the programs this process will execute (see `process.rs`).
pub(crate) fn set_working_directory(path: Option<&str>) {
    let full = path.and_then(|path| config().map(|config| full_path(&config.mount, path)));
    let was_inside = IN_RINGFS_DIRECTORY.load(Ordering::Acquire);
    let name = CString::new(env::PRELOAD_CWD).expect("a variable name holds no NUL");
    match &full {
        // SAFETY: setenv and unsetenv with NUL-terminated strings (a program that reads its
        // environment in another thread at this moment races, as with its own setenv).
        Some(directory) => {
            if let Ok(value) = CString::new(directory.as_str()) {
                unsafe { libc::setenv(name.as_ptr(), value.as_ptr(), 1) };
            }
        }
        None if was_inside => unsafe {
            libc::unsetenv(name.as_ptr());
        },
        None => {}
    }
    let mut directory = WORKING_DIRECTORY.write();
    IN_RINGFS_DIRECTORY.store(full.is_some(), Ordering::Release);
    *directory = full;
}

/// Takes ringfs path `path` as the working directory inherited from the program that
/// executed this one (the environment says so already).
pub(crate) fn adopt_working_directory(path: &str) {
    let full = config().map(|config| full_path(&config.mount, path));
    let mut directory = WORKING_DIRECTORY.write();
    IN_RINGFS_DIRECTORY.store(full.is_some(), Ordering::Release);
    *directory = full;
}

/// The working directory's lock, for the `fork` handler to hold across the `fork` (see
/// `process.rs`).
pub(crate) fn lock_for_fork() -> impl std::any::Any {
    WORKING_DIRECTORY.write()
}

/// The working directory when it is inside ringfs.
pub(crate) fn working_directory() -> Option<String> {
    if !IN_RINGFS_DIRECTORY.load(Ordering::Acquire) {
        return None;
    }
    WORKING_DIRECTORY.read().clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_paths_under_the_prefix_are_ringfs_paths() {
        assert_eq!(route_text("/ringfs", libc::AT_FDCWD, "/ringfs"), Route::Ringfs("/".into()));
        assert_eq!(route_text("/ringfs", libc::AT_FDCWD, "/ringfs/"), Route::Ringfs("/".into()));
        assert_eq!(route_text("/ringfs", libc::AT_FDCWD, "/ringfs/a//b/./c"), Route::Ringfs("/a/b/c".into()));
        assert_eq!(route_text("/ringfs", libc::AT_FDCWD, "/tmp/../ringfs/x"), Route::Ringfs("/x".into()));
    }

    #[test]
    fn other_paths_are_the_kernels() {
        assert_eq!(route_text("/ringfs", libc::AT_FDCWD, "/ringfsx/a"), Route::Kernel);
        assert_eq!(route_text("/ringfs", libc::AT_FDCWD, "/ringfs/../etc/passwd"), Route::KernelPath(c"/etc/passwd".into()));
        assert_eq!(route_text("/ringfs", libc::AT_FDCWD, "/etc/passwd"), Route::Kernel);
        // Relative paths while the working directory is the kernel's.
        assert_eq!(route_text("/ringfs", libc::AT_FDCWD, "a/b"), Route::Kernel);
    }

    #[test]
    fn only_relative_paths_that_may_reach_the_prefix_ask_where_a_kernel_directory_is() {
        assert!(may_lead_into("/ringfs", "ringfs"));
        assert!(may_lead_into("/ringfs", "ringfs/work"));
        assert!(may_lead_into("/scratch/job", "job/x"));
        assert!(may_lead_into("/ringfs", "../x"));
        assert!(may_lead_into("/ringfs", "a/../../ringfs"));
        assert!(!may_lead_into("/ringfs", "src/main.c"));
        assert!(!may_lead_into("/ringfs", "ringfsx"));
        assert!(!may_lead_into("/ringfs", ""));
    }

    #[test]
    fn relative_paths_from_kernel_directories_lead_into_the_prefix() {
        let root = std::fs::File::open("/").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&root);
        assert_eq!(route_from_kernel_directory("/ringfs", fd, "ringfs"), Route::Ringfs("/".into()));
        assert_eq!(route_from_kernel_directory("/ringfs", fd, "ringfs/work/a"), Route::Ringfs("/work/a".into()));
        assert_eq!(route_from_kernel_directory("/ringfs", fd, "tmp/../ringfs/b"), Route::Ringfs("/b".into()));
        assert_eq!(route_from_kernel_directory("/ringfs", fd, "etc/passwd"), Route::Kernel);
        assert_eq!(route_from_kernel_directory("/ringfs", fd, "ringfsx"), Route::Kernel);
        let tmp = std::fs::File::open("/tmp").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&tmp);
        assert_eq!(route_from_kernel_directory("/ringfs", fd, "../ringfs/c"), Route::Ringfs("/c".into()));
        assert_eq!(route_from_kernel_directory("/ringfs", fd, "ringfs"), Route::Kernel, "/tmp/ringfs is not the prefix");
    }

    #[test]
    fn resolution_is_lexical() {
        assert_eq!(resolve("/ringfs/a", "../b").unwrap(), "/ringfs/b");
        assert_eq!(resolve("/ringfs/a", "/x").unwrap(), "/x");
        assert_eq!(inside("/ringfs", "/ringfs/a"), Some("/a".into()));
        assert_eq!(inside("/ringfs", "/ringfsa"), None);
    }
}
