//! Answering the requests of an authenticated connection: read a frame, ask the service,
//! write the response, while frames keep coming.

use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ringfs_proto::{Errno, FrameHeader, Request, Response};

use super::{MAX_POLL_GROWTH, SERVER_TICK, STALL_LIMIT, Service, Shared};
use crate::frame_io::{FrameBuffer, FrameReadError, PollBudget, WhenIdle, write_frame};
use crate::transport::{Link, ReadHalf, WriteHalf};

/// Reply data buffers larger than this are not kept for the next request.
const LARGEST_KEPT_REPLY: usize = 64 << 20;

/// An authenticated connection: what it costs while idle is this struct (its buffers
/// belong to the thread serving it, see [`Scratch`]).
pub struct ServedConnection<Session> {
    pub reader: Box<dyn ReadHalf>,
    pub writer: Box<dyn WriteHalf>,
    pub session: Session,
    /// The poll budget it had when last served (it adapts per connection).
    poll_budget: Duration,
    /// When its last poll began, if it went quiet after it.
    quiet_since: Option<Instant>,
    /// Its traffic comes through its listener's descriptor (see [`super::carrier`]).
    carried: bool,
}

impl<Session> ServedConnection<Session> {
    pub fn new(link: Link, session: Session, poll_budget: Duration) -> ServedConnection<Session> {
        let carried = link.reader.carried_by_listener();
        ServedConnection { reader: link.reader, writer: link.writer, session, poll_budget, quiet_since: None, carried }
    }
}

/// The buffers a thread serves connections with, one connection at a time.
pub struct Scratch {
    frames: FrameBuffer,
    body: Vec<u8>,
    data: Vec<u8>,
    reply_data: Vec<u8>,
    out_body: Vec<u8>,
}

impl Scratch {
    /// Buffers for connections whose poll budget starts at `poll`.
    pub fn new(poll: Duration) -> Scratch {
        Scratch {
            frames: FrameBuffer::new(STALL_LIMIT, server_poll_budget(poll)),
            body: Vec::new(),
            data: Vec::new(),
            reply_data: Vec::new(),
            out_body: Vec::new(),
        }
    }
}

/// A server's poll budget: from `poll`, growing up to [`MAX_POLL_GROWTH`] times it.
pub fn server_poll_budget(poll: Duration) -> PollBudget {
    PollBudget::adaptive(poll, poll * MAX_POLL_GROWTH)
}

/// The right to poll a connection, held while polling (see [`Shared::poll_slot`]).
pub struct PollSlot<'a>(&'a AtomicUsize);

impl Drop for PollSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Threads that may poll a quiet connection at once, per CPU the server may run on.
/// Pollers yield the CPU between tries, so a few per CPU cost nothing another thread wants;
/// with one per CPU, `ringfs bench micro` with the servers pinned to one vCPU lost a third of
/// its metadata rate (two clients' connections, one poller), with four it kept the old rate.
/// The bound keeps a burst of requests on thousands of connections from holding a thread
/// each in a poll.
const POLLERS_PER_CPU: usize = 4;

/// Threads that may poll a quiet connection at once (see [`POLLERS_PER_CPU`]).
pub fn max_pollers() -> usize {
    std::thread::available_parallelism().map_or(2, usize::from).max(1) * POLLERS_PER_CPU
}

/// How serving a connection ended for now.
pub enum Served {
    /// No request came within the poll budget, and nothing is buffered: wait for the next.
    Quiet,
    /// The connection is over (closed, broken, malformed, or the server stops).
    Ended,
}

