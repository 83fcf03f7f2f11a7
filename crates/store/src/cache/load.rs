//! Loading from the backend: entries looked up on demand, chunk bytes read on first use,
//! backend directory listings.

use std::sync::atomic::Ordering;

use ringfs_proto::path;
use ringfs_proto::{Attr, ChunkRef, DirPage, EntryFlags, Errno};

use super::{Cache, io_errno};
use crate::chunk::{Chunk, ChunkHandle};
use crate::index::{DirShard, FileShard, Index};
use crate::space::{Space, overhead_of};
use crate::{ByteSink, StoreError};

/// Backend reads a lookup makes before giving up (EAGAIN) when removals keep reaching the
/// backend in its shard meanwhile.
const MATERIALIZE_ATTEMPTS: usize = 100;

impl Cache {
    /// Looks `path` up in the backend and, if it is there (and was not removed in ringfs),
    /// stores it as a cached entry whose bytes stay in the backend. `None`: no such entry.
    pub fn materialize(&self, index: &Index, space: &Space, path: &str) -> Result<Option<ChunkHandle>, StoreError> {
        if !self.backend.covers(path) {
            return Ok(None);
        }
        // The backend is read without locks; if a removal of this shard reached the backend
        // meanwhile, what was read may be an entry removed since: read again.
        for _ in 0..MATERIALIZE_ATTEMPTS {
            let seen_removals = {
                let files = index.files_of(path);
                if files.removals.contains_key(path) {
                    return Ok(None);
                }
                files.backend_removals
            };
            let Some(attr) = self.backend.entry_attr(path, self.chunk_size).map_err(io_errno)? else { return Ok(None) };
            let link_target = if attr.is_symlink() { Some(self.backend.read_link(path).map_err(io_errno)?) } else { None };
            let parent = path::parent(path).unwrap_or("/");
            let mut dirs = index.dirs_of(parent);
            let mut files = index.files_of(path);
            if let Some(existing) = files.paths.get(path).and_then(|chunks| chunks.head.clone()) {
                return Ok(Some(existing));
            }
            if files.removals.contains_key(path) {
                return Ok(None);
            }
            if files.backend_removals != seen_removals {
                continue;
            }
            return self.insert_loaded_entry(index, space, &mut dirs, &mut files, path, attr, link_target).map(Some);
        }
        Err(Errno::EAGAIN.into())
    }

    /// Makes the entry read from the backend known here (`materialize`, with the shard
    /// locks held).
    #[allow(clippy::too_many_arguments)]
    fn insert_loaded_entry(
        &self,
        index: &Index,
        space: &Space,
        dirs: &mut DirShard,
        files: &mut FileShard,
        path: &str,
        attr: Attr,
        link_target: Option<String>,
    ) -> Result<ChunkHandle, StoreError> {
        let parent = path::parent(path).unwrap_or("/");
        self.charge(space, overhead_of(path))?;
        let handle = space.new_chunk_charged(path, 0, attr, None)?;
        if let Some(target) = link_target {
            let mut chunk = crate::chunk::lock(&handle);
            chunk.attr.flags &= !EntryFlags::BACKEND_DATA;
            let charge = |bytes| self.charge(space, bytes);
            let stored = space.fill(&mut chunk, 0, &mut target.as_bytes(), &charge).and_then(|()| space.persist(&chunk));
            drop(chunk);
            if let Err(error) = stored {
                space.discard(path, &handle);
                return Err(error);
            }
        }
        files.paths.entry(path.to_string()).or_default().head = Some(handle.clone());
        if path != "/" {
            dirs.children.entry(parent.to_string()).or_default().insert(path::file_name(path).to_string());
            index.entry_count.fetch_add(1, Ordering::Relaxed);
        }
        Ok(handle)
    }

    /// Whether a missing chunk of a file may be backend data: its start lies below the
    /// file's `backend_len` (as the caller, who has checked it, gives it).
    pub fn backend_holds(chunk: &ChunkRef, backend_len: u64, chunk_size: u32) -> bool {
        chunk.index > 0 && chunk.index.saturating_mul(chunk_size as u64) < backend_len
    }

    /// The length of a chunk whose bytes are still in the backend.
    pub fn stub_len(chunk: &ChunkRef, backend_len: u64, chunk_size: u32) -> u64 {
        backend_len.saturating_sub(chunk.index * chunk_size as u64).min(chunk_size as u64)
    }

    /// Loads a chunk's bytes from the backend into the store (under the chunk's lock, which
    /// the caller holds). ENOSPC if even eviction makes no room.
    pub fn ensure_loaded(
        &self,
        space: &Space,
        path: &str,
        chunk_index: u64,
        handle: &ChunkHandle,
        chunk: &mut Chunk,
    ) -> Result<(), StoreError> {
        if !chunk.attr.has(EntryFlags::BACKEND_DATA) {
            return Ok(());
        }
        let mut bytes = vec![0u8; chunk.attr.len as usize];
        self.backend.read_at(path, chunk_index * chunk.attr.chunk_size as u64, &mut bytes).map_err(io_errno)?;
        // The chunk has no bytes here: the fill charges its whole length.
        let charge = |bytes| self.charge(space, bytes);
        space.fill(chunk, 0, &mut &bytes[..], &charge)?;
        chunk.attr.flags &= !EntryFlags::BACKEND_DATA;
        space.persist(chunk)?;
        self.counters.loaded_chunks.fetch_add(1, Ordering::Relaxed);
        self.note_clean(path, handle, chunk, space.chunk_count());
        Ok(())
    }

    /// Serves a read of a chunk whose bytes are in the backend straight from the backend
    /// (when the store has no room to load it).
    #[allow(clippy::too_many_arguments)]
    pub fn read_from_backend(
        &self,
        path: &str,
        chunk_index: u64,
        chunk: &Chunk,
        offset: u64,
        end: u64,
        sink: &mut dyn ByteSink,
    ) -> Result<(), StoreError> {
        let mut bytes = vec![0u8; (end - offset) as usize];
        self.backend.read_at(path, chunk_index * chunk.attr.chunk_size as u64 + offset, &mut bytes).map_err(io_errno)?;
        self.counters.loaded_chunks.fetch_add(1, Ordering::Relaxed);
        sink.write_from(&bytes)?;
        Ok(())
    }

    /// One page of the backend directory behind `dir`, in name order, after `after`.
    pub fn backend_page(&self, dir: &str, after: Option<&str>, limit: usize) -> Result<DirPage, StoreError> {
        if !self.backend.covers(dir) {
            return Ok(DirPage::default());
        }
        let listing = self.backend.list(dir, self.chunk_size).map_err(io_errno)?;
        let start = after.map_or(0, |after| listing.partition_point(|(name, _)| name.as_str() <= after));
        let end = (start + limit.max(1)).min(listing.len());
        let entries = listing[start..end].iter().map(|(name, attr)| ringfs_proto::DirEntry { name: name.clone(), attr: *attr }).collect();
        Ok(DirPage { entries, more: end < listing.len(), removed: Vec::new() })
    }

    /// Every name in the backend directory behind `dir`, including entries ringfs does not
    /// show (rmdir's emptiness check: such entries keep a directory from being removed).
    pub fn backend_names(&self, dir: &str) -> Result<Vec<String>, StoreError> {
        if !self.backend.covers(dir) {
            return Ok(Vec::new());
        }
        self.backend.all_names(dir).map_err(io_errno)
    }
}
