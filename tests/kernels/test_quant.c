/* Quantisers, C side: hand-worked examples of every mode, the spec's outputs for zero, NaN and
 * Inf rows, scale counts, odd H, and the AVX-512 paths bit-identical to the scalar definition
 * on random and adversarial rows (this file also runs under ASan). The independent numpy
 * implementation of §4 and §5.2 is test_kernels_quant.py. */
#include <math.h>
#include <stdlib.h>

#include "harness/harness.h"
#include "kernels/quant.h"
#include "kernels/simd.h"
#include "megamoe/dtype.h"
#include "megamoe/log.h"

static uint16_t bf(float v) { return megamoe_fp32_to_bf16(v); }

static uint64_t rs = 0x13198a2e03707344ull;
static uint32_t rnd(void)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (uint32_t)(rs >> 11);
}

MM_TEST(mode2_int8_worked_example)
{
    /* m = 2, d = fl32(127/2) = 63.5: 1 -> 63.5 -> 64 (tie to even), -2 -> -127, 0.5 -> 31.75 -> 32,
     * 0.0078125 -> 0.49609375 -> 0; scale = fl32(1/63.5) */
    uint16_t x[4] = {bf(1.0f), bf(-2.0f), bf(0.5f), bf(0.0078125f)};
    int8_t q[4];
    float s;
    for (int vec = 0; vec < 2; vec++) {
        int prev = mm_kernels_set_vector(vec);
        ASSERT_OK(mm_quant_dynamic_token(x, MEGAMOE_DTYPE_BF16, 4, NULL, MEGAMOE_DTYPE_INT8, q, &s));
        mm_kernels_set_vector(prev);
        ASSERT_EQ_INT(q[0], 64);
        ASSERT_EQ_INT(q[1], -127);
        ASSERT_EQ_INT(q[2], 32);
        ASSERT_EQ_INT(q[3], 0);
        ASSERT_TRUE(s == 1.0f / 63.5f);
    }
}

MM_TEST(scale_is_reciprocal_of_d_not_max_over_127)
{
    /* find a row max where fl32(1/fl32(127/m)) != fl32(m/127): the spec insists on the former */
    float m = 1.0f;
    int found = 0;
    for (int i = 0; i < 100000 && !found; i++) {
        m = megamoe_bf16_to_fp32(bf(0.5f + (float)i * 1e-4f));
        float d = 127.0f / m;
        found = 1.0f / d != m / 127.0f;
    }
    ASSERT_TRUE(found);
    uint16_t x[2] = {bf(m), bf(-0.25f)};
    int8_t q[2];
    float s;
    ASSERT_OK(mm_quant_dynamic_token(x, MEGAMOE_DTYPE_BF16, 2, NULL, MEGAMOE_DTYPE_INT8, q, &s));
    float d = 127.0f / m;
    ASSERT_TRUE(s == 1.0f / d);
    ASSERT_TRUE(s != m / 127.0f);
}

