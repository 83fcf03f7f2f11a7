//! `ringfs bench io500`: the 12 scored IO500 phases, on ringfs or any POSIX directory.
//!
//! The phases run in IO500's order with IO500's access patterns (`reference/io500_peers.md`
//! §A): ior-easy (a file per process, 2 MiB transfers, fsync at close), mdtest-easy (empty
//! files, a directory per process), the timestamp, ior-hard (one shared file, 47,008-byte
//! transfers interleaved across processes), mdtest-hard (3,901-byte files in one shared
//! directory), find (`-newer timestamp -size 3901c -name "*01*"` over the whole tree, rate =
//! entries scanned), then the reads, stats and deletes. Every write phase runs until the
//! stonewall and then *wears out*: each process continues until it has as many items as the
//! fastest. Reads, stats and deletes touch the items of the next process (IO500's `-C`,
//! `-N 1`), and every byte read is verified ([`pattern`]).
//!
//! Scoring is IO500's: bandwidth phases in GiB/s, metadata phases in kIOPS (find: entries
//! scanned), score = sqrt(geomean(bandwidth) × geomean(metadata)). A run with a stonewall
//! other than 300 s is marked INVALID, as IO500 marks it.

pub mod chart;
pub mod config;
pub mod pattern;
pub mod report;
pub mod worker;

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use config::Io500Config;

use crate::BenchError;
use crate::target::TargetSpec;
use crate::workers::{PhaseResult, WorkerResult, Workers};

/// Stonewall of an official IO500 run.
pub const OFFICIAL_STONEWALL: Duration = Duration::from_secs(300);

/// The two groups a scored phase belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    Bandwidth,
    Metadata,
}

/// IO500's phases, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    IorEasyWrite,
    MdtestEasyWrite,
    Timestamp,
    IorHardWrite,
    MdtestHardWrite,
    Find,
    IorEasyRead,
    MdtestEasyStat,
    IorHardRead,
    MdtestHardStat,
    MdtestEasyDelete,
    MdtestHardRead,
    MdtestHardDelete,
}

pub const PHASES: [Phase; 13] = [
    Phase::IorEasyWrite,
    Phase::MdtestEasyWrite,
    Phase::Timestamp,
    Phase::IorHardWrite,
    Phase::MdtestHardWrite,
    Phase::Find,
    Phase::IorEasyRead,
    Phase::MdtestEasyStat,
    Phase::IorHardRead,
    Phase::MdtestHardStat,
    Phase::MdtestEasyDelete,
    Phase::MdtestHardRead,
    Phase::MdtestHardDelete,
];

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::IorEasyWrite => "ior-easy-write",
            Phase::MdtestEasyWrite => "mdtest-easy-write",
            Phase::Timestamp => "timestamp",
            Phase::IorHardWrite => "ior-hard-write",
            Phase::MdtestHardWrite => "mdtest-hard-write",
            Phase::Find => "find",
            Phase::IorEasyRead => "ior-easy-read",
            Phase::MdtestEasyStat => "mdtest-easy-stat",
            Phase::IorHardRead => "ior-hard-read",
            Phase::MdtestHardStat => "mdtest-hard-stat",
            Phase::MdtestEasyDelete => "mdtest-easy-delete",
            Phase::MdtestHardRead => "mdtest-hard-read",
            Phase::MdtestHardDelete => "mdtest-hard-delete",
        }
    }

    /// The scoring group; `None` for the timestamp.
    pub fn group(self) -> Option<Group> {
        match self {
            Phase::Timestamp => None,
            Phase::IorEasyWrite | Phase::IorHardWrite | Phase::IorEasyRead | Phase::IorHardRead => Some(Group::Bandwidth),
            _ => Some(Group::Metadata),
        }
    }

    pub fn unit(self) -> &'static str {
        match self.group() {
            Some(Group::Bandwidth) => "GiB/s",
            _ => "kIOPS",
        }
    }
}

