//! What to start: [`LaunchConfig`] (servers, hosts, store, cache mode) and its defaults.

use std::fs;
use std::path::{Path, PathBuf};

use ringfs_placement::{HashFunction, Scheme};

use crate::slurm;
use crate::{LaunchError, Result, io_error};

/// What to start. [`LaunchConfig::local`] gives the defaults of `ringfs start`.
#[derive(Clone, Debug)]
pub struct LaunchConfig {
    /// Number of servers on this machine (ignored with a hostfile).
    pub servers: usize,
    /// `mem` or `dir:PATH` (each server uses PATH/<name>).
    pub store: String,
    /// Capacity per server, as `ringfs server --capacity` takes it ("0": unlimited).
    pub capacity: String,
    /// Chunk size clients of this cluster use for new files.
    pub chunk_size: u32,
    /// One server per line (first word: host name) instead of local servers.
    pub hostfile: Option<PathBuf>,
    /// Runs a shell command on a host: `<launcher> <host> <command>`.
    pub launcher: String,
    /// First TCP port on hosts of a hostfile (server i listens on port + i).
    pub port: u16,
    /// Address local servers listen on.
    pub listen_host: String,
    pub hash: HashFunction,
    pub placement: Scheme,
    /// Where to keep secret, addresses and logs (default: a new directory under
    /// $TMPDIR/ringfs-<uid>, or ~/.ringfs with a hostfile so every host can read it).
    pub run_dir: Option<PathBuf>,
    /// The `ringfs` executable the servers run.
    pub executable: PathBuf,
    /// Extra arguments for every `ringfs server`.
    pub server_args: Vec<String>,
    /// What the addresses of servers on other hosts start with: empty for TCP, `ucx://` when
    /// `server_args` make them serve over UCX (`--transport ucx`).
    pub address_prefix: String,
    /// Cache mode: the backend directory the cluster caches.
    pub cache: Option<LaunchCache>,
    /// Start one server on every node of this Slurm allocation (through `srun`) instead of
    /// local servers or a hostfile's; their port is `port`.
    pub slurm: Option<slurm::SlurmJob>,
}

/// Cache mode of a launched cluster: what `ringfs server --backend …` gets.
#[derive(Clone, Debug)]
pub struct LaunchCache {
    /// The backend directory (absolute; every server must see it at this path).
    pub backend: PathBuf,
    /// The ringfs directory it appears at.
    pub mount_path: String,
    /// `io-aware`, `immediate` or `none`.
    pub flush: String,
    /// Idle time before io-aware flushing, in milliseconds.
    pub flush_idle_ms: u64,
}

impl LaunchConfig {
    /// The arguments every server gets beyond its name and addresses.
    pub(crate) fn common_server_args(&self) -> Vec<String> {
        let mut args = self.server_args.clone();
        if let Some(cache) = &self.cache {
            args.extend([
                "--backend".to_string(),
                cache.backend.display().to_string(),
                "--mount-path".to_string(),
                cache.mount_path.clone(),
                "--backend-chunk-size".to_string(),
                self.chunk_size.to_string(),
                "--flush".to_string(),
                cache.flush.clone(),
                "--flush-idle-ms".to_string(),
                cache.flush_idle_ms.to_string(),
            ]);
        }
        args
    }
}

impl LaunchConfig {
    /// `servers` in-memory servers on this machine, listening on 127.0.0.1.
    pub fn local(servers: usize, executable: PathBuf) -> LaunchConfig {
        LaunchConfig {
            servers,
            store: "mem".into(),
            capacity: "0".into(),
            chunk_size: ringfs_client::DEFAULT_CHUNK_SIZE,
            hostfile: None,
            launcher: "ssh -o BatchMode=yes".into(),
            port: 7717,
            listen_host: "127.0.0.1".into(),
            hash: HashFunction::default(),
            placement: Scheme::default(),
            run_dir: None,
            executable,
            server_args: Vec::new(),
            address_prefix: String::new(),
            cache: None,
            slurm: None,
        }
    }
}

pub(crate) fn read_hostfile(path: &Path) -> Result<Vec<String>> {
    let text = fs::read_to_string(path).map_err(io_error(format!("cannot read hostfile {}", path.display())))?;
    let hosts: Vec<String> = text
        .lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter_map(|line| line.split_whitespace().next().map(String::from))
        .collect();
    if hosts.is_empty() {
        return Err(LaunchError::Config(format!("hostfile {} names no host", path.display())));
    }
    Ok(hosts)
}

/// The `--store` argument of one server: a `dir` store gets a subdirectory per server.
pub fn store_for(store: &str, name: &str) -> Result<String> {
    match store.split_once(':') {
        None if store == "mem" => Ok("mem".into()),
        Some(("dir", path)) if !path.is_empty() => Ok(format!("dir:{}", Path::new(path).join(name).display())),
        _ => Err(LaunchError::Config(format!("invalid store {store:?}: expected mem or dir:PATH"))),
    }
}
