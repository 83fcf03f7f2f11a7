//! `ringfs bench gmem`: the global memory's latency and bandwidth (see `ringfs_bench::gmem`).

use anyhow::{Context, Result};
use clap::Args;
use ringfs_bench::gmem::{self, GmemBenchConfig};
use ringfs_bench::gmem_apps::{self, AppConfig, AppRun, Setup, Workload};

use crate::server_command::parse_bytes;

/// What `ringfs bench gmem` runs.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GmemWorkload {
    /// Latency and bandwidth of gets and puts.
    #[default]
    Micro,
    /// Every rank reads one shared array (the vGASNet report's scan).
    Scan,
    /// A weak-scaling out-of-core 2-D Jacobi stencil.
    Stencil,
}

#[derive(Args, Debug, Clone)]
pub struct GmemBenchArgs {
    /// The measurement.
    #[arg(value_enum, default_value_t = GmemWorkload::Micro)]
    pub workload: GmemWorkload,
    /// Rank processes.
    #[arg(long, default_value_t = 2)]
    pub ranks: u32,
    /// Servers of the local cluster started for the benchmark (scan, stencil: 0 starts one per
    /// rank, as on a cluster running one rank per node).
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
    /// DRAM budget of each server's global memory (the spilling array is --spill-factor
    /// times the servers' total).
    #[arg(long, default_value = "128M")]
    pub dram: String,
    /// Block size of the arrays.
    #[arg(long, default_value = "256K")]
    pub block_size: String,
    /// Transfer sizes of the bandwidth measurements.
    #[arg(long, default_value = "64K,256K,1M,4M", value_delimiter = ',')]
    pub sizes: Vec<String>,
    /// Operations per latency measurement, per rank.
    #[arg(long, default_value_t = 2000)]
    pub latency_ops: u32,
    /// Bytes each rank moves per bandwidth measurement.
    #[arg(long, default_value = "64M")]
    pub bytes_per_rank: String,
    /// The spilling array is this many times the DRAM of all servers.
    #[arg(long, default_value_t = 4)]
    pub spill_factor: u64,
    /// scan, stencil: the rank counts to run.
    #[arg(long, default_value = "1,2,4,8,16", value_delimiter = ',')]
    pub rank_counts: Vec<u32>,
    /// scan, stencil: configurations to run: no-cache, cache (homes serve), cache+coop,
    /// cache+relay (cooperation with relayed batches of reads), in-dram (stencil: servers
    /// with DRAM for everything).
    #[arg(long, default_value = "no-cache,cache,cache+coop,in-dram", value_delimiter = ',')]
    pub setups: Vec<String>,
    /// scan, stencil: each rank's cache of blocks.
    #[arg(long, default_value = "4M")]
    pub cache: String,
    /// scan: the shared array's size.
    #[arg(long, default_value = "32M")]
    pub array: String,
    /// stencil: columns of the grid (f64 cells).
    #[arg(long, default_value_t = 1024)]
    pub cols: u64,
    /// stencil: rows of each rank's band.
    #[arg(long, default_value_t = 1024)]
    pub rows: u64,
    /// stencil: rows updated per get and put.
    #[arg(long, default_value_t = 64)]
    pub strip: u64,
    /// stencil: sweeps.
    #[arg(long, default_value_t = 5)]
    pub iterations: u32,
    /// stencil: the arrays are this many times the DRAM of all servers.
    #[arg(long, default_value_t = 2)]
    pub out_of_core: u64,
    /// scan, stencil: each rank's emulated network link in MB/s (default: the servers').
    #[arg(long)]
    pub rank_net_mbps: Option<u64>,
    /// scan, stencil: write the runs as CSV here.
    #[arg(long)]
    pub csv: Option<std::path::PathBuf>,
    /// scan, stencil: draw the runs as a PNG chart here.
    #[arg(long)]
    pub png: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub hardware: crate::server_command::GmemArgs,
}

