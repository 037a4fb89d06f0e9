/* One-sided data movement: put, get, put-with-signal, signal ops, fence, quiet.
 *
 * Same-host peers are mapped, so a remote object is (peer base + offset of the local object)
 * and every operation completes when the call returns: a put is a copy into the peer's
 * mapping, a signal an atomic store/add on the peer's word. Ordering: mm_shmem_copy() ends
 * large (streaming) copies with sfence, signal updates are release operations, so data
 * written before a signal is visible to whoever observes the signal with an acquire load.
 */
#include <string.h>

#include "shmem_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MM_SFENCE() _mm_sfence()
#else
#define MM_SFENCE() ((void)0)
#endif

#if defined(__SANITIZE_THREAD__)
/* TSan does not model fences; an atomic read-modify-write gives it the same ordering. */
static uint64_t mm_fence_word;
#define MM_FENCE(order) ((void)__atomic_fetch_add(&mm_fence_word, 0, order))
#else
#define MM_FENCE(order) __atomic_thread_fence(order)
#endif

/* Remote address of [sym, sym + n) on pe; NULL (with the error recorded) when invalid, or
 * when the peer is not mapped (then *off_p is set for a transport that handles it). */
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

void mm_shmem_put(void *dest, const void *src, size_t nbytes, int pe)
{
    uint64_t off;
    int bad;
    char *d = mm_shmem_xlate(dest, nbytes, pe, "mm_shmem_put", &off, &bad);
    if (d) mm_shmem_copy(d, src, nbytes);
    else if (!bad && mm_shmem_g.transport->put) mm_shmem_g.transport->put(pe, off, src, nbytes);
}

void mm_shmem_get(void *dest, const void *src, size_t nbytes, int pe)
{
    uint64_t off;
    int bad;
    const char *s = mm_shmem_xlate(src, nbytes, pe, "mm_shmem_get", &off, &bad);
    if (s) mm_shmem_copy(dest, s, nbytes);
    else if (!bad && mm_shmem_g.transport->get) mm_shmem_g.transport->get(pe, off, dest, nbytes);
}

static void mm_shmem_signal_at(uint64_t *remote, uint64_t value, int sig_op)
{
    if (sig_op == MM_SHMEM_SIGNAL_ADD) __atomic_fetch_add(remote, value, __ATOMIC_RELEASE);
    else __atomic_store_n(remote, value, __ATOMIC_RELEASE);
}

void mm_shmem_signal_op(uint64_t *sig, uint64_t value, int sig_op, int pe)
{
    uint64_t off;
    int bad;
    if (sig_op != MM_SHMEM_SIGNAL_SET && sig_op != MM_SHMEM_SIGNAL_ADD) {
        mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_signal_op: sig_op %d is neither "
                 "MM_SHMEM_SIGNAL_SET nor MM_SHMEM_SIGNAL_ADD", sig_op);
        return;
    }
    if (((uintptr_t)sig & 7) != 0) {
        mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_shmem_signal_op: signal %p is not 8-byte aligned",
                 (void *)sig);
        return;
    }
    uint64_t *r = (uint64_t *)mm_shmem_xlate(sig, sizeof *sig, pe, "mm_shmem_signal_op", &off, &bad);
    if (r) mm_shmem_signal_at(r, value, sig_op);
    else if (!bad && mm_shmem_g.transport->signal) mm_shmem_g.transport->signal(pe, off, value, sig_op);
}

void mm_shmem_put_signal(void *dest, const void *src, size_t nbytes, uint64_t *sig,
                         uint64_t value, int sig_op, int pe)
{
    mm_shmem_put(dest, src, nbytes, pe);
    /* Data stores (regular ones are ordered by the release below; streaming ones were fenced
     * by the copy) precede the signal. */
    mm_shmem_signal_op(sig, value, sig_op, pe);
}

uint64_t mm_shmem_signal_fetch(const uint64_t *sig)
{
    return __atomic_load_n(sig, __ATOMIC_ACQUIRE);
}

void mm_shmem_fence(void)
{
    MM_SFENCE();
    MM_FENCE(__ATOMIC_RELEASE);
}

void mm_shmem_quiet(void)
{
    MM_SFENCE();
    MM_FENCE(__ATOMIC_SEQ_CST);
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
