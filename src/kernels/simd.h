/* Shared AVX-512 helpers of the kernels layer and the switch that forces scalar code.
 *
 * Every vector path in this layer has a scalar twin that defines its result; the two give the
 * same bits except where a comment says otherwise (SwiGLU's exp). Tests force the scalar path
 * with mm_kernels_set_vector(0) and compare. */
#ifndef MM_KERNELS_SIMD_H
#define MM_KERNELS_SIMD_H

#include <stdint.h>

#include "base/cpu.h"

/* 1 when the AVX-512 paths may run: the CPU has AVX-512 F/BW/VL/DQ and nobody forced scalar. */
int mm_kernels_use_avx512(void);
/* 0 forces the scalar paths in this layer (tests, benchmarks); returns the previous setting.
 * Process-wide; do not flip it while other threads run kernels. */
int mm_kernels_set_vector(int enabled);

#if MM_X86
#include <immintrin.h>

/* 16 bf16 (masked) -> fp32, exact. */
MM_TARGET_AVX512 static inline __m512 mm_load_bf16x16(const uint16_t *p, __mmask16 m)
{
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* fp32 -> bf16, round to nearest even, NaN kept NaN with its sign and top payload bits (the
 * quiet bit set only when those are zero): the bits of megamoe_fp32_to_bf16(). */
MM_TARGET_AVX512 static inline __m256i mm_cvt_bf16x16(__m512 v)
{
    const __m512i u = _mm512_castps_si512(v);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                     _mm512_and_si512(_mm512_srli_epi32(u, 16),
                                                                      _mm512_set1_epi32(1))));
    __mmask16 empty = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x007f0000));
    __m512i t = _mm512_mask_or_epi32(u, empty, u, _mm512_set1_epi32(0x00400000));
    r = _mm512_mask_mov_epi32(r, nan, t);
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

MM_TARGET_AVX512 static inline void mm_store_bf16x16(uint16_t *p, __mmask16 m, __m512 v)
{
    _mm256_mask_storeu_epi16(p, m, mm_cvt_bf16x16(v));
}

static inline __mmask16 mm_tail_mask16(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }
#endif

#endif /* MM_KERNELS_SIMD_H */
