//! The ringfs client library: a POSIX-like file API over the chunk servers.
//!
//! A [`Client`] fetches the member list from any server, computes for every chunk the server
//! that owns it (the same placement the servers use), and talks to each server directly. It
//! keeps an fd table, cuts reads and writes at chunk boundaries and sends all chunk requests of
//! one call at once, derives file sizes from the chunks, and reports failures as [`Errno`]
//! values (a dead or silent server gives `EIO` within the request deadline).
//!
//! The API is blocking and thread-safe: `Client` is cheap to clone and every method may be
//! called from any thread. (Measured on this class of machine, a blocking call costs a fifth
//! of an async round trip; see docs/ARCHITECTURE.md.)
//!
//! On the same host as a server, bulk bytes skip the socket: the server copies write data
//! straight out of this process, and reads copy leased server memory straight into the
//! caller's buffer (cross-memory attach).
//!
//! ```no_run
//! use ringfs_client::{Client, ClientConfig, OpenFlags};
//! let client = Client::connect(ClientConfig::from_env().unwrap()).unwrap();
//! let fd = client.open("/results/out.dat", OpenFlags::WRITE | OpenFlags::CREATE, 0o644).unwrap();
//! client.write(fd, b"hello").unwrap();
//! client.close(fd).unwrap();
//! assert_eq!(client.stat("/results/out.dat").unwrap().size, 5);
//! ```

mod cache;
mod changes;
mod chunking;
mod closes;
mod cluster;
mod connection_table;
mod files;
mod links;
mod locks;
mod namespace;
mod raw;
pub mod run_dir;
mod xattr;

pub use cache::StageInSummary;
pub use changes::{ChangeWatch, Changes};
pub use links::{LEADS_OUT, LinkDestination, link_destination};
pub use locks::{LockConflict, LockRange, WaitEnds, lock_kind_of};
pub use namespace::RenameFlags;
pub use ringfs_proto::{CacheStats, Errno, FileId, FileKind, FindFilter, LockKind, MemberList, NameMove, ServerStats, XattrFlags};
pub use ringfs_rpc::abandon::{on_behalf_of, releasing_for};

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ringfs_proto::{Attr, Request};
use ringfs_rpc::ConnectionConfig;
use thiserror::Error;

use crate::cluster::Cluster;
use crate::files::FileTable;
use ringfs_config::env;

/// Result of a file-system operation.
pub type Result<T> = std::result::Result<T, Errno>;

/// Default chunk size of new files: 1 MiB (docs/PERFORMANCE.md shows why).
pub const DEFAULT_CHUNK_SIZE: u32 = 1 << 20;
/// Default request deadline.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// By default a connection to a server unused this long is closed (and opened again when
/// needed), unless the process has files open.
pub const DEFAULT_IDLE_CLOSE: Duration = Duration::from_secs(60);

/// How to reach the file system. Built by hand or from the environment ([`ClientConfig::from_env`]).
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Server addresses (`host:port` or `unix:/path`); the first reachable one gives the member list.
    pub servers: Vec<String>,
    /// The job's secret.
    pub secret: Vec<u8>,
    /// Deadline of every request: a server that does not answer in time yields `EIO`.
    pub timeout: Duration,
    /// Chunk size of files this client creates.
    pub chunk_size: u32,
    /// Use Unix sockets and cross-memory attach for servers on this host.
    pub local_fast_path: bool,
    /// How long to poll for a response before sleeping (zero: never).
    pub poll: Duration,
    /// The cluster's run directory, if known: where to find servers again when none of the
    /// known addresses answers (a server restarted on a new port; see [`run_dir`]).
    pub run_dir: Option<std::path::PathBuf>,
    /// A connection to a server unused this long is closed, and opened again by the next
    /// request to that server, while the process has no file open (`None`: never).
    pub idle_close: Option<Duration>,
    /// Where the process sees ringfs (the LD_PRELOAD library's prefix): symbolic links are
    /// resolved as a mount there would resolve them (see [`links`]). `None`: ringfs is the
    /// whole tree, and an absolute target is a ringfs path.
    pub mounted_at: Option<String>,
}

impl ClientConfig {
    pub fn new(servers: Vec<String>, secret: Vec<u8>) -> ClientConfig {
        ClientConfig {
            servers,
            secret,
            timeout: DEFAULT_TIMEOUT,
            chunk_size: DEFAULT_CHUNK_SIZE,
            local_fast_path: true,
            poll: ringfs_rpc::DEFAULT_POLL,
            run_dir: None,
            idle_close: Some(DEFAULT_IDLE_CLOSE),
            mounted_at: None,
        }
    }

