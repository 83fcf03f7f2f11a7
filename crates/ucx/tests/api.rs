//! The safe UCX API against real UCX, over its TCP transport and over its shared-memory
//! transports: connections, active messages (eager and rendezvous), registration and its cache,
//! RMA, the event descriptor, and failures (a dead peer, a paused peer, nobody listening).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{PeerProcess, VARIANTS, context, loopback, progress_both, ucx_present};
use ringfs_ucx::{Endpoint, Error, IncomingMessage, MemoryRegion, RegistrationCache, Worker};

const ECHO: u16 = 2;
const KEY_REQUEST: u16 = 3;

fn next_message(first: &Worker, second: &Worker, receiver: &Worker) -> IncomingMessage {
    let mut message = None;
    progress_both(first, second, || {
        message = receiver.next_message();
        message.is_some()
    });
    message.unwrap()
}

/// A connected pair of workers on this thread: (client worker, client endpoint, server worker,
/// server endpoint).
fn connected_pair(transports: &str) -> (Worker, Endpoint, Worker, Endpoint) {
    let server_worker = Worker::new(&context(transports)).unwrap();
    let client_worker = Worker::new(&context(transports)).unwrap();
    server_worker.accept_messages(ECHO).unwrap();
    client_worker.accept_messages(ECHO).unwrap();
    let listener = server_worker.listen(loopback()).unwrap();
    assert_ne!(listener.address().port(), 0);
    let client = client_worker.connect(listener.address()).unwrap();
    let mut accepted = None;
    progress_both(&client_worker, &server_worker, || {
        accepted = listener.accept();
        accepted.is_some()
    });
    let server = accepted.unwrap().unwrap();
    (client_worker, client, server_worker, server)
}

#[test]
fn active_messages_travel_both_ways_and_name_their_endpoint() {
    if !ucx_present() {
        return;
    }
    for transports in VARIANTS {
        let (client_worker, client, server_worker, server) = connected_pair(transports);
        let deadline = Instant::now() + Duration::from_secs(10);
        let sending = client.send(ECHO, b"ping-header".to_vec(), b"ping-payload".to_vec()).unwrap();
        progress_both(&client_worker, &server_worker, || sending.is_complete());
        let message = next_message(&client_worker, &server_worker, &server_worker);
        assert_eq!((message.id(), message.header(), message.data()), (ECHO, &b"ping-header"[..], Some(&b"ping-payload"[..])));
        assert_eq!(message.endpoint_key(), server.key(), "{transports}: the message names the server's endpoint of this connection");
        drop(message);
        let operation = server.send(ECHO, b"pong".to_vec(), vec![7u8; 100]).unwrap();
        let reply = next_message(&client_worker, &server_worker, &client_worker);
        assert_eq!((reply.header(), reply.data().map(|data| data.len())), (&b"pong"[..], Some(100)));
        let buffers = operation.wait(deadline).unwrap();
        assert_eq!((buffers.header.len(), buffers.body.len()), (4, 100), "the operation gives its buffers back");
        assert!(client.describe().contains("tcp") || transports != "tcp", "{}", client.describe());
    }
}

#[test]
fn large_payloads_arrive_by_rendezvous_into_the_receivers_buffer() {
    if !ucx_present() {
        return;
    }
    for transports in VARIANTS {
        let (client_worker, client, server_worker, _server) = connected_pair(transports);
        let payload: Vec<u8> = (0..4 << 20).map(|index: u32| (index % 251) as u8).collect();
        let sending = client.send(ECHO, vec![1], payload.clone()).unwrap();
        let message = next_message(&client_worker, &server_worker, &server_worker);
        assert_eq!(message.len(), payload.len());
        let mut receiving = message.receive(vec![0u8; payload.len()], None).unwrap();
        let mut received = None;
        progress_both(&client_worker, &server_worker, || {
            received = receiving.take();
            received.is_some()
        });
        assert!(received.unwrap().unwrap() == payload, "{transports}: the payload arrives intact");
        progress_both(&client_worker, &server_worker, || sending.is_complete());
    }
}

