//! The coordinators under aimed faults: each test hurts one named message between the
//! servers of an in-process cluster (`testing`) and checks what the names and files look
//! like afterwards. Each guards a rule written in the coordinator it tests (and was seen to
//! fail with that rule taken out: docs/TESTING.md).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ringfs_proto::{
    ChunkIndex, ChunkKey, ChunkTemplate, Create, Errno, FileId, FileOnly, Link, Lookup, ReadDir, Rename, Request, Response, Rmdir, Unlink,
    Write, WriteSource,
};

use crate::testing::{Action, Filter, TestCluster};

const FILE_MODE: u32 = 0o100644;
const DIR_MODE: u32 = 0o040755;

fn create(cluster: &TestCluster, path: &str, mode: u32) -> FileId {
    match cluster.call(Request::Create(Create::new(path, mode, 1 << 16))) {
        Ok(Response::Opened(opened)) => opened.attr.file_id,
        other => panic!("create {path}: {other:?}"),
    }
}

/// The file `path` names, or the errno of its lookup.
fn lookup(cluster: &TestCluster, path: &str) -> Result<FileId, Errno> {
    match cluster.call(Request::Lookup(Lookup { path: path.to_string(), open_for: 0, access: 0 }))? {
        Response::Opened(opened) => Ok(opened.attr.file_id),
        other => panic!("lookup {path}: {other:?}"),
    }
}

fn link_count(cluster: &TestCluster, file: FileId) -> Result<u32, Errno> {
    match cluster.call(Request::Stat(FileOnly { file }))? {
        Response::Attr(attr) => Ok(attr.nlink),
        other => panic!("stat {file}: {other:?}"),
    }
}

fn rename(cluster: &TestCluster, from: &str, to: &str) -> Result<(), Errno> {
    cluster.call(Request::Rename(Rename { from: from.to_string(), to: to.to_string(), time_ns: 1, flags: 0 })).map(drop)
}

/// The names in directory `dir` on every server, sorted (a name held twice shows twice).
fn list(cluster: &TestCluster, dir: &str) -> Vec<String> {
    let mut names = Vec::new();
    for server in &cluster.servers {
        let request = Request::ReadDir(ReadDir { path: dir.to_string(), after: None, limit: 10_000 });
        match server.node.ask(&server.node.membership().member(&server.node.name).cloned().expect("itself"), request) {
            Ok(Response::DirPage(page)) => names.extend(page.entries.into_iter().map(|entry| entry.name)),
            other => panic!("listing {dir} on {}: {other:?}", server.node.name),
        }
    }
    names.sort();
    names
}

/// Cache mode: three servers over a fresh backend directory (the caller removes it), flushing
/// only on sync.
fn cache_cluster(tag: &str) -> (TestCluster, std::path::PathBuf) {
    let backend = std::env::temp_dir().join(format!("ringfs-{tag}-test-{}", std::process::id()));
    std::fs::create_dir_all(&backend).unwrap();
    let cache = ringfs_store::CacheConfig { backend: backend.clone(), mount_path: "/".into(), chunk_size: 1 << 16 };
    let cluster = TestCluster::with_config(3, |config| {
        config.store.cache = Some(cache.clone());
        config.flush.policy = crate::FlushPolicy::None;
    });
    (cluster, backend)
}

/// A raised flag: the filter holding it acts (or holds its message) until it is lowered.
fn raised() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(true))
}

/// Two paths `{prefix}…` whose names live on two different servers: (path, its server).
fn paths_on_two_servers(cluster: &TestCluster, prefix: &str) -> ((String, String), (String, String)) {
    let first = cluster.path_on(prefix, "s0");
    let second = cluster.path_on(&format!("{prefix}x"), "s1");
    ((first, "s0".into()), (second, "s1".into()))
}

#[test]
fn a_rename_whose_install_answer_was_lost_installs_again_and_completes() {
    let cluster = TestCluster::new(3);
    let ((from, _), (to, to_server)) = paths_on_two_servers(&cluster, "/f");
    let file = create(&cluster, &from, FILE_MODE);
    cluster.net.add(Filter::new("InstallEntry", Action::Drop).to(&to_server).on_answer().times(1));

    rename(&cluster, &from, &to).expect("the install is asked again");

    assert_eq!(lookup(&cluster, &to), Ok(file));
    assert_eq!(lookup(&cluster, &from), Err(Errno::ENOENT));
    assert_eq!(link_count(&cluster, file), Ok(1), "one name, one link");
    assert_eq!(cluster.net.delivered("InstallEntry").len(), 2, "installed, and installed again");
}

