//! `ringfs bench …`: benchmarks against a local cluster and a POSIX baseline.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use ringfs_bench::flush::{self, Compute, FlushBenchConfig};
use ringfs_bench::io500::{self, Io500Config, Io500Result, worker::Io500Worker};
use ringfs_bench::micro::{self, MicroConfig};
use ringfs_bench::target::TargetSpec;
use ringfs_bench::workers::Workers;
use ringfs_launch::{Cluster, LaunchCache, LaunchConfig};

use crate::server_command::parse_bytes;
use ringfs_config::env;

/// The default poll budget of clients, in microseconds.
fn ringfs_rpc_poll_default() -> u64 {
    ringfs_rpc::DEFAULT_POLL.as_micros() as u64
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Sequential 1 MiB write/read and create/stat/remove, on ringfs and a POSIX directory.
    Micro(MicroArgs),
    /// The 12 scored IO500 phases on ringfs or a POSIX directory, scored as IO500 does.
    Io500(Io500Args),
    /// IO500 on ringfs and on a POSIX directory back to back, with the ratio of each phase.
    Compare(CompareArgs),
    /// Cache mode: a compute/snapshot job against each flush policy (I/O-aware flushing).
    Flush(FlushArgs),
    /// Many clients: N authenticated connections opened at once and held, a real client's
    /// stat latency beside them (idle, then all sending small requests), and the server's
    /// threads and memory.
    Connections(ConnectionsArgs),
    /// Global memory: get/put latency and bandwidth for P ranks, in DRAM and spilling
    /// (`micro`, the default), or the shared scan and the out-of-core stencil with and
    /// without caches and cooperation (`scan`, `stencil`).
    Gmem(crate::gmem_bench_command::GmemBenchArgs),
    /// The client's `Ping` round trip and 1 MiB write/read bandwidth against the first
    /// server of the running cluster (RINGFS_SERVER), on the cluster's transport.
    Rpc(crate::ucx_bench_command::RpcBenchArgs),
    /// UCX: the frame transport against `ucx_perftest` on the same UCX transports.
    Ucx(crate::ucx_bench_command::UcxBenchArgs),
    /// (internal) the server process of `ringfs bench ucx`.
    #[command(hide = true)]
    UcxServe(crate::ucx_bench_command::UcxServeArgs),
    /// (internal) one rank of `ringfs bench gmem`.
    #[command(hide = true)]
    GmemRank,
    /// (internal) one worker process of a benchmark.
    #[command(hide = true)]
    Worker {
        workload: String,
        #[arg(long)]
        target: String,
        #[arg(long)]
        rank: usize,
        #[arg(long)]
        processes: usize,
    },
}

/// Where the ringfs side of a benchmark runs.
#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Servers of the local cluster started for the benchmark.
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
    /// Chunk size of the benchmark's files.
    #[arg(long, default_value = "1M")]
    pub chunk_size: String,
    /// Chunk store of the servers.
    #[arg(long, default_value = "mem")]
    pub store: String,
    /// Use the running cluster named by RINGFS_SERVER instead of starting one.
    #[arg(long)]
    pub use_running: bool,
    /// Poll budget in microseconds of servers and clients before they sleep (0: never poll).
    #[arg(long, default_value_t = 50)]
    pub poll_us: u64,
    /// Cache mode of the started cluster.
    #[command(flatten)]
    pub cache: crate::server_command::CacheArgs,
}

impl ClusterArgs {
    /// The cache configuration `--backend` asks for (the directory is made if missing).
    fn cache(&self) -> Result<Option<LaunchCache>> {
        let Some(backend) = &self.cache.backend else { return Ok(None) };
        std::fs::create_dir_all(backend).with_context(|| format!("cannot create {}", backend.display()))?;
        Ok(Some(LaunchCache {
            backend: backend.canonicalize()?,
            mount_path: self.cache.mount_path.clone(),
            flush: self.cache.flush.to_string(),
            flush_idle_ms: self.cache.flush_idle_ms,
        }))
    }
}

