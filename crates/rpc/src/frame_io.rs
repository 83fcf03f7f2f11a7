//! Reading and writing whole frames on a link.
//!
//! [`FrameReader`] buffers reads so that a small frame (header and body) costs one `read`
//! system call, and reads large data sections straight into their final buffer. Its
//! underlying reader has a short timeout (the *tick*): an idle wait for the next frame returns
//! `Ok(None)` at every tick so the caller can check deadlines, while a frame that has started
//! must complete within `stall_limit` or the link is considered broken.
//!
//! Before blocking, a reader may *poll* for a short budget: it tries non-blocking reads and
//! yields the CPU between tries. A reply that arrives within the budget is then picked up
//! without a sleep and a wake-up, which on virtual machines cost far more than the poll
//! (docs/PERFORMANCE.md). Yielding means polling only uses cycles no other thread wants.

use std::io::{self, IoSlice};
use std::time::{Duration, Instant};

use ringfs_proto::{FrameError, FrameHeader, HEADER_LEN};
use thiserror::Error;

use crate::transport::{ReadHalf, WriteHalf};

const BUFFER_BYTES: usize = 64 * 1024;

#[derive(Debug, Error)]
pub enum FrameReadError {
    #[error("peer closed the connection")]
    Closed,
    #[error("peer stopped sending in the middle of a frame")]
    Stalled,
    #[error("invalid frame header: {0}")]
    Invalid(#[from] FrameError),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Buffered frame reader over a [`ReadHalf`].
pub struct FrameReader {
    reader: Box<dyn ReadHalf>,
    buffer: Box<[u8]>,
    start: usize,
    end: usize,
    stall_limit: Duration,
    poll_budget: Duration,
}

fn is_timeout(error: &io::Error) -> bool {
    matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

impl FrameReader {
    /// Wraps `reader`, whose blocking reads return after `tick` when nothing arrives; before
    /// blocking it polls for up to `poll_budget` (zero: never).
    pub fn new(mut reader: Box<dyn ReadHalf>, tick: Duration, stall_limit: Duration, poll_budget: Duration) -> io::Result<FrameReader> {
        reader.set_read_timeout(Some(tick))?;
        Ok(FrameReader { reader, buffer: vec![0u8; BUFFER_BYTES].into_boxed_slice(), start: 0, end: 0, stall_limit, poll_budget })
    }

    /// Tries non-blocking reads into `destination` for up to the poll budget.
    /// `Ok(Some(n))` when bytes (or EOF: `Some(0)`) arrived, `Ok(None)` when the budget ran out.
    fn poll(reader: &mut dyn ReadHalf, destination: &mut [u8], budget: Duration) -> io::Result<Option<usize>> {
        if budget.is_zero() {
            return Ok(None);
        }
        let started = Instant::now();
        loop {
            match reader.read_available(destination) {
                Ok(count) => return Ok(Some(count)),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock || error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
            if started.elapsed() >= budget {
                return Ok(None);
            }
            std::thread::yield_now();
        }
    }

    fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// One read into the buffer. `Ok(false)` on a tick timeout.
    fn fill(&mut self) -> Result<bool, FrameReadError> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buffer.len() {
            self.buffer.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let polled = Self::poll(self.reader.as_mut(), &mut self.buffer[self.end..], self.poll_budget)?;
        let read = match polled {
            Some(count) => Ok(count),
            None => self.reader.read(&mut self.buffer[self.end..]),
        };
        match read {
            Ok(0) => Err(FrameReadError::Closed),
            Ok(count) => {
                self.end += count;
                Ok(true)
            }
            Err(error) if is_timeout(&error) => Ok(false),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => Ok(true),
            Err(error) => Err(error.into()),
        }
    }

    /// The next frame header, or `Ok(None)` if a tick passed with no byte of a new frame.
    pub fn next_header(&mut self) -> Result<Option<FrameHeader>, FrameReadError> {
        let started = Instant::now();
        while self.buffered() < HEADER_LEN {
            if !self.fill()? {
                if self.buffered() == 0 {
                    return Ok(None);
                }
                if started.elapsed() > self.stall_limit {
                    return Err(FrameReadError::Stalled);
                }
            }
        }
        let mut bytes = [0u8; HEADER_LEN];
        bytes.copy_from_slice(&self.buffer[self.start..self.start + HEADER_LEN]);
        self.start += HEADER_LEN;
        Ok(Some(FrameHeader::decode(&bytes)?))
    }

    /// Fills `destination` completely with the next bytes of the current frame.
    pub fn read_exact(&mut self, destination: &mut [u8]) -> Result<(), FrameReadError> {
        let from_buffer = self.buffered().min(destination.len());
        destination[..from_buffer].copy_from_slice(&self.buffer[self.start..self.start + from_buffer]);
        self.start += from_buffer;
        let mut filled = from_buffer;
        let mut last_progress = Instant::now();
        while filled < destination.len() {
            let left = destination.len() - filled;
            if left < self.buffer.len() / 2 {
                // Small remainder: read through the buffer to pick up following frames too.
                if self.fill()? {
                    let step = self.buffered().min(left);
                    destination[filled..filled + step].copy_from_slice(&self.buffer[self.start..self.start + step]);
                    self.start += step;
                    filled += step;
                    last_progress = Instant::now();
                } else if last_progress.elapsed() > self.stall_limit {
                    return Err(FrameReadError::Stalled);
                }
                continue;
            }
            match self.reader.read(&mut destination[filled..]) {
                Ok(0) => return Err(FrameReadError::Closed),
                Ok(count) => {
                    filled += count;
                    last_progress = Instant::now();
                }
                Err(error) if is_timeout(&error) || error.kind() == io::ErrorKind::Interrupted => {
                    if last_progress.elapsed() > self.stall_limit {
                        return Err(FrameReadError::Stalled);
                    }
                }
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }

    /// Reads and drops `count` bytes of the current frame.
    pub fn skip(&mut self, mut count: usize) -> Result<(), FrameReadError> {
        let mut scratch = [0u8; 4096];
        while count > 0 {
            let step = count.min(scratch.len());
            self.read_exact(&mut scratch[..step])?;
            count -= step;
        }
        Ok(())
    }
}

/// Writes one frame (header, body, data) with as few system calls as the kernel allows.
pub fn write_frame(writer: &mut dyn WriteHalf, header: &FrameHeader, body: &[u8], data: &[u8]) -> io::Result<()> {
    let header_bytes = header.encode();
    let mut slices = [IoSlice::new(&header_bytes), IoSlice::new(body), IoSlice::new(data)];
    let mut remaining: &mut [IoSlice] = &mut slices;
    while !remaining.is_empty() {
        match writer.write_vectored(remaining) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "connection closed while writing")),
            Ok(count) => IoSlice::advance_slices(&mut remaining, count),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    writer.flush()
}
