//! The client's view of the servers: member list, placement, and one connection per server
//! it talks to (`connection_table`).
//!
//! The member list comes from any server named in the configuration. Every response carries
//! the server's membership epoch; when it is newer than ours, the client fetches the list
//! again, so it follows joins and failures without configuration.

use ringfs_sync::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ringfs_placement::MemberRing;
use ringfs_proto::{ChunkIndex, ChunkKey, Errno, FileId, LeaseId, Member, MemberList, Request, Response};
use ringfs_rpc::{Connection, ConnectionConfig, Endpoint, PendingCall, Reply};

use crate::ConnectError;
use crate::connection_table::ConnectionTable;

/// Connections to all servers, shared by every thread of the client.
pub(crate) struct Cluster {
    config: ConnectionConfig,
    view: RwLock<MemberRing>,
    epoch: AtomicU64,
    connections: ConnectionTable,
    /// Connections unused this long are closed (`None`: never).
    idle_close: Option<Duration>,
    /// Per server: leases this client is done with, to be released with the next read.
    lease_backlog: Mutex<HashMap<String, Vec<LeaseId>>>,
    /// Held while the member list is being fetched; holds the time of the last fetch that
    /// followed a failure.
    refreshing: Mutex<Option<Instant>>,
    /// Servers that let a request time out, with the time until which calls to them fail at
    /// once (one request deadline): a stopped server costs one deadline per operation, not
    /// one per request of the operation.
    suspects: Mutex<HashMap<String, Instant>>,
    /// The cluster's run directory: read again for current addresses when no known server
    /// answers.
    run_dir: Option<std::path::PathBuf>,
}

/// After a server fails, the member list is fetched again at most this often.
const REFRESH_AFTER_FAILURE_INTERVAL: Duration = Duration::from_millis(500);

fn fetch_members(connection: &Connection) -> Result<MemberList, String> {
    members_of(connection.call(&Request::GetMembers, &[]))
}

/// [`fetch_members`], waiting at most `timeout` (less than the connection's deadline).
fn fetch_members_within(connection: &Connection, timeout: Duration) -> Result<MemberList, String> {
    members_of(connection.call_within(&Request::GetMembers, timeout))
}

fn members_of(reply: Result<Reply, ringfs_rpc::RpcError>) -> Result<MemberList, String> {
    match reply.map_err(|error| error.to_string())?.response {
        Response::Members(list) => Ok(list),
        other => Err(format!("unexpected answer {other:?}")),
    }
}

/// Where [`Connection::open_member`] connects to `member` first.
fn preferred_endpoint(member: &Member, config: &ConnectionConfig) -> Option<Endpoint> {
    if member.host_id == config.host_id && !member.unix_path.is_empty() {
        return Some(Endpoint::Unix(member.unix_path.clone().into()));
    }
    Endpoint::parse(&member.tcp_address).ok()
}

