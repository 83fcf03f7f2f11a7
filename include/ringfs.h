/*
 * ringfs.h — the C interface of ringfs, a job-scoped parallel file system.
 *
 * Link with -lringfs (pkg-config --cflags --libs ringfs). Every function is thread-safe.
 * Functions return 0 (or a count) on success and -1 on error with errno set, like their
 * POSIX namesakes. A server that is dead or does not answer within the request deadline
 * (RINGFS_TIMEOUT_MS, default 10 s) gives EIO.
 *
 * Paths are ringfs paths ("/dir/file"): absolute inside the ringfs namespace. File
 * descriptors are ringfs descriptors, not kernel ones: use them only with these functions.
 *
 *     ringfs_init(NULL);                        // servers from RINGFS_SERVER
 *     int fd = ringfs_create("/out/a", O_WRONLY, 0644);
 *     ringfs_write(fd, buffer, size);
 *     ringfs_close(fd);
 *     ringfs_term();
 */
#ifndef RINGFS_H
#define RINGFS_H

#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Connects to the file system. `servers` is a comma-separated list of server addresses
 * ("host:port"); NULL takes RINGFS_SERVER from the environment. The secret, timeout and
 * chunk size come from RINGFS_SECRET, RINGFS_TIMEOUT_MS and RINGFS_CHUNK_SIZE. Calling it
 * again while connected does nothing. Errors: EINVAL (no servers given), EIO (no server
 * reachable), EACCES (wrong secret). */
int ringfs_init(const char *servers);

/* Closes every open descriptor and the connections. */
int ringfs_term(void);

/* Creates (or truncates) a regular file and opens it: open(path, flags | O_CREAT | O_TRUNC,
 * mode). Use O_EXCL in flags to fail with EEXIST if it exists. */
int ringfs_create(const char *path, int flags, mode_t mode);

/* Opens a file. flags: O_RDONLY, O_WRONLY or O_RDWR, optionally O_CREAT, O_EXCL, O_TRUNC,
 * O_APPEND; mode is used with O_CREAT. Symbolic links are followed. */
int ringfs_open(const char *path, int flags, mode_t mode);

int ringfs_close(int fd);

/* Read or write at the descriptor's position, which then advances. */
ssize_t ringfs_read(int fd, void *buffer, size_t size);
ssize_t ringfs_write(int fd, const void *buffer, size_t size);

/* Read or write at `offset`; the position does not change. A read returns fewer bytes than
 * asked only at the end of the file. */
ssize_t ringfs_pread(int fd, void *buffer, size_t size, off_t offset);
ssize_t ringfs_pwrite(int fd, const void *buffer, size_t size, off_t offset);

/* Moves the position (SEEK_SET, SEEK_CUR, SEEK_END) and returns it. */
off_t ringfs_seek(int fd, off_t offset, int whence);

/* Data is stored at its server when a write returns, so this only checks the descriptor. */
int ringfs_fsync(int fd);

int ringfs_truncate(const char *path, off_t length);
int ringfs_ftruncate(int fd, off_t length);

/* stat follows a symbolic link in the last component; lstat does not. st_ino is the file's
 * identity, st_blksize its chunk size. */
int ringfs_stat(const char *path, struct stat *st);
int ringfs_lstat(const char *path, struct stat *st);
int ringfs_fstat(int fd, struct stat *st);

/* Checks permission bits like access(2): mode is F_OK or a combination of R_OK, W_OK, X_OK. */
int ringfs_access(const char *path, int mode);

/* chmod(2), chown(2) ((uid_t)-1 or (gid_t)-1 leaves one unchanged) and utimensat(2) (times
 * NULL: both now; UTIME_NOW and UTIME_OMIT as there). Symbolic links are followed. The
 * servers check them as Linux does for the calling process's user: EPERM for a chmod or
 * chown of another user's file, EACCES for a touch of a file one may not write. */
int ringfs_chmod(const char *path, mode_t mode);
int ringfs_chown(const char *path, uid_t uid, gid_t gid);
int ringfs_utimens(const char *path, const struct timespec times[2]);

int ringfs_unlink(const char *path);
int ringfs_mkdir(const char *path, mode_t mode);

