//! One chunk: its attributes, its bytes, and its state relative to the backend (cache mode).
//!
//! Every chunk lives behind its own mutex ([`ChunkHandle`]), which guards all of it: copying
//! a chunk's bytes never blocks other chunks.

use std::sync::{Arc, Mutex, MutexGuard};

use ringfs_proto::{Attr, EntryFlags};

use crate::body::Body;

/// A change of an entry that must reach the backend before the entry's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PendingOp {
    /// The entry was created in ringfs: make it in the backend, replacing what is there.
    Create,
    /// The file was cut: cut the backend file to this length.
    Trim(u64),
}

impl PendingOp {
    /// The pending operation after the file is also cut to `len`.
    pub fn after_trim(current: Option<PendingOp>, len: u64) -> Option<PendingOp> {
        match current {
            Some(PendingOp::Create) => Some(PendingOp::Create),
            Some(PendingOp::Trim(earlier)) => Some(PendingOp::Trim(earlier.min(len))),
            None => Some(PendingOp::Trim(len)),
        }
    }
}

/// A chunk's state relative to the backend, in cache mode. With the attribute flags
/// [`EntryFlags::BACKED`] (the chunk lies in the cached tree), [`EntryFlags::DIRTY`] (changed
/// since last written to the backend), [`EntryFlags::BACKEND_DATA`] (its bytes are in the
/// backend, not here) and [`EntryFlags::IN_BACKEND`] (chunk 0: the entry exists in the
/// backend), these fields are all of it:
///
/// | state                        | flags and fields                                  | leaves by                                   |
/// |------------------------------|---------------------------------------------------|---------------------------------------------|
/// | loaded from the backend      | `BACKEND_DATA`, not `DIRTY`                        | first read or change: loaded, then *clean*  |
/// | clean                        | neither; `listed_clean` once an eviction candidate | change: *dirty*; eviction: *loaded*         |
/// | dirty                        | `DIRTY`, `queued` (or being flushed)               | flush of an unchanged version: *clean*      |
/// | entry with a pending change  | chunk 0, `pending` set, `queued`                   | the flush that applies it (`prepare_entry`) |
/// | being cut                    | chunk 0, `cutting`                                 | `cut_backend_file` records the cut          |
///
/// Invariants (checked by [`CacheState::check`]): a dirty chunk or one with a pending
/// change is queued or being flushed (the flusher clears `queued` when it takes the chunk and
/// queues it again if it changed); only chunks in the cached tree carry any of this state;
/// `BACKEND_DATA` chunks hold no bytes of their own beyond what is being loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CacheState {
    /// Chunk 0: the change of the entry that must reach the backend first.
    pub pending: Option<PendingOp>,
    /// The chunk is in the flush queue (it is queued at most once).
    pub queued: bool,
    /// The chunk is in the list of eviction candidates.
    pub listed_clean: bool,
    /// Chunk 0: a truncation is removing the file's chunks past its cut; the cut is recorded
    /// once they are gone. Until then no chunk of the file is flushed, so no data written
    /// meanwhile can reach the backend before the cut does.
    pub cutting: bool,
}

impl CacheState {
    /// Checks the invariants that hold whenever the chunk's lock is free (debug builds).
    pub fn check(&self, attr: &Attr) {
        if !attr.has(EntryFlags::BACKED) {
            debug_assert!(self.pending.is_none() && !self.cutting && !attr.has(EntryFlags::DIRTY | EntryFlags::BACKEND_DATA));
        }
    }
}

pub(crate) struct Chunk {
    pub attr: Attr,
    pub body: Body,
    /// Set when the chunk has left the index; late writers must not touch it.
    pub removed: bool,
    /// Chunk 0 of a directory being removed: lookups treat it as absent.
    pub rmdir_pending: bool,
    /// Bumped by every change; a flush marks the chunk clean only if it did not move.
    pub version: u64,
    /// Cache mode: see [`CacheState`].
    pub cache: CacheState,
}

impl Chunk {
    pub fn new(attr: Attr, body: Body, pending: Option<PendingOp>) -> Chunk {
        Chunk { attr, body, removed: false, rmdir_pending: false, version: 0, cache: CacheState { pending, ..CacheState::default() } }
    }
}

pub(crate) type ChunkHandle = Arc<Mutex<Chunk>>;

/// Locks a mutex, taking over the data if another thread panicked while holding it (a
/// request that panics must not take the whole server down).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
