//! Requests and responses, and their binary encoding.
//!
//! Every message body is a one-byte type tag followed by the message's fields in declaration
//! order (see [`crate::wire`]: each struct lists its fields once, and the tables of
//! [`Request`] and [`Response`] give each variant its tag). `docs/PROTOCOL.md` lists every
//! message; tags must never be renumbered within a protocol version.

use crate::attr::{ATTR_BYTES, FileKind};
use crate::codec::{DecodeError, Reader, Writer};
use crate::gmem::{
    ArrayLayout, ArrayOnly, BlockRange, CoFill, CoForward, CoGet, CoGrant, CoInvalidate, CoPut, GmemAlloc, GmemAtomic, GmemBarrier,
    GmemFree,
};
use crate::id::{ChunkIndex, ChunkKey, FileId, LeaseId, RenameToken};
use crate::wire::{Bytes, Wire};
use crate::{Attr, Errno, wire_enum, wire_struct};

/// First four bytes of a `Hello` body after its tag: "RNGF".
pub const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"RNGF");
/// Version of this protocol. A server refuses a `Hello` with another version.
pub const PROTOCOL_VERSION: u16 = 18;

impl Wire for Attr {
    const MIN_BYTES: usize = ATTR_BYTES;

    fn write(&self, w: &mut Writer) {
        w.raw(&self.to_bytes());
    }

    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Attr::from_bytes(&r.array()?))
    }
}

impl Wire for Errno {
    const MIN_BYTES: usize = 4;

    fn write(&self, w: &mut Writer) {
        w.i32(self.0);
    }

    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        match r.i32()? {
            code if code > 0 => Ok(Errno(code)),
            code => Err(DecodeError::InvalidValue { field: "errno", value: code as u64 }),
        }
    }
}

// ----- handshake ---------------------------------------------------------------------------------

/// Whom a request acts for: a user and their groups (see `access` for the rules).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}
crate::wire_struct!(Credentials { uid, gid, groups });

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
    /// Identifies the client process across its connections (random, drawn at start): the
    /// files it opens stay open while it has a connection to the server, and for a grace
    /// period after its last one closes.
    pub client_id: u64,
    /// How long the peer waits for an answer, in milliseconds (0: not said). A server does
    /// not begin a change of names for it once that time is nearly up: a request the client
    /// gave up on must not take effect after the client's later requests.
    pub timeout_ms: u32,
    /// The peer's wall clock when it sent the `Hello` (ns since the epoch): with it a server
    /// tells how long ago, by its own clock, a request stamped `time_ns` was sent.
    pub clock_ns: i64,
    /// Whom the peer's requests act for, unless a request says otherwise (`AsUser`).
    /// Servers take it on trust from a peer that proved it holds the secret (see
    /// docs/CONSISTENCY.md); another server's own requests act as root.
    pub credentials: Credentials,
}

impl Wire for Hello {
    const MIN_BYTES: usize = 4 + 2 + 4 + 4 + 8 + 1 + 1 + 8 + 4 + 8 + 3;

    fn write(&self, w: &mut Writer) {
        w.u32(HELLO_MAGIC).u16(self.version).bytes(&self.secret);
        w.u32(self.client_pid).u64(self.host_id).bool(self.from_server);
        self.memory_probe.write(w);
        w.u64(self.client_id).u32(self.timeout_ms).i64(self.clock_ns);
        self.credentials.write(w);
    }

    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        let magic = r.u32()?;
        if magic != HELLO_MAGIC {
            return Err(DecodeError::InvalidValue { field: "hello magic", value: magic as u64 });
        }
        Ok(Hello {
            version: r.u16()?,
            secret: Bytes::read(r)?.0,
            client_pid: r.u32()?,
            host_id: r.u64()?,
            from_server: r.bool()?,
            memory_probe: Wire::read(r)?,
            client_id: r.u64()?,
            timeout_ms: r.u32()?,
            clock_ns: r.i64()?,
            credentials: Wire::read(r)?,
        })
    }
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
wire_struct!(HelloReply { version, server_name, memory_access, memory_probe });

// ----- membership ---------------------------------------------------------------------------------

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
wire_struct!(Member { name, tcp_address, unix_path, host_id, pid, alive, incarnation });

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct MemberList {
    pub epoch: u64,
    /// How keys are placed, as `<scheme>/<hash>` (for example `modular/koyama`), so that
    /// clients place keys exactly as the servers do.
    pub placement: String,
    pub members: Vec<Member>,
}
wire_struct!(MemberList { epoch, placement, members });

impl MemberList {
    /// What gossip compares of two lists, in 64 bits: the placement and each member's name,
    /// incarnation and liveness (a member's address changes only with a new incarnation),
    /// whatever their order and the lists' epochs. Lists with equal digests merge into
    /// each other without a change (but for a collision, one in 2^64).
    pub fn digest(&self) -> u64 {
        let members = self.members.iter().fold(0u64, |sum, member| {
            let alive = [u8::from(member.alive)];
            let bytes = [member.name.as_bytes(), &member.incarnation.to_le_bytes(), &alive];
            // A sum of the members' hashes does not depend on their order.
            sum.wrapping_add(mix(fnv1a(&bytes)))
        });
        mix(fnv1a(&[self.placement.as_bytes()]) ^ members)
    }
}

/// The heartbeat's question to another server: is your member list the one with this
/// [`MemberList::digest`]? With the asker's epoch: lists that agree still agree on the
/// higher epoch (clients take a list only if its epoch is higher than theirs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberDigest {
    pub epoch: u64,
    pub digest: u64,
}
wire_struct!(MemberDigest { epoch, digest });

