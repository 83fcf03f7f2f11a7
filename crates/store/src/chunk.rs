//! One chunk: its attributes, its bytes, and its state relative to the backend (cache mode).
//!
//! Chunk 0 of a file is its *inode*: it carries the file's attributes (type, mode, owner,
//! link count, times) and its first bytes, and counts the file's opens. Every chunk lives
//! behind its own mutex ([`ChunkHandle`]), which guards all of it: copying a chunk's bytes
//! never blocks other chunks.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

use ringfs_proto::{Attr, ChunkIndex, ChunkKey, EntryFlags};

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

/// A truncation under way: the file's size after it, and the truncation's time (a chunk
/// changed after it was written after the cut, and a cut finished late leaves it alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    pub len: u64,
    pub time_ns: i64,
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
/// | inode with a pending change  | chunk 0, `pending` set, `queued`                   | the flush that applies it (`prepare`)       |
/// | being cut                    | chunk 0, `Chunk::cut` set                          | `finish_cut` records the backend's cut      |
///
/// The inode of a file in the cached tree also knows where in the backend the file lives
/// (`backend_path`: the path it was created or found at, or renamed to); its data chunks ask
/// it before they are flushed. A file with no name left (unlinked while open) has none, and
/// its data is never flushed.
///
/// Invariants (checked by [`CacheState::check`]): a dirty chunk or one with a pending
/// change is queued or being flushed (the flusher clears `queued` when it takes the chunk and
/// queues it again if it changed); only chunks in the cached tree carry any of this state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CacheState {
    /// Chunk 0: the change of the entry that must reach the backend first.
    pub pending: Option<PendingOp>,
    /// The chunk is in the flush queue (it is queued at most once).
    pub queued: bool,
    /// The chunk is in the list of eviction candidates.
    pub listed_clean: bool,
    /// Chunk 0: where the file lives in the backend (see above).
    pub backend_path: Option<String>,
    /// Bumped when the file's place in the backend changes (a file rename's `rebind` and
    /// `redirty`) and when the chunk is cut ([`CacheState::note_cut`]): a flush under way,
    /// which learnt the place before, must not write nor mark the chunk clean. (Not kept
    /// across a restart: no flush survives one.)
    pub moves: u64,
    /// Chunk 0: the file's other names in the cached tree (hard links), which the backend
    /// gets as hard links to the file at `backend_path` (see `cache::links`).
    pub links: Vec<BackendLink>,
    /// Chunk 0: which backend file (device, inode) the file's data goes to — the one its
    /// creation made, or the one it was loaded from. A flush writes into nothing else: the
    /// path may have been given to another file meanwhile (a rename over this one under
    /// way). Kept in a `dir` store's chunk header: a restarted server that learnt it anew
    /// took whatever file was at the path for the file's own — after a rename over the file,
    /// the other file, whose bytes its links then shared (`cache.rs`
    /// `hard_links_…_while_servers_are_killed_and_restarted`).
    pub backend_identity: Option<(u64, u64)>,
    /// Chunk 0: a move of one of the file's backend names under way (`cache::moves`),
    /// recorded before the backend's `rename` and gone once the new place is recorded.
    pub moving: Option<MoveIntent>,
}

/// A move of a file's backend name from `from` to `to`, as recorded before the backend
/// renames the file (whose identity the record holds: a file is moved only when it is
/// known). After a restart the record still names `from`; where the file is tells whether
/// the move happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MoveIntent {
    pub from: String,
    pub to: String,
}

/// A backend record read back: the path, the backend file's identity, the other names and a
/// move under way.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct BackendRecord {
    pub path: String,
    pub identity: Option<(u64, u64)>,
    pub links: Vec<BackendLink>,
    pub moving: Option<MoveIntent>,
}

/// Another name of a file in the cached tree, and whether the backend has it yet (a hard
/// link to the backend file at the inode's `backend_path`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BackendLink {
    pub path: String,
    pub made: bool,
}

/// Longest backend record a `dir` store's chunk header holds (its length is a u16).
const MAX_BACKEND_RECORD: usize = u16::MAX as usize;

impl CacheState {
    /// The chunk was cut (a truncate, at the inode or at the last chunk kept). A flush under
    /// way that asked the inode where the file lives before the cut was recorded there must
    /// not write: its bytes, written after the cut, would land before the cut reaches the
    /// backend, and the cut would then take off what was written after it (soak seed 94679:
    /// a file rewritten with `O_TRUNC` had 0 bytes in the backend after a sync).
    pub fn note_cut(&mut self) {
        self.moves += 1;
    }

    /// Whether the entry has a change that must reach the backend before its data: a
    /// pending operation, or a name the backend does not have yet.
    pub fn has_pending_change(&self) -> bool {
        self.pending.is_some() || self.links.iter().any(|link| !link.made)
    }

