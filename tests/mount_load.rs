//! The FUSE mount under a mixed load: several processes writing new versions of files and
//! renaming them over names, overwriting side files in place, reading, unlinking, moving
//! names between directories and listing, all through one mount of a 3-server cluster.
//! Every read must return one complete version of a file (what tmpfs gives), never a short
//! or empty one. `RINGFS_MOUNT_LOAD_SECS` sets the duration (default 60; the soak runs longer).
//! Beside it, the cases the load found, made deterministic: a directory listed by the kernel
//! after files in it changed through the same mount.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::{Random, TestCluster, fuse_available};

const DIRECTORIES: u64 = 4;
const NAMES: u64 = 40;
const LARGEST_VERSION_BYTES: u64 = 300_000;

/// One well-mixed 64-bit value of `value` (splitmix64's finaliser).
fn mix(mut value: u64) -> u64 {
    value = (value ^ (value >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    value ^ (value >> 31)
}

/// The content of every version `length` bytes long: each byte depends on the length and its
/// offset, so a read that is cut short, padded or mixed from two versions of different
/// lengths does not match the content of its own length.
fn version_content(length: usize) -> Vec<u8> {
    let seed = mix(length as u64);
    let mut content = Vec::with_capacity(length + 8);
    for word in 0..length.div_ceil(8) {
        content.extend_from_slice(&mix(seed.wrapping_add(word as u64)).to_le_bytes());
    }
    content.truncate(length);
    content
}

/// What went wrong with one read: `None` if it is a whole version.
fn read_problem(bytes: &[u8]) -> Option<String> {
    if bytes.is_empty() {
        return Some("0 bytes".into());
    }
    (bytes != version_content(bytes.len()).as_slice()).then(|| format!("{} bytes that are no version of that length", bytes.len()))
}

/// What the workers counted.
#[derive(Default, Debug)]
struct Tally {
    reads: u64,
    wrong_reads: Vec<String>,
    unexpected_errors: Vec<String>,
    operations: u64,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.reads += other.reads;
        self.operations += other.operations;
        self.wrong_reads.extend(other.wrong_reads);
        self.unexpected_errors.extend(other.unexpected_errors);
    }
}

/// The errors an operation on a name may meet because another worker removed or moved it.
fn expected_error(error: &std::io::Error) -> bool {
    error.raw_os_error() == Some(libc::ENOENT)
}

struct Worker {
    root: PathBuf,
    index: usize,
    random: Random,
    temporaries: u64,
    tally: Tally,
    /// Also reads under locks, through memory maps, and cuts side files ([`Worker::other_step`]).
    with_locks_and_maps: bool,
}

impl Worker {
    fn name(&mut self) -> PathBuf {
        let directory = self.random.below(DIRECTORIES);
        let name = self.random.below(NAMES);
        self.root.join(format!("d{directory}/n{name}"))
    }

    fn note(&mut self, what: &str, path: &Path, result: std::io::Result<()>) {
        if let Err(error) = result
            && !expected_error(&error)
        {
            self.tally.unexpected_errors.push(format!("{what} {}: {error}", path.display()));
        }
    }

    /// A new version written to a temporary name beside `path`, then renamed over it.
    fn replace(&mut self, path: &Path) {
        let length = 1 + self.random.below(LARGEST_VERSION_BYTES) as usize;
        self.temporaries += 1;
        let temporary = path.with_file_name(format!(".tmp-{}-{}", self.index, self.temporaries));
        let result = std::fs::write(&temporary, version_content(length)).and_then(|()| std::fs::rename(&temporary, path));
        self.note("replace", path, result);
    }

    /// The side file `NAME.direct` overwritten in place (`O_TRUNC`).
    fn overwrite_in_place(&mut self, path: &Path) {
        let length = 1 + self.random.below(LARGEST_VERSION_BYTES) as usize;
        let side = path.with_extension("direct");
        let result = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&side)
            .and_then(|mut file| file.write_all(&version_content(length)));
        self.note("overwrite", &side, result);
    }

    fn read(&mut self, path: &Path) {
        let mut bytes = Vec::new();
        match std::fs::File::open(path).and_then(|mut file| file.read_to_end(&mut bytes)) {
            Ok(_) => {
                self.tally.reads += 1;
                if let Some(problem) = read_problem(&bytes) {
                    self.tally.wrong_reads.push(format!("{}: {problem}", path.display()));
                }
            }
            Err(error) => self.note("read", path, Err(error)),
        }
    }

    /// A whole read of `path` under an OFD lock (shared or exclusive, waiting for it).
    fn locked_read(&mut self, path: &Path) {
        use std::os::fd::AsRawFd;
        let exclusive = self.random.below(2) == 0;
        // (A write lock needs a descriptor open for writing.)
        let result = std::fs::OpenOptions::new().read(true).write(exclusive).open(path).and_then(|mut file| {
            let mut lock: libc::flock = unsafe { std::mem::zeroed() };
            lock.l_type = if exclusive { libc::F_WRLCK } else { libc::F_RDLCK } as libc::c_short;
            lock.l_whence = libc::SEEK_SET as libc::c_short;
            // SAFETY: an OFD lock on a descriptor this worker owns.
            if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLKW, &lock) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)?;
            Ok(bytes)
        });
        self.check_read(path, "locked read", result);
    }

    /// A whole read of `path` through a shared memory map.
    fn mapped_read(&mut self, path: &Path) {
        use std::os::fd::AsRawFd;
        let result = std::fs::File::open(path).and_then(|file| {
            let length = file.metadata()?.len() as usize;
            if length == 0 {
                return Ok(Vec::new());
            }
            // SAFETY: a read-only map of a file this worker opened, copied out and unmapped;
            // names are only ever renamed over, never cut, so the map stays backed.
            unsafe {
                let map = libc::mmap(std::ptr::null_mut(), length, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0);
                if map == libc::MAP_FAILED {
                    return Err(std::io::Error::last_os_error());
                }
                let bytes = std::slice::from_raw_parts(map as *const u8, length).to_vec();
                libc::munmap(map, length);
                Ok(bytes)
            }
        });
        self.check_read(path, "mapped read", result);
    }

    fn check_read(&mut self, path: &Path, what: &str, result: std::io::Result<Vec<u8>>) {
        match result {
            Ok(bytes) => {
                self.tally.reads += 1;
                if let Some(problem) = read_problem(&bytes) {
                    self.tally.wrong_reads.push(format!("{what} {}: {problem}", path.display()));
                }
            }
            Err(error) => self.note(what, path, Err(error)),
        }
    }

    /// One of the operations only the load with locks and maps has.
    fn other_step(&mut self, path: &Path) {
        match self.random.below(3) {
            0 => self.locked_read(path),
            1 => self.mapped_read(path),
            _ => {
                let side = path.with_extension("direct");
                let length = self.random.below(LARGEST_VERSION_BYTES);
                let result = std::fs::OpenOptions::new().write(true).open(&side).and_then(|file| file.set_len(length));
                self.note("truncate", &side, result);
            }
        }
    }

    fn step(&mut self) {
        let path = self.name();
        if self.with_locks_and_maps && self.random.below(4) == 0 {
            self.other_step(&path);
            self.tally.operations += 1;
            return;
        }
        let choice = self.random.below(100);
        match choice {
            0..35 => self.replace(&path),
            35..45 => self.overwrite_in_place(&path),
            45..80 => self.read(&path),
            80..88 => self.note("unlink", &path, std::fs::remove_file(&path)),
            88..95 => {
                let to = self.name();
                self.note("rename", &path, std::fs::rename(&path, &to));
            }
            _ => {
                let directory = path.parent().expect("a name has a directory").to_path_buf();
                let listed = std::fs::read_dir(&directory).and_then(|mut entries| entries.try_for_each(|entry| entry.map(|_| ())));
                self.note("list", &directory, listed);
            }
        }
        self.tally.operations += 1;
    }
}

