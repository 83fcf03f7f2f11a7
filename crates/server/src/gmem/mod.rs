//! The global memory at a server (the server side of `crates/gmem`): the blocks it homes
//! ([`memory`]), and, for the jobs it coordinates, the collective steps — allocations
//! (which decide the homes), frees and barriers.
//!
//! Collective steps meet at the job's *coordinator* (the server the job's id picks). Each
//! rank asks; an answer that needs every rank waits up to [`LONG_POLL`] (or the request's
//! deadline) for the others, then says EAGAIN and the rank asks again — no request waits
//! past its caller's patience, and a rank that died makes the others wait without hanging
//! any thread forever. An allocation's homes: each rank's part goes to a server on the
//! rank's host (ranks of a host share its servers in turn), or to the servers in turn
//! when its host has none.

pub mod directory;
pub mod memory;

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringfs_proto::gmem::{ArrayLayout, ArrayOnly, BlockRange, CacheMode, Distribution, GmemAlloc, GmemAtomic, GmemBarrier, GmemFree};
use ringfs_proto::{Errno, Lease, ReadReply, Request, Response};
use ringfs_rpc::throttle::{self, DeviceModel, Throttle};

use crate::node::Node;
pub use memory::{Access, GlobalMemory, GlobalMemoryConfig, HomeReads, MemoryStats};

/// Longest a collective request waits for the other ranks before answering EAGAIN.
const LONG_POLL: Duration = Duration::from_millis(200);

/// Largest block of a global array.
pub const MAX_BLOCK_SIZE: u32 = 16 << 20;

/// How a server keeps global memory and emulates the hardware it runs on.
#[derive(Clone, Debug)]
pub struct GmemConfig {
    pub memory: GlobalMemoryConfig,
    /// Slow the data of global-memory requests down to this, as a node's network link
    /// would (off by default).
    pub network: Option<DeviceModel>,
}

/// A collective allocation under way at its coordinator.
struct PendingAlloc {
    first: GmemAlloc,
    hosts: BTreeMap<u32, u64>,
    /// The ranks' cache endpoints.
    endpoints: BTreeMap<u32, String>,
    layout: Option<ArrayLayout>,
    /// Ranks that received the layout: when all have, the entry goes.
    answered: BTreeSet<u32>,
}

#[derive(Default)]
struct Collectives {
    allocs: HashMap<(u64, u64), PendingAlloc>,
    /// Barriers: who arrived, and who was told everyone did.
    barriers: HashMap<(u64, u64), (BTreeSet<u32>, BTreeSet<u32>)>,
    frees: HashMap<(u64, u64), BTreeSet<u32>>,
}

/// A server's global memory.
pub struct Gmem {
    node: Arc<Node>,
    pub memory: GlobalMemory,
    /// The arrays with blocks homed here (all arrays: the coordinator defines each on every
    /// server).
    arrays: Mutex<HashMap<u64, Arc<ArrayLayout>>>,
    collectives: Mutex<Collectives>,
    /// Woken when a collective step completes.
    progress: Condvar,
    network: Option<Throttle>,
    /// Who caches which block (arrays the ranks cache).
    directory: directory::Directory,
}

impl Gmem {
    pub fn new(node: Arc<Node>, config: GmemConfig) -> Gmem {
        Gmem {
            node,
            memory: GlobalMemory::new(config.memory),
            arrays: Mutex::new(HashMap::new()),
            collectives: Mutex::new(Collectives::default()),
            progress: Condvar::new(),
            network: config.network.map(Throttle::new),
            directory: directory::Directory::default(),
        }
    }

