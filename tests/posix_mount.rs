//! Namespace semantics that real programs rely on, through the FUSE mount of real servers: a
//! differential test of random renames (with `renameat2` flags), links, unlinks, directories,
//! symlinks and files used after their name went, against tmpfs (/dev/shm); directory renames;
//! a checkpoint written under a temporary name and renamed into place while other processes
//! read it; git, rsync -aH and Python's tempfile on the mount; FIFOs, device nodes and Unix
//! sockets; hard links.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fs::OpenOptions;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Random, TestCluster, fuse_available};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A fresh directory on tmpfs (/dev/shm), the reference file system; removed when dropped.
struct ShmDir {
    path: PathBuf,
}

impl ShmDir {
    fn new(tag: &str) -> ShmDir {
        assert!(Path::new("/dev/shm").is_dir(), "these tests compare ringfs with tmpfs at /dev/shm, which is missing");
        let path = PathBuf::from(format!("/dev/shm/ringfs-posix-{tag}-{}-{:x}", std::process::id(), ringfs_rpc::memory::random_u64()));
        std::fs::create_dir(&path).unwrap();
        ShmDir { path }
    }
}

impl Drop for ShmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// An error as the tests compare it: the errno (and its text), or the message of an error that
/// has none.
fn describe(error: &io::Error) -> String {
    match error.raw_os_error() {
        Some(code) => format!("errno {code} ({})", io::Error::from_raw_os_error(code)),
        None => format!("{error}"),
    }
}

fn errno(result: io::Result<impl std::fmt::Debug>) -> i32 {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(error) => error.raw_os_error().unwrap_or_else(|| panic!("no errno in {error}")),
    }
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("a path without NUL bytes")
}

/// `renameat2(2)` with `flags` (`RENAME_NOREPLACE`, `RENAME_EXCHANGE`).
fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<()> {
    let (from, to) = (c_path(from), c_path(to));
    // SAFETY: both paths are NUL-terminated and outlive the call.
    let result = unsafe { libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), flags) };
    if result == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// `mknod(2)`.
fn mknod(path: &Path, mode: libc::mode_t, device: libc::dev_t) -> io::Result<()> {
    let path = c_path(path);
    // SAFETY: the path is NUL-terminated and outlives the call.
    let result = unsafe { libc::mknod(path.as_ptr(), mode, device) };
    if result == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// FNV-1a: a short stand-in for file contents in messages.
fn fingerprint(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3))
}

fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    Random::new(seed).fill(&mut bytes);
    bytes
}

/// `sh -c script`, killed if it runs longer than two minutes.
fn shell(script: &str) -> Command {
    let mut command = Command::new("timeout");
    command.args(["--kill-after=5", "120", "sh", "-c", script]);
    command
}

/// Runs a shell command and fails the test with its output if it fails.
fn sh(script: &str) -> String {
    let output = shell(script).output().unwrap();
    assert!(
        output.status.success(),
        "`{script}` failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Runs a shell command in `dir`: its output, or its status and error output.
fn sh_in(dir: &Path, script: &str) -> Result<String, String> {
    let output = shell(script).current_dir(dir).output().unwrap();
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!("{}: {}", output.status, String::from_utf8_lossy(&output.stderr)))
    }
}

/// Waits for `child` at most `limit`; kills it (by its pid) if it takes longer.
fn wait_bounded(mut child: Child, limit: Duration, what: &str) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "{what} still ran after {limit:?}; killed it. Output:\n{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn assert_success(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs a Python script with arguments, bounded in time; fails the test if the script fails.
fn python(script: &str, args: &[&Path], limit: Duration) -> String {
    let child = Command::new("python3").arg("-c").arg(script).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let output = wait_bounded(child, limit, "python3");
    assert_success(&output, "the python script");
    String::from_utf8(output.stdout).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Trees, as the tests compare them
// ---------------------------------------------------------------------------------------------

/// What a tree holds at one name. Directory sizes are left out: they are not specified. A
/// directory's link count is 2 + its subdirectories on both.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    Directory { mode: u32, nlink: u64 },
    File { mode: u32, nlink: u64, size: u64, fingerprint: u64 },
    Symlink { nlink: u64, size: u64, target: PathBuf },
    Special { kind: &'static str, mode: u32, nlink: u64, rdev: u64 },
}

#[derive(Debug)]
struct Snapshot {
    nodes: BTreeMap<String, Node>,
    /// The names that share one inode, for every inode with several names.
    linked: BTreeSet<Vec<String>>,
}

fn snapshot(root: &Path) -> Snapshot {
    try_snapshot(root).unwrap_or_else(|error| panic!("{error}"))
}

/// [`snapshot`], or what failed on the way (a name listed that is gone by its `lstat`, as
/// through a mount whose caches have not caught up yet).
fn try_snapshot(root: &Path) -> Result<Snapshot, String> {
    let mut nodes = BTreeMap::new();
    let mut by_inode: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    walk(root, "", 0, &mut nodes, &mut by_inode)?;
    let linked = by_inode
        .into_values()
        .filter(|names| names.len() > 1)
        .map(|mut names| {
            names.sort();
            names
        })
        .collect();
    Ok(Snapshot { nodes, linked })
}

fn walk(
    dir: &Path,
    prefix: &str,
    depth: usize,
    nodes: &mut BTreeMap<String, Node>,
    by_inode: &mut BTreeMap<u64, Vec<String>>,
) -> Result<(), String> {
    if depth >= 32 {
        return Err(format!("{} is nested too deep: a directory inside itself?", dir.display()));
    }
    let failed = |what: &str, path: &Path, error: io::Error| format!("{what} {}: {error}", path.display());
    for entry in std::fs::read_dir(dir).map_err(|error| failed("read_dir", dir, error))? {
        let entry = entry.map_err(|error| failed("read_dir", dir, error))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let relative = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
        let path = entry.path();
        let metadata = std::fs::symlink_metadata(&path).map_err(|error| failed("lstat", &path, error))?;
        let file_type = metadata.file_type();
        let mode = metadata.mode() & 0o7777;
        let node = if file_type.is_dir() {
            Node::Directory { mode, nlink: metadata.nlink() }
        } else if file_type.is_file() {
            let contents = std::fs::read(&path).map_err(|error| failed("read", &path, error))?;
            if contents.len() as u64 != metadata.len() {
                return Err(format!("{}: {} bytes read, size {}", path.display(), contents.len(), metadata.len()));
            }
            Node::File { mode, nlink: metadata.nlink(), size: metadata.len(), fingerprint: fingerprint(&contents) }
        } else if file_type.is_symlink() {
            let target = std::fs::read_link(&path).map_err(|error| failed("readlink", &path, error))?;
            Node::Symlink { nlink: metadata.nlink(), size: metadata.len(), target }
        } else {
            let kind = if file_type.is_fifo() {
                "fifo"
            } else if file_type.is_socket() {
                "socket"
            } else if file_type.is_char_device() {
                "char device"
            } else {
                "block device"
            };
            Node::Special { kind, mode, nlink: metadata.nlink(), rdev: metadata.rdev() }
        };
        nodes.insert(relative.clone(), node);
        if file_type.is_dir() {
            walk(&path, &relative, depth + 1, nodes, by_inode)?;
        } else {
            by_inode.entry(metadata.ino()).or_default().push(relative);
        }
    }
    Ok(())
}

/// The differences between two snapshots, one line each; empty if they are equal.
fn differences(expected: &Snapshot, found: &Snapshot) -> String {
    let mut lines = Vec::new();
    let names: BTreeSet<&String> = expected.nodes.keys().chain(found.nodes.keys()).collect();
    for name in names {
        let (left, right) = (expected.nodes.get(name), found.nodes.get(name));
        if left != right {
            lines.push(format!("  {name}: expected {left:?}, found {right:?}"));
        }
    }
    if expected.linked != found.linked {
        lines.push(format!("  names sharing an inode: expected {:?}, found {:?}", expected.linked, found.linked));
    }
    lines.join("\n")
}

// ---------------------------------------------------------------------------------------------
// Random operations, on tmpfs and through the mount
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteMode {
    InPlace,
    Truncate,
    Append,
}

/// One namespace operation, on paths relative to the tree's root.
#[derive(Clone, Debug)]
enum Operation {
    Mkdir(String),
    Rmdir(String),
    /// open(O_CREAT | O_WRONLY [| O_TRUNC | O_APPEND]), write `len` bytes at `offset`.
    Write {
        path: String,
        mode: WriteMode,
        offset: u64,
        len: usize,
        seed: u64,
    },
    /// `rename` (flags 0) or `renameat2` with the flags.
    Rename {
        from: String,
        to: String,
        flags: libc::c_uint,
    },
    Link {
        from: String,
        to: String,
    },
    Unlink(String),
    Symlink {
        target: &'static str,
        path: String,
    },
    /// open(O_RDWR), unlink the name, then write and read through the descriptor.
    UnlinkWhileOpen {
        path: String,
        offset: u64,
        len: usize,
        seed: u64,
    },
    /// open(O_RDWR), rename the name, write through the descriptor, close, read the new name.
    RenameWhileOpen {
        from: String,
        to: String,
        len: usize,
        seed: u64,
    },
    /// lstat, and the contents, target or listing.
    Inspect(String),
}

/// Four names a level, in paths of one to three levels (four below an existing directory):
/// few enough that operations collide.
const NAMES: [&str; 4] = ["a", "b", "c", "d"];
/// Symlink targets: relative and free of "..", so that they resolve inside the tree.
const TARGETS: [&str; 6] = ["a", "b", "c/d", "d/a/b", "missing", "."];

/// A path of one (most often), two or three names.
fn random_path(random: &mut Random) -> String {
    let depth = match random.below(6) {
        0..=2 => 1,
        3 | 4 => 2,
        _ => 3,
    };
    (0..depth).map(|_| NAMES[random.below(NAMES.len() as u64) as usize]).collect::<Vec<_>>().join("/")
}

fn random_len(random: &mut Random) -> usize {
    (match random.below(6) {
        0 => 0,
        1..=3 => 1 + random.below(300),
        4 => 1 + random.below(8_000),
        _ => 1 + random.below(200_000),
    }) as usize
}

fn random_offset(random: &mut Random) -> u64 {
    match random.below(3) {
        0 => 0,
        1 => random.below(500),
        _ => random.below(300_000),
    }
}

/// A name an operation acts on: most often one the reference tree holds (so that operations
/// succeed and collide), else any name of the name space.
fn pick_name(random: &mut Random, existing: &[String]) -> String {
    if existing.is_empty() || random.below(5) < 2 {
        random_path(random)
    } else {
        existing[random.below(existing.len() as u64) as usize].clone()
    }
}

/// A name that may not exist yet: one in a directory the reference tree may hold, or any
/// name of the name space.
fn pick_fresh_name(random: &mut Random, existing: &[String]) -> String {
    if !existing.is_empty() && random.below(2) == 0 {
        let parent = &existing[random.below(existing.len() as u64) as usize];
        let name = NAMES[random.below(NAMES.len() as u64) as usize];
        if parent.matches('/').count() < 3 {
            return format!("{parent}/{name}");
        }
    }
    random_path(random)
}

/// A name an operation creates or replaces: most often a fresh one, else one that exists.
fn pick_new_name(random: &mut Random, existing: &[String]) -> String {
    if random.below(3) == 0 { pick_name(random, existing) } else { pick_fresh_name(random, existing) }
}

/// The names a tree holds: all of them, and those that are not directories.
struct Names {
    all: Vec<String>,
    files: Vec<String>,
}

/// The names below `root` (not following symbolic links), sorted.
fn names_below(root: &Path) -> Names {
    fn collect(root: &Path, prefix: &str, names: &mut Names) {
        for entry in std::fs::read_dir(root.join(prefix)).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            let relative = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
            if !entry.file_type().unwrap().is_dir() {
                names.files.push(relative.clone());
            } else if relative.matches('/').count() < 8 {
                collect(root, &relative, names);
            }
            names.all.push(relative);
        }
    }
    let mut names = Names { all: Vec::new(), files: Vec::new() };
    collect(root, "", &mut names);
    names.all.sort();
    names.files.sort();
    names
}

