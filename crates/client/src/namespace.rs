//! Operations on names: stat, directories, links, rename, truncate, attributes.

use std::collections::HashSet;
use std::sync::Arc;

use ringfs_proto::path;
use ringfs_proto::{Attr, ChunkRef, Create, DirPage, Errno, FileKind, FindFilter, Request, Response, SetAttr};
use ringfs_rpc::Connection;

use crate::{Client, DirEntry, FindSummary, Result, Stat, now_ns};

/// Entries asked from each server per page of a directory listing.
const DIRECTORY_PAGE: u32 = 4096;
/// Most symbolic links followed while resolving one path.
const MAX_SYMLINK_HOPS: usize = 40;

/// `access(2)` mode bits.
pub const READ_OK: u32 = 4;
pub const WRITE_OK: u32 = 2;
pub const EXECUTE_OK: u32 = 1;

impl Client {
    /// Sends a create to the owner of the new entry and returns the entry's attributes.
    pub(crate) fn create_entry(&self, path: &str, mode: u32, exclusive: bool, truncate: bool, link_target: Option<String>) -> Result<Attr> {
        let request = Request::Create(Create {
            path: path.to_string(),
            mode,
            uid: self.inner.uid,
            gid: self.inner.gid,
            chunk_size: self.inner.chunk_size,
            time_ns: now_ns(),
            exclusive,
            truncate,
            link_target,
        });
        match self.inner.cluster.call_owner(path, 0, &request)? {
            Response::Attr(attr) => Ok(attr),
            _ => Err(Errno::EPROTO),
        }
    }

    /// The canonical path a symbolic link at `path` points to.
    pub(crate) fn follow_link(&self, path: &str) -> Result<String> {
        let target = self.readlink(path)?;
        if target.starts_with('/') {
            path::canonicalize(&target)
        } else {
            path::canonicalize(&path::join(path::parent(path).unwrap_or("/"), &target))
        }
    }

    /// Truncates the file `path` (identified by `file_id`, 0 for any) to `size` bytes.
    pub(crate) fn truncate_file(&self, path: &str, file_id: u64, size: u64) -> Result<()> {
        let request = Request::Truncate { path: path.to_string(), file_id, size, time_ns: now_ns() };
        self.inner.cluster.call_owner(path, 0, &request).map(|_| ())
    }

    /// Attributes of `path`, following a symbolic link in its last component.
    pub fn stat(&self, path: &str) -> Result<Stat> {
        let mut path = path::canonicalize(path)?;
        for _ in 0..MAX_SYMLINK_HOPS {
            let attr = self.head_attr(&path)?;
            if !attr.is_symlink() {
                return self.stat_from_head(&path, &attr);
            }
            path = self.follow_link(&path)?;
        }
        Err(Errno::ELOOP)
    }

    /// Attributes of `path` itself (a symbolic link is not followed).
    pub fn lstat(&self, path: &str) -> Result<Stat> {
        let path = path::canonicalize(path)?;
        let attr = self.head_attr(&path)?;
        self.stat_from_head(&path, &attr)
    }

    /// Checks permissions like `access(2)` (`mode` 0 checks existence; see [`READ_OK`] etc.).
    pub fn access(&self, path: &str, mode: u32) -> Result<()> {
        let stat = self.stat(path)?;
        let uid = self.inner.uid;
        let permissions = stat.mode & 0o777;
        let granted = if uid == 0 {
            // root may read and write anything, and execute what anyone may execute.
            READ_OK | WRITE_OK | if permissions & 0o111 != 0 || stat.is_dir() { EXECUTE_OK } else { 0 }
        } else if uid == stat.uid {
            (permissions >> 6) & 7
        } else if self.inner.gid == stat.gid {
            (permissions >> 3) & 7
        } else {
            permissions & 7
        };
        if mode & !granted & 7 != 0 { Err(Errno::EACCES) } else { Ok(()) }
    }

    pub fn mkdir(&self, path: &str, mode: u32) -> Result<()> {
        let path = path::canonicalize(path)?;
        if path == "/" {
            return Err(Errno::EEXIST);
        }
        self.create_entry(&path, FileKind::Directory.mode_bits() | (mode & 0o7777), true, false, None).map(|_| ())
    }

    /// Removes an empty directory (ENOTEMPTY otherwise).
    pub fn rmdir(&self, path: &str) -> Result<()> {
        let path = path::canonicalize(path)?;
        if path == "/" {
            return Err(Errno::EBUSY);
        }
        self.inner.cluster.call_owner(&path, 0, &Request::Rmdir { path: path.clone() }).map(|_| ())
    }

