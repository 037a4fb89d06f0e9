/* One-sided data movement: put, get, put-with-signal, signal ops, fence, quiet.
 *
 * Reachability is per peer. Same-host peers are mapped, so a remote object is (peer base +
 * offset of the local object) and every operation completes when the call returns: a put is
 * a copy into the peer's mapping, a signal an atomic store/add on the peer's word. Ordering:
 * mm_shmem_copy() ends large (streaming) copies with sfence, signal updates are release
 * operations, so data written before a signal is visible to whoever observes the signal with
 * an acquire load. Peers on other hosts go through the inter-host engine (transport.h), which
 * keeps the same guarantees: its puts leave the source reusable, its signals are ordered
 * after the puts they cover, quiet waits for remote completion. A peer reachable neither way
 * is an error (INVALID_STATE), never a silently dropped operation.
 */
#include <stdatomic.h>
#include <string.h>

#include "base/arch.h"
#include "shmem_internal.h"
#include "survive.h"

/* ---- test seam: one injected failure (shmem.h, mm_shmem_test_fail_rma) ---- */
static atomic_uint mm_rma_fail_ops;  /* MM_SHMEM_RMA_* bits armed; 0 = off (the fast path) */
static atomic_long mm_rma_fail_skip; /* matching calls that still succeed */
static atomic_ulong mm_rma_counts[5];
static atomic_int mm_rma_fired;
static atomic_int mm_rma_fail_lose; /* 1: as a broken connection; 0: transient (peer stays) */

void mm_shmem_test_fail_rma(unsigned ops, long skip, int lose_peer)
{
    atomic_store(&mm_rma_fail_lose, lose_peer);
    if (ops != 0) { /* disarming keeps what the last arming saw */
        for (int i = 0; i < 5; i++) atomic_store(&mm_rma_counts[i], 0);
        atomic_store(&mm_rma_fired, 0);
    }
    atomic_store(&mm_rma_fail_skip, skip);
    atomic_store(&mm_rma_fail_ops, ops);
}

int mm_shmem_test_rma_fired(void) { return atomic_load(&mm_rma_fired); }

unsigned long mm_shmem_test_rma_count(unsigned op)
{
    unsigned long n = 0;
    for (int i = 0; i < 5; i++)
        if (op & (1u << i)) n += atomic_load(&mm_rma_counts[i]);
    return n;
}

/* What the engine does when an operation fails: a broken connection marks the peer lost
 * (every PE learns it) and returns PEER_LOST (engine_ucx.c: mm_ucx_status); a transient
 * failure (a staging ring that stays full, no memory for a request) returns an error and the
 * peer stays, so the caller must tell its peers itself. */
static megamoe_status_t mm_rma_seam(unsigned op, int pe, const char *what)
{
    unsigned armed = atomic_load_explicit(&mm_rma_fail_ops, memory_order_relaxed);
    if (MM_LIKELY(armed == 0)) return MEGAMOE_OK;
    for (int i = 0; i < 5; i++)
        if (op == (1u << i)) atomic_fetch_add_explicit(&mm_rma_counts[i], 1, memory_order_relaxed);
    if (!(armed & op) || atomic_fetch_sub(&mm_rma_fail_skip, 1) > 0) return MEGAMOE_OK;
    if (!atomic_compare_exchange_strong(&mm_rma_fail_ops, &armed, 0)) return MEGAMOE_OK;
    atomic_store(&mm_rma_fired, 1);
    mm_shmem_global_t *g = &mm_shmem_g;
    if (pe < 0 || pe >= g->n_pes) pe = (g->my_pe + 1) % g->n_pes; /* fence/quiet: some peer */
    if (!atomic_load(&mm_rma_fail_lose))
        return mm_error(MEGAMOE_IO, "%s to rank %d failed (transient; injected by the test "
                        "seam, mm_shmem_test_fail_rma)", what, pe);
    mm_shmem_mark_lost(pe, "its inter-host connection failed (injected by the test seam)");
    return mm_error(MEGAMOE_PEER_LOST, "%s to rank %d failed: injected by the test seam "
                    "(mm_shmem_test_fail_rma)", what, pe);
}

/* Remote address of [sym, sym + n) on pe; NULL (with the error recorded, *bad_p set) when
 * invalid, or when the peer is not mapped (then *off_p is set for the engine). */
