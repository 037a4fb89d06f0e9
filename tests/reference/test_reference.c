/* The fp32 reference model: a hand-computed case, the clamp rule, validation, experts without
 * tokens, id/dtype/EP invariance and a finite-difference check of the backward. The pytest
 * tests/python/test_reference.py checks it against torch autograd on more shapes. */
#include <math.h>
#include <stdlib.h>

#include "harness/harness.h"
#include "megamoe/log.h"
#include "megamoe/reference.h"

static double sigm(double v) { return 1.0 / (1.0 + exp(-v)); }

/* ---- a tiny case computed by hand ---------------------------------------------------------- */
/* EP=1, T=1, H=2, I=1, E=3, K=2; token x = [1, 2] goes to experts 0 (w 0.75) and 1 (w 0.25);
 * expert 2 gets nothing.  Expert 0: g = 1, u = -1.  Expert 1: g = 0, u = 2. */
static const float hand_x[2] = {1.0f, 2.0f};
static const int32_t hand_ids[2] = {0, 1};
static const float hand_w[2] = {0.75f, 0.25f};
static const float hand_gu[3 * 2 * 2] = {0.5f, 1.0f, 0.25f, -1.0f, /* expert 0: [H=2, 2I=2] */
                                         -2.0f, 2.0f, 1.0f, 0.0f,  /* expert 1 */
                                         3.0f, 3.0f, 3.0f, 3.0f};  /* expert 2 */
static const float hand_dn[3 * 1 * 2] = {2.0f, -3.0f, 1.0f, 1.0f, 5.0f, 5.0f}; /* [E, I=1, H=2] */
static const float hand_dout[2] = {1.0f, 2.0f};
static const megamoe_reference_shape_t hand_shape = {1, 1, 2, 1, 3, 2};

typedef struct grads {
    float dx[2], dw[2], dgu[12], ddn[6];
} grads_t;

static megamoe_status_t hand_run(const megamoe_reference_params_t *p, float out[2], grads_t *g)
{
    megamoe_status_t st = megamoe_reference_forward(&hand_shape, p, hand_x, hand_ids, hand_w,
                                                    hand_gu, hand_dn, out);
    if (st != MEGAMOE_OK) return st;
    return megamoe_reference_backward(&hand_shape, p, hand_dout, hand_x, hand_ids, hand_w,
                                      hand_gu, hand_dn, g->dx, g->dw, g->dgu, g->ddn);
}

#define NEAR_(got, want) ASSERT_NEAR(got, want, 1e-6 * (1.0 + fabs(want)))

MM_TEST(hand_computed_forward_backward)
{
    float out[2];
    grads_t g;
    ASSERT_OK(hand_run(NULL, out, &g));
    double s1 = sigm(1.0);
    double a0 = -s1; /* silu(1) * -1 */
    /* out = 0.75 * a0 * [2, -3]  (expert 1 has a = silu(0) * 2 = 0) */
    NEAR_(out[0], 0.75 * a0 * 2);
    NEAR_(out[1], 0.75 * a0 * -3);
    /* dw0 = dout . y0 = a0 * (2 - 6);  dw1 = dout . 0 */
    NEAR_(g.dw[0], a0 * -4.0);
    ASSERT_TRUE(g.dw[1] == 0.0f);
    /* dW2[0] = a0 * 0.75 * dout;  dW2[1] = 0;  da0 = [2,-3] . 0.75 [1,2] = -3 */
    NEAR_(g.ddn[0], a0 * 0.75);
    NEAR_(g.ddn[1], a0 * 1.5);
    ASSERT_TRUE(g.ddn[2] == 0.0f && g.ddn[3] == 0.0f);
    double dg0 = -3.0 * -1.0 * s1 * (1.0 + 1.0 * (1.0 - s1)); /* da * u * silu'(1) */
    double du0 = -3.0 * s1;                                    /* da * silu(1) */
    /* expert 1: da1 = [1,1] . 0.25 [1,2] = 0.75; dg1 = da1 * u * silu'(0) = 0.75; du1 = 0 */
    double dg1 = 0.75 * 2.0 * 0.5;
    NEAR_(g.dgu[0], dg0);
    NEAR_(g.dgu[1], du0);
    NEAR_(g.dgu[2], 2.0 * dg0);
    NEAR_(g.dgu[3], 2.0 * du0);
    NEAR_(g.dgu[4], dg1);
    ASSERT_TRUE(g.dgu[5] == 0.0f);
    NEAR_(g.dgu[6], 2.0 * dg1);
    ASSERT_TRUE(g.dgu[7] == 0.0f);
    /* dx = W1[0] dh0 + W1[1] dh1 */
    NEAR_(g.dx[0], 0.5 * dg0 + 1.0 * du0 + -2.0 * dg1);
    NEAR_(g.dx[1], 0.25 * dg0 - 1.0 * du0 + 1.0 * dg1);
    for (int j = 8; j < 12; j++) ASSERT_TRUE(g.dgu[j] == 0.0f); /* expert 2: no tokens */
    ASSERT_TRUE(g.ddn[4] == 0.0f && g.ddn[5] == 0.0f);
}

