//! End-to-end tests of cache mode: real servers caching a backend directory.
//!
//! Read-through (byte-identical, one backend read per chunk however many readers), write-back
//! by `sync`, by `ringfs stop` and after a crash, writes racing flushes, I/O-aware flushing
//! stepping aside for application I/O, the namespace operations reaching the backend, and a
//! store too small for the data.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{ClusterOptions, Random, TestCluster, ringfs_binary, scratch_dir};
use ringfs_client::{CacheStats, Client, OpenFlags};

/// A backend directory for one test, removed at the end.
struct Backend(PathBuf);

impl Backend {
    fn new(tag: &str) -> Backend {
        Backend(scratch_dir(&format!("backend-{tag}")).keep())
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.0.join(relative.trim_start_matches('/'))
    }

    fn write(&self, relative: &str, bytes: &[u8]) {
        let path = self.path(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }

    fn read(&self, relative: &str) -> Vec<u8> {
        std::fs::read(self.path(relative)).unwrap_or_else(|error| panic!("{relative} in the backend: {error}"))
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Options of a cluster caching `backend` with `policy`.
fn caching(backend: &Backend, servers: usize, policy: &str, idle_ms: u64) -> ClusterOptions {
    let mut options = ClusterOptions::new(servers);
    options.extra_args = vec![
        "--backend".into(),
        backend.0.display().to_string(),
        "--backend-chunk-size".into(),
        "256K".into(),
        "--flush".into(),
        policy.into(),
        "--flush-idle-ms".into(),
        idle_ms.to_string(),
    ];
    options
}

/// Compares two byte strings, reporting the lengths and the first difference (not the bytes).
#[track_caller]
fn assert_same(what: &str, got: &[u8], want: &[u8]) {
    if got != want {
        let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
        // Which 256 KiB pieces differ, and whether they read as zeros: what a lost or
        // misplaced chunk flush looks like.
        let piece = 256 * 1024;
        let differing: Vec<String> = (0..got.len().max(want.len()).div_ceil(piece))
            .filter_map(|index| {
                let range = |bytes: &[u8]| bytes.get(index * piece..((index + 1) * piece).min(bytes.len())).unwrap_or(&[]).to_vec();
                let (got, want) = (range(got), range(want));
                (got != want).then(|| format!("{index}{}", if got.iter().all(|byte| *byte == 0) { " (zeros)" } else { "" }))
            })
            .collect();
        panic!("{what}: {} bytes, expected {}; first difference at byte {first}; pieces differing: {differing:?}", got.len(), want.len());
    }
}

fn random_bytes(random: &mut Random, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    random.fill(&mut bytes);
    bytes
}

fn read_whole(client: &Client, path: &str) -> Vec<u8> {
    let size = client.stat(path).unwrap_or_else(|errno| panic!("stat {path}: {errno}")).size as usize;
    let fd = client.open(path, OpenFlags::READ, 0).unwrap();
    let mut bytes = vec![0u8; size + 10];
    let mut done = 0;
    loop {
        let count = client.pread(fd, &mut bytes[done..], done as u64).unwrap();
        if count == 0 {
            break;
        }
        done += count;
    }
    client.close(fd).unwrap();
    bytes.truncate(done);
    bytes
}

fn write_whole(client: &Client, path: &str, bytes: &[u8]) {
    let fd = client.create(path, 0o644).unwrap_or_else(|errno| panic!("create {path}: {errno}"));
    for (index, piece) in bytes.chunks(700_000).enumerate() {
        client.pwrite(fd, piece, (index * 700_000) as u64).unwrap();
    }
    client.close(fd).unwrap();
}

fn cache_totals(client: &Client) -> CacheStats {
    let mut total = CacheStats::default();
    for stats in client.server_stats().unwrap() {
        let cache = stats.cache.expect("a cache-mode server reports its cache");
        total.dirty_chunks += cache.dirty_chunks;
        total.dirty_bytes += cache.dirty_bytes;
        total.pending_entries += cache.pending_entries;
        total.flushed_chunks += cache.flushed_chunks;
        total.flushed_bytes += cache.flushed_bytes;
        total.loaded_chunks += cache.loaded_chunks;
        total.evicted_chunks += cache.evicted_chunks;
        total.written_through_bytes += cache.written_through_bytes;
        total.longest_stop_us = total.longest_stop_us.max(cache.longest_stop_us);
    }
    total
}

/// Waits (bounded) until `condition` holds.
fn eventually(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_backend_tree_reads_through_byte_identical() {
    let backend = Backend::new("tree");
    let mut random = Random::new(11);
    let mut files = BTreeMap::new();
    for (path, len) in [("/a/empty", 0), ("/a/small", 17), ("/a/b/exact", 256 << 10), ("/a/b/large", 1_300_000), ("/top", 5)] {
        let bytes = random_bytes(&mut random, len);
        backend.write(path, &bytes);
        files.insert(path.to_string(), bytes);
    }
    std::fs::create_dir_all(backend.path("/a/emptydir")).unwrap();
    std::os::unix::fs::symlink("b/large", backend.path("/a/link")).unwrap();
    let cluster = TestCluster::with_options(caching(&backend, 3, "io-aware", 1000));
    let client = cluster.client();

    let names: Vec<String> = client.readdir("/a").unwrap().into_iter().map(|entry| entry.name).collect();
    assert_eq!(names, ["b", "empty", "emptydir", "link", "small"]);
    // The names-only listing (getdents's) of backend entries: same names, ids and types.
    let full: Vec<_> = client.readdir("/a").unwrap().into_iter().map(|entry| (entry.name, entry.stat.file, entry.stat.kind())).collect();
    let names_only: Vec<_> = client.readdir_names("/a").unwrap().into_iter().map(|entry| (entry.name, entry.file, entry.kind)).collect();
    assert_eq!(names_only, full);
    let listing = client.readdir("/a/b").unwrap();
    assert_eq!(
        listing.iter().map(|entry| (entry.name.as_str(), entry.stat.size)).collect::<Vec<_>>(),
        [("exact", 256 << 10), ("large", 1_300_000)]
    );
    for (path, bytes) in &files {
        assert_same(path, &read_whole(&client, path), bytes);
        assert_same(path, &read_whole(&client, path), bytes);
    }
    assert_eq!(client.readlink("/a/link").unwrap(), "b/large");
    assert_same("/a/link", &read_whole(&client, "/a/link"), &files["/a/b/large"]);
    assert!(client.readdir("/a/emptydir").unwrap().is_empty());
    assert_eq!(client.stat("/a/missing").unwrap_err(), ringfs_client::Errno::ENOENT);
    let totals = cache_totals(&client);
    // small, exact, top: one chunk each; large: 5 chunks of 256 KiB; empty files and
    // symbolic links have no chunk to load.
    assert_eq!(totals.loaded_chunks, 1 + 1 + 1 + 5, "every chunk came from the backend exactly once");
    assert_eq!(totals.dirty_chunks, 0, "reading changes nothing");
}

#[test]
fn eight_concurrent_readers_of_a_missing_chunk_cause_one_backend_read() {
    let backend = Backend::new("single");
    let mut random = Random::new(12);
    let bytes = random_bytes(&mut random, 256 << 10);
    backend.write("/shared", &bytes);
    let cluster = TestCluster::with_options(caching(&backend, 2, "io-aware", 1000));
    let head = cluster.client().stat("/shared").unwrap();
    assert_eq!(head.size, bytes.len() as u64);
    let barrier = Arc::new(Barrier::new(8));
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let client = cluster.client();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let fd = client.open("/shared", OpenFlags::READ, 0).unwrap();
                let mut buffer = vec![0u8; 256 << 10];
                barrier.wait();
                let count = client.pread(fd, &mut buffer, 0).unwrap();
                client.close(fd).unwrap();
                buffer.truncate(count);
                buffer
            })
        })
        .collect();
    for reader in readers {
        assert_same("a reader", &reader.join().unwrap(), &bytes);
    }
    assert_eq!(cache_totals(&cluster.client()).loaded_chunks, 1, "one backend read for eight readers");
}

#[test]
fn written_data_is_byte_identical_in_the_backend_after_sync() {
    let backend = Backend::new("sync");
    let cluster = TestCluster::with_options(caching(&backend, 3, "none", 1000));
    let client = cluster.client();
    let mut random = Random::new(13);
    client.mkdir("/out", 0o755).unwrap();
    client.mkdir("/out/deep", 0o700).unwrap();
    let mut files = BTreeMap::new();
    for (index, len) in [0usize, 1, 4096, 300_000, 2_000_000].into_iter().enumerate() {
        let path = format!("/out/deep/file{index}");
        let bytes = random_bytes(&mut random, len);
        write_whole(&client, &path, &bytes);
        files.insert(path, bytes);
    }
    client.symlink("deep/file4", "/out/link").unwrap();
    assert!(!backend.path("/out").exists(), "policy none: nothing is flushed before the sync");
    let before = cache_totals(&client);
    assert!(before.dirty_bytes >= 2_304_097 && before.pending_entries >= 8, "{before:?}");
    client.sync().unwrap();
    for (path, bytes) in &files {
        assert_same(path, &backend.read(path), bytes);
    }
    assert_eq!(std::fs::read_link(backend.path("/out/link")).unwrap(), Path::new("deep/file4"));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(backend.path("/out/deep")).unwrap().permissions().mode() & 0o777, 0o700);
    let after = cache_totals(&client);
    assert_eq!((after.dirty_chunks, after.pending_entries), (0, 0), "{after:?}");
}

#[test]
fn writes_racing_flushes_are_never_lost() {
    let backend = Backend::new("race");
    let cluster = TestCluster::with_options(caching(&backend, 2, "immediate", 1000));
    let client = cluster.client();
    let mut random = Random::new(14);
    const SIZE: usize = 3 << 20;
    let mut model = random_bytes(&mut random, SIZE);
    write_whole(&client, "/raced", &model);
    let fd = client.open("/raced", OpenFlags::WRITE, 0).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut writes = 0;
    while writes < 3000 && Instant::now() < deadline {
        let len = 1 + random.below(9000) as usize;
        let offset = random.below((SIZE - len) as u64) as usize;
        let bytes = random_bytes(&mut random, len);
        client.pwrite(fd, &bytes, offset as u64).unwrap();
        model[offset..offset + len].copy_from_slice(&bytes);
        writes += 1;
    }
    client.close(fd).unwrap();
    assert!(cache_totals(&client).flushed_chunks > 10, "the immediate flusher ran during the writes");
    client.sync().unwrap();
    assert_same(&format!("/raced after {writes} racing writes"), &backend.read("/raced"), &model);
}

#[test]
fn sync_ends_while_others_keep_writing() {
    let backend = Backend::new("busy");
    let cluster = TestCluster::with_options(caching(&backend, 2, "none", 1000));
    let client = cluster.client();
    write_whole(&client, "/before", &vec![7u8; 1 << 20]);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let client = cluster.client();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut round = 0u64;
            let deadline = Instant::now() + Duration::from_secs(60);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
                write_whole(&client, &format!("/busy{}", round % 50), &vec![round as u8; 200_000]);
                round += 1;
            }
            round
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    client.sync().unwrap();
    let took = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = writer.join().unwrap();
    assert!(took < Duration::from_secs(30), "sync took {took:?} under continuous writes");
    assert!(rounds > 5, "the writer kept writing ({rounds} files)");
    assert_same("/before", &backend.read("/before"), &vec![7u8; 1 << 20]);
}