#[derive(Args, Debug)]
pub struct MicroArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Client processes.
    #[arg(long, default_value_t = 2)]
    pub procs: usize,
    /// Bytes each process writes and reads.
    #[arg(long, default_value = "256M")]
    pub size: String,
    /// Transfer size of writes and reads.
    #[arg(long, default_value = "1M")]
    pub block: String,
    /// Empty files each process creates, stats and removes.
    #[arg(long, default_value_t = 20_000)]
    pub files: u64,
    /// Repetitions; medians are reported.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Directory for the POSIX baseline.
    #[arg(long, default_value = "/dev/shm")]
    pub baseline: PathBuf,
    /// Measure ringfs only.
    #[arg(long)]
    pub no_baseline: bool,
    /// Also measure through a FUSE mount of the cluster.
    #[arg(long)]
    pub fuse: bool,
    /// Also measure through the LD_PRELOAD library, which shows the cluster under this
    /// path prefix to the worker processes (e.g. /ringfs).
    #[arg(long, value_name = "PREFIX")]
    pub preload: Option<PathBuf>,
    /// Options for the FUSE mount (e.g. "--direct-io").
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub fuse_options: String,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Parameters shared by `bench io500` and `bench compare`.
#[derive(Args, Debug, Clone)]
pub struct Io500Options {
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    pub procs: usize,
    /// Seconds each write phase runs before wearing out (IO500: 300; shorter runs are marked
    /// INVALID, as IO500 marks them).
    #[arg(long)]
    pub stonewall: Option<u64>,
    /// An IO500 INI file ([debug] stonewall-time, [ior-easy] transferSize/blockSize,
    /// [ior-hard] segmentCount, [mdtest-easy] n, [mdtest-hard] n).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory for result.txt, result.json, result.csv and chart.png (default:
    /// ./io500-results/<time>).
    #[arg(long)]
    pub results: Option<PathBuf>,
    /// Touch and free this much memory before measuring, so that no target pays the VM's
    /// cost of first touching guest memory (docs/PERFORMANCE.md); 0 to skip.
    #[arg(long, default_value = "4G")]
    pub warm_memory: String,
    /// A shell command run after the write phases and find, before the first read (e.g. to
    /// drop caches or restart servers); $IO500_DATA_DIR names the data directory (a ringfs
    /// path, or a local path for posix: targets) and the RINGFS_* variables reach the cluster.
    #[arg(long)]
    pub before_reads: Option<String>,
}

impl Io500Options {
    fn config(&self) -> Result<Io500Config> {
        let mut config = Io500Config::default();
        if let Some(path) = &self.config {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            for key in config.apply_ini(&text)? {
                log::info!("ignoring IO500 setting {key}");
            }
        }
        if let Some(seconds) = self.stonewall {
            config.stonewall = std::time::Duration::from_secs(seconds);
        }
        config.processes = self.procs.max(1);
        config.before_reads = self.before_reads.clone();
        Ok(config)
    }

    /// Warms the machine's memory as `--warm-memory` asks.
    fn warm_memory(&self) -> Result<()> {
        ringfs_bench::warm_memory(parse_bytes(&self.warm_memory)?);
        Ok(())
    }

    fn results_dir(&self) -> Result<PathBuf> {
        let dir = match &self.results {
            Some(dir) => dir.clone(),
            None => {
                let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
                PathBuf::from("io500-results").join(stamp.to_string())
            }
        };
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(dir)
    }
}

