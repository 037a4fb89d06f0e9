/* A failed one-sided transfer in a data path reaches the call's status on every rank, never
 * an OK with wrong numbers and never a hang (issue 30).
 *
 * Run by `megamoe launch -n 3` with MEGAMOE_SHMEM_INTRA_HOST=engine (every transfer goes
 * through mm_shmem_put/get/signal, as between hosts), one case per launch. The failure is
 * injected with the shmem test seam (shmem.h, mm_shmem_test_fail_rma) as the engine fails:
 * transient (IO, the peer stays: only the failing rank knows, and must tell the others) or a
 * broken connection (PEER_LOST: the peer is marked lost, every rank learns it, the job is
 * over). Each case first runs the call cleanly while counting the failing rank's transfers of
 * the kind under test, then again with its middle transfer of that kind failing, in the
 * forward or in the backward:
 *  - the call that holds the fault fails on every rank with the same status (IO / PEER_LOST)
 *    well within the timeout, and on the failing rank the injected failure fired;
 *  - a call before it (the forward of a backward case) returns OK with the clean run's bits;
 *  - after a transient failure the same calls work again and give the clean run's bits.
 * Before issue 30 the data paths dropped these statuses: a transient failure came back as OK
 * with rows that never arrived (or, at replicas.c, an uninitialised buffer in dW). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_check.h"
#include "shmem/shmem.h"

#define T_ 256
#define H_ 64
#define I_ 32
#define E_ 6
#define K_ 2
/* the rank whose transfer fails (1; a case may name another) */
static int FAULTY = 1;

typedef struct fault_case {
    const char *schedule;      /* "O0" / "O1" */
    const char *dispatch_mode; /* NULL (push) or "pull" */
    int replicas;              /* replica_slots_per_rank */
    unsigned op;               /* MM_SHMEM_RMA_* kind that fails */
    int in_backward;           /* 0: the forward's middle transfer; 1: the backward's */
    int faulty;                /* the failing rank */
    int lose;                  /* 1: a broken connection (PEER_LOST); 0: transient (IO) */
} fault_case_t;

static int LOSE; /* the current case's mode */

/* Forward and backward on this rank; *fwd_p / *bwd_p their statuses (bwd not run when the
 * forward failed: -100). Rank FAULTY arms the seam with skip before each call (LONG_MAX:
 * count only), and gets its counts of both calls back. */
static void run_layer(megamoe_experts_t *x, const mm_moe_problem_t *p, mm_run_t *r, unsigned op,
                      uint64_t version, long skip_fwd, long skip_bwd, unsigned long counts[2],
                      megamoe_status_t *fwd_p, megamoe_status_t *bwd_p)
{
    const int me = mm_test_rank();
    mm_input_buf_t ib;
    if (mm_input_make(p, me, NULL, &ib) != 0) abort();
    megamoe_experts_weights_t w = mm_local_weights(p, me, version);
    megamoe_experts_saved_t *sv = NULL;
    if (me == FAULTY) mm_shmem_test_fail_rma(op, skip_fwd, LOSE);
    *fwd_p = megamoe_experts_forward(x, &w, &ib.in, r->out, &sv);
    if (me == FAULTY) counts[0] = mm_shmem_test_rma_count(op);
    *bwd_p = (megamoe_status_t)-100;
    if (*fwd_p == MEGAMOE_OK) {
        megamoe_experts_grads_t g = {r->gh, r->gp, r->g1, r->g2, MEGAMOE_DTYPE_BF16};
        if (me == FAULTY) mm_shmem_test_fail_rma(op, skip_bwd, LOSE);
        *bwd_p = megamoe_experts_backward(x, sv, &w, p->grad_out + (size_t)(me * p->T * p->H),
                                          &g);
        if (me == FAULTY) counts[1] = mm_shmem_test_rma_count(op);
    }
    if (me == FAULTY) mm_shmem_test_fail_rma(0, 0, 0);
    megamoe_experts_saved_destroy(sv);
    mm_input_free(&ib);
}

/* The failing call's status on this rank: IO (transient) or PEER_LOST everywhere (rank FAULTY:
 * its injected failure, logged where it happened, must have fired). */
