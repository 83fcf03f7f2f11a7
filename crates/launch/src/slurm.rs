//! Slurm: one server on every node of the job's allocation.
//!
//! Inside an allocation (`SLURM_JOB_ID`, `SLURM_JOB_NODELIST`), [`start_step`] runs one job
//! step — `srun --overlap`, one task per node, so that the job's own steps still run beside
//! it — of `ringfs node-agent` processes. Each agent runs its node's server (listening on
//! the cluster's port, advertised as `<node>:<port>`; every server but the first node's joins
//! the first), keeps everything the server writes on that node under the run directory's
//! path (the same on every node, node-local: `<run dir>/<node>/`), and removes it, with the
//! node's store, when the server ends — after `ringfs stop`, or when Slurm signals the step
//! (scancel, time limit, end of the job). It then prints `ringfs-node <node>: cleaned up`,
//! which `srun` collects in `<run dir>/srun.log` on the launching node: [`finish_step`] names
//! every node that did not say so (a lost node). What a killed agent leaves behind is found
//! by the `leftovers` module.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{process_alive, runs_command, signal, terminate, wait_for_exit_only};
use crate::{LaunchConfig, LaunchError, Result, ServerRecord, io_error, write_private};
use ringfs_config::env;

/// The line an agent prints once its node is clean.
pub const CLEANED_UP: &str = "cleaned up";

/// The file in a run directory that records the `srun` step.
const STEP_RECORD: &str = "slurm";

/// The file in the run directory that names the step's nodes, one per line, for `srun`.
const NODE_LIST: &str = "srun-nodes";

/// The Slurm allocation a cluster runs in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlurmJob {
    pub job_id: String,
    /// Host names of the allocation's nodes, in Slurm's order (the first runs the batch
    /// script).
    pub nodes: Vec<String>,
}

