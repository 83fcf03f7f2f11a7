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
//! - the inode's own flush writes its mode and extended attributes by path: the move counts
//!   as a move of the inode (`moves`), so a flush that asked before it writes nothing and the
//!   inode is queued again;
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
use crate::chunk::{Chunk, PendingOp};
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
        if !chunk.attr.is_regular() || !chunk.attr.has(EntryFlags::BACKED) || chunk.cache.cutting {
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
            let identity = state.backend_identity;
            if identity.is_none() || self.backend.identity_of(from).map_err(io_errno)? != identity {
                return Ok(BackendMove::Cannot);
            }
            match self.backend.move_file(from, to) {
                Ok(()) => {}
                // The file is at `from` (its identity was just read there): what is missing
                // is `to`'s directory.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(BackendMove::NoDirectory),
                Err(error) => {
                    log::info!("{from} could not be moved to {to} in the backend ({error}): the rename takes the file's bytes along");
                    return Ok(BackendMove::Cannot);
                }
            }
            self.backend_changed();
        }
        let old = chunk.cache.clone();
        match link {
            Some(index) if !primary => chunk.cache.links[index].path = to.to_string(),
            _ => chunk.cache.backend_path = Some(to.to_string()),
        }
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
}
