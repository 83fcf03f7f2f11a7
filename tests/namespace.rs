//! Names as POSIX programs rely on them, through the native client: renaming directories
//! (with `renameat2` flags and their errors), hard links, files unlinked or replaced while
//! open, special files — and concurrent renames of overlapping trees, which must neither lose
//! nor duplicate a name.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::{ClusterOptions, Random, TestCluster, read_file, write_file};
use ringfs_client::{Client, ClientConfig, Errno, FileId, FileKind, OpenFlags, RenameFlags};

fn small_chunks(cluster: &TestCluster) -> Client {
    let mut config: ClientConfig = cluster.client_config();
    config.chunk_size = 64 * 1024;
    Client::connect(config).unwrap()
}

/// Every path below `root` (depth first), with its kind and, for files, contents. The
/// names-only listing (`getdents`'s) must agree with the full one in every directory.
fn tree(client: &Client, root: &str) -> BTreeMap<String, (Option<FileKind>, Vec<u8>)> {
    let mut found = BTreeMap::new();
    let listing = client.readdir(root).unwrap();
    let names: Vec<(String, FileId, Option<FileKind>)> =
        client.readdir_names(root).unwrap().into_iter().map(|entry| (entry.name, entry.file, entry.kind)).collect();
    let expected: Vec<(String, FileId, Option<FileKind>)> =
        listing.iter().map(|entry| (entry.name.clone(), entry.stat.file, entry.stat.kind())).collect();
    assert_eq!(names, expected, "names-only and full listings of {root}");
    for entry in listing {
        let path = if root == "/" { format!("/{}", entry.name) } else { format!("{root}/{}", entry.name) };
        let kind = entry.stat.kind();
        let contents = if kind == Some(FileKind::Regular) { read_file(client, &path).unwrap() } else { Vec::new() };
        let is_dir = entry.stat.is_dir();
        assert!(found.insert(path.clone(), (kind, contents)).is_none(), "{path} listed twice");
        if is_dir {
            found.extend(tree(client, &path));
        }
    }
    found
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    Random::new(seed).fill(&mut bytes);
    bytes
}

#[test]
fn renaming_a_directory_moves_its_whole_tree_and_keeps_every_file() {
    let cluster = TestCluster::start(3);
    let client = small_chunks(&cluster);
    client.mkdir("/out", 0o755).unwrap();
    client.mkdir("/out/tmp-checkpoint-7", 0o755).unwrap();
    let mut expected = BTreeMap::new();
    for layer in 0..3 {
        let dir = format!("/out/tmp-checkpoint-7/layer{layer}");
        client.mkdir(&dir, 0o750).unwrap();
        for part in 0..5 {
            let contents = bytes(layer * 10 + part, 1000 + 70_000 * part as usize);
            write_file(&client, &format!("{dir}/part{part}"), &contents);
            expected.insert(format!("/layer{layer}/part{part}"), contents);
        }
    }
    client.symlink("layer0/part0", "/out/tmp-checkpoint-7/latest").unwrap();
    let inode_before = client.stat("/out/tmp-checkpoint-7/layer1/part3").unwrap().ino;
    let chunks_before: Vec<(String, u64)> = client.server_stats().unwrap().into_iter().map(|stats| (stats.name, stats.chunks)).collect();
    let used_before: u64 = client.server_stats().unwrap().iter().map(|stats| stats.bytes).sum();

    client.rename("/out/tmp-checkpoint-7", "/out/checkpoint-7").unwrap();

    assert_eq!(client.stat("/out/tmp-checkpoint-7").unwrap_err(), Errno::ENOENT);
    assert_eq!(client.stat("/out/tmp-checkpoint-7/layer0/part0").unwrap_err(), Errno::ENOENT);
    for (relative, contents) in &expected {
        assert!(read_file(&client, &format!("/out/checkpoint-7{relative}")).unwrap() == *contents, "{relative}");
    }
    assert_eq!(client.stat("/out/checkpoint-7/layer1/part3").unwrap().ino, inode_before, "a rename keeps files");
    assert_eq!(read_file(&client, "/out/checkpoint-7/latest").unwrap(), expected["/layer0/part0"], "relative links still resolve");
    let names: Vec<String> = client.readdir("/out").unwrap().into_iter().map(|entry| entry.name).collect();
    assert_eq!(names, ["checkpoint-7"]);
    assert_eq!(client.stat("/out/checkpoint-7/layer2").unwrap().mode & 0o777, 0o750);
    // No chunk moved: every server holds the chunks it held, and the bytes in use changed
    // only by the names (4 bytes shorter for each of the 20 names below the directory).
    let chunks_after: Vec<(String, u64)> = client.server_stats().unwrap().into_iter().map(|stats| (stats.name, stats.chunks)).collect();
    assert_eq!(chunks_after, chunks_before, "chunks stay where they are");
    let used_after: u64 = client.server_stats().unwrap().iter().map(|stats| stats.bytes).sum();
    assert!(used_before.abs_diff(used_after) <= 20 * 4, "no file bytes were copied: {used_before} before, {used_after} after");
    // New names go into the renamed tree; the old path takes none.
    write_file(&client, "/out/checkpoint-7/layer0/new", b"new");
    assert_eq!(client.create("/out/tmp-checkpoint-7/layer0/x", 0o644).unwrap_err(), Errno::ENOENT);
    assert_eq!(client.mkdir("/out/tmp-checkpoint-7/y", 0o755).unwrap_err(), Errno::ENOENT);
}

