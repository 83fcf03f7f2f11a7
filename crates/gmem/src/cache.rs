//! A rank's cache of global blocks, kept coherent with every other rank's by the blocks'
//! homes (MOESI with a Forward state; the rules are `ringfs_proto::coherence`, the homes'
//! side `crates/server/src/gmem/directory.rs`).
//!
//! **One process, one cache.** Each rank process keeps its own cache (ranks of one node do
//! not share one: that would need shared memory between processes and buys little when a
//! node runs one rank, as the seed's runs did).
//!
//! **All state in one place.** Every frame — a block's state, bytes, and what is under way
//! for it — lives in one table behind one lock, and the lock is never held across a message:
//! - a *miss* marks its frame `Requesting` (later accesses of the block wait for it: misses
//!   coalesce), asks the home (`CoGet`) without the lock, and installs the grant (the bytes
//!   from the home's answer, or from the `CoFill` another rank sent before the grant, or its
//!   own) — the access that missed runs on the frame in the same critical section as the
//!   install, so a home's next request for the block always sees it done;
//! - room is made before a request, never while one is under way: a victim chosen by CLOCK is
//!   marked `Evicting`, its notice (`CoPut`, with the bytes if dirty) goes to its home, and
//!   the frame stays until the home has it, so that a home asking about the block meanwhile
//!   is answered from it;
//! - the *endpoint* (an RPC server in the rank process) answers homes and other ranks:
//!   `CoForward` (send the copy to a requester with `CoFill`, then keep the state the
//!   protocol says), `CoInvalidate` (drop or downgrade, sending dirty bytes back), `CoFill`
//!   (the bytes of a block this rank requested, taken only for the request they name, and
//!   passed on to the ranks the fill lists: a *relayed* batch of reads). A home's request
//!   names the state its directory records for this rank; if this rank's own grant for the
//!   block is still on its way (the state differs and a request is under way), the endpoint
//!   waits for the install. A grant saying the bytes come by `CoFill` may come before them
//!   (relayed copies travel after the home's transaction): the install waits for them.
//!
//! Accesses of blocks through the cache are atomic per block, as uncached ones are at the
//! home.

use ringfs_sync::{Condvar, Mutex, MutexGuard};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ringfs_proto::coherence::{CacheState, on_forward, on_invalidate, relay_tree};
use ringfs_proto::gmem::{ArrayLayout, CacheMode, CoFill, CoForward, CoGet, CoGrant, CoInvalidate, CoPut, RelayTarget};
use ringfs_proto::{Errno, Hello, HelloReply, PROTOCOL_VERSION, Request, Response};
use ringfs_rpc::throttle::{self, DeviceModel, Throttle};
use ringfs_rpc::transport::{Listener, PeerIdentity};
use ringfs_rpc::{Connection, ConnectionConfig, Endpoint, RpcServer, Service, ThreadGroup};

use crate::Result;
use crate::layout::home_index;
use ringfs_config::env;

/// How a rank caches (from the environment: [`CacheConfig::from_env`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Bytes of blocks the cache holds; 0: no cache (every access goes to the home).
    pub bytes: u64,
    /// A rank holding a copy serves the next reader (else only homes serve data).
    pub cooperative: bool,
    /// Blocks fetched ahead of a sequential run of misses.
    pub prefetch: u32,
    /// Cooperative, and reads of a block that queue at its home are answered together, the
    /// readers relaying the copy to each other (`CacheMode::Relayed`).
    pub relay: bool,
    /// This rank's network link, emulated (the bytes it sends other ranks).
    pub network: Option<DeviceModel>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig { bytes: 0, cooperative: true, prefetch: 2, relay: false, network: None }
    }
}

