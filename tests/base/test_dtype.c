/* Exact conversions: exhaustive round trips, OCP FP8 tables computed independently here,
 * rounding ties and saturation edges, and bulk == scalar. (Agreement with torch 1.13 on random
 * values is tests/python/test_dtype_torch.py.) */
#include <math.h>
#include <stdlib.h>

#include "harness/harness.h"
#include "megamoe/dtype.h"
#include "megamoe/log.h"

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int same_bits_or_both_nan(float a, double b)
{
    if (isnan(b)) return isnan(a);
    return (double)a == b && !!signbit(a) == !!signbit(b);
}

MM_TEST(bf16_every_pattern_round_trips)
{
    for (uint32_t b = 0; b < 65536; b++) {
        float f = megamoe_bf16_to_fp32((uint16_t)b);
        ASSERT_EQ_U64(f2u(f), b << 16);
        ASSERT_EQ_U64(megamoe_fp32_to_bf16(f), b);
    }
}

MM_TEST(fp16_every_pattern_round_trips)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = megamoe_fp16_to_fp32((uint16_t)h);
        /* independent decode */
        int s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
        double want;
        if (e == 0) want = ldexp(m, -24);
        else if (e == 31) want = m ? NAN : INFINITY;
        else want = ldexp(1024 + m, e - 25);
        if (s) want = -want;
        ASSERT_TRUE(same_bits_or_both_nan(f, want));
        ASSERT_EQ_U64(megamoe_fp32_to_fp16(f), h);
    }
}

