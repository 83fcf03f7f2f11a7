//! The dispatcher: what the RPC layer calls for every request ([`Service`]).
//!
//! A request is authenticated with its connection's `Hello`, handled with its client's
//! deadline (`deadline`), routed (a request about a key this server does not own, by its own
//! member list, is forwarded to the owner and the answer relayed, so clients with a stale
//! list still work), checked for the user it acts for (`permissions`), and then handed to
//! the one part of the server that answers it: one line per request type in
//! [`Dispatcher::execute_valid`]. The parts themselves (names, renames, directory renames,
//! files, data, directory times, the flusher, the global memory…) never call back here: a
//! step a part asks of this very server comes back through [`LocalDispatch`].

use std::mem::MaybeUninit;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ringfs_proto::{
    Credentials, Errno, Hello, HelloReply, Member, PROTOCOL_VERSION, Read, Request, Response, Route, ServerStats, Write, WriteSource,
};
use ringfs_rpc::log_limit::RateLimitedLog;
use ringfs_rpc::memory::{ProcessMemory, memory_probe};
use ringfs_rpc::{PeerIdentity, Reply, Service};

use crate::ServerConfig;
use crate::changes::ChangeLog;
use crate::data::Data;
use crate::deadline::{client_deadline, request_deadline_or, with_request_deadline};
use crate::dir_times::DirTimes;
use crate::directory_rename::DirectoryRenames;
use crate::file_locks::LockTable;
use crate::files::Files;
use crate::flusher::{Flusher, counts_as_io};
use crate::gate::NamespaceGate;
use crate::gmem::Gmem;
use crate::names::Names;
use crate::node::{LocalDispatch, MAX_CHUNK_SIZE, Node, store_errno};
use crate::opens::OpenRegistry;
use crate::permissions::Permissions;
use crate::renames::Renames;
use crate::session::Session;

/// Refused handshakes are logged at most once per interval: anyone who reaches the port can
/// cause them.
static REFUSED_SECRET: RateLimitedLog = RateLimitedLog::new(ringfs_rpc::REFUSAL_LOG_INTERVAL);
static REFUSED_VERSION: RateLimitedLog = RateLimitedLog::new(ringfs_rpc::REFUSAL_LOG_INTERVAL);

/// The parts of a server, and the counters of what it answered.
pub struct Dispatcher {
    pub node: Arc<Node>,
    secret: Vec<u8>,
    pub names: Arc<Names>,
    pub renames: Renames,
    pub trees: Arc<DirectoryRenames>,
    pub files: Arc<Files>,
    pub data: Data,
    pub dir_times: Arc<DirTimes>,
    pub flusher: Arc<Flusher>,
    pub permissions: Arc<Permissions>,
    pub opens: Arc<OpenRegistry>,
    pub gmem: Gmem,
    /// What changed here lately, for FUSE mounts that ask (see `changes`).
    changes: ChangeLog,
    requests: AtomicU64,
    forwarded: AtomicU64,
}

/// Compares secrets in time independent of where they differ.
fn secrets_match(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len() && given.iter().zip(expected).fold(0u8, |difference, (a, b)| difference | (a ^ b)) == 0
}

/// The answer of a request that did what it was asked and has nothing to tell.
fn done(_: ()) -> Response {
    Response::Done
}

