//! Transports: how two processes get a reliable, ordered byte stream between them.
//!
//! Everything above this module (framing, connections, the server loop, and the file system
//! logic above those) sees only [`Link`]s made of a [`ReadHalf`] and a [`WriteHalf`]. TCP
//! serves remote peers; Unix sockets serve peers on the same host and tell the server the
//! client's process id, which enables cross-memory attach ([`crate::memory`]). UCX
//! connections ([`crate::ucx`]) are links too on the server side (the client's
//! [`crate::Connection`] speaks UCX's messages and RMA itself).

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use crate::link::{Link, PeerIdentity, ReadHalf, WriteHalf};

/// Connections the kernel may hold completed for a listener before they are accepted (the
/// kernel caps it at `net.core.somaxconn`, 4096 by default).
pub const LISTEN_BACKLOG: libc::c_int = 65_535;

/// Where a server listens or a client connects.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `host:port` (also accepted with a `tcp://` prefix).
    Tcp(String),
    /// `unix:/path/to/socket`.
    Unix(PathBuf),
    /// `sim:NAME`: the simulated in-process network of tests ([`crate::sim`], feature
    /// `testing`).
    #[cfg(feature = "testing")]
    Sim(String),
    /// `ucx://host:port`: a UCX listener ([`crate::ucx`]).
    Ucx(String),
}

impl Endpoint {
    /// Parses `host:port`, `tcp://host:port`, `ucx://host:port`, `unix:/path` or (feature `testing`) `sim:NAME`.
    pub fn parse(text: &str) -> Result<Endpoint, String> {
        if let Some(address) = text.strip_prefix("ucx://") {
            return match address.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(Endpoint::Ucx(address.to_string())),
                _ => Err(format!("expected ucx://host:port, got {text:?}")),
            };
        }
        #[cfg(feature = "testing")]
        if let Some(name) = text.strip_prefix("sim:") {
            if name.is_empty() {
                return Err(format!("empty simulated endpoint name in {text:?}"));
            }
            return Ok(Endpoint::Sim(name.to_string()));
        }
        if let Some(path) = text.strip_prefix("unix:") {
            let path = path.trim_start_matches("//");
            if path.is_empty() {
                return Err(format!("empty Unix socket path in {text:?}"));
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        let address = text.strip_prefix("tcp://").unwrap_or(text);
        match address.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(Endpoint::Tcp(address.to_string())),
            _ => Err(format!("expected host:port or unix:/path, got {text:?}")),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp(address) => f.write_str(address),
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
            #[cfg(feature = "testing")]
            Endpoint::Sim(name) => write!(f, "sim:{name}"),
            Endpoint::Ucx(address) => write!(f, "ucx://{address}"),
        }
    }
}

/// What the two halves of a link need from a stream socket.
trait StreamSocket: AsRawFd + Send + Sync + 'static {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    fn shutdown(&self, how: Shutdown) -> io::Result<()>;
}

macro_rules! stream_socket {
    ($stream:ty) => {
        impl StreamSocket for $stream {
            fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
                <$stream>::set_read_timeout(self, timeout)
            }

            fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
                <$stream>::set_write_timeout(self, timeout)
            }

            fn shutdown(&self, how: Shutdown) -> io::Result<()> {
                <$stream>::shutdown(self, how)
            }
        }

        impl ReadHalf for $stream {
            fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
                <$stream>::set_read_timeout(self, timeout)
            }

            fn read_available(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
                receive_available(self.as_raw_fd(), buffer)
            }

            fn poll_fd(&self) -> Option<RawFd> {
                Some(self.as_raw_fd())
            }
        }

        impl WriteHalf for $stream {
            fn set_write_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
                <$stream>::set_write_timeout(self, timeout)
            }

            fn shutdown(&self) {
                let _ = <$stream>::shutdown(self, Shutdown::Both);
            }
        }
    };
}

stream_socket!(TcpStream);
stream_socket!(UnixStream);

/// Reads what the socket `fd` holds without blocking.
fn receive_available(fd: RawFd, buffer: &mut [u8]) -> io::Result<usize> {
    // SAFETY: recv writes at most buffer.len() bytes into the buffer.
    let count = unsafe { libc::recv(fd, buffer.as_mut_ptr().cast(), buffer.len(), libc::MSG_DONTWAIT) };
    if count < 0 { Err(io::Error::last_os_error()) } else { Ok(count as usize) }
}

/// One half of a link whose halves share one socket: a connection costs one file descriptor,
/// not two (a server holding tens of thousands of connections is bounded by its descriptors).
struct SocketHalf<T>(Arc<T>);

impl<T> Read for SocketHalf<T>
where
    for<'a> &'a T: Read,
{
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        (&*self.0).read(buffer)
    }
}

