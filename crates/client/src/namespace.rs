//! Operations on names: stat, directories, links (symbolic and hard), special files, rename,
//! truncate, attributes.
//!
//! A name is looked up at the server that owns its path, which answers the file's attributes
//! too (asking the file's inode server when the file was renamed or linked there); changes of
//! a file's attributes go to its inode's server, by id.

use std::collections::HashSet;
use std::sync::Arc;

use ringfs_proto::access::MAY_WRITE;
use ringfs_proto::path;
use ringfs_proto::{
    Attr, ChunkKey, Create, DirPage, Errno, FileId, FileKind, FileOnly, FindFilter, Link, LinkFile, Opened, ReadDir, Rename, Request,
    Response, Rmdir, SetAttr, Truncate, Unlink,
};
use ringfs_rpc::Connection;

use crate::links::MAX_SYMLINK_HOPS;
use crate::{Client, DirEntry, Directory, DirectoryPage, FindSummary, NameEntry, Result, Stat, now_ns};

/// Entries asked from each server per page of a directory listing.
const DIRECTORY_PAGE: u32 = 4096;

/// `renameat2` flags for [`Client::rename_with_flags`].
pub use ringfs_proto::RenameFlags;

impl Client {
    /// Sends a create to the owner of the new name; the file's attributes (and whether an open
    /// for `open_for` was registered with them).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create_entry(
        &self,
        path: &str,
        mode: u32,
        exclusive: bool,
        truncate: bool,
        link_target: Option<String>,
        rdev: u64,
        open_for: u64,
        access: u32,
    ) -> Result<Opened> {
        let request = self.for_caller(Request::Create(Create {
            path: path.to_string(),
            mode,
            uid: self.credentials.uid,
            gid: self.credentials.gid,
            rdev,
            chunk_size: self.inner.chunk_size,
            time_ns: now_ns(),
            exclusive,
            truncate,
            link_target,
            open_for,
            access,
        }));
        match self.inner.cluster.call_path_owner(path, &request)? {
            Response::Opened(opened) => Ok(opened),
            _ => Err(Errno::EPROTO),
        }
    }

    /// The attributes of the file `path` names (no symlink following).
    pub(crate) fn lookup_attr(&self, path: &str) -> Result<Attr> {
        Ok(self.lookup_opened(path, 0, 0)?.attr)
    }

    /// The attributes of the file `path` names after following symbolic links.
    fn resolve(&self, path: &str) -> Result<(String, Attr)> {
        let mut path = path::canonicalize(path)?;
        for _ in 0..MAX_SYMLINK_HOPS {
            let attr = self.lookup_attr(&path)?;
            if !attr.is_symlink() {
                return Ok((path, attr));
            }
            path = self.follow_link(&path)?;
        }
        Err(Errno::ELOOP)
    }

    /// Truncates `file` to `size` bytes at its inode's server.
    pub(crate) fn truncate_file(&self, file: FileId, size: u64) -> Result<()> {
        let request = Request::Truncate(Truncate { file, size, time_ns: now_ns() });
        self.inner.cluster.call_home(file, &request).map(|_| ())
    }

    /// Attributes of `path`, following a symbolic link in its last component.
    pub fn stat(&self, path: &str) -> Result<Stat> {
        let (_, attr) = self.resolve(path)?;
        self.stat_from_attr(&attr)
    }

    /// Attributes of `path` itself (a symbolic link is not followed).
    pub fn lstat(&self, path: &str) -> Result<Stat> {
        let attr = self.lookup_attr(&path::canonicalize(path)?)?;
        self.stat_from_attr(&attr)
    }

    /// Attributes of a file by its id (FUSE asks by inode number).
    pub fn stat_id(&self, file: FileId) -> Result<Stat> {
        let attr = self.stat_file(file)?;
        self.stat_from_attr(&attr)
    }

    /// Checks permissions like `access(2)` (`mode` 0 checks existence; bits as `R_OK`, `W_OK`, `X_OK`: `ringfs_proto::access::MAY_*`).
    pub fn access(&self, path: &str, mode: u32) -> Result<()> {
        let stat = self.stat(path)?;
        let granted = self.credentials.granted(stat.mode, stat.uid, stat.gid);
        if mode & !granted & 7 != 0 { Err(Errno::EACCES) } else { Ok(()) }
    }

    pub fn mkdir(&self, path: &str, mode: u32) -> Result<()> {
        let path = path::canonicalize(path)?;
        if path == "/" {
            return Err(Errno::EEXIST);
        }
        self.create_entry(&path, FileKind::Directory.mode_bits() | (mode & 0o7777), true, false, None, 0, 0, 0).map(drop)
    }

    /// Makes a FIFO, a character or block device (with device number `rdev`) or a socket
    /// node, as `mknod(2)` does (`mode` carries the type); regular files too.
    pub fn mknod(&self, path: &str, mode: u32, rdev: u64) -> Result<()> {
        let path = path::canonicalize(path)?;
        match FileKind::from_mode(mode) {
            Some(FileKind::Directory | FileKind::Symlink) | None => return Err(Errno::EINVAL),
            Some(_) => {}
        }
        self.create_entry(&path, mode, true, false, None, rdev, 0, 0).map(drop)
    }

    /// Removes an empty directory (ENOTEMPTY otherwise).
    pub fn rmdir(&self, path: &str) -> Result<()> {
        let path = path::canonicalize(path)?;
        if path == "/" {
            return Err(Errno::EBUSY);
        }
        self.inner
            .cluster
            .call_path_owner(&path, &self.for_caller(Request::Rmdir(Rmdir { path: path.clone(), time_ns: now_ns() })))
            .map(|_| ())
    }

    /// Removes a name of a file, symbolic link or special file (EISDIR for a directory). The
    /// file itself goes with its last name — or, if it is open, with its last close.
    pub fn unlink(&self, path: &str) -> Result<()> {
        // This client's closes first: a file it closed goes with its name, not a moment later.
        self.inner.closes.flush(&self.inner.cluster, self.inner.client_id);
        self.unlink_leaving_closes_batched(path)
    }

    /// [`Client::unlink`] without sending this client's waiting closes first: they go out
    /// with their batch, within milliseconds. For the FUSE mount, which closes a file when
    /// the kernel forgets it — after its last name went — so that sending the closes first
    /// would only cost every unlink a message for the file removed before it.
    pub fn unlink_leaving_closes_batched(&self, path: &str) -> Result<()> {
        let path = path::canonicalize(path)?;
        self.inner
            .cluster
            .call_path_owner(&path, &self.for_caller(Request::Unlink(Unlink { path: path.clone(), time_ns: now_ns() })))
            .map(|_| ())
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
        self.create_entry(&link_path, FileKind::Symlink.mode_bits() | 0o777, true, false, Some(target.to_string()), 0, 0, 0).map(drop)
    }

    /// A hard link: `to` becomes another name of the file `from` names (not followed if it
    /// is a symbolic link). EPERM for a directory, EEXIST if `to` exists.
    pub fn link(&self, from: &str, to: &str) -> Result<()> {
        let from = path::canonicalize(from)?;
        let to = path::canonicalize(to)?;
        let request = self.for_caller(Request::Link(Link { from: from.clone(), to, time_ns: now_ns() }));
        self.inner.cluster.call_path_owner(&from, &request).map(|_| ())
    }

    /// A new name `to` for the file `file` (by id: whatever its names are now). ENOENT once
    /// the file has no name left.
    pub fn link_file(&self, file: FileId, to: &str) -> Result<()> {
        let to = path::canonicalize(to)?;
        let request = self.for_caller(Request::LinkFile(LinkFile { file, to: to.clone(), time_ns: now_ns() }));
        self.inner.cluster.call_path_owner(&to, &request).map(|_| ())
    }

    pub fn readlink(&self, path: &str) -> Result<String> {
        let path = path::canonicalize(path)?;
        let attr = self.lookup_attr(&path)?;
        if !attr.is_symlink() {
            return Err(Errno::EINVAL);
        }
        self.readlink_file(attr.file_id)
    }

    /// The target of the symbolic link `file` (by id).
    pub fn readlink_file(&self, file: FileId) -> Result<String> {
        let request = Request::Read(ringfs_proto::Read {
            chunk: ChunkKey::inode(file),
            offset: 0,
            len: path::MAX_CALL_PATH_BYTES as u64,
            lease: false,
            release: Vec::new(),
            backend_len: 0,
        });
        let cluster = &self.inner.cluster;
        let reply = cluster.call(&cluster.owner_of_chunk(ChunkKey::inode(file)), &request, &[])?;
        match reply.response {
            Response::Read(read) if read.attr.is_some_and(|attr| attr.is_symlink()) => {
                String::from_utf8(reply.data).map_err(|_| Errno::EIO)
            }
            Response::Read(_) => Err(Errno::EINVAL),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Renames a file or directory, replacing `to` if it is a file or an empty directory (of
    /// the same kind). The new name shows the whole file (or tree) from the moment it appears.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.rename_with_flags(from, to, 0)
    }

    /// [`Client::rename`] with `renameat2` flags: [`RenameFlags::NOREPLACE`] fails with EEXIST
    /// if `to` exists; [`RenameFlags::EXCHANGE`] swaps the two names.
    pub fn rename_with_flags(&self, from: &str, to: &str, flags: u32) -> Result<()> {
        // As for unlinks: a file this client closed goes with the name it loses.
        self.inner.closes.flush(&self.inner.cluster, self.inner.client_id);
        self.rename_leaving_closes_batched(from, to, flags)
    }

    /// [`Client::rename_with_flags`] without sending this client's waiting closes first (see
    /// [`Client::unlink_leaving_closes_batched`]).
    pub fn rename_leaving_closes_batched(&self, from: &str, to: &str, flags: u32) -> Result<()> {
        let from = path::canonicalize(from)?;
        let to = path::canonicalize(to)?;
        if from == "/" || to == "/" {
            return Err(Errno::EBUSY);
        }
        let request = self.for_caller(Request::Rename(Rename { from: from.clone(), to, time_ns: now_ns(), flags }));
        self.inner.cluster.call_path_owner(&from, &request).map(|_| ())
    }

    /// Truncates or extends a file (following symbolic links).
    pub fn truncate(&self, path: &str, size: u64) -> Result<()> {
        let (path, attr) = self.resolve(path)?;
        match attr.kind() {
            // Write permission, checked by the name's server (as an open for writing is).
            Some(FileKind::Regular) => {
                self.lookup_opened(&path, 0, MAY_WRITE)?;
                self.truncate_to_other_size(attr.file_id, size)
            }
            Some(FileKind::Directory) => Err(Errno::EISDIR),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Truncates a file by id, like `truncate(2)` (FUSE, where the kernel checked the caller
    /// may write).
    pub fn truncate_id(&self, file: FileId, size: u64) -> Result<()> {
        self.truncate_to_other_size(file, size)
    }

    /// `truncate(2)` changes nothing, times included, when the file has that size already
    /// (unlike `ftruncate`, which marks the times whatever the size): Linux's rule.
    fn truncate_to_other_size(&self, file: FileId, size: u64) -> Result<()> {
        if self.stat_id(file)?.size == size {
            return Ok(());
        }
        self.truncate_file(file, size)
    }

    /// Lists a directory: every server sends the names it holds, page by page, with the
    /// attributes of the files it holds too; the others are asked of their inodes' servers. In
    /// cache mode the backend directory's entries are merged in (each name once), except those
    /// removed in ringfs whose removal has not reached the backend yet.
    pub fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let mut listing = self.with_stats(self.list_entries(path)?)?;
        listing.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(listing)
    }

    /// Entries with their files' `stat`: the attributes a name's server sent, or asked of the
    /// inode's server. A file removed since its name was listed is left out.
    fn with_stats(&self, entries: Vec<ringfs_proto::DirEntry>) -> Result<Vec<DirEntry>> {
        let mut listing = Vec::with_capacity(entries.len());
        for entry in entries {
            let attr = match entry.attr {
                Some(attr) => attr,
                None => match self.stat_file(entry.entry.file) {
                    Ok(attr) => attr,
                    Err(Errno::ESTALE) => continue,
                    Err(errno) => return Err(errno),
                },
            };
            listing.push(DirEntry { name: entry.name, stat: self.stat_from_attr(&attr)? });
        }
        Ok(listing)
    }

    /// Lists a directory's names with their files' ids and types only, as `getdents` gives
    /// them: no attributes, so no request to inode servers (which [`Client::readdir`] sends
    /// for every file whose inode lives elsewhere than its name). Sorted by name.
    pub fn readdir_names(&self, path: &str) -> Result<Vec<NameEntry>> {
        let mut listing: Vec<NameEntry> = self
            .list_entries(path)?
            .into_iter()
            .map(|entry| NameEntry { name: entry.name, file: entry.entry.file, kind: entry.entry.kind() })
            .collect();
        listing.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(listing)
    }

    /// Opens directory `path` for listing it page by page ([`Client::list_page`]).
    pub fn open_directory(&self, path: &str) -> Result<Directory> {
        let path = path::canonicalize(path)?;
        let stat = self.stat(&path)?;
        if !stat.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        Ok(Directory { path, stat })
    }

    /// The names of `directory` after `after` (from the first without), sorted, with their
    /// files' attributes, about `wanted` of them, read from the servers when called: one
    /// request to every server (and to the backend directory's server in cache mode). A page
    /// ends at the smallest last name of the servers that have more, so it may hold fewer
    /// names than wanted; `more` says whether names follow. Concurrent changes: a name
    /// created or removed meanwhile may or may not be listed; every other name is listed
    /// once however the listing is paged.
    pub fn list_page(&self, directory: &Directory, after: Option<&str>, wanted: usize) -> Result<DirectoryPage> {
        let cluster = &self.inner.cluster;
        let members = cluster.member_list().members;
        let mut connections = members.iter().map(|member| cluster.connection(member)).collect::<Result<Vec<_>>>()?;
        let limit = (wanted.div_ceil(connections.len().max(1)) + 16).min(DIRECTORY_PAGE as usize) as u32;
        let path = &directory.path;
        let page_request = |backend: bool| {
            let read = ReadDir { path: path.clone(), after: after.map(str::to_string), limit };
            self.for_caller(if backend { Request::ReadBackendDir(read) } else { Request::ReadDir(read) })
        };
        let mut requests = vec![page_request(false); connections.len()];
        if directory.stat.backed {
            connections.push(cluster.connection(&cluster.owner_of_path(path))?);
            requests.push(page_request(true));
        }
        // A server may answer "more" with no names (its names went while it read them): ask again.
        for _ in 0..8 {
            let pages = self.read_round(&connections, &requests)?;
            if pages.iter().any(|page| page.more && page.entries.is_empty()) {
                continue;
            }
            let backend = if directory.stat.backed { pages.last().cloned() } else { None };
            let ringfs_pages = &pages[..pages.len() - usize::from(backend.is_some())];
            let (entries, more) = merge_pages(ringfs_pages, backend);
            return Ok(DirectoryPage { entries: self.with_stats(entries)?, more });
        }
        Err(Errno::EAGAIN)
    }

    /// The raw entries of directory `path` from every server (and the backend), unsorted.
    fn list_entries(&self, path: &str) -> Result<Vec<ringfs_proto::DirEntry>> {
        let Directory { path, stat } = self.open_directory(path)?;
        let cluster = &self.inner.cluster;
        let members = cluster.member_list().members;
        let connections = members.iter().map(|member| cluster.connection(member)).collect::<Result<Vec<_>>>()?;
        let read_dir = |after| self.for_caller(Request::ReadDir(ReadDir { path: path.clone(), after, limit: DIRECTORY_PAGE }));
        let (mut entries, removed) = self.read_pages(&connections, read_dir)?;
        if stat.backed {
            let owner = [cluster.connection(&cluster.owner_of_path(&path))?];
            let read_backend =
                |after| self.for_caller(Request::ReadBackendDir(ReadDir { path: path.clone(), after, limit: DIRECTORY_PAGE }));
            let (backend_entries, _) = self.read_pages(&owner, read_backend)?;
            let known: HashSet<String> = entries.iter().map(|entry| entry.name.clone()).chain(removed).collect();
            entries.extend(backend_entries.into_iter().filter(|entry| !known.contains(&entry.name)));
        }
        Ok(entries)
    }

    /// Sends `requests[i]` on `connections[i]`, all at once, and returns their pages in order.
    fn read_round(&self, connections: &[Arc<Connection>], requests: &[Request]) -> Result<Vec<DirPage>> {
        let cluster = &self.inner.cluster;
        let calls: Vec<_> =
            connections.iter().zip(requests).map(|(connection, request)| (connection, connection.start(request, &[], None))).collect();
        let mut pages = Vec::with_capacity(calls.len());
        for (connection, call) in calls {
            match cluster.finish(connection, call)?.response {
                Response::DirPage(page) => pages.push(page),
                _ => return Err(Errno::EPROTO),
            }
        }
        Ok(pages)
    }

    /// Pages through a listing on each of `connections` in parallel (`request` builds the
    /// request for the page after a name); returns all entries and all removed names.
    fn read_pages(
        &self,
        connections: &[Arc<Connection>],
        request: impl Fn(Option<String>) -> Request,
    ) -> Result<(Vec<ringfs_proto::DirEntry>, HashSet<String>)> {
        let mut cursors: Vec<Option<Option<String>>> = vec![Some(None); connections.len()];
        let mut entries = Vec::new();
        let mut removed = HashSet::new();
        while cursors.iter().any(Option::is_some) {
            let (asked, requests): (Vec<_>, Vec<_>) = connections
                .iter()
                .zip(&cursors)
                .filter_map(|(connection, cursor)| Some((connection.clone(), request(cursor.as_ref()?.clone()))))
                .unzip();
            let mut pages = self.read_round(&asked, &requests)?.into_iter();
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
    /// files it cannot judge alone are judged with a stat.
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
        let answers = self.inner.cluster.broadcast(&Request::Find(ringfs_proto::Find { root, filter: filter.clone() }))?;
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

    /// Changes attributes of a file by id; the root directory, which every server holds, is
    /// changed everywhere.
    pub fn set_attr_id(&self, file: FileId, change: impl FnOnce(&mut SetAttr)) -> Result<()> {
        let mut request = SetAttr::new(file, now_ns());
        change(&mut request);
        let request = self.for_caller(Request::SetAttr(request));
        if file.is_root() {
            return self.inner.cluster.broadcast(&request).map(drop);
        }
        self.inner.cluster.call_home(file, &request).map(drop)
    }

    fn set_attr(&self, path: &str, change: impl FnOnce(&mut SetAttr)) -> Result<()> {
        let (_, attr) = self.resolve(path)?;
        self.set_attr_id(attr.file_id, change)
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

    /// Sets access and/or modification time (nanoseconds since the epoch) to values of the
    /// caller's choosing (only the owner may).
    pub fn utimens(&self, path: &str, atime_ns: Option<i64>, mtime_ns: Option<i64>) -> Result<()> {
        self.set_times(path, atime_ns, mtime_ns, true)
    }

    /// Sets access and modification time to now, as `touch` does (write permission is
    /// enough).
    pub fn touch(&self, path: &str) -> Result<()> {
        self.set_attr(path, |request| {
            // The change's own time: mtime and ctime are equal after it.
            request.atime_ns = Some(request.time_ns);
            request.mtime_ns = Some(request.time_ns);
            request.times_explicit = false;
        })
    }

    /// Sets access and/or modification time, as `utimensat` does: `explicit` when either is
    /// a value of the caller's choosing (only the owner may), not "now".
    pub fn set_times(&self, path: &str, atime_ns: Option<i64>, mtime_ns: Option<i64>, explicit: bool) -> Result<()> {
        self.set_attr(path, |request| {
            request.atime_ns = atime_ns;
            request.mtime_ns = mtime_ns;
            request.times_explicit = explicit;
        })
    }

    /// Makes everything written to `file` durable (see [`Client::fsync`]), by id.
    pub fn fsync_id(&self, file: FileId) -> Result<()> {
        self.inner.cluster.broadcast(&Request::Fsync(FileOnly { file })).map(drop)
    }
}

/// One page of a listing from the pages of one round: the servers' entries (and the backend's,
/// less the names ringfs holds or removed) up to the smallest last name of a page with more
/// after it — every source has sent all its names up to there — sorted; and whether names follow.
fn merge_pages(pages: &[DirPage], backend: Option<DirPage>) -> (Vec<ringfs_proto::DirEntry>, bool) {
    let bound = pages
        .iter()
        .chain(backend.as_ref())
        .filter(|page| page.more)
        .filter_map(|page| page.entries.last().map(|entry| entry.name.clone()))
        .min();
    let within = |name: &str| bound.as_deref().is_none_or(|bound| name <= bound);
    let mut entries: Vec<ringfs_proto::DirEntry> =
        pages.iter().flat_map(|page| page.entries.iter()).filter(|entry| within(&entry.name)).cloned().collect();
    if let Some(backend) = backend {
        let known: HashSet<&str> = entries
            .iter()
            .map(|entry| entry.name.as_str())
            .chain(pages.iter().flat_map(|page| page.removed.iter().map(String::as_str)))
            .collect();
        let from_backend: Vec<_> =
            backend.entries.into_iter().filter(|entry| within(&entry.name) && !known.contains(entry.name.as_str())).collect();
        entries.extend(from_backend);
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    (entries, bound.is_some())
}
