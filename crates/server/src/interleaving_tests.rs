//! Namespace operations of several clients interleaved step by step in an order a seed
//! decides (`testing::Schedule`): afterwards every name must be reachable and every file
//! must have exactly as many links as names, and the same seed must replay the same run —
//! the same order of steps, the same answers, the same tree.
//!
//! `RINGFS_SCHEDULE_SEEDS=1-200` searches more seeds; a failing seed is printed and replays.

use parking_lot::Mutex;
use std::sync::Arc;

use ringfs_proto::{Create, EntryRef, FileOnly, Link, ReadDir, Rename, Request, Response, Rmdir, Unlink};

use crate::testing::{Schedule, TestCluster};

const FILE_MODE: u32 = 0o100644;
const DIR_MODE: u32 = 0o040755;
const CLIENTS: u64 = 4;
const OPERATIONS: usize = 24;

/// A small deterministic generator (xorshift).
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a>(&mut self, choices: &[&'a str]) -> &'a str {
        choices[(self.next() % choices.len() as u64) as usize]
    }
}

/// Directories files are made in (names collide on purpose: 3 per directory).
const DIRS: [&str; 3] = ["/a", "/b", "/a/c"];

/// One random namespace operation.
fn operation(random: &mut Random) -> Request {
    let file = |random: &mut Random| format!("{}/f{}", random.pick(&DIRS), random.next() % 3);
    match random.next() % 10 {
        0..=2 => Request::Create(Create::new(&file(random), FILE_MODE, 1 << 16)),
        3 => Request::Unlink(Unlink { path: file(random), time_ns: 1 }),
        4..=6 => Request::Rename(Rename { from: file(random), to: file(random), time_ns: 1, flags: 0 }),
        7 => Request::Link(Link { from: file(random), to: file(random), time_ns: 1 }),
        8 => {
            let (from, to) = if random.next().is_multiple_of(2) { ("/a/c", "/b/c") } else { ("/b/c", "/a/c") };
            Request::Rename(Rename { from: from.into(), to: to.into(), time_ns: 1, flags: 0 })
        }
        _ => match random.next() % 2 {
            0 => Request::Create(Create::new(random.pick(&["/a/c", "/b/c"]), DIR_MODE, 1 << 16)),
            _ => Request::Rmdir(Rmdir { path: random.pick(&["/a/c", "/b/c"]).into(), time_ns: 1 }),
        },
    }
}

/// Every name of the cluster, walked from the root on every server: (path, what it names).
fn walk(cluster: &TestCluster) -> Vec<(String, EntryRef)> {
    let mut names = Vec::new();
    let mut dirs = vec!["/".to_string()];
    while let Some(dir) = dirs.pop() {
        for server in &cluster.servers {
            let own = server.node.membership().member(&server.node.name).cloned().expect("itself");
            let request = Request::ReadDir(ReadDir { path: dir.clone(), after: None, limit: 10_000 });
            let Ok(Response::DirPage(page)) = server.node.ask(&own, request) else { panic!("listing {dir} on {}", server.node.name) };
            for entry in page.entries {
                let path = if dir == "/" { format!("/{}", entry.name) } else { format!("{dir}/{}", entry.name) };
                if entry.entry.is_dir() {
                    dirs.push(path.clone());
                }
                names.push((path, entry.entry));
            }
        }
    }
    names.sort_by(|a, b| a.0.cmp(&b.0));
    names
}

/// The tree as names and link counts (file ids are random; everything else must replay).
fn checked_tree(cluster: &TestCluster, seed: u64) -> Vec<String> {
    let names = walk(cluster);
    for pair in names.windows(2) {
        assert_ne!(pair[0].0, pair[1].0, "seed {seed}: {} is held twice", pair[0].0);
    }
    let mut tree = Vec::new();
    for (path, entry) in &names {
        let attr = match cluster.call(Request::Stat(FileOnly { file: entry.file })) {
            Ok(Response::Attr(attr)) => attr,
            other => panic!("seed {seed}: {path} names a file that is gone: {other:?}"),
        };
        if !entry.is_dir() {
            let names_of_file = names.iter().filter(|(_, other)| other.file == entry.file).count();
            assert_eq!(attr.nlink as usize, names_of_file, "seed {seed}: {path}'s file has {} links and {names_of_file} names", attr.nlink);
        }
        tree.push(format!("{path} {} {}", if entry.is_dir() { "dir" } else { "file" }, attr.nlink));
    }
    tree
}

/// One run: the answers of every client's operations, the order of steps, the tree, stalls.
fn run(seed: u64) -> (Vec<String>, Vec<String>, Vec<String>, u64) {
    let cluster = Arc::new(TestCluster::new(3));
    for dir in ["/a", "/b", "/a/c"] {
        cluster.call(Request::Create(Create::new(dir, DIR_MODE, 1 << 16))).expect("mkdir");
    }
    for name in ["/a/f0", "/a/f1", "/b/f0", "/a/c/f2"] {
        cluster.call(Request::Create(Create::new(name, FILE_MODE, 1 << 16))).expect("create");
    }
    let schedule = Schedule::new(seed);
    cluster.net.set_schedule(schedule.clone());
    let answers = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (cluster, answers) = (cluster.clone(), answers.clone());
            schedule.spawn(move || {
                let mut random = Random((seed << 8 | client).wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
                for index in 0..OPERATIONS {
                    crate::sched::yield_point();
                    let request = operation(&mut random);
                    let outcome = cluster.call(request.clone()).map(|_| ());
                    answers.lock().push(format!("client {client} op {index}: {request:?} -> {outcome:?}"));
                }
            })
        })
        .collect();
    schedule.start();
    for client in clients {
        client.join().expect("a client step");
    }
    cluster.net.clear_schedule();
    cluster.net.settle();
    let tree = checked_tree(&cluster, seed);
    let mut answers = answers.lock().clone();
    answers.sort();
    let trace = schedule.trace().into_iter().map(|step| format!("{step} {}", schedule.label(step))).collect();
    (answers, trace, tree, schedule.stalls())
}

