//! Servers and clients in one process over the simulated network (`ringfs_rpc::sim`), driven
//! through faults by a seed: frames delayed and reordered, frames lost, servers cut off and
//! paused. A checker holds every read against a model of what it may return: one complete
//! version of the file that some write produced — never a mix, never bytes of another file.
//! Operations may fail while faults last (EIO within the deadline); none may hang, and once
//! the faults end everything works again.
//!
//! `RINGFS_SIM_SEED` picks the seed (printed on failure), `RINGFS_SIM_SECS` the length of
//! the faulty phase and `RINGFS_SIM_HEAL_SECS` how soon everything must work again
//! (docs/TESTING.md).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringfs_client::{Client, ClientConfig, Errno, OpenFlags};
use ringfs_rpc::sim::{FaultPlan, network};
use ringfs_server::{Server, ServerConfig};

const FILES: u64 = 6;
const SECRET: &[u8] = b"simulated-secret";

/// Server messages at info and above on stderr (shown for a failing test), when
/// `RINGFS_SIM_LOG` is set.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::Level::Info
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            eprintln!("{:?} {} {}: {}", Instant::now(), record.level(), record.target(), record.args());
        }
    }

    fn flush(&self) {}
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|text| text.parse().ok()).unwrap_or(default)
}

/// The servers of one simulated cluster, stopped when dropped.
struct SimCluster {
    servers: Vec<Option<Server>>,
    names: Vec<String>,
}

impl SimCluster {
    fn start(tag: &str, count: usize) -> SimCluster {
        let names: Vec<String> = (0..count).map(|index| format!("{tag}-{index}")).collect();
        let mut servers = Vec::new();
        for name in &names {
            let mut config = ServerConfig::new(name, &format!("sim:{name}"), SECRET.to_vec());
            if name != &names[0] {
                config.join = vec![format!("sim:{}", names[0])];
            }
            config.peer_timeout = Duration::from_millis(1500);
            config.heartbeat_interval = Duration::from_millis(100);
            config.failure_timeout = Duration::from_millis(600);
            config.poll = Duration::ZERO;
            servers.push(Some(Server::start(config).expect("a simulated server starts")));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while servers.iter().flatten().any(|server| server.alive_members() < count) {
            assert!(Instant::now() < deadline, "the simulated cluster did not form");
            std::thread::sleep(Duration::from_millis(20));
        }
        SimCluster { servers, names }
    }

    fn client(&self) -> Client {
        let mut config = ClientConfig::new(self.names.iter().map(|name| format!("sim:{name}")).collect(), SECRET.to_vec());
        config.timeout = Duration::from_millis(1500);
        config.chunk_size = 16 * 1024;
        config.poll = Duration::ZERO;
        Client::connect(config).expect("a client reaches the simulated cluster")
    }
}

impl Drop for SimCluster {
    fn drop(&mut self) {
        network().set_plan(FaultPlan::default(), 0);
        for name in &self.names {
            network().isolate(name, false);
            network().pause(name, false);
        }
        for server in self.servers.iter_mut().filter_map(Option::take) {
            server.stop();
        }
    }
}

/// Version `version` of file `file`: a header naming both, then bytes derived from them; its
/// length varies with the version so that a mix of two versions shows.
fn contents(file: u64, version: u64) -> Vec<u8> {
    let len = 16 + ((file * 7919 + version * 104_729) % 60_000) as usize;
    let mut bytes = Vec::with_capacity(len);
    bytes.extend_from_slice(&file.to_le_bytes());
    bytes.extend_from_slice(&version.to_le_bytes());
    let mut state = file.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version;
    while bytes.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.push(state as u8);
    }
    bytes
}

/// What a read of `file` may return: the versions whose write was attempted (a failed write
/// may still have landed).
#[derive(Default)]
struct Model {
    attempted: BTreeMap<u64, BTreeSet<u64>>,
    /// The writes (and renames) that succeeded, per file: version, when the write began and
    /// when it returned. The file must end with one of them that no other successful write
    /// followed entirely (began after it returned): writes that overlap in time may take
    /// effect in either order.
    completed: BTreeMap<u64, Vec<(u64, Instant, Instant)>>,
    /// Versions whose write failed: they may have landed, even later than others.
    uncertain: BTreeMap<u64, BTreeSet<u64>>,
}

