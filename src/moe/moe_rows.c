/* The source-side reduce (see moe_rows.h). */
#include "moe/moe_rows.h"

#include <string.h>

#include "megamoe/dtype.h"

void mm_rows_reduce_tokens(uint16_t *out, const uint16_t *ret, const int32_t *slot_pos,
                           const float *w, uint16_t *ysave, float *acc, int64_t H, int64_t K,
                           int64_t t0, int64_t t1)
{
    const size_t n = (size_t)H;
    for (int64_t t = t0; t < t1; t++) {
        memset(acc, 0, n * sizeof *acc);
        for (int64_t k = 0; k < K; k++) {
            const int64_t pos = slot_pos[t * K + k];
            const uint16_t *y = ret + pos * H;
            mm_rows_axpy(MEGAMOE_DTYPE_BF16, acc, y, w ? w[t * K + k] : 1.0f, H);
            if (ysave) memcpy(ysave + pos * H, y, n * 2);
        }
        megamoe_convert(out + t * H, MEGAMOE_DTYPE_BF16, acc, MEGAMOE_DTYPE_FP32, n);
    }
}
