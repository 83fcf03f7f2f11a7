//! Operations on names: creating, opening and removing entries, listing directories,
//! finding entries, and the per-server steps of rmdir and rename.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::atomic::Ordering;

use ringfs_proto::path;
use ringfs_proto::{Attr, ChunkRef, Create, DirEntry, DirPage, EntryFlags, Errno, FileKind, FindFilter, FindResult, TailSummary};

use crate::StoreError;
use crate::backend::RemovalKind;
use crate::chunk::PendingOp;
use crate::chunk::{ChunkHandle, lock};
use crate::space::overhead_of;
use crate::store::ChunkStore;

/// Result of [`ChunkStore::create`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateOutcome {
    /// Attributes of the entry after the call.
    pub attr: Attr,
    /// False if the entry existed already.
    pub created: bool,
    /// An existing file was truncated and had chunks after chunk 0: the caller must remove
    /// them on the other servers.
    pub truncated_extended: bool,
    /// An existing file was truncated (cache mode: the caller then records the cut of the
    /// backend file with `cut_backend_file`, once the chunks are gone).
    pub truncated: bool,
}

/// A chunk copied out of the store for a rename.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MovedChunk {
    pub index: u64,
    pub attr: Attr,
    pub bytes: Vec<u8>,
}

impl ChunkStore {
    // ----- entries --------------------------------------------------------------------------

    /// Creates a file, directory or symbolic link, or opens an existing file (`exclusive`
    /// false), truncating it if asked.
    ///
    /// The parent must be in the known-directories cache; otherwise this fails with
    /// [`StoreError::ParentUnknown`]. The check and the insertion happen under the parent's
    /// directory-shard lock, the same lock [`ChunkStore::prepare_rmdir`] takes, so a create
    /// and an rmdir of its parent cannot both succeed.
    /// A new entry gets the identity `file_id` (ignored if the entry exists).
    pub fn create(&self, entry: &Create, file_id: u64) -> Result<CreateOutcome, StoreError> {
        // Cache mode: an entry that exists only in the backend exists — for opens without
        // O_EXCL or O_TRUNC, mkdir and symlink. A create that replaces the file anyway does
        // not ask the backend (docs/CONSISTENCY.md).
        let replaces = entry.mode & 0o170000 == FileKind::Regular.mode_bits() && (entry.exclusive || entry.truncate);
        if self.cache.is_some() && !replaces && self.index.head(&entry.path).is_none() {
            self.materialize(&entry.path)?;
        }
        // An entry removed between the index lookup and its lock is retried as absent; each
        // retry needs a concurrent removal to lose again, so a few attempts are plenty.
        for _ in 0..8 {
            match self.try_create(entry, file_id) {
                Err(StoreError::Fs(Errno::EAGAIN)) => continue,
                outcome => return outcome,
            }
        }
        Err(Errno::EAGAIN.into())
    }

