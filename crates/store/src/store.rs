//! [`ChunkStore`]: the chunk index, the directory index and the operations on them.
//!
//! Locking. The index is split into shards by a hash of the path (`files`) and, for the
//! directory index, by a hash of the directory path (`dirs`). Each chunk has its own mutex that
//! guards its attributes and bytes, so copying a chunk's bytes never blocks other chunks.
//! Locks are always taken in the order: dir shard, file shard, chunk — never the reverse.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ringfs_proto::path;
use ringfs_proto::{
    Attr, ChunkRef, ChunkTemplate, Create, DirEntry, DirPage, EntryFlags, Errno, FileKind, FindFilter, FindResult, TailSummary,
};

use crate::backend::RemovalKind;
use crate::body::Body;
use crate::cache::{Cache, PendingOp};
use crate::directory::ChunkDirectory;
use crate::pool::BufferPool;
use crate::{ByteSink, ByteSource, Medium, StoreConfig, StoreError};

const SHARDS: usize = 64;

/// Maps and sets keyed by paths hash with xxh3: several times faster than the standard
/// library's DoS-resistant hash, and only clients holding the job's secret choose the keys.
pub(crate) type FastMap<K, V> = HashMap<K, V, xxhash_rust::xxh3::Xxh3DefaultBuilder>;
pub(crate) type FastSet<T> = HashSet<T, xxhash_rust::xxh3::Xxh3DefaultBuilder>;

/// Capacity charged per chunk for its index entry, on top of its bytes, so that a store full
/// of empty files also reports ENOSPC.
const CHUNK_OVERHEAD_BYTES: u64 = 128;

/// Most bytes of removed chunks' buffers kept for new chunks (see `pool`).
const POOL_LIMIT_BYTES: usize = 512 << 20;

/// File id of the root directory.
pub const ROOT_FILE_ID: u64 = 1;

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

pub(crate) struct Chunk {
    pub attr: Attr,
    pub body: Body,
    /// Set when the chunk has left the index; late writers must not touch it.
    pub removed: bool,
    /// Chunk 0 of a directory being removed: lookups treat it as absent.
    pub rmdir_pending: bool,
    /// Bumped by every change; a flush marks the chunk clean only if it did not move.
    pub version: u64,
    /// Cache mode, chunk 0: the change of the entry that must reach the backend first.
    pub pending: Option<PendingOp>,
    /// Cache mode: the chunk is in the list of eviction candidates.
    pub listed_clean: bool,
    /// Cache mode: the chunk is in the flush queue (it is queued at most once).
    pub queued: bool,
    /// Cache mode, chunk 0: a truncation is removing the file's chunks past its cut; the cut
    /// is recorded once they are gone. Until then no chunk of the file is flushed, so no data
    /// written meanwhile can reach the backend before the cut does.
    pub cutting: bool,
}

impl Chunk {
    fn new(attr: Attr, body: Body, pending: Option<PendingOp>) -> Chunk {
        Chunk { attr, body, removed: false, rmdir_pending: false, version: 0, pending, listed_clean: false, queued: false, cutting: false }
    }
}

pub(crate) type ChunkHandle = Arc<Mutex<Chunk>>;

/// All chunks of one path held by this store.
#[derive(Default)]
pub(crate) struct PathChunks {
    /// Chunk 0: the entry.
    pub head: Option<ChunkHandle>,
    /// Chunks 1.. by index; several files (ids) may briefly share an index during a rename.
    tail: BTreeMap<u64, Vec<(u64, ChunkHandle)>>,
}

impl PathChunks {
    fn is_empty(&self) -> bool {
        self.head.is_none() && self.tail.is_empty()
    }

    fn find_tail(&self, index: u64, file_id: u64) -> Option<ChunkHandle> {
        let candidates = self.tail.get(&index)?;
        candidates.iter().find(|(id, _)| file_id == 0 || *id == file_id).map(|(_, handle)| handle.clone())
    }
}

#[derive(Default)]
pub(crate) struct FileShard {
    pub paths: FastMap<String, PathChunks>,
    /// Cache mode: entries removed in ringfs whose removal has not reached the backend.
    pub removals: FastMap<String, RemovalKind>,
    /// Cache mode: bumped whenever a removal of this shard reaches the backend, so that a
    /// lookup that read the backend before it does not bring the removed entry back.
    pub backend_removals: u64,
}

#[derive(Default)]
pub(crate) struct DirShard {
    /// Directory path -> names of the entries inside it whose chunk 0 is held here.
    pub children: FastMap<String, BTreeSet<String>>,
    /// Cache mode: directory path -> names of the removals recorded here inside it.
    pub removed: FastMap<String, BTreeSet<String>>,
    /// Directories known to exist (parent checks of creates are answered from here).
    known: FastSet<String>,
    /// Bumped whenever a directory of this shard is forgotten, so that a lookup that raced
    /// with an rmdir cannot record a stale "exists".
    invalidations: u64,
}

/// The chunks held by one server. Thread-safe; see the module documentation for locking.
pub struct ChunkStore {
    pub(crate) files: Vec<Mutex<FileShard>>,
    pub(crate) dirs: Vec<Mutex<DirShard>>,
    pub(crate) directory: Option<ChunkDirectory>,
    pub(crate) cache: Option<Cache>,
    pool: BufferPool,
    capacity_bytes: u64,
    used_bytes: AtomicU64,
    pub(crate) entry_count: AtomicU64,
    chunk_count: AtomicU64,
}

