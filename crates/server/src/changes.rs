//! The change log: which files and names changed here lately, for the FUSE mounts that let
//! the kernel cache names and attributes long and ask every server, a few times a second,
//! what other clients changed (`Changes`; the mount then tells the kernel to drop those).
//! Renames made here are noted too, once done: a mount that holds the renamed file or
//! directory by its old name (a shell whose working directory it is) follows it.
//!
//! A change is noted once the request that makes it has run, with the client that sent it
//! (0: a server's step), whether or not it succeeded (a notice too many only makes a mount
//! read something again). Nothing is noted while nobody asks: the log starts with the first
//! `Changes` and stops [`LISTEN_FOR`] after the last; when it starts again it starts a new
//! *epoch* (it may have missed changes meanwhile). It keeps the last [`CAPACITY`] changes; a
//! mount that asks about older ones, or about another epoch (also: this server restarted),
//! is told that anything may have changed.

use parking_lot::Mutex;
use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ringfs_proto::{ChangeList, ChangesSince, FileId, NameMove, Request, Response};

/// Changes kept.
const CAPACITY: usize = 200_000;
/// How long after the last `Changes` the log goes on noting changes.
const LISTEN_FOR: Duration = Duration::from_secs(30);
/// Most changes one answer carries (the next `Changes` goes on from there).
const MOST_PER_ANSWER: usize = 20_000;

/// What changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A file's attributes or bytes.
    File(FileId),
    /// A name was created, removed or replaced.
    Name(String),
    /// A rename was made.
    Moved(NameMove),
}

struct Noted {
    client: u64,
    change: Change,
}

struct Log {
    /// Names this log; a restarted server has another.
    epoch: u64,
    /// The position of `entries[0]` minus one: positions count from 1.
    dropped: u64,
    entries: VecDeque<Noted>,
    /// The last position an answer reached: a watcher may have read every entry up to it.
    told: u64,
}

impl Log {
    /// Forgets the changes noted so far: a position among them is no longer understood.
    fn new_epoch(&mut self) {
        self.epoch = ringfs_rpc::memory::random_u64() | 1;
        self.dropped += self.entries.len() as u64;
        self.entries.clear();
    }
}

/// The changes made here lately (see the module doc).
pub struct ChangeLog {
    log: Mutex<Log>,
    started: Instant,
    /// Milliseconds after `started` until which changes are noted.
    listening_until_ms: AtomicU64,
}

impl Default for ChangeLog {
    fn default() -> ChangeLog {
        ChangeLog {
            log: Mutex::new(Log { epoch: ringfs_rpc::memory::random_u64() | 1, dropped: 0, entries: VecDeque::new(), told: 0 }),
            started: Instant::now(),
            listening_until_ms: AtomicU64::new(0),
        }
    }
}

impl ChangeLog {
    fn log(&self) -> parking_lot::MutexGuard<'_, Log> {
        self.log.lock()
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn listening(&self) -> bool {
        self.now_ms() < self.listening_until_ms.load(Ordering::Acquire)
    }

    /// The changes `request` makes, to be noted once it has run ([`ChangeLog::note`]).
    pub fn changes_of(&self, request: &Request) -> Vec<Change> {
        if may_change(request) { changes_made_by(request) } else { Vec::new() }
    }

    /// The rename `request` makes, if it is one, to be noted with its changes if `response`
    /// says it was done.
    pub fn move_of(&self, request: &Request) -> Option<Change> {
        let Request::Rename(rename) = request else { return None };
        let exchange = rename.flags & ringfs_proto::RenameFlags::EXCHANGE != 0;
        Some(Change::Moved(NameMove { from: rename.from.clone(), to: rename.to.clone(), exchange }))
    }

    /// `changes` and, if `response` says the request was done, its rename (`moved`).
    pub fn with_move(mut changes: Vec<Change>, moved: Option<Change>, response: &Response) -> Vec<Change> {
        if !matches!(response, Response::Error(_)) {
            changes.extend(moved);
        }
        changes
    }

    /// Notes `changes` (from [`ChangeLog::changes_of`]), made by `client` (0: a server), if
    /// anybody listens.
    pub fn note(&self, client: u64, changes: Vec<Change>) {
        if changes.is_empty() || !self.listening() {
            return;
        }
        let mut log = self.log();
        for change in changes {
            // A repeat of the last change (a run of writes to one file) adds nothing — unless
            // a watcher may have read that one already: for it the repeat is news.
            let unread = log.dropped + log.entries.len() as u64 > log.told;
            if unread && log.entries.back().is_some_and(|last| last.client == client && last.change == change) {
                continue;
            }
            if log.entries.len() == CAPACITY {
                log.entries.pop_front();
                log.dropped += 1;
            }
            log.entries.push_back(Noted { client, change });
        }
    }

