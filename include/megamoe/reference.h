/* megamoe — the plain fp32 reference model of the MegaMoE math (the oracle for every test).
 *
 * EP simulated ranks live in one process, each with T tokens. Token tensors are rank-major:
 * rows r*T .. r*T+T-1 belong to rank r (N = EP*T rows in all). Weights are the GLOBAL tensors;
 * expert e lives on rank e / (E/EP) in local slot e % (E/EP), so rank r's local
 * gate_up_weight [E/EP, H, 2I] is rows r*E/EP .. (r+1)*E/EP-1 of the global one (same for
 * down_weight). The math does not depend on EP; EP only fixes that layout and is validated.
 *
 * Forward, per token t and choice k with e = topk_ids[t,k] (a global expert id):
 *     h = x_t · gate_up[e]                      [2I]   (first I columns gate, last I up)
 *     g = h[:I], u = h[I:]
 *     if swiglu_limit > 0:  g = min(g, limit), u = clamp(u, -limit, limit)
 *     a = silu(g) * u                           [I]    silu(g) = g / (1 + exp(-g))
 *     y = a · down[e]                           [H]
 *     out[t] = sum_k topk_weights[t,k] * y[t,k]
 * Backward is the exact gradient of that: grads of hidden_states, topk_weights, gate_up_weight
 * and down_weight. A clamped value has derivative 0 (strictly outside the limit; at the limit
 * itself the gradient passes, as torch.clamp does). Experts that receive no token get exact
 * zero weight grads. The same expert may appear twice in a row of topk_ids (both count).
 * The reference is lossless: there is no capacity and no overflow.
 *
 * Precision: bf16 inputs are widened exactly to fp32; all products and sums are done in fp64
 * and each result is rounded once to fp32, so the outputs are the fp32 roundings of the exact
 * math on the given inputs up to fp64 accumulation error (far below one fp32 ulp in practice).
 * Kernels (fp32/bf16 accumulation) are compared against it with tolerances of their own.
 *
 * bf16_intermediates = 1 gives the same math with every intermediate tensor rounded to bf16
 * (round to nearest even) where a bf16 training implementation stores it: h (GMM1 output,
 * rounded before the clamp and SwiGLU), a, y (each expert output row), and in the backward
 * dy = w * grad_out, da, dh = [dg | du] and each expert's dx row before the sum over k; the
 * router-weight gradient uses the rounded y. Products and sums stay fp64. This is the
 * comparison the original's tests make against a bf16 implementation (elementwise rtol 2e-2,
 * atol 2e-3); the default (0) is the exact fp32 oracle.
 *
 * The backward recomputes the forward internally (no saved activations), so it takes the same
 * inputs plus grad_out. Plain loops, not optimised: O(N*K*H*I) time, fp64 scratch of the size
 * of the weights. Single-threaded; safe to call from several threads at once.
 */
#ifndef MEGAMOE_REFERENCE_H
#define MEGAMOE_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/dtype.h"
#include "megamoe/export.h"
#include "megamoe/status.h"

#ifdef __cplusplus
extern "C" {
#endif
MEGAMOE_API_BEGIN

/* Shapes (all required). */
typedef struct megamoe_reference_shape {
    int64_t ep;              /* simulated ranks, >= 1; num_experts % ep == 0 */
    int64_t tokens_per_rank; /* T >= 1 */
    int64_t hidden;          /* H >= 1 */
    int64_t intermediate;    /* I >= 1 */
    int64_t num_experts;     /* E >= 1, global */
    int64_t top_k;           /* K, 1 <= K <= E */
} megamoe_reference_shape_t;

/* Options and element types of the inputs (outputs are always fp32). */
typedef struct megamoe_reference_params {
    size_t struct_size; /* set by megamoe_reference_params_default(): the caller's sizeof (megamoe/version.h) */
    float swiglu_limit;           /* > 0 clamps as above; <= 0 is off (default 0); not NaN */
    megamoe_dtype_t hidden_dtype; /* hidden_states: FP32 (default) or BF16 */
    megamoe_dtype_t ids_dtype;    /* topk_ids: INT32 (default) or INT64 */
    megamoe_dtype_t probs_dtype;  /* topk_weights: FP32 (default) or BF16 */
    megamoe_dtype_t weight_dtype; /* gate_up_weight and down_weight: FP32 (default) or BF16 */
    megamoe_dtype_t grad_dtype;   /* grad_out (backward only): FP32 (default) or BF16 */
    int bf16_intermediates;       /* 1: round intermediates to bf16 as above (default 0) */
} megamoe_reference_params_t;

megamoe_status_t megamoe_reference_params_init(megamoe_reference_params_t *p, size_t struct_size);
static inline megamoe_reference_params_t megamoe_reference_params_default(void)
{
    megamoe_reference_params_t v;
    megamoe_reference_params_init(&v, sizeof v);
    return v;
}

/* out_p [N, H] = the MoE output for hidden_states [N, H], topk_ids [N, K],
 * topk_weights [N, K], gate_up_weight [E, H, 2I], down_weight [E, I, H] (N = EP*T, all
 * contiguous row-major). params NULL means defaults. INVALID_ARGUMENT (nothing written) for a
 * NULL pointer, a bad shape or dtype, or an expert id outside [0, E). */
megamoe_status_t megamoe_reference_forward(const megamoe_reference_shape_t *shape,
                                           const megamoe_reference_params_t *params,
                                           const void *hidden_states, const void *topk_ids,
                                           const void *topk_weights, const void *gate_up_weight,
                                           const void *down_weight, float *out_p);

/* Gradients for grad_out [N, H] (the gradient of the forward output), same inputs as the
 * forward: grad_hidden_p [N, H], grad_topk_weights_p [N, K], grad_gate_up_p [E, H, 2I],
 * grad_down_p [E, I, H], all fp32 and all required. Errors as for the forward; outputs are
 * written only on success. */
megamoe_status_t megamoe_reference_backward(const megamoe_reference_shape_t *shape,
                                            const megamoe_reference_params_t *params,
                                            const void *grad_out, const void *hidden_states,
                                            const void *topk_ids, const void *topk_weights,
                                            const void *gate_up_weight, const void *down_weight,
                                            float *grad_hidden_p, float *grad_topk_weights_p,
                                            float *grad_gate_up_p, float *grad_down_p);

MEGAMOE_API_END
#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_REFERENCE_H */