    /// The file's place in the backend as a `dir` store's chunk header keeps it: the path;
    /// if known, a NUL, `=` and the backend file's identity as `DEV:INO`; for a move under
    /// way, a NUL, `<` and the old name, a NUL, `>` and the new name; then for each other name a NUL, `1` (made) or `0`, and the name. Names that do
    /// not fit the header are left out (logged): after a restart the backend keeps those it
    /// has.
    pub fn backend_record(&self) -> Option<std::borrow::Cow<'_, str>> {
        let path = self.backend_path.as_deref()?;
        if self.links.is_empty() && self.moving.is_none() && self.backend_identity.is_none() {
            // A file not in the backend yet: the path alone, as it is (no copy).
            return Some(std::borrow::Cow::Borrowed(path));
        }
        use std::fmt::Write;
        let mut record = path.to_string();
        // (Writing into a String cannot fail.)
        if let Some((dev, ino)) = self.backend_identity {
            let _ = write!(record, "\0={dev}:{ino}");
        }
        if let Some(MoveIntent { from, to }) = &self.moving {
            // (Two paths: always within the header's bound.)
            let _ = write!(record, "\0<{from}\0>{to}");
        }
        for link in &self.links {
            if record.len() + 2 + link.path.len() > MAX_BACKEND_RECORD {
                log::warn!("too many names in the cached tree to record for {record:?}: {} not kept across a restart", link.path);
                break;
            }
            record.push('\0');
            record.push(if link.made { '1' } else { '0' });
            record.push_str(&link.path);
        }
        Some(std::borrow::Cow::Owned(record))
    }

    /// Reads back a [`CacheState::backend_record`]; `None` if it is damaged (a path that is
    /// not canonical, half a move).
    pub fn parse_backend_record(record: &str) -> Option<BackendRecord> {
        let mut parts = record.split('\0');
        let path = parts.next()?.to_string();
        ringfs_proto::path::validate(&path).ok()?;
        let (mut links, mut identity, mut from, mut moved) = (Vec::new(), None, None, None);
        let numbers = |text: &str| -> Option<(u64, u64)> {
            let (dev, ino) = text.split_once(':')?;
            Some((dev.parse().ok()?, ino.parse().ok()?))
        };
        for part in parts {
            let (kind, rest) = part.split_at_checked(1)?;
            match kind {
                "=" => identity = Some(numbers(rest)?),
                "<" => from = Some(rest.to_string()),
                ">" => moved = Some(rest.to_string()),
                _ => links.push(BackendLink { path: rest.to_string(), made: kind == "1" }),
            }
        }
        let moving = match (from, moved) {
            (None, None) => None,
            (Some(from), Some(to)) => Some(MoveIntent { from, to }),
            _ => return None,
        };
        let paths =
            links.iter().map(|link| link.path.as_str()).chain(moving.iter().flat_map(|intent| [intent.from.as_str(), intent.to.as_str()]));
        for name in paths {
            ringfs_proto::path::validate(name).ok()?;
        }
        Some(BackendRecord { path, identity, links, moving })
    }

    /// Renames the file's backend name `from` (its path or one of its other names) to `to`.
    pub fn rename_backend_name(&mut self, from: &str, to: &str) {
        match self.links.iter_mut().find(|link| link.path == from) {
            Some(link) if self.backend_path.as_deref() != Some(from) => link.path = to.to_string(),
            _ => self.backend_path = Some(to.to_string()),
        }
    }

    /// Checks the invariants that hold whenever the chunk's lock is free (debug builds).
    pub fn check(&self, attr: &Attr) {
        if !attr.has(EntryFlags::BACKED) {
            debug_assert!(self.pending.is_none() && self.backend_path.is_none() && self.links.is_empty());
            debug_assert!(!attr.has(EntryFlags::DIRTY) && !attr.has(EntryFlags::BACKEND_DATA));
        }
    }
}

/// A file's extended attributes, by name (kept on its inode).
pub(crate) type Xattrs = BTreeMap<String, Vec<u8>>;

/// Bytes the extended attributes take, charged against the store's capacity.
pub(crate) fn xattr_bytes(xattrs: &Xattrs) -> u64 {
    xattrs.iter().map(|(name, value)| (name.len() + value.len()) as u64).sum()
}

/// How often a chunk has changed since it was loaded: a flush that read the chunk at one
/// version marks it clean only if it is still at that version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ChunkVersion(u64);

impl ChunkVersion {
    /// Counts a change.
    pub fn bump(&mut self) {
        self.0 = self.0.wrapping_add(1);
    }
}

