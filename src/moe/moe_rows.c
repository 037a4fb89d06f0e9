/* Row helpers (see moe_rows.h). The scalar paths mirror the vector lanes exactly. */
#include "moe/moe_rows.h"

#include <string.h>

#include "megamoe/dtype.h"

#include "base/cpu.h"

static inline float mm_bf(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#if MM_X86
#include "kernels/simd.h"

#define MM_ALL16 ((__mmask16)0xffff)

MM_TARGET_AVX512 static void mm_rows_axpy_avx512(float *acc, const uint16_t *x, float w,
                                                 size_t n)
{
    size_t i = 0;
    if (w == 1.0f) {
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), mm_load_bf16x16(x + i, MM_ALL16)));
        for (; i < n; i++) acc[i] += mm_bf(x[i]);
        return;
    }
    const __m512 vw = _mm512_set1_ps(w);
    /* mul then add (not fma) so the scalar tail and fallback give the same bits */
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i),
                                                _mm512_mul_ps(vw, mm_load_bf16x16(x + i, MM_ALL16))));
    for (; i < n; i++) acc[i] += w * mm_bf(x[i]);
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

/* 32 bf16 or 16 fp32 per step: (bits & exponent mask) == exponent mask. */
MM_TARGET_AVX512 static int64_t mm_rows_nonfinite_avx512(const void *x, int is_bf16, size_t n)
{
    const size_t step = is_bf16 ? 32 : 16, bytes = (size_t)(is_bf16 ? 2 : 4);
    const __m512i e16 = _mm512_set1_epi16(0x7f80), e32 = _mm512_set1_epi32(0x7f800000);
    size_t i = 0;
    for (; i + step <= n; i += step) {
        __m512i v = _mm512_loadu_si512((const void *)((const char *)x + i * bytes));
        int hit = is_bf16 ? _mm512_cmpeq_epi16_mask(_mm512_and_si512(v, e16), e16) != 0
                          : _mm512_cmpeq_epi32_mask(_mm512_and_si512(v, e32), e32) != 0;
        if (hit) break; /* the scalar tail below finds the element */
    }
    return (int64_t)i;
}

MM_TARGET_AVX512 static float mm_rows_dot_avx512(const uint16_t *a, const uint16_t *b, size_t n)
{
    __m512 s = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        s = _mm512_add_ps(s, _mm512_mul_ps(mm_load_bf16x16(a + i, MM_ALL16), mm_load_bf16x16(b + i, MM_ALL16)));
    float lanes[16];
    _mm512_storeu_ps(lanes, s);
    for (; i < n; i++) lanes[i % 16] += mm_bf(a[i]) * mm_bf(b[i]);
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) lanes[l] += lanes[l + w];
    return lanes[0];
}
#endif

void mm_rows_axpy(float *acc, const uint16_t *x, float w, size_t n)
{
#if MM_X86
    if (mm_cpu_has_avx512()) {
        mm_rows_axpy_avx512(acc, x, w, n);
        return;
    }
#endif
    if (w == 1.0f)
        for (size_t i = 0; i < n; i++) acc[i] += mm_bf(x[i]);
    else
        for (size_t i = 0; i < n; i++) acc[i] += w * mm_bf(x[i]);
}

void mm_rows_scale(uint16_t *dst, const uint16_t *x, float w, size_t n)
{
#if MM_X86
    if (mm_cpu_has_avx512()) {
        mm_rows_scale_avx512(dst, x, w, n);
        return;
    }
#endif
    float tmp[256];
    for (size_t i = 0; i < n; i += 256) {
        size_t m = n - i < 256 ? n - i : 256;
        for (size_t j = 0; j < m; j++) tmp[j] = w * mm_bf(x[i + j]);
        megamoe_convert(dst + i, MEGAMOE_DTYPE_BF16, tmp, MEGAMOE_DTYPE_FP32, m);
    }
}

float mm_rows_dot(const uint16_t *a, const uint16_t *b, size_t n)
{
#if MM_X86
    if (mm_cpu_has_avx512()) return mm_rows_dot_avx512(a, b, n);
#endif
    float lanes[16] = {0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lanes[l] += mm_bf(a[i + l]) * mm_bf(b[i + l]);
    for (; i < n; i++) lanes[i % 16] += mm_bf(a[i]) * mm_bf(b[i]);
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) lanes[l] += lanes[l + w];
    return lanes[0];
}

void mm_rows_reduce_tokens(uint16_t *out, const uint16_t *ret, const int32_t *slot_pos,
                           const float *w, uint16_t *ysave, float *acc, int64_t H, int64_t K,
                           int64_t t0, int64_t t1)
{
    const size_t n = (size_t)H;
    for (int64_t t = t0; t < t1; t++) {
        memset(acc, 0, n * sizeof *acc);
        for (int64_t k = 0; k < K; k++) {
            const int64_t pos = slot_pos[t * K + k];
            const uint16_t *y = ret + pos * H;
            mm_rows_axpy(acc, y, w ? w[t * K + k] : 1.0f, n);
            if (ysave) memcpy(ysave + pos * H, y, n * 2);
        }
        megamoe_convert(out + t * H, MEGAMOE_DTYPE_BF16, acc, MEGAMOE_DTYPE_FP32, n);
    }
}

int64_t mm_rows_first_nonfinite(const void *x, int is_bf16, size_t n)
{
    size_t i = 0;
#if MM_X86
    if (mm_cpu_has_avx512()) i = (size_t)mm_rows_nonfinite_avx512(x, is_bf16, n);
#endif
    for (; i < n; i++) {
        uint32_t bits, mask = is_bf16 ? 0x7f80u : 0x7f800000u;
        if (is_bf16) bits = ((const uint16_t *)x)[i];
        else memcpy(&bits, (const char *)x + i * 4, 4);
        if ((bits & mask) == mask) return (int64_t)i;
    }
    return -1;
}