/// Runs `workers` workers on the tree under `root` for `duration` and adds up what they saw.
/// Panics if a worker is still in an operation 60 s after the load stopped (a hang).
fn run_mixed_load(root: &Path, workers: usize, duration: Duration, seed: u64, with_locks_and_maps: bool) -> Tally {
    run_mixed_load_through(&[root.to_path_buf()], workers, duration, seed, with_locks_and_maps)
}

/// [`run_mixed_load`] on one tree seen under several `roots` (the same directory through
/// several mounts, as on several nodes): worker `i` works under `roots[i % roots.len()]`.
fn run_mixed_load_through(roots: &[PathBuf], workers: usize, duration: Duration, seed: u64, with_locks_and_maps: bool) -> Tally {
    for directory in 0..DIRECTORIES {
        std::fs::create_dir_all(roots[0].join(format!("d{directory}"))).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(workers + 1));
    let threads: Vec<_> = (0..workers)
        .map(|index| {
            let (stop, start) = (stop.clone(), start.clone());
            let mut worker = Worker {
                root: roots[index % roots.len()].clone(),
                index,
                random: Random::new(mix(seed + index as u64)),
                temporaries: 0,
                tally: Tally::default(),
                with_locks_and_maps,
            };
            std::thread::spawn(move || {
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    worker.step();
                }
                worker.tally
            })
        })
        .collect();
    start.wait();
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    let stopped = std::time::Instant::now();
    while !threads.iter().all(|thread| thread.is_finished()) {
        let busy = threads.iter().filter(|thread| !thread.is_finished()).count();
        assert!(
            stopped.elapsed() < Duration::from_secs(60),
            "seed {seed}: {busy} workers still in an operation 60 s after the load stopped"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut tally = Tally::default();
    for thread in threads {
        tally.add(thread.join().expect("a worker panicked"));
    }
    tally
}

fn load_seconds() -> u64 {
    std::env::var("RINGFS_MOUNT_LOAD_SECS").ok().and_then(|text| text.parse().ok()).unwrap_or(60)
}

fn seed() -> u64 {
    std::env::var("RINGFS_TEST_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(|| ringfs_rpc::memory::random_u64() % 100_000)
}

fn assert_whole(tally: &Tally, seed: u64) {
    eprintln!(
        "seed {seed}: {} operations, {} reads, {} wrong, {} unexpected errors",
        tally.operations,
        tally.reads,
        tally.wrong_reads.len(),
        tally.unexpected_errors.len()
    );
    assert!(tally.reads > 100, "the load read files ({tally:?})");
    assert!(tally.wrong_reads.is_empty(), "seed {seed}: reads that are no whole version: {:?}", tally.wrong_reads);
    assert!(tally.unexpected_errors.is_empty(), "seed {seed}: unexpected errors: {:?}", tally.unexpected_errors);
}

#[test]
fn the_checker_accepts_whole_versions_and_rejects_cut_ones() {
    let content = version_content(1000);
    assert_eq!(read_problem(&content), None);
    assert!(read_problem(&[]).is_some());
    assert!(read_problem(&content[..999]).is_some());
    let mut mixed = version_content(1000);
    mixed[500..].copy_from_slice(&version_content(2000)[500..1000]);
    assert!(read_problem(&mixed).is_some());
}

#[test]
fn eight_workers_mixing_renames_overwrites_reads_unlinks_and_listings_read_only_whole_versions() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let mount = cluster.mount(&[]);
    let seed = seed();
    let tally = run_mixed_load(&mount.path("load"), 8, Duration::from_secs(load_seconds()), seed, false);
    assert_whole(&tally, seed);
}

/// The same load through two mounts of one cluster at once (half the workers on each, as
/// on two nodes): a mount may show another's change up to a watch interval late, so a read
/// may find an older version or none — but never a cut or mixed one, and never an error but
/// ENOENT. Beside it, one more thread per mount appends records to a shared log: each
/// record lands once, whole.
#[test]
fn eight_workers_on_two_mounts_read_only_whole_versions() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let (one, other) = (cluster.mount(&[]), cluster.mount(&[]));
    let seed = seed();
    let roots = [one.path("load"), other.path("load")];
    std::fs::create_dir_all(&roots[0]).unwrap();
    let stop = AtomicBool::new(false);
    let (tally, appended) = std::thread::scope(|scope| {
        let appenders: Vec<_> = roots
            .iter()
            .enumerate()
            .map(|(node, root)| {
                let (log, stop) = (root.join("log"), &stop);
                scope.spawn(move || {
                    let mut records = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
                        file.write_all(format!("node {node} record {records:06}\n").as_bytes()).unwrap();
                        records += 1;
                    }
                    records
                })
            })
            .collect();
        let tally = run_mixed_load_through(&roots, 8, Duration::from_secs(load_seconds() / 2), seed, false);
        stop.store(true, Ordering::Relaxed);
        (tally, appenders.into_iter().map(|appender| appender.join().unwrap()).collect::<Vec<usize>>())
    });
    assert_whole(&tally, seed);
    let log = std::fs::read_to_string(roots[1].join("log")).unwrap();
    for (node, records) in appended.iter().enumerate() {
        let expected: Vec<String> = (0..*records).map(|record| format!("node {node} record {record:06}")).collect();
        let found: Vec<&str> = log.lines().filter(|line| line.starts_with(&format!("node {node} "))).collect();
        if found != expected {
            let present: std::collections::HashSet<&str> = found.iter().copied().collect();
            let missing = expected.iter().filter(|record| !present.contains(record.as_str())).count();
            panic!(
                "seed {seed}: node {node} appended {records} records; the log holds {} of its lines, {missing} of its records missing",
                found.len()
            );
        }
    }
    assert_eq!(log.lines().count(), appended.iter().sum::<usize>(), "seed {seed}: torn records in the log");
}

