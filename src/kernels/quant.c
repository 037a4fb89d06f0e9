/* Row quantisers (semantics, and the choices where the spec leaves room, in quant.h).
 * The scalar functions are the definition; the AVX-512 twins must give the same bits. */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "quant.h"
#include "simd.h"

/* ---- scalar helpers ---------------------------------------------------------------------- */

static inline float mm_ld(const void *x, megamoe_dtype_t t, int64_t i)
{
    uint16_t b = ((const uint16_t *)x)[i];
    return t == MEGAMOE_DTYPE_BF16 ? megamoe_bf16_to_fp32(b) : megamoe_fp16_to_fp32(b);
}

/* v[i] as §4.1 step 1. */
static inline float mm_v(const void *x, megamoe_dtype_t t, int64_t i, const float *smooth)
{
    float v = mm_ld(x, t, i);
    return smooth ? v * smooth[i] : v;
}

/* max |v[i]| over [i0, i1); the canonical NaN when any v is NaN. */
static float mm_absmax(const void *x, megamoe_dtype_t t, int64_t i0, int64_t i1, const float *smooth)
{
    float m = 0.0f;
    int nan = 0;
    for (int64_t i = i0; i < i1; i++) {
        float a = fabsf(mm_v(x, t, i, smooth));
        nan |= a != a;
        if (a > m) m = a;
    }
    return nan ? NAN : m;
}

static float mm_qmax(megamoe_dtype_t q_type)
{
    return q_type == MEGAMOE_DTYPE_INT8 ? 127.0f : q_type == MEGAMOE_DTYPE_FP8_E4M3FN ? 448.0f : 57344.0f;
}

static inline uint8_t mm_fp8(float w, megamoe_dtype_t q_type, int saturate)
{
    return q_type == MEGAMOE_DTYPE_FP8_E4M3FN ? megamoe_fp32_to_fp8_e4m3fn(w, saturate)
                                              : megamoe_fp32_to_fp8_e5m2(w, saturate);
}

static inline uint16_t mm_y_bits(float v, megamoe_dtype_t t)
{
    return t == MEGAMOE_DTYPE_BF16 ? megamoe_fp32_to_bf16(v) : megamoe_fp32_to_fp16(v);
}

/* The positive canonical NaN: a NaN product's sign is the FPU's business, not the format's. */
static inline uint8_t mm_fp8_nan(megamoe_dtype_t q_type)
{
    return q_type == MEGAMOE_DTYPE_FP8_E4M3FN ? 0x7f : 0x7e;
}

/* Dynamic quantisation of [i0, i1) with one scale (§4.1 / §4.3). */
static float mm_dynamic_span(const void *x, megamoe_dtype_t t, int64_t i0, int64_t i1,
                             const float *smooth, megamoe_dtype_t q_type, void *q)
{
    float m = mm_absmax(x, t, i0, i1, smooth);
    if (m == 0.0f) {
        memset((char *)q + i0, 0, (size_t)(i1 - i0));
        return 0.0f;
    }
    float d = mm_qmax(q_type) / m;
    for (int64_t i = i0; i < i1; i++) {
        float w = mm_v(x, t, i, smooth) * d;
        if (q_type == MEGAMOE_DTYPE_INT8) ((int8_t *)q)[i] = megamoe_fp32_to_int8(w);
        else ((uint8_t *)q)[i] = w != w ? mm_fp8_nan(q_type) : mm_fp8(w, q_type, 0);
    }
    return 1.0f / d;
}

/* ---- AVX-512 twins ----------------------------------------------------------------------- */

#if MM_X86
MM_TARGET_AVX512 static inline __m512 mm_ld16(const void *x, megamoe_dtype_t t, int64_t i, __mmask16 m)
{
    if (t == MEGAMOE_DTYPE_BF16) return mm_load_bf16x16((const uint16_t *)x + i, m);
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)x + i));
}

MM_TARGET_AVX512 static inline __m512 mm_v16(const void *x, megamoe_dtype_t t, int64_t i, __mmask16 m,
                                            const float *smooth)
{
    __m512 v = mm_ld16(x, t, i, m);
    return smooth ? _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, smooth + i)) : v;
}

