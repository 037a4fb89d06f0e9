/* Quantised GEMMs (kernels/qgemm.h): every product bit-exact against a plain-C reference that
 * works from the unpacked integer values (exact int64 sums, then the documented fp32 steps),
 * on edge shapes (K not a multiple of 4, 8, 64; N not a multiple of 64; M = 1; empty groups;
 * gathered rows with repeats; saturation; all-zero rows; zero scales; K groups with a short
 * last group), for the AVX-512 kernels and their C twins alike (and so the two equal each
 * other); sub-blocks and row blocks change no bit; the float epilogue against an fp64
 * evaluation of the same formula within the bound docs/kernels.md derives; in-place refresh;
 * argument errors. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "harness/harness.h"
#include "kernels/gemm_impl.h"
#include "kernels/qgemm.h"
#include "kernels/simd.h"
#include "megamoe/dtype.h"
#include "megamoe/log.h"

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (uint32_t)(rs >> 11);
}
static int rnd_int(int lo, int hi) { return lo + (int)(rnd() % (uint32_t)(hi - lo + 1)); }
static float rnd_f(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() % 1000001u) / 1e6f; }

/* Value patterns. */
enum { VAL_RANDOM, VAL_EXTREME, VAL_ZERO };

typedef struct qcase {
    mm_qw_type_t type;
    mm_qw_layout_t layout;
    int64_t K, N, gs;
    int a_bf16;
    megamoe_dtype_t c_type;
    int ng;
    int64_t rows[6];
    int gather;     /* gather list with repeats */
    int ws, wo, bias_i32, bias_pre, bias_post, xs; /* which parameters are present */
    int wval, aval; /* value patterns of weights and activations */
    int zero_scales;
} qcase_t;

/* Everything one case needs, and the reference. */
typedef struct qdata {
    qcase_t c;
    int64_t R, G, arows;
    int8_t *v;        /* [ng][K][N] weight values */
    uint8_t *src;     /* [ng] sources in the case's layout */
    int64_t src_ld, src_bytes;
    void *A;          /* [arows][K] int8 or bf16 */
    int32_t *index;
    float *xs, *ws, *wo, *bpre, *bpost; /* ws/wo: [ng][G][N]; biases [ng][N] */
    int32_t *bi32;
    mm_qweight_t *w[6];
    mm_qgemm_expert_t ex[6];
} qdata_t;

static int8_t qvalue(const qcase_t *c, int pattern)
{
    const int lo = c->type == MM_QW_INT8 ? -128 : -8, hi = c->type == MM_QW_INT8 ? 127 : 7;
    if (pattern == VAL_ZERO) return 0;
    if (pattern == VAL_EXTREME) return (int8_t)(rnd() & 1 ? lo : hi);
    return (int8_t)rnd_int(lo, hi);
}

static void make_source(qdata_t *d, int g)
{
    const qcase_t *c = &d->c;
    uint8_t *s = d->src + g * d->src_bytes;
    memset(s, 0xA5, (size_t)d->src_bytes); /* padding bytes past a row must be ignored */
    for (int64_t k = 0; k < c->K; k++)
        for (int64_t n = 0; n < c->N; n++) {
            const int v = d->v[(g * c->K + k) * c->N + n];
            const int64_t row = c->layout == MM_QW_KN ? k : n, col = c->layout == MM_QW_KN ? n : k;
            if (c->type == MM_QW_INT8) {
                s[row * d->src_ld + col] = (uint8_t)v;
            } else {
                uint8_t *b = &s[row * d->src_ld + col / 2];
                if (col & 1) *b = (uint8_t)((*b & 0x0F) | ((v & 15) << 4));
                else *b = (uint8_t)((*b & 0xF0) | (v & 15));
            }
        }
}

