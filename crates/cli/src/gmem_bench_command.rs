//! `ringfs bench gmem`: the global memory's latency and bandwidth (see `ringfs_bench::gmem`).

use anyhow::{Context, Result};
use clap::Args;
use ringfs_bench::gmem::{self, GmemBenchConfig};
use ringfs_bench::gmem_apps::{self, AppConfig, AppRun, Setup, Workload};
use ringfs_bench::gmem_verdict::{self, Conditions};

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
    /// Servers of the local cluster started for the benchmark (default 2; scan, stencil:
    /// default 0, which starts one per rank, as on a cluster running one rank per node).
    #[arg(long)]
    pub servers: Option<usize>,
    /// DRAM budget of each server's global memory (default 128M: the spilling array is
    /// --spill-factor times the servers' total; scan: default 1M, so that the array is out
    /// of core).
    #[arg(long)]
    pub dram: Option<String>,
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
    #[arg(long, default_value = "1,4,16", value_delimiter = ',')]
    pub rank_counts: Vec<u32>,
    /// scan, stencil: configurations to run: no-cache, cache (homes serve), cache+coop,
    /// cache+relay (cooperation with relayed batches of reads), in-dram (stencil: servers
    /// with DRAM for everything).
    #[arg(long, default_value = "no-cache,cache,cache+coop,in-dram", value_delimiter = ',')]
    pub setups: Vec<String>,
    /// scan, stencil: each rank's cache of blocks (default: scan 4M, a few blocks; stencil
    /// 20M, a rank's band).
    #[arg(long)]
    pub cache: Option<String>,
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
    /// scan, stencil: run on this machine's memory and loopback as they are, instead of the
    /// default emulated cluster (SSD 10 MB/s + 100 µs, links 50 MB/s + 10 µs) when no
    /// --gmem-ssd-mbps or --gmem-net-mbps is given.
    #[arg(long)]
    pub no_emulation: bool,
    #[command(flatten)]
    pub hardware: crate::server_command::GmemArgs,
}

pub fn run(args: &GmemBenchArgs) -> Result<()> {
    if args.workload != GmemWorkload::Micro {
        return run_app(args);
    }
    let sizes = args.sizes.iter().map(|size| parse_bytes(size)).collect::<Result<Vec<u64>>>()?;
    let dram = args.dram.clone().unwrap_or_else(|| "128M".into());
    let config = GmemBenchConfig {
        ranks: args.ranks,
        servers: args.servers.unwrap_or(2),
        dram_per_server: parse_bytes(&dram)?,
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
        config.ranks, config.servers, dram, args.block_size, config.spill_factor
    );
    let report = gmem::run(&config)?;
    print!("{}", gmem::format_report(&report));
    Ok(())
}

/// The emulated cluster `scan` and `stencil` run on unless told otherwise: the vGASNet
/// report's ratios (a link 5x the SSD), slow enough that this machine's CPU does not set the
/// pace (docs/PERFORMANCE.md, "Global memory caches").
const EMULATED_SSD_MBPS: u64 = 10;
const EMULATED_SSD_LATENCY_US: u64 = 100;
const EMULATED_NET_MBPS: u64 = 50;
const EMULATED_NET_LATENCY_US: u64 = 10;

/// The devices of a `scan` or `stencil` run: as given, or the emulated cluster when no
/// device option is given (and `--no-emulation` is not).
fn app_hardware(args: &GmemBenchArgs) -> crate::server_command::GmemArgs {
    let mut hardware = args.hardware.clone();
    if !args.no_emulation && hardware.gmem_ssd_mbps.is_none() && hardware.gmem_net_mbps.is_none() {
        hardware.gmem_ssd_mbps = Some(EMULATED_SSD_MBPS);
        hardware.gmem_ssd_latency_us = EMULATED_SSD_LATENCY_US;
        hardware.gmem_net_mbps = Some(EMULATED_NET_MBPS);
        hardware.gmem_net_latency_us = EMULATED_NET_LATENCY_US;
    }
    hardware
}

