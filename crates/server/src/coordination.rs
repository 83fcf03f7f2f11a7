//! Operations that involve more than one server, run by the server that owns the entry.
//!
//! - **Parent checks.** A create succeeds only under an existing directory. The owner of the
//!   new entry asks the owner of the parent once and then remembers the answer in its store's
//!   known-directories cache; rmdir makes every server forget (see `ChunkStore::create`).
//! - **Unlink / truncate** of a file whose chunks are spread: chunk 0 changes first, then the
//!   other servers drop the chunks past the new end.
//! - **rmdir**: the owner marks the directory as being removed, asks every server whether it
//!   holds an entry inside, then removes it or answers ENOTEMPTY.
//! - **rename** of a file: every server moves its chunks of the file to their owners under
//!   the new path (chunks keep their file id, so the target's old chunks stay apart), then
//!   chunk 0 is installed at the new path in one step — the moment the new name shows the
//!   complete file — and finally the old entry and the replaced file's chunks are removed.

use ringfs_proto::path;
use ringfs_proto::{Attr, ChunkRef, Create, Errno, Request, Response};
use ringfs_rpc::memory::fast_random_u64;
use ringfs_store::StoreError;

use crate::service::{MAX_CHUNK_SIZE, ServerState, Session, store_errno};

/// A create or install retries after resolving its parent at most this often (each retry
/// needs an rmdir racing with it).
const PARENT_ATTEMPTS: usize = 4;

impl ServerState {
    /// Sends `request` to every server (this one included) and returns each answer.
    pub fn broadcast(&self, request: &Request) -> Vec<Result<Response, Errno>> {
        let members: Vec<_> = self.membership().list().members.clone();
        let mut connections = Vec::new();
        let mut results = Vec::new();
        for member in &members {
            if member.name == self.name {
                continue;
            }
            if !member.alive {
                results.push(Err(Errno::EIO));
                continue;
            }
            match self.peers.connection(member) {
                Ok(connection) => connections.push(connection),
                Err(error) => {
                    log::warn!("cannot reach server {}: {error}", member.name);
                    results.push(Err(Errno::EIO));
                }
            }
        }
        let calls: Vec<_> = connections.iter().map(|connection| connection.start(request, &[], None)).collect();
        let mut local_reply = Vec::new();
        results.push(self.execute(&mut Session::default(), request.clone(), &[], &mut local_reply));
        for call in calls {
            results.push(match call.and_then(|call| call.wait()) {
                Ok(reply) => match reply.response {
                    Response::Error(errno) => Err(errno),
                    response => Ok(response),
                },
                Err(error) => {
                    log::warn!("broadcast failed: {error}");
                    Err(error.errno())
                }
            });
        }
        results
    }

    /// Removes, on every server, the chunks of a file from `from_index` on. Failures (a dead
    /// server) leave orphan chunks behind, which are invisible: they carry a file id no entry
    /// has any more.
    fn remove_chunks_everywhere(&self, path: &str, file_id: u64, from_index: u64) {
        let request = Request::RemoveChunks { path: path.to_string(), file_id, from_index };
        for result in self.broadcast(&request) {
            if let Err(errno) = result {
                log::warn!("could not remove chunks of {path} on every server: {errno}");
            }
        }
    }

    /// Makes sure the store knows `dir` exists, asking its owner if needed.
    fn resolve_parent(&self, dir: &str) -> Result<(), Errno> {
        let Err(ticket) = self.store.known_dir(dir) else { return Ok(()) };
        let owner = self.owner_of(dir, 0);
        if owner.name == self.name {
            self.store.lookup_dir(dir).map_err(store_errno)?;
        } else {
            let reply = self.call_member(&owner, &Request::LookupDir { path: dir.to_string() }, &[])?;
            if !matches!(reply.response, Response::Attr(attr) if attr.is_dir()) {
                return Err(Errno::ENOTDIR);
            }
        }
        self.store.mark_known_dir(dir, ticket);
        Ok(())
    }

    /// Runs a store operation that needs a known parent, resolving the parent when asked.
    fn with_parent<T>(&self, mut operation: impl FnMut() -> Result<T, StoreError>) -> Result<T, Errno> {
        for _ in 0..PARENT_ATTEMPTS {
            match operation() {
                Err(StoreError::ParentUnknown(parent)) => self.resolve_parent(&parent)?,
                other => return other.map_err(store_errno),
            }
        }
        Err(Errno::EAGAIN)
    }

