/* megamoe_gating_top_k (include/megamoe/companion.h): torch_npu's npu_moe_gating_top_k.
 * Per row, in fp32: norm (softmax or sigmoid), selection score norm + bias, optional group
 * selection, a top-k with ties to the lower index, descending. Deterministic by construction
 * (torch.topk does not promise an order for ties). */
#include <math.h>
#include <stdlib.h>

#include "base/abi.h"
#include "companion_util.h"

static megamoe_gating_top_k_args_t mm_gating_top_k_defaults(void)
{
    megamoe_gating_top_k_args_t a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.k = 1;
    a.k_group = 1;
    a.group_count = 1;
    a.routed_scaling_factor = 1.0;
    a.eps = 1e-20;
    a.threads = 1;
    return a;
}

megamoe_status_t megamoe_gating_top_k_args_init(megamoe_gating_top_k_args_t *p, size_t struct_size)
{
    megamoe_gating_top_k_args_t d = mm_gating_top_k_defaults();
    return mm_abi_init(p, struct_size, &d, sizeof d, "megamoe_gating_top_k_args_t");
}

/* index of the largest v[i] over the candidates (ties: the lower index), or -1 */
static int64_t mm_gt_argmax(const float *v, const unsigned char *taken, int64_t n)
{
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++) {
        if (taken[i] || v[i] != v[i]) continue;
        if (best < 0 || v[i] > v[best]) best = i;
    }
    return best;
}

megamoe_status_t megamoe_gating_top_k(const megamoe_gating_top_k_args_t *in)
{
    const char *fn = "megamoe_gating_top_k";
    megamoe_gating_top_k_args_t a;
    MM_CX_ARGS("megamoe_gating_top_k_args_t", in, a, mm_gating_top_k_defaults());
    const megamoe_tensor_t *x = &a.x;
    if (x->ndim != 2 || !mm_cx_is_float(x->dtype) || (!x->data && mm_cx_numel(x)))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: x must be a float [N, E] tensor", fn);
    int64_t N = x->shape[0], E = x->shape[1], G = a.group_count, k = a.k;
    if (a.norm_type != 0 && a.norm_type != 1)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: norm_type %lld; use 0 (softmax) or 1 "
                        "(sigmoid)", fn, (long long)a.norm_type);
    if (a.renorm != 0 && a.renorm != 1)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: renorm %lld; use 0 or 1", fn,
                        (long long)a.renorm);
    if (a.group_select_mode != 0 && a.group_select_mode != 1)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: group_select_mode %lld; use 0 (max) or 1 (sum of the top two)", fn,
                        (long long)a.group_select_mode);
    if (G < 1 || E % G != 0 || a.k_group < 1 || a.k_group > G)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: group_count %lld must divide E = %lld and 1 <= k_group (%lld) <= "
                        "group_count", fn, (long long)G, (long long)E, (long long)a.k_group);
    int64_t S = E / G;
    if (G > 1 && a.group_select_mode == 1 && S < 2)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: group_select_mode 1 sums the top two of a group; groups have %lld "
                        "experts", fn, (long long)S);
    if (k < 1 || k > (G > 1 ? a.k_group * S : E))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: k = %lld must be in [1, %lld] (the experts of the kept groups)", fn,
                        (long long)k, (long long)(G > 1 ? a.k_group * S : E));
    if (mm_cx_present(&a.bias) && (mm_cx_numel(&a.bias) != E || !mm_cx_is_float(a.bias.dtype)))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: bias must be a float [E=%lld] tensor", fn,
                        (long long)E);
    if (a.y.ndim != 2 || a.y.shape[0] != N || a.y.shape[1] != k || !mm_cx_is_float(a.y.dtype) ||
        (!a.y.data && N * k != 0))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: y must be a float [N=%lld, k=%lld] tensor",
                        fn, (long long)N, (long long)k);
    if (a.expert_idx.dtype != MEGAMOE_DTYPE_INT32 || mm_cx_numel(&a.expert_idx) != N * k ||
        (!a.expert_idx.data && N * k != 0))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: expert_idx must be int32 [N, k]", fn);
    if (mm_cx_present(&a.norm_out) &&
        (a.norm_out.dtype != MEGAMOE_DTYPE_FP32 || mm_cx_numel(&a.norm_out) != N * E))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: norm_out must be fp32 [N, E]", fn);
    float *bias = NULL;
    if (mm_cx_present(&a.bias)) {
        bias = malloc((size_t)E * sizeof *bias);
        if (!bias) return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: bias", fn);
        for (int64_t e = 0; e < E; e++) bias[e] = mm_cx_load(a.bias.data, a.bias.dtype, e);
    }
    float *buf = malloc((size_t)(2 * E + G + 16) * sizeof *buf);
    unsigned char *taken = malloc((size_t)(E + G + 16));
    if (!buf || !taken) {
        free(bias), free(buf), free(taken);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: row scratch", fn);
    }
    float *norm = buf, *score = buf + E, *gscore = score + E;
    int32_t *idx = a.expert_idx.data;
    float sf = (float)a.routed_scaling_factor, eps = (float)a.eps;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t e = 0; e < E; e++) norm[e] = mm_cx_load(x->data, x->dtype, n * E + e);
        if (a.norm_type == 0) {
            float m = -INFINITY, sum = 0.0f;
            for (int64_t e = 0; e < E; e++) m = norm[e] > m ? norm[e] : m;
            for (int64_t e = 0; e < E; e++) sum += norm[e] = expf(norm[e] - m);
            for (int64_t e = 0; e < E; e++) norm[e] /= sum;
        } else {
            for (int64_t e = 0; e < E; e++) norm[e] = 1.0f / (1.0f + expf(-norm[e]));
        }
        if (mm_cx_present(&a.norm_out)) memcpy((float *)a.norm_out.data + n * E, norm, (size_t)E * 4);
        for (int64_t e = 0; e < E; e++) score[e] = bias ? norm[e] + bias[e] : norm[e];
        memset(taken, 0, (size_t)E);
        if (G > 1) { /* keep the k_group best groups, mask the others */
            unsigned char *gtaken = taken + E;
            for (int64_t g = 0; g < G; g++) {
                const float *s = score + g * S;
                float best = -INFINITY, second = -INFINITY;
                for (int64_t i = 0; i < S; i++) {
                    if (s[i] > best) second = best, best = s[i];
                    else if (s[i] > second) second = s[i];
                }
                gscore[g] = a.group_select_mode == 0 ? best : best + second;
                gtaken[g] = 0;
            }
            for (int64_t j = 0; j < a.k_group; j++) {
                int64_t g = mm_gt_argmax(gscore, gtaken, G);
                if (g >= 0) gtaken[g] = 1;
            }
            for (int64_t g = 0; g < G; g++)
                if (!gtaken[g]) memset(taken + g * S, 1, (size_t)S);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            int64_t e = mm_gt_argmax(score, taken, E);
            if (e < 0) { /* only NaN scores left: the lowest free index */
                for (e = 0; e < E && taken[e]; e++) {
                }
            }
            taken[e] = 1;
            idx[n * k + j] = (int32_t)e;
            sum += norm[e];
        }
        int normalise = a.norm_type == 1 || a.renorm == 1;
        for (int64_t j = 0; j < k; j++) {
            float v = norm[idx[n * k + j]];
            if (normalise) v = v / (sum + eps);
            mm_cx_store(a.y.data, a.y.dtype, n * k + j, v * sf);
        }
    }
    free(bias), free(buf), free(taken);
    return MEGAMOE_OK;
}
