//! The request-handling fuzzer: real servers receive thousands of mutated requests that
//! decode (so they reach the handlers, past the decoder that `ringfs-proto`'s own fuzzer
//! covers), with random data sections, from an authenticated connection. No handler may
//! panic, no server may die or close the connection, and afterwards the cluster still serves
//! clients.
//!
//! `RINGFS_FUZZ_REQUESTS` sets the number of requests per test (default 3,000),
//! `RINGFS_FUZZ_SEED` the seed and `RINGFS_FUZZ_SECS` the most seconds a test sends for
//! (default 120); docs/TESTING.md records the long runs.

mod common;

use std::time::{Duration, Instant};

use common::TestCluster;
use ringfs_client::OpenFlags;
use ringfs_proto::Request;
use ringfs_proto::message::mutate::{Rng, mutate};
use ringfs_proto::message::samples;
use ringfs_rpc::{Connection, ConnectionConfig, Endpoint, RpcError};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|text| text.parse().ok()).unwrap_or(default)
}

#[derive(Debug, Default)]
struct Tally {
    sent: u64,
    answered: u64,
    /// Not answered within the fuzzing connection's 200 ms.
    timed_out: u64,
    /// Client requests that timed out and, asked again on a connection that waits 5 s, were
    /// not answered then either: a request a client may send waits for something.
    stuck: u64,
    /// The first requests that timed out (for the failure message).
    slow: Vec<String>,
}

/// How long a connection waits that asks again what timed out (the machine may be loaded).
const PATIENCE: Duration = Duration::from_secs(5);

/// Sends `count` mutated requests to server `index`, as a server (every request is handled)
/// or as a client (requests only servers send are refused); a broken connection fails the
/// test.
fn connection_config(cluster: &TestCluster, as_server: bool) -> ConnectionConfig {
    ConnectionConfig {
        secret: cluster.secret.clone().into_bytes(),
        timeout: Duration::from_millis(200),
        host_id: 0xF022,
        from_server: as_server,
        poll: Duration::ZERO,
        client_id: if as_server { 0 } else { 0xF022 },
        credentials: Default::default(),
    }
}

fn fuzz(cluster: &TestCluster, index: usize, seed: u64, count: u64, as_server: bool) -> Tally {
    let config = connection_config(cluster, as_server);
    let endpoint = Endpoint::parse(cluster.address(index)).unwrap();
    let mut connection = Connection::open(&endpoint, &config).unwrap();
    let encodings: Vec<Vec<u8>> = samples::requests()
        .into_iter()
        .filter(|request| !matches!(request, Request::Hello(_) | Request::Shutdown(_)))
        .map(|request| {
            let mut body = Vec::new();
            request.encode(&mut body);
            body
        })
        .collect();
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    let deadline = Instant::now() + Duration::from_secs(env_number("RINGFS_FUZZ_SECS", 120));
    while tally.sent < count && Instant::now() < deadline {
        let mut body = encodings[rng.below(encodings.len() as u64) as usize].clone();
        let donor = &encodings[rng.below(encodings.len() as u64) as usize];
        mutate(&mut rng, &mut body, donor);
        let Ok(request) = Request::decode(&body) else { continue };
        if matches!(request, Request::Hello(_) | Request::Shutdown(_)) {
            continue;
        }
        let mut data = vec![0u8; [0, 0, 1, 100, 4096, 70_000][rng.below(6) as usize]];
        rng.fill(&mut data);
        tally.sent += 1;
        match connection.call(&request, &data) {
            Ok(_) => tally.answered += 1,
            Err(RpcError::Timeout { .. }) => {
                tally.timed_out += 1;
                if tally.slow.len() < 5 {
                    tally.slow.push(format!("{request:?}").chars().take(300).collect());
                }
                // The handler waits (a lock a forged request took) or the machine is busy:
                // go on beside it.
                connection = open_patiently(&endpoint, &config);
                // A client's request must be answered once the machine has time for it.
                let patient = ConnectionConfig { timeout: PATIENCE, ..config.clone() };
                if !as_server && matches!(open_patiently(&endpoint, &patient).call(&request, &data), Err(RpcError::Timeout { .. })) {
                    tally.stuck += 1;
                }
            }
            Err(error) => panic!("request {} (seed {seed}) broke the connection: {error}\n{request:?}", tally.sent),
        }
    }
    tally
}

