//! Renaming directories (and `RENAME_EXCHANGE` of any two names).
//!
//! Names are keyed by full path, so renaming a directory changes the path of every name below
//! it: those entries move from server to server. Files do not move — names refer to file ids —
//! so the cost grows with the number of names in the tree, never with its bytes.
//!
//! The coordinator (the server of the old name) proceeds as follows:
//!
//! 1. It takes the cluster-wide **namespace lock**, held by the first server of the ring, so
//!    directory renames run one at a time: two renames of overlapping trees can then neither
//!    lose nor duplicate names, nor make a cycle. (Lustre's DNE takes a global rename lock for
//!    cross-directory renames for the same reason.) File renames do not take it.
//! 2. It locks both names (`Names::lock_names`) and checks the rename is allowed: no move into
//!    its own subtree, a target that is an empty directory or absent, an existing parent.
//! 3. **Freeze**: every server stops operations on names at or below both paths and lets the
//!    running ones finish (`gate::NamespaceGate`); all servers must answer, or nothing moves.
//! 4. **Move**: every server takes its names below the old path out of its index and sends
//!    them, at their new paths, to their new owners (`PutEntries`). Names a server receives
//!    before it has taken its own are held back until it has ([`SubtreeMoves`]): in an
//!    exchange the received names lie below the other root, and taking them would send them
//!    back.
//! 5. The new name is made to refer to the directory (replacing an empty directory there) and
//!    the old name goes — both steps carry the rename's token through the freeze.
//! 6. **Thaw**, then the locks are given back.
//!
//! Another client sees the tree either before or after: lookups and listings inside either
//! subtree wait during the move; the two parent directories' listings may show both names (or,
//! for an instant, only the old one) while the rename completes.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringfs_proto::path;
use ringfs_proto::{Errno, FileId, InstallMode, MovedEntry, PutEntries, RenameFlags, RenameToken, Request, Response, Subtree};

use crate::deadline::{WAIT_LIMIT, past_point_of_no_return, wait_end, wait_failure};
use crate::dir_times::DirTimes;
use crate::files::Files;
use crate::flusher::Flusher;
use crate::name_locks::{EndedTokens, LEASE, new_token};
use crate::names::{LockedRename, Names, Release};
use crate::node::{Node, store_errno};
use crate::outbound::retry_uncertain_for;
use crate::permissions::Permissions;

/// Why an attempt at a directory rename did not complete.
enum TreeRenameError {
    /// The freeze could not take hold while other renames inside were under way: nothing
    /// changed; try again after letting every lock go.
    Busy,
    Failed(Errno),
}

impl From<Errno> for TreeRenameError {
    fn from(errno: Errno) -> TreeRenameError {
        TreeRenameError::Failed(errno)
    }
}

/// This server's part of each directory rename under way, by token: whether it has taken
/// its own names yet, and the names other servers sent it before that.
///
/// Invariant: names received for a move are put into the index only after this server took
/// its names out for that move (or after the move ended without a take here).
///
/// It also remembers the last renames that ended here (thawed): a step of one of them that
/// arrives late — a request held up in the network past its retry — is refused. A late
/// `MoveSubtree` would otherwise take the names now below the old path (the directory may
/// have been renamed back since) and move them where no directory is.
///
/// Names taken out here that have not reached their new servers when the rename ends are
/// kept ([`SubtreeMoves::undelivered`]) and sent again until they have: they exist nowhere
/// else. While any are kept, this server refuses the next rename's freeze (EBUSY), so that
/// no later rename can move the tree on before they arrive.
#[derive(Default)]
struct SubtreeMoves {
    moves: Mutex<HashMap<RenameToken, SubtreeMove>>,
    ended: Mutex<EndedRenames>,
    undelivered: Mutex<Vec<(RenameToken, MovedEntry)>>,
    /// Held while undelivered names are sent again: a freeze that finds none waiting must not
    /// pass while another thread's sends of them may still fail.
    sending: Mutex<()>,
}

/// Tokens of the last [`ENDED_KEPT`] renames that ended on this server.
#[derive(Default)]
struct EndedRenames {
    tokens: std::collections::HashSet<RenameToken>,
    order: std::collections::VecDeque<RenameToken>,
}

