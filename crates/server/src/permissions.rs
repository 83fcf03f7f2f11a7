//! Permission checks of clients' requests, at the server that executes them.
//!
//! Every request from a client acts for a user (its connection's credentials from the
//! `Hello`, or those of an `AsUser` wrapper). Before the server that owns a request's key
//! executes it, [`Permissions::authorize`] checks it as Linux would (the rules are in
//! `ringfs_proto::access`):
//! - a path needs search permission on every directory above its last component;
//! - creating, removing and renaming names need write and search permission on the parent,
//!   and in a sticky directory ownership of the entry or the directory;
//! - opening an existing file needs the read/write permission the open asks for;
//! - listing a directory needs read permission;
//! - `chmod`, `chown`, `utimensat` and extended attributes follow their own rules, checked
//!   against the inode here.
//!
//! The modes and owners of directories above a path live on other servers: each server
//! remembers those it asked for ([`DirAttrCache`]). A change of a directory's mode or owner
//! makes every server forget it before the change is answered (`ForgetDirAttrs`); removing
//! or renaming a directory does too. What a server could not be told (it was cut off) it
//! forgets within [`DIR_ATTRS_TTL`].
//!
//! Checks come before the operation, as with the kernel's checks of a FUSE mount: an
//! operation racing a `chmod` of the same object may see either mode.
//!
//! Requests that servers make of each other act as root (they carry out a step of a request
//! checked already), and requests by file id (reads, writes, truncates of an open file) are
//! not checked: the open that produced the id was.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringfs_proto::access::{MAY_EXECUTE, MAY_READ, MAY_WRITE};
use ringfs_proto::{Attr, Credentials, Errno, FileId, Lookup, Request, Response, Rmdir, Unlink, XattrName, path};

use crate::node::{Node, store_errno};

/// How long a remembered directory's mode and owner are trusted without being asked again.
pub const DIR_ATTRS_TTL: Duration = Duration::from_secs(1);

/// Remembered directories at most; beyond, all are forgotten at once.
const MAX_REMEMBERED: usize = 1 << 16;

/// The attributes of directories this server asked for, by path.
#[derive(Default)]
struct DirAttrCache {
    inner: Mutex<CacheInner>,
}

#[derive(Default)]
struct CacheInner {
    entries: HashMap<String, (Attr, Instant)>,
    /// Raised by every forgetting: an answer asked for before it may be stale and is not kept.
    generation: u64,
}

impl DirAttrCache {
    fn lock(&self) -> parking_lot::MutexGuard<'_, CacheInner> {
        self.inner.lock()
    }

    /// The remembered attributes of `dir`, or the generation to insert them with.
    fn get(&self, dir: &str) -> Result<Attr, u64> {
        let inner = self.lock();
        match inner.entries.get(dir) {
            Some((attr, at)) if crate::sched::since(*at) < DIR_ATTRS_TTL => Ok(*attr),
            _ => Err(inner.generation),
        }
    }

    fn insert(&self, dir: &str, attr: Attr, generation: u64) {
        let mut inner = self.lock();
        if inner.generation != generation {
            return;
        }
        if inner.entries.len() >= MAX_REMEMBERED {
            inner.entries.clear();
        }
        inner.entries.insert(dir.to_string(), (attr, crate::sched::now()));
    }

    /// Forgets directory `file` (its mode or owner changed).
    fn forget_file(&self, file: FileId) {
        let mut inner = self.lock();
        inner.generation += 1;
        inner.entries.retain(|_, (attr, _)| attr.file_id != file);
    }

    /// Forgets `dir` and every directory below it (removed or renamed).
    fn forget_under(&self, dir: &str) {
        let mut inner = self.lock();
        inner.generation += 1;
        inner.entries.retain(|known, _| known != dir && !path::is_inside(known, dir));
    }
}

/// The directories above `path`'s last component, from the root down.
fn directories_above(path: &str) -> impl Iterator<Item = &str> {
    let ends = path.match_indices('/').map(|(at, _)| at);
    ends.map(move |end| if end == 0 { "/" } else { &path[..end] })
}

/// The permission checks of this server's clients' requests, and what they remember.
pub struct Permissions {
    node: Arc<Node>,
    dir_attrs: DirAttrCache,
}

impl Permissions {
    pub fn new(node: Arc<Node>) -> Permissions {
        Permissions { node, dir_attrs: DirAttrCache::default() }
    }