/// Locks a mutex, taking over the data if another thread panicked while holding it (a
/// request that panics must not take the whole server down).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(crate) fn shard_of(key: &str) -> usize {
    (xxhash_rust::xxh3::xxh3_64(key.as_bytes()) % SHARDS as u64) as usize
}

fn overhead_of(path: &str) -> u64 {
    CHUNK_OVERHEAD_BYTES + path.len() as u64
}

impl ChunkStore {
    /// Opens a store. A `dir` store rebuilds its index from the chunk files it finds.
    pub fn open(config: StoreConfig) -> Result<ChunkStore, StoreError> {
        let directory = match &config.medium {
            Medium::Memory => None,
            Medium::Directory(root) => Some(ChunkDirectory::open(root).map_err(StoreError::Directory)?),
        };
        let cache = config.cache.as_ref().map(Cache::new).transpose()?;
        let store = ChunkStore {
            files: (0..SHARDS).map(|_| Mutex::default()).collect(),
            dirs: (0..SHARDS).map(|_| Mutex::default()).collect(),
            directory,
            cache,
            pool: BufferPool::new(POOL_LIMIT_BYTES),
            capacity_bytes: config.capacity_bytes,
            used_bytes: AtomicU64::new(0),
            entry_count: AtomicU64::new(0),
            chunk_count: AtomicU64::new(0),
        };
        store.recover()?;
        store.ensure_root()?;
        Ok(store)
    }