/// One measured phase.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measurement {
    pub phase: Phase,
    /// GiB/s or kIOPS.
    pub value: f64,
    pub seconds: f64,
    /// Items done (transfers, files, entries scanned).
    pub items: u64,
    pub bytes: u64,
}

/// IO500's score.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Score {
    /// Geometric mean of the bandwidth phases, GiB/s.
    pub bandwidth: f64,
    /// Geometric mean of the metadata phases, kIOPS.
    pub iops: f64,
    pub total: f64,
}

fn geometric_mean(values: &[f64]) -> f64 {
    if values.is_empty() || values.iter().any(|value| *value <= 0.0) {
        return 0.0;
    }
    (values.iter().map(|value| value.ln()).sum::<f64>() / values.len() as f64).exp()
}

impl Score {
    /// IO500's formula over the measured phases.
    pub fn of(measurements: &[Measurement]) -> Score {
        let group = |group: Group| -> Vec<f64> {
            measurements
                .iter()
                .filter(|measurement| measurement.phase.group() == Some(group))
                .map(|measurement| measurement.value)
                .collect()
        };
        Score::from_group_means(geometric_mean(&group(Group::Bandwidth)), geometric_mean(&group(Group::Metadata)))
    }

    /// The score from the two group means: sqrt(bandwidth × iops).
    pub fn from_group_means(bandwidth: f64, iops: f64) -> Score {
        Score { bandwidth, iops, total: (bandwidth * iops).sqrt() }
    }
}

/// A finished IO500 run.
#[derive(Clone, Debug)]
pub struct Io500Result {
    pub target: String,
    pub processes: usize,
    pub stonewall: Duration,
    pub measurements: Vec<Measurement>,
    pub score: Score,
    /// Entries the find phase matched.
    pub found: u64,
}

impl Io500Result {
    /// Valid by IO500's rules only with the official stonewall.
    pub fn valid(&self) -> bool {
        self.stonewall == OFFICIAL_STONEWALL
    }

    pub fn measurement(&self, phase: Phase) -> Option<&Measurement> {
        self.measurements.iter().find(|measurement| measurement.phase == phase)
    }
}

fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_nanos() as i64).unwrap_or(0)
}

/// Runs `command` with `sh -c` in `environment`, with `IO500_DATA_DIR` set to the data
/// directory as seen from this host (a ringfs path, or a local path for POSIX targets).
pub fn run_shell_hook(command: &str, target: &TargetSpec, data_dir: &str, environment: &[(&str, String)]) -> Result<(), BenchError> {
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .envs(environment.iter().map(|(name, value)| (*name, value.as_str())))
        .env("IO500_DATA_DIR", target.outside_path(data_dir))
        .status()
        .map_err(|error| BenchError::Setup(format!("cannot run {command:?}: {error}")))?;
    if !status.success() {
        return Err(BenchError::Setup(format!("{command:?} failed ({status})")));
    }
    Ok(())
}

/// Called with the data directory between the write phases and the reads.
pub type BeforeReads<'a> = Box<dyn FnMut(&str) -> Result<(), BenchError> + 'a>;

/// Drives the phases over running workers and returns the measurements.
pub struct Coordinator<'a> {
    workers: &'a mut Workers,
    config: &'a Io500Config,
    /// Called with each measurement as soon as its phase ends (for live output).
    on_phase: &'a mut dyn FnMut(&Measurement),
    before_reads: Option<BeforeReads<'a>>,
}

