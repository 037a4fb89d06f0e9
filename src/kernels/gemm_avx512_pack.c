/* Packing for the own AVX512-BF16 GEMM backend (formats in gemm_avx512.h).
 *
 * A (NN/NT): 6 row pointers -> [kp][6] pairs, 8 pairs per step with two dword permutes per
 * output vector (rows 0-3 through vpermt2d, rows 4-5 merged under a mask); packing a
 * 256 x 4096 block takes ~0.1 ms when A is in L3 and ~0.2 ms from memory (1-1.6% of the
 * product), bound by reading A. Row lists cost nothing extra: the driver hands over the row
 * pointers. A (TN: rows of C are columns of A): pairs of A rows interleaved 48 columns at a
 * time, a whole row block per call.
 * B: NN pairs rows 2p and 2p+1 with one vpermt2w per 16 columns; NT is a dword transpose,
 * 16 x 16 blocks in registers (weights are re-packed after every optimizer step in training).
 * Past K and past the last column everything is 0, never an element outside the source.
 * CPUs without AVX-512 (the AVX2 form) pack the same formats in plain C (~1 % of a product). */
#include <string.h>

#include "gemm_avx512.h"

#if MM_X86
#include <immintrin.h>

#include "simd.h"

/* Output dword i of vector v is pair k = (16v+i)/6 of row r = (16v+i)%6. Rows 0-1 come from
 * Z01 = [row0 | row1] (8 pairs each), rows 2-3 from Z23 (indices 16+), rows 4-5 from Z45. */
static const int32_t mm_idx0123[3][16] __attribute__((aligned(64))) = {
    {0, 8, 16, 24, 0, 0, 1, 9, 17, 25, 0, 0, 2, 10, 18, 26},
    {0, 0, 3, 11, 19, 27, 0, 0, 4, 12, 20, 28, 0, 0, 5, 13},
    {21, 29, 0, 0, 6, 14, 22, 30, 0, 0, 7, 15, 23, 31, 0, 0}};
static const int32_t mm_idx45[3][16] __attribute__((aligned(64))) = {
    {0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 1, 9, 0, 0, 0, 0},
    {2, 10, 0, 0, 0, 0, 3, 11, 0, 0, 0, 0, 4, 12, 0, 0},
    {0, 0, 5, 13, 0, 0, 0, 0, 6, 14, 0, 0, 0, 0, 7, 15}};
static const __mmask16 mm_mask45[3] = {0x0c30, 0x30c3, 0xc30c};

MM_TARGET_AVX512 static void mm_pack_a_rows_avx512(uint32_t *dst, const uint16_t *const *rowp,
                                                  int rows, int64_t K, int64_t p0, int64_t kp,
                                                  const uint16_t *const *next, int next_rows)
{
    __m512i i0123[3], i45[3];
    for (int v = 0; v < 3; v++) {
        i0123[v] = _mm512_load_si512((const void *)mm_idx0123[v]);
        i45[v] = _mm512_load_si512((const void *)mm_idx45[v]);
    }
    for (int64_t q = 0; q < kp; q += 8) {
        int64_t k0 = 2 * (p0 + q);
        if (next) /* the next micro-panel's rows, 32 bytes on: every line twice (some drop) */
            for (int r = 0; r < next_rows; r++)
                _mm_prefetch((const char *)(next[r] + k0), _MM_HINT_T0);
        int64_t valid = K - k0 < 16 ? K - k0 : 16; /* bf16 elements of each row in this step */
        __mmask16 lm = mm_tail_mask16(valid > 0 ? valid : 0);
        __m256i y[MM_AVX_MR];
        for (int r = 0; r < MM_AVX_MR; r++)
            y[r] = r < rows ? _mm256_maskz_loadu_epi16(lm, rowp[r] + k0)
                            : _mm256_setzero_si256();
        __m512i z01 = _mm512_inserti64x4(_mm512_castsi256_si512(y[0]), y[1], 1);
        __m512i z23 = _mm512_inserti64x4(_mm512_castsi256_si512(y[2]), y[3], 1);
        __m512i z45 = _mm512_inserti64x4(_mm512_castsi256_si512(y[4]), y[5], 1);
        int64_t n = kp - q < 8 ? kp - q : 8;
        uint32_t *o = dst + q * MM_AVX_MR;
        for (int v = 0; v < 3; v++) {
            __m512i t = _mm512_permutex2var_epi32(z01, i0123[v], z23);
            t = _mm512_mask_permutexvar_epi32(t, mm_mask45[v], i45[v], z45);
            int64_t left = n * MM_AVX_MR - 16 * v; /* dwords of this vector to store */
            if (left >= 16) _mm512_storeu_si512((void *)(o + 16 * v), t);
            else if (left > 0) _mm512_mask_storeu_epi32(o + 16 * v, mm_tail_mask16(left), t);
        }
    }
}

