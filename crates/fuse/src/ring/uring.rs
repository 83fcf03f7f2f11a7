//! The least of io_uring a FUSE ring thread needs: one ring with 128-byte submission entries
//! (the FUSE command sits in the extra 64 bytes), one command in flight at a time, submitted
//! and waited for with `io_uring_enter`. Written on the system calls directly: the io_uring
//! crates cannot set the `len` of a `URING_CMD` entry, which FUSE's `REGISTER` needs.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

const IORING_SETUP_SQE128: u32 = 1 << 10;
const IORING_SETUP_SINGLE_ISSUER: u32 = 1 << 12;
const IORING_SETUP_DEFER_TASKRUN: u32 = 1 << 13;
const IORING_FEAT_SINGLE_MMAP: u32 = 1 << 0;
const IORING_ENTER_GETEVENTS: u32 = 1 << 0;
const IORING_OFF_SQ_RING: i64 = 0;
const IORING_OFF_CQ_RING: i64 = 0x0800_0000;
const IORING_OFF_SQES: i64 = 0x1000_0000;
const IORING_OP_URING_CMD: u8 = 46;

/// A submission entry of a ring set up with `IORING_SETUP_SQE128`.
pub const ENTRY_SIZE: usize = 128;
const COMPLETION_SIZE: usize = 16;

#[repr(C)]
#[derive(Default)]
struct SubmissionOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    flags: u32,
    dropped: u32,
    array: u32,
    reserved: u32,
    user_addr: u64,
}

#[repr(C)]
#[derive(Default)]
struct CompletionOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    overflow: u32,
    cqes: u32,
    flags: u32,
    reserved: u32,
    user_addr: u64,
}

#[repr(C)]
#[derive(Default)]
struct Params {
    sq_entries: u32,
    cq_entries: u32,
    flags: u32,
    sq_thread_cpu: u32,
    sq_thread_idle: u32,
    features: u32,
    wq_fd: u32,
    reserved: [u32; 3],
    sq_off: SubmissionOffsets,
    cq_off: CompletionOffsets,
}

