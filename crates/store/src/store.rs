//! [`ChunkStore`]: the store of one server, and the hooks through which its operations reach
//! the parts below it.
//!
//! The store is made of an [`Index`] (which chunks it holds, directory listings, known
//! directories), a [`Space`] (the medium, buffer pool and capacity account) and, in cache mode,
//! a [`Cache`]. The operations users see are in `namespace` (entries) and `data` (chunk
//! bytes); they call the index, the space and the cache through the small methods here, so
//! that nothing below them depends on anything above.

use std::sync::atomic::Ordering;

use ringfs_proto::path;
use ringfs_proto::{Attr, ChunkRef, ChunkTemplate, EntryFlags, Errno, FileKind};

use crate::backend::{BackendDir, RemovalKind};
use crate::body::Body;
use crate::cache::Cache;
use crate::chunk::{Chunk, ChunkHandle, lock};
use crate::directory::ChunkDirectory;
use crate::index::{DirShard, FileShard, Index};
use crate::space::{Space, overhead_of};
use crate::{ByteSource, Medium, StoreConfig, StoreError};

/// File id of the root directory.
pub const ROOT_FILE_ID: u64 = 1;

/// Usage figures of a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Entries (chunk 0 of files, directories, symbolic links).
    pub entries: u64,
    pub chunks: u64,
    /// Bytes charged against the capacity (chunk bytes plus per-chunk overhead).
    pub used_bytes: u64,
    /// The configured capacity, or for an unlimited store what the node can hold.
    pub capacity_bytes: u64,
}

/// The chunks held by one server. Thread-safe; see `index` for the locking order.
pub struct ChunkStore {
    pub(crate) index: Index,
    pub(crate) space: Space,
    pub(crate) cache: Option<Cache>,
}

impl ChunkStore {
    /// Opens a store. A `dir` store rebuilds its index from the chunk files it finds.
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

