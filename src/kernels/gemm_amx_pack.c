/* Packing for the own AMX-BF16 GEMM backend (formats in gemm_amx.h). Everything past K and
 * past the last row / column is written as 0 and no element outside the source is read, so a
 * k-step is always a whole tdpbf16ps on finite data.
 *
 * A (NN/NT): one 64-byte masked copy per row and k-step (the tile row is the row's 32 k
 * values); rows are read through pointers, so a row list (gather) costs nothing extra, and
 * the next micro-panel's rows are prefetched while one is copied (short row segments in
 * separate pages do not train the hardware prefetchers).
 * A (TN) and B (NT) need a transpose: pairs of k become dwords, and 16 x 16 dword blocks are
 * transposed in registers. B (NN) interleaves rows 2p and 2p+1 with one vpermt2w per 16
 * columns. */
#include <string.h>

#include "gemm_amx.h"

#if MM_X86
#include <immintrin.h>

#include "simd.h"

static inline __mmask32 mm_amx_mask32(int64_t n)
{
    return n >= 32 ? (__mmask32)0xffffffffu : n > 0 ? (__mmask32)((1u << n) - 1u) : 0;
}

MM_TARGET_AVX512 void mm_amx_pack_a_rows(char *dst, const uint16_t *const *rowp, int rows,
                                         int64_t K, const uint16_t *const *next, int next_rows)
{
    const int64_t KS = mm_amx_ksteps(K);
    const int fill = rows <= 16 ? 16 : 32; /* a 1-tile micro-panel never reads rows 16-31 */
    for (int r = 0; r < fill; r++) {
        char *o = dst + r * 64;
        if (r >= rows) {
            for (int64_t s = 0; s < KS; s++)
                _mm512_store_si512((void *)(o + s * MM_AMX_STEP_BYTES), _mm512_setzero_si512());
            continue;
        }
        const uint16_t *src = rowp[r];
        const char *nx = r < next_rows ? (const char *)next[r] : NULL;
        for (int64_t s = 0; s < KS; s++) {
            const int64_t k0 = s * MM_AMX_KSTEP;
            __m512i v = _mm512_maskz_loadu_epi16(mm_amx_mask32(K - k0), src + k0);
            _mm512_store_si512((void *)(o + s * MM_AMX_STEP_BYTES), v);
            if (nx) _mm_prefetch(nx + k0 * 2, _MM_HINT_T0);
        }
    }
}

MM_TARGET_AVX512 void mm_amx_pack_a_cols(char *dst, const uint16_t *A, int64_t lda,
                                         const uint16_t *const *a_rows, int64_t m, int rows,
                                         int64_t K)
{
    const __m512i lo = _mm512_load_si512((const void *)mm_vnni_pair_idx[0]);
    const __m512i hi = _mm512_load_si512((const void *)mm_vnni_pair_idx[1]);
    const __mmask32 cm = mm_amx_mask32(rows);
    const int64_t KS = mm_amx_ksteps(K);
    const int halves = rows <= 16 ? 1 : 2;
    for (int64_t s = 0; s < KS; s++) {
        /* d[h][p]: dwords (A[2p][m + 16h + i], A[2p+1][m + 16h + i]) for i = 0..15 */
        __m512i d[2][16];
        for (int p = 0; p < 16; p++) {
            const int64_t k = s * MM_AMX_KSTEP + 2 * p;
            __m512i r0 = _mm512_setzero_si512(), r1 = _mm512_setzero_si512();
            if (k < K) r0 = _mm512_maskz_loadu_epi16(cm, (a_rows ? a_rows[k] : A + k * lda) + m);
            if (k + 1 < K)
                r1 = _mm512_maskz_loadu_epi16(cm, (a_rows ? a_rows[k + 1] : A + (k + 1) * lda) + m);
            d[0][p] = _mm512_permutex2var_epi16(r0, lo, r1);
            d[1][p] = _mm512_permutex2var_epi16(r0, hi, r1);
        }
        char *o = dst + s * MM_AMX_STEP_BYTES;
        for (int h = 0; h < halves; h++) {
            mm_transpose16_epi32(d[h]); /* row i: the 16 pairs of C row m + 16h + i */
            for (int i = 0; i < 16; i++)
                _mm512_store_si512((void *)(o + (16 * h + i) * 64), d[h][i]);
        }
    }
}

MM_TARGET_AVX512 static void mm_amx_pack_b_nn(char *dst, const uint16_t *src, int64_t ld,
                                              int64_t K, int64_t s0, int64_t ks, int64_t n0,
                                              int64_t cols)
{
    const __m512i lo = _mm512_load_si512((const void *)mm_vnni_pair_idx[0]);
    const __m512i hi = _mm512_load_si512((const void *)mm_vnni_pair_idx[1]);
    const __mmask32 cm = mm_amx_mask32(cols);
    for (int64_t s = 0; s < ks; s++) {
        char *o = dst + s * MM_AMX_STEP_BYTES;
        for (int p = 0; p < 16; p++) {
            const int64_t k = (s0 + s) * MM_AMX_KSTEP + 2 * p;
            __m512i r0 = _mm512_setzero_si512(), r1 = _mm512_setzero_si512();
            if (k < K) r0 = _mm512_maskz_loadu_epi16(cm, src + k * ld + n0);
            if (k + 1 < K) r1 = _mm512_maskz_loadu_epi16(cm, src + (k + 1) * ld + n0);
            _mm512_store_si512((void *)(o + p * 64), _mm512_permutex2var_epi16(r0, lo, r1));
            _mm512_store_si512((void *)(o + 1024 + p * 64), _mm512_permutex2var_epi16(r0, hi, r1));
        }
    }
}

MM_TARGET_AVX512 static void mm_amx_pack_b_nt(char *dst, const uint16_t *src, int64_t ld,
                                              int64_t K, int64_t s0, int64_t ks, int64_t n0,
                                              int64_t cols)
{
    for (int64_t s = 0; s < ks; s++) {
        const int64_t k0 = (s0 + s) * MM_AMX_KSTEP;
        const __mmask32 km = mm_amx_mask32(K - k0);
        char *o = dst + s * MM_AMX_STEP_BYTES;
        for (int t = 0; t < 2; t++) {
            __m512i e[16]; /* e[c]: the 16 pairs of column n0 + 16t + c */
            for (int c = 0; c < 16; c++) {
                const int64_t n = 16 * t + c;
                e[c] = n < cols ? _mm512_maskz_loadu_epi16(km, src + (n0 + n) * ld + k0)
                                : _mm512_setzero_si512();
            }
            mm_transpose16_epi32(e); /* row p: pair p of the 16 columns */
            for (int p = 0; p < 16; p++) _mm512_store_si512((void *)(o + t * 1024 + p * 64), e[p]);
        }
    }
}

void mm_amx_pack_b(char *dst, const uint16_t *src, int64_t ld, int nt, int64_t K, int64_t s0,
                   int64_t ks, int64_t n0, int64_t cols)
{
    if (nt) mm_amx_pack_b_nt(dst, src, ld, K, s0, ks, n0, cols);
    else mm_amx_pack_b_nn(dst, src, ld, K, s0, ks, n0, cols);
}
#endif /* MM_X86 */
