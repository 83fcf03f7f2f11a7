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

use ringfs_proto::path;
use ringfs_proto::{
    Create, EntryRef, Errno, FileId, InstallEntry, InstallMode, NameCount, NameLock, Opened, PathOnly, RemoveEntry, Rename, RenameFlags,
    Request, Response,
};
use ringfs_rpc::memory::fast_random_u64;
use ringfs_store::StoreError;

use crate::locks::past_request_deadline;
use crate::locks::{GatePass, NameHold};
use crate::service::{MAX_CHUNK_SIZE, ServerState, store_errno};

/// A create or install retries after resolving its parent at most this often. Each retry
/// needs a directory of the same index shard forgotten meanwhile (an rmdir or a directory
/// rename anywhere near), so under a storm of those a few tries are not enough: after the
/// first ones, tries back off by a millisecond more each time (about 2 s in all).
const PARENT_ATTEMPTS: u64 = 64;

/// Runs an idempotent step again while it fails with EIO (its answer may have been lost, or
/// its server cut off for a moment), for about two seconds.
fn retry_uncertain<T>(step: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
    retry_uncertain_for(std::time::Duration::from_secs(2), step)
}

/// [`retry_uncertain`] for up to `limit`.
pub(crate) fn retry_uncertain_for<T>(limit: std::time::Duration, mut step: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
    let deadline = std::time::Instant::now() + limit;
    let mut pause = std::time::Duration::from_millis(20);
    loop {
        match step() {
            Err(Errno::EIO) if std::time::Instant::now() + pause < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(500));
            }
            outcome => return outcome,
        }
    }
}

/// A release that failed (its server was cut off or stopped), to be tried again until the
/// lease of what it releases ends.
pub struct LaterRelease {
    what: Release,
    until: std::time::Instant,
}

/// What a [`LaterRelease`] gives back; each is harmless to repeat.
pub enum Release {
    /// A name lock, at the name's server.
    Name { path: String, token: u64 },
    /// The namespace lock, at the first server of the ring.
    NamespaceLock { token: u64 },
    /// A directory rename's freeze, on every server.
    Thaw(ringfs_proto::Subtree),
}

/// A rename whose two names are locked for `token`: what each name referred to when locked
/// (`source` at `from`, `target` at `to`), its time and `renameat2` flags.
pub(crate) struct LockedRename<'a> {
    pub from: &'a str,
    pub to: &'a str,
    pub source: Option<EntryRef>,
    pub target: Option<EntryRef>,
    pub time_ns: i64,
    pub flags: u32,
    pub token: u64,
}

/// Draws the token of a rename or link (its locks and steps carry it).
pub fn new_token() -> u64 {
    fast_random_u64() | 1
}

impl ServerState {
    /// Makes sure the store knows `dir` exists, asking its owner if needed.
    pub(crate) fn resolve_parent(&self, dir: &str) -> Result<(), Errno> {
        let Err(ticket) = self.store.known_dir(dir) else { return Ok(()) };
        let owner = self.owner_of_path(dir);
        match self.ask(&owner, Request::LookupDir(PathOnly { path: dir.to_string() }))? {
            Response::Replaced(Some(entry)) if entry.is_dir() => {}
            _ => return Err(Errno::ENOTDIR),
        }
        self.store.mark_known_dir(dir, ticket);
        Ok(())
    }

    /// Runs a store operation that needs a known parent, resolving the parent when asked.
    pub(crate) fn with_parent<T>(&self, mut operation: impl FnMut() -> Result<T, StoreError>) -> Result<T, Errno> {
        for attempt in 0..PARENT_ATTEMPTS {
            match operation() {
                Err(StoreError::ParentUnknown(parent)) => self.resolve_parent(&parent)?,
                other => return other.map_err(store_errno),
            }
            if attempt >= 4 {
                std::thread::sleep(std::time::Duration::from_millis(attempt - 3));
            }
        }
        log::warn!("could not learn a parent directory while directories around it keep changing");
        Err(Errno::EBUSY)
    }

    /// Enters the name `path` for one local step: an ordinary operation (`token` 0) holds
    /// the name, waiting while a rename or link holds it; a rename's own step (its `token`)
    /// waits for other holders. Then the gate pass. Never waits while holding the pass (see
    /// `locks`).
    pub(crate) fn enter_name(&self, path: &str, token: u64) -> Result<(Option<NameHold<'_>>, GatePass<'_>), Errno> {
        let hold = if token == 0 {
            Some(self.name_locks.hold(path)?)
        } else {
            self.name_locks.admit_step(path, token)?;
            None
        };
        let pass = self.gate.pass(&[path], token)?;
        Ok((hold, pass))
    }

