//! Advisory locks — `fcntl` record locks, OFD locks and `flock` — of the files whose inodes
//! this server holds, so that they hold among all clients of the job, on every node.
//!
//! A lock covers bytes `start..=end` of a file (`end` `u64::MAX`: to the end, however long
//! the file grows) and belongs to an *owner* of a client: a process for `fcntl` locks, an
//! open file description for OFD locks and `flock` (which ringfs keeps as whole-file locks
//! of that owner, as the Linux NFS client does). As POSIX says: an owner's locks never
//! conflict with each other; a new lock of an owner replaces its own locks over the range
//! (splitting them), and adjacent or overlapping locks of one owner and kind merge; two
//! owners' locks conflict where they overlap and either is exclusive. A conflicting request
//! fails with EAGAIN; a caller that wants to wait (`F_SETLKW`) asks again. Deadlocks between
//! waiting owners are not detected (no EDEADLK).
//!
//! The locks of a client end when its opens do: when it has had no connection to this
//! server for the open grace period (see `opens.rs`), so a crashed client's locks lapse.
//! The table lives in memory: a restarted server has forgotten its locks.

use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;

use ringfs_proto::{Errno, FileId, FileLock, LockKind};

/// A lock held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    client: u64,
    owner: u64,
    exclusive: bool,
    start: u64,
    /// Inclusive; `u64::MAX`: to the end of the file.
    end: u64,
    pid: u32,
}

impl Held {
    fn same_owner(&self, other: &Held) -> bool {
        self.client == other.client && self.owner == other.owner
    }

    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }

    /// Whether `self` and a lock `wanted` of another owner cannot both be held.
    fn conflicts_with(&self, wanted: &Held) -> bool {
        !self.same_owner(wanted) && self.overlaps(wanted.start, wanted.end) && (self.exclusive || wanted.exclusive)
    }
}

/// The locks of every file whose inode is here.
#[derive(Default)]
pub struct LockTable {
    files: Mutex<HashMap<FileId, Vec<Held>>>,
}

impl LockTable {
    fn files(&self) -> MutexGuard<'_, HashMap<FileId, Vec<Held>>> {
        self.files.lock()
    }

    /// `SetLock`: takes, changes or gives back `lock` (EAGAIN: another owner's lock is in
    /// the way; EINVAL: an empty range).
    pub fn set(&self, lock: &FileLock) -> Result<(), Errno> {
        if lock.start > lock.end {
            return Err(Errno::EINVAL);
        }
        let mut files = self.files();
        let held = files.entry(lock.file).or_default();
        if let Some(wanted) = as_held(lock)
            && held.iter().any(|other| other.conflicts_with(&wanted))
        {
            return Err(Errno::EAGAIN);
        }
        replace_range(held, lock);
        if held.is_empty() {
            files.remove(&lock.file);
        }
        Ok(())
    }

    /// `TestLock`: the first lock in the way of `lock`, if any (`F_GETLK`).
    pub fn test(&self, lock: &FileLock) -> Result<Option<FileLock>, Errno> {
        if lock.start > lock.end {
            return Err(Errno::EINVAL);
        }
        let Some(wanted) = as_held(lock) else { return Ok(None) };
        let files = self.files();
        let blocking = files.get(&lock.file).and_then(|held| held.iter().find(|other| other.conflicts_with(&wanted)).copied());
        Ok(blocking.map(|other| FileLock {
            file: lock.file,
            client: other.client,
            owner: other.owner,
            kind: if other.exclusive { LockKind::Write } else { LockKind::Read },
            start: other.start,
            end: other.end,
            pid: other.pid,
        }))
    }

    /// Ends every lock of `client` (gone); how many there were.
    pub fn release_client(&self, client: u64) -> usize {
        let mut files = self.files();
        let mut released = 0;
        files.retain(|_, held| {
            let before = held.len();
            held.retain(|lock| lock.client != client);
            released += before - held.len();
            !held.is_empty()
        });
        released
    }
}

/// The lock `lock` asks to hold (`None` for an unlock).
fn as_held(lock: &FileLock) -> Option<Held> {
    let exclusive = match lock.kind {
        LockKind::Unlock => return None,
        LockKind::Read => false,
        LockKind::Write => true,
    };
    Some(Held { client: lock.client, owner: lock.owner, exclusive, start: lock.start, end: lock.end, pid: lock.pid })
}

