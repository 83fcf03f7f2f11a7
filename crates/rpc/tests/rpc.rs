//! End-to-end tests of the RPC layer with a small echo service on real sockets.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ringfs_proto::{Errno, Hello, PROTOCOL_VERSION, Request, Response};
use ringfs_rpc::abandon::{FIRST_LOOK, on_behalf_of};
use ringfs_rpc::{Connection, Endpoint, RpcError};

mod common;

use common::{SECRET, config, start_server, stat, write_request};

#[test]
fn requests_are_answered_over_tcp_and_unix_sockets() {
    let unix_path = std::env::temp_dir().join(format!("ringfs-rpc-test-{}.sock", std::process::id()));
    for endpoint in [Endpoint::Tcp("127.0.0.1:0".into()), Endpoint::Unix(unix_path)] {
        let (server, endpoint, _) = start_server(endpoint);
        let connection = Connection::open(&endpoint, &config(SECRET, 5000)).unwrap();
        assert_eq!(connection.server_name(), "echo");
        assert_eq!(connection.call(&Request::Ping, &[]).unwrap().response, Response::Done);
        assert_eq!(connection.peer_epoch(), 7);
        server.shutdown();
    }
}

#[test]
fn many_requests_in_flight_on_one_connection_each_get_their_answer() {
    let (_server, endpoint, _) = start_server(Endpoint::Tcp("127.0.0.1:0".into()));
    let connection = Connection::open(&endpoint, &config(SECRET, 5000)).unwrap();
    let calls: Vec<_> = (0..50).map(|i| connection.start(&stat(i % 3), &[], None).unwrap()).collect();
    for (i, call) in calls.into_iter().enumerate() {
        assert_eq!(call.wait().unwrap().response, Response::Count(i as u64 % 3));
    }
}

