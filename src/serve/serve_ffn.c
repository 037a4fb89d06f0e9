/* One expert's FFN in every scene (spec §6.2-6.5): F(x) = act(x . W1) . W2 with the scene's
 * quantisation steps. Integer and MX operands enter the bf16 GEMMs as their exact bf16 images
 * (int8, int4, fp8 and fp4 values — times a power-of-two block scale for MX — are all exact
 * in bf16), so every product is exact and only the fp32 accumulation rounds; the per-channel
 * and per-row scales, the A8W4 offsets, the activation and its re-quantisation are fp32
 * epilogues. Weights of the quantised scenes are decoded once per expert and call
 * (mm_sv_prepare); the bf16 scene reads the caller's weights directly. */
#include <math.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "kernels/qgemm.h"
#include "kernels/quant.h"
#include "kernels/rows.h"
#include "megamoe/dtype.h"
#include "serve/serve_impl.h"

static inline uint16_t mm_sv_bf16_exact(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

/* per-channel scale i of a 32-bit float or 64-bit (low 32 bits = fp32 bits) container */
static inline float mm_sv_scale_at(const void *s, int kind, int64_t i)
{
    float f;
    if (kind == MM_SV_SF_LOW32) memcpy(&f, (const char *)s + (size_t)i * 8, 4); /* little endian */
    else memcpy(&f, (const char *)s + (size_t)i * 4, 4);
    return f;
}

static inline int mm_sv_int4_at(const void *w, int carrier, int64_t N, int64_t k, int64_t n)
{
    unsigned nib;
    if (carrier == MEGAMOE_DTYPE_INT32) {
        uint32_t word;
        memcpy(&word, (const char *)w + ((size_t)k * (size_t)(N / 8) + (size_t)(n / 8)) * 4, 4);
        nib = (word >> (4 * (n % 8))) & 15u;
    } else {
        uint8_t byte = ((const uint8_t *)w)[(size_t)k * (size_t)(N / 2) + (size_t)(n / 2)];
        nib = (n & 1) ? byte >> 4 : byte & 15u;
    }
    return nib >= 8 ? (int)nib - 16 : (int)nib; /* two's complement */
}

static int mm_sv_is_int(const mm_sv_experts_t *set)
{
    return set->scene == MM_SV_A8W8_INT || set->scene == MM_SV_A8W4_INT;
}

size_t mm_sv_prepare_bytes(const mm_sv_experts_t *set)
{
    if (set->scene == MM_SV_A16W16) return 64;
    if (mm_sv_is_int(set)) /* sig1, sig2, off1, off2 */
        return mm_align_up((size_t)(2 * set->I + set->H) * 2 * sizeof(float), 64);
    const size_t H = (size_t)set->H, I = (size_t)set->I;
    return mm_align_up(H * 2 * I * 2, 64) + mm_align_up(I * H * 2, 64) +
           mm_align_up((2 * I + H) * 2 * sizeof(float), 64);
}

/* Decode one weight matrix of K inputs x N outputs into bf16 images. */
static void mm_sv_decode(const mm_sv_experts_t *set, const void *w, const void *sf, int64_t K,
                         int64_t N, uint16_t *out, float *sig, float *colsum)
{
    switch (set->scene) {
    case MM_SV_A8W8_INT: /* [K, N] int8 */
        for (int64_t k = 0; k < K; k++) {
            const int8_t *row = (const int8_t *)w + k * N;
            for (int64_t n = 0; n < N; n++) out[k * N + n] = mm_sv_bf16_exact((float)row[n]);
        }
        for (int64_t n = 0; n < N; n++) sig[n] = mm_sv_scale_at(sf, set->sf_kind, n);
        break;
    case MM_SV_A8W4_INT: /* [K, N] int4, packed along N */
        for (int64_t n = 0; n < N; n++) colsum[n] = 0.0f;
        for (int64_t k = 0; k < K; k++)
            for (int64_t n = 0; n < N; n++) {
                int v = mm_sv_int4_at(w, set->int4_carrier, N, k, n);
                out[k * N + n] = mm_sv_bf16_exact((float)v);
                colsum[n] += (float)v; /* |sum| < 2^24: exact */
            }
        for (int64_t n = 0; n < N; n++) sig[n] = mm_sv_scale_at(sf, set->sf_kind, n);
        break;
    default: { /* MX: [N, K] fp8 or [N, K/2] fp4, e8m0 [N, ceil(K/64), 2] */
        const int64_t per_row = 2 * ((K + 63) / 64);
        const uint8_t *b = w, *s = sf;
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) {
                float v = set->wtype == MEGAMOE_SERVE_TYPE_FP4_E2M1
                              ? mm_sv_fp4_to_f32((uint8_t)(b[n * (K / 2) + k / 2] >> ((k & 1) * 4)))
                              : mm_sv_fp8_to_f32(b[n * K + k], set->wtype);
                float d = v * mm_sv_e8m0_to_f32(s[n * per_row + k / MM_SV_MX_BLOCK]);
                out[n * K + k] = megamoe_fp32_to_bf16(d); /* exact */
            }
        break;
    }
    }
}