impl SlurmJob {
    /// The allocation this process runs in (from `SLURM_JOB_ID` and `SLURM_JOB_NODELIST`,
    /// expanded by `scontrol show hostnames`), or `None` outside Slurm.
    pub fn from_environment() -> Result<Option<SlurmJob>> {
        let Ok(job_id) = std::env::var("SLURM_JOB_ID") else { return Ok(None) };
        let node_list = std::env::var("SLURM_JOB_NODELIST")
            .or_else(|_| std::env::var("SLURM_NODELIST"))
            .map_err(|_| LaunchError::Config("SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not".into()))?;
        let output = Command::new("scontrol")
            .args(["show", "hostnames", &node_list])
            .stdin(Stdio::null())
            .output()
            .map_err(io_error("cannot run scontrol (to expand SLURM_JOB_NODELIST)"))?;
        if !output.status.success() {
            return Err(LaunchError::Config(format!(
                "scontrol show hostnames {node_list} failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        let nodes: Vec<String> = String::from_utf8_lossy(&output.stdout).split_whitespace().map(String::from).collect();
        if nodes.is_empty() {
            return Err(LaunchError::Config(format!("the node list {node_list:?} names no node")));
        }
        Ok(Some(SlurmJob { job_id, nodes }))
    }

    /// The port of this job's servers: `base` plus the job id modulo 1000, so that jobs
    /// sharing a node rarely meet on one port.
    pub fn port(&self, base: u16) -> u16 {
        let offset = self.job_id.parse::<u64>().map(|id| (id % 1000) as u16).unwrap_or(0);
        base.saturating_add(offset)
    }
}

/// The step as recorded in the run directory: the pid of the `ringfs slurm-step` process
/// that runs `srun` (see [`watch_step`]), and the nodes.
struct StepRecord {
    watcher: u32,
    nodes: Vec<String>,
}

fn read_step_record(run_dir: &Path) -> Option<StepRecord> {
    let text = fs::read_to_string(run_dir.join(STEP_RECORD)).ok()?;
    let mut watcher = None;
    let mut nodes = Vec::new();
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("watcher", pid)) => watcher = pid.trim().parse().ok(),
            Some(("nodes", list)) => nodes = list.split_whitespace().map(String::from).collect(),
            _ => {}
        }
    }
    Some(StepRecord { watcher: watcher?, nodes })
}

/// The file a stopping `ringfs stop` marks the run directory with (its pid), so that the
/// watcher leaves the directory to it.
const STOPPING: &str = "stopping";

/// Marks `run_dir` as being stopped by this process.
pub(crate) fn mark_stopping(run_dir: &Path) {
    let _ = fs::write(run_dir.join(STOPPING), std::process::id().to_string());
}

fn stop_in_progress(run_dir: &Path) -> bool {
    let pid = fs::read_to_string(run_dir.join(STOPPING)).ok().and_then(|text| text.trim().parse().ok());
    pid.is_some_and(process_alive)
}

/// Whether `run_dir` holds a cluster started as a Slurm step.
pub fn is_step(run_dir: &Path) -> bool {
    run_dir.join(STEP_RECORD).exists()
}

/// The processes of the step recorded in `run_dir` that still run: its watcher and `srun`.
pub(crate) fn running_step(run_dir: &Path) -> Vec<u32> {
    let watcher = read_step_record(run_dir).map(|record| record.watcher).filter(|pid| runs_command(*pid, &["slurm-step"], run_dir));
    let srun = fs::read_to_string(run_dir.join("srun.pid"))
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .filter(|pid| runs_command(*pid, &["node-agent"], run_dir));
    watcher.into_iter().chain(srun).collect()
}

/// Runs the step's `srun` (the command after `slurm-step --`) for `ringfs slurm-step`: records
/// its pid, waits for it to end, and then — unless `ringfs stop` is at work — removes the run
/// directory, since the step ended without a stop (scancel, time limit, the job's end) and
/// its agents have cleaned the nodes. Termination signals are for `srun` (which passes them
/// to the agents): the caller blocks them in this process.
pub fn watch_step(run_dir: &Path, srun: &[String]) -> Result<std::process::ExitStatus> {
    let (program, arguments) = srun.split_first().ok_or_else(|| LaunchError::Config("no srun command given".into()))?;
    let mut command = Command::new(program);
    command.args(arguments);
    // SAFETY: only restores the signal mask between fork and exec.
    unsafe { command.pre_exec(crate::process::unblock_termination_signals) };
    let mut child = command.spawn().map_err(io_error(format!("cannot run {program}")))?;
    write_private(&run_dir.join("srun.pid"), &child.id().to_string())?;
    let status = child.wait().map_err(io_error("waiting for srun"))?;
    if !stop_in_progress(run_dir) {
        crate::unmount_all(run_dir);
        let _ = fs::remove_dir_all(run_dir);
        if let Some(user_dir) = run_dir.parent() {
            let _ = fs::remove_dir(user_dir);
        }
    }
    Ok(status)
}

/// The command line of the step: `ringfs slurm-step --run-dir R -- srun …`.
fn step_command(config: &LaunchConfig, job: &SlurmJob, run_dir: &Path, port: u16) -> Command {
    let mut command = Command::new(&config.executable);
    command
        .arg("slurm-step")
        .arg("--run-dir")
        .arg(run_dir)
        .args(["--", "srun"])
        .arg("--overlap")
        .arg(format!("--nodes={}", job.nodes.len()))
        .arg(format!("--ntasks={}", job.nodes.len()))
        .arg("--ntasks-per-node=1")
        // A file (srun reads a node list with a '/' in it from the file it names): one
        // argument naming every node passes Linux's 128-KiB bound on an argument past
        // ~10,000 nodes, and srun would not start at all.
        .arg(format!("--nodelist={}", run_dir.join(NODE_LIST).display()))
        .args(["--kill-on-bad-exit=0", "--cpu-bind=none", "--mpi=none", "--input=none", "--export=ALL", "--job-name=ringfs"])
        .arg(&config.executable)
        .arg("node-agent")
        .arg("--run-dir")
        .arg(run_dir)
        .args(["--first", &job.nodes[0], "--port", &port.to_string(), "--store", &config.store])
        .arg("--")
        .args(["--capacity", &config.capacity, "--hash", &config.hash.to_string(), "--placement", &config.placement.to_string()])
        .args(config.common_server_args());
    command
}

/// Starts the step; returns the servers' records (name: the node) once `srun` runs.
pub(crate) fn start_step(config: &LaunchConfig, job: &SlurmJob, run_dir: &Path, secret: &str) -> Result<Vec<ServerRecord>> {
    let port = config.port;
    let log_path = run_dir.join("srun.log");
    let log = fs::File::create(&log_path).map_err(io_error(format!("cannot create {}", log_path.display())))?;
    let log_copy = log.try_clone().map_err(io_error("cannot duplicate a file handle"))?;
    write_private(&run_dir.join(NODE_LIST), &(job.nodes.join("\n") + "\n"))?;
    let mut command = step_command(config, job, run_dir, port);
    command.env(env::SECRET, secret).env_remove("LD_PRELOAD").stdin(Stdio::null()).stdout(log_copy).stderr(log);
    // SAFETY: setsid and sigprocmask are async-signal-safe. The step leaves the terminal's
    // session (a Ctrl-C for the launching command does not end it), and srun gets the
    // termination signals a launching `ringfs run` blocks for itself.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            crate::process::unblock_termination_signals()
        });
    }
    let child = command.spawn().map_err(io_error("cannot run srun (is this a Slurm allocation?)"))?;
    write_private(&run_dir.join(STEP_RECORD), &format!("watcher {}\nnodes {}\nport {port}\n", child.id(), job.nodes.join(" ")))?;
    Ok(job
        .nodes
        .iter()
        .map(|node| ServerRecord { name: node.clone(), address: format!("{}{node}:{port}", config.address_prefix), pid: None })
        .collect())
}