MM_TEST(swiglu_limit_clamps_and_stops_the_gradient)
{
    megamoe_reference_params_t p = megamoe_reference_params_default();
    p.swiglu_limit = 0.5f; /* expert 0: g 1 -> 0.5, u -1 -> -0.5; expert 1: u 2 -> 0.5 */
    float out[2];
    grads_t g;
    ASSERT_OK(hand_run(&p, out, &g));
    double a0 = 0.5 * sigm(0.5) * -0.5;
    NEAR_(out[0], 0.75 * a0 * 2);
    NEAR_(out[1], 0.75 * a0 * -3);
    NEAR_(g.dw[0], a0 * -4.0);
    NEAR_(g.ddn[0], a0 * 0.75);
    /* Expert 0: both g and u clamped -> no gradient reaches gate_up[0]. */
    for (int j = 0; j < 4; j++) ASSERT_TRUE(g.dgu[j] == 0.0f);
    /* Expert 1: g = 0 passes, dg1 = da1 * u' * silu'(0) = 0.75 * 0.5 * 0.5; u clamped. */
    double dg1 = 0.75 * 0.5 * 0.5;
    NEAR_(g.dgu[4], dg1);
    ASSERT_TRUE(g.dgu[5] == 0.0f);
    NEAR_(g.dgu[6], 2.0 * dg1);
    NEAR_(g.dx[0], -2.0 * dg1);
    NEAR_(g.dx[1], 1.0 * dg1);
}

/* ---- random problems ----------------------------------------------------------------------- */

typedef struct problem {
    megamoe_reference_shape_t s;
    size_t n, h, i, e, k, ngu, ndn;
    float *x, *w, *gu, *dn, *dout;
    int32_t *ids;
} problem_t;

static uint64_t rng_state;
static float rnd(void) /* uniform in [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *rnd_array(size_t n, float scale)
{
    float *p = malloc(n * sizeof(float));
    for (size_t j = 0; j < n; j++) p[j] = rnd() * scale;
    return p;
}

/* Distinct ids per row drawn from the experts not in skip (a bit mask). */
static problem_t problem_make(int64_t ep, int64_t t, int64_t h, int64_t i, int64_t e, int64_t k,
                              uint64_t skip, uint64_t seed)
{
    problem_t p = {{ep, t, h, i, e, k}, 0, 0, 0, 0, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL};
    rng_state = seed;
    p.n = (size_t)(ep * t);
    p.h = (size_t)h, p.i = (size_t)i, p.e = (size_t)e, p.k = (size_t)k;
    p.ngu = p.e * p.h * 2 * p.i, p.ndn = p.e * p.i * p.h;
    p.x = rnd_array(p.n * p.h, 1.0f);
    p.w = rnd_array(p.n * p.k, 1.0f);
    p.gu = rnd_array(p.ngu, 1.0f / sqrtf((float)h));
    p.dn = rnd_array(p.ndn, 1.0f / sqrtf((float)i));
    p.dout = rnd_array(p.n * p.h, 1.0f);
    p.ids = malloc(p.n * p.k * sizeof(int32_t));
    for (size_t r = 0; r < p.n; r++) {
        for (size_t c = 0; c < p.k; c++) {
            int32_t id;
            int clash;
            do {
                id = (int32_t)((rnd() + 1.0f) * 0.5f * (float)e) % (int32_t)e;
                clash = (int)((skip >> id) & 1u);
                for (size_t q = 0; q < c; q++) clash |= p.ids[r * p.k + q] == id;
            } while (clash);
            p.ids[r * p.k + c] = id;
        }
    }
    return p;
}

static void problem_free(problem_t *p)
{
    free(p->x), free(p->w), free(p->gu), free(p->dn), free(p->dout), free(p->ids);
}

