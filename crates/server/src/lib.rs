//! The ringfs server (`ringfs server`): one per node, holding the chunks placement gives it.
//!
//! A server listens on TCP (for every client and server) and optionally on a Unix socket (for
//! clients on its host, which may then move bulk data by cross-memory attach). It answers
//! requests about the names and chunks its [`ringfs_store::ChunkStore`] holds, forwards
//! requests for keys it does not own, coordinates the operations that span servers (creates
//! under remote parents, unlink, link, truncate, rmdir, rename of files and directories),
//! keeps the opens of its clients, and keeps the member list: joins, gossip, failure
//! detection of its ring successor, and the return of servers wrongly declared dead.
//!
//! There is no metadata server: every server runs the same code and decides alone.
//!
//! ```no_run
//! use ringfs_server::{Server, ServerConfig};
//! let config = ServerConfig::new("node-0", "127.0.0.1:0", b"secret".to_vec());
//! let server = Server::start(config).unwrap();
//! println!("serving at {}", server.tcp_address());
//! server.wait_for_shutdown();
//! server.stop();
//! ```

mod appends;
mod changes;
#[cfg(test)]
mod coordinator_tests;
mod data;
mod deadline;
mod detector;
#[cfg(test)]
mod detector_tests;
mod dir_times;
mod directory_rename;
mod dispatch;
mod file_locks;
mod files;
mod flusher;
mod gate;
pub mod gmem;
#[cfg(test)]
mod interleaving_tests;
mod membership;
mod name_locks;
mod names;
mod node;
mod opens;
mod outbound;
mod peers;
mod permissions;
mod reclaim;
mod renames;
mod sched;
mod session;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use flusher::{FlushConfig, FlushPolicy};
pub use membership::Membership;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ringfs_placement::{HashFunction, Scheme};
use ringfs_proto::{Member, Request, Response};
use ringfs_rpc::transport::local_host_id;
use ringfs_rpc::{Connection, ConnectionConfig, Endpoint, Listener, RpcServer};
use ringfs_store::{ChunkStore, StoreConfig, StoreError};
use thiserror::Error;

use crate::dispatch::Dispatcher;
use crate::node::{LocalDispatch, Node};
use crate::peers::Peers;

/// Everything a server needs to start. [`ServerConfig::new`] gives the defaults.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Stable name; placement depends on it, so a restarted server must keep its name.
    pub name: String,
    /// TCP address to listen on (`host:port`; port 0 picks a free one).
    pub listen: String,
    /// Address other hosts use to reach this server (default: the bound address, with a
    /// wildcard host replaced by the host name).
    pub advertise: Option<String>,
    /// Unix socket for clients on this host (`None`: TCP only).
    pub unix_socket: Option<PathBuf>,
    pub store: StoreConfig,
    /// The job's secret; connections without it are refused.
    pub secret: Vec<u8>,
    /// Running servers to join through (tried in order); empty: start a new cluster.
    pub join: Vec<String>,
    pub hash: HashFunction,
    pub placement: Scheme,
    /// Deadline of a request to another server. Default 10 s.
    pub peer_timeout: Duration,
    /// How often a server pings its ring successor. Default 1 s.
    pub heartbeat_interval: Duration,
    /// A successor that answered no ping for this long is declared dead. Default 5 s.
    pub failure_timeout: Duration,
    /// How long the files a client has open stay open after its last connection to this
    /// server closed (it may reconnect; a crashed client's files are freed after it).
    /// Default 30 s.
    pub open_grace: Duration,
    /// How often this server looks for orphan chunks (`reclaim`). Default 60 s.
    pub reclaim_interval: Duration,
    /// How long a serving thread keeps polling a connection for its next request before the
    /// connection goes back to the event loop. Default 50 µs; zero never polls (see
    /// docs/PERFORMANCE.md).
    pub poll: Duration,
    /// Cache mode (a store with a backend): when dirty data is written back.
    pub flush: FlushConfig,
    /// Global memory: how much DRAM it may use before spilling, where it spills, the
    /// emulated SSD and network (see `gmem`).
    pub gmem: gmem::GmemConfig,
    /// Where the other servers are, as (name, TCP address) pairs of the servers whose names
    /// the argument accepts, looked up at each call — `ringfs server --run-dir` looks in the
    /// run directory (`ringfs_client::run_dir::RunDirWatch`). With it, a server whose `join`
    /// servers do not answer starts alone, and keeps joining the servers it discovers that
    /// its member list lacks or believes dead (a restarted server joins the others itself).
    pub discover: Option<Discover>,
}