impl<S: Service> Shared<S> {
    /// A poll slot, if fewer than [`max_pollers`] threads are polling.
    fn poll_slot(&self) -> Option<PollSlot<'_>> {
        let taken =
            self.pollers.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |pollers| (pollers < self.max_pollers).then_some(pollers + 1));
        taken.ok().map(|_| PollSlot(&self.pollers))
    }

    /// Answers requests on `connection` until it goes quiet or ends; `waits` says whether
    /// this thread may block on it ([`WhenIdle::Block`]) or returns when no request comes
    /// within the poll budget (otherwise). A frame that has started is always finished here
    /// (or the connection ends).
    pub(super) fn answer_requests(&self, connection: &mut ServedConnection<S::Session>, scratch: &mut Scratch, waits: bool) -> Served {
        scratch.frames.set_poll_budget(connection.poll_budget);
        if let Some(since) = connection.quiet_since.take() {
            let waited = since.elapsed();
            scratch.frames.note_idle_wait((waited <= SERVER_TICK).then_some(waited));
        }
        // While this thread serves a carried connection, its listener need not be watched.
        let _carrier_service = (connection.carried && !waits).then(|| self.carriers.serve());
        let served = loop {
            if self.is_stopping() {
                break Served::Ended;
            }
            let waiting_since = Instant::now();
            let poll_slot = if waits { None } else { self.poll_slot() };
            let when_idle = match (waits, &poll_slot) {
                (true, _) => WhenIdle::Block,
                (false, Some(_)) => WhenIdle::PollThenReturn,
                (false, None) => WhenIdle::Return,
            };
            let carrier_poll = (connection.carried && when_idle == WhenIdle::PollThenReturn).then(|| self.carriers.poll());
            let next = scratch.frames.next_header(connection.reader.as_mut(), when_idle);
            if connection.carried && connection.reader.listener_has_waiting() {
                // This thread's polls took in a new connection, which only the listener's
                // watcher accepts: watch the listener now rather than when this one pauses.
                self.carriers.watch_now();
            }
            drop(carrier_poll);
            drop(poll_slot);
            let header = match next {
                Ok(Some(header)) => header,
                Ok(None) if !waits => {
                    if when_idle == WhenIdle::PollThenReturn {
                        connection.quiet_since = Some(waiting_since);
                    }
                    break Served::Quiet;
                }
                Ok(None) => continue,
                Err(FrameReadError::Closed) => break Served::Ended,
                Err(error) => {
                    log::warn!("closing a connection: {error}");
                    break Served::Ended;
                }
            };
            if let Err(reason) = self.answer_one(connection, header, scratch) {
                if let Some(reason) = reason {
                    log::warn!("closing a connection: {reason}");
                }
                break Served::Ended;
            }
        };
        connection.poll_budget = scratch.frames.poll_budget();
        debug_assert!(!matches!(served, Served::Quiet) || scratch.frames.is_empty());
        served
    }

    /// Reads the rest of the frame `header` began, answers it, and writes the response.
    /// An error ends the connection (with a reason to log, if worth logging).
    fn answer_one(
        &self,
        connection: &mut ServedConnection<S::Session>,
        header: FrameHeader,
        scratch: &mut Scratch,
    ) -> Result<(), Option<String>> {
        let Scratch { frames, body, data, reply_data, out_body } = scratch;
        let reader = connection.reader.as_mut();
        let read = |error: FrameReadError| match error {
            FrameReadError::Closed => None,
            error => Some(error.to_string()),
        };
        body.resize(header.body_len as usize, 0);
        frames.read_exact(reader, body).map_err(read)?;
        // Reused across requests: after the first large write, no new pages are touched.
        data.resize(header.data_len as usize, 0);
        frames.read_exact(reader, data).map_err(read)?;
        let request = Request::decode(body).map_err(|error| Some(format!("malformed request: {error}")))?;
        reply_data.clear();
        let service = self.service.as_ref();
        let handled = catch_unwind(AssertUnwindSafe(|| service.handle(&mut connection.session, request, data, reply_data)));
        let response = handled.unwrap_or_else(|_| {
            log::error!("a request handler panicked; answering EIO");
            reply_data.clear();
            Response::Error(Errno::EIO)
        });
        if header.request_id != 0 {
            reply(connection.writer.as_mut(), header.request_id, service.epoch(), &response, reply_data, out_body).map_err(|error| {
                log::debug!("cannot answer, closing the connection: {error}");
                None
            })?;
        }
        // Keep big buffers from one large request from pinning memory forever.
        if reply_data.capacity() > LARGEST_KEPT_REPLY {
            *reply_data = Vec::new();
        }
        Ok(())
    }

    /// Ends a connection: the service forgets its session, the peer sees it closed.
    pub(super) fn end_connection(&self, mut connection: ServedConnection<S::Session>) {
        self.end_session(&mut connection.session);
        connection.writer.shutdown();
    }
}

/// Writes one response frame.
pub fn reply(
    writer: &mut dyn WriteHalf,
    request_id: u64,
    epoch: u64,
    response: &Response,
    data: &[u8],
    body: &mut Vec<u8>,
) -> io::Result<()> {
    body.clear();
    response.encode(body);
    let header = FrameHeader { body_len: body.len() as u32, data_len: data.len() as u32, request_id, epoch };
    write_frame(writer, &header, body, data)
}
