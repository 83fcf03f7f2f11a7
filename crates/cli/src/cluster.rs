//! `ringfs start`, `ringfs stop` and `ringfs status`: the command-line side of
//! `ringfs-launch`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use ringfs_client::Client;
use ringfs_config::env;
use ringfs_launch::LaunchConfig;
use ringfs_placement::{HashFunction, Scheme};

/// First port of servers on other hosts (a hostfile's, a Slurm allocation's).
const DEFAULT_PORT: u16 = 7717;

#[derive(Args, Debug, Clone)]
pub struct StartArgs {
    /// Number of servers on this machine (ignored with --hostfile).
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
    /// Chunk store of every server: `mem` or `dir:PATH` (each server uses PATH/<name>).
    #[arg(long, default_value = "mem")]
    pub store: String,
    /// Capacity per server (e.g. 16G); 0: unlimited.
    #[arg(long, default_value = "0")]
    pub capacity: String,
    /// Chunk size of files created by clients of this cluster (e.g. 64K, 1M).
    #[arg(long, default_value = "1M")]
    pub chunk_size: String,
    /// Start one server per line of this file (first word: host name) instead of local ones.
    #[arg(long)]
    pub hostfile: Option<PathBuf>,
    /// Command that runs a shell command on a host: `<launcher> <host> <command>`.
    #[arg(long, default_value = "ssh -o BatchMode=yes")]
    pub launcher: String,
    /// First TCP port used on hosts of a hostfile (server i listens on port + i); in a Slurm
    /// allocation, the port of every node's server (default 7717 + job id mod 1000).
    #[arg(long)]
    pub port: Option<u16>,
    /// Start the servers on this machine even inside a Slurm allocation (by default
    /// `ringfs start` starts one server on every node of the allocation through srun).
    #[arg(long, conflicts_with = "hostfile")]
    pub local: bool,
    /// Address local servers listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub listen_host: String,
    /// How servers and clients on different hosts reach each other: tcp, or ucx (RDMA
    /// through UCX; UCX_TLS, UCX_NET_DEVICES choose the fabric). Recorded in the servers'
    /// addresses in the run directory, so every client and server follows.
    #[arg(long, value_enum, default_value_t = crate::server_command::Transport::Tcp)]
    pub transport: crate::server_command::Transport,
    /// Hash of paths: koyama or murmur3.
    #[arg(long, default_value = "koyama")]
    pub hash: HashFunction,
    /// Placement: modular or consistent[:N].
    #[arg(long, default_value = "modular")]
    pub placement: Scheme,
    /// Where to keep secret, addresses and logs (default: a new directory under
    /// $TMPDIR/ringfs-<uid>, or under ~/.ringfs with --hostfile so every host can read it).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Microseconds a server keeps polling a connection for its next request before the
    /// connection goes back to the event loop (0: never; clients take theirs from
    /// RINGFS_POLL_US).
    #[arg(long, default_value_t = 50)]
    pub poll_us: u64,
    #[command(flatten)]
    pub cache: crate::server_command::CacheArgs,
    #[command(flatten)]
    pub gmem: crate::server_command::GmemArgs,
}

impl StartArgs {
    pub fn launch_config(&self) -> Result<LaunchConfig> {
        crate::server_command::parse_bytes(&self.capacity)?;
        self.transport.check_available()?;
        let chunk_size =
            ringfs_client::parse_size(&self.chunk_size).with_context(|| format!("invalid chunk size {:?}", self.chunk_size))?;
        let mut config = LaunchConfig::local(self.servers, std::env::current_exe().context("cannot find the ringfs executable")?);
        config.store = self.store.clone();
        config.capacity = self.capacity.clone();
        config.chunk_size = chunk_size;
        config.hostfile = self.hostfile.clone();
        config.launcher = self.launcher.clone();
        config.port = self.port.unwrap_or(DEFAULT_PORT);
        if self.hostfile.is_none() && !self.local {
            config.slurm = ringfs_launch::slurm::SlurmJob::from_environment()?;
            if let (Some(job), None) = (&config.slurm, self.port) {
                config.port = job.port(DEFAULT_PORT);
            }
        }
        config.listen_host = self.listen_host.clone();
        config.hash = self.hash;
        config.placement = self.placement;
        config.run_dir = self.run_dir.clone();
        config.server_args.extend(["--poll-us".to_string(), self.poll_us.to_string()]);
        config.server_args.extend(self.gmem.server_args());
        config.server_args.extend(self.transport.server_args());
        config.address_prefix = self.transport.address_prefix().to_string();
        if let Some(backend) = &self.cache.backend {
            let backend = backend.canonicalize().with_context(|| format!("backend {} is not usable", backend.display()))?;
            if !backend.is_dir() {
                anyhow::bail!("backend {} is not a directory", backend.display());
            }
            config.cache = Some(ringfs_launch::LaunchCache {
                backend,
                mount_path: ringfs_proto::path::canonicalize(&self.cache.mount_path)
                    .map_err(|errno| anyhow::anyhow!("invalid mount path {:?}: {errno}", self.cache.mount_path))?,
                flush: self.cache.flush.to_string(),
                flush_idle_ms: self.cache.flush_idle_ms,
            });
        }
        Ok(config)
    }
}

