//! Inode numbers for the kernel, file ids and paths for ringfs.
//!
//! The kernel names files by inode number. A file's inode number is the serial of its ringfs
//! file id (stable for the file's life, kept by renames and links; the root's is 1, which is
//! also FUSE's root inode). The table remembers, for every inode the kernel holds a reference
//! to, the file id — everything done to a file (open, stat, attribute changes) goes by id,
//! whatever happened to its names — and the path it was last seen at, which operations on
//! names inside a directory need. Lookups are counted so that `forget` can drop entries.

use std::collections::HashMap;
use std::sync::Mutex;

use ringfs_client::{Errno, FileId};

/// FUSE's root inode number (and ringfs's root file id).
pub const ROOT_INODE: u64 = 1;

struct Entry {
    file: FileId,
    path: String,
    lookups: u64,
    /// The mount holds a reference on the file (see `ringfs_client::Client::lookup_ref`),
    /// given back when the kernel forgets the inode.
    referenced: bool,
}

/// The paths of the inodes the kernel knows.
pub struct InodeTable {
    entries: Mutex<HashMap<u64, Entry>>,
}

impl Default for InodeTable {
    fn default() -> Self {
        let mut entries = HashMap::new();
        entries.insert(ROOT_INODE, Entry { file: FileId::ROOT, path: "/".into(), lookups: 1, referenced: false });
        InodeTable { entries: Mutex::new(entries) }
    }
}

impl InodeTable {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The path an inode was last seen at; ESTALE if the kernel names one it was never given.
    pub fn path(&self, inode: u64) -> Result<String, Errno> {
        self.entries().get(&inode).map(|entry| entry.path.clone()).ok_or(Errno::ESTALE)
    }

    /// The file id of an inode; ESTALE if the kernel names one it was never given.
    pub fn file(&self, inode: u64) -> Result<FileId, Errno> {
        self.entries().get(&inode).map(|entry| entry.file).ok_or(Errno::ESTALE)
    }

    /// The directory holding `inode` (by the path it was last seen at) and the names in it
    /// the kernel knows: the names a lock on `inode` revalidates (see the lock handlers).
    /// `None` if the directory's inode is not known. Scans the table (locks are rare).
    pub fn names_beside(&self, inode: u64) -> Option<(u64, Vec<String>)> {
        let entries = self.entries();
        let path = &entries.get(&inode)?.path;
        let directory = ringfs_proto::path::parent(path)?;
        let directory_inode = entries.iter().find(|(_, entry)| entry.path == directory).map(|(inode, _)| *inode)?;
        let names = entries
            .values()
            .filter(|entry| ringfs_proto::path::parent(&entry.path) == Some(directory))
            .map(|entry| ringfs_proto::path::file_name(&entry.path).to_string())
            .collect();
        Some((directory_inode, names))
    }

    /// Records that the kernel received the inode of `file` for `path` (one more lookup).
    /// With `referenced`, the caller took a reference on the file for this lookup: the table
    /// keeps one per inode, and returns `true` when the caller's one is surplus (to give back).
    pub fn remember(&self, file: FileId, path: &str, referenced: bool) -> bool {
        let mut entries = self.entries();
        let entry = entries.entry(file.ino()).or_insert_with(|| Entry { file, path: path.to_string(), lookups: 0, referenced: false });
        entry.file = file;
        if entry.path != path {
            // Renamed or linked (by anyone): the file id stays, the name changes.
            entry.path = path.to_string();
        }
        entry.lookups += 1;
        let surplus = referenced && entry.referenced;
        entry.referenced |= referenced;
        surplus
    }

    /// The kernel dropped `count` references to `inode`. Returns the file whose reference
    /// the mount must give back, when the last one went.
    pub fn forget(&self, inode: u64, count: u64) -> Option<FileId> {
        if inode == ROOT_INODE {
            return None;
        }
        let mut entries = self.entries();
        let entry = entries.get_mut(&inode)?;
        entry.lookups = entry.lookups.saturating_sub(count);
        if entry.lookups > 0 {
            return None;
        }
        let entry = entries.remove(&inode)?;
        entry.referenced.then_some(entry.file)
    }

    /// A rename through this mount: every inode at `from` or below now lives under `to`;
    /// with `exchange`, those at `to` or below under `from` too.
    pub fn renamed(&self, from: &str, to: &str, exchange: bool) {
        let moved = |path: &str, old: &str, new: &str| -> Option<String> {
            if path == old {
                Some(new.to_string())
            } else if ringfs_proto::path::is_inside(path, old) {
                Some(format!("{new}{}", &path[old.len()..]))
            } else {
                None
            }
        };
        for entry in self.entries().values_mut() {
            if let Some(path) = moved(&entry.path, from, to) {
                entry.path = path;
            } else if exchange && let Some(path) = moved(&entry.path, to, from) {
                entry.path = path;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_are_counted_until_forgotten() {
        let table = InodeTable::default();
        assert_eq!(table.path(ROOT_INODE).unwrap(), "/");
        assert_eq!(table.file(ROOT_INODE).unwrap(), FileId::ROOT);
        assert!(!table.remember(file(7), "/a", true));
        assert!(table.remember(file(7), "/a", true), "one reference per inode: the second is surplus");
        assert_eq!(table.file(7).unwrap(), file(7));
        assert_eq!(table.forget(7, 1), None);
        assert_eq!(table.path(7).unwrap(), "/a");
        assert_eq!(table.forget(7, 1), Some(file(7)), "the last forget gives the reference back");
        assert_eq!(table.path(7), Err(Errno::ESTALE));
        table.forget(ROOT_INODE, 100);
        assert!(table.path(ROOT_INODE).is_ok());
    }

    #[test]
    fn renames_move_paths_below_too() {
        let table = InodeTable::default();
        table.remember(file(2), "/d", false);
        table.remember(file(3), "/d/f", false);
        table.remember(file(4), "/dx", false);
        table.renamed("/d", "/e", false);
        assert_eq!(table.path(2).unwrap(), "/e");
        assert_eq!(table.path(3).unwrap(), "/e/f");
        assert_eq!(table.path(4).unwrap(), "/dx");
        // A lookup under a new name (renamed elsewhere) updates the path.
        table.remember(file(3), "/g", false);
        assert_eq!(table.path(3).unwrap(), "/g");
        // An exchange swaps both trees.
        table.remember(file(5), "/dx/y", false);
        table.renamed("/e", "/dx", true);
        assert_eq!(table.path(2).unwrap(), "/dx");
        assert_eq!(table.path(4).unwrap(), "/e");
        assert_eq!(table.path(5).unwrap(), "/e/y");
    }

    fn file(serial: u64) -> FileId {
        FileId { anchor: 9, serial }
    }
}
