//! `ringfs bench rpc`: the request round trip and the 1 MiB bandwidth of the ringfs client
//! against one server of a running cluster, over whatever transport the cluster uses (TCP or
//! UCX), so that the rpc layer can be set beside `ucx_perftest` on the same transport
//! (`scripts/ucx-anchor.sh`).
//!
//! - *Round trip*: `Ping` requests on the client's connection to the first member, one at a
//!   time; the median of each repeat.
//! - *Bandwidth*: one file of `size` bytes written with 1 MiB `pwrite`s and read back with
//!   1 MiB `pread`s by this one process (no worker processes), one request at a time.
//!
//! Run the client off the same-host path (`RINGFS_LOCAL=0`) so that every request crosses
//! the transport being measured.

use std::time::Instant;

use ringfs_client::Client;
use ringfs_proto::{Request, Response};

use crate::{BenchError, median};

const MIB: usize = 1 << 20;

/// What to measure.
#[derive(Clone, Debug)]
pub struct RpcBenchConfig {
    /// `Ping`s timed per repeat (after as many untimed ones, a tenth, for warm-up).
    pub pings: usize,
    /// Bytes written and read per repeat (a multiple of 1 MiB).
    pub size_bytes: u64,
    pub repeats: usize,
}

/// Medians over the repeats.
#[derive(Clone, Debug)]
pub struct RpcBenchResult {
    /// The server pinged.
    pub server: String,
    /// The UCX transports of the connection (`None`: not UCX).
    pub ucx_lanes: Option<String>,
    /// Median round trip of a `Ping` (µs).
    pub round_trip_us: f64,
    /// 1 MiB writes (MB/s).
    pub write_mb_per_second: f64,
    /// 1 MiB reads (MB/s).
    pub read_mb_per_second: f64,
}

fn failed(what: &str, error: impl std::fmt::Display) -> BenchError {
    BenchError::Setup(format!("{what}: {error}"))
}

/// Median µs of `count` pings on the client's connection to `server`.
fn ping_round_trip(client: &Client, server: &str, count: usize) -> Result<f64, BenchError> {
    let connection = client.connection_to(server).map_err(|errno| failed("connecting", errno))?;
    let mut times = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        let reply = connection.call(&Request::Ping, &[]).map_err(|error| failed("ping", error))?;
        times.push(started.elapsed().as_secs_f64() * 1e6);
        if matches!(reply.response, Response::Error(_)) {
            return Err(failed("ping", format!("{:?}", reply.response)));
        }
    }
    Ok(median(&times))
}

/// (write MB/s, read MB/s) of one file of `size` bytes in 1 MiB requests.
fn file_bandwidth(client: &Client, path: &str, size: u64) -> Result<(f64, f64), BenchError> {
    let blocks = (size as usize / MIB).max(1);
    let block: Vec<u8> = (0..MIB).map(|position| (position * 31 + 7) as u8).collect();
    let fd = client.create(path, 0o644).map_err(|errno| failed("create", errno))?;
    let started = Instant::now();
    for index in 0..blocks {
        client.pwrite(fd, &block, (index * MIB) as u64).map_err(|errno| failed("pwrite", errno))?;
    }
    client.fsync(fd).map_err(|errno| failed("fsync", errno))?;
    let write = (blocks * MIB) as f64 / started.elapsed().as_secs_f64() / 1e6;
    client.close(fd).map_err(|errno| failed("close", errno))?;
    let fd = client.open(path, ringfs_client::OpenFlags::READ, 0).map_err(|errno| failed("open", errno))?;
    let mut buffer = vec![0u8; MIB];
    let started = Instant::now();
    for index in 0..blocks {
        let count = client.pread(fd, &mut buffer, (index * MIB) as u64).map_err(|errno| failed("pread", errno))?;
        if count != MIB || buffer != block {
            return Err(failed("pread", format!("block {index} came back wrong ({count} bytes)")));
        }
    }
    let read = (blocks * MIB) as f64 / started.elapsed().as_secs_f64() / 1e6;
    client.close(fd).map_err(|errno| failed("close", errno))?;
    client.unlink(path).map_err(|errno| failed("unlink", errno))?;
    Ok((write, read))
}

/// Runs the benchmark against the cluster `client` is connected to.
pub fn run(client: &Client, config: &RpcBenchConfig) -> Result<RpcBenchResult, BenchError> {
    let members = client.members().members;
    let server = members.first().ok_or_else(|| failed("cluster", "no members"))?.name.clone();
    let path = format!("/bench-rpc.{}", std::process::id());
    ping_round_trip(client, &server, (config.pings / 10).max(100))?;
    let (mut trips, mut writes, mut reads) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..config.repeats.max(1) {
        trips.push(ping_round_trip(client, &server, config.pings)?);
        let (write, read) = file_bandwidth(client, &path, config.size_bytes)?;
        writes.push(write);
        reads.push(read);
    }
    Ok(RpcBenchResult {
        ucx_lanes: client.ucx_lanes(&server),
        server,
        round_trip_us: median(&trips),
        write_mb_per_second: median(&writes),
        read_mb_per_second: median(&reads),
    })
}

/// The result as `key value` lines (read by `scripts/ucx-anchor.sh`).
pub fn report(result: &RpcBenchResult) -> String {
    format!(
        "server {}\ntransport {}\nround_trip_us {:.2}\nwrite_mb_s {:.0}\nread_mb_s {:.0}\n",
        result.server,
        result.ucx_lanes.as_deref().map_or("tcp".to_string(), |lanes| format!("ucx {lanes}")),
        result.round_trip_us,
        result.write_mb_per_second,
        result.read_mb_per_second
    )
}
