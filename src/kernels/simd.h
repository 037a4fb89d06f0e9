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

/* The 64-byte operand of ldtilecfg (palette 1): per tile its rows and bytes per row. */
typedef struct mm_tilecfg {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} mm_tilecfg_t;

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

/* vpermt2w indices that interleave two rows into VNNI pairs (the operand layout of vdpbf16ps
 * and tdpbf16ps): output word i takes column i/2 (+16 for the upper half) of row 0 (even i)
 * or of row 1 (odd i, index + 32). */
static const int16_t mm_vnni_pair_idx[2][32] __attribute__((aligned(64))) = {
    {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
     8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47},
    {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
     24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63}};

/* Transpose of a 16 x 16 dword matrix in 16 registers: r[i] = row i in, r[j] = column j out.
 * 32-bit then 64-bit interleaves inside the 128-bit lanes give, for column 4L+q, the rows in
 * groups of 4 spread over the lanes L of four vectors; two lane shuffles gather them. */
MM_TARGET_AVX512 static inline void mm_transpose16_epi32(__m512i r[16])
{
    __m512i a[8], b[8], e[4][4];
    for (int k = 0; k < 8; k++) {
        a[k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        b[k] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    for (int m = 0; m < 4; m++) { /* e[q][m], lane L: rows 4m..4m+3 of column 4L+q */
        e[0][m] = _mm512_unpacklo_epi64(a[2 * m], a[2 * m + 1]);
        e[1][m] = _mm512_unpackhi_epi64(a[2 * m], a[2 * m + 1]);
        e[2][m] = _mm512_unpacklo_epi64(b[2 * m], b[2 * m + 1]);
        e[3][m] = _mm512_unpackhi_epi64(b[2 * m], b[2 * m + 1]);
    }
    for (int q = 0; q < 4; q++) {
        __m512i f0 = _mm512_shuffle_i32x4(e[q][0], e[q][1], _MM_SHUFFLE(1, 0, 1, 0));
        __m512i f1 = _mm512_shuffle_i32x4(e[q][0], e[q][1], _MM_SHUFFLE(3, 2, 3, 2));
        __m512i f2 = _mm512_shuffle_i32x4(e[q][2], e[q][3], _MM_SHUFFLE(1, 0, 1, 0));
        __m512i f3 = _mm512_shuffle_i32x4(e[q][2], e[q][3], _MM_SHUFFLE(3, 2, 3, 2));
        r[q] = _mm512_shuffle_i32x4(f0, f2, _MM_SHUFFLE(2, 0, 2, 0));      /* column q */
        r[4 + q] = _mm512_shuffle_i32x4(f0, f2, _MM_SHUFFLE(3, 1, 3, 1));  /* column 4+q */
        r[8 + q] = _mm512_shuffle_i32x4(f1, f3, _MM_SHUFFLE(2, 0, 2, 0));  /* column 8+q */
        r[12 + q] = _mm512_shuffle_i32x4(f1, f3, _MM_SHUFFLE(3, 1, 3, 1)); /* column 12+q */
    }
}

static inline __mmask16 mm_tail_mask16(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }
#endif

#endif /* MM_KERNELS_SIMD_H */
