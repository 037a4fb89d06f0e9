/* The inter-host engine's "am" protocol (the default; MEGAMOE_SHMEM_ENGINE_PROTOCOL=am): every
 * put, signal and put-with-signal to a peer is one UCP active message, applied by the target in
 * the order this PE issued them.
 *
 * Why. UCP orders none of its operations on an endpoint: its design notes say RMA, atomics and
 * active messages are unordered unless fenced, and UCX 1.13's fence orders only within one
 * transport lane (weak fence), so ordering a signal after its data takes a flush, a round trip.
 * On TCP, UCP's puts and atomics are themselves active messages (software RMA,
 * ucp/rma/rma_sw.c and amo_sw.c on the endpoint's AM lane) that the target acknowledges one by
 * one. A put-with-signal therefore cost a put, its acknowledgement, a flush and the atomic (a
 * fetching swap with a reply for SET). Here it is one message, and a signal after many row puts
 * is one more message, applied after them because the target applies every message in the
 * source's order. The ordering is made by the target, not assumed from UCX (which does deliver
 * in order on one lane; the target still handles any order).
 *
 * Target side, per source PE: `next` is the lowest sequence number not yet applied. A message
 * with seq == next is applied at once (data copied into the heap, then the signal: a release
 * store, add or compare-and-swap) and the held messages that follow it in turn; a message that
 * arrives early is held, its data copied, until its turn. Messages of 1 MiB and more come by
 * rendezvous (the sender waits for them): received straight into the heap when it is their
 * turn, else into a held buffer. Messages from a PE known lost are dropped.
 *
 * Acknowledgements exist only for quiet: it sends an acknowledgement request (a message like
 * any other, so it is answered once everything before it is applied) to every PE with messages
 * not known applied, and waits for the answers: one round trip, in parallel for all PEs. Puts
 * and signals never wait for the target. The runtime's own synchronisation words (barrier
 * lines: MM_ENGINE_NO_QUIET) need no acknowledgement, their waiters see them arrive, so a
 * barrier after nothing but barriers costs no quiet round trip.
 */
#include <stdlib.h>
#include <string.h>

#include "base/arch.h"
#include "base/env.h"
#include "engine_test.h"
#include "engine_ucx.h"

enum { MM_AM_ID_MSG = 1, MM_AM_ID_ACK = 2 };
/* MULTI: the data is several pieces: the payload is their bytes back to back, then a table
 * of (offset, length) pairs (u64 each), one per piece; `off` holds the number of pieces. */
enum { MM_AM_F_DATA = 1, MM_AM_F_SIG = 2, MM_AM_F_ACKREQ = 4, MM_AM_F_MULTI = 8 };

/* The user header of a message (the data, if any, is the message's payload). */
typedef struct mm_am_hdr {
    uint64_t seq;     /* this source's message number to the target, from 1 */
    uint64_t off;     /* data: offset in the target's segment */
    uint64_t sig_off; /* signal word: offset in the target's segment */
    uint64_t sig_val;
    int32_t src;      /* the sending PE */
    uint16_t flags;   /* MM_AM_F_* */
    uint16_t sig_op;  /* MM_ENGINE_SET / ADD / CAS0 */
} mm_am_hdr_t;
_Static_assert(sizeof(mm_am_hdr_t) <= sizeof(((mm_ucx_done_t *)0)->hdr), "header slot");

/* The staging ring keeps a message's header in front of its data (one 64-byte line). */
#define MM_AM_HDR_SLOT 64u

typedef struct mm_am_ack {
    uint64_t seq; /* every message of the acknowledged PE up to seq is applied here */
    int32_t src;  /* the PE acknowledging */
    int32_t pad;
} mm_am_ack_t;

typedef struct mm_am_held {
    mm_am_hdr_t h;
    char *buf;   /* the data (malloc'd), NULL when none */
    size_t len;
    int ready;   /* the data is here (a rendezvous receive completes later) */
    struct mm_am_held *next; /* by seq */
} mm_am_held_t;

struct mm_am_rx {
    uint64_t next;   /* lowest sequence number not applied yet */
    uint64_t gen;    /* bumped when the source is forgotten (its receives in flight are void) */
    int busy;        /* message `next` is a rendezvous receive into the heap, in flight */
    mm_am_hdr_t busy_h;
    mm_am_held_t *held;
    /* the acknowledgement to this source: one in flight, a later one waits for it */
    mm_am_ack_t ack;
    int ack_inflight;
    uint64_t ack_pending; /* 0: none */
};

typedef struct mm_am_recv_ctx {
    mm_ucx_engine_t *e;
    int src;
    uint64_t gen;
    mm_am_held_t *held; /* NULL: straight into the heap (the source's busy message) */
} mm_am_recv_ctx_t;

