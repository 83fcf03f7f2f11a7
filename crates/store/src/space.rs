//! Where a store keeps chunk bytes and what they cost: the medium (`mem` or `dir`), the pool
//! of buffers of removed chunks, and the capacity account.
//!
//! Every chunk is charged a fixed overhead for its index entry plus its stored bytes, and
//! every name an overhead plus its length, so a store full of empty files also reports
//! ENOSPC. [`Space::charge`] only refuses; making room (cache mode's eviction) is the store's
//! decision.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ringfs_proto::{Attr, ChunkKey, Errno, FileId};

use crate::body::Body;
use crate::chunk::{CacheState, Chunk, ChunkHandle};
use crate::directory::{ChunkDirectory, HeaderState};
use crate::pool::BufferPool;
use crate::{ByteSource, StoreError};

/// Capacity charged per chunk for its index entry, on top of its bytes.
pub(crate) const CHUNK_OVERHEAD_BYTES: u64 = 128;
/// Capacity charged per name, on top of its length.
const ENTRY_OVERHEAD_BYTES: u64 = 64;

/// Most bytes of removed chunks' buffers kept for new chunks (see `pool`).
const POOL_LIMIT_BYTES: usize = 512 << 20;

/// What the entry of `path` costs.
pub(crate) fn entry_cost(path: &str) -> u64 {
    ENTRY_OVERHEAD_BYTES + path.len() as u64
}

/// The medium, the buffer pool and the capacity account of one store.
pub(crate) struct Space {
    pub directory: Option<ChunkDirectory>,
    pool: BufferPool,
    capacity_bytes: u64,
    used_bytes: AtomicU64,
    chunk_count: AtomicU64,
    /// Bytes charged ahead for files (`fallocate`) and not written yet: the growth of the
    /// file's chunks here uses them before it is charged anew.
    reserved: Mutex<HashMap<FileId, u64>>,
}

impl Space {
    pub fn new(directory: Option<ChunkDirectory>, capacity_bytes: u64) -> Space {
        Space {
            directory,
            pool: BufferPool::new(POOL_LIMIT_BYTES),
            capacity_bytes,
            used_bytes: AtomicU64::new(0),
            chunk_count: AtomicU64::new(0),
            reserved: Mutex::new(HashMap::new()),
        }
    }

