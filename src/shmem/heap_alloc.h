/* Deterministic allocator of the symmetric heap (offsets only, no memory access).
 *
 * First fit by lowest offset over a sorted list of blocks that tile the heap: the same
 * sequence of calls gives the same offsets on every PE, which is what makes an allocation
 * symmetric. Every block starts on a 64-byte line and its size is a multiple of 64, so two
 * allocations never share a cache line (signals in different objects never false-share).
 */
#ifndef MM_SHMEM_HEAP_ALLOC_H
#define MM_SHMEM_HEAP_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#define MM_HEAP_MIN_ALIGN 64
#define MM_HEAP_SITE_MAX 96

typedef struct mm_heap_block {
    uint64_t off, size; /* the block, after rounding and alignment */
    int used;
    uint64_t seq;       /* allocation number (used blocks) */
    uint64_t request;   /* bytes asked for */
    uint64_t align;
    int tag;            /* owner (the team slot that allocated it) */
    char site[MM_HEAP_SITE_MAX];
} mm_heap_block_t;

typedef struct mm_heap_alloc {
    mm_heap_block_t *blocks;
    size_t n, cap;
    uint64_t size, used, peak; /* used/peak count whole blocks */
    int live;
} mm_heap_alloc_t;

/* 0 on success, -1 when out of memory (host malloc). */
int mm_heap_alloc_init(mm_heap_alloc_t *h, uint64_t size);
void mm_heap_alloc_fini(mm_heap_alloc_t *h);
/* Take request bytes aligned to align (power of two; smaller than 64 means 64). 0 on success,
 * -1 when no free block fits, -2 when host memory for the block list ran out. */
int mm_heap_alloc_take(mm_heap_alloc_t *h, uint64_t request, uint64_t align, const char *site,
                       uint64_t seq, uint64_t *off_p);
/* Lowest offset >= min_off where request bytes aligned to align fit in free space (first fit
 * from min_off); 0 with *off_p, -1 when none. Nothing changes. */
int mm_heap_alloc_fit(const mm_heap_alloc_t *h, uint64_t request, uint64_t align,
                      uint64_t min_off, uint64_t *off_p);
/* Take exactly [off, off + rounded request) (it must be free: what mm_heap_alloc_fit said). 0 on
 * success, -1 when not free, -2 when host memory for the block list ran out. */
int mm_heap_alloc_take_at(mm_heap_alloc_t *h, uint64_t off, uint64_t request, uint64_t align,
                          const char *site, uint64_t seq, int tag);
/* Live allocations owned by tag. */
int mm_heap_alloc_count_tag(const mm_heap_alloc_t *h, int tag);
/* Give back the allocation starting at off; -1 when off is not a live allocation. */
int mm_heap_alloc_give(mm_heap_alloc_t *h, uint64_t off);
/* Live allocation starting at off, NULL when none. */
const mm_heap_block_t *mm_heap_alloc_find(const mm_heap_alloc_t *h, uint64_t off);
uint64_t mm_heap_alloc_largest_free(const mm_heap_alloc_t *h);
/* Bytes a request takes (rounded to whole lines). */
uint64_t mm_heap_alloc_rounded(uint64_t request);

#endif /* MM_SHMEM_HEAP_ALLOC_H */
