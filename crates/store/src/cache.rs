//! Cache mode: the store as a cache of a backend directory (CHFS/Cache).
//!
//! Entries under the mount path carry [`EntryFlags::BACKED`]. Their state relative to the
//! backend is kept in the chunks themselves, so that it survives a restart of a `dir` store:
//!
//! - **Loading.** An entry missing here is looked up in the backend ([`ChunkStore::materialize`])
//!   and stored with its attributes but without its bytes ([`EntryFlags::BACKEND_DATA`]); the
//!   file's size is `backend_len`. A chunk whose bytes are in the backend is loaded under its
//!   own lock when it is first read or changed, so concurrent readers of a missing chunk cause
//!   one backend read.
//! - **Dirty tracking.** Every change of a chunk bumps its version and, under the mount path,
//!   sets [`EntryFlags::DIRTY`] and queues the chunk once in a deduplicated work queue.
//!   Changes of an entry that must reach the backend before its data — creating it, cutting
//!   it — are recorded as its [`PendingOp`]; removals of entries that exist in the backend are
//!   recorded as *removals* (hiding the backend entry until they are applied).
//! - **Flushing** ([`ChunkStore::flush`]) writes a chunk's bytes to the backend file at
//!   `index × chunk size` and clears `DIRTY` only if the chunk's version did not change
//!   meanwhile, so a write racing a flush is never lost. Before chunk data is written, the
//!   entry's pending operation is applied by the entry's server (`prepare`), so data never
//!   lands in a file that is about to be replaced or cut.
//! - **Eviction.** When the store is full, clean chunks are dropped (they become
//!   `BACKEND_DATA` again) in the order they became clean; [`ChunkStore::write_through`]
//!   writes to the backend directly when even that does not make room.
//!
//! The server decides when to flush (the flush policy) and connects `prepare` to the entry's
//! server; docs/CONSISTENCY.md states what users may rely on.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, TryLockError};

use ringfs_proto::path;
use ringfs_proto::{Attr, CacheStats, ChunkRef, ChunkTemplate, DirPage, EntryFlags, Errno, FileKind};

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::backend::{self, BackendDir, RemovalKind};
use crate::body::Body;
use crate::store::{Chunk, ChunkHandle, ChunkStore, DirShard, FileShard, lock, shard_of};
use crate::{ByteSink, ByteSource, CacheConfig, StoreError};

/// A change of an entry that must reach the backend before the entry's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PendingOp {
    /// The entry was created in ringfs: make it in the backend, replacing what is there.
    Create,
    /// The file was cut: cut the backend file to this length.
    Trim(u64),
}

impl PendingOp {
    /// The pending operation after the file is also cut to `len`.
    pub fn after_trim(current: Option<PendingOp>, len: u64) -> Option<PendingOp> {
        match current {
            Some(PendingOp::Create) => Some(PendingOp::Create),
            Some(PendingOp::Trim(earlier)) => Some(PendingOp::Trim(earlier.min(len))),
            None => Some(PendingOp::Trim(len)),
        }
    }
}

/// Backend reads a lookup makes before giving up (EAGAIN) when removals keep reaching the
/// backend in its shard meanwhile.
const MATERIALIZE_ATTEMPTS: usize = 100;

/// One unit of flushing work.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WorkItem {
    /// A dirty chunk, or chunk 0 of an entry with a pending operation.
    Chunk { path: String, index: u64, file_id: u64 },
    /// A removal to apply to the backend.
    Removal { path: String },
}

/// What one flush step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushOutcome {
    /// Bytes reached the backend; `clean` is false if the chunk changed meanwhile (the change
    /// queued it again; [`ChunkStore::requeue`] keeps its place in syncs).
    Flushed { bytes: u64, clean: bool },
    /// Nothing to do: clean already, or the entry is gone.
    Skipped,
    /// Stopped between two pieces because `keep_going` said so; the chunk stays dirty.
    Interrupted,
    /// The chunk's file has no entry at its server (yet): a rename is installing it, or the
    /// file is gone and this chunk's removal has not arrived; or a cut of the file is under
    /// way. The chunk stays dirty; try again later.
    Deferred,
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

/// The flush queue. A chunk is in it at most once (its `queued` flag says so); a removal at
/// most once per recorded removal.
#[derive(Default)]
struct WorkQueue {
    order: VecDeque<QueuedWork>,
    sequence: u64,
}

/// A chunk that became clean, in the order chunks became clean (eviction candidates).
struct CleanChunk {
    path: String,
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
    counters: Counters,
}

/// The entry's server, asked to apply the entry's pending operation before chunk data of
/// `(path, file_id)` is written. ESTALE or ENOENT: the file is gone.
pub type Prepare<'a> = &'a dyn Fn(&str, u64) -> Result<(), Errno>;

impl Cache {
    pub fn new(config: &CacheConfig) -> Result<Cache, StoreError> {
        Ok(Cache {
            backend: BackendDir::new(config.backend.clone(), &config.mount_path).map_err(StoreError::Cache)?,
            chunk_size: config.chunk_size.max(1),
            work: Mutex::default(),
            clean: Mutex::default(),
            changed_since_sync: AtomicBool::new(false),
            counters: Counters::default(),
        })
    }

    /// Remembers that the backend changed (data or names).
    fn backend_changed(&self) {
        self.changed_since_sync.store(true, Ordering::Relaxed);
    }

    /// Appends new work (the caller makes sure it is not queued already).
    fn push(&self, item: WorkItem) {
        let mut work = lock(&self.work);
        work.sequence += 1;
        let since = work.sequence;
        work.order.push_back(QueuedWork { item, since, failures: 0, deferrals: 0 });
    }
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
        && chunk.pending.is_none()
        && chunk.attr.is_regular()
        && chunk.body.stored_len() > 0
}

impl ChunkStore {
    pub(crate) fn cache(&self) -> Option<&Cache> {
        self.cache.as_ref()
    }

    /// The backend this store caches, if it is in cache mode.
    pub fn backend(&self) -> Option<&BackendDir> {
        self.cache.as_ref().map(|cache| &cache.backend)
    }

    /// Flags a new chunk of `path` starts with: [`EntryFlags::BACKED`] under the mount path.
    pub(crate) fn cache_flags_for(&self, path: &str) -> u32 {
        match &self.cache {
            Some(cache) if cache.backend.covers(path) => EntryFlags::BACKED,
            _ => 0,
        }
    }

    /// Records a change of a chunk: bumps its version and, in the cached tree, marks it dirty
    /// and queues it for flushing.
    pub(crate) fn touched(&self, path: &str, index: u64, chunk: &mut Chunk) {
        chunk.version += 1;
        if self.cache.is_some() && chunk.attr.has(EntryFlags::BACKED) {
            chunk.attr.flags |= EntryFlags::DIRTY;
            self.queue_chunk(path, index, chunk);
        }
    }