    pub fn create(&self, create: Create) -> Result<Response, Errno> {
        if create.chunk_size == 0 || create.chunk_size > MAX_CHUNK_SIZE {
            return Err(Errno::EINVAL);
        }
        if let Some(target) = &create.link_target
            && (target.is_empty() || target.len() > path::MAX_PATH_BYTES)
        {
            return Err(Errno::EINVAL);
        }
        let file_id = fast_random_u64() | 1;
        let outcome = self.with_parent(|| self.store.create(&create, file_id))?;
        if outcome.truncated_extended {
            self.remove_chunks_everywhere(&create.path, outcome.attr.file_id, 1);
        }
        if outcome.truncated {
            self.store.cut_backend_file(&create.path, outcome.attr.file_id, 0).map_err(store_errno)?;
        }
        Ok(Response::Attr(outcome.attr))
    }

    pub fn unlink(&self, path: &str) -> Result<Response, Errno> {
        let attr = self.store.unlink(path, 0).map_err(store_errno)?;
        if attr.is_extended() {
            self.remove_chunks_everywhere(path, attr.file_id, 1);
        }
        Ok(Response::Done)
    }

    /// Truncates a file to `size`: chunk 0 here, the last chunk at its owner, and the chunks
    /// past the end everywhere.
    pub fn truncate(&self, path: &str, file_id: u64, size: u64, time_ns: i64) -> Result<Response, Errno> {
        let attr = self.store.stat(&ChunkRef { path: path.to_string(), index: 0, file_id }).map_err(store_errno)?;
        let chunk_size = attr.chunk_size as u64;
        let last_index = if size == 0 { 0 } else { (size - 1) / chunk_size };
        let head_len = size.min(chunk_size);
        let before = self.store.truncate_head(path, attr.file_id, head_len, size, time_ns).map_err(store_errno)?;
        // From here the cut is under way: whatever happens, it is recorded at the end, which
        // lets the file's chunks be flushed again.
        let cut_last_chunk = || -> Result<(), Errno> {
            if last_index == 0 {
                return Ok(());
            }
            let last = ChunkRef { path: path.to_string(), index: last_index, file_id: attr.file_id };
            let template = ringfs_proto::ChunkTemplate {
                mode: attr.mode,
                uid: attr.uid,
                gid: attr.gid,
                chunk_size: attr.chunk_size,
                backend_len: attr.backend_len.min(size),
            };
            let request = Request::SetChunkLen { chunk: last, len: size - last_index * chunk_size, template };
            let owner = self.owner_of(path, last_index);
            if owner.name == self.name {
                self.execute(&mut Session::default(), request, &[], &mut Vec::new()).map(drop)
            } else {
                self.call_member(&owner, &request, &[]).map(drop)
            }
        };
        let cut = cut_last_chunk();
        if before.is_extended() {
            self.remove_chunks_everywhere(path, attr.file_id, last_index + 1);
        }
        self.store.cut_backend_file(path, attr.file_id, size).map_err(store_errno)?;
        cut?;
        let attr = self.store.stat(&ChunkRef { path: path.to_string(), index: 0, file_id: attr.file_id }).map_err(store_errno)?;
        Ok(Response::Attr(attr))
    }

    pub fn rmdir(&self, path: &str) -> Result<Response, Errno> {
        self.store.begin_rmdir(path).map_err(store_errno)?;
        let answers = self.broadcast(&Request::PrepareRmdir { path: path.to_string() });
        let mut outcome = Ok(Response::Done);
        let mut removed = std::collections::HashSet::new();
        for answer in answers {
            match answer {
                Ok(Response::HasEntries { any: false, removed: names }) => removed.extend(names),
                Ok(Response::HasEntries { any: true, .. }) => outcome = Err(Errno::ENOTEMPTY),
                Ok(_) => outcome = Err(Errno::EPROTO),
                // A server we cannot ask might hold entries: refuse rather than orphan them.
                Err(errno) => outcome = outcome.and(Err(errno)),
            }
        }
        if outcome.is_ok() {
            // Cache mode: entries only the backend has count too, unless removed in ringfs.
            match self.store.backend_names(path) {
                Ok(names) if names.iter().any(|name| !removed.contains(name)) => outcome = Err(Errno::ENOTEMPTY),
                Ok(_) => {}
                Err(error) => outcome = Err(store_errno(error)),
            }
        }
        self.store.finish_rmdir(path, outcome.is_ok()).map_err(store_errno)?;
        outcome
    }

