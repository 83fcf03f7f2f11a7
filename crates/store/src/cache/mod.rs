//! Cache mode: the store as a cache of a backend directory (CHFS/Cache).
//!
//! Files under the mount path carry [`EntryFlags::BACKED`]. Their state relative to the
//! backend is kept in the chunks themselves ([`crate::chunk::CacheState`] has the table of
//! states), so that it survives a restart of a `dir` store:
//!
//! - **Loading** ([`load`]). A name missing here is looked up in the backend and stored as an
//!   entry and an inode without bytes ([`EntryFlags::BACKEND_DATA`]); the file's size is
//!   `backend_len`, and its inode knows its backend path. A chunk whose bytes are in the
//!   backend is loaded under its own lock when it is first read or changed, so concurrent
//!   readers of a missing chunk cause one backend read.
//! - **Dirty tracking** ([`queue`]). Every change of a chunk bumps its version and, under the
//!   mount path, sets [`EntryFlags::DIRTY`] and queues the chunk once in a deduplicated work
//!   queue. Changes of a file that must reach the backend before its data — creating it,
//!   cutting it — are recorded as its inode's [`PendingOp`]; removals of names in the cached
//!   tree are recorded as *removals* (hiding the backend entry until they are applied).
//! - **Flushing** ([`flush`]) writes a chunk's bytes to the backend file at `index × chunk
//!   size` and clears `DIRTY` only if the chunk's version did not change meanwhile, so a write
//!   racing a flush is never lost. Before chunk data is written, the inode's server applies
//!   the inode's pending operation and says where the file lives in the backend (`prepare`),
//!   so data never lands in a file that is about to be replaced or cut.
//! - **Eviction** ([`evict`]). When the store is full, clean chunks are dropped (they become
//!   `BACKEND_DATA` again) in the order they became clean; a write goes through to the backend
//!   directly when even that does not make room.
//!
//! This module reaches the store's chunks only through [`Index`] and [`Space`]; nothing
//! below it knows about caching. The server decides when to flush (the flush policy) and
//! connects `prepare` to the entry's server; docs/CONSISTENCY.md states what users may rely on.

mod evict;
mod flush;
mod holds;
mod links;
mod load;
mod moves;
pub use moves::BackendMove;
mod queue;

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ringfs_proto::{CacheStats, ChunkKey, EntryFlags, Errno, FileId};

use crate::backend::BackendDir;
use crate::chunk::{Chunk, ChunkHandle};
use crate::index::Index;
use crate::space::Space;
use crate::{CacheConfig, StoreError};

/// One unit of flushing work.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WorkItem {
    /// A dirty chunk, or an inode with a pending operation.
    Chunk(ChunkKey),
    /// A removal to apply to the backend.
    Removal { path: String },
}

/// What one flush step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushOutcome {
    /// Bytes reached the backend; `clean` is false if the chunk changed meanwhile (the change
    /// queued it again; [`crate::ChunkStore::requeue`] keeps its place in syncs).
    Flushed { bytes: u64, clean: bool },
    /// Nothing to do: clean already, or the file is gone.
    Skipped,
    /// Stopped between two pieces because `keep_going` said so; the chunk stays dirty.
    Interrupted,
    /// A cut of the chunk's file is under way, or its inode's server does not know the file
    /// (the chunk's removal has not arrived). The chunk stays dirty; try again later.
    Deferred,
    /// The backend path is held for a directory rename under way ([`holds`]); try again
    /// after it (this does not count as a deferral).
    Held,
}

/// How a flush treats writers of the chunk it writes.
#[derive(Clone, Copy)]
pub enum FlushPace<'a> {
    /// Steps aside: the chunk's lock is let go between pieces, the flush stops when
    /// `keep_going` says no, and a chunk that changed meanwhile is left dirty (background
    /// flushing).
    Yielding(&'a dyn Fn() -> bool),
    /// Holds the chunk's writers off until the whole chunk is written, so the flush ends with
    /// the chunk clean however busy it is (sync and shutdown, which must end).
    Complete,
}

/// A unit of work taken from the queue, with the queue's sequence number when it was queued
/// (a sync covers the work queued up to its start).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedWork {
    pub item: WorkItem,
    pub since: u64,
    /// Failed attempts so far.
    pub failures: u32,
    /// Attempts deferred so far (see [`FlushOutcome::Deferred`]).
    pub deferrals: u32,
}

/// The inode's server, asked before chunk data of a file is written: it applies the inode's
/// pending operation and answers where the file lives in the backend and which backend file
/// it is (`None`: nowhere — the file lost its last name; its data is not flushed). ESTALE or
/// ENOENT: the file is gone; EAGAIN: not now, the flush waits — a cut of it is under way, or
/// its backend path now holds another file (a rename over this one is under way; the inode
/// soon learns where its file goes). EBUSY: a directory rename holds one of its backend
/// paths (the flush waits for it: `Held`).
pub type Prepare<'a> = &'a dyn Fn(FileId) -> Result<Option<ringfs_proto::BackendPlace>, Errno>;