/// See [`ServerConfig::discover`].
#[derive(Clone)]
pub struct Discover(pub Arc<DiscoverFn>);

/// Given which server names are wanted, their (name, TCP address) pairs.
pub type DiscoverFn = dyn Fn(&dyn Fn(&str) -> bool) -> Vec<(String, String)> + Send + Sync;

impl std::fmt::Debug for Discover {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Discover")
    }
}

impl ServerConfig {
    pub fn new(name: &str, listen: &str, secret: Vec<u8>) -> ServerConfig {
        ServerConfig {
            name: name.to_string(),
            listen: listen.to_string(),
            advertise: None,
            unix_socket: None,
            store: StoreConfig::memory(),
            secret,
            join: Vec::new(),
            hash: HashFunction::default(),
            placement: Scheme::default(),
            peer_timeout: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(1),
            failure_timeout: Duration::from_secs(5),
            open_grace: opens::GRACE,
            reclaim_interval: Duration::from_secs(60),
            poll: ringfs_rpc::DEFAULT_POLL,
            flush: FlushConfig::default(),
            gmem: gmem::GmemConfig {
                memory: gmem::GlobalMemoryConfig {
                    dram_bytes: DEFAULT_GMEM_DRAM,
                    spill_dir: std::env::temp_dir().join(format!("ringfs-gmem-{name}-{}", std::process::id())),
                    ssd: None,
                },
                network: None,
            },
            discover: None,
        }
    }
}

/// DRAM a server's global memory uses before it spills to the SSD, by default.
pub const DEFAULT_GMEM_DRAM: u64 = 1 << 30;

#[derive(Debug, Error)]
pub enum ServerError {
    #[error("cannot listen on {endpoint}: {source}")]
    Listen { endpoint: String, source: std::io::Error },
    #[error("cannot open the store: {0}")]
    Store(#[from] StoreError),
    #[error("cannot join the cluster: {0}")]
    Join(String),
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// Requests the shutdown of a [`Server`] from another thread.
#[derive(Clone)]
pub struct ShutdownHandle(Arc<Node>);

impl ShutdownHandle {
    pub fn request(&self) {
        self.0.shutdown.request();
    }
}

/// A running server.
pub struct Server {
    state: Arc<Dispatcher>,
    rpc: RpcServer,
    tcp_address: String,
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_nanos() as u64).unwrap_or(1)
}

/// The address other hosts should use for a socket bound to `bound` (a wildcard address is
/// replaced by the host name; a transport prefix such as `ucx://` is kept).
fn advertised_address(bound: &str) -> String {
    let (scheme, address) = bound.split_once("://").map_or(("", bound), |(scheme, address)| (scheme, address));
    let prefix = if scheme.is_empty() { String::new() } else { format!("{scheme}://") };
    match address.rsplit_once(':') {
        Some((host, port)) if host == "0.0.0.0" || host == "[::]" => {
            let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "localhost".into());
            format!("{prefix}{}:{port}", host_name.trim())
        }
        _ => bound.to_string(),
    }
}

