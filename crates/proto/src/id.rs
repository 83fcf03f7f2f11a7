//! Identities: [`FileId`] names a file independently of its names; [`ChunkKey`] names one chunk
//! of a file.
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

/// One chunk of a file. Chunk 0 carries the file's attributes (its *inode*) and its first
/// bytes; chunks after it only bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkKey {
    pub file: FileId,
    pub index: u64,
}

impl ChunkKey {
    pub fn new(file: FileId, index: u64) -> ChunkKey {
        ChunkKey { file, index }
    }

    /// Chunk 0 of `file`: its inode.
    pub fn inode(file: FileId) -> ChunkKey {
        ChunkKey { file, index: 0 }
    }
}

impl Wire for ChunkKey {
    const MIN_BYTES: usize = 20;

    fn write(&self, w: &mut Writer) {
        self.file.write(w);
        w.u64(self.index);
    }

    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(ChunkKey { file: FileId::read(r)?, index: r.u64()? })
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
