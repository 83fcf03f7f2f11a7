//! Starting and stopping the servers of one job.
//!
//! [`start`] launches `ringfs server` processes — on this machine by default (the embedded
//! local cluster), or one per host of a hostfile through ssh or another launcher — waits until
//! all have joined, and returns a [`Cluster`] with what clients need (addresses, secret,
//! chunk size). Everything [`stop`] needs is kept in a *run directory*: the secret, the
//! servers' addresses and process ids, and their logs.
//!
//! ```no_run
//! use ringfs_launch::{LaunchConfig, start};
//! let config = LaunchConfig::local(2, "/usr/local/bin/ringfs".into());
//! let cluster = start(&config).unwrap();
//! print!("{}", cluster.exports());
//! cluster.stop().unwrap();
//! ```

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ringfs_client::{Client, ClientConfig};
use ringfs_placement::{HashFunction, Scheme};
use thiserror::Error;

pub mod leftovers;
pub mod process;
pub mod slurm;

use process::{process_alive, signal, wait_for_exit, wait_for_exit_only};
use ringfs_config::env;

/// How long `start` waits for the servers, and `stop` for them to exit.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a cluster could not be started or stopped.
#[derive(Debug, Error)]
pub enum LaunchError {
    #[error("{0}")]
    Config(String),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("starting the cluster failed: {0}")]
    Startup(String),
    /// Stopping went wrong; each problem names the server or the step.
    #[error("stopping the cluster went wrong: {}{}", problems.join("; "), kept.as_ref().map(|dir| format!(" (run directory {} kept)", dir.display())).unwrap_or_default())]
    Stop { problems: Vec<String>, kept: Option<PathBuf> },
}

pub(crate) type Result<T> = std::result::Result<T, LaunchError>;

pub(crate) fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LaunchError {
    let what = what.into();
    move |source| LaunchError::Io { what, source }
}

/// What to start. [`LaunchConfig::local`] gives the defaults of `ringfs start`.
#[derive(Clone, Debug)]
pub struct LaunchConfig {
    /// Number of servers on this machine (ignored with a hostfile).
    pub servers: usize,
    /// `mem` or `dir:PATH` (each server uses PATH/<name>).
    pub store: String,
    /// Capacity per server, as `ringfs server --capacity` takes it ("0": unlimited).
    pub capacity: String,
    /// Chunk size clients of this cluster use for new files.
    pub chunk_size: u32,
    /// One server per line (first word: host name) instead of local servers.
    pub hostfile: Option<PathBuf>,
    /// Runs a shell command on a host: `<launcher> <host> <command>`.
    pub launcher: String,
    /// First TCP port on hosts of a hostfile (server i listens on port + i).
    pub port: u16,
    /// Address local servers listen on.
    pub listen_host: String,
    pub hash: HashFunction,
    pub placement: Scheme,
    /// Where to keep secret, addresses and logs (default: a new directory under
    /// $TMPDIR/ringfs-<uid>, or ~/.ringfs with a hostfile so every host can read it).
    pub run_dir: Option<PathBuf>,
    /// The `ringfs` executable the servers run.
    pub executable: PathBuf,
    /// Extra arguments for every `ringfs server`.
    pub server_args: Vec<String>,
    /// What the addresses of servers on other hosts start with: empty for TCP, `ucx://` when
    /// `server_args` make them serve over UCX (`--transport ucx`).
    pub address_prefix: String,
    /// Cache mode: the backend directory the cluster caches.
    pub cache: Option<LaunchCache>,
    /// Start one server on every node of this Slurm allocation (through `srun`) instead of
    /// local servers or a hostfile's; their port is `port`.
    pub slurm: Option<slurm::SlurmJob>,
}

/// Cache mode of a launched cluster: what `ringfs server --backend …` gets.
#[derive(Clone, Debug)]
pub struct LaunchCache {
    /// The backend directory (absolute; every server must see it at this path).
    pub backend: PathBuf,
    /// The ringfs directory it appears at.
    pub mount_path: String,
    /// `io-aware`, `immediate` or `none`.
    pub flush: String,
    /// Idle time before io-aware flushing, in milliseconds.
    pub flush_idle_ms: u64,
}

