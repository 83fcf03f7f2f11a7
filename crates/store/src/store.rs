//! [`ChunkStore`]: the store of one server, and the hooks through which its operations reach
//! the parts below it.
//!
//! The store is made of an [`Index`] (its names, directory listings, known directories and
//! chunks), a [`Space`] (the medium, buffer pool and capacity account) and, in cache mode, a
//! [`Cache`]. The operations users see are in `namespace` (names) and `data` (files and their
//! chunks); they call the index, the space and the cache through the small methods here, so
//! that nothing below them depends on anything above.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use ringfs_proto::{Attr, ChunkIndex, ChunkKey, ChunkTemplate, EntryFlags, EntryRef, Errno, FileId, FileKind};

use crate::backend::{BackendDir, RemovalKind};
use crate::body::Body;
use crate::cache::{BackendFile, Cache};
use crate::chunk::{CacheState, Chunk, ChunkHandle};
use crate::directory::ChunkDirectory;
use crate::index::{DirShard, Entry, Index, NameShard};
use crate::space::{CHUNK_OVERHEAD_BYTES, Space};
use crate::{ByteSource, Medium, StoreConfig, StoreError};

/// Usage figures of a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Names held (the root is not counted).
    pub entries: u64,
    /// Chunks held (inodes included).
    pub chunks: u64,
    /// Bytes charged against the capacity (chunk bytes plus per-chunk and per-name overhead).
    pub used_bytes: u64,
    /// The configured capacity, or for an unlimited store what the node can hold.
    pub capacity_bytes: u64,
    /// Files whose last name is gone but which are still open.
    pub open_unlinked: u64,
}

/// The names and chunks held by one server. Thread-safe; see `index` for the locking order.
pub struct ChunkStore {
    pub(crate) index: Index,
    pub(crate) space: Space,
    pub(crate) cache: Option<Cache>,
}

impl ChunkStore {
    /// Opens a store. A `dir` store rebuilds its index from the chunk files and the entry
    /// journal it finds.
    pub fn open(config: StoreConfig) -> Result<ChunkStore, StoreError> {
        let directory = match &config.medium {
            Medium::Memory => None,
            Medium::Directory(root) => Some(ChunkDirectory::open(root).map_err(StoreError::Directory)?),
        };
        let cache = config.cache.as_ref().map(Cache::new).transpose()?;
        let store = ChunkStore { index: Index::new(), space: Space::new(directory, config.capacity_bytes), cache };
        store.recover()?;
        store.ensure_root()?;
        Ok(store)
    }

