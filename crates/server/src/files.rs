//! Operations on files that span servers, run by the server of the file's inode (or the one
//! asking it): link counts, the removal of a file's chunks everywhere, truncation, and in
//! cache mode the move of a file to another place in the backend.

use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::Arc;

use ringfs_proto::{
    BackendFileReply, ChunkIndex, ChunkKey, ChunkTemplate, EntryFlags, Errno, FileId, FileOnly, LoadChunk, NameCount, Rebind, RemoveChunks,
    Request, Response, SetChunkLen,
};
use ringfs_store::{BackendMove, Cut};

use crate::appends::Appends;
use crate::file_locks::LockTable;
use crate::node::{Node, store_errno};
use crate::opens::OpenRegistry;
use crate::outbound::retry_uncertain;
use crate::permissions::Permissions;

/// The operations on files (by id) that span servers, and the requests about a file's inode
/// that change more than the inode.
pub struct Files {
    node: Arc<Node>,
    opens: Arc<OpenRegistry>,
    file_locks: Arc<LockTable>,
    permissions: Arc<Permissions>,
    /// Files whose truncation did not end (see [`Files::cut_later_chunks`]).
    unfinished_cuts: Mutex<BTreeSet<FileId>>,
    /// Held while a file's later chunks are cut, by file (striped): the steps of two cuts of
    /// one file — a truncate and the retry of an earlier one — never interleave (a late
    /// removal landing after a newer truncate's `SetChunkLen` took the chunk it made).
    cutting: Box<[Mutex<()>]>,
    /// How far the appends placed here reach (see `appends.rs`).
    appends: Appends,
}

/// Stripes of [`Files::cutting`].
const CUT_STRIPES: usize = 64;

impl Files {
    pub fn new(node: Arc<Node>, opens: Arc<OpenRegistry>, file_locks: Arc<LockTable>, permissions: Arc<Permissions>) -> Files {
        // A restarted `dir` store knows the cuts its crash cut short.
        let unfinished_cuts = Mutex::new(node.store.unfinished_cuts().into_iter().map(|(file, _)| file).collect());
        let cutting = (0..CUT_STRIPES).map(|_| Mutex::new(())).collect();
        Files { node, opens, file_locks, permissions, unfinished_cuts, cutting, appends: Appends::default() }
    }

    /// `PlaceAppend`: where an append to `file` (its inode here) goes.
    pub fn place_append(&self, place: &ringfs_proto::AppendPlace) -> Result<Response, Errno> {
        // (The file must be here, as for every request about its inode.)
        self.node.store.stat(place.file).map_err(store_errno)?;
        Ok(Response::Count(self.appends.place(place.file, place.size, place.len)))
    }

    /// `file` (its inode here) was truncated, here or at the name server that holds it with
    /// its name (`O_TRUNC`): appends go at its new end.
    pub fn truncated(&self, file: FileId) {
        self.appends.cut(file);
    }

    /// `Open`: registers an open of `file` (here at its inode) for `client`.
    pub fn open(&self, client: u64, file: FileId) -> Result<Response, Errno> {
        let attr = self.node.store.open_file(file).map_err(store_errno)?;
        self.opens.opened(client, file);
        Ok(Response::Attr(attr))
    }

    /// `Close`: ends `client`'s opens of `files`; a file goes if that was its last reference.
    pub fn close(&self, client: u64, files: Vec<FileId>) -> Result<Response, Errno> {
        for file in files {
            if self.opens.closed(client, file) {
                self.close_registered(file);
            }
        }
        Ok(Response::Done)
    }

    /// Ends an open registered here; the file goes if that was its last reference.
    pub fn close_registered(&self, file: FileId) {
        if let Some(deleted) = self.node.store.close_file(file) {
            self.remove_later_chunks(file, ChunkIndex::FIRST.next(), deleted.last_chunk);
        }
    }

