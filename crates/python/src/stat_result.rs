//! The `StatResult` class: a file's attributes as `Client.stat`, `Client.readdir` and
//! `File.fstat` return them (its own module, so that `client` and `file` both use it and
//! neither uses the other for it).

use pyo3::prelude::*;
use ringfs_client::Stat;

/// The attributes of a file, with the field names of `os.stat_result`.
#[pyclass(frozen, module = "ringfs._native", get_all)]
#[derive(Clone)]
pub struct StatResult {
    pub st_mode: u32,
    pub st_ino: u64,
    pub st_nlink: u32,
    pub st_uid: u32,
    pub st_gid: u32,
    pub st_size: u64,
    pub st_atime_ns: i64,
    pub st_mtime_ns: i64,
    pub st_ctime_ns: i64,
    /// The file's chunk size: the unit reads and writes are cut in.
    pub st_blksize: u32,
    pub st_blocks: u64,
    pub st_rdev: u64,
}

impl From<Stat> for StatResult {
    fn from(stat: Stat) -> StatResult {
        StatResult {
            st_mode: stat.mode,
            st_ino: stat.ino,
            st_nlink: stat.nlink,
            st_uid: stat.uid,
            st_gid: stat.gid,
            st_size: stat.size,
            st_atime_ns: stat.atime_ns,
            st_mtime_ns: stat.mtime_ns,
            st_ctime_ns: stat.ctime_ns,
            st_blksize: stat.chunk_size,
            st_blocks: stat.blocks(),
            st_rdev: stat.rdev,
        }
    }
}

const S_IFMT: u32 = 0o170000;

#[pymethods]
impl StatResult {
    #[getter]
    fn st_atime(&self) -> f64 {
        self.st_atime_ns as f64 / 1e9
    }

    #[getter]
    fn st_mtime(&self) -> f64 {
        self.st_mtime_ns as f64 / 1e9
    }

    #[getter]
    fn st_ctime(&self) -> f64 {
        self.st_ctime_ns as f64 / 1e9
    }

    fn is_dir(&self) -> bool {
        self.st_mode & S_IFMT == 0o040000
    }

    fn is_file(&self) -> bool {
        self.st_mode & S_IFMT == 0o100000
    }

    fn is_symlink(&self) -> bool {
        self.st_mode & S_IFMT == 0o120000
    }

    fn __repr__(&self) -> String {
        format!(
            "ringfs.StatResult(st_mode={:#o}, st_ino={}, st_nlink={}, st_uid={}, st_gid={}, st_size={}, st_mtime_ns={}, st_blksize={})",
            self.st_mode, self.st_ino, self.st_nlink, self.st_uid, self.st_gid, self.st_size, self.st_mtime_ns, self.st_blksize
        )
    }
}
