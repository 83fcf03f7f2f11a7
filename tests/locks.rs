//! Advisory locks through the servers: `fcntl` record locks, OFD locks and `flock` hold
//! between two FUSE mounts of one cluster (two nodes, as far as the locks can tell) and
//! between a mount and a program using the C library; a crashed client's locks lapse.
//!
//! Each test drives *lock agents*: Python processes that run lock commands read from their
//! standard input, through the kernel (a path in a mount) or through libringfs (ctypes),
//! and answer each with one line, so a test can take a lock in one and see it in another.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{ClusterOptions, TestCluster, fuse_available, library_dir, preload_library};

/// A lock agent: commands `open PATH`, `lock FD CMD TYPE START LEN` (CMD one of SETLK,
/// SETLKW, GETLK, OFD_SETLK, OFD_SETLKW, OFD_GETLK; TYPE R, W or U), `flock FD OP` (SH, EX,
/// UN, SH_NB, EX_NB), `close FD`. Answers: `fd N`, `ok`, an errno name, or for GETLK
/// `R|W START LEN` or `U`; a command SIGUSR1 interrupts answers `EINTR`. Backend `kernel` (os and fcntl) or `lib` (libringfs by ctypes,
/// with RINGFS_SERVER and RINGFS_SECRET from the environment).
const AGENT: &str = r#"
import ctypes, errno, fcntl, os, signal, struct, sys
backend = sys.argv[1]
def interrupted(*_):
    raise InterruptedError(errno.EINTR, 'interrupted')
signal.signal(signal.SIGUSR1, interrupted)
F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW = 36, 37, 38
COMMANDS = {'SETLK': fcntl.F_SETLK, 'SETLKW': fcntl.F_SETLKW, 'GETLK': fcntl.F_GETLK,
            'OFD_SETLK': F_OFD_SETLK, 'OFD_SETLKW': F_OFD_SETLKW, 'OFD_GETLK': F_OFD_GETLK}
TYPES = {'R': fcntl.F_RDLCK, 'W': fcntl.F_WRLCK, 'U': fcntl.F_UNLCK}
NAMES = {value: key for key, value in TYPES.items()}
FLOCKS = {'SH': fcntl.LOCK_SH, 'EX': fcntl.LOCK_EX, 'UN': fcntl.LOCK_UN}
LAYOUT = 'hhqqi4x'
if backend == 'lib':
    lib = ctypes.CDLL(sys.argv[2], use_errno=True)
    assert lib.ringfs_init(None) == 0
def check(result):
    if result < 0:
        raise OSError(ctypes.get_errno(), '')
    return result
def do(words):
    if words[0] == 'open':
        if backend == 'lib':
            return 'fd %d' % check(lib.ringfs_open(words[1].encode(), os.O_RDWR | os.O_CREAT, 0o644))
        return 'fd %d' % os.open(words[1], os.O_RDWR | os.O_CREAT, 0o644)
    fd = int(words[1])
    if words[0] == 'close':
        check(lib.ringfs_close(fd)) if backend == 'lib' else os.close(fd)
        return 'ok'
    if words[0] == 'flock':
        operation = FLOCKS[words[2].split('_')[0]] | (fcntl.LOCK_NB if words[2].endswith('_NB') else 0)
        check(lib.ringfs_flock(fd, operation)) if backend == 'lib' else fcntl.flock(fd, operation)
        return 'ok'
    command, kind, start, length = COMMANDS[words[2]], TYPES[words[3]], int(words[4]), int(words[5])
    packed = struct.pack(LAYOUT, kind, os.SEEK_SET, start, length, 0)
    if backend == 'lib':
        buffer = ctypes.create_string_buffer(packed, len(packed))
        check(lib.ringfs_fcntl_lock(fd, command, buffer))
        answer = buffer.raw
    else:
        answer = fcntl.fcntl(fd, command, packed)
    if words[2].endswith('GETLK'):
        kind, _, start, length, _ = struct.unpack(LAYOUT, answer)
        return 'U' if kind == fcntl.F_UNLCK else '%s %d %d' % (NAMES[kind], start, length)
    return 'ok'
