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

/* Index of the first NaN or Inf among n bf16 (exponent all ones) or fp32 values, or -1. */
int64_t mm_rows_first_nonfinite(const void *x, int is_bf16, size_t n);

/* The source-side reduce of tokens [t0, t1): out[t] = bf16(sum_k w[t*K+k] * ret[slot_pos[t*K+k]])
 * in fp32, k ascending (w NULL: weight 1, a plain sum). acc is [H] fp32 scratch. With ysave,
 * each returned row is also copied to ysave at its position while it is in cache. The one
 * order every schedule uses, so O0 and O1 give identical bits. */
void mm_rows_reduce_tokens(uint16_t *out, const uint16_t *ret, const int32_t *slot_pos,
                           const float *w, uint16_t *ysave, float *acc, int64_t H, int64_t K,
                           int64_t t0, int64_t t1);

#endif /* MM_MOE_ROWS_H */
