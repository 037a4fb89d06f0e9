/* Validation of the v2 operators' arguments and derivation of their configuration.
 *
 * Every rule here is a SEMANTIC rule of the Ascend operators (docs/ops.md lists them, with the
 * hardware-only limits we deliberately do not impose: H range, BS <= 512, W <= 768, E <= 1024,
 * the HCCL_BUFFSIZE formulas). All checks are local; mm_v2_call_agree() spreads a failure to
 * every rank before any data moves. Messages name the parameter and the rule.
 */
#include <math.h>
#include <string.h>

#include "base/env.h"
#include "base/error.h"
#include "kernels/quant.h"
#include "v2_internal.h"

#define MM_BAD(...) return mm_error(MEGAMOE_INVALID_ARGUMENT, __VA_ARGS__)

static int mm_is_token_type(megamoe_dtype_t t)
{
    return t == MEGAMOE_DTYPE_BF16 || t == MEGAMOE_DTYPE_FP16;
}

static megamoe_status_t mm_check_tensor(const megamoe_tensor_t *t, const char *name,
                                        megamoe_dtype_t dtype, int ndim)
{
    if (t->dtype != dtype)
        MM_BAD("%s must be %s, got %s", name, megamoe_dtype_name(dtype),
               megamoe_dtype_name(t->dtype));
    if (t->ndim != ndim) MM_BAD("%s must be %d-D, got %d-D", name, ndim, t->ndim);
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] < 0) MM_BAD("%s has a negative dimension", name);
    return MEGAMOE_OK;
}

int mm_v2_has_nan(const float *v, int64_t n)
{
    int bad = 0; /* no early exit: the loop vectorises */
    for (int64_t i = 0; i < n; i++) bad |= v[i] != v[i];
    return bad;
}

/* Attributes shared by dispatch and combine. */
typedef struct {
    megamoe_comm_t *group_ep, *group_tp;
    int64_t W, rank, E, tp, tp_rank, shard, NS, S, gbs, Z, Cp, Cn;
    const char *comm_alg;
    const megamoe_tensor_t *elastic, *perf, *mask;
} mm_v2_common_t;

static megamoe_status_t mm_v2_elastic(mm_v2_cfg_t *c, const megamoe_tensor_t *el)
{
    c->scaled = 0;
    c->eW = c->W;
    c->eS = c->S;
    c->eE = c->E;
    c->erank = c->rank;
    c->elastic_hash = 0;
    if (el->data == NULL) return MEGAMOE_OK;
    MM_CHECK(mm_check_tensor(el, "elastic_info", MEGAMOE_DTYPE_INT32, 1));
    if (el->shape[0] != 4 + 2 * c->W)
        MM_BAD("elastic_info must have 4 + 2 * ep_world_size = %lld elements, got %lld",
               (long long)(4 + 2 * c->W), (long long)el->shape[0]);
    if (c->tp == 2) MM_BAD("elastic_info is not allowed with tp_world_size 2");
    if (c->alg == MM_V2_ALG_FULLMESH_V2) MM_BAD("elastic_info is not allowed with comm_alg fullmesh_v2");
    const int32_t *v = el->data;
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < el->shape[0]; i++) h = (h ^ (uint32_t)v[i]) * 1099511628211ull;
    c->elastic_hash = h;
    if (v[0] != 0 && v[0] != 1) MM_BAD("elastic_info[0] (isScaled) must be 0 or 1, got %d", v[0]);
    if (v[0] == 0) return MEGAMOE_OK;
    int64_t nW = v[1], nS = v[2], nE = v[3];
    if (nW < 1 || nW > c->W)
        MM_BAD("elastic_info[1] (new ep world size) %lld must be in [1, %lld]", (long long)nW,
               (long long)c->W);
    if (nS < 0 || nS >= nW)
        MM_BAD("elastic_info[2] (new shared expert rank num) %lld must be in [0, %lld)",
               (long long)nS, (long long)nW);
    if (c->NS == 0 && nS != 0)
        MM_BAD("elastic_info[2] must be 0 without shared experts, got %lld", (long long)nS);
    if (c->NS > 0 && (nS == 0 || nS % c->NS != 0))
        MM_BAD("elastic_info[2] (new shared expert rank num) %lld must be a positive multiple of "
               "shared_expert_num %lld", (long long)nS, (long long)c->NS);
    if (nE <= 0 || nE % (nW - nS) != 0 || nE / (nW - nS) != c->L_moe)
        MM_BAD("elastic_info[3] (new moe expert num) %lld must keep %lld experts on each of the "
               "%lld MoE ranks (local expert count may not change)", (long long)nE,
               (long long)c->L_moe, (long long)(nW - nS));
    if (nE > c->E)
        MM_BAD("elastic_info[3] (new moe expert num) %lld exceeds moe_expert_num %lld",
               (long long)nE, (long long)c->E);
    const int32_t *t1 = v + 4, *t2 = v + 4 + c->W;
    int64_t alive = 0;
    for (int64_t i = 0; i < c->W; i++) {
        if (t1[i] < -1 || t1[i] >= nW)
            MM_BAD("elastic_info table 1 entry %lld is %d, must be -1 or in [0, %lld)",
                   (long long)i, t1[i], (long long)nW);
        if (t1[i] >= 0) alive++;
    }
    if (alive != nW)
        MM_BAD("elastic_info table 1 maps %lld ranks, but the new ep world size is %lld",
               (long long)alive, (long long)nW);
    for (int64_t j = 0; j < nW; j++) {
        if (t2[j] < 0 || t2[j] >= c->W || t1[t2[j]] != j)
            MM_BAD("elastic_info table 2 entry %lld (%d) is not the inverse of table 1",
                   (long long)j, t2[j]);
    }
    c->scaled = 1;
    c->eW = nW;
    c->eS = nS;
    c->eE = nE;
    c->erank = t1[c->rank];
    c->table1 = t1;
    c->table2 = t2;
    return MEGAMOE_OK;
}

