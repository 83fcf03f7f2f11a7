//! `ringfs run [options] -- CMD ARGS`: a whole job in one command — start a cluster, mount it
//! if asked, run CMD with the client environment, and stop everything afterwards, also when
//! CMD fails or the job is interrupted. Exits with CMD's status.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::cluster::StartArgs;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub start: StartArgs,
    /// Mount the file system here for the command (FUSE).
    #[arg(long)]
    pub mount: Option<PathBuf>,
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
    let mut command = Command::new(program);
    command.args(arguments).envs(cluster.environment());
    if let Some(directory) = &args.mount {
        command.env("RINGFS_MOUNT", directory);
    }
    // SAFETY: only restores the signal mask between fork and exec.
    unsafe { command.pre_exec(crate::signals::unblock_in_child) };
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => bail!("cannot run {program}: {error}"),
    };
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if let Some(signal) = wait_for_signal(Duration::from_millis(100)) {
            // Pass the interruption on; the cluster is stopped once the command has ended.
            // SAFETY: signalling the child this function started.
            unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        }
    }
}
