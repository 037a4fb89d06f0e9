/* Collective symmetric allocation over a team (the world team for mm_shmem_malloc).
 *
 * Every PE runs the same deterministic allocator over its own heap. A call first gathers every
 * member's arguments over the team, so diverging call sequences are caught (CONFIG_MISMATCH)
 * before anything changes; every decision (mismatch, bad argument, exhaustion) is computed
 * from the gathered data, so all members return the same status with the same text.
 *
 * The offset must be free on every member. Members of one team have the same allocation
 * history for that team, but each PE also holds allocations of its other teams (an EP group
 * and the world, say), so the members' heaps differ. The offset is agreed by rounds: each
 * member proposes its first fit at or above the candidate, the candidate becomes the largest
 * proposal, until all proposals are equal (the first offset free on every member; usually the
 * first round). Candidates only grow, so the rounds end.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shmem_internal.h"
#include "survive.h"

#define MM_SITE_WIRE MM_HEAP_SITE_MAX
#define MM_FREE_NULL UINT64_MAX
#define MM_FREE_BAD (UINT64_MAX - 1)
#define MM_FIT_NONE UINT64_MAX

typedef struct mm_alloc_entry {
    uint64_t seq, size, align, op; /* op: 1 malloc, 2 free */
    uint64_t off;                  /* malloc: first proposal; free: offset, MM_FREE_NULL/BAD */
    char site[MM_SITE_WIRE];
} mm_alloc_entry_t;

static megamoe_status_t mm_team_gather(mm_shmem_team_t *t, const void *mine, size_t len,
                                       void **all_p)
{
    void *all = malloc(len * (size_t)mm_shmem_team_n_pes(t));
    if (all == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "symmetric allocation: out of memory");
    megamoe_status_t st = mm_shmem_team_allgather(t, all, mine, len);
    if (st != MEGAMOE_OK) {
        free(all);
        return st;
    }
    *all_p = all;
    return MEGAMOE_OK;
}

static const char *mm_op_text(uint64_t op) { return op == 1 ? "mm_shmem_malloc" : "mm_shmem_free"; }

/* CONFIG_MISMATCH when the entries differ (same text on every PE). Offsets are compared for
 * frees only (malloc proposals may differ between members). */
static megamoe_status_t mm_alloc_compare(const mm_shmem_team_t *t, const mm_alloc_entry_t *all)
{
    int n = mm_shmem_team_n_pes(t);
    for (int r = 1; r < n; r++) {
        const mm_alloc_entry_t *a = &all[0], *o = &all[r];
        if (a->seq == o->seq && a->op == o->op && a->size == o->size && a->align == o->align &&
            (a->op != 2 || a->off == o->off))
            continue;
        return mm_error(MEGAMOE_CONFIG_MISMATCH,
                        "symmetric heap call #%" PRIu64 " differs between ranks: rank %d called "
                        "%s(size %" PRIu64 ", align %" PRIu64 ") at %s, rank %d called "
                        "%s(size %" PRIu64 ", align %" PRIu64 ") at %s (call #%" PRIu64 "); every "
                        "rank must allocate and free the same objects in the same order",
                        a->seq, mm_shmem_team_world_pe(t, 0), mm_op_text(a->op), a->size,
                        a->align, a->site, mm_shmem_team_world_pe(t, r), mm_op_text(o->op),
                        o->size, o->align, o->site, o->seq);
    }
    return MEGAMOE_OK;
}

