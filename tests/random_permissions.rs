//! Randomized: the same seeded sequence of operations by root and two unprivileged users —
//! creates with modes, chmod (set-ID and sticky bits too), chown/chgrp, reads, writes,
//! truncates, renames, links, removals, explicit and current times, extended attributes,
//! access checks — runs on tmpfs and through an `--allow-other` FUSE mount, and every step
//! must answer alike (the result or the errno); at the end both trees must have the same
//! types, modes, owners, sizes, link counts, explicit times and order of mtime and ctime.
//! `RINGFS_TEST_SEEDS` (comma-separated) chooses the seeds.
//!
//! Each user works through an *agent*: a Python process running as that user (Bob also in
//! Alice's group, as a supplementary group) that takes one operation per line on its standard
//! input and answers one line.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use common::{Random, TestCluster, fuse_available, running_as_root};

const ALICE: u32 = 65534;
const BOB: u32 = 60001;

const AGENT: &str = r#"
import errno, os, sys
root = sys.argv[1]
os.umask(0o022)
def at(relative):
    return os.path.join(root, relative)
def run(words):
    op, path = words[0], at(words[1])
    if op == 'mkdir':
        os.mkdir(path, int(words[2], 8))
    elif op == 'create':
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, int(words[2], 8)))
    elif op == 'write':
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.write(fd, words[2].encode())
        os.close(fd)
    elif op == 'read':
        with open(path, 'rb') as f:
            return 'read ' + f.read().decode()
    elif op == 'truncate':
        os.truncate(path, int(words[2]))
    elif op == 'chmod':
        os.chmod(path, int(words[2], 8))
    elif op == 'chown':
        os.chown(path, int(words[2]), int(words[3]), follow_symlinks=False)
    elif op == 'unlink':
        os.unlink(path)
    elif op == 'rmdir':
        os.rmdir(path)
    elif op == 'rename':
        os.rename(path, at(words[2]))
    elif op == 'link':
        os.link(path, at(words[2]))
    elif op == 'symlink':
        os.symlink(words[2], path)
    elif op == 'utime':
        os.utime(path, ns=(1000 * 10**9, 2000 * 10**9))
    elif op == 'touch':
        os.utime(path)
    elif op == 'setxattr':
        os.setxattr(path, 'user.k', words[2].encode())
    elif op == 'getxattr':
        return 'value ' + os.getxattr(path, 'user.k').decode()
    elif op == 'access':
        return 'access %s' % os.access(path, int(words[2]))
    elif op == 'list':
        return 'list ' + ' '.join(sorted(os.listdir(path)))
    return 'ok'
for line in sys.stdin:
    try:
        answer = run(line.split())
    except OSError as error:
        answer = errno.errorcode.get(error.errno, str(error.errno))
    print(answer, flush=True)
"#;

