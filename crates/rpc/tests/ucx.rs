//! The RPC layer over UCX (`ucx://` endpoints): the event-loop server and the pipelined client
//! with an echo service, over UCX's TCP transport and over its shared-memory transports, with
//! large data inside the messages (what `auto` picks where RMA is emulated) and by RMA
//! (forced with RINGFS_UCX_BULK=rma). Each variant runs in a child process of this test
//! binary, because UCX reads its transports, and ringfs its bulk mode, once per process.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ringfs_proto::{Errno, FrameHeader, Request, Response};
use ringfs_rpc::{Connection, Endpoint, RpcError, RpcServer};

mod common;

use common::{SECRET, config, slow_write, stat, write_request};

fn start_server() -> (RpcServer, Endpoint, Arc<common::Echo>) {
    common::start_server(Endpoint::parse("ucx://127.0.0.1:0").unwrap())
}

/// The longest of `pings` pings on `connection`, `pause` apart (each must be answered).
fn slowest_ping(connection: &Connection, pings: usize, pause: Duration) -> Duration {
    let mut slowest = Duration::ZERO;
    for _ in 0..pings {
        let started = Instant::now();
        assert_eq!(connection.call(&Request::Ping, &[]).unwrap().response, Response::Done);
        slowest = slowest.max(started.elapsed());
        std::thread::sleep(pause);
    }
    slowest
}

fn requests_are_answered_and_the_lanes_reported() {
    let (server, endpoint, _) = start_server();
    assert!(endpoint.to_string().starts_with("ucx://127.0.0.1:"), "{endpoint}");
    let connection = Connection::open(&endpoint, &config(SECRET, 5000)).unwrap();
    assert_eq!(connection.server_name(), "echo");
    assert_eq!(connection.call(&Request::Ping, &[]).unwrap().response, Response::Done);
    assert_eq!(connection.peer_epoch(), 7);
    let lanes = connection.ucx_lanes().expect("a UCX connection reports its lanes");
    let expected = if std::env::var("UCX_TLS").as_deref() == Ok("tcp") { "tcp/" } else { "/memory" };
    assert!(lanes.contains(expected) && lanes.contains("am"), "lanes {lanes:?} for UCX_TLS={:?}", std::env::var("UCX_TLS"));
    server.shutdown();
}

/// A client that closes its connection and opens another to the same server at once (as
/// after an idle close, or a test sending one request per connection) gets a working one.
fn connections_closed_and_reopened_at_once_each_work() {
    let (server, endpoint, _) = start_server();
    for round in 0..30 {
        let connection = Connection::open(&endpoint, &config(SECRET, 5000)).unwrap_or_else(|error| panic!("round {round}: {error}"));
        assert_eq!(connection.call(&Request::Ping, &[]).unwrap().response, Response::Done, "round {round}");
    }
    server.shutdown();
}

/// Threads opening and closing connections as fast as they can to a server in their own
/// process (a server's calls to another server beside the connections it accepts; a
/// global-memory rank's client beside its cache): with a UCX worker for the client side and
/// one for the server, UCX 1.13 aborted such a process within seconds (`async.c:643`, see
/// `ringfs_rpc::ucx`); with one worker per process, it goes on.
fn connections_churned_beside_a_server_in_the_same_process() {
    let (server, endpoint, _) = start_server();
    let until = Instant::now() + Duration::from_secs(5);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let endpoint = endpoint.clone();
            std::thread::spawn(move || {
                let mut opened = 0;
                while Instant::now() < until && opened < 2_000 {
                    let connection = Connection::open(&endpoint, &config(SECRET, 5000)).unwrap();
                    assert_eq!(connection.call(&Request::Ping, &[]).unwrap().response, Response::Done);
                    opened += 1;
                }
                opened
            })
        })
        .collect();
    let opened: usize = threads.into_iter().map(|thread| thread.join().unwrap()).sum();
    assert!(opened >= 30, "only {opened} connections in 5 s");
    server.shutdown();
}