impl Server {
    /// Opens the store, binds the sockets, joins the cluster and starts serving.
    pub fn start(config: ServerConfig) -> Result<Server, ServerError> {
        if config.name.is_empty() {
            return Err(ServerError::Config("the server name is empty".into()));
        }
        let store = ChunkStore::open(config.store.clone())?;
        let tcp_endpoint = Endpoint::parse(&config.listen).map_err(ServerError::Config)?;
        let listen_error = |endpoint: &Endpoint| {
            let endpoint = endpoint.to_string();
            move |source| ServerError::Listen { endpoint, source }
        };
        let tcp_listener = Listener::bind(&tcp_endpoint).map_err(listen_error(&tcp_endpoint))?;
        let bound = tcp_listener.local_endpoint().map_err(listen_error(&tcp_endpoint))?.to_string();
        let tcp_address = config.advertise.clone().unwrap_or_else(|| advertised_address(&bound));
        let mut listeners = vec![tcp_listener];
        if let Some(path) = &config.unix_socket {
            let endpoint = Endpoint::Unix(path.clone());
            listeners.push(Listener::bind(&endpoint).map_err(listen_error(&endpoint))?);
        }

        let host_id = local_host_id();
        let own = Member {
            name: config.name.clone(),
            tcp_address: tcp_address.clone(),
            unix_path: config.unix_socket.as_ref().map(|path| path.display().to_string()).unwrap_or_default(),
            host_id,
            pid: std::process::id(),
            alive: true,
            incarnation: now_ns(),
        };
        let peer_config = ConnectionConfig {
            secret: config.secret.clone(),
            timeout: config.peer_timeout,
            host_id,
            from_server: true,
            poll: config.poll,
            client_id: 0,
            credentials: Default::default(),
        };
        let mut membership = Membership::new(own.clone(), config.hash, config.placement);
        // With a run directory to discover the others by, a server that cannot join starts
        // alone at once (and joins them later); without one, it keeps trying a while.
        let patience = if config.discover.is_some() { Duration::ZERO } else { JOIN_PATIENCE };
        let joined = match join_cluster(&config.join, &own, &peer_config, patience) {
            Ok(list) => list,
            Err(error) if config.discover.is_some() => {
                log::warn!("{error}; starting alone until the others are found");
                None
            }
            Err(error) => return Err(error),
        };
        if let Some(list) = joined {
            if list.placement != membership.list().placement {
                return Err(ServerError::Config(format!(
                    "the cluster places keys with {}, this server with {}",
                    list.placement,
                    membership.list().placement
                )));
            }
            // The server it joined tells everybody else (not this one: at a job's start that
            // would cost every server a push from every other).
            membership.merge(&list, &config.name);
        }

        let (gossip_sender, gossip_receiver) = mpsc::channel();
        let peers = Arc::new(Peers::new(peer_config.clone()));
        let node = Arc::new(Node::new(config.name.clone(), store, membership, peers, peer_config, gossip_sender));
        let state = Arc::new(Dispatcher::build(&node, &config));
        node.set_local_dispatch(Arc::downgrade(&state) as std::sync::Weak<dyn LocalDispatch>);
        let rpc = RpcServer::start(state.clone(), listeners, config.poll)
            .map_err(|source| ServerError::Listen { endpoint: config.listen.clone(), source })?;
        spawn_named("ringfs-gossip", {
            let node = node.clone();
            move || gossip_loop(&node, gossip_receiver)
        });
        spawn_named("ringfs-dirtimes", {
            let dir_times = state.dir_times.clone();
            move || dir_times.dir_times_loop()
        });
        spawn_named("ringfs-detector", {
            let node = node.clone();
            let interval = config.heartbeat_interval;
            let failure_timeout = config.failure_timeout;
            move || detector::FailureDetector::new(interval, failure_timeout).run(&node)
        });
        spawn_named("ringfs-revive", {
            let node = node.clone();
            let state = state.clone();
            let interval = config.heartbeat_interval;
            let discover = config.discover.clone();
            let grace = config.open_grace;
            let reclaimer = reclaim::Reclaimer::new(config.reclaim_interval);
            move || revive_members(&node, &state, interval, discover.as_ref(), grace, reclaimer)
        });
        if let Some(backend) = node.store.backend() {
            log::info!("caching {} at {} (flush policy {})", backend.root().display(), backend.mount_path(), config.flush.policy);
            spawn_named("ringfs-flusher", {
                let flusher = state.flusher.clone();
                move || flusher.flush_loop()
            });
        }
        log::info!("server {} serving at {tcp_address}", config.name);
        Ok(Server { state, rpc, tcp_address })
    }

    pub fn name(&self) -> &str {
        &self.state.node.name
    }

    /// The TCP address clients and servers use to reach this server.
    pub fn tcp_address(&self) -> &str {
        &self.tcp_address
    }

    /// Current member list size (alive members).
    pub fn alive_members(&self) -> usize {
        self.state.node.membership().alive_members().count()
    }

    /// Asks the server to stop (what SIGTERM and `ringfs stop` do).
    pub fn request_shutdown(&self) {
        self.state.node.shutdown.request();
    }

