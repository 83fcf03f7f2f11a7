//! The decoder fuzzer: many mutated encodings of every message, decoded as requests and as
//! responses. Whatever the bytes, decoding returns an error or a message — never a panic —
//! allocates at most a small multiple of the input, and a message it returns encodes to bytes
//! that decode to the same message.
//!
//! `RINGFS_FUZZ_INPUTS` sets the number of inputs (default 1,000,000, about 1 s in a debug
//! build) and `RINGFS_FUZZ_SEED` the seed; docs/TESTING.md records the long runs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use super::mutate::{Rng, mutate};
use super::samples;
use super::*;

/// Counts the bytes the current thread allocates, so one decode's allocations can be bounded.
struct CountingAllocator;

thread_local! {
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the thread-local counter is a const-initialised
// `Cell`, which does not allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATED.try_with(|allocated| allocated.set(allocated.get() + layout.size()));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(pointer, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn allocated_by(work: impl FnOnce()) -> usize {
    let before = ALLOCATED.with(Cell::get);
    work();
    ALLOCATED.with(Cell::get) - before
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|text| text.parse().ok()).unwrap_or(default)
}

fn encodings() -> Vec<Vec<u8>> {
    let mut encodings = Vec::new();
    for request in samples::requests() {
        let mut body = Vec::new();
        request.encode(&mut body);
        encodings.push(body);
    }
    for response in samples::responses() {
        let mut body = Vec::new();
        response.encode(&mut body);
        encodings.push(body);
    }
    encodings
}

/// Decodes `body` both ways and checks the three properties; returns how many decoded.
fn check(body: &[u8]) -> usize {
    let mut decoded = 0;
    let mut request = None;
    let bytes = allocated_by(|| request = Request::decode(body).ok());
    assert!(bytes <= 64 * body.len() + 4096, "decoding {} bytes as a request allocated {bytes}: {body:02x?}", body.len());
    if let Some(request) = request {
        decoded += 1;
        let mut again = Vec::new();
        request.encode(&mut again);
        assert_eq!(Request::decode(&again).as_ref(), Ok(&request), "{body:02x?}");
    }
    let mut response = None;
    let bytes = allocated_by(|| response = Response::decode(body).ok());
    assert!(bytes <= 64 * body.len() + 4096, "decoding {} bytes as a response allocated {bytes}: {body:02x?}", body.len());
    if let Some(response) = response {
        decoded += 1;
        let mut again = Vec::new();
        response.encode(&mut again);
        assert_eq!(Response::decode(&again).as_ref(), Ok(&response), "{body:02x?}");
    }
    decoded
}

#[test]
fn mutated_messages_decode_to_errors_or_to_messages_that_round_trip() {
    let inputs = env_number("RINGFS_FUZZ_INPUTS", 1_000_000);
    let seed = env_number("RINGFS_FUZZ_SEED", 1);
    let encodings = encodings();
    let mut rng = Rng::new(seed);
    let mut decoded = 0;
    for _ in 0..inputs {
        let mut body = encodings[rng.below(encodings.len() as u64) as usize].clone();
        let donor = &encodings[rng.below(encodings.len() as u64) as usize];
        mutate(&mut rng, &mut body, donor);
        decoded += check(&body);
    }
    eprintln!("fuzzed {inputs} inputs (seed {seed}); {decoded} decoded to a message");
    // The mutations must not be so destructive that nothing decodes: then the fuzzer would
    // test only the first bytes of each message.
    assert!(decoded as u64 > inputs / 20, "only {decoded} of {inputs} mutated inputs decoded");
}