/* ---- coalescing small puts ("corks", lock held) ----
 *
 * A put below MM_AM_CORK_MAX bytes is not sent at once: it is copied into this thread's cork,
 * a ring reservation of one message (e->am_msg_max) for one PE, and later puts by the same
 * thread to that
 * PE join it as further pieces (anywhere in the segment: a piece that continues the last one
 * extends it). A row-by-row dispatch (1-4 KiB rows, with their metadata) then leaves in
 * messages of up to 256 KiB instead of one message per row, and the signal that follows rides
 * in the same message. The target applies the pieces in order, so a later piece over an
 * earlier one wins as if they had been sent one by one. Data nobody has signalled cannot be
 * observed, so holding it costs nothing; everything that can make it observable sends the
 * corks first: a signal to the PE (every thread's cork to it, then the signal, in the own
 * cork when it is to the same PE), a get from it, a quiet (all corks). Another put by the
 * same thread to the same PE that cannot join sends the cork first (the thread's order stays
 * its issue order); threads' corks are independent (puts of different threads are not
 * ordered, OpenSHMEM's rule, but every signal is ordered after all of them). */
#define MM_AM_CORK_MAX (64u << 10)
#define MM_AM_CORK_SEGS 256 /* pieces per message (adjacent ones merge) */
#define MM_AM_CORKS 256 /* threads that cork; later ones send at once */

typedef struct mm_am_cork {
    int pe;     /* -1: empty */
    size_t len; /* data bytes so far (at stage + MM_AM_HDR_SLOT) */
    int nseg;   /* pieces: (offset, length) pairs in seg */
    uint64_t seg[2 * MM_AM_CORK_SEGS];
    char *stage;
    mm_ucx_ring_rec_t *rec;
} mm_am_cork_t;

static _Thread_local uint64_t mm_am_tl_uid; /* the engine the slot below belongs to */
static _Thread_local int mm_am_tl_slot;
static atomic_ullong mm_am_uids;

/* ---- target side (inside progress, lock held) ---- */

static void mm_am_send_ack(mm_ucx_engine_t *e, int src, uint64_t seq);

static void mm_am_ack_sent_cb(void *request, ucs_status_t status, void *user_data)
{
    mm_ucx_flush_ctx_t *c = user_data;
    struct mm_am_rx *rx = &c->e->rx[c->pe];
    (void)status; /* a failed connection reaches the endpoint's error handler */
    ucp_request_free(request);
    rx->ack_inflight = 0;
    if (rx->ack_pending) {
        uint64_t s = rx->ack_pending;
        rx->ack_pending = 0;
        mm_am_send_ack(c->e, c->pe, s);
    }
}

/* Tell src that its messages up to seq are applied. The header lives in rx (one in flight). */
static void mm_am_send_ack(mm_ucx_engine_t *e, int src, uint64_t seq)
{
    struct mm_am_rx *rx = &e->rx[src];
    if (rx->ack_inflight) {
        if (seq > rx->ack_pending) rx->ack_pending = seq;
        return;
    }
    ucp_ep_h ep = e->peers[src].ep;
    if (ep == NULL) return; /* closed: the source is lost */
    rx->ack = (mm_am_ack_t){.seq = seq, .src = e->my_pe};
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_FLAGS;
    prm.cb.send = mm_am_ack_sent_cb;
    prm.user_data = &e->flush_ctxs[src];
    prm.flags = UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t r = ucp_am_send_nbx(ep, MM_AM_ID_ACK, &rx->ack, sizeof rx->ack, NULL, 0, &prm);
    if (r == NULL) return;
    if (UCS_PTR_IS_ERR(r)) {
        mm_ucx_status(UCS_PTR_STATUS(r), src, "an inter-host acknowledgement");
        return;
    }
    rx->ack_inflight = 1;
}

/* Apply one message whose turn it is: its data (unless already in place), then its signal. */
static void mm_am_apply(mm_ucx_engine_t *e, const mm_am_hdr_t *h, const void *data, size_t len)
{
    if (h->flags & MM_AM_F_MULTI) { /* pieces, in order (checked by mm_am_multi_valid) */
        const size_t nseg = (size_t)h->off;
        const char *tab = (const char *)data + len - 16 * nseg, *p = data;
        for (size_t i = 0; i < nseg; i++) {
            uint64_t o, l;
            memcpy(&o, tab + 16 * i, 8);
            memcpy(&l, tab + 16 * i + 8, 8);
            memcpy(e->seg_base + o, p, l);
            p += l;
        }
    } else if ((h->flags & MM_AM_F_DATA) && data != NULL && len) {
        memcpy(e->seg_base + h->off, data, len);
    }
    if (h->flags & MM_AM_F_SIG) {
        uint64_t *w = (uint64_t *)(void *)(e->seg_base + h->sig_off);
        mm_store_fence(); /* streaming stores of a large copy are visible before the signal */
        if (h->sig_op == MM_ENGINE_ADD) {
            __atomic_fetch_add(w, h->sig_val, __ATOMIC_RELEASE);
        } else if (h->sig_op == MM_ENGINE_SET) {
            __atomic_store_n(w, h->sig_val, __ATOMIC_RELEASE);
        } else {
            uint64_t zero = 0;
            __atomic_compare_exchange_n(w, &zero, h->sig_val, 0, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED);
        }
    }
    if (h->flags & MM_AM_F_ACKREQ) mm_am_send_ack(e, h->src, h->seq);
}

/* Apply the held messages of src whose turn has come. */
static void mm_am_advance(mm_ucx_engine_t *e, int src)
{
    struct mm_am_rx *rx = &e->rx[src];
    while (!rx->busy && rx->held && rx->held->h.seq == rx->next && rx->held->ready) {
        mm_am_held_t *m = rx->held;
        rx->held = m->next;
        mm_am_apply(e, &m->h, m->buf, m->len);
        rx->next++;
        free(m->buf);
        free(m);
    }
}

