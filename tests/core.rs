//! End-to-end behaviour of the file system: data, names, POSIX errors, capacity.
//! Every test starts real `ringfs server` processes and uses the real client.

mod common;

use std::collections::BTreeSet;
use std::io::SeekFrom;

use common::{ClusterOptions, Random, TestCluster};
use ringfs_client::{Client, ClientConfig, Errno, FindFilter, OpenFlags};

fn open_rw(client: &Client, path: &str) -> ringfs_client::Fd {
    client.open(path, OpenFlags::READ | OpenFlags::WRITE | OpenFlags::CREATE, 0o644).unwrap()
}

fn read_whole(client: &Client, path: &str) -> Vec<u8> {
    let size = client.stat(path).unwrap().size as usize;
    let fd = client.open(path, OpenFlags::READ, 0).unwrap();
    let mut bytes = vec![0u8; size + 100];
    let count = client.pread(fd, &mut bytes, 0).unwrap();
    client.close(fd).unwrap();
    bytes.truncate(count);
    bytes
}

fn small_chunk_client(cluster: &TestCluster, local_fast_path: bool) -> Client {
    let mut config: ClientConfig = cluster.client_config();
    config.chunk_size = 64 * 1024;
    config.local_fast_path = local_fast_path;
    Client::connect(config).unwrap()
}

/// Random writes, reads and truncates across chunk boundaries, compared with a plain vector,
/// over both transfer paths (same-host fast path and TCP).
#[test]
fn random_io_across_chunk_boundaries_matches_a_reference_model() {
    let cluster = TestCluster::start(3);
    for (seed, fast_path) in [(7, true), (11, false)] {
        let client = small_chunk_client(&cluster, fast_path);
        let path = format!("/model-{seed}");
        let fd = open_rw(&client, &path);
        let mut model: Vec<u8> = Vec::new();
        let mut random = Random::new(seed);
        for step in 0..250 {
            match random.below(10) {
                0..=4 => {
                    let offset = random.below(900_000) as usize;
                    let mut bytes = vec![0u8; random.below(200_000) as usize + 1];
                    random.fill(&mut bytes);
                    assert_eq!(client.pwrite(fd, &bytes, offset as u64).unwrap(), bytes.len());
                    if model.len() < offset + bytes.len() {
                        model.resize(offset + bytes.len(), 0);
                    }
                    model[offset..offset + bytes.len()].copy_from_slice(&bytes);
                }
                5..=7 => {
                    let offset = random.below(1_100_000) as usize;
                    let mut buffer = vec![0xAAu8; random.below(300_000) as usize + 1];
                    let count = client.pread(fd, &mut buffer, offset as u64).unwrap();
                    let expected = model.get(offset..).map_or(&[][..], |tail| &tail[..tail.len().min(buffer.len())]);
                    assert_eq!(count, expected.len(), "step {step}: read length at {offset}");
                    assert!(buffer[..count] == *expected, "step {step}: read contents at {offset}");
                }
                8 => {
                    let size = random.below(1_000_000) as usize;
                    client.ftruncate(fd, size as u64).unwrap();
                    model.resize(size, 0);
                }
                _ => assert_eq!(client.fstat(fd).unwrap().size, model.len() as u64, "step {step}: size"),
            }
        }
        assert!(read_whole(&client, &path) == model);
        client.close(fd).unwrap();
    }
}