MM_TEST(zero_nan_inf_rows_have_defined_outputs)
{
    const int64_t H = 37;
    uint16_t zero[37] = {0}, nanrow[37], infrow[37];
    for (int i = 0; i < H; i++) nanrow[i] = bf(1.0f), infrow[i] = bf(-3.0f);
    nanrow[20] = 0x7fc1;
    infrow[5] = 0x7f80;
    int8_t q[37];
    uint8_t q8[37], sc[4];
    float s, gs[1];
    for (int vec = 0; vec < 2; vec++) {
        int prev = mm_kernels_set_vector(vec);
        memset(q, 55, sizeof q);
        ASSERT_OK(mm_quant_dynamic_token(zero, MEGAMOE_DTYPE_BF16, H, NULL, MEGAMOE_DTYPE_INT8, q, &s));
        for (int i = 0; i < H; i++) ASSERT_EQ_INT(q[i], 0);
        ASSERT_TRUE(s == 0.0f);
        ASSERT_OK(mm_quant_dynamic_token(nanrow, MEGAMOE_DTYPE_BF16, H, NULL, MEGAMOE_DTYPE_INT8, q, &s));
        for (int i = 0; i < H; i++) ASSERT_EQ_INT(q[i], 0);
        ASSERT_TRUE(isnan(s));
        ASSERT_OK(mm_quant_dynamic_token(infrow, MEGAMOE_DTYPE_BF16, H, NULL, MEGAMOE_DTYPE_INT8, q, &s));
        for (int i = 0; i < H; i++) ASSERT_EQ_INT(q[i], 0);
        ASSERT_TRUE(isinf(s));
        mm_kernels_set_vector(prev);
    }
    memset(q8, 55, sizeof q8);
    ASSERT_OK(mm_quant_dynamic_token(zero, MEGAMOE_DTYPE_BF16, H, NULL, MEGAMOE_DTYPE_FP8_E4M3FN, q8, &s));
    for (int i = 0; i < H; i++) ASSERT_EQ_INT(q8[i], 0);
    ASSERT_TRUE(s == 0.0f);
    ASSERT_OK(mm_quant_dynamic_group(zero, MEGAMOE_DTYPE_FP16, H, NULL, MEGAMOE_DTYPE_FP8_E5M2, q8, gs));
    for (int i = 0; i < H; i++) ASSERT_EQ_INT(q8[i], 0);
    ASSERT_TRUE(gs[0] == 0.0f);
    ASSERT_OK(mm_quant_dynamic_token(infrow, MEGAMOE_DTYPE_BF16, H, NULL, MEGAMOE_DTYPE_FP8_E4M3FN, q8, &s));
    ASSERT_EQ_INT(q8[5], 0x7f); /* inf * 0 = NaN -> the positive canonical fp8 NaN */
    ASSERT_EQ_INT(q8[0], 0x80); /* -3 * 0 = -0 */
    /* MX: zero block -> scale 0 and zeros; NaN/Inf block -> 0xFF and canonical NaN */
    ASSERT_OK(mm_quant_mx(zero, MEGAMOE_DTYPE_BF16, H, MEGAMOE_DTYPE_FP8_E4M3FN, q8, sc));
    ASSERT_EQ_INT(sc[0], 0);
    ASSERT_EQ_INT(sc[1], 0);
    for (int i = 0; i < H; i++) ASSERT_EQ_INT(q8[i], 0);
    ASSERT_OK(mm_quant_mx(infrow, MEGAMOE_DTYPE_BF16, H, MEGAMOE_DTYPE_FP8_E5M2, q8, sc));
    ASSERT_EQ_INT(sc[0], 0xff);
    for (int i = 0; i < 32; i++) ASSERT_EQ_INT(q8[i], 0x7e);
    /* block 1 = five -3.0 (field 128): s = 128 - 15 = 113, q = e5m2_sat(-3 * 2^14) */
    ASSERT_EQ_INT(sc[1], 113);
    ASSERT_EQ_INT(q8[32], megamoe_fp32_to_fp8_e5m2(-3.0f * 16384.0f, 1));
    ASSERT_EQ_INT(q8[32], 0xfa);
}