    /// Reads `RINGFS_SERVER` (comma-separated addresses) and/or `RINGFS_RUN_DIR` (the
    /// cluster's run directory, whose recorded addresses come first), `RINGFS_SECRET`
    /// (default: the run directory's secret), `RINGFS_TIMEOUT_MS`, `RINGFS_CHUNK_SIZE`,
    /// `RINGFS_LOCAL` (0 disables the same-host fast path), `RINGFS_POLL_US` (poll
    /// budget, 0 disables) and `RINGFS_IDLE_CLOSE_S` (idle connections closed after this
    /// many seconds, 0: never) — `ringfs start` prints the first ones.
    pub fn from_env() -> std::result::Result<ClientConfig, ConnectError> {
        let servers = std::env::var(env::SERVER).ok();
        if servers.is_none() && std::env::var_os(env::RUN_DIR).is_none() {
            return Err(ConnectError::Config(format!("{} is not set (run: eval \"$(ringfs start)\")", env::SERVER)));
        }
        ClientConfig::new(split_servers(servers.as_deref().unwrap_or("")), Vec::new()).with_environment()
    }

    /// Applies `RINGFS_RUN_DIR`, `RINGFS_SECRET`, `RINGFS_TIMEOUT_MS`, `RINGFS_CHUNK_SIZE`,
    /// `RINGFS_LOCAL`, `RINGFS_POLL_US` and `RINGFS_IDLE_CLOSE_S` from the environment to
    /// this configuration.
    pub fn with_environment(mut self) -> std::result::Result<ClientConfig, ConnectError> {
        if let Ok(secret) = std::env::var(env::SECRET) {
            self.secret = secret.into_bytes();
        }
        // (After the secret: the run directory's is read only if none is set.)
        if let Some(dir) = std::env::var_os(env::RUN_DIR).filter(|dir| !dir.is_empty()) {
            self = self.with_run_dir(std::path::PathBuf::from(dir));
        }
        if let Ok(text) = std::env::var(env::TIMEOUT_MS) {
            let millis: u64 = text.parse().map_err(|_| ConnectError::Config(format!("{}={text:?} is not a number", env::TIMEOUT_MS)))?;
            self.timeout = Duration::from_millis(millis.max(1));
        }
        if let Ok(text) = std::env::var(env::CHUNK_SIZE) {
            self.chunk_size =
                parse_size(&text).ok_or_else(|| ConnectError::Config(format!("{}={text:?} is not a size", env::CHUNK_SIZE)))?;
        }
        if let Ok(text) = std::env::var(env::LOCAL) {
            self.local_fast_path = text != "0";
        }
        if let Ok(text) = std::env::var(env::POLL_US) {
            let micros: u64 = text.parse().map_err(|_| ConnectError::Config(format!("{}={text:?} is not a number", env::POLL_US)))?;
            self.poll = Duration::from_micros(micros);
        }
        if let Ok(text) = std::env::var(env::IDLE_CLOSE_S) {
            let seconds: u64 = text.parse().map_err(|_| ConnectError::Config(format!("{}={text:?} is not a number", env::IDLE_CLOSE_S)))?;
            self.idle_close = (seconds > 0).then(|| Duration::from_secs(seconds));
        }
        Ok(self)
    }
}

impl ClientConfig {
    /// Uses the cluster's run directory: its secret unless one is set, and its recorded
    /// server addresses (they follow restarts) — at once if no address is given, otherwise
    /// only when none of the given ones answers. (Every process of a job has the directory
    /// in its environment; on a hostfile cluster it is in `$HOME`, often a shared file
    /// system, where each process reading every server's address file at its start made a
    /// storm of opens.)
    pub fn with_run_dir(mut self, dir: std::path::PathBuf) -> ClientConfig {
        if self.servers.is_empty() {
            self.servers = run_dir::addresses(&dir);
        }
        if self.secret.is_empty()
            && let Ok(secret) = std::fs::read_to_string(dir.join("secret"))
        {
            self.secret = secret.trim().as_bytes().to_vec();
        }
        self.run_dir = Some(dir);
        self
    }
}

/// Splits a comma-separated list of server addresses.
pub fn split_servers(text: &str) -> Vec<String> {
    text.split(',').map(str::trim).filter(|server| !server.is_empty()).map(String::from).collect()
}

