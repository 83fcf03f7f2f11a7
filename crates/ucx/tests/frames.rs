//! The frame transport end to end, over UCX's TCP and shared-memory transports: small
//! requests, write data fetched by `get` and read data placed by `put` above the threshold (and
//! inline below it), pipelined calls, a randomized mix checked against a model, a malformed
//! peer, and a killed or paused server.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{PeerProcess, VARIANTS, context, loopback, ucx_present};
use ringfs_ucx::frames::{BulkTransfer, Client, Connection, FrameConfig, Incoming, Outgoing, REQUEST, Request, Server, Service};
use ringfs_ucx::{Error, RegistrationCache, Worker};

const THRESHOLD: usize = 32 << 10;

/// A service over one byte array: `W offset` writes the data there, `R offset length` reads,
/// `E` echoes the body. Every reply body starts with the xxh-free checksum of the data it got.
#[derive(Default)]
struct ArrayService {
    bytes: Vec<u8>,
}

fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| (hash ^ *byte as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

fn word(bytes: &[u8], index: usize) -> usize {
    u64::from_le_bytes(bytes[1 + index * 8..9 + index * 8].try_into().unwrap()) as usize
}

impl Service for ArrayService {
    type Session = u64;

    fn handle(&mut self, requests: &mut u64, incoming: &Incoming<'_>, outgoing: &mut Outgoing) {
        *requests += 1;
        outgoing.epoch = incoming.frame.epoch + 1;
        outgoing.body.extend_from_slice(&checksum(incoming.data).to_le_bytes());
        match incoming.body[0] {
            b'W' => {
                let offset = word(incoming.body, 0);
                if self.bytes.len() < offset + incoming.data.len() {
                    self.bytes.resize(offset + incoming.data.len(), 0);
                }
                self.bytes[offset..offset + incoming.data.len()].copy_from_slice(incoming.data);
            }
            b'R' => {
                let (offset, length) = (word(incoming.body, 0), word(incoming.body, 1));
                let end = (offset + length).min(self.bytes.len());
                outgoing.data.extend_from_slice(&self.bytes[offset.min(end)..end]);
            }
            _ => outgoing.body.extend_from_slice(incoming.body),
        }
    }
}

fn command(letter: u8, words: &[usize]) -> Vec<u8> {
    let mut body = vec![letter];
    for word in words {
        body.extend_from_slice(&(*word as u64).to_le_bytes());
    }
    body
}

/// A frame server on its own thread, stopped on drop.
struct TestServer {
    address: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    fn start(transports: &'static str) -> TestServer {
        let stop = Arc::new(AtomicBool::new(false));
        let (sender, receiver) = mpsc::channel();
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let worker = Worker::new(&context(transports)).unwrap();
            let cache = RegistrationCache::new(worker.context(), 64);
            let config = FrameConfig { rma_threshold: THRESHOLD, timeout: Duration::from_secs(5), bulk: BulkTransfer::Auto };
            let mut server = Server::bind(&worker, loopback(), ArrayService::default(), cache, config).unwrap();
            sender.send(server.address()).unwrap();
            server.run(&stopping).unwrap();
        });
        TestServer { address: receiver.recv().unwrap(), stop, thread: Some(thread) }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Both ways of moving large data: RMA (forced: UCX emulates it over TCP here) and inside the
/// messages; `Auto` picks one of them per connection.
const BULK_MODES: [BulkTransfer; 3] = [BulkTransfer::Rma, BulkTransfer::Inline, BulkTransfer::Auto];

fn client(transports: &str, timeout: Duration, bulk: BulkTransfer) -> Client {
    let worker = Worker::new(&context(transports)).unwrap();
    let cache = RegistrationCache::new(worker.context(), 64);
    Client::new(&worker, cache, FrameConfig { rma_threshold: THRESHOLD, timeout, bulk }).unwrap()
}

/// Every transport variant with every bulk mode of `modes`.
fn variants_and_modes(modes: &[BulkTransfer]) -> Vec<(&'static str, BulkTransfer)> {
    VARIANTS.into_iter().flat_map(|transports| modes.iter().map(move |bulk| (transports, *bulk))).collect()
}

/// A server on its own thread and a client connected to it.
fn serve_and_connect(transports: &'static str, bulk: BulkTransfer) -> (TestServer, Client, Connection) {
    let server = TestServer::start(transports);
    let client = client(transports, Duration::from_secs(10), bulk);
    let connection = client.connect(server.address).unwrap();
    (server, client, connection)
}

fn write(connection: &Connection, offset: usize, data: &[u8]) -> u64 {
    let reply = connection.call(Request { epoch: 3, body: &command(b'W', &[offset]), data, destination: None }).unwrap();
    assert_eq!(reply.frame.epoch, 4, "the service's epoch comes back");
    u64::from_le_bytes(reply.body[..8].try_into().unwrap())
}

fn read(connection: &Connection, offset: usize, destination: &mut [u8]) -> ringfs_ucx::frames::Reply {
    let body = command(b'R', &[offset, destination.len()]);
    connection.call(Request { epoch: 0, body: &body, data: &[], destination: Some(destination) }).unwrap()
}

fn pattern(length: usize, seed: u8) -> Vec<u8> {
    (0..length).map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn small_requests_and_bulk_data_of_every_size_arrive_intact() {
    if !ucx_present() {
        return;
    }
    for (transports, bulk) in variants_and_modes(&BULK_MODES) {
        let (_server, _client, connection) = serve_and_connect(transports, bulk);
        let echoed = connection.call(Request { epoch: 0, body: b"Ehello", data: &[], destination: None }).unwrap();
        assert_eq!(&echoed.body[8..], b"Ehello", "{transports}");
        assert_eq!(
            connection.uses_rma(),
            bulk == BulkTransfer::Rma || (bulk == BulkTransfer::Auto && connection.endpoint().has_native_rma())
        );
        for (seed, length) in [1, 4095, THRESHOLD - 1, THRESHOLD, THRESHOLD + 1, 1 << 20, (8 << 20) + 3].into_iter().enumerate() {
            let data = pattern(length, seed as u8);
            assert_eq!(write(&connection, 0, &data), checksum(&data), "{transports} {bulk:?}: write of {length} bytes");
            let mut destination = vec![0u8; length];
            let reply = read(&connection, 0, &mut destination);
            assert!(reply.in_destination && reply.data_len == length, "{transports} {bulk:?}: read of {length} bytes: {reply:?}");
            assert!(destination == data, "{transports} {bulk:?}: read of {length} bytes returns the written bytes");
        }
        // A destination smaller than the data: the data comes back in the reply instead.
        let mut small = vec![0u8; 16];
        let body = command(b'R', &[0, 1 << 20]);
        let reply = connection.call(Request { epoch: 0, body: &body, data: &[], destination: Some(&mut small) }).unwrap();
        assert!(!reply.in_destination && reply.data.len() == 1 << 20, "{transports} {bulk:?}");
        assert!(reply.data == pattern(1 << 20, 6), "{transports} {bulk:?}: the last write (seed 6) comes back");
    }
}

#[test]
fn pipelined_calls_each_get_their_own_reply() {
    if !ucx_present() {
        return;
    }
    for (transports, bulk) in variants_and_modes(&[BulkTransfer::Rma, BulkTransfer::Inline]) {
        let (_server, _client, connection) = serve_and_connect(transports, bulk);
        let block = 256 << 10;
        let data = pattern(16 * block, 9);
        for (index, chunk) in data.chunks(block).enumerate() {
            write(&connection, index * block, chunk);
        }
        let mut destinations: Vec<Vec<u8>> = (0..16).map(|_| vec![0u8; block]).collect();
        let bodies: Vec<Vec<u8>> = (0..16).map(|index| command(b'R', &[index * block, block])).collect();
        let mut calls = Vec::new();
        for (body, destination) in bodies.iter().zip(destinations.iter_mut()) {
            // SAFETY: every call is waited for below.
            calls.push(unsafe { connection.start(Request { epoch: 0, body, data: &[], destination: Some(destination) }) }.unwrap());
        }
        for call in calls {
            assert!(call.wait().unwrap().in_destination);
        }
        assert!(destinations.concat() == data, "{transports} {bulk:?}: each pipelined read filled its own buffer");
    }
}

/// A small deterministic generator (xorshift), so a failure can be replayed from its seed.
struct Random(u64);

impl Random {
    fn below(&mut self, bound: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % bound as u64) as usize
    }
}

#[test]
fn a_random_mix_of_reads_and_writes_matches_a_model() {
    if !ucx_present() {
        return;
    }
    for (transports, bulk) in variants_and_modes(&[BulkTransfer::Rma, BulkTransfer::Inline]) {
        let (_server, _client, connection) = serve_and_connect(transports, bulk);
        let seed = 0x5eed_0000 + transports.len() as u64 + bulk as u64;
        let mut random = Random(seed);
        let size = 4 << 20;
        let mut model = vec![0u8; size];
        write(&connection, 0, &model);
        let started = Instant::now();
        for step in 0..150 {
            let length = [1, 100, THRESHOLD - 1, THRESHOLD, 100_000, 1 << 20][random.below(6)];
            let offset = random.below(size - length);
            if random.below(2) == 0 {
                let data = pattern(length, step as u8);
                model[offset..offset + length].copy_from_slice(&data);
                assert_eq!(write(&connection, offset, &data), checksum(&data), "seed {seed:#x} step {step}");
            } else {
                let mut destination = vec![0u8; length];
                read(&connection, offset, &mut destination);
                assert!(destination == model[offset..offset + length], "seed {seed:#x} step {step}: read {length} at {offset}");
            }
            assert!(started.elapsed() < Duration::from_secs(60), "bounded in time");
        }
    }
}

#[test]
fn a_malformed_request_closes_only_that_connection() {
    if !ucx_present() {
        return;
    }
    for transports in VARIANTS {
        let server = TestServer::start(transports);
        let worker = Worker::new(&context(transports)).unwrap();
        let stranger = worker.connect(server.address).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let garbage_headers: [&[u8]; 3] = [b"", &[0xFF; 24], &[7u8; 200]];
        for header in garbage_headers {
            if stranger.failure().is_some() {
                break;
            }
            let _ = stranger.send_and_wait(REQUEST, header, b"payload", deadline);
        }
        worker.progress_until(deadline, || stranger.failure().is_some()).unwrap();
        assert!(stranger.failure().is_some(), "{transports}: the server closed the malformed connection");
        let client = client(transports, Duration::from_secs(10), BulkTransfer::Auto);
        let connection = client.connect(server.address).unwrap();
        let echoed = connection.call(Request { epoch: 0, body: b"Estill here", data: &[], destination: None }).unwrap();
        assert_eq!(&echoed.body[8..], b"Estill here", "{transports}: other clients are still served");
    }
}

/// The server process of the failure tests.
#[test]
#[ignore = "run as a child process by the tests below"]
fn frame_server_main() {
    let Ok(transports) = std::env::var("RINGFS_UCX_PEER") else {
        return;
    };
    let worker = Worker::new(&context(&transports)).unwrap();
    let cache = RegistrationCache::new(worker.context(), 64);
    let config = FrameConfig { rma_threshold: THRESHOLD, timeout: Duration::from_secs(5), bulk: BulkTransfer::Auto };
    let mut server = Server::bind(&worker, loopback(), ArrayService::default(), cache, config).unwrap();
    println!("PEER {}", server.address());
    server.run(&AtomicBool::new(false)).unwrap();
}

#[test]
fn a_killed_server_gives_an_error_in_bounded_time() {
    if !ucx_present() {
        return;
    }
    for transports in VARIANTS {
        let mut peer = PeerProcess::start("frame_server_main", transports);
        let client = client(transports, Duration::from_secs(5), BulkTransfer::Auto);
        let connection = client.connect(peer.address).unwrap();
        write(&connection, 0, &pattern(1 << 20, 1));
        peer.child.kill().unwrap();
        peer.child.wait().unwrap();
        let started = Instant::now();
        let mut destination = vec![0u8; 1 << 20];
        let body = command(b'R', &[0, 1 << 20]);
        let result = connection.call(Request { epoch: 0, body: &body, data: &[], destination: Some(&mut destination) });
        assert!(matches!(result, Err(Error::EndpointFailed { .. } | Error::Timeout { .. })), "{transports}: {result:?}");
        assert!(started.elapsed() < Duration::from_secs(8), "{transports}: failed after {:?}", started.elapsed());
        assert!(connection.check().is_err(), "{transports}: the connection stays failed");
    }
}

#[test]
fn a_paused_server_times_out_and_the_connection_is_closed() {
    if !ucx_present() {
        return;
    }
    for transports in VARIANTS {
        let peer = PeerProcess::start("frame_server_main", transports);
        let client = client(transports, Duration::from_millis(800), BulkTransfer::Rma);
        let connection = client.connect(peer.address).unwrap();
        write(&connection, 0, &pattern(1 << 20, 1));
        peer.signal(libc::SIGSTOP);
        let started = Instant::now();
        let mut destination = vec![0u8; 1 << 20];
        let body = command(b'R', &[0, 1 << 20]);
        let result = connection.call(Request { epoch: 0, body: &body, data: &[], destination: Some(&mut destination) });
        assert!(matches!(result, Err(Error::Timeout { .. })), "{transports}: {result:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "{transports}: gave up after {:?}", started.elapsed());
        assert!(connection.check().is_err(), "{transports}: a connection that lent memory is closed after a timeout");
    }
}
