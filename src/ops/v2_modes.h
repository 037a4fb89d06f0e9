/* The quantisation modes of the V2 operators, described once (docs/v2_spec.md §4, §5.2):
 * dispatch's quant_mode and combine's comm_quant_mode. Validation, the output shapes, the
 * dispatch and combine data paths and the public description (megamoe_quant_mode_info,
 * Python megamoe.ops.quant_modes()) all read these tables, so a new mode is one more row (and
 * its kernel in src/kernels/quant.h). */
#ifndef MM_OPS_V2_MODES_H
#define MM_OPS_V2_MODES_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/dtype.h"
#include "megamoe/ops.h"

struct mm_v2_cfg;

#define MM_V2_TYPE_BIT(t) (1u << (unsigned)(t))
#define MM_V2_FP8_TYPES (MM_V2_TYPE_BIT(MEGAMOE_DTYPE_FP8_E4M3FN) | MM_V2_TYPE_BIT(MEGAMOE_DTYPE_FP8_E5M2))

/* One dispatch quant_mode. */
typedef struct mm_v2_quant_mode {
    int64_t mode;
    const char *name;            /* "none", "static", "per_token", "per_group", "mx" */
    int same_as_x;               /* expand_x has x's dtype (the row is copied) */
    uint32_t out_types;          /* else: MM_V2_TYPE_BIT of each accepted expand_x dtype */
    megamoe_dtype_t out_default; /* taken when the caller's expand_x dtype does not fit */
    int smoothing;               /* scales [NS + E, H]: MEGAMOE_SCALES_* of ops.h */
    int flat_scales;             /* scales [1] / [H] accepted too */
    int64_t scale_group;         /* elements per dynamic scale: 0 none, -1 the whole row */
    megamoe_dtype_t scale_type;  /* of dynamic_scales (FP32, or E8M0 for MX) */
    int scale_pad2;              /* the count of scales per row is rounded up to even */
    int scales_2d;               /* dynamic_scales [rows, n] (per group) instead of [rows] */
    /* quantise (or copy) one token row into out (row_bytes) and scale_out (scale_bytes) */
    void (*row)(const struct mm_v2_cfg *c, const void *x, const float *smooth,
                int64_t smooth_len, void *out, void *scale_out);
} mm_v2_quant_mode_t;

/* One combine comm_quant_mode (the transport of the rows back to their sources). */
typedef struct mm_v2_comm_quant_mode {
    int64_t mode;
    const char *name;        /* "none", "int8", "mx_fp8_e5m2", "mx_fp8_e4m3fn" */
    const char *what;        /* for messages ("int8 transport"); NULL for none */
    megamoe_dtype_t q_type;  /* element type on the wire (the row type for none) */
    int64_t block;           /* elements per scale (0 for none) */
    int mx;                  /* E8M0 scales, dequantised straight to fp32; else the scale has
                                the row type and y' is rounded to it first */
} mm_v2_comm_quant_mode_t;

/* The row that moves a pre-quantised x with its scales (kind MM_V2_PASS_*, not OFF). */
const mm_v2_quant_mode_t *mm_v2_pass_mode(int kind);
/* The row of a mode, NULL when it is not one. */
const mm_v2_quant_mode_t *mm_v2_quant_mode(int64_t mode);
const mm_v2_comm_quant_mode_t *mm_v2_comm_quant_mode(int64_t mode);
/* Row i of the tables (NULL past the end), for listings and messages. */
const mm_v2_quant_mode_t *mm_v2_quant_mode_at(size_t i);
const mm_v2_comm_quant_mode_t *mm_v2_comm_quant_mode_at(size_t i);

/* "int8, fp8_e4m3fn or fp8_e5m2" (the expand_x dtypes a mode accepts; "x's dtype" for copy). */
void mm_v2_quant_out_types_text(const mm_v2_quant_mode_t *q, char *buf, size_t len);
/* "0, 2 (int8 transport), 3 (MX fp8_e5m2) or 4 (MX fp8_e4m3fn)". */
void mm_v2_comm_quant_list_text(char *buf, size_t len);
/* Dynamic scales per row of H elements (0 without). */
int64_t mm_v2_quant_scale_count(const mm_v2_quant_mode_t *q, int64_t h);

#endif /* MM_OPS_V2_MODES_H */
