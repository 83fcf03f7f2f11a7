//! Answering requests: authentication, routing, forwarding, and the requests one server
//! answers alone (chunks, attributes, opens).
//!
//! [`ServerState`] is the [`Service`] the RPC layer calls for every request. A request about
//! a key this server does not own (by its own member list) is forwarded to the owner and the
//! answer relayed, so clients with a stale list still work. Operations that involve several
//! servers live in `names` (creating, removing, linking and renaming names), `directory_rename`
//! and `files` (truncation, link counts, removal of a file's chunks everywhere).

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ringfs_proto::{
    BackendFileReply, ChunkKey, Credentials, Errno, FileId, Hello, HelloReply, Lease, Member, PROTOCOL_VERSION, Read, ReadReply, Request,
    Response, Route, ServerStats, Write, WriteSource,
};
use ringfs_rpc::log_limit::RateLimitedLog;
use ringfs_rpc::memory::{ProcessMemory, memory_probe};
use ringfs_rpc::{PeerIdentity, Service};
use ringfs_store::{BackendFile, ByteSource, ChunkStore, StoreError};

use crate::flusher::{FlushConfig, IoMonitor, counts_as_io};
use crate::locks::{NameLocks, NamespaceGate};
use crate::membership::Membership;
use crate::opens::OpenRegistry;
use crate::peers::Peers;

/// Largest chunk size a file may be created with (one chunk must fit in a frame).
pub use ringfs_proto::limits::MAX_CHUNK_SIZE;

/// Per-connection state.
#[derive(Default)]
pub struct Session {
    /// Memory of a client on this host that proved we can read it.
    pub(crate) client_memory: Option<ProcessMemory>,
    /// The peer is another server: its requests are never forwarded again.
    pub from_server: bool,
    /// The client's id (from its `Hello`), whose opens this connection keeps alive.
    client_id: Option<u64>,
    /// Buffers lent to the client by leased reads (of chunks and of global-memory blocks),
    /// until it releases them.
    pub(crate) leases: HashMap<u64, Arc<dyn std::any::Any + Send + Sync>>,
    pub(crate) next_lease_id: u64,
    /// How long a client waits for an answer, less a margin (from its `Hello`): requests are
    /// handled with that deadline (`locks::with_request_deadline`).
    patience: Option<std::time::Duration>,
    /// Recent samples of this server's clock less the client's stamp on a request (the
    /// `Hello` first): each is the clocks' offset plus that message's delay on the way, so
    /// their minimum is the best estimate of the offset, and a request's sample above it is
    /// its delay. A few dozen are kept, so that a clock set back is forgotten soon.
    clock_samples: std::collections::VecDeque<i64>,
    /// Whom a client's requests act for (from its `Hello`); `None` for another server, whose
    /// requests are steps of requests checked already.
    credentials: Option<Arc<Credentials>>,
}

/// Clock samples kept per session (see `Session::clock_samples`).
const CLOCK_SAMPLES: usize = 32;

impl Session {
    /// A session for a request this server makes of itself (a coordination step it owns).
    pub fn local() -> Session {
        Session { from_server: true, ..Session::default() }
    }
}

/// Raised once to stop the server.
#[derive(Default)]
pub struct ShutdownSignal {
    requested: Mutex<bool>,
    changed: Condvar,
}

impl ShutdownSignal {
    pub fn request(&self) {
        *self.requested.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.changed.notify_all();
    }

    pub fn is_requested(&self) -> bool {
        *self.requested.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Blocks until a shutdown is requested, or `timeout` passes; returns whether requested.
    pub fn wait(&self, timeout: std::time::Duration) -> bool {
        let requested = self.requested.lock().unwrap_or_else(|p| p.into_inner());
        let (requested, _) =
            self.changed.wait_timeout_while(requested, timeout, |requested| !*requested).unwrap_or_else(|p| p.into_inner());
        *requested
    }
}

/// Everything a server knows; shared by all connection threads.
pub struct ServerState {
    pub name: String,
    secret: Vec<u8>,
    pub store: ChunkStore,
    membership: RwLock<Membership>,
    pub peers: Peers,
    requests: AtomicU64,
    forwarded: AtomicU64,
    pub shutdown: ShutdownSignal,
    /// Wakes the gossip thread to push the member list.
    gossip: Mutex<std::sync::mpsc::Sender<()>>,
    /// Cache mode: how this server flushes, what it sees of application I/O, and the lock
    /// that lets one flush at a time run (the flusher's or a sync's).
    pub flush: FlushConfig,
    pub io_monitor: IoMonitor,
    pub flush_lock: Mutex<()>,
    /// Who has which of the files whose inodes are here open.
    pub opens: OpenRegistry,
    /// Names locked by renames and links (see `locks`).
    pub name_locks: NameLocks,
    /// Subtrees frozen by directory renames (see `locks`).
    pub gate: NamespaceGate,
    /// On the first server of the ring: the directory rename that holds the namespace lock.
    pub namespace_lock: Mutex<Option<(u64, std::time::Instant)>>,
    /// Renames that gave the namespace lock back (a late acquisition of theirs is refused).
    pub namespace_lock_ended: crate::locks::EndedTokens,
    /// Name-lock releases that failed and are tried again (see `names`).
    pub later_releases: Mutex<Vec<crate::names::LaterRelease>>,
    /// This server's part of the directory renames under way (see `directory_rename`).
    pub subtree_moves: crate::directory_rename::SubtreeMoves,
    /// Touches of directories whose entries changed here (see `dir_times`).
    pub dir_times: crate::dir_times::DirTimes,
    /// Advisory locks of the files whose inodes are here.
    pub file_locks: crate::file_locks::LockTable,
    /// Global memory: the blocks homed here, and the collective steps of the jobs this
    /// server coordinates.
    pub gmem: crate::gmem::Gmem,
    /// Modes and owners of directories, for permission checks (see `permissions`).
    pub dir_attrs: crate::permissions::DirAttrCache,
}

/// Copies a write's bytes straight out of a client process on this host.
struct RemoteSource {
    memory: ProcessMemory,
    address: u64,
    remaining: usize,
}

impl ByteSource for RemoteSource {
    fn len(&self) -> usize {
        self.remaining
    }