    /// Charges `bytes` against the capacity; ENOSPC if they do not fit (without a limit: if
    /// the count would overflow).
    pub fn charge(&self, bytes: u64) -> Result<(), Errno> {
        if bytes == 0 {
            return Ok(());
        }
        let limit = if self.capacity_bytes == 0 { u64::MAX } else { self.capacity_bytes };
        self.used_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| used.checked_add(bytes).filter(|total| *total <= limit))
            .map(drop)
            .map_err(|_| Errno::ENOSPC)
    }

    /// Bytes that must be freed before `bytes` more fit (at least 1 when they do not fit).
    pub fn shortfall(&self, bytes: u64) -> u64 {
        self.used_bytes.load(Ordering::Relaxed).saturating_add(bytes).saturating_sub(self.capacity_bytes).max(1)
    }

    /// Charges bytes without a limit (the index entry of a chunk written through to the
    /// backend must exist even when the store is full).
    pub fn charge_anyway(&self, bytes: u64) {
        self.used_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn reservations(&self) -> parking_lot::MutexGuard<'_, HashMap<FileId, u64>> {
        self.reserved.lock()
    }

    /// Adds `bytes` (already charged) to `file`'s reservation. (Charged bytes fit in a
    /// `u64`, so the sum cannot overflow; it saturates all the same.)
    pub fn add_reserved(&self, file: FileId, bytes: u64) {
        if bytes > 0 {
            let mut reservations = self.reservations();
            let reserved = reservations.entry(file).or_default();
            *reserved = reserved.saturating_add(bytes);
        }
    }

    /// Takes up to `bytes` of `file`'s reservation (for growth of its chunks); how many.
    pub fn take_reserved(&self, file: FileId, bytes: u64) -> u64 {
        let mut reservations = self.reservations();
        let Some(left) = reservations.get_mut(&file) else { return 0 };
        let taken = (*left).min(bytes);
        *left -= taken;
        if *left == 0 {
            reservations.remove(&file);
        }
        taken
    }

    /// Gives back up to `bytes` of `file`'s reservation (all of it for `u64::MAX`).
    pub fn release_reserved(&self, file: FileId, bytes: u64) {
        let released = self.take_reserved(file, bytes);
        self.refund(released);
    }

    pub fn refund(&self, bytes: u64) {
        self.used_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Relaxed)
    }

    pub fn chunk_count(&self) -> u64 {
        self.chunk_count.load(Ordering::Relaxed)
    }

    /// The configured capacity, or for an unlimited store what the node can hold: its memory
    /// for `mem`, the size of the file system under the directory for `dir` (0 if unknown).
    pub fn capacity(&self) -> u64 {
        if self.capacity_bytes > 0 {
            return self.capacity_bytes;
        }
        match &self.directory {
            None => std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|text| {
                    let line = text.lines().find(|line| line.starts_with("MemTotal:"))?;
                    line.split_whitespace().nth(1)?.parse::<u64>().ok()
                })
                .map_or(0, |kibibytes| kibibytes * 1024),
            Some(directory) => directory.file_system_size().unwrap_or(0),
        }
    }

    /// Whether `bytes` more would pass what the node of a store without a capacity limit can
    /// hold ([`Space::capacity`]); false for a store with a limit (its charge decides).
    pub fn beyond_node(&self, bytes: u64) -> bool {
        let room = self.capacity();
        self.capacity_bytes == 0 && room > 0 && self.used_bytes().saturating_add(bytes) > room
    }

    /// Counts a chunk recovered from the `dir` medium.
    pub fn count_recovered(&self, stored_len: u64) {
        self.used_bytes.fetch_add(CHUNK_OVERHEAD_BYTES + stored_len, Ordering::Relaxed);
        self.chunk_count.fetch_add(1, Ordering::Relaxed);
    }

    /// Makes a chunk whose index entry is already charged ([`CHUNK_OVERHEAD_BYTES`]).
    pub fn new_chunk_charged(&self, key: ChunkKey, attr: Attr, cache: CacheState) -> Result<ChunkHandle, StoreError> {
        debug_assert_eq!(key.file, attr.file_id);
        let body = match &self.directory {
            None => Ok(Body::Memory(Arc::default())),
            Some(directory) => {
                let record = cache.backend_record();
                let state = HeaderState { pending: cache.pending, cut: None, backend_path: record.as_deref() };
                directory.create(key, &attr, state).map(Body::File)
            }
        };
        let body = body.inspect_err(|_| self.refund(CHUNK_OVERHEAD_BYTES))?;
        self.chunk_count.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(parking_lot::Mutex::new(Chunk::new(key.index, attr, body, cache))))
    }

    /// Takes a chunk that has left the index out of service and releases its space.
    pub fn discard(&self, handle: &ChunkHandle) {
        let mut chunk = handle.lock();
        if chunk.removed {
            return;
        }
        chunk.removed = true;
        let xattr_bytes = chunk.xattrs.take().map_or(0, |xattrs| crate::chunk::xattr_bytes(&xattrs));
        self.refund(CHUNK_OVERHEAD_BYTES + chunk.body.stored_len() + xattr_bytes);
        std::mem::replace(&mut chunk.body, Body::Memory(Arc::default())).remove(&self.pool);
        self.chunk_count.fetch_sub(1, Ordering::Relaxed);
    }

    /// Writes a chunk's attributes and cache state to its file (`dir` medium).
    pub fn persist(&self, chunk: &mut Chunk) -> Result<(), StoreError> {
        chunk.cache.check(&chunk.attr);
        let key = chunk.key();
        if let (Some(directory), Body::File(file)) = (&self.directory, &mut chunk.body) {
            let record = chunk.cache.backend_record();
            let state = HeaderState { pending: chunk.cache.pending, cut: chunk.cut, backend_path: record.as_deref() };
            directory.update_attr(file, key, &chunk.attr, state)?;
        }
        Ok(())
    }

    /// Makes a chunk durable (`dir` medium; a no-op in memory).
    pub fn sync(&self, chunk: &Chunk) -> Result<(), StoreError> {
        if let (Some(directory), Body::File(file)) = (&self.directory, &chunk.body) {
            directory.sync_chunk(file).map_err(StoreError::Directory)?;
        }
        Ok(())
    }

    /// Writes `source` into a chunk body; `charge` pays for the growth (the store passes its
    /// charge, which may make room first).
    pub fn fill(
        &self,
        chunk: &mut Chunk,
        offset: u64,
        source: &mut dyn ByteSource,
        charge: &dyn Fn(u64) -> Result<(), Errno>,
    ) -> Result<(), StoreError> {
        let chunk_size = chunk.attr.chunk_size as u64;
        let end = offset + source.len() as u64;
        let before = chunk.body.stored_len();
        let growth = end.saturating_sub(before);
        charge(growth)?;
        let result = chunk.body.write(offset as usize, source, chunk_size as usize, &self.pool);
        let actual_growth = chunk.body.stored_len() - before;
        self.refund(growth - actual_growth);
        Ok(result?)
    }

    /// Drops a chunk's stored bytes beyond `len` and refunds them.
    pub fn truncate(&self, chunk: &mut Chunk, len: u64) -> Result<(), Errno> {
        let before = chunk.body.stored_len();
        chunk.body.truncate(len)?;
        self.refund(before - chunk.body.stored_len());
        Ok(())
    }
}
