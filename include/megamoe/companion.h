/* megamoe — torch_npu's companion operators of an MoE block, as a C API (docs/ops.md
 * "Companion operators"): the grouped matmul between dispatch and combine, and the routing
 * kernels around it (init_routing_v2, token permute / unpermute, finalize_routing, gating
 * top-k, expert update). The Python package exposes them with torch_npu's signatures
 * (megamoe.ops.npu_grouped_matmul, ...); this header is for C users (and megamoe's serving
 * operator) who want the same kernels without Python.
 *
 * Conventions shared by every function here:
 *  - Tensors are megamoe_tensor_t (include/megamoe/ops.h: contiguous, row-major, data == NULL
 *    means an absent optional input), except the grouped matmul weight, which takes element
 *    strides (callers pass transposed views).
 *  - Group lists (group_list_type): 0 = inclusive prefix sums [E], 1 = counts [E], 2 = an
 *    [E, 2] table of (group id, count) pairs with the used pairs first (a count of 0 ends the
 *    table). Groups own consecutive rows from row 0; the rows past the list's total are written
 *    as zeros (the device leaves them undefined; zeros keep 0 * row finite downstream).
 *  - Arithmetic: fp32 accumulation (int8 products in int32), one rounding to the output type.
 *  - Errors: INVALID_ARGUMENT naming the parameter and the rule; outputs are written only on
 *    success. Every function is local (no communication) and thread-safe; `threads` > 1 lets a
 *    call use that many OpenMP threads (0 or 1: the calling thread only).
 *  - The args structs are extensible (include/megamoe/version.h): struct_size first, set by the
 *    inline *_default() over the exported *_init(p, sizeof *p).
 */
#ifndef MEGAMOE_COMPANION_H
#define MEGAMOE_COMPANION_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/dtype.h"
#include "megamoe/export.h"
#include "megamoe/ops.h"
#include "megamoe/status.h"

