//! A global array: byte ranges cut at block boundaries, each piece sent to its block's home
//! (all pieces of one call at once), for blocking, non-blocking and strided transfers and
//! atomics.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ringfs_proto::gmem::{ArrayLayout, AtomicOp, BlockRange, CacheMode, CompareSwap, Distribution, GmemAlloc, GmemAtomic, GmemFree};
use ringfs_proto::{Errno, ReadReply, Request, Response};

use crate::Result;
use crate::cache::{BlockCache, Use};
use crate::layout::home_index;
use crate::pending::{GetHandle, PutHandle};
use crate::world::World;

/// An array of global memory (see the crate doc). Cheap to clone; thread-safe.
#[derive(Clone)]
pub struct GlobalArray {
    world: World,
    layout: Arc<ArrayLayout>,
    freed: Arc<AtomicBool>,
}

/// A 2-D tile of an array seen as rows of `pitch` bytes: `rows` rows of `row_bytes` bytes,
/// the first starting at byte `offset` of the array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    pub offset: u64,
    pub pitch: u64,
    pub rows: u64,
    pub row_bytes: u64,
}

/// Pieces at least this large are leased from a home on this host (smaller ones are cheaper
/// inline).
const LEASE_THRESHOLD: usize = 32 * 1024;

/// The part of a transfer inside one block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    block: u64,
    offset: u32,
    len: u32,
}

/// A raw pointer moved to a worker thread by an implicit operation (the caller promised the
/// memory stays valid until `quiet`).
struct CallerMemory(*mut u8, usize);

// SAFETY: the C-style contract of the `_nbi` calls: the memory is the caller's, untouched by
// it until the operation completes.
unsafe impl Send for CallerMemory {}

impl GlobalArray {
    pub(crate) fn new(world: World, layout: ArrayLayout) -> GlobalArray {
        GlobalArray { world, layout: Arc::new(layout), freed: Arc::new(AtomicBool::new(false)) }
    }

    /// The array for a job on the worker threads (which must not hold the application's
    /// side of the world open: see `World`).
    fn for_background(&self) -> GlobalArray {
        GlobalArray { world: self.world.for_background(), layout: self.layout.clone(), freed: self.freed.clone() }
    }

    /// The array's id (the same on every rank).
    pub fn id(&self) -> u64 {
        self.layout.array
    }

    pub fn len(&self) -> u64 {
        self.layout.len
    }

    pub fn is_empty(&self) -> bool {
        self.layout.len == 0
    }

    pub fn block_size(&self) -> u32 {
        self.layout.block_size
    }

    /// The server homing the byte at `offset`.
    pub fn home_of(&self, offset: u64) -> &str {
        &self.layout.homes[home_index(&self.layout, offset / u64::from(self.layout.block_size))]
    }

    pub(crate) fn layout(&self) -> Arc<ArrayLayout> {
        self.layout.clone()
    }

    pub(crate) fn mark_freed(&self) {
        self.freed.store(true, Ordering::Release);
    }

    /// ESTALE for a freed array, EFAULT for a range leaving it.
    fn check(&self, offset: u64, len: u64) -> Result<()> {
        if self.freed.load(Ordering::Acquire) {
            return Err(Errno::ESTALE);
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.layout.len => Ok(()),
            _ => Err(Errno::EFAULT),
        }
    }

    /// `offset..offset + len` cut at block boundaries.
    fn pieces(&self, offset: u64, len: u64) -> Vec<Piece> {
        let block_size = u64::from(self.layout.block_size);
        let mut pieces = Vec::new();
        let (mut at, end) = (offset, offset + len);
        while at < end {
            let block = at / block_size;
            let inside = at - block * block_size;
            let piece = (block_size - inside).min(end - at);
            pieces.push(Piece { block, offset: inside as u32, len: piece as u32 });
            at += piece;
        }
        pieces
    }

    fn range(&self, piece: Piece) -> BlockRange {
        BlockRange { array: self.layout.array, block: piece.block, offset: piece.offset, len: piece.len }
    }

