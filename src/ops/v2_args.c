/* Argument structs of the v2 operators: defaults, tensor helpers, output shape inference. */
#include <string.h>

#include "megamoe/ops.h"
#include "megamoe/version.h"

#include "base/abi.h"
#include "base/alloc.h"
#include "base/error.h"
#include "v2_internal.h"

/* One grow-only buffer per operator kind, kept between calls (calls do not overlap): the
 * per-call state then costs no allocation, page faults or kernel zeroing. */
static struct {
    uint8_t *base;
    size_t size;
} mm_v2_scratch_cache[MM_V2_WS_COUNT];

megamoe_status_t mm_v2_scratch_init(mm_v2_scratch_t *s, mm_v2_ws_kind_t kind, size_t bytes)
{
    s->used = 0;
    s->size = 0;
    s->base = NULL;
    bytes = bytes ? bytes : 64;
    if (mm_v2_scratch_cache[kind].size < bytes) {
        mm_aligned_free(mm_v2_scratch_cache[kind].base);
        mm_v2_scratch_cache[kind].base = NULL;
        mm_v2_scratch_cache[kind].size = 0;
        void *p = NULL;
        MM_CHECK(mm_aligned_alloc(bytes, 64, "operator scratch", &p));
        mm_v2_scratch_cache[kind].base = p;
        mm_v2_scratch_cache[kind].size = bytes;
    }
    s->base = mm_v2_scratch_cache[kind].base;
    s->size = bytes;
    return MEGAMOE_OK;
}

void *mm_v2_scratch_take(mm_v2_scratch_t *s, size_t n)
{
    size_t k = mm_v2_piece(n);
    if (s->base == NULL || s->used + k > s->size) return NULL; /* a reservation bug */
    void *p = s->base + s->used;
    s->used += k;
    memset(p, 0, n);
    return p;
}

void mm_v2_scratch_free(mm_v2_scratch_t *s)
{
    s->base = NULL; /* the buffer stays cached */
}

void mm_v2_scratch_release(void)
{
    for (int k = 0; k < MM_V2_WS_COUNT; k++) {
        mm_aligned_free(mm_v2_scratch_cache[k].base);
        mm_v2_scratch_cache[k].base = NULL;
        mm_v2_scratch_cache[k].size = 0;
    }
}

megamoe_tensor_t megamoe_tensor_none(void)
{
    megamoe_tensor_t t;
    memset(&t, 0, sizeof t);
    t.dtype = MEGAMOE_DTYPE_FP32;
    return t;
}

int64_t megamoe_tensor_numel(const megamoe_tensor_t *tensor)
{
    int64_t n = 1;
    for (int i = 0; i < tensor->ndim && i < MEGAMOE_TENSOR_MAX_DIMS; i++) n *= tensor->shape[i];
    return n;
}

megamoe_tensor_t mm_v2_tensor(megamoe_dtype_t dtype, int ndim, int64_t d0, int64_t d1, int64_t d2)
{
    megamoe_tensor_t t = megamoe_tensor_none();
    t.dtype = dtype;
    t.ndim = ndim;
    t.shape[0] = d0;
    t.shape[1] = d1;
    t.shape[2] = d2;
    return t;
}

megamoe_status_t megamoe_dispatch_v2_args_init(megamoe_dispatch_v2_args_t *p, size_t struct_size)
{
    megamoe_dispatch_v2_args_t a;
    memset(&a, 0, sizeof a);
    megamoe_tensor_t none = megamoe_tensor_none();
    a.x = a.expert_ids = a.scales = a.x_active_mask = a.expert_scales = none;
    a.elastic_info = a.performance_info = none;
    a.expand_x = a.dynamic_scales = a.assist_info_for_combine = a.expert_token_nums = none;
    a.ep_recv_counts = a.tp_recv_counts = a.expand_scales = none;
    a.shared_expert_num = 1; /* torch_npu default; normalised to 0 when no shared ranks */
    a.expert_token_nums_type = 1;
    a.comm_alg = "";
    a.zero_fill = 1;
    return mm_abi_init(p, struct_size, &a, sizeof a, "megamoe_dispatch_v2_args_t");
}

