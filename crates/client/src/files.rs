//! Open files: the fd table, and reading and writing by chunks.
//!
//! An open file is its file id: every read and write goes to the file's chunks, whatever
//! happens to its names meanwhile — a file renamed over, or unlinked, while open stays
//! readable and writable through the descriptor (its inode's server keeps it until the last
//! close, see `ringfs-server`'s open registry). A read or write is cut into per-chunk pieces
//! ([`crate::chunking`]); the requests for all pieces go out before any answer is awaited, so
//! the servers work on them in parallel.

use ringfs_sync::Mutex;
use std::io::SeekFrom;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ringfs_proto::access::{MAY_READ, MAY_WRITE};
use ringfs_proto::{
    Attr, ChunkIndex, ChunkKey, ChunkTemplate, Errno, FileId, FileKind, FileOnly, Lookup, MarkExtended, OpenFile as OpenRequest, Opened,
    Read, RemoteBytes, Request, Response, Write, WriteSource,
};
use ringfs_rpc::{Connection, Reply};

use crate::chunking::{Piece, pieces};
use crate::links::MAX_SYMLINK_HOPS;
use crate::{Client, FALLOC_FL_KEEP_SIZE, Fd, OpenFlags, Result, Stat, now_ns};

/// Pieces at least this large move by cross-memory attach on same-host connections; smaller
/// ones are cheaper inline (fewer system calls).
const DIRECT_COPY_THRESHOLD: usize = 32 * 1024;
/// Times an open looks its name up again when the file it found went meanwhile.
const OPEN_ATTEMPTS: usize = 16;

pub(crate) struct OpenFile {
    /// The path the file was opened by (its name may change or go; the file stays).
    pub path: String,
    pub file: FileId,
    pub chunk_size: u64,
    pub template: ChunkTemplate,
    pub(crate) readable: bool,
    pub(crate) writable: bool,
    append: bool,
    position: Mutex<u64>,
    /// The bound on the file's chunks its inode is known to carry (`Attr::last_chunk`: it
    /// only rises, so a write below it need not raise it again).
    last_chunk: AtomicU64,
    /// The open is registered at the file's inode server (its close ends it there); not for
    /// a descriptor opened beside another ([`Client::open_beside`]).
    registered: bool,
}

impl OpenFile {
    /// The bound on the file's chunks its inode is known to carry.
    fn known_last_chunk(&self) -> ChunkIndex {
        ChunkIndex(self.last_chunk.load(Ordering::Relaxed))
    }

    /// The inode carries at least `bound` (the known bound only rises).
    fn learn_last_chunk(&self, bound: ChunkIndex) {
        self.last_chunk.fetch_max(bound.0, Ordering::Relaxed);
    }
}

/// The bound a write reaching chunk `last` asks the inode for: the power of two at or above
/// it, so that a file written from start to end raises it once per doubling (a log of its
/// chunk count), and its size is asked of at most twice the servers its chunks need.
fn bound_covering(last: ChunkIndex) -> ChunkIndex {
    ChunkIndex(last.0.checked_next_power_of_two().unwrap_or(u64::MAX))
}

/// The fd table. Fds are small integers, reused after close (the FUSE mount keeps one open
/// for every file the kernel holds: a free slot is found without a scan).
#[derive(Default)]
pub(crate) struct FileTable {
    slots: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    files: Vec<Option<Arc<OpenFile>>>,
    /// The empty slots of `files`.
    free: Vec<u32>,
}

impl FileTable {
    fn insert(&self, file: OpenFile) -> Fd {
        let mut slots = self.slots.lock();
        let file = Some(Arc::new(file));
        match slots.free.pop() {
            Some(free) => {
                slots.files[free as usize] = file;
                Fd(free)
            }
            None => {
                slots.files.push(file);
                Fd(slots.files.len() as u32 - 1)
            }
        }
    }

    fn get(&self, fd: Fd) -> Result<Arc<OpenFile>> {
        let slots = self.slots.lock();
        slots.files.get(fd.0 as usize).and_then(Option::clone).ok_or(Errno::EBADF)
    }

    fn remove(&self, fd: Fd) -> Result<Arc<OpenFile>> {
        let mut slots = self.slots.lock();
        let file = slots.files.get_mut(fd.0 as usize).and_then(Option::take).ok_or(Errno::EBADF)?;
        slots.free.push(fd.0);
        Ok(file)
    }
}