/// Where a file's bytes are in the backend: its backend path and `backend_len` (asked of the
/// file's inode before a chunk is loaded from there).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendFile {
    pub path: String,
    pub len: u64,
}

/// The flush queue. A chunk is in it at most once (its `queued` flag says so); a removal at
/// most once per recorded removal.
#[derive(Default)]
struct WorkQueue {
    order: VecDeque<QueuedWork>,
    sequence: u64,
}

/// A chunk that became clean, in the order chunks became clean (eviction candidates).
struct CleanChunk {
    handle: ChunkHandle,
}

#[derive(Default)]
struct Counters {
    flushed_chunks: AtomicU64,
    flushed_bytes: AtomicU64,
    loaded_chunks: AtomicU64,
    evicted_chunks: AtomicU64,
    written_through_bytes: AtomicU64,
}

/// The cache-mode state of a store.
pub(crate) struct Cache {
    pub backend: BackendDir,
    pub chunk_size: u32,
    work: Mutex<WorkQueue>,
    clean: Mutex<VecDeque<CleanChunk>>,
    /// The backend changed since a sync last forced it to stable storage.
    changed_since_sync: AtomicBool,
    /// Backend paths held for directory renames under way.
    pub holds: holds::BackendHolds,
    counters: Counters,
}

fn io_errno(error: std::io::Error) -> StoreError {
    StoreError::Fs(Errno::from(error))
}

/// A clean chunk with bytes here can be dropped and loaded again from the backend.
fn evictable(chunk: &Chunk) -> bool {
    !chunk.removed
        && chunk.attr.has(EntryFlags::BACKED)
        && !chunk.attr.has(EntryFlags::DIRTY)
        && !chunk.attr.has(EntryFlags::BACKEND_DATA)
        && !chunk.cache.has_pending_change()
        && chunk.attr.is_regular()
        && chunk.body.stored_len() > 0
}

impl Cache {
    pub fn new(config: &CacheConfig) -> Result<Cache, StoreError> {
        Ok(Cache {
            backend: BackendDir::new(config.backend.clone(), &config.mount_path).map_err(StoreError::Cache)?,
            chunk_size: config.chunk_size.max(1),
            work: Mutex::default(),
            clean: Mutex::default(),
            changed_since_sync: AtomicBool::new(false),
            holds: holds::BackendHolds::default(),
            counters: Counters::default(),
        })
    }

    /// Remembers that the backend changed (data or names).
    pub(crate) fn backend_changed(&self) {
        self.changed_since_sync.store(true, Ordering::Relaxed);
    }

    /// Flags a new chunk of `path` starts with: [`EntryFlags::BACKED`] under the mount path.
    pub fn flags_for(&self, path: &str) -> u32 {
        if self.backend.covers(path) { EntryFlags::BACKED } else { 0 }
    }

    /// Charges `bytes` against the store's capacity, evicting clean chunks to make room;
    /// ENOSPC once nothing more can be dropped.
    pub fn charge(&self, space: &Space, bytes: u64) -> Result<(), Errno> {
        loop {
            match space.charge(bytes) {
                Ok(()) => return Ok(()),
                Err(_) if self.evict(space, space.shortfall(bytes)) > 0 => continue,
                Err(errno) => return Err(errno),
            }
        }
    }

    /// Records a change of a chunk in the cached tree: marks it dirty and queues it.
    pub fn touched(&self, chunk: &mut Chunk) {
        if chunk.attr.has(EntryFlags::BACKED) {
            chunk.attr.flags |= EntryFlags::DIRTY;
            self.queue_chunk(chunk);
        }
    }

    /// Dirty data, pending entry operations and counters; the server adds its flush policy
    /// and flusher state.
    pub fn stats(&self, index: &Index) -> CacheStats {
        let mut stats = CacheStats {
            backend: self.backend.root().display().to_string(),
            mount_path: self.backend.mount_path().to_string(),
            ..CacheStats::default()
        };
        for item in self.queued_work() {
            match item {
                WorkItem::Removal { .. } => stats.pending_entries += 1,
                WorkItem::Chunk(key) => {
                    let Some(handle) = index.chunk(key) else { continue };
                    let chunk = handle.lock();
                    if chunk.removed {
                        continue;
                    }
                    if chunk.cache.has_pending_change() {
                        stats.pending_entries += 1;
                    }
                    if chunk.attr.has(EntryFlags::DIRTY) {
                        stats.dirty_chunks += 1;
                        stats.dirty_bytes += chunk.attr.len;
                    }
                }
            }
        }
        let counters = &self.counters;
        stats.flushed_chunks = counters.flushed_chunks.load(Ordering::Relaxed);
        stats.flushed_bytes = counters.flushed_bytes.load(Ordering::Relaxed);
        stats.loaded_chunks = counters.loaded_chunks.load(Ordering::Relaxed);
        stats.evicted_chunks = counters.evicted_chunks.load(Ordering::Relaxed);
        stats.written_through_bytes = counters.written_through_bytes.load(Ordering::Relaxed);
        stats
    }
}

#[cfg(test)]
mod tests;
