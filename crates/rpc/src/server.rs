//! The server side: accept connections and answer their requests.
//!
//! Each accepted connection gets its own thread, which reads a request, calls the [`Service`],
//! and writes the response, in a loop. Blocking I/O on a dedicated thread answers a small
//! request in about a fifth of the CPU time of an event loop on this class of machine
//! (docs/PERFORMANCE.md), and keeps handlers simple: a handler may block on a call to another
//! server without stalling other connections. Requests of one connection are answered in the
//! order they arrive; clients must not rely on that (the protocol allows any order).
//!
//! The first frame of a connection must be a `Hello`, which [`Service::hello`] accepts or
//! refuses (wrong secret or version). A frame that breaks the size limits or does not decode
//! closes that connection only.

use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use ringfs_proto::{Errno, FrameHeader, Hello, HelloReply, Request, Response};

use crate::frame_io::{FrameReadError, FrameReader, write_frame};
use crate::transport::{Link, Listener, PeerIdentity, WriteHalf};

/// How often an idle connection thread wakes to notice a shutdown.
const SERVER_TICK: Duration = Duration::from_millis(500);
/// A frame that has started must complete within this time.
const STALL_LIMIT: Duration = Duration::from_secs(30);
const CONNECTION_STACK_BYTES: usize = 512 * 1024;

/// What a server does with requests.
pub trait Service: Send + Sync + 'static {
    /// Per-connection state (for example, leases granted to that client).
    type Session: Default + Send;

    /// Checks a connection's `Hello`; an error refuses the connection.
    fn hello(&self, hello: &Hello, peer: &PeerIdentity, session: &mut Self::Session) -> Result<HelloReply, Errno>;

    /// Answers one request. `data` is the request's data section; response data is appended
    /// to `reply_data`.
    fn handle(&self, session: &mut Self::Session, request: Request, data: &[u8], reply_data: &mut Vec<u8>) -> Response;

    /// The membership epoch to put in response headers.
    fn epoch(&self) -> u64;

    /// Called once when a connection ends.
    fn closed(&self, _session: &mut Self::Session) {}
}

/// A running server: listener threads plus one thread per connection.
pub struct RpcServer {
    listeners: Vec<Arc<Listener>>,
    stopping: Arc<AtomicBool>,
}

impl RpcServer {
    /// Starts accepting on every listener. Connection threads poll for `poll` before they
    /// sleep waiting for the next request (see `frame_io`).
    pub fn start<S: Service>(service: Arc<S>, listeners: Vec<Listener>, poll: Duration) -> io::Result<RpcServer> {
        let stopping = Arc::new(AtomicBool::new(false));
        let listeners: Vec<Arc<Listener>> = listeners.into_iter().map(Arc::new).collect();
        for listener in &listeners {
            let listener = listener.clone();
            let service = service.clone();
            let stopping = stopping.clone();
            thread::Builder::new().name("ringfs-accept".into()).spawn(move || accept_loop(listener, service, stopping, poll))?;
        }
        Ok(RpcServer { listeners, stopping })
    }

    /// Stops accepting connections and asks connection threads to finish.
    pub fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for listener in &self.listeners {
            listener.shutdown();
        }
    }
}