/// The pattern a job uses to publish a file (write it under a temporary name, rename it over
/// the real one) on one node, beside another node that lists the directory and reads the
/// names: every read there is one whole version. The listings hand that node's kernel the
/// temporary files' attributes while they are still empty; a listing answered before a
/// file was written can reach the kernel after a lookup of the renamed name started, and
/// the kernel then keeps the listing's size 0 and drops the lookup's (its attribute
/// versions order answers by when their requests started). Before the mount followed such
/// answers with a drop, about 1 read in 200 here returned 0 bytes.
#[test]
fn files_renamed_over_names_on_one_mount_read_whole_on_another_that_lists_them() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let (writing, reading) = (cluster.mount(&[]), cluster.mount(&[]));
    let (written, read) = (writing.path("published"), reading.path("published"));
    std::fs::create_dir(&written).unwrap();
    let duration = Duration::from_secs((load_seconds() / 4).max(5));
    let seed = seed();
    let stop = AtomicBool::new(false);
    let name = |random: &mut Random| format!("n{}", random.below(4));
    let tally = std::thread::scope(|scope| {
        for writer in 0..2u64 {
            let (written, stop) = (&written, &stop);
            scope.spawn(move || {
                let mut random = Random::new(mix(seed + writer));
                let mut count = 0;
                while !stop.load(Ordering::Relaxed) {
                    count += 1;
                    let temporary = written.join(format!(".tmp-{writer}-{count}"));
                    let mut file = std::fs::File::create(&temporary).unwrap();
                    // (Empty for a moment, as a program that computes what it writes leaves it.)
                    std::thread::sleep(Duration::from_micros(random.below(3000)));
                    file.write_all(&version_content(1 + random.below(LARGEST_VERSION_BYTES) as usize)).unwrap();
                    drop(file);
                    std::fs::rename(&temporary, written.join(name(&mut random))).unwrap();
                }
            });
        }
        for _ in 0..2 {
            let (read, stop) = (&read, &stop);
            scope.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // (Names vanish while they are listed: only the listing itself matters.)
                    if let Ok(entries) = std::fs::read_dir(read) {
                        entries.for_each(drop);
                    }
                }
            });
        }
        let readers: Vec<_> = (0..2u64)
            .map(|reader| {
                let (read, stop) = (&read, &stop);
                scope.spawn(move || {
                    let mut random = Random::new(mix(seed + 100 + reader));
                    let mut tally = Tally::default();
                    while !stop.load(Ordering::Relaxed) {
                        let path = read.join(name(&mut random));
                        match std::fs::read(&path) {
                            Ok(bytes) => {
                                tally.reads += 1;
                                if let Some(problem) = read_problem(&bytes) {
                                    tally.wrong_reads.push(format!("{}: {problem}", path.display()));
                                }
                            }
                            Err(error) if expected_error(&error) => {}
                            Err(error) => tally.unexpected_errors.push(format!("read {}: {error}", path.display())),
                        }
                        tally.operations += 1;
                    }
                    tally
                })
            })
            .collect();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        let mut tally = Tally::default();
        for reader in readers {
            tally.add(reader.join().expect("a reader panicked"));
        }
        tally
    });
    assert_whole(&tally, seed);
}