impl Client {
    pub(crate) fn file(&self, fd: Fd) -> Result<Arc<OpenFile>> {
        self.inner.files.get(fd)
    }

    /// Opens (and with [`OpenFlags::CREATE`], creates) a file. `mode` gives the permissions
    /// of a new file. Symbolic links are followed.
    pub fn open(&self, path: &str, flags: OpenFlags, mode: u32) -> Result<Fd> {
        self.open_with_stat(path, flags, mode).map(|(fd, _)| fd)
    }

    /// [`Client::open`], also returning the attributes of the opened file (without a
    /// separate stat: a create or open already brings them).
    pub fn open_with_stat(&self, path: &str, flags: OpenFlags, mode: u32) -> Result<(Fd, Stat)> {
        // A file whose inode lives on another server than its name is opened in two steps:
        // its name, then its inode. If the file lost its name and went in between, the open
        // comes after the change that replaced it: look the name up again.
        for _ in 0..OPEN_ATTEMPTS {
            match self.try_open(path, flags, mode) {
                Err(Errno::ESTALE) => continue,
                outcome => return outcome,
            }
        }
        Err(Errno::ESTALE)
    }

    fn try_open(&self, path: &str, flags: OpenFlags, mode: u32) -> Result<(Fd, Stat)> {
        let mut path = ringfs_proto::path::canonicalize(path)?;
        let writable = flags.contains(OpenFlags::WRITE);
        let client = self.inner.client_id;
        // What the servers check the caller may do with an existing file.
        let access = if flags.contains(OpenFlags::READ) { MAY_READ } else { 0 }
            | if writable || flags.contains(OpenFlags::TRUNCATE) { MAY_WRITE } else { 0 };
        for _ in 0..MAX_SYMLINK_HOPS {
            let opened = if flags.contains(OpenFlags::CREATE) {
                self.create_entry(
                    &path,
                    FileKind::Regular.mode_bits() | (mode & 0o7777),
                    flags.contains(OpenFlags::EXCLUSIVE),
                    flags.contains(OpenFlags::TRUNCATE) && writable,
                    None,
                    0,
                    client,
                    access,
                )?
            } else {
                self.lookup_opened(&path, client, access)?
            };
            self.registered_with(&opened);
            let attr = opened.attr;
            if attr.is_symlink() {
                path = self.follow_link(&path)?;
                continue;
            }
            if attr.is_dir() && writable {
                return Err(Errno::EISDIR);
            }
            if !opened.registered && attr.is_regular() {
                // The file's inode lives on another server than its name: register there.
                self.register_open(attr.file_id)?;
            }
            let truncate_now = !flags.contains(OpenFlags::CREATE) && flags.contains(OpenFlags::TRUNCATE) && writable && attr.is_regular();
            let fd = self.insert_open(path, &attr, flags);
            if truncate_now && let Err(errno) = self.truncate_file(attr.file_id, 0) {
                let _ = self.close(fd);
                return Err(errno);
            }
            let stat = if truncate_now { Stat::from_attr(&attr, 0) } else { self.stat_from_attr(&attr)? };
            return Ok((fd, stat));
        }
        Err(Errno::ELOOP)
    }

    /// Looks `path` up (no symlink following) and opens the regular file it names, neither
    /// for reading nor for writing: the descriptor keeps the file alive like any open until
    /// it is closed, and other opens of the file can be made beside it without asking a
    /// server ([`Client::open_beside`]). FUSE's kernel holds an inode from its lookup until
    /// it forgets it, and may open it in between. Returns the attributes and the descriptor
    /// (regular files only).
    pub fn lookup_held(&self, path: &str) -> Result<(Stat, Option<Fd>)> {
        let path = ringfs_proto::path::canonicalize(path)?;
        for _ in 0..OPEN_ATTEMPTS {
            let opened = self.lookup_opened(&path, self.inner.client_id, 0)?;
            self.registered_with(&opened);
            let attr = opened.attr;
            if !attr.is_regular() {
                return Ok((self.stat_from_attr(&attr)?, None));
            }
            if !opened.registered {
                match self.register_open(attr.file_id) {
                    Err(Errno::ESTALE) => continue,
                    outcome => outcome?,
                };
            }
            let fd = self.insert_open(String::new(), &attr, OpenFlags::default());
            return match self.stat_from_attr(&attr) {
                Ok(stat) => Ok((stat, Some(fd))),
                Err(errno) => {
                    let _ = self.close(fd);
                    Err(errno)
                }
            };
        }
        Err(Errno::ESTALE)
    }