    /// `Changes`: what changed after `asked.after` by clients other than `asked.client`.
    pub fn since(&self, asked: &ChangesSince) -> ChangeList {
        let now = self.now_ms();
        let until = now + LISTEN_FOR.as_millis() as u64;
        let lapsed = now >= self.listening_until_ms.swap(until, Ordering::AcqRel);
        let mut log = self.log();
        if lapsed {
            // Changes made while nobody listened are not in the log.
            log.new_epoch();
        }
        let last = log.dropped + log.entries.len() as u64;
        if asked.epoch != log.epoch || asked.after < log.dropped || asked.after > last {
            // (The watcher goes on from `last`, as if it had read everything before.)
            log.told = log.told.max(last);
            return ChangeList { epoch: log.epoch, last, complete: false, ..ChangeList::default() };
        }
        let mut answer = ChangeList { epoch: log.epoch, last, complete: true, ..ChangeList::default() };
        let (mut files, mut names) = (HashSet::new(), HashSet::new());
        let start = (asked.after - log.dropped) as usize;
        for (offset, noted) in log.entries.range(start..).enumerate() {
            if files.len() + names.len() + answer.moves.len() >= MOST_PER_ANSWER {
                answer.last = asked.after + offset as u64;
                break;
            }
            if noted.client == asked.client {
                continue;
            }
            match &noted.change {
                Change::File(file) => {
                    files.insert(*file);
                }
                Change::Name(path) => {
                    names.insert(path.as_str());
                }
                // (In order: a later rename may move the name an earlier one made.)
                Change::Moved(moved) => answer.moves.push(moved.clone()),
            }
        }
        answer.files = files.into_iter().collect();
        answer.names = names.into_iter().map(str::to_string).collect();
        log.told = log.told.max(answer.last);
        answer
    }
}

/// Whether `request` may make a change [`changes_made_by`] names (without allocating).
fn may_change(request: &Request) -> bool {
    match request {
        Request::TouchDir(touch) => touch.path.is_empty(),
        request => matches!(
            request,
            Request::Create(_)
                | Request::Unlink(_)
                | Request::Rmdir(_)
                | Request::Rename(_)
                | Request::Link(_)
                | Request::LinkFile(_)
                | Request::InstallEntry(_)
                | Request::RemoveEntry(_)
                | Request::AddLink(_)
                | Request::DropLink(_)
                | Request::SetAttr(_)
                | Request::Truncate(_)
                | Request::SetXattr(_)
                | Request::RemoveXattr(_)
                | Request::MarkExtended(_)
                | Request::ClampChunkTimes(_)
                | Request::Write(_)
                | Request::SetChunkLen(_)
        ),
    }
}

