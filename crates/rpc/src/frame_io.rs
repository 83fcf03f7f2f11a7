//! Reading and writing whole frames on a link.
//!
//! [`FrameBuffer`] buffers reads so that a small frame (header and body) costs one `read`
//! system call, and reads large data sections straight into their final buffer; the link is
//! lent on each call, so a server thread's one buffer serves whichever connection it is
//! serving ([`FrameReader`] owns its link: a client connection). The link's reads have a
//! short timeout (the *tick*): an idle wait for the next frame returns `Ok(None)` at every
//! tick so the caller can check deadlines (or at once, [`WhenIdle`]), while a frame that has
//! started must complete within `stall_limit` or the link is considered broken.
//!
//! Before blocking, a reader may *poll* for a short budget: it tries non-blocking reads and
//! yields the CPU between tries. A reply that arrives within the budget is then picked up
//! without a sleep and a wake-up, which on virtual machines cost far more than the poll
//! (docs/PERFORMANCE.md). Yielding means polling only uses cycles no other thread wants.
//!
//! A fixed budget is a cliff: a peer whose requests come just further apart than the budget
//! pays a wake-up on every one of them (a program doing 2 µs more work per call ran 25 %
//! slower). So the budget may *adapt* ([`PollBudget::adaptive`], as Linux's `haltpoll`
//! does for idle vCPUs): when a frame arrives soon after the poll gave up, the next poll
//! lasts long enough to have caught it (up to a maximum); when the link stays quiet longer
//! than the maximum, the budget halves back towards its base.

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

/// How long a [`FrameReader`] polls before it sleeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollBudget {
    /// The budget a reader starts with and shrinks back to (zero: never poll).
    pub base: Duration,
    /// The longest the budget may grow to (equal to `base`: a fixed budget).
    pub max: Duration,
}

impl PollBudget {
    /// Always `budget`.
    pub const fn fixed(budget: Duration) -> PollBudget {
        PollBudget { base: budget, max: budget }
    }

    /// Starts at `base` and adapts between `base` and `max` to how soon frames follow each
    /// other. A zero `base` never polls.
    pub fn adaptive(base: Duration, max: Duration) -> PollBudget {
        PollBudget { base, max: if base.is_zero() { base } else { max.max(base) } }
    }

    /// The budget after a poll of `current` gave up and the next bytes came `waited` after
    /// the poll began (`None`: none came within the reader's tick).
    fn next(&self, current: Duration, waited: Option<Duration>) -> Duration {
        match waited {
            // Polling a quarter longer than this gap would have caught the frame.
            Some(waited) if waited <= self.max => (waited + waited / 4).clamp(current, self.max),
            _ => (current / 2).max(self.base),
        }
    }
}

/// What [`FrameBuffer::next_header`] does when no byte of a new frame has come within the
/// poll budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenIdle {
    /// Block in a read until the link's read timeout (the tick) passes.
    Block,
    /// Return once the poll budget is spent: the caller waits for the link some other way
    /// (a server's event loop).
    PollThenReturn,
    /// Look once and return (the caller may not poll now).
    Return,
}

/// The bytes read ahead of the frames of a link, and the poll budget. The link is lent on
/// every call, so that one buffer can serve many links in turn: a server's worker thread
/// owns one and reads from whichever connection it is serving, which then needs no buffer
/// of its own while it is idle. A frame that has started is finished from the same buffer.
pub struct FrameBuffer {
    buffer: Box<[u8]>,
    start: usize,
    end: usize,
    stall_limit: Duration,
    poll: PollBudget,
    /// The current poll budget, between `poll.base` and `poll.max`.
    poll_budget: Duration,
}