    /// Opens the file of `held` (an open descriptor of this client) again with `flags`,
    /// without asking a server for anything but the truncation `flags` may ask for: the new
    /// descriptor reads and writes the same file, and relies on `held` to keep the file
    /// alive (the caller keeps `held` open at least as long). What the servers would check
    /// at an open (permissions) the caller has checked.
    pub fn open_beside(&self, held: Fd, flags: OpenFlags) -> Result<Fd> {
        let held = self.file(held)?;
        let fd = self.inner.files.insert(OpenFile {
            path: String::new(),
            file: held.file,
            chunk_size: held.chunk_size,
            template: held.template,
            readable: flags.contains(OpenFlags::READ),
            writable: flags.contains(OpenFlags::WRITE),
            append: flags.contains(OpenFlags::APPEND),
            position: Mutex::new(0),
            last_chunk: AtomicU64::new(held.known_last_chunk().0),
            registered: false,
        });
        if flags.contains(OpenFlags::TRUNCATE)
            && flags.contains(OpenFlags::WRITE)
            && let Err(errno) = self.truncate_file(held.file, 0)
        {
            let _ = self.close(fd);
            return Err(errno);
        }
        Ok(fd)
    }

    /// Whether closing `fd` ends an open registered at the file's inode server (not for a
    /// descriptor opened beside another): such a descriptor can keep the file alive for
    /// others opened beside it.
    pub fn registers_open(&self, fd: Fd) -> bool {
        self.file(fd).is_ok_and(|file| file.registered)
    }

    /// Opens a file by its id (FUSE opens by inode number): registers the open at its inode.
    pub fn open_file(&self, file: FileId, flags: OpenFlags) -> Result<Fd> {
        let attr = self.register_open(file)?;
        if attr.is_dir() && flags.contains(OpenFlags::WRITE) {
            self.unregister_open(file);
            return Err(Errno::EISDIR);
        }
        let fd = self.insert_open(String::new(), &attr, flags);
        if flags.contains(OpenFlags::TRUNCATE)
            && flags.contains(OpenFlags::WRITE)
            && attr.is_regular()
            && let Err(errno) = self.truncate_file(file, 0)
        {
            // The open fails: its descriptor and its registration go.
            let _ = self.close(fd);
            return Err(errno);
        }
        Ok(fd)
    }

    fn insert_open(&self, path: String, attr: &Attr, flags: OpenFlags) -> Fd {
        self.inner.files.insert(OpenFile {
            template: ChunkTemplate {
                mode: attr.mode,
                uid: attr.uid,
                gid: attr.gid,
                chunk_size: attr.chunk_size,
                backend_len: attr.backend_len,
            },
            chunk_size: attr.chunk_size.max(1) as u64,
            file: attr.file_id,
            readable: flags.contains(OpenFlags::READ),
            writable: flags.contains(OpenFlags::WRITE),
            append: flags.contains(OpenFlags::APPEND),
            position: Mutex::new(0),
            last_chunk: AtomicU64::new(attr.last_chunk.0),
            path,
            registered: !attr.file_id.is_root(),
        })
    }

    /// The file a path names (no symlink following), registering an open for `open_for` (0:
    /// none) where the name's server holds the inode. ESTALE from the server means the file
    /// went between reading the name and reaching the file (the name was replaced): the name
    /// is read again.
    pub(crate) fn lookup_opened(&self, path: &str, open_for: u64, access: u32) -> Result<Opened> {
        let request = self.for_caller(Request::Lookup(Lookup { path: path.to_string(), open_for, access }));
        for _ in 0..OPEN_ATTEMPTS {
            match self.inner.cluster.call_path_owner(path, &request) {
                Err(Errno::ESTALE) => continue,
                Ok(Response::Opened(opened)) => return Ok(opened),
                Ok(_) => return Err(Errno::EPROTO),
                Err(errno) => return Err(errno),
            }
        }
        Err(Errno::ESTALE)
    }

