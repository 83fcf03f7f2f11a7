//! Flushing: applying removals and inodes' pending operations to the backend, and writing
//! dirty chunks there.

use std::fs::File;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::sync::atomic::Ordering;

use ringfs_proto::path;
use ringfs_proto::{BackendPlace, ChunkKey, EntryFlags, Errno, FileId, FileKind};

use super::{Cache, FlushOutcome, FlushPace, Prepare, WorkItem, io_errno};
use crate::StoreError;
use crate::backend::{self, RemovalKind};
use crate::chunk::{Chunk, ChunkHandle, PendingOp};
use crate::index::{DirShard, Index, NameShard};
use crate::space::Space;

impl Cache {
    // ----- removals -------------------------------------------------------------------------

    /// Records that the name `path` in the cached tree was removed: the backend entry there,
    /// if any, goes when the removal is flushed. Called with the locks of the parent's
    /// directory shard and the path's name shard held.
    pub fn record_removal(
        &self,
        space: &Space,
        dirs: &mut DirShard,
        names: &mut NameShard,
        path: &str,
        kind: RemovalKind,
    ) -> Result<(), StoreError> {
        let parent = path::parent(path).unwrap_or("/");
        if let Some(directory) = &space.directory {
            directory.record_removal(path, kind).map_err(StoreError::Directory)?;
        }
        if names.removals.insert(path.to_string(), kind).is_none() {
            self.push(WorkItem::Removal { path: path.to_string() });
        }
        dirs.removed.entry(parent.to_string()).or_default().insert(path::file_name(path).to_string());
        Ok(())
    }