pub(crate) struct Chunk {
    /// The chunk's index in its file (0: the inode); its file is `attr.file_id`.
    pub index: ChunkIndex,
    pub attr: Attr,
    pub body: Body,
    /// Set when the chunk has left the index; late writers must not touch it.
    pub removed: bool,
    /// An inode found unreferenced (no name, no open) and about to be deleted: set under the
    /// chunk's lock by the operation that decided it, so no open can be registered between
    /// that decision and the deletion.
    pub doomed: bool,
    /// Chunk 0: how many opens of the file are registered (see the server's open registry). A
    /// file whose last name is gone stays while this is not 0.
    pub opens: u32,
    /// Bumped by every change; a flush marks the chunk clean only if it did not move.
    pub version: ChunkVersion,
    /// Cache mode: see [`CacheState`].
    pub cache: CacheState,
    /// Chunk 0: a truncation whose cut of the file's later chunks (at their servers) has not
    /// ended. Recorded before the first of them is cut and kept in a `dir` store's header,
    /// so that the inode's server finishes it even after a crash half-way; until it ends, no
    /// chunk of a file in the cached tree is flushed (no data written meanwhile can reach the
    /// backend before the cut does).
    pub cut: Option<Cut>,
    /// Chunk 0: the file's extended attributes (none: `None`).
    pub xattrs: Option<Box<Xattrs>>,
    /// Chunk 0 of a directory whose mtime was set explicitly (`utimensat`) and not touched
    /// since: when it was set (its ctime then). A touch from before then must leave that
    /// mtime alone (see `ChunkStore::touch_dir`). In memory only: a restarted server
    /// forgets it.
    pub mtime_set_at_ns: Option<i64>,
}

impl Chunk {
    pub fn new(index: ChunkIndex, attr: Attr, body: Body, cache: CacheState) -> Chunk {
        Chunk {
            index,
            attr,
            body,
            removed: false,
            doomed: false,
            opens: 0,
            version: ChunkVersion::default(),
            cache,
            cut: None,
            xattrs: None,
            mtime_set_at_ns: None,
        }
    }

    pub fn key(&self) -> ChunkKey {
        ChunkKey { file: self.attr.file_id, index: self.index }
    }

    /// The file offset of this chunk's first byte.
    pub fn first_byte(&self) -> u64 {
        self.index.first_byte(self.attr.chunk_size.into())
    }

    /// Replaces the inode's extended attributes (none: empty), keeping
    /// [`EntryFlags::XATTRS`] in its attributes true to them.
    pub fn set_xattrs(&mut self, xattrs: Xattrs) {
        if xattrs.is_empty() {
            self.attr.flags &= !EntryFlags::XATTRS;
            self.xattrs = None;
        } else {
            self.attr.flags |= EntryFlags::XATTRS;
            self.xattrs = Some(Box::new(xattrs));
        }
    }

    /// An inode whose file has no name left and is not open: it goes.
    pub fn is_unreferenced(&self) -> bool {
        self.attr.nlink == 0 && self.opens == 0
    }

    /// Marks an unreferenced inode as about to be deleted (see `doomed`); true if it is.
    pub fn doom_if_unreferenced(&mut self) -> bool {
        if !self.removed && !self.doomed && self.is_unreferenced() {
            self.doomed = true;
        }
        self.doomed
    }

    /// Whether this chunk is gone or going.
    pub fn is_gone(&self) -> bool {
        self.removed || self.doomed
    }
}

pub(crate) type ChunkHandle = Arc<Mutex<Chunk>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backend_record_keeps_the_path_and_the_other_names() {
        let state = CacheState {
            backend_path: Some("/out/a".into()),
            links: vec![BackendLink { path: "/out/b".into(), made: true }, BackendLink { path: "/c d".into(), made: false }],
            ..CacheState::default()
        };
        let record = state.backend_record().unwrap();
        let parsed = |path: &str, links: &[BackendLink], moving: Option<MoveIntent>| {
            Some(BackendRecord { path: path.to_string(), identity: None, links: links.to_vec(), moving })
        };
        assert_eq!(CacheState::parse_backend_record(&record), parsed("/out/a", &state.links, None));
        assert_eq!(CacheState::parse_backend_record("/plain"), parsed("/plain", &[], None), "a record of older stores");
        assert_eq!(CacheState::parse_backend_record("/a\0"), None, "a damaged record");
        assert_eq!(CacheState::parse_backend_record("/a\u{0}1relative"), None);
        assert_eq!(CacheState::default().backend_record(), None);

        let intent = MoveIntent { from: "/out/b".into(), to: "/x:y/b".into() };
        let moving = CacheState { moving: Some(intent.clone()), ..state.clone() };
        let record = moving.backend_record().unwrap();
        assert_eq!(CacheState::parse_backend_record(&record), parsed("/out/a", &state.links, Some(intent)), "a move under way");
        assert_eq!(CacheState::parse_backend_record("/a\0</b"), None, "half a move");
        assert_eq!(CacheState::parse_backend_record("/a\0</b\0>c"), None, "a damaged new name");

        let known = CacheState { backend_identity: Some((2049, 5)), ..state.clone() };
        let record = known.backend_record().unwrap();
        let back = CacheState::parse_backend_record(&record).unwrap();
        assert_eq!((back.identity, back.links), (Some((2049, 5)), state.links.clone()), "the backend file's identity");
        assert_eq!(CacheState::parse_backend_record("/a\0=1:"), None, "a damaged identity");
    }
}