/* The library's defaults of the combine args (the embedded copy of add_rms_norm's too). */
static megamoe_combine_v2_args_t mm_v2_combine_defaults(void)
{
    megamoe_combine_v2_args_t a;
    memset(&a, 0, sizeof a);
    megamoe_tensor_t none = megamoe_tensor_none();
    a.expand_x = a.expert_ids = a.assist_info_for_combine = a.ep_send_counts = none;
    a.expert_scales = a.tp_send_counts = a.x_active_mask = a.expand_scales = none;
    a.shared_expert_x = a.elastic_info = a.ori_x = none;
    a.const_expert_alpha_1 = a.const_expert_alpha_2 = a.const_expert_v = none;
    a.performance_info = a.activation_scale = a.weight_scale = a.group_list = none;
    a.x = none;
    a.shared_expert_num = 1;
    a.comm_alg = "";
    a.zero_fill = 1;
    a.struct_size = sizeof a;
    return a;
}

megamoe_status_t megamoe_combine_v2_args_init(megamoe_combine_v2_args_t *p, size_t struct_size)
{
    megamoe_combine_v2_args_t a = mm_v2_combine_defaults();
    return mm_abi_init(p, struct_size, &a, sizeof a, "megamoe_combine_v2_args_t");
}

/* ---- add_rms_norm args: the embedded combine args grow too ------------------------------ *
 * In the caller's layout the fields after `combine` start at offsetof(combine) plus the
 * caller's sizeof(combine) (its struct_size; both are multiples of 8), and its own part may
 * be shorter (older caller) or longer (newer) than the library's. */
typedef megamoe_combine_add_rms_norm_args_t mm_arn_t;
#define MM_ARN_OWN offsetof(mm_arn_t, residual_x)
_Static_assert(offsetof(mm_arn_t, residual_x) ==
                   offsetof(mm_arn_t, combine) + sizeof(megamoe_combine_v2_args_t),
               "add_rms_norm's own fields follow the embedded combine args");
/* bytes of the own part at ABI 2 (the minimum a caller passes) */
#define MM_ARN_OWN_MIN (MM_ABI_END(mm_arn_t, rstd) - MM_ARN_OWN)

static mm_arn_t mm_v2_arn_defaults(void)
{
    mm_arn_t a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.combine = mm_v2_combine_defaults();
    a.residual_x = a.gamma = a.y = a.rstd = megamoe_tensor_none();
    a.norm_eps = 1e-6;
    return a;
}

megamoe_status_t megamoe_combine_add_rms_norm_args_init(mm_arn_t *p, size_t struct_size,
                                                        size_t combine_size)
{
    const char *fn = "megamoe_combine_add_rms_norm_args_init";
    const size_t cmin = (size_t)megamoe_struct_min_size("megamoe_combine_v2_args_t");
    if (p == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: NULL struct", fn);
    if (combine_size < cmin || combine_size % 8 != 0 || combine_size > ((size_t)1 << 20) ||
        struct_size < MM_ARN_OWN + combine_size - sizeof(megamoe_combine_v2_args_t) +
                          MM_ARN_OWN_MIN ||
        struct_size > ((size_t)1 << 20))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: struct_size %zu / combine_size %zu are not sizes of this struct: "
                        "pass sizeof *p and sizeof p->combine", fn, struct_size, combine_size);
    const mm_arn_t d = mm_v2_arn_defaults();
    const size_t off = offsetof(mm_arn_t, combine) + combine_size; /* the caller's own part */
    memset(p, 0, struct_size);
    p->struct_size = struct_size;
    MM_CHECK(megamoe_combine_v2_args_init(&p->combine, combine_size));
    const size_t own = struct_size - off, lib_own = sizeof d - MM_ARN_OWN;
    memcpy((char *)p + off, (const char *)&d + MM_ARN_OWN, own < lib_own ? own : lib_own);
    return MEGAMOE_OK;
}

