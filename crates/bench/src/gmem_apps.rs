//! `ringfs bench gmem scan|stencil`: the vGASNet report's two experiments, on emulated
//! SSDs and network links (`docs/PERFORMANCE.md`, "Global memory caches").
//!
//! - **Shared scan**: every rank reads the same array from its start to its end, in gets of
//!   one block; the array is written first and every cache emptied, so the first reader of
//!   each block finds it at its home (mostly on the home's SSD).
//! - **Out-of-core stencil**: a weak-scaling 2-D Jacobi sweep (5 points) over two arrays of
//!   `P * rows` x `cols` f64, each rank updating its band of `rows` rows strip by strip (a
//!   get of the strip with one halo row above and below, a put of the new strip); a barrier
//!   after every iteration. Its result is checked bitwise against the same sweep in one
//!   process's memory.
//!
//! Each is run for every rank count and configuration: no cache (every access at the home),
//! caches without cooperation (only homes serve data), caches with cooperation, and (the
//! stencil) everything in DRAM. A fresh local cluster serves each run.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use ringfs_gmem::{Distribution, GlobalArray, World};

use crate::BenchError;
use ringfs_config::env;

/// Which experiment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    Scan,
    Stencil,
}

/// How the ranks hold blocks in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setup {
    /// No cache: every get and put goes to the block's home.
    NoCache,
    /// Caches; only homes serve data.
    HomeServed,
    /// Caches; a rank holding a copy serves the next reader.
    Cooperative,
    /// Cooperative caches, and the reads of a block queued at its home answered together,
    /// the readers relaying the copy to each other.
    Relayed,
    /// Cooperative caches, and servers with DRAM for everything (no SSD).
    InDram,
}

impl Setup {
    pub fn name(self) -> &'static str {
        match self {
            Setup::NoCache => "no-cache",
            Setup::HomeServed => "cache",
            Setup::Cooperative => "cache+coop",
            Setup::Relayed => "cache+relay",
            Setup::InDram => "in-dram",
        }
    }

    pub fn parse(text: &str) -> Option<Setup> {
        [Setup::NoCache, Setup::HomeServed, Setup::Cooperative, Setup::Relayed, Setup::InDram]
            .into_iter()
            .find(|setup| setup.name() == text)
    }
}

/// What `ringfs bench gmem scan|stencil` runs.
#[derive(Clone, Debug)]
pub struct AppConfig {
    pub workload: Workload,
    pub rank_counts: Vec<u32>,
    pub setups: Vec<Setup>,
    /// Servers of each run's cluster; 0: one per rank, as on a cluster of one rank per node.
    pub servers: usize,
    pub block_size: u32,
    /// Each rank's cache.
    pub cache_per_rank: u64,
    /// Each server's DRAM for global memory (in-DRAM runs get enough for everything).
    pub dram_per_server: u64,
    /// Scan: the array's bytes.
    pub scan_bytes: u64,
    /// Stencil: columns, rows per rank, rows per strip, iterations.
    pub cols: u64,
    pub rows_per_rank: u64,
    pub strip_rows: u64,
    pub iterations: u32,
    /// Stencil: the servers' DRAM is the arrays' bytes over this (2: twice the DRAM).
    pub out_of_core_factor: u64,
    /// `ringfs server` arguments of the emulated SSD and network.
    pub server_args: Vec<String>,
    /// The ranks' emulated network link (MB/s, latency µs).
    pub rank_network: Option<(u64, u64)>,
    pub executable: PathBuf,
}

/// One run's outcome.
#[derive(Clone, Debug, Default)]
pub struct AppRun {
    pub ranks: u32,
    pub setup: String,
    /// The slowest rank's time (scan: the whole scan; stencil: all iterations).
    pub seconds: f64,
    pub bytes_from_homes: u64,
    pub bytes_from_peers: u64,
    pub ssd_read_bytes: u64,
    pub ssd_write_bytes: u64,
    /// Stencil: the result equals the single-process reference.
    pub checked: Option<bool>,
}

impl AppRun {
    /// The CSV header of [`AppRun::csv`].
    pub const CSV_HEADER: &'static str =
        "workload,ranks,setup,seconds,bytes_from_homes,bytes_from_peers,ssd_read_bytes,ssd_write_bytes,checked";

