//! One request taken from a ring entry: decoded from the entry's buffers, answered by the
//! operation of the same request ([`crate::operations`], as the `/dev/fuse` path does), the
//! answer's out-arguments encoded into the payload buffer.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, TimeOrNow};
use ringfs_client::Errno;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::abi::{self, InHeader};
use crate::RingfsFilesystem;
use crate::operations::{AttributeChanges, Caller, Entry, Listing, LockRequest, Opened, Xattr};

/// Who may send requests, as fuser's session checks it.
#[derive(Clone, Copy, Debug)]
pub struct Access {
    /// The user who mounted.
    pub owner: u32,
    /// Whether other users may (`allow_other`).
    pub anyone: bool,
}

/// What an answer puts in the payload buffer.
struct Out<'a> {
    buffer: &'a mut [u8],
    len: usize,
}

impl Out<'_> {
    fn put<T: IntoBytes + Immutable>(&mut self, value: &T) -> Result<(), Errno> {
        self.put_bytes(value.as_bytes())
    }

    fn put_bytes(&mut self, bytes: &[u8]) -> Result<(), Errno> {
        let end = self.len + bytes.len();
        self.buffer.get_mut(self.len..end).ok_or(Errno::EIO)?.copy_from_slice(bytes);
        self.len = end;
        Ok(())
    }
}

/// The request's fixed part.
fn fixed<T: FromBytes + KnownLayout + Immutable + Copy>(op_in: &[u8]) -> Result<T, Errno> {
    T::read_from_prefix(op_in).map(|(value, _)| value).map_err(|_| Errno::EINVAL)
}

/// The NUL-terminated strings at the front of the payload.
fn names(payload: &[u8], count: usize) -> Result<(Vec<&OsStr>, &[u8]), Errno> {
    let mut rest = payload;
    let mut found = Vec::with_capacity(count);
    for _ in 0..count {
        let end = rest.iter().position(|byte| *byte == 0).ok_or(Errno::EINVAL)?;
        found.push(OsStr::from_bytes(&rest[..end]));
        rest = &rest[end + 1..];
    }
    Ok((found, rest))
}

fn name(payload: &[u8]) -> Result<&OsStr, Errno> {
    Ok(names(payload, 1)?.0[0])
}

fn seconds(time: SystemTime) -> (u64, u32) {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => (after.as_secs(), after.subsec_nanos()),
        Err(before) => {
            let before = before.duration();
            match before.subsec_nanos() {
                0 => ((-(before.as_secs() as i64)) as u64, 0),
                nanos => ((-(before.as_secs() as i64) - 1) as u64, 1_000_000_000 - nanos),
            }
        }
    }
}

fn system_time(seconds: i64, nanos: u32) -> SystemTime {
    if seconds >= 0 {
        UNIX_EPOCH + Duration::new(seconds as u64, nanos)
    } else {
        UNIX_EPOCH - Duration::new(seconds.unsigned_abs(), 0) + Duration::from_nanos(u64::from(nanos))
    }
}

fn type_bits(kind: FileType) -> u32 {
    match kind {
        FileType::NamedPipe => libc::S_IFIFO,
        FileType::CharDevice => libc::S_IFCHR,
        FileType::BlockDevice => libc::S_IFBLK,
        FileType::Directory => libc::S_IFDIR,
        FileType::RegularFile => libc::S_IFREG,
        FileType::Symlink => libc::S_IFLNK,
        FileType::Socket => libc::S_IFSOCK,
    }
}

fn attr(attr: &FileAttr) -> abi::Attr {
    let (atime, atimensec) = seconds(attr.atime);
    let (mtime, mtimensec) = seconds(attr.mtime);
    let (ctime, ctimensec) = seconds(attr.ctime);
    abi::Attr {
        ino: attr.ino.0,
        size: attr.size,
        blocks: attr.blocks,
        atime,
        mtime,
        ctime,
        atimensec,
        mtimensec,
        ctimensec,
        mode: type_bits(attr.kind) | u32::from(attr.perm),
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev,
        blksize: attr.blksize,
        flags: attr.flags,
    }
}

fn entry_out(entry: &Entry) -> abi::EntryOut {
    let valid = (entry.valid_for.as_secs(), entry.valid_for.subsec_nanos());
    abi::EntryOut {
        nodeid: entry.attr.ino.0,
        generation: 0,
        entry_valid: valid.0,
        attr_valid: valid.0,
        entry_valid_nsec: valid.1,
        attr_valid_nsec: valid.1,
        attr: attr(&entry.attr),
    }
}

fn attr_out(entry: &Entry) -> abi::AttrOut {
    let valid = (entry.valid_for.as_secs(), entry.valid_for.subsec_nanos());
    abi::AttrOut { attr_valid: valid.0, attr_valid_nsec: valid.1, dummy: 0, attr: attr(&entry.attr) }
}