    /// Ends the opens (and advisory locks) of clients gone for longer than the grace period.
    pub fn expire_opens(&self, grace: std::time::Duration) {
        let expired = self.opens.expire(grace);
        for (file, count) in expired.files {
            for _ in 0..count {
                self.close_registered(file);
            }
        }
        for client in expired.locking_clients {
            let released = self.file_locks.release_client(client);
            if released > 0 {
                log::info!("client {client:016x} is gone; its {released} advisory locks end");
            }
        }
    }

    /// `SetLock`: an advisory lock of a file whose inode is here (its client's locks end with
    /// its opens).
    pub fn set_lock(&self, lock: &ringfs_proto::FileLock) -> Result<Response, Errno> {
        if lock.kind != ringfs_proto::LockKind::Unlock {
            self.opens.took_lock(lock.client);
        }
        self.file_locks.set(lock)?;
        Ok(Response::Done)
    }

    /// `TestLock`: the lock that would keep `lock` from being taken, if any.
    pub fn test_lock(&self, lock: &ringfs_proto::FileLock) -> Result<Response, Errno> {
        Ok(Response::LockHolder(self.file_locks.test(lock)?))
    }

    /// `SetAttr` at the inode: the change, and what it means elsewhere (every server forgets a
    /// directory's old mode and owner; an explicit mtime clamps the file's later chunks).
    pub fn set_attr(&self, set: &ringfs_proto::SetAttr) -> Result<Response, Errno> {
        let attr = self.node.store.set_attr(set).map_err(store_errno)?;
        if attr.is_dir() && (set.mode.is_some() || set.uid.is_some() || set.gid.is_some()) {
            self.permissions.spread_dir_attr_change(set.file);
        }
        if set.mtime_ns.is_some() && attr.is_regular() && attr.is_extended() {
            self.clamp_chunk_times(set.file, attr.mtime_ns, attr.last_chunk)?;
        }
        Ok(Response::Attr(attr))
    }

    /// An explicit mtime was set on an extended file: its chunks up to `last_chunk` keep no
    /// later time (EIO if a server holding chunks could not be told; the inode has the time).
    fn clamp_chunk_times(&self, file: FileId, mtime_ns: i64, last_chunk: ChunkIndex) -> Result<(), Errno> {
        self.node.store.clamp_tail_mtimes(file, mtime_ns).map_err(store_errno)?;
        let request = Request::ClampChunkTimes(ringfs_proto::LinkCount { file, time_ns: mtime_ns });
        let answers = self.node.ask_owners_of_chunks(file, ChunkIndex::FIRST.next(), last_chunk, &request);
        answers.into_iter().find_map(Result::err).map_or(Ok(()), Err)
    }

    /// `AddLink` at the inode: one name more (cache mode: the backend gets `name` as a link).
    pub fn add_link(&self, count: &NameCount) -> Result<Response, Errno> {
        let (attr, rewrite) = self.node.store.add_link_named(count.file, count.time_ns, count.name.as_deref()).map_err(store_errno)?;
        if rewrite {
            self.redirty_everywhere(count.file)?;
        }
        Ok(Response::Attr(attr))
    }

    /// `YieldBackendName` at the inode (see [`Files::yield_backend_name`]).
    pub fn yield_backend_name_here(&self, name: &ringfs_proto::BackendName) -> Result<Response, Errno> {
        let (yielded, rewrite) = self.node.store.yield_backend_name(name.file, &name.name).map_err(store_errno)?;
        if rewrite {
            self.redirty_everywhere(name.file)?;
        }
        Ok(Response::Count(u64::from(yielded)))
    }

    /// `MoveBackendFile` at the inode (see [`Files::move_with_name`]).
    pub fn move_backend_file_here(&self, moved: &ringfs_proto::BackendMove) -> Result<Response, Errno> {
        let outcome = self.node.store.move_backend_file(moved.file, &moved.from, &moved.to).map_err(store_errno)?;
        Ok(Response::Count(match outcome {
            BackendMove::Cannot => 0,
            BackendMove::Moved => 1,
            BackendMove::NoDirectory => 2,
        }))
    }

