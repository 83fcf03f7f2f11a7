//! The coherence directory of the blocks a server homes, for arrays the ranks cache: who
//! holds a copy in which state, and the requests that change it, run one block at a time
//! (the protocol's rules are in `ringfs_proto::coherence`; this module runs them).
//!
//! A request (`CoGet`) holds its block's entry for the whole transaction: the steps at the
//! holders (`CoForward`: the holder sends its copy straight to the requester's cache with a
//! `CoFill`; `CoInvalidate`: the holder drops or downgrades its copy, sending it back if
//! dirty and asked), then the grant, with the block's bytes when the home's memory serves.
//! An eviction notice (`CoPut`) waits for the transaction under way, then updates the entry
//! and writes dirty data back.
//!
//! A holder that cannot be reached lost its copy. If the directory called it the owner of
//! a possibly dirty copy (E, M or O), the latest bytes of the block may be gone with it:
//! the block is marked *lost* and every later request for it fails with EIO, rather than
//! serve older bytes as if they were current.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use ringfs_proto::coherence::{self, CacheState, DataSource, DirectoryEntry, GetRequest, PutOutcome, Step, StepReply};
use ringfs_proto::gmem::{CacheMode, CoForward, CoGet, CoGrant, CoInvalidate, CoPut};
use ringfs_proto::{Errno, Request, Response};
use ringfs_rpc::{Connection, ConnectionConfig};

use super::Access;
use crate::service::ServerState;

/// One block's entry: the protocol's view, and whether its latest bytes were lost.
#[derive(Default)]
struct Entry {
    view: DirectoryEntry,
    lost: bool,
}

/// A block of an array: (array id, block index).
type BlockKey = (u64, u64);

/// The directory of one server.
#[derive(Default)]
pub struct Directory {
    entries: Mutex<HashMap<BlockKey, Arc<Mutex<Entry>>>>,
    /// Connections to the ranks' caches, by endpoint.
    nodes: Mutex<HashMap<String, Arc<Connection>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Directory {
    fn entry(&self, array: u64, block: u64) -> Arc<Mutex<Entry>> {
        lock(&self.entries).entry((array, block)).or_default().clone()
    }

    /// An array is gone: its entries go.
    pub fn drop_array(&self, array: u64) {
        lock(&self.entries).retain(|(owner, _), _| *owner != array);
    }

    /// A connection to a rank's cache at `endpoint`.
    fn node(&self, endpoint: &str, config: &ConnectionConfig) -> Result<Arc<Connection>, Errno> {
        let mut nodes = lock(&self.nodes);
        if let Some(connection) = nodes.get(endpoint)
            && !connection.is_broken()
        {
            return Ok(connection.clone());
        }
        let parsed = ringfs_rpc::Endpoint::parse(endpoint).map_err(|_| Errno::EINVAL)?;
        let connection = Arc::new(Connection::open(&parsed, config).map_err(|error| error.errno())?);
        nodes.insert(endpoint.to_string(), connection.clone());
        Ok(connection)
    }
}

impl ServerState {
    /// The layout of a cached array, and whether `rank` and `block` are in it.
    fn cached_layout(&self, array: u64, block: u64, rank: u32) -> Result<Arc<ringfs_proto::gmem::ArrayLayout>, Errno> {
        let layout = self.gmem.layout(array).ok_or(Errno::ESTALE)?;
        if layout.cache == CacheMode::Uncached || rank as usize >= layout.nodes.len() {
            return Err(Errno::EINVAL);
        }
        if block >= layout.len.div_ceil(u64::from(layout.block_size)) {
            return Err(Errno::EFAULT);
        }
        Ok(layout)
    }

