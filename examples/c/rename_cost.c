/*
 * rename_cost.c — what renaming a directory costs: trees of 100, 1,000 and 10,000 entries,
 * flat (all files in the directory) and nested (10 files per directory, directories 10 wide),
 * built through the ringfs C library and, for comparison, with POSIX calls in a directory
 * such as /dev/shm; then the top directory is renamed 5 times back and forth and the median
 * time is printed.
 *
 *   eval "$(ringfs start --servers 2)"
 *   scripts/install-c-library.sh --in-place /tmp/pc
 *   cc -O2 examples/c/rename_cost.c $(PKG_CONFIG_PATH=/tmp/pc pkg-config --cflags --libs ringfs) -o rename_cost
 *   ./rename_cost /dev/shm
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* The two file systems behind one set of calls. */
struct fs {
    int ringfs;
    char prefix[4096];
};

static void path_of(const struct fs *fs, const char *relative, char *out) {
    snprintf(out, 4096, "%s%s", fs->prefix, relative);
}

static int make_dir(const struct fs *fs, const char *relative) {
    char path[4096];
    path_of(fs, relative, path);
    return fs->ringfs ? ringfs_mkdir(path, 0755) : mkdir(path, 0755);
}

static int make_file(const struct fs *fs, const char *relative) {
    char path[4096];
    path_of(fs, relative, path);
    int fd = fs->ringfs ? ringfs_create(path, O_WRONLY, 0644) : open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) {
        return -1;
    }
    return fs->ringfs ? ringfs_close(fd) : close(fd);
}

static int rename_dir(const struct fs *fs, const char *from, const char *to) {
    char a[4096], b[4096];
    path_of(fs, from, a);
    path_of(fs, to, b);
    return fs->ringfs ? ringfs_rename(a, b) : rename(a, b);
}

/* Builds /tree-<tag> with `entries` names; nested trees have 10 files per directory. */
static int build(const struct fs *fs, const char *top, int entries, int nested) {
    char relative[4096];
    if (make_dir(fs, top) != 0) {
        return -1;
    }
    if (!nested) {
        for (int i = 0; i < entries - 0; i++) {
            snprintf(relative, sizeof relative, "%s/f%d", top, i);
            if (make_file(fs, relative) != 0) {
                return -1;
            }
        }
        return 0;
    }
    /* entries = directories + files: each directory holds 10 files. */
    int directories = entries / 11;
    for (int d = 0; d < directories; d++) {
        /* Directory d sits below directory (d - 1) / 10: a tree 10 wide. */
        char parent[2048] = "";
        for (int up = d; up > 0; up = (up - 1) / 10) {
            char part[2048];
            snprintf(part, sizeof part, "/d%d%s", up, parent);
            snprintf(parent, sizeof parent, "%s", part);
        }
        snprintf(relative, sizeof relative, "%s%s", top, parent);
        if (d > 0 && make_dir(fs, relative) != 0) {
            return -1;
        }
        for (int f = 0; f < 10; f++) {
            char file[4096];
            snprintf(file, sizeof file, "%s/f%d", relative, f);
            if (make_file(fs, file) != 0) {
                return -1;
            }
        }
    }
    return 0;
}

/* Median seconds of 5 renames of the tree's top directory (back and forth). */
static double measure(const struct fs *fs, int entries, int nested, int run) {
    char top[256], other[256];
    snprintf(top, sizeof top, "/tree-%d-%d-%d-%d", entries, nested, run, (int)getpid());
    snprintf(other, sizeof other, "%s-renamed", top);
    if (build(fs, top, entries, nested) != 0) {
        fprintf(stderr, "building %s: %s\n", top, strerror(errno));
        exit(1);
    }
    double times[5];
    for (int i = 0; i < 5; i++) {
        const char *from = i % 2 == 0 ? top : other, *to = i % 2 == 0 ? other : top;
        double start = seconds();
        if (rename_dir(fs, from, to) != 0) {
            fprintf(stderr, "rename %s: %s\n", from, strerror(errno));
            exit(1);
        }
        times[i] = seconds() - start;
    }
    qsort(times, 5, sizeof(double), compare);
    return times[2];
}

int main(int argc, char **argv) {
    const char *baseline = argc > 1 ? argv[1] : "/dev/shm";
    if (ringfs_init(NULL) != 0) {
        fprintf(stderr, "ringfs_init: %s (did you run: eval \"$(ringfs start)\"?)\n", strerror(errno));
        return 1;
    }
    struct fs ringfs = {1, ""}, posix = {0, ""};
    snprintf(posix.prefix, sizeof posix.prefix, "%s/rename-cost-%d", baseline, (int)getpid());
    if (mkdir(posix.prefix, 0755) != 0) {
        perror(posix.prefix);
        return 1;
    }
    printf("| entries | layout | ringfs rename | %s rename |\n|---|---|---|---|\n", baseline);
    int sizes[] = {100, 1000, 10000};
    for (int s = 0; s < 3; s++) {
        for (int nested = 0; nested < 2; nested++) {
            double on_ringfs = measure(&ringfs, sizes[s], nested, s);
            double on_posix = measure(&posix, sizes[s], nested, s);
            printf("| %d | %s | %.2f ms | %.3f ms |\n", sizes[s], nested ? "nested" : "flat", on_ringfs * 1e3, on_posix * 1e3);
        }
    }
    printf("(the %s trees are left in %s)\n", baseline, posix.prefix);
    return 0;
}
