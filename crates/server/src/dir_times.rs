//! Directory times: a directory's mtime and ctime change whenever a name in it is created,
//! removed or renamed (POSIX), and a `stat` after the change has returned shows it.
//!
//! The name lives on one server and the directory's inode, usually, on another, so the
//! name's server tells the directory (`TouchDir`, to the directory's name server, which
//! sends it on to the inode). A request that changed names notes its touches
//! ([`ServerState::touch_parent`]) and, when its handler has returned with every lock given
//! back, waits until they are delivered ([`ServerState::await_touches`]) — `rsync` relies on
//! it: it stats a directory after filling it and sets the directory's times again only if
//! they moved. Touches go in *batches*: a waiting request whose touches are still pending
//! sends everything noted so far itself, one message per directory, all at once; requests
//! whose touches another thread took wait for that thread. So a request pays one round
//! trip (none when the directory is on this server), and touches of one directory noted
//! together by concurrent requests go as one message.
//!
//! The wait is bounded ([`TOUCH_WAIT`]): a touch of a directory whose server is cut off must
//! not hold up the reply (it did once: a client retrying its `mkdir` in the root directory,
//! which every server holds, kept timing out); such a touch arrives when it can, or is
//! dropped and logged — an operation that succeeded does not fail for a time stamp.
//! Touches never undo a later change of the directory, so their order does not matter.
//! Touches noted outside a request (by background steps) are sent by the
//! `ringfs-dirtimes` thread.

use std::cell::Cell;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ringfs_proto::path;
use ringfs_proto::{DirTouch, Errno, FileId, Member, Request, Response};

use crate::service::{ServerState, store_errno};

/// Longest a request waits for the touches of the directories it changed (then it answers,
/// and the touches arrive later).
pub const TOUCH_WAIT: Duration = Duration::from_millis(500);

/// Touches nobody waits for (noted outside a request) are sent after this long.
const UNAWAITED_DELAY: Duration = Duration::from_millis(5);

thread_local! {
    /// The batch that carries the last touch noted by the request this thread serves (0:
    /// none).
    static AWAITED_BATCH: Cell<u64> = const { Cell::new(0) };
}

#[derive(Default)]
pub struct DirTimes {
    state: Mutex<State>,
    /// Wakes requests waiting for a batch to be sent.
    sent: Condvar,
}

/// The touches and batches. Invariant: `pending` goes in batch `gathering`; every batch
/// numbered below `gathering` has been taken by a thread, and has been sent unless it is in
/// `in_flight`.
struct State {
    /// Touches waiting to be sent: the latest time for each directory.
    pending: HashMap<String, i64>,
    /// When the oldest pending touch was noted.
    pending_since: Option<Instant>,
    /// The number of the batch the pending touches will go in.
    gathering: u64,
    /// Batches taken and not yet sent.
    in_flight: BTreeSet<u64>,
}

impl Default for State {
    fn default() -> State {
        State { pending: HashMap::new(), pending_since: None, gathering: 1, in_flight: BTreeSet::new() }
    }
}

impl State {
    /// Takes the pending touches as a batch to send.
    fn take_batch(&mut self) -> (u64, Vec<(String, i64)>) {
        self.pending_since = None;
        let batch = self.gathering;
        self.gathering += 1;
        self.in_flight.insert(batch);
        (batch, self.pending.drain().collect())
    }

    fn is_sent(&self, batch: u64) -> bool {
        batch < self.gathering && !self.in_flight.contains(&batch)
    }
}

impl DirTimes {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues a touch of `dir` (no allocation for a directory queued already: the common
    /// case of a burst) and returns the number of the batch it goes in.
    fn note(&self, dir: &str, time_ns: i64) -> u64 {
        let mut state = self.lock();
        match state.pending.get_mut(dir) {
            Some(latest) => *latest = (*latest).max(time_ns),
            None => {
                state.pending.insert(dir.to_string(), time_ns);
                state.pending_since.get_or_insert_with(Instant::now);
            }
        }
        state.gathering
    }

    /// Batch `batch` has been sent.
    fn finished(&self, batch: u64) {
        let mut state = self.lock();
        let was_in_flight = state.in_flight.remove(&batch);
        debug_assert!(was_in_flight, "a batch is sent once");
        self.sent.notify_all();
    }
}

/// What to do next about a batch.
enum Turn {
    /// It has been sent.
    Sent,
    /// Send it: its touches are these.
    Send(u64, Vec<(String, i64)>),
    /// The wait is over without it.
    GiveUp,
}

impl ServerState {
    /// A name in `child`'s parent directory was created, removed or renamed at `time_ns`.
    /// The request being handled answers once the touch is delivered (see the module doc).
    pub(crate) fn touch_parent(&self, child: &str, time_ns: i64) {
        let Some(parent) = path::parent(child) else { return };
        let batch = self.dir_times.note(parent, time_ns);
        AWAITED_BATCH.with(|awaited| awaited.set(awaited.get().max(batch)));
    }