/* Ranks per hierarchy group when MEGAMOE_RANKS_PER_NODE is 0: the ranks of one host. Groups
 * are consecutive compact ranks of one size, so with ranks placed in equal consecutive blocks
 * per host (what launchers do) a group is a host; otherwise the largest size whose blocks each
 * lie inside one host (the gcd of the runs of same-host ranks), so a unit still crosses each
 * host boundary once per group. Every rank computes the same from the same host map. */
static int mm_v2_host_group(const mm_v2_cfg_t *c, mm_shmem_team_t *ep)
{
    int64_t run = 0, g = 0, prev_host = -2;
    for (int64_t j = 0; j < c->eW; j++) {
        int64_t r = c->scaled ? c->table2[j] : j;
        int host = mm_shmem_host_of(mm_shmem_team_world_pe(ep, (int)r));
        if (host != prev_host && run) {
            int64_t a = g, b = run; /* g = gcd(g, run) */
            while (b) {
                int64_t t = a % b;
                a = b;
                b = t;
            }
            g = a;
            run = 0;
        }
        prev_host = host;
        run++;
    }
    if (run) {
        int64_t a = g, b = run;
        while (b) {
            int64_t t = a % b;
            a = b;
            b = t;
        }
        g = a;
    }
    return (int)(g > 0 ? g : c->eW);
}

