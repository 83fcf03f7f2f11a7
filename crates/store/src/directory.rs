//! The on-disk layout of the `dir` store: one file per chunk, and a journal of entries.
//!
//! A chunk file starts with a header holding the chunk's key and attributes, followed by the
//! chunk's bytes at `data_offset`. File names are derived from the chunk key (file id and
//! index), so no user-controlled string ever becomes part of a local path (nothing can escape
//! the store directory). The header makes each file self-describing: on restart the store
//! rebuilds its index of chunks by reading the headers.
//!
//! ```text
//! chunk file header
//! offset  size  field
//!      0     4  magic "RFSC"
//!      4     2  format version (5)
//!      6     2  length of the backend record (cache mode, inodes; 0 otherwise)
//!      8     4  data offset (header length rounded up to 512)
//!     12     4  reserved (0)
//!     16     8  chunk index
//!     24    84  attributes (ringfs_proto::Attr::to_bytes; they hold the file id)
//!    108     4  pending backend operation of an inode (cache mode): 0 none, 1 create, 2 trim
//!    112     8  its argument (the trim length)
//!    120     8  inode: the file's size after a truncation under way (u64::MAX: none)
//!    128     8  that truncation's time (ns)
//!    136     …  backend record (UTF-8, `CacheState::backend_record`): the file's backend
//!                 path; NUL `=` DEV:INO (its backend file's identity); NUL `<` old name NUL
//!                 `>` new name (a move under way); for each other name in the cached tree
//!                 (hard links) NUL, `1` if the backend has it or `0`, name
//! ```
//!
//! Chunk files live at `<root>/chunks/<first two hex digits>/<anchor><serial>.<index>`.
//! Entries (names) are records appended to `<root>/entries.log`: a put (`P`, path, file id,
//! type bits) or a removal (`R`, path); opening the store replays the journal and rewrites it
//! with the live entries only. In cache mode, removals that have not reached the backend yet
//! are recorded as small files `<root>/removals/<hash>` holding a kind byte (`f` or `d`) and
//! the path.
//!
//! Writes go to the page cache; [`ChunkDirectory::sync_chunk`] and
//! [`ChunkDirectory::sync_entries`] make them durable (`fsync`).

use parking_lot::Mutex;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use ringfs_proto::{ATTR_BYTES, Attr, ChunkIndex, ChunkKey, EntryRef, FileId};

use crate::backend::RemovalKind;
use crate::body::{ChunkFile, XATTR_SUFFIX, xattr_location};
use crate::chunk::{Cut, PendingOp, Xattrs};

const MAGIC: &[u8; 4] = b"RFSC";
const FORMAT_VERSION: u16 = 5;
const ATTR_OFFSET: usize = 24;
const PENDING_OFFSET: usize = ATTR_OFFSET + ATTR_BYTES;
const CUT_OFFSET: usize = PENDING_OFFSET + 12;
const FIXED_HEADER_BYTES: usize = CUT_OFFSET + 16;
const DATA_ALIGNMENT: usize = 512;
const ENTRY_PUT: u8 = b'P';
const ENTRY_REMOVE: u8 = b'R';

/// A chunk found on disk while recovering.
pub(crate) struct RecoveredChunk {
    pub key: ChunkKey,
    pub attr: Attr,
    pub pending: Option<PendingOp>,
    pub cut: Option<Cut>,
    pub backend_path: Option<String>,
    pub file: ChunkFile,
    /// Chunk 0: the extended attributes kept beside the chunk file.
    pub xattrs: Option<Xattrs>,
}

/// Encodes extended attributes: for each, the name's length (`u16`) and bytes, the value's
/// length (`u32`) and bytes.
fn encode_xattrs(xattrs: &Xattrs) -> Vec<u8> {
    let mut bytes = Vec::new();
    for (name, value) in xattrs {
        bytes.extend_from_slice(&(name.len() as u16).to_le_bytes());
        bytes.extend_from_slice(name.as_bytes());
        bytes.extend_from_slice(&(value.len() as u32).to_le_bytes());
        bytes.extend_from_slice(value);
    }
    bytes
}

fn decode_xattrs(mut bytes: &[u8]) -> Option<Xattrs> {
    let mut xattrs = Xattrs::new();
    let mut take = |count: usize| -> Option<&[u8]> {
        let (taken, rest) = (bytes.get(..count)?, bytes.get(count..)?);
        bytes = rest;
        Some(taken)
    };
    loop {
        let Some(length) = take(2) else { return Some(xattrs) };
        let name = String::from_utf8(take(u16::from_le_bytes([length[0], length[1]]) as usize)?.to_vec()).ok()?;
        let length = take(4)?;
        let value = take(u32::from_le_bytes([length[0], length[1], length[2], length[3]]) as usize)?.to_vec();
        xattrs.insert(name, value);
    }
}