fn accept_loop<S: Service>(listener: Arc<Listener>, service: Arc<S>, stopping: Arc<AtomicBool>, poll: Duration) {
    while !stopping.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok(link) => {
                let service = service.clone();
                let stopping = stopping.clone();
                let spawned = thread::Builder::new()
                    .name("ringfs-conn".into())
                    .stack_size(CONNECTION_STACK_BYTES)
                    .spawn(move || serve_connection(link, service.as_ref(), &stopping, poll));
                if let Err(error) = spawned {
                    log::error!("cannot start a connection thread: {error}");
                }
            }
            Err(_) if stopping.load(Ordering::SeqCst) => break,
            Err(error) => {
                log::warn!("accept failed: {error}");
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Reads the next frame: header, body, and data section into `data`. `Ok(None)`: the server
/// is stopping.
fn next_frame(
    reader: &mut FrameReader,
    body: &mut Vec<u8>,
    data: &mut Vec<u8>,
    stopping: &AtomicBool,
) -> Result<Option<FrameHeader>, FrameReadError> {
    let header = loop {
        match reader.next_header()? {
            Some(header) => break header,
            None if stopping.load(Ordering::Relaxed) => return Ok(None),
            None => continue,
        }
    };
    body.resize(header.body_len as usize, 0);
    reader.read_exact(body)?;
    // Reused across requests: after the first large write, no new pages are touched.
    data.resize(header.data_len as usize, 0);
    reader.read_exact(data)?;
    Ok(Some(header))
}

fn reply(writer: &mut dyn WriteHalf, request_id: u64, epoch: u64, response: &Response, data: &[u8], body: &mut Vec<u8>) -> io::Result<()> {
    body.clear();
    response.encode(body);
    let header = FrameHeader { body_len: body.len() as u32, data_len: data.len() as u32, request_id, epoch };
    write_frame(writer, &header, body, data)
}

fn serve_connection<S: Service>(link: Link, service: &S, stopping: &AtomicBool, poll: Duration) {
    let Link { reader, mut writer, peer } = link;
    let mut reader = match FrameReader::new(reader, SERVER_TICK, STALL_LIMIT, poll) {
        Ok(reader) => reader,
        Err(error) => {
            log::warn!("cannot set up a connection: {error}");
            return;
        }
    };
    if let Err(error) = writer.set_write_timeout(Some(STALL_LIMIT)) {
        log::warn!("cannot set up a connection: {error}");
        return;
    }
    let mut session = S::Session::default();
    let mut body = Vec::new();
    let mut data = Vec::new();
    let mut out_body = Vec::new();
    let mut reply_data = Vec::new();

    // Handshake.
    let header = match next_frame(&mut reader, &mut body, &mut data, stopping) {
        Ok(Some(header)) => header,
        Ok(None) | Err(FrameReadError::Closed) => return,
        Err(error) => {
            log::debug!("connection closed during handshake: {error}");
            return;
        }
    };
    let accepted = match Request::decode(&body) {
        Ok(Request::Hello(hello)) => service.hello(&hello, &peer, &mut session),
        Ok(_) => Err(Errno::EPROTO),
        Err(error) => {
            log::warn!("malformed handshake, closing the connection: {error}");
            Err(Errno::EPROTO)
        }
    };
    let response = match &accepted {
        Ok(hello_reply) => Response::Hello(hello_reply.clone()),
        Err(errno) => Response::Error(*errno),
    };
    if reply(writer.as_mut(), header.request_id, service.epoch(), &response, &[], &mut out_body).is_err() || accepted.is_err() {
        writer.shutdown();
        return;
    }

    loop {
        let header = match next_frame(&mut reader, &mut body, &mut data, stopping) {
            Ok(Some(header)) => header,
            Ok(None) | Err(FrameReadError::Closed) => break,
            Err(error) => {
                log::warn!("closing a connection: {error}");
                break;
            }
        };
        let request = match Request::decode(&body) {
            Ok(request) => request,
            Err(error) => {
                log::warn!("malformed request, closing the connection: {error}");
                break;
            }
        };
        reply_data.clear();
        let handled = catch_unwind(AssertUnwindSafe(|| service.handle(&mut session, request, &data, &mut reply_data)));
        let response = handled.unwrap_or_else(|_| {
            log::error!("a request handler panicked; answering EIO");
            reply_data.clear();
            Response::Error(Errno::EIO)
        });
        if header.request_id == 0 {
            continue;
        }
        if let Err(error) = reply(writer.as_mut(), header.request_id, service.epoch(), &response, &reply_data, &mut out_body) {
            log::debug!("cannot answer, closing the connection: {error}");
            break;
        }
        // Keep big buffers from one large request from pinning memory forever.
        if reply_data.capacity() > 64 << 20 {
            reply_data = Vec::new();
        }
    }
    service.closed(&mut session);
    writer.shutdown();
}