static int failed_as_expected(megamoe_status_t st, const char *call)
{
    const int me = mm_test_rank();
    const megamoe_status_t want = LOSE ? MEGAMOE_PEER_LOST : MEGAMOE_IO;
    if (st != want) {
        fprintf(stderr, "%s: got %s, expected %s (last error: %s)\n", call,
                megamoe_status_name(st), megamoe_status_name(want), megamoe_last_error());
        return 0;
    }
    if (me == FAULTY && !mm_shmem_test_rma_fired()) {
        fprintf(stderr, "%s: failed, but the injected failure never fired\n", call);
        return 0;
    }
    fprintf(stderr, "  %s failed as it must: %s\n", call, megamoe_last_error());
    return 1;
}

static void layer_case(const fault_case_t *fc)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    ASSERT_EQ_INT(ep, 3);
    FAULTY = fc->faulty;
    LOSE = fc->lose;
    megamoe_comm_t *comm = mm_test_comm();
    ASSERT_TRUE(comm != NULL);
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_,
                                        fc->replicas ? MM_ROUTE_SKEW : MM_ROUTE_BALANCED, 31),
                  0);
    megamoe_experts_params_t prm = mm_params_shape(T_, H_, I_, E_, K_);
    prm.schedule = fc->schedule;
    prm.dispatch_mode = fc->dispatch_mode;
    prm.replica_slots_per_rank = fc->replicas;
    prm.workers = 2;
    megamoe_experts_t *x = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &prm, &x));
    mm_run_t clean, faulty;
    ASSERT_EQ_INT(mm_run_alloc(&clean, &P), 0);
    ASSERT_EQ_INT(mm_run_alloc(&faulty, &P), 0);
    unsigned long counts[2] = {0, 0};
    megamoe_status_t fwd, bwd;
    run_layer(x, &P, &clean, fc->op, 1, LONG_MAX, LONG_MAX, counts, &fwd, &bwd);
    ASSERT_OK(fwd);
    ASSERT_OK(bwd);
    if (me == FAULTY) {
        fprintf(stderr, "  rank %d made %lu / %lu transfers of the kind in forward / backward\n",
                me, counts[0], counts[1]);
        ASSERT_TRUE(counts[fc->in_backward] > 0); /* the fault has somewhere to land */
    }
    const long mid = (long)counts[fc->in_backward] / 2;
    /* another weight version (same values): every call repeats the clean run's transfers,
     * the guests' weight fetches included */
    run_layer(x, &P, &faulty, fc->op, 2, fc->in_backward ? LONG_MAX : mid,
              fc->in_backward ? mid : LONG_MAX, counts, &fwd, &bwd);
    if (fc->in_backward) {
        ASSERT_OK(fwd); /* before the fault: the clean bits */
        ASSERT_TRUE(memcmp(clean.out, faulty.out, (size_t)(T_ * H_) * 2) == 0);
        ASSERT_TRUE(failed_as_expected(bwd, "backward"));
    } else {
        ASSERT_TRUE(failed_as_expected(fwd, "forward"));
    }
    if (!LOSE) { /* transient: the layer works on, bit for bit */
        mm_run_t again;
        ASSERT_EQ_INT(mm_run_alloc(&again, &P), 0);
        run_layer(x, &P, &again, 0, 3, LONG_MAX, LONG_MAX, counts, &fwd, &bwd);
        ASSERT_OK(fwd);
        ASSERT_OK(bwd);
        ASSERT_TRUE(mm_run_same_bits("after the transient failure", &clean, &again, &P, 2));
        mm_run_free(&again);
    }
    megamoe_log_set_level(MEGAMOE_LOG_OFF); /* the job is lost: closing is local, may complain */
    megamoe_experts_close(x);
    megamoe_experts_destroy(x);
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
    mm_run_free(&clean);
    mm_run_free(&faulty);
    mm_moe_problem_free(&P);
}

