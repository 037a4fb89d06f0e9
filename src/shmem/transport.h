/* Transports: how a PE reaches a peer's heap segment. Reachability is per peer:
 *
 *  - same host: the segment transport (POSIX shared memory) publishes this PE's segment and
 *    maps every same-host peer's; remote access is then a load/store at (peer base + offset)
 *    and the data path never calls through a table;
 *  - another host: the inter-host engine (UCX UCP) registers this PE's segment, publishes its
 *    address and remote key through the bootstrap, connects to the peers of other hosts and
 *    carries put/get/atomics there. Completion is asynchronous and needs progress; every
 *    blocking engine call waits with the runtime's timeout and liveness checks.
 *
 * The engine follows the phases of Sandia OpenSHMEM's transport layer: init (local resources,
 * memory registration) -> publish (the bytes peers need) -> startup (connect to the peers of
 * other hosts, from their published bytes) -> data path -> fini. Every entry returns a status;
 * a failure on the data path also marks the peer lost, so waiters elsewhere fail too.
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

/* ---- same host: segments ---- */

typedef struct mm_shmem_seg_transport {
    const char *name;
    /* Create and map this PE's segment of size bytes (zero-filled, sparse). */
    megamoe_status_t (*seg_create)(uint64_t size, mm_shmem_segment_t *seg);
    /* Map peer pe's segment from its published name. */
    megamoe_status_t (*seg_attach)(int pe, const char *name, uint64_t size,
                                   mm_shmem_segment_t *seg);
    /* Remove the published name (after every peer attached): nothing outlives the job. */
    void (*seg_unpublish)(mm_shmem_segment_t *seg);
    void (*seg_detach)(mm_shmem_segment_t *seg);
} mm_shmem_seg_transport_t;

extern const mm_shmem_seg_transport_t mm_shmem_transport_shm;

/* ---- other hosts: the engine ---- */

/* Largest blob a PE publishes for the engine (worker address + remote key). */
#define MM_ENGINE_BLOB_MAX 4096

typedef struct mm_shmem_engine mm_shmem_engine_t;
struct mm_shmem_engine_stats; /* shmem.h */

typedef struct mm_engine_init {
    int my_pe, n_pes;
    char *seg_base;   /* this PE's segment, registered for remote access */
    uint64_t seg_size;
    const char *net_device; /* network interface to use ("" or NULL: let the engine choose) */
} mm_engine_init_t;

enum { MM_ENGINE_SET = 0, MM_ENGINE_ADD = 1, MM_ENGINE_CAS0 = 2 /* store if the word is 0 */ };
/* OR'ed into an atomic's op: a runtime synchronisation word (a barrier line) whose waiter sees
 * it arrive, so no later quiet needs to wait for it. */
#define MM_ENGINE_NO_QUIET 0x100

/* One get of get_many: n bytes at offset off of pe's segment into dst. */
typedef struct mm_engine_get {
    int pe;
    uint64_t off;
    void *dst;
    size_t n;
} mm_engine_get_t;

typedef struct mm_shmem_engine_ops {
    const char *name;
    megamoe_status_t (*init)(const mm_engine_init_t *in, mm_shmem_engine_t **e_p);
    /* The bytes every peer needs to reach this PE (at most MM_ENGINE_BLOB_MAX). */
    megamoe_status_t (*publish)(mm_shmem_engine_t *e, void *blob, size_t *len_p);
    /* Connect to every pe with remote[pe] != 0 from blobs + pe * stride (lens[pe] bytes). */
    megamoe_status_t (*startup)(mm_shmem_engine_t *e, const uint8_t *blobs, size_t stride,
                                const uint32_t *lens, const unsigned char *remote);
    /* Non-blocking put of n bytes to offset off of pe's segment (src reusable on return). */
    megamoe_status_t (*put)(mm_shmem_engine_t *e, int pe, uint64_t off, const void *src,
                            size_t n);
    /* Blocking get: dst holds the data on return. */
    megamoe_status_t (*get)(mm_shmem_engine_t *e, int pe, uint64_t off, void *dst, size_t n);
    /* n blocking gets in flight together (one round trip, not n): every dst holds its data on
     * return; the first error is returned, and every get issued is complete (or its endpoint
     * closed) before this returns. NULL: one get after another. */
    megamoe_status_t (*get_many)(mm_shmem_engine_t *e, const struct mm_engine_get *g, int n);
    /* Atomic update of the 64-bit word at off on pe, ordered after every put this thread issued
     * to pe before (the data a signal covers is visible before the signal). Non-blocking. */
    megamoe_status_t (*atomic)(mm_shmem_engine_t *e, int pe, uint64_t off, uint64_t value,
                               int op);
    /* A put of n bytes (n may be 0) and then the atomic, as one operation (one message where
     * the engine can): the atomic is never visible before the data. NULL: put, then atomic. */
    megamoe_status_t (*put_signal)(mm_shmem_engine_t *e, int pe, uint64_t off, const void *src,
                                   size_t n, uint64_t sig_off, uint64_t value, int op);
    /* Operations to a PE issued before are delivered before those issued after. */
    megamoe_status_t (*fence)(mm_shmem_engine_t *e);
    /* Every operation issued before is complete at its target (blocking). */
    megamoe_status_t (*quiet)(mm_shmem_engine_t *e);
    /* Make progress on incoming and outgoing operations; returns 1 when something moved. */
    int (*progress)(mm_shmem_engine_t *e);
    /* Stop the progress thread, close connections (forced: peers may be gone), deregister. */
    void (*fini)(mm_shmem_engine_t *e);
    /* Counters since init (shmem.h, mm_shmem_engine_stats_t); may be NULL. */
    void (*stats)(mm_shmem_engine_t *e, struct mm_shmem_engine_stats *out);
    /* Messages of any kind that arrived from pe since init (data, acknowledgements): the
     * liveness monitor counts a change as a sign of life. Callable from any thread without
     * blocking; 0 where the engine cannot tell (one-sided protocols). May be NULL. */
    uint64_t (*heard)(mm_shmem_engine_t *e, int pe);
    /* "UCX 1.13.1, tcp" style description for logs and benchmarks. */
    void (*describe)(mm_shmem_engine_t *e, char *buf, size_t len);
} mm_shmem_engine_ops_t;

extern const mm_shmem_engine_ops_t mm_shmem_engine_ucx;

#endif /* MM_SHMEM_TRANSPORT_H */