    /// Forgets directory `file` (`ForgetDirAttrs`: its mode or owner changed elsewhere).
    pub fn forget_file(&self, file: FileId) {
        self.dir_attrs.forget_file(file);
    }

    /// Forgets `dir` and every directory below it (removed or renamed).
    pub fn forget_under(&self, dir: &str) {
        self.dir_attrs.forget_under(dir);
    }

    /// The attributes of directory `dir` (ENOENT, ENOTDIR as a path walk gives them).
    fn dir_attr(&self, dir: &str) -> Result<Attr, Errno> {
        let generation = match self.dir_attrs.get(dir) {
            Ok(attr) => return Ok(attr),
            Err(generation) => generation,
        };
        let attr = if dir == "/" {
            // Every server holds the root directory (remembered too: every path walk starts
            // there, and its inode's lock is the busiest of all).
            self.node.store.stat(FileId::ROOT).map_err(store_errno)?
        } else {
            self.entry_attr(dir)?.ok_or(Errno::ENOENT)?
        };
        if !attr.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        self.dir_attrs.insert(dir, attr, generation);
        Ok(attr)
    }

    /// The attributes of what `path` names (`None` if nothing), from its name's server. A
    /// name whose file went while it was read (ESTALE: renamed over or removed meanwhile) is
    /// read again; one that keeps going stale counts as gone.
    fn entry_attr(&self, path: &str) -> Result<Option<Attr>, Errno> {
        for _ in 0..8 {
            match self.entry_attr_once(path) {
                Err(Errno::ESTALE) => continue,
                outcome => return outcome,
            }
        }
        Ok(None)
    }

    fn entry_attr_once(&self, path: &str) -> Result<Option<Attr>, Errno> {
        let owner = self.node.owner_of_path(path);
        if self.node.is_self(&owner) {
            // The usual case (the name of the request's own path): read the index directly.
            return match self.node.store.lookup(path, self.node.anchor_of(path), false) {
                Ok((_, Some(attr))) => Ok(Some(attr)),
                Ok((entry, None)) => self.node.stat_file(entry.file).map(Some),
                Err(error) if error.errno() == Errno::ENOENT => Ok(None),
                Err(error) => Err(store_errno(error)),
            };
        }
        match self.node.ask(&owner, Request::Lookup(Lookup { path: path.to_string(), open_for: 0, access: 0 })) {
            Ok(Response::Opened(opened)) => Ok(Some(opened.attr)),
            Ok(_) => Err(Errno::EPROTO),
            Err(Errno::ENOENT) => Ok(None),
            Err(errno) => Err(errno),
        }
    }

    /// The attributes of `path`'s parent directory, once `caller` is known to have search
    /// permission on every directory above `path`'s last component (root has: only the
    /// parent is looked up).
    fn searched_parent(&self, caller: &Credentials, path: &str) -> Result<Attr, Errno> {
        if caller.is_root() {
            return self.dir_attr(path::parent(path).unwrap_or("/"));
        }
        let mut parent = None;
        for dir in directories_above(path) {
            let attr = self.dir_attr(dir)?;
            caller.check(&attr, MAY_EXECUTE)?;
            parent = Some(attr);
        }
        parent.ok_or(Errno::EINVAL)
    }

    /// May `caller` add or remove a name in `path`'s parent (search on the way included)?
    /// Returns the parent's attributes.
    fn check_parent_writable(&self, caller: &Credentials, path: &str) -> Result<Attr, Errno> {
        let parent = self.searched_parent(caller, path)?;
        caller.check(&parent, MAY_WRITE | MAY_EXECUTE)?;
        Ok(parent)
    }

    /// May `caller` remove (or rename away, or replace) the entry `path` names, if any?
    /// Returns its attributes.
    fn check_removable(&self, caller: &Credentials, path: &str) -> Result<Option<Attr>, Errno> {
        let parent = self.check_parent_writable(caller, path)?;
        let victim = self.entry_attr(path)?;
        if let Some(victim) = &victim
            && !caller.may_remove_from(&parent, victim)
        {
            return Err(Errno::EPERM);
        }
        Ok(victim)
    }