    /// Every store holds an entry for the root directory, so the root exists wherever
    /// placement puts it (owned by the server's user, mode 0755, file id 1). It is not counted
    /// as an entry.
    fn ensure_root(&self) -> Result<(), StoreError> {
        if self.head("/").is_some() {
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
        lock(&self.files[shard_of("/")]).paths.entry("/".to_string()).or_default().head = Some(handle);
        Ok(())
    }

    fn recover(&self) -> Result<(), StoreError> {
        let Some(directory) = &self.directory else { return Ok(()) };
        let recovered = directory.recover().map_err(StoreError::Directory)?;
        let count = recovered.len();
        for chunk in recovered {
            self.used_bytes.fetch_add(overhead_of(&chunk.path) + chunk.file.stored_len, Ordering::Relaxed);
            self.chunk_count.fetch_add(1, Ordering::Relaxed);
            let handle = Arc::new(Mutex::new(Chunk::new(chunk.attr, Body::File(chunk.file), chunk.pending)));
            {
                // Cache mode: what was dirty before the restart is queued again.
                let mut recovered_chunk = lock(&handle);
                if recovered_chunk.attr.has(EntryFlags::DIRTY) || recovered_chunk.pending.is_some() {
                    self.queue_chunk(&chunk.path, chunk.index, &mut recovered_chunk);
                } else {
                    self.note_clean(&chunk.path, &handle, &mut recovered_chunk);
                }
            }
            if chunk.index == 0 {
                if let Some(parent) = path::parent(&chunk.path) {
                    let name = path::file_name(&chunk.path).to_string();
                    lock(&self.dirs[shard_of(parent)]).children.entry(parent.to_string()).or_default().insert(name);
                    self.entry_count.fetch_add(1, Ordering::Relaxed);
                }
                lock(&self.files[shard_of(&chunk.path)]).paths.entry(chunk.path).or_default().head = Some(handle);
            } else {
                let file_id = chunk.attr.file_id;
                let mut files = lock(&self.files[shard_of(&chunk.path)]);
                files.paths.entry(chunk.path).or_default().tail.entry(chunk.index).or_default().push((file_id, handle));
            }
        }
        if count > 0 {
            log::info!("recovered {count} chunks from the store directory");
        }
        if self.cache.is_some() {
            for (path, kind) in directory.recover_removals().map_err(StoreError::Directory)? {
                let parent = path::parent(&path).unwrap_or("/").to_string();
                let mut dirs = lock(&self.dirs[shard_of(&parent)]);
                let mut files = lock(&self.files[shard_of(&path)]);
                let Some(head) = files.paths.get(&path).and_then(|chunks| chunks.head.clone()) else {
                    self.record_removal(&mut dirs, &mut files, &path, kind)?;
                    continue;
                };
                // A new entry replaced the removed one just before a crash, which came before
                // the removal was forgotten: finish that (a directory's old tree goes now, as
                // the create would have done; a file is replaced when its creation is flushed).
                if kind == RemovalKind::Directory && lock(&head).attr.is_dir() {
                    self.apply_removal_now(&path)?;
                }
                directory.forget_removal(&path).map_err(StoreError::Directory)?;
            }
        }
        Ok(())
    }

    // ----- capacity -------------------------------------------------------------------------

    fn charge(&self, bytes: u64) -> Result<(), Errno> {
        if bytes == 0 {
            return Ok(());
        }
        if self.capacity_bytes == 0 {
            self.used_bytes.fetch_add(bytes, Ordering::Relaxed);
            return Ok(());
        }
        loop {
            let charged = self.used_bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.capacity_bytes)
            });
            if charged.is_ok() {
                return Ok(());
            }
            // Cache mode: clean chunks make room; stop once nothing more can be dropped.
            let over = self.used_bytes.load(Ordering::Relaxed).saturating_add(bytes).saturating_sub(self.capacity_bytes);
            if self.evict(over.max(1)) == 0 {
                return Err(Errno::ENOSPC);
            }
        }
    }

    /// Charges bytes without a limit (the index entry of a chunk written through to the
    /// backend must exist even when the store is full).
    fn charge_anyway(&self, bytes: u64) {
        self.used_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn refund(&self, bytes: u64) {
        self.used_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    // ----- chunk lifecycle ------------------------------------------------------------------

    pub(crate) fn new_chunk(&self, path: &str, index: u64, attr: Attr) -> Result<ChunkHandle, StoreError> {
        self.charge(overhead_of(path))?;
        self.new_chunk_charged(path, index, attr, None)
    }

    /// Makes a chunk whose index entry is already charged.
    fn new_chunk_charged(&self, path: &str, index: u64, attr: Attr, pending: Option<PendingOp>) -> Result<ChunkHandle, StoreError> {
        let body = match &self.directory {
            None => Ok(Body::Memory(Arc::default())),
            Some(directory) => directory.create(path, index, &attr, pending).map(Body::File),
        };
        let body = body.inspect_err(|_| self.refund(overhead_of(path)))?;
        self.chunk_count.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(Mutex::new(Chunk::new(attr, body, pending))))
    }

    /// Takes a chunk that has left the index out of service and releases its space.
    pub(crate) fn discard(&self, path: &str, handle: &ChunkHandle) {
        let mut chunk = lock(handle);
        if chunk.removed {
            return;
        }
        chunk.removed = true;
        self.refund(overhead_of(path) + chunk.body.stored_len());
        std::mem::replace(&mut chunk.body, Body::Memory(Arc::default())).remove(&self.pool);
        self.chunk_count.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn persist(&self, chunk: &Chunk) -> Result<(), StoreError> {
        if let (Some(directory), Body::File(file)) = (&self.directory, &chunk.body) {
            directory.update_attr(file, &chunk.attr, chunk.pending)?;
        }
        Ok(())
    }

    /// Writes `source` into a chunk body, charging growth against the capacity.
    pub(crate) fn fill(&self, chunk: &mut Chunk, offset: u64, source: &mut dyn ByteSource) -> Result<(), StoreError> {
        let chunk_size = chunk.attr.chunk_size as u64;
        let end = offset + source.len() as u64;
        let before = chunk.body.stored_len();
        let growth = end.saturating_sub(before);
        self.charge(growth)?;
        let result = chunk.body.write(offset as usize, source, chunk_size as usize, &self.pool);
        let actual_growth = chunk.body.stored_len() - before;
        self.refund(growth - actual_growth);
        Ok(result?)
    }

    // ----- lookups --------------------------------------------------------------------------

    pub(crate) fn head(&self, path: &str) -> Option<ChunkHandle> {
        lock(&self.files[shard_of(path)]).paths.get(path).and_then(|chunks| chunks.head.clone())
    }

    /// Chunk 0 of `path`, checked against the caller's file id (0 = any): a missing entry is
    /// ENOENT for a lookup by path, ESTALE for a caller holding a file id. In cache mode a
    /// missing entry is looked up in the backend (an entry loaded from there gets the same
    /// file id every time, so a caller's id still matches).
    pub(crate) fn head_checked(&self, path: &str, file_id: u64) -> Result<ChunkHandle, StoreError> {
        let missing = if file_id == 0 { Errno::ENOENT } else { Errno::ESTALE };
        let handle = match self.head(path) {
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

    pub(crate) fn find_tail(&self, chunk: &ChunkRef) -> Option<ChunkHandle> {
        lock(&self.files[shard_of(&chunk.path)]).paths.get(&chunk.path)?.find_tail(chunk.index, chunk.file_id)
    }

    /// The chunk after chunk 0 that a write addresses, created if missing: empty, or — in
    /// cache mode, below the file's `backend_len` — holding backend data still to load.
    fn tail_or_create(&self, chunk: &ChunkRef, template: ChunkTemplate, time_ns: i64) -> Result<ChunkHandle, StoreError> {
        let attr = self.new_tail_attr(chunk, template, time_ns);
        self.tail_with(chunk, attr, false)
    }

    /// The chunk after chunk 0 that a read addresses: the one here, or in cache mode a new
    /// one for backend data below `backend_len` (to be loaded by the reader); `None` if the
    /// chunk does not exist (a hole or past the end).
    pub(crate) fn tail_for_read(&self, chunk: &ChunkRef, backend_len: u64, chunk_size: u32) -> Result<Option<ChunkHandle>, StoreError> {
        if let Some(handle) = self.find_tail(chunk) {
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
            attr.len = Self::stub_len(chunk, template.backend_len, template.chunk_size);
        }
        attr
    }

    /// The chunk `chunk` (index >= 1) of its file, created with `attr` if missing.
    fn tail_with(&self, chunk: &ChunkRef, attr: Attr, charge_anyway: bool) -> Result<ChunkHandle, StoreError> {
        if chunk.file_id == 0 {
            return Err(Errno::EINVAL.into());
        }
        let mut files = lock(&self.files[shard_of(&chunk.path)]);
        let slot = files.paths.entry(chunk.path.clone()).or_default();
        if let Some(handle) = slot.find_tail(chunk.index, chunk.file_id) {
            return Ok(handle);
        }
        let charged = if charge_anyway {
            self.charge_anyway(overhead_of(&chunk.path));
            Ok(())
        } else {
            self.charge(overhead_of(&chunk.path)).map_err(StoreError::from)
        };
        let created = charged.and_then(|()| self.new_chunk_charged(&chunk.path, chunk.index, attr, None));
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
    fn data_chunk(&self, chunk: &ChunkRef, template: ChunkTemplate, time_ns: i64) -> Result<ChunkHandle, StoreError> {
        if chunk.index == 0 { Ok(self.head_checked(&chunk.path, chunk.file_id)?) } else { self.tail_or_create(chunk, template, time_ns) }
    }

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
        if self.cache.is_some() && !replaces && self.head(&entry.path).is_none() {
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
        let mut dirs = lock(&self.dirs[shard_of(parent)]);
        if parent != "/" && !dirs.known.contains(parent) {
            return Err(StoreError::ParentUnknown(parent.to_string()));
        }
        let mut files = lock(&self.files[shard_of(&entry.path)]);
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
        let handle = self.new_chunk_charged(&entry.path, 0, attr, pending)?;
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
        self.entry_count.fetch_add(1, Ordering::Relaxed);
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
            let freed = chunk.body.stored_len();
            chunk.body.truncate(0)?;
            self.refund(freed);
            truncated_extended = chunk.attr.is_extended();
            chunk.attr.len = 0;
            chunk.attr.mtime_ns = entry.time_ns;
            chunk.attr.ctime_ns = entry.time_ns;
            // Cache mode: the backend's bytes are no longer part of the file.
            chunk.attr.flags &= !EntryFlags::BACKEND_DATA;
            chunk.attr.backend_len = 0;
            // The caller records the cut (`cut_backend_file`) once the later chunks are gone.
            chunk.cutting = chunk.attr.has(EntryFlags::BACKED);
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
        if file_id == 0 && self.head(path).is_none() {
            // Cache mode: a file only the backend has is removed too.
            self.materialize(path)?;
        }
        let mut dirs = lock(&self.dirs[shard_of(parent)]);
        let mut files = lock(&self.files[shard_of(path)]);
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
        let tail = take_tail(slot, attr.file_id, 1);
        if slot.is_empty() {
            files.paths.remove(path);
        }
        remove_child(&mut dirs, parent, path);
        if attr.has(EntryFlags::BACKED | EntryFlags::IN_BACKEND) {
            self.record_removal(&mut dirs, &mut files, path, RemovalKind::File)?;
        }
        drop(files);
        drop(dirs);
        self.discard(path, &head);
        for handle in &tail {
            self.discard(path, handle);
        }
        self.entry_count.fetch_sub(1, Ordering::Relaxed);
        Ok(attr)
    }

    /// Removes this store's chunks of `path` with index >= `from_index` (at least 1) that
    /// belong to `file_id` (0: to any file). Returns how many were removed.
    pub fn remove_chunks(&self, path: &str, file_id: u64, from_index: u64) -> u64 {
        let mut files = lock(&self.files[shard_of(path)]);
        let Some(slot) = files.paths.get_mut(path) else { return 0 };
        let removed = take_tail(slot, file_id, from_index.max(1));
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
        let handles: Vec<(u64, ChunkHandle)> = {
            let files = lock(&self.files[shard_of(path)]);
            let Some(slot) = files.paths.get(path) else { return TailSummary::default() };
            slot.tail
                .iter()
                .filter_map(|(index, candidates)| {
                    candidates.iter().find(|(id, _)| file_id == 0 || *id == file_id).map(|(_, handle)| (*index, handle.clone()))
                })
                .collect()
        };
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
        for shard in &self.files {
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

    // ----- chunk data -----------------------------------------------------------------------

    /// Attributes of a chunk. Chunk 0 is looked up by path (checked against `file_id` unless
    /// it is 0); later chunks by path, index and file id.
    pub fn stat(&self, chunk: &ChunkRef) -> Result<Attr, StoreError> {
        let handle =
            if chunk.index == 0 { self.head_checked(&chunk.path, chunk.file_id)? } else { self.find_tail(chunk).ok_or(Errno::ENOENT)? };
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

    /// The chunk size of files loaded from the backend (for chunks made by reads, which carry
    /// no template).
    pub fn backend_chunk_size(&self) -> u32 {
        self.cache().map_or(1, |cache| cache.chunk_size)
    }

    /// Whether this store holds the chunk (for chunk 0: the entry).
    pub fn holds_chunk(&self, chunk: &ChunkRef) -> bool {
        if chunk.index == 0 { self.head(&chunk.path).is_some() } else { self.find_tail(chunk).is_some() }
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
            Err(StoreError::Fs(Errno::ENOSPC)) => self.read_from_backend(&chunk_ref.path, chunk_ref.index, &chunk, offset, end, sink)?,
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
        let before = chunk.body.stored_len();
        chunk.body.truncate(len)?;
        self.refund(before - chunk.body.stored_len());
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
        let before = chunk.body.stored_len();
        chunk.body.truncate(len)?;
        self.refund(before - chunk.body.stored_len());
        chunk.attr.len = len;
        if file_len > len {
            chunk.attr.flags |= EntryFlags::EXTENDED;
        }
        chunk.attr.backend_len = chunk.attr.backend_len.min(file_len);
        chunk.attr.mtime_ns = time_ns;
        chunk.attr.ctime_ns = time_ns;
        // The caller records the cut (`cut_backend_file`) once the later chunks are gone.
        chunk.cutting = chunk.attr.has(EntryFlags::BACKED);
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

    // ----- directories ----------------------------------------------------------------------

    /// One page of the entries of `dir` held here, in name order, after `after`, with the
    /// removals recorded here in the same range of names (cache mode).
    pub fn read_dir(&self, dir: &str, after: Option<&str>, limit: usize) -> DirPage {
        let (names, more, removed) = {
            let dirs = lock(&self.dirs[shard_of(dir)]);
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
                let handle = self.head(&path::join(dir, &name))?;
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
        if dir == "/" {
            return Ok(());
        }
        let dirs = lock(&self.dirs[shard_of(dir)]);
        if dirs.known.contains(dir) { Ok(()) } else { Err(dirs.invalidations) }
    }

    /// Records that `dir` exists, unless a directory of its shard was forgotten since the
    /// ticket was issued (then the lookup may be stale and must be repeated).
    pub fn mark_known_dir(&self, dir: &str, ticket: u64) -> bool {
        let mut dirs = lock(&self.dirs[shard_of(dir)]);
        if dirs.invalidations != ticket {
            return false;
        }
        dirs.known.insert(dir.to_string());
        true
    }

    /// First step of an rmdir on every server: forget that `dir` exists and report whether
    /// this store holds an entry inside it, and (cache mode) the names inside whose removal
    /// is recorded here. After this call no create under `dir` succeeds here without a fresh
    /// lookup of `dir` at its owner.
    pub fn prepare_rmdir(&self, dir: &str) -> (bool, Vec<String>) {
        let mut dirs = lock(&self.dirs[shard_of(dir)]);
        dirs.known.remove(dir);
        dirs.invalidations += 1;
        let any = dirs.children.get(dir).is_some_and(|children| !children.is_empty());
        (any, dirs.removed.get(dir).map(|names| names.iter().cloned().collect()).unwrap_or_default())
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
            if let Some(handle) = self.head(dir) {
                lock(&handle).rmdir_pending = false;
            }
            return Ok(());
        }
        let mut dirs = lock(&self.dirs[shard_of(parent)]);
        let mut files = lock(&self.files[shard_of(dir)]);
        let slot = files.paths.get_mut(dir).ok_or(Errno::ENOENT)?;
        let head = slot.head.take().ok_or(Errno::ENOENT)?;
        if slot.is_empty() {
            files.paths.remove(dir);
        }
        remove_child(&mut dirs, parent, dir);
        if lock(&head).attr.has(EntryFlags::BACKED | EntryFlags::IN_BACKEND) {
            self.record_removal(&mut dirs, &mut files, dir, RemovalKind::Directory)?;
        }
        drop(files);
        drop(dirs);
        self.discard(dir, &head);
        self.entry_count.fetch_sub(1, Ordering::Relaxed);
        let mut own_shard = lock(&self.dirs[shard_of(dir)]);
        if own_shard.children.get(dir).is_some_and(BTreeSet::is_empty) {
            own_shard.children.remove(dir);
        }
        Ok(())
    }

    // ----- rename ---------------------------------------------------------------------------

    /// Indices of this store's chunks (index >= 1) of a file, in order.
    pub fn tail_indices(&self, path: &str, file_id: u64) -> Vec<u64> {
        let files = lock(&self.files[shard_of(path)]);
        let Some(slot) = files.paths.get(path) else { return Vec::new() };
        slot.tail.iter().filter(|(_, candidates)| candidates.iter().any(|(id, _)| *id == file_id)).map(|(index, _)| *index).collect()
    }

    /// A copy of one chunk (attributes and bytes), for moving it to another server.
    pub fn copy_chunk(&self, chunk_ref: &ChunkRef) -> Result<MovedChunk, StoreError> {
        let handle = if chunk_ref.index == 0 {
            self.head_checked(&chunk_ref.path, chunk_ref.file_id)?
        } else {
            self.find_tail(chunk_ref).ok_or(Errno::ENOENT)?
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
            let mut files = lock(&self.files[shard_of(&chunk_ref.path)]);
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
        let mut dirs = lock(&self.dirs[shard_of(parent)]);
        if parent != "/" && !dirs.known.contains(parent) {
            return Err(StoreError::ParentUnknown(parent.to_string()));
        }
        let mut files = lock(&self.files[shard_of(path)]);
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
        let handle = self.new_chunk_charged(path, 0, attr, pending)?;
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
            self.entry_count.fetch_add(1, Ordering::Relaxed);
        }
        drop(files);
        drop(dirs);
        if let Some(old) = existing {
            self.discard(path, &old);
        }
        Ok(replaced)
    }

    /// Chunks held now.
    pub(crate) fn chunk_count(&self) -> u64 {
        self.chunk_count.load(Ordering::Relaxed)
    }

    pub fn stats(&self) -> StoreStats {
        StoreStats {
            entries: self.entry_count.load(Ordering::Relaxed),
            chunks: self.chunk_count.load(Ordering::Relaxed),
            used_bytes: self.used_bytes.load(Ordering::Relaxed),
            capacity_bytes: if self.capacity_bytes > 0 { self.capacity_bytes } else { self.physical_capacity() },
        }
    }

    /// What an unlimited store can hold at most: the node's memory for `mem`, the size of the
    /// file system under the directory for `dir` (0 if unknown).
    fn physical_capacity(&self) -> u64 {
        match &self.directory {
            None => std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|text| {
                    let line = text.lines().find(|line| line.starts_with("MemTotal:"))?;
                    line.split_whitespace().nth(1)?.parse::<u64>().ok()
                })
                .map_or(0, |kibibytes| kibibytes * 1024),
            Some(directory) => directory.file_system_size().unwrap_or(0),
        }
    }
}

/// Removes from `slot` the later chunks (index >= `from_index`) of `file_id` (0: of any file).
fn take_tail(slot: &mut PathChunks, file_id: u64, from_index: u64) -> Vec<ChunkHandle> {
    let mut taken = Vec::new();
    for candidates in slot.tail.range_mut(from_index..).map(|(_, candidates)| candidates) {
        candidates.retain(|(id, handle)| {
            let matches = file_id == 0 || *id == file_id;
            if matches {
                taken.push(handle.clone());
            }
            !matches
        });
    }
    slot.tail.retain(|_, candidates| !candidates.is_empty());
    taken
}

fn remove_child(dirs: &mut DirShard, parent: &str, path: &str) {
    if let Some(children) = dirs.children.get_mut(parent) {
        children.remove(path::file_name(path));
        if children.is_empty() {
            dirs.children.remove(parent);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const REGULAR: u32 = 0o100644;
    const DIRECTORY: u32 = 0o040755;

    fn memory_store() -> ChunkStore {
        ChunkStore::open(StoreConfig::memory()).unwrap()
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("ringfs-store-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn chunk(path: &str, index: u64, file_id: u64) -> ChunkRef {
        ChunkRef { path: path.into(), index, file_id }
    }

    fn template(chunk_size: u32) -> ChunkTemplate {
        ChunkTemplate { mode: REGULAR, uid: 0, gid: 0, chunk_size, backend_len: 0 }
    }

    fn read_all(store: &ChunkStore, chunk: &ChunkRef) -> Vec<u8> {
        let mut bytes = Vec::new();
        store.read(chunk, 0, u64::MAX, &mut bytes, 0).unwrap();
        bytes
    }

    fn create_dir(store: &ChunkStore, path: &str) {
        store.create(&Create::new(path, DIRECTORY, 4096), 1).unwrap();
        let ticket = store.known_dir(path).unwrap_err();
        assert!(store.mark_known_dir(path, ticket));
    }

    #[test]
    fn written_bytes_read_back_and_holes_read_as_zeros() {
        let store = memory_store();
        store.create(&Create::new("/f", REGULAR, 100), 5).unwrap();
        let head = chunk("/f", 0, 5);
        assert_eq!(store.write(&head, 10, &mut &b"abc"[..], template(100), 1).unwrap(), 13);
        assert_eq!(read_all(&store, &head), [&[0u8; 10][..], b"abc"].concat());
        assert_eq!(store.set_chunk_len(&head, 20, template(100), 2).unwrap().len, 20);
        assert_eq!(read_all(&store, &head).len(), 20);
        assert_eq!(store.set_chunk_len(&head, 11, template(100), 3).unwrap().len, 11);
        assert_eq!(read_all(&store, &head), [&[0u8; 10][..], b"a"].concat());
        // Writing past the chunk size is refused.
        assert_eq!(store.write(&head, 99, &mut &b"xy"[..], template(100), 4).unwrap_err().errno(), Errno::EINVAL);
    }

    #[test]
    fn later_chunks_belong_to_one_file_id() {
        let store = memory_store();
        store.write(&chunk("/f", 3, 7), 0, &mut &b"new"[..], template(64), 1).unwrap();
        store.write(&chunk("/f", 3, 8), 0, &mut &b"other"[..], template(64), 1).unwrap();
        assert_eq!(read_all(&store, &chunk("/f", 3, 7)), b"new");
        assert_eq!(read_all(&store, &chunk("/f", 3, 8)), b"other");
        assert_eq!(store.read(&chunk("/f", 4, 7), 0, 10, &mut Vec::new(), 0).unwrap(), (None, 0));
        assert_eq!(store.tail_summary("/f", 7).last, Some((3, 3)));
        assert_eq!(store.remove_chunks("/f", 8, 1), 1);
        assert_eq!(store.tail_summary("/f", 8).last, None);
        assert_eq!(store.tail_summary("/f", 7), TailSummary { last: Some((3, 3)), newest_mtime_ns: 1 });
        assert_eq!(store.stats().chunks, 2, "the root directory and one chunk");
    }

    #[test]
    fn a_stale_file_id_is_refused_on_chunk_zero() {
        let store = memory_store();
        store.create(&Create::new("/f", REGULAR, 64), 5).unwrap();
        let error = store.write(&chunk("/f", 0, 6), 0, &mut &b"x"[..], template(64), 1).unwrap_err();
        assert_eq!(error.errno(), Errno::ESTALE);
        store.unlink("/f", 0).unwrap();
        let error = store.write(&chunk("/f", 0, 5), 0, &mut &b"x"[..], template(64), 1).unwrap_err();
        assert_eq!(error.errno(), Errno::ESTALE);
        assert_eq!(store.stat(&chunk("/f", 0, 0)).unwrap_err().errno(), Errno::ENOENT);
    }

    #[test]
    fn creates_follow_posix_rules() {
        let store = memory_store();
        let entry = Create::new("/d/f", REGULAR, 64);
        assert!(matches!(store.create(&entry, 1), Err(StoreError::ParentUnknown(parent)) if parent == "/d"));
        create_dir(&store, "/d");
        assert!(store.create(&entry, 1).unwrap().created);
        assert_eq!(store.create(&entry, 1).unwrap_err().errno(), Errno::EEXIST);
        let open = Create { exclusive: false, ..entry.clone() };
        assert!(!store.create(&open, 1).unwrap().created);
        let mkdir_over_file = Create::new("/d/f", DIRECTORY, 64);
        assert_eq!(store.create(&mkdir_over_file, 2).unwrap_err().errno(), Errno::EEXIST);
        let open_dir = Create { exclusive: false, ..Create::new("/d", REGULAR, 64) };
        assert_eq!(store.create(&open_dir, 3).unwrap_err().errno(), Errno::EISDIR);
        assert_eq!(store.unlink("/d", 0).unwrap_err().errno(), Errno::EISDIR);
    }

    #[test]
    fn truncating_open_empties_the_file_and_reports_extension() {
        let store = memory_store();
        store.create(&Create::new("/f", REGULAR, 64), 1).unwrap();
        store.write(&chunk("/f", 0, 1), 0, &mut &[1u8; 64][..], template(64), 1).unwrap();
        store.mark_extended("/f", 1).unwrap();
        let reopen = Create { exclusive: false, truncate: true, ..Create::new("/f", REGULAR, 64) };
        let outcome = store.create(&reopen, 2).unwrap();
        assert!(outcome.truncated_extended);
        // The mark stays: open files may have cached it (see `truncate_head`).
        assert_eq!((outcome.attr.len, outcome.attr.file_id, outcome.attr.is_extended()), (0, 1, true));
    }

    #[test]
    fn rmdir_preparation_invalidates_known_directories() {
        let store = memory_store();
        create_dir(&store, "/d");
        assert_eq!(store.known_dir("/d"), Ok(()));
        store.create(&Create::new("/d/f", REGULAR, 64), 1).unwrap();
        assert!(store.prepare_rmdir("/d").0);
        // A lookup that started before the invalidation cannot record a stale answer.
        let stale_ticket = store.known_dir("/d").unwrap_err() - 1;
        assert!(!store.mark_known_dir("/d", stale_ticket));
        assert!(matches!(store.create(&Create::new("/d/g", REGULAR, 64), 2), Err(StoreError::ParentUnknown(_))));
        store.unlink("/d/f", 0).unwrap();
        assert!(!store.prepare_rmdir("/d").0);
        store.begin_rmdir("/d").unwrap();
        assert_eq!(store.lookup_dir("/d").unwrap_err().errno(), Errno::ENOENT);
        store.finish_rmdir("/d", true).unwrap();
        assert_eq!(store.stat(&chunk("/d", 0, 0)).unwrap_err().errno(), Errno::ENOENT);
        assert_eq!(store.stats().entries, 0);
        assert_eq!(store.lookup_dir("/").unwrap().file_id, ROOT_FILE_ID);
    }

    #[test]
    fn read_dir_pages_through_entries_in_name_order() {
        let store = memory_store();
        for i in 0..25 {
            store.create(&Create::new(&format!("/f{i:02}"), REGULAR, 64), i + 1).unwrap();
        }
        let mut names = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = store.read_dir("/", after.as_deref(), 10);
            names.extend(page.entries.iter().map(|entry| entry.name.clone()));
            after = names.last().cloned();
            if !page.more {
                break;
            }
        }
        assert_eq!(names, (0..25).map(|i| format!("f{i:02}")).collect::<Vec<_>>());
        assert!(store.read_dir("/missing", None, 10).entries.is_empty());
    }

    #[test]
    fn capacity_limit_gives_enospc_and_frees_on_unlink() {
        let store = ChunkStore::open(StoreConfig { capacity_bytes: 10_000, ..StoreConfig::memory() }).unwrap();
        let baseline = store.stats().used_bytes;
        store.create(&Create::new("/f", REGULAR, 1 << 20), 1).unwrap();
        let error = store.write(&chunk("/f", 0, 1), 0, &mut &vec![0u8; 20_000][..], template(1 << 20), 1).unwrap_err();
        assert_eq!(error.errno(), Errno::ENOSPC);
        store.write(&chunk("/f", 0, 1), 0, &mut &vec![0u8; 5_000][..], template(1 << 20), 1).unwrap();
        let used = store.stats().used_bytes;
        assert!(used >= 5_000);
        store.unlink("/f", 0).unwrap();
        assert_eq!(store.stats().used_bytes, baseline);
    }

    #[test]
    fn rename_steps_move_chunks_and_replace_the_target() {
        let store = memory_store();
        store.create(&Create::new("/a", REGULAR, 8), 1).unwrap();
        store.create(&Create::new("/b", REGULAR, 8), 2).unwrap();
        store.write(&chunk("/a", 0, 1), 0, &mut &b"12345678"[..], template(8), 1).unwrap();
        store.write(&chunk("/a", 1, 1), 0, &mut &b"9"[..], template(8), 1).unwrap();
        assert_eq!(store.tail_indices("/a", 1), [1]);
        let moved = store.copy_chunk(&chunk("/a", 1, 1)).unwrap();
        store.put_chunk(&chunk("/b", 1, 1), moved.attr, &moved.bytes).unwrap();
        let head = store.copy_chunk(&chunk("/a", 0, 0)).unwrap();
        let replaced = store.install_entry("/b", head.attr, &head.bytes).unwrap();
        assert_eq!(replaced.map(|attr| attr.file_id), Some(2));
        store.unlink("/a", 1).unwrap();
        assert_eq!(read_all(&store, &chunk("/b", 0, 1)), b"12345678");
        assert_eq!(read_all(&store, &chunk("/b", 1, 1)), b"9");
        assert_eq!(store.stats().entries, 1);
    }

    #[test]
    fn shared_reads_are_not_changed_by_later_writes() {
        let store = memory_store();
        let target = chunk("/s", 1, 3);
        store.write(&target, 0, &mut &b"before"[..], template(64), 1).unwrap();
        store.set_chunk_len(&target, 10, template(64), 1).unwrap();
        let shared = store.read_shared(&target, 2, 100, 0).unwrap();
        assert_eq!(shared.len, 8);
        let (bytes, range) = shared.bytes.unwrap();
        store.write(&target, 0, &mut &b"AFTER!"[..], template(64), 2).unwrap();
        assert_eq!(&bytes[range], b"fore");
        assert_eq!(read_all(&store, &target), b"AFTER!\0\0\0\0");
        assert!(store.read_shared(&chunk("/s", 2, 3), 0, 1, 0).unwrap().attr.is_none());
    }

    #[test]
    fn find_counts_entries_below_a_root_and_defers_spread_files() {
        let store = memory_store();
        create_dir(&store, "/d");
        for (index, time) in [(1, 10), (2, 30), (10, 30)] {
            let entry = Create { time_ns: time, ..Create::new(&format!("/d/f{index:02}"), REGULAR, 64) };
            store.create(&entry, index).unwrap();
            store.write(&chunk(&format!("/d/f{index:02}"), 0, index), 0, &mut &[7u8; 5][..], template(64), time).unwrap();
        }
        store.mark_extended("/d/f10", 10).unwrap();
        store.create(&Create::new("/elsewhere", REGULAR, 64), 99).unwrap();
        let filter = FindFilter { newer_than_ns: Some(20), size: Some(5), name: Some("*0*".into()) };
        let found = store.find("/d", &filter);
        assert_eq!((found.scanned, found.matched), (3, 1), "f02 matches; f01 is too old");
        assert_eq!(found.undecided, ["/d/f10"]);
        assert_eq!(store.find("/", &FindFilter::default()).scanned, 5);
    }

    #[test]
    fn directory_store_survives_reopening() {
        let root = temp_dir("reopen");
        let config = StoreConfig { medium: Medium::Directory(root.clone()), capacity_bytes: 0, cache: None };
        {
            let store = ChunkStore::open(config.clone()).unwrap();
            create_dir(&store, "/d");
            store.create(&Create::new("/d/f", REGULAR, 16), 9).unwrap();
            store.write(&chunk("/d/f", 0, 9), 0, &mut &b"0123456789abcdef"[..], template(16), 1).unwrap();
            store.write(&chunk("/d/f", 2, 9), 4, &mut &b"xyz"[..], template(16), 2).unwrap();
            store.mark_extended("/d/f", 9).unwrap();
            store.create(&Create { link_target: Some("/d/f".into()), ..Create::new("/d/l", 0o120777, 16) }, 3).unwrap();
            store.create(&Create::new("/gone", REGULAR, 16), 4).unwrap();
            store.unlink("/gone", 0).unwrap();
        }
        let store = ChunkStore::open(config).unwrap();
        assert_eq!(read_all(&store, &chunk("/d/f", 0, 9)), b"0123456789abcdef");
        assert_eq!(read_all(&store, &chunk("/d/f", 2, 9)), b"\0\0\0\0xyz");
        assert!(store.stat(&chunk("/d/f", 0, 0)).unwrap().is_extended());
        assert_eq!(read_all(&store, &chunk("/d/l", 0, 0)), b"/d/f");
        let names: Vec<String> = store.read_dir("/d", None, 100).entries.into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["f", "l"]);
        assert_eq!(store.stat(&chunk("/gone", 0, 0)).unwrap_err().errno(), Errno::ENOENT);
        assert_eq!(store.stats().entries, 3);
        assert!(store.stat(&chunk("/", 0, 0)).unwrap().is_dir());
        std::fs::remove_dir_all(root).unwrap();
    }

    proptest! {
        /// Random writes and length changes on one chunk, checked against a plain vector.
        #[test]
        fn chunk_matches_reference_model(
            operations in proptest::collection::vec((0u64..300, proptest::collection::vec(any::<u8>(), 0..80), any::<bool>()), 1..40),
            use_directory in any::<bool>(),
        ) {
            let root = temp_dir("model");
            let medium = if use_directory { Medium::Directory(root.clone()) } else { Medium::Memory };
            let store = ChunkStore::open(StoreConfig { medium, capacity_bytes: 0, cache: None }).unwrap();
            let target = chunk("/m", 1, 42);
            let mut model: Vec<u8> = Vec::new();
            for (offset, bytes, shrink) in operations {
                if shrink {
                    let len = offset.min(model.len() as u64);
                    store.set_chunk_len(&target, len, template(400), 1).unwrap();
                    model.truncate(len as usize);
                } else {
                    store.write(&target, offset, &mut &bytes[..], template(400), 1).unwrap();
                    let end = offset as usize + bytes.len();
                    if model.len() < end && !bytes.is_empty() {
                        model.resize(end, 0);
                    }
                    if model.len() < offset as usize {
                        model.resize(offset as usize, 0);
                    }
                    model[offset as usize..end].copy_from_slice(&bytes);
                }
                prop_assert_eq!(read_all(&store, &target), model.clone());
            }
            let _ = std::fs::remove_dir_all(root);
        }
    }
}