/// Many writers fill disjoint, interleaved 47,008-byte blocks of one shared file (the
/// IOR-hard pattern); a fresh client reads back every block.
#[test]
fn many_writers_to_interleaved_blocks_of_one_shared_file() {
    const BLOCK: usize = 47_008;
    const WRITERS: usize = 6;
    const SEGMENTS: usize = 30;
    let cluster = TestCluster::start(3);
    let block = |writer: usize, segment: usize| -> Vec<u8> {
        let mut bytes = vec![0u8; BLOCK];
        Random::new((writer * 1000 + segment + 1) as u64).fill(&mut bytes);
        bytes
    };
    let setup = cluster.client();
    setup.close(setup.create("/shared", 0o644).unwrap()).unwrap();
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let client = cluster.client();
            std::thread::spawn(move || {
                let fd = client.open("/shared", OpenFlags::WRITE, 0).unwrap();
                for segment in 0..SEGMENTS {
                    let offset = ((segment * WRITERS + writer) * BLOCK) as u64;
                    assert_eq!(client.pwrite(fd, &block(writer, segment), offset).unwrap(), BLOCK);
                }
                client.close(fd).unwrap();
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    let reader = cluster.client();
    assert_eq!(reader.stat("/shared").unwrap().size, (WRITERS * SEGMENTS * BLOCK) as u64);
    let fd = reader.open("/shared", OpenFlags::READ, 0).unwrap();
    let mut buffer = vec![0u8; BLOCK];
    for segment in 0..SEGMENTS {
        for writer in 0..WRITERS {
            let offset = ((segment * WRITERS + writer) * BLOCK) as u64;
            assert_eq!(reader.pread(fd, &mut buffer, offset).unwrap(), BLOCK);
            assert!(buffer == block(writer, segment), "block of writer {writer}, segment {segment}");
        }
    }
}

/// A directory of 10,000 entries spread over 4 servers lists completely, with every server
/// holding part of it.
#[test]
fn readdir_of_ten_thousand_entries_spread_over_four_servers() {
    let cluster = TestCluster::start(4);
    let client = cluster.client();
    client.mkdir("/big", 0o755).unwrap();
    let creators: Vec<_> = (0..4)
        .map(|part| {
            let client = cluster.client();
            std::thread::spawn(move || {
                for index in (part..10_000).step_by(4) {
                    let fd = client
                        .open(&format!("/big/entry.{index:05}"), OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::EXCLUSIVE, 0o600)
                        .unwrap();
                    client.close(fd).unwrap();
                }
            })
        })
        .collect();
    for creator in creators {
        creator.join().unwrap();
    }
    let listing = client.readdir("/big").unwrap();
    let names: Vec<String> = listing.iter().map(|entry| entry.name.clone()).collect();
    let expected: Vec<String> = (0..10_000).map(|index| format!("entry.{index:05}")).collect();
    assert_eq!(names, expected);
    assert!(listing.iter().all(|entry| entry.stat.size == 0 && entry.stat.mode & 0o777 == 0o600));
    let per_server: Vec<u64> = client.server_stats().unwrap().iter().map(|stats| stats.entries).collect();
    assert!(per_server.iter().all(|entries| *entries >= 1_000), "entries per server: {per_server:?}");
}

#[test]
fn truncate_shrinks_and_grows_files_with_zero_filled_holes() {
    let cluster = TestCluster::start(3);
    let client = small_chunk_client(&cluster, true);
    let chunk = 64 * 1024;
    let mut data = vec![0u8; chunk * 3 + chunk / 2];
    Random::new(3).fill(&mut data);
    let fd = open_rw(&client, "/t");
    client.pwrite(fd, &data, 0).unwrap();

    client.truncate("/t", (chunk + chunk / 5) as u64).unwrap();
    assert_eq!(client.stat("/t").unwrap().size, (chunk + chunk / 5) as u64);
    assert!(read_whole(&client, "/t") == data[..chunk + chunk / 5]);

    client.ftruncate(fd, (chunk * 5) as u64).unwrap();
    let grown = read_whole(&client, "/t");
    assert_eq!(grown.len(), chunk * 5);
    assert!(grown[..chunk + chunk / 5] == data[..chunk + chunk / 5]);
    assert!(grown[chunk + chunk / 5..].iter().all(|byte| *byte == 0), "old bytes past the cut must not come back");

    client.truncate("/t", 0).unwrap();
    assert_eq!(client.stat("/t").unwrap().size, 0);
    // A sparse file: grow an empty file far past its first chunk, write near the end.
    client.truncate("/t", 10 * chunk as u64 + 17).unwrap();
    assert_eq!(client.stat("/t").unwrap().size, 10 * chunk as u64 + 17);
    client.pwrite(fd, b"tail", 10 * chunk as u64 + 10).unwrap();
    let sparse = read_whole(&client, "/t");
    assert_eq!(sparse.len(), 10 * chunk + 17);
    assert_eq!(&sparse[10 * chunk + 10..10 * chunk + 14], b"tail");
    assert!(sparse[..10 * chunk + 10].iter().all(|byte| *byte == 0));
    // A write far beyond the end of a new file extends it.
    let fd2 = open_rw(&client, "/t2");
    client.pwrite(fd2, b"x", 7 * chunk as u64 + 3).unwrap();
    assert_eq!(client.fstat(fd2).unwrap().size, 7 * chunk as u64 + 4);
    assert!(client.truncate("/", 0).is_err());
}

#[test]
fn rename_moves_files_whole_and_replaces_targets() {
    let cluster = TestCluster::start(3);
    let client = small_chunk_client(&cluster, true);
    let mut big = vec![0u8; 64 * 1024 * 7 + 123];
    Random::new(9).fill(&mut big);
    client.mkdir("/src", 0o755).unwrap();
    client.mkdir("/dst", 0o755).unwrap();
    let fd = client.create("/src/big", 0o640).unwrap();
    client.pwrite(fd, &big, 0).unwrap();
    client.close(fd).unwrap();

    client.rename("/src/big", "/dst/big").unwrap();
    assert_eq!(client.stat("/src/big").unwrap_err(), Errno::ENOENT);
    let moved = client.stat("/dst/big").unwrap();
    assert_eq!((moved.size, moved.mode & 0o777), (big.len() as u64, 0o640));
    assert!(read_whole(&client, "/dst/big") == big);

    // Rename over an existing, larger file: the target shows exactly the source afterwards.
    let fd = client.create("/dst/target", 0o644).unwrap();
    client.pwrite(fd, &vec![7u8; 64 * 1024 * 12], 0).unwrap();
    client.close(fd).unwrap();
    let fd = client.create("/src/small", 0o644).unwrap();
    client.pwrite(fd, b"small file", 0).unwrap();
    client.close(fd).unwrap();
    client.rename("/src/small", "/dst/target").unwrap();
    assert_eq!(read_whole(&client, "/dst/target"), b"small file");
    client.rename("/dst/big", "/dst/target").unwrap();
    assert!(read_whole(&client, "/dst/target") == big);
    let names: Vec<String> = client.readdir("/dst").unwrap().into_iter().map(|entry| entry.name).collect();
    assert_eq!(names, ["target"]);

    assert_eq!(client.rename("/src/missing", "/dst/x").unwrap_err(), Errno::ENOENT);
    assert_eq!(client.rename("/dst/target", "/nowhere/x").unwrap_err(), Errno::ENOENT);
    assert_eq!(client.rename("/dst/target", "/src").unwrap_err(), Errno::EISDIR);
    // Directories rename too (tests/namespace.rs covers them).
    client.rename("/src", "/elsewhere").unwrap();
    assert!(client.stat("/elsewhere").unwrap().is_dir());
    // Space of the replaced files is freed on every server.
    client.unlink("/dst/target").unwrap();
    let used: u64 = client.server_stats().unwrap().iter().map(|stats| stats.bytes).sum();
    assert!(used < 64 * 1024, "{used} bytes still used after removing every file");
}

#[test]
fn symbolic_links_resolve_and_dangle_like_posix() {
    let cluster = TestCluster::start(2);
    let client = cluster.client();
    client.mkdir("/data", 0o755).unwrap();
    let fd = client.create("/data/real", 0o644).unwrap();
    client.write(fd, b"through the link").unwrap();
    client.close(fd).unwrap();
    client.symlink("real", "/data/relative").unwrap();
    client.symlink("/data/real", "/absolute").unwrap();
    assert_eq!(client.readlink("/data/relative").unwrap(), "real");
    assert_eq!(client.stat("/absolute").unwrap().size, 16);
    assert!(client.lstat("/absolute").unwrap().kind() == Some(ringfs_client::FileKind::Symlink));
    assert_eq!(read_whole(&client, "/data/relative"), b"through the link");
    assert_eq!(client.readlink("/data/real").unwrap_err(), Errno::EINVAL);
    assert_eq!(client.symlink("x", "/absolute").unwrap_err(), Errno::EEXIST);
    client.unlink("/absolute").unwrap();
    assert!(client.stat("/data/real").is_ok());
    client.symlink("/nowhere", "/dangling").unwrap();
    assert_eq!(client.stat("/dangling").unwrap_err(), Errno::ENOENT);
    client.symlink("/loop2", "/loop1").unwrap();
    client.symlink("/loop1", "/loop2").unwrap();
    assert_eq!(client.stat("/loop1").unwrap_err(), Errno::ELOOP);
}

#[test]
fn namespace_operations_fail_with_posix_errors() {
    let cluster = TestCluster::start(3);
    let client = cluster.client();
    client.mkdir("/d", 0o755).unwrap();
    client.close(client.create("/d/f", 0o644).unwrap()).unwrap();

    assert_eq!(client.rmdir("/d").unwrap_err(), Errno::ENOTEMPTY);
    assert_eq!(client.create("/missing/f", 0o644).unwrap_err(), Errno::ENOENT);
    assert_eq!(client.mkdir("/missing/sub", 0o755).unwrap_err(), Errno::ENOENT);
    assert_eq!(client.mkdir("/d", 0o755).unwrap_err(), Errno::EEXIST);
    assert_eq!(client.open("/d/f", OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::EXCLUSIVE, 0o644).unwrap_err(), Errno::EEXIST);
    assert_eq!(client.unlink("/d").unwrap_err(), Errno::EISDIR);
    assert_eq!(client.rmdir("/d/f").unwrap_err(), Errno::ENOTDIR);
    assert_eq!(client.open("/d/none", OpenFlags::READ, 0).unwrap_err(), Errno::ENOENT);
    assert_eq!(client.create("/d/f/child", 0o644).unwrap_err(), Errno::ENOTDIR);
    assert_eq!(client.readdir("/d/f").unwrap_err(), Errno::ENOTDIR);
    assert_eq!(client.open("/d", OpenFlags::WRITE, 0).unwrap_err(), Errno::EISDIR);
    assert_eq!(client.rmdir("/").unwrap_err(), Errno::EBUSY);
    assert_eq!(client.stat(&format!("/{}", "n".repeat(300))).unwrap_err(), Errno::ENAMETOOLONG);

    // Once a directory is removed, nothing can be created in it (on any server).
    client.unlink("/d/f").unwrap();
    client.rmdir("/d").unwrap();
    for index in 0..20 {
        assert_eq!(client.create(&format!("/d/f{index}"), 0o644).unwrap_err(), Errno::ENOENT);
    }
    // ... and a new directory of the same name works normally.
    client.mkdir("/d", 0o700).unwrap();
    client.close(client.create("/d/again", 0o644).unwrap()).unwrap();
    assert_eq!(client.readdir("/d").unwrap().len(), 1);
    let fd = client.open("/d/again", OpenFlags::READ, 0).unwrap();
    assert_eq!(client.write(fd, b"x").unwrap_err(), Errno::EBADF);
    assert_eq!(client.close(ringfs_client::Fd(9999)).unwrap_err(), Errno::EBADF);
}

/// Appends from several clients at once — the nodes of a job adding lines to one log —
/// never overwrite each other: each client found the file's size and wrote there, so two
/// appends at once landed on the same bytes (lines lost). The file's inode server now
/// places each append after those placed before it. Also across chunks (small chunks
/// here), through `pwrite` on an append descriptor (Linux appends there too), and after a
/// truncation (the next append goes at the new end).
#[test]
fn appends_from_several_clients_at_once_all_land_whole() {
    let cluster = TestCluster::start(3);
    // (4-KiB chunks: the records cross chunks.)
    let setup = client_with_chunks(&cluster, 4096);
    setup.close(setup.create("/log", 0o644).unwrap()).unwrap();
    const RECORDS: usize = 150;
    let record = |writer: usize, index: usize| format!("writer {writer} record {index:04}\n");
    std::thread::scope(|scope| {
        for writer in 0..3 {
            // (One client each, as separate processes or nodes have.)
            let client = cluster.client();
            scope.spawn(move || {
                let fd = client.open("/log", OpenFlags::WRITE | OpenFlags::APPEND, 0).unwrap();
                for index in 0..RECORDS {
                    let bytes = record(writer, index);
                    let written = if index % 2 == 0 { client.write(fd, bytes.as_bytes()) } else { client.pwrite(fd, bytes.as_bytes(), 0) };
                    assert_eq!(written.unwrap(), bytes.len());
                }
                client.close(fd).unwrap();
            });
        }
    });
    let text = String::from_utf8(common::read_file(&setup, "/log").unwrap()).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3 * RECORDS, "every append is there once: {} bytes", text.len());
    lines.sort_unstable();
    let mut expected: Vec<String> = (0..3).flat_map(|writer| (0..RECORDS).map(move |index| record(writer, index))).collect();
    expected.sort_unstable();
    assert_eq!(lines, expected.iter().map(|line| line.trim_end()).collect::<Vec<_>>());
    // Each writer's records are in its order.
    for writer in 0..3 {
        let own: Vec<&str> = text.lines().filter(|line| line.starts_with(&format!("writer {writer} "))).collect();
        assert!(own.windows(2).all(|pair| pair[0] < pair[1]), "writer {writer}'s records out of order");
    }
    // After a truncation, appends start at the new end.
    setup.truncate("/log", 5).unwrap();
    let fd = setup.open("/log", OpenFlags::WRITE | OpenFlags::APPEND, 0).unwrap();
    setup.write(fd, b"+").unwrap();
    setup.close(fd).unwrap();
    assert_eq!(common::read_file(&setup, "/log").unwrap(), b"write+");
}

/// A rename of a name to itself while another client renames files over that name: POSIX
/// says it does nothing (and succeeds while the name exists). The rename looked the name up
/// and then its file, which the other rename had just replaced: ESTALE reached the caller
/// (found by the soak in the cache-mode rename test, seed 55116).
#[test]
fn a_rename_to_itself_beside_renames_over_the_name_never_fails_stale() {
    let cluster = TestCluster::start(2);
    let setup = cluster.client();
    setup.close(setup.create("/x", 0o644).unwrap()).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let replacer = cluster.client();
        let stop = &stop;
        scope.spawn(move || {
            for round in 0..3000 {
                let own = format!("/new-{}", round % 4);
                replacer.close(replacer.create(&own, 0o644).unwrap()).unwrap();
                replacer.rename(&own, "/x").unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let renamer = cluster.client();
        let mut renames = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            match renamer.rename("/x", "/x") {
                Ok(()) | Err(Errno::ENOENT) => renames += 1,
                Err(errno) => panic!("rename /x -> /x after {renames}: {errno}"),
            }
        }
    });
}

/// A rename onto a name that another client keeps renaming files over: the target's name
/// lock read the name, then its file, which the other rename had just replaced — ESTALE
/// reached the caller (found by `posix_mount.rs:
/// random_namespace_operations_at_once_on_two_mounts_…`, seed 68955, through a mount).
#[test]
fn a_rename_onto_a_name_others_rename_over_never_fails_stale() {
    let cluster = TestCluster::start(2);
    let setup = cluster.client();
    setup.close(setup.create("/x", 0o644).unwrap()).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let replacer = cluster.client();
        let stop = &stop;
        scope.spawn(move || {
            for round in 0..3000 {
                let own = format!("/new-{}", round % 4);
                replacer.close(replacer.create(&own, 0o644).unwrap()).unwrap();
                replacer.rename(&own, "/x").unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let renamer = cluster.client();
        let mut renames = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            renamer.close(renamer.create("/mine", 0o644).unwrap()).unwrap();
            match renamer.rename("/mine", "/x") {
                Ok(()) => renames += 1,
                Err(errno) => panic!("rename /mine -> /x after {renames}: {errno}"),
            }
        }
    });
}

#[test]
fn file_positions_append_and_attributes_work() {
    let cluster = TestCluster::start(2);
    let client = cluster.client();
    let fd = client.create("/log", 0o600).unwrap();
    client.write(fd, b"one ").unwrap();
    client.write(fd, b"two").unwrap();
    client.close(fd).unwrap();
    let fd = client.open("/log", OpenFlags::WRITE | OpenFlags::APPEND, 0).unwrap();
    client.write(fd, b" three").unwrap();
    client.close(fd).unwrap();
    let fd = client.open("/log", OpenFlags::READ, 0).unwrap();
    assert_eq!(client.seek(fd, SeekFrom::End(-5)).unwrap(), 8);
    let mut tail = [0u8; 10];
    assert_eq!(client.read(fd, &mut tail).unwrap(), 5);
    assert_eq!(&tail[..5], b"three");
    assert_eq!(client.read(fd, &mut tail).unwrap(), 0, "end of file");
    client.close(fd).unwrap();

    client.chmod("/log", 0o640).unwrap();
    client.chown("/log", Some(1234), Some(99)).unwrap();
    client.utimens("/log", Some(1_000_000_000), Some(2_000_000_000)).unwrap();
    let stat = client.stat("/log").unwrap();
    assert_eq!((stat.mode & 0o7777, stat.uid, stat.gid, stat.mtime_ns, stat.atime_ns), (0o640, 1234, 99, 2_000_000_000, 1_000_000_000));
    client.access("/log", 0).unwrap();
    assert_eq!(client.access("/missing", 0).unwrap_err(), Errno::ENOENT);
    // Opening with O_TRUNC empties the file.
    client.close(client.open("/log", OpenFlags::WRITE | OpenFlags::TRUNCATE, 0).unwrap()).unwrap();
    assert_eq!(client.stat("/log").unwrap().size, 0);
}

#[test]
fn a_full_store_gives_enospc_and_space_comes_back_after_unlink() {
    let cluster = TestCluster::with_options(ClusterOptions { capacity: Some("2M".into()), ..ClusterOptions::new(2) });
    let client = cluster.client();
    let fd = client.create("/fill", 0o644).unwrap();
    let block = vec![1u8; 1 << 20];
    let mut written = 0u64;
    let error = loop {
        match client.pwrite(fd, &block, written) {
            Ok(count) => written += count as u64,
            Err(errno) => break errno,
        }
        assert!(written <= 8 << 20, "capacity limit not enforced");
    };
    assert_eq!(error, Errno::ENOSPC);
    assert!(written >= 2 << 20, "only {written} bytes fit in 4 MiB of capacity");
    client.close(fd).unwrap();
    client.unlink("/fill").unwrap();
    let fd = client.create("/again", 0o644).unwrap();
    client.pwrite(fd, &block, 0).unwrap();
}

/// Names and numbers that are easy to get wrong: files named like numbers, deep paths,
/// names with spaces and non-ASCII characters.
#[test]
fn unusual_names_round_trip() {
    let cluster = TestCluster::start(3);
    let client = cluster.client();
    let names = ["00000001", "with space", "ünïcödé", "dots.in.name", "...", "a-b_c+d=e"];
    for name in names {
        let fd = client.create(&format!("/{name}"), 0o644).unwrap();
        client.write(fd, name.as_bytes()).unwrap();
        client.close(fd).unwrap();
    }
    let listed: BTreeSet<String> = client.readdir("/").unwrap().into_iter().map(|entry| entry.name).collect();
    assert_eq!(listed, names.iter().map(|name| name.to_string()).collect());
    for name in names {
        assert_eq!(read_whole(&client, &format!("/{name}")), name.as_bytes());
    }
    let mut deep = String::new();
    for level in 0..30 {
        deep.push_str(&format!("/level{level}"));
        client.mkdir(&deep, 0o755).unwrap();
    }
    client.close(client.create(&format!("{deep}/leaf"), 0o644).unwrap()).unwrap();
    assert!(client.stat(&format!("{deep}/leaf")).is_ok());
}

/// Server-side find: every server filters its own entries; files spread over servers are
/// judged by size and time as a whole.
#[test]
fn find_counts_what_find_would_count() {
    let cluster = TestCluster::start(3);
    let client = small_chunk_client(&cluster, true);
    client.mkdir("/tree", 0o755).unwrap();
    client.mkdir("/tree/old", 0o755).unwrap();
    for index in 0..50 {
        let fd = client.create(&format!("/tree/old/file.{index:03}"), 0o644).unwrap();
        client.write(fd, &[1u8; 3901]).unwrap();
        client.close(fd).unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(20));
    let timestamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
    std::thread::sleep(std::time::Duration::from_millis(20));
    client.mkdir("/tree/new", 0o755).unwrap();
    for index in 0..50 {
        let fd = client.create(&format!("/tree/new/file.{index:03}"), 0o644).unwrap();
        client.write(fd, &vec![2u8; if index % 2 == 0 { 3901 } else { 100 }]).unwrap();
        client.close(fd).unwrap();
    }
    // A large file (spread over servers) whose first chunk is old but whose last write is new.
    let fd = client.create("/tree/big.01", 0o644).unwrap();
    client.pwrite(fd, &[3u8; 3901], 0).unwrap();
    client.close(fd).unwrap();
    client.truncate("/tree/big.01", 64 * 1024 * 3).unwrap();
    client.truncate("/tree/big.01", 3901).unwrap();

    let all = client.find("/tree", &FindFilter::default()).unwrap();
    assert_eq!(all.scanned, 2 + 50 + 50 + 1, "directories and files below /tree");
    assert_eq!(all.matched, all.scanned);
    let io500_like = FindFilter { newer_than_ns: Some(timestamp), size: Some(3901), name: Some("*01*".into()) };
    let found = client.find("/tree", &io500_like).unwrap();
    // New files of 3901 bytes whose names contain "01": file.010, 012, 014, 016, 018 and big.01.
    assert_eq!(found.matched, 6);
    assert_eq!(client.find("/tree/old", &FindFilter { name: Some("file.04?".into()), ..FindFilter::default() }).unwrap().matched, 10);
    assert_eq!(client.find("/tree/old/file.000", &FindFilter::default()).unwrap_err(), Errno::ENOTDIR);
}

#[test]
fn writes_past_the_first_chunk_update_the_files_modification_time() {
    let cluster = TestCluster::start(3);
    let client = small_chunk_client(&cluster, true);
    let fd = client.create("/timed", 0o644).unwrap();
    client.pwrite(fd, &[1u8; 64 * 1024 * 3], 0).unwrap();
    client.utimens("/timed", None, Some(1_000_000_000)).unwrap();
    let before = client.stat("/timed").unwrap().mtime_ns;
    client.pwrite(fd, b"late", 64 * 1024 * 2 + 5).unwrap();
    let after = client.stat("/timed").unwrap().mtime_ns;
    assert!(after > before, "a write to the third chunk must show in the file's mtime ({before} -> {after})");
}

/// A reader that opened a one-chunk file sees what another client appends past chunk 0 after
/// the open (the reader first asks chunk 0 alone, whose attributes say the file grew).
#[test]
fn a_file_that_grows_past_chunk_zero_after_open_reads_whole() {
    let cluster = TestCluster::start(3);
    let writer = small_chunk_client(&cluster, true);
    let reader = small_chunk_client(&cluster, false);
    let fd = writer.create("/grows", 0o644).unwrap();
    writer.write(fd, b"head").unwrap();
    let read_fd = reader.open("/grows", OpenFlags::READ, 0).unwrap();
    let mut buffer = vec![0u8; 300_000];
    assert_eq!(reader.pread(read_fd, &mut buffer, 0).unwrap(), 4);
    let mut tail = vec![0u8; 200_000];
    Random::new(5).fill(&mut tail);
    writer.pwrite(fd, &tail, 100_000).unwrap();
    let count = reader.pread(read_fd, &mut buffer, 0).unwrap();
    assert_eq!(count, 300_000);
    assert_eq!(&buffer[..4], b"head");
    assert!(buffer[4..100_000].iter().all(|byte| *byte == 0));
    assert!(buffer[100_000..] == tail[..]);
    // Reading from beyond chunk 0 directly works as well.
    assert_eq!(reader.pread(read_fd, &mut buffer[..1000], 150_000).unwrap(), 1000);
    assert!(buffer[..1000] == tail[50_000..51_000]);
    assert_eq!(reader.pread(read_fd, &mut buffer, 400_000).unwrap(), 0);
    reader.close(read_fd).unwrap();
    writer.close(fd).unwrap();
}

/// A modification time set explicitly on a file of several chunks reads back as set (the
/// chunks' own write times, which count for files extended past chunk 0, must not win), and
/// the next write moves it on again (`rsync -a`, `touch -d`, `cp -p` of large files).
#[test]
fn an_explicit_mtime_on_a_file_of_many_chunks_holds_until_the_next_write() {
    let cluster = TestCluster::start(3);
    let client = small_chunk_client(&cluster, true);
    let fd = open_rw(&client, "/big");
    client.pwrite(fd, &vec![7u8; 5 * 64 * 1024 + 10], 0).unwrap();
    let set = 1_500_000_000_123_456_789i64;
    client.utimens("/big", None, Some(set)).unwrap();
    assert_eq!(client.stat("/big").unwrap().mtime_ns, set, "the time as set, not the chunks' write times");
    let before = client.stat("/big").unwrap().ctime_ns;
    client.pwrite(fd, b"later", 3 * 64 * 1024).unwrap();
    let after = client.stat("/big").unwrap().mtime_ns;
    assert!(after > set && after >= before, "a write to a later chunk moves the mtime on ({after})");
    client.close(fd).unwrap();
}

#[test]
fn a_deep_tree_holding_more_path_bytes_than_one_frame_carries_is_renamed_whole() {
    let cluster = TestCluster::start(3);
    let client = cluster.client();
    // 15 levels of 255-byte names: every path below is about 3,900 bytes, and the 3,300
    // names in the deepest directory hold 4.3 MB of paths per server, more than one request
    // may carry (4 MiB).
    let mut deepest = String::from("/tree");
    client.mkdir(&deepest, 0o755).unwrap();
    for level in 0..15 {
        deepest = format!("{deepest}/{level:02}{}", "d".repeat(253));
        client.mkdir(&deepest, 0o755).unwrap();
    }
    let names: BTreeSet<String> = (0..3300).map(|index| format!("file-{index:05}")).collect();
    for name in &names {
        client.close(client.create(&format!("{deepest}/{name}"), 0o644).unwrap()).unwrap();
    }
    client.rename("/tree", "/moved").unwrap();
    let moved = deepest.replacen("/tree", "/moved", 1);
    let listed: BTreeSet<String> = client.readdir_names(&moved).unwrap().into_iter().map(|entry| entry.name).collect();
    assert!(listed == names, "{} of {} names moved", listed.len(), names.len());
    assert_eq!(client.stat("/tree").unwrap_err(), Errno::ENOENT);
}

#[test]
fn a_directorys_link_count_is_two_plus_its_subdirectories_through_mkdir_rmdir_and_renames() {
    let cluster = TestCluster::start(3);
    let client = cluster.client();
    let links = |path: &str| client.stat(path).unwrap().nlink;
    let root_before = links("/");
    client.mkdir("/p", 0o755).unwrap();
    client.mkdir("/q", 0o755).unwrap();
    assert_eq!(links("/"), root_before + 2, "the root counts its subdirectories on every server");
    for name in ["a", "b", "c"] {
        client.mkdir(&format!("/p/{name}"), 0o755).unwrap();
    }
    client.close(client.create("/p/file", 0o644).unwrap()).unwrap();
    client.symlink("a", "/p/link").unwrap();
    assert_eq!((links("/p"), links("/p/a")), (5, 2), "files and links do not count");
    client.rmdir("/p/c").unwrap();
    assert_eq!(links("/p"), 4);
    client.rename("/p/a", "/q/a").unwrap();
    assert_eq!((links("/p"), links("/q")), (3, 3), "a directory moved out and in");
    client.rename("/p/b", "/p/renamed").unwrap();
    assert_eq!(links("/p"), 3, "a rename inside changes nothing");
    client.mkdir("/q/empty", 0o755).unwrap();
    client.rename("/p/renamed", "/q/empty").unwrap();
    assert_eq!((links("/p"), links("/q")), (2, 4), "a directory replacing an empty one");
    client.rename_with_flags("/p/file", "/q/a", ringfs_client::RenameFlags::EXCHANGE).unwrap();
    assert_eq!((links("/p"), links("/q")), (3, 3), "an exchange of a file and a directory");
    client.rename("/p", "/q/p").unwrap();
    assert_eq!((links("/"), links("/q")), (root_before + 1, 4));
}

/// `ringfs status` says how each server reaches the others: over UCX the lanes UCX chose for
/// the server-to-server connections (how a cluster's RDMA set-up is checked), over TCP and
/// Unix sockets nothing.
#[test]
fn servers_report_the_transports_they_reach_each_other_by() {
    let cluster = TestCluster::start(3);
    let client = cluster.client();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        // Removing a directory asks every other server (`PrepareRmdir`) from the directory's
        // server; thirty of them leave each of three servers some to ask from.
        for index in 0..30 {
            client.mkdir(&format!("/reach-{index}"), 0o755).unwrap();
            client.rmdir(&format!("/reach-{index}")).unwrap();
        }
        let status = client.server_status();
        assert_eq!(status.len(), 3);
        let reported: Vec<(String, Vec<ringfs_proto::PeerTransport>)> =
            status.into_iter().map(|(member, stats)| (member.name, stats.unwrap().peer_transports)).collect();
        if !common::over_ucx() {
            for (server, peers) in &reported {
                assert!(peers.is_empty(), "{server} reports UCX transports over TCP: {peers:?}");
            }
            return;
        }
        let complete = reported.iter().all(|(server, peers)| {
            let others: BTreeSet<&str> = peers.iter().map(|peer| peer.server.as_str()).collect();
            others.len() == 2 && !others.contains(server.as_str())
        });
        if complete {
            for (server, peers) in &reported {
                for peer in peers {
                    assert!(
                        !peer.transports.is_empty() && peer.transports != "no lanes yet",
                        "{server} to {}: {:?}",
                        peer.server,
                        peer.transports
                    );
                    if std::env::var("UCX_TLS").as_deref() == Ok("tcp") {
                        assert!(peer.transports.contains("tcp/"), "{server} to {}: {}", peer.server, peer.transports);
                    }
                }
            }
            return;
        }
        assert!(std::time::Instant::now() < deadline, "not every server reports the other two after 20 s: {reported:?}");
    }
}

