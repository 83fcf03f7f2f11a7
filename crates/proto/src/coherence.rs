//! The coherence protocol of the ranks' block caches (MOESI with a Forward state), as pure
//! functions of states and messages, with no transport: the home's directory decides what
//! a request needs ([`plan_get`], [`complete_get`], [`accept_put`]) and a node answers what
//! the home asks of it ([`on_forward`], [`on_invalidate`]). The real caches (the ranks'
//! `crates/gmem/src/cache.rs`, the servers' `crates/server/src/gmem/directory.rs`) and the
//! model checker (`coherence/model.rs`, run by `cargo test`) all use these functions, so
//! what is checked is what runs.
//!
//! States of a node's copy: **M**odified (the only copy, dirty), **O**wned (dirty, shared:
//! it answers readers and must write back), **E**xclusive (the only copy, clean; may turn M
//! silently on a write), **S**hared (clean, read-only), **F**orward (clean, shared, the one
//! copy that answers readers), **I**nvalid. Invariants (checked by the model): at most one
//! node holds M or E, and then no other node holds anything; at most one holds O or F; every
//! valid copy holds the latest value; with no M or O copy, the home's memory does.
//!
//! The home handles one request per block at a time (a *blocking directory*), and knows
//! every holder's state (E stands for "E or M": a node turns E into M without telling). A
//! request is answered in steps the home takes one after the other:
//! - **Read (GetS)** with cooperation: a holder of E/M, O or F *forwards* its copy straight
//!   to the requester (three hops: requester → home → holder → requester). E becomes S and
//!   the requester F; M becomes O and the requester S; O stays O; F becomes S and the
//!   requester F (the Forward state migrates to the newest copy, so a scan builds a chain).
//!   Otherwise the home sends its memory: the requester gets E if nobody else holds the
//!   block, F if others hold S.
//! - **Read without cooperation** (the baseline): a holder of E/M writes back (if dirty) and
//!   keeps S; the home always sends the data.
//! - **Write (GetM)**: every other copy is invalidated; a dirty or exclusive one forwards its
//!   data to the requester first (cooperation) or writes it back (without), unless the
//!   requester holds a valid copy or will overwrite the whole block (then no data moves).
//!   The requester gets M.
//! - **Eviction (Put)**: a node that drops a copy tells the home (with the data if dirty);
//!   the home writes dirty data back and forgets the holder. A Put that crossed a request
//!   which already took the copy away (the directory no longer lists the node) is stale and
//!   ignored — a newer copy exists elsewhere.

use std::collections::BTreeMap;

/// A rank of the job (a node, in the protocol's words).
pub type Rank = u32;

/// The state of a node's copy of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CacheState {
    Invalid,
    Shared,
    Forward,
    Exclusive,
    Owned,
    Modified,
}

impl CacheState {
    /// The copy may be read.
    pub fn is_valid(self) -> bool {
        self != CacheState::Invalid
    }

    /// The copy may be written without asking the home (E turns M).
    pub fn is_writable(self) -> bool {
        matches!(self, CacheState::Exclusive | CacheState::Modified)
    }

    /// The copy differs from the home's memory.
    pub fn is_dirty(self) -> bool {
        matches!(self, CacheState::Modified | CacheState::Owned)
    }

    /// The wire form.
    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<CacheState> {
        [CacheState::Invalid, CacheState::Shared, CacheState::Forward, CacheState::Exclusive, CacheState::Owned, CacheState::Modified]
            .get(code as usize)
            .copied()
    }
}

/// What the home knows of one block: who holds a copy, in which state (E for E or M).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DirectoryEntry {
    pub holders: BTreeMap<Rank, CacheState>,
}

impl DirectoryEntry {
    fn holder_in(&self, states: &[CacheState], except: Rank) -> Option<Rank> {
        self.holders.iter().find(|(rank, state)| **rank != except && states.contains(state)).map(|(rank, _)| *rank)
    }

    /// The state the directory records for `rank`.
    pub fn state_of(&self, rank: Rank) -> CacheState {
        self.holders.get(&rank).copied().unwrap_or(CacheState::Invalid)
    }
}

