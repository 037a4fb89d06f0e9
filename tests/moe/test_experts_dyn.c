/* MegaMoeExperts with per-call token counts (max_local_num_tokens = T_cap, docs/moe.md "Dynamic
 * tokens"), run by `megamoe launch -n EP` (EP 2 and 4). One executable holds both schedules
 * and every mode, so each CTest entry is one process launch running many cases:
 *  - per-rank, per-call counts including 0, 1, 127..129 and T_cap (T_cap 300, not a multiple of
 *    128), forward and backward against the fp32 reference, O0 and O1 bit for bit, with an
 *    in-place weight update (a new version) between calls;
 *  - every rank passing T = 256: bit-identical to a fixed local_num_tokens = 256 layer;
 *  - push, pull, a bounded capacity and replicas on the same calls, bit for bit;
 *  - outstanding forwards (backwards in reverse order) and two shared layers with different
 *    counts; inference forwards;
 *  - EP subgroups (halves of the world, EP 1 included) with their own counts;
 *  - the errors: T_r > T_cap on one rank, a negative or wrong num_tokens, T_cap differing
 *    between ranks, fixed T on one rank and T_cap on another, both or neither count set, each
 *    the same error on every rank before any data moves, the layer usable afterwards.
 * Across simulated hosts (test_experts_dyn_hosts) rows, weights and partials travel through
 * one-sided puts and gets. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "moe_check.h"
#include "moe_verify.h"

#define TCAP 300
#define H_ 64
#define I_ 16
#define E_ 8
#define K_ 2

/* The same pseudo-random counts on every rank (they must know each other's for the reference). */
static uint64_t mm_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Counts of call c for every rank: patterns that cover 0, 1, 127, 128, 129 and T_cap, all
 * ranks empty, all ranks full, and random counts. */
static void mm_counts(int c, int ep, int64_t *n)
{
    static const int64_t edge[6] = {0, 1, 127, 128, 129, TCAP};
    for (int r = 0; r < ep; r++) {
        switch (c % 5) {
        case 0: n[r] = edge[(r + c) % 6]; break;
        case 1: n[r] = (int64_t)(mm_mix((uint64_t)(c * 131 + r)) % (TCAP + 1)); break;
        case 2: n[r] = edge[(r + 3 + c) % 6]; break;
        case 3: n[r] = c == 3 ? 0 : TCAP; break; /* every rank empty, later every rank full */
        default: n[r] = r == 0 ? 0 : (int64_t)(mm_mix((uint64_t)(c * 7 + r)) % (TCAP + 1));
        }
    }
}

static megamoe_experts_params_t mm_dyn_params(const char *schedule, int64_t tcap)
{
    megamoe_experts_params_t p = mm_params_shape(0, H_, I_, E_, K_);
    p.max_local_num_tokens = tcap;
    p.schedule = schedule;
    p.workers = 2; /* a cube and a vector worker (O1), the column split (O0) */
    return p;
}

/* One forward + backward of x with T_r = n[me] rows of this rank's slice of P (the first
 * ones), weights w; results into r (sized for P->T rows). */
static megamoe_status_t mm_dyn_step(megamoe_experts_t *x, const mm_moe_problem_t *P,
                                    const int64_t *n, const megamoe_experts_weights_t *w,
                                    mm_run_t *r)
{
    const int me = mm_test_rank();
    mm_input_buf_t ib;
    if (mm_input_make(P, me, NULL, &ib) != 0) return MEGAMOE_OUT_OF_MEMORY;
    ib.in.num_tokens = n[me];
    megamoe_experts_saved_t *sv = NULL;
    megamoe_status_t st = megamoe_experts_forward(x, w, &ib.in, r->out, &sv);
    if (st == MEGAMOE_OK) {
        megamoe_experts_grads_t g = {r->gh, r->gp, r->g1, r->g2, MEGAMOE_DTYPE_BF16};
        st = megamoe_experts_backward(x, sv, w, P->grad_out + (size_t)(me * P->T * P->H), &g);
    }
    megamoe_experts_saved_destroy(sv);
    mm_input_free(&ib);
    return st;
}

