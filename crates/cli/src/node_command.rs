//! `ringfs node-agent` (started by `ringfs start` in a Slurm allocation, one per node through
//! srun) and `ringfs cleanup` (for an epilog, or by hand): a node's part of a job's cluster.
//!
//! The agent first removes what earlier runs of this user left on the node, runs the node's
//! server with everything it writes under `<run dir>/<node>/`, and when the server ends —
//! shut down by `ringfs stop`, or by the SIGTERM Slurm sends at scancel, time limit or job
//! end (which the agent passes on, and waits for: in cache mode the server flushes first) —
//! removes that directory and the node's store and prints `ringfs-node <node>: cleaned up`.

use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use ringfs_launch::leftovers::{self, AgentRecord, Scope};

#[derive(Args, Debug)]
pub struct NodeAgentArgs {
    /// The cluster's run directory: node-local, the same path on every node.
    #[arg(long)]
    pub run_dir: PathBuf,
    /// The node whose server the others join.
    #[arg(long)]
    pub first: String,
    /// The port every node's server listens on.
    #[arg(long)]
    pub port: u16,
    /// `mem` or `dir:PATH` (this node's store is PATH/<run>/<node>).
    #[arg(long, default_value = "mem")]
    pub store: String,
    /// This node's name (default: SLURMD_NODENAME, or the host name).
    #[arg(long)]
    pub node: Option<String>,
    /// Further `ringfs server` arguments.
    #[arg(last = true)]
    pub server_args: Vec<String>,
}

#[derive(Args, Debug)]
pub struct SlurmStepArgs {
    /// The cluster's run directory on this (the launching) node.
    #[arg(long)]
    pub run_dir: PathBuf,
    /// The srun command line.
    #[arg(last = true, required = true)]
    pub srun: Vec<String>,
}

/// `ringfs slurm-step`: runs the step's srun and removes the run directory when the step
/// ends without `ringfs stop` (see `ringfs_launch::slurm::watch_step`).
pub fn step(args: &SlurmStepArgs) -> Result<ExitCode> {
    // Termination signals are for srun, which passes them to the agents; this process waits
    // for srun to end whatever happens.
    let _ignored = crate::signals::block_termination_signals();
    let status = ringfs_launch::slurm::watch_step(&args.run_dir, &args.srun)?;
    Ok(if status.success() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

#[derive(Args, Debug)]
pub struct CleanupArgs {
    /// Remove everything of this (ended) job, for every user, its processes first (for a
    /// Slurm epilog, as root). Without it: this user's leftovers whose processes are gone.
    #[arg(long)]
    pub job: Option<String>,
    /// The temporary directory the runs live under (default: $TMPDIR or /tmp).
    #[arg(long)]
    pub temp_dir: Option<PathBuf>,
}

fn node_name(given: Option<&String>) -> String {
    given
        .cloned()
        .or_else(|| std::env::var("SLURMD_NODENAME").ok())
        .unwrap_or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "localhost".into()).trim().to_string())
}

pub fn agent(args: NodeAgentArgs) -> Result<ExitCode> {
    let wait_for_signal = crate::signals::block_termination_signals_with_timeout();
    let node = node_name(args.node.as_ref());
    let run_name = args.run_dir.file_name().and_then(|name| name.to_str()).context("the run directory has no name")?.to_string();
    if let Some(user_dir) = args.run_dir.parent() {
        for line in leftovers::clean(user_dir, Scope::Dead { except: Some(&args.run_dir) }) {
            eprintln!("ringfs-node {node}: leftover of an earlier run: {line}");
        }
    }
    let node_dir = args.run_dir.join(&node);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(node_dir.join("tmp"))
        .with_context(|| format!("cannot create {}", node_dir.display()))?;
    let store = ringfs_launch::store_for(&args.store, &format!("{run_name}/{node}"))?;
    let mut record = AgentRecord { agent: std::process::id(), server: None, store: store.strip_prefix("dir:").map(PathBuf::from) };
    record.write(&node_dir)?;
    let outcome = run_server(&args, &node, &node_dir, &store, &mut record, &wait_for_signal);
    leftovers::remove_node_dir(&node_dir)?;
    println!("ringfs-node {node}: {}", ringfs_launch::slurm::CLEANED_UP);
    outcome
}

/// Runs the node's server until it exits, passing on a termination signal; returns the
/// agent's exit code (failure when the server failed by itself).
fn run_server(
    args: &NodeAgentArgs,
    node: &str,
    node_dir: &Path,
    store: &str,
    record: &mut AgentRecord,
    wait_for_signal: &impl Fn(Duration) -> Option<i32>,
) -> Result<ExitCode> {
    let log_path = node_dir.join("server.log");
    let log = std::fs::File::create(&log_path).with_context(|| format!("cannot create {}", log_path.display()))?;
    let mut command = Command::new(std::env::current_exe().context("cannot find the ringfs executable")?);
    command
        .arg("server")
        .args(["--name", node])
        .args(["--listen", &format!("0.0.0.0:{}", args.port)])
        .args(["--advertise", &format!("{node}:{}", args.port)])
        .arg("--unix-socket")
        .arg(node_dir.join("server.sock"))
        .args(["--store", store])
        .args(&args.server_args)
        .env("TMPDIR", node_dir.join("tmp"))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    if node != args.first {
        command.args(["--join", &format!("{}:{}", args.first, args.port)]);
    }
    // SAFETY: only restores the signal mask between fork and exec.
    unsafe { command.pre_exec(crate::signals::unblock_in_child) };
    let mut server = command.spawn().context("cannot start the server")?;
    record.server = Some(server.id());
    record.write(node_dir)?;
    let mut signalled = false;
    let status = loop {
        if let Some(status) = server.try_wait()? {
            break status;
        }
        if let Some(signal) = wait_for_signal(Duration::from_millis(100)) {
            // (Slurm signals the whole step, so the server may have it already.) Wait for
            // the server to exit however long it takes: in cache mode it flushes first, and
            // Slurm's KillWait bounds this.
            eprintln!("ringfs-node {node}: signal {signal}: stopping the server");
            // SAFETY: signalling the child this agent started.
            unsafe { libc::kill(server.id() as libc::pid_t, libc::SIGTERM) };
            signalled = true;
        }
    };
    if status.success() || signalled {
        return Ok(ExitCode::SUCCESS);
    }
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(10).collect::<Vec<_>>().into_iter().rev().collect();
    eprintln!("ringfs-node {node}: the server failed ({status}):\n{}", tail.join("\n"));
    Ok(ExitCode::FAILURE)
}

pub fn cleanup(args: &CleanupArgs) -> Result<()> {
    let temp = args.temp_dir.clone().unwrap_or_else(std::env::temp_dir);
    let report = match &args.job {
        Some(job) => {
            leftovers::check_job_id(job)?;
            leftovers::clean(&temp, Scope::Job(job))
        }
        None => leftovers::clean(&leftovers::user_base(&temp), Scope::Dead { except: None }),
    };
    for line in &report {
        println!("{line}");
    }
    Ok(())
}
