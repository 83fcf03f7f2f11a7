//! `ringfs bench …`: benchmarks against a local cluster and a POSIX baseline.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use ringfs_bench::micro::{self, MicroConfig};
use ringfs_bench::target::TargetSpec;
use ringfs_launch::{Cluster, LaunchConfig};

use crate::server_command::parse_bytes;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Sequential 1 MiB write/read and create/stat/remove, on ringfs and a POSIX directory.
    Micro(MicroArgs),
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
    /// Options for that mount (e.g. "--direct-io").
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub fuse_options: String,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// A cluster started for a benchmark, stopped when dropped (also on errors).
pub struct BenchCluster {
    cluster: Option<Cluster>,
    poll_us: u64,
}

impl BenchCluster {
    pub fn start(args: &ClusterArgs) -> Result<BenchCluster> {
        if args.use_running {
            return Ok(BenchCluster { cluster: None, poll_us: args.poll_us });
        }
        let mut config = LaunchConfig::local(args.servers, std::env::current_exe().context("cannot find the ringfs executable")?);
        config.chunk_size =
            ringfs_client::parse_size(&args.chunk_size).with_context(|| format!("invalid chunk size {:?}", args.chunk_size))?;
        config.store = args.store.clone();
        config.server_args = vec!["--poll-us".into(), args.poll_us.to_string()];
        Ok(BenchCluster { cluster: Some(ringfs_launch::start(&config)?), poll_us: args.poll_us })
    }

    /// The environment worker processes need to reach ringfs.
    pub fn environment(&self) -> Vec<(&'static str, String)> {
        let mut environment = match &self.cluster {
            Some(cluster) => cluster.environment(),
            None => ["RINGFS_SERVER", "RINGFS_SECRET", "RINGFS_CHUNK_SIZE"]
                .into_iter()
                .filter_map(|name| std::env::var(name).ok().map(|value| (name, value)))
                .collect(),
        };
        environment.push(("RINGFS_POLL_US", self.poll_us.to_string()));
        environment
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
            Some(cluster) => format!("local cluster of {} servers, chunk size {}", cluster.servers.len(), cluster.chunk_size),
            None => "running cluster (RINGFS_SERVER)".into(),
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
    let spec = TargetSpec::parse(target).map_err(anyhow::Error::msg)?;
    let target = spec.connect().with_context(|| format!("worker {rank} cannot reach {target}"))?;
    match workload {
        "micro" => ringfs_bench::workers::serve(|words| micro::worker_command(&target, rank, processes, words))?,
        other => anyhow::bail!("unknown workload {other:?}"),
    }
    Ok(())
}

pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Micro(args) => run_micro(&args),
        BenchCommand::Worker { workload, target, rank, processes } => run_worker(&workload, &target, rank, processes),
    }
}
