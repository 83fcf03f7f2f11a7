//! The index of one store: which chunks it holds, the entries of every directory, and the
//! directories known to exist.
//!
//! Locking. The index is split into shards by a hash of the path (`files`) and, for the
//! directory index, by a hash of the directory path (`dirs`). Locks are always taken in the
//! order: dir shard, file shard, chunk — never the reverse. The index holds no policy: the
//! store's operations decide what to insert and remove, and cache mode keeps its per-name
//! records (removals not yet applied to the backend) here as plain data.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard};

use ringfs_proto::ChunkRef;
use ringfs_proto::path;

use crate::backend::RemovalKind;
use crate::chunk::{ChunkHandle, lock};

const SHARDS: usize = 64;

/// Maps and sets keyed by paths hash with xxh3: several times faster than the standard
/// library's DoS-resistant hash, and only clients holding the job's secret choose the keys.
pub(crate) type FastMap<K, V> = HashMap<K, V, xxhash_rust::xxh3::Xxh3DefaultBuilder>;
pub(crate) type FastSet<T> = HashSet<T, xxhash_rust::xxh3::Xxh3DefaultBuilder>;

/// All chunks of one path held by this store.
#[derive(Default)]
pub(crate) struct PathChunks {
    /// Chunk 0: the entry.
    pub head: Option<ChunkHandle>,
    /// Chunks 1.. by index; several files (ids) may briefly share an index during a rename.
    pub tail: BTreeMap<u64, Vec<(u64, ChunkHandle)>>,
}

impl PathChunks {
    pub fn is_empty(&self) -> bool {
        self.head.is_none() && self.tail.is_empty()
    }

    pub fn find_tail(&self, index: u64, file_id: u64) -> Option<ChunkHandle> {
        let candidates = self.tail.get(&index)?;
        candidates.iter().find(|(id, _)| file_id == 0 || *id == file_id).map(|(_, handle)| handle.clone())
    }

    /// Removes the later chunks (index >= `from_index`) of `file_id` (0: of any file).
    pub fn take_tail(&mut self, file_id: u64, from_index: u64) -> Vec<ChunkHandle> {
        let mut taken = Vec::new();
        for candidates in self.tail.range_mut(from_index..).map(|(_, candidates)| candidates) {
            candidates.retain(|(id, handle)| {
                let matches = file_id == 0 || *id == file_id;
                if matches {
                    taken.push(handle.clone());
                }
                !matches
            });
        }
        self.tail.retain(|_, candidates| !candidates.is_empty());
        taken
    }
}

#[derive(Default)]
pub(crate) struct FileShard {
    pub paths: FastMap<String, PathChunks>,
    /// Cache mode: entries removed in ringfs whose removal has not reached the backend.
    pub removals: FastMap<String, RemovalKind>,
    /// Cache mode: bumped whenever a removal of this shard reaches the backend, so that a
    /// lookup that read the backend before it does not bring the removed entry back.
    pub backend_removals: u64,
}

#[derive(Default)]
pub(crate) struct DirShard {
    /// Directory path -> names of the entries inside it whose chunk 0 is held here.
    pub children: FastMap<String, BTreeSet<String>>,
    /// Cache mode: directory path -> names of the removals recorded here inside it.
    pub removed: FastMap<String, BTreeSet<String>>,
    /// Directories known to exist (parent checks of creates are answered from here).
    pub known: FastSet<String>,
    /// Bumped whenever a directory of this shard is forgotten, so that a lookup that raced
    /// with an rmdir cannot record a stale "exists".
    pub invalidations: u64,
}

impl DirShard {
    /// Removes `path` from its parent's listing.
    pub fn remove_child(&mut self, parent: &str, path: &str) {
        if let Some(children) = self.children.get_mut(parent) {
            children.remove(path::file_name(path));
            if children.is_empty() {
                self.children.remove(parent);
            }
        }
    }
}

