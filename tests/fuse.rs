//! The FUSE mount with the tools users run on it: cp, diff, tar, rsync, dd, ls, Python —
//! real `ringfs mount` and server processes, real kernel.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{TestCluster, fuse_available};

fn workspace_root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Runs a shell command and fails the test with its output if it fails.
fn sh(script: &str) -> String {
    let output = Command::new("sh").arg("-c").arg(script).output().unwrap();
    assert!(
        output.status.success(),
        "`{script}` failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn copied_source_tree_and_tar_and_rsync_round_trips_are_identical() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let mount = cluster.mount(&[]);
    let source = workspace_root().join("crates");
    let m = mount.dir.display();
    let s = source.display();
    sh(&format!("cp -r {s} {m}/copy && diff -r {s} {m}/copy"));
    sh(&format!(
        "cd {s}/.. && tar cf {m}/crates.tar crates && mkdir {m}/untar && tar xf {m}/crates.tar -C {m}/untar && diff -r {s} {m}/untar/crates"
    ));
    sh(&format!("tar tf {m}/crates.tar | grep -q crates/fuse/src/lib.rs"));
    sh(&format!("rsync -a {s}/ {m}/synced/ && diff -r {s} {m}/synced"));
    // A second rsync finds nothing to transfer; a changed file is copied again.
    let second = sh(&format!("rsync -a --stats {s}/ {m}/synced/"));
    assert!(second.contains("Number of regular files transferred: 0"), "{second}");
    std::fs::write(mount.path("synced/proto/Cargo.toml"), "changed").unwrap();
    sh(&format!("rsync -a {s}/ {m}/synced/ && diff -r {s} {m}/synced"));
}

#[test]
fn a_one_gibibyte_dd_reads_back_with_the_same_checksum() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let mount = cluster.mount(&[]);
    let m = mount.dir.display();
    let block = cluster.dir.join("block");
    let b = block.display();
    // 1 GiB: one random MiB repeated, written with dd in 1 MiB blocks.
    sh(&format!("head -c 1048576 /dev/urandom > {b}"));
    let stream = format!("for i in $(seq 1024); do cat {b}; done");
    sh(&format!("{stream} | dd of={m}/big bs=1M iflag=fullblock status=none"));
    let expected = sh(&format!("{stream} | sha256sum"));
    let read = sh(&format!("dd if={m}/big bs=1M status=none | sha256sum"));
    assert_eq!(read, expected);
    assert_eq!(std::fs::metadata(mount.path("big")).unwrap().len(), 1 << 30);
}

#[test]
fn python_os_and_shutil_work_on_the_mount() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let mount = cluster.mount(&[]);
    let script = r#"
import os, shutil, sys, json
root = sys.argv[1]
os.makedirs(os.path.join(root, "a/b/c"))
with open(os.path.join(root, "a/b/c/data.json"), "w") as f:
    json.dump({"numbers": list(range(1000))}, f)
    f.flush()
    os.fsync(f.fileno())
with open(os.path.join(root, "a/b/c/data.json")) as f:
    assert json.load(f)["numbers"][999] == 999
shutil.copytree(os.path.join(root, "a"), os.path.join(root, "a-copy"))
assert sorted(os.listdir(os.path.join(root, "a-copy/b/c"))) == ["data.json"]
os.rename(os.path.join(root, "a-copy/b/c/data.json"), os.path.join(root, "a-copy/moved.json"))
st = os.stat(os.path.join(root, "a-copy/moved.json"))
assert st.st_size == os.stat(os.path.join(root, "a/b/c/data.json")).st_size
os.symlink("moved.json", os.path.join(root, "a-copy/link"))
assert os.readlink(os.path.join(root, "a-copy/link")) == "moved.json"
with open(os.path.join(root, "a-copy/link")) as f:
    assert json.load(f)["numbers"][0] == 0
with open(os.path.join(root, "append.log"), "a") as f:
    f.write("one\n")
with open(os.path.join(root, "append.log"), "a") as f:
    f.write("two\n")
