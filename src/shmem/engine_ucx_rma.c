/* The inter-host engine's "rma" protocol (MEGAMOE_SHMEM_ENGINE_PROTOCOL=rma): puts are UCP
 * puts, signals UCP atomics. UCP orders neither (its fence does not order operations on
 * different lanes: TCP puts may stripe over several), so an atomic to a PE with puts not yet
 * known complete waits in a per-PE FIFO behind an endpoint flush and is posted from the
 * flush's completion, in issue order; atomics to a PE without outstanding puts are posted at
 * once. A signal after data therefore costs a round trip more than the data (a flush) plus an
 * acknowledgement per put on TCP (UCP's software RMA): the "am" protocol (engine_ucx_am.c)
 * avoids both. This one stays for networks where UCP puts are RDMA writes that need no
 * progress at the target. quiet: drain the chained atomics, then flush the worker. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "engine_ucx.h"

/* ---- atomics (lock held) ---- */

static void mm_ucx_atomic_done_cb(void *request, ucs_status_t status, void *user_data)
{
    mm_ucx_atomic_t *a = user_data;
    (void)status;
    a->next = a->e->free_atomics;
    a->e->free_atomics = a;
    ucp_request_free(request);
}

static megamoe_status_t mm_ucx_atomic_post(mm_ucx_engine_t *e, mm_ucx_atomic_t *a)
{
    mm_ucx_peer_t *p = &e->peers[a->pe];
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_DATATYPE;
    prm.cb.send = mm_ucx_atomic_done_cb;
    prm.user_data = a;
    prm.datatype = ucp_dt_make_contig(8);
    ucp_atomic_op_t op = UCP_ATOMIC_OP_ADD;
    if (a->op != MM_ENGINE_ADD) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_REPLY_BUFFER;
        prm.reply_buffer = &a->reply;
        op = a->op == MM_ENGINE_SET ? UCP_ATOMIC_OP_SWAP : UCP_ATOMIC_OP_CSWAP;
        if (a->op == MM_ENGINE_CAS0) { /* CSWAP: compare with buffer, swap in the reply's value */
            a->reply = a->operand;
            a->operand = 0;
        }
    }
    ucs_status_ptr_t r = ucp_atomic_op_nbx(p->ep, op, &a->operand, 1, p->base + a->off, p->rkey,
                                           &prm);
    if (r == NULL) {
        a->next = e->free_atomics;
        e->free_atomics = a;
        return MEGAMOE_OK;
    }
    if (UCS_PTR_IS_ERR(r)) {
        a->next = e->free_atomics;
        e->free_atomics = a;
        return mm_ucx_status(UCS_PTR_STATUS(r), a->pe, "an inter-host signal");
    }
    return MEGAMOE_OK;
}

static void mm_ucx_flush_start(mm_ucx_engine_t *e, int pe);

/* The queued atomics to pe can never be ordered (its flush failed, or its endpoint is closed):
 * drop them (the peer is lost or the engine is going away). */
void mm_ucx_rma_drop_queue(mm_ucx_engine_t *e, int pe)
{
    mm_ucx_peer_t *p = &e->peers[pe];
    while (p->q_head) {
        mm_ucx_atomic_t *a = p->q_head;
        p->q_head = a->next;
        a->next = e->free_atomics;
        e->free_atomics = a;
        e->queued_atomics--;
    }
    p->q_tail = NULL;
    p->flush_inflight = 0;
}

/* The flush covering flush_gen completed: post the queued atomics it covers, in order. */
static void mm_ucx_flush_complete(mm_ucx_engine_t *e, int pe)
{
    mm_ucx_peer_t *p = &e->peers[pe];
    if (p->ep == NULL) {
        /* fini closed the endpoint and ucp_worker_destroy is completing the flushes still
         * pending: posting to the closed endpoint would crash */
        mm_ucx_rma_drop_queue(e, pe);
        return;
    }
    if (p->flush_gen > p->done_gen) p->done_gen = p->flush_gen;
    p->flush_inflight = 0;
    while (p->q_head && p->q_head->gen <= p->done_gen) {
        mm_ucx_atomic_t *a = p->q_head;
        p->q_head = a->next;
        if (p->q_head == NULL) p->q_tail = NULL;
        e->queued_atomics--;
        mm_ucx_atomic_post(e, a); /* an error marks the peer lost; waiters see it */
    }
    if (p->q_head) mm_ucx_flush_start(e, pe);
}



