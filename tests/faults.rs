//! Fault injection: every server sits behind a relay ([`common::relay`]) that delays, pauses
//! and partitions its links on a seeded schedule, while client threads run a self-checking
//! workload and servers are stopped (SIGSTOP) and killed and restarted.
//!
//! What must hold, whatever the faults:
//! - every successful read returns one complete version written to that name (never a mix of
//!   versions, bytes of another file, or zeros where data was);
//! - every call returns within three request deadlines (none hangs), and a failed one fails
//!   with EIO or ETIMEDOUT;
//! - once the faults end, every file reads back as the workload left it: its last version if
//!   the last change succeeded, one of the versions attempted since if it failed.
//!
//! A failure prints its seed; `RINGFS_FAULT_SEED=<seed>` replays the same fault schedule (not
//! the same thread timing, so a failure may take a few runs to show again). `RINGFS_FAULTS=<n>`
//! sets how many network faults the mixed run injects (default 10; 30 finds more).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::relay::{Fault, Relays, ScheduledFault};
use common::{ClusterOptions, Random, TestCluster};
use ringfs_client::{Client, Errno, OpenFlags};

/// The request deadline of the clients under faults.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(1);
/// Small chunks, so that one small file spans several servers.
const SMALL_CHUNKS: u32 = 4096;
/// Files each workload thread owns.
const FILES_PER_THREAD: usize = 5;

/// The tests measure time (deadlines, detection, healing): run them one at a time, so that
/// they do not slow each other down on a small machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How much longer than in CI a call may take: `RINGFS_FAULT_SLACK` (default 1). The soak
/// runs at low priority beside other work, where a starved process is slow but not wrong.
fn bound_slack() -> f64 {
    std::env::var("RINGFS_FAULT_SLACK").ok().and_then(|text| text.parse().ok()).filter(|slack: &f64| *slack >= 1.0).unwrap_or(1.0)
}

/// The seed of this run: `RINGFS_FAULT_SEED`, or a fresh one. Printed, so a failure shows it.
fn fault_seed(test: &str) -> u64 {
    let seed = std::env::var("RINGFS_FAULT_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(|| ringfs_rpc::memory::random_u64() % 1_000_000_000);
    eprintln!("{test}: fault seed {seed} (replay: RINGFS_FAULT_SEED={seed} cargo test -p ringfs-cli --test faults {test})");
    seed
}

/// A cluster of `servers` whose every server is reached only through its relay.
fn relayed_cluster(servers: usize, dir_store: bool, seed: u64) -> (TestCluster, Relays) {
    let relays = Relays::start(servers, seed);
    let mut options = ClusterOptions { dir_store, ..ClusterOptions::new(1) };
    options.extra_args = relays.server_arguments(0);
    let mut cluster = TestCluster::with_options(options);
    for server in 1..servers {
        cluster.set_extra_arg("--advertise", &relays.address(server));
        cluster.add_server();
    }
    cluster.wait_for_alive(servers);
    for member in cluster.client().members().members {
        let server = (0..servers).find(|server| cluster.name(*server) == member.name).expect("a member of the cluster");
        assert_eq!(member.tcp_address, relays.address(server), "{} is known by its relay's address", member.name);
        assert!(member.unix_path.is_empty(), "no Unix socket bypasses the relay of {}", member.name);
    }
    (cluster, relays)
}

/// Restarts server `server` (killed before) behind its relay.
fn restart_behind_relay(cluster: &mut TestCluster, relays: &Relays, server: usize) {
    cluster.set_extra_arg("--advertise", &relays.address(server));
    cluster.restart(server);
}

/// A client that reaches the servers through their relays only.
fn relayed_client(cluster: &TestCluster, timeout: Duration, chunk_size: u32) -> Client {
    let mut config = cluster.client_config();
    config.timeout = timeout;
    config.chunk_size = chunk_size;
    config.local_fast_path = false;
    Client::connect(config).expect("connect through the relays")
}

/// The server holding `path`'s entry, by the client's view of placement.
fn owner_of(client: &Client, path: &str) -> String {
    let list = client.members();
    let (scheme, hash) = ringfs_placement::parse_description(&list.placement).unwrap();
    let placement = ringfs_placement::Placement::new(list.members.iter().map(|member| member.name.clone()), hash, scheme).unwrap();
    placement.ring()[placement.owner_of_path(path)].clone()
}

// ---------------------------------------------------------------------------------------
// Self-describing file contents

/// Version `number` of the file first written as `origin`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Version {
    origin: String,
    number: u64,
}

/// What a name holds: nothing, or one version.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Seen {
    Absent,
    Holds(Version),
}

const MAGIC: &str = "ringfs-fault";

