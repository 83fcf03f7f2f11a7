//! `TestCluster`: real `ringfs server` processes on loopback for end-to-end tests.
//!
//! Every server listens on a free port of 127.0.0.1 and on a Unix socket in a private
//! directory. Dropping the cluster kills the servers it started (by pid) and removes the
//! directory, also when the test panics.

#![allow(dead_code)]

pub mod mpi;
pub mod netns;
pub mod relay;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ringfs_client::{Client, ClientConfig, Errno, OpenFlags};

/// The `ringfs` binary under test.
pub fn ringfs_binary() -> &'static str {
    env!("CARGO_BIN_EXE_ringfs")
}

/// A fresh private directory under the system temp directory, removed when the test ends,
/// passed or failed (a failed test's is kept, and named, with `RINGFS_TEST_KEEP=1`).
pub fn scratch_dir(tag: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("ringfs-e2e-{tag}-{}-{:x}", std::process::id(), ringfs_rpc::memory::random_u64()));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    Scratch(dir)
}

/// A test's scratch directory (see [`scratch_dir`]); a path everywhere one is taken.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    /// The directory, no longer removed when this is dropped (its new owner removes it).
    pub fn keep(self) -> PathBuf {
        let dir = self.0.clone();
        std::mem::forget(self);
        dir
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() && std::env::var_os("RINGFS_TEST_KEEP").is_some() {
            eprintln!("the failed test's scratch directory is kept: {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// True when test clusters run over UCX (`RINGFS_TEST_TRANSPORT=ucx`, with the transports
/// `UCX_TLS` names): their servers get `--transport ucx` and no Unix socket, so that every
/// connection of the test's clients and between the servers is a UCX one. Otherwise TCP (and
/// Unix sockets on this host).
pub fn over_ucx() -> bool {
    std::env::var("RINGFS_TEST_TRANSPORT").as_deref() == Ok("ucx")
}

/// Options of a test cluster.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub servers: usize,
    /// `true`: each server keeps chunks in a `dir` store under the cluster directory.
    pub dir_store: bool,
    /// Per-server capacity (e.g. "2M"), if limited.
    pub capacity: Option<String>,
    /// `true`: when the tests run as root, the servers run as [`UNPRIVILEGED`] instead (as on
    /// a cluster, where servers run as the user), owning the cluster directory.
    pub unprivileged: bool,
    pub extra_args: Vec<String>,
    /// Network namespaces the servers run in, one per server ([`netns::Network`]); empty:
    /// all on loopback. Servers in namespaces have no Unix socket.
    pub hosts: Vec<netns::NetHost>,
}

impl ClusterOptions {
    pub fn new(servers: usize) -> ClusterOptions {
        ClusterOptions { servers, dir_store: false, capacity: None, unprivileged: false, extra_args: Vec::new(), hosts: Vec::new() }
    }
}

/// Whether every thread of process `pid` is stopped (state `T` in `/proc`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.filter_map(Result::ok).all(|task| {
        // The state follows the command name, which is in parentheses.
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
    })
}

/// The user and group id unprivileged servers run as (`nobody`).
pub const UNPRIVILEGED: u32 = 65534;

/// Whether this process runs as root.
pub fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Hands `path` (and what is in it) to the [`UNPRIVILEGED`] user, when running as root.
pub fn give_to_unprivileged(path: &Path) {
    if !running_as_root() {
        return;
    }
    std::os::unix::fs::chown(path, Some(UNPRIVILEGED), Some(UNPRIVILEGED)).unwrap();
    if path.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            give_to_unprivileged(&entry.unwrap().path());
        }
    }
}

struct ServerProcess {
    name: String,
    child: Option<Child>,
    address: String,
}

pub struct TestCluster {
    pub dir: PathBuf,
    pub secret: String,
    options: ClusterOptions,
    servers: Vec<ServerProcess>,
}

/// The first `first` and the last `last` lines of `text` (`...` between them when some are
/// left out).
fn excerpt(text: &str, first: usize, last: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= first + last {
        return lines.join("\n");
    }
    [&lines[..first], &["..."][..], &lines[lines.len() - last..]].concat().join("\n")
}

impl TestCluster {
    pub fn start(servers: usize) -> TestCluster {
        TestCluster::with_options(ClusterOptions::new(servers))
    }

