//! The bytes of one chunk: a heap buffer (`mem` store) or a chunk file (`dir` store).

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ringfs_proto::Errno;

use crate::io::{ByteSink, ByteSource, as_uninit};
use crate::pool::BufferPool;

/// Location of one chunk file and where its data starts.
#[derive(Debug)]
pub(crate) struct ChunkFile {
    pub location: PathBuf,
    pub data_offset: u64,
    /// Bytes of data stored in the file (may be less than the chunk's logical length).
    pub stored_len: u64,
}

/// Where a chunk's bytes live. The bytes may be shorter than the chunk's logical length; the
/// rest reads as zeros.
///
/// Memory bodies are shared (`Arc`) so that a read can lease them to a client without a copy:
/// a write to a leased body copies it first (copy-on-write), so a lease never sees a change.
#[derive(Debug)]
pub(crate) enum Body {
    Memory(Arc<Vec<u8>>),
    File(ChunkFile),
}

thread_local! {
    /// Per-thread staging buffer for file-backed chunks, reused across requests.
    static STAGING: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn with_staging<T>(len: usize, action: impl FnOnce(&mut [u8]) -> T) -> T {
    STAGING.with(|staging| {
        let mut staging = staging.borrow_mut();
        if staging.len() < len {
            staging.resize(len, 0);
        }
        action(&mut staging[..len])
    })
}

impl Body {
    /// Bytes actually stored.
    pub fn stored_len(&self) -> u64 {
        match self {
            Body::Memory(bytes) => bytes.len() as u64,
            Body::File(file) => file.stored_len,
        }
    }

    /// Writes `source` at `offset`, zero-filling any gap after the stored bytes.
    /// `capacity_hint` is the chunk size: the buffer grows towards it in few steps, taking
    /// buffers from `pool`.
    pub fn write(&mut self, offset: usize, source: &mut dyn ByteSource, capacity_hint: usize, pool: &BufferPool) -> Result<(), Errno> {
        if source.is_empty() {
            return Ok(());
        }
        let end = offset + source.len();
        match self {
            Body::Memory(shared) => {
                let bytes = Arc::make_mut(shared);
                if end > bytes.capacity() {
                    let target = end.max(bytes.capacity().saturating_mul(2).min(capacity_hint));
                    let mut bigger = pool.take(target);
                    bigger.extend_from_slice(bytes);
                    pool.give(std::mem::replace(bytes, bigger));
                }
                if offset > bytes.len() {
                    bytes.resize(offset, 0);
                }
                let overlap_end = end.min(bytes.len());
                if offset < overlap_end {
                    source.read_into(as_uninit(&mut bytes[offset..overlap_end]))?;
                }
                if end > bytes.len() {
                    let old_len = bytes.len();
                    source.read_into(&mut bytes.spare_capacity_mut()[..end - old_len])?;
                    // SAFETY: read_into succeeded, so bytes old_len..end are initialised.
                    unsafe { bytes.set_len(end) };
                }
                Ok(())
            }
            Body::File(file) => {
                let handle = OpenOptions::new().write(true).open(&file.location)?;
                let at = file.data_offset + offset as u64;
                match source.as_slice() {
                    Some(slice) => handle.write_all_at(slice, at)?,
                    None => with_staging(source.len(), |staging| {
                        source.read_into(as_uninit(staging))?;
                        handle.write_all_at(staging, at).map_err(Errno::from)
                    })?,
                }
                file.stored_len = file.stored_len.max(end as u64);
                Ok(())
            }
        }
    }

    /// Sends bytes `offset..end` of the chunk to `sink`: stored bytes, then zeros up to `end`.
    pub fn read(&self, offset: u64, end: u64, sink: &mut dyn ByteSink) -> Result<(), Errno> {
        let stored_end = end.min(self.stored_len());
        if offset < stored_end {
            match self {
                Body::Memory(bytes) => sink.write_from(&bytes[offset as usize..stored_end as usize])?,
                Body::File(file) => {
                    let handle = File::open(&file.location)?;
                    with_staging((stored_end - offset) as usize, |staging| {
                        handle.read_exact_at(staging, file.data_offset + offset)?;
                        sink.write_from(staging)
                    })?;
                }
            }
        }
        let zeros_from = offset.max(stored_end);
        if end > zeros_from {
            sink.write_zeros((end - zeros_from) as usize)?;
        }
        Ok(())
    }

    /// Drops stored bytes beyond `len`.
    pub fn truncate(&mut self, len: u64) -> Result<(), Errno> {
        if len >= self.stored_len() {
            return Ok(());
        }
        match self {
            Body::Memory(shared) => {
                if len == 0 {
                    *shared = Arc::default();
                } else {
                    Arc::make_mut(shared).truncate(len as usize);
                }
            }
            Body::File(file) => {
                OpenOptions::new().write(true).open(&file.location)?.set_len(file.data_offset + len)?;
                file.stored_len = len;
            }
        }
        Ok(())
    }

    /// A copy of all stored bytes (used when a rename moves the chunk to another server).
    pub fn to_vec(&self) -> Result<Vec<u8>, Errno> {
        let mut bytes = Vec::with_capacity(self.stored_len() as usize);
        self.read(0, self.stored_len(), &mut bytes)?;
        Ok(bytes)
    }

    /// Deletes the chunk file, or hands the memory to `pool` (unless a lease still holds it).
    pub fn remove(self, pool: &BufferPool) {
        match self {
            Body::File(file) => {
                if let Err(error) = std::fs::remove_file(&file.location) {
                    log::warn!("could not remove chunk file {}: {error}", file.location.display());
                }
                // An inode's extended attributes, if it had any.
                let _ = std::fs::remove_file(xattr_location(&file.location));
            }
            Body::Memory(shared) => {
                if let Ok(bytes) = Arc::try_unwrap(shared) {
                    pool.give(bytes);
                }
            }
        }
    }

    /// The stored bytes as they are now, for writing them out without holding the chunk's
    /// lock: a shared reference for a memory chunk (later writes copy on write), a copy for a
    /// chunk file.
    pub fn snapshot(&self) -> Result<Arc<Vec<u8>>, Errno> {
        match self {
            Body::Memory(bytes) => Ok(bytes.clone()),
            Body::File(_) => Ok(Arc::new(self.to_vec()?)),
        }
    }
}

/// The file beside an inode's chunk file that holds the file's extended attributes.
pub(crate) fn xattr_location(chunk_location: &Path) -> PathBuf {
    let mut location = chunk_location.as_os_str().to_os_string();
    location.push(XATTR_SUFFIX);
    PathBuf::from(location)
}

pub(crate) const XATTR_SUFFIX: &str = ".xattr";
