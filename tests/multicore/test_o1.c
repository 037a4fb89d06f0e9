/* The O1 executor through MegaMoeExperts, run by `megamoe launch -n EP` (EP 2 and 4):
 *  - O1 forward and backward are bit-identical to O0 (output, every gradient) for the four
 *    routing patterns, lossless and bounded capacity, 1 worker and several (both roles, and
 *    cube-only / vector-only), and every O1 run gives the same bits;
 *  - consecutive launches with changing routing, outstanding forwards, fp32 weight grads;
 *  - failures that happen on one rank inside the protocol reach every rank identically and
 *    leave the layer usable (null participation);
 *  - the profiling rings hold well-formed, non-overlapping spans per worker.
 * Shapes are small so the whole file runs in seconds (and under TSan). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_check.h"
#include "moe/experts_impl.h"
#include "profile/prof.h"

#define T_ 384
#define H_ 80
#define I_ 48
#define E_ 8
#define K_ 3

static megamoe_experts_params_t mm_params(const char *schedule, double factor, int cube,
                                          int vector)
{
    megamoe_experts_params_t p = mm_params_shape(T_, H_, I_, E_, K_);
    p.expert_capacity_factor = factor;
    p.schedule = schedule;
    if (cube + vector > 0) {
        p.cube_workers = cube;
        p.vector_workers = vector;
    } else {
        p.workers = 2;
    }
    return p;
}

/* Run O0 once and O1 in each worker configuration twice; every run must match O0's bits. */
static void mm_identity_case(mm_route_pattern_t route)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    ASSERT_TRUE(comm != NULL);
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, route, 70 + route), 0);
    int64_t max_recv = 0;
    for (int d = 0; d < ep; d++) {
        int64_t r = mm_moe_problem_recv_rows(&P, d);
        if (r > max_recv) max_recv = r;
    }
    /* O1 worker configurations: (cube, vector); (0, 0) = 2 workers split by the default rule */
    static const int cfg[][2] = {{1, 0}, {2, 1}, {0, 2}, {0, 0}};
    const double factors[2] = {0, 1.5};
    int all_ok = 1;
    for (int f = 0; f < 2; f++) {
        if (max_recv > megamoe_experts_capacity_rows(ep, T_, K_, factors[f])) continue;
        megamoe_experts_t *x0 = NULL;
        megamoe_experts_params_t p0 = mm_params("O0", factors[f], 0, 0);
        ASSERT_OK(megamoe_experts_create(comm, &p0, &x0));
        mm_run_t ref;
        ASSERT_EQ_INT(mm_run_alloc(&ref, &P), 0);
        ASSERT_OK(mm_run_fwd_bwd(x0, &P, me, NULL, MEGAMOE_DTYPE_BF16, &ref));
        ASSERT_OK(megamoe_experts_close(x0));
        megamoe_experts_destroy(x0);
        for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
            megamoe_experts_t *x1 = NULL;
            megamoe_experts_params_t p1 = mm_params("O1", factors[f], cfg[c][0], cfg[c][1]);
            ASSERT_OK(megamoe_experts_create(comm, &p1, &x1));
            for (int rep = 0; rep < 2; rep++) {
                mm_run_t got;
                ASSERT_EQ_INT(mm_run_alloc(&got, &P), 0);
                ASSERT_OK(mm_run_fwd_bwd(x1, &P, me, NULL, MEGAMOE_DTYPE_BF16, &got));
                char what[128];
                snprintf(what, sizeof what, "%s ep%d factor %g O1 cube %d vector %d run %d",
                         mm_route_name(route), ep, factors[f], cfg[c][0], cfg[c][1], rep);
                int ok = mm_run_same_bits(what, &got, &ref, &P, 2);
                printf("%s %s: bit-identical to O0\n", ok ? "PASS" : "FAIL", what);
                all_ok &= ok;
                mm_run_free(&got);
            }
            ASSERT_OK(megamoe_experts_close(x1));
            megamoe_experts_destroy(x1);
        }
        mm_run_free(&ref);
    }
    mm_moe_problem_free(&P);
    ASSERT_TRUE(all_ok);
}

MM_TEST(o1_equals_o0_balanced) { mm_identity_case(MM_ROUTE_BALANCED); }
MM_TEST(o1_equals_o0_zero_token_experts) { mm_identity_case(MM_ROUTE_ZERO); }
MM_TEST(o1_equals_o0_skewed) { mm_identity_case(MM_ROUTE_SKEW); }
MM_TEST(o1_equals_o0_single_destination) { mm_identity_case(MM_ROUTE_SINGLE); }

