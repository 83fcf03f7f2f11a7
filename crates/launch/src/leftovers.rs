//! What the Slurm clusters of a node leave behind, and its removal.
//!
//! Each node agent keeps its node's part of a cluster in `<run dir>/<node>/` (the server's
//! socket, log and temporary files) and records there, in `agent`, its own pid, its server's
//! pid and the node's store directory. It removes all of that when its server ends. An agent
//! killed first (SIGKILL after Slurm's `KillWait`) leaves them, and so does a launcher whose
//! `srun` was killed: [`clean`] removes them — at the next `ringfs start` on the node (for
//! runs whose processes are gone) or from the epilog (`ringfs cleanup --job ID`, for
//! everything of a job that has ended, its processes first).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::process::{process_alive, runs_command, terminate};
use crate::{LaunchError, Result, io_error, write_private};

/// The record file in a node's directory.
const AGENT_RECORD: &str = "agent";

/// A node agent's record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentRecord {
    pub agent: u32,
    pub server: Option<u32>,
    /// The node's store directory (a `dir` store), removed with the node directory.
    pub store: Option<PathBuf>,
}

impl AgentRecord {
    /// Writes the record into `node_dir`.
    pub fn write(&self, node_dir: &Path) -> Result<()> {
        let mut text = format!("agent {}\n", self.agent);
        if let Some(server) = self.server {
            text.push_str(&format!("server {server}\n"));
        }
        if let Some(store) = &self.store {
            text.push_str(&format!("store {}\n", store.display()));
        }
        write_private(&node_dir.join(AGENT_RECORD), &text)
    }

    fn read(node_dir: &Path) -> Option<AgentRecord> {
        let text = fs::read_to_string(node_dir.join(AGENT_RECORD)).ok()?;
        let mut record = AgentRecord::default();
        for line in text.lines() {
            match line.split_once(' ') {
                Some(("agent", pid)) => record.agent = pid.parse().ok()?,
                Some(("server", pid)) => record.server = pid.parse().ok(),
                Some(("store", path)) => record.store = Some(PathBuf::from(path)),
                _ => {}
            }
        }
        Some(record)
    }
}

/// Removes a node's directory and its store (what its agent recorded), then the run
/// directory above it if nothing else is left there.
pub fn remove_node_dir(node_dir: &Path) -> Result<()> {
    if let Some(store) = AgentRecord::read(node_dir).and_then(|record| record.store) {
        remove_tree(&store)?;
        // The run's directory above the node stores (`PATH/<run>/<node>`), once empty.
        if let Some(parent) = store.parent() {
            let _ = fs::remove_dir(parent);
        }
    }
    remove_tree(node_dir)?;
    if let Some(run_dir) = node_dir.parent() {
        remove_if_empty(run_dir);
    }
    Ok(())
}

/// Removes a run directory that is empty, then its user's directory if that is empty too
/// (nothing of the job stays on the node).
pub(crate) fn remove_if_empty(run_dir: &Path) {
    if fs::remove_dir(run_dir).is_ok()
        && let Some(user_dir) = run_dir.parent()
    {
        let _ = fs::remove_dir(user_dir);
    }
}

fn remove_tree(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(io_error(format!("cannot remove {}", path.display()))(error)),
        _ => Ok(()),
    }
}

/// Which runs [`clean`] treats as leftovers.
#[derive(Clone, Copy, Debug)]
pub enum Scope<'a> {
    /// Those whose processes are all gone (never `except`, the run being started).
    Dead { except: Option<&'a Path> },
    /// Every run of this job (it has ended): their processes are ended first.
    Job(&'a str),
}

/// The Slurm run directories under `base` (the `ringfs-<uid>` directories of the node's
/// temporary directory for [`Scope::Job`], which the epilog cleans for every user).
fn run_dirs(base: &Path, scope: Scope) -> Vec<PathBuf> {
    let user_dirs: Vec<PathBuf> = match scope {
        Scope::Dead { .. } => vec![base.to_path_buf()],
        Scope::Job(_) => subdirectories(base).into_iter().filter(|dir| file_name_starts(dir, "ringfs-")).collect(),
    };
    let prefix = match scope {
        Scope::Dead { .. } => "slurm-".to_string(),
        Scope::Job(job) => format!("slurm-{job}-"),
    };
    let mut runs: Vec<PathBuf> =
        user_dirs.iter().flat_map(|dir| subdirectories(dir)).filter(|dir| file_name_starts(dir, &prefix)).collect();
    if let Scope::Dead { except: Some(except) } = scope {
        runs.retain(|dir| dir != except);
    }
    runs
}

fn subdirectories(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    entries.flatten().filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir())).map(|entry| entry.path()).collect()
}

fn file_name_starts(path: &Path, prefix: &str) -> bool {
    path.file_name().and_then(|name| name.to_str()).is_some_and(|name| name.starts_with(prefix))
}

