/* Collective symmetric allocation: every PE runs the same deterministic allocator, and each
 * call first gathers every PE's arguments over the world team so that diverging call
 * sequences are caught (CONFIG_MISMATCH) before they could corrupt anything. Every decision
 * (mismatch, bad argument, exhaustion) is computed from the gathered data, so all PEs return
 * the same status with the same text. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shmem_internal.h"

#define MM_SITE_WIRE MM_HEAP_SITE_MAX
#define MM_FREE_NULL UINT64_MAX
#define MM_FREE_BAD (UINT64_MAX - 1)

typedef struct mm_alloc_entry {
    uint64_t seq, size, align, op; /* op: 1 malloc, 2 free */
    uint64_t off;                  /* free: offset, MM_FREE_NULL or MM_FREE_BAD */
    char site[MM_SITE_WIRE];
} mm_alloc_entry_t;

static megamoe_status_t mm_alloc_gather(mm_alloc_entry_t *mine, mm_alloc_entry_t **all_p)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    mm_alloc_entry_t *all = malloc(sizeof *mine * (size_t)g->n_pes);
    if (all == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "symmetric allocation: out of memory");
    megamoe_status_t st = mm_shmem_team_allgather(&g->world, all, mine, sizeof *mine);
    if (st != MEGAMOE_OK) {
        free(all);
        return st;
    }
    *all_p = all;
    return MEGAMOE_OK;
}

static const char *mm_op_text(uint64_t op) { return op == 1 ? "mm_shmem_malloc" : "mm_shmem_free"; }

/* CONFIG_MISMATCH when the entries differ (same text on every PE). */
static megamoe_status_t mm_alloc_compare(const mm_alloc_entry_t *all, int n)
{
    for (int r = 1; r < n; r++) {
        const mm_alloc_entry_t *a = &all[0], *o = &all[r];
        if (a->seq == o->seq && a->op == o->op && a->size == o->size && a->align == o->align &&
            a->off == o->off)
            continue;
        return mm_error(MEGAMOE_CONFIG_MISMATCH,
                        "symmetric heap call #%" PRIu64 " differs between ranks: rank 0 called "
                        "%s(size %" PRIu64 ", align %" PRIu64 ") at %s, rank %d called "
                        "%s(size %" PRIu64 ", align %" PRIu64 ") at %s (call #%" PRIu64 "); every "
                        "rank must allocate and free the same objects in the same order",
                        a->seq, mm_op_text(a->op), a->size, a->align, a->site, r,
                        mm_op_text(o->op), o->size, o->align, o->site, o->seq);
    }
    return MEGAMOE_OK;
}

megamoe_status_t mm_shmem_malloc_site(size_t size, size_t align, const char *site, void **ptr_p)
{
    if (!mm_shmem_running_now()) return mm_shmem_not_running("mm_shmem_malloc");
    mm_shmem_global_t *g = &mm_shmem_g;
    mm_alloc_entry_t mine;
    memset(&mine, 0, sizeof mine);
    mine.seq = g->alloc_seq;
    mine.op = 1;
    mine.size = size;
    mine.align = align ? align : 64;
    mine.off = ptr_p ? 0 : MM_FREE_BAD;
    snprintf(mine.site, sizeof mine.site, "%s", site ? site : "?");
    mm_alloc_entry_t *all = NULL;
    MM_CHECK(mm_alloc_gather(&mine, &all));
    g->alloc_seq++;
    megamoe_status_t st = mm_alloc_compare(all, g->n_pes);
    uint64_t a = mine.align;
    if (st == MEGAMOE_OK && (a & (a - 1)) != 0)
        st = mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_malloc at %s: alignment %" PRIu64
                      " is not a power of two", all[0].site, a);
    if (st == MEGAMOE_OK && a > MM_SHMEM_SEG_ALIGN)
        st = mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_malloc at %s: alignment %" PRIu64
                      " is larger than the %u bytes the heap guarantees; use at most that",
                      all[0].site, a, (unsigned)MM_SHMEM_SEG_ALIGN);
    if (st == MEGAMOE_OK && mine.off == MM_FREE_BAD)
        st = mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_malloc at %s: ptr_p is NULL",
                      all[0].site);
    uint64_t off = 0;
    if (st == MEGAMOE_OK) {
        pthread_mutex_lock(&g->lock);
        int rc = mm_heap_alloc_take(&g->alloc, size, a, all[0].site, mine.seq, &off);
        uint64_t used = g->alloc.used, largest = mm_heap_alloc_largest_free(&g->alloc);
        pthread_mutex_unlock(&g->lock);
        if (rc == -2) {
            st = mm_error(MEGAMOE_OUT_OF_MEMORY, "mm_shmem_malloc: host memory for the "
                          "allocation table ran out");
        } else if (rc != 0) {
            /* saturating: a request near SIZE_MAX must not wrap to a small suggestion */
            uint64_t need = mm_heap_alloc_rounded(size), extra = used + (a > 64 ? a : 0);
            need = need > UINT64_MAX - extra ? UINT64_MAX : need + extra;
            uint64_t mib = (need >> 20) + ((need & ((1u << 20) - 1)) != 0);
            st = mm_error(MEGAMOE_OUT_OF_MEMORY,
                          "symmetric heap exhausted: mm_shmem_malloc(%" PRIu64 " bytes, align "
                          "%" PRIu64 ") at %s does not fit (%" PRIu64 " of %" PRIu64 " bytes in "
                          "use, largest free block %" PRIu64 "); raise "
                          "HYPER_PARALLEL_SHMEM_HEAP_SIZE to at least %" PRIu64 "M (set the "
                          "same value on every rank)",
                          (uint64_t)size, a, all[0].site, used, g->heap_size, largest, mib);
        }
    }
    free(all);
    if (st != MEGAMOE_OK) return st;
    *ptr_p = g->heap_base + off;
    MM_SHMEM_DEBUG("malloc #%" PRIu64 ": %zu bytes, align %" PRIu64 " -> heap offset 0x%" PRIx64
                   " (%s)", mine.seq, size, a, off, mine.site);
    return MEGAMOE_OK;
}

