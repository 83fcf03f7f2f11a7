//! `ringfs server`: run one server in the foreground until SIGTERM, SIGINT or `ringfs stop`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use ringfs_config::{ByteSize, env};
use ringfs_placement::{HashFunction, Scheme};
use ringfs_server::{FlushConfig, FlushPolicy, Server, ServerConfig};
use ringfs_store::{CacheConfig, Medium, StoreConfig};

#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// Stable server name (placement depends on it; keep it across restarts).
    #[arg(long)]
    pub name: String,
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Address other hosts should use to reach this server (default: the bound address).
    #[arg(long)]
    pub advertise: Option<String>,
    /// How other hosts reach this server: tcp, or ucx (UCX: RDMA over InfiniBand or RoCE,
    /// or UCX's TCP and shared memory, as UCX_TLS says). The server's address says which, so
    /// clients and other servers follow. Clients on this host use the Unix socket either way.
    #[arg(long, value_enum, default_value_t = Transport::Tcp)]
    pub transport: Transport,
    /// Unix socket for clients on this host (enables the same-host fast path).
    #[arg(long)]
    pub unix_socket: Option<PathBuf>,
    /// Serve TCP only, even if --unix-socket is given: clients and servers on this host then
    /// reach this server through its advertised address too (e.g. a fault-injecting proxy).
    #[arg(long)]
    pub no_unix_socket: bool,
    /// Chunk store: `mem` (DRAM) or `dir:PATH` (one file per chunk; survives restarts).
    #[arg(long, default_value = "mem")]
    pub store: String,
    /// Capacity of the store (e.g. 8G); writes beyond it fail with ENOSPC. 0: unlimited.
    #[arg(long, default_value = "0")]
    pub capacity: String,
    /// Address of a running server to join (repeat to give alternatives).
    #[arg(long)]
    pub join: Vec<String>,
    /// Hash of paths and server names: koyama or murmur3.
    #[arg(long, default_value = "koyama")]
    pub hash: HashFunction,
    /// Placement: modular, consistent or consistent:N (N virtual nodes per server).
    #[arg(long, default_value = "modular")]
    pub placement: Scheme,
    /// File holding the job's secret (otherwise RINGFS_SECRET is used).
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// Write the TCP address here once the server accepts connections.
    #[arg(long)]
    pub address_file: Option<PathBuf>,
    /// The cluster's run directory (made by `ringfs start`): the secret is read from it, the
    /// server records its address and process id in it (`NAME.addr`, `NAME.pid`) every time
    /// it starts, and it joins — now and whenever they move — the servers recorded there.
    /// A server restarted by hand with the same name and store is found again this way.
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Interval of failure-detection pings, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub heartbeat_ms: u64,
    /// A server silent for this long is declared dead, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub failure_timeout_ms: u64,
    /// Milliseconds the files a client has open stay open after its last connection closed.
    #[arg(long, default_value_t = 30_000)]
    pub open_grace_ms: u64,
    /// Milliseconds between this server's looks for orphan chunks (of files that no longer
    /// exist).
    #[arg(long, default_value_t = 60_000)]
    pub reclaim_interval_ms: u64,
    /// Microseconds a serving thread keeps polling a connection for its next request before
    /// the connection goes back to the event loop (0: never).
    #[arg(long, default_value_t = 50)]
    pub poll_us: u64,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Cache mode: chunk size of files loaded from the backend.
    #[arg(long, default_value = "1M")]
    pub backend_chunk_size: String,
    #[command(flatten)]
    pub gmem: GmemArgs,
}

/// How servers and clients on different hosts reach each other.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// TCP sockets.
    #[default]
    Tcp,
    /// UCX (`libucp.so.0`): RDMA where the fabric has it, else UCX's TCP or shared memory.
    Ucx,
}

