//! Starting and stopping the servers of one job.
//!
//! [`start`] launches `ringfs server` processes — on this machine by default (the embedded
//! local cluster), or one per host of a hostfile through ssh or another launcher — waits until
//! all have joined, and returns a [`Cluster`] with what clients need (addresses, secret,
//! chunk size). Everything [`stop`] needs is kept in a *run directory*: the secret, the
//! servers' addresses and process ids, and their logs.
//!
//! ```no_run
//! use ringfs_launch::{LaunchConfig, start};
//! let config = LaunchConfig::local(2, "/usr/local/bin/ringfs".into());
//! let cluster = start(&config).unwrap();
//! print!("{}", cluster.exports());
//! cluster.stop().unwrap();
//! ```

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

mod config;
pub mod leftovers;
pub mod process;
mod run_dir;
pub mod slurm;
mod start;
mod stop;

pub use config::{LaunchCache, LaunchConfig, store_for};
pub(crate) use run_dir::{ServerRecord, random_hex, unmount_all, write_private};
pub use start::{Cluster, start};
pub use stop::{StopOptions, stop};

/// How long `start` waits for the servers, and `stop` for them to exit.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a cluster could not be started or stopped.
#[derive(Debug, Error)]
pub enum LaunchError {
    #[error("{0}")]
    Config(String),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("starting the cluster failed: {0}")]
    Startup(String),
    /// Stopping went wrong; each problem names the server or the step.
    #[error("stopping the cluster went wrong: {}{}", problems.join("; "), kept.as_ref().map(|dir| format!(" (run directory {} kept)", dir.display())).unwrap_or_default())]
    Stop { problems: Vec<String>, kept: Option<PathBuf> },
}

pub(crate) type Result<T> = std::result::Result<T, LaunchError>;

pub(crate) fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LaunchError {
    let what = what.into();
    move |source| LaunchError::Io { what, source }
}
