/* Aligned allocation for buffers the kernels stream through (64-byte lines, 4 KiB pages). */
#ifndef MM_BASE_ALLOC_H
#define MM_BASE_ALLOC_H

#include <stddef.h>

#include "megamoe/status.h"

#define MM_CACHE_LINE 64

/* Allocate size bytes aligned to align (a power of two >= sizeof(void*)); size 0 gives a
 * valid unique pointer. OUT_OF_MEMORY (logged, naming the size and what) on failure. */
megamoe_status_t mm_aligned_alloc(size_t size, size_t align, const char *what, void **ptr_p);
/* Same, zero-filled. */
megamoe_status_t mm_aligned_calloc(size_t size, size_t align, const char *what, void **ptr_p);
void mm_aligned_free(void *ptr);
/* This process's resident set in MB (/proc/self/statm; 0 when it cannot be read). */
double mm_resident_mb(void);

static inline size_t mm_align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

#endif /* MM_BASE_ALLOC_H */
