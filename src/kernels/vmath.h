/* Vector transcendental helpers of the kernels layer (SwiGLU and the companion activations):
 * exp and sigmoid on 16 fp32 lanes. */
#ifndef MM_KERNELS_VMATH_H
#define MM_KERNELS_VMATH_H

#include "simd.h"

#if MM_X86
/* exp(x): x = n ln2 + r, |r| <= ln2/2, Cephes' degree-6 polynomial, scalef for 2^n. x is first
 * clamped to [-104, 89], where exp already rounds to 0 / overflows to inf, so +-inf inputs give
 * 0 / inf; NaN stays NaN. Within 2 ulps of expf over the fp32 range. */
MM_TARGET_AVX512 static inline __m512 mm_exp_ps(__m512 x)
{
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 ln2_hi = _mm512_set1_ps(0.693359375f), ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512 xc = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(89.0f)), _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, ln2_hi, xc);
    r = _mm512_fnmadd_ps(n, ln2_lo, r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_mask_mov_ps(_mm512_scalef_ps(p, n), nan, x);
}

MM_TARGET_AVX512 static inline __m512 mm_sigmoid_ps(__m512 x)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_div_ps(one, _mm512_add_ps(one, mm_exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

#endif

#endif /* MM_KERNELS_VMATH_H */