assert open(os.path.join(root, "append.log")).read() == "one\ntwo\n"
with open(os.path.join(root, "sparse"), "wb") as f:
    f.seek(5_000_000)
    f.write(b"end")
assert os.path.getsize(os.path.join(root, "sparse")) == 5_000_003
assert open(os.path.join(root, "sparse"), "rb").read(10) == bytes(10)
os.truncate(os.path.join(root, "sparse"), 100)
assert os.path.getsize(os.path.join(root, "sparse")) == 100
shutil.rmtree(os.path.join(root, "a-copy"))
assert not os.path.exists(os.path.join(root, "a-copy"))
try:
    os.rmdir(os.path.join(root, "a"))
    raise SystemExit("rmdir of a non-empty directory succeeded")
except OSError as error:
    assert error.errno == 39, error
shutil.move(os.path.join(root, "a"), os.path.join(root, "moved-dir"))
assert os.path.exists(os.path.join(root, "moved-dir/b/c/data.json"))
# A file is no terminal: ENOTTY, as on a local file system (Python asks at every open).
import errno, fcntl, termios
with open(os.path.join(root, "append.log")) as f:
    assert not f.isatty()
    try:
        fcntl.ioctl(f.fileno(), termios.TCGETS, bytes(64))
        raise SystemExit("TCGETS on a file succeeded")
    except OSError as error:
        assert error.errno == errno.ENOTTY, error
for i in range(100):
    open(os.path.join(root, "quiet-%d" % i), "w").close()
print("python ok")
"#;
    let output = Command::new("python3").arg("-c").arg(script).arg(&mount.dir).output().unwrap();
    assert!(output.status.success(), "{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stdout).contains("python ok"));
    // The mount's log does not grow with the files a program opens (fuser's own answer to
    // `ioctl` logged three lines each).
    let log = mount.log();
    assert!(
        log.lines().count() < 50,
        "the mount logged {} lines:\n{}",
        log.lines().count(),
        log.lines().take(20).collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn rename_over_an_existing_file_replaces_it() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let mount = cluster.mount(&[]);
    std::fs::write(mount.path("target"), vec![b'x'; 3 << 20]).unwrap();
    std::fs::write(mount.path("new"), b"the new contents").unwrap();
    std::fs::rename(mount.path("new"), mount.path("target")).unwrap();
    assert_eq!(std::fs::read(mount.path("target")).unwrap(), b"the new contents");
    assert!(!mount.path("new").exists());
    let m = mount.dir.display();
    sh(&format!("echo second > {m}/other && mv -f {m}/other {m}/target && test \"$(cat {m}/target)\" = second"));
}

#[test]
fn concurrent_appends_from_two_processes_to_separate_files() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let mount = cluster.mount(&[]);
    let m = mount.dir.display();
    sh(&format!(
        "(for i in $(seq 500); do echo \"first $i\" >> {m}/first.log; done) & \
         (for i in $(seq 500); do echo \"second $i\" >> {m}/second.log; done) & wait"
    ));
    for name in ["first", "second"] {
        let text = std::fs::read_to_string(mount.path(&format!("{name}.log"))).unwrap();
        let expected: String = (1..=500).map(|i| format!("{name} {i}\n")).collect();
        assert_eq!(text, expected);
    }
}

#[test]
fn ls_lists_ten_thousand_entries_with_attributes() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let client = cluster.client();
    client.mkdir("/many", 0o755).unwrap();
    for index in 0..10_000 {
        let fd = client.create(&format!("/many/file.{index:05}"), 0o640).unwrap();
        if index % 1000 == 0 {
            client.write(fd, b"some bytes").unwrap();
        }
        client.close(fd).unwrap();
    }
    let mount = cluster.mount(&[]);
    let listing = sh(&format!("ls -l {}", mount.path("many").display()));
    let lines: Vec<&str> = listing.lines().filter(|line| line.contains("file.")).collect();
    assert_eq!(lines.len(), 10_000);
    assert!(lines.iter().all(|line| line.starts_with("-rw-r-----")), "{}", lines[0]);
    assert!(lines[0].contains(" 10 ") && lines[0].ends_with("file.00000"), "{}", lines[0]);
    assert_eq!(sh(&format!("ls {} | wc -l", mount.path("many").display())).trim(), "10000");
}

