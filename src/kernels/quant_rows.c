/* Per-token int8 quantisation of activation rows for the quantised GEMMs (quant.h,
 * mm_quant_rows_int8): the DispatchV2 quantMode 2 rule (through mm_quant_dynamic_token, the
 * one definition) and the mega_moe / npu_dynamic_quant rule (s = max/127, q = round half away
 * from zero of v/s, [-127, 127]). The scalar code defines the second; the AVX-512 path gives
 * the same bits. */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "quant.h"
#include "simd.h"

static inline float mm_qr_ld(const void *x, megamoe_dtype_t t, int64_t i)
{
    if (t == MEGAMOE_DTYPE_FP32) return ((const float *)x)[i];
    uint16_t b = ((const uint16_t *)x)[i];
    return t == MEGAMOE_DTYPE_BF16 ? megamoe_bf16_to_fp32(b) : megamoe_fp16_to_fp32(b);
}

/* The sym127 rule on one row (scalar definition). */
static float mm_sym127_row_c(const void *x, megamoe_dtype_t t, int64_t h, const float *smooth,
                             int8_t *q)
{
    float m = 0.0f;
    int nan = 0;
    for (int64_t i = 0; i < h; i++) {
        float v = mm_qr_ld(x, t, i);
        if (smooth) v = v * smooth[i];
        float a = fabsf(v);
        nan |= a != a;
        if (a > m) m = a;
    }
    if (nan) m = NAN;
    if (m == 0.0f) {
        memset(q, 0, (size_t)h);
        return 0.0f;
    }
    const float s = m / 127.0f;
    for (int64_t i = 0; i < h; i++) {
        float v = mm_qr_ld(x, t, i);
        if (smooth) v = v * smooth[i];
        float w = v / s;
        if (w != w) {
            q[i] = 0;
            continue;
        }
        float r = roundf(w); /* half away from zero */
        q[i] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
    }
    return s;
}

#if MM_X86
MM_TARGET_AVX512 static inline __m512 mm_qr_ld16(const void *x, megamoe_dtype_t t, int64_t i,
                                                __mmask16 m, const float *smooth)
{
    __m512 v;
    if (t == MEGAMOE_DTYPE_FP32) v = _mm512_maskz_loadu_ps(m, (const float *)x + i);
    else if (t == MEGAMOE_DTYPE_BF16) v = mm_load_bf16x16((const uint16_t *)x + i, m);
    else v = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)x + i));
    return smooth ? _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, smooth + i)) : v;
}

MM_TARGET_AVX512 static float mm_sym127_row_avx512(const void *x, megamoe_dtype_t t, int64_t h,
                                                   const float *smooth, int8_t *q)
{
    __m512 mx = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (int64_t i = 0; i < h; i += 16) {
        const __mmask16 m = mm_tail_mask16(h - i);
        const __m512 v = mm_qr_ld16(x, t, i, m, smooth);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
    }
    const float mval = nan ? NAN : _mm512_reduce_max_ps(mx);
    if (mval == 0.0f) {
        memset(q, 0, (size_t)h);
        return 0.0f;
    }
    const float s = mval / 127.0f;
    const __m512 sv = _mm512_set1_ps(s), half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    for (int64_t i = 0; i < h; i += 16) {
        const __mmask16 m = mm_tail_mask16(h - i);
        const __m512 w = _mm512_div_ps(mm_qr_ld16(x, t, i, m, smooth), sv);
        const __mmask16 isnan = _mm512_cmp_ps_mask(w, w, _CMP_UNORD_Q);
        /* round half away from zero: trunc, then one step away when the dropped fraction
         * (exact) is at least one half */
        const __m512 tr = _mm512_roundscale_ps(w, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(w, tr)), half, _CMP_GE_OQ);
        const __m512 step = _mm512_castsi512_ps(_mm512_or_si512(
            _mm512_castps_si512(one),
            _mm512_and_si512(_mm512_castps_si512(w), _mm512_set1_epi32((int)0x80000000u))));
        __m512 r = _mm512_mask_add_ps(tr, up, tr, step);
        r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
        const __m512i iv = _mm512_maskz_mov_epi32((__mmask16)~isnan, _mm512_cvttps_epi32(r));
        _mm_mask_storeu_epi8(q + i, m, _mm512_cvtepi32_epi8(iv));
    }
    return s;
}
#endif

megamoe_status_t mm_quant_rows_int8(mm_qrow_rule_t rule, const void *x, megamoe_dtype_t x_type,
                                    int64_t rows, int64_t h, int64_t ldx, const float *smooth,
                                    int8_t *q, int64_t ldq, float *scales)
{
    const char *fn = "mm_quant_rows_int8";
    if (rule != MM_QROW_DISPATCH && rule != MM_QROW_SYM127)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: rule %d (MM_QROW_DISPATCH or MM_QROW_SYM127)",
                        fn, (int)rule);
    const int fp32 = x_type == MEGAMOE_DTYPE_FP32;
    if (x_type != MEGAMOE_DTYPE_BF16 && x_type != MEGAMOE_DTYPE_FP16 &&
        !(fp32 && rule == MM_QROW_SYM127))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: input type %s (bf16 or fp16; fp32 too with the sym127 rule)", fn,
                        megamoe_dtype_name(x_type));
    if (rows < 0 || h < 0 || ldx < h || ldq < h)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: rows %lld, h %lld, ldx %lld, ldq %lld (need >= 0 and strides >= h)",
                        fn, (long long)rows, (long long)h, (long long)ldx, (long long)ldq);
    if (rows == 0) return MEGAMOE_OK;
    if (x == NULL || q == NULL || scales == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: NULL buffer", fn);
    const size_t es = megamoe_dtype_size(x_type);
    for (int64_t r = 0; r < rows; r++) {
        const void *xr = (const char *)x + (size_t)(r * ldx) * es;
        int8_t *qr = q + r * ldq;
        if (rule == MM_QROW_DISPATCH) {
            MM_CHECK(mm_quant_dynamic_token(xr, x_type, h, smooth, MEGAMOE_DTYPE_INT8, qr,
                                            &scales[r]));
            continue;
        }
#if MM_X86
        if (mm_kernels_use_avx512()) {
            scales[r] = mm_sym127_row_avx512(xr, x_type, h, smooth, qr);
            continue;
        }
#endif
        scales[r] = mm_sym127_row_c(xr, x_type, h, smooth, qr);
    }
    return MEGAMOE_OK;
}
