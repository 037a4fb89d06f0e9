/* The public symmetric-memory API (include/megamoe/symm.h) over the runtime's teams: the C
 * side of the Python module hyper_parallel.core.multicore.shmem. PEs are communicator ranks,
 * translated to world PEs here. */
#include <stdio.h>
#include <string.h>

#include "base/abi.h"
#include "base/backoff.h"
#include "base/error.h"
#include "comm_impl.h"
#include "megamoe/symm.h"
#include "shmem_internal.h"

static megamoe_status_t mm_symm_team(const char *fn, megamoe_comm_t *comm, mm_shmem_team_t **t)
{
    *t = mm_comm_team(comm);
    if (*t == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: invalid or destroyed communicator", fn);
    return MEGAMOE_OK;
}

static megamoe_status_t mm_symm_pe(const char *fn, mm_shmem_team_t *t, int pe, int *wpe)
{
    int n = mm_shmem_team_n_pes(t);
    if (pe < 0 || pe >= n)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: PE %d is not a rank of the communicator "
                        "[0, %d)", fn, pe, n);
    *wpe = mm_shmem_team_world_pe(t, pe);
    return MEGAMOE_OK;
}

static megamoe_status_t mm_symm_range(const char *fn, const void *p, size_t n, const char *what)
{
    if (p == NULL || !mm_shmem_is_symmetric(p, n))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: %s [%p, +%zu) is not symmetric memory (use "
                        "a tensor of shmem.empty())", fn, what, p, n);
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_symm_malloc(megamoe_comm_t *comm, size_t size, size_t align,
                                     void **ptr_p)
{
    mm_shmem_team_t *t;
    MM_CHECK(mm_symm_team("megamoe_symm_malloc", comm, &t));
    if (ptr_p == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_symm_malloc: NULL ptr_p");
    return mm_shmem_team_calloc_site(t, size ? size : 1, align, "megamoe_symm_malloc", ptr_p);
}

megamoe_status_t megamoe_symm_free(megamoe_comm_t *comm, void *ptr)
{
    mm_shmem_team_t *t;
    MM_CHECK(mm_symm_team("megamoe_symm_free", comm, &t));
    return mm_shmem_team_free(t, ptr);
}

megamoe_status_t megamoe_symm_put(megamoe_comm_t *comm, void *dest, const void *src, size_t n,
                                  int pe)
{
    const char *fn = "megamoe_symm_put";
    mm_shmem_team_t *t;
    int wpe = -1;
    MM_CHECK(mm_symm_team(fn, comm, &t));
    MM_CHECK(mm_symm_pe(fn, t, pe, &wpe));
    if (n == 0) return MEGAMOE_OK;
    MM_CHECK(mm_symm_range(fn, dest, n, "the destination"));
    if (src == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: NULL source", fn);
    return mm_shmem_put(dest, src, n, wpe);
}

megamoe_status_t megamoe_symm_get(megamoe_comm_t *comm, void *dest, const void *src, size_t n,
                                  int pe)
{
    const char *fn = "megamoe_symm_get";
    mm_shmem_team_t *t;
    int wpe = -1;
    MM_CHECK(mm_symm_team(fn, comm, &t));
    MM_CHECK(mm_symm_pe(fn, t, pe, &wpe));
    if (n == 0) return MEGAMOE_OK;
    MM_CHECK(mm_symm_range(fn, src, n, "the source"));
    if (dest == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: NULL destination", fn);
    return mm_shmem_get(dest, src, n, wpe);
}

megamoe_status_t megamoe_symm_signal_i32(megamoe_comm_t *comm, int32_t *sig, int32_t value,
                                         int op, int pe)
{
    const char *fn = "megamoe_symm_signal_i32";
    mm_shmem_team_t *t;
    int wpe = -1;
    MM_CHECK(mm_symm_team(fn, comm, &t));
    MM_CHECK(mm_symm_pe(fn, t, pe, &wpe));
    if (op != MEGAMOE_SYMM_SIGNAL_SET && op != MEGAMOE_SYMM_SIGNAL_ADD)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: operation %d is neither SET (0) nor ADD (1)",
                        fn, op);
    MM_CHECK(mm_symm_range(fn, sig, sizeof *sig, "the signal"));
    if ((uintptr_t)sig % 4)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: the signal %p is not 4-byte aligned", fn,
                        (void *)sig);
    MM_CHECK(mm_shmem_fence()); /* earlier puts to pe land before the signal */
    int32_t *remote = mm_shmem_ptr(sig, wpe);
    if (remote) {
        if (op == MEGAMOE_SYMM_SIGNAL_ADD) __atomic_fetch_add(remote, value, __ATOMIC_RELEASE);
        else __atomic_store_n(remote, value, __ATOMIC_RELEASE);
        return MEGAMOE_OK;
    }
    uint64_t *word = (uint64_t *)((uintptr_t)sig & ~(uintptr_t)7);
    /* another host. SET: the int32 as a put that carries a signal (add 0 on its aligned word):
     * a plain put may wait in the engine's coalescing buffer until the next signal or quiet
     * (shmem/engine_ucx_am.c), a signal leaves at once, after every earlier put to pe */
    if (op == MEGAMOE_SYMM_SIGNAL_SET)
        return mm_shmem_put_signal(sig, &value, sizeof value, word, 0, MM_SHMEM_SIGNAL_ADD, wpe);
    /* ADD: a 64-bit atomic add on the aligned word, the int32's half shifted in */
    int upper = (uintptr_t)sig % 8 != 0; /* little endian: the high half */
    uint64_t v = (uint64_t)(int64_t)value;
    return mm_shmem_signal_op(word, upper ? v << 32 : v, MM_SHMEM_SIGNAL_ADD, wpe);
}

static int mm_symm_cmp(int32_t v, int cmp, int32_t value)
{
    switch (cmp) {
    case MEGAMOE_SYMM_CMP_EQ: return v == value;
    case MEGAMOE_SYMM_CMP_NE: return v != value;
    case MEGAMOE_SYMM_CMP_GT: return v > value;
    case MEGAMOE_SYMM_CMP_GE: return v >= value;
    case MEGAMOE_SYMM_CMP_LT: return v < value;
    default: return v <= value;
    }
}

megamoe_status_t megamoe_symm_wait_i32(megamoe_comm_t *comm, const int32_t *sig, int cmp,
                                       int32_t value)
{
    const char *fn = "megamoe_symm_wait_i32";
    static const char *const names[] = {"==", "!=", ">", ">=", "<", "<="};
    mm_shmem_team_t *t;
    MM_CHECK(mm_symm_team(fn, comm, &t));
    if (cmp < MEGAMOE_SYMM_CMP_EQ || cmp > MEGAMOE_SYMM_CMP_LE)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: comparison %d is not one of eq, ne, gt, "
                        "ge, lt, le", fn, cmp);
    MM_CHECK(mm_symm_range(fn, sig, sizeof *sig, "the signal"));
    if (mm_symm_cmp(__atomic_load_n(sig, __ATOMIC_ACQUIRE), cmp, value)) return MEGAMOE_OK;
    const uint64_t timeout = mm_shmem_timeout_ns();
    mm_shmem_engine_t *engine = mm_shmem_g.engine;
    mm_backoff_t b;
    mm_backoff_init(&b, 50000ull, 2000000ull, 1000000ull);
    for (;;) {
        int32_t v = __atomic_load_n(sig, __ATOMIC_ACQUIRE);
        if (mm_symm_cmp(v, cmp, value)) return MEGAMOE_OK;
        if (engine && mm_shmem_g.engine_ops->progress(engine)) continue;
        uint64_t elapsed;
        if (!mm_backoff_miss(&b, &elapsed)) continue;
        MM_CHECK(mm_shmem_check_peers("shmem.wait_signal"));
        if (elapsed >= timeout)
            return mm_error(MEGAMOE_TIMEOUT, "shmem.wait_signal timed out after %.1f s waiting for "
                            "the signal to become %s %d (it is %d); raise "
                            "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC if the peer legitimately takes longer",
                            (double)elapsed * 1e-9, names[cmp], value, v);
        mm_backoff_wait(&b, elapsed, timeout - elapsed);
    }
}

megamoe_status_t megamoe_symm_quiet(megamoe_comm_t *comm)
{
    mm_shmem_team_t *t;
    MM_CHECK(mm_symm_team("megamoe_symm_quiet", comm, &t));
    return mm_shmem_quiet();
}

megamoe_status_t megamoe_symm_all_gather(megamoe_comm_t *comm, void *dest, const void *src,
                                         size_t n)
{
    const char *fn = "megamoe_symm_all_gather";
    mm_shmem_team_t *t;
    MM_CHECK(mm_symm_team(fn, comm, &t));
    int size = mm_shmem_team_n_pes(t), me = mm_shmem_team_my_pe(t);
    megamoe_status_t st = MEGAMOE_OK;
    if (n > 0) {
        if (src == NULL) st = mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: NULL input", fn);
        else st = mm_symm_range(fn, dest, n * (size_t)size, "the output");
    }
    /* every member learns whether all can go before any writes into a peer */
    st = mm_shmem_team_agree(t, st);
    if (st != MEGAMOE_OK || n == 0) return st;
    for (int i = 0; i < size && st == MEGAMOE_OK; i++) {
        int p = (me + i) % size; /* staggered: not everyone at the same peer */
        st = mm_shmem_put((char *)dest + (size_t)me * n, src, n, mm_shmem_team_world_pe(t, p));
    }
    megamoe_status_t bst = mm_shmem_team_barrier(t); /* implies quiet */
    return st != MEGAMOE_OK ? st : bst;
}

megamoe_status_t megamoe_symm_state_sized(megamoe_symm_state_t *out, size_t out_size)
{
    if (out == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_symm_state: NULL state");
    megamoe_symm_state_t st, *state = &st;
    memset(state, 0, sizeof *state);
    state->running = mm_shmem_is_running();
    state->refcount = mm_shmem_refcount();
    if (!state->running) {
        snprintf(state->engine, sizeof state->engine, "none");
    } else {
        mm_shmem_debug_state_t d;
        MM_CHECK(mm_shmem_debug_state(&d));
        state->rank = mm_shmem_my_pe();
        state->world_size = mm_shmem_n_pes();
        state->heap_size = d.heap_size;
        state->bytes_used = d.bytes_used;
        state->bytes_peak = d.bytes_peak;
        state->live_allocations = d.live_allocations;
        state->timeout_sec = (int)(mm_shmem_timeout_ns() / 1000000000ull);
        mm_shmem_engine_describe(state->engine, sizeof state->engine);
    }
    return mm_abi_copy_out(out, out_size, state, sizeof *state, "megamoe_symm_state_t");
}
