//! Loading from the backend: names looked up on demand (an entry and an inode), chunk bytes
//! read on first use, backend directory listings.

use std::sync::atomic::Ordering;

use ringfs_proto::path;
use ringfs_proto::{Attr, ChunkKey, DirEntry, DirPage, EntryFlags, EntryRef, Errno, FileId};

use super::{Cache, io_errno};
use crate::chunk::{CacheState, Chunk, ChunkHandle};
use crate::index::{Entry, Index};
use crate::space::{CHUNK_OVERHEAD_BYTES, Space, entry_cost};
use crate::{ByteSink, StoreError};

/// Backend reads a lookup makes before giving up (EAGAIN) when removals keep reaching the
/// backend in its shard meanwhile.
const MATERIALIZE_ATTEMPTS: usize = 100;

impl Cache {
    /// Looks `path` up in the backend and, if it is there (and was not removed in ringfs),
    /// stores it here: an entry, and an inode (with `anchor`, the placement hash of the path,
    /// so the inode lives on this store) whose bytes stay in the backend. `None`: no such
    /// entry. The root of the cached tree is answered by every store's root.
    pub fn materialize(&self, index: &Index, space: &Space, path: &str, anchor: u32) -> Result<Option<Entry>, StoreError> {
        if !self.backend.covers(path) || path == "/" {
            return Ok(None);
        }
        // The backend is read without locks; if a removal of this shard reached the backend
        // meanwhile, what was read may be an entry removed since: read again.
        for _ in 0..MATERIALIZE_ATTEMPTS {
            let seen_removals = {
                let names = index.names_of(path);
                if names.removals.contains_key(path) {
                    return Ok(None);
                }
                names.backend_removals
            };
            let Some((mut attr, identity)) = self.backend.entry(path, self.chunk_size).map_err(io_errno)? else { return Ok(None) };
            attr.file_id.anchor = anchor;
            let link_target = if attr.is_symlink() { Some(self.backend.read_link(path).map_err(io_errno)?) } else { None };
            let parent = path::parent(path).unwrap_or("/");
            let mut dirs = index.dirs_of(parent);
            let mut names = index.names_of(path);
            if let Some(existing) = names.entries.get(path) {
                return Ok(Some(*existing));
            }
            if names.removals.contains_key(path) {
                return Ok(None);
            }
            if names.backend_removals != seen_removals {
                continue;
            }
            let entry = Entry { target: EntryRef { file: attr.file_id, kind_bits: attr.mode & 0o170000 }, removing: false };
            self.insert_loaded_inode(index, space, path, attr, identity, link_target)?;
            self.charge(space, entry_cost(path))?;
            if let Some(directory) = &space.directory {
                directory.put_entry(path, entry.target).map_err(StoreError::Directory)?;
            }
            names.entries.insert(path.to_string(), entry);
            dirs.add_child(path);
            index.entry_count.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(entry));
        }
        Err(StoreError::NameBeingRemoved)
    }

    /// Stores the inode of a file found in the backend (unless it is here already: the same
    /// backend file is found under the same id every time).
    fn insert_loaded_inode(
        &self,
        index: &Index,
        space: &Space,
        path: &str,
        attr: Attr,
        identity: (u64, u64),
        link_target: Option<String>,
    ) -> Result<(), StoreError> {
        let file = attr.file_id;
        if index.inode(file).is_some() {
            return Ok(());
        }
        self.charge(space, CHUNK_OVERHEAD_BYTES)?;
        let cache = CacheState { backend_path: Some(path.to_string()), backend_identity: Some(identity), ..CacheState::default() };
        let handle = space.new_chunk_charged(ChunkKey::inode(file), attr, cache)?;
        // Extended attributes come along (a failure to read them is not a failure to load).
        if attr.is_regular() || attr.is_dir() {
            match self.backend.read_xattrs(path) {
                Ok(xattrs) if !xattrs.is_empty() => {
                    let mut chunk = handle.lock();
                    let kept = match (&space.directory, &chunk.body) {
                        (Some(directory), crate::body::Body::File(body)) => directory.write_xattrs(body, &xattrs),
                        _ => Ok(()),
                    };
                    match kept {
                        Ok(()) => {
                            space.charge_anyway(crate::chunk::xattr_bytes(&xattrs));
                            chunk.set_xattrs(xattrs);
                        }
                        Err(error) => log::warn!("cannot keep the extended attributes of {path}: {error}"),
                    }
                }
                Ok(_) => {}
                Err(error) => log::info!("extended attributes of {path} in the backend: {error}"),
            }
        }
        if let Some(target) = link_target {
            let mut chunk = handle.lock();
            chunk.attr.flags &= !EntryFlags::BACKEND_DATA;
            let charge = |bytes| self.charge(space, bytes);
            let stored = space.fill(&mut chunk, 0, &mut target.as_bytes(), &charge).and_then(|()| space.persist(&mut chunk));
            drop(chunk);
            if let Err(error) = stored {
                space.discard(&handle);
                return Err(error);
            }
        }
        index.files_of(file).files.entry(file).or_default().inode.get_or_insert(handle);
        Ok(())
    }

    /// Whether a missing chunk of a file may be backend data: its start lies below the
    /// file's `backend_len` (as the caller, who has checked it, gives it).
    pub fn backend_holds(key: ChunkKey, backend_len: u64, chunk_size: u32) -> bool {
        !key.is_inode() && key.index.checked_first_byte(chunk_size.into()).is_some_and(|start| start < backend_len)
    }

    /// The length of a chunk whose bytes are still in the backend.
    pub fn stub_len(key: ChunkKey, backend_len: u64, chunk_size: u32) -> u64 {
        let start = key.index.checked_first_byte(chunk_size.into());
        start.map_or(0, |start| backend_len.saturating_sub(start)).min(chunk_size.into())
    }

    /// Loads a chunk's bytes from the backend into the store (under the chunk's lock, which
    /// the caller holds). The backend file is the inode's own backend path for chunk 0, and
    /// `backend_path` (as the inode's server gave it) for the others. ENOSPC if even eviction
    /// makes no room.
    pub fn ensure_loaded(
        &self,
        space: &Space,
        handle: &ChunkHandle,
        chunk: &mut Chunk,
        backend_path: Option<&str>,
    ) -> Result<(), StoreError> {
        if !chunk.attr.has(EntryFlags::BACKEND_DATA) {
            return Ok(());
        }
        let path = chunk.cache.backend_path.clone().or(backend_path.map(str::to_string)).ok_or(Errno::EIO)?;
        let mut bytes = vec![0u8; chunk.attr.len as usize];
        self.backend.read_at(&path, chunk.first_byte(), &mut bytes).map_err(io_errno)?;
        // The chunk has no bytes here: the fill charges its whole length.
        let charge = |bytes| self.charge(space, bytes);
        space.fill(chunk, 0, &mut &bytes[..], &charge)?;
        chunk.attr.flags &= !EntryFlags::BACKEND_DATA;
        space.persist(chunk)?;
        self.counters.loaded_chunks.fetch_add(1, Ordering::Relaxed);
        self.note_clean(handle, chunk, space.chunk_count());
        Ok(())
    }

    /// Serves a read of a chunk whose bytes are in the backend straight from the backend
    /// (when the store has no room to load it).
    pub fn read_from_backend(
        &self,
        chunk: &Chunk,
        backend_path: Option<&str>,
        offset: u64,
        end: u64,
        sink: &mut dyn ByteSink,
    ) -> Result<(), StoreError> {
        let path = chunk.cache.backend_path.as_deref().or(backend_path).ok_or(Errno::EIO)?;
        let mut bytes = vec![0u8; (end - offset) as usize];
        self.backend.read_at(path, chunk.first_byte() + offset, &mut bytes).map_err(io_errno)?;
        self.counters.loaded_chunks.fetch_add(1, Ordering::Relaxed);
        sink.write_from(&bytes)?;
        Ok(())
    }

    /// One page of the backend directory behind `dir`, in name order, after `after`; each
    /// entry's file id gets the anchor of its path.
    pub fn backend_page(
        &self,
        dir: &str,
        after: Option<&str>,
        limit: usize,
        anchor_of: &dyn Fn(&str) -> u32,
    ) -> Result<DirPage, StoreError> {
        if !self.backend.covers(dir) {
            return Ok(DirPage::default());
        }
        let listing = self.backend.list(dir, self.chunk_size).map_err(io_errno)?;
        let start = after.map_or(0, |after| listing.partition_point(|(name, _)| name.as_str() <= after));
        let end = (start + limit.max(1)).min(listing.len());
        let entries = listing[start..end]
            .iter()
            .map(|(name, attr)| {
                let file = FileId { anchor: anchor_of(&path::join(dir, name)), serial: attr.file_id.serial };
                let attr = Attr { file_id: file, ..*attr };
                DirEntry { name: name.clone(), entry: EntryRef { file, kind_bits: attr.mode & 0o170000 }, attr: Some(attr) }
            })
            .collect();
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
