/* The gated activations of the serving MegaMoE (src/serve/serve_act.c, spec §6.2), vector and
 * scalar paths, against a double-precision evaluation of the formulas: every kind, with and
 * without a clamp, parameters, inputs across the range, NaN propagation. */
#include <math.h>
#include <stdlib.h>

#include "harness/harness.h"
#include "kernels/simd.h"
#include "serve/serve_impl.h"

static double sig(double z) { return 1.0 / (1.0 + exp(-z)); }

static double want(const mm_sv_act_t *a, double g, double u)
{
    const double c = a->clamp;
    const double gc = g > c ? c : g, uc = u > c ? c : (u < -c ? -c : u);
    switch (a->kind) {
    case MM_SV_ACT_SWIGLU: return gc * sig(gc) * uc;
    case MM_SV_ACT_SWIGLUSTEP: { double s = g * sig(g); return (s > c ? c : s) * uc; }
    case MM_SV_ACT_SWIGLUOAI: return gc * sig(a->alpha * gc) * (uc + a->beta);
    default: {
        double l = a->linear_beta > 0 ? a->linear_beta * tanh(u / a->linear_beta) : u;
        return a->beta * tanh(g / a->beta) * sig(g) * l;
    }
    }
}

MM_TEST(activations_vector_and_scalar)
{
    enum { I = 37, ROWS = 5 };
    float h[ROWS * 2 * I], out[ROWS * I];
    unsigned s = 3;
    for (int i = 0; i < ROWS * 2 * I; i++) {
        s = s * 1103515245u + 12345u;
        h[i] = ((float)((s >> 8) & 0xFFFF) / 65536.0f - 0.5f) * 24.0f; /* [-12, 12] */
    }
    const mm_sv_act_t acts[] = {
        {MM_SV_ACT_SWIGLU, INFINITY, 1.702f, 1.0f, 0.0f},
        {MM_SV_ACT_SWIGLU, 0.7f, 1.702f, 1.0f, 0.0f},
        {MM_SV_ACT_SWIGLUSTEP, 0.4f, 1.702f, 1.0f, 0.0f},
        {MM_SV_ACT_SWIGLUOAI, INFINITY, 1.702f, 1.0f, 0.0f},
        {MM_SV_ACT_SWIGLUOAI, 2.5f, 1.2f, 0.5f, 0.0f},
        {MM_SV_ACT_SITUGLU, INFINITY, 1.702f, 1.0f, 0.0f},
        {MM_SV_ACT_SITUGLU, INFINITY, 1.702f, 0.7f, 0.3f},
    };
    for (int vec = 0; vec < 2; vec++) {
        mm_kernels_set_vector(vec);
        for (size_t k = 0; k < sizeof acts / sizeof acts[0]; k++) {
            mm_sv_activation(&acts[k], ROWS, I, h, 2 * I, out, I);
            double worst = 0;
            for (int r = 0; r < ROWS; r++)
                for (int i = 0; i < I; i++) {
                    double w = want(&acts[k], h[r * 2 * I + i], h[r * 2 * I + I + i]);
                    double e = fabs(out[r * I + i] - w) / (fabs(w) + 1e-6);
                    if (e > worst) worst = e;
                }
            if (worst > 1e-5) MM_FAIL_("kind %d (case %zu, vector %d): relative error %g", acts[k].kind, k, vec, worst);
        }
        float nanrow[2 * I];
        for (int i = 0; i < 2 * I; i++) nanrow[i] = i == 3 ? NAN : 0.5f;
        mm_sv_activation(&acts[0], 1, I, nanrow, 2 * I, out, I);
        ASSERT_TRUE(isnan(out[3]) && !isnan(out[4]));
    }
    mm_kernels_set_vector(1);
}
