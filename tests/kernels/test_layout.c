/* Layout helpers: every element lands where include/megamoe/layout.h says, the round trips
 * are the identity (bf16, fp16, fp32; odd sizes), and bad arguments are refused. */
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
