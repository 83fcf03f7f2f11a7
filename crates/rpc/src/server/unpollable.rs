//! Links without a file descriptor (the simulated network of tests, a transport that cannot
//! be polled): each gets a thread of its own that blocks on it, as every connection did
//! before the event loop. They share the handshake rules and the request loop.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::handshake::{HandshakeProgress, PendingHandshake};
use super::requests::{Scratch, Served, ServedConnection};
use super::{CONNECTION_STACK_BYTES, SERVER_TICK, STALL_LIMIT, Service, Shared};
use crate::transport::{Link, Listener};

/// How often a handshake on a link without a descriptor is looked at.
const UNPOLLABLE_CHECK: Duration = Duration::from_millis(2);

/// Accepts on `listener` (which cannot be polled) in a thread of its own.
pub fn serve_listener<S: Service>(shared: Arc<Shared<S>>, listener: Arc<Listener>) -> std::io::Result<()> {
    let threads = shared.threads.clone();
    threads.spawn("ringfs-accept", None, move || {
        while !shared.is_stopping() {
            match listener.accept() {
                Ok(link) => serve_link(shared.clone(), link),
                Err(_) if shared.is_stopping() => break,
                Err(error) => {
                    shared.refusals.over_limit.log(log::Level::Warn, format_args!("accept failed: {error}"));
                    thread::sleep(Duration::from_millis(10));
                }
            }
        }
    })
}

/// Serves `link` in a thread of its own: handshake, then requests until it ends.
pub fn serve_link<S: Service>(shared: Arc<Shared<S>>, link: Link) {
    if shared.handshakes() >= shared.limits.max_handshakes {
        shared.refusals.over_limit.log(log::Level::Warn, format_args!("closing a new connection: too many in their handshake"));
        link.writer.shutdown();
        return;
    }
    shared.count_handshake();
    let thread_shared = shared.clone();
    let spawned = shared.threads.spawn("ringfs-conn", Some(CONNECTION_STACK_BYTES), move || serve_in_thread(&thread_shared, link));
    if let Err(error) = spawned {
        shared.uncount_handshake();
        shared.refusals.over_limit.log(log::Level::Error, format_args!("cannot start a connection thread: {error}"));
    }
}

fn serve_in_thread<S: Service>(shared: &Shared<S>, mut link: Link) {
    let configured = link.reader.set_read_timeout(Some(SERVER_TICK)).and_then(|()| link.writer.set_write_timeout(Some(STALL_LIMIT)));
    let mut handshake = PendingHandshake::new(link, Instant::now() + shared.limits.handshake_deadline);
    let complete = configured.is_ok() && wait_for_hello(shared, &mut handshake);
    shared.uncount_handshake();
    if !complete {
        handshake.link.writer.shutdown();
        return;
    }
    let Some(session) = shared.answer_hello(&mut handshake) else {
        handshake.link.writer.shutdown();
        return;
    };
    let mut connection = ServedConnection::new(handshake.link, session, shared.poll);
    let mut scratch = Scratch::new(shared.poll);
    while let Served::Quiet = shared.answer_requests(&mut connection, &mut scratch, true) {}
    shared.end_connection(connection);
}

/// Waits for the whole first frame, looking every [`UNPOLLABLE_CHECK`]; false if refused.
fn wait_for_hello<S: Service>(shared: &Shared<S>, handshake: &mut PendingHandshake) -> bool {
    loop {
        match handshake.advance_until_deadline() {
            HandshakeProgress::Complete => return true,
            HandshakeProgress::Waiting if !shared.is_stopping() => thread::sleep(UNPOLLABLE_CHECK),
            HandshakeProgress::Waiting => return false,
            HandshakeProgress::Refused(reason) => {
                if let Some(reason) = reason {
                    shared.refusals.handshake.log(log::Level::Warn, format_args!("closing a connection in its handshake: {reason}"));
                }
                return false;
            }
        }
    }
}
