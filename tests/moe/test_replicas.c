/* Hot-expert replicas (replica_slots_per_rank) through MegaMoeExperts, run by
 * `megamoe launch -n EP` (EP 2 and 4), both schedules:
 *  - for the four routing patterns the output, grad hidden and grad router weights equal the
 *    layer without replicas bit for bit (they are row-wise), the weight gradients differ by at
 *    most one bf16 ulp (fp32 partials summed in another order) and (EP 2) pass the reference
 *    rule;
 *    balanced routing moves nothing (then everything is bit-identical); skewed routing moves
 *    rows and lowers the slowest rank's rows; every rank reports the same plan;
 *  - O0 and O1 with replicas give the same bits, run after run;
 *  - a bounded capacity that overflows without replicas fits with them;
 *  - changing routing, outstanding forwards, new weight versions (published and fetched
 *    again), shared execution resources, one-sided gets, fp32 weight gradients;
 *  - settings are checked and agreed; a failure on one rank reaches every rank.
 * Shapes are small so the whole file runs in seconds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_check.h"
#include "ops/ep_exchange.h"
#include "shmem/shmem.h"

#define T_ 384
#define H_ 80
#define I_ 48
#define E_ 8
#define K_ 3
#define R_ 2

static megamoe_experts_params_t mm_params(const char *schedule, int replicas, double factor)
{
    megamoe_experts_params_t p = mm_params_shape(T_, H_, I_, E_, K_);
    p.expert_capacity_factor = factor;
    p.schedule = schedule;
    p.workers = 2;
    p.replica_slots_per_rank = replicas;
    return p;
}

/* Ordered integer of a bf16 value (distance in ulps is a difference of these). */
static int32_t mm_bf16_ord(uint16_t v)
{
    return (v & 0x8000) ? -(int32_t)(v & 0x7fff) : (int32_t)v;
}

/* Compare two runs: output, grad hidden, grad router weights bit for bit; weight gradients
 * (bf16) within max_ulps (0: bit for bit) or, where a sum cancels, within 2^-20 of the
 * tensor's largest value (the fp32 rounding of partial sums of that size); fp32 weight
 * gradients within a relative 1e-5 of the largest value. */
static int mm_compare_runs(const char *what, const mm_run_t *a, const mm_run_t *b,
                           megamoe_dtype_t wg, int max_ulps)
{
    const int64_t L = E_ / mm_test_world();
    int ok = 1;
    if (memcmp(a->out, b->out, (size_t)T_ * H_ * 2) != 0) {
        fprintf(stderr, "%s: output differs\n", what);
        ok = 0;
    }
    if (memcmp(a->gh, b->gh, (size_t)T_ * H_ * 2) != 0) {
        fprintf(stderr, "%s: grad hidden differs\n", what);
        ok = 0;
    }
    if (memcmp(a->gp, b->gp, (size_t)T_ * K_ * 4) != 0) {
        fprintf(stderr, "%s: grad topk_weights differs\n", what);
        ok = 0;
    }
    const size_t n[2] = {(size_t)(L * H_ * 2 * I_), (size_t)(L * I_ * H_)};
    const void *x[2] = {a->g1, a->g2}, *y[2] = {b->g1, b->g2};
    for (int t = 0; t < 2; t++) {
        int worst = 0;
        double worst_rel = 0, scale = 0;
        size_t differ = 0;
        if (wg == MEGAMOE_DTYPE_FP32) {
            const float *p = x[t], *q = y[t];
            for (size_t i = 0; i < n[t]; i++)
                if (fabsf(q[i]) > scale) scale = fabsf(q[i]);
            for (size_t i = 0; i < n[t]; i++) {
                double d = fabs((double)p[i] - (double)q[i]) / (scale > 0 ? scale : 1);
                differ += p[i] != q[i];
                if (d > worst_rel) worst_rel = d;
            }
            if (max_ulps == 0 ? differ != 0 : worst_rel > 1e-5) ok = 0;
        } else {
            const uint16_t *p = x[t], *q = y[t];
            for (size_t i = 0; i < n[t]; i++) {
                float v = fabsf(megamoe_bf16_to_fp32(q[i]));
                if (v > scale) scale = v;
            }
            for (size_t i = 0; i < n[t]; i++) {
                int d = abs(mm_bf16_ord(p[i]) - mm_bf16_ord(q[i]));
                double ad = fabs((double)megamoe_bf16_to_fp32(p[i]) - megamoe_bf16_to_fp32(q[i]));
                differ += d != 0;
                if (d > worst) worst = d;
                if (ad / (scale > 0 ? scale : 1) > worst_rel) worst_rel = ad / (scale > 0 ? scale : 1);
                if (d > max_ulps && (max_ulps == 0 || ad > scale * 0x1p-20)) ok = 0;
            }
        }
        printf("%s %s: %s: %zu of %zu weight-gradient values differ (worst %d ulp, %.2g rel)\n",
               ok ? "PASS" : "FAIL", what, t ? "grad down" : "grad gate_up", differ, n[t], worst,
               worst_rel);
    }
    return ok;
}