impl Transport {
    /// `address` (`host:port`) as an endpoint of this transport (`ucx://host:port`).
    pub fn endpoint(self, address: &str) -> String {
        match self {
            Transport::Ucx if !address.starts_with("ucx://") => format!("ucx://{address}"),
            _ => address.to_string(),
        }
    }

    /// Fails, saying why, where this transport cannot be used.
    pub fn check_available(self) -> Result<()> {
        if self == Transport::Ucx
            && let Some(reason) = ringfs_rpc::ucx::unavailable_reason()
        {
            bail!("--transport ucx needs UCX on every node (Debian/Ubuntu: libucx0, RHEL: ucx): {reason}");
        }
        Ok(())
    }

    /// What the addresses of servers using it start with (`ucx://`; nothing for TCP).
    pub fn address_prefix(self) -> &'static str {
        match self {
            Transport::Tcp => "",
            Transport::Ucx => "ucx://",
        }
    }

    /// The `ringfs server` arguments that choose it.
    pub fn server_args(self) -> Vec<String> {
        match self {
            Transport::Tcp => Vec::new(),
            Transport::Ucx => vec!["--transport".into(), "ucx".into()],
        }
    }
}

/// Global memory: DRAM budget, spill directory and the emulated hardware (options of
/// `ringfs server`, `start` and `run`).
#[derive(Args, Debug, Clone, Default)]
pub struct GmemArgs {
    /// DRAM the global memory's blocks may take on each server before the least recently
    /// used spill to the SSD (e.g. 4G).
    #[arg(long)]
    pub gmem_dram: Option<String>,
    /// Where spilled blocks go (default: under the `dir` store, or the temporary directory).
    #[arg(long)]
    pub gmem_spill: Option<PathBuf>,
    /// Emulated SSD for spilled blocks: bandwidth in MB/s (off by default).
    #[arg(long)]
    pub gmem_ssd_mbps: Option<u64>,
    /// Emulated SSD: latency of each spill read or write, in microseconds.
    #[arg(long, default_value_t = 0)]
    pub gmem_ssd_latency_us: u64,
    /// Emulated network link of each server for global-memory data: bandwidth in MB/s (off
    /// by default).
    #[arg(long)]
    pub gmem_net_mbps: Option<u64>,
    /// Emulated network: latency added to each global-memory transfer, in microseconds.
    #[arg(long, default_value_t = 0)]
    pub gmem_net_latency_us: u64,
}

impl GmemArgs {
    /// These options as `ringfs server` arguments (for `ringfs start`).
    pub fn server_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(dram) = &self.gmem_dram {
            args.extend(["--gmem-dram".to_string(), dram.clone()]);
        }
        if let Some(spill) = &self.gmem_spill {
            args.extend(["--gmem-spill".to_string(), spill.display().to_string()]);
        }
        if let Some(mbps) = self.gmem_ssd_mbps {
            args.extend([
                "--gmem-ssd-mbps".to_string(),
                mbps.to_string(),
                "--gmem-ssd-latency-us".into(),
                self.gmem_ssd_latency_us.to_string(),
            ]);
        }
        if let Some(mbps) = self.gmem_net_mbps {
            args.extend([
                "--gmem-net-mbps".to_string(),
                mbps.to_string(),
                "--gmem-net-latency-us".into(),
                self.gmem_net_latency_us.to_string(),
            ]);
        }
        args
    }

    /// The server's global-memory configuration (`store_dir`: the `dir` store's directory).
    fn config(&self, name: &str, store_dir: Option<&std::path::Path>) -> Result<ringfs_server::gmem::GmemConfig> {
        let dram_bytes = match &self.gmem_dram {
            Some(size) => parse_bytes(size)?,
            None => ringfs_server::DEFAULT_GMEM_DRAM,
        };
        let spill_dir = match (&self.gmem_spill, store_dir) {
            (Some(dir), _) => dir.join(name),
            (None, Some(store)) => store.join("gmem-spill"),
            (None, None) => std::env::temp_dir().join(format!("ringfs-gmem-{name}-{}", std::process::id())),
        };
        let model = |mbps: Option<u64>, latency_us: u64| {
            mbps.map(|mbps| ringfs_rpc::throttle::DeviceModel {
                bytes_per_second: mbps * 1_000_000,
                latency: Duration::from_micros(latency_us),
            })
        };
        Ok(ringfs_server::gmem::GmemConfig {
            memory: ringfs_server::gmem::GlobalMemoryConfig {
                dram_bytes,
                spill_dir,
                ssd: model(self.gmem_ssd_mbps, self.gmem_ssd_latency_us),
            },
            network: model(self.gmem_net_mbps, self.gmem_net_latency_us),
        })
    }
}