    /// Queues a chunk (held locked by the caller) for flushing, unless it is queued already.
    /// A dirty chunk is always queued or being flushed: the flusher clears the mark when it
    /// takes the chunk's bytes, and queues the chunk again if it changed meanwhile.
    pub(crate) fn queue_chunk(&self, path: &str, index: u64, chunk: &mut Chunk) {
        if let Some(cache) = &self.cache
            && !chunk.queued
        {
            chunk.queued = true;
            cache.push(WorkItem::Chunk { path: path.to_string(), index, file_id: chunk.attr.file_id });
        }
    }

    /// Remembers a chunk that became clean as a candidate for eviction.
    pub(crate) fn note_clean(&self, path: &str, handle: &ChunkHandle, chunk: &mut Chunk) {
        let Some(cache) = &self.cache else { return };
        if chunk.listed_clean || !evictable(chunk) {
            return;
        }
        chunk.listed_clean = true;
        let mut clean = lock(&cache.clean);
        clean.push_back(CleanChunk { path: path.to_string(), handle: handle.clone() });
        // Entries of chunks removed since are skipped when popped; do not let them pile up.
        let limit = 2 * self.chunk_count() as usize + 1024;
        if clean.len() > limit {
            clean.retain(|candidate| candidate.handle.try_lock().map(|chunk| !chunk.removed).unwrap_or(true));
        }
    }

    // ----- loading --------------------------------------------------------------------------

    /// Looks `path` up in the backend and, if it is there (and was not removed in ringfs),
    /// stores it as a cached entry whose bytes stay in the backend. `None`: no such entry.
    pub(crate) fn materialize(&self, path: &str) -> Result<Option<ChunkHandle>, StoreError> {
        let Some(cache) = &self.cache else { return Ok(None) };
        if !cache.backend.covers(path) {
            return Ok(None);
        }
        // The backend is read without locks; if a removal of this shard reached the backend
        // meanwhile, what was read may be an entry removed since: read again.
        for _ in 0..MATERIALIZE_ATTEMPTS {
            let seen_removals = {
                let files = lock(&self.files[shard_of(path)]);
                if files.removals.contains_key(path) {
                    return Ok(None);
                }
                files.backend_removals
            };
            let Some(attr) = cache.backend.entry_attr(path, cache.chunk_size).map_err(io_errno)? else { return Ok(None) };
            let link_target = if attr.is_symlink() { Some(cache.backend.read_link(path).map_err(io_errno)?) } else { None };
            let parent = path::parent(path).unwrap_or("/");
            let mut dirs = lock(&self.dirs[shard_of(parent)]);
            let mut files = lock(&self.files[shard_of(path)]);
            if let Some(existing) = files.paths.get(path).and_then(|chunks| chunks.head.clone()) {
                return Ok(Some(existing));
            }
            if files.removals.contains_key(path) {
                return Ok(None);
            }
            if files.backend_removals != seen_removals {
                continue;
            }
            return self.insert_loaded_entry(&mut dirs, &mut files, path, attr, link_target).map(Some);
        }
        Err(Errno::EAGAIN.into())
    }

    /// Makes the entry read from the backend known here (`materialize`, with the shard
    /// locks held).
    fn insert_loaded_entry(
        &self,
        dirs: &mut DirShard,
        files: &mut FileShard,
        path: &str,
        attr: Attr,
        link_target: Option<String>,
    ) -> Result<ChunkHandle, StoreError> {
        let parent = path::parent(path).unwrap_or("/");
        let handle = self.new_chunk(path, 0, attr)?;
        if let Some(target) = link_target {
            let mut chunk = lock(&handle);
            chunk.attr.flags &= !EntryFlags::BACKEND_DATA;
            let stored = self.fill(&mut chunk, 0, &mut target.as_bytes()).and_then(|()| self.persist(&chunk));
            drop(chunk);
            if let Err(error) = stored {
                self.discard(path, &handle);
                return Err(error);
            }
        }
        files.paths.entry(path.to_string()).or_default().head = Some(handle.clone());
        if path != "/" {
            dirs.children.entry(parent.to_string()).or_default().insert(path::file_name(path).to_string());
            self.entry_count.fetch_add(1, Ordering::Relaxed);
        }
        Ok(handle)
    }

    /// Whether a missing chunk of a file may be backend data: its start lies below the
    /// file's `backend_len` (as the caller, who has checked it, gives it).
    pub(crate) fn backend_holds(&self, chunk: &ChunkRef, backend_len: u64, chunk_size: u32) -> bool {
        self.cache.is_some() && chunk.index > 0 && chunk.index.saturating_mul(chunk_size as u64) < backend_len
    }

    /// The attributes of a chunk whose bytes are still in the backend.
    pub(crate) fn stub_len(chunk: &ChunkRef, backend_len: u64, chunk_size: u32) -> u64 {
        backend_len.saturating_sub(chunk.index * chunk_size as u64).min(chunk_size as u64)
    }

    /// Loads a chunk's bytes from the backend into the store (under the chunk's lock, which
    /// the caller holds). ENOSPC if even eviction makes no room.
    pub(crate) fn ensure_loaded(&self, path: &str, index: u64, handle: &ChunkHandle, chunk: &mut Chunk) -> Result<(), StoreError> {
        if !chunk.attr.has(EntryFlags::BACKEND_DATA) {
            return Ok(());
        }
        let cache = self.cache.as_ref().ok_or(Errno::EIO)?;
        let mut bytes = vec![0u8; chunk.attr.len as usize];
        cache.backend.read_at(path, index * chunk.attr.chunk_size as u64, &mut bytes).map_err(io_errno)?;
        // The chunk has no bytes here: the fill charges its whole length.
        self.fill(chunk, 0, &mut &bytes[..])?;
        chunk.attr.flags &= !EntryFlags::BACKEND_DATA;
        self.persist(chunk)?;
        cache.counters.loaded_chunks.fetch_add(1, Ordering::Relaxed);
        self.note_clean(path, handle, chunk);
        Ok(())
    }

    /// Serves a read of a chunk whose bytes are in the backend straight from the backend
    /// (when the store has no room to load it).
    pub(crate) fn read_from_backend(
        &self,
        path: &str,
        index: u64,
        chunk: &Chunk,
        offset: u64,
        end: u64,
        sink: &mut dyn ByteSink,
    ) -> Result<(), StoreError> {
        let cache = self.cache.as_ref().ok_or(Errno::EIO)?;
        let mut bytes = vec![0u8; (end - offset) as usize];
        cache.backend.read_at(path, index * chunk.attr.chunk_size as u64 + offset, &mut bytes).map_err(io_errno)?;
        cache.counters.loaded_chunks.fetch_add(1, Ordering::Relaxed);
        sink.write_from(&bytes)?;
        Ok(())
    }