fn open_out(opened: &Opened) -> abi::OpenOut {
    abi::OpenOut { fh: opened.handle, open_flags: opened.flags.bits(), backing_id: 0 }
}

/// Adds one name to a `READDIR` answer (`READDIRPLUS` with `plus`, the name's attributes) of
/// at most `limit` bytes: `true` when it did not fit (the answer is full).
fn add_listing(out: &mut Out<'_>, limit: usize, listing: &Listing<'_>, plus: Option<&Entry>) -> bool {
    let name = listing.name.as_bytes();
    let dirent = abi::Dirent { ino: listing.ino, off: listing.cookie, namelen: name.len() as u32, typ: type_bits(listing.kind) >> 12 };
    let record = size_of::<abi::Dirent>() + name.len();
    let padded = record.next_multiple_of(8);
    let plus_part = if plus.is_some() { size_of::<abi::EntryOut>() } else { 0 };
    if out.len + plus_part + padded > limit.min(out.buffer.len()) {
        return true;
    }
    if let Some(entry) = plus {
        let _ = out.put(&entry_out(entry));
    }
    let _ = out.put(&dirent);
    let _ = out.put_bytes(name);
    let _ = out.put_bytes(&[0u8; 8][..padded - record]);
    false
}

/// A request taken from a ring entry (its payload, `payload[..payload_len]`, is passed apart:
/// the answer is written over it).
pub struct Request<'a> {
    pub header: &'a InHeader,
    /// The operation's fixed part.
    pub op_in: &'a [u8],
    pub payload_len: usize,
}

/// Requests whose waits for servers end once the caller is being killed (see
/// [`crate::interrupts::waiting_for`]; `dev_fuse.rs` wraps the same requests' methods):
/// those that only read, and the changes whose unknown outcome the mount makes good.
fn may_be_given_up(opcode: u32) -> bool {
    matches!(
        opcode,
        abi::LOOKUP
            | abi::GETATTR
            | abi::READLINK
            | abi::READ
            | abi::STATFS
            | abi::GETXATTR
            | abi::LISTXATTR
            | abi::OPENDIR
            | abi::READDIR
            | abi::READDIRPLUS
            | abi::ACCESS
            | abi::SETATTR
            | abi::MKDIR
            | abi::MKNOD
            | abi::SYMLINK
            | abi::LINK
            | abi::UNLINK
            | abi::RMDIR
            | abi::WRITE
            | abi::FALLOCATE
            | abi::FSYNC
            | abi::FSYNCDIR
            | abi::SETXATTR
            | abi::REMOVEXATTR
    )
}

/// Answers `request`: the length of the out-arguments written to the front of `payload`,
/// or the error to answer.
pub fn answer(fs: &RingfsFilesystem, access: Access, request: &Request<'_>, payload: &mut [u8]) -> Result<usize, Errno> {
    if may_be_given_up(request.header.opcode) {
        crate::interrupts::waiting_for(request.header.pid, || answer_now(fs, access, request, payload))
    } else {
        answer_now(fs, access, request, payload)
    }
}