    /// `SettleBackendName` at the server of the name.
    pub fn settle_backend_name_here(&self, path: &str) -> Result<Response, Errno> {
        self.node.store.settle_backend_name(path).map_err(store_errno)?;
        Ok(Response::Done)
    }

    /// `Redirty`: this server's chunks of `file` are flushed again (or, out of the cached
    /// tree, not any more).
    pub fn redirty_here(&self, file: FileId) -> Result<Response, Errno> {
        let backed = self.node.store.backend_file(file).map(|backend| backend.is_some()).unwrap_or(true);
        self.node.store.redirty(file, backed);
        Ok(Response::Done)
    }

    /// Tells `file`'s inode that its name `path` entered the cached tree (it is made there
    /// anew, or gets `path` as another link).
    pub fn bind_into_cached_tree(&self, file: FileId, path: &str) -> Result<(), Errno> {
        self.node.ask_home(file, Request::Rebind(ringfs_proto::Rebind { file, path: Some(path.to_string()), from: None })).map(drop)
    }

    /// `Reserve`: charges the room the chunks of the range that live here do not take yet
    /// (`bytes` less what they store), or gives `release` bytes of the file's reservation
    /// back. Only the chunks this server holds are looked at, however long the range.
    pub fn reserve(&self, reservation: ringfs_proto::Reservation) -> Result<Response, Errno> {
        let ringfs_proto::Reservation { file, offset, end, chunk_size, bytes, release } = reservation;
        if release > 0 {
            self.node.store.unreserve(file, release);
            return Ok(Response::Count(0));
        }
        if chunk_size == 0 || chunk_size > crate::node::MAX_CHUNK_SIZE || end <= offset {
            return Err(Errno::EINVAL);
        }
        let chunk_size = u64::from(chunk_size);
        let (first, last) = (ChunkIndex::of_offset(offset, chunk_size), ChunkIndex::last_of(end, chunk_size));
        let stored: u64 = self
            .node
            .store
            .stored_chunks(file, first, last)
            .into_iter()
            .map(|(index, stored)| stored.min(index.len_below(end, chunk_size)))
            .sum();
        let needed = bytes.saturating_sub(stored);
        self.node.store.reserve(file, needed)?;
        Ok(Response::Count(needed))
    }

    /// Removes the chunks `from_index..=last_chunk` of a file (at their owners; nothing when
    /// the range is empty). Failures (a dead server) leave orphan chunks behind, which are
    /// invisible: no inode has their file id any more (`reclaim.rs` removes them later).
    pub fn remove_later_chunks(&self, file: FileId, from_index: ChunkIndex, last_chunk: ChunkIndex) {
        if let Err(errno) = self.remove_chunks_everywhere(file, from_index, last_chunk, None) {
            log::warn!("could not remove chunks of file {file} on every server that holds some: {errno}");
        }
    }

    /// Removes the chunks of `file` from `from_index` to `last_chunk` at their servers (see
    /// `RemoveChunks` for `cut_at_ns`); the first failure, after every server was asked.
    fn remove_chunks_everywhere(
        &self,
        file: FileId,
        from_index: ChunkIndex,
        last_chunk: ChunkIndex,
        cut_at_ns: Option<i64>,
    ) -> Result<(), Errno> {
        if last_chunk < from_index {
            return Ok(());
        }
        let request = Request::RemoveChunks(RemoveChunks { file, from_index, cut_at_ns });
        self.node.ask_owners_of_chunks(file, from_index, last_chunk, &request).into_iter().find_map(Result::err).map_or(Ok(()), Err)
    }

    /// One name fewer of `file`, told to the file's inode server: `name` (cache mode: the
    /// backend loses it as a link of the file when it lies in the cached tree).
    pub fn drop_link(&self, file: FileId, time_ns: i64, name: Option<&str>) -> Result<(), Errno> {
        let name = name.filter(|name| self.node.in_cached_tree(name)).map(str::to_string);
        match self.node.ask_home(file, Request::DropLink(NameCount { file, time_ns, name })) {
            // The file is gone already (a concurrent removal of its other name, say).
            Err(Errno::ESTALE) => Ok(()),
            other => other.map(drop),
        }
    }