/* Every rank's view of the last plan equals rank 0's. */
static int mm_same_plan_everywhere(megamoe_experts_t *x)
{
    megamoe_experts_info_t info;
    if (megamoe_experts_get_info(x, &info) != MEGAMOE_OK) return 0;
    enum { MAXR = 64 };
    megamoe_experts_replica_t mine[MAXR];
    size_t n = 0;
    memset(mine, 0, sizeof mine);
    if (megamoe_experts_get_replicas(x, mine, MAXR, &n) != MEGAMOE_OK || n > MAXR) return 0;
    if ((int)n != info.last_guests) return 0;
    struct {
        int64_t guests, moved, plain, max;
        megamoe_experts_replica_t r[MAXR];
    } me_v, *all;
    memset(&me_v, 0, sizeof me_v);
    me_v.guests = info.last_guests;
    me_v.moved = info.last_rows_moved;
    me_v.plain = info.last_max_rows_plain;
    me_v.max = info.last_max_rows;
    memcpy(me_v.r, mine, sizeof mine);
    const int ep = mm_test_world();
    all = calloc((size_t)ep, sizeof *all);
    if (all == NULL) return 0;
    int ok = mm_shmem_team_allgather(mm_shmem_team_world(), all, &me_v, sizeof me_v) == MEGAMOE_OK;
    for (int r = 1; ok && r < ep; r++) ok = memcmp(&all[r], &all[0], sizeof me_v) == 0;
    free(all);
    return ok;
}

static void mm_print_plan(const char *what, megamoe_experts_t *x)
{
    megamoe_experts_info_t info;
    megamoe_experts_get_info(x, &info);
    printf("%s: %d guests, %lld rows moved, slowest rank %lld -> %lld rows\n", what,
           info.last_guests, (long long)info.last_rows_moved, (long long)info.last_max_rows_plain,
           (long long)info.last_max_rows);
}