/* TN: every micro-panel of a row block at once. For each pair of rows (2p, 2p+1) of A, 48
 * columns (8 micro-panels) at a time: two vpermt2w interleave the rows into pairs (as for B),
 * the 48 dwords go to a small buffer and 6 at a time to their micro-panels. Reads each A row
 * once per row block, sequentially. */
#define MM_PF_PAIRS 4 /* pairs of A rows the TN packer prefetches ahead */

MM_TARGET_AVX512 static void mm_pack_a_cols_avx512(uint32_t *dst, const uint16_t *A, int64_t lda,
                                                  const uint16_t *const *a_rows, int64_t m,
                                                  int64_t mb, int64_t K, int64_t kcp)
{
    const __m512i lo = _mm512_load_si512((const void *)mm_vnni_pair_idx[0]);
    const __m512i hi = _mm512_load_si512((const void *)mm_vnni_pair_idx[1]);
    const int64_t K2 = (K + 1) / 2, tiles = (mb + MM_AVX_MR - 1) / MM_AVX_MR;
    uint32_t buf[48] __attribute__((aligned(64)));
    for (int64_t p = 0; p < K2; p++) {
        const int64_t k = 2 * p, p0 = p / kcp * kcp, kc = K2 - p0 < kcp ? K2 - p0 : kcp;
        const uint16_t *r0 = (a_rows ? a_rows[k] : A + k * lda) + m;
        const uint16_t *r1 = k + 1 < K ? (a_rows ? a_rows[k + 1] : A + (k + 1) * lda) + m : NULL;
        uint32_t *o = dst + (size_t)(p0 * tiles + (p - p0)) * MM_AVX_MR; /* tile 0, pair p */
        if (k + 2 * MM_PF_PAIRS + 1 < K) { /* the rows of a later pair: each row segment is a
                                              few lines in its own page, which the hardware
                                              prefetchers do not follow */
            const char *f0 = (const char *)((a_rows ? a_rows[k + 2 * MM_PF_PAIRS]
                                                    : A + (k + 2 * MM_PF_PAIRS) * lda) + m);
            const char *f1 = (const char *)((a_rows ? a_rows[k + 2 * MM_PF_PAIRS + 1]
                                                    : A + (k + 2 * MM_PF_PAIRS + 1) * lda) + m);
            for (int64_t b = 0; b < mb * 2; b += 64) {
                _mm_prefetch(f0 + b, _MM_HINT_T0);
                _mm_prefetch(f1 + b, _MM_HINT_T0);
            }
        }
        for (int64_t c0 = 0, t = 0; c0 < mb; c0 += 48) {
            const int64_t c = mb - c0 < 48 ? mb - c0 : 48;
            const __mmask32 m0 = c >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << c) - 1u);
            const __mmask32 m1 = c > 32 ? (__mmask32)((1u << (c - 32)) - 1u) : 0;
            __m512i x0 = _mm512_maskz_loadu_epi16(m0, r0 + c0);
            __m512i y0 = r1 ? _mm512_maskz_loadu_epi16(m0, r1 + c0) : _mm512_setzero_si512();
            __m512i x1 = _mm512_maskz_loadu_epi16(m1, r0 + c0 + 32);
            __m512i y1 = r1 ? _mm512_maskz_loadu_epi16(m1, r1 + c0 + 32) : _mm512_setzero_si512();
            _mm512_store_si512((void *)buf, _mm512_permutex2var_epi16(x0, lo, y0));
            _mm512_store_si512((void *)(buf + 16), _mm512_permutex2var_epi16(x0, hi, y0));
            _mm512_store_si512((void *)(buf + 32), _mm512_permutex2var_epi16(x1, lo, y1));
            for (int64_t j = 0; j < 8 && t < tiles; j++, t++)
                memcpy(o + (size_t)(t * kc) * MM_AVX_MR, buf + 6 * j, MM_AVX_MR * sizeof(uint32_t));
        }
    }
}