/// FNV-1a over the pieces in order, each followed by a zero byte (so that "ab","c" and
/// "a","bc" differ).
fn fnv1a(pieces: &[&[u8]]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for piece in pieces {
        for byte in piece.iter().chain(&[0]) {
            hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

/// A finaliser that spreads every input bit over the output (SplitMix64's).
fn mix(mut value: u64) -> u64 {
    value = (value ^ (value >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    value ^ (value >> 31)
}

// ----- names --------------------------------------------------------------------------------------

/// What an entry (a name) refers to: a file id and the file's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryRef {
    pub file: FileId,
    /// The `S_IF*` bits of the file's type.
    pub kind_bits: u32,
}
wire_struct!(EntryRef { file, kind_bits });

impl EntryRef {
    pub fn new(file: FileId, kind: FileKind) -> EntryRef {
        EntryRef { file, kind_bits: kind.mode_bits() }
    }

    pub fn kind(&self) -> Option<FileKind> {
        FileKind::from_mode(self.kind_bits)
    }

    pub fn is_dir(&self) -> bool {
        self.kind() == Some(FileKind::Directory)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Create {
    pub path: String,
    /// Type and permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Device number of a character or block device.
    pub rdev: u64,
    pub chunk_size: u32,
    pub time_ns: i64,
    /// Fail with EEXIST if the path exists (O_EXCL, mkdir, symlink, mknod).
    pub exclusive: bool,
    /// Cut an existing regular file to zero length (O_TRUNC).
    pub truncate: bool,
    /// The target, when creating a symbolic link.
    pub link_target: Option<String>,
    /// Register an open of the file for this client id (0: no open; see [`Opened`]).
    pub open_for: u64,
    /// `MAY_*` bits the caller needs on an existing regular file it opens (see `access`).
    pub access: u32,
}
wire_struct!(Create { path, mode, uid, gid, rdev, chunk_size, time_ns, exclusive, truncate, link_target, open_for, access });

impl Create {
    /// An exclusive create of `path` with owner 0:0 at time 0; adjust fields as needed.
    pub fn new(path: &str, mode: u32, chunk_size: u32) -> Create {
        Create {
            path: path.to_string(),
            mode,
            uid: 0,
            gid: 0,
            rdev: 0,
            chunk_size,
            time_ns: 0,
            exclusive: true,
            truncate: false,
            link_target: None,
            open_for: 0,
            access: 0,
        }
    }

    /// What later chunks of the new file are created with.
    pub fn template(&self) -> ChunkTemplate {
        ChunkTemplate { mode: self.mode, uid: self.uid, gid: self.gid, chunk_size: self.chunk_size, backend_len: 0 }
    }
}

/// The file a name refers to, with its attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lookup {
    pub path: String,
    /// Register an open of the file for this client id (0: no open), if the file's inode
    /// lives on the same server as its name (see [`Opened`]).
    pub open_for: u64,
    /// `MAY_*` bits the caller needs on the file if it is not a symbolic link (an open for
    /// reading or writing, a truncate); 0 for a plain lookup.
    pub access: u32,
}
wire_struct!(Lookup { path, open_for, access });

/// The answer to a `Create` or `Lookup`: the file's attributes, and whether an asked-for
/// open was registered (it is not when the file's inode lives on another server than its
/// name — a renamed or linked file: the client then sends `Open` to the inode's server).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Opened {
    pub attr: Attr,
    pub registered: bool,
}
wire_struct!(Opened { attr, registered });

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unlink {
    pub path: String,
    pub time_ns: i64,
}
wire_struct!(Unlink { path, time_ns });

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rmdir {
    pub path: String,
    pub time_ns: i64,
}
wire_struct!(Rmdir { path, time_ns });

/// `renameat2` flags.
pub struct RenameFlags;

impl RenameFlags {
    /// Fail with EEXIST instead of replacing the target.
    pub const NOREPLACE: u32 = 1;
    /// Swap the two names (both must exist).
    pub const EXCHANGE: u32 = 2;
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rename {
    pub from: String,
    pub to: String,
    pub time_ns: i64,
    /// [`RenameFlags`] bits.
    pub flags: u32,
}
wire_struct!(Rename { from, to, time_ns, flags });

/// A hard link: `to` becomes another name of the file named `from`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub from: String,
    pub to: String,
    pub time_ns: i64,
}
wire_struct!(Link { from, to, time_ns });

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkFile {
    pub file: FileId,
    pub to: String,
    pub time_ns: i64,
}
wire_struct!(LinkFile { file, to, time_ns });

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadDir {
    pub path: String,
    pub after: Option<String>,
    pub limit: u32,
}
wire_struct!(ReadDir { path, after, limit });

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
wire_struct!(FindFilter { newer_than_ns, size, name });

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Find {
    pub root: String,
    pub filter: FindFilter,
}
wire_struct!(Find { root, filter });

/// A path alone (server-to-server name requests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathOnly {
    pub path: String,
}
wire_struct!(PathOnly { path });

/// How `InstallEntry` treats an entry already at the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstallMode;

impl InstallMode {
    /// Replace what is there (a rename over a file).
    pub const REPLACE: u8 = 0;
    /// Fail with EEXIST if something is there (a hard link, `RENAME_NOREPLACE`).
    pub const NO_REPLACE: u8 = 1;
    /// The path must hold `expect` now, which is replaced (`RENAME_EXCHANGE`).
    pub const EXCHANGE: u8 = 2;
}

/// Server to server: make `path` refer to `entry`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstallEntry {
    pub path: String,
    pub entry: EntryRef,
    /// One of the [`InstallMode`] values.
    pub mode: u8,
    /// With [`InstallMode::EXCHANGE`]: the file the path must hold now.
    pub expect: FileId,
    /// A directory being renamed here: the target may be an empty directory, which is replaced
    /// (checked on every server).
    pub replace_empty_dir: bool,
    /// The lock token of the rename or link this step belongs to (it holds the name's lock,
    /// and passes a frozen directory rename's gate); 0: none.
    pub token: RenameToken,
}
wire_struct!(InstallEntry { path, entry, mode, expect, replace_empty_dir, token });

/// Server to server: remove the entry at `path` if it still refers to `expect`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoveEntry {
    pub path: String,
    pub expect: FileId,
    /// As in [`InstallEntry::token`].
    pub token: RenameToken,
}
wire_struct!(RemoveEntry { path, expect, token });

/// Server to server: take (or give back) the lock of a name for a rename or link. Taking it
/// answers what the name refers to now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameLock {
    pub path: String,
    pub token: RenameToken,
    pub acquire: bool,
}
wire_struct!(NameLock { path, token, acquire });

/// Cache mode, to a file's inode: the file's name `from` (if known) moved to `path` in the
/// backend (renamed into, within or out of the cached tree: `None`). A file with one name
/// is made there anew and all its data is flushed there again; a file with other names in
/// the cached tree gets `path` as another link in the backend (see the store's
/// `cache::links`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rebind {
    pub file: FileId,
    pub path: Option<String>,
    pub from: Option<String>,
}
wire_struct!(Rebind { file, path, from });

/// Cache mode, to a file's inode: the file's name `name` is being given to another file (a
/// rename over it). If the file has not made its own backend file there yet (a creation is
/// pending), it gives that up now — before the other file is bound to the path — so that its
/// creation can never land over the other file's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendName {
    pub file: FileId,
    pub name: String,
}
wire_struct!(BackendName { file, name });

/// Cache mode, to a file's inode: the file's name `from` becomes `to` (a rename within the
/// cached tree), and its backend file moves with it (one `rename` in the backend; no byte is
/// loaded or flushed again). Answered `Count`: 1 if it moved (or had nothing in the backend
/// yet, and will be made at `to`), 0 if this file cannot move that way (the rename then
/// takes the file's bytes along and makes it anew at `to`, as `Rebind` does).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendMove {
    pub file: FileId,
    pub from: String,
    pub to: String,
}
wire_struct!(BackendMove { file, from, to });