impl<T> Write for SocketHalf<T>
where
    for<'a> &'a T: Write,
{
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        (&*self.0).write(bytes)
    }

    fn write_vectored(&mut self, slices: &[io::IoSlice<'_>]) -> io::Result<usize> {
        (&*self.0).write_vectored(slices)
    }

    fn flush(&mut self) -> io::Result<()> {
        (&*self.0).flush()
    }
}

impl<T: StreamSocket> ReadHalf for SocketHalf<T>
where
    for<'a> &'a T: Read,
{
    fn set_read_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.0.set_read_timeout(timeout)
    }

    fn read_available(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        receive_available(self.0.as_raw_fd(), buffer)
    }

    fn poll_fd(&self) -> Option<RawFd> {
        Some(self.0.as_raw_fd())
    }
}

impl<T: StreamSocket> WriteHalf for SocketHalf<T>
where
    for<'a> &'a T: Write,
{
    fn set_write_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.0.set_write_timeout(timeout)
    }

    fn shutdown(&self) {
        let _ = self.0.shutdown(Shutdown::Both);
    }
}

/// A link whose halves share `stream`.
fn shared_link<T: StreamSocket>(stream: T, peer: PeerIdentity) -> Link
where
    for<'a> &'a T: Read + Write,
{
    let stream = Arc::new(stream);
    Link { reader: Box::new(SocketHalf(stream.clone())), writer: Box::new(SocketHalf(stream)), peer }
}

fn peer_pid(fd: RawFd) -> Option<u32> {
    let mut credentials = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut length = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `length` bytes into `credentials`.
    let result = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut credentials).cast(), &mut length) };
    (result == 0 && credentials.pid > 0).then_some(credentials.pid as u32)
}

fn tcp_link(stream: TcpStream) -> io::Result<Link> {
    stream.set_nodelay(true)?;
    Ok(shared_link(stream, PeerIdentity { pid: None }))
}

fn unix_link(stream: UnixStream) -> io::Result<Link> {
    let pid = peer_pid(stream.as_raw_fd());
    Ok(shared_link(stream, PeerIdentity { pid }))
}

/// Connects to `endpoint`, giving up after `timeout`.
pub fn connect(endpoint: &Endpoint, timeout: Duration) -> io::Result<Link> {
    match endpoint {
        Endpoint::Tcp(address) => {
            let mut last_error = io::Error::new(io::ErrorKind::NotFound, format!("{address} resolves to no address"));
            for socket_address in address.to_socket_addrs()? {
                match TcpStream::connect_timeout(&socket_address, timeout) {
                    Ok(stream) => return tcp_link(stream),
                    Err(error) => last_error = error,
                }
            }
            Err(last_error)
        }
        Endpoint::Unix(path) => unix_link(UnixStream::connect(path)?),
        #[cfg(feature = "testing")]
        Endpoint::Sim(name) => crate::sim::network().connect(name, timeout),
        Endpoint::Ucx(_) => Err(io::Error::new(io::ErrorKind::Unsupported, "UCX endpoints are reached by Connection::open")),
    }
}

/// A listening socket of any kind.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
    #[cfg(feature = "testing")]
    Sim(crate::sim::SimListener),
    Ucx(crate::ucx::UcxListener),
}

impl Listener {
    /// Binds `endpoint`. A TCP port of 0 picks a free port; a stale Unix socket file is
    /// replaced.
    pub fn bind(endpoint: &Endpoint) -> io::Result<Listener> {
        let listener = match endpoint {
            Endpoint::Tcp(address) => Listener::Tcp(TcpListener::bind(address)?),
            Endpoint::Unix(path) => {
                if path.exists() {
                    std::fs::remove_file(path)?;
                }
                Listener::Unix(UnixListener::bind(path)?, path.clone())
            }
            #[cfg(feature = "testing")]
            Endpoint::Sim(name) => return Ok(Listener::Sim(crate::sim::network().bind(name)?)),
            Endpoint::Ucx(address) => return Ok(Listener::Ucx(crate::ucx::UcxListener::bind(address)?)),
        };
        if let Some(fd) = listener.poll_fd() {
            // Listening again only raises the queue of connections the kernel completes
            // before they are accepted (capped by net.core.somaxconn): a storm of clients
            // waits there instead of being dropped and retrying a second later.
            // SAFETY: listen(2) on a socket this listener owns.
            unsafe { libc::listen(fd, LISTEN_BACKLOG) };
        }
        Ok(listener)
    }

    /// The file descriptor to wait on for connections to accept (none for simulated
    /// listeners, which are served by a blocking accept instead).
    pub fn poll_fd(&self) -> Option<RawFd> {
        match self {
            Listener::Tcp(listener) => Some(listener.as_raw_fd()),
            Listener::Unix(listener, _) => Some(listener.as_raw_fd()),
            #[cfg(feature = "testing")]
            Listener::Sim(_) => None,
            Listener::Ucx(listener) => Some(listener.poll_fd()),
        }
    }