/* Bitwise equality of the call's rows (n rows) and the weight gradients (bf16). */
static int mm_dyn_same(const char *what, const mm_run_t *a, const mm_run_t *b,
                       const mm_moe_problem_t *P, int64_t n, int weights)
{
    const int64_t L = P->E / P->ep;
    struct {
        const char *name;
        const void *x, *y;
        size_t bytes;
    } t[5] = {{"output", a->out, b->out, (size_t)(n * P->H) * 2},
              {"grad hidden", a->gh, b->gh, (size_t)(n * P->H) * 2},
              {"grad topk_weights", a->gp, b->gp, (size_t)(n * P->K) * 4},
              {"grad gate_up", a->g1, b->g1, (size_t)(L * P->H * 2 * P->I) * 2},
              {"grad down", a->g2, b->g2, (size_t)(L * P->I * P->H) * 2}};
    int ok = 1;
    for (int i = 0; i < (weights ? 5 : 3); i++)
        if (memcmp(t[i].x, t[i].y, t[i].bytes) != 0) {
            fprintf(stderr, "%s: %s differs\n", what, t[i].name);
            ok = 0;
        }
    return ok;
}

/* An in-place update of every expert's weights between calls (the same on every rank: each
 * holds the whole problem), standing for an optimizer step; the caller bumps the version. */
static void mm_dyn_update_weights(mm_moe_problem_t *P, int step)
{
    const size_t n1 = (size_t)(P->E * P->H * 2 * P->I), n2 = (size_t)(P->E * P->I * P->H);
    for (size_t i = 0; i < n1; i++) {
        float v = megamoe_bf16_to_fp32(P->gate_up[i]);
        P->gate_up[i] = megamoe_fp32_to_bf16(v * 0.98f + (float)((i + (size_t)step) % 7) * 1e-3f);
    }
    for (size_t i = 0; i < n2; i++) {
        float v = megamoe_bf16_to_fp32(P->down[i]);
        P->down[i] = megamoe_fp32_to_bf16(v * 0.98f - (float)((i + (size_t)step) % 5) * 1e-3f);
    }
}

/* Layers of one comparison: index 0 (O0, lossless) is checked against the reference, the
 * others against it bit for bit (replicas: all but the weight gradients, which are the sum
 * of partials; they are checked against the reference instead). */
typedef struct mm_dyn_variant {
    const char *name, *schedule, *mode;
    double factor;
    int replicas;
} mm_dyn_variant_t;

static const mm_dyn_variant_t mm_dyn_variants[] = {
    {"O0", "O0", NULL, 0, 0},
    {"O1", "O1", NULL, 0, 0},
    {"O1 push", "O1", "push", 0, 0},
    {"O0 push", "O0", "push", 0, 0},
    {"O1 pull", "O1", "pull", 0, 0},
    {"O0 pull", "O0", "pull", 0, 0},
    {"O1 factor 1.25", "O1", NULL, 1.25, 0},
    {"O1 replicas 2", "O1", NULL, 0, 2},
    {"O0 replicas 2", "O0", NULL, 0, 2},
};
#define MM_DYN_VARIANTS (int)(sizeof mm_dyn_variants / sizeof mm_dyn_variants[0])

