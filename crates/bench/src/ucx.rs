//! `ringfs bench ucx`: the frame transport of `ringfs-ucx` against `ucx_perftest`, the physical
//! anchor, on the same UCX transports in the same run.
//!
//! For each transport list (`UCX_TLS`) it measures, in rounds that alternate the two sides:
//! - `ucx_perftest` tag latency (8 bytes, one way, median) and tag bandwidth (1 MiB messages);
//! - over the frame transport (server in another process, both sides polling as perftest
//!   does): the round trip of a small request (an 8-byte body), and the bandwidth of 1 MiB
//!   writes (the server `get`s the data) and 1 MiB reads (the server `put`s it) with a window
//!   of requests in flight.
//!
//! `--sweep` adds the latency of writes and reads of 4 KiB to 1 MiB sent inline and by RMA,
//! which is how [`ringfs_ucx::frames::DEFAULT_RMA_THRESHOLD`] was chosen.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use ringfs_ucx::frames::{
    BulkTransfer, Client, Connection, DEFAULT_RMA_THRESHOLD, FrameConfig, Incoming, Outgoing, Request, Server, Service, SharedData,
};
use ringfs_ucx::{Context, ContextConfig, RegistrationCache, Worker};

use crate::BenchError;

const MIB: usize = 1 << 20;

/// What to measure.
#[derive(Clone, Debug)]
pub struct UcxBenchConfig {
    /// (label, UCX_TLS) pairs.
    pub variants: Vec<(String, String)>,
    pub rounds: usize,
    pub latency_iterations: usize,
    /// 1 MiB transfers per bandwidth measurement.
    pub bandwidth_iterations: usize,
    /// Requests in flight in the bandwidth measurements.
    pub window: usize,
    /// The `ringfs` executable, started as `ringfs bench ucx-serve`.
    pub ringfs: PathBuf,
    /// Also measure inline against RMA transfers from 4 KiB to 1 MiB.
    pub sweep: bool,
    /// Also measure forced RMA against UCX's own RMA (`ucx_perftest` `ucp_get`, `ucp_put_bw`).
    pub rma: bool,
}

/// Median µs per call of one size sent inside the messages and by RMA.
#[derive(Clone, Copy, Debug, Default)]
pub struct SweepRow {
    pub size: usize,
    pub write_inline: f64,
    pub write_rma: f64,
    pub read_inline: f64,
    pub read_rma: f64,
}

/// The medians of one transport list.
#[derive(Clone, Debug, Default)]
pub struct VariantResult {
    pub label: String,
    pub transports: String,
    /// ucx_perftest tag_lat, one way (µs).
    pub perftest_latency_us: f64,
    /// ucx_perftest tag_bw with 1 MiB messages (MB/s).
    pub perftest_bandwidth: f64,
    /// Frame transport: round trip of a small request (µs).
    pub round_trip_us: f64,
    pub write_bandwidth: f64,
    pub read_bandwidth: f64,
    /// Whether the frame transport moved 1 MiB by RMA (`BulkTransfer::Auto`'s choice).
    pub used_rma: bool,
    pub sweep: Vec<SweepRow>,
    /// With `rma`: (perftest ucp_get MB/s, perftest ucp_put_bw MB/s, forced-RMA write MB/s,
    /// forced-RMA read MB/s).
    pub rma: Option<(f64, f64, f64, f64)>,
}

fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn setup(message: impl std::fmt::Display) -> BenchError {
    BenchError::Setup(message.to_string())
}

// ----- the frame server process -------------------------------------------------------------------

/// The service of the benchmark server: `L` answers at once, `W` discards the data, `R n`
/// answers with `n` bytes of memory it keeps (sent without a copy, as a chunk store would).
struct SinkSource {
    source: Arc<[u8]>,
}

impl Service for SinkSource {
    type Session = ();

