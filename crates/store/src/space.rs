//! Where a store keeps chunk bytes and what they cost: the medium (`mem` or `dir`), the pool
//! of buffers of removed chunks, and the capacity account.
//!
//! Every chunk is charged a fixed overhead for its index entry plus its stored bytes, so a
//! store full of empty files also reports ENOSPC. [`Space::charge`] only refuses; making room
//! (cache mode's eviction) is the store's decision.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ringfs_proto::{Attr, Errno};

use crate::body::Body;
use crate::chunk::{Chunk, ChunkHandle, PendingOp, lock};
use crate::directory::ChunkDirectory;
use crate::pool::BufferPool;
use crate::{ByteSource, StoreError};

/// Capacity charged per chunk for its index entry, on top of its bytes.
const CHUNK_OVERHEAD_BYTES: u64 = 128;

/// Most bytes of removed chunks' buffers kept for new chunks (see `pool`).
const POOL_LIMIT_BYTES: usize = 512 << 20;

/// What an index entry of a chunk of `path` costs.
pub(crate) fn overhead_of(path: &str) -> u64 {
    CHUNK_OVERHEAD_BYTES + path.len() as u64
}

/// The medium, the buffer pool and the capacity account of one store.
pub(crate) struct Space {
    pub directory: Option<ChunkDirectory>,
    pool: BufferPool,
    capacity_bytes: u64,
    used_bytes: AtomicU64,
    chunk_count: AtomicU64,
}

impl Space {
    pub fn new(directory: Option<ChunkDirectory>, capacity_bytes: u64) -> Space {
        Space {
            directory,
            pool: BufferPool::new(POOL_LIMIT_BYTES),
            capacity_bytes,
            used_bytes: AtomicU64::new(0),
            chunk_count: AtomicU64::new(0),
        }
    }

    /// Charges `bytes` against the capacity; ENOSPC if they do not fit.
    pub fn charge(&self, bytes: u64) -> Result<(), Errno> {
        if bytes == 0 {
            return Ok(());
        }
        if self.capacity_bytes == 0 {
            self.used_bytes.fetch_add(bytes, Ordering::Relaxed);
            return Ok(());
        }
        self.used_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.capacity_bytes)
            })
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

    /// Counts a chunk recovered from the `dir` medium (charged by the caller).
    pub fn count_recovered(&self, path: &str, stored_len: u64) {
        self.used_bytes.fetch_add(overhead_of(path) + stored_len, Ordering::Relaxed);
        self.chunk_count.fetch_add(1, Ordering::Relaxed);
    }

    /// Makes a chunk whose index entry is already charged.
    pub fn new_chunk_charged(&self, path: &str, index: u64, attr: Attr, pending: Option<PendingOp>) -> Result<ChunkHandle, StoreError> {
        let body = match &self.directory {
            None => Ok(Body::Memory(Arc::default())),
            Some(directory) => directory.create(path, index, &attr, pending).map(Body::File),
        };
        let body = body.inspect_err(|_| self.refund(overhead_of(path)))?;
        self.chunk_count.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(std::sync::Mutex::new(Chunk::new(attr, body, pending))))
    }

    /// Takes a chunk that has left the index out of service and releases its space.
    pub fn discard(&self, path: &str, handle: &ChunkHandle) {
        let mut chunk = lock(handle);
        if chunk.removed {
            return;
        }
        chunk.removed = true;
        self.refund(overhead_of(path) + chunk.body.stored_len());
        std::mem::replace(&mut chunk.body, Body::Memory(Arc::default())).remove(&self.pool);
        self.chunk_count.fetch_sub(1, Ordering::Relaxed);
    }

    /// Writes a chunk's attributes and pending operation to its file (`dir` medium).
    pub fn persist(&self, chunk: &Chunk) -> Result<(), StoreError> {
        chunk.cache.check(&chunk.attr);
        if let (Some(directory), Body::File(file)) = (&self.directory, &chunk.body) {
            directory.update_attr(file, &chunk.attr, chunk.cache.pending)?;
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