impl CacheConfig {
    /// `RINGFS_GMEM_CACHE` (bytes, with K/M/G; default 0: no cache), `RINGFS_GMEM_COOP` (0 to
    /// switch cooperation off), `RINGFS_GMEM_RELAY` (1 to relay batches of reads, with
    /// cooperation), `RINGFS_GMEM_PREFETCH` (blocks, default 2),
    /// `RINGFS_GMEM_NET_MBPS` and `RINGFS_GMEM_NET_LATENCY_US` (the emulated link).
    pub fn from_env() -> Result<CacheConfig> {
        let var = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
        let mut config = CacheConfig::default();
        if let Some(text) = var(env::GMEM_CACHE) {
            config.bytes = text.parse::<ringfs_config::ByteSize>().map(|size| size.bytes()).map_err(|error| {
                log::error!("global memory: {}: {error}", env::GMEM_CACHE);
                Errno::EINVAL
            })?;
        }
        let off = |text: &str| matches!(text, "0" | "off" | "false" | "no");
        if let Some(text) = var(env::GMEM_COOP) {
            config.cooperative = !off(&text);
        }
        if let Some(text) = var(env::GMEM_RELAY) {
            config.relay = !off(&text);
        }
        let number = |name: &str| -> Result<Option<u64>> {
            var(name)
                .map(|text| {
                    text.parse::<u64>().map_err(|_| {
                        log::error!("global memory: {name}={text:?} is not a number");
                        Errno::EINVAL
                    })
                })
                .transpose()
        };
        if let Some(depth) = number(env::GMEM_PREFETCH)? {
            config.prefetch = depth.min(64) as u32;
        }
        let mbps = number(env::GMEM_NET_MBPS)?.unwrap_or(0);
        let latency = number(env::GMEM_NET_LATENCY_US)?.unwrap_or(0);
        if mbps > 0 || latency > 0 {
            config.network = Some(DeviceModel { bytes_per_second: mbps * 1_000_000, latency: Duration::from_micros(latency) });
        }
        Ok(config)
    }

    /// The mode arrays are allocated with.
    pub fn mode(&self) -> CacheMode {
        match (self.bytes, self.cooperative, self.relay) {
            (0, _, _) => CacheMode::Uncached,
            (_, true, true) => CacheMode::Relayed,
            (_, true, false) => CacheMode::Cooperative,
            (_, false, _) => CacheMode::HomeServed,
        }
    }
}

/// What a rank's cache did (all since it started).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Bytes of blocks that came from their homes, and from other ranks' caches.
    pub bytes_from_homes: u64,
    pub bytes_from_peers: u64,
    /// Bytes this rank sent other ranks (forwarded and relayed copies).
    pub bytes_to_peers: u64,
    /// Copies this rank passed on from a relay list (relayed batches of reads).
    pub relayed_copies: u64,
    /// Dirty blocks written back to their homes (evicted or recalled), and bytes.
    pub write_backs: u64,
    pub bytes_written_back: u64,
    pub evictions: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    bytes_from_homes: AtomicU64,
    bytes_from_peers: AtomicU64,
    bytes_to_peers: AtomicU64,
    relayed_copies: AtomicU64,
    write_backs: AtomicU64,
    bytes_written_back: AtomicU64,
    evictions: AtomicU64,
}

fn add(counter: &AtomicU64, value: u64) {
    counter.fetch_add(value, Ordering::Relaxed);
}

/// A block of an array.
type BlockKey = (u64, u64);

/// What is under way for a frame.
#[derive(Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    /// The `CoGet` numbered `request` is at the home; `fill` holds the bytes another rank
    /// (or the home) sent for it.
    Requesting {
        request: u64,
        fill: Option<Vec<u8>>,
    },
    /// Its `CoPut` is at the home.
    Evicting,
}

struct Frame {
    state: CacheState,
    data: Vec<u8>,
    phase: Phase,
    /// CLOCK's reference bit.
    referenced: bool,
    /// Tells this frame's CLOCK entry from a stale one of an earlier frame of the block.
    generation: u64,
}

#[derive(Default)]
struct Table {
    frames: HashMap<BlockKey, Frame>,
    /// CLOCK's ring: frames in insertion order (stale entries are skipped).
    clock: VecDeque<(BlockKey, u64)>,
    used: u64,
    generations: u64,
    /// The last block of each array accessed, for sequential prefetch.
    last_access: HashMap<u64, u64>,
    /// Layouts of the cached arrays (the endpoint finds requesters' endpoints in them).
    layouts: HashMap<u64, Arc<ArrayLayout>>,
}

impl Table {
    /// A frame CLOCK would evict (valid, nothing under way), marked `Evicting`.
    fn choose_victim(&mut self) -> Option<BlockKey> {
        for _ in 0..2 * self.clock.len() + 1 {
            let (key, generation) = self.clock.pop_front()?;
            let Some(frame) = self.frames.get_mut(&key).filter(|frame| frame.generation == generation) else {
                continue;
            };
            if frame.phase != Phase::Idle || frame.referenced {
                frame.referenced = false;
                self.clock.push_back((key, generation));
                continue;
            }
            frame.phase = Phase::Evicting;
            return Some(key);
        }
        None
    }

