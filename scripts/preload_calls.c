/* Per-call cost of small-file operations, through the LD_PRELOAD library or the C library,
 * for comparing the two (docs/PERFORMANCE.md, LD_PRELOAD library). Each run does N times
 * one of: create + write 3901 bytes + close (mode 0), open + pread 3901 bytes + close
 * (mode 1), unlink (mode 2) — mdtest-hard's calls — stat (mode 3) or create + close (mode 4,
 * mdtest-easy's), and prints the mean time per call and
 * per step (open or unlink; write or pread; close).
 *
 *   cc -O2 -o calls scripts/preload_calls.c
 *   cc -O2 -DNATIVE -Iinclude -o calls-native scripts/preload_calls.c \
 *       -Ltarget/release -lringfs -Wl,-rpath,$PWD/target/release
 *   eval "$(target/release/ringfs start)"
 *   LD_PRELOAD=$PWD/target/release/libringfs_preload.so RINGFS_MOUNT=/ringfs mkdir /ringfs/p /ringfs/n
 *   for mode in 0 1 2; do
 *     ./calls-native /n 3000 $mode
 *     LD_PRELOAD=$PWD/target/release/libringfs_preload.so RINGFS_MOUNT=/ringfs ./calls /ringfs/p 3000 $mode
 *   done
 */
#include <fcntl.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef NATIVE
#include "ringfs.h"
#define open ringfs_open
#define write ringfs_write
#define pread ringfs_pread
#define close ringfs_close
#define unlink ringfs_unlink
#define stat(path, attributes) ringfs_stat(path, attributes)
#endif

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s DIRECTORY COUNT MODE (0 create+write+close, 1 open+pread+close, 2 unlink, 3 stat, 4 create+close)\n", argv[0]);
        return 2;
    }
#ifdef NATIVE
    if (ringfs_init(NULL) != 0) {
        perror("ringfs_init");
        return 1;
    }
#endif
    const char *dir = argv[1];
    int count = atoi(argv[2]), mode = atoi(argv[3]);
    char path[4096], buffer[4096];
    memset(buffer, 7, sizeof buffer);
    /* Time spent in each step (open, write or read, close), summed over the run. */
    double step_ns[3] = {0, 0, 0};
    struct timespec start, end, before, after;
    clock_gettime(CLOCK_MONOTONIC, &start);
#define STEP(index, call)                                                   \
    (clock_gettime(CLOCK_MONOTONIC, &before), (call),                         \
     clock_gettime(CLOCK_MONOTONIC, &after),                                  \
     step_ns[index] += (after.tv_sec - before.tv_sec) * 1e9 + (after.tv_nsec - before.tv_nsec))
    for (int i = 0; i < count; i++) {
        snprintf(path, sizeof path, "%s/f%d", dir, i);
        int fd = -1, ok = 1;
        ssize_t moved = 0;
        if (mode == 0) {
            STEP(0, fd = open(path, O_CREAT | O_WRONLY | O_EXCL, 0644));
            ok = fd >= 0 && (STEP(1, moved = write(fd, buffer, 3901)), moved == 3901) && (STEP(2, ok = close(fd) == 0), ok);
        } else if (mode == 1) {
            STEP(0, fd = open(path, O_RDONLY, 0));
            ok = fd >= 0 && (STEP(1, moved = pread(fd, buffer, 3901, 0)), moved == 3901) && (STEP(2, ok = close(fd) == 0), ok);
        } else if (mode == 4) {
            STEP(0, fd = open(path, O_CREAT | O_WRONLY | O_EXCL, 0644));
            ok = fd >= 0 && (STEP(2, ok = close(fd) == 0), ok);
        } else if (mode == 2) {
            STEP(0, ok = unlink(path) == 0);
        } else {
            struct stat attributes;
            STEP(0, ok = stat(path, &attributes) == 0);
        }
        if (!ok) {
            perror(path);
            return 1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    double elapsed_us = ((end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec)) / 1e3;
    printf("%.1f us per call (steps: %.1f %.1f %.1f)\n", elapsed_us / count, step_ns[0] / 1e3 / count,
           step_ns[1] / 1e3 / count, step_ns[2] / 1e3 / count);
    return 0;
}