/* One O1 layer and one O0 layer over a sequence of calls whose routing changes every time,
 * with two outstanding forwards, fp32 weight grads and rows through mm_shmem_put. */
MM_TEST(consecutive_launches_with_changing_routing)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    megamoe_experts_t *x[2] = {NULL, NULL};
    megamoe_experts_params_t p0 = mm_params("O0", 0, 0, 0), p1 = mm_params("O1", 0, 1, 1);
    ASSERT_OK(megamoe_experts_create(comm, &p0, &x[0]));
    ASSERT_OK(megamoe_experts_create(comm, &p1, &x[1]));
    static const mm_route_pattern_t seq[] = {MM_ROUTE_SKEW, MM_ROUTE_BALANCED, MM_ROUTE_SINGLE,
                                             MM_ROUTE_ZERO, MM_ROUTE_SKEW, MM_ROUTE_BALANCED};
    int all_ok = 1;
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        mm_moe_problem_t P;
        ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, seq[i], 90 + i), 0);
        megamoe_dtype_t wg = i % 2 ? MEGAMOE_DTYPE_FP32 : MEGAMOE_DTYPE_BF16;
        mm_ep_force_puts = i == 4; /* every rank, between calls */
        mm_run_t r[2];
        for (int s = 0; s < 2; s++) {
            ASSERT_EQ_INT(mm_run_alloc(&r[s], &P), 0);
            ASSERT_OK(mm_run_fwd_bwd(x[s], &P, me, NULL, wg, &r[s]));
        }
        char what[96];
        snprintf(what, sizeof what, "call %zu (%s%s)", i, mm_route_name(seq[i]),
                 i == 4 ? ", puts" : "");
        all_ok &= mm_run_same_bits(what, &r[1], &r[0], &P, wg == MEGAMOE_DTYPE_FP32 ? 4 : 2);
        mm_run_free(&r[0]);
        mm_run_free(&r[1]);
        mm_moe_problem_free(&P);
    }
    mm_ep_force_puts = 0;

    /* two outstanding forwards with different routing, backwards in reverse order */
    mm_moe_problem_t Q[2];
    ASSERT_EQ_INT(mm_moe_problem_create(&Q[0], ep, T_, H_, I_, E_, K_, MM_ROUTE_SKEW, 5), 0);
    ASSERT_EQ_INT(mm_moe_problem_create(&Q[1], ep, T_, H_, I_, E_, K_, MM_ROUTE_ZERO, 6), 0);
    mm_run_t r[2][2];
    for (int s = 0; s < 2; s++) {
        megamoe_experts_saved_t *sv[2] = {NULL, NULL};
        mm_input_buf_t ib[2];
        megamoe_experts_weights_t w[2];
        for (int c = 0; c < 2; c++) {
            ASSERT_EQ_INT(mm_run_alloc(&r[s][c], &Q[c]), 0);
            ASSERT_EQ_INT(mm_input_make(&Q[c], me, NULL, &ib[c]), 0);
            w[c] = mm_local_weights(&Q[c], me, 10 + (uint64_t)c);
            ASSERT_OK(megamoe_experts_forward(x[s], &w[c], &ib[c].in, r[s][c].out, &sv[c]));
        }
        for (int c = 1; c >= 0; c--) {
            megamoe_experts_grads_t g = {r[s][c].gh, r[s][c].gp, r[s][c].g1, r[s][c].g2,
                                         MEGAMOE_DTYPE_BF16};
            ASSERT_OK(megamoe_experts_backward(x[s], sv[c], &w[c],
                                               Q[c].grad_out + (size_t)me * T_ * H_, &g));
            megamoe_experts_saved_destroy(sv[c]);
            mm_input_free(&ib[c]);
        }
    }
    for (int c = 0; c < 2; c++) {
        all_ok &= mm_run_same_bits(c ? "outstanding forward 1" : "outstanding forward 0",
                                   &r[1][c], &r[0][c], &Q[c], 2);
        mm_run_free(&r[0][c]);
        mm_run_free(&r[1][c]);
        mm_moe_problem_free(&Q[c]);
    }
    megamoe_experts_info_t info;
    ASSERT_OK(megamoe_experts_get_info(x[1], &info));
    ASSERT_EQ_STR(info.schedule, "O1");
    ASSERT_EQ_INT(info.cube_workers, 1);
    ASSERT_EQ_INT(info.vector_workers, 1);
    for (int s = 0; s < 2; s++) {
        ASSERT_OK(megamoe_experts_close(x[s]));
        megamoe_experts_destroy(x[s]);
    }
    ASSERT_TRUE(all_ok);
}

