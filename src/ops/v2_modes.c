/* The quantisation mode tables (see v2_modes.h) and their public description. */
#include "v2_modes.h"

#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "kernels/quant.h"
#include "v2_internal.h"

/* ---- dispatch rows: the one place that calls the kernels' quantisers (bit-exact to spec §4);
 * arguments were validated by the operator, so the quantisers cannot fail here ---------- */

static void mm_v2_row_copy(const mm_v2_cfg_t *c, const void *x, const float *smooth,
                           int64_t smooth_len, void *out, void *scale_out)
{
    (void)smooth, (void)smooth_len, (void)scale_out;
    memcpy(out, x, c->row_bytes);
}

static void mm_v2_row_static(const mm_v2_cfg_t *c, const void *x, const float *smooth,
                             int64_t smooth_len, void *out, void *scale_out)
{
    (void)scale_out;
    (void)mm_quant_static_int8(x, c->xtype, c->h, smooth, smooth_len, out);
}

static void mm_v2_row_token(const mm_v2_cfg_t *c, const void *x, const float *smooth,
                            int64_t smooth_len, void *out, void *scale_out)
{
    (void)smooth_len;
    (void)mm_quant_dynamic_token(x, c->xtype, c->h, smooth, c->ytype, out, scale_out);
}

static void mm_v2_row_group(const mm_v2_cfg_t *c, const void *x, const float *smooth,
                            int64_t smooth_len, void *out, void *scale_out)
{
    (void)smooth_len;
    (void)mm_quant_dynamic_group(x, c->xtype, c->h, smooth, c->ytype, out, scale_out);
}

static void mm_v2_row_mx(const mm_v2_cfg_t *c, const void *x, const float *smooth,
                         int64_t smooth_len, void *out, void *scale_out)
{
    (void)smooth, (void)smooth_len;
    (void)mm_quant_mx(x, c->xtype, c->h, c->ytype, out, scale_out);
}

/* a pre-quantised x: the row as is, its scales (the caller's row of the scales tensor, passed
 * as `smooth` with smooth_len bytes) copied behind it */
static void mm_v2_row_pass(const mm_v2_cfg_t *c, const void *x, const float *smooth,
                           int64_t smooth_len, void *out, void *scale_out)
{
    memcpy(out, x, c->row_bytes);
    if (smooth && smooth_len > 0) memcpy(scale_out, smooth, (size_t)smooth_len);
}

#define MM_I8 MM_V2_TYPE_BIT(MEGAMOE_DTYPE_INT8)

static const mm_v2_quant_mode_t mm_v2_quant_modes[] = {
    /* mode name        same  out types        default                    smoothing */
    {0, "none",      1, 0,                    MEGAMOE_DTYPE_COUNT_,      MEGAMOE_SCALES_NONE,
     0, 0,  MEGAMOE_DTYPE_FP32, 0, 0, mm_v2_row_copy},
    {1, "static",    0, MM_I8,                MEGAMOE_DTYPE_INT8,        MEGAMOE_SCALES_REQUIRED,
     1, 0,  MEGAMOE_DTYPE_FP32, 0, 0, mm_v2_row_static},
    {2, "per_token", 0, MM_I8 | MM_V2_FP8_TYPES, MEGAMOE_DTYPE_INT8,     MEGAMOE_SCALES_OPTIONAL,
     0, -1, MEGAMOE_DTYPE_FP32, 0, 0, mm_v2_row_token},
    {3, "per_group", 0, MM_V2_FP8_TYPES,      MEGAMOE_DTYPE_FP8_E4M3FN,  MEGAMOE_SCALES_OPTIONAL,
     0, MM_QUANT_GROUP, MEGAMOE_DTYPE_FP32, 0, 1, mm_v2_row_group},
    {4, "mx",        0, MM_V2_FP8_TYPES,      MEGAMOE_DTYPE_FP8_E4M3FN,  MEGAMOE_SCALES_NONE,
     0, MM_QUANT_MX_BLOCK, MEGAMOE_DTYPE_E8M0, 1, 1, mm_v2_row_mx},
};
#define MM_V2_NQUANT (sizeof mm_v2_quant_modes / sizeof mm_v2_quant_modes[0])