static void mm_ucx_flush_cb(void *request, ucs_status_t status, void *user_data)
{
    mm_ucx_flush_ctx_t *c = user_data;
    ucp_request_free(request);
    if (status != UCS_OK) {
        /* cancelled by our own close (teardown, or a wait that gave up and reported it):
         * nothing to report, and an error here would replace the caller's last error */
        if (!c->e->peers[c->pe].given_up && !atomic_load(&mm_shmem_g.closing))
            mm_ucx_status(status, c->pe, "an inter-host flush");
        mm_ucx_rma_drop_queue(c->e, c->pe); /* the queued atomics can never be ordered */
        return;
    }
    mm_ucx_flush_complete(c->e, c->pe);
}

static void mm_ucx_flush_start(mm_ucx_engine_t *e, int pe)
{
    mm_ucx_peer_t *p = &e->peers[pe];
    p->flush_inflight = 1;
    p->flush_gen = p->put_gen;
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.send = mm_ucx_flush_cb;
    prm.user_data = &e->flush_ctxs[pe];
    ucs_status_ptr_t r = ucp_ep_flush_nbx(p->ep, &prm);
    if (r == NULL) {
        mm_ucx_flush_complete(e, pe);
    } else if (UCS_PTR_IS_ERR(r)) {
        p->flush_inflight = 0;
        mm_ucx_status(UCS_PTR_STATUS(r), pe, "an inter-host flush");
    }
}

static megamoe_status_t mm_ucx_atomic_get(mm_ucx_engine_t *e, int pe, mm_ucx_atomic_t **a_p)
{
    uint64_t start_ns = 0;
    while (e->free_atomics == NULL) {
        if (start_ns == 0) start_ns = mm_now_ns();
        mm_ucx_progress_locked(e);
        MM_CHECK(mm_shmem_check_peers("an inter-host signal"));
        if (mm_now_ns() - start_ns > mm_shmem_timeout_ns())
            return mm_error(MEGAMOE_TIMEOUT, "inter-host signal to rank %d: %u signals in "
                            "flight did not complete within HYPER_PARALLEL_SHMEM_TIMEOUT_SEC",
                            pe, MM_UCX_ATOMIC_RECS);
    }
    mm_ucx_atomic_t *a = e->free_atomics;
    e->free_atomics = a->next;
    a->next = NULL;
    *a_p = a;
    return MEGAMOE_OK;
}

/* ---- the engine operations ---- */

static megamoe_status_t mm_ucx_fence_wait(mm_ucx_engine_t *e, int pe);

megamoe_status_t mm_ucx_rma_atomic(mm_ucx_engine_t *e, int pe, uint64_t off, uint64_t value,
                                   int op)
{
    mm_ucx_peer_t *p = &e->peers[pe];
    megamoe_status_t st = MEGAMOE_OK;
    pthread_mutex_lock(&e->lock);
    mm_ucx_atomic_t *a = NULL;
    st = mm_ucx_atomic_get(e, pe, &a);
    if (st == MEGAMOE_OK && mm_ucx_ep_locked(e, pe, "inter-host signal", &st) == NULL) {
        a->next = e->free_atomics;
        e->free_atomics = a;
    }
    if (st != MEGAMOE_OK) {
        pthread_mutex_unlock(&e->lock);
        return st;
    }
    a->operand = value;
    a->off = off;
    a->pe = pe;
    a->op = op & ~MM_ENGINE_NO_QUIET; /* every signal here waits in quiet's worker flush */
    a->e = e;
    a->gen = p->put_gen;
    e->stats.messages++;
    e->stats.signals++;
    if (p->q_head == NULL && p->done_gen >= p->put_gen) {
        st = mm_ucx_atomic_post(e, a);
    } else {
        if (p->q_tail) p->q_tail->next = a;
        else p->q_head = a;
        p->q_tail = a;
        e->queued_atomics++;
        if (!p->flush_inflight) mm_ucx_flush_start(e, pe);
    }
    pthread_mutex_unlock(&e->lock);
    return st;
}

