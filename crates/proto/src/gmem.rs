//! The messages of the global memory (PGAS arrays held by the servers, see
//! `crates/gmem`): collective allocation, block reads and writes, atomics, barriers.
//!
//! A global array is cut into blocks of `block_size` bytes; each block has a *home* server
//! that holds it (in DRAM, spilling to its SSD). A job's ranks meet at a *coordinator*
//! server (chosen by the job's id) for collective steps: the allocation of an array (which
//! decides the homes) and barriers.

use crate::{wire_enum, wire_struct};

wire_enum! {
    /// Which rank's home holds a block (the homes are the servers named in
    /// [`ArrayLayout::homes`]).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Distribution {
        /// Rank *r* homes the *r*-th contiguous part of the array (blocks split evenly).
        0 => Block,
        /// Runs of this many blocks go to the ranks in turn.
        1 => Cyclic(u32),
        /// Each block on a server picked by a hash of the array and the block.
        2 => Hashed,
    }
}

wire_enum! {
    /// Whether the ranks cache an array's blocks (every rank of a job says the same).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum CacheMode {
        /// Every access goes to the block's home.
        0 => Uncached,
        /// Ranks cache blocks, kept coherent by the homes' directories; a rank holding a
        /// copy serves the next reader (cooperative caching).
        1 => Cooperative,
        /// Ranks cache blocks, but only homes serve data (the baseline of cooperation).
        2 => HomeServed,
        /// Cooperative, and the reads of a block that queue at its home while it is busy
        /// are answered together: one copy leaves the block's source and the readers relay
        /// it to each other in a binomial tree (`coherence::relay_tree`).
        3 => Relayed,
    }
}

/// `GmemAlloc`, from every rank of a job to its coordinator: the `sequence`-th collective
/// allocation of the job. Answered with `GmemArray` once every rank has asked (EAGAIN
/// before: the rank asks again).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GmemAlloc {
    pub job: u64,
    pub sequence: u64,
    pub rank: u32,
    pub ranks: u32,
    /// The host the rank runs on (its Block and Cyclic parts are homed by a server there).
    pub host_id: u64,
    pub len: u64,
    pub block_size: u32,
    pub distribution: Distribution,
    pub cache: CacheMode,
    /// Where the rank's cache answers homes and other ranks (empty without a cache).
    pub endpoint: String,
}
wire_struct!(GmemAlloc { job, sequence, rank, ranks, host_id, len, block_size, distribution, cache, endpoint });

/// What every rank and every home knows of an array.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayLayout {
    pub array: u64,
    pub len: u64,
    pub block_size: u32,
    pub distribution: Distribution,
    /// Block and Cyclic: the server homing each rank's part, by rank. Hashed: the servers
    /// blocks are spread over.
    pub homes: Vec<String>,
    pub cache: CacheMode,
    /// With a cache: each rank's endpoint, by rank.
    pub nodes: Vec<String>,
}
wire_struct!(ArrayLayout { array, len, block_size, distribution, homes, cache, nodes });

/// `CoGet`, from a rank's cache to a block's home: the rank needs a copy it may read (or,
/// `exclusive`, write; `full_write`: it overwrites the whole block, no data needed).
/// Answered with `CoGrant`, the block's bytes in the data section when the home sends them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoGet {
    pub array: u64,
    pub block: u64,
    pub rank: u32,
    pub exclusive: bool,
    pub full_write: bool,
    /// Names this request among the rank's (a number it never used before): the `CoFill`
    /// answering it carries it, so a copy meant for an earlier request is never taken.
    pub request: u64,
}
wire_struct!(CoGet { array, block, rank, exclusive, full_write, request });

/// A rank to pass a block's copy on to, and its request the copy answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelayTarget {
    pub rank: u32,
    pub request: u64,
}
wire_struct!(RelayTarget { rank, request });

/// What a rank's cache gets: its state (`coherence::CacheState` code) and where the data
/// came from: 0 the home (in the data section), 1 another rank (delivered by `CoFill`,
/// before or after this answer), 2 its own copy, 3 none (a full write), 4 the home, by
/// `CoFill` (a relayed batch of reads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoGrant {
    pub state: u8,
    pub source: u8,
}
wire_struct!(CoGrant { state, source });

