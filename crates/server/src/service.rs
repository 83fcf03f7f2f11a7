//! Answering requests: authentication, routing, forwarding, and the single-server operations.
//!
//! [`ServerState`] is the [`Service`] the RPC layer calls for every request. A request about
//! a key this server does not own (by its own member list) is forwarded to the owner and the
//! answer relayed, so clients with a stale list still work. Operations that involve several
//! servers live in [`crate::coordination`].

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ringfs_proto::path;
use ringfs_proto::{
    ChunkRef, Errno, Hello, HelloReply, Lease, Member, PROTOCOL_VERSION, Read, Request, Response, ServerStats, Write, WriteSource,
};
use ringfs_rpc::log_limit::RateLimitedLog;
use ringfs_rpc::memory::{ProcessMemory, memory_probe};
use ringfs_rpc::{PeerIdentity, Service};
use ringfs_store::{ByteSource, ChunkStore, StoreError};

use crate::flusher::{FlushConfig, IoMonitor, counts_as_io};
use crate::membership::Membership;
use crate::peers::Peers;

/// Largest chunk size a file may be created with (one chunk must fit in a frame).
pub const MAX_CHUNK_SIZE: u32 = ringfs_proto::MAX_DATA_LEN;

/// Per-connection state.
#[derive(Default)]
pub struct Session {
    /// Memory of a client on this host that proved we can read it.
    client_memory: Option<ProcessMemory>,
    /// The peer is another server: its requests are never forwarded again.
    from_server: bool,
    /// Buffers lent to the client by leased reads, until it releases them.
    leases: HashMap<u64, Arc<Vec<u8>>>,
    next_lease_id: u64,
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
    pub fn new(
        name: String,
        secret: Vec<u8>,
        store: ChunkStore,
        membership: Membership,
        peers: Peers,
        gossip: std::sync::mpsc::Sender<()>,
        flush: FlushConfig,
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

    /// The owner of a key, by our member list.
    pub fn owner_of(&self, path: &str, index: u64) -> Member {
        self.membership().owner(path, index).clone()
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

    fn forward(
        &self,
        owner: &Member,
        session: &Session,
        request: Request,
        data: &[u8],
        reply_data: &mut Vec<u8>,
    ) -> Result<Response, Errno> {
        self.forwarded.fetch_add(1, Ordering::Relaxed);
        // The owner cannot reach the client's memory: pull write bytes here, and ask for
        // read bytes inline.
        let (request, pulled) = match request {
            Request::Write(write @ Write { source: WriteSource::Remote { address, len }, .. }) => {
                let memory = session.client_memory.ok_or(Errno::EINVAL)?;
                let mut bytes = vec![MaybeUninit::<u8>::uninit(); len as usize];
                memory.read(address, &mut bytes).map_err(|_| Errno::EFAULT)?;
                // SAFETY: read() filled every byte.
                let bytes: Vec<u8> = bytes.into_iter().map(|byte| unsafe { byte.assume_init() }).collect();
                (Request::Write(Write { source: WriteSource::Inline, ..write }), Some(bytes))
            }
            Request::Read(read) => (Request::Read(Read { lease: false, release: Vec::new(), ..read }), None),
            other => (other, None),
        };
        let reply = self.call_member(owner, &request, pulled.as_deref().unwrap_or(data))?;
        reply_data.extend_from_slice(&reply.data);
        Ok(reply.response)
    }

    /// Executes a request here (after routing).
    pub fn execute(&self, session: &mut Session, request: Request, data: &[u8], reply_data: &mut Vec<u8>) -> Result<Response, Errno> {
        if let Some((path, _)) = request.routing_key() {
            path::validate(path)?;
        }
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
            Request::Sync { ticket } => self.sync(ticket),
            Request::FlushPrepare { path, file_id } => {
                self.store.prepare_entry(&path, file_id).map_err(store_errno)?;
                Ok(Response::Done)
            }
            Request::ReadBackendDir { path, after, limit } => Ok(Response::DirPage(
                self.store.backend_page(&path, after.as_deref(), limit.clamp(1, 10_000) as usize).map_err(store_errno)?,
            )),
            Request::LoadChunk { chunk, backend_len } => {
                let backend_len = self.coordinated_backend_len(session, &chunk, backend_len)?;
                Ok(Response::Count(self.store.load_chunk(&chunk, backend_len).map_err(store_errno)?))
            }
            Request::Shutdown => {
                log::info!("shutdown requested by a client");
                self.shutdown.request();
                Ok(Response::Done)
            }
            Request::Create(create) => self.create(create),
            Request::Stat(chunk) => Ok(Response::Attr(self.store.stat(&chunk).map_err(store_errno)?)),
            Request::Write(write) => self.write(session, write, data),
            Request::Read(read) => self.read(session, read, reply_data),
            Request::Truncate { path, file_id, size, time_ns } => self.truncate(&path, file_id, size, time_ns),
            Request::SetChunkLen { chunk, len, mut template } => {
                path::validate(&chunk.path)?;
                template.backend_len = self.coordinated_backend_len(session, &chunk, template.backend_len)?;
                Ok(Response::Attr(self.store.set_chunk_len(&chunk, len, template, 0).map_err(store_errno)?))
            }
            Request::MarkExtended { path, file_id } => {
                self.store.mark_extended(&path, file_id).map_err(store_errno)?;
                Ok(Response::Done)
            }
            Request::Unlink { path } => self.unlink(&path),
            Request::RemoveChunks { path, file_id, from_index } => {
                path::validate(&path)?;
                Ok(Response::Count(self.store.remove_chunks(&path, file_id, from_index)))
            }
            Request::LastChunk { path, file_id } => {
                path::validate(&path)?;
                Ok(Response::Tail(self.store.tail_summary(&path, file_id)))
            }
            Request::Find { root, filter } => {
                path::validate(&root)?;
                Ok(Response::Found(self.store.find(&root, &filter)))
            }
            Request::SetAttr(set) => Ok(Response::Attr(self.store.set_attr(&set).map_err(store_errno)?)),
            Request::ReadDir { path, after, limit } => {
                path::validate(&path)?;
                Ok(Response::DirPage(self.store.read_dir(&path, after.as_deref(), limit.clamp(1, 10_000) as usize)))
            }
            Request::LookupDir { path } => Ok(Response::Attr(self.store.lookup_dir(&path).map_err(store_errno)?)),
            Request::PrepareRmdir { path } => {
                path::validate(&path)?;
                let (any, removed) = self.store.prepare_rmdir(&path);
                Ok(Response::HasEntries { any, removed })
            }
            Request::Rmdir { path } => self.rmdir(&path),
            Request::Rename { from, to, time_ns } => self.rename(&from, &to, time_ns),
            Request::MoveChunks { from, to, file_id } => self.move_chunks(&from, &to, file_id),
            Request::PutChunk { chunk, attr } => {
                self.store.put_chunk(&chunk, attr, data).map_err(store_errno)?;
                Ok(Response::Done)
            }
            Request::InstallEntry { path, attr } => self.install_entry(&path, attr, data),
            Request::Release { leases } => {
                for lease in leases {
                    session.leases.remove(&lease);
                }
                Ok(Response::Done)
            }
        }
    }

    /// Cache mode: the `backend_len` of the file of a missing chunk, as the file's entry
    /// knows it, when the caller's view says the chunk may be backend data; 0 when it cannot
    /// be (no backend data, or the chunk is here already).
    pub fn checked_backend_len(&self, chunk: &ChunkRef, hint: u64) -> Result<u64, Errno> {
        let chunk_size = self.store.backend_chunk_size();
        if hint == 0 || chunk.index == 0 || chunk.index.saturating_mul(chunk_size as u64) >= hint || self.store.holds_chunk(chunk) {
            return Ok(0);
        }
        let head = ChunkRef { path: chunk.path.clone(), index: 0, file_id: chunk.file_id };
        let owner = self.owner_of(&chunk.path, 0);
        let attr = if owner.name == self.name {
            self.store.stat(&head).map_err(store_errno)?
        } else {
            match self.call_member(&owner, &Request::Stat(head), &[])?.response {
                Response::Attr(attr) => attr,
                _ => return Err(Errno::EPROTO),
            }
        };
        Ok(attr.backend_len)
    }

    /// The `backend_len` of a request that servers coordinating a rename or truncate send
    /// (`LoadChunk`, `SetChunkLen`): taken as it is from another server, which read it from
    /// the file's entry — asking the entry's server back could wait on a server that is
    /// waiting for this answer. From clients it is checked.
    fn coordinated_backend_len(&self, session: &Session, chunk: &ChunkRef, hint: u64) -> Result<u64, Errno> {
        match session.from_server {
            true => Ok(hint),
            false => self.checked_backend_len(chunk, hint),
        }
    }

    fn write(&self, session: &Session, mut write: Write, data: &[u8]) -> Result<Response, Errno> {
        write.template.backend_len = self.checked_backend_len(&write.chunk, write.template.backend_len)?;
        let source = |write: &Write| -> Result<Box<dyn ByteSource + '_>, Errno> {
            match write.source {
                WriteSource::Inline => Ok(Box::new(data)),
                WriteSource::Remote { address, len } => {
                    let memory = session.client_memory.ok_or(Errno::EINVAL)?;
                    if len > MAX_CHUNK_SIZE as u64 {
                        return Err(Errno::EINVAL);
                    }
                    Ok(Box::new(RemoteSource { memory, address, remaining: len as usize }))
                }
            }
        };
        let written = self.store.write(&write.chunk, write.offset, &mut *source(&write)?, write.template, write.time_ns);
        let chunk_len = match written {
            Err(StoreError::Fs(Errno::ENOSPC)) if self.store.backend().is_some_and(|backend| backend.covers(&write.chunk.path)) => {
                // Cache mode, and the store is full of dirty data: write to the backend.
                let prepare = |path: &str, file_id: u64| self.prepare_at_owner(path, file_id);
                self.store.write_through(&write.chunk, write.offset, &mut *source(&write)?, write.template, write.time_ns, &prepare)
            }
            other => other,
        }
        .map_err(store_errno)?;
        Ok(Response::Written { chunk_len })
    }