static void mm_dyn_calls(mm_route_pattern_t route, int n_calls, int first_call)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    ASSERT_TRUE(comm != NULL);
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, TCAP, H_, I_, E_, K_, route, 11 + route), 0);
    megamoe_experts_t *x[MM_DYN_VARIANTS] = {0};
    for (int v = 0; v < MM_DYN_VARIANTS; v++) {
        megamoe_experts_params_t p = mm_dyn_params(mm_dyn_variants[v].schedule, TCAP);
        p.dispatch_mode = mm_dyn_variants[v].mode;
        p.expert_capacity_factor = mm_dyn_variants[v].factor;
        p.replica_slots_per_rank = mm_dyn_variants[v].replicas;
        ASSERT_OK(megamoe_experts_create(comm, &p, &x[v]));
    }
    mm_run_t r[MM_DYN_VARIANTS];
    for (int v = 0; v < MM_DYN_VARIANTS; v++) ASSERT_EQ_INT(mm_run_alloc(&r[v], &P), 0);
    int64_t n[64];
    for (int c = first_call; c < first_call + n_calls; c++) {
        mm_counts(c, ep, n);
        megamoe_experts_weights_t w = mm_local_weights(&P, me, (uint64_t)c + 1);
        mm_ref_result_t ref;
        ASSERT_EQ_INT(mm_ref_compute_rows(&P, n, &ref), 0);
        for (int v = 0; v < MM_DYN_VARIANTS; v++) {
            char what[128];
            snprintf(what, sizeof what, "%s routing, call %d (rank %d: %lld of %d tokens), %s",
                     mm_route_name(route), c, me, (long long)n[me], TCAP, mm_dyn_variants[v].name);
            if (mm_dyn_variants[v].factor > 0 && route != MM_ROUTE_BALANCED) continue;
            ASSERT_OK(mm_dyn_step(x[v], &P, n, &w, &r[v]));
            megamoe_experts_info_t info;
            ASSERT_OK(megamoe_experts_get_info(x[v], &info));
            ASSERT_EQ_INT(info.last_tokens, n[me]);
            ASSERT_EQ_INT(info.max_local_num_tokens, TCAP);
            if (v == 0 || mm_dyn_variants[v].replicas > 0)
                ASSERT_TRUE(mm_compare_rows(what, &P, me, n, &r[v], &ref));
            if (v > 0) ASSERT_TRUE(mm_dyn_same(what, &r[v], &r[0], &P, n[me],
                                               mm_dyn_variants[v].replicas == 0));
        }
        mm_ref_free(&ref);
        mm_dyn_update_weights(&P, c); /* the next call sees new weights (version c + 2) */
    }
    for (int v = 0; v < MM_DYN_VARIANTS; v++) {
        ASSERT_OK(megamoe_experts_close(x[v]));
        megamoe_experts_destroy(x[v]);
        mm_run_free(&r[v]);
    }
    mm_moe_problem_free(&P);
}

/* Calls c of mm_counts: 0 and 2 edge counts, 1 and 4 random (4: rank 0 empty), 3 every rank
 * empty, 8 every rank full. The reference (fp64, every rank's tokens) dominates the cost and
 * grows with EP, so EP 4 (and the sanitizer runs of it) takes fewer calls. */
MM_TEST(per_call_counts_balanced) { mm_dyn_calls(MM_ROUTE_BALANCED, mm_test_world() > 2 ? 4 : 10, 0); }
MM_TEST(per_call_counts_skewed) { mm_dyn_calls(MM_ROUTE_SKEW, mm_test_world() > 2 ? 3 : 5, 0); }
MM_TEST(per_call_counts_single_destination)
{
    mm_dyn_calls(MM_ROUTE_SINGLE, mm_test_world() > 2 ? 3 : 5, mm_test_world() > 2 ? 7 : 5);
}

/* Every rank passes T = 256 (a multiple of 128): bit-identical to local_num_tokens = 256 with
 * the same weights and inputs, for T_cap = 256 and T_cap = 300, on both schedules (O0 = O1). */
MM_TEST(all_ranks_at_t_match_the_fixed_layer_bit_for_bit)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    const int64_t T = 256;
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T, H_, I_, E_, K_, MM_ROUTE_SKEW, 5), 0);
    int64_t n[64];
    for (int r = 0; r < ep; r++) n[r] = T;
    mm_run_t fixed[2], dyn[2][2];
    for (int s = 0; s < 2; s++) {
        const char *sched = s ? "O1" : "O0";
        megamoe_experts_params_t pf = mm_params_shape(T, H_, I_, E_, K_);
        pf.schedule = sched;
        pf.workers = 2;
        megamoe_experts_t *xf = NULL;
        ASSERT_OK(megamoe_experts_create(comm, &pf, &xf));
        ASSERT_EQ_INT(mm_run_alloc(&fixed[s], &P), 0);
        ASSERT_OK(mm_run_fwd_bwd(xf, &P, me, NULL, MEGAMOE_DTYPE_BF16, &fixed[s]));
        ASSERT_OK(megamoe_experts_close(xf));
        megamoe_experts_destroy(xf);
        for (int c = 0; c < 2; c++) {
            megamoe_experts_t *xd = NULL;
            megamoe_experts_params_t pd = mm_dyn_params(sched, c ? 300 : T);
            ASSERT_OK(megamoe_experts_create(comm, &pd, &xd));
            ASSERT_EQ_INT(mm_run_alloc(&dyn[s][c], &P), 0);
            megamoe_experts_weights_t w = mm_local_weights(&P, me, 1);
            ASSERT_OK(mm_dyn_step(xd, &P, n, &w, &dyn[s][c]));
            char what[64];
            snprintf(what, sizeof what, "%s T_cap %d vs fixed T 256", sched, c ? 300 : 256);
            ASSERT_TRUE(mm_dyn_same(what, &dyn[s][c], &fixed[s], &P, T, 1));
            ASSERT_OK(megamoe_experts_close(xd));
            megamoe_experts_destroy(xd);
        }
    }
    ASSERT_TRUE(mm_dyn_same("fixed O1 vs O0", &fixed[1], &fixed[0], &P, T, 1));
    for (int s = 0; s < 2; s++) {
        mm_run_free(&fixed[s]);
        mm_run_free(&dyn[s][0]);
        mm_run_free(&dyn[s][1]);
    }
    mm_moe_problem_free(&P);
}

