//! The on-disk layout of the `dir` store: one file per chunk under a local directory.
//!
//! A chunk file starts with a header holding the chunk's key and attributes, followed by the
//! chunk's bytes at `data_offset`. File names are derived from a 128-bit hash of the path, so
//! no user-controlled string ever becomes part of a local path (nothing can escape the store
//! directory), and any path length fits. The header makes each file self-describing: on
//! restart the store rebuilds its index by reading the headers.
//!
//! ```text
//! offset  size  field
//!      0     4  magic "RFSC"
//!      4     2  format version (2)
//!      6     2  path length
//!      8     4  data offset (header length rounded up to 512)
//!     12     4  reserved (0)
//!     16     8  chunk index
//!     24    68  attributes (ringfs_proto::Attr::to_bytes)
//!     92     4  pending backend operation of an entry (cache mode): 0 none, 1 create, 2 trim
//!     96     8  its argument (the trim length)
//!    104     …  path (UTF-8)
//! ```
//!
//! Files live at `<root>/chunks/<first two hex digits>/<hash>.<file id>.<index>`. In cache
//! mode, removals that have not reached the backend yet are recorded as small files
//! `<root>/removals/<hash>` holding a kind byte (`f` or `d`) and the path.
//! Writes go to the page cache without fsync: the store survives a crash or restart of the
//! server process, not a crash of the node (it is a job-scoped tier; see docs/CONSISTENCY.md).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use ringfs_proto::{ATTR_BYTES, Attr};

use crate::backend::RemovalKind;
use crate::body::ChunkFile;
use crate::chunk::PendingOp;

const MAGIC: &[u8; 4] = b"RFSC";
const FORMAT_VERSION: u16 = 2;
const PENDING_OFFSET: usize = 24 + ATTR_BYTES;
const FIXED_HEADER_BYTES: usize = PENDING_OFFSET + 12;
const DATA_ALIGNMENT: usize = 512;

/// A chunk found on disk while recovering.
pub(crate) struct RecoveredChunk {
    pub path: String,
    pub index: u64,
    pub attr: Attr,
    pub pending: Option<PendingOp>,
    pub file: ChunkFile,
}

/// The directory a `dir` store keeps its chunk files in.
#[derive(Debug)]
pub(crate) struct ChunkDirectory {
    chunks: PathBuf,
    removals: PathBuf,
}

fn pending_bytes(pending: Option<PendingOp>) -> [u8; 12] {
    let (kind, value) = match pending {
        None => (0u32, 0u64),
        Some(PendingOp::Create) => (1, 0),
        Some(PendingOp::Trim(len)) => (2, len),
    };
    let mut bytes = [0u8; 12];
    bytes[..4].copy_from_slice(&kind.to_le_bytes());
    bytes[4..].copy_from_slice(&value.to_le_bytes());
    bytes
}

fn pending_from(bytes: &[u8]) -> Option<PendingOp> {
    let mut value = [0u8; 8];
    value.copy_from_slice(&bytes[4..12]);
    match u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) {
        1 => Some(PendingOp::Create),
        2 => Some(PendingOp::Trim(u64::from_le_bytes(value))),
        _ => None,
    }
}

impl ChunkDirectory {
    pub fn open(root: &Path) -> io::Result<ChunkDirectory> {
        let chunks = root.join("chunks");
        let removals = root.join("removals");
        fs::create_dir_all(&chunks)?;
        fs::create_dir_all(&removals)?;
        Ok(ChunkDirectory { chunks, removals })
    }

    fn removal_location(&self, path: &str) -> PathBuf {
        self.removals.join(format!("{:032x}", xxhash_rust::xxh3::xxh3_128(path.as_bytes())))
    }

    /// Records a removal that has not reached the backend yet.
    pub fn record_removal(&self, path: &str, kind: RemovalKind) -> io::Result<()> {
        let tag = match kind {
            RemovalKind::File => b'f',
            RemovalKind::Directory => b'd',
        };
        fs::write(self.removal_location(path), [&[tag][..], path.as_bytes()].concat())
    }

    /// Forgets a recorded removal (it reached the backend, or a new entry replaced it).
    pub fn forget_removal(&self, path: &str) -> io::Result<()> {
        match fs::remove_file(self.removal_location(path)) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }

    /// The removals recorded before a restart.
    pub fn recover_removals(&self) -> io::Result<Vec<(String, RemovalKind)>> {
        let mut removals = Vec::new();
        for entry in fs::read_dir(&self.removals)? {
            let location = entry?.path();
            let bytes = fs::read(&location)?;
            let kind = match bytes.first() {
                Some(b'f') => RemovalKind::File,
                Some(b'd') => RemovalKind::Directory,
                _ => {
                    log::warn!("skipping damaged removal record {}", location.display());
                    continue;
                }
            };
            match String::from_utf8(bytes[1..].to_vec()) {
                Ok(path) if ringfs_proto::path::validate(&path).is_ok() => removals.push((path, kind)),
                _ => log::warn!("skipping damaged removal record {}", location.display()),
            }
        }
        Ok(removals)
    }