MM_TEST(bf16_rounds_half_to_even)
{
    /* 1 + 2^-8 is halfway between bf16 1.0 and 1+2^-7: ties to even (1.0). */
    ASSERT_EQ_U64(megamoe_fp32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    ASSERT_EQ_U64(megamoe_fp32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    ASSERT_EQ_U64(megamoe_fp32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82); /* odd -> up */
    ASSERT_EQ_U64(megamoe_fp32_to_bf16(u2f(0x7f7fffff)), 0x7f80);       /* max float -> inf */
    ASSERT_EQ_U64(megamoe_fp32_to_bf16(-INFINITY), 0xff80);
    ASSERT_EQ_U64(megamoe_fp32_to_bf16(u2f(0x7f800001)) & 0x7f80, 0x7f80); /* NaN stays NaN */
    ASSERT_TRUE(megamoe_fp32_to_bf16(u2f(0x7f800001)) & 0x7f);
    ASSERT_EQ_U64(megamoe_fp32_to_bf16(u2f(0x00000001)), 0x0000); /* tiny subnormal */
    ASSERT_EQ_U64(megamoe_fp32_to_bf16(u2f(0x00008000)), 0x0000); /* tie to even 0 */
    ASSERT_EQ_U64(megamoe_fp32_to_bf16(u2f(0x00018000)), 0x0002); /* tie to even 2 */
}

MM_TEST(fp16_rounds_half_to_even_and_saturates_to_inf)
{
    ASSERT_EQ_U64(megamoe_fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
    ASSERT_EQ_U64(megamoe_fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);
    ASSERT_EQ_U64(megamoe_fp32_to_fp16(65504.0f), 0x7bff);
    ASSERT_EQ_U64(megamoe_fp32_to_fp16(65519.0f), 0x7bff);
    ASSERT_EQ_U64(megamoe_fp32_to_fp16(65520.0f), 0x7c00);
    ASSERT_EQ_U64(megamoe_fp32_to_fp16(-1e9f), 0xfc00);
    ASSERT_EQ_U64(megamoe_fp32_to_fp16(0x1p-25f), 0x0000);             /* tie to even 0 */
    ASSERT_EQ_U64(megamoe_fp32_to_fp16(0x1p-25f * 1.0000001f), 0x0001);
    ASSERT_EQ_U64(megamoe_fp32_to_fp16(3 * 0x1p-25f), 0x0002);         /* tie to even 2 */
    ASSERT_EQ_U64(megamoe_fp32_to_fp16(0x1p-14f), 0x0400);             /* smallest normal */
    ASSERT_EQ_U64(megamoe_fp32_to_fp16(0x1p-14f - 0x1p-26f), 0x0400);  /* rounds up into normal */
    ASSERT_EQ_U64(megamoe_fp32_to_fp16(-0.0f), 0x8000);
}

/* Independent OCP FP8 decoders. */
static double e4m3_value(uint8_t b)
{
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    double v;
    if (e == 15 && m == 7) return NAN;
    v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return s ? -v : v;
}

static double e5m2_value(uint8_t b)
{
    int s = b >> 7, e = (b >> 2) & 31, m = b & 3;
    double v;
    if (e == 31) v = m ? NAN : INFINITY;
    else v = e == 0 ? ldexp(m, -16) : ldexp(4 + m, e - 17);
    return s ? -v : v;
}

MM_TEST(fp8_every_byte_decodes_to_the_ocp_table)
{
    for (int b = 0; b < 256; b++) {
        ASSERT_TRUE(same_bits_or_both_nan(megamoe_fp8_e4m3fn_to_fp32((uint8_t)b), e4m3_value((uint8_t)b)));
        ASSERT_TRUE(same_bits_or_both_nan(megamoe_fp8_e5m2_to_fp32((uint8_t)b), e5m2_value((uint8_t)b)));
    }
    ASSERT_NEAR(megamoe_fp8_e4m3fn_to_fp32(0x7e), 448.0, 0);
    ASSERT_NEAR(megamoe_fp8_e5m2_to_fp32(0x7b), 57344.0, 0);
    ASSERT_NEAR(megamoe_fp8_e4m3fn_to_fp32(0x01), 0x1p-9, 0);
    ASSERT_NEAR(megamoe_fp8_e5m2_to_fp32(0x01), 0x1p-16, 0);
    ASSERT_TRUE(isinf(megamoe_fp8_e5m2_to_fp32(0x7c)));
    ASSERT_TRUE(isnan(megamoe_fp8_e4m3fn_to_fp32(0xff)));
}

static void check_fp8_grid(uint8_t (*enc)(float, int), double (*val)(uint8_t), int maxcode)
{
    for (int c = 0; c <= maxcode; c++) {
        for (int sat = 0; sat < 2; sat++) {
            ASSERT_EQ_INT(enc((float)val((uint8_t)c), sat), c);
            ASSERT_EQ_INT(enc((float)-val((uint8_t)c), sat), c | 0x80);
        }
        if (c == maxcode) break;
        double lo = val((uint8_t)c), hi = val((uint8_t)(c + 1));
        float mid = (float)((lo + hi) / 2); /* exact in fp32 */
        int even = (c % 2 == 0) ? c : c + 1;
        ASSERT_EQ_INT(enc(mid, 0), even);
        ASSERT_EQ_INT(enc(nextafterf(mid, 0.0f), 0), c);
        ASSERT_EQ_INT(enc(nextafterf(mid, INFINITY), 0), c + 1);
    }
}

MM_TEST(fp8_encodes_every_value_and_rounds_ties_to_even)
{
    check_fp8_grid(megamoe_fp32_to_fp8_e4m3fn, e4m3_value, 0x7e);
    if (mm_test_failed()) return;
    check_fp8_grid(megamoe_fp32_to_fp8_e5m2, e5m2_value, 0x7b);
}

MM_TEST(fp8_saturation_edges)
{
    /* e4m3fn: 464 is the tie between 448 and (non-existent) 480 -> 448; above -> NaN. */
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e4m3fn(464.0f, 0), 0x7e);
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e4m3fn(464.0001f, 0), 0x7f);
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e4m3fn(464.0001f, 1), 0x7e);
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e4m3fn(1e10f, 0), 0x7f);
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e4m3fn(-1e10f, 1), 0xfe);
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e4m3fn(INFINITY, 0), 0x7f);
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e4m3fn(-INFINITY, 1), 0xfe);
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e4m3fn(NAN, 1) & 0x7f, 0x7f);
    /* e5m2: 61440 ties between 57344 (odd mantissa) and 65536 (= Inf) -> Inf. */
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e5m2(61440.0f, 0), 0x7c);
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e5m2(61440.0f, 1), 0x7b);
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e5m2(61439.996f, 0), 0x7b);
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e5m2(-INFINITY, 0), 0xfc);
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e5m2(-INFINITY, 1), 0xfb);
    ASSERT_TRUE(isnan(megamoe_fp8_e5m2_to_fp32(megamoe_fp32_to_fp8_e5m2(NAN, 1))));
    /* subnormal ties */
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e4m3fn(0x1p-10f, 0), 0x00);
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e4m3fn(3 * 0x1p-10f, 0), 0x02);
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e4m3fn(-0x1p-30f, 0), 0x80);
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e5m2(0x1p-17f, 0), 0x00);
    ASSERT_EQ_INT(megamoe_fp32_to_fp8_e5m2(0x1p-17f * 1.001f, 0), 0x01);
}

