//! Hard links in the cached tree.
//!
//! A file's inode knows where the file lives in the backend (`backend_path`: its data is
//! flushed there) and its other names in the cached tree (`CacheState::links`). The backend
//! gets each of those as a hard link to the backend file, made when the inode is next
//! flushed — after the file's own creation there, so that there is something to link to. A
//! name that goes is one link fewer in the backend (its removal is recorded at the name's
//! server, as for any removed name); when it was the name the data goes to, another name
//! takes over (`ChunkStore::drop_backend_name`). So after a sync the backend holds the same
//! files under the same names, with the same names sharing one file, as ringfs.

use super::{Cache, io_errno};
use crate::StoreError;
use crate::chunk::Chunk;
use crate::space::Space;

impl Cache {
    /// Makes the names of an inode's file that the backend does not have yet, as hard links
    /// to the file at its backend path (whatever is at those names is replaced: it was
    /// removed in ringfs). Called by `prepare`, after the inode's pending operation.
    pub(super) fn make_links(&self, space: &Space, chunk: &mut Chunk) -> Result<(), StoreError> {
        let Some(primary) = chunk.cache.backend_path.clone() else { return Ok(()) };
        if chunk.cache.links.iter().all(|link| link.made) {
            return Ok(());
        }
        if chunk.cache.links.iter().any(|link| !link.made && self.holds.covers(&link.path)) {
            // A directory rename holds the name's directory: made now, the link would make
            // that directory again where the backend moved it away (and the rename's removal
            // of the old name would take it away, link and all). It waits (EBUSY: `Held`).
            return Err(crate::StoreError::Fs(ringfs_proto::Errno::EBUSY));
        }
        let (identity, owner) = (chunk.cache.backend_identity, chunk.attr.file_id);
        for link in chunk.cache.links.iter_mut().filter(|link| !link.made) {
            // Linked only to the file's own backend file, checked on the descriptor it is
            // linked through: the path may be another file's now (a rename over this file
            // under way — that file's own link there may be made by another server's flush
            // before this inode hears that it lost the name). Then the links wait until the
            // inode knows where its file is.
            match self.backend.link_replacing(&primary, &link.path, owner, identity) {
                Ok(()) => link.made = true,
                Err(error) if error.raw_os_error() == Some(libc::EAGAIN) => return Err(crate::StoreError::BackendPlaceChanging),
                Err(error) => return Err(io_errno(error)),
            }
        }
        self.backend_changed();
        space.persist(chunk)
    }
}
