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
//!      4     2  format version (1)
//!      6     2  path length
//!      8     4  data offset (header length rounded up to 512)
//!     12     4  reserved (0)
//!     16     8  chunk index
//!     24    60  attributes (ringfs_proto::Attr::to_bytes)
//!     84     …  path (UTF-8)
//! ```
//!
//! Files live at `<root>/chunks/<first two hex digits>/<hash>.<file id>.<index>`.
//! Writes go to the page cache without fsync: the store survives a crash or restart of the
//! server process, not a crash of the node (it is a job-scoped tier; see docs/CONSISTENCY.md).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use ringfs_proto::{ATTR_BYTES, Attr};

const MAGIC: &[u8; 4] = b"RFSC";
const FORMAT_VERSION: u16 = 1;
const FIXED_HEADER_BYTES: usize = 24 + ATTR_BYTES;
const DATA_ALIGNMENT: usize = 512;

/// A chunk found on disk while recovering.
pub(crate) struct RecoveredChunk {
    pub path: String,
    pub index: u64,
    pub attr: Attr,
    pub file: ChunkFile,
}

/// Location of one chunk file and where its data starts.
#[derive(Debug)]
pub(crate) struct ChunkFile {
    pub location: PathBuf,
    pub data_offset: u64,
    /// Bytes of data stored in the file (may be less than the chunk's logical length).
    pub stored_len: u64,
}

/// The directory a `dir` store keeps its chunk files in.
#[derive(Debug)]
pub(crate) struct ChunkDirectory {
    chunks: PathBuf,
}

impl ChunkDirectory {
    pub fn open(root: &Path) -> io::Result<ChunkDirectory> {
        let chunks = root.join("chunks");
        fs::create_dir_all(&chunks)?;
        Ok(ChunkDirectory { chunks })
    }

    fn location(&self, path: &str, index: u64, file_id: u64) -> PathBuf {
        let hash = xxhash_rust::xxh3::xxh3_128(path.as_bytes());
        let name = format!("{hash:032x}.{file_id:016x}.{index}");
        self.chunks.join(&name[..2]).join(name)
    }

    fn header(path: &str, index: u64, attr: &Attr) -> Vec<u8> {
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
        header.extend_from_slice(path.as_bytes());
        header.resize(data_offset, 0);
        header
    }

    /// Creates the file of a new chunk (replacing a leftover file of the same key).
    pub fn create(&self, path: &str, index: u64, attr: &Attr) -> io::Result<ChunkFile> {
        let location = self.location(path, index, attr.file_id);
        let header = Self::header(path, index, attr);
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

    /// Rewrites the attributes in a chunk file's header.
    pub fn update_attr(&self, chunk: &ChunkFile, attr: &Attr) -> io::Result<()> {
        let file = OpenOptions::new().write(true).open(&chunk.location)?;
        file.write_all_at(&attr.to_bytes(), 24)
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
    attr_bytes.copy_from_slice(&fixed[24..24 + ATTR_BYTES]);
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
        file: ChunkFile { location: location.to_path_buf(), data_offset, stored_len },
    })
}