/* Removes an empty directory (ENOTEMPTY otherwise). */
int ringfs_rmdir(const char *path);

/* Called once per directory entry by ringfs_readdir, with the entry's name, its attributes
 * and the offset of the next entry. Return 0 to continue, non-zero to stop. (The signature of
 * FUSE's fuse_fill_dir_t.) */
typedef int (*ringfs_filler_t)(void *context, const char *name, const struct stat *st, off_t next_offset);

/* Lists a directory: calls `filler` for every entry, sorted by name ("." and ".." are not
 * listed). */
int ringfs_readdir(const char *path, void *context, ringfs_filler_t filler);

/* Creates a symbolic link at `link_path` pointing to `target`. */
int ringfs_symlink(const char *target, const char *link_path);

/* Copies the target of a symbolic link into `buffer` (not NUL-terminated, truncated to
 * `size`) and returns its length, like readlink(2). */
ssize_t ringfs_readlink(const char *path, char *buffer, size_t size);

/* Renames a file, symbolic link or directory like rename(2): a file replaces a file, a
 * directory an empty directory. */
int ringfs_rename(const char *from, const char *to);

/* fallocate(2) on an open descriptor: `mode` 0 (the file grows to cover the range) or
 * FALLOC_FL_KEEP_SIZE (1). The servers reserve the room for the range, so later writes into
 * it do not fail with ENOSPC; ENOSPC at once, with nothing reserved, when a server that
 * would hold part of the range lacks it. Other modes: EOPNOTSUPP. */
int ringfs_fallocate(int fd, int mode, off_t offset, off_t len);

/* Advisory locks, kept by the servers so that they hold among all clients of the job, on
 * every node (and against locks taken through FUSE mounts of the cluster).
 * ringfs_fcntl_lock is fcntl(fd, cmd, lock) for the lock commands: F_GETLK, F_SETLK,
 * F_SETLKW (owner: the process; closing any descriptor of the file ends them) and
 * F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW (owner: the descriptor; closing it ends them;
 * l_pid must be 0). A lock in the way: EAGAIN, or a wait for the SETLKW commands (no
 * deadlock detection); the GETLK commands describe it in `lock` (l_type F_UNLCK if none).
 * A read lock needs the descriptor open for reading, a write lock for writing (EBADF).
 * ringfs_flock is flock(fd, operation) (LOCK_SH, LOCK_EX, LOCK_UN, | LOCK_NB: EWOULDBLOCK
 * instead of waiting): a whole-file lock of the descriptor, in the same space as record
 * locks (as on NFS). A client that dies without unlocking loses its locks after the
 * servers' open grace period (30 s by default). */
int ringfs_fcntl_lock(int fd, int cmd, struct flock *lock);
int ringfs_flock(int fd, int operation);

/* Extended attributes, like getxattr(2) and its siblings (a symbolic link in the last
 * component is followed). Namespaces: "user." (read and write permission of the file,
 * regular files and directories only), "trusted." (root only), "security." (root writes);
 * others, POSIX ACLs among them, fail with EOPNOTSUPP. Values up to 64 KiB (E2BIG), names
 * up to 255 bytes (ERANGE).
 * ringfs_getxattr copies the value of `name` into `value` and returns its length; `size` 0
 * returns the length only; a longer value fails with ERANGE; no such attribute: ENODATA. */
ssize_t ringfs_getxattr(const char *path, const char *name, void *value, size_t size);
/* `flags`: 0, XATTR_CREATE (EEXIST if it exists) or XATTR_REPLACE (ENODATA if it does not). */
int ringfs_setxattr(const char *path, const char *name, const void *value, size_t size, int flags);
/* The names, each followed by a NUL, in `list`; the same `size` rules as ringfs_getxattr. */
ssize_t ringfs_listxattr(const char *path, char *list, size_t size);
int ringfs_removexattr(const char *path, const char *name);

/* Cache mode: returns when everything dirty at the call has reached the backend directory
 * (writes made meanwhile are not waited for). Without a backend it returns 0 at once. */
int ringfs_sync(void);

/* The library's version, e.g. "0.1.0". */
const char *ringfs_version(void);

#ifdef __cplusplus
}
#endif

#endif /* RINGFS_H */