    pub fn csv(&self, workload: Workload) -> String {
        format!(
            "{},{},{},{:.4},{},{},{},{},{}",
            if workload == Workload::Scan { "scan" } else { "stencil" },
            self.ranks,
            self.setup,
            self.seconds,
            self.bytes_from_homes,
            self.bytes_from_peers,
            self.ssd_read_bytes,
            self.ssd_write_bytes,
            self.checked.map_or("-", |ok| if ok { "yes" } else { "NO" })
        )
    }
}

/// Runs every (rank count, setup) of `config`; `progress` sees each run as it ends.
pub fn run(config: &AppConfig, progress: &mut dyn FnMut(&AppRun)) -> Result<Vec<AppRun>, BenchError> {
    let mut runs = Vec::new();
    for &ranks in &config.rank_counts {
        for &setup in &config.setups {
            if config.workload == Workload::Scan && setup == Setup::InDram {
                continue;
            }
            let run = run_one(config, ranks, setup)?;
            progress(&run);
            if run.checked == Some(false) {
                return Err(BenchError::Worker(format!(
                    "{} ranks, {}: the stencil's result differs from the reference",
                    ranks,
                    setup.name()
                )));
            }
            runs.push(run);
        }
    }
    Ok(runs)
}

/// The arrays' bytes of a stencil run with `ranks` ranks.
fn stencil_bytes(config: &AppConfig, ranks: u32) -> u64 {
    2 * u64::from(ranks) * config.rows_per_rank * config.cols * 8
}

fn run_one(config: &AppConfig, ranks: u32, setup: Setup) -> Result<AppRun, BenchError> {
    // One server per rank (node) unless a number is given.
    let servers = if config.servers == 0 { ranks as usize } else { config.servers };
    let dram = match (config.workload, setup) {
        (Workload::Stencil, Setup::InDram) => 2 * stencil_bytes(config, ranks) / servers as u64 + (64 << 20),
        (Workload::Stencil, _) => stencil_bytes(config, ranks) / config.out_of_core_factor.max(1) / servers as u64,
        (Workload::Scan, _) => config.dram_per_server,
    };
    let mut launch = ringfs_launch::LaunchConfig::local(servers, config.executable.clone());
    launch.server_args = vec!["--gmem-dram".into(), dram.to_string()];
    launch.server_args.extend(config.server_args.iter().cloned());
    let cluster = ringfs_launch::start(&launch).map_err(|error| BenchError::Setup(error.to_string()))?;
    let outcome = run_ranks(&cluster, config, ranks, setup);
    let stats = ringfs_client::Client::connect(cluster.client_config()).ok().and_then(|client| client.server_stats().ok());
    let stopped = cluster.stop();
    let mut run = outcome?;
    stopped.map_err(|error| BenchError::Setup(error.to_string()))?;
    for server in stats.unwrap_or_default() {
        if let Some(gmem) = server.gmem {
            run.ssd_read_bytes += gmem.ssd_read_bytes;
            run.ssd_write_bytes += gmem.ssd_write_bytes;
        }
    }
    Ok(run)
}

