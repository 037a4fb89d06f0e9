/* Layout helpers: every element lands where include/megamoe/layout.h says, the round trips
 * are the identity (bf16, fp16, fp32; odd sizes), and bad arguments are refused. */
#include <math.h>
#include <stdlib.h>

#include "harness/harness.h"
#include "megamoe/layout.h"
#include "megamoe/log.h"

static void fill(void *p, size_t n, size_t es, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)(i * 2654435761u) ^ seed;
        if (es == 2) ((uint16_t *)p)[i] = (uint16_t)v;
        else ((uint32_t *)p)[i] = v;
    }
}

static uint32_t at(const void *p, size_t i, size_t es)
{
    return es == 2 ? ((const uint16_t *)p)[i] : ((const uint32_t *)p)[i];
}

MM_TEST(gate_up_and_down_follow_the_seed_rule_and_round_trip)
{
    static const megamoe_dtype_t types[] = {MEGAMOE_DTYPE_BF16, MEGAMOE_DTYPE_FP16, MEGAMOE_DTYPE_FP32};
    static const int64_t sizes[][3] = {{3, 37, 19}, {1, 1, 1}, {2, 64, 33}, {4, 5, 70}};
    for (int ti = 0; ti < 3; ti++)
        for (int si = 0; si < 4; si++) {
            size_t es = megamoe_dtype_size(types[ti]);
            int64_t E = sizes[si][0], H = sizes[si][1], I = sizes[si][2];
            size_t n = (size_t)(E * H * I);
            void *gate = malloc(n * es), *up = malloc(n * es), *down = malloc(n * es);
            void *gu = malloc(2 * n * es), *dw = malloc(n * es);
            void *g2 = malloc(n * es), *u2 = malloc(n * es), *d2 = malloc(n * es);
            fill(gate, n, es, 1), fill(up, n, es, 2), fill(down, n, es, 3);
            ASSERT_OK(megamoe_layout_gate_up_from_linear(gu, gate, up, types[ti], E, H, I));
            ASSERT_OK(megamoe_layout_down_from_linear(dw, down, types[ti], E, H, I));
            for (int64_t e = 0; e < E; e++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t i = 0; i < I; i++) {
                        size_t lin = (size_t)((e * I + i) * H + h); /* gate[e][i][h] */
                        ASSERT_EQ_U64(at(gu, (size_t)((e * H + h) * 2 * I + i), es), at(gate, lin, es));
                        ASSERT_EQ_U64(at(gu, (size_t)((e * H + h) * 2 * I + I + i), es), at(up, lin, es));
                        /* down[e][h][i] -> down_weight[e][i][h] */
                        ASSERT_EQ_U64(at(dw, (size_t)((e * I + i) * H + h), es),
                                      at(down, (size_t)((e * H + h) * I + i), es));
                    }
            ASSERT_OK(megamoe_layout_gate_up_to_linear(g2, u2, gu, types[ti], E, H, I));
            ASSERT_OK(megamoe_layout_down_to_linear(d2, dw, types[ti], E, H, I));
            ASSERT_TRUE(memcmp(g2, gate, n * es) == 0);
            ASSERT_TRUE(memcmp(u2, up, n * es) == 0);
            ASSERT_TRUE(memcmp(d2, down, n * es) == 0);
            free(gate), free(up), free(down), free(gu), free(dw), free(g2), free(u2), free(d2);
        }
}

