/* Row kernels (kernels/rows.h): every routine on both paths (AVX-512 and its portable C twin,
 * switched with mm_kernels_set_vector) against the definition written out here, bit for bit,
 * over lengths around the 16-lane blocks and rows holding NaN, Inf, -0 and subnormals. */
#include <stdlib.h>

#include "harness/harness.h"
#include "kernels/rows.h"
#include "kernels/simd.h"
#include "megamoe/dtype.h"

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static double urand(void)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (double)(rs >> 11) * 0x1p-53;
}

static const int64_t lengths[] = {0, 1, 7, 15, 16, 17, 31, 32, 33, 63, 100, 257, 1027};
#define NLEN ((int)(sizeof lengths / sizeof lengths[0]))
static const float weights[] = {1.0f, 0.37f, -2.5f, 0.0f};
#define NW ((int)(sizeof weights / sizeof weights[0]))

/* Random values with a sprinkle of special ones (only where `specials`). */
static float value(int specials)
{
    double u = urand();
    if (specials && u < 0.03) {
        static const float sp[] = {-0.0f, INFINITY, -INFINITY, 1e-40f, -3e-39f};
        return sp[(int)(urand() * 5) % 5];
    }
    if (specials && u < 0.04) return NAN;
    return (float)((urand() * 2 - 1) * 8);
}

static void fill(megamoe_dtype_t t, uint16_t *x, float *f, int64_t n, int specials)
{
    for (int64_t i = 0; i < n; i++) {
        float v = value(specials);
        x[i] = t == MEGAMOE_DTYPE_BF16 ? megamoe_fp32_to_bf16(v) : megamoe_fp32_to_fp16(v);
        f[i] = t == MEGAMOE_DTYPE_BF16 ? megamoe_bf16_to_fp32(x[i]) : megamoe_fp16_to_fp32(x[i]);
    }
}

static int same_bits(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

/* The definition of the 16-lane order (rows.h). */
static float sum16_def(const float *v, int64_t n)
{
    float lane[16] = {0};
    for (int64_t i = 0; i < n; i++) lane[i % 16] = lane[i % 16] + v[i];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) lane[l] = lane[l] + lane[l + w];
    return lane[0];
}

/* The body once on the vector path (vec = 1, where the CPU has it), once on the C twin. Cases
 * end with mm_kernels_set_vector(1), the default. */
#define BOTH_PATHS(vec) for (int vec = 1; vec >= 0 && (mm_kernels_set_vector(vec), 1); vec--)

MM_TEST(axpy_matches_definition_on_both_paths)
{
    static const megamoe_dtype_t types[] = {MEGAMOE_DTYPE_BF16, MEGAMOE_DTYPE_FP16};
    for (int ti = 0; ti < 2; ti++)
        for (int li = 0; li < NLEN; li++)
            for (int wi = 0; wi < NW; wi++) {
                const int64_t n = lengths[li];
                const float w = weights[wi];
                uint16_t x[1027];
                float xf[1027], acc0[1027], want[1027], got[2][1027];
                fill(types[ti], x, xf, n, 1);
                for (int64_t i = 0; i < n; i++) acc0[i] = value(1);
                for (int64_t i = 0; i < n; i++) {
                    float p = xf[i] * w;
                    want[i] = w == 1.0f ? acc0[i] + xf[i] : acc0[i] + p;
                }
                BOTH_PATHS(vec) {
                    memcpy(got[vec], acc0, sizeof(float) * (size_t)n);
                    mm_rows_axpy(types[ti], got[vec], x, w, n);
                }
                if (!same_bits(got[0], want, sizeof(float) * (size_t)n) ||
                    !same_bits(got[1], want, sizeof(float) * (size_t)n))
                    MM_FAIL_("axpy %s n=%lld w=%g: a path differs from the definition",
                             megamoe_dtype_name(types[ti]), (long long)n, (double)w);
            }
    mm_kernels_set_vector(1);
}

