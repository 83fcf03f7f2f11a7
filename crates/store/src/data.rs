//! Operations on files, by id: attributes, opens and link counts at the inode, reads and
//! writes of chunks, lengths, durability.
//!
//! A file lives while it has a name or an open. Its inode counts both: `nlink` (names, kept
//! by the servers of the names through `AddLink`/`DropLink`) and `opens` (registered by the
//! server for its clients). When both reach zero the inode and the chunks held here go, and
//! the caller removes the chunks held elsewhere.

use std::sync::Arc;

use ringfs_proto::{Attr, ChunkIndex, ChunkKey, ChunkTemplate, EntryFlags, Errno, FileId, FileKind, MAX_FILE_SIZE, SetAttr, TailSummary};

use crate::body::Body;
use crate::cache::{BackendFile, Cache};
use crate::chunk::{ChunkHandle, Cut};
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

/// A file that went (no name, no open): the caller removes its chunks on the other servers if
/// it may have had any (chunks 1 to `last_chunk`; none when that is chunk 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deleted {
    pub file: FileId,
    pub last_chunk: ChunkIndex,
}

impl ChunkStore {
    /// The attributes of a file (its inode).
    pub fn stat(&self, file: FileId) -> Result<Attr, StoreError> {
        let handle = self.inode_checked(file)?;
        let chunk = handle.lock();
        let mut attr = chunk.attr;
        if chunk.opens > 0 {
            attr.flags |= EntryFlags::OPEN;
        }
        Ok(attr)
    }

    /// Registers an open of a file; its attributes.
    pub fn open_file(&self, file: FileId) -> Result<Attr, StoreError> {
        let handle = self.inode_checked(file)?;
        let mut chunk = handle.lock();
        if chunk.is_gone() {
            return Err(Errno::ESTALE.into());
        }
        chunk.opens += 1;
        Ok(chunk.attr)
    }

    /// Ends an open of a file; the file goes if that was its last open and it has no name.
    pub fn close_file(&self, file: FileId) -> Option<Deleted> {
        let handle = self.index.inode(file)?;
        let doomed = {
            let mut chunk = handle.lock();
            if chunk.is_gone() {
                return None;
            }
            chunk.opens = chunk.opens.saturating_sub(1);
            chunk.doom_if_unreferenced()
        };
        doomed.then(|| Deleted { file, last_chunk: self.delete_file(file) })
    }

    /// One more name of a file (a hard link). ENOENT if the file has no name left; EPERM for
    /// a directory; EMLINK when the count is at its limit.
    pub fn add_link(&self, file: FileId, time_ns: i64) -> Result<Attr, StoreError> {
        self.add_link_named(file, time_ns, None).map(|(attr, _)| attr)
    }

    /// [`ChunkStore::add_link`] of the new name `name` (cache mode: the backend gets it as a
    /// hard link if it lies in the cached tree). Also says whether the file's data must be
    /// flushed again by every server (it entered the cached tree with this name; see
    /// [`ChunkStore::redirty`]).
    pub fn add_link_named(&self, file: FileId, time_ns: i64, name: Option<&str>) -> Result<(Attr, bool), StoreError> {
        let handle = self.inode_checked(file)?;
        let mut chunk = handle.lock();
        if chunk.attr.is_dir() {
            return Err(Errno::EPERM.into());
        }
        if chunk.attr.nlink == 0 || chunk.is_gone() {
            return Err(Errno::ENOENT.into());
        }
        chunk.attr.nlink = chunk.attr.nlink.checked_add(1).filter(|count| *count < u32::MAX).ok_or(Errno::EMLINK)?;
        chunk.attr.ctime_ns = time_ns;
        let rewrite = match name {
            Some(name) => self.add_backend_name(&mut chunk, name),
            None => false,
        };
        self.persist(&mut chunk)?;
        Ok((chunk.attr, rewrite))
    }