    pub fn with_options(options: ClusterOptions) -> TestCluster {
        let dir = scratch_dir("cluster");
        let secret = format!("{:016x}", ringfs_rpc::memory::random_u64());
        std::fs::write(dir.join("secret"), &secret).unwrap();
        if options.unprivileged {
            give_to_unprivileged(&dir);
        }
        // The cluster removes (or keeps) its directory itself, once its servers are stopped.
        let mut cluster = TestCluster { dir: dir.keep(), secret, options: options.clone(), servers: Vec::new() };
        for index in 0..options.servers {
            let name = format!("server-{index}");
            let join = cluster.servers.first().map(|first| first.address.clone());
            let (child, address) = cluster.spawn(&name, join.as_deref());
            cluster.servers.push(ServerProcess { name, child: Some(child), address });
        }
        cluster.wait_for_alive(options.servers);
        cluster
    }

    fn spawn(&self, name: &str, join: Option<&str>) -> (Child, String) {
        let address_file = self.dir.join(format!("{name}.addr"));
        let _ = std::fs::remove_file(&address_file);
        // Appended to: a restarted server's log follows its earlier life's (what a failing
        // test after a kill needs to see).
        let log_path = self.dir.join(format!("{name}.log"));
        let mut log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).unwrap();
        if log.metadata().is_ok_and(|metadata| metadata.len() > 0) {
            use std::io::Write;
            let _ = writeln!(log, "=== {name} started again");
        }
        let index: usize = name.rsplit('-').next().and_then(|index| index.parse().ok()).expect("servers are named server-N");
        let mut command = match self.options.hosts.get(index) {
            None => {
                let mut command = Command::new(ringfs_binary());
                command
                    .arg("server")
                    .args(["--name", name, "--listen", "127.0.0.1:0"])
                    .arg("--unix-socket")
                    .arg(self.dir.join(format!("{name}.sock")));
                command
            }
            Some(host) => {
                // `ip netns exec` enters the namespace and executes the server in place.
                let mut command = Command::new("ip");
                command.args(["netns", "exec", &host.netns, ringfs_binary(), "server", "--name", name]);
                command.args(["--listen", &format!("{}:0", host.ip), "--no-unix-socket"]);
                command
            }
        };
        if over_ucx() {
            command.args(["--transport", "ucx", "--no-unix-socket"]);
        }
        command
            .arg("--secret-file")
            .arg(self.dir.join("secret"))
            .arg("--address-file")
            .arg(&address_file)
            .args(["--heartbeat-ms", "200", "--failure-timeout-ms", "1000"])
            .args(&self.options.extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .env("RINGFS_LOG", std::env::var("RINGFS_TEST_SERVER_LOG").unwrap_or_else(|_| "info".into()))
            // What a server puts in its temporary directory (the global memory's spill files)
            // goes with the cluster's directory: the harness kills servers, which then
            // remove nothing themselves.
            .env("TMPDIR", self.server_tmp());
        if self.options.dir_store {
            command.args(["--store", &format!("dir:{}", self.dir.join(format!("{name}.store")).display())]);
        }
        if let Some(capacity) = &self.options.capacity {
            command.args(["--capacity", capacity]);
        }
        if let Some(join) = join {
            command.args(["--join", join]);
        }
        if self.options.unprivileged && running_as_root() {
            use std::os::unix::process::CommandExt;
            // (std drops the supplementary groups when root sets the uid.)
            command.uid(UNPRIVILEGED).gid(UNPRIVILEGED);
        }
        let mut child = command.spawn().expect("start ringfs server");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(address) = std::fs::read_to_string(&address_file)
                && !address.is_empty()
            {
                return (child, address);
            }
            let exited = child.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() >= deadline {
                // Not left behind, and its log says why (a rare slow start over UCX's tcp
                // was not diagnosable without it).
                let _ = child.kill();
                let _ = child.wait();
                let log = std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
                let others: Vec<String> = (0..self.servers.len()).map(|index| self.log_tail(index, 80)).collect();
                panic!(
                    "server {name} did not write {} ({}); the first and last lines of its log:\n{}\n{}",
                    address_file.display(),
                    exited.map_or("still running after 20 s".to_string(), |status| format!("it exited: {status}")),
                    excerpt(&log, 20, 20),
                    others.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The servers' temporary directory (`TMPDIR`), inside the cluster's directory.
    pub fn server_tmp(&self) -> PathBuf {
        let tmp = self.dir.join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        if self.options.unprivileged {
            give_to_unprivileged(&tmp);
        }
        tmp
    }

    /// Waits until a fresh client sees `count` alive servers.
    pub fn wait_for_alive(&self, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            // Every server must know every other: one whose view lacks the last to join would
            // place names differently from the clients (seen over UCX under load as a name just
            // made read as missing).
            if let Ok(client) = Client::connect(self.client_config())
                && client.members().members.iter().filter(|member| member.alive).count() == count
                && client.all_servers_see(count)
            {
                return;
            }
            assert!(Instant::now() < deadline, "cluster did not reach {count} alive servers");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Addresses of the servers that are running.
    pub fn addresses(&self) -> Vec<String> {
        self.servers.iter().filter(|server| server.child.is_some()).map(|server| server.address.clone()).collect()
    }

    pub fn address(&self, index: usize) -> &str {
        &self.servers[index].address
    }

    pub fn name(&self, index: usize) -> &str {
        &self.servers[index].name
    }

    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new(self.addresses(), self.secret.as_bytes().to_vec());
        config.timeout = Duration::from_secs(5);
        config
    }

    pub fn client(&self) -> Client {
        Client::connect(self.client_config()).expect("connect to test cluster")
    }

    /// A client that uses TCP only (no Unix sockets, no cross-memory attach).
    pub fn tcp_client(&self) -> Client {
        let mut config = self.client_config();
        config.local_fast_path = false;
        Client::connect(config).expect("connect to test cluster")
    }

    pub fn pid(&self, index: usize) -> u32 {
        self.servers[index].child.as_ref().expect("server is running").id()
    }

    /// Kills server `index` with SIGKILL.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.servers[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops server `index` with SIGTERM and waits for it to exit.
    pub fn stop(&mut self, index: usize) {
        if let Some(mut child) = self.servers[index].child.take() {
            // SAFETY: signalling a child process this harness started.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let _ = child.wait();
        }
    }

    /// Sends a signal (e.g. SIGSTOP, SIGCONT) to server `index`.
    pub fn signal(&self, index: usize, signal: i32) {
        let pid = self.pid(index);
        // SAFETY: signalling a child process this harness started.
        unsafe { libc::kill(pid as libc::pid_t, signal) };
        if signal == libc::SIGSTOP {
            // Delivery is asynchronous: a thread busy on another core can still answer a
            // request. Wait until every thread is stopped.
            let deadline = Instant::now() + Duration::from_secs(5);
            while !all_threads_stopped(pid) {
                assert!(Instant::now() < deadline, "server {index} did not stop");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Restarts a stopped server under the same name (and store), joining a running one.
    pub fn restart(&mut self, index: usize) {
        assert!(self.servers[index].child.is_none(), "stop the server first");
        let join = self.servers.iter().find(|server| server.child.is_some()).map(|server| server.address.clone());
        let name = self.servers[index].name.clone();
        let (child, address) = self.spawn(&name, join.as_deref());
        self.servers[index].child = Some(child);
        self.servers[index].address = address;
    }

    /// Sets `--name value` in the arguments servers start with (for later restarts).
    pub fn set_extra_arg(&mut self, name: &str, value: &str) {
        let args = &mut self.options.extra_args;
        match args.iter().position(|arg| arg == name) {
            Some(at) => args[at + 1] = value.to_string(),
            None => args.extend([name.to_string(), value.to_string()]),
        }
    }

    /// Adds a new server that joins the cluster.
    pub fn add_server(&mut self) -> usize {
        let name = format!("server-{}", self.servers.len());
        let join = self.servers.iter().find(|server| server.child.is_some()).map(|server| server.address.clone());
        let (child, address) = self.spawn(&name, join.as_deref());
        self.servers.push(ServerProcess { name, child: Some(child), address });
        self.servers.len() - 1
    }

    /// The last `count` lines of server `index`'s log, headed by its name (failure messages).
    fn log_tail(&self, index: usize, count: usize) -> String {
        format!("--- {} (last {count} lines)\n{}", self.servers[index].name, excerpt(&self.log(index), 0, count))
    }

    /// The server log, for failure messages.
    pub fn log(&self, index: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("{}.log", self.servers[index].name))).unwrap_or_default()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for server in &mut self.servers {
            if let Some(mut child) = server.child.take() {
                // SAFETY: a child process this harness started; SIGCONT first in case a test
                // left it stopped.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGCONT) };
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking() && std::env::var_os("RINGFS_TEST_LOGS").is_some() {
            // A failed test's server logs, for whoever replays it (they go with the directory).
            for server in 0..self.servers.len() {
                eprintln!("{}", self.log_tail(server, 40));
            }
        }
        if std::thread::panicking() && std::env::var_os("RINGFS_TEST_KEEP").is_some() {
            eprintln!("the failed test's cluster directory (server logs) is kept: {}", self.dir.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A small deterministic random generator (xorshift64*), so failures can be replayed.
pub struct Random(u64);

impl Random {
    pub fn new(seed: u64) -> Random {
        Random(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }

    pub fn fill(&mut self, bytes: &mut [u8]) {
        for chunk in bytes.chunks_mut(8) {
            let word = self.next().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

/// True if this process may use FUSE. When it may not, FUSE tests skip with a message — unless
/// `RINGFS_REQUIRE_FUSE=1` (set by test.sh where /dev/fuse exists), which makes them fail.
pub fn fuse_available() -> bool {
    let available = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").is_ok();
    if !available {
        assert!(std::env::var("RINGFS_REQUIRE_FUSE").as_deref() != Ok("1"), "/dev/fuse cannot be opened but RINGFS_REQUIRE_FUSE=1");
        eprintln!("SKIPPED: /dev/fuse cannot be opened here; FUSE tests need it");
    }
    available
}

/// `RINGFS_FUSE_IO_URING=1` (the FUSE tests' second pass, `scripts/fuse-uring-tests.sh`):
/// every mount takes the kernel's requests from its io_uring queues, and checks at its
/// unmount that it did.
pub fn fuse_io_uring() -> bool {
    std::env::var("RINGFS_FUSE_IO_URING").as_deref() == Ok("1")
}

/// A `ringfs mount` process; unmounts (SIGTERM, then a lazy unmount) when dropped.
pub struct Mount {
    pub dir: PathBuf,
    child: Option<Child>,
}

impl TestCluster {
    /// Mounts the cluster at a fresh directory with `ringfs mount` and extra `args`.
    pub fn mount(&self, args: &[&str]) -> Mount {
        let dir = self.dir.join(format!("mnt-{:x}", ringfs_rpc::memory::random_u64()));
        std::fs::create_dir_all(&dir).unwrap();
        let ready = dir.with_extension("ready");
        let log = std::fs::File::create(dir.with_extension("log")).unwrap();
        let child = Command::new(ringfs_binary())
            .arg("mount")
            .arg(&dir)
            .arg("--ready-file")
            .arg(&ready)
            .args(args)
            .env("RINGFS_SERVER", self.addresses().join(","))
            .env("RINGFS_SECRET", &self.secret)
            .env("RINGFS_TIMEOUT_MS", "3000")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start ringfs mount");
        let mut mount = Mount { dir, child: Some(child) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready.exists() {
            if let Some(status) = mount.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("ringfs mount exited ({status}): {}", std::fs::read_to_string(mount.dir.with_extension("log")).unwrap_or_default());
            }
            assert!(Instant::now() < deadline, "mount did not become ready");
            std::thread::sleep(Duration::from_millis(10));
        }
        mount
    }
}

impl Mount {
    /// Path of `relative` inside the mount.
    pub fn path(&self, relative: &str) -> PathBuf {
        self.dir.join(relative.trim_start_matches('/'))
    }

    /// What the mount process logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.with_extension("log")).unwrap_or_default()
    }

    /// Unmounts and returns the mount process's exit status.
    pub fn unmount(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        // SAFETY: signalling the mount process this harness started.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                if self.still_mounted() {
                    // (The mount's own unmount failed, EBUSY: a process still waits in it.)
                    let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
                }
                if fuse_io_uring() && !std::thread::panicking() {
                    self.assert_the_rings_served();
                }
                return Some(status);
            }
            if Instant::now() > deadline {
                // A mount wedged in the kernel (its threads waiting on requests that only
                // it could answer) ends only when its connection is aborted.
                self.abort_connection();
                let _ = child.kill();
                let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
                return child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Mount {
    fn still_mounted(&self) -> bool {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let dir = self.dir.display().to_string();
        mounts.lines().any(|line| line.split(' ').nth(4) == Some(dir.as_str()))
    }

    /// Aborts the mount's FUSE connection (`/sys/fs/fuse/connections/N/abort`, N the minor
    /// number of the mount's device): every request waiting in it fails with ENOTCONN.
    fn abort_connection(&self) {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let dir = self.dir.display().to_string();
        let Some(line) = mounts.lines().find(|line| line.split(' ').nth(4) == Some(dir.as_str())) else { return };
        let Some(connection) = line.split(' ').nth(2).and_then(|device| device.split(':').nth(1)) else { return };
        let connections = Path::new("/sys/fs/fuse/connections");
        if !connections.join(connection).exists() {
            let _ = Command::new("mount").args(["-t", "fusectl", "none"]).arg(connections).status();
        }
        eprintln!("aborting the FUSE connection {connection} of the wedged mount {dir}");
        let _ = std::fs::write(connections.join(connection).join("abort"), "1");
    }

    /// Asserts (from the mount's log) that requests came through the io_uring queues.
    fn assert_the_rings_served(&self) {
        let log = self.log();
        let answered = log
            .lines()
            .find_map(|line| line.split(" requests were answered through io_uring queues").next().filter(|head| head.len() < line.len()))
            .and_then(|head| head.rsplit(' ').next()?.parse::<u64>().ok());
        assert!(answered.is_some_and(|count| count > 0), "RINGFS_FUSE_IO_URING=1 but the mount's io_uring queues answered nothing:\n{log}");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// Creates `path` holding `bytes` (panics on failure).
pub fn write_file(client: &Client, path: &str, bytes: &[u8]) {
    let fd = client.create(path, 0o644).unwrap();
    assert_eq!(client.pwrite(fd, bytes, 0).unwrap(), bytes.len());
    client.close(fd).unwrap();
}

/// The whole contents of `path` (its size from a stat, then one read).
pub fn read_file(client: &Client, path: &str) -> Result<Vec<u8>, Errno> {
    let size = client.stat(path)?.size as usize;
    let fd = client.open(path, OpenFlags::READ, 0)?;
    let mut bytes = vec![0u8; size];
    let count = client.pread(fd, &mut bytes, 0);
    client.close(fd)?;
    bytes.truncate(count?);
    Ok(bytes)
}

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The build directory of the binary under test (target/debug or target/release), with
/// libringfs.so built in it (`cargo test` does not build C libraries by itself), and the
/// profile's name.
pub fn library_dir() -> (PathBuf, String) {
    let dir = Path::new(ringfs_binary()).parent().unwrap().to_path_buf();
    let profile = dir.file_name().unwrap().to_str().unwrap().to_string();
    if !dir.join("libringfs.so").exists() {
        let mut build = Command::new(env!("CARGO"));
        build.current_dir(workspace_root()).args(["build", "--quiet", "-p", "ringfs-ffi"]);
        if profile == "release" {
            build.arg("--release");
        }
        assert!(build.status().unwrap().success(), "building libringfs failed");
    }
    (dir, profile)
}

/// The preload library of the build under test (beside the ringfs binary), brought up to
/// date: `cargo test` builds only the test's own package, and a stale library would test
/// old code. Built once per test process.
#[allow(dead_code)]
pub fn preload_library() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let dir = Path::new(ringfs_binary()).parent().unwrap().to_path_buf();
    BUILT.call_once(|| {
        let mut build = Command::new(env!("CARGO"));
        build.current_dir(workspace_root()).args(["build", "--quiet", "-p", "ringfs-preload"]);
        if dir.file_name().is_some_and(|profile| profile == "release") {
            build.arg("--release");
        }
        assert!(build.status().unwrap().success(), "building libringfs_preload failed");
    });
    dir.join("libringfs_preload.so")
}

/// Runs `step` — one operation of a client's workload, answering whether it failed — again
/// and again on a new client while server `victim` is killed (SIGKILL) 20–150 ms after the
/// start and restarted, until a moment after the cluster is whole again (bounded in count
/// too). How many steps failed. `killer` draws the moments and the worker's seed.
pub fn kill_while_a_client_works(
    cluster: &mut TestCluster,
    killer: &mut Random,
    victim: usize,
    step: impl Fn(&Client, &mut Random) -> bool + Sync,
) -> usize {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = AtomicBool::new(false);
    let config = cluster.client_config();
    let worker_seed = killer.next();
    std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            let client = Client::connect(config).unwrap();
            let mut random = Random::new(worker_seed);
            let mut failed = 0;
            for _ in 0..100_000 {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                failed += usize::from(step(&client, &mut random));
            }
            failed
        });
        std::thread::sleep(Duration::from_millis(20 + killer.below(130)));
        cluster.kill(victim);
        cluster.restart(victim);
        let servers = cluster.servers.len();
        cluster.wait_for_alive(servers);
        std::thread::sleep(Duration::from_millis(killer.below(50)));
        stop.store(true, Ordering::Release);
        worker.join().unwrap()
    })
}
