//! This server as the other parts see it: its name, its store, the member list, and the way
//! to ask any server (itself included) to do something.
//!
//! [`Node::ask`] is the one call coordinators make: for another server it goes out through
//! the [`Outbound`] interface; for this server it is run in place by the dispatcher
//! (through [`LocalDispatch`], which the dispatcher installs once it exists), so a
//! coordinator never cares whether a step is local.

use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use ringfs_proto::{ChunkIndex, ChunkKey, Errno, FileId, Member, Request, Response};
use ringfs_rpc::{ConnectionConfig, Reply};
use ringfs_store::{ChunkStore, StoreError};

use crate::membership::Membership;
use crate::outbound::{Outbound, OutboundCall};

/// Largest chunk size a file may be created with (one chunk must fit in a frame).
pub use ringfs_proto::limits::MAX_CHUNK_SIZE;

/// The errno a store error answers (a failure of the store's directory is logged here).
pub fn store_errno(error: StoreError) -> Errno {
    if let StoreError::Directory(io) = &error {
        log::error!("store failure: {io}");
    }
    error.errno()
}

/// Raised once to stop the server.
#[derive(Default)]
pub struct ShutdownSignal {
    requested: Mutex<bool>,
    changed: Condvar,
    /// Every server of the cluster is being stopped: this one need not tell the others.
    everyone: AtomicBool,
}

impl ShutdownSignal {
    /// Notes that every server of the cluster is being stopped (before [`Self::request`]).
    pub fn with_everyone(&self) {
        self.everyone.store(true, Ordering::Relaxed);
    }

    /// Whether every server of the cluster is being stopped.
    pub fn everyone_stops(&self) -> bool {
        self.everyone.load(Ordering::Relaxed)
    }

    pub fn request(&self) {
        *self.requested.lock() = true;
        self.changed.notify_all();
    }

    pub fn is_requested(&self) -> bool {
        *self.requested.lock()
    }

    /// Blocks until a shutdown is requested, or `timeout` passes; returns whether requested.
    pub fn wait(&self, timeout: Duration) -> bool {
        let mut requested = self.requested.lock();
        self.changed.wait_while_for(&mut requested, |requested| !*requested, timeout);
        *requested
    }
}

/// Runs a request a server makes of itself, in the calling thread (provided by the
/// dispatcher).
pub trait LocalDispatch: Send + Sync {
    /// Executes `request` here as a step of this server's own (acting as root, no routing).
    fn execute_here(&self, request: Request, data: &[u8]) -> Result<Reply, Errno>;
}

/// This server: what every part of it shares.
pub struct Node {
    pub name: String,
    pub store: ChunkStore,
    membership: RwLock<Membership>,
    outbound: Arc<dyn Outbound>,
    local: OnceLock<Weak<dyn LocalDispatch>>,
    /// How this server connects to others (and to the ranks of the global memory).
    pub connection_config: ConnectionConfig,
    /// Wakes the gossip thread to push the member list.
    gossip: Mutex<Sender<()>>,
    pub shutdown: ShutdownSignal,
}

impl Node {
    pub fn new(
        name: String,
        store: ChunkStore,
        membership: Membership,
        outbound: Arc<dyn Outbound>,
        connection_config: ConnectionConfig,
        gossip: Sender<()>,
    ) -> Node {
        Node {
            name,
            store,
            membership: RwLock::new(membership),
            outbound,
            local: OnceLock::new(),
            connection_config,
            gossip: Mutex::new(gossip),
            shutdown: ShutdownSignal::default(),
        }
    }

    /// Installs what runs the requests this server makes of itself (once, at start).
    pub fn set_local_dispatch(&self, local: Weak<dyn LocalDispatch>) {
        if self.local.set(local).is_err() {
            log::error!("the local dispatch of server {} was installed twice", self.name);
        }
    }

