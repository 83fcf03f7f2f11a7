/*
 * fsync_cost.c — what an fsync costs: N times "write 4 KiB, fsync" to one file, through the
 * ringfs C library and, for comparison, through POSIX calls on a directory of the same disk.
 * Prints the median of 5 runs of each, in fsyncs per second.
 *
 *   eval "$(ringfs start --servers 2 --store dir:/var/tmp/ringfs-fsync)"
 *   scripts/install-c-library.sh --in-place /tmp/pc
 *   cc -O2 examples/c/fsync_cost.c $(PKG_CONFIG_PATH=/tmp/pc pkg-config --cflags --libs ringfs) -o fsync_cost
 *   ./fsync_cost 500 /var/tmp        # 500 fsyncs per run; POSIX baseline in /var/tmp
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ringfs.h>

static double seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One run through ringfs: fsyncs per second, or -1. */
static double ringfs_run(int count, int run) {
    char path[64];
    snprintf(path, sizeof path, "/fsync-cost-%d", run);
    int fd = ringfs_create(path, O_WRONLY | O_TRUNC, 0644);
    if (fd < 0) {
        perror("ringfs_create");
        return -1;
    }
    char block[4096];
    memset(block, 'r', sizeof block);
    double start = seconds();
    for (int i = 0; i < count; i++) {
        if (ringfs_pwrite(fd, block, sizeof block, (off_t)i * (off_t)sizeof block) != (ssize_t)sizeof block || ringfs_fsync(fd) != 0) {
            perror("ringfs write/fsync");
            return -1;
        }
    }
    double elapsed = seconds() - start;
    ringfs_close(fd);
    ringfs_unlink(path);
    return count / elapsed;
}

/* One run through POSIX calls in `dir`. */
static double posix_run(int count, const char *dir, int run) {
    char path[4096];
    snprintf(path, sizeof path, "%s/fsync-cost-%d-%d", dir, (int)getpid(), run);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        perror("open");
        return -1;
    }
    char block[4096];
    memset(block, 'p', sizeof block);
    double start = seconds();
    for (int i = 0; i < count; i++) {
        if (pwrite(fd, block, sizeof block, (off_t)i * (off_t)sizeof block) != (ssize_t)sizeof block || fsync(fd) != 0) {
            perror("write/fsync");
            return -1;
        }
    }
    double elapsed = seconds() - start;
    close(fd);
    unlink(path);
    return count / elapsed;
}

int main(int argc, char **argv) {
    int count = argc > 1 ? atoi(argv[1]) : 500;
    const char *dir = argc > 2 ? argv[2] : "/var/tmp";
    if (ringfs_init(NULL) != 0) {
        fprintf(stderr, "ringfs_init: %s (did you run: eval \"$(ringfs start ...)\"?)\n", strerror(errno));
        return 1;
    }
    double ringfs_rates[5], posix_rates[5];
    for (int run = 0; run < 5; run++) { /* interleaved, so both see the same disk weather */
        ringfs_rates[run] = ringfs_run(count, run);
        posix_rates[run] = posix_run(count, dir, run);
        if (ringfs_rates[run] < 0 || posix_rates[run] < 0) {
            return 1;
        }
    }
    qsort(ringfs_rates, 5, sizeof(double), compare);
    qsort(posix_rates, 5, sizeof(double), compare);
    printf("write 4 KiB + fsync, %d per run, median of 5:\n", count);
    printf("  ringfs: %8.0f fsyncs/s\n", ringfs_rates[2]);
    printf("  POSIX (%s): %8.0f fsyncs/s\n", dir, posix_rates[2]);
    printf("  ratio: %.2f\n", ringfs_rates[2] / posix_rates[2]);
    return 0;
}
