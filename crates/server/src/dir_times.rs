//! Directory times: a directory's mtime and ctime change whenever a name in it is created,
//! removed or renamed (POSIX), and a `stat` after the change has returned shows it.
//!
//! The name lives on one server and the directory's inode, usually, on another, so the
//! name's server tells the directory: a `TouchDir` to the directory's name server, which
//! sends it on to the inode. Sending one per change would cost every create a round trip
//! between servers (measured: half the create rate on 2 servers). POSIX only asks that
//! times "marked for update" be updated before the next `stat` — so touches are *held back*
//! and collected when someone looks:
//!
//! 1. The first change of names in a directory (on a server that holds nothing back for it)
//!    sends its touch and waits for it, with `defer_for` naming this server. The inode's
//!    server applies the touch, *lends* the directory's times to this server (it notes the
//!    server as one that may hold back touches of it) and answers the directory's file id.
//! 2. Later changes in that directory on this server only note the latest time here
//!    ([`Deferral`]), at no cost.
//! 3. Before the inode's server answers anything that shows the directory's attributes
//!    (a `stat`, a lookup, a listing), it collects the held-back touches from every
//!    server it lent them to (`CollectTouches`), applies them, and ends the loans
//!    ([`DirTimes::settle_dir_times`]). The next change starts again at step 1.
//! 4. Held-back touches are also sent every [`DEFERRAL_FLUSH`], so a directory nobody looks
//!    at (or whose inode server restarted and forgot its loans) is at most that late. Until
//!    such a send is delivered, a collection still counts its touches (they may reach the
//!    inode after the collection's answer: CI once saw a `stat` older than the directory's
//!    newest name).
//!
//! The request that sent a touch waits for it after its handler has returned, with every
//! lock given back ([`DirTimes::await_touches`]); touches noted meanwhile by other
//! requests go in the same batch. The wait and a collection are bounded ([`TOUCH_WAIT`]):
//! a touch of a directory whose server is cut off must not hold up the reply (it did once:
//! a client retrying its `mkdir` in the root directory, which every server holds, kept
//! timing out); such a touch arrives when it can, or is dropped and logged — an operation
//! that succeeded does not fail for a time stamp. Touches only move times forward and never
//! undo a later explicit `utimensat` (`ChunkStore::touch_dir`), so their order does not
//! matter. The root directory, held by every server, is never held back: its touches go to
//! the two servers clients ask about it ([`DirTimes::root_keepers`]), and to all when they
//! change its subdirectory count.
//!
//! A held-back touch names its directory by path here, so a directory rename or rmdir (the
//! `Freeze` and `PrepareRmdir` every server sees) turns the held-back touches at or below
//! it into *loose* ones, sent by file id with the next flush.
//!
//! A touch also carries how many subdirectories the directory gained or lost (a mkdir, an
//! rmdir, a directory renamed in or out): its link count is 2 + its subdirectories, as
//! `find` and `rsync` expect. Those touches are never held back (a count cannot be
//! collected as "the latest"): they go as in step 1, and the request waits for them.

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ringfs_proto::path;
use ringfs_proto::{Attr, ChunkKey, DirTouch, Errno, FileId, FileOnly, Member, RenameToken, Request, Response};

use crate::gate::NamespaceGate;
use crate::node::{Node, store_errno};

/// Longest a request waits for the touches of the directories it changed, or for the
/// collection of held-back touches (then it answers, and the touches arrive later).
pub const TOUCH_WAIT: Duration = Duration::from_millis(500);

/// Touches nobody waits for (noted outside a request) are sent after this long.
const UNAWAITED_DELAY: Duration = Duration::from_millis(5);

/// Held-back touches are sent at least this often.
const DEFERRAL_FLUSH: Duration = Duration::from_millis(250);

/// Longest the touch thread sleeps while this server has no touch to send and holds none
/// back (it is woken when one is noted; this bounds how long it outlives a stop).
const IDLE_WAKE: Duration = Duration::from_secs(1);

