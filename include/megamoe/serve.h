/* megamoe — the serving MegaMoE: a symmetric buffer and one fused call (CANN's
 * get_symm_buffer_for_mega_moe + mega_moe), semantics in docs/serve.md.
 *
 * One call runs dispatch -> per-expert GMM1 -> gated activation -> GMM2 -> weighted combine
 * (plus optional shared experts on the caller's own tokens) over an expert-parallel group and
 * returns y [n, H] bf16 and expert_token_nums [L] int32. Inference only: nothing is kept
 * between calls but the buffer. Per call every rank may pass a different token count n
 * (0 included) and a different x_active_mask; every other argument must agree.
 *
 *     megamoe_symm_buffer_params_t p = megamoe_symm_buffer_params_default();
 *     p.num_experts = 64; p.num_max_tokens_per_rank = 128; p.num_topk = 8; p.hidden = 4096;
 *     megamoe_symm_buffer_create(comm, &p, &buf);                 // collective over comm
 *     megamoe_mega_moe_args_t a = megamoe_mega_moe_args_default();
 *     a.x = ...; a.topk_ids = ...; a.topk_weights = ...;          // megamoe_tensor_t
 *     a.l1_weights = (megamoe_tensor_list_t){L, w1}; a.l2_weights = (megamoe_tensor_list_t){L, w2};
 *     a.y = ...; a.expert_token_nums = ...;                       // caller-allocated outputs
 *     megamoe_mega_moe(buf, &a);                                  // collective over comm
 *     megamoe_symm_buffer_destroy(buf);                           // collective
 *
 * Scenes (docs/serve.md "Scenes"): A16W16 (bf16 weights), A8W8-INT (int8 weights with fp32
 * per-channel scales; dispatch_quant_mode 2), A8W4-INT (int4 weights, int32 carrier of 8 or
 * int8 carrier of 2 values, with scales and biases), the Ascend 950 MX scenes A8W8-FP, A8W4-FP,
 * A4W4-FP (fp8 / fp4 weights with e8m0 block scales; dispatch_quant_mode 4), each for the
 * routed and, independently, the shared experts.
 *
 * Errors: every argument problem of any rank is INVALID_ARGUMENT on every rank of the call,
 * before any data moves (the message names the argument and the rule; on the other ranks it
 * is prefixed "rank R:"), and the buffer stays usable. Calls made in a different order on
 * different ranks are CALL_MISMATCH everywhere (docs/ops.md "Call order").
 */
#ifndef MEGAMOE_SERVE_H
#define MEGAMOE_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/comm.h"
#include "megamoe/dtype.h"
#include "megamoe/export.h"
#include "megamoe/ops.h"
#include "megamoe/status.h"