/* int8(w): RNE, saturated, NaN -> 0 (megamoe_fp32_to_int8 on 16 lanes). */
MM_TARGET_AVX512 static inline __m128i mm_int8x16(__m512 w)
{
    __mmask16 nan = _mm512_cmp_ps_mask(w, w, _CMP_UNORD_Q);
    __m512 c = _mm512_min_ps(_mm512_max_ps(w, _mm512_set1_ps(-128.0f)), _mm512_set1_ps(127.0f));
    __m512i i = _mm512_cvt_roundps_epi32(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_cvtepi32_epi8(_mm512_maskz_mov_epi32((__mmask16)~nan, i));
}

MM_TARGET_AVX512 static float mm_absmax_avx512(const void *x, megamoe_dtype_t t, int64_t h,
                                              const float *smooth)
{
    __m512 mx = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (int64_t i = 0; i < h; i += 16) {
        __mmask16 m = mm_tail_mask16(h - i);
        __m512 v = mm_v16(x, t, i, m, smooth);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
    }
    return nan ? NAN : _mm512_reduce_max_ps(mx);
}

MM_TARGET_AVX512 static void mm_int8_scaled_avx512(const void *x, megamoe_dtype_t t, int64_t h,
                                                  const float *smooth, const float *scales,
                                                  float d, int8_t *q)
{
    for (int64_t i = 0; i < h; i += 16) {
        __mmask16 m = mm_tail_mask16(h - i);
        __m512 s = scales ? _mm512_maskz_loadu_ps(m, scales + i) : _mm512_set1_ps(d);
        __m512 w = _mm512_mul_ps(mm_v16(x, t, i, m, smooth), s);
        _mm_mask_storeu_epi8(q + i, m, mm_int8x16(w));
    }
}

/* Per-block-of-8 max |y| in both 256-bit halves, canonical NaN for a block holding a NaN. */
MM_TARGET_AVX512 static inline __m512 mm_block8_absmax(__m512 v)
{
    __m512 a = _mm512_abs_ps(v);
    a = _mm512_max_ps(a, _mm512_permute_ps(a, 0xB1));
    a = _mm512_max_ps(a, _mm512_permute_ps(a, 0x4E));
    a = _mm512_max_ps(a, _mm512_shuffle_f32x4(a, a, 0xB1));
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    __mmask16 blocks = (__mmask16)((nan & 0x00ff ? 0x00ff : 0) | (nan & 0xff00 ? 0xff00 : 0));
    return _mm512_mask_mov_ps(a, blocks, _mm512_set1_ps(NAN));
}

MM_TARGET_AVX512 static void mm_comm_quant_avx512(const void *y, megamoe_dtype_t t, int64_t h,
                                                 int8_t *q, uint16_t *sx)
{
    const __m512 inv127 = _mm512_set1_ps(1.0f / 127.0f);
    for (int64_t i = 0; i < h; i += 16) {
        __mmask16 m = mm_tail_mask16(h - i);
        __m512 v = mm_ld16(y, t, i, m);
        __m512 s = _mm512_mul_ps(mm_block8_absmax(v), inv127);
        __m512 w = _mm512_div_ps(v, s);
        __m256i w16 = _mm512_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_mask_storeu_epi8(q + i, m, mm_int8x16(_mm512_cvtph_ps(w16)));
        float sb[16];
        _mm512_storeu_ps(sb, s);
        sx[i / 8] = mm_y_bits(sb[0], t);
        if (i + 8 < h) sx[i / 8 + 1] = mm_y_bits(sb[8], t);
    }
}

MM_TARGET_AVX512 static void mm_comm_dequant_avx512(const int8_t *q, const uint16_t *sx,
                                                   megamoe_dtype_t t, int64_t h, uint16_t *y)
{
    for (int64_t i = 0; i < h; i += 16) {
        __mmask16 m = mm_tail_mask16(h - i);
        __m512 qv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, q + i)));
        float s0 = mm_ld(sx, t, i / 8), s1 = i + 8 < h ? mm_ld(sx, t, i / 8 + 1) : 0.0f;
        __m512 s = _mm512_insertf32x8(_mm512_set1_ps(s0), _mm256_set1_ps(s1), 1);
        __m512 p = _mm512_mul_ps(qv, s);
        if (t == MEGAMOE_DTYPE_BF16) {
            mm_store_bf16x16(y + i, m, p);
        } else if (_mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q) & m) {
            /* NaN scale: vcvtps2ph quiets signalling payloads, the definition keeps them */
            float pb[16];
            _mm512_storeu_ps(pb, p);
            for (int64_t j = 0; j < 16 && i + j < h; j++) y[i + j] = megamoe_fp32_to_fp16(pb[j]);
        } else {
            _mm256_mask_storeu_epi16(y + i, m, _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
    }
}
#endif

/* ---- API --------------------------------------------------------------------------------- */

static megamoe_status_t mm_check_row(const char *fn, const void *x, megamoe_dtype_t t, int64_t h,
                                     const void *out)
{
    if (t != MEGAMOE_DTYPE_BF16 && t != MEGAMOE_DTYPE_FP16)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: input type %s; rows must be bf16 or fp16",
                        fn, megamoe_dtype_name(t));
    if (h < 0) return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: h = %lld < 0", fn, (long long)h);
    if (h > 0 && (x == NULL || out == NULL))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: NULL buffer", fn);
    return MEGAMOE_OK;
}