/// A request a node sends its block's home.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GetRequest {
    pub requester: Rank,
    /// For a write (GetM); a read otherwise (GetS).
    pub exclusive: bool,
    /// The requester will overwrite the whole block: it needs no data.
    pub full_write: bool,
}

/// A step the home takes, asking one holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send your copy to `requester` (for a read, or a write when `exclusive`), then change
    /// state as [`on_forward`] says.
    Forward { holder: Rank, requester: Rank, exclusive: bool },
    /// Drop your copy; with `write_back`, send it to the home first if it is dirty, and
    /// with `keep_shared` keep it as S (recall for a read, without cooperation).
    Invalidate { holder: Rank, write_back: bool, keep_shared: bool },
}

/// Where the requester's data comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataSource {
    /// The home's memory (after the steps: write-backs land first).
    Home,
    /// A holder forwards it (one of the steps).
    Holder(Rank),
    /// The requester's own copy is valid: nothing moves.
    Requester,
    /// The requester overwrites the whole block: nothing moves.
    Nothing,
}

/// The home's plan for a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GetPlan {
    pub steps: Vec<Step>,
    pub data: DataSource,
}

/// What a holder answered to a step: the state it had (`Invalid`: it had no copy — a
/// protocol error the home logs and survives by falling back to its memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepReply {
    pub had: CacheState,
}

/// The steps and the data source for `request`, from the directory's view.
pub fn plan_get(entry: &DirectoryEntry, request: GetRequest, cooperative: bool) -> GetPlan {
    let requester = request.requester;
    let own = entry.state_of(requester);
    if request.exclusive {
        let mut steps = Vec::new();
        let mut data = if own.is_valid() {
            DataSource::Requester
        } else if request.full_write {
            DataSource::Nothing
        } else {
            DataSource::Home
        };
        for (holder, state) in &entry.holders {
            if *holder == requester {
                continue;
            }
            let responsible = matches!(state, CacheState::Exclusive | CacheState::Modified | CacheState::Owned);
            if responsible && data == DataSource::Home && cooperative {
                steps.push(Step::Forward { holder: *holder, requester, exclusive: true });
                data = DataSource::Holder(*holder);
            } else {
                // Without cooperation a responsible holder writes back first, so that the
                // home's memory is current when it sends the data.
                let write_back = responsible && data == DataSource::Home;
                steps.push(Step::Invalidate { holder: *holder, write_back, keep_shared: false });
            }
        }
        return GetPlan { steps, data };
    }
    if own.is_valid() {
        return GetPlan { steps: Vec::new(), data: DataSource::Requester };
    }
    let exclusive_holder = entry.holder_in(&[CacheState::Exclusive, CacheState::Modified], requester);
    if cooperative {
        let responder = exclusive_holder
            .or_else(|| entry.holder_in(&[CacheState::Owned], requester))
            .or_else(|| entry.holder_in(&[CacheState::Forward], requester));
        if let Some(holder) = responder {
            return GetPlan { steps: vec![Step::Forward { holder, requester, exclusive: false }], data: DataSource::Holder(holder) };
        }
        return GetPlan { steps: Vec::new(), data: DataSource::Home };
    }
    let steps = exclusive_holder.map(|holder| Step::Invalidate { holder, write_back: true, keep_shared: true }).into_iter().collect();
    GetPlan { steps, data: DataSource::Home }
}

/// What the requester gets: its state, and where its data comes from (the plan's source,
/// or the home's memory when a holder asked to forward had no copy after all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub state: CacheState,
    pub data: DataSource,
}

