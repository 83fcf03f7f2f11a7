/* Per-call cost of small-file operations, through the LD_PRELOAD library or the C library,
 * for comparing the two (docs/PERFORMANCE.md, LD_PRELOAD library). Each run does N times
 * one of: create + write 3901 bytes + close (mode 0), open + pread 3901 bytes + close
 * (mode 1), unlink (mode 2) — mdtest-hard's calls — and prints the mean time per call.
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
#endif

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s DIRECTORY COUNT MODE (0 create+write+close, 1 open+pread+close, 2 unlink)\n", argv[0]);
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
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (int i = 0; i < count; i++) {
        snprintf(path, sizeof path, "%s/f%d", dir, i);
        if (mode == 0) {
            int fd = open(path, O_CREAT | O_WRONLY | O_EXCL, 0644);
            if (fd < 0 || write(fd, buffer, 3901) != 3901 || close(fd) != 0) {
                perror(path);
                return 1;
            }
        } else if (mode == 1) {
            int fd = open(path, O_RDONLY, 0);
            if (fd < 0 || pread(fd, buffer, 3901, 0) != 3901 || close(fd) != 0) {
                perror(path);
                return 1;
            }
        } else if (unlink(path) != 0) {
            perror(path);
            return 1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    double elapsed_us = ((end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec)) / 1e3;
    printf("%.1f us per call\n", elapsed_us / count);
    return 0;
}
