/* fp32 row helpers of the companion operators (companion_quant.h): the npu_dynamic_quant rule
 * and rounded row stores, with AVX-512 twins that give the same bits. */
#include "companion_quant.h"

#include <math.h>
#include <string.h>

#include "base/arch.h"
#include "simd.h"

static inline int8_t mm_cx_i8(float w, float qmax)
{
    if (w != w) return 0;
    float r = nearbyintf(w); /* the default rounding mode: to nearest, ties to even */
    if (r > qmax) r = qmax;
    if (r < -qmax - 1.0f) r = -qmax - 1.0f;
    return (int8_t)r;
}

#if MM_X86
MM_TARGET_AVX512 static float mm_cx_absmax_avx512(const float *v, int64_t n)
{
    __m512 m = _mm512_setzero_ps();
    __mmask16 nan = 0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(v + i);
        nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        m = _mm512_max_ps(m, _mm512_abs_ps(x));
    }
    if (i < n) {
        __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        __m512 x = _mm512_maskz_loadu_ps(k, v + i);
        nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        m = _mm512_max_ps(m, _mm512_abs_ps(x));
    }
    return nan ? NAN : _mm512_reduce_max_ps(m);
}

MM_TARGET_AVX512 static void mm_cx_q_avx512(const float *v, int64_t n, float s, float qmax,
                                            int8_t *q)
{
    __m512 sv = _mm512_set1_ps(s), hi = _mm512_set1_ps(qmax), lo = _mm512_set1_ps(-qmax - 1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 x = _mm512_div_ps(_mm512_maskz_loadu_ps(k, v + i), sv);
        __mmask16 ok = _mm512_cmp_ps_mask(x, x, _CMP_ORD_Q);
        x = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
        __m512i w = _mm512_maskz_cvtps_epi32(ok, x);
        _mm_mask_storeu_epi8(q + i, k, _mm512_cvtepi32_epi8(w));
    }
}
#endif

float mm_cx_quant_row_f32(const float *v, int64_t n, int8_t *q, float qmax)
{
    float m;
#if MM_X86
    if (mm_kernels_use_avx512()) {
        m = mm_cx_absmax_avx512(v, n);
        if (m == 0.0f) {
            memset(q, 0, (size_t)n);
            return 0.0f;
        }
        float s = m / qmax;
        mm_cx_q_avx512(v, n, s, qmax, q);
        return s;
    }
#endif
    m = 0.0f;
    int nan = 0;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(v[i]);
        nan |= a != a;
        if (a > m) m = a;
    }
    if (nan) m = NAN;
    if (m == 0.0f) {
        memset(q, 0, (size_t)n);
        return 0.0f;
    }
    float s = m / qmax;
    for (int64_t i = 0; i < n; i++) q[i] = mm_cx_i8(v[i] / s, qmax);
    return s;
}

void mm_cx_store_row(void *dst, megamoe_dtype_t dst_type, const float *v, int64_t n)
{
    if (dst_type == MEGAMOE_DTYPE_FP32) {
        memcpy(dst, v, (size_t)n * sizeof(float));
        return;
    }
    megamoe_convert(dst, dst_type, v, MEGAMOE_DTYPE_FP32, (size_t)n);
}

void mm_cx_load_row(float *v, const void *src, megamoe_dtype_t src_type, int64_t n)
{
    switch (src_type) {
    case MEGAMOE_DTYPE_FP32: memcpy(v, src, (size_t)n * sizeof(float)); break;
    case MEGAMOE_DTYPE_BF16:
    case MEGAMOE_DTYPE_FP16: megamoe_convert(v, MEGAMOE_DTYPE_FP32, src, src_type, (size_t)n); break;
    case MEGAMOE_DTYPE_INT8:
        for (int64_t i = 0; i < n; i++) v[i] = (float)((const int8_t *)src)[i];
        break;
    default: /* int32 */
        for (int64_t i = 0; i < n; i++) v[i] = (float)((const int32_t *)src)[i];
        break;
    }
}