    fn read_into(&mut self, destination: &mut [MaybeUninit<u8>]) -> Result<(), Errno> {
        if destination.len() > self.remaining {
            return Err(Errno::EINVAL);
        }
        self.memory.read(self.address, destination).map_err(|_| Errno::EFAULT)?;
        self.address += destination.len() as u64;
        self.remaining -= destination.len();
        Ok(())
    }
}

/// Refused handshakes are logged at most once per interval: anyone who reaches the port can
/// cause them.
static REFUSED_SECRET: RateLimitedLog = RateLimitedLog::new(ringfs_rpc::REFUSAL_LOG_INTERVAL);
static REFUSED_VERSION: RateLimitedLog = RateLimitedLog::new(ringfs_rpc::REFUSAL_LOG_INTERVAL);

/// Compares secrets in time independent of where they differ.
fn secrets_match(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len() && given.iter().zip(expected).fold(0u8, |difference, (a, b)| difference | (a ^ b)) == 0
}

pub fn store_errno(error: StoreError) -> Errno {
    if let StoreError::Directory(io) = &error {
        log::error!("store failure: {io}");
    }
    error.errno()
}

impl ServerState {
    // (Each part of a server's state is made by `Server::start` and given here once.)
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: String,
        secret: Vec<u8>,
        store: ChunkStore,
        membership: Membership,
        peers: Peers,
        gossip: std::sync::mpsc::Sender<()>,
        flush: FlushConfig,
        gmem: crate::gmem::Gmem,
    ) -> ServerState {
        ServerState {
            name,
            secret,
            store,
            membership: RwLock::new(membership),
            peers,
            requests: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            shutdown: ShutdownSignal::default(),
            gossip: Mutex::new(gossip),
            flush,
            io_monitor: IoMonitor::default(),
            flush_lock: Mutex::new(()),
            opens: OpenRegistry::default(),
            name_locks: NameLocks::default(),
            gate: NamespaceGate::default(),
            namespace_lock: Mutex::new(None),
            namespace_lock_ended: Default::default(),
            subtree_moves: Default::default(),
            dir_times: Default::default(),
            file_locks: Default::default(),
            gmem,
            dir_attrs: Default::default(),
            later_releases: Mutex::new(Vec::new()),
        }
    }

    pub fn membership(&self) -> RwLockReadGuard<'_, Membership> {
        self.membership.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn membership_mut(&self) -> RwLockWriteGuard<'_, Membership> {
        self.membership.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks the gossip thread to push our member list to everyone.
    pub fn spread_members(&self) {
        let _ = self.gossip.lock().unwrap_or_else(|p| p.into_inner()).send(());
    }

    /// The owner of the entry of `path`, by our member list.
    pub fn owner_of_path(&self, path: &str) -> Member {
        self.membership().owner_of_path(path).clone()
    }

    /// The owner of a chunk of a file, by our member list.
    pub fn owner_of_chunk(&self, key: ChunkKey) -> Member {
        self.membership().owner(key.file.anchor, key.index).clone()
    }

    /// The anchor of a file created at `path`.
    pub fn anchor_of(&self, path: &str) -> u32 {
        self.membership().anchor_of(path)
    }

    /// Whether `member` is this server.
    pub fn is_self(&self, member: &Member) -> bool {
        member.name == self.name
    }

    /// Sends a request to another member and returns its response (errors become errnos).
    pub fn call_member(&self, member: &Member, request: &Request, data: &[u8]) -> Result<ringfs_rpc::Reply, Errno> {
        self.call_member_logged(member, request, data, log::Level::Warn)
    }

    /// [`ServerState::call_member`], logging a transport failure at `level`.
    pub fn call_member_logged(
        &self,
        member: &Member,
        request: &Request,
        data: &[u8],
        level: log::Level,
    ) -> Result<ringfs_rpc::Reply, Errno> {
        if !member.alive {
            return Err(Errno::EIO);
        }
        let connection = self.peers.connection(member).map_err(|error| {
            log::log!(level, "cannot reach server {}: {error}", member.name);
            error.errno()
        })?;
        let reply = connection.call(request, data).map_err(|error| {
            log::log!(level, "request to server {} failed: {error}", member.name);
            error.errno()
        })?;
        match reply.response {
            Response::Error(errno) => Err(errno),
            _ => Ok(reply),
        }
    }