static char *mm_shmem_xlate(const void *sym, size_t n, int pe, const char *op, uint64_t *off_p,
                            int *bad_p)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    *bad_p = 1;
    if (!mm_shmem_running_now()) {
        mm_shmem_not_running(op);
        return NULL;
    }
    uint64_t off = (uint64_t)((uintptr_t)sym - (uintptr_t)g->my_base);
    if ((uintptr_t)sym < (uintptr_t)g->my_base || off >= g->seg_size || n > g->seg_size - off) {
        mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: [%p, +%zu) is not inside the symmetric heap "
                 "(allocate remote objects with mm_shmem_malloc)", op, sym, n);
        return NULL;
    }
    if ((unsigned)pe >= (unsigned)g->n_pes) {
        mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: PE %d is not in [0, %d)", op, pe, g->n_pes);
        return NULL;
    }
    *bad_p = 0;
    *off_p = off;
    return g->bases[pe] ? g->bases[pe] + off : NULL;
}

/* The engine's route to an unmapped peer, or INVALID_STATE when there is none. */
static megamoe_status_t mm_shmem_route(int pe, const char *op)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    if (g->engine && g->remote[pe]) return MEGAMOE_OK;
    return mm_error(MEGAMOE_INVALID_STATE, "%s: rank %d is neither mapped on this host nor "
                    "reachable through the inter-host engine", op, pe);
}

/* The route of a caller's operation: also PEER_LOST for a peer known lost here (its own
 * detection or another rank's report), even while its endpoint is still being closed — a put
 * or signal to it would otherwise "succeed" into a connection about to drop it. The runtime's
 * own words (mm_shmem_word_op: loss reports, heartbeats) still go out: a PE declared lost
 * while alive must learn it. */
static megamoe_status_t mm_shmem_route_op(int pe, const char *op)
{
    MM_CHECK(mm_shmem_route(pe, op));
    if (mm_surv_kind(pe) != MM_LOSS_NONE)
        return mm_error(MEGAMOE_PEER_LOST, "%s: rank %d was lost (known on this rank); the "
                        "survivors' next call runs without it", op, pe);
    return MEGAMOE_OK;
}

megamoe_status_t mm_shmem_put(void *dest, const void *src, size_t nbytes, int pe)
{
    uint64_t off;
    int bad;
    MM_CHECK(mm_rma_seam(MM_SHMEM_RMA_PUT, pe, "mm_shmem_put"));
    char *d = mm_shmem_xlate(dest, nbytes, pe, "mm_shmem_put", &off, &bad);
    if (d) {
        mm_shmem_copy(d, src, nbytes);
        return MEGAMOE_OK;
    }
    if (bad) return MEGAMOE_INVALID_ARGUMENT;
    MM_CHECK(mm_shmem_route_op(pe, "mm_shmem_put"));
    return mm_shmem_g.engine_ops->put(mm_shmem_g.engine, pe, off, src, nbytes);
}

megamoe_status_t mm_shmem_get(void *dest, const void *src, size_t nbytes, int pe)
{
    uint64_t off;
    int bad;
    MM_CHECK(mm_rma_seam(MM_SHMEM_RMA_GET, pe, "mm_shmem_get"));
    const char *s = mm_shmem_xlate(src, nbytes, pe, "mm_shmem_get", &off, &bad);
    if (s) {
        mm_shmem_copy(dest, s, nbytes);
        return MEGAMOE_OK;
    }
    if (bad) return MEGAMOE_INVALID_ARGUMENT;
    MM_CHECK(mm_shmem_route_op(pe, "mm_shmem_get"));
    return mm_shmem_g.engine_ops->get(mm_shmem_g.engine, pe, off, dest, nbytes);
}

/* The engine's part of mm_shmem_get_many, a batch at a time. */
static megamoe_status_t mm_shmem_get_flush(mm_engine_get_t *g, int n)
{
    if (n == 0) return MEGAMOE_OK;
    const mm_shmem_engine_ops_t *ops = mm_shmem_g.engine_ops;
    if (ops->get_many) return ops->get_many(mm_shmem_g.engine, g, n);
    megamoe_status_t first = MEGAMOE_OK;
    for (int i = 0; i < n && first == MEGAMOE_OK; i++)
        first = ops->get(mm_shmem_g.engine, g[i].pe, g[i].off, g[i].dst, g[i].n);
    return first;
}

