/* One-sided BF16 row exchange for expert parallelism, driven by a routing plan (ep_route.h).
 *
 *  dispatch: a source puts each of its permuted rows straight into its final row of the
 *            destination's symmetric receive buffer (receive order: local expert, source rank,
 *            source order), so the owner's grouped GEMM reads them in place — no staging copy
 *            on either side.
 *  combine:  the owner puts each received row's result back into the source's symmetric
 *            return buffer (T*K rows, the source's permuted order), where the source reduces
 *            the K copies of each token.
 *
 * Rows can be sent in any split (row ranges, tiles, several threads at once); when a rank has
 * written all its rows of one exchange it calls *_done (once, from one thread, after the
 * writers finished), which adds 1 to one signal per destination. A receiver's *_wait returns
 * when every source has signalled. Signals are monotone generation counters (one 64-byte line
 * each), so consecutive exchanges need no zeroing barrier: mm_ep_begin() moves the local
 * generation and must be called on every rank for every exchange in the same order.
 *
 * Buffer reuse (why no barrier is needed between calls): a receiver only reads its receive
 * buffer between its dispatch wait and its own combine puts; a source starts the next exchange
 * into that buffer only after it received this exchange's combine from every owner, or after
 * the next routing plan's count all-gather. Users must therefore finish reading received rows
 * (and the return buffer) before sending their own combine rows / entering the next plan.
 */
#ifndef MM_OPS_EP_EXCHANGE_H
#define MM_OPS_EP_EXCHANGE_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/status.h"

#include "ops/ep_route.h"
#include "shmem/shmem.h"

enum { MM_EP_DISPATCH = 0, MM_EP_COMBINE = 1 };

typedef struct mm_ep_xbuf {
    mm_shmem_team_t *team; /* owns the symmetric buffers */
    int ep, me;
    int *pes;           /* [ep] world PE of team member i */
    size_t row_bytes;   /* bytes per row (H * 2 for bf16) */
    int64_t capacity;   /* rows of recv */
    int64_t ret_rows;   /* rows of ret (T*K) */
    void *recv;         /* symmetric [capacity][row_bytes] */
    void *ret;          /* symmetric [ret_rows][row_bytes] */
    uint64_t *sig;      /* symmetric: 2*ep signal lines (direction, source) */
    uint64_t gen[2];    /* exchanges begun per direction */
    int failed;         /* first failed transfer (megamoe_status_t) of this call's exchanges,
                           set atomically by any writer; taken by mm_ep_failure */
} mm_ep_xbuf_t;

/* Tests: when set, rows always travel through mm_shmem_put / mm_shmem_get (the path for
 * peers that are not load/store reachable), even when the peer's buffer is mapped here. Set
 * it on every rank between calls, never during one. */
extern int mm_ep_force_puts;

/* Symmetric heap bytes mm_ep_xbuf_create allocates (for heap sizing). */
size_t mm_ep_xbuf_heap_bytes(int ep, int64_t capacity, int64_t ret_rows, size_t row_bytes);

/* Collective over the team (symmetric allocation over its members; team must span it in the same order on
 * every PE): allocate and zero the buffers, then barrier so no peer signals before every rank
 * has zeroed its signals. */
megamoe_status_t mm_ep_xbuf_create(mm_shmem_team_t *team, int64_t capacity, int64_t ret_rows,
                                   size_t row_bytes, mm_ep_xbuf_t **xbuf_p);
/* Collective over the world (symmetric free). NULL is a no-op. Returns the first failure. */
megamoe_status_t mm_ep_xbuf_destroy(mm_ep_xbuf_t *xbuf);

/* Begin an exchange; a call's first (dispatch) forgets an earlier call's failure. */
static inline void mm_ep_begin(mm_ep_xbuf_t *x, int dir)
{
    x->gen[dir]++;
    if (dir == MM_EP_DISPATCH) __atomic_store_n(&x->failed, 0, __ATOMIC_RELAXED);
}

