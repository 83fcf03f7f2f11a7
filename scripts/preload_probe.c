/* scripts/preload_probe.c: the cost of one call made by a program, plain, under
 * libringfs_preload.so (a kernel path passes through; a ringfs path goes to the client), and
 * trapped by a seccomp filter into a SIGSYS handler (system-call interception without binary
 * rewriting). Numbers in docs/PERFORMANCE.md ("LD_PRELOAD library"). Build: cc -O2 -o probe
 * scripts/preload_probe.c; run: probe stat PATH [N] | probe create DIR [N] | probe seccomp. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void on_sigsys(int signal, siginfo_t *info, void *context) {
    (void)signal; (void)info; (void)context; /* an interceptor would emulate the call here */
}

int main(int argc, char **argv) {
    const char *mode = argv[1];
    const char *path = argc > 2 ? argv[2] : "/tmp";
    int iterations = argc > 3 ? atoi(argv[3]) : 200000;
    struct stat st;
    if (strcmp(mode, "stat") == 0) {
        double start = now();
        for (int i = 0; i < iterations; i++)
            if (stat(path, &st) != 0) { perror("stat"); return 1; }
        printf("stat %s: %.3f us/call\n", path, (now() - start) / iterations * 1e6);
    } else if (strcmp(mode, "create") == 0) {
        char name[4096];
        double start = now();
        for (int i = 0; i < iterations; i++) {
            snprintf(name, sizeof name, "%s/f%d", path, i);
            int fd = open(name, O_CREAT | O_WRONLY, 0644);
            if (fd < 0 || close(fd) != 0) { perror("create"); return 1; }
        }
        double created = now();
        for (int i = 0; i < iterations; i++) {
            snprintf(name, sizeof name, "%s/f%d", path, i);
            if (stat(name, &st) != 0) { perror("stat"); return 1; }
        }
        double stated = now();
        for (int i = 0; i < iterations; i++) {
            snprintf(name, sizeof name, "%s/f%d", path, i);
            if (unlink(name) != 0) { perror("unlink"); return 1; }
        }
        double removed = now();
        printf("%s: create %.0f/s stat %.0f/s remove %.0f/s\n", path, iterations / (created - start),
               iterations / (stated - created), iterations / (removed - stated));
    } else if (strcmp(mode, "seccomp") == 0) {
        struct sigaction action = {0};
        action.sa_sigaction = on_sigsys;
        action.sa_flags = SA_SIGINFO;
        sigaction(SIGSYS, &action, NULL);
        struct sock_filter filter[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getppid, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        struct sock_fprog program = {sizeof filter / sizeof *filter, filter};
        double start = now();
        for (int i = 0; i < iterations; i++) syscall(SYS_getppid);
        double plain = (now() - start) / iterations * 1e6;
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) { perror("seccomp"); return 1; }
        start = now();
        for (int i = 0; i < iterations; i++) syscall(SYS_getppid);
        double trapped = (now() - start) / iterations * 1e6;
        printf("getppid: %.3f us/call plain, %.3f us/call trapped by seccomp (SIGSYS)\n", plain, trapped);
    }
    return 0;
}