static void mm_am_recv_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    mm_am_recv_ctx_t *c = user_data;
    mm_ucx_engine_t *e = c->e;
    const int src = c->src;
    struct mm_am_rx *rx = &e->rx[src];
    (void)length;
    ucp_request_free(request);
    if (c->gen != rx->gen || status != UCS_OK) {
        /* the source was forgotten (lost) meanwhile, or the receive failed: nothing applies */
        if (c->gen == rx->gen && !atomic_load(&mm_shmem_g.closing))
            mm_ucx_status(status, c->src, "an inter-host receive");
        if (c->held && c->gen != rx->gen) { /* left to this callback by mm_ucx_am_forget */
            free(c->held->buf);
            free(c->held);
        }
        if (c->gen == rx->gen && c->held == NULL) rx->busy = 0;
        free(c);
        return;
    }
    if (c->held == NULL) { /* the data is in the heap already: the signal follows it */
        mm_am_apply(e, &rx->busy_h, NULL, 0);
        rx->busy = 0;
        rx->next++;
    } else {
        c->held->ready = 1;
    }
    free(c);
    mm_am_advance(e, src);
}

/* Start receiving a rendezvous message into dst (the heap or a held buffer). */
static int mm_am_recv_start(mm_ucx_engine_t *e, int src, void *desc, void *dst, size_t len,
                            mm_am_held_t *held)
{
    mm_am_recv_ctx_t *c = malloc(sizeof *c);
    if (c == NULL) return -1;
    *c = (mm_am_recv_ctx_t){.e = e, .src = src, .gen = e->rx[src].gen, .held = held};
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.recv_am = mm_am_recv_cb;
    prm.user_data = c;
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(e->worker, desc, dst, len, &prm);
    if (UCS_PTR_IS_ERR(r)) {
        free(c);
        return -1;
    }
    if (r == NULL) { /* complete at once (no callback) */
        free(c);
        if (held) {
            held->ready = 1;
        } else {
            mm_am_apply(e, &e->rx[src].busy_h, NULL, 0);
            e->rx[src].busy = 0;
            e->rx[src].next++;
        }
    }
    return 0;
}

/* The header describes a message this engine can apply: a known source, and data and signal
 * inside the segment. Anything else is dropped and logged (a different build or a bug). */
static int mm_am_valid(const mm_ucx_engine_t *e, const mm_am_hdr_t *h, size_t len)
{
    if (h->src < 0 || h->src >= e->n_pes || h->src == e->my_pe || h->seq == 0) return 0;
    if (h->flags & MM_AM_F_MULTI) {
        if (!(h->flags & MM_AM_F_DATA) || h->off == 0 || h->off > len / 16) return 0;
    } else if (h->flags & MM_AM_F_DATA) {
        if (h->off > e->seg_size || len > e->seg_size - h->off) return 0;
    } else if (len) {
        return 0;
    }
    if ((h->flags & MM_AM_F_SIG) &&
        ((h->sig_off & 7) || h->sig_off > e->seg_size - 8 || h->sig_op > MM_ENGINE_CAS0))
        return 0;
    return 1;
}

/* The pieces of a MULTI message lie inside the segment and add up to its data. */
static int mm_am_multi_valid(const mm_ucx_engine_t *e, const mm_am_hdr_t *h, const void *data,
                             size_t len)
{
    const size_t nseg = (size_t)h->off;
    const char *tab = (const char *)data + len - 16 * nseg;
    uint64_t sum = 0;
    for (size_t i = 0; i < nseg; i++) {
        uint64_t o, l;
        memcpy(&o, tab + 16 * i, 8);
        memcpy(&l, tab + 16 * i + 8, 8);
        if (o > e->seg_size || l > e->seg_size - o) return 0;
        sum += l;
    }
    return sum == len - 16 * nseg;
}

