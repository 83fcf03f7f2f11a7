//! The echo service and the helpers the RPC tests share (`rpc.rs` over TCP and Unix sockets,
//! `ucx.rs` over UCX).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ringfs_proto::{Errno, Hello, HelloReply, PROTOCOL_VERSION, Request, Response};
use ringfs_rpc::{ConnectionConfig, Endpoint, Listener, PeerIdentity, RpcServer, Service};

pub const SECRET: &[u8] = b"test-secret";

/// Answers `Ping` with `Done`, `Stat` with a `Count` of its index (sleeping that many ms),
/// and `Write` by echoing its data back (after sleeping `offset` ms).
pub struct Echo {
    /// Requests handled so far.
    pub handled: AtomicU64,
}

impl Service for Echo {
    type Session = ();

    fn hello(&self, hello: &Hello, _peer: &PeerIdentity, _session: &mut ()) -> Result<HelloReply, Errno> {
        if hello.secret != SECRET {
            return Err(Errno::EACCES);
        }
        Ok(HelloReply { version: PROTOCOL_VERSION, server_name: "echo".into(), memory_access: false, memory_probe: None })
    }

    fn handle(&self, _session: &mut (), request: Request, data: &[u8], reply_data: &mut Vec<u8>) -> Response {
        self.handled.fetch_add(1, Ordering::Relaxed);
        match request {
            Request::Ping => Response::Done,
            Request::Stat(request) => {
                std::thread::sleep(Duration::from_millis(request.file.serial));
                Response::Count(request.file.serial)
            }
            Request::Write(write) => {
                std::thread::sleep(Duration::from_millis(write.offset));
                reply_data.extend_from_slice(data);
                Response::Written(data.len() as u64)
            }
            _ => Response::Error(Errno::ENOSYS),
        }
    }

    fn epoch(&self) -> u64 {
        7
    }
}

/// An echo server listening at `endpoint` (port 0: any free one); the endpoint it got.
pub fn start_server(endpoint: Endpoint) -> (RpcServer, Endpoint, Arc<Echo>) {
    start_server_polling(endpoint, ringfs_rpc::DEFAULT_POLL)
}

/// [`start_server`] whose threads poll a quiet connection for `poll`.
pub fn start_server_polling(endpoint: Endpoint, poll: Duration) -> (RpcServer, Endpoint, Arc<Echo>) {
    let listener = Listener::bind(&endpoint).unwrap();
    let endpoint = listener.local_endpoint().unwrap();
    let service = Arc::new(Echo { handled: AtomicU64::new(0) });
    (RpcServer::start(service.clone(), vec![listener], poll).unwrap(), endpoint, service)
}

pub fn config(secret: &[u8], timeout_ms: u64) -> ConnectionConfig {
    ConnectionConfig {
        secret: secret.to_vec(),
        timeout: Duration::from_millis(timeout_ms),
        host_id: 0,
        from_server: false,
        poll: ringfs_rpc::DEFAULT_POLL,
        client_id: 1,
        credentials: Default::default(),
    }
}

/// A request the echo service answers with `Count(index)` after sleeping `index` ms.
pub fn stat(index: u64) -> Request {
    Request::Stat(ringfs_proto::FileOnly { file: ringfs_proto::FileId { anchor: 0, serial: index } })
}

/// A write the echo service answers at once with its data.
pub fn write_request() -> Request {
    slow_write(0)
}

/// A write the echo service answers with its data after `delay_ms`.
#[allow(dead_code, reason = "each test binary compiles this module; rpc.rs does not use it")]
pub fn slow_write(delay_ms: u64) -> Request {
    Request::Write(ringfs_proto::Write {
        chunk: ringfs_proto::ChunkKey::default(),
        offset: delay_ms,
        source: ringfs_proto::WriteSource::Inline,
        template: ringfs_proto::ChunkTemplate { mode: 0, uid: 0, gid: 0, chunk_size: 0, backend_len: 0 },
        time_ns: 0,
    })
}
