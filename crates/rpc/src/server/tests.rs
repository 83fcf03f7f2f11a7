//! The event loop against real sockets: blocked handlers, idle connections, handshake
//! limits, order of answers, shutdown.

use ringfs_sync::{Condvar, Mutex};
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use super::*;
use crate::{Connection, ConnectionConfig, Endpoint, RpcError};

/// Answers `Ping` at once, `Stats` only once the gate opens (a handler that blocks), and
/// `GetMembers` with how many requests its session saw (`Written(n)`).
#[derive(Default)]
struct TestService {
    gate_open: Mutex<bool>,
    gate: Condvar,
    blocked: AtomicU64,
    closed: AtomicU64,
}

impl TestService {
    fn open_gate(&self) {
        *self.gate_open.lock() = true;
        self.gate.notify_all();
    }
}

impl Service for TestService {
    type Session = u64;

    fn hello(&self, hello: &Hello, _peer: &PeerIdentity, _session: &mut u64) -> Result<HelloReply, Errno> {
        if hello.secret != b"secret" {
            return Err(Errno::EACCES);
        }
        Ok(HelloReply { version: hello.version, server_name: "test".into(), memory_access: false, memory_probe: None })
    }

    fn handle(&self, session: &mut u64, request: Request, _data: &[u8], _reply_data: &mut Vec<u8>) -> Response {
        *session += 1;
        match request {
            Request::Stats => {
                self.blocked.fetch_add(1, Ordering::SeqCst);
                let mut open = self.gate_open.lock();
                while !*open {
                    self.gate.wait(&mut open);
                }
                Response::Done
            }
            Request::GetMembers => Response::Written(*session),
            _ => Response::Done,
        }
    }

    fn epoch(&self) -> u64 {
        0
    }

    fn closed(&self, _session: &mut u64) {
        self.closed.fetch_add(1, Ordering::SeqCst);
    }
}

fn config() -> ConnectionConfig {
    ConnectionConfig {
        secret: b"secret".to_vec(),
        timeout: Duration::from_secs(10),
        host_id: 0,
        from_server: false,
        poll: Duration::from_micros(50),
        client_id: 1,
        credentials: Default::default(),
    }
}

fn start(limits: ServerLimits) -> (Arc<TestService>, RpcServer, Endpoint) {
    let service = Arc::new(TestService::default());
    let listener = Listener::bind(&Endpoint::Tcp("127.0.0.1:0".into())).unwrap();
    let endpoint = listener.local_endpoint().unwrap();
    let server = RpcServer::start_with_limits(service.clone(), vec![listener], Duration::from_micros(50), limits).unwrap();
    (service, server, endpoint)
}

fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn requests_blocked_in_their_handlers_do_not_stall_other_connections() {
    let (service, server, endpoint) = start(ServerLimits::default());
    let blocked: Vec<Arc<Connection>> = (0..8).map(|_| Arc::new(Connection::open(&endpoint, &config()).unwrap())).collect();
    let waiters: Vec<_> = blocked
        .iter()
        .map(|connection| {
            let connection = connection.clone();
            std::thread::spawn(move || connection.call(&Request::Stats, &[]).map(|reply| reply.response))
        })
        .collect();
    wait_for("8 blocked handlers", || service.blocked.load(Ordering::SeqCst) == 8);
    let free = Connection::open(&endpoint, &config()).unwrap();
    for _ in 0..100 {
        assert_eq!(free.call(&Request::Ping, &[]).unwrap().response, Response::Done);
    }
    assert!(server.counters().threads > 8, "a thread per blocked handler and one more: {:?}", server.counters());
    service.open_gate();
    for waiter in waiters {
        assert_eq!(waiter.join().unwrap().unwrap(), Response::Done);
    }
    // Idle threads above the minimum end.
    wait_for("the pool to shrink", || server.counters().threads <= event_loop::MIN_THREADS);
}

#[test]
fn idle_connections_cost_no_thread() {
    let (_service, server, endpoint) = start(ServerLimits::default());
    let connections: Vec<Connection> = (0..300).map(|_| Connection::open(&endpoint, &config()).unwrap()).collect();
    assert_eq!(server.counters().connections, 300);
    // Threads follow how many connections are busy at once (a few here), and the ones
    // beyond the minimum end once idle, while every connection stays open and served.
    assert!(server.counters().threads <= 16, "{:?}", server.counters());
    wait_for("the pool to shrink", || server.counters().threads <= event_loop::MIN_THREADS);
    for connection in connections.iter().step_by(30) {
        assert_eq!(connection.call(&Request::Ping, &[]).unwrap().response, Response::Done);
    }
    assert_eq!(server.counters().connections, 300);
}