#[derive(Args, Debug)]
pub struct Io500Args {
    /// `ringfs` (a local cluster, or the running one with --use-running) or `posix:DIR`.
    #[arg(long, default_value = "ringfs")]
    pub target: String,
    #[command(flatten)]
    pub options: Io500Options,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Run under mpirun/srun: every rank runs this same command; rank 0 coordinates and
    /// writes its address to this file (on a file system all ranks see).
    #[arg(long)]
    pub rendezvous: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct CompareArgs {
    #[command(flatten)]
    pub options: Io500Options,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// The POSIX directory compared with ringfs.
    #[arg(long, default_value = "/dev/shm")]
    pub baseline: PathBuf,
}

#[derive(Args, Debug)]
pub struct ConnectionsArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Connections held in all (to the first server).
    #[arg(long, default_value_t = 1000)]
    pub clients: usize,
    /// Holder processes (default: one per 4,000 connections).
    #[arg(long)]
    pub procs: Option<usize>,
    /// stat calls timed in each phase.
    #[arg(long, default_value_t = 2000)]
    pub stats: usize,
    /// While chattering, each held connection sends a ping this often (milliseconds).
    #[arg(long, default_value_t = 1000)]
    pub chatter_period_ms: u64,
    /// The server's pid, to read its threads and memory (found in the run directory of a
    /// cluster started by the benchmark or named by RINGFS_RUN_DIR).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// First measure a job's cold start: this many client processes started at once, each
    /// writing 1 MiB to its own file, and the connections each server then holds.
    #[arg(long, default_value_t = 0)]
    pub ranks: usize,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct FlushArgs {
    /// Servers of the local cluster started for each run.
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
    /// Chunk store of the servers.
    #[arg(long, default_value = "mem")]
    pub store: String,
    /// Processes of the job.
    #[arg(long, default_value_t = 2)]
    pub procs: usize,
    /// Bytes each process writes into each snapshot.
    #[arg(long, default_value = "64M")]
    pub part: String,
    /// Size of each write call.
    #[arg(long, default_value = "1M")]
    pub block: String,
    /// Compute/snapshot iterations of the job.
    #[arg(long, default_value_t = 6)]
    pub iterations: u64,
    /// Length of each compute phase, in milliseconds.
    #[arg(long, default_value_t = 1500)]
    pub compute_ms: u64,
    /// How compute phases pass their time: spin (busy on a core) or sleep.
    #[arg(long, default_value = "spin")]
    pub compute: Compute,
    /// Flush policies to compare, in order (the first is the reference of the ratios).
    #[arg(long, default_value = "none,immediate,io-aware")]
    pub policies: String,
    /// Idle time before io-aware flushing, in milliseconds.
    #[arg(long, default_value_t = 200)]
    pub flush_idle_ms: u64,
    /// Runs of each policy (interleaved); medians are reported.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Where the fresh backend directory of each run is made (default: the temp directory).
    #[arg(long)]
    pub backend_parent: Option<PathBuf>,
}

/// A cluster started for a benchmark, stopped when dropped (also on errors).
pub struct BenchCluster {
    cluster: Option<Cluster>,
    /// The cluster caches a backend directory.
    caching: bool,
    /// Benchmarks use the cluster named by RINGFS_SERVER.
    use_running: bool,
    poll_us: u64,
}

impl BenchCluster {
    /// No cluster: for benchmarks of POSIX directories only.
    pub fn none() -> BenchCluster {
        BenchCluster { cluster: None, caching: false, use_running: false, poll_us: ringfs_rpc_poll_default() }
    }

    pub fn start(args: &ClusterArgs) -> Result<BenchCluster> {
        BenchCluster::start_caching(args, args.cache()?)
    }

    /// Starts a cluster, caching a backend directory if `cache` says so.
    pub fn start_caching(args: &ClusterArgs, cache: Option<LaunchCache>) -> Result<BenchCluster> {
        if args.use_running {
            return Ok(BenchCluster { cluster: None, caching: false, use_running: true, poll_us: args.poll_us });
        }
        let mut config = LaunchConfig::local(args.servers, std::env::current_exe().context("cannot find the ringfs executable")?);
        config.chunk_size =
            ringfs_client::parse_size(&args.chunk_size).with_context(|| format!("invalid chunk size {:?}", args.chunk_size))?;
        config.store = args.store.clone();
        config.server_args = vec!["--poll-us".into(), args.poll_us.to_string()];
        let caching = cache.is_some();
        config.cache = cache;
        Ok(BenchCluster { cluster: Some(ringfs_launch::start(&config)?), caching, use_running: false, poll_us: args.poll_us })
    }

