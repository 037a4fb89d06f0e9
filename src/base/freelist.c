/* Bounded free lists of per-call blocks (see freelist.h). */
#include "base/freelist.h"

#include <string.h>

#include "base/alloc.h"

#define MM_FL_HEADER 64

size_t mm_freelist_size(const void *ptr) { return *(const size_t *)((const char *)ptr - MM_FL_HEADER); }

megamoe_status_t mm_freelist_get(mm_freelist_t *fl, size_t bytes, int zero, const char *what,
                                 void **ptr_p)
{
    if (bytes == 0) bytes = 1;
    void *base = NULL;
    pthread_mutex_lock(&fl->lock);
    int best = -1;
    size_t best_size = 0;
    for (int i = 0; i < fl->n; i++) {
        size_t s = *(size_t *)fl->blocks[i];
        if (s >= bytes && (best < 0 || s < best_size)) {
            best = i;
            best_size = s;
        }
    }
    if (best >= 0) {
        base = fl->blocks[best];
        fl->blocks[best] = fl->blocks[--fl->n];
    }
    pthread_mutex_unlock(&fl->lock);
    if (base == NULL) {
        size_t size = mm_align_up(bytes, MM_CACHE_LINE);
        megamoe_status_t st = mm_aligned_alloc(size + MM_FL_HEADER, MM_CACHE_LINE, what, &base);
        if (st != MEGAMOE_OK) return st;
        *(size_t *)base = size;
    }
    void *p = (char *)base + MM_FL_HEADER;
    if (zero) memset(p, 0, bytes);
    *ptr_p = p;
    return MEGAMOE_OK;
}

void mm_freelist_put(mm_freelist_t *fl, void *ptr)
{
    if (ptr == NULL) return;
    void *base = (char *)ptr - MM_FL_HEADER;
    pthread_mutex_lock(&fl->lock);
    if (fl->n < MM_FREELIST_SLOTS) {
        fl->blocks[fl->n++] = base;
        base = NULL;
    }
    pthread_mutex_unlock(&fl->lock);
    mm_aligned_free(base);
}

void mm_freelist_trim(mm_freelist_t *fl)
{
    pthread_mutex_lock(&fl->lock);
    for (int i = 0; i < fl->n; i++) mm_aligned_free(fl->blocks[i]);
    fl->n = 0;
    pthread_mutex_unlock(&fl->lock);
}