    /// Waits (at most [`TOUCH_WAIT`]) until the touches noted by the request this thread
    /// served are delivered, sending them itself if no other thread has taken them.
    /// Called when a request's handler has returned.
    pub(crate) fn await_touches(&self) {
        let batch = AWAITED_BATCH.with(|awaited| awaited.replace(0));
        if batch == 0 {
            return;
        }
        let end = Instant::now() + TOUCH_WAIT;
        match self.next_turn(batch, end) {
            Turn::Sent => {}
            Turn::Send(batch, touches) => {
                self.send_touches(touches, end);
                self.dir_times.finished(batch);
            }
            Turn::GiveUp => log::debug!("answering before the directory touches of batch {batch} were delivered"),
        }
    }

    /// Whether `batch` is sent, or this thread is to send it (no other thread has taken it),
    /// or (at `end`) the wait is over.
    fn next_turn(&self, batch: u64, end: Instant) -> Turn {
        let times = &self.dir_times;
        let mut state = times.lock();
        loop {
            if state.is_sent(batch) {
                return Turn::Sent;
            }
            if batch == state.gathering {
                let (batch, touches) = state.take_batch();
                return Turn::Send(batch, touches);
            }
            let now = Instant::now();
            if now >= end {
                return Turn::GiveUp;
            }
            state = times.sent.wait_timeout(state, end - now).unwrap_or_else(|poisoned| poisoned.into_inner()).0;
        }
    }

    /// Sends one batch of touches, all at once, waiting for the answers until `end`.
    fn send_touches(&self, touches: Vec<(String, i64)>, end: Instant) {
        let mut targets: Vec<(Member, DirTouch)> = Vec::new();
        for (dir, time_ns) in touches {
            if dir == "/" {
                // Every server holds the root directory.
                let touch = DirTouch { path: String::new(), file: FileId::ROOT, time_ns };
                let members = self.membership().list().members.clone();
                targets.extend(members.into_iter().map(|member| (member, touch.clone())));
            } else {
                targets.push((self.owner_of_path(&dir), DirTouch { path: dir, file: FileId::default(), time_ns }));
            }
        }
        let (local, remote): (Vec<_>, Vec<_>) = targets.into_iter().partition(|(member, _)| self.is_self(member));
        let connections: Vec<_> = remote
            .iter()
            .map(|(member, _)| if member.alive { self.peers.connection(member).map_err(|error| error.errno()) } else { Err(Errno::EIO) })
            .collect();
        let calls: Vec<_> = connections
            .iter()
            .zip(&remote)
            .map(|(connection, (_, touch))| {
                let connection = connection.as_ref().map_err(|errno| *errno)?;
                connection.start(&Request::TouchDir(touch.clone()), &[], None).map_err(|error| error.errno())
            })
            .collect();
        for (_, touch) in local {
            report_touch(&touch, self.touch_dir(touch.clone()).map(drop));
        }
        for (call, (_, touch)) in calls.into_iter().zip(&remote) {
            let outcome =
                call.and_then(|call| call.wait_until(end).map_err(|error| error.errno())).and_then(|reply| match reply.response {
                    Response::Error(errno) => Err(errno),
                    _ => Ok(()),
                });
            report_touch(touch, outcome);
        }
    }

    /// Sends touches noted outside a request (nobody awaits them) until the server stops.
    pub(crate) fn dir_times_loop(&self) {
        while !self.shutdown.is_requested() {
            std::thread::sleep(UNAWAITED_DELAY);
            let turn = {
                let mut state = self.dir_times.lock();
                let stale = state.pending_since.is_some_and(|since| since.elapsed() >= UNAWAITED_DELAY);
                stale.then(|| state.take_batch())
            };
            if let Some((batch, touches)) = turn {
                self.send_touches(touches, Instant::now() + TOUCH_WAIT);
                self.dir_times.finished(batch);
            }
        }
    }

    /// `TouchDir`: by path at the directory's name server (sent on to its inode), or by file
    /// at the inode.
    pub fn touch_dir(&self, touch: DirTouch) -> Result<Response, Errno> {
        if touch.path.is_empty() {
            self.store.touch_dir(touch.file, touch.time_ns).map_err(store_errno)?;
            return Ok(Response::Done);
        }
        let entry = {
            let _pass = self.gate.pass(&[&touch.path], 0)?;
            self.store.lookup(&touch.path, self.anchor_of(&touch.path), false).map_err(store_errno)?.0
        };
        if !entry.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        let onward = DirTouch { path: String::new(), file: entry.file, time_ns: touch.time_ns };
        self.ask_home(entry.file, Request::TouchDir(onward)).map(drop)?;
        Ok(Response::Done)
    }
}

/// Logs a touch that was not delivered (in time).
fn report_touch(touch: &DirTouch, outcome: Result<(), Errno>) {
    if let Err(errno) = outcome {
        let what = if touch.path.is_empty() { "/" } else { touch.path.as_str() };
        log::debug!("the times of {what} were not updated (yet): {errno}");
    }
}