megamoe_status_t mm_ucx_rma_put(mm_ucx_engine_t *e, int pe, uint64_t off, const void *src,
                                size_t n)
{
    mm_ucx_peer_t *p = &e->peers[pe];
    if (n == 0) return MEGAMOE_OK;
    MM_CHECK(mm_ucx_fence_wait(e, pe));
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    megamoe_status_t st = MEGAMOE_OK;
    if (n <= MM_UCX_STAGE_MAX) {
        pthread_mutex_lock(&e->lock);
        mm_ucx_ring_rec_t *rec = NULL;
        char *stage = NULL;
        megamoe_status_t rs = mm_ucx_ring_alloc(e, n, pe, &stage, &rec);
        if (rs == MEGAMOE_OK && mm_ucx_ep_locked(e, pe, "inter-host put", &rs) == NULL)
            rec->done = 1; /* the reserved bytes go back with the record */
        if (rs != MEGAMOE_OK) {
            pthread_mutex_unlock(&e->lock);
            return rs;
        }
        memcpy(stage, src, n);
        prm.cb.send = mm_ucx_put_done_cb;
        prm.user_data = rec;
        ucs_status_ptr_t r = ucp_put_nbx(p->ep, stage, n, p->base + off, p->rkey, &prm);
        p->put_gen++;
        e->stats.messages++;
        e->stats.put_bytes += n;
        if (r == NULL) rec->done = 1;
        else if (UCS_PTR_IS_ERR(r)) {
            rec->done = 1;
            st = mm_ucx_status(UCS_PTR_STATUS(r), pe, "an inter-host put");
        }
        pthread_mutex_unlock(&e->lock);
        return st;
    }
    mm_ucx_done_t *d = mm_ucx_done_new(e, &prm);
    if (d == NULL) return MEGAMOE_OUT_OF_MEMORY;
    pthread_mutex_lock(&e->lock);
    ucs_status_ptr_t r = NULL;
    if (mm_ucx_ep_locked(e, pe, "inter-host put", &st)) {
        r = ucp_put_nbx(p->ep, src, n, p->base + off, p->rkey, &prm);
        p->put_gen++;
        e->stats.messages++;
        e->stats.put_bytes += n;
    }
    pthread_mutex_unlock(&e->lock);
    if (st != MEGAMOE_OK || r == NULL || UCS_PTR_IS_ERR(r)) {
        mm_ucx_done_release(e, d);
        if (st == MEGAMOE_OK && r != NULL)
            st = mm_ucx_status(UCS_PTR_STATUS(r), pe, "an inter-host put");
        return st;
    }
    return mm_ucx_wait_done(e, d, pe, "an inter-host put");
}