    fn collectives(&self) -> MutexGuard<'_, Collectives> {
        self.collectives.lock()
    }

    /// The layout of `array`, if it is known here.
    pub fn layout(&self, array: u64) -> Option<Arc<ArrayLayout>> {
        self.arrays().get(&array).cloned()
    }

    fn arrays(&self) -> MutexGuard<'_, HashMap<u64, Arc<ArrayLayout>>> {
        self.arrays.lock()
    }

    /// Waits (a long poll) until `done` says the step completed; EAGAIN at the end of the
    /// poll.
    fn long_poll<T>(&self, deadline: Instant, mut done: impl FnMut(&mut Collectives) -> Option<T>) -> Result<T, Errno> {
        let mut collectives = self.collectives();
        loop {
            if let Some(outcome) = done(&mut collectives) {
                return Ok(outcome);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Errno::EAGAIN);
            }
            self.progress.wait_for(&mut collectives, deadline - now);
        }
    }

    /// The layout of `array`, and whether `range` lies inside it: ESTALE for an array not
    /// (or no longer) known, EFAULT for a range outside it.
    fn check(&self, range: &BlockRange) -> Result<(), Errno> {
        let arrays = self.arrays();
        let layout = arrays.get(&range.array).ok_or(Errno::ESTALE)?;
        let start = range.block.checked_mul(u64::from(layout.block_size)).ok_or(Errno::EFAULT)?;
        let end = start.checked_add(u64::from(range.offset) + u64::from(range.len)).ok_or(Errno::EFAULT)?;
        if range.offset.checked_add(range.len).is_none_or(|end| end > layout.block_size) || end > layout.len {
            return Err(Errno::EFAULT);
        }
        if layout.cache != CacheMode::Uncached {
            // The ranks cache it: the home's memory may be older than a cached copy, and a
            // write here would bypass the copies. Only the coherence requests reach it.
            return Err(Errno::EINVAL);
        }
        Ok(())
    }
}

/// Decides the homes of a new array: each rank's own server (see the module doc).
fn choose_homes(first: &GmemAlloc, hosts: &BTreeMap<u32, u64>, members: &[ringfs_proto::Member]) -> Vec<String> {
    let alive: Vec<&ringfs_proto::Member> = members.iter().filter(|member| member.alive).collect();
    if first.distribution == Distribution::Hashed {
        return alive.iter().map(|member| member.name.clone()).collect();
    }
    let mut taken_on_host: HashMap<u64, usize> = HashMap::new();
    hosts
        .iter()
        .map(|(rank, host)| {
            let local: Vec<&&ringfs_proto::Member> = alive.iter().filter(|member| member.host_id == *host).collect();
            if local.is_empty() {
                return alive[*rank as usize % alive.len()].name.clone();
            }
            let turn = taken_on_host.entry(*host).or_default();
            let chosen = local[*turn % local.len()].name.clone();
            *turn += 1;
            chosen
        })
        .collect()
}

impl Gmem {
    /// `GmemAlloc` at the job's coordinator.
    pub fn alloc(&self, alloc: GmemAlloc, deadline: Instant) -> Result<Response, Errno> {
        if alloc.ranks == 0 || alloc.rank >= alloc.ranks || alloc.len == 0 {
            return Err(Errno::EINVAL);
        }
        if alloc.block_size == 0 || alloc.block_size > MAX_BLOCK_SIZE || !alloc.block_size.is_power_of_two() {
            return Err(Errno::EINVAL);
        }
        if let Distribution::Cyclic(0) = alloc.distribution {
            return Err(Errno::EINVAL);
        }
        let gmem = self;
        let key = (alloc.job, alloc.sequence);
        let complete = {
            let mut collectives = gmem.collectives();
            let pending = collectives.allocs.entry(key).or_insert_with(|| PendingAlloc {
                first: alloc.clone(),
                hosts: BTreeMap::new(),
                endpoints: BTreeMap::new(),
                layout: None,
                answered: BTreeSet::new(),
            });
            let first = &pending.first;
            let shape = |alloc: &GmemAlloc| (alloc.ranks, alloc.len, alloc.block_size, alloc.distribution, alloc.cache);
            if shape(first) != shape(&alloc) || (alloc.cache != CacheMode::Uncached && alloc.endpoint.is_empty()) {
                log::warn!(
                    "global memory: rank {} of job {:x} asked for another array than rank {} did",
                    alloc.rank,
                    alloc.job,
                    first.rank
                );
                return Err(Errno::EINVAL);
            }
            pending.hosts.insert(alloc.rank, alloc.host_id);
            pending.endpoints.insert(alloc.rank, alloc.endpoint.clone());
            (pending.hosts.len() as u32 == alloc.ranks && pending.layout.is_none())
                .then(|| (pending.first.clone(), pending.hosts.clone(), pending.endpoints.values().cloned().collect::<Vec<_>>()))
        };
        if let Some((first, hosts, endpoints)) = complete {
            // The last rank to arrive defines the array everywhere.
            let members = self.node.membership().list().members.clone();
            let layout = ArrayLayout {
                array: ringfs_rpc::memory::random_u64(),
                len: first.len,
                block_size: first.block_size,
                distribution: first.distribution,
                homes: choose_homes(&first, &hosts, &members),
                cache: first.cache,
                nodes: if first.cache == CacheMode::Uncached { Vec::new() } else { endpoints },
            };
            let failed = self.node.broadcast(&Request::GmemDefine(layout.clone())).into_iter().find_map(Result::err);
            if let Some(errno) = failed {
                log::warn!("global memory: a server could not define array {:x}: {errno}", layout.array);
                gmem.collectives().allocs.remove(&key);
                gmem.progress.notify_all();
                return Err(Errno::EIO);
            }
            if let Some(pending) = gmem.collectives().allocs.get_mut(&key) {
                pending.layout = Some(layout);
            }
            gmem.progress.notify_all();
        }
        let end = deadline.min(Instant::now() + LONG_POLL);
        let layout = gmem.long_poll(end, |collectives| {
            let pending = collectives.allocs.get_mut(&key)?;
            let layout = pending.layout.clone()?;
            pending.answered.insert(alloc.rank);
            if pending.answered.len() as u32 == alloc.ranks {
                collectives.allocs.remove(&key);
            }
            Some(layout)
        })?;
        Ok(Response::GmemArray(layout))
    }

