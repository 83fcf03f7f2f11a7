//! Operations on names: creating and opening files, looking names up, removing names,
//! listing directories, finding entries, and the per-server steps of rmdir, rename and link.
//!
//! An entry (a name) lives on the store that owns its path; the file it refers to lives on
//! the store its id's anchor gives (for a new file: the same store). Operations here change
//! names, and the inode only when it is held here; the server asks the inode's store for the
//! rest (see `ringfs-server`'s `coordination`).

use std::ops::Bound;
use std::sync::atomic::Ordering;

use ringfs_proto::path;
use ringfs_proto::{
    Attr, ChunkIndex, ChunkKey, Create, DirEntry, DirPage, EntryFlags, EntryRef, Errno, FileId, FileKind, FindFilter, FindResult,
    InstallMode, MovedEntry,
};

use crate::StoreError;
use crate::backend::RemovalKind;
use crate::chunk::{CacheState, Cut, PendingOp};
use crate::index::Entry;
use crate::space::entry_cost;
use crate::store::ChunkStore;

/// Result of [`ChunkStore::create`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateOutcome {
    /// What the name refers to after the call.
    pub entry: EntryRef,
    /// The file's attributes after the call, if its inode is held here (otherwise the caller
    /// asks the inode's store, and truncates the file there if asked to).
    pub attr: Option<Attr>,
    /// False if the name existed already.
    pub created: bool,
    /// An existing file held here was truncated (the caller removes its chunks on the other
    /// servers if it was extended, and in cache mode records the cut of the backend file).
    pub truncated: bool,
}

impl ChunkStore {
    /// Writes an entry to the journal of a `dir` store.
    fn journal_put(&self, path: &str, entry: EntryRef) -> Result<(), StoreError> {
        match &self.space.directory {
            Some(directory) => directory.put_entry(path, entry).map_err(StoreError::Directory),
            None => Ok(()),
        }
    }

    fn journal_remove(&self, path: &str) -> Result<(), StoreError> {
        match &self.space.directory {
            Some(directory) => directory.remove_entry(path).map_err(StoreError::Directory),
            None => Ok(()),
        }
    }

    /// Creates a file, directory, symbolic link or special file — its name and its inode, with
    /// the id `new_file` — or opens an existing file (`exclusive` false), truncating it if
    /// asked.
    ///
    /// The parent must be in the known-directories cache; otherwise this fails with
    /// [`StoreError::ParentUnknown`]. The check and the insertion happen under the parent's
    /// directory-shard lock, the same lock [`ChunkStore::prepare_rmdir`] takes, so a create
    /// and an rmdir of its parent cannot both succeed.
    pub fn create(&self, entry: &Create, new_file: FileId) -> Result<CreateOutcome, StoreError> {
        // Cache mode: a name that exists only in the backend exists — for opens without
        // O_EXCL or O_TRUNC, mkdir and symlink. A create that replaces the file anyway does
        // not ask the backend (docs/CONSISTENCY.md).
        let replaces = entry.mode & 0o170000 == FileKind::Regular.mode_bits() && (entry.exclusive || entry.truncate);
        if self.cache.is_some() && !replaces && self.index.entry(&entry.path).is_none() {
            let _ = self.entry_of(&entry.path, new_file.anchor);
        }
        // A name removed between the lookup and its lock is retried as absent at once. A name
        // still being removed (an rmdir or unlink under way) fails with EAGAIN: the caller waits
        // for the removal — outside its gate pass — and tries again.
        for _ in 0..8 {
            match self.try_create(entry, new_file) {
                Err(StoreError::NameBeingRemoved) => std::thread::yield_now(),
                outcome => return outcome,
            }
        }
        Err(StoreError::NameBeingRemoved)
    }

