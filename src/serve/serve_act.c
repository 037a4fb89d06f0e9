/* The gated activations of the serving MegaMoE (spec §6.2), in fp32 on the GMM1 output
 * h = [g | u] (gate columns [0, I), up columns [I, 2I)). c = the clamp (+inf when none):
 *   swiglu      a = SiLU(min(g, c)) * clip(u, -c, c)
 *   swiglustep  a = min(SiLU(g), c) * clip(u, -c, c)
 *   swigluoai   a = gc * sigmoid(alpha * gc) * (clip(u, -c, c) + beta),  gc = min(g, c)
 *   situglu     a = beta * tanh(g / beta) * sigmoid(g) * l(u), l(u) = u, or
 *               lambda * tanh(u / lambda) with linear_beta = lambda; the clamp is ignored
 * SiLU(z) = z / (1 + exp(-z)), sigmoid(z) = 1 / (1 + exp(-z)); NaN propagates. */
#include <math.h>

#include "serve/serve_impl.h"

static const char *const mm_sv_act_names[] = {"swiglu", "swiglustep", "swigluoai", "situglu"};

const char *mm_sv_act_name(int act)
{
    return act >= 0 && act < 4 ? mm_sv_act_names[act] : "unknown";
}

static inline float mm_sv_sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }
static inline float mm_sv_min(float a, float b) { return a > b ? b : a; } /* NaN a stays */
static inline float mm_sv_clip(float u, float c)
{
    if (u > c) return c;
    if (u < -c) return -c;
    return u;
}

void mm_sv_activation(const mm_sv_act_t *act, int64_t rows, int64_t I, const float *h,
                      int64_t ldh, float *a, int64_t lda)
{
    const float c = act->clamp;
    for (int64_t r = 0; r < rows; r++) {
        const float *g = h + r * ldh, *u = g + I;
        float *o = a + r * lda;
        switch (act->kind) {
        case MM_SV_ACT_SWIGLU:
            for (int64_t i = 0; i < I; i++) {
                float gc = mm_sv_min(g[i], c);
                o[i] = (gc / (1.0f + expf(-gc))) * mm_sv_clip(u[i], c);
            }
            break;
        case MM_SV_ACT_SWIGLUSTEP:
            for (int64_t i = 0; i < I; i++) {
                float s = g[i] / (1.0f + expf(-g[i]));
                o[i] = mm_sv_min(s, c) * mm_sv_clip(u[i], c);
            }
            break;
        case MM_SV_ACT_SWIGLUOAI:
            for (int64_t i = 0; i < I; i++) {
                float gc = mm_sv_min(g[i], c);
                o[i] = gc * mm_sv_sigmoid(act->alpha * gc) * (mm_sv_clip(u[i], c) + act->beta);
            }
            break;
        default: { /* situglu */
            const float b = act->beta, lb = act->linear_beta;
            for (int64_t i = 0; i < I; i++) {
                float l = lb > 0.0f ? lb * tanhf(u[i] / lb) : u[i];
                o[i] = b * tanhf(g[i] / b) * mm_sv_sigmoid(g[i]) * l;
            }
            break;
        }
        }
    }
}
