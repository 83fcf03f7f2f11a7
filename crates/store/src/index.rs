//! The index of one store: the names (entries) it holds, the entries of every directory, the
//! directories known to exist, and the chunks of files it holds.
//!
//! Names and files are apart. An entry maps a path to a file id ([`EntryRef`]); the file's
//! chunks — chunk 0, its inode, and the data chunks after it — are keyed by the file id
//! ([`FileChunks`]). A store holds the entries whose paths placement gives it and the chunks
//! whose (file anchor, index) it gives it; for a file that was never renamed, its entry and its
//! inode are on the same store.
//!
//! Locking. Each map is split into shards: names by a hash of the path (`names`), directory
//! listings by a hash of the directory path (`dirs`), chunks by a hash of the file id
//! (`files`). Locks are always taken in the order: dir shard, name shard, file shard, chunk —
//! never the reverse. The index holds no policy: the store's operations decide what to insert
//! and remove, and cache mode keeps its per-name records (removals not yet applied to the
//! backend) here as plain data.

use parking_lot::{Mutex, MutexGuard};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::AtomicU64;

use ringfs_proto::path;
use ringfs_proto::{ChunkIndex, ChunkKey, EntryRef, FileId};

use crate::backend::RemovalKind;
use crate::chunk::ChunkHandle;

const SHARDS: usize = 64;

/// Maps and sets hashed with xxh3: several times faster than the standard library's
/// DoS-resistant hash, and only clients holding the job's secret choose the keys.
pub(crate) type FastMap<K, V> = HashMap<K, V, xxhash_rust::xxh3::Xxh3DefaultBuilder>;
pub(crate) type FastSet<T> = HashSet<T, xxhash_rust::xxh3::Xxh3DefaultBuilder>;

/// A name held here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub target: EntryRef,
    /// A directory being removed: lookups treat it as absent, creates inside it fail.
    pub removing: bool,
}

#[derive(Default)]
pub(crate) struct NameShard {
    pub entries: FastMap<String, Entry>,
    /// Cache mode: entries removed in ringfs whose removal has not reached the backend.
    pub removals: FastMap<String, RemovalKind>,
    /// Cache mode: bumped whenever a removal of this shard reaches the backend, so that a
    /// lookup that read the backend before it does not bring the removed entry back.
    pub backend_removals: u64,
}

#[derive(Default)]
pub(crate) struct DirShard {
    /// Directory path -> names of the entries inside it held here.
    pub children: FastMap<String, BTreeSet<String>>,
    /// Cache mode: directory path -> names of the removals recorded here inside it.
    pub removed: FastMap<String, BTreeSet<String>>,
    /// Directories known to exist (parent checks of creates are answered from here).
    pub known: FastSet<String>,
    /// Bumped whenever a directory of this shard is forgotten, so that a lookup that raced
    /// with an rmdir or a rename cannot record a stale "exists".
    pub invalidations: u64,
}

impl DirShard {
    pub fn add_child(&mut self, path: &str) {
        if let Some(parent) = path::parent(path) {
            self.children.entry(parent.to_string()).or_default().insert(path::file_name(path).to_string());
        }
    }

    /// Removes `path` from its parent's listing.
    pub fn remove_child(&mut self, path: &str) {
        let Some(parent) = path::parent(path) else { return };
        if let Some(children) = self.children.get_mut(parent) {
            children.remove(path::file_name(path));
            if children.is_empty() {
                self.children.remove(parent);
            }
        }
    }
}

/// The chunks of one file held here.
#[derive(Default)]
pub(crate) struct FileChunks {
    /// Chunk 0: the inode.
    pub inode: Option<ChunkHandle>,
    /// Chunks 1.. by index.
    pub tail: BTreeMap<ChunkIndex, ChunkHandle>,
}

impl FileChunks {
    pub fn is_empty(&self) -> bool {
        self.inode.is_none() && self.tail.is_empty()
    }

    pub fn get(&self, index: ChunkIndex) -> Option<ChunkHandle> {
        if index.is_first() { self.inode.clone() } else { self.tail.get(&index).cloned() }
    }

    /// Removes the chunks with index >= `from_index` (>= 1) but those at `keep`.
    pub fn take_tail(&mut self, from_index: ChunkIndex, keep: &[ChunkIndex]) -> Vec<ChunkHandle> {
        let mut taken = self.tail.split_off(&from_index.max(ChunkIndex::FIRST.next()));
        for index in keep {
            if let Some(kept) = taken.remove(index) {
                self.tail.insert(*index, kept);
            }
        }
        taken.into_values().collect()
    }
}

#[derive(Default)]
pub(crate) struct FileShard {
    pub files: FastMap<FileId, FileChunks>,
}