fn is_timeout(error: &io::Error) -> bool {
    matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// Tries non-blocking reads into `destination` until `budget` has passed since `started`.
/// `Ok(Some(n))` when bytes (or EOF: `Some(0)`) arrived, `Ok(None)` when the budget ran out.
fn poll(reader: &mut dyn ReadHalf, destination: &mut [u8], budget: Duration, started: Instant) -> io::Result<Option<usize>> {
    if budget.is_zero() {
        return Ok(None);
    }
    loop {
        match try_read(reader, destination)? {
            Some(count) => return Ok(Some(count)),
            None if started.elapsed() >= budget => return Ok(None),
            None => std::thread::yield_now(),
        }
    }
}

/// One non-blocking read: `Ok(None)` if nothing has arrived.
fn try_read(reader: &mut dyn ReadHalf, destination: &mut [u8]) -> io::Result<Option<usize>> {
    match reader.read_available(destination) {
        Ok(count) => Ok(Some(count)),
        Err(error) if error.kind() == io::ErrorKind::WouldBlock || error.kind() == io::ErrorKind::Interrupted => Ok(None),
        Err(error) => Err(error),
    }
}

impl FrameBuffer {
    /// An empty buffer; frames that have started must complete within `stall_limit`, and
    /// reads poll as `poll` says before they block.
    pub fn new(stall_limit: Duration, poll: PollBudget) -> FrameBuffer {
        FrameBuffer { buffer: vec![0u8; BUFFER_BYTES].into_boxed_slice(), start: 0, end: 0, stall_limit, poll, poll_budget: poll.base }
    }

    /// The poll budget the next wait starts with.
    pub fn poll_budget(&self) -> Duration {
        self.poll_budget
    }

    /// Continues with the budget a link had when it was last served (see [`FrameBuffer`]).
    pub fn set_poll_budget(&mut self, budget: Duration) {
        self.poll_budget = budget;
    }

    /// Adapts the budget after a poll gave up and the next bytes came `waited` after the
    /// poll began (`None`: not within a tick), when the caller did the waiting
    /// ([`WhenIdle::PollThenReturn`]).
    pub fn note_idle_wait(&mut self, waited: Option<Duration>) {
        if !self.poll_budget.is_zero() {
            self.poll_budget = self.poll.next(self.poll_budget, waited);
        }
    }

    /// True when no byte read ahead waits in the buffer (the link may be left alone).
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// One read into the buffer. `Ok(false)` on a tick timeout, or when `when_idle` is
    /// [`WhenIdle::Return`] and nothing came within the poll budget.
    fn fill(&mut self, reader: &mut dyn ReadHalf, when_idle: WhenIdle) -> Result<bool, FrameReadError> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buffer.len() {
            self.buffer.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let poll_started = Instant::now();
        let destination = &mut self.buffer[self.end..];
        let polled = match when_idle {
            WhenIdle::Return => try_read(reader, destination)?,
            // Not even one look with a zero budget: one try before giving up.
            WhenIdle::PollThenReturn if self.poll_budget.is_zero() => try_read(reader, destination)?,
            WhenIdle::PollThenReturn | WhenIdle::Block => poll(reader, destination, self.poll_budget, poll_started)?,
        };
        let read = match polled {
            Some(count) => Ok(count),
            None if when_idle != WhenIdle::Block => return Ok(false),
            None => {
                let read = reader.read(destination);
                if !self.poll_budget.is_zero() {
                    let waited = matches!(read, Ok(count) if count > 0).then(|| poll_started.elapsed());
                    self.poll_budget = self.poll.next(self.poll_budget, waited);
                }
                read
            }
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

    /// The next frame header, or `Ok(None)` if no byte of a new frame came: within a tick
    /// ([`WhenIdle::Block`]), within the poll budget ([`WhenIdle::PollThenReturn`]), or at
    /// once ([`WhenIdle::Return`]). Once a frame has started, reads block until it is
    /// complete or stalls.
    pub fn next_header(&mut self, reader: &mut dyn ReadHalf, when_idle: WhenIdle) -> Result<Option<FrameHeader>, FrameReadError> {
        let started = Instant::now();
        while self.buffered() < HEADER_LEN {
            let wait = if self.buffered() == 0 { when_idle } else { WhenIdle::Block };
            if !self.fill(reader, wait)? {
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
    pub fn read_exact(&mut self, reader: &mut dyn ReadHalf, destination: &mut [u8]) -> Result<(), FrameReadError> {
        let from_buffer = self.buffered().min(destination.len());
        destination[..from_buffer].copy_from_slice(&self.buffer[self.start..self.start + from_buffer]);
        self.start += from_buffer;
        let mut filled = from_buffer;
        let mut last_progress = Instant::now();
        while filled < destination.len() {
            let left = destination.len() - filled;
            if left < self.buffer.len() / 2 {
                // Small remainder: read through the buffer to pick up following frames too.
                if self.fill(reader, WhenIdle::Block)? {
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
            match reader.read(&mut destination[filled..]) {
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
    pub fn skip(&mut self, reader: &mut dyn ReadHalf, mut count: usize) -> Result<(), FrameReadError> {
        let mut scratch = [0u8; 4096];
        while count > 0 {
            let step = count.min(scratch.len());
            self.read_exact(reader, &mut scratch[..step])?;
            count -= step;
        }
        Ok(())
    }
}

/// Buffered frame reader that owns its link's [`ReadHalf`] (a client connection).
pub struct FrameReader {
    reader: Box<dyn ReadHalf>,
    frames: FrameBuffer,
}

impl FrameReader {
    /// Wraps `reader`, whose blocking reads return after `tick` when nothing arrives; before
    /// blocking it polls as `poll` says.
    pub fn new(mut reader: Box<dyn ReadHalf>, tick: Duration, stall_limit: Duration, poll: PollBudget) -> io::Result<FrameReader> {
        reader.set_read_timeout(Some(tick))?;
        Ok(FrameReader { reader, frames: FrameBuffer::new(stall_limit, poll) })
    }

    /// The poll budget the next wait starts with.
    pub fn poll_budget(&self) -> Duration {
        self.frames.poll_budget()
    }

    /// The next frame header, or `Ok(None)` if a tick passed with no byte of a new frame.
    pub fn next_header(&mut self) -> Result<Option<FrameHeader>, FrameReadError> {
        self.frames.next_header(self.reader.as_mut(), WhenIdle::Block)
    }

    /// Fills `destination` completely with the next bytes of the current frame.
    pub fn read_exact(&mut self, destination: &mut [u8]) -> Result<(), FrameReadError> {
        self.frames.read_exact(self.reader.as_mut(), destination)
    }

    /// Reads and drops `count` bytes of the current frame.
    pub fn skip(&mut self, count: usize) -> Result<(), FrameReadError> {
        self.frames.skip(self.reader.as_mut(), count)
    }

    /// For a link that expects nothing (no request in flight): true if the other end closed
    /// it, or sent bytes nobody asked for (then its framing cannot be trusted either). Reads
    /// without blocking.
    pub fn closed_while_idle(&mut self) -> bool {
        if !self.frames.is_empty() {
            return true;
        }
        let mut byte = [0u8; 1];
        match self.reader.read_available(&mut byte) {
            Ok(_) => true,
            Err(error) => !matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_fixed_budget_never_changes_and_zero_never_polls() {
        let fixed = PollBudget::fixed(50 * MS);
        assert_eq!(fixed.next(50 * MS, Some(60 * MS)), 50 * MS);
        assert_eq!(fixed.next(50 * MS, None), 50 * MS);
        assert_eq!(PollBudget::adaptive(Duration::ZERO, 200 * MS), PollBudget::fixed(Duration::ZERO));
    }

    #[test]
    fn an_adaptive_budget_grows_to_cover_short_gaps_and_halves_back_after_long_ones() {
        let budget = PollBudget::adaptive(50 * MS, 200 * MS);
        // A frame 60 ms after the poll began: next time poll 75 ms (a quarter more).
        assert_eq!(budget.next(50 * MS, Some(60 * MS)), 75 * MS);
        // Never beyond the maximum, never below what it is for a gap it already covers.
        assert_eq!(budget.next(75 * MS, Some(190 * MS)), 200 * MS);
        assert_eq!(budget.next(150 * MS, Some(60 * MS)), 150 * MS);
        // A gap longer than the maximum, or none within the tick: halve, down to the base.
        assert_eq!(budget.next(200 * MS, Some(300 * MS)), 100 * MS);
        assert_eq!(budget.next(80 * MS, None), 50 * MS);
    }

    /// Frames sent `gap` apart to a reader polling 1 ms at first: its budget grows past the
    /// gap, so the next frames are picked up by polling; after a pause longer than the
    /// maximum it shrinks again.
    #[test]
    fn a_reader_adapts_its_budget_to_the_gaps_between_frames() {
        let (sender, receiver) = UnixStream::pair().unwrap();
        let gap = 10 * MS;
        let poll = PollBudget::adaptive(MS, 200 * MS);
        let mut reader = FrameReader::new(Box::new(receiver), Duration::from_secs(5), Duration::from_secs(5), poll).unwrap();
        let writer = std::thread::spawn(move || {
            let mut sender = sender;
            for (index, pause) in [gap, gap, gap, gap, Duration::from_millis(450)].into_iter().enumerate() {
                std::thread::sleep(pause);
                let header = FrameHeader { body_len: 1, data_len: 0, request_id: index as u64, epoch: 0 };
                write_frame(&mut sender, &header, &[index as u8], &[]).unwrap();
            }
        });
        let mut budgets = Vec::new();
        for index in 0..5 {
            let header = reader.next_header().unwrap().expect("a frame within the tick");
            assert_eq!(header.request_id, index);
            let mut body = [0u8; 1];
            reader.read_exact(&mut body).unwrap();
            budgets.push(reader.poll_budget());
        }
        writer.join().unwrap();
        assert!(budgets[0] >= gap, "the first gap should have grown the budget past it: {budgets:?}");
        assert!(budgets[3] >= gap && budgets[3] <= poll.max, "{budgets:?}");
        assert!(budgets[4] < budgets[3], "a pause longer than the maximum should shrink the budget: {budgets:?}");
    }
}
