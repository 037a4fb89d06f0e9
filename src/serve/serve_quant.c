/* The quantisation steps of the serving MegaMoE (spec §6.3, §6.5): per-token int8, MX blocks
 * (fp8 e4m3fn / e5m2, fp4 e2m1 with e8m0 scales), the wire rows, exact decoders. Scalar C, one
 * IEEE fp32 operation per step (C11, no contraction), so python/megamoe/serve_reference.py
 * can state the same rules independently. */
#include <math.h>
#include <string.h>

#include "megamoe/dtype.h"
#include "serve/serve_impl.h"

static inline float mm_sv_bf16_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t mm_sv_f32_bf16_exact(float f) /* f is a bf16 value: truncation is exact */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static void mm_sv_quant_int8_core(const float *v, int64_t h, int8_t *q, float *s_p)
{
    float m = 0.0f;
    for (int64_t i = 0; i < h; i++) {
        float a = fabsf(v[i]);
        if (a > m || a != a) m = a;
    }
    const float s = m / 127.0f;
    *s_p = s;
    for (int64_t i = 0; i < h; i++) {
        float r = s > 0.0f ? roundf(v[i] / s) : 0.0f; /* half away from zero */
        if (r > 127.0f) r = 127.0f;
        if (r < -127.0f) r = -127.0f;
        q[i] = r == r ? (int8_t)r : 0;
    }
}

void mm_sv_quant_int8_f32(const float *v, int64_t h, int8_t *q, float *s_p)
{
    mm_sv_quant_int8_core(v, h, q, s_p);
}

void mm_sv_quant_int8_bf16(const uint16_t *v, int64_t h, int8_t *q, float *s_p)
{
    float m = 0.0f;
    for (int64_t i = 0; i < h; i++) {
        float a = fabsf(mm_sv_bf16_f32(v[i]));
        if (a > m || a != a) m = a;
    }
    const float s = m / 127.0f;
    *s_p = s;
    for (int64_t i = 0; i < h; i++) {
        float r = s > 0.0f ? roundf(mm_sv_bf16_f32(v[i]) / s) : 0.0f;
        if (r > 127.0f) r = 127.0f;
        if (r < -127.0f) r = -127.0f;
        q[i] = r == r ? (int8_t)r : 0;
    }
}

/* ---- fp4 e2m1: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives ---- */

static const float mm_sv_fp4_mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float mm_sv_fp4_to_f32(uint8_t nibble)
{
    float m = mm_sv_fp4_mag[nibble & 7];
    return (nibble & 8) ? -m : m;
}