    fn handle(&mut self, _: &mut (), incoming: &Incoming<'_>, outgoing: &mut Outgoing) {
        outgoing.body.push(b'+');
        if incoming.body.first() == Some(&b'R') && incoming.body.len() >= 9 {
            let length = u64::from_le_bytes(incoming.body[1..9].try_into().unwrap_or_default()) as usize;
            outgoing.shared = Some(SharedData { bytes: self.source.clone(), range: 0..length.min(self.source.len()) });
        }
    }
}

/// `ringfs bench ucx-serve`: a frame server on `transports`, printing `ADDRESS a` when ready;
/// it spins `spin` after each event (as perftest's busy polling does) and runs until killed.
pub fn serve(transports: &str, spin: Duration, rma_threshold: usize) -> Result<(), BenchError> {
    let context = Context::new(&ContextConfig { transports: Some(transports.to_string()) }).map_err(setup)?;
    let worker = Worker::new(&context).map_err(setup)?;
    worker.set_spin(spin);
    let cache = RegistrationCache::new(&context, 64);
    let source: Arc<[u8]> = vec![0x42u8; 8 * MIB].into();
    let config = FrameConfig { rma_threshold, timeout: Duration::from_secs(30), bulk: BulkTransfer::Auto };
    let address: SocketAddr = "127.0.0.1:0".parse().map_err(setup)?;
    let mut server = Server::bind(&worker, address, SinkSource { source }, cache, config).map_err(setup)?;
    println!("ADDRESS {}", server.address());
    server.run(&AtomicBool::new(false)).map_err(setup)
}

/// A benchmark server process, killed on drop.
struct ServerProcess {
    child: Child,
    address: SocketAddr,
}

impl ServerProcess {
    fn start(ringfs: &PathBuf, transports: &str, rma_threshold: usize) -> Result<ServerProcess, BenchError> {
        let mut child = Command::new(ringfs)
            .args(["bench", "ucx-serve", "--transports", transports, "--rma-threshold", &rma_threshold.to_string(), "--spin-ms", "1000"])
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|error| setup(format!("cannot start {}: {error}", ringfs.display())))?;
        let stdout = child.stdout.take().ok_or_else(|| setup("no stdout"))?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map_err(setup)?;
        let address = line.strip_prefix("ADDRESS ").and_then(|text| text.trim().parse().ok());
        match address {
            Some(address) => Ok(ServerProcess { child, address }),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                Err(setup(format!("the benchmark server printed {line:?}")))
            }
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ----- ucx_perftest -----------------------------------------------------------------------------------

/// A free TCP port on loopback (bound and released).
fn free_port() -> Result<u16, BenchError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0").map_err(setup)?.local_addr().map_err(setup)?.port())
}

/// True once a socket listens on TCP `port` of every IPv4 address, as perftest's server does
/// (read from /proc/net/tcp, without connecting: perftest's server takes the first connection
/// as its client).
fn listening(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let wanted = format!("00000000:{port:04X}");
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.len() > 3 && fields[1] == wanted && fields[3] == "0A"
    })
}