/* *dst <- the caller's args (version.h); *own_off_p: where the caller's own part starts. */
static megamoe_status_t mm_v2_arn_in(mm_arn_t *dst, const mm_arn_t *src, size_t *own_off_p)
{
    const char *what = "megamoe_combine_add_rms_norm_args_t";
    *dst = mm_v2_arn_defaults();
    size_t size;
    memcpy(&size, src, sizeof size);
    if (size < MM_ARN_OWN + MM_ARN_OWN_MIN || size > ((size_t)1 << 20))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s.struct_size is %zu: initialise it with "
                        "megamoe_combine_add_rms_norm_args_default() (struct_size = sizeof)",
                        what, size);
    MM_CHECK(mm_abi_copy_in(&dst->combine, sizeof dst->combine, &src->combine,
                            "megamoe_combine_v2_args_t"));
    const size_t off = offsetof(mm_arn_t, combine) + src->combine.struct_size;
    if (src->combine.struct_size % 8 != 0 || size < off)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: struct_size %zu does not hold its combine args (struct_size %zu): "
                        "initialise it with megamoe_combine_add_rms_norm_args_default()", what,
                        size, src->combine.struct_size);
    MM_CHECK(mm_abi_copy_part_in((char *)dst + MM_ARN_OWN, sizeof *dst - MM_ARN_OWN,
                                 (const char *)src + off, size - off, MM_ARN_OWN_MIN, what));
    *own_off_p = off;
    return MEGAMOE_OK;
}

megamoe_status_t mm_v2_arn_copy_in(mm_arn_t *dst, const mm_arn_t *src)
{
    size_t off;
    return mm_v2_arn_in(dst, src, &off);
}

int64_t megamoe_ops_struct_size(megamoe_ops_struct_t which)
{
    switch (which) {
    case MEGAMOE_OPS_STRUCT_TENSOR: return (int64_t)sizeof(megamoe_tensor_t);
    case MEGAMOE_OPS_STRUCT_DISPATCH_V2: return (int64_t)sizeof(megamoe_dispatch_v2_args_t);
    case MEGAMOE_OPS_STRUCT_COMBINE_V2: return (int64_t)sizeof(megamoe_combine_v2_args_t);
    case MEGAMOE_OPS_STRUCT_ADD_RMS_NORM:
        return (int64_t)sizeof(megamoe_combine_add_rms_norm_args_t);
    case MEGAMOE_OPS_STRUCT_QUANT_MODE_INFO: return (int64_t)sizeof(megamoe_quant_mode_info_t);
    }
    return -1;
}

megamoe_status_t mm_v2_check_out(const megamoe_tensor_t *got, const megamoe_tensor_t *want,
                                 const char *name, int dim0_at_least)
{
    if (got->data == NULL && megamoe_tensor_numel(want) > 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "output %s is missing (data is NULL); allocate "
                        "it with the shape megamoe_*_infer() reports", name);
    if (got->dtype != want->dtype)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "output %s has dtype %s, expected %s", name,
                        megamoe_dtype_name(got->dtype), megamoe_dtype_name(want->dtype));
    if (got->ndim != want->ndim)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "output %s has %d dimensions, expected %d", name,
                        got->ndim, want->ndim);
    for (int i = 0; i < want->ndim; i++) {
        int ok = (i == 0 && dim0_at_least) ? got->shape[i] >= want->shape[i]
                                            : got->shape[i] == want->shape[i];
        if (!ok)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "output %s dim %d is %lld, expected %s%lld",
                            name, i, (long long)got->shape[i],
                            (i == 0 && dim0_at_least) ? "at least " : "",
                            (long long)want->shape[i]);
    }
    return MEGAMOE_OK;
}