    /// Registers an open of `file` at its inode's server; the file's attributes.
    fn register_open(&self, file: FileId) -> Result<Attr> {
        let request = Request::Open(OpenRequest { file, client: self.inner.client_id });
        match self.inner.cluster.call_home(file, &request)? {
            Response::Attr(attr) => {
                self.inner.cluster.connections().hold();
                Ok(attr)
            }
            _ => Err(Errno::EPROTO),
        }
    }

    /// Notes an open a server registered along with a lookup or create.
    fn registered_with(&self, opened: &Opened) {
        if opened.registered {
            self.inner.cluster.connections().hold();
        }
    }

    /// Ends an open of `file` at its inode's server (one-way: no round trip).
    fn unregister_open(&self, file: FileId) {
        self.inner.closes.close(&self.inner.cluster, self.inner.client_id, file);
        self.inner.cluster.connections().release();
    }

    /// Creates (or truncates) a regular file for writing, like `creat(2)`.
    pub fn create(&self, path: &str, mode: u32) -> Result<Fd> {
        self.open(path, OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::TRUNCATE, mode)
    }

    /// Closes a file. The file's inode server hears of it without the caller waiting, within
    /// a few milliseconds (closes go out in batches: see `closes.rs`).
    pub fn close(&self, fd: Fd) -> Result<()> {
        let file = self.inner.files.remove(fd)?;
        if file.registered {
            self.unregister_open(file.file);
        }
        Ok(())
    }

    /// Makes the file's data and name durable on every server that holds them: with the
    /// `dir` store, their chunk files and name journals are fsynced before this returns (the
    /// `mem` store has nothing durable: it returns at once; see docs/CONSISTENCY.md).
    pub fn fsync(&self, fd: Fd) -> Result<()> {
        let file = self.file(fd)?;
        self.fsync_named(&file, &file.path)
    }

    /// [`Client::fsync`] of a descriptor opened by id whose name the caller knows (the FUSE
    /// mount: the path it last saw the file at), so that the server of that name syncs
    /// rather than every server.
    pub fn fsync_at(&self, fd: Fd, path: &str) -> Result<()> {
        let file = self.file(fd)?;
        self.fsync_named(&file, if file.path.is_empty() { path } else { &file.path })
    }

    fn fsync_named(&self, file: &OpenFile, path: &str) -> Result<()> {
        let request = Request::Fsync(FileOnly { file: file.file });
        let cluster = &self.inner.cluster;
        // Without a name, the name's server is not known: every server syncs.
        if path.is_empty() {
            return cluster.broadcast(&request).map(drop);
        }
        // The servers of the file's chunks (the inode's first) and of its name, whose
        // journal holds the name.
        let last_chunk = file.known_last_chunk().max(self.stat_file(file.file)?.last_chunk);
        let mut servers = cluster.owners_of_chunks(file.file, ChunkIndex::FIRST, last_chunk);
        let name_server = cluster.owner_of_path(path);
        if !servers.iter().any(|server| server.name == name_server.name) {
            servers.push(name_server);
        }
        cluster.call_each(&servers, &request).map(drop)
    }

    /// Makes the names recorded so far durable on every server (and `file`'s chunks): what
    /// `fsync` of a directory asks — its entries are spread over all servers.
    pub fn fsync_everywhere(&self, file: FileId) -> Result<()> {
        self.inner.cluster.broadcast(&Request::Fsync(FileOnly { file })).map(drop)
    }

    /// Writes at the current position (at the end with [`OpenFlags::APPEND`]).
    pub fn write(&self, fd: Fd, bytes: &[u8]) -> Result<usize> {
        let file = self.file(fd)?;
        let mut position = file.position.lock();
        let (offset, written) = if file.append { self.append(&file, bytes)? } else { (*position, self.write_at(&file, bytes, *position)?) };
        *position = offset + written as u64;
        Ok(written)
    }

    /// Appends `bytes` through `fd` (whatever flags it was opened with): at the file's end,
    /// after every other client's append placed before (the file's inode server places it:
    /// `crates/server/src/appends.rs`), so that appends from several nodes at once never
    /// overwrite each other. Where they went, and how many were written.
    pub fn append_to(&self, fd: Fd, bytes: &[u8]) -> Result<(u64, usize)> {
        self.append(&*self.file(fd)?, bytes)
    }