    /// Loads one chunk from the backend (stage-in). Returns the bytes loaded (0 if the chunk
    /// was here already or holds no backend data).
    pub fn load_chunk(&self, chunk_ref: &ChunkRef, backend_len: u64) -> Result<u64, StoreError> {
        let handle = if chunk_ref.index == 0 {
            self.head_checked(&chunk_ref.path, chunk_ref.file_id)?
        } else {
            let chunk_size = self.cache.as_ref().map_or(1, |cache| cache.chunk_size);
            match self.tail_for_read(chunk_ref, backend_len, chunk_size)? {
                Some(handle) => handle,
                None => return Ok(0),
            }
        };
        let mut chunk = lock(&handle);
        if chunk.removed || !chunk.attr.has(EntryFlags::BACKEND_DATA) {
            return Ok(0);
        }
        self.ensure_loaded(&chunk_ref.path, chunk_ref.index, &handle, &mut chunk)?;
        Ok(chunk.attr.len)
    }

    /// One page of the backend directory behind `dir`, in name order, after `after`.
    pub fn backend_page(&self, dir: &str, after: Option<&str>, limit: usize) -> Result<DirPage, StoreError> {
        let Some(cache) = &self.cache else { return Ok(DirPage::default()) };
        if !cache.backend.covers(dir) {
            return Ok(DirPage::default());
        }
        let listing = cache.backend.list(dir, cache.chunk_size).map_err(io_errno)?;
        let start = after.map_or(0, |after| listing.partition_point(|(name, _)| name.as_str() <= after));
        let end = (start + limit.max(1)).min(listing.len());
        let entries = listing[start..end].iter().map(|(name, attr)| ringfs_proto::DirEntry { name: name.clone(), attr: *attr }).collect();
        Ok(DirPage { entries, more: end < listing.len(), removed: Vec::new() })
    }

    /// Every name in the backend directory behind `dir`, including entries ringfs does not
    /// show (rmdir's emptiness check: such entries keep a directory from being removed).
    pub fn backend_names(&self, dir: &str) -> Result<Vec<String>, StoreError> {
        let Some(cache) = &self.cache else { return Ok(Vec::new()) };
        if !cache.backend.covers(dir) {
            return Ok(Vec::new());
        }
        cache.backend.all_names(dir).map_err(io_errno)
    }

    // ----- removals -------------------------------------------------------------------------

    /// Records that the entry at `path` (which exists in the backend) was removed. Called with
    /// the locks of the parent's directory shard and the path's file shard held.
    pub(crate) fn record_removal(
        &self,
        dirs: &mut DirShard,
        files: &mut FileShard,
        path: &str,
        kind: RemovalKind,
    ) -> Result<(), StoreError> {
        let Some(cache) = &self.cache else { return Ok(()) };
        let parent = path::parent(path).unwrap_or("/");
        if let Some(directory) = &self.directory {
            directory.record_removal(path, kind).map_err(StoreError::Directory)?;
        }
        if files.removals.insert(path.to_string(), kind).is_none() {
            cache.push(WorkItem::Removal { path: path.to_string() });
        }
        dirs.removed.entry(parent.to_string()).or_default().insert(path::file_name(path).to_string());
        Ok(())
    }

    /// Forgets the removal recorded for `path` (applied, or replaced by a new entry there).
    /// Called with the same locks as [`ChunkStore::record_removal`].
    pub(crate) fn forget_removal(&self, dirs: &mut DirShard, files: &mut FileShard, path: &str) {
        if files.removals.remove(path).is_none() {
            return;
        }
        let parent = path::parent(path).unwrap_or("/");
        if let Some(names) = dirs.removed.get_mut(parent) {
            names.remove(path::file_name(path));
            if names.is_empty() {
                dirs.removed.remove(parent);
            }
        }
        if let Some(directory) = &self.directory
            && let Err(error) = directory.forget_removal(path)
        {
            log::warn!("cannot forget the removal record of {path}: {error}");
        }
    }

    /// Applies a removal to the backend now (a directory is re-created over a removed one,
    /// whose old contents must go first).
    pub(crate) fn apply_removal_now(&self, path: &str) -> Result<(), StoreError> {
        let cache = self.cache.as_ref().ok_or(Errno::EIO)?;
        cache.backend.remove(path).map_err(io_errno)
    }

    fn apply_removal(&self, path: &str) -> Result<FlushOutcome, StoreError> {
        let cache = self.cache.as_ref().ok_or(Errno::EIO)?;
        let parent = path::parent(path).unwrap_or("/");
        // Hold both locks while the backend changes: a new entry at this path waits, and
        // cannot be overtaken by the removal of its predecessor.
        let mut dirs = lock(&self.dirs[shard_of(parent)]);
        let mut files = lock(&self.files[shard_of(path)]);
        if !files.removals.contains_key(path) {
            return Ok(FlushOutcome::Skipped);
        }
        cache.backend.remove(path).map_err(io_errno)?;
        files.backend_removals += 1;
        cache.backend_changed();
        self.forget_removal(&mut dirs, &mut files, path);
        Ok(FlushOutcome::Flushed { bytes: 0, clean: true })
    }

    // ----- flushing -------------------------------------------------------------------------

    /// Takes the next unit of flushing work queued at or before `up_to` (`u64::MAX`: any).
    pub fn next_work(&self, up_to: u64) -> Option<QueuedWork> {
        let cache = self.cache.as_ref()?;
        let mut work = lock(&cache.work);
        let position = work.order.iter().position(|queued| queued.since <= up_to)?;
        work.order.remove(position)
    }

    /// Puts work back (a flush that was interrupted, failed or overtaken by a change), keeping
    /// its place in syncs.
    pub fn requeue(&self, queued: QueuedWork) {
        let Some(cache) = &self.cache else { return };
        match &queued.item {
            WorkItem::Removal { path } => {
                if !lock(&self.files[shard_of(path)]).removals.contains_key(path) {
                    return;
                }
            }
            WorkItem::Chunk { path, index, file_id } => {
                let reference = ChunkRef { path: path.clone(), index: *index, file_id: *file_id };
                let handle = if *index == 0 { self.head(path) } else { self.find_tail(&reference) };
                let Some(handle) = handle else { return };
                let mut chunk = lock(&handle);
                if chunk.removed || chunk.attr.file_id != *file_id {
                    return;
                }
                if chunk.queued {
                    // Changed meanwhile and queued again: it keeps the earlier place, which a
                    // running sync waits for.
                    let mut work = lock(&cache.work);
                    if let Some(entry) = work.order.iter_mut().find(|entry| entry.item == queued.item) {
                        entry.since = entry.since.min(queued.since);
                        entry.failures = entry.failures.max(queued.failures);
                        entry.deferrals = entry.deferrals.max(queued.deferrals);
                    }
                    return;
                }
                chunk.queued = true;
            }
        }
        lock(&cache.work).order.push_back(queued);
    }