    fn insert(&mut self, key: BlockKey, block_size: usize, request: u64) -> &mut Frame {
        self.generations += 1;
        let generation = self.generations;
        self.clock.push_back((key, generation));
        self.used += block_size as u64;
        self.frames.entry(key).or_insert(Frame {
            state: CacheState::Invalid,
            data: vec![0; block_size],
            phase: Phase::Requesting { request, fill: None },
            referenced: true,
            generation,
        })
    }

    fn remove(&mut self, key: BlockKey) {
        if let Some(frame) = self.frames.remove(&key) {
            self.used -= frame.data.len() as u64;
        }
    }
}

/// The part of the cache the endpoint's threads share with the rank's.
struct Shared {
    rank: u32,
    capacity: u64,
    secret: Vec<u8>,
    table: Mutex<Table>,
    /// Woken when a frame's phase or state changes.
    changed: Condvar,
    network: Option<Throttle>,
    /// Connections to other ranks' endpoints (to send `CoFill`).
    peers: Mutex<HashMap<String, Arc<Connection>>>,
    peer_config: ConnectionConfig,
    counters: Counters,
    /// The last request number used (`CoGet::request`).
    requests: AtomicU64,
    /// Threads passing copies on to other ranks (see [`Shared::fill`]).
    relays: Arc<ThreadGroup>,
}

/// Sends a request to the server of that name; its answer.
pub(crate) type SendFn<'a> = dyn Fn(&str, &Request, &[u8]) -> Result<ringfs_rpc::Reply> + Sync + 'a;

/// How an access uses a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Use {
    Read,
    /// Writes part of the block (needs its bytes).
    Write,
    /// Overwrites the whole block (needs ownership, not bytes).
    Overwrite,
}

/// A rank's block cache and its endpoint.
pub(crate) struct BlockCache {
    shared: Arc<Shared>,
    endpoint: String,
    server: RpcServer,
    pub config: CacheConfig,
}

/// How long a cache being dropped waits for the copies it is passing on to other ranks.
const RELAY_WAIT: Duration = Duration::from_secs(10);

impl Drop for BlockCache {
    /// Stops the endpoint and waits for its threads, then for the relays under way: a rank
    /// that exits must leave no thread of its cache inside UCX (or anywhere) while `exit`
    /// runs the libraries' destructors.
    fn drop(&mut self) {
        if !self.server.shutdown_and_wait(ringfs_rpc::SHUTDOWN_WAIT) {
            log::warn!("global memory: the cache's endpoint still had threads running after it stopped");
        }
        if !self.shared.relays.wait_ended(RELAY_WAIT) {
            log::warn!("global memory: {} relays of copies still running as the cache goes", self.shared.relays.running());
        }
    }
}

impl BlockCache {
    /// A cache of `config.bytes` for rank `rank`, its endpoint listening on the address this
    /// host reaches `server_address` from, over the servers' transport (or
    /// `RINGFS_GMEM_LISTEN`).
    pub fn start(config: CacheConfig, rank: u32, peer_config: ConnectionConfig, server_address: &str) -> Result<BlockCache> {
        let listen = match std::env::var(env::GMEM_LISTEN) {
            Ok(address) if !address.is_empty() => address,
            // The transport the servers use (`ucx://` for UCX), on the address towards them.
            _ => match server_address.strip_prefix("ucx://") {
                Some(address) => format!("ucx://{}:0", address_towards(address)),
                None => format!("{}:0", address_towards(server_address)),
            },
        };
        let endpoint = Endpoint::parse(&listen).map_err(|error| {
            log::error!("global memory: RINGFS_GMEM_LISTEN: {error}");
            Errno::EINVAL
        })?;
        let listener = Listener::bind(&endpoint).map_err(|error| {
            log::error!("global memory: the cache cannot listen on {listen}: {error}");
            Errno::EIO
        })?;
        let endpoint = listener.local_endpoint().map_err(|_| Errno::EIO)?.to_string();
        let shared = Arc::new(Shared {
            rank,
            capacity: config.bytes,
            secret: peer_config.secret.clone(),
            table: Mutex::new(Table::default()),
            changed: Condvar::new(),
            network: config.network.map(Throttle::new),
            peers: Mutex::new(HashMap::new()),
            peer_config,
            counters: Counters::default(),
            requests: AtomicU64::new(0),
            relays: Arc::new(ThreadGroup::default()),
        });
        let server = RpcServer::start(Arc::new(EndpointService(shared.clone())), vec![listener], Duration::ZERO).map_err(|error| {
            log::error!("global memory: the cache's endpoint did not start: {error}");
            Errno::EIO
        })?;
        Ok(BlockCache { shared, endpoint, server, config })
    }

