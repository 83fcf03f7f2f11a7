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
//! those requests to the new name — or to where later renames, told in the same look or
//! before it, took that name on.
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
            let mut recent = RecentMoves::default();
            while !watch.stop.load(Ordering::Acquire) {
                match client.changes(&mut position) {
                    Ok(changes) => {
                        recent.add(&changes.moves);
                        follow_moves(&inodes, &client, &changes.moves, &recent);
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

/// How long the watch remembers the renames it was told of, to follow a rename through the
/// ones told before it (servers answer at their own pace, so a later rename of a name may be
/// told first).
const REMEMBER_MOVES_FOR: Duration = Duration::from_secs(5);
/// The most renames it remembers.
const MOST_REMEMBERED_MOVES: usize = 1024;

/// The renames told lately (see [`REMEMBER_MOVES_FOR`]).
#[derive(Default)]
struct RecentMoves {
    moves: std::collections::VecDeque<(std::time::Instant, NameMove)>,
}

impl RecentMoves {
    fn add(&mut self, told: &[NameMove]) {
        let now = std::time::Instant::now();
        while self.moves.front().is_some_and(|(at, _)| now.duration_since(*at) > REMEMBER_MOVES_FOR)
            || self.moves.len() + told.len() > MOST_REMEMBERED_MOVES
        {
            if self.moves.pop_front().is_none() {
                break;
            }
        }
        self.moves.extend(told.iter().take(MOST_REMEMBERED_MOVES).map(|moved| (now, moved.clone())));
    }
}

/// Where a name renamed to `to` may be now: `to`, and where the renames told lately took it
/// on from there (`mv a b; mv b c` within one look: `b` is gone when the watch looks).
fn places_after(to: &str, recent: &RecentMoves) -> Vec<String> {
    const MOST: usize = 16;
    let mut places = vec![to.to_string()];
    let mut next = 0;
    while next < places.len() && places.len() < MOST {
        for (_, later) in &recent.moves {
            if let Some(place) = crate::inodes::moved(&places[next], &later.from, &later.to)
                && !places.contains(&place)
                && places.len() < MOST
            {
                places.push(place);
            }
        }
        next += 1;
    }
    places
}

/// Follows renames others made (see the module doc): a held inode at a rename's old name is
/// moved in the table to the new one (with what the table holds below it), if the new name
/// names its file now — or to where the renames told lately took that name on, if one of
/// those names it. (Not otherwise: the old name may have been made again since, here.)
fn follow_moves(inodes: &InodeTable, client: &Client, moves: &[NameMove], recent: &RecentMoves) {
    for moved in moves {
        let Some(file) = inodes.inode_at(&moved.from).and_then(|inode| inodes.file(inode).ok()) else { continue };
        // (An exchange put the other file at the old name: its new name only.)
        let places = if moved.exchange { vec![moved.to.clone()] } else { places_after(&moved.to, recent) };
        for place in &places {
            match client.lstat(place) {
                Ok(stat) if stat.file == file => {
                    inodes.renamed(&moved.from, place, moved.exchange);
                    break;
                }
                Ok(_) => {}
                Err(errno) => log::debug!("could not follow the rename of {} to {place}: {errno}", moved.from),
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn moved(from: &str, to: &str) -> NameMove {
        NameMove { from: from.into(), to: to.into(), exchange: false }
    }

    #[test]
    fn a_rename_is_followed_on_through_the_renames_told_with_it_or_before_it() {
        let mut recent = RecentMoves::default();
        // `mv /run /moved; mv /moved /done`, the second told first.
        recent.add(&[moved("/moved", "/done")]);
        recent.add(&[moved("/run", "/moved")]);
        assert_eq!(places_after("/moved", &recent), vec!["/moved".to_string(), "/done".to_string()]);
        assert_eq!(places_after("/moved/out", &recent), vec!["/moved/out".to_string(), "/done/out".to_string()], "below it too");
        assert_eq!(places_after("/other", &recent), vec!["/other".to_string()]);
        // A cycle of renames ends.
        recent.add(&[moved("/done", "/moved")]);
        assert_eq!(places_after("/moved", &recent).len(), 2);
    }

    #[test]
    fn the_renames_remembered_are_bounded() {
        let mut recent = RecentMoves::default();
        let many: Vec<NameMove> = (0..3000).map(|index| moved(&format!("/a{index}"), &format!("/b{index}"))).collect();
        recent.add(&many);
        recent.add(&many[..10]);
        assert!(recent.moves.len() <= MOST_REMEMBERED_MOVES);
    }
}
