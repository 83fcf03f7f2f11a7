//! Flushing: applying entries' pending operations and removals to the backend, and writing
//! dirty chunks there.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use ringfs_proto::path;
use ringfs_proto::{ChunkRef, EntryFlags, Errno, FileKind};

use super::{Cache, FlushOutcome, FlushPace, Prepare, WorkItem, io_errno};
use crate::StoreError;
use crate::backend::{self, RemovalKind};
use crate::chunk::{Chunk, ChunkHandle, PendingOp, lock};
use crate::index::{DirShard, FileShard, Index};
use crate::space::Space;

impl Cache {
    // ----- removals -------------------------------------------------------------------------

    /// Records that the entry at `path` (which exists in the backend) was removed. Called with
    /// the locks of the parent's directory shard and the path's file shard held.
    pub fn record_removal(
        &self,
        space: &Space,
        dirs: &mut DirShard,
        files: &mut FileShard,
        path: &str,
        kind: RemovalKind,
    ) -> Result<(), StoreError> {
        let parent = path::parent(path).unwrap_or("/");
        if let Some(directory) = &space.directory {
            directory.record_removal(path, kind).map_err(StoreError::Directory)?;
        }
        if files.removals.insert(path.to_string(), kind).is_none() {
            self.push(WorkItem::Removal { path: path.to_string() });
        }
        dirs.removed.entry(parent.to_string()).or_default().insert(path::file_name(path).to_string());
        Ok(())
    }

    /// Forgets the removal recorded for `path` (applied, or replaced by a new entry there).
    /// Called with the same locks as [`Cache::record_removal`].
    pub fn forget_removal(&self, space: &Space, dirs: &mut DirShard, files: &mut FileShard, path: &str) {
        if files.removals.remove(path).is_none() {
            return;
        }
        let parent = path::parent(path).unwrap_or("/");
        if let Some(names) = dirs.removed.get_mut(parent) {
            names.remove(path::file_name(path));
            if names.is_empty() {
                dirs.removed.remove(parent);
            }
        }
        if let Some(directory) = &space.directory
            && let Err(error) = directory.forget_removal(path)
        {
            log::warn!("cannot forget the removal record of {path}: {error}");
        }
    }

    /// Applies a removal to the backend now (a directory is re-created over a removed one,
    /// whose old contents must go first).
    pub fn apply_removal_now(&self, path: &str) -> Result<(), StoreError> {
        self.backend.remove(path).map_err(io_errno)
    }

    fn apply_removal(&self, index: &Index, space: &Space, path: &str) -> Result<FlushOutcome, StoreError> {
        let parent = path::parent(path).unwrap_or("/");
        // Hold both locks while the backend changes: a new entry at this path waits, and
        // cannot be overtaken by the removal of its predecessor.
        let mut dirs = index.dirs_of(parent);
        let mut files = index.files_of(path);
        if !files.removals.contains_key(path) {
            return Ok(FlushOutcome::Skipped);
        }
        self.backend.remove(path).map_err(io_errno)?;
        files.backend_removals += 1;
        self.backend_changed();
        self.forget_removal(space, &mut dirs, &mut files, path);
        Ok(FlushOutcome::Flushed { bytes: 0, clean: true })
    }

    // ----- entries --------------------------------------------------------------------------

    /// Applies the pending operation of the entry `(path, file_id)` to the backend (asked by a
    /// server about to flush a chunk of the file); ESTALE if the entry is gone or is another
    /// file now.
    pub fn prepare_entry(&self, index: &Index, space: &Space, path: &str, file_id: u64) -> Result<(), StoreError> {
        let handle = index.head(path).ok_or(Errno::ESTALE)?;
        let mut chunk = lock(&handle);
        if chunk.removed || (file_id != 0 && chunk.attr.file_id != file_id) {
            return Err(Errno::ESTALE.into());
        }
        if chunk.cache.cutting {
            return Err(Errno::EAGAIN.into());
        }
        self.apply_pending(space, path, &mut chunk)
    }

