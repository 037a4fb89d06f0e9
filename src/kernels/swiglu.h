/* SwiGLU between GMM1 and GMM2, forward and backward, on bf16 rows with fp32 math.
 *
 * h is the GMM1 output [rows, 2I] (row stride ldh): gate g = h[:, 0:I], up u = h[:, I:2I].
 * Clamp (the gpt-oss / DeepSeek swiglu_limit rule), active when limit L is finite and > 0;
 * limit <= 0, NaN or +inf turns it off:
 *     gc = min(g, L)            (upper bound only; NaN stays NaN)
 *     uc = clamp(u, -L, L)
 * Forward:   a = bf16_RNE( silu(gc) * uc ),  silu(x) = x * sigmoid(x) = x / (1 + exp(-x)).
 * Backward (da [rows, I] bf16) writes dh = [dg | du] [rows, 2I] bf16:
 *     dg = da * uc * silu'(gc) * [g <= L],   silu'(x) = s * (1 + x * (1 - s)), s = sigmoid(x)
 *     du = da * silu(gc) * [-L <= u <= L]
 * The masks follow torch.clamp's gradient (it passes at the bounds; NaN gets none) and are all
 * ones when the clamp is off. Every value is computed in fp32 and rounded once to bf16.
 * Vectorised with AVX-512 (own exp, within 2 fp32 ulps of expf) with a scalar twin (libm expf);
 * the two may differ by one bf16 ulp on rare ties. Row strides are free (>= the row). */
#ifndef MM_KERNELS_SWIGLU_H
#define MM_KERNELS_SWIGLU_H

#include <stdint.h>

#include "megamoe/status.h"

megamoe_status_t mm_swiglu_fwd(int64_t rows, int64_t inter, const uint16_t *h, int64_t ldh,
                               uint16_t *a, int64_t lda, float limit);
megamoe_status_t mm_swiglu_bwd(int64_t rows, int64_t inter, const uint16_t *h, int64_t ldh,
                               const uint16_t *da, int64_t ldda, uint16_t *dh, int64_t lddh,
                               float limit);

#endif /* MM_KERNELS_SWIGLU_H */
