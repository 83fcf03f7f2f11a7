//! A model checker of the coherence protocol: nodes load, store, request and evict; the
//! home takes the requests of each node in order but those of different nodes in any order
//! (messages between different pairs reorder), each request as one transaction, the way
//! the home's per-block serialization runs them; every interleaving of a small
//! configuration is explored (exhaustively for 2 and 3 nodes with one block, in random
//! walks for 3 nodes and 2 blocks), and after every step the invariants must hold:
//!
//! - single writer / multiple readers: an E or M copy is the only valid copy;
//! - at most one O or F copy;
//! - every valid copy holds the latest value (so every load returns the last completed
//!   write), and with no dirty copy the home's memory does;
//! - the directory is exact: it lists every node with the state the node has (E for E or
//!   M), including copies being evicted whose notice has not arrived.
//!
//! Values are abstracted to *fresh* (the last written) or *stale*: a store makes every
//! other value stale, so the state space is finite and the checks are exact.

use std::collections::{BTreeMap, HashSet, VecDeque};

use super::*;

const STALE: u8 = 0;
const FRESH: u8 = 1;
/// The bytes a full-block write found (never read: the write overwrites them at once).
const GARBAGE: u8 = 2;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Message {
    Get(GetRequest),
    Put { dirty: bool, value: u8 },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Block {
    directory: DirectoryEntry,
    memory: u8,
    /// Per node: the installed copy, and a copy being evicted (its notice on its way).
    copies: Vec<Option<(CacheState, u8)>>,
    evicting: Vec<Option<(CacheState, u8)>>,
    /// Per node: a request on its way or queued.
    waiting: Vec<bool>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct World {
    blocks: Vec<Block>,
    /// Per node, its messages to the home, in order: (block, message).
    queues: Vec<VecDeque<(usize, Message)>>,
}

#[derive(Clone, Copy, Debug)]
enum Action {
    Store {
        node: usize,
        block: usize,
    },
    Request {
        node: usize,
        block: usize,
        exclusive: bool,
        full_write: bool,
    },
    Evict {
        node: usize,
        block: usize,
    },
    Deliver {
        node: usize,
    },
    /// The home takes the reads of `block` at the head of several nodes' queues as one
    /// relayed batch (`complete_relayed_reads`).
    DeliverReads {
        block: usize,
    },
}

impl World {
    fn new(nodes: usize, blocks: usize) -> World {
        let block = Block {
            directory: DirectoryEntry::default(),
            memory: FRESH,
            copies: vec![None; nodes],
            evicting: vec![None; nodes],
            waiting: vec![false; nodes],
        };
        World { blocks: vec![block; blocks], queues: vec![VecDeque::new(); nodes] }
    }

    fn nodes(&self) -> usize {
        self.queues.len()
    }

    /// Every action possible now.
    fn actions(&self) -> Vec<Action> {
        let mut actions = Vec::new();
        for block in 0..self.blocks.len() {
            if self.reads_at_heads(block).len() >= 2 {
                actions.push(Action::DeliverReads { block });
            }
        }
        for node in 0..self.nodes() {
            if !self.queues[node].is_empty() {
                actions.push(Action::Deliver { node });
            }
            for (index, block) in self.blocks.iter().enumerate() {
                let busy = block.waiting[node] || block.evicting[node].is_some();
                match block.copies[node] {
                    Some((state, _)) if state.is_writable() => actions.push(Action::Store { node, block: index }),
                    _ if !busy => {
                        for (exclusive, full_write) in [(false, false), (true, false), (true, true)] {
                            let own = block.copies[node].map(|(state, _)| state);
                            // A node asks only for what it lacks: a read of an invalid copy,
                            // a write to a copy it cannot write.
                            if !exclusive && own.is_some() {
                                continue;
                            }
                            actions.push(Action::Request { node, block: index, exclusive, full_write });
                        }
                    }
                    _ => {}
                }
                if block.copies[node].is_some() && !busy {
                    actions.push(Action::Evict { node, block: index });
                }
            }
        }
        actions
    }

    /// The nodes whose next message to the home is a read of `block`.
    fn reads_at_heads(&self, block: usize) -> Vec<usize> {
        (0..self.nodes())
            .filter(|node| {
                matches!(self.queues[*node].front(), Some((queued, Message::Get(request))) if *queued == block && !request.exclusive)
            })
            .collect()
    }

    fn apply(&mut self, action: Action, cooperative: bool) {
        match action {
            Action::DeliverReads { block } => {
                let readers = self.reads_at_heads(block);
                for node in &readers {
                    self.queues[*node].pop_front();
                }
                let first = readers[0];
                self.home_get(block, GetRequest { requester: first as Rank, exclusive: false, full_write: false }, cooperative);
                let entry = &mut self.blocks[block];
                let value = entry.copies[first].expect("the first reader's copy").1;
                let rest: Vec<Rank> = readers[1..].iter().map(|node| *node as Rank).collect();
                if cooperative {
                    complete_relayed_reads(&mut entry.directory, &rest);
                    for node in &readers {
                        // Every reader holds the first one's copy, in the state the view ends with.
                        entry.copies[*node] = Some((entry.directory.state_of(*node as Rank), value));
                        entry.waiting[*node] = false;
                    }
                } else {
                    // Without cooperation nothing is relayed: the reads run one after the other.
                    for node in &readers[1..] {
                        self.home_get(block, GetRequest { requester: *node as Rank, exclusive: false, full_write: false }, cooperative);
                    }
                }
            }
            Action::Store { node, block } => {
                self.make_all_stale(block);
                self.blocks[block].copies[node] = Some((CacheState::Modified, FRESH));
            }
            Action::Request { node, block, exclusive, full_write } => {
                self.blocks[block].waiting[node] = true;
                self.queues[node].push_back((block, Message::Get(GetRequest { requester: node as Rank, exclusive, full_write })));
            }
            Action::Evict { node, block } => {
                let copy = self.blocks[block].copies[node].take().expect("a copy to evict");
                self.blocks[block].evicting[node] = Some(copy);
                self.queues[node].push_back((block, Message::Put { dirty: copy.0.is_dirty(), value: copy.1 }));
            }
            Action::Deliver { node } => {
                let (block, message) = self.queues[node].pop_front().expect("a message");
                match message {
                    Message::Get(request) => self.home_get(block, request, cooperative),
                    Message::Put { dirty, value } => {
                        let entry = &mut self.blocks[block];
                        if let PutOutcome::Accept { write_back: true } = accept_put(&mut entry.directory, node as Rank, dirty) {
                            entry.memory = value;
                        }
                        entry.evicting[node] = None;
                    }
                }
            }
        }
    }

    fn make_all_stale(&mut self, block: usize) {
        let stale = |value: &mut u8| {
            if *value == FRESH {
                *value = STALE;
            }
        };
        let entry = &mut self.blocks[block];
        stale(&mut entry.memory);
        for copy in entry.copies.iter_mut().chain(entry.evicting.iter_mut()).flatten() {
            stale(&mut copy.1);
        }
        for queue in &mut self.queues {
            for (queued_block, message) in queue.iter_mut() {
                if let (true, Message::Put { value, .. }) = (*queued_block == block, message) {
                    stale(value);
                }
            }
        }
    }

    /// The home runs a request as one transaction: its steps at the holders (each acting on
    /// its copy being evicted if it has one, else its installed copy), then the grant.
    fn home_get(&mut self, block: usize, request: GetRequest, cooperative: bool) {
        let entry = &mut self.blocks[block];
        let plan = plan_get(&entry.directory, request, cooperative);
        let mut replies = Vec::new();
        let mut forwarded = None;
        for step in &plan.steps {
            let holder = match *step {
                Step::Forward { holder, .. } | Step::Invalidate { holder, .. } => holder as usize,
            };
            let slot = if entry.evicting[holder].is_some() { &mut entry.evicting[holder] } else { &mut entry.copies[holder] };
            let had = slot.map_or(CacheState::Invalid, |(state, _)| state);
            assert!(had.is_valid(), "the home asked node {holder}, which has no copy ({step:?}) in {entry:?}");
            let value = slot.expect("a valid copy").1;
            if matches!(step, Step::Forward { .. }) {
                forwarded = Some(value);
            }
            let (kept, sends_home) = match *step {
                Step::Forward { exclusive, .. } => (on_forward(had, exclusive).unwrap_or(CacheState::Invalid), false),
                Step::Invalidate { write_back, keep_shared, .. } => on_invalidate(had, write_back, keep_shared),
            };
            if sends_home {
                entry.memory = value;
            }
            if let Some(copy) = slot.as_mut() {
                copy.0 = kept;
            }
            if kept == CacheState::Invalid {
                // An installed copy goes; one being evicted stays until its notice is taken
                // (its state is now I, and its data is stale for the home).
                if entry.evicting[holder].is_none() {
                    entry.copies[holder] = None;
                }
            }
            replies.push(StepReply { had });
        }
        let grant = complete_get(&mut entry.directory, request, &plan, &replies, cooperative);
        let requester = request.requester as usize;
        let value = match grant.data {
            DataSource::Home => entry.memory,
            DataSource::Holder(_) => forwarded.expect("a forwarded value"),
            DataSource::Requester => entry.copies[requester].expect("the requester's own copy").1,
            DataSource::Nothing => GARBAGE,
        };
        entry.copies[requester] = Some((grant.state, value));
        entry.waiting[requester] = false;
        if grant.data == DataSource::Nothing {
            // A full-block write writes at once.
            self.make_all_stale(block);
            self.blocks[block].copies[requester] = Some((CacheState::Modified, FRESH));
        }
    }

    /// Checks every invariant; the first one broken, described.
    fn check(&self) -> Result<(), String> {
        for (index, block) in self.blocks.iter().enumerate() {
            let held: Vec<(usize, CacheState, u8)> = (0..self.nodes())
                .filter_map(|node| block.evicting[node].or(block.copies[node]).map(|(state, value)| (node, state, value)))
                .filter(|(_, state, _)| state.is_valid())
                .collect();
            let exclusive = held.iter().filter(|(_, state, _)| state.is_writable()).count();
            if exclusive > 1 || (exclusive == 1 && held.len() > 1) {
                return Err(format!("block {index}: an E/M copy beside others: {held:?}"));
            }
            if held.iter().filter(|(_, state, _)| matches!(state, CacheState::Owned | CacheState::Forward)).count() > 1 {
                return Err(format!("block {index}: two responders: {held:?}"));
            }
            if let Some(stale) = held.iter().find(|(_, _, value)| *value != FRESH) {
                return Err(format!("block {index}: node {} holds a stale copy: {held:?}", stale.0));
            }
            if !held.iter().any(|(_, state, _)| state.is_dirty()) && block.memory != FRESH {
                return Err(format!("block {index}: no dirty copy, and the home's memory is stale: {held:?}"));
            }
            for node in 0..self.nodes() {
                let actual = block.evicting[node].or(block.copies[node]).map_or(CacheState::Invalid, |(state, _)| state);
                let listed = block.directory.state_of(node as Rank);
                let agrees = listed == actual || (listed == CacheState::Exclusive && actual == CacheState::Modified);
                if !agrees {
                    return Err(format!("block {index}: the directory lists node {node} as {listed:?}, it holds {actual:?}"));
                }
            }
        }
        Ok(())
    }
}

/// Explores every state reachable from the start (depth-first, each state once).
fn explore_all(nodes: usize, blocks: usize, cooperative: bool) -> usize {
    let start = World::new(nodes, blocks);
    let mut seen: HashSet<World> = HashSet::new();
    let mut pending = vec![start];
    while let Some(world) = pending.pop() {
        if !seen.insert(world.clone()) {
            continue;
        }
        assert!(seen.len() < 5_000_000, "the state space is larger than expected");
        for action in world.actions() {
            let mut next = world.clone();
            next.apply(action, cooperative);
            if let Err(broken) = next.check() {
                panic!("{broken}\nafter {action:?} from {world:?}");
            }
            if !seen.contains(&next) {
                pending.push(next);
            }
        }
    }
    seen.len()
}

#[test]
fn every_interleaving_of_two_nodes_keeps_the_invariants() {
    for cooperative in [true, false] {
        let states = explore_all(2, 1, cooperative);
        eprintln!("2 nodes, 1 block, cooperative {cooperative}: {states} states");
        assert!(states > 100, "{states} states explored");
    }
}

#[test]
fn every_interleaving_of_three_nodes_keeps_the_invariants() {
    for cooperative in [true, false] {
        let states = explore_all(3, 1, cooperative);
        eprintln!("3 nodes, 1 block, cooperative {cooperative}: {states} states");
        assert!(states > 1000, "{states} states explored");
    }
}

#[test]
fn every_interleaving_of_two_nodes_and_two_blocks_keeps_the_invariants() {
    for cooperative in [true, false] {
        let states = explore_all(2, 2, cooperative);
        eprintln!("2 nodes, 2 blocks, cooperative {cooperative}: {states} states");
        assert!(states > 10_000, "{states} states explored");
    }
}

/// Random walks over 3 nodes and 2 blocks (the two blocks' messages interleave in the
/// nodes' queues).
#[test]
fn random_walks_over_two_blocks_keep_the_invariants() {
    let walks: u64 = std::env::var("RINGFS_MODEL_WALKS").ok().and_then(|walks| walks.parse().ok()).unwrap_or(2_000);
    for seed in 1..=walks {
        let cooperative = seed % 2 == 0;
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut world = World::new(3, 2);
        let mut trace = Vec::new();
        for _ in 0..200 {
            let actions = world.actions();
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let action = actions[(state % actions.len() as u64) as usize];
            trace.push(action);
            world.apply(action, cooperative);
            if let Err(broken) = world.check() {
                panic!("seed {seed}: {broken}\ntrace: {trace:?}");
            }
        }
    }
}

/// The checker finds a broken protocol: reads forwarded by an F copy without migrating the
/// Forward state make two F copies (a mutation the checks must catch).
#[test]
fn the_checker_catches_a_broken_rule() {
    let mut entry = DirectoryEntry { holders: BTreeMap::from([(0, CacheState::Forward)]) };
    let request = GetRequest { requester: 1, exclusive: false, full_write: false };
    let plan = plan_get(&entry, request, true);
    complete_get(&mut entry, request, &plan, &[StepReply { had: CacheState::Forward }], true);
    // The real rule: the old F becomes S.
    assert_eq!(entry.state_of(0), CacheState::Shared);
    // A world where it did not: the invariant check reports two responders.
    let mut world = World::new(2, 1);
    world.blocks[0].copies[0] = Some((CacheState::Forward, FRESH));
    world.blocks[0].copies[1] = Some((CacheState::Forward, FRESH));
    world.blocks[0].directory.holders = BTreeMap::from([(0, CacheState::Forward), (1, CacheState::Forward)]);
    assert!(world.check().unwrap_err().contains("two responders"));
}