#[test]
fn attributes_links_statfs_and_errors_through_the_mount() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let mount = cluster.mount(&[]);
    let file = mount.path("file");
    std::fs::write(&file, b"0123456789").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&file, Some(4321), Some(99)).unwrap();
    sh(&format!("touch -m -d '2001-02-03 04:05:06 UTC' {}", file.display()));
    let metadata = std::fs::metadata(&file).unwrap();
    assert_eq!((metadata.mode() & 0o7777, metadata.uid(), metadata.gid()), (0o600, 4321, 99));
    assert_eq!(metadata.mtime(), 981_173_106);
    std::os::unix::fs::symlink("file", mount.path("link")).unwrap();
    assert_eq!(std::fs::read_link(mount.path("link")).unwrap(), Path::new("file"));
    assert_eq!(std::fs::read(mount.path("link")).unwrap(), b"0123456789");
    let opened = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    opened.set_len(4).unwrap();
    opened.sync_all().unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), b"0123");
    let df = sh(&format!("df -k {} | tail -1", mount.dir.display()));
    let size_kib: u64 = df.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(size_kib > 0, "df reports a size: {df}");
    assert_eq!(std::fs::create_dir(mount.path("missing/dir")).unwrap_err().raw_os_error(), Some(libc::ENOENT));
    std::fs::create_dir(mount.path("dir")).unwrap();
    std::fs::write(mount.path("dir/inside"), b"x").unwrap();
    assert_eq!(std::fs::remove_dir(mount.path("dir")).unwrap_err().raw_os_error(), Some(libc::ENOTEMPTY));
    assert_eq!(std::fs::remove_file(mount.path("dir")).unwrap_err().raw_os_error(), Some(libc::EISDIR));
    // Files written through the native client appear in the mount and the other way round.
    let client = cluster.client();
    assert_eq!(client.stat("/dir/inside").unwrap().size, 1);
    let fd = client.create("/native", 0o644).unwrap();
    client.write(fd, b"from the native client").unwrap();
    client.close(fd).unwrap();
    assert_eq!(std::fs::read(mount.path("native")).unwrap(), b"from the native client");
}

#[test]
fn a_dead_server_gives_eio_through_the_mount_instead_of_hanging() {
    if !fuse_available() {
        return;
    }
    let mut cluster = TestCluster::start(2);
    let mount = cluster.mount(&[]);
    for index in 0..20 {
        std::fs::write(mount.path(&format!("f{index}")), b"data").unwrap();
    }
    cluster.kill(1);
    let started = Instant::now();
    let mut failures = 0;
    for index in 0..20 {
        let mut bytes = Vec::new();
        let read = std::fs::File::open(mount.path(&format!("f{index}"))).and_then(|mut file| file.read_to_end(&mut bytes));
        if let Err(error) = read {
            assert_eq!(error.raw_os_error(), Some(libc::EIO), "{error}");
            failures += 1;
        }
    }
    assert!(failures > 0, "some files live on the dead server");
    assert!(started.elapsed() < Duration::from_secs(15), "the mount answered within the deadlines ({:?})", started.elapsed());
    // Writing to a file of the surviving server still works.
    let mut ok = 0;
    for index in 0..20 {
        if let Ok(mut file) = std::fs::OpenOptions::new().write(true).open(mount.path(&format!("f{index}"))) {
            ok += usize::from(file.write_all(b"more").is_ok());
        }
    }
    assert!(ok > 0);
}

#[test]
fn direct_io_mounts_work_too() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let mount = cluster.mount(&["--direct-io"]);
    let data: Vec<u8> = (0..5_000_000u32).map(|value| (value % 241) as u8).collect();
    std::fs::write(mount.path("direct"), &data).unwrap();
    assert!(std::fs::read(mount.path("direct")).unwrap() == data);
}