MM_TEST(o0_forward_put)
{
    fault_case_t c = {"O0", NULL, 0, MM_SHMEM_RMA_PUT, 0, 1, 0};
    layer_case(&c);
}
MM_TEST(o0_backward_put)
{
    fault_case_t c = {"O0", NULL, 0, MM_SHMEM_RMA_PUT, 1, 1, 0};
    layer_case(&c);
}
MM_TEST(o0_pull_forward_get)
{
    fault_case_t c = {"O0", "pull", 0, MM_SHMEM_RMA_GET, 0, 1, 0};
    layer_case(&c);
}
/* a broken connection: the peer is lost, every rank learns it */
MM_TEST(o1_forward_put_lost)
{
    fault_case_t c = {"O1", NULL, 0, MM_SHMEM_RMA_PUT, 0, 1, 1};
    layer_case(&c);
}
MM_TEST(o1_forward_put)
{
    fault_case_t c = {"O1", NULL, 0, MM_SHMEM_RMA_PUT, 0, 1, 0};
    layer_case(&c);
}
MM_TEST(o1_backward_signal)
{
    fault_case_t c = {"O1", NULL, 0, MM_SHMEM_RMA_SIGNAL, 1, 1, 0};
    layer_case(&c);
}
MM_TEST(o1_pull_backward_get)
{
    fault_case_t c = {"O1", "pull", 0, MM_SHMEM_RMA_GET, 1, 1, 0};
    layer_case(&c);
}
/* replicas (skewed routing: rank 0's expert 0 is hot): a guest (rank 1) fetches its weights
 * with gets in the forward, the home (rank 0) its guests' weight-gradient partials in the
 * backward */
MM_TEST(o1_replicas_forward_get)
{
    fault_case_t c = {"O1", NULL, 2, MM_SHMEM_RMA_GET, 0, 1, 0};
    layer_case(&c);
}
MM_TEST(o1_replicas_backward_get)
{
    fault_case_t c = {"O1", NULL, 2, MM_SHMEM_RMA_GET, 1, 0, 0};
    layer_case(&c);
}

/* ---- MoeDistributeDispatchV2 / CombineV2 ---------------------------------------------------- */

#define BS 16
#define OH 32
#define OE 6
#define OK_ 2

typedef struct ops_bufs {
    uint16_t x[BS * OH], out[BS * OH];
    int32_t ids[BS * OK_];
    float ws[BS * OK_];
    megamoe_dispatch_v2_args_t d;
    void *expand_x, *dyn, *assist, *tok, *counts, *escales;
} ops_bufs_t;

static megamoe_tensor_t tens(void *data, megamoe_dtype_t t, int64_t d0, int64_t d1)
{
    megamoe_tensor_t v = megamoe_tensor_none();
    v.data = data, v.dtype = t, v.ndim = d1 ? 2 : 1, v.shape[0] = d0, v.shape[1] = d1;
    return v;
}

static int ops_setup(ops_bufs_t *b, megamoe_comm_t *comm)
{
    const int me = mm_test_rank();
    for (int i = 0; i < BS * OH; i++) b->x[i] = megamoe_fp32_to_bf16((float)((i * 7 + me) % 13) - 6);
    for (int t = 0; t < BS; t++)
        for (int k = 0; k < OK_; k++) {
            b->ids[t * OK_ + k] = (t + 2 * k + me) % OE;
            b->ws[t * OK_ + k] = 0.25f * (float)(k + 1);
        }
    megamoe_dispatch_v2_args_t *a = &b->d;
    *a = megamoe_dispatch_v2_args_default();
    a->x = tens(b->x, MEGAMOE_DTYPE_BF16, BS, OH);
    a->expert_ids = tens(b->ids, MEGAMOE_DTYPE_INT32, BS, OK_);
    a->group_ep = comm, a->ep_world_size = mm_test_world(), a->ep_rank_id = me;
    a->moe_expert_num = OE;
    if (megamoe_dispatch_v2_infer(a) != MEGAMOE_OK) return -1;
    b->expand_x = calloc((size_t)(a->expand_x.shape[0] * OH), 2);
    b->dyn = calloc((size_t)a->dynamic_scales.shape[0], 4);
    b->assist = calloc((size_t)a->assist_info_for_combine.shape[0], 4);
    b->tok = calloc((size_t)a->expert_token_nums.shape[0], 8);
    b->counts = calloc((size_t)a->ep_recv_counts.shape[0], 4);
    b->escales = calloc((size_t)a->expand_scales.shape[0] + 1, 4);
    a->expand_x.data = b->expand_x, a->dynamic_scales.data = b->dyn;
    a->assist_info_for_combine.data = b->assist, a->expert_token_nums.data = b->tok;
    a->ep_recv_counts.data = b->counts, a->expand_scales.data = b->escales;
    return 0;
}