    /// A regular file in the cached tree was cut to `len` and its chunks past the cut are gone
    /// from every server: the backend file is cut when the entry is next flushed. (Recording
    /// the cut only now means no flush of a removed chunk can land after the cut.)
    pub fn cut_backend_file(&self, space: &Space, path: &str, handle: &ChunkHandle, len: u64) -> Result<(), StoreError> {
        let mut chunk = lock(handle);
        chunk.cache.cutting = false;
        if !chunk.attr.has(EntryFlags::BACKED) || !chunk.attr.is_regular() {
            return Ok(());
        }
        chunk.cache.pending = PendingOp::after_trim(chunk.cache.pending, len);
        space.persist(&chunk)?;
        self.queue_chunk(path, 0, &mut chunk);
        Ok(())
    }

    pub fn apply_pending(&self, space: &Space, path: &str, chunk: &mut Chunk) -> Result<(), StoreError> {
        let Some(op) = chunk.cache.pending else { return Ok(()) };
        let backend = &self.backend;
        let applied = match (op, chunk.attr.kind()) {
            (PendingOp::Create, Some(FileKind::Regular)) => backend.create_file(path, chunk.attr.mode),
            (PendingOp::Create, Some(FileKind::Directory)) => backend.make_dir(path, chunk.attr.mode),
            (PendingOp::Create, Some(FileKind::Symlink)) => {
                let target = String::from_utf8_lossy(&chunk.body.to_vec()?).into_owned();
                backend.make_symlink(path, &target)
            }
            (PendingOp::Create, None) => Ok(()),
            (PendingOp::Trim(len), _) => backend.trim(path, len),
        };
        applied.map_err(io_errno)?;
        self.backend_changed();
        chunk.cache.pending = None;
        chunk.attr.flags |= EntryFlags::IN_BACKEND;
        space.persist(chunk)
    }

    // ----- chunks ---------------------------------------------------------------------------