fn run_ranks(cluster: &ringfs_launch::Cluster, config: &AppConfig, ranks: u32, setup: Setup) -> Result<AppRun, BenchError> {
    let job = format!("{:x}", u64::from(std::process::id()) * 7919 + u64::from(ranks) * 31 + setup as u64);
    let plan = match config.workload {
        Workload::Scan => format!("scan {} {}", config.scan_bytes, config.block_size),
        Workload::Stencil => {
            format!("stencil {} {} {} {} {}", config.cols, config.rows_per_rank, config.strip_rows, config.iterations, config.block_size)
        }
    };
    let cache = if setup == Setup::NoCache { "0".to_string() } else { config.cache_per_rank.to_string() };
    let cache = if setup == Setup::InDram { (2 * stencil_bytes(config, 1)).max(config.cache_per_rank).to_string() } else { cache };
    let mut children = Vec::new();
    for rank in 0..ranks {
        let mut command = Command::new(&config.executable);
        command
            .args(["bench", "gmem-rank"])
            .envs(cluster.environment())
            .env(env::GMEM_RANK, rank.to_string())
            .env(env::GMEM_RANKS, ranks.to_string())
            .env(env::GMEM_JOB, &job)
            .env(env::GMEM_APP, &plan)
            .env(env::GMEM_CACHE, &cache)
            .env(env::GMEM_COOP, if setup == Setup::HomeServed { "0" } else { "1" })
            .env(env::GMEM_RELAY, if setup == Setup::Relayed { "1" } else { "0" })
            .stdout(Stdio::piped());
        if let Some((mbps, latency)) = config.rank_network {
            command.env(env::GMEM_NET_MBPS, mbps.to_string()).env(env::GMEM_NET_LATENCY_US, latency.to_string());
        }
        children.push(command.spawn().map_err(|error| BenchError::Setup(format!("cannot start a rank: {error}")))?);
    }
    let mut run = AppRun { ranks, setup: setup.name().to_string(), ..AppRun::default() };
    let mut digests = Vec::new();
    let mut failed = None;
    for (rank, mut child) in children.into_iter().enumerate() {
        let stdout = child.stdout.take().expect("piped");
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let Some(record) = line.strip_prefix("GMEMAPP ") else { continue };
            let fields: Vec<&str> = record.split_whitespace().collect();
            let number = |index: usize| fields.get(index).and_then(|field| field.parse::<f64>().ok()).unwrap_or(0.0);
            run.seconds = run.seconds.max(number(0));
            run.bytes_from_homes += number(1) as u64;
            run.bytes_from_peers += number(2) as u64;
            if let Some(digest) = fields.get(3) {
                digests.push((rank as u64, digest.to_string()));
            }
        }
        let status = child.wait().map_err(|error| BenchError::Worker(error.to_string()))?;
        if !status.success() {
            failed.get_or_insert(format!("rank {rank} failed: {status}"));
        }
    }
    if let Some(why) = failed {
        return Err(BenchError::Worker(why));
    }
    if config.workload == Workload::Stencil {
        let reference = reference_digests(config.cols, config.rows_per_rank, ranks, config.iterations);
        run.checked = Some(digests.len() == ranks as usize && digests.iter().all(|(rank, digest)| reference[*rank as usize] == *digest));
    }
    Ok(run)
}

fn gmem_error(error: ringfs_gmem::Errno) -> BenchError {
    BenchError::Worker(format!("global memory: {error}"))
}

/// One rank of `ringfs bench gmem scan|stencil` (`ringfs bench gmem-rank` with
/// `RINGFS_GMEM_APP` set).
pub fn rank_main(plan: &str) -> Result<(), BenchError> {
    let fields: Vec<u64> = plan.split_whitespace().skip(1).filter_map(|field| field.parse().ok()).collect();
    let world = World::init().map_err(gmem_error)?;
    match (plan.split_whitespace().next(), &fields[..]) {
        (Some("scan"), &[bytes, block_size]) => scan_rank(&world, bytes, block_size as u32),
        (Some("stencil"), &[cols, rows, strip, iterations, block_size]) => {
            stencil_rank(&world, cols, rows, strip, iterations as u32, block_size as u32)
        }
        _ => Err(BenchError::Setup(format!("bad RINGFS_GMEM_APP {plan:?}"))),
    }
}

/// The byte at `at` of the scanned array.
fn scan_byte(at: u64) -> u8 {
    (at % 251) as u8
}