/// A shared mapping of the ring's memory, unmapped on drop.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn new(fd: RawFd, len: usize, offset: i64) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of the ring's memory; nothing else refers to it.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_POPULATE, fd, offset)
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { base: NonNull::new(base.cast()).ok_or_else(|| io::Error::other("mmap gave a null address"))?, len })
    }

    /// The `u32` the kernel shares at `offset` (a head, a tail, a mask).
    fn word(&self, offset: u32) -> &AtomicU32 {
        assert!(offset as usize + 4 <= self.len);
        // SAFETY: in bounds (checked) and 4-byte aligned (the kernel's offsets are); the
        // kernel and this thread access it atomically.
        unsafe { &*self.base.as_ptr().add(offset as usize).cast::<AtomicU32>() }
    }

    fn at(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(offset + len <= self.len);
        // SAFETY: in bounds (checked).
        unsafe { self.base.as_ptr().add(offset) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped by `new` with this length; no reference outlives `self`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// One io_uring, used by the thread that made it (set up as its single issuer).
pub struct Uring {
    // (Field order is drop order: the mappings go before the ring's descriptor.)
    rings: Mapping,
    /// The completion ring when the kernel maps it apart from the submission ring.
    completions: Option<Mapping>,
    entries: Mapping,
    fd: OwnedFd,
    sq: SubmissionOffsets,
    cq: CompletionOffsets,
    /// Entries queued and not yet handed to the kernel.
    unsubmitted: u32,
}

impl Uring {
    /// A ring of `depth` entries (a power of two).
    pub fn new(depth: u32) -> io::Result<Uring> {
        let (fd, params) = Self::setup(depth, IORING_SETUP_SQE128 | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN)
            .or_else(|_| Self::setup(depth, IORING_SETUP_SQE128))?;
        let raw = fd.as_raw_fd();
        let sq_len = params.sq_off.array as usize + params.sq_entries as usize * 4;
        let cq_len = params.cq_off.cqes as usize + params.cq_entries as usize * COMPLETION_SIZE;
        let (rings, completions) = if params.features & IORING_FEAT_SINGLE_MMAP != 0 {
            (Mapping::new(raw, sq_len.max(cq_len), IORING_OFF_SQ_RING)?, None)
        } else {
            (Mapping::new(raw, sq_len, IORING_OFF_SQ_RING)?, Some(Mapping::new(raw, cq_len, IORING_OFF_CQ_RING)?))
        };
        let entries = Mapping::new(raw, params.sq_entries as usize * ENTRY_SIZE, IORING_OFF_SQES)?;
        Ok(Uring { rings, completions, entries, fd, sq: params.sq_off, cq: params.cq_off, unsubmitted: 0 })
    }

    fn setup(depth: u32, flags: u32) -> io::Result<(OwnedFd, Params)> {
        let mut params = Params { flags, ..Params::default() };
        // SAFETY: `params` is a valid `io_uring_params` the call fills in.
        let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, depth, &mut params as *mut Params) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor this ring owns.
        Ok((unsafe { OwnedFd::from_raw_fd(fd as RawFd) }, params))
    }

    fn completion_ring(&self) -> &Mapping {
        self.completions.as_ref().unwrap_or(&self.rings)
    }

    /// Queues `entry` (handed to the kernel by the next [`Self::submit`] or [`Self::wait`]).
    pub fn push(&mut self, entry: &[u8; ENTRY_SIZE]) -> io::Result<()> {
        let mask = self.rings.word(self.sq.ring_mask).load(Ordering::Relaxed);
        let head = self.rings.word(self.sq.head).load(Ordering::Acquire);
        let tail = self.rings.word(self.sq.tail).load(Ordering::Relaxed);
        if tail.wrapping_sub(head) > mask {
            return Err(io::Error::other("the io_uring submission queue is full"));
        }
        let index = tail & mask;
        let slot = self.entries.at(index as usize * ENTRY_SIZE, ENTRY_SIZE);
        // SAFETY: the slot is this ring's, between head and tail: the kernel does not read it
        // until the tail moves past it (below).
        unsafe { std::ptr::copy_nonoverlapping(entry.as_ptr(), slot, ENTRY_SIZE) };
        let array = self.rings.at(self.sq.array as usize + index as usize * 4, 4).cast::<u32>();
        // SAFETY: in bounds (checked by `at`), aligned, and the kernel reads it only after
        // the tail's release below.
        unsafe { array.write(index) };
        self.rings.word(self.sq.tail).store(tail.wrapping_add(1), Ordering::Release);
        self.unsubmitted += 1;
        Ok(())
    }

    fn enter(&mut self, wait_for: u32) -> io::Result<()> {
        let flags = if wait_for > 0 { IORING_ENTER_GETEVENTS } else { 0 };
        // SAFETY: plain system call on this ring's descriptor; no signal mask.
        let submitted = unsafe {
            libc::syscall(libc::SYS_io_uring_enter, self.fd.as_raw_fd(), self.unsubmitted, wait_for, flags, std::ptr::null::<u8>(), 0usize)
        };
        if submitted < 0 {
            return Err(io::Error::last_os_error());
        }
        self.unsubmitted -= (submitted as u32).min(self.unsubmitted);
        Ok(())
    }

    /// Hands the queued entries to the kernel without waiting.
    pub fn submit(&mut self) -> io::Result<()> {
        while self.unsubmitted > 0 {
            match self.enter(0) {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                other => other?,
            }
        }
        Ok(())
    }

    /// The result of the next completion if there is one, without waiting.
    pub fn completed(&self) -> Option<i32> {
        let ring = self.completion_ring();
        let head = ring.word(self.cq.head).load(Ordering::Relaxed);
        let tail = ring.word(self.cq.tail).load(Ordering::Acquire);
        if head == tail {
            return None;
        }
        let mask = ring.word(self.cq.ring_mask).load(Ordering::Relaxed);
        let entry = ring.at(self.cq.cqes as usize + (head & mask) as usize * COMPLETION_SIZE, COMPLETION_SIZE);
        // SAFETY: a completion the kernel published (before the tail's acquire above);
        // `res` is the `i32` at byte 8 of `io_uring_cqe`.
        let result = unsafe { entry.add(8).cast::<i32>().read() };
        ring.word(self.cq.head).store(head.wrapping_add(1), Ordering::Release);
        Some(result)
    }

    /// Submits what is queued and waits for the next completion: its result.
    pub fn wait(&mut self) -> io::Result<i32> {
        loop {
            if let Some(result) = self.completed() {
                return Ok(result);
            }
            match self.enter(1) {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                other => other?,
            }
        }
    }
}

/// An `IORING_OP_URING_CMD` entry for `fd`: `command` goes in the entry's command area
/// (byte 48 on), `addr` and `len` where the command expects them.
pub fn command_entry(fd: RawFd, cmd_op: u32, addr: u64, len: u32, command: &[u8]) -> [u8; ENTRY_SIZE] {
    let mut entry = [0u8; ENTRY_SIZE];
    entry[0] = IORING_OP_URING_CMD;
    entry[4..8].copy_from_slice(&fd.to_ne_bytes());
    entry[8..12].copy_from_slice(&cmd_op.to_ne_bytes());
    entry[16..24].copy_from_slice(&addr.to_ne_bytes());
    entry[24..28].copy_from_slice(&len.to_ne_bytes());
    entry[48..48 + command.len()].copy_from_slice(command);
    entry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_parameter_block_has_its_size() {
        assert_eq!(size_of::<Params>(), 120);
    }

    /// A no-op through the ring (where io_uring is allowed): the rings are mapped right.
    #[test]
    fn a_no_op_completes_through_the_ring() {
        let Ok(mut ring) = Uring::new(4) else { return };
        let mut entry = [0u8; ENTRY_SIZE];
        entry[32..40].copy_from_slice(&7u64.to_ne_bytes()); // (IORING_OP_NOP is 0)
        ring.push(&entry).unwrap();
        assert_eq!(ring.wait().unwrap(), 0);
        assert_eq!(ring.completed(), None);
    }
}
