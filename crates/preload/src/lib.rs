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
mod fcntl;
mod files;
mod locks;
mod metadata;
mod paths;
mod process;
mod programs;
mod real;
mod state;
mod stdio;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_types_follow_the_mode() {
        assert_eq!(entry_type(libc::S_IFDIR | 0o755), libc::DT_DIR);
        assert_eq!(entry_type(libc::S_IFLNK | 0o777), libc::DT_LNK);
        assert_eq!(entry_type(0), libc::DT_UNKNOWN);
    }
}
