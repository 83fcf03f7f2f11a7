//! A server holding many clients: thousands of authenticated connections cost it no threads
//! and little memory and are all accepted quickly (through `ringfs bench connections`), and
//! clients give back the connections they stopped using and open them again transparently.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{TestCluster, read_file, ringfs_binary, scratch_dir, write_file};
use ringfs_client::{Client, OpenFlags};

/// Sockets a process holds (its listeners and its connections).
fn sockets_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

fn wait_until(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn idle_connections_are_closed_and_reopened_transparently_unless_files_are_open() {
    let cluster = TestCluster::start(1);
    let pid = cluster.pid(0);
    write_file(&cluster.client(), "/kept", b"kept bytes");
    // Once the server has seen the test's other clients go, what is left is its listeners.
    let listeners = 2;
    wait_until("only the listeners", Duration::from_secs(5), || sockets_of(pid) == listeners);
    let mut config = cluster.client_config();
    config.idle_close = Some(Duration::from_secs(1));
    let client = Client::connect(config).unwrap();
    assert_eq!(read_file(&client, "/kept").unwrap(), b"kept bytes");
    wait_until("the client's connection to count", Duration::from_secs(5), || sockets_of(pid) == listeners + 1);
    wait_until("the idle connection to close", Duration::from_secs(10), || sockets_of(pid) == listeners);
    // The next request opens a new one.
    assert_eq!(read_file(&client, "/kept").unwrap(), b"kept bytes");
    assert_eq!(sockets_of(pid), listeners + 1);
    // A process with a file open keeps its connection: the server keeps its opens only
    // while it has one.
    let fd = client.open("/kept", OpenFlags::READ, 0).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(sockets_of(pid), listeners + 1, "a connection with an open file behind it stays");
    let mut buffer = [0u8; 10];
    assert_eq!(client.pread(fd, &mut buffer, 0).unwrap(), 10);
    client.close(fd).unwrap();
    wait_until("the connection to close after the last close", Duration::from_secs(10), || sockets_of(pid) == listeners);
}

/// 4,000 connections (the suite's reduced count; `ringfs bench connections --clients 16000`
/// is measured in docs/PERFORMANCE.md) opened at once by two holder processes from two
/// loopback addresses: all accepted within 5 s, with no more server threads than before
/// them, and at most 4 KiB of server memory each.
#[test]
fn a_server_holds_4000_connections_with_bounded_threads_and_memory() {
    let dir = scratch_dir("connections");
    let json = dir.join("result.json");
    let output = Command::new(ringfs_binary())
        .args(["bench", "connections", "--servers", "1", "--clients", "4000", "--procs", "2", "--stats", "200"])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{report}\n{}", String::from_utf8_lossy(&output.stderr));
    let result: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let number =
        |path: &[&str]| path.iter().fold(&result, |value, key| &value[key]).as_f64().unwrap_or_else(|| panic!("{path:?} in {result}"));
    assert_eq!(number(&["accepted"]), 4000.0, "{report}");
    assert_eq!(number(&["failed"]), 0.0, "{report}");
    assert!(number(&["storm_seconds"]) <= 5.0, "{report}");
    let threads_alone = number(&["alone", "threads"]);
    assert!(number(&["idle", "threads"]) <= threads_alone + 2.0, "threads follow busy connections, not connections:\n{report}");
    assert!(number(&["chatter", "threads"]) <= threads_alone + 32.0, "{report}");
    assert!(number(&["bytes_per_connection"]) <= 4096.0, "{report}");
}
