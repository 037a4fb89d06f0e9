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

MEGAMOE_API_END
#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_LAYOUT_H */