/// Makes `lock`'s owner hold exactly `lock` over its range (nothing for an unlock): its
/// locks there are cut out (split where they reach beyond), the new one added and merged
/// with the owner's adjacent or overlapping locks of the same kind.
fn replace_range(held: &mut Vec<Held>, lock: &FileLock) {
    let (start, end) = (lock.start, lock.end);
    let mut kept = Vec::with_capacity(held.len() + 1);
    for existing in held.drain(..) {
        let owned = existing.client == lock.client && existing.owner == lock.owner;
        if !owned || !existing.overlaps(start, end) {
            kept.push(existing);
            continue;
        }
        if existing.start < start {
            kept.push(Held { end: start - 1, ..existing });
        }
        if existing.end > end {
            kept.push(Held { start: end + 1, ..existing });
        }
    }
    *held = kept;
    let Some(mut new) = as_held(lock) else { return };
    // Merge with the owner's locks of the same kind that touch it.
    held.retain(|existing| {
        let touches = existing.start <= new.end.saturating_add(1) && new.start <= existing.end.saturating_add(1);
        if existing.same_owner(&new) && existing.exclusive == new.exclusive && touches {
            new.start = new.start.min(existing.start);
            new.end = new.end.max(existing.end);
            return false;
        }
        true
    });
    held.push(new);
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: FileId = FileId { anchor: 1, serial: 2 };

    fn lock(owner: u64, kind: LockKind, start: u64, end: u64) -> FileLock {
        FileLock { file: FILE, client: 1, owner, kind, start, end, pid: owner as u32 }
    }

    #[test]
    fn owners_conflict_only_where_one_is_exclusive() {
        let table = LockTable::default();
        table.set(&lock(1, LockKind::Read, 0, 99)).unwrap();
        table.set(&lock(2, LockKind::Read, 50, 149)).unwrap();
        assert_eq!(table.set(&lock(3, LockKind::Write, 140, 140)), Err(Errno::EAGAIN));
        table.set(&lock(3, LockKind::Write, 150, u64::MAX)).unwrap();
        let blocker = table.test(&lock(4, LockKind::Read, 1000, 1000)).unwrap().expect("owner 3 holds to the end");
        assert_eq!((blocker.owner, blocker.kind, blocker.start, blocker.end), (3, LockKind::Write, 150, u64::MAX));
        assert_eq!(table.test(&lock(4, LockKind::Read, 0, 149)).unwrap(), None, "shared locks let readers in");
        // An owner's own locks never stand in its way: it upgrades in place.
        table.set(&lock(1, LockKind::Write, 0, 49)).unwrap();
        assert_eq!(table.set(&lock(2, LockKind::Read, 0, 0)), Err(Errno::EAGAIN));
        table.set(&lock(1, LockKind::Unlock, 0, u64::MAX)).unwrap();
        table.set(&lock(2, LockKind::Write, 0, 10)).unwrap();
    }

    #[test]
    fn a_clients_locks_end_with_it() {
        let table = LockTable::default();
        table.set(&lock(1, LockKind::Write, 0, u64::MAX)).unwrap();
        let other = FileLock { client: 2, ..lock(1, LockKind::Write, 0, 0) };
        assert_eq!(table.set(&other), Err(Errno::EAGAIN), "the same owner number of another client is another owner");
        assert_eq!(table.release_client(1), 1);
        table.set(&other).unwrap();
    }

    /// A small random generator (xorshift), so that a failure names its seed.
    struct Random(u64);

    impl Random {
        fn below(&mut self, bound: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % bound
        }
    }

    /// Random requests of 4 owners over 40 bytes and "to the end" against a model that
    /// keeps, for every byte, what each owner holds of it (one more cell stands for all the
    /// bytes past 40, which only "to the end" requests reach): the outcome of every request
    /// and every byte's holders must match (range splitting, merging, upgrades).
    #[test]
    fn random_requests_match_a_byte_by_byte_model() {
        const BYTES: usize = 40;
        for seed in 1..=200u64 {
            let mut random = Random(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let table = LockTable::default();
            // model[owner][byte]: 0 none, 1 read, 2 write; byte BYTES: every byte past.
            let mut model = [[0u8; BYTES + 1]; 4];
            for step in 0..300 {
                let owner = random.below(4) as usize;
                let kind = [LockKind::Unlock, LockKind::Read, LockKind::Write][random.below(3) as usize];
                let start = random.below(BYTES as u64);
                let to_end = random.below(5) == 0;
                let end = if to_end { u64::MAX } else { start + random.below(BYTES as u64 - start) };
                let last = if to_end { BYTES } else { end as usize };
                let level = match kind {
                    LockKind::Unlock => 0,
                    LockKind::Read => 1,
                    LockKind::Write => 2,
                };
                let blocked = (start as usize..=last)
                    .any(|byte| (0..4).any(|other| other != owner && model[other][byte] != 0 && (model[other][byte] == 2 || level == 2)));
                let outcome = table.set(&lock(owner as u64, kind, start, end));
                assert_eq!(outcome.is_err(), blocked && level != 0, "seed {seed} step {step}: {kind:?} {start}..={end} by {owner}");
                if outcome.is_ok() {
                    model[owner][start as usize..=last].fill(level);
                }
                for byte in 0..=BYTES as u64 {
                    // What another owner's write lock of this one byte would meet.
                    let found = table.test(&lock(9, LockKind::Write, byte, byte)).unwrap().is_some();
                    let expected = (0..4).any(|owner| model[owner][byte as usize] != 0);
                    assert_eq!(found, expected, "seed {seed} step {step}: byte {byte}");
                }
                let files = table.files();
                for held in files.get(&FILE).into_iter().flatten() {
                    let owner = held.owner as usize;
                    let level = if held.exclusive { 2 } else { 1 };
                    let last = held.end.min(BYTES as u64) as usize;
                    assert!((held.start as usize..=last).all(|byte| model[owner][byte] == level), "seed {seed} step {step}: {held:?}");
                }
                let covered: u64 =
                    files.get(&FILE).into_iter().flatten().map(|held| (held.end.min(BYTES as u64) + 1).saturating_sub(held.start)).sum();
                let expected: u64 = model.iter().map(|bytes| bytes.iter().filter(|level| **level != 0).count() as u64).sum();
                assert_eq!(covered, expected, "seed {seed} step {step}: an owner's locks overlap or miss bytes");
            }
        }
    }
}