    /// The attributes of `file`, from its inode's server.
    pub(crate) fn stat_file(&self, file: FileId) -> Result<ringfs_proto::Attr, Errno> {
        let home = self.owner_of_chunk(ringfs_proto::ChunkKey::inode(file));
        match self.ask(&home, Request::Stat(ringfs_proto::FileOnly { file }))? {
            Response::Attr(attr) => Ok(attr),
            _ => Err(Errno::EPROTO),
        }
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
        let new_file = FileId { anchor: self.anchor_of(&create.path), serial: fast_random_u64() | 1 };
        // A name still being removed (EAGAIN from the store) is waited for here, with the name
        // and the gate pass given back, then the create tried again; about 2 s at most.
        let mut attempts = 0;
        let outcome = loop {
            let attempt = self.with_parent(|| {
                let _entered = self.enter_name(&create.path, 0).map_err(StoreError::Fs)?;
                if past_request_deadline() {
                    return Err(StoreError::Fs(Errno::ETIMEDOUT));
                }
                self.store.create(&create, new_file)
            });
            match attempt {
                Err(Errno::EAGAIN) if attempts < 2000 => {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(Errno::EAGAIN) => return Err(Errno::EBUSY),
                other => break other?,
            }
        };
        if outcome.created {
            let directory = ringfs_proto::FileKind::from_mode(create.mode) == Some(ringfs_proto::FileKind::Directory);
            self.touch_parent_counting(&create.path, create.time_ns, i32::from(directory));
        }
        let file = outcome.entry.file;
        let (attr, registered) = match outcome.attr {
            Some(attr) => {
                let registered = create.open_for != 0 && attr.is_regular();
                if registered {
                    self.opens.opened(create.open_for, file);
                }
                if outcome.truncated {
                    if attr.is_extended() {
                        self.remove_chunks_everywhere(file, 1);
                    }
                    self.store.cut_backend_file(file, 0).map_err(store_errno)?;
                }
                (attr, registered)
            }
            // An existing file that lives on another server (renamed or linked here).
            None if create.truncate => {
                match self.ask_home(file, Request::Truncate(ringfs_proto::Truncate { file, size: 0, time_ns: create.time_ns }))? {
                    Response::Attr(attr) => (attr, false),
                    _ => return Err(Errno::EPROTO),
                }
            }
            None => (self.stat_file(file)?, false),
        };
        Ok(Response::Opened(Opened { attr, registered }))
    }

    /// Sends `request` to the server of `file`'s inode.
    pub(crate) fn ask_home(&self, file: FileId, request: Request) -> Result<Response, Errno> {
        let home = self.owner_of_chunk(ringfs_proto::ChunkKey::inode(file));
        self.ask(&home, request)
    }

    pub fn lookup(&self, path: &str, open_for: u64) -> Result<Response, Errno> {
        let (entry, attr) = {
            let _pass = self.gate.pass(&[path], 0)?;
            self.store.lookup(path, self.anchor_of(path), open_for != 0).map_err(store_errno)?
        };
        match attr {
            Some(attr) => {
                let registered = open_for != 0 && attr.is_regular();
                if registered {
                    self.opens.opened(open_for, entry.file);
                }
                Ok(Response::Opened(Opened { attr, registered }))
            }
            None => Ok(Response::Opened(Opened { attr: self.stat_file(entry.file)?, registered: false })),
        }
    }

    pub fn unlink(&self, path: &str, time_ns: i64) -> Result<Response, Errno> {
        if self.in_cached_tree(path) {
            let found = {
                let _pass = self.gate.pass(&[path], 0)?;
                self.store.lookup(path, self.anchor_of(path), false).map_err(store_errno)?.0
            };
            if !found.is_dir() {
                self.keep_backend_bytes_if_still_needed(found.file)?;
            }
        }
        let entry = {
            let _entered = self.enter_name(path, 0)?;
            if past_request_deadline() {
                return Err(Errno::ETIMEDOUT);
            }
            self.store.unlink(path, self.anchor_of(path), None).map_err(store_errno)?
        };
        self.touch_parent(path, time_ns);
        self.drop_link(entry.file, time_ns, Some(path))?;
        Ok(Response::Done)
    }

    pub fn rmdir(&self, path: &str, time_ns: i64) -> Result<Response, Errno> {
        // Held until the end: a directory rename into this directory (which locks its target's
        // parent) waits, then finds it gone, instead of moving names into it while the other
        // servers are asked whether it is empty.
        let _hold = self.name_locks.hold_across_servers(path)?;
        if past_request_deadline() {
            return Err(Errno::ETIMEDOUT);
        }
        let directory = {
            let _pass = self.gate.pass(&[path], 0)?;
            self.store.begin_rmdir(path, self.anchor_of(path)).map_err(store_errno)?
        };
        let outcome = self.check_empty(path);
        let finished = {
            let _pass = self.gate.pass(&[path], 0)?;
            self.store.finish_rmdir(path, outcome.is_ok()).map_err(store_errno)
        };
        outcome?;
        finished?;
        self.touch_parent_counting(path, time_ns, -1);
        self.drop_link(directory.file, time_ns, None)?;
        Ok(Response::Done)
    }

    /// Asks every server to forget `dir` and whether it holds a name inside it: `Ok` if none
    /// does (nor, in cache mode, the backend directory), ENOTEMPTY otherwise, or the error of
    /// a server that could not answer (it might hold names: refuse rather than orphan them).
    pub(crate) fn check_empty(&self, dir: &str) -> Result<(), Errno> {
        let answers = self.broadcast(&Request::PrepareRmdir(PathOnly { path: dir.to_string() }));
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
            match self.store.backend_names(dir) {
                Ok(names) if names.iter().any(|name| !removed.contains(name)) => outcome = Err(Errno::ENOTEMPTY),
                Ok(_) => {}
                Err(error) => outcome = Err(store_errno(error)),
            }
        }
        outcome
    }