/// The changes `request` makes that a mount watching for them needs to know of.
fn changes_made_by(request: &Request) -> Vec<Change> {
    let name = |path: &str| Change::Name(path.to_string());
    match request {
        Request::Create(create) => vec![name(&create.path)],
        Request::Unlink(unlink) => vec![name(&unlink.path)],
        Request::Rmdir(rmdir) => vec![name(&rmdir.path)],
        Request::Rename(rename) => vec![name(&rename.from), name(&rename.to)],
        Request::Link(link) => vec![name(&link.to)],
        Request::LinkFile(link) => vec![name(&link.to), Change::File(link.file)],
        Request::InstallEntry(install) => vec![name(&install.path)],
        Request::RemoveEntry(remove) => vec![name(&remove.path)],
        Request::AddLink(count) | Request::DropLink(count) => vec![Change::File(count.file)],
        Request::SetAttr(set) => vec![Change::File(set.file)],
        Request::Truncate(truncate) => vec![Change::File(truncate.file)],
        Request::SetXattr(set) => vec![Change::File(set.file)],
        Request::RemoveXattr(remove) => vec![Change::File(remove.file)],
        Request::MarkExtended(file) => vec![Change::File(file.file)],
        Request::ClampChunkTimes(count) => vec![Change::File(count.file)],
        Request::Write(write) => vec![Change::File(write.chunk.file)],
        Request::SetChunkLen(set) => vec![Change::File(set.chunk.file)],
        Request::TouchDir(touch) if touch.path.is_empty() => vec![Change::File(touch.file)],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(serial: u64) -> FileId {
        FileId { anchor: 1, serial }
    }

    fn ask(log: &ChangeLog, epoch: u64, after: u64, client: u64) -> ChangeList {
        log.since(&ChangesSince { epoch, after, client })
    }

    #[test]
    fn others_changes_are_told_once_and_ones_own_not_at_all() {
        let log = ChangeLog::default();
        let unlink = Request::Unlink(ringfs_proto::Unlink { path: "/a".into(), time_ns: 1 });
        log.note(9, log.changes_of(&unlink));
        let first = ask(&log, 0, 0, 7);
        assert!(!first.complete, "a new listener learns where the log is");
        assert_eq!(first.last, 0, "nothing is noted while nobody listens");
        assert_eq!(log.changes_of(&unlink), vec![Change::Name("/a".into())]);
        log.note(9, log.changes_of(&unlink));
        log.note(7, vec![Change::File(file(3))]);
        log.note(0, vec![Change::File(file(4)), Change::File(file(4))]);
        let second = ask(&log, first.epoch, first.last, 7);
        assert!(second.complete);
        assert_eq!((second.names, second.files), (vec!["/a".to_string()], vec![file(4)]), "not its own change to file 3");
        assert_eq!(second.last, first.last + 3, "a repeated change is noted once");
        let third = ask(&log, second.epoch, second.last, 7);
        assert!(third.complete && third.files.is_empty() && third.names.is_empty());
        assert!(!ask(&log, second.epoch + 2, second.last, 7).complete, "another epoch");
    }

    /// A run of writes to one file is noted once — but a write after a mount has read the
    /// run's note is news to that mount (`tail -f` of a file appended on another node showed
    /// no line after the first one it saw).
    #[test]
    fn a_change_repeated_after_a_mount_read_it_is_told_again() {
        let log = ChangeLog::default();
        let start = ask(&log, 0, 0, 7);
        log.note(9, vec![Change::File(file(3))]);
        log.note(9, vec![Change::File(file(3))]);
        let first = ask(&log, start.epoch, start.last, 7);
        assert_eq!((first.files, first.last), (vec![file(3)], start.last + 1), "a run is noted once");
        // (A watcher that starts now, told only where the log stands, hears of later ones.)
        let late = ask(&log, 0, 0, 8);
        assert!(!late.complete);
        log.note(9, vec![Change::File(file(3))]);
        let second = ask(&log, first.epoch, first.last, 7);
        assert_eq!(second.files, vec![file(3)], "the write after the mount looked");
        log.note(9, vec![Change::File(file(3))]);
        log.note(9, vec![Change::File(file(3))]);
        assert_eq!(ask(&log, second.epoch, second.last, 7).files, vec![file(3)]);
        assert_eq!(ask(&log, late.epoch, late.last, 8).files, vec![file(3)]);
    }

    #[test]
    fn a_change_repeated_after_a_mount_was_told_where_the_log_stands_is_told_again() {
        let log = ChangeLog::default();
        let start = ask(&log, 0, 0, 7);
        log.note(9, vec![Change::File(file(3))]);
        // A mount that starts now learns only where the log stands: it read nothing.
        let late = ask(&log, 0, 0, 8);
        assert!(!late.complete);
        log.note(9, vec![Change::File(file(3))]);
        assert_eq!(ask(&log, late.epoch, late.last, 8).files, vec![file(3)], "news for the mount that started");
        assert_eq!(ask(&log, start.epoch, start.last, 7).files, vec![file(3)]);
    }

    #[test]
    fn renames_are_told_in_order_once_done() {
        let log = ChangeLog::default();
        let start = ask(&log, 0, 0, 7);
        let rename = |from: &str, to: &str, flags: u32| {
            Request::Rename(ringfs_proto::Rename { from: from.into(), to: to.into(), time_ns: 1, flags })
        };
        let done = Response::Done;
        let failed = Response::Error(ringfs_proto::Errno::ENOENT);
        for (request, response, client) in [
            (rename("/a", "/b", 0), &done, 9),
            (rename("/c", "/d", 0), &failed, 9),
            (rename("/b", "/a", ringfs_proto::RenameFlags::EXCHANGE), &done, 9),
            (rename("/e", "/f", 0), &done, 7),
        ] {
            log.note(client, ChangeLog::with_move(log.changes_of(&request), log.move_of(&request), response));
        }
        let moves = ask(&log, start.epoch, start.last, 7).moves;
        let moved = |from: &str, to: &str, exchange: bool| NameMove { from: from.into(), to: to.into(), exchange };
        assert_eq!(moves, vec![moved("/a", "/b", false), moved("/b", "/a", true)], "done ones, in order, not the asker's own");
        assert!(log.move_of(&Request::Unlink(ringfs_proto::Unlink { path: "/a".into(), time_ns: 1 })).is_none());
    }

    #[test]
    fn the_requests_that_may_change_something_are_those_whose_changes_are_noted() {
        for request in ringfs_proto::samples::requests() {
            assert_eq!(may_change(&request), !changes_made_by(&request).is_empty(), "{request:?}");
        }
    }

    #[test]
    fn a_change_made_as_listening_begins_is_noted() {
        let log = ChangeLog::default();
        let unlink = Request::Unlink(ringfs_proto::Unlink { path: "/a".into(), time_ns: 1 });
        // A request starts while nobody listens, and ends after somebody asked.
        let changes = log.changes_of(&unlink);
        let first = ask(&log, 0, 0, 7);
        log.note(9, changes);
        let second = ask(&log, first.epoch, first.last, 7);
        assert!(second.complete);
        assert_eq!(second.names, vec!["/a".to_string()]);
    }

    #[test]
    fn a_listener_too_far_behind_is_told_that_anything_may_have_changed() {
        let log = ChangeLog::default();
        let start = ask(&log, 0, 0, 1);
        for serial in 0..(CAPACITY as u64 + 5) {
            log.note(2, vec![Change::File(file(serial))]);
        }
        assert!(!ask(&log, start.epoch, start.last, 1).complete);
        let recent = ask(&log, start.epoch, start.last + 10, 1);
        assert!(recent.complete);
        assert_eq!(recent.files.len(), MOST_PER_ANSWER, "one answer carries at most so many");
        assert_eq!(recent.last, start.last + 10 + MOST_PER_ANSWER as u64);
    }
}