/* Shapes exactly as torch_npu allocates them (op-plugin dispatch_v2). */
void mm_v2_dispatch_out_shapes(const mm_v2_cfg_t *c, megamoe_dispatch_v2_args_t *a)
{
    int64_t rows = c->T * c->A;
    a->expand_x = mm_v2_tensor(c->ytype, 2, rows, c->h, 0);
    if (c->qmode->scales_2d) /* [rows, scales per row]; else torch_npu's [T*A] fp32 */
        a->dynamic_scales = mm_v2_tensor(c->qmode->scale_type, 2, rows, c->scale_elems, 0);
    else
        a->dynamic_scales = mm_v2_tensor(MEGAMOE_DTYPE_FP32, 1, rows, 0, 0);
    int64_t assist = c->bs * c->k > 128 * c->A ? c->bs * c->k : 128 * c->A;
    a->assist_info_for_combine = mm_v2_tensor(MEGAMOE_DTYPE_INT32, 1, assist, 0, 0);
    a->expert_token_nums = mm_v2_tensor(MEGAMOE_DTYPE_INT64, 1, c->L_out, 0, 0);
    int64_t counts = c->n_counts;
    if (a->expert_scales.data != NULL) /* torch_npu reserves the A2 layered bookkeeping */
        counts = c->W * c->L_out + 2 * c->gbs_real * c->K * (c->W / 8);
    if (counts < c->n_counts) counts = c->n_counts;
    a->ep_recv_counts = mm_v2_tensor(MEGAMOE_DTYPE_INT32, 1, counts, 0, 0);
    a->tp_recv_counts = mm_v2_tensor(MEGAMOE_DTYPE_INT32, 1, c->tp, 0, 0);
    a->expand_scales = mm_v2_tensor(MEGAMOE_DTYPE_FP32, 1, c->A, 0, 0);
}

/* The library's part of a full copy back into the caller's struct (its struct_size, checked
 * on the way in), keeping the caller's struct_size. */
static void mm_v2_copy_back(void *caller, const void *lib, size_t lib_size)
{
    size_t size;
    memcpy(&size, caller, sizeof size);
    size_t n = size < lib_size ? size : lib_size;
    memcpy((char *)caller + sizeof size, (const char *)lib + sizeof size, n - sizeof size);
}

megamoe_status_t megamoe_dispatch_v2_infer(megamoe_dispatch_v2_args_t *caller_args)
{
    if (caller_args == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "args is NULL");
    megamoe_dispatch_v2_args_t copy = megamoe_dispatch_v2_args_default(), *args = &copy;
    MM_CHECK(mm_abi_copy_in(&copy, sizeof copy, caller_args, "megamoe_dispatch_v2_args_t"));
    mm_v2_cfg_t cfg;
    MM_CHECK(mm_v2_dispatch_config(args, &cfg));
    mm_v2_dispatch_out_shapes(&cfg, args);
    mm_v2_copy_back(caller_args, args, sizeof *args);
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_combine_v2_infer(megamoe_combine_v2_args_t *caller_args)
{
    if (caller_args == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "args is NULL");
    megamoe_combine_v2_args_t copy = mm_v2_combine_defaults(), *args = &copy;
    MM_CHECK(mm_abi_copy_in(&copy, sizeof copy, caller_args, "megamoe_combine_v2_args_t"));
    mm_v2_cfg_t cfg;
    MM_CHECK(mm_v2_combine_config(args, MM_V2_OP_COMBINE, &cfg));
    args->x = mm_v2_tensor(cfg.xtype, 2, cfg.bs, cfg.h, 0);
    mm_v2_copy_back(caller_args, args, sizeof *args);
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_combine_add_rms_norm_infer(megamoe_combine_add_rms_norm_args_t *caller)
{
    if (caller == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "args is NULL");
    mm_arn_t copy, *args = &copy;
    size_t off;
    MM_CHECK(mm_v2_arn_in(&copy, caller, &off));
    mm_v2_cfg_t cfg;
    MM_CHECK(mm_v2_combine_config(&args->combine, MM_V2_OP_ADD_RMS_NORM, &cfg));
    args->combine.x = mm_v2_tensor(cfg.xtype, 3, cfg.bs, 1, cfg.h);
    args->y = mm_v2_tensor(cfg.xtype, 3, cfg.bs, 1, cfg.h);
    args->rstd = mm_v2_tensor(MEGAMOE_DTYPE_FP32, 3, cfg.bs, 1, 1);
    mm_v2_copy_back(&caller->combine, &args->combine, sizeof args->combine);
    size_t own = caller->struct_size - off, lib_own = sizeof copy - MM_ARN_OWN;
    memcpy((char *)caller + off, (const char *)args + MM_ARN_OWN, own < lib_own ? own : lib_own);
    return MEGAMOE_OK;
}
