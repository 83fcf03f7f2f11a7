//! Measures what a 4 KiB page of memory costs to fill the first time, and again right after
//! the same amount was filled and given back: the reason `ringfs bench io500` warms memory
//! before it measures (`--warm-memory`).
//!
//! ```text
//! cargo run --release -p ringfs-bench --example first_touch -- 8192
//! ```
//!
//! The argument is how many MiB to fill (default 4096). On a VM whose guest memory the host
//! maps lazily, pages the guest has never touched since it booted cost several times more
//! than pages it has used before; on bare metal both rounds cost about the same. Only memory
//! beyond what earlier programs touched shows the first cost.

use std::time::Instant;

/// Fills `mebibytes` MiB in 1 MiB buffers and returns microseconds per 4 KiB page.
fn fill(mebibytes: usize) -> f64 {
    let started = Instant::now();
    let buffers: Vec<Vec<u8>> = (0..mebibytes).map(|_| vec![1u8; 1 << 20]).collect();
    let per_page = started.elapsed().as_secs_f64() * 1e6 / (mebibytes * 256) as f64;
    drop(buffers);
    per_page
}

fn main() {
    let mebibytes: usize = std::env::args().nth(1).and_then(|text| text.parse().ok()).unwrap_or(4096);
    println!("first fill of {mebibytes} MiB:  {:.2} µs per 4 KiB page", fill(mebibytes));
    println!("second fill of {mebibytes} MiB: {:.2} µs per 4 KiB page", fill(mebibytes));
}
