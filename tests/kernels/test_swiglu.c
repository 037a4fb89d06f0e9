/* SwiGLU: forward against an fp64 evaluation of the formula, backward against central finite
 * differences of that fp64 forward, the clamp's zero gradient, the limit's "off" values,
 * strides, odd widths, special values, and the AVX-512 path against the scalar one.
 * (Agreement with torch autograd is test_kernels_swiglu.py.) */
#include <stdlib.h>

#include "harness/harness.h"
#include "kernels/simd.h"
#include "kernels/swiglu.h"
#include "megamoe/dtype.h"
#include "megamoe/log.h"

static uint64_t rs = 0x243f6a8885a308d3ull;
static double urand(void)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (double)(rs >> 11) * 0x1p-53;
}

static uint16_t bf(double v) { return megamoe_fp32_to_bf16((float)v); }
static double fb(uint16_t b) { return megamoe_bf16_to_fp32(b); }

static int limit_on(double L) { return L > 0 && L < INFINITY; }

/* fp64 forward of one element (the definition in swiglu.h). */
static double ref_a(double g, double u, double L)
{
    if (limit_on(L)) {
        if (g > L) g = L;
        if (u > L) u = L;
        if (u < -L) u = -L;
    }
    return g / (1.0 + exp(-g)) * u;
}

typedef struct rows {
    int64_t R, I, ldh, lda, ldd;
    uint16_t *h, *a, *da, *dh;
} rows_t;

static void rows_make(rows_t *t, int64_t R, int64_t I, int pad, double scale)
{
    t->R = R, t->I = I;
    t->ldh = 2 * I + pad, t->lda = I + pad, t->ldd = 2 * I + 2 * pad;
    t->h = malloc(sizeof(uint16_t) * (size_t)(R * t->ldh + 1));
    t->a = malloc(sizeof(uint16_t) * (size_t)(R * t->lda + 1));
    t->da = malloc(sizeof(uint16_t) * (size_t)(R * t->lda + 1));
    t->dh = malloc(sizeof(uint16_t) * (size_t)(R * t->ldd + 1));
    for (int64_t i = 0; i < R * t->ldh; i++) t->h[i] = bf((urand() * 2 - 1) * scale);
    for (int64_t i = 0; i < R * t->lda; i++) t->da[i] = bf(urand() * 2 - 1), t->a[i] = 0x7777;
    for (int64_t i = 0; i < R * t->ldd; i++) t->dh[i] = 0x7777;
}

static void rows_free(rows_t *t) { free(t->h), free(t->a), free(t->da), free(t->dh); }

/* forward within one bf16 rounding (+ fp32 slack) of fp64; padding untouched */
static int check_fwd(const rows_t *t, double L)
{
    for (int64_t r = 0; r < t->R; r++)
        for (int64_t j = 0; j < t->lda; j++) {
            uint16_t got = t->a[r * t->lda + j];
            if (j >= t->I) {
                if (got != 0x7777) return fprintf(stderr, "fwd wrote padding [%lld,%lld]\n", (long long)r, (long long)j), 0;
                continue;
            }
            double want = ref_a(fb(t->h[r * t->ldh + j]), fb(t->h[r * t->ldh + t->I + j]), L);
            if (!(fabs(fb(got) - want) <= 0x1p-8 * fabs(want) + 1e-37)) {
                fprintf(stderr, "fwd [%lld,%lld] L=%g: got %.9g want %.9g\n", (long long)r,
                        (long long)j, L, fb(got), want);
                return 0;
            }
        }
    return 1;
}

