//! The chunk store of one ringfs server.
//!
//! A ringfs server holds the names (entries) whose paths placement gives it, and the chunks of
//! files whose (file anchor, chunk index) placement gives it. Names and files are apart: an
//! entry maps a path to a file id ([`ringfs_proto::FileId`]); chunk 0 of a file is its *inode*
//! (attributes, link count, opens, first bytes) and the chunks after it hold the rest of its
//! bytes, all keyed by the file id. So renames and hard links change names only, and a file
//! lives while it has a name or an open.
//!
//! What it provides:
//! - name operations (create, lookup, unlink, install and remove entries for renames and
//!   links, rmdir steps, subtree moves for directory renames) with a directory index, so
//!   listing a directory costs O(entries of that directory held here);
//! - file operations by id (stat, open and close, link counts, write, read, lengths, fsync)
//!   that copy bytes once, straight between the chunk and a [`ByteSource`] / [`ByteSink`];
//! - the *known directories* cache that makes parent checks of creates local (see
//!   [`ChunkStore::create`] and [`ChunkStore::prepare_rmdir`]);
//! - a capacity limit (ENOSPC) and usage statistics;
//! - two media: `mem` (heap buffers) and `dir` (one file per chunk and a journal of names
//!   under a local directory; survives a server restart, rebuilt by [`ChunkStore::open`]);
//! - cache mode ([`CacheConfig`]): names and files of a backend directory loaded on demand,
//!   dirty tracking with per-chunk versions, a deduplicated work queue of chunks and removals
//!   to flush (rebuilt after a restart), flushing steps, eviction of clean chunks when full
//!   (see the `cache` module).
//!
//! What it does not do: networking, placement or coordination between servers. Operations that
//! span servers (unlink of a file whose inode is elsewhere, rmdir, rename, link) are driven by
//! `ringfs-server`, which calls the per-server steps here.
//!
//! The crate is layered one way: `chunk` (a chunk and its cache state) under `index` (the
//! maps) and `space` (media, buffers, capacity), under `cache` (which reaches chunks only
//! through the index and the space), under the store's operations (`store`, `namespace`,
//! `data`, `caching`).
//!
//! ```
//! use ringfs_store::{ChunkStore, StoreConfig};
//! use ringfs_proto::{ChunkKey, Create, FileId, FileKind};
//! let store = ChunkStore::open(StoreConfig::memory()).unwrap();
//! let entry = Create::new("/hello", FileKind::Regular.mode_bits() | 0o644, 4096);
//! let file = store.create(&entry, FileId { anchor: 1, serial: 7 }).unwrap().entry.file;
//! store.write(ChunkKey::inode(file), 0, &mut &b"hi"[..], entry.template(), 0, None).unwrap();
//! let mut bytes = Vec::new();
//! store.read(ChunkKey::inode(file), 0, 100, &mut bytes, None).unwrap();
//! assert_eq!(bytes, b"hi");
//! ```

pub mod backend;
mod body;
mod cache;
mod caching;
mod chunk;
mod data;
mod directory;
mod index;
pub mod io;
mod namespace;
mod pool;
mod space;
mod store;
#[cfg(test)]
mod testing;
mod xattr;

pub use backend::{BackendDir, RemovalKind};
pub use cache::{BackendFile, BackendMove, FlushOutcome, FlushPace, Prepare, QueuedWork, WorkItem};
pub use chunk::Cut;
pub use data::{Deleted, SharedRead};
pub use io::{ByteSink, ByteSource};
pub use namespace::CreateOutcome;
pub use store::{ChunkStore, StoreStats};

use std::path::PathBuf;

use ringfs_proto::Errno;
use thiserror::Error;

/// Where a store keeps chunk bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Medium {
    /// Heap memory of the server process; gone when the server exits.
    Memory,
    /// One file per chunk under this directory (NVMe, PMEM in fsdax mode, tmpfs).
    Directory(PathBuf),
}

/// Cache mode: the store caches a backend directory (the parallel file system).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// The backend directory.
    pub backend: PathBuf,
    /// The ringfs directory it appears at (`/` for the whole name space).
    pub mount_path: String,
    /// Chunk size of files loaded from the backend.
    pub chunk_size: u32,
}

/// Configuration of a [`ChunkStore`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    pub medium: Medium,
    /// Bytes the store may hold (chunk bytes plus a fixed cost per chunk); 0 = no limit.
    pub capacity_bytes: u64,
    pub cache: Option<CacheConfig>,
}

impl StoreConfig {
    /// An unlimited in-memory store.
    pub fn memory() -> StoreConfig {
        StoreConfig { medium: Medium::Memory, capacity_bytes: 0, cache: None }
    }
}

/// Why a store operation failed.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The operation fails with this POSIX error (ENOENT, EEXIST, ENOSPC, ...).
    #[error("{0}")]
    Fs(Errno),
    /// The parent directory of a new entry is not known to exist on this server; the server
    /// must look it up at its owner, record it with [`ChunkStore::mark_known_dir`], and retry.
    #[error("parent directory {0} is not known here")]
    ParentUnknown(String),
    /// The `dir` medium's directory could not be opened or scanned.
    #[error("store directory: {0}")]
    Directory(std::io::Error),
    /// The cache configuration is unusable (no such backend directory, bad mount path).
    #[error("cache: {0}")]
    Cache(String),
    /// The name is being removed (an unlink or rmdir under way, here or in the backend) while
    /// it was created or loaded: the caller waits for the removal to end and tries again.
    #[error("the name is being removed")]
    NameBeingRemoved,
    /// Cache mode: the file's place in the backend is changing (a cut of the file, or a
    /// rename over it, is under way): its flush waits and tries again.
    #[error("the file's backend place is changing")]
    BackendPlaceChanging,
}

impl StoreError {
    /// The errno a client sees for this error.
    pub fn errno(&self) -> Errno {
        match self {
            StoreError::Fs(errno) => *errno,
            StoreError::ParentUnknown(_) => Errno::ENOENT,
            StoreError::Directory(error) => Errno::from(std::io::Error::new(error.kind(), error.to_string())),
            StoreError::Cache(_) => Errno::EINVAL,
            // On the wire (`FlushPrepare`, a create's retry) "not now, try again".
            StoreError::NameBeingRemoved | StoreError::BackendPlaceChanging => Errno::EAGAIN,
        }
    }
}

impl From<Errno> for StoreError {
    fn from(errno: Errno) -> Self {
        StoreError::Fs(errno)
    }
}

impl From<std::io::Error> for StoreError {
    fn from(error: std::io::Error) -> Self {
        StoreError::Fs(Errno::from(error))
    }
}

#[cfg(test)]
mod tests;
