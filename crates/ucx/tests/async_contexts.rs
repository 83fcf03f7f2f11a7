//! Two UCX workers in one process, each on its own thread, opening and closing connections to
//! each other as fast as they can: UCX 1.13 (Debian's) can then abort the process on
//! `async.c:643 Assertion 'handler->async == async' failed`.
//!
//! Why: UCX keeps the handlers of its sockets' events in one table per process, keyed by the
//! descriptor, and a worker's async context queues the events that arrived while it was busy
//! ("missed"). When a worker removes the handler of a closed connection, 1.13 leaves its missed
//! events in the queue (fixed upstream in 1.17, openucx/ucx#9942); if the descriptor's number is
//! reused meanwhile by a connection of the *other* worker, the first worker's next progress
//! finds a handler of another context under that number and asserts. With one worker per
//! process, that cannot happen — which is why ringfs's rpc layer has one UCX worker per
//! process (`crates/rpc/src/ucx/engine.rs`).
//!
//! The test runs the churn in a child process (an abort must not end the test binary) and is
//! `#[ignore]`d: it shows the bug of the library, not one of ringfs. Run it with
//! `cargo test -p ringfs-ucx --test async_contexts -- --ignored --nocapture`.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{context, loopback, ucx_present};
use ringfs_ucx::{Endpoint, Worker};

/// The greeting an accepted connection sends.
const HELLO: u16 = 9;

/// How long the child churns.
const CHURN: Duration = Duration::from_secs(20);

/// One side: a listener, and connections to the other side's listener opened and closed in
/// turn, while accepted connections are closed after a few progress rounds.
fn churn(mine: mpsc::Sender<SocketAddr>, theirs: mpsc::Receiver<SocketAddr>) -> usize {
    let worker = Worker::new_serialized(&context("tcp")).unwrap();
    churn_on(&worker, mine, theirs)
}

fn churn_on(worker: &Worker, mine: mpsc::Sender<SocketAddr>, theirs: mpsc::Receiver<SocketAddr>) -> usize {
    worker.accept_messages(HELLO).unwrap();
    let listener = worker.listen(loopback()).unwrap();
    mine.send(listener.address()).unwrap();
    let peer = theirs.recv().unwrap();
    // Accepted connections greet their client and are closed once it has gone; outgoing
    // ones are closed by their client once greeted: connections end after their wire-up,
    // as ringfs's do, not in the middle of it.
    let mut accepted: Vec<Endpoint> = Vec::new();
    let mut outgoing: Vec<Endpoint> = Vec::new();
    let mut greetings = Vec::new();
    let mut connections = 0;
    let until = Instant::now() + CHURN;
    while Instant::now() < until {
        worker.progress();
        while let Some(endpoint) = listener.accept() {
            if let Ok(endpoint) = endpoint {
                greetings.extend(endpoint.send(HELLO, b"hello".to_vec(), Vec::new()).ok());
                accepted.push(endpoint);
            }
        }
        greetings.retain(|greeting| !greeting.is_complete());
        while let Some(message) = worker.next_message() {
            if let Some(position) = outgoing.iter().position(|endpoint| endpoint.key() == message.endpoint_key()) {
                outgoing.swap_remove(position).close();
            }
        }
        accepted.retain(|endpoint| {
            let failed = endpoint.failure().is_some();
            if failed {
                endpoint.close();
            }
            !failed
        });
        if outgoing.len() < 4
            && let Ok(endpoint) = worker.connect(peer)
        {
            outgoing.push(endpoint);
            connections += 1;
        }
    }
    connections
}

#[test]
#[ignore]
fn two_workers_churning_connections() {
    if !ucx_present() {
        return;
    }
    if std::env::var("RINGFS_UCX_CHURN").as_deref() == Ok("one") {
        let (address, peer) = mpsc::channel();
        let worker = Worker::new_serialized(&context("tcp")).unwrap();
        let total = churn_on(&worker, address, peer);
        println!("CHURNED {total} connections");
        return;
    }
    if std::env::var("RINGFS_UCX_CHURN").is_ok() {
        let (first_address, first_peer) = mpsc::channel();
        let (second_address, second_peer) = mpsc::channel();
        let first = std::thread::spawn(move || churn(first_address, second_peer));
        let second = std::thread::spawn(move || churn(second_address, first_peer));
        let total = first.join().unwrap() + second.join().unwrap();
        println!("CHURNED {total} connections");
        return;
    }
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["two_workers_churning_connections", "--exact", "--ignored", "--nocapture"])
        .env("RINGFS_UCX_CHURN", std::env::var("CHURN_MODE").unwrap_or("two".into()))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "the churning process failed ({}):\n{}",
        output.status,
        stderr.lines().rev().take(30).collect::<Vec<_>>().join("\n")
    );
}
