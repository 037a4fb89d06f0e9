/* Row kernels (see rows.h): each AVX-512 routine next to its portable C twin, which defines
 * the result; the twins mirror the vector lanes exactly. */
#include "rows.h"

#include <string.h>

#include "simd.h"

static inline float mm_bf(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* One bf16 or fp16 element, widened exactly. */
static inline float mm_ld(megamoe_dtype_t t, const void *x, int64_t i)
{
    uint16_t b = ((const uint16_t *)x)[i];
    return t == MEGAMOE_DTYPE_BF16 ? mm_bf(b) : megamoe_fp16_to_fp32(b);
}

/* ---- portable C twins ------------------------------------------------------------------ */

static void mm_rows_axpy_c(megamoe_dtype_t t, float *acc, const void *x, float w, int64_t n)
{
    if (w == 1.0f)
        for (int64_t i = 0; i < n; i++) acc[i] = acc[i] + mm_ld(t, x, i);
    else
        for (int64_t i = 0; i < n; i++) acc[i] = acc[i] + mm_ld(t, x, i) * w;
}

static void mm_rows_axpy_f32_c(float *acc, const float *v, float w, int64_t n)
{
    for (int64_t i = 0; i < n; i++) acc[i] = acc[i] + v[i] * w;
}

static void mm_rows_scale_c(uint16_t *dst, const uint16_t *x, float w, size_t n)
{
    float tmp[256];
    for (size_t i = 0; i < n; i += 256) {
        size_t m = n - i < 256 ? n - i : 256;
        for (size_t j = 0; j < m; j++) tmp[j] = w * mm_bf(x[i + j]);
        megamoe_convert(dst + i, MEGAMOE_DTYPE_BF16, tmp, MEGAMOE_DTYPE_FP32, m);
    }
}

/* lanes[16] -> one value, pairwise (l + 8, + 4, + 2, + 1). */
static float mm_rows_lanes16(float *lanes)
{
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) lanes[l] = lanes[l] + lanes[l + w];
    return lanes[0];
}

static float mm_rows_dot_c(const uint16_t *a, const uint16_t *b, size_t n)
{
    float lanes[16] = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lanes[l] = lanes[l] + mm_bf(a[i + l]) * mm_bf(b[i + l]);
    for (; i < n; i++) lanes[i % 16] = lanes[i % 16] + mm_bf(a[i]) * mm_bf(b[i]);
    return mm_rows_lanes16(lanes);
}

/* ---- AVX-512 ------------------------------------------------------------------------------ */

#if MM_X86
#define MM_ALL16 ((__mmask16)0xffff)

MM_TARGET_AVX512 static inline __m512 mm_ld16(megamoe_dtype_t t, const void *x, int64_t i)
{
    if (t == MEGAMOE_DTYPE_BF16) return mm_load_bf16x16((const uint16_t *)x + i, MM_ALL16);
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)x + i)));
}

MM_TARGET_AVX512 static void mm_rows_axpy_avx512(megamoe_dtype_t t, float *acc, const void *x,
                                                 float w, int64_t n)
{
    int64_t i = 0;
    if (w == 1.0f) {
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), mm_ld16(t, x, i)));
    } else {
        const __m512 vw = _mm512_set1_ps(w);
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i),
                                                    _mm512_mul_ps(mm_ld16(t, x, i), vw)));
    }
    if (i < n) mm_rows_axpy_c(t, acc + i, (const uint16_t *)x + i, w, n - i);
}

MM_TARGET_AVX512 static void mm_rows_axpy_f32_avx512(float *acc, const float *v, float w,
                                                     int64_t n)
{
    const __m512 vw = _mm512_set1_ps(w);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i),
                                                _mm512_mul_ps(_mm512_loadu_ps(v + i), vw)));
    if (i < n) mm_rows_axpy_f32_c(acc + i, v + i, w, n - i);
}

MM_TARGET_AVX512 static void mm_rows_scale_avx512(uint16_t *dst, const uint16_t *x, float w,
                                                  size_t n)
{
    const __m512 vw = _mm512_set1_ps(w);
    for (size_t i = 0; i < n; i += 16) {
        __mmask16 m = mm_tail_mask16((int64_t)(n - i));
        mm_store_bf16x16(dst + i, m, _mm512_mul_ps(vw, mm_load_bf16x16(x + i, m)));
    }
}

