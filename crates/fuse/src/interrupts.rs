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
//!
//! Any other request waits for servers at most the client's deadline (seconds, if a server
//! is stopped or cut off). For most requests a caller that is being killed — `kill -9`,
//! Ctrl-C of a program that does not handle it — ends that wait too ([`waiting_for`]), as
//! `kill -9` ends a wait on an NFS server: those that only read (a lookup, a stat, a
//! listing, a read), and the changes whose unknown outcome the mount makes good afterwards
//! (`operations.rs`, `outcome_unknown`: it forgets what it assumed and has the kernel drop
//! the name or file). Creates, opens and renames must not be given up — an open registered
//! at a server whose answer the mount dropped would stay registered until the mount
//! disconnects, and a rename moves the paths of the inodes the mount holds — so through
//! `/dev/fuse` they run [`releasing_for`] their caller: a caller being killed is answered
//! EINTR at once, and the request goes on to its end, its outcome applied (and an open the
//! kernel never got closed). Through the io_uring queues, whose entry is answered by the
//! thread that waits, they wait for their answer.

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

/// Whether thread `tid` is being killed: SIGKILL is pending for it. That is `kill -9`, and
/// any signal whose default action ends the process and which the process neither handles,
/// blocks nor ignores (SIGINT at a terminal, SIGTERM): the kernel turns those into SIGKILL
/// for every thread of the process when it sends them. The program will never see the
/// answer, so any wait for a server on its behalf may end (`ringfs_client::on_behalf_of`). A
/// program that handles the signal is not being killed: as on a local file system, its
/// system call goes on. A `tid` of 0, or one that cannot be read, is not being killed (a
/// request the kernel sends on its own behalf, such as a `RELEASE`, must finish).
pub fn being_killed(tid: u32) -> bool {
    if tid == 0 {
        return false;
    }
    std::fs::read_to_string(format!("/proc/{tid}/status")).is_ok_and(|status| kill_pending(&status))
}

/// Runs `work`, a request for thread `caller` that may be given up (see the module doc):
/// its waits for servers end (EINTR) once the caller is [`being_killed`].
pub fn waiting_for<T>(caller: u32, work: impl FnOnce() -> T) -> T {
    ringfs_client::on_behalf_of(caller, being_killed, work)
}

/// Runs `work`, a request for thread `caller` whose outcome must be known (see the module
/// doc), to its end; `release` (which answers the caller) runs once the caller is found
/// [`being_killed`] while `work` waits for a server.
pub fn releasing_for<T>(caller: u32, release: impl FnOnce() + 'static, work: impl FnOnce() -> T) -> T {
    ringfs_client::releasing_for(caller, being_killed, release, work)
}

/// Bit of SIGKILL in the masks of `/proc/TID/status`.
const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);

fn status_mask(status: &str, field: &str) -> u64 {
    status.lines().find_map(|line| line.strip_prefix(field)).and_then(|value| u64::from_str_radix(value.trim(), 16).ok()).unwrap_or(0)
}

/// From the text of `/proc/TID/status`: SIGKILL pending for the thread or its process.
fn kill_pending(status: &str) -> bool {
    (status_mask(status, "SigPnd:") | status_mask(status, "ShdPnd:")) & SIGKILL_BIT != 0
}

/// From the text of `/proc/TID/status`: a signal pending for the thread (`SigPnd`) or its
/// process (`ShdPnd`) that the thread does not block (`SigBlk`; SIGKILL cannot be blocked).
fn unblocked_signal_pending(status: &str) -> bool {
    let mask = |field: &str| status_mask(status, field);
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

    #[test]
    fn only_a_pending_kill_counts_as_being_killed() {
        let status = |pending: &str, shared: &str, caught: &str| {
            format!("Name:\tpython3\nSigPnd:\t{pending}\nShdPnd:\t{shared}\nSigBlk:\t0000000000000000\nSigCgt:\t{caught}\n")
        };
        assert!(!kill_pending(&status("0000000000000000", "0000000000000000", "0000000000000000")));
        // SIGINT to a program that handles it (Python's KeyboardInterrupt): its call goes on.
        assert!(!kill_pending(&status("0000000000000000", "0000000000000002", "0000000000000002")));
        // `kill -9`, or a fatal signal the kernel turned into SIGKILL for the thread.
        assert!(kill_pending(&status("0000000000000000", "0000000000000100", "0000000000000000")));
        assert!(kill_pending(&status("0000000000000100", "0000000000000000", "0000000000000002")));
        assert!(!being_killed(0));
        assert!(!being_killed(std::process::id()), "this test is not being killed");
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
