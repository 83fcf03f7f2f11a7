/*
 * hello.c — write a file into ringfs, read it back, and list the directory.
 *
 *   eval "$(ringfs start)"
 *   scripts/install-c-library.sh --in-place /tmp/pc
 *   cc examples/c/hello.c $(PKG_CONFIG_PATH=/tmp/pc pkg-config --cflags --libs ringfs) -o hello
 *   ./hello
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>

#include <ringfs.h>

static int print_entry(void *context, const char *name, const struct stat *st, off_t next) {
    (void)context;
    (void)next;
    printf("  %-12s %8lld bytes\n", name, (long long)st->st_size);
    return 0;
}

int main(void) {
    if (ringfs_init(NULL) != 0) {
        fprintf(stderr, "ringfs_init: %s (did you run: eval \"$(ringfs start)\"?)\n", strerror(errno));
        return 1;
    }
    if (ringfs_mkdir("/hello", 0755) != 0 && errno != EEXIST) {
        perror("ringfs_mkdir");
        return 1;
    }
    const char *text = "Hello from C through ringfs\n";
    int fd = ringfs_create("/hello/greeting.txt", O_WRONLY, 0644);
    if (fd < 0 || ringfs_write(fd, text, strlen(text)) != (ssize_t)strlen(text) || ringfs_close(fd) != 0) {
        perror("writing /hello/greeting.txt");
        return 1;
    }
    char buffer[128] = {0};
    fd = ringfs_open("/hello/greeting.txt", O_RDONLY, 0);
    ssize_t count = ringfs_read(fd, buffer, sizeof buffer - 1);
    ringfs_close(fd);
    printf("read back %zd bytes: %s", count, buffer);
    printf("/hello holds:\n");
    ringfs_readdir("/hello", NULL, print_entry);
    ringfs_term();
    return 0;
}
