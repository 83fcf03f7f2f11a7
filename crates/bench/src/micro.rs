//! `ringfs bench micro`: sequential bandwidth and metadata rates, on ringfs and on a POSIX
//! directory in the same run.
//!
//! Every process writes its own file in 1 MiB blocks (and syncs it), reads the file of the
//! next process, then creates, stats and removes its own set of empty files. The sequence is
//! repeated and the median of each phase is reported, with the ratio ringfs / baseline.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::target::{Target, TargetSpec};
use crate::workers::{PhaseResult, WorkerResult, Workers, number};
use crate::{BenchError, median};

/// The phases, in the order they run.
pub const PHASES: [Phase; 5] = [Phase::Write, Phase::Read, Phase::Create, Phase::Stat, Phase::Remove];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Write,
    Read,
    Create,
    Stat,
    Remove,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Write => "write",
            Phase::Read => "read",
            Phase::Create => "create",
            Phase::Stat => "stat",
            Phase::Remove => "remove",
        }
    }

    /// Bandwidth phases report bytes per second, the others operations per second.
    pub fn is_bandwidth(self) -> bool {
        matches!(self, Phase::Write | Phase::Read)
    }

    fn rate(self, result: &PhaseResult) -> f64 {
        if self.is_bandwidth() { result.bytes_per_second() } else { result.ops_per_second() }
    }
}

/// Parameters of a micro benchmark run.
#[derive(Clone, Debug)]
pub struct MicroConfig {
    pub processes: usize,
    pub bytes_per_process: u64,
    pub block_bytes: usize,
    pub files_per_process: u64,
    pub repeats: usize,
    /// Directory (inside each target) the benchmark works in.
    pub work_dir: String,
}

/// Medians of every phase for one target.
#[derive(Clone, Debug)]
pub struct TargetRates {
    pub label: String,
    /// (phase, median rate, all rates)
    pub phases: Vec<(Phase, f64, Vec<f64>)>,
}

/// Bytes at the start of every block that identify its writer and position.
const STAMP_BYTES: usize = 64;

/// Writes the stamp of block `index` of process `rank` into the start of `block`. The rest of
/// the block keeps whatever it held (the benchmark fills it once): generating data must cost
/// the benchmark's processes next to nothing, or it steals CPU from the servers.
pub fn stamp_block(block: &mut [u8], rank: usize, index: u64) {
    let seed = ((rank as u64) << 40) ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let stamp_len = block.len().min(STAMP_BYTES);
    for (position, word) in block[..stamp_len].chunks_mut(8).enumerate() {
        let value = seed.wrapping_add(position as u64).to_le_bytes();
        word.copy_from_slice(&value[..word.len()]);
    }
}

/// Checks the stamp of a block written with [`stamp_block`].
fn block_is_intact(block: &[u8], rank: usize, index: u64) -> bool {
    let mut expected = [0u8; STAMP_BYTES];
    let check = block.len().min(STAMP_BYTES);
    stamp_block(&mut expected[..check], rank, index);
    block[..check] == expected[..check]
}

fn timed(work: impl FnOnce() -> std::io::Result<(u64, u64)>) -> Result<WorkerResult, String> {
    let started = Instant::now();
    let (ops, bytes) = work().map_err(|error| error.to_string())?;
    Ok(WorkerResult { elapsed: started.elapsed(), ops, bytes })
}

