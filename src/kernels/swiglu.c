/* SwiGLU forward/backward (semantics in swiglu.h). */
#include <math.h>

#include "base/error.h"
#include "megamoe/dtype.h"
#include "simd.h"
#include "swiglu.h"
#include "vmath.h"

static int mm_limit_on(float limit) { return limit > 0.0f && limit < INFINITY; }

static inline float mm_b2f(uint16_t b) { return megamoe_bf16_to_fp32(b); }

/* ---- scalar (the definition) ---- */

static inline float mm_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

static void mm_fwd_row_scalar(int64_t n, const uint16_t *g, const uint16_t *u, uint16_t *a, int on,
                              float L)
{
    for (int64_t j = 0; j < n; j++) {
        float gv = mm_b2f(g[j]), uv = mm_b2f(u[j]);
        if (on) {
            if (gv > L) gv = L;
            if (uv > L) uv = L;
            else if (uv < -L) uv = -L;
        }
        a[j] = megamoe_fp32_to_bf16(gv * mm_sigmoid(gv) * uv);
    }
}

static void mm_bwd_row_scalar(int64_t n, const uint16_t *g, const uint16_t *u, const uint16_t *da,
                              uint16_t *dg, uint16_t *du, int on, float L)
{
    for (int64_t j = 0; j < n; j++) {
        float g0 = mm_b2f(g[j]), u0 = mm_b2f(u[j]), d = mm_b2f(da[j]);
        float gc = g0, uc = u0;
        int gpass = 1, upass = 1;
        if (on) {
            if (gc > L) gc = L;
            if (uc > L) uc = L;
            else if (uc < -L) uc = -L;
            gpass = g0 <= L;
            upass = u0 >= -L && u0 <= L;
        }
        float s = mm_sigmoid(gc);
        float silu = gc * s;
        float dsilu = s * (1.0f + gc * (1.0f - s));
        dg[j] = megamoe_fp32_to_bf16(gpass ? d * uc * dsilu : 0.0f);
        du[j] = megamoe_fp32_to_bf16(upass ? d * silu : 0.0f);
    }
}

/* ---- AVX-512 ---- */

#if MM_X86
/* gc = min(g, L) with NaN kept; uc = clamp(u, -L, L) with NaN kept. */
MM_TARGET_AVX512 static inline void mm_clamp_ps(__m512 *g, __m512 *u, __m512 L)
{
    __m512 nL = _mm512_sub_ps(_mm512_setzero_ps(), L);
    *g = _mm512_mask_mov_ps(*g, _mm512_cmp_ps_mask(*g, L, _CMP_GT_OQ), L);
    *u = _mm512_mask_mov_ps(*u, _mm512_cmp_ps_mask(*u, L, _CMP_GT_OQ), L);
    *u = _mm512_mask_mov_ps(*u, _mm512_cmp_ps_mask(*u, nL, _CMP_LT_OQ), nL);
}

MM_TARGET_AVX512 static void mm_fwd_row_avx512(int64_t n, const uint16_t *g, const uint16_t *u,
                                              uint16_t *a, int on, float limit)
{
    const __m512 L = _mm512_set1_ps(limit);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = mm_tail_mask16(n - j);
        __m512 gv = mm_load_bf16x16(g + j, m), uv = mm_load_bf16x16(u + j, m);
        if (on) mm_clamp_ps(&gv, &uv, L);
        __m512 r = _mm512_mul_ps(_mm512_mul_ps(gv, mm_sigmoid_ps(gv)), uv);
        mm_store_bf16x16(a + j, m, r);
    }
}

MM_TARGET_AVX512 static void mm_bwd_row_avx512(int64_t n, const uint16_t *g, const uint16_t *u,
                                              const uint16_t *da, uint16_t *dg, uint16_t *du, int on,
                                              float limit)
{
    const __m512 L = _mm512_set1_ps(limit), nL = _mm512_set1_ps(-limit), one = _mm512_set1_ps(1.0f);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = mm_tail_mask16(n - j);
        __m512 g0 = mm_load_bf16x16(g + j, m), u0 = mm_load_bf16x16(u + j, m);
        __m512 d = mm_load_bf16x16(da + j, m);
        __m512 gc = g0, uc = u0;
        __mmask16 gpass = 0xffff, upass = 0xffff;
        if (on) {
            mm_clamp_ps(&gc, &uc, L);
            gpass = _mm512_cmp_ps_mask(g0, L, _CMP_LE_OQ);
            upass = _mm512_cmp_ps_mask(u0, nL, _CMP_GE_OQ) & _mm512_cmp_ps_mask(u0, L, _CMP_LE_OQ);
        }
        __m512 s = mm_sigmoid_ps(gc);
        __m512 silu = _mm512_mul_ps(gc, s);
        __m512 dsilu = _mm512_mul_ps(s, _mm512_add_ps(one, _mm512_mul_ps(gc, _mm512_sub_ps(one, s))));
        __m512 dgv = _mm512_maskz_mov_ps(gpass, _mm512_mul_ps(_mm512_mul_ps(d, uc), dsilu));
        __m512 duv = _mm512_maskz_mov_ps(upass, _mm512_mul_ps(d, silu));
        mm_store_bf16x16(dg + j, m, dgv);
        mm_store_bf16x16(du + j, m, duv);
    }
}
#endif