impl Dispatcher {
    /// Builds a server's parts on `node`, each on the parts below it (docs/ARCHITECTURE.md,
    /// "The server's parts").
    pub fn build(node: &Arc<Node>, config: &ServerConfig) -> Dispatcher {
        let opens = Arc::new(OpenRegistry::default());
        let file_locks = Arc::new(LockTable::default());
        let gate = Arc::new(NamespaceGate::default());
        let permissions = Arc::new(Permissions::new(node.clone()));
        let files = Arc::new(Files::new(node.clone(), opens.clone(), file_locks, permissions.clone()));
        let dir_times = Arc::new(DirTimes::new(node.clone(), gate.clone()));
        let flusher = Arc::new(Flusher::new(node.clone(), files.clone(), config.flush));
        let names = Arc::new(Names::new(node.clone(), gate, files.clone(), dir_times.clone(), opens.clone(), permissions.clone()));
        let trees = Arc::new(DirectoryRenames::new(
            node.clone(),
            names.clone(),
            files.clone(),
            dir_times.clone(),
            permissions.clone(),
            flusher.clone(),
        ));
        Dispatcher {
            node: node.clone(),
            secret: config.secret.clone(),
            renames: Renames::new(node.clone(), names.clone(), trees.clone(), files.clone(), dir_times.clone()),
            data: Data::new(node.clone(), files.clone()),
            gmem: Gmem::new(node.clone(), config.gmem.clone()),
            names,
            trees,
            files,
            dir_times,
            flusher,
            permissions,
            opens,
            changes: ChangeLog::default(),
            requests: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
        }
    }

    /// Executes a request here (after routing), as a step of a request checked already.
    fn execute(&self, session: &mut Session, request: Request, data: &[u8], reply_data: &mut Vec<u8>) -> Result<Response, Errno> {
        request.validate()?;
        self.execute_valid(session, request, data, reply_data)
    }

    /// Executes a client's request here, acting for `caller`.
    fn execute_for(
        &self,
        caller: &Credentials,
        session: &mut Session,
        request: Request,
        data: &[u8],
        reply_data: &mut Vec<u8>,
    ) -> Result<Response, Errno> {
        request.validate()?;
        let request = self.permissions.authorize(caller, request)?;
        match self.execute_valid(session, request, data, reply_data)? {
            Response::Names(names) => Ok(Response::Names(names.into_iter().filter(|name| caller.lists_xattr(name)).collect())),
            response => Ok(response),
        }
    }

