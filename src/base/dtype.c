/* Exact element conversions (see include/megamoe/dtype.h for the rules). Scalar versions are
 * the definition; the bulk converter has AVX-512 paths that give identical bits. */
#include <math.h>
#include <string.h>

#include "megamoe/dtype.h"

#include "cpu.h"
#include "error.h"

static inline uint32_t mm_f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float mm_u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

size_t megamoe_dtype_size(megamoe_dtype_t dtype)
{
    static const size_t sizes[MEGAMOE_DTYPE_COUNT_] = {4, 2, 2, 1, 1, 1, 1, 1, 4, 8, 1};
    if ((int)dtype < 0 || dtype >= MEGAMOE_DTYPE_COUNT_) return 0;
    return sizes[dtype];
}

const char *megamoe_dtype_name(megamoe_dtype_t dtype)
{
    static const char *const names[MEGAMOE_DTYPE_COUNT_] = {
        "fp32", "bf16", "fp16", "fp8_e4m3fn", "fp8_e5m2", "e8m0",
        "int8", "uint8", "int32", "int64", "bool"};
    if ((int)dtype < 0 || dtype >= MEGAMOE_DTYPE_COUNT_) return "unknown";
    return names[dtype];
}

/* ---- bf16 ---- */

uint16_t megamoe_fp32_to_bf16(float value)
{
    uint32_t u = mm_f2u(value);
    if ((u & 0x7fffffffu) > 0x7f800000u) { /* NaN: keep sign and payload; stay a NaN */
        uint16_t t = (uint16_t)(u >> 16);
        return (t & 0x7fu) ? t : (uint16_t)(t | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float megamoe_bf16_to_fp32(uint16_t bits) { return mm_u2f((uint32_t)bits << 16); }

/* ---- fp16 ---- */

uint16_t megamoe_fp32_to_fp16(float value)
{
    uint32_t x = mm_f2u(value);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) { /* NaN: keep sign and payload; stay a NaN */
        uint16_t man = (uint16_t)((a >> 13) & 0x3ffu);
        return (uint16_t)(sign | 0x7c00u | (man ? man : 0x200u));
    }
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to Inf */
    if (a < 0x38800000u) {                                   /* below 2^-14: fp16 subnormal */
        uint32_t e = a >> 23;
        if (e < 102) return sign; /* below 2^-25 (half the smallest subnormal) */
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a - 0x38000000u; /* rebias 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

float megamoe_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)man * 0x1p-24f; /* exact */
        return sign ? -v : v;
    }
    if (exp == 31) return mm_u2f(sign | 0x7f800000u | (man << 13));
    return mm_u2f(sign | ((exp + 112u) << 23) | (man << 13));
}

/* ---- fp8 ---- */

typedef struct mm_fp8_format {
    int mbits;        /* mantissa bits */
    int bias;         /* exponent bias */
    int emax;         /* largest unbiased exponent of a finite value */
    uint8_t maxcode;  /* magnitude code of the largest finite value */
    uint8_t nancode;  /* magnitude code of the canonical NaN */
    uint8_t overcode; /* magnitude code of a non-saturated overflow (NaN or Inf) */
} mm_fp8_format_t;

static const mm_fp8_format_t mm_e4m3fn = {3, 7, 8, 0x7e, 0x7f, 0x7f};
static const mm_fp8_format_t mm_e5m2 = {2, 15, 15, 0x7b, 0x7e, 0x7c};

static uint8_t mm_fp8_encode(float value, const mm_fp8_format_t *f, int saturate)
{
    uint32_t x = mm_f2u(value);
    uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
    uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint8_t)(sign | f->nancode);
    if (a == 0x7f800000u) return (uint8_t)(sign | (saturate ? f->maxcode : f->overcode));
    uint32_t e = a >> 23;
    if (e == 0) return sign; /* fp32 zero or subnormal: far below the fp8 range */
    int E = (int)e - 127;
    if (E > f->emax + 1) return (uint8_t)(sign | (saturate ? f->maxcode : f->overcode));
    int emin = 1 - f->bias;
    int et = E < emin ? emin : E;
    int qe = et - f->mbits;         /* exponent of one unit in the last place */
    int shift = 23 + qe - E;        /* value / 2^qe = m >> shift */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t n;
    if (shift >= 25) {
        n = 0;
    } else {
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        n = q;
    }
    uint32_t code;
    if (E < emin) {
        code = n; /* subnormal; n == 2^mbits is exactly the smallest normal's code */
    } else {
        uint32_t one = 1u << f->mbits;
        if (n >= 2 * one) { /* rounding carried into the next binade */
            et++;
            n = one;
        }
        code = ((uint32_t)(et + f->bias) << f->mbits) | (n - one);
    }
    if (code > f->maxcode) return (uint8_t)(sign | (saturate ? f->maxcode : f->overcode));
    return (uint8_t)(sign | code);
}

static float mm_fp8_decode(uint8_t b, const mm_fp8_format_t *f)
{
    float s = (b & 0x80u) ? -1.0f : 1.0f;
    uint32_t mag = b & 0x7fu;
    uint32_t exp = mag >> f->mbits, man = mag & ((1u << f->mbits) - 1);
    if (f == &mm_e4m3fn) {
        if (mag == 0x7f) return mm_u2f(mm_f2u(NAN) | ((b & 0x80u) ? 0x80000000u : 0));
    } else if (exp == 31) {
        if (man == 0) return s * INFINITY;
        return mm_u2f(mm_f2u(NAN) | ((b & 0x80u) ? 0x80000000u : 0));
    }
    if (exp == 0) return s * ldexpf((float)man, 1 - f->bias - f->mbits);
    return s * ldexpf((float)((1u << f->mbits) | man), (int)exp - f->bias - f->mbits);
}

uint8_t megamoe_fp32_to_fp8_e4m3fn(float value, int saturate)
{
    return mm_fp8_encode(value, &mm_e4m3fn, saturate);
}

uint8_t megamoe_fp32_to_fp8_e5m2(float value, int saturate)
{
    return mm_fp8_encode(value, &mm_e5m2, saturate);
}

uint8_t megamoe_bf16_to_fp8_e4m3fn(uint16_t bits, int saturate)
{
    return mm_fp8_encode(megamoe_bf16_to_fp32(bits), &mm_e4m3fn, saturate);
}

uint8_t megamoe_bf16_to_fp8_e5m2(uint16_t bits, int saturate)
{
    return mm_fp8_encode(megamoe_bf16_to_fp32(bits), &mm_e5m2, saturate);
}

float megamoe_fp8_e4m3fn_to_fp32(uint8_t bits) { return mm_fp8_decode(bits, &mm_e4m3fn); }
float megamoe_fp8_e5m2_to_fp32(uint8_t bits) { return mm_fp8_decode(bits, &mm_e5m2); }

/* ---- e8m0 and int8 ---- */

uint8_t megamoe_fp32_to_e8m0(float value)
{
    uint32_t field = (mm_f2u(value) >> 23) & 0xffu;
    return (uint8_t)field; /* NaN/Inf have field 255, zero/subnormal 0 */
}

float megamoe_e8m0_to_fp32(uint8_t bits)
{
    if (bits == 0xffu) return NAN;
    return ldexpf(1.0f, (int)bits - 127);
}

int8_t megamoe_fp32_to_int8(float value)
{
    if (value != value) return 0;
    if (value >= 127.0f) return 127;
    if (value <= -128.0f) return -128;
    float a = fabsf(value);
    float fl = floorf(a);
    float d = a - fl; /* exact: |value| < 2^23 */
    int n = (int)fl;
    if (d > 0.5f || (d == 0.5f && (n & 1))) n++;
    if (value < 0) n = -n;
    if (n > 127) n = 127;
    return (int8_t)n;
}

/* ---- bulk conversion ---- */

#if MM_X86
#include <immintrin.h>

MM_TARGET_AVX512 static void mm_fp32_to_bf16_avx512(uint16_t *dst, const float *src, size_t n)
{
    const __m512i lsb = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i qbit = _mm512_set1_epi32(0x00400000), payload = _mm512_set1_epi32(0x007f0000);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512((const void *)(src + i));
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absmask), inf);
        __mmask16 empty = _mm512_testn_epi32_mask(u, payload); /* truncated payload is 0 */
        __m512i r = _mm512_add_epi32(
            u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), lsb)));
        r = _mm512_mask_mov_epi32(r, nan, u);
        r = _mm512_mask_or_epi32(r, nan & empty, r, qbit);
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
    for (; i < n; i++) dst[i] = megamoe_fp32_to_bf16(src[i]);
}

