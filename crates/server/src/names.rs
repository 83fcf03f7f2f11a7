//! Operations on names that may involve other servers, run by the server that owns the name.
//!
//! - **Parent checks.** A create succeeds only under an existing directory. The owner of the
//!   new name asks the owner of the parent once and then remembers the answer in its store's
//!   known-directories cache; rmdir and directory renames make every server forget.
//! - **Create, lookup.** A new file's inode is made beside its name (its anchor is the
//!   placement hash of the path). For an existing name whose file lives elsewhere (renamed or
//!   linked), the file's server is asked for its attributes.
//! - **Unlink, rmdir.** The name goes here; the file's server is told it has one name fewer
//!   (it goes when it has neither names nor opens).
//! - **Link.** The file gets one more name: its link count first, then the new name.
//! - **Rename of a file.** Both names are locked (in path order, at their servers); the new
//!   name is made to refer to the file, replacing what it named (whose file loses a name),
//!   then the old name goes. From the moment the new name is installed it shows the whole
//!   file: no data moves. Directories are renamed by `directory_rename`.

use parking_lot::Mutex;
use std::sync::Arc;

use ringfs_proto::path;
use ringfs_proto::{
    Create, EntryRef, Errno, FileId, InstallEntry, InstallMode, NameCount, NameLock, Opened, PathOnly, RemoveEntry, RenameToken, Request,
    Response,
};
use ringfs_rpc::memory::fast_random_u64;
use ringfs_store::{Cut, StoreError};

use crate::deadline::past_request_deadline;
use crate::dir_times::DirTimes;
use crate::files::Files;
use crate::gate::{GatePass, NamespaceGate};
use crate::name_locks::{Coordinator, NameHold, NameLocks, new_token};
use crate::node::{MAX_CHUNK_SIZE, Node, store_errno};
use crate::opens::OpenRegistry;
use crate::permissions::Permissions;

/// A create or install retries after resolving its parent at most this often. Each retry
/// needs a directory of the same index shard forgotten meanwhile (an rmdir or a directory
/// rename anywhere near), so under a storm of those a few tries are not enough: after the
/// first ones, tries back off by a millisecond more each time (about 2 s in all).
const PARENT_ATTEMPTS: u64 = 64;

/// A release that failed (its server was cut off or stopped), to be tried again until the
/// lease of what it releases ends.
pub struct LaterRelease {
    what: Release,
    until: std::time::Instant,
}

/// What a [`LaterRelease`] gives back; each is harmless to repeat.
pub enum Release {
    /// A name lock, at the name's server.
    Name { path: String, token: RenameToken },
    /// The namespace lock, at the first server of the ring.
    NamespaceLock { token: RenameToken },
    /// A directory rename's freeze, on every server.
    Thaw(ringfs_proto::Subtree),
}

/// A rename whose two names are locked for `token`: what each name referred to when locked
/// (`source` at `from`, `target` at `to`), its time and `renameat2` flags.
pub struct LockedRename<'a> {
    pub from: &'a str,
    pub to: &'a str,
    pub source: Option<EntryRef>,
    pub target: Option<EntryRef>,
    pub time_ns: i64,
    pub flags: u32,
    pub token: RenameToken,
}

/// The names this server holds: their creation, lookup and removal, their locks, and the
/// steps of renames and links that other servers' coordinators ask of them.
pub struct Names {
    node: Arc<Node>,
    locks: NameLocks,
    pub gate: Arc<NamespaceGate>,
    /// Name-lock releases that failed and are tried again.
    later_releases: Mutex<Vec<LaterRelease>>,
    files: Arc<Files>,
    dir_times: Arc<DirTimes>,
    opens: Arc<OpenRegistry>,
    permissions: Arc<Permissions>,
}

impl Names {
    pub fn new(
        node: Arc<Node>,
        gate: Arc<NamespaceGate>,
        files: Arc<Files>,
        dir_times: Arc<DirTimes>,
        opens: Arc<OpenRegistry>,
        permissions: Arc<Permissions>,
    ) -> Names {
        Names { node, locks: NameLocks::default(), gate, later_releases: Mutex::new(Vec::new()), files, dir_times, opens, permissions }
    }

    /// The name locks of this server (a directory rename's freeze asks them what is under way).
    pub fn locks(&self) -> &NameLocks {
        &self.locks
    }