#[test]
fn an_install_arriving_after_its_rename_gave_up_changes_nothing() {
    // The shape of the namespace soak's seed 49809: an install held up in the network past
    // its rename's retries arrives after the coordinator released the names.
    let cluster = TestCluster::new(3);
    let ((from, _), (to, to_server)) = paths_on_two_servers(&cluster, "/f");
    let file = create(&cluster, &from, FILE_MODE);
    let release = raised();
    cluster.net.add(Filter::new("InstallEntry", Action::Late { release: release.clone() }).to(&to_server));

    assert_eq!(rename(&cluster, &from, &to), Err(Errno::EIO), "no install answered");
    release.store(false, Ordering::SeqCst);
    cluster.net.settle();

    assert!(!cluster.net.delivered("InstallEntry").is_empty(), "the late installs did arrive");
    assert_eq!(lookup(&cluster, &to), Err(Errno::ENOENT), "a late install of a rename that ended installs nothing");
    assert_eq!(lookup(&cluster, &from), Ok(file));
    assert!(link_count(&cluster, file).unwrap() >= 1);
}

#[test]
fn a_late_copy_of_a_subtree_move_moves_nothing() {
    // The shape of the simulation's seed 81344: a `MoveSubtree` held up in the network
    // arrives after its rename ended and the directory was renamed back.
    let cluster = TestCluster::new(3);
    create(&cluster, "/d", DIR_MODE);
    let names: Vec<String> = ["s0", "s1", "s2"].iter().map(|server| cluster.path_on("/d/f", server)).collect();
    for name in &names {
        create(&cluster, name, FILE_MODE);
    }
    let release = raised();
    cluster.net.add(Filter::new("MoveSubtree", Action::Duplicate { release: release.clone() }).to("s1").times(1));

    rename(&cluster, "/d", "/e").expect("rename there");
    rename(&cluster, "/e", "/d").expect("and back");
    release.store(false, Ordering::SeqCst);
    cluster.net.settle();

    let expected: Vec<String> = {
        let mut expected: Vec<String> = names.iter().map(|name| name.trim_start_matches("/d/").to_string()).collect();
        expected.sort();
        expected
    };
    assert_eq!(list(&cluster, "/d"), expected, "every name below /d, once");
    assert_eq!(lookup(&cluster, "/e"), Err(Errno::ENOENT));
    for name in &names {
        assert!(lookup(&cluster, name).is_ok(), "{name} is reachable");
    }
}

#[test]
fn a_link_whose_install_answer_was_lost_keeps_a_link_for_each_name() {
    // A link may have happened when its install answered nothing: taking its count back
    // would leave two names with one link, and removing one would free the file under the
    // other.
    let cluster = TestCluster::new(3);
    let ((from, _), (to, to_server)) = paths_on_two_servers(&cluster, "/l");
    let file = create(&cluster, &from, FILE_MODE);
    cluster.net.add(Filter::new("InstallEntry", Action::Drop).to(&to_server).on_answer());

    let linked = cluster.call(Request::Link(Link { from: from.clone(), to: to.clone(), time_ns: 1 }));
    assert_eq!(linked, Err(Errno::EIO));
    cluster.net.clear();

    assert_eq!(lookup(&cluster, &to), Ok(file), "the install happened, only its answer was lost");
    assert_eq!(link_count(&cluster, file), Ok(2), "a link for each name");
    cluster.call(Request::Unlink(Unlink { path: from, time_ns: 2 })).expect("unlink");
    assert_eq!(link_count(&cluster, file), Ok(1), "the other name keeps the file");
}

