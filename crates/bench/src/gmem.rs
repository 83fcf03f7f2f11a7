//! `ringfs bench gmem`: the global memory's latency and bandwidth for P ranks, for an array
//! that fits in the servers' DRAM and one several times larger (spilling to their SSDs),
//! beside a local `memcpy` and the native file client's reads of the same sizes, in one run.
//!
//! The coordinator ([`run`]) starts a local cluster and P rank processes (`ringfs bench
//! gmem-rank`), which measure in lockstep (barriers between phases) and print one
//! `GMEM ...` line per measurement; the coordinator gathers them into a report: latencies
//! are the median of the ranks' medians, bandwidths the bytes of all ranks over the slowest
//! rank's time.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use ringfs_gmem::{Distribution, GlobalArray, World};

use crate::BenchError;
use ringfs_config::env;

/// What `ringfs bench gmem` measures.
#[derive(Clone, Debug)]
pub struct GmemBenchConfig {
    pub ranks: u32,
    pub servers: usize,
    /// DRAM budget of each server's global memory.
    pub dram_per_server: u64,
    pub block_size: u32,
    /// Transfer sizes of the bandwidth measurements.
    pub sizes: Vec<u64>,
    /// Operations per latency measurement (per rank).
    pub latency_ops: u32,
    /// Bytes each rank moves per bandwidth measurement (at least one transfer).
    pub bytes_per_rank: u64,
    /// The spilling array is this many times the DRAM of all servers.
    pub spill_factor: u64,
    /// Extra `ringfs server` arguments (emulated SSD and network).
    pub server_args: Vec<String>,
    pub executable: PathBuf,
}

/// One measurement gathered from every rank.
#[derive(Clone, Debug, Default)]
pub struct Measurement {
    /// Per-rank medians and 99th percentiles of a latency (microseconds).
    pub medians_us: Vec<f64>,
    pub p99s_us: Vec<f64>,
    /// Bytes moved by all ranks, and the slowest rank's seconds.
    pub bytes: u64,
    pub seconds: f64,
}

impl Measurement {
    pub fn median_us(&self) -> f64 {
        median(&self.medians_us)
    }

    pub fn p99_us(&self) -> f64 {
        median(&self.p99s_us)
    }

    pub fn gigabytes_per_second(&self) -> f64 {
        if self.seconds > 0.0 { self.bytes as f64 / self.seconds / 1e9 } else { 0.0 }
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// Every measurement by name (`latency get 8 fit`, `bandwidth get 1048576 sequential spill`…).
pub type GmemReport = BTreeMap<String, Measurement>;

/// Runs the benchmark: a cluster, P ranks, their measurements gathered.
pub fn run(config: &GmemBenchConfig) -> Result<GmemReport, BenchError> {
    let mut launch = ringfs_launch::LaunchConfig::local(config.servers, config.executable.clone());
    launch.server_args = vec!["--gmem-dram".into(), config.dram_per_server.to_string()];
    launch.server_args.extend(config.server_args.iter().cloned());
    let cluster = ringfs_launch::start(&launch).map_err(|error| BenchError::Setup(error.to_string()))?;
    let outcome = run_ranks(&cluster, config);
    let stopped = cluster.stop();
    let report = outcome?;
    stopped.map_err(|error| BenchError::Setup(error.to_string()))?;
    Ok(report)
}

fn run_ranks(cluster: &ringfs_launch::Cluster, config: &GmemBenchConfig) -> Result<GmemReport, BenchError> {
    let job = format!("{:x}", std::process::id() as u64 * 7919 + 17);
    let sizes: Vec<String> = config.sizes.iter().map(u64::to_string).collect();
    let mut children = Vec::new();
    for rank in 0..config.ranks {
        let child = Command::new(&config.executable)
            .args(["bench", "gmem-rank"])
            .envs(cluster.environment())
            .env(env::GMEM_RANK, rank.to_string())
            .env(env::GMEM_RANKS, config.ranks.to_string())
            .env(env::GMEM_JOB, &job)
            .env(
                env::GMEM_BENCH,
                format!(
                    "{} {} {} {} {} {}",
                    config.dram_per_server * config.servers as u64,
                    config.block_size,
                    config.latency_ops,
                    config.bytes_per_rank,
                    config.spill_factor,
                    sizes.join(",")
                ),
            )
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|error| BenchError::Setup(format!("cannot start a rank: {error}")))?;
        children.push(child);
    }
    let mut report = GmemReport::new();
    let mut failed = None;
    for (rank, mut child) in children.into_iter().enumerate() {
        let stdout = child.stdout.take().expect("piped");
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(record) = line.strip_prefix("GMEM ") {
                gather(&mut report, record);
            }
        }
        let status = child.wait().map_err(|error| BenchError::Worker(error.to_string()))?;
        if !status.success() {
            failed.get_or_insert(format!("rank {rank} failed: {status}"));
        }
    }
    failed.map_or(Ok(report), |why| Err(BenchError::Worker(why)))
}

