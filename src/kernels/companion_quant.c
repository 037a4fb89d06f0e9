/* fp32 row helpers of the companion operators (companion_quant.h): the npu_dynamic_quant rule
 * and rounded row stores, with AVX-512 twins that give the same bits. */
#include "companion_quant.h"

#include <math.h>
#include <string.h>

#include "base/arch.h"
#include "quant.h"
#include "simd.h"

/* The int4 twin of the rule (qmax 7): round half away from zero, clamped to [-7, 7]. */
static inline int8_t mm_cx_i4(float w)
{
    if (w != w) return 0;
    float r = roundf(w);
    return (int8_t)(r > 7.0f ? 7 : r < -7.0f ? -7 : (int)r);
}

float mm_cx_quant_row_f32(const float *v, int64_t n, int8_t *q, float qmax)
{
    if (qmax == 127.0f) { /* the one definition of the rule: the kernels' SYM127 quantiser */
        float s = 0.0f;
        (void)mm_quant_rows_int8(MM_QROW_SYM127, v, MEGAMOE_DTYPE_FP32, 1, n, n, NULL, q, n, &s);
        return s;
    }
    float m = 0.0f;
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
    for (int64_t i = 0; i < n; i++) q[i] = mm_cx_i4(v[i] / s);
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

#if MM_X86
/* int32 -> fp32, rounded to nearest even (the conversion of the scalar twin) */
MM_TARGET_AVX512 static void mm_cx_i32_row_avx512(float *v, const void *src, int64_t n)
{
    const int32_t *x = src;
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = mm_tail_mask16(n - i);
        _mm512_mask_storeu_ps(v + i, m, _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(m, x + i)));
    }
}
#endif

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
#if MM_X86
        if (mm_kernels_use_avx512()) {
            mm_cx_i32_row_avx512(v, src, n);
            break;
        }
#endif
        for (int64_t i = 0; i < n; i++) v[i] = (float)((const int32_t *)src)[i];
        break;
    }
}