    fn append(&self, file: &OpenFile, bytes: &[u8]) -> Result<(u64, usize)> {
        let size = self.file_size(file.file)?;
        let place = Request::PlaceAppend(ringfs_proto::AppendPlace { file: file.file, size, len: bytes.len() as u64 });
        let offset = match self.inner.cluster.call_home(file.file, &place)? {
            Response::Count(offset) => offset,
            _ => return Err(Errno::EPROTO),
        };
        Ok((offset, self.write_at(file, bytes, offset)?))
    }

    /// Reads at the current position.
    pub fn read(&self, fd: Fd, buffer: &mut [u8]) -> Result<usize> {
        let file = self.file(fd)?;
        let mut position = file.position.lock();
        let count = self.read_at(&file, buffer, *position)?;
        *position += count as u64;
        Ok(count)
    }

    /// Writes at `offset` — or, on a descriptor opened with [`OpenFlags::APPEND`], at the
    /// end, as Linux's `pwrite(2)` does (and as the FUSE mount needs: the kernel sends an
    /// append at the end it last knew of).
    pub fn pwrite(&self, fd: Fd, bytes: &[u8], offset: u64) -> Result<usize> {
        let file = self.file(fd)?;
        if file.append {
            return self.append(&file, bytes).map(|(_, written)| written);
        }
        self.write_at(&file, bytes, offset)
    }

    pub fn pread(&self, fd: Fd, buffer: &mut [u8], offset: u64) -> Result<usize> {
        self.read_at(&*self.file(fd)?, buffer, offset)
    }

    /// Moves the position; returns the new one.
    pub fn seek(&self, fd: Fd, to: SeekFrom) -> Result<u64> {
        let file = self.file(fd)?;
        let mut position = file.position.lock();
        let target = match to {
            SeekFrom::Start(offset) => Some(offset),
            SeekFrom::Current(delta) => position.checked_add_signed(delta),
            SeekFrom::End(delta) => self.file_size(file.file)?.checked_add_signed(delta),
        };
        *position = target.ok_or(Errno::EINVAL)?;
        Ok(*position)
    }

    pub fn fstat(&self, fd: Fd) -> Result<Stat> {
        let file = self.file(fd)?;
        let attr = self.stat_file(file.file)?;
        self.stat_from_attr(&attr)
    }

    pub fn ftruncate(&self, fd: Fd, size: u64) -> Result<()> {
        let file = self.file(fd)?;
        if !file.writable {
            return Err(Errno::EINVAL);
        }
        self.truncate_file(file.file, size)
    }

    /// `fallocate(2)` of `len` bytes at `offset` (`mode` 0 or [`FALLOC_FL_KEEP_SIZE`]): the
    /// servers that will hold the range reserve the room for it now, so later writes into it
    /// do not fail with ENOSPC (docs/CONSISTENCY.md); ENOSPC at once, with nothing reserved,
    /// when one lacks it. Then the file grows to cover the range (not with `KEEP_SIZE`),
    /// reading as zeros where nothing was written. Other modes (punching holes, zeroing,
    /// collapsing ranges): EOPNOTSUPP.
    pub fn fallocate(&self, fd: Fd, mode: u32, offset: u64, len: u64) -> Result<()> {
        if len == 0 {
            return Err(Errno::EINVAL);
        }
        if mode & !FALLOC_FL_KEEP_SIZE != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        let end = offset.checked_add(len).filter(|end| *end <= i64::MAX as u64).ok_or(Errno::EFBIG)?;
        let file = self.file(fd)?;
        if !file.writable {
            return Err(Errno::EBADF);
        }
        let stat = self.fstat(fd)?;
        self.reserve_room(file.file, stat.chunk_size, offset, end)?;
        if mode & FALLOC_FL_KEEP_SIZE == 0 && end > stat.size {
            self.truncate_file(file.file, end)?;
        }
        Ok(())
    }