static megamoe_status_t mm_check_fp8(const char *fn, megamoe_dtype_t q_type)
{
    if (q_type != MEGAMOE_DTYPE_FP8_E4M3FN && q_type != MEGAMOE_DTYPE_FP8_E5M2)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: output type %s; use fp8_e4m3fn or fp8_e5m2",
                        fn, megamoe_dtype_name(q_type));
    return MEGAMOE_OK;
}

megamoe_status_t mm_quant_static_int8(const void *x, megamoe_dtype_t x_type, int64_t h,
                                      const float *scales, int64_t scales_len, int8_t *q)
{
    MM_CHECK(mm_check_row("mm_quant_static_int8", x, x_type, h, q));
    if (scales == NULL || (scales_len != 1 && scales_len != h))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "mm_quant_static_int8: scales must be (1,) or (H,) = (%lld,), got %lld values%s",
                        (long long)h, (long long)scales_len, scales ? "" : " (NULL)");
    const float *per = scales_len == h && h != 1 ? scales : NULL;
#if MM_X86
    if (mm_kernels_use_avx512()) {
        mm_int8_scaled_avx512(x, x_type, h, NULL, per, scales[0], q);
        return MEGAMOE_OK;
    }
#endif
    for (int64_t i = 0; i < h; i++) q[i] = megamoe_fp32_to_int8(mm_ld(x, x_type, i) * (per ? per[i] : scales[0]));
    return MEGAMOE_OK;
}