#[test]
fn a_connections_requests_are_answered_in_order_with_its_own_session() {
    let (_service, _server, endpoint) = start(ServerLimits::default());
    let first = Connection::open(&endpoint, &config()).unwrap();
    let second = Connection::open(&endpoint, &config()).unwrap();
    let calls: Vec<_> = (0..50).map(|_| first.start(&Request::GetMembers, &[], None).unwrap()).collect();
    let counts: Vec<Response> = calls.into_iter().map(|call| call.wait().unwrap().response).collect();
    assert_eq!(counts, (1..=50).map(Response::Written).collect::<Vec<_>>());
    assert_eq!(second.call(&Request::GetMembers, &[]).unwrap().response, Response::Written(1));
}

#[test]
fn silent_connections_pause_accepting_until_their_deadline_and_nobody_is_refused() {
    let limits = ServerLimits { max_handshakes: 4, handshake_deadline: Duration::from_millis(700), ..ServerLimits::default() };
    let (_service, server, endpoint) = start(limits);
    let Endpoint::Tcp(address) = &endpoint else { unreachable!() };
    let silent: Vec<std::net::TcpStream> = (0..4).map(|_| std::net::TcpStream::connect(address).unwrap()).collect();
    wait_for("4 pending handshakes", || server.counters().handshakes == 4);
    let started = Instant::now();
    let late = Connection::open(&endpoint, &config()).expect("a client beyond the handshake limit waits, it is not refused");
    assert!(started.elapsed() >= Duration::from_millis(300), "accepted after {:?}", started.elapsed());
    assert_eq!(late.call(&Request::Ping, &[]).unwrap().response, Response::Done);
    // The silent ones were closed at their deadline.
    for mut socket in silent {
        socket.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut byte = [0u8; 1];
        assert_eq!(std::io::Read::read(&mut socket, &mut byte).unwrap_or(0), 0);
    }
}

#[test]
fn connections_beyond_the_limit_are_refused_with_emfile_and_wrong_secrets_with_eacces() {
    let (_service, server, endpoint) = start(ServerLimits { max_connections: 3, ..ServerLimits::default() });
    let held: Vec<Connection> = (0..3).map(|_| Connection::open(&endpoint, &config()).unwrap()).collect();
    match Connection::open(&endpoint, &config()) {
        Err(RpcError::Refused { errno, .. }) => assert_eq!(errno, Errno::EMFILE),
        other => panic!("expected EMFILE, got {:?}", other.map(|_| ())),
    }
    drop(held);
    wait_for("the held connections to close", || server.counters().connections == 0);
    let wrong = ConnectionConfig { secret: b"wrong".to_vec(), ..config() };
    assert!(matches!(Connection::open(&endpoint, &wrong), Err(RpcError::Refused { errno: Errno::EACCES, .. })));
    assert!(Connection::open(&endpoint, &config()).is_ok());
}

#[test]
fn shutdown_closes_idle_connections_and_ends_the_threads() {
    let (service, server, endpoint) = start(ServerLimits::default());
    let connections: Vec<Connection> = (0..20).map(|_| Connection::open(&endpoint, &config()).unwrap()).collect();
    assert_eq!(connections[0].call(&Request::Ping, &[]).unwrap().response, Response::Done);
    server.shutdown();
    wait_for("every session closed", || service.closed.load(Ordering::SeqCst) == 20);
    assert!(connections[1].call(&Request::Ping, &[]).is_err());
    wait_for("the threads to end", || server.counters().threads == 0);
}

#[test]
fn a_stopped_server_is_waited_for_until_its_last_thread_has_ended() {
    let (service, server, endpoint) = start(ServerLimits::default());
    assert!(server.counters().running_threads >= 2, "the event loop's threads and its watcher");
    let blocked = Connection::open(&endpoint, &config()).unwrap();
    let call = blocked.start(&Request::Stats, &[], None);
    wait_for("the handler to block", || service.blocked.load(Ordering::SeqCst) == 1);
    assert!(!server.shutdown_and_wait(Duration::from_millis(200)), "a handler is still inside");
    assert!(server.counters().running_threads >= 1);
    service.open_gate();
    assert!(server.shutdown_and_wait(Duration::from_secs(20)));
    assert_eq!(server.counters().running_threads, 0);
    drop(call);
    // Nothing of the server holds the service any more (only the server itself).
    let holders = Arc::strong_count(&service);
    drop(server);
    assert_eq!(Arc::strong_count(&service), holders - 1);
}

#[test]
fn links_without_a_descriptor_are_served_by_threads_of_their_own() {
    let service = Arc::new(TestService::default());
    let name = format!("rpc-server-test-{}", std::process::id());
    let listener = Listener::bind(&Endpoint::Sim(name.clone())).unwrap();
    let server = RpcServer::start(service, vec![listener], Duration::ZERO).unwrap();
    let connection = Connection::open(&Endpoint::Sim(name), &config()).unwrap();
    assert_eq!(connection.call(&Request::GetMembers, &[]).unwrap().response, Response::Written(1));
    assert_eq!(server.counters().connections, 1);
    assert!(server.shutdown_and_wait(Duration::from_secs(20)), "the accepting thread and the link's thread end");
}
