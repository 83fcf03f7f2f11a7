//! A file's backend file moving with a rename of the file in the cached tree.
//!
//! A rename within the cached tree renames the file's backend file too (one `rename` in the
//! backend, at the file's inode, under the inode's lock), so that no byte is loaded back or
//! flushed again and a renamed file needs no room in the stores. What keeps the flushes of
//! the file's chunks right while it moves (on this server and on others):
//! - a flush writes only into the file the inode made or found (its `BackendPlace` carries
//!   the device and inode numbers): one that opened the file before the move writes into the
//!   same file, now under its new name; one that looks for it after the move finds nothing
//!   at the old name and asks the inode again — and makes nothing where it finds nothing
//!   (the file may have moved on again: a file made there would be a stray one);
//! - a file already at the new name (the backend file of the file the rename replaces) is
//!   exchanged with the moved one, not removed: it goes with the removal of the old name, or
//!   comes back by the same exchange if the rename fails;
//! - the move counts as a move of the inode (`moves`): a flush of the inode that asked
//!   where the file is before the move writes nothing, and the inode is queued again (a
//!   flush sets mode and attributes through the descriptor it opened, never by path);
//! - a `dir` store records the move before the backend's `rename` (`CacheState::moving`):
//!   a server that dies before it records the new place looks after its restart where the
//!   file is;
//! - a chunk whose bytes are still in the backend, read on another server, may ask where the
//!   file is just before the move and read just after it: the server asks again
//!   (`Data::across_backend_moves`).
//!
//! Where the file cannot move that way (it has no backend file under the old name, the file
//! there is not its own, a cut is under way, a directory rename holds a path, the backend
//! refuses), nothing changes and the rename takes the file's bytes along instead
//! (`ChunkStore::rebind`).

use ringfs_proto::EntryFlags;

use super::{Cache, io_errno};
use crate::StoreError;
use crate::chunk::{CacheState, Chunk, MoveIntent, PendingOp};
use crate::space::Space;

/// What became of a backend file asked to move with its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendMove {
    /// Moved (or, with nothing in the backend yet, to be made at the new name).
    Moved,
    /// Not moved: the new name's directory is not in the backend yet (made in ringfs and
    /// not flushed). The caller may have it made there and ask again.
    NoDirectory,
    /// Not moved, and it cannot be: the rename takes the file's bytes along.
    Cannot,
}

impl Cache {
    /// Moves the backend name `from` of the file whose inode is `chunk` to `to` (see the
    /// module). Nothing changed unless it answers `Moved`.
    pub(crate) fn move_with_name(&self, space: &Space, chunk: &mut Chunk, from: &str, to: &str) -> Result<BackendMove, StoreError> {
        if !self.backend.covers(from) || !self.backend.covers(to) || self.holds.covers(from) || self.holds.covers(to) {
            return Ok(BackendMove::Cannot);
        }
        if !chunk.attr.is_regular() || !chunk.attr.has(EntryFlags::BACKED) || chunk.cut.is_some() {
            return Ok(BackendMove::Cannot);
        }
        let state = &chunk.cache;
        let primary = state.backend_path.as_deref() == Some(from);
        let link = state.links.iter().position(|link| link.path == from);
        if state.backend_path.as_deref() == Some(to) && link.is_none() {
            // Moved already: asked again after an answer was lost.
            return Ok(BackendMove::Moved);
        }
        if state.links.iter().any(|link| link.path == to) {
            return Ok(BackendMove::Cannot);
        }
        // Whether the backend has the name yet (a creation or link still pending has only
        // to be made at the new name).
        let made = match (primary, link) {
            (true, _) => state.pending != Some(PendingOp::Create),
            (false, Some(index)) => state.links[index].made,
            (false, None) => return Ok(BackendMove::Cannot),
        };
        if made {
            let known = state.backend_identity.is_some();
            if !known || self.backend.identity_of(from).map_err(io_errno)? != state.backend_identity {
                return Ok(BackendMove::Cannot);
            }
            // The intent first: a server that dies between the backend's `rename` and the
            // record of the new place finds its file again after a restart
            // (`Cache::settle_move_after_restart`).
            chunk.cache.moving = Some(MoveIntent { from: from.to_string(), to: to.to_string() });
            if let Err(error) = space.persist(chunk) {
                chunk.cache.moving = None;
                return Err(error);
            }
            #[cfg(test)]
            if crate::testing::DEATH.get() == crate::testing::Death::BeforeRename {
                return Err(StoreError::Fs(ringfs_proto::Errno::EIO));
            }
            let moved = self.backend.move_file(from, to);
            #[cfg(test)]
            if moved.is_ok() && crate::testing::DEATH.get() == crate::testing::Death::AfterRename {
                return Err(StoreError::Fs(ringfs_proto::Errno::EIO));
            }
            if let Err(error) = moved {
                // (The record keeps the intent until the next persist: harmless, the file is
                // still at `from`.)
                chunk.cache.moving = None;
                // The file is at `from` (its identity was just read there): what is missing
                // is `to`'s directory.
                if error.kind() == std::io::ErrorKind::NotFound {
                    return Ok(BackendMove::NoDirectory);
                }
                log::info!("{from} could not be moved to {to} in the backend ({error}): the rename takes the file's bytes along");
                return Ok(BackendMove::Cannot);
            }
            self.backend_changed();
        }
        let old = CacheState { moving: None, ..chunk.cache.clone() };
        chunk.cache.rename_backend_name(from, to);
        chunk.cache.moving = None;
        chunk.cache.moves += 1;
        if let Err(error) = space.persist(chunk) {
            // Not recorded: the backend file goes back where the record says it is.
            chunk.cache = old;
            if made && let Err(undo) = self.backend.move_file(to, from) {
                log::warn!("{to} could not be moved back to {from} in the backend ({undo})");
            }
            return Err(error);
        }
        log::debug!("file {} moved from {from} to {to} in the backend (made there: {made})", chunk.attr.file_id);
        if chunk.attr.has(EntryFlags::DIRTY) || chunk.cache.has_pending_change() {
            // A flush of the inode that asked where the file was before the move writes
            // nothing (`moves`); it is done again at the new place.
            self.queue_chunk(chunk);
        }
        Ok(BackendMove::Moved)
    }

    /// After a restart: a move recorded as under way (`state.moving`) happened if the file
    /// is no longer at the old name and is at the new one (the identity the record holds says
    /// so); the record then names the new place.
    pub(crate) fn settle_move_after_restart(&self, state: &mut CacheState) {
        let Some(MoveIntent { from, to }) = state.moving.take() else { return };
        // (A move is begun only for a file whose identity the record holds.)
        let Some(identity) = state.backend_identity else { return };
        let holds = |path: &str| self.backend.identity_of(path).map(|found| found == Some(identity));
        match (holds(&from), holds(&to)) {
            (Ok(true), _) => {}
            (Ok(false), Ok(true)) => {
                log::info!("a move of {from} to {to} in the backend was under way at a restart, and made: recorded now");
                state.rename_backend_name(&from, &to);
            }
            (Ok(false), Ok(false)) => log::warn!("a file moved from {from} to {to} in the backend is at neither after a restart"),
            (Err(error), _) | (_, Err(error)) => {
                log::warn!("where a file moved from {from} to {to} in the backend is cannot be read: {error}")
            }
        }
    }
}
