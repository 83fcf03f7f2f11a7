//! Cache mode, seen from a client: `sync` (everything dirty reaches the backend) and stage-in
//! (backend files loaded into ringfs ahead of use).

use ringfs_proto::path;
use ringfs_proto::{ChunkIndex, ChunkKey, Errno, FileId, LoadChunk, Member, Request, Response, Sync};

use crate::{Client, Result};

/// Chunk loads a stage-in keeps in flight at once.
const STAGE_IN_WINDOW: usize = 32;

/// What a stage-in did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageInSummary {
    pub files: u64,
    /// Bytes of the staged files.
    pub bytes: u64,
    /// Bytes read from the backend (less than `bytes` when some were in ringfs already).
    pub loaded_bytes: u64,
}

/// A file to stage in: its identity, size and chunk size.
struct StageFile {
    file: FileId,
    size: u64,
    chunk_size: u64,
}

impl Client {
    /// Cache mode: writes everything that is dirty now to the backend, on all servers at
    /// once, and returns when it has all arrived. Writes made meanwhile are not waited for, so
    /// a sync ends even while others keep writing. `progress` hears, after each round (about a
    /// second), how many chunks and entries are still to flush. Without a backend: nothing
    /// to do.
    pub fn sync_with_progress(&self, progress: &mut dyn FnMut(u64)) -> Result<()> {
        let cluster = &self.inner.cluster;
        let members: Vec<Member> = cluster.member_list().members.into_iter().filter(|member| member.alive).collect();
        let connections = members.iter().map(|member| cluster.connection(member)).collect::<Result<Vec<_>>>()?;
        let mut tickets: Vec<Option<u64>> = vec![Some(0); connections.len()];
        while tickets.iter().any(Option::is_some) {
            let calls: Vec<_> = connections
                .iter()
                .zip(&tickets)
                .filter_map(|(connection, ticket)| {
                    let ticket = (*ticket)?;
                    Some((connection, connection.start(&Request::Sync(Sync { ticket }), &[], None)))
                })
                .collect();
            let mut answers = Vec::with_capacity(calls.len());
            for (connection, call) in calls {
                answers.push(match cluster.finish(connection, call)?.response {
                    Response::SyncProgress(progress) => (progress.ticket, progress.remaining),
                    _ => return Err(Errno::EPROTO),
                });
            }
            let mut answers = answers.into_iter();
            let mut remaining_total = 0;
            for ticket in tickets.iter_mut().filter(|ticket| ticket.is_some()) {
                let (next, remaining) = answers.next().ok_or(Errno::EPROTO)?;
                remaining_total += remaining;
                *ticket = (remaining > 0).then_some(next);
            }
            progress(remaining_total);
        }
        Ok(())
    }

    /// [`Client::sync_with_progress`] without progress reports.
    pub fn sync(&self) -> Result<()> {
        self.sync_with_progress(&mut |_| {})
    }

    /// Cache mode: loads the files at `paths` (ringfs paths in the cached tree; directories
    /// with everything below them) from the backend into ringfs, many chunks at once, so that
    /// later reads find them here. `progress(done, total)` hears the bytes handled so far.
    pub fn stagein(&self, paths: &[String], progress: &mut dyn FnMut(u64, u64)) -> Result<StageInSummary> {
        let mut files = Vec::new();
        for path in paths {
            self.collect_stage_files(&path::canonicalize(path)?, &mut files)?;
        }
        let total: u64 = files.iter().map(|file| file.size).sum();
        let mut summary = StageInSummary { files: files.len() as u64, bytes: total, loaded_bytes: 0 };
        let chunks: Vec<(ChunkKey, u64, u64)> = files
            .iter()
            .flat_map(|file| {
                ChunkIndex::FIRST.through(ChunkIndex::last_of(file.size, file.chunk_size)).map(move |index| {
                    let len = file.size.saturating_sub(index.first_byte(file.chunk_size)).min(file.chunk_size);
                    (ChunkKey::new(file.file, index), file.size, len)
                })
            })
            .collect();
        let cluster = &self.inner.cluster;
        let mut done = 0;
        progress(done, total);
        for window in chunks.chunks(STAGE_IN_WINDOW) {
            let connections =
                window.iter().map(|(chunk, _, _)| cluster.connection(&cluster.owner_of_chunk(*chunk))).collect::<Result<Vec<_>>>()?;
            let calls: Vec<_> = window
                .iter()
                .zip(&connections)
                .map(|((chunk, backend_len, _), connection)| {
                    connection.start(
                        &Request::LoadChunk(LoadChunk { chunk: *chunk, backend_len: *backend_len, backend: None, keep: false }),
                        &[],
                        None,
                    )
                })
                .collect();
            for ((call, connection), (_, _, len)) in calls.into_iter().zip(&connections).zip(window) {
                match cluster.finish(connection, call)?.response {
                    Response::Count(loaded) => summary.loaded_bytes += loaded,
                    _ => return Err(Errno::EPROTO),
                }
                done += len;
            }
            progress(done, total);
        }
        Ok(summary)
    }

    /// The regular files at or below `path` in the cached tree.
    fn collect_stage_files(&self, path: &str, files: &mut Vec<StageFile>) -> Result<()> {
        let stat = self.lstat(path)?;
        if !stat.backed {
            return Err(Errno::EINVAL);
        }
        if stat.is_dir() {
            for entry in self.readdir(path)? {
                let child = path::join(path, &entry.name);
                if entry.stat.is_dir() {
                    self.collect_stage_files(&child, files)?;
                } else if entry.stat.kind() == Some(ringfs_proto::FileKind::Regular) {
                    // Looked up by name: a file only listed so far is loaded into ringfs as an
                    // entry and an inode, whose chunks can then be loaded by id.
                    let stat = self.lstat(&child)?;
                    files.push(StageFile { file: stat.file, size: stat.size, chunk_size: stat.chunk_size.max(1) as u64 });
                }
            }
        } else if stat.kind() == Some(ringfs_proto::FileKind::Regular) {
            files.push(StageFile { file: stat.file, size: stat.size, chunk_size: stat.chunk_size.max(1) as u64 });
        }
        Ok(())
    }
}
