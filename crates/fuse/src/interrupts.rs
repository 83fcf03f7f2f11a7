//! Whether the process a long request waits for still wants the answer.
//!
//! A program blocked in a system call on a local file system gives up when a signal comes
//! (`F_SETLKW` returns EINTR; `kill -9` ends it at once). Through FUSE the kernel tells the
//! file system with a `FUSE_INTERRUPT` request, but fuser answers those with ENOSYS, after
//! which the kernel sends none and leaves the program waiting — even after `kill -9`, in
//! uninterruptible sleep — until the file system answers. So a request that may wait for a
//! long time (a lock wait, the only one ringfs has) looks at its caller itself between tries:
//! a signal pending that the caller does not block, or a caller that is gone, ends the wait
//! with EINTR. The kernel then returns EINTR to the program (which runs its handler), or lets
//! a killed one die.

use std::io::ErrorKind;

/// Whether thread `tid` (the caller of a request, as the kernel names it in the mount's PID
/// namespace) has a signal pending that it does not block, or no longer exists. A `tid` of 0
/// (a caller the mount's namespace cannot name) or a status that cannot be read tells
/// nothing: `false`.
pub fn signal_pending(tid: u32) -> bool {
    if tid == 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{tid}/status")) {
        Ok(status) => unblocked_signal_pending(&status),
        Err(error) => error.kind() == ErrorKind::NotFound,
    }
}

/// From the text of `/proc/TID/status`: a signal pending for the thread (`SigPnd`) or its
/// process (`ShdPnd`) that the thread does not block (`SigBlk`; SIGKILL cannot be blocked).
fn unblocked_signal_pending(status: &str) -> bool {
    let mask = |field: &str| {
        status.lines().find_map(|line| line.strip_prefix(field)).and_then(|value| u64::from_str_radix(value.trim(), 16).ok()).unwrap_or(0)
    };
    (mask("SigPnd:") | mask("ShdPnd:")) & !mask("SigBlk:") != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::{Duration, Instant};

    #[test]
    fn a_pending_signal_counts_unless_blocked() {
        let status = |pending: &str, shared: &str, blocked: &str| {
            format!("Name:\tsleep\nSigPnd:\t{pending}\nShdPnd:\t{shared}\nSigBlk:\t{blocked}\nSigIgn:\t0000000000000000\n")
        };
        assert!(!unblocked_signal_pending(&status("0000000000000000", "0000000000000000", "0000000000000000")));
        // SIGINT (2) sent to the process, SIGUSR1 (10) to the thread.
        assert!(unblocked_signal_pending(&status("0000000000000000", "0000000000000002", "0000000000000000")));
        assert!(unblocked_signal_pending(&status("0000000000000200", "0000000000000000", "0000000000000000")));
        // Blocked signals wait for the thread to unblock them: the wait goes on.
        assert!(!unblocked_signal_pending(&status("0000000000000200", "0000000000000002", "0000000000000202")));
        // SIGKILL (9) is pending even where a blocked mask would claim it.
        assert!(unblocked_signal_pending(&status("0000000000000000", "0000000000000100", "fffffffffffffeff")));
    }

    /// A real process: nothing pending, then a signal it cannot handle yet (it is stopped),
    /// then gone.
    #[test]
    fn a_process_with_a_signal_waiting_and_a_process_gone() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        assert!(!signal_pending(pid), "a sleeping process has no signal pending");
        let signal = |signal: i32| assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
        signal(libc::SIGSTOP);
        // A stopped process leaves SIGTERM pending until it runs again.
        let started = Instant::now();
        while !std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap().contains("State:\tT") {
            assert!(started.elapsed() < Duration::from_secs(5), "the process did not stop");
            std::thread::sleep(Duration::from_millis(5));
        }
        signal(libc::SIGTERM);
        assert!(signal_pending(pid), "SIGTERM waits for the stopped process");
        signal(libc::SIGKILL);
        child.wait().unwrap();
        assert!(signal_pending(pid), "a process gone has nobody waiting for the answer");
        assert!(!signal_pending(0));
    }
}