    pub fn rename(&self, from: &str, to: &str, time_ns: i64) -> Result<Response, Errno> {
        path::validate(to)?;
        self.load_backend_data(from)?;
        let head = self.store.copy_chunk(&ChunkRef { path: from.to_string(), index: 0, file_id: 0 }).map_err(store_errno)?;
        if from == to {
            return Ok(Response::Done);
        }
        if path::is_inside(to, from) {
            return Err(Errno::EINVAL);
        }
        if head.attr.is_dir() {
            // Directory rename is not supported yet; `mv` falls back to copy and delete.
            return Err(Errno::EXDEV);
        }
        let file_id = head.attr.file_id;
        if head.attr.is_extended() {
            // Moving chunks is costly: check first that the install will be possible.
            self.check_rename_target(to)?;
            let request = Request::MoveChunks { from: from.to_string(), to: to.to_string(), file_id };
            let moved = self.broadcast(&request).into_iter().collect::<Result<Vec<_>, Errno>>();
            if let Err(errno) = moved {
                self.remove_chunks_everywhere(to, file_id, 1);
                return Err(errno);
            }
        }
        let attr = Attr { ctime_ns: time_ns, ..head.attr };
        let request = Request::InstallEntry { path: to.to_string(), attr };
        let owner = self.owner_of(to, 0);
        let installed = if owner.name == self.name {
            self.install_entry(to, attr, &head.bytes)
        } else {
            self.call_member(&owner, &request, &head.bytes).map(|reply| reply.response)
        };
        let replaced = match installed {
            Ok(replaced) => replaced,
            Err(errno) => {
                // The copies under the new name carry this file's id: nothing else uses them.
                if head.attr.is_extended() {
                    self.remove_chunks_everywhere(to, file_id, 1);
                }
                return Err(errno);
            }
        };
        if let Response::Replaced(Some(old)) = replaced
            && old.is_extended()
        {
            self.remove_chunks_everywhere(to, old.file_id, 1);
        }
        if let Err(error) = self.store.unlink(from, file_id) {
            log::warn!("rename {from} -> {to}: old entry vanished: {error}");
        }
        if head.attr.is_extended() {
            self.remove_chunks_everywhere(from, file_id, 1);
        }
        Ok(Response::Done)
    }

    /// Cache mode: loads every chunk of the file at `path` whose bytes are still in the backend
    /// (a renamed file takes its data along; its old backend file is removed later).
    fn load_backend_data(&self, path: &str) -> Result<(), Errno> {
        let head = match self.store.stat(&ChunkRef { path: path.to_string(), index: 0, file_id: 0 }) {
            Ok(head) => head,
            Err(error) => return Err(store_errno(error)),
        };
        if head.backend_len == 0 || !head.is_regular() {
            return Ok(());
        }
        let chunk_size = head.chunk_size.max(1) as u64;
        for index in 0..head.backend_len.div_ceil(chunk_size) {
            let chunk = ChunkRef { path: path.to_string(), index, file_id: head.file_id };
            let request = Request::LoadChunk { chunk, backend_len: head.backend_len };
            let owner = self.owner_of(path, index);
            if owner.name == self.name {
                self.execute(&mut Session::default(), request, &[], &mut Vec::new())?;
            } else {
                self.call_member(&owner, &request, &[])?;
            }
        }
        Ok(())
    }

    /// Fails like the install of a rename to `to` would: missing parent, or a directory there.
    fn check_rename_target(&self, to: &str) -> Result<(), Errno> {
        if let Some(parent) = path::parent(to)
            && parent != "/"
        {
            self.resolve_parent(parent)?;
        }
        let stat = Request::Stat(ChunkRef { path: to.to_string(), index: 0, file_id: 0 });
        let owner = self.owner_of(to, 0);
        let existing = if owner.name == self.name {
            self.execute(&mut Session::default(), stat, &[], &mut Vec::new())
        } else {
            self.call_member(&owner, &stat, &[]).map(|reply| reply.response)
        };
        match existing {
            Ok(Response::Attr(attr)) if attr.is_dir() => Err(Errno::EISDIR),
            Ok(_) | Err(Errno::ENOENT) => Ok(()),
            Err(errno) => Err(errno),
        }
    }

    /// This server's part of a rename: copy each of its chunks of the file to the owner of
    /// the same index under the new path.
    pub fn move_chunks(&self, from: &str, to: &str, file_id: u64) -> Result<Response, Errno> {
        path::validate(from)?;
        path::validate(to)?;
        let indices = self.store.tail_indices(from, file_id);
        for index in &indices {
            let chunk = self.store.copy_chunk(&ChunkRef { path: from.to_string(), index: *index, file_id }).map_err(store_errno)?;
            let target = ChunkRef { path: to.to_string(), index: *index, file_id };
            let owner = self.owner_of(to, *index);
            if owner.name == self.name {
                self.store.put_chunk(&target, chunk.attr, &chunk.bytes).map_err(store_errno)?;
            } else {
                self.call_member(&owner, &Request::PutChunk { chunk: target, attr: chunk.attr }, &chunk.bytes)?;
            }
        }
        Ok(Response::Count(indices.len() as u64))
    }

    pub fn install_entry(&self, path: &str, attr: Attr, bytes: &[u8]) -> Result<Response, Errno> {
        let replaced = self.with_parent(|| self.store.install_entry(path, attr, bytes))?;
        Ok(Response::Replaced(replaced))
    }
}
