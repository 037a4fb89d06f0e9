/* Row transforms of the v2 operators: the one place that calls the kernels' quantisers
 * (src/kernels/quant.h, bit-exact to spec §4 and §5.2). Arguments were validated by the
 * operator, so the quantisers cannot fail here. */
#include <string.h>

#include "kernels/quant.h"
#include "v2_internal.h"

void mm_v2_quant_row(const mm_v2_cfg_t *c, const void *x, const float *smooth, int64_t smooth_len,
                     void *out, void *scale_out)
{
    switch (c->quant) {
    case 0: memcpy(out, x, c->row_bytes); break;
    case 1: (void)mm_quant_static_int8(x, c->xtype, c->h, smooth, smooth_len, out); break;
    case 2: (void)mm_quant_dynamic_token(x, c->xtype, c->h, smooth, c->ytype, out, scale_out); break;
    case 3: (void)mm_quant_dynamic_group(x, c->xtype, c->h, smooth, c->ytype, out, scale_out); break;
    default: (void)mm_quant_mx(x, c->xtype, c->h, c->ytype, out, scale_out); break;
    }
}

/* Transport record: q[h] (int8 for commQuantMode 2, fp8 for the MX modes 3 and 4), then the
 * scales at an 8-aligned offset: ceil(h/8) XType block scales (mode 2) or
 * mm_quant_mx_scale_count(h) E8M0 bytes (modes 3, 4). */
static size_t mm_v2_cq_scale_off(int64_t h) { return ((size_t)h + 7) / 8 * 8; }
static int mm_v2_cq_mx(int mode) { return mode == 3 || mode == 4; }
static megamoe_dtype_t mm_v2_cq_fp8(int mode)
{
    return mode == 3 ? MEGAMOE_DTYPE_FP8_E5M2 : MEGAMOE_DTYPE_FP8_E4M3FN;
}

size_t mm_v2_cq_bytes(int mode, int64_t h, size_t xsize)
{
    if (mm_v2_cq_mx(mode)) return mm_v2_cq_scale_off(h) + (size_t)mm_quant_mx_scale_count(h);
    return mm_v2_cq_scale_off(h) + (size_t)mm_comm_quant_block_count(h) * xsize;
}

void mm_v2_cq_quant(int mode, megamoe_dtype_t xtype, int64_t h, const void *y, void *rec)
{
    uint8_t *sc = (uint8_t *)rec + mm_v2_cq_scale_off(h);
    if (mm_v2_cq_mx(mode)) (void)mm_quant_mx(y, xtype, h, mm_v2_cq_fp8(mode), rec, sc);
    else (void)mm_comm_quant_int8(y, xtype, h, rec, sc);
}

void mm_v2_cq_dequant_f32(int mode, megamoe_dtype_t xtype, int64_t h, const void *rec, float *out)
{
    mm_v2_cq_dequant_range(mode, xtype, h, rec, 0, h, out);
}

void mm_v2_cq_dequant_range(int mode, megamoe_dtype_t xtype, int64_t h, const void *rec,
                            int64_t c0, int64_t n, float *out)
{
    const uint8_t *sc = (const uint8_t *)rec + mm_v2_cq_scale_off(h);
    if (mm_v2_cq_mx(mode)) { /* fp32 straight from the fp8 and its scale, no XType rounding */
        (void)mm_comm_dequant_mx_f32((const uint8_t *)rec + c0, sc + c0 / MM_QUANT_MX_BLOCK,
                                     mm_v2_cq_fp8(mode), n, out);
        return;
    }
    /* y' (XType) lands after the n floats of out (the caller gives room for 2 * n floats) */
    uint16_t *y = (uint16_t *)(out + n);
    (void)mm_comm_dequant_int8((const int8_t *)rec + c0, sc + (size_t)(c0 / 8) * 2, xtype, n, y);
    mm_v2_widen(xtype, y, out, n);
}