/// Adds one rank's line (`NAME|median_us|p99_us|bytes|seconds`) to the report.
fn gather(report: &mut GmemReport, record: &str) {
    let fields: Vec<&str> = record.split('|').collect();
    let [name, median_us, p99_us, bytes, seconds] = fields[..] else { return };
    let measurement = report.entry(name.to_string()).or_default();
    let number = |text: &str| text.parse::<f64>().unwrap_or(0.0);
    if number(median_us) > 0.0 {
        measurement.medians_us.push(number(median_us));
        measurement.p99s_us.push(number(p99_us));
    }
    measurement.bytes += bytes.parse::<u64>().unwrap_or(0);
    measurement.seconds = measurement.seconds.max(number(seconds));
}

/// The report as a table.
pub fn format_report(report: &GmemReport) -> String {
    let mut text = String::from("measurement                                   median µs   p99 µs      GB/s\n");
    for (name, measurement) in report {
        let latency = if measurement.medians_us.is_empty() {
            format!("{:>10} {:>8}", "-", "-")
        } else {
            format!("{:>10.1} {:>8.1}", measurement.median_us(), measurement.p99_us())
        };
        let bandwidth = if measurement.bytes > 0 { format!("{:>9.2}", measurement.gigabytes_per_second()) } else { format!("{:>9}", "-") };
        text.push_str(&format!("{name:<45} {latency} {bandwidth}\n"));
    }
    text
}

/// What a rank measures, from `RINGFS_GMEM_BENCH`.
struct RankPlan {
    total_dram: u64,
    block_size: u32,
    latency_ops: u32,
    bytes_per_rank: u64,
    spill_factor: u64,
    sizes: Vec<u64>,
}

fn plan_from_env() -> Result<RankPlan, BenchError> {
    let text = std::env::var(env::GMEM_BENCH).map_err(|_| BenchError::Setup(format!("{} is not set", env::GMEM_BENCH)))?;
    let fields: Vec<&str> = text.split_whitespace().collect();
    let number = |index: usize| {
        fields.get(index).and_then(|field| field.parse::<u64>().ok()).ok_or_else(|| BenchError::Setup(format!("bad plan {text:?}")))
    };
    Ok(RankPlan {
        total_dram: number(0)?,
        block_size: number(1)? as u32,
        latency_ops: number(2)? as u32,
        bytes_per_rank: number(3)?,
        spill_factor: number(4)?,
        sizes: fields.get(5).map(|sizes| sizes.split(',').filter_map(|size| size.parse().ok()).collect()).unwrap_or_default(),
    })
}

/// A small random generator (xorshift), one per rank.
struct Random(u64);

impl Random {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound.max(1)
    }
}

fn print_latency(name: &str, samples: &mut [f64]) {
    samples.sort_by(f64::total_cmp);
    let median = samples[samples.len() / 2];
    let p99 = samples[(samples.len() * 99 / 100).min(samples.len() - 1)];
    println!("GMEM {name}|{median:.3}|{p99:.3}|0|0");
}

fn gmem_error(error: ringfs_gmem::Errno) -> BenchError {
    BenchError::Worker(format!("global memory: {error}"))
}