    /// Removes a file or symbolic link (EISDIR for a directory).
    pub fn unlink(&self, path: &str) -> Result<()> {
        let path = path::canonicalize(path)?;
        self.inner.cluster.call_owner(&path, 0, &Request::Unlink { path: path.clone() }).map(|_| ())
    }

    /// Removes `path` and, if it is a directory, everything below it (`rm -r`).
    pub fn remove_tree(&self, path: &str) -> Result<()> {
        let path = path::canonicalize(path)?;
        if !self.lstat(&path)?.is_dir() {
            return self.unlink(&path);
        }
        for entry in self.readdir(&path)? {
            self.remove_tree(&path::join(&path, &entry.name))?;
        }
        self.rmdir(&path)
    }

    pub fn symlink(&self, target: &str, link_path: &str) -> Result<()> {
        if target.is_empty() {
            return Err(Errno::ENOENT);
        }
        let link_path = path::canonicalize(link_path)?;
        self.create_entry(&link_path, FileKind::Symlink.mode_bits() | 0o777, true, false, Some(target.to_string())).map(|_| ())
    }

    pub fn readlink(&self, path: &str) -> Result<String> {
        let path = path::canonicalize(path)?;
        let request = Request::Read(ringfs_proto::Read {
            chunk: ChunkRef { path: path.clone(), index: 0, file_id: 0 },
            offset: 0,
            len: path::MAX_PATH_BYTES as u64,
            lease: false,
            release: Vec::new(),
            backend_len: 0,
        });
        let reply = self.inner.cluster.call(&self.inner.cluster.owner(&path, 0), &request, &[])?;
        match reply.response {
            Response::Read { attr: Some(attr), .. } if attr.is_symlink() => String::from_utf8(reply.data).map_err(|_| Errno::EIO),
            Response::Read { .. } => Err(Errno::EINVAL),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Renames a file or symbolic link, replacing `to` if it is a file. The new name shows
    /// the complete file from the moment it appears.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        let from = path::canonicalize(from)?;
        let to = path::canonicalize(to)?;
        if from == "/" || to == "/" {
            return Err(Errno::EBUSY);
        }
        let request = Request::Rename { from: from.clone(), to, time_ns: now_ns() };
        self.inner.cluster.call_owner(&from, 0, &request).map(|_| ())
    }

    /// Truncates or extends a file (following symbolic links).
    pub fn truncate(&self, path: &str, size: u64) -> Result<()> {
        let mut path = path::canonicalize(path)?;
        for _ in 0..MAX_SYMLINK_HOPS {
            let attr = self.head_attr(&path)?;
            match attr.kind() {
                Some(FileKind::Symlink) => path = self.follow_link(&path)?,
                Some(FileKind::Directory) => return Err(Errno::EISDIR),
                _ => return self.truncate_file(&path, attr.file_id, size),
            }
        }
        Err(Errno::ELOOP)
    }

    /// Lists a directory: every server sends the entries it holds, page by page. In cache
    /// mode the backend directory's entries are merged in (each name once), except those
    /// removed in ringfs whose removal has not reached the backend yet.
    pub fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let path = path::canonicalize(path)?;
        let attr = self.stat(&path)?;
        if !attr.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        let cluster = &self.inner.cluster;
        let members = cluster.member_list().members;
        let connections = members.iter().map(|member| cluster.connection(member)).collect::<Result<Vec<_>>>()?;
        let (mut entries, removed) =
            self.read_pages(&connections, |after| Request::ReadDir { path: path.clone(), after, limit: DIRECTORY_PAGE })?;
        if attr.backed {
            let owner = [cluster.connection(&cluster.owner(&path, 0))?];
            let (backend_entries, _) =
                self.read_pages(&owner, |after| Request::ReadBackendDir { path: path.clone(), after, limit: DIRECTORY_PAGE })?;
            let known: HashSet<String> = entries.iter().map(|entry| entry.name.clone()).chain(removed).collect();
            entries.extend(backend_entries.into_iter().filter(|entry| !known.contains(&entry.name)));
        }
        let mut listing = entries
            .into_iter()
            .map(|entry| {
                let full = path::join(&path, &entry.name);
                let stat = self.stat_from_head(&full, &entry.attr)?;
                Ok(DirEntry { name: entry.name, stat })
            })
            .collect::<Result<Vec<_>>>()?;
        listing.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(listing)
    }