/// The requests every server has answered so far, together.
fn requests_answered(client: &Client) -> u64 {
    client.server_stats().unwrap().iter().map(|stats| stats.requests).sum()
}

/// A create in the root directory costs what one in another directory costs, whatever the
/// number of servers: the root's times go to the two servers clients ask about it (the
/// owners of its path and of its inode), not to every server (a job of 1,000 nodes whose
/// ranks each wrote `/out.RANK` sent 1,000 messages a file). Its times still show by path
/// and by id after each change, and its link count, which every server answers when those
/// two cannot be reached, still counts every subdirectory everywhere.
#[test]
fn creates_in_the_root_directory_cost_no_more_than_elsewhere() {
    let cluster = TestCluster::start(8);
    let client = cluster.client();
    client.mkdir("/d", 0o755).unwrap();
    // (The least of 3 tries: the servers' heartbeats count too.)
    let cost = |dir: &str| {
        (0..3)
            .map(|round| {
                let before = requests_answered(&client);
                for index in 0..20 {
                    client.close(client.create(&format!("{dir}/f{round}-{index}"), 0o644).unwrap()).unwrap();
                }
                requests_answered(&client) - before
            })
            .min()
            .unwrap()
    };
    let (in_root, in_dir) = (cost(""), cost("/d"));
    // Two touches a create more than in /d, where they are held back; every server's was
    // 190 against 83 with 8 servers.
    assert!(in_root < in_dir + 60, "20 creates in / cost {in_root} requests, in /d {in_dir}");
    for index in 0..5 {
        let before = client.stat("/").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        client.close(client.create(&format!("/later{index}"), 0o644).unwrap()).unwrap();
        let by_path = client.stat("/").unwrap();
        assert!(by_path.mtime_ns > before.mtime_ns, "the root's mtime moved with a create in it");
    }
    client.mkdir("/sub", 0o755).unwrap();
    assert_eq!(client.stat("/").unwrap().nlink, 4, "2 + /d and /sub");
}

