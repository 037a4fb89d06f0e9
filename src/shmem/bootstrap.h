/* TCP bootstrap: job membership, authentication, settings check and control collectives.
 *
 * Rank 0 listens on the endpoint; every other rank connects (retrying until the timeout) and
 * proves it holds the job token by challenge-response (HMAC-SHA-256 over fresh nonces, so the
 * token never crosses the wire); rank 0 proves it back. Rank 0 handles all handshakes at once
 * with poll(): a connection that sends garbage, an oversized or malformed frame, a wrong MAC,
 * an unexpected or duplicate rank, or nothing within the handshake timeout is closed and
 * logged without delaying the others. When all ranks are in, rank 0 compares every rank's
 * settings and sends one verdict: a mismatch is the same CONFIG_MISMATCH text on every rank.
 *
 * The connections (a star around rank 0) stay open for the lifetime: they carry the control
 * collectives below and a closed connection tells that a peer is gone. Collectives carry an
 * operation tag and a sequence number; rank 0 checks them, so ranks that call different
 * collectives get CONFIG_MISMATCH instead of exchanging wrong data. Every error decided by
 * rank 0 (timeout, lost peer, mismatch) reaches all ranks with the same text. After an error
 * the object is broken: every later collective returns that error at once.
 */
#ifndef MM_SHMEM_BOOTSTRAP_H
#define MM_SHMEM_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/status.h"

#include "boot_net.h"

#define MM_BOOT_PROTO 1
/* Largest contribution of one rank to a control collective. */
#define MM_BOOT_MAX_CONTRIB (1u << 20)
/* Default time an unauthenticated connection may take to complete its handshake. */
#define MM_BOOT_HANDSHAKE_NS (10ull * 1000000000ull)

/* What every rank must agree on; compared by rank 0 field by field. */
typedef struct mm_boot_settings {
    uint64_t heap_size; /* HYPER_PARALLEL_SHMEM_HEAP_SIZE */
    uint64_t layout;    /* internal heap layout id (reserve size, slot counts) */
    uint32_t world;     /* world size */
    char version[16];   /* library version */
} mm_boot_settings_t;

typedef struct mm_boot_config {
    int rank, world;
    mm_endpoint_t endpoint;
    const char *token;                /* job token (may be empty: no real authentication) */
    mm_boot_settings_t settings;
    uint64_t timeout_ns;              /* connect phase and each collective */
    uint64_t handshake_timeout_ns;    /* 0: MM_BOOT_HANDSHAKE_NS */
} mm_boot_config_t;

typedef struct mm_boot mm_boot_t;

/* Join the job: rank 0 accepts and checks everyone, the others connect. Returns when every
 * rank is in and the settings match, or with the same error on every rank that got a verdict. */
megamoe_status_t mm_boot_create(const mm_boot_config_t *cfg, mm_boot_t **boot_p);
void mm_boot_destroy(mm_boot_t *boot);

int mm_boot_rank(const mm_boot_t *boot);
int mm_boot_world(const mm_boot_t *boot);
/* Socket that tells when world rank pe goes away (rank 0: every peer; others: rank 0 only),
 * -1 when none. For poll(POLLRDHUP) by the liveness monitor. */
int mm_boot_fd(const mm_boot_t *boot, int pe);
/* Close the connection to a lost pe (the liveness monitor; nothing more comes from it). The
 * control collectives then fail with PEER_LOST: after a loss the survivors use the heap. */
void mm_boot_drop_fd(mm_boot_t *boot, int pe);

/* Control collectives (every rank calls them in the same order). */
megamoe_status_t mm_boot_barrier(mm_boot_t *boot);
/* out receives world * len bytes in rank order; len <= MM_BOOT_MAX_CONTRIB. */
megamoe_status_t mm_boot_allgather(mm_boot_t *boot, const void *in, size_t len, void *out);
megamoe_status_t mm_boot_bcast(mm_boot_t *boot, void *buf, size_t len, int root);
/* Collective decision: OK when every rank passed OK, else on every rank the status of the
 * lowest failing rank with last error "rank R: <its last error>". */
megamoe_status_t mm_boot_agree(mm_boot_t *boot, megamoe_status_t local);

#endif /* MM_SHMEM_BOOTSTRAP_H */