    /// `ReadDir`: a page of the names this server holds in a directory.
    pub fn read_dir(&self, read: &ringfs_proto::ReadDir) -> Result<Response, Errno> {
        let _pass = self.gate.pass(&[&read.path], RenameToken::NONE)?;
        Ok(Response::DirPage(self.node.store.read_dir(&read.path, read.after.as_deref(), read.limit.clamp(1, 10_000) as usize)))
    }

    /// `LookupDir`: whether `path` (held here) is a directory (a create's parent check).
    pub fn lookup_dir(&self, path: &str) -> Result<Response, Errno> {
        let _pass = self.gate.pass(&[path], RenameToken::NONE)?;
        let entry = self.node.store.lookup_dir(path, self.node.anchor_of(path)).map_err(store_errno)?;
        Ok(Response::Replaced(Some(entry)))
    }

    /// `PrepareRmdir`: forgets directory `path` (and below) here, and answers whether a name
    /// inside it is held here.
    pub fn prepare_rmdir(&self, path: &str) -> Result<Response, Errno> {
        self.permissions.forget_under(path);
        self.dir_times.forget_under(path);
        let (any, removed) = self.node.store.prepare_rmdir(path);
        Ok(Response::HasEntries(ringfs_proto::HasEntries { any, removed }))
    }

    /// `RemoveEntry`: a rename's step removing its old name, if it still names `expect`.
    pub fn remove_entry(&self, remove: &RemoveEntry) -> Result<Response, Errno> {
        let _entered = self.enter_name(&remove.path, remove.token)?;
        let removed = self.node.store.remove_entry(&remove.path, remove.expect).map_err(store_errno)?;
        Ok(Response::Count(removed as u64))
    }

    /// Makes sure the store knows `dir` exists, asking its owner if needed.
    pub fn resolve_parent(&self, dir: &str) -> Result<(), Errno> {
        let Err(ticket) = self.node.store.known_dir(dir) else { return Ok(()) };
        let owner = self.node.owner_of_path(dir);
        match self.node.ask(&owner, Request::LookupDir(PathOnly { path: dir.to_string() }))? {
            Response::Replaced(Some(entry)) if entry.is_dir() => {}
            _ => return Err(Errno::ENOTDIR),
        }
        self.node.store.mark_known_dir(dir, ticket);
        Ok(())
    }

    /// Runs a store operation that needs a known parent, resolving the parent when asked.
    pub fn with_parent<T>(&self, mut operation: impl FnMut() -> Result<T, StoreError>) -> Result<T, StoreError> {
        for attempt in 0..PARENT_ATTEMPTS {
            match operation() {
                Err(StoreError::ParentUnknown(parent)) => self.resolve_parent(&parent).map_err(StoreError::Fs)?,
                other => return other,
            }
            if attempt >= 4 {
                crate::sched::pause(std::time::Duration::from_millis(attempt - 3));
            }
        }
        log::warn!("could not learn a parent directory while directories around it keep changing");
        Err(StoreError::Fs(Errno::EBUSY))
    }

    /// Enters the name `path` for one local step: an ordinary operation (`token` 0) holds
    /// the name, waiting while a rename or link holds it; a rename's own step (its `token`)
    /// waits for other holders. Then the gate pass. Never waits while holding the pass (see
    /// `locks`).
    pub fn enter_name(&self, path: &str, token: RenameToken) -> Result<(Option<NameHold<'_>>, GatePass<'_>), Errno> {
        let hold = if token.is_none() {
            Some(self.locks.hold(path)?)
        } else {
            self.locks.admit_step(path, token)?;
            None
        };
        let pass = self.gate.pass(&[path], token)?;
        Ok((hold, pass))
    }