megamoe_status_t mm_ucx_rma_quiet(mm_ucx_engine_t *e)
{
    /* 1. chained signals posted (their flushes complete through progress) */
    uint64_t start = mm_now_ns();
    for (;;) {
        pthread_mutex_lock(&e->lock);
        mm_ucx_progress_locked(e);
        int left = e->queued_atomics;
        pthread_mutex_unlock(&e->lock);
        if (left == 0) break;
        MM_CHECK(mm_shmem_check_peers("an inter-host quiet"));
        if (mm_now_ns() - start > mm_shmem_timeout_ns())
            return mm_error(MEGAMOE_TIMEOUT, "inter-host quiet: %d signals still wait for "
                            "their data after HYPER_PARALLEL_SHMEM_TIMEOUT_SEC", left);
        sched_yield();
    }
    /* 2. everything issued is complete at its target */
    ucp_request_param_t prm;
    mm_ucx_done_t *d = mm_ucx_done_new(e, &prm);
    if (d == NULL) return MEGAMOE_OUT_OF_MEMORY;
    pthread_mutex_lock(&e->lock);
    /* put_gen of every peer now: complete once the flush is (on the stack up to 256 PEs, so
     * a quiet allocates nothing in the usual jobs) */
    uint64_t gens_here[256], *gens = gens_here;
    ucs_status_ptr_t r = ucp_worker_flush_nbx(e->worker, &prm);
    e->stats.quiet_waits++;
    int n = e->n_pes;
    if (n > 256) gens = malloc(sizeof *gens * (size_t)n);
    for (int pe = 0; gens && pe < n; pe++) gens[pe] = e->peers[pe].put_gen;
    pthread_mutex_unlock(&e->lock);
    megamoe_status_t st = MEGAMOE_OK;
    if (r == NULL || UCS_PTR_IS_ERR(r)) {
        mm_ucx_done_release(e, d);
        if (r != NULL) st = mm_ucx_status(UCS_PTR_STATUS(r), -1, "an inter-host quiet");
    } else {
        st = mm_ucx_wait_done(e, d, -1, "an inter-host quiet");
    }
    if (st == MEGAMOE_OK && gens) {
        pthread_mutex_lock(&e->lock);
        for (int pe = 0; pe < n; pe++)
            if (gens[pe] > e->peers[pe].done_gen) e->peers[pe].done_gen = gens[pe];
        pthread_mutex_unlock(&e->lock);
    }
    if (gens != gens_here) free(gens);
    return st;
}

/* UCP's fence does not order operations on different lanes; completion does. Signals are
 * ordered after the puts they cover anyway, so the fence is lazy: it records each PE's puts,
 * and a later put to that PE first waits until they are complete. */
megamoe_status_t mm_ucx_rma_fence(mm_ucx_engine_t *e)
{
    pthread_mutex_lock(&e->lock);
    for (int pe = 0; pe < e->n_pes; pe++) e->peers[pe].fence_gen = e->peers[pe].put_gen;
    pthread_mutex_unlock(&e->lock);
    return MEGAMOE_OK;
}

/* Before a put to pe: the puts before a fence must be complete (lock NOT held). */
static megamoe_status_t mm_ucx_fence_wait(mm_ucx_engine_t *e, int pe)
{
    mm_ucx_peer_t *p = &e->peers[pe];
    pthread_mutex_lock(&e->lock);
    int need = p->fence_gen > p->done_gen;
    if (need && !p->flush_inflight && p->ep) mm_ucx_flush_start(e, pe);
    pthread_mutex_unlock(&e->lock);
    if (!need) return MEGAMOE_OK;
    uint64_t start = mm_now_ns();
    for (;;) {
        pthread_mutex_lock(&e->lock);
        mm_ucx_progress_locked(e);
        int left = p->fence_gen > p->done_gen;
        megamoe_status_t cs = MEGAMOE_OK;
        if (left && mm_ucx_ep_locked(e, pe, "an inter-host fence", &cs) == NULL) {
            pthread_mutex_unlock(&e->lock);
            return cs;
        }
        if (left && !p->flush_inflight) mm_ucx_flush_start(e, pe);
        pthread_mutex_unlock(&e->lock);
        if (!left) return MEGAMOE_OK;
        MM_CHECK(mm_shmem_check_peers("an inter-host fence"));
        if (mm_now_ns() - start > mm_shmem_timeout_ns())
            return mm_error(MEGAMOE_TIMEOUT, "inter-host fence: the puts to rank %d before it "
                            "did not complete within HYPER_PARALLEL_SHMEM_TIMEOUT_SEC", pe);
        sched_yield();
    }
}