/* Replicas vs none for one routing pattern, both schedules. */
static void mm_pattern_case(mm_route_pattern_t route)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    ASSERT_TRUE(comm != NULL);
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, route, 40 + route), 0);
    /* the reference once at EP 2 (at EP 4 the layer without replicas, which test_experts
     * checks against it, is the yardstick: it costs most of this file's time there) */
    mm_ref_result_t ref;
    memset(&ref, 0, sizeof ref);
    if (ep == 2) ASSERT_EQ_INT(mm_ref_compute(&P, 0, &ref), 0);
    const char *scheds[2] = {"O0", "O1"};
    int all_ok = 1;
    for (int si = 0; si < 2; si++) {
        megamoe_experts_t *x0 = NULL, *xr = NULL;
        megamoe_experts_params_t p0 = mm_params(scheds[si], 0, 0), pr = mm_params(scheds[si], R_, 0);
        ASSERT_OK(megamoe_experts_create(comm, &p0, &x0));
        ASSERT_OK(megamoe_experts_create(comm, &pr, &xr));
        mm_run_t a, b;
        ASSERT_EQ_INT(mm_run_alloc(&a, &P), 0);
        ASSERT_EQ_INT(mm_run_alloc(&b, &P), 0);
        ASSERT_OK(mm_run_fwd_bwd(x0, &P, me, NULL, MEGAMOE_DTYPE_BF16, &a));
        ASSERT_OK(mm_run_fwd_bwd(xr, &P, me, NULL, MEGAMOE_DTYPE_BF16, &b));
        megamoe_experts_info_t info;
        ASSERT_OK(megamoe_experts_get_info(xr, &info));
        ASSERT_EQ_INT(info.replica_slots, R_);
        char what[128];
        snprintf(what, sizeof what, "%s ep%d %s replicas %d vs none", mm_route_name(route), ep,
                 scheds[si], R_);
        mm_print_plan(what, xr);
        /* balanced: nothing to gain; skew and single: always worth it; zero: depends on the
         * shape (at EP 2 with K = 3 the zero-token experts are spread over both ranks) */
        if (route == MM_ROUTE_BALANCED) ASSERT_EQ_INT(info.last_guests, 0);
        if (route == MM_ROUTE_SKEW || route == MM_ROUTE_SINGLE) ASSERT_TRUE(info.last_guests > 0);
        if (info.last_guests == 0) {
            all_ok &= mm_compare_runs(what, &b, &a, MEGAMOE_DTYPE_BF16, 0);
        } else {
            ASSERT_TRUE(info.last_rows_moved > 0);
            ASSERT_TRUE(info.last_max_rows < info.last_max_rows_plain);
            all_ok &= mm_compare_runs(what, &b, &a, MEGAMOE_DTYPE_BF16, 1);
        }
        ASSERT_TRUE(mm_same_plan_everywhere(xr));
        if (ep == 2) {
            mm_layer_result_t got;
            ASSERT_EQ_INT(mm_layer_result_from(&P, b.out, b.gh, b.gp, 0, b.g1, b.g2, &got), 0);
            all_ok &= mm_compare(what, &P, me, &got, &ref);
            mm_layer_result_free(&got);
        }
        mm_run_free(&a);
        mm_run_free(&b);
        ASSERT_OK(megamoe_experts_close(x0));
        ASSERT_OK(megamoe_experts_close(xr));
        megamoe_experts_destroy(x0);
        megamoe_experts_destroy(xr);
    }
    mm_ref_free(&ref);
    mm_moe_problem_free(&P);
    ASSERT_TRUE(all_ok);
}

MM_TEST(replicas_balanced) { mm_pattern_case(MM_ROUTE_BALANCED); }
MM_TEST(replicas_zero_token_experts) { mm_pattern_case(MM_ROUTE_ZERO); }
MM_TEST(replicas_skewed) { mm_pattern_case(MM_ROUTE_SKEW); }
MM_TEST(replicas_single_destination) { mm_pattern_case(MM_ROUTE_SINGLE); }

/* O0 and O1 with replicas: the same bits (every product and sum in the same order), and O1
 * gives the same bits run after run in several worker configurations. */