    pub fn membership(&self) -> RwLockReadGuard<'_, Membership> {
        self.membership.read()
    }

    pub fn membership_mut(&self) -> RwLockWriteGuard<'_, Membership> {
        self.membership.write()
    }

    /// Asks the gossip thread to push our member list to everyone.
    pub fn spread_members(&self) {
        let _ = self.gossip.lock().send(());
    }

    /// The owner of the entry of `path`, by our member list.
    pub fn owner_of_path(&self, path: &str) -> Member {
        self.membership().owner_of_path(path).clone()
    }

    /// The owner of a chunk of a file, by our member list.
    pub fn owner_of_chunk(&self, key: ChunkKey) -> Member {
        self.membership().owner(key.file.anchor, key.index).clone()
    }

    /// The servers that own chunks `first..=last` of `file`, each once, by our member list.
    pub fn owners_of_chunks(&self, file: FileId, first: ChunkIndex, last: ChunkIndex) -> Vec<Member> {
        self.membership().owners_of_chunks(file.anchor, first, last).into_iter().cloned().collect()
    }

    /// The server of `file`'s inode.
    pub fn home_of(&self, file: FileId) -> Member {
        self.owner_of_chunk(ChunkKey::inode(file))
    }

    /// The anchor of a file created at `path`.
    pub fn anchor_of(&self, path: &str) -> u32 {
        self.membership().anchor_of(path)
    }

    /// Whether `member` is this server.
    pub fn is_self(&self, member: &Member) -> bool {
        member.name == self.name
    }

    /// Whether `path` lies in the cached tree (cache mode).
    pub fn in_cached_tree(&self, path: &str) -> bool {
        self.store.backend().is_some_and(|backend| backend.covers(path))
    }

    /// Runs `request` (with `data`) at `member`: here if it is this server, otherwise by a
    /// request to it. An error answer is `Err`.
    /// A member our list says is dead is not asked (EIO at once).
    pub fn call(&self, member: &Member, request: &Request, data: &[u8]) -> Result<Reply, Errno> {
        if self.is_self(member) {
            return self.execute_here(request.clone(), data);
        }
        if !member.alive {
            return Err(Errno::EIO);
        }
        self.outbound.call(OutboundCall { to: member, request, data })
    }

    /// [`Node::call`] without data, answering the response alone.
    pub fn ask(&self, member: &Member, request: Request) -> Result<Response, Errno> {
        if self.is_self(member) {
            return self.execute_here(request, &[]).map(|reply| reply.response);
        }
        self.call(member, &request, &[]).map(|reply| reply.response)
    }

    /// Sends `request` to the server of `file`'s inode.
    pub fn ask_home(&self, file: FileId, request: Request) -> Result<Response, Errno> {
        self.ask(&self.home_of(file), request)
    }

    /// Runs each request at its server, all at once (the ones for this server here, after
    /// the others are on their way), waiting for the others until `until` at the latest;
    /// the answers in the order of `targets`.
    pub fn ask_each(&self, targets: &[(Member, Request)], until: Option<Instant>) -> Vec<Result<Response, Errno>> {
        // Members our list says are dead are not asked (EIO).
        let remote: Vec<OutboundCall<'_>> = targets
            .iter()
            .filter(|(member, _)| !self.is_self(member) && member.alive)
            .map(|(member, request)| OutboundCall { to: member, request, data: &[] })
            .collect();
        let mut local = Vec::new();
        let mut run_local = || {
            local = targets
                .iter()
                .filter(|(member, _)| self.is_self(member))
                .map(|(_, request)| self.execute_here(request.clone(), &[]).map(|reply| reply.response))
                .collect();
        };
        let remote = if remote.is_empty() {
            run_local();
            Vec::new()
        } else {
            self.outbound.call_each(&remote, until, &mut run_local)
        };
        let (mut local, mut remote) = (local.into_iter(), remote.into_iter());
        targets
            .iter()
            .map(|(member, _)| {
                let answer = if self.is_self(member) {
                    local.next()
                } else if member.alive {
                    remote.next().map(|reply| reply.map(|reply| reply.response))
                } else {
                    None
                };
                answer.unwrap_or(Err(Errno::EIO))
            })
            .collect()
    }

    /// Sends `request` to the owners of chunks `first..=last` of `file` (this server too, if
    /// it is one), each once; their answers.
    pub fn ask_owners_of_chunks(
        &self,
        file: FileId,
        first: ChunkIndex,
        last: ChunkIndex,
        request: &Request,
    ) -> Vec<Result<Response, Errno>> {
        let targets: Vec<(Member, Request)> =
            self.owners_of_chunks(file, first, last).into_iter().map(|member| (member, request.clone())).collect();
        self.ask_each(&targets, None)
    }

    /// Sends `request` to every server (this one included) and returns each answer, in the
    /// order of the member list.
    pub fn broadcast(&self, request: &Request) -> Vec<Result<Response, Errno>> {
        let members = self.membership().list().members.clone();
        let targets: Vec<(Member, Request)> = members.into_iter().map(|member| (member, request.clone())).collect();
        self.ask_each(&targets, None)
    }

    /// Sends `request` to every other alive member, waiting for the answers until `until` at
    /// the latest (`None`: the request deadline); returns their answers.
    pub fn broadcast_to_others(&self, request: &Request, until: Option<Instant>) -> Vec<Result<Reply, Errno>> {
        let others: Vec<Member> = self.membership().alive_members().filter(|member| !self.is_self(member)).cloned().collect();
        let calls: Vec<OutboundCall<'_>> = others.iter().map(|member| OutboundCall { to: member, request, data: &[] }).collect();
        self.outbound.call_each(&calls, until, &mut || {})
    }

    /// Sends `request` to the cache of the global-memory rank at `endpoint` (see
    /// [`Outbound::call_rank`]).
    pub fn call_rank(&self, endpoint: &str, request: &Request, data: &[u8]) -> Result<Reply, Errno> {
        self.outbound.call_rank(endpoint, request, data)
    }

    /// Tells `member` our member list, also when we believe it dead (it answered a ping
    /// again: it reads there that it was declared dead and refutes it), and takes what it
    /// answers (its list, when ours lacked something). Waits until `until` at most.
    pub fn push_members_to(&self, member: &Member, until: Option<Instant>) -> Result<(), Errno> {
        let request = Request::PushMembers(self.membership().list().clone());
        let reply = self.outbound.call_until(OutboundCall { to: member, request: &request, data: &[] }, until)?;
        self.take_members_answer(reply.response);
        Ok(())
    }

    /// The heartbeat's exchange with `member`: it compares our list's digest with its own
    /// and answers its list only when they differ; we merge it, and push ours back if it
    /// lacked something we know. Two servers that agree (nearly always) exchange their
    /// epochs and a digest, not a list of every member, and both keep the higher epoch (as a
    /// merge does): a client takes a list only if its epoch is higher than its own, so a
    /// server whose epoch lagged would not be heard when it had news. Waits until `until` at most for each answer.
    pub fn exchange_members_with(&self, member: &Member, until: Option<Instant>) -> Result<(), Errno> {
        let request = {
            let membership = self.membership();
            Request::MemberDigest(ringfs_proto::MemberDigest { epoch: membership.epoch(), digest: membership.list().digest() })
        };
        let reply = self.outbound.call_until(OutboundCall { to: member, request: &request, data: &[] }, until)?;
        let list = match reply.response {
            Response::Members(list) => list,
            Response::Count(epoch) => {
                self.membership_mut().raise_epoch(epoch);
                return Ok(());
            }
            _ => return Err(Errno::EPROTO),
        };
        let merged = self.membership_mut().merge(&list, &self.name);
        if merged.refuted {
            // (The refutation reaches every server, `member` too.)
            self.spread_members();
        } else if merged.sender_behind {
            self.push_members_to(member, until)?;
        }
        Ok(())
    }

    /// Pushes our member list to every other live server (the gossip), taking their answers.
    pub fn push_members_to_all(&self) {
        let request = Request::PushMembers(self.membership().list().clone());
        for reply in self.broadcast_to_others(&request, None).into_iter().flatten() {
            self.take_members_answer(reply.response);
        }
    }

    /// Merges the member list a server answered a push with (it knew more than we did).
    fn take_members_answer(&self, response: Response) {
        if let Response::Members(list) = response
            && self.membership_mut().merge(&list, &self.name).refuted
        {
            self.spread_members();
        }
    }

    /// How this server's connections to the others are carried (see [`Outbound::transports`]).
    pub fn peer_transports(&self) -> Vec<ringfs_proto::PeerTransport> {
        self.outbound.transports()
    }

    /// Whether `member` (alive or not in our view) answers a ping within `timeout`.
    pub fn ping(&self, member: &Member, timeout: Duration) -> bool {
        self.outbound.ping(member, timeout)
    }

    /// The attributes of `file`, from its inode's server.
    pub fn stat_file(&self, file: FileId) -> Result<ringfs_proto::Attr, Errno> {
        match self.ask_home(file, Request::Stat(ringfs_proto::FileOnly { file }))? {
            Response::Attr(attr) => Ok(attr),
            _ => Err(Errno::EPROTO),
        }
    }

    fn execute_here(&self, request: Request, data: &[u8]) -> Result<Reply, Errno> {
        match self.local.get().and_then(Weak::upgrade) {
            Some(local) => local.execute_here(request, data),
            // Only while the server starts or after it stopped.
            None => Err(Errno::EIO),
        }
    }
}