MM_TARGET_AVX512 static float mm_rows_dot_avx512(const uint16_t *a, const uint16_t *b, size_t n)
{
    __m512 s = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        s = _mm512_add_ps(s, _mm512_mul_ps(mm_load_bf16x16(a + i, MM_ALL16),
                                           mm_load_bf16x16(b + i, MM_ALL16)));
    float lanes[16];
    _mm512_storeu_ps(lanes, s);
    for (; i < n; i++) lanes[i % 16] = lanes[i % 16] + mm_bf(a[i]) * mm_bf(b[i]);
    return mm_rows_lanes16(lanes);
}

/* 32 bf16 or 16 fp32 per step: (bits & exponent mask) == exponent mask. Returns the start of
 * the first block with a hit (or of the tail); the scalar scan finds the element. */
MM_TARGET_AVX512 static size_t mm_rows_nonfinite_skip_avx512(const void *x, int is_bf16,
                                                             size_t n)
{
    const size_t step = is_bf16 ? 32 : 16, bytes = (size_t)(is_bf16 ? 2 : 4);
    const __m512i e16 = _mm512_set1_epi16(0x7f80), e32 = _mm512_set1_epi32(0x7f800000);
    size_t i = 0;
    for (; i + step <= n; i += step) {
        __m512i v = _mm512_loadu_si512((const void *)((const char *)x + i * bytes));
        int hit = is_bf16 ? _mm512_cmpeq_epi16_mask(_mm512_and_si512(v, e16), e16) != 0
                          : _mm512_cmpeq_epi32_mask(_mm512_and_si512(v, e32), e32) != 0;
        if (hit) break;
    }
    return i;
}
#endif

/* ---- entry points: the vector path when usable and not switched off ---------------------- */

void mm_rows_axpy(megamoe_dtype_t x_type, float *acc, const void *x, float w, int64_t n)
{
#if MM_X86
    if (mm_kernels_use_avx512()) {
        mm_rows_axpy_avx512(x_type, acc, x, w, n);
        return;
    }
#endif
    mm_rows_axpy_c(x_type, acc, x, w, n);
}

void mm_rows_axpy_f32(float *acc, const float *v, float w, int64_t n)
{
#if MM_X86
    if (mm_kernels_use_avx512()) {
        mm_rows_axpy_f32_avx512(acc, v, w, n);
        return;
    }
#endif
    mm_rows_axpy_f32_c(acc, v, w, n);
}

void mm_rows_scale(uint16_t *dst, const uint16_t *x, float w, size_t n)
{
#if MM_X86
    if (mm_kernels_use_avx512()) {
        mm_rows_scale_avx512(dst, x, w, n);
        return;
    }
#endif
    mm_rows_scale_c(dst, x, w, n);
}

float mm_rows_dot(const uint16_t *a, const uint16_t *b, size_t n)
{
#if MM_X86
    if (mm_kernels_use_avx512()) return mm_rows_dot_avx512(a, b, n);
#endif
    return mm_rows_dot_c(a, b, n);
}

float mm_rows_sum16(const float *v, int64_t n)
{
    float lanes[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lanes[l] = lanes[l] + v[i + l];
    for (int l = 0; i + l < n; l++) lanes[l] = lanes[l] + v[i + l];
    return mm_rows_lanes16(lanes);
}

int64_t mm_rows_first_nonfinite(const void *x, int is_bf16, size_t n)
{
    size_t i = 0;
#if MM_X86
    if (mm_kernels_use_avx512()) i = mm_rows_nonfinite_skip_avx512(x, is_bf16, n);
#endif
    const uint32_t mask = is_bf16 ? 0x7f80u : 0x7f800000u;
    for (; i < n; i++) { /* the C twin, and the vector path's last step */
        uint32_t bits;
        if (is_bf16) bits = ((const uint16_t *)x)[i];
        else memcpy(&bits, (const char *)x + i * 4, 4);
        if ((bits & mask) == mask) return (int64_t)i;
    }
    return -1;
}