/// A random operation on the names of the reference tree, which holds `existing`.
fn random_operation(random: &mut Random, existing: &Names) -> Operation {
    let path = pick_name(random, &existing.all);
    let other = pick_new_name(random, &existing.all);
    let new = pick_new_name(random, &existing.all);
    let fresh = pick_fresh_name(random, &existing.all);
    // Files (to link, or to use through a descriptor), most often.
    let file = if random.below(4) == 0 { path.clone() } else { pick_name(random, &existing.files) };
    match random.below(100) {
        0..12 => Operation::Mkdir(new),
        12..17 => Operation::Rmdir(path),
        17..31 => {
            let mode = [WriteMode::InPlace, WriteMode::Truncate, WriteMode::Append][random.below(3) as usize];
            let path = if random.below(2) == 0 { path } else { new };
            Operation::Write { path, mode, offset: random_offset(random), len: random_len(random), seed: random.next() }
        }
        31..39 => Operation::Rename { from: path, to: other, flags: 0 },
        39..44 => Operation::Rename { from: file, to: fresh, flags: 0 },
        44..49 => Operation::Rename { from: path, to: other, flags: libc::RENAME_NOREPLACE },
        49..54 => {
            let flags = if random.below(8) == 0 { libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE } else { libc::RENAME_EXCHANGE };
            Operation::Rename { from: path, to: other, flags }
        }
        54..66 => Operation::Link { from: file, to: fresh },
        66..74 => Operation::Unlink(if random.below(2) == 0 { path } else { file }),
        74..79 => Operation::Symlink { target: TARGETS[random.below(TARGETS.len() as u64) as usize], path: new },
        79..85 => Operation::UnlinkWhileOpen { path: file, offset: random_offset(random), len: random_len(random), seed: random.next() },
        85..90 => Operation::RenameWhileOpen { from: file, to: other, len: random_len(random), seed: random.next() },
        _ => Operation::Inspect(path),
    }
}

/// Applies `operation` below `root`: what it returned (a description that must be the same on
/// every POSIX file system), or its error.
fn apply(root: &Path, operation: &Operation) -> Result<String, String> {
    let at = |relative: &str| root.join(relative);
    let done = |result: io::Result<()>| result.map(|()| "ok".to_string());
    let result = match operation {
        Operation::Mkdir(path) => done(std::fs::create_dir(at(path))),
        Operation::Rmdir(path) => done(std::fs::remove_dir(at(path))),
        Operation::Unlink(path) => done(std::fs::remove_file(at(path))),
        Operation::Link { from, to } => done(std::fs::hard_link(at(from), at(to))),
        Operation::Symlink { target, path } => done(std::os::unix::fs::symlink(target, at(path))),
        Operation::Rename { from, to, flags: 0 } => done(std::fs::rename(at(from), at(to))),
        Operation::Rename { from, to, flags } => done(renameat2(&at(from), &at(to), *flags)),
        Operation::Write { path, mode, offset, len, seed } => write_through_path(&at(path), *mode, *offset, &random_bytes(*seed, *len)),
        Operation::UnlinkWhileOpen { path, offset, len, seed } => unlink_while_open(&at(path), *offset, &random_bytes(*seed, *len)),
        Operation::RenameWhileOpen { from, to, len, seed } => rename_while_open(&at(from), &at(to), &random_bytes(*seed, *len)),
        Operation::Inspect(path) => inspect(&at(path)),
    };
    result.map_err(|error| describe(&error))
}

fn write_through_path(path: &Path, mode: WriteMode, offset: u64, data: &[u8]) -> io::Result<String> {
    let flags = match mode {
        WriteMode::InPlace => 0,
        WriteMode::Truncate => libc::O_TRUNC,
        WriteMode::Append => libc::O_APPEND,
    };
    let mut file = OpenOptions::new().write(true).create(true).mode(0o644).custom_flags(flags).open(path)?;
    if mode != WriteMode::Append {
        file.seek(SeekFrom::Start(offset))?;
    }
    file.write_all(data)?;
    Ok(format!("size {}", file.metadata()?.len()))
}

fn unlink_while_open(path: &Path, offset: u64, data: &[u8]) -> io::Result<String> {
    let file = OpenOptions::new().read(true).write(true).open(path)?;
    let unlinked = std::fs::remove_file(path).map_err(|error| describe(&error));
    file.write_all_at(data, offset)?;
    let metadata = file.metadata()?;
    let mut contents = vec![0u8; metadata.len() as usize];
    file.read_exact_at(&mut contents, 0)?;
    Ok(format!("unlink {unlinked:?}, nlink {}, size {}, contents {:016x}", metadata.nlink(), metadata.len(), fingerprint(&contents)))
}

fn rename_while_open(from: &Path, to: &Path, data: &[u8]) -> io::Result<String> {
    let file = OpenOptions::new().read(true).write(true).open(from)?;
    let renamed = std::fs::rename(from, to).map_err(|error| describe(&error));
    file.write_all_at(data, 0)?;
    let size = file.metadata()?.len();
    drop(file);
    let read = std::fs::read(to).map(|contents| format!("{} bytes {:016x}", contents.len(), fingerprint(&contents)));
    Ok(format!("rename {renamed:?}, size {size}, then read {:?}", read.map_err(|error| describe(&error))))
}