    /// Where other ranks and homes reach this cache.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn stats(&self) -> CacheStats {
        let counters = &self.shared.counters;
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        CacheStats {
            hits: get(&counters.hits),
            misses: get(&counters.misses),
            bytes_from_homes: get(&counters.bytes_from_homes),
            bytes_from_peers: get(&counters.bytes_from_peers),
            bytes_to_peers: get(&counters.bytes_to_peers),
            relayed_copies: get(&counters.relayed_copies),
            write_backs: get(&counters.write_backs),
            bytes_written_back: get(&counters.bytes_written_back),
            evictions: get(&counters.evictions),
        }
    }

    pub fn add_array(&self, layout: Arc<ArrayLayout>) {
        self.shared.table.lock().layouts.insert(layout.array, layout);
    }

    /// An array was freed: its frames go (no write-back: its bytes are gone everywhere).
    pub fn drop_array(&self, array: u64) {
        let mut table = self.shared.table.lock();
        table.layouts.remove(&array);
        let keys: Vec<BlockKey> =
            table.frames.iter().filter(|(key, frame)| key.0 == array && frame.phase == Phase::Idle).map(|(key, _)| *key).collect();
        for key in keys {
            table.remove(key);
        }
        table.last_access.remove(&array);
        self.shared.changed.notify_all();
    }

    /// Notes an access of `block` of `layout`'s array; if it continues a sequential run, the
    /// next blocks (up to the prefetch depth) neither cached nor on their way, to fetch ahead.
    /// Only a cache of some blocks fetches ahead (it must not push out what is in use).
    pub fn prefetch_after(&self, layout: &ArrayLayout, block: u64) -> Vec<u64> {
        let depth = prefetch_depth(self.config.prefetch, self.shared.capacity, layout.block_size);
        let mut table = self.shared.table.lock();
        let previous = table.last_access.insert(layout.array, block);
        if depth == 0 || previous.is_none_or(|previous| previous + 1 != block) {
            return Vec::new();
        }
        let end = (block + 1 + depth).min(layout.len.div_ceil(u64::from(layout.block_size)));
        (block + 1..end).filter(|ahead| !table.frames.contains_key(&(layout.array, *ahead))).collect()
    }

    /// Which of `blocks` are neither cached nor on their way — none if they would take more
    /// than half the cache.
    pub fn missing(&self, layout: &ArrayLayout, blocks: &[u64]) -> Vec<u64> {
        if blocks.len() as u64 * u64::from(layout.block_size) > self.shared.capacity / 2 {
            return Vec::new();
        }
        let table = self.shared.table.lock();
        blocks.iter().copied().filter(|block| !table.frames.contains_key(&(layout.array, *block))).collect()
    }

    /// Runs `op` on block `block` of the array once this cache holds it in a state allowing
    /// `usage`: at once on a hit, else after a request to its home (`send` sends a request
    /// to a named server). True if it missed.
    pub fn access(&self, layout: &ArrayLayout, block: u64, usage: Use, send: &SendFn<'_>, op: &mut dyn FnMut(&mut [u8])) -> Result<bool> {
        let shared = &self.shared;
        let key = (layout.array, block);
        let block_size = layout.block_size as usize;
        let writes = usage != Use::Read;
        // Set at the first wait: a hit reads no clock.
        let mut deadline = None;
        let request = shared.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let mut table = shared.table.lock();
        loop {
            let over = table.used + block_size as u64 > shared.capacity;
            match table.frames.get_mut(&key) {
                Some(frame) if frame.phase == Phase::Idle && frame.state.is_valid() && (!writes || frame.state.is_writable()) => {
                    if writes {
                        frame.state = CacheState::Modified;
                    }
                    frame.referenced = true;
                    op(&mut frame.data);
                    add(&shared.counters.hits, 1);
                    return Ok(false);
                }
                Some(frame) if frame.phase == Phase::Idle => {
                    // Present but not enough (an upgrade, or an invalidated copy kept as I).
                    frame.phase = Phase::Requesting { request, fill: None };
                    break;
                }
                Some(_) => table = wait(&shared.changed, table, &mut deadline, shared.peer_config.timeout)?,
                None if over => match table.choose_victim() {
                    Some(victim) => {
                        drop(table);
                        self.evict(victim, send);
                        table = shared.table.lock();
                    }
                    None => table = wait(&shared.changed, table, &mut deadline, shared.peer_config.timeout)?,
                },
                None => {
                    table.insert(key, block_size, request);
                    break;
                }
            }
        }
        drop(table);
        add(&shared.counters.misses, 1);
        let get = CoGet { array: layout.array, block, rank: shared.rank, exclusive: writes, full_write: usage == Use::Overwrite, request };
        let answer = send(&layout.homes[home_index(layout, block)], &Request::CoGet(get), &[]);
        let mut table = shared.table.lock();
        let mut installed = match answer {
            Ok(reply) => match reply.response {
                Response::CoGrant(grant) => Ok((grant, reply.data)),
                _ => Err(Errno::EPROTO),
            },
            Err(errno) => Err(errno),
        };
        if let Ok((grant, _)) = &installed
            && matches!(grant.source, 1 | 4)
        {
            // A relayed copy may come after the grant.
            while let Some(Phase::Requesting { fill: None, .. }) = table.frames.get(&key).map(|frame| &frame.phase) {
                match wait(&shared.changed, table, &mut deadline, shared.peer_config.timeout) {
                    Ok(guard) => table = guard,
                    Err(errno) => {
                        installed = Err(errno);
                        table = shared.table.lock();
                        break;
                    }
                }
            }
        }
        let frame = table.frames.get_mut(&key).ok_or(Errno::ESTALE)?;
        let installed = installed.and_then(|(grant, data)| install(shared, frame, grant, data));
        let outcome = match installed {
            Ok(()) => {
                op(&mut frame.data);
                if !table.layouts.contains_key(&layout.array) {
                    // The array was freed while the block was on its way.
                    table.remove(key);
                }
                Ok(true)
            }
            Err(errno) => {
                frame.phase = Phase::Idle;
                if !frame.state.is_valid() {
                    table.remove(key);
                }
                Err(errno)
            }
        };
        shared.changed.notify_all();
        outcome
    }

    /// Writes every dirty block back to its home and empties the cache (blocks another
    /// thread is fetching stay).
    pub fn flush(&self, send: &SendFn<'_>) {
        loop {
            let victim = {
                let mut table = self.shared.table.lock();
                let key = table.frames.iter().find(|(_, frame)| frame.phase == Phase::Idle).map(|(key, _)| *key);
                if let Some(key) = key {
                    table.frames.get_mut(&key).expect("found").phase = Phase::Evicting;
                }
                key
            };
            match victim {
                Some(key) => self.evict(key, send),
                None => return,
            }
        }
    }

    /// Sends frame `key` (marked `Evicting`) home, then drops it.
    fn evict(&self, key: BlockKey, send: &SendFn<'_>) {
        let shared = &self.shared;
        let (dirty, data, home) = {
            let table = shared.table.lock();
            let frame = &table.frames[&key];
            let home = table.layouts.get(&key.0).map(|layout| layout.homes[home_index(layout, key.1)].clone());
            let dirty = frame.state.is_dirty();
            (dirty, if dirty { frame.data.clone() } else { Vec::new() }, home)
        };
        add(&shared.counters.evictions, 1);
        if dirty {
            add(&shared.counters.write_backs, 1);
            add(&shared.counters.bytes_written_back, data.len() as u64);
        }
        if let Some(home) = home {
            let put = Request::CoPut(CoPut { array: key.0, block: key.1, rank: shared.rank, dirty });
            throttle::pass(shared.network.as_ref(), data.len() as u64);
            if let Err(errno) = send(&home, &put, &data) {
                log::warn!("global memory: the eviction notice of block {} of array {:x} failed: {errno}", key.1, key.0);
            }
        }
        let mut table = shared.table.lock();
        table.remove(key);
        shared.changed.notify_all();
    }
}

