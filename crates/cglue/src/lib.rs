//! The C-facing glue that the C library (`ringfs-ffi`, `libringfs.so`) and the LD_PRELOAD
//! library (`ringfs-preload`) share: both take the same C arguments and fill the same C
//! structures, and before this crate each wrote its own copy (which drifted: one filled
//! `st_rdev`, the other did not).
//!
//! What is here: `errno` and the guard that turns a Rust error or panic into `-1` with
//! `errno` set ([`call`]); C strings, buffers and offsets as Rust values ([`arguments`]); a ringfs
//! [`Stat`](ringfs_client::Stat) as `struct stat` and `struct statx` ([`stat`]); the two
//! timespecs of `utimensat`/`futimens` ([`times`]); `fcntl` and `flock` lock requests
//! resolved to a lock owner, kind and range, and the files this process holds locks on
//! ([`locks`]). What is not: anything that talks to servers (the callers hold the
//! [`Client`](ringfs_client::Client)) or keeps descriptors.
//!
//! ```
//! let stat = ringfs_client::Stat { mode: libc::S_IFREG | 0o644, size: 10, ..Default::default() };
//! let out = ringfs_cglue::stat::to_stat(&stat);
//! assert_eq!((out.st_mode, out.st_size, out.st_dev), (libc::S_IFREG | 0o644, 10, ringfs_cglue::stat::DEVICE));
//! let value = ringfs_cglue::call::guard(-1, || Err::<i32, _>(ringfs_client::Errno::ENOENT));
//! assert_eq!((value, ringfs_cglue::call::errno()), (-1, libc::ENOENT));
//! ```

pub mod arguments;
pub mod call;
pub mod locks;
pub mod stat;
pub mod times;
