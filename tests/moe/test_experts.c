/* MegaMoeExperts against the fp32 reference, run by `megamoe launch -n EP` (EP 2 and 4), built
 * once per schedule (MM_TEST_SCHEDULE "O1" = the default, "O0"):
 * the seed's four routing patterns x (lossless, factor 1.5, forced overflow); sharing with two
 * outstanding forwards; close twice / in any order; use after close; settings that differ
 * between ranks; input variants (int64 ids, bf16 router weights, histograms, swiglu_limit). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "moe_check.h"
#include "ops/ep_exchange.h"
#include "ops/ep_route.h"

#define T_ 128
#define H_ 64
#define I_ 32
#define E_ 8
#define K_ 2
#ifndef MM_TEST_SCHEDULE
#define MM_TEST_SCHEDULE "O1"
#endif

static megamoe_experts_params_t mm_params(double factor)
{
    megamoe_experts_params_t p = mm_params_shape(T_, H_, I_, E_, K_);
    p.expert_capacity_factor = factor;
    p.schedule = MM_TEST_SCHEDULE;
    p.workers = 2; /* two threads per rank: exercises the column split (O0) and a cube plus a
                      vector worker (O1) even on 2 cores */
    return p;
}

/* Forward + backward of layer x on this rank, compared with the reference. */
static void mm_fwd_bwd_check(megamoe_experts_t *x, const mm_moe_problem_t *P, float limit,
                             const mm_call_opts_t *o, const char *what)
{
    const int me = mm_test_rank();
    mm_ref_result_t ref;
    ASSERT_EQ_INT(mm_ref_compute(P, limit, &ref), 0);
    mm_input_buf_t ib;
    ASSERT_EQ_INT(mm_input_make(P, me, o, &ib), 0);
    mm_run_t b;
    ASSERT_EQ_INT(mm_run_alloc(&b, P), 0);
    megamoe_experts_weights_t w = mm_local_weights(P, me, 1);
    megamoe_experts_saved_t *sv = NULL;
    ASSERT_OK(megamoe_experts_forward(x, &w, &ib.in, b.out, &sv));
    megamoe_experts_grads_t g = {b.gh, b.gp, b.g1, b.g2, MEGAMOE_DTYPE_BF16};
    ASSERT_OK(megamoe_experts_backward(x, sv, &w, P->grad_out + (size_t)me * T_ * H_, &g));
    megamoe_experts_saved_destroy(sv);
    mm_layer_result_t res;
    ASSERT_EQ_INT(mm_layer_result_from(P, b.out, b.gh, b.gp, o && o->probs_bf16, b.g1, b.g2, &res),
                  0);
    int ok = mm_compare(what, P, me, &res, &ref);
    mm_layer_result_free(&res);
    mm_run_free(&b);
    mm_input_free(&ib);
    mm_ref_free(&ref);
    ASSERT_TRUE(ok);
}

