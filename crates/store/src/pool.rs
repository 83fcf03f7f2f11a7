//! Buffers of removed chunks, kept for the next chunks.
//!
//! A fresh buffer costs the kernel a zeroed page for every 4 KiB (and the VM a first touch);
//! a removed chunk's buffer already has its pages. Jobs that write, delete and write again
//! (checkpoints, benchmarks) therefore reuse memory at the speed of a copy. The pool keeps
//! at most a bounded number of bytes; what does not fit is freed.

use parking_lot::Mutex;

use crate::io::allocate_buffer;

/// Buffers smaller than this are left to the allocator.
const SMALLEST_POOLED: usize = 64 * 1024;

pub(crate) struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
    limit_bytes: usize,
}

impl BufferPool {
    pub fn new(limit_bytes: usize) -> BufferPool {
        BufferPool { free: Mutex::new(Vec::new()), limit_bytes }
    }

    fn free(&self) -> parking_lot::MutexGuard<'_, Vec<Vec<u8>>> {
        self.free.lock()
    }

    /// An empty buffer with room for at least `capacity` bytes: a pooled one no more than
    /// twice that size if there is one, a new one otherwise.
    pub fn take(&self, capacity: usize) -> Vec<u8> {
        if capacity >= SMALLEST_POOLED {
            let mut free = self.free();
            if let Some(position) = free.iter().position(|buffer| buffer.capacity() >= capacity && buffer.capacity() <= capacity * 2) {
                let mut buffer = free.swap_remove(position);
                buffer.clear();
                return buffer;
            }
        }
        allocate_buffer(capacity)
    }

    /// Keeps `buffer` for reuse if it is worth it and the pool has room.
    pub fn give(&self, buffer: Vec<u8>) {
        if buffer.capacity() < SMALLEST_POOLED {
            return;
        }
        let mut free = self.free();
        let pooled: usize = free.iter().map(Vec::capacity).sum();
        if pooled + buffer.capacity() <= self.limit_bytes {
            free.push(buffer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_buffers_come_back_for_similar_sizes_only() {
        let pool = BufferPool::new(4 << 20);
        let buffer = pool.take(1 << 20);
        let address = buffer.as_ptr();
        pool.give(buffer);
        assert_ne!(pool.take(4 << 20).capacity(), 0, "too large a request allocates anew");
        let small = pool.take(100_000);
        assert!(small.as_ptr() != address, "a 1 MiB buffer is not wasted on 100 KB");
        let again = pool.take(1 << 20);
        assert_eq!(again.as_ptr(), address);
        assert!(again.is_empty());
        pool.give(vec![0u8; 10]);
        pool.give(Vec::with_capacity(8 << 20));
        assert!(pool.free().is_empty(), "small buffers and buffers beyond the limit are not kept");
    }
}
