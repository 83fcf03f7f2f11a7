//! The native `File`: one open ringfs file, read into and written from Python buffers in place.

use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::prelude::*;
use ringfs_client::{Errno, Fd};

use crate::buffer::ContiguousBuffer;
use crate::errors::os_error_no_path;
use crate::stat_result::StatResult;

/// An open ringfs file (made by `Client.open`). `ringfs.RawFile` wraps it as an
/// `io.RawIOBase`; use that unless you need positioned I/O only.
///
/// `readinto`/`write` use and move the file's position; `readinto_at`/`write_at` take an
/// offset and leave it alone, so threads may share one `File`. All of them release the GIL and
/// take any object with the buffer protocol (bytes, bytearray, memoryview, NumPy arrays, mmap),
/// whose memory is read into or written from directly.
#[pyclass(frozen, module = "ringfs._native")]
pub struct File {
    client: ringfs_client::Client,
    fd: Fd,
    chunk_size: u32,
    closed: AtomicBool,
}

impl File {
    pub fn new(client: ringfs_client::Client, fd: Fd, chunk_size: u32) -> File {
        File { client, fd, chunk_size, closed: AtomicBool::new(false) }
    }

    fn open_fd(&self) -> PyResult<Fd> {
        if self.closed.load(Ordering::Acquire) {
            Err(pyo3::exceptions::PyValueError::new_err("I/O operation on closed file"))
        } else {
            Ok(self.fd)
        }
    }
}

/// Reads until `buffer` is full or the file ends (a positioned read may return less than asked
/// at a chunk server's page limit); returns the bytes read.
pub fn read_fully(client: &ringfs_client::Client, fd: Fd, buffer: &mut [u8], offset: u64) -> Result<usize, Errno> {
    let mut filled = 0;
    while filled < buffer.len() {
        match client.pread(fd, &mut buffer[filled..], offset + filled as u64)? {
            0 => break,
            read => filled += read,
        }
    }
    Ok(filled)
}

#[pymethods]
impl File {
    /// Reads at the file position into `buffer`, moving the position; returns the bytes read
    /// (0 at the end of the file).
    fn readinto(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<usize> {
        let fd = self.open_fd()?;
        let view = ContiguousBuffer::get(buffer, true)?;
        let raw = view.raw();
        let client = &self.client;
        // SAFETY: `view` holds the buffer until after the closure returns.
        py.allow_threads(|| client.read(fd, unsafe { raw.as_mut_slice() })).map_err(os_error_no_path)
    }

    /// Fills `buffer` from `offset` (or up to the end of the file); returns the bytes read.
    /// The file position stays.
    fn readinto_at(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>, offset: u64) -> PyResult<usize> {
        let fd = self.open_fd()?;
        let view = ContiguousBuffer::get(buffer, true)?;
        let raw = view.raw();
        let client = &self.client;
        // SAFETY: `view` holds the buffer until after the closure returns.
        py.allow_threads(|| read_fully(client, fd, unsafe { raw.as_mut_slice() }, offset)).map_err(os_error_no_path)
    }

    /// Writes all of `data` at the file position (at the end in append mode), moving it;
    /// returns the bytes written.
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        let fd = self.open_fd()?;
        let view = ContiguousBuffer::get(data, false)?;
        let raw = view.raw();
        let client = &self.client;
        // SAFETY: `view` holds the buffer until after the closure returns.
        py.allow_threads(|| client.write(fd, unsafe { raw.as_slice() })).map_err(os_error_no_path)
    }

    /// Writes all of `data` at `offset`; the file position stays.
    fn write_at(&self, py: Python<'_>, data: &Bound<'_, PyAny>, offset: u64) -> PyResult<usize> {
        let fd = self.open_fd()?;
        let view = ContiguousBuffer::get(data, false)?;
        let raw = view.raw();
        let client = &self.client;
        // SAFETY: `view` holds the buffer until after the closure returns.
        py.allow_threads(|| client.pwrite(fd, unsafe { raw.as_slice() }, offset)).map_err(os_error_no_path)
    }

    /// Moves the position like `os.lseek` (`whence` 0: from the start, 1: from here, 2: from
    /// the end); returns the new position.
    #[pyo3(signature = (offset, whence=0))]
    fn seek(&self, py: Python<'_>, offset: i64, whence: i32) -> PyResult<u64> {
        let fd = self.open_fd()?;
        let to = match whence {
            0 => std::io::SeekFrom::Start(u64::try_from(offset).map_err(|_| os_error_no_path(Errno::EINVAL))?),
            1 => std::io::SeekFrom::Current(offset),
            2 => std::io::SeekFrom::End(offset),
            _ => return Err(pyo3::exceptions::PyValueError::new_err(format!("invalid whence ({whence}, should be 0, 1 or 2)"))),
        };
        let client = &self.client;
        py.allow_threads(|| client.seek(fd, to)).map_err(os_error_no_path)
    }

    /// The attributes of the open file.
    fn fstat(&self, py: Python<'_>) -> PyResult<StatResult> {
        let fd = self.open_fd()?;
        let client = &self.client;
        py.allow_threads(|| client.fstat(fd)).map(Into::into).map_err(os_error_no_path)
    }

    /// Cuts or extends the file to `size` bytes.
    fn truncate(&self, py: Python<'_>, size: u64) -> PyResult<()> {
        let fd = self.open_fd()?;
        let client = &self.client;
        py.allow_threads(|| client.ftruncate(fd, size)).map_err(os_error_no_path)
    }

    /// Makes the file's data durable on its servers.
    fn fsync(&self, py: Python<'_>) -> PyResult<()> {
        let fd = self.open_fd()?;
        let client = &self.client;
        py.allow_threads(|| client.fsync(fd)).map_err(os_error_no_path)
    }

    /// The file's chunk size: reads and writes of whole chunks go fastest.
    #[getter]
    fn chunk_size(&self) -> u32 {
        self.chunk_size
    }

    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Closes the file (again: nothing happens).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let client = &self.client;
        py.allow_threads(|| client.close(self.fd)).map_err(os_error_no_path)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            let _ = self.client.close(self.fd);
        }
    }
}
