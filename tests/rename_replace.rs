//! Write-temporary-then-rename, the way programs save files safely, under concurrent readers.
//!
//! A writer writes each new version of a file to a temporary name and renames it over `F`
//! (sizes alternating 50 KB and 400 KB); readers open `F` and read it whole, again and again.
//! On a local file system every read returns exactly one complete version. Every version is
//! self-describing (a header with its number and length, then bytes derived from both), so a
//! reader checks each read alone: a cut, padded or mixed read is a wrong read.
//!
//! The same workload runs through the FUSE mount, through the native client, and — as the
//! baseline — on /dev/shm. Duration: `RINGFS_RENAME_TEST_SECS` (default 60) per target.

mod common;

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{TestCluster, fuse_available};
use ringfs_client::{Client, Errno, OpenFlags};

const SMALL: usize = 50_000;
const LARGE: usize = 400_000;
const HEADER: usize = 16;

fn duration() -> Duration {
    let seconds = std::env::var("RINGFS_RENAME_TEST_SECS").ok().and_then(|text| text.parse().ok()).unwrap_or(60);
    Duration::from_secs(seconds)
}

/// Version `number` of the file: its length alternates between SMALL and LARGE.
fn version(number: u64) -> Vec<u8> {
    let len = if number.is_multiple_of(2) { SMALL } else { LARGE };
    let mut bytes = Vec::with_capacity(len);
    bytes.extend_from_slice(&number.to_le_bytes());
    bytes.extend_from_slice(&(len as u64).to_le_bytes());
    let mut state = number.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while bytes.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

/// Whether `bytes` is exactly one complete version.
fn is_complete_version(bytes: &[u8]) -> bool {
    if bytes.len() < HEADER {
        return false;
    }
    let number = u64::from_le_bytes(bytes[0..8].try_into().unwrap());
    bytes == version(number).as_slice()
}

/// What readers saw.
#[derive(Default)]
struct Tally {
    reads: AtomicU64,
    wrong: AtomicU64,
    stale: AtomicU64,
    other_errors: AtomicU64,
    examples: Mutex<Vec<String>>,
}

impl Tally {
    fn record(&self, outcome: Result<Vec<u8>, Errno>) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let problem = match outcome {
            Ok(bytes) if is_complete_version(&bytes) => return,
            Ok(bytes) => {
                self.wrong.fetch_add(1, Ordering::Relaxed);
                let number = bytes.get(0..8).map(|head| u64::from_le_bytes(head.try_into().unwrap()));
                format!("wrong read: {} bytes, header says version {number:?}", bytes.len())
            }
            Err(Errno::ESTALE) => {
                self.stale.fetch_add(1, Ordering::Relaxed);
                "ESTALE".to_string()
            }
            Err(errno) => {
                self.other_errors.fetch_add(1, Ordering::Relaxed);
                format!("error {errno}")
            }
        };
        let mut examples = self.examples.lock().unwrap();
        if examples.len() < 5 {
            examples.push(problem);
        }
    }

    fn assert_clean(&self, target: &str) {
        let reads = self.reads.load(Ordering::Relaxed);
        let (wrong, stale, other) =
            (self.wrong.load(Ordering::Relaxed), self.stale.load(Ordering::Relaxed), self.other_errors.load(Ordering::Relaxed));
        eprintln!("{target}: {reads} reads, {wrong} wrong, {stale} ESTALE, {other} other errors");
        assert!(reads > 100, "{target}: only {reads} reads");
        assert!(
            wrong == 0 && stale == 0 && other == 0,
            "{target}: {wrong} wrong reads, {stale} ESTALE, {other} other errors of {reads}; e.g. {:?}",
            self.examples.lock().unwrap()
        );
    }
}

/// The operations of the workload on one target.
trait Target: Send + Sync {
    fn write_file(&self, path: &str, bytes: &[u8]) -> Result<(), Errno>;
    fn rename(&self, from: &str, to: &str) -> Result<(), Errno>;
    fn read_whole(&self, path: &str) -> Result<Vec<u8>, Errno>;
    fn remove(&self, path: &str) -> Result<(), Errno>;
}

fn errno_of(error: std::io::Error) -> Errno {
    Errno::from(error)
}

