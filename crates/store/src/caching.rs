//! Cache mode as the server drives it: the flush queue, flush steps, stage-in and the backend
//! listing, on top of [`crate::cache::Cache`]. Without a backend every call is a no-op (or
//! fails with EIO where a backend is needed).

use ringfs_proto::{CacheStats, ChunkKey, ChunkTemplate, DirPage, EntryFlags, Errno, FileId, RenameToken};

use crate::cache::{BackendFile, Cache, FlushOutcome, FlushPace, Prepare, QueuedWork, WorkItem};
use crate::store::ChunkStore;
use crate::{ByteSource, StoreError};

impl ChunkStore {
    fn cache_or_eio(&self) -> Result<&Cache, StoreError> {
        self.cache.as_ref().ok_or(StoreError::Fs(Errno::EIO))
    }

    /// The chunk size of files loaded from the backend (for chunks made by reads, which carry
    /// no template).
    pub fn backend_chunk_size(&self) -> u32 {
        self.cache.as_ref().map_or(1, |cache| cache.chunk_size)
    }

    /// Takes the next unit of flushing work queued at or before `up_to` (`u64::MAX`: any).
    pub fn next_work(&self, up_to: u64) -> Option<QueuedWork> {
        self.cache.as_ref()?.next_work(up_to)
    }

    /// Puts work back (a flush that was interrupted, failed or overtaken by a change), keeping
    /// its place in syncs.
    pub fn requeue(&self, queued: QueuedWork) {
        if let Some(cache) = &self.cache {
            cache.requeue(&self.index, queued);
        }
    }

    /// The sequence number of the latest queued work: a sync started now covers the work
    /// queued up to it.
    pub fn work_sequence(&self) -> u64 {
        self.cache.as_ref().map_or(0, Cache::work_sequence)
    }

    /// How much work queued at or before `up_to` is left.
    pub fn work_left(&self, up_to: u64) -> u64 {
        self.cache.as_ref().map_or(0, |cache| cache.work_left(up_to))
    }

    /// Everything queued now.
    pub fn queued_work(&self) -> Vec<WorkItem> {
        self.cache.as_ref().map(Cache::queued_work).unwrap_or_default()
    }

    pub fn has_work(&self) -> bool {
        self.cache.as_ref().is_some_and(Cache::has_work)
    }

    /// Forces the backend changes made so far to stable storage (the end of a sync).
    pub fn make_backend_durable(&self) -> Result<(), StoreError> {
        self.cache.as_ref().map_or(Ok(()), Cache::make_backend_durable)
    }

    /// At a file's inode, before data of it is flushed: applies the inode's pending
    /// operation and answers where the file lives in the backend (`None`: nowhere). ESTALE if
    /// the file is gone; EAGAIN while a cut of it is under way.
    pub fn prepare(&self, file: FileId) -> Result<Option<ringfs_proto::BackendPlace>, StoreError> {
        self.cache_or_eio()?.prepare(&self.index, &self.space, file)
    }

    /// Cache mode, at a file's inode: the file's name `from` (if known) moved to `path`
    /// (`None`: out of the cached tree). A file with no other name in the cached tree now
    /// lives at `path` in the backend: it is made there anew, with all its data — the caller
    /// marks the file's chunks on the other servers dirty ([`ChunkStore::redirty`]). A file
    /// with other names there keeps its backend file: `path` becomes another link of it and
    /// `from` stops being one (see `cache::links`). Returns whether the file's data must be
    /// flushed again.
    pub fn rebind(&self, file: FileId, path: Option<&str>, from: Option<&str>) -> Result<bool, StoreError> {
        let handle = self.inode_checked(file)?;
        let mut chunk = handle.lock();
        // The file's names in the cached tree other than the one that moves.
        let others = match (chunk.attr.has(EntryFlags::BACKED), chunk.cache.backend_path.as_deref()) {
            (true, Some(primary)) => {
                usize::from(Some(primary) != from) + chunk.cache.links.iter().filter(|link| Some(link.path.as_str()) != from).count()
            }
            _ => 0,
        };
        if others > 0 {
            // One name of several moves: a new link, and one link fewer.
            let mut rewrite = path.is_some_and(|path| self.add_backend_name(&mut chunk, path));
            if let Some(from) = from {
                rewrite |= self.drop_backend_name(&mut chunk, from);
            }
            self.persist(&mut chunk)?;
            drop(chunk);
            if rewrite {
                self.redirty(file, true);
            }
            return Ok(rewrite);
        }
        chunk.cache.moves += 1;
        log::debug!("file {file} rebound to {path:?} (from {from:?})");
        match path {
            Some(path) if self.cache.as_ref().is_some_and(|cache| cache.backend.covers(path)) => {
                self.make_anew_at(&mut chunk, path);
            }
            _ => {
                chunk.cache = crate::chunk::CacheState {
                    queued: chunk.cache.queued,
                    listed_clean: chunk.cache.listed_clean,
                    moves: chunk.cache.moves,
                    ..Default::default()
                };
                chunk.attr.flags &= !(EntryFlags::BACKED | EntryFlags::DIRTY | EntryFlags::IN_BACKEND);
            }
        }
        self.persist(&mut chunk)?;
        drop(chunk);
        self.redirty(file, path.is_some());
        Ok(true)
    }

