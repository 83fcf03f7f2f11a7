//! Helpers shared by the UCX tests: skipping where UCX is missing, the transport variants,
//! driving two workers from one thread, and a peer in a child process.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ringfs_ucx::{Context, ContextConfig, Worker};

/// UCX's TCP transport alone, and its shared-memory transports (with TCP, which UCX needs to
/// set up connections made from socket addresses).
pub const VARIANTS: [&str; 2] = ["tcp", "posix,sysv,cma,tcp"];

/// True if UCX is installed. Otherwise the test reports that it is skipped, or fails where
/// `RINGFS_REQUIRE_UCX=1` (set by test.sh after scripts/setup.sh installed UCX).
pub fn ucx_present() -> bool {
    if ringfs_ucx::is_available() {
        return true;
    }
    assert!(std::env::var("RINGFS_REQUIRE_UCX").as_deref() != Ok("1"), "libucp.so.0 cannot be loaded but RINGFS_REQUIRE_UCX=1");
    eprintln!("SKIPPED: UCX (libucp.so.0) is not installed");
    false
}

pub fn context(transports: &str) -> Context {
    Context::new(&ContextConfig { transports: Some(transports.to_string()) }).expect("a UCX context")
}

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Progresses both workers until `done` or 10 s pass.
pub fn progress_both(first: &Worker, second: &Worker, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        first.progress();
        second.progress();
        assert!(Instant::now() < deadline, "no progress within 10 s");
    }
}

/// A process running `peer_main` of the test binary `test_name` (the test is `#[ignore]`d and
/// only acts with RINGFS_UCX_PEER set), killed on drop.
pub struct PeerProcess {
    pub child: Child,
    pub address: SocketAddr,
}

impl PeerProcess {
    /// Starts the peer with transports `transports`; it prints its listening address first.
    pub fn start(test_name: &str, transports: &str) -> PeerProcess {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([test_name, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env("RINGFS_UCX_PEER", transports)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the peer process");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let address = loop {
            let line = lines.next().expect("the peer printed its address").unwrap();
            // The test harness prints "test NAME ... " on the same line first.
            if let Some((_, address)) = line.split_once("PEER ") {
                break address.trim().parse().unwrap();
            }
        };
        PeerProcess { child, address }
    }

    /// Sends `signal`; for SIGSTOP, returns once every thread of the peer has stopped (the
    /// signal takes effect as each thread next leaves the kernel: on a loaded machine the
    /// peer answered a request sent right after the `kill`).
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: a process we started and have not reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        if signal == libc::SIGSTOP {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !self.stopped() {
                assert!(Instant::now() < deadline, "the peer did not stop within 10 s of SIGSTOP");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }

    /// Whether every thread of the peer is stopped (state `T` in `/proc/PID/task/*/stat`).
    fn stopped(&self) -> bool {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.child.id())) else { return false };
        tasks.flatten().all(|task| {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // (The state follows the command name, which is in parentheses.)
            stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
        })
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