#[test]
fn an_rmdir_that_cannot_ask_every_server_keeps_the_directory() {
    let cluster = TestCluster::new(3);
    let dir = (0..100).map(|n| format!("/r{n}")).find(|dir| cluster.owner_of(dir) == "s0").expect("a directory on s0");
    create(&cluster, &dir, DIR_MODE);
    let inside = cluster.path_on(&format!("{dir}/x"), "s2");
    create(&cluster, &inside, FILE_MODE);
    cluster.net.add(Filter::new("PrepareRmdir", Action::Drop).to("s2"));

    assert_eq!(cluster.call(Request::Rmdir(Rmdir { path: dir.clone(), time_ns: 1 })), Err(Errno::EIO));

    cluster.net.clear();
    assert!(lookup(&cluster, &dir).is_ok(), "the directory stays");
    assert!(lookup(&cluster, &inside).is_ok(), "and the name inside it");
    assert_eq!(cluster.call(Request::Rmdir(Rmdir { path: dir, time_ns: 2 })), Err(Errno::ENOTEMPTY));
}

#[test]
fn a_directory_rename_whose_freeze_is_lost_moves_nothing_and_leaves_nothing_frozen() {
    let cluster = TestCluster::new(3);
    create(&cluster, "/d", DIR_MODE);
    let names: Vec<String> = ["s0", "s1", "s2"].iter().map(|server| cluster.path_on("/d/f", server)).collect();
    for name in &names {
        create(&cluster, name, FILE_MODE);
    }
    let victim = if cluster.owner_of("/d") == "s2" { "s1" } else { "s2" };
    cluster.net.add(Filter::new("Freeze", Action::Drop).to(victim).times(1));

    assert_eq!(rename(&cluster, "/d", "/e"), Err(Errno::EIO));

    assert_eq!(lookup(&cluster, "/e"), Err(Errno::ENOENT));
    for name in &names {
        assert!(lookup(&cluster, name).is_ok(), "{name} did not move");
    }
    let started = Instant::now();
    let created =
        cluster.client_call(Request::Create(Create::new(&cluster.path_on("/d/new", victim), FILE_MODE, 1 << 16)), Duration::from_secs(2));
    assert!(created.is_ok(), "no subtree stays frozen: {created:?}");
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn a_directory_rename_whose_move_answer_was_lost_moves_every_name_once() {
    let cluster = TestCluster::new(3);
    create(&cluster, "/d", DIR_MODE);
    let mut names: Vec<String> = Vec::new();
    for server in ["s0", "s1", "s2"] {
        for round in 0..3 {
            names.push(cluster.path_on(&format!("/d/{round}f"), server));
        }
    }
    for name in &names {
        create(&cluster, name, FILE_MODE);
    }
    cluster.net.add(Filter::new("MoveSubtree", Action::Drop).to("s1").on_answer().times(1));

    rename(&cluster, "/d", "/e").expect("the move is asked again");

    let mut expected: Vec<String> = names.iter().map(|name| name.trim_start_matches("/d/").to_string()).collect();
    expected.sort();
    assert_eq!(list(&cluster, "/e"), expected, "every name once");
    assert!(list(&cluster, "/d").is_empty());
    assert!(cluster.net.delivered("MoveSubtree").iter().filter(|delivery| delivery.to == "s1").count() >= 2);
}

/// The names a server takes out for a directory rename exist nowhere else until their new
/// servers have them: if none reaches one new server for as long as the rename tries (the
/// coordinator gives up after half a lease) and still not at the thaw, they must not be
/// dropped.
#[test]
fn names_moved_that_cannot_reach_their_new_server_during_the_whole_rename_are_not_lost() {
    let cluster = TestCluster::new(3);
    create(&cluster, "/d", DIR_MODE);
    let mut names: Vec<String> = Vec::new();
    for server in ["s0", "s1", "s2"] {
        for round in 0..3 {
            names.push(cluster.path_on(&format!("/d/{round}f"), server));
        }
    }
    let files: Vec<FileId> = names.iter().map(|name| create(&cluster, name, FILE_MODE)).collect();
    // Every name's new server under /e; cut off the one that receives the most of them.
    let receivers: Vec<String> = names.iter().map(|name| cluster.owner_of(&name.replacen("/d/", "/e/", 1))).collect();
    let victim =
        ["s0", "s1", "s2"].into_iter().max_by_key(|server| receivers.iter().filter(|receiver| receiver == server).count()).unwrap();
    let cut = Arc::new(AtomicBool::new(true));
    cluster.net.add(Filter::new("PutEntries", Action::Drop).to(victim).while_raised(cut.clone()));

    let renamed = rename(&cluster, "/d", "/e");
    // While names are on their way, the next rename's freeze is refused where they wait.
    let later = ringfs_proto::Subtree { token: crate::name_locks::new_token(), from: "/e".into(), to: "/g".into(), exchange: false };
    let waiting: Vec<usize> = (0..3).filter(|&index| !cluster.servers[index].dispatcher.trees.send_undelivered()).collect();
    assert!(!waiting.is_empty(), "some names could not be sent while the cut lasts");
    for &index in &waiting {
        assert_eq!(cluster.servers[index].dispatcher.trees.freeze(&later).map(drop), Err(Errno::EBUSY));
    }
    cut.store(false, Ordering::SeqCst);
    // (What the servers' heartbeats do.)
    for server in &cluster.servers {
        server.dispatcher.names.retry_releases();
        assert!(server.dispatcher.trees.send_undelivered(), "the names reach their server once it can be reached");
    }
    assert_eq!(renamed, Ok(()), "the rename completed: every server took its names");

    // Wherever the rename left the tree, every file is still reachable by a name.
    let root = if lookup(&cluster, "/e").is_ok() { "/e" } else { "/d" };
    for (name, file) in names.iter().zip(&files) {
        let now = name.replacen("/d/", &format!("{root}/"), 1);
        assert_eq!(lookup(&cluster, &now), Ok(*file), "{now} after the rename answered {renamed:?}");
    }
}

#[test]
fn a_lost_thaw_is_sent_again_and_the_tree_thaws() {
    let cluster = TestCluster::new(3);
    create(&cluster, "/d", DIR_MODE);
    let coordinator = cluster.index_of(&cluster.owner_of("/d"));
    let victim = if cluster.owner_of("/d") == "s2" { "s1" } else { "s2" };
    cluster.net.add(Filter::new("Thaw", Action::Drop).to(victim).times(1));

    rename(&cluster, "/d", "/e").expect("rename");
    let name = cluster.path_on("/e/new", victim);
    let frozen = cluster.client_call(Request::Create(Create::new(&name, FILE_MODE, 1 << 16)), Duration::from_millis(400));
    assert!(matches!(frozen, Err(Errno::ETIMEDOUT | Errno::EBUSY)), "still frozen where the thaw was lost: {frozen:?}");

    cluster.servers[coordinator].dispatcher.names.retry_releases();

    let created = cluster.client_call(Request::Create(Create::new(&name, FILE_MODE, 1 << 16)), Duration::from_secs(2));
    assert!(created.is_ok(), "thawed by the thaw sent again: {created:?}");
}

#[test]
fn a_stat_waits_at_most_the_touch_wait_for_a_server_holding_back_touches() {
    // Directory times are collected from the servers that hold touches back before a stat
    // answers; a server that does not answer must not hold the stat longer than TOUCH_WAIT.
    let cluster = TestCluster::new(3);
    let dir = (0..100).map(|n| format!("/t{n}")).find(|dir| cluster.owner_of(dir) == "s0").expect("a directory on s0");
    let dir_file = create(&cluster, &dir, DIR_MODE);
    let inside = cluster.path_on(&format!("{dir}/x"), "s1");
    create(&cluster, &inside, FILE_MODE);
    // The first create there lent the directory's times to s1; the next is held back there.
    create(&cluster, &cluster.path_on(&format!("{dir}/y"), "s1"), FILE_MODE);
    let release = raised();
    cluster.net.add(Filter::new("CollectTouches", Action::Hold { release: release.clone() }).to("s1"));
    let releaser = {
        let release = release.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(4));
            release.store(false, Ordering::SeqCst);
        })
    };

    let started = Instant::now();
    let stat = cluster.call(Request::Stat(FileOnly { file: dir_file }));
    let waited = started.elapsed();
    release.store(false, Ordering::SeqCst);
    releaser.join().unwrap();

    assert!(matches!(stat, Ok(Response::Attr(_))), "{stat:?}");
    assert!(cluster.net.delivered("CollectTouches").iter().any(|delivery| delivery.to == "s1") || waited >= Duration::from_millis(400));
    assert!(waited < Duration::from_secs(2), "the stat waited {waited:?} for a server that did not answer");
}