    /// At the inode's server: one name fewer; the file goes when it has neither names nor
    /// opens.
    pub fn drop_link_here(&self, file: FileId, time_ns: i64, name: Option<&str>) -> Result<(), Errno> {
        let (deleted, rewrite) = self.node.store.drop_link_named(file, time_ns, name).map_err(store_errno)?;
        if rewrite {
            self.redirty_everywhere(file)?;
        }
        match deleted {
            Some(deleted) => self.remove_later_chunks(file, ChunkIndex::FIRST.next(), deleted.last_chunk),
            None => {
                // Cache mode: a file that lost its last name while open leaves the cached
                // tree on every server, so that its chunks — whose bytes exist only here now —
                // are never evicted.
                if let Ok(attr) = self.node.store.stat(file)
                    && attr.nlink == 0
                    && attr.has(EntryFlags::BACKED)
                {
                    self.rebind_here(file, None, None)?;
                }
            }
        }
        Ok(())
    }

    /// Cache mode: before a name of `file` goes from the backend (an unlink, or a rename over
    /// it), the bytes it still has there are loaded if the file is open or has other names:
    /// its readers keep reading it after the backend file is gone. (A file opened between this check and the
    /// name's removal may find its backend bytes gone: EIO.)
    pub(crate) fn keep_backend_bytes_if_still_needed(&self, file: FileId) -> Result<(), Errno> {
        let attr = match self.node.ask_home(file, Request::Stat(FileOnly { file })) {
            Ok(Response::Attr(attr)) => attr,
            Ok(_) => return Err(Errno::EPROTO),
            Err(Errno::ESTALE) => return Ok(()),
            Err(errno) => return Err(errno),
        };
        // A file with other names may be made anew at one of them (when the name its data
        // goes to leaves): it takes its bytes along as a renamed file does.
        if (attr.has(EntryFlags::OPEN) || attr.nlink > 1) && attr.has(EntryFlags::BACKED) && may_have_bytes_only_in_the_backend(&attr) {
            self.load_backend_data(file)?;
        }
        Ok(())
    }

    /// Truncates a file to `size` at its inode's server: chunk 0 here, then the last chunk at
    /// its owner and the chunks past the end everywhere ([`Files::cut_later_chunks`]). A
    /// server of those chunks that does not answer fails the truncate; the cut is finished
    /// when it answers again.
    pub fn truncate(&self, file: FileId, size: u64, time_ns: i64) -> Result<Response, Errno> {
        let _cutting = self.cut_lock(file);
        let attr = self.node.store.stat(file).map_err(store_errno)?;
        if let Some(earlier) = self.node.store.cut_under_way(file) {
            // An earlier truncation a server did not answer is finished first: one that grows
            // the file would leave the chunks past the earlier cut in place.
            self.cut_later_chunks_held(file, earlier, attr.last_chunk, true)?;
        }
        let chunk_size = u64::from(attr.chunk_size);
        let before = self.node.store.truncate_head(file, size.min(chunk_size), size, time_ns).map_err(store_errno)?;
        self.truncated(file);
        // Chunks past the bound the inode carried do not exist (a write that raises it after
        // this point comes after the truncate).
        self.cut_later_chunks_held(file, Cut { len: size, time_ns }, before.last_chunk, false)?;
        Ok(Response::Attr(self.node.store.stat(file).map_err(store_errno)?))
    }