static ucs_status_t mm_am_msg_handler(void *arg, const void *header, size_t header_length,
                                      void *data, size_t length, const ucp_am_recv_param_t *param)
{
    mm_ucx_engine_t *e = arg;
    mm_am_hdr_t h;
    if (header_length != sizeof h) {
        MM_SHMEM_WARN("inter-host engine: dropped a message with a %zu-byte header (expected %zu; "
                      "a different megamoe build?)", header_length, sizeof h);
        return UCS_OK;
    }
    memcpy(&h, header, sizeof h);
    if (h.src < 0 || h.src >= e->n_pes || h.src == e->my_pe || h.seq == 0) {
        MM_SHMEM_WARN("inter-host engine: dropped a message from an unknown source (%d)",
                      (int)h.src);
        return UCS_OK;
    }
    if (mm_ucx_pe_lost(h.src)) return UCS_OK; /* a lost peer's late message */
    atomic_fetch_add_explicit(&e->heard[h.src], 1, memory_order_relaxed);
    struct mm_am_rx *rx = &e->rx[h.src];
    if (h.seq < rx->next) {
        MM_SHMEM_WARN("inter-host engine: dropped message %llu of rank %d: already applied",
                      (unsigned long long)h.seq, (int)h.src);
        return UCS_OK;
    }
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (!mm_am_valid(e, &h, length) ||
        ((h.flags & MM_AM_F_MULTI) && (rndv || !mm_am_multi_valid(e, &h, data, length)))) {
        /* applied as nothing: its number still counts, so the source's later messages apply */
        MM_SHMEM_WARN("inter-host engine: ignored a malformed message of rank %d (sequence %llu, "
                      "offset %llu, %zu bytes, flags 0x%x: outside the segment; a different "
                      "megamoe build?)", (int)h.src, (unsigned long long)h.seq,
                      (unsigned long long)h.off, length, (unsigned)h.flags);
        h.flags = 0;
        length = 0;
        rndv = 0; /* a rendezvous' data is never fetched (UCX completes the sender) */
    }
    void *dst = (h.flags & MM_AM_F_DATA) && !(h.flags & MM_AM_F_MULTI) ? e->seg_base + h.off : NULL;
    if (h.seq == rx->next && !rx->busy) { /* held messages all come later */
        if (!rndv) {
            mm_am_apply(e, &h, data, length);
            rx->next++;
            mm_am_advance(e, h.src);
            return UCS_OK;
        }
        rx->busy = 1;
        rx->busy_h = h;
        if (mm_am_recv_start(e, h.src, data, dst, length, NULL) != 0) {
            rx->busy = 0;
            goto fail;
        }
        mm_am_advance(e, h.src);
        return UCS_OK;
    }
    /* early: hold it (with a copy of its data) until its turn */
    mm_am_held_t *m = calloc(1, sizeof *m);
    if (m == NULL) goto fail;
    m->h = h;
    m->len = length;
    if (length) {
        m->buf = malloc(length);
        if (m->buf == NULL) {
            free(m);
            goto fail;
        }
    }
    if (!rndv) {
        if (length) memcpy(m->buf, data, length);
        m->ready = 1;
    } else if (mm_am_recv_start(e, h.src, data, m->buf, length, m) != 0) {
        free(m->buf);
        free(m);
        goto fail;
    }
    mm_am_held_t **pp = &rx->held;
    while (*pp && (*pp)->h.seq < h.seq) pp = &(*pp)->next;
    m->next = *pp;
    *pp = m;
    return UCS_OK;
fail:
    /* a message that cannot be kept breaks the source's order: its data is lost for good */
    mm_shmem_mark_lost(h.src, "this rank could not keep a message it sent (out of memory)");
    return UCS_OK;
}

static ucs_status_t mm_am_ack_handler(void *arg, const void *header, size_t header_length,
                                      void *data, size_t length, const ucp_am_recv_param_t *param)
{
    mm_ucx_engine_t *e = arg;
    (void)data;
    (void)length;
    (void)param;
    mm_am_ack_t a;
    if (header_length != sizeof a) return UCS_OK;
    memcpy(&a, header, sizeof a);
    if (a.src < 0 || a.src >= e->n_pes) return UCS_OK;
    atomic_fetch_add_explicit(&e->heard[a.src], 1, memory_order_relaxed);
    mm_ucx_peer_t *p = &e->peers[a.src];
    if (a.seq > p->acked && a.seq <= p->seq_sent) p->acked = a.seq;
    return UCS_OK;
}

/* ---- source side ---- */

/* The largest message that travels as one transport segment: UCX's TCP receive segment
 * (UCX_TCP_RX_SEG_SIZE, 256k unless the user set it) less room for the headers. */
static size_t mm_am_msg_max(void)
{
    const char *rx = "";
    uint64_t seg = 256u << 10;
    if (mm_env_string(MM_ENV_UCX_TCP_RX_SEG_SIZE, &rx) == MEGAMOE_OK && rx[0]) {
        char *end = NULL;
        unsigned long long v = strtoull(rx, &end, 10);
        if (end && (*end == 'k' || *end == 'K')) v <<= 10, end++;
        else if (end && (*end == 'm' || *end == 'M')) v <<= 20, end++;
        seg = end && (*end == '\0' || *end == 'b' || *end == 'B') && v > 0 ? v : 64u << 10;
    }
    if (seg < (16u << 10)) seg = 16u << 10;
    if (seg > (1u << 20)) seg = 1u << 20; /* the staging limit */
    return (size_t)seg - 4096u;
}

megamoe_status_t mm_ucx_am_setup(mm_ucx_engine_t *e)
{
    e->rx = calloc((size_t)e->n_pes, sizeof *e->rx);
    e->heard = calloc((size_t)e->n_pes, sizeof *e->heard);
    e->corks = calloc(MM_AM_CORKS, sizeof *e->corks);
    e->uid = atomic_fetch_add(&mm_am_uids, 1) + 1;
    e->am_msg_max = mm_am_msg_max();
    if (e->rx == NULL || e->heard == NULL || e->corks == NULL)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "inter-host engine: out of memory for %d PEs",
                        e->n_pes);
    for (int pe = 0; pe < e->n_pes; pe++) e->rx[pe].next = 1;
    ucp_am_handler_param_t hp;
    memset(&hp, 0, sizeof hp);
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    hp.arg = e;
    hp.id = MM_AM_ID_MSG;
    hp.cb = mm_am_msg_handler;
    ucs_status_t s = ucp_worker_set_am_recv_handler(e->worker, &hp);
    if (s == UCS_OK) {
        hp.id = MM_AM_ID_ACK;
        hp.cb = mm_am_ack_handler;
        s = ucp_worker_set_am_recv_handler(e->worker, &hp);
    }
    if (s != UCS_OK)
        return mm_error(MEGAMOE_UNSUPPORTED, "UCX: cannot register the engine's active message "
                        "handlers: %s", ucs_status_string(s));
    return MEGAMOE_OK;
}

