/* Weight layout conversions (include/megamoe/layout.h): cache-blocked transposes. */
#include <string.h>

#include "base/error.h"
#include "megamoe/layout.h"

#define MM_TILE 32

/* dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols; element size es (2 or 4). */
static void mm_transpose(void *dst, int64_t ldd, const void *src, int64_t lds, int64_t rows,
                         int64_t cols, size_t es)
{
    for (int64_t r0 = 0; r0 < rows; r0 += MM_TILE)
        for (int64_t c0 = 0; c0 < cols; c0 += MM_TILE) {
            int64_t r1 = r0 + MM_TILE < rows ? r0 + MM_TILE : rows;
            int64_t c1 = c0 + MM_TILE < cols ? c0 + MM_TILE : cols;
            if (es == 2) {
                const uint16_t *s = src;
                uint16_t *d = dst;
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t c = c0; c < c1; c++) d[c * ldd + r] = s[r * lds + c];
            } else {
                const uint32_t *s = src;
                uint32_t *d = dst;
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t c = c0; c < c1; c++) d[c * ldd + r] = s[r * lds + c];
            }
        }
}

static int mm_overlap(const void *a, size_t na, const void *b, size_t nb)
{
    const char *x = a, *y = b;
    return na && nb && x < y + nb && y < x + na;
}

static megamoe_status_t mm_layout_check(const char *fn, megamoe_dtype_t dtype, int64_t E,
                                        int64_t H, int64_t I, size_t *es_p)
{
    if (dtype != MEGAMOE_DTYPE_FP32 && dtype != MEGAMOE_DTYPE_BF16 && dtype != MEGAMOE_DTYPE_FP16)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: dtype %s; use fp32, bf16 or fp16", fn,
                        megamoe_dtype_name(dtype));
    if (E < 0 || H < 0 || I < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: negative size E=%lld H=%lld I=%lld", fn,
                        (long long)E, (long long)H, (long long)I);
    *es_p = megamoe_dtype_size(dtype);
    return MEGAMOE_OK;
}

/* NULL and overlap checks: outputs o[0..no) of on bytes each, inputs i[0..ni) of in bytes each. */
static megamoe_status_t mm_layout_buffers(const char *fn, const void *const *o, int no, size_t on,
                                          const void *const *in, int ni, size_t inb)
{
    if (on == 0 && inb == 0) return MEGAMOE_OK;
    for (int k = 0; k < no; k++)
        if (o[k] == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: NULL destination", fn);
    for (int k = 0; k < ni; k++)
        if (in[k] == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: NULL source", fn);
    for (int a = 0; a < no; a++) {
        for (int k = 0; k < ni; k++)
            if (mm_overlap(o[a], on, in[k], inb))
                return mm_error(MEGAMOE_INVALID_ARGUMENT,
                                "%s: source and destination overlap; convert into a new buffer", fn);
        for (int k = a + 1; k < no; k++)
            if (mm_overlap(o[a], on, o[k], on))
                return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: the two destinations overlap", fn);
    }
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_layout_gate_up_from_linear(void *gate_up, const void *gate,
                                                    const void *up, megamoe_dtype_t dtype,
                                                    int64_t E, int64_t H, int64_t I)
{
    size_t es;
    MM_CHECK(mm_layout_check("megamoe_layout_gate_up_from_linear", dtype, E, H, I, &es));
    size_t one = (size_t)(E * I * H) * es; /* gate (or up) bytes; gate_up is twice that */
    const void *o[1] = {gate_up}, *in[2] = {gate, up};
    MM_CHECK(mm_layout_buffers("megamoe_layout_gate_up_from_linear", o, 1, 2 * one, in, 2, one));
    for (int64_t e = 0; e < E; e++) {
        char *dst = (char *)gate_up + (size_t)(e * H * 2 * I) * es;
        mm_transpose(dst, 2 * I, (const char *)gate + (size_t)(e * I * H) * es, H, I, H, es);
        mm_transpose(dst + (size_t)I * es, 2 * I, (const char *)up + (size_t)(e * I * H) * es, H, I, H, es);
    }
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_layout_gate_up_to_linear(void *gate, void *up, const void *gate_up,
                                                  megamoe_dtype_t dtype, int64_t E, int64_t H,
                                                  int64_t I)
{
    size_t es;
    MM_CHECK(mm_layout_check("megamoe_layout_gate_up_to_linear", dtype, E, H, I, &es));
    size_t one = (size_t)(E * I * H) * es;
    const void *o[2] = {gate, up}, *in[1] = {gate_up};
    MM_CHECK(mm_layout_buffers("megamoe_layout_gate_up_to_linear", o, 2, one, in, 1, 2 * one));
    for (int64_t e = 0; e < E; e++) {
        const char *src = (const char *)gate_up + (size_t)(e * H * 2 * I) * es;
        mm_transpose((char *)gate + (size_t)(e * I * H) * es, H, src, 2 * I, H, I, es);
        mm_transpose((char *)up + (size_t)(e * I * H) * es, H, src + (size_t)I * es, 2 * I, H, I, es);
    }
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_layout_down_from_linear(void *down_weight, const void *down,
                                                 megamoe_dtype_t dtype, int64_t E, int64_t H,
                                                 int64_t I)
{
    size_t es;
    MM_CHECK(mm_layout_check("megamoe_layout_down_from_linear", dtype, E, H, I, &es));
    size_t bytes = (size_t)(E * H * I) * es;
    const void *o[1] = {down_weight}, *in[1] = {down};
    MM_CHECK(mm_layout_buffers("megamoe_layout_down_from_linear", o, 1, bytes, in, 1, bytes));
    for (int64_t e = 0; e < E; e++)
        mm_transpose((char *)down_weight + (size_t)(e * I * H) * es, H,
                     (const char *)down + (size_t)(e * H * I) * es, I, H, I, es);
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_layout_down_to_linear(void *down, const void *down_weight,
                                               megamoe_dtype_t dtype, int64_t E, int64_t H,
                                               int64_t I)
{
    size_t es;
    MM_CHECK(mm_layout_check("megamoe_layout_down_to_linear", dtype, E, H, I, &es));
    size_t bytes = (size_t)(E * H * I) * es;
    const void *o[1] = {down}, *in[1] = {down_weight};
    MM_CHECK(mm_layout_buffers("megamoe_layout_down_to_linear", o, 1, bytes, in, 1, bytes));
    for (int64_t e = 0; e < E; e++)
        mm_transpose((char *)down + (size_t)(e * H * I) * es, I,
                     (const char *)down_weight + (size_t)(e * I * H) * es, H, I, H, es);
    return MEGAMOE_OK;
}
