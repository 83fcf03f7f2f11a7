//! `ringfs bench connections`: how a server holds many clients. Holder processes open N
//! authenticated connections at once (from several loopback source addresses) and hold
//! them; meanwhile a real client's `stat` latency is measured alone, beside the idle
//! connections, and while they all send small requests, and the server's threads and
//! resident memory are read from /proc. Optionally first a job's cold start: R real client
//! processes started at once, each writing its first MiB, and the connections each server
//! then holds.

pub mod holder;

use std::path::Path;
use std::time::{Duration, Instant};

use ringfs_client::Client;

use crate::BenchError;
use crate::target::TargetSpec;
use crate::workers::{PhaseResult, Workers};
use ringfs_config::env;

/// Connections one holder process opens at most by default (each costs it a descriptor).
pub const CONNECTIONS_PER_PROCESS: usize = 4000;
/// The file whose `stat` is timed.
const PROBE_PATH: &str = "/bench-connections-probe";

/// What to measure.
#[derive(Clone, Debug)]
pub struct ConnectionsConfig {
    /// Connections held in all.
    pub clients: usize,
    /// Holder processes they are spread over.
    pub processes: usize,
    /// `stat` calls timed in each phase.
    pub stat_samples: usize,
    /// While chattering, each held connection sends a `Ping` this often.
    pub chatter_period: Duration,
    /// The server the connections go to (`host:port`, IPv4).
    pub server_address: String,
    /// That server's process, if known (for its threads and memory).
    pub server_pid: Option<u32>,
    /// Client processes of the cold-start phase (0: none).
    pub ranks: usize,
    /// Every server's process, if known (for the connections each holds after the cold start).
    pub server_pids: Vec<u32>,
}

/// Threads and resident memory of a process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    pub threads: u64,
    pub resident_bytes: u64,
}

impl Footprint {
    /// Reads `/proc/PID/status`.
    pub fn of(pid: u32) -> Option<Footprint> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field =
            |name: &str| -> Option<u64> { status.lines().find(|line| line.starts_with(name))?.split_whitespace().nth(1)?.parse().ok() };
        Some(Footprint { threads: field("Threads:")?, resident_bytes: field("VmRSS:")? * 1024 })
    }
}

/// Median and 99th percentile of a set of latencies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Latency {
    pub median: Duration,
    pub p99: Duration,
}

impl Latency {
    fn of(mut samples: Vec<Duration>) -> Latency {
        samples.sort();
        let at = |fraction: f64| samples.get(((samples.len() as f64 - 1.0) * fraction).round() as usize).copied().unwrap_or_default();
        Latency { median: at(0.5), p99: at(0.99) }
    }
}

/// One phase: the server's footprint and a real client's `stat` latency.
#[derive(Clone, Copy, Debug, Default)]
pub struct Phase {
    pub footprint: Option<Footprint>,
    pub stat: Latency,
}

/// Everything `ringfs bench connections` measured.
#[derive(Clone, Debug, Default)]
pub struct ConnectionsResult {
    pub clients: usize,
    pub processes: usize,
    /// Connections accepted, and refused or failed.
    pub accepted: u64,
    pub failed: u64,
    /// From the moment all holders were told to connect until the last one had its last
    /// answer.
    pub storm: Duration,
    pub alone: Phase,
    pub idle: Phase,
    pub chatter: Phase,
    /// Pings answered per second while chattering.
    pub chatter_rate: f64,
    pub cold_start: Option<ColdStart>,
}

/// A job's cold start: ranks started at once, each connecting and writing its first MiB;
/// then the same write again at once (warm), and after the ranks' connections were closed
/// for being idle (reopened).
#[derive(Clone, Debug, Default)]
pub struct ColdStart {
    pub ranks: usize,
    /// From starting the processes until the last one's MiB was written and synced.
    pub elapsed: Duration,
    /// Sockets each server holds more than before the ranks started (their connections).
    pub connections_per_server: Vec<usize>,
    /// The median rank's second write, at once.
    pub warm: Duration,
    /// The median rank's third write, after its connections were closed as idle.
    pub reopened: Duration,
    /// Connections each server held while the ranks were idle, before the third write.
    pub idle_connections_per_server: Vec<usize>,
}

/// How long the cold-start ranks leave a connection unused before they close it.
const RANK_IDLE_CLOSE_SECONDS: u64 = 1;

