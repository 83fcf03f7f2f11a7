//! Stopping a job's servers ([`stop`]): flush (cache mode), end every server, clean up.

use std::fs;
use std::path::Path;
use std::time::Duration;

use ringfs_client::Client;

use crate::process::{self, process_alive, signal, wait_for_exit, wait_for_exit_only};
use crate::run_dir::*;
use crate::slurm;
use crate::{LaunchError, Result, SHUTDOWN_TIMEOUT, io_error};

/// How [`stop`] behaves.
#[derive(Clone, Copy, Debug)]
pub struct StopOptions {
    /// Keep the run directory (logs) even when everything stopped cleanly.
    pub keep: bool,
    /// Stop the servers even if the final flush to the backend failed (its dirty data is
    /// then lost); without it they keep running, so nothing is lost.
    pub force: bool,
    /// How long servers get to exit after the shutdown request before they are killed.
    pub wait: Duration,
}

impl Default for StopOptions {
    fn default() -> Self {
        StopOptions { keep: false, force: false, wait: SHUTDOWN_TIMEOUT }
    }
}

/// A server process on this machine recorded in a run directory.
struct LocalServer {
    name: String,
    pid: u32,
}

/// The server processes of `run_dir` that run on this machine: the pid each server recorded
/// at its last start (`<name>.pid`: host and pid), and the ones the launcher recorded.
fn local_servers(run_dir: &Path) -> Vec<LocalServer> {
    let host = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
    let mut servers = Vec::new();
    for server in ringfs_client::run_dir::servers(run_dir) {
        let recorded = fs::read_to_string(run_dir.join(format!("{}.pid", server.name))).unwrap_or_default();
        let mut words = recorded.split_whitespace();
        if let (Some(pid_host), Some(pid)) = (words.next(), words.next().and_then(|pid| pid.parse().ok()))
            && pid_host == host
        {
            servers.push(LocalServer { name: server.name, pid });
        }
    }
    for record in read_records(run_dir).unwrap_or_default() {
        if let Some(pid) = record.pid
            && !servers.iter().any(|server| server.pid == pid)
        {
            servers.push(LocalServer { name: record.name, pid });
        }
    }
    // Only processes that are this cluster's servers (a recorded pid may have been reused).
    servers.retain(|server| is_server_of(server.pid, run_dir, &server.name));
    servers
}

/// Whether process `pid` is `ringfs server` for `name` of this run directory.
fn is_server_of(pid: u32, run_dir: &Path, name: &str) -> bool {
    process::runs_command(pid, &["server", name], run_dir)
}

/// Stops every server of the cluster in `run_dir`, wherever the run directory says the
/// servers are now, and waits until they have exited. In cache mode everything is flushed
/// to the backend first (if that fails the servers keep running, unless `force`).
///
/// Succeeds only if every server stopped cleanly; otherwise the error lists each problem
/// (a failed flush, a server that had to be killed, one that did not answer), and the run
/// directory is kept. On success it is removed unless `keep`.
pub fn stop(run_dir: &Path, options: StopOptions) -> Result<()> {
    if !run_dir.join("secret").exists() {
        return Err(LaunchError::Config(format!("{} holds no ringfs cluster (stopped already?)", run_dir.display())));
    }
    let step = slurm::is_step(run_dir);
    if step {
        slurm::mark_stopping(run_dir);
    }
    unmount_all(run_dir);
    let mut problems = Vec::new();
    let mut silent = Vec::new();
    let local = local_servers(run_dir);
    let config = ringfs_client::ClientConfig::new(Vec::new(), Vec::new()).with_run_dir(run_dir.to_path_buf());
    match Client::connect(config) {
        Ok(client) => {
            silent = silent_servers(&client, run_dir);
            if !step {
                problems.extend(silent.iter().map(|(_, problem)| problem.clone()));
            }
            if let Err(problem) = flush_before_stop(&client, options.force, &mut problems) {
                problems.push(problem);
                return Err(LaunchError::Stop { problems, kept: Some(run_dir.to_path_buf()) });
            }
            for (name, answer) in client.shutdown_each() {
                // (A step's nodes confirm their stop themselves: see below.)
                if let Err(errno) = answer
                    && !step
                    && !local.iter().any(|server| server.name == name)
                    && !silent.iter().any(|(silent, _)| *silent == name)
                {
                    problems.push(format!("server {name} did not answer the shutdown request ({errno}); it may still run"));
                }
            }
        }
        Err(error) if local.is_empty() && !step => problems.push(format!("no server of the cluster answered ({error})")),
        Err(error) => log::warn!("no server answered ({error}); stopping the local processes"),
    }
    let pids: Vec<u32> = local.iter().map(|server| server.pid).collect();
    wait_for_exit_only(&pids, options.wait);
    for server in local.iter().filter(|server| process_alive(server.pid)) {
        signal(server.pid, libc::SIGTERM);
    }
    let killed = wait_for_exit(&pids, Duration::from_secs(5));
    for server in &local {
        if killed.contains(&server.pid) {
            problems.push(format!("server {} (pid {}) did not stop and was killed", server.name, server.pid));
        }
    }
    if step {
        // A node that cleaned up is fine even if its server was gone (Slurm signalled it).
        let silent_names: Vec<String> = silent.iter().map(|(name, _)| name.clone()).collect();
        for node in slurm::finish_step(run_dir, options.wait, &silent_names) {
            let silence = silent.iter().find(|(name, _)| *name == node).map(|(_, problem)| format!("{problem}; ")).unwrap_or_default();
            problems.push(format!(
                "{silence}node {node} did not confirm that its server stopped and the node was cleaned (lost or cut off?): what is \
                 left there is removed by the next `ringfs start` on it or by `ringfs cleanup` (the epilog)"
            ));
        }
    }
    if !problems.is_empty() {
        return Err(LaunchError::Stop { problems, kept: Some(run_dir.to_path_buf()) });
    }
    if !options.keep {
        fs::remove_dir_all(run_dir).map_err(io_error(format!("cannot remove {}", run_dir.display())))?;
        if step && let Some(user_dir) = run_dir.parent() {
            // (Only when empty: other clusters of this user may live there.)
            let _ = fs::remove_dir(user_dir);
        }
    }
    Ok(())
}

