//! Requests and responses, and their binary encoding.
//!
//! Every message body starts with a one-byte type tag; the fields follow in declaration order,
//! encoded with [`crate::codec`]. `docs/PROTOCOL.md` lists every message; the `TAG_*` constants
//! below are the wire values and must never be renumbered.

use crate::attr::ATTR_BYTES;
use crate::codec::{DecodeError, Reader, Writer};
use crate::{Attr, Errno};

/// First four bytes of a `Hello` body: "RNGF".
pub const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"RNGF");
/// Version of this protocol. A server refuses a `Hello` with another version.
pub const PROTOCOL_VERSION: u16 = 2;

/// Names one chunk: a path, a chunk index, and the identity of the file the caller expects.
/// `file_id` 0 means "whatever file has this path now" (used before the caller knows it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkRef {
    pub path: String,
    pub index: u64,
    pub file_id: u64,
}

/// Where the bytes of a write come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteSource {
    /// In the data section of this frame.
    Inline,
    /// In the client's memory, for the server to pull with cross-memory attach (same host only).
    Remote { address: u64, len: u64 },
}

/// The file-level attributes a chunk is created with when a write reaches a chunk that does
/// not exist yet (chunks after chunk 0 are created by the first write that touches them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkTemplate {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub chunk_size: u32,
    /// The caller's view of the file's `backend_len` (cache mode): a missing chunk below it
    /// may hold backend data, which the server loads before changing the chunk.
    pub backend_len: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub version: u16,
    pub secret: Vec<u8>,
    pub client_pid: u32,
    pub host_id: u64,
    /// The peer is another server of the cluster (its requests are never forwarded again).
    pub from_server: bool,
    /// Address and contents of a token in the client's memory. The server tries to read it
    /// with cross-memory attach; if it reads these bytes, bulk data may bypass the socket.
    pub memory_probe: Option<(u64, u64)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Create {
    pub path: String,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub chunk_size: u32,
    pub time_ns: i64,
    /// Fail with EEXIST if the path exists (O_EXCL, mkdir, symlink).
    pub exclusive: bool,
    /// Cut an existing regular file to zero length (O_TRUNC).
    pub truncate: bool,
    /// The target, when creating a symbolic link.
    pub link_target: Option<String>,
}

impl Create {
    /// An exclusive create of `path` with owner 0:0 at time 0; adjust fields as needed.
    pub fn new(path: &str, mode: u32, chunk_size: u32) -> Create {
        Create { path: path.to_string(), mode, uid: 0, gid: 0, chunk_size, time_ns: 0, exclusive: true, truncate: false, link_target: None }
    }