/* One routing pattern in the three capacity modes. */
static void mm_pattern_case(mm_route_pattern_t route)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    ASSERT_TRUE(comm != NULL);
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, route, 42 + route), 0);

    /* lossless and factor 1.5: 1.5 must either fit or overflow on every rank, as the counts say */
    const double factors[2] = {0, 1.5};
    for (int f = 0; f < 2; f++) {
        char what[64];
        snprintf(what, sizeof what, "%s ep%d factor %g", mm_route_name(route), ep, factors[f]);
        megamoe_experts_params_t prm = mm_params(factors[f]);
        megamoe_experts_t *x = NULL;
        ASSERT_OK(megamoe_experts_create(comm, &prm, &x));
        int64_t cap = megamoe_experts_capacity_rows(ep, T_, K_, factors[f]), max_recv = 0;
        for (int d = 0; d < ep; d++) {
            int64_t r = mm_moe_problem_recv_rows(&P, d);
            if (r > max_recv) max_recv = r;
        }
        if (max_recv <= cap) {
            mm_fwd_bwd_check(x, &P, 0.0f, NULL, what);
        } else {
            mm_input_buf_t ib;
            ASSERT_EQ_INT(mm_input_make(&P, me, NULL, &ib), 0);
            uint16_t *out = calloc((size_t)T_ * H_, 2);
            megamoe_experts_weights_t w = mm_local_weights(&P, me, 1);
            megamoe_experts_saved_t *sv = NULL;
            ASSERT_STATUS(megamoe_experts_forward(x, &w, &ib.in, out, &sv),
                          MEGAMOE_CAPACITY_OVERFLOW);
            ASSERT_CONTAINS(megamoe_last_error(), "capacity overflow");
            ASSERT_TRUE(sv == NULL);
            for (int i = 0; i < T_ * H_; i++) ASSERT_EQ_INT(out[i], 0); /* nothing written */
            free(out);
            mm_input_free(&ib);
        }
        ASSERT_OK(megamoe_experts_close(x));
        megamoe_experts_destroy(x);
    }

    /* forced overflow: the last rank floods rank 0 with factor 1.0; every rank must raise it,
     * before any data moves, and the layer must stay usable */
    {
        mm_moe_problem_t F;
        ASSERT_EQ_INT(mm_moe_problem_create(&F, ep, T_, H_, I_, E_, K_, route, 42 + route), 0);
        mm_moe_problem_route(&F, MM_ROUTE_FLOOD, 7);
        megamoe_experts_params_t prm = mm_params(1.0);
        megamoe_experts_t *x = NULL;
        ASSERT_OK(megamoe_experts_create(comm, &prm, &x));
        mm_input_buf_t ib;
        ASSERT_EQ_INT(mm_input_make(&F, me, NULL, &ib), 0);
        uint16_t *out = calloc((size_t)T_ * H_, 2);
        megamoe_experts_weights_t w = mm_local_weights(&F, me, 1);
        megamoe_experts_saved_t *sv = NULL;
        ASSERT_STATUS(megamoe_experts_forward(x, &w, &ib.in, out, &sv), MEGAMOE_CAPACITY_OVERFLOW);
        ASSERT_CONTAINS(megamoe_last_error(), "rank 0 would receive");
        ASSERT_CONTAINS(megamoe_last_error(), "expert_capacity_factor");
        for (int i = 0; i < T_ * H_; i++) ASSERT_EQ_INT(out[i], 0);
        free(out);
        mm_input_free(&ib);
        /* the same layer then runs a routing that fits */
        mm_moe_problem_route(&F, MM_ROUTE_BALANCED, 9);
        char what[64];
        snprintf(what, sizeof what, "%s ep%d after overflow", mm_route_name(route), ep);
        mm_fwd_bwd_check(x, &F, 0.0f, NULL, what);
        ASSERT_OK(megamoe_experts_close(x));
        megamoe_experts_destroy(x);
        mm_moe_problem_free(&F);
    }
    mm_moe_problem_free(&P);
}

MM_TEST(route_balanced) { mm_pattern_case(MM_ROUTE_BALANCED); }
MM_TEST(route_zero_token_experts) { mm_pattern_case(MM_ROUTE_ZERO); }
MM_TEST(route_skewed) { mm_pattern_case(MM_ROUTE_SKEW); }
MM_TEST(route_single_destination) { mm_pattern_case(MM_ROUTE_SINGLE); }

static int mm_cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* A swiglu_limit that clamps the largest ~2% of the gate / |up| pre-activations but has no
 * value within 1% of it: at the boundary itself a bf16 layer (which clamps bf16(g)) and the
 * fp32 oracle (which clamps g) may legitimately decide differently. 0 when none exists. */
static float mm_pick_limit(const mm_moe_problem_t *P)
{
    const int64_t N = P->ep * P->T, H = P->H, I = P->I, K = P->K;
    size_t n = 0, cap = (size_t)(N * K * 2 * I);
    double *v = malloc(cap * sizeof *v);
    if (v == NULL) return 0;
    for (int64_t t = 0; t < N; t++)
        for (int64_t k = 0; k < K; k++) {
            const uint16_t *w = P->gate_up + (size_t)P->ids[t * K + k] * (size_t)(H * 2 * I);
            for (int64_t c = 0; c < 2 * I; c++) {
                double h = 0;
                for (int64_t j = 0; j < H; j++)
                    h += (double)megamoe_bf16_to_fp32(P->hidden[t * H + j]) *
                         (double)megamoe_bf16_to_fp32(w[j * 2 * I + c]);
                if (c >= I) h = fabs(h); /* up is clamped on both sides */
                if (h > 0) v[n++] = h;
            }
        }
    qsort(v, n, sizeof *v, mm_cmp_desc);
    size_t best = 0;
    double ratio = 1;
    for (size_t i = 4; i + 1 < n && i < n / 50; i++)
        if (v[i] / v[i + 1] > ratio) {
            ratio = v[i] / v[i + 1];
            best = i;
        }
    float limit = ratio > 1.02 ? (float)sqrt(v[best] * v[best + 1]) : 0.0f;
    free(v);
    return limit;
}

/* Peers that are not load/store reachable (another host): every row through mm_shmem_put and
 * the backward's staging buffer; same results. */
MM_TEST(rows_through_shmem_put)
{
    mm_ep_force_puts = 1;
    mm_pattern_case(MM_ROUTE_SKEW);
    mm_ep_force_puts = 0;
}