    /// The sequence number of the latest queued work: a sync started now covers the work
    /// queued up to it.
    pub fn work_sequence(&self) -> u64 {
        self.cache.as_ref().map_or(0, |cache| lock(&cache.work).sequence)
    }

    /// How much work queued at or before `up_to` is left.
    pub fn work_left(&self, up_to: u64) -> u64 {
        self.cache.as_ref().map_or(0, |cache| lock(&cache.work).order.iter().filter(|queued| queued.since <= up_to).count() as u64)
    }

    /// Everything queued now.
    pub fn queued_work(&self) -> Vec<WorkItem> {
        self.cache.as_ref().map(|cache| lock(&cache.work).order.iter().map(|queued| queued.item.clone()).collect()).unwrap_or_default()
    }

    pub fn has_work(&self) -> bool {
        self.cache.as_ref().is_some_and(|cache| !lock(&cache.work).order.is_empty())
    }

    /// Forces the backend changes made so far to stable storage (`syncfs` of the backend's
    /// file system, if anything changed since the last time): the end of a sync.
    pub fn make_backend_durable(&self) -> Result<(), StoreError> {
        let Some(cache) = &self.cache else { return Ok(()) };
        if !cache.changed_since_sync.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        cache.backend.sync_all().map_err(|error| {
            cache.backend_changed();
            io_errno(error)
        })
    }

    /// Applies the pending operation of the entry `(path, file_id)` to the backend (asked by a
    /// server about to flush a chunk of the file); ESTALE if the entry is gone or is another
    /// file now.
    pub fn prepare_entry(&self, path: &str, file_id: u64) -> Result<(), StoreError> {
        let handle = self.head(path).ok_or(Errno::ESTALE)?;
        let mut chunk = lock(&handle);
        if chunk.removed || (file_id != 0 && chunk.attr.file_id != file_id) {
            return Err(Errno::ESTALE.into());
        }
        if chunk.cutting {
            return Err(Errno::EAGAIN.into());
        }
        self.apply_pending(path, &mut chunk)
    }

    /// A regular file in the cached tree was cut to `len` and its chunks past the cut are gone
    /// from every server: the backend file is cut when the entry is next flushed. (Recording
    /// the cut only now means no flush of a removed chunk can land after the cut.)
    pub fn cut_backend_file(&self, path: &str, file_id: u64, len: u64) -> Result<(), StoreError> {
        let handle = self.head_checked(path, file_id)?;
        let mut chunk = lock(&handle);
        chunk.cutting = false;
        if !chunk.attr.has(EntryFlags::BACKED) || !chunk.attr.is_regular() {
            return Ok(());
        }
        chunk.pending = PendingOp::after_trim(chunk.pending, len);
        self.persist(&chunk)?;
        self.queue_chunk(path, 0, &mut chunk);
        Ok(())
    }

    fn apply_pending(&self, path: &str, chunk: &mut Chunk) -> Result<(), StoreError> {
        let Some(op) = chunk.pending else { return Ok(()) };
        let cache = self.cache.as_ref().ok_or(Errno::EIO)?;
        let backend = &cache.backend;
        let applied = match (op, chunk.attr.kind()) {
            (PendingOp::Create, Some(FileKind::Regular)) => backend.create_file(path, chunk.attr.mode),
            (PendingOp::Create, Some(FileKind::Directory)) => backend.make_dir(path, chunk.attr.mode),
            (PendingOp::Create, Some(FileKind::Symlink)) => {
                let target = String::from_utf8_lossy(&chunk.body.to_vec()?).into_owned();
                backend.make_symlink(path, &target)
            }
            (PendingOp::Create, None) => Ok(()),
            (PendingOp::Trim(len), _) => backend.trim(path, len),
        };
        applied.map_err(io_errno)?;
        cache.backend_changed();
        chunk.pending = None;
        chunk.attr.flags |= EntryFlags::IN_BACKEND;
        self.persist(chunk)
    }

    /// Does one unit of flushing work. `prepare` reaches the entry's server (see [`Prepare`]);
    /// `pace` says whether the flush steps aside for writers. An error leaves the work to be
    /// retried by the caller.
    pub fn flush(&self, item: &WorkItem, prepare: Prepare<'_>, pace: FlushPace<'_>) -> Result<FlushOutcome, StoreError> {
        match item {
            WorkItem::Removal { path } => self.apply_removal(path),
            WorkItem::Chunk { path, index, file_id } => self.flush_chunk(path, *index, *file_id, prepare, pace),
        }
    }