megamoe_status_t mm_sv_prepare(const mm_sv_experts_t *set, int e, void *scratch,
                               mm_sv_prepared_t *pw)
{
    const int64_t H = set->H, I = set->I;
    const mm_gemm_backend_ops_t *gemm = pw->gemm;
    memset(pw, 0, sizeof *pw);
    pw->gemm = gemm;
    if (set->scene == MM_SV_A16W16) {
        pw->w1 = set->w1[e];
        pw->w2 = set->w2[e];
        pw->ld1 = 2 * I;
        pw->ld2 = H;
        /* the packed copies from the cache: a decode step streams each weight once */
        MM_CHECK(mm_sv_wcache_bf16(gemm, pw->w1, H, 2 * I, 2 * I, set->version, set->stamp, &pw->pk1));
        MM_CHECK(mm_sv_wcache_bf16(gemm, pw->w2, I, H, H, set->version, set->stamp, &pw->pk2));
        return MEGAMOE_OK;
    }
    if (mm_sv_is_int(set)) { /* the integer kernels on packed copies from the cache */
        const int int4 = set->scene == MM_SV_A8W4_INT;
        const int32_t *cs1 = NULL, *cs2 = NULL;
        MM_CHECK(mm_sv_wcache_q(int4, set->w1[e], H, 2 * I, int4 ? I : 2 * I, set->version,
                                set->stamp, &pw->q1, &cs1));
        MM_CHECK(mm_sv_wcache_q(int4, set->w2[e], I, H, int4 ? H / 2 : H, set->version,
                                set->stamp, &pw->q2, &cs2));
        float *sig1 = scratch, *sig2 = sig1 + 2 * I, *off1 = sig2 + H, *off2 = off1 + 2 * I;
        for (int64_t n = 0; n < 2 * I; n++) sig1[n] = mm_sv_scale_at(set->s1[e], set->sf_kind, n);
        for (int64_t n = 0; n < H; n++) sig2[n] = mm_sv_scale_at(set->s2[e], set->sf_kind, n);
        pw->sig1 = sig1;
        pw->sig2 = sig2;
        if (int4 && set->b1[e]) { /* off = B - 8 colsum(V o sigma) */
            for (int64_t n = 0; n < 2 * I; n++)
                off1[n] = set->b1[e][n] - 8.0f * ((float)cs1[n] * sig1[n]);
            for (int64_t n = 0; n < H; n++)
                off2[n] = set->b2[e][n] - 8.0f * ((float)cs2[n] * sig2[n]);
            pw->off1 = off1;
            pw->off2 = off2;
        }
        return MEGAMOE_OK;
    }
    char *p = scratch;
    uint16_t *w1 = (uint16_t *)(void *)p;
    p += mm_align_up((size_t)H * 2 * (size_t)I * 2, 64);
    uint16_t *w2 = (uint16_t *)(void *)p;
    p += mm_align_up((size_t)I * (size_t)H * 2, 64);
    float *f = (float *)(void *)p; /* sig1 [2I], sig2 [H], cs1 [2I], cs2 [H] */
    float *sig1 = f, *sig2 = f + 2 * I, *cs1 = sig2 + H, *cs2 = cs1 + 2 * I;
    mm_sv_decode(set, set->w1[e], set->s1[e], H, 2 * I, w1, sig1, cs1);
    mm_sv_decode(set, set->w2[e], set->s2[e], I, H, w2, sig2, cs2);
    pw->w1 = w1;
    pw->w2 = w2;
    const int mx = set->scene >= MM_SV_A8W8_FP;
    pw->nt = mx;
    pw->ld1 = mx ? H : 2 * I;
    pw->ld2 = mx ? I : H;
    if (!mx) {
        pw->sig1 = sig1;
        pw->sig2 = sig2;
    }
    if (set->scene == MM_SV_A8W4_INT && set->b1[e]) { /* off = B - 8 colsum(V o sigma) */
        for (int64_t n = 0; n < 2 * I; n++) cs1[n] = set->b1[e][n] - 8.0f * (cs1[n] * sig1[n]);
        for (int64_t n = 0; n < H; n++) cs2[n] = set->b2[e][n] - 8.0f * (cs2[n] * sig2[n]);
        pw->off1 = cs1;
        pw->off2 = cs2;
    }
    return MEGAMOE_OK;
}