/// A directory with no change of names here for this long is no longer held back (the next
/// change sends its touch again).
const IDLE_DEFERRAL: Duration = Duration::from_secs(5);

thread_local! {
    /// The batch that carries the last touch noted by the request this thread serves (0:
    /// none).
    static AWAITED_BATCH: Cell<u64> = const { Cell::new(0) };
    /// This thread is handling a request ([`DirTimes::serving`]): the touches it notes are
    /// sent or awaited when the request ends, not by the touch thread.
    static SERVING: Cell<bool> = const { Cell::new(false) };
}

/// What this server's touches are waiting for: batches to send, touches held back, loans.
#[derive(Default)]
struct TouchState {
    batches: Mutex<Batches>,
    /// Wakes requests waiting for a batch to be sent.
    sent: Condvar,
    /// Touches this server holds back.
    deferred: Mutex<Deferred>,
    /// At a directory's inode server: the servers its times are lent to.
    lent: Mutex<HashMap<FileId, Vec<String>>>,
    /// Whether `lent` may have entries (so that answers need no lock when it has none).
    any_lent: AtomicBool,
    /// Set when the touch thread has new work (a touch to send, a directory held back), so
    /// that an idle server's thread sleeps instead of looking every few milliseconds.
    work: Mutex<bool>,
    /// Wakes the touch thread when `work` is set.
    work_noted: Condvar,
}

/// A directory's pending touch: the latest time, and how many subdirectories it gained.
type PendingTouch = (i64, i32);

/// Touches to send, in batches. Invariant: `pending` goes in batch `gathering`; every batch
/// numbered below `gathering` has been taken by a thread, and has been sent unless it is in
/// `in_flight`.
struct Batches {
    /// Touches waiting to be sent: the latest time for each directory, and how many
    /// subdirectories it gained (in path order, so that a seeded test schedule replays the
    /// same sends).
    pending: BTreeMap<String, PendingTouch>,
    /// When the oldest pending touch was noted.
    pending_since: Option<Instant>,
    /// The number of the batch the pending touches will go in.
    gathering: u64,
    /// Batches taken and not yet sent.
    in_flight: BTreeSet<u64>,
}

impl Default for Batches {
    fn default() -> Batches {
        Batches { pending: BTreeMap::new(), pending_since: None, gathering: 1, in_flight: BTreeSet::new() }
    }
}

impl Batches {
    /// Takes the pending touches as a batch to send.
    fn take_batch(&mut self) -> (u64, Vec<(String, PendingTouch)>) {
        self.pending_since = None;
        let batch = self.gathering;
        self.gathering += 1;
        self.in_flight.insert(batch);
        (batch, std::mem::take(&mut self.pending).into_iter().collect())
    }

    fn is_sent(&self, batch: u64) -> bool {
        batch < self.gathering && !self.in_flight.contains(&batch)
    }
}

/// The touches this server holds back.
#[derive(Default)]
struct Deferred {
    /// By directory path: the directories whose times are lent to this server.
    by_path: HashMap<String, Deferral>,
    /// Held-back touches of directories whose path changed meaning (renamed or removed),
    /// sent by file id with the next flush.
    loose: Vec<(FileId, i64)>,
    /// Held-back touches taken by the periodic send and not delivered yet: a collection
    /// meanwhile must still count them (the send may reach the inode after its answer).
    sending: Vec<(FileId, i64)>,
    /// Raised by every collection: a loan asked for before it may have been ended by it.
    collections: u64,
}

/// A directory whose times are lent to this server.
struct Deferral {
    file: FileId,
    /// The latest touch held back (0: none).
    pending_ns: i64,
    /// The last change of names in it here.
    last_change: Instant,
}