#[test]
fn directory_renames_follow_posix_rules_and_renameat2_flags() {
    let cluster = TestCluster::start(3);
    let client = cluster.client();
    for dir in ["/a", "/a/b", "/full", "/empty", "/other"] {
        client.mkdir(dir, 0o755).unwrap();
    }
    write_file(&client, "/full/f", b"f");
    write_file(&client, "/file", b"file");
    write_file(&client, "/a/b/deep", b"deep");

    assert_eq!(client.rename("/a", "/a/b/c").unwrap_err(), Errno::EINVAL, "into its own subtree");
    assert_eq!(client.rename("/a", "/a/x").unwrap_err(), Errno::EINVAL);
    assert_eq!(client.rename("/a", "/full").unwrap_err(), Errno::ENOTEMPTY, "over a non-empty directory");
    assert_eq!(client.rename("/a", "/file").unwrap_err(), Errno::ENOTDIR, "a directory over a file");
    assert_eq!(client.rename("/file", "/empty").unwrap_err(), Errno::EISDIR, "a file over a directory");
    assert_eq!(client.rename("/a", "/missing/x").unwrap_err(), Errno::ENOENT, "into a missing directory");
    assert_eq!(client.rename("/nothing", "/x").unwrap_err(), Errno::ENOENT);
    assert_eq!(client.rename_with_flags("/a", "/empty", RenameFlags::NOREPLACE).unwrap_err(), Errno::EEXIST);
    assert_eq!(client.rename_with_flags("/file", "/other", RenameFlags::NOREPLACE).unwrap_err(), Errno::EEXIST);

    // An empty target directory is replaced.
    let moved = client.stat("/a").unwrap().ino;
    client.rename("/a", "/empty").unwrap();
    assert_eq!(client.stat("/empty").unwrap().ino, moved);
    assert_eq!(read_file(&client, "/empty/b/deep").unwrap(), b"deep");
    assert_eq!(client.stat("/a").unwrap_err(), Errno::ENOENT);

    // Exchange: two directories, a file and a directory, two files.
    client.rename_with_flags("/empty", "/full", RenameFlags::EXCHANGE).unwrap();
    assert_eq!(read_file(&client, "/full/b/deep").unwrap(), b"deep");
    assert_eq!(read_file(&client, "/empty/f").unwrap(), b"f");
    client.rename_with_flags("/file", "/empty", RenameFlags::EXCHANGE).unwrap();
    assert_eq!(read_file(&client, "/empty").unwrap(), b"file");
    assert_eq!(read_file(&client, "/file/f").unwrap(), b"f");
    write_file(&client, "/x", b"x");
    write_file(&client, "/y", b"y");
    client.rename_with_flags("/x", "/y", RenameFlags::EXCHANGE).unwrap();
    assert_eq!((read_file(&client, "/x").unwrap(), read_file(&client, "/y").unwrap()), (b"y".to_vec(), b"x".to_vec()));
    assert_eq!(client.rename_with_flags("/x", "/missing", RenameFlags::EXCHANGE).unwrap_err(), Errno::ENOENT);
    assert_eq!(client.rename_with_flags("/x", "/y", RenameFlags::EXCHANGE | RenameFlags::NOREPLACE).unwrap_err(), Errno::EINVAL);
    assert_eq!(client.rename("/", "/z").unwrap_err(), Errno::EBUSY);
    // Renaming a name onto itself, or onto another name of the same file, changes nothing.
    client.rename("/x", "/x").unwrap();
    client.link("/x", "/x2").unwrap();
    client.rename("/x", "/x2").unwrap();
    assert_eq!(read_file(&client, "/x").unwrap(), b"y");
}