    /// The environment worker processes need to reach ringfs.
    pub fn environment(&self) -> Vec<(&'static str, String)> {
        let mut environment = match &self.cluster {
            Some(cluster) => cluster.environment(),
            None => [env::SERVER, env::SECRET, env::CHUNK_SIZE]
                .into_iter()
                .filter_map(|name| std::env::var(name).ok().map(|value| (name, value)))
                .collect(),
        };
        environment.push((env::POLL_US, self.poll_us.to_string()));
        environment
    }

    /// A client of the benchmark cluster.
    pub fn client(&self) -> Result<ringfs_client::Client> {
        let config = match &self.cluster {
            Some(cluster) => cluster.client_config(),
            None => ringfs_client::ClientConfig::from_env()?,
        };
        Ok(ringfs_client::Client::connect(config)?)
    }

    /// Mounts the benchmark cluster with FUSE at a fresh directory (unmounted by stop).
    pub fn mount(&self, options: &str) -> Result<PathBuf> {
        let cluster = self.cluster.as_ref().context("--fuse needs a cluster started by the benchmark")?;
        let directory = cluster.run_dir.join("mnt");
        std::fs::create_dir_all(&directory).with_context(|| format!("cannot create {}", directory.display()))?;
        let options: Vec<String> = options.split_whitespace().map(String::from).collect();
        cluster.mount(&std::env::current_exe().context("cannot find the ringfs executable")?, &directory, &options)?;
        Ok(directory)
    }