impl Cluster {
    /// Fetches the member list from the first reachable server of `seeds`, starting at a
    /// seed picked by the client's id: the ranks of a job given the same list ask different
    /// servers, not all the first one. The connection to it is kept if it is the one the
    /// client would open to that server anyway.
    pub fn connect(
        seeds: &[String],
        config: ConnectionConfig,
        run_dir: Option<std::path::PathBuf>,
        idle_close: Option<Duration>,
    ) -> Result<Cluster, ConnectError> {
        let mut failures = Vec::new();
        let first = (config.client_id as usize).checked_rem(seeds.len()).unwrap_or(0);
        let spread = seeds.iter().cycle().skip(first).take(seeds.len()).cloned();
        // None of the given addresses answers: the run directory's (servers restarted on
        // other ports), read only then.
        let recorded =
            || run_dir.as_deref().map(crate::run_dir::addresses).unwrap_or_default().into_iter().filter(|address| !seeds.contains(address));
        for seed in spread.chain(std::iter::once_with(recorded).flatten()) {
            let seed = &seed;
            let endpoint = Endpoint::parse(seed).map_err(ConnectError::Config)?;
            let list = Connection::open(&endpoint, &config).map_err(|error| match error {
                ringfs_rpc::RpcError::Refused { errno, .. } => ConnectError::Refused(errno),
                other => ConnectError::Unreachable(other.to_string()),
            });
            match list {
                Ok(connection) => match fetch_members(&connection) {
                    Ok(list) => {
                        let view = MemberRing::new(list).map_err(ConnectError::Config)?;
                        let connections = ConnectionTable::default();
                        if let Some(member) = view.list().members.iter().find(|member| member.name == connection.server_name())
                            && preferred_endpoint(member, &config).as_ref() == Some(&endpoint)
                        {
                            connection.set_local_epoch(view.list().epoch);
                            connections.insert(member.name.clone(), Arc::new(connection));
                        }
                        let cluster = Cluster {
                            config,
                            epoch: AtomicU64::new(view.list().epoch),
                            view: RwLock::new(view),
                            connections,
                            idle_close,
                            lease_backlog: Mutex::new(HashMap::new()),
                            refreshing: Mutex::new(None),
                            suspects: Mutex::new(HashMap::new()),
                            run_dir,
                        };
                        return Ok(cluster);
                    }
                    Err(reason) => failures.push(format!("{seed}: {reason}")),
                },
                Err(ConnectError::Refused(errno)) => return Err(ConnectError::Refused(errno)),
                Err(error) => failures.push(error.to_string()),
            }
        }
        Err(ConnectError::Unreachable(if failures.is_empty() { "no server address given".into() } else { failures.join("; ") }))
    }