    /// What later chunks of the new file are created with.
    pub fn template(&self) -> ChunkTemplate {
        ChunkTemplate { mode: self.mode, uid: self.uid, gid: self.gid, chunk_size: self.chunk_size, backend_len: 0 }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    pub chunk: ChunkRef,
    /// Byte offset inside the chunk.
    pub offset: u64,
    pub source: WriteSource,
    pub template: ChunkTemplate,
    pub time_ns: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Read {
    pub chunk: ChunkRef,
    /// Byte offset inside the chunk.
    pub offset: u64,
    pub len: u64,
    /// Ask for a [`Lease`] on the bytes instead of receiving them inline (same host only).
    pub lease: bool,
    /// Leases of earlier reads on this connection that the client is done with (piggybacked
    /// here to save a message; see `Request::Release`).
    pub release: Vec<u64>,
    /// The caller's view of the file's `backend_len`, as in [`ChunkTemplate::backend_len`].
    pub backend_len: u64,
}

/// Bytes a server keeps unchanged in its memory until the client releases them, so that a
/// client on the same host can copy them itself with cross-memory attach (one copy, no socket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub id: u64,
    /// Address of the first byte in the server process.
    pub address: u64,
    /// Bytes readable at `address`; the rest of the reply's length reads as zeros.
    pub stored: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetAttr {
    pub path: String,
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime_ns: Option<i64>,
    pub mtime_ns: Option<i64>,
    pub time_ns: i64,
}

/// One server's view of a member of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Stable name; placement orders servers by the hash of their names.
    pub name: String,
    /// `host:port` for TCP.
    pub tcp_address: String,
    /// Unix socket path for clients on the same host (may be empty).
    pub unix_path: String,
    /// Identifies the host, so clients know when the Unix socket is reachable.
    pub host_id: u64,
    pub pid: u32,
    pub alive: bool,
    /// Raised by the member itself on every (re)start, and by others when they declare it dead;
    /// the higher incarnation wins when two views of one member meet.
    pub incarnation: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct MemberList {
    pub epoch: u64,
    /// How keys are placed, as `<scheme>/<hash>` (for example `modular/koyama`), so that
    /// clients place keys exactly as the servers do.
    pub placement: String,
    pub members: Vec<Member>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub attr: Attr,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct DirPage {
    pub entries: Vec<DirEntry>,
    /// More entries follow after the last one returned.
    pub more: bool,
    /// Cache mode: names in the same range whose removal has not reached the backend yet;
    /// the backend listing must not show them.
    pub removed: Vec<String>,
}

/// A server's knowledge of the chunks (index >= 1) of one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TailSummary {
    /// Highest chunk index held, with that chunk's length.
    pub last: Option<(u64, u64)>,
    /// Latest modification time among the chunks held (0 if none).
    pub newest_mtime_ns: i64,
}

/// What `Find` looks for; absent criteria match everything.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct FindFilter {
    /// Modified after this time (`find -newer`).
    pub newer_than_ns: Option<i64>,
    /// Exactly this size in bytes (`find -size Nc`).
    pub size: Option<u64>,
    /// Shell pattern the name must match (`find -name`): `*`, `?` and `[...]`.
    pub name: Option<String>,
}

/// One server's answer to `Find`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct FindResult {
    /// Entries under the root held here (all of them count, as `find` visits them).
    pub scanned: u64,
    /// Entries that match every criterion.
    pub matched: u64,
    /// Files that match by name but whose size or time this server cannot judge alone
    /// (chunks after chunk 0 live elsewhere): the client checks them with a stat.
    pub undecided: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ServerStats {
    pub name: String,
    pub entries: u64,
    pub chunks: u64,
    pub bytes: u64,
    pub capacity_bytes: u64,
    pub requests: u64,
    pub forwarded: u64,
    /// Present when the server caches a backend directory (boxed: most messages are small).
    pub cache: Option<Box<CacheStats>>,
}

/// A cache-mode server's state relative to its backend.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// The backend directory, and the ringfs directory it appears at.
    pub backend: String,
    pub mount_path: String,
    /// `io-aware`, `immediate` or `none`.
    pub policy: String,
    /// Chunks changed since their last flush, and their bytes.
    pub dirty_chunks: u64,
    pub dirty_bytes: u64,
    /// Creations, truncations and removals of entries waiting to reach the backend.
    pub pending_entries: u64,
    /// Written to the backend since the server started.
    pub flushed_chunks: u64,
    pub flushed_bytes: u64,
    /// Read from the backend (chunks loaded, plus reads served from it directly).
    pub loaded_chunks: u64,
    /// Clean chunks dropped to make room, and bytes written through to the backend because
    /// the store was full.
    pub evicted_chunks: u64,
    pub written_through_bytes: u64,
    /// The flusher is writing now (not waiting for idle time or work).
    pub flushing: bool,
    /// Longest time the flusher took to stop after a request arrived, in microseconds.
    pub longest_stop_us: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelloReply {
    pub version: u16,
    pub server_name: String,
    /// The server could read the client's memory probe: `WriteSource::Remote` and
    /// `Read::lease` may be used on this connection.
    pub memory_access: bool,
    /// Address and contents of a token in the server's memory: a client that can read it may
    /// copy leased bytes out of the server (see [`Lease`]).
    pub memory_probe: Option<(u64, u64)>,
}

/// Everything a client or a peer server can ask a server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// First frame on every connection.
    Hello(Hello),
    GetMembers,
    /// A new server announces itself; the reply is the member list including it.
    Join(Member),
    /// Server to server: a newer member list.
    PushMembers(MemberList),
    Ping,
    Stats,
    /// Stop the server (graceful, like SIGTERM).
    Shutdown,
    /// Create a file, directory or symbolic link (chunk 0 and its directory entry).
    Create(Create),
    /// Attributes of one chunk.
    Stat(ChunkRef),
    Write(Write),
    Read(Read),
    /// File-level truncate, sent to the owner of chunk 0, which coordinates the other chunks.
    Truncate {
        path: String,
        file_id: u64,
        size: u64,
        time_ns: i64,
    },
    /// Set the logical length of one chunk (creating it empty if needed).
    SetChunkLen {
        chunk: ChunkRef,
        len: u64,
        template: ChunkTemplate,
    },
    /// Record on chunk 0 that chunks after it may exist.
    MarkExtended {
        path: String,
        file_id: u64,
    },
    Unlink {
        path: String,
    },
    /// Remove this server's chunks of `path` with index >= `from_index` (0 = every file id,
    /// otherwise only chunks of that file).
    RemoveChunks {
        path: String,
        file_id: u64,
        from_index: u64,
    },
    /// This server's highest chunk index (>= 1) of the file, with that chunk's length.
    LastChunk {
        path: String,
        file_id: u64,
    },
    SetAttr(SetAttr),
    /// One page of the entries of `path` that this server holds, names after `after`.
    ReadDir {
        path: String,
        after: Option<String>,
        limit: u32,
    },
    /// Server to server: is `path` an existing directory? (parent checks)
    LookupDir {
        path: String,
    },
    /// Server to server: forget cached knowledge of directory `path` and report whether this
    /// server holds any entry inside it.
    PrepareRmdir {
        path: String,
    },
    Rmdir {
        path: String,
    },
    Rename {
        from: String,
        to: String,
        time_ns: i64,
    },
    /// Server to server: move this server's chunks (index >= 1) of a file to the new path.
    MoveChunks {
        from: String,
        to: String,
        file_id: u64,
    },
    /// Server to server: store a chunk moved by a rename (bytes in the data section).
    PutChunk {
        chunk: ChunkRef,
        attr: Attr,
    },
    /// Server to server: install chunk 0 of a renamed file at its new path, replacing what
    /// is there (bytes in the data section).
    InstallEntry {
        path: String,
        attr: Attr,
    },
    /// Ends leases granted by `Read` replies. Sent with request id 0: no response.
    Release {
        leases: Vec<u64>,
    },
    /// Count this server's entries under `root` and those matching `filter`.
    Find {
        root: String,
        filter: FindFilter,
    },
    /// Cache mode: flush what was dirty when the sync began. `ticket` 0 begins a sync; the
    /// answer says how much of it is left, and the caller repeats with the ticket it got until
    /// nothing is (each answer comes within about a second).
    Sync {
        ticket: u64,
    },
    /// Server to server, before flushing a chunk of a file: apply the entry's pending backend
    /// operation (create, truncate) so that chunk data lands in the right file.
    FlushPrepare {
        path: String,
        file_id: u64,
    },
    /// One page of the backend directory behind `path` (sent to the owner of `path`).
    ReadBackendDir {
        path: String,
        after: Option<String>,
        limit: u32,
    },
    /// Load a chunk from the backend into the store (stage-in); `backend_len` as in `Read`.
    LoadChunk {
        chunk: ChunkRef,
        backend_len: u64,
    },
}

