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
//! **Relayed reads** (arrays in `CacheMode::Relayed`): a read queues at its block before it
//! waits for the transaction under way; whoever runs the next transaction takes every read
//! queued and answers them together — one copy leaves the block's source for the first
//! reader, with the others' ranks to relay it to (`coherence::relay_tree`), and the view
//! becomes what the reads one after the other would have made it
//! (`coherence::complete_relayed_reads`). The transaction ends once the first reader has its
//! copy; the others get theirs from each other, and a holder asked about a block before its
//! copy came waits for it, as for any grant still on its way.
//!
//! A holder that cannot be reached lost its copy. If the directory called it the owner of
//! a possibly dirty copy (E, M or O), the latest bytes of the block may be gone with it:
//! the block is marked *lost* and every later request for it fails with EIO, rather than
//! serve older bytes as if they were current.

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::Arc;

use ringfs_proto::coherence::{self, CacheState, DataSource, DirectoryEntry, GetRequest, PutOutcome, Rank, Step, StepReply};
use ringfs_proto::gmem::{ArrayLayout, CacheMode, CoFill, CoForward, CoGet, CoGrant, CoInvalidate, CoPut, RelayTarget};
use ringfs_proto::{Errno, Request, Response};

use super::Access;

/// One block's entry: the protocol's view, and whether its latest bytes were lost.
#[derive(Default)]
struct Entry {
    view: DirectoryEntry,
    lost: bool,
}

/// A block of an array: (array id, block index).
type BlockKey = (u64, u64);

/// A block's entry and who may change it: one transaction at a time (`busy`), and the reads
/// queued for the next one.
#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
    /// Woken when a transaction ends.
    ended: Condvar,
    /// Locked only by the transaction under way (uncontended).
    entry: Mutex<Entry>,
}

#[derive(Default)]
struct SlotState {
    /// A transaction is under way.
    busy: bool,
    next_ticket: u64,
    /// Reads waiting to be answered together (relayed arrays), by ticket.
    waiting: Vec<(u64, RelayTarget)>,
    /// Answers of reads a transaction took along, until their own threads collect them —
    /// without waiting for the block to be free: a later transaction may need a reader's
    /// copy, which it installs only once it has its answer.
    answered: HashMap<u64, Result<CoGrant, Errno>>,
}

impl Slot {
    /// Waits until no transaction runs, then runs one: the entry, until the guard drops.
    fn begin(&self) -> Transaction<'_> {
        let mut state = self.state.lock();
        while state.busy {
            self.ended.wait(&mut state);
        }
        state.busy = true;
        drop(state);
        Transaction { entry: Some(self.entry.lock()), slot: self }
    }
}

/// A transaction under way on a block: its entry, held until it drops.
struct Transaction<'a> {
    entry: Option<MutexGuard<'a, Entry>>,
    slot: &'a Slot,
}

impl std::ops::Deref for Transaction<'_> {
    type Target = Entry;
    fn deref(&self) -> &Entry {
        self.entry.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for Transaction<'_> {
    fn deref_mut(&mut self) -> &mut Entry {
        self.entry.as_mut().expect("held until dropped")
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        self.entry = None;
        self.slot.state.lock().busy = false;
        self.slot.ended.notify_all();
    }
}

/// The directory of one server.
#[derive(Default)]
pub struct Directory {
    entries: Mutex<HashMap<BlockKey, Arc<Slot>>>,
}

impl Directory {
    fn slot(&self, array: u64, block: u64) -> Arc<Slot> {
        self.entries.lock().entry((array, block)).or_default().clone()
    }

    /// An array is gone: its entries go.
    pub fn drop_array(&self, array: u64) {
        self.entries.lock().retain(|(owner, _), _| *owner != array);
    }
}