MM_TEST(fp8_from_bf16_matches_the_fp32_path)
{
    for (uint32_t b = 0; b < 65536; b++) {
        float f = megamoe_bf16_to_fp32((uint16_t)b);
        for (int sat = 0; sat < 2; sat++) {
            ASSERT_EQ_INT(megamoe_bf16_to_fp8_e4m3fn((uint16_t)b, sat), megamoe_fp32_to_fp8_e4m3fn(f, sat));
            ASSERT_EQ_INT(megamoe_bf16_to_fp8_e5m2((uint16_t)b, sat), megamoe_fp32_to_fp8_e5m2(f, sat));
        }
    }
}

MM_TEST(e8m0_scale_bytes)
{
    for (int b = 0; b < 255; b++) {
        ASSERT_EQ_U64(f2u(megamoe_e8m0_to_fp32((uint8_t)b)), f2u((float)ldexp(1.0, b - 127)));
        if (b > 0) ASSERT_EQ_INT(megamoe_fp32_to_e8m0((float)ldexp(1.0, b - 127)), b);
    }
    ASSERT_TRUE(isnan(megamoe_e8m0_to_fp32(0xff)));
    ASSERT_EQ_INT(megamoe_fp32_to_e8m0(3.0f), 128);    /* floor(log2 3) = 1 */
    ASSERT_EQ_INT(megamoe_fp32_to_e8m0(0.75f), 126);
    ASSERT_EQ_INT(megamoe_fp32_to_e8m0(0.0f), 0);
    ASSERT_EQ_INT(megamoe_fp32_to_e8m0(NAN), 255);
    ASSERT_EQ_INT(megamoe_fp32_to_e8m0(INFINITY), 255);
}

MM_TEST(int8_rounds_half_to_even_and_saturates)
{
    const float in[] = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, 127.4f, 127.5f, 200.0f,
                        -127.5f, -128.5f, -1000.0f, 0.49999997f, 3.0f, -0.0f};
    const int want[] = {0, 2, 2, 0, -2, -2, 126, 127, 127, 127, -128, -128, -128, 0, 3, 0};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) ASSERT_EQ_INT(megamoe_fp32_to_int8(in[i]), want[i]);
    ASSERT_EQ_INT(megamoe_fp32_to_int8(NAN), 0);
    ASSERT_EQ_INT(megamoe_fp32_to_int8(INFINITY), 127);
    ASSERT_EQ_INT(megamoe_fp32_to_int8(-INFINITY), -128);
}

MM_TEST(bulk_conversion_matches_scalar)
{
    enum { N = 65536 + 37 };
    float *f = malloc(N * 4), *back = malloc(N * 4);
    uint16_t *h = malloc(N * 2), *hb = malloc(N * 2);
    ASSERT_TRUE(f && back && h && hb);
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t bits = (uint32_t)(x >> 32);
        if (i < 65536) bits = ((uint32_t)i << 16) | (bits & 0xffff); /* every exponent/NaN */
        f[i] = u2f(bits);
    }
    ASSERT_OK(megamoe_convert(h, MEGAMOE_DTYPE_BF16, f, MEGAMOE_DTYPE_FP32, N));
    for (int i = 0; i < N; i++) ASSERT_EQ_U64(h[i], megamoe_fp32_to_bf16(f[i]));
    ASSERT_OK(megamoe_convert(back, MEGAMOE_DTYPE_FP32, h, MEGAMOE_DTYPE_BF16, N));
    for (int i = 0; i < N; i++) ASSERT_EQ_U64(f2u(back[i]), f2u(megamoe_bf16_to_fp32(h[i])));
    ASSERT_OK(megamoe_convert(hb, MEGAMOE_DTYPE_FP16, f, MEGAMOE_DTYPE_FP32, N));
    for (int i = 0; i < N; i++) ASSERT_EQ_U64(hb[i], megamoe_fp32_to_fp16(f[i]));
    ASSERT_OK(megamoe_convert(hb, MEGAMOE_DTYPE_FP16, h, MEGAMOE_DTYPE_BF16, N));
    for (int i = 0; i < N; i++) ASSERT_EQ_U64(hb[i], megamoe_fp32_to_fp16(megamoe_bf16_to_fp32(h[i])));
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    ASSERT_STATUS(megamoe_convert(hb, MEGAMOE_DTYPE_INT8, f, MEGAMOE_DTYPE_FP32, 4),
                  MEGAMOE_INVALID_ARGUMENT);
    free(f);
    free(back);
    free(h);
    free(hb);
}
