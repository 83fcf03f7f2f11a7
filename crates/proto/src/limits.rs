//! The check a server makes of every decoded request before it handles it
//! ([`Request::validate`]): its paths are canonical, and the sizes, offsets and counts it
//! carries lie where a file can reach, so that no handler meets a sum or product that
//! overflows. The answers are Linux's: EFBIG past the largest file ([`MAX_FILE_SIZE`]),
//! EINVAL for a malformed range (a chunk size out of bounds, an end before its start, a
//! range outside its chunk).
//!
//! Past this check, every byte position a request names (a chunk's index times its chunk
//! size, plus an offset and a length) is at most `MAX_FILE_SIZE` + [`MAX_DATA_LEN`], far
//! below `u64::MAX`.

use crate::message::{ChunkTemplate, FileLock, Request, Reservation, WriteSource};
use crate::{ChunkIndex, ChunkKey, Errno, MAX_DATA_LEN, path};

/// Largest file size, in bytes: Linux's `MAX_LFS_FILESIZE` on 64-bit machines (`off_t`'s
/// largest value). Clients answer EFBIG before sending a request that passes it.
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// Largest chunk size a file may have (one chunk must fit in a frame's data).
pub const MAX_CHUNK_SIZE: u32 = MAX_DATA_LEN;

impl Request {
    /// EINVAL, ENAMETOOLONG or EFBIG unless every path of this request is canonical and
    /// every size and offset it carries is in range (see the module's description).
    pub fn validate(&self) -> Result<(), Errno> {
        self.paths().into_iter().try_for_each(path::validate)?;
        match self {
            Request::Create(create) => check_chunk_size(create.chunk_size),
            Request::Write(write) => {
                check_chunk_size(write.template.chunk_size)?;
                let len = match write.source {
                    WriteSource::Remote(remote) => remote.len,
                    // The data section's length: the store checks it against the chunk.
                    WriteSource::Inline => 0,
                };
                check_in_chunk(write.chunk, &write.template, write.offset, len)
            }
            Request::SetChunkLen(set) => {
                check_chunk_size(set.template.chunk_size)?;
                check_in_chunk(set.chunk, &set.template, 0, set.len)
            }
            Request::Truncate(truncate) if truncate.size > MAX_FILE_SIZE => Err(Errno::EFBIG),
            Request::MarkExtended(mark) if mark.last_chunk.is_first() => Err(Errno::EINVAL),
            Request::Reserve(reservation) if reservation.release == 0 => check_reservation(reservation),
            Request::SetLock(lock) | Request::TestLock(lock) => check_lock(lock),
            _ => Ok(()),
        }
    }
}

fn check_chunk_size(chunk_size: u32) -> Result<(), Errno> {
    if chunk_size == 0 || chunk_size > MAX_CHUNK_SIZE { Err(Errno::EINVAL) } else { Ok(()) }
}

/// Bytes `offset..offset + len` of chunk `chunk` of a file with the template's chunk size:
/// inside the chunk (EINVAL), and ending at most at [`MAX_FILE_SIZE`] (EFBIG).
fn check_in_chunk(chunk: ChunkKey, template: &ChunkTemplate, offset: u64, len: u64) -> Result<(), Errno> {
    let chunk_size = u64::from(template.chunk_size);
    let end_in_chunk = offset.checked_add(len).filter(|end| *end <= chunk_size).ok_or(Errno::EINVAL)?;
    let end = chunk.index.checked_first_byte(chunk_size).and_then(|start| start.checked_add(end_in_chunk));
    if end.is_none_or(|end| end > MAX_FILE_SIZE) { Err(Errno::EFBIG) } else { Ok(()) }
}

/// A reservation (`fallocate`) of bytes `offset..end`: a range that is not empty (EINVAL),
/// ends at most at [`MAX_FILE_SIZE`] (EFBIG), and asks for no more than the chunks it
/// touches hold from the first one's start (EINVAL).
fn check_reservation(reservation: &Reservation) -> Result<(), Errno> {
    check_chunk_size(reservation.chunk_size)?;
    if reservation.end <= reservation.offset {
        return Err(Errno::EINVAL);
    }
    if reservation.end > MAX_FILE_SIZE {
        return Err(Errno::EFBIG);
    }
    let chunk_size = u64::from(reservation.chunk_size);
    let first_chunk_start = ChunkIndex::of_offset(reservation.offset, chunk_size).first_byte(chunk_size);
    if reservation.bytes > reservation.end - first_chunk_start { Err(Errno::EINVAL) } else { Ok(()) }
}

