/* The inter-host engine on UCX's UCP: put/get/atomics on the registered heap segment; this file
 * holds set-up, progress, waits and teardown, the protocols are engine_ucx_am.c (default) and
 * engine_ucx_rma.c (engine_ucx.h).
 *
 * Why UCP (docs/shmem.md, "Choosing the engine"): one-sided operations on registered memory
 * with remote keys, the layer OpenSHMEM-UCX and NVSHMEM's remote transport build on, with a
 * native path on RDMA networks and a software one (active messages) on TCP.
 *
 * Threading: one worker per PE in SERIALIZED mode behind `lock` (recursive), so completion
 * callbacks run under the same lock as the calls that post (they post chained atomics and
 * loss reports themselves). A progress thread sleeps on the worker's event fd and progresses
 * incoming operations while every thread of this PE computes (on TCP, and for every message
 * of the am protocol, the target must progress for a put to land); waits progress too.
 *
 * Semantics the runtime needs (both protocols keep them):
 *  - put: the source is reusable on return. Puts below 1 MiB are copied into a staging ring
 *    and sent from there (non-blocking: a row-by-row dispatch or an O1 tile pipelines); larger
 *    puts go zero-copy from the caller's buffer and wait for completion.
 *  - a signal is never visible before the data it covers (every earlier put to that PE).
 *  - quiet: everything issued before is complete at its target.
 */
#include <errno.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/env.h"
#include "base/tsan.h"
#include "engine_ucx.h"
#include "survive.h"

/* A PE's engine record: segment address and size (u64 each), worker address and remote key
 * lengths (u32 each), protocol (u32), then the address and the key. */
#define MM_UCX_BLOB_HDR 28
static const char *const mm_ucx_proto_names[] = {"am", "rma"};

static double mm_sec(uint64_t ns) { return (double)ns * 1e-9; }

/* ---- waiting (lock NOT held by the caller) ---- */

static void mm_ucx_close_lost_start_locked(mm_ucx_engine_t *e);
static void mm_ucx_close_lost_finish_locked(mm_ucx_engine_t *e);

/* Progress (lock held). Before each step, the endpoint of every PE known lost (any cause: a
 * bootstrap socket, a liveness check, a UCX endpoint error, the job-lost word) is closed:
 * UCX 1.13 over TCP kills the process otherwise. TCP has no RMA lanes, so every put and
 * signal is an active message the target acknowledges; one from a lost peer still in a socket
 * buffer would be handled, its acknowledgement would fail inside UCX ("Fatal: unexpected
 * error: Endpoint timeout", ucp_request.inl) and UCX would abort the survivor (3 of 40
 * kill-host runs under load). What arrives for a closed endpoint is dropped. */
#define MM_UCX_PROGRESS_STEPS 256 /* per call: the caller's loop checks its timeout between */
int mm_ucx_progress_locked(mm_ucx_engine_t *e)
{
    int any = 0;
    /* bounded: UCX can report progress on every call for as long as it retries something
     * (an endpoint to a cut-off host being discarded); an unbounded loop here would hold
     * the lock and never reach the caller's timeout */
    for (int i = 0; i < MM_UCX_PROGRESS_STEPS; i++) {
        /* a PE lost since the last close (whether the survivors acknowledged it or not): its
         * endpoint goes, the survivors' stay (survive.h) */
        int losses = mm_surv_lost_count();
        if (losses != e->losses_closed) {
            e->losses_closed = losses;
            mm_ucx_close_lost_start_locked(e);
        }
        if (e->closes_open) mm_ucx_close_lost_finish_locked(e);
        /* the rma protocol's incoming puts are copied into the heap inside uninstrumented UCX,
         * ordered before their signal by UCX alone: TSan would see the copy but not the order,
         * so under TSan that copy is not recorded (the am protocol applies messages in our
         * handlers, release stores TSan sees) */
        const int rma = e->proto == MM_UCX_PROTO_RMA;
        if (rma) MM_TSAN_IGNORE_BEGIN();
        const unsigned progressed = ucp_worker_progress(e->worker);
        if (rma) MM_TSAN_IGNORE_END();
        if (!progressed) return any;
        any = 1;
    }
    return any;
}

/* 1 when pe is known lost here: its dead flag, or the job-lost word naming it (another PE,
 * e.g. rank 0 which sees every bootstrap socket, saw it go before this one did). */
int mm_ucx_pe_lost(int pe)
{
    mm_shmem_global_t *g = &mm_shmem_g;
    if (g->dead && atomic_load(&g->dead[pe])) return 1;
    return g->my_base && __atomic_load_n(&mm_shmem_header(g->my_base)->lost,
                                         __ATOMIC_ACQUIRE) == (uint64_t)pe + 1;
}

/* Wait until done_fn(e, arg) (under the lock), progressing; TIMEOUT after the
 * runtime timeout, PEER_LOST when the target PE was lost. Operations between live PEs still
 * complete after a loss elsewhere (as between mapped PEs), but a wait that has not ended
 * MM_UCX_LOSS_GRACE_NS after a loss is known gives up with that loss: a wait on no single PE
 * (quiet) may cover the lost PE, and one on a live PE cut off with the lost one (a whole host
 * gone, the loss word naming another of its ranks) would otherwise run into the timeout. */
