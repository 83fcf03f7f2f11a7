//! Watching for changes made elsewhere, so that the kernel may keep names and attributes
//! long.
//!
//! The kernel caches what the mount answers for as long as the answer says. Without being
//! told otherwise it would show a file another client changed, or a name another client
//! created or removed, until then. So a thread of the mount asks every server, a few times a
//! second, what clients other than this mount changed ([`ringfs_client::Client::changes`]),
//! and tells the kernel to drop its copies of those files and names (`notify_inval_inode`,
//! `notify_inval_entry`); a change elsewhere shows here within about one interval, or within
//! about [`QUIET_INTERVAL`] when it comes from a server that had nothing new for a while. When a
//! server cannot tell (it restarted, or more changed than it keeps), the kernel drops
//! everything the mount gave it.
//!
//! A rename made elsewhere of a file or directory the kernel holds moves its path in the
//! inode table ([`follow_moves`]): the kernel goes on using the inode (a shell whose working
//! directory was renamed on another node creates files in it), and the mount must send
//! those requests to the new name.
//!
//! An answer read from the servers before a change but given to the kernel after the change
//! was dropped would stay cached: so every batch of drops is counted ([`Watch::dropped`]),
//! and an answer is cached for long only if no batch came while it was read
//! ([`Watch::cache_time`]).

use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use ringfs_client::{ChangeWatch, Changes, Client, NameMove};

use crate::inodes::InodeTable;
use crate::kernel::{KernelDrop, KernelDrops};

/// The mount's watch over changes made elsewhere.
#[derive(Default)]
pub struct Watch {
    /// Batches of drops sent to the kernel so far.
    dropped: AtomicU64,
    stop: AtomicBool,
    /// A file changed elsewhere has its name dropped too: with the writeback cache the
    /// kernel keeps a file's size itself for as long as it holds the inode, and takes
    /// another node's size only from a lookup that makes a new one — once no name and no
    /// open file hold the old one.
    drop_names_of_changed_files: bool,
}

impl Watch {
    /// A watch; `writeback_cache`: the mount's kernel keeps files' sizes itself
    /// (`MountOptions::writeback_cache`).
    pub fn new(writeback_cache: bool) -> Watch {
        Watch { drop_names_of_changed_files: writeback_cache, ..Watch::default() }
    }

    /// The count of batches of drops, to take before reading an answer from the servers.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Acquire)
    }

    /// How long the kernel may cache an answer read since `dropped_before` was taken:
    /// `cache_time`, or nothing if something was dropped meanwhile.
    pub fn cache_time(&self, dropped_before: u64, cache_time: Duration) -> Duration {
        if self.dropped() == dropped_before { cache_time } else { Duration::ZERO }
    }

    /// Asks the watching thread to end.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Where the servers' change logs stand now: taken before the mount serves the kernel
/// (which caches nothing before), so that the first look finds only later changes.
pub fn start_position(client: &Client) -> ChangeWatch {
    let mut position = ChangeWatch::default();
    if let Err(errno) = client.changes(&mut position) {
        log::debug!("could not ask the servers what changed: {errno}");
    }
    position
}

/// The longest a server with nothing new goes unasked (it is asked every `interval` again
/// once it has news): an idle job's mounts cost its servers little, and a change elsewhere
/// after a quiet while still shows within about this long.
const QUIET_INTERVAL: Duration = Duration::from_secs(1);

/// How often the watch asks.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// A server with news is asked again after this long.
    pub interval: Duration,
    /// The most questions a second of all servers together (see
    /// [`ChangeWatch::pace`]).
    pub budget: u32,
}

