//! Inode numbers for the kernel, paths for ringfs.
//!
//! The kernel names files by inode number; ringfs names them by path. A file's inode number
//! is its file id (stable for the file's life, kept by rename; the root's id is 1, which is
//! also FUSE's root inode). The table remembers the path of every inode the kernel holds a
//! reference to, counting lookups so that `forget` can drop entries again.

use std::collections::HashMap;
use std::sync::Mutex;

use ringfs_client::Errno;

/// FUSE's root inode number (and ringfs's root file id).
pub const ROOT_INODE: u64 = 1;

struct Entry {
    path: String,
    lookups: u64,
}

/// The paths of the inodes the kernel knows.
pub struct InodeTable {
    entries: Mutex<HashMap<u64, Entry>>,
}

impl Default for InodeTable {
    fn default() -> Self {
        let mut entries = HashMap::new();
        entries.insert(ROOT_INODE, Entry { path: "/".into(), lookups: 1 });
        InodeTable { entries: Mutex::new(entries) }
    }
}

impl InodeTable {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The path of an inode; ESTALE if the kernel names one it was never given.
    pub fn path(&self, inode: u64) -> Result<String, Errno> {
        self.entries().get(&inode).map(|entry| entry.path.clone()).ok_or(Errno::ESTALE)
    }

    /// Records that the kernel received `inode` for `path` (one more lookup).
    pub fn remember(&self, inode: u64, path: &str) {
        let mut entries = self.entries();
        let entry = entries.entry(inode).or_insert_with(|| Entry { path: path.to_string(), lookups: 0 });
        if entry.path != path {
            // Renamed (by anyone): the file id stays, the name changes.
            entry.path = path.to_string();
        }
        entry.lookups += 1;
    }

    /// The kernel dropped `count` references to `inode`.
    pub fn forget(&self, inode: u64, count: u64) {
        if inode == ROOT_INODE {
            return;
        }
        let mut entries = self.entries();
        if let Some(entry) = entries.get_mut(&inode) {
            entry.lookups = entry.lookups.saturating_sub(count);
            if entry.lookups == 0 {
                entries.remove(&inode);
            }
        }
    }

    /// A rename through this mount: every inode at `from` or below now lives under `to`.
    pub fn renamed(&self, from: &str, to: &str) {
        for entry in self.entries().values_mut() {
            if entry.path == from {
                entry.path = to.to_string();
            } else if ringfs_proto::path::is_inside(&entry.path, from) {
                entry.path = format!("{to}{}", &entry.path[from.len()..]);
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
        table.remember(7, "/a");
        table.remember(7, "/a");
        table.forget(7, 1);
        assert_eq!(table.path(7).unwrap(), "/a");
        table.forget(7, 1);
        assert_eq!(table.path(7), Err(Errno::ESTALE));
        table.forget(ROOT_INODE, 100);
        assert!(table.path(ROOT_INODE).is_ok());
    }

    #[test]
    fn renames_move_paths_below_too() {
        let table = InodeTable::default();
        table.remember(2, "/d");
        table.remember(3, "/d/f");
        table.remember(4, "/dx");
        table.renamed("/d", "/e");
        assert_eq!(table.path(2).unwrap(), "/e");
        assert_eq!(table.path(3).unwrap(), "/e/f");
        assert_eq!(table.path(4).unwrap(), "/dx");
        // A lookup under a new name (renamed elsewhere) updates the path.
        table.remember(3, "/g");
        assert_eq!(table.path(3).unwrap(), "/g");
    }
}
