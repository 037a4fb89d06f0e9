/* megamoe — MoeDistributeDispatchV2 / MoeDistributeCombineV2 / MoeDistributeCombineAddRmsNorm
 * on CPUs (the Ascend A3 operators; semantics in docs/ops.md).
 *
 * Tensors are described by megamoe_tensor_t (contiguous, row-major; data == NULL means the
 * optional input is absent). Outputs are caller-allocated; megamoe_*_infer() fills the output
 * descriptors (dtype, shape) the way torch_npu allocates them, so a caller can
 *     args = megamoe_dispatch_v2_args_default(); ...set inputs and attributes...
 *     megamoe_dispatch_v2_infer(&args);        // output dtypes and shapes
 *     ...allocate args.expand_x.data etc. with those shapes...
 *     megamoe_dispatch_v2(&args);
 * Outputs are written only on success. Regions the device leaves unwritten (rows past the
 * received total, unused assist entries, tokens a mask excludes from combine, ...) are zeroed
 * unless zero_fill is 0 (then they keep their previous contents, as on the device).
 *
 * Collective rules: every rank of the EP group (and of the TP group) calls the operator with
 * the same attributes; because the runtime's symmetric memory is allocated collectively over
 * the WORLD, every rank of the world calls the operators in the same order (ranks that an
 * elastic_info marks as removed call too; they send and receive nothing). Invalid arguments
 * give INVALID_ARGUMENT on the rank that passed them and the same status (message prefixed
 * "rank R:") on every other rank, before any data moves; attributes that differ between ranks
 * give CONFIG_MISMATCH on all ranks.
 */
#ifndef MEGAMOE_OPS_H
#define MEGAMOE_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/comm.h"
#include "megamoe/dtype.h"
#include "megamoe/export.h"
#include "megamoe/status.h"