fn pipelined_requests_each_get_their_answer() {
    let (_server, endpoint, _) = start_server();
    let connection = Connection::open(&endpoint, &config(SECRET, 5000)).unwrap();
    let calls: Vec<_> = (0..50).map(|i| connection.start(&stat(i % 3), &[], None).unwrap()).collect();
    for (i, call) in calls.into_iter().enumerate() {
        assert_eq!(call.wait().unwrap().response, Response::Count(i as u64 % 3));
    }
}

fn threads_share_a_connection_with_data_of_every_size() {
    let (_server, endpoint, service) = start_server();
    let connection = Arc::new(Connection::open(&endpoint, &config(SECRET, 10_000)).unwrap());
    let threads: Vec<_> = (0..6)
        .map(|thread| {
            let connection = connection.clone();
            std::thread::spawn(move || {
                for i in 0..100u64 {
                    // Below and above the 32 KiB RMA threshold, into a buffer that fits or not.
                    let length = ((thread * 7919 + i * 104_729) % (160 << 10)) as usize;
                    let payload: Vec<u8> = (0..length).map(|byte| (byte as u64 * 31 + thread + i) as u8).collect();
                    let mut buffer = vec![0u8; if i % 5 == 0 { length / 2 } else { 160 << 10 }];
                    let call = connection.start(&write_request(), &payload, Some(&mut buffer)).unwrap();
                    let reply = call.wait().unwrap();
                    assert_eq!(reply.response, Response::Written(length as u64));
                    assert_eq!(reply.data_len, length);
                    if length <= buffer.len() {
                        assert!(reply.data.is_empty());
                        assert!(buffer[..length] == payload[..], "thread {thread} request {i}: data in the lent buffer");
                    } else {
                        assert!(reply.data == payload, "thread {thread} request {i}: data in the reply");
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(service.handled.load(Ordering::Relaxed), 600);
}

/// Threads waiting on one connection take turns progressing the worker and sleep on their
/// own inbox, which is signalled only while they sleep: each must still get its answer, also
/// the last ones, after which no other message comes to wake a sleeper that was missed.
fn threads_waiting_on_one_connection_each_get_their_answer() {
    let (_server, endpoint, service) = start_server();
    let connection = Arc::new(Connection::open(&endpoint, &config(SECRET, 5000)).unwrap());
    let threads: Vec<_> = (0..8u64)
        .map(|thread| {
            let connection = connection.clone();
            std::thread::spawn(move || {
                for i in 0..200u64 {
                    // Mostly immediate answers, sometimes one that makes the others sleep.
                    let request = if (thread + i) % 50 == 0 { stat(2) } else { Request::Ping };
                    let reply = connection.call(&request, &[]).unwrap_or_else(|error| panic!("thread {thread} request {i}: {error}"));
                    assert_ne!(reply.response, Response::Error(Errno::ENOSYS));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(service.handled.load(Ordering::Relaxed), 1600);
}

fn large_data_round_trips() {
    let (_server, endpoint, _) = start_server();
    let connection = Connection::open(&endpoint, &config(SECRET, 10_000)).unwrap();
    let payload: Vec<u8> = (0..(8 << 20)).map(|i| (i % 251) as u8).collect();
    for _ in 0..3 {
        let mut buffer = vec![0u8; payload.len()];
        let reply = connection.start(&write_request(), &payload, Some(&mut buffer)).unwrap().wait().unwrap();
        assert_eq!(reply.data_len, payload.len());
        assert!(reply.data.is_empty());
        assert!(buffer == payload);
    }
    let reply = connection.call(&write_request(), &payload[..1 << 20]).unwrap();
    assert!(reply.data == payload[..1 << 20], "without a lent buffer the data comes back in the reply");
}

fn a_wrong_secret_is_refused_and_others_go_on() {
    let (_server, endpoint, _) = start_server();
    let good = Connection::open(&endpoint, &config(SECRET, 5000)).unwrap();
    match Connection::open(&endpoint, &config(b"wrong", 5000)) {
        Err(RpcError::Refused { errno, .. }) => assert_eq!(errno, Errno::EACCES),
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a wrong secret must be refused"),
    }
    assert_eq!(good.call(&Request::Ping, &[]).unwrap().response, Response::Done);
}

fn a_slow_answer_times_out() {
    let (_server, endpoint, _) = start_server();
    let connection = Connection::open(&endpoint, &config(SECRET, 300)).unwrap();
    let started = Instant::now();
    let error = connection.call(&stat(800), &[]).unwrap_err();
    assert!(error.is_timeout(), "{error}");
    assert_eq!(error.errno(), Errno::EIO);
    assert!(started.elapsed() < Duration::from_millis(700));
    // Nothing was lent: once the late answer has come, the connection still works.
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(connection.call(&stat(0), &[]).unwrap().response, Response::Count(0));
}

fn a_request_given_up_after_lending_memory_breaks_the_connection() {
    let (_server, endpoint, _) = start_server();
    let connection = Connection::open(&endpoint, &config(SECRET, 300)).unwrap();
    let payload = vec![7u8; 256 << 10];
    let mut buffer = vec![0u8; 256 << 10];
    let error = connection.start(&slow_write(800), &payload, Some(&mut buffer)).unwrap().wait().unwrap_err();
    assert!(error.is_timeout(), "{error}");
    std::thread::sleep(Duration::from_millis(700));
    let after = connection.call(&Request::Ping, &[]);
    if std::env::var(ringfs_rpc::ucx::BULK_VARIABLE).as_deref() == Ok("rma") {
        // The server could still have read or written the lent buffers: the connection is gone.
        assert!(matches!(after, Err(RpcError::Broken { .. })), "{after:?}");
        assert!(buffer.iter().all(|byte| *byte == 0), "nothing landed in the buffer after the call was given up");
    } else {
        assert_eq!(after.unwrap().response, Response::Done, "nothing was lent: the connection goes on");
    }
}

fn a_stopped_server_fails_requests_in_bounded_time() {
    let (server, endpoint, _) = start_server();
    let connection = Connection::open(&endpoint, &config(SECRET, 2000)).unwrap();
    assert_eq!(connection.call(&Request::Ping, &[]).unwrap().response, Response::Done);
    server.shutdown();
    drop(server);
    let started = Instant::now();
    let failed = (0..3).map(|_| connection.call(&Request::Ping, &[])).filter(Result::is_err).count();
    assert!(failed >= 1, "requests to a stopped server must fail");
    assert!(started.elapsed() < Duration::from_secs(7), "failed within the timeouts: {:?}", started.elapsed());
    let started = Instant::now();
    assert!(Connection::open(&endpoint, &config(SECRET, 1000)).is_err());
    assert!(started.elapsed() < Duration::from_secs(3), "a refused connection fails in bounded time");
}

/// An idle connection whose server went away is known to be broken once the process's
/// worker has seen the endpoint fail (here: while another connection is used), before a
/// request is sent on it: pools (a home's connections to rank caches, the client's table)
/// then open a new connection instead of failing a request on the old one. Found in a
/// global-memory loop where a new rank's cache listened on the port of one that had ended.
fn an_idle_connection_to_a_stopped_server_is_known_broken_before_use() {
    let (server, endpoint, _) = start_server();
    let (other, other_endpoint, _) = start_server();
    let idle = Connection::open(&endpoint, &config(SECRET, 2000)).unwrap();
    let busy = Connection::open(&other_endpoint, &config(SECRET, 2000)).unwrap();
    assert_eq!(idle.call(&Request::Ping, &[]).unwrap().response, Response::Done);
    assert!(!idle.is_broken());
    server.shutdown();
    drop(server);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !idle.is_broken() && Instant::now() < deadline {
        assert_eq!(busy.call(&Request::Ping, &[]).unwrap().response, Response::Done);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(idle.is_broken(), "the idle connection to the stopped server is still offered as working");
    drop(other);
}

/// A raw UCX peer that speaks the transport but breaks the protocol: garbage before the
/// handshake, a request header that does not decode, RMA before the handshake. Each closes
/// only its own connection.
fn garbage_from_a_raw_ucx_peer_closes_only_its_connection() {
    use ringfs_ucx::frames::{REQUEST, wire::Descriptor, wire::RequestHeader};
    let (_server, endpoint, service) = start_server();
    let good = Connection::open(&endpoint, &config(SECRET, 5000)).unwrap();
    let Endpoint::Ucx(address) = &endpoint else { unreachable!("a UCX endpoint") };
    let context = ringfs_ucx::Context::new(&ringfs_ucx::ContextConfig::default()).unwrap();
    let worker = ringfs_ucx::Worker::new(&context).unwrap();
    let garbage: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (b"not a header".to_vec(), b"payload".to_vec()),
        (FrameHeader { body_len: 5, data_len: 0, request_id: 1, epoch: 0 }.encode().to_vec(), vec![0xEE; 5]),
        {
            let source = Descriptor { address: 4096, length: 64 << 10, key: vec![1; 16] };
            let frame = FrameHeader { body_len: 3, data_len: 64 << 10, request_id: 2, epoch: 0 };
            let mut header = Vec::new();
            RequestHeader { frame, source: Some(source), destination: None, eager_reply: true }.encode(&mut header);
            (header, vec![1, 2, 3])
        },
    ];
    for (header, payload) in garbage {
        let raw = worker.connect(address.parse().unwrap()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        raw.send_and_wait(REQUEST, &header, &payload, deadline).unwrap();
        while raw.failure().is_none() {
            worker.progress();
            assert!(Instant::now() < deadline, "the server must close a connection that breaks the protocol");
        }
    }
    assert_eq!(service.handled.load(Ordering::Relaxed), 0, "nothing of the garbage reached the service");
    assert_eq!(good.call(&Request::Ping, &[]).unwrap().response, Response::Done);
}

/// CPU time (user and system) this process has used.
fn process_cpu_time() -> Duration {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let time = |value: libc::timeval| Duration::from_secs(value.tv_sec as u64) + Duration::from_micros(value.tv_usec as u64);
    time(usage.ru_utime) + time(usage.ru_stime)
}

fn an_idle_server_and_client_do_not_spin() {
    let (_server, endpoint, _) = start_server();
    let connections: Vec<Connection> = (0..4).map(|_| Connection::open(&endpoint, &config(SECRET, 5000)).unwrap()).collect();
    for connection in &connections {
        assert_eq!(connection.call(&Request::Ping, &[]).unwrap().response, Response::Done);
    }
    std::thread::sleep(Duration::from_millis(300));
    let before = process_cpu_time();
    std::thread::sleep(Duration::from_secs(1));
    let used = process_cpu_time() - before;
    assert!(used < Duration::from_millis(100), "an idle UCX server and its idle clients used {used:?} of CPU in 1 s");
}

/// Requests on a connection its server thread is polling are taken by that thread: the
/// listener (the worker's descriptor) wakes no other thread for them (server/carrier.rs).
fn a_polled_connection_does_not_wake_the_listener() {
    let (server, endpoint, _) = common::start_server_polling(Endpoint::parse("ucx://127.0.0.1:0").unwrap(), Duration::from_millis(20));
    let connection = Connection::open(&endpoint, &config(SECRET, 5000)).unwrap();
    assert_eq!(connection.call(&Request::Ping, &[]).unwrap().response, Response::Done);
    const PINGS: u64 = 2_000;
    let before = server.counters().carrier_wakeups;
    for _ in 0..PINGS {
        assert_eq!(connection.call(&Request::Ping, &[]).unwrap().response, Response::Done);
    }
    let wakeups = server.counters().carrier_wakeups - before;
    assert!(wakeups < PINGS / 10, "{wakeups} listener wake-ups for {PINGS} requests on a polled connection");
    server.shutdown();
}

/// While the thread that polled a connection waits in a slow handler, another connection's
/// requests are still answered at once (the listener is watched again within a tick).
fn a_slow_handler_does_not_hold_up_other_connections() {
    let (server, endpoint, _) = common::start_server_polling(Endpoint::parse("ucx://127.0.0.1:0").unwrap(), Duration::from_millis(5));
    let busy = Connection::open(&endpoint, &config(SECRET, 5000)).unwrap();
    let other = Connection::open(&endpoint, &config(SECRET, 5000)).unwrap();
    assert_eq!(other.call(&Request::Ping, &[]).unwrap().response, Response::Done);
    // Both connections quiet for longer than their poll budget (which may grow 4x): parked.
    std::thread::sleep(Duration::from_millis(60));
    for _ in 0..20 {
        assert_eq!(busy.call(&Request::Ping, &[]).unwrap().response, Response::Done);
    }
    let slow = busy.start(&stat(400), &[], None).unwrap();
    std::thread::sleep(Duration::from_millis(10));
    let slowest = slowest_ping(&other, 20, Duration::ZERO);
    assert!(slowest < Duration::from_millis(150), "a request waited {slowest:?} behind another connection's slow handler");
    assert_eq!(slow.wait().unwrap().response, Response::Count(400));
    server.shutdown();
}

/// A connection opened while the server's thread polls another that never goes quiet (its
/// client sends request after request) is accepted and answered at once: accepting does not
/// wait for that connection to pause. (Written while hunting a global-memory home's
/// connection to a rank's cache that was not through its handshake in 5 s under heavy load,
/// docs/TESTING.md "Not yet here"; it passes, so that stall is something else.)
fn a_connection_opened_while_another_is_polled_without_pause_is_served_at_once() {
    use std::sync::atomic::AtomicBool;
    let (server, endpoint, _) = common::start_server_polling(Endpoint::parse("ucx://127.0.0.1:0").unwrap(), Duration::from_millis(20));
    let stop = Arc::new(AtomicBool::new(false));
    let flooder = {
        let (endpoint, stop) = (endpoint.clone(), stop.clone());
        std::thread::spawn(move || {
            let connection = Connection::open(&endpoint, &config(SECRET, 5000)).unwrap();
            let started = Instant::now();
            let mut calls = 0u64;
            while !stop.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(30) {
                assert_eq!(connection.call(&Request::Ping, &[]).unwrap().response, Response::Done);
                calls += 1;
            }
            calls
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let mut slowest = Duration::ZERO;
    for round in 0..5 {
        let started = Instant::now();
        let connection = Connection::open(&endpoint, &config(SECRET, 5000)).unwrap_or_else(|error| panic!("round {round}: {error}"));
        assert_eq!(connection.call(&Request::Ping, &[]).unwrap().response, Response::Done);
        slowest = slowest.max(started.elapsed());
    }
    stop.store(true, Ordering::SeqCst);
    let calls = flooder.join().unwrap();
    assert!(calls > 0);
    assert!(slowest < Duration::from_millis(500), "opening a connection and a ping took {slowest:?} beside a busy one");
    server.shutdown();
}

/// A process that has dropped its connections and servers has no UCX worker left, so nothing
/// of ringfs is inside UCX when `exit` runs the libraries' destructors. (A global-memory rank
/// whose cache's server still polled its worker then died, rarely, of a corrupted heap in
/// `free` called from those destructors; the client's worker outlived every connection.)
fn no_ucx_worker_is_left_once_connections_and_servers_are_dropped() {
    assert_eq!(ringfs_rpc::ucx::live_workers(), 0, "the scenarios before left a worker alive");
    let (server, endpoint, _) = start_server();
    let connections: Vec<Connection> = (0..3).map(|_| Connection::open(&endpoint, &config(SECRET, 5000)).unwrap()).collect();
    for connection in &connections {
        assert_eq!(connection.call(&Request::Ping, &[]).unwrap().response, Response::Done);
    }
    assert_eq!(ringfs_rpc::ucx::live_workers(), 1, "one worker for the process's client connections and its server");
    drop(connections);
    assert_eq!(ringfs_rpc::ucx::live_workers(), 1, "the server keeps the worker");
    drop(server);
    assert_eq!(ringfs_rpc::ucx::live_workers(), 0, "the worker went with the server's threads, after the last connection");
    // The next connection makes the worker again.
    let (_server, endpoint, _) = start_server();
    let connection = Connection::open(&endpoint, &config(SECRET, 5000)).unwrap();
    assert_eq!(connection.call(&Request::Ping, &[]).unwrap().response, Response::Done);
}

/// A send that UCX cannot finish — a large request to a peer that stopped reading (SIGSTOP)
/// — holds up nothing else of the process: its other connections and its own server go on
/// while it waits out its deadline. (The process's one UCX worker is shared by all of them,
/// and the send once waited holding it.)
fn a_send_stalled_on_a_stopped_peer_holds_up_nothing_else() {
    let (server, endpoint, _) = start_server();
    let local = Connection::open(&endpoint, &config(SECRET, 5000)).unwrap();
    let mut peer = Command::new(std::env::current_exe().unwrap())
        .args(["peer_echo_server", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("RINGFS_UCX_PEER_ECHO", "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the peer process");
    let peer_endpoint = {
        let mut lines = BufReader::new(peer.stdout.take().unwrap()).lines();
        loop {
            let line = lines.next().expect("the peer printed its endpoint").unwrap();
            if let Some((_, address)) = line.split_once("PEER ") {
                break Endpoint::parse(address.trim()).unwrap();
            }
        }
    };
    let remote = Connection::open(&peer_endpoint, &config(SECRET, 3000)).unwrap();
    assert_eq!(remote.call(&Request::Ping, &[]).unwrap().response, Response::Done);
    // SAFETY: a process this test started and has not reaped.
    unsafe { libc::kill(peer.id() as libc::pid_t, libc::SIGSTOP) };
    let stalled = std::thread::spawn(move || {
        let started = Instant::now();
        let result = remote.call(&write_request(), &vec![7u8; 48 << 20]);
        (result.is_err(), started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(300));
    let slowest = slowest_ping(&local, 20, Duration::from_millis(10));
    let (failed, waited) = stalled.join().unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(peer.id() as libc::pid_t, libc::SIGKILL) };
    let _ = peer.wait();
    assert!(failed && waited < Duration::from_secs(10), "the write to the stopped peer: failed {failed} after {waited:?}");
    assert!(slowest < Duration::from_millis(500), "a ping to this process's own server took {slowest:?} beside the stalled send");
    server.shutdown();
}

/// The peer of [`a_send_stalled_on_a_stopped_peer_holds_up_nothing_else`]: an echo server in
/// a process of its own, printing its endpoint, until it is killed (at most a minute).
#[test]
#[ignore = "started by a scenario"]
fn peer_echo_server() {
    if std::env::var_os("RINGFS_UCX_PEER_ECHO").is_none() {
        return;
    }
    let (_server, endpoint, _) = start_server();
    println!("PEER {endpoint}");
    std::thread::sleep(Duration::from_secs(60));
}

/// Every scenario, in this process (run by the variants below with their environment).
#[test]
#[ignore = "run by the variants, each in a child process with its UCX environment"]
fn scenarios() {
    if std::env::var_os("RINGFS_UCX_VARIANT").is_none() {
        return;
    }
    let scenarios: [(&str, fn()); 19] = [
        ("a_send_stalled_on_a_stopped_peer_holds_up_nothing_else", a_send_stalled_on_a_stopped_peer_holds_up_nothing_else),
        ("connections_churned_beside_a_server_in_the_same_process", connections_churned_beside_a_server_in_the_same_process),
        ("a_slow_handler_does_not_hold_up_other_connections", a_slow_handler_does_not_hold_up_other_connections),
        (
            "a_connection_opened_while_another_is_polled_without_pause_is_served_at_once",
            a_connection_opened_while_another_is_polled_without_pause_is_served_at_once,
        ),
        ("a_polled_connection_does_not_wake_the_listener", a_polled_connection_does_not_wake_the_listener),
        ("connections_closed_and_reopened_at_once_each_work", connections_closed_and_reopened_at_once_each_work),
        ("requests_are_answered_and_the_lanes_reported", requests_are_answered_and_the_lanes_reported),
        ("pipelined_requests_each_get_their_answer", pipelined_requests_each_get_their_answer),
        ("threads_share_a_connection_with_data_of_every_size", threads_share_a_connection_with_data_of_every_size),
        ("threads_waiting_on_one_connection_each_get_their_answer", threads_waiting_on_one_connection_each_get_their_answer),
        ("large_data_round_trips", large_data_round_trips),
        ("a_wrong_secret_is_refused_and_others_go_on", a_wrong_secret_is_refused_and_others_go_on),
        ("a_slow_answer_times_out", a_slow_answer_times_out),
        ("a_stopped_server_fails_requests_in_bounded_time", a_stopped_server_fails_requests_in_bounded_time),
        (
            "an_idle_connection_to_a_stopped_server_is_known_broken_before_use",
            an_idle_connection_to_a_stopped_server_is_known_broken_before_use,
        ),
        ("garbage_from_a_raw_ucx_peer_closes_only_its_connection", garbage_from_a_raw_ucx_peer_closes_only_its_connection),
        ("an_idle_server_and_client_do_not_spin", an_idle_server_and_client_do_not_spin),
        ("a_request_given_up_after_lending_memory_breaks_the_connection", a_request_given_up_after_lending_memory_breaks_the_connection),
        // Last: it also checks that every scenario before left no worker.
        ("no_ucx_worker_is_left_once_connections_and_servers_are_dropped", no_ucx_worker_is_left_once_connections_and_servers_are_dropped),
    ];
    // RINGFS_UCX_SCENARIO=NAME runs only that one (when hunting a failure).
    let only = std::env::var("RINGFS_UCX_SCENARIO").ok();
    for (name, scenario) in scenarios {
        if only.as_deref().is_some_and(|only| only != name) {
            continue;
        }
        println!("SCENARIO {name}");
        scenario();
    }
    println!("ALL SCENARIOS PASSED");
}

/// True if UCX is installed; otherwise the test reports that it is skipped, or fails where
/// RINGFS_REQUIRE_UCX=1 (test.sh, after scripts/setup.sh installed UCX).
fn ucx_present() -> bool {
    if ringfs_rpc::ucx::is_available() {
        return true;
    }
    assert!(std::env::var("RINGFS_REQUIRE_UCX").as_deref() != Ok("1"), "libucp.so.0 cannot be loaded but RINGFS_REQUIRE_UCX=1");
    eprintln!("SKIPPED: UCX (libucp.so.0) is not installed");
    false
}

/// Runs [`scenarios`] in a child process with `UCX_TLS=transports` and the bulk mode `bulk`.
fn run_variant(transports: &str, bulk: &str) {
    if !ucx_present() {
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["scenarios", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("RINGFS_UCX_VARIANT", "1")
        .env("UCX_TLS", transports)
        .env(ringfs_rpc::ucx::BULK_VARIABLE, bulk)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run the scenarios");
    let lines: Vec<String> = BufReader::new(child.stdout.take().unwrap()).lines().map_while(Result::ok).collect();
    let status = child.wait().unwrap();
    let output = lines.join("\n");
    assert!(status.success() && output.contains("ALL SCENARIOS PASSED"), "UCX_TLS={transports} {bulk}: {output}");
}

#[test]
fn over_ucx_tcp() {
    run_variant("tcp", "auto");
}

#[test]
fn over_ucx_tcp_with_rma_forced() {
    run_variant("tcp", "rma");
}

#[test]
fn over_ucx_shared_memory() {
    run_variant("posix,sysv,cma,tcp", "auto");
}

#[test]
fn over_ucx_shared_memory_with_rma_forced() {
    run_variant("posix,sysv,cma,tcp", "rma");
}