#[test]
fn a_stat_during_the_periodic_send_of_held_back_touches_shows_them() {
    // A server holding back a directory's touches sends them every 250 ms; a stat at the
    // directory's inode server while that send is on its way collects them from the holder,
    // which must count the touch it is sending (it no longer holds it back): CI saw the
    // directory show a time older than its newest name.
    let cluster = TestCluster::new(3);
    let dir = (0..100).map(|n| format!("/t{n}")).find(|dir| cluster.owner_of(dir) == "s0").expect("a directory on s0");
    let dir_file = create(&cluster, &dir, DIR_MODE);
    create(&cluster, &cluster.path_on(&format!("{dir}/x"), "s1"), FILE_MODE);
    let mut unlink = Unlink { path: cluster.path_on(&format!("{dir}/x"), "s1"), time_ns: 0 };
    // Held back at s1: a change with a time later than any before.
    let latest = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64 + 3_600_000_000_000;
    unlink.time_ns = latest;
    cluster.call(Request::Unlink(unlink)).expect("unlink");
    let release = raised();
    cluster.net.add(Filter::new("TouchDir", Action::Hold { release: release.clone() }).from("s1").to("s0"));
    let holder = cluster.servers[cluster.index_of("s1")].dispatcher.dir_times.clone();
    let sender = std::thread::spawn(move || holder.flush_held_back());
    // Until the periodic send has taken the touch and is held on its way.
    let deadline = Instant::now() + Duration::from_secs(5);
    while cluster.net.caught("TouchDir") == 0 {
        assert!(Instant::now() < deadline, "the held-back touch was never sent");
        std::thread::sleep(Duration::from_millis(5));
    }
    let stat = cluster.call(Request::Stat(FileOnly { file: dir_file }));
    release.store(false, Ordering::SeqCst);
    sender.join().unwrap();
    match stat {
        Ok(Response::Attr(attr)) => {
            assert!(attr.mtime_ns >= latest, "the stat shows {} before the held-back touch {latest}", attr.mtime_ns)
        }
        other => panic!("stat: {other:?}"),
    }
}