/// What a server answers. Errors carry an errno; every other variant answers particular
/// requests (see `docs/PROTOCOL.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    Error(Errno),
    Done,
    Hello(HelloReply),
    Members(MemberList),
    Attr(Attr),
    /// Result of a `Write`: the chunk's logical length after it.
    Written {
        chunk_len: u64,
    },
    /// Result of a `Read`: the chunk's attributes (`None` if the chunk does not exist), how
    /// many bytes the read yields, and where they are: in the data section, or in a lease.
    Read {
        attr: Option<Attr>,
        len: u64,
        lease: Option<Lease>,
    },
    Count(u64),
    /// Result of `LastChunk`: this server's part of a file after chunk 0.
    Tail(TailSummary),
    /// Result of `Find`.
    Found(FindResult),
    DirPage(DirPage),
    /// Result of `PrepareRmdir`: whether entries inside are held here, and the names inside
    /// whose removal has not reached the backend yet.
    HasEntries {
        any: bool,
        removed: Vec<String>,
    },
    /// Result of `Sync`: the sync's ticket, and the chunks and entries of it not flushed yet.
    SyncProgress {
        ticket: u64,
        remaining: u64,
    },
    /// Result of `InstallEntry`: the attributes of the entry that was replaced, if any.
    Replaced(Option<Attr>),
    Stats(ServerStats),
}

// Wire tags. Requests use 1..=127, responses 128..=255.
const TAG_HELLO: u8 = 1;
const TAG_GET_MEMBERS: u8 = 2;
const TAG_JOIN: u8 = 3;
const TAG_PUSH_MEMBERS: u8 = 4;
const TAG_PING: u8 = 5;
const TAG_STATS: u8 = 6;
const TAG_SHUTDOWN: u8 = 7;
const TAG_CREATE: u8 = 10;
const TAG_STAT: u8 = 11;
const TAG_WRITE: u8 = 12;
const TAG_READ: u8 = 13;
const TAG_TRUNCATE: u8 = 14;
const TAG_SET_CHUNK_LEN: u8 = 15;
const TAG_MARK_EXTENDED: u8 = 16;
const TAG_UNLINK: u8 = 17;
const TAG_REMOVE_CHUNKS: u8 = 18;
const TAG_LAST_CHUNK: u8 = 19;
const TAG_SET_ATTR: u8 = 20;
const TAG_READ_DIR: u8 = 21;
const TAG_LOOKUP_DIR: u8 = 22;
const TAG_PREPARE_RMDIR: u8 = 23;
const TAG_RMDIR: u8 = 24;
const TAG_RENAME: u8 = 25;
const TAG_MOVE_CHUNKS: u8 = 26;
const TAG_PUT_CHUNK: u8 = 27;
const TAG_INSTALL_ENTRY: u8 = 28;
const TAG_RELEASE: u8 = 29;
const TAG_FIND: u8 = 30;
const TAG_SYNC: u8 = 31;
const TAG_FLUSH_PREPARE: u8 = 32;
const TAG_READ_BACKEND_DIR: u8 = 33;
const TAG_LOAD_CHUNK: u8 = 34;

const TAG_R_ERROR: u8 = 128;
const TAG_R_DONE: u8 = 129;
const TAG_R_HELLO: u8 = 130;
const TAG_R_MEMBERS: u8 = 131;
const TAG_R_ATTR: u8 = 132;
const TAG_R_WRITTEN: u8 = 133;
const TAG_R_READ: u8 = 134;
const TAG_R_COUNT: u8 = 135;
const TAG_R_TAIL: u8 = 136;
const TAG_R_DIR_PAGE: u8 = 137;
const TAG_R_HAS_ENTRIES: u8 = 138;
const TAG_R_REPLACED: u8 = 139;
const TAG_R_STATS: u8 = 140;
const TAG_R_FOUND: u8 = 141;
const TAG_R_SYNC_PROGRESS: u8 = 142;

fn write_attr(w: &mut Writer, attr: &Attr) {
    w.raw(&attr.to_bytes());
}

fn read_attr(r: &mut Reader) -> Result<Attr, DecodeError> {
    Ok(Attr::from_bytes(&r.array()?))
}

fn write_chunk(w: &mut Writer, chunk: &ChunkRef) {
    w.str(&chunk.path).u64(chunk.index).u64(chunk.file_id);
}

fn read_chunk(r: &mut Reader) -> Result<ChunkRef, DecodeError> {
    Ok(ChunkRef { path: r.string()?, index: r.u64()?, file_id: r.u64()? })
}

fn write_template(w: &mut Writer, template: &ChunkTemplate) {
    w.u32(template.mode).u32(template.uid).u32(template.gid).u32(template.chunk_size).u64(template.backend_len);
}

fn read_template(r: &mut Reader) -> Result<ChunkTemplate, DecodeError> {
    Ok(ChunkTemplate { mode: r.u32()?, uid: r.u32()?, gid: r.u32()?, chunk_size: r.u32()?, backend_len: r.u64()? })
}

fn write_names(w: &mut Writer, names: &[String]) {
    w.u32(names.len() as u32);
    for name in names {
        w.str(name);
    }
}

fn read_names(r: &mut Reader) -> Result<Vec<String>, DecodeError> {
    let count = r.count(4)?;
    (0..count).map(|_| r.string()).collect()
}

fn write_cache_stats(w: &mut Writer, cache: &CacheStats) {
    w.str(&cache.backend)
        .str(&cache.mount_path)
        .str(&cache.policy)
        .u64(cache.dirty_chunks)
        .u64(cache.dirty_bytes)
        .u64(cache.pending_entries);
    w.u64(cache.flushed_chunks).u64(cache.flushed_bytes).u64(cache.loaded_chunks).u64(cache.evicted_chunks);
    w.u64(cache.written_through_bytes).bool(cache.flushing).u64(cache.longest_stop_us);
}