/// Small files whose only chunk lives on a live server read through the mount while another
/// server is down.
#[test]
fn small_files_on_live_servers_read_through_the_mount_while_another_server_is_down() {
    if !fuse_available() {
        return;
    }
    let mut cluster = TestCluster::start(3);
    let mount = cluster.mount(&[]);
    let direct = cluster.mount(&["--direct-io"]);
    let client = cluster.client();
    let list = client.members();
    let (scheme, hash) = ringfs_placement::parse_description(&list.placement).unwrap();
    let placement = ringfs_placement::Placement::new(list.members.iter().map(|member| member.name.clone()), hash, scheme).unwrap();
    let victim = cluster.name(2).to_string();
    let live: Vec<String> = (0..200)
        .map(|index| format!("small-{index}"))
        .filter(|name| placement.ring()[placement.owner_of_path(&format!("/{name}"))] != victim)
        .take(40)
        .collect();
    // Small chunks: the kernel's reads (readahead up to 128 KiB) span several chunks.
    let mut config = cluster.client_config();
    config.chunk_size = 64 << 10;
    let small_chunks = ringfs_client::Client::connect(config).unwrap();
    for name in &live {
        let fd = small_chunks.create(&format!("/{name}"), 0o644).unwrap();
        small_chunks.write(fd, b"x").unwrap();
        small_chunks.close(fd).unwrap();
    }
    cluster.kill(2);
    let mut failed = Vec::new();
    for name in &live {
        for path in [mount.path(name), direct.path(name)] {
            match std::fs::read(&path) {
                Ok(bytes) if bytes == b"x" => {}
                other => failed.push(format!("{}: {other:?}", path.display())),
            }
            let cat = Command::new("cat").arg(&path).output().unwrap();
            if !cat.status.success() || cat.stdout != b"x" {
                failed.push(format!("cat {}: {}", path.display(), String::from_utf8_lossy(&cat.stderr)));
            }
        }
    }
    assert!(failed.is_empty(), "{} reads failed, e.g. {:?}", failed.len(), &failed[..failed.len().min(3)]);
}

/// Names in the root directory whose entries server `index` holds (`prefix-N`).
fn names_on_server(cluster: &TestCluster, index: usize, prefix: &str) -> impl Iterator<Item = String> {
    let list = cluster.client().members();
    let (scheme, hash) = ringfs_placement::parse_description(&list.placement).unwrap();
    let placement = ringfs_placement::Placement::new(list.members.iter().map(|member| member.name.clone()), hash, scheme).unwrap();
    let server = cluster.name(index);
    let prefix = prefix.to_string();
    (0..10_000)
        .map(move |index| format!("{prefix}-{index}"))
        .filter(move |name| placement.ring()[placement.owner_of_path(&format!("/{name}"))] == server)
}

/// `cat` of a file whose server is stopped (SIGSTOP) fails with EIO within one request
/// deadline (the mount's is 3 s), not one deadline per request the kernel sends.
#[test]
fn cat_of_a_file_on_a_stopped_server_fails_within_one_deadline() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let mount = cluster.mount(&[]);
    let name = names_on_server(&cluster, 1, "stopped").next().unwrap();
    std::fs::write(mount.path(&name), b"data").unwrap();
    // Let the kernel's cached attributes expire, so cat has to ask.
    std::thread::sleep(Duration::from_millis(1500));
    cluster.signal(1, libc::SIGSTOP);
    // Through the mount that talked to the server before, and through a new one that must
    // first connect to it (the connection is accepted by the kernel; the handshake waits).
    let fresh = cluster.mount(&[]);
    for path in [mount.path(&name), fresh.path(&name)] {
        let started = Instant::now();
        let cat = Command::new("cat").arg(&path).output().unwrap();
        let elapsed = started.elapsed();
        assert!(!cat.status.success(), "cat must fail");
        assert!(String::from_utf8_lossy(&cat.stderr).contains("Input/output error"), "{}", String::from_utf8_lossy(&cat.stderr));
        assert!(elapsed < Duration::from_millis(4500), "cat of {} failed after {elapsed:?}; the deadline is 3 s", path.display());
    }
    cluster.signal(1, libc::SIGCONT);
}