#[test]
fn a_flush_whose_inode_server_did_not_answer_waits_and_flushes_later() {
    // Cache mode: before a chunk is flushed, its server asks the inode's server where the
    // file lives in the backend (`FlushPrepare`); a chunk whose question got no answer must
    // wait and be flushed later, never be taken for the chunk of a file with no place.
    let (cluster, backend) = cache_cluster("flush");
    let file = create(&cluster, "/out", FILE_MODE);
    let template = ChunkTemplate { mode: FILE_MODE, uid: 0, gid: 0, chunk_size: 1 << 16, backend_len: 0 };
    let second_chunk = ChunkKey::new(file, ChunkIndex(1));
    let data_server = cluster.servers[0].node.owner_of_chunk(second_chunk).name;
    let inode_server = cluster.servers[0].node.home_of(file).name;
    assert_ne!(data_server, inode_server, "chunk 1 lives on the next server");
    cluster.call(Request::MarkExtended(ringfs_proto::MarkExtended { file, last_chunk: ChunkIndex(1) })).unwrap();
    let write = Write { chunk: second_chunk, offset: 0, source: WriteSource::Inline, template, time_ns: 1 };
    cluster.client_call_with_data(Request::Write(write), b"second chunk", Duration::from_secs(10)).unwrap();
    cluster.net.add(Filter::new("FlushPrepare", Action::Drop).from(&data_server).to(&inode_server).on_answer().times(2));

    cluster.sync().expect("sync");

    let flushed = std::fs::read(backend.join("out")).unwrap_or_default();
    std::fs::remove_dir_all(&backend).unwrap();
    assert!(cluster.net.delivered("FlushPrepare").len() >= 3, "asked again after the lost answers");
    assert_eq!(flushed.len(), (1 << 16) + 12);
    assert_eq!(&flushed[1 << 16..], b"second chunk");
}