static megamoe_status_t mm_v2_common(mm_v2_cfg_t *c, const mm_v2_common_t *in)
{
    if (in->group_ep == NULL) MM_BAD("group_ep: a communicator is required");
    mm_shmem_team_t *ep = mm_comm_team(in->group_ep);
    if (ep == NULL) MM_BAD("group_ep is not a valid communicator (destroyed, or the runtime is not running)");
    c->W = in->W;
    c->rank = in->rank;
    if (c->W < 2) MM_BAD("ep_world_size must be >= 2, got %lld", (long long)c->W);
    if (c->W != mm_shmem_team_n_pes(ep))
        MM_BAD("ep_world_size %lld does not match the size %d of group_ep", (long long)c->W,
               mm_shmem_team_n_pes(ep));
    if (c->rank < 0 || c->rank >= c->W)
        MM_BAD("ep_rank_id %lld must be in [0, ep_world_size %lld)", (long long)c->rank,
               (long long)c->W);
    if (c->rank != mm_shmem_team_my_pe(ep))
        MM_BAD("ep_rank_id %lld is not this process's rank %d in group_ep", (long long)c->rank,
               mm_shmem_team_my_pe(ep));
    if (in->shard != 0) MM_BAD("expert_shard_type must be 0 (shared ranks first), got %lld", (long long)in->shard);
    c->S = in->S;
    c->NS = in->NS;
    if (c->S < 0 || c->S >= c->W)
        MM_BAD("shared_expert_rank_num %lld must be in [0, ep_world_size %lld)", (long long)c->S,
               (long long)c->W);
    if (c->NS < 0 || c->NS > 4) MM_BAD("shared_expert_num %lld must be in [0, 4]", (long long)c->NS);
    if (c->S == 0 && c->NS == 1) c->NS = 0; /* the torch_npu default (1, 0) means none */
    if (c->NS == 0 && c->S != 0)
        MM_BAD("shared_expert_rank_num %lld needs shared_expert_num >= 1", (long long)c->S);
    if (c->NS != 0 && c->S == 0)
        MM_BAD("shared_expert_num %lld needs shared_expert_rank_num > 0", (long long)c->NS);
    if (c->NS != 0 && c->S % c->NS != 0)
        MM_BAD("shared_expert_rank_num %lld must be a multiple of shared_expert_num %lld",
               (long long)c->S, (long long)c->NS);
    c->E = in->E;
    if (c->E <= 0 || c->E % (c->W - c->S) != 0)
        MM_BAD("moe_expert_num %lld must be > 0 and divisible by ep_world_size - "
               "shared_expert_rank_num = %lld", (long long)c->E, (long long)(c->W - c->S));
    c->L_moe = c->E / (c->W - c->S);
    c->Z = in->Z;
    c->Cp = in->Cp;
    c->Cn = in->Cn;
    if (c->Z < 0 || c->Cp < 0 || c->Cn < 0)
        MM_BAD("zero_expert_num, copy_expert_num and const_expert_num must be >= 0");
    if (c->E + c->Z + c->Cp + c->Cn > INT32_MAX)
        MM_BAD("moe_expert_num + zero/copy/const expert nums must be <= INT32_MAX");
    /* comm_alg */
    const char *alg = in->comm_alg ? in->comm_alg : "";
    if (alg[0] == '\0' || strcmp(alg, "fullmesh_v1") == 0) c->alg = MM_V2_ALG_FULLMESH;
    else if (strcmp(alg, "fullmesh_v2") == 0) c->alg = MM_V2_ALG_FULLMESH_V2;
    else if (strcmp(alg, "hierarchy") == 0) c->alg = MM_V2_ALG_HIERARCHY;
    else if (strcmp(alg, "fullmesh") == 0) c->alg = MM_V2_ALG_FULLMESH_A2;
    else MM_BAD("comm_alg \"%s\" must be \"\", \"fullmesh_v1\", \"fullmesh_v2\", \"hierarchy\" or "
                "\"fullmesh\" (A2)", alg);
    c->hier_group = 0;
    int64_t hier_env = 0;
    if (c->alg == MM_V2_ALG_HIERARCHY) {
        MM_CHECK(mm_env_int(MM_ENV_RANKS_PER_NODE, &hier_env));
        c->hier_group = (int)(hier_env <= 0 || hier_env > c->W ? c->W : hier_env);
    }
    /* TP */
    c->tp = in->tp;
    c->tp_rank = in->tp_rank;
    if (c->tp < 0 || c->tp > 2) MM_BAD("tp_world_size %lld must be 0, 1 or 2", (long long)c->tp);
    c->T = c->tp > 1 ? c->tp : 1;
    if (c->tp == 2) {
        if (c->tp_rank != 0 && c->tp_rank != 1)
            MM_BAD("tp_rank_id %lld must be 0 or 1 with tp_world_size 2", (long long)c->tp_rank);
        if (in->group_tp == NULL) MM_BAD("group_tp is required with tp_world_size 2");
        if (in->group_tp == in->group_ep) MM_BAD("group_tp must differ from group_ep");
        mm_shmem_team_t *tp = mm_comm_team(in->group_tp);
        if (tp == NULL) MM_BAD("group_tp is not a valid communicator");
        if (mm_shmem_team_n_pes(tp) != 2)
            MM_BAD("group_tp must have 2 ranks with tp_world_size 2, it has %d", mm_shmem_team_n_pes(tp));
        if (c->tp_rank != mm_shmem_team_my_pe(tp))
            MM_BAD("tp_rank_id %lld is not this process's rank %d in group_tp",
                   (long long)c->tp_rank, mm_shmem_team_my_pe(tp));
        if (c->L_moe != 1)
            MM_BAD("tp_world_size 2 needs one expert per MoE rank, got moe_expert_num / "
                   "(ep_world_size - shared_expert_rank_num) = %lld", (long long)c->L_moe);
        if (c->alg == MM_V2_ALG_FULLMESH_V2) MM_BAD("comm_alg fullmesh_v2 needs tp_world_size <= 1");
    } else if (c->tp_rank != 0) {
        MM_BAD("tp_rank_id must be 0 without TP (tp_world_size %lld), got %lld", (long long)c->tp,
               (long long)c->tp_rank);
    }
    /* global batch */
    if (in->gbs < 0) MM_BAD("global_bs must be >= 0, got %lld", (long long)in->gbs);
    if (in->gbs > INT32_MAX) /* keeps A = global_bs * min(L, K) and the output shapes in range */
        MM_BAD("global_bs must be <= INT32_MAX, got %lld", (long long)in->gbs);
    if (in->gbs != 0 && (in->gbs < c->bs * c->W || in->gbs % c->W != 0))
        MM_BAD("global_bs %lld must be 0 or a multiple of ep_world_size that is >= BS * "
               "ep_world_size = %lld", (long long)in->gbs, (long long)(c->bs * c->W));
    c->gbs_real = in->gbs ? in->gbs : c->bs * c->W;
    c->max_bs = c->gbs_real / c->W;
    if (c->gbs_real > c->bs * c->W) {
        if (in->mask->data != NULL)
            MM_BAD("x_active_mask is not allowed when ranks have different BS (global_bs %lld > "
                   "BS * ep_world_size %lld)", (long long)c->gbs_real, (long long)(c->bs * c->W));
        if (c->alg == MM_V2_ALG_FULLMESH_V2)
            MM_BAD("comm_alg fullmesh_v2 needs the same BS on every rank (global_bs %lld > BS * "
                   "ep_world_size)", (long long)c->gbs_real);
    }
    /* capacities (torch_npu infershape) */
    int64_t rpse0 = c->NS ? c->S / c->NS : 1;
    int64_t moeA = c->gbs_real * (c->L_moe < c->K ? c->L_moe : c->K);
    int64_t sharedA = c->NS ? c->max_bs * ((c->W + rpse0 - 1) / rpse0) : 0;
    if (in->elastic->data != NULL) {
        c->A = (c->S == 0 || moeA > sharedA) ? moeA : sharedA;
        c->L_out = c->L_moe;
    } else if (c->rank < c->S) {
        c->A = sharedA;
        c->L_out = 1;
    } else {
        c->A = moeA;
        c->L_out = c->L_moe;
    }
    c->n_counts = c->W * c->L_out * (c->tp == 2 ? 2 : 1);
    /* mask */
    c->mask_dim = 0;
    if (in->mask->data != NULL) {
        const megamoe_tensor_t *m = in->mask;
        if (m->dtype != MEGAMOE_DTYPE_BOOL) MM_BAD("x_active_mask must be bool, got %s", megamoe_dtype_name(m->dtype));
        if (m->ndim == 1 && m->shape[0] == c->bs) c->mask_dim = 1;
        else if (m->ndim == 2 && m->shape[0] == c->bs && m->shape[1] == c->K) c->mask_dim = 2;
        else MM_BAD("x_active_mask must be [BS] = [%lld] or [BS, K] = [%lld, %lld]",
                    (long long)c->bs, (long long)c->bs, (long long)c->K);
        if (c->mask_dim == 2 && c->alg == MM_V2_ALG_FULLMESH_V2)
            MM_BAD("a 2-D x_active_mask is not allowed with comm_alg fullmesh_v2");
    }
    if (c->alg == MM_V2_ALG_FULLMESH_V2) {
        if (c->K > 12) MM_BAD("comm_alg fullmesh_v2 needs K <= 12, got %lld", (long long)c->K);
        if (c->Z + c->Cp + c->Cn > 0) MM_BAD("comm_alg fullmesh_v2 does not allow zero/copy/const experts");
    }
    if (in->perf->data != NULL) {
        MM_CHECK(mm_check_tensor(in->perf, "performance_info", MEGAMOE_DTYPE_INT64, 1));
        if (in->perf->shape[0] != c->W)
            MM_BAD("performance_info must have ep_world_size = %lld elements, got %lld",
                   (long long)c->W, (long long)in->perf->shape[0]);
    }
    MM_CHECK(mm_v2_elastic(c, in->elastic));
    if (c->alg == MM_V2_ALG_HIERARCHY && hier_env <= 0) c->hier_group = mm_v2_host_group(c, ep);
    c->eL = c->L_moe;
    c->rpse = c->NS ? c->eS / c->NS : 1;
    c->shared_role = c->erank >= 0 && c->erank < c->eS;
    return MEGAMOE_OK;
}

