//! Starting and stopping a local cluster from Python (`ringfs.Cluster`), through ringfs-launch.

use std::path::PathBuf;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use ringfs_launch::{LaunchCache, LaunchConfig};

/// Starts `servers` local servers running `executable` (the `ringfs` program) and waits until
/// all have joined. `store` is `mem` or `dir:PATH`; `backend` (a directory) turns on cache
/// mode, shown at `mount_path`. Returns the client environment as a dict (RINGFS_SERVER,
/// RINGFS_SECRET, RINGFS_RUN_DIR, RINGFS_CHUNK_SIZE).
// Python keyword arguments, each with its default: a struct would only move the list.
#[allow(clippy::too_many_arguments)]
#[pyfunction]
#[pyo3(signature = (executable, servers=2, store="mem".to_string(), chunk_size=None, run_dir=None, backend=None, mount_path="/".to_string()))]
pub fn launch_local(
    py: Python<'_>,
    executable: PathBuf,
    servers: usize,
    store: String,
    chunk_size: Option<u32>,
    run_dir: Option<PathBuf>,
    backend: Option<PathBuf>,
    mount_path: String,
) -> PyResult<Vec<(String, String)>> {
    let mut config = LaunchConfig::local(servers, executable);
    config.store = store;
    if let Some(chunk_size) = chunk_size {
        config.chunk_size = chunk_size;
    }
    config.run_dir = run_dir;
    config.cache = backend.map(|backend| LaunchCache { backend, mount_path, flush: "io-aware".into(), flush_idle_ms: 1000 });
    let cluster = py.allow_threads(|| ringfs_launch::start(&config)).map_err(|error| PyRuntimeError::new_err(error.to_string()))?;
    Ok(cluster.environment().into_iter().map(|(name, value)| (name.to_string(), value)).collect())
}

/// Stops the cluster of `run_dir` (flushing to the backend in cache mode) and removes the run
/// directory unless `keep`.
#[pyfunction]
#[pyo3(signature = (run_dir, keep=false))]
pub fn stop_cluster(py: Python<'_>, run_dir: PathBuf, keep: bool) -> PyResult<()> {
    let options = ringfs_launch::StopOptions { keep, ..Default::default() };
    py.allow_threads(|| ringfs_launch::stop(&run_dir, options)).map_err(|error| PyRuntimeError::new_err(error.to_string()))
}
