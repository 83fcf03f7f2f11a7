//! Extended attributes, as `getxattr(2)` and its siblings behave on Linux.
//!
//! By path, the calls follow a symbolic link in the last component (like `getxattr`); the
//! `l` variants do not (like `lgetxattr`); the `_id` variants act on a file by id (the FUSE
//! mount). The file's inode server checks every call for the user [`Client::credentials`]
//! names, with Linux's rules (`ringfs_proto::Credentials::check_xattr`): `user.` names on
//! regular files and directories for those who may read or write the file, `trusted.` for
//! root only (and hidden from others' lists), `security.` read by all and changed by root,
//! other prefixes (POSIX ACLs among them) EOPNOTSUPP.

use ringfs_proto::{FileId, FileOnly, Request, Response, SetXattr, XattrName};

use crate::{Client, Result, Stat, now_ns};
use ringfs_proto::Errno;

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
        self.list_xattrs_id(stat.file)
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
        self.remove_xattr_id(stat.file, name)
    }

    /// The value of extended attribute `name` of `file`, checked by its server for the user this handle acts for.
    pub fn get_xattr_id(&self, file: FileId, name: &str) -> Result<Vec<u8>> {
        let request = self.for_caller(Request::GetXattr(XattrName { file, name: name.to_string(), time_ns: 0 }));
        match self.inner.cluster.call_home(file, &request)? {
            Response::Value(value) => Ok(value.0),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Sets extended attribute `name` of `file`, checked by its server for the user this handle acts for. The root directory, which every
    /// server holds, has it set everywhere.
    pub fn set_xattr_id(&self, file: FileId, name: &str, value: &[u8], flags: u32) -> Result<()> {
        let request = self.for_caller(Request::SetXattr(SetXattr {
            file,
            name: name.to_string(),
            value: ringfs_proto::wire::Bytes(value.to_vec()),
            flags,
            time_ns: now_ns(),
        }));
        self.on_inode(file, &request)
    }

    /// The names of `file`'s extended attributes, checked by its server for the user this handle acts for.
    pub fn list_xattrs_id(&self, file: FileId) -> Result<Vec<String>> {
        match self.inner.cluster.call_home(file, &self.for_caller(Request::ListXattrs(FileOnly { file })))? {
            Response::Names(names) => Ok(names),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Removes extended attribute `name` of `file`, checked by its server for the user this handle acts for.
    pub fn remove_xattr_id(&self, file: FileId, name: &str) -> Result<()> {
        self.on_inode(file, &self.for_caller(Request::RemoveXattr(XattrName { file, name: name.to_string(), time_ns: now_ns() })))
    }

    /// Sends a change to `file`'s inode (to every server for the root directory).
    fn on_inode(&self, file: FileId, request: &Request) -> Result<()> {
        if file.is_root() {
            return self.inner.cluster.broadcast(request).map(drop);
        }
        self.inner.cluster.call_home(file, request).map(drop)
    }
}