    /// Forgets the removal recorded for `path` (applied, or replaced by a new entry there).
    /// Called with the same locks as [`Cache::record_removal`].
    pub fn forget_removal(&self, space: &Space, dirs: &mut DirShard, names: &mut NameShard, path: &str) {
        if names.removals.remove(path).is_none() {
            return;
        }
        let parent = path::parent(path).unwrap_or("/");
        if let Some(removed) = dirs.removed.get_mut(parent) {
            removed.remove(path::file_name(path));
            if removed.is_empty() {
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

    /// Applies the removal recorded for `path`, unless a directory rename holds the path
    /// (`respect_holds`; the rename that holds it applies removals below its paths itself).
    fn apply_removal(&self, index: &Index, space: &Space, path: &str, respect_holds: bool) -> Result<FlushOutcome, StoreError> {
        let parent = path::parent(path).unwrap_or("/");
        // Hold both locks while the backend changes: a new entry at this path waits, and
        // cannot be overtaken by the removal of its predecessor.
        let mut dirs = index.dirs_of(parent);
        let mut names = index.names_of(path);
        if !names.removals.contains_key(path) {
            return Ok(FlushOutcome::Skipped);
        }
        if respect_holds && self.holds.covers(path) {
            return Ok(FlushOutcome::Held);
        }
        self.backend.remove(path).map_err(io_errno)?;
        log::debug!("removed {path} from the backend");
        names.backend_removals += 1;
        self.backend_changed();
        self.forget_removal(space, &mut dirs, &mut names, path);
        Ok(FlushOutcome::Flushed { bytes: 0, clean: true })
    }

    /// Applies the removal recorded for `path`, if any, now: a file is about to be moved to
    /// that name in the backend, and the removal, applied later, would take it away. EBUSY
    /// while a directory rename holds the path.
    pub fn settle_removal(&self, index: &Index, space: &Space, path: &str) -> Result<(), StoreError> {
        match self.apply_removal(index, space, path, true)? {
            FlushOutcome::Held => Err(Errno::EBUSY.into()),
            _ => Ok(()),
        }
    }

    /// Applies every removal recorded here below `dir` to the backend now (a directory
    /// rename moves the backend tree, and the entries removed in ringfs must not move with
    /// it). Applied even under a hold: the rename that holds `dir` calls this.
    pub fn apply_removals_under(&self, index: &Index, space: &Space, dir: &str) -> Result<(), StoreError> {
        for (parent, removed) in index.removals_under(dir) {
            for name in removed {
                self.apply_removal(index, space, &path::join(&parent, &name), false)?;
            }
        }
        Ok(())
    }

    /// Moves a directory (or exchanges two entries) in the backend for a directory rename in
    /// ringfs (see [`crate::BackendDir::move_entry`]).
    pub fn move_in_backend(&self, from: &str, to: &str, exchange: bool) -> Result<(), StoreError> {
        self.backend.move_entry(from, to, exchange).map_err(io_errno)?;
        self.backend_changed();
        Ok(())
    }

    /// Points the inodes held here whose backend paths lie at or below `from` at the same
    /// place below `to` (and, with `exchange`, those below `to` at `from`). Without
    /// `exchange`, inodes below `to` lose their backend path: that was the empty directory
    /// the rename replaces, whose backend tree is gone.
    pub fn rebase_backend_paths(&self, index: &Index, space: &Space, from: &str, to: &str, exchange: bool) -> Result<(), StoreError> {
        let moved =
            |path: &str, old: &str, new: &str| (path == old || path::is_inside(path, old)).then(|| format!("{new}{}", &path[old.len()..]));
        // Where a backend path is after the rename: `None` unchanged, `Some(None)` gone (it
        // was below the replaced directory), `Some(Some(path))` moved.
        let rebase = |current: &str| -> Option<Option<String>> {
            match moved(current, from, to) {
                Some(path) => Some(Some(path)),
                None if exchange => moved(current, to, from).map(Some),
                None if current == to || path::is_inside(current, to) => Some(None),
                None => None,
            }
        };
        for handle in index.inodes() {
            let mut chunk = handle.lock();
            let Some(current) = chunk.cache.backend_path.clone() else { continue };
            let mut changed = false;
            // The file's other names (hard links) move with their directories too.
            let mut links = std::mem::take(&mut chunk.cache.links);
            links.retain_mut(|link| match rebase(&link.path) {
                None => true,
                Some(Some(path)) => {
                    link.path = path;
                    changed = true;
                    true
                }
                Some(None) => {
                    changed = true;
                    false
                }
            });
            chunk.cache.links = links;
            match rebase(&current) {
                None => {}
                Some(Some(path)) => {
                    chunk.cache.backend_path = Some(path);
                    changed = true;
                }
                Some(None) => {
                    chunk.cache.pending = None;
                    chunk.cache.links.clear();
                    chunk.attr.flags &= !(EntryFlags::DIRTY | EntryFlags::IN_BACKEND);
                    chunk.cache.backend_path = None;
                    chunk.cache.backend_identity = None;
                    changed = true;
                }
            }
            if changed {
                space.persist(&mut chunk)?;
            }
        }
        Ok(())
    }

    // ----- inodes ---------------------------------------------------------------------------

    /// At the inode's store, before data of `file` is flushed: applies the inode's pending
    /// operation and answers where the file lives in the backend (see [`Prepare`]).
    pub fn prepare(&self, index: &Index, space: &Space, file: FileId) -> Result<Option<BackendPlace>, StoreError> {
        let handle = index.inode(file).ok_or(Errno::ESTALE)?;
        let mut chunk = handle.lock();
        if chunk.removed {
            return Err(Errno::ESTALE.into());
        }
        if chunk.cut.is_some() {
            return Err(StoreError::BackendPlaceChanging);
        }
        if chunk.cache.backend_path.as_deref().is_some_and(|path| self.holds.covers(path)) {
            return Err(Errno::EBUSY.into());
        }
        self.apply_pending(space, &mut chunk)?;
        let Some(path) = chunk.cache.backend_path.clone() else { return Ok(None) };
        if chunk.cache.backend_identity.is_none() && chunk.attr.is_regular() {
            // The file was missing when loaded (or a store of an older version recorded no
            // identity): the file at the path now is taken for the file's own.
            chunk.cache.backend_identity = self.backend.identity_of(&path).map_err(io_errno)?;
            if chunk.cache.backend_identity.is_some() {
                space.persist(&mut chunk)?;
            }
        }
        self.make_links(space, &mut chunk)?;
        let (dev, ino) = chunk.cache.backend_identity.unwrap_or((0, 0));
        Ok(Some(BackendPlace { path, dev, ino }))
    }

    /// A regular file in the cached tree was cut to `len` and its chunks past the cut are gone
    /// from every server: the backend file is cut when the inode is next flushed (the caller
    /// persists the inode).
    pub fn record_cut(&self, chunk: &mut Chunk, len: u64) {
        if chunk.attr.has(EntryFlags::BACKED) && chunk.attr.is_regular() {
            chunk.cache.pending = PendingOp::after_trim(chunk.cache.pending, len);
            self.queue_chunk(chunk);
        }
    }

    /// Applies an inode's pending operation at its backend path (none: the file has no name
    /// in the backend any more, and nothing is applied).
    pub fn apply_pending(&self, space: &Space, chunk: &mut Chunk) -> Result<(), StoreError> {
        let Some(op) = chunk.cache.pending else { return Ok(()) };
        let Some(path) = chunk.cache.backend_path.clone() else {
            chunk.cache.pending = None;
            return space.persist(chunk);
        };
        let backend = &self.backend;
        let applied = match (op, chunk.attr.kind()) {
            (PendingOp::Create, Some(FileKind::Regular)) => {
                backend.create_file(&path, chunk.attr.mode, chunk.attr.file_id).and_then(|()| {
                    // The file made here is the file's own from now on.
                    chunk.cache.backend_identity = backend.identity_of(&path)?;
                    Ok(())
                })
            }
            (PendingOp::Create, Some(FileKind::Directory)) => backend.make_dir(&path, chunk.attr.mode),
            (PendingOp::Create, Some(FileKind::Symlink)) => {
                let target = String::from_utf8_lossy(&chunk.body.to_vec()?).into_owned();
                backend.make_symlink(&path, &target)
            }
            (PendingOp::Create, Some(_special)) => backend.make_special(&path, chunk.attr.mode, chunk.attr.rdev),
            (PendingOp::Create, None) => Ok(()),
            (PendingOp::Trim(len), _) => backend.trim(&path, len, chunk.cache.backend_identity),
        };
        applied.map_err(io_errno)?;
        log::debug!("applied {op:?} at {path}: identity {:?}", chunk.cache.backend_identity);
        self.backend_changed();
        chunk.cache.pending = None;
        chunk.attr.flags |= EntryFlags::IN_BACKEND;
        space.persist(chunk)
    }

    // ----- chunks ---------------------------------------------------------------------------

    /// Does one unit of flushing work. `prepare` reaches the inode's server (see [`Prepare`]);
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
            WorkItem::Removal { path } => self.apply_removal(index, space, path, true),
            WorkItem::Chunk(key) => self.flush_chunk(index, space, *key, prepare, pace),
        }
    }

    fn flush_chunk(
        &self,
        index: &Index,
        space: &Space,
        key: ChunkKey,
        prepare: Prepare<'_>,
        pace: FlushPace<'_>,
    ) -> Result<FlushOutcome, StoreError> {
        let Some(handle) = index.chunk(key) else { return Ok(FlushOutcome::Skipped) };
        let (kind_is_regular, moves) = {
            let mut chunk = handle.lock();
            if chunk.removed {
                return Ok(FlushOutcome::Skipped);
            }
            // From here on a change queues the chunk again.
            chunk.cache.queued = false;
            if !chunk.attr.has(EntryFlags::DIRTY) && !chunk.cache.has_pending_change() {
                return Ok(FlushOutcome::Skipped);
            }
            (chunk.attr.is_regular(), chunk.cache.moves)
        };
        let local_prepare = |file: FileId| self.prepare(index, space, file).map_err(|error| error.errno());
        let prepare: Prepare<'_> = if key.is_inode() { &local_prepare } else { prepare };
        // The inode's pending creation or cut reaches the backend before any of its data.
        // (Never without it: a creation applied later would replace the file, data and all.)
        let place = match prepare(key.file) {
            Ok(Some(place)) => place,
            // The file has no name in the backend (it lost its last name while open): its data
            // is never flushed.
            Ok(None) => return Ok(self.forget_dirty(&handle, space)),
            Err(Errno::ESTALE) | Err(Errno::ENOENT) => return Ok(Self::inode_missing(&handle)),
            // The file's place is changing (`StoreError::BackendPlaceChanging` at the inode).
            Err(Errno::EAGAIN) => return Ok(FlushOutcome::Deferred),
            // A directory rename is moving the file's backend path.
            Err(Errno::EBUSY) => return Ok(FlushOutcome::Held),
            Err(errno) => return Err(errno.into()),
        };
        if self.holds.covers(&place.path) {
            return Ok(FlushOutcome::Held);
        }
        let file = match kind_is_regular {
            true => match self.open_flushed_file(&place, key.file, prepare) {
                Ok(Some(file)) => Some(file),
                Ok(None) => return Ok(Self::inode_missing(&handle)),
                Err(error) if error.errno() == Errno::EBUSY => return Ok(FlushOutcome::Held),
                Err(error) => return Err(error),
            },
            false => None,
        };
        #[cfg(test)]
        crate::testing::run(&crate::testing::AFTER_FLUSH_OPEN);
        // Every backend write happens under the chunk's lock, and only while the chunk is
        // unchanged since its bytes were taken: bytes of a chunk that was cut or removed
        // meanwhile never land after the cut reached the backend (cuts are applied only once
        // the chunks past them are gone).
        let mut chunk = handle.lock();
        if chunk.removed {
            return Ok(FlushOutcome::Skipped);
        }
        if chunk.cache.moves != moves {
            // The file was renamed since `prepare` said where it lives: this place is stale.
            // The rename queued the chunk again for the new one.
            log::debug!(
                "flush of {}/{} to {}: the file moved ({moves} -> {}), not written",
                key.file,
                key.index.0,
                place.path,
                chunk.cache.moves
            );
            return Ok(FlushOutcome::Flushed { bytes: 0, clean: false });
        }
        let (version, attr) = (chunk.version, chunk.attr);
        let mut written = 0;
        let has_data = attr.is_regular() && attr.has(EntryFlags::DIRTY) && !attr.has(EntryFlags::BACKEND_DATA);
        if let (Some(file), true) = (&file, has_data) {
            let bytes = chunk.body.snapshot()?;
            let offset = key.index.first_byte(attr.chunk_size.into());
            let stored = &bytes[..bytes.len().min(attr.len as usize)];
            for (number, piece) in stored.chunks(backend::FLUSH_PIECE_BYTES).enumerate() {
                if let (FlushPace::Yielding(keep_going), true) = (pace, number > 0) {
                    // Let writers in between pieces.
                    drop(chunk);
                    if !keep_going() {
                        return Ok(FlushOutcome::Interrupted);
                    }
                    chunk = handle.lock();
                    if chunk.removed || chunk.version != version {
                        log::debug!("flush of {}/{} to {}: changed after {written} bytes", key.file, key.index.0, place.path);
                        return Ok(FlushOutcome::Flushed { bytes: written, clean: false });
                    }
                }
                file.write_all_at(piece, offset + (number * backend::FLUSH_PIECE_BYTES) as u64).map_err(io_errno)?;
                written += piece.len() as u64;
            }
            backend::extend_to(file, offset + attr.len).map_err(io_errno)?;
            self.backend_changed();
        }
        if attr.has(EntryFlags::DIRTY) && key.is_inode() && (attr.is_dir() || attr.is_regular()) {
            let xattrs = chunk.xattrs.as_deref();
            match &file {
                // Through the descriptor the data went through: a file renamed over this
                // one's path since it was opened must not get this one's mode and attributes.
                Some(file) => {
                    file.set_permissions(std::fs::Permissions::from_mode(attr.mode & 0o7777)).map_err(io_errno)?;
                    backend::write_mirrored_xattrs(&backend::XattrEntry::Open(file), &place.path, xattrs).map_err(io_errno)?;
                }
                // A directory (a directory rename holds its paths while it moves them).
                None => {
                    self.backend.set_mode(&place.path, attr.mode).map_err(io_errno)?;
                    self.backend.write_xattrs(&place.path, xattrs).map_err(io_errno)?;
                }
            }
        }
        // Still under the lock taken (or retaken) after the chunk's last check: unchanged.
        chunk.attr.flags &= !EntryFlags::DIRTY;
        if key.is_inode() {
            chunk.attr.flags |= EntryFlags::IN_BACKEND;
        }
        space.persist(&mut chunk)?;
        log::debug!(
            "flushed {}/{} to {} ({:?}): {written} bytes, data {has_data}, moves {moves}, now clean",
            key.file,
            key.index.0,
            place.path,
            place.identity()
        );
        self.note_clean(&handle, &mut chunk, space.chunk_count());
        self.counters.flushed_chunks.fetch_add(1, Ordering::Relaxed);
        self.counters.flushed_bytes.fetch_add(written, Ordering::Relaxed);
        Ok(FlushOutcome::Flushed { bytes: written, clean: true })
    }

    /// A chunk of a file that has no place in the backend (it lost its last name, or lies
    /// outside the cached tree): its changes go nowhere, and it leaves the cached tree (so it
    /// is never evicted: its bytes exist only here).
    fn forget_dirty(&self, handle: &ChunkHandle, space: &Space) -> FlushOutcome {
        let mut chunk = handle.lock();
        chunk.attr.flags &= !(EntryFlags::DIRTY | EntryFlags::BACKED);
        if let Err(error) = space.persist(&mut chunk) {
            log::warn!("cannot record a chunk as clean: {error}");
        }
        FlushOutcome::Skipped
    }

    /// What a flush does when its chunk's inode is unknown at the inode's server: nothing if
    /// the chunk is gone too, otherwise it waits (the chunk's removal may be on its way; see
    /// [`FlushOutcome::Deferred`]).
    fn inode_missing(handle: &ChunkHandle) -> FlushOutcome {
        match handle.lock().removed {
            true => FlushOutcome::Skipped,
            false => FlushOutcome::Deferred,
        }
    }

    /// Opens the backend file at `path` for writing data of `file`. A missing file was
    /// removed with the file's name (then `None`: the chunk waits until the inode knows), or
    /// the file was renamed meanwhile (then it is opened at its new place, if it is there
    /// yet). (A file deleted behind ringfs's back is not made again: its chunks wait, and are
    /// dropped from the queue after a while.)
    ///
    /// A file found at the path that is not the one the inode made or found there (`place`'s
    /// identity) is another file's: the path was given to it (a rename over this file is
    /// under way, or an unlink and a new file). Nothing is written into it (`None`); the
    /// inode soon says where this file's data goes, if anywhere.
    fn open_flushed_file(&self, place: &BackendPlace, file: FileId, prepare: Prepare<'_>) -> Result<Option<File>, StoreError> {
        // The file opened at `place`, if it is the place's own.
        let own = |opened: File, place: &BackendPlace| -> Result<Option<File>, StoreError> {
            Ok(backend::is_file(&opened, place.identity()).map_err(io_errno)?.then_some(opened))
        };
        match self.backend.open_existing(&place.path) {
            Ok(file) => return own(file, place),
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(io_errno(error)),
            Err(_) => {}
        }
        match prepare(file) {
            Err(Errno::ESTALE) | Err(Errno::ENOENT) | Err(Errno::EAGAIN) | Ok(None) => Ok(None),
            Err(errno) => Err(errno.into()),
            // Still the same place, and nothing there: the name was removed and the inode has
            // not heard of it yet (an unlink removes the name first, then the link). Making
            // the file again would leave a file in the backend that no name in ringfs has;
            // the chunk waits instead (the inode soon says "nowhere").
            Ok(Some(current)) if current.path == place.path => Ok(None),
            // Renamed meanwhile: its own file there (moved there, or made by its creation,
            // which `prepare` applied). Nothing there either: renamed once more since (a
            // file's rename moves its backend file at once), or removed; the chunk waits and
            // asks again. (Making a file there, as this once did, put a stray file at a name
            // the file had already left — or wrote this file's bytes into the next file moved
            // there: `cache.rs: files_renamed_over_each_other_at_once_stay_whole_in_the_backend`.)
            Ok(Some(current)) => match self.backend.open_existing(&current.path) {
                Ok(opened) => own(opened, &current),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                    log::debug!("flush of file {file}: {} is gone, and {} too: it waits", place.path, current.path);
                    Ok(None)
                }
                Err(error) => Err(io_errno(error)),
            },
        }
    }
}