megamoe_status_t mm_quant_dynamic_token(const void *x, megamoe_dtype_t x_type, int64_t h,
                                        const float *smooth, megamoe_dtype_t q_type, void *q,
                                        float *scale_p)
{
    MM_CHECK(mm_check_row("mm_quant_dynamic_token", x, x_type, h, q));
    if (q_type != MEGAMOE_DTYPE_INT8) MM_CHECK(mm_check_fp8("mm_quant_dynamic_token", q_type));
    if (scale_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_quant_dynamic_token: NULL scale_p");
#if MM_X86
    if (q_type == MEGAMOE_DTYPE_INT8 && mm_kernels_use_avx512()) {
        float m = mm_absmax_avx512(x, x_type, h, smooth);
        if (m == 0.0f) {
            memset(q, 0, (size_t)h);
            *scale_p = 0.0f;
            return MEGAMOE_OK;
        }
        float d = 127.0f / m;
        mm_int8_scaled_avx512(x, x_type, h, smooth, NULL, d, q);
        *scale_p = 1.0f / d;
        return MEGAMOE_OK;
    }
#endif
    *scale_p = mm_dynamic_span(x, x_type, 0, h, smooth, q_type, q);
    return MEGAMOE_OK;
}

megamoe_status_t mm_quant_dynamic_group(const void *x, megamoe_dtype_t x_type, int64_t h,
                                        const float *smooth, megamoe_dtype_t q_type, uint8_t *q,
                                        float *scales)
{
    MM_CHECK(mm_check_row("mm_quant_dynamic_group", x, x_type, h, q));
    MM_CHECK(mm_check_fp8("mm_quant_dynamic_group", q_type));
    if (h > 0 && scales == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_quant_dynamic_group: NULL scales");
    for (int64_t g = 0; g * MM_QUANT_GROUP < h; g++) {
        int64_t i0 = g * MM_QUANT_GROUP, i1 = i0 + MM_QUANT_GROUP < h ? i0 + MM_QUANT_GROUP : h;
        scales[g] = mm_dynamic_span(x, x_type, i0, i1, smooth, q_type, q);
    }
    return MEGAMOE_OK;
}

/* Exponent field of bf16(x[i]); fp16 is widened (exactly) and truncated, which keeps it. */
static inline unsigned mm_exp_field(const void *x, megamoe_dtype_t t, int64_t i)
{
    uint16_t b = ((const uint16_t *)x)[i];
    if (t == MEGAMOE_DTYPE_BF16) return (b >> 7) & 0xffu;
    float f = megamoe_fp16_to_fp32(b);
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u >> 23) & 0xffu;
}

megamoe_status_t mm_quant_mx(const void *x, megamoe_dtype_t x_type, int64_t h,
                             megamoe_dtype_t q_type, uint8_t *q, uint8_t *scales)
{
    MM_CHECK(mm_check_row("mm_quant_mx", x, x_type, h, q));
    MM_CHECK(mm_check_fp8("mm_quant_mx", q_type));
    int64_t nscales = mm_quant_mx_scale_count(h);
    if (nscales > 0 && scales == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_quant_mx: NULL scales");
    const unsigned emax = q_type == MEGAMOE_DTYPE_FP8_E4M3FN ? 8u : 15u;
    const uint8_t nan = q_type == MEGAMOE_DTYPE_FP8_E4M3FN ? 0x7f : 0x7e;
    for (int64_t b = 0; b < nscales; b++) {
        int64_t i0 = b * MM_QUANT_MX_BLOCK, i1 = i0 + MM_QUANT_MX_BLOCK < h ? i0 + MM_QUANT_MX_BLOCK : h;
        if (i0 >= h) {
            scales[b] = 0; /* the pad block */
            continue;
        }
        unsigned E = 0;
        for (int64_t i = i0; i < i1; i++) {
            unsigned e = mm_exp_field(x, x_type, i);
            if (e > E) E = e;
        }
        if (E == 255u || E == 0u) {
            scales[b] = (uint8_t)E;
            memset(q + i0, E ? nan : 0, (size_t)(i1 - i0));
            continue;
        }
        unsigned s = (E > emax ? E : emax) - emax;
        uint32_t rbits = (254u - s) << 23; /* 2^(127 - s), a normal fp32 for s <= 246 */
        float R;
        memcpy(&R, &rbits, 4);
        scales[b] = (uint8_t)s;
        for (int64_t i = i0; i < i1; i++) q[i] = mm_fp8(mm_ld(x, x_type, i) * R, q_type, 1);
    }
    return MEGAMOE_OK;
}

megamoe_status_t mm_comm_quant_int8(const void *y, megamoe_dtype_t y_type, int64_t h, int8_t *q,
                                    void *scales)
{
    MM_CHECK(mm_check_row("mm_comm_quant_int8", y, y_type, h, q));
    if (h > 0 && scales == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_comm_quant_int8: NULL scales");
    uint16_t *sx = scales;
#if MM_X86
    if (mm_kernels_use_avx512()) {
        mm_comm_quant_avx512(y, y_type, h, q, sx);
        return MEGAMOE_OK;
    }
#endif
    const float inv127 = 1.0f / 127.0f;
    for (int64_t b = 0; b * MM_COMM_QUANT_BLOCK < h; b++) {
        int64_t i0 = b * MM_COMM_QUANT_BLOCK, i1 = i0 + MM_COMM_QUANT_BLOCK < h ? i0 + MM_COMM_QUANT_BLOCK : h;
        float s = mm_absmax(y, y_type, i0, i1, NULL) * inv127;
        sx[b] = mm_y_bits(s, y_type);
        for (int64_t i = i0; i < i1; i++)
            q[i] = megamoe_fp32_to_int8(megamoe_fp16_to_fp32(megamoe_fp32_to_fp16(mm_ld(y, y_type, i) / s)));
    }
    return MEGAMOE_OK;
}

megamoe_status_t mm_comm_dequant_int8(const int8_t *q, const void *scales, megamoe_dtype_t y_type,
                                      int64_t h, void *y)
{
    MM_CHECK(mm_check_row("mm_comm_dequant_int8", scales, y_type, h, y));
    if (h > 0 && q == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_comm_dequant_int8: NULL q");
#if MM_X86
    if (mm_kernels_use_avx512()) {
        mm_comm_dequant_avx512(q, scales, y_type, h, y);
        return MEGAMOE_OK;
    }
#endif
    uint16_t *out = y;
    for (int64_t i = 0; i < h; i++)
        out[i] = mm_y_bits((float)q[i] * mm_ld(scales, y_type, i / MM_COMM_QUANT_BLOCK), y_type);
    return MEGAMOE_OK;
}

megamoe_status_t mm_comm_dequant_mx_f32(const uint8_t *q, const uint8_t *scales,
                                        megamoe_dtype_t q_type, int64_t n, float *out)
{
    MM_CHECK(mm_check_fp8("mm_comm_dequant_mx_f32", q_type));
    if (n > 0 && (q == NULL || scales == NULL || out == NULL))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_comm_dequant_mx_f32: NULL q, scales or out");
    int e4m3 = q_type == MEGAMOE_DTYPE_FP8_E4M3FN;
    for (int64_t b0 = 0; b0 < n; b0 += MM_QUANT_MX_BLOCK) {
        uint32_t sbits = (uint32_t)scales[b0 / MM_QUANT_MX_BLOCK] << 23; /* the kernel's shift */
        float s;
        memcpy(&s, &sbits, 4);
        int64_t b1 = b0 + MM_QUANT_MX_BLOCK < n ? b0 + MM_QUANT_MX_BLOCK : n;
        for (int64_t i = b0; i < b1; i++)
            out[i] = (e4m3 ? megamoe_fp8_e4m3fn_to_fp32(q[i]) : megamoe_fp8_e5m2_to_fp32(q[i])) * s;
    }
    return MEGAMOE_OK;
}
