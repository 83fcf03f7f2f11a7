//! What a benchmark runs against: ringfs (through the native client) or a POSIX directory.
//!
//! Both targets offer the same few operations, so a workload is written once and every figure
//! can be compared with a baseline measured the same way in the same run.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ringfs_client::{Client, Fd, FindFilter, FindSummary, OpenFlags};
use ringfs_config::env;
use ringfs_proto::path::glob_match;

/// A file system to benchmark.
pub enum Target {
    Ringfs(Client),
    /// Paths are taken relative to this directory.
    Posix(PathBuf),
}

/// An open file of a [`Target`].
pub enum Handle {
    Ringfs(Client, Fd),
    Posix(File),
}

/// How to reach a target, as given on the command line: `ringfs`, `posix:DIR`, `fuse:DIR`
/// (a ringfs FUSE mount, used like any POSIX directory but labelled as ringfs), or
/// `preload:PREFIX` (ringfs shown under PREFIX by `libringfs_preload.so` in the worker
/// processes, which use plain libc file calls there; no mount).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetSpec {
    Ringfs,
    Posix(PathBuf),
    Fuse(PathBuf),
    Preload(PathBuf),
}

impl TargetSpec {
    pub fn parse(text: &str) -> Result<TargetSpec, String> {
        match text.split_once(':') {
            None if text == "ringfs" => Ok(TargetSpec::Ringfs),
            Some(("posix", dir)) if !dir.is_empty() => Ok(TargetSpec::Posix(PathBuf::from(dir))),
            Some(("fuse", dir)) if !dir.is_empty() => Ok(TargetSpec::Fuse(PathBuf::from(dir))),
            Some(("preload", prefix)) if prefix.starts_with('/') && prefix.len() > 1 => Ok(TargetSpec::Preload(PathBuf::from(prefix))),
            _ => Err(format!("invalid target {text:?}: expected ringfs, posix:DIR, fuse:DIR or preload:/PREFIX")),
        }
    }

    /// The text [`TargetSpec::parse`] reads back (for worker command lines).
    pub fn spec(&self) -> String {
        match self {
            TargetSpec::Ringfs => "ringfs".into(),
            TargetSpec::Posix(dir) => format!("posix:{}", dir.display()),
            TargetSpec::Fuse(dir) => format!("fuse:{}", dir.display()),
            TargetSpec::Preload(prefix) => format!("preload:{}", prefix.display()),
        }
    }

    /// Whether the target needs a ringfs cluster (started for the benchmark).
    pub fn needs_cluster(&self) -> bool {
        matches!(self, TargetSpec::Ringfs | TargetSpec::Preload(_))
    }

    /// What a worker process of this target needs in its environment beyond the cluster's
    /// `RINGFS_*` variables: for `preload:`, the library and its prefix.
    pub fn worker_environment(&self, executable: &Path) -> io::Result<Vec<(&'static str, String)>> {
        match self {
            TargetSpec::Preload(prefix) => {
                let library = preload_library(executable)?;
                Ok(vec![(env::MOUNT, prefix.display().to_string()), ("LD_PRELOAD", preload_list(&library))])
            }
            _ => Ok(Vec::new()),
        }
    }

    /// Short name for reports.
    pub fn label(&self) -> String {
        match self {
            TargetSpec::Fuse(_) => "ringfs-fuse".into(),
            TargetSpec::Preload(_) => "ringfs-preload".into(),
            other => other.spec(),
        }
    }

    /// Where `path` of the target is seen from this host: the ringfs path itself, or the
    /// local path inside the POSIX directory.
    pub fn outside_path(&self, path: &str) -> String {
        match self {
            TargetSpec::Ringfs => path.to_string(),
            TargetSpec::Posix(dir) | TargetSpec::Fuse(dir) | TargetSpec::Preload(dir) => {
                dir.join(path.trim_start_matches('/')).display().to_string()
            }
        }
    }

    /// Connects (ringfs: with the RINGFS_* environment).
    pub fn connect(&self) -> io::Result<Target> {
        match self {
            TargetSpec::Ringfs => Client::from_env().map(Target::Ringfs).map_err(|error| io::Error::other(error.to_string())),
            // Under the preload library, the prefix is an ordinary directory to this process.
            TargetSpec::Posix(dir) | TargetSpec::Fuse(dir) | TargetSpec::Preload(dir) => Ok(Target::Posix(dir.clone())),
        }
    }
}

/// The file name of the LD_PRELOAD library.
pub const PRELOAD_LIBRARY: &str = "libringfs_preload.so";

