/* Portable C twins of the quantised GEMM kernels (qgemm_impl.h): the definition of every
 * result. The AVX-512 kernels (qgemm_avx512.c) give the same bits; tests compare the two
 * (mm_kernels_set_vector(0) selects these) and check these against a plain integer reference.
 * Integer sums use uint32_t (wrap-around is the defined arithmetic); fp32 steps are single
 * IEEE operations (the build uses -ffp-contract=off; the FMA chain calls fmaf). */
#include <math.h>
#include <string.h>

#include "megamoe/dtype.h"
#include "qgemm_impl.h"

static inline int32_t mm_u2i(uint32_t v)
{
    int32_t r;
    memcpy(&r, &v, sizeof r);
    return r;
}

/* Weight byte u of column c, k j of quad q (q counted from the panel's first quad at b). */
static inline int mm_u_i8(const uint8_t *b, int64_t q, int c, int j)
{
    return b[q * 256 + c * 4 + j];
}

static inline int mm_u_i4(const uint8_t *b, int64_t q, int c, int j)
{
    uint8_t x = b[(q / 2) * 256 + c * 4 + j];
    return (q & 1) ? x >> 4 : x & 15;
}

/* int8 A: t[r][c] (+)= sum over the quads of u * a (wrap-around). The A micro-panel is int8
 * [q][6][4]. b points at the first quad (for int4 the first quad is even). */
static void mm_qk_ukr_int_c(int mr, const mm_qk_ukr_args_t *p, int int4)
{
    int32_t *acc = p->acc;
    const int8_t *a = p->a;
    uint32_t t[MM_QK_MR][MM_QK_NR];
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < MM_QK_NR; c++) t[r][c] = p->cont ? (uint32_t)acc[r * MM_QK_NR + c] : 0u;
    for (int64_t q = 0; q < p->nq; q++)
        for (int r = 0; r < mr; r++) {
            const int8_t *aq = a + (q * MM_QK_MR + r) * 4;
            for (int c = 0; c < MM_QK_NR; c++) {
                int32_t s = 0;
                for (int j = 0; j < 4; j++)
                    s += (int4 ? mm_u_i4(p->b, q, c, j) : mm_u_i8(p->b, q, c, j)) * (int32_t)aq[j];
                t[r][c] += (uint32_t)s;
            }
        }
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < MM_QK_NR; c++) acc[r * MM_QK_NR + c] = mm_u2i(t[r][c]);
}

static void mm_qk_ukr_i8_c(int mr, const mm_qk_ukr_args_t *p) { mm_qk_ukr_int_c(mr, p, 0); }
static void mm_qk_ukr_i4_c(int mr, const mm_qk_ukr_args_t *p) { mm_qk_ukr_int_c(mr, p, 1); }

/* bf16 A (fp32 micro-panel [k][6]): t[r][c] = fmaf(a, w', t) over the valid k ascending. */
static void mm_qk_ukr_wo_c(int mr, const mm_qk_ukr_args_t *p, int int4)
{
    float *acc = p->acc;
    const float *a = p->a;
    float t[MM_QK_MR][MM_QK_NR];
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < MM_QK_NR; c++) t[r][c] = p->cont ? acc[r * MM_QK_NR + c] : 0.0f;
    for (int64_t q = 0; q < p->nq; q++) {
        const int kmax = q == p->nq - 1 ? p->kv : 4;
        for (int j = 0; j < kmax; j++)
            for (int c = 0; c < MM_QK_NR; c++) {
                /* b is at the call's first quad, which is even for int4 (segments start at
                 * chunk or group boundaries, both multiples of 8 k) */
                int u = int4 ? mm_u_i4(p->b, q, c, j) : mm_u_i8(p->b, q, c, j);
                float wd = (float)(u - (int4 ? 8 : 128));
                if (!p->no_offset) wd = wd + p->wo[c];
                for (int r = 0; r < mr; r++)
                    t[r][c] = fmaf(a[(q * 4 + j) * MM_QK_MR + r], wd, t[r][c]);
            }
    }
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < MM_QK_NR; c++) acc[r * MM_QK_NR + c] = t[r][c];
}

static void mm_qk_ukr_w8_c(int mr, const mm_qk_ukr_args_t *p) { mm_qk_ukr_wo_c(mr, p, 0); }
static void mm_qk_ukr_w4_c(int mr, const mm_qk_ukr_args_t *p) { mm_qk_ukr_wo_c(mr, p, 1); }

static void mm_qk_flush_c(const mm_qk_epi_args_t *e)
{
    for (int r = 0; r < e->mr; r++)
        for (int64_t c = 0; c < e->nr; c++) {
            float t;
            if (e->fp_acc) {
                memcpy(&t, &e->i32[r * MM_QK_NR + c], sizeof t);
            } else {
                uint32_t v = (uint32_t)e->i32[r * MM_QK_NR + c] - (uint32_t)e->corr[r];
                t = (float)mm_u2i(v);
            }
            if (e->ws) t = t * e->ws[c];
            float *o = &e->f32[r * MM_QK_NR + c];
            *o = e->first ? t : *o + t;
        }
}