/// Cache mode: a file's rename moves its backend file before the new name is installed
/// (`MoveBackendFile`, exchanging it with the replaced file's); a rename whose installation
/// is refused (not lost: nothing was installed) moves both back, and the names and the
/// backend are as before. Done again without the fault, the rename moves the file once.
#[test]
fn a_rename_refused_at_its_install_moves_the_backend_files_back() {
    let (cluster, backend) = cache_cluster("move-back");
    let ((from, _), (to, to_server)) = paths_on_two_servers(&cluster, "/f");
    let in_backend = |path: &str| backend.join(&path[1..]);
    std::fs::write(in_backend(&from), b"the renamed file").unwrap();
    std::fs::write(in_backend(&to), b"the replaced file").unwrap();
    let renamed = lookup(&cluster, &from).expect("found in the backend");
    let replaced = lookup(&cluster, &to).expect("found in the backend");
    cluster.net.add(Filter::new("InstallEntry", Action::Refuse(Errno::ENOTDIR)).to(&to_server).times(1));

    let refused = rename(&cluster, &from, &to);
    let after_refusal = (std::fs::read(in_backend(&from)), std::fs::read(in_backend(&to)));
    let names_after_refusal = (lookup(&cluster, &from), lookup(&cluster, &to));
    let settled = cluster.net.delivered("SettleBackendName").len();
    let renamed_again = rename(&cluster, &from, &to);
    // Exchanged: the replaced file's backend file is under the old name until it is removed.
    let exchanged = std::fs::read(in_backend(&from));
    let synced = cluster.sync();
    let after_rename = (std::fs::read(in_backend(&from)).ok(), std::fs::read(in_backend(&to)));
    std::fs::remove_dir_all(&backend).unwrap();

    assert_eq!(refused, Err(Errno::ENOTDIR));
    assert!(settled >= 1, "the new name's server was asked to settle it before the move");
    assert_eq!(after_refusal.0.unwrap(), b"the renamed file", "the renamed file is back at its name");
    assert_eq!(after_refusal.1.unwrap(), b"the replaced file", "the replaced file is back at its name");
    assert_eq!(names_after_refusal, (Ok(renamed), Ok(replaced)));
    assert_eq!(renamed_again, Ok(()));
    assert_eq!(exchanged.unwrap(), b"the replaced file", "the backend files were exchanged");
    synced.expect("sync");
    assert_eq!(after_rename.0, None, "the old name (holding the replaced file's backend file) is gone");
    assert_eq!(after_rename.1.unwrap(), b"the renamed file");
}

/// Cache mode: a file's backend file moved by a rename whose answer was lost is asked again
/// (`MoveBackendFile`); the move is not made twice (asked again, it answers that it was
/// made), and the rename completes with the backend file at the new name.
#[test]
fn a_backend_move_whose_answer_was_lost_is_asked_again_and_the_rename_completes() {
    let (cluster, backend) = cache_cluster("lost-move");
    let names: Vec<String> = cluster.servers.iter().map(|server| server.node.name.clone()).collect();
    let first = cluster.path_on("/a", &names[0]);
    let (from, to) = (cluster.path_on("/b", &names[1]), cluster.path_on("/c", &names[2]));
    let in_backend = |path: &str| backend.join(&path[1..]);
    std::fs::write(in_backend(&first), b"the file").unwrap();
    let file = lookup(&cluster, &first).expect("found in the backend");
    // Its inode stays on the first server: moves asked by the second go over the network.
    rename(&cluster, &first, &from).expect("rename");
    cluster.net.add(Filter::new("MoveBackendFile", Action::Drop).to(&names[0]).on_answer().times(1));

    let renamed = rename(&cluster, &from, &to);
    let moves = cluster.net.delivered("MoveBackendFile").len();
    let rebinds = cluster.net.delivered("Rebind").len();
    let synced = cluster.sync();
    let contents = [&first, &from, &to].map(|path| std::fs::read(in_backend(path)).ok());
    let names_now = (lookup(&cluster, &from), lookup(&cluster, &to));
    std::fs::remove_dir_all(&backend).unwrap();

    assert_eq!(renamed, Ok(()));
    assert!(moves >= 2, "asked again after the lost answer ({moves})");
    assert_eq!(rebinds, 0, "the move asked again answered that it was made: no slow way");
    synced.expect("sync");
    assert_eq!(contents, [None, None, Some(b"the file".to_vec())]);
    assert_eq!(names_now, (Err(Errno::ENOENT), Ok(file)));
}