    /// A handle another thread (a signal handler) can use to request the shutdown.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.state.node.clone())
    }

    /// Blocks until a shutdown is requested.
    pub fn wait_for_shutdown(&self) {
        while !self.state.node.shutdown.wait(Duration::from_secs(3600)) {}
    }

    /// Stops serving: in cache mode everything dirty is flushed first (while the server still
    /// answers the other servers' flushes), then no new connections, open ones end, and other
    /// servers hear that this one left. A `dir` store keeps everything on disk for a restart.
    pub fn stop(self) {
        let node = &self.state.node;
        node.shutdown.request();
        if node.store.backend().is_some() {
            self.state.flusher.flush_everything();
        }
        self.rpc.shutdown();
        // The threads that still hold the global memory may outlive this call: its spill
        // files are removed now, not when (if ever) it is dropped.
        self.state.gmem.memory.remove_spill_files();
        if node.shutdown.everyone_stops() {
            // `ringfs stop` stops every server: nobody is left to tell.
            log::info!("server {} stopped with every other", node.name);
            return;
        }
        let list = {
            let mut membership = node.membership_mut();
            membership.declare_dead(&node.name);
            membership.list().clone()
        };
        // Best effort: tell the others now rather than letting their detectors find out, but
        // not for long — when a job ends, every server stops at once and none answers.
        let results = node.broadcast_to_others(&Request::PushMembers(list), Some(Instant::now() + GOODBYE_PATIENCE));
        log::info!("server {} stopped ({} peers told)", node.name, results.iter().filter(|answer| answer.is_ok()).count());
    }
}

/// How long a stopping server waits for the others to take note that it leaves (its
/// goodbye). Over TCP a server that stops too refuses at once; over UCX it is silent until
/// its process ends, and the goodbyes of servers stopped together waited out the request
/// deadline (10 s) before.
const GOODBYE_PATIENCE: Duration = Duration::from_secs(1);

fn spawn_named(name: &str, body: impl FnOnce() + Send + 'static) {
    if let Err(error) = thread::Builder::new().name(name.into()).spawn(body) {
        log::error!("cannot start thread {name}: {error}");
    }
}

/// How long a starting server keeps trying to join before it gives up: a cluster busy
/// healing from a fault may not answer a `Join` at once (the soak restarted a server just
/// after a partition healed, and the one try it had timed out).
const JOIN_PATIENCE: Duration = Duration::from_secs(30);