static int mm_is_quantised_type(megamoe_dtype_t t)
{
    return t == MEGAMOE_DTYPE_INT8 || t == MEGAMOE_DTYPE_FP8_E4M3FN || t == MEGAMOE_DTYPE_FP8_E5M2;
}

static megamoe_status_t mm_v2_ids_k(mm_v2_cfg_t *c, const megamoe_tensor_t *x,
                                    const megamoe_tensor_t *ids, const char *xname,
                                    int quantised_ok)
{
    if (x->data == NULL) MM_BAD("%s is required", xname);
    if (x->ndim != 2) MM_BAD("%s must be 2-D [BS, H], got %d-D", xname, x->ndim);
    if (!mm_is_token_type(x->dtype) && !(quantised_ok && mm_is_quantised_type(x->dtype)))
        MM_BAD("%s must be bf16 or fp16%s, got %s", xname,
               quantised_ok ? " (or int8 / fp8_e4m3fn / fp8_e5m2 already quantised, with "
                              "quant_mode 0: x_dtype)" : "",
               megamoe_dtype_name(x->dtype));
    c->xtype = x->dtype;
    c->xsize = megamoe_dtype_size(x->dtype);
    c->h = x->shape[1];
    if (c->h < 1) MM_BAD("%s: H must be >= 1, got %lld", xname, (long long)c->h);
    if (ids->data == NULL) MM_BAD("expert_ids is required");
    MM_CHECK(mm_check_tensor(ids, "expert_ids", MEGAMOE_DTYPE_INT32, 2));
    c->bs = ids->shape[0];
    c->K = c->k = ids->shape[1];
    if (c->K < 1 || c->K > 16) MM_BAD("K (expert_ids dim 1) must be in [1, 16], got %lld", (long long)c->K);
    return MEGAMOE_OK;
}