    /// Does one unit of flushing work. `prepare` reaches the entry's server (see [`Prepare`]);
    /// `pace` says whether the flush steps aside for writers. An error leaves the work to be
    /// retried by the caller.
    pub fn flush(
        &self,
        index: &Index,
        space: &Space,
        item: &WorkItem,
        prepare: Prepare<'_>,
        pace: FlushPace<'_>,
    ) -> Result<FlushOutcome, StoreError> {
        match item {
            WorkItem::Removal { path } => self.apply_removal(index, space, path),
            WorkItem::Chunk { path, index: chunk_index, file_id } => {
                self.flush_chunk(index, space, path, *chunk_index, *file_id, prepare, pace)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn flush_chunk(
        &self,
        index: &Index,
        space: &Space,
        path: &str,
        chunk_index: u64,
        file_id: u64,
        prepare: Prepare<'_>,
        pace: FlushPace<'_>,
    ) -> Result<FlushOutcome, StoreError> {
        let reference = ChunkRef { path: path.to_string(), index: chunk_index, file_id };
        let handle = if chunk_index == 0 { index.head(path) } else { index.find_tail(&reference) };
        let Some(handle) = handle else { return Ok(FlushOutcome::Skipped) };
        let (kind_is_regular, mode) = {
            let mut chunk = lock(&handle);
            if chunk.removed || chunk.attr.file_id != file_id {
                return Ok(FlushOutcome::Skipped);
            }
            // From here on a change queues the chunk again.
            chunk.cache.queued = false;
            if !chunk.attr.has(EntryFlags::DIRTY) && chunk.cache.pending.is_none() {
                return Ok(FlushOutcome::Skipped);
            }
            (chunk.attr.is_regular(), chunk.attr.mode)
        };
        let local_prepare = |path: &str, file_id: u64| self.prepare_entry(index, space, path, file_id).map_err(|error| error.errno());
        let prepare: Prepare<'_> = if chunk_index == 0 { &local_prepare } else { prepare };
        // The entry's pending creation or cut reaches the backend before any of its data.
        // (Never without it: a creation applied later would replace the file, data and all.)
        match prepare(path, file_id) {
            Ok(()) => {}
            Err(Errno::ESTALE) | Err(Errno::ENOENT) => return Ok(Self::entry_missing(&handle, file_id)),
            // A cut of the file is under way.
            Err(Errno::EAGAIN) => return Ok(FlushOutcome::Deferred),
            Err(errno) => return Err(errno.into()),
        }
        let file = match kind_is_regular {
            true => match self.open_flushed_file(path, file_id, mode, prepare)? {
                Some(file) => Some(file),
                None => return Ok(Self::entry_missing(&handle, file_id)),
            },
            false => None,
        };
        // Every backend write happens under the chunk's lock, and only while the chunk is
        // unchanged since its bytes were taken: bytes of a chunk that was cut or removed
        // meanwhile never land after the cut reached the backend (cuts are applied only once
        // the chunks past them are gone).
        let mut chunk = lock(&handle);
        if chunk.removed || chunk.attr.file_id != file_id {
            return Ok(FlushOutcome::Skipped);
        }
        let (version, attr) = (chunk.version, chunk.attr);
        let mut written = 0;
        let has_data = attr.is_regular() && attr.has(EntryFlags::DIRTY) && !attr.has(EntryFlags::BACKEND_DATA);
        if let (Some(file), true) = (&file, has_data) {
            let bytes = chunk.body.snapshot()?;
            let offset = chunk_index * attr.chunk_size as u64;
            let stored = &bytes[..bytes.len().min(attr.len as usize)];
            for (number, piece) in stored.chunks(backend::FLUSH_PIECE_BYTES).enumerate() {
                if let (FlushPace::Yielding(keep_going), true) = (pace, number > 0) {
                    // Let writers in between pieces.
                    drop(chunk);
                    if !keep_going() {
                        return Ok(FlushOutcome::Interrupted);
                    }
                    chunk = lock(&handle);
                    if chunk.removed || chunk.version != version {
                        return Ok(FlushOutcome::Flushed { bytes: written, clean: false });
                    }
                }
                file.write_all_at(piece, offset + (number * backend::FLUSH_PIECE_BYTES) as u64).map_err(io_errno)?;
                written += piece.len() as u64;
            }
            backend::extend_to(file, offset + attr.len).map_err(io_errno)?;
            self.backend_changed();
        }
        if attr.has(EntryFlags::DIRTY) && (attr.is_dir() || (attr.is_regular() && chunk_index == 0)) {
            self.backend.set_mode(path, attr.mode).map_err(io_errno)?;
        }
        // Still under the lock taken (or retaken) after the chunk's last check: unchanged.
        chunk.attr.flags &= !EntryFlags::DIRTY;
        if chunk_index == 0 {
            chunk.attr.flags |= EntryFlags::IN_BACKEND;
        }
        space.persist(&chunk)?;
        self.note_clean(path, &handle, &mut chunk, space.chunk_count());
        self.counters.flushed_chunks.fetch_add(1, Ordering::Relaxed);
        self.counters.flushed_bytes.fetch_add(written, Ordering::Relaxed);
        Ok(FlushOutcome::Flushed { bytes: written, clean: true })
    }

    /// What a flush does when the entry of its chunk's file is missing at the entry's server:
    /// nothing if the chunk is gone too, otherwise it waits for the entry (see
    /// [`FlushOutcome::Deferred`]).
    fn entry_missing(handle: &ChunkHandle, file_id: u64) -> FlushOutcome {
        let chunk = lock(handle);
        match chunk.removed || chunk.attr.file_id != file_id {
            true => FlushOutcome::Skipped,
            false => FlushOutcome::Deferred,
        }
    }

    /// Opens the backend file of the entry `(path, file_id)` for writing its data. A missing
    /// file was either removed with its entry (then `None`) or deleted behind ringfs's back
    /// (then it is created again, since the entry still exists).
    fn open_flushed_file(&self, path: &str, file_id: u64, mode: u32, prepare: Prepare<'_>) -> Result<Option<File>, StoreError> {
        match self.backend.open_existing(path) {
            Ok(file) => return Ok(Some(file)),
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(io_errno(error)),
            Err(_) => {}
        }
        match prepare(path, file_id) {
            Err(Errno::ESTALE) | Err(Errno::ENOENT) | Err(Errno::EAGAIN) => Ok(None),
            Err(errno) => Err(errno.into()),
            Ok(()) => self.backend.open_for_flush(path, mode).map(Some).map_err(io_errno),
        }
    }
}