/// The load with reads under OFD locks, reads through memory maps and cuts of side files
/// beside it (a quarter of the operations), for a third of the load's time: whole versions
/// only, and no worker hangs (lock grants drop the kernel's pages of a file while other
/// workers read it: `locks.rs: reads_beside_lock_grants_keep_going`).
#[test]
fn eight_workers_mixing_in_locked_and_mapped_reads_read_only_whole_versions_and_never_hang() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let mount = cluster.mount(&[]);
    let seed = seed();
    let tally = run_mixed_load(&mount.path("load"), 8, Duration::from_secs(load_seconds().div_ceil(3)), seed, true);
    assert_whole(&tally, seed);
}

/// The same load on the directory `RINGFS_MOUNT_LOAD_DIR` names (a mount of any build, for
/// measurements), or for 10 s on the local temporary directory (which checks the checker).
#[test]
#[ignore = "a tool: the load on a directory of your choice"]
fn the_mixed_load_on_a_given_directory_reads_only_whole_versions() {
    let given = std::env::var_os("RINGFS_MOUNT_LOAD_DIR").map(PathBuf::from);
    let scratch = common::scratch_dir("mixed-load-local");
    let root = given.clone().unwrap_or_else(|| scratch.to_path_buf()).join("load");
    let seconds = if given.is_some() { load_seconds() } else { load_seconds().min(10) };
    let seed = seed();
    let tally = run_mixed_load(&root, 8, Duration::from_secs(seconds), seed, given.is_some());
    let _ = std::fs::remove_dir_all(&root);
    assert_whole(&tally, seed);
}

#[test]
fn a_directory_opened_before_a_file_was_written_and_renamed_does_not_shrink_it_when_read() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let mount = cluster.mount(&[]);
    let directory = mount.path("dir");
    std::fs::create_dir(&directory).unwrap();
    let (temporary, name) = (directory.join("temporary"), directory.join("name"));
    std::fs::write(&temporary, b"").unwrap();
    // The directory is opened (and listed by the mount) while the file is still empty ...
    let mut listing = std::fs::read_dir(&directory).unwrap();
    // ... then written and renamed through the same mount before the listing is read.
    let content = version_content(5000);
    std::fs::write(&temporary, &content).unwrap();
    std::fs::rename(&temporary, &name).unwrap();
    assert_eq!(std::fs::metadata(&name).unwrap().len(), 5000);
    let names: Vec<_> = listing.by_ref().map(|entry| entry.unwrap().file_name()).collect();
    assert!(!names.is_empty());
    assert_eq!(std::fs::metadata(&name).unwrap().len(), 5000, "the size the kernel holds after the listing");
    let read = std::fs::read(&name).unwrap();
    assert_eq!(read_problem(&read), None, "the file read back whole");
}

#[test]
fn a_directory_opened_before_a_file_was_overwritten_in_place_does_not_change_its_size_when_read() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let mount = cluster.mount(&[]);
    let directory = mount.path("dir");
    std::fs::create_dir(&directory).unwrap();
    let name = directory.join("name");
    std::fs::write(&name, version_content(100)).unwrap();
    let mut listing = std::fs::read_dir(&directory).unwrap();
    std::fs::write(&name, version_content(7000)).unwrap();
    let names: Vec<_> = listing.by_ref().map(|entry| entry.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1);
    let read = std::fs::read(&name).unwrap();
    assert_eq!((read.len(), read_problem(&read)), (7000, None), "the file read back whole");
}