impl LaunchConfig {
    /// The arguments every server gets beyond its name and addresses.
    fn common_server_args(&self) -> Vec<String> {
        let mut args = self.server_args.clone();
        if let Some(cache) = &self.cache {
            args.extend([
                "--backend".to_string(),
                cache.backend.display().to_string(),
                "--mount-path".to_string(),
                cache.mount_path.clone(),
                "--backend-chunk-size".to_string(),
                self.chunk_size.to_string(),
                "--flush".to_string(),
                cache.flush.clone(),
                "--flush-idle-ms".to_string(),
                cache.flush_idle_ms.to_string(),
            ]);
        }
        args
    }
}

impl LaunchConfig {
    /// `servers` in-memory servers on this machine, listening on 127.0.0.1.
    pub fn local(servers: usize, executable: PathBuf) -> LaunchConfig {
        LaunchConfig {
            servers,
            store: "mem".into(),
            capacity: "0".into(),
            chunk_size: ringfs_client::DEFAULT_CHUNK_SIZE,
            hostfile: None,
            launcher: "ssh -o BatchMode=yes".into(),
            port: 7717,
            listen_host: "127.0.0.1".into(),
            hash: HashFunction::default(),
            placement: Scheme::default(),
            run_dir: None,
            executable,
            server_args: Vec::new(),
            address_prefix: String::new(),
            cache: None,
            slurm: None,
        }
    }
}

/// A launched server, as recorded in the run directory.
pub(crate) struct ServerRecord {
    name: String,
    address: String,
    /// Process id, for servers started on this machine.
    pid: Option<u32>,
}

pub(crate) fn random_hex(bytes: usize) -> String {
    let digits: String = (0..bytes.div_ceil(8)).map(|_| format!("{:016x}", ringfs_rpc::memory::random_u64())).collect();
    digits[..bytes * 2].to_string()
}