/// Puts a grant in its frame (requesting): the bytes from the home, from the fill another
/// rank sent, or the frame's own.
fn install(shared: &Shared, frame: &mut Frame, grant: CoGrant, data: Vec<u8>) -> Result<()> {
    let state = CacheState::from_code(grant.state).filter(|state| state.is_valid()).ok_or(Errno::EPROTO)?;
    let fill = match &mut frame.phase {
        Phase::Requesting { fill, .. } => fill.take(),
        _ => return Err(Errno::EPROTO),
    };
    match grant.source {
        0 if data.len() == frame.data.len() => {
            add(&shared.counters.bytes_from_homes, data.len() as u64);
            frame.data = data;
        }
        1 | 4 => match fill {
            Some(bytes) if bytes.len() == frame.data.len() => {
                let counter = if grant.source == 4 { &shared.counters.bytes_from_homes } else { &shared.counters.bytes_from_peers };
                add(counter, bytes.len() as u64);
                frame.data = bytes;
            }
            _ => {
                log::error!("global memory: a grant said another rank sent the block, and none came");
                return Err(Errno::EIO);
            }
        },
        2 if frame.state.is_valid() => {}
        3 => {}
        _ => return Err(Errno::EPROTO),
    }
    frame.state = state;
    frame.phase = Phase::Idle;
    frame.referenced = true;
    Ok(())
}