    /// The part of this server that answers each request: one line per request type.
    fn execute_valid(&self, session: &mut Session, request: Request, data: &[u8], reply_data: &mut Vec<u8>) -> Result<Response, Errno> {
        let store = &self.node.store;
        match request {
            // Membership and the server itself.
            Request::Hello(_) | Request::AsUser(_) => Err(Errno::EPROTO),
            Request::Ping => Ok(Response::Done),
            Request::ProbeFor(probe) => crate::detector::answer_probe(&self.node, &probe),
            Request::GetMembers => Ok(Response::Members(self.node.membership().list().clone())),
            Request::Join(member) => self.join(member),
            Request::PushMembers(list) => self.push_members(&list),
            Request::MemberDigest(asked) => Ok(self.member_digest(asked)),
            Request::Stats => Ok(Response::Stats(self.stats())),
            Request::Shutdown(shutdown) => self.shutdown(shutdown),
            // Names.
            Request::Create(create) => self.names.create(create),
            Request::Lookup(lookup) => self.names.lookup(&lookup.path, lookup.open_for),
            Request::Unlink(unlink) => self.names.unlink(&unlink.path, unlink.time_ns),
            Request::Rmdir(rmdir) => self.names.rmdir(&rmdir.path, rmdir.time_ns),
            Request::Link(link) => self.names.link(&link.from, &link.to, link.time_ns),
            Request::LinkFile(link) => self.names.link_file(link.file, &link.to, link.time_ns),
            Request::ReadDir(read) => self.names.read_dir(&read),
            Request::Find(find) => Ok(Response::Found(store.find(&find.root, &find.filter))),
            Request::Changes(asked) => Ok(Response::ChangeList(self.changes.since(&asked))),
            Request::LookupDir(lookup) => self.names.lookup_dir(&lookup.path),
            Request::PrepareRmdir(request) => self.names.prepare_rmdir(&request.path),
            Request::InstallEntry(install) => self.names.install_entry(install),
            Request::RemoveEntry(remove) => self.names.remove_entry(&remove),
            Request::NameLock(request) => self.names.name_lock(&request.path, request.token, request.acquire, session.server_process),
            // Renames.
            Request::Rename(rename) => self.renames.rename(rename),
            Request::NamespaceLock(request) => self.trees.namespace_lock_step(request.token, request.acquire),
            Request::Freeze(subtree) => self.trees.freeze(&subtree),
            Request::MoveSubtree(subtree) => self.trees.move_subtree(&subtree),
            Request::PutEntries(put) => self.trees.put_moved_entries(put),
            Request::Thaw(subtree) => self.trees.thaw(&subtree),
            // Files, at their inode's server.
            Request::Stat(request) => Ok(Response::Attr(store.stat(request.file).map_err(store_errno)?)),
            Request::Open(open) => self.files.open(open.client, open.file),
            Request::Close(close) => self.files.close(close.client, close.files),
            Request::SetAttr(set) => self.files.set_attr(&set),
            Request::ClampChunkTimes(clamp) => store.clamp_tail_mtimes(clamp.file, clamp.time_ns).map(done).map_err(store_errno),
            Request::ForgetDirAttrs(forget) => {
                self.permissions.forget_file(forget.file);
                Ok(Response::Done)
            }
            Request::Truncate(truncate) => self.data.truncate(&truncate),
            Request::MarkExtended(mark) => {
                store.mark_extended(mark.file, mark.last_chunk).map(|bound| Response::Count(bound.0)).map_err(store_errno)
            }
            Request::AddLink(count) => self.files.add_link(&count),
            Request::DropLink(count) => self.files.drop_link_here(count.file, count.time_ns, count.name.as_deref()).map(done),
            Request::Fsync(request) => store.fsync_file(request.file).map(done).map_err(store_errno),
            Request::LastChunk(request) => Ok(Response::Tail(store.tail_summary(request.file))),
            Request::MissingFiles(list) => Ok(Response::Files(ringfs_proto::FileList { files: store.missing_inodes(&list.files) })),
            Request::TouchDir(touch) => self.dir_times.touch_dir(touch),
            Request::CollectTouches(collect) => Ok(Response::TouchTime(self.dir_times.hand_over(collect.file))),
            Request::SetLock(lock) => self.files.set_lock(&lock),
            Request::TestLock(lock) => self.files.test_lock(&lock),
            Request::Reserve(reservation) => self.files.reserve(reservation),
            Request::PlaceAppend(place) => self.files.place_append(&place),
            Request::RemoveChunks(remove) => Ok(Response::Count(store.remove_chunks(remove.file, remove.from_index, remove.cut_at_ns))),
            // Extended attributes, at the inode's server.
            Request::GetXattr(get) => {
                Ok(Response::Value(ringfs_proto::wire::Bytes(store.get_xattr(get.file, &get.name).map_err(store_errno)?)))
            }
            Request::SetXattr(set) => {
                store.set_xattr(set.file, &set.name, &set.value.0, set.flags, set.time_ns).map(Response::Attr).map_err(store_errno)
            }
            Request::ListXattrs(list) => store.list_xattrs(list.file).map(Response::Names).map_err(store_errno),
            Request::RemoveXattr(remove) => {
                store.remove_xattr(remove.file, &remove.name, remove.time_ns).map(Response::Attr).map_err(store_errno)
            }
            // Chunks.
            Request::Write(write) => self.data.write_request(session, &write, data),
            Request::Read(read) => self.data.read_request(session, &read, reply_data),
            Request::SetChunkLen(set) => self.data.set_chunk_len(session, &set),
            Request::Release(release) => {
                session.release(&release.leases);
                Ok(Response::Done)
            }
            // Cache mode.
            Request::Sync(sync) => self.flusher.sync(sync.ticket),
            Request::FlushPrepare(request) => Ok(Response::BackendTarget(store.prepare(request.file).map_err(store_errno)?)),
            Request::ReadBackendDir(read) => self.read_backend_dir(&read),
            Request::LoadChunk(load) => self.data.load_chunk(session, &load),
            Request::BackendOf(request) => self.data.backend_of(request.file),
            Request::Rebind(rebind) => self.files.rebind_here(rebind.file, rebind.path.as_deref(), rebind.from.as_deref()).map(done),
            Request::YieldBackendName(name) => self.files.yield_backend_name_here(&name),
            Request::MoveBackendFile(moved) => self.files.move_backend_file_here(&moved),
            Request::SettleBackendName(request) => self.files.settle_backend_name_here(&request.path),
            Request::Redirty(request) => self.files.redirty_here(request.file),
            // Global memory.
            Request::GmemAlloc(alloc) => self.gmem.alloc(alloc, request_deadline_or(std::time::Duration::from_secs(1))),
            Request::GmemDefine(layout) => self.gmem.define(layout),
            Request::GmemDrop(array) => self.gmem.drop_array(array),
            Request::GmemFree(free) => self.gmem.free(free),
            Request::GmemBarrier(barrier) => self.gmem.barrier(barrier, request_deadline_or(std::time::Duration::from_secs(1))),
            Request::GmemRead(range) => self.gmem.read(range, reply_data),
            Request::GmemLease(range) => self.gmem.lease(session, range, reply_data),
            Request::GmemWrite(range) => self.gmem.write(range, data),
            Request::GmemAtomic(atomic) => self.gmem.atomic(atomic),
            Request::CoGet(get) => self.gmem.co_get(get, reply_data),
            Request::CoPut(put) => self.gmem.co_put(put, data),
            // Requests a rank's cache answers, not a server.
            Request::CoForward(_) | Request::CoInvalidate(_) | Request::CoFill(_) => Err(Errno::EPROTO),
        }
    }