    /// This rank's cache, if the array is cached.
    fn cache(&self) -> Option<&BlockCache> {
        self.world.inner.cache.as_ref().filter(|_| self.layout.cache != CacheMode::Uncached)
    }

    /// Runs `op` on a block in this rank's cache (fetching it if needed), then fetches the
    /// next blocks ahead when the accesses are sequential.
    fn through_cache(&self, cache: &BlockCache, block: u64, usage: Use, op: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        let inner = &self.world.inner;
        let send = |home: &str, request: &Request, data: &[u8]| inner.call(home, request, data);
        cache.access(&self.layout, block, usage, &send, op)?;
        if usage == Use::Read {
            self.fetch_ahead(cache.prefetch_after(&self.layout, block));
        }
        Ok(())
    }

    /// Starts fetching `blocks` into this rank's cache (for reading), on the worker threads.
    fn fetch_ahead(&self, blocks: Vec<u64>) {
        let inner = &self.world.inner;
        for ahead in blocks {
            let array = self.for_background();
            inner.pool.spawn(move || {
                if let Some(cache) = array.cache() {
                    let inner = &array.world.inner;
                    let send = |home: &str, request: &Request, data: &[u8]| inner.call(home, request, data);
                    let _ = cache.access(&array.layout, ahead, Use::Read, &send, &mut |_| {});
                }
            });
        }
    }

    /// Reads each `(array offset, destination)` segment, all pieces at once. From a home on
    /// this host, pieces of [`LEASE_THRESHOLD`] bytes or more are *leased*: the home lends
    /// the block's bytes and they are copied straight out of its memory (one copy, no
    /// socket).
    fn read_segments(&self, segments: Vec<(u64, &mut [u8])>) -> Result<()> {
        let inner = &self.world.inner;
        if let Some(cache) = self.cache() {
            for (offset, destination) in segments {
                self.check(offset, destination.len() as u64)?;
                let mut rest = destination;
                let pieces = self.pieces(offset, rest.len() as u64);
                // The blocks after the first are fetched at once, while this thread waits
                // for the first (if the cache has room for them all).
                let blocks: Vec<u64> = pieces.iter().skip(1).map(|piece| piece.block).collect();
                self.fetch_ahead(cache.missing(&self.layout, &blocks));
                for piece in pieces {
                    let (into, tail) = std::mem::take(&mut rest).split_at_mut(piece.len as usize);
                    rest = tail;
                    let start = piece.offset as usize;
                    self.through_cache(cache, piece.block, Use::Read, &mut |block| {
                        into.copy_from_slice(&block[start..start + into.len()])
                    })?;
                }
            }
            return Ok(());
        }
        let mut work = Vec::new();
        for (offset, destination) in segments {
            self.check(offset, destination.len() as u64)?;
            let mut rest = destination;
            for piece in self.pieces(offset, rest.len() as u64) {
                let (into, tail) = std::mem::take(&mut rest).split_at_mut(piece.len as usize);
                rest = tail;
                work.push((piece, into, inner.connection(&self.layout.homes[home_index(&self.layout, piece.block)])?));
            }
        }
        let mut leases = Vec::new();
        let mut outcome = Ok(());
        {
            let calls: Vec<_> = work
                .iter_mut()
                .enumerate()
                .map(|(index, (piece, into, connection))| {
                    let range = self.range(*piece);
                    let leased = piece.len as usize >= LEASE_THRESHOLD && connection.server_memory().is_some();
                    let request = if leased { Request::GmemLease(range) } else { Request::GmemRead(range) };
                    let call = connection.start(&request, &[], Some(&mut **into));
                    (index, piece.len, connection.clone(), call)
                })
                .collect();
            for (index, len, connection, call) in calls {
                let checked = inner.client.finish_call(&connection, call).and_then(|reply| match reply.response {
                    Response::Read(ReadReply { lease: Some(lease), len: leased, .. }) if leased == u64::from(len) => {
                        leases.push((index, lease));
                        Ok(())
                    }
                    _ if reply.data_len == len as usize && reply.data.is_empty() => Ok(()),
                    other => {
                        log::warn!(
                            "global memory: a read of {len} bytes was answered {other:?} with {} bytes ({} not in place)",
                            reply.data_len,
                            reply.data.len()
                        );
                        Err(Errno::EIO)
                    }
                });
                if outcome.is_ok() {
                    outcome = checked;
                }
            }
        }
        for (index, lease) in leases {
            let (_, into, connection) = &mut work[index];
            let copied = match connection.server_memory() {
                Some(memory) => memory.read_bytes(lease.address, into).map_err(|error| {
                    log::warn!("global memory: copying leased bytes failed: {error}");
                    Errno::EIO
                }),
                None => Err(Errno::EPROTO),
            };
            inner.client.release_leases(connection, vec![lease.id]);
            if outcome.is_ok() {
                outcome = copied;
            }
        }
        outcome
    }