/// An advisory lock's range `start..=end` (`end` `u64::MAX`: to the end of the file).
fn check_lock(lock: &FileLock) -> Result<(), Errno> {
    if lock.start > lock.end { Err(Errno::EINVAL) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Read, RemoteBytes, SetChunkLen, Truncate, Write};
    use crate::{FileId, LockKind};

    const FILE: FileId = FileId { anchor: 1, serial: 2 };

    fn template(chunk_size: u32) -> ChunkTemplate {
        ChunkTemplate { mode: 0o100644, uid: 0, gid: 0, chunk_size, backend_len: 0 }
    }

    fn write(index: u64, offset: u64, remote_len: Option<u64>, chunk_size: u32) -> Request {
        let source = remote_len.map_or(WriteSource::Inline, |len| WriteSource::Remote(RemoteBytes { address: 4096, len }));
        Request::Write(Write { chunk: ChunkKey::new(FILE, ChunkIndex(index)), offset, source, template: template(chunk_size), time_ns: 1 })
    }

    fn reservation(offset: u64, end: u64, bytes: u64) -> Request {
        Request::Reserve(Reservation { file: FILE, offset, end, chunk_size: 1 << 20, bytes, release: 0 })
    }

    #[test]
    fn every_sample_request_is_valid() {
        for request in crate::message::samples::requests() {
            assert_eq!(request.validate(), Ok(()), "{request:?}");
        }
    }

    #[test]
    fn writes_and_chunk_lengths_stay_inside_their_chunk_and_below_the_largest_file() {
        let last_chunk = MAX_FILE_SIZE / (1 << 20);
        assert_eq!(write(3, 100, Some(1000), 1 << 20).validate(), Ok(()));
        assert_eq!(write(last_chunk - 1, 0, Some(1 << 20), 1 << 20).validate(), Ok(()));
        assert_eq!(write(last_chunk, 0, Some(1 << 20), 1 << 20).validate(), Err(Errno::EFBIG));
        assert_eq!(write(u64::MAX, 0, None, 1 << 20).validate(), Err(Errno::EFBIG), "index × chunk size overflows");
        assert_eq!(write(0, u64::MAX, Some(2), 1 << 20).validate(), Err(Errno::EINVAL), "offset + length overflows");
        assert_eq!(write(0, (1 << 20) + 1, None, 1 << 20).validate(), Err(Errno::EINVAL), "past the chunk");
        assert_eq!(write(0, 0, None, 0).validate(), Err(Errno::EINVAL));
        assert_eq!(write(0, 0, None, MAX_CHUNK_SIZE + 1).validate(), Err(Errno::EINVAL));
        let set_len = |index, len| {
            Request::SetChunkLen(SetChunkLen {
                chunk: ChunkKey::new(FILE, ChunkIndex(index)),
                len,
                template: template(4096),
                backend: None,
                cut_at_ns: None,
            })
        };
        assert_eq!(set_len(5, 4096).validate(), Ok(()));
        assert_eq!(set_len(5, 4097).validate(), Err(Errno::EINVAL));
        assert_eq!(set_len(u64::MAX / 4096, 1).validate(), Err(Errno::EFBIG));
        let read = Request::Read(Read {
            chunk: ChunkKey::new(FILE, ChunkIndex(u64::MAX)),
            offset: u64::MAX,
            len: u64::MAX,
            lease: false,
            release: vec![],
            backend_len: u64::MAX,
        });
        assert_eq!(read.validate(), Ok(()), "a read past the end reads nothing; the store saturates");
    }

    #[test]
    fn truncates_reservations_and_locks_answer_as_linux_does() {
        let truncate = |size| Request::Truncate(Truncate { file: FILE, size, time_ns: 1 });
        assert_eq!(truncate(MAX_FILE_SIZE).validate(), Ok(()));
        assert_eq!(truncate(MAX_FILE_SIZE + 1).validate(), Err(Errno::EFBIG));
        assert_eq!(reservation(100, 3 << 20, 3 << 20).validate(), Ok(()), "from the first chunk's start");
        assert_eq!(reservation(100, 3 << 20, (3 << 20) + 1).validate(), Err(Errno::EINVAL), "more than the range's chunks hold");
        assert_eq!(reservation(100, 100, 0).validate(), Err(Errno::EINVAL), "empty");
        assert_eq!(reservation(0, MAX_FILE_SIZE + 1, 1).validate(), Err(Errno::EFBIG));
        assert_eq!(reservation(0, u64::MAX, u64::MAX).validate(), Err(Errno::EFBIG));
        let release = Request::Reserve(Reservation { file: FILE, offset: 9, end: 0, chunk_size: 0, bytes: u64::MAX, release: 7 });
        assert_eq!(release.validate(), Ok(()), "a release uses nothing but its count");
        let lock = |start, end| Request::SetLock(FileLock { file: FILE, client: 1, owner: 1, kind: LockKind::Write, start, end, pid: 1 });
        assert_eq!(lock(0, u64::MAX).validate(), Ok(()));
        assert_eq!(lock(10, 9).validate(), Err(Errno::EINVAL));
    }
}