/// The bytes of `version`: a header naming it and giving the length, then bytes derived from
/// it, so that a reader can tell a whole version from a cut, padded or mixed one.
fn contents(version: &Version) -> Vec<u8> {
    let seed = version
        .origin
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325 ^ version.number, |hash, byte| (hash ^ byte as u64).wrapping_mul(0x100_0000_01b3));
    let mut random = Random::new(seed);
    let len = 64 + random.below(14_000) as usize;
    let mut bytes = format!("{MAGIC} {} {} {len}\n", version.origin, version.number).into_bytes();
    let header_len = bytes.len();
    bytes.resize(len.max(header_len), 0);
    random.fill(&mut bytes[header_len..]);
    bytes
}

/// The version `bytes` are, or what is wrong with them.
fn identify(bytes: &[u8]) -> Result<Version, String> {
    let describe = |why: &str| {
        let zeros = bytes.iter().filter(|byte| **byte == 0).count();
        format!("{why} ({} bytes, {zeros} zero bytes, starting {:?})", bytes.len(), String::from_utf8_lossy(&bytes[..bytes.len().min(48)]))
    };
    let header_end = bytes.iter().take(200).position(|byte| *byte == b'\n').ok_or_else(|| describe("no header"))?;
    let header = std::str::from_utf8(&bytes[..header_end]).map_err(|_| describe("garbled header"))?;
    let fields: Vec<&str> = header.split(' ').collect();
    let [MAGIC, origin, number, _] = fields[..] else { return Err(describe("garbled header")) };
    let version = Version { origin: origin.to_string(), number: number.parse().map_err(|_| describe("garbled header"))? };
    let expected = contents(&version);
    if bytes == expected {
        return Ok(version);
    }
    let first_difference = bytes.iter().zip(&expected).position(|(got, want)| got != want).unwrap_or(bytes.len().min(expected.len()));
    Err(describe(&format!(
        "not a whole version: header says {} v{} ({} bytes), first difference at byte {first_difference}",
        version.origin,
        version.number,
        expected.len()
    )))
}

#[test]
fn the_checker_tells_a_whole_version_from_a_mixed_cut_zeroed_or_foreign_one() {
    let first = Version { origin: "/t0/f1".into(), number: 7 };
    let second = Version { origin: "/t0/f1".into(), number: 8 };
    let (first_bytes, second_bytes) = (contents(&first), contents(&second));
    assert_eq!(identify(&first_bytes), Ok(first));
    let shorter = first_bytes.len().min(second_bytes.len());
    let mixed = [&first_bytes[..shorter / 2], &second_bytes[shorter / 2..]].concat();
    assert!(identify(&mixed).is_err(), "the head of one version with the tail of another");
    assert!(identify(&first_bytes[..first_bytes.len() - 1]).is_err(), "a version cut short");
    let mut holed = first_bytes.clone();
    holed[first_bytes.len() / 2..].fill(0);
    assert!(identify(&holed).is_err(), "zeros where data was");
    assert!(identify(&vec![0u8; first_bytes.len()]).is_err(), "zeros only");
    let mut renamed = first_bytes.clone();
    renamed[MAGIC.len() + 3] = b'2'; // "/t0/f1" becomes "/t2/f1"
    assert!(identify(&renamed).is_err(), "another file's header over these bytes");
}

/// Runs one client call and tells `clock` how long it took.
fn timed<T>(clock: &mut dyn FnMut(&str, Duration), what: &str, call: impl FnOnce() -> Result<T, Errno>) -> Result<T, Errno> {
    let started = Instant::now();
    let outcome = call();
    clock(what, started.elapsed());
    outcome
}

/// Reads `path` whole through open, fstat and pread.
fn read_whole(client: &Client, path: &str, clock: &mut dyn FnMut(&str, Duration)) -> Result<Vec<u8>, Errno> {
    let fd = timed(clock, "open", || client.open(path, OpenFlags::READ, 0))?;
    let mut bytes = Vec::new();
    let outcome = timed(clock, "fstat", || client.fstat(fd)).and_then(|stat| {
        bytes = vec![0u8; stat.size as usize];
        timed(clock, "pread", || client.pread(fd, &mut bytes, 0))
    });
    let closed = timed(clock, "close", || client.close(fd));
    let count = outcome?;
    closed?;
    bytes.truncate(count);
    Ok(bytes)
}

/// A clock for calls nobody times.
fn untimed(_: &str, _: Duration) {}

// ---------------------------------------------------------------------------------------
// The workload and its model

/// What one name may hold, given the operations on it so far.
#[derive(Clone, Debug)]
struct FileModel {
    /// After a success, the one state it left; after failures, every state they may have left.
    possible: BTreeSet<Seen>,
    /// The last operations on the name, for failure messages.
    history: Vec<String>,
}

impl FileModel {
    fn note(&mut self, event: String) {
        if self.history.len() == 16 {
            self.history.remove(0);
        }
        self.history.push(event);
    }
}

/// Counts of one workload thread, and what it found wrong.
#[derive(Debug)]
struct Report {
    /// When the workload started (violations say when they happened).
    started: Instant,
    succeeded: u64,
    failed: BTreeMap<String, u64>,
    slowest: Duration,
    violations: Vec<String>,
}

impl Report {
    fn new(started: Instant) -> Report {
        Report { started, succeeded: 0, failed: BTreeMap::new(), slowest: Duration::ZERO, violations: Vec::new() }
    }

