//! `ringfs mount DIR`: serve the file system through FUSE until SIGTERM, SIGINT or unmount.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use ringfs_client::Client;
use ringfs_fuse::MountOptions;

#[derive(Args, Debug, Clone)]
pub struct MountArgs {
    /// Directory to mount ringfs on (must exist).
    pub directory: PathBuf,
    /// Bypass the page cache (every read and write goes to ringfs; mmap does not work).
    #[arg(long)]
    pub direct_io: bool,
    /// Let the kernel gather small writes in the page cache before sending them (for files
    /// only this node changes: the kernel keeps the size of a file it holds itself, so a size
    /// another node gives it shows here only once the file is closed here and has one name).
    #[arg(long)]
    pub writeback_cache: bool,
    /// How long the kernel caches attributes and names, in milliseconds [default: 60000,
    /// or 1000 with --watch-ms 0].
    #[arg(long)]
    pub attr_timeout_ms: Option<u64>,
    /// How often the mount asks the servers what other clients changed and has the kernel
    /// drop that from its caches, in milliseconds (0: never; the caches then only expire).
    #[arg(long, default_value_t = 100)]
    pub watch_ms: u64,
    /// The most questions a second the mount asks all servers together about changes: with
    /// more servers than --watch-ms allows at this rate, each is asked less often (a change
    /// elsewhere then shows within about servers / this many seconds).
    #[arg(long, default_value_t = 1000)]
    pub watch_budget: u32,
    /// Threads serving kernel requests.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Let other users access the mount.
    #[arg(long)]
    pub allow_other: bool,
    /// Take the kernel's requests from its io_uring queues (FUSE over io_uring; needs
    /// `echo Y > /sys/module/fuse/parameters/enable_uring` as root, else the mount serves
    /// /dev/fuse and logs why). Also RINGFS_FUSE_IO_URING=1.
    #[arg(long)]
    pub io_uring: bool,
    /// Write this file once the mount is ready (used by `ringfs start --mount`).
    #[arg(long, hide = true)]
    pub ready_file: Option<PathBuf>,
}

impl MountArgs {
    fn options(&self) -> MountOptions {
        MountOptions {
            attr_timeout: Duration::from_millis(self.attr_timeout_ms.unwrap_or(if self.watch_ms == 0 { 1000 } else { 60_000 })),
            watch_interval: Duration::from_millis(self.watch_ms),
            watch_budget: self.watch_budget.max(1),
            direct_io: self.direct_io,
            writeback_cache: self.writeback_cache,
            threads: self.threads,
            allow_other: self.allow_other,
            io_uring: self.io_uring || std::env::var(ringfs_config::env::FUSE_IO_URING).is_ok_and(|value| value == "1"),
        }
    }
}

pub fn run(args: MountArgs) -> Result<()> {
    let wait_for_signal = crate::signals::block_termination_signals_with_timeout();
    let client = Client::from_env().context("cannot connect to ringfs")?;
    let mounted = ringfs_fuse::mount(client, &args.directory, &args.options())?;
    if let Some(ready) = &args.ready_file {
        std::fs::write(ready, std::process::id().to_string()).with_context(|| format!("cannot write {}", ready.display()))?;
    }
    log::info!("ringfs mounted at {}", args.directory.display());
    loop {
        if let Some(signal) = wait_for_signal(Duration::from_millis(500)) {
            log::info!("signal {signal} received, unmounting {}", args.directory.display());
            break;
        }
        if mounted.is_finished() {
            log::info!("{} was unmounted", args.directory.display());
            break;
        }
    }
    mounted.unmount()?;
    Ok(())
}