    fn flush_chunk(
        &self,
        path: &str,
        index: u64,
        file_id: u64,
        prepare: Prepare<'_>,
        pace: FlushPace<'_>,
    ) -> Result<FlushOutcome, StoreError> {
        let cache = self.cache.as_ref().ok_or(Errno::EIO)?;
        let reference = ChunkRef { path: path.to_string(), index, file_id };
        let handle = if index == 0 { self.head(path) } else { self.find_tail(&reference) };
        let Some(handle) = handle else { return Ok(FlushOutcome::Skipped) };
        let (kind_is_regular, mode) = {
            let mut chunk = lock(&handle);
            if chunk.removed || chunk.attr.file_id != file_id {
                return Ok(FlushOutcome::Skipped);
            }
            // From here on a change queues the chunk again.
            chunk.queued = false;
            if !chunk.attr.has(EntryFlags::DIRTY) && chunk.pending.is_none() {
                return Ok(FlushOutcome::Skipped);
            }
            (chunk.attr.is_regular(), chunk.attr.mode)
        };
        let local_prepare = |path: &str, file_id: u64| self.prepare_entry(path, file_id).map_err(|error| error.errno());
        let prepare: Prepare<'_> = if index == 0 { &local_prepare } else { prepare };
        // The entry's pending creation or cut reaches the backend before any of its data.
        // (Never without it: a creation applied later would replace the file, data and all.)
        match prepare(path, file_id) {
            Ok(()) => {}
            Err(Errno::ESTALE) | Err(Errno::ENOENT) => return Ok(Self::entry_missing(&handle, file_id)),
            // A cut of the file is under way.
            Err(Errno::EAGAIN) => return Ok(FlushOutcome::Deferred),
            Err(errno) => return Err(errno.into()),
        }
        let file = match kind_is_regular {
            true => match self.open_flushed_file(path, file_id, mode, prepare)? {
                Some(file) => Some(file),
                None => return Ok(Self::entry_missing(&handle, file_id)),
            },
            false => None,
        };
        // Every backend write happens under the chunk's lock, and only while the chunk is
        // unchanged since its bytes were taken: bytes of a chunk that was cut or removed
        // meanwhile never land after the cut reached the backend (cuts are applied only once
        // the chunks past them are gone).
        let mut chunk = lock(&handle);
        if chunk.removed || chunk.attr.file_id != file_id {
            return Ok(FlushOutcome::Skipped);
        }
        let (version, attr) = (chunk.version, chunk.attr);
        let mut written = 0;
        let has_data = attr.is_regular() && attr.has(EntryFlags::DIRTY) && !attr.has(EntryFlags::BACKEND_DATA);
        if let (Some(file), true) = (&file, has_data) {
            let bytes = chunk.body.snapshot()?;
            let offset = index * attr.chunk_size as u64;
            let stored = &bytes[..bytes.len().min(attr.len as usize)];
            for (number, piece) in stored.chunks(backend::FLUSH_PIECE_BYTES).enumerate() {
                if let (FlushPace::Yielding(keep_going), true) = (pace, number > 0) {
                    // Let writers in between pieces.
                    drop(chunk);
                    if !keep_going() {
                        return Ok(FlushOutcome::Interrupted);
                    }
                    chunk = lock(&handle);
                    if chunk.removed || chunk.version != version {
                        return Ok(FlushOutcome::Flushed { bytes: written, clean: false });
                    }
                }
                file.write_all_at(piece, offset + (number * backend::FLUSH_PIECE_BYTES) as u64).map_err(io_errno)?;
                written += piece.len() as u64;
            }
            backend::extend_to(file, offset + attr.len).map_err(io_errno)?;
            cache.backend_changed();
        }
        if attr.has(EntryFlags::DIRTY) && (attr.is_dir() || (attr.is_regular() && index == 0)) {
            cache.backend.set_mode(path, attr.mode).map_err(io_errno)?;
        }
        // Still under the lock taken (or retaken) after the chunk's last check: unchanged.
        chunk.attr.flags &= !EntryFlags::DIRTY;
        if index == 0 {
            chunk.attr.flags |= EntryFlags::IN_BACKEND;
        }
        self.persist(&chunk)?;
        self.note_clean(path, &handle, &mut chunk);
        cache.counters.flushed_chunks.fetch_add(1, Ordering::Relaxed);
        cache.counters.flushed_bytes.fetch_add(written, Ordering::Relaxed);
        Ok(FlushOutcome::Flushed { bytes: written, clean: true })
    }

    /// What a flush does when the entry of its chunk's file is missing at the entry's server:
    /// nothing if the chunk is gone too, otherwise it waits for the entry (see
    /// [`FlushOutcome::Deferred`]).
    fn entry_missing(handle: &ChunkHandle, file_id: u64) -> FlushOutcome {
        let chunk = lock(handle);
        match chunk.removed || chunk.attr.file_id != file_id {
            true => FlushOutcome::Skipped,
            false => FlushOutcome::Deferred,
        }
    }

    /// Opens the backend file of the entry `(path, file_id)` for writing its data. A missing
    /// file was either removed with its entry (then `None`) or deleted behind ringfs's back
    /// (then it is created again, since the entry still exists).
    fn open_flushed_file(&self, path: &str, file_id: u64, mode: u32, prepare: Prepare<'_>) -> Result<Option<File>, StoreError> {
        let backend = &self.cache.as_ref().ok_or(Errno::EIO)?.backend;
        match backend.open_existing(path) {
            Ok(file) => return Ok(Some(file)),
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(io_errno(error)),
            Err(_) => {}
        }
        match prepare(path, file_id) {
            Err(Errno::ESTALE) | Err(Errno::ENOENT) | Err(Errno::EAGAIN) => Ok(None),
            Err(errno) => Err(errno.into()),
            Ok(()) => backend.open_for_flush(path, mode).map(Some).map_err(io_errno),
        }
    }

    // ----- a full store ---------------------------------------------------------------------

    /// Drops clean chunks, oldest first, until `needed` bytes are free or none is left;
    /// returns the bytes freed. Chunks that are busy are skipped (no lock is waited for).
    pub(crate) fn evict(&self, needed: u64) -> u64 {
        let Some(cache) = &self.cache else { return 0 };
        let mut freed = 0;
        let mut budget = lock(&cache.clean).len();
        while freed < needed && budget > 0 {
            budget -= 1;
            let Some(candidate) = lock(&cache.clean).pop_front() else { break };
            let handle = candidate.handle.clone();
            let mut chunk = match handle.try_lock() {
                Ok(chunk) => chunk,
                Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
                Err(TryLockError::WouldBlock) => {
                    lock(&cache.clean).push_back(candidate);
                    continue;
                }
            };
            chunk.listed_clean = false;
            if !evictable(&chunk) {
                continue;
            }
            // Recorded before the bytes go: after a crash in between, they are read from the
            // backend again rather than found missing.
            chunk.attr.flags |= EntryFlags::BACKEND_DATA;
            if let Err(error) = self.persist(&chunk) {
                log::warn!("evicting a chunk of {}: {error}", candidate.path);
                chunk.attr.flags &= !EntryFlags::BACKEND_DATA;
                continue;
            }
            let stored = chunk.body.stored_len();
            if chunk.body.truncate(0).is_err() {
                continue;
            }
            self.refund(stored);
            freed += stored;
            cache.counters.evicted_chunks.fetch_add(1, Ordering::Relaxed);
        }
        freed
    }