/// A new connection, trying again for [`PATIENCE`] while the server is too busy to answer the
/// handshake in time.
fn open_patiently(endpoint: &Endpoint, config: &ConnectionConfig) -> Connection {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match Connection::open(endpoint, config) {
            Ok(connection) => return connection,
            Err(RpcError::Timeout { .. }) if Instant::now() < deadline => continue,
            Err(error) => panic!("cannot connect to {endpoint:?} again: {error}"),
        }
    }
}

fn assert_no_panic(cluster: &TestCluster, servers: usize) {
    for index in 0..servers {
        let log = cluster.log(index);
        assert!(!log.contains("panicked"), "server {index} panicked:\n{log}");
    }
}

/// As a (buggy) server: membership and coordination requests too. A forged one may hold a
/// lock or freeze a subtree until its lease ends, or add a member that does not exist, so
/// afterwards only liveness is checked.
#[test]
fn mutated_requests_from_a_peer_never_crash_a_server_or_break_its_connection() {
    let cluster = TestCluster::start(2);
    let count = env_number("RINGFS_FUZZ_REQUESTS", 3_000);
    let seed = env_number("RINGFS_FUZZ_SEED", 11);
    let tally = fuzz(&cluster, 0, seed, count, true);
    eprintln!("{tally:?}");
    assert!(tally.sent >= count.min(500), "only {} requests were sent", tally.sent);
    assert!(tally.answered > tally.sent / 2, "{tally:?}");
    assert_no_panic(&cluster, 2);
    for index in 0..2 {
        // A patient connection: handlers of forged requests may still be waiting on the
        // machine's two cores.
        let config = ConnectionConfig { timeout: Duration::from_secs(5), ..connection_config(&cluster, false) };
        let answer = Connection::open(&Endpoint::parse(cluster.address(index)).unwrap(), &config)
            .and_then(|connection| connection.call(&Request::Ping, &[]));
        if let Err(error) = answer {
            panic!("server {index} does not answer a ping: {error}\n{}", cluster.log(index));
        }
    }
}

#[test]
fn after_mutated_requests_from_a_client_the_cluster_still_serves_files() {
    let cluster = TestCluster::start(2);
    let count = env_number("RINGFS_FUZZ_REQUESTS", 3_000);
    let seed = env_number("RINGFS_FUZZ_SEED", 11) + 1;
    let tally = fuzz(&cluster, 1, seed, count, false);
    eprintln!("{tally:?}");
    assert_eq!(tally.stuck, 0, "requests a client may send do not wait: {tally:?}");
    assert_no_panic(&cluster, 2);
    let client = cluster.client();
    client.mkdir("/after-fuzz", 0o755).unwrap();
    for index in 0..20 {
        let path = format!("/after-fuzz/f{index}");
        let bytes = vec![index as u8; 10_000 * index];
        let fd = client.create(&path, 0o644).unwrap();
        assert_eq!(client.pwrite(fd, &bytes, 0).unwrap(), bytes.len());
        client.close(fd).unwrap();
        let fd = client.open(&path, OpenFlags::READ, 0).unwrap();
        let mut back = vec![0u8; bytes.len() + 10];
        let read = client.pread(fd, &mut back, 0).unwrap();
        client.close(fd).unwrap();
        assert_eq!(&back[..read], &bytes[..], "{path}");
    }
    assert_eq!(client.readdir("/after-fuzz").unwrap().len(), 20);
}