    /// Writes each `(array offset, source)` segment, all pieces at once.
    fn write_segments(&self, segments: Vec<(u64, &[u8])>) -> Result<()> {
        let inner = &self.world.inner;
        if let Some(cache) = self.cache() {
            for (offset, source) in segments {
                self.check(offset, source.len() as u64)?;
                let mut rest = source;
                for piece in self.pieces(offset, rest.len() as u64) {
                    let (from, tail) = rest.split_at(piece.len as usize);
                    rest = tail;
                    let usage = if piece.offset == 0 && piece.len == self.layout.block_size { Use::Overwrite } else { Use::Write };
                    let start = piece.offset as usize;
                    self.through_cache(cache, piece.block, usage, &mut |block| block[start..start + from.len()].copy_from_slice(from))?;
                }
            }
            return Ok(());
        }
        let mut work = Vec::new();
        for (offset, source) in segments {
            self.check(offset, source.len() as u64)?;
            let mut rest = source;
            for piece in self.pieces(offset, rest.len() as u64) {
                let (from, tail) = rest.split_at(piece.len as usize);
                rest = tail;
                work.push((piece, from, inner.connection(&self.layout.homes[home_index(&self.layout, piece.block)])?));
            }
        }
        let calls: Vec<_> = work
            .iter()
            .map(|(piece, from, connection)| (connection, connection.start(&Request::GmemWrite(self.range(*piece)), from, None)))
            .collect();
        let mut outcome = Ok(());
        for (connection, call) in calls {
            let done = inner.client.finish_call(connection, call).map(drop);
            if outcome.is_ok() {
                outcome = done;
            }
        }
        outcome
    }

    /// Copies `into.len()` bytes from the array at `offset` (blocking).
    pub fn get(&self, offset: u64, into: &mut [u8]) -> Result<()> {
        self.read_segments(vec![(offset, into)])
    }

    /// Copies `from` into the array at `offset` (blocking: complete when it returns).
    pub fn put(&self, offset: u64, from: &[u8]) -> Result<()> {
        self.write_segments(vec![(offset, from)])
    }

    /// Starts a get of `len` bytes at `offset`; the handle gives them.
    pub fn get_nb(&self, offset: u64, len: usize) -> GetHandle {
        let (handle, sender) = GetHandle::new();
        let array = self.for_background();
        self.world.inner.pool.spawn(move || {
            let mut bytes = vec![0u8; len];
            let _ = sender.send(array.get(offset, &mut bytes).map(|()| bytes));
        });
        handle
    }

    /// Starts a put of `bytes` at `offset`; the handle gives the buffer back when complete.
    pub fn put_nb(&self, offset: u64, bytes: Vec<u8>) -> PutHandle {
        let (handle, sender) = PutHandle::new();
        let array = self.for_background();
        self.world.inner.pool.spawn(move || {
            let _ = sender.send(array.put(offset, &bytes).map(|()| bytes));
        });
        handle
    }

    /// Starts a put of `bytes` at `offset`, completed by [`World::quiet`].
    pub fn put_nbi(&self, offset: u64, bytes: Vec<u8>) {
        let implicit = self.world.inner.implicit.clone();
        implicit.begin();
        let array = self.for_background();
        self.world.inner.pool.spawn(move || implicit.end(array.put(offset, &bytes)));
    }