    /// Notes how long a call took; longer than `bound` is a violation.
    fn observe(&mut self, bound: Duration, what: &str, elapsed: Duration) {
        self.slowest = self.slowest.max(elapsed);
        if elapsed > bound {
            self.violation(format!("{what} took {elapsed:?} (bound {bound:?})"));
        }
    }

    fn violation(&mut self, what: String) {
        self.violations.push(format!("at {:.2}s: {what}", self.started.elapsed().as_secs_f64()));
    }
}

/// Settings shared by the workload threads.
struct Workload {
    threads: usize,
    /// Per thread: the highest version number it has started to write.
    attempted: Vec<AtomicU64>,
    /// A call that takes longer than this is a violation.
    call_bound: Duration,
    /// Delay-only runs: nothing may fail but what the model says must.
    strict: bool,
    /// The workload's clock starts here (fault schedules count from it too).
    started: Instant,
    until: Instant,
    seed: u64,
}

impl Workload {
    fn new(threads: usize, client_timeout: Duration, strict: bool, run_for: Duration, seed: u64) -> Workload {
        let started = Instant::now();
        Workload {
            threads,
            attempted: (0..threads).map(|_| AtomicU64::new(0)).collect(),
            call_bound: 3 * client_timeout.mul_f64(bound_slack()),
            strict,
            started,
            until: started + run_for,
            seed,
        }
    }
}

fn file_name(thread: usize, index: usize) -> String {
    format!("/t{thread}/f{index}")
}

/// One workload thread: creates, replaces (write to a temporary name, then rename over),
/// renames over, unlinks and reads the files it owns, checking every answer against its
/// model; and reads other threads' files, checking that each is a whole version.
struct Worker<'a> {
    thread: usize,
    client: Client,
    random: Random,
    workload: &'a Workload,
    files: BTreeMap<String, FileModel>,
    report: Report,
}

impl<'a> Worker<'a> {
    fn new(thread: usize, client: Client, workload: &'a Workload) -> Worker<'a> {
        let files = (0..FILES_PER_THREAD)
            .map(|index| (file_name(thread, index), FileModel { possible: BTreeSet::from([Seen::Absent]), history: Vec::new() }))
            .collect();
        let random = Random::new(workload.seed.wrapping_mul(31).wrapping_add(thread as u64 + 1));
        Worker { thread, client, random, workload, files, report: Report::new(workload.started) }
    }

    fn run(mut self) -> Worker<'a> {
        while Instant::now() < self.workload.until {
            let name = file_name(self.thread, self.random.below(FILES_PER_THREAD as u64) as usize);
            match self.random.below(100) {
                0..45 => self.replace(&name),
                45..70 => self.read_own(&name),
                70..80 => self.read_other(),
                80..90 => self.unlink(&name),
                _ => {
                    let target = file_name(self.thread, self.random.below(FILES_PER_THREAD as u64) as usize);
                    if target != name {
                        self.rename_over(&name, &target);
                    }
                }
            }
        }
        self
    }

    /// Runs one client call, holding it to the time bound.
    fn call<T>(&mut self, what: &str, call: impl FnOnce() -> Result<T, Errno>) -> Result<T, Errno> {
        let bound = self.workload.call_bound;
        let report = &mut self.report;
        timed(&mut |what, elapsed| report.observe(bound, what, elapsed), what, call)
    }

    fn read(&mut self, path: &str) -> Result<Vec<u8>, Errno> {
        let bound = self.workload.call_bound;
        let report = &mut self.report;
        read_whole(&self.client, path, &mut |what, elapsed| report.observe(bound, &format!("{what} {path}"), elapsed))
    }

    /// Records a failed call: a violation unless a fault explains it (EIO, ETIMEDOUT; in
    /// strict runs, nothing does). Answers the model expects (ENOENT) are not failures.
    fn failed(&mut self, what: &str, errno: Errno) {
        let call = what.split(' ').next().unwrap_or(what);
        *self.report.failed.entry(format!("{call}: {errno}")).or_default() += 1;
        let from_fault = !self.workload.strict && (errno == Errno::EIO || errno == Errno::ETIMEDOUT);
        if !from_fault {
            self.report.violation(format!("{what} failed with {errno:?}"));
        }
        // Calls to a server known to be down fail at once: do not spin on them.
        std::thread::sleep(Duration::from_millis(10));
    }

    fn model(&mut self, name: &str) -> &mut FileModel {
        self.files.get_mut(name).expect("a file of this thread")
    }

    fn violation(&mut self, name: &str, what: String) {
        let model = &self.files[name];
        let text = format!("{what}; {name} may hold {:?}; its history: {:#?}", model.possible, model.history);
        self.report.violation(text);
    }