fn default_run_dir(shared: bool) -> PathBuf {
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

fn read_hostfile(path: &Path) -> Result<Vec<String>> {
    let text = fs::read_to_string(path).map_err(io_error(format!("cannot read hostfile {}", path.display())))?;
    let hosts: Vec<String> = text
        .lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter_map(|line| line.split_whitespace().next().map(String::from))
        .collect();
    if hosts.is_empty() {
        return Err(LaunchError::Config(format!("hostfile {} names no host", path.display())));
    }
    Ok(hosts)
}

/// The `--store` argument of one server: a `dir` store gets a subdirectory per server.
pub fn store_for(store: &str, name: &str) -> Result<String> {
    match store.split_once(':') {
        None if store == "mem" => Ok("mem".into()),
        Some(("dir", path)) if !path.is_empty() => Ok(format!("dir:{}", Path::new(path).join(name).display())),
        _ => Err(LaunchError::Config(format!("invalid store {store:?}: expected mem or dir:PATH"))),
    }
}

fn wait_for_file(path: &Path, deadline: Instant) -> Result<String> {
    loop {
        if let Ok(text) = fs::read_to_string(path)
            && !text.trim().is_empty()
        {
            return Ok(text.trim().to_string());
        }
        if Instant::now() > deadline {
            return Err(LaunchError::Startup(format!("timed out waiting for {}", path.display())));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn log_tail(run_dir: &Path, name: &str) -> String {
    let text = fs::read_to_string(run_dir.join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// Launches one server on this machine as a detached process.
fn spawn_local(config: &LaunchConfig, run_dir: &Path, name: &str, join: Option<&str>) -> Result<(u32, PathBuf)> {
    let address_file = run_dir.join(format!("{name}.addr"));
    let log_path = run_dir.join(format!("{name}.log"));
    let log = fs::File::create(&log_path).map_err(io_error(format!("cannot create {}", log_path.display())))?;
    let log_copy = log.try_clone().map_err(io_error("cannot duplicate a file handle"))?;
    let mut command = Command::new(&config.executable);
    command
        .arg("server")
        .args(["--name", name])
        .args(["--listen", &format!("{}:0", config.listen_host)])
        .arg("--unix-socket")
        .arg(run_dir.join(format!("{name}.sock")))
        .args(["--store", &store_for(&config.store, name)?])
        .args(["--capacity", &config.capacity])
        .args(["--hash", &config.hash.to_string()])
        .args(["--placement", &config.placement.to_string()])
        .arg("--run-dir")
        .arg(run_dir)
        .args(config.common_server_args())
        .stdin(Stdio::null())
        .stdout(log_copy)
        .stderr(log)
        .env_remove(env::SECRET);
    if let Some(join) = join {
        command.args(["--join", join]);
    }
    // SAFETY: setsid is async-signal-safe; it detaches the server from the terminal session so
    // that a Ctrl-C aimed at the launching command does not reach it.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = command.spawn().map_err(io_error(format!("cannot run {}", config.executable.display())))?;
    Ok((child.id(), address_file))
}

/// Launches one server on `host` through the launcher.
fn spawn_remote(config: &LaunchConfig, run_dir: &Path, host: &str, name: &str, port: u16, join: Option<&str>) -> Result<()> {
    let mut command = format!(
        "{exe} server --name {name} --listen 0.0.0.0:{port} --advertise {host}:{port} --unix-socket /tmp/ringfs-{id}-{name}.sock \
         --store {store} --capacity {capacity} --hash {hash} --placement {placement} --run-dir {run_dir} {extra}",
        exe = config.executable.display(),
        id = run_dir.file_name().and_then(|name| name.to_str()).unwrap_or("job"),
        store = store_for(&config.store, name)?,
        capacity = config.capacity,
        hash = config.hash,
        placement = config.placement,
        run_dir = run_dir.display(),
        extra = config.common_server_args().join(" "),
    );
    if let Some(join) = join {
        command.push_str(&format!(" --join {join}"));
    }
    command.push_str(&format!(" >{}/{name}.log 2>&1 </dev/null &", run_dir.display()));
    let mut words = config.launcher.split_whitespace();
    let program = words.next().ok_or_else(|| LaunchError::Config("the launcher command is empty".into()))?;
    let status = Command::new(program)
        .args(words)
        .arg(host)
        .arg(&command)
        .stdin(Stdio::null())
        .status()
        .map_err(io_error(format!("cannot run {program}")))?;
    if !status.success() {
        return Err(LaunchError::Startup(format!("launching the server on {host} failed ({status})")));
    }
    Ok(())
}

/// Polls the cluster until `expected` servers are alive (or a Slurm step launching them
/// ended).
fn wait_for_members(run_dir: &Path, first_address: &str, secret: &str, expected: usize, deadline: Instant) -> Result<()> {
    let mut last_error = String::from("no answer yet");
    while Instant::now() < deadline {
        if let Some(failure) = slurm::step_failure(run_dir) {
            return Err(LaunchError::Startup(failure));
        }
        match Client::connect(ClientConfig::new(vec![first_address.to_string()], secret.as_bytes().to_vec())) {
            Ok(client) => {
                let alive = client.members().members.iter().filter(|member| member.alive).count();
                if alive >= expected {
                    return Ok(());
                }
                last_error = format!("{alive} of {expected} servers joined");
            }
            Err(error) => last_error = error.to_string(),
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    Err(LaunchError::Startup(format!("the servers did not come up within {STARTUP_TIMEOUT:?}: {last_error}")))
}

fn write_records(run_dir: &Path, records: &[ServerRecord]) -> Result<()> {
    let text: String = records
        .iter()
        .map(|record| format!("{} {} {}\n", record.name, record.address, record.pid.map(|pid| pid.to_string()).unwrap_or("-".into())))
        .collect();
    write_private(&run_dir.join("servers"), &text)
}

fn read_records(run_dir: &Path) -> Result<Vec<ServerRecord>> {
    let text = fs::read_to_string(run_dir.join("servers")).map_err(io_error(format!("{} holds no ringfs cluster", run_dir.display())))?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            Some(ServerRecord { name: words.next()?.to_string(), address: words.next()?.to_string(), pid: words.next()?.parse().ok() })
        })
        .collect())
}

/// A started cluster: what clients need to use it.
#[derive(Clone, Debug)]
pub struct Cluster {
    pub run_dir: PathBuf,
    /// TCP addresses of the servers.
    pub servers: Vec<String>,
    pub secret: String,
    pub chunk_size: u32,
}

impl Cluster {
    /// The `export` lines `ringfs start` prints.
    pub fn exports(&self) -> String {
        self.environment().iter().map(|(name, value)| format!("export {name}={value}\n")).collect()
    }

    /// The client variables, as (name, value) pairs.
    pub fn environment(&self) -> Vec<(&'static str, String)> {
        vec![
            (env::SERVER, self.servers.join(",")),
            (env::SECRET, self.secret.clone()),
            (env::RUN_DIR, self.run_dir.display().to_string()),
            (env::CHUNK_SIZE, self.chunk_size.to_string()),
        ]
    }

    /// A client configuration for this cluster.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new(self.servers.clone(), self.secret.as_bytes().to_vec());
        config.chunk_size = self.chunk_size;
        config
    }

    /// Stops the servers (unmounting mounts first) and removes the run directory.
    pub fn stop(&self) -> Result<()> {
        stop(&self.run_dir, StopOptions::default())
    }

    /// Mounts the file system at `directory` with `ringfs mount` (extra options in
    /// `mount_args`), as a process of its own that `stop` ends before the servers.
    pub fn mount(&self, executable: &Path, directory: &Path, mount_args: &[String]) -> Result<()> {
        let index = fs::read_to_string(self.run_dir.join("mounts")).map(|text| text.lines().count()).unwrap_or(0);
        let ready = self.run_dir.join(format!("mount-{index}.ready"));
        let log_path = self.run_dir.join(format!("mount-{index}.log"));
        let log = fs::File::create(&log_path).map_err(io_error(format!("cannot create {}", log_path.display())))?;
        let log_copy = log.try_clone().map_err(io_error("cannot duplicate a file handle"))?;
        let mut command = Command::new(executable);
        command
            .arg("mount")
            .arg(directory)
            .arg("--ready-file")
            .arg(&ready)
            .args(mount_args)
            .envs(self.environment())
            .stdin(Stdio::null())
            .stdout(log_copy)
            .stderr(log);
        // SAFETY: setsid is async-signal-safe (see spawn_local).
        unsafe {
            command.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(io_error(format!("cannot run {}", executable.display())))?;
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        while !ready.exists() {
            if let Ok(Some(status)) = child.try_wait() {
                let log = fs::read_to_string(&log_path).unwrap_or_default();
                return Err(LaunchError::Startup(format!("mounting {} failed ({status}): {}", directory.display(), log.trim())));
            }
            if Instant::now() > deadline {
                signal(child.id(), libc::SIGKILL);
                return Err(LaunchError::Startup(format!("mounting {} timed out", directory.display())));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut records = fs::read_to_string(self.run_dir.join("mounts")).unwrap_or_default();
        records.push_str(&format!("{} {}\n", child.id(), directory.display()));
        write_private(&self.run_dir.join("mounts"), &records)
    }
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

/// Starts a cluster and waits until every server has joined.
pub fn start(config: &LaunchConfig) -> Result<Cluster> {
    let hosts = config.hostfile.as_deref().map(read_hostfile).transpose()?;
    if hosts.is_none() && config.slurm.is_none() && config.servers == 0 {
        return Err(LaunchError::Config("a cluster needs at least one server".into()));
    }
    store_for(&config.store, "check")?;
    let run_dir = match (&config.run_dir, &config.slurm) {
        (Some(run_dir), _) => run_dir.clone(),
        (None, Some(job)) => slurm::default_run_dir(job, &leftovers::user_base(&std::env::temp_dir())),
        (None, None) => default_run_dir(hosts.is_some()),
    };
    fs::DirBuilder::new().recursive(true).mode(0o700).create(&run_dir).map_err(io_error(format!("cannot create {}", run_dir.display())))?;
    let secret = random_hex(32);
    write_private(&run_dir.join("secret"), &secret)?;

    let deadline = Instant::now() + STARTUP_TIMEOUT;
    let mut records: Vec<ServerRecord> = Vec::new();
    let launched = launch_all(config, &run_dir, hosts.as_deref(), &secret, deadline, &mut records)
        .and_then(|()| wait_for_members(&run_dir, &records[0].address, &secret, records.len(), deadline));
    if let Err(error) = launched {
        let pids: Vec<u32> = records.iter().filter_map(|record| record.pid).collect();
        for pid in &pids {
            signal(*pid, libc::SIGTERM);
        }
        wait_for_exit(&pids, Duration::from_secs(5));
        // The agents end their servers and clean their nodes on the SIGTERM srun passes on.
        process::terminate(&slurm::running_step(&run_dir), Duration::from_secs(20));
        let logs: String = records
            .iter()
            .filter(|record| record.pid.is_some())
            .map(|record| format!("\n--- {} log:\n{}", record.name, log_tail(&run_dir, &record.name)))
            .collect();
        let _ = fs::remove_dir_all(&run_dir);
        return Err(LaunchError::Startup(format!("{error}{logs}")));
    }
    write_records(&run_dir, &records)?;
    let cluster =
        Cluster { run_dir, servers: records.iter().map(|record| record.address.clone()).collect(), secret, chunk_size: config.chunk_size };
    if let Some(cache) = &config.cache
        && let Err(error) = show_mount_path(&cluster, &cache.mount_path)
    {
        let _ = cluster.stop();
        return Err(error);
    }
    Ok(cluster)
}

/// Cache mode: makes the directories above the mount path, and the mount path itself (the
/// backend directory) visible in their parents' listings.
fn show_mount_path(cluster: &Cluster, mount_path: &str) -> Result<()> {
    let failed = |what: &str, errno: ringfs_client::Errno| LaunchError::Startup(format!("{what} {mount_path}: {errno}"));
    let client = Client::connect(cluster.client_config()).map_err(|error| LaunchError::Startup(error.to_string()))?;
    let mut prefix = String::new();
    let components: Vec<&str> = mount_path.split('/').filter(|component| !component.is_empty()).collect();
    for component in components.iter().take(components.len().saturating_sub(1)) {
        prefix = format!("{prefix}/{component}");
        match client.mkdir(&prefix, 0o755) {
            Ok(()) | Err(ringfs_client::Errno::EEXIST) => {}
            Err(errno) => return Err(failed("cannot make the directories above", errno)),
        }
    }
    client.stat(mount_path).map(drop).map_err(|errno| failed("cannot show the backend at", errno))
}

fn launch_all(
    config: &LaunchConfig,
    run_dir: &Path,
    hosts: Option<&[String]>,
    secret: &str,
    deadline: Instant,
    records: &mut Vec<ServerRecord>,
) -> Result<()> {
    if let Some(job) = &config.slurm {
        records.extend(slurm::start_step(config, job, run_dir, secret)?);
        return Ok(());
    }
    match hosts {
        None => {
            let (pid, address_file) = spawn_local(config, run_dir, "server-0", None)?;
            records.push(ServerRecord { name: "server-0".into(), address: String::new(), pid: Some(pid) });
            records[0].address = wait_for_file(&address_file, deadline)?;
            let first = records[0].address.clone();
            let mut pending = Vec::new();
            for index in 1..config.servers {
                let name = format!("server-{index}");
                let (pid, address_file) = spawn_local(config, run_dir, &name, Some(&first))?;
                records.push(ServerRecord { name, address: String::new(), pid: Some(pid) });
                pending.push((records.len() - 1, address_file));
            }
            for (position, address_file) in pending {
                records[position].address = wait_for_file(&address_file, deadline)?;
            }
        }
        Some(hosts) => {
            for (index, host) in hosts.iter().enumerate() {
                let name = format!("{host}-{index}");
                let port = config.port.checked_add(index as u16).ok_or_else(|| LaunchError::Config("the port range overflows".into()))?;
                let first = records.first().map(|record| record.address.clone());
                spawn_remote(config, run_dir, host, &name, port, first.as_deref())?;
                records.push(ServerRecord { name, address: format!("{}{host}:{port}", config.address_prefix), pid: None });
                if index == 0 {
                    wait_for_members(run_dir, &records[0].address, secret, 1, deadline)?;
                }
            }
        }
    }
    Ok(())
}

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
