//! `ringfs bench flush`: the seed's I/O-aware flushing experiment (CHFS/Cache on RDBench).
//!
//! A reaction-diffusion-like job: every iteration, each process computes for a while, then
//! writes its part of the iteration's snapshot into one shared file (`/snapshots/stepN`,
//! rank r's part at `r × part`). The same job runs against clusters that cache a backend
//! directory with each flush policy. Measured per run: the write bandwidth of the snapshot
//! phases (bytes written / time in write phases, the slowest process setting each phase's
//! time), the compute phases' time (flushing competes for the CPU), and how long the final
//! sync takes. After the run every snapshot in the backend is checked byte by byte.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::io500::pattern;
use crate::target::Target;
use crate::workers::{PhaseResult, WorkerResult, Workers, number};
use crate::{BenchError, median};

/// How a compute phase passes its time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compute {
    /// Busy on a core (a CPU-bound solver: flushing competes with it for the CPU).
    Spin,
    /// Asleep (an accelerator or another node computes: the CPU is free).
    Sleep,
}

impl std::str::FromStr for Compute {
    type Err = String;

    fn from_str(text: &str) -> Result<Compute, String> {
        match text {
            "spin" => Ok(Compute::Spin),
            "sleep" => Ok(Compute::Sleep),
            other => Err(format!("unknown compute kind {other:?}: expected spin or sleep")),
        }
    }
}

impl std::fmt::Display for Compute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Compute::Spin => "spin",
            Compute::Sleep => "sleep",
        })
    }
}

/// Parameters of the job.
#[derive(Clone, Debug)]
pub struct FlushBenchConfig {
    pub processes: usize,
    /// Bytes each process writes into each snapshot.
    pub part_bytes: u64,
    /// Size of each write call.
    pub block_bytes: usize,
    pub iterations: u64,
    pub compute: Duration,
    pub compute_kind: Compute,
}

/// What one run of the job measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct JobTimes {
    /// Time in snapshot phases and bytes written there.
    pub write_seconds: f64,
    pub write_bytes: u64,
    /// Time in compute phases.
    pub compute_seconds: f64,
    /// The `sync` after the last iteration.
    pub drain_seconds: f64,
    /// Bytes the servers flushed while the snapshots were being written.
    pub flushed_while_writing: u64,
    /// The longest time a server's flusher took to stop after a request arrived, in µs.
    pub longest_stop_us: u64,
}

/// What the job needs from the cluster it runs against.
pub trait JobCluster {
    /// Writes everything dirty to the backend.
    fn sync(&mut self) -> Result<(), BenchError>;
    /// Bytes the servers have flushed so far.
    fn flushed_bytes(&mut self) -> Result<u64, BenchError>;
    /// The longest time any server's flusher took to stop after a request arrived, in µs.
    fn longest_stop_us(&mut self) -> Result<u64, BenchError>;
}

impl JobTimes {
    pub fn write_bandwidth(&self) -> f64 {
        self.write_bytes as f64 / self.write_seconds.max(1e-9)
    }
}

/// Pattern writer id of rank `rank`'s part of snapshot `step`.
fn writer_of(step: u64, rank: usize) -> u64 {
    (step << 20) | rank as u64
}

fn snapshot_path(step: u64) -> String {
    format!("/snapshots/step{step}")
}

/// Runs one command of the job in a worker:
///
/// | command | does |
/// |---|---|
/// | `setup` | rank 0 creates `/snapshots` |
/// | `calibrate MS` | computes for MS milliseconds; answers the units of work done |
/// | `spin UNITS` | computes UNITS units of work (the time it takes grows when the CPU is shared) |
/// | `sleep MS` | sleeps MS milliseconds |
/// | `write STEP PART BLOCK` | writes this rank's PART bytes of snapshot STEP in BLOCK-byte calls |
pub fn worker_command(target: &Target, rank: usize, words: &[&str]) -> Result<WorkerResult, String> {
    let started = Instant::now();
    let mut ops = 1;
    let bytes = match words.first().copied() {
        Some("setup") => {
            if rank == 0 {
                target.mkdir("/snapshots").map_err(|error| error.to_string())?;
            }
            0
        }
        Some("calibrate") => {
            let duration = Duration::from_millis(number(words, 1)?);
            ops = 0;
            while started.elapsed() < duration {
                spin(1);
                ops += 1;
            }
            0
        }
        Some("spin") => {
            spin(number(words, 1)?);
            0
        }
        Some("sleep") => {
            std::thread::sleep(Duration::from_millis(number(words, 1)?));
            0
        }
        Some("write") => {
            let (step, part, block) = (number(words, 1)?, number(words, 2)?, number(words, 3)?.max(1) as usize);
            let path = snapshot_path(step);
            let handle =
                if rank == 0 { target.create(&path) } else { open_when_created(target, &path) }.map_err(|error| error.to_string())?;
            let mut buffer = vec![0u8; block];
            let start = rank as u64 * part;
            let mut offset = 0;
            while offset < part {
                let len = block.min((part - offset) as usize);
                pattern::fill(&mut buffer[..len], writer_of(step, rank), start + offset);
                handle.write_at(&buffer[..len], start + offset).map_err(|error| error.to_string())?;
                offset += len as u64;
            }
            handle.close().map_err(|error| error.to_string())?;
            part
        }
        other => return Err(format!("unknown command {other:?}")),
    };
    Ok(WorkerResult { elapsed: started.elapsed(), ops, bytes })
}

/// `units` units of CPU-bound work (about 30 µs each on this class of machine).
fn spin(units: u64) {
    let mut state = 1u64;
    for _ in 0..units * 10_000 {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    }
    std::hint::black_box(state);
}

