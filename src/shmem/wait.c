/* Waiting on a 64-bit word: the library's back-off (base/backoff.h: spin with pause, yield,
 * sleep), with timeout and liveness checks.
 *
 * A flag written by a peer on another core arrives in ~0.1-0.3 us (docs/shmem.md), so the
 * first MM_WAIT_SPIN_NS are spent spinning; yielding until MM_WAIT_YIELD_NS lets a peer sharing
 * this core run; then sleeps grow to MM_WAIT_SLEEP_MAX_NS, so an idle waiter costs almost no
 * CPU. At each clock read the timeout (HYPER_PARALLEL_SHMEM_TIMEOUT_SEC) and the peer liveness
 * (two atomic loads) are checked, so PEER_LOST follows a death by at most one sleep plus the
 * monitor's reaction time. With peers on other hosts every spin also progresses the
 * inter-host engine.
 */
#include "base/backoff.h"
#include "base/env.h"
#include "shmem_internal.h"
#include "survive.h"

#define MM_WAIT_SPIN_NS 50000ull
#define MM_WAIT_YIELD_NS 2000000ull
#define MM_WAIT_SLEEP_MAX_NS 1000000ull
#define MM_WAIT_LOSS_GRACE_NS 1000000000ull

static const char *const mm_cmp_names[] = {"==", "!=", ">", ">=", "<", "<="};

static uint64_t mm_wait_timeout_ns(void)
{
    if (mm_shmem_running_now()) return mm_shmem_g.timeout_ns;
    int64_t sec = 120;
    if (mm_env_int(MM_ENV_SHMEM_TIMEOUT_SEC, &sec) != MEGAMOE_OK) sec = 120;
    return (uint64_t)sec * 1000000000ull;
}


/* watch_pe < 0: every loss known here fails the wait (the calls in flight at a loss fail).
 * watch_pe >= 0: only the loss of watch_pe does, and only when the word still does not hold
 * MM_WAIT_LOSS_GRACE_NS after it (its last write may still be on its way when its connection's
 * end is seen). */
static megamoe_status_t mm_wait_core(const uint64_t *addr, int cmp, uint64_t value,
                                     uint64_t *value_p, int watch_pe, const char *what)
{
    if (addr == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: NULL address", what);
    if (cmp < MM_SHMEM_CMP_EQ || cmp > MM_SHMEM_CMP_LE)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: comparison %d is not one of "
                        "MM_SHMEM_CMP_EQ..MM_SHMEM_CMP_LE", what, cmp);
    uint64_t v = __atomic_load_n(addr, __ATOMIC_ACQUIRE);
    if (mm_shmem_cmp(v, cmp, value)) {
        if (value_p) *value_p = v;
        return MEGAMOE_OK;
    }
    const uint64_t timeout = mm_wait_timeout_ns();
    int live = mm_shmem_running_now();
    /* with peers on other hosts the word may be written by the engine: drive it (the progress
     * thread does too, but a waiter that progresses sees a signal sooner) */
    mm_shmem_engine_t *engine = live ? mm_shmem_g.engine : NULL;
    /* a wait that started before the survivors installed a new view may wait for a rank that
     * is gone now: it fails like the calls in flight at the loss */
    const uint64_t view = live ? mm_surv_view_gen() : 0;
    uint64_t watch_lost = 0; /* when watch_pe's loss was seen (0: not yet) */
    mm_backoff_t b;
    mm_backoff_init(&b, MM_WAIT_SPIN_NS, MM_WAIT_YIELD_NS, MM_WAIT_SLEEP_MAX_NS);
    for (;;) {
        v = __atomic_load_n(addr, __ATOMIC_ACQUIRE);
        if (mm_shmem_cmp(v, cmp, value)) break;
        if (engine && mm_shmem_g.engine_ops->progress(engine)) continue;
        uint64_t elapsed;
        if (!mm_backoff_miss(&b, &elapsed)) continue;
        if (live && watch_pe >= 0) {
            /* its last message may still sit in the engine's receive queue when its
             * connection's end is seen: the engine is driven a grace period longer */
            if (watch_lost == 0 && mm_surv_kind(watch_pe) != MM_LOSS_NONE)
                watch_lost = mm_now_ns();
            if (watch_lost != 0 && mm_now_ns() - watch_lost > MM_WAIT_LOSS_GRACE_NS)
                return mm_error(MEGAMOE_PEER_LOST, "%s: rank %d was lost before its message "
                                "arrived", what, watch_pe);
        } else if (live) {
            megamoe_status_t st = mm_shmem_check_peers(what);
            if (st != MEGAMOE_OK) return st;
            if (mm_surv_view_gen() != view)
                return mm_error(MEGAMOE_PEER_LOST, "%s: the survivors of a lost rank moved on "
                                "while this wait ran (it may wait for a lost rank); the call "
                                "fails and the next one runs among the survivors", what);
        }
        if (elapsed >= timeout)
            return mm_error(MEGAMOE_TIMEOUT, "%s timed out after %.1f s waiting for the word at "
                            "%p to become %s %llu (it is %llu); a peer is stuck or never "
                            "signals; raise HYPER_PARALLEL_SHMEM_TIMEOUT_SEC if the work "
                            "legitimately takes longer", what, (double)elapsed * 1e-9,
                            (const void *)addr, mm_cmp_names[cmp], (unsigned long long)value,
                            (unsigned long long)v);
        mm_backoff_wait(&b, elapsed, timeout - elapsed);
    }
    if (value_p) *value_p = v;
    return MEGAMOE_OK;
}

megamoe_status_t mm_shmem_wait_impl(const uint64_t *addr, int cmp, uint64_t value,
                                    uint64_t *value_p, const char *what)
{
    return mm_wait_core(addr, cmp, value, value_p, -1, what);
}

megamoe_status_t mm_shmem_wait_from(const uint64_t *addr, int cmp, uint64_t value, int pe,
                                    const char *what)
{
    return mm_wait_core(addr, cmp, value, NULL, pe, what);
}

megamoe_status_t mm_shmem_wait_u64(const uint64_t *addr, int cmp, uint64_t value,
                                   uint64_t *value_p)
{
    return mm_shmem_wait_impl(addr, cmp, value, value_p, "wait");
}

megamoe_status_t mm_shmem_signal_wait_until(uint64_t *sig, int cmp, uint64_t value,
                                            uint64_t *value_p)
{
    return mm_shmem_wait_impl(sig, cmp, value, value_p, "signal wait");
}

int mm_shmem_test_u64(const uint64_t *addr, int cmp, uint64_t value)
{
    return mm_shmem_cmp(__atomic_load_n(addr, __ATOMIC_ACQUIRE), cmp, value);
}

megamoe_status_t mm_shmem_check_liveness(void)
{
    if (!mm_shmem_running_now()) return mm_shmem_not_running("mm_shmem_check_liveness");
    return mm_shmem_check_peers("a liveness check");
}