    /// A write that found the store full even after eviction: the chunk's current bytes and
    /// the new ones go to the backend file, and the chunk here keeps only its attributes
    /// (`BACKEND_DATA`). Returns the chunk's new length.
    #[allow(clippy::too_many_arguments)]
    pub fn write_through(
        &self,
        chunk_ref: &ChunkRef,
        offset: u64,
        source: &mut dyn ByteSource,
        template: ChunkTemplate,
        time_ns: i64,
        prepare: Prepare<'_>,
    ) -> Result<u64, StoreError> {
        let cache = self.cache.as_ref().ok_or(Errno::ENOSPC)?;
        let path = chunk_ref.path.as_str();
        if !cache.backend.covers(path) {
            return Err(Errno::ENOSPC.into());
        }
        let handle = if chunk_ref.index == 0 {
            self.head_checked(path, chunk_ref.file_id)?
        } else {
            self.tail_for_write_through(chunk_ref, template, time_ns)?
        };
        let mut chunk = lock(&handle);
        if chunk.removed || !chunk.attr.is_regular() {
            return Err(Errno::ESTALE.into());
        }
        let file_id = chunk.attr.file_id;
        if chunk_ref.index == 0 {
            self.apply_pending(path, &mut chunk)?;
        } else {
            match prepare(path, file_id) {
                Ok(_) => {}
                Err(Errno::ESTALE) | Err(Errno::ENOENT) => return Err(Errno::ESTALE.into()),
                // A cut of the file is under way (and may need this chunk's lock): the write
                // finds the store full and cannot go through just now.
                Err(Errno::EAGAIN) => return Err(Errno::ENOSPC.into()),
                Err(errno) => return Err(errno.into()),
            }
        }
        let file = cache.backend.open_for_flush(path, chunk.attr.mode).map_err(io_errno)?;
        let chunk_start = chunk_ref.index * chunk.attr.chunk_size as u64;
        // The bytes held here go first, so the backend file holds the whole chunk.
        if !chunk.attr.has(EntryFlags::BACKEND_DATA) {
            let held = chunk.body.snapshot()?;
            file.write_all_at(&held[..held.len().min(chunk.attr.len as usize)], chunk_start).map_err(io_errno)?;
            // Recorded before the bytes go (see `evict`).
            chunk.attr.flags |= EntryFlags::BACKEND_DATA;
            self.persist(&chunk)?;
            let stored = chunk.body.stored_len();
            chunk.body.truncate(0)?;
            self.refund(stored);
        }
        let mut bytes = vec![0u8; source.len()];
        source.read_into(crate::io::as_uninit(&mut bytes))?;
        file.write_all_at(&bytes, chunk_start + offset).map_err(io_errno)?;
        let len = chunk.attr.len.max(offset + bytes.len() as u64);
        backend::extend_to(&file, chunk_start + len).map_err(io_errno)?;
        cache.backend_changed();
        chunk.attr.len = len;
        chunk.attr.mtime_ns = time_ns;
        chunk.attr.ctime_ns = time_ns;
        chunk.attr.flags &= !EntryFlags::DIRTY;
        if chunk_ref.index == 0 {
            chunk.attr.flags |= EntryFlags::IN_BACKEND;
        }
        chunk.version += 1;
        self.persist(&chunk)?;
        cache.counters.written_through_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(len)
    }

    // ----- status ---------------------------------------------------------------------------

    /// Dirty data, pending entry operations and counters; the server adds its flush policy
    /// and flusher state.
    pub fn cache_stats(&self) -> Option<CacheStats> {
        let cache = self.cache.as_ref()?;
        let mut stats = CacheStats {
            backend: cache.backend.root().display().to_string(),
            mount_path: cache.backend.mount_path().to_string(),
            ..CacheStats::default()
        };
        for item in self.queued_work() {
            match item {
                WorkItem::Removal { .. } => stats.pending_entries += 1,
                WorkItem::Chunk { path, index, file_id } => {
                    let reference = ChunkRef { path: path.clone(), index, file_id };
                    let handle = if index == 0 { self.head(&path) } else { self.find_tail(&reference) };
                    let Some(handle) = handle else { continue };
                    let chunk = lock(&handle);
                    if chunk.removed {
                        continue;
                    }
                    if chunk.pending.is_some() {
                        stats.pending_entries += 1;
                    }
                    if chunk.attr.has(EntryFlags::DIRTY) {
                        stats.dirty_chunks += 1;
                        stats.dirty_bytes += chunk.attr.len;
                    }
                }
            }
        }
        let counters = &cache.counters;
        stats.flushed_chunks = counters.flushed_chunks.load(Ordering::Relaxed);
        stats.flushed_bytes = counters.flushed_bytes.load(Ordering::Relaxed);
        stats.loaded_chunks = counters.loaded_chunks.load(Ordering::Relaxed);
        stats.evicted_chunks = counters.evicted_chunks.load(Ordering::Relaxed);
        stats.written_through_bytes = counters.written_through_bytes.load(Ordering::Relaxed);
        Some(stats)
    }
}