/* A check that fails on one rank only (decided in the backward's one exchange before the
 * launch): every rank returns that rank's error, nothing is written, the layer works on. */
MM_TEST(failure_on_one_rank_reaches_every_rank)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, MM_ROUTE_SKEW, 12), 0);
    megamoe_experts_params_t p1 = mm_params("O1", 0, 0, 0);
    megamoe_experts_t *x = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &p1, &x));
    mm_input_buf_t ib;
    ASSERT_EQ_INT(mm_input_make(&P, me, NULL, &ib), 0);
    megamoe_experts_weights_t w = mm_local_weights(&P, me, 1);
    mm_run_t r;
    ASSERT_EQ_INT(mm_run_alloc(&r, &P), 0);
    megamoe_experts_saved_t *sv[2] = {NULL, NULL};
    ASSERT_OK(megamoe_experts_forward(x, &w, &ib.in, r.out, &sv[0]));
    /* the last rank forgets grad hidden_states: backward fails everywhere */
    megamoe_experts_grads_t g = {me == ep - 1 ? NULL : r.gh, r.gp, r.g1, r.g2,
                                 MEGAMOE_DTYPE_BF16};
    const uint16_t *dout = P.grad_out + (size_t)me * T_ * H_;
    memset(r.gh, 0x7f, (size_t)T_ * H_ * 2);
    ASSERT_STATUS(megamoe_experts_backward(x, sv[0], &w, dout, &g), MEGAMOE_INVALID_ARGUMENT);
    char want[32];
    snprintf(want, sizeof want, "rank %d: ", ep - 1);
    ASSERT_CONTAINS(megamoe_last_error(), want);
    ASSERT_CONTAINS(megamoe_last_error(), "grad_output and the grads");
    for (size_t i = 0; me != ep - 1 && i < (size_t)T_ * H_; i++)
        ASSERT_EQ_INT(r.gh[i], 0x7f7f); /* grad hidden not written */
    /* saved states of different forwards on different ranks: refused on every rank */
    ASSERT_OK(megamoe_experts_forward(x, &w, &ib.in, r.out, &sv[1]));
    g.hidden_states = r.gh;
    ASSERT_STATUS(megamoe_experts_backward(x, sv[me == 0 ? 1 : 0], &w, dout, &g),
                  MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "same forward call");
    /* and the layer still works: the right saved state gives O0's bits */
    mm_run_t ok1, ok0;
    ASSERT_EQ_INT(mm_run_alloc(&ok1, &P), 0);
    ASSERT_EQ_INT(mm_run_alloc(&ok0, &P), 0);
    megamoe_experts_grads_t g1 = {ok1.gh, ok1.gp, ok1.g1, ok1.g2, MEGAMOE_DTYPE_BF16};
    ASSERT_OK(megamoe_experts_backward(x, sv[1], &w, dout, &g1));
    memcpy(ok1.out, r.out, (size_t)T_ * H_ * 2);
    megamoe_experts_params_t p0 = mm_params("O0", 0, 0, 0);
    megamoe_experts_t *x0 = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &p0, &x0));
    ASSERT_OK(mm_run_fwd_bwd(x0, &P, me, NULL, MEGAMOE_DTYPE_BF16, &ok0));
    ASSERT_TRUE(mm_run_same_bits("after the failures", &ok1, &ok0, &P, 2));
    for (int i = 0; i < 2; i++) megamoe_experts_saved_destroy(sv[i]);
    ASSERT_OK(megamoe_experts_close(x0));
    megamoe_experts_destroy(x0);
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    mm_run_free(&r);
    mm_run_free(&ok0);
    mm_run_free(&ok1);
    mm_input_free(&ib);
    mm_moe_problem_free(&P);
}

/* The producer side of the trace: per worker, records lie inside their invocation, do not
 * overlap, carry valid kinds/stages/tasks, and every compute stage of the graph shows up. */