/// `ringfs bench gmem scan|stencil`.
fn run_app(args: &GmemBenchArgs) -> Result<()> {
    let workload = if args.workload == GmemWorkload::Scan { Workload::Scan } else { Workload::Stencil };
    let setups =
        args.setups.iter().map(|name| Setup::parse(name).with_context(|| format!("unknown setup {name:?}"))).collect::<Result<Vec<_>>>()?;
    let hardware = app_hardware(args);
    let rank_network = args.rank_net_mbps.or(hardware.gmem_net_mbps).map(|mbps| (mbps, hardware.gmem_net_latency_us));
    let default_cache = if workload == Workload::Scan { "4M" } else { "20M" };
    let config = AppConfig {
        workload,
        rank_counts: args.rank_counts.clone(),
        setups,
        servers: args.servers.unwrap_or(0),
        block_size: u32::try_from(parse_bytes(&args.block_size)?).context("block size too large")?,
        cache_per_rank: parse_bytes(args.cache.as_deref().unwrap_or(default_cache))?,
        dram_per_server: parse_bytes(args.dram.as_deref().unwrap_or("1M"))?,
        scan_bytes: parse_bytes(&args.array)?,
        cols: args.cols.max(3),
        rows_per_rank: args.rows.max(1),
        strip_rows: args.strip.max(1),
        iterations: args.iterations.max(1),
        out_of_core_factor: args.out_of_core.max(1),
        server_args: hardware.server_args(),
        rank_network,
        executable: std::env::current_exe().context("cannot find the ringfs executable")?,
    };
    println!("{}", describe(&config, &hardware));
    println!("{}", AppRun::CSV_HEADER);
    let runs = gmem_apps::run(&config, &mut |run| println!("{}", run.csv(workload)))?;
    let conditions = Conditions {
        workload,
        // The stencil's arrays are out of core in every setup but in-dram.
        out_of_core: workload == Workload::Stencil || config.scan_bytes > config.dram_per_server * scan_servers(&config),
        emulated_devices: hardware.gmem_ssd_mbps.is_some() || hardware.gmem_net_mbps.is_some(),
    };
    print!("{}", gmem_verdict::verdict(&runs, &conditions));
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

/// The servers of the largest scan run (one per rank unless a number is given).
fn scan_servers(config: &AppConfig) -> u64 {
    match config.servers {
        0 => u64::from(config.rank_counts.iter().copied().max().unwrap_or(1)),
        servers => servers as u64,
    }
}

/// What the runs measure, in a sentence: the data against the DRAM, the caches, the devices.
fn describe(config: &AppConfig, hardware: &crate::server_command::GmemArgs) -> String {
    let mib = |bytes: u64| format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20));
    let servers = if config.servers == 0 { "one server per rank".to_string() } else { format!("{} servers", config.servers) };
    let data = match config.workload {
        Workload::Scan => format!(
            "# shared scan: every rank reads a {} array; {} of DRAM per server ({servers})",
            mib(config.scan_bytes),
            mib(config.dram_per_server)
        ),
        Workload::Stencil => format!(
            "# out-of-core stencil: {} x {} f64 cells per rank in two arrays, {}x the servers' DRAM ({servers})",
            config.rows_per_rank, config.cols, config.out_of_core_factor
        ),
    };
    let devices = match (hardware.gmem_ssd_mbps, hardware.gmem_net_mbps) {
        (None, None) => "this machine's memory and loopback (no emulation)".to_string(),
        (ssd, net) => format!(
            "emulated SSD {} and links {}",
            ssd.map_or("off".into(), |mbps| format!("{mbps} MB/s + {} us", hardware.gmem_ssd_latency_us)),
            net.map_or("off".into(), |mbps| format!("{mbps} MB/s + {} us", hardware.gmem_net_latency_us))
        ),
    };
    format!("{data}; caches of {} per rank; {devices}", mib(config.cache_per_rank))
}
