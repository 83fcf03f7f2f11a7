//! Chunk I/O at the chunk's server: reads (inline, or leased to a client on this host),
//! writes (inline, or copied straight out of a client on this host), cuts and loads of one
//! chunk, and in cache mode where the file's bytes are in the backend.

use std::mem::MaybeUninit;
use std::sync::Arc;

use ringfs_proto::{
    BackendFileReply, ChunkKey, Errno, FileId, Lease, LoadChunk, Read, ReadReply, Request, Response, SetChunkLen, Write, WriteSource,
};
use ringfs_rpc::memory::ProcessMemory;
use ringfs_store::{BackendFile, ByteSource, StoreError};

use crate::deadline::past_request_deadline;
use crate::files::Files;
use crate::name_locks::LEASE;
use crate::node::{MAX_CHUNK_SIZE, Node, store_errno};
use crate::session::Session;

/// Copies a write's bytes straight out of a client process on this host.
struct RemoteSource {
    memory: ProcessMemory,
    address: u64,
    remaining: usize,
}

impl ByteSource for RemoteSource {
    fn len(&self) -> usize {
        self.remaining
    }

    fn read_into(&mut self, destination: &mut [MaybeUninit<u8>]) -> Result<(), Errno> {
        if destination.len() > self.remaining {
            return Err(Errno::EINVAL);
        }
        self.memory.read(self.address, destination).map_err(|_| Errno::EFAULT)?;
        self.address += destination.len() as u64;
        self.remaining -= destination.len();
        Ok(())
    }
}

/// The chunks this server holds: their reads and writes.
pub struct Data {
    node: Arc<Node>,
    files: Arc<Files>,
}

impl Data {
    pub fn new(node: Arc<Node>, files: Arc<Files>) -> Data {
        Data { node, files }
    }

    /// `Write`. A write its client stopped waiting for is not begun: the client's next
    /// requests (a truncation, another write) may already have been answered, and landing
    /// after them would mix versions of the file.
    pub fn write_request(&self, session: &Session, write: &Write, data: &[u8]) -> Result<Response, Errno> {
        if past_request_deadline() {
            return Err(Errno::ETIMEDOUT);
        }
        self.across_backend_moves(write.chunk.file, |_| self.write(session, write, data))
    }

    /// `Read` (releasing the leases it names first).
    pub fn read_request(&self, session: &mut Session, read: &Read, reply_data: &mut Vec<u8>) -> Result<Response, Errno> {
        session.release(&read.release);
        let kept = reply_data.len();
        self.across_backend_moves(read.chunk.file, |_| {
            reply_data.truncate(kept);
            self.read(session, read, reply_data)
        })
    }

    /// `Truncate` at the inode's server (not begun once its client stopped waiting: see
    /// [`Data::write_request`]).
    pub fn truncate(&self, truncate: &ringfs_proto::Truncate) -> Result<Response, Errno> {
        if past_request_deadline() {
            return Err(Errno::ETIMEDOUT);
        }
        self.across_backend_moves(truncate.file, |_| self.files.truncate(truncate.file, truncate.size, truncate.time_ns))
    }

    /// `SetChunkLen`: the last chunk of a truncated file is cut (or grown) here.
    pub fn set_chunk_len(&self, session: &Session, set: &SetChunkLen) -> Result<Response, Errno> {
        self.across_backend_moves(set.chunk.file, |attempt| {
            check_template(&set.template)?;
            if set.len > MAX_CHUNK_SIZE as u64 {
                return Err(Errno::EINVAL);
            }
            let backend = match &set.backend {
                Some(sent) if session.from_server && attempt == 0 => Some(BackendFile { path: sent.path.clone(), len: sent.len }),
                _ => self.backend_for(set.chunk, set.template.backend_len)?,
            };
            let attr =
                self.node.store.set_chunk_len(set.chunk, set.len, set.template, 0, backend.as_ref(), set.cut_at_ns).map_err(store_errno)?;
            Ok(Response::Attr(attr))
        })
    }

