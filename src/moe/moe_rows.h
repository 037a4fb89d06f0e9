/* Row helpers for the source side of MegaMoE: the reduce of the K returned copies of a token.
 * The row kernels themselves (axpy, scale by router weights, router-weight dot products, the
 * non-finite scan; AVX-512 with portable twins giving the same bits) are kernels/rows.h. */
#ifndef MM_MOE_ROWS_H
#define MM_MOE_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/rows.h"

/* The source-side reduce of tokens [t0, t1): out[t] = bf16(sum_k w[t*K+k] * ret[slot_pos[t*K+k]])
 * in fp32, k ascending (w NULL: weight 1, a plain sum). acc is [H] fp32 scratch. With ysave,
 * each returned row is also copied to ysave at its position while it is in cache. The one
 * order every schedule uses, so O0 and O1 give identical bits. */
void mm_rows_reduce_tokens(uint16_t *out, const uint16_t *ret, const int32_t *slot_pos,
                           const float *w, uint16_t *ysave, float *acc, int64_t H, int64_t K,
                           int64_t t0, int64_t t1);

#endif /* MM_MOE_ROWS_H */