#[test]
fn stop_flushes_everything() {
    let backend = Backend::new("stop");
    let start =
        Command::new(ringfs_binary()).args(["start", "--servers", "3", "--flush", "none", "--backend"]).arg(&backend.0).output().unwrap();
    assert!(start.status.success(), "{}", String::from_utf8_lossy(&start.stderr));
    let exports: Vec<(String, String)> = String::from_utf8_lossy(&start.stdout)
        .lines()
        .filter_map(|line| line.strip_prefix("export ")?.split_once('=').map(|(name, value)| (name.to_string(), value.to_string())))
        .collect();
    let environment = |command: &mut Command| {
        for (name, value) in &exports {
            command.env(name, value);
        }
    };
    let mut config = ringfs_client::ClientConfig::new(
        exports.iter().find(|(name, _)| name == "RINGFS_SERVER").unwrap().1.split(',').map(String::from).collect(),
        exports.iter().find(|(name, _)| name == "RINGFS_SECRET").unwrap().1.clone().into_bytes(),
    );
    config.timeout = Duration::from_secs(5);
    let client = Client::connect(config).unwrap();
    let mut random = Random::new(15);
    let bytes = random_bytes(&mut random, 2_500_000);
    write_whole(&client, "/result.dat", &bytes);
    drop(client);
    let mut stop = Command::new(ringfs_binary());
    stop.arg("stop");
    environment(&mut stop);
    let stopped = stop.output().unwrap();
    assert!(stopped.status.success(), "{}", String::from_utf8_lossy(&stopped.stderr));
    assert_same("/result.dat", &backend.read("/result.dat"), &bytes);
}

#[test]
fn a_server_killed_with_dirty_data_flushes_it_after_a_restart() {
    let backend = Backend::new("crash");
    let mut options = caching(&backend, 2, "none", 200);
    options.dir_store = true;
    let mut cluster = TestCluster::with_options(options);
    let client = cluster.client();
    let mut random = Random::new(16);
    let mut files = BTreeMap::new();
    for index in 0..6 {
        let path = format!("/dirty{index}");
        let bytes = random_bytes(&mut random, 400_000);
        write_whole(&client, &path, &bytes);
        files.insert(path, bytes);
    }
    drop(client);
    cluster.kill(0);
    cluster.kill(1);
    assert!(!backend.path("/dirty0").exists());
    // Restart with io-aware flushing: the rebuilt queue is flushed once the servers are idle.
    cluster.set_extra_arg("--flush", "io-aware");
    for index in 0..2 {
        cluster.restart(index);
    }
    cluster.wait_for_alive(2);
    eventually("the restarted servers flushed", Duration::from_secs(20), || {
        files.keys().all(|path| backend.path(path).exists() && backend.read(path) == files[path])
    });
}

/// Hard links not yet in the backend when the servers are killed are made there after a
/// restart (the `dir` store's chunk headers keep the files' other names).
#[test]
fn hard_links_not_flushed_before_a_kill_reach_the_backend_after_a_restart() {
    let backend = Backend::new("crash-links");
    let mut options = caching(&backend, 2, "none", 200);
    options.dir_store = true;
    let mut cluster = TestCluster::with_options(options);
    let client = cluster.client();
    let bytes = random_bytes(&mut Random::new(17), 300_000);
    client.mkdir("/d", 0o755).unwrap();
    write_whole(&client, "/d/first", &bytes);
    for name in ["/d/second", "/third"] {
        client.link("/d/first", name).unwrap();
    }
    drop(client);
    cluster.kill(0);
    cluster.kill(1);
    assert!(!backend.path("/d/first").exists() && !backend.path("/third").exists(), "nothing was flushed before the kill");
    cluster.set_extra_arg("--flush", "io-aware");
    for index in 0..2 {
        cluster.restart(index);
    }
    cluster.wait_for_alive(2);
    cluster.client().sync().unwrap();
    let names = BTreeMap::from([("/d/first".to_string(), 0), ("/d/second".to_string(), 0), ("/third".to_string(), 0)]);
    check_backend_links(&backend, &names, &[bytes], &["/d".to_string()], "after the restart");
}

