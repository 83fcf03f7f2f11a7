//! Inode numbers for the kernel, file ids and paths for ringfs.
//!
//! The kernel names files by inode number. A file's inode number is the serial of its ringfs
//! file id (stable for the file's life, kept by renames and links; the root's is 1, which is
//! also FUSE's root inode). The table remembers, for every inode the kernel holds a reference
//! to, the file id — everything done to a file (open, stat, attribute changes) goes by id,
//! whatever happened to its names — and the path it was last seen at, which operations on
//! names inside a directory need. Lookups are counted so that `forget` can drop entries.
//! For a regular file it keeps the descriptor the mount holds open on it until `forget`
//! (from the lookup, or the first one the kernel released): the file stays alive for the
//! kernel, and the kernel's opens of it are made beside that descriptor, without a server.
//!
//! For a directory the table also keeps the attributes last read from ringfs, with the
//! changes of names this mount made in it since ([`InodeTable::directory_attr`]): the kernel
//! drops its copy of a directory's attributes at every create or removal in it and asks again
//! before the next one (for its permission check), and answering from here spares that
//! request to the servers — and spares the servers collecting the directory's held-back time
//! touches each time, which made every create in it wait for its touch. For every inode
//! it keeps whether the file had extended attributes when its attributes were last read:
//! the kernel asks for `security.capability` before every write, and a file with none is
//! answered here, as fresh as the attributes the kernel caches.
//!
//! # Answers the kernel applies late
//!
//! The kernel applies an answer's attributes in the requester's own time, after the mount
//! wrote it, and orders answers by when their *requests* started: an answer applied after
//! another request started makes the kernel ignore that request's answer. So a listing
//! (`READDIRPLUS`) read from the servers while another node's file was still empty, applied
//! while a lookup of the name it was just renamed to is under way, leaves the kernel with
//! size 0 and drops the lookup's true size: the file reads as empty for as long as the
//! listing said to keep it. The table therefore keeps, for every file (not directory), what
//! the attributes last handed to the kernel said ([`AttrStamp`]); an answer that says
//! something else marks the inode's attributes *stale* ([`InodeTable::read_attr`]), and the
//! mount has the kernel drop them before it answers: an answer whose request started before
//! that drop is then ignored whenever it arrives, and the kernel asks again. If the kernel
//! does not hold the inode yet (the answers handing it over are both on their way), the
//! drop is tried again until it does ([`crate::kernel`]), and an open of the inode makes it
//! first. Changes this mount makes itself need none of this: the kernel orders them after
//! the answers it asked for before ([`InodeTable::changed_here`]).

use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use fuser::FileAttr;
use ringfs_client::{Errno, Fd, FileId};

/// FUSE's root inode number (and ringfs's root file id).
pub const ROOT_INODE: u64 = 1;

struct Entry {
    file: FileId,
    path: String,
    lookups: u64,
    /// A descriptor the mount keeps open on the regular file, closed when the kernel
    /// forgets the inode: it keeps the file alive for the kernel (which may open it by inode
    /// after its names went), and the kernel's opens are made beside it without a round
    /// trip (see `ringfs_client::Client::open_beside`).
    held: Option<Fd>,
    /// A directory's attributes as read from ringfs at that instant, changed since by what
    /// this mount did in it.
    directory: Option<(FileAttr, Instant)>,
    /// When the attributes read last said the file has no extended attributes.
    no_xattrs_since: Option<Instant>,
    /// A directory made through this mount in which every change of names came through it
    /// too (as far as the watch knows): how many of its names have each hash.
    names: Option<HashMap<u64, u32>>,
    /// What the attributes last handed to the kernel said (of a file, not a directory).
    told: Option<AttrStamp>,
    /// Set to a generation while the kernel may hold attributes of the file older than the
    /// last it was handed, until a drop of them reaches it (0: not stale).
    stale: u64,
}

impl Entry {
    fn new(file: FileId, path: String, lookups: u64) -> Entry {
        Entry { file, path, lookups, held: None, directory: None, no_xattrs_since: None, names: None, told: None, stale: 0 }
    }
}

/// How an answer hands attributes to the kernel ([`InodeTable::read_attr`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handing {
    /// With an inode (a lookup, a listing's entry, a create): a drop of the inode's
    /// attributes before the answer costs the kernel one `GETATTR` at most.
    WithInode,
    /// As the answer to the kernel's own `GETATTR`: a drop before it would make the kernel
    /// ignore it, and the call that asked would use the attributes it held before.
    ToGetattr,
}

/// What came of [`InodeTable::drop_if_stale`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaleDrop {
    /// The kernel dropped the attributes; the mark went.
    Dropped,
    /// The kernel does not hold the inode (yet): the mark stays.
    NotHeld,
    /// The inode bears no such mark (any more).
    NotStale,
}