fn read_cache_stats(r: &mut Reader) -> Result<CacheStats, DecodeError> {
    Ok(CacheStats {
        backend: r.string()?,
        mount_path: r.string()?,
        policy: r.string()?,
        dirty_chunks: r.u64()?,
        dirty_bytes: r.u64()?,
        pending_entries: r.u64()?,
        flushed_chunks: r.u64()?,
        flushed_bytes: r.u64()?,
        loaded_chunks: r.u64()?,
        evicted_chunks: r.u64()?,
        written_through_bytes: r.u64()?,
        flushing: r.bool()?,
        longest_stop_us: r.u64()?,
    })
}

fn write_member(w: &mut Writer, member: &Member) {
    w.str(&member.name).str(&member.tcp_address).str(&member.unix_path);
    w.u64(member.host_id).u32(member.pid).bool(member.alive).u64(member.incarnation);
}

fn read_member(r: &mut Reader) -> Result<Member, DecodeError> {
    Ok(Member {
        name: r.string()?,
        tcp_address: r.string()?,
        unix_path: r.string()?,
        host_id: r.u64()?,
        pid: r.u32()?,
        alive: r.bool()?,
        incarnation: r.u64()?,
    })
}

fn write_member_list(w: &mut Writer, list: &MemberList) {
    w.u64(list.epoch).str(&list.placement).u32(list.members.len() as u32);
    for member in &list.members {
        write_member(w, member);
    }
}

fn read_member_list(r: &mut Reader) -> Result<MemberList, DecodeError> {
    let epoch = r.u64()?;
    let placement = r.string()?;
    let count = r.count(12 + 8 + 4 + 1 + 8)?;
    let members = (0..count).map(|_| read_member(r)).collect::<Result<_, _>>()?;
    Ok(MemberList { epoch, placement, members })
}

