//! `ringfs start`, `ringfs stop` and `ringfs status`: a cluster for one job.
//!
//! `start` launches the servers (on this machine by default, or one per host of a hostfile
//! through ssh or another launcher), waits until all have joined, and prints the `export`
//! lines a client needs. It keeps what `stop` needs in a *run directory*: the secret, the
//! servers' addresses and process ids, and their logs.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use ringfs_client::{Client, ClientConfig};
use ringfs_placement::{HashFunction, Scheme};

use crate::server_command::{parse_bytes, parse_store};

/// How long `start` waits for the servers, and `stop` for them to exit.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Args, Debug, Clone)]
pub struct StartArgs {
    /// Number of servers on this machine (ignored with --hostfile).
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
    /// Chunk store of every server: `mem` or `dir:PATH` (each server uses PATH/<name>).
    #[arg(long, default_value = "mem")]
    pub store: String,
    /// Capacity per server (e.g. 16G); 0: unlimited.
    #[arg(long, default_value = "0")]
    pub capacity: String,
    /// Chunk size of files created by clients of this cluster (e.g. 64K, 1M).
    #[arg(long, default_value = "1M")]
    pub chunk_size: String,
    /// Start one server per line of this file (first word: host name) instead of local ones.
    #[arg(long)]
    pub hostfile: Option<PathBuf>,
    /// Command that runs a shell command on a host: `<launcher> <host> <command>`.
    #[arg(long, default_value = "ssh -o BatchMode=yes")]
    pub launcher: String,
    /// First TCP port used on hosts of a hostfile (server i listens on port + i).
    #[arg(long, default_value_t = 7717)]
    pub port: u16,
    /// Address local servers listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub listen_host: String,
    /// Hash of paths: koyama or murmur3.
    #[arg(long, default_value = "koyama")]
    pub hash: HashFunction,
    /// Placement: modular or consistent[:N].
    #[arg(long, default_value = "modular")]
    pub placement: Scheme,
    /// Where to keep secret, addresses and logs (default: a new directory under
    /// $TMPDIR/ringfs-<uid>, or under ~/.ringfs with --hostfile so every host can read it).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
}

/// A launched server, as recorded in the run directory.
struct ServerRecord {
    name: String,
    address: String,
    /// Process id, for servers started on this machine.
    pid: Option<u32>,
}

