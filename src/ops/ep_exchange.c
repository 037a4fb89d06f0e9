/* One-sided row exchange: direct stores into peers' mapped buffers (same host) or SHMEM puts. */
#include "ops/ep_exchange.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

#define MM_EP_SIG_STRIDE (64 / sizeof(uint64_t)) /* one signal per 64-byte line */

int mm_ep_force_puts;

/* The peer's mapping of a symmetric address, or NULL to go through mm_shmem_put. */
static inline void *mm_ep_direct(void *sym, int pe)
{
    return mm_ep_force_puts ? NULL : mm_shmem_ptr(sym, pe);
}

static inline uint64_t *mm_ep_sig(const mm_ep_xbuf_t *x, int dir, int src)
{
    return x->sig + ((size_t)dir * (size_t)x->ep + (size_t)src) * MM_EP_SIG_STRIDE;
}

size_t mm_ep_xbuf_heap_bytes(int ep, int64_t capacity, int64_t ret_rows, size_t row_bytes)
{
    /* Each allocation is rounded to 4 KiB (page) alignment by us, plus the signal lines. */
    size_t recv = mm_align_up((size_t)(capacity > 0 ? capacity : 1) * row_bytes, 4096);
    size_t ret = mm_align_up((size_t)(ret_rows > 0 ? ret_rows : 1) * row_bytes, 4096);
    size_t sig = mm_align_up((size_t)2 * (size_t)ep * 64, 4096);
    return recv + ret + sig;
}

megamoe_status_t mm_ep_xbuf_create(mm_shmem_team_t *team, int64_t capacity, int64_t ret_rows,
                                   size_t row_bytes, mm_ep_xbuf_t **xbuf_p)
{
    int ep = mm_shmem_team_n_pes(team);
    mm_ep_xbuf_t *x = calloc(1, sizeof *x);
    int *pes = calloc((size_t)(ep > 0 ? ep : 1), sizeof *pes);
    if (x == NULL || pes == NULL) {
        free(x);
        free(pes);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate exchange buffer descriptors");
    }
    x->team = team;
    x->ep = ep;
    x->me = mm_shmem_team_my_pe(team);
    x->pes = pes;
    for (int i = 0; i < ep; i++) pes[i] = mm_shmem_team_world_pe(team, i);
    x->row_bytes = row_bytes;
    x->capacity = capacity;
    x->ret_rows = ret_rows;
    /* Same order and sizes on every PE: the allocations are symmetric. */
    size_t recv_bytes = (size_t)(capacity > 0 ? capacity : 1) * row_bytes;
    size_t ret_bytes = (size_t)(ret_rows > 0 ? ret_rows : 1) * row_bytes;
    size_t sig_bytes = (size_t)2 * (size_t)ep * 64;
    megamoe_status_t st = mm_shmem_team_malloc(team, recv_bytes, 4096, &x->recv);
    if (st == MEGAMOE_OK) st = mm_shmem_team_malloc(team, ret_bytes, 4096, &x->ret);
    if (st == MEGAMOE_OK) st = mm_shmem_team_malloc(team, sig_bytes, 4096, (void **)&x->sig);
    if (st == MEGAMOE_OK) {
        memset(x->sig, 0, sig_bytes);
        st = mm_shmem_team_barrier(team);
    }
    if (st != MEGAMOE_OK) {
        /* Every PE failed the same collective allocation, so freeing what exists is symmetric. */
        mm_ep_xbuf_destroy(x);
        return st;
    }
    *xbuf_p = x;
    return MEGAMOE_OK;
}

megamoe_status_t mm_ep_xbuf_destroy(mm_ep_xbuf_t *x)
{
    if (x == NULL) return MEGAMOE_OK;
    megamoe_status_t st = MEGAMOE_OK, s;
    /* Reverse order of allocation. */
    if (x->sig && (s = mm_shmem_team_free(x->team, x->sig)) != MEGAMOE_OK && st == MEGAMOE_OK) st = s;
    if (x->ret && (s = mm_shmem_team_free(x->team, x->ret)) != MEGAMOE_OK && st == MEGAMOE_OK) st = s;
    if (x->recv && (s = mm_shmem_team_free(x->team, x->recv)) != MEGAMOE_OK && st == MEGAMOE_OK)
        st = s;
    free(x->pes);
    free(x);
    return st;
}