#[test]
fn get_and_put_move_bytes_of_a_registered_region() {
    if !ucx_present() {
        return;
    }
    for transports in VARIANTS {
        let (client_worker, client, server_worker, server) = connected_pair(transports);
        let mut exposed: Vec<u8> = (0..1 << 20).map(|index: u32| (index % 253) as u8).collect();
        let region = MemoryRegion::register(client_worker.context(), &exposed).unwrap();
        let key = server.unpack_key(region.pack_key()).unwrap();
        let base = exposed.as_ptr() as u64;
        let cache = RegistrationCache::new(server_worker.context(), 8);
        let local = vec![0u8; 1 << 20];
        let local_region = cache.register(&local).unwrap();
        let mut getting = server.get(local, 1 << 20, base, &key, Some(local_region.clone())).unwrap();
        let mut fetched = None;
        progress_both(&client_worker, &server_worker, || {
            fetched = getting.take();
            fetched.is_some()
        });
        assert!(fetched.unwrap().unwrap() == exposed, "{transports}: get reads the peer's bytes");
        let putting = server.put(vec![0xAB; 4096], 4096, base + 8192, &key, None).unwrap();
        progress_both(&client_worker, &server_worker, || putting.is_complete());
        let flushing = server.flush().unwrap();
        progress_both(&client_worker, &server_worker, || flushing.is_complete());
        assert!(exposed[8192..8192 + 4096].iter().all(|byte| *byte == 0xAB), "{transports}: put writes the peer's bytes");
        assert_eq!(exposed[8191], (8191 % 253) as u8, "{transports}: nothing outside the range changes");
        exposed[0] = 0;
        let outside = server.get(vec![0u8; 16], 32, base, &key, None);
        assert!(matches!(outside, Err(Error::Invalid(_))), "a length beyond the local buffer is refused");
        let unrelated = MemoryRegion::register(server_worker.context(), &[0u8; 64]).unwrap();
        let uncovered = server.get(vec![0u8; 4096], 4096, base, &key, Some(Arc::new(unrelated)));
        assert!(matches!(uncovered, Err(Error::Invalid(_))), "a registration that does not cover the buffer is refused");
        drop(client);
    }
}

#[test]
fn the_registration_cache_reuses_registrations_and_forgets_unmapped_memory() {
    if !ucx_present() {
        return;
    }
    let context = context("tcp");
    let cache = RegistrationCache::new(&context, 2);
    assert!(cache.is_caching(), "UCX's memory hooks work on this machine");
    let buffer = vec![1u8; 64 << 10];
    let first = cache.register(&buffer).unwrap();
    let again = cache.register(&buffer[100..200]).unwrap();
    assert!(Arc::ptr_eq(&first, &again), "a range inside a cached registration reuses it");
    assert_eq!(cache.statistics(), (1, 1));
    let length = 1 << 20;
    // SAFETY: an anonymous private mapping, unmapped below.
    let mapped = unsafe {
        libc::mmap(std::ptr::null_mut(), length, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    assert_ne!(mapped, libc::MAP_FAILED);
    // SAFETY: the mapping is `length` bytes, readable.
    let view = unsafe { std::slice::from_raw_parts(mapped.cast::<u8>(), length) };
    let before = cache.register(view).unwrap();
    assert!(Arc::ptr_eq(&before, &cache.register(view).unwrap()));
    // SAFETY: unmapping the mapping made above; `view` is not used after this.
    unsafe { libc::munmap(mapped, length) };
    // SAFETY: a new mapping (often at the same address), unmapped below.
    let remapped = unsafe {
        libc::mmap(std::ptr::null_mut(), length, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    // SAFETY: as above.
    let view = unsafe { std::slice::from_raw_parts(remapped.cast::<u8>(), length) };
    let after = cache.register(view).unwrap();
    assert!(!Arc::ptr_eq(&before, &after), "an unmapped range is registered anew");
    // A third range evicts the least recently used of the two cached ones.
    let other = vec![2u8; 4096];
    cache.register(&other).unwrap();
    let (_, misses) = cache.statistics();
    cache.register(&buffer).unwrap();
    assert_eq!(cache.statistics().1, misses + 1, "the least recently used registration was evicted");
    // SAFETY: unmapping the second mapping.
    unsafe { libc::munmap(remapped, length) };
}

/// CPU time used by the calling thread.
fn thread_cpu_time() -> Duration {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) }, 0);
    let micros = |time: libc::timeval| time.tv_sec as u64 * 1_000_000 + time.tv_usec as u64;
    Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime))
}

