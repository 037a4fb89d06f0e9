/* bench convert: fp32 <-> bf16 bulk conversion throughput (scalar reference vs vectorised). */
#include <stdlib.h>

#include "megamoe/megamoe.h"

#include "bench_util.h"

typedef struct {
    float *f32;
    uint16_t *b16;
    size_t n;
    int to_bf16;
    int scalar;
} mm_convert_case_t;

static void mm_convert_run(void *arg)
{
    mm_convert_case_t *c = arg;
    if (c->scalar) {
        if (c->to_bf16)
            for (size_t i = 0; i < c->n; i++) c->b16[i] = megamoe_fp32_to_bf16(c->f32[i]);
        else
            for (size_t i = 0; i < c->n; i++) c->f32[i] = megamoe_bf16_to_fp32(c->b16[i]);
    } else if (c->to_bf16) {
        megamoe_convert(c->b16, MEGAMOE_DTYPE_BF16, c->f32, MEGAMOE_DTYPE_FP32, c->n);
    } else {
        megamoe_convert(c->f32, MEGAMOE_DTYPE_FP32, c->b16, MEGAMOE_DTYPE_BF16, c->n);
    }
}

static int mm_bench_convert_main(int argc, char **argv)
{
    size_t n = (size_t)atol(mm_bench_opt(argc, argv, "--elements", "4194304"));
    mm_convert_case_t c = {malloc(n * 4), malloc(n * 2), n, 0, 0};
    if (!c.f32 || !c.b16) return 1;
    for (size_t i = 0; i < n; i++) c.f32[i] = (float)(i % 1000) * 0.001f - 0.5f;
    mm_bench_begin("convert");
    int step = 0;
    for (int dir = 0; dir < 2; dir++)
        for (int scalar = 0; scalar < 2; scalar++) {
            c.to_bf16 = dir == 0;
            c.scalar = scalar;
            mm_bench_progress(++step, 4, c.to_bf16 ? "fp32->bf16" : "bf16->fp32");
            double s = mm_bench_median(mm_convert_run, &c, 5, 0.2);
            mm_bench_row();
            mm_bench_str("op", c.to_bf16 ? "fp32_to_bf16" : "bf16_to_fp32");
            mm_bench_str("impl", scalar ? "scalar" : "vector");
            mm_bench_int("elements", (long long)n);
            mm_bench_num("GBps", (double)n * 6.0 / s * 1e-9);
        }
    mm_bench_end();
    free(c.f32);
    free(c.b16);
    return 0;
}

const mm_bench_def_t mm_bench_convert_def = {"convert", "fp32<->bf16 conversion throughput",
                                             mm_bench_convert_main};
