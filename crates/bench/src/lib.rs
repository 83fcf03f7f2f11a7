//! Benchmarks that run one workload on ringfs and on a POSIX directory in the same run, so
//! that every performance claim is a measured ratio.
//!
//! - [`target`]: the two kinds of targets behind one small interface.
//! - [`workers`]: N worker processes driven phase by phase by a coordinator.
//! - [`micro`]: `ringfs bench micro`, sequential bandwidth and metadata rates.
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

pub mod micro;
pub mod target;
pub mod workers;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum BenchError {
    #[error("benchmark worker failed: {0}")]
    Worker(String),
    #[error("{0}")]
    Setup(String),
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
