/* The global memory's C interface, run as several ranks (`ringfs run --ranks N`): every
 * call of ringfs_gmem.h with its errors; prints "gmem checks passed" at the end. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ringfs_gmem.h>

static int failures = 0;

#define CHECK(condition)                                                                          \
    do {                                                                                          \
        if (!(condition)) {                                                                       \
            fprintf(stderr, "rank %d: %s:%d: %s (errno %s)\n", ringfs_gmem_rank(), __FILE__, __LINE__, \
                    #condition, strerror(errno));                                                 \
            failures++;                                                                           \
        }                                                                                         \
    } while (0)

static uint64_t pattern(uint64_t rank, uint64_t word) { return (rank << 48) ^ (word * 0x9e3779b97f4a7c15ULL); }

int main(void) {
    CHECK(ringfs_gmem_init() == 0);
    uint64_t rank = (uint64_t)ringfs_gmem_rank(), ranks = (uint64_t)ringfs_gmem_ranks();
    CHECK(ranks >= 2 && rank < ranks);
    const uint64_t words = 5000;
    int64_t array = ringfs_gmem_alloc(8 * words * ranks, RINGFS_GMEM_CYCLIC, 2, 4096);
    CHECK(array >= 0);

    /* Blocking puts into this rank's part, implicit puts into the next rank's. */
    uint64_t *mine = malloc(8 * words), *next = malloc(8 * words);
    for (uint64_t word = 0; word < words; word++) mine[word] = pattern(rank, rank * words + word);
    CHECK(ringfs_gmem_put(array, 8 * rank * words, mine, 8 * words / 2) == 0);
    ringfs_gmem_handle_t handle = ringfs_gmem_put_nb(array, 8 * (rank * words + words / 2), mine + words / 2, 8 * (words - words / 2));
    CHECK(handle != NULL);
    CHECK(ringfs_gmem_wait(handle) == 0);
    CHECK(ringfs_gmem_barrier() == 0);

    /* Every rank's part, read in three ways. */
    uint64_t peer = (rank + 1) % ranks;
    CHECK(ringfs_gmem_get(next, array, 8 * peer * words, 8 * words) == 0);
    for (uint64_t word = 0; word < words; word++) CHECK(next[word] == pattern(peer, peer * words + word));
    memset(next, 0, 8 * words);
    handle = ringfs_gmem_get_nb(next, array, 8 * peer * words, 8 * words);
    CHECK(handle != NULL);
    while (ringfs_gmem_test(handle) == 0) {
    }
    CHECK(ringfs_gmem_wait(handle) == 0);
    CHECK(next[words - 1] == pattern(peer, peer * words + words - 1));
    uint64_t last = 0;
    CHECK(ringfs_gmem_get_nbi(&last, array, 8 * (peer * words + 17), 8) == 0);
    CHECK(ringfs_gmem_quiet() == 0);
    CHECK(last == pattern(peer, peer * words + 17));

    /* A 2-D tile: 4 rows of 3 words, rows 10 words apart, from word 100. */
    uint64_t tile[12];
    CHECK(ringfs_gmem_get_2d(tile, 3 * 8, array, 8 * 100, 10 * 8, 4, 3 * 8) == 0);
    for (int row = 0; row < 4; row++)
        for (int column = 0; column < 3; column++) {
            uint64_t word = 100 + row * 10 + column;
            CHECK(tile[row * 3 + column] == pattern(word / words, word));
        }
    CHECK(ringfs_gmem_barrier() == 0);

    /* Atomics: every rank adds 1000 times to word 0 of a small array. */
    int64_t counter = ringfs_gmem_alloc(4096, RINGFS_GMEM_BLOCK, 0, 4096);
    CHECK(counter >= 0);
    for (int i = 0; i < 1000; i++) CHECK(ringfs_gmem_fetch_add(counter, 0, 1, NULL) == 0);
    CHECK(ringfs_gmem_barrier() == 0);
    uint64_t total = 0, old = 0;
    CHECK(ringfs_gmem_get(&total, counter, 0, 8) == 0);
    CHECK(total == 1000 * ranks);
    CHECK(ringfs_gmem_compare_swap(counter, 8, 12345, 1, &old) == 0 && old == 0);

    /* Errors. */
    CHECK(ringfs_gmem_get(&old, array, 8 * words * ranks, 8) == -1 && errno == EFAULT);
    CHECK(ringfs_gmem_fetch_add(counter, 3, 1, NULL) == -1 && errno == EINVAL);
    CHECK(ringfs_gmem_get(&old, 999, 0, 8) == -1 && errno == EBADF);
    CHECK(ringfs_gmem_alloc(4096, 7, 0, 4096) == -1 && errno == EINVAL);
    CHECK(ringfs_gmem_barrier() == 0);
    CHECK(ringfs_gmem_free(counter) == 0);
    CHECK(ringfs_gmem_free(array) == 0);
    CHECK(ringfs_gmem_get(&old, array, 0, 8) == -1 && errno == EBADF);
    CHECK(ringfs_gmem_finalize() == 0);
    free(mine);
    free(next);
    if (failures == 0) printf("rank %" PRIu64 ": gmem checks passed\n", rank);
    return failures == 0 ? 0 : 1;
}