    /// One name fewer of a file (a directory: its only name). When the file has no name left
    /// it leaves the backend's view (cache mode), and it goes if nobody has it open.
    pub fn drop_link(&self, file: FileId, time_ns: i64) -> Result<Option<Deleted>, StoreError> {
        self.drop_link_named(file, time_ns, None).map(|(deleted, _)| deleted)
    }

    /// [`ChunkStore::drop_link`] of the name `name` (cache mode: the backend's link of that
    /// name is no longer the file's). Also says whether the file's data must be flushed again
    /// by every server (it is made anew at another of its names).
    pub fn drop_link_named(&self, file: FileId, time_ns: i64, name: Option<&str>) -> Result<(Option<Deleted>, bool), StoreError> {
        let handle = self.inode_checked(file)?;
        let (doomed, rewrite) = {
            let mut chunk = handle.lock();
            if chunk.is_gone() {
                return Err(Errno::ESTALE.into());
            }
            chunk.attr.nlink = if chunk.attr.is_dir() { 0 } else { chunk.attr.nlink.saturating_sub(1) };
            chunk.attr.ctime_ns = time_ns;
            let mut rewrite = false;
            if chunk.attr.nlink == 0 {
                // Nothing of a file without a name is flushed (its names' removals reach the
                // backend instead).
                chunk.cache.pending = None;
                chunk.cache.backend_path = None;
                chunk.cache.backend_identity = None;
                chunk.cache.links.clear();
            } else if let Some(name) = name {
                rewrite = self.drop_backend_name(&mut chunk, name);
            }
            self.persist(&mut chunk)?;
            (chunk.doom_if_unreferenced(), rewrite)
        };
        Ok((doomed.then(|| Deleted { file, last_chunk: self.delete_file(file) }), rewrite))
    }

    /// Writes `source` at `offset` inside a chunk and returns the chunk's new logical length.
    /// The inode must exist; later chunks are created from `template`. `backend` (cache mode)
    /// says where the file's bytes are in the backend, for chunks that hold backend data.
    pub fn write(
        &self,
        key: ChunkKey,
        offset: u64,
        source: &mut dyn ByteSource,
        template: ChunkTemplate,
        time_ns: i64,
        backend: Option<&BackendFile>,
    ) -> Result<u64, StoreError> {
        let handle = self.data_chunk(key, template, time_ns, backend)?;
        let mut chunk = handle.lock();
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
        self.ensure_loaded(&handle, &mut chunk, backend)?;
        self.dirty_before_change(&mut chunk)?;
        self.fill(&mut chunk, offset, source)?;
        #[cfg(test)]
        if crate::testing::DIE_AFTER_CHANGE.get() {
            return Err(Errno::EIO.into());
        }
        chunk.attr.len = chunk.attr.len.max(end);
        chunk.attr.mtime_ns = time_ns;
        chunk.attr.ctime_ns = time_ns;
        self.touched(&mut chunk);
        self.persist(&mut chunk)?;
        Ok(chunk.attr.len)
    }

    /// Whether this store holds the chunk.
    pub fn holds_chunk(&self, key: ChunkKey) -> bool {
        self.index.chunk(key).is_some()
    }

    /// Cache mode: whether an operation on `key` needs to know where the file's bytes are in
    /// the backend — the chunk is missing and may be backend data (below `backend_len_hint`,
    /// the caller's view), or it is here with its bytes still in the backend.
    pub fn needs_backend(&self, key: ChunkKey, backend_len_hint: u64) -> bool {
        if self.cache.is_none() || key.is_inode() {
            return false;
        }
        match self.index.chunk(key) {
            Some(handle) => handle.lock().attr.has(EntryFlags::BACKEND_DATA),
            None => Cache::backend_holds(key, backend_len_hint, self.backend_chunk_size()),
        }
    }

