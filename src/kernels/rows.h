/* Row kernels of the combine and reduce paths (ops/combine_v2.c, moe/moe_rows.c): fp32
 * accumulation of bf16 / fp16 / fp32 rows, scaling, dot products, the fixed 16-lane sum, the
 * non-finite scan.
 *
 * Every routine is exact in the sense of docs/ops.md "Numerics": each element is one IEEE
 * fp32 operation per step with its own rounding (no fused multiply-add: the library builds
 * with -ffp-contract=off, and the vector code uses separate mul and add), in a fixed order.
 * So the AVX-512 path and its portable C twin give the same bits; tests run both
 * (mm_kernels_set_vector(0) forces the twin, tests/kernels/test_rows.c compares). */
#ifndef MM_KERNELS_ROWS_H
#define MM_KERNELS_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/dtype.h"

/* acc[i] = fl(acc[i] + fl(f32(x[i]) * w)) for x bf16 or fp16 (x_type); w == 1 skips the
 * multiply (the same bits: fl(v * 1) == v). */
void mm_rows_axpy(megamoe_dtype_t x_type, float *acc, const void *x, float w, int64_t n);
/* acc[i] = fl(acc[i] + fl(v[i] * w)) for fp32 v (w == 1: a plain add, as above). */
void mm_rows_axpy_f32(float *acc, const float *v, float w, int64_t n);
/* dst[i] = bf16_RNE(fl(w * bf16(x[i]))). */
void mm_rows_scale(uint16_t *dst, const uint16_t *x, float w, size_t n);
/* sum_i a[i] * b[i] of bf16 rows in fp32, in the mm_rows_sum16 order of the products. */
float mm_rows_dot(const uint16_t *a, const uint16_t *b, size_t n);
/* The fixed 16-lane summation order used for dot products and sums of squares: lane l
 * accumulates v[l], v[l + 16], ... from 0; then lanes combine pairwise (l + 8, + 4, + 2, + 1). */
float mm_rows_sum16(const float *v, int64_t n);
/* Index of the first NaN or Inf among n bf16 (is_bf16) or fp32 values, or -1. */
int64_t mm_rows_first_nonfinite(const void *x, int is_bf16, size_t n);

#endif /* MM_KERNELS_ROWS_H */
