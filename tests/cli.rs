//! The `ringfs` command as users run it: start, tools, status, stop, and error reporting.

mod common;

use std::collections::HashMap;
use std::process::{Command, Output};

use common::{ringfs_binary, scratch_dir};

fn ringfs(environment: &HashMap<String, String>, args: &[&str]) -> Output {
    Command::new(ringfs_binary()).args(args).envs(environment).output().expect("run ringfs")
}

fn succeed(environment: &HashMap<String, String>, args: &[&str]) -> String {
    let output = ringfs(environment, args);
    assert!(output.status.success(), "ringfs {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// Parses the `export NAME=value` lines of `ringfs start`.
fn exports(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|line| line.strip_prefix("export "))
        .filter_map(|assignment| assignment.split_once('='))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

/// True once a process has exited (a zombie waiting for its parent counts as exited).
fn process_gone(pid: u32) -> bool {
    // SAFETY: signal 0 only probes whether the process exists.
    if unsafe { libc::kill(pid as libc::pid_t, 0) } != 0 {
        return true;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    matches!(stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next()), Some('Z' | 'X') | None)
}

/// Stops the cluster when the test ends, even on failure.
struct Started(HashMap<String, String>);

impl Drop for Started {
    fn drop(&mut self) {
        if self.0.contains_key("RINGFS_RUN_DIR") {
            let _ = ringfs(&self.0, &["stop"]);
        }
    }
}

#[test]
fn start_tools_status_and_stop() {
    let (scratch, run_dir, started) = start_local("cli", 3);
    let environment = &started.0;
    assert_eq!(environment["RINGFS_SERVER"].split(',').count(), 3);
    assert!(environment["RINGFS_SECRET"].len() >= 32);

    let local = scratch.join("input");
    let contents: Vec<u8> = (0..3_000_000u32).map(|value| (value % 253) as u8).collect();
    std::fs::write(&local, &contents).unwrap();
    succeed(environment, &["mkdir", "-p", "/a/b"]);
    succeed(environment, &["put", local.to_str().unwrap(), "/a/b/file"]);
    succeed(environment, &["mv", "/a/b/file", "/a/file"]);
    let copy = scratch.join("copy");
    succeed(environment, &["get", "/a/file", copy.to_str().unwrap()]);
    assert!(std::fs::read(&copy).unwrap() == contents);
    let listing = succeed(environment, &["ls", "-l", "/a"]);
    assert!(listing.contains("3000000 file") && listing.contains("b"), "{listing}");
    assert!(succeed(environment, &["stat", "/a/file"]).contains("Size: 3000000"));
    let status = succeed(environment, &["status"]);
    assert_eq!(status.lines().filter(|line| line.contains(" up ")).count(), 3, "{status}");

    let missing = ringfs(environment, &["cat", "/nope"]);
    assert_eq!(missing.status.code(), Some(1));
    let message = String::from_utf8_lossy(&missing.stderr);
    assert_eq!(message.trim(), "ringfs: /nope: No such file or directory");
    let not_empty = ringfs(environment, &["rmdir", "/a"]);
    assert!(String::from_utf8_lossy(&not_empty.stderr).contains("Directory not empty"));
    succeed(environment, &["rm", "-r", "/a"]);
    assert_eq!(succeed(environment, &["ls", "/"]), "");

    let pids: Vec<u32> = std::fs::read_to_string(run_dir.join("servers"))
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2)?.parse().ok())
        .collect();
    assert_eq!(pids.len(), 3);
    succeed(environment, &["stop"]);
    assert!(pids.iter().all(|pid| process_gone(*pid)), "servers must be gone after stop");
    assert!(!run_dir.exists());
    let again = ringfs(environment, &["stop"]);
    let message = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.code() == Some(1) && message.contains("stopped already?"), "a second stop says why: {message}");
    assert!(!run_dir.exists(), "a second stop makes nothing");
    let _ = std::fs::remove_dir_all(scratch);
}