impl Request {
    /// Appends the encoded body of this request to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer::new(out);
        match self {
            Request::Hello(hello) => {
                w.u8(TAG_HELLO).u32(HELLO_MAGIC).u16(hello.version).bytes(&hello.secret);
                w.u32(hello.client_pid).u64(hello.host_id).bool(hello.from_server);
                w.option(hello.memory_probe.as_ref(), |w, (address, token)| {
                    w.u64(*address).u64(*token);
                });
            }
            Request::GetMembers => {
                w.u8(TAG_GET_MEMBERS);
            }
            Request::Join(member) => {
                w.u8(TAG_JOIN);
                write_member(&mut w, member);
            }
            Request::PushMembers(list) => {
                w.u8(TAG_PUSH_MEMBERS);
                write_member_list(&mut w, list);
            }
            Request::Ping => {
                w.u8(TAG_PING);
            }
            Request::Stats => {
                w.u8(TAG_STATS);
            }
            Request::Shutdown => {
                w.u8(TAG_SHUTDOWN);
            }
            Request::Create(create) => {
                w.u8(TAG_CREATE).str(&create.path).u32(create.mode).u32(create.uid).u32(create.gid);
                w.u32(create.chunk_size).i64(create.time_ns).bool(create.exclusive).bool(create.truncate);
                w.option(create.link_target.as_deref(), |w, target| {
                    w.str(target);
                });
            }
            Request::Stat(chunk) => {
                w.u8(TAG_STAT);
                write_chunk(&mut w, chunk);
            }
            Request::Write(write) => {
                w.u8(TAG_WRITE);
                write_chunk(&mut w, &write.chunk);
                w.u64(write.offset);
                match write.source {
                    WriteSource::Inline => {
                        w.u8(0);
                    }
                    WriteSource::Remote { address, len } => {
                        w.u8(1).u64(address).u64(len);
                    }
                }
                write_template(&mut w, &write.template);
                w.i64(write.time_ns);
            }
            Request::Read(read) => {
                w.u8(TAG_READ);
                write_chunk(&mut w, &read.chunk);
                w.u64(read.offset).u64(read.len).bool(read.lease).u32(read.release.len() as u32);
                for lease in &read.release {
                    w.u64(*lease);
                }
                w.u64(read.backend_len);
            }
            Request::Truncate { path, file_id, size, time_ns } => {
                w.u8(TAG_TRUNCATE).str(path).u64(*file_id).u64(*size).i64(*time_ns);
            }
            Request::SetChunkLen { chunk, len, template } => {
                w.u8(TAG_SET_CHUNK_LEN);
                write_chunk(&mut w, chunk);
                w.u64(*len);
                write_template(&mut w, template);
            }
            Request::MarkExtended { path, file_id } => {
                w.u8(TAG_MARK_EXTENDED).str(path).u64(*file_id);
            }
            Request::Unlink { path } => {
                w.u8(TAG_UNLINK).str(path);
            }
            Request::RemoveChunks { path, file_id, from_index } => {
                w.u8(TAG_REMOVE_CHUNKS).str(path).u64(*file_id).u64(*from_index);
            }
            Request::LastChunk { path, file_id } => {
                w.u8(TAG_LAST_CHUNK).str(path).u64(*file_id);
            }
            Request::SetAttr(set) => {
                w.u8(TAG_SET_ATTR).str(&set.path);
                w.option(set.mode.as_ref(), |w, v| {
                    w.u32(*v);
                });
                w.option(set.uid.as_ref(), |w, v| {
                    w.u32(*v);
                });
                w.option(set.gid.as_ref(), |w, v| {
                    w.u32(*v);
                });
                w.option(set.atime_ns.as_ref(), |w, v| {
                    w.i64(*v);
                });
                w.option(set.mtime_ns.as_ref(), |w, v| {
                    w.i64(*v);
                });
                w.i64(set.time_ns);
            }
            Request::ReadDir { path, after, limit } => {
                w.u8(TAG_READ_DIR).str(path);
                w.option(after.as_deref(), |w, name| {
                    w.str(name);
                });
                w.u32(*limit);
            }
            Request::LookupDir { path } => {
                w.u8(TAG_LOOKUP_DIR).str(path);
            }
            Request::PrepareRmdir { path } => {
                w.u8(TAG_PREPARE_RMDIR).str(path);
            }
            Request::Rmdir { path } => {
                w.u8(TAG_RMDIR).str(path);
            }
            Request::Rename { from, to, time_ns } => {
                w.u8(TAG_RENAME).str(from).str(to).i64(*time_ns);
            }
            Request::MoveChunks { from, to, file_id } => {
                w.u8(TAG_MOVE_CHUNKS).str(from).str(to).u64(*file_id);
            }
            Request::PutChunk { chunk, attr } => {
                w.u8(TAG_PUT_CHUNK);
                write_chunk(&mut w, chunk);
                write_attr(&mut w, attr);
            }
            Request::InstallEntry { path, attr } => {
                w.u8(TAG_INSTALL_ENTRY).str(path);
                write_attr(&mut w, attr);
            }
            Request::Release { leases } => {
                w.u8(TAG_RELEASE).u32(leases.len() as u32);
                for lease in leases {
                    w.u64(*lease);
                }
            }
            Request::Find { root, filter } => {
                w.u8(TAG_FIND).str(root);
                w.option(filter.newer_than_ns.as_ref(), |w, time| {
                    w.i64(*time);
                });
                w.option(filter.size.as_ref(), |w, size| {
                    w.u64(*size);
                });
                w.option(filter.name.as_deref(), |w, name| {
                    w.str(name);
                });
            }
            Request::Sync { ticket } => {
                w.u8(TAG_SYNC).u64(*ticket);
            }
            Request::FlushPrepare { path, file_id } => {
                w.u8(TAG_FLUSH_PREPARE).str(path).u64(*file_id);
            }
            Request::ReadBackendDir { path, after, limit } => {
                w.u8(TAG_READ_BACKEND_DIR).str(path);
                w.option(after.as_deref(), |w, after| {
                    w.str(after);
                });
                w.u32(*limit);
            }
            Request::LoadChunk { chunk, backend_len } => {
                w.u8(TAG_LOAD_CHUNK);
                write_chunk(&mut w, chunk);
                w.u64(*backend_len);
            }
        }
    }

    /// Decodes a request body. Every byte must belong to the message.
    pub fn decode(body: &[u8]) -> Result<Request, DecodeError> {
        let mut r = Reader::new(body);
        let request = match r.u8()? {
            TAG_HELLO => {
                let magic = r.u32()?;
                if magic != HELLO_MAGIC {
                    return Err(DecodeError::InvalidValue { field: "hello magic", value: magic as u64 });
                }
                Request::Hello(Hello {
                    version: r.u16()?,
                    secret: r.bytes()?.to_vec(),
                    client_pid: r.u32()?,
                    host_id: r.u64()?,
                    from_server: r.bool()?,
                    memory_probe: r.option(|r| Ok((r.u64()?, r.u64()?)))?,
                })
            }
            TAG_GET_MEMBERS => Request::GetMembers,
            TAG_JOIN => Request::Join(read_member(&mut r)?),
            TAG_PUSH_MEMBERS => Request::PushMembers(read_member_list(&mut r)?),
            TAG_PING => Request::Ping,
            TAG_STATS => Request::Stats,
            TAG_SHUTDOWN => Request::Shutdown,
            TAG_CREATE => Request::Create(Create {
                path: r.string()?,
                mode: r.u32()?,
                uid: r.u32()?,
                gid: r.u32()?,
                chunk_size: r.u32()?,
                time_ns: r.i64()?,
                exclusive: r.bool()?,
                truncate: r.bool()?,
                link_target: r.option(|r| r.string())?,
            }),
            TAG_STAT => Request::Stat(read_chunk(&mut r)?),
            TAG_WRITE => {
                let chunk = read_chunk(&mut r)?;
                let offset = r.u64()?;
                let source = match r.u8()? {
                    0 => WriteSource::Inline,
                    1 => WriteSource::Remote { address: r.u64()?, len: r.u64()? },
                    other => return Err(DecodeError::InvalidValue { field: "write source", value: other as u64 }),
                };
                Request::Write(Write { chunk, offset, source, template: read_template(&mut r)?, time_ns: r.i64()? })
            }
            TAG_READ => Request::Read(Read {
                chunk: read_chunk(&mut r)?,
                offset: r.u64()?,
                len: r.u64()?,
                lease: r.bool()?,
                release: {
                    let count = r.count(8)?;
                    (0..count).map(|_| r.u64()).collect::<Result<_, _>>()?
                },
                backend_len: r.u64()?,
            }),
            TAG_TRUNCATE => Request::Truncate { path: r.string()?, file_id: r.u64()?, size: r.u64()?, time_ns: r.i64()? },
            TAG_SET_CHUNK_LEN => Request::SetChunkLen { chunk: read_chunk(&mut r)?, len: r.u64()?, template: read_template(&mut r)? },
            TAG_MARK_EXTENDED => Request::MarkExtended { path: r.string()?, file_id: r.u64()? },
            TAG_UNLINK => Request::Unlink { path: r.string()? },
            TAG_REMOVE_CHUNKS => Request::RemoveChunks { path: r.string()?, file_id: r.u64()?, from_index: r.u64()? },
            TAG_LAST_CHUNK => Request::LastChunk { path: r.string()?, file_id: r.u64()? },
            TAG_SET_ATTR => Request::SetAttr(SetAttr {
                path: r.string()?,
                mode: r.option(|r| r.u32())?,
                uid: r.option(|r| r.u32())?,
                gid: r.option(|r| r.u32())?,
                atime_ns: r.option(|r| r.i64())?,
                mtime_ns: r.option(|r| r.i64())?,
                time_ns: r.i64()?,
            }),
            TAG_READ_DIR => Request::ReadDir { path: r.string()?, after: r.option(|r| r.string())?, limit: r.u32()? },
            TAG_LOOKUP_DIR => Request::LookupDir { path: r.string()? },
            TAG_PREPARE_RMDIR => Request::PrepareRmdir { path: r.string()? },
            TAG_RMDIR => Request::Rmdir { path: r.string()? },
            TAG_RENAME => Request::Rename { from: r.string()?, to: r.string()?, time_ns: r.i64()? },
            TAG_MOVE_CHUNKS => Request::MoveChunks { from: r.string()?, to: r.string()?, file_id: r.u64()? },
            TAG_PUT_CHUNK => Request::PutChunk { chunk: read_chunk(&mut r)?, attr: read_attr(&mut r)? },
            TAG_INSTALL_ENTRY => Request::InstallEntry { path: r.string()?, attr: read_attr(&mut r)? },
            TAG_RELEASE => {
                let count = r.count(8)?;
                Request::Release { leases: (0..count).map(|_| r.u64()).collect::<Result<_, _>>()? }
            }
            TAG_FIND => Request::Find {
                root: r.string()?,
                filter: FindFilter { newer_than_ns: r.option(|r| r.i64())?, size: r.option(|r| r.u64())?, name: r.option(|r| r.string())? },
            },
            TAG_SYNC => Request::Sync { ticket: r.u64()? },
            TAG_FLUSH_PREPARE => Request::FlushPrepare { path: r.string()?, file_id: r.u64()? },
            TAG_READ_BACKEND_DIR => Request::ReadBackendDir { path: r.string()?, after: r.option(|r| r.string())?, limit: r.u32()? },
            TAG_LOAD_CHUNK => Request::LoadChunk { chunk: read_chunk(&mut r)?, backend_len: r.u64()? },
            other => return Err(DecodeError::UnknownMessage(other)),
        };
        r.finish()?;
        Ok(request)
    }

    /// The key this request is about, for requests that a server forwards to the key's owner.
    /// Requests without a key (membership, broadcasts answered by every server) return `None`.
    pub fn routing_key(&self) -> Option<(&str, u64)> {
        match self {
            Request::Create(create) => Some((&create.path, 0)),
            Request::Stat(chunk) => Some((&chunk.path, chunk.index)),
            Request::Write(write) => Some((&write.chunk.path, write.chunk.index)),
            Request::Read(read) => Some((&read.chunk.path, read.chunk.index)),
            Request::Truncate { path, .. } => Some((path, 0)),
            Request::SetChunkLen { chunk, .. } => Some((&chunk.path, chunk.index)),
            Request::MarkExtended { path, .. } => Some((path, 0)),
            Request::Unlink { path } => Some((path, 0)),
            Request::SetAttr(set) => Some((&set.path, 0)),
            Request::LookupDir { path } => Some((path, 0)),
            Request::Rmdir { path } => Some((path, 0)),
            Request::Rename { from, .. } => Some((from, 0)),
            Request::PutChunk { chunk, .. } => Some((&chunk.path, chunk.index)),
            Request::InstallEntry { path, .. } => Some((path, 0)),
            Request::FlushPrepare { path, .. } => Some((path, 0)),
            Request::ReadBackendDir { path, .. } => Some((path, 0)),
            Request::LoadChunk { chunk, .. } => Some((&chunk.path, chunk.index)),
            Request::Hello(_)
            | Request::GetMembers
            | Request::Join(_)
            | Request::PushMembers(_)
            | Request::Ping
            | Request::Stats
            | Request::Shutdown
            | Request::RemoveChunks { .. }
            | Request::LastChunk { .. }
            | Request::ReadDir { .. }
            | Request::PrepareRmdir { .. }
            | Request::MoveChunks { .. }
            | Request::Release { .. }
            | Request::Find { .. }
            | Request::Sync { .. } => None,
        }
    }
}