/// What a chunk file's header holds beside the key and the attributes (inodes; a data
/// chunk has none of it).
#[derive(Clone, Copy, Default)]
pub(crate) struct HeaderState<'a> {
    pub pending: Option<PendingOp>,
    pub cut: Option<Cut>,
    /// The backend record (cache mode; see `CacheState::backend_record`).
    pub backend_path: Option<&'a str>,
}

/// The directory a `dir` store keeps its chunk files in.
#[derive(Debug)]
pub(crate) struct ChunkDirectory {
    chunks: PathBuf,
    removals: PathBuf,
    entries_path: PathBuf,
    /// The entry journal, appended to.
    entries: Mutex<File>,
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

fn cut_bytes(cut: Option<Cut>) -> [u8; 16] {
    let (len, time_ns) = cut.map_or((u64::MAX, 0), |cut| (cut.len, cut.time_ns));
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&len.to_le_bytes());
    bytes[8..].copy_from_slice(&time_ns.to_le_bytes());
    bytes
}

fn cut_from(bytes: &[u8; 16]) -> Option<Cut> {
    let (len, time_ns) = bytes.split_at(8);
    let len = u64::from_le_bytes(len.try_into().expect("8 bytes"));
    let time_ns = i64::from_le_bytes(time_ns.try_into().expect("8 bytes"));
    (len != u64::MAX).then_some(Cut { len, time_ns })
}

fn entry_record(path: &str, entry: Option<EntryRef>) -> Vec<u8> {
    let mut record = Vec::with_capacity(3 + path.len() + 16);
    record.push(if entry.is_some() { ENTRY_PUT } else { ENTRY_REMOVE });
    record.extend_from_slice(&(path.len() as u16).to_le_bytes());
    record.extend_from_slice(path.as_bytes());
    if let Some(entry) = entry {
        record.extend_from_slice(&entry.file.anchor.to_le_bytes());
        record.extend_from_slice(&entry.file.serial.to_le_bytes());
        record.extend_from_slice(&entry.kind_bits.to_le_bytes());
    }
    record
}

/// Replays a journal: the entries live at its end. A damaged tail (a record cut by a crash)
/// ends the replay.
fn replay_entries(bytes: &[u8]) -> Vec<(String, EntryRef)> {
    let mut live: std::collections::BTreeMap<String, EntryRef> = std::collections::BTreeMap::new();
    let mut at = 0;
    while at + 3 <= bytes.len() {
        let kind = bytes[at];
        let len = u16::from_le_bytes([bytes[at + 1], bytes[at + 2]]) as usize;
        let path_end = at + 3 + len;
        let record_end = if kind == ENTRY_PUT { path_end + 16 } else { path_end };
        if record_end > bytes.len() || !(kind == ENTRY_PUT || kind == ENTRY_REMOVE) {
            log::warn!("entry journal damaged at byte {at}; later records are dropped");
            break;
        }
        let Ok(path) = std::str::from_utf8(&bytes[at + 3..path_end]) else { break };
        if ringfs_proto::path::validate(path).is_err() {
            break;
        }
        if kind == ENTRY_PUT {
            let word = |from: usize, len: usize| bytes[from..from + len].to_vec();
            let anchor = u32::from_le_bytes(word(path_end, 4).try_into().expect("4 bytes"));
            let serial = u64::from_le_bytes(word(path_end + 4, 8).try_into().expect("8 bytes"));
            let kind_bits = u32::from_le_bytes(word(path_end + 12, 4).try_into().expect("4 bytes"));
            live.insert(path.to_string(), EntryRef { file: FileId { anchor, serial }, kind_bits });
        } else {
            live.remove(path);
        }
        at = record_end;
    }
    live.into_iter().collect()
}

impl ChunkDirectory {
    pub fn open(root: &Path) -> io::Result<ChunkDirectory> {
        let chunks = root.join("chunks");
        let removals = root.join("removals");
        fs::create_dir_all(&chunks)?;
        fs::create_dir_all(&removals)?;
        let entries_path = root.join("entries.log");
        let entries = OpenOptions::new().create(true).append(true).open(&entries_path)?;
        Ok(ChunkDirectory { chunks, removals, entries_path, entries: Mutex::new(entries) })
    }