    /// Writes a new version to a temporary name, then renames it over `name`.
    fn replace(&mut self, name: &str) {
        let number = self.workload.attempted[self.thread].fetch_add(1, Ordering::SeqCst) + 1;
        let version = Version { origin: name.to_string(), number };
        let temporary = format!("/t{}/.tmp{number}", self.thread);
        if let Err((what, errno)) = self.write_new_file(&temporary, &contents(&version)) {
            self.failed(&format!("{what} {temporary}"), errno);
            self.model(name).note(format!("v{number}: writing {temporary} failed ({what}: {errno:?})"));
            let client = self.client.clone();
            let _ = self.call("unlink", || client.unlink(&temporary));
            return;
        }
        let client = self.client.clone();
        match self.call("rename", || client.rename(&temporary, name)) {
            Ok(()) => {
                self.report.succeeded += 1;
                let model = self.model(name);
                model.possible = BTreeSet::from([Seen::Holds(version)]);
                model.note(format!("v{number}: renamed over"));
            }
            Err(errno) => {
                self.failed(&format!("rename {temporary} {name}"), errno);
                let model = self.model(name);
                model.possible.insert(Seen::Holds(version));
                model.note(format!("v{number}: rename over failed ({errno:?})"));
                let _ = self.call("unlink", || client.unlink(&temporary));
            }
        }
    }

    /// Creates `path` with `bytes`, durably (fsync), and closes it.
    fn write_new_file(&mut self, path: &str, bytes: &[u8]) -> Result<(), (&'static str, Errno)> {
        let client = self.client.clone();
        let fd = self.call("create", || client.create(path, 0o644)).map_err(|errno| ("create", errno))?;
        let written = self
            .call("pwrite", || client.pwrite(fd, bytes, 0))
            .map_err(|errno| ("pwrite", errno))
            .and_then(|count| if count == bytes.len() { Ok(()) } else { Err(("short pwrite", Errno::EIO)) })
            .and_then(|()| self.call("fsync", || client.fsync(fd)).map_err(|errno| ("fsync", errno)));
        let closed = self.call("close", || client.close(fd)).map_err(|errno| ("close", errno));
        written.and(closed)
    }

    fn read_own(&mut self, name: &str) {
        match self.read(name) {
            Ok(bytes) => {
                self.report.succeeded += 1;
                match identify(&bytes) {
                    Ok(version) if self.files[name].possible.contains(&Seen::Holds(version.clone())) => {
                        self.model(name).note(format!("read {} v{}", version.origin, version.number));
                    }
                    Ok(version) => self.violation(name, format!("read {name} returned {version:?}, which it cannot hold")),
                    Err(why) => self.violation(name, format!("read {name}: {why}")),
                }
            }
            Err(Errno::ENOENT) => {
                let expected = self.files[name].possible.contains(&Seen::Absent);
                if !expected {
                    self.violation(name, format!("read {name}: ENOENT, but it exists"));
                }
                self.model(name).note("read: ENOENT".into());
            }
            Err(errno) => {
                self.failed(&format!("read {name}"), errno);
                self.model(name).note(format!("read failed ({errno:?})"));
            }
        }
    }

    /// Reads a file of another thread: it may change meanwhile, but must be a whole version
    /// that thread wrote.
    fn read_other(&mut self) {
        if self.workload.threads < 2 {
            return;
        }
        let other = (self.thread + 1 + self.random.below(self.workload.threads as u64 - 1) as usize) % self.workload.threads;
        let name = file_name(other, self.random.below(FILES_PER_THREAD as u64) as usize);
        match self.read(&name) {
            Ok(bytes) => {
                self.report.succeeded += 1;
                let attempted = self.workload.attempted[other].load(Ordering::SeqCst);
                match identify(&bytes) {
                    Ok(version) if version.origin.starts_with(&format!("/t{other}/")) && version.number <= attempted => {}
                    Ok(version) => self.report.violation(format!("read {name} returned {version:?}, never written there")),
                    Err(why) => self.report.violation(format!("read {name}: {why}")),
                }
            }
            // Unlinked or renamed away by its owner meanwhile.
            Err(Errno::ENOENT) => {}
            Err(errno) => self.failed(&format!("read {name}"), errno),
        }
    }

    fn unlink(&mut self, name: &str) {
        let client = self.client.clone();
        match self.call("unlink", || client.unlink(name)) {
            Ok(()) => {
                self.report.succeeded += 1;
                let model = self.model(name);
                model.possible = BTreeSet::from([Seen::Absent]);
                model.note("unlinked".into());
            }
            Err(Errno::ENOENT) => {
                if !self.files[name].possible.contains(&Seen::Absent) {
                    self.violation(name, format!("unlink {name}: ENOENT, but it exists"));
                }
                self.model(name).note("unlink: ENOENT".into());
            }
            Err(errno) => {
                self.failed(&format!("unlink {name}"), errno);
                let model = self.model(name);
                model.possible.insert(Seen::Absent);
                model.note(format!("unlink failed ({errno:?})"));
            }
        }
    }