/// The chunks and directory listings of one store.
pub(crate) struct Index {
    pub files: Vec<Mutex<FileShard>>,
    pub dirs: Vec<Mutex<DirShard>>,
    /// Entries held (chunk 0 of files, directories and links; the root is not counted).
    pub entry_count: AtomicU64,
}

pub(crate) fn shard_of(key: &str) -> usize {
    (xxhash_rust::xxh3::xxh3_64(key.as_bytes()) % SHARDS as u64) as usize
}

impl Index {
    pub fn new() -> Index {
        Index {
            files: (0..SHARDS).map(|_| Mutex::default()).collect(),
            dirs: (0..SHARDS).map(|_| Mutex::default()).collect(),
            entry_count: AtomicU64::new(0),
        }
    }

    /// The file shard of `path`, locked.
    pub fn files_of(&self, path: &str) -> MutexGuard<'_, FileShard> {
        lock(&self.files[shard_of(path)])
    }

    /// The directory shard of directory `dir`, locked.
    pub fn dirs_of(&self, dir: &str) -> MutexGuard<'_, DirShard> {
        lock(&self.dirs[shard_of(dir)])
    }

    /// Chunk 0 of `path`, if held here.
    pub fn head(&self, path: &str) -> Option<ChunkHandle> {
        self.files_of(path).paths.get(path).and_then(|chunks| chunks.head.clone())
    }

    /// A chunk after chunk 0, if held here (`file_id` 0: of any file).
    pub fn find_tail(&self, chunk: &ChunkRef) -> Option<ChunkHandle> {
        self.files_of(&chunk.path).paths.get(&chunk.path)?.find_tail(chunk.index, chunk.file_id)
    }

    /// Whether `dir` is known to exist; otherwise the ticket for [`Index::mark_known_dir`].
    pub fn known_dir(&self, dir: &str) -> Result<(), u64> {
        if dir == "/" {
            return Ok(());
        }
        let dirs = self.dirs_of(dir);
        if dirs.known.contains(dir) { Ok(()) } else { Err(dirs.invalidations) }
    }

    /// Records that `dir` exists, unless a directory of its shard was forgotten since the
    /// ticket was issued (then the lookup may be stale and must be repeated).
    pub fn mark_known_dir(&self, dir: &str, ticket: u64) -> bool {
        let mut dirs = self.dirs_of(dir);
        if dirs.invalidations != ticket {
            return false;
        }
        dirs.known.insert(dir.to_string());
        true
    }

    /// Forgets that `dir` exists; returns whether an entry inside it is held here, and the
    /// names of the removals recorded here inside it.
    pub fn forget_dir(&self, dir: &str) -> (bool, Vec<String>) {
        let mut dirs = self.dirs_of(dir);
        dirs.known.remove(dir);
        dirs.invalidations += 1;
        let any = dirs.children.get(dir).is_some_and(|children| !children.is_empty());
        (any, dirs.removed.get(dir).map(|names| names.iter().cloned().collect()).unwrap_or_default())
    }

    /// Indices of the chunks (index >= 1) of a file held here, in order.
    pub fn tail_indices(&self, path: &str, file_id: u64) -> Vec<u64> {
        let files = self.files_of(path);
        let Some(slot) = files.paths.get(path) else { return Vec::new() };
        slot.tail.iter().filter(|(_, candidates)| candidates.iter().any(|(id, _)| *id == file_id)).map(|(index, _)| *index).collect()
    }

    /// The chunks (index >= 1) of a file held here, with their indices.
    pub fn tail_of(&self, path: &str, file_id: u64) -> Vec<(u64, ChunkHandle)> {
        let files = self.files_of(path);
        let Some(slot) = files.paths.get(path) else { return Vec::new() };
        slot.tail
            .iter()
            .filter_map(|(index, candidates)| {
                candidates.iter().find(|(id, _)| file_id == 0 || *id == file_id).map(|(_, handle)| (*index, handle.clone()))
            })
            .collect()
    }
}
