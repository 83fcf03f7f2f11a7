//! The flush queue: which chunks and removals wait to reach the backend, and in what order;
//! the list of clean chunks that may be evicted.

use std::sync::atomic::Ordering;

use super::{Cache, CleanChunk, QueuedWork, WorkItem, evictable, io_errno};
use crate::StoreError;
use crate::chunk::{Chunk, ChunkHandle};
use crate::index::Index;

impl Cache {
    /// Appends new work (the caller makes sure it is not queued already).
    pub(super) fn push(&self, item: WorkItem) {
        let mut work = self.work.lock();
        work.sequence += 1;
        let since = work.sequence;
        // (Logged after the queue's lock is given back.)
        let described = log::log_enabled!(log::Level::Debug).then(|| format!("{item:?}"));
        work.order.push_back(QueuedWork { item, since, failures: 0, deferrals: 0 });
        drop(work);
        if let Some(item) = described {
            log::debug!("queued {item} at {since}");
        }
    }

    /// Queues a chunk (held locked by the caller) for flushing, unless it is queued already.
    /// A dirty chunk is always queued or being flushed: the flusher clears the mark when it
    /// takes the chunk's bytes, and queues the chunk again if it changed meanwhile.
    pub fn queue_chunk(&self, chunk: &mut Chunk) {
        if !chunk.cache.queued {
            chunk.cache.queued = true;
            self.push(WorkItem::Chunk(chunk.key()));
        }
    }

    /// Remembers a chunk that became clean as a candidate for eviction.
    pub fn note_clean(&self, handle: &ChunkHandle, chunk: &mut Chunk, chunk_count: u64) {
        if chunk.cache.listed_clean || !evictable(chunk) {
            return;
        }
        chunk.cache.listed_clean = true;
        let mut clean = self.clean.lock();
        clean.push_back(CleanChunk { handle: handle.clone() });
        // Entries of chunks removed since are skipped when popped; do not let them pile up.
        let limit = 2 * chunk_count as usize + 1024;
        if clean.len() > limit {
            clean.retain(|candidate| candidate.handle.try_lock().map(|chunk| !chunk.removed).unwrap_or(true));
        }
    }

    /// Takes the next unit of flushing work queued at or before `up_to` (`u64::MAX`: any).
    pub fn next_work(&self, up_to: u64) -> Option<QueuedWork> {
        let mut work = self.work.lock();
        let position = work.order.iter().position(|queued| queued.since <= up_to)?;
        work.order.remove(position)
    }

    /// Puts work back (a flush that was interrupted, failed or overtaken by a change), keeping
    /// its place in syncs.
    pub fn requeue(&self, index: &Index, queued: QueuedWork) {
        match &queued.item {
            WorkItem::Removal { path } => {
                if !index.names_of(path).removals.contains_key(path) {
                    return;
                }
            }
            WorkItem::Chunk(key) => {
                let Some(handle) = index.chunk(*key) else { return };
                let mut chunk = handle.lock();
                if chunk.removed {
                    return;
                }
                if chunk.cache.queued {
                    // Changed meanwhile and queued again: it keeps the earlier place, which a
                    // running sync waits for.
                    let mut work = self.work.lock();
                    if let Some(entry) = work.order.iter_mut().find(|entry| entry.item == queued.item) {
                        entry.since = entry.since.min(queued.since);
                        entry.failures = entry.failures.max(queued.failures);
                        entry.deferrals = entry.deferrals.max(queued.deferrals);
                    }
                    return;
                }
                chunk.cache.queued = true;
            }
        }
        self.work.lock().order.push_back(queued);
    }

    /// The sequence number of the latest queued work: a sync started now covers the work
    /// queued up to it.
    pub fn work_sequence(&self) -> u64 {
        self.work.lock().sequence
    }

    /// How much work queued at or before `up_to` is left.
    pub fn work_left(&self, up_to: u64) -> u64 {
        self.work.lock().order.iter().filter(|queued| queued.since <= up_to).count() as u64
    }

    /// Everything queued now.
    pub fn queued_work(&self) -> Vec<WorkItem> {
        self.work.lock().order.iter().map(|queued| queued.item.clone()).collect()
    }

    pub fn has_work(&self) -> bool {
        !self.work.lock().order.is_empty()
    }

    /// Forces the backend changes made so far to stable storage (`syncfs` of the backend's
    /// file system, if anything changed since the last time): the end of a sync.
    pub fn make_backend_durable(&self) -> Result<(), StoreError> {
        if !self.changed_since_sync.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        self.backend.sync_all().map_err(|error| {
            self.backend_changed();
            io_errno(error)
        })
    }
}
