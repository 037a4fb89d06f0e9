/* megamoe — symmetric memory of a communicator, for the Python module
 * hyper_parallel.core.multicore.shmem (HyperParallel's one-sided API: acquire, empty, free,
 * put, get, signal, wait_signal, barrier, all_gather, debug_state; docs/shmem.md "Python
 * shmem module").
 *
 * The runtime (started by the first communicator) gives every rank one heap segment; an
 * allocation is collective over the communicator's ranks and lands at the same offset on each
 * of them, so a rank addresses a peer's copy by its own address plus the peer's rank. PEs are
 * ranks of the communicator. Same-host peers are written through their mapping, other hosts
 * through the inter-host engine. Errors: INVALID_ARGUMENT for a range outside the symmetric
 * heap or a PE out of range, TIMEOUT / PEER_LOST instead of a hang.
 */
#ifndef MEGAMOE_SYMM_H
#define MEGAMOE_SYMM_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/comm.h"
#include "megamoe/export.h"
#include "megamoe/status.h"

#ifdef __cplusplus
extern "C" {
#endif
MEGAMOE_API_BEGIN

/* Collective over comm's ranks (same order and sizes everywhere, else CONFIG_MISMATCH on all):
 * size bytes aligned to align (a power of two <= 2 MiB; 0 = 64), zeroed. */
megamoe_status_t megamoe_symm_malloc(megamoe_comm_t *comm, size_t size, size_t align,
                                     void **ptr_p);
/* Collective over comm's ranks; the pointer megamoe_symm_malloc returned. */
megamoe_status_t megamoe_symm_free(megamoe_comm_t *comm, void *ptr);

/* Copy n bytes from local src to PE pe's copy of the symmetric dest (src reusable on return;
 * visible at pe after a later signal, barrier or quiet). */
megamoe_status_t megamoe_symm_put(megamoe_comm_t *comm, void *dest, const void *src, size_t n,
                                  int pe);
/* Copy n bytes of PE pe's copy of the symmetric src into local dest (complete on return). */
megamoe_status_t megamoe_symm_get(megamoe_comm_t *comm, void *dest, const void *src, size_t n,
                                  int pe);

enum { MEGAMOE_SYMM_SIGNAL_SET = 0, MEGAMOE_SYMM_SIGNAL_ADD = 1 };
enum {
    MEGAMOE_SYMM_CMP_EQ = 0,
    MEGAMOE_SYMM_CMP_NE,
    MEGAMOE_SYMM_CMP_GT,
    MEGAMOE_SYMM_CMP_GE,
    MEGAMOE_SYMM_CMP_LT,
    MEGAMOE_SYMM_CMP_LE
};
/* Set or add value on PE pe's copy of the symmetric int32 sig, after every earlier put of
 * this rank to pe is delivered (a fence): a waiter that sees the new value sees those puts.
 * Atomic on same-host peers. Across hosts the update is a 64-bit atomic on the aligned word
 * holding sig (exact modulo 2^32; a lower-half add that wraps also carries into the other four
 * bytes: keep signals on their own 8 bytes, as the 64-byte spacing rule does anyway). */
megamoe_status_t megamoe_symm_signal_i32(megamoe_comm_t *comm, int32_t *sig, int32_t value,
                                         int op, int pe);
/* Wait until the local int32 *sig compares (signed) true with value: spin, yield, sleep;
 * TIMEOUT after HYPER_PARALLEL_SHMEM_TIMEOUT_SEC, PEER_LOST when a peer dies. */
megamoe_status_t megamoe_symm_wait_i32(megamoe_comm_t *comm, const int32_t *sig, int cmp,
                                       int32_t value);
/* Every put and signal this rank issued is complete at its target. */
megamoe_status_t megamoe_symm_quiet(megamoe_comm_t *comm);
/* Collective: rank r's n bytes of src land at dest + r * n on every rank (dest symmetric, at
 * least size * n bytes); returns after every rank's data arrived everywhere (a barrier). */
megamoe_status_t megamoe_symm_all_gather(megamoe_comm_t *comm, void *dest, const void *src,
                                         size_t n);

/* A local snapshot of the runtime for diagnostics. */
typedef struct megamoe_symm_state {
    int running;            /* 1 between the first communicator and the last destroy */
    int refcount;           /* runtime references (communicators and layers) */
    int rank, world_size;   /* of the world */
    uint64_t heap_size;     /* user heap bytes per rank */
    uint64_t bytes_used, bytes_peak;
    int live_allocations;
    int timeout_sec;
    char engine[96];        /* the inter-host engine ("none" on one host) */
} megamoe_symm_state_t;
/* Filled by the library: the macro passes the caller's sizeof (megamoe/version.h). */
megamoe_status_t megamoe_symm_state_sized(megamoe_symm_state_t *state, size_t state_size);
#define megamoe_symm_state(state_p) megamoe_symm_state_sized((state_p), sizeof *(state_p))

MEGAMOE_API_END
#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_SYMM_H */