/// The members that do not answer, each with a problem naming it and why: a server of this
/// machine whose process is gone died; another is dead or cut off.
fn silent_servers(client: &Client, run_dir: &Path) -> Vec<(String, String)> {
    client
        .server_status()
        .into_iter()
        .filter_map(|(member, status)| {
            let errno = status.err()?;
            let problem = match recorded_local_pid(run_dir, &member.name) {
                Some(pid) if !process_alive(pid) => {
                    format!("server {} (pid {pid}) is not running: it died, and the data it held is lost", member.name)
                }
                _ => format!(
                    "server {} at {} does not answer ({errno}): it died or is cut off, and the data it held is lost",
                    member.name, member.tcp_address
                ),
            };
            Some((member.name, problem))
        })
        .collect()
}

/// The pid server `name` recorded at its last start, if it started on this machine.
fn recorded_local_pid(run_dir: &Path, name: &str) -> Option<u32> {
    let host = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let recorded = fs::read_to_string(run_dir.join(format!("{name}.pid"))).ok()?;
    let mut words = recorded.split_whitespace();
    if words.next()? != host.trim() {
        return None;
    }
    words.next()?.parse().ok()
}

/// Cache mode: writes everything dirty to the backend while all servers still run (each
/// flush may need another server). Without a backend there is nothing to flush. A failed
/// flush is an error — the servers must keep running — only while an answering server
/// still holds unflushed data (what silent servers held is lost either way) and not `force`.
fn flush_before_stop(client: &Client, force: bool, problems: &mut Vec<String>) -> std::result::Result<(), String> {
    let caching = |status: &[(ringfs_proto::Member, ringfs_client::Result<ringfs_proto::ServerStats>)]| -> Vec<String> {
        status
            .iter()
            .filter_map(|(member, stats)| {
                let cache = stats.as_ref().ok()?.cache.as_ref()?;
                (cache.dirty_chunks > 0 || cache.pending_entries > 0).then(|| member.name.clone())
            })
            .collect()
    };
    let status = client.server_status();
    if !status.iter().any(|(_, stats)| stats.as_ref().is_ok_and(|stats| stats.cache.is_some())) {
        return Ok(());
    }
    let Err(errno) = client.sync() else { return Ok(()) };
    let holding = caching(&client.server_status());
    if holding.is_empty() {
        return Ok(());
    }
    let problem = format!("flushing to the backend failed ({errno}); servers {} still hold unflushed data", holding.join(", "));
    if force {
        problems.push(format!("{problem}, which was lost"));
        return Ok(());
    }
    Err(format!("{problem}; the servers keep running so that it is not lost: fix the backend and stop again, or stop with --force"))
}
