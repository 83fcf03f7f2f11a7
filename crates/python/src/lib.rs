//! The ringfs Python binding: the `ringfs._native` extension module.
//!
//! It wraps the native client ([`ringfs_client::Client`]) for Python: a [`client::Client`] with
//! the namespace calls, an open [`file::File`] that reads into and writes from any Python buffer
//! without a copy, and [`cluster`] functions that start and stop a local cluster through
//! `ringfs-launch`. Every call that talks to the servers releases the GIL, so Python threads
//! run their I/O in parallel. Errors become `OSError` with the errno set (Python picks the
//! subclass: `FileNotFoundError` for `ENOENT`, ...).
//!
//! It holds no Python policy: the package `ringfs` (crates/python/python/ringfs) builds the
//! `io.RawIOBase` file objects, `open` modes, `walk`, `rmtree` and the fsspec file system on
//! top of it. Built with maturin (`pip install ./crates/python`); see README.md.
//!
//! ```python
//! from ringfs import _native
//! client = _native.Client.from_env()
//! file = client.open("/out.dat", _native.O_WRONLY | _native.O_CREAT, 0o644)
//! file.write(b"hello"); file.close()
//! assert client.stat("/out.dat").st_size == 5
//! ```

mod buffer;
mod client;
mod cluster;
mod errors;
mod file;
mod stat_result;

use pyo3::prelude::*;

#[pymodule]
#[pyo3(name = "_native")]
fn ringfs_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<client::Client>()?;
    module.add_class::<stat_result::StatResult>()?;
    module.add_class::<file::File>()?;
    module.add_function(wrap_pyfunction!(cluster::launch_local, module)?)?;
    module.add_function(wrap_pyfunction!(cluster::stop_cluster, module)?)?;
    for (name, value) in [
        ("O_RDONLY", libc_flags::O_RDONLY),
        ("O_WRONLY", libc_flags::O_WRONLY),
        ("O_RDWR", libc_flags::O_RDWR),
        ("O_CREAT", libc_flags::O_CREAT),
        ("O_EXCL", libc_flags::O_EXCL),
        ("O_TRUNC", libc_flags::O_TRUNC),
        ("O_APPEND", libc_flags::O_APPEND),
    ] {
        module.add(name, value)?;
    }
    module.add("DEFAULT_CHUNK_SIZE", ringfs_client::DEFAULT_CHUNK_SIZE)?;
    Ok(())
}

/// The POSIX `open(2)` flags [`client::Client::open`] takes (Linux values, as Python's `os`
/// module has them).
mod libc_flags {
    pub const O_RDONLY: i32 = 0;
    pub const O_WRONLY: i32 = 0o1;
    pub const O_RDWR: i32 = 0o2;
    pub const O_CREAT: i32 = 0o100;
    pub const O_EXCL: i32 = 0o200;
    pub const O_TRUNC: i32 = 0o1000;
    pub const O_APPEND: i32 = 0o2000;
}