impl<'a> Coordinator<'a> {
    pub fn new(workers: &'a mut Workers, config: &'a Io500Config, on_phase: &'a mut dyn FnMut(&Measurement)) -> Coordinator<'a> {
        Coordinator { workers, config, on_phase, before_reads: None }
    }

    /// Runs `hook` after find, before the first read phase.
    pub fn before_reads(mut self, hook: BeforeReads<'a>) -> Coordinator<'a> {
        self.before_reads = Some(hook);
        self
    }

    fn record(&mut self, measurements: &mut Vec<Measurement>, phase: Phase, result: PhaseResult) {
        let seconds = result.elapsed.as_secs_f64().max(1e-9);
        let value = match phase.group() {
            Some(Group::Bandwidth) => result.bytes as f64 / seconds / (1u64 << 30) as f64,
            _ => result.ops as f64 / seconds / 1000.0,
        };
        let measurement = Measurement { phase, value, seconds, items: result.ops, bytes: result.bytes };
        (self.on_phase)(&measurement);
        measurements.push(measurement);
    }

    /// A write phase: everyone writes until the stonewall, then continues to the count of the
    /// fastest. Returns the combined result and that count.
    fn write_phase(&mut self, kind: &str, limit: u64) -> Result<(PhaseResult, u64), BenchError> {
        let stonewall_ms = self.config.stonewall.as_millis();
        let first = self.workers.run(&format!("write-start {kind} {stonewall_ms} {limit}"))?;
        let target = first.iter().map(|result| result.ops).max().unwrap_or(0);
        let finished = self.workers.run(&format!("write-finish {target}"))?;
        Ok((PhaseResult::combine(&finished), target))
    }

    /// Runs all phases in `data_dir` (a path inside the target), then removes it (also when
    /// a phase failed; the phase's error is what is returned).
    pub fn run(&mut self, data_dir: &str) -> Result<(Vec<Measurement>, u64), BenchError> {
        let outcome = self.run_phases(data_dir);
        let cleaned = self.workers.run("cleanup");
        let measured = outcome?;
        cleaned?;
        Ok(measured)
    }

    fn run_phases(&mut self, data_dir: &str) -> Result<(Vec<Measurement>, u64), BenchError> {
        let config = self.config;
        self.workers.run(&format!("setup {data_dir} {}", config.ior_easy_transfer))?;
        self.workers.run("setup-rank")?;
        let mut measurements = Vec::new();
        let mut counts = [0u64; 4];
        let mut timestamp = 0;
        let mut found = 0;
        for phase in PHASES {
            let result = match phase {
                Phase::IorEasyWrite => {
                    let (result, count) = self.write_phase("ior-easy", config.ior_easy_max_transfers())?;
                    counts[0] = count;
                    result
                }
                Phase::MdtestEasyWrite => {
                    let (result, count) = self.write_phase("mdtest-easy", config.mdtest_easy_max_files)?;
                    counts[1] = count;
                    result
                }
                Phase::Timestamp => {
                    timestamp = now_ns();
                    // Files written from now on are newer, even on coarse clocks.
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Phase::IorHardWrite => {
                    let (result, count) = self.write_phase("ior-hard", config.ior_hard_max_segments)?;
                    counts[2] = count;
                    result
                }
                Phase::MdtestHardWrite => {
                    let (result, count) = self.write_phase("mdtest-hard", config.mdtest_hard_max_files)?;
                    counts[3] = count;
                    result
                }
                Phase::Find => {
                    let results: Vec<WorkerResult> = self.workers.run(&format!("find {timestamp}"))?;
                    found = results.iter().map(|result| result.bytes).sum();
                    PhaseResult { bytes: 0, ..PhaseResult::combine(&results) }
                }
                Phase::IorEasyRead => {
                    if let Some(hook) = self.before_reads.as_mut() {
                        hook(data_dir)?;
                    }
                    PhaseResult::combine(&self.workers.run(&format!("read ior-easy {}", counts[0]))?)
                }
                Phase::MdtestEasyStat => PhaseResult::combine(&self.workers.run(&format!("stat mdtest-easy {}", counts[1]))?),
                Phase::IorHardRead => PhaseResult::combine(&self.workers.run(&format!("read ior-hard {}", counts[2]))?),
                Phase::MdtestHardStat => PhaseResult::combine(&self.workers.run(&format!("stat mdtest-hard {}", counts[3]))?),
                Phase::MdtestEasyDelete => PhaseResult::combine(&self.workers.run(&format!("delete mdtest-easy {}", counts[1]))?),
                Phase::MdtestHardRead => PhaseResult::combine(&self.workers.run(&format!("read mdtest-hard {}", counts[3]))?),
                Phase::MdtestHardDelete => PhaseResult::combine(&self.workers.run(&format!("delete mdtest-hard {}", counts[3]))?),
            };
            self.record(&mut measurements, phase, result);
        }
        Ok((measurements, found))
    }
}

/// A unique data directory name inside a target.
pub fn data_dir_name() -> String {
    format!("/io500-{}-{:x}", std::process::id(), now_ns() / 1000)
}

/// Runs IO500 on `target` with local worker processes (`executable bench worker io500 …`).
pub fn run(
    executable: &Path,
    target: &TargetSpec,
    environment: &[(&str, String)],
    config: &Io500Config,
    on_phase: &mut dyn FnMut(&Measurement),
) -> Result<Io500Result, BenchError> {
    let mut workers = Workers::spawn(executable, "io500", target, config.processes, environment)?;
    let outcome = {
        let mut coordinator = Coordinator::new(&mut workers, config, on_phase);
        if let Some(command) = &config.before_reads {
            coordinator = coordinator.before_reads(Box::new(|data_dir: &str| run_shell_hook(command, target, data_dir, environment)));
        }
        coordinator.run(&data_dir_name())
    };
    workers.finish();
    let (measurements, found) = outcome?;
    Ok(Io500Result {
        target: target.label(),
        processes: config.processes,
        stonewall: config.stonewall,
        score: Score::of(&measurements),
        measurements,
        found,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed's example (Oakforest-PACS IME, table 4 of the Tsukuba report): bandwidth
    /// 471.25 GiB/s and metadata 21.85 kIOPS give 101.48. The published inputs are rounded
    /// to two decimals, so the score must fall in the range they allow.
    #[test]
    fn score_reproduces_the_published_io500_example() {
        let score = Score::from_group_means(471.25, 21.85);
        assert!((score.total - 101.473).abs() < 0.001, "{}", score.total);
        for (bandwidth, iops, published) in
            [(471.25, 21.85, 101.48), (151.31, 35.22, 73.00), (257.52, 41.01, 102.76), (371.12, 22.80, 92.00)]
        {
            let low = Score::from_group_means(bandwidth - 0.005, iops - 0.005).total;
            let high = Score::from_group_means(bandwidth + 0.005, iops + 0.005).total;
            assert!(low - 0.005 <= published && published <= high + 0.005, "{bandwidth} × {iops}: {published} not in [{low}, {high}]");
        }
    }

    #[test]
    fn score_uses_geometric_means_of_the_groups() {
        let measurement = |phase, value| Measurement { phase, value, seconds: 1.0, items: 1, bytes: 1 };
        let measurements: Vec<Measurement> = PHASES
            .iter()
            .filter(|phase| phase.group().is_some())
            .map(|phase| measurement(*phase, if phase.group() == Some(Group::Bandwidth) { 4.0 } else { 9.0 }))
            .collect();
        assert_eq!(measurements.len(), 12);
        let score = Score::of(&measurements);
        assert!((score.bandwidth - 4.0).abs() < 1e-9 && (score.iops - 9.0).abs() < 1e-9 && (score.total - 6.0).abs() < 1e-9);
        let mut with_zero = measurements.clone();
        with_zero[0].value = 0.0;
        assert_eq!(Score::of(&with_zero).total, 0.0, "a zero phase zeroes the score, as IO500 treats it as invalid");
        assert!((geometric_mean(&[1.0, 100.0]) - 10.0).abs() < 1e-9);
    }

    #[test]
    fn phases_follow_io500_order_and_groups() {
        let names: Vec<&str> = PHASES.iter().map(|phase| phase.name()).collect();
        assert_eq!(names[0], "ior-easy-write");
        assert_eq!(names[2], "timestamp");
        assert_eq!(names[5], "find");
        assert_eq!(names[12], "mdtest-hard-delete");
        assert_eq!(PHASES.iter().filter(|phase| phase.group() == Some(Group::Bandwidth)).count(), 4);
        assert_eq!(PHASES.iter().filter(|phase| phase.group() == Some(Group::Metadata)).count(), 8);
    }
}