/// Server to server, failure detection's indirect probe (as in SWIM): a server whose own
/// pings to member `name` go unanswered asks others to ping it before it declares it dead,
/// so that a slow or broken path between two servers alone does not make one of them dead
/// for everybody. Answered `Done` if `name` answered within `timeout_ms`, ETIMEDOUT if not
/// (ENOENT: no such member).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeFor {
    pub name: String,
    pub timeout_ms: u32,
}
wire_struct!(ProbeFor { name, timeout_ms });

/// Where a file's data goes in the backend (the answer to `FlushPrepare`): the path, and
/// which backend file the inode made or found there (`dev`, `ino`; both 0: not known). A
/// flush writes only into that file: one found at the path that is another (the path was
/// given to another file, whose rename over this one is under way) is left alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendPlace {
    pub path: String,
    pub dev: u64,
    pub ino: u64,
}
wire_struct!(BackendPlace { path, dev, ino });

impl BackendPlace {
    /// The backend file's (device, inode), if known.
    pub fn identity(&self) -> Option<(u64, u64)> {
        (self.dev != 0 || self.ino != 0).then_some((self.dev, self.ino))
    }
}

/// Where a file's bytes are in the backend (the answer to `BackendOf`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendFileReply {
    pub path: String,
    pub len: u64,
}
wire_struct!(BackendFileReply { path, len });

/// Server to server, a step of a directory rename (see `docs/ARCHITECTURE.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subtree {
    /// Names the rename, so that a step repeated or arriving late is recognised.
    pub token: RenameToken,
    pub from: String,
    pub to: String,
    /// `RENAME_EXCHANGE`: the entries below `to` move below `from` at the same time.
    pub exchange: bool,
}
wire_struct!(Subtree { token, from, to, exchange });

/// An entry moved by a directory rename, at its new path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MovedEntry {
    pub path: String,
    pub entry: EntryRef,
}
wire_struct!(MovedEntry { path, entry });

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutEntries {
    pub token: RenameToken,
    pub entries: Vec<MovedEntry>,
}
wire_struct!(PutEntries { token, entries });

/// The cluster-wide lock directory renames take (held by one server; see `docs/ARCHITECTURE.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceLock {
    pub token: RenameToken,
    /// Take (true) or give back (false).
    pub acquire: bool,
}
wire_struct!(NamespaceLock { token, acquire });

// ----- files and chunks ---------------------------------------------------------------------------

/// What changed at a server after position `after` of its change log, leaving out the
/// changes `client` made itself (`Changes`, from a FUSE mount that lets the kernel cache long:
/// see `crates/server/src/changes.rs`). `epoch` names the log the position belongs to (0:
/// none yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChangesSince {
    pub epoch: u64,
    pub after: u64,
    pub client: u64,
}
wire_struct!(ChangesSince { epoch, after, client });

/// Answer to `Changes`: the files whose attributes or bytes changed and the names created
/// or removed (each once) after the position asked, up to position `last`, and the renames
/// made (in order); `complete` is false when the log no longer reaches back there (or is
/// another epoch's): then anything may have changed.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ChangeList {
    pub epoch: u64,
    pub last: u64,
    pub complete: bool,
    pub files: Vec<FileId>,
    pub names: Vec<String>,
    pub moves: Vec<NameMove>,
}
wire_struct!(ChangeList { epoch, last, complete, files, names, moves });

/// A rename made (and done): what was named `from` is named `to` (with `exchange`, and what
/// was named `to` is named `from`). A mount that holds the file by its old name follows it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct NameMove {
    pub from: String,
    pub to: String,
    pub exchange: bool,
}
wire_struct!(NameMove { from, to, exchange });

/// A file alone (requests to the file's inode, or broadcasts about it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileOnly {
    pub file: FileId,
}
wire_struct!(FileOnly { file });

/// An extended attribute of a file (`GetXattr`, `RemoveXattr`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XattrName {
    pub file: FileId,
    pub name: String,
    /// When the file changed (`RemoveXattr`: its ctime); 0 for `GetXattr`.
    pub time_ns: i64,
}
wire_struct!(XattrName { file, name, time_ns });

/// Sets an extended attribute; `flags` as `setxattr(2)`'s ([`XattrFlags`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetXattr {
    pub file: FileId,
    pub name: String,
    pub value: Bytes,
    pub flags: u32,
    pub time_ns: i64,
}
wire_struct!(SetXattr { file, name, value, flags, time_ns });

/// `setxattr(2)` flags.
pub struct XattrFlags;

impl XattrFlags {
    /// Fail with EEXIST if the attribute exists.
    pub const CREATE: u32 = 1;
    /// Fail with ENODATA if the attribute does not exist.
    pub const REPLACE: u32 = 2;
}

/// Limits of extended attributes (Linux's): name bytes, value bytes, and all names of a
/// file together (as `listxattr` returns them, NUL-terminated).
pub const XATTR_NAME_MAX: usize = 255;
pub const XATTR_VALUE_MAX: usize = 65536;
pub const XATTR_LIST_MAX: usize = 65536;

/// Entries of a directory changed (server to server): its mtime and ctime become `time_ns`
/// unless they are later already. By `path` to the directory's name server, which sends it
/// on by `file` (with an empty path) to the directory's inode. With `defer_for` (a server's
/// name), that server holds back its later touches of the directory until the inode's
/// server collects them (`CollectTouches`) — see `crates/server/src/dir_times.rs`.
/// `subdirectories`: how many subdirectories the directory gained (negative: lost) with
/// the change (its link count is 2 + its subdirectories); such a touch is never held back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirTouch {
    pub path: String,
    pub file: FileId,
    pub time_ns: i64,
    pub defer_for: String,
    pub subdirectories: i32,
}
wire_struct!(DirTouch { path, file, time_ns, defer_for, subdirectories });

/// A list of files (orphan-chunk reclaiming).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct FileList {
    pub files: Vec<FileId>,
}
wire_struct!(FileList { files });

/// An open of a file by a client (the id from the client's `Hello`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFile {
    pub file: FileId,
    pub client: u64,
}
wire_struct!(OpenFile { file, client });

/// What an advisory lock request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    /// Give the range back.
    Unlock,
    /// A shared (read) lock: others may read-lock the range too.
    Read,
    /// An exclusive (write) lock.
    Write,
}

impl Wire for LockKind {
    const MIN_BYTES: usize = 1;

    fn write(&self, w: &mut Writer) {
        w.u8(match self {
            LockKind::Unlock => 0,
            LockKind::Read => 1,
            LockKind::Write => 2,
        });
    }

    fn read(r: &mut Reader) -> Result<Self, DecodeError> {
        match r.u8()? {
            0 => Ok(LockKind::Unlock),
            1 => Ok(LockKind::Read),
            2 => Ok(LockKind::Write),
            value => Err(DecodeError::InvalidValue { field: "lock kind", value: u64::from(value) }),
        }
    }
}

