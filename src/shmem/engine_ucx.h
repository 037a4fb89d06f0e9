/* The inter-host engine on UCX's UCP: state shared by its files (engine_ucx.c: set-up,
 * progress, waits, teardown; engine_ucx_am.c: the message protocol, the default;
 * engine_ucx_rma.c: UCP put/atomics with flush-ordered signals). Not for other layers: the
 * runtime reaches the engine through transport.h.
 *
 * Threading: one worker per PE in SERIALIZED mode behind `lock` (recursive): completion and
 * receive callbacks run inside progress, under the same lock as the calls that post. */
#ifndef MM_SHMEM_ENGINE_UCX_H
#define MM_SHMEM_ENGINE_UCX_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include "shmem_internal.h"

/* Puts below this size are staged: an O1 tile of rows (128 x H x 2 bytes, 512 KiB at H 2048)
 * then leaves the worker at once and drains while it computes the next tile; from 1 MiB on
 * the copy would cost more than the wait it saves, so those go zero-copy. */
#define MM_UCX_STAGE_MAX ((1u << 20) - 1)
#define MM_UCX_RING_BYTES (32u << 20)   /* staging ring */
#define MM_UCX_RING_RECS 16384u         /* staged puts in flight */
#define MM_UCX_ATOMIC_RECS 8192u        /* atomics in flight or queued (rma protocol) */
#define MM_UCX_DONE_RECS 64u            /* completion records of waits (more: malloc) */

/* How puts and signals travel (MEGAMOE_SHMEM_ENGINE_PROTOCOL). */
enum { MM_UCX_PROTO_AM = 0, MM_UCX_PROTO_RMA = 1 };

typedef struct mm_ucx_atomic {
    uint64_t operand, reply;
    uint64_t off, gen;
    int pe, op;
    struct mm_ucx_engine_s *e;
    struct mm_ucx_atomic *next; /* free list or the PE's queue */
} mm_ucx_atomic_t;

typedef struct mm_ucx_peer {
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    uint64_t base;            /* the peer's segment address */
    int given_up;             /* the endpoint was force-closed after a wait on pe gave up */
    /* rma protocol */
    uint64_t put_gen;         /* puts issued to this PE */
    uint64_t done_gen;        /* puts known complete at the PE */
    uint64_t flush_gen;       /* what the flush in flight covers */
    uint64_t fence_gen;       /* puts before the last fence: later puts wait for them */
    int flush_inflight;
    mm_ucx_atomic_t *q_head, *q_tail; /* atomics waiting for a flush, FIFO */
    /* am protocol, sending side */
    uint64_t seq_sent;        /* messages sent to this PE (numbered from 1) */
    uint64_t acked;           /* every message up to this one is applied at the PE */
    uint64_t ackreq_seq;      /* the last acknowledgement request sent (0: none) */
    uint64_t quiet_seq;       /* the last message a quiet must see applied */
} mm_ucx_peer_t;

typedef struct mm_ucx_flush_ctx {
    struct mm_ucx_engine_s *e;
    int pe;
} mm_ucx_flush_ctx_t;

typedef struct mm_ucx_ring_rec {
    uint64_t start, len;
    int done;
} mm_ucx_ring_rec_t;

struct mm_am_rx; /* engine_ucx_am.c: what a source PE sent that is not applied yet */

typedef struct mm_ucx_engine_s {
    pthread_mutex_t lock;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_mem_h memh;
    void *rkey_buf;
    size_t rkey_len;
    ucp_address_t *addr;
    size_t addr_len;
    char *seg_base;
    uint64_t seg_size;
    int my_pe, n_pes;
    int proto;                      /* MM_UCX_PROTO_* */
    mm_ucx_peer_t *peers;
    mm_ucx_flush_ctx_t *flush_ctxs; /* per PE: user data of its flush / error callbacks */
    struct mm_am_rx *rx;            /* per source PE (am protocol) */
    /* per source PE: messages and acknowledgements that arrived from it (am protocol). The
     * liveness monitor reads them without the lock: a peer whose data keeps arriving is alive
     * even while its own heartbeats queue behind that data. */
    _Atomic uint64_t *heard;
    struct mm_am_cork *corks;       /* per thread: small puts being coalesced (am protocol) */
    int n_corks;
    uint64_t uid;                   /* process-unique (threads find their cork by it) */
    size_t am_msg_max;              /* bytes of the largest message (one transport segment) */
    /* staging ring: bytes [tail, head) in flight (positions grow, modulo the size) */
    char *ring;
    uint64_t ring_head, ring_tail;
    mm_ucx_ring_rec_t *recs;
    uint64_t rec_head, rec_tail;
    mm_ucx_atomic_t *atomics, *free_atomics;
    int queued_atomics; /* in PE queues */
    int closes_open;              /* lost PEs' endpoint closes not yet completed */
    int losses_closed;            /* losses (mm_surv_lost_count) whose endpoints were closed */
    ucs_status_ptr_t *close_reqs; /* per PE: the close request of a lost PE's endpoint */
    struct mm_ucx_done *dones, *free_dones; /* completion records of waits */
    /* progress thread */
    pthread_t thread;
    int thread_started;
    int efd, wake_fd;
    atomic_int stop;
    char desc[224];
    mm_shmem_engine_stats_t stats; /* under the lock */
} mm_ucx_engine_t;

