//! Reclaiming orphan chunks: data chunks (index ≥ 1) whose file has no inode any more.
//!
//! They are left behind when a removal's `RemoveChunks` broadcast missed a server (it was
//! down), when a write to a later chunk raced the file's removal, or by a request that was
//! aborted half-way. Nothing names them, so nothing else would ever free their space.
//!
//! Every `interval` each server lists the files it holds data chunks of but no inode, and
//! asks each file's inode server which of them it has no inode for (`MissingFiles`). A file
//! found missing in two scans in a row has its chunks here removed: an inode is created
//! before any data is written to its file, so a missing inode means the file is gone, and the
//! second scan leaves room for a request in flight. Servers that do not answer are skipped.
//! Cache mode is left out for now (its inodes can be loaded from the backend later).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use ringfs_proto::{ChunkIndex, ChunkKey, FileId, FileList, Request, Response};

use crate::node::Node;

/// The reclaiming state of one server (see the module documentation).
pub struct Reclaimer {
    interval: Duration,
    last_scan: Instant,
    /// Files found without an inode in the last scan.
    suspects: HashSet<FileId>,
}

impl Reclaimer {
    pub fn new(interval: Duration) -> Reclaimer {
        Reclaimer { interval, last_scan: Instant::now(), suspects: HashSet::new() }
    }

    /// Scans if `interval` has passed since the last scan; returns how many orphan chunks
    /// were removed.
    pub fn step(&mut self, node: &Node) -> u64 {
        if self.last_scan.elapsed() < self.interval || node.store.backend().is_some() {
            return 0;
        }
        self.last_scan = Instant::now();
        let mut by_home: HashMap<String, (ringfs_proto::Member, Vec<FileId>)> = HashMap::new();
        for file in node.store.files_without_inode() {
            let home = node.owner_of_chunk(ChunkKey::inode(file));
            by_home.entry(home.name.clone()).or_insert_with(|| (home, Vec::new())).1.push(file);
        }
        let mut missing = HashSet::new();
        for (_, (home, files)) in by_home {
            if !home.alive {
                continue;
            }
            match node.ask(&home, Request::MissingFiles(FileList { files })) {
                Ok(Response::Files(list)) => missing.extend(list.files),
                Ok(_) => log::warn!("server {} answered MissingFiles oddly", home.name),
                Err(errno) => log::debug!("server {} could not say which files it lacks: {errno}", home.name),
            }
        }
        let mut removed = 0;
        for file in missing.iter().filter(|file| self.suspects.contains(file)) {
            removed += node.store.remove_chunks(*file, ChunkIndex::FIRST.next(), None);
        }
        if removed > 0 {
            log::info!("removed {removed} orphan chunks (of files that no longer exist)");
        }
        self.suspects = missing;
        removed
    }
}