/// Waits for a change, up to `deadline` (set `timeout` from now by the first wait; then EIO:
/// something that should have come did not).
fn wait<'a>(
    changed: &Condvar,
    mut table: MutexGuard<'a, Table>,
    deadline: &mut Option<Instant>,
    timeout: Duration,
) -> Result<MutexGuard<'a, Table>> {
    let deadline = *deadline.get_or_insert_with(|| Instant::now() + timeout);
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        log::warn!("global memory: a block's request or eviction did not complete in time");
        return Err(Errno::EIO);
    }
    changed.wait_for(&mut table, left);
    Ok(table)
}

/// The IP address this host uses to reach `address` (`host:port`), for the endpoint to listen
/// on; loopback when unknown.
fn address_towards(address: &str) -> IpAddr {
    let local = || -> Option<IpAddr> {
        let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
        socket.connect(address).ok()?;
        Some(socket.local_addr().ok()?.ip())
    };
    local().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// The endpoint: answers homes' steps and other ranks' fills.
struct EndpointService(Arc<Shared>);

impl Service for EndpointService {
    type Session = ();

    fn hello(&self, hello: &Hello, _peer: &PeerIdentity, _session: &mut ()) -> std::result::Result<HelloReply, Errno> {
        if hello.version != PROTOCOL_VERSION {
            return Err(Errno::EPROTO);
        }
        let secret = &self.0.secret;
        let same = hello.secret.len() == secret.len() && hello.secret.iter().zip(secret).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
        if !same {
            return Err(Errno::EACCES);
        }
        Ok(HelloReply { version: PROTOCOL_VERSION, server_name: format!("rank-{}", self.0.rank), memory_access: false, memory_probe: None })
    }

    fn handle(&self, _session: &mut (), request: Request, data: &[u8], reply_data: &mut Vec<u8>) -> Response {
        let outcome = match request {
            Request::CoForward(forward) => self.0.forward(forward),
            Request::CoInvalidate(invalidate) => self.0.invalidate(invalidate, reply_data),
            Request::CoFill(fill) => Shared::fill(&self.0, fill, data),
            _ => Err(Errno::EPROTO),
        };
        outcome.unwrap_or_else(Response::Error)
    }

    fn epoch(&self) -> u64 {
        0
    }
}

impl Shared {
    /// The frame of `key` once it is in the state the home expects, or no request of this
    /// rank is under way for it (then the home's view and this rank's agree already; a
    /// difference is a protocol error, answered with what is here).
    fn settled(&self, key: BlockKey, expected: u8) -> MutexGuard<'_, Table> {
        let expected = CacheState::from_code(expected).unwrap_or(CacheState::Invalid);
        let deadline = Instant::now() + self.peer_config.timeout;
        let mut table = self.table.lock();
        loop {
            let waiting = match table.frames.get(&key) {
                Some(frame) => matches!(frame.phase, Phase::Requesting { .. }) && !agrees(frame.state, expected),
                None => false,
            };
            if !waiting {
                return table;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                log::warn!("global memory: a home asked about block {} of array {:x} and this rank's grant never came", key.1, key.0);
                return table;
            }
            self.changed.wait_for(&mut table, left);
        }
    }

    fn forward(&self, forward: CoForward) -> Result<Response> {
        let key = (forward.array, forward.block);
        let (had, bytes, requester) = {
            let mut table = self.settled(key, forward.expected);
            let requester = table.layouts.get(&forward.array).and_then(|layout| layout.nodes.get(forward.requester as usize).cloned());
            let Some(frame) = table.frames.get_mut(&key).filter(|frame| frame.state.is_valid()) else {
                return Ok(Response::Count(CacheState::Invalid.code().into()));
            };
            let had = frame.state;
            frame.state = on_forward(had, forward.exclusive).unwrap_or(CacheState::Invalid);
            let bytes = frame.data.clone();
            if frame.state == CacheState::Invalid && frame.phase == Phase::Idle {
                // Ownership went to the requester: the frame is free again.
                table.remove(key);
            }
            self.changed.notify_all();
            (had, bytes, requester)
        };
        // The copy's state changed already, so the home hears what it had even when the
        // copy cannot be sent: answering with an error would make the home forget a copy
        // that is still here (a later write would not invalidate it). The requester, left
        // without its bytes, gives up after its timeout (EIO, never other bytes).
        let fill = CoFill { array: forward.array, block: forward.block, request: forward.request, relay: forward.relay };
        let sent = requester.ok_or(Errno::ESTALE).and_then(|requester| self.send_fill(&requester, fill, &bytes));
        if let Err(errno) = sent {
            log::warn!("global memory: block {} could not be forwarded to rank {}: {errno}", forward.block, forward.requester);
        }
        Ok(Response::Count(had.code().into()))
    }

    fn invalidate(&self, invalidate: CoInvalidate, reply_data: &mut Vec<u8>) -> Result<Response> {
        let key = (invalidate.array, invalidate.block);
        let mut table = self.settled(key, invalidate.expected);
        let Some(frame) = table.frames.get_mut(&key).filter(|frame| frame.state.is_valid()) else {
            return Ok(Response::Count(CacheState::Invalid.code().into()));
        };
        let had = frame.state;
        let (kept, sends) = on_invalidate(had, invalidate.write_back, invalidate.keep_shared);
        frame.state = kept;
        if sends {
            reply_data.extend_from_slice(&frame.data);
            add(&self.counters.write_backs, 1);
            add(&self.counters.bytes_written_back, frame.data.len() as u64);
        }
        if kept == CacheState::Invalid && frame.phase == Phase::Idle {
            table.remove(key);
        }
        self.changed.notify_all();
        drop(table);
        if sends {
            throttle::pass(self.network.as_ref(), reply_data.len() as u64);
        }
        Ok(Response::Count(had.code().into()))
    }

    /// A copy for this rank's request `fill.request`: kept for the install, then passed on
    /// to the ranks `fill.relay` lists (by another thread: an endpoint never waits for other
    /// ranks while it answers).
    fn fill(shared: &Arc<Shared>, fill: CoFill, data: &[u8]) -> Result<Response> {
        {
            let mut table = shared.table.lock();
            match table.frames.get_mut(&(fill.array, fill.block)).map(|frame| &mut frame.phase) {
                Some(Phase::Requesting { request, fill: slot }) if *request == fill.request => {
                    *slot = Some(data.to_vec());
                    shared.changed.notify_all();
                }
                _ => {
                    log::warn!(
                        "global memory: a fill of block {} of array {:x} for request {}, which is not under way",
                        fill.block,
                        fill.array,
                        fill.request
                    );
                    return Err(Errno::EPROTO);
                }
            }
        }
        if !fill.relay.is_empty() {
            let (relayer, bytes) = (shared.clone(), data.to_vec());
            let spawned = shared.relays.spawn("ringfs-relay", None, move || relayer.relay(fill.array, fill.block, fill.relay, &bytes));
            if let Err(error) = spawned {
                log::error!("global memory: cannot start a thread to relay a block: {error}");
            }
        }
        Ok(Response::Done)
    }

    /// Passes a block's copy on to the ranks of `list` in the binomial tree of
    /// `relay_tree`. A rank that does not take its copy (gone, or its request no longer
    /// under way) is skipped: its part of the list is served from here.
    fn relay(&self, array: u64, block: u64, list: Vec<RelayTarget>, bytes: &[u8]) {
        let mut lists = vec![list];
        while let Some(list) = lists.pop() {
            for (child, theirs) in relay_tree(list) {
                let endpoint = self.table.lock().layouts.get(&array).and_then(|layout| layout.nodes.get(child.rank as usize).cloned());
                let Some(endpoint) = endpoint else {
                    // The array was freed meanwhile: nobody needs the copies.
                    return;
                };
                let fill = CoFill { array, block, request: child.request, relay: theirs.clone() };
                match self.send_fill(&endpoint, fill, bytes) {
                    Ok(()) => add(&self.counters.relayed_copies, 1),
                    Err(errno) => {
                        log::warn!("global memory: rank {} did not take a relayed copy of block {block}: {errno}", child.rank);
                        lists.push(theirs);
                    }
                }
            }
        }
    }

    /// Sends a copy through this rank's link.
    fn send_fill(&self, endpoint: &str, fill: CoFill, bytes: &[u8]) -> Result<()> {
        throttle::pass(self.network.as_ref(), bytes.len() as u64);
        self.peer(endpoint)?.call(&Request::CoFill(fill), bytes).map_err(|error| error.errno())?;
        add(&self.counters.bytes_to_peers, bytes.len() as u64);
        Ok(())
    }

    /// A connection to another rank's endpoint.
    fn peer(&self, endpoint: &str) -> Result<Arc<Connection>> {
        let mut peers = self.peers.lock();
        if let Some(connection) = peers.get(endpoint)
            && !connection.is_broken()
        {
            return Ok(connection.clone());
        }
        let parsed = Endpoint::parse(endpoint).map_err(|_| Errno::EINVAL)?;
        let connection = Arc::new(Connection::open(&parsed, &self.peer_config).map_err(|error| error.errno())?);
        peers.insert(endpoint.to_string(), connection.clone());
        Ok(connection)
    }
}