fn inspect(path: &Path) -> io::Result<String> {
    let metadata = std::fs::symlink_metadata(path)?;
    let file_type = metadata.file_type();
    if file_type.is_dir() {
        let mut names: Vec<String> = std::fs::read_dir(path)?
            .map(|entry| entry.map(|entry| entry.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_, _>>()?;
        names.sort();
        Ok(format!("directory {names:?}"))
    } else if file_type.is_symlink() {
        let followed = std::fs::metadata(path).map(|target| target.is_dir()).map_err(|error| describe(&error));
        Ok(format!("symlink to {:?} (nlink {}), is a directory: {followed:?}", std::fs::read_link(path)?, metadata.nlink()))
    } else {
        let contents = std::fs::read(path)?;
        Ok(format!(
            "file, nlink {}, size {}, read {} bytes {:016x}",
            metadata.nlink(),
            metadata.len(),
            contents.len(),
            fingerprint(&contents)
        ))
    }
}

fn numbered(operations: &[Operation]) -> String {
    operations.iter().enumerate().map(|(index, operation)| format!("  {index:3}: {operation:?}\n")).collect()
}

/// Seeds of the random sequences: 1 to 5, or those in RINGFS_TEST_SEEDS (comma separated), to
/// replay a failure.
fn seeds() -> Vec<u64> {
    match std::env::var("RINGFS_TEST_SEEDS") {
        Ok(list) => list.split(',').map(|seed| seed.trim().parse().expect("RINGFS_TEST_SEEDS holds numbers")).collect(),
        Err(_) => (1..=5).collect(),
    }
}

/// Runs the random sequences of [`seeds`] on tmpfs and in a mount made with `mount_args`,
/// comparing every outcome and the trees at the end.
fn random_operations_match_tmpfs(mount_args: &[&str]) {
    const OPERATIONS: usize = 400;
    let cluster = TestCluster::start(3);
    let mount = cluster.mount(mount_args);
    let deadline = Instant::now() + Duration::from_secs(120);
    for seed in seeds() {
        let reference = ShmDir::new(&format!("random-{seed}"));
        let ringfs = mount.path(&format!("seed-{seed}"));
        std::fs::create_dir(&ringfs).unwrap();
        let mut random = Random::new(seed);
        let mut done = Vec::new();
        let mut succeeded = 0;
        for index in 0..OPERATIONS {
            assert!(Instant::now() < deadline, "seed {seed}: only {index} operations ran in the time allowed");
            let operation = random_operation(&mut random, &names_below(&reference.path));
            let expected = apply(&reference.path, &operation);
            let found = apply(&ringfs, &operation);
            done.push(operation);
            assert!(
                expected == found,
                "mount {mount_args:?}, seed {seed}, operation {index}: {:?}\n  tmpfs:  {expected:?}\n  ringfs: {found:?}\nthe sequence so far:\n{}",
                done[index],
                numbered(&done)
            );
            succeeded += usize::from(expected.is_ok());
        }
        let differences = differences(&snapshot(&reference.path), &snapshot(&ringfs));
        assert!(
            differences.is_empty(),
            "mount {mount_args:?}, seed {seed}: the trees differ after {OPERATIONS} operations:\n{differences}\nthe sequence:\n{}",
            numbered(&done)
        );
        assert!(succeeded > OPERATIONS / 5, "seed {seed}: only {succeeded} operations succeeded; the test exercises too little");
    }
}

#[test]
fn random_namespace_operations_give_the_same_results_and_tree_through_the_mount_as_on_tmpfs() {
    if !fuse_available() {
        return;
    }
    random_operations_match_tmpfs(&[]);
}

/// With no attribute or name caching in the kernel, every path is looked up in ringfs.
#[test]
fn random_namespace_operations_match_tmpfs_when_the_kernel_caches_no_names() {
    if !fuse_available() {
        return;
    }
    random_operations_match_tmpfs(&["--attr-timeout-ms", "0"]);
}

#[test]
fn random_namespace_operations_match_tmpfs_with_the_writeback_cache() {
    if !fuse_available() {
        return;
    }
    random_operations_match_tmpfs(&["--writeback-cache"]);
}

#[test]
fn random_namespace_operations_match_tmpfs_with_direct_io() {
    if !fuse_available() {
        return;
    }
    random_operations_match_tmpfs(&["--direct-io"]);
}

/// How long a change made through one mount may take to show through another: the watch
/// asks a server that had nothing new for a while only once a second (CONSISTENCY.md,
/// "Through the FUSE mount"), plus a round trip and the kernel's own work, on a loaded
/// machine.
const SHOWS_ELSEWHERE_WITHIN: Duration = Duration::from_secs(4);

/// The random operations in batches that alternate between two mounts of one cluster (as
/// two nodes), each batch also on tmpfs: every outcome must be tmpfs's — so each mount sees
/// what the other did —, and after each batch the tree seen through the other mount must
/// become tmpfs's within [`SHOWS_ELSEWHERE_WITHIN`] (names, kinds, modes, link counts,
/// sizes, bytes, symlink targets, which names share a file), though it cached the tree as it
/// was before the batch (it walked it whole after the last one).
#[test]
fn random_namespace_operations_in_turns_on_two_mounts_match_tmpfs_and_show_on_the_other() {
    if !fuse_available() {
        return;
    }
    const BATCHES: usize = 40;
    const BATCH: usize = 6;
    let cluster = TestCluster::start(3);
    let mounts = [cluster.mount(&[]), cluster.mount(&[])];
    let deadline = Instant::now() + Duration::from_secs(240);
    let seeds = match std::env::var("RINGFS_TEST_SEEDS") {
        Ok(_) => seeds(),
        Err(_) => (0..3).map(|_| ringfs_rpc::memory::random_u64() % 100_000).collect(),
    };
    for seed in seeds {
        let reference = ShmDir::new(&format!("turns-{seed}"));
        let roots = mounts.each_ref().map(|mount| mount.path(&format!("seed-{seed}")));
        std::fs::create_dir(&roots[0]).unwrap();
        let mut random = Random::new(seed);
        let mut done = Vec::new();
        for batch in 0..BATCHES {
            let (working, other) = (batch % 2, 1 - batch % 2);
            let before = snapshot(&reference.path);
            for _ in 0..BATCH {
                assert!(Instant::now() < deadline, "seed {seed}: only {} operations ran in the time allowed", done.len());
                let operation = random_operation(&mut random, &names_below(&reference.path));
                let expected = apply(&reference.path, &operation);
                let found = apply(&roots[working], &operation);
                let failed = expected != found;
                done.push((working, operation, expected.clone()));
                assert!(
                    !failed,
                    "seed {seed}, operation {} through mount {working}: {:?}\n  tmpfs:  {expected:?}\n  ringfs: {found:?}\nthe sequence so far (mount, operation, tmpfs's outcome):\n{}",
                    done.len() - 1,
                    done[done.len() - 1].1,
                    numbered_on_mounts(&done)
                );
            }
            // The tree, and every name of the name space, of the tree before the batch and in
            // every directory of the tree now (a name gone is not in the tree, but the other
            // mount's kernel may still hold it; a name made may have been cached there as
            // missing).
            let expected = snapshot(&reference.path);
            let mut named = name_space();
            named.extend(before.nodes.keys().cloned());
            for (path, node) in &expected.nodes {
                if matches!(node, Node::Directory { .. }) {
                    named.extend(NAMES.map(|name| format!("{path}/{name}")));
                }
            }
            let expected_names = looked_up(&reference.path, &named);
            let shown = Instant::now() + SHOWS_ELSEWHERE_WITHIN;
            let mut last = String::new();
            while Instant::now() < shown {
                // (Names first: a listing hands the kernel fresh entries for what it lists.)
                let found_names = looked_up(&roots[other], &named);
                last = match try_snapshot(&roots[other]) {
                    Ok(found) => differences(&expected, &found),
                    Err(error) => error,
                };
                for ((name, expected), (_, found)) in expected_names.iter().zip(&found_names) {
                    if expected != found {
                        last.push_str(&format!("\n  lstat {name}: expected {expected:?}, found {found:?}"));
                    }
                }
                if last.is_empty() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(
                last.is_empty(),
                "seed {seed}: {SHOWS_ELSEWHERE_WITHIN:?} after batch {batch} through mount {working}, mount {other} still shows another tree:\n{last}\nthe sequence (mount, operation, tmpfs's outcome):\n{}",
                numbered_on_mounts(&done)
            );
        }
    }
}

/// Every path of one to three of [`NAMES`]: the names the random operations name.
fn name_space() -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    let mut level = vec![String::new()];
    for _ in 0..3 {
        level = level
            .iter()
            .flat_map(|parent| NAMES.map(|name| if parent.is_empty() { name.to_string() } else { format!("{parent}/{name}") }))
            .collect();
        paths.extend(level.iter().cloned());
    }
    paths
}

/// What `lstat` finds at each of `names` below `root`: the kind (and a file's size), or the
/// error.
fn looked_up(root: &Path, names: &BTreeSet<String>) -> Vec<(String, Result<String, String>)> {
    let describe_found = |metadata: std::fs::Metadata| {
        let kind = metadata.file_type();
        if kind.is_file() {
            format!("file of {} bytes", metadata.len())
        } else if kind.is_dir() {
            "directory".to_string()
        } else if kind.is_symlink() {
            "symlink".to_string()
        } else {
            "special".to_string()
        }
    };
    names
        .iter()
        .map(|name| (name.clone(), std::fs::symlink_metadata(root.join(name)).map(describe_found).map_err(|error| describe(&error))))
        .collect()
}

/// The random operations on both mounts at once (as two nodes), each on the names it sees:
/// outcomes may differ from any order of them, but none may be an error a local file system
/// would not give (EIO, ESTALE, a hang), and once both are done every mount — the two and a
/// fresh third, whose kernel cached nothing — must show one tree within
/// [`SHOWS_ELSEWHERE_WITHIN`], with every file's link count its number of names and every
/// directory's 2 + its subdirectories.
#[test]
#[ignore = "a search the soak runs: a rename failed once with ESTALE here, not yet understood (docs/TESTING.md, Not yet here)"]
fn random_namespace_operations_at_once_on_two_mounts_leave_one_consistent_tree() {
    if !fuse_available() {
        return;
    }
    const OPERATIONS: usize = 600;
    let cluster = TestCluster::start(3);
    let mounts = [cluster.mount(&[]), cluster.mount(&[])];
    let seed = match std::env::var("RINGFS_TEST_SEEDS") {
        Ok(_) => seeds()[0],
        Err(_) => ringfs_rpc::memory::random_u64() % 100_000,
    };
    let roots = mounts.each_ref().map(|mount| mount.path(&format!("seed-{seed}")));
    std::fs::create_dir(&roots[0]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let outcomes: Vec<Vec<(Operation, Result<String, String>)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = roots
            .iter()
            .enumerate()
            .map(|(index, root)| {
                scope.spawn(move || {
                    let mut random = Random::new(seed * 2 + index as u64);
                    let mut done = Vec::new();
                    while done.len() < OPERATIONS && Instant::now() < deadline {
                        let operation = random_operation(&mut random, &names_seen(root));
                        let outcome = apply(root, &operation);
                        done.push((operation, outcome));
                    }
                    done
                })
            })
            .collect();
        workers.into_iter().map(|worker| worker.join().expect("a worker panicked")).collect()
    });
    let history = || {
        outcomes
            .iter()
            .enumerate()
            .map(|(mount, done)| {
                format!(
                    "mount {mount}:\n{}",
                    done.iter()
                        .enumerate()
                        .map(|(index, (operation, outcome))| format!("  {index:3}: {operation:?} -> {outcome:?}\n"))
                        .collect::<String>()
                )
            })
            .collect::<String>()
    };
    for (mount, done) in outcomes.iter().enumerate() {
        assert!(done.len() == OPERATIONS, "seed {seed}: mount {mount} ran only {} operations in the time allowed", done.len());
        let succeeded = done.iter().filter(|(_, outcome)| outcome.is_ok()).count();
        assert!(
            succeeded > OPERATIONS / 5,
            "seed {seed}: only {succeeded} operations succeeded through mount {mount}; the test exercises too little"
        );
    }
    // Errors no local file system gives, reported after the tree is checked (which tells
    // whether one left a name behind that names nothing).
    let never = ["errno 5 ", "errno 116 ", "errno 110 ", "errno 11 ", "errno 9 ", "errno 107 "];
    let unexpected: Vec<String> = outcomes
        .iter()
        .enumerate()
        .flat_map(|(mount, done)| done.iter().map(move |(operation, outcome)| (mount, operation, outcome)))
        .filter_map(|(mount, operation, outcome)| match outcome {
            Err(error) if never.iter().any(|errno| error.starts_with(errno)) => {
                Some(format!("{operation:?} through mount {mount}: {error}"))
            }
            _ => None,
        })
        .collect();
    let fresh = cluster.mount(&[]);
    let all = [roots[0].clone(), roots[1].clone(), fresh.path(&format!("seed-{seed}"))];
    let shown = Instant::now() + SHOWS_ELSEWHERE_WITHIN;
    let mut last;
    loop {
        last = String::new();
        // Every name of the name space, looked up first (a listing hands the kernel fresh
        // entries for what it lists, not for what is gone).
        let names = name_space();
        let found: Vec<_> = all.iter().map(|root| looked_up(root, &names)).collect();
        for index in 0..2 {
            for ((name, truth), (_, seen)) in found[2].iter().zip(&found[index]) {
                if truth != seen {
                    last.push_str(&format!("mount {index}: lstat {name}: {seen:?}, a fresh mount: {truth:?}\n"));
                }
            }
        }
        match all.iter().map(|root| try_snapshot(root)).collect::<Result<Vec<_>, _>>() {
            Ok(trees) => {
                for (index, tree) in trees.iter().enumerate().take(2) {
                    let differences = differences(&trees[2], tree);
                    if !differences.is_empty() {
                        last.push_str(&format!("mount {index} against a fresh mount:\n{differences}\n"));
                    }
                }
                if last.is_empty() {
                    // (The tree's deeper names, looked up again after the listing, are fresh.)
                    last = link_count_problems(&trees[2]);
                    assert!(last.is_empty(), "seed {seed}: the tree every mount shows has wrong link counts:\n{last}\n{}", history());
                    assert!(
                        unexpected.is_empty(),
                        "seed {seed}: errors a local file system never gives: {unexpected:?} (the tree is whole)\n{}",
                        history()
                    );
                    break;
                }
            }
            Err(error) => last = error,
        }
        assert!(
            Instant::now() < shown,
            "seed {seed}: {SHOWS_ELSEWHERE_WITHIN:?} after the operations the mounts still differ:\n{last}\nerrors a local file system never gives: {unexpected:?}\n{}",
            history()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_link_count_check_finds_counts_that_are_not_names_or_subdirectories() {
    let file = |nlink| Node::File { mode: 0o644, nlink, size: 0, fingerprint: 0 };
    let directory = |nlink| Node::Directory { mode: 0o755, nlink };
    let nodes: BTreeMap<String, Node> = [("a", file(2)), ("d", directory(3)), ("d/b", file(2)), ("d/e", directory(2)), ("lone", file(1))]
        .into_iter()
        .map(|(name, node)| (name.to_string(), node))
        .collect();
    let linked = BTreeSet::from([vec!["a".to_string(), "d/b".to_string()]]);
    assert_eq!(link_count_problems(&Snapshot { nodes: nodes.clone(), linked }), "");
    let problems = link_count_problems(&Snapshot { nodes, linked: BTreeSet::new() });
    assert!(problems.contains("a: link count 2, names 1") && problems.contains("d/b: link count 2, names 1"), "{problems}");
    let wrong_directory: BTreeMap<String, Node> =
        [("d", directory(2)), ("d/e", directory(2))].into_iter().map(|(name, node)| (name.to_string(), node)).collect();
    assert!(
        link_count_problems(&Snapshot { nodes: wrong_directory, linked: BTreeSet::new() }).contains("d: link count 2, subdirectories 1")
    );
}

/// The names below `root` as far as they can be listed while another client changes them.
fn names_seen(root: &Path) -> Names {
    fn collect(root: &Path, prefix: &str, names: &mut Names) {
        let Ok(entries) = std::fs::read_dir(root.join(prefix)) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let relative = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => {
                    if relative.matches('/').count() < 8 {
                        collect(root, &relative, names);
                    }
                }
                Ok(_) => names.files.push(relative.clone()),
                Err(_) => continue,
            }
            names.all.push(relative);
        }
    }
    let mut names = Names { all: Vec::new(), files: Vec::new() };
    collect(root, "", &mut names);
    names.all.sort();
    names.files.sort();
    names
}

/// Files whose link count is not their number of names, directories whose link count is not
/// 2 + their subdirectories: one line each.
fn link_count_problems(tree: &Snapshot) -> String {
    let mut problems = Vec::new();
    let names_of = |name: &String| tree.linked.iter().find(|group| group.contains(name)).map_or(1, |group| group.len() as u64);
    for (name, node) in &tree.nodes {
        match node {
            Node::File { nlink, .. } | Node::Special { nlink, .. } if *nlink != names_of(name) => {
                problems.push(format!("  {name}: link count {nlink}, names {}", names_of(name)));
            }
            Node::Directory { nlink, .. } => {
                let prefix = format!("{name}/");
                let subdirectories = tree
                    .nodes
                    .iter()
                    .filter(|(child, node)| {
                        matches!(node, Node::Directory { .. }) && child.strip_prefix(&prefix).is_some_and(|rest| !rest.contains('/'))
                    })
                    .count() as u64;
                if *nlink != 2 + subdirectories {
                    problems.push(format!("  {name}: link count {nlink}, subdirectories {subdirectories}"));
                }
            }
            _ => {}
        }
    }
    problems.join("\n")
}

fn numbered_on_mounts(operations: &[(usize, Operation, Result<String, String>)]) -> String {
    operations
        .iter()
        .enumerate()
        .map(|(index, (mount, operation, outcome))| format!("  {index:3}: {mount} {operation:?} -> {outcome:?}\n"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Directory renames
// ---------------------------------------------------------------------------------------------

/// Directory renames (with their errors and `renameat2` flags), `mv`, a shell whose working
/// directory is renamed and a descriptor open across a rename, below `root`: every step's
/// outcome, by name.
fn directory_rename_steps(root: &Path) -> Vec<(&'static str, Result<String, String>)> {
    let at = |relative: &str| root.join(relative);
    let done = |result: io::Result<()>| result.map(|()| "ok".to_string()).map_err(|error| describe(&error));
    let read = |relative: &str| std::fs::read_to_string(at(relative)).map_err(|error| describe(&error));
    for dir in ["a", "a/b", "a/b/c", "full", "empty"] {
        std::fs::create_dir(at(dir)).unwrap();
    }
    for (file, contents) in [("a/f", "f"), ("a/b/g", "g"), ("a/b/c/h", "h"), ("full/x", "x"), ("plain", "plain")] {
        std::fs::write(at(file), contents).unwrap();
    }
    std::os::unix::fs::symlink("b/g", at("a/link")).unwrap();
    let inode = std::fs::metadata(at("a/b/g")).unwrap().ino();
    let (exchange, noreplace) = (libc::RENAME_EXCHANGE, libc::RENAME_NOREPLACE);

    vec![
        ("rename into its own subtree", done(std::fs::rename(at("a"), at("a/b/c/a")))),
        ("rename to a child of itself", done(std::fs::rename(at("a"), at("a/new")))),
        ("rename over a non-empty directory", done(std::fs::rename(at("a"), at("full")))),
        ("rename a directory over a file", done(std::fs::rename(at("a"), at("plain")))),
        ("rename a file over a directory", done(std::fs::rename(at("plain"), at("empty")))),
        ("rename NOREPLACE over an empty directory", done(renameat2(&at("a"), &at("empty"), noreplace))),
        ("rename NOREPLACE onto itself", done(renameat2(&at("a"), &at("a"), noreplace))),
        ("exchange two directories", done(renameat2(&at("a"), &at("full"), exchange))),
        ("read below the exchanged directory", read("full/b/c/h")),
        ("read below the other exchanged directory", read("a/x")),
        ("exchange a file and a directory", done(renameat2(&at("plain"), &at("a"), exchange))),
        ("read the file exchanged with a directory", read("a")),
        ("read below the directory exchanged with a file", read("plain/x")),
        ("exchange them back", done(renameat2(&at("plain"), &at("a"), exchange))),
        ("exchange the directories back", done(renameat2(&at("full"), &at("a"), exchange))),
        ("exchange with a missing name", done(renameat2(&at("a"), &at("missing"), exchange))),
        ("exchange with NOREPLACE", done(renameat2(&at("a"), &at("full"), exchange | noreplace))),
        ("rename NOREPLACE to a new name", done(renameat2(&at("a"), &at("moved"), noreplace))),
        ("the old name is gone", std::fs::symlink_metadata(at("a")).map(|_| "exists".into()).map_err(|error| describe(&error))),
        ("the file below keeps its inode", Ok(format!("{}", std::fs::metadata(at("moved/b/g")).unwrap().ino() == inode))),
        ("a relative symlink below still resolves", read("moved/link")),
        ("rename over an empty directory", done(std::fs::rename(at("moved"), at("empty")))),
        ("mv a directory into another", sh_in(root, "mv empty/b full/ && ls full full/b full/b/c")),
        ("mv a directory to a new name", sh_in(root, "mv full final && ls -R final")),
        (
            "a shell whose working directory is renamed keeps working in it",
            sh_in(root, "cd final/b && mv ../../final ../../last && cat g c/h && echo new > made-here && mkdir sub && ls"),
        ),
        (
            "a descriptor open across a directory rename writes to the file",
            (|| {
                let mut file = OpenOptions::new().append(true).open(at("last/b/g"))?;
                std::fs::rename(at("last"), at("end"))?;
                file.write_all(b"+more")?;
                drop(file);
                std::fs::read_to_string(at("end/b/g"))
            })()
            .map_err(|error| describe(&error)),
        ),
        ("rmdir of the renamed non-empty directory", done(std::fs::remove_dir(at("end")))),
        ("the renamed tree", sh_in(root, "find . | sort")),
    ]
}

#[test]
fn directory_renames_through_the_mount_move_trees_and_fail_as_on_tmpfs() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let reference = ShmDir::new("dir-rename");
    let expected = directory_rename_steps(&reference.path);
    // With names cached by the kernel, and with every name looked up in ringfs.
    for (run, mount_args) in [&[][..], &["--attr-timeout-ms", "0"]].into_iter().enumerate() {
        let mount = cluster.mount(mount_args);
        let root = mount.path(&format!("run-{run}"));
        std::fs::create_dir(&root).unwrap();
        let found = directory_rename_steps(&root);
        let mismatches: Vec<String> = expected
            .iter()
            .zip(&found)
            .filter(|(left, right)| left != right)
            .map(|((step, left), (_, right))| format!("  {step}:\n    tmpfs:  {left:?}\n    ringfs: {right:?}"))
            .collect();
        assert!(mismatches.is_empty(), "mount {mount_args:?}: steps that differ from tmpfs:\n{}", mismatches.join("\n"));
        let differences = differences(&snapshot(&reference.path), &snapshot(&root));
        assert!(differences.is_empty(), "mount {mount_args:?}: the trees differ:\n{differences}");
    }
    // What Linux answers (and ringfs therefore too).
    let outcome = |name: &str| expected.iter().find(|(step, _)| *step == name).unwrap().1.clone();
    let error = |code: i32| Err(describe(&io::Error::from_raw_os_error(code)));
    assert_eq!(outcome("rename into its own subtree"), error(libc::EINVAL));
    assert_eq!(outcome("rename to a child of itself"), error(libc::EINVAL));
    assert_eq!(outcome("rename a directory over a file"), error(libc::ENOTDIR));
    assert_eq!(outcome("rename a file over a directory"), error(libc::EISDIR));
    assert_eq!(outcome("rename NOREPLACE over an empty directory"), error(libc::EEXIST));
    assert_eq!(outcome("exchange with a missing name"), error(libc::ENOENT));
    assert_eq!(outcome("exchange with NOREPLACE"), error(libc::EINVAL));
    assert_eq!(outcome("the file below keeps its inode"), Ok("true".into()));
    let over_full = outcome("rename over a non-empty directory");
    assert!(over_full == error(libc::ENOTEMPTY) || over_full == error(libc::EEXIST), "{over_full:?}");
    assert_eq!(outcome("a descriptor open across a directory rename writes to the file"), Ok("g+more".into()));
}

// ---------------------------------------------------------------------------------------------
// A checkpoint renamed into place under readers
// ---------------------------------------------------------------------------------------------

/// Writes checkpoint N as tmp-checkpoint-N (a manifest and four shards, each holding N) and
/// renames it to checkpoint-N; at most `rounds` of them or for `seconds`. Then writes the done
/// file and prints the last N.
const CHECKPOINT_WRITER: &str = r#"
import json, os, sys, time
root, rounds, seconds, done = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
started = time.monotonic()
n = 0
while n < rounds and time.monotonic() - started < seconds:
    n += 1
    temporary = os.path.join(root, f"tmp-checkpoint-{n}")
    os.makedirs(os.path.join(temporary, "shards"))
    for part in range(4):
        with open(os.path.join(temporary, "shards", f"part-{part}"), "w") as f:
            f.write(f"{n}\n" * (1000 * (part + 1)))
    with open(os.path.join(temporary, "manifest.json"), "w") as f:
        json.dump({"checkpoint": n, "shards": 4}, f)
    os.rename(temporary, os.path.join(root, f"checkpoint-{n}"))
with open(done, "w") as f:
    f.write(str(n))
print(n)
"#;

/// Reads the latest checkpoint completely, again and again, until the writer is done (then
/// once more) or `seconds` passed; prints how many reads, the last checkpoint seen and every
/// inconsistency as JSON.
const CHECKPOINT_READER: &str = r#"
import json, os, sys, time
root, seconds, done = sys.argv[1], float(sys.argv[2]), sys.argv[3]

def problems_of(path, n):
    problems = []
    if sorted(os.listdir(path)) != ["manifest.json", "shards"]:
        problems.append(f"{path} holds {sorted(os.listdir(path))}")
    with open(os.path.join(path, "manifest.json")) as f:
        manifest = json.load(f)
    if manifest != {"checkpoint": n, "shards": 4}:
        problems.append(f"{path}/manifest.json holds {manifest}")
    shards = sorted(os.listdir(os.path.join(path, "shards")))
    if shards != [f"part-{part}" for part in range(4)]:
        problems.append(f"{path}/shards holds {shards}")
    for part in range(4):
        with open(os.path.join(path, "shards", f"part-{part}")) as f:
            text = f.read()
        if text != f"{n}\n" * (1000 * (part + 1)):
            problems.append(f"{path}/shards/part-{part}: {len(text)} characters starting {text[:20]!r}")
    return problems

started = time.monotonic()
reads, last, bad = 0, 0, []
while time.monotonic() - started < seconds and reads < 5000 and len(bad) < 20:
    finished = os.path.exists(done)
    numbers = [int(name.split("-")[1]) for name in os.listdir(root) if name.startswith("checkpoint-")]
    if numbers:
        n = max(numbers)
        try:
            problems = problems_of(os.path.join(root, f"checkpoint-{n}"), n)
        except OSError as error:
            problems = [f"checkpoint-{n}: {error!r}"]
        if n < last:
            problems.append(f"the latest checkpoint went back from {last} to {n}")
        last = max(last, n)
        bad.extend(problems)
        reads += 1
    if finished:
        break
print(json.dumps({"reads": reads, "last": last, "bad": bad}))
"#;

#[test]
fn a_checkpoint_renamed_into_place_is_always_read_complete_by_concurrent_readers() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let mount = cluster.mount(&[]);
    // A second mount: a reader on another client (as on another node).
    let other = cluster.mount(&[]);
    std::fs::create_dir(mount.path("checkpoints")).unwrap();
    let done = cluster.dir.join("writer-done");
    let spawn = |script: &str, args: &[&std::ffi::OsStr]| {
        Command::new("python3").arg("-c").arg(script).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
    };
    let readers: Vec<(String, Child)> = [("a reader on the same mount", &mount), ("a reader on another mount", &other)]
        .into_iter()
        .map(|(name, reader_mount)| {
            (name.to_string(), spawn(CHECKPOINT_READER, &[reader_mount.path("checkpoints").as_os_str(), "25".as_ref(), done.as_os_str()]))
        })
        .collect();
    let writer = spawn(CHECKPOINT_WRITER, &[mount.path("checkpoints").as_os_str(), "200".as_ref(), "10".as_ref(), done.as_os_str()]);
    let written = wait_bounded(writer, Duration::from_secs(60), "the checkpoint writer");
    assert_success(&written, "the checkpoint writer");
    let last: u64 = String::from_utf8_lossy(&written.stdout).trim().parse().unwrap();
    assert!(last >= 10, "the writer wrote only {last} checkpoints");
    for (name, reader) in readers {
        let output = wait_bounded(reader, Duration::from_secs(40), &name);
        assert_success(&output, &name);
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(report["bad"], serde_json::json!([]), "{name} read inconsistent checkpoints (of {last} written): {report}");
        assert!(report["reads"].as_u64().unwrap() >= 10, "{name} read too few checkpoints: {report}");
        assert_eq!(report["last"].as_u64(), Some(last), "{name} did not see the last checkpoint: {report}");
    }
}

// ---------------------------------------------------------------------------------------------
// git
// ---------------------------------------------------------------------------------------------

/// Creates a repository with two commits on a branch, checks out, merges, clones and checks
/// everything (commit dates are fixed, so the hashes are the same everywhere).
const GIT_SCRIPT: &str = r#"
set -e
git init -q -b main repo
cd repo
mkdir -p src docs
printf 'fn main() {}\n' > src/main.rs
seq 1 20000 > docs/numbers.txt
ln -s numbers.txt docs/latest
git add .
git commit -q -m initial
git branch feature
git checkout -q feature
echo 'feature line' >> src/main.rs
git mv docs/numbers.txt docs/renamed.txt
git rm -q docs/latest
git commit -q -am feature
git checkout -q main
test -e docs/numbers.txt && test ! -e docs/renamed.txt && test -L docs/latest
echo "status on main: [$(git status --porcelain)]"
git merge -q --ff-only feature
test ! -e docs/numbers.txt && test -e docs/renamed.txt
echo "status after the merge: [$(git status --porcelain)]"
echo uncommitted >> src/main.rs
echo "status with a change: [$(git status --porcelain)]"
git checkout -q -- src/main.rs
git log --format='%H %s' --all
git fsck --full --strict 2>&1
git gc -q
git fsck --full --strict 2>&1
cd ..
git clone -q repo clone
git -C clone log --format='%H %s'
git -C clone fsck --full --strict 2>&1
echo "clone status: [$(git -C clone status --porcelain)]"
cmp repo/docs/renamed.txt clone/docs/renamed.txt
"#;

fn run_git_script(dir: &Path, home: &Path) -> Output {
    let child = Command::new("sh")
        .arg("-c")
        .arg(GIT_SCRIPT)
        .current_dir(dir)
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "Ringfs Test")
        .env("GIT_AUTHOR_EMAIL", "test@ringfs.invalid")
        .env("GIT_AUTHOR_DATE", "2024-01-02T03:04:05Z")
        .env("GIT_COMMITTER_NAME", "Ringfs Test")
        .env("GIT_COMMITTER_EMAIL", "test@ringfs.invalid")
        .env("GIT_COMMITTER_DATE", "2024-01-02T03:04:05Z")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_bounded(child, Duration::from_secs(120), "the git script")
}

#[test]
fn git_init_commit_branch_checkout_clone_and_fsck_work_in_the_mount() {
    if !fuse_available() {
        return;
    }
    let git = Command::new("git").arg("--version").output();
    assert!(
        git.is_ok_and(|output| output.status.success()),
        "git is not installed: install git (e.g. `apt-get install git`) to run this test"
    );
    let cluster = TestCluster::start(3);
    let mount = cluster.mount(&[]);
    let reference = ShmDir::new("git");
    let home = ShmDir::new("git-home");
    let expected = run_git_script(&reference.path, &home.path);
    assert_success(&expected, "the git script on tmpfs");
    let found = run_git_script(&mount.dir, &home.path);
    assert_success(&found, "the git script in the mount");
    let (expected, found) = (String::from_utf8_lossy(&expected.stdout), String::from_utf8_lossy(&found.stdout));
    assert_eq!(found, expected, "git printed something else in the mount than on tmpfs");
    assert!(found.contains("status on main: []") && found.contains("clone status: []"), "{found}");
    assert!(found.contains("status with a change: [ M src/main.rs]"), "{found}");
    assert_eq!(found.lines().filter(|line| line.ends_with(" feature")).count(), 2, "both logs show the feature commit:\n{found}");
}

// ---------------------------------------------------------------------------------------------
// rsync -aH
// ---------------------------------------------------------------------------------------------

#[test]
fn rsync_with_hard_links_into_the_mount_and_back_keeps_contents_and_links() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let mount = cluster.mount(&[]);
    let source = ShmDir::new("rsync-source");
    let back = ShmDir::new("rsync-back");
    let s = &source.path;
    for dir in ["a", "a/b", "a/b/c", "empty", "z"] {
        std::fs::create_dir(s.join(dir)).unwrap();
    }
    for (index, (file, len)) in
        [("a/one", 0), ("a/b/two", 1), ("a/b/c/three", 5_000), ("z/big", 3_000_000), ("top", 70_000)].iter().enumerate()
    {
        std::fs::write(s.join(file), random_bytes(index as u64 + 1, *len)).unwrap();
    }
    // Three names of one file across directories, two of another, a link to a symlink.
    std::fs::hard_link(s.join("a/b/c/three"), s.join("three-again")).unwrap();
    std::fs::hard_link(s.join("a/b/c/three"), s.join("z/three-as-well")).unwrap();
    std::fs::hard_link(s.join("top"), s.join("a/top-link")).unwrap();
    std::os::unix::fs::symlink("../top", s.join("a/symlink")).unwrap();
    std::fs::hard_link(s.join("a/symlink"), s.join("z/symlink-link")).unwrap();
    std::fs::set_permissions(s.join("top"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let expected = snapshot(s);
    assert_eq!(expected.linked.len(), 3, "{:?}", expected.linked);

    let copy = mount.path("copy");
    let (s, c, b) = (s.display(), copy.display(), back.path.display());
    sh(&format!("rsync -aH {s}/ {c}/ && diff -r {s} {c}"));
    let differences_in = differences(&expected, &snapshot(&copy));
    assert!(differences_in.is_empty(), "the copy in the mount differs:\n{differences_in}");
    sh(&format!("rsync -aH {c}/ {b}/ && diff -r {s} {b}"));
    let differences_back = differences(&expected, &snapshot(&back.path));
    assert!(differences_back.is_empty(), "the copy back out of the mount differs:\n{differences_back}");
    // Nothing to transfer a second time: sizes and times were kept.
    let again = sh(&format!("rsync -aH --stats {s}/ {c}/"));
    assert!(again.contains("Number of regular files transferred: 0"), "{again}");
}

// ---------------------------------------------------------------------------------------------
// Python's tempfile
// ---------------------------------------------------------------------------------------------

const TEMPFILE_SCRIPT: &str = r#"
import os, sys, tempfile
root = sys.argv[1]
with tempfile.TemporaryFile(dir=root) as f:
    f.write(b"0123456789" * 100000)
    f.seek(500000)
    assert f.read(10) == b"0123456789"
    assert f.seek(0, 2) == 1000000
    f.seek(3)
    f.write(b"XYZ")
    f.seek(0)
    assert f.read(8) == b"012XYZ67", "rewritten bytes"
    assert os.listdir(root) == [], f"an unnamed temporary file has no name: {os.listdir(root)}"
    st = os.fstat(f.fileno())
    assert (st.st_nlink, st.st_size) == (0, 1000000), st
named = tempfile.NamedTemporaryFile(dir=root, delete=False)
assert os.listdir(root) == [os.path.basename(named.name)], os.listdir(root)
named.write(b"before unlink\n")
named.flush()
os.unlink(named.name)
assert not os.path.exists(named.name)
assert os.listdir(root) == [], os.listdir(root)
named.write(b"after unlink\n")
named.flush()
named.seek(0)
assert named.read() == b"before unlink\nafter unlink\n"
st = os.fstat(named.fileno())
assert (st.st_nlink, st.st_size) == (0, 27), st
named.seek(7)
named.write(b"UNLINK")
named.seek(0)
assert named.read(20) == b"before UNLINK\nafter ", "rewritten after unlink"
named.close()
assert os.listdir(root) == []
print("tempfile ok")
"#;

#[test]
fn python_temporary_files_work_in_the_mount_also_after_their_name_is_removed() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let mount = cluster.mount(&[]);
    std::fs::create_dir(mount.path("tmp")).unwrap();
    let output = python(TEMPFILE_SCRIPT, &[&mount.path("tmp")], Duration::from_secs(60));
    assert!(output.contains("tempfile ok"), "{output}");
    // The unnamed files went with their last close.
    let client = cluster.client();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let held: u64 = client.server_stats().unwrap().iter().map(|stats| stats.open_unlinked).sum();
        if held == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{held} unlinked temporary files still held after their close");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------------------
// Special files
// ---------------------------------------------------------------------------------------------

#[test]
fn fifos_through_the_mount_carry_data_between_processes_and_are_renamed_linked_and_removed() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let mount = cluster.mount(&[]);
    let m = mount.dir.display();
    sh(&format!("mkfifo -m 640 {m}/fifo"));
    let metadata = std::fs::symlink_metadata(mount.path("fifo")).unwrap();
    assert!(metadata.file_type().is_fifo(), "{:?}", metadata.file_type());
    assert_eq!(metadata.mode() & 0o777, 0o640);
    std::fs::rename(mount.path("fifo"), mount.path("pipe")).unwrap();
    std::fs::hard_link(mount.path("pipe"), mount.path("pipe-link")).unwrap();
    let (pipe, link) =
        (std::fs::symlink_metadata(mount.path("pipe")).unwrap(), std::fs::symlink_metadata(mount.path("pipe-link")).unwrap());
    assert_eq!((pipe.nlink(), link.nlink()), (2, 2));
    assert_eq!(pipe.ino(), link.ino());
    // A writer opens one name, a reader the other: both are the one FIFO.
    for (write_to, read_from) in [("pipe", "pipe"), ("pipe-link", "pipe")] {
        let message = format!("through the fifo {write_to}\n");
        let writer = Command::new("timeout")
            .args(["10", "sh", "-c", &format!("printf '{}' > {}", message.trim_end(), mount.path(write_to).display())])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let reader = Command::new("timeout").arg("10").arg("cat").arg(mount.path(read_from)).stdout(Stdio::piped()).spawn().unwrap();
        let read = wait_bounded(reader, Duration::from_secs(20), "the fifo reader");
        let written = wait_bounded(writer, Duration::from_secs(20), "the fifo writer");
        assert_success(&written, "the fifo writer");
        assert_success(&read, "the fifo reader");
        assert_eq!(String::from_utf8_lossy(&read.stdout), message.trim_end(), "written to {write_to}, read from {read_from}");
    }
    std::fs::remove_file(mount.path("pipe")).unwrap();
    assert_eq!(std::fs::symlink_metadata(mount.path("pipe-link")).unwrap().nlink(), 1);
    std::fs::remove_file(mount.path("pipe-link")).unwrap();
    assert_eq!(std::fs::read_dir(&mount.dir).unwrap().count(), 0);
}

#[test]
fn device_nodes_made_through_the_mount_keep_their_device_numbers_through_rename_and_link() {
    if !fuse_available() {
        return;
    }
    assert!(common::running_as_root(), "mknod of a device needs root; the tests run as root");
    let cluster = TestCluster::start(2);
    let mount = cluster.mount(&[]);
    let null = libc::makedev(1, 3);
    // A minor number above 255 and a major above 255 take the split encoding of dev_t.
    let wide = libc::makedev(259, 70_000);
    // (Modes that a umask of 022 leaves as they are.)
    mknod(&mount.path("null"), libc::S_IFCHR | 0o640, null).unwrap();
    mknod(&mount.path("disk"), libc::S_IFBLK | 0o644, wide).unwrap();
    let check = |name: &str, block: bool, device: libc::dev_t, mode: u32| {
        let metadata = std::fs::symlink_metadata(mount.path(name)).unwrap_or_else(|error| panic!("{name}: {error}"));
        let file_type = metadata.file_type();
        assert_eq!((file_type.is_char_device(), file_type.is_block_device()), (!block, block), "{name}: {file_type:?}");
        assert_eq!(metadata.rdev(), device, "{name}: major {} minor {}", libc::major(metadata.rdev()), libc::minor(metadata.rdev()));
        assert_eq!(metadata.mode() & 0o777, mode, "{name}");
        metadata
    };
    check("null", false, null, 0o640);
    check("disk", true, wide, 0o644);
    assert_eq!(errno(mknod(&mount.path("null"), libc::S_IFCHR | 0o640, null)), libc::EEXIST);
    std::fs::rename(mount.path("null"), mount.path("renamed-null")).unwrap();
    std::fs::hard_link(mount.path("renamed-null"), mount.path("null-link")).unwrap();
    assert_eq!(check("renamed-null", false, null, 0o640).nlink(), 2);
    assert_eq!(check("null-link", false, null, 0o640).ino(), std::fs::symlink_metadata(mount.path("renamed-null")).unwrap().ino());
    renameat2(&mount.path("disk"), &mount.path("null-link"), libc::RENAME_EXCHANGE).unwrap();
    check("disk", false, null, 0o640);
    check("null-link", true, wide, 0o644);
    for name in ["renamed-null", "disk", "null-link"] {
        std::fs::remove_file(mount.path(name)).unwrap();
    }
    assert_eq!(std::fs::read_dir(&mount.dir).unwrap().count(), 0);
    assert_eq!(errno(std::fs::symlink_metadata(mount.path("disk"))), libc::ENOENT);
}

/// Connects to `path`, sends `message` and checks the listener receives it.
fn connect_and_send(listener: &UnixListener, path: &Path, message: &str) {
    let mut client = UnixStream::connect(path).unwrap_or_else(|error| panic!("connect to {}: {error}", path.display()));
    client.write_all(message.as_bytes()).unwrap();
    drop(client);
    let (mut server, _) = listener.accept().unwrap();
    server.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut received = String::new();
    server.read_to_string(&mut received).unwrap();
    assert_eq!(received, message);
}

#[test]
fn a_unix_socket_bound_in_the_mount_accepts_connections_through_each_of_its_names() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let mount = cluster.mount(&[]);
    let path = mount.path("sock");
    assert!(path.as_os_str().len() < 100, "a socket path must fit sun_path: {}", path.display());
    let listener = UnixListener::bind(&path).unwrap();
    assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_socket());
    connect_and_send(&listener, &path, "first");
    std::fs::rename(&path, mount.path("renamed")).unwrap();
    std::fs::hard_link(mount.path("renamed"), mount.path("linked")).unwrap();
    assert_eq!(std::fs::symlink_metadata(mount.path("linked")).unwrap().nlink(), 2);
    assert_eq!(errno(UnixStream::connect(&path)), libc::ENOENT, "the old name is gone");
    connect_and_send(&listener, &mount.path("renamed"), "through the new name");
    connect_and_send(&listener, &mount.path("linked"), "through the link");
    std::fs::remove_file(mount.path("renamed")).unwrap();
    connect_and_send(&listener, &mount.path("linked"), "through the last name");
    std::fs::remove_file(mount.path("linked")).unwrap();
    assert_eq!(errno(UnixStream::connect(mount.path("linked"))), libc::ENOENT);
    assert_eq!(std::fs::read_dir(&mount.dir).unwrap().count(), 0);
}

