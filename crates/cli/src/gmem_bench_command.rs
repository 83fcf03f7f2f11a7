//! `ringfs bench gmem`: the global memory's latency and bandwidth (see `ringfs_bench::gmem`).

use anyhow::{Context, Result};
use clap::Args;
use ringfs_bench::gmem::{self, GmemBenchConfig};

use crate::server_command::parse_bytes;

#[derive(Args, Debug, Clone)]
pub struct GmemBenchArgs {
    /// Rank processes.
    #[arg(long, default_value_t = 2)]
    pub ranks: u32,
    /// Servers of the local cluster started for the benchmark.
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
    #[command(flatten)]
    pub hardware: crate::server_command::GmemArgs,
}

pub fn run(args: &GmemBenchArgs) -> Result<()> {
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