/// Runs one micro-benchmark command in a worker (see [`run`] for the commands).
pub fn worker_command(target: &Target, rank: usize, processes: usize, words: &[&str]) -> Result<WorkerResult, String> {
    let dir = words.get(1).ok_or("missing directory")?;
    let own_files = format!("{dir}/md.{rank}");
    match words[0] {
        "setup" => timed(|| {
            if rank == 0 {
                target.mkdir(dir)?;
            }
            Ok((0, 0))
        }),
        "setup-own" => timed(|| target.mkdir(&own_files).map(|()| (0, 0))),
        "write" => {
            let (total, block_bytes) = (number(words, 2)?, number(words, 3)? as usize);
            let mut block: Vec<u8> = (0..block_bytes).map(|position| (position * 7 + rank) as u8).collect();
            timed(|| {
                let handle = target.create(&format!("{dir}/data.{rank}"))?;
                let mut offset = 0;
                while offset < total {
                    let len = block_bytes.min((total - offset) as usize);
                    stamp_block(&mut block[..len], rank, offset / block_bytes as u64);
                    handle.write_at(&block[..len], offset)?;
                    offset += len as u64;
                }
                handle.fsync()?;
                handle.close()?;
                Ok((total.div_ceil(block_bytes as u64), total))
            })
        }
        "read" => {
            let (total, block_bytes) = (number(words, 2)?, number(words, 3)? as usize);
            let writer = (rank + 1) % processes;
            let mut block = vec![0u8; block_bytes];
            timed(|| {
                let handle = target.open_read(&format!("{dir}/data.{writer}"))?;
                let mut offset = 0;
                while offset < total {
                    let count = handle.read_at(&mut block, offset)?;
                    if count == 0 || !block_is_intact(&block[..count], writer, offset / block_bytes as u64) {
                        return Err(std::io::Error::other(format!("data of process {writer} at offset {offset} is wrong")));
                    }
                    offset += count as u64;
                }
                handle.close()?;
                Ok((total.div_ceil(block_bytes as u64), total))
            })
        }
        "create" => {
            let count = number(words, 2)?;
            timed(|| {
                for index in 0..count {
                    target.create_empty(&format!("{own_files}/f.{index}"))?;
                }
                Ok((count, 0))
            })
        }
        "stat" => {
            let count = number(words, 2)?;
            timed(|| {
                for index in 0..count {
                    target.size(&format!("{own_files}/f.{index}"))?;
                }
                Ok((count, 0))
            })
        }
        "remove" => {
            let count = number(words, 2)?;
            timed(|| {
                for index in 0..count {
                    target.unlink(&format!("{own_files}/f.{index}"))?;
                }
                Ok((count, 0))
            })
        }
        "cleanup" => timed(|| {
            target.unlink(&format!("{dir}/data.{rank}"))?;
            target.rmdir(&own_files)?;
            Ok((0, 0))
        }),
        "cleanup-root" => timed(|| {
            if rank == 0 {
                target.rmdir(dir)?;
            }
            Ok((0, 0))
        }),
        other => Err(format!("unknown command {other:?}")),
    }
}

fn phase_command(phase: Phase, config: &MicroConfig) -> String {
    let dir = &config.work_dir;
    match phase {
        Phase::Write => format!("write {dir} {} {}", config.bytes_per_process, config.block_bytes),
        Phase::Read => format!("read {dir} {} {}", config.bytes_per_process, config.block_bytes),
        Phase::Create => format!("create {dir} {}", config.files_per_process),
        Phase::Stat => format!("stat {dir} {}", config.files_per_process),
        Phase::Remove => format!("remove {dir} {}", config.files_per_process),
    }
}

/// Runs one repetition of all phases on running workers; returns the rate of each phase.
fn run_once(workers: &mut Workers, config: &MicroConfig) -> Result<Vec<f64>, BenchError> {
    let dir = &config.work_dir;
    workers.run(&format!("setup {dir}"))?;
    workers.run(&format!("setup-own {dir}"))?;
    let mut rates = Vec::new();
    for phase in PHASES {
        let result = PhaseResult::combine(&workers.run(&phase_command(phase, config))?);
        rates.push(phase.rate(&result));
    }
    workers.run(&format!("cleanup {dir}"))?;
    workers.run(&format!("cleanup-root {dir}"))?;
    Ok(rates)
}