impl TouchState {
    fn batches(&self) -> MutexGuard<'_, Batches> {
        self.batches.lock()
    }

    fn deferred(&self) -> MutexGuard<'_, Deferred> {
        self.deferred.lock()
    }

    fn lent(&self) -> MutexGuard<'_, HashMap<FileId, Vec<String>>> {
        self.lent.lock()
    }

    /// Holds back a touch of `dir` if its times are lent to this server.
    fn hold_back(&self, dir: &str, time_ns: i64) -> bool {
        let mut deferred = self.deferred();
        match deferred.by_path.get_mut(dir) {
            Some(deferral) => {
                deferral.pending_ns = deferral.pending_ns.max(time_ns);
                deferral.last_change = crate::sched::now();
                true
            }
            None => false,
        }
    }

    /// Queues a touch of `dir` (no allocation for a directory queued already: the common
    /// case of a burst) and returns the number of the batch it goes in.
    fn note(&self, dir: &str, time_ns: i64, subdirectories: i32) -> u64 {
        let mut batches = self.batches();
        match batches.pending.get_mut(dir) {
            Some((latest, gained)) => {
                *latest = (*latest).max(time_ns);
                *gained += subdirectories;
            }
            None => {
                batches.pending.insert(dir.to_string(), (time_ns, subdirectories));
                if batches.pending_since.is_none() {
                    batches.pending_since = Some(Instant::now());
                    // Nobody will await a touch noted outside a request: the touch thread
                    // sends it. (Waking it for every request's touch cost creates and
                    // removes a fifth of their rate on 2 cores.)
                    if !SERVING.with(Cell::get) {
                        self.wake();
                    }
                }
            }
        }
        batches.gathering
    }

    /// Tells the touch thread it has work.
    fn wake(&self) {
        *self.work.lock() = true;
        self.work_noted.notify_one();
    }

    /// Sleeps the touch thread until it has work or `timeout` has passed.
    fn wait_for_work(&self, timeout: Duration) {
        let mut work = self.work.lock();
        if !*work {
            self.work_noted.wait_for(&mut work, timeout);
        }
        *work = false;
    }

    /// Whether this server holds touches back (or may soon: directories lent to it).
    fn holds_back(&self) -> bool {
        let deferred = self.deferred();
        !deferred.by_path.is_empty() || !deferred.loose.is_empty()
    }

    /// Batch `batch` has been sent.
    fn finished(&self, batch: u64) {
        let mut batches = self.batches();
        let was_in_flight = batches.in_flight.remove(&batch);
        debug_assert!(was_in_flight, "a batch is sent once");
        self.sent.notify_all();
    }

    /// The directory at `dir` (file `file`) is lent to this server, unless a collection
    /// came since `collections` (it may have ended this very loan).
    fn begin_deferral(&self, dir: &str, file: FileId, collections: u64) {
        let mut deferred = self.deferred();
        if deferred.collections == collections {
            deferred.by_path.entry(dir.to_string()).or_insert(Deferral { file, pending_ns: 0, last_change: crate::sched::now() });
            drop(deferred);
            // From now on the touch thread sends held-back touches every DEFERRAL_FLUSH.
            self.wake();
        }
    }

    /// `CollectTouches`: ends the loans of `file` here and returns the latest touch held
    /// back (0: none).
    fn hand_over(&self, file: FileId) -> i64 {
        let mut deferred = self.deferred();
        deferred.collections += 1;
        let mut latest = 0;
        deferred.by_path.retain(|_, deferral| {
            if deferral.file != file {
                return true;
            }
            latest = latest.max(deferral.pending_ns);
            false
        });
        deferred.loose.retain(|(loose, time_ns)| {
            if *loose != file {
                return true;
            }
            latest = latest.max(*time_ns);
            false
        });
        for (sending, time_ns) in &deferred.sending {
            if *sending == file {
                latest = latest.max(*time_ns);
            }
        }
        latest
    }

    /// The path `dir` and the paths below it change meaning (a directory rename or rmdir):
    /// touches held back for them are sent by file id, and no more are held back.
    fn forget_under(&self, dir: &str) {
        let mut deferred = self.deferred();
        let Deferred { by_path, loose, .. } = &mut *deferred;
        by_path.retain(|path, deferral| {
            if !path::is_inside(path, dir) {
                return true;
            }
            if deferral.pending_ns != 0 {
                loose.push((deferral.file, deferral.pending_ns));
            }
            false
        });
    }

    /// The held-back touches to send now, each with whether its loan goes on; idle
    /// deferrals end.
    fn take_held_back(&self) -> Vec<(FileId, i64, bool)> {
        let mut deferred = self.deferred();
        let mut touches: Vec<(FileId, i64, bool)> = deferred.loose.drain(..).map(|(file, time_ns)| (file, time_ns, false)).collect();
        deferred.by_path.retain(|_, deferral| {
            if deferral.pending_ns != 0 {
                touches.push((deferral.file, deferral.pending_ns, true));
                deferral.pending_ns = 0;
                return true;
            }
            crate::sched::since(deferral.last_change) < IDLE_DEFERRAL
        });
        deferred.sending.extend(touches.iter().map(|(file, time_ns, _)| (*file, *time_ns)));
        touches
    }

    /// The held-back touches taken by [`TouchState::take_held_back`] have been delivered
    /// (or given up on).
    fn sent_held_back(&self, touches: &[(FileId, i64)]) {
        let mut deferred = self.deferred();
        for touch in touches {
            if let Some(position) = deferred.sending.iter().position(|sending| sending == touch) {
                deferred.sending.swap_remove(position);
            }
        }
    }

    /// At the inode's server: the times of directory `file` are lent to server `to`.
    fn lend(&self, file: FileId, to: &str) {
        let mut lent = self.lent();
        let holders = lent.entry(file).or_default();
        if !holders.iter().any(|holder| holder == to) {
            holders.push(to.to_string());
        }
        self.any_lent.store(true, Ordering::Release);
    }

    /// Ends the loans of `file`, returning the servers that held them.
    fn end_loans(&self, file: FileId) -> Vec<String> {
        let mut lent = self.lent();
        let holders = lent.remove(&file).unwrap_or_default();
        if lent.is_empty() {
            self.any_lent.store(false, Ordering::Release);
        }
        holders
    }
}