/// How many ended renames a server remembers (a late step comes within seconds; thousands
/// of renames do not end in that time).
const ENDED_KEPT: usize = 4096;

#[derive(Default)]
struct SubtreeMove {
    /// When this server first heard of the move (its freeze or its step).
    began: Option<Instant>,
    taken: bool,
    held_back: Vec<MovedEntry>,
    /// Names taken out here whose new server has not confirmed them yet: a repeated
    /// `MoveSubtree` sends them again (they must never be dropped: they exist nowhere else).
    unsent: Vec<MovedEntry>,
    /// A tree moving into the cached tree: names taken out here whose files' inodes have not
    /// confirmed their backend place yet (a repeated `MoveSubtree` tells them again).
    unbound: Vec<MovedEntry>,
}

impl SubtreeMoves {
    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<RenameToken, SubtreeMove>> {
        self.moves.lock()
    }

    /// A rename froze this server: its move has begun.
    pub fn begin(&self, token: RenameToken) {
        self.lock().entry(token).or_default().began.get_or_insert_with(crate::sched::now);
    }

    /// Whether a rename other than `token`, heard of within a lease, still has names taken
    /// out here that have not reached their new servers.
    fn unsent_elsewhere(&self, token: RenameToken) -> bool {
        let now = crate::sched::now();
        self.lock().iter().any(|(other, state)| {
            *other != token && !state.unsent.is_empty() && state.began.is_none_or(|began| now.saturating_duration_since(began) < LEASE)
        })
    }

    /// Rename `token` ended here.
    fn record_end(&self, token: RenameToken) {
        let mut ended = self.ended.lock();
        if ended.tokens.insert(token) {
            ended.order.push_back(token);
            if ended.order.len() > ENDED_KEPT
                && let Some(oldest) = ended.order.pop_front()
            {
                ended.tokens.remove(&oldest);
            }
        }
    }

    /// Rename `token` ended here: a step of it now is a late one.
    pub fn has_ended(&self, token: RenameToken) -> bool {
        self.ended.lock().tokens.contains(&token)
    }
}

/// Most bytes of paths one `PutEntries` carries: a tree with long paths moves in several
/// requests, each far below the frame limit (`MAX_BODY_LEN`, 4 MiB).
const PUT_ENTRIES_BYTES: usize = 1 << 20;

/// This server's part in directory renames: the coordinator of those it is asked for, the
/// steps every server takes (freeze, move, thaw), and, on the first server of the ring, the
/// namespace lock.
pub struct DirectoryRenames {
    node: Arc<Node>,
    names: Arc<Names>,
    files: Arc<Files>,
    dir_times: Arc<DirTimes>,
    permissions: Arc<Permissions>,
    flusher: Arc<Flusher>,
    moves: SubtreeMoves,
    /// On the first server of the ring: the directory rename that holds the namespace lock.
    namespace_lock: Mutex<Option<(RenameToken, Instant)>>,
    /// Renames that gave the namespace lock back (a late acquisition of theirs is refused).
    namespace_lock_ended: EndedTokens,
}

impl DirectoryRenames {
    pub fn new(
        node: Arc<Node>,
        names: Arc<Names>,
        files: Arc<Files>,
        dir_times: Arc<DirTimes>,
        permissions: Arc<Permissions>,
        flusher: Arc<Flusher>,
    ) -> DirectoryRenames {
        DirectoryRenames {
            node,
            names,
            files,
            dir_times,
            permissions,
            flusher,
            moves: SubtreeMoves::default(),
            namespace_lock: Mutex::new(None),
            namespace_lock_ended: EndedTokens::default(),
        }
    }