/// A client whose files are cut in chunks of `chunk_size` bytes.
fn client_with_chunks(cluster: &TestCluster, chunk_size: u32) -> Client {
    let mut config: ClientConfig = cluster.client_config();
    config.chunk_size = chunk_size;
    Client::connect(config).unwrap()
}

/// The chunks every server holds, together.
fn chunks_held(client: &Client) -> u64 {
    client.server_stats().unwrap().iter().map(|stats| stats.chunks).sum()
}

/// The requests the servers answered while `step` ran 20 times (the least of 3 tries: the
/// servers' heartbeats count too).
fn requests_for_twenty(client: &Client, mut step: impl FnMut(usize)) -> u64 {
    (0..3)
        .map(|round| {
            let before = requests_answered(client);
            for index in 0..20 {
                step(round * 20 + index);
            }
            requests_answered(client) - before
        })
        .min()
        .unwrap()
}

/// A file's size, its fsync and the removal of its chunks are asked of the servers that own
/// its chunks (up to the bound its inode carries), not of every server: with 8 servers the
/// `stat` of a file of two chunks cost 9 requests (every server's `LastChunk`), its fsync
/// 8 and its removal 8 `RemoveChunks`; a 500-node job paid 500 for each.
#[test]
fn a_small_files_size_fsync_and_removal_ask_only_the_servers_of_its_chunks() {
    let cluster = TestCluster::start(8);
    let client = client_with_chunks(&cluster, 4096);
    let fd = open_rw(&client, "/two");
    client.pwrite(fd, &[7u8; 4096 + 10], 0).unwrap();
    let stat = requests_for_twenty(&client, |_| assert_eq!(client.stat("/two").unwrap().size, 4106));
    assert!(stat <= 20 * 2 + 15, "20 stats of a file of 2 chunks cost {stat} requests (2 each: its inode and chunk 1)");
    let fsync = requests_for_twenty(&client, |_| client.fsync(fd).unwrap());
    assert!(fsync <= 20 * 3 + 15, "20 fsyncs cost {fsync} requests (at most 3 each: chunk 0, chunk 1, the name)");
    client.close(fd).unwrap();

    // Removing a file of two chunks costs one request more than removing a file of one.
    let write_files = |prefix: &str, len: usize| {
        for index in 0..60 {
            let fd = open_rw(&client, &format!("/{prefix}{index}"));
            client.pwrite(fd, &vec![1u8; len], 0).unwrap();
            client.close(fd).unwrap();
        }
    };
    write_files("one", 100);
    write_files("two", 4096 + 100);
    let one = requests_for_twenty(&client, |index| client.unlink(&format!("/one{index}")).unwrap());
    let two = requests_for_twenty(&client, |index| client.unlink(&format!("/two{index}")).unwrap());
    assert!(two <= one + 20 * 2 + 15, "20 removals of 2-chunk files cost {two} requests, of 1-chunk files {one}");
}