/// Opens a snapshot another rank creates at the same moment (ranks start writing together).
fn open_when_created(target: &Target, path: &str) -> std::io::Result<crate::target::Handle> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match target.open_write(path) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            other => return other,
        }
    }
}

/// Runs the job with `workers` (connected to `cluster`) and returns its times; the cluster is
/// synced after the last iteration, and the sync timed.
pub fn run_job(workers: &mut Workers, config: &FlushBenchConfig, cluster: &mut dyn JobCluster) -> Result<JobTimes, BenchError> {
    workers.run("setup")?;
    // A compute phase is a fixed amount of work, as long as `compute` on an idle machine:
    // when flushing takes CPU from it, it takes longer.
    let compute = match config.compute_kind {
        Compute::Sleep => format!("sleep {}", config.compute.as_millis()),
        Compute::Spin => {
            let units: Vec<f64> =
                workers.run(&format!("calibrate {}", config.compute.as_millis()))?.iter().map(|result| result.ops as f64).collect();
            format!("spin {}", median(&units) as u64)
        }
    };
    let mut times = JobTimes::default();
    for step in 0..config.iterations {
        let computed = PhaseResult::combine(&workers.run(&compute)?);
        times.compute_seconds += computed.elapsed.as_secs_f64();
        let flushed_before = cluster.flushed_bytes()?;
        let written = PhaseResult::combine(&workers.run(&format!("write {step} {} {}", config.part_bytes, config.block_bytes))?);
        times.flushed_while_writing += cluster.flushed_bytes()? - flushed_before;
        times.write_seconds += written.elapsed.as_secs_f64();
        times.write_bytes += written.bytes;
    }
    times.longest_stop_us = cluster.longest_stop_us()?;
    let started = Instant::now();
    cluster.sync()?;
    times.drain_seconds = started.elapsed().as_secs_f64();
    Ok(times)
}

/// Checks every snapshot in the backend directory byte by byte.
pub fn verify_backend(backend: &Path, config: &FlushBenchConfig) -> Result<(), BenchError> {
    let part = config.part_bytes as usize;
    for step in 0..config.iterations {
        let file = backend.join(snapshot_path(step).trim_start_matches('/'));
        let bytes = std::fs::read(&file).map_err(|error| BenchError::Setup(format!("{}: {error}", file.display())))?;
        if bytes.len() != part * config.processes {
            return Err(BenchError::Setup(format!("{}: {} bytes instead of {}", file.display(), bytes.len(), part * config.processes)));
        }
        for (rank, piece) in bytes.chunks(part).enumerate() {
            pattern::verify(piece, writer_of(step, rank), (rank * part) as u64)
                .map_err(|error| BenchError::Setup(format!("{} (rank {rank}): {error}", file.display())))?;
        }
    }
    Ok(())
}

/// The table of a flush benchmark: per policy, the medians of the runs (write bandwidth, also
/// relative to the first policy; time in compute phases; the final sync; bytes flushed while
/// the snapshots were written), and the longest time a flusher took to stop.
pub fn report(results: &[(String, Vec<JobTimes>)]) -> String {
    let mut text = format!(
        "{:<10} {:>12} {:>9} {:>10} {:>13} {:>16} {:>13}   write bandwidth of each run\n",
        "policy", "write MiB/s", "vs first", "compute s", "final sync s", "flushed while", "max stop µs"
    );
    let first = results.first().map(|(_, runs)| median(&runs.iter().map(JobTimes::write_bandwidth).collect::<Vec<_>>())).unwrap_or(1.0);
    for (policy, runs) in results {
        let bandwidths: Vec<f64> = runs.iter().map(JobTimes::write_bandwidth).collect();
        let bandwidth = median(&bandwidths);
        let compute = median(&runs.iter().map(|run| run.compute_seconds).collect::<Vec<_>>());
        let drain = median(&runs.iter().map(|run| run.drain_seconds).collect::<Vec<_>>());
        let overlap = median(&runs.iter().map(|run| run.flushed_while_writing as f64).collect::<Vec<_>>());
        let longest_stop = runs.iter().map(|run| run.longest_stop_us).max().unwrap_or(0);
        let each: Vec<String> = bandwidths.iter().map(|value| format!("{:.0}", value / (1 << 20) as f64)).collect();
        text.push_str(&format!(
            "{policy:<10} {:>12.0} {:>9.2} {:>10.2} {:>13.2} {:>12.0} MiB {:>13}   {}\n",
            bandwidth / (1 << 20) as f64,
            bandwidth / first.max(1e-9),
            compute,
            drain,
            overlap / (1 << 20) as f64,
            longest_stop,
            each.join(" ")
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_gives_medians_and_ratios() {
        let run = |mib: f64| JobTimes {
            write_seconds: 1.0,
            write_bytes: (mib * (1 << 20) as f64) as u64,
            compute_seconds: 2.0,
            drain_seconds: 0.5,
            flushed_while_writing: 0,
            longest_stop_us: 700,
        };
        let table = report(&[("none".into(), vec![run(100.0), run(300.0), run(200.0)]), ("immediate".into(), vec![run(100.0)])]);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[1].starts_with("none") && lines[1].contains(" 200 ") && lines[1].contains("1.00"), "{table}");
        assert!(lines[2].starts_with("immediate") && lines[2].contains("0.50"), "{table}");
        assert_eq!("sleep".parse::<Compute>(), Ok(Compute::Sleep));
        assert!("nap".parse::<Compute>().is_err());
    }
}