fn scan_rank(world: &World, bytes: u64, block_size: u32) -> Result<(), BenchError> {
    let (rank, ranks) = (u64::from(world.rank()), u64::from(world.ranks()));
    let array = world.alloc(bytes, Distribution::Block, block_size).map_err(gmem_error)?;
    // Every rank writes its part, then empties its cache: the scan starts cold.
    let share = bytes.div_ceil(ranks).next_multiple_of(u64::from(block_size));
    let (start, end) = ((rank * share).min(bytes), ((rank + 1) * share).min(bytes));
    let mut chunk = vec![0u8; block_size as usize];
    let mut at = start;
    while at < end {
        let len = (end - at).min(u64::from(block_size)) as usize;
        for (index, byte) in chunk[..len].iter_mut().enumerate() {
            *byte = scan_byte(at + index as u64);
        }
        array.put(at, &chunk[..len]).map_err(gmem_error)?;
        at += len as u64;
    }
    world.flush_cache().map_err(gmem_error)?;
    world.barrier().map_err(gmem_error)?;
    let before = world.cache_stats().unwrap_or_default();
    let started = Instant::now();
    let mut at = 0;
    while at < bytes {
        let len = (bytes - at).min(u64::from(block_size)) as usize;
        array.get(at, &mut chunk[..len]).map_err(gmem_error)?;
        // One byte of every 4 KiB is checked (the whole array is, over the ranks).
        let probe = ((rank * 4099) % 4096) as usize;
        for index in (probe..len).step_by(4096) {
            if chunk[index] != scan_byte(at + index as u64) {
                return Err(BenchError::Worker(format!("rank {rank}: byte {} of the array is wrong", at + index as u64)));
            }
        }
        at += len as u64;
    }
    let seconds = started.elapsed().as_secs_f64();
    let after = world.cache_stats().unwrap_or_default();
    world.barrier().map_err(gmem_error)?;
    // Without a cache every byte comes from a home.
    let from_homes = if world.cache_stats().is_some() { after.bytes_from_homes - before.bytes_from_homes } else { bytes };
    println!("GMEMAPP {seconds:.6} {from_homes} {}", after.bytes_from_peers - before.bytes_from_peers);
    Ok(())
}

/// The starting value of cell (`row`, `col`): a pattern with no symmetry.
fn initial_cell(row: u64, col: u64) -> f64 {
    ((row * 131 + col * 71) % 1000) as f64 * 0.001
}

/// One Jacobi step of row `row` (0 < row < last, 0 < col < cols - 1 updated; edges copied).
fn relax_row(above: &[f64], row: &[f64], below: &[f64], out: &mut [f64]) {
    let cols = row.len();
    out[0] = row[0];
    out[cols - 1] = row[cols - 1];
    for col in 1..cols - 1 {
        out[col] = 0.25 * (above[col] + below[col] + row[col - 1] + row[col + 1]);
    }
}

/// The xxh3 digests of each rank's band after `iterations` sweeps, computed in one process.
fn reference_digests(cols: u64, rows_per_rank: u64, ranks: u32, iterations: u32) -> Vec<String> {
    let rows = rows_per_rank * u64::from(ranks);
    let cols_usize = cols as usize;
    let mut a: Vec<f64> = (0..rows).flat_map(|row| (0..cols).map(move |col| initial_cell(row, col))).collect();
    let mut b = a.clone();
    for _ in 0..iterations {
        for row in 1..rows as usize - 1 {
            let (above, rest) = a[(row - 1) * cols_usize..].split_at(cols_usize);
            let (middle, rest) = rest.split_at(cols_usize);
            relax_row(above, middle, &rest[..cols_usize], &mut b[row * cols_usize..(row + 1) * cols_usize]);
        }
        std::mem::swap(&mut a, &mut b);
    }
    (0..u64::from(ranks))
        .map(|rank| {
            let band = &a[(rank * rows_per_rank * cols) as usize..((rank + 1) * rows_per_rank * cols) as usize];
            digest(band)
        })
        .collect()
}

fn digest(cells: &[f64]) -> String {
    let bytes: Vec<u8> = cells.iter().flat_map(|cell| cell.to_le_bytes()).collect();
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes))
}

fn as_bytes(cells: &[f64]) -> Vec<u8> {
    cells.iter().flat_map(|cell| cell.to_le_bytes()).collect()
}

fn from_bytes(bytes: &[u8], cells: &mut [f64]) {
    for (cell, chunk) in cells.iter_mut().zip(bytes.chunks_exact(8)) {
        *cell = f64::from_le_bytes(chunk.try_into().expect("8 bytes"));
    }
}