static megamoe_status_t mm_v2_k_total(const mm_v2_cfg_t *c)
{
    if (c->K > c->E + c->Z + c->Cp + c->Cn)
        MM_BAD("K %lld must be <= moe_expert_num + zero + copy + const experts = %lld",
               (long long)c->K, (long long)(c->E + c->Z + c->Cp + c->Cn));
    return MEGAMOE_OK;
}

/* An x that arrives quantised (op-plugin's x_dtype: int8 / fp8, quant_mode 0) travels as is;
 * `scales` are then its dequantisation scales, one row per token, passed through into
 * dynamic_scales: fp32 [BS] per token, fp32 [BS, ceil(H/128)] per group, or e8m0 [BS,
 * align2(ceil(H/32))] MX (scales_dtype); no scales: the rows alone. */
static megamoe_status_t mm_v2_pass_config(const megamoe_dispatch_v2_args_t *a, mm_v2_cfg_t *c)
{
    if (c->quant != 0)
        MM_BAD("x is already quantised (%s): pass quant_mode=0 so it travels as is with its "
               "scales, or a bf16 / fp16 x to quantise with quant_mode %lld",
               megamoe_dtype_name(c->xtype), (long long)c->quant);
    if (a->expand_x.data != NULL && a->expand_x.dtype != c->xtype)
        MM_BAD("expand_x dtype %s must be x's dtype %s (a pre-quantised x travels as is)",
               megamoe_dtype_name(a->expand_x.dtype), megamoe_dtype_name(c->xtype));
    const megamoe_tensor_t *s = &a->scales;
    int64_t ng = mm_quant_group_count(c->h), nmx = mm_quant_mx_scale_count(c->h);
    if (s->data == NULL) {
        c->pass = MM_V2_PASS_BARE;
    } else if (s->dtype == MEGAMOE_DTYPE_FP32 && s->shape[0] == c->bs &&
               (s->ndim == 1 || (s->ndim == 2 && s->shape[1] == 1))) {
        c->pass = MM_V2_PASS_TOKEN;
    } else if (s->dtype == MEGAMOE_DTYPE_FP32 && s->ndim == 2 && s->shape[0] == c->bs &&
               s->shape[1] == ng) {
        c->pass = MM_V2_PASS_GROUP;
    } else if (s->dtype == MEGAMOE_DTYPE_E8M0 && s->ndim == 2 && s->shape[0] == c->bs &&
               s->shape[1] == nmx) {
        c->pass = MM_V2_PASS_MX;
    } else {
        MM_BAD("scales of a pre-quantised x (%s) must be its per-token scales: fp32 [BS] = [%lld], "
               "fp32 [BS, ceil(H/128)] = [%lld, %lld] or e8m0 [BS, align2(ceil(H/32))] = [%lld, "
               "%lld] (scales_dtype); got %s with %d dims", megamoe_dtype_name(c->xtype),
               (long long)c->bs, (long long)c->bs, (long long)ng, (long long)c->bs,
               (long long)nmx, megamoe_dtype_name(s->dtype), s->ndim);
    }
    if (s->data != NULL && s->dtype == MEGAMOE_DTYPE_FP32 && mm_v2_has_nan(s->data, megamoe_tensor_numel(s)))
        MM_BAD("scales contain NaN");
    const mm_v2_quant_mode_t *q = c->qmode = mm_v2_pass_mode(c->pass);
    c->ytype = c->xtype;
    c->ysize = c->xsize;
    c->row_bytes = (size_t)c->h * c->ysize;
    c->scale_elems = mm_v2_quant_scale_count(q, c->h);
    c->scale_bytes = (size_t)c->scale_elems * megamoe_dtype_size(q->scale_type);
    if (a->expert_scales.data != NULL) {
        MM_CHECK(mm_check_tensor(&a->expert_scales, "expert_scales", MEGAMOE_DTYPE_FP32, 2));
        if (a->expert_scales.shape[0] != c->bs || a->expert_scales.shape[1] != c->K)
            MM_BAD("expert_scales must be [BS, K] = [%lld, %lld]", (long long)c->bs, (long long)c->K);
        if (mm_v2_has_nan(a->expert_scales.data, c->bs * c->K)) MM_BAD("expert_scales contain NaN");
    }
    return MEGAMOE_OK;
}