#[test]
fn an_idle_worker_sleeps_on_its_event_descriptor_until_a_message_comes() {
    if !ucx_present() {
        return;
    }
    for transports in VARIANTS {
        let (client_worker, client, server_worker, _server) = connected_pair(transports);
        let cpu_before = thread_cpu_time();
        let started = Instant::now();
        let until = started + Duration::from_millis(500);
        let mut wakeups = 0;
        while Instant::now() < until {
            server_worker.progress();
            server_worker.wait(until.saturating_duration_since(Instant::now())).unwrap();
            wakeups += 1;
        }
        let cpu = thread_cpu_time() - cpu_before;
        assert!(cpu < Duration::from_millis(100), "{transports}: idle for 500 ms used {cpu:?} of CPU ({wakeups} wake-ups)");
        assert!(server_worker.next_message().is_none());
        let sending = client.send(ECHO, b"wake".to_vec(), Vec::new()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let woke = server_worker.progress_until(deadline, || {
            client_worker.progress();
            server_worker.has_messages()
        });
        assert_eq!(woke, Ok(true), "{transports}");
        assert!(sending.is_complete());
    }
}

#[test]
fn connecting_where_nobody_listens_fails_the_endpoint_in_bounded_time() {
    if !ucx_present() {
        return;
    }
    let free_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let worker = Worker::new(&context("tcp")).unwrap();
    let endpoint = worker.connect(free_port).unwrap();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(20);
    let result = endpoint.send_and_wait(ECHO, b"anyone?", b"", deadline);
    let failed = worker.progress_until(deadline, || endpoint.failure().is_some()).unwrap();
    assert!(failed || result.is_err(), "a connection to nobody fails");
    assert!(started.elapsed() < Duration::from_secs(15), "and within bounded time: {:?}", started.elapsed());
}

/// The peer side of the process tests: serves its packed key and echoes messages until killed.
#[test]
#[ignore = "run as a child process by the tests below"]
fn peer_main() {
    let Ok(transports) = std::env::var("RINGFS_UCX_PEER") else {
        return;
    };
    let worker = Worker::new(&context(&transports)).unwrap();
    worker.accept_messages(ECHO).unwrap();
    worker.accept_messages(KEY_REQUEST).unwrap();
    let listener = worker.listen(loopback()).unwrap();
    let exposed = vec![0x5Au8; 1 << 20];
    let region = MemoryRegion::register(worker.context(), &exposed).unwrap();
    println!("PEER {}", listener.address());
    let mut endpoints: Vec<Endpoint> = Vec::new();
    loop {
        worker.progress_until(Instant::now() + Duration::from_secs(1), || listener.pending() > 0 || worker.has_messages()).unwrap();
        while let Some(endpoint) = listener.accept() {
            endpoints.push(endpoint.unwrap());
        }
        while let Some(message) = worker.next_message() {
            let Some(endpoint) = endpoints.iter().find(|endpoint| endpoint.key() == message.endpoint_key()) else { continue };
            let mut reply = (exposed.as_ptr() as u64).to_le_bytes().to_vec();
            if message.id() == KEY_REQUEST {
                reply.extend_from_slice(region.pack_key());
            }
            let _ =
                endpoint.send_and_wait(message.id(), &reply, message.data().unwrap_or_default(), Instant::now() + Duration::from_secs(5));
        }
    }
}

fn connect_to_peer(worker: &Worker, peer: &PeerProcess) -> (Endpoint, u64, ringfs_ucx::RemoteKey) {
    worker.accept_messages(KEY_REQUEST).unwrap();
    let endpoint = worker.connect(peer.address).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    endpoint.send_and_wait(KEY_REQUEST, b"", b"", deadline).unwrap();
    let mut reply = None;
    assert_eq!(
        worker.progress_until(deadline, || {
            reply = worker.next_message();
            reply.is_some()
        }),
        Ok(true)
    );
    let header = reply.unwrap().header().to_vec();
    let address = u64::from_le_bytes(header[..8].try_into().unwrap());
    let key = endpoint.unpack_key(&header[8..]).unwrap();
    (endpoint, address, key)
}

#[test]
fn a_killed_peer_fails_operations_in_bounded_time() {
    if !ucx_present() {
        return;
    }
    for transports in VARIANTS {
        let mut peer = PeerProcess::start("peer_main", transports);
        let worker = Worker::new(&context(transports)).unwrap();
        let (endpoint, address, key) = connect_to_peer(&worker, &peer);
        let mut bytes = vec![0u8; 4096];
        endpoint.get_and_wait(&mut bytes, address, &key, Instant::now() + Duration::from_secs(10)).unwrap();
        assert!(bytes.iter().all(|byte| *byte == 0x5A), "{transports}: get reads the peer's memory");
        peer.child.kill().unwrap();
        peer.child.wait().unwrap();
        let started = Instant::now();
        let deadline = started + Duration::from_secs(30);
        worker.progress_until(deadline, || endpoint.failure().is_some()).unwrap();
        let failure = endpoint.failure();
        assert!(matches!(failure, Some(Error::EndpointFailed { .. })), "{transports}: {failure:?}");
        assert!(started.elapsed() < Duration::from_secs(20), "{transports}: noticed after {:?}", started.elapsed());
        let after = endpoint.get_and_wait(&mut bytes, address, &key, Instant::now() + Duration::from_secs(5));
        assert!(matches!(after, Err(Error::EndpointFailed { .. })), "{transports}: {after:?}");
    }
}

#[test]
fn a_paused_peer_times_out_and_the_borrowed_buffer_is_released() {
    if !ucx_present() {
        return;
    }
    for transports in VARIANTS {
        let peer = PeerProcess::start("peer_main", transports);
        let worker = Worker::new(&context(transports)).unwrap();
        let (endpoint, _, _) = connect_to_peer(&worker, &peer);
        peer.signal(libc::SIGSTOP);
        let started = Instant::now();
        let payload = vec![9u8; 8 << 20];
        let result = endpoint.send_and_wait(ECHO, b"", &payload, started + Duration::from_millis(700));
        assert!(result.is_err(), "{transports}: a send to a stopped peer cannot complete: {result:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "{transports}: gave up after {:?}", started.elapsed());
        assert!(endpoint.failure().is_some(), "{transports}: the endpoint is closed after the timeout");
        drop(payload);
    }
}