/// An advisory lock (`fcntl` record locks, OFD locks, `flock`) on bytes `start..=end` of a
/// file (`end` `u64::MAX`: to the end of the file, however long it grows), held by `owner`
/// of `client` (a process, or an open file description for OFD locks and `flock`). Kept by
/// the file's inode server; see `crates/server/src/file_locks.rs`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileLock {
    pub file: FileId,
    pub client: u64,
    pub owner: u64,
    pub kind: LockKind,
    pub start: u64,
    pub end: u64,
    /// The process asking (reported by `F_GETLK`).
    pub pid: u32,
}
wire_struct!(FileLock { file, client, owner, kind, start, end, pid });

/// Room to reserve for bytes `offset..end` of a file (`fallocate`), at one server for the
/// chunks of the range it holds (chunks of `chunk_size` bytes): `bytes` is what those chunks
/// hold when full up to `end` (the sender computes it by placement); the server charges that
/// less what they store already, now, and uses it for their later growth. With `release` >
/// 0, the server gives that many bytes of the file's reservation back instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub file: FileId,
    pub offset: u64,
    pub end: u64,
    pub chunk_size: u32,
    pub bytes: u64,
    pub release: u64,
}
wire_struct!(Reservation { file, offset, end, chunk_size, bytes, release });

/// Where an append of `len` bytes to `file` goes, whose size the client found to be `size`
/// (`PlaceAppend`, to the file's inode: `O_APPEND` from several clients at once; answered
/// `Count`, the offset to write at).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendPlace {
    pub file: FileId,
    pub size: u64,
    pub len: u64,
}
wire_struct!(AppendPlace { file, size, len });

/// Files a client closes (sent with request id 0: no answer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Close {
    pub client: u64,
    pub files: Vec<FileId>,
}
wire_struct!(Close { client, files });

/// A change of a file's name count at its inode (`AddLink`, `DropLink`) at `time_ns`; in
/// cache mode, `name` is the name that appeared or went when it lies in the cached tree (the
/// backend gets or loses it as a hard link), `None` otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameCount {
    pub file: FileId,
    pub time_ns: i64,
    pub name: Option<String>,
}
wire_struct!(NameCount { file, time_ns, name });

impl NameCount {
    /// A change of the count alone (no name in the cached tree).
    pub fn new(file: FileId, time_ns: i64) -> NameCount {
        NameCount { file, time_ns, name: None }
    }
}

/// A file and a time: the explicit modification time its chunks must not pass
/// (`ClampChunkTimes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkCount {
    pub file: FileId,
    pub time_ns: i64,
}
wire_struct!(LinkCount { file, time_ns });

/// Where the bytes of a write come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteBytes {
    pub address: u64,
    pub len: u64,
}
wire_struct!(RemoteBytes { address, len });

wire_enum! {
    /// Where the bytes of a write come from.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum WriteSource {
        /// In the data section of this frame.
        0 => Inline,
        /// In the client's memory, for the server to pull with cross-memory attach (same host only).
        1 => Remote(RemoteBytes),
    }
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
wire_struct!(ChunkTemplate { mode, uid, gid, chunk_size, backend_len });

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    pub chunk: ChunkKey,
    /// Byte offset inside the chunk.
    pub offset: u64,
    pub source: WriteSource,
    pub template: ChunkTemplate,
    pub time_ns: i64,
}
wire_struct!(Write { chunk, offset, source, template, time_ns });

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Read {
    pub chunk: ChunkKey,
    /// Byte offset inside the chunk.
    pub offset: u64,
    pub len: u64,
    /// Ask for a [`Lease`] on the bytes instead of receiving them inline (same host only).
    pub lease: bool,
    /// Leases of earlier reads on this connection that the client is done with (piggybacked
    /// here to save a message; see `Request::Release`).
    pub release: Vec<LeaseId>,
    /// The caller's view of the file's `backend_len`, as in [`ChunkTemplate::backend_len`].
    pub backend_len: u64,
}
wire_struct!(Read { chunk, offset, len, lease, release, backend_len });

/// Bytes a server keeps unchanged in its memory until the client releases them, so that a
/// client on the same host can copy them itself with cross-memory attach (one copy, no socket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub id: LeaseId,
    /// Address of the first byte in the server process.
    pub address: u64,
    /// Bytes readable at `address`; the rest of the reply's length reads as zeros.
    pub stored: u64,
}
wire_struct!(Lease { id, address, stored });

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetChunkLen {
    pub chunk: ChunkKey,
    pub len: u64,
    pub template: ChunkTemplate,
    /// Cache mode, from the file's inode server coordinating a truncate: where the file's
    /// bytes are in the backend (taken as sent, so the chunk's server need not ask back).
    pub backend: Option<BackendFileReply>,
    /// A cut finished late (see [`RemoveChunks::cut_at_ns`]): a chunk changed after this
    /// time is left as it is.
    pub cut_at_ns: Option<i64>,
}
wire_struct!(SetChunkLen { chunk, len, template, backend, cut_at_ns });

/// File-level truncate, sent to the file's inode, which coordinates the other chunks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Truncate {
    pub file: FileId,
    pub size: u64,
    pub time_ns: i64,
}
wire_struct!(Truncate { file, size, time_ns });

/// Stop the server. `everyone`: every server of the cluster is being stopped (`ringfs stop`),
/// so it tells no other that it leaves — at the end of a job of N servers those goodbyes were
/// N² messages of N members each, over connections often opened just for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shutdown {
    pub everyone: bool,
}
wire_struct!(Shutdown { everyone });

/// Chunks of `file` up to `last_chunk` (at least 1) may exist from now on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MarkExtended {
    pub file: FileId,
    pub last_chunk: ChunkIndex,
}
wire_struct!(MarkExtended { file, last_chunk });

/// Remove this server's chunks of `file` with index >= `from_index` (at least 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoveChunks {
    pub file: FileId,
    pub from_index: ChunkIndex,
    /// A truncate's cut finished after a server was down (by the inode's server, later):
    /// the time of the truncate. Chunks changed after it were written after the cut and are
    /// kept. `None`: every chunk from `from_index` goes.
    pub cut_at_ns: Option<i64>,
}
wire_struct!(RemoveChunks { file, from_index, cut_at_ns });

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetAttr {
    pub file: FileId,
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime_ns: Option<i64>,
    pub mtime_ns: Option<i64>,
    pub time_ns: i64,
    /// The times are values the caller chose (only the owner may set those), not "now"
    /// (which write permission allows).
    pub times_explicit: bool,
}
wire_struct!(SetAttr { file, mode, uid, gid, atime_ns, mtime_ns, time_ns, times_explicit });

impl SetAttr {
    /// A change of nothing but the ctime of `file` at `time_ns`; set the fields wanted.
    pub fn new(file: FileId, time_ns: i64) -> SetAttr {
        SetAttr { file, mode: None, uid: None, gid: None, atime_ns: None, mtime_ns: None, time_ns, times_explicit: false }
    }
}

