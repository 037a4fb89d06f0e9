/* The gated activations of the serving MegaMoE (spec §6.2), in fp32 on the GMM1 output
 * h = [g | u] (gate columns [0, I), up columns [I, 2I)). c = the clamp (+inf when none):
 *   swiglu      a = SiLU(min(g, c)) * clip(u, -c, c)
 *   swiglustep  a = min(SiLU(g), c) * clip(u, -c, c)
 *   swigluoai   a = gc * sigmoid(alpha * gc) * (clip(u, -c, c) + beta),  gc = min(g, c)
 *   situglu     a = beta * tanh(g / beta) * sigmoid(g) * l(u), l(u) = u, or
 *               lambda * tanh(u / lambda) with linear_beta = lambda; the clamp is ignored
 * SiLU(z) = z / (1 + exp(-z)), sigmoid(z) = 1 / (1 + exp(-z)); NaN propagates. */
#include <math.h>

#include "base/arch.h"
#include "kernels/simd.h"
#include "kernels/vmath.h"
#include "serve/serve_impl.h"

#if MM_X86
#include <immintrin.h>
#endif

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

/* ---- AVX-512: the same formulas, 16 lanes, exp by a polynomial (within 2 ulps of expf; the
 * same construction as kernels/swiglu.c's), so vector and scalar results may differ in the last
 * bits; every call on a machine takes the same path. ---- */
#if MM_X86
/* exp and sigmoid: kernels/vmath.h's (the SwiGLU kernels' own) */

/* tanh(x) = sign(x) (1 - 2 / (exp(2|x|) + 1)) */
MM_TARGET_AVX512 static inline __m512 mm_sv_tanh_ps(__m512 x)
{
    const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
    __m512 ax = _mm512_abs_ps(x);
    __m512 t = _mm512_sub_ps(one, _mm512_div_ps(two, _mm512_add_ps(mm_exp_ps(_mm512_mul_ps(two, ax)), one)));
    __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    t = _mm512_mask_sub_ps(t, neg, _mm512_setzero_ps(), t);
    return _mm512_mask_mov_ps(t, nan, x);
}

MM_TARGET_AVX512 static inline __m512 mm_sv_min_ps(__m512 v, __m512 c) /* NaN v stays */
{
    return _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, c, _CMP_GT_OQ), c);
}

MM_TARGET_AVX512 static inline __m512 mm_sv_clip_ps(__m512 u, __m512 c)
{
    __m512 nc = _mm512_sub_ps(_mm512_setzero_ps(), c);
    u = _mm512_mask_mov_ps(u, _mm512_cmp_ps_mask(u, c, _CMP_GT_OQ), c);
    return _mm512_mask_mov_ps(u, _mm512_cmp_ps_mask(u, nc, _CMP_LT_OQ), nc);
}

MM_TARGET_AVX512 static void mm_sv_act_row_avx512(const mm_sv_act_t *act, int64_t I, const float *g,
                                                 const float *u, float *o)
{
    const __m512 c = _mm512_set1_ps(act->clamp), one = _mm512_set1_ps(1.0f);
    const __m512 al = _mm512_set1_ps(act->alpha), be = _mm512_set1_ps(act->beta);
    const __m512 lb = _mm512_set1_ps(act->linear_beta);
    for (int64_t i = 0; i < I; i += 16) {
        const __mmask16 m = I - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (I - i)) - 1);
        __m512 gv = _mm512_maskz_loadu_ps(m, g + i), uv = _mm512_maskz_loadu_ps(m, u + i), r;
        switch (act->kind) {
        case MM_SV_ACT_SWIGLU: {
            __m512 gc = mm_sv_min_ps(gv, c);
            __m512 e = mm_exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), gc));
            r = _mm512_mul_ps(_mm512_div_ps(gc, _mm512_add_ps(one, e)), mm_sv_clip_ps(uv, c));
            break;
        }
        case MM_SV_ACT_SWIGLUSTEP: {
            __m512 e = mm_exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), gv));
            __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, e));
            r = _mm512_mul_ps(mm_sv_min_ps(s, c), mm_sv_clip_ps(uv, c));
            break;
        }
        case MM_SV_ACT_SWIGLUOAI: {
            __m512 gc = mm_sv_min_ps(gv, c);
            r = _mm512_mul_ps(_mm512_mul_ps(gc, mm_sigmoid_ps(_mm512_mul_ps(al, gc))),
                              _mm512_add_ps(mm_sv_clip_ps(uv, c), be));
            break;
        }
        default: { /* situglu */
            __m512 l = act->linear_beta > 0.0f
                           ? _mm512_mul_ps(lb, mm_sv_tanh_ps(_mm512_div_ps(uv, lb)))
                           : uv;
            r = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(be, mm_sv_tanh_ps(_mm512_div_ps(gv, be))),
                                            mm_sigmoid_ps(gv)),
                              l);
            break;
        }
        }
        _mm512_mask_storeu_ps(o + i, m, r);
    }
}
#endif

void mm_sv_activation(const mm_sv_act_t *act, int64_t rows, int64_t I, const float *h,
                      int64_t ldh, float *a, int64_t lda)
{
#if MM_X86
    if (mm_kernels_use_avx512()) { /* (mm_kernels_set_vector(0) forces the scalar twin) */
        for (int64_t r = 0; r < rows; r++)
            mm_sv_act_row_avx512(act, I, h + r * ldh, h + r * ldh + I, a + r * lda);
        return;
    }
#endif
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