#define MM_UCX_LOSS_GRACE_NS 1000000000ull
megamoe_status_t mm_ucx_wait_until(mm_ucx_engine_t *e, int (*done_fn)(mm_ucx_engine_t *, void *),
                                   void *arg, int pe, const char *what)
{
    uint64_t start = mm_now_ns(), timeout = mm_shmem_timeout_ns(), sleep_ns = 10000;
    uint64_t loss_seen = 0;
    for (unsigned i = 0;; i++) {
        pthread_mutex_lock(&e->lock);
        mm_ucx_progress_locked(e);
        int done = done_fn(e, arg);
        pthread_mutex_unlock(&e->lock);
        if (done) return MEGAMOE_OK;
        if ((i & 15) != 15) {
            sched_yield();
            continue;
        }
        if (pe >= 0 && mm_ucx_pe_lost(pe))
            return mm_error(MEGAMOE_PEER_LOST, "%s: rank %d was lost", what, pe);
        if (mm_shmem_lost_pe() >= 0) {
            if (loss_seen == 0) loss_seen = mm_now_ns();
            else if (mm_now_ns() - loss_seen > MM_UCX_LOSS_GRACE_NS) {
                megamoe_status_t st = mm_shmem_check_peers(what);
                if (st != MEGAMOE_OK) return st; /* (acknowledged meanwhile: wait on) */
            }
        }
        uint64_t el = mm_now_ns() - start;
        if (el >= timeout)
            return mm_error(MEGAMOE_TIMEOUT, "%s timed out after %.1f s (rank %d does not "
                            "answer over the inter-host engine); raise "
                            "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC if the network is just slow",
                            what, mm_sec(el), pe);
        if (el > 2000000ull) {
            mm_sleep_ns(sleep_ns);
            if (sleep_ns < 500000) sleep_ns *= 2;
        }
    }
}

static int mm_ucx_flag_set(mm_ucx_engine_t *e, void *flag)
{
    (void)e;
    return __atomic_load_n((const int *)flag, __ATOMIC_ACQUIRE);
}

/* Wait until *flag != 0 (set by a callback under the lock). */
static megamoe_status_t mm_ucx_wait_flag(mm_ucx_engine_t *e, const int *flag, int pe,
                                         const char *what)
{
    return mm_ucx_wait_until(e, mm_ucx_flag_set, (void *)flag, pe, what);
}

static void mm_ucx_forget_locked(mm_ucx_engine_t *e, int pe);


static void mm_ucx_done_release_locked(mm_ucx_engine_t *e, mm_ucx_done_t *d)
{
    if (!d->pooled) {
        free(d);
        return;
    }
    d->next = e->free_dones;
    e->free_dones = d;
}

void mm_ucx_done_release(mm_ucx_engine_t *e, mm_ucx_done_t *d)
{
    pthread_mutex_lock(&e->lock);
    mm_ucx_done_release_locked(e, d);
    pthread_mutex_unlock(&e->lock);
}

static void mm_ucx_done_cb(void *request, ucs_status_t status, void *user_data)
{
    mm_ucx_done_t *d = user_data;
    ucp_request_free(request);
    if (d->abandoned) {
        mm_ucx_done_release_locked(d->e, d);
        return;
    }
    d->status = status;
    __atomic_store_n(&d->flag, 1, __ATOMIC_RELEASE);
}

/* A completion record and the request parameters that point at it (NULL: out of memory). */
mm_ucx_done_t *mm_ucx_done_new(mm_ucx_engine_t *e, ucp_request_param_t *prm)
{
    pthread_mutex_lock(&e->lock);
    mm_ucx_done_t *d = e->free_dones;
    if (d) e->free_dones = d->next;
    pthread_mutex_unlock(&e->lock);
    int pooled = d != NULL;
    if (d == NULL) d = malloc(sizeof *d); /* more waits at once than the pool holds */
    memset(prm, 0, sizeof *prm);
    if (d == NULL) {
        mm_error(MEGAMOE_OUT_OF_MEMORY, "inter-host engine: out of memory");
        return NULL;
    }
    *d = (mm_ucx_done_t){.pooled = pooled, .status = UCS_OK, .e = e};
    prm->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm->cb.send = mm_ucx_done_cb;
    prm->user_data = d;
    return d;
}

#define MM_UCX_CLOSE_WAIT_NS 200000000ull /* 0.2 s for a forced close to complete */

/* Start a forced close of p's endpoint (lock held; p->ep and p->rkey cleared first): the
 * requests to the peer complete (cancelled) inside it, and nothing waits for the peer, which
 * may be gone. Returns the close request still to be completed and freed, or NULL (no
 * endpoint, closed at once, or refused). */
static ucs_status_ptr_t mm_ucx_force_close_start(mm_ucx_peer_t *p)
{
    ucp_ep_h ep = p->ep;
    if (p->rkey) ucp_rkey_destroy(p->rkey);
    p->rkey = NULL;
    if (ep == NULL) return NULL;
    p->ep = NULL;
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &prm);
    return r != NULL && !UCS_PTR_IS_ERR(r) ? r : NULL;
}

/* Close pe's endpoint with force (lock held): every request to pe completes now (with an
 * error; their callbacks run inside this progress), so none reads a source or writes a
 * destination of a caller that stopped waiting, and later operations to pe fail at once.
 * p->ep is cleared first: a flush completing during the close drops its queued signals
 * (mm_ucx_flush_complete) instead of posting them to the closing endpoint. */
static void mm_ucx_close_ep_locked(mm_ucx_engine_t *e, int pe)
{
    const int had_ep = e->peers[pe].ep != NULL;
    ucs_status_ptr_t r = mm_ucx_force_close_start(&e->peers[pe]);
    if (!had_ep) return;
    /* the close itself may never complete on a connection to a cut-off host (UCX keeps
     * flushing it): a bounded wait */
    const uint64_t until = mm_now_ns() + MM_UCX_CLOSE_WAIT_NS;
    while (r != NULL && mm_now_ns() < until) {
        ucp_worker_progress(e->worker);
        if (ucp_request_check_status(r) != UCS_INPROGRESS) break;
    }
    if (r != NULL) ucp_request_free(r);
    mm_ucx_forget_locked(e, pe); /* signals queued behind a flush that never comes */
}

/* Close, with force and without progress, the endpoint of every PE known lost that is still
 * open (lock held; also from UCX's endpoint error callback, inside progress). UCX drops what
 * still arrives for a closed endpoint; the close requests complete in later progress
 * (mm_ucx_close_lost_finish_locked). Endpoints to live PEs stay open: the loss itself travels
 * over them (the job-lost word), and one-sided operations between live PEs keep working. */