/// Member lists: a push lost on its way is mended by the lists' exchanges (each heartbeat a
/// server exchanges its list with another in turn, and hears in the answer what the other
/// knows better). Servers no longer push on what they learn from a push — at a job's start
/// that made each join cost every server a push from every other — so these exchanges are
/// what reaches a server a lost push missed.
#[test]
fn a_lost_push_of_the_member_list_is_mended_by_the_exchanges() {
    let cluster = TestCluster::new(4);
    let (s0, s2) = (&cluster.servers[0].node, &cluster.servers[2].node);
    cluster.net.add(Filter::new("PushMembers", Action::Drop).from("s0").to("s2"));
    assert!(s0.membership_mut().declare_dead("s3"));
    s0.push_members_to_all();
    let alive_at = |server: usize| cluster.servers[server].node.membership().member("s3").is_some_and(|member| member.alive);
    assert!(!alive_at(1), "s1 heard the push");
    assert!(alive_at(2), "the push to s2 was lost");
    assert_eq!(cluster.net.caught("PushMembers"), 1);
    let mut turn = 0;
    for _ in 0..3 {
        crate::exchange_members(s2, &mut turn, Duration::from_secs(5));
    }
    assert!(!alive_at(2), "s2's exchanges told it (from s0's or s1's answer)");
}

/// The heartbeat's exchange compares digests: servers that agree exchange no list, and one
/// that lacks something gets the list in the answer — or, if the asker is the one that
/// knows more, the asker pushes its own.
#[test]
fn heartbeat_exchanges_send_lists_only_between_servers_that_differ() {
    let cluster = TestCluster::new(4);
    let node = |server: usize| &cluster.servers[server].node;
    let lists = || cluster.net.delivered("PushMembers").len();
    let (digests_before, lists_before) = (cluster.net.delivered("MemberDigest").len(), lists());
    let mut turn = 0;
    for server in 0..4 {
        for _ in 0..3 {
            crate::exchange_members(node(server), &mut turn, Duration::from_secs(5));
        }
    }
    assert_eq!(cluster.net.delivered("MemberDigest").len() - digests_before, 12);
    assert_eq!(lists(), lists_before, "servers that agree exchange digests only");
    assert_eq!(node(1).membership().list().digest(), node(3).membership().list().digest());
    // Lists that agree still agree on the higher epoch: a client takes a list only if its
    // epoch is higher than its own, and would not hear news from a server whose epoch lags.
    node(0).membership_mut().raise_epoch(100);
    let mut turn = 0;
    for _ in 0..3 {
        crate::exchange_members(node(0), &mut turn, Duration::from_secs(5));
    }
    assert_eq!((0..4).map(|server| node(server).membership().epoch()).collect::<Vec<_>>(), [100; 4]);
    assert_eq!(lists(), lists_before, "without a list");

    // s0 admits a server without telling anyone: its exchange pushes its list to the server
    // it asks; the other servers' exchanges hear of it in the answers of those who know (or
    // from a push, when they asked a server that lacked it).
    let knows = |server: usize| node(server).membership().member("s9").is_some();
    let newcomer = ringfs_proto::Member { name: "s9".into(), ..node(3).membership().member("s3").unwrap().clone() };
    assert!(node(0).membership_mut().admit(newcomer));
    let mut turn = 0;
    crate::exchange_members(node(0), &mut turn, Duration::from_secs(5));
    assert_eq!(lists(), lists_before + 1, "the asker knew more: it pushed its list");
    assert_eq!((1..4).filter(|server| knows(*server)).count(), 1, "the server s0 asked now knows");
    for server in 1..4 {
        let mut turn = 0;
        for _ in 0..3 {
            crate::exchange_members(node(server), &mut turn, Duration::from_secs(5));
        }
    }
    assert!((1..4).all(knows), "the exchanges spread it");
    assert!(lists() <= lists_before + 3, "at most one push to each server that lacked it");
}