    /// Starts a get of `len` bytes at `offset` into `into`, completed by [`World::quiet`].
    ///
    /// # Safety
    /// `into` must point to `len` writable bytes that stay valid, and that the caller does
    /// not touch, until `quiet` returns.
    pub unsafe fn get_nbi_raw(&self, offset: u64, into: *mut u8, len: usize) {
        let implicit = self.world.inner.implicit.clone();
        implicit.begin();
        let (array, memory) = (self.for_background(), CallerMemory(into, len));
        self.world.inner.pool.spawn(move || {
            let memory = memory;
            // SAFETY: the caller's contract above.
            let into = unsafe { std::slice::from_raw_parts_mut(memory.0, memory.1) };
            implicit.end(array.get(offset, into));
        });
    }

    /// Starts a put of `len` bytes from `from` at `offset`, completed by [`World::quiet`].
    ///
    /// # Safety
    /// `from` must point to `len` readable bytes that stay valid and unchanged until `quiet`
    /// returns.
    pub unsafe fn put_nbi_raw(&self, offset: u64, from: *const u8, len: usize) {
        let implicit = self.world.inner.implicit.clone();
        implicit.begin();
        let (array, memory) = (self.for_background(), CallerMemory(from as *mut u8, len));
        self.world.inner.pool.spawn(move || {
            let memory = memory;
            // SAFETY: the caller's contract above.
            let from = unsafe { std::slice::from_raw_parts(memory.0, memory.1) };
            implicit.end(array.put(offset, from));
        });
    }

    /// Reads a tile into `into`, whose rows are `into_pitch` bytes apart (all rows at once).
    pub fn get_2d(&self, tile: Tile, into: &mut [u8], into_pitch: usize) -> Result<()> {
        let segments = tile_segments(tile, into_pitch, into.len())?;
        let mut rows = Vec::with_capacity(segments.len());
        let mut rest = into;
        let mut taken = 0;
        for (offset, start) in segments {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - taken);
            let (row, tail) = tail.split_at_mut(tile.row_bytes as usize);
            rest = tail;
            taken = start + tile.row_bytes as usize;
            rows.push((offset, row));
        }
        self.read_segments(rows)
    }

    /// Writes a tile from `from`, whose rows are `from_pitch` bytes apart (all rows at once).
    pub fn put_2d(&self, tile: Tile, from: &[u8], from_pitch: usize) -> Result<()> {
        let segments = tile_segments(tile, from_pitch, from.len())?;
        let rows = segments.into_iter().map(|(offset, start)| (offset, &from[start..start + tile.row_bytes as usize])).collect();
        self.write_segments(rows)
    }

    /// Adds `value` to the 64-bit word at `offset` (8-byte aligned) atomically; the word
    /// before.
    pub fn fetch_add(&self, offset: u64, value: u64) -> Result<u64> {
        self.atomic(offset, AtomicOp::FetchAdd(value))
    }

    /// Sets the 64-bit word at `offset` to `new` if it is `expected`, atomically; the word
    /// before (the swap happened if it equals `expected`).
    pub fn compare_swap(&self, offset: u64, expected: u64, new: u64) -> Result<u64> {
        self.atomic(offset, AtomicOp::CompareSwap(CompareSwap { expected, new }))
    }

    fn atomic(&self, offset: u64, op: AtomicOp) -> Result<u64> {
        self.check(offset, 8)?;
        if !offset.is_multiple_of(8) {
            return Err(Errno::EINVAL);
        }
        let piece = self.pieces(offset, 8)[0];
        if let Some(cache) = self.cache() {
            // The word is changed in this rank's exclusive copy of the block.
            let mut old = 0;
            let start = piece.offset as usize;
            self.through_cache(cache, piece.block, Use::Write, &mut |block| {
                let word = &mut block[start..start + 8];
                old = u64::from_le_bytes(word.try_into().expect("8 bytes"));
                word.copy_from_slice(&op.apply(old).to_le_bytes());
            })?;
            return Ok(old);
        }
        let home = &self.layout.homes[home_index(&self.layout, piece.block)];
        match self.world.inner.call(home, &Request::GmemAtomic(GmemAtomic { at: self.range(piece), op }), &[])?.response {
            Response::Count(old) => Ok(old),
            _ => Err(Errno::EPROTO),
        }
    }
}