    /// Checks a client's `request`, acting for `caller`, before it is executed here; returns
    /// it as it must be executed (a create gets its owner, group and mode; a change of
    /// attributes loses the set-ID bits it must drop).
    pub fn authorize(&self, caller: &Credentials, request: Request) -> Result<Request, Errno> {
        let root = caller.is_root();
        Ok(match request {
            Request::Create(mut create) => {
                let parent = self.searched_parent(caller, &create.path)?;
                if !root {
                    // Only a new entry can come of it (O_EXCL, a directory, a link, a special
                    // file: an existing name fails with EEXIST whatever the permissions): if
                    // the caller may add names to the parent, the name need not be looked up
                    // first (the usual create, mdtest's among them).
                    let new_only =
                        create.exclusive || ringfs_proto::FileKind::from_mode(create.mode) != Some(ringfs_proto::FileKind::Regular);
                    let may_add = caller.check(&parent, MAY_WRITE | MAY_EXECUTE);
                    if !(new_only && may_add.is_ok()) {
                        match self.entry_attr(&create.path)? {
                            // An open of an existing file.
                            Some(existing) if !new_only => {
                                if !existing.is_symlink() {
                                    caller.check(&existing, create.access)?;
                                }
                            }
                            Some(_) => {}
                            None => may_add?,
                        }
                    }
                }
                (create.uid, create.gid, create.mode) = caller.new_entry_owner(&parent, create.mode);
                Request::Create(create)
            }
            Request::Lookup(ref lookup) if !root => {
                self.searched_parent(caller, &lookup.path)?;
                if lookup.access != 0
                    && let Some(attr) = self.entry_attr(&lookup.path)?
                    && !attr.is_symlink()
                {
                    caller.check(&attr, lookup.access)?;
                }
                request
            }
            Request::Unlink(Unlink { ref path, .. }) | Request::Rmdir(Rmdir { ref path, .. }) if !root => {
                self.check_removable(caller, path)?;
                request
            }
            Request::Rename(ref rename) if !root => {
                // Both paths are walked before either name is judged (as Linux looks both up).
                self.searched_parent(caller, &rename.from)?;
                self.searched_parent(caller, &rename.to)?;
                let moved = self.check_removable(caller, &rename.from)?;
                self.check_removable(caller, &rename.to)?;
                // A directory moved to another parent changes its `..`: it must be writable.
                if let Some(moved) = moved
                    && moved.is_dir()
                    && path::parent(&rename.from) != path::parent(&rename.to)
                {
                    caller.check(&moved, MAY_WRITE)?;
                }
                request
            }
            Request::Link(ref link) if !root => {
                self.searched_parent(caller, &link.from)?;
                self.check_parent_writable(caller, &link.to)?;
                request
            }
            Request::LinkFile(ref link) if !root => {
                self.check_parent_writable(caller, &link.to)?;
                request
            }
            Request::ReadDir(ref read) if !root => {
                self.searched_parent(caller, &read.path)?;
                caller.check(&self.dir_attr(&read.path)?, MAY_READ)?;
                request
            }
            Request::SetAttr(set) => {
                let attr = self.node.store.stat(set.file).map_err(store_errno)?;
                Request::SetAttr(caller.authorize_set_attr(&attr, &set)?)
            }
            Request::GetXattr(XattrName { file, ref name, .. }) | Request::RemoveXattr(XattrName { file, ref name, .. }) => {
                let write = matches!(request, Request::RemoveXattr(_));
                caller.check_xattr(&self.node.store.stat(file).map_err(store_errno)?, name, write)?;
                request
            }
            Request::SetXattr(ref set) => {
                caller.check_xattr(&self.node.store.stat(set.file).map_err(store_errno)?, &set.name, true)?;
                request
            }
            other => other,
        })
    }

    /// A directory's mode or owner changed here: every server forgets what it remembered of
    /// it before the change is answered (one that cannot be told forgets it within
    /// [`DIR_ATTRS_TTL`]).
    pub fn spread_dir_attr_change(&self, file: FileId) {
        self.dir_attrs.forget_file(file);
        let _ = self.node.broadcast(&Request::ForgetDirAttrs(ringfs_proto::FileOnly { file }));
    }
}

#[cfg(test)]
mod tests {
    use super::directories_above;

    #[test]
    fn directories_above_a_path() {
        assert_eq!(directories_above("/a/b/c").collect::<Vec<_>>(), ["/", "/a", "/a/b"]);
        assert_eq!(directories_above("/a").collect::<Vec<_>>(), ["/"]);
    }
}