static void mm_ucx_close_lost_start_locked(mm_ucx_engine_t *e)
{
    for (int pe = 0; pe < e->n_pes; pe++) {
        mm_ucx_peer_t *p = &e->peers[pe];
        if (p->ep == NULL || !mm_ucx_pe_lost(pe)) continue;
        p->given_up = 1;
        ucs_status_ptr_t r = mm_ucx_force_close_start(p);
        if (r != NULL) {
            e->close_reqs[pe] = r;
            e->closes_open = 1;
        }
    }
}

/* Progress until the closes mm_ucx_close_lost_start_locked started are complete (bounded),
 * release their requests and the signals queued behind flushes that will not come. */
static void mm_ucx_close_lost_finish_locked(mm_ucx_engine_t *e)
{
    e->closes_open = 0; /* first: the progress below comes back through progress paths */
    const uint64_t until = mm_now_ns() + MM_UCX_CLOSE_WAIT_NS; /* as in mm_ucx_close_ep_locked */
    while (mm_now_ns() < until) {
        int open = 0;
        for (int pe = 0; pe < e->n_pes; pe++)
            open |= e->close_reqs[pe] != NULL &&
                    ucp_request_check_status(e->close_reqs[pe]) == UCS_INPROGRESS;
        if (!open) break;
        ucp_worker_progress(e->worker);
    }
    for (int pe = 0; pe < e->n_pes; pe++) {
        if (e->close_reqs[pe] == NULL) continue;
        ucp_request_free(e->close_reqs[pe]); /* or when it completes */
        e->close_reqs[pe] = NULL;
        mm_ucx_forget_locked(e, pe);
    }
}

/* Wait for the request behind d (pe < 0: none in particular), then free d. A wait that gives
 * up on pe closes pe's endpoint, so the request completes before this returns (its buffers
 * are the caller's); one on no single PE (quiet: no caller buffers) leaves d to the callback. */
megamoe_status_t mm_ucx_wait_done(mm_ucx_engine_t *e, mm_ucx_done_t *d, int pe,
                                         const char *what)
{
    megamoe_status_t st = mm_ucx_wait_flag(e, &d->flag, pe, what);
    pthread_mutex_lock(&e->lock);
    if (st != MEGAMOE_OK && pe >= 0 && !__atomic_load_n(&d->flag, __ATOMIC_ACQUIRE)) {
        e->peers[pe].given_up = 1;
        mm_ucx_close_ep_locked(e, pe);
        for (int i = 0; i < 1000 && !__atomic_load_n(&d->flag, __ATOMIC_ACQUIRE); i++)
            mm_ucx_progress_locked(e);
    }
    int done = __atomic_load_n(&d->flag, __ATOMIC_ACQUIRE);
    ucs_status_t us = d->status;
    if (done) mm_ucx_done_release_locked(e, d);
    else d->abandoned = 1;
    pthread_mutex_unlock(&e->lock);
    if (st == MEGAMOE_OK) st = mm_ucx_status(us, pe, what);
    return st;
}

/* pe's endpoint for an operation (lock held), or NULL with the error in *st_p. */
ucp_ep_h mm_ucx_ep_locked(mm_ucx_engine_t *e, int pe, const char *what,
                                 megamoe_status_t *st_p)
{
    mm_ucx_peer_t *p = &e->peers[pe];
    if (p->ep) return p->ep;
    if (mm_ucx_pe_lost(pe)) {
        *st_p = mm_error(MEGAMOE_PEER_LOST, "%s: rank %d was lost", what, pe);
        return NULL;
    }
    if (p->given_up)
        *st_p = mm_error(MEGAMOE_PEER_LOST, "%s: the connection to rank %d was closed after an "
                         "earlier operation to it failed or timed out; the job cannot continue: "
                         "release SHMEM and restart every rank", what, pe);
    else
        *st_p = mm_error(MEGAMOE_INTERNAL, "%s: no engine connection to rank %d", what, pe);
    return NULL;
}

megamoe_status_t mm_ucx_status(ucs_status_t s, int pe, const char *what)
{
    if (s == UCS_OK) return MEGAMOE_OK;
    if (!atomic_load(&mm_shmem_g.closing)) {
        char why[160];
        snprintf(why, sizeof why, "the inter-host engine failed during %s: %s", what,
                 ucs_status_string(s));
        if (pe >= 0) mm_shmem_mark_lost(pe, why);
    }
    return mm_error(MEGAMOE_PEER_LOST, "%s to rank %d failed in UCX: %s", what, pe,
                    ucs_status_string(s));
}

/* ---- staging ring (lock held) ---- */

static void mm_ucx_ring_release(mm_ucx_engine_t *e)
{
    while (e->rec_tail != e->rec_head && e->recs[e->rec_tail % MM_UCX_RING_RECS].done) {
        mm_ucx_ring_rec_t *r = &e->recs[e->rec_tail % MM_UCX_RING_RECS];
        e->ring_tail = r->start + r->len;
        e->rec_tail++;
    }
    /* empty: start again at the ring's beginning, so the pages in use are those of the
     * largest burst in flight, not the whole ring (walking round it, a serving loop's resident
     * set crept up by the ring's 32 MiB over ~30,000 small calls) */
    if (e->rec_tail == e->rec_head) e->ring_tail = e->ring_head = 0;
}

void mm_ucx_put_done_cb(void *request, ucs_status_t status, void *user_data)
{
    mm_ucx_ring_rec_t *r = user_data;
    (void)status; /* an error reaches the endpoint's error handler */
    r->done = 1;
    ucp_request_free(request);
}