static megamoe_status_t mm_swiglu_check(const char *fn, int64_t rows, int64_t inter, const void *in,
                                        int64_t ldin, const void *out, int64_t ldout,
                                        int64_t in_cols, int64_t out_cols)
{
    if (rows < 0 || inter < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: rows %lld and I %lld must be >= 0", fn,
                        (long long)rows, (long long)inter);
    if (rows == 0 || inter == 0) return MEGAMOE_OK;
    if (in == NULL || out == NULL || ldin < in_cols || ldout < out_cols)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: NULL buffer or row stride too small (ld %lld/%lld for %lld/%lld columns)",
                        fn, (long long)ldin, (long long)ldout, (long long)in_cols, (long long)out_cols);
    return MEGAMOE_OK;
}

megamoe_status_t mm_swiglu_fwd(int64_t rows, int64_t inter, const uint16_t *h, int64_t ldh,
                               uint16_t *a, int64_t lda, float limit)
{
    MM_CHECK(mm_swiglu_check("mm_swiglu_fwd", rows, inter, h, ldh, a, lda, 2 * inter, inter));
    int on = mm_limit_on(limit);
#if MM_X86
    int vec = mm_kernels_use_avx512();
#endif
    for (int64_t r = 0; r < rows && inter > 0; r++) {
        const uint16_t *g = h + r * ldh;
#if MM_X86
        if (vec) {
            mm_fwd_row_avx512(inter, g, g + inter, a + r * lda, on, limit);
            continue;
        }
#endif
        mm_fwd_row_scalar(inter, g, g + inter, a + r * lda, on, limit);
    }
    return MEGAMOE_OK;
}

#define MM_SWIGLU_PF_ROWS 2 /* rows ahead the backward prefetches */

megamoe_status_t mm_swiglu_bwd(int64_t rows, int64_t inter, const uint16_t *h, int64_t ldh,
                               const uint16_t *da, int64_t ldda, uint16_t *dh, int64_t lddh,
                               float limit)
{
    MM_CHECK(mm_swiglu_check("mm_swiglu_bwd", rows, inter, h, ldh, dh, lddh, 2 * inter, 2 * inter));
    if (rows > 0 && inter > 0 && (da == NULL || ldda < inter))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_swiglu_bwd: da is NULL or ldda %lld < I %lld",
                        (long long)ldda, (long long)inter);
    int on = mm_limit_on(limit);
#if MM_X86
    int vec = mm_kernels_use_avx512();
#endif
    for (int64_t r = 0; r < rows && inter > 0; r++) {
        const uint16_t *g = h + r * ldh;
        uint16_t *o = dh + r * lddh;
#if MM_X86
        if (vec) {
            /* h is the forward's saved GMM1 output, usually in memory by now, and rows are
             * too short for the hardware prefetchers to ramp up: fetch a later row's h, and
             * its output lines for writing, while this row computes (~2x here). */
            if (r + MM_SWIGLU_PF_ROWS < rows) {
                const char *ph = (const char *)(h + (r + MM_SWIGLU_PF_ROWS) * ldh);
                char *po = (char *)(dh + (r + MM_SWIGLU_PF_ROWS) * lddh);
                for (int64_t b = 0; b < 4 * inter; b += 64) {
                    _mm_prefetch(ph + b, _MM_HINT_T0);
                    _mm_prefetch(po + b, _MM_HINT_ET0);
                }
            }
            mm_bwd_row_avx512(inter, g, g + inter, da + r * ldda, o, o + inter, on, limit);
            continue;
        }
#endif
        mm_bwd_row_scalar(inter, g, g + inter, da + r * ldda, o, o + inter, on, limit);
    }
    return MEGAMOE_OK;
}
