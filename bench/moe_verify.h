/* The one verification rule for MegaMoE results (`megamoe run`, the layer tests; docs/moe.md
 * "Accuracy and verification"). A tensor passes when every value is finite and
 *   1. every element is within rtol 2e-2 and atol 2e-3 * scale of the reference with bf16
 *      intermediates (include/megamoe/reference.h, bf16_intermediates = 1), scale =
 *      max(1, max |that reference|): the original's allclose bounds against a bf16
 *      implementation, with atol in units of the tensor's magnitude (gradient tensors reach
 *      |g| ~ 10, where a 1-ulp difference in one bf16 intermediate moves a cancelling sum by
 *      more than 2e-3);
 *   2. against the exact fp32 oracle, relative L2 error <= 1% and max |err| <= 2% of max |ref|
 *      (the original's rule for its fp32 oracle). Not binding with a SwiGLU clamp: its gradient
 *      jumps at the limit and bf16 rounding of GMM1's output moves values across it. */
#ifndef MM_BENCH_MOE_VERIFY_H
#define MM_BENCH_MOE_VERIFY_H

#include <stddef.h>

#define MM_VERIFY_RTOL 2e-2
#define MM_VERIFY_ATOL 2e-3
#define MM_VERIFY_REL_L2 1e-2
#define MM_VERIFY_REL_MAX 2e-2

typedef struct mm_verify {
    double rel_l2, rel_max;  /* against the fp32 oracle */
    double elementwise;      /* share within rtol, atol * scale of the bf16-intermediate ref */
    double elementwise_abs;  /* share within rtol and the literal atol */
    double scale;            /* max(1, max |bf16-intermediate ref|) */
    size_t worst;            /* element farthest outside (or closest to) rule 1's bound */
    double worst_got, worst_want;
    int finite, oracle_ok, pass;
} mm_verify_t;

/* got: n bf16 (got_bf16) or fp32 values; want: the fp32 oracle; want16: the reference with
 * bf16 intermediates; clamp: a SwiGLU clamp was active. */
void mm_verify(const void *got, int got_bf16, const float *want, const float *want16, size_t n,
               int clamp, mm_verify_t *v);

#endif /* MM_BENCH_MOE_VERIFY_H */