fn write_version(client: &Client, file: u64, version: u64, writer: u64) -> Result<(), Errno> {
    let temporary = format!("/tmp-{writer}-{file}");
    let bytes = contents(file, version);
    let fd = client.open(&temporary, OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::TRUNCATE, 0o644)?;
    let written = client.pwrite(fd, &bytes, 0);
    client.close(fd)?;
    if written? != bytes.len() {
        return Err(Errno::EIO);
    }
    client.rename(&temporary, &format!("/f{file}"))
}

/// Reads `/f{file}` whole; `Ok(None)` if it does not exist yet.
fn read_version(client: &Client, file: u64) -> Result<Option<(u64, Vec<u8>)>, Errno> {
    let fd = match client.open(&format!("/f{file}"), OpenFlags::READ, 0) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(None),
        Err(errno) => return Err(errno),
    };
    let mut buffer = vec![0u8; 70_000];
    let count = client.pread(fd, &mut buffer, 0);
    client.close(fd)?;
    buffer.truncate(count?);
    if buffer.len() < 16 {
        return Ok(Some((u64::MAX, buffer)));
    }
    let version = u64::from_le_bytes(buffer[8..16].try_into().expect("16 bytes"));
    Ok(Some((version, buffer)))
}

/// Checks a read against the model; returns a description of what is wrong.
fn check_read(model: &Model, file: u64, read: &Option<(u64, Vec<u8>)>) -> Option<String> {
    let (version, bytes) = read.as_ref()?;
    if !model.attempted.get(&file).is_some_and(|versions| versions.contains(version)) {
        return Some(format!("/f{file}: version {version} was never written ({} bytes)", bytes.len()));
    }
    (*bytes != contents(file, *version)).then(|| format!("/f{file}: version {version} read back wrong ({} bytes)", bytes.len()))
}

