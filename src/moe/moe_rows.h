/* Row helpers for the source side of MegaMoE (reduce the K returned copies of a token, scale
 * grad rows by router weights, router-weight gradients). bf16 data, fp32 arithmetic; AVX-512
 * when the CPU has it, plain C otherwise (same results: every step is an fp32 operation in the
 * same order, so both paths give identical bits). */
#ifndef MM_MOE_ROWS_H
#define MM_MOE_ROWS_H

#include <stddef.h>
#include <stdint.h>

/* acc[i] += w * bf16(x[i]) (fp32; w = 1 skips the multiply, so it is exact like a plain sum). */
void mm_rows_axpy(float *acc, const uint16_t *x, float w, size_t n);
/* dst[i] = bf16(w * bf16(x[i])) (round to nearest even). */
void mm_rows_scale(uint16_t *dst, const uint16_t *x, float w, size_t n);
/* sum_i a[i] * b[i] in fp32 (16 interleaved partial sums, then a fixed tree). */
float mm_rows_dot(const uint16_t *a, const uint16_t *b, size_t n);

#endif /* MM_MOE_ROWS_H */