/// After the steps of `plan`: the directory's new view, and what the requester gets.
/// `replies` answer the steps in order.
pub fn complete_get(entry: &mut DirectoryEntry, request: GetRequest, plan: &GetPlan, replies: &[StepReply], cooperative: bool) -> Grant {
    let requester = request.requester;
    let mut forwarder_had = None;
    let mut data = plan.data;
    for (step, reply) in plan.steps.iter().zip(replies) {
        match *step {
            Step::Forward { holder, exclusive, .. } => {
                match on_forward(reply.had, exclusive) {
                    None => {
                        // It had no copy: the home's memory serves (a protocol error, logged
                        // by the home; the model checks it never happens).
                        entry.holders.remove(&holder);
                        data = DataSource::Home;
                    }
                    Some(CacheState::Invalid) => {
                        forwarder_had = Some(reply.had);
                        entry.holders.remove(&holder);
                    }
                    Some(kept) => {
                        forwarder_had = Some(reply.had);
                        entry.holders.insert(holder, kept);
                    }
                }
            }
            Step::Invalidate { holder, keep_shared, .. } => {
                if keep_shared && reply.had.is_valid() {
                    entry.holders.insert(holder, CacheState::Shared);
                } else {
                    entry.holders.remove(&holder);
                }
            }
        }
    }
    let granted = if request.exclusive {
        CacheState::Modified
    } else {
        match forwarder_had {
            // M forwarded: the dirty copy stays with its holder as O; the requester shares.
            Some(CacheState::Modified) | Some(CacheState::Owned) => CacheState::Shared,
            Some(_) => CacheState::Forward,
            None => {
                let others = entry.holders.keys().any(|holder| *holder != requester);
                match (others, cooperative) {
                    (false, _) => CacheState::Exclusive,
                    (true, true) => {
                        // The home answers; its requester becomes the responder unless an
                        // O or F copy exists (it would have forwarded then).
                        if entry.holders.values().any(|state| matches!(state, CacheState::Forward | CacheState::Owned)) {
                            CacheState::Shared
                        } else {
                            CacheState::Forward
                        }
                    }
                    (true, false) => CacheState::Shared,
                }
            }
        }
    };
    entry.holders.insert(requester, granted);
    Grant { state: granted, data }
}

/// Reads of one block by `readers` (none of them holding a copy) answered in the same
/// transaction as the read just completed: the directory's view becomes exactly what the
/// reads one after the other would have made it (cooperative: each is forwarded by the copy
/// the one before it got, so the Forward state ends with the last; a dirty copy stays the
/// responder as O). No step runs: every reader gets the copy the transaction's first reader
/// got, passed on by the readers themselves ([`relay_tree`]). Each reader's grant is the
/// state the view records for it afterwards (an earlier reader's may have changed, as E
/// becomes S when the next reader comes).
pub fn complete_relayed_reads(entry: &mut DirectoryEntry, readers: &[Rank]) {
    for &requester in readers {
        let request = GetRequest { requester, exclusive: false, full_write: false };
        let plan = plan_get(entry, request, true);
        // Nobody acted on the block since the transaction began: the view's states are the
        // holders' own, so they are the steps' answers.
        let replies: Vec<StepReply> = plan
            .steps
            .iter()
            .map(|step| match *step {
                Step::Forward { holder, .. } | Step::Invalidate { holder, .. } => StepReply { had: entry.state_of(holder) },
            })
            .collect();
        complete_get(entry, request, &plan, &replies, true);
    }
}

/// How a rank holding a copy passes it on to the ranks of `list` (ranks, or whatever names
/// them): the copies it sends, one
/// after the other, each to a rank that passes it on to the list given with it. Each send
/// hands over half of what is left, so the copies spread in a binomial tree: a rank sends at
/// most ⌈log2(n + 1)⌉ copies, and the last of n ranks has its copy after as many rounds
/// (a chain would take n).
pub fn relay_tree<T>(mut list: Vec<T>) -> Vec<(T, Vec<T>)> {
    let mut sends = Vec::new();
    while !list.is_empty() {
        let mut theirs = list.split_off(list.len() / 2);
        let child = theirs.remove(0);
        sends.push((child, theirs));
    }
    sends
}

/// What the home does with an eviction notice of `rank` carrying dirty data or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    /// Forget the holder; with `write_back`, store the data sent first.
    Accept { write_back: bool },
    /// The directory no longer lists the node: the notice crossed a request that took the
    /// copy; its data is older than what exists elsewhere.
    Stale,
}

