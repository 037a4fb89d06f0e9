/* Transports: how a PE's heap segment is published to peers and reached by them.
 *
 * Today there is one, same-host shared memory: every peer's segment is mapped, so remote
 * access is a load/store at (peer base + offset) and the data path never calls through this
 * table. A multi-host transport (MPI RMA) would publish a window instead, leave the peer
 * base NULL for remote hosts and implement put/get/signal; mm_shmem_put() and friends route
 * there when the base is NULL.
 */
#ifndef MM_SHMEM_TRANSPORT_H
#define MM_SHMEM_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/status.h"

#define MM_SHMEM_SEG_NAME_MAX 48
/* Every mapping of a segment starts on this boundary (a huge page), so an offset aligned to
 * at most this much is an address aligned as much on every PE. */
#define MM_SHMEM_SEG_ALIGN (2u << 20)

typedef struct mm_shmem_segment {
    char *base;     /* mapping; NULL when not mapped */
    uint64_t size;
    char name[MM_SHMEM_SEG_NAME_MAX]; /* what peers need to attach ("/megamoe-<hex>") */
    int published;  /* the name still exists (must be removed) */
} mm_shmem_segment_t;

typedef struct mm_shmem_transport {
    const char *name;
    /* Create and map this PE's segment of size bytes (zero-filled, sparse). */
    megamoe_status_t (*seg_create)(uint64_t size, mm_shmem_segment_t *seg);
    /* Map peer pe's segment from its published name. */
    megamoe_status_t (*seg_attach)(int pe, const char *name, uint64_t size,
                                   mm_shmem_segment_t *seg);
    /* Remove the published name (after every peer attached): nothing outlives the job. */
    void (*seg_unpublish)(mm_shmem_segment_t *seg);
    void (*seg_detach)(mm_shmem_segment_t *seg);
    /* Remote access when the peer's base is NULL (NULL here: every peer is mapped). */
    void (*put)(int pe, uint64_t off, const void *src, size_t n);
    void (*get)(int pe, uint64_t off, void *dst, size_t n);
    void (*signal)(int pe, uint64_t off, uint64_t value, int op);
} mm_shmem_transport_t;

extern const mm_shmem_transport_t mm_shmem_transport_shm;

#endif /* MM_SHMEM_TRANSPORT_H */