static megamoe_status_t qdata_make(qdata_t *d, const qcase_t *c)
{
    memset(d, 0, sizeof *d);
    d->c = *c;
    d->G = c->gs ? (c->K + c->gs - 1) / c->gs : 1;
    for (int g = 0; g < c->ng; g++) d->R += c->rows[g];
    d->arows = c->gather ? d->R / 2 + 1 : d->R;
    const int64_t K = c->K, N = c->N;
    d->v = malloc((size_t)(c->ng * K * N));
    int64_t row = c->layout == MM_QW_KN ? N : K, nrows = c->layout == MM_QW_KN ? K : N;
    if (c->type == MM_QW_INT4) row = (row + 1) / 2;
    d->src_ld = row + 3; /* a padded row stride */
    d->src_bytes = d->src_ld * nrows;
    d->src = malloc((size_t)(c->ng * d->src_bytes));
    const size_t asz = c->a_bf16 ? 2 : 1;
    d->A = malloc((size_t)((d->arows + 1) * (K + 5)) * asz);
    d->index = malloc((size_t)(d->R + 1) * sizeof(int32_t));
    d->xs = malloc((size_t)(d->arows + 1) * sizeof(float));
    d->ws = malloc((size_t)(c->ng * d->G * (N + 7)) * sizeof(float));
    d->wo = malloc((size_t)(c->ng * d->G * (N + 7)) * sizeof(float));
    d->bpre = malloc((size_t)(c->ng * N) * sizeof(float));
    d->bpost = malloc((size_t)(c->ng * N) * sizeof(float));
    d->bi32 = malloc((size_t)(c->ng * N) * sizeof(int32_t));
    for (int64_t i = 0; i < c->ng * K * N; i++) d->v[i] = qvalue(c, c->wval);
    for (int g = 0; g < c->ng; g++) make_source(d, g);
    const int64_t lda = K + 5;
    for (int64_t r = 0; r < d->arows; r++)
        for (int64_t k = 0; k < lda; k++) {
            if (c->a_bf16) {
                float x = c->aval == VAL_ZERO ? 0.0f : rnd_f(-2.0f, 2.0f);
                ((uint16_t *)d->A)[r * lda + k] = megamoe_fp32_to_bf16(x);
            } else {
                int8_t x = c->aval == VAL_ZERO      ? 0
                           : c->aval == VAL_EXTREME ? (int8_t)(rnd() & 1 ? -128 : 127)
                                                    : (int8_t)rnd_int(-128, 127);
                ((int8_t *)d->A)[r * lda + k] = x;
            }
        }
    if (c->aval != VAL_ZERO && d->arows > 2) { /* one all-zero row among the others */
        memset((char *)d->A + (size_t)(d->arows / 2) * lda * asz, 0, (size_t)K * asz);
    }
    for (int64_t r = 0; r < d->R; r++) d->index[r] = (int32_t)(rnd() % (uint32_t)d->arows);
    for (int64_t r = 0; r < d->arows; r++) d->xs[r] = r == 1 ? 0.0f : rnd_f(0.001f, 0.05f);
    const int64_t lds = N + 7;
    for (int64_t i = 0; i < c->ng * d->G * lds; i++) {
        d->ws[i] = c->zero_scales && (i % 5 == 0) ? 0.0f : rnd_f(-0.02f, 0.02f);
        d->wo[i] = (float)rnd_int(-3, 3) * 0.5f;
    }
    for (int64_t i = 0; i < c->ng * N; i++) {
        d->bpre[i] = rnd_f(-3.0f, 3.0f);
        d->bpost[i] = rnd_f(-1.0f, 1.0f);
        d->bi32[i] = rnd_int(-100000, 100000);
    }
    for (int g = 0; g < c->ng; g++) {
        mm_qweight_src_t s = {c->type, c->layout, K, N, d->src + g * d->src_bytes, d->src_ld, c->gs};
        megamoe_status_t st = mm_qweight_create(&s, 1, &d->w[g]);
        if (st != MEGAMOE_OK) return st;
        mm_qgemm_expert_t *e = &d->ex[g];
        e->weight = d->w[g];
        e->ld_scale = lds;
        e->w_scale = c->ws ? d->ws + g * d->G * lds : NULL;
        e->w_offset = c->wo ? d->wo + g * d->G * lds : NULL;
        e->bias_i32 = c->bias_i32 ? d->bi32 + g * N : NULL;
        e->bias_pre = c->bias_pre ? d->bpre + g * N : NULL;
        e->bias_post = c->bias_post ? d->bpost + g * N : NULL;
    }
    return MEGAMOE_OK;
}

static void qdata_free(qdata_t *d)
{
    for (int g = 0; g < d->c.ng; g++) mm_qweight_destroy(d->w[g]);
    free(d->v), free(d->src), free(d->A), free(d->index), free(d->xs), free(d->ws), free(d->wo);
    free(d->bpre), free(d->bpost), free(d->bi32);
}

static void qargs(const qdata_t *d, mm_qgemm_args_t *a, void *C)
{
    const qcase_t *c = &d->c;
    mm_qgemm_args_init(a);
    a->num_groups = c->ng;
    a->group_rows = c->rows;
    a->experts = d->ex;
    a->K = c->K;
    a->N = c->N;
    a->a_type = c->a_bf16 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_INT8;
    a->A = d->A;
    a->lda = c->K + 5;
    a->a_index = c->gather ? d->index : NULL;
    a->a_num_rows = d->arows;
    a->x_scale = c->xs ? d->xs : NULL;
    a->C = C;
    a->ldc = c->N + 2;
    a->c_type = c->c_type;
}

static size_t csize(const qdata_t *d) { return (size_t)(d->R * (d->c.N + 2)) * 4; }