MM_TEST(input_variants_and_swiglu_limit)
{
    const int ep = mm_test_world();
    megamoe_comm_t *comm = mm_test_comm();
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, MM_ROUTE_SKEW, 5), 0);
    /* bf16 router weights: give the reference the same (rounded) values */
    for (int64_t i = 0; i < ep * T_ * K_; i++)
        P.probs[i] = megamoe_bf16_to_fp32(megamoe_fp32_to_bf16(P.probs[i]));
    megamoe_experts_params_t prm = mm_params(0);
    float limit = mm_pick_limit(&P);
    ASSERT_TRUE(limit > 0);
    prm.swiglu_limit = limit;
    megamoe_experts_t *x = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &prm, &x));
    mm_call_opts_t o1 = {1, 1, 2};
    mm_fwd_bwd_check(x, &P, limit, &o1, "int64 ids, bf16 probs, int64 histogram, swiglu_limit");
    mm_call_opts_t o2 = {0, 0, 1};
    mm_fwd_bwd_check(x, &P, limit, &o2, "int32 histogram, swiglu_limit");
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    mm_moe_problem_free(&P);
}

MM_TEST(inference_forward_matches_training_forward_and_weights_refresh)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, MM_ROUTE_BALANCED, 11), 0);
    megamoe_experts_params_t prm = mm_params(0);
    megamoe_experts_t *x = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &prm, &x));
    mm_input_buf_t ib;
    ASSERT_EQ_INT(mm_input_make(&P, me, NULL, &ib), 0);
    uint16_t *o1 = malloc((size_t)T_ * H_ * 2), *o2 = malloc((size_t)T_ * H_ * 2);
    megamoe_experts_weights_t w = mm_local_weights(&P, me, 1);
    megamoe_experts_saved_t *sv = NULL;
    ASSERT_OK(megamoe_experts_forward(x, &w, &ib.in, o1, &sv));
    ASSERT_OK(megamoe_experts_forward(x, &w, &ib.in, o2, NULL));
    ASSERT_TRUE(memcmp(o1, o2, (size_t)T_ * H_ * 2) == 0);
    megamoe_experts_saved_destroy(sv); /* a forward that never gets a backward */

    /* "optimizer step": change the weights in place and bump the version -> re-packed */
    for (int64_t i = 0; i < E_ * H_ * 2 * I_; i++)
        P.gate_up[i] = megamoe_fp32_to_bf16(megamoe_bf16_to_fp32(P.gate_up[i]) * 0.5f + 0.01f);
    for (int64_t i = 0; i < E_ * I_ * H_; i++)
        P.down[i] = megamoe_fp32_to_bf16(-megamoe_bf16_to_fp32(P.down[i]));
    mm_ref_result_t ref;
    ASSERT_EQ_INT(mm_ref_compute(&P, 0, &ref), 0);
    w = mm_local_weights(&P, me, 2);
    ASSERT_OK(megamoe_experts_forward(x, &w, &ib.in, o1, NULL));
    float *f = malloc((size_t)T_ * H_ * 4);
    megamoe_convert(f, MEGAMOE_DTYPE_FP32, o1, MEGAMOE_DTYPE_BF16, (size_t)T_ * H_);
    int ok = mm_close_bf16("output after a weight update", f, ref.out + (size_t)me * T_ * H_,
                           ref.out16 + (size_t)me * T_ * H_, (size_t)T_ * H_, 0);
    free(f);
    mm_ref_free(&ref);
    free(o1);
    free(o2);
    mm_input_free(&ib);
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    mm_moe_problem_free(&P);
    ASSERT_TRUE(ok);
}

/* Two layers sharing one resource group, two outstanding forwards (different routing and
 * weights), backwards in reverse order; then the same layer with two outstanding forwards. */