    /// `GmemDefine`: an array exists (its blocks homed here are made on first write).
    pub fn define(&self, layout: ArrayLayout) -> Result<Response, Errno> {
        if layout.block_size == 0 || layout.block_size > MAX_BLOCK_SIZE {
            return Err(Errno::EINVAL);
        }
        // With cooperation a home serves a block once per wave of readers.
        let reads = match layout.cache {
            CacheMode::Cooperative | CacheMode::Relayed => HomeReads::Once,
            CacheMode::Uncached | CacheMode::HomeServed => HomeReads::Repeated,
        };
        self.memory.define(layout.array, layout.block_size, reads)?;
        self.arrays().insert(layout.array, Arc::new(layout));
        Ok(Response::Done)
    }

    /// `GmemDrop`: an array is gone.
    pub fn drop_array(&self, array: ArrayOnly) -> Result<Response, Errno> {
        self.arrays().remove(&array.array);
        self.directory.drop_array(array.array);
        self.memory.drop_array(array.array);
        Ok(Response::Done)
    }

    /// `GmemFree` at the coordinator: the last rank's free drops the array everywhere.
    pub fn free(&self, free: GmemFree) -> Result<Response, Errno> {
        if free.ranks == 0 || free.rank >= free.ranks {
            return Err(Errno::EINVAL);
        }
        let last = {
            let mut collectives = self.collectives();
            let freed = collectives.frees.entry((free.job, free.array)).or_default();
            freed.insert(free.rank);
            let last = freed.len() as u32 == free.ranks;
            if last {
                collectives.frees.remove(&(free.job, free.array));
            }
            last
        };
        if last {
            for outcome in self.node.broadcast(&Request::GmemDrop(ArrayOnly { array: free.array })) {
                if let Err(errno) = outcome {
                    log::warn!("global memory: a server did not drop array {:x}: {errno}", free.array);
                }
            }
        }
        Ok(Response::Done)
    }

    /// `GmemBarrier` at the coordinator.
    pub fn barrier(&self, barrier: GmemBarrier, deadline: Instant) -> Result<Response, Errno> {
        if barrier.ranks == 0 || barrier.rank >= barrier.ranks {
            return Err(Errno::EINVAL);
        }
        let key = (barrier.job, barrier.epoch);
        {
            let mut collectives = self.collectives();
            let (arrived, _) = collectives.barriers.entry(key).or_default();
            arrived.insert(barrier.rank);
            if arrived.len() as u32 == barrier.ranks {
                self.progress.notify_all();
            }
        }
        let end = deadline.min(Instant::now() + LONG_POLL);
        self.long_poll(end, |collectives| {
            let (arrived, released) = collectives.barriers.get_mut(&key)?;
            if (arrived.len() as u32) < barrier.ranks {
                return None;
            }
            released.insert(barrier.rank);
            if released.len() as u32 == barrier.ranks {
                collectives.barriers.remove(&key);
            }
            Some(())
        })?;
        Ok(Response::Done)
    }