/* Several outstanding forwards with different counts, backwards in reverse order; two layers
 * sharing execution resources with different counts per layer and call; inference forwards
 * (no saved state) in between give the training forward's output. */
MM_TEST(outstanding_forwards_shared_layers_and_inference)
{
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, TCAP, H_, I_, E_, K_, MM_ROUTE_BALANCED, 3), 0);
    for (int s = 0; s < 2; s++) {
        const char *sched = s ? "O1" : "O0";
        megamoe_experts_t *x[2] = {NULL, NULL};
        for (int l = 0; l < 2; l++) {
            megamoe_experts_params_t p = mm_dyn_params(sched, TCAP);
            ASSERT_OK(megamoe_experts_create(comm, &p, &x[l]));
        }
        ASSERT_OK(megamoe_experts_share(x, 2));
        enum { NF = 3 };
        int64_t n[NF][64];
        mm_input_buf_t ib[NF];
        megamoe_experts_saved_t *sv[NF];
        mm_run_t r[NF];
        megamoe_experts_weights_t w = mm_local_weights(&P, me, 1);
        for (int f = 0; f < NF; f++) {
            mm_counts(f * 2 + 1, ep, n[f]);
            if (f == 1) n[f][me] = 0; /* an empty rank in the middle one */
            ASSERT_EQ_INT(mm_input_make(&P, me, NULL, &ib[f]), 0);
            ib[f].in.num_tokens = n[f][me];
            ASSERT_EQ_INT(mm_run_alloc(&r[f], &P), 0);
            ASSERT_OK(megamoe_experts_forward(x[f % 2], &w, &ib[f].in, r[f].out, &sv[f]));
            /* an inference forward of the other layer with yet other counts */
            int64_t m[64];
            mm_counts(f * 2 + 2, ep, m);
            mm_input_buf_t ii;
            ASSERT_EQ_INT(mm_input_make(&P, me, NULL, &ii), 0);
            ii.in.num_tokens = m[me];
            uint16_t *io = calloc((size_t)(TCAP * H_), 2);
            ASSERT_OK(megamoe_experts_forward(x[1 - f % 2], &w, &ii.in, io, NULL));
            free(io);
            mm_input_free(&ii);
        }
        for (int f = NF - 1; f >= 0; f--) {
            megamoe_experts_grads_t g = {r[f].gh, r[f].gp, r[f].g1, r[f].g2, MEGAMOE_DTYPE_BF16};
            ASSERT_OK(megamoe_experts_backward(x[f % 2], sv[f], &w,
                                               P.grad_out + (size_t)(me * TCAP * H_), &g));
            megamoe_experts_saved_destroy(sv[f]);
            mm_ref_result_t ref;
            ASSERT_EQ_INT(mm_ref_compute_rows(&P, n[f], &ref), 0);
            char what[96];
            snprintf(what, sizeof what, "%s outstanding forward %d (%lld tokens)", sched, f,
                     (long long)n[f][me]);
            ASSERT_TRUE(mm_compare_rows(what, &P, me, n[f], &r[f], &ref));
            mm_ref_free(&ref);
            /* inference of the same input: the training output, bit for bit */
            uint16_t *io = calloc((size_t)(TCAP * H_), 2);
            ASSERT_OK(megamoe_experts_forward(x[f % 2], &w, &ib[f].in, io, NULL));
            ASSERT_TRUE(memcmp(io, r[f].out, (size_t)(n[f][me] * H_) * 2) == 0);
            free(io);
            mm_input_free(&ib[f]);
            mm_run_free(&r[f]);
        }
        for (int l = 0; l < 2; l++) {
            ASSERT_OK(megamoe_experts_close(x[l]));
            megamoe_experts_destroy(x[l]);
        }
    }
    mm_moe_problem_free(&P);
}