MM_TEST(axpy_f32_matches_definition_on_both_paths)
{
    for (int li = 0; li < NLEN; li++)
        for (int wi = 0; wi < NW; wi++) {
            const int64_t n = lengths[li];
            const float w = weights[wi];
            float v[1027], acc0[1027], want[1027], got[2][1027];
            for (int64_t i = 0; i < n; i++) v[i] = value(1), acc0[i] = value(1);
            for (int64_t i = 0; i < n; i++) {
                float p = v[i] * w;
                want[i] = acc0[i] + p;
            }
            BOTH_PATHS(vec) {
                memcpy(got[vec], acc0, sizeof(float) * (size_t)n);
                mm_rows_axpy_f32(got[vec], v, w, n);
            }
            if (!same_bits(got[0], want, sizeof(float) * (size_t)n) ||
                !same_bits(got[1], want, sizeof(float) * (size_t)n))
                MM_FAIL_("axpy_f32 n=%lld w=%g: a path differs from the definition", (long long)n,
                         (double)w);
        }
    mm_kernels_set_vector(1);
}

MM_TEST(scale_dot_and_sum16_match_definition_on_both_paths)
{
    for (int li = 0; li < NLEN; li++)
        for (int wi = 0; wi < NW; wi++) {
            const int64_t n = lengths[li];
            const float w = weights[wi];
            uint16_t a[1027], b[1027], want[1027], got[2][1027];
            float af[1027], bf[1027], prod[1027];
            fill(MEGAMOE_DTYPE_BF16, a, af, n, wi == 0); /* specials in one pass */
            fill(MEGAMOE_DTYPE_BF16, b, bf, n, 0);
            for (int64_t i = 0; i < n; i++) want[i] = megamoe_fp32_to_bf16(w * af[i]);
            for (int64_t i = 0; i < n; i++) prod[i] = af[i] * bf[i];
            const float dot_want = sum16_def(prod, n), sum_want = sum16_def(af, n);
            float dot[2], sum[2];
            BOTH_PATHS(vec) {
                mm_rows_scale(got[vec], a, w, (size_t)n);
                dot[vec] = mm_rows_dot(a, b, (size_t)n);
                sum[vec] = mm_rows_sum16(af, n);
            }
            for (int p = 0; p < 2; p++) {
                if (!same_bits(got[p], want, 2 * (size_t)n))
                    MM_FAIL_("scale n=%lld w=%g path %d differs", (long long)n, (double)w, p);
                if (!same_bits(&dot[p], &dot_want, 4) || !same_bits(&sum[p], &sum_want, 4))
                    MM_FAIL_("dot/sum16 n=%lld path %d: %g/%g, want %g/%g", (long long)n, p,
                             (double)dot[p], (double)sum[p], (double)dot_want, (double)sum_want);
            }
        }
    mm_kernels_set_vector(1);
}

MM_TEST(first_nonfinite_finds_the_first_on_both_paths)
{
    static float f[1027];
    static uint16_t h[1027];
    for (int li = 0; li < NLEN; li++) {
        const int64_t n = lengths[li];
        for (int64_t at = -1; at < n; at += n > 40 ? 13 : 1) {
            for (int64_t i = 0; i < n; i++) f[i] = value(0), h[i] = megamoe_fp32_to_bf16(f[i]);
            if (at >= 0) {
                f[at] = at % 2 ? INFINITY : NAN;
                h[at] = megamoe_fp32_to_bf16(f[at]);
                if (at + 3 < n) f[at + 3] = NAN, h[at + 3] = 0xff80; /* a later one too */
            }
            BOTH_PATHS(vec) {
                ASSERT_EQ_INT(mm_rows_first_nonfinite(f, 0, (size_t)n), at);
                ASSERT_EQ_INT(mm_rows_first_nonfinite(h, 1, (size_t)n), at);
            }
        }
    }
    mm_kernels_set_vector(1);
}

MM_TEST(the_switch_reaches_the_vector_path_where_the_cpu_has_it)
{
    int prev = mm_kernels_set_vector(1);
    ASSERT_EQ_INT(mm_kernels_use_avx512(), mm_cpu_has_avx512());
    mm_kernels_set_vector(0);
    ASSERT_EQ_INT(mm_kernels_use_avx512(), 0);
    mm_kernels_set_vector(prev);
}