/* Reserve n contiguous bytes of the ring (lock held; progresses while full). */
megamoe_status_t mm_ucx_ring_alloc(mm_ucx_engine_t *e, size_t n, int pe, char **stage_p,
                                          mm_ucx_ring_rec_t **rec_p)
{
    uint64_t start_ns = 0;
    for (;;) {
        mm_ucx_ring_release(e);
        uint64_t head = e->ring_head, pos = head % MM_UCX_RING_BYTES;
        if (pos + n > MM_UCX_RING_BYTES) head += MM_UCX_RING_BYTES - pos; /* no wrap inside */
        if (head + n - e->ring_tail <= MM_UCX_RING_BYTES &&
            e->rec_head - e->rec_tail < MM_UCX_RING_RECS) {
            mm_ucx_ring_rec_t *r = &e->recs[e->rec_head % MM_UCX_RING_RECS];
            /* a skipped tail of the ring belongs to this record, so it is released with it */
            r->start = e->ring_head;
            r->len = head + n - e->ring_head;
            r->done = 0;
            e->rec_head++;
            e->ring_head = head + n;
            *rec_p = r;
            *stage_p = e->ring + head % MM_UCX_RING_BYTES;
            return MEGAMOE_OK;
        }
        if (start_ns == 0) start_ns = mm_now_ns();
        /* coalesced puts hold their reservations until sent, and the ring is released in
         * order: send them (any thread's), else an idle thread's cork could fill it for good */
        if (e->proto == MM_UCX_PROTO_AM) mm_ucx_am_flush_pe(e, -1);
        mm_ucx_progress_locked(e);
        MM_CHECK(mm_shmem_check_peers("an inter-host put"));
        if (mm_now_ns() - start_ns > mm_shmem_timeout_ns())
            return mm_error(MEGAMOE_TIMEOUT, "inter-host put to rank %d: the staging ring (%u "
                            "MiB) did not drain within HYPER_PARALLEL_SHMEM_TIMEOUT_SEC", pe,
                            MM_UCX_RING_BYTES >> 20);
    }
}

static megamoe_status_t mm_ucx_get(mm_shmem_engine_t *se, int pe, uint64_t off, void *dst,
                                   size_t n)
{
    mm_ucx_engine_t *e = &se->u;
    mm_ucx_peer_t *p = &e->peers[pe];
    if (n == 0) return MEGAMOE_OK;
    ucp_request_param_t prm;
    mm_ucx_done_t *d = mm_ucx_done_new(e, &prm);
    if (d == NULL) return MEGAMOE_OUT_OF_MEMORY;
    megamoe_status_t st = MEGAMOE_OK;
    pthread_mutex_lock(&e->lock);
    ucs_status_ptr_t r = NULL;
    if (mm_ucx_ep_locked(e, pe, "inter-host get", &st)) {
        if (e->proto == MM_UCX_PROTO_AM) mm_ucx_am_flush_pe(e, pe);
        r = ucp_get_nbx(p->ep, dst, n, p->base + off, p->rkey, &prm);
        e->stats.gets++;
        e->stats.get_bytes += n;
    }
    pthread_mutex_unlock(&e->lock);
    if (st != MEGAMOE_OK || r == NULL || UCS_PTR_IS_ERR(r)) {
        mm_ucx_done_release(e, d);
        if (st == MEGAMOE_OK && r != NULL)
            st = mm_ucx_status(UCS_PTR_STATUS(r), pe, "an inter-host get");
        return st;
    }
    return mm_ucx_wait_done(e, d, pe, "an inter-host get");
}

/* Gets issued together, then waited for in turn: the round trips overlap (a serving call
 * fetches one block per remote expert; one after another they cost a round trip each). */
#define MM_UCX_GET_BATCH 64
static megamoe_status_t mm_ucx_get_many(mm_shmem_engine_t *se, const mm_engine_get_t *g, int n)
{
    mm_ucx_engine_t *e = &se->u;
    megamoe_status_t first = MEGAMOE_OK;
    for (int b0 = 0; b0 < n; b0 += MM_UCX_GET_BATCH) {
        const int nb = n - b0 < MM_UCX_GET_BATCH ? n - b0 : MM_UCX_GET_BATCH;
        mm_ucx_done_t *d[MM_UCX_GET_BATCH];
        for (int i = 0; i < nb; i++) {
            const mm_engine_get_t *x = &g[b0 + i];
            d[i] = NULL;
            if (x->n == 0 || first != MEGAMOE_OK) continue; /* after an error: issue no more */
            ucp_request_param_t prm;
            mm_ucx_done_t *dd = mm_ucx_done_new(e, &prm);
            if (dd == NULL) {
                first = MEGAMOE_OUT_OF_MEMORY;
                continue;
            }
            megamoe_status_t st = MEGAMOE_OK;
            ucs_status_ptr_t r = NULL;
            pthread_mutex_lock(&e->lock);
            mm_ucx_peer_t *p = &e->peers[x->pe];
            if (mm_ucx_ep_locked(e, x->pe, "inter-host get", &st)) {
                if (e->proto == MM_UCX_PROTO_AM) mm_ucx_am_flush_pe(e, x->pe);
                r = ucp_get_nbx(p->ep, x->dst, x->n, p->base + x->off, p->rkey, &prm);
                e->stats.gets++;
                e->stats.get_bytes += x->n;
            }
            pthread_mutex_unlock(&e->lock);
            if (st != MEGAMOE_OK || r == NULL || UCS_PTR_IS_ERR(r)) { /* NULL: done at once */
                mm_ucx_done_release(e, dd);
                if (st == MEGAMOE_OK && r != NULL)
                    st = mm_ucx_status(UCS_PTR_STATUS(r), x->pe, "an inter-host get");
                if (first == MEGAMOE_OK) first = st;
                continue;
            }
            d[i] = dd;
        }
        for (int i = 0; i < nb; i++) { /* every issued get, also after an error */
            if (d[i] == NULL) continue;
            megamoe_status_t st = mm_ucx_wait_done(e, d[i], g[b0 + i].pe, "an inter-host get");
            if (first == MEGAMOE_OK) first = st;
        }
    }
    return first;
}