/// Removes leftovers of Slurm runs under `base` (see [`Scope`]); returns one line for each
/// node directory or run directory removed, or that could not be removed.
pub fn clean(base: &Path, scope: Scope) -> Vec<String> {
    let mut report = Vec::new();
    for run_dir in run_dirs(base, scope) {
        let mut live_agents = 0;
        for node_dir in subdirectories(&run_dir) {
            let Some(record) = AgentRecord::read(&node_dir) else { continue };
            let agent_alive = runs_command(record.agent, &["node-agent"], &run_dir);
            if agent_alive && matches!(scope, Scope::Dead { .. }) {
                live_agents += 1;
                continue;
            }
            report.push(clean_node(&node_dir, &record));
        }
        let step = crate::slurm::running_step(&run_dir);
        match scope {
            Scope::Job(_) => {
                terminate(&step, Duration::from_secs(5));
            }
            Scope::Dead { .. } if !step.is_empty() => continue,
            Scope::Dead { .. } => {}
        }
        if live_agents > 0 {
            continue;
        }
        // A launching node's run directory (its step record, logs, mounts) goes as a whole,
        // and so does every run directory of an ended job; otherwise only an empty one
        // (another run may be creating its node directory).
        if crate::slurm::is_step(&run_dir) || matches!(scope, Scope::Job(_)) {
            crate::unmount_all(&run_dir);
            match fs::remove_dir_all(&run_dir) {
                Ok(()) => report.push(format!("removed {}", run_dir.display())),
                Err(error) => report.push(format!("cannot remove {}: {error}", run_dir.display())),
            }
            if let Some(user_dir) = run_dir.parent() {
                let _ = fs::remove_dir(user_dir);
            }
        } else {
            remove_if_empty(&run_dir);
        }
    }
    report
}

/// Ends a node's recorded processes (the agent and its server) and removes its directory.
fn clean_node(node_dir: &Path, record: &AgentRecord) -> String {
    let run_dir = node_dir.parent().unwrap_or(node_dir);
    let mut pids = Vec::new();
    if runs_command(record.agent, &["node-agent"], run_dir) {
        pids.push(record.agent);
    }
    if let Some(server) = record.server.filter(|pid| runs_command(*pid, &["server"], node_dir)) {
        pids.push(server);
    }
    // (In cache mode a server flushes before it exits: give it time.)
    let killed = terminate(&pids, Duration::from_secs(30));
    let ended = if pids.is_empty() { String::new() } else { format!(" (ended pids {pids:?}, killed {killed:?})") };
    match remove_node_dir(node_dir) {
        Ok(()) => format!("removed {}{ended}", node_dir.display()),
        Err(error) => format!("{error}{ended}"),
    }
}

/// Whether the agent of `node_dir` still runs (used by tests and `ringfs cleanup`).
pub fn agent_alive(node_dir: &Path) -> bool {
    let run_dir = node_dir.parent().unwrap_or(node_dir);
    AgentRecord::read(node_dir).is_some_and(|record| process_alive(record.agent) && runs_command(record.agent, &["node-agent"], run_dir))
}

/// The `ringfs-<uid>` directory under `temp` that this user's Slurm runs live in.
pub fn user_base(temp: &Path) -> PathBuf {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    temp.join(format!("ringfs-{uid}"))
}

/// Checks that a job id is a plain token (it becomes part of a path pattern).
pub fn check_job_id(job: &str) -> Result<()> {
    if job.is_empty() || !job.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(LaunchError::Config(format!("invalid job id {job:?}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back() {
        let dir = std::env::temp_dir().join(format!("ringfs-leftovers-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let record = AgentRecord { agent: 12, server: Some(34), store: Some("/local/ringfs/slurm-1-abc/n1".into()) };
        record.write(&dir).unwrap();
        assert_eq!(AgentRecord::read(&dir), Some(record));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dead_runs_are_removed_and_live_ones_kept() {
        let base = std::env::temp_dir().join(format!("ringfs-leftovers-base-{}", std::process::id()));
        let store = base.join("store/slurm-7-aaa/n1");
        let dead = base.join("slurm-7-aaa/n1");
        fs::create_dir_all(&dead).unwrap();
        fs::create_dir_all(&store).unwrap();
        // A pid that cannot be a live agent: our own process runs no node-agent.
        AgentRecord { agent: std::process::id(), server: None, store: Some(store.clone()) }.write(&dead).unwrap();
        let starting = base.join("slurm-8-bbb");
        fs::create_dir_all(&starting).unwrap();
        fs::write(starting.join("secret"), "x").unwrap();
        let report = clean(&base, Scope::Dead { except: None });
        assert_eq!(report.len(), 1, "{report:?}");
        assert!(!base.join("slurm-7-aaa").exists() && !store.exists() && !base.join("store/slurm-7-aaa").exists());
        assert!(starting.exists(), "a run being created (no step record, no agents) is left alone");
        assert!(check_job_id("123_4").is_ok() && check_job_id("1/..").is_err() && check_job_id("").is_err());
        fs::remove_dir_all(&base).unwrap();
    }
}