    pub fn create(&self, create: Create) -> Result<Response, Errno> {
        if create.chunk_size == 0 || create.chunk_size > MAX_CHUNK_SIZE {
            return Err(Errno::EINVAL);
        }
        if let Some(target) = &create.link_target
            && (target.is_empty() || target.len() > path::MAX_CALL_PATH_BYTES)
        {
            return Err(if target.is_empty() { Errno::EINVAL } else { Errno::ENAMETOOLONG });
        }
        let new_file = FileId { anchor: self.node.anchor_of(&create.path), serial: fast_random_u64() | 1 };
        // A name still being removed (EAGAIN from the store) is waited for here, with the name
        // and the gate pass given back, then the create tried again; about 2 s at most.
        let mut attempts = 0;
        let outcome = loop {
            let attempt = self.with_parent(|| {
                let _entered = self.enter_name(&create.path, RenameToken::NONE).map_err(StoreError::Fs)?;
                if past_request_deadline() {
                    return Err(StoreError::Fs(Errno::ETIMEDOUT));
                }
                self.node.store.create(&create, new_file)
            });
            match attempt {
                Err(StoreError::NameBeingRemoved) if attempts < 2000 => {
                    attempts += 1;
                    crate::sched::pause(std::time::Duration::from_millis(1));
                }
                Err(StoreError::NameBeingRemoved) => return Err(Errno::EBUSY),
                other => break other.map_err(store_errno)?,
            }
        };
        if outcome.created {
            let directory = ringfs_proto::FileKind::from_mode(create.mode) == Some(ringfs_proto::FileKind::Directory);
            self.dir_times.touch_parent_counting(&create.path, create.time_ns, i32::from(directory));
        }
        let file = outcome.entry.file;
        let (attr, registered) = match outcome.attr {
            Some(attr) => {
                let registered = create.open_for != 0 && attr.is_regular();
                if registered {
                    self.opens.opened(create.open_for, file);
                }
                if outcome.truncated {
                    self.files.truncated(file);
                    // The open stands even if a server of the file's later chunks does not
                    // answer: the cut is finished when it does.
                    let _ = self.files.cut_later_chunks(file, Cut { len: 0, time_ns: create.time_ns }, attr.last_chunk, false);
                }
                (attr, registered)
            }
            // An existing file that lives on another server (renamed or linked here).
            None if create.truncate => {
                match self.node.ask_home(file, Request::Truncate(ringfs_proto::Truncate { file, size: 0, time_ns: create.time_ns }))? {
                    Response::Attr(attr) => (attr, false),
                    _ => return Err(Errno::EPROTO),
                }
            }
            None => (self.node.stat_file(file)?, false),
        };
        Ok(Response::Opened(Opened { attr, registered }))
    }

    pub fn lookup(&self, path: &str, open_for: u64) -> Result<Response, Errno> {
        let (entry, attr) = {
            let _pass = self.gate.pass(&[path], RenameToken::NONE)?;
            self.node.store.lookup(path, self.node.anchor_of(path), open_for != 0).map_err(store_errno)?
        };
        match attr {
            Some(attr) => {
                let registered = open_for != 0 && attr.is_regular();
                if registered {
                    self.opens.opened(open_for, entry.file);
                }
                Ok(Response::Opened(Opened { attr, registered }))
            }
            None => Ok(Response::Opened(Opened { attr: self.node.stat_file(entry.file)?, registered: false })),
        }
    }

    pub fn unlink(&self, path: &str, time_ns: i64) -> Result<Response, Errno> {
        if self.node.in_cached_tree(path) {
            let found = {
                let _pass = self.gate.pass(&[path], RenameToken::NONE)?;
                self.node.store.lookup(path, self.node.anchor_of(path), false).map_err(store_errno)?.0
            };
            if !found.is_dir() {
                self.files.keep_backend_bytes_if_still_needed(found.file)?;
            }
        }
        let entry = {
            let _entered = self.enter_name(path, RenameToken::NONE)?;
            if past_request_deadline() {
                return Err(Errno::ETIMEDOUT);
            }
            self.node.store.unlink(path, self.node.anchor_of(path), None).map_err(store_errno)?
        };
        self.dir_times.touch_parent(path, time_ns);
        self.files.drop_link(entry.file, time_ns, Some(path))?;
        Ok(Response::Done)
    }

    pub fn rmdir(&self, path: &str, time_ns: i64) -> Result<Response, Errno> {
        // Held until the end: a directory rename into this directory (which locks its target's
        // parent) waits, then finds it gone, instead of moving names into it while the other
        // servers are asked whether it is empty.
        let _hold = self.locks.hold_across_servers(path)?;
        if past_request_deadline() {
            return Err(Errno::ETIMEDOUT);
        }
        let directory = {
            let _pass = self.gate.pass(&[path], RenameToken::NONE)?;
            self.node.store.begin_rmdir(path, self.node.anchor_of(path)).map_err(store_errno)?
        };
        let outcome = self.check_empty(path);
        let finished = {
            let _pass = self.gate.pass(&[path], RenameToken::NONE)?;
            self.node.store.finish_rmdir(path, outcome.is_ok()).map_err(store_errno)
        };
        outcome?;
        finished?;
        self.dir_times.touch_parent_counting(path, time_ns, -1);
        self.files.drop_link(directory.file, time_ns, None)?;
        Ok(Response::Done)
    }

