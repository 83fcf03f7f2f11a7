//! `ringfs run [options] -- CMD ARGS`: a whole job in one command — start a cluster, mount it
//! if asked, run CMD with the client environment (or `--ranks P` copies of it, the ranks of a
//! global-memory program), and stop everything afterwards, also when CMD fails or the job is
//! interrupted. Exits with CMD's status (the first failing rank's). With `--preload`, CMD runs
//! under `libringfs_preload.so`, which shows ringfs under a path prefix without FUSE.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::cluster::StartArgs;
use ringfs_config::env;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub start: StartArgs,
    /// Mount the file system here for the command (FUSE).
    #[arg(long)]
    pub mount: Option<PathBuf>,
    /// Run this many copies of the command, the ranks of one job (global memory: each gets
    /// RINGFS_GMEM_RANK, RINGFS_GMEM_RANKS and RINGFS_GMEM_JOB); one failing ends the others.
    #[arg(long, default_value_t = 1)]
    pub ranks: u32,
    /// Global memory: each rank caches this much of the arrays' blocks (e.g. 256M; caches
    /// are kept coherent; default: no cache). Sets RINGFS_GMEM_CACHE.
    #[arg(long)]
    pub gmem_cache: Option<String>,
    /// Global memory: ranks' caches do not serve each other (only homes serve data; the
    /// baseline of cooperative caching). Sets RINGFS_GMEM_COOP=0.
    #[arg(long)]
    pub no_gmem_coop: bool,
    /// Global memory: reads of a block that meet at its home are answered together, the
    /// ranks relaying the copy to each other in a tree (for synchronized readers, as a
    /// shared scan). Sets RINGFS_GMEM_RELAY=1.
    #[arg(long, conflicts_with = "no_gmem_coop")]
    pub gmem_relay: bool,
    /// Run the command under the LD_PRELOAD library (libringfs_preload.so): ringfs appears
    /// under PREFIX (default /ringfs) for unmodified programs, without FUSE.
    #[arg(long, value_name = "PREFIX", num_args = 0..=1, default_missing_value = "/ringfs")]
    pub preload: Option<PathBuf>,
    /// The preload library (default: libringfs_preload.so beside the ringfs executable, or in
    /// ../lib from it).
    #[arg(long, value_name = "PATH", requires = "preload")]
    pub preload_library: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// The exit code a shell would report for `status`: the code, or 128 + the signal.
fn exit_code(status: std::process::ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => (128 + signal) as u8,
        (None, None) => 1,
    }
}

pub fn run(args: RunArgs) -> Result<ExitCode> {
    let wait_for_signal = crate::signals::block_termination_signals_with_timeout();
    let executable = std::env::current_exe().context("cannot find the ringfs executable")?;
    let cluster = ringfs_launch::start(&args.start.launch_config()?)?;
    let outcome = run_in(&cluster, &args, &executable, &wait_for_signal);
    let stopped = cluster.stop();
    let status = outcome?;
    stopped.context("stopping the cluster")?;
    Ok(ExitCode::from(exit_code(status)))
}

fn run_in(
    cluster: &ringfs_launch::Cluster,
    args: &RunArgs,
    executable: &std::path::Path,
    wait_for_signal: &impl Fn(Duration) -> Option<i32>,
) -> Result<std::process::ExitStatus> {
    if let Some(directory) = &args.mount {
        cluster.mount(executable, directory, &[])?;
    }
    let (program, arguments) = args.command.split_first().context("no command given")?;
    if args.ranks == 0 {
        bail!("--ranks must be at least 1");
    }
    if let Some(cache) = &args.gmem_cache {
        crate::server_command::parse_bytes(cache).context("--gmem-cache")?;
    }
    let preload = match &args.preload {
        Some(prefix) => Some((prefix, preload_library(args.preload_library.as_deref(), executable)?)),
        None => None,
    };
    let job = format!("{:016x}", ringfs_rpc::memory::random_u64());
    let mut children = Vec::new();
    for rank in 0..args.ranks {
        let mut command = Command::new(program);
        command.args(arguments).envs(cluster.environment());
        if let Some(directory) = &args.mount {
            command.env(env::MOUNT, directory);
        }
        if let Some((prefix, library)) = &preload {
            // (The preload prefix wins over a FUSE mount's directory: both show the same files.)
            command.env(env::MOUNT, prefix).env("LD_PRELOAD", ringfs_bench::target::preload_list(library));
        }
        if args.ranks > 1 {
            command.env(env::GMEM_RANK, rank.to_string()).env(env::GMEM_RANKS, args.ranks.to_string()).env(env::GMEM_JOB, &job);
        }
        if let Some(cache) = &args.gmem_cache {
            command.env(env::GMEM_CACHE, cache);
        }
        if args.no_gmem_coop {
            command.env(env::GMEM_COOP, "0");
        }
        if args.gmem_relay {
            command.env(env::GMEM_RELAY, "1");
        }
        // The ranks' links are emulated as the servers' are.
        if let Some(mbps) = args.start.gmem.gmem_net_mbps {
            command
                .env(env::GMEM_NET_MBPS, mbps.to_string())
                .env(env::GMEM_NET_LATENCY_US, args.start.gmem.gmem_net_latency_us.to_string());
        }
        // SAFETY: only restores the signal mask between fork and exec.
        unsafe { command.pre_exec(crate::signals::unblock_in_child) };
        match command.spawn() {
            Ok(child) => children.push(child),
            Err(error) => {
                end_all(&mut children, libc::SIGTERM);
                bail!("cannot run {program}: {error}");
            }
        }
    }
    wait_all(children, wait_for_signal)
}

/// The preload library: the one given, or `libringfs_preload.so` beside the executable or in
/// `../lib` from it.
fn preload_library(given: Option<&std::path::Path>, executable: &std::path::Path) -> Result<PathBuf> {
    match given {
        Some(library) => Ok(library.to_path_buf()),
        None => Ok(ringfs_bench::target::preload_library(executable).context("or give --preload-library")?),
    }
}

/// Waits for every rank; the first to fail (or the last to end) gives the status, and a
/// failure ends the others (they would wait for it at their next barrier).
fn wait_all(
    mut children: Vec<std::process::Child>,
    wait_for_signal: &impl Fn(Duration) -> Option<i32>,
) -> Result<std::process::ExitStatus> {
    let mut status = None;
    while !children.is_empty() {
        let mut index = 0;
        while index < children.len() {
            match children[index].try_wait()? {
                Some(ended) => {
                    // (Reaped by try_wait already: wait returns its status at once.)
                    let _ = children.swap_remove(index).wait();
                    if !ended.success() && status.is_none_or(|first: std::process::ExitStatus| first.success()) {
                        status = Some(ended);
                        end_all(&mut children, libc::SIGTERM);
                    } else if status.is_none() {
                        status = Some(ended);
                    }
                }
                None => index += 1,
            }
        }
        if children.is_empty() {
            break;
        }
        if let Some(signal) = wait_for_signal(Duration::from_millis(20)) {
            // Pass the interruption on; the cluster is stopped once the command has ended.
            end_all(&mut children, signal);
        }
    }
    status.context("no command ran")
}

/// Sends `signal` to every child still running.
fn end_all(children: &mut [std::process::Child], signal: i32) {
    for child in children.iter() {
        // SAFETY: signalling a child this process started.
        unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    }
}