    fn try_create(&self, entry: &Create, new_file: FileId) -> Result<CreateOutcome, StoreError> {
        let parent = path::parent(&entry.path).ok_or(Errno::EEXIST)?;
        let kind = FileKind::from_mode(entry.mode).ok_or(Errno::EINVAL)?;
        if entry.chunk_size == 0 {
            return Err(Errno::EINVAL.into());
        }
        let mut dirs = self.index.dirs_of(parent);
        if parent != "/" && !dirs.known.contains(parent) {
            return Err(StoreError::ParentUnknown(parent.to_string()));
        }
        let mut names = self.index.names_of(&entry.path);
        if let Some(existing) = names.entries.get(&entry.path).copied() {
            drop(names);
            drop(dirs);
            return self.open_existing(existing, entry, kind);
        }
        let target = entry.link_target.as_deref().unwrap_or("");
        let backed = self.cache_flags_for(&entry.path);
        let mut attr = Attr {
            mode: entry.mode,
            uid: entry.uid,
            gid: entry.gid,
            chunk_size: entry.chunk_size,
            len: target.len() as u64,
            file_id: new_file,
            nlink: if kind == FileKind::Directory { 2 } else { 1 },
            rdev: if matches!(kind, FileKind::CharDevice | FileKind::BlockDevice) { entry.rdev } else { 0 },
            atime_ns: entry.time_ns,
            mtime_ns: entry.time_ns,
            ctime_ns: entry.time_ns,
            flags: backed,
            backend_len: 0,
            last_chunk: ChunkIndex::FIRST,
        };
        let mut cache = CacheState::default();
        // The new file is made in the backend when flushed, replacing what is there.
        let replaced_removal = (backed != 0).then(|| names.removals.get(&entry.path).copied()).flatten();
        if backed != 0 {
            if replaced_removal.is_some() {
                // The backend may still hold the old entry: removing the new one must reach it.
                attr.flags |= EntryFlags::IN_BACKEND;
            }
            attr.flags |= EntryFlags::DIRTY;
            cache.pending = Some(PendingOp::Create);
            cache.backend_path = Some(entry.path.clone());
        }
        self.charge(entry_cost(&entry.path))?;
        let created = self.new_chunk(ChunkKey::inode(new_file), attr, cache);
        let handle = match created {
            Ok(handle) => handle,
            Err(error) => {
                self.space.refund(entry_cost(&entry.path));
                return Err(error);
            }
        };
        let mut filled = match target.is_empty() {
            true => Ok(()),
            false => self.fill(&mut handle.lock(), 0, &mut target.as_bytes()),
        };
        // The removal is forgotten only once the new entry exists: a failed create leaves it.
        // A removed directory's old tree goes now: the new one's contents will be flushed.
        if filled.is_ok() && replaced_removal == Some(RemovalKind::Directory) && kind == FileKind::Directory {
            filled = self.apply_removal_now(&entry.path);
        }
        let reference = EntryRef::new(new_file, kind);
        if filled.is_ok() {
            filled = self.journal_put(&entry.path, reference);
        }
        if let Err(error) = filled {
            self.space.discard(&handle);
            self.space.refund(entry_cost(&entry.path));
            return Err(error);
        }
        if replaced_removal.is_some() {
            self.forget_removal(&mut dirs, &mut names, &entry.path);
        }
        // The creator's open, counted before anyone else can see the file.
        if entry.open_for != 0 && kind == FileKind::Regular {
            handle.lock().opens += 1;
        }
        #[cfg(test)]
        std::thread::sleep(crate::testing::PAUSE_BEFORE_INDEXING.get());
        self.index.files_of(new_file).files.entry(new_file).or_default().inode = Some(handle.clone());
        // Queued for its creation in the backend only now that the index has it: a flusher
        // that took the work before would find no chunk and drop it, and the chunk, marked
        // as queued, would never be queued again (its data never flushed; found by
        // `cache.rs: renamed_files_reach_the_backend_whole_while_flushing_immediately`).
        {
            let mut chunk = handle.lock();
            if chunk.cache.pending.is_some() {
                self.queue_chunk(&mut chunk);
            }
        }
        names.entries.insert(entry.path.clone(), Entry { target: reference, removing: false });
        dirs.add_child(&entry.path);
        self.index.entry_count.fetch_add(1, Ordering::Relaxed);
        Ok(CreateOutcome { entry: reference, attr: Some(attr), created: true, truncated: false })
    }

