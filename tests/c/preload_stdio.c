/* A program that knows nothing of ringfs: stdio, descriptors, directories and fork on the
 * directory given as argv[1]. Run under libringfs_preload.so by tests/preload.rs, which
 * compares its output with a run on a local directory. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(condition)                                                                   \
    do {                                                                                   \
        if (!(condition)) {                                                                \
            fprintf(stderr, "%s:%d: check failed: %s (errno %d)\n", __FILE__, __LINE__,   \
                    #condition, errno);                                                    \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static int compare_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    char path[4096];
    CHECK(chdir(argv[1]) == 0);

    /* stdio: write lines, append, read them back with fgets and fscanf. */
    FILE *out = fopen("numbers.txt", "w");
    CHECK(out != NULL);
    for (int i = 0; i < 1000; i++) fprintf(out, "line %d\n", i);
    CHECK(fclose(out) == 0);
    out = fopen("numbers.txt", "a");
    CHECK(out != NULL);
    fputs("the end\n", out);
    CHECK(fclose(out) == 0);
    FILE *in = fopen("numbers.txt", "r");
    CHECK(in != NULL);
    struct stat st;
    CHECK(fstat(fileno(in), &st) == 0);
    printf("size %lld\n", (long long)st.st_size);
    char line[128];
    long sum = 0;
    int count = 0, value;
    while (fscanf(in, "line %d\n", &value) == 1) {
        sum += value;
        count++;
    }
    CHECK(fgets(line, sizeof line, in) != NULL);
    printf("lines %d sum %ld last %s", count, sum, line);
    CHECK(fseek(in, 5, SEEK_SET) == 0);
    CHECK(fgets(line, sizeof line, in) != NULL);
    printf("after seek: %s", line);
    printf("ftell %ld\n", ftell(in));
    CHECK(fclose(in) == 0);

    /* Descriptors: dup shares the position, O_APPEND, pread/pwrite, lseek, ftruncate. */
    int fd = open("data.bin", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    CHECK(fd >= 0);
    CHECK(write(fd, "abcdef", 6) == 6);
    int copy = dup(fd);
    CHECK(copy >= 0 && copy != fd);
    CHECK(lseek(copy, 0, SEEK_CUR) == 6);
    CHECK(write(copy, "gh", 2) == 2);
    CHECK(lseek(fd, 0, SEEK_CUR) == 8);
    CHECK(pwrite(fd, "XY", 2, 1) == 2);
    char bytes[16] = {0};
    CHECK(pread(fd, bytes, sizeof bytes, 0) == 8);
    printf("data %s\n", bytes);
    CHECK((fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
    CHECK((fcntl(copy, F_GETFD) & FD_CLOEXEC) == 0);
    CHECK((fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDWR);
    CHECK(ftruncate(fd, 4) == 0);
    CHECK(fstat(copy, &st) == 0 && st.st_size == 4);
    printf("mode %o\n", st.st_mode & 0777);
    CHECK(close(copy) == 0);

    /* mmap: a read-only map of the file. */
    char *map = mmap(NULL, 4, PROT_READ, MAP_PRIVATE, fd, 0);
    CHECK(map != MAP_FAILED);
    printf("mapped %.4s\n", map);
    CHECK(munmap(map, 4) == 0);
    CHECK(close(fd) == 0);
    CHECK(close(fd) == -1 && errno == EBADF);

    /* fork: the child writes through an inherited descriptor and by name. */
    fd = open("forked.txt", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0);
    CHECK(write(fd, "parent\n", 7) == 7);
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        if (write(fd, "child\n", 6) != 6) _exit(2);
        FILE *note = fopen("child.txt", "w");
        if (note == NULL) _exit(3);
        fprintf(note, "from the child\n");
        _exit(fclose(note) == 0 ? 0 : 4);
    }
    int status;
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(close(fd) == 0);
    in = fopen("forked.txt", "r");
    CHECK(in != NULL);
    while (fgets(line, sizeof line, in)) printf("forked: %s", line);
    fclose(in);

    /* Directories: mkdir, rename, a listing, unlink, rmdir; relative and *at calls. */
    CHECK(mkdir("sub", 0755) == 0);
    CHECK(mkdir("sub", 0755) == -1 && errno == EEXIST);
    int dirfd_ = open("sub", O_RDONLY | O_DIRECTORY);
    CHECK(dirfd_ >= 0);
    fd = openat(dirfd_, "inner.txt", O_WRONLY | O_CREAT, 0600);
    CHECK(fd >= 0 && write(fd, "in", 2) == 2 && close(fd) == 0);
    CHECK(fstatat(dirfd_, "inner.txt", &st, 0) == 0 && st.st_size == 2);
    CHECK(renameat(dirfd_, "inner.txt", AT_FDCWD, "moved.txt") == 0);
    CHECK(close(dirfd_) == 0);
    CHECK(symlink("moved.txt", "link") == 0);
    ssize_t length = readlink("link", path, sizeof path);
    CHECK(length == 9);
    path[length] = 0;
    printf("link -> %s\n", path);
    CHECK(access("moved.txt", R_OK | W_OK) == 0);
    CHECK(access("missing", F_OK) == -1 && errno == ENOENT);
    DIR *dir = opendir(".");
    CHECK(dir != NULL);
    char *names[64];
    int n = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL && n < 64) names[n++] = strdup(entry->d_name);
    CHECK(closedir(dir) == 0);
    qsort(names, n, sizeof *names, compare_names);
    for (int i = 0; i < n; i++) printf("entry %s\n", names[i]);
    CHECK(getcwd(path, sizeof path) != NULL);
    printf("cwd ends with %s\n", strrchr(path, '/'));
    CHECK(unlink("link") == 0 && unlink("moved.txt") == 0 && rmdir("sub") == 0);
    CHECK(rmdir("missing") == -1 && errno == ENOENT);
    printf("done\n");
    return 0;
}
