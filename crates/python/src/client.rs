//! The `Client` class: a connection to a ringfs file system, with its namespace calls.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use ringfs_client::{ClientConfig, OpenFlags};

use crate::errors::{connect_error, os_error, os_error2};
use crate::file::File;
use crate::stat_result::StatResult;

/// A connection to a ringfs file system (the native client: it talks to every server
/// directly). Thread-safe; every call releases the GIL while it waits for the servers.
///
/// Client(servers, secret, chunk_size=None, timeout_ms=None): `servers` is a list of
/// `host:port` addresses (any one of the cluster's), `secret` the job's secret.
/// Client.from_env() reads RINGFS_SERVER, RINGFS_SECRET, RINGFS_RUN_DIR, ... as
/// `eval "$(ringfs start)"` sets them.
#[pyclass(frozen, module = "ringfs._native")]
pub struct Client {
    pub(crate) inner: ringfs_client::Client,
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (servers, secret, chunk_size=None, timeout_ms=None, run_dir=None))]
    fn new(
        py: Python<'_>,
        servers: Vec<String>,
        secret: String,
        chunk_size: Option<u32>,
        timeout_ms: Option<u64>,
        run_dir: Option<std::path::PathBuf>,
    ) -> PyResult<Client> {
        let mut config = ClientConfig::new(servers, secret.into_bytes());
        if let Some(chunk_size) = chunk_size {
            config.chunk_size = chunk_size;
        }
        if let Some(timeout_ms) = timeout_ms {
            config.timeout = Duration::from_millis(timeout_ms.max(1));
        }
        if let Some(run_dir) = run_dir {
            config = config.with_run_dir(run_dir);
        }
        let inner = py.allow_threads(|| ringfs_client::Client::connect(config)).map_err(connect_error)?;
        Ok(Client { inner })
    }

    /// Connects with the configuration in the environment (RINGFS_SERVER or RINGFS_RUN_DIR,
    /// RINGFS_SECRET, RINGFS_CHUNK_SIZE, RINGFS_TIMEOUT_MS, ...).
    #[staticmethod]
    fn from_env(py: Python<'_>) -> PyResult<Client> {
        let inner = py.allow_threads(ringfs_client::Client::from_env).map_err(connect_error)?;
        Ok(Client { inner })
    }

    /// Opens `path` with POSIX `open(2)` flags (`os.O_*` values); `mode` gives the
    /// permissions of a new file. Returns a native `File`.
    #[pyo3(signature = (path, flags, mode=0o644))]
    fn open(&self, py: Python<'_>, path: &str, flags: i32, mode: u32) -> PyResult<File> {
        let client = &self.inner;
        let (fd, stat) =
            py.allow_threads(|| client.open_with_stat(path, OpenFlags::from_posix(flags), mode)).map_err(|errno| os_error(errno, path))?;
        Ok(File::new(client.clone(), fd, stat.chunk_size))
    }

    /// Attributes of `path` (symbolic links followed).
    fn stat(&self, py: Python<'_>, path: &str) -> PyResult<StatResult> {
        let client = &self.inner;
        py.allow_threads(|| client.stat(path)).map(StatResult::from).map_err(|errno| os_error(errno, path))
    }

    /// Attributes of `path` itself (a symbolic link is not followed).
    fn lstat(&self, py: Python<'_>, path: &str) -> PyResult<StatResult> {
        let client = &self.inner;
        py.allow_threads(|| client.lstat(path)).map(StatResult::from).map_err(|errno| os_error(errno, path))
    }

    /// The entries of directory `path` as `(name, StatResult)` pairs, in no particular order
    /// (one listing brings every entry's attributes).
    fn readdir(&self, py: Python<'_>, path: &str) -> PyResult<Vec<(String, StatResult)>> {
        let client = &self.inner;
        let entries = py.allow_threads(|| client.readdir(path)).map_err(|errno| os_error(errno, path))?;
        Ok(entries.into_iter().map(|entry| (entry.name, StatResult::from(entry.stat))).collect())
    }

    #[pyo3(signature = (path, mode=0o755))]
    fn mkdir(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        let client = &self.inner;
        py.allow_threads(|| client.mkdir(path, mode)).map_err(|errno| os_error(errno, path))
    }

    fn rmdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let client = &self.inner;
        py.allow_threads(|| client.rmdir(path)).map_err(|errno| os_error(errno, path))
    }

    /// Removes a file (not a directory).
    fn unlink(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let client = &self.inner;
        py.allow_threads(|| client.unlink(path)).map_err(|errno| os_error(errno, path))
    }

    /// Removes `path` and everything below it, on the servers (one call, not one per entry).
    fn remove_tree(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let client = &self.inner;
        py.allow_threads(|| client.remove_tree(path)).map_err(|errno| os_error(errno, path))
    }

    /// Renames `source` to `destination`, replacing a file (or an empty directory) there.
    fn rename(&self, py: Python<'_>, source: &str, destination: &str) -> PyResult<()> {
        let client = &self.inner;
        py.allow_threads(|| client.rename(source, destination)).map_err(|errno| os_error2(errno, source, destination))
    }

    fn truncate(&self, py: Python<'_>, path: &str, size: u64) -> PyResult<()> {
        let client = &self.inner;
        py.allow_threads(|| client.truncate(path, size)).map_err(|errno| os_error(errno, path))
    }

    /// Sets access and modification times (nanoseconds since the epoch; None: now).
    #[pyo3(signature = (path, atime_ns=None, mtime_ns=None))]
    fn utime(&self, py: Python<'_>, path: &str, atime_ns: Option<i64>, mtime_ns: Option<i64>) -> PyResult<()> {
        let client = &self.inner;
        let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0);
        let (atime_ns, mtime_ns) = (atime_ns.unwrap_or_else(now), mtime_ns.unwrap_or_else(now));
        py.allow_threads(|| client.utimens(path, Some(atime_ns), Some(mtime_ns))).map_err(|errno| os_error(errno, path))
    }

    fn symlink(&self, py: Python<'_>, target: &str, link_path: &str) -> PyResult<()> {
        let client = &self.inner;
        py.allow_threads(|| client.symlink(target, link_path)).map_err(|errno| os_error2(errno, target, link_path))
    }

    fn readlink(&self, py: Python<'_>, path: &str) -> PyResult<String> {
        let client = &self.inner;
        py.allow_threads(|| client.readlink(path)).map_err(|errno| os_error(errno, path))
    }

    /// Reads the whole file at `path` (or `length` bytes from `offset`) into new bytes.
    #[pyo3(signature = (path, offset=0, length=None))]
    fn read_range<'py>(&self, py: Python<'py>, path: &str, offset: u64, length: Option<u64>) -> PyResult<Bound<'py, PyBytes>> {
        let client = &self.inner;
        let path_error = |errno| os_error(errno, path);
        let (fd, stat) = py.allow_threads(|| client.open_with_stat(path, OpenFlags::READ, 0)).map_err(path_error)?;
        let available = stat.size.saturating_sub(offset);
        let len = length.map_or(available, |length| length.min(available));
        let len = usize::try_from(len).map_err(|_| path_error(ringfs_client::Errno::EFBIG))?;
        let mut filled = 0;
        let result = PyBytes::new_with(py, len, |bytes| {
            let read = py.allow_threads(|| crate::file::read_fully(client, fd, bytes, offset));
            filled = read.as_ref().copied().unwrap_or(0);
            read.map(drop).map_err(path_error)
        });
        let _ = py.allow_threads(|| client.close(fd));
        let bytes = result?;
        // The file shrank between the open and the read: return what is there.
        if filled < len { Ok(PyBytes::new(py, &bytes.as_bytes()[..filled])) } else { Ok(bytes) }
    }

    /// Cache mode: writes everything dirty back to the backend (a no-op without a backend).
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        let client = &self.inner;
        py.allow_threads(|| client.sync()).map_err(crate::errors::os_error_no_path)
    }

    /// Cache mode: loads `paths` (files or trees) from the backend into ringfs. Returns
    /// `(files, bytes, loaded_bytes)`.
    fn stagein(&self, py: Python<'_>, paths: Vec<String>) -> PyResult<(u64, u64, u64)> {
        let client = &self.inner;
        let summary = py.allow_threads(|| client.stagein(&paths, &mut |_, _| {})).map_err(crate::errors::os_error_no_path)?;
        Ok((summary.files, summary.bytes, summary.loaded_bytes))
    }

    /// `(capacity_bytes, used_bytes, entries, servers)` summed over the servers.
    fn usage(&self, py: Python<'_>) -> PyResult<(u64, u64, u64, u32)> {
        let client = &self.inner;
        let usage = py.allow_threads(|| client.usage()).map_err(crate::errors::os_error_no_path)?;
        Ok((usage.capacity_bytes, usage.used_bytes, usage.entries, usage.servers))
    }

    /// The servers this client follows, as `(name, address)` pairs.
    fn members(&self) -> Vec<(String, String)> {
        self.inner.members().members.into_iter().map(|member| (member.name, member.tcp_address)).collect()
    }
}