static void mm_qk_epilogue_c(const mm_qk_epi_args_t *e)
{
    for (int r = 0; r < e->mr; r++)
        for (int64_t c = 0; c < e->nr; c++) {
            float s;
            if (e->groups_mode == 0 && e->fp_acc) {
                memcpy(&s, &e->i32[r * MM_QK_NR + c], sizeof s);
                if (e->ws) s = s * e->ws[c];
            } else if (e->groups_mode == 0) {
                uint32_t v = (uint32_t)e->i32[r * MM_QK_NR + c] - (uint32_t)e->corr[r];
                if (e->bias_i32) v += (uint32_t)e->bias_i32[c];
                if (e->c_type == MEGAMOE_DTYPE_INT32) {
                    ((int32_t *)e->c)[r * e->ldc + c] = mm_u2i(v);
                    continue;
                }
                s = (float)mm_u2i(v);
                if (e->ws) s = s * e->ws[c];
            } else {
                s = e->f32[r * MM_QK_NR + c];
            }
            if (e->bias_pre) s = s + e->bias_pre[c];
            if (e->xs) s = s * e->xs[r];
            if (e->bias_post) s = s + e->bias_post[c];
            if (e->c_type == MEGAMOE_DTYPE_FP32) ((float *)e->c)[r * e->ldc + c] = s;
            else ((uint16_t *)e->c)[r * e->ldc + c] = megamoe_fp32_to_bf16(s);
        }
}

static int32_t mm_qk_rowsum_c(const int8_t *x, int64_t n)
{
    uint32_t s = 0;
    for (int64_t i = 0; i < n; i++) s += (uint32_t)(int32_t)x[i];
    return mm_u2i(s);
}

const mm_qk_kernels_t mm_qk_kernels_c = {
    .ukr_i8 = mm_qk_ukr_i8_c,
    .ukr_i4 = mm_qk_ukr_i4_c,
    .ukr_w8 = mm_qk_ukr_w8_c,
    .ukr_w4 = mm_qk_ukr_w4_c,
    .flush = mm_qk_flush_c,
    .epilogue = mm_qk_epilogue_c,
    .rowsum = mm_qk_rowsum_c,
};

/* ---- packing ----------------------------------------------------------------------------- */

/* Value (k, n) of the source, sign-extended. */
static inline int mm_src_value(const mm_qweight_src_t *s, int64_t k, int64_t n)
{
    const uint8_t *d = s->data;
    const int64_t row = s->layout == MM_QW_KN ? k : n, col = s->layout == MM_QW_KN ? n : k;
    if (s->type == MM_QW_INT8) return (int8_t)d[row * s->ld + col];
    uint8_t x = d[row * s->ld + col / 2];
    int v = (col & 1) ? x >> 4 : x & 15;
    return v >= 8 ? v - 16 : v;
}

/* Values of source row k (of the logical [K, N]), columns [n0, n0 + 64), zero past K and N. */
static void mm_src_row(const mm_qweight_src_t *s, int64_t k, int64_t n0, int8_t v[MM_QK_NR])
{
    memset(v, 0, MM_QK_NR);
    if (k >= s->K) return;
    const int64_t cols = s->N - n0 < MM_QK_NR ? s->N - n0 : MM_QK_NR;
    const uint8_t *d = s->data;
    if (s->layout == MM_QW_KN && s->type == MM_QW_INT8) {
        memcpy(v, d + k * s->ld + n0, (size_t)cols);
    } else if (s->layout == MM_QW_KN) { /* n0 is even: byte n0/2 + c/2 */
        const uint8_t *row = d + k * s->ld + n0 / 2;
        for (int64_t c = 0; c < cols; c++) {
            int x = (c & 1) ? row[c / 2] >> 4 : row[c / 2] & 15;
            v[c] = (int8_t)(x >= 8 ? x - 16 : x);
        }
    } else {
        for (int64_t c = 0; c < cols; c++) v[c] = (int8_t)mm_src_value(s, k, n0 + c);
    }
}

void mm_qk_pack_panel_c(const mm_qweight_t *w, const mm_qweight_src_t *src, int64_t p, uint8_t *dst)
{
    const int64_t n0 = p * MM_QK_NR;
    int8_t v[8][MM_QK_NR];
    if (w->type == MM_QW_INT8) {
        for (int64_t q = 0; q < w->kq; q++) {
            for (int j = 0; j < 4; j++) mm_src_row(src, 4 * q + j, n0, v[j]);
            uint8_t *o = dst + q * 256;
            for (int c = 0; c < MM_QK_NR; c++)
                for (int j = 0; j < 4; j++) o[c * 4 + j] = (uint8_t)(v[j][c] + 128);
        }
        return;
    }
    for (int64_t oc = 0; oc < w->kq / 2; oc++) {
        for (int j = 0; j < 8; j++) mm_src_row(src, 8 * oc + j, n0, v[j]);
        uint8_t *o = dst + oc * 256;
        for (int c = 0; c < MM_QK_NR; c++)
            for (int j = 0; j < 4; j++)
                o[c * 4 + j] = (uint8_t)((v[j][c] + 8) | ((v[4 + j][c] + 8) << 4));
    }
}