/* Round to nearest e2m1, ties to the even code (the one with mantissa bit 0), saturating. */
static uint8_t mm_sv_f32_to_fp4(float v)
{
    if (v != v) return 0; /* fp4 has no NaN: 0 (documented) */
    uint8_t sign = (v < 0.0f || (v == 0.0f && signbit(v))) ? 8 : 0;
    float a = fabsf(v);
    uint8_t best = 0;
    for (uint8_t c = 1; c < 8; c++) {
        float d = fabsf(mm_sv_fp4_mag[c] - a), db = fabsf(mm_sv_fp4_mag[best] - a);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    if (a > 6.0f) best = 7;
    return (uint8_t)(sign | best);
}

float mm_sv_fp8_to_f32(uint8_t byte, int type)
{
    return type == MEGAMOE_SERVE_TYPE_FP8_E5M2 ? megamoe_fp8_e5m2_to_fp32(byte)
                                               : megamoe_fp8_e4m3fn_to_fp32(byte);
}

float mm_sv_e8m0_to_f32(uint8_t e)
{
    if (e == 0xFF) return NAN;
    return ldexpf(1.0f, (int)e - 127);
}

static int mm_sv_emax(int type)
{
    switch (type) {
    case MEGAMOE_SERVE_TYPE_FP8_E5M2: return 15;
    case MEGAMOE_SERVE_TYPE_FP4_E2M1: return 2;
    default: return 8; /* e4m3fn */
    }
}

void mm_sv_quant_mx_bf16(const uint16_t *v, int64_t h, int type, uint8_t *q, uint8_t *scales)
{
    const int emax = mm_sv_emax(type);
    if (type == MEGAMOE_SERVE_TYPE_FP4_E2M1) memset(q, 0, (size_t)(h + 1) / 2);
    for (int64_t b0 = 0, blk = 0; b0 < h; b0 += MM_SV_MX_BLOCK, blk++) {
        const int64_t b1 = b0 + MM_SV_MX_BLOCK < h ? b0 + MM_SV_MX_BLOCK : h;
        int E = 0;
        for (int64_t i = b0; i < b1; i++) {
            int e = (v[i] >> 7) & 0xFF;
            if (e > E) E = e;
        }
        uint8_t s;
        if (E == 0xFF) s = 0xFF; /* Inf / NaN in the block */
        else s = (uint8_t)(E > emax ? E - emax : 0);
        scales[blk] = s;
        for (int64_t i = b0; i < b1; i++) {
            float x = mm_sv_bf16_f32(v[i]);
            float w = s == 0xFF ? NAN : (E == 0 ? 0.0f : ldexpf(x, 127 - (int)s));
            if (type == MEGAMOE_SERVE_TYPE_FP4_E2M1) {
                uint8_t c = mm_sv_f32_to_fp4(w);
                q[i / 2] |= (uint8_t)((i & 1) ? c << 4 : c);
            } else if (type == MEGAMOE_SERVE_TYPE_FP8_E5M2) {
                q[i] = megamoe_fp32_to_fp8_e5m2(w, 1);
            } else {
                q[i] = megamoe_fp32_to_fp8_e4m3fn(w, 1);
            }
        }
    }
}

size_t mm_sv_q_bytes(int type, int64_t h)
{
    switch (type) {
    case MEGAMOE_SERVE_TYPE_BF16: return (size_t)h * 2;
    case MEGAMOE_SERVE_TYPE_FP4_E2M1: return (size_t)(h + 1) / 2;
    default: return (size_t)h; /* int8, fp8 */
    }
}

/* where the row's scale(s) start */
static size_t mm_sv_scale_off(int type, int64_t h)
{
    size_t b = mm_sv_q_bytes(type, h);
    return type == MEGAMOE_SERVE_TYPE_INT8 ? (b + 3) / 4 * 4 : b;
}

void mm_sv_row_quant(const uint16_t *x, int atype, int64_t h, void *row)
{
    uint8_t *r = row;
    switch (atype) {
    case MEGAMOE_SERVE_TYPE_BF16: memcpy(r, x, (size_t)h * 2); return;
    case MEGAMOE_SERVE_TYPE_INT8: {
        float s;
        mm_sv_quant_int8_bf16(x, h, (int8_t *)r, &s);
        memcpy(r + mm_sv_scale_off(atype, h), &s, 4);
        return;
    }
    default:
        mm_sv_quant_mx_bf16(x, h, atype, r, r + mm_sv_scale_off(atype, h));
        return;
    }
}

void mm_sv_row_to_bf16(const void *row, int atype, int64_t h, uint16_t *out, float *s_int8_p)
{
    const uint8_t *r = row;
    switch (atype) {
    case MEGAMOE_SERVE_TYPE_BF16: memcpy(out, r, (size_t)h * 2); return;
    case MEGAMOE_SERVE_TYPE_INT8: {
        const int8_t *q = (const int8_t *)r;
        for (int64_t i = 0; i < h; i++) out[i] = mm_sv_f32_bf16_exact((float)q[i]);
        memcpy(s_int8_p, r + mm_sv_scale_off(atype, h), 4);
        return;
    }
    default: {
        const uint8_t *sc = r + mm_sv_scale_off(atype, h);
        for (int64_t i = 0; i < h; i++) {
            float v = atype == MEGAMOE_SERVE_TYPE_FP4_E2M1
                          ? mm_sv_fp4_to_f32((uint8_t)(r[i / 2] >> ((i & 1) * 4)))
                          : mm_sv_fp8_to_f32(r[i], atype);
            /* a power of two times a short mantissa: exact in bf16 (outside underflow) */
            float d = v * mm_sv_e8m0_to_f32(sc[i / MM_SV_MX_BLOCK]);
            out[i] = megamoe_fp32_to_bf16(d);
        }
        return;
    }
    }
}