    /// `Freeze`: this server stops operations on names at or below both paths until the thaw
    /// (see the module documentation).
    pub fn freeze(&self, subtree: &Subtree) -> Result<Response, Errno> {
        if self.moves.has_ended(subtree.token) {
            // A late copy of a freeze whose rename ended here: it would hold the
            // subtrees for a lease with nobody to thaw them.
            return Err(Errno::ESTALE);
        }
        if self.moves.unsent_elsewhere(subtree.token) || !self.send_undelivered() {
            // Names of an earlier rename (ended, or with its thaw not here yet) are still on
            // their way: a rename now could move the tree on before they arrive (the
            // coordinator tries again).
            return Err(Errno::EBUSY);
        }
        self.names.gate.freeze(subtree.token, &subtree.from, &subtree.to);
        if let Some(held) = self.names.locks().renamed_inside([&subtree.from, &subtree.to], subtree.token) {
            log::debug!("freeze of {} and {} waits for {held}", subtree.from, subtree.to);
            // A rename of a name inside is under way: the coordinator thaws and
            // tries again once it is done.
            return Err(Errno::EBUSY);
        }
        if self.node.in_cached_tree(&subtree.from) || self.node.in_cached_tree(&subtree.to) {
            // The rename moves the tree in the backend too, or (from outside the
            // cached tree) makes it there anew: no flush may change either path
            // meanwhile (the one under way ends first), and removals recorded below
            // them are applied first (a new name there must not be removed later).
            self.node.store.hold_backend(subtree.token, &[&subtree.from, &subtree.to], LEASE).map_err(store_errno)?;
            self.flusher.wait_for_flush_step();
        }
        self.moves.begin(subtree.token);
        for root in [&subtree.from, &subtree.to] {
            self.node.store.forget_dirs_under(root);
            self.permissions.forget_under(root);
            self.dir_times.forget_under(root);
        }
        Ok(Response::Done)
    }

    /// `Thaw`: the rename ended (names still held back are stored, the backend holds and
    /// the freeze end).
    pub fn thaw(&self, subtree: &Subtree) -> Result<Response, Errno> {
        self.end_subtree_move(subtree.token);
        self.node.store.release_backend(subtree.token);
        self.names.gate.thaw(subtree.token);
        Ok(Response::Done)
    }

    /// Names another server moved here: stored now, or held back until this server has taken
    /// its own names for the same rename.
    pub fn put_moved_entries(&self, put: PutEntries) -> Result<Response, Errno> {
        let mut moves = self.moves.lock();
        match moves.get_mut(&put.token) {
            Some(state) if !state.taken => state.held_back.extend(put.entries),
            _ => {
                drop(moves);
                self.node.store.put_entries(&put.entries).map_err(store_errno)?;
            }
        }
        Ok(Response::Done)
    }

    /// The rename `token` ended (thaw): names still held back are stored, so none is lost
    /// even if this server never got its own move step.
    fn end_subtree_move(&self, token: RenameToken) {
        let state = {
            // Under the moves' lock: a step of this rename either ran before or sees it ended.
            let mut moves = self.moves.lock();
            self.moves.record_end(token);
            moves.remove(&token)
        };
        let Some(state) = state else { return };
        if let Err(error) = self.node.store.put_entries(&state.held_back) {
            log::error!("directory rename: storing names moved here failed: {error}");
        }
        if !state.unsent.is_empty()
            && let Err(unsent) = self.send_moved(token, state.unsent)
        {
            log::warn!(
                "directory rename: {} names moved from here have not reached their new servers yet (sent again later)",
                unsent.len()
            );
            self.moves.undelivered.lock().extend(unsent.into_iter().map(|entry| (token, entry)));
        }
    }

    /// Ends the moves of renames this server heard of more than two leases ago and never
    /// heard the end of (their coordinator died, and their freeze has lapsed): the names
    /// held back are stored and those not sent yet are kept to be sent again, as at a thaw
    /// (every heartbeat).
    pub fn end_lapsed_moves(&self) {
        let now = crate::sched::now();
        let lapsed: Vec<RenameToken> = self
            .moves
            .lock()
            .iter()
            .filter(|(_, state)| state.began.is_some_and(|began| now.saturating_duration_since(began) > 2 * LEASE))
            .map(|(token, _)| *token)
            .collect();
        for token in lapsed {
            log::warn!("directory rename {token:?} never ended here: its move ends now");
            self.end_subtree_move(token);
        }
    }