typedef struct result {
    float *out, *dx, *dw, *dgu, *ddn;
} result_t;

static result_t result_alloc(const problem_t *p)
{
    result_t r = {malloc(p->n * p->h * 4), malloc(p->n * p->h * 4), malloc(p->n * p->k * 4),
                  malloc(p->ngu * 4), malloc(p->ndn * 4)};
    return r;
}

static void result_free(result_t *r)
{
    free(r->out), free(r->dx), free(r->dw), free(r->dgu), free(r->ddn);
}

static int result_equal(const problem_t *p, const result_t *a, const result_t *b)
{
    return memcmp(a->out, b->out, p->n * p->h * 4) == 0 &&
           memcmp(a->dx, b->dx, p->n * p->h * 4) == 0 &&
           memcmp(a->dw, b->dw, p->n * p->k * 4) == 0 &&
           memcmp(a->dgu, b->dgu, p->ngu * 4) == 0 && memcmp(a->ddn, b->ddn, p->ndn * 4) == 0;
}

/* Inputs given as void pointers so a test can pass bf16 or int64 copies. */
static megamoe_status_t run_all(const problem_t *p, const megamoe_reference_params_t *params,
                                const void *x, const void *ids, const void *w, const void *gu,
                                const void *dn, const void *dout, result_t *r)
{
    megamoe_status_t st = megamoe_reference_forward(&p->s, params, x, ids, w, gu, dn, r->out);
    if (st != MEGAMOE_OK) return st;
    return megamoe_reference_backward(&p->s, params, dout, x, ids, w, gu, dn, r->dx, r->dw,
                                      r->dgu, r->ddn);
}

static megamoe_status_t run_plain(const problem_t *p, const megamoe_reference_params_t *params,
                                  result_t *r)
{
    return run_all(p, params, p->x, p->ids, p->w, p->gu, p->dn, p->dout, r);
}

MM_TEST(experts_without_tokens_get_exact_zero_grads)
{
    const uint64_t skip = (1u << 1) | (1u << 5) | (1u << 6); /* experts 1, 5, 6 get nothing */
    problem_t p = problem_make(2, 6, 16, 8, 8, 3, skip, 7);
    result_t r = result_alloc(&p);
    megamoe_status_t st = run_plain(&p, NULL, &r);
    int bad_zero = -1, bad_nonzero = -1;
    for (size_t e = 0; e < p.e && st == MEGAMOE_OK; e++) {
        size_t gu_e = p.h * 2 * p.i, dn_e = p.i * p.h, nonzero = 0;
        for (size_t j = 0; j < gu_e; j++) nonzero += r.dgu[e * gu_e + j] != 0.0f;
        for (size_t j = 0; j < dn_e; j++) nonzero += r.ddn[e * dn_e + j] != 0.0f;
        if ((skip >> e) & 1u) {
            if (nonzero != 0) bad_zero = (int)e;
        } else if (nonzero < (gu_e + dn_e) / 2) {
            bad_nonzero = (int)e; /* a used expert must get a real gradient */
        }
    }
    result_free(&r);
    problem_free(&p);
    ASSERT_OK(st);
    ASSERT_EQ_INT(bad_zero, -1);
    ASSERT_EQ_INT(bad_nonzero, -1);
}

MM_TEST(int32_and_int64_ids_give_identical_results)
{
    problem_t p = problem_make(2, 5, 12, 6, 4, 2, 0, 11);
    int64_t *ids64 = malloc(p.n * p.k * sizeof(int64_t));
    for (size_t j = 0; j < p.n * p.k; j++) ids64[j] = p.ids[j];
    result_t a = result_alloc(&p), b = result_alloc(&p);
    megamoe_reference_params_t params = megamoe_reference_params_default();
    params.swiglu_limit = 0.7f;
    megamoe_status_t st_a = run_plain(&p, &params, &a);
    params.ids_dtype = MEGAMOE_DTYPE_INT64;
    megamoe_status_t st_b = run_all(&p, &params, p.x, ids64, p.w, p.gu, p.dn, p.dout, &b);
    int same = st_a == MEGAMOE_OK && st_b == MEGAMOE_OK && result_equal(&p, &a, &b);
    result_free(&a), result_free(&b), free(ids64), problem_free(&p);
    ASSERT_OK(st_a);
    ASSERT_OK(st_b);
    ASSERT_TRUE(same);
}