    /// Pages through a listing on each of `connections` in parallel (`request` builds the
    /// request for the page after a name); returns all entries and all removed names.
    fn read_pages(
        &self,
        connections: &[Arc<Connection>],
        request: impl Fn(Option<String>) -> Request,
    ) -> Result<(Vec<ringfs_proto::DirEntry>, HashSet<String>)> {
        let cluster = &self.inner.cluster;
        let mut cursors: Vec<Option<Option<String>>> = vec![Some(None); connections.len()];
        let mut entries = Vec::new();
        let mut removed = HashSet::new();
        while cursors.iter().any(Option::is_some) {
            let calls: Vec<_> = connections
                .iter()
                .zip(&cursors)
                .filter_map(|(connection, cursor)| {
                    let after = cursor.as_ref()?.clone();
                    Some((connection, connection.start(&request(after), &[], None)))
                })
                .collect();
            let mut pages = Vec::with_capacity(calls.len());
            for (connection, call) in calls {
                match cluster.finish(connection, call)?.response {
                    Response::DirPage(page) => pages.push(page),
                    _ => return Err(Errno::EPROTO),
                }
            }
            let mut pages = pages.into_iter();
            for cursor in cursors.iter_mut().filter(|cursor| cursor.is_some()) {
                let DirPage { entries: page_entries, more, removed: page_removed } = pages.next().ok_or(Errno::EPROTO)?;
                *cursor = if more { Some(page_entries.last().map(|entry| entry.name.clone())) } else { None };
                entries.extend(page_entries);
                removed.extend(page_removed);
            }
        }
        Ok((entries, removed))
    }

    /// Counts the entries below `root` (at any depth) and those matching `filter`, like
    /// `find ROOT -newer … -size …c -name …` would. Every server filters its own entries;
    /// files spread over several servers are judged with a stat.
    pub fn find(&self, root: &str, filter: &FindFilter) -> Result<FindSummary> {
        let root = path::canonicalize(root)?;
        let root_stat = self.stat(&root)?;
        if !root_stat.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        if root_stat.backed {
            // Cache mode: entries that only the backend has are known to no server, so the
            // merged listings are walked instead.
            let mut summary = FindSummary::default();
            self.walk(&root, filter, &mut summary)?;
            return Ok(summary);
        }
        let answers = self.inner.cluster.broadcast(&Request::Find { root, filter: filter.clone() })?;
        let mut summary = FindSummary::default();
        for answer in answers {
            let Response::Found(found) = answer else { return Err(Errno::EPROTO) };
            summary.scanned += found.scanned;
            summary.matched += found.matched;
            for candidate in found.undecided {
                let stat = match self.lstat(&candidate) {
                    Ok(stat) => stat,
                    Err(Errno::ENOENT) => continue,
                    Err(errno) => return Err(errno),
                };
                let newer = filter.newer_than_ns.is_none_or(|time| stat.mtime_ns > time);
                let sized = filter.size.is_none_or(|size| stat.size == size);
                summary.matched += u64::from(newer && sized);
            }
        }
        Ok(summary)
    }

    /// `find` by walking the merged directory listings below `dir`.
    fn walk(&self, dir: &str, filter: &FindFilter, summary: &mut FindSummary) -> Result<()> {
        for entry in self.readdir(dir)? {
            summary.scanned += 1;
            let name_matches = filter.name.as_deref().is_none_or(|pattern| path::glob_match(pattern, &entry.name));
            let newer = filter.newer_than_ns.is_none_or(|time| entry.stat.mtime_ns > time);
            let sized = filter.size.is_none_or(|size| entry.stat.size == size);
            summary.matched += u64::from(name_matches && newer && sized);
            if entry.stat.is_dir() {
                self.walk(&path::join(dir, &entry.name), filter, summary)?;
            }
        }
        Ok(())
    }

    fn set_attr(&self, path: &str, change: impl FnOnce(&mut SetAttr)) -> Result<()> {
        let path = path::canonicalize(path)?;
        let mut request =
            SetAttr { path: path.clone(), mode: None, uid: None, gid: None, atime_ns: None, mtime_ns: None, time_ns: now_ns() };
        change(&mut request);
        if path == "/" {
            // Every server holds a copy of the root directory; keep them alike.
            return self.inner.cluster.broadcast(&Request::SetAttr(request)).map(|_| ());
        }
        self.inner.cluster.call_owner(&path, 0, &Request::SetAttr(request)).map(|_| ())
    }

    pub fn chmod(&self, path: &str, mode: u32) -> Result<()> {
        self.set_attr(path, |request| request.mode = Some(mode & 0o7777))
    }

    /// Changes owner and/or group (`None` leaves one unchanged).
    pub fn chown(&self, path: &str, uid: Option<u32>, gid: Option<u32>) -> Result<()> {
        self.set_attr(path, |request| {
            request.uid = uid;
            request.gid = gid;
        })
    }

    /// Sets access and/or modification time (nanoseconds since the epoch).
    pub fn utimens(&self, path: &str, atime_ns: Option<i64>, mtime_ns: Option<i64>) -> Result<()> {
        self.set_attr(path, |request| {
            request.atime_ns = atime_ns;
            request.mtime_ns = mtime_ns;
        })
    }
}