/// Runs the micro benchmark on each target (`environment` reaches ringfs), interleaving the
/// targets in every repetition so that drift of a noisy machine hits them alike.
pub fn run(
    executable: &Path,
    targets: &[TargetSpec],
    environment: &[(&str, String)],
    config: &MicroConfig,
) -> Result<Vec<TargetRates>, BenchError> {
    let mut all_rates: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); PHASES.len()]; targets.len()];
    let mut worker_sets = targets
        .iter()
        .map(|target| Workers::spawn(executable, "micro", target, config.processes, environment))
        .collect::<Result<Vec<_>, _>>()?;
    for _ in 0..config.repeats.max(1) {
        for (target_index, workers) in worker_sets.iter_mut().enumerate() {
            for (phase_index, rate) in run_once(workers, config)?.into_iter().enumerate() {
                all_rates[target_index][phase_index].push(rate);
            }
        }
    }
    for workers in worker_sets {
        workers.finish();
    }
    Ok(targets
        .iter()
        .zip(all_rates)
        .map(|(target, rates)| TargetRates {
            label: target.label(),
            phases: PHASES.iter().zip(rates).map(|(phase, rates)| (*phase, median(&rates), rates)).collect(),
        })
        .collect())
}

fn format_rate(phase: Phase, rate: f64) -> String {
    if phase.is_bandwidth() { format!("{:.2} GB/s", rate / 1e9) } else { format!("{:.1} k/s", rate / 1e3) }
}

/// The comparison table: one row per phase, one column per target, then — when the last
/// target is a baseline — the ratio of every other target to it.
pub fn report(results: &[TargetRates], last_is_baseline: bool) -> String {
    let label_width = results.iter().map(|target| target.label.len()).max().unwrap_or(0).max(14);
    let (compared, baseline) = match results.split_last() {
        Some((baseline, compared)) if last_is_baseline && !compared.is_empty() => (compared, Some(baseline)),
        _ => (results, None),
    };
    let mut text = format!("{:<8}", "phase");
    for target in results {
        text.push_str(&format!(" {:>label_width$}", target.label));
    }
    if baseline.is_some() {
        for target in compared {
            text.push_str(&format!(" {:>12}", format!("{}/base", target.label.split(':').next().unwrap_or(""))));
        }
    }
    text.push('\n');
    for (index, phase) in PHASES.iter().enumerate() {
        text.push_str(&format!("{:<8}", phase.name()));
        for target in results {
            text.push_str(&format!(" {:>label_width$}", format_rate(*phase, target.phases[index].1)));
        }
        if let Some(baseline) = baseline {
            for target in compared {
                text.push_str(&format!(" {:>12.2}", target.phases[index].1 / baseline.phases[index].1.max(1e-9)));
            }
        }
        text.push('\n');
    }
    text
}

/// The results as JSON: `{"targets":[{"label":..,"phases":{"write":{"median":..,"runs":[..]}}}]}`
/// (bandwidth in bytes/s, metadata in operations/s).
pub fn to_json(results: &[TargetRates], config: &MicroConfig) -> String {
    let targets: Vec<serde_json::Value> = results
        .iter()
        .map(|target| {
            let phases: serde_json::Map<String, serde_json::Value> = target
                .phases
                .iter()
                .map(|(phase, median, runs)| (phase.name().to_string(), serde_json::json!({ "median": median, "runs": runs })))
                .collect();
            serde_json::json!({ "label": target.label, "phases": phases })
        })
        .collect();
    serde_json::json!({
        "processes": config.processes,
        "bytes_per_process": config.bytes_per_process,
        "block_bytes": config.block_bytes,
        "files_per_process": config.files_per_process,
        "repeats": config.repeats,
        "targets": targets,
    })
    .to_string()
        + "\n"
}

/// A unique working directory name.
pub fn work_dir_name() -> String {
    format!(
        "/ringfs-bench-{}-{:x}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0)
    )
}

/// Where the POSIX baseline works by default.
pub fn default_baseline() -> PathBuf {
    PathBuf::from("/dev/shm")
}