/// What to do next about a batch.
enum Turn {
    /// It has been sent.
    Sent,
    /// Send it: its touches are these.
    Send(u64, Vec<(String, PendingTouch)>),
    /// The wait is over without it.
    GiveUp,
}

/// Directory times: the touches this server sends, holds back and collects.
pub struct DirTimes {
    node: Arc<Node>,
    gate: Arc<NamespaceGate>,
    state: TouchState,
}

impl DirTimes {
    pub fn new(node: Arc<Node>, gate: Arc<NamespaceGate>) -> DirTimes {
        DirTimes { node, gate, state: TouchState::default() }
    }

    /// `CollectTouches`: ends the loans of `file` here and returns the latest touch held
    /// back (0: none).
    pub fn hand_over(&self, file: FileId) -> i64 {
        self.state.hand_over(file)
    }

    /// The path `dir` and the paths below it change meaning (a directory rename or rmdir):
    /// touches held back for them are sent by file id, and no more are held back.
    pub fn forget_under(&self, dir: &str) {
        self.state.forget_under(dir);
    }

    /// A name in `child`'s parent directory was created, removed or renamed at `time_ns`.
    /// Held back if the directory's times are lent here; otherwise the request being
    /// handled answers once the touch is delivered (see the module doc).
    pub fn touch_parent(&self, child: &str, time_ns: i64) {
        self.touch_parent_counting(child, time_ns, 0);
    }