MM_TEST(mx_worked_example_and_saturation)
{
    /* block 0: max 504 = 1.96875 * 2^8 (exponent field 135): s = 135 - 8 = 127, R = 1;
     * 504 saturates to 448 (0x7e), 1.0 -> 0x38, -0.001953125 = -2^-9 -> e4m3fn smallest
     * subnormal (0x81). block 1 (short, 5 elements): all 2^-130 (bf16 subnormal: field 0) ... */
    uint16_t x[37];
    for (int i = 0; i < 37; i++) x[i] = bf(0.0f);
    x[0] = bf(504.0f), x[1] = bf(1.0f), x[2] = bf(-0.001953125f);
    x[33] = 0x0001; /* bf16 subnormal: exponent field 0 -> block scale 0, q 0 */
    uint8_t q[37], sc[2];
    ASSERT_OK(mm_quant_mx(x, MEGAMOE_DTYPE_BF16, 37, MEGAMOE_DTYPE_FP8_E4M3FN, q, sc));
    ASSERT_EQ_INT(mm_quant_mx_scale_count(37), 2);
    ASSERT_EQ_INT(sc[0], 127);
    ASSERT_EQ_INT(q[0], 0x7e);
    ASSERT_EQ_INT(q[1], 0x38);
    ASSERT_EQ_INT(q[2], 0x81);
    ASSERT_EQ_INT(sc[1], 0);
    ASSERT_EQ_INT(q[33], 0);
    /* e5m2 (emax 15), max 0.75 (field 126): s = 126 - 15 = 111, R = 2^16 */
    uint16_t y[3] = {bf(0.75f), bf(-0.5f), bf(0.001f)};
    ASSERT_OK(mm_quant_mx(y, MEGAMOE_DTYPE_BF16, 3, MEGAMOE_DTYPE_FP8_E5M2, q, sc));
    ASSERT_EQ_INT(sc[0], 111);
    ASSERT_EQ_INT(q[0], megamoe_fp32_to_fp8_e5m2(0.75f * 65536.0f, 1));
    ASSERT_EQ_INT(q[1], megamoe_fp32_to_fp8_e5m2(-32768.0f, 1));
    ASSERT_EQ_INT(q[1], 0xf8);
    ASSERT_EQ_INT(sc[1], 0); /* the pad block */
    ASSERT_EQ_INT(mm_quant_mx_scale_count(64), 2);
    ASSERT_EQ_INT(mm_quant_mx_scale_count(65), 4);
    ASSERT_EQ_INT(mm_quant_mx_scale_count(0), 0);
}