MM_TARGET_AVX512 static void mm_bf16_to_fp32_avx512(float *dst, const uint16_t *src, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(src + i));
        _mm512_storeu_si512((void *)(dst + i), _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    for (; i < n; i++) dst[i] = megamoe_bf16_to_fp32(src[i]);
}
#endif

static int mm_is_float_type(megamoe_dtype_t t)
{
    return t == MEGAMOE_DTYPE_FP32 || t == MEGAMOE_DTYPE_BF16 || t == MEGAMOE_DTYPE_FP16;
}

static float mm_load_float(const void *src, megamoe_dtype_t t, size_t i)
{
    switch (t) {
    case MEGAMOE_DTYPE_BF16: return megamoe_bf16_to_fp32(((const uint16_t *)src)[i]);
    case MEGAMOE_DTYPE_FP16: return megamoe_fp16_to_fp32(((const uint16_t *)src)[i]);
    default: return ((const float *)src)[i];
    }
}

megamoe_status_t megamoe_convert(void *dst, megamoe_dtype_t dst_type, const void *src,
                                 megamoe_dtype_t src_type, size_t n)
{
    if (!mm_is_float_type(dst_type) || !mm_is_float_type(src_type))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "megamoe_convert supports fp32, bf16 and fp16 only (got %s -> %s)",
                        megamoe_dtype_name(src_type), megamoe_dtype_name(dst_type));
    if (n == 0) return MEGAMOE_OK;
    if (dst == NULL || src == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_convert: NULL buffer");
    if (dst_type == src_type) {
        memmove(dst, src, n * megamoe_dtype_size(src_type));
        return MEGAMOE_OK;
    }
#if MM_X86
    if (mm_cpu_has_avx512()) {
        if (src_type == MEGAMOE_DTYPE_FP32 && dst_type == MEGAMOE_DTYPE_BF16) {
            mm_fp32_to_bf16_avx512(dst, src, n);
            return MEGAMOE_OK;
        }
        if (src_type == MEGAMOE_DTYPE_BF16 && dst_type == MEGAMOE_DTYPE_FP32) {
            mm_bf16_to_fp32_avx512(dst, src, n);
            return MEGAMOE_OK;
        }
    }
#endif
    for (size_t i = 0; i < n; i++) {
        float v = mm_load_float(src, src_type, i);
        switch (dst_type) {
        case MEGAMOE_DTYPE_BF16: ((uint16_t *)dst)[i] = megamoe_fp32_to_bf16(v); break;
        case MEGAMOE_DTYPE_FP16: ((uint16_t *)dst)[i] = megamoe_fp32_to_fp16(v); break;
        default: ((float *)dst)[i] = v; break;
        }
    }
    return MEGAMOE_OK;
}