static void ops_free(ops_bufs_t *b)
{
    free(b->expand_x), free(b->dyn), free(b->assist), free(b->tok), free(b->counts);
    free(b->escales);
}

static megamoe_status_t ops_combine(ops_bufs_t *b, megamoe_comm_t *comm)
{
    megamoe_combine_v2_args_t c = megamoe_combine_v2_args_default();
    c.expand_x = b->d.expand_x, c.expert_ids = b->d.expert_ids;
    c.assist_info_for_combine = b->d.assist_info_for_combine;
    c.ep_send_counts = b->d.ep_recv_counts;
    c.expert_scales = tens(b->ws, MEGAMOE_DTYPE_FP32, BS, OK_);
    c.group_ep = comm, c.ep_world_size = mm_test_world(), c.ep_rank_id = mm_test_rank();
    c.moe_expert_num = OE;
    megamoe_status_t st = megamoe_combine_v2_infer(&c);
    if (st != MEGAMOE_OK) return st;
    c.x.data = b->out;
    return megamoe_combine_v2(&c);
}

/* in_combine: the fault lands in combine (dispatch clean) or in dispatch. */
static void ops_case(unsigned op, int in_combine, int lose)
{
    const int me = mm_test_rank();
    FAULTY = 1;
    LOSE = lose;
    megamoe_comm_t *comm = mm_test_comm();
    ASSERT_TRUE(comm != NULL);
    static ops_bufs_t clean, faulty;
    ASSERT_EQ_INT(ops_setup(&clean, comm), 0);
    ASSERT_EQ_INT(ops_setup(&faulty, comm), 0);
    unsigned long n[2] = {0, 0};
    if (me == FAULTY) mm_shmem_test_fail_rma(op, LONG_MAX, lose);
    ASSERT_OK(megamoe_dispatch_v2(&clean.d));
    if (me == FAULTY) n[0] = mm_shmem_test_rma_count(op), mm_shmem_test_fail_rma(op, LONG_MAX, lose);
    ASSERT_OK(ops_combine(&clean, comm));
    if (me == FAULTY) {
        n[1] = mm_shmem_test_rma_count(op);
        fprintf(stderr, "  rank %d made %lu / %lu transfers of the kind in dispatch / combine\n",
                me, n[0], n[1]);
        ASSERT_TRUE(n[in_combine] > 0);
    }
    if (me == FAULTY) mm_shmem_test_fail_rma(op, in_combine ? LONG_MAX : (long)n[0] / 2, lose);
    megamoe_status_t st = megamoe_dispatch_v2(&faulty.d);
    if (!in_combine) {
        ASSERT_TRUE(failed_as_expected(st, "dispatch_v2"));
    } else {
        ASSERT_OK(st);
        ASSERT_TRUE(memcmp(clean.expand_x, faulty.expand_x,
                           (size_t)(clean.d.expand_x.shape[0] * OH) * 2) == 0);
        if (me == FAULTY) mm_shmem_test_fail_rma(op, (long)n[1] / 2, lose);
        ASSERT_TRUE(failed_as_expected(ops_combine(&faulty, comm), "combine_v2"));
    }
    if (me == FAULTY) mm_shmem_test_fail_rma(0, 0, 0);
    if (!lose) { /* transient: the operators work on, bit for bit */
        static ops_bufs_t again;
        ASSERT_EQ_INT(ops_setup(&again, comm), 0);
        ASSERT_OK(megamoe_dispatch_v2(&again.d));
        ASSERT_OK(ops_combine(&again, comm));
        ASSERT_TRUE(memcmp(clean.out, again.out, sizeof clean.out) == 0);
        ops_free(&again);
    }
    ops_free(&clean);
    ops_free(&faulty);
}

MM_TEST(ops_dispatch_put) { ops_case(MM_SHMEM_RMA_PUT, 0, 0); }
MM_TEST(ops_dispatch_put_lost) { ops_case(MM_SHMEM_RMA_PUT, 0, 1); }
MM_TEST(ops_dispatch_signal) { ops_case(MM_SHMEM_RMA_SIGNAL, 0, 0); }
MM_TEST(ops_combine_put) { ops_case(MM_SHMEM_RMA_PUT, 1, 0); }
MM_TEST(ops_combine_fence) { ops_case(MM_SHMEM_RMA_FENCE, 1, 0); }
