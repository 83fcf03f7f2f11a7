//! The processes a launcher deals with — servers, mounts, `srun`, node agents — by pid:
//! whether one still runs, whether it is the process a record says it is, signals, and
//! bounded waits for exits.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

/// True while a process runs. An exited process stays a zombie until its parent reaps it:
/// reap it if it is our child, and count a zombie as gone either way.
pub(crate) fn process_alive(pid: u32) -> bool {
    // SAFETY: a non-blocking wait for one specific pid; it fails harmlessly (ECHILD) when the
    // process is not our child.
    unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG) };
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid as libc::pid_t, 0) } != 0 {
        return false;
    }
    let state = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state letter follows the parenthesised command name.
    !matches!(state.rsplit_once(") ").map(|(_, rest)| rest.chars().next()), Some(Some('Z' | 'X')))
}

pub(crate) fn signal(pid: u32, signal: i32) {
    // SAFETY: only called with pids of processes this crate started or recorded (and checked
    // with `runs_command` where the pid comes from a file).
    unsafe { libc::kill(pid as libc::pid_t, signal) };
}

/// Waits up to `timeout` for processes to exit.
pub(crate) fn wait_for_exit_only(pids: &[u32], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while pids.iter().any(|pid| process_alive(*pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for processes to exit; kills (SIGKILL) those still there at the end. Returns the
/// pids that had to be killed.
pub(crate) fn wait_for_exit(pids: &[u32], timeout: Duration) -> Vec<u32> {
    wait_for_exit_only(pids, timeout);
    let stubborn: Vec<u32> = pids.iter().copied().filter(|pid| process_alive(*pid)).collect();
    for pid in &stubborn {
        // A stopped process dies of SIGKILL too; SIGCONT first lets it go away at once.
        signal(*pid, libc::SIGKILL);
        signal(*pid, libc::SIGCONT);
    }
    // SIGKILL is delivered asynchronously: return once they are gone, so that a caller that
    // reports them killed does not leave them running a moment longer.
    wait_for_exit_only(&stubborn, Duration::from_secs(5));
    stubborn
}

/// SIGTERM, then SIGKILL after `grace`, to those of `pids` still running.
pub(crate) fn terminate(pids: &[u32], grace: Duration) -> Vec<u32> {
    let running: Vec<u32> = pids.iter().copied().filter(|pid| process_alive(*pid)).collect();
    for pid in &running {
        signal(*pid, libc::SIGTERM);
        signal(*pid, libc::SIGCONT);
    }
    wait_for_exit(&running, grace)
}

/// Whether process `pid` runs and its command line has every word of `words` and an argument
/// inside `directory` (a recorded pid may have been reused by another program).
pub(crate) fn runs_command(pid: u32, words: &[&str], directory: &Path) -> bool {
    if !process_alive(pid) {
        return false;
    }
    let command_line = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let arguments: Vec<&[u8]> = command_line.split(|byte| *byte == 0).collect();
    let directory = directory.as_os_str().as_encoded_bytes();
    words.iter().all(|word| arguments.contains(&word.as_bytes())) && arguments.iter().any(|argument| argument.starts_with(directory))
}

/// The signals that end a command (SIGTERM, SIGINT, SIGHUP).
pub fn termination_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-set manipulation on a zeroed sigset_t.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, signal);
        }
        set
    }
}

/// Unblocks the termination signals in a child process before it runs its program (a
/// blocked mask is inherited across exec); async-signal-safe, for `Command::pre_exec`.
pub fn unblock_termination_signals() -> std::io::Result<()> {
    let set = termination_signals();
    // SAFETY: async-signal-safe; changes the calling thread's mask only.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    /// A server that had to be killed is gone when `stop` returns: `SIGKILL` only starts the
    /// end of a process, and one with much memory to free (here 1 GiB) stays for a while
    /// after it (`tests/cli.rs: stop_reports_a_server_it_had_to_kill` once found the killed
    /// server still there, on a loaded machine).
    #[test]
    fn processes_killed_for_not_stopping_are_gone_when_the_wait_returns() {
        let program = "import sys, time\nheld = b'1' * (1 << 30)\nprint('ready', flush=True)\ntime.sleep(600)";
        let mut child = Command::new("python3").args(["-c", program]).stdout(Stdio::piped()).spawn().expect("python3");
        let mut ready = String::new();
        std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut ready).expect("ready");
        assert_eq!(ready.trim(), "ready");
        let pid = child.id();
        signal(pid, libc::SIGSTOP);
        let killed = wait_for_exit(&[pid], Duration::from_millis(100));
        let gone = !process_alive(pid);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(killed, [pid]);
        assert!(gone, "the killed process is still there");
    }
}