MM_TEST(o0_and_o1_with_replicas_agree_bit_for_bit)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    const mm_route_pattern_t routes[2] = {MM_ROUTE_SKEW, MM_ROUTE_SINGLE};
    int all_ok = 1;
    for (int ri = 0; ri < 2; ri++) {
        mm_moe_problem_t P;
        ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, routes[ri], 7), 0);
        megamoe_experts_params_t p0 = mm_params("O0", R_, 0);
        megamoe_experts_t *x0 = NULL;
        ASSERT_OK(megamoe_experts_create(comm, &p0, &x0));
        mm_run_t ref;
        ASSERT_EQ_INT(mm_run_alloc(&ref, &P), 0);
        ASSERT_OK(mm_run_fwd_bwd(x0, &P, me, NULL, MEGAMOE_DTYPE_BF16, &ref));
        static const int cfg[][2] = {{1, 0}, {2, 1}, {0, 0}};
        for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
            megamoe_experts_params_t p1 = mm_params("O1", R_, 0);
            if (cfg[c][0] + cfg[c][1] > 0) {
                p1.workers = 0;
                p1.cube_workers = cfg[c][0];
                p1.vector_workers = cfg[c][1];
            }
            megamoe_experts_t *x1 = NULL;
            ASSERT_OK(megamoe_experts_create(comm, &p1, &x1));
            for (int rep = 0; rep < 2; rep++) {
                mm_run_t got;
                ASSERT_EQ_INT(mm_run_alloc(&got, &P), 0);
                ASSERT_OK(mm_run_fwd_bwd(x1, &P, me, NULL, MEGAMOE_DTYPE_BF16, &got));
                char what[128];
                snprintf(what, sizeof what, "%s ep%d O1 (cube %d, vector %d) run %d vs O0",
                         mm_route_name(routes[ri]), ep, cfg[c][0], cfg[c][1], rep);
                all_ok &= mm_compare_runs(what, &got, &ref, MEGAMOE_DTYPE_BF16, 0);
                mm_run_free(&got);
            }
            ASSERT_OK(megamoe_experts_close(x1));
            megamoe_experts_destroy(x1);
        }
        mm_run_free(&ref);
        ASSERT_OK(megamoe_experts_close(x0));
        megamoe_experts_destroy(x0);
        mm_moe_problem_free(&P);
    }
    ASSERT_TRUE(all_ok);
}

/* All tokens to rank 0: a bounded capacity overflows without replicas (every rank refuses
 * before data moves) and fits with them (the plan's receive counts are checked). */
MM_TEST(bounded_capacity_fits_with_replicas)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, MM_ROUTE_SINGLE, 3), 0);
    mm_ref_result_t ref;
    ASSERT_EQ_INT(mm_ref_compute(&P, 0, &ref), 0);
    const char *scheds[2] = {"O0", "O1"};
    for (int si = 0; si < 2; si++) {
        megamoe_experts_params_t p0 = mm_params(scheds[si], 0, 1.5), pr = mm_params(scheds[si], R_, 1.5);
        megamoe_experts_t *x0 = NULL, *xr = NULL;
        ASSERT_OK(megamoe_experts_create(comm, &p0, &x0));
        ASSERT_OK(megamoe_experts_create(comm, &pr, &xr));
        mm_run_t r;
        ASSERT_EQ_INT(mm_run_alloc(&r, &P), 0);
        ASSERT_STATUS(mm_run_fwd_bwd(x0, &P, me, NULL, MEGAMOE_DTYPE_BF16, &r),
                      MEGAMOE_CAPACITY_OVERFLOW);
        ASSERT_OK(mm_run_fwd_bwd(xr, &P, me, NULL, MEGAMOE_DTYPE_BF16, &r));
        megamoe_experts_info_t info;
        ASSERT_OK(megamoe_experts_get_info(xr, &info));
        ASSERT_TRUE(info.last_max_rows <= info.capacity);
        ASSERT_TRUE(info.last_max_rows_plain > info.capacity);
        mm_layer_result_t got;
        ASSERT_EQ_INT(mm_layer_result_from(&P, r.out, r.gh, r.gp, 0, r.g1, r.g2, &got), 0);
        char what[96];
        snprintf(what, sizeof what, "single ep%d %s factor 1.5 replicas %d", ep, scheds[si], R_);
        ASSERT_TRUE(mm_compare(what, &P, me, &got, &ref));
        mm_layer_result_free(&got);
        mm_run_free(&r);
        ASSERT_OK(megamoe_experts_close(x0));
        ASSERT_OK(megamoe_experts_close(xr));
        megamoe_experts_destroy(x0);
        megamoe_experts_destroy(xr);
    }
    mm_ref_free(&ref);
    mm_moe_problem_free(&P);
}