MM_TARGET_AVX512 static void mm_pack_b_nn(uint16_t *dst, const uint16_t *src, int64_t ld,
                                          int64_t K, int64_t n0, int64_t cols)
{
    const __m512i lo = _mm512_load_si512((const void *)mm_vnni_pair_idx[0]);
    const __m512i hi = _mm512_load_si512((const void *)mm_vnni_pair_idx[1]);
    __mmask32 m[2];
    for (int h = 0; h < 2; h++) {
        int64_t c = cols - 32 * h;
        m[h] = c >= 32 ? (__mmask32)0xffffffffu : c > 0 ? (__mmask32)((1u << c) - 1u) : 0;
    }
    int64_t K2 = (K + 1) / 2;
    for (int64_t p = 0; p < K2; p++) {
        const uint16_t *r0 = src + 2 * p * ld + n0;
        const uint16_t *r1 = 2 * p + 1 < K ? r0 + ld : NULL;
        uint16_t *o = dst + p * 2 * MM_AVX_NR;
        for (int h = 0; h < 2; h++) {
            __m512i x0 = _mm512_maskz_loadu_epi16(m[h], r0 + 32 * h);
            __m512i x1 = r1 ? _mm512_maskz_loadu_epi16(m[h], r1 + 32 * h) : _mm512_setzero_si512();
            _mm512_store_si512((void *)(o + 64 * h), _mm512_permutex2var_epi16(x0, lo, x1));
            _mm512_store_si512((void *)(o + 64 * h + 32), _mm512_permutex2var_epi16(x0, hi, x1));
        }
    }
}

/* NT: the panel's pair p, column j is dword p of source row n0 + j, so a panel is the
 * transpose of a [cols][ceil(K/2)] dword matrix: 16 x 16 blocks through registers (an odd K's
 * last pair gets a 0 partner from the masked load; rows past cols are 0). */
MM_TARGET_AVX512 static void mm_pack_b_nt(uint16_t *dst, const uint16_t *src, int64_t ld,
                                          int64_t K, int64_t n0, int64_t cols)
{
    const int64_t K2 = (K + 1) / 2;
    uint32_t *out = (uint32_t *)dst;
    for (int64_t g = 0; g < MM_AVX_NR; g += 16) {
        for (int64_t p0 = 0; p0 < K2; p0 += 16) {
            int64_t valid = K - 2 * p0 < 32 ? K - 2 * p0 : 32; /* bf16 elements per row */
            __mmask32 lm = valid >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << valid) - 1u);
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = g + i < cols ? _mm512_maskz_loadu_epi16(lm, src + (n0 + g + i) * ld + 2 * p0)
                                    : _mm512_setzero_si512();
            mm_transpose16_epi32(r);
            int64_t n = K2 - p0 < 16 ? K2 - p0 : 16;
            for (int64_t j = 0; j < n; j++)
                _mm512_store_si512((void *)(out + (p0 + j) * MM_AVX_NR + g), r[j]);
        }
    }
}

/* ---- the same formats in plain C: the AVX2 form (CPUs without AVX-512) ------------------ */