megamoe_status_t mm_v2_dispatch_config(const megamoe_dispatch_v2_args_t *a, mm_v2_cfg_t *c)
{
    memset(c, 0, sizeof *c);
    c->op = MM_V2_OP_DISPATCH;
    MM_CHECK(mm_v2_ids_k(c, &a->x, &a->expert_ids, "x", 1));
    if (a->x.shape[0] != c->bs)
        MM_BAD("x has %lld rows but expert_ids has %lld (both are BS)", (long long)a->x.shape[0],
               (long long)c->bs);
    c->ent_type = (int)a->expert_token_nums_type;
    if (a->expert_token_nums_type != 0 && a->expert_token_nums_type != 1)
        MM_BAD("expert_token_nums_type must be 0 (cumulative) or 1 (counts), got %lld",
               (long long)a->expert_token_nums_type);
    mm_v2_common_t in = {a->group_ep, a->group_tp, a->ep_world_size, a->ep_rank_id,
                         a->moe_expert_num, a->tp_world_size, a->tp_rank_id,
                         a->expert_shard_type, a->shared_expert_num, a->shared_expert_rank_num,
                         a->global_bs, a->zero_expert_num, a->copy_expert_num,
                         a->const_expert_num, a->comm_alg, &a->elastic_info,
                         &a->performance_info, &a->x_active_mask};
    MM_CHECK(mm_v2_common(c, &in));
    MM_CHECK(mm_v2_k_total(c));
    /* quantisation: the mode's row of the table (v2_modes.c) */
    c->quant = a->quant_mode;
    const mm_v2_quant_mode_t *q = c->qmode = mm_v2_quant_mode(c->quant);
    if (q == NULL) {
        const mm_v2_quant_mode_t *lo = mm_v2_quant_mode_at(0), *hi = lo;
        for (size_t i = 1; mm_v2_quant_mode_at(i); i++) hi = mm_v2_quant_mode_at(i);
        MM_BAD("quant_mode %lld must be in [%lld, %lld]", (long long)c->quant,
               (long long)lo->mode, (long long)hi->mode);
    }
    if (!mm_is_token_type(c->xtype)) return mm_v2_pass_config(a, c);
    megamoe_dtype_t y = a->expand_x.dtype;
    int y_ok = q->same_as_x ? y == c->xtype
                            : (unsigned)y < 32u && (q->out_types & MM_V2_TYPE_BIT(y)) != 0;
    if (!y_ok) {
        if (a->expand_x.data != NULL) {
            char want[96];
            mm_v2_quant_out_types_text(q, want, sizeof want);
            MM_BAD("expand_x dtype %s does not fit quant_mode %lld (%s): use %s",
                   megamoe_dtype_name(y), (long long)c->quant, q->name, want);
        }
        y = q->same_as_x ? c->xtype : q->out_default;
    }
    c->ytype = y;
    c->ysize = megamoe_dtype_size(y);
    c->row_bytes = (size_t)c->h * c->ysize;
    c->scale_elems = mm_v2_quant_scale_count(q, c->h);
    c->scale_bytes = (size_t)c->scale_elems * megamoe_dtype_size(q->scale_type);
    const megamoe_tensor_t *s = &a->scales;
    if (s->data != NULL) {
        if (s->dtype != MEGAMOE_DTYPE_FP32) MM_BAD("scales must be fp32, got %s", megamoe_dtype_name(s->dtype));
        if (q->smoothing == MEGAMOE_SCALES_NONE)
            MM_BAD("scales must not be given with quant_mode %lld (%s)", (long long)c->quant,
                   q->name);
        int full = s->ndim == 2 && s->shape[0] == c->NS + c->E && s->shape[1] == c->h;
        int flat = q->flat_scales && s->ndim == 1 && (s->shape[0] == 1 || s->shape[0] == c->h);
        if (!full && !flat)
            MM_BAD("scales must be [shared_expert_num + moe_expert_num, H] = [%lld, %lld]%s",
                   (long long)(c->NS + c->E), (long long)c->h,
                   q->flat_scales ? " (or [1] / [H] with this quant_mode)" : "");
        if (mm_v2_has_nan(s->data, megamoe_tensor_numel(s))) MM_BAD("scales contain NaN");
    } else if (q->smoothing == MEGAMOE_SCALES_REQUIRED) {
        MM_BAD("quant_mode %lld (%s) needs scales", (long long)c->quant, q->name);
    }
    if (a->expert_scales.data != NULL) {
        MM_CHECK(mm_check_tensor(&a->expert_scales, "expert_scales", MEGAMOE_DTYPE_FP32, 2));
        if (a->expert_scales.shape[0] != c->bs || a->expert_scales.shape[1] != c->K)
            MM_BAD("expert_scales must be [BS, K] = [%lld, %lld]", (long long)c->bs, (long long)c->K);
        if (mm_v2_has_nan(a->expert_scales.data, c->bs * c->K)) MM_BAD("expert_scales contain NaN");
    }
    return MEGAMOE_OK;
}