/* A sequence of calls whose routing (and weight-gradient dtype, and transport) changes, two
 * outstanding forwards whose guests differ, and new weight versions: always the bits of the
 * layer without replicas (weight gradients within one ulp). */
MM_TEST(changing_routing_weights_and_outstanding_forwards)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    const char *scheds[2] = {"O0", "O1"};
    int all_ok = 1;
    for (int si = 0; si < 2; si++) {
        megamoe_experts_t *x[2] = {NULL, NULL};
        megamoe_experts_params_t p0 = mm_params(scheds[si], 0, 0), pr = mm_params(scheds[si], R_, 0);
        ASSERT_OK(megamoe_experts_create(comm, &p0, &x[0]));
        ASSERT_OK(megamoe_experts_create(comm, &pr, &x[1]));
        static const mm_route_pattern_t seq[] = {MM_ROUTE_SKEW, MM_ROUTE_BALANCED, MM_ROUTE_SINGLE,
                                                 MM_ROUTE_ZERO, MM_ROUTE_SKEW, MM_ROUTE_SINGLE};
        for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
            mm_moe_problem_t P;
            ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, seq[i], 90 + i), 0);
            megamoe_dtype_t wg = i % 2 ? MEGAMOE_DTYPE_FP32 : MEGAMOE_DTYPE_BF16;
            mm_ep_force_puts = i == 4; /* puts and one-sided gets, every rank between calls */
            /* new values every call (a new problem): a new version, as the API says */
            megamoe_experts_weights_t w = mm_local_weights(&P, me, 100 + i);
            mm_run_t r[2];
            for (int s = 0; s < 2; s++) {
                ASSERT_EQ_INT(mm_run_alloc(&r[s], &P), 0);
                ASSERT_OK(mm_run_fwd_bwd(x[s], &P, me, &w, wg, &r[s]));
            }
            char what[128];
            snprintf(what, sizeof what, "%s call %zu (%s%s%s)", scheds[si], i,
                     mm_route_name(seq[i]), wg == MEGAMOE_DTYPE_FP32 ? ", fp32 grads" : "",
                     i == 4 ? ", puts/gets" : "");
            all_ok &= mm_compare_runs(what, &r[1], &r[0], wg, seq[i] == MM_ROUTE_BALANCED ? 0 : 1);
            mm_run_free(&r[0]);
            mm_run_free(&r[1]);
            mm_moe_problem_free(&P);
        }
        mm_ep_force_puts = 0;

        /* two outstanding forwards with different routing and guests, backwards reversed */
        mm_moe_problem_t Q[2];
        ASSERT_EQ_INT(mm_moe_problem_create(&Q[0], ep, T_, H_, I_, E_, K_, MM_ROUTE_SKEW, 5), 0);
        ASSERT_EQ_INT(mm_moe_problem_create(&Q[1], ep, T_, H_, I_, E_, K_, MM_ROUTE_SINGLE, 6), 0);
        /* the same weights for both (a backward needs the forward's weights) */
        memcpy(Q[1].gate_up, Q[0].gate_up, (size_t)(E_ * H_ * 2 * I_) * 2);
        memcpy(Q[1].down, Q[0].down, (size_t)(E_ * I_ * H_) * 2);
        mm_run_t r[2][2];
        for (int s = 0; s < 2; s++) {
            megamoe_experts_saved_t *sv[2] = {NULL, NULL};
            mm_input_buf_t ib[2];
            megamoe_experts_weights_t w = mm_local_weights(&Q[0], me, 500);
            for (int c = 0; c < 2; c++) {
                ASSERT_EQ_INT(mm_run_alloc(&r[s][c], &Q[c]), 0);
                ASSERT_EQ_INT(mm_input_make(&Q[c], me, NULL, &ib[c]), 0);
                ASSERT_OK(megamoe_experts_forward(x[s], &w, &ib[c].in, r[s][c].out, &sv[c]));
            }
            for (int c = 1; c >= 0; c--) {
                megamoe_experts_grads_t g = {r[s][c].gh, r[s][c].gp, r[s][c].g1, r[s][c].g2,
                                             MEGAMOE_DTYPE_BF16};
                ASSERT_OK(megamoe_experts_backward(x[s], sv[c], &w,
                                                   Q[c].grad_out + (size_t)me * T_ * H_, &g));
                megamoe_experts_saved_destroy(sv[c]);
                mm_input_free(&ib[c]);
            }
        }
        for (int c = 0; c < 2; c++) {
            char what[96];
            snprintf(what, sizeof what, "%s outstanding forward %d", scheds[si], c);
            all_ok &= mm_compare_runs(what, &r[1][c], &r[0][c], MEGAMOE_DTYPE_BF16, 1);
            mm_run_free(&r[0][c]);
            mm_run_free(&r[1][c]);
            mm_moe_problem_free(&Q[c]);
        }
        for (int s = 0; s < 2; s++) {
            ASSERT_OK(megamoe_experts_close(x[s]));
            megamoe_experts_destroy(x[s]);
        }
    }
    ASSERT_TRUE(all_ok);
}

