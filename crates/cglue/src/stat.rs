//! A ringfs [`Stat`] as the C structures `stat(2)` and `statx(2)` fill.

use ringfs_client::{Errno, Stat};

use crate::arguments::store;

/// The device number ringfs files report (`st_dev`): one for the whole file system, so
/// tools that compare devices (`find -xdev`, `du`, `cp`'s same-file checks) see one.
pub const DEVICE: u64 = 0x7269_6e67;

const NANOS_PER_SECOND: i64 = 1_000_000_000;

/// Nanoseconds since the epoch as whole seconds and the nanoseconds after them (in
/// `0..1e9`, also before the epoch: -1 ns is -1 s + 999,999,999 ns).
pub fn seconds_and_nanos(time_ns: i64) -> (i64, i64) {
    (time_ns.div_euclid(NANOS_PER_SECOND), time_ns.rem_euclid(NANOS_PER_SECOND))
}

/// `stat` as `struct stat` (which is also `struct stat64` on the 64-bit targets).
pub fn to_stat(stat: &Stat) -> libc::stat {
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
    (out.st_atime, out.st_atime_nsec) = seconds_and_nanos(stat.atime_ns);
    (out.st_mtime, out.st_mtime_nsec) = seconds_and_nanos(stat.mtime_ns);
    (out.st_ctime, out.st_ctime_nsec) = seconds_and_nanos(stat.ctime_ns);
    out
}

/// Writes `stat` to a caller's `struct stat` (EFAULT for NULL); 0.
///
/// # Safety
/// `destination` must be NULL or point to a writable `struct stat`.
pub unsafe fn store_stat(stat: &Stat, destination: *mut libc::stat) -> Result<i32, Errno> {
    // SAFETY: forwarded contract.
    unsafe { store(destination, to_stat(stat)) }
}

fn statx_timestamp(time_ns: i64) -> libc::statx_timestamp {
    // SAFETY: all-zero is a valid `struct statx_timestamp`.
    let mut time: libc::statx_timestamp = unsafe { std::mem::zeroed() };
    let (seconds, nanos) = seconds_and_nanos(time_ns);
    (time.tv_sec, time.tv_nsec) = (seconds, nanos as u32);
    time
}

/// `stat` as `struct statx`, with the basic fields (`STATX_BASIC_STATS`).
pub fn to_statx(stat: &Stat) -> libc::statx {
    // SAFETY: all-zero is a valid `struct statx`.
    let mut out: libc::statx = unsafe { std::mem::zeroed() };
    out.stx_mask = libc::STATX_BASIC_STATS;
    out.stx_blksize = stat.chunk_size.max(512);
    out.stx_nlink = stat.nlink;
    out.stx_uid = stat.uid;
    out.stx_gid = stat.gid;
    out.stx_mode = stat.mode as u16;
    out.stx_ino = stat.ino;
    out.stx_size = stat.size;
    out.stx_blocks = stat.blocks();
    out.stx_atime = statx_timestamp(stat.atime_ns);
    out.stx_mtime = statx_timestamp(stat.mtime_ns);
    out.stx_ctime = statx_timestamp(stat.ctime_ns);
    out.stx_rdev_major = libc::major(stat.rdev);
    out.stx_rdev_minor = libc::minor(stat.rdev);
    out.stx_dev_major = libc::major(DEVICE);
    out.stx_dev_minor = libc::minor(DEVICE);
    out
}

/// Writes `stat` to a caller's `struct statx` (EFAULT for NULL); 0.
///
/// # Safety
/// `destination` must be NULL or point to a writable `struct statx`.
pub unsafe fn store_statx(stat: &Stat, destination: *mut libc::statx) -> Result<i32, Errno> {
    // SAFETY: forwarded contract.
    unsafe { store(destination, to_statx(stat)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Stat {
        Stat {
            mode: libc::S_IFREG | 0o640,
            uid: 1000,
            gid: 100,
            size: 1000,
            chunk_size: 1 << 20,
            ino: 7,
            nlink: 2,
            rdev: libc::makedev(1, 3),
            atime_ns: -1,
            mtime_ns: 1_500_000_000,
            ctime_ns: 2_000_000_000,
            ..Stat::default()
        }
    }

    #[test]
    fn stat_fields_convert() {
        let out = to_stat(&sample());
        assert_eq!((out.st_mode, out.st_uid, out.st_gid, out.st_size), (libc::S_IFREG | 0o640, 1000, 100, 1000));
        assert_eq!((out.st_ino, out.st_nlink, out.st_blocks, out.st_blksize), (7, 2, 2, 1 << 20));
        assert_eq!((out.st_dev, out.st_rdev), (DEVICE, libc::makedev(1, 3)));
        assert_eq!((out.st_mtime, out.st_mtime_nsec), (1, 500_000_000));
        assert_eq!((out.st_ctime, out.st_ctime_nsec), (2, 0));
    }

    #[test]
    fn times_before_the_epoch_keep_nanoseconds_in_range() {
        assert_eq!(seconds_and_nanos(-1), (-1, 999_999_999));
        assert_eq!(seconds_and_nanos(-1_000_000_000), (-1, 0));
        assert_eq!(seconds_and_nanos(999_999_999), (0, 999_999_999));
        let out = to_stat(&sample());
        assert_eq!((out.st_atime, out.st_atime_nsec), (-1, 999_999_999));
        assert_eq!((to_statx(&sample()).stx_atime.tv_sec, to_statx(&sample()).stx_atime.tv_nsec), (-1, 999_999_999));
    }

    #[test]
    fn a_tiny_chunk_size_still_reports_a_512_byte_block() {
        let stat = Stat { chunk_size: 0, ..sample() };
        assert_eq!((to_stat(&stat).st_blksize, to_statx(&stat).stx_blksize), (512, 512));
    }

    #[test]
    fn statx_fields_convert() {
        let out = to_statx(&sample());
        assert_eq!(out.stx_mask, libc::STATX_BASIC_STATS);
        assert_eq!(
            (u32::from(out.stx_mode), out.stx_size, out.stx_ino, out.stx_nlink, out.stx_blocks),
            (libc::S_IFREG | 0o640, 1000, 7, 2, 2)
        );
        assert_eq!((out.stx_rdev_major, out.stx_rdev_minor), (1, 3));
        assert_eq!((out.stx_dev_major, out.stx_dev_minor), (libc::major(DEVICE), libc::minor(DEVICE)));
        assert_eq!((out.stx_mtime.tv_sec, out.stx_mtime.tv_nsec), (1, 500_000_000));
    }

    #[test]
    fn storing_to_null_is_efault() {
        // SAFETY: NULL is allowed.
        unsafe {
            assert_eq!(store_stat(&sample(), std::ptr::null_mut()), Err(Errno::EFAULT));
            assert_eq!(store_statx(&sample(), std::ptr::null_mut()), Err(Errno::EFAULT));
        }
        // SAFETY: all-zero is a valid `struct stat`.
        let mut out: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a `struct stat` of this frame.
        assert_eq!(unsafe { store_stat(&sample(), &mut out) }, Ok(0));
        assert_eq!(out.st_ino, 7);
    }
}