/// Waits half a second and asserts that `program` is still running (waiting for a stopped
/// server).
fn still_waiting(program: &mut std::process::Child, what: &str) {
    std::thread::sleep(Duration::from_millis(500));
    assert!(program.try_wait().unwrap().is_none(), "{what} did not wait for the stopped server");
}

/// Asserts that `program`, waiting for a stopped server, ends within a second of `signal`
/// (the request's deadline is 3 s).
fn gone_at_once(mut program: std::process::Child, signal: i32, what: &str) {
    still_waiting(&mut program, what);
    let signalled = Instant::now();
    assert_eq!(unsafe { libc::kill(program.id() as i32, signal) }, 0);
    let status = program.wait().unwrap();
    let took = signalled.elapsed();
    assert!(!status.success(), "{what}: {status}");
    assert!(took < Duration::from_secs(1), "{what} went {took:?} after its signal; the request's deadline is 3 s");
}

/// Waits until `done` says yes, for at most `bound` (a failure names `what`).
fn seen_within(bound: Duration, what: &str, done: &dyn Fn() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < bound, "{what} not seen within {bound:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A program killed while the mount waits for a stopped server on its behalf — `kill -9` of
/// `cat`, Ctrl-C of `stat` (which does not handle it) — is gone within moments, not at the
/// request's deadline (3 s here: the kernel keeps it until the mount answers). A program
/// that handles the signal is not killed, so its read goes on as on a local disk and gets
/// its bytes once the server runs again; and the server, whose answers were given up, is
/// not taken for dead.
#[test]
fn programs_killed_while_a_server_is_stopped_are_gone_at_once() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let mount = cluster.mount(&[]);
    let mut names = names_on_server(&cluster, 1, "waited");
    let file = names.next().unwrap();
    std::fs::write(mount.path(&file), b"data").unwrap();
    let not_looked_up = names.next().unwrap();
    cluster.signal(1, libc::SIGSTOP);
    // A read (the mount drops a file's pages at open: cat reads from the server).
    gone_at_once(Command::new("cat").arg(mount.path(&file)).stdout(Stdio::null()).spawn().unwrap(), libc::SIGKILL, "cat (kill -9)");
    // A lookup. (SIGINT as a terminal's Ctrl-C finds it: a test started in the background
    // by a shell without job control inherits it ignored.)
    let mut stat = Command::new("stat");
    stat.arg(mount.path(&not_looked_up)).stderr(Stdio::null());
    // SAFETY: only `signal`, which is async-signal-safe, runs between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut stat, || {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let stat = stat.spawn().unwrap();
    gone_at_once(stat, libc::SIGINT, "stat (Ctrl-C)");
    cluster.signal(1, libc::SIGCONT);
    // (Stopped for over the test clusters' 1-s failure timeout, the server may have been
    // declared dead meanwhile: the next phase starts once every server sees it alive again,
    // or its requests would fail at once. Seen once in CI, beside a soak, in the io_uring pass.)
    cluster.wait_for_alive(2);
    assert_eq!(std::fs::read(mount.path(&file)).unwrap(), b"data", "the mount reads from the server again");

    // Perl's handler runs after the read: the read's result tells whether the mount gave up.
    let script = r#"$SIG{INT} = sub { print "handled\n" }; open(F, "<", $ARGV[0]) or die "open: $!";
        my $n = sysread(F, my $bytes, 100); print defined $n ? "read $n\n" : "error $!\n";"#;
    cluster.signal(1, libc::SIGSTOP);
    let mut perl = Command::new("perl").args(["-e", script]).arg(mount.path(&file)).stdout(Stdio::piped()).spawn().unwrap();
    still_waiting(&mut perl, "perl");
    assert_eq!(unsafe { libc::kill(perl.id() as i32, libc::SIGINT) }, 0);
    still_waiting(&mut perl, "perl, its SIGINT handled");
    cluster.signal(1, libc::SIGCONT);
    let output = perl.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(said.contains("read 4") && said.contains("handled"), "perl said {said:?} ({})", output.status);
    let missing = std::fs::metadata(mount.path(&not_looked_up)).unwrap_err();
    assert_eq!(missing.kind(), std::io::ErrorKind::NotFound);
}