/* The reference: from the integer values, the formula of qgemm.h. */
static void reference(const qdata_t *d, void *C)
{
    const qcase_t *c = &d->c;
    const int64_t K = c->K, N = c->N, lda = K + 5, ldc = N + 2, lds = N + 7;
    const int64_t gs = c->gs ? c->gs : K;
    int64_t r = 0;
    for (int g = 0; g < c->ng; g++)
        for (int64_t rr = 0; rr < c->rows[g]; rr++, r++) {
            const int64_t i = c->gather ? d->index[r] : r;
            for (int64_t n = 0; n < N; n++) {
                const int8_t *v = d->v + (g * K) * N + n;
                float s;
                if (!c->a_bf16) {
                    const int8_t *x = (const int8_t *)d->A + i * lda;
                    if (c->c_type == MEGAMOE_DTYPE_INT32 || d->G == 1) {
                        int64_t acc = 0;
                        for (int64_t k = 0; k < K; k++) acc += (int64_t)x[k] * v[k * N];
                        int32_t a32 = (int32_t)acc;
                        if (c->bias_i32) a32 = (int32_t)((uint32_t)a32 + (uint32_t)d->bi32[g * N + n]);
                        if (c->c_type == MEGAMOE_DTYPE_INT32) {
                            ((int32_t *)C)[r * ldc + n] = a32;
                            continue;
                        }
                        s = (float)a32;
                        if (c->ws) s = s * d->ws[(g * d->G) * lds + n];
                    } else {
                        s = 0;
                        for (int64_t kg = 0; kg < d->G; kg++) {
                            int64_t acc = 0;
                            for (int64_t k = kg * gs; k < K && k < (kg + 1) * gs; k++)
                                acc += (int64_t)x[k] * v[k * N];
                            float t = (float)acc;
                            if (c->ws) t = t * d->ws[(g * d->G + kg) * lds + n];
                            s = kg == 0 ? t : s + t;
                        }
                    }
                } else {
                    const uint16_t *x = (const uint16_t *)d->A + i * lda;
                    s = 0.0f;
                    for (int64_t kg = 0; kg < d->G; kg++) {
                        float p = 0.0f;
                        for (int64_t k = kg * gs; k < K && k < (kg + 1) * gs; k++) {
                            float w = (float)v[k * N];
                            if (c->wo) w = w + d->wo[(g * d->G + kg) * lds + n];
                            p = fmaf(megamoe_bf16_to_fp32(x[k]), w, p);
                        }
                        if (c->ws) p = p * d->ws[(g * d->G + kg) * lds + n];
                        s = kg == 0 ? p : s + p;
                    }
                }
                if (c->bias_pre) s = s + d->bpre[g * N + n];
                if (c->xs) s = s * d->xs[i];
                if (c->bias_post) s = s + d->bpost[g * N + n];
                if (c->c_type == MEGAMOE_DTYPE_FP32) ((float *)C)[r * ldc + n] = s;
                else ((uint16_t *)C)[r * ldc + n] = megamoe_fp32_to_bf16(s);
            }
        }
}

/* Element (r, n) of C as raw bits for comparison. */
static uint32_t cbits(const qdata_t *d, const void *C, int64_t r, int64_t n)
{
    const int64_t o = r * (d->c.N + 2) + n;
    if (d->c.c_type == MEGAMOE_DTYPE_BF16) return ((const uint16_t *)C)[o];
    uint32_t u;
    memcpy(&u, (const char *)C + o * 4, 4);
    return u;
}

/* -1 when equal, else the first differing element's flat index. */
static int64_t first_diff(const qdata_t *d, const void *X, const void *Y)
{
    for (int64_t r = 0; r < d->R; r++)
        for (int64_t n = 0; n < d->c.N; n++)
            if (cbits(d, X, r, n) != cbits(d, Y, r, n)) return r * d->c.N + n;
    return -1;
}

/* Run the case on both implementations (where the CPU has the vector one) against the
 * reference; 1 when all equal. */
static int run_case(const qcase_t *c, const char *label)
{
    qdata_t d;
    if (qdata_make(&d, c) != MEGAMOE_OK) {
        mm_test_fail(__FILE__, __LINE__, "%s: setup: %s", label, megamoe_last_error());
        return 0;
    }
    const size_t cs = csize(&d);
    void *ref = calloc(1, cs), *got = malloc(cs);
    reference(&d, ref);
    int ok = 1;
    const megamoe_dtype_t at = c->a_bf16 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_INT8;
    for (int vec = 0; vec < 2 && ok; vec++) {
        int prev = mm_kernels_set_vector(vec);
        const char *impl = mm_qgemm_impl_name(at);
        if (vec == 1 && strcmp(impl, "c") == 0) { /* no vector kernel on this CPU */
            mm_kernels_set_vector(prev);
            break;
        }
        /* every element a NaN-ish sentinel, so an element left unwritten shows */
        const size_t es = megamoe_dtype_size(c->c_type);
        memcpy(got, ref, cs);
        for (int64_t r = 0; r < d.R; r++)
            for (int64_t n = 0; n < c->N; n++)
                memset((char *)got + (size_t)(r * (c->N + 2) + n) * es, 0x7d, es);
        mm_qgemm_args_t a;
        qargs(&d, &a, got);
        megamoe_status_t st = mm_qgemm(&a);
        mm_kernels_set_vector(prev);
        if (st != MEGAMOE_OK) {
            mm_test_fail(__FILE__, __LINE__, "%s [%s]: %s", label, impl, megamoe_last_error());
            ok = 0;
            break;
        }
        int64_t bad = first_diff(&d, got, ref);
        if (bad >= 0) {
            mm_test_fail(__FILE__, __LINE__, "%s [%s]: C[%lld][%lld] = 0x%x, reference 0x%x", label,
                         impl, (long long)(bad / c->N), (long long)(bad % c->N),
                         cbits(&d, got, bad / c->N, bad % c->N), cbits(&d, ref, bad / c->N, bad % c->N));
            ok = 0;
        }
    }
    free(ref), free(got);
    qdata_free(&d);
    return ok;
}

