/* Exact element-wise helpers of the combine side (docs/ops.md, "Numerics").
 *
 * Every operation is one IEEE fp32 operation per element with its own rounding (no fused
 * multiply-add: the library is built with -std=c11, i.e. -ffp-contract=off, and the vector paths
 * use separate mul and add), so the AVX-512 paths give the same bits as the scalar ones.
 */
#include <math.h>
#include <string.h>

#include "base/cpu.h"
#include "shmem/shmem.h"
#include "v2_internal.h"

#if MM_X86
#include <immintrin.h>
#endif

void mm_v2_copy(void *dst, const void *src, size_t n, int stream)
{
    if (stream && n >= 1024) mm_shmem_copy_streaming(dst, src, n);
    else memcpy(dst, src, n);
}

void mm_v2_widen(megamoe_dtype_t t, const void *src, float *dst, int64_t n)
{
    megamoe_convert(dst, MEGAMOE_DTYPE_FP32, src, t, (size_t)n);
}

void mm_v2_narrow(megamoe_dtype_t t, const float *src, void *dst, int64_t n)
{
    megamoe_convert(dst, t, src, MEGAMOE_DTYPE_FP32, (size_t)n);
}

static inline float mm_ld(megamoe_dtype_t t, const void *y, int64_t i)
{
    uint16_t b = ((const uint16_t *)y)[i];
    return t == MEGAMOE_DTYPE_BF16 ? megamoe_bf16_to_fp32(b) : megamoe_fp16_to_fp32(b);
}

#if MM_X86
MM_TARGET_AVX512 static inline __m512 mm_ld16(megamoe_dtype_t t, const void *y, int64_t i)
{
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)y + i));
    if (t == MEGAMOE_DTYPE_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h); /* exact fp16 -> fp32 */
}

MM_TARGET_AVX512 static void mm_axpy_x_avx512(megamoe_dtype_t t, float *acc, const void *y,
                                              float s, int64_t n)
{
    __m512 vs = _mm512_set1_ps(s);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 p = _mm512_mul_ps(mm_ld16(t, y, i), vs);
        _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), p));
    }
    for (; i < n; i++) {
        float p = mm_ld(t, y, i) * s;
        acc[i] = acc[i] + p;
    }
}

MM_TARGET_AVX512 static void mm_add_x_avx512(megamoe_dtype_t t, float *acc, const void *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), mm_ld16(t, y, i)));
    for (; i < n; i++) acc[i] = acc[i] + mm_ld(t, y, i);
}

MM_TARGET_AVX512 static void mm_axpy_f_avx512(float *acc, const float *v, float s, int64_t n)
{
    __m512 vs = _mm512_set1_ps(s);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 p = _mm512_mul_ps(_mm512_loadu_ps(v + i), vs);
        _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), p));
    }
    for (; i < n; i++) {
        float p = v[i] * s;
        acc[i] = acc[i] + p;
    }
}
#endif

void mm_v2_axpy_x(megamoe_dtype_t t, float *acc, const void *y, float s, int64_t n)
{
#if MM_X86
    if (mm_cpu_has_avx512()) {
        mm_axpy_x_avx512(t, acc, y, s, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        float p = mm_ld(t, y, i) * s;
        acc[i] = acc[i] + p;
    }
}

void mm_v2_add_x(megamoe_dtype_t t, float *acc, const void *y, int64_t n)
{
#if MM_X86
    if (mm_cpu_has_avx512()) {
        mm_add_x_avx512(t, acc, y, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) acc[i] = acc[i] + mm_ld(t, y, i);
}

void mm_v2_axpy_f(float *acc, const float *v, float s, int64_t n)
{
#if MM_X86
    if (mm_cpu_has_avx512()) {
        mm_axpy_f_avx512(acc, v, s, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        float p = v[i] * s;
        acc[i] = acc[i] + p;
    }
}

/* Lane l accumulates v[l], v[l + 16], ... in order from 0; then lanes combine pairwise
 * (l + 8, l + 4, l + 2, l + 1). Independent of the ISA. */
float mm_v2_sum16(const float *v, int64_t n)
{
    float lane[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lane[l] = lane[l] + v[i + l];
    for (int l = 0; i + l < n; l++) lane[l] = lane[l] + v[i + l];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) lane[l] = lane[l] + lane[l + w];
    return lane[0];
}

/* fp32 value that rounds to the same fp16 as the exact double s (round to odd: fp32 keeps
 * more than two extra bits, so no double rounding). */
static float mm_round_to_odd(double s)
{
    float f = (float)s;
    if ((double)f == s || isnan(s) || isinf(f)) return f;
    uint32_t u;
    memcpy(&u, &f, 4);
    if (fabs((double)f) > fabs(s)) u -= 1; /* toward zero */
    u |= 1u;
    memcpy(&f, &u, 4);
    return f;
}

void mm_v2_tp_add(megamoe_dtype_t t, const void *a, const void *b, void *out, int64_t n)
{
    const uint16_t *x = a, *y = b;
    uint16_t *o = out;
    if (t == MEGAMOE_DTYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            float s = megamoe_bf16_to_fp32(x[i]) + megamoe_bf16_to_fp32(y[i]);
            o[i] = megamoe_fp32_to_bf16(s);
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            double s = (double)megamoe_fp16_to_fp32(x[i]) + (double)megamoe_fp16_to_fp32(y[i]);
            o[i] = megamoe_fp32_to_fp16(mm_round_to_odd(s));
        }
    }
}