    /// The part of a truncation of `file` after its chunk 0 (cut already, the cut recorded as
    /// under way): the last chunk is cut at its owner and the chunks after it, up to
    /// `last_chunk`, are removed at theirs; then the cut ends (`ChunkStore::finish_cut`: in
    /// cache mode the backend file is cut next). If a step fails, the cut stays under way —
    /// the file is not flushed meanwhile — and is finished later ([`Files::finish_cuts`],
    /// `late`: chunks changed after the truncation are left alone).
    pub fn cut_later_chunks(&self, file: FileId, cut: Cut, last_chunk: ChunkIndex, late: bool) -> Result<(), Errno> {
        let _cutting = self.cut_lock(file);
        self.cut_later_chunks_held(file, cut, last_chunk, late)
    }

    /// The lock of [`Files::cutting`] that `file`'s cuts take.
    fn cut_lock(&self, file: FileId) -> parking_lot::MutexGuard<'_, ()> {
        self.cutting[(file.serial % CUT_STRIPES as u64) as usize].lock()
    }

    /// [`Files::cut_later_chunks`], the caller holding the file's [`Files::cut_lock`].
    fn cut_later_chunks_held(&self, file: FileId, cut: Cut, last_chunk: ChunkIndex, late: bool) -> Result<(), Errno> {
        let result = self.try_cut_later_chunks(file, cut, last_chunk, late);
        if let Err(errno) = result {
            // (Said once; the tries every heartbeat after it say it at debug level.)
            let level = if late { log::Level::Debug } else { log::Level::Info };
            log::log!(level, "the cut of file {file} to {} bytes is not finished ({errno}); it will be tried again", cut.len);
            self.unfinished_cuts.lock().insert(file);
        }
        result
    }

    fn try_cut_later_chunks(&self, file: FileId, cut: Cut, last_chunk: ChunkIndex, late: bool) -> Result<(), Errno> {
        let attr = self.node.store.stat(file).map_err(store_errno)?;
        let chunk_size = u64::from(attr.chunk_size);
        let last_index = ChunkIndex::last_of(cut.len, chunk_size);
        let cut_at_ns = late.then_some(cut.time_ns);
        let mut failed = None;
        if !last_index.is_first() {
            let template = ChunkTemplate {
                mode: attr.mode,
                uid: attr.uid,
                gid: attr.gid,
                chunk_size: attr.chunk_size,
                backend_len: attr.backend_len.min(cut.len),
            };
            let chunk = ChunkKey::new(file, last_index);
            // The chunk's server takes the backend place as sent: asking this server back
            // could wait on a server waiting for this answer.
            let backend = self.node.store.backend_file(file).map_err(store_errno)?;
            let backend = backend.map(|backend| BackendFileReply { path: backend.path, len: backend.len.min(cut.len) });
            let len = cut.len - last_index.first_byte(chunk_size);
            let request = Request::SetChunkLen(SetChunkLen { chunk, len, template, backend, cut_at_ns });
            failed = self.node.ask(&self.node.owner_of_chunk(chunk), request).err();
        }
        if let Err(errno) = self.remove_chunks_everywhere(file, last_index.next(), last_chunk, cut_at_ns) {
            failed.get_or_insert(errno);
        }
        match failed {
            None => self.node.store.finish_cut(file, cut).map_err(store_errno),
            Some(errno) => Err(errno),
        }
    }

    /// Finishes the cuts that did not end (called every heartbeat interval; a restarted
    /// server's store names those its crash cut short).
    pub fn finish_cuts(&self) {
        let files = std::mem::take(&mut *self.unfinished_cuts.lock());
        for file in files {
            let _cutting = self.cut_lock(file);
            let Some(cut) = self.node.store.cut_under_way(file) else { continue };
            let Ok(attr) = self.node.store.stat(file) else { continue };
            if self.cut_later_chunks_held(file, cut, attr.last_chunk, true).is_ok() {
                log::info!("the cut of file {file} to {} bytes is finished", cut.len);
            }
        }
    }

    /// Asks the inode's server of `file` to apply the inode's pending operation and say where
    /// the file lives in the backend (see `ChunkStore::prepare`).
    pub(crate) fn prepare_at_home(&self, file: FileId) -> Result<Option<ringfs_proto::BackendPlace>, Errno> {
        match self.node.ask_home(file, Request::FlushPrepare(FileOnly { file }))? {
            Response::BackendTarget(place) => Ok(place),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Cache mode, for a rename: `file`'s name `from` moves to `to` in the backend. Its bytes
    /// still in the backend are loaded first (its old backend file goes with the old name),
    /// then its inode takes the new place and all its chunks are flushed there again — or,
    /// for a file with other names in the cached tree, the backend gets `to` as another
    /// link of its file.
    pub(crate) fn move_in_backend(&self, file: FileId, from: &str, to: &str) -> Result<(), Errno> {
        self.load_backend_data(file)?;
        let path = self.node.in_cached_tree(to).then(|| to.to_string());
        let from = self.node.in_cached_tree(from).then(|| from.to_string());
        self.node.ask_home(file, Request::Rebind(Rebind { file, path, from })).map(drop)
    }

    /// Cache mode, for a rename of `file`'s name `from` to `to` within the cached tree: the
    /// file's backend file moves with the name (one `rename` in the backend, at the inode;
    /// see the store's `cache::moves`), so no byte is loaded or flushed again. First the
    /// server of `to` applies a removal of `to` still to be applied to the backend (applied
    /// after the move, it would remove the moved file). Whether it moved; `false`: nothing
    /// changed, and the rename takes the file's bytes along ([`Files::move_in_backend`]).
    pub(crate) fn move_with_name(&self, file: FileId, from: &str, to: &str) -> Result<bool, Errno> {
        if !self.node.in_cached_tree(from) || !self.node.in_cached_tree(to) {
            return Ok(false);
        }
        let owner = self.node.owner_of_path(to);
        match self.node.ask(&owner, Request::SettleBackendName(ringfs_proto::PathOnly { path: to.to_string() })) {
            Ok(_) => {}
            // A directory rename holds the name's directory: the slow way waits for nothing.
            Err(Errno::EBUSY) => return Ok(false),
            Err(errno) => return Err(errno),
        }
        let request = Request::MoveBackendFile(ringfs_proto::BackendMove { file, from: from.to_string(), to: to.to_string() });
        // Asked again if its answer was lost: a move that did happen answers 1 again (the
        // file's backend path is `to` already).
        match retry_uncertain(|| self.node.ask_home(file, request.clone()))? {
            Response::Count(1) => Ok(true),
            // The new name's directory was made in ringfs and is not in the backend yet: it
            // is made there now (what its flush would do), and the move asked once more.
            Response::Count(2) if self.make_directory_in_backend(to) => match self.node.ask_home(file, request)? {
                Response::Count(moved) => Ok(moved == 1),
                _ => Err(Errno::EPROTO),
            },
            Response::Count(_) => Ok(false),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Cache mode: has the directory of the name `path` made in the backend now (its
    /// pending creation applied by its inode, which makes the directories above it too).
    /// Whether that was done.
    fn make_directory_in_backend(&self, path: &str) -> bool {
        let Some(dir) = ringfs_proto::path::parent(path) else { return false };
        let lookup = Request::LookupDir(ringfs_proto::PathOnly { path: dir.to_string() });
        let dir_file = match self.node.ask(&self.node.owner_of_path(dir), lookup) {
            Ok(Response::Replaced(Some(entry))) if entry.is_dir() => entry.file,
            _ => return false,
        };
        match self.prepare_at_home(dir_file) {
            Ok(Some(_)) => true,
            Ok(None) => false,
            Err(errno) => {
                log::debug!("the backend directory {dir} could not be made now ({errno})");
                false
            }
        }
    }

    /// Cache mode, for a rename over `file`: its name `to` goes to another file; `file`
    /// gives up a backend creation (or link) still pending there, before the other file is
    /// bound to `to` (see `ChunkStore::yield_backend_name`). Whether it gave one up.
    pub(crate) fn yield_backend_name(&self, file: FileId, to: &str) -> Result<bool, Errno> {
        let request = Request::YieldBackendName(ringfs_proto::BackendName { file, name: to.to_string() });
        match self.node.ask_home(file, request) {
            Ok(Response::Count(yielded)) => Ok(yielded != 0),
            // The file is gone already: nothing of it can be made at `to`.
            Err(Errno::ESTALE) => Ok(false),
            Ok(_) => Err(Errno::EPROTO),
            Err(errno) => Err(errno),
        }
    }

    /// At the inode's server: the file's new backend place (see `ChunkStore::rebind`); every
    /// server marks its chunks if the file's data must be flushed again.
    pub fn rebind_here(&self, file: FileId, path: Option<&str>, from: Option<&str>) -> Result<(), Errno> {
        if self.node.store.rebind(file, path, from).map_err(store_errno)? {
            self.redirty_everywhere(file)?;
        }
        Ok(())
    }

    /// Every server marks its chunks of `file` to be flushed again (or, for a file out of the
    /// cached tree, not any more).
    pub(crate) fn redirty_everywhere(&self, file: FileId) -> Result<(), Errno> {
        let request = Request::Redirty(FileOnly { file });
        // Called at the inode's server: its bound says which servers hold chunks. Without
        // the inode (it went meanwhile), every server is asked.
        let answers = match self.node.store.stat(file) {
            Ok(attr) => self.node.ask_owners_of_chunks(file, ChunkIndex::FIRST, attr.last_chunk, &request),
            Err(_) => self.node.broadcast(&request),
        };
        for answer in answers {
            answer?;
        }
        Ok(())
    }

    /// Cache mode: loads every chunk of `file` whose bytes are still in the backend (a renamed
    /// file takes its data along): the chunks below its `backend_len` (it came from the
    /// backend), and those flushed and then evicted (their bytes are only in its backend
    /// file; the store holds their attributes). Each chunk's owner loads what it holds only
    /// there, and marks every chunk of the file dirty (`keep`): a clean chunk could be
    /// evicted again before the rename marks it for its new place, its bytes then only in
    /// the old backend file, which goes with the old name.
    fn load_backend_data(&self, file: FileId) -> Result<(), Errno> {
        let attr = match self.node.ask_home(file, Request::Stat(FileOnly { file }))? {
            Response::Attr(attr) => attr,
            _ => return Err(Errno::EPROTO),
        };
        if !may_have_bytes_only_in_the_backend(&attr) {
            return Ok(());
        }
        let backend = match self.node.ask_home(file, Request::BackendOf(FileOnly { file }))? {
            Response::BackendFile(backend) => backend,
            _ => return Err(Errno::EPROTO),
        };
        let chunk_size = attr.chunk_size.max(1) as u64;
        let last = ChunkIndex::last_of(attr.backend_len, chunk_size).max(attr.last_chunk);
        let chunks: Vec<ChunkIndex> = ChunkIndex::FIRST.through(last).collect();
        // In batches, each chunk's request to its owner at once.
        for batch in chunks.chunks(LOADS_AT_ONCE) {
            let targets: Vec<_> = batch
                .iter()
                .map(|index| {
                    let chunk = ChunkKey::new(file, *index);
                    let request =
                        Request::LoadChunk(LoadChunk { chunk, backend_len: attr.backend_len, backend: backend.clone(), keep: true });
                    (self.node.owner_of_chunk(chunk), request)
                })
                .collect();
            for answer in self.node.ask_each(&targets, None) {
                answer?;
            }
        }
        Ok(())
    }
}

/// Chunks loaded from the backend at once for a rename (one request each).
const LOADS_AT_ONCE: usize = 64;

/// Whether some of a file's bytes may be only in its backend file: it came from the backend
/// (`backend_len`), or it was flushed there (`IN_BACKEND`) and chunks may have been evicted
/// since.
fn may_have_bytes_only_in_the_backend(attr: &ringfs_proto::Attr) -> bool {
    (attr.is_regular() || attr.is_symlink()) && (attr.backend_len > 0 || attr.has(EntryFlags::IN_BACKEND))
}