    /// Runs `request` at `member`: here if it is this server, otherwise by a request to it.
    pub fn ask(&self, member: &Member, request: Request) -> Result<Response, Errno> {
        if self.is_self(member) {
            self.execute(&mut Session::local(), request, &[], &mut Vec::new())
        } else {
            self.call_member(member, &request, &[]).map(|reply| reply.response)
        }
    }

    fn forward(
        &self,
        owner: &Member,
        session: &Session,
        caller: Option<&Credentials>,
        request: Request,
        data: &[u8],
        reply_data: &mut Vec<u8>,
    ) -> Result<Response, Errno> {
        self.forwarded.fetch_add(1, Ordering::Relaxed);
        // The owner cannot reach the client's memory: pull write bytes here, and ask for
        // read bytes inline.
        let (request, pulled) = match request {
            Request::Write(write @ Write { source: WriteSource::Remote(remote), .. }) => {
                let memory = session.client_memory.ok_or(Errno::EINVAL)?;
                if remote.len > MAX_CHUNK_SIZE as u64 {
                    return Err(Errno::EINVAL);
                }
                let mut bytes = vec![MaybeUninit::<u8>::uninit(); remote.len as usize];
                memory.read(remote.address, &mut bytes).map_err(|_| Errno::EFAULT)?;
                // SAFETY: read() filled every byte.
                let bytes: Vec<u8> = bytes.into_iter().map(|byte| unsafe { byte.assume_init() }).collect();
                (Request::Write(Write { source: WriteSource::Inline, ..write }), Some(bytes))
            }
            Request::Read(read) => (Request::Read(Read { lease: false, release: Vec::new(), ..read }), None),
            other => (other, None),
        };
        // The owner checks the request for the same user.
        let request = match caller {
            Some(caller) => Request::AsUser(ringfs_proto::AsUser::new(caller.clone(), &request)),
            None => request,
        };
        let reply = self.call_member(owner, &request, pulled.as_deref().unwrap_or(data))?;
        reply_data.extend_from_slice(&reply.data);
        Ok(reply.response)
    }

    /// Executes a request here (after routing).
    pub fn execute(&self, session: &mut Session, request: Request, data: &[u8], reply_data: &mut Vec<u8>) -> Result<Response, Errno> {
        validate_paths(&request)?;
        self.execute_valid(session, request, data, reply_data)
    }