megamoe_status_t mm_v2_combine_config(const megamoe_combine_v2_args_t *a, mm_v2_op_t op,
                                      mm_v2_cfg_t *c)
{
    memset(c, 0, sizeof *c);
    c->op = op;
    MM_CHECK(mm_v2_ids_k(c, &a->expand_x, &a->expert_ids, "expand_x", 0));
    c->ytype = c->xtype;
    c->ysize = c->xsize;
    mm_v2_common_t in = {a->group_ep, a->group_tp, a->ep_world_size, a->ep_rank_id,
                         a->moe_expert_num, a->tp_world_size, a->tp_rank_id,
                         a->expert_shard_type, a->shared_expert_num, a->shared_expert_rank_num,
                         a->global_bs, a->zero_expert_num, a->copy_expert_num,
                         a->const_expert_num, a->comm_alg, &a->elastic_info,
                         &a->performance_info, &a->x_active_mask};
    MM_CHECK(mm_v2_common(c, &in));
    MM_CHECK(mm_v2_k_total(c));
    c->comm_quant = a->comm_quant_mode;
    c->cqmode = mm_v2_comm_quant_mode(c->comm_quant);
    if (c->cqmode == NULL) {
        char modes[128];
        mm_v2_comm_quant_list_text(modes, sizeof modes);
        MM_BAD("comm_quant_mode must be %s, got %lld", modes, (long long)c->comm_quant);
    }
    if (a->out_dtype != 0) MM_BAD("out_dtype is reserved and must be 0");
    if (a->group_list_type != 0) MM_BAD("group_list_type is reserved and must be 0");
    if (a->activation_scale.data || a->weight_scale.data || a->group_list.data)
        MM_BAD("activation_scale, weight_scale and group_list are reserved and must be absent");
    const megamoe_tensor_t *t = &a->assist_info_for_combine;
    if (t->data == NULL) MM_BAD("assist_info_for_combine is required");
    MM_CHECK(mm_check_tensor(t, "assist_info_for_combine", MEGAMOE_DTYPE_INT32, 1));
    if (t->shape[0] < 128 * c->A)
        MM_BAD("assist_info_for_combine must have at least A * 128 = %lld elements, got %lld",
               (long long)(128 * c->A), (long long)t->shape[0]);
    if (c->alg == MM_V2_ALG_FULLMESH_A2) c->assist_off = c->bs * c->K;
    t = &a->ep_send_counts;
    if (t->data == NULL) MM_BAD("ep_send_counts is required");
    MM_CHECK(mm_check_tensor(t, "ep_send_counts", MEGAMOE_DTYPE_INT32, 1));
    if (t->shape[0] < c->n_counts)
        MM_BAD("ep_send_counts must have at least %lld elements (ep_world_size * local experts%s), "
               "got %lld", (long long)c->n_counts, c->tp == 2 ? " * 2" : "",
               (long long)t->shape[0]);
    t = &a->expert_scales;
    if (t->data == NULL) MM_BAD("expert_scales is required");
    MM_CHECK(mm_check_tensor(t, "expert_scales", MEGAMOE_DTYPE_FP32, 2));
    if (t->shape[0] != c->bs || t->shape[1] != c->K)
        MM_BAD("expert_scales must be [BS, K] = [%lld, %lld]", (long long)c->bs, (long long)c->K);
    if (mm_v2_has_nan(t->data, c->bs * c->K)) MM_BAD("expert_scales contain NaN");
    if (c->tp == 2) {
        t = &a->tp_send_counts;
        if (t->data == NULL) MM_BAD("tp_send_counts is required with tp_world_size 2");
        MM_CHECK(mm_check_tensor(t, "tp_send_counts", MEGAMOE_DTYPE_INT32, 1));
        if (t->shape[0] != 2) MM_BAD("tp_send_counts must have 2 elements");
    }
    t = &a->expand_scales;
    if (t->data != NULL) MM_CHECK(mm_check_tensor(t, "expand_scales", MEGAMOE_DTYPE_FP32, 1));
    t = &a->shared_expert_x;
    if (t->data != NULL) {
        if (c->S != 0) MM_BAD("shared_expert_x is only allowed without shared expert ranks");
        if (t->dtype != c->xtype) MM_BAD("shared_expert_x must have the dtype of expand_x");
        int ok = (t->ndim == 2 && t->shape[0] == c->bs && t->shape[1] == c->h) ||
                 (t->ndim == 3 && t->shape[0] * t->shape[1] == c->bs && t->shape[2] == c->h);
        if (!ok) MM_BAD("shared_expert_x must be [BS, H] = [%lld, %lld] or [a, b, H] with a * b = BS",
                        (long long)c->bs, (long long)c->h);
    }
    t = &a->ori_x;
    if (t->data != NULL || c->Cp + c->Cn > 0) {
        if (t->data == NULL) MM_BAD("ori_x is required with copy or const experts");
        MM_CHECK(mm_check_tensor(t, "ori_x", c->xtype, 2));
        if (t->shape[0] != c->bs || t->shape[1] != c->h)
            MM_BAD("ori_x must be [BS, H] = [%lld, %lld]", (long long)c->bs, (long long)c->h);
    }
    const megamoe_tensor_t *cv[3] = {&a->const_expert_alpha_1, &a->const_expert_alpha_2,
                                     &a->const_expert_v};
    const char *cn[3] = {"const_expert_alpha_1", "const_expert_alpha_2", "const_expert_v"};
    for (int i = 0; i < 3; i++) {
        if (cv[i]->data == NULL && c->Cn == 0) continue;
        if (cv[i]->data == NULL) MM_BAD("%s is required with const experts", cn[i]);
        MM_CHECK(mm_check_tensor(cv[i], cn[i], c->xtype, 2));
        if (cv[i]->shape[0] != c->Cn || cv[i]->shape[1] != c->h)
            MM_BAD("%s must be [const_expert_num, H] = [%lld, %lld]", cn[i], (long long)c->Cn,
                   (long long)c->h);
    }
    return MEGAMOE_OK;
}

