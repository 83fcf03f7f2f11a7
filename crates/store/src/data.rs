//! Operations on chunk data: stat, read, write, lengths and attributes, and (cache mode) the
//! loading and flushing steps the server drives.

use std::sync::Arc;

use ringfs_proto::{Attr, ChunkRef, ChunkTemplate, EntryFlags, Errno, FileKind};

use crate::body::Body;
use crate::chunk::{ChunkHandle, lock};
use crate::store::ChunkStore;
use crate::{ByteSink, ByteSource, StoreError};

/// Result of [`ChunkStore::read_shared`].
#[derive(Debug)]
pub struct SharedRead {
    /// `None` if the chunk does not exist.
    pub attr: Option<Attr>,
    /// Bytes the read yields (stored bytes, then zeros).
    pub len: u64,
    /// The chunk's buffer and the range of it that holds the read's stored bytes; `None` for
    /// chunks that are not in memory.
    pub bytes: Option<(Arc<Vec<u8>>, std::ops::Range<usize>)>,
}

impl ChunkStore {
    // ----- chunk data -----------------------------------------------------------------------

    /// Attributes of a chunk. Chunk 0 is looked up by path (checked against `file_id` unless
    /// it is 0); later chunks by path, index and file id.
    pub fn stat(&self, chunk: &ChunkRef) -> Result<Attr, StoreError> {
        let handle = if chunk.index == 0 {
            self.head_checked(&chunk.path, chunk.file_id)?
        } else {
            self.index.find_tail(chunk).ok_or(Errno::ENOENT)?
        };
        let chunk = lock(&handle);
        if chunk.removed {
            return Err(Errno::ENOENT.into());
        }
        Ok(chunk.attr)
    }

    /// Writes `source` at `offset` inside a chunk and returns the chunk's new logical length.
    /// Chunk 0 must exist; later chunks are created from `template`.
    pub fn write(
        &self,
        chunk_ref: &ChunkRef,
        offset: u64,
        source: &mut dyn ByteSource,
        template: ChunkTemplate,
        time_ns: i64,
    ) -> Result<u64, StoreError> {
        let handle = self.data_chunk(chunk_ref, template, time_ns)?;
        let mut chunk = lock(&handle);
        if chunk.removed {
            return Err(Errno::ESTALE.into());
        }
        match chunk.attr.kind() {
            Some(FileKind::Regular) => {}
            Some(FileKind::Directory) => return Err(Errno::EISDIR.into()),
            _ => return Err(Errno::EINVAL.into()),
        }
        let end = offset.checked_add(source.len() as u64).ok_or(Errno::EINVAL)?;
        if end > chunk.attr.chunk_size as u64 {
            return Err(Errno::EINVAL.into());
        }
        self.ensure_loaded(&chunk_ref.path, chunk_ref.index, &handle, &mut chunk)?;
        self.fill(&mut chunk, offset, source)?;
        chunk.attr.len = chunk.attr.len.max(end);
        chunk.attr.mtime_ns = time_ns;
        chunk.attr.ctime_ns = time_ns;
        self.touched(&chunk_ref.path, chunk_ref.index, &mut chunk);
        self.persist(&chunk)?;
        Ok(chunk.attr.len)
    }

    /// Whether this store holds the chunk (for chunk 0: the entry).
    pub fn holds_chunk(&self, chunk: &ChunkRef) -> bool {
        if chunk.index == 0 { self.index.head(&chunk.path).is_some() } else { self.index.find_tail(chunk).is_some() }
    }

    /// The chunk a read addresses; `None` for a chunk after chunk 0 that does not exist.
    fn chunk_for_read(&self, chunk_ref: &ChunkRef, backend_len: u64) -> Result<Option<ChunkHandle>, StoreError> {
        if chunk_ref.index == 0 {
            Ok(Some(self.head_checked(&chunk_ref.path, chunk_ref.file_id)?))
        } else {
            self.tail_for_read(chunk_ref, backend_len, self.backend_chunk_size())
        }
    }