static qcase_t base_case(mm_qw_type_t t, int64_t K, int64_t N)
{
    qcase_t c;
    memset(&c, 0, sizeof c);
    c.type = t;
    c.layout = MM_QW_KN;
    c.K = K, c.N = N;
    c.c_type = MEGAMOE_DTYPE_FP32;
    c.ng = 1;
    c.rows[0] = 5;
    c.ws = c.xs = 1;
    return c;
}

MM_TEST(w8a8_w4a8_edge_shapes_bit_exact)
{
    static const int64_t Ks[] = {1, 3, 4, 7, 8, 13, 64, 65, 100, 127, 257, 1030};
    static const int64_t Ns[] = {1, 17, 63, 64, 65, 130};
    char label[128];
    for (int t = 0; t < 2; t++)
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++) {
                qcase_t c = base_case((mm_qw_type_t)t, Ks[ki], Ns[ni]);
                c.rows[0] = (int64_t)(1 + (ki + ni) % 9);
                c.layout = (ki + ni) % 2 ? MM_QW_NK : MM_QW_KN;
                c.c_type = ni % 2 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32;
                snprintf(label, sizeof label, "%s K=%lld N=%lld M=%lld", t ? "w4a8" : "w8a8",
                         (long long)c.K, (long long)c.N, (long long)c.rows[0]);
                ASSERT_TRUE(run_case(&c, label));
            }
}

/* Decode-size blocks of several tiles (M = 7 .. 17: tiles of 4-6 rows sharing K chunks of
 * 64 quads) on K that spans several chunks and ends off a chunk, a 64 and a quad. */
MM_TEST(w8a8_w4a8_decode_tiles_bit_exact)
{
    static const int64_t Ms[] = {7, 8, 15, 16, 17};
    static const int64_t Ks[] = {257, 600, 1413};
    char label[128];
    for (int t = 0; t < 2; t++)
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
            for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
                qcase_t c = base_case((mm_qw_type_t)t, Ks[ki], ki == 1 ? 130 : 64);
                c.rows[0] = Ms[mi];
                c.c_type = mi % 2 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32;
                c.gather = (int)(ki == 2);
                snprintf(label, sizeof label, "%s K=%lld N=%lld M=%lld", t ? "w4a8" : "w8a8",
                         (long long)c.K, (long long)c.N, (long long)c.rows[0]);
                ASSERT_TRUE(run_case(&c, label));
            }
}

MM_TEST(grouped_gathered_empty_groups_and_row_blocks)
{
    char label[128];
    for (int t = 0; t < 2; t++)
        for (int gather = 0; gather < 2; gather++) {
            qcase_t c = base_case((mm_qw_type_t)t, 200, 150);
            c.ng = 5;
            /* an empty first and middle group, one decode-size group, one of several row
             * blocks (> 36 rows) and M = 1 */
            c.rows[0] = 0, c.rows[1] = 7, c.rows[2] = 0, c.rows[3] = 41, c.rows[4] = 1;
            c.gather = gather;
            c.bias_pre = c.bias_post = 1;
            snprintf(label, sizeof label, "%s gather=%d", t ? "w4a8" : "w8a8", gather);
            ASSERT_TRUE(run_case(&c, label));
        }
}

MM_TEST(saturation_zero_rows_and_zero_scales)
{
    char label[128];
    for (int t = 0; t < 2; t++)
        for (int pat = 0; pat < 3; pat++) {
            qcase_t c = base_case((mm_qw_type_t)t, 1000, 70);
            c.rows[0] = 13;
            c.wval = pat == 0 ? VAL_EXTREME : pat == 1 ? VAL_RANDOM : VAL_EXTREME;
            c.aval = pat == 0 ? VAL_EXTREME : pat == 1 ? VAL_ZERO : VAL_RANDOM;
            c.zero_scales = 1;
            c.c_type = MEGAMOE_DTYPE_BF16;
            snprintf(label, sizeof label, "%s pattern %d", t ? "w4a8" : "w8a8", pat);
            ASSERT_TRUE(run_case(&c, label));
        }
    /* The largest magnitude int8 sums: K = MM_QGEMM_MAX_K-sized rows of -128 x -128 would be
     * 2^31 - 2^14; a shorter all-extreme product checks the wrap-around correction. */
    qcase_t c = base_case(MM_QW_INT8, 4096, 64);
    c.rows[0] = 2;
    c.wval = VAL_EXTREME, c.aval = VAL_EXTREME;
    c.c_type = MEGAMOE_DTYPE_INT32;
    c.ws = c.xs = 0;
    ASSERT_TRUE(run_case(&c, "int8 extremes int32 out"));
}

MM_TEST(int32_output_and_int32_bias)
{
    for (int t = 0; t < 2; t++) {
        qcase_t c = base_case((mm_qw_type_t)t, 333, 100);
        c.c_type = MEGAMOE_DTYPE_INT32;
        c.ws = c.xs = 0;
        c.bias_i32 = 1;
        c.ng = 3;
        c.rows[0] = 4, c.rows[1] = 0, c.rows[2] = 9;
        c.gather = 1;
        ASSERT_TRUE(run_case(&c, t ? "w4a8 int32" : "w8a8 int32"));
        c.c_type = MEGAMOE_DTYPE_FP32; /* int32 bias before the scales */
        c.ws = c.xs = 1;
        ASSERT_TRUE(run_case(&c, t ? "w4a8 int32 bias, fp32 out" : "w8a8 int32 bias, fp32 out"));
    }
}