MM_TEST(comm_mx_dequant_worked_example)
{
    /* The 950 combine's MX dequantisation: scale = the fp32 with bits byte << 23. Block 0 (byte
     * 127: 1.0) and block 1 (byte 130: 8.0) of an e4m3fn row; 0x7e = 448, 0x38 = 1.0, 0x81 =
     * -2^-9; block 2 byte 0: +0 whatever q is; block 3 byte 0xFF: +Inf (q 0x7f, NaN -> NaN). */
    uint8_t q[100], sc[4] = {127, 130, 0, 0xff};
    for (int i = 0; i < 100; i++) q[i] = 0x38;
    q[0] = 0x7e, q[1] = 0x81, q[32] = 0x38, q[33] = 0xb8, q[64] = 0x7e, q[96] = 0x7f;
    float y[100];
    ASSERT_OK(mm_comm_dequant_mx_f32(q, sc, MEGAMOE_DTYPE_FP8_E4M3FN, 100, y));
    ASSERT_TRUE(y[0] == 448.0f && y[1] == -0.001953125f && y[2] == 1.0f);
    ASSERT_TRUE(y[32] == 8.0f && y[33] == -8.0f);
    ASSERT_TRUE(y[64] == 0.0f && y[65] == 0.0f && !signbit(y[64]));
    ASSERT_TRUE(isnan(y[96]) && isinf(y[97]) && y[97] > 0);
    /* e5m2 and a range starting at block 1 of the row (q and scales offset together) */
    uint8_t q5[2] = {megamoe_fp32_to_fp8_e5m2(-1.5f, 1), megamoe_fp32_to_fp8_e5m2(57344.0f, 1)};
    uint8_t s5[1] = {120};
    ASSERT_OK(mm_comm_dequant_mx_f32(q5, s5, MEGAMOE_DTYPE_FP8_E5M2, 2, y));
    ASSERT_TRUE(y[0] == -1.5f / 128.0f && y[1] == 57344.0f / 128.0f);
    /* quantise (quantMode 4) then dequantise: exact for values on the block's fp8 grid */
    uint16_t x[40];
    for (int i = 0; i < 40; i++) x[i] = bf((float)(i % 8 - 4) * 0.5f);
    uint8_t qq[40], ss[2];
    ASSERT_OK(mm_quant_mx(x, MEGAMOE_DTYPE_BF16, 40, MEGAMOE_DTYPE_FP8_E4M3FN, qq, ss));
    ASSERT_OK(mm_comm_dequant_mx_f32(qq, ss, MEGAMOE_DTYPE_FP8_E4M3FN, 40, y));
    for (int i = 0; i < 40; i++) ASSERT_TRUE(y[i] == (float)(i % 8 - 4) * 0.5f);
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    ASSERT_STATUS(mm_comm_dequant_mx_f32(q, NULL, MEGAMOE_DTYPE_FP8_E4M3FN, 4, y), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_comm_dequant_mx_f32(q, sc, MEGAMOE_DTYPE_INT8, 4, y), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_OK(mm_comm_dequant_mx_f32(NULL, NULL, MEGAMOE_DTYPE_FP8_E5M2, 0, NULL));
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
}

MM_TEST(comm_quant_worked_example)
{
    /* block [127, -63.5, 1, 0, 0.25, ...]: m = 127, s = fl32(127 * fl32(1/127)) (= 1 - 2^-24?),
     * q = int8(f16(y / s)) */
    uint16_t y[10] = {bf(127.0f), bf(-63.5f), bf(1.0f), 0, bf(0.25f), bf(2.0f), bf(3.0f), bf(-4.0f),
                      bf(0.0f), bf(0.0f)};
    int8_t q[10];
    uint16_t sx[2], back[10];
    for (int vec = 0; vec < 2; vec++) {
        int prev = mm_kernels_set_vector(vec);
        ASSERT_OK(mm_comm_quant_int8(y, MEGAMOE_DTYPE_BF16, 10, q, sx));
        ASSERT_OK(mm_comm_dequant_int8(q, sx, MEGAMOE_DTYPE_BF16, 10, back));
        mm_kernels_set_vector(prev);
        float s = 127.0f * (1.0f / 127.0f);
        ASSERT_EQ_INT(sx[0], bf(s));
        for (int i = 0; i < 8; i++) {
            float w = megamoe_bf16_to_fp32(y[i]) / s;
            ASSERT_EQ_INT(q[i], megamoe_fp32_to_int8(megamoe_fp16_to_fp32(megamoe_fp32_to_fp16(w))));
            ASSERT_EQ_INT(back[i], bf((float)q[i] * megamoe_bf16_to_fp32(sx[0])));
        }
        ASSERT_EQ_INT(q[0], 127);
        ASSERT_EQ_INT(q[1], -64); /* -63.5/s rounds through fp16 to -63.5 then to even */
        ASSERT_EQ_INT(sx[1], 0); /* zero block: scale 0, q 0 */
        ASSERT_EQ_INT(q[8], 0);
        ASSERT_EQ_INT(q[9], 0);
        ASSERT_EQ_INT(back[8], 0);
    }
}

/* ---- vector == scalar on random and adversarial rows ------------------------------------- */

static uint16_t rand_elem(megamoe_dtype_t t, int kind)
{
    float v;
    switch (kind) {
    case 0: v = ((float)(rnd() % 20001) - 10000.0f) / 1000.0f; break;
    case 1: v = ldexpf((float)(rnd() % 2000) - 1000.0f, (int)(rnd() % 60) - 40); break;
    case 2: return (uint16_t)rnd(); /* any pattern: NaN, Inf, subnormals */
    default: v = (float)((int)(rnd() % 9) - 4) * 0.5f; break; /* ties */
    }
    return t == MEGAMOE_DTYPE_BF16 ? megamoe_fp32_to_bf16(v) : megamoe_fp32_to_fp16(v);
}

MM_TEST(vector_paths_bit_identical_to_scalar)
{
    if (!mm_kernels_use_avx512()) MM_SKIP("no AVX-512 here: only the scalar definition runs");
    static const int64_t Hs[] = {1, 7, 8, 9, 15, 16, 17, 127, 129, 300, 4097};
    uint16_t *x = malloc(4097 * 2), *sx0 = malloc(600 * 2), *sx1 = malloc(600 * 2);
    uint16_t *y0 = malloc(4097 * 2), *y1 = malloc(4097 * 2);
    int8_t *q0 = malloc(4097), *q1 = malloc(4097);
    float *smooth = malloc(4097 * 4), *stat = malloc(4097 * 4);
    for (int i = 0; i < 4097; i++) smooth[i] = 0.5f + (float)(rnd() % 1000) / 500.0f, stat[i] = smooth[i] * 3.0f;
    int rows = 0;
    for (int hi = 0; hi < 11; hi++)
        for (int ti = 0; ti < 2; ti++)
            for (int kind = 0; kind < 5; kind++) {
                megamoe_dtype_t t = ti ? MEGAMOE_DTYPE_FP16 : MEGAMOE_DTYPE_BF16;
                int64_t H = Hs[hi];
                for (int64_t i = 0; i < H; i++) x[i] = kind == 4 ? (rnd() % 50 ? 0 : rand_elem(t, 0)) : rand_elem(t, kind);
                for (int sm = 0; sm < 2; sm++) {
                    float s0, s1;
                    mm_kernels_set_vector(0);
                    ASSERT_OK(mm_quant_dynamic_token(x, t, H, sm ? smooth : NULL, MEGAMOE_DTYPE_INT8, q0, &s0));
                    mm_kernels_set_vector(1);
                    ASSERT_OK(mm_quant_dynamic_token(x, t, H, sm ? smooth : NULL, MEGAMOE_DTYPE_INT8, q1, &s1));
                    ASSERT_TRUE(memcmp(q0, q1, (size_t)H) == 0);
                    ASSERT_TRUE(memcmp(&s0, &s1, 4) == 0);
                    mm_kernels_set_vector(0);
                    ASSERT_OK(mm_quant_static_int8(x, t, H, stat, sm ? H : 1, q0));
                    mm_kernels_set_vector(1);
                    ASSERT_OK(mm_quant_static_int8(x, t, H, stat, sm ? H : 1, q1));
                    ASSERT_TRUE(memcmp(q0, q1, (size_t)H) == 0);
                }
                mm_kernels_set_vector(0);
                ASSERT_OK(mm_comm_quant_int8(x, t, H, q0, sx0));
                ASSERT_OK(mm_comm_dequant_int8(q0, sx0, t, H, y0));
                mm_kernels_set_vector(1);
                ASSERT_OK(mm_comm_quant_int8(x, t, H, q1, sx1));
                ASSERT_OK(mm_comm_dequant_int8(q0, sx0, t, H, y1));
                ASSERT_TRUE(memcmp(q0, q1, (size_t)H) == 0);
                ASSERT_TRUE(memcmp(sx0, sx1, (size_t)mm_comm_quant_block_count(H) * 2) == 0);
                ASSERT_TRUE(memcmp(y0, y1, (size_t)H * 2) == 0);
                rows++;
            }
    fprintf(stderr, "  %d row patterns, all bit-identical\n", rows);
    free(x), free(sx0), free(sx1), free(y0), free(y1), free(q0), free(q1), free(smooth), free(stat);
}

MM_TEST(bad_arguments)
{
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    uint16_t x[4] = {0};
    int8_t q[4];
    uint8_t q8[4], sc[2];
    float s = 1.0f;
    ASSERT_STATUS(mm_quant_dynamic_token(x, MEGAMOE_DTYPE_FP32, 4, NULL, MEGAMOE_DTYPE_INT8, q, &s), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_quant_dynamic_group(x, MEGAMOE_DTYPE_BF16, 4, NULL, MEGAMOE_DTYPE_INT8, q8, &s), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_quant_static_int8(x, MEGAMOE_DTYPE_BF16, 4, &s, 3, q), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_quant_mx(x, MEGAMOE_DTYPE_BF16, 4, MEGAMOE_DTYPE_FP8_E4M3FN, q8, NULL), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_comm_quant_int8(NULL, MEGAMOE_DTYPE_BF16, 4, q, sc), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_OK(mm_comm_quant_int8(NULL, MEGAMOE_DTYPE_BF16, 0, NULL, NULL));
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
}

/* ---- activation rows for the quantised GEMMs (mm_quant_rows_int8) ------------------------ */

MM_TEST(rows_sym127_worked_example_rounds_half_away)
{
    /* m = 127, s = 1: ties go away from zero (62.5 -> 63, -0.5 -> -1), never -128 */
    const float v[8] = {127.0f, 62.5f, -62.5f, 0.5f, -0.5f, 1.5f, -127.0f, 0.25f};
    const int8_t want[8] = {127, 63, -63, 1, -1, 2, -127, 0};
    uint16_t xb[8];
    for (int i = 0; i < 8; i++) xb[i] = bf(v[i]);
    for (int vec = 0; vec < 2; vec++)
        for (int t = 0; t < 2; t++) {
            int8_t q[8];
            float s = -1;
            int prev = mm_kernels_set_vector(vec);
            ASSERT_OK(mm_quant_rows_int8(MM_QROW_SYM127, t ? (const void *)v : (const void *)xb,
                                         t ? MEGAMOE_DTYPE_FP32 : MEGAMOE_DTYPE_BF16, 1, 8, 8,
                                         NULL, q, 8, &s));
            mm_kernels_set_vector(prev);
            ASSERT_TRUE(s == 1.0f);
            for (int i = 0; i < 8; i++) ASSERT_EQ_INT(q[i], want[i]);
        }
    /* s = fl32(m / 127), not 1 / fl32(127 / m): the two rules differ here */
    float m = 0.5f;
    for (int i = 0; i < 100000; i++) {
        m = megamoe_bf16_to_fp32(bf(0.5f + (float)i * 1e-4f));
        if (m / 127.0f != 1.0f / (127.0f / m)) break;
    }
    uint16_t x2[2] = {bf(m), bf(-0.25f)};
    int8_t q[2];
    float s_sym, s_disp;
    ASSERT_OK(mm_quant_rows_int8(MM_QROW_SYM127, x2, MEGAMOE_DTYPE_BF16, 1, 2, 2, NULL, q, 2, &s_sym));
    ASSERT_OK(mm_quant_rows_int8(MM_QROW_DISPATCH, x2, MEGAMOE_DTYPE_BF16, 1, 2, 2, NULL, q, 2, &s_disp));
    ASSERT_TRUE(s_sym == m / 127.0f);
    ASSERT_TRUE(s_disp == 1.0f / (127.0f / m));
    ASSERT_TRUE(s_sym != s_disp);
}

MM_TEST(rows_dispatch_rule_is_quant_mode_2)
{
    enum { R = 7, H = 77 };
    uint16_t x[R * (H + 3)];
    for (int i = 0; i < R * (H + 3); i++) x[i] = rand_elem(MEGAMOE_DTYPE_BF16, i % 3);
    int8_t q[R * (H + 1)], q1[H];
    float s[R], s1;
    ASSERT_OK(mm_quant_rows_int8(MM_QROW_DISPATCH, x, MEGAMOE_DTYPE_BF16, R, H, H + 3, NULL, q, H + 1, s));
    for (int r = 0; r < R; r++) {
        ASSERT_OK(mm_quant_dynamic_token(x + r * (H + 3), MEGAMOE_DTYPE_BF16, H, NULL,
                                         MEGAMOE_DTYPE_INT8, q1, &s1));
        ASSERT_TRUE(memcmp(q + r * (H + 1), q1, H) == 0);
        ASSERT_TRUE(memcmp(&s[r], &s1, 4) == 0);
    }
}

MM_TEST(rows_sym127_special_rows_and_vector_equals_scalar)
{
    if (!mm_kernels_use_avx512()) MM_SKIP("no AVX-512 here: only the scalar definition runs");
    static const int64_t Hs[] = {1, 15, 16, 17, 100, 4097};
    float *x32 = malloc(4097 * 4), *smooth = malloc(4097 * 4);
    uint16_t *x16 = malloc(4097 * 2);
    int8_t *q0 = malloc(4097), *q1 = malloc(4097);
    for (int i = 0; i < 4097; i++) smooth[i] = 0.5f + (float)(rnd() % 1000) / 500.0f;
    int rows = 0;
    for (int hi = 0; hi < 6; hi++)
        for (int ti = 0; ti < 3; ti++)
            for (int kind = 0; kind < 6; kind++)
                for (int sm = 0; sm < 2; sm++) {
                    const megamoe_dtype_t t = ti == 0 ? MEGAMOE_DTYPE_BF16
                                              : ti == 1 ? MEGAMOE_DTYPE_FP16
                                                        : MEGAMOE_DTYPE_FP32;
                    const int64_t H = Hs[hi];
                    for (int64_t i = 0; i < H; i++) {
                        uint16_t e = kind == 4 ? 0 : rand_elem(MEGAMOE_DTYPE_BF16, kind == 5 ? 3 : kind);
                        x16[i] = t == MEGAMOE_DTYPE_FP16 ? megamoe_fp32_to_fp16(megamoe_bf16_to_fp32(e)) : e;
                        x32[i] = megamoe_bf16_to_fp32(e);
                    }
                    const void *x = t == MEGAMOE_DTYPE_FP32 ? (const void *)x32 : (const void *)x16;
                    float s0, s1;
                    mm_kernels_set_vector(0);
                    ASSERT_OK(mm_quant_rows_int8(MM_QROW_SYM127, x, t, 1, H, H, sm ? smooth : NULL, q0, H, &s0));
                    mm_kernels_set_vector(1);
                    ASSERT_OK(mm_quant_rows_int8(MM_QROW_SYM127, x, t, 1, H, H, sm ? smooth : NULL, q1, H, &s1));
                    ASSERT_TRUE(memcmp(q0, q1, (size_t)H) == 0);
                    ASSERT_TRUE(memcmp(&s0, &s1, 4) == 0);
                    for (int64_t i = 0; i < H; i++) ASSERT_TRUE(q0[i] >= -127);
                    if (kind == 4) { /* all-zero row */
                        ASSERT_TRUE(s0 == 0.0f);
                        for (int64_t i = 0; i < H; i++) ASSERT_EQ_INT(q0[i], 0);
                    }
                    rows++;
                }
    /* NaN row: scale NaN, q = 0; Inf row: scale Inf, q = 0 */
    for (int vec = 0; vec < 2; vec++) {
        float xs[4] = {1.0f, NAN, -2.0f, 3.0f}, s;
        int8_t q[4];
        mm_kernels_set_vector(vec);
        ASSERT_OK(mm_quant_rows_int8(MM_QROW_SYM127, xs, MEGAMOE_DTYPE_FP32, 1, 4, 4, NULL, q, 4, &s));
        ASSERT_TRUE(s != s);
        for (int i = 0; i < 4; i++) ASSERT_EQ_INT(q[i], 0);
        xs[1] = INFINITY;
        ASSERT_OK(mm_quant_rows_int8(MM_QROW_SYM127, xs, MEGAMOE_DTYPE_FP32, 1, 4, 4, NULL, q, 4, &s));
        ASSERT_TRUE(isinf(s));
        for (int i = 0; i < 4; i++) ASSERT_EQ_INT(q[i], 0);
    }
    mm_kernels_set_vector(1);
    fprintf(stderr, "  %d sym127 rows, vector == scalar\n", rows);
    free(x32), free(smooth), free(x16), free(q0), free(q1);
}

MM_TEST(rows_bad_arguments)
{
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    float x[4] = {0}, s[1];
    int8_t q[4];
    ASSERT_STATUS(mm_quant_rows_int8(MM_QROW_DISPATCH, x, MEGAMOE_DTYPE_FP32, 1, 4, 4, NULL, q, 4, s),
                  MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_quant_rows_int8((mm_qrow_rule_t)5, x, MEGAMOE_DTYPE_FP32, 1, 4, 4, NULL, q, 4, s),
                  MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_quant_rows_int8(MM_QROW_SYM127, x, MEGAMOE_DTYPE_FP32, 1, 4, 3, NULL, q, 4, s),
                  MEGAMOE_INVALID_ARGUMENT);
    ASSERT_OK(mm_quant_rows_int8(MM_QROW_SYM127, NULL, MEGAMOE_DTYPE_FP32, 0, 4, 4, NULL, NULL, 4, NULL));
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
}