// ----- cache mode ---------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sync {
    pub ticket: u64,
}
wire_struct!(Sync { ticket });

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadChunk {
    pub chunk: ChunkKey,
    pub backend_len: u64,
    /// As in [`SetChunkLen::backend`] (from a coordinating server; clients send `None`).
    pub backend: Option<BackendFileReply>,
    /// A rename takes the file's bytes along (cache mode): the chunk is marked dirty once
    /// loaded (also one that was here whole), so that no eviction drops its bytes before they
    /// are flushed at the file's new place.
    pub keep: bool,
}
wire_struct!(LoadChunk { chunk, backend_len, backend, keep });

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    pub leases: Vec<LeaseId>,
}
wire_struct!(Release { leases });

/// A request acting for another user (see `Request::AsUser`): the inner request travels
/// encoded, so that decoding never recurses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsUser {
    pub credentials: Credentials,
    pub body: Bytes,
}
wire_struct!(AsUser { credentials, body });

impl AsUser {
    pub fn new(credentials: Credentials, request: &Request) -> AsUser {
        let mut body = Vec::new();
        request.encode(&mut body);
        AsUser { credentials, body: Bytes(body) }
    }

    /// The inner request (EPROTO-worthy if it is malformed or itself an `AsUser`).
    pub fn request(&self) -> Result<Request, DecodeError> {
        match Request::decode(&self.body.0)? {
            Request::AsUser(_) => Err(DecodeError::InvalidValue { field: "nested AsUser", value: 64 }),
            request => Ok(request),
        }
    }
}

wire_enum! {
    /// Everything a client or a peer server can ask a server.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub enum Request {
        /// First frame on every connection.
        1 => Hello(Hello),
        2 => GetMembers,
        /// A new server announces itself; the reply is the member list including it.
        3 => Join(Member),
        /// Server to server: a newer member list.
        4 => PushMembers(MemberList),
        /// Server to server, each heartbeat: is your list the one with this digest? If so
        /// `Count` (the receiver's epoch, raised to the asker's if lower), `Members` (the
        /// receiver's list) if not.
        8 => MemberDigest(MemberDigest),
        5 => Ping,
        6 => Stats,
        /// Stop the server (graceful, like SIGTERM).
        7 => Shutdown(Shutdown),
        /// Create a file, directory, link or special file (its entry and its inode), or open
        /// an existing file (`exclusive` false). To the owner of the path.
        10 => Create(Create),
        /// The file a path names, with its attributes. To the owner of the path.
        11 => Lookup(Lookup),
        /// Remove a name of a file, link or special file. To the owner of the path.
        12 => Unlink(Unlink),
        /// Remove an empty directory. To the owner of the path.
        13 => Rmdir(Rmdir),
        /// Rename, also of directories, with `renameat2` flags. To the owner of `from`.
        14 => Rename(Rename),
        /// A new name for an existing file. To the owner of `from`.
        15 => Link(Link),
        /// One page of the entries of a directory that this server holds (broadcast).
        16 => ReadDir(ReadDir),
        /// Count this server's entries under `root` and those matching `filter` (broadcast).
        17 => Find(Find),
        /// Server to server: is `path` an existing directory? (parent checks)
        20 => LookupDir(PathOnly),
        /// Server to server: forget cached knowledge of directory `path` and report whether
        /// this server holds any entry inside it.
        21 => PrepareRmdir(PathOnly),
        /// Server to server: make a path refer to a file (renames, links).
        22 => InstallEntry(InstallEntry),
        /// Server to server: remove an entry if it still refers to a given file.
        23 => RemoveEntry(RemoveEntry),
        /// Server to server: take or give back the namespace lock (directory renames).
        24 => NamespaceLock(NamespaceLock),
        /// Server to server: hold off changes under two directories (a directory rename).
        25 => Freeze(Subtree),
        /// Server to server: move this server's entries under `from` to their new owners.
        26 => MoveSubtree(Subtree),
        /// Server to server: store entries moved here by a directory rename.
        27 => PutEntries(PutEntries),
        /// Server to server: let changes under the frozen directories go on.
        28 => Thaw(Subtree),
        /// Server to server: take or give back the lock of a name (renames, links).
        29 => NameLock(NameLock),
        /// The attributes of a file (its inode). To the inode's server.
        30 => Stat(FileOnly),
        /// Register an open of a file for a client. To the inode's server.
        31 => Open(OpenFile),
        /// Files the client closes. Sent with request id 0: no response.
        32 => Close(Close),
        33 => SetAttr(SetAttr),
        /// File-level truncate. To the inode's server, which coordinates the other chunks.
        34 => Truncate(Truncate),
        /// Raise chunk 0's bound on the file's chunks (`Attr::last_chunk`) to at least an
        /// index, before a write reaches chunks up to it. To the inode's server.
        35 => MarkExtended(MarkExtended),
        /// Server to server: one more name of a file.
        36 => AddLink(NameCount),
        /// Server to server: one name fewer of a file (it goes when none is left and nobody
        /// has it open).
        37 => DropLink(NameCount),
        /// Make this server's chunks of a file durable (broadcast; `dir` store).
        38 => Fsync(FileOnly),
        /// This server's highest chunk index (>= 1) of the file, with that chunk's length (to
        /// the owners of the chunks the file's `Attr::last_chunk` bounds).
        39 => LastChunk(FileOnly),
        /// Remove this server's chunks of a file from an index on (to the owners of those
        /// chunks).
        40 => RemoveChunks(RemoveChunks),
        41 => Write(Write),
        42 => Read(Read),
        /// Set the logical length of one chunk (creating it empty if needed).
        43 => SetChunkLen(SetChunkLen),
        /// Ends leases granted by `Read` replies. Sent with request id 0: no response.
        44 => Release(Release),
        /// Server to server, from a file's inode after an explicit modification time was
        /// set: the chunks of the file held here keep no later time (so the file's mtime,
        /// the newest of its inode and chunks, reads as set until the next write).
        45 => ClampChunkTimes(LinkCount),
        /// Cache mode: flush what was dirty when the sync began. `ticket` 0 begins a sync; the
        /// answer says how much of it is left, and the caller repeats with the ticket it got
        /// until nothing is (each answer comes within about a second).
        50 => Sync(Sync),
        /// Server to server, before flushing a chunk of a file: apply the pending backend
        /// operation of the file's inode and say where in the backend its bytes go.
        51 => FlushPrepare(FileOnly),
        /// One page of the backend directory behind `path` (to the owner of `path`).
        52 => ReadBackendDir(ReadDir),
        /// Load a chunk from the backend into the store (stage-in).
        53 => LoadChunk(LoadChunk),
        /// Where a file's bytes are in the backend (asked of the file's inode before a chunk
        /// holding backend data is read or changed).
        54 => BackendOf(FileOnly),
        /// Server to server, to a file's inode: the file's new place in the backend.
        55 => Rebind(Rebind),
        /// Server to server (broadcast): mark this server's chunks of a file dirty (its backend
        /// file changed; everything is flushed there again).
        56 => Redirty(FileOnly),
        /// A new name `to` for a file known by id (FUSE links the inode the kernel holds,
        /// whatever its names are now); to the owner of `to`.
        57 => LinkFile(LinkFile),
        /// Server to server, to the server of these files' inodes: which of them have no
        /// inode there (their chunks elsewhere are orphans, left by a write that raced a
        /// removal or by an aborted request). Answered with `Files`.
        58 => MissingFiles(FileList),
        /// An extended attribute's value (answered with `Value`). To the inode's server.
        59 => GetXattr(XattrName),
        /// Set an extended attribute (answered with the file's `Attr`). To the inode's server.
        60 => SetXattr(SetXattr),
        /// The names of a file's extended attributes (answered with `Names`).
        61 => ListXattrs(FileOnly),
        /// Remove an extended attribute. To the inode's server.
        62 => RemoveXattr(XattrName),
        /// Server to server: a directory's entries changed (its times follow).
        63 => TouchDir(DirTouch),
        /// The request in `body`, acting for `credentials` instead of the connection's (the
        /// FUSE mount acts for each caller; a server forwarding a client's request keeps
        /// whom it acts for). Never nested.
        64 => AsUser(AsUser),
        /// Server to server (broadcast): a directory's mode or owner changed; forget what
        /// was remembered of it for permission checks.
        65 => ForgetDirAttrs(FileOnly),
        /// Server to server, from a directory's inode server to a server holding back
        /// touches of it: hand them over (answered with `TouchTime`) and stop holding back.
        66 => CollectTouches(FileOnly),
        /// Take, change or give back an advisory lock, at the file's inode server:
        /// `Done`, or EAGAIN when another owner's lock conflicts (the caller waits by asking
        /// again).
        67 => SetLock(FileLock),
        /// Whether the lock could be taken: answered with `LockHolder` (the first conflicting
        /// lock, or none).
        68 => TestLock(FileLock),
        /// Reserve room for a file's bytes on this server (answered with `Count`: the bytes
        /// reserved), or give a reservation back; ENOSPC, with nothing reserved, when they do
        /// not fit.
        69 => Reserve(Reservation),
        /// Global memory (`crates/gmem`): a rank's part in a collective allocation, at the
        /// job's coordinator (`GmemArray` once every rank asked, EAGAIN before).
        70 => GmemAlloc(GmemAlloc),
        /// Server to server, from the coordinator: an array exists / is gone.
        71 => GmemDefine(ArrayLayout),
        72 => GmemDrop(ArrayOnly),
        /// Bytes of a block, at its home (answered `Count` with the bytes in the data
        /// section).
        73 => GmemRead(BlockRange),
        /// Bytes into a block (the data section), at its home (`Done`).
        74 => GmemWrite(BlockRange),
        75 => GmemAtomic(GmemAtomic),
        /// A rank at a barrier, at the job's coordinator (`Done` once all are, EAGAIN before).
        76 => GmemBarrier(GmemBarrier),
        /// A rank frees an array (collective; the coordinator drops it everywhere once every
        /// rank has; `Done`).
        77 => GmemFree(GmemFree),
        /// Bytes of a block lent to a client on the server's host (answered `Read` with a
        /// lease, released like a read's; or with the bytes, as `GmemRead`, otherwise).
        78 => GmemLease(BlockRange),
        /// The caches' coherence protocol (`coherence`): a rank's cache to a home.
        79 => CoGet(CoGet),
        80 => CoPut(CoPut),
        /// A home to a rank's cache.
        81 => CoForward(CoForward),
        82 => CoInvalidate(CoInvalidate),
        /// A rank's cache to another's: a block's bytes (the data section), forwarded on a
        /// home's behalf. Answered `Done`.
        83 => CoFill(CoFill),
        /// Server to server, to a file's inode, before a rename gives the file's name to
        /// another file (cache mode): give up a pending backend creation there. Answered
        /// `Count` (1: given up, to be made again if the rename fails; 0: nothing pending).
        84 => YieldBackendName(BackendName),
        /// What other clients changed here since a position of this server's change log
        /// (answered with `ChangeList`).
        85 => Changes(ChangesSince),
        /// Server to server: ping a member for the asker (failure detection; `Done` if it
        /// answered in time).
        86 => ProbeFor(ProbeFor),
        /// Server to server, to a file's inode (cache mode): move the file's backend file
        /// with a rename of one of its names (answered `Count`: 1 moved, 0 cannot).
        87 => MoveBackendFile(BackendMove),
        /// Server to server, to the server of a name (cache mode), before a rename moves a
        /// backend file there: a removal of the name still to be applied to the backend is
        /// applied now (`Done`; EBUSY while a directory rename holds the path), so that it
        /// cannot land after the move and take the moved file away.
        88 => SettleBackendName(PathOnly),
        /// To a file's inode: where an append goes — after every append placed before it,
        /// or at the size its client found, whichever is later (answered `Count`: the
        /// offset; `crates/server/src/appends.rs`).
        89 => PlaceAppend(AppendPlace),
    }
}