MM_TEST(k_groups_with_a_short_last_group)
{
    static const int64_t gss[] = {8, 16, 64, 128};
    static const int64_t Ks[] = {8, 60, 129, 1000};
    char label[128];
    for (int t = 0; t < 2; t++)
        for (size_t gi = 0; gi < 4; gi++)
            for (size_t ki = 0; ki < 4; ki++) {
                qcase_t c = base_case((mm_qw_type_t)t, Ks[ki], 96);
                c.gs = gss[gi];
                c.rows[0] = (int64_t)(1 + gi * 3 + ki);
                c.bias_pre = ki & 1;
                c.c_type = gi & 1 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32;
                snprintf(label, sizeof label, "%s K=%lld gs=%lld", t ? "w4a8" : "w8a8",
                         (long long)c.K, (long long)c.gs);
                ASSERT_TRUE(run_case(&c, label));
            }
}

MM_TEST(weight_only_bf16_activations)
{
    static const int64_t Ks[] = {1, 5, 64, 67, 300};
    char label[128];
    for (int t = 0; t < 2; t++)
        for (size_t ki = 0; ki < 5; ki++)
            for (int gsv = 0; gsv < 2; gsv++) {
                qcase_t c = base_case((mm_qw_type_t)t, Ks[ki], 80);
                c.a_bf16 = 1;
                c.xs = 0;
                c.wo = (int)(ki & 1);
                c.gs = gsv ? 16 : 0;
                c.bias_post = 1;
                c.rows[0] = (int64_t)(1 + 4 * ki);
                c.ng = 2;
                c.rows[1] = 40;
                c.gather = (int)(ki & 1);
                c.layout = gsv ? MM_QW_NK : MM_QW_KN;
                c.c_type = ki & 1 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32;
                snprintf(label, sizeof label, "%s K=%lld gs=%lld", t ? "w4a16" : "w8a16",
                         (long long)c.K, (long long)c.gs);
                ASSERT_TRUE(run_case(&c, label));
            }
}

/* Any sub-block, and any split into row and column pieces, gives the same bits. */
MM_TEST(sub_blocks_change_no_bit)
{
    for (int t = 0; t < 4; t++) {
        qcase_t c = base_case((mm_qw_type_t)(t & 1), 700, 200);
        c.a_bf16 = t >= 2;
        c.xs = !c.a_bf16;
        c.ng = 2;
        c.rows[0] = 23, c.rows[1] = 50;
        c.gs = t == 1 ? 64 : 0;
        qdata_t d;
        ASSERT_OK(qdata_make(&d, &c));
        const size_t cs = csize(&d);
        void *whole = calloc(1, cs), *parts = calloc(1, cs);
        mm_qgemm_args_t a;
        qargs(&d, &a, whole);
        ASSERT_OK(mm_qgemm(&a));
        static const int64_t mcut[] = {0, 1, 20, 23, 24, 60, 73};
        static const int64_t ncut[] = {0, 64, 128, 200};
        for (int i = 0; i + 1 < 7; i++)
            for (int j = 0; j + 1 < 4; j++) {
                qargs(&d, &a, parts);
                a.m0 = mcut[i], a.m1 = mcut[i + 1], a.n0 = ncut[j], a.n1 = ncut[j + 1];
                ASSERT_OK(mm_qgemm(&a));
            }
        ASSERT_EQ_INT(first_diff(&d, whole, parts), -1);
        free(whole), free(parts);
        qdata_free(&d);
    }
}

/* The float epilogue against fp64 of the same formula (exact integer sums), within the bound
 * of docs/kernels.md: |y - y64| <= (G + 4) u S, u = 2^-24, S = the sum of the magnitudes of
 * the terms: (sum_g |acc_g ws_g| + |bias_pre|) |xs| + |bias_post|; bf16 output adds its
 * rounding, 2^-8 (|y64| + (G + 4) u S). */