    /// [`ServerState::execute`] of a request whose paths are valid.
    fn execute_valid(&self, session: &mut Session, request: Request, data: &[u8], reply_data: &mut Vec<u8>) -> Result<Response, Errno> {
        match request {
            Request::Hello(_) => Err(Errno::EPROTO),
            Request::Ping => Ok(Response::Done),
            Request::GetMembers => Ok(Response::Members(self.membership().list().clone())),
            Request::Join(member) => {
                log::info!("server {} joins ({})", member.name, member.tcp_address);
                if self.membership_mut().admit(member) {
                    self.spread_members();
                }
                Ok(Response::Members(self.membership().list().clone()))
            }
            Request::PushMembers(list) => {
                if self.membership_mut().merge(&list, &self.name) {
                    self.spread_members();
                }
                Ok(Response::Done)
            }
            Request::Stats => Ok(Response::Stats(self.stats())),
            Request::Shutdown => {
                log::info!("shutdown requested by a client");
                self.shutdown.request();
                Ok(Response::Done)
            }
            // Names.
            Request::Create(create) => self.create(create),
            Request::Lookup(lookup) => self.lookup(&lookup.path, lookup.open_for),
            Request::Unlink(unlink) => self.unlink(&unlink.path, unlink.time_ns),
            Request::Rmdir(rmdir) => self.rmdir(&rmdir.path, rmdir.time_ns),
            Request::Rename(rename) => self.rename(rename),
            Request::Link(link) => self.link(&link.from, &link.to, link.time_ns),
            Request::LinkFile(link) => self.link_file(link.file, &link.to, link.time_ns),
            Request::ReadDir(read) => {
                let _pass = self.gate.pass(&[&read.path], 0)?;
                Ok(Response::DirPage(self.store.read_dir(&read.path, read.after.as_deref(), read.limit.clamp(1, 10_000) as usize)))
            }
            Request::Find(find) => Ok(Response::Found(self.store.find(&find.root, &find.filter))),
            Request::LookupDir(lookup) => {
                let _pass = self.gate.pass(&[&lookup.path], 0)?;
                let entry = self.store.lookup_dir(&lookup.path, self.anchor_of(&lookup.path)).map_err(store_errno)?;
                Ok(Response::Replaced(Some(entry)))
            }
            Request::PrepareRmdir(request) => {
                self.dir_attrs.forget_under(&request.path);
                self.dir_times.forget_under(&request.path);
                let (any, removed) = self.store.prepare_rmdir(&request.path);
                Ok(Response::HasEntries(ringfs_proto::HasEntries { any, removed }))
            }
            Request::InstallEntry(install) => self.install_entry(install),
            Request::RemoveEntry(remove) => {
                let _entered = self.enter_name(&remove.path, remove.token)?;
                let removed = self.store.remove_entry(&remove.path, remove.expect).map_err(store_errno)?;
                Ok(Response::Count(removed as u64))
            }
            Request::NameLock(request) => self.name_lock(&request.path, request.token, request.acquire),
            Request::NamespaceLock(request) => self.namespace_lock_step(request.token, request.acquire),
            Request::Freeze(subtree) => {
                if self.subtree_moves.has_ended(subtree.token) {
                    // A late copy of a freeze whose rename ended here: it would hold the
                    // subtrees for a lease with nobody to thaw them.
                    return Err(Errno::ESTALE);
                }
                self.gate.freeze(subtree.token, &subtree.from, &subtree.to);
                if let Some(held) = self.name_locks.renamed_inside([&subtree.from, &subtree.to], subtree.token) {
                    log::debug!("freeze of {} and {} waits for {held}", subtree.from, subtree.to);
                    // A rename of a name inside is under way: the coordinator thaws and
                    // tries again once it is done.
                    return Err(Errno::EBUSY);
                }
                if self.in_cached_tree(&subtree.from) || self.in_cached_tree(&subtree.to) {
                    // The rename moves the tree in the backend too, or (from outside the
                    // cached tree) makes it there anew: no flush may change either path
                    // meanwhile (the one under way ends first), and removals recorded below
                    // them are applied first (a new name there must not be removed later).
                    self.store.hold_backend(subtree.token, &[&subtree.from, &subtree.to], crate::locks::LEASE).map_err(store_errno)?;
                    self.wait_for_flush_step();
                }
                self.subtree_moves.begin(subtree.token);
                self.store.forget_dirs_under(&subtree.from);
                self.store.forget_dirs_under(&subtree.to);
                self.dir_attrs.forget_under(&subtree.from);
                self.dir_attrs.forget_under(&subtree.to);
                self.dir_times.forget_under(&subtree.from);
                self.dir_times.forget_under(&subtree.to);
                Ok(Response::Done)
            }
            Request::MoveSubtree(subtree) => self.move_subtree(&subtree),
            Request::PutEntries(put) => self.put_moved_entries(put),
            Request::Thaw(subtree) => {
                self.end_subtree_move(subtree.token);
                self.store.release_backend(subtree.token);
                self.gate.thaw(subtree.token);
                Ok(Response::Done)
            }
            // Files.
            Request::Stat(request) => Ok(Response::Attr(self.store.stat(request.file).map_err(store_errno)?)),
            Request::Open(open) => {
                let attr = self.store.open_file(open.file).map_err(store_errno)?;
                self.opens.opened(open.client, open.file);
                Ok(Response::Attr(attr))
            }
            Request::Close(close) => {
                for file in close.files {
                    if self.opens.closed(close.client, file) {
                        self.close_registered(file);
                    }
                }
                Ok(Response::Done)
            }
            Request::SetAttr(set) => {
                let attr = self.store.set_attr(&set).map_err(store_errno)?;
                if attr.is_dir() && (set.mode.is_some() || set.uid.is_some() || set.gid.is_some()) {
                    self.spread_dir_attr_change(set.file);
                }
                if set.mtime_ns.is_some() && attr.is_regular() && attr.is_extended() {
                    self.clamp_chunk_times(set.file, attr.mtime_ns)?;
                }
                Ok(Response::Attr(attr))
            }
            Request::ClampChunkTimes(clamp) => {
                self.store.clamp_tail_mtimes(clamp.file, clamp.time_ns).map_err(store_errno)?;
                Ok(Response::Done)
            }
            Request::ForgetDirAttrs(forget) => {
                self.dir_attrs.forget_file(forget.file);
                Ok(Response::Done)
            }
            Request::AsUser(_) => Err(Errno::EPROTO),
            // A write or truncation its client stopped waiting for is not begun: the client's
            // next requests (a truncation, another write) may already have been answered, and
            // landing after them would mix versions of the file.
            Request::Write(_) | Request::Truncate(_) if crate::locks::past_request_deadline() => Err(Errno::ETIMEDOUT),
            Request::Truncate(truncate) => self.across_backend_moves(|_| self.truncate(truncate.file, truncate.size, truncate.time_ns)),
            Request::MarkExtended(request) => {
                self.store.mark_extended(request.file).map_err(store_errno)?;
                Ok(Response::Done)
            }
            Request::AddLink(count) => {
                let (attr, rewrite) = self.store.add_link_named(count.file, count.time_ns, count.name.as_deref()).map_err(store_errno)?;
                if rewrite {
                    self.redirty_everywhere(count.file)?;
                }
                Ok(Response::Attr(attr))
            }
            Request::DropLink(count) => {
                self.drop_link_here(count.file, count.time_ns, count.name.as_deref())?;
                Ok(Response::Done)
            }
            Request::Fsync(request) => {
                self.store.fsync_file(request.file).map_err(store_errno)?;
                Ok(Response::Done)
            }
            Request::LastChunk(request) => Ok(Response::Tail(self.store.tail_summary(request.file))),
            Request::MissingFiles(list) => Ok(Response::Files(ringfs_proto::FileList { files: self.store.missing_inodes(&list.files) })),
            Request::TouchDir(touch) => self.touch_dir(touch),
            Request::CollectTouches(collect) => Ok(Response::TouchTime(self.dir_times.hand_over(collect.file))),
            Request::SetLock(lock) => {
                if lock.kind != ringfs_proto::LockKind::Unlock {
                    self.opens.took_lock(lock.client);
                }
                self.file_locks.set(&lock)?;
                Ok(Response::Done)
            }
            Request::TestLock(lock) => Ok(Response::LockHolder(self.file_locks.test(&lock)?)),
            Request::Reserve(reservation) => self.reserve(reservation),
            Request::GmemAlloc(alloc) => self.gmem_alloc(alloc, crate::locks::request_deadline_or(std::time::Duration::from_secs(1))),
            Request::GmemDefine(layout) => self.gmem_define(layout),
            Request::GmemDrop(array) => self.gmem_drop(array),
            Request::GmemFree(free) => self.gmem_free(free),
            Request::GmemBarrier(barrier) => {
                self.gmem_barrier(barrier, crate::locks::request_deadline_or(std::time::Duration::from_secs(1)))
            }
            Request::GmemRead(range) => self.gmem_read(range, reply_data),
            Request::GmemLease(range) => self.gmem_lease(session, range, reply_data),
            Request::CoGet(get) => self.co_get(get, reply_data),
            Request::CoPut(put) => self.co_put(put, data),
            // Requests a rank's cache answers, not a server.
            Request::CoForward(_) | Request::CoInvalidate(_) | Request::CoFill(_) => Err(Errno::EPROTO),
            Request::GmemWrite(range) => self.gmem_write(range, data),
            Request::GmemAtomic(atomic) => self.gmem_atomic(atomic),
            // Extended attributes, at the inode's server.
            Request::GetXattr(get) => {
                Ok(Response::Value(ringfs_proto::wire::Bytes(self.store.get_xattr(get.file, &get.name).map_err(store_errno)?)))
            }
            Request::SetXattr(set) => {
                Ok(Response::Attr(self.store.set_xattr(set.file, &set.name, &set.value.0, set.flags, set.time_ns).map_err(store_errno)?))
            }
            Request::ListXattrs(list) => Ok(Response::Names(self.store.list_xattrs(list.file).map_err(store_errno)?)),
            Request::RemoveXattr(remove) => {
                Ok(Response::Attr(self.store.remove_xattr(remove.file, &remove.name, remove.time_ns).map_err(store_errno)?))
            }
            Request::RemoveChunks(remove) => Ok(Response::Count(self.store.remove_chunks(remove.file, remove.from_index))),
            Request::Write(write) => self.across_backend_moves(|_| self.write(session, &write, data)),
            Request::Read(read) => {
                for lease in &read.release {
                    session.leases.remove(lease);
                }
                let kept = reply_data.len();
                self.across_backend_moves(|_| {
                    reply_data.truncate(kept);
                    self.read(session, &read, reply_data)
                })
            }
            Request::SetChunkLen(set) => self.across_backend_moves(|attempt| {
                check_template(&set.template)?;
                if set.len > MAX_CHUNK_SIZE as u64 {
                    return Err(Errno::EINVAL);
                }
                let backend = match &set.backend {
                    Some(sent) if session.from_server && attempt == 0 => Some(BackendFile { path: sent.path.clone(), len: sent.len }),
                    _ => self.backend_for(set.chunk, set.template.backend_len)?,
                };
                let attr = self.store.set_chunk_len(set.chunk, set.len, set.template, 0, backend.as_ref()).map_err(store_errno)?;
                Ok(Response::Attr(attr))
            }),
            Request::Release(release) => {
                for lease in release.leases {
                    session.leases.remove(&lease);
                }
                Ok(Response::Done)
            }
            // Cache mode.
            Request::Sync(sync) => self.sync(sync.ticket),
            Request::FlushPrepare(request) => Ok(Response::BackendTarget(self.store.prepare(request.file).map_err(store_errno)?)),
            Request::ReadBackendDir(read) => {
                let anchor_of = |path: &str| self.anchor_of(path);
                let page = self
                    .store
                    .backend_page(&read.path, read.after.as_deref(), read.limit.clamp(1, 10_000) as usize, &anchor_of)
                    .map_err(store_errno)?;
                Ok(Response::DirPage(page))
            }
            Request::LoadChunk(load) => self.across_backend_moves(|attempt| {
                let backend = match &load.backend {
                    Some(sent) if session.from_server && attempt == 0 => Some(BackendFile { path: sent.path.clone(), len: sent.len }),
                    _ => self.backend_for(load.chunk, load.backend_len)?,
                };
                Ok(Response::Count(self.store.load_chunk(load.chunk, backend.as_ref()).map_err(store_errno)?))
            }),
            Request::BackendOf(request) => {
                let backend = self.store.backend_file(request.file).map_err(store_errno)?;
                Ok(Response::BackendFile(backend.map(|backend| BackendFileReply { path: backend.path, len: backend.len })))
            }
            Request::Rebind(rebind) => {
                self.rebind_here(rebind.file, rebind.path.as_deref(), rebind.from.as_deref())?;
                Ok(Response::Done)
            }
            Request::YieldBackendName(name) => {
                let (yielded, rewrite) = self.store.yield_backend_name(name.file, &name.name).map_err(store_errno)?;
                if rewrite {
                    self.redirty_everywhere(name.file)?;
                }
                Ok(Response::Count(u64::from(yielded)))
            }
            Request::Redirty(request) => {
                let backed = self.store.backend_file(request.file).map(|backend| backend.is_some()).unwrap_or(true);
                self.store.redirty(request.file, backed);
                Ok(Response::Done)
            }
        }
    }

