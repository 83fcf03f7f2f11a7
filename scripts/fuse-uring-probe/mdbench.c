// Small-file metadata microbenchmark (mdtest-like). Bounded in count and time.
// usage: mdbench <basedir> <nprocs> <N> <max_seconds_per_phase>
// Each process works in <basedir>/p<i>. Phases are started together via a
// process-shared barrier. Aggregate ops/s = sum(ops) / (max end - min start).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

enum { P_CREATE, P_STAT, P_UNLINK, P_WRITE, P_READ, P_UNLINK2, NPH };
static const char *names[NPH] = {"create", "stat", "unlink", "write3901", "read4k", "unlink_w"};

struct shared {
	pthread_barrier_t bar;
	double start[8][NPH], end[8][NPH];
	long ops[8][NPH];
	long errs[8][NPH];
	double cpu[8][NPH];   /* bench process user+sys seconds */
	double dcpu[NPH];     /* daemon user+sys seconds */
};

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double selfcpu(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
}

static double daemoncpu(void)
{
	const char *p = getenv("DAEMON_PID");
	if (!p) return 0;
	char path[64], b[2048];
	snprintf(path, sizeof path, "/proc/%s/stat", p);
	FILE *f = fopen(path, "r");
	if (!f) return -1;
	size_t n = fread(b, 1, sizeof b - 1, f);
	fclose(f);
	b[n] = 0;
	char *q = strrchr(b, ')');
	if (!q) return -1;
	unsigned long ut = 0, st = 0;
	/* fields after ')': state(3) ... utime(14) stime(15) */
	sscanf(q + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st);
	return (ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static void worker(struct shared *sh, int id, const char *base, long n, double maxs)
{
	char dir[4096], p[4200];
	char buf[4096];
	memset(buf, 'x', sizeof buf);
	snprintf(dir, sizeof dir, "%s/p%d", base, id);
	mkdir(dir, 0755);
	long done_create = 0, done_write = 0;
	for (int ph = 0; ph < NPH; ph++) {
		pthread_barrier_wait(&sh->bar);
		double d0 = id == 0 ? daemoncpu() : 0, c0 = selfcpu();
		double t0 = now(), deadline = t0 + maxs;
		long ops = 0, errs = 0;
		long lim = n;
		if (ph == P_STAT || ph == P_UNLINK) lim = done_create;
		if (ph == P_READ || ph == P_UNLINK2) lim = done_write;
		for (long i = 0; i < lim; i++) {
			if ((i & 63) == 0 && now() > deadline && ph != P_UNLINK && ph != P_UNLINK2)
				break;
			int fd; struct stat st;
			switch (ph) {
			case P_CREATE:
				snprintf(p, sizeof p, "%s/f%ld", dir, i);
				fd = open(p, O_CREAT | O_WRONLY | O_EXCL, 0644);
				if (fd < 0) { errs++; break; }
				close(fd);
				break;
			case P_STAT:
				snprintf(p, sizeof p, "%s/f%ld", dir, i);
				if (stat(p, &st) != 0) errs++;
				break;
			case P_UNLINK:
				snprintf(p, sizeof p, "%s/f%ld", dir, i);
				if (unlink(p) != 0) errs++;
				break;
			case P_WRITE:
				snprintf(p, sizeof p, "%s/w%ld", dir, i);
				fd = open(p, O_CREAT | O_WRONLY | O_EXCL, 0644);
				if (fd < 0) { errs++; break; }
				if (write(fd, buf, 3901) != 3901) errs++;
				close(fd);
				break;
			case P_READ:
				snprintf(p, sizeof p, "%s/w%ld", dir, i);
				fd = open(p, O_RDONLY);
				if (fd < 0) { errs++; break; }
				if (read(fd, buf, 4096) != 3901) errs++;
				close(fd);
				break;
			case P_UNLINK2:
				snprintf(p, sizeof p, "%s/w%ld", dir, i);
				if (unlink(p) != 0) errs++;
				break;
			}
			ops++;
		}
		double t1 = now();
		if (ph == P_CREATE) done_create = ops;
		if (ph == P_WRITE) done_write = ops;
		sh->start[id][ph] = t0; sh->end[id][ph] = t1;
		sh->ops[id][ph] = ops; sh->errs[id][ph] = errs;
		sh->cpu[id][ph] = selfcpu() - c0;
		pthread_barrier_wait(&sh->bar);
		if (id == 0) sh->dcpu[ph] = daemoncpu() - d0;
	}
	rmdir(dir);
}

int main(int argc, char **argv)
{
	if (argc != 5) { fprintf(stderr, "usage\n"); return 2; }
	const char *base = argv[1];
	int np = atoi(argv[2]);
	long n = atol(argv[3]);
	double maxs = atof(argv[4]);
	if (np < 1 || np > 8) return 2;
	struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pthread_barrierattr_t a;
	pthread_barrierattr_init(&a);
	pthread_barrierattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_barrier_init(&sh->bar, &a, np);
	pid_t pids[8];
	for (int i = 0; i < np; i++) {
		pids[i] = fork();
		if (pids[i] == 0) { alarm((unsigned)(maxs * NPH * 3 + 60)); worker(sh, i, base, n, maxs); _exit(0); }
	}
	int bad = 0;
	for (int i = 0; i < np; i++) { int st; waitpid(pids[i], &st, 0); if (!WIFEXITED(st) || WEXITSTATUS(st)) bad = 1; }
	for (int ph = 0; ph < NPH; ph++) {
		double s = 1e18, e = 0, cpu = 0; long ops = 0, errs = 0;
		for (int i = 0; i < np; i++) {
			if (sh->start[i][ph] < s) s = sh->start[i][ph];
			if (sh->end[i][ph] > e) e = sh->end[i][ph];
			ops += sh->ops[i][ph]; errs += sh->errs[i][ph]; cpu += sh->cpu[i][ph];
		}
		/* phase ops secs ops/s errs bench_cpu_us_per_op daemon_cpu_us_per_op */
		printf("%s %ld %.4f %.1f %ld %.2f %.2f\n", names[ph], ops, e - s, ops / (e - s), errs,
		       cpu / ops * 1e6, sh->dcpu[ph] / ops * 1e6);
	}
	return bad;
}