/// Sockets a process holds.
fn sockets_of(pid: u32) -> usize {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return 0 };
    entries
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// The median time of the workers of a phase.
fn median_elapsed(results: &[crate::workers::WorkerResult]) -> Duration {
    Latency::of(results.iter().map(|result| result.elapsed).collect()).median
}

/// Starts `ranks` real clients at once; each writes 1 MiB to a file of its own.
fn cold_start(
    executable: &Path,
    client: &Client,
    environment: &[(&str, String)],
    config: &ConnectionsConfig,
) -> Result<ColdStart, BenchError> {
    const DIR: &str = "/bench-connections-cold-start";
    let setup = |what: &str, errno: ringfs_client::Errno| BenchError::Setup(format!("{what} {DIR}: {errno}"));
    client.mkdir(DIR, 0o755).map_err(|errno| setup("mkdir", errno))?;
    let before: Vec<usize> = config.server_pids.iter().map(|pid| sockets_of(*pid)).collect();
    let held = || config.server_pids.iter().zip(&before).map(|(pid, before)| sockets_of(*pid).saturating_sub(*before)).collect();
    let mut environment = environment.to_vec();
    environment.push((env::IDLE_CLOSE_S, RANK_IDLE_CLOSE_SECONDS.to_string()));
    let write = format!("write {DIR} {} {}", 1 << 20, 1 << 20);
    let started = Instant::now();
    let mut ranks = Workers::spawn(executable, "micro", &TargetSpec::Ringfs, config.ranks, &environment)?;
    ranks.run(&write)?;
    let elapsed = started.elapsed();
    let connections_per_server = held();
    let warm = median_elapsed(&ranks.run(&write)?);
    // Idle for the idle time and the client's check interval, with margin.
    std::thread::sleep(Duration::from_secs(RANK_IDLE_CLOSE_SECONDS + 2));
    let idle_connections_per_server = held();
    let reopened = median_elapsed(&ranks.run(&write)?);
    ranks.finish();
    client.remove_tree(DIR).map_err(|errno| setup("remove", errno))?;
    Ok(ColdStart { ranks: config.ranks, elapsed, connections_per_server, warm, reopened, idle_connections_per_server })
}

impl ConnectionsResult {
    /// Server memory per held connection: resident growth from `alone` to `idle`.
    pub fn bytes_per_connection(&self) -> Option<u64> {
        let (before, held) = (self.alone.footprint?, self.idle.footprint?);
        Some(held.resident_bytes.saturating_sub(before.resident_bytes) / self.accepted.max(1))
    }
}

/// The source address of holder `rank`: loopback addresses 127.0.0.2, .3, … when the server
/// is on loopback (each has its own range of ports), the default route's otherwise.
pub fn source_address(server_address: &str, rank: usize) -> String {
    if server_address.starts_with("127.") { format!("127.0.{}.{}", rank / 250, rank % 250 + 2) } else { "0.0.0.0".into() }
}

fn time_stats(client: &Client, samples: usize) -> Result<Latency, BenchError> {
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        client.stat(PROBE_PATH).map_err(|errno| BenchError::Setup(format!("stat {PROBE_PATH}: {errno}")))?;
        times.push(started.elapsed());
    }
    Ok(Latency::of(times))
}

fn measure(client: &Client, config: &ConnectionsConfig) -> Result<Phase, BenchError> {
    let stat = time_stats(client, config.stat_samples)?;
    Ok(Phase { footprint: config.server_pid.and_then(Footprint::of), stat })
}

/// Runs the benchmark: `client` is the real client timed, `environment` reaches the
/// cluster from the holder processes (`RINGFS_SERVER`, `RINGFS_SECRET`).
pub fn run(
    executable: &Path,
    client: &Client,
    environment: &[(&str, String)],
    config: &ConnectionsConfig,
) -> Result<ConnectionsResult, BenchError> {
    let fd = client.create(PROBE_PATH, 0o644).map_err(|errno| BenchError::Setup(format!("create {PROBE_PATH}: {errno}")))?;
    let _ = client.close(fd);
    let processes = config.processes.max(1);
    let mut result = ConnectionsResult { clients: config.clients, processes, ..ConnectionsResult::default() };
    if config.ranks > 0 {
        result.cold_start = Some(cold_start(executable, client, environment, config)?);
    }
    result.alone = measure(client, config)?;
    let mut workers = Workers::spawn(executable, "connections", &TargetSpec::Ringfs, processes, environment)?;
    let share = |rank: usize| config.clients / processes + usize::from(rank < config.clients % processes);
    let started = Instant::now();
    let opened = workers.run_each(|rank| format!("open {} {}", share(rank), source_address(&config.server_address, rank)))?;
    result.storm = started.elapsed();
    result.accepted = opened.iter().map(|opened| opened.ops).sum();
    result.failed = opened.iter().map(|opened| opened.bytes).sum();
    // Let freed handshake buffers and exited threads settle before reading the footprint.
    std::thread::sleep(Duration::from_secs(1));
    result.idle = measure(client, config)?;
    workers.run(&format!("chatter {}", config.chatter_period.as_millis()))?;
    std::thread::sleep(Duration::from_secs(1));
    result.chatter = measure(client, config)?;
    let chattered = PhaseResult::combine(&workers.run("quiet")?);
    result.chatter_rate = chattered.ops_per_second();
    workers.run("close")?;
    workers.finish();
    let _ = client.unlink(PROBE_PATH);
    Ok(result)
}