int64_t mm_v2_active_tokens(const mm_v2_cfg_t *c, const uint8_t *mask, uint8_t *active)
{
    int64_t n = 0;
    for (int64_t t = 0; t < c->bs; t++) {
        int on = 1;
        if (c->mask_dim == 1) {
            on = mask[t] != 0;
        } else if (c->mask_dim == 2) {
            on = 0;
            for (int64_t k = 0; k < c->K; k++) on |= mask[t * c->K + k] != 0;
        }
        if (active) active[t] = (uint8_t)on;
        n += on;
    }
    return n;
}

megamoe_status_t mm_v2_check_ids_mask(const mm_v2_cfg_t *c, const megamoe_tensor_t *ids,
                                      const megamoe_tensor_t *mask, const char *op_name)
{
    if (c->erank < 0) return MEGAMOE_OK; /* removed by elastic_info: its tokens are not used */
    const int32_t *id = ids->data;
    int64_t total = c->E + c->Z + c->Cp + c->Cn;
    for (int64_t i = 0; i < c->bs * c->K; i++) {
        if (id[i] < 0 || id[i] >= total)
            MM_BAD("%s: expert_ids[%lld][%lld] = %d is out of range [0, %lld)", op_name,
                   (long long)(i / c->K), (long long)(i % c->K), id[i], (long long)total);
        if (c->scaled && id[i] >= c->eE && id[i] < c->E)
            MM_BAD("%s: expert_ids[%lld][%lld] = %d names a MoE expert of a rank removed by "
                   "elastic_info (the surviving ranks hold experts [0, %lld))", op_name,
                   (long long)(i / c->K), (long long)(i % c->K), id[i], (long long)c->eE);
    }
    /* The K MoE experts of a token must be distinct (torch_npu's rule): the receive capacity
     * A = global_bs * min(L, K) and the TP buffers assume at most one row per (token, expert),
     * so a repeated expert could overflow a rank's expand_x or its TP peer's buffer. Special
     * experts may repeat; pairs a 2-D mask disables are not sent and do not count. */
    const uint8_t *m2 = c->mask_dim == 2 ? mask->data : NULL;
    for (int64_t t = 0; t < c->bs; t++) {
        if (c->mask_dim == 1 && !((const uint8_t *)mask->data)[t]) continue;
        for (int64_t k = 1; k < c->K; k++) {
            int64_t i = t * c->K + k;
            if (id[i] >= c->E || (m2 && !m2[i])) continue;
            for (int64_t j = 0; j < k; j++)
                if (id[t * c->K + j] == id[i] && !(m2 && !m2[t * c->K + j]))
                    MM_BAD("%s: expert_ids[%lld] names MoE expert %d twice (slots %lld and %lld); "
                           "the K experts of a token must be distinct", op_name, (long long)t,
                           id[i], (long long)j, (long long)k);
        }
    }
    if (c->mask_dim == 1) {
        const uint8_t *m = mask->data;
        int seen_false = 0;
        for (int64_t t = 0; t < c->bs; t++) {
            if (!m[t]) seen_false = 1;
            else if (seen_false)
                MM_BAD("%s: a 1-D x_active_mask must have every true before the first false "
                       "(entry %lld is true after a false)", op_name, (long long)t);
        }
    }
    return MEGAMOE_OK;
}
