//! `ringfs sync` and `ringfs stagein`: the cache-mode commands.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use ringfs_client::{CacheStats, Client};

/// The backend directory and mount path of the cluster, from any server's counters.
fn cache_of(client: &Client) -> Result<CacheStats> {
    let stats = client.server_stats().map_err(|errno| anyhow::anyhow!("cannot reach the servers: {errno}"))?;
    stats
        .into_iter()
        .find_map(|stats| stats.cache.map(|cache| *cache))
        .context("this cluster caches no backend (start it with --backend DIR)")
}

/// Writes everything dirty to the backend, reporting what is left once a second.
pub fn sync(client: &Client) -> Result<()> {
    let started = Instant::now();
    let interactive = std::io::stderr().is_terminal();
    client
        .sync_with_progress(&mut |remaining| {
            if interactive && remaining > 0 {
                eprint!("\rsyncing: {remaining} chunks and entries left   ");
            }
        })
        .map_err(|errno| anyhow::anyhow!("sync failed: {errno}"))?;
    if interactive {
        eprintln!("\rsynced in {:.1} s                              ", started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// The ringfs path of a stage-in argument: a ringfs path, or a path inside the backend
/// directory (as users know their files on the parallel file system).
fn ringfs_path(argument: &str, cache: &CacheStats) -> Result<String> {
    let backend = Path::new(&cache.backend);
    let local = Path::new(argument);
    let absolute = if local.is_absolute() { local.to_path_buf() } else { std::env::current_dir()?.join(local) };
    if let Ok(relative) = absolute.strip_prefix(backend) {
        let relative = relative.to_str().with_context(|| format!("{argument} is not UTF-8"))?;
        return Ok(ringfs_proto::path::join(&cache.mount_path, relative));
    }
    if local.is_absolute() && argument.starts_with(&cache.mount_path) {
        return Ok(argument.to_string());
    }
    bail!("{argument} is neither in the backend {} nor in ringfs under {}", cache.backend, cache.mount_path)
}

/// A progress bar on standard error: `[#####.....] 512 MiB / 1.0 GiB  310 MiB/s`.
fn draw_progress(done: u64, total: u64, started: Instant) {
    const WIDTH: usize = 30;
    let filled = if total == 0 { WIDTH } else { (done as f64 / total as f64 * WIDTH as f64) as usize };
    let rate = done as f64 / started.elapsed().as_secs_f64().max(1e-3) / (1 << 20) as f64;
    eprint!(
        "\r[{}{}] {:.1} / {:.1} MiB  {:.0} MiB/s ",
        "#".repeat(filled.min(WIDTH)),
        ".".repeat(WIDTH - filled.min(WIDTH)),
        done as f64 / (1 << 20) as f64,
        total as f64 / (1 << 20) as f64,
        rate
    );
    let _ = std::io::stderr().flush();
}

/// Loads backend files into ringfs.
pub fn stagein(client: &Client, arguments: &[String]) -> Result<()> {
    let cache = cache_of(client)?;
    let paths = arguments.iter().map(|argument| ringfs_path(argument, &cache)).collect::<Result<Vec<_>>>()?;
    let started = Instant::now();
    let interactive = std::io::stderr().is_terminal();
    let summary = client
        .stagein(&paths, &mut |done, total| {
            if interactive {
                draw_progress(done, total, started);
            }
        })
        .map_err(|errno| anyhow::anyhow!("stage-in failed: {errno}"))?;
    if interactive {
        eprintln!();
    }
    println!(
        "staged in {} files, {} bytes ({} read from the backend) in {:.2} s",
        summary.files,
        summary.bytes,
        summary.loaded_bytes,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The cache columns of `ringfs status` for one server.
pub fn status_line(cache: &CacheStats) -> String {
    format!(
        "  cache {} policy {}: dirty {} chunks / {} bytes, {} entry changes pending; flushed {} chunks / {} bytes{}; loaded {}, evicted {}, written through {} bytes",
        cache.backend,
        cache.policy,
        cache.dirty_chunks,
        cache.dirty_bytes,
        cache.pending_entries,
        cache.flushed_chunks,
        cache.flushed_bytes,
        if cache.flushing { " (flushing now)" } else { "" },
        cache.loaded_chunks,
        cache.evicted_chunks,
        cache.written_through_bytes
    )
}