    /// `Join`: a server joins through this one; it gets the member list.
    fn join(&self, member: Member) -> Result<Response, Errno> {
        log::info!("server {} joins ({})", member.name, member.tcp_address);
        if self.node.membership_mut().admit(member) {
            self.node.spread_members();
        }
        Ok(Response::Members(self.node.membership().list().clone()))
    }

    /// `PushMembers`: another server's member list, merged into ours. What we learn is not
    /// passed on (whoever made the change tells everybody, and the servers' exchanges each
    /// heartbeat mend what a lost message left out); a refutation of our own death is ours
    /// to tell. A sender that lacks something we know gets our list in the answer.
    fn push_members(&self, list: &ringfs_proto::MemberList) -> Result<Response, Errno> {
        let merged = self.node.membership_mut().merge(list, &self.node.name);
        if merged.refuted {
            self.node.spread_members();
        }
        if merged.sender_behind {
            return Ok(Response::Members(self.node.membership().list().clone()));
        }
        Ok(Response::Done)
    }

    /// `MemberDigest`: if our list has the asker's digest, our epoch (raised to the asker's:
    /// the same lists, the higher epoch), else our list (the asker merges it, and pushes its
    /// own if it knew something we did not).
    fn member_digest(&self, asked: ringfs_proto::MemberDigest) -> Response {
        let mut membership = self.node.membership_mut();
        if membership.list().digest() != asked.digest {
            return Response::Members(membership.list().clone());
        }
        membership.raise_epoch(asked.epoch);
        Response::Count(membership.epoch())
    }

    fn shutdown(&self, shutdown: ringfs_proto::Shutdown) -> Result<Response, Errno> {
        log::info!("shutdown requested by a client{}", if shutdown.everyone { ", of every server" } else { "" });
        if shutdown.everyone {
            self.node.shutdown.with_everyone();
        }
        self.node.shutdown.request();
        Ok(Response::Done)
    }