    /// [`DirTimes::touch_parent`] of a change that gave the parent `subdirectories` more
    /// subdirectories (negative: fewer); never held back when that is not 0.
    pub fn touch_parent_counting(&self, child: &str, time_ns: i64, subdirectories: i32) {
        let Some(parent) = path::parent(child) else { return };
        if subdirectories == 0 && self.state.hold_back(parent, time_ns) {
            return;
        }
        let batch = self.state.note(parent, time_ns, subdirectories);
        AWAITED_BATCH.with(|awaited| awaited.set(awaited.get().max(batch)));
    }

    /// Runs `handle`, the handling of a request, on this thread: the touches it notes are
    /// the request's to send or await ([`DirTimes::await_touches`], called after it).
    pub fn serving<T>(&self, handle: impl FnOnce() -> T) -> T {
        /// Restores the thread's mark when the handling ends (also by a panic).
        struct Restore(bool);
        impl Drop for Restore {
            fn drop(&mut self) {
                SERVING.with(|serving| serving.set(self.0));
            }
        }
        let _restore = Restore(SERVING.with(|serving| serving.replace(true)));
        handle()
    }

    /// Waits (at most [`TOUCH_WAIT`], and not past `deadline`, when the client stops
    /// waiting for the answer) until the touches noted by the request this thread served
    /// are delivered, sending them itself if no other thread has taken them. Called when a
    /// request's handler has returned.
    pub fn await_touches(&self, deadline: Option<Instant>) {
        let batch = AWAITED_BATCH.with(|awaited| awaited.replace(0));
        if batch == 0 {
            return;
        }
        let end = wait_end(deadline);
        match self.next_turn(batch, end) {
            Turn::Sent => {}
            Turn::Send(batch, touches) => {
                self.send_touches(touches, end);
                self.state.finished(batch);
            }
            Turn::GiveUp => log::debug!("answering before the directory touches of batch {batch} were delivered"),
        }
    }

    /// Whether `batch` is sent, or this thread is to send it (no other thread has taken it),
    /// or (at `end`) the wait is over.
    fn next_turn(&self, batch: u64, end: Instant) -> Turn {
        let times = &self.state;
        let mut batches = times.batches();
        loop {
            if batches.is_sent(batch) {
                return Turn::Sent;
            }
            if batch == batches.gathering {
                let (batch, touches) = batches.take_batch();
                return Turn::Send(batch, touches);
            }
            let now = crate::sched::now();
            if now >= end {
                return Turn::GiveUp;
            }
            crate::sched::wait_timeout(&times.sent, &mut batches, end - now);
        }
    }

    /// Sends one batch of touches by path, all at once, waiting for the answers until
    /// `end`; a directory whose times are lent here in answer is held back from then on.
    fn send_touches(&self, touches: Vec<(String, PendingTouch)>, end: Instant) {
        let collections = self.state.deferred().collections;
        let mut targets: Vec<(Member, DirTouch)> = Vec::new();
        for (dir, (time_ns, subdirectories)) in touches {
            if dir == "/" {
                let touch = DirTouch { path: String::new(), file: FileId::ROOT, time_ns, defer_for: String::new(), subdirectories };
                targets.extend(self.root_keepers(subdirectories != 0).into_iter().map(|member| (member, touch.clone())));
            } else {
                let touch =
                    DirTouch { path: dir.clone(), file: FileId::default(), time_ns, defer_for: self.node.name.clone(), subdirectories };
                targets.push((self.node.owner_of_path(&dir), touch));
            }
        }
        for (touch, outcome) in self.deliver_touches(targets, end) {
            match outcome {
                Ok(Response::DirTouched(file)) if !touch.defer_for.is_empty() => {
                    if !self.node.is_self(&self.node.owner_of_chunk(ChunkKey::inode(file))) {
                        self.state.begin_deferral(&touch.path, file, collections);
                    }
                }
                Ok(_) => {}
                Err(errno) => report_touch(&touch, errno),
            }
        }
    }