MM_TEST(profile_rings_are_well_formed)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, MM_ROUTE_SKEW, 3), 0);
    megamoe_experts_params_t p1 = mm_params("O1", 0, 2, 1);
    megamoe_experts_t *x = NULL;
    ASSERT_OK(megamoe_experts_create(comm, &p1, &x));
    ASSERT_TRUE(megamoe_experts_get_profile(x) == NULL);
    ASSERT_OK(megamoe_profiler_start());
    mm_run_t r;
    ASSERT_EQ_INT(mm_run_alloc(&r, &P), 0);
    for (int i = 0; i < 2; i++) ASSERT_OK(mm_run_fwd_bwd(x, &P, me, NULL, MEGAMOE_DTYPE_BF16, &r));
    ASSERT_OK(megamoe_profiler_stop());
    ASSERT_OK(mm_run_fwd_bwd(x, &P, me, NULL, MEGAMOE_DTYPE_BF16, &r)); /* not recorded */
    megamoe_profile_t *prof = megamoe_experts_get_profile(x);
    ASSERT_TRUE(prof != NULL);
    mm_prof_session_t *s = (mm_prof_session_t *)(void *)prof;
    ASSERT_EQ_INT(mm_prof_invocation_count(s), 4);
    ASSERT_EQ_INT(mm_prof_workers(s, MM_PROF_CUBE), 2);
    ASSERT_EQ_INT(mm_prof_workers(s, MM_PROF_VECTOR), 1);
    int seen[MM_MC_STAGES] = {0}, kinds[3] = {0};
    uint64_t records = 0;
    for (int role = 0; role < 2; role++)
        for (int w = 0; w < mm_prof_workers(s, (mm_prof_role_t)role); w++) {
            mm_prof_ring_t *ring = mm_prof_ring(s, (mm_prof_role_t)role, w);
            ASSERT_TRUE(ring != NULL);
            ASSERT_EQ_INT(ring->dropped, 0);
            uint64_t last_end = 0;
            for (uint32_t i = 0; i < ring->count; i++) {
                const mm_prof_record_t *rec = &ring->records[i];
                ASSERT_TRUE(rec->start_ns <= rec->end_ns);
                ASSERT_TRUE(rec->start_ns >= last_end); /* no overlap on one worker */
                last_end = rec->end_ns;
                ASSERT_TRUE(rec->kind <= MM_PROF_SIGNAL);
                ASSERT_TRUE(rec->stage < MM_MC_STAGES);
                ASSERT_TRUE(rec->invocation < 4);
                ASSERT_TRUE(rec->task >= -1);
                ASSERT_TRUE(rec->owner >= -1 && rec->owner < E_);
                ASSERT_TRUE(rec->peer == 0xffff || rec->peer < ep);
                seen[rec->stage]++;
                kinds[rec->kind]++;
                records++;
            }
        }
    ASSERT_TRUE(records > 0);
    ASSERT_TRUE(kinds[MM_PROF_COMPUTE] > 0 && kinds[MM_PROF_SIGNAL] > 0);
    static const int stages[] = {MM_MC_ST_DISPATCH, MM_MC_ST_GMM1,        MM_MC_ST_SWIGLU,
                                 MM_MC_ST_GMM2,     MM_MC_ST_DONE,        MM_MC_ST_REDUCE,
                                 MM_MC_ST_DISPATCH_GRAD, MM_MC_ST_GMM_DA, MM_MC_ST_SWIGLU_GRAD,
                                 MM_MC_ST_GMM_DX,   MM_MC_ST_DW2,         MM_MC_ST_DW1,
                                 MM_MC_ST_DONE_GRAD, MM_MC_ST_REDUCE_GRAD};
    for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++) {
        if (seen[stages[i]] == 0) fprintf(stderr, "stage %s never recorded\n", mm_mc_stage_names[stages[i]]);
        ASSERT_TRUE(seen[stages[i]] > 0);
    }
    /* Idle workers take tasks of the other role's queue, so under load either worker may have
     * run all the compute: only the two together must show some. */
    megamoe_profile_summary_t sum[3];
    ASSERT_OK(megamoe_profile_get_worker_summary(prof, MEGAMOE_PROFILE_CUBE, 0, &sum[0]));
    ASSERT_OK(megamoe_profile_get_worker_summary(prof, MEGAMOE_PROFILE_CUBE, 1, &sum[1]));
    ASSERT_OK(megamoe_profile_get_worker_summary(prof, MEGAMOE_PROFILE_VECTOR, 0, &sum[2]));
    ASSERT_TRUE(sum[0].compute_ns + sum[1].compute_ns + sum[2].compute_ns > 0);
    for (int i = 0; i < 3; i++) {
        ASSERT_TRUE(sum[i].launch_ns > 0);
        ASSERT_TRUE(sum[i].wait_ns + sum[i].compute_ns + sum[i].signal_ns <= sum[i].launch_ns);
    }
    megamoe_profiler_reset();
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    mm_run_free(&r);
    mm_moe_problem_free(&P);
}
