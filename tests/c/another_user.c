/* Run by tests/c_api.rs as an unprivileged user that holds the job's secret, against files
 * the test made as root: the servers must refuse what the file modes refuse. Prints
 * "another user's checks passed" when every call gave what Linux would. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ringfs.h"

static int failures = 0;

static void expect(const char *what, int result, int wanted_errno) {
    int got = result < 0 ? errno : 0;
    if (got != wanted_errno) {
        fprintf(stderr, "%s: got %s, wanted %s\n", what, got ? strerror(got) : "success",
                wanted_errno ? strerror(wanted_errno) : "success");
        failures++;
    }
}

int main(void) {
    if (ringfs_init(NULL) != 0) {
        perror("ringfs_init");
        return 2;
    }
    struct stat st;
    char byte;
    int fd = ringfs_open("/private", O_RDONLY, 0);
    expect("open another user's 0600 file for reading", fd, EACCES);
    fd = ringfs_open("/private", O_WRONLY, 0);
    expect("open another user's 0600 file for writing", fd, EACCES);
    expect("truncate another user's 0600 file", ringfs_truncate("/private", 0), EACCES);
    expect("chmod another user's file", ringfs_chmod("/private", 0666), EPERM);
    expect("remove a name from a directory of root's", ringfs_unlink("/private"), EACCES);
    expect("create in a directory of root's", ringfs_mkdir("/mine", 0755), EACCES);
    expect("stat below a directory it may not search", ringfs_stat("/closed/inside", &st), EACCES);
    fd = ringfs_open("/public", O_RDONLY, 0);
    expect("open a 0644 file for reading", fd, 0);
    if (fd >= 0) {
        expect("read it", (int)ringfs_read(fd, &byte, 1) - 1, 0);
        ringfs_close(fd);
    }
    fd = ringfs_create("/open/mine", O_WRONLY, 0600);
    expect("create in a 0777 directory", fd, 0);
    if (fd >= 0) {
        ringfs_close(fd);
        expect("stat what it made", ringfs_stat("/open/mine", &st), 0);
        if (st.st_uid != getuid() || st.st_gid != getgid()) {
            fprintf(stderr, "the new file belongs to %u:%u, not to its creator\n", st.st_uid, st.st_gid);
            failures++;
        }
    }
    ringfs_term();
    if (failures == 0) {
        printf("another user's checks passed\n");
    }
    return failures == 0 ? 0 : 1;
}