#ifdef __cplusplus
extern "C" {
#endif
MEGAMOE_API_BEGIN

/* ---- group lists ------------------------------------------------------------------------ */

/* counts[num_groups] (rows of each group) from a group list of group_list_type 0, 1 or 2
 * (int64 or int32 tensor; type 2 is [E, 2], the counts land at their group ids, which must be
 * < num_groups). INVALID_ARGUMENT for decreasing prefix sums, negative counts, ids out of
 * range or a total above max_rows (max_rows < 0: no limit). *total_p (may be NULL) gets the
 * number of rows the list uses. */
megamoe_status_t megamoe_group_list_counts(const megamoe_tensor_t *group_list,
                                           int64_t group_list_type, int64_t num_groups,
                                           int64_t max_rows, int64_t *counts, int64_t *total_p);

/* ---- grouped matmul (npu_grouped_matmul, group_type 0: groups along M) -------------------- */

/* Expert weights packed once for megamoe_grouped_matmul (the kernels' preferred layout):
 * serving calls the same weights every step, so a caller that keeps this object skips the
 * per-call repacking. Made from the weight fields of an args struct (weight / weight_list /
 * weight_stride / weight_int4; bf16, int8 or int4); it keeps pointers to the caller's weights
 * for columns the packed copy does not serve, so they must outlive it. */
typedef struct megamoe_gmm_weights megamoe_gmm_weights_t;

/* y[rows of g] = x[rows of g] @ W_g, fp32 accumulation, for the float variant:
 *   x bf16 | fp16 | fp32 [M, K]; weight the same type [E, K, N] (or [K, N] = one group);
 *   optional bias [E, N] (fp32, or x's type) added in fp32; y [M, N] of x's type or fp32
 *   (bf16 x may also give fp32 y).
 * Quantised variants (x int8) — W8A8 with int32 y (+ int32 bias), W8A8 with per-channel `scale`
 * [E, N] (fp32 / bf16 / int64-coded fp32) x `per_token_scale` [M] fp32 and a float y, W8A16
 * (bf16 x, int8 weight with antiquant_scale / antiquant_offset [E, N] or [E, G, N]) and W4A8
 * (weight_int4: int32 weight holding 8 int4 values along N, element 8m + i in bits 4i..4i+3) —
 * run on the quantised kernels; docs/ops.md "npu_grouped_matmul" lists the exact algebra.
 * Rows past the group list's total are zero. Weight element strides: the weight may be any
 * strided view (weight_stride[d] = elements between neighbours along dim d of the [E, K, N]
 * view; all zero: contiguous); views whose N or K stride is 1 are used in place. */
typedef struct megamoe_grouped_matmul_args {
    size_t struct_size;               /* the caller's sizeof, set by _default() */
    megamoe_tensor_t x;               /* [M, K] */
    megamoe_tensor_t weight;          /* [E, K, N] or [K, N] (shape; data unused with weight_list) */
    int64_t weight_stride[3];         /* element strides of the [E, K, N] view; 0 0 0 = dense */
    const void *const *weight_list;   /* optional: E separate [K, N] weights with weight's strides */
    megamoe_tensor_t bias;            /* optional [E, N] */
    megamoe_tensor_t scale;           /* optional per-channel dequantisation scale [E, N] */
    megamoe_tensor_t per_token_scale; /* optional [M] fp32 */
    megamoe_tensor_t antiquant_scale; /* optional [E, N] or [E, G, N] (W8A16) */
    megamoe_tensor_t antiquant_offset;/* optional, shape of antiquant_scale */
    megamoe_tensor_t group_list;      /* int64 [E] (types 0, 1) or [E, 2] (type 2); absent: one
                                         group of all M rows */
    int64_t group_list_type;          /* 0 cumsum, 1 counts, 2 (id, count) pairs */
    int weight_int4;                  /* 1: weight is int32 [E, K, N / 8] of packed int4 */
    megamoe_tensor_t y;               /* [M, N] output, dtype selects the output type */
    int threads;                      /* OpenMP threads the call may use (<= 1: the caller) */
    const megamoe_gmm_weights_t *packed; /* optional: these packed weights (of this weight) */
} megamoe_grouped_matmul_args_t;

megamoe_status_t megamoe_grouped_matmul_args_init(megamoe_grouped_matmul_args_t *p, size_t struct_size);
static inline megamoe_grouped_matmul_args_t megamoe_grouped_matmul_args_default(void)
{
    megamoe_grouped_matmul_args_t v;
    megamoe_grouped_matmul_args_init(&v, sizeof v);
    return v;
}
megamoe_status_t megamoe_grouped_matmul(const megamoe_grouped_matmul_args_t *args);

/* Pack the weights args describes (version: the caller's counter for their values). */
megamoe_status_t megamoe_gmm_weights_create(const megamoe_grouped_matmul_args_t *args,
                                            uint64_t version, megamoe_gmm_weights_t **weights_p);
/* Re-pack in place when version or the weights' addresses changed (same shapes and types);
 * *repacked_p (may be NULL) tells. Not concurrently with products that use them. */
megamoe_status_t megamoe_gmm_weights_update(megamoe_gmm_weights_t *weights,
                                            const megamoe_grouped_matmul_args_t *args,
                                            uint64_t version, int *repacked_p);
/* Bytes of the packed copies. */
size_t megamoe_gmm_weights_bytes(const megamoe_gmm_weights_t *weights);
void megamoe_gmm_weights_destroy(megamoe_gmm_weights_t *weights); /* accepts NULL */

/* ---- routing ---------------------------------------------------------------------------- */

/* npu_moe_init_routing_v2 (docs/ops.md): sorts the N*K (token, k) pairs of expert_idx by
 * expert (stable; ids outside [range_start, range_end) after all others), gathers x rows into
 * expanded_x, optionally quantising them (quant_mode 1 dynamic int8 with optional smooth
 * scales, 0 static int8), and returns the row index map and per-expert token counts. Dropless
 * (drop_pad_mode 0) and capacity (drop_pad_mode 1) modes. Call _infer() for the output shapes
 * and types, allocate, then call the operator. */
typedef struct megamoe_init_routing_args {
    size_t struct_size;
    megamoe_tensor_t x;              /* [N, H] bf16 | fp16 | fp32 | int8 */
    megamoe_tensor_t expert_idx;     /* [N, K] int32 | int64 */
    megamoe_tensor_t scale;          /* optional: quant -1: [N] fp32 (travels); 1: [E', H] | [1, H]
                                        smooth; 0: [1] static */
    megamoe_tensor_t offset;         /* quant_mode 0: [1] fp32 */
    int64_t active_num;              /* <= 0: N * K rows */
    int64_t expert_capacity;         /* drop_pad_mode 1 */
    int64_t expert_num;              /* E */
    int64_t drop_pad_mode;           /* 0 dropless, 1 capacity */
    int64_t expert_tokens_num_type;  /* 0 cumsum, 1 counts, 2 (id, count) pairs */
    int expert_tokens_num_flag;
    int64_t quant_mode;              /* -1 none, 0 static int8, 1 dynamic int8 */
    int64_t range_start, range_end;  /* active expert range; range_end <= range_start: [0, E) */
    int64_t row_idx_type;            /* 0 gather, 1 scatter */
    /* outputs */
    megamoe_tensor_t expanded_x;       /* [R, H] (mode 1: [E, C, H]) */
    megamoe_tensor_t expanded_row_idx; /* int32 [N * K] */
    megamoe_tensor_t expert_tokens;    /* int64 [e - s] or [E, 2] */
    megamoe_tensor_t expanded_scale;   /* fp32 [R] (absent dtype/shape [0] when not produced) */
    int threads;
} megamoe_init_routing_args_t;

megamoe_status_t megamoe_init_routing_args_init(megamoe_init_routing_args_t *p, size_t struct_size);
static inline megamoe_init_routing_args_t megamoe_init_routing_args_default(void)
{
    megamoe_init_routing_args_t v;
    megamoe_init_routing_args_init(&v, sizeof v);
    return v;
}
megamoe_status_t megamoe_init_routing_infer(megamoe_init_routing_args_t *args);
megamoe_status_t megamoe_init_routing(const megamoe_init_routing_args_t *args);

/* npu_moe_token_permute: indices [T, K] (or [T]) int32 | int64; permuted [R, H] with
 * R = min(n, T*K) for n > 0, T*K + n otherwise (n = num_out_tokens); sorted_indices int32
 * [T*K]: the destination row of flat pair i (stable order by expert id). tokens bf16 | fp16 |
 * fp32 | int8; permuted the same type. */
megamoe_status_t megamoe_token_permute(const megamoe_tensor_t *tokens,
                                       const megamoe_tensor_t *indices, int64_t num_out_tokens,
                                       megamoe_tensor_t *permuted,
                                       megamoe_tensor_t *sorted_indices, int threads);

/* out[t] = sum_k w[t, k] * rows[index[t * K + k]] in fp32, rounded once to out's type, for
 * t < T = out rows; w = probs [T, K] (any float type; absent: 1 and K = index length / T).
 * Indices outside [0, rows) contribute zero. npu_moe_token_unpermute (forward) and the
 * gradient of npu_moe_token_permute (probs absent). rows bf16 | fp16 | fp32. */
megamoe_status_t megamoe_token_unpermute(const megamoe_tensor_t *rows,
                                         const megamoe_tensor_t *index,
                                         const megamoe_tensor_t *probs, megamoe_tensor_t *out,
                                         int threads);

/* Gradient of megamoe_token_unpermute: d_rows[index[t*K+k]] += w[t,k] * d_out[t] (d_rows is
 * zeroed first; fp32 accumulation over duplicates, in flat pair order) and, with probs,
 * d_probs[t,k] = <rows[index[t*K+k]], d_out[t]> (fp32 dot, rounded to d_probs' type). */
megamoe_status_t megamoe_token_unpermute_backward(const megamoe_tensor_t *rows,
                                                  const megamoe_tensor_t *index,
                                                  const megamoe_tensor_t *probs,
                                                  const megamoe_tensor_t *d_out,
                                                  megamoe_tensor_t *d_rows,
                                                  megamoe_tensor_t *d_probs, int threads);

/* npu_moe_finalize_routing: out[n] = skip1[n] + skip2[n] + sum_k scales[n,k] *
 * (rows[idx(n,k)] + bias[expert_for_source_row[n,k]]), idx(n,k) = expanded_src_to_dst_row
 * [k*N + n] (drop_pad_mode 0/1) or [n*K + k] (2/3); -1 adds the bias only. fp32 accumulation. */
typedef struct megamoe_finalize_routing_args {
    size_t struct_size;
    megamoe_tensor_t expanded_permuted_rows; /* [R, H] (drop modes 1/3: [E, C, H]) */
    megamoe_tensor_t skip1, skip2;           /* optional [N, H] */
    megamoe_tensor_t bias;                   /* optional [E, H] */
    megamoe_tensor_t scales;                 /* optional [N, K] */
    megamoe_tensor_t expanded_src_to_dst_row;/* int32 [N * K] */
    megamoe_tensor_t expert_for_source_row;  /* int32 [N, K] (needed with bias) */
    int64_t drop_pad_mode;
    int64_t k;                               /* K when scales is absent */
    megamoe_tensor_t out;                    /* [N, H], the rows' type */
    int threads;
} megamoe_finalize_routing_args_t;

megamoe_status_t megamoe_finalize_routing_args_init(megamoe_finalize_routing_args_t *p, size_t struct_size);
static inline megamoe_finalize_routing_args_t megamoe_finalize_routing_args_default(void)
{
    megamoe_finalize_routing_args_t v;
    megamoe_finalize_routing_args_init(&v, sizeof v);
    return v;
}
megamoe_status_t megamoe_finalize_routing(const megamoe_finalize_routing_args_t *args);

/* npu_moe_gating_top_k: norm = softmax(x) (norm_type 0) or sigmoid(x) (1) in fp32; selection
 * score norm + bias; with group_count > 1 keep the k_group best groups (score: max, or sum of
 * the top two with group_select_mode 1; ties to the lower group); pick the top k (ties to the
 * lower expert id), descending. y = norm of the picks (norm_type 1: / (sum + eps)) *
 * routed_scaling_factor, x's type; expert_idx int32; norm_out fp32 [N, E]. renorm 1 normalises
 * the softmax picks too ("top-k then norm"). */
typedef struct megamoe_gating_top_k_args {
    size_t struct_size;
    megamoe_tensor_t x;          /* [N, E] bf16 | fp16 | fp32 */
    megamoe_tensor_t bias;       /* optional [E] */
    int64_t k, k_group, group_count, group_select_mode, renorm, norm_type;
    double routed_scaling_factor, eps;
    megamoe_tensor_t y;          /* [N, k] x's type */
    megamoe_tensor_t expert_idx; /* [N, k] int32 */
    megamoe_tensor_t norm_out;   /* optional [N, E] fp32 */
    int threads;
} megamoe_gating_top_k_args_t;

megamoe_status_t megamoe_gating_top_k_args_init(megamoe_gating_top_k_args_t *p, size_t struct_size);
static inline megamoe_gating_top_k_args_t megamoe_gating_top_k_args_default(void)
{
    megamoe_gating_top_k_args_t v;
    megamoe_gating_top_k_args_init(&v, sizeof v);
    return v;
}
megamoe_status_t megamoe_gating_top_k(const megamoe_gating_top_k_args_t *args);

/* ---- activations and quantisation -------------------------------------------------------- */

/* npu_swiglu / npu_clipped_swiglu: x (any float type, contiguous, ndim <= 4) is split along
 * `dim` into A and B — halves (A first: the gate) or, interleaved, even (A) / odd (B)
 * positions — and y = silu(A) * B, or clipped: A' = min(A, limit), B' = clamp(B, -limit,
 * limit), y = A' * sigmoid(alpha * A') * (B' + bias). fp32 math, one rounding to y's type
 * (x's shape with dim halved). valid_rows >= 0: only the first valid_rows entries of the
 * leading axis (the product of the dims before `dim`) are computed, the rest of y is zero. */
typedef struct megamoe_swiglu_args {
    size_t struct_size;
    megamoe_tensor_t x;
    int64_t dim;          /* negative: from the end */
    int interleaved;      /* 0: halves, 1: even / odd */
    int clipped;          /* 0: silu(A) * B, 1: the clipped form */
    float alpha, limit, bias;
    int64_t valid_rows;   /* < 0: all */
    megamoe_tensor_t y;
    int threads;
} megamoe_swiglu_args_t;

megamoe_status_t megamoe_swiglu_args_init(megamoe_swiglu_args_t *p, size_t struct_size);
static inline megamoe_swiglu_args_t megamoe_swiglu_args_default(void)
{
    megamoe_swiglu_args_t v;
    megamoe_swiglu_args_init(&v, sizeof v);
    return v;
}
megamoe_status_t megamoe_swiglu(const megamoe_swiglu_args_t *args);
/* Gradient of the unclipped form: dx (x's shape and type) from dy (y's shape): dA = dy * B *
 * silu'(A), dB = dy * silu(A), fp32 math. */
megamoe_status_t megamoe_swiglu_backward(const megamoe_swiglu_args_t *args,
                                         const megamoe_tensor_t *dy, megamoe_tensor_t *dx);

/* npu_dynamic_quant: per row of the last dim, v = x (* smooth), s = max|v| / qmax, q =
 * round(v / s) (ties to even, saturating), qmax 127 (int8 y) or 7 (int4: y int32 [..., H/8],
 * element 8m + i in bits 4i..4i+3). smooth_scales [H], or [G, H] with group_index (int32 /
 * int64 [G] end offsets: rows [gi[g-1], gi[g]) use row g; rows past the last offset are
 * written as zeros with scale 0). scale fp32 [rows]. */
typedef struct megamoe_dynamic_quant_args {
    size_t struct_size;
    megamoe_tensor_t x;             /* [..., H] bf16 | fp16 | fp32 */
    megamoe_tensor_t smooth_scales; /* optional [H] or [G, H] (fp32 / x's type) */
    megamoe_tensor_t group_index;   /* optional [G] end offsets */
    megamoe_tensor_t y;             /* int8 (x's shape) or int32 [..., H / 8] (int4) */
    megamoe_tensor_t scale;         /* fp32, x's shape without the last dim */
    int threads;
} megamoe_dynamic_quant_args_t;

megamoe_status_t megamoe_dynamic_quant_args_init(megamoe_dynamic_quant_args_t *p, size_t struct_size);
static inline megamoe_dynamic_quant_args_t megamoe_dynamic_quant_args_default(void)
{
    megamoe_dynamic_quant_args_t v;
    megamoe_dynamic_quant_args_init(&v, sizeof v);
    return v;
}
megamoe_status_t megamoe_dynamic_quant(const megamoe_dynamic_quant_args_t *args);

/* npu_dequant_swiglu_quant (and the activation of npu_grouped_matmul_swiglu_quant): per row t
 * of group g, v = x[t] (+ bias) * weight_scale[g] * activation_scale[t] (fp32), y = the
 * SwiGLU of v (swiglu_mode 0: halves, activate_left picks which half is the gate; 1:
 * interleaved clipped form with clamp_limit / glu_alpha / glu_bias, even = gate; 2: halves
 * with the clipped form), y *= quant_scale[g] (optional smoothing), then per-row dynamic int8
 * (quant_mode 1: out int8 [T, H], scale [T]) or static int8 (quant_mode 0: round(y *
 * quant_scale + quant_offset), scale = 0). Rows past the group list's total: zero, scale 0. */
typedef struct megamoe_dequant_swiglu_quant_args {
    size_t struct_size;
    megamoe_tensor_t x;                /* [T, 2H] int32 | bf16 | fp16 | fp32 */
    megamoe_tensor_t weight_scale;     /* optional fp32 [G, 2H] ([2H] without groups) */
    megamoe_tensor_t activation_scale; /* optional fp32 [T] or [T, 1] */
    megamoe_tensor_t bias;             /* optional [2H] int32 | float */
    megamoe_tensor_t quant_scale;      /* optional [G, H] ([H]) float */
    megamoe_tensor_t quant_offset;     /* optional, quant_mode 0 */
    megamoe_tensor_t group_index;      /* optional int64 [G] */
    int64_t group_index_type;          /* 1: counts (npu_dequant_swiglu_quant), 0: cumsum */
    int activate_left;                 /* swiglu_mode 0/2: 1 = the left half is the gate */
    int64_t quant_mode;                /* 1 dynamic, 0 static */
    int64_t swiglu_mode;               /* 0, 1 or 2 */
    float clamp_limit, glu_alpha, glu_bias;
    megamoe_tensor_t y;                /* int8 [T, H] */
    megamoe_tensor_t scale;            /* fp32 [T] */
    int threads;
} megamoe_dequant_swiglu_quant_args_t;

megamoe_status_t megamoe_dequant_swiglu_quant_args_init(megamoe_dequant_swiglu_quant_args_t *p, size_t struct_size);
static inline megamoe_dequant_swiglu_quant_args_t megamoe_dequant_swiglu_quant_args_default(void)
{
    megamoe_dequant_swiglu_quant_args_t v;
    megamoe_dequant_swiglu_quant_args_init(&v, sizeof v);
    return v;
}
megamoe_status_t megamoe_dequant_swiglu_quant(const megamoe_dequant_swiglu_quant_args_t *args);

MEGAMOE_API_END
#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_COMPANION_H */