static const mm_v2_comm_quant_mode_t mm_v2_comm_quant_modes[] = {
    {0, "none", NULL, MEGAMOE_DTYPE_COUNT_, 0, 0},
    {2, "int8", "int8 transport", MEGAMOE_DTYPE_INT8, MM_COMM_QUANT_BLOCK, 0},
    {3, "mx_fp8_e5m2", "MX fp8_e5m2", MEGAMOE_DTYPE_FP8_E5M2, MM_QUANT_MX_BLOCK, 1},
    {4, "mx_fp8_e4m3fn", "MX fp8_e4m3fn", MEGAMOE_DTYPE_FP8_E4M3FN, MM_QUANT_MX_BLOCK, 1},
};
#define MM_V2_NCQ (sizeof mm_v2_comm_quant_modes / sizeof mm_v2_comm_quant_modes[0])

/* quant_mode 0 with an int8 / fp8 x (op-plugin's x_dtype / scales_dtype): one row per scale
 * layout (cfg.pass); not in the public table (they are quant_mode 0) */
static const mm_v2_quant_mode_t mm_v2_pass_modes[] = {
    {0, "none", 1, 0, MEGAMOE_DTYPE_COUNT_, MEGAMOE_SCALES_NONE, 0, 0, MEGAMOE_DTYPE_FP32, 0, 0,
     mm_v2_row_pass},
    {0, "none", 1, 0, MEGAMOE_DTYPE_COUNT_, MEGAMOE_SCALES_NONE, 0, -1, MEGAMOE_DTYPE_FP32, 0, 0,
     mm_v2_row_pass},
    {0, "none", 1, 0, MEGAMOE_DTYPE_COUNT_, MEGAMOE_SCALES_NONE, 0, MM_QUANT_GROUP,
     MEGAMOE_DTYPE_FP32, 0, 1, mm_v2_row_pass},
    {0, "none", 1, 0, MEGAMOE_DTYPE_COUNT_, MEGAMOE_SCALES_NONE, 0, MM_QUANT_MX_BLOCK,
     MEGAMOE_DTYPE_E8M0, 1, 1, mm_v2_row_pass},
};

const mm_v2_quant_mode_t *mm_v2_pass_mode(int kind)
{
    return kind >= MM_V2_PASS_BARE && kind <= MM_V2_PASS_MX ? &mm_v2_pass_modes[kind - 1] : NULL;
}

const mm_v2_quant_mode_t *mm_v2_quant_mode_at(size_t i)
{
    return i < MM_V2_NQUANT ? &mm_v2_quant_modes[i] : NULL;
}

const mm_v2_comm_quant_mode_t *mm_v2_comm_quant_mode_at(size_t i)
{
    return i < MM_V2_NCQ ? &mm_v2_comm_quant_modes[i] : NULL;
}

const mm_v2_quant_mode_t *mm_v2_quant_mode(int64_t mode)
{
    for (size_t i = 0; i < MM_V2_NQUANT; i++)
        if (mm_v2_quant_modes[i].mode == mode) return &mm_v2_quant_modes[i];
    return NULL;
}

const mm_v2_comm_quant_mode_t *mm_v2_comm_quant_mode(int64_t mode)
{
    for (size_t i = 0; i < MM_V2_NCQ; i++)
        if (mm_v2_comm_quant_modes[i].mode == mode) return &mm_v2_comm_quant_modes[i];
    return NULL;
}

int64_t mm_v2_quant_scale_count(const mm_v2_quant_mode_t *q, int64_t h)
{
    if (q->scale_group == 0) return 0;
    if (q->scale_group < 0) return 1;
    int64_t n = (h + q->scale_group - 1) / q->scale_group;
    return q->scale_pad2 ? (n + 1) / 2 * 2 : n;
}

void mm_v2_quant_out_types_text(const mm_v2_quant_mode_t *q, char *buf, size_t len)
{
    if (q->same_as_x) {
        snprintf(buf, len, "the x dtype");
        return;
    }
    int n = 0, total = 0;
    for (int t = 0; t < MEGAMOE_DTYPE_COUNT_; t++) total += (q->out_types >> t) & 1;
    size_t off = 0;
    buf[0] = '\0';
    for (int t = 0; t < MEGAMOE_DTYPE_COUNT_ && off < len; t++) {
        if (!((q->out_types >> t) & 1)) continue;
        const char *sep = n == 0 ? "" : n == total - 1 ? " or " : ", ";
        off += (size_t)snprintf(buf + off, len - off, "%s%s", sep,
                                megamoe_dtype_name((megamoe_dtype_t)t));
        n++;
    }
}

void mm_v2_comm_quant_list_text(char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < MM_V2_NCQ && off < len; i++) {
        const mm_v2_comm_quant_mode_t *m = &mm_v2_comm_quant_modes[i];
        const char *sep = i == 0 ? "" : i == MM_V2_NCQ - 1 ? " or " : ", ";
        off += (size_t)snprintf(buf + off, len - off, m->what ? "%s%lld (%s)" : "%s%lld", sep,
                                (long long)m->mode, m->what);
    }
}