MM_TEST(shared_layers_with_outstanding_forwards)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    mm_moe_problem_t P[2];
    ASSERT_EQ_INT(mm_moe_problem_create(&P[0], ep, T_, H_, I_, E_, K_, MM_ROUTE_SKEW, 21), 0);
    ASSERT_EQ_INT(mm_moe_problem_create(&P[1], ep, T_, H_, I_, E_, K_, MM_ROUTE_ZERO, 22), 0);
    megamoe_experts_params_t prm = mm_params(0);
    megamoe_experts_t *x[2] = {NULL, NULL};
    ASSERT_OK(megamoe_experts_create(comm, &prm, &x[0]));
    ASSERT_OK(megamoe_experts_create(comm, &prm, &x[1]));
    ASSERT_OK(megamoe_experts_share(x, 2));
    megamoe_experts_info_t info;
    ASSERT_OK(megamoe_experts_get_info(x[1], &info));
    ASSERT_EQ_INT(info.group_layers, 2);

    int all_ok = 1; /* no early return between collectives: a failure on one rank only
                       must not leave the others waiting */
    for (int round = 0; round < 2; round++) {
        /* round 0: layer 0 and layer 1; round 1: layer 0 twice (routing changes between) */
        megamoe_experts_t *lx[2] = {x[0], round == 0 ? x[1] : x[0]};
        mm_ref_result_t ref[2];
        mm_input_buf_t ib[2];
        mm_run_t b[2];
        megamoe_experts_saved_t *sv[2] = {NULL, NULL};
        megamoe_experts_weights_t w[2];
        for (int i = 0; i < 2; i++) {
            ASSERT_EQ_INT(mm_ref_compute(&P[i], 0, &ref[i]), 0);
            ASSERT_EQ_INT(mm_input_make(&P[i], me, NULL, &ib[i]), 0);
            ASSERT_EQ_INT(mm_run_alloc(&b[i], &P[i]), 0);
            w[i] = mm_local_weights(&P[i], me, 100 + (uint64_t)i);
        }
        for (int i = 0; i < 2; i++)
            ASSERT_OK(megamoe_experts_forward(lx[i], &w[i], &ib[i].in, b[i].out, &sv[i]));
        for (int i = 1; i >= 0; i--) {
            megamoe_experts_grads_t g = {b[i].gh, b[i].gp, b[i].g1, b[i].g2, MEGAMOE_DTYPE_BF16};
            ASSERT_OK(megamoe_experts_backward(lx[i], sv[i], &w[i],
                                               P[i].grad_out + (size_t)me * T_ * H_, &g));
            megamoe_experts_saved_destroy(sv[i]);
        }
        for (int i = 0; i < 2; i++) {
            mm_layer_result_t res;
            ASSERT_EQ_INT(mm_layer_result_from(&P[i], b[i].out, b[i].gh, b[i].gp, 0, b[i].g1,
                                               b[i].g2, &res),
                          0);
            char what[64];
            snprintf(what, sizeof what, "round %d call %d", round, i);
            all_ok &= mm_compare(what, &P[i], me, &res, &ref[i]);
            mm_layer_result_free(&res);
            mm_run_free(&b[i]);
            mm_input_free(&ib[i]);
            mm_ref_free(&ref[i]);
        }
    }
    /* backward with a saved state of another layer is refused on every rank */
    {
        mm_input_buf_t ib;
        ASSERT_EQ_INT(mm_input_make(&P[0], me, NULL, &ib), 0);
        mm_run_t b;
        ASSERT_EQ_INT(mm_run_alloc(&b, &P[0]), 0);
        megamoe_experts_weights_t w = mm_local_weights(&P[0], me, 100);
        megamoe_experts_saved_t *sv = NULL;
        ASSERT_OK(megamoe_experts_forward(x[0], &w, &ib.in, b.out, &sv));
        megamoe_experts_grads_t g = {b.gh, b.gp, b.g1, b.g2, MEGAMOE_DTYPE_BF16};
        ASSERT_STATUS(megamoe_experts_backward(x[1], sv, &w, P[0].grad_out, &g),
                      MEGAMOE_INVALID_ARGUMENT);
        ASSERT_CONTAINS(megamoe_last_error(), "another MegaMoeExperts layer");
        megamoe_experts_saved_destroy(sv);
        mm_run_free(&b);
        mm_input_free(&ib);
    }
    /* sharing after the first forward is refused */
    ASSERT_STATUS(megamoe_experts_share(x, 2), MEGAMOE_INVALID_STATE);
    ASSERT_CONTAINS(megamoe_last_error(), "before the first forward");
    ASSERT_OK(megamoe_experts_close(x[1]));
    ASSERT_OK(megamoe_experts_close(x[0]));
    megamoe_experts_destroy(x[0]);
    megamoe_experts_destroy(x[1]);
    mm_moe_problem_free(&P[0]);
    mm_moe_problem_free(&P[1]);
    ASSERT_TRUE(all_ok);
}

MM_TEST(close_twice_any_order_and_use_after_close)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, MM_ROUTE_BALANCED, 3), 0);
    megamoe_experts_params_t prm = mm_params(0);
    megamoe_experts_t *x[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) ASSERT_OK(megamoe_experts_create(comm, &prm, &x[i]));
    ASSERT_OK(megamoe_experts_share(x + 1, 2)); /* group {1, 2}; layer 0 alone */
    mm_input_buf_t ib;
    ASSERT_EQ_INT(mm_input_make(&P, me, NULL, &ib), 0);
    mm_run_t b;
    ASSERT_EQ_INT(mm_run_alloc(&b, &P), 0);
    megamoe_experts_weights_t w = mm_local_weights(&P, me, 1);
    for (int i = 0; i < 3; i++) ASSERT_OK(megamoe_experts_forward(x[i], &w, &ib.in, b.out, NULL));
    /* not the creation order, and a group closed from its second layer first */
    ASSERT_OK(megamoe_experts_close(x[2]));
    ASSERT_OK(megamoe_experts_close(x[0]));
    ASSERT_OK(megamoe_experts_close(x[0])); /* idempotent */
    /* layer 1 still works although its group partner is closed */
    ASSERT_OK(megamoe_experts_forward(x[1], &w, &ib.in, b.out, NULL));
    ASSERT_OK(megamoe_experts_close(x[1]));
    ASSERT_OK(megamoe_experts_close(x[1]));
    megamoe_experts_saved_t *sv = NULL;
    ASSERT_STATUS(megamoe_experts_forward(x[0], &w, &ib.in, b.out, &sv), MEGAMOE_INVALID_STATE);
    ASSERT_CONTAINS(megamoe_last_error(), "after close");
    megamoe_experts_grads_t g = {b.gh, b.gp, b.g1, b.g2, MEGAMOE_DTYPE_BF16};
    ASSERT_STATUS(megamoe_experts_backward(x[1], sv, &w, P.grad_out, &g), MEGAMOE_INVALID_STATE);
    ASSERT_STATUS(megamoe_experts_share(x, 1), MEGAMOE_INVALID_STATE);
    megamoe_experts_info_t info;
    ASSERT_OK(megamoe_experts_get_info(x[2], &info));
    ASSERT_EQ_INT(info.closed, 1);
    for (int i = 0; i < 3; i++) megamoe_experts_destroy(x[i]);
    mm_run_free(&b);
    mm_input_free(&ib);
    mm_moe_problem_free(&P);
}