/// Runs writers and readers until `until`, with `faults` called every 100 ms; returns the
/// tally of operations and the wrong reads found.
fn run_workload(
    client_of: &dyn Fn() -> Client,
    model: &Arc<Mutex<Model>>,
    until: Instant,
    seed: u64,
    phase: u64,
) -> (u64, u64, Vec<String>) {
    let wrong = Arc::new(Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for writer in 0..2u64 {
        let client = client_of();
        let model = model.clone();
        threads.push(std::thread::spawn(move || {
            // Versions are unique: per phase and writer.
            let (mut done, mut failed, mut version) = (0u64, 0u64, phase * 10_000_000 + writer * 1_000_000);
            while Instant::now() < until && done < 5_000 {
                let file = (seed + done * 31 + writer * 17) % FILES;
                version += 1;
                model.lock().unwrap().attempted.entry(file).or_default().insert(version);
                let started = Instant::now();
                match write_version(&client, file, version, writer) {
                    Ok(()) => {
                        let mut model = model.lock().unwrap();
                        model.completed.entry(file).or_default().push((version, started, Instant::now()));
                    }
                    Err(errno) => {
                        if phase == 1 {
                            eprintln!("phase {phase}: writing file {file} failed after {:?}: {errno:?}", started.elapsed());
                        }
                        model.lock().unwrap().uncertain.entry(file).or_default().insert(version);
                        failed += 1;
                    }
                }
                assert!(started.elapsed() < Duration::from_secs(20), "a write took {:?} (seed {seed})", started.elapsed());
                done += 1;
            }
            (done, failed)
        }));
    }
    for reader in 0..2u64 {
        let client = client_of();
        let model = model.clone();
        let wrong = wrong.clone();
        threads.push(std::thread::spawn(move || {
            let (mut done, mut failed) = (0u64, 0u64);
            while Instant::now() < until && done < 20_000 {
                let file = (done + reader) % FILES;
                let started = Instant::now();
                match read_version(&client, file) {
                    Ok(read) => {
                        if let Some(problem) = check_read(&model.lock().unwrap(), file, &read) {
                            wrong.lock().unwrap().push(problem);
                        }
                    }
                    Err(errno) => {
                        if phase == 1 {
                            eprintln!("phase {phase}: reading file {file} failed after {:?}: {errno:?}", started.elapsed());
                        }
                        failed += 1;
                    }
                }
                assert!(started.elapsed() < Duration::from_secs(20), "a read took {:?} (seed {seed})", started.elapsed());
                done += 1;
            }
            (done, failed)
        }));
    }
    // A directory moved back and forth between two names: its file must stay whole, under
    // exactly one of them.
    {
        let client = client_of();
        threads.push(std::thread::spawn(move || {
            let (mut done, mut failed) = (0u64, 0u64);
            while Instant::now() < until && done < 2_000 {
                let (from, to) = if client.stat("/tree/a").is_ok() { ("/tree/a", "/tree/b") } else { ("/tree/b", "/tree/a") };
                let started = Instant::now();
                if let Err(errno) = client.rename(from, to) {
                    if phase == 1 {
                        eprintln!("phase {phase}: renaming {from} failed after {:?}: {errno:?}", started.elapsed());
                    }
                    failed += 1;
                }
                assert!(started.elapsed() < Duration::from_secs(20), "a directory rename took {:?} (seed {seed})", started.elapsed());
                done += 1;
            }
            (done, failed)
        }));
    }
    let (mut operations, mut failures) = (0, 0);
    for thread in threads {
        let (done, failed) = thread.join().expect("workload threads do not panic");
        operations += done;
        failures += failed;
    }
    let wrong = wrong.lock().unwrap().clone();
    (operations, failures, wrong)
}

/// After the faults: every file reads back a version written successfully that no other
/// successful write followed entirely (concurrent writes may land in either order), or one
/// whose write reported failure (it may have landed after that).
fn check_converged(client: &Client, model: &Model, seed: u64) {
    for (file, writes) in &model.completed {
        let read = read_version(client, *file).unwrap_or_else(|errno| panic!("/f{file} unreadable after healing: {errno} (seed {seed})"));
        assert_eq!(check_read(model, *file, &read), None, "seed {seed}");
        let (version, _) = read.expect("a completed file exists");
        let uncertain = model.uncertain.get(file).is_some_and(|versions| versions.contains(&version));
        let last_possible = writes
            .iter()
            .find(|(written, _, _)| *written == version)
            .is_some_and(|(_, _, returned)| !writes.iter().any(|(_, began, _)| began > returned));
        let (last, _, _) = writes.last().expect("a completed write");
        assert!(last_possible || uncertain, "/f{file}: read version {version}, last completed {last} (seed {seed})");
    }
}

#[test]
fn reads_stay_whole_and_the_cluster_heals_under_simulated_network_faults() {
    if std::env::var_os("RINGFS_SIM_LOG").is_some() {
        static LOGGER: StderrLog = StderrLog;
        let _ = log::set_logger(&LOGGER).map(|()| log::set_max_level(log::LevelFilter::Info));
    }
    let seed = env_number("RINGFS_SIM_SEED", 1);
    let faulty = Duration::from_secs(env_number("RINGFS_SIM_SECS", 6));
    eprintln!("simulation seed {seed}");
    let cluster = SimCluster::start(&format!("sim{seed}"), 3);
    let model = Arc::new(Mutex::new(Model::default()));
    let setup = cluster.client();
    setup.mkdir("/tree", 0o755).unwrap();
    setup.mkdir("/tree/a", 0o755).unwrap();
    let fd = setup.create("/tree/a/kept", 0o644).unwrap();
    setup.pwrite(fd, &contents(99, 1), 0).unwrap();
    setup.close(fd).unwrap();

    // Phase 1: frames delayed (up to 3 ms) and so reordered, nothing lost: no operation may
    // fail and every read is whole.
    network().set_plan(FaultPlan { max_delay: Duration::from_millis(3), ..FaultPlan::default() }, seed);
    let (operations, failures, wrong) = run_workload(&|| cluster.client(), &model, Instant::now() + Duration::from_secs(2), seed, 1);
    assert!(wrong.is_empty(), "wrong reads with delays only (seed {seed}): {wrong:?}");
    assert_eq!(failures, 0, "{failures} of {operations} operations failed with delays only (seed {seed})");
    assert!(operations > 50, "only {operations} operations ran");

    // Phase 2: frames also lost (0.2 %), and on a schedule the seed draws, one server cut off
    // and another paused for a while. The workload's clients connect before the faults
    // begin: a client tries the servers one after another, and the schedule's victims can
    // follow the same order, each unreachable for just the time the client tries it (soak
    // seed 71610: "no answer" from all three).
    let clients = Mutex::new((0..5).map(|_| cluster.client()).collect::<Vec<_>>());
    network().set_plan(FaultPlan { max_delay: Duration::from_millis(3), drop_per_million: 2_000, ..FaultPlan::default() }, seed);
    let until = Instant::now() + faulty;
    let faults = {
        let names = cluster.names.clone();
        std::thread::spawn(move || {
            let mut round = 0u64;
            while Instant::now() + Duration::from_millis(1_200) < until {
                let victim = &names[((seed + round) % names.len() as u64) as usize];
                if (seed + round).is_multiple_of(2) {
                    network().isolate(victim, true);
                    std::thread::sleep(Duration::from_millis(900));
                    network().isolate(victim, false);
                } else {
                    network().pause(victim, true);
                    std::thread::sleep(Duration::from_millis(900));
                    network().pause(victim, false);
                }
                std::thread::sleep(Duration::from_millis(300));
                round += 1;
            }
            round
        })
    };
    let connected = || clients.lock().unwrap().pop().expect("a client connected before the faults");
    let (operations, failures, wrong) = run_workload(&connected, &model, until, seed, 2);
    let rounds = faults.join().unwrap();
    eprintln!("faulty phase: {operations} operations, {failures} failed, {rounds} fault rounds, network {:?}", network().stats());
    assert!(wrong.is_empty(), "wrong reads under faults (seed {seed}): {wrong:?}");
    assert!(rounds >= 1, "no fault was injected");

    // Phase 3: healed. Within a few seconds every server is back and everything works.
    network().set_plan(FaultPlan::default(), seed);
    let client = cluster.client();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match client.server_stats() {
            Ok(stats) if stats.len() == cluster.names.len() => break,
            outcome => assert!(Instant::now() < deadline, "the cluster did not heal: {outcome:?} (seed {seed})"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let model = model.lock().unwrap();
    check_converged(&client, &model, seed);
    // How soon after the faults everything must work again. The soak (scripts/soak.sh) asks
    // for 5 s; CI allows a lease (30 s) and more, because a rare stall that ends with a lease
    // is still open (docs/TESTING.md) and must not make CI fail at random.
    let heal_within = Duration::from_secs(env_number("RINGFS_SIM_HEAL_SECS", 35));
    let healing = Instant::now();
    for file in 0..FILES {
        // A few tries while the last retries and member updates settle (a lock whose release
        // was lost used to keep its name locked for the whole 30 s lease).
        let mut outcome = write_version(&client, file, 9_999_999, 9);
        while outcome.is_err() && healing.elapsed() < heal_within {
            std::thread::sleep(Duration::from_millis(200));
            outcome = write_version(&client, file, 9_999_999, 9);
        }
        eprintln!("/f{file} writable {:?} after healing: {outcome:?}", healing.elapsed());
        outcome.unwrap_or_else(|errno| panic!("writing /f{file} after healing: {errno} (seed {seed})"));
        let read = read_version(&client, file).unwrap().expect("just written");
        assert_eq!(read.1, contents(file, 9_999_999), "seed {seed}");
    }
    let names: Vec<String> = client.readdir("/tree").unwrap().into_iter().map(|entry| entry.name).collect();
    assert!(names == ["a"] || names == ["b"], "the moved directory has names {names:?} (seed {seed})");
    let kept = format!("/tree/{}/kept", names[0]);
    let mut opened = client.open(&kept, OpenFlags::READ, 0);
    while opened.is_err() && healing.elapsed() < heal_within {
        std::thread::sleep(Duration::from_millis(200));
        opened = client.open(&kept, OpenFlags::READ, 0);
    }
    eprintln!("{kept} opened {:?} after healing: {:?}", healing.elapsed(), opened.as_ref().map(drop));
    let views: Vec<usize> = cluster.servers.iter().flatten().map(Server::alive_members).collect();
    let fd = opened.unwrap_or_else(|errno| panic!("{kept} after healing: {errno}; servers see {views:?} members alive (seed {seed})"));
    let mut bytes = vec![0u8; 70_000];
    let count = client.pread(fd, &mut bytes, 0).unwrap();
    client.close(fd).unwrap();
    assert!(bytes[..count] == contents(99, 1)[..], "{kept} changed (seed {seed})");
}