fn micros(duration: Duration) -> String {
    format!("{:.0} µs", duration.as_secs_f64() * 1e6)
}

fn footprint_cells(footprint: Option<Footprint>) -> (String, String) {
    match footprint {
        Some(footprint) => (footprint.threads.to_string(), format!("{:.1} MB", footprint.resident_bytes as f64 / 1e6)),
        None => ("-".into(), "-".into()),
    }
}

/// The human-readable report.
pub fn report(result: &ConnectionsResult) -> String {
    let mut text = format!(
        "storm: {} of {} connections accepted in {:.2} s ({} refused or failed), from {} processes\n\n",
        result.accepted,
        result.clients,
        result.storm.as_secs_f64(),
        result.failed,
        result.processes
    );
    text += "phase                          server threads  server resident  stat median  stat p99\n";
    let phases =
        [("no other client", &result.alone), ("beside the idle connections", &result.idle), ("while they all send pings", &result.chatter)];
    for (name, phase) in phases {
        let (threads, resident) = footprint_cells(phase.footprint);
        text += &format!("{name:<30} {threads:>14}  {resident:>15}  {:>11}  {:>8}\n", micros(phase.stat.median), micros(phase.stat.p99));
    }
    if let Some(bytes) = result.bytes_per_connection() {
        text += &format!("\nserver memory per held connection: {:.2} KiB\n", bytes as f64 / 1024.0);
    }
    text += &format!("pings answered while chattering: {:.0}/s\n", result.chatter_rate);
    if let Some(cold) = &result.cold_start {
        text += &format!(
            "\ncold start of {} client processes (started at once; each connects, writes and syncs 1 MiB): {:.2} s\n\
             their connections at each server: {:?}\n\
             the same write again at once: {:.2} ms (median process)\n\
             after {} s idle (connections at each server then: {:?}), the same write reopening them: {:.2} ms\n",
            cold.ranks,
            cold.elapsed.as_secs_f64(),
            cold.connections_per_server,
            cold.warm.as_secs_f64() * 1e3,
            RANK_IDLE_CLOSE_SECONDS + 2,
            cold.idle_connections_per_server,
            cold.reopened.as_secs_f64() * 1e3,
        );
    }
    text
}

/// The result as JSON.
pub fn to_json(result: &ConnectionsResult) -> String {
    let phase = |phase: &Phase| {
        serde_json::json!({
            "threads": phase.footprint.map(|footprint| footprint.threads),
            "resident_bytes": phase.footprint.map(|footprint| footprint.resident_bytes),
            "stat_median_us": phase.stat.median.as_secs_f64() * 1e6,
            "stat_p99_us": phase.stat.p99.as_secs_f64() * 1e6,
        })
    };
    serde_json::json!({
        "clients": result.clients,
        "processes": result.processes,
        "accepted": result.accepted,
        "failed": result.failed,
        "storm_seconds": result.storm.as_secs_f64(),
        "alone": phase(&result.alone),
        "idle": phase(&result.idle),
        "chatter": phase(&result.chatter),
        "bytes_per_connection": result.bytes_per_connection(),
        "chatter_requests_per_second": result.chatter_rate,
        "cold_start": result.cold_start.as_ref().map(|cold| serde_json::json!({
            "ranks": cold.ranks,
            "seconds": cold.elapsed.as_secs_f64(),
            "connections_per_server": cold.connections_per_server,
            "warm_seconds": cold.warm.as_secs_f64(),
            "reopened_seconds": cold.reopened.as_secs_f64(),
            "idle_connections_per_server": cold.idle_connections_per_server,
        })),
    })
    .to_string()
}