    /// Asks every server to forget `dir` and whether it holds a name inside it: `Ok` if none
    /// does (nor, in cache mode, the backend directory), ENOTEMPTY otherwise, or the error of
    /// a server that could not answer (it might hold names: refuse rather than orphan them).
    pub fn check_empty(&self, dir: &str) -> Result<(), Errno> {
        let answers = self.node.broadcast(&Request::PrepareRmdir(PathOnly { path: dir.to_string() }));
        let mut outcome = Ok(());
        let mut removed = std::collections::HashSet::new();
        for answer in answers {
            match answer {
                Ok(Response::HasEntries(has)) if !has.any => removed.extend(has.removed),
                Ok(Response::HasEntries(_)) => outcome = Err(Errno::ENOTEMPTY),
                Ok(_) => outcome = Err(Errno::EPROTO),
                Err(errno) => outcome = outcome.and(Err(errno)),
            }
        }
        if outcome.is_ok() {
            // Cache mode: entries only the backend has count too, unless removed in ringfs.
            match self.node.store.backend_names(dir) {
                Ok(names) if names.iter().any(|name| !removed.contains(name)) => outcome = Err(Errno::ENOTEMPTY),
                Ok(_) => {}
                Err(error) => outcome = Err(store_errno(error)),
            }
        }
        outcome
    }

    /// Takes (or gives back) the lock of a name held here; taking it answers what the name
    /// refers to now. `peer`: the asking server's host and process id (`None`: this server).
    pub fn name_lock(&self, path: &str, token: RenameToken, acquire: bool, peer: Option<(u64, u32)>) -> Result<Response, Errno> {
        if !acquire {
            self.locks.release(path, token);
            return Ok(Response::Done);
        }
        self.locks.acquire(path, token, self.coordinator_of(peer))?;
        let _pass = self.gate.pass(&[path], token).inspect_err(|_| self.locks.release(path, token))?;
        let current = match self.node.store.lookup(path, self.node.anchor_of(path), false) {
            Ok((entry, _)) => Some(entry),
            Err(error) if error.errno() == Errno::ENOENT => None,
            Err(error) => {
                self.locks.release(path, token);
                return Err(store_errno(error));
            }
        };
        Ok(Response::Replaced(current))
    }

    /// Locks the names `paths` for `token`, in path order; answers what each refers to (in
    /// the order given). On failure the locks taken are given back.
    pub fn lock_names(&self, paths: &[&str], token: RenameToken) -> Result<Vec<Option<EntryRef>>, Errno> {
        let mut order: Vec<usize> = (0..paths.len()).collect();
        order.sort_by(|a, b| paths[*a].cmp(paths[*b]));
        order.dedup_by(|a, b| paths[*a] == paths[*b]);
        let mut current = vec![None; paths.len()];
        let mut taken = Vec::new();
        for index in order {
            let request = Request::NameLock(NameLock { path: paths[index].to_string(), token, acquire: true });
            match self.node.ask(&self.node.owner_of_path(paths[index]), request) {
                Ok(Response::Replaced(entry)) => {
                    current[index] = entry;
                    taken.push(paths[index]);
                }
                outcome => {
                    // The lock may have been taken even so (only its answer was lost): give it
                    // back too.
                    taken.push(paths[index]);
                    self.unlock_names(&taken, token);
                    return Err(outcome.err().unwrap_or(Errno::EPROTO));
                }
            }
        }
        if past_request_deadline() {
            // The client has given up: the change these locks are for must not begin now.
            self.unlock_names(&taken, token);
            return Err(Errno::ETIMEDOUT);
        }
        for (index, path) in paths.iter().enumerate() {
            if current[index].is_none()
                && let Some(first) = paths.iter().position(|other| other == path)
            {
                current[index] = current[first];
            }
        }
        Ok(current)
    }

