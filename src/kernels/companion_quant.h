/* Row helpers of the companion operators that produce quantised or rounded rows from fp32
 * values: the per-token dynamic int8 rule of npu_dynamic_quant (docs/ops.md "Companion
 * operators", spec §1) and fp32 -> bf16/fp16/fp32 row stores. */
#ifndef MM_KERNELS_COMPANION_QUANT_H
#define MM_KERNELS_COMPANION_QUANT_H

#include <stdint.h>

#include "megamoe/dtype.h"

/* Per-token symmetric int8 of an fp32 row, the npu_dynamic_quant rule: s = max|v| / 127 (fp32),
 * q[i] = round half away from zero of v[i] / s, clamped to [-127, 127] (NaN gives 0); an
 * all-zero row gives s = 0 and q = 0. Returns s. It is the kernels' MM_QROW_SYM127 quantiser
 * (quant.h); qmax = 7 gives its int4 twin ([-7, 7]). */
float mm_cx_quant_row_f32(const float *v, int64_t n, int8_t *q, float qmax);

/* dst[0:n] = round(v[0:n]) to dst_type (bf16 / fp16 RNE, fp32 copy). */
void mm_cx_store_row(void *dst, megamoe_dtype_t dst_type, const float *v, int64_t n);
/* v[0:n] = f32(src[0:n]) for src bf16 / fp16 / fp32 / int8 / int32. */
void mm_cx_load_row(float *v, const void *src, megamoe_dtype_t src_type, int64_t n);

#endif /* MM_KERNELS_COMPANION_QUANT_H */