    fn read(&self, session: &mut Session, read: Read, reply_data: &mut Vec<u8>) -> Result<Response, Errno> {
        for lease in &read.release {
            session.leases.remove(lease);
        }
        let len = read.len.min(MAX_CHUNK_SIZE as u64);
        let backend_len = self.checked_backend_len(&read.chunk, read.backend_len)?;
        if read.lease && session.client_memory.is_some() {
            let shared = self.store.read_shared(&read.chunk, read.offset, len, backend_len).map_err(store_errno)?;
            if let Some((buffer, range)) = shared.bytes {
                let lease_id = session.next_lease_id;
                session.next_lease_id += 1;
                let lease = Lease { id: lease_id, address: buffer.as_ptr() as u64 + range.start as u64, stored: range.len() as u64 };
                session.leases.insert(lease_id, buffer);
                return Ok(Response::Read { attr: shared.attr, len: shared.len, lease: Some(lease) });
            }
            if shared.attr.is_none() {
                return Ok(Response::Read { attr: None, len: 0, lease: None });
            }
        }
        let (attr, len) = self.store.read(&read.chunk, read.offset, len, reply_data, backend_len).map_err(store_errno)?;
        Ok(Response::Read { attr, len, lease: None })
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
            cache: self.store.cache_stats().map(|mut cache| {
                cache.policy = self.flush.policy.to_string();
                cache.flushing = self.io_monitor.is_flushing();
                cache.longest_stop_us = self.io_monitor.longest_stop_us();
                Box::new(cache)
            }),
        }
    }
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
        let io = counts_as_io(&request);
        if io {
            self.io_monitor.begin();
        }
        let response = self.route(session, request, data, reply_data);
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
    }
}

impl ServerState {
    /// Executes a request here, or forwards it to the owner of its key.
    fn route(&self, session: &mut Session, request: Request, data: &[u8], reply_data: &mut Vec<u8>) -> Response {
        let routed_elsewhere = match request.routing_key() {
            // Every server holds the root directory and answers for it itself.
            Some(("/", 0)) => None,
            Some((path, index)) => {
                let owner = self.owner_of(path, index);
                (owner.name != self.name).then_some(owner)
            }
            None => None,
        };
        let outcome = match routed_elsewhere {
            Some(_) if session.from_server => {
                // Another server routed this here, but our list says otherwise: the lists
                // disagree (a membership change is spreading). Refuse rather than misplace.
                log::warn!("request routed here by a peer with a different member list");
                Err(Errno::EIO)
            }
            Some(owner) => self.forward(&owner, session, request, data, reply_data),
            None => self.execute(session, request, data, reply_data),
        };
        outcome.unwrap_or_else(|errno| {
            reply_data.clear();
            Response::Error(errno)
        })
    }
}