    fn rename_over(&mut self, from: &str, to: &str) {
        let client = self.client.clone();
        let mut moved = self.files[from].possible.clone();
        let from_may_be_absent = moved.remove(&Seen::Absent);
        match self.call("rename", || client.rename(from, to)) {
            Ok(()) => {
                self.report.succeeded += 1;
                if moved.is_empty() {
                    self.violation(from, format!("rename {from} {to} succeeded, but {from} does not exist"));
                }
                self.model(to).possible = moved;
                self.model(to).note(format!("{from} renamed over it"));
                self.model(from).possible = BTreeSet::from([Seen::Absent]);
                self.model(from).note(format!("renamed over {to}"));
            }
            Err(Errno::ENOENT) => {
                if !from_may_be_absent {
                    self.violation(from, format!("rename {from} {to}: ENOENT, but {from} exists"));
                }
                self.model(from).note(format!("rename to {to}: ENOENT"));
            }
            Err(errno) => {
                self.failed(&format!("rename {from} {to}"), errno);
                self.model(to).possible.extend(moved);
                self.model(to).note(format!("rename of {from} over it failed ({errno:?})"));
                self.model(from).possible.insert(Seen::Absent);
                self.model(from).note(format!("rename over {to} failed ({errno:?})"));
            }
        }
    }
}