struct Agent {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Agent {
    /// An agent for `uid` working under `root`; `groups`: its supplementary groups.
    fn start(uid: u32, root: &Path, groups: &'static [u32]) -> Agent {
        let mut command = Command::new("python3");
        command.args(["-c", AGENT]).arg(root).current_dir("/").stdin(Stdio::piped()).stdout(Stdio::piped());
        command.env_clear().env("PATH", "/usr/bin:/bin");
        // SAFETY: plain system calls between fork and exec (groups, then gid, then uid: std
        // would drop the supplementary groups); they touch no memory shared with the parent.
        unsafe {
            command.pre_exec(move || {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0 || libc::setgid(uid) != 0 || libc::setuid(uid) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn().unwrap();
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        Agent { child, input, output }
    }

    fn ask(&mut self, operation: &str) -> String {
        writeln!(self.input, "{operation}").unwrap();
        self.input.flush().unwrap();
        let mut line = String::new();
        self.output.read_line(&mut line).unwrap();
        assert!(!line.is_empty(), "the agent ended at {operation}");
        line.trim().to_string()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The paths the operations choose from.
const PATHS: [&str; 10] = ["d1", "d2", "f1", "f2", "d1/x", "d1/y", "d2/x", "d2/y", "d1/d3", "d1/d3/z"];
const MODES: [&str; 13] = ["755", "700", "777", "1777", "2775", "644", "600", "444", "4755", "0", "70", "7", "750"];

fn pick<'a>(random: &mut Random, choices: &[&'a str]) -> &'a str {
    choices[random.below(choices.len() as u64) as usize]
}

/// One random operation (as a line for an agent).
fn random_operation(random: &mut Random) -> String {
    let path = pick(random, &PATHS);
    let other = pick(random, &PATHS);
    let mode = pick(random, &MODES);
    match random.below(17) {
        0 | 1 => format!("mkdir {path} {mode}"),
        2 | 3 => format!("create {path} {mode}"),
        4 => format!("write {path} w{}", random.below(100)),
        5 => format!("read {path}"),
        6 => format!("truncate {path} {}", random.below(5)),
        7 | 8 => format!("chmod {path} {mode}"),
        9 => {
            let (uid, gid) = [(ALICE as i64, ALICE as i64), (BOB as i64, BOB as i64), (-1, ALICE as i64), (-1, BOB as i64), (0, 0)]
                [random.below(5) as usize];
            format!("chown {path} {uid} {gid}")
        }
        10 => format!("unlink {path}"),
        11 => format!("rmdir {path}"),
        12 => format!("rename {path} {other}"),
        13 => format!("{} {path}", ["utime", "touch"][random.below(2) as usize]),
        14 => format!("{} {path} v{}", ["setxattr", "getxattr"][random.below(2) as usize], random.below(10)),
        15 => format!("access {path} {}", random.below(8)),
        _ => match random.below(3) {
            0 => format!("link {path} {other}"),
            1 => format!("symlink {path} {other}"),
            _ => format!("list {path}"),
        },
    }
}

/// Everything compared at the end, for every path below `root`.
fn snapshot(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            found.push(format!("{}: unreadable", dir.display()));
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let metadata = std::fs::symlink_metadata(&path).unwrap();
            let name = path.strip_prefix(root).unwrap().display().to_string();
            let kind = if metadata.is_dir() {
                "dir"
            } else if metadata.file_type().is_symlink() {
                "link"
            } else {
                "file"
            };
            let (mtime, ctime) =
                (metadata.mtime() * 1_000_000_000 + metadata.mtime_nsec(), metadata.ctime() * 1_000_000_000 + metadata.ctime_nsec());
            let order = match mtime.cmp(&ctime) {
                std::cmp::Ordering::Less => "m<c",
                std::cmp::Ordering::Equal => "m=c",
                std::cmp::Ordering::Greater => "m>c",
            };
            // Explicit times (utime sets 2000 s) show as themselves; others by their order.
            let explicit = if mtime < 10_000_000_000_000 { format!(" mtime {mtime}") } else { String::new() };
            let size = if metadata.is_dir() { 0 } else { metadata.size() };
            let mode = if kind == "link" { 0 } else { metadata.mode() & 0o7777 };
            found.push(format!(
                "{name}: {kind} {mode:o} {}:{} size {size} links {} {order}{explicit}",
                metadata.uid(),
                metadata.gid(),
                if metadata.is_dir() { 0 } else { metadata.nlink() }
            ));
            if metadata.is_dir() {
                pending.push(path);
            }
        }
    }
    found.sort();
    found
}

fn seeds() -> Vec<u64> {
    std::env::var("RINGFS_TEST_SEEDS")
        .map(|seeds| seeds.split(',').filter_map(|seed| seed.trim().parse().ok()).collect())
        .unwrap_or_else(|_| vec![1, 2, 3])
}

#[test]
fn random_operations_of_three_users_match_tmpfs() {
    if !running_as_root() {
        eprintln!("SKIPPED: this test switches users and needs root");
        return;
    }
    if !fuse_available() {
        return;
    }
    const OPERATIONS: usize = 300;
    let cluster = TestCluster::start(2);
    std::fs::set_permissions(&cluster.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mount = cluster.mount(&["--allow-other"]);
    for seed in seeds() {
        let tmpfs = std::path::PathBuf::from(format!("/dev/shm/ringfs-random-permissions-{}-{seed}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmpfs);
        let mounted = mount.path(&format!("seed{seed}"));
        for root in [&tmpfs, &mounted] {
            std::fs::create_dir(root).unwrap();
            std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o1777)).unwrap();
        }
        let users = [(0, &[][..]), (ALICE, &[ALICE][..]), (BOB, &[BOB, ALICE][..])];
        let mut agents: Vec<(Agent, Agent)> =
            users.iter().map(|(uid, groups)| (Agent::start(*uid, &tmpfs, groups), Agent::start(*uid, &mounted, groups))).collect();
        let mut random = Random::new(seed);
        let mut history = Vec::new();
        for step in 0..OPERATIONS {
            // tmpfs stamps times with the kernel's coarse clock (a tick of up to 10 ms): steps
            // closer together may get equal times there, which the comparison of mtime's and
            // ctime's order would take for a difference.
            std::thread::sleep(std::time::Duration::from_millis(12));
            let user = random.below(3) as usize;
            let operation = random_operation(&mut random);
            let (on_tmpfs, on_mount) = (agents[user].0.ask(&operation), agents[user].1.ask(&operation));
            history.push(format!("{step}: as {} {operation} -> {on_tmpfs}", users[user].0));
            assert_eq!(
                on_mount,
                on_tmpfs,
                "seed {seed} step {step}: as {} {operation} (left: the mount, right: tmpfs)\nhistory:\n{}",
                users[user].0,
                history.join("\n")
            );
        }
        drop(agents);
        assert_eq!(
            snapshot(&mounted),
            snapshot(&tmpfs),
            "seed {seed}: the trees (left: the mount, right: tmpfs)\nhistory:\n{}",
            history.join("\n")
        );
        let _ = std::fs::remove_dir_all(&tmpfs);
    }
}