/// Cache mode: ringfs as a cache of a directory of the parallel file system (the options
/// of `ringfs server`, `start` and `run`).
#[derive(Args, Debug, Clone)]
pub struct CacheArgs {
    /// Cache this backend directory: files under the mount path are read from it on demand
    /// and written back to it (`ringfs stop` flushes everything).
    #[arg(long)]
    pub backend: Option<PathBuf>,
    /// The ringfs directory the backend appears at.
    #[arg(long, default_value = "/")]
    pub mount_path: String,
    /// When dirty data is written back: io-aware (after --flush-idle-ms without requests;
    /// stops when requests come), immediate, or none (only on sync and stop).
    #[arg(long, default_value = "io-aware")]
    pub flush: FlushPolicy,
    /// io-aware flushing starts after this many milliseconds without requests.
    #[arg(long, default_value_t = 1000)]
    pub flush_idle_ms: u64,
}

impl Default for CacheArgs {
    /// No backend (what the command line gives without `--backend`).
    fn default() -> Self {
        CacheArgs { backend: None, mount_path: "/".into(), flush: FlushPolicy::IoAware, flush_idle_ms: 1000 }
    }
}

impl CacheArgs {
    /// The store's cache configuration, if a backend is given.
    pub fn cache_config(&self, chunk_size: &str) -> Result<Option<CacheConfig>> {
        let Some(backend) = &self.backend else { return Ok(None) };
        let chunk_size = ringfs_client::parse_size(chunk_size).with_context(|| format!("invalid backend chunk size {chunk_size:?}"))?;
        let backend = backend.canonicalize().with_context(|| format!("backend {} is not usable", backend.display()))?;
        Ok(Some(CacheConfig { backend, mount_path: self.mount_path.clone(), chunk_size }))
    }

    pub fn flush_config(&self) -> FlushConfig {
        FlushConfig { policy: self.flush, idle: Duration::from_millis(self.flush_idle_ms) }
    }
}

/// Parses `mem` or `dir:PATH`.
pub fn parse_store(text: &str) -> Result<Medium> {
    match text.split_once(':') {
        None if text == "mem" => Ok(Medium::Memory),
        Some(("dir", path)) if !path.is_empty() => Ok(Medium::Directory(PathBuf::from(path))),
        _ => bail!("invalid store {text:?}: expected mem or dir:PATH"),
    }
}

/// Parses a byte count as every flag takes one ([`ByteSize`]: `64K`, `1M`, `4GiB`, …).
pub fn parse_bytes(text: &str) -> Result<u64> {
    Ok(text.parse::<ByteSize>()?.bytes())
}

/// Reads the secret from a file or `RINGFS_SECRET`.
pub fn read_secret(file: Option<&PathBuf>) -> Result<Vec<u8>> {
    match file {
        Some(path) => {
            Ok(std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?.trim().as_bytes().to_vec())
        }
        None => Ok(std::env::var(env::SECRET).unwrap_or_default().into_bytes()),
    }
}

/// The other servers recorded in a run directory, as (name, address), without `own`.
fn recorded_peers(run_dir: &std::path::Path, own: &str) -> Vec<(String, String)> {
    ringfs_client::run_dir::servers(run_dir)
        .into_iter()
        .filter(|server| server.name != own)
        .map(|server| (server.name, server.address))
        .collect()
}

