/* ringfs global memory: a partitioned global address space held by the ringfs servers (in
 * their DRAM, spilling to their node-local SSDs), in libringfs.
 *
 * The ranks of a job (started by `ringfs run --ranks P -- ./app`, or by mpirun/srun: the
 * rank comes from the launcher's variables, no MPI library is needed) allocate arrays
 * collectively and copy bytes between them and their own memory:
 *
 *     ringfs_gmem_init();
 *     int64_t a = ringfs_gmem_alloc(1 << 30, RINGFS_GMEM_BLOCK, 0, 256 << 10);
 *     uint64_t mine = ringfs_gmem_rank();
 *     ringfs_gmem_put(a, 8 * mine, &mine, 8);
 *     ringfs_gmem_barrier();
 *     uint64_t first;
 *     ringfs_gmem_get(&first, a, 0, 8);
 *     ringfs_gmem_free(a);
 *     ringfs_gmem_finalize();
 *
 * Every function returns -1 (NULL for handles) and sets errno on failure: EFAULT for a range
 * outside the array, ESTALE for a freed array, EBADF for an unknown array handle, EINVAL for
 * bad arguments, EIO when a block's home does not answer within the request deadline
 * (RINGFS_TIMEOUT_MS). All functions are thread-safe.
 *
 * Completion and ordering (docs/CONSISTENCY.md, "Global memory"): a blocking put is complete
 * when it returns — any get that starts afterwards, by any rank, sees it; a non-blocking put
 * is complete when its handle is waited for; implicit (_nbi) operations when
 * ringfs_gmem_quiet (or a barrier) returns. ringfs_gmem_barrier completes this rank's
 * implicit operations, then waits for every rank. Atomics on one word are linearizable.
 */
#ifndef RINGFS_GMEM_H
#define RINGFS_GMEM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Distributions: which server homes each block. */
#define RINGFS_GMEM_BLOCK 0  /* rank r's server homes the r-th contiguous part */
#define RINGFS_GMEM_CYCLIC 1 /* runs of `cyclic_blocks` blocks go to the ranks in turn */
#define RINGFS_GMEM_HASHED 2 /* each block on a server picked by a hash */

/* A non-blocking get or put under way. */
typedef struct ringfs_gmem_pending *ringfs_gmem_handle_t;

/* Joins the job (servers from RINGFS_SERVER and RINGFS_SECRET). */
int ringfs_gmem_init(void);
/* Completes this rank's implicit operations and leaves the job. */
int ringfs_gmem_finalize(void);
int ringfs_gmem_rank(void);
int ringfs_gmem_ranks(void);

/* Collective: every rank calls it with the same arguments, in the same order. An array of
 * `bytes` bytes (zeros) in blocks of `block_size` bytes (a power of two, at most 16 MiB);
 * returns the array's handle (>= 0). */
int64_t ringfs_gmem_alloc(uint64_t bytes, int distribution, uint32_t cyclic_blocks, uint32_t block_size);
/* Collective: the array's memory goes once every rank has freed it. */
int ringfs_gmem_free(int64_t array);

/* Blocking copies between the array at `offset` and local memory. */
int ringfs_gmem_get(void *destination, int64_t array, uint64_t offset, size_t len);
int ringfs_gmem_put(int64_t array, uint64_t offset, const void *source, size_t len);

/* Non-blocking, with a handle: `destination` must stay valid until the handle is waited
 * for; put_nb copies `source` at once. ringfs_gmem_wait completes and frees the handle;
 * ringfs_gmem_test returns 1 if it completed, 0 if not. */
ringfs_gmem_handle_t ringfs_gmem_get_nb(void *destination, int64_t array, uint64_t offset, size_t len);
ringfs_gmem_handle_t ringfs_gmem_put_nb(int64_t array, uint64_t offset, const void *source, size_t len);
int ringfs_gmem_wait(ringfs_gmem_handle_t handle);
int ringfs_gmem_test(ringfs_gmem_handle_t handle);

/* Non-blocking, implicit: complete at ringfs_gmem_quiet (or a barrier); the local memory
 * must stay valid and untouched until then. */
int ringfs_gmem_get_nbi(void *destination, int64_t array, uint64_t offset, size_t len);
int ringfs_gmem_put_nbi(int64_t array, uint64_t offset, const void *source, size_t len);
int ringfs_gmem_quiet(void);
/* Orders implicit puts (issued before complete before those issued after). */
int ringfs_gmem_fence(void);
/* Completes this rank's implicit operations, then waits for every rank. */
int ringfs_gmem_barrier(void);

/* Strided 2-D copies: `rows` rows of `row_bytes` bytes, `pitch` bytes apart in the array
 * starting at `offset`, and `local_pitch` bytes apart in local memory. */
int ringfs_gmem_get_2d(void *destination, size_t local_pitch, int64_t array, uint64_t offset, uint64_t pitch, uint64_t rows,
                       uint64_t row_bytes);
int ringfs_gmem_put_2d(int64_t array, uint64_t offset, uint64_t pitch, uint64_t rows, uint64_t row_bytes, const void *source,
                       size_t local_pitch);

/* 64-bit atomics on the little-endian word at `offset` (8-byte aligned); the word before the
 * operation goes to `*old` (if not NULL). compare_swap sets the word to `desired` if it
 * equals `expected`. */
int ringfs_gmem_fetch_add(int64_t array, uint64_t offset, uint64_t value, uint64_t *old);
int ringfs_gmem_compare_swap(int64_t array, uint64_t offset, uint64_t expected, uint64_t desired, uint64_t *old);

#ifdef __cplusplus
}
#endif

#endif /* RINGFS_GMEM_H */