/* Test seam (engine_test.h): one data message held back, sent after the next message. */
static atomic_int mm_am_test_swap;
static struct {
    int pe;
    char *stage;
    size_t n;
    mm_ucx_ring_rec_t *rec;
} mm_am_deferred = {-1, NULL, 0, NULL};

void mm_shmem_engine_test_reorder(int on) { atomic_store(&mm_am_test_swap, on); }

static megamoe_status_t mm_am_send_staged(ucp_ep_h ep, int pe, char *stage, size_t n,
                                          mm_ucx_ring_rec_t *rec)
{
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_FLAGS;
    prm.cb.send = mm_ucx_put_done_cb;
    prm.user_data = rec;
    prm.flags = UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t r = ucp_am_send_nbx(ep, MM_AM_ID_MSG, stage, sizeof(mm_am_hdr_t),
                                         n ? stage + MM_AM_HDR_SLOT : NULL, n, &prm);
    if (r == NULL) {
        rec->done = 1;
    } else if (UCS_PTR_IS_ERR(r)) {
        rec->done = 1;
        return mm_ucx_status(UCS_PTR_STATUS(r), pe, "an inter-host put");
    }
    return MEGAMOE_OK;
}

/* The held-back message goes now (lock held). */
static megamoe_status_t mm_am_send_deferred(mm_ucx_engine_t *e)
{
    if (mm_am_deferred.stage == NULL) return MEGAMOE_OK;
    const int pe = mm_am_deferred.pe;
    char *stage = mm_am_deferred.stage;
    mm_am_deferred.stage = NULL;
    megamoe_status_t st = MEGAMOE_OK;
    ucp_ep_h ep = mm_ucx_ep_locked(e, pe, "inter-host put", &st);
    if (ep == NULL) {
        mm_am_deferred.rec->done = 1;
        return st;
    }
    return mm_am_send_staged(ep, pe, stage, mm_am_deferred.n, mm_am_deferred.rec);
}

/* Post the staged message at stage (lock held): its header slot is filled here (the sequence
 * number is taken now), n data bytes follow it. covered: a later quiet waits for it. */
static megamoe_status_t mm_am_post(mm_ucx_engine_t *e, int pe, mm_am_hdr_t *h, char *stage,
                                   size_t n, mm_ucx_ring_rec_t *rec, int covered)
{
    mm_ucx_peer_t *p = &e->peers[pe];
    megamoe_status_t st = MEGAMOE_OK;
    ucp_ep_h ep = mm_ucx_ep_locked(e, pe, (h->flags & MM_AM_F_SIG) ? "inter-host signal"
                                                                  : "inter-host put", &st);
    if (ep == NULL) {
        rec->done = 1; /* the reserved bytes go back with the record */
        return st;
    }
    h->seq = ++p->seq_sent;
    if (covered) p->quiet_seq = h->seq;
    /* the request's own number: its acknowledgement carries it (a quiet that read seq_sent
     * after the send could wait for a later message of another thread, never acknowledged) */
    if (h->flags & MM_AM_F_ACKREQ) p->ackreq_seq = h->seq;
    e->stats.messages++;
    e->stats.put_bytes += n;
    e->stats.signals += (h->flags & MM_AM_F_SIG) != 0;
    memcpy(stage, h, sizeof *h);
    if (atomic_load(&mm_am_test_swap) && mm_am_deferred.stage == NULL &&
        !(h->flags & (MM_AM_F_SIG | MM_AM_F_ACKREQ))) {
        mm_am_deferred.pe = pe;
        mm_am_deferred.stage = stage;
        mm_am_deferred.n = n;
        mm_am_deferred.rec = rec;
        return MEGAMOE_OK;
    }
    st = mm_am_send_staged(ep, pe, stage, n, rec);
    megamoe_status_t ds = mm_am_send_deferred(e);
    return st != MEGAMOE_OK ? st : ds;
}

/* This thread's cork (NULL when every slot is taken). */
static mm_am_cork_t *mm_am_my_cork(mm_ucx_engine_t *e)
{
    if (mm_am_tl_uid != e->uid) {
        if (e->n_corks >= MM_AM_CORKS) return NULL;
        mm_am_tl_slot = e->n_corks++;
        e->corks[mm_am_tl_slot].pe = -1;
        mm_am_tl_uid = e->uid;
    }
    return &e->corks[mm_am_tl_slot];
}

/* Send cork c (with the signal when sig_op >= 0, and the extra flags); its data is always
 * covered by a later quiet. */
