//! The metadata stored with every chunk.
//!
//! ringfs has no inodes: each chunk carries the attributes of its file, and chunk 0 is the one
//! that counts for the file (mode, owner, times). The size of a file is not stored; it is
//! derived from the chunks (see `docs/ARCHITECTURE.md`, "file size").

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
    /// Identity of the file this chunk belongs to, drawn at creation. Chunks of a replaced
    /// or removed file keep their old id and are never mistaken for the new file's.
    pub file_id: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// [`EntryFlags`] bits.
    pub flags: u32,
}

/// Bits of [`Attr::flags`].
pub struct EntryFlags;

impl EntryFlags {
    /// Set on chunk 0 once any chunk after it may exist; without it, chunk 0 alone gives the
    /// file size.
    pub const EXTENDED: u32 = 1;
}

/// The file types ringfs stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Regular,
    Directory,
    Symlink,
}

const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
const S_IFDIR: u32 = 0o040000;
const S_IFLNK: u32 = 0o120000;

impl FileKind {
    /// The `S_IF*` bits of this type.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::Regular => S_IFREG,
            FileKind::Directory => S_IFDIR,
            FileKind::Symlink => S_IFLNK,
        }
    }

    /// The type encoded in a mode word; `None` for types ringfs does not store.
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        match mode & S_IFMT {
            S_IFREG => Some(FileKind::Regular),
            S_IFDIR => Some(FileKind::Directory),
            S_IFLNK => Some(FileKind::Symlink),
            _ => None,
        }
    }
}

impl Attr {
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

    /// Permission bits only (no file type).
    pub fn permissions(&self) -> u32 {
        self.mode & !S_IFMT
    }

    pub fn is_extended(&self) -> bool {
        self.flags & EntryFlags::EXTENDED != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_mode_bits() {
        for kind in [FileKind::Regular, FileKind::Directory, FileKind::Symlink] {
            assert_eq!(FileKind::from_mode(kind.mode_bits() | 0o755), Some(kind));
        }
        assert_eq!(FileKind::from_mode(0o020000), None);
        let attr = Attr { mode: 0o100640, flags: EntryFlags::EXTENDED, ..Default::default() };
        assert!(attr.is_regular() && attr.is_extended());
        assert_eq!(attr.permissions(), 0o640);
    }
}