for line in sys.stdin:
    try:
        answer = do(line.split())
    except OSError as error:
        answer = errno.errorcode.get(error.errno, str(error.errno))
    print(answer, flush=True)
"#;

/// Asks `command` until it answers `expected` (at most 2 s): the kernel sends a FUSE mount
/// the release of a closed file a moment after `close` returns, so the OFD and `flock`
/// locks of a description closed through a mount end a moment later.
fn ask_until(agent: &mut Agent, command: &str, expected: &str) -> String {
    let started = Instant::now();
    loop {
        let answer = agent.ask(command);
        if answer == expected || started.elapsed() > Duration::from_secs(2) {
            return answer;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

struct Agent {
    child: Child,
    input: ChildStdin,
    /// The agent's answers, read by a thread of their own (so that waiting for one has a
    /// bound even if the agent hangs in a request to a mount that stopped answering).
    output: mpsc::Receiver<String>,
}

impl Agent {
    /// An agent working through the kernel (paths are in a mount).
    fn kernel() -> Agent {
        Agent::spawn(Command::new("python3").args(["-c", AGENT, "kernel"]))
    }

    /// An agent working through the kernel from CPU 0 only (`taskset`).
    fn kernel_on_first_cpu() -> Agent {
        Agent::spawn(Command::new("taskset").args(["-c", "0", "python3", "-c", AGENT, "kernel"]))
    }

    /// An agent working through libringfs (paths are ringfs paths).
    fn library(cluster: &TestCluster) -> Agent {
        let (dir, _) = library_dir();
        let library = dir.join("libringfs.so");
        let mut command = Command::new("python3");
        command
            .args(["-c", AGENT, "lib"])
            .arg(library)
            .env("RINGFS_SERVER", cluster.addresses().join(","))
            .env("RINGFS_SECRET", &cluster.secret)
            .env("RINGFS_TIMEOUT_MS", "5000");
        Agent::spawn(&mut command)
    }

    fn spawn(command: &mut Command) -> Agent {
        let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let input = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (sender, output) = mpsc::channel();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if sender.send(line.trim().to_string()).is_err() {
                    return;
                }
            }
        });
        Agent { child, input, output }
    }

    /// Sends a command without waiting for its answer (a lock that waits).
    fn send(&mut self, command: &str) {
        writeln!(self.input, "{command}").unwrap();
        self.input.flush().unwrap();
    }

    fn answer(&mut self) -> String {
        self.output.recv().expect("the lock agent ended")
    }

    fn ask(&mut self, command: &str) -> String {
        self.send(command);
        self.answer()
    }

    fn open(&mut self, path: &str) -> u32 {
        let answer = self.ask(&format!("open {path}"));
        answer.strip_prefix("fd ").and_then(|fd| fd.parse().ok()).unwrap_or_else(|| panic!("open {path}: {answer}"))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        // (Bounded: a killed agent still closes its files, and a mount that stopped
        // answering leaves it waiting for that until the mount goes.)
        let started = Instant::now();
        while !matches!(self.child.try_wait(), Ok(Some(_))) && started.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Waits (bounded) for the answer to a command sent before; `None` if none came in `limit`.
fn answer_within(agent: &mut Agent, limit: Duration) -> Option<String> {
    agent.output.recv_timeout(limit).ok()
}

/// Record locks, OFD locks and `flock` taken through one mount hold against another mount of
/// the same cluster, as they would between two nodes; `F_GETLK` names the holder; a waiting
/// lock (`F_SETLKW`) is granted when the holder lets go; a process's close of *another*
/// descriptor of the file ends its record locks (POSIX), the close of the descriptor its
/// OFD locks.
#[test]
fn locks_hold_between_two_mounts() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(2);
    let (first, second) = (cluster.mount(&[]), cluster.mount(&[]));
    let (path_a, path_b) = (first.path("shared.db").display().to_string(), second.path("shared.db").display().to_string());
    let (mut a, mut b) = (Agent::kernel(), Agent::kernel());
    let fd_a = a.open(&path_a);
    let fd_b = b.open(&path_b);

    // Record locks.
    assert_eq!(a.ask(&format!("lock {fd_a} SETLK W 0 100")), "ok");
    assert_eq!(b.ask(&format!("lock {fd_b} SETLK W 50 10")), "EAGAIN", "a write lock of the other mount is in the way");
    assert_eq!(b.ask(&format!("lock {fd_b} SETLK R 99 1")), "EAGAIN");
    assert_eq!(b.ask(&format!("lock {fd_b} GETLK W 0 0")), "W 0 100", "F_GETLK names the holder's range");
    assert_eq!(b.ask(&format!("lock {fd_b} SETLK W 100 100")), "ok", "the bytes after it are free");
    assert_eq!(a.ask(&format!("lock {fd_a} SETLK R 150 1")), "EAGAIN", "both ways");
    // A process's close of another descriptor of the file ends its record locks.
    let other_a = a.open(&path_a);
    assert_eq!(a.ask(&format!("close {other_a}")), "ok");
    assert_eq!(b.ask(&format!("lock {fd_b} SETLK W 0 10")), "ok", "the close ended a's locks");
    assert_eq!(b.ask(&format!("lock {fd_b} SETLK U 0 0")), "ok");

    // A waiting lock is granted when the holder lets go.
    assert_eq!(a.ask(&format!("lock {fd_a} SETLK W 0 0")), "ok");
    b.send(&format!("lock {fd_b} SETLKW W 10 1"));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(a.ask(&format!("lock {fd_a} SETLK U 0 0")), "ok");
    let started = Instant::now();
    assert_eq!(answer_within(&mut b, Duration::from_secs(10)).as_deref(), Some("ok"), "F_SETLKW is granted");
    assert!(started.elapsed() < Duration::from_secs(2), "granted soon after the release");
    assert_eq!(b.ask(&format!("lock {fd_b} SETLK U 0 0")), "ok");

    // OFD locks belong to the open file description.
    assert_eq!(a.ask(&format!("lock {fd_a} OFD_SETLK W 0 1")), "ok");
    assert_eq!(b.ask(&format!("lock {fd_b} OFD_SETLK R 0 1")), "EAGAIN");
    assert_eq!(b.ask(&format!("lock {fd_b} OFD_GETLK R 0 1")), "W 0 1");
    assert_eq!(a.ask(&format!("close {fd_a}")), "ok");
    assert_eq!(ask_until(&mut b, &format!("lock {fd_b} OFD_SETLK W 0 1"), "ok"), "ok", "the close of its description ended the OFD lock");
    assert_eq!(b.ask(&format!("close {fd_b}")), "ok");

    // flock: whole-file locks of the description.
    let (fd_a, fd_b) = (a.open(&path_a), b.open(&path_b));
    assert_eq!(a.ask(&format!("flock {fd_a} SH")), "ok");
    assert_eq!(b.ask(&format!("flock {fd_b} SH_NB")), "ok", "shared locks share");
    assert_eq!(b.ask(&format!("flock {fd_b} EX_NB")), "EAGAIN", "an exclusive lock waits for the other reader");
    assert_eq!(a.ask(&format!("close {fd_a}")), "ok");
    assert_eq!(ask_until(&mut b, &format!("flock {fd_b} EX_NB"), "ok"), "ok", "upgraded once the other description closed");
}

/// A holder of a write lock on the whole of `path` and `count` agents sent a `SETLKW` of
/// `kind` on it (not answered yet), each agent made by `spawn`: the holder, its descriptor and
/// the waiters with theirs. (Only waits from then on: every answer is awaited with a bound.)
fn holder_and_waiters(path: &str, count: usize, kind: &str, spawn: fn() -> Agent) -> (Agent, u32, Vec<(Agent, u32)>) {
    let mut holder = spawn();
    let fd = holder.open(path);
    assert_eq!(holder.ask(&format!("lock {fd} SETLK W 0 0")), "ok");
    let mut waiters: Vec<(Agent, u32)> = (0..count)
        .map(|_| {
            let mut waiter = spawn();
            let fd = waiter.open(path);
            (waiter, fd)
        })
        .collect();
    for (waiter, fd) in &mut waiters {
        waiter.send(&format!("lock {fd} SETLKW {kind} 0 0"));
    }
    (holder, fd, waiters)
}

/// Owners waiting for a lock do not hold up the other requests of their CPU: the holder and
/// three waiters all on CPU 0, the holder's unlock gets through and every waiter is granted.
/// (With FUSE over io_uring the kernel hands a CPU's requests to that CPU's queue only, whose
/// threads the waits occupy: `RINGFS_FUSE_IO_URING=1`, `scripts/fuse-uring-tests.sh`.)
#[test]
fn a_holders_unlock_gets_through_while_waiters_on_its_cpu_wait() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(1);
    let mount = cluster.mount(&[]);
    let path = mount.path("contended").display().to_string();
    let (mut holder, fd, mut waiters) = holder_and_waiters(&path, 3, "R", Agent::kernel_on_first_cpu);
    std::thread::sleep(Duration::from_millis(500));
    holder.send(&format!("lock {fd} SETLK U 0 0"));
    assert_eq!(answer_within(&mut holder, Duration::from_secs(10)).as_deref(), Some("ok"), "the unlock got through");
    for (waiter, _) in &mut waiters {
        assert_eq!(answer_within(waiter, Duration::from_secs(10)).as_deref(), Some("ok"), "every waiter is granted the shared lock");
    }
}