/// Why a step has ended before its servers came up (with the end of its log), if it has.
pub(crate) fn step_failure(run_dir: &Path) -> Option<String> {
    let record = read_step_record(run_dir)?;
    if process_alive(record.watcher) {
        return None;
    }
    Some(format!("srun ended early: {}", log_tail(run_dir, 20)))
}

fn log_tail(run_dir: &Path, lines: usize) -> String {
    let text = fs::read_to_string(run_dir.join("srun.log")).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Nodes of the step that have not reported their cleanup in `srun.log`.
fn unconfirmed_nodes(run_dir: &Path, nodes: &[String]) -> Vec<String> {
    let log = fs::read_to_string(run_dir.join("srun.log")).unwrap_or_default();
    nodes.iter().filter(|node| !log.contains(&format!("ringfs-node {node}: {CLEANED_UP}"))).cloned().collect()
}

/// Ends the step after its servers were asked to shut down: waits up to `wait` until every
/// node but the `silent` ones (whose servers did not answer) reported its cleanup, or the
/// step ended; then ends `srun` (SIGTERM, which it passes to the agents, then SIGKILL).
/// Returns the nodes that did not report: lost or cut off.
pub(crate) fn finish_step(run_dir: &Path, wait: Duration, silent: &[String]) -> Vec<String> {
    let Some(record) = read_step_record(run_dir) else { return vec!["(the Slurm step record is missing)".into()] };
    let deadline = Instant::now() + wait;
    let waiting_for = || unconfirmed_nodes(run_dir, &record.nodes).into_iter().filter(|node| !silent.contains(node)).count();
    while process_alive(record.watcher) && waiting_for() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // The agents that reported are exiting: give srun a moment to collect them.
    wait_for_exit_only(&[record.watcher], Duration::from_secs(2));
    let running = running_step(run_dir);
    if !running.is_empty() {
        // srun first: it passes SIGTERM on to the agents still reachable.
        for pid in running.iter().rev() {
            signal(*pid, libc::SIGTERM);
        }
        terminate(&running, Duration::from_secs(5));
    }
    unconfirmed_nodes(run_dir, &record.nodes)
}

/// The run directory of a new cluster in `job`: node-local, at the same path on every node.
pub(crate) fn default_run_dir(job: &SlurmJob, base: &Path) -> PathBuf {
    base.join(format!("slurm-{}-{}", job.job_id, crate::random_hex(3)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job of 20,000 nodes: every argument of the step's command stays far below Linux's
    /// bound on one argument (`MAX_ARG_STRLEN`, 128 KiB); the node list is a file.
    #[test]
    fn the_step_command_of_a_large_job_has_short_arguments() {
        let nodes: Vec<String> = (0..20_000).map(|node| format!("node{node:05}")).collect();
        let job = SlurmJob { job_id: "7".into(), nodes };
        let run_dir = Path::new("/home/user/.ringfs/slurm-7-abc");
        let command = step_command(&LaunchConfig::local(1, "/usr/bin/ringfs".into()), &job, run_dir, 7724);
        let longest = command.get_args().map(|arg| arg.len()).max().unwrap();
        assert!(longest < 4096, "an argument of {longest} bytes");
        let nodelist = command.get_args().find_map(|arg| arg.to_str()?.strip_prefix("--nodelist=")).unwrap();
        assert_eq!(nodelist, "/home/user/.ringfs/slurm-7-abc/srun-nodes");
    }

    #[test]
    fn the_port_follows_the_job_id() {
        let job = |id: &str| SlurmJob { job_id: id.into(), nodes: vec!["n1".into()] };
        assert_eq!(job("1").port(7717), 7718);
        assert_eq!(job("12345").port(7717), 7717 + 345);
        assert_eq!(job("not-a-number").port(7717), 7717);
        assert_eq!(job("999").port(u16::MAX), u16::MAX);
    }

    #[test]
    fn nodes_without_a_cleanup_line_are_unconfirmed() {
        let dir = std::env::temp_dir().join(format!("ringfs-slurm-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("srun.log"), "ringfs-node n1: cleaned up\nsrun: error: n3: task 2: Killed\nringfs-node n10: cleaned up\n")
            .unwrap();
        let nodes: Vec<String> = ["n1", "n2", "n10"].iter().map(|node| node.to_string()).collect();
        assert_eq!(unconfirmed_nodes(&dir, &nodes), ["n2"]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