static uint16_t *to_bf16(float *v, size_t n)
{
    /* Round v to bf16 in place (so v becomes the fp32 value of the bf16) and return the bits. */
    uint16_t *bits = malloc(n * sizeof(uint16_t));
    for (size_t j = 0; j < n; j++) {
        bits[j] = megamoe_fp32_to_bf16(v[j]);
        v[j] = megamoe_bf16_to_fp32(bits[j]);
    }
    return bits;
}

MM_TEST(bf16_inputs_equal_fp32_inputs_after_rounding)
{
    problem_t p = problem_make(2, 4, 16, 8, 4, 2, 0, 23);
    uint16_t *bx = to_bf16(p.x, p.n * p.h), *bw = to_bf16(p.w, p.n * p.k);
    uint16_t *bgu = to_bf16(p.gu, p.ngu), *bdn = to_bf16(p.dn, p.ndn);
    uint16_t *bdout = to_bf16(p.dout, p.n * p.h);
    result_t want = result_alloc(&p), got = result_alloc(&p);
    megamoe_status_t st = run_plain(&p, NULL, &want);
    int mismatch = -1;
    /* Every subset of the four bf16-capable dtype fields (bit 0 hidden .. bit 3 grad). */
    for (int mask = 1; mask < 16 && st == MEGAMOE_OK; mask++) {
        megamoe_reference_params_t params = megamoe_reference_params_default();
        if (mask & 1) params.hidden_dtype = MEGAMOE_DTYPE_BF16;
        if (mask & 2) params.probs_dtype = MEGAMOE_DTYPE_BF16;
        if (mask & 4) params.weight_dtype = MEGAMOE_DTYPE_BF16;
        if (mask & 8) params.grad_dtype = MEGAMOE_DTYPE_BF16;
        st = run_all(&p, &params, (mask & 1) ? (const void *)bx : p.x, p.ids,
                     (mask & 2) ? (const void *)bw : p.w, (mask & 4) ? (const void *)bgu : p.gu,
                     (mask & 4) ? (const void *)bdn : p.dn,
                     (mask & 8) ? (const void *)bdout : p.dout, &got);
        if (st == MEGAMOE_OK && !result_equal(&p, &want, &got)) mismatch = mask;
    }
    result_free(&want), result_free(&got), problem_free(&p);
    free(bx), free(bw), free(bgu), free(bdn), free(bdout);
    ASSERT_OK(st);
    ASSERT_EQ_INT(mismatch, -1);
}

MM_TEST(results_do_not_depend_on_ep)
{
    /* 8 tokens and 8 experts, read as 1 x 8, 2 x 4 or 4 x 2 (ranks x tokens per rank). */
    problem_t p = problem_make(1, 8, 8, 4, 8, 2, 0, 5);
    result_t base = result_alloc(&p), other = result_alloc(&p);
    megamoe_status_t st = run_plain(&p, NULL, &base);
    int mismatch = 0;
    for (int64_t ep = 2; ep <= 4 && st == MEGAMOE_OK; ep *= 2) {
        p.s.ep = ep;
        p.s.tokens_per_rank = 8 / ep;
        st = run_plain(&p, NULL, &other);
        if (st == MEGAMOE_OK && !result_equal(&p, &base, &other)) mismatch = (int)ep;
    }
    result_free(&base), result_free(&other), problem_free(&p);
    ASSERT_OK(st);
    ASSERT_EQ_INT(mismatch, 0);
}

/* d/de L(theta + e d) at e = 0 for L = <dout, out>, by central differences on the forward,
 * equals <grad, d> from the backward (every input moved at once along a random d). */