    /// Gives back the name locks of `token`. A release that fails (its server is cut off or
    /// stopped) is tried again in the background until it succeeds or the lock's lease ends,
    /// so a name is not kept locked for a whole lease after a short fault.
    pub fn unlock_names(&self, paths: &[&str], token: RenameToken) {
        for path in paths {
            if let Err(errno) = self.release_name(path, token) {
                log::info!("could not release the lock of {path} yet: {errno} (trying again)");
                self.release_later(Release::Name { path: path.to_string(), token });
            }
        }
    }

    fn release_name(&self, path: &str, token: RenameToken) -> Result<(), Errno> {
        let request = Request::NameLock(NameLock { path: path.to_string(), token, acquire: false });
        self.node.ask(&self.node.owner_of_path(path), request).map(drop)
    }

    /// Queues a release that failed, to be tried again by [`Names::retry_releases`].
    pub fn release_later(&self, what: Release) {
        let until = crate::sched::now() + crate::name_locks::LEASE;
        self.later_releases.lock().push(LaterRelease { what, until });
    }

    /// Releases the name locks of renames and links coordinated by a server that is back as
    /// a new process since (called every heartbeat interval).
    pub fn release_locks_of_restarted_servers(&self) {
        let membership = self.node.membership();
        let restarted =
            |coordinator: &Coordinator| membership.member(&coordinator.name).is_some_and(|member| member.pid != coordinator.pid);
        let released = self.locks.release_locks_of(restarted);
        if released > 0 {
            log::info!("{released} name locks of renames whose server restarted are released");
        }
    }

    /// The server process a request comes from, if the member list knows it (`peer`: its
    /// host id and process id).
    fn coordinator_of(&self, peer: Option<(u64, u32)>) -> Option<Coordinator> {
        let (host_id, pid) = peer?;
        let membership = self.node.membership();
        let member = membership.list().members.iter().find(|member| member.host_id == host_id && member.pid == pid)?;
        Some(Coordinator { name: member.name.clone(), pid })
    }

    /// Tries again the releases that failed (called every heartbeat interval).
    pub fn retry_releases(&self) {
        let waiting = std::mem::take(&mut *self.later_releases.lock());
        let now = crate::sched::now();
        let still: Vec<LaterRelease> = waiting
            .into_iter()
            .filter(|release| {
                release.until > now
                    && match &release.what {
                        Release::Name { path, token } => self.release_name(path, *token).is_err(),
                        Release::NamespaceLock { token } => self.namespace_lock_at_first(*token, false).is_err(),
                        Release::Thaw(subtree) => self.node.broadcast(&Request::Thaw(subtree.clone())).iter().any(Result::is_err),
                    }
            })
            .collect();
        self.later_releases.lock().extend(still);
    }

    /// Takes or gives back, for `token`, the namespace lock held by the first server of the
    /// ring (see `directory_rename`).
    pub fn namespace_lock_at_first(&self, token: RenameToken, acquire: bool) -> Result<(), Errno> {
        let first = self.node.membership().first_in_ring().clone();
        self.node.ask(&first, Request::NamespaceLock(ringfs_proto::NamespaceLock { token, acquire })).map(drop)
    }

    /// Makes `path` (held here) refer to a file, for a rename or a link.
    pub fn install_entry(&self, install: InstallEntry) -> Result<Response, Errno> {
        let replaced = self
            .with_parent(|| {
                let _entered = self.enter_name(&install.path, install.token).map_err(StoreError::Fs)?;
                self.node.store.install_entry(&install.path, install.entry, install.mode, install.expect, install.replace_empty_dir)
            })
            .map_err(store_errno)?;
        Ok(Response::Replaced(replaced))
    }