/// A directory of a POSIX file system (the mount, or /dev/shm).
struct Posix(std::path::PathBuf);

impl Target for Posix {
    fn write_file(&self, path: &str, bytes: &[u8]) -> Result<(), Errno> {
        std::fs::write(self.0.join(path), bytes).map_err(errno_of)
    }

    fn rename(&self, from: &str, to: &str) -> Result<(), Errno> {
        std::fs::rename(self.0.join(from), self.0.join(to)).map_err(errno_of)
    }

    fn read_whole(&self, path: &str) -> Result<Vec<u8>, Errno> {
        let mut file = std::fs::File::open(self.0.join(path)).map_err(errno_of)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(errno_of)?;
        Ok(bytes)
    }

    fn remove(&self, path: &str) -> Result<(), Errno> {
        std::fs::remove_file(self.0.join(path)).map_err(errno_of)
    }
}

/// The native client.
struct Native(Client);

impl Target for Native {
    fn write_file(&self, path: &str, bytes: &[u8]) -> Result<(), Errno> {
        let fd = self.0.create(&format!("/{path}"), 0o644)?;
        let written = self.0.write(fd, bytes);
        self.0.close(fd)?;
        written.map(drop)
    }

    fn rename(&self, from: &str, to: &str) -> Result<(), Errno> {
        self.0.rename(&format!("/{from}"), &format!("/{to}"))
    }

    fn read_whole(&self, path: &str) -> Result<Vec<u8>, Errno> {
        let fd = self.0.open(&format!("/{path}"), OpenFlags::READ, 0)?;
        let mut bytes = Vec::new();
        let mut buffer = vec![0u8; 128 << 10];
        let outcome = loop {
            match self.0.read(fd, &mut buffer) {
                Ok(0) => break Ok(()),
                Ok(count) => bytes.extend_from_slice(&buffer[..count]),
                Err(errno) => break Err(errno),
            }
        };
        self.0.close(fd)?;
        outcome.map(|()| bytes)
    }

    fn remove(&self, path: &str) -> Result<(), Errno> {
        self.0.unlink(&format!("/{path}"))
    }
}

/// Runs the workload for `length`: one writer renaming new versions over `F`, `readers`
/// readers of `F`, and one thread of unrelated creates and removals beside them.
fn run_workload(target: Arc<dyn Target>, readers: usize, length: Duration) -> Arc<Tally> {
    target.write_file("F", &version(0)).unwrap();
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    {
        let (target, stop) = (target.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            for number in 1.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let temporary = format!("F.tmp-{number}");
                target.write_file(&temporary, &version(number)).unwrap();
                target.rename(&temporary, "F").unwrap();
            }
        }));
    }
    {
        let (target, stop) = (target.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            for number in 0u64.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let name = format!("other-{}", number % 16);
                target.write_file(&name, &version(number)[..1000]).unwrap();
                if number.is_multiple_of(3) {
                    target.remove(&name).unwrap();
                }
            }
        }));
    }
    for _ in 0..readers {
        let (target, stop, tally) = (target.clone(), stop.clone(), tally.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                tally.record(target.read_whole("F"));
            }
        }));
    }
    std::thread::sleep(length);
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().unwrap();
    }
    tally
}

#[test]
fn the_baseline_tmpfs_returns_only_complete_versions() {
    let dir = std::path::Path::new("/dev/shm").join(format!("ringfs-rename-baseline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tally = run_workload(Arc::new(Posix(dir.clone())), 2, Duration::from_secs(3));
    let _ = std::fs::remove_dir_all(&dir);
    tally.assert_clean("tmpfs");
}

#[test]
fn readers_through_the_mount_see_only_complete_versions() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let mount = cluster.mount(&[]);
    let started = Instant::now();
    let tally = run_workload(Arc::new(Posix(mount.dir.clone())), 2, duration());
    eprintln!("ran {:?}", started.elapsed());
    tally.assert_clean("FUSE mount");
}

#[test]
fn readers_through_the_native_client_see_only_complete_versions() {
    let cluster = TestCluster::start(3);
    let mut config = cluster.client_config();
    config.chunk_size = 64 << 10;
    let client = Client::connect(config).unwrap();
    let tally = run_workload(Arc::new(Native(client)), 2, duration());
    tally.assert_clean("native client");
}