#ifdef __cplusplus
extern "C" {
#endif
MEGAMOE_API_BEGIN

#define MEGAMOE_TENSOR_MAX_DIMS 4

typedef struct megamoe_tensor {
    void *data;              /* NULL: absent (optional inputs) */
    megamoe_dtype_t dtype;   /* element type; fp8/e8m0 tensors are byte arrays of that type */
    int ndim;                /* 0..MEGAMOE_TENSOR_MAX_DIMS */
    int64_t shape[MEGAMOE_TENSOR_MAX_DIMS];
} megamoe_tensor_t;

/* An absent tensor (data NULL, ndim 0). */
megamoe_tensor_t megamoe_tensor_none(void);
/* Element count (product of the shape; 1 for ndim 0). */
int64_t megamoe_tensor_numel(const megamoe_tensor_t *tensor);

/* ---- MoeDistributeDispatchV2 ------------------------------------------------------------ *
 * The three args structs are extensible (megamoe/version.h): start from *_default(). */

typedef struct megamoe_dispatch_v2_args {
    size_t struct_size; /* set by megamoe_dispatch_v2_args_default(): the caller's sizeof (megamoe/version.h) */
    /* inputs */
    megamoe_tensor_t x;                /* [BS, H] bf16 | fp16 */
    megamoe_tensor_t expert_ids;       /* [BS, K] int32 */
    megamoe_tensor_t scales;           /* optional fp32 smoothing scales [NS + E, H]; quant_mode 1
                                          also accepts [1] or [H] */
    megamoe_tensor_t x_active_mask;    /* optional bool: [BS] (true prefix) or [BS, K] */
    megamoe_tensor_t expert_scales;    /* optional fp32 [BS, K]: gives expand_scales */
    megamoe_tensor_t elastic_info;     /* optional int32 [4 + 2 * ep_world_size] */
    megamoe_tensor_t performance_info; /* optional int64 [ep_world_size]: += wait per source, us */
    /* attributes */
    megamoe_comm_t *group_ep;
    int64_t ep_world_size, ep_rank_id, moe_expert_num;
    megamoe_comm_t *group_tp;          /* required when tp_world_size == 2 */
    int64_t tp_world_size, tp_rank_id;
    int64_t expert_shard_type, shared_expert_num, shared_expert_rank_num;
    int64_t quant_mode;                /* 0 none, 1 static, 2 per-token, 3 per-group, 4 MX */
    int64_t global_bs, expert_token_nums_type;
    const char *comm_alg;              /* "", "fullmesh_v1", "fullmesh_v2", "hierarchy" */
    int64_t zero_expert_num, copy_expert_num, const_expert_num;
    /* outputs (expand_x.dtype selects the quantised type: int8, fp8_e4m3fn, fp8_e5m2) */
    megamoe_tensor_t expand_x;                /* [T*A, H] */
    megamoe_tensor_t dynamic_scales;          /* fp32 [T*A] (mode 3: [T*A, G128]; mode 4 e8m0) */
    megamoe_tensor_t assist_info_for_combine; /* int32 [max(BS*K, 128*A)] */
    megamoe_tensor_t expert_token_nums;       /* int64 [local experts] */
    megamoe_tensor_t ep_recv_counts;          /* int32 [W * L * (tp == 2 ? 2 : 1)] */
    megamoe_tensor_t tp_recv_counts;          /* int32 [tp_world_size] */
    megamoe_tensor_t expand_scales;           /* fp32 [A] */
    int zero_fill;                            /* 1 (default): zero unwritten output regions */
} megamoe_dispatch_v2_args_t;

megamoe_status_t megamoe_dispatch_v2_args_init(megamoe_dispatch_v2_args_t *p, size_t struct_size);
static inline megamoe_dispatch_v2_args_t megamoe_dispatch_v2_args_default(void)
{
    megamoe_dispatch_v2_args_t v;
    megamoe_dispatch_v2_args_init(&v, sizeof v);
    return v;
}
/* Fill the output descriptors (dtype, ndim, shape; data untouched) from the inputs and
 * attributes. expand_x.dtype is kept when it is a valid quantised type for quant_mode, else set
 * to the default (x dtype for mode 0, int8 for 1-2, fp8_e4m3fn for 3-4). Local checks only. */
megamoe_status_t megamoe_dispatch_v2_infer(megamoe_dispatch_v2_args_t *args);
/* Collective over the EP group (and TP group); see the rules above. */
megamoe_status_t megamoe_dispatch_v2(const megamoe_dispatch_v2_args_t *args);

/* ---- MoeDistributeCombineV2 ------------------------------------------------------------- */

typedef struct megamoe_combine_v2_args {
    size_t struct_size; /* set by megamoe_combine_v2_args_default(): the caller's sizeof (megamoe/version.h) */
    /* inputs */
    megamoe_tensor_t expand_x;                /* [T*A, H] bf16 | fp16 (expert outputs) */
    megamoe_tensor_t expert_ids;              /* [BS, K] int32 */
    megamoe_tensor_t assist_info_for_combine; /* int32, from dispatch */
    megamoe_tensor_t ep_send_counts;          /* int32, dispatch's ep_recv_counts */
    megamoe_tensor_t expert_scales;           /* fp32 [BS, K] */
    megamoe_tensor_t tp_send_counts;          /* int32 [2] when tp_world_size == 2 */
    megamoe_tensor_t x_active_mask;           /* optional bool [BS] or [BS, K] */
    megamoe_tensor_t expand_scales;           /* optional fp32 [A] (accepted, not needed) */
    megamoe_tensor_t shared_expert_x;         /* optional [BS, H] or [a, b, H] with a*b = BS */
    megamoe_tensor_t elastic_info;            /* optional int32 [4 + 2W] */
    megamoe_tensor_t ori_x;                   /* [BS, H]; required with copy/const experts */
    megamoe_tensor_t const_expert_alpha_1;    /* [Cn, H]; required with const experts */
    megamoe_tensor_t const_expert_alpha_2;    /* [Cn, H] */
    megamoe_tensor_t const_expert_v;          /* [Cn, H] */
    megamoe_tensor_t performance_info;        /* optional int64 [W] */
    megamoe_tensor_t activation_scale, weight_scale, group_list; /* reserved: must be absent */
    /* attributes */
    megamoe_comm_t *group_ep;
    int64_t ep_world_size, ep_rank_id, moe_expert_num;
    megamoe_comm_t *group_tp;
    int64_t tp_world_size, tp_rank_id;
    int64_t expert_shard_type, shared_expert_num, shared_expert_rank_num, global_bs;
    int64_t out_dtype, comm_quant_mode, group_list_type; /* out_dtype, group_list_type: 0 */
    /* comm_quant_mode: 0 rows travel as expand_x; 2 int8 + XType scale per 8 elements; 3 / 4 MX
     * fp8_e5m2 / fp8_e4m3fn + E8M0 scale per 32 elements (dequantised to fp32, Ascend 950) */
    const char *comm_alg;
    int64_t zero_expert_num, copy_expert_num, const_expert_num;
    /* output */
    megamoe_tensor_t x; /* [BS, H], dtype of expand_x */
    int zero_fill;      /* 1 (default): zero rows of tokens that are not processed */
} megamoe_combine_v2_args_t;

megamoe_status_t megamoe_combine_v2_args_init(megamoe_combine_v2_args_t *p, size_t struct_size);
static inline megamoe_combine_v2_args_t megamoe_combine_v2_args_default(void)
{
    megamoe_combine_v2_args_t v;
    megamoe_combine_v2_args_init(&v, sizeof v);
    return v;
}
megamoe_status_t megamoe_combine_v2_infer(megamoe_combine_v2_args_t *args);
megamoe_status_t megamoe_combine_v2(const megamoe_combine_v2_args_t *args);

/* ---- MoeDistributeCombineAddRmsNorm ----------------------------------------------------- */

typedef struct megamoe_combine_add_rms_norm_args {
    size_t struct_size; /* set by megamoe_combine_add_rms_norm_args_default(): the caller's sizeof (megamoe/version.h) */
    megamoe_combine_v2_args_t combine; /* its output x is the add result ("x" output); the
                                          fields below start at its struct_size */
    megamoe_tensor_t residual_x;       /* [BS, 1, H], dtype of expand_x */
    megamoe_tensor_t gamma;            /* [H], dtype of expand_x */
    double norm_eps;                   /* 1e-6 */
    megamoe_tensor_t y;                /* output [BS, 1, H] */
    megamoe_tensor_t rstd;             /* output fp32 [BS, 1, 1] */
} megamoe_combine_add_rms_norm_args_t;

/* combine_size: sizeof p->combine as the caller was compiled (the embedded struct grows too). */
megamoe_status_t megamoe_combine_add_rms_norm_args_init(megamoe_combine_add_rms_norm_args_t *p,
                                                        size_t struct_size, size_t combine_size);
static inline megamoe_combine_add_rms_norm_args_t megamoe_combine_add_rms_norm_args_default(void)
{
    megamoe_combine_add_rms_norm_args_t v;
    megamoe_combine_add_rms_norm_args_init(&v, sizeof v, sizeof v.combine);
    return v;
}
megamoe_status_t megamoe_combine_add_rms_norm_infer(megamoe_combine_add_rms_norm_args_t *args);
megamoe_status_t megamoe_combine_add_rms_norm(const megamoe_combine_add_rms_norm_args_t *args);

/* Free the operators' symmetric workspaces now (collective over the world, like every
 * operator call). Optional: destroying the last communicator frees them itself. */
megamoe_status_t megamoe_ops_release(void);

/* ---- quantisation modes ----------------------------------------------------------------- */

/* How a mode treats the smoothing scales tensor (dispatch's scales). */
enum { MEGAMOE_SCALES_NONE = 0, MEGAMOE_SCALES_OPTIONAL = 1, MEGAMOE_SCALES_REQUIRED = 2 };
/* Which table megamoe_quant_mode_info() reads. */
enum { MEGAMOE_QUANT_DISPATCH = 0, MEGAMOE_QUANT_COMBINE = 1 };

/* One quantisation mode as the operators implement it (the same table their validation and
 * data paths use; docs/v2_spec.md §4, §5.2). */
typedef struct megamoe_quant_mode_info {
    int64_t mode;              /* the quant_mode / comm_quant_mode value */
    const char *name;          /* "none", "static", "per_token", "per_group", "mx"; combine:
                                  "none", "int8", "mx_fp8_e5m2", "mx_fp8_e4m3fn" */
    int same_as_input;         /* the data keep the token's dtype (no quantisation) */
    uint32_t out_dtypes;       /* else bit (1 << megamoe_dtype_t) per accepted expand_x dtype
                                  (dispatch) / the wire dtype (combine) */
    int64_t scale_group;       /* elements per scale: 0 none, -1 one per row */
    megamoe_dtype_t scale_dtype; /* of the scales (FP32, E8M0), unless scale_same_as_input */
    int scale_same_as_input;   /* the scales have the token's dtype (combine int8) */
    int smoothing;             /* dispatch: MEGAMOE_SCALES_*; combine: MEGAMOE_SCALES_NONE */
} megamoe_quant_mode_info_t;

/* Entry index of table `which` (MEGAMOE_QUANT_DISPATCH / _COMBINE); NOT_FOUND past the end. */
megamoe_status_t megamoe_quant_mode_info(int which, int index, megamoe_quant_mode_info_t *info);

/* The structs of this header, for bindings that mirror them (ctypes). */
typedef enum megamoe_ops_struct {
    MEGAMOE_OPS_STRUCT_TENSOR = 0,           /* megamoe_tensor_t */
    MEGAMOE_OPS_STRUCT_DISPATCH_V2 = 1,      /* megamoe_dispatch_v2_args_t */
    MEGAMOE_OPS_STRUCT_COMBINE_V2 = 2,       /* megamoe_combine_v2_args_t */
    MEGAMOE_OPS_STRUCT_ADD_RMS_NORM = 3,     /* megamoe_combine_add_rms_norm_args_t */
    MEGAMOE_OPS_STRUCT_QUANT_MODE_INFO = 4,  /* megamoe_quant_mode_info_t */
} megamoe_ops_struct_t;
/* sizeof() of one of them; -1 for a value that names none. */
int64_t megamoe_ops_struct_size(megamoe_ops_struct_t which);

MEGAMOE_API_END
#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_OPS_H */