/// Parses a chunk size such as `65536`, `64K`, `1M`, `4MiB` ([`ringfs_config::ByteSize`]):
/// not 0, and small enough for a `u32`.
pub fn parse_size(text: &str) -> Option<u32> {
    text.parse::<ringfs_config::ByteSize>().ok()?.as_u32().filter(|size| *size > 0)
}

/// Why a client could not start.
#[derive(Debug, Error)]
pub enum ConnectError {
    #[error("{0}")]
    Config(String),
    #[error("no ringfs server reachable: {0}")]
    Unreachable(String),
    #[error("the server refused the connection: {0} (is RINGFS_SECRET right?)")]
    Refused(Errno),
}

/// An open file, as returned by [`Client::open`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fd(pub u32);

/// Flags of [`Client::open`] (combine with `|`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct OpenFlags(u32);

impl OpenFlags {
    pub const READ: OpenFlags = OpenFlags(1);
    pub const WRITE: OpenFlags = OpenFlags(2);
    pub const CREATE: OpenFlags = OpenFlags(4);
    pub const EXCLUSIVE: OpenFlags = OpenFlags(8);
    pub const TRUNCATE: OpenFlags = OpenFlags(16);
    pub const APPEND: OpenFlags = OpenFlags(32);

    pub fn contains(self, other: OpenFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Converts POSIX `open(2)` flags (`O_RDONLY`, `O_CREAT`, ...).
    pub fn from_posix(flags: i32) -> OpenFlags {
        let mut result = match flags & libc::O_ACCMODE {
            libc::O_WRONLY => OpenFlags::WRITE,
            libc::O_RDWR => OpenFlags::READ | OpenFlags::WRITE,
            _ => OpenFlags::READ,
        };
        for (posix, flag) in [
            (libc::O_CREAT, OpenFlags::CREATE),
            (libc::O_EXCL, OpenFlags::EXCLUSIVE),
            (libc::O_TRUNC, OpenFlags::TRUNCATE),
            (libc::O_APPEND, OpenFlags::APPEND),
        ] {
            if flags & posix != 0 {
                result = result | flag;
            }
        }
        result
    }
}

impl std::ops::BitOr for OpenFlags {
    type Output = OpenFlags;

    fn bitor(self, other: OpenFlags) -> OpenFlags {
        OpenFlags(self.0 | other.0)
    }
}

/// File attributes, as `stat(2)` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Stat {
    /// File type and permission bits (`st_mode`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Size in bytes (derived from the chunks).
    pub size: u64,
    /// The file's chunk size (`st_blksize`).
    pub chunk_size: u32,
    /// The file's identity.
    pub file: FileId,
    /// A number that identifies the file (the serial of its id).
    pub ino: u64,
    /// Names of the file (0 for a file unlinked while open); 2 for a directory.
    pub nlink: u32,
    /// Device number of a character or block device.
    pub rdev: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// Cache mode: the entry lies in the tree cached from the backend.
    pub backed: bool,
    /// The file has extended attributes.
    pub has_xattrs: bool,
}

impl Stat {
    fn from_attr(attr: &Attr, size: u64) -> Stat {
        Stat {
            mode: attr.mode,
            uid: attr.uid,
            gid: attr.gid,
            size,
            chunk_size: attr.chunk_size,
            file: attr.file_id,
            ino: attr.file_id.ino(),
            nlink: if attr.is_dir() { attr.nlink.max(2) } else { attr.nlink },
            rdev: attr.rdev,
            atime_ns: attr.atime_ns,
            mtime_ns: attr.mtime_ns,
            ctime_ns: attr.ctime_ns,
            backed: attr.has(ringfs_proto::EntryFlags::BACKED),
            has_xattrs: attr.has(ringfs_proto::EntryFlags::XATTRS),
        }
    }

    pub fn kind(&self) -> Option<FileKind> {
        FileKind::from_mode(self.mode)
    }

    pub fn is_dir(&self) -> bool {
        self.kind() == Some(FileKind::Directory)
    }

    /// 512-byte blocks, as `st_blocks` counts them.
    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(512)
    }
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub stat: Stat,
}

/// A directory opened for listing page by page ([`Client::open_directory`]).
#[derive(Clone, Debug)]
pub struct Directory {
    /// Its canonical path.
    pub path: String,
    /// Its attributes when opened.
    pub stat: Stat,
}