    /// Sends again the names of ended renames that have not reached their new servers
    /// (every heartbeat, and before a freeze): whether none is left.
    pub fn send_undelivered(&self) -> bool {
        let _sending = self.moves.sending.lock();
        let waiting = std::mem::take(&mut *self.moves.undelivered.lock());
        if waiting.is_empty() {
            return true;
        }
        let mut by_token: BTreeMap<RenameToken, Vec<MovedEntry>> = BTreeMap::new();
        for (token, entry) in waiting {
            by_token.entry(token).or_default().push(entry);
        }
        let mut left = Vec::new();
        for (token, entries) in by_token {
            if let Err(unsent) = self.send_moved(token, entries) {
                left.extend(unsent.into_iter().map(|entry| (token, entry)));
            }
        }
        let delivered = left.is_empty();
        // (Beside names another thread may have added meanwhile.)
        self.moves.undelivered.lock().extend(left);
        delivered
    }

    /// A tree moving into the cached tree: tells the inodes of the names taken out here
    /// where their files now live in the backend (each is made there anew, data and all,
    /// when flushed; a file with two names in the tree gets the second as a hard link).
    /// Done within the rename's freeze, so no later rename of those names can come first.
    /// EIO if an inode could not be told (a repeated step tells the rest again).
    fn bind_moved_into_cached_tree(&self, token: RenameToken) -> Result<(), Errno> {
        let unbound = match self.moves.lock().get_mut(&token) {
            Some(state) => std::mem::take(&mut state.unbound),
            None => return Ok(()),
        };
        let mut left = Vec::new();
        for moved in unbound {
            if let Err(errno) =
                retry_uncertain_for(Duration::from_secs(2), || self.files.bind_into_cached_tree(moved.entry.file, &moved.path))
            {
                log::warn!("directory rename into the cached tree: {} not bound to its backend place yet: {errno}", moved.path);
                left.push(moved);
            }
        }
        if left.is_empty() {
            return Ok(());
        }
        if let Some(state) = self.moves.lock().get_mut(&token) {
            state.unbound.extend(left);
        }
        Err(Errno::EIO)
    }

    /// Sends names taken out for a directory rename to their new servers; those that could
    /// not be sent are returned (the caller keeps them to try again).
    fn send_moved(&self, token: RenameToken, moved: Vec<MovedEntry>) -> Result<(), Vec<MovedEntry>> {
        // (In name order, so that a seeded test schedule replays the same sends.)
        let mut by_owner: BTreeMap<String, (ringfs_proto::Member, Vec<MovedEntry>)> = BTreeMap::new();
        for entry in moved {
            let owner = self.node.owner_of_path(&entry.path);
            by_owner.entry(owner.name.clone()).or_insert_with(|| (owner, Vec::new())).1.push(entry);
        }
        let mut unsent = Vec::new();
        for (_, (owner, mut entries)) in by_owner {
            // In requests of at most PUT_ENTRIES_BYTES of paths, far below the frame limit.
            while !entries.is_empty() {
                let mut bytes = 0;
                let count = entries
                    .iter()
                    .take_while(|entry| {
                        bytes += entry.path.len();
                        bytes <= PUT_ENTRIES_BYTES
                    })
                    .count();
                let rest = entries.split_off(count.max(1));
                // Storing the same names twice is harmless: a lost answer is simply asked again.
                let put =
                    |entries: &Vec<MovedEntry>| self.node.ask(&owner, Request::PutEntries(PutEntries { token, entries: entries.clone() }));
                if let Err(errno) = put(&entries).or_else(|_| put(&entries)) {
                    log::info!("directory rename: server {} did not take its names yet: {errno}", owner.name);
                    unsent.append(&mut entries);
                }
                entries = rest;
            }
        }
        if unsent.is_empty() { Ok(()) } else { Err(unsent) }
    }

    /// On the first server of the ring: takes or gives back the namespace lock for `token`.
    pub fn namespace_lock_step(&self, token: RenameToken, acquire: bool) -> Result<Response, Errno> {
        let started = crate::sched::now();
        let deadline = started + WAIT_LIMIT;
        let mut warned = false;
        loop {
            let mut held = self.namespace_lock.lock();
            let now = crate::sched::now();
            if acquire && self.namespace_lock_ended.has_ended(token) {
                // Overtaken by its release: that rename is over.
                return Err(Errno::ETIMEDOUT);
            }
            if !acquire {
                self.namespace_lock_ended.end(token);
            }
            match *held {
                Some((holder, _)) if !acquire => {
                    if holder == token {
                        *held = None;
                    }
                    return Ok(Response::Done);
                }
                None if !acquire => return Ok(Response::Done),
                Some((holder, until)) if holder != token && until > now => {}
                _ => {
                    *held = Some((token, now + LEASE));
                    return Ok(Response::Done);
                }
            }
            drop(held);
            if now >= deadline {
                return Err(Errno::EBUSY);
            }
            if !warned && now - started > Duration::from_secs(1) {
                warned = true;
                log::warn!("waiting {:?} for the namespace lock", now - started);
            }
            crate::sched::pause(Duration::from_millis(5));
        }
    }

