/* The verification rule (see moe_verify.h). */
#include "moe_verify.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "megamoe/dtype.h"

static double mm_got(const void *got, int got_bf16, size_t i)
{
    return got_bf16 ? megamoe_bf16_to_fp32(((const uint16_t *)got)[i]) : ((const float *)got)[i];
}

void mm_verify(const void *got, int got_bf16, const float *want, const float *want16, size_t n,
               int clamp, mm_verify_t *v)
{
    memset(v, 0, sizeof *v);
    double se = 0, sr = 0, maxe = 0, maxr = 0, scale = 1, worst_excess = -INFINITY;
    size_t inside = 0, inside_abs = 0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want16[i]));
    for (size_t i = 0; i < n; i++) {
        const double g = mm_got(got, got_bf16, i), w = want[i], w16 = want16[i];
        const double e = fabs(g - w), e16 = fabs(g - w16), rel = MM_VERIFY_RTOL * fabs(w16);
        finite &= isfinite(g);
        se += e * e;
        sr += w * w;
        maxe = fmax(maxe, e);
        maxr = fmax(maxr, fabs(w));
        inside += e16 <= MM_VERIFY_ATOL * scale + rel;
        inside_abs += e16 <= MM_VERIFY_ATOL + rel;
        const double excess = isfinite(g) ? e16 - (MM_VERIFY_ATOL * scale + rel) : INFINITY;
        if (excess > worst_excess) {
            worst_excess = excess;
            v->worst = i;
            v->worst_got = g;
            v->worst_want = w16;
        }
    }
    v->rel_l2 = sr > 0 ? sqrt(se / sr) : sqrt(se);
    v->rel_max = maxr > 0 ? maxe / maxr : maxe;
    v->elementwise = n ? (double)inside / (double)n : 1.0;
    v->elementwise_abs = n ? (double)inside_abs / (double)n : 1.0;
    v->scale = scale;
    v->finite = finite;
    v->oracle_ok = v->rel_l2 <= MM_VERIFY_REL_L2 && v->rel_max <= MM_VERIFY_REL_MAX;
    v->pass = finite && inside == n && (v->oracle_ok || clamp);
}