impl Response {
    /// Appends the encoded body of this response to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer::new(out);
        match self {
            Response::Error(errno) => {
                w.u8(TAG_R_ERROR).i32(errno.0);
            }
            Response::Done => {
                w.u8(TAG_R_DONE);
            }
            Response::Hello(reply) => {
                w.u8(TAG_R_HELLO).u16(reply.version).str(&reply.server_name).bool(reply.memory_access);
                w.option(reply.memory_probe.as_ref(), |w, (address, token)| {
                    w.u64(*address).u64(*token);
                });
            }
            Response::Members(list) => {
                w.u8(TAG_R_MEMBERS);
                write_member_list(&mut w, list);
            }
            Response::Attr(attr) => {
                w.u8(TAG_R_ATTR);
                write_attr(&mut w, attr);
            }
            Response::Written { chunk_len } => {
                w.u8(TAG_R_WRITTEN).u64(*chunk_len);
            }
            Response::Read { attr, len, lease } => {
                w.u8(TAG_R_READ);
                w.option(attr.as_ref(), write_attr);
                w.u64(*len);
                w.option(lease.as_ref(), |w, lease| {
                    w.u64(lease.id).u64(lease.address).u64(lease.stored);
                });
            }
            Response::Count(count) => {
                w.u8(TAG_R_COUNT).u64(*count);
            }
            Response::Tail(tail) => {
                w.u8(TAG_R_TAIL);
                w.option(tail.last.as_ref(), |w, (index, len)| {
                    w.u64(*index).u64(*len);
                });
                w.i64(tail.newest_mtime_ns);
            }
            Response::Found(found) => {
                w.u8(TAG_R_FOUND).u64(found.scanned).u64(found.matched).u32(found.undecided.len() as u32);
                for path in &found.undecided {
                    w.str(path);
                }
            }
            Response::DirPage(page) => {
                w.u8(TAG_R_DIR_PAGE).bool(page.more).u32(page.entries.len() as u32);
                for entry in &page.entries {
                    w.str(&entry.name);
                    write_attr(&mut w, &entry.attr);
                }
                write_names(&mut w, &page.removed);
            }
            Response::HasEntries { any, removed } => {
                w.u8(TAG_R_HAS_ENTRIES).bool(*any);
                write_names(&mut w, removed);
            }
            Response::SyncProgress { ticket, remaining } => {
                w.u8(TAG_R_SYNC_PROGRESS).u64(*ticket).u64(*remaining);
            }
            Response::Replaced(attr) => {
                w.u8(TAG_R_REPLACED);
                w.option(attr.as_ref(), write_attr);
            }
            Response::Stats(stats) => {
                w.u8(TAG_R_STATS).str(&stats.name).u64(stats.entries).u64(stats.chunks).u64(stats.bytes);
                w.u64(stats.capacity_bytes).u64(stats.requests).u64(stats.forwarded);
                w.option(stats.cache.as_deref(), write_cache_stats);
            }
        }
    }

    /// Decodes a response body. Every byte must belong to the message.
    pub fn decode(body: &[u8]) -> Result<Response, DecodeError> {
        let mut r = Reader::new(body);
        let response = match r.u8()? {
            TAG_R_ERROR => {
                let code = r.i32()?;
                if code <= 0 {
                    return Err(DecodeError::InvalidValue { field: "errno", value: code as u64 });
                }
                Response::Error(Errno(code))
            }
            TAG_R_DONE => Response::Done,
            TAG_R_HELLO => Response::Hello(HelloReply {
                version: r.u16()?,
                server_name: r.string()?,
                memory_access: r.bool()?,
                memory_probe: r.option(|r| Ok((r.u64()?, r.u64()?)))?,
            }),
            TAG_R_MEMBERS => Response::Members(read_member_list(&mut r)?),
            TAG_R_ATTR => Response::Attr(read_attr(&mut r)?),
            TAG_R_WRITTEN => Response::Written { chunk_len: r.u64()? },
            TAG_R_READ => Response::Read {
                attr: r.option(read_attr)?,
                len: r.u64()?,
                lease: r.option(|r| Ok(Lease { id: r.u64()?, address: r.u64()?, stored: r.u64()? }))?,
            },
            TAG_R_COUNT => Response::Count(r.u64()?),
            TAG_R_TAIL => Response::Tail(TailSummary { last: r.option(|r| Ok((r.u64()?, r.u64()?)))?, newest_mtime_ns: r.i64()? }),
            TAG_R_FOUND => {
                let scanned = r.u64()?;
                let matched = r.u64()?;
                let count = r.count(4)?;
                Response::Found(FindResult { scanned, matched, undecided: (0..count).map(|_| r.string()).collect::<Result<_, _>>()? })
            }
            TAG_R_DIR_PAGE => {
                let more = r.bool()?;
                let count = r.count(4 + ATTR_BYTES)?;
                let entries =
                    (0..count).map(|_| Ok(DirEntry { name: r.string()?, attr: read_attr(&mut r)? })).collect::<Result<_, DecodeError>>()?;
                Response::DirPage(DirPage { entries, more, removed: read_names(&mut r)? })
            }
            TAG_R_HAS_ENTRIES => Response::HasEntries { any: r.bool()?, removed: read_names(&mut r)? },
            TAG_R_SYNC_PROGRESS => Response::SyncProgress { ticket: r.u64()?, remaining: r.u64()? },
            TAG_R_REPLACED => Response::Replaced(r.option(read_attr)?),
            TAG_R_STATS => Response::Stats(ServerStats {
                name: r.string()?,
                entries: r.u64()?,
                chunks: r.u64()?,
                bytes: r.u64()?,
                capacity_bytes: r.u64()?,
                requests: r.u64()?,
                forwarded: r.u64()?,
                cache: r.option(|r| read_cache_stats(r).map(Box::new))?,
            }),
            other => return Err(DecodeError::UnknownMessage(other)),
        };
        r.finish()?;
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::FileKind;
    use proptest::prelude::*;

    fn sample_attr() -> Attr {
        Attr {
            mode: FileKind::Regular.mode_bits() | 0o644,
            uid: 1000,
            gid: 100,
            chunk_size: 1 << 20,
            len: 4096,
            file_id: 0xDEADBEEF,
            atime_ns: 1,
            mtime_ns: 2,
            ctime_ns: -3,
            flags: 1,
            backend_len: 1 << 40,
        }
    }

    fn sample_requests() -> Vec<Request> {
        let chunk = ChunkRef { path: "/a/b".into(), index: 3, file_id: 9 };
        let template = ChunkTemplate { mode: 0o100644, uid: 1, gid: 2, chunk_size: 65536, backend_len: 3 << 20 };
        vec![
            Request::Hello(Hello {
                version: PROTOCOL_VERSION,
                secret: vec![1, 2, 3],
                client_pid: 42,
                host_id: 7,
                from_server: true,
                memory_probe: Some((0x1000, 0xABCD)),
            }),
            Request::GetMembers,
            Request::Join(Member {
                name: "n0".into(),
                tcp_address: "127.0.0.1:1".into(),
                unix_path: "/tmp/s".into(),
                host_id: 5,
                pid: 77,
                alive: true,
                incarnation: 2,
            }),
            Request::PushMembers(MemberList { epoch: 4, placement: "modular/koyama".into(), members: vec![] }),
            Request::Ping,
            Request::Stats,
            Request::Shutdown,
            Request::Create(Create {
                path: "/x".into(),
                mode: 0o100600,
                uid: 0,
                gid: 0,
                chunk_size: 4096,
                time_ns: 123,
                exclusive: true,
                truncate: false,
                link_target: Some("/y".into()),
            }),
            Request::Stat(chunk.clone()),
            Request::Write(Write {
                chunk: chunk.clone(),
                offset: 5,
                source: WriteSource::Remote { address: 99, len: 100 },
                template,
                time_ns: 8,
            }),
            Request::Write(Write { chunk: chunk.clone(), offset: 0, source: WriteSource::Inline, template, time_ns: 8 }),
            Request::Read(Read { chunk: chunk.clone(), offset: 1, len: 2, lease: true, release: vec![4, 5], backend_len: 7 }),
            Request::Truncate { path: "/f".into(), file_id: 3, size: 1 << 33, time_ns: 1 },
            Request::SetChunkLen { chunk: chunk.clone(), len: 10, template },
            Request::MarkExtended { path: "/f".into(), file_id: 1 },
            Request::Unlink { path: "/f".into() },
            Request::RemoveChunks { path: "/f".into(), file_id: 0, from_index: 1 },
            Request::LastChunk { path: "/f".into(), file_id: 2 },
            Request::SetAttr(SetAttr {
                path: "/f".into(),
                mode: Some(0o600),
                uid: None,
                gid: Some(5),
                atime_ns: None,
                mtime_ns: Some(-1),
                time_ns: 6,
            }),
            Request::ReadDir { path: "/".into(), after: Some("m".into()), limit: 100 },
            Request::LookupDir { path: "/d".into() },
            Request::PrepareRmdir { path: "/d".into() },
            Request::Rmdir { path: "/d".into() },
            Request::Rename { from: "/a".into(), to: "/b".into(), time_ns: 3 },
            Request::MoveChunks { from: "/a".into(), to: "/b".into(), file_id: 4 },
            Request::PutChunk { chunk, attr: sample_attr() },
            Request::InstallEntry { path: "/b".into(), attr: sample_attr() },
            Request::Release { leases: vec![1, 2, 3] },
            Request::Find { root: "/d".into(), filter: FindFilter { newer_than_ns: Some(5), size: Some(3901), name: Some("*01*".into()) } },
            Request::Find { root: "/".into(), filter: FindFilter::default() },
            Request::Sync { ticket: 0 },
            Request::Sync { ticket: 12 },
            Request::FlushPrepare { path: "/f".into(), file_id: 8 },
            Request::ReadBackendDir { path: "/d".into(), after: Some("x".into()), limit: 7 },
            Request::ReadBackendDir { path: "/d".into(), after: None, limit: 7 },
            Request::LoadChunk { chunk: ChunkRef { path: "/f".into(), index: 2, file_id: 3 }, backend_len: 9 },
        ]
    }

    fn sample_responses() -> Vec<Response> {
        vec![
            Response::Error(Errno::ENOENT),
            Response::Done,
            Response::Hello(HelloReply { version: 1, server_name: "s".into(), memory_access: true, memory_probe: Some((5, 6)) }),
            Response::Members(MemberList { epoch: 1, placement: String::new(), members: vec![] }),
            Response::Attr(sample_attr()),
            Response::Written { chunk_len: 77 },
            Response::Read { attr: Some(sample_attr()), len: 5, lease: Some(Lease { id: 1, address: 2, stored: 3 }) },
            Response::Read { attr: None, len: 0, lease: None },
            Response::Count(3),
            Response::Tail(TailSummary { last: Some((4, 5)), newest_mtime_ns: 6 }),
            Response::Tail(TailSummary::default()),
            Response::Found(FindResult { scanned: 10, matched: 2, undecided: vec!["/a".into()] }),
            Response::DirPage(DirPage {
                entries: vec![DirEntry { name: "a".into(), attr: sample_attr() }],
                more: true,
                removed: vec!["b".into()],
            }),
            Response::HasEntries { any: false, removed: vec!["c".into(), "d".into()] },
            Response::SyncProgress { ticket: 5, remaining: 6 },
            Response::Replaced(Some(sample_attr())),
            Response::Stats(ServerStats {
                name: "s".into(),
                entries: 1,
                chunks: 2,
                bytes: 3,
                capacity_bytes: 4,
                requests: 5,
                forwarded: 6,
                cache: None,
            }),
            Response::Stats(ServerStats {
                name: "s".into(),
                cache: Some(Box::new(CacheStats {
                    backend: "/lustre/project".into(),
                    mount_path: "/".into(),
                    policy: "io-aware".into(),
                    dirty_chunks: 1,
                    dirty_bytes: 2,
                    pending_entries: 3,
                    flushed_chunks: 4,
                    flushed_bytes: 5,
                    loaded_chunks: 6,
                    evicted_chunks: 7,
                    written_through_bytes: 8,
                    flushing: true,
                    longest_stop_us: 9,
                })),
                ..ServerStats::default()
            }),
        ]
    }

    #[test]
    fn every_request_round_trips() {
        for request in sample_requests() {
            let mut body = Vec::new();
            request.encode(&mut body);
            assert_eq!(Request::decode(&body), Ok(request));
        }
    }

    #[test]
    fn every_response_round_trips() {
        for response in sample_responses() {
            let mut body = Vec::new();
            response.encode(&mut body);
            assert_eq!(Response::decode(&body), Ok(response));
        }
    }

    #[test]
    fn hello_with_wrong_magic_is_rejected() {
        let mut body = Vec::new();
        Request::Ping.encode(&mut body);
        body[0] = TAG_HELLO;
        body.extend_from_slice(b"XXXX");
        assert!(matches!(Request::decode(&body), Err(DecodeError::InvalidValue { field: "hello magic", .. })));
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut body = Vec::new();
        Request::Ping.encode(&mut body);
        body.push(0);
        assert_eq!(Request::decode(&body), Err(DecodeError::TrailingBytes(1)));
    }

    proptest! {
        /// Any byte string either decodes or fails cleanly; it never panics.
        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Request::decode(&body);
            let _ = Response::decode(&body);
        }

        /// Every prefix of a valid message is an error, never a different valid message.
        #[test]
        fn truncated_messages_fail(cut in 0usize..64) {
            for request in sample_requests() {
                let mut body = Vec::new();
                request.encode(&mut body);
                if cut < body.len() {
                    prop_assert!(Request::decode(&body[..cut]).is_err());
                }
            }
        }
    }
}