/// Lists `directory` through the mount: its names, each as often as listed.
fn listed_names(directory: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(directory).unwrap().map(|entry| entry.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

#[test]
fn a_listing_paged_while_names_come_and_go_lists_every_lasting_name_once() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let client = cluster.client();
    client.mkdir("/big", 0o755).unwrap();
    let lasting: Vec<String> = (0..3000).map(|index| format!("lasting-{index:05}")).collect();
    for name in &lasting {
        client.close(client.create(&format!("/big/{name}"), 0o644).unwrap()).unwrap();
    }
    let mount = cluster.mount(&[]);
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (stop, directory) = (stop.clone(), mount.path("big"));
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) && rounds < 100_000 {
                let name = directory.join(format!("churn-{}", rounds % 50));
                let _ = if rounds.is_multiple_of(2) { std::fs::write(&name, b"x") } else { std::fs::remove_file(&name) };
                rounds += 1;
            }
            rounds
        })
    };
    for _ in 0..5 {
        let listed: Vec<String> = listed_names(&mount.path("big")).into_iter().filter(|name| name.starts_with("lasting-")).collect();
        assert_eq!(listed, lasting, "every lasting name once, in a listing of several pages");
    }
    stop.store(true, Ordering::Relaxed);
    assert!(churn.join().unwrap() > 0);
}

#[test]
fn a_cached_directory_lists_backend_and_ringfs_names_once_through_the_mount() {
    if !fuse_available() {
        return;
    }
    let backend = common::scratch_dir("mount-load-backend");
    std::fs::create_dir(backend.join("dir")).unwrap();
    for index in 0..700 {
        std::fs::write(backend.join(format!("dir/backend-{index:04}")), b"old").unwrap();
    }
    let mut options = common::ClusterOptions::new(3);
    options.extra_args = ["--backend", backend.to_str().unwrap(), "--flush", "none"].map(String::from).to_vec();
    let cluster = TestCluster::with_options(options);
    let mount = cluster.mount(&[]);
    let directory = mount.path("dir");
    let mut expected = Vec::new();
    for index in 0..700 {
        let name = format!("backend-{index:04}");
        if index % 7 == 0 {
            std::fs::remove_file(directory.join(&name)).unwrap();
        } else {
            expected.push(name);
        }
        let name = format!("ringfs-{index:04}");
        std::fs::write(directory.join(&name), b"new").unwrap();
        expected.push(name);
    }
    // Loaded from the backend and changed in ringfs: listed once.
    std::fs::write(directory.join("backend-0001"), b"changed").unwrap();
    expected.sort();
    assert_eq!(listed_names(&directory), expected);
    let _ = std::fs::remove_dir_all(&backend);
}

/// The requests the servers have answered so far, all of them together.
fn server_requests(client: &ringfs_client::Client) -> u64 {
    client.server_stats().unwrap().iter().map(|stats| stats.requests).sum()
}

fn get_xattr(path: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let (path, name) = (std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap(), std::ffi::CString::new(name).unwrap());
    let mut value = vec![0u8; 256];
    // SAFETY: NUL-terminated strings and a buffer of the length given.
    let length = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
    if length < 0 {
        return Err(std::io::Error::last_os_error());
    }
    value.truncate(length as usize);
    Ok(value)
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let (path, name) = (std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap(), std::ffi::CString::new(name).unwrap());
    // SAFETY: NUL-terminated strings and a value of the length given.
    let outcome = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if outcome < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

#[test]
fn writes_through_the_mount_ask_the_servers_nothing_but_the_writes() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let client = cluster.client();
    let mount = cluster.mount(&[]);
    let mut file = std::fs::File::create(mount.path("file")).unwrap();
    let before = server_requests(&client);
    for _ in 0..200 {
        file.write_all(&[7u8; 1000]).unwrap();
    }
    let asked = server_requests(&client) - before;
    // One request per write (the kernel sends two for a write across a page boundary), not
    // one more for the `security.capability` question the kernel asks before each.
    assert!(asked < 400, "{asked} requests for 200 writes");
    drop(file);
    assert_eq!(std::fs::read(mount.path("file")).unwrap(), vec![7u8; 200_000]);
}

/// Files some client still has open though their last name went, all servers together.
fn open_unlinked(client: &ringfs_client::Client) -> u64 {
    client.server_stats().unwrap().iter().map(|stats| stats.open_unlinked).sum()
}