MM_TEST(bad_arguments_are_refused)
{
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    uint16_t a[64], b[64], c[128];
    ASSERT_STATUS(megamoe_layout_down_from_linear(a, b, MEGAMOE_DTYPE_INT8, 1, 4, 4), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(megamoe_layout_down_from_linear(a, a + 4, MEGAMOE_DTYPE_BF16, 1, 4, 4), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(megamoe_layout_gate_up_from_linear(c, a, NULL, MEGAMOE_DTYPE_BF16, 1, 4, 4), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(megamoe_layout_gate_up_to_linear(a, a + 8, c, MEGAMOE_DTYPE_BF16, 1, 4, 4), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(megamoe_layout_gate_up_from_linear(c, a, b, MEGAMOE_DTYPE_BF16, -1, 4, 4), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_OK(megamoe_layout_gate_up_from_linear(c, a, b, MEGAMOE_DTYPE_BF16, 0, 4, 4));
    ASSERT_OK(megamoe_layout_down_to_linear(NULL, NULL, MEGAMOE_DTYPE_FP32, 2, 0, 4));
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
}

/* ---- quantised weights ------------------------------------------------------------------- */

MM_TEST(int4_packing_is_twos_complement_low_nibble_first)
{
    const int8_t v[2][5] = {{1, -1, 7, -8, 3}, {0, 5, -3, 2, -7}};
    uint8_t p[2][3];
    ASSERT_OK(megamoe_int4_pack(&v[0][0], 2, 5, &p[0][0]));
    ASSERT_EQ_INT(p[0][0], 0xF1);
    ASSERT_EQ_INT(p[0][1], 0x87);
    ASSERT_EQ_INT(p[0][2], 0x03); /* odd column count: high nibble of the last byte is 0 */
    ASSERT_EQ_INT(p[1][0], 0x50);
    int8_t back[2][5];
    ASSERT_OK(megamoe_int4_unpack(&p[0][0], 2, 5, &back[0][0]));
    ASSERT_TRUE(memcmp(back, v, sizeof v) == 0);
    /* the int32 carrier is the same bytes: value 8m + i in bits 4i..4i+3 (little endian) */
    int8_t w8[8] = {1, 2, 3, 4, -1, -2, -3, -4};
    uint32_t carrier;
    ASSERT_OK(megamoe_int4_pack(w8, 1, 8, (uint8_t *)&carrier));
    for (int i = 0; i < 8; i++) ASSERT_EQ_INT((int)((carrier >> (4 * i)) & 15), w8[i] & 15);
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    const int8_t bad[2] = {8, 0};
    ASSERT_STATUS(megamoe_int4_pack(bad, 1, 2, &p[0][0]), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "outside [-8, 7]");
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
}

MM_TEST(weight_quantisation_per_channel_and_per_group)
{
    /* K = 10, N = 3, groups of 8 (the last one short) */
    enum { K = 10, N = 3 };
    float w[K * N];
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) w[k * N + n] = (float)((k * 7 + n * 3) % 11 - 5) * 0.1f * (float)(n + 1);
    w[4 * N + 1] = 0; /* column 2 of group 1 becomes all zero below */
    for (int k = 8; k < K; k++) w[k * N + 2] = 0;
    int8_t q[K * N];
    float s[2 * N];
    ASSERT_EQ_INT(megamoe_quant_groups(K, 0), 1);
    ASSERT_EQ_INT(megamoe_quant_groups(K, 8), 2);
    ASSERT_OK(megamoe_quant_weight_int8(w, MEGAMOE_DTYPE_FP32, K, N, 8, q, s));
    for (int g = 0; g < 2; g++)
        for (int n = 0; n < N; n++) {
            float m = 0;
            for (int k = 8 * g; k < K && k < 8 * g + 8; k++) m = fmaxf(m, fabsf(w[k * N + n]));
            ASSERT_TRUE(s[g * N + n] == m / 127.0f);
            for (int k = 8 * g; k < K && k < 8 * g + 8; k++) {
                if (m == 0) {
                    ASSERT_EQ_INT(q[k * N + n], 0);
                    continue;
                }
                ASSERT_TRUE(q[k * N + n] >= -127 && q[k * N + n] <= 127);
                /* the nearest integer to w / s */
                ASSERT_TRUE(fabsf((float)q[k * N + n] - w[k * N + n] / s[g * N + n]) <= 0.5f);
            }
        }
    uint8_t p[K * 2];
    float s4[N];
    ASSERT_OK(megamoe_quant_weight_int4(w, MEGAMOE_DTYPE_FP32, K, N, 0, p, s4));
    int8_t v[K * N];
    ASSERT_OK(megamoe_int4_unpack(p, K, N, v));
    for (int n = 0; n < N; n++) {
        float m = 0;
        for (int k = 0; k < K; k++) m = fmaxf(m, fabsf(w[k * N + n]));
        ASSERT_TRUE(s4[n] == m / 7.0f);
        for (int k = 0; k < K; k++) ASSERT_TRUE(fabsf((float)v[k * N + n] - w[k * N + n] / s4[n]) <= 0.5f);
    }
    /* the canonical A8W4 bias makes the correction vanish */
    float bias[N], pre[N];
    for (int n = 0; n < N; n++) {
        double c = 0;
        for (int k = 0; k < K; k++) c += v[k * N + n] * (double)s4[n];
        bias[n] = (float)(8.0 * c);
    }
    ASSERT_OK(megamoe_quant_w4a8_bias_pre(p, K, N, s4, 0, bias, pre));
    for (int n = 0; n < N; n++) ASSERT_NEAR(pre[n], 0.0, 1e-6 * (fabs(bias[n]) + 1));
    ASSERT_OK(megamoe_quant_w4a8_bias_pre(p, K, N, s4, 0, NULL, pre));
    for (int n = 0; n < N; n++) ASSERT_NEAR(pre[n], -bias[n], 1e-6 * (fabs(bias[n]) + 1));
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    ASSERT_STATUS(megamoe_quant_weight_int8(w, MEGAMOE_DTYPE_FP32, K, N, 12, q, s), MEGAMOE_INVALID_ARGUMENT);
    w[5] = NAN;
    ASSERT_STATUS(megamoe_quant_weight_int8(w, MEGAMOE_DTYPE_FP32, K, N, 0, q, s), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "[1][2] is not finite");
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
}
