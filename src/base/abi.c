/* The public structs' table and the size checks of the extensible ones
 * (include/megamoe/version.h: the scheme; base/abi.h: how an entry uses it). */
#include "base/abi.h"

#include <stdint.h>
#include <string.h>

#include "base/error.h"
#include "megamoe/megamoe.h"

typedef struct mm_abi_struct {
    const char *name;
    size_t size;     /* sizeof in this library */
    size_t min_size; /* smallest struct_size / caller size accepted; 0: frozen */
} mm_abi_struct_t;

#define MM_FROZEN(T) {#T, sizeof(T), 0}
/* last: the last field the struct had when it entered the scheme (ABI 2); never change it */
#define MM_EXTENSIBLE(T, last) {#T, sizeof(T), MM_ABI_END(T, last)}

/* Every public struct, one row each (tests/install/test_abi_layout.py checks the list against
 * the headers). A new struct gets a row; appending a field changes nothing here. */
static const mm_abi_struct_t mm_abi_structs[] = {
    /* comm.h, config.h */
    MM_EXTENSIBLE(megamoe_comm_params_t, job_token),
    MM_FROZEN(megamoe_config_entry_t),
    MM_EXTENSIBLE(megamoe_host_info_t, amx_usable), /* filled: caller's size with the call */
    /* ops.h */
    MM_FROZEN(megamoe_tensor_t),
    MM_EXTENSIBLE(megamoe_dispatch_v2_args_t, zero_fill),
    MM_EXTENSIBLE(megamoe_combine_v2_args_t, zero_fill),
    MM_EXTENSIBLE(megamoe_combine_add_rms_norm_args_t, rstd), /* own part: see ops/v2_args.c */
    MM_FROZEN(megamoe_quant_mode_info_t),
    /* experts.h */
    MM_EXTENSIBLE(megamoe_experts_params_t, replica_slots_per_rank),
    MM_FROZEN(megamoe_experts_weights_t),
    MM_EXTENSIBLE(megamoe_experts_input_t, tokens_per_expert_dtype),
    MM_FROZEN(megamoe_experts_grads_t),
    MM_EXTENSIBLE(megamoe_experts_info_t, last_max_rows), /* filled: caller's size */
    MM_FROZEN(megamoe_experts_growth_t),
    MM_FROZEN(megamoe_experts_replica_t),
    MM_FROZEN(megamoe_experts_timing_t),
    /* prof.h */
    MM_FROZEN(megamoe_profile_summary_t),
    MM_EXTENSIBLE(megamoe_profile_params_t, stage_count),
    MM_FROZEN(megamoe_profile_record_t),
    MM_FROZEN(megamoe_trace_summary_options_t),
    MM_FROZEN(megamoe_trace_svg_options_t),
    /* serve.h */
    MM_EXTENSIBLE(megamoe_symm_buffer_params_t, topk_weights_type),
    MM_EXTENSIBLE(megamoe_symm_buffer_info_t, id), /* filled: caller's size with the call */
    MM_FROZEN(megamoe_tensor_list_t),
    MM_EXTENSIBLE(megamoe_mega_moe_args_t, weights_version),
    /* reference.h */
    MM_FROZEN(megamoe_reference_shape_t),
    MM_EXTENSIBLE(megamoe_reference_params_t, bf16_intermediates),
    /* companion.h */
    MM_EXTENSIBLE(megamoe_grouped_matmul_args_t, packed),
    MM_EXTENSIBLE(megamoe_init_routing_args_t, threads),
    MM_EXTENSIBLE(megamoe_finalize_routing_args_t, threads),
    MM_EXTENSIBLE(megamoe_gating_top_k_args_t, threads),
    MM_EXTENSIBLE(megamoe_swiglu_args_t, threads),
    MM_EXTENSIBLE(megamoe_dynamic_quant_args_t, threads),
    MM_EXTENSIBLE(megamoe_dequant_swiglu_quant_args_t, threads),
    /* symm.h */
    MM_EXTENSIBLE(megamoe_symm_state_t, engine), /* filled: caller's size with the call */
};

/* A struct_size this large is not a size (an uninitialised field). */
#define MM_ABI_MAX_SIZE ((size_t)1 << 20)

static const mm_abi_struct_t *mm_abi_find(const char *name)
{
    if (name == NULL) return NULL;
    for (size_t i = 0; i < sizeof mm_abi_structs / sizeof mm_abi_structs[0]; i++)
        if (strcmp(mm_abi_structs[i].name, name) == 0) return &mm_abi_structs[i];
    return NULL;
}