/// One page of a directory listing ([`Client::list_page`]).
#[derive(Clone, Debug)]
pub struct DirectoryPage {
    /// Names in order, with their files' attributes.
    pub entries: Vec<DirEntry>,
    /// Names follow after the last one.
    pub more: bool,
}

/// One name of a directory as [`Client::readdir_names`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameEntry {
    pub name: String,
    pub file: FileId,
    /// The file's type (`None`: a type this client does not know).
    pub kind: Option<FileKind>,
}

/// Result of [`Client::find`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FindSummary {
    /// Entries visited (everything below the root).
    pub scanned: u64,
    /// Entries matching every criterion.
    pub matched: u64,
}

/// Capacity and use of the whole file system (summed over servers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FsUsage {
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub entries: u64,
    pub servers: u32,
}

/// A connection to a ringfs file system. Clone it freely; all clones share connections and
/// the fd table.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// Whom this handle acts for (see [`Client::as_user`]).
    credentials: Arc<Credentials>,
    /// Someone else than the connections' `Hello` says: requests go wrapped in `AsUser`.
    acts_for_other: bool,
}

/// `fallocate(2)` mode: reserve without changing the file's size.
pub const FALLOC_FL_KEEP_SIZE: u32 = 1;

pub use ringfs_proto::Credentials;

/// This process's effective user, group and supplementary groups.
pub fn process_credentials() -> Credentials {
    // SAFETY: geteuid/getegid cannot fail; getgroups writes at most `count` ids.
    unsafe {
        let count = libc::getgroups(0, std::ptr::null_mut()).max(0);
        let mut groups = vec![0 as libc::gid_t; count as usize];
        let written = libc::getgroups(count, groups.as_mut_ptr()).max(0);
        groups.truncate(written as usize);
        Credentials { uid: libc::geteuid(), gid: libc::getegid(), groups }
    }
}

struct Inner {
    cluster: Arc<Cluster>,
    /// Closes on their way to the inode servers (see [`closes`]).
    closes: Arc<closes::CloseQueue>,
    files: FileTable,
    chunk_size: u32,
    /// Identifies this client to the servers, which keep the files it opens alive.
    client_id: u64,
    /// Whom the connections act for (their `Hello` says so).
    credentials: Credentials,
    /// As in [`ClientConfig::mounted_at`].
    mounted_at: Option<String>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.closes.flush(&self.cluster, self.client_id);
        self.closes.end();
    }
}

pub(crate) fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_nanos() as i64).unwrap_or(0)
}

impl Client {
    /// Connects to the file system described by `config`.
    pub fn connect(config: ClientConfig) -> std::result::Result<Client, ConnectError> {
        if config.chunk_size == 0 || config.chunk_size > ringfs_proto::MAX_DATA_LEN {
            return Err(ConnectError::Config(format!("chunk size {} is out of range", config.chunk_size)));
        }
        let host_id = if config.local_fast_path { ringfs_rpc::transport::local_host_id() } else { 0 };
        let client_id = ringfs_rpc::memory::random_u64() | 1;
        let credentials = process_credentials();
        let connection_config = ConnectionConfig {
            secret: config.secret.clone(),
            timeout: config.timeout,
            host_id,
            from_server: false,
            poll: config.poll,
            client_id,
            credentials: credentials.clone(),
        };
        let cluster = Cluster::connect(&config.servers, connection_config, config.run_dir.clone(), config.idle_close)?;
        let cluster = Arc::new(cluster);
        let closes = Arc::new(closes::CloseQueue::default());
        closes.start(Arc::downgrade(&cluster), client_id);
        let files = FileTable::default();
        let inner = Arc::new(Inner {
            cluster,
            closes,
            files,
            chunk_size: config.chunk_size,
            client_id,
            credentials: credentials.clone(),
            mounted_at: config.mounted_at.clone(),
        });
        Ok(Client { inner, credentials: Arc::new(credentials), acts_for_other: false })
    }

    /// Connects with the configuration in the environment (see [`ClientConfig::from_env`]).
    pub fn from_env() -> std::result::Result<Client, ConnectError> {
        Client::connect(ClientConfig::from_env()?)
    }

    /// A handle on the same connections and descriptors that acts for `credentials`: what it
    /// creates belongs to that user (the FUSE mount acts for each caller this way).
    pub fn as_user(&self, credentials: Credentials) -> Client {
        let acts_for_other = credentials != self.inner.credentials;
        Client { inner: Arc::clone(&self.inner), credentials: Arc::new(credentials), acts_for_other }
    }