/// The home receives an eviction notice (`dirty`: it carries data).
pub fn accept_put(entry: &mut DirectoryEntry, rank: Rank, dirty: bool) -> PutOutcome {
    match entry.holders.remove(&rank) {
        None => PutOutcome::Stale,
        Some(state) => PutOutcome::Accept {
            // The directory's E may be M: the node's own word (`dirty`) decides then.
            write_back: dirty && matches!(state, CacheState::Exclusive | CacheState::Modified | CacheState::Owned),
        },
    }
}

/// A node is asked to forward its copy (in state `had`) for a read (`exclusive` false) or a
/// write: the state it keeps, or `None` if it has no copy.
pub fn on_forward(had: CacheState, exclusive: bool) -> Option<CacheState> {
    if !had.is_valid() {
        return None;
    }
    if exclusive {
        return Some(CacheState::Invalid);
    }
    Some(match had {
        CacheState::Modified | CacheState::Owned => CacheState::Owned,
        _ => CacheState::Shared,
    })
}

/// A node is asked to drop (or, with `keep_shared`, to downgrade) its copy: the state it
/// keeps, and whether it must send its data home first.
pub fn on_invalidate(had: CacheState, write_back: bool, keep_shared: bool) -> (CacheState, bool) {
    let sends = write_back && had.is_dirty();
    let kept = if keep_shared && had.is_valid() { CacheState::Shared } else { CacheState::Invalid };
    (kept, sends)
}