/* ---- the data path: by protocol ---- */

/* What waits for pe or came from it can never complete (lock held; pe lost or closing). */
static void mm_ucx_forget_locked(mm_ucx_engine_t *e, int pe)
{
    mm_ucx_rma_drop_queue(e, pe);
    if (e->rx) mm_ucx_am_forget(e, pe);
}

static megamoe_status_t mm_ucx_put(mm_shmem_engine_t *se, int pe, uint64_t off, const void *src,
                                   size_t n)
{
    mm_ucx_engine_t *e = &se->u;
    if (n == 0) return MEGAMOE_OK;
    if (e->proto == MM_UCX_PROTO_RMA) return mm_ucx_rma_put(e, pe, off, src, n);
    return mm_ucx_am_send(e, pe, off, src, n, 0, 0, -1);
}

static megamoe_status_t mm_ucx_atomic(mm_shmem_engine_t *se, int pe, uint64_t off,
                                      uint64_t value, int op)
{
    mm_ucx_engine_t *e = &se->u;
    if (e->proto == MM_UCX_PROTO_RMA) return mm_ucx_rma_atomic(e, pe, off, value, op);
    return mm_ucx_am_send(e, pe, 0, NULL, 0, off, value, op);
}

static megamoe_status_t mm_ucx_put_signal(mm_shmem_engine_t *se, int pe, uint64_t off,
                                          const void *src, size_t n, uint64_t sig_off,
                                          uint64_t value, int op)
{
    mm_ucx_engine_t *e = &se->u;
    if (e->proto == MM_UCX_PROTO_RMA) {
        MM_CHECK(n ? mm_ucx_rma_put(e, pe, off, src, n) : MEGAMOE_OK);
        return mm_ucx_rma_atomic(e, pe, sig_off, value, op);
    }
    return mm_ucx_am_send(e, pe, off, src, n, sig_off, value, op);
}

/* am: every message to a PE is applied there in issue order, so a fence has nothing to do. */
static megamoe_status_t mm_ucx_fence(mm_shmem_engine_t *se)
{
    mm_ucx_engine_t *e = &se->u;
    return e->proto == MM_UCX_PROTO_RMA ? mm_ucx_rma_fence(e) : MEGAMOE_OK;
}

static megamoe_status_t mm_ucx_quiet(mm_shmem_engine_t *se)
{
    mm_ucx_engine_t *e = &se->u;
    return e->proto == MM_UCX_PROTO_RMA ? mm_ucx_rma_quiet(e) : mm_ucx_am_quiet(e);
}


static int mm_ucx_progress(mm_shmem_engine_t *se)
{
    mm_ucx_engine_t *e = &se->u;
    if (pthread_mutex_trylock(&e->lock) != 0) return 0; /* somebody progresses already */
    int any = mm_ucx_progress_locked(e);
    pthread_mutex_unlock(&e->lock);
    return any;
}

/* ---- progress thread ---- */

static void *mm_ucx_thread_main(void *arg)
{
    mm_ucx_engine_t *e = arg;
    while (!atomic_load(&e->stop)) {
        pthread_mutex_lock(&e->lock);
        mm_ucx_progress_locked(e);
        ucs_status_t s = ucp_worker_arm(e->worker);
        pthread_mutex_unlock(&e->lock);
        if (s == UCS_ERR_BUSY) continue; /* more events arrived: progress again */
        struct pollfd pfd[2] = {{e->efd, POLLIN, 0}, {e->wake_fd, POLLIN, 0}};
        /* a bounded sleep: an event consumed by another thread's progress may leave the
         * worker with work the armed fd does not announce */
        if (poll(pfd, 2, 50) < 0 && errno != EINTR) break;
        if (pfd[1].revents) break;
    }
    return NULL;
}

/* ---- set-up and teardown ---- */

/* UCX's endpoint error callback (inside progress, lock held): the peer is lost, and its
 * endpoint closes now, before this progress call handles another message from it (see
 * mm_ucx_progress_locked). */
static void mm_ucx_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    mm_ucx_flush_ctx_t *c = arg;
    if (atomic_load(&mm_shmem_g.closing)) return;
    char why[160];
    snprintf(why, sizeof why, "its inter-host connection failed (UCX: %s)",
             ucs_status_string(status));
    mm_shmem_mark_lost(c->pe, why);
    mm_ucx_close_lost_start_locked(c->e);
}

/* UCX options megamoe chooses when the user did not: no shared-memory transports (same-host
 * peers are mapped by the runtime; and between simulated hosts UCX would take shared memory
 * and bypass the network), the network device of the bootstrap connection, no memory-type
 * cache hooks (host memory only), and TCP segments of 64 KiB to send and 256 KiB to receive
 * instead of UCX's 8 KiB / 64 KiB: fewer system calls per byte, which on TCP is what a put
 * costs (about 2x the GB per CPU-second, docs/shmem.md "Choosing the engine"). */