    /// Reserves room for bytes `offset..end` of `file` on every server that holds chunks of
    /// the range (`Reserve`, to those servers at once): each charges now what its chunks do
    /// not store yet. If one has no room, the others give theirs back and the answer is
    /// ENOSPC.
    fn reserve_room(&self, file: FileId, chunk_size: u32, offset: u64, end: u64) -> Result<()> {
        /// Most chunks one `fallocate` may span (4 TiB of 1 MiB chunks).
        const MOST_CHUNKS: u64 = 1 << 22;
        let cluster = &self.inner.cluster;
        let size = u64::from(chunk_size.max(1));
        let (first, last) = (ChunkIndex::of_offset(offset, size), ChunkIndex::last_of(end, size));
        if first.count_through(last) > MOST_CHUNKS {
            return Err(Errno::EFBIG);
        }
        // What each server's chunks of the range hold when full up to `end`.
        let mut bytes_by_member: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
        for index in first.through(last) {
            let full = index.len_below(end, size);
            *bytes_by_member.entry(cluster.owner_of_chunk(ChunkKey::new(file, index)).name).or_default() += full;
        }
        let members: Vec<_> =
            cluster.member_list().members.into_iter().filter(|member| bytes_by_member.contains_key(&member.name)).collect();
        let connections = members.iter().map(|member| cluster.connection(member)).collect::<Result<Vec<_>>>()?;
        let reservation = ringfs_proto::Reservation { file, offset, end, chunk_size, bytes: 0, release: 0 };
        let calls: Vec<_> = connections
            .iter()
            .zip(&members)
            .map(|(connection, member)| {
                let bytes = bytes_by_member[&member.name];
                connection.start(&Request::Reserve(ringfs_proto::Reservation { bytes, ..reservation }), &[], None)
            })
            .collect();
        let mut reserved = Vec::new();
        let mut failure = None;
        for (call, connection) in calls.into_iter().zip(&connections) {
            let answer = call.and_then(|call| call.wait()).map_err(|error| error.errno());
            match answer.map(|reply| reply.response) {
                Ok(Response::Count(bytes)) => reserved.push((connection, bytes)),
                Ok(Response::Error(errno)) | Err(errno) => failure = failure.or(Some(errno)),
                Ok(_) => failure = failure.or(Some(Errno::EPROTO)),
            }
        }
        let Some(errno) = failure else { return Ok(()) };
        for (connection, bytes) in reserved.into_iter().filter(|(_, bytes)| *bytes > 0) {
            let release = ringfs_proto::Reservation { release: bytes, ..reservation };
            if let Err(error) = connection.call(&Request::Reserve(release), &[]) {
                log::debug!("a reservation of {bytes} bytes was not given back: {error}");
            }
        }
        Err(errno)
    }

    fn write_at(&self, file: &OpenFile, bytes: &[u8], offset: u64) -> Result<usize> {
        if !file.writable {
            return Err(Errno::EBADF);
        }
        if bytes.is_empty() {
            return Ok(0);
        }
        offset.checked_add(bytes.len() as u64).ok_or(Errno::EFBIG)?;
        let cluster = &self.inner.cluster;
        let pieces: Vec<Piece> = pieces(offset, bytes.len(), file.chunk_size).collect();
        // Past the bound the inode carries, the write raises it first (with the pieces).
        let raise_to = pieces.last().map(|last| last.index).filter(|&last| last > file.known_last_chunk()).map(bound_covering);
        let connections = pieces
            .iter()
            .map(|piece| cluster.connection(&cluster.owner_of_chunk(ChunkKey::new(file.file, piece.index))))
            .collect::<Result<Vec<_>>>()?;
        let head_connection =
            if raise_to.is_some() { Some(cluster.connection(&cluster.owner_of_chunk(ChunkKey::inode(file.file)))?) } else { None };

        let time_ns = now_ns();
        let mark = head_connection.as_ref().zip(raise_to).map(|(connection, last_chunk)| {
            let request = Request::MarkExtended(MarkExtended { file: file.file, last_chunk });
            (connection, connection.start(&request, &[], None))
        });
        let calls: Vec<_> = pieces
            .iter()
            .zip(&connections)
            .map(|(piece, connection)| {
                let piece_bytes = &bytes[piece.buffer_offset..piece.buffer_offset + piece.len];
                let direct = piece.len >= DIRECT_COPY_THRESHOLD && connection.server_reads_our_memory();
                let (source, inline) = if direct {
                    (WriteSource::Remote(RemoteBytes { address: piece_bytes.as_ptr() as u64, len: piece.len as u64 }), &[][..])
                } else {
                    (WriteSource::Inline, piece_bytes)
                };
                let request = Request::Write(Write {
                    chunk: ChunkKey::new(file.file, piece.index),
                    offset: piece.offset_in_chunk,
                    source,
                    template: file.template,
                    time_ns,
                });
                (connection, connection.start(&request, inline, None))
            })
            .collect();
        let mut outcome = Ok(bytes.len());
        if let Some((connection, call)) = mark {
            match cluster.finish(connection, call).map(|reply| reply.response) {
                Ok(Response::Count(bound)) => file.learn_last_chunk(ChunkIndex(bound)),
                Ok(_) => outcome = Err(Errno::EPROTO),
                Err(errno) => outcome = Err(errno),
            }
        }
        for (connection, call) in calls {
            if let Err(errno) = cluster.finish(connection, call) {
                outcome = outcome.and(Err(errno));
            }
        }
        outcome
    }