/* Keep the first failure of the call for mm_ep_wait (any thread); returns st. */
static megamoe_status_t mm_ep_fail(const mm_ep_xbuf_t *x, megamoe_status_t st)
{
    if (st != MEGAMOE_OK) {
        int none = 0;
        __atomic_compare_exchange_n((int *)&x->failed, &none, (int)st, 0, __ATOMIC_RELAXED,
                                    __ATOMIC_RELAXED);
    }
    return st;
}

/* Copy n rows to rows [dst_row, dst_row + n) of symmetric buffer sym on PE pe. */
static inline megamoe_status_t mm_ep_put_rows(void *sym, int64_t dst_row, const void *src,
                                              size_t ld, int64_t n, size_t row_bytes, int pe)
{
    if (n <= 0) return MEGAMOE_OK;
    char *dst_local = (char *)sym + (size_t)dst_row * row_bytes;
    char *direct = mm_ep_direct(dst_local, pe);
    if (ld == row_bytes) {
        if (direct) memcpy(direct, src, (size_t)n * row_bytes);
        else return mm_shmem_put(dst_local, src, (size_t)n * row_bytes, pe);
        return MEGAMOE_OK;
    }
    for (int64_t i = 0; i < n; i++) {
        const char *s = (const char *)src + (size_t)i * ld;
        if (direct) memcpy(direct + (size_t)i * row_bytes, s, row_bytes);
        else MM_CHECK(mm_shmem_put(dst_local + (size_t)i * row_bytes, s, row_bytes, pe));
    }
    return MEGAMOE_OK;
}

megamoe_status_t mm_ep_dispatch_rows(const mm_ep_xbuf_t *x, const mm_ep_plan_t *p,
                                     const void *src, size_t ld, int gather, int64_t p0,
                                     int64_t p1)
{
    if (p0 >= p1) return MEGAMOE_OK;
    const size_t rb = x->row_bytes;
    /* segments: this rank's contiguous rows for one destination slot, in permuted order */
    int32_t k = mm_ep_seg_of_pos(p, p0);
    int64_t pos = p0;
    while (pos < p1 && k < p->n_seg) {
        const int32_t q = p->seg_order[k];
        const int64_t s0 = p->seg_pos[q], s1 = s0 + p->seg_rows[q];
        if (s1 <= pos) {
            k++;
            continue;
        }
        int64_t end = s1 < p1 ? s1 : p1;
        int pe = x->pes[q / p->S];
        int64_t row = p->seg_dst[q] + (pos - s0);
        if (!gather) {
            MM_CHECK(mm_ep_fail(x, mm_ep_put_rows(x->recv, row,
                                                  (const char *)src + (size_t)pos * ld, ld,
                                                  end - pos, rb, pe)));
        } else {
            char *dst_local = (char *)x->recv + (size_t)row * rb;
            char *direct = mm_ep_direct(dst_local, pe);
            for (int64_t r = pos; r < end; r++) {
                const char *sr = (const char *)src + (size_t)(p->perm_slot[r] / p->K) * ld;
                size_t off = (size_t)(r - pos) * rb;
                if (direct) memcpy(direct + off, sr, rb);
                else MM_CHECK(mm_ep_fail(x, mm_shmem_put(dst_local + off, sr, rb, pe)));
            }
        }
        pos = end;
        k++;
    }
    return MEGAMOE_OK;
}

int mm_ep_dispatch_direct(const mm_ep_xbuf_t *x)
{
    for (int i = 0; i < x->ep; i++)
        if (mm_ep_direct(x->recv, x->pes[i]) == NULL) return 0;
    return 1;
}

void *mm_ep_dispatch_dst(const mm_ep_xbuf_t *x, const mm_ep_plan_t *p, int64_t pos)
{
    int dest;
    int64_t row = mm_ep_dst_row(p, pos, &dest);
    return mm_shmem_ptr((char *)x->recv + (size_t)row * x->row_bytes, x->pes[dest]);
}

megamoe_status_t mm_ep_combine_rows(const mm_ep_xbuf_t *x, const mm_ep_plan_t *p,
                                    const void *rows, size_t ld, int64_t r0, int64_t r1)
{
    const int ep = p->ep;
    const int64_t nblk = p->S * ep;
    for (int64_t b = 0; b < nblk && r0 < r1; b++) {
        int64_t bo = p->blk_off[b], bn = p->blk_rows[b];
        if (bn == 0 || bo + bn <= r0) continue;
        if (bo >= r1) break;
        int64_t s0 = r0 > bo ? r0 : bo, s1 = r1 < bo + bn ? r1 : bo + bn;
        int src = (int)(b % ep);
        MM_CHECK(mm_ep_fail(x, mm_ep_put_rows(x->ret, p->ret_off[b] + (s0 - bo),
                                              (const char *)rows + (size_t)s0 * ld, ld, s1 - s0,
                                              x->row_bytes, x->pes[src])));
    }
    return MEGAMOE_OK;
}