    fn open_existing(&self, existing: Entry, entry: &Create, kind: FileKind) -> Result<CreateOutcome, StoreError> {
        if existing.removing {
            // Lost a race with a removal: the caller retries as if the name was absent.
            return Err(StoreError::NameBeingRemoved);
        }
        if entry.exclusive || kind != FileKind::Regular {
            return Err(Errno::EEXIST.into());
        }
        if existing.target.is_dir() {
            return Err(Errno::EISDIR.into());
        }
        let Some(handle) = self.index.inode(existing.target.file) else {
            return Ok(CreateOutcome { entry: existing.target, attr: None, created: false, truncated: false });
        };
        let mut chunk = handle.lock();
        if chunk.is_gone() {
            return Err(StoreError::NameBeingRemoved);
        }
        let truncated = entry.truncate && chunk.attr.is_regular();
        if truncated {
            chunk.attr.len = 0;
            chunk.attr.mtime_ns = entry.time_ns;
            chunk.attr.ctime_ns = entry.time_ns;
            // Cache mode: the backend's bytes are no longer part of the file.
            chunk.attr.flags &= !EntryFlags::BACKEND_DATA;
            chunk.attr.backend_len = 0;
            // The caller cuts the later chunks and then ends the cut (`finish_cut`).
            chunk.cut = Some(Cut { len: 0, time_ns: entry.time_ns });
            chunk.cache.note_cut();
            self.record_then_cut(&mut chunk, 0)?;
        }
        if entry.open_for != 0 && chunk.attr.is_regular() {
            chunk.opens += 1;
        }
        Ok(CreateOutcome { entry: existing.target, attr: Some(chunk.attr), created: false, truncated })
    }

    /// The file `path` names, and its attributes if its inode is held here. With `open`, an
    /// open of a regular file held here is registered (opens count for regular files only).
    /// `anchor` is the placement hash of `path` (for entries found in a cache-mode backend).
    pub fn lookup(&self, path: &str, anchor: u32, open: bool) -> Result<(EntryRef, Option<Attr>), StoreError> {
        let entry = self.entry_of(path, anchor)?;
        let Some(handle) = self.index.inode(entry.target.file) else { return Ok((entry.target, None)) };
        let mut chunk = handle.lock();
        if chunk.is_gone() {
            // The file went after its name was read: the name was replaced or removed
            // meanwhile. The caller looks the name up again.
            return Err(Errno::ESTALE.into());
        }
        if open && chunk.attr.is_regular() {
            chunk.opens += 1;
        }
        Ok((entry.target, Some(chunk.attr)))
    }

    /// Removes the name `path` of a file, link or special file (EISDIR for a directory). With
    /// `expect`, only if it still refers to that file (ESTALE otherwise). Returns what the
    /// name referred to: the caller drops the link at the file's inode.
    pub fn unlink(&self, path: &str, anchor: u32, expect: Option<FileId>) -> Result<EntryRef, StoreError> {
        let parent = path::parent(path).ok_or(Errno::EISDIR)?;
        if expect.is_none() && self.index.entry(path).is_none() {
            // Cache mode: a file only the backend has is removed too.
            self.entry_of(path, anchor)?;
        }
        let mut dirs = self.index.dirs_of(parent);
        let mut names = self.index.names_of(path);
        let entry = *names.entries.get(path).ok_or(Errno::ENOENT)?;
        if entry.target.is_dir() {
            return Err(Errno::EISDIR.into());
        }
        if expect.is_some_and(|expected| expected != entry.target.file) {
            return Err(Errno::ESTALE.into());
        }
        self.journal_remove(path)?;
        names.entries.remove(path);
        dirs.remove_child(path);
        self.record_removal(&mut dirs, &mut names, path, RemovalKind::File)?;
        self.space.refund(entry_cost(path));
        self.index.entry_count.fetch_sub(1, Ordering::Relaxed);
        Ok(entry.target)
    }