static megamoe_status_t mm_am_cork_send(mm_ucx_engine_t *e, mm_am_cork_t *c, uint64_t sig_off,
                                        uint64_t value, int sig_op, unsigned extra)
{
    const int pe = c->pe;
    c->pe = -1;
    const int multi = c->nseg > 1;
    size_t n = c->len;
    if (multi) { /* the table after the data */
        memcpy(c->stage + MM_AM_HDR_SLOT + n, c->seg, 16u * (size_t)c->nseg);
        n += 16u * (size_t)c->nseg;
    }
    /* give back the unused part of the reservation when nothing was reserved after it */
    const size_t unused = e->am_msg_max - n;
    if (e->ring_head == c->rec->start + c->rec->len && c->rec->len >= unused) {
        c->rec->len -= unused;
        e->ring_head -= unused;
    }
    mm_am_hdr_t h = {.off = multi ? (uint64_t)c->nseg : c->seg[0],
                     .sig_off = sig_off,
                     .sig_val = value,
                     .src = e->my_pe,
                     .flags = (uint16_t)(MM_AM_F_DATA | (multi ? MM_AM_F_MULTI : 0) |
                                         (sig_op >= 0 ? MM_AM_F_SIG : 0) | extra),
                     .sig_op = (uint16_t)(sig_op >= 0 ? sig_op : 0)};
    megamoe_status_t st = mm_am_post(e, pe, &h, c->stage, n, c->rec, 1);
    if (st == MEGAMOE_OK && multi) e->stats.put_bytes -= 16u * (size_t)c->nseg; /* data only */
    return st;
}

/* Send every cork to pe (pe < 0: every cork) except `except`. */
static megamoe_status_t mm_am_corks_flush(mm_ucx_engine_t *e, int pe, const mm_am_cork_t *except)
{
    megamoe_status_t st = MEGAMOE_OK;
    for (int i = 0; i < e->n_corks; i++) {
        mm_am_cork_t *c = &e->corks[i];
        if (c == except || c->pe < 0 || (pe >= 0 && c->pe != pe)) continue;
        megamoe_status_t s = mm_am_cork_send(e, c, 0, 0, -1, 0);
        if (st == MEGAMOE_OK) st = s;
    }
    return st;
}

void mm_ucx_am_flush_pe(mm_ucx_engine_t *e, int pe)
{
    if (e->corks) mm_am_corks_flush(e, pe, NULL);
    if (pe < 0) mm_am_send_deferred(e);
}

/* 1 when n bytes for off of pe can join cork c. */
static int mm_am_cork_fits(const mm_ucx_engine_t *e, const mm_am_cork_t *c, int pe, uint64_t off,
                           size_t n)
{
    /* data and table (one more piece, to be safe) in one message */
    if (c == NULL || c->pe != pe || c->len + n + 16u * ((size_t)c->nseg + 1) > e->am_msg_max)
        return 0;
    if (c->nseg < MM_AM_CORK_SEGS) return 1;
    const uint64_t *last = &c->seg[2 * (c->nseg - 1)];
    return last[0] + last[1] == off;
}

static void mm_am_cork_add(mm_am_cork_t *c, uint64_t off, const void *src, size_t n)
{
    if (n == 0) return;
    memcpy(c->stage + MM_AM_HDR_SLOT + c->len, src, n);
    c->len += n;
    if (c->nseg > 0 && c->seg[2 * c->nseg - 2] + c->seg[2 * c->nseg - 1] == off) {
        c->seg[2 * c->nseg - 1] += n;
        return;
    }
    c->seg[2 * c->nseg] = off;
    c->seg[2 * c->nseg + 1] = n;
    c->nseg++;
}