    // ----- entries --------------------------------------------------------------------------

    /// Records that `path` refers to `entry` (a new or replaced entry).
    pub fn put_entry(&self, path: &str, entry: EntryRef) -> io::Result<()> {
        self.entries.lock().write_all(&entry_record(path, Some(entry)))
    }

    /// Records that the entry of `path` is gone.
    pub fn remove_entry(&self, path: &str) -> io::Result<()> {
        self.entries.lock().write_all(&entry_record(path, None))
    }

    /// Makes the entries recorded so far durable.
    pub fn sync_entries(&self) -> io::Result<()> {
        self.entries.lock().sync_data()
    }

    /// The entries recorded before a restart; the journal is rewritten with them alone.
    pub fn recover_entries(&self) -> io::Result<Vec<(String, EntryRef)>> {
        let mut journal = self.entries.lock();
        let mut bytes = Vec::new();
        File::open(&self.entries_path)?.read_to_end(&mut bytes)?;
        let live = replay_entries(&bytes);
        let compacted: Vec<u8> = live.iter().flat_map(|(path, entry)| entry_record(path, Some(*entry))).collect();
        let temporary = self.entries_path.with_extension("log.new");
        let mut new = File::create(&temporary)?;
        new.write_all(&compacted)?;
        new.sync_all()?;
        fs::rename(&temporary, &self.entries_path)?;
        sync_directory_of(&self.entries_path)?;
        *journal = OpenOptions::new().append(true).open(&self.entries_path)?;
        Ok(live)
    }

    // ----- removals (cache mode) -------------------------------------------------------------

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

    // ----- chunks ---------------------------------------------------------------------------

    fn location(&self, key: ChunkKey) -> PathBuf {
        let name = format!("{:08x}{:016x}.{}", key.file.anchor, key.file.serial, key.index);
        self.chunks.join(&name[..2]).join(name)
    }