    fn try_create(&self, entry: &Create, file_id: u64) -> Result<CreateOutcome, StoreError> {
        let parent = path::parent(&entry.path).ok_or(Errno::EEXIST)?;
        let kind = FileKind::from_mode(entry.mode).ok_or(Errno::EINVAL)?;
        if entry.chunk_size == 0 {
            return Err(Errno::EINVAL.into());
        }
        let mut dirs = self.index.dirs_of(parent);
        if parent != "/" && !dirs.known.contains(parent) {
            return Err(StoreError::ParentUnknown(parent.to_string()));
        }
        let mut files = self.index.files_of(&entry.path);
        if let Some(existing) = files.paths.get(&entry.path).and_then(|chunks| chunks.head.clone()) {
            drop(files);
            drop(dirs);
            return self.open_existing(&existing, entry, kind);
        }
        let target = entry.link_target.as_deref().unwrap_or("");
        let mut attr = Attr {
            mode: entry.mode,
            uid: entry.uid,
            gid: entry.gid,
            chunk_size: entry.chunk_size,
            len: target.len() as u64,
            file_id,
            atime_ns: entry.time_ns,
            mtime_ns: entry.time_ns,
            ctime_ns: entry.time_ns,
            flags: self.cache_flags_for(&entry.path),
            backend_len: 0,
        };
        let mut pending = None;
        // The new entry is made in the backend when flushed, replacing what is there.
        let replaced_removal = attr.has(EntryFlags::BACKED).then(|| files.removals.get(&entry.path).copied()).flatten();
        if attr.has(EntryFlags::BACKED) {
            if replaced_removal.is_some() {
                // The backend may still hold the old entry: removing the new one must reach it.
                attr.flags |= EntryFlags::IN_BACKEND;
            }
            attr.flags |= EntryFlags::DIRTY;
            pending = Some(PendingOp::Create);
        }
        self.charge(overhead_of(&entry.path))?;
        let handle = self.space.new_chunk_charged(&entry.path, 0, attr, pending)?;
        let mut filled = match target.is_empty() {
            true => Ok(()),
            false => self.fill(&mut lock(&handle), 0, &mut target.as_bytes()).map(drop),
        };
        // The removal is forgotten only once the new entry exists: a failed create leaves it.
        // A removed directory's old tree goes now: the new one's contents will be flushed.
        if filled.is_ok() && replaced_removal == Some(RemovalKind::Directory) && kind == FileKind::Directory {
            filled = self.apply_removal_now(&entry.path);
        }
        if let Err(error) = filled {
            self.discard(&entry.path, &handle);
            return Err(error);
        }
        if replaced_removal.is_some() {
            self.forget_removal(&mut dirs, &mut files, &entry.path);
        }
        if pending.is_some() {
            self.queue_chunk(&entry.path, 0, &mut lock(&handle));
        }
        files.paths.entry(entry.path.clone()).or_default().head = Some(handle);
        dirs.children.entry(parent.to_string()).or_default().insert(path::file_name(&entry.path).to_string());
        self.index.entry_count.fetch_add(1, Ordering::Relaxed);
        Ok(CreateOutcome { attr, created: true, truncated_extended: false, truncated: false })
    }

    fn open_existing(&self, handle: &ChunkHandle, entry: &Create, kind: FileKind) -> Result<CreateOutcome, StoreError> {
        let mut chunk = lock(handle);
        if chunk.removed || chunk.rmdir_pending {
            // Lost a race with a removal: the caller retries as if the entry was absent.
            return Err(Errno::EAGAIN.into());
        }
        if entry.exclusive || kind != FileKind::Regular {
            return Err(Errno::EEXIST.into());
        }
        if chunk.attr.is_dir() {
            return Err(Errno::EISDIR.into());
        }
        let mut truncated_extended = false;
        let truncated = entry.truncate && chunk.attr.is_regular();
        if truncated {
            self.space.truncate(&mut chunk, 0)?;
            truncated_extended = chunk.attr.is_extended();
            chunk.attr.len = 0;
            chunk.attr.mtime_ns = entry.time_ns;
            chunk.attr.ctime_ns = entry.time_ns;
            // Cache mode: the backend's bytes are no longer part of the file.
            chunk.attr.flags &= !EntryFlags::BACKEND_DATA;
            chunk.attr.backend_len = 0;
            // The caller records the cut (`cut_backend_file`) once the later chunks are gone.
            chunk.cache.cutting = chunk.attr.has(EntryFlags::BACKED);
            self.touched(&entry.path, 0, &mut chunk);
            self.persist(&chunk)?;
        }
        Ok(CreateOutcome { attr: chunk.attr, created: false, truncated_extended, truncated })
    }

    /// Removes the entry of a file or symbolic link (and this store's later chunks of it).
    /// `file_id` 0 removes whatever is there; otherwise only that file. Returns the removed
    /// entry's attributes: if it is extended, the caller removes its chunks on other servers.
    pub fn unlink(&self, path: &str, file_id: u64) -> Result<Attr, StoreError> {
        let parent = path::parent(path).ok_or(Errno::EISDIR)?;
        if file_id == 0 && self.index.head(path).is_none() {
            // Cache mode: a file only the backend has is removed too.
            self.materialize(path)?;
        }
        let mut dirs = self.index.dirs_of(parent);
        let mut files = self.index.files_of(path);
        let slot = files.paths.get_mut(path).ok_or(Errno::ENOENT)?;
        let head = slot.head.clone().ok_or(Errno::ENOENT)?;
        let attr = {
            let chunk = lock(&head);
            if chunk.attr.is_dir() {
                return Err(Errno::EISDIR.into());
            }
            if file_id != 0 && chunk.attr.file_id != file_id {
                return Err(Errno::ESTALE.into());
            }
            chunk.attr
        };
        slot.head = None;
        let tail = slot.take_tail(attr.file_id, 1);
        if slot.is_empty() {
            files.paths.remove(path);
        }
        dirs.remove_child(parent, path);
        if attr.has(EntryFlags::BACKED | EntryFlags::IN_BACKEND) {
            self.record_removal(&mut dirs, &mut files, path, RemovalKind::File)?;
        }
        drop(files);
        drop(dirs);
        self.discard(path, &head);
        for handle in &tail {
            self.discard(path, handle);
        }
        self.index.entry_count.fetch_sub(1, Ordering::Relaxed);
        Ok(attr)
    }