#define MM_SHMEM_GET_BATCH 64
megamoe_status_t mm_shmem_get_many(const mm_shmem_get_op_t *ops, int n)
{
    mm_engine_get_t g[MM_SHMEM_GET_BATCH];
    int ng = 0;
    megamoe_status_t st = MEGAMOE_OK;
    for (int i = 0; i < n && st == MEGAMOE_OK; i++) {
        const mm_shmem_get_op_t *o = &ops[i];
        uint64_t off;
        int bad;
        st = mm_rma_seam(MM_SHMEM_RMA_GET, o->pe, "mm_shmem_get");
        if (st != MEGAMOE_OK) break;
        const char *s = mm_shmem_xlate(o->src, o->nbytes, o->pe, "mm_shmem_get", &off, &bad);
        if (s) {
            mm_shmem_copy(o->dest, s, o->nbytes);
            continue;
        }
        if (bad) {
            st = MEGAMOE_INVALID_ARGUMENT;
            break;
        }
        st = mm_shmem_route_op(o->pe, "mm_shmem_get");
        if (st != MEGAMOE_OK) break;
        g[ng++] = (mm_engine_get_t){o->pe, off, o->dest, o->nbytes};
        if (ng == MM_SHMEM_GET_BATCH) {
            st = mm_shmem_get_flush(g, ng);
            ng = 0;
        }
    }
    /* the gets already collected are issued and complete before the error returns: no
     * engine write into a dest after this call */
    megamoe_status_t fl = mm_shmem_get_flush(g, ng);
    return st != MEGAMOE_OK ? st : fl;
}

static void mm_shmem_signal_at(uint64_t *remote, uint64_t value, int sig_op)
{
    if (sig_op == MM_SHMEM_SIGNAL_ADD) __atomic_fetch_add(remote, value, __ATOMIC_RELEASE);
    else __atomic_store_n(remote, value, __ATOMIC_RELEASE);
}

megamoe_status_t mm_shmem_signal_op(uint64_t *sig, uint64_t value, int sig_op, int pe)
{
    uint64_t off;
    int bad;
    if (sig_op != MM_SHMEM_SIGNAL_SET && sig_op != MM_SHMEM_SIGNAL_ADD)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_signal_op: sig_op %d is neither "
                        "MM_SHMEM_SIGNAL_SET nor MM_SHMEM_SIGNAL_ADD", sig_op);
    if (((uintptr_t)sig & 7) != 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_signal_op: signal %p is not 8-byte "
                        "aligned", (void *)sig);
    MM_CHECK(mm_rma_seam(MM_SHMEM_RMA_SIGNAL, pe, "mm_shmem_signal_op"));
    uint64_t *r = (uint64_t *)mm_shmem_xlate(sig, sizeof *sig, pe, "mm_shmem_signal_op", &off, &bad);
    if (r) {
        mm_shmem_signal_at(r, value, sig_op);
        return MEGAMOE_OK;
    }
    if (bad) return MEGAMOE_INVALID_ARGUMENT;
    MM_CHECK(mm_shmem_route_op(pe, "mm_shmem_signal_op"));
    return mm_shmem_g.engine_ops->atomic(mm_shmem_g.engine, pe, off, value,
                                         sig_op == MM_SHMEM_SIGNAL_ADD ? MM_ENGINE_ADD
                                                                       : MM_ENGINE_SET);
}

megamoe_status_t mm_shmem_put_signal(void *dest, const void *src, size_t nbytes, uint64_t *sig,
                                     uint64_t value, int sig_op, int pe)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    /* A peer on another host: one engine operation, so the signal travels with its data (one
     * message) instead of after it. Same checks as the two calls below (which also take the
     * test seam's injected failures while one is armed). */
    if (atomic_load_explicit(&mm_rma_fail_ops, memory_order_relaxed) == 0 &&
        mm_shmem_running_now() && g->engine && g->engine_ops->put_signal &&
        (unsigned)pe < (unsigned)g->n_pes && g->remote[pe] && g->bases[pe] == NULL &&
        (sig_op == MM_SHMEM_SIGNAL_SET || sig_op == MM_SHMEM_SIGNAL_ADD) &&
        ((uintptr_t)sig & 7) == 0) {
        uint64_t off = 0, soff = 0;
        int bad = 0;
        if (nbytes && mm_shmem_xlate(dest, nbytes, pe, "mm_shmem_put_signal", &off, &bad) == NULL &&
            bad)
            return MEGAMOE_INVALID_ARGUMENT;
        if (mm_shmem_xlate(sig, sizeof *sig, pe, "mm_shmem_put_signal", &soff, &bad) == NULL && bad)
            return MEGAMOE_INVALID_ARGUMENT;
        MM_CHECK(mm_shmem_route_op(pe, "mm_shmem_put_signal"));
        return g->engine_ops->put_signal(g->engine, pe, off, src, nbytes, soff, value,
                                         sig_op == MM_SHMEM_SIGNAL_ADD ? MM_ENGINE_ADD
                                                                       : MM_ENGINE_SET);
    }
    MM_CHECK(mm_shmem_put(dest, src, nbytes, pe));
    /* Data stores (regular ones are ordered by the release below; streaming ones were fenced
     * by the copy; the engine orders its signals after the puts they cover) precede the
     * signal. */
    return mm_shmem_signal_op(sig, value, sig_op, pe);
}