    /// Cache mode, at a file's inode: where its bytes are in the backend (`None` outside the
    /// cached tree, or for a file with no name left).
    pub fn backend_file(&self, file: FileId) -> Result<Option<BackendFile>, StoreError> {
        let handle = self.inode_checked(file)?;
        let chunk = handle.lock();
        Ok(chunk.cache.backend_path.clone().map(|path| BackendFile { path, len: chunk.attr.backend_len }))
    }

    /// The chunk a read addresses; `None` for a chunk after chunk 0 that does not exist.
    fn chunk_for_read(&self, key: ChunkKey, backend: Option<&BackendFile>) -> Result<Option<ChunkHandle>, StoreError> {
        if key.is_inode() { Ok(Some(self.inode_checked(key.file)?)) } else { self.tail_for_read(key, backend, self.backend_chunk_size()) }
    }

    /// Sends up to `len` bytes from `offset` inside a chunk to `sink` (bytes past the chunk's
    /// logical length are not sent). Returns the chunk's attributes — `None` if a chunk after
    /// chunk 0 does not exist (a hole) — and the number of bytes sent.
    ///
    /// Cache mode: a chunk whose bytes are in the backend (`backend`, as the inode's server
    /// gave it) is loaded first — or read from the backend directly when the store has no room.
    pub fn read(
        &self,
        key: ChunkKey,
        offset: u64,
        len: u64,
        sink: &mut dyn ByteSink,
        backend: Option<&BackendFile>,
    ) -> Result<(Option<Attr>, u64), StoreError> {
        let Some(handle) = self.chunk_for_read(key, backend)? else { return Ok((None, 0)) };
        let mut chunk = handle.lock();
        if chunk.removed {
            return if key.is_inode() { Err(Errno::ESTALE.into()) } else { Ok((None, 0)) };
        }
        if chunk.attr.is_dir() {
            return Err(Errno::EISDIR.into());
        }
        let end = offset.saturating_add(len).min(chunk.attr.len);
        if offset >= end {
            return Ok((Some(chunk.attr), 0));
        }
        match self.ensure_loaded(&handle, &mut chunk, backend) {
            Ok(()) => chunk.body.read(offset, end, sink)?,
            Err(StoreError::Fs(Errno::ENOSPC)) => {
                let path = backend.map(|backend| backend.path.as_str());
                self.cache.as_ref().ok_or(Errno::EIO)?.read_from_backend(&chunk, path, offset, end, sink)?
            }
            Err(error) => return Err(error),
        }
        Ok((Some(chunk.attr), end - offset))
    }

