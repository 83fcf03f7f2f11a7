//! Cache mode as the server drives it: the flush queue, flush steps, stage-in and the backend
//! listing, on top of [`crate::cache::Cache`]. Without a backend every call is a no-op (or
//! fails with EIO where a backend is needed).

use ringfs_proto::{CacheStats, ChunkRef, ChunkTemplate, DirPage, EntryFlags, Errno};

use crate::cache::{Cache, FlushOutcome, FlushPace, Prepare, QueuedWork, WorkItem};
use crate::chunk::lock;
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

    /// Applies the pending operation of the entry `(path, file_id)` to the backend (asked by a
    /// server about to flush a chunk of the file); ESTALE if the entry is gone or is another
    /// file now.
    pub fn prepare_entry(&self, path: &str, file_id: u64) -> Result<(), StoreError> {
        self.cache_or_eio()?.prepare_entry(&self.index, &self.space, path, file_id)
    }

    /// A regular file in the cached tree was cut to `len` and its chunks past the cut are gone
    /// from every server: the backend file is cut when the entry is next flushed.
    pub fn cut_backend_file(&self, path: &str, file_id: u64, len: u64) -> Result<(), StoreError> {
        let handle = self.head_checked(path, file_id)?;
        match &self.cache {
            Some(cache) => cache.cut_backend_file(&self.space, path, &handle, len),
            None => {
                lock(&handle).cache.cutting = false;
                Ok(())
            }
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

    /// Loads one chunk from the backend (stage-in). Returns the bytes loaded (0 if the chunk
    /// was here already or holds no backend data).
    pub fn load_chunk(&self, chunk_ref: &ChunkRef, backend_len: u64) -> Result<u64, StoreError> {
        let handle = if chunk_ref.index == 0 {
            self.head_checked(&chunk_ref.path, chunk_ref.file_id)?
        } else {
            match self.tail_for_read(chunk_ref, backend_len, self.backend_chunk_size())? {
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

    /// A write that found the store full even after eviction goes to the backend directly
    /// (see `Cache::write_through`). Returns the chunk's new length.
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
        if !cache.backend.covers(&chunk_ref.path) {
            return Err(Errno::ENOSPC.into());
        }
        let handle = if chunk_ref.index == 0 {
            self.head_checked(&chunk_ref.path, chunk_ref.file_id)?
        } else {
            self.tail_for_write_through(chunk_ref, template, time_ns)?
        };
        cache.write_through(&self.space, &chunk_ref.path, chunk_ref.index, &handle, offset, source, time_ns, prepare)
    }

    /// One page of the backend directory behind `dir`, in name order, after `after`.
    pub fn backend_page(&self, dir: &str, after: Option<&str>, limit: usize) -> Result<DirPage, StoreError> {
        self.cache.as_ref().map_or(Ok(DirPage::default()), |cache| cache.backend_page(dir, after, limit))
    }

    /// Every name in the backend directory behind `dir` (rmdir's emptiness check).
    pub fn backend_names(&self, dir: &str) -> Result<Vec<String>, StoreError> {
        self.cache.as_ref().map_or(Ok(Vec::new()), |cache| cache.backend_names(dir))
    }
}