fn answer_now(fs: &RingfsFilesystem, access: Access, request: &Request<'_>, payload: &mut [u8]) -> Result<usize, Errno> {
    let Request { header, op_in, payload_len } = *request;
    let opcode = header.opcode;
    if !access.anyone && header.uid != access.owner && !allowed_without_owner(opcode) {
        return Err(Errno::EACCES);
    }
    let caller = Caller { uid: header.uid, gid: header.gid, pid: header.pid };
    let inode = header.nodeid;
    let input = payload.get(..payload_len).ok_or(Errno::EINVAL)?;
    if opcode == abi::WRITE {
        // The written bytes are used where they lie; the answer goes after the write.
        let request: abi::WriteIn = fixed(op_in)?;
        let written = fs.write_at(inode, request.fh, request.offset, input.get(..request.size as usize).ok_or(Errno::EINVAL)?)?;
        let answer = abi::WriteOut { size: written, padding: 0 };
        payload[..size_of::<abi::WriteOut>()].copy_from_slice(answer.as_bytes());
        return Ok(size_of::<abi::WriteOut>());
    }
    // Names and values, kept apart from the buffer the answer is written to.
    let input = input.to_vec();
    let mut out = Out { buffer: payload, len: 0 };
    match opcode {
        abi::LOOKUP => out.put(&entry_out(&fs.lookup_entry(inode, name(&input)?)?))?,
        abi::GETATTR => {
            let request: abi::GetattrIn = fixed(op_in)?;
            let handle = (request.getattr_flags & abi::GETATTR_FH != 0).then_some(request.fh);
            out.put(&attr_out(&fs.attributes(inode, handle)?))?
        }
        abi::SETATTR => {
            let request: abi::SetattrIn = fixed(op_in)?;
            let valid = request.valid;
            let time = |set: u32, now: u32, seconds: i64, nanos: u32| {
                (valid & set != 0)
                    .then(|| if valid & now != 0 { TimeOrNow::Now } else { TimeOrNow::SpecificTime(system_time(seconds, nanos)) })
            };
            let changes = AttributeChanges {
                mode: (valid & abi::FATTR_MODE != 0).then_some(request.mode),
                uid: (valid & abi::FATTR_UID != 0).then_some(request.uid),
                gid: (valid & abi::FATTR_GID != 0).then_some(request.gid),
                size: (valid & abi::FATTR_SIZE != 0).then_some(request.size),
                atime: time(abi::FATTR_ATIME, abi::FATTR_ATIME_NOW, request.atime, request.atimensec),
                mtime: time(abi::FATTR_MTIME, abi::FATTR_MTIME_NOW, request.mtime, request.mtimensec),
                handle: (valid & abi::FATTR_FH != 0).then_some(request.fh),
            };
            out.put(&attr_out(&fs.set_attributes(inode, changes)?))?
        }
        abi::READLINK => out.put_bytes(fs.link_target(inode)?.as_bytes())?,
        abi::SYMLINK => {
            let (found, _) = names(&input, 2)?;
            out.put(&entry_out(&fs.make_symlink(caller, inode, found[0], found[1])?))?
        }
        abi::MKNOD => {
            let request: abi::MknodIn = fixed(op_in)?;
            out.put(&entry_out(&fs.make_node(caller, inode, name(&input)?, request.mode, request.umask, request.rdev)?))?
        }
        abi::MKDIR => {
            let request: abi::MkdirIn = fixed(op_in)?;
            out.put(&entry_out(&fs.make_directory(caller, inode, name(&input)?, request.mode, request.umask)?))?
        }
        abi::UNLINK => fs.remove_name(inode, name(&input)?)?,
        abi::RMDIR => fs.remove_directory(inode, name(&input)?)?,
        abi::RENAME | abi::RENAME2 => {
            let (new_parent, flags) = if opcode == abi::RENAME2 {
                let request: abi::Rename2In = fixed(op_in)?;
                (request.newdir, request.flags)
            } else {
                (fixed::<abi::RenameIn>(op_in)?.newdir, 0)
            };
            let (found, _) = names(&input, 2)?;
            fs.rename_entry(inode, found[0], new_parent, found[1], flags)?
        }
        abi::LINK => {
            let request: abi::LinkIn = fixed(op_in)?;
            out.put(&entry_out(&fs.make_link(request.oldnodeid, inode, name(&input)?)?))?
        }
        abi::OPEN => out.put(&open_out(&fs.open_file(inode, fixed::<abi::OpenIn>(op_in)?.flags as i32)?))?,
        abi::CREATE => {
            let request: abi::CreateIn = fixed(op_in)?;
            let (entry, opened) = fs.create_file(caller, inode, name(&input)?, request.mode, request.umask, request.flags as i32)?;
            out.put(&entry_out(&entry))?;
            out.put(&open_out(&opened))?
        }
        abi::READ => {
            let request: abi::ReadIn = fixed(op_in)?;
            let size = (request.size as usize).min(out.buffer.len());
            out.len = fs.read_into(request.fh, request.offset, &mut out.buffer[..size])?;
        }
        abi::STATFS => {
            let usage = fs.usage()?;
            out.put(&abi::StatfsOut {
                blocks: usage.blocks,
                bfree: usage.free,
                bavail: usage.free,
                files: usage.files,
                ffree: usage.files_free,
                bsize: usage.block_size,
                namelen: usage.name_max,
                frsize: usage.block_size,
                padding: 0,
                spare: [0; 6],
            })?
        }
        abi::RELEASE => fs.release_handle(inode, fixed::<abi::ReleaseIn>(op_in)?.fh)?,
        abi::FSYNC => fs.sync_file(inode, fixed::<abi::FsyncIn>(op_in)?.fh)?,
        abi::SETXATTR => {
            let request: abi::SetxattrIn = fixed(op_in)?;
            let (found, rest) = names(&input, 1)?;
            let value = rest.get(..request.size as usize).ok_or(Errno::EINVAL)?;
            fs.set_xattr(inode, found[0], value, request.flags as i32)?
        }
        abi::GETXATTR | abi::LISTXATTR => {
            let size = fixed::<abi::GetxattrIn>(op_in)?.size;
            let answer = if opcode == abi::GETXATTR { fs.xattr(inode, name(&input)?, size)? } else { fs.xattr_names(caller, inode, size)? };
            match answer {
                Xattr::Size(size) => out.put(&abi::GetxattrOut { size, padding: 0 })?,
                Xattr::Data(data) => out.put_bytes(&data)?,
            }
        }
        abi::REMOVEXATTR => fs.remove_xattr(inode, name(&input)?)?,
        abi::FLUSH => {
            let request: abi::FlushIn = fixed(op_in)?;
            fs.flush_handle(inode, request.fh, request.lock_owner)?
        }
        abi::OPENDIR => out.put(&open_out(&fs.open_directory(inode)?))?,
        abi::READDIR | abi::READDIRPLUS => {
            let request: abi::ReadIn = fixed(op_in)?;
            let limit = request.size as usize;
            if opcode == abi::READDIRPLUS {
                fs.list_plus(inode, request.fh, request.offset, |listing, entry| add_listing(&mut out, limit, &listing, Some(&entry)))?
            } else {
                fs.list(request.fh, request.offset, |listing| add_listing(&mut out, limit, &listing, None))?
            }
        }
        abi::RELEASEDIR => fs.release_directory(fixed::<abi::ReleaseIn>(op_in)?.fh),
        abi::FSYNCDIR => fs.sync_directory(inode)?,
        abi::GETLK => {
            let request: abi::LkIn = fixed(op_in)?;
            let lock = request.lock;
            let found = fs.find_lock(request.fh, request.owner, lock.start, lock.end, lock.typ as i32)?;
            out.put(&abi::LkOut { lock: abi::FileLock { start: found.start, end: found.end, typ: found.typ as u32, pid: found.pid } })?
        }
        abi::SETLK | abi::SETLKW => {
            let request: abi::LkIn = fixed(op_in)?;
            let asked = request.lock;
            let waiter = (opcode == abi::SETLKW).then_some(header.pid);
            let lock =
                LockRequest { inode, handle: request.fh, owner: request.owner, start: asked.start, end: asked.end, typ: asked.typ as i32 };
            fs.set_lock(lock, waiter)?
        }
        abi::ACCESS => fs.check_access(inode, fixed::<abi::AccessIn>(op_in)?.mask)?,
        abi::IOCTL => fs.control()?,
        abi::FALLOCATE => {
            let request: abi::FallocateIn = fixed(op_in)?;
            fs.allocate(inode, request.fh, request.offset, request.length, request.mode as i32)?
        }
        _ => return Err(Errno::ENOSYS),
    }
    Ok(out.len)
}