#[test]
fn opens_of_files_the_mount_keeps_ask_no_server_and_files_removed_through_it_are_let_go() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let client = cluster.client();
    // Without the watch, the kernel keeps what it caches for the minute: only opens and
    // reads could ask the servers.
    let mount = cluster.mount(&["--watch-ms", "0", "--attr-timeout-ms", "60000"]);
    let path = mount.path("file");
    std::fs::write(&path, b"first version").unwrap();
    let before = server_requests(&client);
    for _ in 0..50 {
        // (Not `fs::read`: its `fstat` after a read asks for the atime the read changed.)
        let mut bytes = [0u8; 64];
        let count = std::fs::File::open(&path).and_then(|mut file| file.read(&mut bytes)).unwrap();
        assert_eq!(&bytes[..count], b"first version");
    }
    let asked = server_requests(&client) - before;
    // One read each (the kernel drops a file's pages at open); the opens are made beside
    // the descriptor the mount kept from the create (100 before).
    assert!(asked < 75, "{asked} requests for 50 opens and reads");

    // Removed by another client: the kernel still holds the name (no watch), and the file
    // is kept for it until it forgets the inode.
    client.unlink("/file").unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"first version", "opened through the inode the kernel holds");
    assert_eq!(open_unlinked(&client), 1);

    // Removed through the mount: the kernel forgets them, and the mount lets them go.
    for index in 0..20 {
        let path = mount.path(&format!("removed-{index}"));
        std::fs::write(&path, b"x").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"x");
        std::fs::remove_file(&path).unwrap();
    }
    assert!(within_two_seconds(|| open_unlinked(&client) == 1), "{} files kept open", open_unlinked(&client));

    // Written through a descriptor opened beside the kept one, truncated at open.
    let path = mount.path("rewritten");
    std::fs::write(&path, b"a longer first version").unwrap();
    std::fs::write(&path, b"second").unwrap();
    let fd = client.open("/rewritten", ringfs_client::OpenFlags::READ, 0).unwrap();
    let mut bytes = [0u8; 64];
    let count = client.pread(fd, &mut bytes, 0).unwrap();
    client.close(fd).unwrap();
    assert_eq!(&bytes[..count], b"second", "as another client reads it");
}

#[test]
fn extended_attributes_set_elsewhere_show_through_the_mount_once_attributes_expire() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let client = cluster.client();
    let mount = cluster.mount(&["--attr-timeout-ms", "300"]);
    let path = mount.path("file");
    std::fs::write(&path, b"x").unwrap();
    assert_eq!(get_xattr(&path, "user.a").unwrap_err().raw_os_error(), Some(libc::ENODATA));
    client.set_xattr("/file", "user.a", b"set elsewhere", 0).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(get_xattr(&path, "user.a").unwrap(), b"set elsewhere", "seen once the attributes expired");
    let other = mount.path("other");
    std::fs::write(&other, b"y").unwrap();
    assert_eq!(get_xattr(&other, "user.b").unwrap_err().raw_os_error(), Some(libc::ENODATA));
    set_xattr(&other, "user.b", b"set here").unwrap();
    assert_eq!(get_xattr(&other, "user.b").unwrap(), b"set here", "seen at once through the mount that set it");
}

#[test]
fn a_directory_shows_this_mounts_creates_and_removals_at_once() {
    if !fuse_available() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let cluster = TestCluster::start(2);
    let mount = cluster.mount(&["--attr-timeout-ms", "60000"]);
    let directory = mount.path("dir");
    std::fs::create_dir(&directory).unwrap();
    let times = |path: &Path| {
        let metadata = std::fs::metadata(path).unwrap();
        (
            metadata.mtime() * 1_000_000_000 + metadata.mtime_nsec(),
            metadata.ctime() * 1_000_000_000 + metadata.ctime_nsec(),
            metadata.nlink(),
        )
    };
    let mut last = times(&directory);
    for step in 0..6 {
        std::thread::sleep(Duration::from_millis(2));
        let name = directory.join(format!("n{}", step / 3));
        match step % 3 {
            0 => std::fs::write(&name, b"x").unwrap(),
            1 => {
                std::fs::remove_file(&name).unwrap();
                std::fs::create_dir(&name).unwrap();
            }
            _ => std::fs::remove_dir(&name).unwrap(),
        }
        let now = times(&directory);
        assert!(now.0 > last.0 && now.1 > last.1, "step {step}: the times moved ({last:?} -> {now:?})");
        assert_eq!(now.2, if step % 3 == 1 { 3 } else { 2 }, "step {step}: subdirectories counted");
        last = now;
    }
    // What the mount showed is what the servers hold.
    let client = cluster.client();
    let stat = client.stat("/dir").unwrap();
    assert!(stat.mtime_ns >= last.0 && stat.nlink as u64 == last.2);
}

/// Waits (at most 2 s) until `check` holds; whether it did.
fn within_two_seconds(mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

/// With the writeback cache the kernel keeps the size of a file it holds itself and takes
/// no other: a file this mount wrote, then another node appended to, stayed at its old size
/// here (and read short) until the kernel let the inode go. The watch drops the file's name
/// with its attributes, so that once it is not open here the next lookup brings a fresh
/// inode.
#[test]
fn a_file_appended_elsewhere_shows_its_new_size_through_a_writeback_cache_mount_once_closed_there() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let (caching, other) = (cluster.mount(&["--writeback-cache"]), cluster.mount(&[]));
    std::fs::write(caching.path("f"), version_content(100)).unwrap();
    assert_eq!(std::fs::metadata(other.path("f")).unwrap().len(), 100);
    std::fs::OpenOptions::new().append(true).open(other.path("f")).unwrap().write_all(&[7; 50]).unwrap();
    let seen = within_two_seconds(|| std::fs::metadata(caching.path("f")).map(|metadata| metadata.len()).ok() == Some(150));
    assert!(seen, "the writeback-cache mount still says {:?} bytes", std::fs::metadata(caching.path("f")).map(|metadata| metadata.len()));
    assert_eq!(std::fs::read(caching.path("f")).unwrap().len(), 150, "read whole");
}

