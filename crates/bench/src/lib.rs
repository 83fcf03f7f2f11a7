//! Benchmarks that run one workload on ringfs and on a POSIX directory in the same run, so
//! that every performance claim is a measured ratio.
//!
//! - [`target`]: the two kinds of targets behind one small interface.
//! - [`workers`]: N worker processes driven phase by phase by a coordinator.
//! - [`micro`]: `ringfs bench micro`, sequential bandwidth and metadata rates.
//! - [`io500`]: `ringfs bench io500`, the 12 scored IO500 phases and IO500's score.
//! - [`connections`]: `ringfs bench connections`, a server holding thousands of clients.
//! - [`flush`]: `ringfs bench flush`, a compute/snapshot job against each flush policy of
//!   cache mode.
//! - [`ucx`]: `ringfs bench ucx`, the UCX frame transport against `ucx_perftest`.
//! - [`rpc_trip`]: `ringfs bench rpc`, the request round trip and 1 MiB bandwidth of the
//!   client against one server of a running cluster, on its transport (TCP or UCX).
//!
//! The `ringfs` command wires these to `ringfs bench …` and starts the worker processes as
//! `ringfs bench worker …`.
//!
//! ```no_run
//! use ringfs_bench::micro::{self, MicroConfig};
//! use ringfs_bench::target::TargetSpec;
//! let config = MicroConfig { processes: 2, bytes_per_process: 64 << 20, block_bytes: 1 << 20,
//!     files_per_process: 1000, repeats: 3, work_dir: micro::work_dir_name() };
//! let targets = [TargetSpec::Posix("/dev/shm".into())];
//! let results = micro::run("/usr/local/bin/ringfs".as_ref(), &targets, &[], &config).unwrap();
//! print!("{}", micro::report(&results, false));
//! ```

pub mod canvas;
pub mod connections;
pub mod flush;
pub mod gmem;
pub mod gmem_apps;
pub mod gmem_verdict;
pub mod io500;
pub mod micro;
pub mod rpc_trip;
pub mod target;
pub mod ucx;
pub mod workers;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum BenchError {
    #[error("benchmark worker failed: {0}")]
    Worker(String),
    #[error("{0}")]
    Setup(String),
}

/// Touches `bytes` of fresh memory and gives it back, so that the runs that follow get pages
/// the machine has mapped before.
///
/// On a VM the first touch of a guest page since boot also costs the host a page fault:
/// measured here, ~10 µs per 4 KiB page against ~1.5 µs for a page the guest has used before
/// (docs/PERFORMANCE.md). Without a warm-up, whichever target runs first pays that for all
/// the memory it fills and the next one inherits the warmed pages.
pub fn warm_memory(bytes: u64) {
    const PIECE: usize = 64 << 20;
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    let mut left = bytes as usize;
    while left > 0 {
        let len = left.min(PIECE);
        // SAFETY: a private anonymous mapping owned by this function and unmapped before it
        // returns; nothing else refers to it.
        unsafe {
            let address =
                libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
            if address == libc::MAP_FAILED {
                return;
            }
            libc::madvise(address, len, MADV_POPULATE_WRITE);
            libc::munmap(address, len);
        }
        left -= len;
    }
}

/// Median of a list of measurements (mean of the middle two for even counts; 0 if empty).
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 { sorted[middle] } else { (sorted[middle - 1] + sorted[middle]) / 2.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