void mm_ep_stage_rows(const mm_ep_xbuf_t *x, const mm_ep_plan_t *p, const void *src,
                      size_t ld, int gather, int64_t p0, int64_t p1)
{
    const size_t rb = x->row_bytes;
    for (int64_t q = p0; q < p1; q++) {
        const char *s = (const char *)src + (size_t)(gather ? p->perm_slot[q] / p->K : q) * ld;
        memcpy(mm_ep_stage_dst(x, q), s, rb);
    }
}

megamoe_status_t mm_ep_pull_rows(const mm_ep_xbuf_t *x, const mm_ep_plan_t *p, void *dst,
                                 size_t ld, int64_t r0, int64_t r1)
{
    const int ep = p->ep;
    const size_t rb = x->row_bytes;
    const int64_t nblk = p->S * ep;
    for (int64_t b = 0; b < nblk && r0 < r1; b++) {
        int64_t bo = p->blk_off[b], bn = p->blk_rows[b];
        if (bn == 0 || bo + bn <= r0) continue;
        if (bo >= r1) break;
        int64_t s0 = r0 > bo ? r0 : bo, s1 = r1 < bo + bn ? r1 : bo + bn;
        /* block (j, s) is source s's rows for expert e, at its permuted position ret_off[b] */
        const char *sym = (const char *)x->recv + (size_t)(p->ret_off[b] + (s0 - bo)) * rb;
        const int pe = x->pes[b % ep];
        const char *mapped = mm_ep_direct((void *)sym, pe);
        char *out = (char *)dst + (size_t)(s0 - r0) * ld;
        const size_t n = (size_t)(s1 - s0);
        megamoe_status_t st = MEGAMOE_OK;
        if (ld == rb) {
            if (mapped) memcpy(out, mapped, n * rb);
            else st = mm_shmem_get(out, sym, n * rb, pe);
        } else {
            for (size_t i = 0; i < n && st == MEGAMOE_OK; i++) {
                if (mapped) memcpy(out + i * ld, mapped + i * rb, rb);
                else st = mm_shmem_get(out + i * ld, sym + i * rb, rb, pe);
            }
        }
        if (st != MEGAMOE_OK) { /* no row of the range is left unwritten */
            for (int64_t r = r0; r < r1; r++) memset((char *)dst + (size_t)(r - r0) * ld, 0, rb);
            return mm_ep_fail(x, st);
        }
    }
    return MEGAMOE_OK;
}

void mm_ep_done(mm_ep_xbuf_t *x, int dir)
{
    /* No quiet: the runtime orders a signal after every earlier put of this thread to that PE
     * (across hosts it arrives behind them), and direct stores are ordered by the release
     * semantics of the signal update. A quiet would add a round trip per call across hosts. */
    for (int i = 0; i < x->ep; i++) {
        int d = (x->me + i) % x->ep; /* rotated start: ranks do not all hit rank 0 first */
        uint64_t *sig = mm_ep_sig(x, dir, x->me);
        /* the peer needs the signal whatever failed: one more try (a failed one was not
         * applied), else it is declared lost rather than left waiting for the timeout */
        if (mm_ep_fail(x, mm_shmem_signal_op(sig, 1, MM_SHMEM_SIGNAL_ADD, x->pes[d])) !=
                MEGAMOE_OK &&
            mm_shmem_signal_op(sig, 1, MM_SHMEM_SIGNAL_ADD, x->pes[d]) != MEGAMOE_OK)
            mm_shmem_declare_lost(x->pes[d], "an exchange signal to it failed twice");
    }
}

megamoe_status_t mm_ep_failure(mm_ep_xbuf_t *x)
{
    return (megamoe_status_t)__atomic_exchange_n(&x->failed, 0, __ATOMIC_ACQ_REL);
}

megamoe_status_t mm_ep_wait(mm_ep_xbuf_t *x, int dir)
{
    for (int s = 0; s < x->ep; s++)
        MM_CHECK(mm_shmem_signal_wait_until(mm_ep_sig(x, dir, s), MM_SHMEM_CMP_GE, x->gen[dir],
                                            NULL));
    return MEGAMOE_OK;
}