/* A call error: the same status on every rank, the same text naming its cause, nothing written,
 * and a correct call afterwards. */
static void mm_dyn_refused(megamoe_experts_t *x, const mm_moe_problem_t *P, int64_t *n,
                           int bad_rank, int64_t bad_value, const char *needle)
{
    const int me = mm_test_rank();
    mm_input_buf_t ib;
    ASSERT_EQ_INT(mm_input_make(P, me, NULL, &ib), 0);
    ib.in.num_tokens = me == bad_rank ? bad_value : n[me];
    uint16_t *out = calloc((size_t)(TCAP * H_) + 128 * H_, 2);
    megamoe_experts_weights_t w = mm_local_weights(P, me, 1);
    megamoe_experts_saved_t *sv = NULL;
    ASSERT_STATUS(megamoe_experts_forward(x, &w, &ib.in, out, &sv), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), needle);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "rank %d: ", bad_rank);
    ASSERT_CONTAINS(megamoe_last_error(), prefix); /* the same text on every rank */
    ASSERT_TRUE(sv == NULL);
    for (size_t i = 0; i < (size_t)(TCAP * H_); i++) ASSERT_EQ_INT(out[i], 0);
    free(out);
    mm_input_free(&ib);
    mm_run_t r;
    ASSERT_EQ_INT(mm_run_alloc(&r, P), 0);
    ASSERT_OK(mm_dyn_step(x, P, n, &w, &r)); /* usable afterwards */
    mm_run_free(&r);
}

MM_TEST(count_errors_fail_on_every_rank_before_data_moves)
{
    const int ep = mm_test_world();
    megamoe_comm_t *comm = mm_test_comm();
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, TCAP + 128, H_, I_, E_, K_, MM_ROUTE_BALANCED, 9),
                  0);
    int64_t n[64];
    mm_counts(1, ep, n);
    for (int s = 0; s < 2; s++) {
        const char *sched = s ? "O1" : "O0";
        megamoe_experts_params_t p = mm_dyn_params(sched, TCAP);
        megamoe_experts_t *x = NULL;
        ASSERT_OK(megamoe_experts_create(comm, &p, &x));
        /* T_r > T_cap on the last rank */
        mm_dyn_refused(x, &P, n, ep - 1, TCAP + 1,
                       "this call passes 301 tokens but max_local_num_tokens (T_cap) is 300");
        /* a negative count on a dynamic layer */
        mm_dyn_refused(x, &P, n, 0, -1, "the call's row count must be in 0..300");
        ASSERT_OK(megamoe_experts_close(x));
        megamoe_experts_destroy(x);
        /* a fixed layer takes exactly T rows */
        megamoe_experts_params_t pf = mm_params_shape(128, H_, I_, E_, K_);
        pf.schedule = sched;
        ASSERT_OK(megamoe_experts_create(comm, &pf, &x));
        int64_t t128[64];
        for (int r = 0; r < ep; r++) t128[r] = 128;
        mm_dyn_refused(x, &P, t128, ep - 1, 100, "fixed local_num_tokens (T) = 128");
        ASSERT_OK(megamoe_experts_close(x));
        megamoe_experts_destroy(x);
    }
    mm_moe_problem_free(&P);
}