    /// Every store holds the root directory — its entry and its inode ([`FileId::ROOT`]) — so
    /// the root exists wherever placement puts it (owned by the server's user, mode 0755). It
    /// is not counted as an entry.
    fn ensure_root(&self) -> Result<(), StoreError> {
        if self.index.inode(FileId::ROOT).is_none() {
            // SAFETY: getuid/getgid cannot fail.
            let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0);
            let cached = self.cache_flags_for("/") != 0;
            let attr = Attr {
                mode: FileKind::Directory.mode_bits() | 0o755,
                uid,
                gid,
                chunk_size: 4096,
                len: 0,
                file_id: FileId::ROOT,
                nlink: 2,
                rdev: 0,
                atime_ns: now,
                mtime_ns: now,
                ctime_ns: now,
                flags: if cached { EntryFlags::BACKED | EntryFlags::IN_BACKEND } else { 0 },
                backend_len: 0,
                last_chunk: ChunkIndex::FIRST,
            };
            let cache = CacheState { backend_path: cached.then(|| "/".to_string()), ..CacheState::default() };
            let handle = self.new_chunk(ChunkKey::inode(FileId::ROOT), attr, cache)?;
            self.index.files_of(FileId::ROOT).files.entry(FileId::ROOT).or_default().inode = Some(handle);
        }
        let root = Entry { target: EntryRef::new(FileId::ROOT, FileKind::Directory), removing: false };
        self.index.names_of("/").entries.insert("/".to_string(), root);
        Ok(())
    }

    fn recover(&self) -> Result<(), StoreError> {
        let Some(directory) = &self.space.directory else { return Ok(()) };
        let recovered = directory.recover().map_err(StoreError::Directory)?;
        let count = recovered.len();
        let mut unreferenced = Vec::new();
        for chunk in recovered {
            let xattr_bytes = chunk.xattrs.as_ref().map_or(0, crate::chunk::xattr_bytes);
            self.space.count_recovered(chunk.file.stored_len + xattr_bytes);
            let record = chunk.backend_path.as_deref().and_then(CacheState::parse_backend_record);
            let (backend_path, backend_identity, links, moving) = match record {
                Some(record) => (Some(record.path), record.identity, record.links, record.moving),
                None => (None, None, Vec::new(), None),
            };
            let mut cache = CacheState { pending: chunk.pending, backend_path, backend_identity, links, moving, ..CacheState::default() };
            if let Some(caching) = &self.cache {
                caching.settle_move_after_restart(&mut cache);
            }
            let mut recovered = Chunk::new(chunk.key.index, chunk.attr, Body::File(chunk.file), cache);
            recovered.set_xattrs(chunk.xattrs.unwrap_or_default());
            // A truncation cut short: the server finishes it (`ChunkStore::unfinished_cuts`).
            recovered.cut = chunk.cut;
            // Bytes past the recorded length are what a write that grew the chunk stored
            // before the server died, without recording the length: the write did not happen
            // (its client got an error). Kept, a later growth of the file would show them.
            let len = recovered.attr.len;
            if recovered.body.stored_len() > len {
                self.space.truncate(&mut recovered, len).map_err(StoreError::Fs)?;
            }
            let handle = Arc::new(parking_lot::Mutex::new(recovered));
            {
                let mut recovered_chunk = handle.lock();
                if chunk.key.is_inode() && recovered_chunk.doom_if_unreferenced() && !chunk.key.file.is_root() {
                    // A file whose last name went while it was open: nobody has it open now.
                    unreferenced.push(chunk.key.file);
                } else if recovered_chunk.attr.has(EntryFlags::DIRTY) || recovered_chunk.cache.has_pending_change() {
                    // Cache mode: what was dirty before the restart is queued again.
                    self.queue_chunk(&mut recovered_chunk);
                } else {
                    self.note_clean(&handle, &mut recovered_chunk);
                }
            }
            let mut files = self.index.files_of(chunk.key.file);
            let chunks = files.files.entry(chunk.key.file).or_default();
            if chunk.key.is_inode() {
                chunks.inode = Some(handle);
            } else {
                chunks.tail.insert(chunk.key.index, handle);
            }
        }
        for file in unreferenced {
            self.delete_file(file);
        }
        let entries = directory.recover_entries().map_err(StoreError::Directory)?;
        for (path, target) in &entries {
            self.space.charge_anyway(crate::space::entry_cost(path));
            self.index.names_of(path).entries.insert(path.clone(), Entry { target: *target, removing: false });
            if let Some(parent) = ringfs_proto::path::parent(path) {
                self.index.dirs_of(parent).add_child(path);
                self.index.entry_count.fetch_add(1, Ordering::Relaxed);
            }
        }
        if count + entries.len() > 0 {
            log::info!("recovered {count} chunks and {} names from the store directory", entries.len());
        }
        if let Some(cache) = &self.cache {
            for (path, kind) in directory.recover_removals().map_err(StoreError::Directory)? {
                let parent = ringfs_proto::path::parent(&path).unwrap_or("/").to_string();
                let mut dirs = self.index.dirs_of(&parent);
                let mut names = self.index.names_of(&path);
                let Some(entry) = names.entries.get(&path).copied() else {
                    cache.record_removal(&self.space, &mut dirs, &mut names, &path, kind)?;
                    continue;
                };
                // A new entry replaced the removed one just before a crash, which came before
                // the removal was forgotten: finish that (a directory's old tree goes now, as
                // the create would have done; a file is replaced when its creation is flushed).
                if kind == RemovalKind::Directory && entry.target.is_dir() {
                    cache.apply_removal_now(&path)?;
                }
                directory.forget_removal(&path).map_err(StoreError::Directory)?;
            }
        }
        Ok(())
    }

    pub fn stats(&self) -> StoreStats {
        let open_unlinked = self
            .index
            .files
            .iter()
            .map(|shard| {
                shard.lock().files.values().filter_map(|chunks| chunks.inode.as_ref()).filter(|inode| inode.lock().attr.nlink == 0).count()
                    as u64
            })
            .sum();
        StoreStats {
            entries: self.index.entry_count.load(Ordering::Relaxed),
            chunks: self.space.chunk_count(),
            used_bytes: self.space.used_bytes(),
            capacity_bytes: self.space.capacity(),
            open_unlinked,
        }
    }

    /// The backend this store caches, if it is in cache mode.
    pub fn backend(&self) -> Option<&BackendDir> {
        self.cache.as_ref().map(|cache| &cache.backend)
    }

    // ----- space ----------------------------------------------------------------------------

    /// Charges bytes against the capacity; in cache mode clean chunks make room first.
    pub(crate) fn charge(&self, bytes: u64) -> Result<(), Errno> {
        match &self.cache {
            Some(cache) => cache.charge(&self.space, bytes),
            None => self.space.charge(bytes),
        }
    }

    pub(crate) fn new_chunk(&self, key: ChunkKey, attr: Attr, cache: CacheState) -> Result<ChunkHandle, StoreError> {
        self.charge(CHUNK_OVERHEAD_BYTES)?;
        self.space.new_chunk_charged(key, attr, cache)
    }

    /// Writes bytes into a chunk; its growth uses its file's reservation first.
    pub(crate) fn fill(&self, chunk: &mut Chunk, offset: u64, source: &mut dyn ByteSource) -> Result<(), StoreError> {
        let file = chunk.attr.file_id;
        self.space.fill(chunk, offset, source, &|bytes| {
            let prepaid = self.space.take_reserved(file, bytes);
            self.charge(bytes - prepaid).inspect_err(|_| self.space.add_reserved(file, prepaid))
        })
    }

    /// Reserves room for `file` (`fallocate`): `needed` more bytes are charged now (ENOSPC
    /// if they do not fit, with nothing charged) and used by the file's later growth here.
    /// A store without a capacity limit refuses, as Linux does, more than the node can hold
    /// (its memory, or the size of the `dir` store's file system). The reservation ends when
    /// the file's chunks here are removed or truncated (and with a restart: it is kept in
    /// memory only).
    pub fn reserve(&self, file: FileId, needed: u64) -> Result<(), Errno> {
        if self.space.beyond_node(needed) {
            return Err(Errno::ENOSPC);
        }
        self.charge(needed)?;
        self.space.add_reserved(file, needed);
        Ok(())
    }

    /// Gives back up to `bytes` of `file`'s reservation (a `fallocate` that failed on
    /// another server).
    pub fn unreserve(&self, file: FileId, bytes: u64) {
        self.space.release_reserved(file, bytes);
    }

    /// The chunks of `file` this store holds with an index in `first..=last`, each with the
    /// bytes it stores.
    pub fn stored_chunks(&self, file: FileId, first: ChunkIndex, last: ChunkIndex) -> Vec<(ChunkIndex, u64)> {
        self.index
            .chunks_of(file)
            .into_iter()
            .filter(|(index, _)| (first..=last).contains(index))
            .map(|(index, handle)| (index, handle.lock().body.stored_len()))
            .collect()
    }

    pub(crate) fn persist(&self, chunk: &mut Chunk) -> Result<(), StoreError> {
        self.space.persist(chunk)
    }

    /// Removes a file's inode and its chunks held here; returns whether chunks of it may
    /// exist on other servers (the inode was marked extended).
    pub(crate) fn delete_file(&self, file: FileId) -> ChunkIndex {
        let chunks = self.index.files_of(file).files.remove(&file).unwrap_or_default();
        self.space.release_reserved(file, u64::MAX);
        let last_chunk = chunks.inode.as_ref().map_or(ChunkIndex::FIRST, |inode| inode.lock().attr.last_chunk);
        for handle in chunks.inode.iter().chain(chunks.tail.values()) {
            self.space.discard(handle);
        }
        last_chunk
    }

    // ----- cache hooks ----------------------------------------------------------------------

    /// Flags a new inode created at `path` starts with: [`EntryFlags::BACKED`] in the cached
    /// tree.
    pub(crate) fn cache_flags_for(&self, path: &str) -> u32 {
        self.cache.as_ref().map_or(0, |cache| cache.flags_for(path))
    }

    /// Records a change of a chunk: bumps its version and, in the cached tree, marks it dirty
    /// and queues it for flushing.
    pub(crate) fn touched(&self, chunk: &mut Chunk) {
        chunk.version.bump();
        if let Some(cache) = &self.cache {
            cache.touched(chunk);
        }
    }

    /// Cache mode, before a chunk's bytes change: a chunk not dirty yet is recorded dirty
    /// (and queued) first, so that a `dir`-store server that dies in the middle of the change
    /// flushes whatever the chunk holds after its restart. (Recorded only after the change, a
    /// chunk changed but still recorded clean was never flushed again, and ringfs and the
    /// backend differed for good: `cache.rs: files_written_while_a_server_is_killed_…`.)
    pub(crate) fn dirty_before_change(&self, chunk: &mut Chunk) -> Result<(), StoreError> {
        if self.space.directory.is_none() || !chunk.attr.has(EntryFlags::BACKED) || chunk.attr.has(EntryFlags::DIRTY) {
            return Ok(());
        }
        self.touched(chunk);
        self.persist(chunk)
    }

    /// Cuts a chunk's stored bytes to `len` once its header records the change the caller
    /// made (its new length, a cut under way) and the chunk as dirty: a `dir` store that dies
    /// in between drops the bytes past the recorded length at its restart (`recover`). Cut
    /// first, a crash left the old length recorded over fewer bytes — zeros in ringfs where
    /// the backend kept the old bytes, with no cut left to reach it (`cache.rs:
    /// files_written_while_a_server_is_killed_…`).
    pub(crate) fn record_then_cut(&self, chunk: &mut Chunk, len: u64) -> Result<(), StoreError> {
        self.touched(chunk);
        self.persist(chunk)?;
        #[cfg(test)]
        if crate::testing::DIE_BEFORE_CUTTING_BYTES.get() {
            return Err(Errno::EIO.into());
        }
        self.space.truncate(chunk, len)?;
        Ok(())
    }

    pub(crate) fn queue_chunk(&self, chunk: &mut Chunk) {
        if let Some(cache) = &self.cache {
            cache.queue_chunk(chunk);
        }
    }

    pub(crate) fn note_clean(&self, handle: &ChunkHandle, chunk: &mut Chunk) {
        if let Some(cache) = &self.cache {
            cache.note_clean(handle, chunk, self.space.chunk_count());
        }
    }

    /// Loads a chunk whose bytes are in the backend (the caller holds its lock).
    pub(crate) fn ensure_loaded(&self, handle: &ChunkHandle, chunk: &mut Chunk, backend: Option<&BackendFile>) -> Result<(), StoreError> {
        match &self.cache {
            Some(cache) => cache.ensure_loaded(&self.space, handle, chunk, backend.map(|backend| backend.path.as_str())),
            None if chunk.attr.has(EntryFlags::BACKEND_DATA) => Err(Errno::EIO.into()),
            None => Ok(()),
        }
    }

    pub(crate) fn record_removal(
        &self,
        dirs: &mut DirShard,
        names: &mut NameShard,
        path: &str,
        kind: RemovalKind,
    ) -> Result<(), StoreError> {
        match &self.cache {
            Some(cache) if cache.backend.covers(path) => cache.record_removal(&self.space, dirs, names, path, kind),
            _ => Ok(()),
        }
    }

    pub(crate) fn forget_removal(&self, dirs: &mut DirShard, names: &mut NameShard, path: &str) {
        if let Some(cache) = &self.cache {
            cache.forget_removal(&self.space, dirs, names, path);
        }
    }

    pub(crate) fn apply_removal_now(&self, path: &str) -> Result<(), StoreError> {
        self.cache.as_ref().ok_or(Errno::EIO)?.apply_removal_now(path)
    }

    // ----- lookups --------------------------------------------------------------------------

    /// The entry of `path`: held here, or in cache mode found in the backend (with `anchor`,
    /// the placement hash of `path`, for its file id). ENOENT if there is none (or it is a
    /// directory being removed).
    pub(crate) fn entry_of(&self, path: &str, anchor: u32) -> Result<Entry, StoreError> {
        let entry = match self.index.entry(path) {
            Some(entry) => Some(entry),
            None => match &self.cache {
                Some(cache) => cache.materialize(&self.index, &self.space, path, anchor)?,
                None => None,
            },
        };
        match entry {
            Some(entry) if !entry.removing => Ok(entry),
            _ => Err(Errno::ENOENT.into()),
        }
    }

    /// The inode of `file`; ESTALE if this store does not hold it (the file is gone or going).
    pub(crate) fn inode_checked(&self, file: FileId) -> Result<ChunkHandle, StoreError> {
        let handle = self.index.inode(file).ok_or(Errno::ESTALE)?;
        if handle.lock().is_gone() {
            return Err(Errno::ESTALE.into());
        }
        Ok(handle)
    }

    /// The chunk after chunk 0 that a write addresses, created if missing: empty, or — in
    /// cache mode, below the file's `backend_len` — holding backend data still to load.
    pub(crate) fn tail_or_create(
        &self,
        key: ChunkKey,
        template: ChunkTemplate,
        time_ns: i64,
        backend: Option<&BackendFile>,
    ) -> Result<ChunkHandle, StoreError> {
        let attr = self.new_tail_attr(key, template, time_ns, backend);
        self.tail_with(key, attr, false)
    }

    /// The chunk after chunk 0 that a read addresses: the one here, or in cache mode a new
    /// one for backend data below `backend_len` (to be loaded by the reader); `None` if the
    /// chunk does not exist (a hole or past the end).
    pub(crate) fn tail_for_read(
        &self,
        key: ChunkKey,
        backend: Option<&BackendFile>,
        chunk_size: u32,
    ) -> Result<Option<ChunkHandle>, StoreError> {
        if let Some(handle) = self.index.chunk(key) {
            return Ok(Some(handle));
        }
        let backend_len = backend.map_or(0, |backend| backend.len);
        if self.cache.is_none() || !Cache::backend_holds(key, backend_len, chunk_size) {
            return Ok(None);
        }
        let template = ChunkTemplate { mode: FileKind::Regular.mode_bits() | 0o644, uid: 0, gid: 0, chunk_size, backend_len };
        let attr = self.new_tail_attr(key, template, 0, backend);
        self.tail_with(key, attr, false).map(Some)
    }

    /// Like [`ChunkStore::tail_or_create`], but the index entry is made even when the store is
    /// full (for writing through to the backend).
    pub(crate) fn tail_for_write_through(
        &self,
        key: ChunkKey,
        template: ChunkTemplate,
        time_ns: i64,
        backend: Option<&BackendFile>,
    ) -> Result<ChunkHandle, StoreError> {
        let mut attr = self.new_tail_attr(key, template, time_ns, backend);
        attr.flags |= EntryFlags::BACKEND_DATA;
        self.tail_with(key, attr, true)
    }

    fn new_tail_attr(&self, key: ChunkKey, template: ChunkTemplate, time_ns: i64, backend: Option<&BackendFile>) -> Attr {
        let backend_len = backend.map_or(0, |backend| backend.len);
        let mut attr = Attr {
            mode: template.mode,
            uid: template.uid,
            gid: template.gid,
            chunk_size: template.chunk_size,
            len: 0,
            file_id: key.file,
            nlink: 0,
            rdev: 0,
            atime_ns: time_ns,
            mtime_ns: time_ns,
            ctime_ns: time_ns,
            // In cache mode every data chunk starts out in the cached tree; its first flush asks
            // the inode, and a chunk of a file with no backend place leaves the tree then.
            flags: if self.cache.is_some() { EntryFlags::BACKED } else { 0 },
            backend_len: 0,
            last_chunk: ChunkIndex::FIRST,
        };
        if self.cache.is_some() && Cache::backend_holds(key, backend_len, template.chunk_size) {
            attr.flags |= EntryFlags::BACKEND_DATA;
            attr.len = Cache::stub_len(key, backend_len, template.chunk_size);
        }
        attr
    }

    /// The chunk `key` (index >= 1) of its file, created with `attr` if missing.
    fn tail_with(&self, key: ChunkKey, attr: Attr, charge_anyway: bool) -> Result<ChunkHandle, StoreError> {
        if key.is_inode() {
            return Err(Errno::EINVAL.into());
        }
        let mut files = self.index.files_of(key.file);
        let chunks = files.files.entry(key.file).or_default();
        if let Some(handle) = chunks.tail.get(&key.index) {
            return Ok(handle.clone());
        }
        let charged = if charge_anyway {
            self.space.charge_anyway(CHUNK_OVERHEAD_BYTES);
            Ok(())
        } else {
            self.charge(CHUNK_OVERHEAD_BYTES).map_err(StoreError::from)
        };
        let created = charged.and_then(|()| self.space.new_chunk_charged(key, attr, CacheState::default()));
        let handle = match created {
            Ok(handle) => handle,
            Err(error) => {
                if chunks.is_empty() {
                    files.files.remove(&key.file);
                }
                return Err(error);
            }
        };
        chunks.tail.insert(key.index, handle.clone());
        Ok(handle)
    }

    /// The chunk a data operation addresses: the inode must exist; later chunks are created.
    pub(crate) fn data_chunk(
        &self,
        key: ChunkKey,
        template: ChunkTemplate,
        time_ns: i64,
        backend: Option<&BackendFile>,
    ) -> Result<ChunkHandle, StoreError> {
        if key.is_inode() { self.inode_checked(key.file) } else { self.tail_or_create(key, template, time_ns, backend) }
    }
}
