//! Extended attributes, as `getxattr(2)` and its siblings behave on Linux.
//!
//! By path, the calls follow a symbolic link in the last component (like `getxattr`); the
//! `l` variants do not (like `lgetxattr`); the `_id` variants act on a file by id and check
//! nothing (the FUSE mount: the kernel has checked the caller). Checks by path, for the
//! caller [`Client::credentials`] names:
//! - `user.`: only regular files and directories (others: EPERM to change, ENODATA to read);
//!   reading needs read permission, changing needs write permission (EACCES), and on a
//!   sticky directory ownership (EPERM);
//! - `trusted.`: root only (EPERM), and hidden from other users' lists;
//! - `security.`: anyone reads, root changes;
//! - `system.` (POSIX ACLs among them) and any other prefix: EOPNOTSUPP.

use ringfs_proto::{FileId, FileOnly, Request, Response, SetXattr, XattrName};

use crate::{Client, Result, Stat, now_ns};
use ringfs_proto::Errno;

/// Whether the caller may read (`write` false) or change extended attribute `name` of the
/// file `stat` describes.
fn check(client: &Client, stat: &Stat, name: &str, write: bool) -> Result<()> {
    let credentials = client.credentials();
    let root = credentials.uid == 0;
    if name.starts_with("user.") {
        if !(stat.is_dir() || stat.kind() == Some(ringfs_proto::FileKind::Regular)) {
            return Err(if write { Errno::EPERM } else { Errno::ENODATA });
        }
        if write && stat.is_dir() && stat.mode & 0o1000 != 0 && !root && credentials.uid != stat.uid {
            return Err(Errno::EPERM);
        }
        let wanted = if write { 0o2 } else { 0o4 };
        let granted = if root {
            0o7
        } else if credentials.uid == stat.uid {
            (stat.mode >> 6) & 7
        } else if credentials.in_group(stat.gid) {
            (stat.mode >> 3) & 7
        } else {
            stat.mode & 7
        };
        return if granted & wanted != 0 { Ok(()) } else { Err(Errno::EACCES) };
    }
    if name.starts_with("trusted.") {
        return if root { Ok(()) } else { Err(Errno::EPERM) };
    }
    if name.starts_with("security.") {
        return if root || !write { Ok(()) } else { Err(Errno::EPERM) };
    }
    Err(Errno::EOPNOTSUPP)
}

impl Client {
    fn xattr_target(&self, path: &str, follow: bool) -> Result<Stat> {
        if follow { self.stat(path) } else { self.lstat(path) }
    }

    /// The value of extended attribute `name` of `path` (ENODATA if it has none).
    pub fn get_xattr(&self, path: &str, name: &str) -> Result<Vec<u8>> {
        self.get_xattr_at(path, name, true)
    }

    /// [`Client::get_xattr`] of a symbolic link itself.
    pub fn lget_xattr(&self, path: &str, name: &str) -> Result<Vec<u8>> {
        self.get_xattr_at(path, name, false)
    }

    fn get_xattr_at(&self, path: &str, name: &str, follow: bool) -> Result<Vec<u8>> {
        let stat = self.xattr_target(path, follow)?;
        check(self, &stat, name, false)?;
        self.get_xattr_id(stat.file, name)
    }

    /// Sets extended attribute `name` of `path` (`flags`: `XattrFlags::CREATE` fails with
    /// EEXIST if it exists, `REPLACE` with ENODATA if it does not).
    pub fn set_xattr(&self, path: &str, name: &str, value: &[u8], flags: u32) -> Result<()> {
        self.set_xattr_at(path, name, value, flags, true)
    }

    /// [`Client::set_xattr`] of a symbolic link itself.
    pub fn lset_xattr(&self, path: &str, name: &str, value: &[u8], flags: u32) -> Result<()> {
        self.set_xattr_at(path, name, value, flags, false)
    }

    fn set_xattr_at(&self, path: &str, name: &str, value: &[u8], flags: u32, follow: bool) -> Result<()> {
        let stat = self.xattr_target(path, follow)?;
        check(self, &stat, name, true)?;
        self.set_xattr_id(stat.file, name, value, flags)
    }

    /// The names of `path`'s extended attributes that the caller may see.
    pub fn list_xattrs(&self, path: &str) -> Result<Vec<String>> {
        self.list_xattrs_at(path, true)
    }

    /// [`Client::list_xattrs`] of a symbolic link itself.
    pub fn llist_xattrs(&self, path: &str) -> Result<Vec<String>> {
        self.list_xattrs_at(path, false)
    }

    fn list_xattrs_at(&self, path: &str, follow: bool) -> Result<Vec<String>> {
        let stat = self.xattr_target(path, follow)?;
        let root = self.credentials().uid == 0;
        Ok(self.list_xattrs_id(stat.file)?.into_iter().filter(|name| root || !name.starts_with("trusted.")).collect())
    }

    /// Removes extended attribute `name` of `path` (ENODATA if it has none).
    pub fn remove_xattr(&self, path: &str, name: &str) -> Result<()> {
        self.remove_xattr_at(path, name, true)
    }

    /// [`Client::remove_xattr`] of a symbolic link itself.
    pub fn lremove_xattr(&self, path: &str, name: &str) -> Result<()> {
        self.remove_xattr_at(path, name, false)
    }

    fn remove_xattr_at(&self, path: &str, name: &str, follow: bool) -> Result<()> {
        let stat = self.xattr_target(path, follow)?;
        check(self, &stat, name, true)?;
        self.remove_xattr_id(stat.file, name)
    }

    /// The value of extended attribute `name` of `file`, unchecked.
    pub fn get_xattr_id(&self, file: FileId, name: &str) -> Result<Vec<u8>> {
        let request = Request::GetXattr(XattrName { file, name: name.to_string(), time_ns: 0 });
        match self.inner.cluster.call_home(file, &request)? {
            Response::Value(value) => Ok(value.0),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Sets extended attribute `name` of `file`, unchecked. The root directory, which every
    /// server holds, has it set everywhere.
    pub fn set_xattr_id(&self, file: FileId, name: &str, value: &[u8], flags: u32) -> Result<()> {
        let request = Request::SetXattr(SetXattr {
            file,
            name: name.to_string(),
            value: ringfs_proto::wire::Bytes(value.to_vec()),
            flags,
            time_ns: now_ns(),
        });
        self.on_inode(file, &request)
    }

    /// The names of `file`'s extended attributes, unchecked.
    pub fn list_xattrs_id(&self, file: FileId) -> Result<Vec<String>> {
        match self.inner.cluster.call_home(file, &Request::ListXattrs(FileOnly { file }))? {
            Response::Names(names) => Ok(names),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Removes extended attribute `name` of `file`, unchecked.
    pub fn remove_xattr_id(&self, file: FileId, name: &str) -> Result<()> {
        self.on_inode(file, &Request::RemoveXattr(XattrName { file, name: name.to_string(), time_ns: now_ns() }))
    }

    /// Sends a change to `file`'s inode (to every server for the root directory).
    fn on_inode(&self, file: FileId, request: &Request) -> Result<()> {
        if file.is_root() {
            return self.inner.cluster.broadcast(request).map(drop);
        }
        self.inner.cluster.call_home(file, request).map(drop)
    }
}