#[test]
fn commands_without_a_cluster_explain_what_is_missing() {
    let mut environment = HashMap::new();
    environment.insert("RINGFS_SERVER".to_string(), String::new());
    let output = Command::new(ringfs_binary()).args(["ls", "/"]).env_remove("RINGFS_SERVER").output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("RINGFS_SERVER is not set"));
    let output = ringfs(&environment, &["start", "--store", "tape"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("invalid store"));
}

/// A port `p` such that `p` and `p + 1` are free on every address now (a fixed choice
/// collided with servers other tests had on ephemeral ports).
fn free_port_pair() -> u16 {
    for _ in 0..100 {
        let first = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let port = first.local_addr().unwrap().port();
        if port < u16::MAX && std::net::TcpListener::bind(("0.0.0.0", port + 1)).is_ok() {
            return port;
        }
    }
    panic!("no two free ports in a row");
}

/// `start --hostfile` launches one server per host through the launcher; a launcher that
/// runs the command locally stands in for ssh.
#[test]
fn start_with_a_hostfile_uses_the_launcher() {
    let scratch = scratch_dir("hostfile");
    let launcher = scratch.join("fake-ssh");
    std::fs::write(&launcher, "#!/bin/sh\nhost=\"$1\"; shift\nexec sh -c \"$*\"\n").unwrap();
    std::os::unix::fs::PermissionsExt::set_mode(&mut std::fs::metadata(&launcher).unwrap().permissions(), 0o755);
    std::fs::set_permissions(&launcher, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let hostfile = scratch.join("hosts");
    std::fs::write(&hostfile, "# compute nodes\n127.0.0.1 slots=4\n127.0.0.1\n").unwrap();
    let port = free_port_pair();
    let run_dir = scratch.join("run");
    let started = Started(exports(&succeed(
        &HashMap::new(),
        &[
            "start",
            "--hostfile",
            hostfile.to_str().unwrap(),
            "--launcher",
            launcher.to_str().unwrap(),
            "--port",
            &port.to_string(),
            "--run-dir",
            run_dir.to_str().unwrap(),
        ],
    )));
    let environment = &started.0;
    assert_eq!(environment["RINGFS_SERVER"], format!("127.0.0.1:{port},127.0.0.1:{}", port + 1));
    succeed(environment, &["mkdir", "/ok"]);
    assert_eq!(succeed(environment, &["ls", "/"]).trim(), "ok");
    drop(started);
    let _ = std::fs::remove_dir_all(scratch);
}

fn ringfs_run(args: &[&str]) -> Output {
    Command::new(ringfs_binary()).arg("run").args(args).output().expect("run ringfs run")
}

#[test]
fn run_propagates_the_exit_status_of_the_command() {
    assert_eq!(ringfs_run(&["--", "sh", "-c", "exit 3"]).status.code(), Some(3));
    assert_eq!(ringfs_run(&["--", "false"]).status.code(), Some(1));
    let ok = ringfs_run(&["--servers", "3", "--", "sh", "-c", "test -n \"$RINGFS_SERVER\" && test -n \"$RINGFS_SECRET\""]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    let missing = ringfs_run(&["--", "/no/such/program"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot run /no/such/program"));
}

#[test]
fn run_gives_the_command_a_working_cluster() {
    let script = format!(
        "{ringfs} mkdir /job && echo result > /tmp/ringfs-run-$$ && {ringfs} put /tmp/ringfs-run-$$ /job/out && rm /tmp/ringfs-run-$$ && \
         test \"$({ringfs} cat /job/out)\" = result",
        ringfs = ringfs_binary()
    );
    let output = ringfs_run(&["--", "sh", "-c", &script]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn run_with_a_mount_exposes_the_file_system_at_the_mount_point() {
    if !common::fuse_available() {
        return;
    }
    let scratch = scratch_dir("run-mount");
    let mount = scratch.join("mnt");
    std::fs::create_dir_all(&mount).unwrap();
    let script = "echo through-fuse > \"$RINGFS_MOUNT/file\" && test \"$(cat \"$RINGFS_MOUNT/file\")\" = through-fuse && mkdir \"$RINGFS_MOUNT/d\" && ls \"$RINGFS_MOUNT\" | grep -qx d";
    let output = ringfs_run(&["--mount", mount.to_str().unwrap(), "--", "sh", "-c", script]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(mount.to_str().unwrap()), "the mount must be gone after run");
    let _ = std::fs::remove_dir_all(scratch);
}

#[test]
fn an_interrupted_run_stops_its_command_and_cluster() {
    let scratch = scratch_dir("run-interrupt");
    let marker = scratch.join("run-dir");
    let script = format!("echo \"$RINGFS_RUN_DIR\" > {} && exec sleep 60", marker.display());
    let mut child = Command::new(ringfs_binary()).args(["run", "--", "sh", "-c", &script]).spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::read_to_string(&marker).map(|text| text.trim().is_empty()).unwrap_or(true) {
        assert!(std::time::Instant::now() < deadline, "the command never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let run_dir = std::path::PathBuf::from(std::fs::read_to_string(&marker).unwrap().trim());
    let pids: Vec<u32> = std::fs::read_to_string(run_dir.join("servers"))
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2)?.parse().ok())
        .collect();
    // SAFETY: signalling the `ringfs run` process this test started.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "exit status of a command killed by SIGTERM");
    assert!(!run_dir.exists(), "the cluster's run directory is removed");
    assert!(pids.iter().all(|pid| process_gone(*pid)), "the servers are stopped");
    let _ = std::fs::remove_dir_all(scratch);
}

/// The process id a server recorded in the run directory at its last start.
fn recorded_pid(run_dir: &std::path::Path, name: &str) -> u32 {
    let text = std::fs::read_to_string(run_dir.join(format!("{name}.pid"))).unwrap();
    text.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Starts `servers` local servers with `ringfs start`, their run directory in a fresh
/// scratch directory named after `tag`: (the scratch directory, the run directory, the
/// started cluster, stopped when dropped).
fn start_local(tag: &str, servers: usize) -> (common::Scratch, std::path::PathBuf, Started) {
    let scratch = scratch_dir(tag);
    let run_dir = scratch.join("run");
    let servers = servers.to_string();
    let started = Started(exports(&succeed(&HashMap::new(), &["start", "--servers", &servers, "--run-dir", run_dir.to_str().unwrap()])));
    (scratch, run_dir, started)
}

fn kill_and_wait(pid: u32) {
    signal_and_wait(pid, libc::SIGKILL);
}

/// Sends `signal` to server `pid` and waits (10 s at most) until it has exited.
fn signal_and_wait(pid: u32, signal: i32) {
    // SAFETY: a server process this test started (through ringfs start or by hand).
    unsafe { libc::kill(pid as libc::pid_t, signal) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !process_gone(pid) {
        assert!(std::time::Instant::now() < deadline, "server {pid} did not exit on signal {signal}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Restarts server `name` by hand, as a user would: same name and store, a new port.
fn restart_by_hand(run_dir: &std::path::Path, store: &std::path::Path, name: &str) -> std::process::Child {
    let old_address = std::fs::read_to_string(run_dir.join(format!("{name}.addr"))).unwrap();
    let log = std::fs::File::create(run_dir.join(format!("{name}.restarted.log"))).unwrap();
    let child = Command::new(ringfs_binary())
        .args(["server", "--name", name, "--run-dir", run_dir.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .args(["--store", &format!("dir:{}", store.join(name).display())])
        .args(["--heartbeat-ms", "200", "--failure-timeout-ms", "1000"])
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut child = child;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let address = std::fs::read_to_string(run_dir.join(format!("{name}.addr"))).unwrap_or_default();
        if !address.is_empty() && address != old_address {
            return child;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{name} did not record its new address");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Every server restarted by hand on a new port: clients holding the old addresses, `ringfs
/// status` and `ringfs stop` find them through the run directory.
#[test]
fn servers_restarted_by_hand_on_new_ports_are_found_through_the_run_directory() {
    let scratch = scratch_dir("restart");
    let run_dir = scratch.join("run");
    let store = scratch.join("store");
    let started = Started(exports(&succeed(
        &HashMap::new(),
        &["start", "--servers", "2", "--store", &format!("dir:{}", store.display()), "--run-dir", run_dir.to_str().unwrap()],
    )));
    let environment = &started.0;
    let local = scratch.join("input");
    std::fs::write(&local, b"survives restarts").unwrap();
    succeed(environment, &["put", local.to_str().unwrap(), "/kept"]);

    let mut children = Vec::new();
    for name in ["server-0", "server-1"] {
        kill_and_wait(recorded_pid(&run_dir, name));
        children.push(restart_by_hand(&run_dir, &store, name));
    }
    // RINGFS_SERVER still names the old ports, which nobody listens on any more.
    assert_eq!(succeed(environment, &["cat", "/kept"]), "survives restarts");
    let status = succeed(environment, &["status"]);
    assert_eq!(status.lines().filter(|line| line.contains(" up ")).count(), 2, "{status}");
    let pids: Vec<u32> = children.iter().map(std::process::Child::id).collect();
    succeed(environment, &["stop"]);
    for mut child in children {
        let _ = child.wait();
    }
    assert!(pids.iter().all(|pid| process_gone(*pid)), "the restarted servers must be stopped");
    assert!(!run_dir.exists(), "a clean stop removes the run directory");
    let _ = std::fs::remove_dir_all(scratch);
}

/// `ringfs stop` fails, and says which server, when it has to kill one; it keeps the run
/// directory (the logs) then.
#[test]
fn stop_reports_a_server_it_had_to_kill() {
    let (scratch, run_dir, started) = start_local("stop-kill", 2);
    let mut environment = started.0.clone();
    let stuck = recorded_pid(&run_dir, "server-1");
    // SAFETY: a server process this test started.
    unsafe { libc::kill(stuck as libc::pid_t, libc::SIGSTOP) };
    environment.insert("RINGFS_TIMEOUT_MS".into(), "1000".into());
    let output = ringfs(&environment, &["stop", "--wait-ms", "1000"]);
    let message = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{message}");
    assert!(message.contains("server-1") && message.contains("killed"), "{message}");
    assert!(process_gone(stuck));
    assert!(run_dir.join("server-1.log").exists(), "the logs are kept");
    let _ = std::fs::remove_dir_all(scratch);
}

/// With one of 3 servers dead and no backend there is nothing to flush: `ringfs stop` stops
/// the live servers, and its error names the dead server and why (it is not running).
#[test]
fn stop_with_a_dead_server_and_no_backend_stops_the_others_and_names_the_dead_one() {
    let (scratch, run_dir, started) = start_local("stop-dead", 3);
    let mut environment = started.0.clone();
    let live = [recorded_pid(&run_dir, "server-0"), recorded_pid(&run_dir, "server-2")];
    let dead = recorded_pid(&run_dir, "server-1");
    kill_and_wait(dead);
    environment.insert("RINGFS_TIMEOUT_MS".into(), "2000".into());
    let output = ringfs(&environment, &["stop", "--wait-ms", "5000"]);
    let message = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "a dead server is a problem to report: {message}");
    assert!(message.contains("server-1") && message.contains("not running"), "names the dead server and the cause: {message}");
    assert!(!message.contains("keep running"), "{message}");
    for pid in live {
        assert!(process_gone(pid), "live server {pid} was stopped: {message}");
    }
    let _ = std::fs::remove_dir_all(scratch);
}

/// Context switches of every thread of process `pid` so far.
fn context_switches(pid: u32) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .flatten()
        .map(|task| std::fs::read_to_string(task.path().join("status")).unwrap_or_default())
        .flat_map(|status| {
            status
                .lines()
                .filter(|line| line.starts_with("voluntary_ctxt_switches") || line.starts_with("nonvoluntary_ctxt_switches"))
                .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// Watches `dir` for files opened in it (inotify), until dropped.
struct OpenWatch(std::os::fd::OwnedFd);

impl OpenWatch {
    fn new(dir: &std::path::Path) -> OpenWatch {
        use std::os::fd::FromRawFd;
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: plain system calls; the descriptor is owned from here on.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1: {}", std::io::Error::last_os_error());
        let watch = OpenWatch(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid descriptor and a NUL-terminated path.
        let added = unsafe { libc::inotify_add_watch(fd, path.as_ptr(), libc::IN_OPEN) };
        assert!(added >= 0, "inotify_add_watch: {}", std::io::Error::last_os_error());
        watch
    }

    /// The names opened since the last call ("." for the directory itself).
    fn opened(&self) -> Vec<String> {
        use std::os::fd::AsRawFd;
        let mut names = Vec::new();
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: reads into a buffer of the given length.
            let read = unsafe { libc::read(self.0.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len()) };
            if read <= 0 {
                return names;
            }
            let mut at = 0;
            while at + 16 <= read as usize {
                let len = u32::from_ne_bytes(buffer[at + 12..at + 16].try_into().unwrap()) as usize;
                let name = &buffer[at + 16..at + 16 + len];
                let name = String::from_utf8_lossy(name).trim_end_matches('\0').to_string();
                names.push(if name.is_empty() { ".".into() } else { name });
                at += 16 + len;
            }
        }
    }
}

/// An idle cluster stays quiet: its servers' threads wake a few times a second at most (the
/// daemons on a job's compute nodes must not add noise beside the job: the directory-times
/// thread woke every 5 ms, ~200 times a second per server), and they do not read the run
/// directory again while it does not change (a hostfile cluster's run directory is in
/// `$HOME`, often a shared file system: every server read every address file every
/// heartbeat, N² opens a second).
#[test]
fn an_idle_cluster_neither_wakes_often_nor_reads_its_run_directory() {
    let (scratch, run_dir, started) = start_local("idle", 3);
    let pids: Vec<u32> = ["server-0", "server-1", "server-2"].iter().map(|name| recorded_pid(&run_dir, name)).collect();
    // Past the start's own traffic (and the directory's recent-change window).
    std::thread::sleep(std::time::Duration::from_secs(3));
    let watch = OpenWatch::new(&run_dir);
    let before: Vec<u64> = pids.iter().map(|pid| context_switches(*pid)).collect();
    let window = std::time::Duration::from_secs(3);
    std::thread::sleep(window);
    let after: Vec<u64> = pids.iter().map(|pid| context_switches(*pid)).collect();
    let opened = watch.opened();
    assert!(opened.is_empty(), "idle servers opened {opened:?} in the run directory");
    for (index, (before, after)) in before.iter().zip(&after).enumerate() {
        let per_second = (after - before) as f64 / window.as_secs_f64();
        // Heartbeats, the detector and the revive loop: a handful a second.
        assert!(per_second < 60.0, "idle server-{index} switched context {per_second:.0} times a second");
    }
    drop(started);
    let _ = std::fs::remove_dir_all(scratch);
}

/// The requests the servers of a cluster have answered so far (`ringfs status`'s column),
/// and how many servers are up.
fn requests_answered(environment: &HashMap<String, String>) -> (u64, usize) {
    let status = succeed(environment, &["status"]);
    let up: Vec<&str> = status.lines().filter(|line| line.contains(" up ")).collect();
    let requests = up.iter().map(|line| line.split_whitespace().nth(6).and_then(|field| field.parse::<u64>().ok()).unwrap()).sum();
    (requests, up.len())
}

/// A cluster's start costs its servers requests in proportion to their number: the server a
/// newcomer joins tells everybody (at most once per short gap, so joins that come together
/// go out together), and the others do not pass on what they learn. Every server passed on
/// every list it learnt from: 218 requests to start 8 servers, 1,343 for 16, 8,282 for 32
/// with release builds (782 for 16 in this test's debug build; now 136 for 16): a job of
/// 1,000 nodes would not have finished starting.
#[test]
fn starting_sixteen_servers_costs_requests_in_proportion() {
    let (scratch, _, started) = start_local("start-cost", 16);
    let (requests, up) = requests_answered(&started.0);
    assert_eq!(up, 16);
    assert!(requests < 400, "starting 16 servers cost {requests} requests");
    drop(started);
    let _ = std::fs::remove_dir_all(scratch);
}

/// A client process with the run directory in its environment (every process of a job has
/// it) reads nothing there while the servers it was given answer: on a hostfile cluster the
/// directory is in `$HOME`, often a shared file system, and every process read every
/// server's address file at its start. When none answers, it still finds them there
/// (`servers_restarted_by_hand_on_new_ports_are_found_through_the_run_directory`).
#[test]
fn clients_read_the_run_directory_only_when_the_given_servers_do_not_answer() {
    let (scratch, run_dir, started) = start_local("client-run-dir", 3);
    let local = scratch.join("input");
    std::fs::write(&local, b"bytes").unwrap();
    let watch = OpenWatch::new(&run_dir);
    succeed(&started.0, &["put", local.to_str().unwrap(), "/file"]);
    assert_eq!(succeed(&started.0, &["cat", "/file"]), "bytes");
    let opened = watch.opened();
    assert!(opened.is_empty(), "clients opened {opened:?} in the run directory");
    drop(started);
    let _ = std::fs::remove_dir_all(scratch);
}

/// `ringfs stop` stops every server, so none tells the others it leaves: at the end of a job
/// of N servers those goodbyes were N² member lists of N members each, many over connections
/// opened just for them (and each server waited for the answers). A server stopped alone
/// (SIGTERM) still tells the others, so that they stop asking it at once.
#[test]
fn servers_stopped_together_say_no_goodbyes() {
    let (scratch, run_dir, started) = start_local("stop-goodbyes", 6);
    let log = |name: &str| std::fs::read_to_string(run_dir.join(format!("{name}.log"))).unwrap_or_default();
    signal_and_wait(recorded_pid(&run_dir, "server-5"), libc::SIGTERM);
    assert!(log("server-5").contains("(5 peers told)"), "a server stopped alone tells the others:\n{}", log("server-5"));
    // (The stop names server-5, stopped already, as a problem: the run directory is kept.)
    let _ = ringfs(&started.0, &["stop", "--keep"]);
    for index in 0..5 {
        let name = format!("server-{index}");
        let text = log(&name);
        assert!(text.contains("stopped with every other") && !text.contains("peers told"), "{name} said goodbye:\n{text}");
    }
    drop(started);
    let _ = std::fs::remove_dir_all(scratch);
}

/// A tool whose output is closed before it has written everything (`ringfs ls /d | head`,
/// `ringfs cat FILE | head -c 10`) stops quietly with status 141, as a Unix tool killed by
/// SIGPIPE does — not with a panic and its backtrace (`println!` on a closed pipe), nor an
/// error message.
#[test]
fn tools_whose_output_is_closed_early_stop_quietly() {
    use std::io::Read;
    let cluster = common::TestCluster::start(2);
    let client = cluster.client();
    client.mkdir("/many", 0o755).unwrap();
    for index in 0..3000 {
        client.close(client.create(&format!("/many/a-rather-long-name-for-a-listing-{index:05}"), 0o644).unwrap()).unwrap();
    }
    let fd = client.create("/big", 0o644).unwrap();
    client.pwrite(fd, &vec![7u8; 4 << 20], 0).unwrap();
    client.close(fd).unwrap();
    for args in [["ls", "/many"], ["cat", "/big"]] {
        let mut child = Command::new(ringfs_binary())
            .args(args)
            .env("RINGFS_SERVER", cluster.addresses().join(","))
            .env("RINGFS_SECRET", &cluster.secret)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run ringfs");
        let mut first = [0u8; 100];
        child.stdout.take().unwrap().read_exact(&mut first).unwrap();
        // (The pipe closes here: more than a pipe's 64 KiB is still to come.)
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(141), "ringfs {args:?}: {stderr}");
        assert!(stderr.is_empty(), "ringfs {args:?} said: {stderr}");
    }
}