    fn location(&self, path: &str, index: u64, file_id: u64) -> PathBuf {
        let hash = xxhash_rust::xxh3::xxh3_128(path.as_bytes());
        let name = format!("{hash:032x}.{file_id:016x}.{index}");
        self.chunks.join(&name[..2]).join(name)
    }

    fn header(path: &str, index: u64, attr: &Attr, pending: Option<PendingOp>) -> Vec<u8> {
        let header_len = FIXED_HEADER_BYTES + path.len();
        let data_offset = header_len.div_ceil(DATA_ALIGNMENT) * DATA_ALIGNMENT;
        let mut header = Vec::with_capacity(data_offset);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        header.extend_from_slice(&(path.len() as u16).to_le_bytes());
        header.extend_from_slice(&(data_offset as u32).to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        header.extend_from_slice(&index.to_le_bytes());
        header.extend_from_slice(&attr.to_bytes());
        header.extend_from_slice(&pending_bytes(pending));
        header.extend_from_slice(path.as_bytes());
        header.resize(data_offset, 0);
        header
    }

    /// Creates the file of a new chunk (replacing a leftover file of the same key).
    pub fn create(&self, path: &str, index: u64, attr: &Attr, pending: Option<PendingOp>) -> io::Result<ChunkFile> {
        let location = self.location(path, index, attr.file_id);
        let header = Self::header(path, index, attr, pending);
        let file = match File::create(&location) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(location.parent().expect("chunk files live in a subdirectory"))?;
                File::create(&location)?
            }
            Err(error) => return Err(error),
        };
        file.write_all_at(&header, 0)?;
        Ok(ChunkFile { location, data_offset: header.len() as u64, stored_len: 0 })
    }

    /// Rewrites the attributes and the pending operation in a chunk file's header.
    pub fn update_attr(&self, chunk: &ChunkFile, attr: &Attr, pending: Option<PendingOp>) -> io::Result<()> {
        let file = OpenOptions::new().write(true).open(&chunk.location)?;
        file.write_all_at(&[&attr.to_bytes()[..], &pending_bytes(pending)].concat(), 24)
    }

    /// Size in bytes of the file system the directory is on.
    pub fn file_system_size(&self) -> Option<u64> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(self.chunks.as_os_str().as_bytes()).ok()?;
        // SAFETY: statvfs fills the zeroed struct for a valid NUL-terminated path.
        let mut info: libc::statvfs = unsafe { std::mem::zeroed() };
        (unsafe { libc::statvfs(path.as_ptr(), &mut info) } == 0).then(|| info.f_blocks * info.f_frsize)
    }

    /// Reads every chunk file under the directory. Files that are not chunk files, or whose
    /// header is damaged, are skipped with a warning.
    pub fn recover(&self) -> io::Result<Vec<RecoveredChunk>> {
        let mut recovered = Vec::new();
        for subdirectory in fs::read_dir(&self.chunks)? {
            let subdirectory = subdirectory?;
            if !subdirectory.file_type()?.is_dir() {
                continue;
            }
            for entry in fs::read_dir(subdirectory.path())? {
                let location = entry?.path();
                match read_header(&location) {
                    Ok(chunk) => recovered.push(chunk),
                    Err(error) => log::warn!("skipping {}: {error}", location.display()),
                }
            }
        }
        Ok(recovered)
    }
}

fn read_header(location: &Path) -> io::Result<RecoveredChunk> {
    let invalid = |reason: &str| io::Error::new(io::ErrorKind::InvalidData, reason.to_string());
    let mut file = File::open(location)?;
    let file_len = file.metadata()?.len();
    let mut fixed = [0u8; FIXED_HEADER_BYTES];
    file.read_exact(&mut fixed)?;
    if &fixed[0..4] != MAGIC {
        return Err(invalid("not a ringfs chunk file"));
    }
    if u16::from_le_bytes([fixed[4], fixed[5]]) != FORMAT_VERSION {
        return Err(invalid("unknown chunk file version"));
    }
    let path_len = u16::from_le_bytes([fixed[6], fixed[7]]) as usize;
    let data_offset = u32::from_le_bytes([fixed[8], fixed[9], fixed[10], fixed[11]]) as u64;
    let mut index_bytes = [0u8; 8];
    index_bytes.copy_from_slice(&fixed[16..24]);
    let mut attr_bytes = [0u8; ATTR_BYTES];
    attr_bytes.copy_from_slice(&fixed[24..PENDING_OFFSET]);
    let mut path = vec![0u8; path_len];
    file.read_exact(&mut path)?;
    let path = String::from_utf8(path).map_err(|_| invalid("path is not UTF-8"))?;
    if ringfs_proto::path::validate(&path).is_err() || data_offset < (FIXED_HEADER_BYTES + path_len) as u64 {
        return Err(invalid("damaged header"));
    }
    let stored_len = file_len.saturating_sub(data_offset);
    Ok(RecoveredChunk {
        path,
        index: u64::from_le_bytes(index_bytes),
        attr: Attr::from_bytes(&attr_bytes),
        pending: pending_from(&fixed[PENDING_OFFSET..]),
        file: ChunkFile { location: location.to_path_buf(), data_offset, stored_len },
    })
}