megamoe_status_t mm_shmem_calloc_site(size_t size, size_t align, const char *site, void **ptr_p)
{
    void *p = NULL;
    MM_CHECK(mm_shmem_malloc_site(size, align, site, &p));
    memset(p, 0, size);
    /* No peer may write into the object before every PE has zeroed its copy. */
    megamoe_status_t st = mm_shmem_barrier_all();
    if (st != MEGAMOE_OK) return st; /* the job is broken; the allocation stays listed */
    *ptr_p = p;
    return MEGAMOE_OK;
}

megamoe_status_t mm_shmem_free(void *ptr)
{
    if (!mm_shmem_running_now()) {
        if (ptr == NULL) return MEGAMOE_OK;
        return mm_shmem_not_running("mm_shmem_free");
    }
    mm_shmem_global_t *g = &mm_shmem_g;
    mm_alloc_entry_t mine;
    memset(&mine, 0, sizeof mine);
    mine.seq = g->alloc_seq;
    mine.op = 2;
    const mm_heap_block_t *b = NULL;
    if (ptr == NULL) {
        mine.off = MM_FREE_NULL;
    } else {
        uintptr_t p = (uintptr_t)ptr, h = (uintptr_t)g->heap_base;
        pthread_mutex_lock(&g->lock);
        b = p >= h && p - h < g->heap_size ? mm_heap_alloc_find(&g->alloc, p - h) : NULL;
        mine.off = b ? (uint64_t)(p - h) : MM_FREE_BAD;
        if (b) {
            mine.size = b->request;
            mine.align = b->align;
            snprintf(mine.site, sizeof mine.site, "%s", b->site);
        }
        pthread_mutex_unlock(&g->lock);
        if (!b)
            MM_SHMEM_DEBUG("mm_shmem_free(%p): not a live symmetric allocation", ptr);
    }
    if (!b) snprintf(mine.site, sizeof mine.site, "%s", ptr ? "(not an allocation)" : "(NULL)");
    mm_alloc_entry_t *all = NULL;
    MM_CHECK(mm_alloc_gather(&mine, &all));
    g->alloc_seq++;
    megamoe_status_t st = MEGAMOE_OK;
    for (int r = 0; r < g->n_pes && st == MEGAMOE_OK; r++)
        if (all[r].off == MM_FREE_BAD)
            st = mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_free (heap call #%" PRIu64 "): "
                          "rank %d passed a pointer that is not a live symmetric allocation "
                          "(freed twice, or not from mm_shmem_malloc)", all[r].seq, r);
    if (st == MEGAMOE_OK) st = mm_alloc_compare(all, g->n_pes);
    free(all);
    if (st != MEGAMOE_OK || ptr == NULL) return st;
    pthread_mutex_lock(&g->lock);
    mm_heap_alloc_give(&g->alloc, mine.off);
    pthread_mutex_unlock(&g->lock);
    MM_SHMEM_DEBUG("free #%" PRIu64 ": heap offset 0x%" PRIx64 " (%s)", mine.seq, mine.off,
                   mine.site);
    return MEGAMOE_OK;
}

/* Text of the live allocations (caller holds the lock). */
size_t mm_shmem_live_table(char *out, size_t len, int max_rows)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    size_t o = 0;
    int rows = 0;
    if (len) out[0] = '\0';
    for (size_t i = 0; i < g->alloc.n && o + 1 < len; i++) {
        const mm_heap_block_t *b = &g->alloc.blocks[i];
        if (!b->used) continue;
        if (rows++ == max_rows) {
            o += (size_t)snprintf(out + o, len - o, "... (%d in all)\n", g->alloc.live);
            break;
        }
        int w = snprintf(out + o, len - o, "offset 0x%" PRIx64 " size %" PRIu64 " (asked %" PRIu64
                         ", align %" PRIu64 ") #%" PRIu64 " at %s\n", b->off, b->size, b->request,
                         b->align, b->seq, b->site);
        if (w < 0) break;
        o += (size_t)w;
    }
    return o < len ? o : len - 1;
}

megamoe_status_t mm_shmem_debug_state(mm_shmem_debug_state_t *state_p)
{
    if (state_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_debug_state: state_p is NULL");
    mm_shmem_global_t *g = &mm_shmem_g;
    memset(state_p, 0, sizeof *state_p);
    pthread_mutex_lock(&g->lock);
    state_p->refcount = g->refcount;
    if (mm_shmem_running_now()) {
        state_p->heap_size = g->heap_size;
        state_p->bytes_used = g->alloc.used;
        state_p->bytes_peak = g->alloc.peak;
        state_p->live_allocations = g->alloc.live;
        mm_shmem_live_table(state_p->live_table, sizeof state_p->live_table, 1 << 30);
    }
    pthread_mutex_unlock(&g->lock);
    return MEGAMOE_OK;
}