/// The rows of `tile`: each row's offset in the array and in the local buffer (rows
/// `pitch` bytes apart), checked to fit a buffer of `buffer_len` bytes.
fn tile_segments(tile: Tile, pitch: usize, buffer_len: usize) -> Result<Vec<(u64, usize)>> {
    if tile.rows == 0 || tile.row_bytes == 0 {
        return Ok(Vec::new());
    }
    let row_bytes = usize::try_from(tile.row_bytes).map_err(|_| Errno::EINVAL)?;
    if pitch < row_bytes || tile.pitch < tile.row_bytes {
        return Err(Errno::EINVAL);
    }
    let last_start = pitch.checked_mul(tile.rows as usize - 1).ok_or(Errno::EINVAL)?;
    if last_start.checked_add(row_bytes).is_none_or(|end| end > buffer_len) {
        return Err(Errno::EFAULT);
    }
    (0..tile.rows)
        .map(|row| {
            let offset = row.checked_mul(tile.pitch).and_then(|at| at.checked_add(tile.offset)).ok_or(Errno::EFAULT)?;
            Ok((offset, row as usize * pitch))
        })
        .collect()
}

/// Collective allocation and freeing of arrays (with the array they make, so that `world`
/// needs nothing of this module).
impl World {
    /// Allocates an array of `len` bytes in blocks of `block_size` bytes (a power of two
    /// up to 16 MiB) placed by `distribution` — collectively: every rank calls it with the
    /// same arguments, in the same order as its other allocations, and all get the same
    /// array. Its bytes start as zeros.
    pub fn alloc(&self, len: u64, distribution: Distribution, block_size: u32) -> Result<GlobalArray> {
        let identity = self.inner.identity;
        let request = Request::GmemAlloc(GmemAlloc {
            job: identity.job,
            sequence: self.inner.allocations.fetch_add(1, Ordering::Relaxed),
            rank: identity.rank,
            ranks: identity.ranks,
            host_id: ringfs_rpc::transport::local_host_id(),
            len,
            block_size,
            distribution,
            cache: self.inner.cache.as_ref().map_or(CacheMode::Uncached, |cache| cache.config.mode()),
            endpoint: self.inner.cache.as_ref().map_or_else(String::new, |cache| cache.endpoint().to_string()),
        });
        match self.inner.until_everyone(&request)? {
            Response::GmemArray(layout) => {
                let array = GlobalArray::new(self.clone(), layout);
                if let Some(cache) = &self.inner.cache {
                    cache.add_array(array.layout());
                }
                Ok(array)
            }
            _ => Err(Errno::EPROTO),
        }
    }

    /// Frees `array` — collectively: its blocks go once every rank has freed it. Accesses
    /// through this rank fail with ESTALE afterwards.
    pub fn free(&self, array: &GlobalArray) -> Result<()> {
        self.quiet()?;
        array.mark_freed();
        if let Some(cache) = &self.inner.cache {
            cache.drop_array(array.id());
        }
        let identity = self.inner.identity;
        let request = Request::GmemFree(GmemFree { job: identity.job, array: array.id(), rank: identity.rank, ranks: identity.ranks });
        self.inner.call(&self.inner.coordinator, &request, &[]).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_map_rows_to_the_array_and_the_buffer() {
        let tile = Tile { offset: 100, pitch: 1000, rows: 3, row_bytes: 10 };
        assert_eq!(tile_segments(tile, 16, 42).unwrap(), [(100, 0), (1100, 16), (2100, 32)]);
        assert_eq!(tile_segments(tile, 16, 41), Err(Errno::EFAULT), "the buffer is too short");
        assert_eq!(tile_segments(tile, 8, 100), Err(Errno::EINVAL), "rows overlap in the buffer");
    }
}