/* ---- one tile ------------------------------------------------------------------------------- */

typedef struct mm_sv_tile {
    uint16_t *a1;   /* [T, H] bf16 */
    float *sx, *sa; /* [T] */
    float *c1;      /* [T, 2I] */
    float *act;     /* [T, I] */
    uint16_t *a2;   /* [T, I] bf16 */
    float *c2;      /* [T, H] */
    uint8_t *qrow;  /* one quantised row of max(H, I) elements + scales */
    uint16_t *brow; /* one bf16 row of I */
} mm_sv_tile_t;

static size_t mm_sv_tile_layout(const mm_sv_experts_t *set, mm_sv_tile_t *t, char *base)
{
    const size_t T = MM_SV_TILE, H = (size_t)set->H, I = (size_t)set->I;
    const size_t mx = H > I ? H : I;
    size_t sizes[9] = {T * H * 2, T * 4, T * 4, T * 2 * I * 4, T * I * 4, T * I * 2, T * H * 4,
                       2 * mx + 64 + (mx + 31) / 32, I * 2};
    void **slots[9] = {(void **)&t->a1, (void **)&t->sx, (void **)&t->sa, (void **)&t->c1,
                       (void **)&t->act, (void **)&t->a2, (void **)&t->c2, (void **)&t->qrow,
                       (void **)&t->brow};
    size_t off = 0;
    for (int i = 0; i < 9; i++) {
        if (base) *slots[i] = base + off;
        off += mm_align_up(sizes[i], 64);
    }
    return off;
}

size_t mm_sv_tile_bytes(const mm_sv_experts_t *set)
{
    mm_sv_tile_t t;
    return mm_sv_tile_layout(set, &t, NULL);
}

static megamoe_status_t mm_sv_gemm(const mm_sv_prepared_t *pw, int nt, int64_t M, int64_t K,
                                   int64_t N, const uint16_t *A, int64_t lda, const uint16_t *B,
                                   int64_t ldb, const mm_gemm_weight_t *packed, float *C)
{
    mm_gemm_args_t g;
    mm_gemm_args_init(&g);
    g.form = nt ? MM_GEMM_NT : MM_GEMM_NN;
    g.M = M;
    g.K = K;
    g.N = N;
    g.A = A;
    g.lda = lda;
    if (packed) {
        g.weight = packed; /* its own backend */
    } else {
        g.B = B;
        g.ldb = ldb;
        g.backend = pw->gemm;
    }
    g.C = C;
    g.ldc = N;
    g.c_type = MEGAMOE_DTYPE_FP32;
    return mm_gemm(&g);
}

/* integer scenes: h = (C * sig + off) * s per row; others keep C */
static void mm_sv_epilogue(float *c, int64_t rows, int64_t N, const float *sig, const float *off,
                           const float *s)
{
    if (sig == NULL) return;
    for (int64_t r = 0; r < rows; r++) {
        float *row = c + r * N;
        for (int64_t n = 0; n < N; n++) {
            float v = row[n] * sig[n];
            if (off) v = v + off[n];
            row[n] = v * s[r];
        }
    }
}

static megamoe_status_t mm_sv_qgemm(const mm_qweight_t *w, const float *sig, const float *off,
                                    int64_t rows, int64_t K, int64_t N, const int8_t *A,
                                    int64_t lda, const float *xs, float *C)
{
    mm_qgemm_expert_t ex;
    memset(&ex, 0, sizeof ex);
    ex.weight = w;
    ex.w_scale = sig;
    ex.bias_pre = off;
    mm_qgemm_args_t g;
    mm_qgemm_args_init(&g);
    g.num_groups = 1;
    g.group_rows = &rows;
    g.experts = &ex;
    g.K = K;
    g.N = N;
    g.a_type = MEGAMOE_DTYPE_INT8;
    g.A = A;
    g.lda = lda;
    g.a_num_rows = rows;
    g.x_scale = xs;
    g.C = C;
    g.ldc = N;
    g.c_type = MEGAMOE_DTYPE_FP32;
    return mm_qgemm(&g);
}