    /// Sends up to `len` bytes from `offset` inside a chunk to `sink` (bytes past the chunk's
    /// logical length are not sent). Returns the chunk's attributes — `None` if a chunk after
    /// chunk 0 does not exist (a hole) — and the number of bytes sent.
    ///
    /// Cache mode: `backend_len` is the file's `backend_len` (checked by the caller); a
    /// missing chunk below it, or a chunk whose bytes are in the backend, is loaded first — or
    /// read from the backend directly when the store has no room.
    pub fn read(
        &self,
        chunk_ref: &ChunkRef,
        offset: u64,
        len: u64,
        sink: &mut dyn ByteSink,
        backend_len: u64,
    ) -> Result<(Option<Attr>, u64), StoreError> {
        let Some(handle) = self.chunk_for_read(chunk_ref, backend_len)? else { return Ok((None, 0)) };
        let mut chunk = lock(&handle);
        if chunk.removed {
            return if chunk_ref.index == 0 { Err(Errno::ESTALE.into()) } else { Ok((None, 0)) };
        }
        if chunk.attr.is_dir() {
            return Err(Errno::EISDIR.into());
        }
        let end = offset.saturating_add(len).min(chunk.attr.len);
        if offset >= end {
            return Ok((Some(chunk.attr), 0));
        }
        match self.ensure_loaded(&chunk_ref.path, chunk_ref.index, &handle, &mut chunk) {
            Ok(()) => chunk.body.read(offset, end, sink)?,
            Err(StoreError::Fs(Errno::ENOSPC)) => {
                self.cache.as_ref().ok_or(Errno::EIO)?.read_from_backend(&chunk_ref.path, chunk_ref.index, &chunk, offset, end, sink)?
            }
            Err(error) => return Err(error),
        }
        Ok((Some(chunk.attr), end - offset))
    }

    /// Like [`ChunkStore::read`], but for a memory chunk returns a shared handle to its bytes
    /// instead of copying them: bytes `range` of the returned buffer are the first bytes of
    /// the read, the rest of its length reads as zeros. File-backed chunks return no buffer
    /// (the caller falls back to [`ChunkStore::read`]).
    pub fn read_shared(&self, chunk_ref: &ChunkRef, offset: u64, len: u64, backend_len: u64) -> Result<SharedRead, StoreError> {
        let Some(handle) = self.chunk_for_read(chunk_ref, backend_len)? else { return Ok(SharedRead { attr: None, len: 0, bytes: None }) };
        let mut chunk = lock(&handle);
        if chunk.removed {
            return if chunk_ref.index == 0 { Err(Errno::ESTALE.into()) } else { Ok(SharedRead { attr: None, len: 0, bytes: None }) };
        }
        if chunk.attr.is_dir() {
            return Err(Errno::EISDIR.into());
        }
        match self.ensure_loaded(&chunk_ref.path, chunk_ref.index, &handle, &mut chunk) {
            // No room to load: the caller's plain read serves it from the backend.
            Err(StoreError::Fs(Errno::ENOSPC)) => return Ok(SharedRead { attr: Some(chunk.attr), len: 0, bytes: None }),
            other => other?,
        }
        let Body::Memory(shared) = &chunk.body else {
            return Ok(SharedRead { attr: Some(chunk.attr), len: 0, bytes: None });
        };
        let end = offset.saturating_add(len).min(chunk.attr.len);
        let len = end.saturating_sub(offset);
        let start = (offset.min(end) as usize).min(shared.len());
        let range = start..(end as usize).min(shared.len()).max(start);
        Ok(SharedRead { attr: Some(chunk.attr), len, bytes: Some((shared.clone(), range)) })
    }

