/* Per-call buffers of MegaMoE (a forward's saved activations): a small process-wide cache of
 * freed buffers, reused by the next calls.
 *
 * Why: a training step allocates the saved state of every forward (several MiB to hundreds
 * of MiB, sized to the rows received) and frees it after the backward. glibc serves such
 * sizes from mmap or from the top of the heap and gives them back to the kernel on free
 * (trim), so every forward paid the page faults of touching them again — measured: the seed
 * shape's O1 forward took 4.3 ms instead of 2.2 ms, with ~1,300 minor faults per step.
 * Reusing freed buffers keeps them mapped and warm. The cache holds at most
 * MM_MOE_BUF_CACHE_ENTRIES buffers and MM_MOE_BUF_CACHE_BYTES bytes (what a step reallocates
 * anyway); a request takes the smallest cached buffer that fits and wastes at most a quarter,
 * so routing that changes the received rows a little still hits. Thread-safe. */
#ifndef MM_MOE_BUFFERS_H
#define MM_MOE_BUFFERS_H

#include <stddef.h>

#include "megamoe/status.h"

#define MM_MOE_BUF_CACHE_ENTRIES 32
#define MM_MOE_BUF_CACHE_BYTES ((size_t)1 << 30)

/* 64-byte aligned buffer of at least size bytes (contents undefined). OUT_OF_MEMORY names
 * what. */
megamoe_status_t mm_moe_buf_alloc(size_t size, const char *what, void **ptr_p);
/* Give it back (to the cache, or to the system when the cache is full). NULL: no-op. */
void mm_moe_buf_free(void *ptr);
/* Free every cached buffer (tests, and when the last resource group closes). */
void mm_moe_buf_trim(void);
/* Bytes held by the cache (tests). */
size_t mm_moe_buf_cached_bytes(void);

#endif /* MM_MOE_BUFFERS_H */