/* Two layers with replicas share one resource group (one publication area for both): serial
 * forwards, then the backwards in reverse order, match two layers without replicas. The saved
 * states keep their own guest weights, so layer A's backward does not see layer B's. */
MM_TEST(shared_layers_with_replicas)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    mm_moe_problem_t P[2];
    ASSERT_EQ_INT(mm_moe_problem_create(&P[0], ep, T_, H_, I_, E_, K_, MM_ROUTE_SKEW, 21), 0);
    ASSERT_EQ_INT(mm_moe_problem_create(&P[1], ep, T_, H_, I_, E_, K_, MM_ROUTE_SINGLE, 22), 0);
    mm_run_t r[2][2];
    for (int rep = 0; rep < 2; rep++) {
        megamoe_experts_t *x[2] = {NULL, NULL};
        megamoe_experts_params_t p = mm_params("O1", rep ? R_ : 0, 0);
        for (int l = 0; l < 2; l++) ASSERT_OK(megamoe_experts_create(comm, &p, &x[l]));
        ASSERT_OK(megamoe_experts_share(x, 2));
        megamoe_experts_saved_t *sv[2] = {NULL, NULL};
        mm_input_buf_t ib[2];
        megamoe_experts_weights_t w[2];
        for (int l = 0; l < 2; l++) {
            ASSERT_EQ_INT(mm_run_alloc(&r[rep][l], &P[l]), 0);
            ASSERT_EQ_INT(mm_input_make(&P[l], me, NULL, &ib[l]), 0);
            w[l] = mm_local_weights(&P[l], me, 1);
            ASSERT_OK(megamoe_experts_forward(x[l], &w[l], &ib[l].in, r[rep][l].out, &sv[l]));
        }
        for (int l = 1; l >= 0; l--) {
            megamoe_experts_grads_t g = {r[rep][l].gh, r[rep][l].gp, r[rep][l].g1, r[rep][l].g2,
                                         MEGAMOE_DTYPE_BF16};
            ASSERT_OK(megamoe_experts_backward(x[l], sv[l], &w[l],
                                               P[l].grad_out + (size_t)me * T_ * H_, &g));
            megamoe_experts_saved_destroy(sv[l]);
            mm_input_free(&ib[l]);
        }
        for (int l = 0; l < 2; l++) {
            ASSERT_OK(megamoe_experts_close(x[l]));
            megamoe_experts_destroy(x[l]);
        }
    }
    int ok = mm_compare_runs("shared layer 0", &r[1][0], &r[0][0], MEGAMOE_DTYPE_BF16, 1);
    ok &= mm_compare_runs("shared layer 1", &r[1][1], &r[0][1], MEGAMOE_DTYPE_BF16, 1);
    for (int i = 0; i < 2; i++) {
        mm_run_free(&r[i][0]);
        mm_run_free(&r[i][1]);
        mm_moe_problem_free(&P[i]);
    }
    ASSERT_TRUE(ok);
}