static megamoe_status_t mm_ucx_config(ucp_config_t *cfg, const char *net_device)
{
    const char *tls = "", *devs = "", *tx = "", *rx = "", *maxpoll = "", *proto = "";
    MM_CHECK(mm_env_string(MM_ENV_UCX_TLS, &tls));
    MM_CHECK(mm_env_string(MM_ENV_UCX_PROTO_ENABLE, &proto));
    MM_CHECK(mm_env_string(MM_ENV_UCX_NET_DEVICES, &devs));
    MM_CHECK(mm_env_string(MM_ENV_UCX_TCP_TX_SEG_SIZE, &tx));
    MM_CHECK(mm_env_string(MM_ENV_UCX_TCP_RX_SEG_SIZE, &rx));
    MM_CHECK(mm_env_string(MM_ENV_UCX_TCP_MAX_POLL, &maxpoll));
    if (*tls == '\0' && ucp_config_modify(cfg, "TLS", "^sm") != UCS_OK)
        return mm_error(MEGAMOE_INTERNAL, "UCX refused the transport selection");
    if (*devs == '\0' && net_device && *net_device &&
        ucp_config_modify(cfg, "NET_DEVICES", net_device) != UCS_OK)
        return mm_error(MEGAMOE_INTERNAL, "UCX refused the network device %s", net_device);
    /* UCX 1.13 hands these to each transport's configuration under the transport's own field
     * name ("TX_SEG_SIZE"), newer UCX (1.18 checked; 1.15 assumed) under the prefixed name
     * ("TCP_TX_SEG_SIZE"); the other spelling is reported as an invalid configuration. Only TCP
     * has them. On TCP a put is an active message, sent in TX_SEG_SIZE fragments. */
    unsigned major = 0, minor = 0, release = 0;
    ucp_get_version(&major, &minor, &release);
    const char *pre = major > 1 || minor >= 15 ? "TCP_" : "";
    char key[32];
    snprintf(key, sizeof key, "%sTX_SEG_SIZE", pre);
    if (*tx == '\0') ucp_config_modify(cfg, key, "64k");
    snprintf(key, sizeof key, "%sRX_SEG_SIZE", pre);
    if (*rx == '\0') ucp_config_modify(cfg, key, "256k");
    /* One socket event per epoll_wait: UCX 1.13's TCP progress takes up to MAX_POLL (16)
     * events at once, and when the first (a peer's connection reset) fails the UCP endpoint,
     * the endpoint's other connections close while their events are still in the batch: the
     * next one hits an assertion (tcp_iface.c, "conn_state != CLOSED") and aborts the process.
     * A survivor of a killed host died that way in 1 of ~12 fault runs under load. Each event
     * is then handled before the next wait; progress loops call again for the rest. */
    snprintf(key, sizeof key, "%sMAX_POLL", pre);
    if (*maxpoll == '\0') ucp_config_modify(cfg, key, "1");
    ucp_config_modify(cfg, "MEMTYPE_CACHE", "n"); /* absent in some versions: best effort */
    /* UCX's protocol selection v2 (the default from 1.16) has no software-emulated fetching
     * atomics over TCP ("cannot find remote protocol for ... amo_fetch"), which the engine's
     * signals need; the v1 protocols have them. A user's UCX_PROTO_ENABLE wins. */
    if (*proto == '\0') ucp_config_modify(cfg, "PROTO_ENABLE", "n");
    return MEGAMOE_OK;
}

static void mm_ucx_fini(mm_shmem_engine_t *se);

static megamoe_status_t mm_ucx_init(const mm_engine_init_t *in, mm_shmem_engine_t **e_p)
{
    mm_shmem_engine_t *se = calloc(1, sizeof *se);
    if (se == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "inter-host engine: out of memory");
    mm_ucx_engine_t *e = &se->u;
    /* recursive: completion and error callbacks run inside progress, under the lock, and
     * post (chained signals; a loss pushed to every peer) */
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&e->lock, &ma);
    pthread_mutexattr_destroy(&ma);
    e->my_pe = in->my_pe;
    e->n_pes = in->n_pes;
    e->seg_base = in->seg_base;
    e->seg_size = in->seg_size;
    e->efd = e->wake_fd = -1;
    e->peers = calloc((size_t)in->n_pes, sizeof *e->peers);
    e->recs = calloc(MM_UCX_RING_RECS, sizeof *e->recs);
    e->atomics = calloc(MM_UCX_ATOMIC_RECS, sizeof *e->atomics);
    e->flush_ctxs = calloc((size_t)in->n_pes, sizeof *e->flush_ctxs);
    e->close_reqs = calloc((size_t)in->n_pes, sizeof *e->close_reqs);
    e->dones = calloc(MM_UCX_DONE_RECS, sizeof *e->dones);
    e->ring = mmap(NULL, MM_UCX_RING_BYTES, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (e->ring == MAP_FAILED) e->ring = NULL;
    if (!e->peers || !e->recs || !e->atomics || !e->flush_ctxs || !e->close_reqs || !e->dones ||
        !e->ring) {
        mm_ucx_fini(se);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "inter-host engine: out of memory for %d PEs",
                        in->n_pes);
    }
    for (unsigned i = 0; i < MM_UCX_ATOMIC_RECS; i++) {
        e->atomics[i].next = e->free_atomics;
        e->free_atomics = &e->atomics[i];
    }
    for (int pe = 0; pe < in->n_pes; pe++) e->flush_ctxs[pe] = (mm_ucx_flush_ctx_t){e, pe};
    for (unsigned i = 0; i < MM_UCX_DONE_RECS; i++) {
        e->dones[i].pooled = 1;
        mm_ucx_done_release_locked(e, &e->dones[i]);
    }

    int proto = MM_UCX_PROTO_AM; /* index in "am|rma" */
    megamoe_status_t pst = mm_env_enum(MM_ENV_SHMEM_ENGINE_PROTOCOL, &proto);
    if (pst != MEGAMOE_OK) {
        mm_ucx_fini(se);
        return pst;
    }
    e->proto = proto;
    ucp_config_t *cfg = NULL;
    ucs_status_t s = ucp_config_read(NULL, NULL, &cfg);
    megamoe_status_t st = s == UCS_OK ? MEGAMOE_OK
                                      : mm_error(MEGAMOE_INTERNAL, "UCX: cannot read its "
                                                 "configuration: %s", ucs_status_string(s));
    if (st == MEGAMOE_OK) st = mm_ucx_config(cfg, in->net_device);
    if (st == MEGAMOE_OK) {
        ucp_params_t prm;
        memset(&prm, 0, sizeof prm);
        prm.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
        prm.features = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
        prm.name = "megamoe";
        s = ucp_init(&prm, cfg, &e->ctx);
        if (s != UCS_OK)
            st = mm_error(MEGAMOE_UNSUPPORTED, "UCX found no usable transport for one-sided "
                          "operations between hosts (%s); check UCX_TLS / UCX_NET_DEVICES "
                          "and `ucx_info -d`", ucs_status_string(s));
    }
    if (cfg) ucp_config_release(cfg);
    if (st == MEGAMOE_OK) {
        ucp_worker_params_t wp;
        memset(&wp, 0, sizeof wp);
        wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
        s = ucp_worker_create(e->ctx, &wp, &e->worker);
        if (s != UCS_OK)
            st = mm_error(MEGAMOE_INTERNAL, "UCX: cannot create a worker: %s",
                          ucs_status_string(s));
    }
    if (st == MEGAMOE_OK) {
        ucp_mem_map_params_t mp;
        memset(&mp, 0, sizeof mp);
        mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
        mp.address = in->seg_base;
        mp.length = in->seg_size;
        s = ucp_mem_map(e->ctx, &mp, &e->memh);
        if (s == UCS_OK) s = ucp_rkey_pack(e->ctx, e->memh, &e->rkey_buf, &e->rkey_len);
        if (s == UCS_OK) s = ucp_worker_get_address(e->worker, &e->addr, &e->addr_len);
        if (s == UCS_OK) s = ucp_worker_get_efd(e->worker, &e->efd);
        if (s != UCS_OK)
            st = mm_error(MEGAMOE_OUT_OF_MEMORY, "UCX: cannot register the %llu-byte heap "
                          "segment for remote access: %s; lower HYPER_PARALLEL_SHMEM_HEAP_SIZE",
                          (unsigned long long)in->seg_size, ucs_status_string(s));
        else if (e->addr_len + e->rkey_len + MM_UCX_BLOB_HDR > MM_ENGINE_BLOB_MAX)
            st = mm_error(MEGAMOE_UNSUPPORTED, "UCX: the worker address (%zu bytes) and remote "
                          "key (%zu bytes) do not fit the %d-byte bootstrap record; restrict "
                          "UCX_NET_DEVICES / UCX_TLS", e->addr_len, e->rkey_len,
                          MM_ENGINE_BLOB_MAX);
    }
    if (st == MEGAMOE_OK) st = mm_ucx_am_setup(e);
    if (st == MEGAMOE_OK) {
        e->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (e->wake_fd < 0)
            st = mm_error(MEGAMOE_IO, "inter-host engine: eventfd: %s", strerror(errno));
    }
    if (st == MEGAMOE_OK) {
        const char *tls = "", *tx = "", *rx = "";
        mm_env_string(MM_ENV_UCX_TLS, &tls);
        mm_env_string(MM_ENV_UCX_TCP_TX_SEG_SIZE, &tx);
        mm_env_string(MM_ENV_UCX_TCP_RX_SEG_SIZE, &rx);
        snprintf(e->desc, sizeof e->desc, "UCX %s (transports %s, device %s, TCP segments %s/%s, "
                 "protocol %s)", ucp_get_version_string(), *tls ? tls : "not shared memory",
                 in->net_device && *in->net_device ? in->net_device : "any", *tx ? tx : "64k",
                 *rx ? rx : "256k", mm_ucx_proto_names[e->proto]);
    }
    if (st != MEGAMOE_OK) {
        mm_ucx_fini(se);
        return st;
    }
    *e_p = se;
    return MEGAMOE_OK;
}