/// The sizes and offsets a request carries, at their edges (what the fuzzer's mutations
/// write over length and offset fields): each gets the answer Linux gives — EFBIG past the
/// largest file, EINVAL for a range outside its chunk or ending before it starts, ENOSPC for
/// room no node has — and never reaches arithmetic that overflows (the fuzzer's seed 4242
/// made the reservation account overflow: a panic, EIO).
#[test]
fn forged_sizes_and_offsets_get_linux_errors_and_never_overflow() {
    use ringfs_proto::Errno;
    use ringfs_proto::{
        ChunkIndex, ChunkKey, ChunkTemplate, Create, FileLock, LockKind, MAX_FILE_SIZE, RemoteBytes, Reservation, Response, SetChunkLen,
        Truncate, Write, WriteSource,
    };
    let cluster = TestCluster::start(2);
    let connect = |index: usize, as_server: bool| {
        let config = ConnectionConfig { timeout: Duration::from_secs(5), ..connection_config(&cluster, as_server) };
        Connection::open(&Endpoint::parse(cluster.address(index)).unwrap(), &config).unwrap()
    };
    let answer = |connection: &Connection, request: Request, data: &[u8]| match connection.call(&request, data) {
        Ok(reply) => reply.response,
        Err(error) => panic!("{request:?} broke the connection: {error}"),
    };
    let client = connect(0, false);
    let ask = |request: Request, data: &[u8]| answer(&client, request, data);
    let file = match ask(Request::Create(Create { exclusive: false, ..Create::new("/forged", 0o100644, 1 << 20) }), &[]) {
        Response::Opened(opened) => opened.attr.file_id,
        other => panic!("create answered {other:?}"),
    };
    let error = Response::Error;
    let reserve = |end: u64, bytes: u64| Request::Reserve(Reservation { file, offset: 0, end, chunk_size: 1 << 20, bytes, release: 0 });
    for _ in 0..3 {
        assert_eq!(ask(reserve(MAX_FILE_SIZE, MAX_FILE_SIZE), &[]), error(Errno::ENOSPC), "no node holds 8 EiB");
    }
    assert_eq!(ask(reserve(u64::MAX, u64::MAX), &[]), error(Errno::EFBIG));
    assert_eq!(ask(reserve(1 << 20, (1 << 20) + 1), &[]), error(Errno::EINVAL), "more than the range holds");
    let template = ChunkTemplate { mode: 0o100644, uid: 0, gid: 0, chunk_size: 1 << 20, backend_len: 0 };
    let write = |index: u64, offset: u64, source: WriteSource| {
        Request::Write(Write { chunk: ChunkKey::new(file, ChunkIndex(index)), offset, source, template, time_ns: 1 })
    };
    assert_eq!(ask(write(u64::MAX >> 10, 0, WriteSource::Inline), b"bytes"), error(Errno::EFBIG), "past the largest file");
    assert_eq!(ask(write(1, u64::MAX - 2, WriteSource::Inline), b"bytes"), error(Errno::EINVAL), "offset + length overflows");
    let remote = WriteSource::Remote(RemoteBytes { address: 4096, len: u64::MAX });
    assert_eq!(ask(write(0, 8, remote), &[]), error(Errno::EINVAL));
    assert_eq!(ask(Request::Truncate(Truncate { file, size: u64::MAX, time_ns: 1 }), &[]), error(Errno::EFBIG));
    let lock = FileLock { file, client: 0xF022, owner: 1, kind: LockKind::Write, start: 10, end: 9, pid: 1 };
    assert_eq!(ask(Request::SetLock(lock), &[]), error(Errno::EINVAL), "a range ending before it starts");
    // Only servers send `SetChunkLen`, and only to the chunk's owner (the other refuses: EIO).
    let set_len = Request::SetChunkLen(SetChunkLen {
        chunk: ChunkKey::new(file, ChunkIndex(u64::MAX)),
        len: 1,
        template,
        backend: None,
        cut_at_ns: None,
    });
    let mut answers: Vec<Response> = (0..2).map(|index| answer(&connect(index, true), set_len.clone(), &[])).collect();
    answers.sort_by_key(|response| format!("{response:?}"));
    assert_eq!(answers, [error(Errno::EFBIG), error(Errno::EIO)]);
    assert_no_panic(&cluster, 2);
    // The file and the account are as before: a plain write and read still work.
    let client = cluster.client();
    let fd = client.open("/forged", OpenFlags::READ | OpenFlags::WRITE, 0).unwrap();
    assert_eq!(client.pwrite(fd, b"still here", 0).unwrap(), 10);
    assert_eq!(client.fstat(fd).unwrap().size, 10);
    client.close(fd).unwrap();
}