/* backward against central differences of the fp64 forward, away from the clamp's kinks */
static int check_bwd(const rows_t *t, double L)
{
    for (int64_t r = 0; r < t->R; r++)
        for (int64_t j = 0; j < t->I; j++) {
            double g = fb(t->h[r * t->ldh + j]), u = fb(t->h[r * t->ldh + t->I + j]);
            double d = fb(t->da[r * t->lda + j]);
            double eps = 1e-6 * (1 + fabs(g) + fabs(u));
            if (limit_on(L) && (fabs(g - L) < 2 * eps || fabs(fabs(u) - L) < 2 * eps)) continue;
            double dg = d * (ref_a(g + eps, u, L) - ref_a(g - eps, u, L)) / (2 * eps);
            double du = d * (ref_a(g, u + eps, L) - ref_a(g, u - eps, L)) / (2 * eps);
            double got_g = fb(t->dh[r * t->ldd + j]), got_u = fb(t->dh[r * t->ldd + t->I + j]);
            double scale = fabs(d) * (1 + fabs(g)) * (1 + fabs(u)) * 1e-6;
            if (!(fabs(got_g - dg) <= 0x1p-7 * fabs(dg) + scale) || !(fabs(got_u - du) <= 0x1p-7 * fabs(du) + scale)) {
                fprintf(stderr, "bwd [%lld,%lld] g=%g u=%g L=%g: dg %.9g vs fd %.9g, du %.9g vs fd %.9g\n",
                        (long long)r, (long long)j, g, u, L, got_g, dg, got_u, du);
                return 0;
            }
        }
    for (int64_t r = 0; r < t->R; r++)
        for (int64_t j = 2 * t->I; j < t->ldd; j++)
            if (t->dh[r * t->ldd + j] != 0x7777) return fprintf(stderr, "bwd wrote padding\n"), 0;
    return 1;
}

MM_TEST(forward_and_backward_match_fp64_and_finite_differences)
{
    static const int64_t Is[] = {1, 17, 100, 257};
    static const double Ls[] = {0.0, 7.0, 1.5};
    for (int vec = 0; vec < 2; vec++) {
        int prev = mm_kernels_set_vector(vec);
        for (int ii = 0; ii < 4; ii++)
            for (int li = 0; li < 3; li++)
                for (int pad = 0; pad < 2; pad++) {
                    rows_t t;
                    rows_make(&t, 13, Is[ii], pad * 5, li == 2 ? 3.0 : 12.0);
                    ASSERT_OK(mm_swiglu_fwd(t.R, t.I, t.h, t.ldh, t.a, t.lda, (float)Ls[li]));
                    ASSERT_TRUE(check_fwd(&t, Ls[li]));
                    ASSERT_OK(mm_swiglu_bwd(t.R, t.I, t.h, t.ldh, t.da, t.lda, t.dh, t.ldd, (float)Ls[li]));
                    ASSERT_TRUE(check_bwd(&t, Ls[li]));
                    rows_free(&t);
                }
        mm_kernels_set_vector(prev);
    }
}

MM_TEST(clamp_blocks_the_gradient_outside_and_passes_at_the_bound)
{
    const float L = 2.0f;
    /* g: above, at, below the limit; u: above, at +L, inside, at -L, below -L */
    const float gs[] = {3.0f, 2.0f, 1.0f, -5.0f, 2.5f};
    const float us[] = {3.0f, 2.0f, 0.5f, -2.0f, -2.5f};
    uint16_t h[10], da[5], dh[10], a[5];
    for (int j = 0; j < 5; j++) h[j] = bf(gs[j]), h[5 + j] = bf(us[j]), da[j] = bf(1.0);
    for (int vec = 0; vec < 2; vec++) {
        int prev = mm_kernels_set_vector(vec);
        ASSERT_OK(mm_swiglu_fwd(1, 5, h, 10, a, 5, L));
        ASSERT_OK(mm_swiglu_bwd(1, 5, h, 10, da, 5, dh, 10, L));
        mm_kernels_set_vector(prev);
        for (int j = 0; j < 5; j++) {
            double gc = gs[j] > L ? L : gs[j];
            double uc = us[j] > L ? L : us[j] < -L ? -L : us[j];
            ASSERT_NEAR(fb(a[j]), gc / (1 + exp(-gc)) * uc, 0x1p-8 * fabs(gc * uc) + 1e-30);
            int gpass = gs[j] <= L, upass = us[j] >= -L && us[j] <= L;
            ASSERT_EQ_INT(fb(dh[j]) != 0.0, gpass);
            ASSERT_EQ_INT(fb(dh[5 + j]) != 0.0, upass);
        }
    }
}