#[test]
fn threads_share_a_connection() {
    let (_server, endpoint, service) = start_server(Endpoint::Tcp("127.0.0.1:0".into()));
    let connection = Arc::new(Connection::open(&endpoint, &config(SECRET, 5000)).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|thread| {
            let connection = connection.clone();
            std::thread::spawn(move || {
                for i in 0..200u64 {
                    let payload = vec![(thread * 31 + i) as u8; (i as usize * 37) % 5000];
                    let mut buffer = vec![0u8; 5000];
                    let call = connection.start(&write_request(), &payload, Some(&mut buffer)).unwrap();
                    let reply = call.wait().unwrap();
                    assert_eq!(reply.data_len, payload.len());
                    assert_eq!(&buffer[..payload.len()], &payload[..]);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(service.handled.load(Ordering::Relaxed), 1600);
}

#[test]
fn large_data_round_trips_into_a_lent_buffer() {
    let (_server, endpoint, _) = start_server(Endpoint::Tcp("127.0.0.1:0".into()));
    let connection = Connection::open(&endpoint, &config(SECRET, 5000)).unwrap();
    let payload: Vec<u8> = (0..(8 << 20)).map(|i| (i % 251) as u8).collect();
    let mut buffer = vec![0u8; payload.len()];
    let reply = connection.start(&write_request(), &payload, Some(&mut buffer)).unwrap().wait().unwrap();
    assert_eq!(reply.data_len, payload.len());
    assert!(reply.data.is_empty());
    assert!(buffer == payload);
    // Without a buffer the data comes back in the reply.
    let reply = connection.call(&write_request(), &payload[..1000]).unwrap();
    assert_eq!(reply.data, &payload[..1000]);
}

#[test]
fn a_wrong_secret_is_refused() {
    let (_server, endpoint, _) = start_server(Endpoint::Tcp("127.0.0.1:0".into()));
    match Connection::open(&endpoint, &config(b"wrong", 5000)) {
        Err(RpcError::Refused { errno, .. }) => assert_eq!(errno, Errno::EACCES),
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a wrong secret must be refused"),
    }
}

#[test]
fn a_slow_answer_times_out_without_breaking_the_connection() {
    let (_server, endpoint, _) = start_server(Endpoint::Tcp("127.0.0.1:0".into()));
    let connection = Connection::open(&endpoint, &config(SECRET, 300)).unwrap();
    let started = Instant::now();
    let error = connection.call(&stat(800), &[]).unwrap_err();
    assert!(matches!(error, RpcError::Timeout { .. }), "{error}");
    assert_eq!(error.errno(), Errno::EIO);
    assert!(started.elapsed() < Duration::from_millis(700));
    // Once the late answer has arrived it is discarded, and the connection still works.
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(connection.call(&stat(0), &[]).unwrap().response, Response::Count(0));
}

/// A wait made on behalf of a caller that is being killed (`abandon`) ends soon after its
/// first look, with EINTR, leaving the connection usable; a caller that is not being killed
/// waits for its answer; and a handshake with a server that never answers is given up too.
#[test]
fn waits_for_a_caller_being_killed_are_given_up() {
    let (_server, endpoint, _) = start_server(Endpoint::Tcp("127.0.0.1:0".into()));
    let connection = Connection::open(&endpoint, &config(SECRET, 3000)).unwrap();
    let killed = |_: u32| true;
    let alive = |_: u32| false;
    let started = Instant::now();
    let error = on_behalf_of(7, killed, || connection.call(&stat(2000), &[])).unwrap_err();
    let waited = started.elapsed();
    assert!(error.is_abandoned(), "{error}");
    assert_eq!(error.errno(), Errno::EINTR);
    assert!(waited >= FIRST_LOOK && waited < FIRST_LOOK + Duration::from_millis(500), "gave up after {waited:?}");
    let answer = on_behalf_of(7, alive, || connection.call(&stat(400), &[])).unwrap();
    assert_eq!(answer.response, Response::Count(400), "a caller not being killed gets its answer");
    assert!(connection.call(&stat(0), &[]).is_ok(), "outside any caller, as before");

    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_endpoint = Endpoint::Tcp(silent.local_addr().unwrap().to_string());
    let started = Instant::now();
    let error = on_behalf_of(7, killed, || Connection::open(&silent_endpoint, &config(SECRET, 3000))).err().expect("no handshake");
    assert!(error.is_abandoned(), "{error}");
    assert!(started.elapsed() < Duration::from_secs(1), "gave the handshake up after {:?}", started.elapsed());
}

#[test]
fn malformed_and_oversized_frames_close_only_their_connection() {
    let (_server, endpoint, _) = start_server(Endpoint::Tcp("127.0.0.1:0".into()));
    let good = Connection::open(&endpoint, &config(SECRET, 5000)).unwrap();
    let address = match &endpoint {
        Endpoint::Tcp(address) => address.clone(),
        Endpoint::Unix(_) | Endpoint::Sim(_) | Endpoint::Ucx(_) => unreachable!("a TCP endpoint was asked for"),
    };
    let garbage_frames: Vec<Vec<u8>> = vec![
        // Body length beyond the limit.
        ringfs_proto::FrameHeader { body_len: u32::MAX, data_len: 0, request_id: 1, epoch: 0 }.encode().to_vec(),
        // A valid header with an undecodable body.
        [ringfs_proto::FrameHeader { body_len: 3, data_len: 0, request_id: 1, epoch: 0 }.encode().to_vec(), vec![0xEE, 1, 2]].concat(),
    ];
    for garbage in garbage_frames {
        let mut socket = std::net::TcpStream::connect(&address).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // A proper handshake first, so the garbage arrives on an accepted connection.
        let mut hello = Vec::new();
        Request::Hello(Hello {
            version: PROTOCOL_VERSION,
            secret: SECRET.to_vec(),
            client_pid: 0,
            host_id: 0,
            from_server: false,
            memory_probe: None,
            client_id: 0,
            timeout_ms: 0,
            clock_ns: 0,
            credentials: Default::default(),
        })
        .encode(&mut hello);
        let header = ringfs_proto::FrameHeader { body_len: hello.len() as u32, data_len: 0, request_id: 1, epoch: 0 };
        socket.write_all(&[header.encode().as_slice(), &hello].concat()).unwrap();
        let mut reply_header = [0u8; ringfs_proto::HEADER_LEN];
        std::io::Read::read_exact(&mut socket, &mut reply_header).unwrap();
        let reply_header = ringfs_proto::FrameHeader::decode(&reply_header).unwrap();
        let mut reply_body = vec![0u8; reply_header.body_len as usize];
        std::io::Read::read_exact(&mut socket, &mut reply_body).unwrap();
        assert!(matches!(Response::decode(&reply_body), Ok(Response::Hello(_))));

        socket.write_all(&garbage).unwrap();
        let mut answer = Vec::new();
        let read = std::io::Read::read_to_end(&mut socket, &mut answer);
        assert!(read.is_ok() && answer.is_empty(), "the server must close the bad connection without answering");
    }
    assert_eq!(good.call(&Request::Ping, &[]).unwrap().response, Response::Done);
}

#[test]
fn a_vanished_server_fails_requests_quickly() {
    let (server, endpoint, _) = start_server(Endpoint::Tcp("127.0.0.1:0".into()));
    let connection = Connection::open(&endpoint, &config(SECRET, 10_000)).unwrap();
    let call = connection.start(&stat(2_000), &[], None).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    server.shutdown();
    // The handler is still sleeping; when it answers, the request succeeds; a new connection
    // is refused because nobody accepts any more.
    assert_eq!(call.wait().unwrap().response, Response::Count(2_000));
    assert!(Connection::open(&endpoint, &config(SECRET, 1000)).is_err());
}

/// The simulated network carries requests like a socket, delays frames so that answers
/// overtake each other, and loses and duplicates exactly what its seeded plan says.
#[test]
fn a_simulated_link_carries_requests_and_loses_or_repeats_what_the_plan_says() {
    use ringfs_rpc::sim::{FaultPlan, network};
    let name = format!("rpc-test-{}", std::process::id());
    let (server, endpoint, service) = start_server(Endpoint::Sim(name.clone()));
    let connection = Connection::open(&endpoint, &config(SECRET, 300)).unwrap();
    assert_eq!(connection.call(&Request::Ping, &[]).unwrap().response, Response::Done);
    // Delays: every answer still arrives, to the right caller.
    network().set_plan(FaultPlan { max_delay: Duration::from_millis(5), ..FaultPlan::default() }, 3);
    let calls: Vec<_> = (0..20).map(|index| connection.start(&stat(index % 3), &[], None).unwrap()).collect();
    for (index, call) in calls.into_iter().enumerate() {
        assert_eq!(call.wait().unwrap().response, Response::Count(index as u64 % 3));
    }
    // Everything lost: the call times out; the link stays usable afterwards.
    network().set_plan(FaultPlan { drop_per_million: 1_000_000, ..FaultPlan::default() }, 3);
    assert!(connection.call(&Request::Ping, &[]).unwrap_err().is_timeout());
    // Everything duplicated: the server handles each request twice.
    network().set_plan(FaultPlan { duplicate_per_million: 1_000_000, ..FaultPlan::default() }, 3);
    let before = service.handled.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(connection.call(&stat(1), &[]).unwrap().response, Response::Count(1));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(service.handled.load(std::sync::atomic::Ordering::Relaxed) - before, 2);
    network().set_plan(FaultPlan::default(), 0);
    // A paused server answers after it is resumed; nothing is lost.
    network().pause(&name, true);
    let call = connection.start(&Request::Ping, &[], None).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    network().pause(&name, false);
    assert_eq!(call.wait().unwrap().response, Response::Done);
    server.shutdown();
}