    /// Installs `entry` at `path` at the path's server; what was there.
    pub fn install_at(
        &self,
        path: &str,
        entry: EntryRef,
        mode: u8,
        expect: FileId,
        replace_empty_dir: bool,
        token: RenameToken,
    ) -> Result<Option<EntryRef>, Errno> {
        let install = InstallEntry { path: path.to_string(), entry, mode, expect, replace_empty_dir, token };
        match self.node.ask(&self.node.owner_of_path(path), Request::InstallEntry(install))? {
            Response::Replaced(replaced) => Ok(replaced),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Removes `path` at the path's server if it still refers to `expect`; whether it did.
    pub fn remove_at(&self, path: &str, expect: FileId, token: RenameToken) -> Result<bool, Errno> {
        let request = Request::RemoveEntry(RemoveEntry { path: path.to_string(), expect, token });
        match self.node.ask(&self.node.owner_of_path(path), request)? {
            Response::Count(removed) => Ok(removed > 0),
            _ => Err(Errno::EPROTO),
        }
    }

    /// A hard link: `to` becomes another name of the file `from` names.
    pub fn link(&self, from: &str, to: &str, time_ns: i64) -> Result<Response, Errno> {
        if from == "/" || to == "/" {
            return Err(Errno::EEXIST);
        }
        let token = new_token();
        log::trace!("link {from} -> {to} is {token:x}");
        let entries = self.lock_names(&[from, to], token)?;
        let outcome = (|| {
            let entry = entries[0].ok_or(Errno::ENOENT)?;
            if entry.is_dir() {
                return Err(Errno::EPERM);
            }
            if entries[1].is_some() {
                return Err(Errno::EEXIST);
            }
            match self.node.ask_home(entry.file, Request::AddLink(self.name_count(entry.file, time_ns, to)))? {
                Response::Attr(_) => {}
                _ => return Err(Errno::EPROTO),
            }
            if let Err(errno) = self.install_at(to, entry, InstallMode::NO_REPLACE, FileId::default(), false, token) {
                self.undo_link_count(entry.file, to, errno, time_ns);
                return Err(errno);
            }
            Ok(Response::Done)
        })();
        self.unlock_names(&[from, to], token);
        if outcome.is_ok() {
            self.dir_times.touch_parent(to, time_ns);
        }
        outcome
    }

    /// A new name `to` for `file`, known by id (not by a name, which may be gone: the kernel
    /// links the inode it holds). Fails like link(2): ENOENT for a file with no name left,
    /// EPERM for a directory, EEXIST for a taken name.
    pub fn link_file(&self, file: FileId, to: &str, time_ns: i64) -> Result<Response, Errno> {
        if to == "/" {
            return Err(Errno::EEXIST);
        }
        let token = new_token();
        let entries = self.lock_names(&[to], token)?;
        let outcome = (|| {
            if entries[0].is_some() {
                return Err(Errno::EEXIST);
            }
            let attr = match self.node.ask_home(file, Request::AddLink(self.name_count(file, time_ns, to)))? {
                Response::Attr(attr) => attr,
                _ => return Err(Errno::EPROTO),
            };
            let kind = attr.kind().ok_or(Errno::EPROTO)?;
            if let Err(errno) = self.install_at(to, EntryRef::new(file, kind), InstallMode::NO_REPLACE, FileId::default(), false, token) {
                self.undo_link_count(file, to, errno, time_ns);
                return Err(errno);
            }
            Ok(Response::Done)
        })();
        self.unlock_names(&[to], token);
        if outcome.is_ok() {
            self.dir_times.touch_parent(to, time_ns);
        }
        outcome
    }

    /// A link's new name failed with `errno`: its count is given back if the name surely did
    /// not appear. After EIO or ETIMEDOUT it may have (only the answer was lost): the count
    /// stays, as taking it back would leave the name with a link too few (removing the other
    /// name would then free the file under it).
    fn undo_link_count(&self, file: FileId, to: &str, errno: Errno, time_ns: i64) {
        if matches!(errno, Errno::EIO | Errno::ETIMEDOUT) {
            log::warn!("link to {to} failed ({errno}) and may have happened: the file keeps the link counted for it");
        } else if let Err(undo) = self.files.drop_link(file, time_ns, Some(to)) {
            log::warn!("could not undo the link count of file {file}: {undo}");
        }
    }

    /// A change of `file`'s name count for the new name `name`, which the backend gets as a
    /// link when it lies in the cached tree.
    fn name_count(&self, file: FileId, time_ns: i64, name: &str) -> NameCount {
        NameCount { file, time_ns, name: self.node.in_cached_tree(name).then(|| name.to_string()) }
    }

    /// Sets a file's change time (a rename changes it).
    pub fn touch_ctime(&self, file: FileId, time_ns: i64) -> Result<(), Errno> {
        self.node.ask_home(file, Request::SetAttr(ringfs_proto::SetAttr::new(file, time_ns))).map(drop)
    }
}