pub fn run(args: &GmemBenchArgs) -> Result<()> {
    if args.workload != GmemWorkload::Micro {
        return run_app(args);
    }
    let sizes = args.sizes.iter().map(|size| parse_bytes(size)).collect::<Result<Vec<u64>>>()?;
    let config = GmemBenchConfig {
        ranks: args.ranks,
        servers: args.servers,
        dram_per_server: parse_bytes(&args.dram)?,
        block_size: u32::try_from(parse_bytes(&args.block_size)?).context("block size too large")?,
        sizes,
        latency_ops: args.latency_ops.max(10),
        bytes_per_rank: parse_bytes(&args.bytes_per_rank)?,
        spill_factor: args.spill_factor.max(1),
        server_args: args.hardware.server_args(),
        executable: std::env::current_exe().context("cannot find the ringfs executable")?,
    };
    println!(
        "global memory: {} ranks, {} servers with {} of DRAM each, blocks of {}, spilling array {}x the servers' DRAM",
        config.ranks, config.servers, args.dram, args.block_size, config.spill_factor
    );
    let report = gmem::run(&config)?;
    print!("{}", gmem::format_report(&report));
    Ok(())
}

/// `ringfs bench gmem scan|stencil`.
fn run_app(args: &GmemBenchArgs) -> Result<()> {
    let workload = if args.workload == GmemWorkload::Scan { Workload::Scan } else { Workload::Stencil };
    let setups =
        args.setups.iter().map(|name| Setup::parse(name).with_context(|| format!("unknown setup {name:?}"))).collect::<Result<Vec<_>>>()?;
    let rank_network = args.rank_net_mbps.or(args.hardware.gmem_net_mbps).map(|mbps| (mbps, args.hardware.gmem_net_latency_us));
    let config = AppConfig {
        workload,
        rank_counts: args.rank_counts.clone(),
        setups,
        servers: args.servers,
        block_size: u32::try_from(parse_bytes(&args.block_size)?).context("block size too large")?,
        cache_per_rank: parse_bytes(&args.cache)?,
        dram_per_server: parse_bytes(&args.dram)?,
        scan_bytes: parse_bytes(&args.array)?,
        cols: args.cols.max(3),
        rows_per_rank: args.rows.max(1),
        strip_rows: args.strip.max(1),
        iterations: args.iterations.max(1),
        out_of_core_factor: args.out_of_core.max(1),
        server_args: args.hardware.server_args(),
        rank_network,
        executable: std::env::current_exe().context("cannot find the ringfs executable")?,
    };
    println!("{}", AppRun::CSV_HEADER);
    let runs = gmem_apps::run(&config, &mut |run| println!("{}", run.csv(workload)))?;
    if let Some(path) = &args.csv {
        let text: String =
            std::iter::once(AppRun::CSV_HEADER.to_string()).chain(runs.iter().map(|run| run.csv(workload))).collect::<Vec<_>>().join("\n");
        std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.png {
        let mut series = Vec::new();
        for setup in &config.setups {
            let points: Vec<(f64, f64)> = runs
                .iter()
                .filter(|run| run.setup == setup.name())
                .map(|run| {
                    let value = match workload {
                        // Aggregate read throughput, GB/s.
                        Workload::Scan => run.ranks as f64 * config.scan_bytes as f64 / run.seconds / 1e9,
                        // Cell updates per second of all ranks, in billions.
                        Workload::Stencil => {
                            run.ranks as f64 * (config.rows_per_rank * config.cols) as f64 * f64::from(config.iterations)
                                / run.seconds
                                / 1e9
                        }
                    };
                    (f64::from(run.ranks), value)
                })
                .collect();
            if !points.is_empty() {
                series.push((setup.name().to_string(), points));
            }
        }
        let (title, y_label) = match workload {
            Workload::Scan => ("Shared scan: aggregate read throughput", "GB/s"),
            Workload::Stencil => ("Out-of-core stencil (weak scaling)", "Gcell updates/s"),
        };
        ringfs_bench::canvas::line_chart(path, title, "ranks", y_label, &series)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