uint64_t mm_shmem_signal_fetch(const uint64_t *sig)
{
    return __atomic_load_n(sig, __ATOMIC_ACQUIRE);
}

megamoe_status_t mm_shmem_fence(void)
{
    MM_CHECK(mm_rma_seam(MM_SHMEM_RMA_FENCE, -1, "mm_shmem_fence"));
    mm_store_fence();
    mm_thread_fence(__ATOMIC_RELEASE);
    mm_shmem_global_t *g = &mm_shmem_g;
    if (mm_shmem_running_now() && g->engine) return g->engine_ops->fence(g->engine);
    return MEGAMOE_OK;
}

megamoe_status_t mm_shmem_quiet(void)
{
    MM_CHECK(mm_rma_seam(MM_SHMEM_RMA_QUIET, -1, "mm_shmem_quiet"));
    mm_store_fence();
    mm_thread_fence(__ATOMIC_SEQ_CST);
    mm_shmem_global_t *g = &mm_shmem_g;
    if (mm_shmem_running_now() && g->engine) return g->engine_ops->quiet(g->engine);
    return MEGAMOE_OK;
}

void *mm_shmem_ptr(const void *sym, int pe)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    if (!mm_shmem_running_now() || (unsigned)pe >= (unsigned)g->n_pes) return NULL;
    uintptr_t off = (uintptr_t)sym - (uintptr_t)g->my_base;
    if ((uintptr_t)sym < (uintptr_t)g->my_base || off >= g->seg_size || !g->bases[pe])
        return NULL;
    return g->bases[pe] + off;
}

int mm_shmem_is_symmetric(const void *ptr, size_t nbytes)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    if (!mm_shmem_running_now()) return 0;
    uintptr_t p = (uintptr_t)ptr, h = (uintptr_t)g->heap_base;
    return p >= h && p - h < g->heap_size && nbytes <= g->heap_size - (p - h);
}

/* ---- runtime-internal access to the reserve (team lines, outboxes, header words) ---- */

megamoe_status_t mm_shmem_word_op(int pe, uint64_t off, uint64_t value, int op)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    if (g->bases[pe]) {
        uint64_t *w = (uint64_t *)(g->bases[pe] + off);
        op &= ~MM_ENGINE_NO_QUIET;
        if (op == MM_ENGINE_ADD) __atomic_fetch_add(w, value, __ATOMIC_RELEASE);
        else if (op == MM_ENGINE_SET) __atomic_store_n(w, value, __ATOMIC_RELEASE);
        else {
            uint64_t zero = 0;
            __atomic_compare_exchange_n(w, &zero, value, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
        }
        return MEGAMOE_OK;
    }
    MM_CHECK(mm_shmem_route(pe, "a runtime signal"));
    return g->engine_ops->atomic(g->engine, pe, off, value, op);
}

megamoe_status_t mm_shmem_seg_put_signal(int pe, uint64_t off, const void *src, size_t n,
                                         uint64_t sig_off, uint64_t value, int op)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    if (g->bases[pe]) {
        if (n) memcpy(g->bases[pe] + off, src, n);
        return mm_shmem_word_op(pe, sig_off, value, op); /* a release: the data first */
    }
    MM_CHECK(mm_shmem_route(pe, "a runtime message"));
    if (g->engine_ops->put_signal)
        return g->engine_ops->put_signal(g->engine, pe, off, src, n, sig_off, value, op);
    if (n) MM_CHECK(g->engine_ops->put(g->engine, pe, off, src, n));
    return g->engine_ops->atomic(g->engine, pe, sig_off, value, op);
}

megamoe_status_t mm_shmem_seg_read(int pe, uint64_t off, void *dst, size_t n)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    if (g->bases[pe]) {
        memcpy(dst, g->bases[pe] + off, n);
        return MEGAMOE_OK;
    }
    MM_CHECK(mm_shmem_route(pe, "a runtime read"));
    return g->engine_ops->get(g->engine, pe, off, dst, n);
}
