//! Starting a job's servers ([`start`]) and the [`Cluster`] it returns.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ringfs_client::{Client, ClientConfig};
use ringfs_config::env;

use crate::config::*;
use crate::leftovers;
use crate::process::{self, signal, wait_for_exit};
use crate::run_dir::*;
use crate::slurm;
use crate::stop::{StopOptions, stop};
use crate::{LaunchError, Result, STARTUP_TIMEOUT, io_error};

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

/// Polls the cluster until `expected` servers are alive in every server's view (or a Slurm
/// step launching them ended): a server that does not know the last one yet would place
/// names differently from the clients.
fn wait_for_members(run_dir: &Path, first_address: &str, secret: &str, expected: usize, deadline: Instant) -> Result<()> {
    let mut last_error = String::from("no answer yet");
    while Instant::now() < deadline {
        if let Some(failure) = slurm::step_failure(run_dir) {
            return Err(LaunchError::Startup(failure));
        }
        match Client::connect(ClientConfig::new(vec![first_address.to_string()], secret.as_bytes().to_vec())) {
            Ok(client) => {
                if client.all_servers_see(expected) {
                    return Ok(());
                }
                let alive = client.members().members.iter().filter(|member| member.alive).count();
                last_error = if alive >= expected {
                    format!("all {expected} servers joined, not all of them know each other yet")
                } else {
                    format!("{alive} of {expected} servers joined")
                };
            }
            Err(error) => last_error = error.to_string(),
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    Err(LaunchError::Startup(format!("the servers did not come up within {STARTUP_TIMEOUT:?}: {last_error}")))
}

/// The most server addresses `RINGFS_SERVER` names (see [`Cluster::environment`]).
pub const EXPORTED_SERVERS: usize = 64;

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

    /// The client variables, as (name, value) pairs. `RINGFS_SERVER` names at most
    /// [`EXPORTED_SERVERS`] servers, spread over the cluster: a client needs one that
    /// answers (it learns the others from its member list), and every process of the job
    /// carries the variable — one over 128 KiB (~6,000 addresses) makes every `exec` fail.
    pub fn environment(&self) -> Vec<(&'static str, String)> {
        let step = self.servers.len().div_ceil(EXPORTED_SERVERS).max(1);
        let exported: Vec<&str> = self.servers.iter().step_by(step).map(String::as_str).collect();
        vec![
            (env::SERVER, exported.join(",")),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exported_server_list_is_bounded_and_spread_over_the_cluster() {
        let cluster = |count: usize| Cluster {
            run_dir: PathBuf::from("/tmp/x"),
            servers: (0..count).map(|index| format!("node{index}:7717")).collect(),
            secret: "s".into(),
            chunk_size: 1 << 20,
        };
        let exported = |count: usize| {
            let environment = cluster(count).environment();
            environment
                .iter()
                .find(|(name, _)| *name == env::SERVER)
                .map(|(_, value)| value.split(',').map(String::from).collect::<Vec<_>>())
                .unwrap()
        };
        assert_eq!(exported(3), ["node0:7717", "node1:7717", "node2:7717"]);
        assert_eq!(exported(64).len(), 64);
        let large = exported(10_000);
        assert!(large.len() <= EXPORTED_SERVERS && large.len() >= EXPORTED_SERVERS / 2, "{}", large.len());
        assert_eq!(large[0], "node0:7717");
        assert!(large.last().unwrap().as_str() >= "node9", "spread to the end: {large:?}");
    }
}