    /// Like [`ChunkStore::read`], but for a memory chunk returns a shared handle to its bytes
    /// instead of copying them: bytes `range` of the returned buffer are the first bytes of
    /// the read, the rest of its length reads as zeros. File-backed chunks return no buffer
    /// (the caller falls back to [`ChunkStore::read`]).
    pub fn read_shared(&self, key: ChunkKey, offset: u64, len: u64, backend: Option<&BackendFile>) -> Result<SharedRead, StoreError> {
        let Some(handle) = self.chunk_for_read(key, backend)? else { return Ok(SharedRead { attr: None, len: 0, bytes: None }) };
        let mut chunk = handle.lock();
        if chunk.removed {
            return if key.is_inode() { Err(Errno::ESTALE.into()) } else { Ok(SharedRead { attr: None, len: 0, bytes: None }) };
        }
        if chunk.attr.is_dir() {
            return Err(Errno::EISDIR.into());
        }
        match self.ensure_loaded(&handle, &mut chunk, backend) {
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
    /// created (empty) from `template`. With `cut_at_ns` (a truncation finished late), a
    /// chunk changed after that time is left as it is.
    pub fn set_chunk_len(
        &self,
        key: ChunkKey,
        len: u64,
        template: ChunkTemplate,
        time_ns: i64,
        backend: Option<&BackendFile>,
        cut_at_ns: Option<i64>,
    ) -> Result<Attr, StoreError> {
        let handle = self.data_chunk(key, template, time_ns, backend)?;
        let mut chunk = handle.lock();
        if chunk.removed {
            return Err(Errno::ESTALE.into());
        }
        if cut_at_ns.is_some_and(|cut_at| chunk.attr.mtime_ns > cut_at) {
            return Ok(chunk.attr);
        }
        if !chunk.attr.is_regular() {
            return Err(Errno::EINVAL.into());
        }
        if len > chunk.attr.chunk_size as u64 {
            return Err(Errno::EINVAL.into());
        }
        self.ensure_loaded(&handle, &mut chunk, backend)?;
        chunk.attr.len = len;
        chunk.attr.mtime_ns = time_ns;
        chunk.attr.ctime_ns = time_ns;
        chunk.cache.note_cut();
        self.record_then_cut(&mut chunk, len)?;
        Ok(chunk.attr)
    }

    /// File-level truncate step on the inode: sets chunk 0's length, and raises the bound on
    /// the file's chunks (`Attr::last_chunk`) to the new last chunk. Returns the attributes
    /// from before the call.
    ///
    /// The bound is never lowered: clients cache it per open file (a write below it does not
    /// raise it again), which is only safe while it cannot shrink.
    ///
    /// `file_len` is the file's new size: in cache mode the backend part of the file shrinks
    /// to it. The cut is recorded as under way ([`Chunk::cut`]) until the caller has cut the
    /// later chunks and calls [`ChunkStore::finish_cut`].
    pub fn truncate_head(&self, file: FileId, len: u64, file_len: u64, time_ns: i64) -> Result<Attr, StoreError> {
        let handle = self.inode_checked(file)?;
        let mut chunk = handle.lock();
        match chunk.attr.kind() {
            Some(FileKind::Regular) => {}
            Some(FileKind::Directory) => return Err(Errno::EISDIR.into()),
            _ => return Err(Errno::EINVAL.into()),
        }
        let before_attr = chunk.attr;
        self.ensure_loaded(&handle, &mut chunk, None)?;
        chunk.attr.len = len;
        chunk.attr.last_chunk = chunk.attr.last_chunk.max(ChunkIndex::last_of(file_len, u64::from(chunk.attr.chunk_size.max(1))));
        chunk.attr.backend_len = chunk.attr.backend_len.min(file_len);
        chunk.attr.mtime_ns = time_ns;
        chunk.attr.ctime_ns = time_ns;
        // The caller cuts the later chunks and then ends the cut (`finish_cut`).
        chunk.cut = Some(Cut { len: file_len, time_ns });
        chunk.cache.note_cut();
        self.record_then_cut(&mut chunk, len)?;
        Ok(before_attr)
    }

    /// The truncation `cut` of `file` cut the file's chunks past it on every server: it is no
    /// longer under way (unless a later truncation is), and in cache mode the backend file is
    /// cut when the inode is next flushed. (Recording the backend's cut only now means no
    /// flush of a removed chunk can land after it.)
    pub fn finish_cut(&self, file: FileId, cut: Cut) -> Result<(), StoreError> {
        let handle = self.inode_checked(file)?;
        let mut chunk = handle.lock();
        if chunk.cut == Some(cut) {
            chunk.cut = None;
        }
        if let Some(cache) = &self.cache {
            cache.record_cut(&mut chunk, cut.len);
        }
        self.space.persist(&mut chunk)
    }

    /// The truncation of `file` under way, if any (and the file is here).
    pub fn cut_under_way(&self, file: FileId) -> Option<Cut> {
        self.index.inode(file).and_then(|handle| handle.lock().cut)
    }

    /// The truncations of files whose inodes are here that have not ended (cut short by a
    /// restart or by a server that did not answer): the server finishes them.
    pub fn unfinished_cuts(&self) -> Vec<(FileId, Cut)> {
        let cut_of = |handle: &ChunkHandle| {
            let chunk = handle.lock();
            chunk.cut.filter(|_| !chunk.is_gone()).map(|cut| (chunk.attr.file_id, cut))
        };
        self.index.inodes().iter().filter_map(cut_of).collect()
    }

    /// Records on the inode that the file may have chunks up to `last_chunk` (the bound only
    /// rises; it stops at the chunk that holds the largest file's last byte). The bound
    /// after the call.
    pub fn mark_extended(&self, file: FileId, last_chunk: ChunkIndex) -> Result<ChunkIndex, StoreError> {
        let handle = self.inode_checked(file)?;
        let mut chunk = handle.lock();
        if chunk.attr.kind() != Some(FileKind::Regular) {
            return Err(Errno::EINVAL.into());
        }
        let largest = ChunkIndex::last_of(MAX_FILE_SIZE, u64::from(chunk.attr.chunk_size.max(1)));
        let last_chunk = last_chunk.min(largest);
        if chunk.attr.last_chunk < last_chunk {
            chunk.attr.last_chunk = last_chunk;
            self.persist(&mut chunk)?;
        }
        Ok(chunk.attr.last_chunk)
    }

    /// chmod / chown / utimens on a file. `ctime` becomes `time_ns`.
    pub fn set_attr(&self, request: &SetAttr) -> Result<Attr, StoreError> {
        let handle = self.inode_checked(request.file)?;
        let mut chunk = handle.lock();
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
        if request.mtime_ns.is_some() {
            chunk.mtime_set_at_ns = Some(request.time_ns);
        }
        if request.mode.is_some() {
            // The mode reaches the backend with the inode's next flush.
            self.touched(&mut chunk);
        }
        self.persist(&mut chunk)?;
        Ok(chunk.attr)
    }

    /// A directory's entries changed at `time_ns` (touches may come late — servers hold
    /// them back — and in any order): its ctime becomes at least `time_ns`, and so does its
    /// mtime, unless the mtime was set explicitly after `time_ns` (`rsync` and `cp -a` set a
    /// directory's times after filling it, and a touch arriving late must not undo that). A
    /// later ctime alone (a chmod, a rename of the directory) does not stop the mtime.
    /// `subdirectories` is added to its link count (2 + its subdirectories; never below 2,
    /// and a directory with no name left keeps 0).
    pub fn touch_dir(&self, file: FileId, time_ns: i64, subdirectories: i32) -> Result<(), StoreError> {
        let handle = self.inode_checked(file)?;
        let mut chunk = handle.lock();
        if !chunk.attr.is_dir() {
            return Err(Errno::ENOTDIR.into());
        }
        let before = (chunk.attr.mtime_ns, chunk.attr.ctime_ns);
        match chunk.mtime_set_at_ns {
            Some(set_at) if time_ns <= set_at => {}
            Some(_) => {
                chunk.attr.mtime_ns = time_ns;
                chunk.mtime_set_at_ns = None;
            }
            None => chunk.attr.mtime_ns = chunk.attr.mtime_ns.max(time_ns),
        }
        chunk.attr.ctime_ns = chunk.attr.ctime_ns.max(time_ns);
        if chunk.attr.nlink != 0 {
            let count = i64::from(chunk.attr.nlink) + i64::from(subdirectories);
            chunk.attr.nlink = count.clamp(2, i64::from(u32::MAX - 1)) as u32;
        }
        if (chunk.attr.mtime_ns, chunk.attr.ctime_ns) == before && subdirectories == 0 {
            return Ok(());
        }
        self.persist(&mut chunk)
    }

    /// Files of which this store holds data chunks but no inode: their inodes are on other
    /// servers — or gone, and these chunks are orphans (see the server's reclaiming).
    pub fn files_without_inode(&self) -> Vec<FileId> {
        let mut files = Vec::new();
        for shard in &self.index.files {
            let shard = shard.lock();
            files.extend(shard.files.iter().filter(|(_, chunks)| chunks.inode.is_none() && !chunks.tail.is_empty()).map(|(file, _)| *file));
        }
        files
    }

    /// Of `files`, those whose inode is not here (or is going away).
    pub fn missing_inodes(&self, files: &[FileId]) -> Vec<FileId> {
        files.iter().copied().filter(|file| self.index.inode(*file).is_none_or(|handle| handle.lock().is_gone())).collect()
    }

    /// Removes this store's chunks of `file` with index >= `from_index` (at least 1) — with
    /// `cut_at_ns`, those not changed after it (a truncation finished late keeps what was
    /// written after it). Returns how many were removed.
    pub fn remove_chunks(&self, file: FileId, from_index: ChunkIndex, cut_at_ns: Option<i64>) -> u64 {
        // Which chunks were written after the cut is read before they leave the index (no
        // chunk's lock is taken under the index's): a write landing in between is lost with
        // its chunk, as a write racing any truncation may be.
        let newer: Vec<ChunkIndex> = match cut_at_ns {
            None => Vec::new(),
            Some(cut_at) => self
                .index
                .tail_of(file)
                .into_iter()
                .filter(|(index, handle)| *index >= from_index && handle.lock().attr.mtime_ns > cut_at)
                .map(|(index, _)| index)
                .collect(),
        };
        let removed = {
            let mut files = self.index.files_of(file);
            let Some(chunks) = files.files.get_mut(&file) else { return 0 };
            let removed = chunks.take_tail(from_index, &newer);
            if chunks.is_empty() {
                files.files.remove(&file);
            }
            removed
        };
        for handle in &removed {
            self.space.discard(handle);
        }
        // The file's removal (from chunk 1: its deletion, or a cut into chunk 0), or a
        // truncation that removed chunks here, ends its reservation here too; a truncation
        // that grows the file (removing nothing) keeps it.
        if from_index <= ChunkIndex::FIRST.next() || !removed.is_empty() {
            self.space.release_reserved(file, u64::MAX);
        }
        removed.len() as u64
    }

    /// An explicit modification time `mtime_ns` was set on `file`: its chunks here after
    /// chunk 0 keep no later time, so that the file's mtime (the newest of its inode's and
    /// its chunks') reads as set until the next write.
    pub fn clamp_tail_mtimes(&self, file: FileId, mtime_ns: i64) -> Result<(), StoreError> {
        for (_, handle) in self.index.tail_of(file) {
            let mut chunk = handle.lock();
            if !chunk.removed && chunk.attr.mtime_ns > mtime_ns {
                chunk.attr.mtime_ns = mtime_ns;
                self.persist(&mut chunk)?;
            }
        }
        Ok(())
    }

    /// This store's part of a file after chunk 0: its highest chunk index (>= 1) with that
    /// chunk's logical length, and the newest modification time among its chunks.
    pub fn tail_summary(&self, file: FileId) -> TailSummary {
        let mut summary = TailSummary::default();
        for (index, handle) in self.index.tail_of(file) {
            let chunk = handle.lock();
            if chunk.removed {
                continue;
            }
            summary.newest_mtime_ns = summary.newest_mtime_ns.max(chunk.attr.mtime_ns);
            if summary.last.is_none_or(|(last, _)| index > last) {
                summary.last = Some((index, chunk.attr.len));
            }
        }
        summary
    }

    /// Makes this store's chunks of `file`, and the names recorded so far, durable (`dir`
    /// store: fsync of the chunk files and the entry journal; nothing to do in memory).
    pub fn fsync_file(&self, file: FileId) -> Result<(), StoreError> {
        for (_, handle) in self.index.chunks_of(file) {
            self.space.sync(&handle.lock())?;
        }
        if let Some(directory) = &self.space.directory {
            directory.sync_entries().map_err(StoreError::Directory)?;
        }
        Ok(())
    }
}