MM_TEST(epilogue_within_the_fp64_bound)
{
    for (int t = 0; t < 4; t++) {
        qcase_t c = base_case((mm_qw_type_t)(t & 1), 4096, 128);
        c.rows[0] = 9;
        c.gs = t >= 2 ? 128 : 0;
        c.bias_pre = c.bias_post = 1;
        c.c_type = t == 1 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32;
        qdata_t d;
        ASSERT_OK(qdata_make(&d, &c));
        void *C = calloc(1, csize(&d));
        mm_qgemm_args_t a;
        qargs(&d, &a, C);
        ASSERT_OK(mm_qgemm(&a));
        const int64_t K = c.K, N = c.N, lds = N + 7, gs = c.gs ? c.gs : K, lda = K + 5;
        double worst = 0;
        for (int64_t r = 0; r < d.R; r++)
            for (int64_t n = 0; n < N; n++) {
                const int8_t *x = (const int8_t *)d.A + r * lda;
                double y = 0, S = 0;
                for (int64_t g = 0; g < d.G; g++) {
                    int64_t acc = 0;
                    for (int64_t k = g * gs; k < K && k < (g + 1) * gs; k++)
                        acc += (int64_t)x[k] * d.v[k * N + n];
                    y += (double)acc * d.ws[g * lds + n];
                    S += fabs((double)acc * d.ws[g * lds + n]);
                }
                y = (y + d.bpre[n]) * d.xs[r] + d.bpost[n];
                S = (S + fabs(d.bpre[n])) * fabs(d.xs[r]) + fabs(d.bpost[n]);
                double got = c.c_type == MEGAMOE_DTYPE_FP32
                                 ? ((float *)C)[r * (N + 2) + n]
                                 : megamoe_bf16_to_fp32(((uint16_t *)C)[r * (N + 2) + n]);
                const int b16 = c.c_type == MEGAMOE_DTYPE_BF16;
                double bound = (double)(d.G + 4) * ldexp(1.0, -24) * S * (b16 ? 1 + ldexp(1.0, -8) : 1) +
                               (b16 ? ldexp(1.0, -8) * fabs(y) : 0);
                double err = fabs(got - y);
                if (err > bound)
                    MM_FAIL_("case %d: C[%lld][%lld] = %.9g, fp64 %.12g, error %.3g > bound %.3g",
                             t, (long long)r, (long long)n, got, y, err, bound);
                if (bound > 0 && err / bound > worst) worst = err / bound;
            }
        printf("case %d: worst error / bound = %.3f\n", t, worst);
        free(C);
        qdata_free(&d);
    }
}

MM_TEST(refresh_in_place_equals_a_fresh_pack)
{
    for (int t = 0; t < 2; t++) {
        qcase_t c = base_case((mm_qw_type_t)t, 150, 90);
        qdata_t d;
        ASSERT_OK(qdata_make(&d, &c));
        void *C1 = calloc(1, csize(&d)), *C2 = calloc(1, csize(&d));
        /* new values in a new buffer, in the other layout */
        qcase_t c2 = c;
        c2.layout = MM_QW_NK;
        qdata_t d2;
        ASSERT_OK(qdata_make(&d2, &c2));
        mm_qweight_src_t s = {c.type, MM_QW_NK, c.K, c.N, d2.src, d2.src_ld, 0};
        int repacked = -1;
        ASSERT_OK(mm_qweight_update(d.w[0], &s, 1, &repacked)); /* new data pointer */
        ASSERT_EQ_INT(repacked, 1);
        ASSERT_OK(mm_qweight_update(d.w[0], &s, 1, &repacked)); /* nothing changed */
        ASSERT_EQ_INT(repacked, 0);
        ASSERT_OK(mm_qweight_update(d.w[0], &s, 2, &repacked)); /* a new version */
        ASSERT_EQ_INT(repacked, 1);
        ASSERT_EQ_U64(mm_qweight_version(d.w[0]), 2);
        /* d's weight now holds d2's values: products with d's activations and d2's weight
         * object must agree */
        mm_qgemm_args_t a;
        qargs(&d, &a, C1);
        ASSERT_OK(mm_qgemm(&a));
        mm_qgemm_expert_t e = d.ex[0];
        e.weight = d2.w[0];
        a.experts = &e;
        a.C = C2;
        ASSERT_OK(mm_qgemm(&a));
        ASSERT_EQ_INT(first_diff(&d, C1, C2), -1);
        s.K = c.K + 1;
        ASSERT_STATUS(mm_qweight_update(d.w[0], &s, 3, NULL), MEGAMOE_INVALID_ARGUMENT);
        ASSERT_CONTAINS(megamoe_last_error(), "create a new one");
        free(C1), free(C2);
        qdata_free(&d);
        qdata_free(&d2);
    }
}

MM_TEST(argument_errors_are_named)
{
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    int8_t wv[64 * 16];
    memset(wv, 1, sizeof wv);
    mm_qweight_src_t s = {MM_QW_INT8, MM_QW_KN, 16, 64, wv, 64, 0};
    mm_qweight_t *w = NULL;
    s.group_size = 12;
    ASSERT_STATUS(mm_qweight_create(&s, 0, &w), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "multiple of 8");
    s.group_size = 0;
    s.ld = 63;
    ASSERT_STATUS(mm_qweight_create(&s, 0, &w), MEGAMOE_INVALID_ARGUMENT);
    s.ld = 64;
    s.K = MM_QGEMM_MAX_K + 1;
    ASSERT_STATUS(mm_qweight_create(&s, 0, &w), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "exact in int32");
    s.K = 16;
    ASSERT_OK(mm_qweight_create(&s, 0, &w));
    int8_t A[4 * 16];
    memset(A, 1, sizeof A);
    float C[4 * 64], sc[64] = {0};
    int64_t rows = 4;
    mm_qgemm_expert_t e = {w, sc, NULL, 0, NULL, NULL, NULL};
    mm_qgemm_args_t a;
    mm_qgemm_args_init(&a);
    a.num_groups = 1, a.group_rows = &rows, a.experts = &e, a.K = 16, a.N = 64;
    a.A = A, a.lda = 16, a.C = C, a.ldc = 64;
    ASSERT_OK(mm_qgemm(&a));
    a.n0 = 32;
    ASSERT_STATUS(mm_qgemm(&a), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "multiple of 64");
    a.n0 = 0;
    a.c_type = MEGAMOE_DTYPE_INT32;
    ASSERT_STATUS(mm_qgemm(&a), MEGAMOE_INVALID_ARGUMENT); /* scales with int32 out */
    ASSERT_CONTAINS(megamoe_last_error(), "int32 output");
    a.c_type = MEGAMOE_DTYPE_FP32;
    int32_t idx[4] = {0, 1, 4, 2};
    a.a_index = idx, a.a_num_rows = 4;
    ASSERT_STATUS(mm_qgemm(&a), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "a_index[2]");
    a.a_index = NULL;
    a.K = 17;
    ASSERT_STATUS(mm_qgemm(&a), MEGAMOE_INVALID_ARGUMENT);
    a.K = 16;
    float off[64] = {0};
    e.w_offset = off;
    ASSERT_STATUS(mm_qgemm(&a), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "w_offset");
    e.w_offset = NULL;
    ASSERT_OK(mm_qgemm(&a)); /* usable after the errors */
    mm_qweight_destroy(w);
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
}