/// More owners waiting for a lock than the mount has threads for requests (4 by default):
/// the holder's unlock still gets through and every waiter is granted. A wait must not hold
/// a request thread, or the unlock queues behind the waits for ever.
#[test]
fn a_holders_unlock_gets_through_past_more_waiters_than_request_threads() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(1);
    let mount = cluster.mount(&[]);
    let path = mount.path("contended").display().to_string();
    let (mut holder, fd, mut waiters) = holder_and_waiters(&path, 8, "W", Agent::kernel);
    std::thread::sleep(Duration::from_millis(500));
    // The mount answers other requests while the owners wait.
    let (sender, listed) = mpsc::channel();
    let root = mount.path("");
    std::thread::spawn(move || sender.send(std::fs::read_dir(root).map(|entries| entries.count()).map_err(|e| e.to_string())));
    let listed = listed.recv_timeout(Duration::from_secs(5));
    assert_eq!(listed, Ok(Ok(1)), "a listing beside the waits (a timeout: it waited behind them)");
    holder.send(&format!("lock {fd} SETLK U 0 0"));
    assert_eq!(answer_within(&mut holder, Duration::from_secs(10)).as_deref(), Some("ok"), "the unlock got through");
    // The waiters want the lock exclusively: each is granted in turn as the one before
    // gives it up.
    let mut waiting: Vec<usize> = (0..waiters.len()).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !waiting.is_empty() {
        let granted = waiting.iter().position(|&i| {
            let (waiter, _) = &mut waiters[i];
            answer_within(waiter, Duration::from_millis(200)).is_some_and(|answer| {
                assert_eq!(answer, "ok", "a waiter's answer");
                true
            })
        });
        let Some(position) = granted else {
            assert!(Instant::now() < deadline, "{} waiters still wait with the lock given up", waiting.len());
            continue;
        };
        let i = waiting.remove(position);
        let (waiter, fd) = &mut waiters[i];
        assert_eq!(waiter.ask(&format!("lock {fd} SETLK U 0 0")), "ok");
    }
}