static megamoe_status_t mm_alloc_exhausted(uint64_t size, uint64_t a, const char *site, int pe)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    pthread_mutex_lock(&g->lock);
    uint64_t used = g->alloc.used, largest = mm_heap_alloc_largest_free(&g->alloc);
    pthread_mutex_unlock(&g->lock);
    /* saturating: a request near SIZE_MAX must not wrap to a small suggestion */
    uint64_t need = mm_heap_alloc_rounded(size), extra = used + (a > 64 ? a : 0);
    need = need > UINT64_MAX - extra ? UINT64_MAX : need + extra;
    uint64_t mib = (need >> 20) + ((need & ((1u << 20) - 1)) != 0);
    return mm_error(MEGAMOE_OUT_OF_MEMORY,
                    "symmetric heap exhausted: mm_shmem_malloc(%" PRIu64 " bytes, align %" PRIu64
                    ") at %s does not fit on rank %d (here %" PRIu64 " of %" PRIu64 " bytes in "
                    "use, largest free block %" PRIu64 "); raise HYPER_PARALLEL_SHMEM_HEAP_SIZE "
                    "to at least %" PRIu64 "M (set the same value on every rank)",
                    size, a, site, pe, used, g->heap_size, largest, mib);
}

/* First fit at or above min_off on this PE (MM_FIT_NONE when none). */
static uint64_t mm_alloc_propose(uint64_t size, uint64_t align, uint64_t min_off)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    uint64_t off = MM_FIT_NONE;
    pthread_mutex_lock(&g->lock);
    if (mm_heap_alloc_fit(&g->alloc, size, align, min_off, &off) != 0) off = MM_FIT_NONE;
    pthread_mutex_unlock(&g->lock);
    return off;
}

megamoe_status_t mm_shmem_team_malloc_site(mm_shmem_team_t *t, size_t size, size_t align,
                                           const char *site, void **ptr_p)
{
    if (!mm_shmem_running_now()) return mm_shmem_not_running("mm_shmem_malloc");
    if (t == NULL || t->magic != MM_SHMEM_TEAM_MAGIC)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_team_malloc: not a live team");
    mm_shmem_global_t *g = &mm_shmem_g;
    mm_alloc_entry_t mine;
    memset(&mine, 0, sizeof mine);
    mine.seq = t->alloc_seq;
    mine.op = 1;
    mine.size = size;
    mine.align = align ? align : 64;
    uint64_t a = mine.align;
    int bad_align = (a & (a - 1)) != 0 || a > MM_SHMEM_SEG_ALIGN;
    mine.off = ptr_p == NULL ? MM_FREE_BAD
               : bad_align   ? MM_FIT_NONE
                             : mm_alloc_propose(size, a, 0);
    snprintf(mine.site, sizeof mine.site, "%s", site ? site : "?");
    mm_alloc_entry_t *all = NULL;
    MM_CHECK(mm_team_gather(t, &mine, sizeof mine, (void **)&all));
    t->alloc_seq++;
    int n = t->n;
    megamoe_status_t st = mm_alloc_compare(t, all);
    if (st == MEGAMOE_OK && (a & (a - 1)) != 0)
        st = mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_malloc at %s: alignment %" PRIu64
                      " is not a power of two", all[0].site, a);
    if (st == MEGAMOE_OK && a > MM_SHMEM_SEG_ALIGN)
        st = mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_malloc at %s: alignment %" PRIu64
                      " is larger than the %u bytes the heap guarantees; use at most that",
                      all[0].site, a, (unsigned)MM_SHMEM_SEG_ALIGN);
    for (int r = 0; st == MEGAMOE_OK && r < n; r++)
        if (all[r].off == MM_FREE_BAD)
            st = mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_malloc at %s: ptr_p is NULL on "
                          "rank %d", all[0].site, mm_shmem_team_world_pe(t, r));
    /* agree on the lowest offset free on every member */
    char site_copy[MM_SITE_WIRE];
    snprintf(site_copy, sizeof site_copy, "%s", all[0].site);
    uint64_t *props = NULL;
    uint64_t cand = 0;
    for (int round = 0; st == MEGAMOE_OK; round++) {
        uint64_t top = 0;
        int none = -1, equal = 1;
        for (int r = 0; r < n; r++) {
            uint64_t o = props ? props[r] : all[r].off;
            if (o == MM_FIT_NONE && none < 0) none = r;
            if (o > top) top = o;
            if (o != (props ? props[0] : all[0].off)) equal = 0;
        }
        if (none >= 0) {
            st = mm_alloc_exhausted(size, a, site_copy, mm_shmem_team_world_pe(t, none));
            break;
        }
        if (equal) {
            cand = top;
            break;
        }
        uint64_t next = mm_alloc_propose(size, a, top);
        free(props);
        props = NULL;
        st = mm_team_gather(t, &next, sizeof next, (void **)&props);
        (void)round;
    }
    free(props);
    free(all);
    if (st == MEGAMOE_OK) {
        pthread_mutex_lock(&g->lock);
        int rc = mm_heap_alloc_take_at(&g->alloc, cand, size, a, site_copy, mine.seq, t->slot);
        pthread_mutex_unlock(&g->lock);
        if (rc != 0) /* host memory for the block list; the others took theirs: job broken */
            st = mm_error(rc == -2 ? MEGAMOE_OUT_OF_MEMORY : MEGAMOE_INTERNAL, "mm_shmem_malloc: "
                          "%s", rc == -2 ? "host memory for the allocation table ran out"
                                         : "the agreed offset is not free here");
    }
    if (st != MEGAMOE_OK) return st;
    *ptr_p = g->heap_base + cand;
    MM_SHMEM_DEBUG("malloc #%" PRIu64 ": %zu bytes, align %" PRIu64 " -> heap offset 0x%" PRIx64
                   " (%s; team slot %d)", mine.seq, size, a, cand, site_copy, t->slot);
    return MEGAMOE_OK;
}