    /// Renames a directory, or exchanges two names (see the module documentation).
    pub fn rename_tree(&self, from: &str, to: &str, time_ns: i64, flags: u32) -> Result<Response, Errno> {
        if self.node.in_cached_tree(from) && !self.node.in_cached_tree(to)
            || moves_into_cached_tree(&self.node, from, to) && flags & RenameFlags::EXCHANGE != 0
        {
            // A tree leaving the cached tree would take along everything the backend holds
            // in it, loaded file by file — a copy, which `mv` does itself on EXDEV. (A tree
            // entering it is made there anew: below.)
            return Err(Errno::EXDEV);
        }
        let token = new_token();
        log::trace!("tree rename {from} -> {to} is {token:x}");
        self.names.namespace_lock_at_first(token, true)?;
        // The parents' names too: neither may be removed (or renamed) while names move below
        // them. The root cannot be removed.
        let mut names = vec![from, to];
        names.extend([path::parent(from), path::parent(to)].into_iter().flatten().filter(|parent| *parent != "/"));
        // A rename or link inside the trees keeps the freeze from taking hold; it may itself
        // wait for one of our names. So we let everything go and try again (bounded).
        let deadline = wait_end(crate::sched::now());
        let mut pause = Duration::from_millis(1);
        let outcome = loop {
            // Each attempt has a token of its own: a release or thaw of an earlier attempt
            // that is tried again late must not end this one's locks or freeze.
            let attempt_token = new_token();
            let attempt = self.names.lock_names(&names, attempt_token).map_err(TreeRenameError::Failed).and_then(|entries| {
                let locked = LockedRename { from, to, source: entries[0], target: entries[1], time_ns, flags, token: attempt_token };
                let outcome = self.rename_tree_locked(locked);
                self.names.unlock_names(&names, attempt_token);
                outcome
            });
            match attempt {
                Err(TreeRenameError::Busy) if crate::sched::now() + pause < deadline => {
                    crate::sched::pause(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Err(TreeRenameError::Busy) => break Err(wait_failure()),
                Err(TreeRenameError::Failed(errno)) => break Err(errno),
                Ok(response) => break Ok(response),
            }
        };
        if let Err(errno) = self.names.namespace_lock_at_first(token, false) {
            log::info!("could not give back the namespace lock yet: {errno} (trying again)");
            self.names.release_later(Release::NamespaceLock { token });
        }
        outcome
    }

    /// The rename with its names locked; [`TreeRenameError::Busy`] when the freeze could not
    /// take hold (nothing changed).
    fn rename_tree_locked(&self, rename: LockedRename<'_>) -> Result<Response, TreeRenameError> {
        let LockedRename { from, to, source, target, time_ns, flags, token } = rename;
        let source = source.ok_or(Errno::ENOENT)?;
        let exchange = flags & RenameFlags::EXCHANGE != 0;
        let mut replaced_dir = None;
        match target {
            None if exchange => return Err(Errno::ENOENT.into()),
            Some(_) if flags & RenameFlags::NOREPLACE != 0 => return Err(Errno::EEXIST.into()),
            Some(target) if target.file == source.file => return Ok(Response::Done),
            Some(_) if exchange => {}
            Some(target) if !target.is_dir() => return Err(Errno::ENOTDIR.into()),
            Some(target) => {
                self.names.check_empty(to)?;
                replaced_dir = Some(target);
            }
            None => {}
        }
        if let Some(parent) = path::parent(to)
            && parent != "/"
        {
            self.names.resolve_parent(parent)?;
        }
        // In the cached tree, an exchange of two files moves backend files like a directory
        // rename does (the backend paths of both inodes change), so it takes the same path.
        let cached = self.node.in_cached_tree(from);
        let moves_trees = cached || source.is_dir() || target.is_some_and(|target| target.is_dir());
        let subtree = Subtree { token, from: from.to_string(), to: to.to_string(), exchange };
        if moves_trees {
            self.freeze_everywhere(&subtree)?;
        }
        if cached {
            // The backend moves first, while every server holds both paths: if it fails,
            // nothing has changed anywhere.
            if let Err(error) = self.node.store.move_in_backend(from, to, exchange) {
                log::warn!("rename {from} -> {to}: moving the backend entry failed: {error}");
                self.thaw_everywhere(&subtree);
                return Err(store_errno(error).into());
            }
        }
        let outcome = past_point_of_no_return(|| -> Result<(), Errno> {
            // From the first move on there is no way back: names may have left some servers.
            // So every step is repeated until it is done (each is safe to repeat), for up to
            // half the freeze's lease, whatever the client's deadline.
            if moves_trees {
                self.move_everywhere(&subtree)
                    .inspect_err(|errno| log::error!("rename {from} -> {to}: moving names failed on a server: {errno}"))?;
            }
            let retry = |step: &dyn Fn() -> Result<(), Errno>| retry_uncertain_for(LEASE / 2, step);
            if exchange {
                let target = target.expect("an exchange has a target");
                retry(&|| self.names.install_at(to, source, InstallMode::EXCHANGE, target.file, false, token).map(drop))?;
                retry(&|| self.names.install_at(from, target, InstallMode::EXCHANGE, source.file, false, token).map(drop))?;
                self.names.touch_ctime(target.file, time_ns)?;
            } else {
                retry(&|| self.names.install_at(to, source, InstallMode::REPLACE, FileId::default(), true, token).map(drop))?;
                retry(&|| {
                    if !self.names.remove_at(from, source.file, token)? {
                        log::debug!("rename {from} -> {to}: the old name was gone already (a repeated step)");
                    }
                    Ok(())
                })?;
                if moves_into_cached_tree(&self.node, from, to) {
                    // The names below moved with their servers' steps; the directory itself:
                    retry(&|| self.files.bind_into_cached_tree(source.file, to))?;
                }
            }
            self.names.touch_ctime(source.file, time_ns)
        });
        if moves_trees {
            self.thaw_everywhere(&subtree);
        }
        outcome?;
        // The parents' times, and their subdirectories: the source's kind leaves `from` and
        // enters `to`; the target's (replaced, or exchanged into `from`) leaves `to`.
        let (source_dir, target_dir) = (i32::from(source.is_dir()), i32::from(target.is_some_and(|target| target.is_dir())));
        self.dir_times.touch_parent_counting(from, time_ns, if exchange { target_dir } else { 0 } - source_dir);
        self.dir_times.touch_parent_counting(to, time_ns, source_dir - target_dir);
        if let Some(replaced) = replaced_dir {
            self.files.drop_link(replaced.file, time_ns, None)?;
        }
        Ok(Response::Done)
    }

    /// Freezes both subtrees on every server; all must answer, or the freeze is undone. A
    /// server where a rename, link or rmdir of a name inside is under way answers EBUSY: the
    /// freeze is undone and [`TreeRenameError::Busy`] returned, so that the caller lets its
    /// own names go (that rename may be waiting for one) and tries again.
    fn freeze_everywhere(&self, subtree: &Subtree) -> Result<(), TreeRenameError> {
        let answers = self.node.broadcast(&Request::Freeze(subtree.clone()));
        let Some(errno) = answers.into_iter().find_map(Result::err) else { return Ok(()) };
        self.thaw_everywhere(subtree);
        Err(if errno == Errno::EBUSY { TreeRenameError::Busy } else { TreeRenameError::Failed(errno) })
    }

    /// Asks every server to move its names (`MoveSubtree`), again and again to those that
    /// did not confirm, until all have or half the freeze's lease has passed.
    fn move_everywhere(&self, subtree: &Subtree) -> Result<(), Errno> {
        let deadline = crate::sched::now() + LEASE / 2;
        let mut pending: Vec<String> = self.node.membership().list().members.iter().map(|member| member.name.clone()).collect();
        let mut pause = Duration::from_millis(20);
        loop {
            // Each round takes the members as they are now: one declared dead for a moment
            // and back again must be asked again, not skipped as dead.
            let members: Vec<ringfs_proto::Member> =
                pending.iter().filter_map(|name| self.node.membership().member(name).cloned()).collect();
            let targets: Vec<_> = members.iter().map(|member| (member.clone(), Request::MoveSubtree(subtree.clone()))).collect();
            let answers = self.node.ask_each(&targets, None);
            let mut last_error = Errno::EIO;
            pending = members
                .into_iter()
                .zip(answers)
                .filter_map(|(member, answer)| {
                    answer.err().map(|errno| {
                        last_error = errno;
                        member.name
                    })
                })
                .collect();
            if pending.is_empty() {
                return Ok(());
            }
            if crate::sched::now() + pause >= deadline {
                return Err(last_error);
            }
            crate::sched::pause(pause);
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    fn thaw_everywhere(&self, subtree: &Subtree) {
        if let Some(errno) = self.node.broadcast(&Request::Thaw(subtree.clone())).into_iter().find_map(Result::err) {
            log::info!("a server did not hear the end of a directory rename yet: {errno} (trying again)");
            self.names.release_later(Release::Thaw(subtree.clone()));
        }
    }

    /// This server's step of a directory rename: its names below the old path (and, for an
    /// exchange, below the new one) go to their owners under the other path.
    pub fn move_subtree(&self, subtree: &Subtree) -> Result<Response, Errno> {
        let (moved, held_back) = {
            let mut moves = self.moves.lock();
            if self.moves.has_ended(subtree.token) {
                log::info!("a late step of a directory rename that ended here ({} -> {}): refused", subtree.from, subtree.to);
                return Err(Errno::ESTALE);
            }
            let state = moves.entry(subtree.token).or_default();
            state.began.get_or_insert_with(crate::sched::now);
            if state.taken {
                // A repeated step (its answer was lost, or names did not reach their server):
                // send again what is still unsent.
                (std::mem::take(&mut state.unsent), Vec::new())
            } else {
                let mut moved = self.node.store.take_subtree(&subtree.from, &subtree.to).map_err(store_errno)?;
                if subtree.exchange {
                    moved.extend(self.node.store.take_subtree(&subtree.to, &subtree.from).map_err(store_errno)?);
                }
                if !subtree.exchange && moves_into_cached_tree(&self.node, &subtree.from, &subtree.to) {
                    state.unbound = moved.clone();
                }
                state.taken = true;
                // Cache mode: the backend tree has moved (the coordinator did it under the
                // hold); the inodes here now live at the new paths. (A tree entering the
                // cached tree moved nothing in the backend: its inodes are bound below —
                // some perhaps already, by other servers' steps, which a rebase would undo.)
                if self.node.in_cached_tree(&subtree.from)
                    && let Err(error) = self.node.store.rebase_backend_paths(&subtree.from, &subtree.to, subtree.exchange)
                {
                    log::error!("directory rename: recording the new backend paths failed: {error}");
                }
                (moved, std::mem::take(&mut state.held_back))
            }
        };
        self.node.store.put_entries(&held_back).map_err(store_errno)?;
        self.bind_moved_into_cached_tree(subtree.token)?;
        let count = moved.len() as u64;
        if let Err(unsent) = self.send_moved(subtree.token, moved) {
            // Taken: the move is done here, and the names reach their servers later — again
            // with a repeated step, at the thaw, and then every heartbeat until they have
            // (`send_undelivered`). Failing the step instead would make the coordinator give
            // the rename up with names already at their new paths below no directory.
            match self.moves.lock().get_mut(&subtree.token) {
                Some(state) => state.unsent.extend(unsent),
                None => self.moves.undelivered.lock().extend(unsent.into_iter().map(|entry| (subtree.token, entry))),
            }
        }
        Ok(Response::Count(count))
    }
}

/// Whether a rename from `from` to `to` moves a tree into the cached tree (from outside it).
fn moves_into_cached_tree(node: &Node, from: &str, to: &str) -> bool {
    !node.in_cached_tree(from) && node.in_cached_tree(to)
}
