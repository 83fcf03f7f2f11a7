//! Extended attributes: a map of names to byte values kept on a file's inode, with Linux's
//! limits and errors. (Who may read or change which namespace is the caller's business: see
//! docs/CONSISTENCY.md.) With a `dir` store they live in a file beside the inode's chunk
//! file; in cache mode a change marks the inode dirty, and the flush writes them to the
//! backend file.

use ringfs_proto::{Attr, Errno, FileId, XATTR_LIST_MAX, XATTR_NAME_MAX, XATTR_VALUE_MAX, XattrFlags};

use crate::StoreError;
use crate::body::Body;
use crate::chunk::{Chunk, xattr_bytes};
use crate::store::ChunkStore;

/// The namespaces of extended attributes ringfs keeps.
const STORED_NAMESPACES: [&str; 3] = ["user.", "trusted.", "security."];

/// The room `listxattr` needs for these names (each NUL-terminated).
fn list_len<'a>(names: impl Iterator<Item = &'a String>) -> usize {
    names.map(|name| name.len() + 1).sum()
}

impl ChunkStore {
    /// The value of extended attribute `name` of `file`; ENODATA if it has none.
    pub fn get_xattr(&self, file: FileId, name: &str) -> Result<Vec<u8>, StoreError> {
        let handle = self.inode_checked(file)?;
        let chunk = handle.lock();
        chunk.xattrs.as_ref().and_then(|xattrs| xattrs.get(name)).cloned().ok_or(Errno::ENODATA.into())
    }

    /// The names of `file`'s extended attributes, in name order.
    pub fn list_xattrs(&self, file: FileId) -> Result<Vec<String>, StoreError> {
        let handle = self.inode_checked(file)?;
        let chunk = handle.lock();
        Ok(chunk.xattrs.as_ref().map(|xattrs| xattrs.keys().cloned().collect()).unwrap_or_default())
    }

    /// Sets extended attribute `name` of `file` to `value` (`flags`: [`XattrFlags`]); the
    /// file's new attributes (its ctime is `time_ns`).
    pub fn set_xattr(&self, file: FileId, name: &str, value: &[u8], flags: u32, time_ns: i64) -> Result<Attr, StoreError> {
        if name.is_empty() {
            return Err(Errno::EINVAL.into());
        }
        // POSIX ACLs (`system.posix_acl_*`) are not kept: refused, a program falls back to
        // the mode (as `cp -a` does), instead of believing an ACL was applied.
        if !STORED_NAMESPACES.iter().any(|prefix| name.starts_with(prefix)) {
            return Err(Errno::EOPNOTSUPP.into());
        }
        if name.len() > XATTR_NAME_MAX {
            return Err(Errno::ERANGE.into());
        }
        if value.len() > XATTR_VALUE_MAX {
            return Err(Errno::E2BIG.into());
        }
        if flags & !(XattrFlags::CREATE | XattrFlags::REPLACE) != 0 {
            return Err(Errno::EINVAL.into());
        }
        let handle = self.inode_checked(file)?;
        let mut chunk = handle.lock();
        let mut xattrs = chunk.xattrs.as_deref().cloned().unwrap_or_default();
        let old = xattrs.get(name).map(|old| (name.len() + old.len()) as u64);
        match old {
            Some(_) if flags & XattrFlags::CREATE != 0 => return Err(Errno::EEXIST.into()),
            None if flags & XattrFlags::REPLACE != 0 => return Err(Errno::ENODATA.into()),
            _ => {}
        }
        xattrs.insert(name.to_string(), value.to_vec());
        if list_len(xattrs.keys()) > XATTR_LIST_MAX {
            return Err(Errno::ENOSPC.into());
        }
        let new = (name.len() + value.len()) as u64;
        let old = old.unwrap_or(0);
        if new > old {
            self.charge(new - old)?;
        }
        if let Err(error) = self.store_xattrs(&mut chunk, xattrs, time_ns) {
            if new > old {
                self.space.refund(new - old);
            }
            return Err(error);
        }
        if old > new {
            self.space.refund(old - new);
        }
        Ok(chunk.attr)
    }

    /// Removes extended attribute `name` of `file`; ENODATA if it has none.
    pub fn remove_xattr(&self, file: FileId, name: &str, time_ns: i64) -> Result<Attr, StoreError> {
        let handle = self.inode_checked(file)?;
        let mut chunk = handle.lock();
        let mut xattrs = chunk.xattrs.as_deref().cloned().unwrap_or_default();
        let value = xattrs.remove(name).ok_or(Errno::ENODATA)?;
        self.store_xattrs(&mut chunk, xattrs, time_ns)?;
        self.space.refund((name.len() + value.len()) as u64);
        Ok(chunk.attr)
    }

    /// Replaces the inode's extended attributes (written beside its chunk file first, so a
    /// failure changes nothing), sets its ctime, and in cache mode marks it dirty.
    fn store_xattrs(&self, chunk: &mut Chunk, xattrs: crate::chunk::Xattrs, time_ns: i64) -> Result<(), StoreError> {
        if let (Some(directory), Body::File(file)) = (&self.space.directory, &chunk.body) {
            directory.write_xattrs(file, &xattrs).map_err(StoreError::Directory)?;
        }
        debug_assert!(xattr_bytes(&xattrs) <= (XATTR_LIST_MAX * (XATTR_VALUE_MAX + 1)) as u64);
        chunk.set_xattrs(xattrs);
        chunk.attr.ctime_ns = time_ns;
        chunk.version += 1;
        self.touched(chunk);
        self.persist(chunk)
    }
}