megamoe_status_t mm_shmem_malloc_site(size_t size, size_t align, const char *site, void **ptr_p)
{
    if (!mm_shmem_running_now()) return mm_shmem_not_running("mm_shmem_malloc");
    return mm_shmem_team_malloc_site(&mm_shmem_g.world, size, align, site, ptr_p);
}

megamoe_status_t mm_shmem_team_calloc_site(mm_shmem_team_t *t, size_t size, size_t align,
                                           const char *site, void **ptr_p)
{
    void *p = NULL;
    MM_CHECK(mm_shmem_team_malloc_site(t, size, align, site, &p));
    memset(p, 0, size);
    /* No peer may write into the object before every member has zeroed its copy. */
    megamoe_status_t st = mm_shmem_team_barrier(t);
    if (st != MEGAMOE_OK) return st; /* the job is broken; the allocation stays listed */
    *ptr_p = p;
    return MEGAMOE_OK;
}

megamoe_status_t mm_shmem_calloc_site(size_t size, size_t align, const char *site, void **ptr_p)
{
    if (!mm_shmem_running_now()) return mm_shmem_not_running("mm_shmem_calloc");
    return mm_shmem_team_calloc_site(&mm_shmem_g.world, size, align, site, ptr_p);
}

megamoe_status_t mm_shmem_team_free(mm_shmem_team_t *t, void *ptr)
{
    if (!mm_shmem_running_now()) {
        if (ptr == NULL) return MEGAMOE_OK;
        return mm_shmem_not_running("mm_shmem_free");
    }
    if (t == NULL || t->magic != MM_SHMEM_TEAM_MAGIC)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_team_free: not a live team");
    mm_shmem_global_t *g = &mm_shmem_g;
    mm_alloc_entry_t mine;
    memset(&mine, 0, sizeof mine);
    mine.seq = t->alloc_seq;
    mine.op = 2;
    const mm_heap_block_t *b = NULL;
    const char *why = "(not an allocation)";
    if (ptr == NULL) {
        mine.off = MM_FREE_NULL;
    } else {
        uintptr_t p = (uintptr_t)ptr, h = (uintptr_t)g->heap_base;
        pthread_mutex_lock(&g->lock);
        b = p >= h && p - h < g->heap_size ? mm_heap_alloc_find(&g->alloc, p - h) : NULL;
        if (b && b->tag != t->slot) {
            why = "(allocated by another team)";
            b = NULL;
        }
        mine.off = b ? (uint64_t)(p - h) : MM_FREE_BAD;
        if (b) {
            mine.size = b->request;
            mine.align = b->align;
            snprintf(mine.site, sizeof mine.site, "%s", b->site);
        }
        pthread_mutex_unlock(&g->lock);
        if (!b) MM_SHMEM_DEBUG("mm_shmem_free(%p): not a live allocation of this team", ptr);
    }
    if (!b) snprintf(mine.site, sizeof mine.site, "%s", ptr ? why : "(NULL)");
    /* A team with a lost member (or on a rank that stopped) frees locally: the survivors each
     * do the same, and the allocator copes with heaps that differ. */
    (void)mm_surv_recover("mm_shmem_free");
    if (mm_surv_stopped() || mm_shmem_team_lost_member(t) >= 0) {
        if (ptr == NULL) return MEGAMOE_OK;
        if (!b)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_free: %p is not a live symmetric "
                            "allocation of this team %s", ptr, why);
        pthread_mutex_lock(&g->lock);
        mm_heap_alloc_give(&g->alloc, mine.off);
        pthread_mutex_unlock(&g->lock);
        MM_SHMEM_DEBUG("free (local, team with a lost member): heap offset 0x%" PRIx64 " (%s)",
                       mine.off, mine.site);
        return MEGAMOE_OK;
    }
    mm_alloc_entry_t *all = NULL;
    MM_CHECK(mm_team_gather(t, &mine, sizeof mine, (void **)&all));
    t->alloc_seq++;
    megamoe_status_t st = MEGAMOE_OK;
    for (int r = 0; r < t->n && st == MEGAMOE_OK; r++)
        if (all[r].off == MM_FREE_BAD)
            st = mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_free (heap call #%" PRIu64 "): "
                          "rank %d passed a pointer that is not a live symmetric allocation of "
                          "this team %s", all[r].seq, mm_shmem_team_world_pe(t, r), all[r].site);
    if (st == MEGAMOE_OK) st = mm_alloc_compare(t, all);
    free(all);
    if (st != MEGAMOE_OK || ptr == NULL) return st;
    pthread_mutex_lock(&g->lock);
    mm_heap_alloc_give(&g->alloc, mine.off);
    pthread_mutex_unlock(&g->lock);
    MM_SHMEM_DEBUG("free #%" PRIu64 ": heap offset 0x%" PRIx64 " (%s)", mine.seq, mine.off,
                   mine.site);
    return MEGAMOE_OK;
}

