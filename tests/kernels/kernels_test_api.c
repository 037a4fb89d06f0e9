/* Test-only shared library for the kernels pytest files (tests/kernels/_kernels_lib.py).
 *
 * libmegamoe.so exports only the public megamoe_* API, so the internal kernel entry points the
 * numpy comparisons call are re-exported here under mmt_* names, from a static copy of the
 * kernels layer. Linked with -Bsymbolic: mmt_last_error reads this copy's error buffer even
 * when libmegamoe.so is loaded into the same process. */
#include "kernels/quant.h"
#include "kernels/simd.h"
#include "kernels/swiglu.h"
#include "megamoe/status.h"

#define MMT_EXPORT __attribute__((visibility("default")))

MMT_EXPORT megamoe_status_t mmt_swiglu_fwd(int64_t rows, int64_t inter, const uint16_t *h,
                                           int64_t ldh, uint16_t *a, int64_t lda, float limit)
{
    return mm_swiglu_fwd(rows, inter, h, ldh, a, lda, limit);
}

MMT_EXPORT megamoe_status_t mmt_swiglu_bwd(int64_t rows, int64_t inter, const uint16_t *h,
                                           int64_t ldh, const uint16_t *da, int64_t ldda,
                                           uint16_t *dh, int64_t lddh, float limit)
{
    return mm_swiglu_bwd(rows, inter, h, ldh, da, ldda, dh, lddh, limit);
}

MMT_EXPORT megamoe_status_t mmt_quant_static_int8(const void *x, megamoe_dtype_t x_type, int64_t h,
                                                  const float *scales, int64_t scales_len,
                                                  int8_t *q)
{
    return mm_quant_static_int8(x, x_type, h, scales, scales_len, q);
}

MMT_EXPORT megamoe_status_t mmt_quant_dynamic_token(const void *x, megamoe_dtype_t x_type,
                                                    int64_t h, const float *smooth,
                                                    megamoe_dtype_t q_type, void *q,
                                                    float *scale_p)
{
    return mm_quant_dynamic_token(x, x_type, h, smooth, q_type, q, scale_p);
}

MMT_EXPORT megamoe_status_t mmt_quant_dynamic_group(const void *x, megamoe_dtype_t x_type,
                                                    int64_t h, const float *smooth,
                                                    megamoe_dtype_t q_type, uint8_t *q,
                                                    float *scales)
{
    return mm_quant_dynamic_group(x, x_type, h, smooth, q_type, q, scales);
}

MMT_EXPORT megamoe_status_t mmt_quant_mx(const void *x, megamoe_dtype_t x_type, int64_t h,
                                         megamoe_dtype_t q_type, uint8_t *q, uint8_t *scales)
{
    return mm_quant_mx(x, x_type, h, q_type, q, scales);
}

MMT_EXPORT megamoe_status_t mmt_comm_quant_int8(const void *y, megamoe_dtype_t y_type, int64_t h,
                                                int8_t *q, void *scales)
{
    return mm_comm_quant_int8(y, y_type, h, q, scales);
}

MMT_EXPORT megamoe_status_t mmt_comm_dequant_int8(const int8_t *q, const void *scales,
                                                  megamoe_dtype_t y_type, int64_t h, void *y)
{
    return mm_comm_dequant_int8(q, scales, y_type, h, y);
}

MMT_EXPORT int mmt_kernels_set_vector(int enabled)
{
    return mm_kernels_set_vector(enabled);
}

MMT_EXPORT const char *mmt_last_error(void)
{
    return megamoe_last_error();
}