static void mm_pack_a_rows_c(uint32_t *dst, const uint16_t *const *rowp, int rows, int64_t K,
                             int64_t p0, int64_t kp)
{
    for (int64_t q = 0; q < kp; q++) {
        const int64_t k = 2 * (p0 + q);
        for (int r = 0; r < MM_AVX_MR; r++) {
            uint32_t v = 0;
            if (r < rows && k < K) {
                v = rowp[r][k];
                if (k + 1 < K) v |= (uint32_t)rowp[r][k + 1] << 16;
            }
            dst[q * MM_AVX_MR + r] = v;
        }
    }
}

static void mm_pack_a_cols_c(uint32_t *dst, const uint16_t *A, int64_t lda,
                             const uint16_t *const *a_rows, int64_t m, int64_t mb, int64_t K,
                             int64_t kcp)
{
    const int64_t K2 = (K + 1) / 2, tiles = (mb + MM_AVX_MR - 1) / MM_AVX_MR;
    for (int64_t p = 0; p < K2; p++) {
        const int64_t k = 2 * p, p0 = p / kcp * kcp, kc = K2 - p0 < kcp ? K2 - p0 : kcp;
        const uint16_t *r0 = (a_rows ? a_rows[k] : A + k * lda) + m;
        const uint16_t *r1 = k + 1 < K ? (a_rows ? a_rows[k + 1] : A + (k + 1) * lda) + m : NULL;
        uint32_t *o = dst + (size_t)(p0 * tiles + (p - p0)) * MM_AVX_MR; /* tile 0, pair p */
        for (int64_t t = 0; t < tiles; t++)
            for (int i = 0; i < MM_AVX_MR; i++) {
                const int64_t c = t * MM_AVX_MR + i;
                uint32_t v = 0;
                if (c < mb) v = r0[c] | (r1 ? (uint32_t)r1[c] << 16 : 0u);
                o[(size_t)(t * kc) * MM_AVX_MR + i] = v;
            }
    }
}

static void mm_pack_b_c(uint16_t *dst, const uint16_t *src, int64_t ld, int nt, int64_t K,
                        int64_t n0, int64_t cols)
{
    const int64_t K2 = (K + 1) / 2;
    for (int64_t p = 0; p < K2; p++)
        for (int64_t j = 0; j < MM_AVX_NR; j++)
            for (int h = 0; h < 2; h++) {
                const int64_t k = 2 * p + h;
                uint16_t v = 0;
                if (k < K && j < cols) v = nt ? src[(n0 + j) * ld + k] : src[k * ld + n0 + j];
                dst[p * 2 * MM_AVX_NR + 2 * j + h] = v;
            }
}

void mm_avx512_pack_a_rows(uint32_t *dst, const uint16_t *const *rowp, int rows, int64_t K,
                           int64_t p0, int64_t kp, const uint16_t *const *next, int next_rows)
{
    if (mm_cpu_has_avx512()) mm_pack_a_rows_avx512(dst, rowp, rows, K, p0, kp, next, next_rows);
    else mm_pack_a_rows_c(dst, rowp, rows, K, p0, kp);
}

void mm_avx512_pack_a_cols(uint32_t *dst, const uint16_t *A, int64_t lda,
                           const uint16_t *const *a_rows, int64_t m, int64_t mb, int64_t K,
                           int64_t kcp)
{
    if (mm_cpu_has_avx512()) mm_pack_a_cols_avx512(dst, A, lda, a_rows, m, mb, K, kcp);
    else mm_pack_a_cols_c(dst, A, lda, a_rows, m, mb, K, kcp);
}

void mm_avx512_pack_b_panel(uint16_t *dst, const uint16_t *src, int64_t ld, int nt, int64_t K,
                            int64_t n0, int64_t cols)
{
    if (!mm_cpu_has_avx512()) mm_pack_b_c(dst, src, ld, nt, K, n0, cols);
    else if (nt) mm_pack_b_nt(dst, src, ld, K, n0, cols);
    else mm_pack_b_nn(dst, src, ld, K, n0, cols);
}
#endif /* MM_X86 */