    /// Every store holds an entry for the root directory, so the root exists wherever
    /// placement puts it (owned by the server's user, mode 0755, file id 1). It is not counted
    /// as an entry.
    fn ensure_root(&self) -> Result<(), StoreError> {
        if self.index.head("/").is_some() {
            return Ok(());
        }
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0);
        let attr = Attr {
            mode: FileKind::Directory.mode_bits() | 0o755,
            uid,
            gid,
            chunk_size: 4096,
            len: 0,
            file_id: ROOT_FILE_ID,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            flags: if self.cache_flags_for("/") != 0 { EntryFlags::BACKED | EntryFlags::IN_BACKEND } else { 0 },
            backend_len: 0,
        };
        let handle = self.new_chunk("/", 0, attr)?;
        self.index.files_of("/").paths.entry("/".to_string()).or_default().head = Some(handle);
        Ok(())
    }

    fn recover(&self) -> Result<(), StoreError> {
        let Some(directory) = &self.space.directory else { return Ok(()) };
        let recovered = directory.recover().map_err(StoreError::Directory)?;
        let count = recovered.len();
        for chunk in recovered {
            self.space.count_recovered(&chunk.path, chunk.file.stored_len);
            let handle = std::sync::Arc::new(std::sync::Mutex::new(Chunk::new(chunk.attr, Body::File(chunk.file), chunk.pending)));
            {
                // Cache mode: what was dirty before the restart is queued again.
                let mut recovered_chunk = lock(&handle);
                if recovered_chunk.attr.has(EntryFlags::DIRTY) || recovered_chunk.cache.pending.is_some() {
                    self.queue_chunk(&chunk.path, chunk.index, &mut recovered_chunk);
                } else {
                    self.note_clean(&chunk.path, &handle, &mut recovered_chunk);
                }
            }
            if chunk.index == 0 {
                if let Some(parent) = path::parent(&chunk.path) {
                    let name = path::file_name(&chunk.path).to_string();
                    self.index.dirs_of(parent).children.entry(parent.to_string()).or_default().insert(name);
                    self.index.entry_count.fetch_add(1, Ordering::Relaxed);
                }
                self.index.files_of(&chunk.path).paths.entry(chunk.path).or_default().head = Some(handle);
            } else {
                let file_id = chunk.attr.file_id;
                let mut files = self.index.files_of(&chunk.path);
                files.paths.entry(chunk.path).or_default().tail.entry(chunk.index).or_default().push((file_id, handle));
            }
        }
        if count > 0 {
            log::info!("recovered {count} chunks from the store directory");
        }
        if let Some(cache) = &self.cache {
            for (path, kind) in directory.recover_removals().map_err(StoreError::Directory)? {
                let parent = path::parent(&path).unwrap_or("/").to_string();
                let mut dirs = self.index.dirs_of(&parent);
                let mut files = self.index.files_of(&path);
                let Some(head) = files.paths.get(&path).and_then(|chunks| chunks.head.clone()) else {
                    cache.record_removal(&self.space, &mut dirs, &mut files, &path, kind)?;
                    continue;
                };
                // A new entry replaced the removed one just before a crash, which came before
                // the removal was forgotten: finish that (a directory's old tree goes now, as
                // the create would have done; a file is replaced when its creation is flushed).
                if kind == RemovalKind::Directory && lock(&head).attr.is_dir() {
                    cache.apply_removal_now(&path)?;
                }
                directory.forget_removal(&path).map_err(StoreError::Directory)?;
            }
        }
        Ok(())
    }

    pub fn stats(&self) -> StoreStats {
        StoreStats {
            entries: self.index.entry_count.load(Ordering::Relaxed),
            chunks: self.space.chunk_count(),
            used_bytes: self.space.used_bytes(),
            capacity_bytes: self.space.capacity(),
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

    pub(crate) fn new_chunk(&self, path: &str, index: u64, attr: Attr) -> Result<ChunkHandle, StoreError> {
        self.charge(overhead_of(path))?;
        self.space.new_chunk_charged(path, index, attr, None)
    }

    pub(crate) fn fill(&self, chunk: &mut Chunk, offset: u64, source: &mut dyn ByteSource) -> Result<(), StoreError> {
        self.space.fill(chunk, offset, source, &|bytes| self.charge(bytes))
    }

    pub(crate) fn persist(&self, chunk: &Chunk) -> Result<(), StoreError> {
        self.space.persist(chunk)
    }

    pub(crate) fn discard(&self, path: &str, handle: &ChunkHandle) {
        self.space.discard(path, handle)
    }

    // ----- cache hooks ----------------------------------------------------------------------

    /// Flags a new chunk of `path` starts with: [`EntryFlags::BACKED`] under the mount path.
    pub(crate) fn cache_flags_for(&self, path: &str) -> u32 {
        self.cache.as_ref().map_or(0, |cache| cache.flags_for(path))
    }

    /// Records a change of a chunk: bumps its version and, in the cached tree, marks it dirty
    /// and queues it for flushing.
    pub(crate) fn touched(&self, path: &str, index: u64, chunk: &mut Chunk) {
        chunk.version += 1;
        if let Some(cache) = &self.cache {
            cache.touched(path, index, chunk);
        }
    }

    pub(crate) fn queue_chunk(&self, path: &str, index: u64, chunk: &mut Chunk) {
        if let Some(cache) = &self.cache {
            cache.queue_chunk(path, index, chunk);
        }
    }

    pub(crate) fn note_clean(&self, path: &str, handle: &ChunkHandle, chunk: &mut Chunk) {
        if let Some(cache) = &self.cache {
            cache.note_clean(path, handle, chunk, self.space.chunk_count());
        }
    }

    /// Cache mode: an entry missing here looked up in the backend (see `Cache::materialize`).
    pub(crate) fn materialize(&self, path: &str) -> Result<Option<ChunkHandle>, StoreError> {
        match &self.cache {
            Some(cache) => cache.materialize(&self.index, &self.space, path),
            None => Ok(None),
        }
    }

    /// Loads a chunk whose bytes are in the backend (the caller holds its lock).
    pub(crate) fn ensure_loaded(&self, path: &str, index: u64, handle: &ChunkHandle, chunk: &mut Chunk) -> Result<(), StoreError> {
        match &self.cache {
            Some(cache) => cache.ensure_loaded(&self.space, path, index, handle, chunk),
            None if chunk.attr.has(EntryFlags::BACKEND_DATA) => Err(Errno::EIO.into()),
            None => Ok(()),
        }
    }

    pub(crate) fn record_removal(
        &self,
        dirs: &mut DirShard,
        files: &mut FileShard,
        path: &str,
        kind: RemovalKind,
    ) -> Result<(), StoreError> {
        match &self.cache {
            Some(cache) => cache.record_removal(&self.space, dirs, files, path, kind),
            None => Ok(()),
        }
    }

    pub(crate) fn forget_removal(&self, dirs: &mut DirShard, files: &mut FileShard, path: &str) {
        if let Some(cache) = &self.cache {
            cache.forget_removal(&self.space, dirs, files, path);
        }
    }

    pub(crate) fn apply_removal_now(&self, path: &str) -> Result<(), StoreError> {
        self.cache.as_ref().ok_or(Errno::EIO)?.apply_removal_now(path)
    }

    /// Whether a missing chunk of a file may be backend data (see `Cache::backend_holds`).
    pub(crate) fn backend_holds(&self, chunk: &ChunkRef, backend_len: u64, chunk_size: u32) -> bool {
        self.cache.is_some() && Cache::backend_holds(chunk, backend_len, chunk_size)
    }

    // ----- lookups --------------------------------------------------------------------------

    /// Chunk 0 of `path`, checked against the caller's file id (0 = any): a missing entry is
    /// ENOENT for a lookup by path, ESTALE for a caller holding a file id. In cache mode a
    /// missing entry is looked up in the backend (an entry loaded from there gets the same
    /// file id every time, so a caller's id still matches).
    pub(crate) fn head_checked(&self, path: &str, file_id: u64) -> Result<ChunkHandle, StoreError> {
        let missing = if file_id == 0 { Errno::ENOENT } else { Errno::ESTALE };
        let handle = match self.index.head(path) {
            Some(handle) => handle,
            None => self.materialize(path)?.ok_or(missing)?,
        };
        let chunk = lock(&handle);
        if chunk.removed {
            return Err(missing.into());
        }
        if file_id != 0 && chunk.attr.file_id != file_id {
            return Err(Errno::ESTALE.into());
        }
        drop(chunk);
        Ok(handle)
    }

    /// The chunk after chunk 0 that a write addresses, created if missing: empty, or — in
    /// cache mode, below the file's `backend_len` — holding backend data still to load.
    pub(crate) fn tail_or_create(&self, chunk: &ChunkRef, template: ChunkTemplate, time_ns: i64) -> Result<ChunkHandle, StoreError> {
        let attr = self.new_tail_attr(chunk, template, time_ns);
        self.tail_with(chunk, attr, false)
    }

    /// The chunk after chunk 0 that a read addresses: the one here, or in cache mode a new
    /// one for backend data below `backend_len` (to be loaded by the reader); `None` if the
    /// chunk does not exist (a hole or past the end).
    pub(crate) fn tail_for_read(&self, chunk: &ChunkRef, backend_len: u64, chunk_size: u32) -> Result<Option<ChunkHandle>, StoreError> {
        if let Some(handle) = self.index.find_tail(chunk) {
            return Ok(Some(handle));
        }
        if chunk.file_id == 0 || !self.backend_holds(chunk, backend_len, chunk_size) {
            return Ok(None);
        }
        let template = ChunkTemplate { mode: FileKind::Regular.mode_bits() | 0o644, uid: 0, gid: 0, chunk_size, backend_len };
        let attr = self.new_tail_attr(chunk, template, 0);
        self.tail_with(chunk, attr, false).map(Some)
    }

    /// Like [`ChunkStore::tail_or_create`], but the index entry is made even when the store is
    /// full (for writing through to the backend).
    pub(crate) fn tail_for_write_through(
        &self,
        chunk: &ChunkRef,
        template: ChunkTemplate,
        time_ns: i64,
    ) -> Result<ChunkHandle, StoreError> {
        let mut attr = self.new_tail_attr(chunk, template, time_ns);
        attr.flags |= EntryFlags::BACKEND_DATA;
        self.tail_with(chunk, attr, true)
    }

    fn new_tail_attr(&self, chunk: &ChunkRef, template: ChunkTemplate, time_ns: i64) -> Attr {
        let mut attr = Attr {
            mode: template.mode,
            uid: template.uid,
            gid: template.gid,
            chunk_size: template.chunk_size,
            len: 0,
            file_id: chunk.file_id,
            atime_ns: time_ns,
            mtime_ns: time_ns,
            ctime_ns: time_ns,
            flags: self.cache_flags_for(&chunk.path),
            backend_len: 0,
        };
        if self.backend_holds(chunk, template.backend_len, template.chunk_size) {
            attr.flags |= EntryFlags::BACKEND_DATA;
            attr.len = Cache::stub_len(chunk, template.backend_len, template.chunk_size);
        }
        attr
    }

    /// The chunk `chunk` (index >= 1) of its file, created with `attr` if missing.
    fn tail_with(&self, chunk: &ChunkRef, attr: Attr, charge_anyway: bool) -> Result<ChunkHandle, StoreError> {
        if chunk.file_id == 0 {
            return Err(Errno::EINVAL.into());
        }
        let mut files = self.index.files_of(&chunk.path);
        let slot = files.paths.entry(chunk.path.clone()).or_default();
        if let Some(handle) = slot.find_tail(chunk.index, chunk.file_id) {
            return Ok(handle);
        }
        let charged = if charge_anyway {
            self.space.charge_anyway(overhead_of(&chunk.path));
            Ok(())
        } else {
            self.charge(overhead_of(&chunk.path)).map_err(StoreError::from)
        };
        let created = charged.and_then(|()| self.space.new_chunk_charged(&chunk.path, chunk.index, attr, None));
        let handle = match created {
            Ok(handle) => handle,
            Err(error) => {
                if slot.is_empty() {
                    files.paths.remove(&chunk.path);
                }
                return Err(error);
            }
        };
        slot.tail.entry(chunk.index).or_default().push((chunk.file_id, handle.clone()));
        Ok(handle)
    }

    /// The chunk a data operation addresses: chunk 0 must exist; later chunks are created.
    pub(crate) fn data_chunk(&self, chunk: &ChunkRef, template: ChunkTemplate, time_ns: i64) -> Result<ChunkHandle, StoreError> {
        if chunk.index == 0 { self.head_checked(&chunk.path, chunk.file_id) } else { self.tail_or_create(chunk, template, time_ns) }
    }
}