MM_TEST(settings_that_differ_between_ranks)
{
    const int me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    megamoe_experts_t *x = NULL;
    megamoe_experts_params_t prm = mm_params(0);
    if (me == 1) prm.hidden_size = 2 * H_;
    ASSERT_STATUS(megamoe_experts_create(comm, &prm, &x), MEGAMOE_CONFIG_MISMATCH);
    ASSERT_CONTAINS(megamoe_last_error(), "hidden_size is 64 on rank 0 but 128 on rank 1");
    ASSERT_TRUE(x == NULL);
    prm = mm_params(me == mm_test_world() - 1 ? 1.25 : 0);
    ASSERT_STATUS(megamoe_experts_create(comm, &prm, &x), MEGAMOE_CONFIG_MISMATCH);
    ASSERT_CONTAINS(megamoe_last_error(), "expert_capacity_factor");
    /* an invalid setting on one rank only: every rank gets that rank's error */
    prm = mm_params(0);
    if (me == 1) prm.top_k = E_ + 1;
    ASSERT_STATUS(megamoe_experts_create(comm, &prm, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "rank 1");
    ASSERT_CONTAINS(megamoe_last_error(), "top_k");
    /* share called differently on the ranks */
    prm = mm_params(0);
    megamoe_experts_t *y[2] = {NULL, NULL};
    ASSERT_OK(megamoe_experts_create(comm, &prm, &y[0]));
    ASSERT_OK(megamoe_experts_create(comm, &prm, &y[1]));
    ASSERT_STATUS(megamoe_experts_share(y, me == 0 ? 2 : 1), MEGAMOE_CALL_MISMATCH);
    ASSERT_CONTAINS(megamoe_last_error(), "share_execution_resources of layers #");
    for (int i = 0; i < 2; i++) {
        ASSERT_OK(megamoe_experts_close(y[i]));
        megamoe_experts_destroy(y[i]);
    }
    /* the world still works afterwards */
    ASSERT_OK(megamoe_comm_barrier(comm));
}

MM_TEST(invalid_settings_name_the_rule)
{
    megamoe_comm_t *comm = mm_test_comm();
    megamoe_experts_t *x = NULL;
    megamoe_experts_params_t p = mm_params(0);
    p.local_num_tokens = 100;
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "multiple of 128");
    p = mm_params(0);
    p.num_experts = 3 * mm_test_world() + 1;
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "multiple of the EP size");
    p = mm_params(0.5);
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), ">= 1");
    p = mm_params(NAN);
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    p = mm_params(0);
    p.swiglu_limit = -1.0f;
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "swiglu_limit");
    p = mm_params(0);
    p.schedule = "O7";
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "\"O1\"");
    p = mm_params(0);
    p.schedule = "O1";
    p.cube_workers = 1;
    p.vector_workers = 2; /* sum 3 != workers 2 */
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "cube_workers");
    ASSERT_STATUS(megamoe_experts_create(comm, NULL, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_TRUE(x == NULL);
    ASSERT_EQ_INT(megamoe_experts_capacity_rows(2, 1024, 2, 0), 4096);
    ASSERT_EQ_INT(megamoe_experts_capacity_rows(2, 128, 2, 1.5), 384);
    ASSERT_EQ_INT(megamoe_experts_capacity_rows(4, 128, 3, 1.01), 512); /* ceil(387.84)=388 */
    ASSERT_EQ_INT(megamoe_experts_capacity_rows(2, 128, 2, 0.5), 0);
}

MM_TEST(bad_inputs_fail_on_every_rank_before_data_moves)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, MM_ROUTE_BALANCED, 8), 0);
    megamoe_experts_params_t prm = mm_params(0);
    megamoe_experts_t *x = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &prm, &x));
    megamoe_experts_weights_t w = mm_local_weights(&P, me, 1);
    uint16_t *out = calloc((size_t)T_ * H_, 2);
    /* an expert id out of range on the last rank only */
    if (me == ep - 1) P.ids[(size_t)me * T_ * K_ + 5] = E_;
    mm_input_buf_t ib;
    ASSERT_EQ_INT(mm_input_make(&P, me, NULL, &ib), 0);
    ASSERT_STATUS(megamoe_experts_forward(x, &w, &ib.in, out, NULL), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "not a global expert id");
    for (int i = 0; i < T_ * H_; i++) ASSERT_EQ_INT(out[i], 0);
    mm_input_free(&ib);
    mm_moe_problem_route(&P, MM_ROUTE_BALANCED, 8);
    /* a wrong histogram on one rank: the layer routes by it, so it is refused on every rank
     * before data moves even without MEGAMOE_CHECK (which names the first differing entry) */
    mm_call_opts_t o = {0, 0, 1};
    ASSERT_EQ_INT(mm_input_make(&P, me, &o, &ib), 0);
    if (me == ep - 1) {
        ((int32_t *)ib.tpe)[0] += 1;
        ((int32_t *)ib.tpe)[1] -= 1;
    }
    ASSERT_STATUS(megamoe_experts_forward(x, &w, &ib.in, out, NULL), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "tokens_per_expert[1]");
    ASSERT_CONTAINS(megamoe_last_error(), "route more slots to expert 1");
    for (int i = 0; i < T_ * H_; i++) ASSERT_EQ_INT(out[i], 0);
    setenv("MEGAMOE_CHECK", "1", 1);
    ASSERT_STATUS(megamoe_experts_forward(x, &w, &ib.in, out, NULL), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "tokens_per_expert[0]");
    ASSERT_CONTAINS(megamoe_last_error(), "MEGAMOE_CHECK=1");
    unsetenv("MEGAMOE_CHECK");
    /* entries that cannot be counts, and a sum other than T*K */
    const int32_t keep0 = ((int32_t *)ib.tpe)[0];
    ((int32_t *)ib.tpe)[0] = me == ep - 1 ? -1 : keep0;
    ASSERT_STATUS(megamoe_experts_forward(x, &w, &ib.in, out, NULL), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "tokens_per_expert[0] = -1 is not a slot count");
    ((int32_t *)ib.tpe)[0] = keep0 + (me == ep - 1 ? 5 : 0);
    ASSERT_STATUS(megamoe_experts_forward(x, &w, &ib.in, out, NULL), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "tokens_per_expert sums to");
    for (int i = 0; i < T_ * H_; i++) ASSERT_EQ_INT(out[i], 0);
    mm_input_free(&ib);
    /* missing weights */
    ASSERT_EQ_INT(mm_input_make(&P, me, NULL, &ib), 0);
    megamoe_experts_weights_t none = {NULL, NULL, 0};
    ASSERT_STATUS(megamoe_experts_forward(x, me == 0 ? &none : &w, &ib.in, out, NULL),
                  MEGAMOE_INVALID_ARGUMENT);
    /* and the layer still works */
    ASSERT_OK(megamoe_experts_forward(x, &w, &ib.in, out, NULL));
    mm_input_free(&ib);
    free(out);
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    mm_moe_problem_free(&P);
}