MM_TEST(replica_settings_are_checked)
{
    megamoe_comm_t *comm = mm_test_comm();
    const int me = mm_test_rank();
    megamoe_experts_t *x = NULL;
    megamoe_experts_params_t p = mm_params("O1", -1, 0);
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "replica_slots_per_rank");
    p.replica_slots_per_rank = 65;
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    p.replica_slots_per_rank = me == 0 ? 1 : 2;
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_CONFIG_MISMATCH);
    ASSERT_CONTAINS(megamoe_last_error(), "replica_slots_per_rank");
    /* sharing needs the same setting */
    megamoe_experts_t *y[2] = {NULL, NULL};
    megamoe_experts_params_t a = mm_params("O1", 1, 0), b = mm_params("O1", 2, 0);
    ASSERT_OK(megamoe_experts_create(comm, &a, &y[0]));
    ASSERT_OK(megamoe_experts_create(comm, &b, &y[1]));
    ASSERT_STATUS(megamoe_experts_share(y, 2), MEGAMOE_INVALID_ARGUMENT);
    for (int l = 0; l < 2; l++) {
        ASSERT_OK(megamoe_experts_close(y[l]));
        megamoe_experts_destroy(y[l]);
    }
    /* the heap rule counts the publication and partial areas */
    megamoe_experts_params_t q0 = mm_params("O1", 0, 0), q2 = mm_params("O1", 2, 0);
    ASSERT_TRUE(megamoe_experts_heap_bytes(&q2, 2) >=
                megamoe_experts_heap_bytes(&q0, 2) + (size_t)(E_ / 2) * 6 * H_ * I_ +
                    (size_t)2 * 12 * H_ * I_);
}

/* A check failing on one rank inside the O1 backward (no routing plan there): every rank gets
 * its error without waiting for guest partials, then the layer works on; mismatched saved
 * states are refused everywhere. */
MM_TEST(failure_on_one_rank_with_replicas)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, MM_ROUTE_SKEW, 12), 0);
    const char *scheds[2] = {"O0", "O1"};
    for (int si = 0; si < 2; si++) {
        megamoe_experts_params_t pr = mm_params(scheds[si], R_, 0);
        megamoe_experts_t *x = NULL;
        ASSERT_OK(megamoe_experts_create(comm, &pr, &x));
        mm_input_buf_t ib;
        ASSERT_EQ_INT(mm_input_make(&P, me, NULL, &ib), 0);
        megamoe_experts_weights_t w = mm_local_weights(&P, me, 1);
        mm_run_t r;
        ASSERT_EQ_INT(mm_run_alloc(&r, &P), 0);
        megamoe_experts_saved_t *sv[2] = {NULL, NULL};
        ASSERT_OK(megamoe_experts_forward(x, &w, &ib.in, r.out, &sv[0]));
        megamoe_experts_grads_t g = {me == ep - 1 ? NULL : r.gh, r.gp, r.g1, r.g2,
                                     MEGAMOE_DTYPE_BF16};
        const uint16_t *dout = P.grad_out + (size_t)me * T_ * H_;
        ASSERT_STATUS(megamoe_experts_backward(x, sv[0], &w, dout, &g), MEGAMOE_INVALID_ARGUMENT);
        ASSERT_OK(megamoe_experts_forward(x, &w, &ib.in, r.out, &sv[1]));
        g.hidden_states = r.gh;
        ASSERT_STATUS(megamoe_experts_backward(x, sv[me == 0 ? 1 : 0], &w, dout, &g),
                      MEGAMOE_INVALID_ARGUMENT);
        ASSERT_CONTAINS(megamoe_last_error(), "same forward");
        ASSERT_OK(megamoe_experts_backward(x, sv[1], &w, dout, &g));
        for (int i = 0; i < 2; i++) megamoe_experts_saved_destroy(sv[i]);
        mm_run_t ok;
        ASSERT_EQ_INT(mm_run_alloc(&ok, &P), 0);
        ASSERT_OK(mm_run_fwd_bwd(x, &P, me, NULL, MEGAMOE_DTYPE_BF16, &ok));
        ASSERT_TRUE(mm_compare_runs("after the failures", &ok, &r, MEGAMOE_DTYPE_BF16, 0));
        mm_run_free(&ok);
        mm_run_free(&r);
        mm_input_free(&ib);
        ASSERT_OK(megamoe_experts_close(x));
        megamoe_experts_destroy(x);
    }
    mm_moe_problem_free(&P);
}