/// Where the preload library is: beside `executable` (the ringfs binary: `target/release`
/// holds both), or in `../lib` from it (an installation).
pub fn preload_library(executable: &Path) -> io::Result<PathBuf> {
    let directory = executable.parent().ok_or_else(|| io::Error::other("the ringfs executable has no directory"))?;
    [directory.join(PRELOAD_LIBRARY), directory.join("../lib").join(PRELOAD_LIBRARY)]
        .into_iter()
        .find(|candidate| candidate.exists())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{PRELOAD_LIBRARY} is neither beside {} nor in ../lib (build it: cargo build --release -p ringfs-preload)",
                    executable.display()
                ),
            )
        })
}

/// `LD_PRELOAD` with `library` first, keeping what this process's environment preloads.
pub fn preload_list(library: &Path) -> String {
    match std::env::var("LD_PRELOAD").ok().filter(|existing| !existing.is_empty()) {
        Some(existing) => format!("{}:{existing}", library.display()),
        None => library.display().to_string(),
    }
}

impl Target {
    fn local(&self, path: &str) -> PathBuf {
        match self {
            Target::Posix(root) => root.join(path.trim_start_matches('/')),
            Target::Ringfs(_) => unreachable!("only POSIX paths are local"),
        }
    }

    /// Creates a directory; an existing one is fine.
    pub fn mkdir(&self, path: &str) -> io::Result<()> {
        let result = match self {
            Target::Ringfs(client) => client.mkdir(path, 0o755).map_err(io::Error::from),
            Target::Posix(_) => std::fs::create_dir(self.local(path)),
        };
        match result {
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            other => other,
        }
    }

    pub fn rmdir(&self, path: &str) -> io::Result<()> {
        match self {
            Target::Ringfs(client) => client.rmdir(path).map_err(io::Error::from),
            Target::Posix(_) => std::fs::remove_dir(self.local(path)),
        }
    }

    /// Removes `path` and everything below it.
    pub fn remove_tree(&self, path: &str) -> io::Result<()> {
        match self {
            Target::Ringfs(client) => client.remove_tree(path).map_err(io::Error::from),
            Target::Posix(_) => std::fs::remove_dir_all(self.local(path)),
        }
    }

    /// Creates (truncating) a file for writing.
    pub fn create(&self, path: &str) -> io::Result<Handle> {
        match self {
            Target::Ringfs(client) => client.create(path, 0o644).map(|fd| Handle::Ringfs(client.clone(), fd)).map_err(io::Error::from),
            Target::Posix(_) => {
                OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(self.local(path)).map(Handle::Posix)
            }
        }
    }

    /// Creates an empty file exclusively and closes it.
    pub fn create_empty(&self, path: &str) -> io::Result<()> {
        match self {
            Target::Ringfs(client) => {
                let fd = client.open(path, OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::EXCLUSIVE, 0o644)?;
                client.close(fd).map_err(io::Error::from)
            }
            Target::Posix(_) => OpenOptions::new().write(true).create_new(true).mode(0o644).open(self.local(path)).map(drop),
        }
    }

    pub fn open_read(&self, path: &str) -> io::Result<Handle> {
        match self {
            Target::Ringfs(client) => {
                client.open(path, OpenFlags::READ, 0).map(|fd| Handle::Ringfs(client.clone(), fd)).map_err(io::Error::from)
            }
            Target::Posix(_) => File::open(self.local(path)).map(Handle::Posix),
        }
    }

    /// Opens an existing file for writing (without truncating it).
    pub fn open_write(&self, path: &str) -> io::Result<Handle> {
        match self {
            Target::Ringfs(client) => {
                client.open(path, OpenFlags::WRITE, 0).map(|fd| Handle::Ringfs(client.clone(), fd)).map_err(io::Error::from)
            }
            Target::Posix(_) => OpenOptions::new().write(true).open(self.local(path)).map(Handle::Posix),
        }
    }

    /// Makes everything written so far durable, like `sync(1)`. ringfs keeps data in its
    /// servers' stores, which a write reaches before it returns: nothing more to do.
    pub fn sync_all(&self) {
        if let Target::Posix(_) = self {
            // SAFETY: sync(2) takes no arguments and cannot fail.
            unsafe { libc::sync() };
        }
    }

    /// Counts the entries below `root` and those matching `filter`, like `find`. ringfs lets
    /// every server filter its own entries; a POSIX directory is walked by this process.
    pub fn find(&self, root: &str, filter: &FindFilter) -> io::Result<FindSummary> {
        match self {
            Target::Ringfs(client) => client.find(root, filter).map_err(io::Error::from),
            Target::Posix(_) => {
                let mut summary = FindSummary::default();
                walk(&self.local(root), filter, &mut summary)?;
                Ok(summary)
            }
        }
    }