#ifdef __cplusplus
extern "C" {
#endif
MEGAMOE_API_BEGIN

/* Logical element types of weights and quantised activations. The carrier tensor's dtype
 * says how they are stored (int4: int32 holding 8 or int8 holding 2 values; fp8: uint8 bytes
 * or MEGAMOE_DTYPE_FP8_*; fp4: uint8 holding 2 values). NONE = from the carrier's dtype. */
typedef enum megamoe_serve_type {
    MEGAMOE_SERVE_TYPE_NONE = 0,
    MEGAMOE_SERVE_TYPE_BF16 = 1,
    MEGAMOE_SERVE_TYPE_INT8 = 2,
    MEGAMOE_SERVE_TYPE_INT4 = 3,
    MEGAMOE_SERVE_TYPE_FP8_E4M3FN = 4,
    MEGAMOE_SERVE_TYPE_FP8_E5M2 = 5,
    MEGAMOE_SERVE_TYPE_FP4_E2M1 = 6,
    MEGAMOE_SERVE_TYPE_COUNT_ = 7
} megamoe_serve_type_t;

/* "none", "bf16", "int8", "int4", "fp8_e4m3fn", "fp8_e5m2", "fp4_e2m1"; "unknown" otherwise. */
const char *megamoe_serve_type_name(int type);

/* ---- the symmetric buffer (CANN's SymmBuffer) ------------------------------------------- */

typedef struct megamoe_symm_buffer megamoe_symm_buffer_t;

typedef struct megamoe_symm_buffer_params {
    size_t struct_size; /* set by megamoe_symm_buffer_params_default(): the caller's sizeof (megamoe/version.h) */
    int64_t num_experts;             /* E > 0, a multiple of the group size W */
    int64_t num_max_tokens_per_rank; /* >= 0: bound on n of every call; 0 = no bound */
    int64_t num_topk;                /* K >= 1 */
    int64_t hidden;                  /* H >= 1 */
    int64_t intermediate_hidden;     /* >= 0, informational (I is read from the weights) */
    int64_t max_recv_token_num;      /* >= 0: rows one rank may receive per call; 0 =
                                        num_max_tokens_per_rank * W * min(K, E / W) (a call
                                        needing more is INVALID_ARGUMENT on every rank) */
    int64_t dispatch_quant_mode;     /* 0 none, 2 per-token int8, 4 MX; re-settable
                                        (megamoe_symm_buffer_set_quant) */
    int dispatch_quant_out_dtype;    /* megamoe_serve_type_t: NONE, INT8, FP8_*, FP4_E2M1 */
    int64_t combine_quant_mode;      /* 0; 3 / 4 (MX fp8 e5m2 / e4m3fn on the combine wire) */
    const char *comm_alg;            /* NULL or "" only */
    int64_t combine_comm_mode;       /* 0 or 1 (accepted; the result is the same) */
    int64_t topk_weights_type;       /* 0 or 1 (accepted; a transport choice) */
} megamoe_symm_buffer_params_t;

/* All fields zero (the shapes must be set). */
megamoe_status_t megamoe_symm_buffer_params_init(megamoe_symm_buffer_params_t *p, size_t struct_size);
static inline megamoe_symm_buffer_params_t megamoe_symm_buffer_params_default(void)
{
    megamoe_symm_buffer_params_t v;
    megamoe_symm_buffer_params_init(&v, sizeof v);
    return v;
}

/* Collective over the members of group: validate params (INVALID_ARGUMENT naming the rule),
 * compare them across the members (INVALID_ARGUMENT naming the field and the ranks when they
 * differ) and allocate the buffer's symmetric memory on the group. group must outlive the
 * buffer (or megamoe_symm_buffer_update_group must move it first). Ranks outside group never
 * take part. */
megamoe_status_t megamoe_symm_buffer_create(megamoe_comm_t *group,
                                            const megamoe_symm_buffer_params_t *params,
                                            megamoe_symm_buffer_t **buffer_p);

/* Collective over the buffer's group: free the symmetric memory. A destroyed buffer keeps its
 * handle (later calls are INVALID_ARGUMENT "destroyed") until megamoe_symm_buffer_free. A
 * second destroy is a local no-op. Destroying the group's communicator also destroys it. */
megamoe_status_t megamoe_symm_buffer_destroy(megamoe_symm_buffer_t *buffer);
/* Free the handle (local; destroys nothing: call destroy first). NULL is a no-op. */
void megamoe_symm_buffer_free(megamoe_symm_buffer_t *buffer);

/* Re-assign the quantisation attributes later calls use (local, like CANN's plain attributes:
 * every rank must make the same assignment; the next call checks). */
megamoe_status_t megamoe_symm_buffer_set_quant(megamoe_symm_buffer_t *buffer,
                                               int64_t dispatch_quant_mode,
                                               int dispatch_quant_out_dtype);

/* Collective over the members of the new group (same size W, else INVALID_ARGUMENT): the
 * buffer moves to it, with fresh symmetric memory when the members differ. The mask stays. */
megamoe_status_t megamoe_symm_buffer_update_group(megamoe_symm_buffer_t *buffer,
                                                  megamoe_comm_t *group);

typedef struct megamoe_symm_buffer_info {
    int rank, world_size;           /* in the group */
    int ranks_per_host;             /* members on this rank's host */
    int alive;                      /* 0 after destroy (or the group's destruction) */
    megamoe_symm_buffer_params_t params; /* as created (quant attributes: current values) */
    int64_t local_experts;          /* L = E / W */
    int64_t max_recv_rows;          /* the receive capacity in rows (resolved) */
    size_t symmetric_bytes;         /* bytes of symmetric memory the buffer holds per rank */
    size_t local_bytes;             /* bytes of megamoe_symm_buffer_local's region */
    uint64_t calls;                 /* mega_moe calls that ran on this rank */
    int64_t last_recv_rows;         /* rows this rank received in the last call (-1: none) */
    uint64_t id;                    /* the buffer's number (equal on every member) */
    uint64_t o1_calls;              /* calls that ran on the O1 executor (the rest: host path) */
} megamoe_symm_buffer_info_t;

/* Filled by the library: the caller's sizeof travels with the call (megamoe/version.h). */
megamoe_status_t megamoe_symm_buffer_get_info_sized(const megamoe_symm_buffer_t *buffer,
                                                    megamoe_symm_buffer_info_t *info_p,
                                                    size_t info_size);
#define megamoe_symm_buffer_get_info(buffer, info_p)                                        \
    megamoe_symm_buffer_get_info_sized((buffer), (info_p), sizeof *(info_p))

/* This rank's part of the symmetric memory as plain bytes (CANN's get_local_buffer_tensor):
 * valid until destroy / update_group; mega_moe calls overwrite it. */
megamoe_status_t megamoe_symm_buffer_local(megamoe_symm_buffer_t *buffer, void **ptr_p,
                                           size_t *bytes_p);

/* The rank mask: int32 [W], 1 = rank disabled (it does not call; pairs routed to its experts
 * contribute nothing and are not counted; the call is collective over the unmasked ranks).
 * Local to this process: every unmasked rank must hold the same mask. The mask exists from
 * the first of these calls (all zero); *mask_p points at the buffer's own array. */
megamoe_status_t megamoe_symm_buffer_mask(megamoe_symm_buffer_t *buffer, int32_t **mask_p);
megamoe_status_t megamoe_symm_buffer_mask_set(megamoe_symm_buffer_t *buffer, int rank,
                                              int masked);
megamoe_status_t megamoe_symm_buffer_mask_clear(megamoe_symm_buffer_t *buffer);

/* ---- the call --------------------------------------------------------------------------- */

typedef struct megamoe_tensor_list {
    int64_t count;                  /* 0: absent (also when every entry is empty) */
    const megamoe_tensor_t *items;
} megamoe_tensor_list_t;

/* activation_params_set bits */
#define MEGAMOE_ACT_ALPHA 1       /* swigluoai */
#define MEGAMOE_ACT_BETA 2        /* swigluoai, situglu */
#define MEGAMOE_ACT_LINEAR_BETA 4 /* situglu */

typedef struct megamoe_mega_moe_args {
    size_t struct_size; /* set by megamoe_mega_moe_args_default(): the caller's sizeof (megamoe/version.h) */
    megamoe_tensor_t x;            /* bf16 [n, H], n >= 0 */
    megamoe_tensor_t topk_ids;     /* int32 or int64 [n, K] */
    megamoe_tensor_t topk_weights; /* fp32 or bf16 [n, K], used as given */
    /* routed experts of this rank: L 2-D tensors, or one 3-D tensor with dim0 L.
     * bf16/int8/int4: [in, out] = (H, 2I) and (I, H); fp8/fp4: [out, in] = (2I, H), (H, I) */
    megamoe_tensor_list_t l1_weights, l2_weights;
    megamoe_tensor_list_t l1_weights_sf, l2_weights_sf; /* scales (quantised weights) */
    megamoe_tensor_list_t l1_bias, l2_bias;             /* fp32, A8W4-INT only */
    megamoe_tensor_t x_active_mask; /* int8 / bool [n] or absent: non-zero = active */
    megamoe_tensor_t scales;        /* pass-through only (must be absent) */
    const char *activation;         /* NULL = "swiglu"; "swiglustep", "swigluoai", "situglu"
                                       (aliases "situ", "swiglu_gpt_oss") */
    double activation_clamp;        /* 0 = none; else > 0 */
    int activation_params_set;      /* MEGAMOE_ACT_* bits of the values given below */
    double alpha, beta, linear_beta;
    int weight1_type, weight2_type; /* megamoe_serve_type_t; NONE = from the dtype */
    /* shared experts on this rank's own tokens (count 0: none) */
    megamoe_tensor_list_t shared_l1_weights, shared_l2_weights;
    megamoe_tensor_list_t shared_l1_weights_sf, shared_l2_weights_sf;
    megamoe_tensor_list_t shared_l1_bias, shared_l2_bias; /* must be absent */
    int shared_expert_quant_out_dtype; /* NONE = as routed */
    int shared_weight1_type, shared_weight2_type;
    /* outputs */
    megamoe_tensor_t y;                 /* bf16 [n, H] */
    megamoe_tensor_t expert_token_nums; /* int32 [L] */
    /* the caller's counter for the weights' values: the library keeps packed copies of the
     * weights between calls (keyed by address, shape and this version, guarded by a sample of
     * the bytes); change it when a weight is modified in place (Python: from the tensors'
     * version counters). */
    uint64_t weights_version;
} megamoe_mega_moe_args_t;

/* Every tensor absent, activation NULL ("swiglu"), no clamp or parameters, types NONE. */
megamoe_status_t megamoe_mega_moe_args_init(megamoe_mega_moe_args_t *p, size_t struct_size);
static inline megamoe_mega_moe_args_t megamoe_mega_moe_args_default(void)
{
    megamoe_mega_moe_args_t v;
    megamoe_mega_moe_args_init(&v, sizeof v);
    return v;
}

/* Collective over the buffer's group (its unmasked ranks). */
megamoe_status_t megamoe_mega_moe(megamoe_symm_buffer_t *buffer, const megamoe_mega_moe_args_t *args);

/* The process-wide cache of packed expert weights (MEGAMOE_SERVE_WEIGHT_CACHE bounds it):
 * its bytes, and the lookups that found / (re)packed a weight. Clear drops every copy (local;
 * not during a call). */
void megamoe_serve_weight_cache_info(size_t *bytes_p, uint64_t *hits_p, uint64_t *misses_p);
void megamoe_serve_weight_cache_clear(void);


MEGAMOE_API_END
#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_SERVE_H */