/// A process waiting for a lock through the mount stops waiting when a signal comes, as on a
/// local file system: a handled signal makes `F_SETLKW` fail with EINTR (and no lock is
/// taken behind the program's back), and `kill -9` ends a waiter at once.
#[test]
fn a_signal_ends_a_lock_wait() {
    if !fuse_available() {
        return;
    }
    let cluster = TestCluster::start(1);
    let mount = cluster.mount(&[]);
    let path = mount.path("contended").display().to_string();
    let mut holder = Agent::kernel();
    let fd = holder.open(&path);
    assert_eq!(holder.ask(&format!("lock {fd} SETLK W 0 0")), "ok");

    let mut interrupted = Agent::kernel();
    let interrupted_fd = interrupted.open(&path);
    interrupted.send(&format!("lock {interrupted_fd} SETLKW W 0 0"));
    let mut killed = Agent::kernel();
    let killed_fd = killed.open(&path);
    killed.send(&format!("lock {killed_fd} SETLKW W 0 0"));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(answer_within(&mut interrupted, Duration::ZERO), None, "the lock is held: the waiter waits");

    assert_eq!(unsafe { libc::kill(interrupted.child.id() as i32, libc::SIGUSR1) }, 0);
    assert_eq!(answer_within(&mut interrupted, Duration::from_secs(5)).as_deref(), Some("EINTR"), "a handled signal ends the wait");
    killed.child.kill().unwrap();
    let started = Instant::now();
    while killed.child.try_wait().unwrap().is_none() {
        assert!(started.elapsed() < Duration::from_secs(5), "a waiter killed with SIGKILL is still there");
        std::thread::sleep(Duration::from_millis(10));
    }

    // The interrupted wait took nothing: once the holder lets go, the lock is free for a
    // third process (the killed one's descriptors are closed, so nothing of it is left).
    assert_eq!(holder.ask(&format!("lock {fd} SETLK U 0 0")), "ok");
    let mut third = Agent::kernel();
    let third_fd = third.open(&path);
    assert_eq!(ask_until(&mut third, &format!("lock {third_fd} SETLK W 0 0"), "ok"), "ok", "the lock is free");
    assert_eq!(interrupted.ask(&format!("lock {interrupted_fd} SETLK W 0 0")), "EAGAIN", "the interrupted waiter holds nothing");
}