/// A create and a rename must not be given up (an open registered at a server would stay
/// registered, the mount's paths would not follow the rename), yet their killed programs are
/// gone at once too: the mount answers the program and finishes the request. Once the
/// server runs again the file is made and the name moved, the mount shows both, and the
/// open the killed `touch` never got is closed (the file goes when its name is removed).
#[test]
fn creates_and_renames_of_killed_programs_are_answered_at_once_and_finished() {
    // (Through the io_uring queues creates and renames are not released: they wait out the
    // deadline — the waiting thread is the one that answers the entry — and a request that
    // waited so long is not made. Nothing here applies there.)
    if !fuse_available() || common::fuse_io_uring() {
        return;
    }
    let cluster = TestCluster::start(2);
    let mount = cluster.mount(&[]);
    std::fs::create_dir(mount.path("made")).unwrap();
    let mut names = names_on_server(&cluster, 1, "made/finished");
    let (created, from, to) = (names.next().unwrap(), names.next().unwrap(), names.next().unwrap());
    std::fs::write(mount.path(&from), b"moved").unwrap();
    for path in [&created, &from, &to] {
        // (Cached by the kernel: the programs' first request to the server is their change.)
        let _ = std::fs::metadata(mount.path(path));
    }
    let client = cluster.client();

    cluster.signal(1, libc::SIGSTOP);
    let touch = Command::new("touch").arg(mount.path(&created)).stderr(Stdio::null()).spawn().unwrap();
    gone_at_once(touch, libc::SIGKILL, "touch of a new name (kill -9)");
    cluster.signal(1, libc::SIGCONT);
    seen_within(Duration::from_secs(10), "the create through the native client", &|| client.lstat(&format!("/{created}")).is_ok());
    // The open the kernel never got is closed: the file goes with its only name.
    let file = client.lstat(&format!("/{created}")).unwrap().file;
    client.unlink(&format!("/{created}")).unwrap();
    seen_within(Duration::from_secs(2), "the created file gone after its unlink (its open closed)", &|| client.stat_id(file).is_err());
    std::fs::write(mount.path(&created), b"again").unwrap();
    assert_eq!(std::fs::read(mount.path(&created)).unwrap(), b"again");

    cluster.signal(1, libc::SIGSTOP);
    let mv = Command::new("mv").arg(mount.path(&from)).arg(mount.path(&to)).stderr(Stdio::null()).spawn().unwrap();
    gone_at_once(mv, libc::SIGKILL, "mv (kill -9)");
    cluster.signal(1, libc::SIGCONT);
    seen_within(Duration::from_secs(10), "the rename through the native client", &|| client.lstat(&format!("/{to}")).is_ok());
    seen_within(Duration::from_secs(2), "the rename through the mount", &|| {
        std::fs::read(mount.path(&to)).is_ok_and(|bytes| bytes == b"moved")
            && std::fs::metadata(mount.path(&from)).is_err_and(|error| error.kind() == std::io::ErrorKind::NotFound)
    });
    let mut listed: Vec<String> =
        std::fs::read_dir(mount.path("made")).unwrap().map(|entry| entry.unwrap().file_name().into_string().unwrap()).collect();
    listed.sort();
    let mut expected = vec![created.trim_start_matches("made/").to_string(), to.trim_start_matches("made/").to_string()];
    expected.sort();
    assert_eq!(listed, expected);
}

/// A shell whose working directory another client renames goes on working in it, as on a
/// local disk: the kernel keeps using the directory's inode, and the mount follows the
/// rename (it hears of it within the watch's interval) so that what the kernel asks of that
/// inode goes to its new name — here a rename of the directory's parent.
#[test]
fn a_working_directory_renamed_elsewhere_keeps_working() {
    if !fuse_available() {
        return;
    }
    shell_in_a_directory_renamed_elsewhere(&[("/run", "/moved")], "/moved");
}