    /// Cache mode, at a file's inode, for a rename of its name `from` to `to` within the
    /// cached tree: the file's backend file (or that link of it) moves with the name, so no
    /// byte is loaded or flushed again (see `cache::moves`). Nothing changed unless it
    /// answers `Moved`.
    pub fn move_backend_file(&self, file: FileId, from: &str, to: &str) -> Result<crate::BackendMove, StoreError> {
        let Some(cache) = &self.cache else { return Ok(crate::BackendMove::Cannot) };
        let handle = self.inode_checked(file)?;
        let mut chunk = handle.lock();
        cache.move_with_name(&self.space, &mut chunk, from, to)
    }

    /// Cache mode, at the server of the name `path`, before a rename moves a backend file
    /// there: a removal of the name not yet applied to the backend is applied now (applied
    /// after the move, it would take the moved file away). EBUSY while a directory rename
    /// holds the path.
    pub fn settle_backend_name(&self, path: &str) -> Result<(), StoreError> {
        match &self.cache {
            Some(cache) if cache.backend.covers(path) => cache.settle_removal(&self.index, &self.space, path),
            _ => Ok(()),
        }
    }

    /// The file (whose inode is `chunk`) lives at `path` in the backend from now on, made
    /// there anew when next flushed; its data must then be flushed again.
    fn make_anew_at(&self, chunk: &mut crate::chunk::Chunk, path: &str) {
        chunk.cache.moves += 1;
        chunk.cache.backend_path = Some(path.to_string());
        // Its own backend file is the one its creation makes.
        chunk.cache.backend_identity = None;
        chunk.cache.pending = Some(crate::chunk::PendingOp::Create);
        chunk.attr.flags |= EntryFlags::BACKED;
        chunk.attr.flags &= !EntryFlags::IN_BACKEND;
        self.touched(chunk);
    }

    /// Cache mode, at a file's inode: `name` is a new name of the file. In the cached tree
    /// the backend gets it as a hard link to the file's backend file when the inode is next
    /// flushed; a file with no name in the cached tree yet enters it with this one (made
    /// there anew). Returns whether the file's data must be flushed again by every server.
    pub(crate) fn add_backend_name(&self, chunk: &mut crate::chunk::Chunk, name: &str) -> bool {
        let Some(cache) = &self.cache else { return false };
        if !cache.backend.covers(name) {
            return false;
        }
        match chunk.cache.backend_path.as_deref() {
            Some(primary) if chunk.attr.has(EntryFlags::BACKED) => {
                if primary != name && !chunk.cache.links.iter().any(|link| link.path == name) {
                    chunk.cache.links.push(crate::chunk::BackendLink { path: name.to_string(), made: false });
                    self.queue_chunk(chunk);
                }
                false
            }
            _ => {
                self.make_anew_at(chunk, name);
                true
            }
        }
    }