/// Requests the kernel may send with another user's id whoever mounted (fuser's list).
fn allowed_without_owner(opcode: u32) -> bool {
    matches!(
        opcode,
        abi::READ
            | abi::READDIR
            | abi::READDIRPLUS
            | abi::FORGET
            | abi::BATCH_FORGET
            | abi::WRITE
            | abi::FSYNC
            | abi::FSYNCDIR
            | abi::RELEASE
            | abi::RELEASEDIR
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_before_the_epoch_keep_their_nanoseconds_positive() {
        for (seconds_in, nanos_in) in [(5i64, 7u32), (0, 0), (-1, 500_000_000), (-3, 0), (-3, 1)] {
            let (seconds_out, nanos_out) = seconds(system_time(seconds_in, nanos_in));
            assert_eq!((seconds_out as i64, nanos_out), (seconds_in, nanos_in));
        }
    }

    #[test]
    fn names_end_at_their_nul_and_a_missing_nul_is_invalid() {
        let (found, rest) = names(b"old\0new\0value", 2).unwrap();
        assert_eq!(found, [OsStr::new("old"), OsStr::new("new")]);
        assert_eq!(rest, b"value");
        assert_eq!(names(b"no-end", 1).unwrap_err(), Errno::EINVAL);
        assert_eq!(fixed::<abi::OpenIn>(&[0u8; 4]).unwrap_err(), Errno::EINVAL);
    }

    #[test]
    fn listed_names_are_padded_to_eight_bytes_and_stop_when_the_reply_is_full() {
        let mut buffer = vec![0xffu8; 64];
        let mut out = Out { buffer: &mut buffer, len: 0 };
        let listing = |name| Listing { name, ino: 9, cookie: 1, kind: FileType::RegularFile };
        assert!(!add_listing(&mut out, 64, &listing("abc"), None));
        assert_eq!(out.len, 32, "24 bytes of dirent and 3 of name, padded to 32");
        let (dirent, rest) = abi::Dirent::read_from_prefix(&out.buffer[..out.len]).unwrap();
        assert_eq!((dirent.ino, dirent.off, dirent.namelen, dirent.typ), (9, 1, 3, libc::DT_REG as u32));
        assert_eq!(rest, b"abc\0\0\0\0\0");
        assert!(!add_listing(&mut out, 64, &listing("defgh"), None));
        assert!(add_listing(&mut out, 64, &listing("i"), None), "a third does not fit in 64 bytes");
        assert_eq!(out.len, 64);
    }
}