/// One rank of `ringfs bench gmem` (`ringfs bench gmem-rank`).
pub fn rank_main() -> Result<(), BenchError> {
    let plan = plan_from_env()?;
    let world = World::init().map_err(gmem_error)?;
    let (rank, ranks) = (u64::from(world.rank()), u64::from(world.ranks()));
    let mut random = Random(rank.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    // Both arrays are filled (each rank its share) so that reads find real blocks.
    let fit_bytes = (plan.total_dram / 2).max(plan.sizes.iter().copied().max().unwrap_or(0) * ranks);
    let spill_bytes = plan.total_dram * plan.spill_factor;
    let arrays = [("fit", fit_bytes), ("spill", spill_bytes)];
    for (label, bytes) in arrays {
        let array = world.alloc(bytes, Distribution::Block, plan.block_size).map_err(gmem_error)?;
        fill(&world, &array, rank, ranks, label)?;
        if label == "fit" {
            latencies(&world, &array, &plan, &mut random)?;
        }
        for size in &plan.sizes {
            for pattern in ["sequential", "random"] {
                bandwidth(&world, &array, *size, pattern, label, &plan, &mut random)?;
            }
        }
        world.barrier().map_err(gmem_error)?;
        world.free(&array).map_err(gmem_error)?;
    }
    local_baselines(&world, &plan)?;
    Ok(())
}

/// Writes this rank's share of `array` in 4 MiB puts (its bandwidth reported).
fn fill(world: &World, array: &GlobalArray, rank: u64, ranks: u64, label: &str) -> Result<(), BenchError> {
    let share = array.len() / ranks;
    let chunk = vec![rank as u8 + 1; 4 << 20];
    world.barrier().map_err(gmem_error)?;
    let started = Instant::now();
    let mut at = rank * share;
    let end = if rank + 1 == ranks { array.len() } else { (rank + 1) * share };
    while at < end {
        let len = (end - at).min(chunk.len() as u64) as usize;
        array.put(at, &chunk[..len]).map_err(gmem_error)?;
        at += len as u64;
    }
    let seconds = started.elapsed().as_secs_f64();
    world.barrier().map_err(gmem_error)?;
    println!("GMEM bandwidth put 4194304 sequential {label}|0|0|{}|{seconds:.6}", end - rank * share);
    Ok(())
}

/// Blocking get and put latencies of 8 B and 4 KiB at random places.
fn latencies(world: &World, array: &GlobalArray, plan: &RankPlan, random: &mut Random) -> Result<(), BenchError> {
    let mut buffer = vec![0u8; 4096];
    for size in [8usize, 4096] {
        for operation in ["get", "put"] {
            world.barrier().map_err(gmem_error)?;
            let mut samples = Vec::with_capacity(plan.latency_ops as usize);
            for _ in 0..plan.latency_ops {
                let offset = random.below(array.len() / size as u64) * size as u64;
                let started = Instant::now();
                if operation == "get" {
                    array.get(offset, &mut buffer[..size]).map_err(gmem_error)?;
                } else {
                    array.put(offset, &buffer[..size]).map_err(gmem_error)?;
                }
                samples.push(started.elapsed().as_secs_f64() * 1e6);
            }
            print_latency(&format!("latency {operation} {size} fit"), &mut samples);
        }
    }
    world.barrier().map_err(gmem_error)
}

/// Gets of `size` bytes, `plan.bytes_per_rank` per rank, in order from the rank's own part
/// (`sequential`) or at random aligned places.
fn bandwidth(
    world: &World,
    array: &GlobalArray,
    size: u64,
    pattern: &str,
    label: &str,
    plan: &RankPlan,
    random: &mut Random,
) -> Result<(), BenchError> {
    let mut buffer = vec![0u8; size as usize];
    let transfers = (plan.bytes_per_rank / size).max(1);
    let slots = (array.len() / size).max(1);
    let first = world.rank() as u64 * slots / u64::from(world.ranks());
    world.barrier().map_err(gmem_error)?;
    let started = Instant::now();
    for transfer in 0..transfers {
        let slot = if pattern == "sequential" { (first + transfer) % slots } else { random.below(slots) };
        array.get(slot * size, &mut buffer).map_err(gmem_error)?;
    }
    let seconds = started.elapsed().as_secs_f64();
    world.barrier().map_err(gmem_error)?;
    println!("GMEM bandwidth get {size} {pattern} {label}|0|0|{}|{seconds:.6}", transfers * size);
    Ok(())
}

/// The same transfer sizes as a local `memcpy` and as reads of a file through the native
/// client (sequential), on every rank at once.
fn local_baselines(world: &World, plan: &RankPlan) -> Result<(), BenchError> {
    let client = world.client();
    let path = format!("/gmem-bench-{}", world.rank());
    let file_bytes = plan.bytes_per_rank.max(plan.sizes.iter().copied().max().unwrap_or(0));
    let file_error = |error: ringfs_client::Errno| BenchError::Worker(format!("file baseline: {error}"));
    let fd = client
        .open(&path, ringfs_client::OpenFlags::WRITE | ringfs_client::OpenFlags::CREATE | ringfs_client::OpenFlags::TRUNCATE, 0o644)
        .map_err(file_error)?;
    let block = vec![7u8; 4 << 20];
    let mut at = 0;
    while at < file_bytes {
        let len = (file_bytes - at).min(block.len() as u64) as usize;
        client.pwrite(fd, &block[..len], at).map_err(file_error)?;
        at += len as u64;
    }
    client.close(fd).map_err(file_error)?;
    let source = vec![3u8; 64 << 20];
    for size in &plan.sizes {
        let mut buffer = vec![0u8; *size as usize];
        let transfers = (plan.bytes_per_rank / size).max(1);
        world.barrier().map_err(gmem_error)?;
        let started = Instant::now();
        for transfer in 0..transfers {
            let from = (transfer * size) as usize % (source.len() - *size as usize + 1);
            buffer.copy_from_slice(&source[from..from + *size as usize]);
            std::hint::black_box(&buffer);
        }
        let seconds = started.elapsed().as_secs_f64();
        println!("GMEM baseline memcpy {size}|0|0|{}|{seconds:.6}", transfers * size);
        world.barrier().map_err(gmem_error)?;
        let fd = client.open(&path, ringfs_client::OpenFlags::READ, 0).map_err(file_error)?;
        let started = Instant::now();
        for transfer in 0..transfers {
            let offset = (transfer * size) % (file_bytes - size + 1);
            client.pread(fd, &mut buffer, offset).map_err(file_error)?;
        }
        let seconds = started.elapsed().as_secs_f64();
        client.close(fd).map_err(file_error)?;
        println!("GMEM baseline file-read {size}|0|0|{}|{seconds:.6}", transfers * size);
    }
    world.barrier().map_err(gmem_error)?;
    client.unlink(&path).map_err(file_error)?;
    Ok(())
}