MM_TEST(count_settings_checked_and_agreed_at_creation)
{
    const int me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    megamoe_experts_t *x = NULL;
    /* T_cap differs between ranks */
    megamoe_experts_params_t p = mm_dyn_params("O1", me == 1 ? 301 : 300);
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_CONFIG_MISMATCH);
    ASSERT_CONTAINS(megamoe_last_error(), "max_local_num_tokens is 300 on rank 0 but 301 on rank 1");
    /* fixed on one rank, dynamic on another */
    p = mm_dyn_params("O1", 256);
    if (me == 1) {
        p.max_local_num_tokens = 0;
        p.local_num_tokens = 256;
    }
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_CONFIG_MISMATCH);
    ASSERT_CONTAINS(megamoe_last_error(), "max_local_num_tokens = 256 on rank 0 but "
                                          "local_num_tokens = 256 on rank 1");
    /* both, neither, negative: every rank's own error (each rank passes the same) */
    p = mm_dyn_params("O1", 256);
    p.local_num_tokens = 256;
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "set exactly one");
    p = mm_dyn_params("O1", 0);
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "local_num_tokens (T) = 0");
    p = mm_dyn_params("O1", -5);
    ASSERT_STATUS(megamoe_experts_create(comm, &p, &x), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "max_local_num_tokens (T_cap) = -5");
    ASSERT_EQ_INT(megamoe_experts_heap_bytes(&p, 2), 0);
    /* sized from T_cap: the same heap as a fixed layer of that many tokens would need */
    p = mm_dyn_params("O1", 300);
    megamoe_experts_params_t pf = mm_params_shape(300, H_, I_, E_, K_); /* (not creatable) */
    pf.schedule = "O1";
    ASSERT_TRUE(megamoe_experts_heap_bytes(&p, 2) > 0);
    ASSERT_EQ_INT(megamoe_experts_heap_bytes(&p, 2), megamoe_experts_heap_bytes(&pf, 2));
    /* a working layer reports its T_cap */
    ASSERT_OK(megamoe_experts_create(comm, &p, &x));
    megamoe_experts_info_t info;
    ASSERT_OK(megamoe_experts_get_info(x, &info));
    ASSERT_EQ_INT(info.max_local_num_tokens, 300);
    ASSERT_EQ_INT(info.tokens, 300);
    ASSERT_EQ_INT(info.last_tokens, -1);
    ASSERT_EQ_INT(info.capacity, megamoe_experts_capacity_rows(mm_test_world(), 300, K_, 0));
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
}

/* EP subgroups: the world split in two (even and odd ranks: EP 4 gives two groups of 2, each
 * spanning both hosts of test_experts_dyn_hosts; EP 2 two ranks on their own, EP = 1), each
 * running its own dynamic layer with its own problem and counts at the same time, against
 * the reference of its group. */
MM_TEST(ep_subgroups_with_their_own_counts)
{
    const int world = mm_test_world(), me = mm_test_rank();
    const int half = world / 2, color = me % 2, gme = me / 2;
    megamoe_comm_t *group = NULL;
    ASSERT_OK(megamoe_comm_split(mm_test_comm(), color, gme, &group));
    ASSERT_EQ_INT(megamoe_comm_size(group), half);
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, half, TCAP, H_, I_, E_, K_, MM_ROUTE_SKEW, 21 + color),
                  0);
    for (int s = 0; s < 2; s++) {
        megamoe_experts_params_t p = mm_dyn_params(s ? "O1" : "O0", TCAP);
        megamoe_experts_t *x = NULL;
        ASSERT_OK(megamoe_experts_create(group, &p, &x));
        mm_run_t r;
        ASSERT_EQ_INT(mm_run_alloc(&r, &P), 0);
        for (int c = 0; c < 3; c++) {
            int64_t n[64];
            mm_counts(c + 3 * color, half, n); /* the groups' counts differ */
            megamoe_experts_weights_t w = mm_local_weights(&P, gme, 1);
            mm_input_buf_t ib;
            ASSERT_EQ_INT(mm_input_make(&P, gme, NULL, &ib), 0);
            ib.in.num_tokens = n[gme];
            megamoe_experts_saved_t *sv = NULL;
            ASSERT_OK(megamoe_experts_forward(x, &w, &ib.in, r.out, &sv));
            megamoe_experts_grads_t g = {r.gh, r.gp, r.g1, r.g2, MEGAMOE_DTYPE_BF16};
            ASSERT_OK(megamoe_experts_backward(x, sv, &w, P.grad_out + (size_t)(gme * TCAP * H_),
                                               &g));
            megamoe_experts_saved_destroy(sv);
            mm_input_free(&ib);
            mm_ref_result_t ref;
            ASSERT_EQ_INT(mm_ref_compute_rows(&P, n, &ref), 0);
            char what[96];
            snprintf(what, sizeof what, "group %d (EP %d) %s call %d (%lld tokens)", color, half,
                     p.schedule, c, (long long)n[gme]);
            ASSERT_TRUE(mm_compare_rows(what, &P, gme, n, &r, &ref));
            mm_ref_free(&ref);
        }
        mm_run_free(&r);
        ASSERT_OK(megamoe_experts_close(x));
        megamoe_experts_destroy(x);
    }
    mm_moe_problem_free(&P);
    ASSERT_OK(megamoe_comm_destroy(group));
}