    /// Lists one page of the entries of `dir` held here, in name order, after `after`, with
    /// the attributes of the files whose inodes are held here too, and the removals recorded
    /// here in the same range of names (cache mode).
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
                let entry = self.index.entry(&path::join(dir, &name))?;
                let attr = self.index.inode(entry.target.file).and_then(|handle| {
                    let chunk = handle.lock();
                    (!chunk.removed).then_some(chunk.attr)
                });
                Some(DirEntry { name, entry: entry.target, attr })
            })
            .collect();
        DirPage { entries, more, removed }
    }

    /// Visits this store's entries strictly inside `root` and counts those matching
    /// `filter` (see [`FindResult`]). Costs a pass over all names held here.
    pub fn find(&self, root: &str, filter: &FindFilter) -> FindResult {
        let mut result = FindResult::default();
        let needs_attributes = filter.size.is_some() || filter.newer_than_ns.is_some();
        // Judged under the name shard's lock (names before files is the lock order), so
        // that no path is copied unless it must be judged elsewhere.
        for shard in &self.index.names {
            let names = shard.lock();
            for (path, entry) in &names.entries {
                if !path::is_inside(path, root) {
                    continue;
                }
                result.scanned += 1;
                if filter.name.as_deref().is_some_and(|pattern| !path::glob_match(pattern, path::file_name(path))) {
                    continue;
                }
                if !needs_attributes {
                    result.matched += 1;
                    continue;
                }
                let attr = self.index.inode(entry.target.file).map(|handle| handle.lock().attr);
                match attr {
                    Some(attr) if !(attr.is_regular() && attr.is_extended()) => {
                        let newer = filter.newer_than_ns.is_none_or(|time| attr.mtime_ns > time);
                        let sized = filter.size.is_none_or(|size| attr.len == size);
                        result.matched += u64::from(newer && sized);
                    }
                    // An inode elsewhere, or a file whose size its last chunk knows.
                    _ => result.undecided.push(path.clone()),
                }
            }
        }
        result
    }

    /// The entry `path` refers to, if `path` is an existing directory not being removed.
    pub fn lookup_dir(&self, path: &str, anchor: u32) -> Result<EntryRef, StoreError> {
        let entry = self.entry_of(path, anchor)?;
        if !entry.target.is_dir() {
            return Err(Errno::ENOTDIR.into());
        }
        Ok(entry.target)
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
    pub fn begin_rmdir(&self, dir: &str, anchor: u32) -> Result<EntryRef, StoreError> {
        if dir == "/" {
            return Err(Errno::EBUSY.into());
        }
        self.entry_of(dir, anchor)?;
        let mut names = self.index.names_of(dir);
        let entry = names.entries.get_mut(dir).ok_or(Errno::ENOENT)?;
        if !entry.target.is_dir() {
            return Err(Errno::ENOTDIR.into());
        }
        if entry.removing {
            return Err(Errno::EBUSY.into());
        }
        entry.removing = true;
        Ok(entry.target)
    }

    /// Completes (`commit`) or cancels an rmdir started with [`ChunkStore::begin_rmdir`].
    pub fn finish_rmdir(&self, dir: &str, commit: bool) -> Result<(), StoreError> {
        let parent = path::parent(dir).ok_or(Errno::EBUSY)?;
        let mut dirs = self.index.dirs_of(parent);
        let mut names = self.index.names_of(dir);
        let entry = names.entries.get_mut(dir).ok_or(Errno::ENOENT)?;
        if !commit {
            entry.removing = false;
            return Ok(());
        }
        self.journal_remove(dir)?;
        names.entries.remove(dir);
        dirs.remove_child(dir);
        self.record_removal(&mut dirs, &mut names, dir, RemovalKind::Directory)?;
        self.space.refund(entry_cost(dir));
        self.index.entry_count.fetch_sub(1, Ordering::Relaxed);
        drop(names);
        drop(dirs);
        let mut own_shard = self.index.dirs_of(dir);
        if own_shard.children.get(dir).is_some_and(|children| children.is_empty()) {
            own_shard.children.remove(dir);
        }
        Ok(())
    }

    // ----- renames and links ----------------------------------------------------------------

    /// Makes `path` refer to `entry` (the target step of a rename or a link); `mode` is one of
    /// the [`InstallMode`] values, `expect` the file the path must hold for an exchange. A
    /// directory may replace an empty directory only with `replace_empty_dir` (the caller has
    /// checked its emptiness on every server). The parent must be known, as for
    /// [`ChunkStore::create`]. Returns what was there.
    pub fn install_entry(
        &self,
        path: &str,
        entry: EntryRef,
        mode: u8,
        expect: FileId,
        replace_empty_dir: bool,
    ) -> Result<Option<EntryRef>, StoreError> {
        let parent = path::parent(path).ok_or(Errno::EBUSY)?;
        let mut dirs = self.index.dirs_of(parent);
        if parent != "/" && !dirs.known.contains(parent) {
            return Err(StoreError::ParentUnknown(parent.to_string()));
        }
        let mut names = self.index.names_of(path);
        let existing = names.entries.get(path).copied();
        if let Some(existing) = existing {
            if existing.removing {
                return Err(Errno::ENOENT.into());
            }
            match mode {
                InstallMode::NO_REPLACE => return Err(Errno::EEXIST.into()),
                InstallMode::EXCHANGE if existing.target.file != expect => return Err(Errno::ESTALE.into()),
                InstallMode::EXCHANGE => {}
                _ => match (existing.target.is_dir(), entry.is_dir()) {
                    (true, true) if replace_empty_dir => {}
                    (true, true) => return Err(Errno::ENOTEMPTY.into()),
                    (true, false) => return Err(Errno::EISDIR.into()),
                    (false, true) => return Err(Errno::ENOTDIR.into()),
                    (false, false) => {}
                },
            }
        } else if mode == InstallMode::EXCHANGE {
            return Err(Errno::ENOENT.into());
        }
        if existing.is_none() {
            self.charge(entry_cost(path))?;
        }
        if let Err(error) = self.journal_put(path, entry) {
            if existing.is_none() {
                self.space.refund(entry_cost(path));
            }
            return Err(error);
        }
        names.entries.insert(path.to_string(), Entry { target: entry, removing: false });
        if existing.is_none() {
            dirs.add_child(path);
            self.index.entry_count.fetch_add(1, Ordering::Relaxed);
        }
        // Cache mode: the file installed here is made in the backend when flushed, replacing
        // what is there; a recorded removal of the name is then done by that.
        self.forget_removal(&mut dirs, &mut names, path);
        Ok(existing.map(|existing| existing.target))
    }

    /// Removes the entry at `path` if it refers to `expect` (the source step of a rename).
    /// Returns whether it was there.
    pub fn remove_entry(&self, path: &str, expect: FileId) -> Result<bool, StoreError> {
        let parent = path::parent(path).ok_or(Errno::EBUSY)?;
        let mut dirs = self.index.dirs_of(parent);
        let mut names = self.index.names_of(path);
        match names.entries.get(path) {
            Some(entry) if entry.target.file == expect => {}
            _ => return Ok(false),
        }
        let kind = if names.entries[path].target.is_dir() { RemovalKind::Directory } else { RemovalKind::File };
        self.journal_remove(path)?;
        names.entries.remove(path);
        dirs.remove_child(path);
        self.record_removal(&mut dirs, &mut names, path, kind)?;
        self.space.refund(entry_cost(path));
        self.index.entry_count.fetch_sub(1, Ordering::Relaxed);
        Ok(true)
    }

    /// A directory rename's step on this store: takes every entry held here strictly below
    /// `from` out of the index and returns them at their new paths below `to`. Known
    /// directories below `from` are forgotten. (Cache mode: removal records below `from` are
    /// dropped — the rename removes the directory's whole old tree from the backend.)
    pub fn take_subtree(&self, from: &str, to: &str) -> Result<Vec<MovedEntry>, StoreError> {
        let moved_path = |path: &str| format!("{to}{}", &path[from.len()..]);
        let mut entries = Vec::new();
        for (dir, children) in self.index.listed_dirs_under(from) {
            for name in children {
                let path = path::join(&dir, &name);
                let mut dirs = self.index.dirs_of(&dir);
                let mut names = self.index.names_of(&path);
                let Some(entry) = names.entries.remove(&path) else { continue };
                self.journal_remove(&path)?;
                dirs.remove_child(&path);
                self.space.refund(entry_cost(&path));
                self.index.entry_count.fetch_sub(1, Ordering::Relaxed);
                entries.push(MovedEntry { path: moved_path(&path), entry: entry.target });
            }
        }
        for (dir, removed) in self.index.removals_under(from) {
            for name in removed {
                let path = path::join(&dir, &name);
                let mut dirs = self.index.dirs_of(&dir);
                let mut names = self.index.names_of(&path);
                self.forget_removal(&mut dirs, &mut names, &path);
            }
        }
        self.index.forget_dirs_under(from);
        Ok(entries)
    }

    /// Stores entries moved here by a directory rename (their parents exist: the rename moves
    /// whole subtrees, under the namespace lock).
    pub fn put_entries(&self, entries: &[MovedEntry]) -> Result<(), StoreError> {
        for moved in entries {
            let parent = path::parent(&moved.path).ok_or(Errno::EINVAL)?;
            let mut dirs = self.index.dirs_of(parent);
            let mut names = self.index.names_of(&moved.path);
            let fresh = !names.entries.contains_key(&moved.path);
            if fresh {
                self.space.charge_anyway(entry_cost(&moved.path));
            }
            self.journal_put(&moved.path, moved.entry)?;
            names.entries.insert(moved.path.clone(), Entry { target: moved.entry, removing: false });
            if fresh {
                dirs.add_child(&moved.path);
                self.index.entry_count.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Forgets every known directory at or below `dir` (creates there ask its owner again).
    pub fn forget_dirs_under(&self, dir: &str) {
        self.index.forget_dirs_under(dir);
    }

    /// Whether an entry strictly below `dir` is held here.
    pub fn holds_entries_under(&self, dir: &str) -> bool {
        !self.index.listed_dirs_under(dir).is_empty()
    }
}