megamoe_status_t mm_shmem_free(void *ptr)
{
    if (!mm_shmem_running_now()) {
        if (ptr == NULL) return MEGAMOE_OK;
        return mm_shmem_not_running("mm_shmem_free");
    }
    return mm_shmem_team_free(&mm_shmem_g.world, ptr);
}

int mm_shmem_team_live_allocations(const mm_shmem_team_t *t)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    pthread_mutex_lock(&g->lock);
    int n = mm_heap_alloc_count_tag(&g->alloc, t->slot);
    pthread_mutex_unlock(&g->lock);
    return n;
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

uint64_t mm_shmem_heap_touched_bytes(void)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    uint64_t bytes = 0;
    pthread_mutex_lock(&g->lock);
    if (mm_shmem_running_now()) {
        /* A page of the shm object exists once any PE touched it (sparse until then); for a
         * shared mapping mincore() reports exactly those, whoever touched them. */
        size_t page = (size_t)sysconf(_SC_PAGESIZE), n = (size_t)((g->heap_size + page - 1) / page);
        unsigned char *vec = malloc(n ? n : 1);
        if (vec != NULL && mincore(g->heap_base, (size_t)g->heap_size, vec) == 0)
            for (size_t i = 0; i < n; i++) bytes += (vec[i] & 1) ? page : 0;
        free(vec);
    }
    pthread_mutex_unlock(&g->lock);
    return bytes;
}