/// Renames of overlapping trees from several threads at once: afterwards every name created is
/// reachable exactly once from the root, and no directory is inside itself.
#[test]
fn concurrent_renames_of_overlapping_trees_neither_lose_nor_duplicate_names() {
    let cluster = TestCluster::start(3);
    let client = cluster.client();
    let roots = ["/p", "/q", "/r"];
    let mut files = BTreeSet::new();
    for root in roots {
        client.mkdir(root, 0o755).unwrap();
        for sub in 0..3 {
            let dir = format!("{root}/d{sub}");
            client.mkdir(&dir, 0o755).unwrap();
            for file in 0..4 {
                let name = format!("{}-{sub}-{file}", &root[1..]);
                write_file(&client, &format!("{dir}/{name}"), name.as_bytes());
                files.insert(name);
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(8);
    let threads: Vec<_> = (0..3u64)
        .map(|thread| {
            let client = cluster.client();
            std::thread::spawn(move || {
                let mut random = Random::new(thread + 100);
                let mut done = 0;
                while Instant::now() < deadline && done < 200 {
                    // Pick two existing directories anywhere in the tree and move one into the
                    // other, or to the top. Most fail (EINVAL, ENOENT, ENOTEMPTY, EEXIST): the
                    // point is that none corrupts the tree.
                    let dirs: Vec<String> = all_dirs(&client, "/");
                    if dirs.is_empty() {
                        break;
                    }
                    let from = &dirs[random.below(dirs.len() as u64) as usize];
                    let into = if random.below(4) == 0 { "/".to_string() } else { dirs[random.below(dirs.len() as u64) as usize].clone() };
                    let to = format!("{}/m{thread}-{done}", if into == "/" { "" } else { into.as_str() });
                    match client.rename(from, &to) {
                        Ok(()) | Err(Errno::EINVAL | Errno::ENOENT | Errno::ENOTEMPTY | Errno::EEXIST | Errno::ENOTDIR) => {}
                        Err(errno) => panic!("rename {from} -> {to}: {errno}"),
                    }
                    done += 1;
                }
                done
            })
        })
        .collect();
    let renames: usize = threads.into_iter().map(|thread| thread.join().unwrap()).sum();
    assert!(renames > 30, "only {renames} renames ran");
    let found = tree(&client, "/");
    let mut seen = BTreeSet::new();
    for (path, (kind, contents)) in &found {
        if *kind == Some(FileKind::Regular) {
            let name = path.rsplit('/').next().unwrap().to_string();
            assert_eq!(contents, name.as_bytes(), "{path}");
            assert!(seen.insert(name), "{path}: a file reachable twice");
        }
    }
    assert_eq!(seen, files, "every file reachable exactly once");
    let dirs = found.values().filter(|(kind, _)| *kind == Some(FileKind::Directory)).count();
    assert_eq!(dirs, 12, "every directory reachable exactly once");
    // No stray names elsewhere: every server's entries are the tree's (plus none).
    let entries: u64 = client.server_stats().unwrap().iter().map(|stats| stats.entries).sum();
    assert_eq!(entries as usize, found.len(), "names not reachable from the root (orphans)");
}

fn all_dirs(client: &Client, root: &str) -> Vec<String> {
    let mut dirs = Vec::new();
    let Ok(listing) = client.readdir(root) else { return dirs };
    for entry in listing {
        if entry.stat.is_dir() {
            let path = if root == "/" { format!("/{}", entry.name) } else { format!("{root}/{}", entry.name) };
            dirs.push(path.clone());
            dirs.extend(all_dirs(client, &path));
        }
    }
    dirs
}

#[test]
fn hard_links_share_one_file_until_the_last_name_goes() {
    let cluster = TestCluster::start(3);
    let client = small_chunks(&cluster);
    client.mkdir("/d", 0o755).unwrap();
    let contents = bytes(3, 300_000);
    write_file(&client, "/d/a", &contents);
    client.link("/d/a", "/b").unwrap();
    client.link("/b", "/d/c").unwrap();
    for name in ["/d/a", "/b", "/d/c"] {
        let stat = client.stat(name).unwrap();
        assert_eq!((stat.nlink, stat.size), (3, contents.len() as u64), "{name}");
    }
    assert_eq!(client.stat("/b").unwrap().ino, client.stat("/d/a").unwrap().ino);
    // A write through one name shows through the others.
    let fd = client.open("/d/c", OpenFlags::WRITE, 0).unwrap();
    client.pwrite(fd, b"CHANGED", 100).unwrap();
    client.close(fd).unwrap();
    assert_eq!(&read_file(&client, "/d/a").unwrap()[100..107], b"CHANGED");
    // Removing or renaming one name leaves the others.
    client.unlink("/d/a").unwrap();
    assert_eq!(client.stat("/b").unwrap().nlink, 2);
    client.rename("/b", "/renamed").unwrap();
    assert_eq!(client.stat("/d/c").unwrap().nlink, 2);
    assert_eq!(&read_file(&client, "/renamed").unwrap()[..100], &contents[..100]);
    // Errors.
    assert_eq!(client.link("/d", "/d2").unwrap_err(), Errno::EPERM, "directories cannot be linked");
    assert_eq!(client.link("/renamed", "/d/c").unwrap_err(), Errno::EEXIST);
    assert_eq!(client.link("/missing", "/m").unwrap_err(), Errno::ENOENT);
    assert_eq!(client.link("/renamed", "/nodir/x").unwrap_err(), Errno::ENOENT);
    // Links of symbolic links link the link.
    client.symlink("/renamed", "/sym").unwrap();
    client.link("/sym", "/sym2").unwrap();
    assert_eq!(client.readlink("/sym2").unwrap(), "/renamed");
    // Space goes with the last name.
    client.unlink("/renamed").unwrap();
    client.unlink("/d/c").unwrap();
    let used: u64 = client.server_stats().unwrap().iter().map(|stats| stats.bytes).sum();
    assert!(used < 16 * 1024, "{used} bytes still used after the last name went");
}

#[test]
fn a_file_unlinked_or_replaced_while_open_stays_usable_until_closed() {
    let cluster = TestCluster::start(3);
    let client = small_chunks(&cluster);
    let contents = bytes(5, 200_000);
    write_file(&client, "/tmp1", &contents);
    let fd = client.open("/tmp1", OpenFlags::READ | OpenFlags::WRITE, 0).unwrap();
    client.unlink("/tmp1").unwrap();
    assert_eq!(client.stat("/tmp1").unwrap_err(), Errno::ENOENT);
    let mut read = vec![0u8; contents.len()];
    assert_eq!(client.pread(fd, &mut read, 0).unwrap(), contents.len());
    assert!(read == contents);
    client.pwrite(fd, b"still writable", 150_000).unwrap();
    let mut part = vec![0u8; 14];
    client.pread(fd, &mut part, 150_000).unwrap();
    assert_eq!(part, b"still writable");
    let stat = client.fstat(fd).unwrap();
    assert_eq!((stat.nlink, stat.size), (0, contents.len() as u64));
    let stats = client.server_stats().unwrap();
    assert_eq!(stats.iter().map(|stats| stats.open_unlinked).sum::<u64>(), 1);
    client.close(fd).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while client.server_stats().unwrap().iter().map(|stats| stats.open_unlinked).sum::<u64>() > 0 {
        assert!(Instant::now() < deadline, "the file outlived its last close");
        std::thread::sleep(Duration::from_millis(20));
    }
    let used: u64 = client.server_stats().unwrap().iter().map(|stats| stats.bytes).sum();
    assert!(used < 8 * 1024, "{used} bytes still used after the close");

    // Replaced by a rename while open: the open file is the old one.
    write_file(&client, "/config", b"old version");
    let fd = client.open("/config", OpenFlags::READ, 0).unwrap();
    write_file(&client, "/config.new", b"new version!");
    client.rename("/config.new", "/config").unwrap();
    let mut old = vec![0u8; 64];
    let count = client.pread(fd, &mut old, 0).unwrap();
    assert_eq!(&old[..count], b"old version");
    client.close(fd).unwrap();
    assert_eq!(read_file(&client, "/config").unwrap(), b"new version!");
}

/// A client that dies with a file open (unlinked meanwhile) does not hold its space for
/// longer than the servers' grace period (1 s here).
#[test]
fn the_open_files_of_a_crashed_client_are_freed_after_the_grace_period() {
    if let Ok(address) = std::env::var("RINGFS_TEST_HOLDER") {
        // The child process: open a file, say so, and wait to be killed.
        let secret = std::env::var("RINGFS_TEST_SECRET").unwrap();
        let client = Client::connect(ClientConfig::new(vec![address], secret.into_bytes())).unwrap();
        let fd = client.open("/held", OpenFlags::READ, 0).unwrap();
        println!("HOLDING {}", fd.0);
        std::thread::sleep(Duration::from_secs(600));
        return;
    }
    let mut options = ClusterOptions::new(2);
    options.extra_args = vec!["--open-grace-ms".into(), "1000".into()];
    let cluster = TestCluster::with_options(options);
    let client = cluster.client();
    write_file(&client, "/held", &bytes(1, 500_000));
    let mut holder = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "the_open_files_of_a_crashed_client_are_freed_after_the_grace_period", "--nocapture"])
        .env("RINGFS_TEST_HOLDER", cluster.address(0))
        .env("RINGFS_TEST_SECRET", &cluster.secret)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut output = std::io::BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("HOLDING") {
        line.clear();
        if std::io::BufRead::read_line(&mut output, &mut line).unwrap() == 0 {
            let _ = holder.kill();
            panic!("the holder process ended");
        }
    }
    client.unlink("/held").unwrap();
    assert_eq!(client.server_stats().unwrap().iter().map(|stats| stats.open_unlinked).sum::<u64>(), 1, "kept while open");
    let _ = holder.kill();
    let _ = holder.wait();
    let killed = Instant::now();
    while client.server_stats().unwrap().iter().map(|stats| stats.open_unlinked).sum::<u64>() > 0 {
        assert!(killed.elapsed() < Duration::from_secs(10), "the crashed client's file is still held");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(killed.elapsed() >= Duration::from_millis(900), "freed before the grace period ended ({:?})", killed.elapsed());
}

#[test]
fn special_files_are_names_with_a_type_and_a_device_number() {
    let cluster = TestCluster::start(2);
    let client = cluster.client();
    client.mknod("/fifo", FileKind::Fifo.mode_bits() | 0o640, 0).unwrap();
    client.mknod("/tty", FileKind::CharDevice.mode_bits() | 0o620, (4 << 8) | 1).unwrap();
    client.mknod("/disk", FileKind::BlockDevice.mode_bits() | 0o660, (8 << 8) | 3).unwrap();
    client.mknod("/sock", FileKind::Socket.mode_bits() | 0o755, 0).unwrap();
    let stat = client.stat("/tty").unwrap();
    assert_eq!((stat.kind(), stat.rdev, stat.mode & 0o777), (Some(FileKind::CharDevice), (4 << 8) | 1, 0o620));
    assert_eq!(client.stat("/disk").unwrap().rdev, (8 << 8) | 3);
    assert_eq!(client.stat("/fifo").unwrap().kind(), Some(FileKind::Fifo));
    assert_eq!(client.stat("/sock").unwrap().kind(), Some(FileKind::Socket));
    assert_eq!(client.mknod("/fifo", FileKind::Fifo.mode_bits() | 0o640, 0).unwrap_err(), Errno::EEXIST);
    assert_eq!(client.mknod("/dir", FileKind::Directory.mode_bits() | 0o755, 0).unwrap_err(), Errno::EINVAL);
    // Renamed, linked and removed like files.
    client.rename("/fifo", "/pipe").unwrap();
    client.link("/pipe", "/pipe2").unwrap();
    assert_eq!(client.stat("/pipe2").unwrap().nlink, 2);
    client.unlink("/pipe").unwrap();
    assert_eq!(client.stat("/pipe2").unwrap().nlink, 1);
    let kinds: Vec<(String, Option<FileKind>)> =
        client.readdir("/").unwrap().into_iter().map(|entry| (entry.name, entry.stat.kind())).collect();
    assert_eq!(
        kinds,
        [
            ("disk".to_string(), Some(FileKind::BlockDevice)),
            ("pipe2".to_string(), Some(FileKind::Fifo)),
            ("sock".to_string(), Some(FileKind::Socket)),
            ("tty".to_string(), Some(FileKind::CharDevice)),
        ]
    );
}

/// Random renames (of files and directories), links, unlinks, creates, mkdirs and rmdirs
/// from several threads over a small tree, so that they collide: afterwards every name is
/// reachable once, every file's link count equals its names, every name leads to a file
/// whose contents are the ones it was created with, and no server holds a name the tree
/// does not show. No operation may fail with anything but the errors POSIX gives for its
/// collisions (never EIO).
#[test]
fn concurrent_mixed_namespace_operations_keep_names_and_link_counts_consistent() {
    let cluster = TestCluster::start(3);
    let setup = cluster.client();
    let dirs = ["/t", "/t/a", "/t/b", "/t/a/c", "/t/b/d"];
    for dir in dirs {
        setup.mkdir(dir, 0o755).unwrap();
    }
    let seed: u64 = std::env::var("RINGFS_TEST_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or(7);
    let deadline = Instant::now() + Duration::from_secs(10);
    let threads: Vec<_> = (0..3u64)
        .map(|thread| {
            let client = cluster.client();
            std::thread::spawn(move || {
                let mut random = Random::new(seed * 100 + thread);
                let places = ["/t", "/t/a", "/t/b", "/t/a/c", "/t/b/d", "/t/a/c/e", "/t/b/e"];
                let names = ["x", "y", "z", "c", "d", "e"];
                let pick = |random: &mut Random| {
                    let place = places[random.below(places.len() as u64) as usize];
                    format!("{place}/{}", names[random.below(names.len() as u64) as usize])
                };
                let mut done = 0u64;
                let mut succeeded = 0u64;
                while Instant::now() < deadline && done < 2000 {
                    let (a, b) = (pick(&mut random), pick(&mut random));
                    let operation = random.below(7);
                    let outcome = match operation {
                        0 => client.rename(&a, &b),
                        1 => client.rename_with_flags(&a, &b, RenameFlags::NOREPLACE),
                        2 => client.link(&a, &b),
                        3 => client.unlink(&a),
                        4 => client.create(&a, 0o644).and_then(|fd| {
                            // Contents name the file: its first name and creator.
                            let tag = format!("{thread}:{done}");
                            client.pwrite(fd, tag.as_bytes(), 0).map(drop)?;
                            client.close(fd)
                        }),
                        5 => client.mkdir(&a, 0o755),
                        _ => client.rmdir(&a),
                    };
                    succeeded += u64::from(outcome.is_ok());
                    match outcome {
                        Ok(())
                        | Err(
                            Errno::ENOENT
                            | Errno::EEXIST
                            | Errno::ENOTEMPTY
                            | Errno::EINVAL
                            | Errno::ENOTDIR
                            | Errno::EISDIR
                            | Errno::EPERM,
                        ) => {}
                        Err(errno) => return Err(format!("operation {operation} on {a} {b} (seed {seed}, thread {thread}): {errno}")),
                    }
                    done += 1;
                }
                Ok((done, succeeded))
            })
        })
        .collect();
    let (mut operations, mut succeeded) = (0, 0);
    for thread in threads {
        match thread.join().unwrap() {
            Ok((done, ok)) => (operations, succeeded) = (operations + done, succeeded + ok),
            Err(failure) => {
                let logs: String = (0..3).map(|index| cluster.log(index)).collect();
                panic!("{failure}\n{logs}");
            }
        }
    }
    assert!(operations > 100 && succeeded > operations / 10, "{succeeded} of {operations} operations succeeded");
    eprintln!("{succeeded} of {operations} operations succeeded");

    let client = cluster.client();
    let found = tree(&client, "/");
    let mut names_of_file: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for (path, (kind, contents)) in &found {
        let stat = client.lstat(path).unwrap_or_else(|errno| panic!("{path} is listed but does not stat: {errno} (seed {seed})"));
        if *kind == Some(FileKind::Regular) {
            names_of_file.entry(stat.ino).or_default().push(path.clone());
            let text = String::from_utf8_lossy(contents);
            assert!(text.contains(':'), "{path} holds {text:?} (seed {seed})");
        }
    }
    for (ino, names) in &names_of_file {
        let stat = client.stat(&names[0]).unwrap();
        assert_eq!(stat.nlink as usize, names.len(), "file {ino} has names {names:?} but nlink {} (seed {seed})", stat.nlink);
        let first = read_file(&client, &names[0]).unwrap();
        for name in &names[1..] {
            assert_eq!(read_file(&client, name).unwrap(), first, "{name} and {} are one file (seed {seed})", names[0]);
        }
    }
    let entries: u64 = client.server_stats().unwrap().iter().map(|stats| stats.entries).sum();
    assert_eq!(entries as usize, found.len(), "names not reachable from the root (orphans), seed {seed}");
}