    fn read_at(&self, file: &OpenFile, buffer: &mut [u8], offset: u64) -> Result<usize> {
        if !file.readable {
            return Err(Errno::EBADF);
        }
        if buffer.is_empty() {
            return Ok(0);
        }
        if file.known_last_chunk().is_first() && offset + buffer.len() as u64 > file.chunk_size {
            // As far as we know the file is chunk 0 alone: ask only chunk 0's server (the
            // servers of later chunks may be down, and hold nothing of this file). Its answer
            // tells whether the file grew past chunk 0 since it was opened.
            if let Some(count) = self.read_head_only(file, buffer, offset)? {
                return Ok(count);
            }
        }
        self.read_pieces(file, buffer, offset)
    }

    /// Reads a file that was chunk 0 alone when last seen, asking only chunk 0's server.
    /// `None` if the file has chunks after chunk 0 now (the caller reads them all).
    fn read_head_only(&self, file: &OpenFile, buffer: &mut [u8], offset: u64) -> Result<Option<usize>> {
        let (count, head) = if offset >= file.chunk_size {
            (0, self.stat_file(file.file)?)
        } else {
            let in_head = (file.chunk_size - offset) as usize;
            match self.read_pieces_with_head(file, &mut buffer[..in_head], offset)? {
                (count, Some(head)) => (count, head),
                (_, None) => return Err(Errno::EPROTO),
            }
        };
        // The bound is raised before any later chunk is written, and never lowered.
        file.learn_last_chunk(head.last_chunk);
        Ok((!head.is_extended()).then_some(count))
    }

    fn read_pieces(&self, file: &OpenFile, buffer: &mut [u8], offset: u64) -> Result<usize> {
        self.read_pieces_with_head(file, buffer, offset).map(|(count, _)| count)
    }

    /// Reads every piece of the range at once; returns the bytes read and, if chunk 0 was
    /// among the pieces, its attributes.
    fn read_pieces_with_head(&self, file: &OpenFile, buffer: &mut [u8], offset: u64) -> Result<(usize, Option<ringfs_proto::Attr>)> {
        let cluster = &self.inner.cluster;
        let pieces: Vec<Piece> = pieces(offset, buffer.len(), file.chunk_size).collect();
        let connections = pieces
            .iter()
            .map(|piece| cluster.connection(&cluster.owner_of_chunk(ChunkKey::new(file.file, piece.index))))
            .collect::<Result<Vec<_>>>()?;
        let mut slices = split_by_pieces(buffer, &pieces);

        let calls: Vec<_> = pieces
            .iter()
            .zip(&connections)
            .zip(slices.iter_mut())
            .map(|((piece, connection), slice)| {
                let lease = piece.len >= DIRECT_COPY_THRESHOLD && connection.server_memory().is_some();
                let request = Request::Read(Read {
                    chunk: ChunkKey::new(file.file, piece.index),
                    offset: piece.offset_in_chunk,
                    len: piece.len as u64,
                    lease,
                    release: cluster.take_releases(connection.server_name()),
                    backend_len: file.template.backend_len,
                });
                connection.start(&request, &[], Some(&mut **slice))
            })
            .collect();
        let replies: Vec<Result<Reply>> =
            calls.into_iter().zip(&connections).map(|(call, connection)| cluster.finish(connection, call)).collect();

        // Copy leased bytes; the servers release them with the next read.
        let mut received = vec![0usize; pieces.len()];
        let mut failure = None;
        let mut head = None;
        for (position, reply) in replies.into_iter().enumerate() {
            let outcome = reply.and_then(|reply| match reply.response {
                Response::Read(ringfs_proto::ReadReply { len, lease, attr }) => {
                    if pieces[position].index.is_first() {
                        head = attr;
                    }
                    let slice = &mut slices[position][..len as usize];
                    if let Some(lease) = lease {
                        let copied = copy_lease(&connections[position], lease, slice);
                        cluster.defer_releases(&connections[position], vec![lease.id]);
                        copied?;
                    }
                    Ok(len as usize)
                }
                _ => Err(Errno::EPROTO),
            });
            match outcome {
                Ok(len) => received[position] = len,
                Err(errno) => failure = failure.or(Some(errno)),
            }
        }
        if let Some(errno) = failure {
            return Err(errno);
        }
        if received.iter().zip(&pieces).all(|(got, piece)| *got == piece.len) {
            return Ok((buffer.len(), head));
        }
        // A short piece is either the end of the file or a hole: the file size tells. A file
        // that is only chunk 0 (most small files) has its size in the chunk 0 just read.
        let size = match head {
            Some(head) if !head.is_extended() => head.len.max(head.backend_len),
            _ => self.file_size(file.file)?,
        };
        let end = size.min(offset + buffer.len() as u64);
        if end <= offset {
            return Ok((0, head));
        }
        let valid = (end - offset) as usize;
        for (piece, got) in pieces.iter().zip(received) {
            let hole_start = piece.buffer_offset + got;
            let hole_end = (piece.buffer_offset + piece.len).min(valid);
            if hole_start < hole_end {
                buffer[hole_start..hole_end].fill(0);
            }
        }
        Ok((valid, head))
    }