impl Body {
    /// The stored bytes as they are now, for writing them out without holding the chunk's
    /// lock: a shared reference for a memory chunk (later writes copy on write), a copy for a
    /// chunk file.
    pub(crate) fn snapshot(&self) -> Result<std::sync::Arc<Vec<u8>>, Errno> {
        match self {
            Body::Memory(bytes) => Ok(bytes.clone()),
            Body::File(_) => Ok(std::sync::Arc::new(self.to_vec()?)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::PathBuf;

    use ringfs_proto::{ChunkRef, ChunkTemplate, Create, EntryFlags, Errno};

    use super::*;
    use crate::{Medium, StoreConfig};

    const CHUNK: u32 = 1 << 16;

    struct Setup {
        root: PathBuf,
    }

    impl Setup {
        fn new(tag: &str) -> Setup {
            let root = std::env::temp_dir().join(format!("ringfs-cache-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&root);
            fs::create_dir_all(root.join("backend")).unwrap();
            Setup { root }
        }

        fn backend(&self) -> PathBuf {
            self.root.join("backend")
        }

        fn config(&self, capacity_bytes: u64, on_disk: bool) -> StoreConfig {
            StoreConfig {
                medium: if on_disk { Medium::Directory(self.root.join("store")) } else { Medium::Memory },
                capacity_bytes,
                cache: Some(CacheConfig { backend: self.backend(), mount_path: "/".into(), chunk_size: CHUNK }),
            }
        }

        fn store(&self) -> ChunkStore {
            ChunkStore::open(self.config(0, false)).unwrap()
        }
    }

    impl Drop for Setup {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    fn template(backend_len: u64) -> ChunkTemplate {
        ChunkTemplate { mode: 0o100644, uid: 0, gid: 0, chunk_size: CHUNK, backend_len }
    }

    /// Flushes everything queued, preparing entries locally (one server).
    fn flush_all(store: &ChunkStore) -> Vec<FlushOutcome> {
        let prepare = |path: &str, file_id: u64| store.prepare_entry(path, file_id).map_err(|error| error.errno());
        let mut outcomes = Vec::new();
        let mut deferred = Vec::new();
        while let Some(queued) = store.next_work(u64::MAX) {
            let outcome = store.flush(&queued.item, &prepare, FlushPace::Complete).unwrap();
            if outcome == FlushOutcome::Deferred {
                deferred.push(queued);
            }
            outcomes.push(outcome);
        }
        // Back in the queue, as the flusher does, for the next round.
        for queued in deferred {
            store.requeue(queued);
        }
        outcomes
    }

    fn read_file(store: &ChunkStore, path: &str, size: u64) -> Vec<u8> {
        let head = store.stat(&ChunkRef { path: path.into(), index: 0, file_id: 0 }).unwrap();
        let mut bytes = Vec::new();
        for index in 0..size.div_ceil(CHUNK as u64) {
            let mut piece = Vec::new();
            let reference = ChunkRef { path: path.into(), index, file_id: head.file_id };
            store.read(&reference, 0, CHUNK as u64, &mut piece, head.backend_len).unwrap();
            piece.resize(CHUNK as usize, 0);
            bytes.extend(piece);
        }
        bytes.truncate(size as usize);
        bytes
    }

    fn new_file(store: &ChunkStore, path: &str, bytes: &[u8]) -> u64 {
        let entry = Create { exclusive: false, truncate: true, ..Create::new(path, 0o100644, CHUNK) };
        let file_id = store.create(&entry, 77).unwrap().attr.file_id;
        for (index, piece) in bytes.chunks(CHUNK as usize).enumerate() {
            let reference = ChunkRef { path: path.into(), index: index as u64, file_id };
            store.write(&reference, 0, &mut &piece[..], template(0), 5).unwrap();
        }
        file_id
    }

    #[test]
    fn backend_files_are_read_through_once_per_chunk() {
        let setup = Setup::new("read");
        let data = pattern(3 * CHUNK as usize + 100, 1);
        fs::create_dir(setup.backend().join("in")).unwrap();
        fs::write(setup.backend().join("in/data"), &data).unwrap();
        let store = setup.store();
        let head = store.stat(&ChunkRef { path: "/in/data".into(), index: 0, file_id: 0 }).unwrap();
        assert!(head.has(EntryFlags::BACKED | EntryFlags::BACKEND_DATA | EntryFlags::EXTENDED | EntryFlags::IN_BACKEND));
        assert_eq!(head.backend_len, data.len() as u64);
        assert_eq!(read_file(&store, "/in/data", data.len() as u64), data);
        assert_eq!(read_file(&store, "/in/data", data.len() as u64), data);
        assert_eq!(store.cache_stats().unwrap().loaded_chunks, 4, "each chunk came from the backend once");
        assert!(store.lookup_dir("/in").unwrap().is_dir());
        assert!(!store.has_work(), "reading dirties nothing");
        let page = store.backend_page("/in", None, 10).unwrap();
        assert_eq!(page.entries.len(), 1);
        assert_eq!(page.entries[0].attr.file_id, head.file_id);
    }

    #[test]
    fn written_files_reach_the_backend_and_writes_racing_a_flush_are_kept() {
        let setup = Setup::new("write");
        let store = setup.store();
        let data = pattern(CHUNK as usize + 5000, 2);
        new_file(&store, "/out", &data);
        let outcomes = flush_all(&store);
        assert!(outcomes.iter().all(|outcome| matches!(outcome, FlushOutcome::Flushed { clean: true, .. })), "{outcomes:?}");
        assert_eq!(fs::read(setup.backend().join("out")).unwrap(), data);

        // A write lands while a chunk is being flushed (between its pieces): the flush must
        // not mark it clean.
        const LARGE: u32 = 1 << 20;
        let entry = Create { exclusive: false, truncate: true, ..Create::new("/large", 0o100644, LARGE) };
        let file_id = store.create(&entry, 78).unwrap().attr.file_id;
        flush_all(&store);
        let reference = ChunkRef { path: "/large".into(), index: 0, file_id };
        let big = pattern(LARGE as usize, 3);
        let large_template = ChunkTemplate { chunk_size: LARGE, ..template(0) };
        store.write(&reference, 0, &mut &big[..], large_template, 6).unwrap();
        let queued = store.next_work(u64::MAX).unwrap();
        let prepare = |path: &str, id: u64| store.prepare_entry(path, id).map_err(|error| error.errno());
        let racing = pattern(10, 4);
        let wrote = std::cell::Cell::new(false);
        let keep_going = || {
            if !wrote.replace(true) {
                store.write(&reference, 100, &mut &racing[..], large_template, 7).unwrap();
            }
            true
        };
        let outcome = store.flush(&queued.item, &prepare, FlushPace::Yielding(&keep_going)).unwrap();
        assert_eq!(outcome, FlushOutcome::Flushed { bytes: backend::FLUSH_PIECE_BYTES as u64, clean: false }, "stops at the change");
        assert!(store.stat(&reference).unwrap().has(EntryFlags::DIRTY), "the racing write keeps the chunk dirty");
        assert_ne!(&fs::read(setup.backend().join("large")).unwrap()[100..110], &racing[..], "the flush wrote the older bytes");
        // The racing write queued the chunk again, behind a sync begun before it; putting the
        // interrupted work back keeps the chunk in that sync.
        assert_eq!(store.work_left(queued.since), 0);
        store.requeue(queued.clone());
        assert_eq!(store.work_left(queued.since), 1, "the chunk keeps its place in a sync begun before the write");
        assert_eq!(store.queued_work().len(), 1, "and is queued once");
        flush_all(&store);
        let mut expected = big.clone();
        expected[100..110].copy_from_slice(&racing);
        assert_eq!(fs::read(setup.backend().join("large")).unwrap(), expected);
        assert!(!store.stat(&reference).unwrap().has(EntryFlags::DIRTY));
    }

    #[test]
    fn a_complete_flush_ends_clean_under_continuous_writes() {
        let setup = Setup::new("complete");
        let store = setup.store();
        const LARGE: u32 = 1 << 20;
        let entry = Create { exclusive: false, truncate: true, ..Create::new("/hot", 0o100644, LARGE) };
        let file_id = store.create(&entry, 78).unwrap().attr.file_id;
        let reference = ChunkRef { path: "/hot".into(), index: 0, file_id };
        let large_template = ChunkTemplate { chunk_size: LARGE, ..template(0) };
        store.write(&reference, 0, &mut &pattern(LARGE as usize, 1)[..], large_template, 6).unwrap();
        flush_all(&store);
        let done = std::sync::atomic::AtomicBool::new(false);
        let prepare = |path: &str, id: u64| store.prepare_entry(path, id).map_err(|error| error.errno());
        std::thread::scope(|scope| {
            scope.spawn(|| {
                // Rewrites the whole chunk, with other bytes each time, until the flushes are done.
                let versions: Vec<Vec<u8>> = (0..4).map(|seed| pattern(LARGE as usize, seed)).collect();
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
                for round in 0..1_000_000 {
                    if done.load(std::sync::atomic::Ordering::Relaxed) || std::time::Instant::now() > deadline {
                        break;
                    }
                    store.write(&reference, 0, &mut &versions[round % 4][..], large_template, 7).unwrap();
                }
            });
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            let mut flushes = 0;
            while flushes < 20 && std::time::Instant::now() < deadline {
                let Some(queued) = store.next_work(u64::MAX) else {
                    std::thread::yield_now();
                    continue;
                };
                // (Skipped: a write queued the chunk again while an earlier flush was taking
                // its bytes, and that flush wrote them.)
                match store.flush(&queued.item, &prepare, FlushPace::Complete).unwrap() {
                    FlushOutcome::Flushed { clean: true, .. } => flushes += 1,
                    FlushOutcome::Skipped => {}
                    outcome => panic!("a complete flush ended {outcome:?}"),
                }
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            assert_eq!(flushes, 20, "the writer kept the chunk dirty");
        });
        // The last flush wrote one whole version of the chunk.
        let flushed = fs::read(setup.backend().join("hot")).unwrap();
        assert!((0..4).any(|seed| flushed == pattern(LARGE as usize, seed)), "the backend holds a mix of versions");
    }

    #[test]
    fn removals_and_truncations_reach_the_backend_when_flushed() {
        let setup = Setup::new("namespace");
        fs::write(setup.backend().join("old"), pattern(5000, 5)).unwrap();
        fs::write(setup.backend().join("cut"), pattern(3 * CHUNK as usize, 6)).unwrap();
        let store = setup.store();
        store.unlink("/old", 0).unwrap();
        assert!(setup.backend().join("old").exists(), "removal waits for the flush");
        assert_eq!(store.stat(&ChunkRef { path: "/old".into(), index: 0, file_id: 0 }).unwrap_err().errno(), Errno::ENOENT);
        assert_eq!(store.read_dir("/", None, 10).removed, ["old"]);
        let cut = store.stat(&ChunkRef { path: "/cut".into(), index: 0, file_id: 0 }).unwrap();
        store.truncate_head("/cut", cut.file_id, 1000, 1000, 9).unwrap();
        store.cut_backend_file("/cut", cut.file_id, 1000).unwrap();
        assert_eq!(store.stat(&ChunkRef { path: "/cut".into(), index: 0, file_id: 0 }).unwrap().backend_len, 1000);
        flush_all(&store);
        assert!(!setup.backend().join("old").exists());
        assert_eq!(fs::read(setup.backend().join("cut")).unwrap(), pattern(3 * CHUNK as usize, 6)[..1000]);
        assert!(store.read_dir("/", None, 10).removed.is_empty());

        // A write past the cut that lands while the cut is under way (after the chunks past it
        // were removed, before the cut is recorded) is not flushed until the cut is recorded,
        // so the cut cannot take it away in the backend.
        let cut = store.stat(&ChunkRef { path: "/cut".into(), index: 0, file_id: 0 }).unwrap();
        store.truncate_head("/cut", cut.file_id, 500, 500, 10).unwrap();
        let late = ChunkRef { path: "/cut".into(), index: 1, file_id: cut.file_id };
        let late_bytes = pattern(100, 11);
        store.write(&late, 0, &mut &late_bytes[..], template(0), 11).unwrap();
        let outcomes = flush_all(&store);
        assert!(outcomes.contains(&FlushOutcome::Deferred), "{outcomes:?}");
        store.cut_backend_file("/cut", cut.file_id, 500).unwrap();
        flush_all(&store);
        let mut expected = pattern(3 * CHUNK as usize, 6)[..500].to_vec();
        expected.resize(CHUNK as usize, 0);
        expected.extend_from_slice(&late_bytes);
        assert_eq!(fs::read(setup.backend().join("cut")).unwrap(), expected);

        // A new file over a removed one replaces it, even before the removal is flushed.
        fs::write(setup.backend().join("again"), b"old contents").unwrap();
        store.unlink("/again", 0).unwrap();
        new_file(&store, "/again", b"new");
        flush_all(&store);
        assert_eq!(fs::read(setup.backend().join("again")).unwrap(), b"new");
    }

    #[test]
    fn a_full_store_evicts_clean_chunks_then_writes_through() {
        let setup = Setup::new("full");
        let data = pattern(6 * CHUNK as usize, 7);
        fs::write(setup.backend().join("big"), &data).unwrap();
        let store = ChunkStore::open(setup.config(3 * CHUNK as u64 + 4096, false)).unwrap();
        assert_eq!(read_file(&store, "/big", data.len() as u64), data);
        assert!(store.cache_stats().unwrap().evicted_chunks >= 3, "clean chunks made room");
        assert_eq!(read_file(&store, "/big", data.len() as u64), data, "evicted chunks are loaded again");

        // Dirty data cannot be evicted: a writer that runs out of room writes through.
        let file_id = new_file(&store, "/w0", &pattern(CHUNK as usize, 8));
        new_file(&store, "/w1", &pattern(CHUNK as usize, 9));
        let chunk_of_w0 = |index| ChunkRef { path: "/w0".into(), index, file_id };
        let second = pattern(CHUNK as usize, 10);
        store.write(&chunk_of_w0(1), 0, &mut &second[..], template(0), 3).unwrap();
        let third = pattern(CHUNK as usize, 12);
        let full = store.write(&chunk_of_w0(2), 0, &mut &third[..], template(0), 3).unwrap_err();
        assert_eq!(full.errno(), Errno::ENOSPC, "only dirty chunks are left");
        let prepare = |path: &str, id: u64| store.prepare_entry(path, id).map_err(|error| error.errno());
        assert_eq!(store.write_through(&chunk_of_w0(2), 0, &mut &third[..], template(0), 3, &prepare).unwrap(), CHUNK as u64);
        assert_eq!(store.cache_stats().unwrap().written_through_bytes, CHUNK as u64);
        let expected = [pattern(CHUNK as usize, 8), second, third].concat();
        assert_eq!(read_file(&store, "/w0", 3 * CHUNK as u64), expected, "written-through bytes read from the backend");
        flush_all(&store);
        assert_eq!(fs::read(setup.backend().join("w0")).unwrap(), expected);
    }

    #[test]
    fn dirty_state_and_removals_survive_a_restart() {
        let setup = Setup::new("restart");
        fs::write(setup.backend().join("gone"), b"x").unwrap();
        {
            let store = ChunkStore::open(setup.config(0, true)).unwrap();
            new_file(&store, "/kept", &pattern(2 * CHUNK as usize, 11));
            store.unlink("/gone", 0).unwrap();
            assert!(store.has_work());
        }
        let store = ChunkStore::open(setup.config(0, true)).unwrap();
        assert_eq!(store.queued_work().len(), 3, "two chunks and one removal are queued again");
        flush_all(&store);
        assert_eq!(fs::read(setup.backend().join("kept")).unwrap(), pattern(2 * CHUNK as usize, 11));
        assert!(!setup.backend().join("gone").exists());

        // A crash after a new entry replaced a removed one, before the removal record was
        // forgotten: the restart must not apply the removal after the new entry's creation.
        fs::write(setup.backend().join("again"), b"old").unwrap();
        drop(store);
        {
            let store = ChunkStore::open(setup.config(0, true)).unwrap();
            store.unlink("/again", 0).unwrap();
            new_file(&store, "/again", b"new");
            let directory = store.directory.as_ref().unwrap();
            directory.record_removal("/again", RemovalKind::File).unwrap();
        }
        let store = ChunkStore::open(setup.config(0, true)).unwrap();
        flush_all(&store);
        assert_eq!(fs::read(setup.backend().join("again")).unwrap(), b"new");
        assert!(store.read_dir("/", None, 10).removed.is_empty());
    }
}