    /// `ReadBackendDir` (cache mode): a page of the backend directory's names.
    fn read_backend_dir(&self, read: &ringfs_proto::ReadDir) -> Result<Response, Errno> {
        let anchor_of = |path: &str| self.node.anchor_of(path);
        let limit = read.limit.clamp(1, 10_000) as usize;
        let page = self.node.store.backend_page(&read.path, read.after.as_deref(), limit, &anchor_of).map_err(store_errno)?;
        Ok(Response::DirPage(page))
    }

    /// This server's counters (`Stats`).
    pub fn stats(&self) -> ServerStats {
        let store = self.node.store.stats();
        ServerStats {
            name: self.node.name.clone(),
            entries: store.entries,
            chunks: store.chunks,
            bytes: store.used_bytes,
            capacity_bytes: store.capacity_bytes,
            requests: self.requests.load(Ordering::Relaxed),
            forwarded: self.forwarded.load(Ordering::Relaxed),
            open_unlinked: store.open_unlinked,
            cache: self.node.store.cache_stats().map(|mut cache| {
                cache.policy = self.flusher.config.policy.to_string();
                cache.flushing = self.flusher.io_monitor.is_flushing();
                cache.longest_stop_us = self.flusher.io_monitor.longest_stop_us();
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
            peer_transports: self.node.peer_transports(),
        }
    }

    /// The server that must execute `request`, if not this one.
    fn route_target(&self, request: &Request) -> Option<Member> {
        let owner = match request.route() {
            Route::Here => return None,
            // Every server holds the root directory and answers for it itself.
            Route::Path("/") => return None,
            Route::Chunk(key) if key.file.is_root() => return None,
            Route::Path(path) => self.node.owner_of_path(path),
            Route::Chunk(key) => self.node.owner_of_chunk(key),
        };
        (!self.node.is_self(&owner)).then_some(owner)
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

    /// Forwards a client's request to the owner of its key and relays the answer.
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
        let reply = self.node.call(owner, &request, pulled.as_deref().unwrap_or(data))?;
        reply_data.extend_from_slice(&reply.data);
        Ok(reply.response)
    }
}

impl LocalDispatch for Dispatcher {
    fn execute_here(&self, request: Request, data: &[u8]) -> Result<Reply, Errno> {
        let mut reply_data = Vec::new();
        let response = self.execute(&mut Session::local(), request, data, &mut reply_data)?;
        let data_len = reply_data.len();
        Ok(Reply { response, data: reply_data, data_len })
    }
}

impl Service for Dispatcher {
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
        session.server_process = hello.from_server.then_some((hello.host_id, hello.client_pid));
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
            server_name: self.node.name.clone(),
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
            self.flusher.io_monitor.begin();
        }
        let deadline = session.patience.map(|patience| client_deadline(session, &request, patience));
        // What the request changes, for FUSE mounts watching (see `changes`).
        let (changes, moved) = (self.changes.changes_of(&request), self.changes.move_of(&request));
        // (Failed requests are logged at debug level, for whoever hunts a failure.)
        let described = log::log_enabled!(log::Level::Debug).then(|| format!("{request:?}"));
        let mut response = with_request_deadline(deadline, || {
            self.dir_times.serving(|| self.route(session, caller.as_deref(), request, data, reply_data))
        });
        if let (Response::Error(errno), Some(described)) = (&response, described) {
            log::debug!("{} answered {errno}", described.chars().take(240).collect::<String>());
        }
        self.changes.note(session.client_id.unwrap_or(0), ChangeLog::with_move(changes, moved, &response));
        // Directories' times: what the response shows includes every change of names before
        // it, and a change of names answers once its directories' times have moved.
        self.dir_times.settle_dir_times(&mut response, deadline);
        self.dir_times.await_touches(deadline);
        if io {
            self.flusher.io_monitor.end();
        }
        response
    }

    fn epoch(&self) -> u64 {
        self.node.membership().epoch()
    }

    fn closed(&self, session: &mut Session) {
        session.leases.clear();
        if let Some(client) = session.client_id.take() {
            self.opens.disconnected(client);
        }
    }
}
