/*
 * test_ringfs.c — exercises every function of ringfs.h against a live cluster.
 * Run with the RINGFS_* environment of a cluster; exits 0 when every check passes and prints
 * each failed check otherwise. Threads check that the library is thread-safe.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ringfs.h>

static int failures = 0;

#define CHECK(condition)                                                                  \
    do {                                                                                  \
        if (!(condition)) {                                                               \
            fprintf(stderr, "FAILED %s:%d: %s (errno %d: %s)\n", __FILE__, __LINE__,    \
                    #condition, errno, strerror(errno));                                  \
            failures++;                                                                   \
        }                                                                                 \
    } while (0)

#define CHECK_ERRNO(call, expected)                                                       \
    do {                                                                                  \
        errno = 0;                                                                        \
        long result_ = (long)(call);                                                      \
        if (result_ != -1 || errno != (expected)) {                                       \
            fprintf(stderr, "FAILED %s:%d: %s gave %ld, errno %d (%s), expected %s\n",   \
                    __FILE__, __LINE__, #call, result_, errno, strerror(errno), #expected); \
            failures++;                                                                   \
        }                                                                                 \
    } while (0)

static int count_entry(void *context, const char *name, const struct stat *st, off_t next) {
    (void)name;
    (void)st;
    (void)next;
    (*(int *)context)++;
    return 0;
}

static void *writer_thread(void *argument) {
    long id = (long)argument;
    char path[64], block[4096];
    snprintf(path, sizeof path, "/c/thread.%ld", id);
    memset(block, 'a' + (int)id, sizeof block);
    int fd = ringfs_create(path, O_WRONLY, 0644);
    CHECK(fd >= 0);
    for (int i = 0; i < 64; i++) {
        CHECK(ringfs_pwrite(fd, block, sizeof block, (off_t)i * (off_t)sizeof block) == (ssize_t)sizeof block);
    }
    CHECK(ringfs_close(fd) == 0);
    return NULL;
}

int main(void) {
    CHECK(ringfs_init(NULL) == 0);
    CHECK(ringfs_init(NULL) == 0); /* a second call does nothing */
    CHECK(strlen(ringfs_version()) > 0);

    /* Directories. */
    CHECK(ringfs_mkdir("/c", 0755) == 0);
    CHECK_ERRNO(ringfs_mkdir("/c", 0755), EEXIST);
    CHECK_ERRNO(ringfs_mkdir("/missing/dir", 0755), ENOENT);

    /* Create, write, seek, read. */
    int fd = ringfs_create("/c/file", O_RDWR, 0640);
    CHECK(fd >= 0);
    size_t size = 3 * 1024 * 1024 + 17;
    unsigned char *data = malloc(size), *copy = malloc(size);
    for (size_t i = 0; i < size; i++) data[i] = (unsigned char)(i * 31 + 7);
    CHECK(ringfs_write(fd, data, size) == (ssize_t)size);
    CHECK(ringfs_seek(fd, 0, SEEK_CUR) == (off_t)size);
    CHECK(ringfs_seek(fd, 0, SEEK_SET) == 0);
    memset(copy, 0, size);
    CHECK(ringfs_read(fd, copy, size) == (ssize_t)size);
    CHECK(memcmp(data, copy, size) == 0);
    CHECK(ringfs_read(fd, copy, 10) == 0); /* end of file */
    CHECK(ringfs_pread(fd, copy, 100, 1024 * 1024 - 50) == 100);
    CHECK(memcmp(copy, data + 1024 * 1024 - 50, 100) == 0);
    CHECK(ringfs_pwrite(fd, "XYZ", 3, 5) == 3);
    CHECK(ringfs_fsync(fd) == 0);
    CHECK(ringfs_seek(fd, -17, SEEK_END) == (off_t)(size - 17));

    /* Attributes. */
    struct stat st;
    CHECK(ringfs_fstat(fd, &st) == 0);
    CHECK(st.st_size == (off_t)size && S_ISREG(st.st_mode) && (st.st_mode & 0777) == 0640);
    CHECK(ringfs_close(fd) == 0);
    CHECK_ERRNO(ringfs_close(fd), EBADF);
    CHECK(ringfs_stat("/c/file", &st) == 0 && st.st_size == (off_t)size);
    CHECK(ringfs_stat("/c", &st) == 0 && S_ISDIR(st.st_mode));
    CHECK_ERRNO(ringfs_stat("/c/none", &st), ENOENT);
    CHECK(ringfs_access("/c/file", F_OK) == 0);
    CHECK(ringfs_access("/c/file", R_OK | W_OK) == 0);
    CHECK_ERRNO(ringfs_access("/c/none", F_OK), ENOENT);

    /* Truncate. */
    CHECK(ringfs_truncate("/c/file", 10) == 0);
    CHECK(ringfs_stat("/c/file", &st) == 0 && st.st_size == 10);
    fd = ringfs_open("/c/file", O_RDWR, 0);
    CHECK(ringfs_ftruncate(fd, 2 * 1024 * 1024) == 0);
    CHECK(ringfs_fstat(fd, &st) == 0 && st.st_size == 2 * 1024 * 1024);
    CHECK(ringfs_pread(fd, copy, 20, 0) == 20);
    CHECK(memcmp(copy, data, 5) == 0 && memcmp(copy + 5, "XYZ", 3) == 0);
    CHECK(copy[10] == 0 && copy[19] == 0);
    CHECK(ringfs_close(fd) == 0);

    /* O_EXCL, O_APPEND. */
    CHECK_ERRNO(ringfs_open("/c/file", O_WRONLY | O_CREAT | O_EXCL, 0644), EEXIST);
    CHECK_ERRNO(ringfs_open("/c/none", O_RDONLY, 0), ENOENT);
    fd = ringfs_open("/c/log", O_WRONLY | O_CREAT | O_APPEND, 0644);
    CHECK(ringfs_write(fd, "one", 3) == 3 && ringfs_write(fd, "two", 3) == 3);
    CHECK(ringfs_close(fd) == 0);
    CHECK(ringfs_stat("/c/log", &st) == 0 && st.st_size == 6);

    /* Links and rename. */
    CHECK(ringfs_symlink("file", "/c/link") == 0);
    char target[64] = {0};
    CHECK(ringfs_readlink("/c/link", target, sizeof target) == 4 && strcmp(target, "file") == 0);
    CHECK(ringfs_lstat("/c/link", &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(ringfs_stat("/c/link", &st) == 0 && S_ISREG(st.st_mode));
    CHECK(ringfs_rename("/c/log", "/c/renamed") == 0);
    CHECK_ERRNO(ringfs_stat("/c/log", &st), ENOENT);
    CHECK(ringfs_stat("/c/renamed", &st) == 0 && st.st_size == 6);

    /* Extended attributes. */
    CHECK(ringfs_setxattr("/c/renamed", "user.k", "value", 5, 0) == 0);
    CHECK_ERRNO(ringfs_setxattr("/c/renamed", "user.k", "v", 1, 1 /* XATTR_CREATE */), EEXIST);
    CHECK(ringfs_getxattr("/c/renamed", "user.k", NULL, 0) == 5);
    char value[8] = {0};
    CHECK_ERRNO(ringfs_getxattr("/c/renamed", "user.k", value, 2), ERANGE);
    CHECK(ringfs_getxattr("/c/renamed", "user.k", value, sizeof value) == 5 && memcmp(value, "value", 5) == 0);
    char names[32] = {0};
    CHECK(ringfs_listxattr("/c/renamed", names, sizeof names) == 7 && strcmp(names, "user.k") == 0);
    CHECK(ringfs_removexattr("/c/renamed", "user.k") == 0);
    CHECK_ERRNO(ringfs_getxattr("/c/renamed", "user.k", value, sizeof value), ENODATA);
    CHECK_ERRNO(ringfs_setxattr("/c/renamed", "system.posix_acl_access", "", 0, 0), EOPNOTSUPP);

    /* Threads share the library. */
    pthread_t threads[4];
    for (long i = 0; i < 4; i++) pthread_create(&threads[i], NULL, writer_thread, (void *)i);
    for (int i = 0; i < 4; i++) pthread_join(threads[i], NULL);
    CHECK(ringfs_stat("/c/thread.3", &st) == 0 && st.st_size == 64 * 4096);

    /* Listing, removal, POSIX errors. */
    int entries = 0;
    CHECK(ringfs_readdir("/c", &entries, count_entry) == 0);
    CHECK(entries == 7); /* file, link, renamed, thread.0-3, and nothing else */
    CHECK_ERRNO(ringfs_readdir("/c/file", &entries, count_entry), ENOTDIR);
    CHECK_ERRNO(ringfs_rmdir("/c"), ENOTEMPTY);
    CHECK_ERRNO(ringfs_unlink("/c"), EISDIR);
    CHECK(ringfs_unlink("/c/link") == 0);
    CHECK(ringfs_sync() == 0);

    free(data);
    free(copy);
    CHECK(ringfs_term() == 0);
    CHECK_ERRNO(ringfs_open("/c/file", O_RDONLY, 0), EINVAL); /* not initialised */
    if (failures == 0) printf("all C API checks passed\n");
    return failures == 0 ? 0 : 1;
}
