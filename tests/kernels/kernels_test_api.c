/* Test-only shared library for the kernels pytest files (tests/kernels/_kernels_lib.py).
 *
 * libmegamoe.so exports only the public megamoe_* API, so the internal kernel entry points the
 * numpy comparisons call are re-exported here under mmt_* names, from a static copy of the
 * kernels layer. Linked with -Bsymbolic: mmt_last_error reads this copy's error buffer even
 * when libmegamoe.so is loaded into the same process. */
#include <stdlib.h>

#include "kernels/qgemm.h"
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

MMT_EXPORT megamoe_status_t mmt_quant_rows_int8(int rule, const void *x, megamoe_dtype_t x_type,
                                                int64_t rows, int64_t h, int64_t ldx,
                                                const float *smooth, int8_t *q, int64_t ldq,
                                                float *scales)
{
    return mm_quant_rows_int8((mm_qrow_rule_t)rule, x, x_type, rows, h, ldx, smooth, q, ldq, scales);
}

/* One grouped quantised product for the numpy comparisons: E experts whose sources (one layout)
 * sit src_stride bytes apart, per-expert parameters stacked ([E][G][N] scales / offsets,
 * [E][N] biases; NULL = absent). Packs, computes, frees. */
MMT_EXPORT megamoe_status_t mmt_qgemm_grouped(int type, int layout, int64_t K, int64_t N,
                                              int64_t group_size, const void *src, int64_t ld,
                                              int64_t src_stride, int E, const int64_t *group_rows,
                                              megamoe_dtype_t a_type, const void *A,
                                              const int32_t *a_index, int64_t a_num_rows,
                                              const float *x_scale, const float *w_scale,
                                              const float *w_offset, const float *bias_pre,
                                              const float *bias_post, const int32_t *bias_i32,
                                              void *C, megamoe_dtype_t c_type)
{
    mm_qweight_t **w = calloc((size_t)E, sizeof *w);
    mm_qgemm_expert_t *ex = calloc((size_t)E, sizeof *ex);
    megamoe_status_t st = w && ex ? MEGAMOE_OK : MEGAMOE_OUT_OF_MEMORY;
    const int64_t G = group_size ? (K + group_size - 1) / group_size : 1;
    for (int e = 0; e < E && st == MEGAMOE_OK; e++) {
        mm_qweight_src_t s = {(mm_qw_type_t)type, (mm_qw_layout_t)layout, K, N,
                              (const char *)src + e * src_stride, ld, group_size};
        st = mm_qweight_create(&s, 1, &w[e]);
        ex[e].weight = w[e];
        ex[e].ld_scale = N;
        ex[e].w_scale = w_scale ? w_scale + e * G * N : NULL;
        ex[e].w_offset = w_offset ? w_offset + e * G * N : NULL;
        ex[e].bias_pre = bias_pre ? bias_pre + e * N : NULL;
        ex[e].bias_post = bias_post ? bias_post + e * N : NULL;
        ex[e].bias_i32 = bias_i32 ? bias_i32 + e * N : NULL;
    }
    if (st == MEGAMOE_OK) {
        mm_qgemm_args_t a;
        mm_qgemm_args_init(&a);
        a.num_groups = E;
        a.group_rows = group_rows;
        a.experts = ex;
        a.K = K, a.N = N;
        a.a_type = a_type;
        a.A = A, a.lda = K;
        a.a_index = a_index, a.a_num_rows = a_num_rows;
        a.x_scale = x_scale;
        a.C = C, a.ldc = N, a.c_type = c_type;
        st = mm_qgemm(&a);
    }
    for (int e = 0; w && e < E; e++) mm_qweight_destroy(w[e]);
    free(w), free(ex);
    return st;
}

MMT_EXPORT int mmt_kernels_set_vector(int enabled)
{
    return mm_kernels_set_vector(enabled);
}

MMT_EXPORT const char *mmt_last_error(void)
{
    return megamoe_last_error();
}