/// What the kernel may show of a file that could change elsewhere (not its access time:
/// the mount is `noatime`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttrStamp {
    size: u64,
    mtime: SystemTime,
    ctime: SystemTime,
    perm: u16,
    nlink: u32,
    uid: u32,
    gid: u32,
}

impl AttrStamp {
    fn of(attr: &FileAttr) -> AttrStamp {
        AttrStamp {
            size: attr.size,
            mtime: attr.mtime,
            ctime: attr.ctime,
            perm: attr.perm,
            nlink: attr.nlink,
            uid: attr.uid,
            gid: attr.gid,
        }
    }
}

/// Most names a directory's [`Entry::names`] counts (beyond, it is dropped).
const MOST_KNOWN_NAMES: usize = 2_000_000;

fn name_hash(name: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut hasher);
    hasher.finish()
}

/// Most names the table remembers the kernel was told are missing (beyond, no more are
/// cached: see [`InodeTable::note_missing`]).
const MOST_MISSING: usize = 100_000;

/// The inodes the kernel knows, and the inode last seen at each path.
#[derive(Default)]
struct Inodes {
    entries: HashMap<u64, Entry>,
    /// Invariant: `by_path[p] == i` only if `entries[i].path == p`.
    by_path: HashMap<String, u64>,
    /// The inodes in each directory, by the directory's path: `children[d]` holds `i` exactly
    /// when `entries[i].path`'s parent is `d` (a lock grant's names beside).
    children: HashMap<String, HashSet<u64>>,
    /// Every `(entries[i].path, i)`, in order: a tree's paths are one range of it (a
    /// rename's moves). Neither index makes an operation scan every entry (the kernel may
    /// hold millions), and neither needs a tree's directories to be known.
    sorted: BTreeSet<(String, u64)>,
    /// Names the kernel was told are missing (in a directory, by inode), and when: the
    /// kernel caches those too, and only they can be told to drop them.
    missing: HashMap<(u64, String), Instant>,
    /// The last generation given to a stale mark ([`Entry::stale`]).
    stale_marks: u64,
}

impl Inodes {
    /// Gives `inode`'s attributes a new stale mark: its generation (`None` for an inode the
    /// table does not know).
    fn mark_stale(&mut self, inode: u64) -> Option<u64> {
        let entry = self.entries.get_mut(&inode)?;
        self.stale_marks += 1;
        entry.stale = self.stale_marks;
        Some(self.stale_marks)
    }

    /// Points `inode`'s path to `path` (and the indexes with it).
    fn move_to(&mut self, inode: u64, path: String) {
        let Some(entry) = self.entries.get_mut(&inode) else { return };
        let old = std::mem::replace(&mut entry.path, path.clone());
        self.unindex(inode, old);
        self.by_path.insert(path.clone(), inode);
        if let Some(parent) = ringfs_proto::path::parent(&path) {
            match self.children.get_mut(parent) {
                Some(inodes) => {
                    inodes.insert(inode);
                }
                None => {
                    self.children.insert(parent.to_string(), HashSet::from([inode]));
                }
            }
        }
        self.sorted.insert((path, inode));
    }

    /// Takes `inode`, which was at `path`, out of the indexes.
    fn unindex(&mut self, inode: u64, path: String) {
        if self.by_path.get(&path) == Some(&inode) {
            self.by_path.remove(&path);
        }
        if let Some(parent) = ringfs_proto::path::parent(&path)
            && let Some(inodes) = self.children.get_mut(parent)
        {
            inodes.remove(&inode);
            if inodes.is_empty() {
                self.children.remove(parent);
            }
        }
        // (The path's own allocation is the key looked up: none is made.)
        self.sorted.remove(&(path, inode));
    }

    /// The inodes at `root` and below it: the paths equal to `root`, then those that begin
    /// with `root/` (and sort before `root0`, `0` following `/`).
    fn at_or_below(&self, root: &str) -> Vec<u64> {
        let at = self.sorted.range((root.to_string(), 0)..=(root.to_string(), u64::MAX));
        let inside = if root == "/" {
            self.sorted.range(("/".to_string(), 0)..)
        } else {
            self.sorted.range((format!("{root}/"), 0)..(format!("{root}0"), 0))
        };
        let mut found: Vec<u64> = at.chain(inside).map(|(_, inode)| *inode).collect();
        found.dedup();
        found
    }
}

/// Where `path` is after a rename of `old` to `new`: `None` unless it is `old` or below it.
pub(crate) fn moved(path: &str, old: &str, new: &str) -> Option<String> {
    if path == old {
        Some(new.to_string())
    } else if ringfs_proto::path::is_inside(path, old) {
        Some(format!("{new}{}", &path[old.len()..]))
    } else {
        None
    }
}

/// The paths of the inodes the kernel knows.
pub struct InodeTable {
    inodes: Mutex<Inodes>,
}