    /// Sets a chunk's logical length, dropping bytes beyond it; a missing later chunk is
    /// created (empty) from `template`.
    pub fn set_chunk_len(&self, chunk_ref: &ChunkRef, len: u64, template: ChunkTemplate, time_ns: i64) -> Result<Attr, StoreError> {
        let handle = self.data_chunk(chunk_ref, template, time_ns)?;
        let mut chunk = lock(&handle);
        if chunk.removed {
            return Err(Errno::ESTALE.into());
        }
        if !chunk.attr.is_regular() {
            return Err(Errno::EINVAL.into());
        }
        if len > chunk.attr.chunk_size as u64 {
            return Err(Errno::EINVAL.into());
        }
        self.ensure_loaded(&chunk_ref.path, chunk_ref.index, &handle, &mut chunk)?;
        self.space.truncate(&mut chunk, len)?;
        chunk.attr.len = len;
        chunk.attr.mtime_ns = time_ns;
        chunk.attr.ctime_ns = time_ns;
        self.touched(&chunk_ref.path, chunk_ref.index, &mut chunk);
        self.persist(&chunk)?;
        Ok(chunk.attr)
    }

    /// File-level truncate step on chunk 0: sets its length, and marks the file extended if
    /// it now reaches past chunk 0. Returns the attributes from before the call.
    ///
    /// The extended mark is never cleared: it means "chunks after chunk 0 may exist", and
    /// clients cache it per open file, which is only safe while it cannot go away.
    ///
    /// `file_len` is the file's new size: in cache mode the backend part of the file shrinks
    /// to it (the caller records the cut of the backend file once the chunks past it are gone,
    /// see `cut_backend_file`).
    pub fn truncate_head(&self, path: &str, file_id: u64, len: u64, file_len: u64, time_ns: i64) -> Result<Attr, StoreError> {
        let handle = self.head_checked(path, file_id)?;
        let mut chunk = lock(&handle);
        match chunk.attr.kind() {
            Some(FileKind::Regular) => {}
            Some(FileKind::Directory) => return Err(Errno::EISDIR.into()),
            _ => return Err(Errno::EINVAL.into()),
        }
        let before_attr = chunk.attr;
        self.ensure_loaded(path, 0, &handle, &mut chunk)?;
        self.space.truncate(&mut chunk, len)?;
        chunk.attr.len = len;
        if file_len > len {
            chunk.attr.flags |= EntryFlags::EXTENDED;
        }
        chunk.attr.backend_len = chunk.attr.backend_len.min(file_len);
        chunk.attr.mtime_ns = time_ns;
        chunk.attr.ctime_ns = time_ns;
        // The caller records the cut (`cut_backend_file`) once the later chunks are gone.
        chunk.cache.cutting = chunk.attr.has(EntryFlags::BACKED);
        self.touched(path, 0, &mut chunk);
        self.persist(&chunk)?;
        Ok(before_attr)
    }

    /// Records on chunk 0 that the file may have chunks after it.
    pub fn mark_extended(&self, path: &str, file_id: u64) -> Result<(), StoreError> {
        let handle = self.head_checked(path, file_id)?;
        let mut chunk = lock(&handle);
        if !chunk.attr.is_extended() {
            chunk.attr.flags |= EntryFlags::EXTENDED;
            self.persist(&chunk)?;
        }
        Ok(())
    }

    /// chmod / chown / utimens on an entry. `ctime` becomes `time_ns`.
    pub fn set_attr(&self, request: &ringfs_proto::SetAttr) -> Result<Attr, StoreError> {
        let handle = self.head_checked(&request.path, 0)?;
        let mut chunk = lock(&handle);
        let attr = &mut chunk.attr;
        if let Some(mode) = request.mode {
            attr.mode = (attr.mode & !0o7777) | (mode & 0o7777);
        }
        if let Some(uid) = request.uid {
            attr.uid = uid;
        }
        if let Some(gid) = request.gid {
            attr.gid = gid;
        }
        if let Some(atime) = request.atime_ns {
            attr.atime_ns = atime;
        }
        if let Some(mtime) = request.mtime_ns {
            attr.mtime_ns = mtime;
        }
        attr.ctime_ns = request.time_ns;
        if request.mode.is_some() {
            // The mode reaches the backend with the entry's next flush.
            self.touched(&request.path, 0, &mut chunk);
        }
        self.persist(&chunk)?;
        Ok(chunk.attr)
    }
}