/// How many blocks ahead a sequential reader fetches: the configured depth, as far as a cache
/// of `capacity` bytes holds four times the blocks read and in flight (a fetch ahead must not
/// push out what is in use). A depth the cache cannot hold is lowered, not dropped.
fn prefetch_depth(configured: u32, capacity: u64, block_size: u32) -> u64 {
    let room = capacity / (4 * u64::from(block_size.max(1)));
    u64::from(configured).min(room.saturating_sub(1))
}

/// The directory's record (E standing for E or M) agrees with this rank's state.
fn agrees(actual: CacheState, recorded: CacheState) -> bool {
    actual == recorded || (recorded == CacheState::Exclusive && actual == CacheState::Modified)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_goes_as_deep_as_configured_while_the_cache_holds_four_times_that() {
        const BLOCK: u32 = 256 << 10;
        // A 4 MiB cache holds 16 blocks: up to 3 ahead (4 × (3 + 1) blocks).
        assert_eq!(prefetch_depth(2, 4 << 20, BLOCK), 2);
        assert_eq!(prefetch_depth(3, 4 << 20, BLOCK), 3);
        // Deeper than the cache allows: lowered to what it holds, not switched off.
        assert_eq!(prefetch_depth(8, 4 << 20, BLOCK), 3);
        assert_eq!(prefetch_depth(8, 64 << 20, BLOCK), 8);
        // Too small a cache, or no prefetch asked: none.
        assert_eq!(prefetch_depth(2, 1 << 20, BLOCK), 0);
        assert_eq!(prefetch_depth(0, 64 << 20, BLOCK), 0);
    }

    #[test]
    fn clock_gives_referenced_frames_a_second_chance_and_skips_busy_ones() {
        let mut table = Table::default();
        for block in 0..3 {
            let frame = table.insert((1, block), 8, block);
            frame.phase = Phase::Idle;
            frame.state = CacheState::Shared;
        }
        table.frames.get_mut(&(1, 0)).unwrap().referenced = true;
        table.frames.get_mut(&(1, 1)).unwrap().referenced = false;
        table.frames.get_mut(&(1, 2)).unwrap().referenced = false;
        table.frames.get_mut(&(1, 1)).unwrap().phase = Phase::Requesting { request: 1, fill: None };
        assert_eq!(table.choose_victim(), Some((1, 2)), "0 is referenced, 1 is busy");
        assert_eq!(table.choose_victim(), Some((1, 0)), "0 had its second chance");
        assert_eq!(table.choose_victim(), None, "only a busy frame is left");
        table.remove((1, 2));
        assert_eq!(table.used, 16);
    }
}