/// Sizes, bytes and removals stay exact while the bounds on files' chunks rise: two clients
/// of a cluster of 8 servers (4 KiB chunks) write near and far, truncate, and remove and
/// make again three files they both hold open, against a model; after each step the client
/// that did not act checks the size, and now and then every byte. At the end, with the files
/// removed, no server holds a chunk of them.
#[test]
fn sizes_stay_exact_as_files_grow_shrink_and_go_on_many_servers() {
    const CHUNK: u64 = 4096;
    let cluster = TestCluster::start(8);
    let clients = [client_with_chunks(&cluster, CHUNK as u32), client_with_chunks(&cluster, CHUNK as u32)];
    let seed = std::env::var("RINGFS_TEST_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or(44);
    let mut random = Random::new(seed);
    let before = chunks_held(&clients[0]);
    let paths = ["/a", "/b", "/c"];
    let mut models: Vec<Vec<u8>> = vec![Vec::new(); paths.len()];
    let open_both = |path: &str| [open_rw(&clients[0], path), open_rw(&clients[1], path)];
    let mut fds: Vec<[ringfs_client::Fd; 2]> = paths.iter().map(|path| open_both(path)).collect();
    for step in 0..400 {
        let (file, actor) = (random.below(paths.len() as u64) as usize, random.below(2) as usize);
        let (client, fd, model) = (&clients[actor], fds[file][actor], &mut models[file]);
        let what = match random.below(100) {
            0..=59 => {
                let offset = match random.below(10) {
                    0..=5 => random.below(12 * CHUNK),
                    6..=8 => (model.len() as u64).saturating_sub(CHUNK) + random.below(2 * CHUNK),
                    _ => random.below(300 * CHUNK),
                };
                let mut bytes = vec![0u8; 1 + random.below(3 * CHUNK) as usize];
                random.fill(&mut bytes);
                assert_eq!(client.pwrite(fd, &bytes, offset).unwrap(), bytes.len());
                let end = offset as usize + bytes.len();
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[offset as usize..end].copy_from_slice(&bytes);
                format!("write {} at {offset}", bytes.len())
            }
            60..=84 => {
                let size = random.below(model.len() as u64 * 3 / 2 + CHUNK);
                client.ftruncate(fd, size).unwrap();
                model.resize(size as usize, 0);
                format!("truncate to {size}")
            }
            _ => {
                for (owner, fd) in clients.iter().zip(fds[file]) {
                    owner.close(fd).unwrap();
                }
                client.unlink(paths[file]).unwrap();
                fds[file] = open_both(paths[file]);
                models[file].clear();
                "remove and make again".to_string()
            }
        };
        let other = &clients[1 - actor];
        let size = other.stat(paths[file]).unwrap().size;
        assert_eq!(size, models[file].len() as u64, "seed {seed}, step {step}: {} after {what}", paths[file]);
        if step % 10 == 0 {
            assert!(read_whole(other, paths[file]) == models[file], "seed {seed}, step {step}: the bytes of {} after {what}", paths[file]);
        }
    }
    for (file, path) in paths.iter().enumerate() {
        for (client, fd) in clients.iter().zip(fds[file]) {
            client.close(fd).unwrap();
        }
        clients[0].unlink(path).unwrap();
    }
    // Closes reach the inode's server within milliseconds; the file's chunks go then.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while chunks_held(&clients[0]) != before && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(chunks_held(&clients[0]), before, "seed {seed}: chunks of removed files left on a server");
}