/// Where a request goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route<'a> {
    /// To the owner of this path's entry.
    Path(&'a str),
    /// To the owner of this chunk of a file (index 0: the file's inode).
    Chunk(ChunkKey),
    /// Answered by whichever server receives it.
    Here,
}

impl Request {
    /// Appends the encoded body of this request to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.write(&mut Writer::new(out));
    }

    /// Decodes a request body. Every byte must belong to the message.
    pub fn decode(body: &[u8]) -> Result<Request, DecodeError> {
        crate::wire::decode_whole(body)
    }

    /// Requests only servers send each other (membership, coordination of names and renames,
    /// link counts, cache-mode flushing). A server refuses them from client sessions: a
    /// client that sent one — by a bug — could change the member list or hold a lock.
    pub fn only_from_servers(&self) -> bool {
        matches!(
            self,
            Request::Join(_)
                | Request::PushMembers(_)
                | Request::MemberDigest(_)
                | Request::LookupDir(_)
                | Request::PrepareRmdir(_)
                | Request::InstallEntry(_)
                | Request::RemoveEntry(_)
                | Request::NameLock(_)
                | Request::NamespaceLock(_)
                | Request::Freeze(_)
                | Request::MoveSubtree(_)
                | Request::PutEntries(_)
                | Request::Thaw(_)
                | Request::AddLink(_)
                | Request::DropLink(_)
                | Request::RemoveChunks(_)
                | Request::SetChunkLen(_)
                | Request::FlushPrepare(_)
                | Request::BackendOf(_)
                | Request::Rebind(_)
                | Request::YieldBackendName(_)
                | Request::MoveBackendFile(_)
                | Request::SettleBackendName(_)
                | Request::Redirty(_)
                | Request::ClampChunkTimes(_)
                | Request::MissingFiles(_)
                | Request::TouchDir(_)
                | Request::ForgetDirAttrs(_)
                | Request::CollectTouches(_)
                | Request::GmemDefine(_)
                | Request::GmemDrop(_)
                | Request::ProbeFor(_)
        )
    }

    /// When the client sent this change (of names, or of a file's bytes or length), by its
    /// clock (the `time_ns` it stamps on it); `None` for other requests. A server does not
    /// begin such a change once the client has stopped waiting for it.
    pub fn client_time_ns(&self) -> Option<i64> {
        match self {
            Request::Write(write) => Some(write.time_ns),
            Request::Truncate(truncate) => Some(truncate.time_ns),
            Request::Create(create) => Some(create.time_ns),
            Request::Unlink(unlink) => Some(unlink.time_ns),
            Request::Rmdir(rmdir) => Some(rmdir.time_ns),
            Request::Rename(rename) => Some(rename.time_ns),
            Request::Link(link) => Some(link.time_ns),
            Request::LinkFile(link) => Some(link.time_ns),
            _ => None,
        }
    }

    /// Where this request must be executed; a server that does not own the key forwards it.
    pub fn route(&self) -> Route<'_> {
        let file = |file: &FileId| Route::Chunk(ChunkKey::inode(*file));
        match self {
            Request::Create(create) => Route::Path(&create.path),
            Request::Lookup(lookup) => Route::Path(&lookup.path),
            Request::Unlink(unlink) => Route::Path(&unlink.path),
            Request::Rmdir(rmdir) => Route::Path(&rmdir.path),
            Request::Rename(rename) => Route::Path(&rename.from),
            Request::Link(link) => Route::Path(&link.from),
            Request::LinkFile(link) => Route::Path(&link.to),
            Request::LookupDir(request) => Route::Path(&request.path),
            Request::InstallEntry(install) => Route::Path(&install.path),
            Request::RemoveEntry(remove) => Route::Path(&remove.path),
            Request::ReadBackendDir(request) => Route::Path(&request.path),
            Request::NameLock(lock) => Route::Path(&lock.path),
            Request::Open(open) => file(&open.file),
            Request::PlaceAppend(place) => file(&place.file),
            Request::MarkExtended(request) => file(&request.file),
            Request::Stat(request) | Request::FlushPrepare(request) | Request::BackendOf(request) | Request::ListXattrs(request) => {
                file(&request.file)
            }
            Request::GetXattr(request) | Request::RemoveXattr(request) => file(&request.file),
            Request::SetXattr(request) => file(&request.file),
            Request::TouchDir(touch) if touch.path.is_empty() => file(&touch.file),
            Request::TouchDir(touch) => Route::Path(&touch.path),
            Request::Rebind(rebind) => file(&rebind.file),
            Request::YieldBackendName(name) => file(&name.file),
            Request::MoveBackendFile(moved) => file(&moved.file),
            Request::SettleBackendName(request) => Route::Path(&request.path),
            Request::SetLock(lock) | Request::TestLock(lock) => file(&lock.file),
            Request::SetAttr(set) => file(&set.file),
            Request::Truncate(truncate) => file(&truncate.file),
            Request::AddLink(count) | Request::DropLink(count) => file(&count.file),
            Request::Write(write) => Route::Chunk(write.chunk),
            Request::Read(read) => Route::Chunk(read.chunk),
            Request::SetChunkLen(set) => Route::Chunk(set.chunk),
            Request::LoadChunk(load) => Route::Chunk(load.chunk),
            Request::Hello(_)
            | Request::GetMembers
            | Request::Join(_)
            | Request::PushMembers(_)
            | Request::MemberDigest(_)
            | Request::Ping
            | Request::Stats
            | Request::Shutdown(_)
            | Request::ReadDir(_)
            | Request::Find(_)
            | Request::PrepareRmdir(_)
            | Request::NamespaceLock(_)
            | Request::Freeze(_)
            | Request::MoveSubtree(_)
            | Request::PutEntries(_)
            | Request::Thaw(_)
            | Request::Close(_)
            | Request::Fsync(_)
            | Request::LastChunk(_)
            | Request::RemoveChunks(_)
            | Request::Release(_)
            | Request::Redirty(_)
            | Request::ClampChunkTimes(_)
            | Request::MissingFiles(_)
            | Request::Sync(_)
            | Request::AsUser(_)
            | Request::ForgetDirAttrs(_)
            | Request::CollectTouches(_)
            | Request::Reserve(_)
            | Request::GmemAlloc(_)
            | Request::GmemDefine(_)
            | Request::GmemDrop(_)
            | Request::GmemRead(_)
            | Request::GmemWrite(_)
            | Request::GmemAtomic(_)
            | Request::GmemBarrier(_)
            | Request::GmemFree(_)
            | Request::GmemLease(_)
            | Request::CoGet(_)
            | Request::CoPut(_)
            | Request::CoForward(_)
            | Request::CoInvalidate(_)
            | Request::CoFill(_)
            | Request::Changes(_)
            | Request::ProbeFor(_) => Route::Here,
        }
    }

    /// Every path this request names (each is validated before the request is executed).
    pub fn paths(&self) -> Vec<&str> {
        match self {
            Request::Create(create) => vec![&create.path],
            Request::Lookup(lookup) => vec![&lookup.path],
            Request::Unlink(unlink) => vec![&unlink.path],
            Request::Rmdir(rmdir) => vec![&rmdir.path],
            Request::Rename(rename) => vec![&rename.from, &rename.to],
            Request::Link(link) => vec![&link.from, &link.to],
            Request::LinkFile(link) => vec![&link.to],
            Request::ReadDir(request) | Request::ReadBackendDir(request) => vec![&request.path],
            Request::Find(find) => vec![&find.root],
            Request::LookupDir(request) | Request::PrepareRmdir(request) => vec![&request.path],
            Request::InstallEntry(install) => vec![&install.path],
            Request::RemoveEntry(remove) => vec![&remove.path],
            Request::NameLock(lock) => vec![&lock.path],
            Request::TouchDir(touch) if !touch.path.is_empty() => vec![&touch.path],
            Request::Rebind(rebind) => rebind.path.iter().chain(&rebind.from).map(String::as_str).collect(),
            Request::YieldBackendName(name) => vec![&name.name],
            Request::MoveBackendFile(moved) => vec![&moved.from, &moved.to],
            Request::SettleBackendName(request) => vec![&request.path],
            Request::AddLink(count) | Request::DropLink(count) => count.name.iter().map(String::as_str).collect(),
            Request::Freeze(subtree) | Request::MoveSubtree(subtree) | Request::Thaw(subtree) => vec![&subtree.from, &subtree.to],
            Request::PutEntries(put) => put.entries.iter().map(|entry| entry.path.as_str()).collect(),
            _ => Vec::new(),
        }
    }
}