/* ---- combine transport records (spec §5.2; the MX modes as docs/ops.md says) ------------ */

/* q[h], then the scales at an 8-aligned offset: ceil(h/8) XType block scales (int8) or
 * mm_quant_mx_scale_count(h) E8M0 bytes (MX). */
static size_t mm_v2_cq_scale_off(int64_t h) { return ((size_t)h + 7) / 8 * 8; }

size_t mm_v2_cq_bytes(const mm_v2_comm_quant_mode_t *mode, int64_t h, size_t xsize)
{
    if (mode->mx) return mm_v2_cq_scale_off(h) + (size_t)mm_quant_mx_scale_count(h);
    return mm_v2_cq_scale_off(h) + (size_t)mm_comm_quant_block_count(h) * xsize;
}

void mm_v2_cq_quant(const mm_v2_comm_quant_mode_t *mode, megamoe_dtype_t xtype, int64_t h,
                    const void *y, void *rec)
{
    uint8_t *sc = (uint8_t *)rec + mm_v2_cq_scale_off(h);
    if (mode->mx) (void)mm_quant_mx(y, xtype, h, mode->q_type, rec, sc);
    else (void)mm_comm_quant_int8(y, xtype, h, rec, sc);
}

void mm_v2_cq_dequant_f32(const mm_v2_comm_quant_mode_t *mode, megamoe_dtype_t xtype, int64_t h,
                          const void *rec, float *out)
{
    mm_v2_cq_dequant_range(mode, xtype, h, rec, 0, h, out);
}

void mm_v2_cq_dequant_range(const mm_v2_comm_quant_mode_t *mode, megamoe_dtype_t xtype,
                            int64_t h, const void *rec, int64_t c0, int64_t n, float *out)
{
    const uint8_t *sc = (const uint8_t *)rec + mm_v2_cq_scale_off(h);
    if (mode->mx) { /* fp32 straight from the fp8 and its scale, no XType rounding */
        (void)mm_comm_dequant_mx_f32((const uint8_t *)rec + c0, sc + c0 / MM_QUANT_MX_BLOCK,
                                     mode->q_type, n, out);
        return;
    }
    /* y' (XType) lands after the n floats of out (the caller gives room for 2 * n floats) */
    uint16_t *y = (uint16_t *)(out + n);
    (void)mm_comm_dequant_int8((const int8_t *)rec + c0, sc + (size_t)(c0 / 8) * 2, xtype, n, y);
    mm_v2_widen(xtype, y, out, n);
}

/* ---- public description ------------------------------------------------------------------ */

megamoe_status_t megamoe_quant_mode_info(int which, int index, megamoe_quant_mode_info_t *info)
{
    if (info == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "quant mode info: NULL info");
    if (which != MEGAMOE_QUANT_DISPATCH && which != MEGAMOE_QUANT_COMBINE)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "quant mode info: table %d is neither MEGAMOE_QUANT_DISPATCH (0) nor "
                        "MEGAMOE_QUANT_COMBINE (1)",
                        which);
    memset(info, 0, sizeof *info);
    if (which == MEGAMOE_QUANT_DISPATCH) {
        const mm_v2_quant_mode_t *q = index >= 0 ? mm_v2_quant_mode_at((size_t)index) : NULL;
        if (q == NULL) return mm_error_quiet(MEGAMOE_NOT_FOUND, "no quant_mode entry %d", index);
        info->mode = q->mode;
        info->name = q->name;
        info->same_as_input = q->same_as_x;
        info->out_dtypes = q->out_types;
        info->scale_group = q->scale_group;
        info->scale_dtype = q->scale_type;
        info->smoothing = q->smoothing;
        return MEGAMOE_OK;
    }
    const mm_v2_comm_quant_mode_t *m = index >= 0 ? mm_v2_comm_quant_mode_at((size_t)index) : NULL;
    if (m == NULL) return mm_error_quiet(MEGAMOE_NOT_FOUND, "no comm_quant_mode entry %d", index);
    info->mode = m->mode;
    info->name = m->name;
    info->same_as_input = m->block == 0;
    info->out_dtypes = m->block ? MM_V2_TYPE_BIT(m->q_type) : 0;
    info->scale_group = m->block;
    info->scale_dtype = m->mx ? MEGAMOE_DTYPE_E8M0 : MEGAMOE_DTYPE_FP32;
    info->scale_same_as_input = m->block != 0 && !m->mx; /* int8: scales in the row's dtype */
    info->smoothing = MEGAMOE_SCALES_NONE;
    return MEGAMOE_OK;
}
