//! `ringfs demo`: start a local cluster, use it, measure it against /dev/shm, stop it —
//! printing each step. The README's first command.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use ringfs_bench::io500::{self, Io500Config};
use ringfs_bench::micro;
use ringfs_bench::target::TargetSpec;
use ringfs_client::{Client, OpenFlags};

use crate::bench_command::{BenchCluster, ClusterArgs, run_io500};
use ringfs_config::env;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Servers of the local cluster.
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
}

/// A checksum for showing that bytes came back unchanged (FNV-1a, 64 bit).
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| (hash ^ *byte as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

fn step(text: &str) {
    println!("\n== {text}");
}

fn use_the_file_system(client: &Client) -> Result<()> {
    fn fail(what: &'static str) -> impl Fn(ringfs_client::Errno) -> anyhow::Error {
        move |errno| anyhow::anyhow!("{what}: {errno}")
    }
    step("create /demo and write files through the native client");
    client.mkdir("/demo", 0o755).map_err(fail("mkdir /demo"))?;
    let mut large = vec![0u8; 24 << 20];
    for (index, byte) in large.iter_mut().enumerate() {
        *byte = (index.wrapping_mul(2_654_435_761) >> 13) as u8;
    }
    let started = Instant::now();
    let fd = client.create("/demo/large.bin", 0o644).map_err(fail("create"))?;
    client.write(fd, &large).map_err(fail("write"))?;
    client.close(fd).map_err(fail("close"))?;
    println!(
        "wrote /demo/large.bin: {} MiB in {:.1} ms (striped over all servers in 1 MiB chunks)",
        large.len() >> 20,
        started.elapsed().as_secs_f64() * 1e3
    );
    for index in 0..100 {
        let fd = client.create(&format!("/demo/small.{index:04}"), 0o644).map_err(fail("create"))?;
        client.write(fd, format!("small file number {index}\n").as_bytes()).map_err(fail("write"))?;
        client.close(fd).map_err(fail("close"))?;
    }
    println!("wrote 100 small files /demo/small.0000 .. /demo/small.0099");

    step("read back and verify");
    let fd = client.open("/demo/large.bin", OpenFlags::READ, 0).map_err(fail("open"))?;
    let mut copy = vec![0u8; large.len()];
    let count = client.read(fd, &mut copy).map_err(fail("read"))?;
    client.close(fd).map_err(fail("close"))?;
    if count != large.len() || checksum(&copy) != checksum(&large) {
        bail!("the large file came back different");
    }
    println!("/demo/large.bin: {count} bytes, checksum {:016x} matches", checksum(&copy));

    step("rename, link and list");
    client.rename("/demo/large.bin", "/demo/renamed.bin").map_err(fail("rename"))?;
    client.symlink("renamed.bin", "/demo/link").map_err(fail("symlink"))?;
    println!("renamed large.bin -> renamed.bin; /demo/link -> {}", client.readlink("/demo/link").map_err(fail("readlink"))?);
    let listing = client.readdir("/demo").map_err(fail("readdir"))?;
    println!("/demo holds {} entries; the first ones:", listing.len());
    for entry in listing.iter().take(4) {
        println!("  {:>10}  {}", entry.stat.size, entry.name);
    }
    step("POSIX errors are errno values");
    println!("rmdir /demo        -> {}", client.rmdir("/demo").err().map(|errno| errno.to_string()).unwrap_or("ok".into()));
    println!(
        "open /demo/missing -> {}",
        client.open("/demo/missing", OpenFlags::READ, 0).err().map(|errno| errno.to_string()).unwrap_or("ok".into())
    );

    step("servers");
    crate::cluster::status(client);
    Ok(())
}

pub fn run(args: &DemoArgs) -> Result<()> {
    step(&format!("start a local cluster of {} servers", args.servers));
    let cluster_args = ClusterArgs {
        servers: args.servers,
        chunk_size: "1M".into(),
        store: "mem".into(),
        use_running: false,
        poll_us: 50,
        cache: Default::default(),
    };
    let cluster = BenchCluster::start(&cluster_args)?;
    println!("{}", cluster.describe());
    for (name, value) in cluster.environment() {
        if name != env::SECRET {
            println!("  {name}={value}");
        }
    }
    let servers = cluster.environment().into_iter().find(|(name, _)| *name == env::SERVER).map(|(_, value)| value).unwrap_or_default();
    let secret = cluster.environment().into_iter().find(|(name, _)| *name == env::SECRET).map(|(_, value)| value).unwrap_or_default();
    let client = Client::connect(ringfs_client::ClientConfig::new(servers.split(',').map(String::from).collect(), secret.into_bytes()))
        .context("cannot connect to the demo cluster")?;
    use_the_file_system(&client)?;

    step("IO500 with a 1 s stonewall: the same 12 phases on ringfs and on /dev/shm (2 processes)");
    let config = Io500Config { processes: 2, stonewall: Duration::from_secs(1), ..Io500Config::default() };
    ringfs_bench::warm_memory(2 << 30);
    let ringfs = run_io500(&TargetSpec::Ringfs, &cluster, &config)?;
    let baseline = run_io500(&TargetSpec::Posix(micro::default_baseline()), &BenchCluster::none(), &config)?;
    println!();
    print!("{}", io500::report::comparison(&ringfs, &baseline));
    println!(
        "IO500 score: ringfs {:.2}, {} {:.2} (a short stonewall, so IO500 would call both INVALID)",
        ringfs.score.total, baseline.target, baseline.score.total
    );

    step("stop the cluster");
    drop(client);
    drop(cluster);
    println!("servers stopped; all data of this job is gone.");
    Ok(())
}