impl super::Gmem {
    /// The layout of a cached array, and whether `rank` and `block` are in it.
    fn cached_layout(&self, array: u64, block: u64, rank: u32) -> Result<Arc<ArrayLayout>, Errno> {
        let layout = self.layout(array).ok_or(Errno::ESTALE)?;
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
    /// A forwarded copy answers the requester's request `request`, and goes on to `relay` (a
    /// batch of reads).
    fn ask_holder(
        &self,
        layout: &ArrayLayout,
        block: u64,
        step: Step,
        expected: CacheState,
        request: u64,
        relay: &[RelayTarget],
    ) -> (StepReply, Vec<u8>) {
        let expected = expected.code();
        let (holder, request) = match step {
            Step::Forward { holder, requester, exclusive } => {
                let relay = relay.to_vec();
                (holder, Request::CoForward(CoForward { array: layout.array, block, requester, request, exclusive, expected, relay }))
            }
            Step::Invalidate { holder, write_back, keep_shared } => {
                (holder, Request::CoInvalidate(CoInvalidate { array: layout.array, block, write_back, keep_shared, expected }))
            }
        };
        let answer = self.node.call_rank(&layout.nodes[holder as usize], &request, &[]);
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
        let slot = self.directory.slot(get.array, get.block);
        if layout.cache == CacheMode::Relayed && !get.exclusive {
            return self.relayed_read(&layout, &slot, get, reply_data);
        }
        let mut entry = slot.begin();
        self.transaction(&layout, &mut entry, get, reply_data)
    }

    /// One request's transaction, the entry held: the plan's steps at the holders, then the
    /// grant (the block's bytes in `reply_data` when the home's memory serves).
    fn transaction(&self, layout: &ArrayLayout, entry: &mut Entry, get: CoGet, reply_data: &mut Vec<u8>) -> Result<Response, Errno> {
        let cooperative = layout.cache != CacheMode::HomeServed;
        let request = GetRequest { requester: get.rank, exclusive: get.exclusive, full_write: get.full_write };
        if entry.lost {
            return Err(Errno::EIO);
        }
        let plan = coherence::plan_get(&entry.view, request, cooperative);
        let replies = self.run_steps(layout, get.block, entry, &plan.steps, get.request, &[])?;
        let grant = coherence::complete_get(&mut entry.view, request, &plan, &replies, cooperative);
        if entry.lost {
            entry.view.holders.remove(&get.rank);
            return Err(Errno::EIO);
        }
        let source = match grant.data {
            DataSource::Home => {
                self.read_home_copy(layout, get.block, reply_data)?;
                ringfs_rpc::throttle::pass(self.network.as_ref(), u64::from(layout.block_size));
                0
            }
            DataSource::Holder(_) => 1,
            DataSource::Requester => 2,
            DataSource::Nothing => 3,
        };
        Ok(Response::CoGrant(CoGrant { state: grant.state.code(), source }))
    }

    /// Runs a plan's steps at the holders (a forwarded copy answering the requester's
    /// `request` and going on to `relay`), writing back what they send home; their answers.
    /// A holder that no longer has the copy the directory called possibly dirty marks the
    /// block lost.
    fn run_steps(
        &self,
        layout: &ArrayLayout,
        block: u64,
        entry: &mut Entry,
        steps: &[Step],
        request: u64,
        relay: &[RelayTarget],
    ) -> Result<Vec<StepReply>, Errno> {
        let mut replies = Vec::with_capacity(steps.len());
        for step in steps {
            let holder = match *step {
                Step::Forward { holder, .. } | Step::Invalidate { holder, .. } => holder,
            };
            let recorded = entry.view.state_of(holder);
            let responsible = matches!(recorded, CacheState::Exclusive | CacheState::Modified | CacheState::Owned);
            let (reply, written_back) = self.ask_holder(layout, block, *step, recorded, request, relay);
            if !written_back.is_empty() {
                self.memory.access(layout.array, block, Access::Write { offset: 0, from: &written_back })?;
            }
            if responsible && !reply.had.is_valid() {
                // The only current copy may be gone with its holder.
                entry.lost = true;
            }
            replies.push(reply);
        }
        Ok(replies)
    }

    fn read_home_copy(&self, layout: &ArrayLayout, block: u64, into: &mut Vec<u8>) -> Result<(), Errno> {
        into.resize(layout.block_size as usize, 0);
        self.memory.access(layout.array, block, Access::Read { offset: 0, into })
    }

    /// A read of a relayed array: queued, then answered by the next transaction of its block
    /// — this thread's own, or another's that took it along.
    fn relayed_read(&self, layout: &ArrayLayout, slot: &Slot, get: CoGet, reply_data: &mut Vec<u8>) -> Result<Response, Errno> {
        let mut state = slot.state.lock();
        state.next_ticket += 1;
        let ticket = state.next_ticket;
        state.waiting.push((ticket, RelayTarget { rank: get.rank, request: get.request }));
        while state.busy && !state.answered.contains_key(&ticket) {
            slot.ended.wait(&mut state);
        }
        if let Some(answer) = state.answered.remove(&ticket) {
            return answer.map(Response::CoGrant);
        }
        // The block is free and this read is still queued (a transaction that took it along
        // would have been busy until it answered): this thread's transaction takes every
        // read queued.
        state.busy = true;
        let batch = std::mem::take(&mut state.waiting);
        drop(state);
        let mut entry = Transaction { entry: Some(slot.entry.lock()), slot };
        let mut readers: Vec<RelayTarget> = batch.iter().map(|(_, reader)| *reader).collect();
        readers.sort_unstable_by_key(|reader| reader.rank);
        readers.dedup_by_key(|reader| reader.rank);
        if readers.len() == 1 {
            return self.transaction(layout, &mut entry, get, reply_data);
        }
        let answers = self.relay_batch(layout, get.block, &mut entry, readers);
        let mut state = slot.state.lock();
        for (queued, reader) in batch {
            let answer = answers.get(&reader.rank).copied().unwrap_or(Err(Errno::EIO));
            if queued != ticket {
                state.answered.insert(queued, answer);
            }
        }
        drop(state);
        drop(entry);
        answers.get(&get.rank).copied().unwrap_or(Err(Errno::EIO)).map(Response::CoGrant)
    }

    /// Reads of one block by several ranks as one transaction: the first reader (the ranks
    /// taking turns from block to block, so that no rank roots every tree) gets the copy
    /// from the block's source with the others to relay it to. Each reader's answer.
    fn relay_batch(
        &self,
        layout: &ArrayLayout,
        block: u64,
        entry: &mut Entry,
        mut readers: Vec<RelayTarget>,
    ) -> HashMap<Rank, Result<CoGrant, Errno>> {
        let mut answers = HashMap::new();
        if entry.lost {
            return readers.into_iter().map(|reader| (reader.rank, Err(Errno::EIO))).collect();
        }
        // A reader the view lists with a copy already is answered on its own (its copy).
        readers.retain(|reader| {
            let own = entry.view.state_of(reader.rank);
            if own.is_valid() {
                let request = GetRequest { requester: reader.rank, exclusive: false, full_write: false };
                let plan = coherence::plan_get(&entry.view, request, true);
                let grant = coherence::complete_get(&mut entry.view, request, &plan, &[], true);
                answers.insert(reader.rank, Ok(CoGrant { state: grant.state.code(), source: 2 }));
            }
            !own.is_valid()
        });
        if readers.is_empty() {
            return answers;
        }
        let turn = (block % readers.len() as u64) as usize;
        readers.rotate_left(turn);
        let (first, rest) = (readers[0], readers[1..].to_vec());
        let request = GetRequest { requester: first.rank, exclusive: false, full_write: false };
        let plan = coherence::plan_get(&entry.view, request, true);
        let outcome = self.run_steps(layout, block, entry, &plan.steps, first.request, &rest).and_then(|replies| {
            let grant = coherence::complete_get(&mut entry.view, request, &plan, &replies, true);
            if entry.lost {
                return Err(Errno::EIO);
            }
            match grant.data {
                DataSource::Holder(_) => Ok(1),
                _ => {
                    // The home's memory is the source: it sends the first reader the copy.
                    let mut bytes = Vec::new();
                    self.read_home_copy(layout, block, &mut bytes)?;
                    ringfs_rpc::throttle::pass(self.network.as_ref(), bytes.len() as u64);
                    let fill = Request::CoFill(CoFill { array: layout.array, block, request: first.request, relay: rest.clone() });
                    self.node.call_rank(&layout.nodes[first.rank as usize], &fill, &bytes)?;
                    Ok(4)
                }
            }
        });
        match outcome {
            Ok(first_source) => {
                let ranks: Vec<Rank> = rest.iter().map(|reader| reader.rank).collect();
                coherence::complete_relayed_reads(&mut entry.view, &ranks);
                for reader in readers {
                    let source = if reader.rank == first.rank { first_source } else { 1 };
                    answers.insert(reader.rank, Ok(CoGrant { state: entry.view.state_of(reader.rank).code(), source }));
                }
            }
            Err(errno) => {
                entry.view.holders.remove(&first.rank);
                for reader in readers {
                    answers.insert(reader.rank, Err(errno));
                }
            }
        }
        answers
    }

    /// `CoPut` at the block's home.
    pub fn co_put(&self, put: CoPut, data: &[u8]) -> Result<Response, Errno> {
        let layout = self.cached_layout(put.array, put.block, put.rank)?;
        if put.dirty && data.len() != layout.block_size as usize {
            return Err(Errno::EINVAL);
        }
        let slot = self.directory.slot(put.array, put.block);
        let mut entry = slot.begin();
        match coherence::accept_put(&mut entry.view, put.rank, put.dirty) {
            PutOutcome::Accept { write_back: true } => {
                ringfs_rpc::throttle::pass(self.network.as_ref(), data.len() as u64);
                self.memory.access(put.array, put.block, Access::Write { offset: 0, from: data })?;
            }
            PutOutcome::Accept { write_back: false } | PutOutcome::Stale => {}
        }
        Ok(Response::Done)
    }
}
