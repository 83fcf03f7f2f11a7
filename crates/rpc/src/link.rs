//! What every transport provides: a [`Link`] of a [`ReadHalf`] and a [`WriteHalf`], and who
//! is on the other end ([`PeerIdentity`]). The layers above (framing, connections, the
//! server loop) see only these; the transports (the `transport` module, the simulated network
//! of tests) implement them.

use std::io::{self, Read, Write};
use std::os::fd::RawFd;
use std::time::Duration;

/// The receiving half of a link.
pub trait ReadHalf: Read + Send {
    /// Longest a single `read` blocks before returning `WouldBlock`/`TimedOut`.
    fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()>;

    /// Reads what is available without blocking (`WouldBlock` if nothing is).
    fn read_available(&mut self, buffer: &mut [u8]) -> io::Result<usize>;

    /// The file descriptor to `poll` for readability, if the link has one (links without
    /// one are checked with [`ReadHalf::read_available`] at short intervals instead).
    fn poll_fd(&self) -> Option<RawFd> {
        None
    }

    /// True if what arrives for this link is signalled by its listener's descriptor, and a
    /// thread reading it moves it on itself (UCX: the worker's), so that the listener need
    /// not be watched while a thread polls the link (see `server::carrier`).
    fn carried_by_listener(&self) -> bool {
        false
    }

    /// For a link [`carried_by_listener`](ReadHalf::carried_by_listener): true while its
    /// listener holds new connections that a thread reading this link moved in and nobody
    /// accepted yet (the listener must be watched again for them).
    fn listener_has_waiting(&self) -> bool {
        false
    }
}

/// The sending half of a link.
pub trait WriteHalf: Write + Send {
    /// Longest a single `write` blocks before failing.
    fn set_write_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()>;
    /// Closes both directions, waking a reader blocked on the other half.
    fn shutdown(&self);
}

/// Who is on the other end of a link, as far as the transport can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PeerIdentity {
    /// Process id of the peer, when the transport can vouch for it (Unix sockets).
    pub pid: Option<u32>,
}

/// An established connection.
pub struct Link {
    pub reader: Box<dyn ReadHalf>,
    pub writer: Box<dyn WriteHalf>,
    pub peer: PeerIdentity,
}