    /// Makes [`Listener::accept`] fail with `WouldBlock` instead of waiting (pollable
    /// listeners only).
    pub fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Listener::Tcp(listener) => listener.set_nonblocking(true),
            Listener::Unix(listener, _) => listener.set_nonblocking(true),
            #[cfg(feature = "testing")]
            Listener::Sim(_) => Ok(()),
            // Arms the worker, so that its descriptor reports the first event.
            Listener::Ucx(listener) => {
                listener.progress();
                Ok(())
            }
        }
    }

    /// True if established connections' traffic also arrives through this listener's
    /// descriptor (UCX: the worker's), which must therefore be watched and served even while
    /// accepting pauses ([`Listener::serve_connections`]).
    pub fn carries_connections(&self) -> bool {
        matches!(self, Listener::Ucx(_))
    }

    /// Serves established connections without accepting new ones (accepting pauses).
    pub fn serve_connections(&self) {
        if let Listener::Ucx(listener) = self {
            listener.progress();
        }
    }

    /// After a pause, makes connections that wait to be accepted show on the descriptor
    /// (UCX keeps them inside the worker, where the descriptor does not see them).
    pub fn wake(&self) {
        if let Listener::Ucx(listener) = self {
            listener.wake();
        }
    }

    /// The endpoint clients should use (with the real port if 0 was asked for).
    pub fn local_endpoint(&self) -> io::Result<Endpoint> {
        match self {
            Listener::Tcp(listener) => Ok(Endpoint::Tcp(listener.local_addr()?.to_string())),
            Listener::Unix(_, path) => Ok(Endpoint::Unix(path.clone())),
            #[cfg(feature = "testing")]
            Listener::Sim(listener) => Ok(Endpoint::Sim(listener.name().to_string())),
            Listener::Ucx(listener) => Ok(Endpoint::Ucx(listener.local_address().to_string())),
        }
    }

    pub fn accept(&self) -> io::Result<Link> {
        match self {
            Listener::Tcp(listener) => tcp_link(listener.accept()?.0),
            Listener::Unix(listener, _) => unix_link(listener.accept()?.0),
            #[cfg(feature = "testing")]
            Listener::Sim(listener) => listener.accept(),
            Listener::Ucx(listener) => listener.accept(),
        }
    }

    /// Wakes a thread blocked in [`Listener::accept`] (which then fails) so it can exit.
    pub fn shutdown(&self) {
        let fd = match self {
            Listener::Tcp(listener) => listener.as_raw_fd(),
            Listener::Unix(listener, _) => listener.as_raw_fd(),
            #[cfg(feature = "testing")]
            Listener::Sim(listener) => return listener.shutdown(),
            Listener::Ucx(listener) => return listener.shutdown(),
        };
        // SAFETY: shutting down a listening socket we own; accept() then returns EINVAL.
        unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A number that identifies this host: equal for processes on one machine (and boot),
/// different across machines. Derived from the kernel's boot id and the host name with
/// 64-bit FNV-1a.
pub fn local_host_id() -> u64 {
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in boot_id.trim().bytes().chain([0]).chain(host_name.trim().bytes()) {
        hash ^= byte as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        assert_eq!(Endpoint::parse("127.0.0.1:80"), Ok(Endpoint::Tcp("127.0.0.1:80".into())));
        assert_eq!(Endpoint::parse("tcp://node1:7000"), Ok(Endpoint::Tcp("node1:7000".into())));
        assert_eq!(Endpoint::parse("[::1]:9"), Ok(Endpoint::Tcp("[::1]:9".into())));
        assert_eq!(Endpoint::parse("unix:/tmp/s"), Ok(Endpoint::Unix("/tmp/s".into())));
        assert_eq!(Endpoint::parse("unix:///tmp/s"), Ok(Endpoint::Unix("/tmp/s".into())));
        assert_eq!(Endpoint::parse("ucx://node1:7000"), Ok(Endpoint::Ucx("node1:7000".into())));
        assert_eq!(Endpoint::Ucx("[::1]:9".into()).to_string(), "ucx://[::1]:9");
        for bad in ["node", "node:x", ":80", "unix:", "ucx://", "ucx://node", "ucx://:7"] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Endpoint::Unix("/a".into()).to_string(), "unix:/a");
    }

    #[test]
    fn unix_links_know_the_peer_pid() {
        let path = std::env::temp_dir().join(format!("ringfs-transport-{}.sock", std::process::id()));
        let listener = Listener::bind(&Endpoint::Unix(path.clone())).unwrap();
        let client = connect(&Endpoint::Unix(path.clone()), Duration::from_secs(1)).unwrap();
        let server = listener.accept().unwrap();
        assert_eq!(server.peer.pid, Some(std::process::id()));
        drop(client);
        drop(listener);
        assert!(!path.exists());
    }
}