    /// A chunk file's header, padded to where its data begins: the next multiple of
    /// [`DATA_ALIGNMENT`], or `data_offset` if the header fits below it.
    fn header(key: ChunkKey, attr: &Attr, state: HeaderState<'_>, data_offset: usize) -> Vec<u8> {
        let HeaderState { pending, cut, backend_path } = state;
        let backend_path = backend_path.unwrap_or("");
        let header_len = FIXED_HEADER_BYTES + backend_path.len();
        let data_offset = match header_len <= data_offset {
            true => data_offset,
            false => header_len.div_ceil(DATA_ALIGNMENT) * DATA_ALIGNMENT,
        };
        let mut header = Vec::with_capacity(data_offset);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        header.extend_from_slice(&(backend_path.len() as u16).to_le_bytes());
        header.extend_from_slice(&(data_offset as u32).to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        header.extend_from_slice(&key.index.0.to_le_bytes());
        header.extend_from_slice(&attr.to_bytes());
        header.extend_from_slice(&pending_bytes(pending));
        header.extend_from_slice(&cut_bytes(cut));
        header.extend_from_slice(backend_path.as_bytes());
        header.resize(data_offset, 0);
        header
    }

    /// Creates the file of a new chunk (replacing a leftover file of the same key).
    pub fn create(&self, key: ChunkKey, attr: &Attr, state: HeaderState<'_>) -> io::Result<ChunkFile> {
        let location = self.location(key);
        let header = Self::header(key, attr, state, 0);
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

    /// Rewrites the attributes and the inode's state in a chunk file's header. A backend
    /// path that no longer fits the header's room rewrites the whole file.
    pub fn update_attr(&self, chunk: &mut ChunkFile, key: ChunkKey, attr: &Attr, state: HeaderState<'_>) -> io::Result<()> {
        // A header that fits where the data begins is written there, padded (the backend
        // record shrinks and grows with the names a file has and a move under way);
        let header = Self::header(key, attr, state, chunk.data_offset as usize);
        if header.len() as u64 == chunk.data_offset {
            let file = OpenOptions::new().write(true).open(&chunk.location)?;
            return file.write_all_at(&header, 0);
        }
        // a longer one moves the bytes behind it, with room to grow once more.
        let header = Self::header(key, attr, state, header.len() + DATA_ALIGNMENT);
        let old = File::open(&chunk.location)?;
        let mut bytes = vec![0u8; chunk.stored_len as usize];
        old.read_exact_at(&mut bytes, chunk.data_offset)?;
        let temporary = chunk.location.with_extension("rewrite");
        let new = File::create(&temporary)?;
        new.write_all_at(&header, 0)?;
        new.write_all_at(&bytes, header.len() as u64)?;
        fs::rename(&temporary, &chunk.location)?;
        chunk.data_offset = header.len() as u64;
        Ok(())
    }

    /// Makes a chunk file's bytes and header durable, and its name: the directory holding it
    /// is synced too (a new chunk file, or one whose header was rewritten by a rename of a
    /// new copy, is otherwise not guaranteed to be found after a crash).
    pub fn sync_chunk(&self, chunk: &ChunkFile) -> io::Result<()> {
        File::open(&chunk.location)?.sync_all()?;
        sync_directory_of(&chunk.location)
    }

    /// Size in bytes of the file system the directory is on.
    pub fn file_system_size(&self) -> Option<u64> {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(self.chunks.as_os_str().as_bytes()).ok()?;
        // SAFETY: statvfs fills the zeroed struct for a valid NUL-terminated path.
        let mut info: libc::statvfs = unsafe { std::mem::zeroed() };
        (unsafe { libc::statvfs(path.as_ptr(), &mut info) } == 0).then(|| info.f_blocks * info.f_frsize)
    }

    /// Writes a file's extended attributes beside its inode's chunk file (replacing them
    /// whole: a new file renamed over the old one), or removes them when there are none.
    pub fn write_xattrs(&self, inode: &ChunkFile, xattrs: &Xattrs) -> io::Result<()> {
        let location = xattr_location(&inode.location);
        if xattrs.is_empty() {
            return match fs::remove_file(&location) {
                Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
                _ => Ok(()),
            };
        }
        let temporary = location.with_extension("xattr-new");
        fs::write(&temporary, encode_xattrs(xattrs))?;
        fs::rename(&temporary, &location)
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
                let name = location.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
                if name.ends_with(XATTR_SUFFIX) || name.ends_with(".xattr-new") {
                    continue;
                }
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
    attr_bytes.copy_from_slice(&fixed[ATTR_OFFSET..PENDING_OFFSET]);
    let mut path = vec![0u8; path_len];
    file.read_exact(&mut path)?;
    let backend_path = match path_len {
        0 => None,
        _ => Some(String::from_utf8(path).map_err(|_| invalid("backend path is not UTF-8"))?),
    };
    if backend_path.as_deref().is_some_and(|record| crate::chunk::CacheState::parse_backend_record(record).is_none())
        || data_offset < (FIXED_HEADER_BYTES + path_len) as u64
    {
        return Err(invalid("damaged header"));
    }
    let attr = Attr::from_bytes(&attr_bytes);
    let index = ChunkIndex(u64::from_le_bytes(index_bytes));
    let xattrs = match (index, fs::read(xattr_location(location))) {
        (ChunkIndex::FIRST, Ok(bytes)) => Some(decode_xattrs(&bytes).ok_or_else(|| invalid("damaged extended attributes"))?),
        (_, Err(error)) if error.kind() != io::ErrorKind::NotFound => return Err(error),
        _ => None,
    };
    Ok(RecoveredChunk {
        key: ChunkKey { file: attr.file_id, index },
        attr,
        pending: pending_from(&fixed[PENDING_OFFSET..]),
        cut: cut_from(fixed[CUT_OFFSET..].try_into().expect("the fixed header ends with the cut")),
        backend_path,
        file: ChunkFile { location: location.to_path_buf(), data_offset, stored_len: file_len.saturating_sub(data_offset) },
        xattrs,
    })
}

/// Syncs the directory that holds `path`, making the name (a new file, a rename into it)
/// durable.
fn sync_directory_of(path: &std::path::Path) -> io::Result<()> {
    match path.parent() {
        Some(directory) => File::open(directory)?.sync_all(),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_journal_replays_to_the_live_entries_and_survives_a_cut_record() {
        let entry = |serial| EntryRef { file: FileId { anchor: 1, serial }, kind_bits: 0o100000 };
        let mut journal = Vec::new();
        journal.extend(entry_record("/a", Some(entry(1))));
        journal.extend(entry_record("/b", Some(entry(2))));
        journal.extend(entry_record("/a", None));
        journal.extend(entry_record("/b", Some(entry(3))));
        let mut cut = entry_record("/c", Some(entry(4)));
        cut.truncate(cut.len() - 3);
        journal.extend(cut);
        assert_eq!(replay_entries(&journal), vec![("/b".to_string(), entry(3))]);
    }
}