/* A given histogram is used instead of counting the ids again (the seed: the router's exact
 * histogram spares the bincount): no counting pass, the same bits as without it; with
 * MEGAMOE_CHECK=1 the ids are counted to verify it. */
MM_TEST(tokens_per_expert_is_used_instead_of_counting)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, MM_ROUTE_SKEW, 12), 0);
    megamoe_experts_params_t prm = mm_params(0);
    megamoe_experts_t *x = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &prm, &x));
    megamoe_experts_weights_t w = mm_local_weights(&P, me, 1);
    uint16_t *o[3];
    for (int i = 0; i < 3; i++) o[i] = calloc((size_t)T_ * H_, 2);
    mm_input_buf_t plain, with32, with64;
    mm_call_opts_t o32 = {0, 0, 1}, o64 = {1, 0, 2};
    ASSERT_EQ_INT(mm_input_make(&P, me, NULL, &plain), 0);
    ASSERT_EQ_INT(mm_input_make(&P, me, &o32, &with32), 0);
    ASSERT_EQ_INT(mm_input_make(&P, me, &o64, &with64), 0);
    uint64_t n0 = mm_ep_count_passes;
    ASSERT_OK(megamoe_experts_forward(x, &w, &plain.in, o[0], NULL));
    ASSERT_EQ_U64(mm_ep_count_passes, n0 + 1); /* counted */
    ASSERT_OK(megamoe_experts_forward(x, &w, &with32.in, o[1], NULL));
    ASSERT_OK(megamoe_experts_forward(x, &w, &with64.in, o[2], NULL));
    ASSERT_EQ_U64(mm_ep_count_passes, n0 + 1); /* used as given */
    setenv("MEGAMOE_CHECK", "1", 1);
    ASSERT_OK(megamoe_experts_forward(x, &w, &with32.in, o[1], NULL));
    unsetenv("MEGAMOE_CHECK");
    ASSERT_EQ_U64(mm_ep_count_passes, n0 + 2); /* verified by counting */
    ASSERT_TRUE(memcmp(o[0], o[1], (size_t)T_ * H_ * 2) == 0);
    ASSERT_TRUE(memcmp(o[0], o[2], (size_t)T_ * H_ * 2) == 0);
    for (int i = 0; i < 3; i++) free(o[i]);
    mm_input_free(&plain);
    mm_input_free(&with32);
    mm_input_free(&with64);
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    mm_moe_problem_free(&P);
}