#[test]
fn io_aware_flushing_steps_aside_for_application_io() {
    let backend = Backend::new("aware");
    let cluster = TestCluster::with_options(caching(&backend, 2, "io-aware", 300));
    let client = cluster.client();
    let mut random = Random::new(17);
    let bytes = random_bytes(&mut random, 8 << 20);
    // Enough that flushing it all takes longer than noticing that flushing began (an idle
    // machine flushed 96 MiB before the I/O below resumed: soak seed 13464).
    // A server may rightly flush when this process, starved of CPU (a soak runs niced beside
    // builds), leaves it without a request for the idle time: then the two "while the
    // application works" checks below cannot be made. A call slower than half the idle
    // time is the sign (they take 10-50 ms here).
    let starved = Duration::from_millis(150);
    let mut slowest_call = Duration::ZERO;
    for index in 0..24 {
        let started = Instant::now();
        write_whole(&client, &format!("/snapshot{index}"), &bytes);
        slowest_call = slowest_call.max(started.elapsed());
    }
    if slowest_call < starved {
        assert_eq!(cache_totals(&client).flushed_chunks, 0, "nothing is flushed while the application writes");
    } else {
        eprintln!("io-aware: a write took {slowest_call:?} (the process was starved): not checking that nothing was flushed");
    }
    let waiting = Instant::now();
    while cache_totals(&client).flushed_bytes == 0 {
        assert!(waiting.elapsed() < Duration::from_secs(10), "the servers start flushing after 300 ms idle");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Application I/O resumes on every server (a listing asks all of them), for a second.
    let resumed = Instant::now();
    let flushed_at_resume = cache_totals(&client).flushed_bytes;
    let mut flushed_during_io = 0;
    let mut slowest_step = Duration::ZERO;
    while resumed.elapsed() < Duration::from_secs(1) {
        let step = Instant::now();
        client.readdir("/").unwrap();
        if resumed.elapsed() > Duration::from_millis(200) && flushed_during_io == 0 {
            flushed_during_io = cache_totals(&client).flushed_bytes;
        }
        slowest_step = slowest_step.max(step.elapsed());
    }
    let flushed_after_io = cache_totals(&client).flushed_bytes;
    let totals = cache_totals(&client);
    eprintln!(
        "io-aware: flushed {flushed_at_resume} bytes before I/O resumed, {flushed_during_io} 200 ms into it, {flushed_after_io} after 1 s of it; \
         longest stop {} µs; {} bytes still dirty",
        totals.longest_stop_us, totals.dirty_bytes
    );
    assert!(totals.longest_stop_us < 500_000, "flushing stopped {} µs after a request arrived", totals.longest_stop_us);
    if slowest_step < starved {
        assert_eq!(flushed_after_io, flushed_during_io, "no flushing while I/O goes on (at resume: {flushed_at_resume})");
    } else {
        eprintln!("io-aware: a listing took {slowest_step:?} (the process was starved): not checking that flushing stayed stopped");
    }
    assert!(totals.dirty_bytes > 0, "there was still work, so flushing really stepped aside");
    eventually("flushing resumes and finishes once the I/O stops", Duration::from_secs(60), || cache_totals(&client).dirty_chunks == 0);
    assert_same("/snapshot23", &backend.read("/snapshot23"), &bytes);
}

/// A FUSE mount asks every server what changed, every 100 ms while there is news
/// (`Changes`), and the servers compare member lists every heartbeat: neither is the
/// application's I/O, and neither may keep an io-aware server from flushing. (A mount's
/// questions counted as I/O: with a mount on the cluster, a server flushed only if it
/// happened to see no question for the whole idle interval.)
#[test]
fn a_mounts_questions_about_changes_do_not_hold_off_io_aware_flushing() {
    let backend = Backend::new("watched");
    let cluster = TestCluster::with_options(caching(&backend, 2, "io-aware", 300));
    let client = cluster.client();
    let bytes = random_bytes(&mut Random::new(19), 600_000);
    write_whole(&client, "/result", &bytes);
    let watcher = cluster.client();
    let mut watch = ringfs_client::ChangeWatch::default();
    let started = Instant::now();
    // Every server is asked every 50 ms, as by a busy mount (faster than the idle interval).
    while cache_totals(&client).dirty_chunks > 0 {
        assert!(started.elapsed() < Duration::from_secs(20), "the servers flush while a mount asks what changed");
        watcher.changes(&mut watch).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_same("/result", &backend.read("/result"), &bytes);
}

#[test]
fn removals_truncations_renames_and_overwrites_reach_the_backend() {
    let backend = Backend::new("names");
    let mut random = Random::new(18);
    let original = random_bytes(&mut random, 700_000);
    for name in ["/gone", "/cut", "/moved", "/replaced"] {
        backend.write(name, &original);
    }
    backend.write("/dir/inside", b"x");
    // A directory holding only what ringfs does not show (a FIFO) is not empty.
    std::fs::create_dir(backend.path("/pipes")).unwrap();
    let fifo = std::ffi::CString::new(backend.path("/pipes/fifo").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let cluster = TestCluster::with_options(caching(&backend, 3, "none", 1000));
    let client = cluster.client();

    client.unlink("/gone").unwrap();
    client.truncate("/cut", 300_001).unwrap();
    client.rename("/moved", "/renamed").unwrap();
    write_whole(&client, "/replaced", b"short");
    client.unlink("/dir/inside").unwrap();
    client.rmdir("/dir").unwrap();
    let names: Vec<String> = client.readdir("/").unwrap().into_iter().map(|entry| entry.name).collect();
    assert_eq!(names, ["cut", "pipes", "renamed", "replaced"], "removed names are hidden before they reach the backend");
    assert!(backend.path("/gone").exists(), "a removal reaches the backend when flushed");
    // A file's rename moves its backend file at once (the same file: no byte copied).
    assert!(!backend.path("/moved").exists(), "the renamed file left its old name in the backend");
    assert_same("/renamed in the backend before the sync", &backend.read("/renamed"), &original);
    assert_same("/cut", &read_whole(&client, "/cut"), &original[..300_001]);
    assert_same("/renamed", &read_whole(&client, "/renamed"), &original);

    client.sync().unwrap();
    assert!(!backend.path("/gone").exists());
    assert!(!backend.path("/moved").exists());
    assert!(!backend.path("/dir").exists());
    assert_same("/cut in the backend", &backend.read("/cut"), &original[..300_001]);
    assert_same("/renamed in the backend", &backend.read("/renamed"), &original);
    assert_eq!(backend.read("/replaced"), b"short");

    // Special files of the backend are shown (ringfs stores FIFOs, devices and sockets too).
    let pipes = client.readdir("/pipes").unwrap();
    assert_eq!(pipes.len(), 1);
    assert_eq!((pipes[0].name.as_str(), pipes[0].stat.kind()), ("fifo", Some(ringfs_client::FileKind::Fifo)));
    assert_eq!(client.rmdir("/pipes").unwrap_err(), ringfs_client::Errno::ENOTEMPTY, "the directory is not empty");
    client.sync().unwrap();
    assert!(backend.path("/pipes/fifo").exists());
}

#[test]
fn a_full_store_evicts_clean_chunks_and_writes_through() {
    let backend = Backend::new("full");
    let mut random = Random::new(19);
    let input = random_bytes(&mut random, 6 << 20);
    backend.write("/input", &input);
    let mut options = caching(&backend, 2, "none", 1000);
    options.capacity = Some("1M".into());
    let cluster = TestCluster::with_options(options);
    let client = cluster.client();
    assert_same("/input (three times the capacity)", &read_whole(&client, "/input"), &input);
    assert!(cache_totals(&client).evicted_chunks > 0, "clean chunks were evicted");
    let output = random_bytes(&mut random, 5 << 20);
    write_whole(&client, "/output", &output);
    assert!(cache_totals(&client).written_through_bytes > 0, "writes beyond the capacity went to the backend");
    assert_same("/output", &read_whole(&client, "/output"), &output);
    client.sync().unwrap();
    assert_same("/output in the backend", &backend.read("/output"), &output);
}

/// Two servers of 4 MiB each, over `backend`, flushing only on sync.
fn two_small_stores(backend: &Backend) -> TestCluster {
    let mut options = caching(backend, 2, "none", 1000);
    options.capacity = Some("4M".into());
    TestCluster::with_options(options)
}

/// A cluster of two servers of 4 MiB each whose file `path` (3 MiB, returned) was written,
/// flushed, and then evicted to make room for another: its bytes are only in its backend
/// file.
fn a_flushed_file_evicted(backend: &Backend, seed: u64, path: &str) -> (TestCluster, Vec<u8>) {
    let mut random = Random::new(seed);
    let cluster = two_small_stores(backend);
    let client = cluster.client();
    let bytes = random_bytes(&mut random, 3 << 20);
    write_whole(&client, path, &bytes);
    client.sync().unwrap();
    // Room for the filler is made by evicting what is clean: the file's chunks.
    write_whole(&client, "/filler", &random_bytes(&mut random, 6 << 20));
    client.sync().unwrap();
    assert!(cache_totals(&client).evicted_chunks > 0, "clean chunks were evicted");
    (cluster, bytes)
}

/// A file written in ringfs, flushed, and then evicted (its bytes only in its backend file)
/// keeps them when renamed: the renamed file's new backend file is made anew and its old one
/// removed, so the bytes held only by the old one must be loaded first.
#[test]
fn a_renamed_file_whose_flushed_chunks_were_evicted_keeps_its_bytes() {
    let backend = Backend::new("evicted-rename");
    let (cluster, work) = a_flushed_file_evicted(&backend, 21, "/work");
    let client = cluster.client();
    client.rename("/work", "/result").unwrap();
    client.sync().unwrap();
    assert_same("/result in the backend", &backend.read("/result"), &work);
    assert_same("/result", &read_whole(&client, "/result"), &work);
    assert!(!backend.path("/work").exists(), "the old name is gone from the backend");
}

/// The same for a file with two names whose first name goes: its data is flushed again to
/// the name left, and the bytes only in the first name's backend file must come along.
#[test]
fn a_linked_file_whose_flushed_chunks_were_evicted_keeps_its_bytes_when_its_first_name_goes() {
    let backend = Backend::new("evicted-link");
    let (cluster, first) = a_flushed_file_evicted(&backend, 22, "/first");
    let client = cluster.client();
    client.link("/first", "/second").unwrap();
    client.unlink("/first").unwrap();
    client.sync().unwrap();
    assert_same("/second in the backend", &backend.read("/second"), &first);
    assert_same("/second", &read_whole(&client, "/second"), &first);
    assert!(!backend.path("/first").exists(), "the first name is gone from the backend");
}

/// A rename within the cached tree moves the file's backend file with the name: the same
/// backend file (its inode number kept), nothing loaded back and nothing flushed again.
/// (Before, the file was made anew under the new name and all of its bytes flushed again.)
#[test]
fn a_renamed_file_moves_in_the_backend_without_its_bytes_being_copied() {
    let backend = Backend::new("moved-rename");
    let (cluster, work) = a_flushed_file_evicted(&backend, 24, "/work");
    let client = cluster.client();
    let backend_file = std::fs::metadata(backend.path("/work")).unwrap().ino();
    let before = cache_totals(&client);
    client.mkdir("/done", 0o755).unwrap();
    client.sync().unwrap();
    client.rename("/work", "/done/result").unwrap();
    client.sync().unwrap();
    let after = cache_totals(&client);
    assert_eq!(std::fs::metadata(backend.path("/done/result")).unwrap().ino(), backend_file, "the same backend file");
    assert!(!backend.path("/work").exists(), "the old name is gone from the backend");
    assert_eq!(after.loaded_chunks, before.loaded_chunks, "nothing was loaded back for the rename");
    assert!(
        after.flushed_bytes - before.flushed_bytes < 1 << 20,
        "nothing of the file was flushed again ({} bytes)",
        after.flushed_bytes - before.flushed_bytes
    );
    assert_same("/done/result in the backend", &backend.read("/done/result"), &work);
    assert_same("/done/result", &read_whole(&client, "/done/result"), &work);
}

/// A file renamed into directories just made in ringfs (not flushed yet) moves all the same:
/// the directories are made in the backend first, as their flush would.
#[test]
fn a_file_renamed_into_new_directories_moves_in_the_backend_too() {
    let backend = Backend::new("moved-into-new");
    let (cluster, work) = a_flushed_file_evicted(&backend, 28, "/work");
    let client = cluster.client();
    let backend_file = std::fs::metadata(backend.path("/work")).unwrap().ino();
    client.mkdir("/out", 0o750).unwrap();
    client.mkdir("/out/step", 0o755).unwrap();
    assert!(!backend.path("/out").exists(), "nothing flushed yet");
    client.rename("/work", "/out/step/result").unwrap();
    assert_eq!(std::fs::metadata(backend.path("/out/step/result")).unwrap().ino(), backend_file, "the same backend file");
    client.sync().unwrap();
    let mode = std::fs::metadata(backend.path("/out")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o750, "the directory made early has its mode");
    assert_same("/out/step/result in the backend", &backend.read("/out/step/result"), &work);
}

/// A rename that fails (its new name's directory does not exist) leaves the backend as it
/// was: the file under its name, no directory made for the new one.
#[test]
fn a_failed_rename_changes_nothing_in_the_backend() {
    let backend = Backend::new("failed-rename");
    let (cluster, work) = a_flushed_file_evicted(&backend, 27, "/work");
    let client = cluster.client();
    assert_eq!(client.rename("/work", "/missing/result"), Err(ringfs_client::Errno::ENOENT));
    client.sync().unwrap();
    assert!(!backend.path("/missing").exists(), "no directory was made in the backend");
    assert_same("/work in the backend", &backend.read("/work"), &work);
    assert_same("/work", &read_whole(&client, "/work"), &work);
    assert_eq!(client.stat("/missing").unwrap_err(), ringfs_client::Errno::ENOENT);
}

/// A cluster of two 4-MiB stores where `/work` (3 MiB, returned) and the small files
/// `also` were flushed, and then 10 MiB of dirty data (`/filler`, returned) evicted them and
/// fill the stores.
fn stores_full_of_dirty_data(backend: &Backend, seed: u64, also: &[&str]) -> (TestCluster, Vec<u8>, Vec<u8>) {
    let mut random = Random::new(seed);
    let cluster = two_small_stores(backend);
    let client = cluster.client();
    let work = random_bytes(&mut random, 3 << 20);
    write_whole(&client, "/work", &work);
    for name in also {
        write_whole(&client, name, name.as_bytes());
    }
    client.sync().unwrap();
    // Dirty data fills the stores (what does not fit goes through to the backend).
    let filler = random_bytes(&mut random, 10 << 20);
    write_whole(&client, "/filler", &filler);
    assert!(cache_totals(&client).evicted_chunks > 0, "clean chunks were evicted");
    (cluster, work, filler)
}

/// A file whose bytes do not fit in the stores any more (they are full of dirty data) is
/// renamed all the same (its backend file moves), and over another file whose backend file
/// is then gone with the old name.
#[test]
fn a_rename_with_no_room_in_the_stores_moves_the_file_in_the_backend() {
    let backend = Backend::new("evicted-full");
    let (cluster, work, filler) = stores_full_of_dirty_data(&backend, 23, &["/old-result"]);
    let client = cluster.client();
    client.rename("/work", "/result").unwrap();
    client.rename("/result", "/old-result").unwrap();
    assert_eq!(client.stat("/work").unwrap_err(), ringfs_client::Errno::ENOENT);
    assert_same("/old-result", &read_whole(&client, "/old-result"), &work);
    client.sync().unwrap();
    assert_same("/old-result in the backend", &backend.read("/old-result"), &work);
    for gone in ["/work", "/result"] {
        assert!(!backend.path(gone).exists(), "{gone} is gone from the backend");
    }
    assert_same("/filler in the backend", &backend.read("/filler"), &filler);
}

/// Where a file's bytes must be taken along (the name its data went to goes, and its other
/// name is not in the backend yet), a store with no room for them refuses with ENOSPC and
/// nothing changes.
#[test]
fn an_unlink_that_cannot_take_a_linked_files_bytes_along_fails_with_enospc_and_changes_nothing() {
    let backend = Backend::new("evicted-full-link");
    let (cluster, work, filler) = stores_full_of_dirty_data(&backend, 25, &[]);
    let client = cluster.client();
    client.link("/work", "/second").unwrap();
    assert_eq!(client.unlink("/work"), Err(ringfs_client::Errno::ENOSPC));
    assert_same("/work", &read_whole(&client, "/work"), &work);
    assert_same("/second", &read_whole(&client, "/second"), &work);
    client.sync().unwrap();
    assert_same("/work in the backend", &backend.read("/work"), &work);
    assert_same("/filler in the backend", &backend.read("/filler"), &filler);
}

/// Reads of a file whose bytes are in the backend (the stores hold a third of it) go on
/// while the file is renamed back and forth: a chunk's server that asked where the file is
/// just before a rename moved it asks again, and no read fails or returns other bytes.
#[test]
fn reads_of_backend_bytes_go_on_while_the_file_is_renamed() {
    let backend = Backend::new("moving-reads");
    let mut random = Random::new(26);
    let cluster = two_small_stores(&backend);
    let client = cluster.client();
    let work = random_bytes(&mut random, 12 << 20);
    write_whole(&client, "/a", &work);
    client.sync().unwrap();
    let fd = client.open("/a", OpenFlags::READ, 0).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let renamer = {
        let client = cluster.client();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut renames = 0;
            let deadline = Instant::now() + Duration::from_secs(20);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && renames < 400 && Instant::now() < deadline {
                let (from, to) = if renames % 2 == 0 { ("/a", "/b") } else { ("/b", "/a") };
                client.rename(from, to).unwrap_or_else(|errno| panic!("rename {from} -> {to}: {errno}"));
                renames += 1;
            }
            renames
        })
    };
    // Lookups of both names meanwhile: one of the new name may find the file in the backend
    // before ringfs has the name (it is then replaced by the renamed file).
    let looker = {
        let client = cluster.client();
        let stop = stop.clone();
        let size = work.len() as u64;
        std::thread::spawn(move || {
            let mut found = 0;
            let deadline = Instant::now() + Duration::from_secs(20);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
                for name in ["/a", "/b"] {
                    match client.stat(name) {
                        Ok(stat) => {
                            assert_eq!(stat.size, size, "{name} shows the whole file");
                            found += 1;
                        }
                        Err(errno) => assert_eq!(errno, ringfs_client::Errno::ENOENT, "stat {name}"),
                    }
                }
            }
            found
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut reads = 0;
    let mut piece = vec![0u8; 256 << 10];
    while !renamer.is_finished() && Instant::now() < deadline {
        let offset = (reads * 1_300_000 + 4096) % (work.len() - piece.len());
        let read =
            client.pread(fd, &mut piece, offset as u64).unwrap_or_else(|errno| panic!("read at {offset} after {reads} reads: {errno}"));
        assert_eq!(read, piece.len());
        assert!(piece == work[offset..offset + piece.len()], "read at {offset} returned other bytes");
        reads += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let renames = renamer.join().unwrap();
    let found = looker.join().unwrap();
    assert!(renames >= 20 && reads >= 20 && found > 0, "{renames} renames beside {reads} reads and {found} lookups");
    assert!(cache_totals(&client).loaded_chunks > 10, "the reads went to the backend");
    let (name, gone) = if renames % 2 == 0 { ("/a", "/b") } else { ("/b", "/a") };
    let names: Vec<String> = client.readdir("/").unwrap().into_iter().map(|entry| entry.name).collect();
    assert_eq!(names, [&name[1..]], "one name is left");
    assert_same(name, &read_whole(&client, name), &work);
    client.sync().unwrap();
    assert_same(name, &backend.read(name), &work);
    assert!(!backend.path(gone).exists(), "{gone} is gone from the backend");
}

#[test]
fn stagein_loads_a_backend_tree_ahead_of_use() {
    let backend = Backend::new("stagein");
    let mut random = Random::new(20);
    let mut files = BTreeMap::new();
    for index in 0..8 {
        let path = format!("/inputs/set{}/part{index}", index % 2);
        let bytes = random_bytes(&mut random, 100_000 * (index + 1));
        backend.write(&path, &bytes);
        files.insert(path, bytes);
    }
    let cluster = TestCluster::with_options(caching(&backend, 3, "io-aware", 1000));
    // As a user would: by backend path, through the command.
    let output = Command::new(ringfs_binary())
        .arg("stagein")
        .arg(backend.path("/inputs"))
        .env("RINGFS_SERVER", cluster.addresses().join(","))
        .env("RINGFS_SECRET", &cluster.secret)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let total: usize = files.values().map(Vec::len).sum();
    assert!(
        String::from_utf8_lossy(&output.stdout).contains(&format!("staged in 8 files, {total} bytes")),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let client = cluster.client();
    let loaded = cache_totals(&client).loaded_chunks;
    assert!(loaded >= 8, "every file was loaded ({loaded} chunks)");
    for (path, bytes) in &files {
        assert_same(path, &read_whole(&client, path), bytes);
    }
    assert_eq!(cache_totals(&client).loaded_chunks, loaded, "reads after the stage-in find everything in ringfs");
    let outside = Command::new(ringfs_binary())
        .args(["stagein", "/etc/hostname"])
        .env("RINGFS_SERVER", cluster.addresses().join(","))
        .env("RINGFS_SECRET", &cluster.secret)
        .output()
        .unwrap();
    assert!(!outside.status.success(), "a path outside the backend is refused");
}

#[test]
fn a_job_run_through_fuse_leaves_its_results_in_the_backend() {
    if !common::fuse_available() {
        eprintln!("SKIPPED: FUSE is not available here");
        return;
    }
    let backend = Backend::new("run");
    backend.write("/input.txt", b"forty-two\n");
    let mount = scratch_dir("run-mount");
    let script = "tr a-z A-Z < \"$RINGFS_MOUNT/input.txt\" > \"$RINGFS_MOUNT/output.txt\" && mkdir \"$RINGFS_MOUNT/logs\" && echo done > \"$RINGFS_MOUNT/logs/job.log\"";
    let output = Command::new(ringfs_binary())
        .args(["run", "--servers", "2", "--backend"])
        .arg(&backend.0)
        .arg("--mount")
        .arg(&mount)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(backend.read("/output.txt"), b"FORTY-TWO\n");
    assert_eq!(backend.read("/logs/job.log"), b"done\n");
    let _ = std::fs::remove_dir_all(&mount);
}

#[test]
fn cache_commands_on_a_cluster_without_backend() {
    let cluster = TestCluster::start(2);
    let command = |args: &[&str]| {
        Command::new(ringfs_binary())
            .args(args)
            .env("RINGFS_SERVER", cluster.addresses().join(","))
            .env("RINGFS_SECRET", &cluster.secret)
            .output()
            .unwrap()
    };
    assert!(command(&["sync"]).status.success(), "sync without a backend has nothing to do");
    let stagein = command(&["stagein", "/anything"]);
    assert!(!stagein.status.success());
    assert!(String::from_utf8_lossy(&stagein.stderr).contains("caches no backend"), "{}", String::from_utf8_lossy(&stagein.stderr));
    let status = command(&["status"]);
    assert!(status.status.success() && !String::from_utf8_lossy(&status.stdout).contains("cache "));
}

#[test]
fn a_backend_mounted_below_the_root_covers_only_its_tree() {
    let backend = Backend::new("mounted");
    backend.write("/data", b"from the backend");
    let mut options = caching(&backend, 2, "none", 1000);
    options.extra_args.extend(["--mount-path".to_string(), "/pfs/in".to_string()]);
    let cluster = TestCluster::with_options(options);
    let client = cluster.client();
    client.mkdir("/pfs", 0o755).unwrap();
    assert!(client.stat("/pfs/in").unwrap().is_dir(), "the mount path is the backend directory");
    assert_eq!(client.readdir("/pfs").unwrap().into_iter().map(|entry| entry.name).collect::<Vec<_>>(), ["in"]);
    assert_same("/pfs/in/data", &read_whole(&client, "/pfs/in/data"), b"from the backend");
    write_whole(&client, "/pfs/in/result", b"kept");
    client.mkdir("/scratch", 0o755).unwrap();
    write_whole(&client, "/scratch/temporary", b"not kept");
    assert!(!client.stat("/scratch/temporary").unwrap().backed);
    client.sync().unwrap();
    assert_eq!(backend.read("/result"), b"kept");
    let names: Vec<String> =
        std::fs::read_dir(&backend.0).unwrap().map(|entry| entry.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names.len(), 2, "only the mounted tree reaches the backend: {names:?}");
}

#[test]
fn shell_tools_through_fuse_see_and_change_the_backend_tree() {
    if !common::fuse_available() {
        return;
    }
    let backend = Backend::new("shell");
    let mut random = Random::new(30);
    let large = random_bytes(&mut random, 700_000);
    backend.write("/in/large.bin", &large);
    backend.write("/in/notes.txt", b"line one\n");
    backend.write("/in/old.txt", b"to be removed\n");
    backend.write("/in/name.txt", b"to be renamed\n");
    backend.write("/in/sub/deep.txt", b"deep\n");
    let cluster = TestCluster::with_options(caching(&backend, 3, "none", 1000));
    let mount = cluster.mount(&[]);
    let shell = |script: &str| {
        let output = Command::new("sh").arg("-c").arg(script).current_dir(&mount.dir).output().unwrap();
        assert!(output.status.success(), "{script}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    assert_eq!(shell("ls in"), "large.bin\nname.txt\nnotes.txt\nold.txt\nsub\n");
    assert_eq!(shell("cat in/sub/deep.txt"), "deep\n");
    assert_eq!(shell("stat -c %s in/large.bin"), "700000\n", "the size of an uncached file comes from the backend");
    shell("cp -r in copy && cmp in/large.bin copy/large.bin");
    shell("echo line two >> in/notes.txt && rm in/old.txt && mv in/name.txt in/renamed.txt && : > in/sub/deep.txt");
    assert_eq!(shell("ls in"), "large.bin\nnotes.txt\nrenamed.txt\nsub\n", "the listing merges the changes before any flush");
    assert_eq!(shell("cat in/notes.txt"), "line one\nline two\n");
    assert_eq!(shell("find copy -type f | sort"), "copy/large.bin\ncopy/name.txt\ncopy/notes.txt\ncopy/old.txt\ncopy/sub/deep.txt\n");
    // Hard links, and rsync -aH keeping them.
    shell("ln in/large.bin in/sub/large-link && mkdir linked && echo one > linked/a && ln linked/a linked/b");
    assert_eq!(shell("stat -c %h in/large.bin"), "2\n");
    shell("rsync -aH linked/ linked-copy/ && test $(stat -c %h linked-copy/a) = 2");
    assert!(backend.path("/in/old.txt").exists(), "policy none: the backend is untouched before the sync");
    let sync = Command::new(ringfs_binary())
        .arg("sync")
        .env("RINGFS_SERVER", cluster.addresses().join(","))
        .env("RINGFS_SECRET", &cluster.secret)
        .output()
        .unwrap();
    assert!(sync.status.success(), "{}", String::from_utf8_lossy(&sync.stderr));
    assert_eq!(backend.read("/in/notes.txt"), b"line one\nline two\n");
    assert!(!backend.path("/in/old.txt").exists());
    assert!(!backend.path("/in/name.txt").exists());
    assert_eq!(backend.read("/in/renamed.txt"), b"to be renamed\n");
    assert_eq!(backend.read("/in/sub/deep.txt"), b"");
    assert_same("/copy/large.bin in the backend", &backend.read("/copy/large.bin"), &large);
    assert_eq!(backend.read("/copy/old.txt"), b"to be removed\n");
    use std::os::unix::fs::MetadataExt;
    let inode = |path: &str| std::fs::metadata(backend.path(path)).unwrap().ino();
    assert_eq!(inode("/in/large.bin"), inode("/in/sub/large-link"), "ln in the mount made a hard link in the backend");
    assert_eq!(inode("/linked-copy/a"), inode("/linked-copy/b"), "rsync -aH through the mount kept the link in the backend");
    assert_eq!(backend.read("/linked-copy/b"), b"one\n");
}

#[test]
fn renamed_files_reach_the_backend_whole_while_flushing_immediately() {
    let backend = Backend::new("renames");
    let cluster = TestCluster::with_options(caching(&backend, 3, "immediate", 1000));
    let client = cluster.client();
    let mut random = Random::new(40);
    // More rounds hunt the rare failure this test once showed (RINGFS_RENAME_ROUNDS).
    let rounds: usize = std::env::var("RINGFS_RENAME_ROUNDS").ok().and_then(|rounds| rounds.parse().ok()).unwrap_or(1);
    for round in 0..rounds {
        let mut files = BTreeMap::new();
        for index in 0..12 {
            // Two chunks each (1 MiB and the rest), on two servers: their flushes race the
            // rename's new entry.
            let bytes = random_bytes(&mut random, 5 * 256 * 1024 - index * 1000);
            write_whole(&client, &format!("/work{round}-{index}"), &bytes);
            client.rename(&format!("/work{round}-{index}"), &format!("/result{round}-{index}")).unwrap();
            files.insert(format!("/result{round}-{index}"), bytes);
        }
        client.sync().unwrap();
        for (path, bytes) in &files {
            assert_same(&format!("{path} (round {round})"), &backend.read(path), bytes);
        }
    }
    let mut names: Vec<String> =
        std::fs::read_dir(&backend.0).unwrap().map(|entry| entry.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert!(names.iter().all(|name| name.starts_with("result")), "old names are gone from the backend: {names:?}");
    assert_eq!(cache_totals(&client).dirty_chunks, 0, "nothing is left dirty");
}

/// Files renamed over each other by three threads at once while flushers write them out
/// (`immediate`), some written meanwhile, in stores small enough to evict: afterwards every
/// name left holds one whole version of one file, in ringfs and in the backend alike, and
/// the backend holds nothing else. (Searches for mixes and losses around backend files moved
/// and exchanged by renames; `RINGFS_TEST_SEED` replays, `RINGFS_RENAME_ROUNDS` runs more.)
#[test]
fn files_renamed_over_each_other_at_once_stay_whole_in_the_backend() {
    let backend = Backend::new("renames-over");
    let mut options = caching(&backend, 3, "immediate", 1000);
    options.capacity = Some("6M".into());
    let cluster = TestCluster::with_options(options);
    let seed = test_seed(41);
    let rounds: u64 = std::env::var("RINGFS_RENAME_ROUNDS").ok().and_then(|rounds| rounds.parse().ok()).unwrap_or(4);
    // A version of a file: its 8-byte id, then bytes its id decides (so a whole version is
    // recognised from its content alone).
    fn version(id: u64) -> Vec<u8> {
        let mut random = Random::new(id);
        let mut bytes = random_bytes(&mut random, 600_000 + (id % 7) as usize * 100_000);
        bytes[..8].copy_from_slice(&id.to_le_bytes());
        bytes
    }
    let is_whole = |bytes: &[u8]| bytes.len() >= 8 && version(u64::from_le_bytes(bytes[..8].try_into().unwrap())) == bytes;
    let names: Vec<String> = (0..8).map(|index| format!("/n{index}")).collect();
    for round in 0..rounds {
        let client = cluster.client();
        for (index, name) in names.iter().enumerate() {
            write_whole(&client, name, &version(seed * 1000 + round * 100 + index as u64));
        }
        client.sync().unwrap();
        let workers: Vec<_> = (0..3u64)
            .map(|worker| {
                let (client, names) = (cluster.client(), names.clone());
                std::thread::spawn(move || {
                    let mut random = Random::new(seed ^ (round << 8) ^ worker);
                    for step in 0..60u64 {
                        let from = &names[random.below(names.len() as u64) as usize];
                        let to = &names[random.below(names.len() as u64) as usize];
                        if step % 10 == 9 {
                            // A new version, written under a name of its own and renamed over
                            // one of the names (two writers never share a file).
                            let own = format!("/new-{worker}");
                            write_whole(&client, &own, &version(seed * 1000 + round * 100 + 10 + worker * 60 + step));
                            client.rename(&own, to).unwrap_or_else(|errno| panic!("rename {own} -> {to}: {errno}"));
                        } else {
                            match client.rename(from, to) {
                                Ok(()) | Err(ringfs_client::Errno::ENOENT) => {}
                                Err(errno) => panic!("rename {from} -> {to}: {errno}"),
                            }
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            worker.join().unwrap();
        }
        client.sync().unwrap();
        let listed: Vec<String> = client.readdir("/").unwrap().into_iter().map(|entry| format!("/{}", entry.name)).collect();
        assert!(!listed.is_empty(), "round {round}: some names are left");
        for name in &listed {
            let bytes = read_whole(&client, name);
            assert!(is_whole(&bytes), "round {round}: {name} holds {} bytes that are not one whole version", bytes.len());
            let in_backend = backend.read(name);
            let id = |bytes: &[u8]| bytes.get(..8).map(|id| u64::from_le_bytes(id.try_into().unwrap()));
            assert!(
                in_backend == bytes,
                "round {round}: {name} differs in the backend: version {:?} of {} bytes there, {:?} of {} in ringfs",
                id(&in_backend),
                in_backend.len(),
                id(&bytes),
                bytes.len()
            );
        }
        let mut in_backend: Vec<String> =
            std::fs::read_dir(&backend.0).unwrap().map(|entry| format!("/{}", entry.unwrap().file_name().into_string().unwrap())).collect();
        in_backend.sort();
        let mut listed = listed;
        listed.sort();
        assert_eq!(in_backend, listed, "round {round}: the backend holds the names ringfs has, and nothing else");
        for name in &listed {
            client.unlink(name).unwrap();
        }
        client.sync().unwrap();
    }
}

#[test]
fn read_only_entries_reach_the_backend_from_servers_that_are_not_root() {
    let backend = Backend::new("readonly");
    common::give_to_unprivileged(&backend.0);
    let mut options = caching(&backend, 3, "none", 1000);
    options.unprivileged = true;
    let cluster = TestCluster::with_options(options);
    let client = cluster.client();
    let mut random = Random::new(50);
    let bytes = random_bytes(&mut random, 3 * 256 * 1024 + 77);
    client.mkdir("/inputs", 0o755).unwrap();
    write_whole(&client, "/inputs/data", &bytes);
    client.chmod("/inputs/data", 0o444).unwrap();
    client.chmod("/inputs", 0o555).unwrap();
    client.sync().unwrap();
    assert_same("/inputs/data in the backend", &backend.read("/inputs/data"), &bytes);
    let mode = |relative: &str| std::fs::metadata(backend.path(relative)).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode("/inputs/data"), mode("/inputs")), (0o444, 0o555));

    // Later changes to the read-only entries reach the backend too.
    let fd = client.open("/inputs/data", OpenFlags::WRITE, 0).unwrap();
    client.pwrite(fd, b"changed", 300_000).unwrap();
    client.close(fd).unwrap();
    write_whole(&client, "/inputs/added", b"new file in a read-only directory");
    client.sync().unwrap();
    assert_eq!(&backend.read("/inputs/data")[300_000..300_007], b"changed");
    assert_eq!(backend.read("/inputs/added"), b"new file in a read-only directory");
    assert_eq!((mode("/inputs/data"), mode("/inputs")), (0o444, 0o555), "the modes are as set in ringfs");
    client.unlink("/inputs/added").unwrap();
    client.sync().unwrap();
    assert!(!backend.path("/inputs/added").exists());
}

#[test]
fn concurrent_renames_and_truncations_of_backend_files_do_not_wait_on_each_other() {
    let backend = Backend::new("coordination");
    let mut random = Random::new(60);
    let mut files = BTreeMap::new();
    for index in 0..24 {
        let bytes = random_bytes(&mut random, 3 * 256 * 1024 + index);
        backend.write(&format!("/in{index}"), &bytes);
        files.insert(index, bytes);
    }
    let cluster = TestCluster::with_options(caching(&backend, 2, "none", 1000));
    // Each rename or cut is coordinated by the server of the file's entry, which asks the
    // servers of its chunks to load or cut them: with both servers coordinating at once, each
    // asks the other.
    std::thread::scope(|scope| {
        for worker in 0..4 {
            let client = cluster.client();
            scope.spawn(move || {
                for index in (worker..24).step_by(4) {
                    let from = format!("/in{index}");
                    match index % 2 {
                        0 => client.rename(&from, &format!("/out{index}")).unwrap_or_else(|errno| panic!("rename {from}: {errno}")),
                        _ => client.truncate(&from, 300_000).unwrap_or_else(|errno| panic!("truncate {from}: {errno}")),
                    }
                }
            });
        }
    });
    let client = cluster.client();
    for (index, bytes) in &files {
        match index % 2 {
            0 => assert_same(&format!("/out{index}"), &read_whole(&client, &format!("/out{index}")), bytes),
            _ => assert_same(&format!("/in{index}"), &read_whole(&client, &format!("/in{index}")), &bytes[..300_000]),
        }
    }
}

/// What a tree holds, by path below its root: directories and files with their bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    Dir,
    File(Vec<u8>),
}

/// The backend directory's tree, as ringfs paths ("/x/y").
fn backend_tree(backend: &Backend) -> BTreeMap<String, Node> {
    fn walk(dir: &Path, prefix: &str, tree: &mut BTreeMap<String, Node>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = format!("{prefix}/{}", entry.file_name().to_string_lossy());
            if entry.file_type().unwrap().is_dir() {
                tree.insert(path.clone(), Node::Dir);
                walk(&entry.path(), &path, tree);
            } else {
                tree.insert(path, Node::File(std::fs::read(entry.path()).unwrap()));
            }
        }
    }
    let mut tree = BTreeMap::new();
    walk(&backend.0, "", &mut tree);
    tree
}

/// The tree ringfs shows below `/`.
fn ringfs_tree(client: &Client) -> BTreeMap<String, Node> {
    fn walk(client: &Client, dir: &str, tree: &mut BTreeMap<String, Node>) {
        for entry in client.readdir(dir).unwrap_or_else(|errno| panic!("readdir {dir}: {errno}")) {
            let path = if dir == "/" { format!("/{}", entry.name) } else { format!("{dir}/{}", entry.name) };
            if entry.stat.kind() == Some(ringfs_client::FileKind::Directory) {
                tree.insert(path.clone(), Node::Dir);
                walk(client, &path, tree);
            } else {
                tree.insert(path.clone(), Node::File(read_whole(client, &path)));
            }
        }
    }
    let mut tree = BTreeMap::new();
    walk(client, "/", &mut tree);
    tree
}

/// Reports the first path where two trees differ.
#[track_caller]
fn assert_same_tree(what: &str, got: &BTreeMap<String, Node>, want: &BTreeMap<String, Node>) {
    let describe = |node: Option<&Node>| match node {
        None => "nothing".to_string(),
        Some(Node::Dir) => "a directory".to_string(),
        Some(Node::File(bytes)) => format!("a file of {} bytes", bytes.len()),
    };
    for path in got.keys().chain(want.keys()) {
        if got.get(path) != want.get(path) {
            panic!("{what}: {path} is {}, expected {}", describe(got.get(path)), describe(want.get(path)));
        }
    }
}

fn is_at_or_below(path: &str, dir: &str) -> bool {
    path == dir || path.strip_prefix(dir).is_some_and(|rest| rest.starts_with('/'))
}

/// Renames (or exchanges) `from` and `to` in a model tree, moving everything below.
fn model_rename(tree: &mut BTreeMap<String, Node>, from: &str, to: &str, exchange: bool) {
    let take = |tree: &mut BTreeMap<String, Node>, root: &str| -> Vec<(String, Node)> {
        let paths: Vec<String> = tree.keys().filter(|path| is_at_or_below(path, root)).cloned().collect();
        paths.into_iter().map(|path| (path[root.len()..].to_string(), tree.remove(&path).unwrap())).collect()
    };
    let moved = take(tree, from);
    let displaced = take(tree, to);
    for (rest, node) in moved {
        tree.insert(format!("{to}{rest}"), node);
    }
    if exchange {
        for (rest, node) in displaced {
            tree.insert(format!("{from}{rest}"), node);
        }
    }
}

/// Random namespace changes in the cached tree — directory renames, exchanges, renames over
/// empty directories, file renames, writes, removals, reads — applied to ringfs and to a
/// model of the tree, with syncs after which the backend must hold exactly the model.
struct TreeWorkload {
    random: Random,
    model: BTreeMap<String, Node>,
    names: u32,
    tree_renames: u32,
    exchanges: u32,
    syncs: u32,
}

impl TreeWorkload {
    /// A backend tree of a few directories and files (what ringfs starts caching).
    fn new(backend: &Backend, seed: u64) -> TreeWorkload {
        let mut random = Random::new(seed);
        let mut model = BTreeMap::new();
        for dir in ["/a", "/a/sub", "/b", "/c", "/c/deep", "/c/deep/er"] {
            std::fs::create_dir_all(backend.path(dir)).unwrap();
            model.insert(dir.to_string(), Node::Dir);
        }
        for (index, file) in ["/a/one", "/a/sub/two", "/b/three", "/c/deep/er/four", "/top"].into_iter().enumerate() {
            let bytes = random_bytes(&mut random, [10, 300_000, 70_000, 600_000, 5][index]);
            backend.write(file, &bytes);
            model.insert(file.to_string(), Node::File(bytes));
        }
        TreeWorkload { random, model, names: 0, tree_renames: 0, exchanges: 0, syncs: 0 }
    }

    /// One random change (or a read, or a sync and the backend compared with the model).
    fn step(&mut self, client: &Client, backend: &Backend, step: usize) {
        let TreeWorkload { random, model, names, .. } = self;
        let dirs: Vec<String> = std::iter::once("/".to_string())
            .chain(model.iter().filter(|(_, node)| **node == Node::Dir).map(|(path, _)| path.clone()))
            .collect();
        let files: Vec<String> = model.iter().filter(|(_, node)| matches!(node, Node::File(_))).map(|(path, _)| path.clone()).collect();
        let pick = |random: &mut Random, list: &[String]| list[random.below(list.len() as u64) as usize].clone();
        let new_name = |random: &mut Random, names: &mut u32| {
            *names += 1;
            let dir = pick(random, &dirs);
            if dir == "/" { format!("/n{names}") } else { format!("{dir}/n{names}") }
        };
        let empty = |dir: &str| !model.keys().any(|path| path != dir && is_at_or_below(path, dir));
        match random.below(100) {
            0..=19 => {
                let path = if !files.is_empty() && random.below(2) == 0 { pick(random, &files) } else { new_name(random, names) };
                let len = random.below(600_000) as usize;
                let bytes = random_bytes(random, len);
                write_whole(client, &path, &bytes);
                model.insert(path, Node::File(bytes));
            }
            20..=29 => {
                let path = new_name(random, names);
                client.mkdir(&path, 0o755).unwrap_or_else(|errno| panic!("step {step}: mkdir {path}: {errno}"));
                model.insert(path, Node::Dir);
            }
            30..=37 if !files.is_empty() => {
                let path = pick(random, &files);
                client.unlink(&path).unwrap_or_else(|errno| panic!("step {step}: unlink {path}: {errno}"));
                model.remove(&path);
            }
            38..=42 => {
                let Some(dir) = dirs.iter().skip(1).find(|dir| empty(dir)).cloned() else { return };
                client.rmdir(&dir).unwrap_or_else(|errno| panic!("step {step}: rmdir {dir}: {errno}"));
                model.remove(&dir);
            }
            43..=52 if !files.is_empty() => {
                let from = pick(random, &files);
                let to = if random.below(2) == 0 { pick(random, &files) } else { new_name(random, names) };
                client.rename(&from, &to).unwrap_or_else(|errno| panic!("step {step}: rename {from} {to}: {errno}"));
                if from != to {
                    model_rename(model, &from, &to, false);
                }
            }
            53..=79 if dirs.len() > 1 => {
                let from = pick(random, &dirs[1..]);
                // Over an empty directory sometimes, else to a new name; never into itself.
                let to = match dirs.iter().skip(1).find(|dir| empty(dir) && !is_at_or_below(dir, &from) && !is_at_or_below(&from, dir)) {
                    Some(empty_dir) if random.below(3) == 0 => empty_dir.clone(),
                    _ => new_name(random, names),
                };
                if is_at_or_below(&to, &from) {
                    return;
                }
                client.rename(&from, &to).unwrap_or_else(|errno| panic!("step {step}: rename {from} {to}: {errno}"));
                model_rename(model, &from, &to, false);
                self.tree_renames += 1;
            }
            80..=89 if model.len() >= 2 => {
                let all: Vec<String> = model.keys().cloned().collect();
                let (first, second) = (pick(random, &all), pick(random, &all));
                if is_at_or_below(&first, &second) || is_at_or_below(&second, &first) {
                    return;
                }
                client
                    .rename_with_flags(&first, &second, ringfs_client::RenameFlags::EXCHANGE)
                    .unwrap_or_else(|errno| panic!("step {step}: exchange {first} {second}: {errno}"));
                model_rename(model, &first, &second, true);
                self.exchanges += 1;
            }
            90..=94 if !files.is_empty() => {
                let path = pick(random, &files);
                let Node::File(bytes) = &model[&path] else { unreachable!() };
                assert_same(&format!("step {step}: {path}"), &read_whole(client, &path), bytes);
            }
            95..=99 => self.check_after_sync(client, backend, &format!("step {step}")),
            _ => {}
        }
    }

    /// Syncs, then checks that the backend holds exactly the model.
    fn check_after_sync(&mut self, client: &Client, backend: &Backend, when: &str) {
        client.sync().unwrap_or_else(|errno| panic!("{when}: sync: {errno}"));
        assert_same_tree(&format!("{when}: the backend after a sync"), &backend_tree(backend), &self.model);
        self.syncs += 1;
    }
}

/// The seed of a randomized test: `RINGFS_TEST_SEED`, else `default`.
fn test_seed(default: u64) -> u64 {
    std::env::var("RINGFS_TEST_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or(default)
}

/// [`TreeWorkload`] on a backend tree ringfs has partly loaded, with flushes running all the
/// while.
#[test]
fn directory_renames_and_exchanges_reach_the_backend() {
    let backend = Backend::new("tree-renames");
    let mut workload = TreeWorkload::new(&backend, test_seed(20));
    let cluster = TestCluster::with_options(caching(&backend, 3, "immediate", 1000));
    let client = cluster.client();
    // ringfs knows part of the tree: one file read, one directory listed.
    let Node::File(bytes) = &workload.model["/a/sub/two"] else { unreachable!() };
    assert_same("/a/sub/two", &read_whole(&client, "/a/sub/two"), bytes);
    client.readdir("/b").unwrap();

    for step in 0..300 {
        workload.step(&client, &backend, step);
    }
    let TreeWorkload { tree_renames, exchanges, syncs, .. } = workload;
    eprintln!("{tree_renames} directory renames, {exchanges} exchanges, {syncs} syncs; {} names at the end", workload.model.len());
    assert!(tree_renames > 10 && exchanges > 3 && syncs > 3, "the random steps did what they are for");
    client.sync().unwrap();
    assert_same_tree("ringfs at the end", &ringfs_tree(&client), &workload.model);
    assert_same_tree("the backend at the end", &backend_tree(&backend), &workload.model);
}

/// [`TreeWorkload`] on `dir` stores, with a server killed (SIGKILL) every few dozen steps at
/// a random moment after the last change — while the servers still flush it (`immediate`)
/// — and restarted: after the restart, ringfs and the backend must both hold the model (a
/// server's flushes and backend moves cut short by its death are taken up again, never done
/// twice over newer state).
#[test]
fn servers_killed_while_they_flush_come_back_with_the_backend_matching_ringfs() {
    let backend = Backend::new("tree-kills");
    let seed = test_seed(40);
    let mut workload = TreeWorkload::new(&backend, seed);
    let mut options = caching(&backend, 3, "immediate", 1000);
    options.dir_store = true;
    let mut cluster = TestCluster::with_options(options);
    let mut client = cluster.client();
    let mut killer = Random::new(seed ^ 0x6b69_6c6c);
    let rounds = std::env::var("RINGFS_KILL_ROUNDS").ok().and_then(|rounds| rounds.parse().ok()).unwrap_or(6);
    let mut step = 0;
    for round in 0..rounds {
        for _ in 0..10 + killer.below(30) {
            workload.step(&client, &backend, step);
            step += 1;
        }
        let victim = killer.below(3) as usize;
        std::thread::sleep(Duration::from_micros(killer.below(20_000)));
        cluster.kill(victim);
        drop(client);
        cluster.restart(victim);
        cluster.wait_for_alive(3);
        client = cluster.client();
        let when = format!("seed {seed}, round {round} (server {victim} killed after step {step})");
        workload.check_after_sync(&client, &backend, &when);
        assert_same_tree(&format!("{when}: ringfs"), &ringfs_tree(&client), &workload.model);
    }
    eprintln!("{step} steps, {rounds} kills, {} directory renames, {} syncs", workload.tree_renames, workload.syncs);
}

/// Files overwritten (a truncating create), written in place and cut by a client while a
/// server of theirs is killed (SIGKILL) in the middle of it and restarted (`dir` stores,
/// flushing at once): the writes and cuts the kill cut short leave their files in some state
/// — but after a sync the backend must hold exactly what ringfs shows, whatever state that
/// is. (A cut cut short is finished by the inode's server: `Files::cut_later_chunks`.)
#[test]
fn files_written_while_a_server_is_killed_match_the_backend_after_its_restart() {
    let backend = Backend::new("write-kills");
    let seed = test_seed(50);
    let mut options = caching(&backend, 3, "immediate", 1000);
    options.dir_store = true;
    let mut cluster = TestCluster::with_options(options);
    let mut killer = Random::new(seed);
    let files: Vec<String> = (0..6).map(|index| format!("/w{index}")).collect();
    let client = cluster.client();
    for (index, path) in files.iter().enumerate() {
        write_whole(&client, path, &random_bytes(&mut killer, 100_000 * index));
    }
    let rounds = std::env::var("RINGFS_KILL_ROUNDS").ok().and_then(|rounds| rounds.parse().ok()).unwrap_or(4);
    let mut failed_calls = 0;
    for round in 0..rounds {
        let victim = killer.below(3) as usize;
        failed_calls += common::kill_while_a_client_works(&mut cluster, &mut killer, victim, |client, random| {
            let path = &files[random.below(files.len() as u64) as usize];
            let len = random.below(700_000) as usize;
            let bytes = random_bytes(random, len);
            // A new version, a piece anywhere (growing the file), or a cut.
            let done = match random.below(3) {
                0 => client.create(path, 0o644).and_then(|fd| {
                    let written = client.pwrite(fd, &bytes, 0).map(drop);
                    client.close(fd).and(written)
                }),
                1 => client.open(path, OpenFlags::WRITE, 0).and_then(|fd| {
                    let written = client.pwrite(fd, &bytes[..len.min(100_000)], random.below(600_000)).map(drop);
                    client.close(fd).and(written)
                }),
                _ => client.truncate(path, random.below(500_000)),
            };
            done.is_err()
        });
        let client = cluster.client();
        let when = format!("seed {seed}, round {round} (server {victim} killed while a client wrote)");
        client.sync().unwrap_or_else(|errno| panic!("{when}: sync: {errno}"));
        let (shown, kept) = (ringfs_tree(&client), backend_tree(&backend));
        for (path, node) in &shown {
            if let (Node::File(shown), Some(Node::File(kept))) = (node, kept.get(path)) {
                assert_same(&format!("{when}: {path} in the backend"), kept, shown);
            }
        }
        assert_same_tree(&format!("{when}: the backend"), &kept, &shown);
    }
    eprintln!("{rounds} kills, {failed_calls} calls failed by them");
}

/// A file read through an open descriptor while its directory is renamed back and forth:
/// its chunks are loaded from wherever the backend has it at that moment, never an error.
#[test]
fn reads_of_backend_files_continue_while_their_directory_is_renamed() {
    let backend = Backend::new("read-across-renames");
    let mut random = Random::new(21);
    let original = random_bytes(&mut random, 16 << 20);
    backend.write("/d/big", &original);
    let cluster = TestCluster::with_options(caching(&backend, 3, "immediate", 1000));
    let client = cluster.client();
    let fd = client.open("/d/big", OpenFlags::READ, 0).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let renamer = scope.spawn(|| {
            let mut renames = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && renames < 400 {
                let (from, to) = if renames % 2 == 0 { ("/d", "/e") } else { ("/e", "/d") };
                client.rename(from, to).unwrap_or_else(|errno| panic!("rename {from} {to}: {errno}"));
                renames += 1;
            }
            renames
        });
        // 64 chunks of 256 KiB, each loaded on its first read, in pieces of 64 KiB.
        let mut buffer = vec![0u8; 64 << 10];
        for offset in (0..original.len()).step_by(buffer.len()) {
            let count = client.pread(fd, &mut buffer, offset as u64).unwrap_or_else(|errno| panic!("read at {offset}: {errno}"));
            assert_same(&format!("bytes at {offset}"), &buffer[..count], &original[offset..offset + count]);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let renames = renamer.join().unwrap();
        eprintln!("{renames} renames during the read");
        assert!(renames > 10, "the directory was renamed while the file was read");
    });
    client.close(fd).unwrap();
    client.sync().unwrap();
    let place = if backend.path("/d/big").exists() { "/d/big" } else { "/e/big" };
    assert_same("the file in the backend", &backend.read(place), &original);
    let tree = backend_tree(&backend);
    assert_eq!(tree.len(), 2, "one directory with one file: {:?}", tree.keys().collect::<Vec<_>>());
}

/// Files unlinked (or replaced by a rename) while open in the cached tree: every descriptor
/// keeps reading and writing them — bytes still in the backend included — and the backend
/// loses the name at the next sync and never gets it back from later writes.
#[test]
fn files_unlinked_while_open_stay_usable_and_leave_the_backend() {
    let backend = Backend::new("open-unlinked");
    let mut random = Random::new(22);
    let old = random_bytes(&mut random, 1 << 20);
    backend.write("/data/old", &old);
    backend.write("/data/replaced", &old);
    let cluster = TestCluster::with_options(caching(&backend, 3, "immediate", 1000));
    let client = cluster.client();

    // A backend file ringfs has not loaded, open while its name goes.
    let reader = client.open("/data/old", OpenFlags::READ, 0).unwrap();
    client.unlink("/data/old").unwrap();
    let replaced = client.open("/data/replaced", OpenFlags::READ, 0).unwrap();
    write_whole(&client, "/data/new", b"new");
    client.rename("/data/new", "/data/replaced").unwrap();
    // A file written in ringfs, unlinked while open, written again through its descriptor.
    let written = random_bytes(&mut random, 600_000);
    write_whole(&client, "/data/written", &written);
    let writer = client.open("/data/written", OpenFlags::READ | OpenFlags::WRITE, 0).unwrap();
    client.unlink("/data/written").unwrap();
    client.sync().unwrap();
    client.pwrite(writer, b"after the unlink", 10).unwrap();
    client.sync().unwrap();

    let read_fd = |fd, len: usize| {
        let mut bytes = vec![0u8; len];
        let mut done = 0;
        while done < len {
            let count = client.pread(fd, &mut bytes[done..], done as u64).unwrap_or_else(|errno| panic!("read at {done}: {errno}"));
            assert!(count > 0, "end of file at {done} of {len}");
            done += count;
        }
        bytes
    };
    assert_same("the unlinked backend file through its descriptor", &read_fd(reader, old.len()), &old);
    assert_same("the replaced backend file through its descriptor", &read_fd(replaced, old.len()), &old);
    let mut expected = written.clone();
    expected[10..26].copy_from_slice(b"after the unlink");
    assert_same("the unlinked written file through its descriptor", &read_fd(writer, expected.len()), &expected);
    for fd in [reader, replaced, writer] {
        client.close(fd).unwrap();
    }
    client.sync().unwrap();
    let tree = backend_tree(&backend);
    let names: Vec<&String> = tree.keys().collect();
    assert_eq!(names, ["/data", "/data/replaced"], "only the directory and the new file are left");
    assert_eq!(backend.read("/data/replaced"), b"new");
}

/// Extended attributes in the cached tree: those of backend files are seen in ringfs, and
/// what ringfs sets or removes reaches the backend file at the next sync.
#[test]
fn extended_attributes_reach_the_backend() {
    let backend = Backend::new("xattrs");
    backend.write("/in/file", b"bytes");
    let path = std::ffi::CString::new(backend.path("/in/file").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: valid NUL-terminated path and name; the value's length is passed.
    assert_eq!(unsafe { libc::setxattr(path.as_ptr(), c"user.origin".as_ptr(), b"pfs".as_ptr().cast(), 3, 0) }, 0);
    let cluster = TestCluster::with_options(caching(&backend, 2, "none", 1000));
    let client = cluster.client();
    assert_eq!(client.get_xattr("/in/file", "user.origin").unwrap(), b"pfs", "read through from the backend");
    client.set_xattr("/in/file", "user.added", b"ringfs", 0).unwrap();
    client.remove_xattr("/in/file", "user.origin").unwrap();
    write_whole(&client, "/in/new", b"new");
    client.set_xattr("/in/new", "user.fresh", b"1", 0).unwrap();
    client.sync().unwrap();
    let backend_xattrs = |relative: &str| {
        let output = Command::new("python3")
            .args(["-c", "import os,sys; print(sorted((n, os.getxattr(sys.argv[1], n)) for n in os.listxattr(sys.argv[1])))"])
            .arg(backend.path(relative))
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    };
    assert_eq!(backend_xattrs("/in/file"), "[('user.added', b'ringfs')]");
    assert_eq!(backend_xattrs("/in/new"), "[('user.fresh', b'1')]");
}

/// A backend file's bytes and its (device, inode).
type BackendFile = (Vec<u8>, (u64, u64));

/// The backend's files below its root by path, and its directories.
fn backend_files(backend: &Backend) -> (BTreeMap<String, BackendFile>, Vec<String>) {
    use std::os::unix::fs::MetadataExt;
    fn walk(dir: &Path, prefix: &str, files: &mut BTreeMap<String, BackendFile>, dirs: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = format!("{prefix}/{}", entry.file_name().to_string_lossy());
            let metadata = entry.metadata().unwrap();
            if metadata.is_dir() {
                dirs.push(path.clone());
                walk(&entry.path(), &path, files, dirs);
            } else {
                files.insert(path, (std::fs::read(entry.path()).unwrap(), (metadata.dev(), metadata.ino())));
            }
        }
    }
    let (mut files, mut dirs) = (BTreeMap::new(), Vec::new());
    walk(&backend.0, "", &mut files, &mut dirs);
    dirs.sort();
    (files, dirs)
}

/// Random hard links, unlinks, renames (of files with several names, over them, and of the
/// directories holding them), overwrites and new files in the cached tree, with flushes
/// running all the while; after every sync the backend must hold exactly the files ringfs
/// shows, under the same names, with the names of one file sharing one backend file (a hard
/// link there too) and no others; every stat shows the model's link count.
#[test]
fn hard_links_reach_the_backend_as_hard_links() {
    links_renames_and_syncs_against_a_model("hard-links", None, false, 31);
}

/// The same steps with stores far too small for the files (3 servers of 768 KiB for a few
/// MiB of files): flushed chunks are evicted all the time and writes go through to the
/// backend, so renames, links and unlinks meet files whose bytes are only in the backend.
/// (A rename there lost every evicted byte before the 19th session.) A step that finds no
/// room (ENOSPC) is tried again after a sync, as a user would; one refused again (a rename
/// over a file with other names must hold both files' bytes on one server) must change
/// nothing.
#[test]
fn hard_links_reach_the_backend_as_hard_links_while_full_stores_evict() {
    // (Seed 32 met the lost bytes of a rename after eviction; 31 did not.)
    links_renames_and_syncs_against_a_model("hard-links-full", Some("768K"), false, 32);
}

/// The same steps on `dir` stores, with a server killed (SIGKILL) 0–20 ms before every other
/// sync — while the servers still flush what came before, links and backend moves among it
/// — and restarted; the client goes on with the connections it has.
#[test]
fn hard_links_reach_the_backend_as_hard_links_while_servers_are_killed_and_restarted() {
    links_renames_and_syncs_against_a_model("hard-links-kills", None, true, 33);
}

/// The randomized steps of the tests above, on stores of `capacity` (unlimited: `None`),
/// with servers killed and restarted before syncs (`kills`), with `RINGFS_TEST_SEED` or
/// `default_seed`.
fn links_renames_and_syncs_against_a_model(tag: &str, capacity: Option<&str>, kills: bool, default_seed: u64) {
    let backend = Backend::new(tag);
    let seed = test_seed(default_seed);
    let mut random = Random::new(seed);
    // The model: each name's file (an index into `contents`), and the directories.
    let mut contents: Vec<Vec<u8>> = Vec::new();
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    let mut dirs: Vec<String> = vec!["/d1".into(), "/d2".into()];
    for dir in &dirs {
        std::fs::create_dir_all(backend.path(dir)).unwrap();
    }
    for (path, len) in [("/d1/a", 300_000), ("/d2/b", 70_000), ("/top", 10)] {
        let bytes = random_bytes(&mut random, len);
        backend.write(path, &bytes);
        names.insert(path.to_string(), contents.len());
        contents.push(bytes);
    }
    let mut options = caching(&backend, 3, "immediate", 1000);
    options.capacity = capacity.map(str::to_string);
    options.dir_store = kills;
    let mut cluster = TestCluster::with_options(options);
    let client = cluster.client();
    let mut killer = Random::new(seed ^ 0x6b69_6c6c);
    // A full store's ENOSPC: sync (the flushes make room) and try once more.
    let with_room = |what: &dyn Fn() -> ringfs_client::Result<()>| match what() {
        Err(ringfs_client::Errno::ENOSPC) if capacity.is_some() => {
            client.sync().unwrap();
            let again = what();
            if again.is_err() {
                // What filled the stores, for the failure's message.
                for stats in client.server_stats().unwrap() {
                    let cache = stats.cache.unwrap_or_default();
                    eprintln!(
                        "{}: {} of {} bytes used, {} chunks, {} dirty ({} bytes), {} entries",
                        stats.name, stats.bytes, stats.capacity_bytes, stats.chunks, cache.dirty_chunks, cache.dirty_bytes, stats.entries
                    );
                }
            }
            again
        }
        other => other,
    };
    // Whether a step happened: full stores may refuse it (ENOSPC, after a sync and a second
    // try: the bytes it must take along do not fit beside those pinned there), changing
    // nothing — which the next checks against the model verify.
    let happened = |result: ringfs_client::Result<()>, what: &str, history: &mut Vec<String>| match result {
        Ok(()) => true,
        Err(ringfs_client::Errno::ENOSPC) if capacity.is_some() => {
            history.push(format!("{what}: refused, no room"));
            false
        }
        Err(errno) => panic!("{what}: {errno}"),
    };
    let mut fresh = 0;
    let (mut links, mut renames, mut tree_renames, mut syncs) = (0, 0, 0, 0);
    // What each step did, for a failure's message.
    let mut history: Vec<String> = Vec::new();
    for step in 0..250 {
        let paths: Vec<String> = names.keys().cloned().collect();
        let pick = |random: &mut Random, list: &[String]| list[random.below(list.len() as u64) as usize].clone();
        let new_name = |random: &mut Random, fresh: &mut u32| {
            *fresh += 1;
            match random.below(dirs.len() as u64 + 1) as usize {
                0 => format!("/n{fresh}"),
                index => format!("{}/n{fresh}", dirs[index - 1]),
            }
        };
        match random.below(100) {
            0..=11 => {
                let path = new_name(&mut random, &mut fresh);
                let len = random.below(400_000) as usize;
                let bytes = random_bytes(&mut random, len);
                let created = with_room(&|| client.close(client.create(&path, 0o644)?));
                if !happened(created, &format!("step {step}: create {path}"), &mut history) {
                    continue;
                }
                write_whole(&client, &path, &bytes);
                history.push(format!("{step}: new {path} (file {})", contents.len()));
                names.insert(path, contents.len());
                contents.push(bytes);
            }
            12..=21 if !paths.is_empty() => {
                // An overwrite through one name: every name of the file shows it.
                let path = pick(&mut random, &paths);
                let len = random.below(400_000) as usize;
                let bytes = random_bytes(&mut random, len);
                // (The truncating open first: refused, it must leave the file as it was.)
                if !happened(
                    with_room(&|| client.close(client.create(&path, 0o644)?)),
                    &format!("step {step}: overwrite {path}"),
                    &mut history,
                ) {
                    continue;
                }
                write_whole(&client, &path, &bytes);
                history.push(format!("{step}: overwrite {path} (file {})", names[&path]));
                contents[names[&path]] = bytes;
            }
            22..=46 if !paths.is_empty() => {
                let from = pick(&mut random, &paths);
                let to = new_name(&mut random, &mut fresh);
                if !happened(with_room(&|| client.link(&from, &to)), &format!("step {step}: link {from} {to}"), &mut history) {
                    continue;
                }
                history.push(format!("{step}: link {from} {to} (file {})", names[&from]));
                names.insert(to, names[&from]);
                links += 1;
            }
            47..=58 if !paths.is_empty() => {
                let path = pick(&mut random, &paths);
                if !happened(with_room(&|| client.unlink(&path)), &format!("step {step}: unlink {path}"), &mut history) {
                    continue;
                }
                history.push(format!("{step}: unlink {path} (file {})", names[&path]));
                names.remove(&path);
            }
            59..=72 if !paths.is_empty() => {
                let from = pick(&mut random, &paths);
                let to = if random.below(2) == 0 { pick(&mut random, &paths) } else { new_name(&mut random, &mut fresh) };
                if !happened(with_room(&|| client.rename(&from, &to)), &format!("step {step}: rename {from} {to}"), &mut history) {
                    continue;
                }
                history.push(format!("{step}: rename {from} {to} (file {} over {:?})", names[&from], names.get(&to)));
                // Two names of one file: rename does nothing.
                if names.get(&to) != Some(&names[&from]) {
                    let file = names.remove(&from).unwrap();
                    names.insert(to, file);
                }
                renames += 1;
            }
            73..=77 => {
                let path = new_name(&mut random, &mut fresh);
                client.mkdir(&path, 0o755).unwrap_or_else(|errno| panic!("step {step}: mkdir {path}: {errno}"));
                history.push(format!("{step}: mkdir {path}"));
                dirs.push(path);
            }
            78..=84 => {
                // A directory (with whatever names of linked files it holds) moves.
                let from = pick(&mut random, &dirs);
                let to = new_name(&mut random, &mut fresh);
                if is_at_or_below(&to, &from) {
                    continue;
                }
                client.rename(&from, &to).unwrap_or_else(|errno| panic!("step {step}: rename {from} {to}: {errno}"));
                history.push(format!("{step}: rename directory {from} {to}"));
                let moved = |path: &String| if is_at_or_below(path, &from) { format!("{to}{}", &path[from.len()..]) } else { path.clone() };
                names = names.iter().map(|(path, file)| (moved(path), *file)).collect();
                dirs = dirs.iter().map(moved).collect();
                tree_renames += 1;
            }
            85..=92 if !paths.is_empty() => {
                let path = pick(&mut random, &paths);
                let file = names[&path];
                assert_same(&format!("step {step}: {path}"), &read_whole(&client, &path), &contents[file]);
                let expected = names.values().filter(|other| **other == file).count() as u32;
                assert_eq!(client.stat(&path).unwrap().nlink, expected, "step {step}: the link count of {path}");
            }
            93..=99 => {
                if kills && killer.below(2) == 0 {
                    let victim = killer.below(3) as usize;
                    std::thread::sleep(Duration::from_micros(killer.below(20_000)));
                    cluster.kill(victim);
                    cluster.restart(victim);
                    cluster.wait_for_alive(3);
                    history.push(format!("{step}: server {victim} killed and restarted"));
                }
                client.sync().unwrap_or_else(|errno| panic!("step {step}: sync: {errno}"));
                history.push(format!("{step}: sync"));
                check_backend_links(
                    &backend,
                    &names,
                    &contents,
                    &dirs,
                    &format!("step {step} (seed {seed}); the steps:\n{}\n", history.join("\n")),
                );
                syncs += 1;
            }
            _ => {}
        }
    }
    let totals = cache_totals(&client);
    eprintln!(
        "{links} links, {renames} renames, {tree_renames} directory renames, {syncs} syncs; {} names at the end; {} chunks evicted, {} bytes written through",
        names.len(),
        totals.evicted_chunks,
        totals.written_through_bytes
    );
    if capacity.is_some() {
        assert!(totals.evicted_chunks > 0, "the full stores evicted chunks");
    }
    // (Loose bounds: with 7 in 100 steps, some seeds draw few directory renames — seed 61913 drew 4.)
    assert!(links > 20 && renames > 10 && tree_renames > 1 && syncs > 5, "the random steps did what they are for");
    client.sync().unwrap();
    check_backend_links(&backend, &names, &contents, &dirs, &format!("the end (seed {seed}); the steps:\n{}\n", history.join("\n")));
    for (path, file) in &names {
        assert_same(&format!("ringfs at the end: {path}"), &read_whole(&client, path), &contents[*file]);
    }
}

/// The backend holds exactly the model's names with their files' bytes, its directories, and
/// one backend file per model file (names of one file are hard links of each other).
#[track_caller]
fn check_backend_links(backend: &Backend, names: &BTreeMap<String, usize>, contents: &[Vec<u8>], dirs: &[String], when: &str) {
    let (files, backend_dirs) = backend_files(backend);
    let mut want_dirs: Vec<String> = dirs.to_vec();
    want_dirs.sort();
    assert_eq!(backend_dirs, want_dirs, "{when}: the backend's directories");
    assert_eq!(files.keys().collect::<Vec<_>>(), names.keys().collect::<Vec<_>>(), "{when}: the backend's file names");
    // Every wrong name at once, with the backend file it is and which version it holds: one
    // name alone does not say whether a file's bytes or its link went wrong.
    let wrong: Vec<String> = files
        .iter()
        .filter(|(path, (bytes, _))| *bytes != contents[names[*path]])
        .map(|(path, (bytes, inode))| {
            let file = names[path];
            let version = contents.iter().position(|other| other == bytes).map_or("no file's".to_string(), |other| format!("file {other}'s"));
            let want = &contents[file];
            let differ: Vec<usize> = (0..bytes.len().min(want.len())).filter(|at| bytes[*at] != want[*at]).collect();
            let zeros = differ.iter().filter(|at| bytes[**at] == 0).count();
            format!(
                "{path} (file {file}, backend inode {}): {} bytes, {version} bytes, expected {}; {} bytes differ, from {:?} to {:?}, {zeros} of them zeros in the backend",
                inode.1,
                bytes.len(),
                want.len(),
                differ.len(),
                differ.first(),
                differ.last()
            )
        })
        .collect();
    if !wrong.is_empty() {
        let names_of = |file: usize| -> Vec<String> {
            files
                .iter()
                .filter(|(path, _)| names[*path] == file)
                .map(|(path, (bytes, inode))| format!("{path} (inode {}, {} bytes)", inode.1, bytes.len()))
                .collect()
        };
        let files_hit: BTreeSet<usize> =
            files.keys().filter(|path| files[*path].0 != contents[names[*path]]).map(|path| names[path]).collect();
        let all: Vec<String> = files_hit.iter().map(|file| format!("file {file}: {}", names_of(*file).join(", "))).collect();
        panic!("{when}: wrong bytes in the backend:\n{}\nthe names of those files:\n{}", wrong.join("\n"), all.join("\n"));
    }
    let mut inode_of_file: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
    let mut file_of_inode: BTreeMap<(u64, u64), usize> = BTreeMap::new();
    for (path, (_, inode)) in &files {
        let file = names[path];
        let first = *inode_of_file.entry(file).or_insert(*inode);
        assert_eq!(first, *inode, "{when}: {path} is a hard link of the file's other names in the backend");
        let owner = *file_of_inode.entry(*inode).or_insert(file);
        assert_eq!(owner, file, "{when}: {path} shares its backend file with another file's names");
    }
}

/// A small new file renamed over a large file whose chunks are being flushed, again and
/// again with immediate flushing: the backend file at the name must end up as the new file,
/// never with bytes of the replaced one written into it (the replaced file's flush learnt
/// the name as its place just before the rename took it).
#[test]
fn a_file_renamed_over_a_file_being_flushed_is_not_mixed_with_it_in_the_backend() {
    let backend = Backend::new("replace-under-flush");
    let cluster = TestCluster::with_options(caching(&backend, 3, "immediate", 1000));
    let client = cluster.client();
    let mut random = Random::new(41);
    let rounds = std::env::var("RINGFS_TEST_ROUNDS").ok().and_then(|rounds| rounds.parse().ok()).unwrap_or(60);
    for round in 0..rounds {
        let large = random_bytes(&mut random, 900_000);
        let small = random_bytes(&mut random, 20_000 + round);
        write_whole(&client, "/f", &large);
        write_whole(&client, "/new", &small);
        client.rename("/new", "/f").unwrap();
        if round % 10 == 9 {
            client.sync().unwrap();
            assert_same(&format!("round {round}: /f in the backend"), &backend.read("/f"), &small);
        }
    }
    client.sync().unwrap();
}

/// A directory tree made outside the cached tree (a job's scratch output) renamed into it —
/// nested directories, files of several chunks, a symbolic link, a file with two names in
/// the tree and one outside — reaches the backend whole at the next sync; ringfs shows it at
/// once. A tree renamed out of the cached tree, or exchanged across its border, answers
/// EXDEV (`mv` copies).
#[test]
fn a_directory_renamed_into_the_cached_tree_reaches_the_backend() {
    let backend = Backend::new("rename-in");
    backend.write("/existing", b"already there");
    let mut options = caching(&backend, 3, "immediate", 1000);
    options.extra_args.extend(["--mount-path".to_string(), "/pfs".to_string()]);
    let cluster = TestCluster::with_options(options);
    let client = cluster.client();
    let mut random = Random::new(51);
    client.mkdir("/scratch", 0o755).unwrap();
    client.mkdir("/scratch/out", 0o750).unwrap();
    client.mkdir("/scratch/out/deep", 0o755).unwrap();
    let mut files = BTreeMap::new();
    for (path, len) in [("/scratch/out/a", 700_000), ("/scratch/out/deep/b", 5), ("/scratch/out/deep/c", 300_000)] {
        let bytes = random_bytes(&mut random, len);
        write_whole(&client, path, &bytes);
        files.insert(path.replace("/scratch/out", "/results"), bytes);
    }
    client.symlink("deep/b", "/scratch/out/link").unwrap();
    client.link("/scratch/out/a", "/scratch/out/deep/a-again").unwrap();
    client.link("/scratch/out/a", "/scratch/a-outside").unwrap();
    files.insert("/results/deep/a-again".into(), files["/results/a"].clone());
    client.rename("/scratch/out", "/pfs/results").unwrap();
    for (path, bytes) in &files {
        assert_same(&format!("ringfs {path}"), &read_whole(&client, &format!("/pfs{path}")), bytes);
    }
    assert!(client.stat("/pfs/results/deep/c").unwrap().backed, "the moved files are in the cached tree now");
    client.sync().unwrap();
    for (path, bytes) in &files {
        assert_same(&format!("the backend's {path}"), &backend.read(path), bytes);
    }
    assert_eq!(std::fs::read_link(backend.path("/results/link")).unwrap(), Path::new("deep/b"));
    use std::os::unix::fs::MetadataExt;
    let (first, second) =
        (std::fs::metadata(backend.path("/results/a")).unwrap(), std::fs::metadata(backend.path("/results/deep/a-again")).unwrap());
    assert_eq!(first.ino(), second.ino(), "two names of one file in the tree are hard links in the backend");
    assert_eq!(std::fs::metadata(backend.path("/results")).unwrap().mode() & 0o777, 0o750, "the directory keeps its mode");
    assert_eq!(backend.read("/existing"), b"already there");
    // Written after the move: reaches the backend too; the name outside stays outside.
    write_whole(&client, "/pfs/results/deep/c", b"changed");
    assert_same("/scratch/a-outside", &read_whole(&client, "/scratch/a-outside"), &files["/results/a"]);
    client.sync().unwrap();
    assert_eq!(backend.read("/results/deep/c"), b"changed");
    // Out of the cached tree, or exchanged across its border: EXDEV.
    client.mkdir("/scratch/other", 0o755).unwrap();
    assert_eq!(client.rename("/pfs/results", "/scratch/back").unwrap_err(), ringfs_client::Errno::EXDEV);
    assert_eq!(
        client.rename_with_flags("/scratch/other", "/pfs/results", ringfs_client::RenameFlags::EXCHANGE).unwrap_err(),
        ringfs_client::Errno::EXDEV
    );
}

/// A tree renamed into the cached tree over an empty directory whose backend directory still
/// holds names removed in ringfs (not flushed yet): after a sync the backend holds the new
/// tree, the removed names gone — never a new file removed by an old name's removal.
#[test]
fn a_directory_renamed_over_one_with_unflushed_removals_keeps_its_new_files() {
    let backend = Backend::new("rename-in-over");
    backend.write("/results/c", b"old c");
    backend.write("/results/old.txt", b"old");
    let mut options = caching(&backend, 3, "none", 1000);
    options.extra_args.extend(["--mount-path".to_string(), "/pfs".to_string()]);
    let cluster = TestCluster::with_options(options);
    let client = cluster.client();
    for name in ["/pfs/results/c", "/pfs/results/old.txt"] {
        client.unlink(name).unwrap();
    }
    assert!(client.readdir("/pfs/results").unwrap().is_empty());
    client.mkdir("/scratch", 0o755).unwrap();
    client.mkdir("/scratch/out", 0o755).unwrap();
    write_whole(&client, "/scratch/out/c", b"new c");
    write_whole(&client, "/scratch/out/d", b"new d");
    client.rename("/scratch/out", "/pfs/results").unwrap();
    client.sync().unwrap();
    assert_eq!(backend.read("/results/c"), b"new c");
    assert_eq!(backend.read("/results/d"), b"new d");
    assert!(!backend.path("/results/old.txt").exists(), "the removed name is gone from the backend");
}