struct mm_shmem_engine {
    mm_ucx_engine_t u;
};

/* The completion record of a request a caller waits for (a *_nbx call's request; NULL from
 * the call means it completed at once). It belongs to the engine (a pool, malloc beyond it),
 * never to the caller's frame: a wait that gives up (peer lost, timeout) returns before UCX
 * completes the request, and the completion comes later, at the latest when fini
 * force-closes the endpoint (with UCS_ERR_CANCELED). Written into a stack frame that was
 * gone, it overwrote a saved register of mm_shmem_release after a cut host (a crash at
 * 0x7ff000000001: flag 1, then the packed status byte 0xf0). Ownership: the waiter releases
 * it once completed; a waiter that gives up first sets `abandoned` and the callback releases
 * it (both under the lock, where callbacks run). */
typedef struct mm_ucx_done {
    int flag;
    int abandoned;
    int pooled; /* from e->dones, else malloc'd */
    ucs_status_t status;
    struct mm_ucx_engine_s *e;
    struct mm_ucx_done *next; /* free list */
    uint64_t hdr[8];          /* a message header that must live as long as the request */
} mm_ucx_done_t;

/* ---- engine_ucx.c: shared by the protocols ---- */
int mm_ucx_progress_locked(mm_ucx_engine_t *e);
int mm_ucx_pe_lost(int pe);
mm_ucx_done_t *mm_ucx_done_new(mm_ucx_engine_t *e, ucp_request_param_t *prm);
void mm_ucx_done_release(mm_ucx_engine_t *e, mm_ucx_done_t *d);
megamoe_status_t mm_ucx_wait_done(mm_ucx_engine_t *e, mm_ucx_done_t *d, int pe,
                                  const char *what);
/* Wait (lock NOT held), progressing, until done(arg) is nonzero (evaluated under the lock);
 * TIMEOUT / PEER_LOST like every engine wait. */
megamoe_status_t mm_ucx_wait_until(mm_ucx_engine_t *e, int (*done)(mm_ucx_engine_t *, void *),
                                   void *arg, int pe, const char *what);
ucp_ep_h mm_ucx_ep_locked(mm_ucx_engine_t *e, int pe, const char *what, megamoe_status_t *st_p);
megamoe_status_t mm_ucx_status(ucs_status_t s, int pe, const char *what);
/* Reserve n contiguous bytes of the staging ring (lock held; progresses while full). */
megamoe_status_t mm_ucx_ring_alloc(mm_ucx_engine_t *e, size_t n, int pe, char **stage_p,
                                   mm_ucx_ring_rec_t **rec_p);
void mm_ucx_put_done_cb(void *request, ucs_status_t status, void *user_data);

/* ---- engine_ucx_rma.c ---- */
megamoe_status_t mm_ucx_rma_put(mm_ucx_engine_t *e, int pe, uint64_t off, const void *src,
                                size_t n);
megamoe_status_t mm_ucx_rma_atomic(mm_ucx_engine_t *e, int pe, uint64_t off, uint64_t value,
                                   int op);
megamoe_status_t mm_ucx_rma_fence(mm_ucx_engine_t *e);
megamoe_status_t mm_ucx_rma_quiet(mm_ucx_engine_t *e);
/* The queued atomics to pe can never be ordered (lock held): drop them. */
void mm_ucx_rma_drop_queue(mm_ucx_engine_t *e, int pe);

/* ---- engine_ucx_am.c ---- */
/* Register the message handlers on the worker (init). */
megamoe_status_t mm_ucx_am_setup(mm_ucx_engine_t *e);
/* One message: n bytes (n may be 0) to off of pe's segment, then, when sig_op >= 0, the
 * signal at sig_off; applied by pe after every earlier message from this PE. */
megamoe_status_t mm_ucx_am_send(mm_ucx_engine_t *e, int pe, uint64_t off, const void *src,
                                size_t n, uint64_t sig_off, uint64_t value, int sig_op);
megamoe_status_t mm_ucx_am_quiet(mm_ucx_engine_t *e);
/* Send every coalesced put to pe (pe < 0: to every PE) now (lock held): before a get from pe,
 * and when the staging ring is full. */
void mm_ucx_am_flush_pe(mm_ucx_engine_t *e, int pe);
/* Forget what pe sent and what waits for it (lock held; pe lost or the engine closing). */
void mm_ucx_am_forget(mm_ucx_engine_t *e, int pe);
/* Free the receive state (fini, after the worker is gone). */
void mm_ucx_am_fini(mm_ucx_engine_t *e);

#endif /* MM_SHMEM_ENGINE_UCX_H */