    /// `LoadChunk` (cache mode): the chunk's bytes still in the backend are read into it.
    pub fn load_chunk(&self, session: &Session, load: &LoadChunk) -> Result<Response, Errno> {
        self.across_backend_moves(load.chunk.file, |attempt| {
            let backend = match &load.backend {
                Some(sent) if session.from_server && attempt == 0 => Some(BackendFile { path: sent.path.clone(), len: sent.len }),
                _ => self.backend_for(load.chunk, load.backend_len)?,
            };
            Ok(Response::Count(self.node.store.load_chunk(load.chunk, backend.as_ref(), load.keep).map_err(store_errno)?))
        })
    }

    /// `BackendOf`, at the inode's server: where the file's bytes are in the backend.
    pub fn backend_of(&self, file: FileId) -> Result<Response, Errno> {
        let backend = self.node.store.backend_file(file).map_err(store_errno)?;
        Ok(Response::BackendFile(backend.map(|backend| BackendFileReply { path: backend.path, len: backend.len })))
    }

    /// Cache mode: where the bytes of the file of `chunk` are in the backend, when the chunk
    /// needs it (it holds backend data or may); asked of the file's inode server. `None`
    /// otherwise.
    fn backend_for(&self, chunk: ChunkKey, backend_len_hint: u64) -> Result<Option<BackendFile>, Errno> {
        if !self.node.store.needs_backend(chunk, backend_len_hint) {
            return Ok(None);
        }
        self.backend_file_of(chunk.file)
    }

    /// Cache mode: where `file`'s bytes are in the backend, as its inode's server says.
    fn backend_file_of(&self, file: FileId) -> Result<Option<BackendFile>, Errno> {
        let home = self.node.owner_of_chunk(ChunkKey::inode(file));
        if self.node.is_self(&home) {
            return self.node.store.backend_file(file).map_err(store_errno);
        }
        match self.node.ask(&home, Request::BackendOf(ringfs_proto::FileOnly { file }))? {
            Response::BackendFile(reply) => Ok(reply.map(|reply| BackendFile { path: reply.path, len: reply.len })),
            _ => Err(Errno::EPROTO),
        }
    }