    /// The servers a touch of the root directory goes to. Every server holds the root, and
    /// answers for it when asked; clients ask the owner of its path (lookups) and the owner
    /// of its inode (`Stat` by id) while those answer, so its times go to those two — not
    /// to every server, which made a create in `/` cost a message to each. A change of its
    /// subdirectories goes to every server: whichever answers must count them (`find`
    /// relies on the link count), and mkdirs in `/` are few. (Another server, asked while
    /// those two cannot be, shows older times.)
    fn root_keepers(&self, counting: bool) -> Vec<Member> {
        if counting {
            return self.node.membership().list().members.clone();
        }
        let (by_path, by_id) = (self.node.owner_of_path("/"), self.node.owner_of_chunk(ChunkKey::inode(FileId::ROOT)));
        if by_path.name == by_id.name { vec![by_path] } else { vec![by_path, by_id] }
    }

    /// Sends each touch to its server (all at once; those for this server are applied
    /// here) and returns the answers, waiting for them until `end`.
    fn deliver_touches(&self, targets: Vec<(Member, DirTouch)>, end: Instant) -> Vec<(DirTouch, Result<Response, Errno>)> {
        let requests: Vec<(Member, Request)> =
            targets.iter().map(|(member, touch)| (member.clone(), Request::TouchDir(touch.clone()))).collect();
        let answers = self.node.ask_each(&requests, Some(end));
        targets.into_iter().map(|(_, touch)| touch).zip(answers).collect()
    }

    /// Sends touches noted outside a request (nobody awaits them), and every
    /// [`DEFERRAL_FLUSH`] the held-back ones, until the server stops.
    /// It sleeps while there is nothing to send: an idle server's threads do not wake every
    /// few milliseconds on a compute node (only every [`IDLE_WAKE`]).
    pub fn dir_times_loop(&self) {
        let mut last_flush = crate::sched::now();
        while !self.node.shutdown.is_requested() {
            if self.state.batches().pending_since.is_some() {
                std::thread::sleep(UNAWAITED_DELAY);
            } else if self.state.holds_back() {
                self.state.wait_for_work(DEFERRAL_FLUSH.saturating_sub(crate::sched::since(last_flush)));
            } else {
                self.state.wait_for_work(IDLE_WAKE);
            }
            let turn = {
                let mut batches = self.state.batches();
                let stale = batches.pending_since.is_some_and(|since| crate::sched::since(since) >= UNAWAITED_DELAY);
                stale.then(|| batches.take_batch())
            };
            if let Some((batch, touches)) = turn {
                self.send_touches(touches, crate::sched::now() + TOUCH_WAIT);
                self.state.finished(batch);
            }
            if crate::sched::since(last_flush) >= DEFERRAL_FLUSH {
                last_flush = crate::sched::now();
                self.flush_held_back();
            }
        }
    }

    /// Sends the held-back touches to the directories' inode servers.
    pub(crate) fn flush_held_back(&self) {
        let taken = self.state.take_held_back();
        let sent: Vec<(FileId, i64)> = taken.iter().map(|(file, time_ns, _)| (*file, *time_ns)).collect();
        let targets: Vec<(Member, DirTouch)> = taken
            .into_iter()
            .map(|(file, time_ns, lent_on)| {
                let defer_for = if lent_on { self.node.name.clone() } else { String::new() };
                (
                    self.node.owner_of_chunk(ChunkKey::inode(file)),
                    DirTouch { path: String::new(), file, time_ns, defer_for, subdirectories: 0 },
                )
            })
            .collect();
        if targets.is_empty() {
            return;
        }
        for (touch, outcome) in self.deliver_touches(targets, crate::sched::now() + TOUCH_WAIT) {
            if let Err(errno) = outcome {
                report_touch(&touch, errno);
            }
        }
        self.state.sent_held_back(&sent);
    }