// ---------------------------------------------------------------------------------------------
// Hard links
// ---------------------------------------------------------------------------------------------

#[test]
fn hard_links_made_with_ln_share_one_file_until_the_last_name_goes() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let mount = cluster.mount(&[]);
    let m = mount.dir.display();
    let contents = random_bytes(8, 300_000);
    std::fs::create_dir_all(mount.path("dir/sub")).unwrap();
    std::fs::write(mount.path("dir/original"), &contents).unwrap();
    sh(&format!("ln {m}/dir/original {m}/other && ln {m}/other {m}/dir/sub/third"));
    let names = ["dir/original", "other", "dir/sub/third"];
    let inode = std::fs::metadata(mount.path("dir/original")).unwrap().ino();
    for name in names {
        let metadata = std::fs::metadata(mount.path(name)).unwrap();
        assert_eq!((metadata.nlink(), metadata.len(), metadata.ino()), (3, contents.len() as u64, inode), "{name}");
    }
    assert_eq!(sh(&format!("stat -c %h {m}/dir/original {m}/other {m}/dir/sub/third")), "3\n3\n3\n");
    // A write through one name shows through the others, also to a descriptor opened before.
    let mut opened_before = std::fs::File::open(mount.path("dir/original")).unwrap();
    std::fs::OpenOptions::new().write(true).open(mount.path("dir/sub/third")).unwrap().write_all_at(b"CHANGED", 100).unwrap();
    let mut seen = [0u8; 7];
    opened_before.read_exact_at(&mut seen, 100).unwrap();
    assert_eq!(&seen, b"CHANGED", "through a descriptor opened before the write");
    assert_eq!(&std::fs::read(mount.path("dir/original")).unwrap()[100..107], b"CHANGED");
    sh(&format!("printf appended >> {m}/other"));
    let mut expected = contents.clone();
    expected[100..107].copy_from_slice(b"CHANGED");
    expected.extend_from_slice(b"appended");
    for name in names {
        assert!(std::fs::read(mount.path(name)).unwrap() == expected, "{name} shows every change");
    }
    let mut through_descriptor = Vec::new();
    opened_before.seek(SeekFrom::Start(0)).unwrap();
    opened_before.read_to_end(&mut through_descriptor).unwrap();
    assert!(through_descriptor == expected, "the descriptor opened before sees the appended bytes");
    // Renaming a name onto another name of the same file does nothing.
    std::fs::rename(mount.path("other"), mount.path("dir/sub/third")).unwrap();
    assert!(mount.path("other").exists() && mount.path("dir/sub/third").exists());
    // Errors.
    assert_eq!(errno(std::fs::hard_link(mount.path("dir"), mount.path("dir-link"))), libc::EPERM, "directories cannot be linked");
    assert_eq!(errno(std::fs::hard_link(mount.path("other"), mount.path("dir/original"))), libc::EEXIST);
    assert_eq!(errno(std::fs::hard_link(mount.path("missing"), mount.path("new"))), libc::ENOENT);
    // Removing a name keeps the others; the file goes with the last.
    sh(&format!("rm {m}/dir/original"));
    for name in ["other", "dir/sub/third"] {
        let metadata = std::fs::metadata(mount.path(name)).unwrap();
        assert_eq!((metadata.nlink(), metadata.ino()), (2, inode), "{name}");
        assert!(std::fs::read(mount.path(name)).unwrap() == expected, "{name}");
    }
    sh(&format!("ln {m}/dir/sub/third {m}/dir/again"));
    assert_eq!(std::fs::metadata(mount.path("other")).unwrap().nlink(), 3, "a link made after a name went");
    for name in ["other", "dir/sub/third"] {
        std::fs::remove_file(mount.path(name)).unwrap();
    }
    assert_eq!(std::fs::metadata(mount.path("dir/again")).unwrap().nlink(), 1);
    drop(opened_before);
    std::fs::remove_file(mount.path("dir/again")).unwrap();
    assert_eq!(sh(&format!("find {m} -type f | wc -l")).trim(), "0");
}