/* NaN/Inf in hidden_states, topk_weights or grad_output of one rank: INVALID_ARGUMENT on every
 * rank before data moves, naming the element on the rank that has it; the output stays
 * untouched and the layer usable. MEGAMOE_CHECK_FINITE=0 lets the values through. */
MM_TEST(non_finite_inputs_fail_on_every_rank)
{
    const int ep = mm_test_world(), me = mm_test_rank(), bad = ep - 1;
    megamoe_comm_t *comm = mm_test_comm();
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, MM_ROUTE_BALANCED, 9), 0);
    megamoe_experts_params_t prm = mm_params(0);
    megamoe_experts_t *x = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &prm, &x));
    megamoe_experts_weights_t w = mm_local_weights(&P, me, 1);
    mm_run_t b;
    ASSERT_EQ_INT(mm_run_alloc(&b, &P), 0);
    memset(b.out, 0, (size_t)T_ * H_ * 2);
    uint16_t *hid = P.hidden + (size_t)me * T_ * H_;
    const uint16_t keep = hid[5 * H_ + 7];
    if (me == bad) hid[5 * H_ + 7] = 0x7fc1; /* a NaN */
    mm_input_buf_t ib;
    ASSERT_EQ_INT(mm_input_make(&P, me, NULL, &ib), 0);
    ASSERT_STATUS(megamoe_experts_forward(x, &w, &ib.in, b.out, NULL), MEGAMOE_INVALID_ARGUMENT);
    if (me == bad) ASSERT_CONTAINS(megamoe_last_error(), "hidden_states[5][7] is NaN");
    for (int i = 0; i < T_ * H_; i++) ASSERT_EQ_INT(b.out[i], 0);
    /* let through on request: the NaN reaches the output of its token */
    setenv("MEGAMOE_CHECK_FINITE", "0", 1);
    ASSERT_OK(megamoe_experts_forward(x, &w, &ib.in, b.out, NULL));
    unsetenv("MEGAMOE_CHECK_FINITE");
    if (me == bad) ASSERT_TRUE((b.out[5 * H_] & 0x7f80) == 0x7f80);
    hid[5 * H_ + 7] = keep;
    mm_input_free(&ib);
    /* +Inf in the last fp32 router weight */
    float *probs = P.probs + (size_t)me * T_ * K_;
    const float keep_p = probs[T_ * K_ - 1];
    if (me == bad) probs[T_ * K_ - 1] = INFINITY;
    ASSERT_EQ_INT(mm_input_make(&P, me, NULL, &ib), 0);
    ASSERT_STATUS(megamoe_experts_forward(x, &w, &ib.in, b.out, NULL), MEGAMOE_INVALID_ARGUMENT);
    if (me == bad) {
        char want[64];
        snprintf(want, sizeof want, "topk_weights[%d][%d] is +Inf", T_ - 1, K_ - 1);
        ASSERT_CONTAINS(megamoe_last_error(), want);
    }
    probs[T_ * K_ - 1] = keep_p;
    mm_input_free(&ib);
    /* -Inf in grad_output: the backward fails everywhere, the next one works */
    ASSERT_EQ_INT(mm_input_make(&P, me, NULL, &ib), 0);
    megamoe_experts_saved_t *sv = NULL;
    ASSERT_OK(megamoe_experts_forward(x, &w, &ib.in, b.out, &sv));
    uint16_t *dout = P.grad_out + (size_t)me * T_ * H_;
    const uint16_t keep_d = dout[3];
    if (me == bad) dout[3] = 0xff80;
    megamoe_experts_grads_t g = {b.gh, b.gp, b.g1, b.g2, MEGAMOE_DTYPE_BF16};
    ASSERT_STATUS(megamoe_experts_backward(x, sv, &w, dout, &g), MEGAMOE_INVALID_ARGUMENT);
    if (me == bad) ASSERT_CONTAINS(megamoe_last_error(), "grad_output[0][3] is -Inf");
    dout[3] = keep_d;
    ASSERT_OK(megamoe_experts_backward(x, sv, &w, dout, &g));
    megamoe_experts_saved_destroy(sv);
    mm_input_free(&ib);
    mm_run_free(&b);
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    mm_moe_problem_free(&P);
}

