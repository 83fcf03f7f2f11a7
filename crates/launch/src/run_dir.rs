//! The run directory of a job's cluster: what `stop` and later commands need (the servers'
//! names, addresses and process ids, the secret, the mounts made for it), written readable by
//! the owner only, and the ending of those mounts.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::process::{process_alive, signal, wait_for_exit};
use crate::{Result, SHUTDOWN_TIMEOUT, io_error};

/// A launched server, as recorded in the run directory.
pub(crate) struct ServerRecord {
    pub name: String,
    pub address: String,
    /// Process id, for servers started on this machine.
    pub pid: Option<u32>,
}

pub(crate) fn random_hex(bytes: usize) -> String {
    let digits: String = (0..bytes.div_ceil(8)).map(|_| format!("{:016x}", ringfs_rpc::memory::random_u64())).collect();
    digits[..bytes * 2].to_string()
}

pub(crate) fn default_run_dir(shared: bool) -> PathBuf {
    let id = random_hex(6);
    if shared && let Some(home) = std::env::var_os("HOME") {
        return PathBuf::from(home).join(".ringfs").join(id);
    }
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    std::env::temp_dir().join(format!("ringfs-{uid}")).join(id)
}

pub(crate) fn write_private(path: &Path, contents: &str) -> Result<()> {
    let what = format!("cannot write {}", path.display());
    let mut file = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).map_err(io_error(&what))?;
    file.write_all(contents.as_bytes()).map_err(io_error(what))
}

pub(crate) fn write_records(run_dir: &Path, records: &[ServerRecord]) -> Result<()> {
    let text: String = records
        .iter()
        .map(|record| format!("{} {} {}\n", record.name, record.address, record.pid.map(|pid| pid.to_string()).unwrap_or("-".into())))
        .collect();
    write_private(&run_dir.join("servers"), &text)
}

pub(crate) fn read_records(run_dir: &Path) -> Result<Vec<ServerRecord>> {
    let text = fs::read_to_string(run_dir.join("servers")).map_err(io_error(format!("{} holds no ringfs cluster", run_dir.display())))?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            Some(ServerRecord { name: words.next()?.to_string(), address: words.next()?.to_string(), pid: words.next()?.parse().ok() })
        })
        .collect())
}

/// True while `directory` is a mount point (per /proc/self/mountinfo).
fn is_mounted(directory: &Path) -> bool {
    let Ok(canonical) = directory.canonicalize().or_else(|_| Ok::<_, std::io::Error>(directory.to_path_buf())) else { return false };
    let target = canonical.display().to_string();
    fs::read_to_string("/proc/self/mountinfo").unwrap_or_default().lines().any(|line| line.split(' ').nth(4) == Some(target.as_str()))
}

/// Ends the mounts of a cluster: SIGTERM to each `ringfs mount` (it unmounts), and a lazy
/// unmount of any mount point still attached (a mount process that died).
pub(crate) fn unmount_all(run_dir: &Path) {
    let records = fs::read_to_string(run_dir.join("mounts")).unwrap_or_default();
    let mounts: Vec<(u32, PathBuf)> = records
        .lines()
        .filter_map(|line| line.split_once(' ').and_then(|(pid, dir)| Some((pid.parse().ok()?, PathBuf::from(dir)))))
        .collect();
    let pids: Vec<u32> = mounts.iter().map(|(pid, _)| *pid).filter(|pid| process_alive(*pid)).collect();
    for pid in &pids {
        signal(*pid, libc::SIGTERM);
    }
    wait_for_exit(&pids, SHUTDOWN_TIMEOUT);
    for (_, directory) in &mounts {
        if is_mounted(directory) {
            log::warn!("{} is still mounted; detaching it", directory.display());
            let detached = Command::new("fusermount3").arg("-u").arg("-z").arg(directory).status().is_ok_and(|status| status.success());
            if !detached {
                let _ = Command::new("umount").arg("-l").arg(directory).status();
            }
        }
    }
}