static megamoe_status_t mm_am_send_flags(mm_ucx_engine_t *e, int pe, uint64_t off,
                                         const void *src, size_t n, uint64_t sig_off,
                                         uint64_t value, int sig_op, unsigned extra)
{
    const int covered = !(sig_op >= 0 && (sig_op & MM_ENGINE_NO_QUIET));
    if (sig_op >= 0) sig_op &= ~MM_ENGINE_NO_QUIET;
    mm_am_hdr_t h = {.off = off,
                     .sig_off = sig_off,
                     .sig_val = value,
                     .src = e->my_pe,
                     .flags = (uint16_t)((n ? MM_AM_F_DATA : 0) | (sig_op >= 0 ? MM_AM_F_SIG : 0) |
                                         extra),
                     .sig_op = (uint16_t)(sig_op >= 0 ? sig_op : 0)};
    megamoe_status_t st = MEGAMOE_OK;
    const size_t mmax = e->am_msg_max;
    if (n <= mmax) {
        /* one staged message: header and data copied into the ring, sent from there (eager:
         * the bytes leave now, the source is reusable at once), or into a cork */
        pthread_mutex_lock(&e->lock);
        mm_am_cork_t *mine = mm_am_my_cork(e);
        const int joins = mm_am_cork_fits(e, mine, pe, off, n);
        if (sig_op >= 0 || extra) {
            /* a signal or a request: every cork to pe leaves first, this one with it */
            st = mm_am_corks_flush(e, pe, mine);
            if (st == MEGAMOE_OK && mine && mine->pe == pe && (n == 0 || joins)) {
                mm_am_cork_add(mine, off, src, n);
                st = mm_am_cork_send(e, mine, sig_off, value, sig_op, extra);
                pthread_mutex_unlock(&e->lock);
                return st;
            }
        } else if (mine && n < MM_AM_CORK_MAX) {
            if (joins) {
                mm_am_cork_add(mine, off, src, n);
                pthread_mutex_unlock(&e->lock);
                return MEGAMOE_OK;
            }
            if (mine->pe >= 0) st = mm_am_cork_send(e, mine, 0, 0, -1, 0);
            mm_ucx_ring_rec_t *rec = NULL;
            char *stage = NULL;
            if (st == MEGAMOE_OK) st = mm_ucx_ring_alloc(e, MM_AM_HDR_SLOT + mmax, pe, &stage, &rec);
            if (st == MEGAMOE_OK && mm_ucx_ep_locked(e, pe, "inter-host put", &st) == NULL)
                rec->done = 1;
            if (st == MEGAMOE_OK) {
                mine->pe = pe;
                mine->len = 0;
                mine->nseg = 0;
                mine->stage = stage;
                mine->rec = rec;
                mm_am_cork_add(mine, off, src, n);
            }
            pthread_mutex_unlock(&e->lock);
            return st;
        }
        if (st == MEGAMOE_OK && mine && mine->pe == pe) st = mm_am_cork_send(e, mine, 0, 0, -1, 0);
        mm_ucx_ring_rec_t *rec = NULL;
        char *stage = NULL;
        if (st == MEGAMOE_OK) st = mm_ucx_ring_alloc(e, MM_AM_HDR_SLOT + n, pe, &stage, &rec);
        if (st == MEGAMOE_OK) {
            if (n) memcpy(stage + MM_AM_HDR_SLOT, src, n);
            st = mm_am_post(e, pe, &h, stage, n, rec, covered);
        }
        pthread_mutex_unlock(&e->lock);
        return st;
    }
    /* larger than one message: pieces of at most mmax bytes (each one transport segment: UCX
     * would otherwise cut a message into fragments and the target assemble them in a fresh
     * buffer, a copy and a page-faulting allocation per message), the signal with the last */
    pthread_mutex_lock(&e->lock);
    {
        mm_am_cork_t *mine = mm_am_my_cork(e);
        if (mine && mine->pe == pe) st = mm_am_cork_send(e, mine, 0, 0, -1, 0);
        if (st == MEGAMOE_OK && (sig_op >= 0 || extra)) st = mm_am_corks_flush(e, pe, NULL);
    }
    pthread_mutex_unlock(&e->lock);
    const size_t npiece = (n + mmax - 1) / mmax;
    if (n <= MM_UCX_STAGE_MAX) { /* staged pieces */
        for (size_t c = 0; c < npiece && st == MEGAMOE_OK; c++) {
            const size_t o = c * mmax, len = n - o < mmax ? n - o : mmax;
            mm_am_hdr_t hc = h;
            hc.off = off + o;
            if (c + 1 < npiece) hc.flags &= (uint16_t)~(MM_AM_F_SIG | MM_AM_F_ACKREQ);
            pthread_mutex_lock(&e->lock);
            mm_ucx_ring_rec_t *rec = NULL;
            char *stage = NULL;
            st = mm_ucx_ring_alloc(e, MM_AM_HDR_SLOT + len, pe, &stage, &rec);
            if (st == MEGAMOE_OK) {
                memcpy(stage + MM_AM_HDR_SLOT, (const char *)src + o, len);
                st = mm_am_post(e, pe, &hc, stage, len, rec, covered);
            }
            pthread_mutex_unlock(&e->lock);
        }
        return st;
    }
    /* large: zero-copy from the caller's buffer, every piece posted before the first wait (so
     * they pipeline); the caller's buffer is free again once every send completed locally.
     * Measured over TCP (UCX 1.13): one rendezvous message per put 0.6-0.9x UCX's own put at
     * 1-4 MiB (a round trip before the data, nothing pipelines); eager pieces at or above it. */
    ucp_request_param_t prm;
    mm_ucx_peer_t *p = &e->peers[pe];
    mm_ucx_done_t *dh[64], **ds = dh;
    if (npiece > 64 && (ds = calloc(npiece, sizeof *ds)) == NULL)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "inter-host put: out of memory");
    size_t posted = 0;
    for (size_t c = 0; c < npiece && st == MEGAMOE_OK; c++) {
        const size_t o = c * mmax, len = n - o < mmax ? n - o : mmax;
        mm_ucx_done_t *d = mm_ucx_done_new(e, &prm);
        if (d == NULL) {
            st = MEGAMOE_OUT_OF_MEMORY;
            break;
        }
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags = UCP_AM_SEND_FLAG_EAGER;
        mm_am_hdr_t hc = h;
        hc.off = off + o;
        if (c + 1 < npiece) hc.flags &= (uint16_t)~(MM_AM_F_SIG | MM_AM_F_ACKREQ);
        pthread_mutex_lock(&e->lock);
        ucs_status_ptr_t r = NULL;
        ucp_ep_h ep = mm_ucx_ep_locked(e, pe, "inter-host put", &st);
        if (ep) {
            hc.seq = ++p->seq_sent;
            p->quiet_seq = hc.seq;
            e->stats.messages++;
            e->stats.put_bytes += len;
            e->stats.signals += (hc.flags & MM_AM_F_SIG) != 0;
            memcpy(d->hdr, &hc, sizeof hc);
            r = ucp_am_send_nbx(ep, MM_AM_ID_MSG, d->hdr, sizeof hc, (const char *)src + o, len,
                                &prm);
        }
        pthread_mutex_unlock(&e->lock);
        if (st != MEGAMOE_OK || r == NULL || UCS_PTR_IS_ERR(r)) {
            mm_ucx_done_release(e, d);
            if (st == MEGAMOE_OK && r != NULL)
                st = mm_ucx_status(UCS_PTR_STATUS(r), pe, "an inter-host put");
            continue;
        }
        ds[posted++] = d;
    }
    for (size_t i = 0; i < posted; i++) {
        megamoe_status_t ws = mm_ucx_wait_done(e, ds[i], pe, "an inter-host put");
        if (st == MEGAMOE_OK) st = ws;
    }
    if (ds != dh) free(ds);
    return st;
}