#[test]
fn changes_made_elsewhere_show_through_a_mount_that_caches_for_a_minute() {
    if !fuse_available() {
        return;
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let cluster = TestCluster::start(3);
    let client = cluster.client();
    let mount = cluster.mount(&["--attr-timeout-ms", "60000", "--watch-ms", "100"]);
    let (file, missing, directory) = (mount.path("file"), mount.path("missing"), mount.path("dir"));
    std::fs::write(&file, b"first").unwrap();
    std::fs::create_dir(&directory).unwrap();
    std::fs::write(directory.join("inside"), b"x").unwrap();
    // The kernel caches all of it now (and that `missing` is missing).
    assert_eq!(std::fs::read(&file).unwrap(), b"first");
    assert!(!missing.exists());
    assert!(directory.join("inside").exists());
    // Another client changes each of them.
    let fd = client.open("/file", ringfs_client::OpenFlags::WRITE, 0).unwrap();
    client.pwrite(fd, b"second, longer", 0).unwrap();
    client.close(fd).unwrap();
    client.close(client.create("/missing", 0o600).unwrap()).unwrap();
    client.rename("/dir", "/moved").unwrap();
    client.chmod("/moved/inside", 0o640).unwrap();
    client.set_xattr("/moved/inside", "user.k", b"v", 0).unwrap();
    assert!(within_two_seconds(|| std::fs::read(&file).is_ok_and(|bytes| bytes == b"second, longer")), "new bytes and size");
    assert!(within_two_seconds(|| missing.exists()), "a name created elsewhere");
    assert!(within_two_seconds(|| !directory.exists() && mount.path("moved/inside").exists()), "a directory renamed elsewhere");
    let inside = mount.path("moved/inside");
    assert!(within_two_seconds(|| std::fs::metadata(&inside).is_ok_and(|metadata| metadata.permissions().mode() & 0o777 == 0o640)));
    assert!(within_two_seconds(|| get_xattr(&inside, "user.k").is_ok_and(|value| value == b"v")));
    client.unlink("/file").unwrap();
    assert!(within_two_seconds(|| !file.exists()), "a name removed elsewhere");
    // What this mount does itself shows at once, and stays cached.
    std::fs::write(mount.path("own"), b"mine").unwrap();
    assert_eq!(std::fs::metadata(mount.path("own")).unwrap().size(), 4);
}

/// `tail -f` through a mount of a file another node appends to (through its own mount):
/// every append shows, the third and later too. The servers' change logs note a run of
/// writes to one file once; a write after the mount had read that note was not noted
/// again, so the mount showed the file as it was for as long as the kernel kept its
/// attributes (60 s). (Opening the file again between appends hid it: something else was
/// noted in between.)
#[test]
fn appends_made_elsewhere_show_one_after_another() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let mount = cluster.mount(&[]);
    // The other node: appends through its own mount (`echo >> log`).
    let elsewhere = cluster.mount(&[]);
    let log = mount.path("log");
    std::fs::write(&log, b"first\n").unwrap();
    // As `tail -f`: the file stays open, and its size is asked through the open descriptor.
    let tail = std::fs::File::open(&log).unwrap();
    let mut expected = b"first\n".to_vec();
    for line in 1..=4 {
        let text = format!("line {line}\n");
        let mut appending = std::fs::OpenOptions::new().append(true).open(elsewhere.path("log")).unwrap();
        std::io::Write::write_all(&mut appending, text.as_bytes()).unwrap();
        drop(appending);
        expected.extend_from_slice(text.as_bytes());
        let size = || tail.metadata().map(|metadata| metadata.len()).unwrap_or(0);
        assert!(within_two_seconds(|| size() == expected.len() as u64), "append {line} not seen through the mount: its size is {}", size());
        // (The lines come a moment apart, as a program's log lines do.)
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(std::fs::read(&log).unwrap(), expected);
}

/// A mount whose job is busy elsewhere (computing) costs the servers little: it asks a
/// server with nothing new less and less often, down to once a second (it asked every
/// server every 100 ms: with a mount on every node of a 1,000-node job, 10,000 requests a
/// second at every server for nothing), and a change made elsewhere after the quiet while
/// still shows within two seconds.
#[test]
fn an_idle_mount_asks_the_servers_about_once_a_second_and_still_sees_changes() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let client = cluster.client();
    let window = Duration::from_secs(3);
    // The servers' own traffic (heartbeats) over the same time, before any mount.
    let before = server_requests(&client);
    std::thread::sleep(window);
    let without_mount = server_requests(&client) - before;
    let mount = cluster.mount(&["--attr-timeout-ms", "60000", "--watch-ms", "100"]);
    let missing = mount.path("missing");
    assert!(!missing.exists());
    std::thread::sleep(Duration::from_secs(3));
    let before = server_requests(&client);
    std::thread::sleep(window);
    let with_mount = server_requests(&client) - before;
    let watch_requests = with_mount.saturating_sub(without_mount);
    // Every 100 ms: 90 requests to 3 servers in 3 s; about once a second: 9.
    assert!(watch_requests < 30, "an idle mount asked the servers {watch_requests} times in 3 s ({with_mount} against {without_mount})");
    client.close(client.create("/missing", 0o600).unwrap()).unwrap();
    assert!(within_two_seconds(|| missing.exists()), "a name created elsewhere after a quiet while");
}

