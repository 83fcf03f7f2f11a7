//! Identities: [`FileId`] names a file independently of its names; [`ChunkKey`] names one chunk
//! of a file, by its [`ChunkIndex`].
//!
//! A file's data and attributes are keyed by its id, never by a path, so renaming a file or a
//! directory, or giving a file another name (a hard link), moves no data, and a file that lost
//! its last name while open stays readable under its id.

use crate::codec::{DecodeError, Reader, Writer};
use crate::wire::Wire;

/// The identity of a file, directory, link or special file, fixed at creation.
///
/// - `anchor` decides placement: chunk `i` of the file lives on the server placement gives
///   `(anchor, i)`. It is the placement hash of the path the file was created at, so a new
///   file's chunk 0 (its attributes) lands on the server that holds its name, and a create or
///   a stat of a never-renamed file costs one request.
/// - `serial` tells files apart: a random non-zero number drawn by the creating server (or,
///   for a file found in a cache-mode backend, derived from the backend's device and inode
///   numbers, so that the same backend file always gets the same id). It is also the file's
///   inode number for `stat` and FUSE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    pub anchor: u32,
    pub serial: u64,
}

impl FileId {
    /// The root directory, which every server holds.
    pub const ROOT: FileId = FileId { anchor: 0, serial: 1 };

    pub fn is_root(self) -> bool {
        self == FileId::ROOT
    }

    /// The number `stat` reports as `st_ino`.
    pub fn ino(self) -> u64 {
        self.serial
    }
}

impl std::fmt::Display for FileId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:08x}:{:016x}", self.anchor, self.serial)
    }
}

impl Wire for FileId {
    const MIN_BYTES: usize = 12;

    fn write(&self, w: &mut Writer) {
        w.u32(self.anchor).u64(self.serial);
    }

    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(FileId { anchor: r.u32()?, serial: r.u64()? })
    }
}

crate::wire_newtype! {
    /// The position of a chunk in its file: chunk `i` holds the file's bytes from
    /// `i × chunk_size` on. Chunk 0 ([`ChunkIndex::FIRST`]) also carries the file's attributes
    /// (its *inode*). Bytes become an index, and an index bytes, only through the methods
    /// below, so an index is never mistaken for an offset or a length.
    ChunkIndex(u64) in decimal;
}

impl ChunkIndex {
    /// Chunk 0: the file's inode and first bytes.
    pub const FIRST: ChunkIndex = ChunkIndex(0);

    /// The chunk that holds byte `offset` of a file cut in chunks of `chunk_size` bytes.
    pub fn of_offset(offset: u64, chunk_size: u64) -> ChunkIndex {
        ChunkIndex(offset / chunk_size)
    }

    /// The chunk that holds the last byte of a file `len` bytes long (chunk 0 when it is
    /// empty).
    pub fn last_of(len: u64, chunk_size: u64) -> ChunkIndex {
        ChunkIndex::of_offset(len.saturating_sub(1), chunk_size)
    }

    /// The file offset of this chunk's first byte (which cannot overflow for an index
    /// computed from an offset, or named by a request that passed `Request::validate`).
    pub fn first_byte(self, chunk_size: u64) -> u64 {
        self.0 * chunk_size
    }

    /// [`ChunkIndex::first_byte`], or `None` past the last byte a `u64` can address.
    pub fn checked_first_byte(self, chunk_size: u64) -> Option<u64> {
        self.0.checked_mul(chunk_size)
    }

    /// How many of this chunk's bytes lie below file offset `end` (at or past its start).
    pub fn len_below(self, end: u64, chunk_size: u64) -> u64 {
        end.min(self.next().first_byte(chunk_size)) - self.first_byte(chunk_size)
    }

    pub fn is_first(self) -> bool {
        self == ChunkIndex::FIRST
    }

    /// The chunk after this one.
    pub fn next(self) -> ChunkIndex {
        ChunkIndex(self.0 + 1)
    }

    /// The chunks from `self` to `last`, both included.
    pub fn through(self, last: ChunkIndex) -> impl Iterator<Item = ChunkIndex> {
        (self.0..=last.0).map(ChunkIndex)
    }