    /// Size of a file.
    pub fn size(&self, path: &str) -> io::Result<u64> {
        match self {
            Target::Ringfs(client) => client.stat(path).map(|stat| stat.size).map_err(io::Error::from),
            Target::Posix(_) => std::fs::metadata(self.local(path)).map(|metadata| metadata.len()),
        }
    }

    pub fn unlink(&self, path: &str) -> io::Result<()> {
        match self {
            Target::Ringfs(client) => client.unlink(path).map_err(io::Error::from),
            Target::Posix(_) => std::fs::remove_file(self.local(path)),
        }
    }
}

/// `find` over a local directory tree (symbolic links are not followed).
fn walk(dir: &std::path::Path, filter: &FindFilter, summary: &mut FindSummary) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        summary.scanned += 1;
        let file_type = entry.file_type()?;
        let name = entry.file_name();
        let name_matches = filter.name.as_deref().is_none_or(|pattern| glob_match(pattern, &name.to_string_lossy()));
        if name_matches {
            let metadata = entry.metadata()?;
            let mtime_ns = metadata.mtime() * 1_000_000_000 + metadata.mtime_nsec();
            let newer = filter.newer_than_ns.is_none_or(|time| mtime_ns > time);
            let sized = filter.size.is_none_or(|size| metadata.len() == size);
            summary.matched += u64::from(newer && sized);
        }
        if file_type.is_dir() {
            walk(&entry.path(), filter, summary)?;
        }
    }
    Ok(())
}

impl Handle {
    pub fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        match self {
            Handle::Ringfs(client, fd) => client.pwrite(*fd, bytes, offset).map(drop).map_err(io::Error::from),
            Handle::Posix(file) => file.write_all_at(bytes, offset),
        }
    }

    /// Reads up to `buffer.len()` bytes at `offset`; returns how many.
    pub fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<usize> {
        match self {
            Handle::Ringfs(client, fd) => client.pread(*fd, buffer, offset).map_err(io::Error::from),
            Handle::Posix(file) => {
                let mut done = 0;
                while done < buffer.len() {
                    match file.read_at(&mut buffer[done..], offset + done as u64)? {
                        0 => break,
                        count => done += count,
                    }
                }
                Ok(done)
            }
        }
    }

    pub fn fsync(&self) -> io::Result<()> {
        match self {
            Handle::Ringfs(client, fd) => client.fsync(*fd).map_err(io::Error::from),
            Handle::Posix(file) => file.sync_all(),
        }
    }

    pub fn close(self) -> io::Result<()> {
        match self {
            Handle::Ringfs(client, fd) => client.close(fd).map_err(io::Error::from),
            Handle::Posix(file) => {
                drop(file);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!(TargetSpec::parse("ringfs"), Ok(TargetSpec::Ringfs));
        assert_eq!(TargetSpec::parse("posix:/dev/shm"), Ok(TargetSpec::Posix("/dev/shm".into())));
        assert_eq!(TargetSpec::parse("fuse:/mnt"), Ok(TargetSpec::Fuse("/mnt".into())));
        assert!(TargetSpec::parse("posix:").is_err());
        assert_eq!(TargetSpec::parse("preload:/ringfs"), Ok(TargetSpec::Preload("/ringfs".into())));
        assert!(TargetSpec::parse("preload:relative").is_err(), "the prefix is absolute");
        assert!(TargetSpec::parse("preload:/").is_err(), "the prefix is not the root");
        assert!(TargetSpec::parse("nfs").is_err());
    }

    #[test]
    fn posix_target_round_trips_a_file() {
        let dir = std::env::temp_dir().join(format!("ringfs-bench-target-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = Target::Posix(dir.clone());
        target.mkdir("/sub").unwrap();
        target.mkdir("/sub").unwrap();
        let handle = target.create("/sub/f").unwrap();
        handle.write_at(b"hello", 3).unwrap();
        handle.close().unwrap();
        assert_eq!(target.size("/sub/f").unwrap(), 8);
        let mut buffer = [0u8; 16];
        assert_eq!(target.open_read("/sub/f").unwrap().read_at(&mut buffer, 0).unwrap(), 8);
        assert_eq!(&buffer[3..8], b"hello");
        target.unlink("/sub/f").unwrap();
        target.rmdir("/sub").unwrap();
        target.mkdir("/tree").unwrap();
        target.mkdir("/tree/deeper").unwrap();
        target.create("/tree/deeper/file").unwrap().close().unwrap();
        target.remove_tree("/tree").unwrap();
        assert!(!dir.join("tree").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