/// Starts the thread that asks the servers every `pace.interval` (servers with nothing new
/// less often, down to [`QUIET_INTERVAL`]; each server less often where there are more than
/// the budget allows) what others changed since `position`.
pub fn spawn(
    watch: Arc<Watch>,
    client: Client,
    mut position: ChangeWatch,
    inodes: Arc<InodeTable>,
    drops: Arc<KernelDrops>,
    pace: Pace,
) -> JoinHandle<()> {
    let interval = pace.interval;
    std::thread::Builder::new()
        .name("ringfs-watch".into())
        .spawn(move || {
            position.pace(interval, QUIET_INTERVAL, pace.budget);
            while !watch.stop.load(Ordering::Acquire) {
                match client.changes(&mut position) {
                    Ok(changes) => {
                        follow_moves(&inodes, &client, &changes.moves);
                        drop_changed(&watch, &inodes, &drops, changes);
                    }
                    // Asked again next time: the servers keep the changes meanwhile.
                    Err(errno) => log::debug!("could not ask the servers what changed: {errno}"),
                }
                std::thread::sleep(interval);
            }
        })
        .expect("a thread can be started")
}

/// Follows renames others made (see the module doc): a held inode at a rename's old name is
/// moved in the table to the new one (with what the table holds below it), if the new name
/// names its file now. (Not otherwise: the old name may have been made again since, here.)
fn follow_moves(inodes: &InodeTable, client: &Client, moves: &[NameMove]) {
    for moved in moves {
        let Some(file) = inodes.inode_at(&moved.from).and_then(|inode| inodes.file(inode).ok()) else { continue };
        match client.lstat(&moved.to) {
            Ok(stat) if stat.file == file => inodes.renamed(&moved.from, &moved.to, moved.exchange),
            Ok(_) => {}
            Err(errno) => log::debug!("could not follow the rename of {} to {}: {errno}", moved.from, moved.to),
        }
    }
}

/// Tells the kernel to drop its copies of what `changes` names (of everything, if they are
/// not complete), and the inode table its own.
fn drop_changed(watch: &Watch, inodes: &InodeTable, drops: &KernelDrops, changes: Changes) {
    let Changes { files, names, complete, .. } = changes;
    if complete && files.is_empty() && names.is_empty() {
        return;
    }
    watch.dropped.fetch_add(1, Ordering::AcqRel);
    let kernel = drops.cache();
    let drop_inode = |inode: u64| {
        inodes.forget_attr(inode);
        if let Ok(false) = kernel.drop_inode(inode, true) {
            // The kernel does not hold the inode: it has forgotten it, or an answer handing
            // it over, read before the change, is on its way (see `inodes`, "Answers the
            // kernel applies late"); then it must drop its attributes once it holds it.
            if let Some(generation) = inodes.mark_attributes_stale(inode) {
                drops.later(KernelDrop::StaleAttributes(inode, generation));
            }
        }
    };
    let drop_name = |path: &str| {
        if let Some(named) = inodes.inode_at(path) {
            // (A directory renamed or removed: what is known of its names no longer holds.)
            inodes.lose_names(named);
        }
        let Some(parent) = ringfs_proto::path::parent(path) else { return };
        let Some(directory) = inodes.inode_at(parent) else { return };
        inodes.forget_attr(directory);
        inodes.lose_names(directory);
        // (`false` from the kernel: it had dropped the name already.)
        let _ = kernel.drop_name(directory, OsStr::new(ringfs_proto::path::file_name(path)));
    };
    if !complete {
        log::debug!("a server could not tell what changed: the kernel drops every name and attribute");
        for (inode, path) in inodes.all() {
            drop_inode(inode);
            drop_name(&path);
            inodes.lose_names(inode);
        }
        for (directory, name) in inodes.take_missing() {
            let _ = kernel.drop_name(directory, OsStr::new(&name));
        }
        return;
    }
    for file in files {
        if inodes.file(file.ino()) == Ok(file) {
            drop_inode(file.ino());
            if watch.drop_names_of_changed_files
                && let Ok(path) = inodes.path(file.ino())
            {
                drop_name(&path);
            }
        }
    }
    for path in &names {
        drop_name(path);
    }
}