/* Transfers: a failure is returned and also kept in the xbuf (mm_ep_failure), so a caller
 * whose threads move rows learns it after them. A broken connection marks its peer lost
 * (shmem.h: every rank's waits fail); after a transient one the peer stays, so the caller must
 * carry the failure to every rank itself (the O0 layer: in its final agreement; O1: the
 * executor's DONE status). Rows a failed get should have filled are zeroed, never left
 * uninitialised. */

/* Put this rank's permuted rows [p0, p1) into their destinations. gather != 0: row p is token
 * row src + (perm_slot[p] / K) * ld (the token's hidden state, sent once per choice);
 * gather == 0: row p is src + p * ld (rows already in permuted order). Thread-safe for
 * disjoint ranges. */
megamoe_status_t mm_ep_dispatch_rows(const mm_ep_xbuf_t *x, const mm_ep_plan_t *plan,
                                     const void *src, size_t ld, int gather, int64_t p0,
                                     int64_t p1);
/* 1 when every peer's receive buffer is load/store reachable from this rank (same host), so
 * a producer can write dispatch rows in place with mm_ep_dispatch_dst() instead of staging
 * them and calling mm_ep_dispatch_rows(). */
int mm_ep_dispatch_direct(const mm_ep_xbuf_t *x);
/* Address of the destination row of this rank's permuted position p in its owner's receive
 * buffer (valid when mm_ep_dispatch_direct()). Rows written there count as sent once
 * mm_ep_done(MM_EP_DISPATCH) runs after the writers finished. */
void *mm_ep_dispatch_dst(const mm_ep_xbuf_t *x, const mm_ep_plan_t *plan, int64_t p);

/* Put received-order rows [r0, r1) of rows (ld bytes apart, row r = result of receive row r)
 * back into their sources' return buffers. Thread-safe for disjoint ranges. */
megamoe_status_t mm_ep_combine_rows(const mm_ep_xbuf_t *x, const mm_ep_plan_t *plan,
                                    const void *rows, size_t ld, int64_t r0, int64_t r1);

/* Pull dispatch (the owner fetches, nothing is pushed into it): the receive buffer is then
 * this rank's symmetric staging buffer of T*K rows in its own permuted order (create the xbuf
 * with capacity = T*K), and the signals of MM_EP_DISPATCH mean "my rows are staged".
 *
 * Stage this rank's permuted rows [p0, p1) into its own staging buffer (gather as in
 * mm_ep_dispatch_rows). Thread-safe for disjoint ranges. */
void mm_ep_stage_rows(const mm_ep_xbuf_t *x, const mm_ep_plan_t *plan, const void *src,
                      size_t ld, int gather, int64_t p0, int64_t p1);
/* Address of this rank's staged row of permuted position p (a producer writes it in place). */
static inline void *mm_ep_stage_dst(const mm_ep_xbuf_t *x, int64_t p)
{
    return (char *)x->recv + (size_t)p * x->row_bytes;
}
/* Fetch receive-order rows [r0, r1) (receive order as in push: local expert, source, source
 * order) from their sources' staging buffers into dst (ordinary memory; row r0 at dst, rows
 * ld bytes apart): a direct load from a mapped peer, else mm_shmem_get. Call after
 * mm_ep_wait(MM_EP_DISPATCH), or once the rows' source signalled them. Thread-safe. */
megamoe_status_t mm_ep_pull_rows(const mm_ep_xbuf_t *x, const mm_ep_plan_t *plan, void *dst,
                                 size_t ld, int64_t r0, int64_t r1);

/* All rows of the current exchange of direction dir are written (by every writer thread of
 * this rank): signal every peer (also after a failure: the peers must not wait for nothing;
 * a failed quiet or signal is kept for mm_ep_wait). */
void mm_ep_done(mm_ep_xbuf_t *x, int dir);
/* Wait until every source signalled the current exchange of direction dir. TIMEOUT or
 * PEER_LOST (from the SHMEM wait) when a peer never does. */
megamoe_status_t mm_ep_wait(mm_ep_xbuf_t *x, int dir);
/* This rank's first failed transfer since the call's first mm_ep_begin (OK when none; taken:
 * the next call starts clean). Logged where it happened. */
megamoe_status_t mm_ep_failure(mm_ep_xbuf_t *x);

#endif /* MM_OPS_EP_EXCHANGE_H */
