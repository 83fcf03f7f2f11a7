//! Global memory: a partitioned global address space (PGAS) held by the ringfs servers, in
//! their DRAM and spilling to their node-local SSDs, so a computation's arrays may be larger
//! than the DRAM of all its nodes (the vGASNet design; `docs/ARCHITECTURE.md`, "Global
//! memory").
//!
//! A job's processes (*ranks*) make a [`World`]; collectively they allocate
//! [`GlobalArray`]s, cut into blocks that live at *home* servers chosen by a
//! [`Distribution`]. Ranks copy bytes between an array and their own memory with `get` and
//! `put` (blocking, non-blocking with a handle, or non-blocking completed by
//! [`World::quiet`]), strided 2-D tiles, and 64-bit atomics; they synchronize with
//! [`World::barrier`]. Errors are [`Errno`] values: EFAULT outside an array, ESTALE for a
//! freed array, EIO when a home does not answer within the request deadline. What a rank
//! may rely on is in `docs/CONSISTENCY.md` ("Global memory").
//!
//! This crate keeps no cache: every access goes to the block's home.
//!
//! ```no_run
//! use ringfs_gmem::{Distribution, World};
//! let world = World::init().unwrap();                       // rank and size from the launcher
//! let array = world.alloc(1 << 30, Distribution::Block, 256 << 10).unwrap(); // collective
//! array.put(world.rank() as u64 * 8, &42u64.to_le_bytes()).unwrap();
//! world.barrier().unwrap();
//! let mut word = [0u8; 8];
//! array.get(0, &mut word).unwrap();
//! ```

mod array;
mod cache;
mod layout;
mod pending;
mod ranks;
mod typed;
mod world;

pub use array::{GlobalArray, Tile};
pub use cache::{CacheConfig, CacheStats};
pub use pending::{GetHandle, PutHandle};
pub use ranks::{RankIdentity, identity_from_env};
pub use ringfs_proto::Errno;
pub use ringfs_proto::gmem::Distribution;
pub use typed::{GlobalArrayOf, Plain};
pub use world::World;

/// The result of a global-memory call.
pub type Result<T> = std::result::Result<T, Errno>;

/// Default block size of an array: large enough to move at the SSD's speed, small enough
/// that a scan of a few blocks is not all padding.
pub const DEFAULT_BLOCK_SIZE: u32 = 256 << 10;