    /// An explicit mtime was set on an extended file: its chunks everywhere keep no later
    /// time (EIO if a server holding chunks could not be told; the inode has the time).
    fn clamp_chunk_times(&self, file: FileId, mtime_ns: i64) -> Result<(), Errno> {
        self.store.clamp_tail_mtimes(file, mtime_ns).map_err(store_errno)?;
        let request = Request::ClampChunkTimes(ringfs_proto::LinkCount { file, time_ns: mtime_ns });
        self.broadcast(&request).into_iter().find_map(Result::err).map_or(Ok(()), Err)
    }

    /// Cache mode: where the bytes of the file of `chunk` are in the backend, when the chunk
    /// needs it (it holds backend data or may); asked of the file's inode server. `None`
    /// otherwise.
    pub fn backend_for(&self, chunk: ChunkKey, backend_len_hint: u64) -> Result<Option<BackendFile>, Errno> {
        if !self.store.needs_backend(chunk, backend_len_hint) {
            return Ok(None);
        }
        let home = self.owner_of_chunk(ChunkKey::inode(chunk.file));
        if self.is_self(&home) {
            return self.store.backend_file(chunk.file).map_err(store_errno);
        }
        match self.call_member(&home, &Request::BackendOf(ringfs_proto::FileOnly { file: chunk.file }), &[])?.response {
            Response::BackendFile(reply) => Ok(reply.map(|reply| BackendFile { path: reply.path, len: reply.len })),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Runs a data operation that may read or write the backend (`op` gets the attempt
    /// number). A directory rename in the cached tree moves backend files under running
    /// operations: one that found its backend file missing (ENOENT) or held (EBUSY) while a
    /// rename held backend paths here, or took or released them since it began, is tried
    /// again once no hold is left, asking the file's backend path anew. Bounded by the
    /// holds' lease.
    fn across_backend_moves<T>(&self, mut op: impl FnMut(u32) -> Result<T, Errno>) -> Result<T, Errno> {
        // (Nothing but one atomic load on the way of a request that succeeds.)
        let mut deadline = None;
        let mut attempt = 0;
        loop {
            let seen = self.store.backend_moves();
            match op(attempt) {
                Err(errno @ (Errno::ENOENT | Errno::EBUSY)) => {
                    let deadline = *deadline.get_or_insert_with(|| std::time::Instant::now() + crate::locks::LEASE);
                    let moved = self.store.backend_held() || self.store.backend_moves() != seen;
                    if !moved || std::time::Instant::now() >= deadline {
                        return Err(errno);
                    }
                    while self.store.backend_held() && std::time::Instant::now() < deadline {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn write(&self, session: &Session, write: &Write, data: &[u8]) -> Result<Response, Errno> {
        check_template(&write.template)?;
        let backend = self.backend_for(write.chunk, write.template.backend_len)?;
        let source = |write: &Write| -> Result<Box<dyn ByteSource + '_>, Errno> {
            match write.source {
                WriteSource::Inline => Ok(Box::new(data)),
                WriteSource::Remote(remote) => {
                    let memory = session.client_memory.ok_or(Errno::EINVAL)?;
                    if remote.len > MAX_CHUNK_SIZE as u64 {
                        return Err(Errno::EINVAL);
                    }
                    Ok(Box::new(RemoteSource { memory, address: remote.address, remaining: remote.len as usize }))
                }
            }
        };
        let written = self.store.write(write.chunk, write.offset, &mut *source(write)?, write.template, write.time_ns, backend.as_ref());
        let chunk_len = match written {
            Err(StoreError::Fs(Errno::ENOSPC)) if self.store.backend().is_some() => {
                // Cache mode, and the store is full of dirty data: write to the backend.
                let prepare = |file: FileId| self.prepare_at_home(file);
                self.store.write_through(
                    write.chunk,
                    write.offset,
                    &mut *source(write)?,
                    write.template,
                    write.time_ns,
                    backend.as_ref(),
                    &prepare,
                )
            }
            other => other,
        }
        .map_err(store_errno)?;
        Ok(Response::Written(chunk_len))
    }

    fn read(&self, session: &mut Session, read: &Read, reply_data: &mut Vec<u8>) -> Result<Response, Errno> {
        let len = read.len.min(MAX_CHUNK_SIZE as u64);
        let backend = self.backend_for(read.chunk, read.backend_len)?;
        if read.lease && session.client_memory.is_some() {
            let shared = self.store.read_shared(read.chunk, read.offset, len, backend.as_ref()).map_err(store_errno)?;
            if let Some((buffer, range)) = shared.bytes {
                let lease_id = session.next_lease_id;
                session.next_lease_id += 1;
                let lease = Lease { id: lease_id, address: buffer.as_ptr() as u64 + range.start as u64, stored: range.len() as u64 };
                session.leases.insert(lease_id, buffer);
                return Ok(Response::Read(ReadReply { attr: shared.attr, len: shared.len, lease: Some(lease) }));
            }
            if shared.attr.is_none() {
                return Ok(Response::Read(ReadReply { attr: None, len: 0, lease: None }));
            }
        }
        let (attr, len) = self.store.read(read.chunk, read.offset, len, reply_data, backend.as_ref()).map_err(store_errno)?;
        Ok(Response::Read(ReadReply { attr, len, lease: None }))
    }

    pub fn stats(&self) -> ServerStats {
        let store = self.store.stats();
        ServerStats {
            name: self.name.clone(),
            entries: store.entries,
            chunks: store.chunks,
            bytes: store.used_bytes,
            capacity_bytes: store.capacity_bytes,
            requests: self.requests.load(Ordering::Relaxed),
            forwarded: self.forwarded.load(Ordering::Relaxed),
            open_unlinked: store.open_unlinked,
            cache: self.store.cache_stats().map(|mut cache| {
                cache.policy = self.flush.policy.to_string();
                cache.flushing = self.io_monitor.is_flushing();
                cache.longest_stop_us = self.io_monitor.longest_stop_us();
                Box::new(cache)
            }),
            gmem: {
                let memory = self.gmem.memory.stats();
                (memory != crate::gmem::MemoryStats::default()).then_some(ringfs_proto::GmemStats {
                    dram_bytes: memory.dram_bytes,
                    spilled_bytes: memory.spilled_bytes,
                    ssd_read_bytes: memory.ssd_read_bytes,
                    ssd_write_bytes: memory.ssd_write_bytes,
                })
            },
        }
    }

    /// Ends an open registered here; the file goes if that was its last reference.
    pub fn close_registered(&self, file: FileId) {
        if let Some(deleted) = self.store.close_file(file)
            && deleted.extended
        {
            self.remove_chunks_everywhere(file, 1);
        }
    }

    /// Ends the opens of clients gone for longer than the grace period.
    pub fn expire_opens(&self, grace: std::time::Duration) {
        let expired = self.opens.expire(grace);
        for (file, count) in expired.files {
            for _ in 0..count {
                self.close_registered(file);
            }
        }
        for client in expired.locking_clients {
            let released = self.file_locks.release_client(client);
            if released > 0 {
                log::info!("client {client:016x} is gone; its {released} advisory locks end");
            }
        }
    }
}

/// When the client of `session` stops waiting for `request`: `patience` after it sent it,
/// or after it arrived when the request carries no time stamp or the client's clock is not
/// known. How long ago it was sent is its clock sample less the smallest recent one (see
/// `Session::clock_samples`): the delay a request spent in the network or in a socket — a
/// link down, TCP retransmitting, this server paused — counts, and a `Hello` that was itself
/// delayed makes no request look late.
fn request_deadline(session: &mut Session, request: &Request, patience: std::time::Duration) -> std::time::Instant {
    const BEYOND_REASON_NS: i64 = 60_000_000_000;
    let now = std::time::Instant::now();
    let (Some(sent), false) = (request.client_time_ns(), session.clock_samples.is_empty()) else { return now + patience };
    let sample = ringfs_rpc::wall_clock_ns().saturating_sub(sent);
    if session.clock_samples.len() == CLOCK_SAMPLES {
        session.clock_samples.pop_front();
    }
    session.clock_samples.push_back(sample);
    let offset = session.clock_samples.iter().copied().min().unwrap_or(sample);
    let delay_ns = sample.saturating_sub(offset);
    if !(0..BEYOND_REASON_NS).contains(&delay_ns) {
        return now + patience;
    }
    now + patience.saturating_sub(std::time::Duration::from_nanos(delay_ns as u64))
}

/// EINVAL unless every path of `request` is canonical, and every size and offset in range
/// (checked once, before anything uses them; see `ringfs_proto::limits`).
fn validate_paths(request: &Request) -> Result<(), Errno> {
    request.validate()
}

/// A chunk template from a request: a chunk made from it is at most [`MAX_CHUNK_SIZE`] long
/// (a forged size would let one write fill gigabytes with zeros).
fn check_template(template: &ringfs_proto::ChunkTemplate) -> Result<(), Errno> {
    if template.chunk_size == 0 || template.chunk_size > MAX_CHUNK_SIZE { Err(Errno::EINVAL) } else { Ok(()) }
}

impl Service for ServerState {
    type Session = Session;

    fn hello(&self, hello: &Hello, peer: &PeerIdentity, session: &mut Session) -> Result<HelloReply, Errno> {
        if hello.version != PROTOCOL_VERSION {
            REFUSED_VERSION.log(log::Level::Warn, format_args!("refusing a client speaking protocol version {}", hello.version));
            return Err(Errno::EPROTO);
        }
        if !secrets_match(&hello.secret, &self.secret) {
            REFUSED_SECRET.log(log::Level::Warn, format_args!("refusing a connection with a wrong secret"));
            return Err(Errno::EACCES);
        }
        session.from_server = hello.from_server;
        session.credentials = (!hello.from_server).then(|| Arc::new(hello.credentials.clone()));
        // Three quarters of the client's timeout: what is left covers the answer's way back.
        session.patience =
            (!hello.from_server && hello.timeout_ms > 0).then(|| std::time::Duration::from_millis(u64::from(hello.timeout_ms)) * 3 / 4);
        if hello.clock_ns != 0 {
            session.clock_samples.push_back(ringfs_rpc::wall_clock_ns().saturating_sub(hello.clock_ns));
        }
        if !hello.from_server && hello.client_id != 0 {
            session.client_id = Some(hello.client_id);
            self.opens.connected(hello.client_id);
        }
        if let (Some(pid), Some(probe)) = (peer.pid, hello.memory_probe) {
            let memory = ProcessMemory::new(pid);
            session.client_memory = memory.verify_probe(probe).then_some(memory);
        }
        Ok(HelloReply {
            version: PROTOCOL_VERSION,
            server_name: self.name.clone(),
            memory_access: session.client_memory.is_some(),
            memory_probe: peer.pid.is_some().then(memory_probe),
        })
    }

    fn handle(&self, session: &mut Session, request: Request, data: &[u8], reply_data: &mut Vec<u8>) -> Response {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let (caller, request) = match request {
            Request::AsUser(as_user) => match as_user.request() {
                Ok(inner) => (Some(Arc::new(as_user.credentials)), inner),
                Err(_) => return Response::Error(Errno::EPROTO),
            },
            request => (session.credentials.clone(), request),
        };
        let io = counts_as_io(&request);
        if io {
            self.io_monitor.begin();
        }
        let deadline = session.patience.map(|patience| request_deadline(session, &request, patience));

        let response = crate::locks::with_request_deadline(deadline, || self.route(session, caller.as_deref(), request, data, reply_data));
        let mut response = response;
        // Directories' times: what the response shows includes every change of names before
        // it, and a change of names answers once its directories' times have moved.
        self.settle_dir_times(&mut response, deadline);
        self.await_touches(deadline);
        if io {
            self.io_monitor.end();
        }
        response
    }

    fn epoch(&self) -> u64 {
        self.membership().epoch()
    }

    fn closed(&self, session: &mut Session) {
        session.leases.clear();
        if let Some(client) = session.client_id.take() {
            self.opens.disconnected(client);
        }
    }
}

impl ServerState {
    /// Executes a client's request here, acting for `caller`.
    fn execute_for(
        &self,
        caller: &Credentials,
        session: &mut Session,
        request: Request,
        data: &[u8],
        reply_data: &mut Vec<u8>,
    ) -> Result<Response, Errno> {
        validate_paths(&request)?;
        let request = self.authorize(caller, request)?;
        match self.execute_valid(session, request, data, reply_data)? {
            Response::Names(names) => Ok(Response::Names(names.into_iter().filter(|name| caller.lists_xattr(name)).collect())),
            response => Ok(response),
        }
    }

    /// The server that must execute `request`, if not this one.
    fn route_target(&self, request: &Request) -> Option<Member> {
        let owner = match request.route() {
            Route::Here => return None,
            // Every server holds the root directory and answers for it itself.
            Route::Path("/") => return None,
            Route::Chunk(key) if key.file.is_root() => return None,
            Route::Path(path) => self.owner_of_path(path),
            Route::Chunk(key) => self.owner_of_chunk(key),
        };
        (!self.is_self(&owner)).then_some(owner)
    }

    /// Executes a request here, or forwards it to the owner of its key. A client's request
    /// (`caller` is whom it acts for) is checked where it is executed (see `permissions`).
    fn route(
        &self,
        session: &mut Session,
        caller: Option<&Credentials>,
        request: Request,
        data: &[u8],
        reply_data: &mut Vec<u8>,
    ) -> Response {
        if request.only_from_servers() && !session.from_server {
            return Response::Error(Errno::EPERM);
        }
        let outcome = match self.route_target(&request) {
            Some(_) if session.from_server => {
                // Another server routed this here, but our list says otherwise: the lists
                // disagree (a membership change is spreading). Refuse rather than misplace.
                log::warn!("request routed here by a peer with a different member list");
                Err(Errno::EIO)
            }
            Some(owner) => self.forward(&owner, session, caller, request, data, reply_data),
            None => match caller {
                Some(caller) => self.execute_for(caller, session, request, data, reply_data),
                None => self.execute(session, request, data, reply_data),
            },
        };
        outcome.unwrap_or_else(|errno| {
            reply_data.clear();
            Response::Error(errno)
        })
    }
}