fn random_hex(bytes: usize) -> String {
    (0..bytes.div_ceil(8)).map(|_| format!("{:016x}", ringfs_rpc::memory::random_u64())).collect::<String>()[..bytes * 2].to_string()
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

fn write_private(path: &Path, contents: &str) -> Result<()> {
    let mut file = fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    Ok(())
}

fn read_hostfile(path: &Path) -> Result<Vec<String>> {
    let text = fs::read_to_string(path).with_context(|| format!("cannot read hostfile {}", path.display()))?;
    let hosts: Vec<String> = text
        .lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter_map(|line| line.split_whitespace().next().map(String::from))
        .collect();
    if hosts.is_empty() {
        bail!("hostfile {} names no host", path.display());
    }
    Ok(hosts)
}

/// The `--store` argument for one server: a `dir` store gets a subdirectory per server.
fn store_for(store: &str, name: &str) -> Result<String> {
    Ok(match parse_store(store)? {
        ringfs_store::Backend::Memory => "mem".to_string(),
        ringfs_store::Backend::Directory(path) => format!("dir:{}", path.join(name).display()),
    })
}

fn wait_for_file(path: &Path, deadline: Instant) -> Result<String> {
    loop {
        if let Ok(text) = fs::read_to_string(path)
            && !text.trim().is_empty()
        {
            return Ok(text.trim().to_string());
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {}", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn process_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

/// Waits for local server processes to exit; kills (SIGKILL) those still there at the end.
fn wait_for_exit(pids: &[u32], timeout: Duration) -> usize {
    let deadline = Instant::now() + timeout;
    while pids.iter().any(|pid| process_alive(*pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stubborn: Vec<u32> = pids.iter().copied().filter(|pid| process_alive(*pid)).collect();
    for pid in &stubborn {
        // SAFETY: these are server processes this cluster started (their pids are recorded
        // in its run directory).
        unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
    }
    stubborn.len()
}

fn log_tail(run_dir: &Path, name: &str) -> String {
    let text = fs::read_to_string(run_dir.join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// Launches one server on this machine as a detached process.
fn spawn_local(args: &StartArgs, run_dir: &Path, name: &str, join: Option<&str>) -> Result<(u32, PathBuf)> {
    let address_file = run_dir.join(format!("{name}.addr"));
    let log = fs::File::create(run_dir.join(format!("{name}.log")))?;
    let mut command = Command::new(std::env::current_exe().context("cannot find the ringfs executable")?);
    command
        .arg("server")
        .args(["--name", name])
        .args(["--listen", &format!("{}:0", args.listen_host)])
        .arg("--unix-socket")
        .arg(run_dir.join(format!("{name}.sock")))
        .args(["--store", &store_for(&args.store, name)?])
        .args(["--capacity", &args.capacity])
        .args(["--hash", &args.hash.to_string()])
        .args(["--placement", &args.placement.to_string()])
        .arg("--secret-file")
        .arg(run_dir.join("secret"))
        .arg("--address-file")
        .arg(&address_file)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .env_remove("RINGFS_SECRET");
    if let Some(join) = join {
        command.args(["--join", join]);
    }
    // SAFETY: setsid is async-signal-safe; it detaches the server from our terminal session so
    // that a Ctrl-C aimed at `ringfs start` does not reach it.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = command.spawn().context("cannot start a server process")?;
    Ok((child.id(), address_file))
}

/// Launches one server on `host` through the launcher.
fn spawn_remote(args: &StartArgs, run_dir: &Path, host: &str, name: &str, port: u16, join: Option<&str>) -> Result<()> {
    let executable = std::env::current_exe().context("cannot find the ringfs executable")?;
    let mut command = format!(
        "{exe} server --name {name} --listen 0.0.0.0:{port} --advertise {host}:{port} --unix-socket /tmp/ringfs-{id}-{name}.sock \
         --store {store} --capacity {capacity} --hash {hash} --placement {placement} --secret-file {run_dir}/secret",
        exe = executable.display(),
        id = run_dir.file_name().and_then(|name| name.to_str()).unwrap_or("job"),
        store = store_for(&args.store, name)?,
        capacity = args.capacity,
        hash = args.hash,
        placement = args.placement,
        run_dir = run_dir.display(),
    );
    if let Some(join) = join {
        command.push_str(&format!(" --join {join}"));
    }
    command.push_str(&format!(" >{}/{name}.log 2>&1 </dev/null &", run_dir.display()));
    let mut words = args.launcher.split_whitespace();
    let program = words.next().context("empty --launcher")?;
    let status = Command::new(program).args(words).arg(host).arg(&command).stdin(Stdio::null()).status().with_context(|| format!("cannot run {program}"))?;
    if !status.success() {
        bail!("launching the server on {host} failed ({status})");
    }
    Ok(())
}

/// Polls the cluster until `expected` servers are alive.
fn wait_for_members(first_address: &str, secret: &str, expected: usize, deadline: Instant) -> Result<()> {
    let mut last_error = String::from("no answer yet");
    while Instant::now() < deadline {
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
    bail!("the servers did not come up within {STARTUP_TIMEOUT:?}: {last_error}")
}

fn write_records(run_dir: &Path, records: &[ServerRecord]) -> Result<()> {
    let text: String = records
        .iter()
        .map(|record| format!("{} {} {}\n", record.name, record.address, record.pid.map(|pid| pid.to_string()).unwrap_or("-".into())))
        .collect();
    write_private(&run_dir.join("servers"), &text)
}

fn read_records(run_dir: &Path) -> Result<Vec<ServerRecord>> {
    let text = fs::read_to_string(run_dir.join("servers")).with_context(|| format!("{} holds no ringfs cluster", run_dir.display()))?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            Some(ServerRecord { name: words.next()?.to_string(), address: words.next()?.to_string(), pid: words.next()?.parse().ok() })
        })
        .collect())
}

/// What `start` produces: the environment clients need.
pub struct StartedCluster {
    pub run_dir: PathBuf,
    pub servers: Vec<String>,
    pub secret: String,
    pub chunk_size: u32,
}

impl StartedCluster {
    pub fn exports(&self) -> String {
        format!(
            "export RINGFS_SERVER={}\nexport RINGFS_SECRET={}\nexport RINGFS_RUN_DIR={}\nexport RINGFS_CHUNK_SIZE={}\n",
            self.servers.join(","),
            self.secret,
            self.run_dir.display(),
            self.chunk_size
        )
    }

    /// Sets the client variables in this process's environment.
    pub fn set_environment(&self) {
        // SAFETY: called from the single thread that runs the command, before spawning others.
        unsafe {
            std::env::set_var("RINGFS_SERVER", self.servers.join(","));
            std::env::set_var("RINGFS_SECRET", &self.secret);
            std::env::set_var("RINGFS_RUN_DIR", &self.run_dir);
            std::env::set_var("RINGFS_CHUNK_SIZE", self.chunk_size.to_string());
        }
    }
}

/// Starts a cluster and waits until every server has joined.
pub fn start(args: &StartArgs) -> Result<StartedCluster> {
    let chunk_size = ringfs_client::parse_size(&args.chunk_size).with_context(|| format!("invalid chunk size {:?}", args.chunk_size))?;
    parse_bytes(&args.capacity)?;
    let hosts = args.hostfile.as_deref().map(read_hostfile).transpose()?;
    if hosts.is_none() && args.servers == 0 {
        bail!("--servers must be at least 1");
    }
    let run_dir = args.run_dir.clone().unwrap_or_else(|| default_run_dir(hosts.is_some()));
    fs::DirBuilder::new().recursive(true).mode(0o700).create(&run_dir).with_context(|| format!("cannot create {}", run_dir.display()))?;
    let secret = random_hex(32);
    write_private(&run_dir.join("secret"), &secret)?;

    let deadline = Instant::now() + STARTUP_TIMEOUT;
    let mut records: Vec<ServerRecord> = Vec::new();
    let launched = launch_all(args, &run_dir, hosts.as_deref(), deadline, &mut records)
        .and_then(|()| wait_for_members(&records[0].address, &secret, records.len(), deadline));
    if let Err(error) = launched {
        let pids: Vec<u32> = records.iter().filter_map(|record| record.pid).collect();
        for pid in &pids {
            // SAFETY: servers this call started a moment ago.
            unsafe { libc::kill(*pid as libc::pid_t, libc::SIGTERM) };
        }
        wait_for_exit(&pids, Duration::from_secs(5));
        let logs: String = records.iter().map(|record| format!("\n--- {} log:\n{}", record.name, log_tail(&run_dir, &record.name))).collect();
        return Err(error.context(format!("starting the cluster failed{logs}")));
    }
    write_records(&run_dir, &records)?;
    Ok(StartedCluster { run_dir, servers: records.iter().map(|record| record.address.clone()).collect(), secret, chunk_size })
}

fn launch_all(args: &StartArgs, run_dir: &Path, hosts: Option<&[String]>, deadline: Instant, records: &mut Vec<ServerRecord>) -> Result<()> {
    match hosts {
        None => {
            let (pid, address_file) = spawn_local(args, run_dir, "server-0", None)?;
            records.push(ServerRecord { name: "server-0".into(), address: String::new(), pid: Some(pid) });
            records[0].address = wait_for_file(&address_file, deadline)?;
            let first = records[0].address.clone();
            let mut pending = Vec::new();
            for index in 1..args.servers {
                let name = format!("server-{index}");
                let (pid, address_file) = spawn_local(args, run_dir, &name, Some(&first))?;
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
                let port = args.port.checked_add(index as u16).context("port range overflows")?;
                let first = records.first().map(|record| record.address.clone());
                spawn_remote(args, run_dir, host, &name, port, first.as_deref())?;
                records.push(ServerRecord { name, address: format!("{host}:{port}"), pid: None });
                if index == 0 {
                    let secret = fs::read_to_string(run_dir.join("secret"))?;
                    wait_for_members(&records[0].address, secret.trim(), 1, deadline)?;
                }
            }
        }
    }
    Ok(())
}

#[derive(Args, Debug, Clone)]
pub struct StopArgs {
    /// Run directory of the cluster (default: RINGFS_RUN_DIR).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Keep the run directory (logs) after stopping.
    #[arg(long)]
    pub keep: bool,
}

fn run_dir_from(given: Option<&PathBuf>) -> Result<PathBuf> {
    given.cloned().or_else(|| std::env::var_os("RINGFS_RUN_DIR").map(PathBuf::from)).context("no cluster given: pass --run-dir or set RINGFS_RUN_DIR")
}

/// Stops every server of a cluster and waits until they have exited.
pub fn stop(args: &StopArgs) -> Result<()> {
    let run_dir = run_dir_from(args.run_dir.as_ref())?;
    let records = read_records(&run_dir)?;
    let secret = fs::read_to_string(run_dir.join("secret")).context("cannot read the cluster secret")?.trim().to_string();
    let addresses: Vec<String> = records.iter().map(|record| record.address.clone()).collect();
    match Client::connect(ClientConfig::new(addresses, secret.into_bytes())) {
        Ok(client) => {
            if let Err(errno) = client.shutdown_servers() {
                log::warn!("not every server answered the shutdown request: {errno}");
            }
        }
        Err(error) => log::warn!("no server answered ({error}); stopping the local processes"),
    }
    let pids: Vec<u32> = records.iter().filter_map(|record| record.pid).collect();
    for pid in pids.iter().filter(|pid| process_alive(**pid)) {
        // SAFETY: server processes this cluster started, recorded in its run directory.
        unsafe { libc::kill(*pid as libc::pid_t, libc::SIGTERM) };
    }
    let killed = wait_for_exit(&pids, SHUTDOWN_TIMEOUT);
    if killed > 0 {
        log::warn!("{killed} servers did not stop in time and were killed");
    }
    if !args.keep {
        fs::remove_dir_all(&run_dir).with_context(|| format!("cannot remove {}", run_dir.display()))?;
    }
    Ok(())
}

/// Prints one line per server: address, state, and its counters.
pub fn status(client: &Client) {
    println!("{:<16} {:<22} {:>6} {:>10} {:>10} {:>14} {:>12} {:>10}", "SERVER", "ADDRESS", "STATE", "ENTRIES", "CHUNKS", "BYTES", "REQUESTS", "FORWARDED");
    for (member, stats) in client.server_status() {
        match stats {
            Ok(stats) => println!(
                "{:<16} {:<22} {:>6} {:>10} {:>10} {:>14} {:>12} {:>10}",
                member.name, member.tcp_address, "up", stats.entries, stats.chunks, stats.bytes, stats.requests, stats.forwarded
            ),
            Err(_) => println!("{:<16} {:<22} {:>6}", member.name, member.tcp_address, if member.alive { "silent" } else { "dead" }),
        }
    }
}