/// Processes taking and giving back read locks on a file while others read it whole, all
/// through one mount, for a few seconds: every process finishes. Before a lock is granted
/// the mount has the kernel drop the file's cached pages, which waits for pages that reads
/// hold locked while their `READ` requests wait for a thread of the mount: drops on every
/// request thread at once stalled the mount for good (the SQLite shape: readers beside
/// lockers).
#[test]
fn reads_beside_lock_grants_keep_going() {
    if !fuse_available() {
        return;
    }
    const LOAD: &str = r#"
import fcntl, os, struct, sys, time, multiprocessing as mp
path, seconds = sys.argv[1], float(sys.argv[2])
def locker(i, done):
    fd = os.open(path, os.O_RDWR)
    end, taken = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack('hhqqi4x', fcntl.F_RDLCK, 0, 0, 0, 0))
        fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack('hhqqi4x', fcntl.F_UNLCK, 0, 0, 0, 0))
        taken += 1
    done.put('locker %d %d' % (i, taken))
def reader(i, done):
    end, reads = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        with open(path, 'rb') as f:
            while f.read(1 << 20):
                pass
        reads += 1
    done.put('reader %d %d' % (i, reads))
if __name__ == '__main__':
    with open(path, 'wb') as f:
        f.write(os.urandom(8 << 20))
    done = mp.Queue()
    processes = [mp.Process(target=locker, args=(i, done)) for i in range(6)]
    processes += [mp.Process(target=reader, args=(i, done)) for i in range(6)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(seconds + 20)
    stuck = [process for process in processes if process.is_alive()]
    while not done.empty():
        print(done.get(), flush=True)
    print('stuck', len(stuck), flush=True)
    for process in stuck:
        process.kill()
"#;
    let cluster = TestCluster::start(2);
    let mount = cluster.mount(&[]);
    let path = mount.path("shared");
    // (Printed to a file and awaited with a bound: processes stuck in the mount keep a
    // pipe open; the mount's connection is aborted when the test's mount goes.)
    let printed_to = std::env::temp_dir().join(format!("ringfs-locks-load-{}.out", std::process::id()));
    let mut load =
        Command::new("python3").args(["-c", LOAD]).arg(&path).arg("6").stdout(std::fs::File::create(&printed_to).unwrap()).spawn().unwrap();
    let started = Instant::now();
    while load.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = load.kill();
            panic!("the load did not end in 60 s:\n{}", std::fs::read_to_string(&printed_to).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let printed = std::fs::read_to_string(&printed_to).unwrap();
    let _ = std::fs::remove_file(&printed_to);
    assert!(printed.contains("stuck 0"), "processes stuck beside the lock grants:\n{printed}");
    for line in printed.lines().filter(|line| line.starts_with("locker") || line.starts_with("reader")) {
        let done: u64 = line.rsplit(' ').next().and_then(|count| count.parse().ok()).unwrap_or(0);
        assert!(done > 0, "{line}: nothing done");
    }
    assert_eq!(printed.lines().filter(|line| line.starts_with("locker") || line.starts_with("reader")).count(), 12, "{printed}");
}

/// Processes on two mounts (two nodes) and two through the LD_PRELOAD library add to one
/// counter in a file, each addition under an exclusive lock (`lockf` or `flock`, waiting): no
/// addition is lost. What one mount wrote under
/// the lock is what the other reads once it is granted the lock — the kernel's cached pages
/// of the file are dropped before the grant is answered (CONSISTENCY.md, "Locks order data
/// across nodes").
#[test]
fn additions_under_locks_from_two_mounts_are_none_lost() {
    if !fuse_available() {
        return;
    }
    const ADD: &str = r#"
import fcntl, os, sys
path, additions, take = sys.argv[1], int(sys.argv[2]), getattr(fcntl, sys.argv[3])
fd = os.open(path, os.O_RDWR)
for _ in range(additions):
    take(fd, fcntl.LOCK_EX)
    value = int(os.pread(fd, 32, 0).decode().strip() or 0)
    written = str(value + 1).ljust(32).encode()
    os.pwrite(fd, written, 0)
    # (Read back: the mount's own write is seen, and the kernel then holds the file's
    # attributes and pages as fresh — only the next grant's drop can tell it otherwise.)
    assert os.pread(fd, 32, 0) == written
    take(fd, fcntl.LOCK_UN)
"#;
    const PROCESSES_PER_MOUNT: usize = 3;
    const ADDITIONS: usize = 40;
    let cluster = TestCluster::start(2);
    // (No watch for other clients' changes, caches kept for a minute: only the lock grants'
    // drops keep the mounts from reading their own stale pages.)
    let options = ["--watch-ms", "0", "--attr-timeout-ms", "60000"];
    let mounts = [cluster.mount(&options), cluster.mount(&options)];
    std::fs::write(mounts[0].path("counter"), "0").unwrap();
    // First one process, step by step: the first mount caches the file, the second writes
    // under a lock, the first's lock (granted at once: nobody holds it) drops its cache.
    const STEPS: &str = r#"
import fcntl, os, sys
first, second = os.open(sys.argv[1], os.O_RDWR), os.open(sys.argv[2], os.O_RDWR)
assert os.pread(first, 32, 0) == os.pread(first, 32, 0) == b"0"
fcntl.lockf(second, fcntl.LOCK_EX)
os.pwrite(second, b"0".ljust(32), 0)
fcntl.lockf(second, fcntl.LOCK_UN)
fcntl.lockf(first, fcntl.LOCK_EX)
seen = os.pread(first, 32, 0)
fcntl.lockf(first, fcntl.LOCK_UN)
assert seen == b"0".ljust(32), seen
"#;
    let steps = Command::new("timeout")
        .args(["30", "python3", "-c", STEPS])
        .arg(mounts[0].path("counter"))
        .arg(mounts[1].path("counter"))
        .output()
        .unwrap();
    assert!(steps.status.success(), "a lock granted at once read the mount's stale pages: {}", String::from_utf8_lossy(&steps.stderr));
    let mut adders: Vec<Child> = mounts
        .iter()
        .flat_map(|mount| std::iter::repeat_n(mount.path("counter"), PROCESSES_PER_MOUNT))
        .enumerate()
        // (Record locks and `flock` share one space, so both kinds exclude each other.)
        .map(|(i, path)| {
            let take = if i % 3 == 2 { "flock" } else { "lockf" };
            Command::new("python3").args(["-c", ADD]).arg(path).arg(ADDITIONS.to_string()).arg(take).spawn().unwrap()
        })
        .collect();
    // And two processes through the LD_PRELOAD library (a third node, without a kernel cache).
    let prefix = format!("/ringfs-locks-{:x}", std::process::id());
    for take in ["lockf", "flock"] {
        let adder = Command::new("python3")
            .args(["-c", ADD, &format!("{prefix}/counter"), &ADDITIONS.to_string(), take])
            .env("LD_PRELOAD", preload_library())
            .env("RINGFS_MOUNT", &prefix)
            .env("RINGFS_SERVER", cluster.addresses().join(","))
            .env("RINGFS_SECRET", &cluster.secret)
            .spawn()
            .unwrap();
        adders.push(adder);
    }
    let started = Instant::now();
    for adder in &mut adders {
        while adder.try_wait().unwrap().is_none() {
            if started.elapsed() > Duration::from_secs(120) {
                for adder in &mut adders {
                    let _ = adder.kill();
                }
                panic!("the additions did not end in 120 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(adder.wait().unwrap().success(), "an adder failed");
    }
    let total = (2 * PROCESSES_PER_MOUNT + 2) * ADDITIONS;
    for mount in &mounts {
        let counted = std::fs::read_to_string(mount.path("counter")).unwrap();
        assert_eq!(counted.trim(), total.to_string(), "additions lost (read through each mount)");
    }
}

/// The C library's locks (`ringfs_fcntl_lock`, `ringfs_flock`) and a mount's see each other;
/// the locks of a client that dies lapse after the servers' open grace period, so a waiting
/// lock is granted.
#[test]
fn library_locks_meet_mount_locks_and_a_dead_clients_locks_lapse() {
    let options = ClusterOptions { extra_args: vec!["--open-grace-ms".into(), "1000".into()], ..ClusterOptions::new(2) };
    let cluster = TestCluster::with_options(options);
    let mut holder = Agent::library(&cluster);
    let mut other = Agent::library(&cluster);
    let fd = holder.open("/db");
    let other_fd = other.open("/db");
    assert_eq!(holder.ask(&format!("lock {fd} SETLK W 0 0")), "ok");
    assert_eq!(other.ask(&format!("lock {other_fd} SETLK R 5 5")), "EAGAIN");
    assert_eq!(other.ask(&format!("lock {other_fd} GETLK R 5 5")), "W 0 0", "to the end of the file");
    assert_eq!(other.ask(&format!("flock {other_fd} EX_NB")), "EAGAIN", "flock meets record locks (as on NFS)");

    if fuse_available() {
        let mount = cluster.mount(&[]);
        let mut kernel = Agent::kernel();
        let kernel_fd = kernel.open(&mount.path("db").display().to_string());
        assert_eq!(kernel.ask(&format!("lock {kernel_fd} SETLK W 1000 1")), "EAGAIN", "a mount sees the library's lock");
        assert_eq!(kernel.ask(&format!("lock {kernel_fd} GETLK W 1000 1")), "W 0 0");
    }

    // The holder dies without letting go: its lock lapses with its opens.
    other.send(&format!("lock {other_fd} SETLKW W 0 0"));
    std::thread::sleep(Duration::from_millis(200));
    holder.child.kill().unwrap();
    holder.child.wait().unwrap();
    assert_eq!(answer_within(&mut other, Duration::from_secs(20)).as_deref(), Some("ok"), "the dead client's lock lapsed");
}