/// `CoPut`: a rank drops its copy of a block (with the bytes in the data section when
/// `dirty`). Answered `Done`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoPut {
    pub array: u64,
    pub block: u64,
    pub rank: u32,
    pub dirty: bool,
}
wire_struct!(CoPut { array, block, rank, dirty });

/// `CoForward`, from a home to a rank holding a block: send your copy to rank `requester`
/// (`CoFill`), then keep the state the protocol says. Answered with `Count`: the state the
/// copy had (`Invalid`: none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoForward {
    pub array: u64,
    pub block: u64,
    pub requester: u32,
    /// The requester's request (`CoGet::request`), for its `CoFill`.
    pub request: u64,
    pub exclusive: bool,
    /// The state the home's directory records for the holder (E for E or M): a holder
    /// whose own grant for the block is still on its way waits for it before answering.
    pub expected: u8,
    /// Ranks the requester relays the copy to (a batch of reads: `CoFill::relay`).
    pub relay: Vec<RelayTarget>,
}
wire_struct!(CoForward { array, block, requester, request, exclusive, expected, relay });

/// `CoInvalidate`, from a home to a rank holding a block: drop the copy (or keep it as S
/// with `keep_shared`); with `write_back`, send it in the answer's data section if dirty.
/// Answered with `Count`: the state the copy had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoInvalidate {
    pub array: u64,
    pub block: u64,
    pub write_back: bool,
    pub keep_shared: bool,
    /// As in [`CoForward`].
    pub expected: u8,
}
wire_struct!(CoInvalidate { array, block, write_back, keep_shared, expected });

/// A byte range inside one block of an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRange {
    pub array: u64,
    pub block: u64,
    pub offset: u32,
    pub len: u32,
}
wire_struct!(BlockRange { array, block, offset, len });

/// Sets a word to `new` if it equals `expected`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompareSwap {
    pub expected: u64,
    pub new: u64,
}
wire_struct!(CompareSwap { expected, new });

wire_enum! {
    /// A 64-bit atomic operation on an aligned word of a block.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum AtomicOp {
        0 => FetchAdd(u64),
        1 => CompareSwap(CompareSwap),
    }
}

impl AtomicOp {
    /// The word after `op` on `value`.
    pub fn apply(self, value: u64) -> u64 {
        match self {
            AtomicOp::FetchAdd(add) => value.wrapping_add(add),
            AtomicOp::CompareSwap(swap) if swap.expected == value => swap.new,
            AtomicOp::CompareSwap(_) => value,
        }
    }
}

/// `GmemAtomic`: `op` on the little-endian word at `at.offset` (8-byte aligned, `at.len` 8);
/// answered with `Count` (the word before).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GmemAtomic {
    pub at: BlockRange,
    pub op: AtomicOp,
}
wire_struct!(GmemAtomic { at, op });

/// `GmemBarrier`: rank `rank` of `ranks` reached barrier number `epoch` of `job`. Answered
/// `Done` once all have (EAGAIN before: the rank asks again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GmemBarrier {
    pub job: u64,
    pub epoch: u64,
    pub rank: u32,
    pub ranks: u32,
}
wire_struct!(GmemBarrier { job, epoch, rank, ranks });

/// `GmemDefine` (server to server, from the coordinator to every server): an array exists
/// (answered `Done`); `GmemDrop` with the same id: it is gone, with its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArrayOnly {
    pub array: u64,
}
wire_struct!(ArrayOnly { array });

/// `GmemFree`: rank `rank` of `ranks` frees `array` (collective).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GmemFree {
    pub job: u64,
    pub array: u64,
    pub rank: u32,
    pub ranks: u32,
}
wire_struct!(GmemFree { job, array, rank, ranks });

/// `CoFill`, from a rank (or a home) to a rank that requested a block: its bytes, in the
/// data section, for the receiver's request `request` (refused, `EPROTO`, when that request
/// is not under way). The receiver passes them on to the ranks in `relay`, in the binomial
/// tree `coherence::relay_tree` gives (a batch of reads answered at once). Answered `Done`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoFill {
    pub array: u64,
    pub block: u64,
    pub request: u64,
    pub relay: Vec<RelayTarget>,
}
wire_struct!(CoFill { array, block, request, relay });