/* Backward with the saved states of two different forwards on different ranks (two outstanding
 * forwards, backwards in a different order per rank): the ranks' routing plans differ, so the
 * call must fail on every rank instead of computing gradients from mismatched rows (O0 used to
 * return OK with wrong gradients; O1 compares launch numbers). The layer stays usable. */
MM_TEST(backward_with_saved_states_of_different_forwards_fails_on_every_rank)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    mm_moe_problem_t P[2];
    ASSERT_EQ_INT(mm_moe_problem_create(&P[0], ep, T_, H_, I_, E_, K_, MM_ROUTE_SKEW, 31), 0);
    ASSERT_EQ_INT(mm_moe_problem_create(&P[1], ep, T_, H_, I_, E_, K_, MM_ROUTE_BALANCED, 32), 0);
    megamoe_experts_params_t prm = mm_params(0);
    megamoe_experts_t *x = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &prm, &x));
    mm_input_buf_t ib[2];
    mm_run_t b[2];
    megamoe_experts_saved_t *sv[2] = {NULL, NULL};
    megamoe_experts_weights_t w = mm_local_weights(&P[0], me, 1);
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ_INT(mm_input_make(&P[i], me, NULL, &ib[i]), 0);
        ASSERT_EQ_INT(mm_run_alloc(&b[i], &P[i]), 0);
        ASSERT_OK(megamoe_experts_forward(x, &w, &ib[i].in, b[i].out, &sv[i]));
    }
    const uint16_t *dout = P[0].grad_out + (size_t)me * T_ * H_;
    megamoe_experts_grads_t g = {b[0].gh, b[0].gp, b[0].g1, b[0].g2, MEGAMOE_DTYPE_BF16};
    memset(b[0].gh, 0x7f, (size_t)T_ * H_ * 2);
    ASSERT_STATUS(megamoe_experts_backward(x, sv[me == 0 ? 1 : 0], &w, dout, &g),
                  MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "same forward call");
    for (size_t i = 0; i < (size_t)T_ * H_; i++) ASSERT_EQ_INT(b[0].gh[i], 0x7f7f);
    /* the right pairing still works */
    ASSERT_OK(megamoe_experts_backward(x, sv[1], &w, dout, &g));
    ASSERT_OK(megamoe_experts_backward(x, sv[0], &w, dout, &g));
    for (int i = 0; i < 2; i++) {
        megamoe_experts_saved_destroy(sv[i]);
        mm_run_free(&b[i]);
        mm_input_free(&ib[i]);
    }
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    mm_moe_problem_free(&P[0]);
    mm_moe_problem_free(&P[1]);
}

/* Shapes whose sizes overflow 64-bit arithmetic are refused, not wrapped (T*K = 2^64 wrapped
 * to 0 and passed the EP*T*K < 2^31 rule; E = EP*2^40 made the first forward build an O1 task
 * table whose size wrapped). */
MM_TEST(huge_shapes_are_refused_without_overflow)
{
    megamoe_comm_t *comm = mm_test_comm();
    megamoe_experts_t *x = NULL;
    megamoe_experts_params_t p = mm_params(0);
    p.local_num_tokens = (int64_t)1 << 55;
    p.num_experts = 512;
    p.top_k = 512;
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "2^31");
    ASSERT_TRUE(x == NULL);
    p = mm_params(0);
    p.num_experts = (int64_t)mm_test_world() << 40; /* task and signal tables of E entries */
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "num_experts");
    ASSERT_TRUE(x == NULL);
}

/* MEGAMOE_GEMM is read once, when the layer (its resource group) is created: its workers never
 * read the environment, so a change afterwards (even to a word that is not accepted) changes
 * nothing, and a bad word fails creation on every rank. */
MM_TEST(gemm_backend_is_fixed_when_the_layer_is_created)
{
    const int ep = mm_test_world();
    megamoe_comm_t *comm = mm_test_comm();
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, MM_ROUTE_SKEW, 5), 0);
    megamoe_experts_params_t prm = mm_params(0);
    megamoe_experts_t *x = NULL;
    setenv("MEGAMOE_GEMM", "ref", 1);
    ASSERT_OK(megamoe_experts_create(comm, &prm, &x));
    setenv("MEGAMOE_GEMM", "no-such-backend", 1);
    mm_fwd_bwd_check(x, &P, 0.0f, NULL, "gemm fixed at creation");
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    x = NULL;
    ASSERT_STATUS(megamoe_experts_create(comm, &prm, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "MEGAMOE_GEMM");
    ASSERT_TRUE(x == NULL);
    unsetenv("MEGAMOE_GEMM");
    mm_moe_problem_free(&P);
}