/* The AVX-512 kernels against their C twins directly, on a mix of the cases above (the cases
 * above compare each implementation with the reference; this one names the vector kernels). */
MM_TEST(avx512_kernels_equal_their_c_twins)
{
    const int vnni = strcmp(mm_qgemm_impl_name(MEGAMOE_DTYPE_INT8), "avx512_vnni") == 0;
    const int fma = strcmp(mm_qgemm_impl_name(MEGAMOE_DTYPE_BF16), "avx512_fma") == 0;
    if (!vnni && !fma) MM_SKIP("no AVX-512 here: only the C twins run");
    for (int t = 0; t < 8; t++) {
        qcase_t c = base_case((mm_qw_type_t)(t & 1), 37 + 300 * (t % 3), 70 + 20 * t);
        c.a_bf16 = t >= 4;
        if (c.a_bf16 ? !fma : !vnni) continue;
        c.xs = !c.a_bf16;
        c.ng = 3;
        c.rows[0] = 1, c.rows[1] = 0, c.rows[2] = 45;
        c.gather = t & 2;
        c.gs = t % 3 == 2 ? 64 : 0;
        c.bias_pre = c.bias_post = 1;
        c.c_type = t & 2 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32;
        qdata_t d;
        ASSERT_OK(qdata_make(&d, &c));
        void *C0 = calloc(1, csize(&d)), *C1 = calloc(1, csize(&d));
        mm_qgemm_args_t a;
        int prev = mm_kernels_set_vector(0);
        qargs(&d, &a, C0);
        megamoe_status_t s0 = mm_qgemm(&a);
        mm_kernels_set_vector(1);
        qargs(&d, &a, C1);
        megamoe_status_t s1 = mm_qgemm(&a);
        mm_kernels_set_vector(prev);
        ASSERT_OK(s0);
        ASSERT_OK(s1);
        ASSERT_EQ_INT(first_diff(&d, C0, C1), -1);
        free(C0), free(C1);
        qdata_free(&d);
    }
    printf("int8 A: %s, bf16 A: %s\n", mm_qgemm_impl_name(MEGAMOE_DTYPE_INT8),
           mm_qgemm_impl_name(MEGAMOE_DTYPE_BF16));
    if (!vnni) MM_SKIP("no AVX512-VNNI here: the int8 kernels were not compared (bf16 ones were)");
}

/* Weight-only products take bf16, fp16 or fp32 activations, widened exactly: the same values
 * in any of the three give the same bits (values on a 1/64 grid, exact in all three). */
MM_TEST(weight_only_fp16_and_fp32_activations_match_bf16)
{
    for (int t = 0; t < 2; t++) {
        qcase_t c = base_case((mm_qw_type_t)t, 130, 70);
        c.a_bf16 = 1;
        c.xs = 0;
        c.wo = 1;
        c.gs = 16;
        c.rows[0] = 9;
        qdata_t d;
        ASSERT_OK(qdata_make(&d, &c));
        const int64_t lda = c.K + 5, n = d.arows * lda;
        float *x32 = malloc((size_t)n * sizeof(float));
        uint16_t *x16 = malloc((size_t)n * sizeof(uint16_t));
        for (int64_t i = 0; i < n; i++) {
            const float v = (float)((int)(rnd() % 257) - 128) / 64.0f;
            ((uint16_t *)d.A)[i] = megamoe_fp32_to_bf16(v);
            x32[i] = v;
            x16[i] = megamoe_fp32_to_fp16(v);
        }
        void *C[3];
        const megamoe_dtype_t at[3] = {MEGAMOE_DTYPE_BF16, MEGAMOE_DTYPE_FP32, MEGAMOE_DTYPE_FP16};
        for (int k = 0; k < 3; k++) {
            C[k] = calloc(1, csize(&d));
            mm_qgemm_args_t a;
            qargs(&d, &a, C[k]);
            a.a_type = at[k];
            a.A = k == 0 ? d.A : k == 1 ? (const void *)x32 : (const void *)x16;
            ASSERT_OK(mm_qgemm(&a));
        }
        ASSERT_EQ_INT(first_diff(&d, C[0], C[1]), -1);
        ASSERT_EQ_INT(first_diff(&d, C[0], C[2]), -1);
        for (int k = 0; k < 3; k++) free(C[k]);
        free(x32), free(x16);
        qdata_free(&d);
    }
}