    /// The attributes of a file (its inode), by id.
    pub(crate) fn stat_file(&self, file: FileId) -> Result<Attr> {
        match self.inner.cluster.call_home(file, &Request::Stat(FileOnly { file }))? {
            Response::Attr(attr) => Ok(attr),
            _ => Err(Errno::EPROTO),
        }
    }

    /// The size of a file.
    pub(crate) fn file_size(&self, file: FileId) -> Result<u64> {
        let attr = self.stat_file(file)?;
        Ok(self.stat_from_attr(&attr)?.size)
    }

    /// A file's `stat` given its inode's attributes. Size and modification time come from
    /// chunk 0 alone, unless chunks after it may exist: then the servers of chunks 1 to the
    /// inode's bound report their part of the file, and the largest end and the newest time
    /// win.
    pub(crate) fn stat_from_attr(&self, attr: &Attr) -> Result<Stat> {
        // Cache mode: bytes of the file no chunk holds yet are in the backend, up to backend_len.
        let mut stat = Stat::from_attr(attr, attr.len.max(attr.backend_len));
        if !attr.is_regular() || !attr.is_extended() {
            return Ok(stat);
        }
        let cluster = &self.inner.cluster;
        let servers = cluster.owners_of_chunks(attr.file_id, ChunkIndex::FIRST.next(), attr.last_chunk);
        let answers = cluster.call_each(&servers, &Request::LastChunk(FileOnly { file: attr.file_id }))?;
        let chunk_size = attr.chunk_size as u64;
        for answer in answers {
            let Response::Tail(tail) = answer else { return Err(Errno::EPROTO) };
            if let Some((index, len)) = tail.last {
                // A size past what a u64 holds is a server's mistake, not a file.
                let end = index.checked_first_byte(chunk_size).and_then(|start| start.checked_add(len)).ok_or(Errno::EPROTO)?;
                stat.size = stat.size.max(end);
            }
            stat.mtime_ns = stat.mtime_ns.max(tail.newest_mtime_ns);
        }
        Ok(stat)
    }
}

/// Cuts `buffer` into the disjoint slices the pieces address.
fn split_by_pieces<'a>(buffer: &'a mut [u8], pieces: &[Piece]) -> Vec<&'a mut [u8]> {
    let mut slices = Vec::with_capacity(pieces.len());
    let mut rest = buffer;
    for piece in pieces {
        let (head, tail) = std::mem::take(&mut rest).split_at_mut(piece.len);
        slices.push(head);
        rest = tail;
    }
    slices
}

/// Copies a leased range out of the server (the rest of `destination` is zeros).
fn copy_lease(connection: &Connection, lease: ringfs_proto::Lease, destination: &mut [u8]) -> Result<()> {
    let stored = (lease.stored as usize).min(destination.len());
    let memory = connection.server_memory().ok_or(Errno::EPROTO)?;
    let (data, zeros) = destination.split_at_mut(stored);
    memory.read_bytes(lease.address, data).map_err(|error| {
        log::warn!("copying leased bytes failed: {error}");
        Errno::EIO
    })?;
    zeros.fill(0);
    Ok(())
}