// ---------------------------------------------------------------------------------------------
// Long paths
// ---------------------------------------------------------------------------------------------

/// Every kind of call on a relative path of 4,095 bytes (just under `PATH_MAX`) from a working
/// directory about 6,000 bytes below the tree's root, then paths and names over the limits.
/// Prints one line per call: `ok` or the errno's name.
const LONG_PATHS_SCRIPT: &str = r#"
import errno, os, stat, sys
lines = []
def attempt(what, call, *args):
    try:
        result = call(*args)
        lines.append(f"{what}: ok" + ("" if result is None else f" {result}"))
    except OSError as error:
        lines.append(f"{what}: {errno.errorcode[error.errno]}")
root = sys.argv[1]
os.chdir(root)
for level in range(24):
    name = f"{level:02d}" + "w" * 248
    attempt(f"mkdir level {level}", os.mkdir, name)
    os.chdir(name)
lines.append(f"working directory {len(os.getcwd()) - len(root)} bytes below the root")
parents = "/".join(f"{index:02d}" + "d" * 248 for index in range(16))
for depth in range(1, 17):
    attempt(f"mkdir of a {251 * depth - 1}-byte path", os.mkdir, parents[: 251 * depth - 1])
leaf = parents + "/" + "f" * (4095 - len(parents) - 1)
other = leaf[:-1] + "g"
assert len(leaf) == 4095 and len(other) == 4095
def create(path):
    descriptor = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(descriptor, b"0123456789abcdef")
    os.close(descriptor)
