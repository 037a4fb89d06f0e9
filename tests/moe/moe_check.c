/* Helpers of the MegaMoeExperts tests (see moe_check.h). */
#include "moe_check.h"
#include "moe_verify.h"

#include <math.h>
#include <stdio.h>

static megamoe_comm_t *mm_comm;

static void mm_test_comm_destroy(void)
{
    if (mm_comm && megamoe_comm_destroy(mm_comm) != MEGAMOE_OK)
        fprintf(stderr, "destroying the world communicator: %s\n", megamoe_last_error());
    mm_comm = NULL;
}

megamoe_comm_t *mm_test_comm(void)
{
    if (mm_comm == NULL) {
        if (megamoe_comm_create(NULL, &mm_comm) != MEGAMOE_OK) {
            fprintf(stderr, "cannot create the world communicator: %s\n", megamoe_last_error());
            mm_comm = NULL;
            return NULL;
        }
        atexit(mm_test_comm_destroy);
    }
    return mm_comm;
}

static float *mm_f32(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

int mm_ref_compute(const mm_moe_problem_t *p, float limit, mm_ref_result_t *r)
{
    memset(r, 0, sizeof *r);
    const size_t N = (size_t)(p->ep * p->T);
    megamoe_reference_shape_t s = {p->ep, p->T, p->H, p->I, p->E, p->K};
    megamoe_reference_params_t rp = megamoe_reference_params_default();
    rp.swiglu_limit = limit;
    rp.hidden_dtype = MEGAMOE_DTYPE_BF16;
    rp.weight_dtype = MEGAMOE_DTYPE_BF16;
    rp.grad_dtype = MEGAMOE_DTYPE_BF16;
    r->clamp = limit > 0;
    float **sets[2][5] = {{&r->out, &r->gh, &r->gp, &r->g1, &r->g2},
                          {&r->out16, &r->gh16, &r->gp16, &r->g1_16, &r->g2_16}};
    const size_t n[5] = {N * (size_t)p->H, N * (size_t)p->H, N * (size_t)p->K,
                         (size_t)(p->E * p->H * 2 * p->I), (size_t)(p->E * p->I * p->H)};
    for (int m = 0; m < 2; m++) {
        float **o[5];
        for (int i = 0; i < 5; i++) {
            o[i] = sets[m][i];
            if ((*o[i] = mm_f32(n[i])) == NULL) return -1;
        }
        rp.bf16_intermediates = m;
        if (megamoe_reference_forward(&s, &rp, p->hidden, p->ids, p->probs, p->gate_up, p->down,
                                      *o[0]) != MEGAMOE_OK ||
            megamoe_reference_backward(&s, &rp, p->grad_out, p->hidden, p->ids, p->probs,
                                       p->gate_up, p->down, *o[1], *o[2], *o[3],
                                       *o[4]) != MEGAMOE_OK)
            return -1;
    }
    return 0;
}

void mm_ref_free(mm_ref_result_t *r)
{
    float *all[10] = {r->out,   r->gh,   r->gp,   r->g1,    r->g2,
                      r->out16, r->gh16, r->gp16, r->g1_16, r->g2_16};
    for (int i = 0; i < 10; i++) free(all[i]);
    memset(r, 0, sizeof *r);
}

void mm_layer_result_free(mm_layer_result_t *r)
{
    free(r->out);
    free(r->gh);
    free(r->gp);
    free(r->g1);
    free(r->g2);
    memset(r, 0, sizeof *r);
}

megamoe_experts_weights_t mm_local_weights(const mm_moe_problem_t *p, int me, uint64_t version)
{
    const int64_t L = p->E / p->ep;
    megamoe_experts_weights_t w = {p->gate_up + (size_t)(me * L * p->H * 2 * p->I),
                                   p->down + (size_t)(me * L * p->I * p->H), version};
    return w;
}

int mm_input_make(const mm_moe_problem_t *p, int me, const mm_call_opts_t *o, mm_input_buf_t *b)
{
    memset(b, 0, sizeof *b);
    const size_t TK = (size_t)(p->T * p->K), off = (size_t)me * TK;
    b->in = megamoe_experts_input_default();
    b->in.hidden_states = p->hidden + (size_t)me * (size_t)(p->T * p->H);
    if (o && o->ids64) {
        int64_t *ids = malloc(TK * sizeof *ids);
        if (!ids) return -1;
        for (size_t i = 0; i < TK; i++) ids[i] = p->ids[off + i];
        b->ids = ids;
        b->in.topk_ids = ids;
        b->in.topk_ids_dtype = MEGAMOE_DTYPE_INT64;
    } else {
        b->in.topk_ids = p->ids + off;
    }
    if (o && o->probs_bf16) {
        uint16_t *pr = malloc(TK * sizeof *pr);
        if (!pr) return -1;
        megamoe_convert(pr, MEGAMOE_DTYPE_BF16, p->probs + off, MEGAMOE_DTYPE_FP32, TK);
        b->probs = pr;
        b->in.topk_weights = pr;
        b->in.topk_weights_dtype = MEGAMOE_DTYPE_BF16;
    } else {
        b->in.topk_weights = p->probs + off;
    }
    if (o && o->tpe) {
        int64_t *h = calloc((size_t)p->E, sizeof *h);
        if (!h) return -1;
        for (size_t i = 0; i < TK; i++) h[p->ids[off + i]]++;
        if (o->tpe == 1) {
            int32_t *h32 = malloc((size_t)p->E * sizeof *h32);
            if (!h32) {
                free(h);
                return -1;
            }
            for (int64_t e = 0; e < p->E; e++) h32[e] = (int32_t)h[e];
            free(h);
            b->tpe = h32;
            b->in.tokens_per_expert_dtype = MEGAMOE_DTYPE_INT32;
        } else {
            b->tpe = h;
            b->in.tokens_per_expert_dtype = MEGAMOE_DTYPE_INT64;
        }
        b->in.tokens_per_expert = b->tpe;
    }
    return 0;
}

void mm_input_free(mm_input_buf_t *b)
{
    free(b->ids);
    free(b->probs);
    free(b->tpe);
    memset(b, 0, sizeof *b);
}

static float *mm_to_f32(const void *src, int bf16, size_t n)
{
    float *d = mm_f32(n);
    if (d) megamoe_convert(d, MEGAMOE_DTYPE_FP32, src, bf16 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32, n);
    return d;
}

int mm_layer_result_from(const mm_moe_problem_t *p, const uint16_t *out, const uint16_t *gh,
                         const void *gp, int gp_bf16, const uint16_t *g1, const uint16_t *g2,
                         mm_layer_result_t *res)
{
    const int64_t L = p->E / p->ep;
    memset(res, 0, sizeof *res);
    res->out = mm_to_f32(out, 1, (size_t)(p->T * p->H));
    res->gh = mm_to_f32(gh, 1, (size_t)(p->T * p->H));
    res->gp = mm_to_f32(gp, gp_bf16, (size_t)(p->T * p->K));
    res->g1 = mm_to_f32(g1, 1, (size_t)(L * p->H * 2 * p->I));
    res->g2 = mm_to_f32(g2, 1, (size_t)(L * p->I * p->H));
    return res->out && res->gh && res->gp && res->g1 && res->g2 ? 0 : -1;
}

int mm_close_bf16(const char *what, const float *got, const float *want, const float *want16,
                  size_t n, int clamp)
{
    mm_verify_t v;
    mm_verify(got, 0, want, want16, n, clamp, &v);
    printf("%s %s: fp32 oracle relL2 %.3f%% maxerr/maxref %.3f%%%s; bf16-intermediate reference: "
           "%.2f%% within rtol 2e-2 atol 2e-3*%.3g (%.2f%% within atol 2e-3), worst [%zu] got "
           "%.6g want %.6g\n",
           v.pass ? "PASS" : "FAIL", what, 100 * v.rel_l2, 100 * v.rel_max,
           clamp && !v.oracle_ok ? " (not binding: clamp)" : "", 100 * v.elementwise, v.scale,
           100 * v.elementwise_abs, v.worst, v.worst_got, v.worst_want);
    return v.pass;
}

int mm_compare(const char *what, const mm_moe_problem_t *p, int me, const mm_layer_result_t *got,
               const mm_ref_result_t *ref)
{
    const int64_t L = p->E / p->ep, T = p->T, H = p->H, I = p->I, K = p->K;
    const size_t w1 = (size_t)(H * 2 * I), w2 = (size_t)(I * H);
    char name[160];
    int ok = 1;
    snprintf(name, sizeof name, "%s: output", what);
    const size_t o_t = (size_t)(me * T * H), o_k = (size_t)(me * T * K);
    const size_t o_1 = (size_t)me * (size_t)L * w1, o_2 = (size_t)me * (size_t)L * w2;
    ok &= mm_close_bf16(name, got->out, ref->out + o_t, ref->out16 + o_t, (size_t)(T * H),
                        ref->clamp);
    snprintf(name, sizeof name, "%s: grad hidden", what);
    ok &= mm_close_bf16(name, got->gh, ref->gh + o_t, ref->gh16 + o_t, (size_t)(T * H),
                        ref->clamp);
    snprintf(name, sizeof name, "%s: grad topk_weights", what);
    ok &= mm_close_bf16(name, got->gp, ref->gp + o_k, ref->gp16 + o_k, (size_t)(T * K),
                        ref->clamp);
    snprintf(name, sizeof name, "%s: grad gate_up", what);
    ok &= mm_close_bf16(name, got->g1, ref->g1 + o_1, ref->g1_16 + o_1, (size_t)L * w1,
                        ref->clamp);
    snprintf(name, sizeof name, "%s: grad down", what);
    ok &= mm_close_bf16(name, got->g2, ref->g2 + o_2, ref->g2_16 + o_2, (size_t)L * w2,
                        ref->clamp);

    /* One SGD step (lr 0.5) from the bf16 weights: ours vs the reference's. */
    const float lr = 0.5f;
    float *mine = mm_f32((size_t)L * (w1 + w2)), *want = mm_f32((size_t)L * (w1 + w2));
    float *want16 = mm_f32((size_t)L * (w1 + w2));
    if (!mine || !want || !want16) ok = 0;
    for (size_t i = 0; ok && i < (size_t)L * w1; i++) {
        float w = megamoe_bf16_to_fp32(p->gate_up[(size_t)me * (size_t)L * w1 + i]);
        mine[i] = megamoe_bf16_to_fp32(megamoe_fp32_to_bf16(w - lr * got->g1[i]));
        want[i] = w - lr * ref->g1[o_1 + i];
        want16[i] = w - lr * ref->g1_16[o_1 + i];
    }
    for (size_t i = 0; ok && i < (size_t)L * w2; i++) {
        float w = megamoe_bf16_to_fp32(p->down[(size_t)me * (size_t)L * w2 + i]);
        mine[(size_t)L * w1 + i] = megamoe_bf16_to_fp32(megamoe_fp32_to_bf16(w - lr * got->g2[i]));
        want[(size_t)L * w1 + i] = w - lr * ref->g2[o_2 + i];
        want16[(size_t)L * w1 + i] = w - lr * ref->g2_16[o_2 + i];
    }
    snprintf(name, sizeof name, "%s: weights after one SGD step", what);
    if (ok) ok &= mm_close_bf16(name, mine, want, want16, (size_t)L * (w1 + w2), ref->clamp);
    free(mine);
    free(want);
    free(want16);

    /* Every value finite; experts with no token: exact zeros; others: some non-zero grad. */
    for (int64_t j = 0; j < L; j++) {
        int64_t e = me * L + j, slots = 0;
        for (int64_t i = 0; i < p->ep * T * K; i++) slots += p->ids[i] == e;
        int nonzero = 0, finite = 1;
        for (size_t i = 0; i < w1; i++) {
            float v = got->g1[(size_t)j * w1 + i];
            nonzero |= v != 0.0f;
            finite &= isfinite(v);
        }
        for (size_t i = 0; i < w2; i++) {
            float v = got->g2[(size_t)j * w2 + i];
            nonzero |= v != 0.0f;
            finite &= isfinite(v);
        }
        if (!finite || (slots == 0 && nonzero) || (slots > 0 && !nonzero)) {
            fprintf(stderr, "%s: expert %lld (%lld slots): finite=%d nonzero=%d\n", what,
                    (long long)e, (long long)slots, finite, nonzero);
            ok = 0;
        }
    }
    return ok;
}

megamoe_experts_params_t mm_params_shape(int64_t T, int64_t H, int64_t I, int64_t E, int64_t K)
{
    megamoe_experts_params_t p = megamoe_experts_params_default();
    p.local_num_tokens = T;
    p.hidden_size = H;
    p.intermediate_size = I;
    p.num_experts = E;
    p.top_k = K;
    return p;
}

int mm_run_alloc(mm_run_t *r, const mm_moe_problem_t *p)
{
    const int64_t L = p->E / p->ep;
    r->out = calloc((size_t)(p->T * p->H), 2);
    r->gh = calloc((size_t)(p->T * p->H), 2);
    r->gp = calloc((size_t)(p->T * p->K), 4);
    r->g1 = calloc((size_t)(L * p->H * 2 * p->I), 4);
    r->g2 = calloc((size_t)(L * p->I * p->H), 4);
    return r->out && r->gh && r->gp && r->g1 && r->g2 ? 0 : -1;
}

void mm_run_free(mm_run_t *r)
{
    free(r->out);
    free(r->gh);
    free(r->gp);
    free(r->g1);
    free(r->g2);
    memset(r, 0, sizeof *r);
}

megamoe_status_t mm_run_fwd_bwd(megamoe_experts_t *x, const mm_moe_problem_t *p, int me,
                                const megamoe_experts_weights_t *w, megamoe_dtype_t wg,
                                mm_run_t *r)
{
    mm_input_buf_t ib;
    if (mm_input_make(p, me, NULL, &ib) != 0) return MEGAMOE_OUT_OF_MEMORY;
    megamoe_experts_weights_t local = mm_local_weights(p, me, 1);
    if (w == NULL) w = &local;
    megamoe_experts_saved_t *sv = NULL;
    megamoe_status_t st = megamoe_experts_forward(x, w, &ib.in, r->out, &sv);
    if (st == MEGAMOE_OK) {
        megamoe_experts_grads_t g = {r->gh, r->gp, r->g1, r->g2, wg};
        st = megamoe_experts_backward(x, sv, w, p->grad_out + (size_t)(me * p->T * p->H), &g);
    }
    megamoe_experts_saved_destroy(sv);
    mm_input_free(&ib);
    return st;
}

int mm_run_same_bits(const char *what, const mm_run_t *a, const mm_run_t *b,
                     const mm_moe_problem_t *p, size_t wsize)
{
    const int64_t L = p->E / p->ep;
    struct {
        const char *name;
        const void *x, *y;
        size_t bytes;
    } t[5] = {{"output", a->out, b->out, (size_t)(p->T * p->H) * 2},
              {"grad hidden", a->gh, b->gh, (size_t)(p->T * p->H) * 2},
              {"grad topk_weights", a->gp, b->gp, (size_t)(p->T * p->K) * 4},
              {"grad gate_up", a->g1, b->g1, (size_t)(L * p->H * 2 * p->I) * wsize},
              {"grad down", a->g2, b->g2, (size_t)(L * p->I * p->H) * wsize}};
    int ok = 1;
    for (int i = 0; i < 5; i++) {
        const unsigned char *x = t[i].x, *y = t[i].y;
        for (size_t k = 0; k < t[i].bytes; k++)
            if (x[k] != y[k]) {
                fprintf(stderr, "%s: %s differs at byte %zu of %zu\n", what, t[i].name, k,
                        t[i].bytes);
                ok = 0;
                break;
            }
    }
    return ok;
}

/* ---- calls with per-call token counts (max_local_num_tokens) ---- */

/* The reference of a call where rank r passes its first n[r] rows: the whole problem with the
 * output gradient of every absent row zeroed, which removes exactly their contributions to
 * the weight gradients (their rows of out/grad are not compared). */
int mm_ref_compute_rows(const mm_moe_problem_t *P, const int64_t *n, mm_ref_result_t *ref)
{
    mm_moe_problem_t Q = *P;
    const size_t rows = (size_t)(P->ep * P->T), h = (size_t)P->H;
    uint16_t *g = malloc(rows * h * 2);
    if (g == NULL) return -1;
    memcpy(g, P->grad_out, rows * h * 2);
    for (int64_t r = 0; r < P->ep; r++)
        memset(g + ((size_t)(r * P->T) + (size_t)n[r]) * h, 0, (size_t)(P->T - n[r]) * h * 2);
    Q.grad_out = g;
    int rc = mm_ref_compute(&Q, 0.0f, ref);
    free(g);
    return rc;
}

static float *mm_rows_f32(const void *src, int bf16, size_t n)
{
    float *d = calloc(n ? n : 1, sizeof *d);
    if (d) megamoe_convert(d, MEGAMOE_DTYPE_FP32, src, bf16 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32, n);
    return d;
}

/* The rule of bench/moe_verify.h; the fp32 oracle's relative L2 / max bounds decide only for
 * tensors of at least 1024 values: for a call of 1 token, grad topk_weights has K values and one
 * bf16 rounding of a dot product moves their relative L2 by ~1 %, a statistic that says nothing
 * there (the elementwise bound against the bf16-intermediate reference always decides). */
static int mm_close_rows(const char *what, const float *got, const float *want,
                        const float *want16, size_t n)
{
    return mm_close_bf16(what, got, want, want16, n, n < 1024);
}

/* This rank's rows [0, n[me]) and its experts' weight gradients against the reference; an
 * expert no present token chose must have exact zero gradients. */
int mm_compare_rows(const char *what, const mm_moe_problem_t *P, int me, const int64_t *n,
                    const mm_run_t *got, const mm_ref_result_t *ref)
{
    const int64_t L = P->E / P->ep, T = P->T, H = P->H, I = P->I, K = P->K, t = n[me];
    const size_t w1 = (size_t)(L * H * 2 * I), w2 = (size_t)(L * I * H);
    const size_t o_t = (size_t)(me * T * H), o_k = (size_t)(me * T * K);
    const size_t o_1 = (size_t)me * w1, o_2 = (size_t)me * w2;
    float *out = mm_rows_f32(got->out, 1, (size_t)(t * H)), *gh = mm_rows_f32(got->gh, 1, (size_t)(t * H));
    float *gp = mm_rows_f32(got->gp, 0, (size_t)(t * K));
    float *g1 = mm_rows_f32(got->g1, 1, w1), *g2 = mm_rows_f32(got->g2, 1, w2);
    int ok = out && gh && gp && g1 && g2;
    char name[160];
    if (ok && t > 0) {
        snprintf(name, sizeof name, "%s: output", what);
        ok &= mm_close_rows(name, out, ref->out + o_t, ref->out16 + o_t, (size_t)(t * H));
        snprintf(name, sizeof name, "%s: grad hidden", what);
        ok &= mm_close_rows(name, gh, ref->gh + o_t, ref->gh16 + o_t, (size_t)(t * H));
        snprintf(name, sizeof name, "%s: grad topk_weights", what);
        ok &= mm_close_rows(name, gp, ref->gp + o_k, ref->gp16 + o_k, (size_t)(t * K));
    }
    for (int64_t j = 0; ok && j < L; j++) {
        int64_t e = me * L + j, slots = 0;
        for (int64_t r = 0; r < P->ep; r++)
            for (int64_t i = 0; i < n[r] * K; i++) slots += P->ids[r * T * K + i] == e;
        const size_t a = (size_t)j * (w1 / (size_t)L), b = (size_t)j * (w2 / (size_t)L);
        int nonzero = 0;
        for (size_t i = 0; i < w1 / (size_t)L; i++) nonzero |= g1[a + i] != 0.0f;
        for (size_t i = 0; i < w2 / (size_t)L; i++) nonzero |= g2[b + i] != 0.0f;
        if ((slots == 0) == nonzero) {
            fprintf(stderr, "%s: expert %lld has %lld slots but nonzero=%d\n", what, (long long)e,
                    (long long)slots, nonzero);
            ok = 0;
        }
    }
    if (ok) {
        snprintf(name, sizeof name, "%s: grad gate_up", what);
        ok &= mm_close_rows(name, g1, ref->g1 + o_1, ref->g1_16 + o_1, w1);
        snprintf(name, sizeof name, "%s: grad down", what);
        ok &= mm_close_rows(name, g2, ref->g2 + o_2, ref->g2_16 + o_2, w2);
    }
    free(out);
    free(gh);
    free(gp);
    free(g1);
    free(g2);
    return ok;
}