megamoe_status_t mm_ucx_am_send(mm_ucx_engine_t *e, int pe, uint64_t off, const void *src,
                                size_t n, uint64_t sig_off, uint64_t value, int sig_op)
{
    return mm_am_send_flags(e, pe, off, src, n, sig_off, value, sig_op, 0);
}

typedef struct mm_am_quiet {
    uint64_t *want; /* per PE: the acknowledgement that completes the quiet (0: none) */
} mm_am_quiet_t;

static int mm_am_quiet_done(mm_ucx_engine_t *e, void *arg)
{
    const mm_am_quiet_t *q = arg;
    for (int pe = 0; pe < e->n_pes; pe++) /* a lost PE acknowledges nothing more */
        if (q->want[pe] && e->peers[pe].acked < q->want[pe] && !mm_ucx_pe_lost(pe)) return 0;
    return 1;
}

megamoe_status_t mm_ucx_am_quiet(mm_ucx_engine_t *e)
{
    uint64_t here[256], *want = here;
    if (e->n_pes > 256 && (want = malloc(sizeof *want * (size_t)e->n_pes)) == NULL)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "inter-host quiet: out of memory");
    pthread_mutex_lock(&e->lock);
    megamoe_status_t st = mm_am_corks_flush(e, -1, NULL);
    megamoe_status_t ds = mm_am_send_deferred(e);
    if (st == MEGAMOE_OK) st = ds;
    pthread_mutex_unlock(&e->lock);
    int any = 0;
    for (int pe = 0; pe < e->n_pes; pe++) {
        mm_ucx_peer_t *p = &e->peers[pe];
        pthread_mutex_lock(&e->lock);
        uint64_t need = p->quiet_seq, acked = p->acked, asked = p->ackreq_seq;
        pthread_mutex_unlock(&e->lock);
        want[pe] = 0;
        /* a lost PE: what was sent to it is gone with it (the survivors go on without it) */
        if (need <= acked || mm_ucx_pe_lost(pe)) continue;
        if (asked < need) { /* something was sent after the last request: ask again */
            megamoe_status_t s = mm_am_send_flags(e, pe, 0, NULL, 0, 0, 0, -1, MM_AM_F_ACKREQ);
            if (s != MEGAMOE_OK) {
                if (st == MEGAMOE_OK) st = s;
                continue;
            }
            pthread_mutex_lock(&e->lock);
            asked = p->ackreq_seq; /* set by mm_am_post to the request's own number */
            pthread_mutex_unlock(&e->lock);
        }
        want[pe] = asked;
        any = 1;
    }
    if (st == MEGAMOE_OK && any) {
        pthread_mutex_lock(&e->lock);
        e->stats.quiet_waits++;
        pthread_mutex_unlock(&e->lock);
        mm_am_quiet_t q = {want};
        st = mm_ucx_wait_until(e, mm_am_quiet_done, &q, -1, "an inter-host quiet");
    }
    if (want != here) free(want);
    return st;
}

void mm_ucx_am_forget(mm_ucx_engine_t *e, int pe)
{
    if (mm_am_deferred.stage && mm_am_deferred.pe == pe) {
        mm_am_deferred.rec->done = 1;
        mm_am_deferred.stage = NULL;
    }
    for (int i = 0; e->corks && i < e->n_corks; i++)
        if (e->corks[i].pe == pe) { /* never sent: the ring space goes back */
            e->corks[i].rec->done = 1;
            e->corks[i].pe = -1;
        }
    struct mm_am_rx *rx = &e->rx[pe];
    rx->gen++; /* receives in flight from pe now find a stale generation */
    rx->busy = 0;
    mm_am_held_t *m = rx->held;
    rx->held = NULL;
    while (m) {
        mm_am_held_t *nx = m->next;
        if (m->ready) { /* a held message still being received is freed by its callback */
            free(m->buf);
            free(m);
        }
        m = nx;
    }
}

void mm_ucx_am_fini(mm_ucx_engine_t *e)
{
    mm_am_deferred.stage = NULL; /* in the ring, which goes with the engine */
    free((void *)e->heard);
    e->heard = NULL;
    if (e->rx == NULL) return;
    for (int pe = 0; pe < e->n_pes; pe++) {
        mm_am_held_t *m = e->rx[pe].held;
        while (m) { /* the worker is gone: no callback comes for any of them */
            mm_am_held_t *nx = m->next;
            free(m->buf);
            free(m);
            m = nx;
        }
    }
    free(e->rx);
    e->rx = NULL;
    free(e->corks);
    e->corks = NULL;
}
