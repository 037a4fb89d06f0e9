/* The process-wide cache of freed per-call buffers (see moe_buffers.h). */
#include "moe/moe_buffers.h"

#include <pthread.h>
#include <stdint.h>

#include "base/alloc.h"
#include "base/error.h"

/* Each buffer starts with one 64-byte header line holding its usable size. */
#define MM_BUF_HEADER 64

typedef struct mm_buf_entry {
    void *base;
    size_t size; /* usable bytes */
} mm_buf_entry_t;

static pthread_mutex_t mm_buf_lock = PTHREAD_MUTEX_INITIALIZER;
static mm_buf_entry_t mm_buf_cache[MM_MOE_BUF_CACHE_ENTRIES];
static int mm_buf_count;
static size_t mm_buf_bytes;

/* Sizes rounded up to 1/16 of their power of two (>= 64 KiB steps), so requests that differ a
 * little (the rows received change with the routing) share buffers. */
static size_t mm_buf_round(size_t size)
{
    size_t p = 1;
    while (p <= size / 2) p <<= 1;
    size_t step = p / 16 < ((size_t)64 << 10) ? ((size_t)64 << 10) : p / 16;
    return (size + step - 1) / step * step;
}

megamoe_status_t mm_moe_buf_alloc(size_t size, const char *what, void **ptr_p)
{
    size_t need = mm_buf_round(size > 0 ? size : 1);
    void *base = NULL;
    size_t have = 0;
    pthread_mutex_lock(&mm_buf_lock);
    int best = -1;
    for (int i = 0; i < mm_buf_count; i++) {
        size_t s = mm_buf_cache[i].size;
        if (s >= need && s - need <= need / 4 && (best < 0 || s < mm_buf_cache[best].size)) best = i;
    }
    if (best >= 0) {
        base = mm_buf_cache[best].base;
        have = mm_buf_cache[best].size;
        mm_buf_bytes -= have;
        mm_buf_cache[best] = mm_buf_cache[--mm_buf_count];
    }
    pthread_mutex_unlock(&mm_buf_lock);
    if (base == NULL) {
        MM_CHECK(mm_aligned_alloc(need + MM_BUF_HEADER, 64, what, &base));
        have = need;
    }
    *(size_t *)base = have;
    *ptr_p = (char *)base + MM_BUF_HEADER;
    return MEGAMOE_OK;
}

void mm_moe_buf_free(void *ptr)
{
    if (ptr == NULL) return;
    void *base = (char *)ptr - MM_BUF_HEADER;
    size_t size = *(size_t *)base;
    pthread_mutex_lock(&mm_buf_lock);
    if (mm_buf_count < MM_MOE_BUF_CACHE_ENTRIES && mm_buf_bytes + size <= MM_MOE_BUF_CACHE_BYTES) {
        mm_buf_cache[mm_buf_count].base = base;
        mm_buf_cache[mm_buf_count].size = size;
        mm_buf_count++;
        mm_buf_bytes += size;
        base = NULL;
    }
    pthread_mutex_unlock(&mm_buf_lock);
    mm_aligned_free(base);
}

void mm_moe_buf_trim(void)
{
    pthread_mutex_lock(&mm_buf_lock);
    for (int i = 0; i < mm_buf_count; i++) mm_aligned_free(mm_buf_cache[i].base);
    mm_buf_count = 0;
    mm_buf_bytes = 0;
    pthread_mutex_unlock(&mm_buf_lock);
}

size_t mm_moe_buf_cached_bytes(void)
{
    pthread_mutex_lock(&mm_buf_lock);
    size_t b = mm_buf_bytes;
    pthread_mutex_unlock(&mm_buf_lock);
    return b;
}