    pub fn describe(&self) -> String {
        match &self.cluster {
            Some(cluster) => format!(
                "local cluster of {} servers, chunk size {}{}",
                cluster.servers.len(),
                cluster.chunk_size,
                if self.caching { " (cache mode)" } else { "" }
            ),
            None if self.use_running => "running cluster (RINGFS_SERVER)".into(),
            None => "no cluster".into(),
        }
    }
}

impl Drop for BenchCluster {
    fn drop(&mut self) {
        if let Some(cluster) = self.cluster.take()
            && let Err(error) = cluster.stop()
        {
            log::warn!("stopping the benchmark cluster: {error}");
        }
    }
}

fn run_micro(args: &MicroArgs) -> Result<()> {
    let config = MicroConfig {
        processes: args.procs.max(1),
        bytes_per_process: parse_bytes(&args.size)?,
        block_bytes: parse_bytes(&args.block)?.max(1) as usize,
        files_per_process: args.files,
        repeats: args.repeats.max(1),
        work_dir: micro::work_dir_name(),
    };
    let cluster = BenchCluster::start(&args.cluster)?;
    let mut targets = vec![TargetSpec::Ringfs];
    if args.fuse {
        targets.push(TargetSpec::Fuse(cluster.mount(&args.fuse_options)?));
    }
    if let Some(prefix) = &args.preload {
        targets.push(TargetSpec::Preload(prefix.clone()));
    }
    if !args.no_baseline {
        targets.push(TargetSpec::Posix(args.baseline.clone()));
    }
    println!(
        "ringfs bench micro: {}; {} processes, {} bytes each in {}-byte blocks, {} files each; median of {} runs",
        cluster.describe(),
        config.processes,
        config.bytes_per_process,
        config.block_bytes,
        config.files_per_process,
        config.repeats
    );
    let executable = std::env::current_exe().context("cannot find the ringfs executable")?;
    let results = micro::run(&executable, &targets, &cluster.environment(), &config)?;
    print!("{}", micro::report(&results, !args.no_baseline));
    if let Some(path) = &args.json {
        std::fs::write(path, micro::to_json(&results, &config)).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn run_worker(workload: &str, target: &str, rank: usize, processes: usize) -> Result<()> {
    if workload == "connections" {
        return run_holder(rank);
    }
    let spec = TargetSpec::parse(target).map_err(anyhow::Error::msg)?;
    let target = spec.connect().with_context(|| format!("worker {rank} cannot reach {target}"))?;
    match workload {
        "micro" => ringfs_bench::workers::serve(|words| micro::worker_command(&target, rank, processes, words))?,
        "flush" => ringfs_bench::workers::serve(|words| flush::worker_command(&target, rank, words))?,
        "io500" => {
            let mut worker = Io500Worker::new(target, rank, processes);
            ringfs_bench::workers::serve(|words| worker.command(words))?
        }
        other => anyhow::bail!("unknown workload {other:?}"),
    }
    Ok(())
}

/// Prints each phase as it ends, as IO500 does.
fn print_phase(measurement: &io500::Measurement) {
    println!("{}", io500::report::result_line(measurement));
}

/// Writes result.txt (IO500's text, one section per target), result.json, result.csv and
/// chart.png.
fn save_results(dir: &std::path::Path, results: &[Io500Result]) -> Result<()> {
    let text: String = results.iter().map(|result| format!("# {}\n{}", result.target, io500::report::text(result))).collect();
    std::fs::write(dir.join("result.txt"), text)?;
    std::fs::write(dir.join("result.json"), io500::report::json(results))?;
    std::fs::write(dir.join("result.csv"), io500::report::csv(results))?;
    io500::chart::write_png(results, &dir.join("chart.png"))?;
    println!("results: {}/result.{{txt,json,csv}} and chart.png", dir.display());
    Ok(())
}

/// Runs IO500 on one target with local worker processes.
pub fn run_io500(target: &TargetSpec, cluster: &BenchCluster, config: &Io500Config) -> Result<Io500Result> {
    println!(
        "IO500 on {} ({}): {} processes, stonewall {} s",
        target.label(),
        cluster.describe(),
        config.processes,
        config.stonewall.as_secs()
    );
    let executable = std::env::current_exe().context("cannot find the ringfs executable")?;
    let result = io500::run(&executable, target, &cluster.environment(), config, &mut print_phase)?;
    println!("{}", io500::report::score_line(&result));
    Ok(result)
}

fn run_io500_command(args: &Io500Args) -> Result<()> {
    let config = args.options.config()?;
    args.options.warm_memory()?;
    let target = TargetSpec::parse(&args.target).map_err(anyhow::Error::msg)?;
    if let Some(rendezvous) = &args.rendezvous {
        return run_io500_ranked(&target, &config, rendezvous, &args.options);
    }
    let cluster = if target.needs_cluster() { BenchCluster::start(&args.cluster)? } else { BenchCluster::none() };
    let result = run_io500(&target, &cluster, &config)?;
    save_results(&args.options.results_dir()?, &[result])
}

fn run_compare(args: &CompareArgs) -> Result<()> {
    let config = args.options.config()?;
    args.options.warm_memory()?;
    let cluster = BenchCluster::start(&args.cluster)?;
    let ringfs = run_io500(&TargetSpec::Ringfs, &cluster, &config)?;
    drop(cluster);
    let baseline = run_io500(&TargetSpec::Posix(args.baseline.clone()), &BenchCluster::none(), &config)?;
    println!();
    print!("{}", io500::report::comparison(&ringfs, &baseline));
    save_results(&args.options.results_dir()?, &[ringfs, baseline])
}

/// Runs the flush benchmark: for each repetition, each policy on a fresh cluster and backend.
fn run_flush(args: &FlushArgs) -> Result<()> {
    let config = FlushBenchConfig {
        processes: args.procs.max(1),
        part_bytes: parse_bytes(&args.part)?,
        block_bytes: parse_bytes(&args.block)?.max(1) as usize,
        iterations: args.iterations.max(1),
        compute: std::time::Duration::from_millis(args.compute_ms),
        compute_kind: args.compute,
    };
    let policies: Vec<String> =
        args.policies.split(',').map(|policy| policy.trim().to_string()).filter(|policy| !policy.is_empty()).collect();
    for policy in &policies {
        policy.parse::<ringfs_server::FlushPolicy>().map_err(anyhow::Error::msg)?;
    }
    println!(
        "ringfs bench flush: {} processes, {} iterations of {} ms compute ({}) + {} bytes per process per snapshot; {} servers; \
         io-aware idle {} ms; medians of {} runs",
        config.processes,
        config.iterations,
        args.compute_ms,
        config.compute_kind,
        config.part_bytes,
        args.servers,
        args.flush_idle_ms,
        args.repeats.max(1)
    );
    ringfs_bench::warm_memory(4 << 30);
    let executable = std::env::current_exe().context("cannot find the ringfs executable")?;
    let parent = args.backend_parent.clone().unwrap_or_else(std::env::temp_dir);
    let mut results: Vec<(String, Vec<flush::JobTimes>)> = policies.iter().map(|policy| (policy.clone(), Vec::new())).collect();
    for repeat in 0..args.repeats.max(1) {
        // Each repetition starts with another policy, so that no policy always runs first.
        let count = results.len();
        for position in (0..count).map(|offset| (repeat + offset) % count) {
            let (policy, runs) = &mut results[position];
            let backend = parent.join(format!("ringfs-flush-backend-{}-{repeat}-{policy}", std::process::id()));
            std::fs::create_dir_all(&backend).with_context(|| format!("cannot create {}", backend.display()))?;
            let outcome = run_flush_once(&executable, args, &config, policy, &backend);
            let _ = std::fs::remove_dir_all(&backend);
            let times = outcome?;
            println!(
                "run {} {policy:<10} write {:>6.0} MiB/s  compute {:.2} s  final sync {:.2} s  flushed while writing {} MiB  \
                 longest stop {} µs",
                repeat + 1,
                times.write_bandwidth() / (1 << 20) as f64,
                times.compute_seconds,
                times.drain_seconds,
                times.flushed_while_writing >> 20,
                times.longest_stop_us
            );
            runs.push(times);
        }
    }
    println!();
    print!("{}", flush::report(&results));
    Ok(())
}

/// The (address, pid) of every server in a run directory's `servers` file (name, address,
/// pid per line).
fn servers_in(run_dir: &std::path::Path) -> Vec<(String, u32)> {
    let records = std::fs::read_to_string(run_dir.join("servers")).unwrap_or_default();
    records
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            Some((words.get(1)?.to_string(), words.get(2)?.parse().ok()?))
        })
        .collect()
}

fn run_connections(args: &ConnectionsArgs) -> Result<()> {
    let cluster = BenchCluster::start(&args.cluster)?;
    let environment = cluster.environment();
    let variable = |name: &str| environment.iter().find(|(key, _)| *key == name).map(|(_, value)| value.clone());
    let server_address =
        variable(env::SERVER).and_then(|servers| servers.split(',').next().map(String::from)).context("no server address")?;
    let servers = variable(env::RUN_DIR).map(|dir| servers_in(std::path::Path::new(&dir))).unwrap_or_default();
    let server_pid = args.server_pid.or_else(|| servers.iter().find(|(address, _)| *address == server_address).map(|(_, pid)| *pid));
    let config = ringfs_bench::connections::ConnectionsConfig {
        clients: args.clients,
        processes: args.procs.unwrap_or(args.clients.div_ceil(ringfs_bench::connections::CONNECTIONS_PER_PROCESS)).max(1),
        stat_samples: args.stats.max(1),
        chatter_period: std::time::Duration::from_millis(args.chatter_period_ms.max(1)),
        server_address,
        server_pid,
        ranks: args.ranks,
        server_pids: servers.iter().map(|(_, pid)| *pid).collect(),
    };
    println!(
        "ringfs bench connections: {} connections to {} from {} processes; {}",
        config.clients,
        config.server_address,
        config.processes,
        cluster.describe()
    );
    let client = cluster.client()?;
    let executable = std::env::current_exe().context("cannot find the ringfs executable")?;
    let result = ringfs_bench::connections::run(&executable, &client, &environment, &config)?;
    print!("{}", ringfs_bench::connections::report(&result));
    if let Some(path) = &args.json {
        std::fs::write(path, ringfs_bench::connections::to_json(&result)).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// A holder process of `ringfs bench connections`, serving the coordinator's commands.
fn run_holder(rank: usize) -> Result<()> {
    let servers = std::env::var(env::SERVER).with_context(|| format!("{} is not set", env::SERVER))?;
    let server = servers.split(',').next().unwrap_or_default();
    let secret = std::env::var(env::SECRET).with_context(|| format!("{} is not set", env::SECRET))?;
    let client_id = (u64::from(std::process::id()) << 16 | rank as u64) | 1;
    let mut holder = ringfs_bench::connections::holder::Holder::new(server, secret.as_bytes(), client_id).map_err(anyhow::Error::msg)?;
    ringfs_bench::workers::serve(|words| holder.command(words))?;
    Ok(())
}

/// One run of the flush job with `policy`, backend data checked afterwards.
fn run_flush_once(
    executable: &std::path::Path,
    args: &FlushArgs,
    config: &FlushBenchConfig,
    policy: &str,
    backend: &std::path::Path,
) -> Result<flush::JobTimes> {
    let cache = LaunchCache {
        backend: backend.to_path_buf(),
        mount_path: "/".into(),
        flush: policy.to_string(),
        flush_idle_ms: args.flush_idle_ms,
    };
    let cluster_args = ClusterArgs {
        servers: args.servers,
        chunk_size: "1M".into(),
        store: args.store.clone(),
        use_running: false,
        poll_us: ringfs_rpc_poll_default(),
        cache: Default::default(),
    };
    let cluster = BenchCluster::start_caching(&cluster_args, Some(cache))?;
    let client = cluster.client()?;
    let mut workers = Workers::spawn(executable, "flush", &TargetSpec::Ringfs, config.processes, &cluster.environment())?;
    let times = flush::run_job(&mut workers, config, &mut ClientOfJob(client))?;
    workers.finish();
    flush::verify_backend(backend, config)?;
    Ok(times)
}

/// The flush job's view of its cluster, through a client.
struct ClientOfJob(ringfs_client::Client);

impl flush::JobCluster for ClientOfJob {
    fn sync(&mut self) -> std::result::Result<(), ringfs_bench::BenchError> {
        self.0.sync().map_err(|errno| ringfs_bench::BenchError::Setup(format!("sync: {errno}")))
    }

    fn flushed_bytes(&mut self) -> std::result::Result<u64, ringfs_bench::BenchError> {
        Ok(self.cache_stats()?.iter().map(|cache| cache.flushed_bytes).sum())
    }

    fn longest_stop_us(&mut self) -> std::result::Result<u64, ringfs_bench::BenchError> {
        Ok(self.cache_stats()?.iter().map(|cache| cache.longest_stop_us).max().unwrap_or(0))
    }
}

impl ClientOfJob {
    fn cache_stats(&self) -> std::result::Result<Vec<ringfs_client::CacheStats>, ringfs_bench::BenchError> {
        let stats = self.0.server_stats().map_err(|errno| ringfs_bench::BenchError::Setup(format!("server statistics: {errno}")))?;
        Ok(stats.into_iter().filter_map(|stats| stats.cache.map(|cache| *cache)).collect())
    }
}

/// This process's rank and the number of ranks, from the variables MPI launchers set.
fn launcher_rank() -> Result<(usize, usize)> {
    let read = |names: &[&str]| names.iter().find_map(|name| std::env::var(name).ok()?.parse::<usize>().ok());
    let rank = read(&["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"]);
    let size = read(&["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"]);
    match (rank, size) {
        (Some(rank), Some(size)) if rank < size => Ok((rank, size)),
        _ => anyhow::bail!(
            "--rendezvous needs a launcher that sets the rank (OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE or SLURM_PROCID/NTASKS)"
        ),
    }
}

/// The address other ranks reach rank 0 at: its host name, or loopback (all ranks on this
/// node) if the name does not resolve.
fn rendezvous_address(port: u16) -> String {
    use std::net::ToSocketAddrs;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|name| name.trim().to_string()).unwrap_or_default();
    let resolves = !host.is_empty() && (host.as_str(), port).to_socket_addrs().is_ok_and(|mut addresses| addresses.next().is_some());
    if resolves { format!("{host}:{port}") } else { format!("127.0.0.1:{port}") }
}

/// One rank of a run under mpirun: rank 0 coordinates (and works); every rank works.
fn run_io500_ranked(target: &TargetSpec, config: &Io500Config, rendezvous: &std::path::Path, options: &Io500Options) -> Result<()> {
    let (rank, size) = launcher_rank()?;
    let worker_target = target.connect().with_context(|| format!("rank {rank} cannot reach {}", target.label()))?;
    let mut worker = Io500Worker::new(worker_target, rank, size);
    if rank != 0 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let address = loop {
            match std::fs::read_to_string(rendezvous) {
                Ok(address) if !address.trim().is_empty() => break address.trim().to_string(),
                _ if std::time::Instant::now() > deadline => anyhow::bail!("rank 0 never wrote {}", rendezvous.display()),
                _ => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
        };
        ringfs_bench::workers::serve_over_tcp(&address, rank, |words| worker.command(words))?;
        return Ok(());
    }
    let listener = std::net::TcpListener::bind("0.0.0.0:0")?;
    let address = rendezvous_address(listener.local_addr()?.port());
    let temporary = rendezvous.with_extension("tmp");
    std::fs::write(&temporary, &address)?;
    std::fs::rename(&temporary, rendezvous)?;
    let local_address = format!("127.0.0.1:{}", listener.local_addr()?.port());
    let own_worker = std::thread::spawn(move || ringfs_bench::workers::serve_over_tcp(&local_address, 0, |words| worker.command(words)));
    let mut workers = Workers::accept(&listener, size, std::time::Duration::from_secs(120))?;
    let config = Io500Config { processes: size, ..config.clone() };
    println!("IO500 on {}: {size} ranks, stonewall {} s", target.label(), config.stonewall.as_secs());
    let mut on_phase = print_phase;
    let outcome = {
        let mut coordinator = io500::Coordinator::new(&mut workers, &config, &mut on_phase);
        if let Some(command) = &config.before_reads {
            coordinator = coordinator.before_reads(Box::new(|data_dir: &str| io500::run_shell_hook(command, target, data_dir, &[])));
        }
        coordinator.run(&io500::data_dir_name())
    };
    drop(workers);
    let _ = own_worker.join();
    let _ = std::fs::remove_file(rendezvous);
    let (measurements, found) = outcome?;
    let result = Io500Result {
        target: target.label(),
        processes: size,
        stonewall: config.stonewall,
        score: io500::Score::of(&measurements),
        measurements,
        found,
    };
    println!("{}", io500::report::score_line(&result));
    save_results(&options.results_dir()?, &[result])
}

pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Micro(args) => run_micro(&args),
        BenchCommand::Io500(args) => run_io500_command(&args),
        BenchCommand::Compare(args) => run_compare(&args),
        BenchCommand::Flush(args) => run_flush(&args),
        BenchCommand::Connections(args) => run_connections(&args),
        BenchCommand::Gmem(args) => crate::gmem_bench_command::run(&args),
        BenchCommand::Rpc(args) => crate::ucx_bench_command::run_rpc(&args),
        BenchCommand::Ucx(args) => crate::ucx_bench_command::run(&args),
        BenchCommand::UcxServe(args) => crate::ucx_bench_command::serve(&args),
        BenchCommand::GmemRank => match std::env::var(env::GMEM_APP) {
            Ok(plan) => Ok(ringfs_bench::gmem_apps::rank_main(&plan)?),
            Err(_) => Ok(ringfs_bench::gmem::rank_main()?),
        },
        BenchCommand::Worker { workload, target, rank, processes } => run_worker(&workload, &target, rank, processes),
    }
}