#[derive(Args, Debug, Clone)]
pub struct StopArgs {
    /// Run directory of the cluster (default: RINGFS_RUN_DIR).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Keep the run directory (logs) after stopping.
    #[arg(long)]
    pub keep: bool,
    /// Stop even if the final flush to the backend fails (its dirty data is then lost).
    #[arg(long)]
    pub force: bool,
    /// Milliseconds servers get to exit after the shutdown request before they are killed.
    #[arg(long, default_value_t = 30_000)]
    pub wait_ms: u64,
}

pub fn stop(args: &StopArgs) -> Result<()> {
    let run_dir = args
        .run_dir
        .clone()
        .or_else(|| std::env::var_os(env::RUN_DIR).map(PathBuf::from))
        .context("no cluster given: pass --run-dir or set RINGFS_RUN_DIR")?;
    // Cache mode: flush with progress shown while the servers run (stopping syncs too, but
    // silently, and says what failed).
    let config = ringfs_client::ClientConfig::new(Vec::new(), Vec::new()).with_run_dir(run_dir.clone());
    if let Ok(client) = Client::connect(config)
        && client.server_status().iter().any(|(_, stats)| stats.as_ref().is_ok_and(|stats| stats.cache.is_some()))
        && let Err(error) = crate::cache_command::sync(&client)
    {
        log::warn!("{error:#}");
    }
    let options = ringfs_launch::StopOptions { keep: args.keep, force: args.force, wait: std::time::Duration::from_millis(args.wait_ms) };
    Ok(ringfs_launch::stop(&run_dir, options)?)
}

#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    /// First wait until this many servers are alive (a cluster whose servers are still
    /// joining, as one started by a Slurm prolog); fails after --timeout-ms.
    #[arg(long)]
    pub wait_for: Option<usize>,
    #[arg(long, default_value_t = 30_000)]
    pub timeout_ms: u64,
}

/// `ringfs status`: waits for servers if asked, then prints them.
pub fn status_command(args: &StatusArgs) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(args.timeout_ms);
    let client = loop {
        let client = Client::from_env().context("cannot connect to ringfs");
        let alive = client.as_ref().map(|client| client.members().members.iter().filter(|member| member.alive).count()).unwrap_or(0);
        let wanted = args.wait_for.unwrap_or(0);
        match client {
            Ok(client) if alive >= wanted => break client,
            Err(error) if args.wait_for.is_none() || std::time::Instant::now() >= deadline => return Err(error),
            _ if std::time::Instant::now() >= deadline => {
                anyhow::bail!("only {alive} of {wanted} servers are alive after {} ms", args.timeout_ms)
            }
            _ => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    };
    status(&client);
    Ok(())
}

/// Prints one line per server: address, state, and its counters.
pub fn status(client: &Client) {
    println!(
        "{:<16} {:<22} {:>6} {:>10} {:>10} {:>14} {:>12} {:>10}",
        "SERVER", "ADDRESS", "STATE", "ENTRIES", "CHUNKS", "BYTES", "REQUESTS", "FORWARDED"
    );
    for (member, stats) in client.server_status() {
        match stats {
            Ok(stats) => {
                println!(
                    "{:<16} {:<22} {:>6} {:>10} {:>10} {:>14} {:>12} {:>10}",
                    member.name, member.tcp_address, "up", stats.entries, stats.chunks, stats.bytes, stats.requests, stats.forwarded
                );
                if let Some(lanes) = client.ucx_lanes(&member.name) {
                    println!("  UCX transports: {lanes}");
                }
                for peer in &stats.peer_transports {
                    println!("  UCX transports to {}: {}", peer.server, peer.transports);
                }
                if let Some(cache) = &stats.cache {
                    println!("{}", crate::cache_command::status_line(cache));
                }
                if let Some(gmem) = &stats.gmem {
                    println!(
                        "  global memory: {} bytes in DRAM, {} spilled; SSD read {} and wrote {} bytes",
                        gmem.dram_bytes, gmem.spilled_bytes, gmem.ssd_read_bytes, gmem.ssd_write_bytes
                    );
                }
            }
            Err(_) => println!("{:<16} {:<22} {:>6}", member.name, member.tcp_address, if member.alive { "silent" } else { "dead" }),
        }
    }
}