/// Runs the workload on `clients` (one thread each) while `meanwhile` runs on this thread;
/// returns each thread's model and report.
fn run_workload(clients: &[Client], workload: &Workload, meanwhile: impl FnOnce()) -> Vec<(BTreeMap<String, FileModel>, Report)> {
    let setup = &clients[0];
    // Faults may have begun already: a failed mkdir is tried again (and may have succeeded
    // although its answer was lost).
    let deadline = Instant::now() + Duration::from_secs(15);
    for thread in 0..clients.len() {
        loop {
            match setup.mkdir(&format!("/t{thread}"), 0o755) {
                Ok(()) | Err(Errno::EEXIST) => break,
                Err(errno) if Instant::now() < deadline => eprintln!("making /t{thread} failed ({errno:?}); trying again"),
                Err(errno) => panic!("make the workload directories: {errno:?}"),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    std::thread::scope(|scope| {
        let threads: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(thread, client)| {
                let worker = Worker::new(thread, client.clone(), workload);
                scope.spawn(move || {
                    let worker = worker.run();
                    (worker.files, worker.report)
                })
            })
            .collect();
        // The workload threads stop at `workload.until` even if this panics.
        meanwhile();
        threads.into_iter().map(|thread| thread.join().expect("a workload thread panicked")).collect()
    })
}

/// Reads every file of the workload until it answers (within `limit`); each must hold a
/// state its model allows. Returns what is wrong.
fn check_after_faults(client: &Client, models: &[(BTreeMap<String, FileModel>, Report)], limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut wrong = Vec::new();
    for (name, model) in models.iter().flat_map(|(files, _)| files) {
        let seen = loop {
            match read_whole(client, name, &mut untimed) {
                Ok(bytes) => break identify(&bytes).map(Seen::Holds),
                Err(Errno::ENOENT) => break Ok(Seen::Absent),
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
                Err(errno) => break Err(format!("still failing with {errno:?}")),
            }
        };
        match seen {
            Ok(seen) if model.possible.contains(&seen) => {}
            Ok(seen) => wrong.push(format!("{name} holds {seen:?}, expected one of {:?}; history {:#?}", model.possible, model.history)),
            Err(why) => wrong.push(format!("{name}: {why}; expected one of {:?}; history {:#?}", model.possible, model.history)),
        }
    }
    wrong
}

fn summarize(reports: &[(BTreeMap<String, FileModel>, Report)]) -> (u64, Vec<String>) {
    let mut succeeded = 0;
    let mut violations = Vec::new();
    for (thread, (_, report)) in reports.iter().enumerate() {
        eprintln!(
            "thread {thread}: {} operations succeeded, slowest call {:?}, failed calls {:?}",
            report.succeeded, report.slowest, report.failed
        );
        succeeded += report.succeeded;
        violations.extend(report.violations.iter().map(|violation| format!("thread {thread}: {violation}")));
    }
    (succeeded, violations)
}

// ---------------------------------------------------------------------------------------
// Tests

/// Network faults happen in the first NETWORK_FAULTS of the run; a killed server is restarted
/// after them (its restart joins through a relay, which must then be healthy); the workload
/// goes on until WORKLOAD_TIME.
const NETWORK_FAULTS: Duration = Duration::from_secs(5);
const RESTART_AT: Duration = Duration::from_millis(5300);
const WORKLOAD_TIME: Duration = Duration::from_secs(7);

/// What happens to server processes during the mixed-fault run.
#[derive(Debug)]
enum ProcessEvent {
    Stop(usize),
    Continue(usize),
    Kill(usize),
    Restart(usize),
}

/// One server is stopped (SIGSTOP) for 0.5–1.5 s and another killed for a while, at seeded
/// times within the network faults.
fn process_schedule(random: &mut Random, servers: usize) -> Vec<(Duration, ProcessEvent)> {
    let stopped = random.below(servers as u64) as usize;
    let killed = (stopped + 1 + random.below(servers as u64 - 1) as usize) % servers;
    let stop_at = Duration::from_millis(500 + random.below(2500));
    let kill_at = Duration::from_millis(1000 + random.below(3000));
    let mut events = vec![
        (stop_at, ProcessEvent::Stop(stopped)),
        (stop_at + Duration::from_millis(500 + random.below(1000)), ProcessEvent::Continue(stopped)),
        (kill_at, ProcessEvent::Kill(killed)),
        (RESTART_AT, ProcessEvent::Restart(killed)),
    ];
    events.sort_by_key(|(at, _)| *at);
    events
}

fn play_process_events(cluster: &mut TestCluster, relays: &Relays, events: &[(Duration, ProcessEvent)], origin: Instant) {
    for (at, event) in events {
        std::thread::sleep((origin + *at).saturating_duration_since(Instant::now()));
        match *event {
            ProcessEvent::Stop(server) => cluster.signal(server, libc::SIGSTOP),
            ProcessEvent::Continue(server) => cluster.signal(server, libc::SIGCONT),
            ProcessEvent::Kill(server) => cluster.kill(server),
            ProcessEvent::Restart(server) => restart_behind_relay(cluster, relays, server),
        }
    }
}

#[test]
fn reads_stay_whole_and_failures_stay_bounded_while_links_and_servers_fail() {
    let _serial = one_at_a_time();
    let seed = fault_seed("reads_stay_whole_and_failures_stay_bounded_while_links_and_servers_fail");
    let (mut cluster, relays) = relayed_cluster(3, true, seed);
    let mut random = Random::new(seed);
    let count = std::env::var("RINGFS_FAULTS").ok().and_then(|text| text.parse().ok()).unwrap_or(10);
    let network = ScheduledFault::random_schedule(&mut random, 3, NETWORK_FAULTS, count, 50);
    let processes = process_schedule(&mut random, 3);
    eprintln!("network faults: {network:#?}\nprocess faults: {processes:?}");
    let first = relayed_client(&cluster, CLIENT_TIMEOUT, SMALL_CHUNKS);
    let clients = [first.clone(), first, relayed_client(&cluster, CLIENT_TIMEOUT, SMALL_CHUNKS)];

    let workload = Workload::new(clients.len(), CLIENT_TIMEOUT, false, WORKLOAD_TIME, seed);
    relays.play(&network, workload.started);
    let reports = run_workload(&clients, &workload, || play_process_events(&mut cluster, &relays, &processes, workload.started));
    relays.heal();

    let (succeeded, violations) = summarize(&reports);
    let wrong = check_after_faults(&relayed_client(&cluster, CLIENT_TIMEOUT, SMALL_CHUNKS), &reports, Duration::from_secs(6));
    assert!(
        violations.is_empty() && wrong.is_empty(),
        "seed {seed} ({count} network faults): {} violations under faults:\n{}\n\n{} files wrong once the faults ended (6 s to heal):\n{}\n\n{}",
        violations.len(),
        violations.join("\n"),
        wrong.len(),
        wrong.join("\n"),
        log_tails(&cluster, 3)
    );
    // (Harsher schedules may keep the cluster unusable for most of the run.)
    assert!(succeeded >= 30 || count > 10, "seed {seed}: only {succeeded} operations succeeded: the workload hardly ran");
}

/// What happens during the run in network namespaces, at its time.
#[derive(Debug)]
enum NetnsEvent {
    Cut(usize),
    Reconnect(usize),
    Process(ProcessEvent),
}

/// Servers in network namespaces of their own (real processes, real TCP over veth links
/// and a bridge) are cut off from everyone by taking their switch port down — some for
/// longer than the failure timeout, so they are declared dead and must rejoin — while one is
/// paused (SIGSTOP) and another killed and restarted on a new port; the self-checking
/// workload verifies every read, every call's time bound, and every file once the faults
/// end. `RINGFS_FAULTS` sets how many cuts (default 4).
#[test]
fn reads_stay_whole_while_servers_in_network_namespaces_are_cut_off_paused_and_killed() {
    let _serial = one_at_a_time();
    let Some(network) = common::netns::Network::create(3) else { return };
    let seed = fault_seed("reads_stay_whole_while_servers_in_network_namespaces_are_cut_off_paused_and_killed");
    let mut random = Random::new(seed);
    let cuts = std::env::var("RINGFS_FAULTS").ok().and_then(|text| text.parse().ok()).unwrap_or(4);
    let mut events: Vec<(Duration, NetnsEvent)> = Vec::new();
    for _ in 0..cuts {
        let server = random.below(3) as usize;
        let at = Duration::from_millis(300 + random.below(3500));
        // 0.2 to 2.2 s: shorter and longer than the failure timeout (1 s).
        let until = (at + Duration::from_millis(200 + random.below(2000))).min(NETWORK_FAULTS);
        events.push((at, NetnsEvent::Cut(server)));
        events.push((until, NetnsEvent::Reconnect(server)));
    }
    events.extend(process_schedule(&mut random, 3).into_iter().map(|(at, event)| (at, NetnsEvent::Process(event))));
    events.sort_by_key(|(at, _)| *at);
    eprintln!("events: {events:?}");

    network.in_client_namespace(|| {
        let options = ClusterOptions { dir_store: true, hosts: network.server_hosts(), ..ClusterOptions::new(3) };
        let mut cluster = TestCluster::with_options(options);
        for member in cluster.client().members().members {
            assert!(member.tcp_address.starts_with("10.201.0."), "{} is reached through the network: {}", member.name, member.tcp_address);
            assert!(member.unix_path.is_empty(), "no Unix socket bypasses the network");
        }
        let first = relayed_client(&cluster, CLIENT_TIMEOUT, SMALL_CHUNKS);
        let clients = [first.clone(), first, relayed_client(&cluster, CLIENT_TIMEOUT, SMALL_CHUNKS)];
        let workload = Workload::new(clients.len(), CLIENT_TIMEOUT, false, WORKLOAD_TIME, seed);
        let reports = run_workload(&clients, &workload, || {
            // Cuts overlapping on one server are counted, so it comes back only after the last.
            let mut cut_count = [0usize; 3];
            for (at, event) in &events {
                std::thread::sleep((workload.started + *at).saturating_duration_since(Instant::now()));
                match event {
                    NetnsEvent::Cut(server) => {
                        cut_count[*server] += 1;
                        network.cut(*server);
                    }
                    NetnsEvent::Reconnect(server) => {
                        cut_count[*server] -= 1;
                        if cut_count[*server] == 0 {
                            network.reconnect(*server);
                        }
                    }
                    NetnsEvent::Process(ProcessEvent::Stop(server)) => cluster.signal(*server, libc::SIGSTOP),
                    NetnsEvent::Process(ProcessEvent::Continue(server)) => cluster.signal(*server, libc::SIGCONT),
                    NetnsEvent::Process(ProcessEvent::Kill(server)) => cluster.kill(*server),
                    NetnsEvent::Process(ProcessEvent::Restart(server)) => cluster.restart(*server),
                }
            }
        });
        for server in 0..3 {
            network.reconnect(server);
        }
        let (succeeded, violations) = summarize(&reports);
        let wrong = check_after_faults(&relayed_client(&cluster, CLIENT_TIMEOUT, SMALL_CHUNKS), &reports, Duration::from_secs(6));
        assert!(
            violations.is_empty() && wrong.is_empty(),
            "seed {seed} ({cuts} cuts): {} violations under faults:\n{}\n\n{} files wrong once the faults ended (6 s to heal):\n{}\n\n{}",
            violations.len(),
            violations.join("\n"),
            wrong.len(),
            wrong.join("\n"),
            log_tails(&cluster, 3)
        );
        assert!(succeeded >= 30 || cuts > 10, "seed {seed}: only {succeeded} operations succeeded: the workload hardly ran");
    });
}

/// The last lines of every server's log, for failure messages.
fn log_tails(cluster: &TestCluster, servers: usize) -> String {
    (0..servers)
        .map(|server| {
            let log = cluster.log(server);
            let lines: Vec<&str> = log.lines().collect();
            format!("--- {} (last lines of its log)\n{}", cluster.name(server), lines[lines.len().saturating_sub(15)..].join("\n"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_server_partitioned_longer_than_the_failure_timeout_serves_again_soon_after_the_partition_heals() {
    let _serial = one_at_a_time();
    let seed = fault_seed("a_server_partitioned_longer_than_the_failure_timeout_serves_again_soon_after_the_partition_heals");
    let (cluster, relays) = relayed_cluster(3, false, seed);
    // One chunk per file: each file lives wholly on the server that holds its name.
    let client = relayed_client(&cluster, CLIENT_TIMEOUT, ringfs_client::DEFAULT_CHUNK_SIZE);
    let isolated = cluster.name(1).to_string();
    let paths: Vec<String> = (0..).map(|index| format!("/p{index}")).take(30).collect();
    let on_isolated: Vec<&String> = paths.iter().filter(|path| owner_of(&client, path) == isolated).collect();
    let elsewhere: Vec<&String> = paths.iter().filter(|path| owner_of(&client, path) != isolated).collect();
    assert!(!on_isolated.is_empty() && !elsewhere.is_empty(), "the paths spread over the servers");
    for (number, path) in paths.iter().enumerate() {
        write_version(&client, path, number as u64);
    }

    // The test servers declare a peer dead after 1 s of silence; the partition lasts 3 s.
    let partition = Duration::from_secs(3);
    relays.inject(1, Fault::Partition, partition);
    let partitioned = Instant::now();
    let answer = read_whole(&client, on_isolated[0], &mut untimed);
    assert!(matches!(answer, Err(Errno::EIO | Errno::ETIMEDOUT)), "a partitioned server's file: {answer:?}");
    assert!(partitioned.elapsed() <= 3 * CLIENT_TIMEOUT, "the failure took {:?}", partitioned.elapsed());
    while client.members().members.iter().any(|member| member.name == isolated && member.alive) {
        assert!(partitioned.elapsed() < partition, "seed {seed}: the partitioned server was not declared dead");
        let _ = client.stat("/");
        std::thread::sleep(Duration::from_millis(100));
    }
    for path in &elsewhere {
        let answer = read_version(&client, path);
        assert!(answer.is_ok(), "{path} stays readable while another server is cut off: {answer:?}");
    }

    std::thread::sleep(partition.saturating_sub(partitioned.elapsed()));
    let healed = Instant::now();
    loop {
        let stats = client.server_stats();
        let all_alive = client.members().members.iter().all(|member| member.alive);
        let readable = paths.iter().filter(|path| read_version(&client, path).is_ok()).count();
        if stats.as_ref().is_ok_and(|stats| stats.len() == 3) && all_alive && readable == paths.len() {
            break;
        }
        assert!(
            healed.elapsed() < Duration::from_secs(5),
            "seed {seed}: {:?} after the partition healed: stats {:?}, members {:?}, {readable} of {} files readable\n{}",
            healed.elapsed(),
            stats.map(|stats| stats.len()),
            client.members().members,
            paths.len(),
            cluster.log(1)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // It takes new files too.
    let new_path = (0..).map(|index| format!("/after{index}")).find(|path| owner_of(&client, path) == isolated).unwrap();
    write_version(&client, &new_path, 1000);
    assert_eq!(read_version(&client, &new_path).unwrap().number, 1000);
}

#[test]
fn a_workload_over_links_delayed_up_to_20_ms_completes_without_errors() {
    let _serial = one_at_a_time();
    let seed = fault_seed("a_workload_over_links_delayed_up_to_20_ms_completes_without_errors");
    let (cluster, relays) = relayed_cluster(3, false, seed);
    for server in 0..3 {
        relays.inject(server, Fault::Delay { max_ms: 20 }, Duration::from_secs(3600));
    }
    // Delays, not failures, are under test here: a deadline that never fires.
    let timeout = Duration::from_secs(10);
    let first = relayed_client(&cluster, timeout, SMALL_CHUNKS);
    let clients = [first.clone(), first, relayed_client(&cluster, timeout, SMALL_CHUNKS)];
    let workload = Workload::new(clients.len(), timeout, true, Duration::from_secs(4), seed);
    let reports = run_workload(&clients, &workload, || {});

    let (succeeded, violations) = summarize(&reports);
    assert!(violations.is_empty(), "seed {seed}: {} violations over delayed links:\n{}", violations.len(), violations.join("\n"));
    let failures: u64 = reports.iter().flat_map(|(_, report)| report.failed.values()).sum();
    assert_eq!(failures, 0, "seed {seed}: nothing fails when links are only slow");
    assert!(succeeded >= 30, "seed {seed}: only {succeeded} operations succeeded");
    for server in 0..3 {
        assert!(relays.forwarded_bytes(server) > 0, "the traffic of server {server} goes through its relay");
    }
    let wrong = check_after_faults(&clients[2], &reports, Duration::ZERO);
    assert!(wrong.is_empty(), "seed {seed}: files after the run:\n{}", wrong.join("\n"));
}

/// A request to a silent server fails at its deadline. The client then asks the other
/// servers for the member list (they may know the server is dead); that must not cost the
/// caller another deadline for every other server that is silent too.
#[test]
fn a_call_fails_within_three_deadlines_however_many_servers_are_silent() {
    let _serial = one_at_a_time();
    let seed = fault_seed("a_call_fails_within_three_deadlines_however_many_servers_are_silent");
    let servers = 5;
    let (cluster, relays) = relayed_cluster(servers, false, seed);
    let client = relayed_client(&cluster, CLIENT_TIMEOUT, ringfs_client::DEFAULT_CHUNK_SIZE);
    write_version(&client, "/probe", 1);
    client.server_stats().expect("a connection to every server");
    for server in 0..servers {
        relays.inject(server, Fault::Pause, Duration::from_secs(10));
    }
    let started = Instant::now();
    let answer = client.stat("/probe");
    let elapsed = started.elapsed();
    relays.heal();
    assert!(matches!(answer, Err(Errno::EIO | Errno::ETIMEDOUT)), "stat while every server is silent: {answer:?}");
    assert!(elapsed <= 3 * CLIENT_TIMEOUT, "stat failed after {elapsed:?}; the deadline is {CLIENT_TIMEOUT:?}");
}

/// Writes version `number` of `path` (as the workload names it) in one go.
fn write_version(client: &Client, path: &str, number: u64) {
    let bytes = contents(&Version { origin: path.to_string(), number });
    let fd = client.create(path, 0o644).unwrap();
    assert_eq!(client.pwrite(fd, &bytes, 0).unwrap(), bytes.len());
    client.close(fd).unwrap();
}

/// The version `path` holds (EIO if unreadable or not a whole version).
fn read_version(client: &Client, path: &str) -> Result<Version, Errno> {
    let bytes = read_whole(client, path, &mut untimed)?;
    identify(&bytes).map_err(|_| Errno::EIO)
}
