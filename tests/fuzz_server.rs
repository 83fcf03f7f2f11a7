//! The request-handling fuzzer: real servers receive thousands of mutated requests that
//! decode (so they reach the handlers, past the decoder that `ringfs-proto`'s own fuzzer
//! covers), with random data sections, from an authenticated connection. No handler may
//! panic, no server may die or close the connection, and afterwards the cluster still serves
//! clients.
//!
//! `RINGFS_FUZZ_REQUESTS` sets the number of requests per test (default 3,000) and
//! `RINGFS_FUZZ_SEED` the seed; docs/TESTING.md records the long runs.

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
    timed_out: u64,
    /// The first requests that timed out (for the failure message).
    slow: Vec<String>,
}

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
        .filter(|request| !matches!(request, Request::Hello(_) | Request::Shutdown))
        .map(|request| {
            let mut body = Vec::new();
            request.encode(&mut body);
            body
        })
        .collect();
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    let deadline = Instant::now() + Duration::from_secs(120);
    while tally.sent < count && Instant::now() < deadline {
        let mut body = encodings[rng.below(encodings.len() as u64) as usize].clone();
        let donor = &encodings[rng.below(encodings.len() as u64) as usize];
        mutate(&mut rng, &mut body, donor);
        let Ok(request) = Request::decode(&body) else { continue };
        if matches!(request, Request::Hello(_) | Request::Shutdown) {
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
                // The handler waits (a lock a forged request took): go on beside it.
                connection = Connection::open(&endpoint, &config).unwrap();
            }
            Err(error) => panic!("request {} (seed {seed}) broke the connection: {error}\n{request:?}", tally.sent),
        }
    }
    tally
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
    assert_eq!(tally.timed_out, 0, "requests a client may send do not wait: {tally:?}");
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