/// Two renames in a row elsewhere, well within one look of the mount's watch: the first's
/// new name is gone when the watch checks it (a shell there could create nothing before:
/// "No such file or directory", for as long as it stayed in the directory).
#[test]
fn a_working_directory_renamed_twice_elsewhere_keeps_working() {
    if !fuse_available() {
        return;
    }
    shell_in_a_directory_renamed_elsewhere(&[("/run", "/moved"), ("/moved", "/done")], "/done");
}

/// A shell in `/run/out` through a mount while the native client makes `renames` (of `/run`,
/// ending at `last`): the shell goes on creating and reading files in its directory.
fn shell_in_a_directory_renamed_elsewhere(renames: &[(&str, &str)], last: &str) {
    let cluster = TestCluster::start(2);
    let mount = cluster.mount(&[]);
    std::fs::create_dir_all(mount.path("run/out")).unwrap();
    std::fs::write(mount.path("run/input"), b"input\n").unwrap();
    let script = r#"cd "$1" && echo in && read go && echo made > f && cat ../input && ls"#;
    let mut shell = Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(mount.path("run/out"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(shell.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line, "in\n", "the shell is in its directory");
    let client = cluster.client();
    for (from, to) in renames {
        client.rename(from, to).unwrap();
    }
    // (The watch asks a quiet server at least once a second.)
    std::thread::sleep(Duration::from_millis(2500));
    shell.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let status = shell.wait().unwrap();
    let mut errors = String::new();
    shell.stderr.take().unwrap().read_to_string(&mut errors).unwrap();
    assert!(status.success(), "the shell failed in its renamed directory: {errors}");
    assert_eq!(rest, "input\nf\n");
    let moved = &last[1..];
    assert_eq!(std::fs::read(mount.path(&format!("{moved}/out/f"))).unwrap(), b"made\n");
    let mut made = vec![0u8; 16];
    let fd = client.open(&format!("{last}/out/f"), ringfs_client::OpenFlags::READ, 0).unwrap();
    let count = client.pread(fd, &mut made, 0).unwrap();
    assert_eq!(&made[..count], b"made\n", "the file is where the directory is now");
    assert!(std::fs::metadata(mount.path("run")).is_err());
}

/// `echo line >> log` on two nodes at once (two mounts of one cluster): every line lands,
/// whole, and both mounts read the same file. The kernel sends an append at the end it last
/// knew of; the mount appends at the file's real end, placed with the other node's appends
/// (before, a third of the lines were overwritten).
#[test]
fn appends_through_two_mounts_at_once_all_land() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let (one, other) = (cluster.mount(&[]), cluster.mount(&[]));
    std::fs::write(one.path("log"), b"").unwrap();
    const LINES: usize = 120;
    std::thread::scope(|scope| {
        for (node, mount) in [(0, &one), (1, &other)] {
            scope.spawn(move || {
                for index in 0..LINES {
                    let mut log = std::fs::OpenOptions::new().append(true).open(mount.path("log")).unwrap();
                    log.write_all(format!("node {node} line {index:03}\n").as_bytes()).unwrap();
                }
            });
        }
    });
    let text = std::fs::read_to_string(one.path("log")).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2 * LINES, "{} bytes", text.len());
    lines.sort_unstable();
    lines.dedup();
    assert_eq!(lines.len(), 2 * LINES, "a line twice");
    assert!(lines.iter().all(|line| line.len() == "node 0 line 000".len() && line.starts_with("node ")), "a torn line");
    assert_eq!(std::fs::read_to_string(other.path("log")).unwrap(), text, "the other mount reads the same");
    // An append through a mount after its kernel cached the file still lands at the end.
    let mut log = std::fs::OpenOptions::new().append(true).open(other.path("log")).unwrap();
    log.write_all(b"last\n").unwrap();
    drop(log);
    assert_eq!(std::fs::read_to_string(other.path("log")).unwrap(), format!("{text}last\n"));
}