    /// `TouchDir`: by path at the directory's name server (sent on to its inode), or by file
    /// at the inode, which lends the directory's times to `defer_for`.
    pub fn touch_dir(&self, touch: DirTouch) -> Result<Response, Errno> {
        if touch.path.is_empty() {
            self.node.store.touch_dir(touch.file, touch.time_ns, touch.subdirectories).map_err(store_errno)?;
            if !touch.defer_for.is_empty() && touch.defer_for != self.node.name {
                self.state.lend(touch.file, &touch.defer_for);
            }
            return Ok(Response::DirTouched(touch.file));
        }
        let entry = {
            let _pass = self.gate.pass(&[&touch.path], RenameToken::NONE)?;
            self.node.store.lookup(&touch.path, self.node.anchor_of(&touch.path), false).map_err(store_errno)?.0
        };
        if !entry.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        let onward = DirTouch { path: String::new(), file: entry.file, ..touch };
        self.node.ask_home(entry.file, Request::TouchDir(onward))
    }

    /// Before `response` leaves this server: the times of every directory it shows whose
    /// times are lent out are collected first (see the module doc), and shown; the
    /// collection waits until [`TOUCH_WAIT`] or `deadline` at most.
    pub fn settle_dir_times(&self, response: &mut Response, deadline: Option<Instant>) {
        if !self.state.any_lent.load(Ordering::Acquire) {
            return;
        }
        let mut attrs: Vec<&mut Attr> = match response {
            Response::Attr(attr) => vec![attr],
            Response::Opened(opened) => vec![&mut opened.attr],
            Response::DirPage(page) => page.entries.iter_mut().filter_map(|entry| entry.attr.as_mut()).collect(),
            _ => return,
        };
        attrs.retain(|attr| attr.is_dir());
        for attr in attrs {
            let holders = self.state.end_loans(attr.file_id);
            if holders.is_empty() {
                continue;
            }
            if self.collect_touches(attr.file_id, &holders, wait_end(deadline)) != 0
                && let Ok(now) = self.node.store.stat(attr.file_id)
            {
                attr.mtime_ns = now.mtime_ns;
                attr.ctime_ns = now.ctime_ns;
            }
        }
    }

    /// Asks `holders` for the touches of directory `file` they held back (waiting for them
    /// until `end`), applies the latest here and returns it (0: none).
    fn collect_touches(&self, file: FileId, holders: &[String], end: Instant) -> i64 {
        let requests: Vec<(Member, Request)> = {
            let membership = self.node.membership();
            holders
                .iter()
                .filter_map(|name| membership.member(name).cloned())
                .map(|member| (member, Request::CollectTouches(FileOnly { file })))
                .collect()
        };
        let mut latest = 0;
        for ((member, _), answer) in requests.iter().zip(self.node.ask_each(&requests, Some(end))) {
            match answer {
                Ok(Response::TouchTime(time_ns)) => latest = latest.max(time_ns),
                Ok(other) => log::debug!("server {} answered CollectTouches with {other:?}", member.name),
                Err(errno) => log::debug!("could not collect the touches of directory {file} from server {}: {errno}", member.name),
            }
        }
        if latest != 0
            && let Err(error) = self.node.store.touch_dir(file, latest, 0)
        {
            log::debug!("collected touches of directory {file} not applied: {error}");
        }
        latest
    }
}

/// The end of a wait for touches: [`TOUCH_WAIT`] from now, or the request's deadline if
/// that comes first.
fn wait_end(deadline: Option<Instant>) -> Instant {
    let limit = crate::sched::now() + TOUCH_WAIT;
    deadline.map_or(limit, |deadline| deadline.min(limit))
}

/// Logs a touch that was not delivered (in time).
fn report_touch(touch: &DirTouch, errno: Errno) {
    let what = if touch.path.is_empty() { format!("directory {}", touch.file) } else { touch.path.clone() };
    log::debug!("the times of {what} were not updated (yet): {errno}");
}