MM_TEST(backward_matches_finite_differences)
{
    problem_t p = problem_make(2, 3, 8, 4, 4, 2, 0, 31);
    result_t r = result_alloc(&p);
    megamoe_status_t st = run_plain(&p, NULL, &r);
    float *arrays[4] = {p.x, p.w, p.gu, p.dn};
    float *grads[4] = {r.dx, r.dw, r.dgu, r.ddn};
    size_t sizes[4] = {p.n * p.h, p.n * p.k, p.ngu, p.ndn};
    float *base[4], *dir[4];
    double analytic = 0.0;
    for (int a = 0; a < 4; a++) {
        base[a] = malloc(sizes[a] * sizeof(float));
        memcpy(base[a], arrays[a], sizes[a] * sizeof(float));
        dir[a] = rnd_array(sizes[a], 1.0f);
        for (size_t j = 0; j < sizes[a]; j++) analytic += (double)grads[a][j] * dir[a][j];
    }
    const double eps = 1e-2;
    double loss[2] = {0.0, 0.0};
    for (int side = 0; side < 2 && st == MEGAMOE_OK; side++) {
        double e = side ? eps : -eps;
        for (int a = 0; a < 4; a++)
            for (size_t j = 0; j < sizes[a]; j++)
                arrays[a][j] = (float)(base[a][j] + e * dir[a][j]);
        st = megamoe_reference_forward(&p.s, NULL, p.x, p.ids, p.w, p.gu, p.dn, r.out);
        for (size_t j = 0; j < p.n * p.h && st == MEGAMOE_OK; j++)
            loss[side] += (double)p.dout[j] * r.out[j];
    }
    double numeric = (loss[1] - loss[0]) / (2 * eps);
    for (int a = 0; a < 4; a++) free(base[a]), free(dir[a]);
    result_free(&r), problem_free(&p);
    ASSERT_OK(st);
    ASSERT_TRUE(fabs(analytic) > 0.1);
    ASSERT_NEAR(numeric, analytic, 1e-3 * fabs(analytic));
}

/* ---- validation ---------------------------------------------------------------------------- */

/* A failing call must leave every output untouched. */
static int untouched(const float *v, size_t n)
{
    for (size_t j = 0; j < n; j++)
        if (v[j] != 1234.5f) return 0;
    return 1;
}

#define EXPECT_INVALID_(call, needle)                                                      \
    do {                                                                                   \
        for (size_t j_ = 0; j_ < 64; j_++)                                                 \
            out[j_] = dx[j_] = dw[j_] = dgu[j_] = ddn[j_] = 1234.5f;                       \
        ASSERT_STATUS(call, MEGAMOE_INVALID_ARGUMENT);                                     \
        ASSERT_CONTAINS(megamoe_last_error(), needle);                                     \
        ASSERT_TRUE(untouched(out, 64) && untouched(dx, 64) && untouched(dw, 64) &&        \
                    untouched(dgu, 64) && untouched(ddn, 64));                             \
    } while (0)