    /// Cache mode, at a file's inode, before a rename gives the file's name `name` to another
    /// file: if the file has not made its backend file (or its link) there yet, it gives
    /// that up now, before the other file is bound to the path — its creation, applied late,
    /// would otherwise replace the other file's backend file (soak seed 71052). Returns
    /// whether something was given up (the rename makes it again if it fails) and whether
    /// the file's data must be flushed again by every server (another name took over).
    pub fn yield_backend_name(&self, file: FileId, name: &str) -> Result<(bool, bool), StoreError> {
        if self.cache.is_none() {
            return Ok((false, false));
        }
        let handle = self.inode_checked(file)?;
        let mut chunk = handle.lock();
        let unmade_link = chunk.cache.links.iter().any(|link| link.path == name && !link.made);
        let creation_pending =
            chunk.cache.backend_path.as_deref() == Some(name) && chunk.cache.pending == Some(crate::chunk::PendingOp::Create);
        if !unmade_link && !creation_pending {
            return Ok((false, false));
        }
        let rewrite = self.drop_backend_name(&mut chunk, name);
        self.persist(&mut chunk)?;
        Ok((true, rewrite))
    }

    /// Cache mode, at a file's inode: `name` is no longer a name of the file (it has others).
    /// If the file's data went to the backend under that name, another name takes over: one
    /// the backend has already (the same backend file), or else one it has not, where the
    /// file is made anew (the caller loaded the file's backend bytes into ringfs first).
    /// Returns whether the file's data must be flushed again by every server.
    pub(crate) fn drop_backend_name(&self, chunk: &mut crate::chunk::Chunk, name: &str) -> bool {
        if self.cache.is_none() {
            return false;
        }
        if let Some(position) = chunk.cache.links.iter().position(|link| link.path == name) {
            chunk.cache.links.remove(position);
            return false;
        }
        if chunk.cache.backend_path.as_deref() != Some(name) {
            return false;
        }
        match chunk.cache.links.iter().position(|link| link.made) {
            Some(made) => {
                let link = chunk.cache.links.remove(made);
                chunk.cache.moves += 1;
                chunk.cache.backend_path = Some(link.path);
                false
            }
            None if !chunk.cache.links.is_empty() => {
                let link = chunk.cache.links.remove(0);
                self.make_anew_at(chunk, &link.path);
                true
            }
            // Its only name in the cached tree (the others are outside it): the file leaves the
            // cached tree, and its chunks' flushes find no backend place (they are dropped).
            None => {
                chunk.cache.moves += 1;
                chunk.cache.backend_path = None;
                chunk.cache.backend_identity = None;
                chunk.cache.pending = None;
                chunk.attr.flags &= !(EntryFlags::BACKED | EntryFlags::DIRTY | EntryFlags::IN_BACKEND);
                false
            }
        }
    }

    /// Cache mode: marks this store's chunks of a file (after chunk 0) dirty, to be flushed
    /// again to the file's (new) place in the backend; `backed` false: the file left the
    /// cached tree and its chunks are not flushed any more.
    pub fn redirty(&self, file: FileId, backed: bool) {
        if self.cache.is_none() {
            return;
        }
        for (_, handle) in self.index.tail_of(file) {
            let mut chunk = handle.lock();
            if chunk.removed {
                continue;
            }
            chunk.cache.moves += 1;
            if backed {
                chunk.attr.flags |= EntryFlags::BACKED;
                self.touched(&mut chunk);
            } else {
                chunk.attr.flags &= !(EntryFlags::BACKED | EntryFlags::DIRTY);
            }
            if let Err(error) = self.persist(&mut chunk) {
                log::warn!("cannot record a chunk of file {file} as dirty: {error}");
            }
        }
    }

    /// A directory rename in the cached tree begins: holds both paths in the backend (see
    /// `cache::holds`) for at most `lease`, and applies the removals recorded here below them
    /// (the entries removed in ringfs must not move with the backend tree). No-op without a
    /// backend.
    pub fn hold_backend(&self, token: RenameToken, paths: &[&str], lease: std::time::Duration) -> Result<(), StoreError> {
        let Some(cache) = &self.cache else { return Ok(()) };
        cache.holds.hold(token, paths, lease);
        for path in paths {
            cache.apply_removals_under(&self.index, &self.space, path)?;
        }
        Ok(())
    }

    /// The rename `token` ended: its backend paths may change again.
    pub fn release_backend(&self, token: RenameToken) {
        if let Some(cache) = &self.cache {
            cache.holds.release(token);
        }
    }

    /// A number that changes each time a directory rename takes or releases backend paths
    /// (a backend read that failed meanwhile is tried again). Lock-free: asked before every
    /// data request.
    pub fn backend_moves(&self) -> u64 {
        self.cache.as_ref().map_or(0, |cache| cache.holds.generation())
    }

