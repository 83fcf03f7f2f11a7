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
}
wire_struct!(GmemAlloc { job, sequence, rank, ranks, host_id, len, block_size, distribution });

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
}
wire_struct!(ArrayLayout { array, len, block_size, distribution, homes });

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