    /// `request` as this handle sends it: checked by the servers for the user it acts for.
    pub(crate) fn for_caller(&self, request: Request) -> Request {
        if self.acts_for_other { Request::AsUser(ringfs_proto::AsUser::new((*self.credentials).clone(), &request)) } else { request }
    }

    /// Whom this handle acts for.
    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// The member list this client currently follows.
    pub fn members(&self) -> MemberList {
        self.inner.cluster.member_list()
    }

    /// True if this client's member list has at least `expected` live servers and every one
    /// of them has too (a server that joined last may not be in every other server's view
    /// yet; until it is, those servers place names differently: a client must not start
    /// before). False while any of them is not there yet or does not answer.
    pub fn all_servers_see(&self, expected: usize) -> bool {
        let alive = |list: &MemberList| list.members.iter().filter(|member| member.alive).count() >= expected;
        let own = self.members();
        alive(&own)
            && own.members.iter().filter(|member| member.alive).all(|member| {
                matches!(self.inner.cluster.call(member, &Request::GetMembers, &[]),
                    Ok(reply) if matches!(&reply.response, ringfs_proto::Response::Members(list) if alive(list)))
            })
    }

    /// Counters of every server, in member-list order (EIO if a server does not answer).
    pub fn server_stats(&self) -> Result<Vec<ServerStats>> {
        self.inner
            .cluster
            .broadcast(&ringfs_proto::Request::Stats)?
            .into_iter()
            .map(|response| match response {
                ringfs_proto::Response::Stats(stats) => Ok(stats),
                _ => Err(Errno::EPROTO),
            })
            .collect()
    }

    /// The UCX transports (lanes) this client's connection to server `name` uses, if it is
    /// connected to it over UCX (e.g. `tcp/eth0 (am, rma)`, `rc_mlx5/mlx5_0:1 (am, rma)`).
    pub fn ucx_lanes(&self, name: &str) -> Option<String> {
        self.inner.cluster.ucx_lanes(name)
    }

    /// Each member with its counters, or the error that kept it from answering.
    pub fn server_status(&self) -> Vec<(ringfs_proto::Member, Result<ServerStats>)> {
        let members = self.inner.cluster.member_list().members;
        members
            .into_iter()
            .map(|member| {
                let stats = self.inner.cluster.call(&member, &ringfs_proto::Request::Stats, &[]).and_then(|reply| match reply.response {
                    ringfs_proto::Response::Stats(stats) => Ok(stats),
                    _ => Err(Errno::EPROTO),
                });
                (member, stats)
            })
            .collect()
    }

    /// Capacity and use summed over all servers.
    pub fn usage(&self) -> Result<FsUsage> {
        let stats = self.server_stats()?;
        Ok(FsUsage {
            capacity_bytes: stats.iter().map(|s| s.capacity_bytes).sum(),
            used_bytes: stats.iter().map(|s| s.bytes).sum(),
            entries: stats.iter().map(|s| s.entries).sum(),
            servers: stats.len() as u32,
        })
    }

    /// Asks every alive server to shut down.
    pub fn shutdown_servers(&self) -> Result<()> {
        self.shutdown_each().into_iter().try_for_each(|(_, answer)| answer)
    }

    /// Asks every server to shut down; returns each server's name with its answer (EIO for
    /// one known to be dead).
    pub fn shutdown_each(&self) -> Vec<(String, Result<()>)> {
        let members = self.inner.cluster.member_list().members;
        // Every server is asked (all at once): none need tell the others it leaves.
        let request = ringfs_proto::Request::Shutdown(ringfs_proto::Shutdown { everyone: true });
        let answers = self.inner.cluster.answer_each(&members, &request);
        members.into_iter().zip(answers).map(|(member, answer)| (member.name, answer.map(drop))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("65536"), Some(65536));
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("1MiB"), Some(1 << 20));
        assert_eq!(parse_size("4m"), Some(4 << 20));
        assert_eq!(parse_size("0"), None);
        assert_eq!(parse_size("8G"), None);
        assert_eq!(parse_size("x"), None);
    }

    #[test]
    fn posix_flags_convert() {
        let flags = OpenFlags::from_posix(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC);
        assert!(flags.contains(OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::TRUNCATE));
        assert!(!flags.contains(OpenFlags::READ));
        assert!(OpenFlags::from_posix(libc::O_RDWR).contains(OpenFlags::READ | OpenFlags::WRITE));
    }
}
