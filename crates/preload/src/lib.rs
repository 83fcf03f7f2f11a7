//! `libringfs_preload.so`: unmodified dynamically linked programs use ringfs under a path
//! prefix, without FUSE.
//!
//! Loaded with `LD_PRELOAD`, the library defines the C library's file functions (`open`,
//! `read`, `stat`, `opendir`, `fopen`, …) in front of the C library's own. A call about a
//! path under `RINGFS_MOUNT` (absolute, relative to a working directory inside it, or
//! relative to a ringfs directory descriptor) or about a ringfs descriptor goes to the native
//! client ([`ringfs_client::Client`], connected from the environment on first use, like the C
//! library); every other call goes to the C library unchanged (`dlsym(RTLD_NEXT)`, see
//! [`real`]). Without `RINGFS_MOUNT` everything goes to the C library.
//!
//! What it does not do: programs linked statically, or issuing system calls directly, or
//! calling functions the C library calls internally (not through its symbol table), bypass
//! it; `vfork` children share the parent's state; memory maps of ringfs files are private
//! copies. docs/ARCHITECTURE.md ("LD_PRELOAD library") says why symbols are interposed
//! rather than system calls.
//!
//! ```sh
//! LD_PRELOAD=target/release/libringfs_preload.so RINGFS_MOUNT=/ringfs \
//!     RINGFS_SERVER=… RINGFS_SECRET=… cp -r inputs /ringfs/inputs
//! ```
//!
//! Variadic C functions (`open`, `openat`, `fcntl`, `ioctl`) are defined with their optional
//! argument as a fixed one: on x86-64 and AArch64 Linux a variadic integer or pointer
//! argument travels in the same register as a fixed one, and it is read only when the
//! call's flags say it was passed.

mod descriptors;
mod directories;
mod files;
mod locks;
mod metadata;
mod paths;
mod process;
mod programs;
mod real;
mod state;
mod stdio;

use std::panic::{AssertUnwindSafe, catch_unwind};

use ringfs_client::{Errno, Stat};

/// This thread's `errno`.
pub(crate) fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

pub(crate) fn set_errno(code: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = code };
}

/// Runs a ringfs operation for a C caller: its value, or `failure` with errno set when it
/// fails. A panic never crosses into C: it becomes EIO.
pub(crate) fn ringfs_call<T>(failure: T, body: impl FnOnce() -> Result<T, Errno>) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => value,
        Ok(Err(errno)) => {
            set_errno(errno.code());
            failure
        }
        Err(_) => {
            set_errno(libc::EIO);
            failure
        }
    }
}

/// The device number ringfs files report (`st_dev`): one for the whole file system, so
/// tools that compare devices (`find -xdev`, `du`, `cp`'s same-file checks) see one.
pub(crate) const DEVICE: u64 = 0x7269_6e67;

/// The `DT_*` directory-entry type of a mode.
pub(crate) fn entry_type(mode: u32) -> u8 {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => libc::DT_DIR,
        libc::S_IFREG => libc::DT_REG,
        libc::S_IFLNK => libc::DT_LNK,
        libc::S_IFCHR => libc::DT_CHR,
        libc::S_IFBLK => libc::DT_BLK,
        libc::S_IFIFO => libc::DT_FIFO,
        libc::S_IFSOCK => libc::DT_SOCK,
        _ => libc::DT_UNKNOWN,
    }
}

/// `stat` as `struct stat` (which is also `struct stat64` on the 64-bit targets).
pub(crate) fn to_stat(stat: &Stat) -> libc::stat {
    // SAFETY: all-zero is a valid `struct stat`.
    let mut out: libc::stat = unsafe { std::mem::zeroed() };
    out.st_dev = DEVICE;
    out.st_mode = stat.mode;
    out.st_uid = stat.uid;
    out.st_gid = stat.gid;
    out.st_size = stat.size as libc::off_t;
    out.st_blksize = stat.chunk_size.max(512) as libc::blksize_t;
    out.st_blocks = stat.blocks() as libc::blkcnt_t;
    out.st_ino = stat.ino;
    out.st_nlink = stat.nlink as libc::nlink_t;
    out.st_rdev = stat.rdev;
    out.st_atime = stat.atime_ns.div_euclid(1_000_000_000);
    out.st_atime_nsec = stat.atime_ns.rem_euclid(1_000_000_000);
    out.st_mtime = stat.mtime_ns.div_euclid(1_000_000_000);
    out.st_mtime_nsec = stat.mtime_ns.rem_euclid(1_000_000_000);
    out.st_ctime = stat.ctime_ns.div_euclid(1_000_000_000);
    out.st_ctime_nsec = stat.ctime_ns.rem_euclid(1_000_000_000);
    out
}

/// Writes `stat` to a caller's `struct stat` (EFAULT for NULL).
pub(crate) fn store_stat(stat: &Stat, destination: *mut libc::stat) -> Result<i32, Errno> {
    if destination.is_null() {
        return Err(Errno::EFAULT);
    }
    // SAFETY: non-null; the caller passes a `struct stat`.
    unsafe { destination.write(to_stat(stat)) };
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_convert() {
        let stat = Stat {
            mode: libc::S_IFREG | 0o640,
            size: 1000,
            chunk_size: 1 << 20,
            ino: 7,
            nlink: 1,
            mtime_ns: 1_500_000_000,
            ..Stat::default()
        };
        let out = to_stat(&stat);
        assert_eq!((out.st_mode, out.st_size, out.st_ino, out.st_blocks, out.st_dev), (libc::S_IFREG | 0o640, 1000, 7, 2, DEVICE));
        assert_eq!((out.st_mtime, out.st_mtime_nsec), (1, 500_000_000));
        assert_eq!(entry_type(libc::S_IFDIR | 0o755), libc::DT_DIR);
    }
}
