//! Appends from several clients at once, placed by the file's inode server.
//!
//! A client appends (`O_APPEND`) by finding the file's size and writing there; two clients
//! that do it at once find the same size, and one overwrites the other — lines of a log that
//! several nodes append to were lost. So before it writes, an appending client asks the
//! file's inode server where its bytes go (`PlaceAppend`): after every append placed before
//! it, or at the size it found, whichever is later. The server remembers how far the appends
//! it placed reach (their bytes may not be written yet); a truncation forgets it, and so
//! does a restart (appends in flight across one may then overlap). A client that dies after
//! its place was given leaves a hole of zeros there, not bytes of another append.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use ringfs_proto::FileId;

/// How long the end of a file's appends is remembered after the last one was placed (far
/// longer than any append takes to be written: its client gives up after its deadline).
const REMEMBERED_FOR: Duration = Duration::from_secs(60);

/// Files past which a placement first forgets the ends not used for [`REMEMBERED_FOR`]
/// (at most once per [`FORGET_EVERY`]: with more files than that appended to lately, a look
/// at every one on every append would cost each append the whole table).
const FORGET_ABOVE: usize = 4096;
const FORGET_EVERY: Duration = Duration::from_secs(1);

/// How far the appends placed for a file reach, and when the last was placed.
struct Placed {
    end: u64,
    at: Instant,
}

/// The appends placed here, by file (see the module doc).
#[derive(Default)]
pub struct Appends {
    placed: Mutex<Placements>,
}

#[derive(Default)]
struct Placements {
    by_file: HashMap<FileId, Placed>,
    /// When ends not used lately were last forgotten.
    forgotten_at: Option<Instant>,
}

impl Appends {
    /// Places an append of `len` bytes to `file`, whose size its client found to be `size`:
    /// the offset to write them at.
    pub fn place(&self, file: FileId, size: u64, len: u64) -> u64 {
        let now = crate::sched::now();
        let mut placements = self.placed.lock();
        let Placements { by_file, forgotten_at } = &mut *placements;
        if by_file.len() > FORGET_ABOVE && forgotten_at.is_none_or(|at| now.duration_since(at) >= FORGET_EVERY) {
            by_file.retain(|_, placed| now.duration_since(placed.at) < REMEMBERED_FOR);
            *forgotten_at = Some(now);
        }
        let offset = by_file.get(&file).map_or(size, |placed| placed.end.max(size));
        by_file.insert(file, Placed { end: offset.saturating_add(len), at: now });
        offset
    }

    /// `file` was truncated: later appends go at its new end.
    pub fn cut(&self, file: FileId) {
        self.placed.lock().by_file.remove(&file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(serial: u64) -> FileId {
        FileId { anchor: 1, serial }
    }

    #[test]
    fn appends_placed_together_do_not_overlap_and_follow_writes_past_them() {
        let appends = Appends::default();
        // Two clients found the same size, 100: the second goes after the first.
        assert_eq!(appends.place(file(1), 100, 10), 100);
        assert_eq!(appends.place(file(1), 100, 5), 110);
        // A client that found a larger size (the first two written, and more past them).
        assert_eq!(appends.place(file(1), 200, 1), 200);
        // Other files are on their own.
        assert_eq!(appends.place(file(2), 7, 3), 7);
        // A truncation: the next append goes at the size found.
        appends.cut(file(1));
        assert_eq!(appends.place(file(1), 0, 4), 0);
        assert_eq!(appends.place(file(1), 0, 4), 4);
    }

    #[test]
    fn ends_not_used_for_long_are_forgotten_only_once_there_are_many() {
        let appends = Appends::default();
        for serial in 0..=FORGET_ABOVE as u64 {
            appends.place(file(serial), 0, 1);
        }
        assert_eq!(appends.placed.lock().by_file.len(), FORGET_ABOVE + 1);
        // (All were placed just now: nothing is forgotten.)
        appends.place(file(u64::MAX), 0, 1);
        assert_eq!(appends.placed.lock().by_file.len(), FORGET_ABOVE + 2);
        assert_eq!(appends.place(file(3), 0, 1), 1, "still remembered");
    }
}