#[cfg(test)]
mod model;

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(holders: &[(Rank, CacheState)]) -> DirectoryEntry {
        DirectoryEntry { holders: holders.iter().copied().collect() }
    }

    fn read(requester: Rank) -> GetRequest {
        GetRequest { requester, exclusive: false, full_write: false }
    }

    #[test]
    fn reads_are_forwarded_by_the_responsible_copy_and_the_forward_state_migrates() {
        use CacheState::*;
        // E → S, requester F.
        let mut dir = entry(&[(1, Exclusive)]);
        let plan = plan_get(&dir, read(2), true);
        assert_eq!(plan.data, DataSource::Holder(1));
        assert_eq!(complete_get(&mut dir, read(2), &plan, &[StepReply { had: Exclusive }], true).state, Forward);
        assert_eq!(dir, entry(&[(1, Shared), (2, Forward)]));
        // F migrates to the next reader.
        let plan = plan_get(&dir, read(3), true);
        assert_eq!(plan.steps, vec![Step::Forward { holder: 2, requester: 3, exclusive: false }]);
        complete_get(&mut dir, read(3), &plan, &[StepReply { had: Forward }], true);
        assert_eq!(dir, entry(&[(1, Shared), (2, Shared), (3, Forward)]));
        // A dirty copy becomes O and answers without writing back.
        let mut dir = entry(&[(1, Exclusive)]);
        let plan = plan_get(&dir, read(2), true);
        assert_eq!(complete_get(&mut dir, read(2), &plan, &[StepReply { had: Modified }], true).state, Shared);
        assert_eq!(dir, entry(&[(1, Owned), (2, Shared)]));
        // Without cooperation the home serves, after a write-back.
        let mut dir = entry(&[(1, Exclusive)]);
        let plan = plan_get(&dir, read(2), false);
        assert_eq!(plan.steps, vec![Step::Invalidate { holder: 1, write_back: true, keep_shared: true }]);
        assert_eq!(plan.data, DataSource::Home);
        assert_eq!(complete_get(&mut dir, read(2), &plan, &[StepReply { had: Modified }], false).state, Shared);
    }

    #[test]
    fn writes_invalidate_every_other_copy_and_take_data_only_when_needed() {
        use CacheState::*;
        let write = |requester, full_write| GetRequest { requester, exclusive: true, full_write };
        let dir = entry(&[(1, Owned), (2, Shared), (3, Forward)]);
        let plan = plan_get(&dir, write(4, false), true);
        assert_eq!(plan.data, DataSource::Holder(1));
        let plan = plan_get(&dir, write(4, true), true);
        assert_eq!(plan.data, DataSource::Nothing, "a full-block write fetches nothing");
        assert!(plan.steps.iter().all(|step| matches!(step, Step::Invalidate { write_back: false, .. })));
        let mut dir = dir;
        let plan = plan_get(&dir, write(2, false), true);
        assert_eq!(plan.data, DataSource::Requester, "an upgrade keeps its own copy");
        let replies = vec![StepReply { had: Owned }, StepReply { had: Forward }];
        assert_eq!(complete_get(&mut dir, write(2, false), &plan, &replies, true).state, Modified);
        assert_eq!(dir, entry(&[(2, Modified)]));
    }

    #[test]
    fn relayed_reads_end_as_the_same_reads_one_after_the_other() {
        use CacheState::*;
        // From an F copy: every reader S but the last, which is the new F.
        let mut dir = entry(&[(1, Forward)]);
        let plan = plan_get(&dir, read(2), true);
        complete_get(&mut dir, read(2), &plan, &[StepReply { had: Forward }], true);
        complete_relayed_reads(&mut dir, &[3, 4]);
        assert_eq!(dir, entry(&[(1, Shared), (2, Shared), (3, Shared), (4, Forward)]));
        // From the home with nobody holding it: the first reader's E is shared on.
        let mut dir = entry(&[]);
        let plan = plan_get(&dir, read(2), true);
        assert_eq!(complete_get(&mut dir, read(2), &plan, &[], true).state, Exclusive);
        complete_relayed_reads(&mut dir, &[0, 1]);
        assert_eq!(dir, entry(&[(0, Shared), (1, Forward), (2, Shared)]));
        // From a dirty copy: it stays the responder (O), the readers share.
        let mut dir = entry(&[(1, Exclusive)]);
        let plan = plan_get(&dir, read(2), true);
        complete_get(&mut dir, read(2), &plan, &[StepReply { had: Modified }], true);
        complete_relayed_reads(&mut dir, &[3]);
        assert_eq!(dir, entry(&[(1, Owned), (2, Shared), (3, Shared)]));
    }

    #[test]
    fn a_relay_tree_reaches_every_rank_once_in_logarithmic_rounds() {
        assert!(relay_tree(Vec::<Rank>::new()).is_empty());
        assert_eq!(relay_tree(vec![7]), vec![(7, vec![])]);
        assert_eq!(relay_tree(vec![1, 2, 3]), vec![(2, vec![3]), (1, vec![])]);
        for n in 0..40u32 {
            // Round in which each rank gets its copy (the root holds it at round 0).
            let mut rounds = BTreeMap::new();
            let mut pending = vec![(0u32, (1..=n).collect::<Vec<_>>())];
            let mut most_sends = 0;
            while let Some((round, list)) = pending.pop() {
                let sends = relay_tree(list);
                most_sends = most_sends.max(sends.len());
                for (index, (child, theirs)) in sends.into_iter().enumerate() {
                    let at = round + 1 + index as u32;
                    assert!(rounds.insert(child, at).is_none(), "rank {child} got two copies");
                    pending.push((at, theirs));
                }
            }
            assert_eq!(rounds.len(), n as usize, "every rank got a copy");
            let depth = u32::BITS - n.leading_zeros(); // ⌈log2(n + 1)⌉
            assert!(rounds.values().all(|round| *round <= depth), "n {n}: {rounds:?}");
            assert!(most_sends as u32 <= depth);
        }
    }

    #[test]
    fn a_put_that_crossed_a_request_is_stale() {
        use CacheState::*;
        let mut dir = entry(&[(1, Exclusive)]);
        assert_eq!(accept_put(&mut dir, 1, true), PutOutcome::Accept { write_back: true });
        assert_eq!(accept_put(&mut dir, 1, true), PutOutcome::Stale);
        let mut dir = entry(&[(1, Shared)]);
        assert_eq!(accept_put(&mut dir, 1, true), PutOutcome::Accept { write_back: false }, "an S copy's data is never newer");
    }
}