/// The names, directory listings and chunks of one store.
pub(crate) struct Index {
    pub names: Vec<Mutex<NameShard>>,
    pub dirs: Vec<Mutex<DirShard>>,
    pub files: Vec<Mutex<FileShard>>,
    /// Entries held (the root is not counted).
    pub entry_count: AtomicU64,
}

fn shard_of_path(key: &str) -> usize {
    (xxhash_rust::xxh3::xxh3_64(key.as_bytes()) % SHARDS as u64) as usize
}

fn shard_of_file(file: FileId) -> usize {
    let mut hasher = xxhash_rust::xxh3::Xxh3::default();
    file.hash(&mut hasher);
    (hasher.finish() % SHARDS as u64) as usize
}

impl Index {
    pub fn new() -> Index {
        Index {
            names: (0..SHARDS).map(|_| Mutex::default()).collect(),
            dirs: (0..SHARDS).map(|_| Mutex::default()).collect(),
            files: (0..SHARDS).map(|_| Mutex::default()).collect(),
            entry_count: AtomicU64::new(0),
        }
    }

    /// The name shard of `path`, locked.
    pub fn names_of(&self, path: &str) -> MutexGuard<'_, NameShard> {
        self.names[shard_of_path(path)].lock()
    }

    /// The directory shard of directory `dir`, locked.
    pub fn dirs_of(&self, dir: &str) -> MutexGuard<'_, DirShard> {
        self.dirs[shard_of_path(dir)].lock()
    }

    /// The file shard of `file`, locked.
    pub fn files_of(&self, file: FileId) -> MutexGuard<'_, FileShard> {
        self.files[shard_of_file(file)].lock()
    }

    /// The entry of `path`, if held here.
    pub fn entry(&self, path: &str) -> Option<Entry> {
        self.names_of(path).entries.get(path).copied()
    }

    /// A chunk of a file (index 0: its inode), if held here.
    pub fn chunk(&self, key: ChunkKey) -> Option<ChunkHandle> {
        self.files_of(key.file).files.get(&key.file)?.get(key.index)
    }

    /// The inode of `file`, if held here.
    pub fn inode(&self, file: FileId) -> Option<ChunkHandle> {
        self.chunk(ChunkKey::inode(file))
    }

    /// The chunks (index >= 1) of a file held here, with their indices, in order.
    pub fn tail_of(&self, file: FileId) -> Vec<(ChunkIndex, ChunkHandle)> {
        let files = self.files_of(file);
        let Some(chunks) = files.files.get(&file) else { return Vec::new() };
        chunks.tail.iter().map(|(index, handle)| (*index, handle.clone())).collect()
    }

    /// Every chunk of a file held here (the inode first).
    pub fn chunks_of(&self, file: FileId) -> Vec<(ChunkIndex, ChunkHandle)> {
        let files = self.files_of(file);
        let Some(chunks) = files.files.get(&file) else { return Vec::new() };
        chunks
            .inode
            .iter()
            .map(|handle| (ChunkIndex::FIRST, handle.clone()))
            .chain(chunks.tail.iter().map(|(index, handle)| (*index, handle.clone())))
            .collect()
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

    /// Forgets every known directory at or below `dir` (a directory rename moves them).
    pub fn forget_dirs_under(&self, dir: &str) {
        for shard in &self.dirs {
            let mut dirs = shard.lock();
            let before = dirs.known.len();
            dirs.known.retain(|known| known != dir && !path::is_inside(known, dir));
            if dirs.known.len() != before {
                dirs.invalidations += 1;
            }
        }
    }

    /// Every inode held here (a pass over all files).
    pub fn inodes(&self) -> Vec<ChunkHandle> {
        let mut found = Vec::new();
        for shard in &self.files {
            found.extend(shard.lock().files.values().filter_map(|chunks| chunks.inode.clone()));
        }
        found
    }

    /// The directories below (or at) `dir` that have entries held here, with those entries'
    /// names (a pass over the directory listings, not over every entry).
    pub fn listed_dirs_under(&self, dir: &str) -> Vec<(String, Vec<String>)> {
        let mut found = Vec::new();
        for shard in &self.dirs {
            let dirs = shard.lock();
            for (listed, names) in &dirs.children {
                if listed == dir || path::is_inside(listed, dir) {
                    found.push((listed.clone(), names.iter().cloned().collect()));
                }
            }
        }
        found
    }

    /// The removal records (cache mode) held here below `dir`, with their directories' names.
    pub fn removals_under(&self, dir: &str) -> Vec<(String, Vec<String>)> {
        let mut found = Vec::new();
        for shard in &self.dirs {
            let dirs = shard.lock();
            for (listed, names) in &dirs.removed {
                if listed == dir || path::is_inside(listed, dir) {
                    found.push((listed.clone(), names.iter().cloned().collect()));
                }
            }
        }
        found
    }
}