/* A8W8 / A8W4: int8 rows (q, then the fp32 scale at align4(H)) through the integer kernels */
static megamoe_status_t mm_sv_ffn_tile_int(const mm_sv_experts_t *set, const mm_sv_prepared_t *pw,
                                           const mm_sv_act_t *act, int64_t rows, const void *in,
                                           size_t ld, mm_sv_tile_t *t)
{
    const int64_t H = set->H, I = set->I;
    const size_t soff = ((size_t)H + 3) / 4 * 4;
    for (int64_t r = 0; r < rows; r++) memcpy(&t->sx[r], (const char *)in + (size_t)r * ld + soff, 4);
    MM_CHECK(mm_sv_qgemm(pw->q1, pw->sig1, pw->off1, rows, H, 2 * I, in, (int64_t)ld, t->sx, t->c1));
    mm_sv_activation(act, rows, I, t->c1, 2 * I, t->act, I);
    int8_t *qa = (int8_t *)(void *)t->a2; /* [rows, I] int8 in the bf16 tile's room */
    MM_CHECK(mm_quant_rows_int8(MM_QROW_SYM127, t->act, MEGAMOE_DTYPE_FP32, rows, I, I, NULL, qa,
                                I, t->sa));
    return mm_sv_qgemm(pw->q2, pw->sig2, pw->off2, rows, I, H, qa, I, t->sa, t->c2);
}

megamoe_status_t mm_sv_ffn_tile(const mm_sv_experts_t *set, const mm_sv_prepared_t *pw,
                                const mm_sv_act_t *act, int64_t rows, const void *in, size_t ld,
                                void *scratch, uint16_t *out, size_t ldo, float *acc)
{
    const int64_t H = set->H, I = set->I;
    mm_sv_tile_t t;
    mm_sv_tile_layout(set, &t, scratch);
    if (pw->q1) {
        MM_CHECK(mm_sv_ffn_tile_int(set, pw, act, rows, in, ld, &t));
        goto out;
    }
    /* GMM1 input: the rows as they came (bf16), or their exact bf16 images */
    const uint16_t *a1 = t.a1;
    int64_t lda1 = H;
    if (set->atype == MEGAMOE_SERVE_TYPE_BF16) {
        a1 = in;
        lda1 = (int64_t)(ld / 2);
    } else {
        for (int64_t r = 0; r < rows; r++)
            mm_sv_row_to_bf16((const char *)in + (size_t)r * ld, set->atype, H, t.a1 + r * H,
                              &t.sx[r]);
    }
    MM_CHECK(mm_sv_gemm(pw, pw->nt, rows, H, 2 * I, a1, lda1, pw->w1, pw->ld1, pw->pk1, t.c1));
    mm_sv_epilogue(t.c1, rows, 2 * I, pw->sig1, pw->off1, t.sx);
    mm_sv_activation(act, rows, I, t.c1, 2 * I, t.act, I);
    /* GMM2 input */
    for (int64_t r = 0; r < rows; r++) {
        const float *a = t.act + r * I;
        uint16_t *o = t.a2 + r * I;
        switch (set->atype2) {
        case MEGAMOE_SERVE_TYPE_BF16:
            megamoe_convert(o, MEGAMOE_DTYPE_BF16, a, MEGAMOE_DTYPE_FP32, (size_t)I);
            break;
        case MEGAMOE_SERVE_TYPE_INT8: {
            int8_t *q = (int8_t *)t.qrow;
            mm_sv_quant_int8_f32(a, I, q, &t.sa[r]);
            for (int64_t i = 0; i < I; i++) o[i] = mm_sv_bf16_exact((float)q[i]);
            break;
        }
        default: /* MX: the activation in bf16, then its MX blocks */
            megamoe_convert(t.brow, MEGAMOE_DTYPE_BF16, a, MEGAMOE_DTYPE_FP32, (size_t)I);
            mm_sv_row_quant(t.brow, set->atype2, I, t.qrow);
            mm_sv_row_to_bf16(t.qrow, set->atype2, I, o, NULL);
            break;
        }
    }
    MM_CHECK(mm_sv_gemm(pw, pw->nt, rows, I, H, t.a2, I, pw->w2, pw->ld2, pw->pk2, t.c2));
    mm_sv_epilogue(t.c2, rows, H, pw->sig2, pw->off2, t.sa);
out:
    for (int64_t r = 0; r < rows; r++) {
        const float *f = t.c2 + r * H;
        if (acc) mm_rows_axpy_f32(acc + r * H, f, 1.0f, H);
        else megamoe_convert((char *)out + (size_t)r * ldo, MEGAMOE_DTYPE_BF16, f,
                             MEGAMOE_DTYPE_FP32, (size_t)H);
    }
    return MEGAMOE_OK;
}
