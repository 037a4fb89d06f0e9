/* Bounded free lists of per-call blocks: a block handed back is kept (up to MM_FREELIST_SLOTS
 * of them per list) and handed out again to a request it fits, so repeated calls of the same
 * shapes allocate nothing once warm (docs/architecture.md "Buffer ownership"). One static list
 * per purpose (routing plans, call records, ...); thread-safe; the kept blocks live until the
 * process exits or mm_freelist_trim(). */
#ifndef MM_BASE_FREELIST_H
#define MM_BASE_FREELIST_H

#include <pthread.h>
#include <stddef.h>

#include "megamoe/status.h"

#define MM_FREELIST_SLOTS 16

typedef struct mm_freelist {
    pthread_mutex_t lock;
    int n;
    void *blocks[MM_FREELIST_SLOTS]; /* each starts with a 64-byte header holding its size */
} mm_freelist_t;

#define MM_FREELIST_INIT {PTHREAD_MUTEX_INITIALIZER, 0, {0}}

/* A 64-byte aligned block of at least bytes (zero-filled when zero != 0): the smallest kept
 * one that fits, else a new one. OUT_OF_MEMORY (logged, naming what) on failure. */
megamoe_status_t mm_freelist_get(mm_freelist_t *fl, size_t bytes, int zero, const char *what,
                                 void **ptr_p);
/* Hand a block back (NULL is ignored); freed when the list is full. */
void mm_freelist_put(mm_freelist_t *fl, void *ptr);
/* Usable bytes of a block from mm_freelist_get. */
size_t mm_freelist_size(const void *ptr);
/* Free every kept block. */
void mm_freelist_trim(mm_freelist_t *fl);

#endif /* MM_BASE_FREELIST_H */