/// A mount asks each server with news every `--watch-ms`, but no more questions a second
/// of all servers together than `--watch-budget`: with a mount on each of N nodes, every
/// server answers at most that many a second, however large N is (without the budget:
/// 10 N a second while the job works). Here 4 servers and a budget of 4: each is asked
/// about once a second, although every one of them has news all the time.
#[test]
fn a_busy_mount_asks_the_servers_within_its_budget_and_still_sees_changes() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(4);
    let client = cluster.client();
    // Two files with a chunk on each server (placement is modular: consecutive chunks on
    // consecutive servers), written in turn: every server has news all the time (a run of
    // writes to one file is noted once).
    let fds: Vec<_> = ["/busy0", "/busy1"]
        .iter()
        .map(|path| client.open(path, ringfs_client::OpenFlags::WRITE | ringfs_client::OpenFlags::CREATE, 0o644).unwrap())
        .collect();
    let chunk = u64::from(client.stat("/busy0").unwrap().chunk_size);
    let writes = |count: u64| {
        for index in 0..count {
            client.pwrite(fds[(index / 4 % 2) as usize], &[index as u8; 4096], (index % 4) * chunk).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    writes(4);
    let count = 400;
    // The writes' own requests, and the servers' heartbeats, before any mount.
    let before = server_requests(&client);
    writes(count);
    let without_mount = server_requests(&client) - before;
    let mount = cluster.mount(&["--attr-timeout-ms", "60000", "--watch-ms", "100", "--watch-budget", "4"]);
    let missing = mount.path("missing");
    assert!(!missing.exists());
    let before = server_requests(&client);
    let started = std::time::Instant::now();
    writes(count);
    let elapsed = started.elapsed().as_secs_f64();
    let watch_requests = (server_requests(&client) - before).saturating_sub(without_mount);
    eprintln!("a busy mount with a budget of 4 a second: {watch_requests} questions in {elapsed:.1} s");
    // Every 100 ms: 40 questions a second; within the budget: 4.
    assert!(
        (watch_requests as f64) < 12.0 * elapsed + 8.0,
        "a busy mount asked the servers {watch_requests} times in {elapsed:.1} s, with a budget of 4 a second"
    );
    for fd in fds {
        client.close(fd).unwrap();
    }
    client.close(client.create("/missing", 0o600).unwrap()).unwrap();
    assert!(within_two_seconds(|| missing.exists()), "a name created elsewhere shows within about a second");
}

#[test]
fn without_watching_the_kernel_keeps_what_it_cached_until_it_expires() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let client = cluster.client();
    let mount = cluster.mount(&["--attr-timeout-ms", "60000", "--watch-ms", "0"]);
    let missing = mount.path("missing");
    assert!(!missing.exists());
    client.close(client.create("/missing", 0o600).unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // (This is what the watch is for: the test checks that it is what makes the difference.)
    assert!(!missing.exists(), "the kernel still remembers the name as missing");
}

#[test]
fn a_directory_made_through_the_mount_knows_its_missing_names_until_changed_elsewhere() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let client = cluster.client();
    let mount = cluster.mount(&[]);
    let directory = mount.path("made");
    std::fs::create_dir(&directory).unwrap();
    std::fs::write(directory.join("present"), b"x").unwrap();
    let before = server_requests(&client);
    for index in 0..100 {
        assert!(!directory.join(format!("absent-{index}")).exists());
    }
    let asked = server_requests(&client) - before;
    assert!(asked < 20, "{asked} requests to look up 100 names the mount knows are missing");
    assert!(directory.join("present").exists());
    // Changed elsewhere: a new name shows, also inside the directory renamed elsewhere.
    client.close(client.create("/made/elsewhere", 0o644).unwrap()).unwrap();
    assert!(within_two_seconds(|| directory.join("elsewhere").exists()));
    std::fs::create_dir(mount.path("second")).unwrap();
    assert!(!mount.path("second/later").exists());
    client.rename("/second", "/renamed").unwrap();
    client.close(client.create("/renamed/later", 0o644).unwrap()).unwrap();
    assert!(within_two_seconds(|| mount.path("renamed/later").exists()), "a name made in a directory renamed elsewhere");
}