    /// Asks the cache of rank `holder` one step of a transaction; its answer (`Invalid` if
    /// it cannot be reached), with the bytes it sent home.
    fn ask_holder(&self, layout: &ringfs_proto::gmem::ArrayLayout, block: u64, step: Step, expected: CacheState) -> (StepReply, Vec<u8>) {
        let expected = expected.code();
        let (holder, request) = match step {
            Step::Forward { holder, requester, exclusive } => {
                (holder, Request::CoForward(CoForward { array: layout.array, block, requester, exclusive, expected }))
            }
            Step::Invalidate { holder, write_back, keep_shared } => {
                (holder, Request::CoInvalidate(CoInvalidate { array: layout.array, block, write_back, keep_shared, expected }))
            }
        };
        let answer = self
            .gmem
            .directory
            .node(&layout.nodes[holder as usize], self.peers.config())
            .and_then(|connection| connection.call(&request, &[]).map_err(|error| error.errno()));
        match answer {
            Ok(ringfs_rpc::Reply { response: Response::Count(code), data, .. }) => {
                (StepReply { had: CacheState::from_code(code as u8).unwrap_or(CacheState::Invalid) }, data)
            }
            other => {
                log::warn!("global memory: the cache of rank {holder} did not answer {request:?}: {other:?}");
                (StepReply { had: CacheState::Invalid }, Vec::new())
            }
        }
    }

    /// `CoGet` at the block's home.
    pub fn co_get(&self, get: CoGet, reply_data: &mut Vec<u8>) -> Result<Response, Errno> {
        let layout = self.cached_layout(get.array, get.block, get.rank)?;
        let cooperative = layout.cache == CacheMode::Cooperative;
        let request = GetRequest { requester: get.rank, exclusive: get.exclusive, full_write: get.full_write };
        let entry = self.gmem.directory.entry(get.array, get.block);
        let mut entry = lock(&entry);
        if entry.lost {
            return Err(Errno::EIO);
        }
        let plan = coherence::plan_get(&entry.view, request, cooperative);
        let mut replies = Vec::with_capacity(plan.steps.len());
        for step in &plan.steps {
            let holder = match *step {
                Step::Forward { holder, .. } | Step::Invalidate { holder, .. } => holder,
            };
            let recorded = entry.view.state_of(holder);
            let responsible = matches!(recorded, CacheState::Exclusive | CacheState::Modified | CacheState::Owned);
            let (reply, written_back) = self.ask_holder(&layout, get.block, *step, recorded);
            if !written_back.is_empty() {
                self.gmem.memory.access(get.array, get.block, Access::Write { offset: 0, from: &written_back })?;
            }
            if responsible && !reply.had.is_valid() {
                // The only current copy may be gone with its holder.
                entry.lost = true;
            }
            replies.push(reply);
        }
        let grant = coherence::complete_get(&mut entry.view, request, &plan, &replies, cooperative);
        if entry.lost {
            entry.view.holders.remove(&get.rank);
            return Err(Errno::EIO);
        }
        let source = match grant.data {
            DataSource::Home => {
                reply_data.resize(layout.block_size as usize, 0);
                self.gmem.memory.access(get.array, get.block, Access::Read { offset: 0, into: reply_data })?;
                ringfs_rpc::throttle::pass(self.gmem.network.as_ref(), u64::from(layout.block_size));
                0
            }
            DataSource::Holder(_) => 1,
            DataSource::Requester => 2,
            DataSource::Nothing => 3,
        };
        Ok(Response::CoGrant(CoGrant { state: grant.state.code(), source }))
    }

    /// `CoPut` at the block's home.
    pub fn co_put(&self, put: CoPut, data: &[u8]) -> Result<Response, Errno> {
        let layout = self.cached_layout(put.array, put.block, put.rank)?;
        if put.dirty && data.len() != layout.block_size as usize {
            return Err(Errno::EINVAL);
        }
        let entry = self.gmem.directory.entry(put.array, put.block);
        let mut entry = lock(&entry);
        match coherence::accept_put(&mut entry.view, put.rank, put.dirty) {
            PutOutcome::Accept { write_back: true } => {
                ringfs_rpc::throttle::pass(self.gmem.network.as_ref(), data.len() as u64);
                self.gmem.memory.access(put.array, put.block, Access::Write { offset: 0, from: data })?;
            }
            PutOutcome::Accept { write_back: false } | PutOutcome::Stale => {}
        }
        Ok(Response::Done)
    }
}