MM_TEST(invalid_arguments_are_rejected_with_a_fix)
{
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    /* EP=2, T=2, H=2, I=2, E=4, K=2: buffers of 64 floats cover every tensor. */
    megamoe_reference_shape_t s = {2, 2, 2, 2, 4, 2};
    float x[64], w[64], gu[64], dn[64], dout[64];
    float out[64], dx[64], dw[64], dgu[64], ddn[64];
    for (int j = 0; j < 64; j++) x[j] = w[j] = gu[j] = dn[j] = dout[j] = 0.1f * (float)(j % 7);
    int32_t ids[8] = {0, 1, 2, 3, 3, 2, 1, 0};
    int64_t ids64[8] = {0, 1, 2, 3, 3, 2, 1, 0};
    megamoe_reference_params_t p = megamoe_reference_params_default();
    ASSERT_OK(megamoe_reference_forward(&s, &p, x, ids, w, gu, dn, out));

#define FWD_(shape, params, ids_) megamoe_reference_forward(shape, params, x, ids_, w, gu, dn, out)
#define BWD_(shape, params, ids_)                                                          \
    megamoe_reference_backward(shape, params, dout, x, ids_, w, gu, dn, dx, dw, dgu, ddn)

    /* Expert ids outside [0, E), for both id types and both directions. */
    ids[5] = 4;
    EXPECT_INVALID_(FWD_(&s, &p, ids), "topk_ids[2, 1] = 4 is not a global expert id in [0, 4)");
    EXPECT_INVALID_(BWD_(&s, &p, ids), "topk_ids[2, 1] = 4");
    ids[5] = -1;
    EXPECT_INVALID_(FWD_(&s, &p, ids), "topk_ids[2, 1] = -1");
    ids[5] = 2;
    megamoe_reference_params_t p64 = p;
    p64.ids_dtype = MEGAMOE_DTYPE_INT64;
    ids64[7] = 1ll << 40;
    EXPECT_INVALID_(FWD_(&s, &p64, ids64), "topk_ids[3, 1] = 1099511627776");
    EXPECT_INVALID_(BWD_(&s, &p64, ids64), "topk_ids[3, 1]");
    ids64[7] = 0;
    ASSERT_OK(BWD_(&s, &p64, ids64));

    /* Shapes. */
    megamoe_reference_shape_t bad = s;
    bad.num_experts = 3;
    bad.top_k = 1;
    EXPECT_INVALID_(FWD_(&bad, &p, ids), "num_experts 3 is not divisible by ep 2");
    EXPECT_INVALID_(BWD_(&bad, &p, ids), "num_experts 3 is not divisible by ep 2");
    bad = s;
    bad.top_k = 5;
    EXPECT_INVALID_(FWD_(&bad, &p, ids), "top_k 5 must be in [1, num_experts = 4]");
    EXPECT_INVALID_(BWD_(&bad, &p, ids), "top_k 5 must be in [1, num_experts = 4]");
    bad = s;
    bad.top_k = 0;
    EXPECT_INVALID_(FWD_(&bad, &p, ids), "top_k = 0 must be >= 1");
    bad = s;
    bad.ep = 0;
    EXPECT_INVALID_(FWD_(&bad, &p, ids), "ep = 0 must be >= 1");
    bad = s;
    bad.hidden = -3;
    EXPECT_INVALID_(BWD_(&bad, &p, ids), "hidden = -3 must be >= 1");
    bad = s;
    bad.tokens_per_rank = 1ll << 40;
    bad.hidden = 1ll << 30;
    EXPECT_INVALID_(FWD_(&bad, &p, ids), "too large");
    EXPECT_INVALID_(FWD_(NULL, &p, ids), "shape is NULL");

    /* Parameters. */
    megamoe_reference_params_t bp = p;
    bp.hidden_dtype = MEGAMOE_DTYPE_FP16;
    EXPECT_INVALID_(FWD_(&s, &bp, ids), "hidden_states dtype fp16");
    bp = p;
    bp.ids_dtype = MEGAMOE_DTYPE_FP32;
    EXPECT_INVALID_(FWD_(&s, &bp, ids), "topk_ids dtype fp32");
    bp = p;
    bp.weight_dtype = (megamoe_dtype_t)99;
    EXPECT_INVALID_(FWD_(&s, &bp, ids), "weight dtype unknown (99)");
    bp = p;
    bp.grad_dtype = MEGAMOE_DTYPE_INT8;
    EXPECT_INVALID_(BWD_(&s, &bp, ids), "grad_out dtype int8");
    bp = p;
    bp.swiglu_limit = NAN;
    EXPECT_INVALID_(FWD_(&s, &bp, ids), "swiglu_limit is NaN");

    /* NULL pointers, each in turn. */
#define F_(...) megamoe_reference_forward(&s, &p, __VA_ARGS__)
#define B_(...) megamoe_reference_backward(&s, &p, __VA_ARGS__)
    EXPECT_INVALID_(F_(NULL, ids, w, gu, dn, out), "hidden_states is NULL");
    EXPECT_INVALID_(F_(x, NULL, w, gu, dn, out), "topk_ids is NULL");
    EXPECT_INVALID_(F_(x, ids, NULL, gu, dn, out), "topk_weights is NULL");
    EXPECT_INVALID_(F_(x, ids, w, NULL, dn, out), "gate_up_weight is NULL");
    EXPECT_INVALID_(F_(x, ids, w, gu, NULL, out), "down_weight is NULL");
    EXPECT_INVALID_(F_(x, ids, w, gu, dn, NULL), "out_p is NULL");
    EXPECT_INVALID_(B_(NULL, x, ids, w, gu, dn, dx, dw, dgu, ddn), "grad_out is NULL");
    EXPECT_INVALID_(B_(dout, NULL, ids, w, gu, dn, dx, dw, dgu, ddn), "hidden_states is NULL");
    EXPECT_INVALID_(B_(dout, x, ids, w, gu, NULL, dx, dw, dgu, ddn), "down_weight is NULL");
    EXPECT_INVALID_(B_(dout, x, ids, w, gu, dn, NULL, dw, dgu, ddn), "grad_hidden_p is NULL");
    EXPECT_INVALID_(B_(dout, x, ids, w, gu, dn, dx, NULL, dgu, ddn), "grad_topk_weights_p is NULL");
    EXPECT_INVALID_(B_(dout, x, ids, w, gu, dn, dx, dw, NULL, ddn), "grad_gate_up_p is NULL");
    EXPECT_INVALID_(B_(dout, x, ids, w, gu, dn, dx, dw, dgu, NULL), "grad_down_p is NULL");
#undef F_
#undef B_
#undef FWD_
#undef BWD_
}
