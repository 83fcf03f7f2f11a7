//! The process's ringfs state: the configuration read from the environment once, the client
//! (connected on first use, and again in a child after `fork`), and the file mode mask.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use ringfs_client::{Client, ClientConfig, ConnectError, Errno};
use ringfs_config::env;

/// Where ringfs appears in the process's file namespace, from `RINGFS_MOUNT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PreloadConfig {
    /// The prefix, absolute and without a trailing slash (`/ringfs`); never `/` itself.
    pub mount: String,
}

impl PreloadConfig {
    /// The configuration in `mount_variable` (the value of `RINGFS_MOUNT`), or `None` when it
    /// names no usable prefix (unset, relative, or `/`): then every call goes to the kernel.
    pub(crate) fn from_mount_variable(mount_variable: Option<&str>) -> Option<PreloadConfig> {
        let value = mount_variable?;
        if !value.starts_with('/') {
            return None;
        }
        let mount = ringfs_proto::path::canonicalize(value).ok()?;
        (mount != "/").then_some(PreloadConfig { mount })
    }
}

static CONFIG: OnceLock<Option<PreloadConfig>> = OnceLock::new();

/// The configuration, read from the environment on first use.
pub(crate) fn config() -> Option<&'static PreloadConfig> {
    CONFIG.get_or_init(|| PreloadConfig::from_mount_variable(std::env::var(env::MOUNT).ok().as_deref())).as_ref()
}

/// Bumped in the child of every `fork`: the client of the parent (its connections, its
/// background thread) is not the child's, which connects again on first use.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// The client of this process, with the generation it was connected in. Held across `fork`,
/// so a `std` lock (see `TABLE` in `descriptors.rs`).
static CLIENT: Mutex<Option<(u64, Client)>> = Mutex::new(None);

/// The generation of this process (see [`GENERATION`]).
pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// The process's client, connected on first use (from the same variables as the C library:
/// `RINGFS_SERVER` or `RINGFS_RUN_DIR`, `RINGFS_SECRET`, …). EIO when no server answers.
pub(crate) fn client() -> Result<Client, Errno> {
    let generation = generation();
    let mut slot = CLIENT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((connected_in, client)) = slot.as_ref()
        && *connected_in == generation
    {
        return Ok(client.clone());
    }
    if let Some((_, inherited)) = slot.take() {
        // The parent's client: its sockets are shared with the parent and its thread does not
        // exist here. Dropping it would talk on the parent's connections; it is let go.
        std::mem::forget(inherited);
    }
    let client = fresh_client()?;
    *slot = Some((generation, client.clone()));
    Ok(client)
}

/// A client connected now, not kept as the process's: [`client`] makes the process's with
/// it, and `exec` uses one of its own, because a child between `fork` and `exec` may have
/// closed every descriptor it does not hand on — the process client's sockets too (Python's
/// `subprocess` does, after its `chdir`).
pub(crate) fn fresh_client() -> Result<Client, Errno> {
    // Symbolic links resolve as a mount at the prefix would resolve them.
    let seen_at = |client_config: ClientConfig| ClientConfig { mounted_at: config().map(|config| config.mount.clone()), ..client_config };
    ClientConfig::from_env().map(seen_at).and_then(Client::connect).map_err(|error| {
        report_once(&format!("ringfs preload: cannot reach the file system: {error}"));
        match error {
            ConnectError::Refused(errno) => errno,
            _ => Errno::EIO,
        }
    })
}

/// Called in the child after `fork`, single-threaded: the next [`client`] connects anew.
pub(crate) fn forget_client_after_fork() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// The client's lock, for the `fork` handler to hold across the `fork` (see `process.rs`).
pub(crate) fn lock_client_for_fork() -> impl std::any::Any {
    CLIENT.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The mode mask new files and directories are created with, as the kernel applies it.
static UMASK: AtomicU32 = AtomicU32::new(u32::MAX);

/// Applies the process's umask to the mode of a file being created.
pub(crate) fn masked(mode: u32) -> u32 {
    let mut mask = UMASK.load(Ordering::Relaxed);
    if mask == u32::MAX {
        mask = read_umask();
        UMASK.store(mask, Ordering::Relaxed);
    }
    mode & !mask & 0o7777
}

/// Remembers the mask `umask(2)` just set.
pub(crate) fn remember_umask(mask: u32) {
    UMASK.store(mask & 0o777, Ordering::Relaxed);
}

/// The umask from `/proc/self/status` (changing it to read it would race other threads).
fn read_umask() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|line| line.strip_prefix("Umask:")).and_then(|value| u32::from_str_radix(value.trim(), 8).ok()).unwrap_or(0o022)
}

static REPORTED: AtomicBool = AtomicBool::new(false);

/// Prints `message` on stderr, once per process.
pub(crate) fn report_once(message: &str) {
    if !REPORTED.swap(true, Ordering::Relaxed) {
        let line = format!("{message}\n");
        // SAFETY: writing a buffer we own to stderr.
        unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_prefix_is_absolute_canonical_and_never_the_root() {
        assert_eq!(PreloadConfig::from_mount_variable(Some("/ringfs/")).unwrap().mount, "/ringfs");
        assert_eq!(PreloadConfig::from_mount_variable(Some("/a//b/./c")).unwrap().mount, "/a/b/c");
        assert_eq!(PreloadConfig::from_mount_variable(Some("/")), None);
        assert_eq!(PreloadConfig::from_mount_variable(Some("ringfs")), None);
        assert_eq!(PreloadConfig::from_mount_variable(None), None);
    }
}