    fn view(&self) -> ringfs_sync::RwLockReadGuard<'_, MemberRing> {
        self.view.read()
    }

    /// The server that owns the entry of `path`. Every server holds the root directory: for
    /// `/` this is the placement owner if it is alive, else any alive server, so that the root
    /// stays usable while some server is down.
    pub fn owner_of_path(&self, path: &str) -> Member {
        let view = self.view();
        let owner = view.owner_of_path(path);
        if path == "/" {
            return self.usable_or_any(&view, owner);
        }
        owner.clone()
    }

    /// The server that owns a chunk of a file (index 0: its inode). The root directory's
    /// inode is on every server, as its entry.
    pub fn owner_of_chunk(&self, key: ChunkKey) -> Member {
        let view = self.view();
        let owner = view.owner(key.file.anchor, key.index);
        if key.file.is_root() {
            return self.usable_or_any(&view, owner);
        }
        owner.clone()
    }

    /// `owner` if it is alive and not suspect, else the first alive server that is not.
    fn usable_or_any(&self, view: &MemberRing, owner: &Member) -> Member {
        if (!owner.alive || self.is_suspect(&owner.name))
            && let Some(alive) = view.in_ring_order().find(|member| member.alive && !self.is_suspect(&member.name))
        {
            return alive.clone();
        }
        owner.clone()
    }

    /// The UCX transports (lanes) of this client's connection to server `name`, if it has
    /// one over UCX.
    pub fn ucx_lanes(&self, name: &str) -> Option<String> {
        self.connections.usable(name).and_then(|connection| connection.ucx_lanes())
    }

    /// The settings of this cluster's connections.
    pub fn connection_config(&self) -> ConnectionConfig {
        self.config.clone()
    }

    /// The deadline of every request.
    pub fn timeout(&self) -> Duration {
        self.config.timeout
    }

    /// This host's identity (see `Member::host_id`).
    pub fn host_id(&self) -> u64 {
        self.config.host_id
    }

    pub fn member_list(&self) -> MemberList {
        self.view().list().clone()
    }

    /// Whether `server` let a request time out less than a request deadline ago.
    fn is_suspect(&self, server: &str) -> bool {
        let mut suspects = self.suspects.lock();
        match suspects.get(server) {
            Some(until) if Instant::now() < *until => true,
            Some(_) => {
                suspects.remove(server);
                false
            }
            None => false,
        }
    }

    /// Records a failure of a request to `server`: a timeout makes it a suspect. A wait given
    /// up for a caller being killed says nothing about the server.
    fn note_failure(&self, server: &str, error: &ringfs_rpc::RpcError) {
        if error.is_abandoned() {
            return;
        }
        if error.is_timeout() {
            self.suspects.lock().insert(server.to_string(), Instant::now() + self.config.timeout);
        }
        self.refresh_after_failure(server);
    }

    /// A connection to `member`; EIO if it is known to be dead, let a request time out
    /// moments ago, or cannot be reached.
    ///
    /// A member our list calls dead may have come back since: nothing else tells a client
    /// that only asks that member, so the others are asked for a newer list first (at most
    /// every [`REFRESH_AFTER_FAILURE_INTERVAL`]).
    pub fn connection(&self, member: &Member) -> Result<Arc<Connection>, Errno> {
        let revived;
        let member = if member.alive {
            member
        } else {
            self.refresh_after_failure(&member.name);
            revived = self.view().list().members.iter().find(|known| known.name == member.name && known.alive).cloned();
            revived.as_ref().ok_or(Errno::EIO)?
        };
        if self.is_suspect(&member.name) {
            return Err(Errno::EIO);
        }
        if let Some(connection) = self.connections.usable(&member.name) {
            return Ok(connection);
        }
        let connection = match Connection::open_member(member, &self.config) {
            Ok(connection) => connection,
            Err(error) => {
                log::debug!("cannot connect to server {}: {error}", member.name);
                self.note_failure(&member.name, &error);
                return Err(error.errno());
            }
        };
        connection.set_local_epoch(self.epoch.load(Ordering::Relaxed));
        let connection = Arc::new(connection);
        self.connections.insert(member.name.clone(), connection.clone());
        Ok(connection)
    }

    /// The connections to servers, and the opens that keep them (see `connection_table`).
    pub fn connections(&self) -> &ConnectionTable {
        &self.connections
    }

    /// Closes the connections unused for the configured idle time (see `connection_table`),
    /// with the lease releases waiting for them (their server forgets those leases with the
    /// connection).
    pub fn close_idle_connections(&self) {
        let Some(idle_for) = self.idle_close else { return };
        let closed = self.connections.close_idle(idle_for);
        if !closed.is_empty() {
            let mut backlog = self.lease_backlog.lock();
            for server in &closed {
                backlog.remove(server);
            }
            log::debug!("closed idle connections to {closed:?}");
        }
    }

    /// Leases to release with the next read sent to `server`.
    pub fn take_releases(&self, server: &str) -> Vec<LeaseId> {
        self.lease_backlog.lock().get_mut(server).map(std::mem::take).unwrap_or_default()
    }

    /// Remembers leases to release with the next read on `connection`; too many are released
    /// at once with a message of their own.
    pub fn defer_releases(&self, connection: &Connection, leases: Vec<LeaseId>) {
        const MAX_BACKLOG: usize = 64;
        let mut backlog = self.lease_backlog.lock();
        let pending = backlog.entry(connection.server_name().to_string()).or_default();
        pending.extend(leases);
        if pending.len() >= MAX_BACKLOG {
            let leases = std::mem::take(pending);
            drop(backlog);
            if let Err(error) = connection.send_one_way(&Request::Release(ringfs_proto::Release { leases })) {
                log::debug!("could not release leases: {error}");
            }
        }
    }

    /// Collects a pending call, turning error responses into errnos, and follows membership
    /// changes the server reports.
    pub fn finish(&self, connection: &Connection, call: Result<PendingCall<'_>, ringfs_rpc::RpcError>) -> Result<Reply, Errno> {
        let reply = call.and_then(PendingCall::wait).map_err(|error| {
            log::debug!("request failed: {error}");
            self.note_failure(connection.server_name(), &error);
            error.errno()
        });
        self.follow_epoch(connection);
        let reply = reply?;
        match reply.response {
            Response::Error(errno) => Err(errno),
            _ => Ok(reply),
        }
    }

    /// Sends one request to `member` and waits for the answer.
    pub fn call(&self, member: &Member, request: &Request, data: &[u8]) -> Result<Reply, Errno> {
        let connection = self.connection(member)?;
        let call = connection.start(request, data, None);
        self.finish(&connection, call)
    }

    /// Sends one request to `owner`. Requests about the root directory, which every server
    /// holds, try the other servers when the first one fails.
    pub fn call_at(&self, owner: &Member, about_root: bool, request: &Request) -> Result<Response, Errno> {
        let first = self.call(owner, request, &[]);
        if !about_root || first.is_ok() {
            return Ok(first?.response);
        }
        let others: Vec<Member> = self.view().in_ring_order().filter(|member| member.alive && member.name != owner.name).cloned().collect();
        let mut last = first;
        for member in others {
            last = self.call(&member, request, &[]);
            if last.is_ok() {
                break;
            }
        }
        Ok(last?.response)
    }

    /// Sends one request to the owner of the entry of `path`.
    pub fn call_path_owner(&self, path: &str, request: &Request) -> Result<Response, Errno> {
        self.call_at(&self.owner_of_path(path), path == "/", request)
    }

    /// Sends one request to the server of `file`'s inode.
    pub fn call_home(&self, file: FileId, request: &Request) -> Result<Response, Errno> {
        self.call_at(&self.owner_of_chunk(ChunkKey::inode(file)), file.is_root(), request)
    }

    /// Sends `request` to `home` without waiting for an answer (lost if it cannot be sent).
    pub fn send_to(&self, home: &Member, request: &Request) {
        match self.connection(home) {
            Ok(connection) => {
                if let Err(error) = connection.send_one_way(request) {
                    log::debug!("could not send to server {}: {error}", home.name);
                }
            }
            Err(errno) => log::debug!("could not reach server {}: {errno}", home.name),
        }
    }

    /// Sends `request` to every server at once; fails if any server fails.
    pub fn broadcast(&self, request: &Request) -> Result<Vec<Response>, Errno> {
        let members = self.view().list().members.clone();
        self.call_each(&members, request)
    }

    /// The servers that own chunks `first..=last` of `file`, each once.
    pub fn owners_of_chunks(&self, file: FileId, first: ChunkIndex, last: ChunkIndex) -> Vec<Member> {
        self.view().owners_of_chunks(file.anchor, first, last).into_iter().cloned().collect()
    }

    /// Sends `request` to each of `members` at once and waits for every answer (the first
    /// failure, once all answered or failed).
    pub fn call_each(&self, members: &[Member], request: &Request) -> Result<Vec<Response>, Errno> {
        self.answer_each(members, request).into_iter().collect()
    }

    /// Sends `request` to each of `members` it can reach, all at once, and returns each
    /// member's answer (the error for one it could not reach), in the order of `members`.
    pub fn answer_each(&self, members: &[Member], request: &Request) -> Vec<Result<Response, Errno>> {
        let connections: Vec<Result<_, Errno>> = members.iter().map(|member| self.connection(member)).collect();
        // Every call is started before any is awaited.
        let calls: Vec<_> = connections
            .iter()
            .map(|connection| connection.as_ref().map(|connection| (connection, connection.start(request, &[], None))))
            .collect();
        calls
            .into_iter()
            .map(|started| {
                let (connection, call) = started.map_err(|errno| *errno)?;
                self.finish(connection, call).map(|reply| reply.response)
            })
            .collect()
    }

    /// Refetches the member list if `connection`'s server has a newer epoch than ours.
    fn follow_epoch(&self, connection: &Connection) {
        if connection.peer_epoch() <= self.epoch.load(Ordering::Relaxed) {
            return;
        }
        let Some(_guard) = self.refreshing.try_lock() else { return };
        self.adopt_members_from(connection);
    }

    /// After `failed_server` failed, asks the other alive servers for the member list: they
    /// may already know it is dead, and then later requests for its keys fail at once.
    fn refresh_after_failure(&self, failed_server: &str) {
        let Some(mut last) = self.refreshing.try_lock() else { return };
        if last.is_some_and(|at| at.elapsed() < REFRESH_AFTER_FAILURE_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
        // The caller's operation has failed already: the refresh must not make it slower by
        // more than one deadline, whatever number of servers is silent. Each server gets what
        // is left of that budget, suspects none, and one that does not answer becomes one.
        let budget_end = Instant::now() + self.config.timeout;
        let others: Vec<Member> = self
            .view()
            .list()
            .members
            .iter()
            .filter(|member| member.alive && member.name != failed_server && !self.is_suspect(&member.name))
            .cloned()
            .collect();
        for member in others {
            let left = budget_end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let connection = self.connections.usable(&member.name);
            let connection = match connection {
                Some(connection) => connection,
                None => match Connection::open_member(&member, &ConnectionConfig { timeout: left, ..self.config.clone() }) {
                    Ok(connection) => Arc::new(connection),
                    Err(error) => {
                        if error.is_timeout() {
                            self.suspects.lock().insert(member.name.clone(), Instant::now() + self.config.timeout);
                        }
                        continue;
                    }
                },
            };
            let left = budget_end.saturating_duration_since(Instant::now());
            match fetch_members_within(&connection, left).map(MemberRing::new) {
                Ok(Ok(view)) => {
                    self.adopt_view(view, false);
                    return;
                }
                Ok(Err(reason)) | Err(reason) => {
                    log::debug!("cannot refresh the member list from {}: {reason}", member.name);
                    self.suspects.lock().insert(member.name.clone(), Instant::now() + self.config.timeout);
                }
            }
        }
        // No known server answers: the run directory knows where the servers are now (they
        // may have been restarted on other ports).
        let Some(run_dir) = &self.run_dir else { return };
        for address in crate::run_dir::addresses(run_dir) {
            let Ok(endpoint) = Endpoint::parse(&address) else { continue };
            let Ok(connection) = Connection::open(&endpoint, &self.config) else { continue };
            // Adopted even if its epoch is older: a restarted cluster counts anew.
            if self.adopt_members(&connection, true) {
                return;
            }
        }
    }

    /// Adopts `view` if it is newer than ours (or in any case with `always`).
    fn adopt_view(&self, view: MemberRing, always: bool) {
        let epoch = view.list().epoch;
        if always || epoch > self.epoch.load(Ordering::Relaxed) {
            *self.view.write() = view;
            self.epoch.store(epoch, Ordering::Relaxed);
            self.connections.for_each(|connection| connection.set_local_epoch(epoch));
            log::debug!("member list updated to epoch {epoch}");
        }
    }

    /// Fetches the member list from `connection`'s server and adopts it if it is newer.
    fn adopt_members_from(&self, connection: &Connection) -> bool {
        self.adopt_members(connection, false)
    }

    /// Fetches the member list from `connection`'s server and adopts it if it is newer, or
    /// in any case with `always`.
    fn adopt_members(&self, connection: &Connection, always: bool) -> bool {
        match fetch_members(connection).map(MemberRing::new) {
            Ok(Ok(view)) => {
                self.adopt_view(view, always);
                true
            }
            // The server may be shutting down; another answer will trigger a retry.
            Ok(Err(reason)) | Err(reason) => {
                log::debug!("cannot refresh the member list: {reason}");
                false
            }
        }
    }
}