    /// Runs a data operation of `file` that may read or write the backend (`op` gets the
    /// attempt number). A directory rename in the cached tree moves backend files under
    /// running operations: one that found its backend file missing (ENOENT) or held (EBUSY)
    /// while a rename held backend paths here, or took or released them since it began, is
    /// tried again once no hold is left, asking the file's backend path anew. Bounded by the
    /// holds' lease. A file rename moves the file's backend file at its inode's server,
    /// which this server does not see: an operation that found its backend file missing is
    /// tried again, asking the inode's server anew where the file is, as long as the file
    /// has a place there ([`FILE_MOVE_RETRIES`] times at most: a backend file removed behind
    /// ringfs's back is reported as missing after some 50 ms).
    fn across_backend_moves<T>(&self, file: FileId, mut op: impl FnMut(u32) -> Result<T, Errno>) -> Result<T, Errno> {
        // (Nothing but one atomic load on the way of a request that succeeds.)
        let mut deadline = None;
        let mut attempt = 0;
        let mut retried_for_file_moves = 0;
        loop {
            let seen = self.node.store.backend_moves();
            match op(attempt) {
                Err(Errno::ENOENT)
                    if retried_for_file_moves < FILE_MOVE_RETRIES
                        && self.node.store.backend().is_some()
                        && self.has_backend_place(file) =>
                {
                    if retried_for_file_moves >= 3 {
                        // Renamed again and again: give the renames a moment.
                        crate::sched::pause(std::time::Duration::from_millis(1));
                    }
                    retried_for_file_moves += 1;
                    attempt += 1;
                }
                Err(errno @ (Errno::ENOENT | Errno::EBUSY)) => {
                    let deadline = *deadline.get_or_insert_with(|| crate::sched::now() + LEASE);
                    let moved = self.node.store.backend_held() || self.node.store.backend_moves() != seen;
                    if !moved || crate::sched::now() >= deadline {
                        return Err(errno);
                    }
                    while self.node.store.backend_held() && crate::sched::now() < deadline {
                        crate::sched::pause(std::time::Duration::from_millis(1));
                    }
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// Cache mode, after an operation of `file` found its backend file missing: whether it
    /// may have looked in the wrong place, that is whether the file still has a place in the
    /// backend (its inode's server is asked). Whether the file is there at this instant says
    /// nothing: a file renamed again and again moves on between the answer and a look at the
    /// backend, and back (the same name, another moment).
    fn has_backend_place(&self, file: FileId) -> bool {
        let place = self.backend_file_of(file).ok().flatten().map(|backend| backend.path);
        log::debug!("file {file} was missing in the backend; its place now: {place:?}");
        place.is_some()
    }

    fn write(&self, session: &Session, write: &Write, data: &[u8]) -> Result<Response, Errno> {
        check_template(&write.template)?;
        let backend = self.backend_for(write.chunk, write.template.backend_len)?;
        let source = |write: &Write| -> Result<Box<dyn ByteSource + '_>, Errno> {
            match write.source {
                WriteSource::Inline => Ok(Box::new(data)),
                WriteSource::Remote(remote) => {
                    let memory = session.client_memory.ok_or(Errno::EINVAL)?;
                    if remote.len > MAX_CHUNK_SIZE as u64 {
                        return Err(Errno::EINVAL);
                    }
                    Ok(Box::new(RemoteSource { memory, address: remote.address, remaining: remote.len as usize }))
                }
            }
        };
        let written =
            self.node.store.write(write.chunk, write.offset, &mut *source(write)?, write.template, write.time_ns, backend.as_ref());
        let chunk_len = match written {
            Err(StoreError::Fs(Errno::ENOSPC)) if self.node.store.backend().is_some() => {
                // Cache mode, and the store is full of dirty data: write to the backend.
                let prepare = |file: FileId| self.files.prepare_at_home(file);
                self.node.store.write_through(
                    write.chunk,
                    write.offset,
                    &mut *source(write)?,
                    write.template,
                    write.time_ns,
                    backend.as_ref(),
                    &prepare,
                )
            }
            other => other,
        }
        .map_err(store_errno)?;
        Ok(Response::Written(chunk_len))
    }

    fn read(&self, session: &mut Session, read: &Read, reply_data: &mut Vec<u8>) -> Result<Response, Errno> {
        let len = read.len.min(MAX_CHUNK_SIZE as u64);
        let backend = self.backend_for(read.chunk, read.backend_len)?;
        if read.lease && session.client_memory.is_some() {
            let shared = self.node.store.read_shared(read.chunk, read.offset, len, backend.as_ref()).map_err(store_errno)?;
            if let Some((buffer, range)) = shared.bytes {
                let address = buffer.as_ptr() as u64 + range.start as u64;
                let lease = Lease { id: session.lend(buffer), address, stored: range.len() as u64 };
                return Ok(Response::Read(ReadReply { attr: shared.attr, len: shared.len, lease: Some(lease) }));
            }
            if shared.attr.is_none() {
                return Ok(Response::Read(ReadReply { attr: None, len: 0, lease: None }));
            }
        }
        let (attr, len) = self.node.store.read(read.chunk, read.offset, len, reply_data, backend.as_ref()).map_err(store_errno)?;
        Ok(Response::Read(ReadReply { attr, len, lease: None }))
    }
}

/// Times at most a data operation that found its file's backend file missing, while the
/// file is there now, is tried again (see [`Data::across_backend_moves`]): a file renamed
/// again and again may keep moving away from a server asking where it is.
const FILE_MOVE_RETRIES: u32 = 50;

/// A chunk template from a request: a chunk made from it is at most [`MAX_CHUNK_SIZE`] long
/// (a forged size would let one write fill gigabytes with zeros).
fn check_template(template: &ringfs_proto::ChunkTemplate) -> Result<(), Errno> {
    if template.chunk_size == 0 || template.chunk_size > MAX_CHUNK_SIZE { Err(Errno::EINVAL) } else { Ok(()) }
}
