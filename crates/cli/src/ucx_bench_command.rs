//! `ringfs bench ucx`: the UCX frame transport against `ucx_perftest` (see `ringfs_bench::ucx`),
//! and `ringfs bench rpc`: the client's round trip and bandwidth on a running cluster's
//! transport (see `ringfs_bench::rpc_trip`).

use std::time::Duration;

use anyhow::Result;
use clap::Args;
use ringfs_bench::rpc_trip;
use ringfs_bench::ucx::{self, UcxBenchConfig};

#[derive(Args, Debug)]
pub struct UcxBenchArgs {
    /// UCX transport lists to measure, as LABEL=UCX_TLS (repeatable).
    #[arg(long = "variant", default_values_t = ["tcp=tcp".to_string(), "shm=posix,sysv,cma,tcp".to_string()])]
    pub variants: Vec<String>,
    /// Rounds per variant (the report gives medians).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Small requests timed per round.
    #[arg(long, default_value_t = 20_000)]
    pub latency_iterations: usize,
    /// 1 MiB transfers per bandwidth measurement.
    #[arg(long, default_value_t = 2_000)]
    pub bandwidth_iterations: usize,
    /// Requests in flight in the bandwidth measurements.
    #[arg(long, default_value_t = 8)]
    pub window: usize,
    /// Also time inline against RMA transfers from 4 KiB to 1 MiB.
    #[arg(long)]
    pub sweep: bool,
    /// Also compare forced RMA with UCX's own RMA (ucx_perftest ucp_get, ucp_put_bw).
    #[arg(long)]
    pub rma: bool,
}

#[derive(Args, Debug)]
pub struct RpcBenchArgs {
    /// Pings timed per repeat.
    #[arg(long, default_value_t = 20_000)]
    pub pings: usize,
    /// Bytes written and read per repeat, in 1 MiB requests.
    #[arg(long, default_value = "64M")]
    pub size: String,
    /// Repeats (the report gives medians).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
}

#[derive(Args, Debug)]
pub struct UcxServeArgs {
    #[arg(long)]
    pub transports: String,
    #[arg(long, default_value_t = ringfs_ucx::frames::DEFAULT_RMA_THRESHOLD)]
    pub rma_threshold: usize,
    /// How long the server polls after an event before it sleeps.
    #[arg(long, default_value_t = 1000)]
    pub spin_ms: u64,
}

pub fn run(args: &UcxBenchArgs) -> Result<()> {
    let mut variants = Vec::new();
    for variant in &args.variants {
        let Some((label, transports)) = variant.split_once('=') else {
            anyhow::bail!("expected LABEL=UCX_TLS, got {variant:?}");
        };
        variants.push((label.to_string(), transports.to_string()));
    }
    let config = UcxBenchConfig {
        variants,
        rounds: args.rounds.max(1),
        latency_iterations: args.latency_iterations.max(100),
        bandwidth_iterations: args.bandwidth_iterations.max(10),
        window: args.window.max(1),
        ringfs: std::env::current_exe()?,
        sweep: args.sweep,
        rma: args.rma,
    };
    let results = ucx::run(&config)?;
    print!("{}", ucx::report(&results, &config));
    Ok(())
}

pub fn serve(args: &UcxServeArgs) -> Result<()> {
    Ok(ucx::serve(&args.transports, Duration::from_millis(args.spin_ms), args.rma_threshold)?)
}

pub fn run_rpc(args: &RpcBenchArgs) -> Result<()> {
    let size_bytes = crate::server_command::parse_bytes(&args.size)?;
    let config = rpc_trip::RpcBenchConfig { pings: args.pings.max(100), size_bytes, repeats: args.repeats.max(1) };
    let client = ringfs_client::Client::from_env()?;
    let result = rpc_trip::run(&client, &config)?;
    print!("{}", rpc_trip::report(&result));
    Ok(())
}