/// Runs one perftest (server and client processes) and returns the numbers of its final line:
/// [iterations, p50 µs, average µs, overall µs, average MB/s, overall MB/s, …].
fn perftest(transports: &str, test: &str, size: usize, iterations: usize) -> Result<Vec<f64>, BenchError> {
    let port = free_port()?.to_string();
    let mut server = Command::new("ucx_perftest")
        .args(["-p", &port])
        .env("UCX_TLS", transports)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|error| setup(format!("cannot run ucx_perftest (install ucx-utils): {error}")))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !listening(port.parse().unwrap_or_default()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let warmup = (iterations / 10).max(10).to_string();
    let run_client = || {
        Command::new("ucx_perftest")
            .args(["127.0.0.1", "-p", &port, "-t", test, "-s", &size.to_string(), "-n", &iterations.to_string(), "-w", &warmup, "-f"])
            .env("UCX_TLS", transports)
            .output()
    };
    // The server's socket sometimes refuses the first connection although it is listening:
    // try again for a while (the server keeps waiting for its client).
    let refused = |output: &std::process::Output| {
        String::from_utf8_lossy(&output.stderr).contains("Connection refused")
            || String::from_utf8_lossy(&output.stdout).contains("Connection refused")
    };
    let mut client = run_client();
    for _ in 0..50 {
        match &client {
            Ok(output) if refused(output) => {
                std::thread::sleep(Duration::from_millis(100));
                client = run_client();
            }
            _ => break,
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    let output = client.map_err(setup)?;
    let text = String::from_utf8_lossy(&output.stdout);
    let numbers = text
        .lines()
        .rev()
        .map(|line| line.split_whitespace().filter_map(|word| word.parse::<f64>().ok()).collect::<Vec<_>>())
        .find(|numbers| numbers.len() >= 6);
    numbers.ok_or_else(|| setup(format!("ucx_perftest {test} printed no result: {text}{}", String::from_utf8_lossy(&output.stderr))))
}

// ----- the frame transport client -----------------------------------------------------------------

struct FrameClient {
    _client: Client,
    connection: Connection,
}

fn frame_client(transports: &str, address: SocketAddr, rma_threshold: usize, bulk: BulkTransfer) -> Result<FrameClient, BenchError> {
    let context = Context::new(&ContextConfig { transports: Some(transports.to_string()) }).map_err(setup)?;
    let worker = Worker::new(&context).map_err(setup)?;
    worker.set_spin(Duration::from_secs(1));
    let cache = RegistrationCache::new(&context, 64);
    let client = Client::new(&worker, cache, FrameConfig { rma_threshold, timeout: Duration::from_secs(30), bulk }).map_err(setup)?;
    let connection = client.connect(address).map_err(setup)?;
    connection.call(Request { epoch: 0, body: b"L", data: &[], destination: None }).map_err(setup)?;
    if std::env::var_os("RINGFS_UCX_DESCRIBE").is_some() {
        eprintln!("{}", connection.endpoint().describe());
    }
    Ok(FrameClient { _client: client, connection })
}

fn read_body(length: usize) -> Vec<u8> {
    let mut body = vec![b'R'];
    body.extend_from_slice(&(length as u64).to_le_bytes());
    body
}

/// Median time of `iterations` calls of `body` with `data` (and a destination of
/// `destination_len` bytes), in µs.
fn call_latency(connection: &Connection, body: &[u8], data: &[u8], destination_len: usize, iterations: usize) -> Result<f64, BenchError> {
    let mut destination = vec![0u8; destination_len];
    let mut times = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let started = Instant::now();
        let destination = (destination_len > 0).then_some(&mut destination[..]);
        connection.call(Request { epoch: 0, body, data, destination }).map_err(setup)?;
        times.push(started.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median(&mut times))
}

/// MB/s of `iterations` 1 MiB writes (`read` false) or reads with `window` in flight.
fn bandwidth(connection: &Connection, read: bool, iterations: usize, window: usize) -> Result<f64, BenchError> {
    let source = vec![0x17u8; MIB];
    let mut destinations: Vec<Vec<u8>> = (0..window).map(|_| vec![0u8; MIB]).collect();
    let pointers: Vec<*mut u8> = destinations.iter_mut().map(|buffer| buffer.as_mut_ptr()).collect();
    let write_body = [b'W'];
    let read_body = read_body(MIB);
    let mut in_flight = VecDeque::new();
    let started = Instant::now();
    for index in 0..iterations {
        if in_flight.len() == window {
            let call: ringfs_ucx::frames::PendingCall<'_> = in_flight.pop_front().expect("a call in flight");
            call.wait().map_err(setup)?;
        }
        let request = if read {
            // SAFETY: slot `index % window` belongs to the call `window` calls ago, which was
            // waited for just above; no other reference to the buffer exists meanwhile.
            let destination = unsafe { std::slice::from_raw_parts_mut(pointers[index % window], MIB) };
            Request { epoch: 0, body: &read_body, data: &[], destination: Some(destination) }
        } else {
            Request { epoch: 0, body: &write_body, data: &source, destination: None }
        };
        // SAFETY: every started call is waited for (here or after the loop) before the buffers go.
        in_flight.push_back(unsafe { connection.start(request) }.map_err(setup)?);
    }
    for call in in_flight {
        call.wait().map_err(setup)?;
    }
    Ok((iterations * MIB) as f64 / started.elapsed().as_secs_f64() / 1e6)
}

/// Inline against RMA latency of writes and reads from 4 KiB to 1 MiB.
fn sweep(config: &UcxBenchConfig, transports: &str) -> Result<Vec<SweepRow>, BenchError> {
    let server = ServerProcess::start(&config.ringfs, transports, 1)?;
    let inline = frame_client(transports, server.address, usize::MAX, BulkTransfer::Inline)?;
    let rma = frame_client(transports, server.address, 1, BulkTransfer::Rma)?;
    let iterations = (config.latency_iterations / 10).max(50);
    let mut rows = Vec::new();
    for size in [4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, MIB] {
        let data = vec![1u8; size];
        let body = read_body(size);
        rows.push(SweepRow {
            size,
            write_inline: call_latency(&inline.connection, b"W", &data, 0, iterations)?,
            write_rma: call_latency(&rma.connection, b"W", &data, 0, iterations)?,
            read_inline: call_latency(&inline.connection, &body, &[], 0, iterations)?,
            read_rma: call_latency(&rma.connection, &body, &[], size, iterations)?,
        });
    }
    Ok(rows)
}

/// One round of the frame transport with `bulk`: (round trip µs, write MB/s, read MB/s,
/// whether 1 MiB moved by RMA).
fn frame_round(config: &UcxBenchConfig, transports: &str, bulk: BulkTransfer) -> Result<(f64, f64, f64, bool), BenchError> {
    let server = ServerProcess::start(&config.ringfs, transports, DEFAULT_RMA_THRESHOLD)?;
    let client = frame_client(transports, server.address, DEFAULT_RMA_THRESHOLD, bulk)?;
    let connection = &client.connection;
    call_latency(connection, b"L0000000", &[], 0, 200)?;
    let round_trip = call_latency(connection, b"L0000000", &[], 0, config.latency_iterations)?;
    bandwidth(connection, false, 20, config.window)?;
    let write = bandwidth(connection, false, config.bandwidth_iterations, config.window)?;
    let read = bandwidth(connection, true, config.bandwidth_iterations, config.window)?;
    Ok((round_trip, write, read, connection.uses_rma()))
}

/// Forced RMA against UCX's own RMA, with a tenth of the transfers (UCX emulates RMA over TCP
/// slowly): (perftest ucp_get, perftest ucp_put_bw, frame write, frame read) in MB/s.
fn rma_round(config: &UcxBenchConfig, transports: &str) -> Result<(f64, f64, f64, f64), BenchError> {
    let transfers = (config.bandwidth_iterations / 10).max(10);
    let get = perftest(transports, "ucp_get", MIB, transfers)?[5];
    let put = perftest(transports, "ucp_put_bw", MIB, transfers)?[5];
    let server = ServerProcess::start(&config.ringfs, transports, DEFAULT_RMA_THRESHOLD)?;
    let client = frame_client(transports, server.address, DEFAULT_RMA_THRESHOLD, BulkTransfer::Rma)?;
    let write = bandwidth(&client.connection, false, transfers, config.window)?;
    let read = bandwidth(&client.connection, true, transfers, config.window)?;
    Ok((get, put, write, read))
}

/// Runs the benchmark.
pub fn run(config: &UcxBenchConfig) -> Result<Vec<VariantResult>, BenchError> {
    if !ringfs_ucx::is_available() {
        return Err(setup("UCX (libucp.so.0) is not installed"));
    }
    let mut results = Vec::new();
    for (label, transports) in &config.variants {
        let (mut latency, mut bandwidth_anchor, mut round_trip, mut write, mut read) = (vec![], vec![], vec![], vec![], vec![]);
        let (mut rma_get, mut rma_put, mut rma_write, mut rma_read) = (vec![], vec![], vec![], vec![]);
        let mut used_rma = false;
        for _ in 0..config.rounds {
            latency.push(perftest(transports, "tag_lat", 8, config.latency_iterations)?[1]);
            bandwidth_anchor.push(perftest(transports, "tag_bw", MIB, config.bandwidth_iterations)?[5]);
            let (trip, written, readback, rma) = frame_round(config, transports, BulkTransfer::Auto)?;
            round_trip.push(trip);
            write.push(written);
            read.push(readback);
            used_rma = rma;
            if config.rma {
                let (get, put, written, readback) = rma_round(config, transports)?;
                rma_get.push(get);
                rma_put.push(put);
                rma_write.push(written);
                rma_read.push(readback);
            }
        }
        let sweep = if config.sweep { sweep(config, transports)? } else { Vec::new() };
        let rma = config.rma.then(|| (median(&mut rma_get), median(&mut rma_put), median(&mut rma_write), median(&mut rma_read)));
        results.push(VariantResult {
            label: label.clone(),
            transports: transports.clone(),
            perftest_latency_us: median(&mut latency),
            perftest_bandwidth: median(&mut bandwidth_anchor),
            round_trip_us: median(&mut round_trip),
            write_bandwidth: median(&mut write),
            read_bandwidth: median(&mut read),
            used_rma,
            sweep,
            rma,
        });
    }
    Ok(results)
}

/// The results as Markdown tables.
pub fn report(results: &[VariantResult], config: &UcxBenchConfig) -> String {
    let mut text = format!(
        "UCX {} — medians of {} rounds; latency {} iterations, bandwidth {} × 1 MiB, window {}\n\n",
        ringfs_ucx::version().unwrap_or_default(),
        config.rounds,
        config.latency_iterations,
        config.bandwidth_iterations,
        config.window
    );
    text += "| UCX_TLS | perftest tag_lat one way | perftest round trip | frame round trip | difference | perftest tag_bw 1 MiB | frame write 1 MiB | ratio | frame read 1 MiB | ratio | 1 MiB moved by |\n";
    text += "|---|---|---|---|---|---|---|---|---|---|---|\n";
    for result in results {
        let perftest_round_trip = 2.0 * result.perftest_latency_us;
        text += &format!(
            "| {} (`{}`) | {:.2} µs | {:.2} µs | {:.2} µs | {:+.2} µs | {:.0} MB/s | {:.0} MB/s | {:.2}× | {:.0} MB/s | {:.2}× | {} |\n",
            result.label,
            result.transports,
            result.perftest_latency_us,
            perftest_round_trip,
            result.round_trip_us,
            result.round_trip_us - perftest_round_trip,
            result.perftest_bandwidth,
            result.write_bandwidth,
            result.write_bandwidth / result.perftest_bandwidth,
            result.read_bandwidth,
            result.read_bandwidth / result.perftest_bandwidth,
            if result.used_rma { "RMA" } else { "eager messages" },
        );
    }
    if results.iter().any(|result| result.rma.is_some()) {
        text += "\nForced RMA (`BulkTransfer::Rma`) against UCX's own RMA, 1 MiB, MB/s:\n\n";
        text += "| UCX_TLS | perftest ucp_get | frame write (server gets) | ratio | perftest ucp_put_bw | frame read (server puts) | ratio |\n|---|---|---|---|---|---|---|\n";
        for result in results {
            if let Some((get, put, write, read)) = result.rma {
                text += &format!(
                    "| {} | {get:.0} | {write:.0} | {:.2}× | {put:.0} | {read:.0} | {:.2}× |\n",
                    result.label,
                    write / get,
                    read / put
                );
            }
        }
    }
    for result in results.iter().filter(|result| !result.sweep.is_empty()) {
        text += &format!("\nInline against RMA, {} (`{}`), median µs per call:\n\n", result.label, result.transports);
        text += "| size | write inline | write by get | read inline | read by put |\n|---|---|---|---|---|\n";
        for row in &result.sweep {
            text += &format!(
                "| {} KiB | {:.1} | {:.1} | {:.1} | {:.1} |\n",
                row.size >> 10,
                row.write_inline,
                row.write_rma,
                row.read_inline,
                row.read_rma
            );
        }
    }
    text
}