    /// `GmemRead` at the block's home: the bytes go in the answer's data section.
    pub fn read(&self, range: BlockRange, reply_data: &mut Vec<u8>) -> Result<Response, Errno> {
        self.check(&range)?;
        reply_data.resize(range.len as usize, 0);
        self.memory.access(range.array, range.block, Access::Read { offset: range.offset as usize, into: reply_data })?;
        throttle::pass(self.network.as_ref(), u64::from(range.len));
        Ok(Response::Count(u64::from(range.len)))
    }

    /// `GmemLease` at the block's home: a client on this host copies the bytes out of this
    /// server's memory (it proved it can in its handshake); otherwise as `GmemRead`.
    pub fn lease(&self, session: &mut crate::session::Session, range: BlockRange, reply_data: &mut Vec<u8>) -> Result<Response, Errno> {
        self.check(&range)?;
        if session.client_memory.is_none() {
            self.read(range, reply_data)?;
            return Ok(Response::Read(ReadReply { attr: None, len: u64::from(range.len), lease: None }));
        }
        let mut shared = None;
        self.memory.access(range.array, range.block, Access::Lease { into: &mut shared })?;
        throttle::pass(self.network.as_ref(), u64::from(range.len));
        let Some(buffer) = shared else {
            // Never written: zeros, sent inline.
            reply_data.resize(range.len as usize, 0);
            return Ok(Response::Read(ReadReply { attr: None, len: u64::from(range.len), lease: None }));
        };
        let address = buffer.as_ptr() as u64 + u64::from(range.offset);
        let lease = Lease { id: session.lend(buffer), address, stored: u64::from(range.len) };
        Ok(Response::Read(ReadReply { attr: None, len: u64::from(range.len), lease: Some(lease) }))
    }

    /// `GmemWrite` at the block's home: the bytes are the request's data section.
    pub fn write(&self, range: BlockRange, data: &[u8]) -> Result<Response, Errno> {
        self.check(&range)?;
        if data.len() != range.len as usize {
            return Err(Errno::EINVAL);
        }
        throttle::pass(self.network.as_ref(), u64::from(range.len));
        self.memory.access(range.array, range.block, Access::Write { offset: range.offset as usize, from: data })?;
        Ok(Response::Done)
    }

    /// `GmemAtomic` at the block's home: the word before the operation.
    pub fn atomic(&self, atomic: GmemAtomic) -> Result<Response, Errno> {
        self.check(&atomic.at)?;
        if atomic.at.len != 8 || !atomic.at.offset.is_multiple_of(8) {
            return Err(Errno::EINVAL);
        }
        let mut old = 0;
        self.memory.access(
            atomic.at.array,
            atomic.at.block,
            Access::Atomic { offset: atomic.at.offset as usize, op: atomic.op, old: &mut old },
        )?;
        throttle::pass(self.network.as_ref(), 8);
        Ok(Response::Count(old))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, host_id: u64) -> ringfs_proto::Member {
        ringfs_proto::Member {
            name: name.into(),
            tcp_address: String::new(),
            unix_path: String::new(),
            host_id,
            pid: 0,
            alive: true,
            incarnation: 1,
        }
    }

    #[test]
    fn ranks_are_homed_by_a_server_of_their_host() {
        let members = [member("a", 1), member("b", 1), member("c", 2)];
        let alloc = GmemAlloc {
            job: 1,
            sequence: 1,
            rank: 0,
            ranks: 4,
            host_id: 1,
            len: 100,
            block_size: 4096,
            distribution: Distribution::Block,
            cache: CacheMode::Uncached,
            endpoint: String::new(),
        };
        let hosts: BTreeMap<u32, u64> = [(0, 1), (1, 1), (2, 2), (3, 9)].into_iter().collect();
        assert_eq!(choose_homes(&alloc, &hosts, &members), ["a", "b", "c", "a"], "rank 3's host has no server: by rank");
        let hashed = GmemAlloc { distribution: Distribution::Hashed, ..alloc.clone() };
        assert_eq!(choose_homes(&hashed, &hosts, &members), ["a", "b", "c"]);
    }
}
