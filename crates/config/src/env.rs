//! The environment variables ringfs reads and sets, each named once (README lists them for
//! users). `ringfs start` prints the client's exports; `ringfs run` sets them for its command.

// The cluster a client joins.
/// Comma-separated addresses of servers to fetch the member list from.
pub const SERVER: &str = "RINGFS_SERVER";
/// The job's secret, required in every connection's handshake.
pub const SECRET: &str = "RINGFS_SECRET";
/// The cluster's run directory (addresses of restarted servers, the secret).
pub const RUN_DIR: &str = "RINGFS_RUN_DIR";

// How a client behaves.
/// Chunk size of new files (a [`crate::ByteSize`]).
pub const CHUNK_SIZE: &str = "RINGFS_CHUNK_SIZE";
/// How long a request waits for its answer, in milliseconds.
pub const TIMEOUT_MS: &str = "RINGFS_TIMEOUT_MS";
/// `0` turns the same-host fast path (Unix sockets, cross-memory attach) off.
pub const LOCAL: &str = "RINGFS_LOCAL";
/// Microseconds a client polls for an answer before it sleeps (0: never).
pub const POLL_US: &str = "RINGFS_POLL_US";
/// Seconds after which a connection unused is closed (and reopened when needed).
pub const IDLE_CLOSE_S: &str = "RINGFS_IDLE_CLOSE_S";
/// Log level of the command line and servers (`error` … `trace`).
pub const LOG: &str = "RINGFS_LOG";

// The FUSE mount.
/// `1`: take requests from the kernel's io_uring queues (`ringfs mount --io-uring`).
pub const FUSE_IO_URING: &str = "RINGFS_FUSE_IO_URING";

// The LD_PRELOAD library.
/// The prefix under which the library shows ringfs.
pub const MOUNT: &str = "RINGFS_MOUNT";
/// Descriptors handed on across `exec` (set by the library itself).
pub const PRELOAD_FDS: &str = "RINGFS_PRELOAD_FDS";
/// A working directory inside ringfs handed on across `exec` (set by the library itself).
pub const PRELOAD_CWD: &str = "RINGFS_PRELOAD_CWD";

// The global memory's ranks.
/// This process's rank.
pub const GMEM_RANK: &str = "RINGFS_GMEM_RANK";
/// How many ranks the job has.
pub const GMEM_RANKS: &str = "RINGFS_GMEM_RANKS";
/// The job's id (ranks of one job share it).
pub const GMEM_JOB: &str = "RINGFS_GMEM_JOB";
/// The size of each rank's block cache (a [`crate::ByteSize`]; unset: no cache).
pub const GMEM_CACHE: &str = "RINGFS_GMEM_CACHE";
/// `0`: caches do not serve each other (the homes serve every miss).
pub const GMEM_COOP: &str = "RINGFS_GMEM_COOP";
/// `1`: reads of a block meeting at its home are relayed in a tree.
pub const GMEM_RELAY: &str = "RINGFS_GMEM_RELAY";
/// Blocks a rank prefetches ahead of a sequential run of reads.
pub const GMEM_PREFETCH: &str = "RINGFS_GMEM_PREFETCH";
/// The address a rank's cache endpoint listens on.
pub const GMEM_LISTEN: &str = "RINGFS_GMEM_LISTEN";
/// An emulated link for global-memory data at each rank: megabytes per second.
pub const GMEM_NET_MBPS: &str = "RINGFS_GMEM_NET_MBPS";
/// An emulated link for global-memory data at each rank: latency in microseconds.
pub const GMEM_NET_LATENCY_US: &str = "RINGFS_GMEM_NET_LATENCY_US";
/// Which benchmark application a rank process runs (`ringfs bench gmem`).
pub const GMEM_APP: &str = "RINGFS_GMEM_APP";
/// The benchmark's parameters handed to its rank processes.
pub const GMEM_BENCH: &str = "RINGFS_GMEM_BENCH";