/// Sends `Join` to the first reachable server of `join` and returns its member list; `None`
/// for an empty `join` (a new cluster). Tries them all again and again for `patience`.
fn join_cluster(
    join: &[String],
    own: &Member,
    config: &ConnectionConfig,
    patience: Duration,
) -> Result<Option<ringfs_proto::MemberList>, ServerError> {
    if join.is_empty() {
        return Ok(None);
    }
    let endpoints = join.iter().map(|address| Endpoint::parse(address).map_err(ServerError::Config)).collect::<Result<Vec<_>, _>>()?;
    let deadline = Instant::now() + patience;
    loop {
        let mut failures = Vec::new();
        for (address, endpoint) in join.iter().zip(&endpoints) {
            let reply = Connection::open(endpoint, config).and_then(|connection| connection.call(&Request::Join(own.clone()), &[]));
            match reply {
                Ok(reply) => match reply.response {
                    Response::Members(list) => return Ok(Some(list)),
                    // A refusal (another placement, a wrong secret) will not change.
                    other => return Err(ServerError::Join(format!("{address}: unexpected answer {other:?}"))),
                },
                Err(error) => failures.push(format!("{address}: {error}")),
            }
        }
        if Instant::now() >= deadline {
            return Err(ServerError::Join(failures.join("; ")));
        }
        log::info!("cannot join yet ({}); trying again", failures.join("; "));
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Pushes the member list to everyone whenever this server changed it itself (it admitted a
/// joining server, declared one dead, refuted its own death), at most once per
/// [`GOSSIP_GAP`]: the joins of a job's start go out in a few pushes, not one each.
fn gossip_loop(node: &Node, requests: mpsc::Receiver<()>) {
    while requests.recv().is_ok() {
        while requests.try_recv().is_ok() {}
        if node.shutdown.is_requested() {
            return;
        }
        node.push_members_to_all();
        if node.shutdown.wait(GOSSIP_GAP) {
            return;
        }
    }
}

/// The shortest time between two pushes of a server's member list to everyone.
const GOSSIP_GAP: Duration = Duration::from_millis(20);

/// One exchange of member lists with another server, each heartbeat, with each in turn
/// (`turn` counts them; the next server after this one in ring order first): what a lost
/// push left out is mended within a few heartbeats, as epidemics spread — each exchange
/// tells the other what we know and, in its answer, us what it knows. Lists that agree are
/// compared by their digests only ([`Node::exchange_members_with`]).
pub(crate) fn exchange_members(node: &Node, turn: &mut usize, timeout: Duration) {
    let peer = {
        let membership = node.membership();
        let ring: Vec<&Member> = membership.ring_order().collect();
        let Some(own) = ring.iter().position(|member| member.name == node.name) else { return };
        let others: Vec<&Member> = (1..ring.len()).map(|step| ring[(own + step) % ring.len()]).filter(|member| member.alive).collect();
        if others.is_empty() {
            return;
        }
        let peer = others[*turn % others.len()].clone();
        *turn = turn.wrapping_add(1);
        peer
    };
    if let Err(errno) = node.exchange_members_with(&peer, Some(Instant::now() + timeout)) {
        log::debug!("no exchange of member lists with {}: {errno}", peer.name);
    }
}

/// Probes the members this server considers dead, every `interval`. One that answers was
/// declared dead wrongly (it was paused, or cut off for a while): it is sent our member list,
/// in which it reads that it was declared dead; it refutes that by raising its incarnation and
/// gossips its return, so every server and then every client sees it alive again.
///
/// With `discover`, servers it names that our list lacks or believes dead are joined through
/// their current address. Each round also exchanges member lists with one other server
/// ([`exchange_members`]); the opens of clients gone for longer than `open_grace` end here
/// too, and orphan chunks are reclaimed.
fn revive_members(
    node: &Node,
    dispatcher: &Dispatcher,
    interval: Duration,
    discover: Option<&Discover>,
    open_grace: Duration,
    mut reclaimer: reclaim::Reclaimer,
) {
    let mut exchange_turn = 0;
    while !node.shutdown.wait(interval) {
        let dead: Vec<Member> =
            node.membership().list().members.iter().filter(|member| !member.alive && member.name != node.name).cloned().collect();
        for member in dead {
            if node.shutdown.is_requested() {
                return;
            }
            if !node.ping(&member, interval.max(Duration::from_millis(100))) {
                continue;
            }
            log::info!("server {} answers again; telling it that it was declared dead", member.name);
            if let Err(errno) = node.push_members_to(&member, None) {
                log::info!("server {} answered a ping but not the member list: {errno}", member.name);
            }
        }
        if let Some(discover) = discover {
            join_discovered(node, discover, interval.max(Duration::from_millis(100)));
        }
        exchange_members(node, &mut exchange_turn, interval.max(Duration::from_millis(100)));
        // Files opened by clients that are gone (crashed, or cut off for too long).
        dispatcher.files.expire_opens(open_grace);
        // Chunks of files that no longer exist.
        reclaimer.step(node);
        // Name locks whose release was lost in a fault.
        dispatcher.names.retry_releases();
        // Names a directory rename moved that have not reached their new servers yet (also
        // of renames whose end never came).
        dispatcher.trees.end_lapsed_moves();
        dispatcher.trees.send_undelivered();
        // Name locks of renames whose server died and is back as a new process.
        dispatcher.names.release_locks_of_restarted_servers();
        // Truncations a server that did not answer (or this one's crash) cut short.
        dispatcher.files.finish_cuts();
    }
}

/// Joins the discovered servers our member list lacks or believes dead (see
/// [`ServerConfig::discover`]).
fn join_discovered(node: &Node, discover: &Discover, timeout: Duration) {
    let wanted = |name: &str| name != node.name && node.membership().member(name).is_none_or(|known| !known.alive);
    for (name, address) in (discover.0)(&wanted) {
        let stale = match node.membership().member(&name) {
            _ if name == node.name => false,
            Some(known) => !known.alive || known.tcp_address != address,
            None => true,
        };
        if !stale {
            continue;
        }
        let Ok(endpoint) = Endpoint::parse(&address) else { continue };
        let own = match node.membership().member(&node.name) {
            Some(own) => own.clone(),
            None => continue,
        };
        let config = ConnectionConfig { timeout, ..node.connection_config.clone() };
        let reply = Connection::open(&endpoint, &config).and_then(|connection| connection.call(&Request::Join(own), &[]));
        if let Ok(Response::Members(list)) = reply.map(|reply| reply.response) {
            log::info!("joined server {name} at {address}");
            node.membership_mut().merge(&list, &node.name);
            node.spread_members();
        }
    }
}
