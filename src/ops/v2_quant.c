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

/* Transport record: q[h] int8, then the ceil(h/8) XType block scales at an 8-aligned offset. */
static size_t mm_v2_cq_scale_off(int64_t h) { return ((size_t)h + 7) / 8 * 8; }

size_t mm_v2_cq_bytes(int64_t h, size_t xsize)
{
    return mm_v2_cq_scale_off(h) + (size_t)mm_comm_quant_block_count(h) * xsize;
}

void mm_v2_cq_quant(megamoe_dtype_t xtype, int64_t h, const void *y, void *rec)
{
    (void)mm_comm_quant_int8(y, xtype, h, rec, (uint8_t *)rec + mm_v2_cq_scale_off(h));
}

void mm_v2_cq_dequant_f32(megamoe_dtype_t xtype, int64_t h, const void *rec, float *out)
{
    /* y' (XType) lands after the h floats of out (the caller gives room for 2 * h floats) */
    uint16_t *y = (uint16_t *)(out + h);
    (void)mm_comm_dequant_int8(rec, (const uint8_t *)rec + mm_v2_cq_scale_off(h), xtype, h, y);
    mm_v2_widen(xtype, y, out, h);
}

void mm_v2_cq_dequant_range(megamoe_dtype_t xtype, int64_t h, const void *rec, int64_t c0,
                            int64_t n, float *out)
{
    uint16_t *y = (uint16_t *)(out + n);
    const uint8_t *sc = (const uint8_t *)rec + mm_v2_cq_scale_off(h) + (size_t)(c0 / 8) * 2;
    (void)mm_comm_dequant_int8((const int8_t *)rec + c0, sc, xtype, n, y);
    mm_v2_widen(xtype, y, out, n);
}
