/* Quantised expert weights (include/megamoe/layout.h): symmetric int8 / int4 quantisation with
 * per-channel or per-group scales, int4 packing, and the A8W4 bias correction. Plain C: these
 * run once per weight, not per call. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "megamoe/layout.h"

static inline float mm_lq_ld(const void *w, megamoe_dtype_t t, int64_t i)
{
    if (t == MEGAMOE_DTYPE_FP32) return ((const float *)w)[i];
    uint16_t b = ((const uint16_t *)w)[i];
    return t == MEGAMOE_DTYPE_BF16 ? megamoe_bf16_to_fp32(b) : megamoe_fp16_to_fp32(b);
}

static megamoe_status_t mm_lq_check(const char *fn, const void *w, megamoe_dtype_t t, int64_t K,
                                    int64_t N, int64_t gs, const void *q, const float *scales)
{
    if (t != MEGAMOE_DTYPE_FP32 && t != MEGAMOE_DTYPE_BF16 && t != MEGAMOE_DTYPE_FP16)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: dtype %s; use fp32, bf16 or fp16", fn,
                        megamoe_dtype_name(t));
    if (K < 0 || N < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: negative size K=%lld N=%lld", fn,
                        (long long)K, (long long)N);
    if (gs < 0 || gs % 8 != 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: group_size %lld (0 = per output channel, else a multiple of 8)", fn,
                        (long long)gs);
    if (K > 0 && N > 0 && (w == NULL || q == NULL || scales == NULL))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: NULL buffer", fn);
    for (int64_t i = 0; i < K * N; i++) {
        float v = mm_lq_ld(w, t, i);
        if (!isfinite(v))
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: weight [%lld][%lld] is not finite (%g)",
                            fn, (long long)(i / N), (long long)(i % N), (double)v);
    }
    return MEGAMOE_OK;
}

int64_t megamoe_quant_groups(int64_t K, int64_t group_size)
{
    if (K <= 0) return 0;
    return group_size > 0 ? (K + group_size - 1) / group_size : 1;
}

/* q[k][n] (one value per element, int8 storage) and the scales, qmax 127 or 7. */
static void mm_lq_quant(const void *w, megamoe_dtype_t t, int64_t K, int64_t N, int64_t gs,
                        float qmax, int8_t *q, float *scales)
{
    const int64_t G = megamoe_quant_groups(K, gs), g_len = gs > 0 ? gs : K;
    for (int64_t g = 0; g < G; g++) {
        const int64_t k0 = g * g_len, k1 = k0 + g_len < K ? k0 + g_len : K;
        for (int64_t n = 0; n < N; n++) {
            float m = 0.0f;
            for (int64_t k = k0; k < k1; k++) {
                float a = fabsf(mm_lq_ld(w, t, k * N + n));
                if (a > m) m = a;
            }
            const float s = m / qmax;
            scales[g * N + n] = s;
            for (int64_t k = k0; k < k1; k++) {
                float r = s == 0.0f ? 0.0f : nearbyintf(mm_lq_ld(w, t, k * N + n) / s);
                q[k * N + n] = (int8_t)(r > qmax ? qmax : r < -qmax ? -qmax : r);
            }
        }
    }
}

megamoe_status_t megamoe_quant_weight_int8(const void *w, megamoe_dtype_t dtype, int64_t K,
                                           int64_t N, int64_t group_size, int8_t *q,
                                           float *scales)
{
    MM_CHECK(mm_lq_check("megamoe_quant_weight_int8", w, dtype, K, N, group_size, q, scales));
    mm_lq_quant(w, dtype, K, N, group_size, 127.0f, q, scales);
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_int4_pack(const int8_t *values, int64_t rows, int64_t cols,
                                   uint8_t *packed)
{
    if (rows < 0 || cols < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_int4_pack: negative size %lld x %lld",
                        (long long)rows, (long long)cols);
    if (rows * cols > 0 && (values == NULL || packed == NULL))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_int4_pack: NULL buffer");
    const int64_t pc = (cols + 1) / 2;
    for (int64_t i = 0; i < rows * cols; i++)
        if (values[i] < -8 || values[i] > 7)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "megamoe_int4_pack: value [%lld][%lld] = %d outside [-8, 7]",
                            (long long)(i / cols), (long long)(i % cols), values[i]);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < pc; j++) {
            const int lo = values[r * cols + 2 * j];
            const int hi = 2 * j + 1 < cols ? values[r * cols + 2 * j + 1] : 0;
            packed[r * pc + j] = (uint8_t)((lo & 15) | ((hi & 15) << 4));
        }
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_int4_unpack(const uint8_t *packed, int64_t rows, int64_t cols,
                                     int8_t *values)
{
    if (rows < 0 || cols < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_int4_unpack: negative size %lld x %lld",
                        (long long)rows, (long long)cols);
    if (rows * cols > 0 && (values == NULL || packed == NULL))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_int4_unpack: NULL buffer");
    const int64_t pc = (cols + 1) / 2;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const uint8_t b = packed[r * pc + c / 2];
            const int v = (c & 1) ? b >> 4 : b & 15;
            values[r * cols + c] = (int8_t)(v >= 8 ? v - 16 : v);
        }
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_quant_weight_int4(const void *w, megamoe_dtype_t dtype, int64_t K,
                                           int64_t N, int64_t group_size, uint8_t *packed,
                                           float *scales)
{
    MM_CHECK(mm_lq_check("megamoe_quant_weight_int4", w, dtype, K, N, group_size, packed, scales));
    if (K == 0 || N == 0) return MEGAMOE_OK;
    int8_t *q = malloc((size_t)(K * N));
    if (q == NULL)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "megamoe_quant_weight_int4: %lld bytes",
                        (long long)(K * N));
    mm_lq_quant(w, dtype, K, N, group_size, 7.0f, q, scales);
    megamoe_status_t st = megamoe_int4_pack(q, K, N, packed);
    free(q);
    return st;
}

megamoe_status_t megamoe_quant_w4a8_bias_pre(const uint8_t *packed, int64_t K, int64_t N,
                                             const float *scales, int64_t group_size,
                                             const float *bias, float *bias_pre)
{
    const char *fn = "megamoe_quant_w4a8_bias_pre";
    if (K < 0 || N < 0 || group_size < 0 || group_size % 8 != 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: K=%lld N=%lld group_size %lld", fn,
                        (long long)K, (long long)N, (long long)group_size);
    if (N > 0 && (bias_pre == NULL || (K > 0 && (packed == NULL || scales == NULL))))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: NULL buffer", fn);
    const int64_t pc = (N + 1) / 2, g_len = group_size > 0 ? group_size : (K > 0 ? K : 1);
    /* row by row (the weight's order in memory), one running sum per column, k ascending */
    double *s = calloc((size_t)N + 1, sizeof *s);
    if (s == NULL)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: %lld column sums", fn, (long long)N);
    for (int64_t k = 0; k < K; k++) {
        const uint8_t *row = packed + k * pc;
        const float *sc = scales + (k / g_len) * N;
        for (int64_t n = 0; n < N; n++) {
            const int v = (n & 1) ? row[n / 2] >> 4 : row[n / 2] & 15;
            s[n] += (double)(v >= 8 ? v - 16 : v) * sc[n];
        }
    }
    for (int64_t n = 0; n < N; n++)
        bias_pre[n] = (float)((bias ? (double)bias[n] : 0.0) - 8.0 * s[n]);
    free(s);
    return MEGAMOE_OK;
}
