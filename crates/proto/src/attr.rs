//! The metadata stored with every chunk.
//!
//! Each chunk carries the attributes of its file, and chunk 0 — the file's *inode* — is the
//! one that counts for the file (type, mode, owner, link count, times). The size of a file is
//! not stored; it is derived from the chunks (see `docs/ARCHITECTURE.md`, "file size").

use crate::{ChunkIndex, FileId};

/// Attributes of one chunk (and, for chunk 0, of the file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Attr {
    /// File type and permission bits, as in `st_mode`.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Chunk size of the file, fixed when the file is created.
    pub chunk_size: u32,
    /// Logical length of this chunk in bytes (for a symbolic link: the target's length).
    pub len: u64,
    /// Identity of the file this chunk belongs to, fixed at creation.
    pub file_id: FileId,
    /// Chunk 0: the number of names (entries) of the file; 0 for a file whose last name was
    /// removed while it is still open. A directory has 2.
    pub nlink: u32,
    /// Chunk 0 of a character or block device: its device number (`st_rdev`).
    pub rdev: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// [`EntryFlags`] bits.
    pub flags: u32,
    /// Chunk 0 of a file in the cached tree: the file's bytes below this offset that no chunk
    /// in ringfs holds are read from the backend file (0: none; see docs/CONSISTENCY.md).
    pub backend_len: u64,
    /// Chunk 0 of a regular file: no chunk of the file lies past this index (an upper bound:
    /// writes raise it before they reach further, geometrically; never lowered while the file
    /// exists). Chunk 0 itself when the file is chunk 0 alone. A file's size and its later
    /// chunks are asked only of the servers that own chunks 1 to this one.
    pub last_chunk: ChunkIndex,
}

/// Bits of [`Attr::flags`] (bit 0, `1`, is free: it marked files with chunks after chunk 0
/// before [`Attr::last_chunk`] bounded them).
pub struct EntryFlags;

impl EntryFlags {
    /// The chunk lies under the backend mount path (cache mode): it is flushed to the backend,
    /// and a directory's listing merges the backend directory.
    pub const BACKED: u32 = 2;
    /// The chunk (for chunk 0 also the entry's mode) changed since it was last written to the
    /// backend.
    pub const DIRTY: u32 = 4;
    /// The chunk's bytes are in the backend file, not in the store (not loaded yet, evicted,
    /// or written through); reading or changing them loads them first.
    pub const BACKEND_DATA: u32 = 8;
    /// Chunk 0: the entry exists in the backend (it came from there, or its creation was
    /// flushed), so removing it must reach the backend too.
    pub const IN_BACKEND: u32 = 16;
    /// Stat answers only (never stored): the file is open somewhere.
    pub const OPEN: u32 = 32;
    /// Chunk 0: the file has extended attributes (so a client that saw attributes without
    /// it knows, as of then, that the file has none: the FUSE mount answers the kernel's
    /// `security.capability` question before every write itself).
    pub const XATTRS: u32 = 64;
}

/// The file types ringfs stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Regular,
    Directory,
    Symlink,
    /// A named pipe (`mkfifo`): ringfs stores its entry; opening it is the kernel's business.
    Fifo,
    CharDevice,
    BlockDevice,
    /// A Unix socket node (made by `bind`).
    Socket,
}

const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
const S_IFDIR: u32 = 0o040000;
const S_IFLNK: u32 = 0o120000;
const S_IFIFO: u32 = 0o010000;
const S_IFCHR: u32 = 0o020000;
const S_IFBLK: u32 = 0o060000;
const S_IFSOCK: u32 = 0o140000;

impl FileKind {
    /// The `S_IF*` bits of this type.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::Regular => S_IFREG,
            FileKind::Directory => S_IFDIR,
            FileKind::Symlink => S_IFLNK,
            FileKind::Fifo => S_IFIFO,
            FileKind::CharDevice => S_IFCHR,
            FileKind::BlockDevice => S_IFBLK,
            FileKind::Socket => S_IFSOCK,
        }
    }

    /// The type encoded in a mode word; `None` for bits that name no type.
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        match mode & S_IFMT {
            S_IFREG => Some(FileKind::Regular),
            S_IFDIR => Some(FileKind::Directory),
            S_IFLNK => Some(FileKind::Symlink),
            S_IFIFO => Some(FileKind::Fifo),
            S_IFCHR => Some(FileKind::CharDevice),
            S_IFBLK => Some(FileKind::BlockDevice),
            S_IFSOCK => Some(FileKind::Socket),
            _ => None,
        }
    }

    /// Special files: FIFOs, devices and sockets (no bytes of their own in ringfs).
    pub fn is_special(self) -> bool {
        matches!(self, FileKind::Fifo | FileKind::CharDevice | FileKind::BlockDevice | FileKind::Socket)
    }
}

/// Size of [`Attr::to_bytes`]: the fixed binary form used on the wire and in chunk files.
pub const ATTR_BYTES: usize = 92;