fn seeds() -> Vec<u64> {
    let text = std::env::var("RINGFS_SCHEDULE_SEEDS").unwrap_or_else(|_| "1-10".into());
    match text.split_once('-') {
        Some((first, last)) => (first.parse().expect("a seed")..=last.parse().expect("a seed")).collect(),
        None => text.split(',').map(|seed| seed.trim().parse().expect("a seed")).collect(),
    }
}

#[test]
fn seeded_interleavings_keep_every_name_reachable_and_replay_exactly() {
    for seed in seeds() {
        let first = run(seed);
        if std::env::var_os("RINGFS_SCHEDULE_VERBOSE").is_some() {
            eprintln!("seed {seed}: {} turns\n{}", first.1.len(), first.0.join("\n"));
        }
        assert!(first.1.len() > 50, "seed {seed}: the schedule interleaved {} turns", first.1.len());
        let again = run(seed);
        if first.3 == 0 && again.3 == 0 {
            if let Some(turn) = first
                .1
                .iter()
                .zip(&again.1)
                .position(|(a, b)| a != b)
                .or((first.1.len() != again.1.len()).then_some(first.1.len().min(again.1.len())))
            {
                let around = |trace: &[String]| trace[turn.saturating_sub(8)..(turn + 8).min(trace.len())].to_vec();
                panic!(
                    "seed {seed}: the same seed gave another order of steps from turn {turn}: {:?} against {:?}",
                    around(&first.1),
                    around(&again.1)
                );
            }
            assert_eq!(first.0, again.0, "seed {seed}: the same order of steps gave other answers");
            assert_eq!(first.2, again.2, "seed {seed}: the same order of steps left another tree");
        } else {
            eprintln!("seed {seed}: {} and {} stalls (a step blocked where the schedule cannot see): not compared", first.3, again.3);
        }
    }
}