int64_t megamoe_struct_size(const char *type_name)
{
    const mm_abi_struct_t *s = mm_abi_find(type_name);
    return s ? (int64_t)s->size : -1;
}

int64_t megamoe_struct_min_size(const char *type_name)
{
    const mm_abi_struct_t *s = mm_abi_find(type_name);
    return s ? (int64_t)s->min_size : -1;
}

/* "megamoe_experts_params_t" -> "megamoe_experts_params" (for the initialiser's name). */
static int mm_abi_stem(const char *type)
{
    size_t n = strlen(type);
    return (int)(n > 2 && strcmp(type + n - 2, "_t") == 0 ? n - 2 : n);
}

static const mm_abi_struct_t *mm_abi_row(const char *type, size_t lib_size)
{
    const mm_abi_struct_t *s = mm_abi_find(type);
    if (s == NULL || s->size != lib_size || s->min_size == 0) {
        mm_error(MEGAMOE_INTERNAL, "%s is not an extensible struct of src/base/abi.c's table",
                 type);
        return NULL;
    }
    return s;
}

megamoe_status_t mm_abi_copy_part_in(void *dst, size_t dst_size, const void *src,
                                     size_t src_size, size_t min_size, const char *what)
{
    if (src_size < min_size || src_size > MM_ABI_MAX_SIZE)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: struct_size %zu is not a size this library accepts (at least %zu, "
                        "at most %zu): initialise the struct with its *_default() (struct_size "
                        "= sizeof as the caller was compiled) before setting fields",
                        what, src_size, min_size, (size_t)MM_ABI_MAX_SIZE);
    const unsigned char *s = src;
    for (size_t i = dst_size; i < src_size; i++)
        if (s[i] != 0)
            return mm_error(MEGAMOE_UNSUPPORTED,
                            "%s: the caller sets byte %zu of a %zu-byte struct, but this library "
                            "(megamoe %s, ABI %d) knows only %zu bytes: the program was built "
                            "against a newer megamoe; run it with the library it was built with",
                            what, i, src_size, MEGAMOE_VERSION_STRING, MEGAMOE_ABI_VERSION,
                            dst_size);
    memcpy(dst, src, src_size < dst_size ? src_size : dst_size);
    return MEGAMOE_OK;
}

megamoe_status_t mm_abi_copy_in(void *dst, size_t dst_size, const void *src, const char *type)
{
    const mm_abi_struct_t *row = mm_abi_row(type, dst_size);
    if (row == NULL) return MEGAMOE_INTERNAL;
    if (src == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s is NULL", type);
    size_t size;
    memcpy(&size, src, sizeof size);
    if (size < row->min_size || size > MM_ABI_MAX_SIZE)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s.struct_size is %zu: initialise it with %.*s_default() (struct_size "
                        "= sizeof, at least %zu) before setting fields",
                        type, size, mm_abi_stem(type), type, row->min_size);
    MM_CHECK(mm_abi_copy_part_in(dst, dst_size, src, size, row->min_size, type));
    memcpy(dst, &dst_size, sizeof dst_size); /* struct_size: the full copy's */
    return MEGAMOE_OK;
}

megamoe_status_t mm_abi_copy_out(void *dst, size_t dst_size, const void *src, size_t src_size,
                                 const char *type)
{
    const mm_abi_struct_t *row = mm_abi_row(type, src_size);
    if (row == NULL) return MEGAMOE_INTERNAL;
    if (dst == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: NULL output", type);
    if (dst_size < row->min_size || dst_size > MM_ABI_MAX_SIZE)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: the caller's size %zu is not a size of this struct (at least %zu): "
                        "pass sizeof of the struct (the header's macro does)",
                        type, dst_size, row->min_size);
    memcpy(dst, src, dst_size < src_size ? dst_size : src_size);
    if (dst_size > src_size) memset((char *)dst + src_size, 0, dst_size - src_size);
    return MEGAMOE_OK;
}

megamoe_status_t mm_abi_init(void *p, size_t size, const void *defaults, size_t defaults_size,
                             const char *type)
{
    const mm_abi_struct_t *row = mm_abi_row(type, defaults_size);
    if (row == NULL) return MEGAMOE_INTERNAL;
    if (p == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "%.*s_init: NULL struct",
                                   mm_abi_stem(type), type);
    if (size < row->min_size || size > MM_ABI_MAX_SIZE)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%.*s_init: struct_size %zu is not a size of %s (at least %zu): pass "
                        "sizeof *p", mm_abi_stem(type), type, size, type, row->min_size);
    memset(p, 0, size);
    memcpy(p, defaults, size < defaults_size ? size : defaults_size);
    memcpy(p, &size, sizeof size);
    return MEGAMOE_OK;
}