    /// How many chunks [`ChunkIndex::through`] gives (0 when `last` comes before `self`).
    pub fn count_through(self, last: ChunkIndex) -> u64 {
        if last < self { 0 } else { last.0 - self.0 + 1 }
    }
}

/// One chunk of a file. Chunk 0 carries the file's attributes (its *inode*) and its first
/// bytes; chunks after it only bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkKey {
    pub file: FileId,
    pub index: ChunkIndex,
}

impl ChunkKey {
    pub fn new(file: FileId, index: ChunkIndex) -> ChunkKey {
        ChunkKey { file, index }
    }

    /// Chunk 0 of `file`: its inode.
    pub fn inode(file: FileId) -> ChunkKey {
        ChunkKey { file, index: ChunkIndex::FIRST }
    }

    /// Whether this is chunk 0, the file's inode.
    pub fn is_inode(self) -> bool {
        self.index.is_first()
    }
}

impl Wire for ChunkKey {
    const MIN_BYTES: usize = 20;

    fn write(&self, w: &mut Writer) {
        self.file.write(w);
        self.index.write(w);
    }

    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(ChunkKey { file: FileId::read(r)?, index: ChunkIndex::read(r)? })
    }
}

crate::wire_newtype! {
    /// Names one rename or link across the servers it touches: the token of the name locks it
    /// holds, carried by each of its steps (so that a step repeated, late, or of another
    /// operation is told apart). [`RenameToken::NONE`]: a step of no such operation.
    RenameToken(u64);
}

impl RenameToken {
    pub const NONE: RenameToken = RenameToken(0);

    pub fn is_none(self) -> bool {
        self == RenameToken::NONE
    }
}

crate::wire_newtype! {
    /// Names a [`crate::Lease`]: bytes a server keeps for a same-host client until the client
    /// releases them by this id (unique per connection).
    LeaseId(u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_key_is_its_file_then_its_index_as_a_little_endian_u64() {
        let key = ChunkKey::new(FileId { anchor: 0x0102_0304, serial: 5 }, ChunkIndex(0x0a0b));
        let mut bytes = Vec::new();
        key.write(&mut Writer::new(&mut bytes));
        let mut expected = vec![4, 3, 2, 1, 5, 0, 0, 0, 0, 0, 0, 0];
        expected.extend_from_slice(&0x0a0bu64.to_le_bytes());
        assert_eq!(bytes, expected);
        assert_eq!(ChunkKey::read(&mut Reader::new(&bytes)), Ok(key));
    }

    #[test]
    fn offsets_become_indexes_and_indexes_offsets() {
        assert_eq!(ChunkIndex::of_offset(0, 100), ChunkIndex::FIRST);
        assert_eq!(ChunkIndex::of_offset(99, 100), ChunkIndex::FIRST);
        assert_eq!(ChunkIndex::of_offset(100, 100), ChunkIndex(1));
        assert_eq!(ChunkIndex::last_of(0, 100), ChunkIndex::FIRST);
        assert_eq!(ChunkIndex::last_of(100, 100), ChunkIndex::FIRST);
        assert_eq!(ChunkIndex::last_of(101, 100), ChunkIndex(1));
        assert_eq!(ChunkIndex(3).first_byte(100), 300);
        assert_eq!(ChunkIndex(u64::MAX).checked_first_byte(2), None);
        assert_eq!(ChunkIndex(2).through(ChunkIndex(4)).collect::<Vec<_>>(), [ChunkIndex(2), ChunkIndex(3), ChunkIndex(4)]);
        assert_eq!(ChunkIndex(2).count_through(ChunkIndex(4)), 3);
        assert_eq!(ChunkIndex(2).count_through(ChunkIndex(1)), 0);
        assert_eq!(ChunkIndex(2).len_below(250, 100), 50);
        assert_eq!(ChunkIndex(2).len_below(900, 100), 100);
        assert_eq!(ChunkIndex(12).to_string(), "12", "an index displays in decimal");
    }
}