/* Growing capacity ("push", starting at factor 1) and owner-side fetches ("pull") with
 * replicas: the same bits as those modes without replicas (weight gradients within an ulp),
 * and under single routing the receive buffer grows less, since the plan's fullest rank
 * receives fewer rows. */
MM_TEST(push_and_pull_modes_with_replicas)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    const char *modes[2] = {"push", "pull"};
    const char *scheds[2] = {"O0", "O1"};
    int all_ok = 1;
    for (int mi = 0; mi < 2; mi++)
        for (int si = 0; si < 2; si++) {
            megamoe_experts_t *x[2] = {NULL, NULL};
            for (int r = 0; r < 2; r++) {
                megamoe_experts_params_t p = mm_params(scheds[si], r ? R_ : 0, 0);
                p.dispatch_mode = modes[mi];
                if (mi == 0) {
                    p.initial_capacity_factor = 1.0;
                    p.capacity_growth_factor = 1.0;
                }
                ASSERT_OK(megamoe_experts_create(comm, &p, &x[r]));
            }
            static const mm_route_pattern_t seq[] = {MM_ROUTE_SKEW, MM_ROUTE_SINGLE,
                                                     MM_ROUTE_BALANCED};
            for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
                mm_moe_problem_t P;
                ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, seq[i], 60 + i), 0);
                /* new weights every call: a new version */
                megamoe_experts_weights_t w = mm_local_weights(&P, mm_test_rank(), 200 + i);
                mm_run_t r[2];
                for (int s = 0; s < 2; s++) {
                    ASSERT_EQ_INT(mm_run_alloc(&r[s], &P), 0);
                    ASSERT_OK(mm_run_fwd_bwd(x[s], &P, me, &w, MEGAMOE_DTYPE_BF16, &r[s]));
                }
                char what[128];
                snprintf(what, sizeof what, "%s %s ep%d %s", modes[mi], scheds[si], ep,
                         mm_route_name(seq[i]));
                all_ok &= mm_compare_runs(what, &r[1], &r[0], MEGAMOE_DTYPE_BF16,
                                          seq[i] == MM_ROUTE_BALANCED ? 0 : 1);
                mm_run_free(&r[0]);
                mm_run_free(&r[1]);
                mm_moe_problem_free(&P);
            }
            if (mi == 0) { /* push: the fullest rank of the single call decided the growth */
                megamoe_experts_info_t i0, i1;
                ASSERT_OK(megamoe_experts_get_info(x[0], &i0));
                ASSERT_OK(megamoe_experts_get_info(x[1], &i1));
                printf("push %s ep%d: capacity %lld rows without replicas, %lld with\n",
                       scheds[si], ep, (long long)i0.capacity, (long long)i1.capacity);
                ASSERT_TRUE(i1.capacity < i0.capacity);
            }
            for (int s = 0; s < 2; s++) {
                ASSERT_OK(megamoe_experts_close(x[s]));
                megamoe_experts_destroy(x[s]);
            }
        }
    ASSERT_TRUE(all_ok);
}