def size_and_mode(path):
    status = os.stat(path)
    return (status.st_size, oct(stat.S_IMODE(status.st_mode)), status.st_nlink)
attempt("create", create, leaf)
attempt("chmod", os.chmod, leaf, 0o600)
attempt("chown", os.chown, leaf, os.getuid(), os.getgid())
attempt("truncate", os.truncate, leaf, 10)
attempt("utime", os.utime, leaf, (1_000_000, 2_000_000))
attempt("stat", size_and_mode, leaf)
attempt("link", os.link, leaf, other)
attempt("stat after link", size_and_mode, leaf)
attempt("unlink of the link", os.unlink, other)
attempt("rename", os.rename, leaf, other)
attempt("rename back", os.rename, other, leaf)
attempt("read", lambda path: open(path, "rb").read(), leaf)
attempt("symlink", os.symlink, "target", other)
attempt("readlink", os.readlink, other)
attempt("unlink of the symlink", os.unlink, other)
attempt("mkfifo", os.mkfifo, other)
attempt("stat of the fifo", lambda path: stat.S_ISFIFO(os.stat(path).st_mode), other)
attempt("unlink of the fifo", os.unlink, other)
if os.getuid() == 0:
    attempt("mknod", os.mknod, other, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    attempt("stat of the device", lambda path: os.stat(path).st_rdev == os.makedev(1, 3), other)
    attempt("unlink of the device", os.unlink, other)
attempt("mkdir", os.mkdir, other)
attempt("listdir", lambda path: sorted(name[:3] for name in os.listdir(path)), parents)
attempt("rmdir", os.rmdir, other)
attempt("unlink", os.unlink, leaf)
# Over the limits: one more byte in a call's path, a component of 256 bytes, a link target of
# 4,096 bytes; the same file by a longer absolute path.
attempt("mkdir of a 4096-byte path", os.mkdir, leaf + "x")
attempt("create of a 4096-byte path", create, leaf + "x")
attempt("mkdir of a 256-byte name", os.mkdir, "n" * 256)
attempt("create of a 256-byte name", create, "n" * 256)
attempt("symlink to a 4096-byte target", os.symlink, "t" * 4096, "short")
attempt("symlink to a 4095-byte target", os.symlink, "t" * 4095, "short")
attempt("readlink of it", lambda path: len(os.readlink(path)), "short")
attempt("stat by the absolute path", os.stat, os.getcwd() + "/short")
for depth in range(16, 0, -1):
    attempt(f"rmdir of a {251 * depth - 1}-byte path", os.rmdir, parents[: 251 * depth - 1])
os.unlink("short")
for level in range(23, -1, -1):
    os.chdir("..")
    attempt(f"rmdir level {level}", os.rmdir, f"{level:02d}" + "w" * 248)
attempt("empty at the end", os.listdir, ".")
print("\n".join(lines))
"#;

#[test]
fn relative_paths_just_under_path_max_from_a_deep_working_directory_work_as_on_tmpfs() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(3);
    let mount = cluster.mount(&[]);
    let reference = ShmDir::new("long-paths");
    let expected = python(LONG_PATHS_SCRIPT, &[&reference.path], Duration::from_secs(60));
    let found = python(LONG_PATHS_SCRIPT, &[&mount.dir], Duration::from_secs(120));
    for (line, (expected, found)) in expected.lines().zip(found.lines()).enumerate() {
        assert_eq!(found, expected, "line {line}: the mount differs from tmpfs");
    }
    assert_eq!(found.lines().count(), expected.lines().count());
    assert!(expected.contains("create: ok") && expected.contains("mkdir of a 4096-byte path: ENAMETOOLONG"), "{expected}");
}