impl Default for InodeTable {
    fn default() -> Self {
        let mut inodes = Inodes::default();
        inodes.entries.insert(ROOT_INODE, Entry::new(FileId::ROOT, "/".into(), 1));
        inodes.by_path.insert("/".into(), ROOT_INODE);
        inodes.sorted.insert(("/".into(), ROOT_INODE));
        InodeTable { inodes: Mutex::new(inodes) }
    }
}

impl InodeTable {
    fn inodes(&self) -> parking_lot::MutexGuard<'_, Inodes> {
        self.inodes.lock()
    }

    /// The inode last seen at `path`, if the kernel still knows it there.
    pub fn inode_at(&self, path: &str) -> Option<u64> {
        self.inodes().by_path.get(path).copied()
    }

    /// Every inode the kernel knows, with the path it was last seen at.
    pub fn all(&self) -> Vec<(u64, String)> {
        self.inodes().entries.iter().map(|(inode, entry)| (*inode, entry.path.clone())).collect()
    }

    /// The kernel is told that `name` is missing in `directory`, to be kept for `valid_for`;
    /// `false` if the table keeps too many such names already (then the kernel must not
    /// cache it).
    pub fn note_missing(&self, directory: u64, name: &str, valid_for: Duration) -> bool {
        let mut inodes = self.inodes();
        if inodes.missing.len() >= MOST_MISSING {
            // (Those the kernel has dropped by now need no telling.)
            inodes.missing.retain(|_, told| told.elapsed() < valid_for);
            if inodes.missing.len() >= MOST_MISSING {
                return false;
            }
        }
        inodes.missing.insert((directory, name.to_string()), Instant::now());
        true
    }

    /// The names the kernel was told are missing, forgotten here (the caller has the kernel
    /// drop them).
    pub fn take_missing(&self) -> Vec<(u64, String)> {
        self.inodes().missing.drain().map(|(name, _)| name).collect()
    }

    /// The path an inode was last seen at; ESTALE if the kernel names one it was never given.
    pub fn path(&self, inode: u64) -> Result<String, Errno> {
        self.inodes().entries.get(&inode).map(|entry| entry.path.clone()).ok_or(Errno::ESTALE)
    }

    /// The file id of an inode; ESTALE if the kernel names one it was never given.
    pub fn file(&self, inode: u64) -> Result<FileId, Errno> {
        self.inodes().entries.get(&inode).map(|entry| entry.file).ok_or(Errno::ESTALE)
    }

    /// The directory holding `inode` (by the path it was last seen at) and the names in it
    /// the kernel knows: the names a lock on `inode` revalidates (see the lock handlers).
    /// `None` if the directory's inode is not known.
    pub fn names_beside(&self, inode: u64) -> Option<(u64, Vec<String>)> {
        let inodes = self.inodes();
        let path = &inodes.entries.get(&inode)?.path;
        let directory = ringfs_proto::path::parent(path)?;
        let directory_inode = *inodes.by_path.get(directory)?;
        let mut names: Vec<String> = inodes
            .children
            .get(directory)
            .into_iter()
            .flatten()
            .filter_map(|inode| inodes.entries.get(inode))
            .map(|entry| ringfs_proto::path::file_name(&entry.path).to_string())
            .collect();
        // (Two inodes may have been seen at one name: the kernel is told once.)
        names.sort_unstable();
        names.dedup();
        Some((directory_inode, names))
    }

    /// Records that the kernel received the inode of `file` for `path` (one more lookup).
    /// With `held`, the caller opened the file for this lookup: the table keeps one such
    /// descriptor per inode, and returns the one that is surplus (to close): the caller's,
    /// or the one kept for another file that had the inode number before.
    pub fn remember(&self, file: FileId, path: &str, held: Option<Fd>) -> Option<Fd> {
        let mut inodes = self.inodes();
        let inode = file.ino();
        let known = inodes.entries.get(&inode).map(|entry| entry.path == path);
        if known.is_none() {
            inodes.entries.insert(inode, Entry::new(file, String::new(), 0));
        }
        if known != Some(true) {
            // New, or renamed or linked (by anyone): the file id stays, the name changes.
            inodes.move_to(inode, path.to_string());
        }
        let entry = inodes.entries.get_mut(&inode).expect("inserted above");
        if known == Some(false) {
            // Moved by someone else: news of its names under the new path may have been
            // missed.
            entry.names = None;
        }
        let replaced = entry.file != file;
        if replaced {
            // (What the kernel was told was of another file.)
            entry.told = None;
        }
        entry.file = file;
        entry.lookups += 1;
        if replaced {
            // (Another file now has this inode number: the descriptor kept is not its.)
            return std::mem::replace(&mut entry.held, held);
        }
        if entry.held.is_some() {
            return held;
        }
        entry.held = held;
        None
    }

    /// The descriptor the mount keeps open on `inode`'s file, if any.
    pub fn held(&self, inode: u64) -> Option<Fd> {
        self.inodes().entries.get(&inode).and_then(|entry| entry.held)
    }

    /// Keeps `fd` (open on `inode`'s file, its open registered at the servers) as the
    /// inode's held descriptor if it has none: `false` if it has one, or the inode is not
    /// known (then the caller closes `fd`).
    pub fn keep(&self, inode: u64, fd: Fd) -> bool {
        let mut inodes = self.inodes();
        let Some(entry) = inodes.entries.get_mut(&inode).filter(|entry| entry.held.is_none() && inode != ROOT_INODE) else {
            return false;
        };
        entry.held = Some(fd);
        true
    }

    /// The kernel dropped `count` references to `inode`. Returns the descriptor the mount
    /// must close, when the last one went.
    pub fn forget(&self, inode: u64, count: u64) -> Option<Fd> {
        if inode == ROOT_INODE {
            return None;
        }
        let mut inodes = self.inodes();
        let entry = inodes.entries.get_mut(&inode)?;
        entry.lookups = entry.lookups.saturating_sub(count);
        if entry.lookups > 0 {
            return None;
        }
        let entry = inodes.entries.remove(&inode)?;
        inodes.unindex(inode, entry.path);
        entry.held
    }

    /// Attributes of `attr.ino` (an inode the kernel holds) just read from ringfs for an
    /// answer that hands them to the kernel as `handing` says, and whether the file has
    /// extended attributes. `Some(generation)` if an answer handing over an inode says other
    /// attributes than the kernel was handed last, which it may still apply after these
    /// (see "Answers the kernel applies late"): the caller has the kernel drop the inode's
    /// attributes before it answers ([`crate::kernel::KernelDrops::stale_attributes`]).
    pub fn read_attr(&self, attr: &FileAttr, has_xattrs: bool, handing: Handing) -> Option<u64> {
        let mut inodes = self.inodes();
        let entry = inodes.entries.get_mut(&attr.ino.0)?;
        let now = Instant::now();
        entry.no_xattrs_since = (!has_xattrs).then_some(now);
        if attr.kind == fuser::FileType::Directory {
            entry.directory = Some((*attr, now));
            return None;
        }
        let stamp = AttrStamp::of(attr);
        let differs = entry.told.replace(stamp).is_some_and(|told| told != stamp);
        (differs && handing == Handing::WithInode).then(|| inodes.mark_stale(attr.ino.0)).flatten()
    }

    /// This mount changed `inode`'s file through the kernel (a write, a truncation, an
    /// attribute change): the kernel orders its own changes after the answers it asked for
    /// before, so the attributes it was handed before no longer count.
    pub fn changed_here(&self, inode: u64) {
        if let Some(entry) = self.inodes().entries.get_mut(&inode) {
            entry.told = None;
        }
    }

    /// Marks the attributes of `inode` stale (a drop of them did not reach the kernel, which
    /// does not hold the inode yet): the generation of the mark, if the table knows the inode.
    pub fn mark_attributes_stale(&self, inode: u64) -> Option<u64> {
        self.inodes().mark_stale(inode)
    }

    /// The generation of the stale mark on `inode`'s attributes, if it has one (its open
    /// has the kernel drop them first).
    pub fn attributes_stale(&self, inode: u64) -> Option<u64> {
        self.inodes().entries.get(&inode).map(|entry| entry.stale).filter(|stale| *stale != 0)
    }

    /// Has the kernel drop `inode`'s attributes with `drop` (`Ok(false)`: the kernel does
    /// not hold the inode) if the inode still bears the stale mark `generation`, and takes
    /// the mark off once the drop reached the kernel. Checked and dropped under the table's
    /// lock, so that no drop for an old mark reaches the kernel after the mark went: the
    /// kernel ignores the answer to a `GETATTR` under way when a drop comes, and the call
    /// that asked (a read after an open) would use the attributes it held.
    pub fn drop_if_stale(&self, inode: u64, generation: u64, drop: impl FnOnce() -> std::io::Result<bool>) -> std::io::Result<StaleDrop> {
        let mut inodes = self.inodes();
        let Some(entry) = inodes.entries.get_mut(&inode).filter(|entry| entry.stale == generation) else {
            return Ok(StaleDrop::NotStale);
        };
        if !drop()? {
            return Ok(StaleDrop::NotHeld);
        }
        entry.stale = 0;
        Ok(StaleDrop::Dropped)
    }

    /// Whether `inode` had no extended attributes when its attributes were read, less than
    /// `valid_for` ago.
    pub fn has_no_xattrs(&self, inode: u64, valid_for: Duration) -> bool {
        let inodes = self.inodes();
        inodes.entries.get(&inode).and_then(|entry| entry.no_xattrs_since).is_some_and(|since| since.elapsed() < valid_for)
    }

    /// The attributes of directory `inode` read from ringfs less than `valid_for` ago, with
    /// the changes made through this mount since, and how much longer they are valid.
    pub fn directory_attr(&self, inode: u64, valid_for: Duration) -> Option<(FileAttr, Duration)> {
        let (attr, read_at) = self.inodes().entries.get(&inode)?.directory?;
        let remaining = valid_for.checked_sub(read_at.elapsed()).filter(|remaining| !remaining.is_zero())?;
        Some((attr, remaining))
    }

    /// This mount created or removed names in `directory` at `time` (`subdirectories`: how
    /// many more it has now): its times and link count change as ringfs changes them.
    pub fn names_changed(&self, directory: u64, time: SystemTime, subdirectories: i32) {
        let mut inodes = self.inodes();
        if let Some((attr, _)) = inodes.entries.get_mut(&directory).and_then(|entry| entry.directory.as_mut()) {
            attr.mtime = attr.mtime.max(time);
            attr.ctime = attr.ctime.max(time);
            attr.nlink = attr.nlink.saturating_add_signed(subdirectories).max(2);
        }
    }

    /// Directory `inode` was just made, empty, through this mount: from now on the table
    /// follows every name in it, until a change of names elsewhere is seen there.
    pub fn made_directory(&self, inode: u64) {
        if let Some(entry) = self.inodes().entries.get_mut(&inode) {
            entry.names = Some(HashMap::new());
        }
    }

    /// This mount gave `directory` the name `name`.
    pub fn name_added(&self, directory: u64, name: &str) {
        let mut inodes = self.inodes();
        let Some(entry) = inodes.entries.get_mut(&directory) else { return };
        let Some(names) = entry.names.as_mut() else { return };
        if names.len() >= MOST_KNOWN_NAMES {
            entry.names = None;
            return;
        }
        *names.entry(name_hash(name)).or_default() += 1;
    }

    /// This mount removed the name `name` from `directory`.
    pub fn name_removed(&self, directory: u64, name: &str) {
        let mut inodes = self.inodes();
        let Some(names) = inodes.entries.get_mut(&directory).and_then(|entry| entry.names.as_mut()) else { return };
        let hash = name_hash(name);
        if let Some(count) = names.get_mut(&hash) {
            *count -= 1;
            if *count == 0 {
                names.remove(&hash);
            }
        }
    }

    /// Whether `directory` surely has no name `name`: every change of names in it came
    /// through this mount, and none gave it that name (or one of the same hash).
    pub fn surely_missing(&self, directory: u64, name: &str) -> bool {
        let inodes = self.inodes();
        let names = inodes.entries.get(&directory).and_then(|entry| entry.names.as_ref());
        names.is_some_and(|names| !names.contains_key(&name_hash(name)))
    }

    /// A listing of `directory` read from the servers showed `names`: if the table's account
    /// of its names lacks one of them (made elsewhere, not yet told by the watch), the
    /// account goes.
    pub fn listed<'a>(&self, directory: u64, mut names: impl Iterator<Item = &'a str>) {
        let mut inodes = self.inodes();
        let Some(entry) = inodes.entries.get_mut(&directory) else { return };
        if entry.names.as_ref().is_some_and(|known| names.any(|name| !known.contains_key(&name_hash(name)))) {
            entry.names = None;
        }
    }

    /// Names in `directory` changed in a way the table does not follow (elsewhere, or an
    /// outcome not known).
    pub fn lose_names(&self, directory: u64) {
        if let Some(entry) = self.inodes().entries.get_mut(&directory) {
            entry.names = None;
        }
    }

    /// The attributes kept for `inode` no longer hold (it changed in a way this table does
    /// not follow: a rename, an extended attribute set or removed, a change elsewhere).
    pub fn forget_attr(&self, inode: u64) {
        if let Some(entry) = self.inodes().entries.get_mut(&inode) {
            entry.directory = None;
            entry.no_xattrs_since = None;
        }
    }

    /// A rename through this mount: every inode at `from` or below now lives under `to`;
    /// with `exchange`, those at `to` or below under `from` too.
    pub fn renamed(&self, from: &str, to: &str, exchange: bool) {
        let mut inodes = self.inodes();
        let mut candidates = inodes.at_or_below(from);
        if exchange {
            candidates.extend(inodes.at_or_below(to));
        }
        let moves: Vec<(u64, String)> = candidates
            .into_iter()
            .filter_map(|inode| {
                let path = &inodes.entries.get(&inode)?.path;
                let path = moved(path, from, to).or_else(|| if exchange { moved(path, to, from) } else { None });
                path.map(|path| (inode, path))
            })
            .collect();
        for (inode, path) in moves {
            if let Some(entry) = inodes.entries.get_mut(&inode) {
                // (A moved directory's ctime changed.)
                entry.directory = None;
            }
            // (An index entry of another inode moved here in the same rename is left alone.)
            inodes.move_to(inode, path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_are_counted_until_forgotten() {
        let table = InodeTable::default();
        assert_eq!(table.path(ROOT_INODE).unwrap(), "/");
        assert_eq!(table.file(ROOT_INODE).unwrap(), FileId::ROOT);
        assert_eq!(table.remember(file(7), "/a", Some(Fd(3))), None);
        assert_eq!(table.remember(file(7), "/a", Some(Fd(4))), Some(Fd(4)), "one descriptor per inode: the second is surplus");
        assert_eq!(table.held(7), Some(Fd(3)));
        assert_eq!(table.file(7).unwrap(), file(7));
        assert_eq!(table.forget(7, 1), None);
        assert_eq!(table.path(7).unwrap(), "/a");
        assert_eq!(table.forget(7, 1), Some(Fd(3)), "the last forget gives the descriptor back");
        assert_eq!(table.path(7), Err(Errno::ESTALE));
        table.forget(ROOT_INODE, 100);
        assert!(table.path(ROOT_INODE).is_ok());
    }

    #[test]
    fn the_first_descriptor_released_on_an_inode_without_one_is_kept_until_forgotten() {
        let table = InodeTable::default();
        table.remember(file(7), "/a", None);
        assert_eq!(table.held(7), None, "created here: no descriptor kept yet");
        assert!(table.keep(7, Fd(5)));
        assert!(!table.keep(7, Fd(6)), "one per inode: the caller closes the second");
        assert!(!table.keep(8, Fd(6)), "an inode the kernel does not hold");
        assert!(!table.keep(ROOT_INODE, Fd(6)));
        assert_eq!(table.remember(file(7), "/a", Some(Fd(9))), Some(Fd(9)));
        assert_eq!(table.forget(7, 2), Some(Fd(5)));
        table.remember(file(8), "/b", Some(Fd(2)));
        let other = FileId { anchor: 10, serial: 8 };
        assert_eq!(table.remember(other, "/b", None), Some(Fd(2)), "kept for the file that had the number before");
        assert_eq!(table.held(8), None);
    }

    fn attr_of(inode: u64, kind: fuser::FileType, size: u64) -> FileAttr {
        let time = SystemTime::UNIX_EPOCH;
        FileAttr {
            ino: fuser::INodeNo(inode),
            size,
            blocks: 0,
            atime: time,
            mtime: time,
            ctime: time,
            crtime: time,
            kind,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    #[test]
    fn attributes_other_than_the_last_handed_to_the_kernel_mark_them_stale_until_dropped() {
        let table = InodeTable::default();
        let regular = fuser::FileType::RegularFile;
        assert_eq!(table.read_attr(&attr_of(7, regular, 0), false, Handing::WithInode), None, "an inode the kernel was not handed");
        table.remember(file(7), "/d/.tmp", None);
        assert_eq!(table.read_attr(&attr_of(7, regular, 0), false, Handing::WithInode), None, "the first answer");
        assert_eq!(table.read_attr(&attr_of(7, regular, 0), false, Handing::WithInode), None, "the same again");
        // Written and renamed elsewhere: the lookup of the new name says otherwise.
        table.remember(file(7), "/d/name", None);
        let generation =
            table.read_attr(&attr_of(7, regular, 5000), false, Handing::WithInode).expect("the listing's size 0 may come after it");
        assert_eq!(table.attributes_stale(7), Some(generation));
        assert_eq!(table.read_attr(&attr_of(7, regular, 5000), false, Handing::WithInode), None, "nothing new to drop");
        assert_eq!(table.drop_if_stale(7, generation, || Ok(false)).unwrap(), StaleDrop::NotHeld);
        assert_eq!(table.attributes_stale(7), Some(generation), "kept until the kernel holds the inode");
        assert_eq!(table.drop_if_stale(7, generation, || Ok(true)).unwrap(), StaleDrop::Dropped);
        assert_eq!(table.attributes_stale(7), None);
        // The kernel's own GETATTR is answered without a drop (it would ignore its answer).
        assert_eq!(table.read_attr(&attr_of(7, regular, 5500), false, Handing::ToGetattr), None);
        // A later mark stands until its own drop.
        let first = table.mark_attributes_stale(7).unwrap();
        let second = table.read_attr(&attr_of(7, regular, 6000), false, Handing::WithInode).unwrap();
        let unsent = table.drop_if_stale(7, first, || panic!("no drop for a mark replaced by another")).unwrap();
        assert_eq!(unsent, StaleDrop::NotStale);
        assert_eq!(table.attributes_stale(7), Some(second), "an older mark's drop does not clear a newer mark");
        assert_eq!(table.drop_if_stale(7, second, || Ok(true)).unwrap(), StaleDrop::Dropped);
        // The kernel orders this mount's own changes itself.
        table.changed_here(7);
        assert_eq!(table.read_attr(&attr_of(7, regular, 9000), false, Handing::WithInode), None);
        // Directories are answered from what the table keeps of them, not marked.
        table.remember(file(8), "/d", None);
        let directory = fuser::FileType::Directory;
        table.read_attr(&attr_of(8, directory, 1), false, Handing::WithInode);
        assert_eq!(table.read_attr(&attr_of(8, directory, 2), false, Handing::WithInode), None);
        assert_eq!(table.mark_attributes_stale(9), None, "an inode the table does not know");
        let third = table.mark_attributes_stale(7).unwrap();
        table.forget(7, 2);
        assert_eq!(table.drop_if_stale(7, third, || Ok(false)).unwrap(), StaleDrop::NotStale, "forgotten: nothing left to drop");
    }

    #[test]
    fn renames_move_paths_below_too() {
        let table = InodeTable::default();
        assert_eq!(table.inode_at("/"), Some(ROOT_INODE));
        table.remember(file(2), "/d", None);
        table.remember(file(3), "/d/f", None);
        table.remember(file(4), "/dx", None);
        table.renamed("/d", "/e", false);
        assert_eq!(table.path(2).unwrap(), "/e");
        assert_eq!(table.path(3).unwrap(), "/e/f");
        assert_eq!(table.path(4).unwrap(), "/dx");
        // A lookup under a new name (renamed elsewhere) updates the path.
        table.remember(file(3), "/g", None);
        assert_eq!(table.path(3).unwrap(), "/g");
        // An exchange swaps both trees.
        table.remember(file(5), "/dx/y", None);
        table.renamed("/e", "/dx", true);
        assert_eq!(table.path(2).unwrap(), "/dx");
        assert_eq!(table.path(4).unwrap(), "/e");
        assert_eq!(table.path(5).unwrap(), "/e/y");
        // The index of paths follows.
        assert_eq!((table.inode_at("/dx"), table.inode_at("/e"), table.inode_at("/e/y")), (Some(2), Some(4), Some(5)));
        assert_eq!(table.inode_at("/d"), None);
        table.forget(4, 1);
        assert_eq!(table.inode_at("/e"), None);
        // A name given to another file points to it; forgetting the old one keeps that.
        table.remember(file(6), "/g", None);
        assert_eq!(table.inode_at("/g"), Some(6));
        table.forget(3, 1);
        assert_eq!(table.inode_at("/g"), Some(6));
    }

    #[test]
    fn a_directorys_attributes_follow_this_mounts_changes_until_they_expire() {
        let table = InodeTable::default();
        table.remember(file(2), "/d", None);
        let read = FileAttr { ino: fuser::INodeNo(2), kind: fuser::FileType::Directory, nlink: 3, ..attr() };
        table.read_attr(&read, false, Handing::ToGetattr);
        let later = SystemTime::UNIX_EPOCH + Duration::from_secs(50);
        table.names_changed(2, later, 1);
        let (kept, remaining) = table.directory_attr(2, Duration::from_secs(1)).unwrap();
        assert_eq!((kept.mtime, kept.ctime, kept.nlink), (later, later, 4));
        assert!(remaining <= Duration::from_secs(1));
        table.names_changed(2, SystemTime::UNIX_EPOCH, -5);
        let (kept, _) = table.directory_attr(2, Duration::from_secs(1)).unwrap();
        assert_eq!((kept.mtime, kept.nlink), (later, 2), "times never go back; at least 2 links");
        assert!(table.directory_attr(2, Duration::ZERO).is_none(), "expired");
        table.renamed("/d", "/e", false);
        assert!(table.directory_attr(2, Duration::from_secs(1)).is_none(), "a moved directory is read again");
        table.read_attr(&FileAttr { kind: fuser::FileType::RegularFile, ..read }, false, Handing::ToGetattr);
        assert!(table.directory_attr(2, Duration::from_secs(1)).is_none(), "files are not kept");
    }

    #[test]
    fn a_file_without_extended_attributes_is_known_so_until_the_attributes_expire() {
        let table = InodeTable::default();
        table.remember(file(3), "/f", None);
        assert!(!table.has_no_xattrs(3, Duration::from_secs(1)), "nothing known yet");
        let read = FileAttr { ino: fuser::INodeNo(3), ..attr() };
        table.read_attr(&read, false, Handing::ToGetattr);
        assert!(table.has_no_xattrs(3, Duration::from_secs(1)));
        assert!(!table.has_no_xattrs(3, Duration::ZERO), "expired");
        table.forget_attr(3);
        assert!(!table.has_no_xattrs(3, Duration::from_secs(1)), "set through this mount since");
        table.read_attr(&read, true, Handing::ToGetattr);
        assert!(!table.has_no_xattrs(3, Duration::from_secs(1)));
    }

    #[test]
    fn a_directory_made_here_knows_which_names_it_surely_lacks_until_changed_elsewhere() {
        let table = InodeTable::default();
        table.remember(file(2), "/d", None);
        assert!(!table.surely_missing(2, "a"), "a directory looked up: anything may be in it");
        table.made_directory(2);
        assert!(table.surely_missing(2, "a"));
        table.name_added(2, "a");
        table.name_added(2, "a");
        assert!(!table.surely_missing(2, "a") && table.surely_missing(2, "b"));
        table.name_removed(2, "a");
        assert!(!table.surely_missing(2, "a"), "counted twice (a replacing rename), removed once");
        table.name_removed(2, "a");
        assert!(table.surely_missing(2, "a"));
        table.lose_names(2);
        assert!(!table.surely_missing(2, "b"), "changed elsewhere");
        table.made_directory(2);
        table.remember(file(2), "/moved", None);
        assert!(!table.surely_missing(2, "b"), "moved by someone else");
        table.made_directory(2);
        table.name_added(2, "a");
        table.listed(2, ["a"].into_iter());
        assert!(table.surely_missing(2, "b"), "a listing of names it knows");
        table.listed(2, ["a", "b"].into_iter());
        assert!(!table.surely_missing(2, "c"), "a listing showed a name made elsewhere, not told yet");
    }

    fn attr() -> FileAttr {
        let time = SystemTime::UNIX_EPOCH + Duration::from_secs(10);
        FileAttr {
            ino: fuser::INodeNo(0),
            size: 0,
            blocks: 0,
            atime: time,
            mtime: time,
            ctime: time,
            crtime: time,
            kind: fuser::FileType::RegularFile,
            perm: 0o755,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn file(serial: u64) -> FileId {
        FileId { anchor: 9, serial }
    }

    impl InodeTable {
        /// Panics unless the indexes say what a scan of every entry says.
        fn check_indexes(&self) {
            let inodes = self.inodes();
            let mut children: HashMap<String, HashSet<u64>> = HashMap::new();
            for (inode, entry) in &inodes.entries {
                if let Some(parent) = ringfs_proto::path::parent(&entry.path) {
                    children.entry(parent.to_string()).or_default().insert(*inode);
                }
            }
            assert_eq!(inodes.children, children, "the directories' index");
            let sorted: BTreeSet<(String, u64)> =
                inodes.entries.iter().map(|(inode, entry)| (entry.path.clone(), *inode)).filter(|(path, _)| !path.is_empty()).collect();
            assert_eq!(inodes.sorted, sorted, "the sorted paths");
            for (path, inode) in &inodes.by_path {
                assert_eq!(&inodes.entries[inode].path, path, "the paths' index");
            }
        }
    }

    /// Random lookups, renames (of files and trees, exchanges too) and forgets on a small
    /// tree of names, against a model that moves every path by scanning them all.
    #[test]
    fn renames_and_lock_neighbours_agree_with_a_scan_of_every_entry() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut random = |below: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below
        };
        let components = ["a", "b", "c"];
        let random_path = |random: &mut dyn FnMut(u64) -> u64| {
            let depth = 1 + random(3);
            (0..depth).map(|_| format!("/{}", components[random(3) as usize])).collect::<String>()
        };
        let table = InodeTable::default();
        let mut model: HashMap<u64, String> = HashMap::new();
        for step in 0..5_000 {
            match random(10) {
                0..=4 => {
                    let (inode, path) = (2 + random(12), random_path(&mut random));
                    table.remember(file(inode), &path, None);
                    model.insert(inode, path);
                }
                5..=7 => {
                    let (from, to) = (random_path(&mut random), random_path(&mut random));
                    if ringfs_proto::path::is_inside(&to, &from) || ringfs_proto::path::is_inside(&from, &to) {
                        continue;
                    }
                    let exchange = random(3) == 0;
                    table.renamed(&from, &to, exchange);
                    for path in model.values_mut() {
                        let new = moved(path, &from, &to).or_else(|| if exchange { moved(path, &to, &from) } else { None });
                        if let Some(new) = new {
                            *path = new;
                        }
                    }
                }
                _ => {
                    let inode = 2 + random(12);
                    while table.forget(inode, 1).is_none() && table.path(inode).is_ok() {}
                    model.remove(&inode);
                }
            }
            table.check_indexes();
            for (inode, path) in &model {
                assert_eq!(&table.path(*inode).unwrap(), path, "step {step}: inode {inode}");
                let parent = ringfs_proto::path::parent(path).unwrap();
                let mut beside: Vec<String> = model
                    .values()
                    .filter(|other| ringfs_proto::path::parent(other) == Some(parent))
                    .map(|other| ringfs_proto::path::file_name(other).to_string())
                    .collect();
                beside.sort_unstable();
                beside.dedup();
                let directory = table.inode_at(parent);
                assert_eq!(table.names_beside(*inode), directory.map(|directory| (directory, beside)), "step {step}: beside {path}");
            }
        }
    }
}