impl Attr {
    /// Fixed little-endian form: mode, uid, gid, chunk_size (u32 each), len (u64), file id
    /// (anchor u32, serial u64), nlink (u32), rdev (u64), atime, mtime, ctime (i64
    /// nanoseconds), flags (u32), backend_len (u64), last_chunk (u64).
    pub fn to_bytes(&self) -> [u8; ATTR_BYTES] {
        let mut bytes = [0u8; ATTR_BYTES];
        let fields: [&[u8]; 15] = [
            &self.mode.to_le_bytes(),
            &self.uid.to_le_bytes(),
            &self.gid.to_le_bytes(),
            &self.chunk_size.to_le_bytes(),
            &self.len.to_le_bytes(),
            &self.file_id.anchor.to_le_bytes(),
            &self.file_id.serial.to_le_bytes(),
            &self.nlink.to_le_bytes(),
            &self.rdev.to_le_bytes(),
            &self.atime_ns.to_le_bytes(),
            &self.mtime_ns.to_le_bytes(),
            &self.ctime_ns.to_le_bytes(),
            &self.flags.to_le_bytes(),
            &self.backend_len.to_le_bytes(),
            &self.last_chunk.0.to_le_bytes(),
        ];
        let mut offset = 0;
        for field in fields {
            bytes[offset..offset + field.len()].copy_from_slice(field);
            offset += field.len();
        }
        debug_assert_eq!(offset, ATTR_BYTES);
        bytes
    }

    /// Inverse of [`Attr::to_bytes`].
    pub fn from_bytes(bytes: &[u8; ATTR_BYTES]) -> Attr {
        let u32_at = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let u64_at = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(word)
        };
        Attr {
            mode: u32_at(0),
            uid: u32_at(4),
            gid: u32_at(8),
            chunk_size: u32_at(12),
            len: u64_at(16),
            file_id: FileId { anchor: u32_at(24), serial: u64_at(28) },
            nlink: u32_at(36),
            rdev: u64_at(40),
            atime_ns: u64_at(48) as i64,
            mtime_ns: u64_at(56) as i64,
            ctime_ns: u64_at(64) as i64,
            flags: u32_at(72),
            backend_len: u64_at(76),
            last_chunk: ChunkIndex(u64_at(84)),
        }
    }

    pub fn kind(&self) -> Option<FileKind> {
        FileKind::from_mode(self.mode)
    }

    pub fn is_dir(&self) -> bool {
        self.kind() == Some(FileKind::Directory)
    }

    pub fn is_regular(&self) -> bool {
        self.kind() == Some(FileKind::Regular)
    }

    pub fn is_symlink(&self) -> bool {
        self.kind() == Some(FileKind::Symlink)
    }

    /// FIFOs, devices and sockets.
    pub fn is_special(&self) -> bool {
        self.kind().is_some_and(FileKind::is_special)
    }

    /// Permission bits only (no file type).
    pub fn permissions(&self) -> u32 {
        self.mode & !S_IFMT
    }

    /// Whether chunks after chunk 0 may exist (then chunk 0 alone does not give the size).
    pub fn is_extended(&self) -> bool {
        !self.last_chunk.is_first()
    }

    /// Whether all bits of `flag` ([`EntryFlags`]) are set.
    pub fn has(&self, flag: u32) -> bool {
        self.flags & flag == flag
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Linux values of the `S_IF*` constants (golden; libc is not a dependency here).
    mod libc_like {
        pub const S_IFREG: u32 = 0o100000;
        pub const S_IFDIR: u32 = 0o040000;
        pub const S_IFLNK: u32 = 0o120000;
        pub const S_IFIFO: u32 = 0o010000;
        pub const S_IFCHR: u32 = 0o020000;
        pub const S_IFBLK: u32 = 0o060000;
        pub const S_IFSOCK: u32 = 0o140000;
    }

    #[test]
    fn kinds_round_trip_through_mode_bits() {
        for kind in [
            FileKind::Regular,
            FileKind::Directory,
            FileKind::Symlink,
            FileKind::Fifo,
            FileKind::CharDevice,
            FileKind::BlockDevice,
            FileKind::Socket,
        ] {
            assert_eq!(FileKind::from_mode(kind.mode_bits() | 0o755), Some(kind));
            assert_eq!(
                kind.mode_bits(),
                match kind {
                    FileKind::Regular => libc_like::S_IFREG,
                    FileKind::Directory => libc_like::S_IFDIR,
                    FileKind::Symlink => libc_like::S_IFLNK,
                    FileKind::Fifo => libc_like::S_IFIFO,
                    FileKind::CharDevice => libc_like::S_IFCHR,
                    FileKind::BlockDevice => libc_like::S_IFBLK,
                    FileKind::Socket => libc_like::S_IFSOCK,
                }
            );
        }
        assert_eq!(FileKind::from_mode(0o170000), None);
        let attr = Attr { mode: 0o100640, last_chunk: ChunkIndex(1), ..Default::default() };
        assert!(attr.is_regular() && attr.is_extended());
        assert_eq!(attr.permissions(), 0o640);
    }

    #[test]
    fn binary_form_round_trips() {
        let attr = Attr {
            mode: 1,
            uid: 2,
            gid: 3,
            chunk_size: 4,
            len: 5,
            file_id: FileId { anchor: 6, serial: 60 },
            nlink: 3,
            rdev: 0x0801,
            atime_ns: -7,
            mtime_ns: 8,
            ctime_ns: 9,
            flags: 10,
            backend_len: 11,
            last_chunk: ChunkIndex(12),
        };
        assert_eq!(Attr::from_bytes(&attr.to_bytes()), attr);
    }
}
