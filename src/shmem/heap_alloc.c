/* Deterministic first-fit allocator over a sorted block list. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "heap_alloc.h"

int mm_heap_alloc_init(mm_heap_alloc_t *h, uint64_t size)
{
    memset(h, 0, sizeof *h);
    h->cap = 64;
    h->blocks = calloc(h->cap, sizeof *h->blocks);
    if (h->blocks == NULL) return -1;
    h->size = size / MM_HEAP_MIN_ALIGN * MM_HEAP_MIN_ALIGN;
    h->blocks[0] = (mm_heap_block_t){.off = 0, .size = h->size};
    h->n = h->size ? 1 : 0;
    return 0;
}

void mm_heap_alloc_fini(mm_heap_alloc_t *h)
{
    free(h->blocks);
    memset(h, 0, sizeof *h);
}

uint64_t mm_heap_alloc_rounded(uint64_t request)
{
    if (request == 0) return MM_HEAP_MIN_ALIGN; /* a unique, freeable pointer */
    if (request > UINT64_MAX - MM_HEAP_MIN_ALIGN) return UINT64_MAX;
    return (request + MM_HEAP_MIN_ALIGN - 1) / MM_HEAP_MIN_ALIGN * MM_HEAP_MIN_ALIGN;
}

/* Insert a block at index i (shifting the rest). */
static int mm_heap_insert(mm_heap_alloc_t *h, size_t i, mm_heap_block_t b)
{
    if (h->n == h->cap) {
        size_t cap = h->cap * 2;
        mm_heap_block_t *nb = realloc(h->blocks, cap * sizeof *nb);
        if (nb == NULL) return -1;
        h->blocks = nb;
        h->cap = cap;
    }
    memmove(&h->blocks[i + 1], &h->blocks[i], (h->n - i) * sizeof *h->blocks);
    h->blocks[i] = b;
    h->n++;
    return 0;
}

static void mm_heap_remove(mm_heap_alloc_t *h, size_t i)
{
    memmove(&h->blocks[i], &h->blocks[i + 1], (h->n - i - 1) * sizeof *h->blocks);
    h->n--;
}

int mm_heap_alloc_fit(const mm_heap_alloc_t *h, uint64_t request, uint64_t align,
                      uint64_t min_off, uint64_t *off_p)
{
    if (align < MM_HEAP_MIN_ALIGN) align = MM_HEAP_MIN_ALIGN;
    uint64_t need = mm_heap_alloc_rounded(request);
    if (need == UINT64_MAX) return -1;
    for (size_t i = 0; i < h->n; i++) {
        const mm_heap_block_t *b = &h->blocks[i];
        if (b->used || b->off + b->size <= min_off) continue;
        uint64_t from = b->off > min_off ? b->off : min_off;
        uint64_t start = (from + align - 1) & ~(align - 1);
        if (start < from || start - b->off > b->size || b->size - (start - b->off) < need)
            continue;
        *off_p = start;
        return 0;
    }
    return -1;
}

int mm_heap_alloc_take_at(mm_heap_alloc_t *h, uint64_t off, uint64_t request, uint64_t align,
                          const char *site, uint64_t seq, int tag)
{
    if (align < MM_HEAP_MIN_ALIGN) align = MM_HEAP_MIN_ALIGN;
    uint64_t need = mm_heap_alloc_rounded(request);
    if (need == UINT64_MAX || (off & (align - 1)) != 0) return -1;
    for (size_t i = 0; i < h->n; i++) {
        mm_heap_block_t *b = &h->blocks[i];
        if (b->used || off < b->off || off - b->off > b->size || b->size - (off - b->off) < need)
            continue;
        /* Reserve room for up to two splits before touching the list. */
        if (h->n + 2 > h->cap) {
            size_t cap = h->cap * 2;
            mm_heap_block_t *nb = realloc(h->blocks, cap * sizeof *nb);
            if (nb == NULL) return -2;
            h->blocks = nb;
            h->cap = cap;
            b = &h->blocks[i];
        }
        uint64_t pad = off - b->off, tail = b->size - pad - need;
        if (pad) {
            mm_heap_block_t front = {.off = b->off, .size = pad};
            b->off = off;
            b->size -= pad;
            mm_heap_insert(h, i, front);
            i++;
            b = &h->blocks[i];
        }
        if (tail) {
            mm_heap_block_t rest = {.off = off + need, .size = tail};
            b->size = need;
            mm_heap_insert(h, i + 1, rest);
            b = &h->blocks[i];
        }
        b->used = 1;
        b->seq = seq;
        b->request = request;
        b->align = align;
        b->tag = tag;
        snprintf(b->site, sizeof b->site, "%s", site ? site : "?");
        h->used += need;
        if (h->used > h->peak) h->peak = h->used;
        h->live++;
        return 0;
    }
    return -1;
}

int mm_heap_alloc_take(mm_heap_alloc_t *h, uint64_t request, uint64_t align, const char *site,
                       uint64_t seq, uint64_t *off_p)
{
    uint64_t off = 0;
    if (mm_heap_alloc_fit(h, request, align, 0, &off) != 0) return -1;
    int rc = mm_heap_alloc_take_at(h, off, request, align, site, seq, 0);
    if (rc == 0) *off_p = off;
    return rc;
}

int mm_heap_alloc_count_tag(const mm_heap_alloc_t *h, int tag)
{
    int n = 0;
    for (size_t i = 0; i < h->n; i++) n += h->blocks[i].used && h->blocks[i].tag == tag;
    return n;
}

static long mm_heap_index(const mm_heap_alloc_t *h, uint64_t off)
{
    size_t lo = 0, hi = h->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (h->blocks[mid].off < off) lo = mid + 1;
        else hi = mid;
    }
    if (lo < h->n && h->blocks[lo].off == off && h->blocks[lo].used) return (long)lo;
    return -1;
}

const mm_heap_block_t *mm_heap_alloc_find(const mm_heap_alloc_t *h, uint64_t off)
{
    long i = mm_heap_index(h, off);
    return i < 0 ? NULL : &h->blocks[i];
}

int mm_heap_alloc_give(mm_heap_alloc_t *h, uint64_t off)
{
    long li = mm_heap_index(h, off);
    if (li < 0) return -1;
    size_t i = (size_t)li;
    mm_heap_block_t *b = &h->blocks[i];
    h->used -= b->size;
    h->live--;
    *b = (mm_heap_block_t){.off = b->off, .size = b->size};
    /* Coalesce with free neighbours so first fit keeps finding large blocks. */
    if (i + 1 < h->n && !h->blocks[i + 1].used) {
        b->size += h->blocks[i + 1].size;
        mm_heap_remove(h, i + 1);
    }
    if (i > 0 && !h->blocks[i - 1].used) {
        h->blocks[i - 1].size += h->blocks[i].size;
        mm_heap_remove(h, i);
    }
    return 0;
}

uint64_t mm_heap_alloc_largest_free(const mm_heap_alloc_t *h)
{
    uint64_t best = 0;
    for (size_t i = 0; i < h->n; i++)
        if (!h->blocks[i].used && h->blocks[i].size > best) best = h->blocks[i].size;
    return best;
}
