/* Global memory from C: every rank writes its number into a shared array, then each reads
 * all of them and they count together with an atomic.
 *
 *   cc gmem_hello.c $(pkg-config --cflags --libs ringfs) -o gmem_hello
 *   ringfs run --ranks 4 -- ./gmem_hello
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <ringfs_gmem.h>

int main(void) {
    if (ringfs_gmem_init() != 0) {
        fprintf(stderr, "ringfs_gmem_init: %s (run me with `ringfs run --ranks N -- ...`)\n", strerror(errno));
        return 1;
    }
    uint64_t rank = (uint64_t)ringfs_gmem_rank(), ranks = (uint64_t)ringfs_gmem_ranks();
    int64_t array = ringfs_gmem_alloc(8 * (ranks + 1), RINGFS_GMEM_BLOCK, 0, 4096);
    if (array < 0 || ringfs_gmem_put(array, 8 * (rank + 1), &rank, 8) != 0 || ringfs_gmem_fetch_add(array, 0, 1, NULL) != 0 ||
        ringfs_gmem_barrier() != 0) {
        fprintf(stderr, "rank %" PRIu64 ": %s\n", rank, strerror(errno));
        return 1;
    }
    uint64_t words[64] = {0};
    if (ranks > 63 || ringfs_gmem_get(words, array, 0, 8 * (ranks + 1)) != 0) {
        fprintf(stderr, "rank %" PRIu64 ": %s\n", rank, strerror(errno));
        return 1;
    }
    printf("rank %" PRIu64 " of %" PRIu64 " sees %" PRIu64 " arrivals; last rank wrote %" PRIu64 "\n", rank, ranks, words[0], words[ranks]);
    ringfs_gmem_barrier();
    ringfs_gmem_free(array);
    return ringfs_gmem_finalize() == 0 && words[0] == ranks && words[ranks] == ranks - 1 ? 0 : 1;
}