    /// Whether a directory rename holds backend paths now.
    pub fn backend_held(&self) -> bool {
        self.cache.as_ref().is_some_and(|cache| cache.holds.any())
    }

    /// Moves a directory (or exchanges two entries) in the backend for a directory rename.
    pub fn move_in_backend(&self, from: &str, to: &str, exchange: bool) -> Result<(), StoreError> {
        self.cache_or_eio()?.move_in_backend(from, to, exchange)
    }

    /// Points this store's inodes at their backend paths after a directory rename (see
    /// `Cache::rebase_backend_paths`). No-op without a backend.
    pub fn rebase_backend_paths(&self, from: &str, to: &str, exchange: bool) -> Result<(), StoreError> {
        match &self.cache {
            Some(cache) => cache.rebase_backend_paths(&self.index, &self.space, from, to, exchange),
            None => Ok(()),
        }
    }

    /// Does one unit of flushing work. `prepare` reaches the entry's server (see [`Prepare`]);
    /// `pace` says whether the flush steps aside for writers.
    pub fn flush(&self, item: &WorkItem, prepare: Prepare<'_>, pace: FlushPace<'_>) -> Result<FlushOutcome, StoreError> {
        self.cache_or_eio()?.flush(&self.index, &self.space, item, prepare, pace)
    }

    /// Dirty data, pending entry operations and counters.
    pub fn cache_stats(&self) -> Option<CacheStats> {
        Some(self.cache.as_ref()?.stats(&self.index))
    }

    /// Loads one chunk from the backend (stage-in); `backend` as the inode's server gave it.
    /// With `keep` (a rename takes the bytes along) the chunk is then marked dirty, also one
    /// that was here whole: no eviction drops its bytes until they are flushed again.
    /// Returns the bytes loaded (0 if the chunk was here already or holds no backend data).
    pub fn load_chunk(&self, key: ChunkKey, backend: Option<&BackendFile>, keep: bool) -> Result<u64, StoreError> {
        let handle = if key.is_inode() {
            self.inode_checked(key.file)?
        } else {
            match self.tail_for_read(key, backend, self.backend_chunk_size())? {
                Some(handle) => handle,
                None => return Ok(0),
            }
        };
        let mut chunk = handle.lock();
        if chunk.removed {
            return Ok(0);
        }
        let loaded = if chunk.attr.has(EntryFlags::BACKEND_DATA) {
            self.ensure_loaded(&handle, &mut chunk, backend)?;
            chunk.attr.len
        } else {
            0
        };
        if keep {
            self.touched(&mut chunk);
            self.persist(&mut chunk)?;
        }
        Ok(loaded)
    }

    /// A write that found the store full even after eviction goes to the backend directly
    /// (see `Cache::write_through`). Returns the chunk's new length.
    #[allow(clippy::too_many_arguments)]
    pub fn write_through(
        &self,
        key: ChunkKey,
        offset: u64,
        source: &mut dyn ByteSource,
        template: ChunkTemplate,
        time_ns: i64,
        backend: Option<&BackendFile>,
        prepare: Prepare<'_>,
    ) -> Result<u64, StoreError> {
        let cache = self.cache.as_ref().ok_or(Errno::ENOSPC)?;
        let handle =
            if key.is_inode() { self.inode_checked(key.file)? } else { self.tail_for_write_through(key, template, time_ns, backend)? };
        cache.write_through(&self.space, &handle, offset, source, time_ns, prepare)
    }

    /// One page of the backend directory behind `dir`, in name order, after `after`; each
    /// entry's file id gets the anchor `anchor_of` gives its path.
    pub fn backend_page(
        &self,
        dir: &str,
        after: Option<&str>,
        limit: usize,
        anchor_of: &dyn Fn(&str) -> u32,
    ) -> Result<DirPage, StoreError> {
        self.cache.as_ref().map_or(Ok(DirPage::default()), |cache| cache.backend_page(dir, after, limit, anchor_of))
    }

    /// Every name in the backend directory behind `dir` (rmdir's emptiness check).
    pub fn backend_names(&self, dir: &str) -> Result<Vec<String>, StoreError> {
        self.cache.as_ref().map_or(Ok(Vec::new()), |cache| cache.backend_names(dir))
    }
}
