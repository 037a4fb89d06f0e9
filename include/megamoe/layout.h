/* megamoe — expert weight layouts: per-expert nn.Linear weights <-> the MegaMoE layout.
 *
 * nn.Linear keeps weight [out_features, in_features]; per expert e of E (stacked, dense):
 *     gate[e] [I, H] (gate_proj), up[e] [I, H] (up_proj), down[e] [H, I] (down_proj).
 * MegaMoE keeps (the seed's rule: gate and up transposed and concatenated on the last dim;
 * down with its last two dims transposed):
 *     gate_up_weight[e] [H, 2I]:  gate_up[e][h][i] = gate[e][i][h],  gate_up[e][h][I+i] = up[e][i][h]
 *     down_weight[e]    [I, H]:   down_weight[e][i][h] = down[e][h][i]
 * Element types FP32, BF16 or FP16; bits are copied unchanged (a permutation). Source and
 * destination must not overlap. For one expert of a bigger table pass num_experts = 1 and
 * offset the pointers. INVALID_ARGUMENT for NULL buffers, negative sizes, other types or
 * overlap.
 */
#ifndef MEGAMOE_LAYOUT_H
#define MEGAMOE_LAYOUT_H

#include <stdint.h>

#include "megamoe/dtype.h"
#include "megamoe/export.h"
#include "megamoe/status.h"

#ifdef __cplusplus
extern "C" {
#endif
MEGAMOE_API_BEGIN

megamoe_status_t megamoe_layout_gate_up_from_linear(void *gate_up, const void *gate,
                                                    const void *up, megamoe_dtype_t dtype,
                                                    int64_t num_experts, int64_t hidden,
                                                    int64_t intermediate);
megamoe_status_t megamoe_layout_gate_up_to_linear(void *gate, void *up, const void *gate_up,
                                                  megamoe_dtype_t dtype, int64_t num_experts,
                                                  int64_t hidden, int64_t intermediate);
megamoe_status_t megamoe_layout_down_from_linear(void *down_weight, const void *down,
                                                 megamoe_dtype_t dtype, int64_t num_experts,
                                                 int64_t hidden, int64_t intermediate);
megamoe_status_t megamoe_layout_down_to_linear(void *down, const void *down_weight,
                                               megamoe_dtype_t dtype, int64_t num_experts,
                                               int64_t hidden, int64_t intermediate);

/* ---- quantised expert weights (the inputs of the quantised GEMMs; docs/kernels.md) ---------
 *
 * A weight W[K, N] is row-major [in, out] (K input features, N outputs: the orientation of
 * mega_moe's and npu_grouped_matmul's int8/int4 weights, i.e. gate_up_weight [H, 2I] and
 * down_weight [I, H]; transpose an nn.Linear weight first). Symmetric quantisation, per output
 * channel (group_size 0) or per group of group_size consecutive k (a multiple of 8; the last
 * group may be short), G = megamoe_quant_groups(K, group_size) scale rows:
 *     scale[g][n] = fl32(max over the group's k of |W[k][n]| / qmax)     (qmax 127 / 7)
 *     q[k][n]     = round half to even (fl32(W[k][n] / scale)), clamped to [-qmax, qmax];
 *                   an all-zero group has scale 0 and q = 0.
 * Inputs fp32, bf16 or fp16 (finite: INVALID_ARGUMENT names a non-finite element).
 * int4 storage: two values per byte, two's complement, the even column in the low nibble
 * (vLLM-Ascend's packing), ceil(cols / 2) bytes per row; viewed as int32 (8 values each,
 * value 8m+i in bits 4i..4i+3, little endian) it is the int32 carrier of CANN's int4 weights. */
int64_t megamoe_quant_groups(int64_t K, int64_t group_size);
/* q [K][N] int8, scales [G][N]. */
megamoe_status_t megamoe_quant_weight_int8(const void *w, megamoe_dtype_t dtype, int64_t K,
                                           int64_t N, int64_t group_size, int8_t *q,
                                           float *scales);
/* packed [K][ceil(N/2)] (values in [-7, 7]), scales [G][N]. */
megamoe_status_t megamoe_quant_weight_int4(const void *w, megamoe_dtype_t dtype, int64_t K,
                                           int64_t N, int64_t group_size, uint8_t *packed,
                                           float *scales);
/* int8 values in [-8, 7], [rows][cols] <-> packed [rows][ceil(cols/2)]. */
megamoe_status_t megamoe_int4_pack(const int8_t *values, int64_t rows, int64_t cols,
                                   uint8_t *packed);
megamoe_status_t megamoe_int4_unpack(const uint8_t *packed, int64_t rows, int64_t cols,
                                     int8_t *values);
/* The A8W4 bias term of mega_moe §6.3 / npu_grouped_matmul W4A8, added before the token scale:
 *     bias_pre[n] = bias[n] - 8 * sum_k V[k][n] * scale[g(k)][n]
 * (V the int4 values of packed [K][ceil(N/2)], scales [G][N], bias NULL = 0; evaluated in
 * double, rounded once). With the canonical bias (bias = 8 * colsum(V * scale), what CANN's
 * example and vLLM-Ascend compute) it is ~0 and the product is the plain int8 x int4 one. */
megamoe_status_t megamoe_quant_w4a8_bias_pre(const uint8_t *packed, int64_t K, int64_t N,
                                             const float *scales, int64_t group_size,
                                             const float *bias, float *bias_pre);

MEGAMOE_API_END
#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_LAYOUT_H */