    /// Takes (or gives back) the lock of a name held here; taking it answers what the name
    /// refers to now.
    pub fn name_lock(&self, path: &str, token: u64, acquire: bool) -> Result<Response, Errno> {
        if !acquire {
            self.name_locks.release(path, token);
            return Ok(Response::Done);
        }
        self.name_locks.acquire(path, token)?;
        let _pass = self.gate.pass(&[path], token).inspect_err(|_| self.name_locks.release(path, token))?;
        let current = match self.store.lookup(path, self.anchor_of(path), false) {
            Ok((entry, _)) => Some(entry),
            Err(error) if error.errno() == Errno::ENOENT => None,
            Err(error) => {
                self.name_locks.release(path, token);
                return Err(store_errno(error));
            }
        };
        Ok(Response::Replaced(current))
    }

    /// Locks the names `paths` for `token`, in path order; answers what each refers to (in
    /// the order given). On failure the locks taken are given back.
    pub(crate) fn lock_names(&self, paths: &[&str], token: u64) -> Result<Vec<Option<EntryRef>>, Errno> {
        let mut order: Vec<usize> = (0..paths.len()).collect();
        order.sort_by(|a, b| paths[*a].cmp(paths[*b]));
        order.dedup_by(|a, b| paths[*a] == paths[*b]);
        let mut current = vec![None; paths.len()];
        let mut taken = Vec::new();
        for index in order {
            let request = Request::NameLock(NameLock { path: paths[index].to_string(), token, acquire: true });
            match self.ask(&self.owner_of_path(paths[index]), request) {
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
    pub(crate) fn unlock_names(&self, paths: &[&str], token: u64) {
        for path in paths {
            if let Err(errno) = self.release_name(path, token) {
                log::info!("could not release the lock of {path} yet: {errno} (trying again)");
                self.release_later(Release::Name { path: path.to_string(), token });
            }
        }
    }

    fn release_name(&self, path: &str, token: u64) -> Result<(), Errno> {
        let request = Request::NameLock(NameLock { path: path.to_string(), token, acquire: false });
        self.ask(&self.owner_of_path(path), request).map(drop)
    }

    /// Queues a release that failed, to be tried again by [`ServerState::retry_releases`].
    pub(crate) fn release_later(&self, what: Release) {
        let until = std::time::Instant::now() + crate::locks::LEASE;
        self.later_releases.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(LaterRelease { what, until });
    }

    /// Tries again the releases that failed (called every heartbeat interval).
    pub(crate) fn retry_releases(&self) {
        let waiting = std::mem::take(&mut *self.later_releases.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
        let now = std::time::Instant::now();
        let still: Vec<LaterRelease> = waiting
            .into_iter()
            .filter(|release| {
                release.until > now
                    && match &release.what {
                        Release::Name { path, token } => self.release_name(path, *token).is_err(),
                        Release::NamespaceLock { token } => self.namespace_lock_at_first(*token, false).is_err(),
                        Release::Thaw(subtree) => self.broadcast(&Request::Thaw(subtree.clone())).iter().any(Result::is_err),
                    }
            })
            .collect();
        self.later_releases.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).extend(still);
    }

    /// Makes `path` (held here) refer to a file, for a rename or a link.
    pub fn install_entry(&self, install: InstallEntry) -> Result<Response, Errno> {
        let replaced = self.with_parent(|| {
            let _entered = self.enter_name(&install.path, install.token).map_err(StoreError::Fs)?;
            self.store.install_entry(&install.path, install.entry, install.mode, install.expect, install.replace_empty_dir)
        })?;
        Ok(Response::Replaced(replaced))
    }

    /// Installs `entry` at `path` at the path's server; what was there.
    pub(crate) fn install_at(
        &self,
        path: &str,
        entry: EntryRef,
        mode: u8,
        expect: FileId,
        replace_empty_dir: bool,
        token: u64,
    ) -> Result<Option<EntryRef>, Errno> {
        let install = InstallEntry { path: path.to_string(), entry, mode, expect, replace_empty_dir, token };
        match self.ask(&self.owner_of_path(path), Request::InstallEntry(install))? {
            Response::Replaced(replaced) => Ok(replaced),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Removes `path` at the path's server if it still refers to `expect`; whether it did.
    pub(crate) fn remove_at(&self, path: &str, expect: FileId, token: u64) -> Result<bool, Errno> {
        let request = Request::RemoveEntry(RemoveEntry { path: path.to_string(), expect, token });
        match self.ask(&self.owner_of_path(path), request)? {
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
            match self.ask_home(entry.file, Request::AddLink(self.name_count(entry.file, time_ns, to)))? {
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
            self.touch_parent(to, time_ns);
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
            let attr = match self.ask_home(file, Request::AddLink(self.name_count(file, time_ns, to)))? {
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
            self.touch_parent(to, time_ns);
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
        } else if let Err(undo) = self.drop_link(file, time_ns, Some(to)) {
            log::warn!("could not undo the link count of file {file}: {undo}");
        }
    }

    /// A change of `file`'s name count for the new name `name`, which the backend gets as a
    /// link when it lies in the cached tree.
    fn name_count(&self, file: FileId, time_ns: i64, name: &str) -> NameCount {
        NameCount { file, time_ns, name: self.in_cached_tree(name).then(|| name.to_string()) }
    }

    /// Whether `path` lies in the cached tree (cache mode).
    pub(crate) fn in_cached_tree(&self, path: &str) -> bool {
        self.store.backend().is_some_and(|backend| backend.covers(path))
    }

    pub fn rename(&self, rename: Rename) -> Result<Response, Errno> {
        let Rename { from, to, time_ns, flags } = rename;
        if flags & !(RenameFlags::NOREPLACE | RenameFlags::EXCHANGE) != 0 || flags == RenameFlags::NOREPLACE | RenameFlags::EXCHANGE {
            return Err(Errno::EINVAL);
        }
        if from == "/" || to == "/" {
            return Err(Errno::EBUSY);
        }
        if path::is_inside(&to, &from) || (flags & RenameFlags::EXCHANGE != 0 && path::is_inside(&from, &to)) {
            return Err(Errno::EINVAL);
        }
        let source = {
            let _pass = self.gate.pass(&[&from], 0)?;
            self.store.lookup(&from, self.anchor_of(&from), false).map_err(store_errno)?.0
        };
        if from == to {
            return Ok(Response::Done);
        }
        if source.is_dir() || flags & RenameFlags::EXCHANGE != 0 {
            return self.rename_tree(&from, &to, time_ns, flags);
        }
        let token = new_token();
        log::trace!("rename {from} -> {to} is {token:x}");
        let entries = self.lock_names(&[&from, &to], token)?;
        if entries[0].is_some_and(|entry| entry.is_dir()) {
            // Replaced by a directory since the look above: rename it as one.
            self.unlock_names(&[&from, &to], token);
            return self.rename_tree(&from, &to, time_ns, flags);
        }
        let outcome =
            self.rename_file(LockedRename { from: &from, to: &to, source: entries[0], target: entries[1], time_ns, flags, token });
        self.unlock_names(&[&from, &to], token);
        if outcome.is_ok() {
            self.touch_parent(&from, time_ns);
            self.touch_parent(&to, time_ns);
        }
        outcome
    }

    /// Renames a file (or link, or special file) whose names are locked.
    fn rename_file(&self, rename: LockedRename<'_>) -> Result<Response, Errno> {
        let LockedRename { from, to, source, target, time_ns, flags, token } = rename;
        let source = source.ok_or(Errno::ENOENT)?;
        match target {
            Some(_) if flags & RenameFlags::NOREPLACE != 0 => return Err(Errno::EEXIST),
            Some(target) if target.is_dir() => return Err(Errno::EISDIR),
            // Two names of the same file: POSIX says do nothing.
            Some(target) if target.file == source.file => return Ok(Response::Done),
            _ => {}
        }
        // The new name is counted before it appears, and the count given back once the old
        // name is gone: at every moment the file has at least as many links as names, so no
        // failure half-way can leave a name whose file was freed under it (removing the other
        // name would take the last link). A step whose answer was lost (EIO) may have
        // happened: it is repeated (installing the same file again replaces it with itself;
        // removing checks the file), and if it still fails the extra link stays — at worst
        // the file keeps a link too many. Without the file's server nothing changes (EIO).
        match self.ask_home(source.file, Request::AddLink(NameCount::new(source.file, time_ns)))? {
            Response::Attr(_) => {}
            _ => return Err(Errno::EPROTO),
        }
        // Cache mode: the replaced file gave up a backend creation still pending at `to`
        // (made again there if the rename fails).
        let mut yielded = None;
        if self.in_cached_tree(from) || self.in_cached_tree(to) {
            // The replaced file's backend bytes are loaded before the renamed file is bound
            // to its backend path, whose flushed creation replaces them; and the replaced
            // file gives up making its own backend file there first — applied after the
            // renamed file's, its creation would replace it (soak seed 71052).
            let prepared = (|| {
                if let Some(target) = target
                    && self.in_cached_tree(to)
                {
                    self.keep_backend_bytes_if_still_needed(target.file)?;
                    if self.yield_backend_name(target.file, to)? {
                        yielded = Some(target.file);
                    }
                }
                self.move_in_backend(source.file, from, to)
            })();
            if let Err(errno) = prepared {
                self.take_backend_name_back(yielded, to);
                self.give_back_link(source.file, from, time_ns);
                return Err(errno);
            }
        }
        let installed = crate::locks::past_point_of_no_return(|| {
            retry_uncertain(|| self.install_at(to, source, InstallMode::REPLACE, FileId::default(), false, token))
        });
        let replaced = match installed {
            Ok(replaced) => replaced,
            Err(errno) => {
                if matches!(errno, Errno::EIO | Errno::ETIMEDOUT) {
                    log::warn!("rename {from} -> {to} stopped half-way ({errno}): the file may have both names, and keeps a link for each");
                } else {
                    // Other errors (the new name's parent is gone…) say the step did not happen.
                    self.take_backend_name_back(yielded, to);
                    self.give_back_link(source.file, from, time_ns);
                }
                return Err(errno);
            }
        };
        let removed = crate::locks::past_point_of_no_return(|| retry_uncertain(|| self.remove_at(from, source.file, token)));
        match removed {
            Ok(true) => {}
            // Removed by an unlink, which gave back its link.
            Ok(false) => log::warn!("rename {from} -> {to}: the old name vanished while locked"),
            Err(errno) => {
                log::warn!("rename {from} -> {to} stopped half-way ({errno}): the file may have both names, and keeps a link for each")
            }
        }
        if let Some(replaced) = replaced
            && replaced.file != source.file
        {
            self.drop_link(replaced.file, time_ns, Some(to))?;
        }
        removed?;
        // Giving back the second link also sets the file's change time (a rename changes it).
        self.give_back_link(source.file, from, time_ns);
        Ok(Response::Done)
    }

    /// A rename over `file` (which gave up its pending backend creation at `to`) did not
    /// happen: the file, still named `to`, is made there again (all its bytes are in ringfs:
    /// a pending creation means its backend file was not made yet).
    fn take_backend_name_back(&self, yielded: Option<FileId>, to: &str) {
        let Some(file) = yielded else { return };
        if let Err(errno) = self.bind_into_cached_tree(file, to) {
            log::warn!("rename over {to} failed, and the replaced file could not be bound to its name in the backend again ({errno})");
        }
    }

    /// Gives back the link a rename counted for its new name (logged if that fails: the file
    /// then keeps a link too many, which is safe).
    fn give_back_link(&self, file: FileId, from: &str, time_ns: i64) {
        if let Err(errno) = self.drop_link(file, time_ns, None) {
            log::warn!("rename of {from}: the file's extra link could not be given back ({errno}); it keeps a link too many");
        }
    }

    /// Sets a file's change time (a rename changes it).
    pub(crate) fn touch_ctime(&self, file: FileId, time_ns: i64) -> Result<(), Errno> {
        self.ask_home(file, Request::SetAttr(ringfs_proto::SetAttr::new(file, time_ns))).map(drop)
    }
}