// ----- responses ----------------------------------------------------------------------------------

/// One entry of a directory listing: the name, what it refers to, and the file's attributes
/// when the server holding the name also holds the file's inode (otherwise the client asks
/// the inode's server).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub entry: EntryRef,
    pub attr: Option<Attr>,
}
wire_struct!(DirEntry { name, entry, attr });

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct DirPage {
    pub entries: Vec<DirEntry>,
    /// More entries follow after the last one returned.
    pub more: bool,
    /// Cache mode: names in the same range whose removal has not reached the backend yet;
    /// the backend listing must not show them.
    pub removed: Vec<String>,
}
wire_struct!(DirPage { entries, more, removed });

/// A server's knowledge of the chunks (index >= 1) of one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TailSummary {
    /// Highest chunk index held, with that chunk's length.
    pub last: Option<(ChunkIndex, u64)>,
    /// Latest modification time among the chunks held (0 if none).
    pub newest_mtime_ns: i64,
}
wire_struct!(TailSummary { last, newest_mtime_ns });

/// One server's answer to `Find`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct FindResult {
    /// Entries under the root held here (all of them count, as `find` visits them).
    pub scanned: u64,
    /// Entries that match every criterion.
    pub matched: u64,
    /// Files that match by name but whose size or time this server cannot judge alone (its
    /// inode lives elsewhere, or chunks after chunk 0 do): the client checks them with a stat.
    pub undecided: Vec<String>,
}
wire_struct!(FindResult { scanned, matched, undecided });

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
wire_struct!(CacheStats {
    backend,
    mount_path,
    policy,
    dirty_chunks,
    dirty_bytes,
    pending_entries,
    flushed_chunks,
    flushed_bytes,
    loaded_chunks,
    evicted_chunks,
    written_through_bytes,
    flushing,
    longest_stop_us,
});

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ServerStats {
    pub name: String,
    pub entries: u64,
    pub chunks: u64,
    pub bytes: u64,
    pub capacity_bytes: u64,
    pub requests: u64,
    pub forwarded: u64,
    /// Files whose last name is gone but which some client still has open.
    pub open_unlinked: u64,
    /// Present when the server caches a backend directory (boxed: most messages are small).
    pub cache: Option<Box<CacheStats>>,
    /// Present when the server holds global-memory blocks.
    pub gmem: Option<GmemStats>,
    /// How this server reaches the other servers where its transport can say (UCX: the
    /// lanes UCX chose); empty over TCP and Unix sockets.
    pub peer_transports: Vec<PeerTransport>,
}
wire_struct!(ServerStats {
    name,
    entries,
    chunks,
    bytes,
    capacity_bytes,
    requests,
    forwarded,
    open_unlinked,
    cache,
    gmem,
    peer_transports
});

