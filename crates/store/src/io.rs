//! Where the bytes of a write come from and where the bytes of a read go.
//!
//! The store copies data exactly once, straight between its chunk and the caller's buffer.
//! The caller's buffer may be a slice in this process, or memory of a client process reached
//! with cross-memory attach; these two traits hide the difference.

use std::mem::MaybeUninit;

use ringfs_proto::Errno;

/// Bytes to be written into a chunk.
pub trait ByteSource {
    /// Number of bytes this source delivers.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the next `destination.len()` bytes of the source into `destination`. On success
    /// every byte of `destination` has been written.
    fn read_into(&mut self, destination: &mut [MaybeUninit<u8>]) -> Result<(), Errno>;

    /// The remaining bytes, if they are already in this process (lets file writes skip a copy).
    fn as_slice(&self) -> Option<&[u8]> {
        None
    }
}

/// Views initialised bytes as possibly-uninitialised ones, to pass them to
/// [`ByteSource::read_into`] (which only ever writes initialised bytes).
pub fn as_uninit(bytes: &mut [u8]) -> &mut [MaybeUninit<u8>] {
    // SAFETY: MaybeUninit<u8> has the layout of u8, and writers through the returned slice
    // store only initialised values, so the bytes stay initialised.
    unsafe { &mut *(bytes as *mut [u8] as *mut [MaybeUninit<u8>]) }
}

/// Receiver of the bytes read from a chunk, in order.
pub trait ByteSink {
    fn write_from(&mut self, bytes: &[u8]) -> Result<(), Errno>;

    /// Appends `count` zero bytes (the unwritten part of a chunk).
    fn write_zeros(&mut self, count: usize) -> Result<(), Errno> {
        const ZEROS: [u8; 4096] = [0; 4096];
        let mut left = count;
        while left > 0 {
            let step = left.min(ZEROS.len());
            self.write_from(&ZEROS[..step])?;
            left -= step;
        }
        Ok(())
    }
}

impl ByteSource for &[u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }

    fn read_into(&mut self, destination: &mut [MaybeUninit<u8>]) -> Result<(), Errno> {
        if destination.len() > <[u8]>::len(self) {
            return Err(Errno::EINVAL);
        }
        let (head, tail) = self.split_at(destination.len());
        // SAFETY: same length, non-overlapping (destination is exclusively borrowed).
        unsafe { std::ptr::copy_nonoverlapping(head.as_ptr(), destination.as_mut_ptr().cast::<u8>(), head.len()) };
        *self = tail;
        Ok(())
    }

    fn as_slice(&self) -> Option<&[u8]> {
        Some(self)
    }
}

impl ByteSink for Vec<u8> {
    fn write_from(&mut self, bytes: &[u8]) -> Result<(), Errno> {
        self.extend_from_slice(bytes);
        Ok(())
    }

    fn write_zeros(&mut self, count: usize) -> Result<(), Errno> {
        self.resize(self.len() + count, 0);
        Ok(())
    }
}

/// Allocates a buffer of `capacity` bytes whose pages are already mapped.
///
/// First-touch page faults cost about 8x a copy on this class of VM (docs/PERFORMANCE.md), so
/// large buffers are populated with one `madvise(MADV_POPULATE_WRITE)` call instead of one
/// fault per page. Small buffers are left to the allocator.
pub fn allocate_buffer(capacity: usize) -> Vec<u8> {
    const POPULATE_THRESHOLD: usize = 64 * 1024;
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    let buffer: Vec<u8> = Vec::with_capacity(capacity);
    if capacity >= POPULATE_THRESHOLD {
        let start = buffer.as_ptr() as usize;
        let page = 4096;
        let aligned = (start + page - 1) & !(page - 1);
        let end = (start + capacity) & !(page - 1);
        if end > aligned {
            // SAFETY: the range lies inside this vector's allocation; populating pages only
            // maps them, it does not change their (uninitialised) contents as seen by Rust.
            // Failure (old kernels) just leaves the pages to be faulted in on first use.
            unsafe {
                libc::madvise(aligned as *mut libc::c_void, end - aligned, MADV_POPULATE_WRITE);
            }
        }
    }
    buffer
}