static megamoe_status_t mm_ucx_publish(mm_shmem_engine_t *se, void *blob, size_t *len_p)
{
    mm_ucx_engine_t *e = &se->u;
    uint8_t *p = blob;
    mm_put_u64(p, (uint64_t)(uintptr_t)e->seg_base);
    mm_put_u64(p + 8, e->seg_size);
    mm_put_u32(p + 16, (uint32_t)e->addr_len);
    mm_put_u32(p + 20, (uint32_t)e->rkey_len);
    mm_put_u32(p + 24, (uint32_t)e->proto);
    memcpy(p + MM_UCX_BLOB_HDR, e->addr, e->addr_len);
    memcpy(p + MM_UCX_BLOB_HDR + e->addr_len, e->rkey_buf, e->rkey_len);
    *len_p = MM_UCX_BLOB_HDR + e->addr_len + e->rkey_len;
    return MEGAMOE_OK;
}

static megamoe_status_t mm_ucx_startup(mm_shmem_engine_t *se, const uint8_t *blobs,
                                       size_t stride, const uint32_t *lens,
                                       const unsigned char *remote)
{
    mm_ucx_engine_t *e = &se->u;
    megamoe_status_t st = MEGAMOE_OK;
    for (int pe = 0; pe < e->n_pes && st == MEGAMOE_OK; pe++) {
        if (!remote[pe]) continue;
        const uint8_t *b = blobs + (size_t)pe * stride;
        uint32_t al = mm_get_u32(b + 16), rl = mm_get_u32(b + 20);
        if (lens[pe] < MM_UCX_BLOB_HDR || (uint64_t)al + rl + MM_UCX_BLOB_HDR > lens[pe] ||
            mm_get_u64(b + 8) != e->seg_size) {
            st = mm_error(MEGAMOE_CONFIG_MISMATCH, "rank %d published an engine record of "
                          "unexpected shape (different megamoe builds?)", pe);
            break;
        }
        uint32_t proto = mm_get_u32(b + 24);
        if (proto != (uint32_t)e->proto) {
            st = mm_error(MEGAMOE_CONFIG_MISMATCH, "settings differ between ranks: rank %d has "
                          "MEGAMOE_SHMEM_ENGINE_PROTOCOL=%s, rank %d has %s; set the same value "
                          "on every rank", pe, proto < 2 ? mm_ucx_proto_names[proto] : "?",
                          e->my_pe, mm_ucx_proto_names[e->proto]);
            break;
        }
        mm_ucx_peer_t *p = &e->peers[pe];
        p->base = mm_get_u64(b);
        ucp_ep_params_t ep;
        memset(&ep, 0, sizeof ep);
        ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.address = (const ucp_address_t *)(b + MM_UCX_BLOB_HDR);
        ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        ep.err_handler.cb = mm_ucx_err_cb;
        ep.err_handler.arg = &e->flush_ctxs[pe];
        pthread_mutex_lock(&e->lock);
        ucs_status_t s = ucp_ep_create(e->worker, &ep, &p->ep);
        if (s == UCS_OK) s = ucp_ep_rkey_unpack(p->ep, b + MM_UCX_BLOB_HDR + al, &p->rkey);
        pthread_mutex_unlock(&e->lock);
        if (s != UCS_OK)
            st = mm_error(MEGAMOE_PEER_LOST, "UCX cannot reach rank %d on its host: %s; check "
                          "that the hosts can reach each other on the network of "
                          "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT (UCX_NET_DEVICES)", pe,
                          ucs_status_string(s));
    }
    if (st == MEGAMOE_OK) {
        if (pthread_create(&e->thread, NULL, mm_ucx_thread_main, e) != 0)
            return mm_error(MEGAMOE_IO, "inter-host engine: cannot start the progress thread");
        e->thread_started = 1;
    }
    /* Wire up now (connections are made lazily): a flush per peer completes only once the
     * connection exists, so the first real operation does not pay for it. */
    for (int pe = 0; pe < e->n_pes && st == MEGAMOE_OK; pe++) {
        if (!remote[pe]) continue;
        ucp_request_param_t prm;
        mm_ucx_done_t *d = mm_ucx_done_new(e, &prm);
        if (d == NULL) return MEGAMOE_OUT_OF_MEMORY;
        uint64_t probe = 0;
        pthread_mutex_lock(&e->lock);
        ucs_status_ptr_t r = ucp_get_nbx(e->peers[pe].ep, &probe, sizeof probe,
                                         e->peers[pe].base, e->peers[pe].rkey, &prm);
        pthread_mutex_unlock(&e->lock);
        if (r == NULL || UCS_PTR_IS_ERR(r)) {
            mm_ucx_done_release(e, d);
            if (r != NULL) st = mm_ucx_status(UCS_PTR_STATUS(r), pe, "the engine wire-up");
        } else {
            st = mm_ucx_wait_done(e, d, pe, "the engine wire-up");
        }
        if (st == MEGAMOE_OK && probe != MM_SHMEM_HEADER_MAGIC)
            st = mm_error(MEGAMOE_INTERNAL, "the engine wire-up read 0x%llx from rank %d's "
                          "heap header instead of its magic", (unsigned long long)probe, pe);
    }
    return st;
}

