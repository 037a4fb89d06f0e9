/* Exact element-wise helpers of the combine side (docs/ops.md, "Numerics"): copies, widening
 * and narrowing, the TP add. The vectorised row kernels (axpy, sums) are kernels/rows.h. */
#include <math.h>
#include <string.h>

#include "shmem/shmem.h"
#include "v2_internal.h"

void mm_v2_copy(void *dst, const void *src, size_t n, int stream)
{
    if (stream && n >= 1024) mm_shmem_copy_streaming(dst, src, n);
    else memcpy(dst, src, n);
}

void mm_v2_widen(megamoe_dtype_t t, const void *src, float *dst, int64_t n)
{
    megamoe_convert(dst, MEGAMOE_DTYPE_FP32, src, t, (size_t)n);
}

void mm_v2_narrow(megamoe_dtype_t t, const float *src, void *dst, int64_t n)
{
    megamoe_convert(dst, t, src, MEGAMOE_DTYPE_FP32, (size_t)n);
}

/* fp32 value that rounds to the same fp16 as the exact double s (round to odd: fp32 keeps
 * more than two extra bits, so no double rounding). */
static float mm_round_to_odd(double s)
{
    float f = (float)s;
    if ((double)f == s || isnan(s) || isinf(f)) return f;
    uint32_t u;
    memcpy(&u, &f, 4);
    if (fabs((double)f) > fabs(s)) u -= 1; /* toward zero */
    u |= 1u;
    memcpy(&f, &u, 4);
    return f;
}

void mm_v2_tp_add(megamoe_dtype_t t, const void *a, const void *b, void *out, int64_t n)
{
    const uint16_t *x = a, *y = b;
    uint16_t *o = out;
    if (t == MEGAMOE_DTYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            float s = megamoe_bf16_to_fp32(x[i]) + megamoe_bf16_to_fp32(y[i]);
            o[i] = megamoe_fp32_to_bf16(s);
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            double s = (double)megamoe_fp16_to_fp32(x[i]) + (double)megamoe_fp16_to_fp32(y[i]);
            o[i] = megamoe_fp32_to_fp16(mm_round_to_odd(s));
        }
    }
}