MM_TEST(limit_off_values_agree)
{
    rows_t t;
    rows_make(&t, 4, 33, 0, 20.0);
    uint16_t ref_a_[4 * 33], ref_d[4 * 66];
    ASSERT_OK(mm_swiglu_fwd(4, 33, t.h, t.ldh, ref_a_, 33, 0.0f));
    ASSERT_OK(mm_swiglu_bwd(4, 33, t.h, t.ldh, t.da, 33, ref_d, 66, 0.0f));
    const float offs[] = {-1.0f, NAN, INFINITY};
    for (int i = 0; i < 3; i++) {
        ASSERT_OK(mm_swiglu_fwd(4, 33, t.h, t.ldh, t.a, 33, offs[i]));
        ASSERT_OK(mm_swiglu_bwd(4, 33, t.h, t.ldh, t.da, 33, t.dh, 66, offs[i]));
        ASSERT_TRUE(memcmp(t.a, ref_a_, sizeof ref_a_) == 0);
        ASSERT_TRUE(memcmp(t.dh, ref_d, sizeof ref_d) == 0);
    }
    /* and a limit above every |value| changes nothing either, except nothing */
    ASSERT_OK(mm_swiglu_fwd(4, 33, t.h, t.ldh, t.a, 33, 1000.0f));
    ASSERT_TRUE(memcmp(t.a, ref_a_, sizeof ref_a_) == 0);
    rows_free(&t);
}

MM_TEST(vector_and_scalar_paths_agree)
{
    if (!mm_kernels_use_avx512())
        MM_SKIP("no AVX-512 here: the scalar path is the only one (nothing to compare)");
    /* random rows over a wide range, plus special values */
    const int64_t I = 1000;
    uint16_t *h = malloc(2 * I * 2), *da = malloc(I * 2);
    uint16_t *a0 = malloc(I * 2), *a1 = malloc(I * 2), *d0 = malloc(4 * I), *d1 = malloc(4 * I);
    static const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 88.0f, -88.0f, 100.0f,
                                     -100.0f, 1e-30f, -1e-30f, 3e38f, -3e38f, 0.5f};
    for (int64_t j = 0; j < 2 * I; j++)
        h[j] = j < 14 * 14 ? bf(specials[j % 14]) : bf((urand() * 2 - 1) * (j % 3 ? 8.0 : 90.0));
    for (int64_t j = 0; j < 2 * I; j++) if (j >= I && j < I + 14 * 14) h[j] = bf(specials[(j / 14) % 14]);
    for (int64_t j = 0; j < I; j++) da[j] = bf(urand() * 4 - 2);
    int ulp_diffs = 0;
    for (int li = 0; li < 2; li++) {
        float L = li ? 6.0f : 0.0f;
        mm_kernels_set_vector(0);
        ASSERT_OK(mm_swiglu_fwd(1, I, h, 2 * I, a0, I, L));
        ASSERT_OK(mm_swiglu_bwd(1, I, h, 2 * I, da, I, d0, 2 * I, L));
        mm_kernels_set_vector(1);
        ASSERT_OK(mm_swiglu_fwd(1, I, h, 2 * I, a1, I, L));
        ASSERT_OK(mm_swiglu_bwd(1, I, h, 2 * I, da, I, d1, 2 * I, L));
        for (int64_t j = 0; j < 3 * I; j++) {
            uint16_t x = j < I ? a0[j] : d0[j - I], y = j < I ? a1[j] : d1[j - I];
            int xnan = (x & 0x7fff) > 0x7f80, ynan = (y & 0x7fff) > 0x7f80;
            if (xnan || ynan) {
                if (xnan != ynan) MM_FAIL_("element %lld: NaN only on one path (%#x vs %#x)", (long long)j, x, y);
                continue;
            }
            int diff = abs((int)(int16_t)x - (int)(int16_t)y);
            if (diff > 1) MM_FAIL_("element %lld: scalar %#x vector %#x differ by %d ulps", (long long)j, x, y, diff);
            ulp_diffs += diff;
        }
    }
    /* the exp polynomial differs from expf in the last fp32 bit only: rare bf16 differences */
    ASSERT_LE_INT(ulp_diffs, 3 * I / 50);
    free(h), free(da), free(a0), free(a1), free(d0), free(d1);
}

MM_TEST(empty_and_bad_arguments)
{
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    uint16_t buf[8] = {0};
    ASSERT_OK(mm_swiglu_fwd(0, 4, NULL, 8, NULL, 4, 0.0f));
    ASSERT_OK(mm_swiglu_bwd(3, 0, NULL, 0, NULL, 0, NULL, 0, 0.0f));
    ASSERT_STATUS(mm_swiglu_fwd(1, 4, buf, 7, buf, 4, 0.0f), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_swiglu_fwd(-1, 4, buf, 8, buf, 4, 0.0f), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_swiglu_bwd(1, 4, buf, 8, NULL, 4, buf, 8, 0.0f), MEGAMOE_INVALID_ARGUMENT);
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
}