/// The transports of a server's connection to another server, as its transport describes
/// them (UCX: `tcp/ib0 (am, rma)`, `rc_mlx5/mlx5_0:1 (am, rma)`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PeerTransport {
    /// The other server's name.
    pub server: String,
    pub transports: String,
}
wire_struct!(PeerTransport { server, transports });

/// A server's global memory: blocks in DRAM, blocks spilled, SSD traffic since it started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct GmemStats {
    pub dram_bytes: u64,
    pub spilled_bytes: u64,
    pub ssd_read_bytes: u64,
    pub ssd_write_bytes: u64,
}
wire_struct!(GmemStats { dram_bytes, spilled_bytes, ssd_read_bytes, ssd_write_bytes });

/// Result of a `Read`: the chunk's attributes (`None` if the chunk does not exist), how many
/// bytes the read yields, and where they are: in the data section, or in a lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadReply {
    pub attr: Option<Attr>,
    pub len: u64,
    pub lease: Option<Lease>,
}
wire_struct!(ReadReply { attr, len, lease });

/// Result of `PrepareRmdir`: whether entries inside are held here, and the names inside
/// whose removal has not reached the backend yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HasEntries {
    pub any: bool,
    pub removed: Vec<String>,
}
wire_struct!(HasEntries { any, removed });

/// Result of `Sync`: the sync's ticket, and the chunks and entries of it not flushed yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncProgress {
    pub ticket: u64,
    pub remaining: u64,
}
wire_struct!(SyncProgress { ticket, remaining });

wire_enum! {
    /// What a server answers. Errors carry an errno; every other variant answers particular
    /// requests (see `docs/PROTOCOL.md`).
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub enum Response {
        128 => Error(Errno),
        129 => Done,
        130 => Hello(HelloReply),
        131 => Members(MemberList),
        132 => Attr(Attr),
        /// Result of `Create` and `Lookup`.
        133 => Opened(Opened),
        /// Result of a `Write`: the chunk's logical length after it.
        134 => Written(u64),
        135 => Read(ReadReply),
        136 => Count(u64),
        /// Result of `LastChunk`: this server's part of a file after chunk 0.
        137 => Tail(TailSummary),
        138 => Found(FindResult),
        139 => DirPage(DirPage),
        140 => HasEntries(HasEntries),
        141 => SyncProgress(SyncProgress),
        /// Result of `InstallEntry` and `RemoveEntry`: the entry that was there, if any.
        142 => Replaced(Option<EntryRef>),
        143 => Stats(ServerStats),
        /// Result of `FlushPrepare`: where in the backend the file's bytes go (`None`: the
        /// file has no name there any more; its data is not flushed).
        144 => BackendTarget(Option<BackendPlace>),
        /// Result of `BackendOf`.
        145 => BackendFile(Option<BackendFileReply>),
        /// Result of `MissingFiles`.
        146 => Files(FileList),
        /// Result of `GetXattr`.
        147 => Value(Bytes),
        /// Result of `ListXattrs`.
        148 => Names(Vec<String>),
        /// Result of `TouchDir`: the directory's file id.
        149 => DirTouched(FileId),
        /// Result of `CollectTouches`: the latest touch held back (0: none).
        150 => TouchTime(i64),
        /// Result of `TestLock`: a lock in the way (none: the lock could be taken).
        151 => LockHolder(Option<FileLock>),
        /// Result of `GmemAlloc`: the array.
        152 => GmemArray(ArrayLayout),
        /// Result of `CoGet`.
        153 => CoGrant(CoGrant),
        154 => ChangeList(ChangeList),
    }
}

impl Response {
    /// Appends the encoded body of this response to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.write(&mut Writer::new(out));
    }

    /// Decodes a response body. Every byte must belong to the message.
    pub fn decode(body: &[u8]) -> Result<Response, DecodeError> {
        crate::wire::decode_whole(body)
    }
}

// Test scaffolding (feature `testing`): a sample of every message and a mutator for fuzzers.
#[cfg(any(test, feature = "testing"))]
pub mod mutate;
#[cfg(any(test, feature = "testing"))]
pub mod samples;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
