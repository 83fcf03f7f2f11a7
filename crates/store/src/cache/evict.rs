//! A full store: eviction of clean chunks, and writes that go through to the backend when
//! only dirty data is left.

use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use ringfs_proto::{EntryFlags, Errno};

use super::{Cache, Prepare, evictable, io_errno};
use crate::chunk::ChunkHandle;
use crate::space::Space;
use crate::{ByteSource, StoreError};

impl Cache {
    /// Drops clean chunks, oldest first, until `needed` bytes are free or none is left;
    /// returns the bytes freed. Chunks that are busy are skipped (no lock is waited for).
    pub fn evict(&self, space: &Space, needed: u64) -> u64 {
        let mut freed = 0;
        let mut budget = self.clean.lock().len();
        while freed < needed && budget > 0 {
            budget -= 1;
            let Some(candidate) = self.clean.lock().pop_front() else { break };
            let handle = candidate.handle.clone();
            let Some(mut chunk) = handle.try_lock() else {
                self.clean.lock().push_back(candidate);
                continue;
            };
            chunk.cache.listed_clean = false;
            if !evictable(&chunk) {
                continue;
            }
            // Recorded before the bytes go: after a crash in between, they are read from the
            // backend again rather than found missing.
            chunk.attr.flags |= EntryFlags::BACKEND_DATA;
            if let Err(error) = space.persist(&mut chunk) {
                log::warn!("evicting a chunk of file {}: {error}", chunk.attr.file_id);
                chunk.attr.flags &= !EntryFlags::BACKEND_DATA;
                continue;
            }
            let stored = chunk.body.stored_len();
            if space.truncate(&mut chunk, 0).is_err() {
                continue;
            }
            freed += stored;
            self.counters.evicted_chunks.fetch_add(1, Ordering::Relaxed);
        }
        freed
    }

    /// A write that found the store full even after eviction: the chunk's current bytes and
    /// the new ones go to the backend file, and the chunk here keeps only its attributes
    /// (`BACKEND_DATA`). `handle` is the chunk; `prepare` reaches its inode. Returns the
    /// chunk's new length.
    pub fn write_through(
        &self,
        space: &Space,
        handle: &ChunkHandle,
        offset: u64,
        source: &mut dyn ByteSource,
        time_ns: i64,
        prepare: Prepare<'_>,
    ) -> Result<u64, StoreError> {
        let mut chunk = handle.lock();
        if chunk.removed || !chunk.attr.is_regular() {
            return Err(Errno::ESTALE.into());
        }
        let place = if chunk.index.is_first() {
            self.apply_pending(space, &mut chunk)?;
            chunk.cache.backend_path.clone().map(|path| {
                let (dev, ino) = chunk.cache.backend_identity.unwrap_or((0, 0));
                ringfs_proto::BackendPlace { path, dev, ino }
            })
        } else {
            match prepare(chunk.attr.file_id) {
                Ok(path) => path,
                Err(Errno::ESTALE) | Err(Errno::ENOENT) => return Err(Errno::ESTALE.into()),
                // A cut of the file is under way (and may need this chunk's lock): the write
                // finds the store full and cannot go through just now.
                Err(Errno::EAGAIN) => return Err(Errno::ENOSPC.into()),
                Err(errno) => return Err(errno.into()),
            }
        };
        // A file without a backend name cannot go through: the store is simply full.
        let Some(place) = place else { return Err(Errno::ENOSPC.into()) };
        // The file is there: made by the inode's pending creation, applied above or by
        // `prepare`. Missing, it was moved by a rename since (ENOENT: the server asks again
        // where it is, `Data::across_backend_moves`); made here, it would be a stray file.
        let file = self.backend.open_existing(&place.path).map_err(io_errno)?;
        if !crate::backend::is_file(&file, place.identity()).map_err(io_errno)? {
            // The path is another file's now (a rename over this file under way).
            return Err(Errno::ENOSPC.into());
        }
        let chunk_start = chunk.first_byte();
        // The bytes held here go first, so the backend file holds the whole chunk.
        if !chunk.attr.has(EntryFlags::BACKEND_DATA) {
            let held = chunk.body.snapshot()?;
            file.write_all_at(&held[..held.len().min(chunk.attr.len as usize)], chunk_start).map_err(io_errno)?;
            // Recorded before the bytes go (see `evict`).
            chunk.attr.flags |= EntryFlags::BACKEND_DATA;
            space.persist(&mut chunk)?;
            space.truncate(&mut chunk, 0)?;
        }
        let mut bytes = vec![0u8; source.len()];
        source.read_into(crate::io::as_uninit(&mut bytes))?;
        file.write_all_at(&bytes, chunk_start + offset).map_err(io_errno)?;
        let len = chunk.attr.len.max(offset + bytes.len() as u64);
        crate::backend::extend_to(&file, chunk_start + len).map_err(io_errno)?;
        self.backend_changed();
        chunk.attr.len = len;
        chunk.attr.mtime_ns = time_ns;
        chunk.attr.ctime_ns = time_ns;
        chunk.attr.flags &= !EntryFlags::DIRTY;
        if chunk.index.is_first() {
            chunk.attr.flags |= EntryFlags::IN_BACKEND;
        }
        chunk.version.bump();
        space.persist(&mut chunk)?;
        self.counters.written_through_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(len)
    }
}