    /// Removes this store's chunks of `path` with index >= `from_index` (at least 1) that
    /// belong to `file_id` (0: to any file). Returns how many were removed.
    pub fn remove_chunks(&self, path: &str, file_id: u64, from_index: u64) -> u64 {
        let mut files = self.index.files_of(path);
        let Some(slot) = files.paths.get_mut(path) else { return 0 };
        let removed = slot.take_tail(file_id, from_index.max(1));
        if slot.is_empty() {
            files.paths.remove(path);
        }
        drop(files);
        for handle in &removed {
            self.discard(path, handle);
        }
        removed.len() as u64
    }

    /// This store's part of a file after chunk 0: its highest chunk index (>= 1) with that
    /// chunk's logical length, and the newest modification time among its chunks.
    pub fn tail_summary(&self, path: &str, file_id: u64) -> TailSummary {
        let handles = self.index.tail_of(path, file_id);
        let mut summary = TailSummary::default();
        for (index, handle) in handles {
            let chunk = lock(&handle);
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

    /// Visits this store's entries strictly inside `root` and counts those matching
    /// `filter` (see [`FindResult`]). Costs a pass over all entries held here.
    pub fn find(&self, root: &str, filter: &FindFilter) -> FindResult {
        let mut result = FindResult::default();
        for shard in &self.index.files {
            let files = lock(shard);
            for (path, chunks) in &files.paths {
                let Some(head) = &chunks.head else { continue };
                if !path::is_inside(path, root) {
                    continue;
                }
                let attr = {
                    let chunk = lock(head);
                    if chunk.removed {
                        continue;
                    }
                    chunk.attr
                };
                result.scanned += 1;
                if filter.name.as_deref().is_some_and(|pattern| !path::glob_match(pattern, path::file_name(path))) {
                    continue;
                }
                let judged_here = !(attr.is_regular() && attr.is_extended());
                if !judged_here && (filter.size.is_some() || filter.newer_than_ns.is_some()) {
                    result.undecided.push(path.clone());
                    continue;
                }
                let newer = filter.newer_than_ns.is_none_or(|time| attr.mtime_ns > time);
                let sized = filter.size.is_none_or(|size| attr.len == size);
                if newer && sized {
                    result.matched += 1;
                }
            }
        }
        result
    }

    // ----- directories ----------------------------------------------------------------------

    /// One page of the entries of `dir` held here, in name order, after `after`, with the
    /// removals recorded here in the same range of names (cache mode).
    pub fn read_dir(&self, dir: &str, after: Option<&str>, limit: usize) -> DirPage {
        let (names, more, removed) = {
            let dirs = self.index.dirs_of(dir);
            let start = match after {
                Some(name) => Bound::Excluded(name),
                None => Bound::Unbounded,
            };
            let (names, more) = match dirs.children.get(dir) {
                Some(children) => {
                    let mut range = children.range::<str, _>((start, Bound::Unbounded));
                    let names: Vec<String> = range.by_ref().take(limit.max(1)).cloned().collect();
                    (names, range.next().is_some())
                }
                None => (Vec::new(), false),
            };
            let end = match names.last() {
                Some(last) if more => Bound::Included(last.as_str()),
                _ => Bound::Unbounded,
            };
            let removed = dirs.removed.get(dir).map(|removed| removed.range::<str, _>((start, end)).cloned().collect()).unwrap_or_default();
            (names, more, removed)
        };
        let entries = names
            .into_iter()
            .filter_map(|name| {
                let handle = self.index.head(&path::join(dir, &name))?;
                let chunk = lock(&handle);
                (!chunk.removed).then(|| DirEntry { name, attr: chunk.attr })
            })
            .collect();
        DirPage { entries, more, removed }
    }

    /// Attributes of directory `path` if it exists here and is not being removed.
    pub fn lookup_dir(&self, path: &str) -> Result<Attr, StoreError> {
        let handle = self.head_checked(path, 0)?;
        let chunk = lock(&handle);
        if !chunk.attr.is_dir() {
            return Err(Errno::ENOTDIR.into());
        }
        if chunk.rmdir_pending {
            return Err(Errno::ENOENT.into());
        }
        Ok(chunk.attr)
    }

    /// `Ok` if `dir` is known to exist; otherwise the ticket to pass to
    /// [`ChunkStore::mark_known_dir`] after looking it up at its owner.
    pub fn known_dir(&self, dir: &str) -> Result<(), u64> {
        self.index.known_dir(dir)
    }

    /// Records that `dir` exists, unless a directory of its shard was forgotten since the
    /// ticket was issued (then the lookup may be stale and must be repeated).
    pub fn mark_known_dir(&self, dir: &str, ticket: u64) -> bool {
        self.index.mark_known_dir(dir, ticket)
    }

    /// First step of an rmdir on every server: forget that `dir` exists and report whether
    /// this store holds an entry inside it, and (cache mode) the names inside whose removal
    /// is recorded here. After this call no create under `dir` succeeds here without a fresh
    /// lookup of `dir` at its owner.
    pub fn prepare_rmdir(&self, dir: &str) -> (bool, Vec<String>) {
        self.index.forget_dir(dir)
    }

    /// At the owner of `dir`: marks it as being removed, so that lookups of it fail.
    pub fn begin_rmdir(&self, dir: &str) -> Result<(), StoreError> {
        if dir == "/" {
            return Err(Errno::EBUSY.into());
        }
        let handle = self.head_checked(dir, 0)?;
        let mut chunk = lock(&handle);
        if !chunk.attr.is_dir() {
            return Err(Errno::ENOTDIR.into());
        }
        if chunk.rmdir_pending {
            return Err(Errno::EBUSY.into());
        }
        chunk.rmdir_pending = true;
        Ok(())
    }

    /// Completes (`commit`) or cancels an rmdir started with [`ChunkStore::begin_rmdir`].
    pub fn finish_rmdir(&self, dir: &str, commit: bool) -> Result<(), StoreError> {
        let parent = path::parent(dir).ok_or(Errno::EBUSY)?;
        if !commit {
            if let Some(handle) = self.index.head(dir) {
                lock(&handle).rmdir_pending = false;
            }
            return Ok(());
        }
        let mut dirs = self.index.dirs_of(parent);
        let mut files = self.index.files_of(dir);
        let slot = files.paths.get_mut(dir).ok_or(Errno::ENOENT)?;
        let head = slot.head.take().ok_or(Errno::ENOENT)?;
        if slot.is_empty() {
            files.paths.remove(dir);
        }
        dirs.remove_child(parent, dir);
        if lock(&head).attr.has(EntryFlags::BACKED | EntryFlags::IN_BACKEND) {
            self.record_removal(&mut dirs, &mut files, dir, RemovalKind::Directory)?;
        }
        drop(files);
        drop(dirs);
        self.discard(dir, &head);
        self.index.entry_count.fetch_sub(1, Ordering::Relaxed);
        let mut own_shard = self.index.dirs_of(dir);
        if own_shard.children.get(dir).is_some_and(BTreeSet::is_empty) {
            own_shard.children.remove(dir);
        }
        Ok(())
    }

    // ----- rename ---------------------------------------------------------------------------

    /// Indices of this store's chunks (index >= 1) of a file, in order.
    pub fn tail_indices(&self, path: &str, file_id: u64) -> Vec<u64> {
        self.index.tail_indices(path, file_id)
    }

    /// A copy of one chunk (attributes and bytes), for moving it to another server.
    pub fn copy_chunk(&self, chunk_ref: &ChunkRef) -> Result<MovedChunk, StoreError> {
        let handle = if chunk_ref.index == 0 {
            self.head_checked(&chunk_ref.path, chunk_ref.file_id)?
        } else {
            self.index.find_tail(chunk_ref).ok_or(Errno::ENOENT)?
        };
        let mut chunk = lock(&handle);
        if chunk.removed {
            return Err(Errno::ENOENT.into());
        }
        self.ensure_loaded(&chunk_ref.path, chunk_ref.index, &handle, &mut chunk)?;
        Ok(MovedChunk { index: chunk_ref.index, attr: chunk.attr, bytes: chunk.body.to_vec()? })
    }

    /// The flags a chunk moved to `path` by a rename keeps or gets: in the cached tree it is
    /// new to the backend (dirty); elsewhere it has nothing to do with a backend.
    fn moved_flags(&self, path: &str, flags: u32) -> u32 {
        let kept = flags & EntryFlags::EXTENDED;
        match self.cache_flags_for(path) {
            0 => kept,
            backed => kept | backed | EntryFlags::DIRTY,
        }
    }

    /// Stores a chunk (index >= 1) moved here by a rename, replacing this file's chunk at
    /// that index if there is one. Chunks of other files at the same index stay.
    pub fn put_chunk(&self, chunk_ref: &ChunkRef, attr: Attr, bytes: &[u8]) -> Result<(), StoreError> {
        if chunk_ref.index == 0 || attr.file_id == 0 {
            return Err(Errno::EINVAL.into());
        }
        let attr = Attr { flags: self.moved_flags(&chunk_ref.path, attr.flags), backend_len: 0, ..attr };
        let handle = self.new_chunk(&chunk_ref.path, chunk_ref.index, attr)?;
        {
            let mut chunk = lock(&handle);
            if let Err(error) = self.fill(&mut chunk, 0, &mut &bytes[..]).and_then(|_| self.persist(&chunk)) {
                drop(chunk);
                self.discard(&chunk_ref.path, &handle);
                return Err(error);
            }
            self.touched(&chunk_ref.path, chunk_ref.index, &mut chunk);
        }
        let replaced = {
            let mut files = self.index.files_of(&chunk_ref.path);
            let candidates = files.paths.entry(chunk_ref.path.clone()).or_default().tail.entry(chunk_ref.index).or_default();
            let replaced = candidates.iter().position(|(id, _)| *id == attr.file_id).map(|at| candidates.remove(at).1);
            candidates.push((attr.file_id, handle));
            replaced
        };
        if let Some(old) = replaced {
            self.discard(&chunk_ref.path, &old);
        }
        Ok(())
    }

    /// Installs chunk 0 of a renamed file at `path`, replacing the entry there (a file or
    /// symbolic link; replacing a directory fails with EISDIR). The parent must be known, as
    /// for [`ChunkStore::create`]. Returns the replaced entry's attributes.
    pub fn install_entry(&self, path: &str, attr: Attr, bytes: &[u8]) -> Result<Option<Attr>, StoreError> {
        let parent = path::parent(path).ok_or(Errno::EBUSY)?;
        if attr.is_dir() {
            return Err(Errno::EXDEV.into());
        }
        let mut dirs = self.index.dirs_of(parent);
        if parent != "/" && !dirs.known.contains(parent) {
            return Err(StoreError::ParentUnknown(parent.to_string()));
        }
        let mut files = self.index.files_of(path);
        let existing = files.paths.get(path).and_then(|chunks| chunks.head.clone());
        let replaced = match &existing {
            Some(handle) => {
                let chunk = lock(handle);
                if chunk.attr.is_dir() {
                    return Err(Errno::EISDIR.into());
                }
                Some(chunk.attr)
            }
            None => None,
        };
        let mut attr = Attr { flags: self.moved_flags(path, attr.flags), backend_len: 0, ..attr };
        let mut pending = None;
        let replaces_removal = attr.has(EntryFlags::BACKED) && files.removals.contains_key(path);
        if attr.has(EntryFlags::BACKED) {
            // Like a new entry: made in the backend when flushed, replacing what is there.
            if replaces_removal || replaced.is_some_and(|old| old.has(EntryFlags::IN_BACKEND)) {
                attr.flags |= EntryFlags::IN_BACKEND;
            }
            pending = Some(PendingOp::Create);
        }
        self.charge(overhead_of(path))?;
        let handle = self.space.new_chunk_charged(path, 0, attr, pending)?;
        {
            let mut chunk = lock(&handle);
            if let Err(error) = self.fill(&mut chunk, 0, &mut &bytes[..]).and_then(|_| self.persist(&chunk)) {
                drop(chunk);
                self.discard(path, &handle);
                return Err(error);
            }
            self.touched(path, 0, &mut chunk);
        }
        // Only now that the new entry exists (a failure above leaves the removal in place).
        if replaces_removal {
            self.forget_removal(&mut dirs, &mut files, path);
        }
        files.paths.entry(path.to_string()).or_default().head = Some(handle);
        if replaced.is_none() {
            dirs.children.entry(parent.to_string()).or_default().insert(path::file_name(path).to_string());
            self.index.entry_count.fetch_add(1, Ordering::Relaxed);
        }
        drop(files);
        drop(dirs);
        if let Some(old) = existing {
            self.discard(path, &old);
        }
        Ok(replaced)
    }
}