/* Two threads multiply through the same packed weights at once (read-only, per-thread
 * scratch): each gets the single-threaded bits. Runs under ThreadSanitizer too (label tsan). */
typedef struct conc_job {
    const qdata_t *d;
    void *C;
    int iters;
    megamoe_status_t st;
} conc_job_t;

static void *conc_main(void *p)
{
    conc_job_t *j = p;
    for (int i = 0; i < j->iters && j->st == MEGAMOE_OK; i++) {
        mm_qgemm_args_t a;
        qargs(j->d, &a, j->C);
        j->st = mm_qgemm(&a);
    }
    return NULL;
}

MM_TEST(concurrent_products_share_weights)
{
    for (int t = 0; t < 2; t++) {
        qcase_t c = base_case((mm_qw_type_t)t, 300, 130);
        c.ng = 2;
        c.rows[0] = 3, c.rows[1] = 40;
        c.gather = 1;
        c.bias_pre = 1;
        qdata_t d;
        ASSERT_OK(qdata_make(&d, &c));
        void *ref = calloc(1, csize(&d));
        mm_qgemm_args_t a;
        qargs(&d, &a, ref);
        ASSERT_OK(mm_qgemm(&a));
        conc_job_t jobs[2];
        pthread_t th[2];
        for (int k = 0; k < 2; k++) {
            jobs[k].d = &d;
            jobs[k].C = calloc(1, csize(&d));
            jobs[k].iters = 20;
            jobs[k].st = MEGAMOE_OK;
            ASSERT_EQ_INT(pthread_create(&th[k], NULL, conc_main, &jobs[k]), 0);
        }
        for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
        for (int k = 0; k < 2; k++) {
            ASSERT_OK(jobs[k].st);
            ASSERT_EQ_INT(first_diff(&d, jobs[k].C, ref), -1);
            free(jobs[k].C);
        }
        free(ref);
        qdata_free(&d);
    }
}

/* The VmFlags line (and AnonHugePages, in kB) of the mapping holding p, from /proc/self/smaps. */
static int mapping_of(const void *p, char *flags, size_t len, long *huge_kb)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (f == NULL) return 0;
    char line[512];
    int inside = 0, found = 0;
    *huge_kb = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            if (found) break;
            inside = (uintptr_t)p >= a && (uintptr_t)p < b;
        } else if (inside && !strncmp(line, "AnonHugePages:", 14)) {
            *huge_kb = atol(line + 14);
        } else if (inside && !strncmp(line, "VmFlags:", 8)) {
            size_t n = strlen(line + 8) < len - 1 ? strlen(line + 8) : len - 1;
            memcpy(flags, line + 8, n);
            flags[n] = '\0';
            found = 1;
        }
    }
    fclose(f);
    return found;
}

/* Packed weights from the huge-page threshold on: whole 2 MiB pages in a mapping of their own,
 * hinted before the packing touches them (heap memory another user had faulted with 4 KiB pages
 * keeps them: in a serving process only 26 of 94 MB of packed weights were on huge pages), and
 * on huge pages once touched where THP is on for hinted memory. Below the threshold: the aligned
 * heap. Both freed by mm_gemm_packed_free_from. */
MM_TEST(packed_weights_get_fresh_huge_page_mappings)
{
    /* memory another user filled and freed first (as a framework's tensors leave the heap) */
    char *junk = malloc((size_t)24 << 20);
    ASSERT_TRUE(junk != NULL);
    memset(junk, 1, (size_t)24 << 20);
    free(junk);
    const size_t huge = (size_t)2 << 20;
    void *p = NULL;
    size_t bytes = 0;
    ASSERT_OK(mm_gemm_packed_alloc_from(3 * huge / 2, huge, "test weight", &p, &bytes));
    ASSERT_EQ_INT((long)bytes, (long)(2 * huge)); /* whole huge pages */
    ASSERT_TRUE(((uintptr_t)p & (huge - 1)) == 0);
    memset(p, 7, bytes); /* the packing's first touch */
    char flags[256] = "";
    long huge_kb = -1;
    ASSERT_TRUE(mapping_of(p, flags, sizeof flags, &huge_kb));
    ASSERT_TRUE(strstr(flags, " hg") != NULL); /* MADV_HUGEPAGE on the mapping */
    FILE *t = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char mode[128] = "";
    if (t) {
        if (fgets(mode, sizeof mode, t) == NULL) mode[0] = '\0';
        fclose(t);
    }
    if (mode[0] && strstr(mode, "[never]") == NULL) /* THP on for hinted memory: huge now */
        ASSERT_TRUE(huge_kb >= 2048);
    mm_gemm_packed_free_from(p, bytes, huge);
    /* below the threshold: the heap, 64-byte aligned, freed the same way */
    ASSERT_OK(mm_gemm_packed_alloc_from(huge / 2, huge, "test weight", &p, &bytes));
    ASSERT_EQ_INT((long)bytes, (long)(huge / 2));
    ASSERT_TRUE(((uintptr_t)p & 63) == 0);
    memset(p, 7, bytes);
    mm_gemm_packed_free_from(p, bytes, huge);
    mm_gemm_packed_free_from(NULL, 0, huge);
}