/// Changes are given up for a killed program too (`mkdir`, `rm`, `truncate` killed while
/// the server of their name or file is stopped: gone within a second), and the mount does
/// not take a change it stopped waiting for as not made: the request may still reach the
/// server, which makes it once it runs again. What the mount shows afterwards is what the
/// servers hold — in a directory made through the mount, whose missing names the mount
/// answers itself, and with names and sizes the kernel had cached. (The kernel drops the
/// name of an interrupted unlink and the attributes of an interrupted setattr itself; a
/// `mkdir` — the name cached as missing, in the kernel and in the mount — is the case the
/// mount must make good: the test fails there when it does not.)
#[test]
fn changes_of_killed_programs_are_given_up_and_not_taken_as_undone() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let mount = cluster.mount(&[]);
    std::fs::create_dir(mount.path("made")).unwrap();
    let mut names = names_on_server(&cluster, 1, "made/killed");
    let (directory, removed, truncated) = (names.next().unwrap(), names.next().unwrap(), names.next().unwrap());
    std::fs::write(mount.path(&removed), b"to remove").unwrap();
    std::fs::write(mount.path(&truncated), b"to truncate").unwrap();
    assert_eq!(std::fs::metadata(mount.path(&truncated)).unwrap().len(), 11);
    // (The mount answers this itself: every name of the directory came through it.)
    assert!(std::fs::metadata(mount.path(&directory)).is_err());

    let client = cluster.client();
    type Check<'a> = (&'a str, &'a [&'a str], &'a str, Box<dyn Fn() -> bool + 'a>, Box<dyn Fn() -> bool + 'a>);
    let changes: Vec<Check> = vec![
        (
            "mkdir",
            &[],
            &directory,
            Box::new(|| client.stat(&format!("/{directory}")).is_ok_and(|stat| stat.is_dir())),
            Box::new(|| std::fs::metadata(mount.path(&directory)).is_ok_and(|metadata| metadata.is_dir())),
        ),
        (
            "rm",
            &[],
            &removed,
            Box::new(|| client.stat(&format!("/{removed}")) == Err(ringfs_client::Errno::ENOENT)),
            Box::new(|| std::fs::metadata(mount.path(&removed)).is_err_and(|error| error.kind() == std::io::ErrorKind::NotFound)),
        ),
        (
            "truncate",
            &["-s", "2"],
            &truncated,
            Box::new(|| client.stat(&format!("/{truncated}")).is_ok_and(|stat| stat.size == 2)),
            Box::new(|| std::fs::metadata(mount.path(&truncated)).is_ok_and(|metadata| metadata.len() == 2)),
        ),
    ];
    // One change at a time: a connection whose request was given up is not used again
    // until its answer came, and a new one cannot be made to a stopped server.
    for (program, args, path, made, shown) in changes {
        // (So that the program's first request to the stopped server is its change: the
        // kernel answers its `stat` from what it cached.)
        let _ = std::fs::metadata(mount.path(path));
        cluster.signal(1, libc::SIGSTOP);
        let mut command = Command::new(program);
        command.args(args).arg(mount.path(path)).stderr(Stdio::null());
        gone_at_once(command.spawn().unwrap(), libc::SIGKILL, &format!("{program} (kill -9)"));
        cluster.signal(1, libc::SIGCONT);
        // The server makes the change when it runs again (it came well within the request's
        // deadline): the native client sees it, and so does the mount at once (its kernel
        // caches names and sizes for 60 s, and changes this mount made are not among those
        // it hears of from the servers).
        seen_within(Duration::from_secs(10), &format!("{program}'s change through the native client"), &*made);
        seen_within(Duration::from_secs(2), &format!("{program}'s change through the mount"), &*shown);
    }
    assert_eq!(std::fs::read(mount.path(&truncated)).unwrap(), b"to");
    let listed: Vec<String> =
        std::fs::read_dir(mount.path("made")).unwrap().map(|entry| entry.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(listed.len(), 2, "{listed:?}");
}