static void mm_ucx_fini(mm_shmem_engine_t *se)
{
    if (se == NULL) return;
    mm_ucx_engine_t *e = &se->u;
    if (e->thread_started) {
        atomic_store(&e->stop, 1);
        uint64_t one = 1;
        if (write(e->wake_fd, &one, sizeof one) < 0) { /* join still ends it (bounded poll) */
        }
        pthread_join(e->thread, NULL);
        e->thread_started = 0;
    }
    if (e->worker) {
        /* under the lock as everywhere: the callbacks of the requests still open (abandoned
         * waits included) run inside these closes */
        pthread_mutex_lock(&e->lock);
        if (e->closes_open) mm_ucx_close_lost_finish_locked(e);
        for (int pe = 0; e->peers && pe < e->n_pes; pe++) mm_ucx_close_ep_locked(e, pe);
        if (e->addr) ucp_worker_release_address(e->worker, e->addr);
        e->addr = NULL;
        ucp_worker_destroy(e->worker);
        e->worker = NULL;
        pthread_mutex_unlock(&e->lock);
    }
    if (e->rkey_buf) ucp_rkey_buffer_release(e->rkey_buf);
    if (e->memh) ucp_mem_unmap(e->ctx, e->memh);
    if (e->ctx) ucp_cleanup(e->ctx);
    if (e->wake_fd >= 0) close(e->wake_fd);
    if (e->ring) munmap(e->ring, MM_UCX_RING_BYTES);
    free(e->peers);
    free(e->recs);
    free(e->atomics);
    free(e->flush_ctxs);
    free(e->close_reqs);
    free(e->dones); /* after the worker: the last abandoned records came back in its closes */
    mm_ucx_am_fini(e);
    pthread_mutex_destroy(&e->lock);
    free(se);
}

static void mm_ucx_stats(mm_shmem_engine_t *se, mm_shmem_engine_stats_t *out)
{
    mm_ucx_engine_t *e = &se->u;
    pthread_mutex_lock(&e->lock);
    *out = e->stats;
    pthread_mutex_unlock(&e->lock);
}

static uint64_t mm_ucx_heard(mm_shmem_engine_t *se, int pe)
{
    mm_ucx_engine_t *e = &se->u;
    if (e->heard == NULL || pe < 0 || pe >= e->n_pes) return 0;
    return atomic_load_explicit(&e->heard[pe], memory_order_relaxed);
}

static void mm_ucx_describe(mm_shmem_engine_t *se, char *buf, size_t len)
{
    snprintf(buf, len, "%s", se ? se->u.desc : "none");
}

const mm_shmem_engine_ops_t mm_shmem_engine_ucx = {
    .name = "ucx",
    .init = mm_ucx_init,
    .publish = mm_ucx_publish,
    .startup = mm_ucx_startup,
    .put = mm_ucx_put,
    .get = mm_ucx_get,
    .get_many = mm_ucx_get_many,
    .atomic = mm_ucx_atomic,
    .put_signal = mm_ucx_put_signal,
    .fence = mm_ucx_fence,
    .quiet = mm_ucx_quiet,
    .progress = mm_ucx_progress,
    .fini = mm_ucx_fini,
    .stats = mm_ucx_stats,
    .heard = mm_ucx_heard,
    .describe = mm_ucx_describe,
};