fn stencil_rank(world: &World, cols: u64, rows_per_rank: u64, strip: u64, iterations: u32, block_size: u32) -> Result<(), BenchError> {
    let (rank, ranks) = (u64::from(world.rank()), u64::from(world.ranks()));
    let rows = rows_per_rank * ranks;
    let row_bytes = cols * 8;
    let len = rows * row_bytes;
    let mut arrays: Vec<GlobalArray> =
        (0..2).map(|_| world.alloc(len, Distribution::Block, block_size)).collect::<Result<_, _>>().map_err(gmem_error)?;
    let (first, last) = (rank * rows_per_rank, (rank + 1) * rows_per_rank);
    // Both arrays start as the pattern (their edges never change).
    for array in &arrays {
        for lo in (first..last).step_by(strip as usize) {
            let hi = (lo + strip).min(last);
            let cells: Vec<f64> = (lo..hi).flat_map(|row| (0..cols).map(move |col| initial_cell(row, col))).collect();
            array.put(lo * row_bytes, &as_bytes(&cells)).map_err(gmem_error)?;
        }
    }
    world.flush_cache().map_err(gmem_error)?;
    world.barrier().map_err(gmem_error)?;
    let before = world.cache_stats().unwrap_or_default();
    let (mut fetched, mut bytes_in) = (vec![0f64; ((strip + 2) * cols) as usize], vec![0u8; ((strip + 2) * row_bytes) as usize]);
    let mut out = vec![0f64; (strip * cols) as usize];
    let started = Instant::now();
    let mut gets = 0u64;
    for _ in 0..iterations {
        let (a, b) = (&arrays[0], &arrays[1]);
        for lo in (first..last).step_by(strip as usize) {
            let hi = (lo + strip).min(last);
            let (from, to) = (lo.saturating_sub(1), (hi + 1).min(rows));
            let fetched_bytes = &mut bytes_in[..((to - from) * row_bytes) as usize];
            a.get(from * row_bytes, fetched_bytes).map_err(gmem_error)?;
            gets += fetched_bytes.len() as u64;
            from_bytes(fetched_bytes, &mut fetched);
            let cols = cols as usize;
            for row in lo..hi {
                let local = (row - from) as usize;
                let target = &mut out[(row - lo) as usize * cols..(row - lo + 1) as usize * cols];
                if row == 0 || row == rows - 1 {
                    target.copy_from_slice(&fetched[local * cols..(local + 1) * cols]);
                } else {
                    let (above, rest) = fetched[(local - 1) * cols..].split_at(cols);
                    let (middle, rest) = rest.split_at(cols);
                    relax_row(above, middle, &rest[..cols], target);
                }
            }
            b.put(lo * row_bytes, &as_bytes(&out[..((hi - lo) * cols as u64) as usize])).map_err(gmem_error)?;
        }
        world.barrier().map_err(gmem_error)?;
        arrays.swap(0, 1);
    }
    let seconds = started.elapsed().as_secs_f64();
    let after = world.cache_stats().unwrap_or_default();
    // The band's digest (read back through the global memory).
    let mut band = vec![0u8; ((last - first) * row_bytes) as usize];
    arrays[0].get(first * row_bytes, &mut band).map_err(gmem_error)?;
    let mut cells = vec![0f64; band.len() / 8];
    from_bytes(&band, &mut cells);
    world.barrier().map_err(gmem_error)?;
    let from_homes = if world.cache_stats().is_some() { after.bytes_from_homes - before.bytes_from_homes } else { gets };
    println!("GMEMAPP {seconds:.6} {from_homes} {} {}", after.bytes_from_peers - before.bytes_from_peers, digest(&cells));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_keeps_edges_and_averages_the_inside() {
        let digests = reference_digests(4, 2, 2, 1);
        assert_eq!(digests.len(), 2);
        let mut out = [0.0; 4];
        relax_row(&[1.0, 1.0, 1.0, 1.0], &[2.0, 0.0, 4.0, 3.0], &[1.0, 1.0, 1.0, 1.0], &mut out);
        assert_eq!(out, [2.0, 0.25 * (1.0 + 1.0 + 2.0 + 4.0), 0.25 * (1.0 + 1.0 + 0.0 + 3.0), 3.0]);
        let sweeps: Vec<Vec<String>> = (0..3).map(|iterations| reference_digests(8, 4, 2, iterations)).collect();
        assert_ne!(sweeps[0], sweeps[1], "a sweep changes the inside");
        assert_ne!(sweeps[1], sweeps[2], "and the next one too");
    }
}