/// Replaces `path`'s contents at once (write a temporary file, then rename it).
fn write_atomically(path: &std::path::Path, contents: &str) -> Result<()> {
    let temporary = PathBuf::from(format!("{}.tmp", path.display()));
    std::fs::write(&temporary, contents).with_context(|| format!("cannot write {}", temporary.display()))?;
    std::fs::rename(&temporary, path).with_context(|| format!("cannot write {}", path.display()))
}

pub fn run(mut args: ServerArgs) -> Result<()> {
    let wait_for_signal = crate::signals::block_termination_signals();
    if let Some(run_dir) = &args.run_dir {
        args.secret_file.get_or_insert_with(|| run_dir.join("secret"));
        args.address_file.get_or_insert_with(|| run_dir.join(format!("{}.addr", args.name)));
        if args.join.is_empty() {
            args.join = recorded_peers(run_dir, &args.name).into_iter().map(|(_, address)| address).collect();
        }
    }
    let secret = read_secret(args.secret_file.as_ref())?;
    if secret.is_empty() {
        bail!("no secret: set RINGFS_SECRET or pass --secret-file");
    }
    args.transport.check_available()?;
    let mut config = ServerConfig::new(&args.name, &args.transport.endpoint(&args.listen), secret);
    config.advertise = args.advertise.map(|address| args.transport.endpoint(&address));
    config.unix_socket = args.unix_socket.filter(|_| !args.no_unix_socket);
    config.store = StoreConfig {
        medium: parse_store(&args.store)?,
        capacity_bytes: parse_bytes(&args.capacity)?,
        cache: args.cache.cache_config(&args.backend_chunk_size)?,
    };
    config.flush = args.cache.flush_config();
    let store_dir = match &config.store.medium {
        Medium::Directory(dir) => Some(dir.clone()),
        _ => None,
    };
    config.gmem = args.gmem.config(&args.name, store_dir.as_deref())?;
    config.join = args.join.iter().map(|address| args.transport.endpoint(address)).collect();
    config.hash = args.hash;
    config.placement = args.placement;
    config.heartbeat_interval = Duration::from_millis(args.heartbeat_ms.max(10));
    config.failure_timeout = Duration::from_millis(args.failure_timeout_ms.max(10));
    config.poll = Duration::from_micros(args.poll_us);
    config.open_grace = Duration::from_millis(args.open_grace_ms);
    config.reclaim_interval = Duration::from_millis(args.reclaim_interval_ms.max(10));
    if let Some(run_dir) = &args.run_dir {
        let watch = ringfs_client::run_dir::RunDirWatch::new(run_dir);
        config.discover = Some(ringfs_server::Discover(std::sync::Arc::new(move |wanted: &dyn Fn(&str) -> bool| {
            watch.servers(wanted).into_iter().map(|server| (server.name, server.address)).collect()
        })));
    }
    // Each client connection holds a descriptor: take all the hard limit allows (the
    // connection limit follows it, docs/ARCHITECTURE.md "Unauthenticated peers").
    let descriptors = ringfs_rpc::raise_open_file_limit();
    log::info!("open-file limit {descriptors}: up to {} client connections", ringfs_rpc::ServerLimits::default().max_connections);
    let server = Server::start(config)?;
    if let Some(path) = &args.address_file {
        write_atomically(path, server.tcp_address())?;
    }
    if let Some(run_dir) = &args.run_dir {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        write_atomically(&run_dir.join(format!("{}.pid", args.name)), &format!("{} {}\n", host.trim(), std::process::id()))?;
    }
    let shutdown = server.shutdown_handle();
    std::thread::spawn(move || {
        let signal = wait_for_signal();
        log::info!("signal {signal} received, shutting down");
        shutdown.request();
    });
    server.wait_for_shutdown();
    server.stop();
    Ok(())
}
