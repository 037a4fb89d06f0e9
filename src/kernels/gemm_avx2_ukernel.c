/* The AVX2 form of the own GEMM's micro-kernel (CPUs with AVX2 and FMA but no AVX-512: Zen 2
 * and 3, Haswell to Comet Lake): the same arguments, packed formats and arithmetic as the FMA
 * form of gemm_avx512_ukernel.c — per k pair acc = fma(even_a, even_b, fma(odd_a, odd_b, acc)),
 * each product of two bf16 values exact in fp32 — so every element of C is the same chain of
 * fp32 FMAs over its k pairs in ascending order, and the same bits as the AVX-512 FMA form and
 * as any split of the product (gemm_avx512.h).
 *
 * Sixteen ymm registers do not hold an mr x 64 tile, so the tile is done in passes: row groups
 * of up to 4 rows (5 rows: 3 + 2, 6 rows: 3 + 3) times column strips of 16 (32 for one row),
 * each pass a whole run over the K block's pairs. Per k pair a pass loads its strip's B pairs
 * (one 32-byte load per 8 columns, split into the odd and even halves with an and and a shift,
 * or read widened from the FMA form's fp32 copy), broadcasts each row's two A halves from the
 * widened A block and issues 2 FMAs per row and 8 columns: R x NV accumulators + 2 NV B halves
 * + 2 broadcasts <= 14 registers. B strips after the first are re-read from L1/L2 (the driver
 * keeps the K block's slice there). The epilogue is the scalar one (megamoe_fp32_to_bf16's
 * rounding): once per tile and K chain, noise next to the K loop. */
#include "gemm_avx512.h"

#if MM_X86
#include <immintrin.h>

#include "gemm_impl.h"

#define MM_UKR2_INLINE static inline __attribute__((always_inline))

/* Rows [r0, r0 + R) x columns [c0, c0 + 8 NV) of the tile over the K block. W: 1 make B's
 * halves in registers, 2 read them from bw, 3 make them and store them to bw_out. pf: this pass
 * issues the call's prefetches (the first pass). */
MM_TARGET_AVX2 MM_UKR2_INLINE void mm_ukr2_pass(const int R, const int NV, const int W,
                                                const mm_avx512_ukr_args_t *p, int r0, int c0,
                                                int pf_pass)
{
    const int64_t kp = p->kp;
    const float *a = (const float *)p->a + 2 * r0; /* widened A: [kp][MM_AVX_MR][2] fp32 */
    const uint16_t *b = p->b + 2 * c0;              /* [kp][64][2] bf16 */
    const float *bw = p->bw ? p->bw + c0 : NULL;    /* [kp][2][64] fp32: odd halves, then even */
    float *bwo = p->bw_out ? p->bw_out + c0 : NULL;
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);

    __m256 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++)
            acc[r][v] = p->cont ? _mm256_loadu_ps(p->acc + (r0 + r) * MM_AVX_NR + c0 + 8 * v)
                                : _mm256_setzero_ps();

    int64_t k = 0, npf_k = 0, per = 0;
    const char *pf = p->pf;
    if (pf_pass && p->npf > 0) { /* one line per pair, up to 4 when the block is short */
        per = (p->npf + kp - 1) / kp;
        if (per > 4) per = 4;
        npf_k = (p->npf + per - 1) / per;
        if (npf_k > kp) npf_k = kp;
    }
    for (; k < kp; k++) {
        if (k < npf_k) {
            for (int64_t l = 0; l < per; l++) {
                if (p->pf_l1) _mm_prefetch(pf + 64 * l, _MM_HINT_T0);
                else _mm_prefetch(pf + 64 * l, _MM_HINT_T1);
            }
            pf += 64 * per;
        }
        __m256 h[4], l[4];
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) {
            if (W == 2) {
                h[v] = _mm256_load_ps(bw + 8 * v);
                l[v] = _mm256_load_ps(bw + MM_AVX_NR + 8 * v);
            } else {
                const __m256i x = _mm256_load_si256((const __m256i *)(b + 16 * v));
                h[v] = _mm256_castsi256_ps(_mm256_and_si256(x, hi));
                l[v] = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
                if (W == 3) {
                    _mm256_store_ps(bwo + 8 * v, h[v]);
                    _mm256_store_ps(bwo + MM_AVX_NR + 8 * v, l[v]);
                }
            }
        }
        _Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
            const __m256 ah = _mm256_broadcast_ss(a + 2 * r);
            const __m256 al = _mm256_broadcast_ss(a + 2 * r + 1);
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++)
                acc[r][v] = _mm256_fmadd_ps(al, l[v], _mm256_fmadd_ps(ah, h[v], acc[r][v]));
        }
        a += 2 * MM_AVX_MR;
        b += 2 * MM_AVX_NR;
        if (W == 2) bw += 2 * MM_AVX_NR;
        if (W == 3) bwo += 2 * MM_AVX_NR;
    }

    if (!p->last) {
        for (int r = 0; r < R; r++)
            for (int v = 0; v < NV; v++)
                _mm256_storeu_ps(p->acc + (r0 + r) * MM_AVX_NR + c0 + 8 * v, acc[r][v]);
        return;
    }
    for (int r = 0; r < R; r++) {
        float s[32] __attribute__((aligned(32)));
        for (int v = 0; v < NV; v++) _mm256_store_ps(s + 8 * v, acc[r][v]);
        int64_t n = p->nr - c0 < 8 * NV ? p->nr - c0 : 8 * NV;
        if (n <= 0) continue;
        void *o = mm_gemm_c_at(p->c, p->ldc, p->c_bf16 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32,
                               r0 + r, c0);
        mm_gemm_epilogue(s, 0, 1, n, o, p->ldc,
                         p->c_bf16 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32, p->accumulate);
    }
}

/* One tile: its row groups times its column strips. The first pass issues the prefetches and,
 * when the slice is to be widened, widens the strip it reads; the later row groups read the
 * strips the first group widened. */
MM_TARGET_AVX2 MM_UKR2_INLINE void mm_ukr2_group(const int R, const mm_avx512_ukr_args_t *p,
                                                 int r0, int first_group)
{
    const int NV = R == 1 ? 4 : 2, strip = 8 * NV;
    /* strips past nr are never stored (every tile of a slice has the same nr) */
    for (int c0 = 0; c0 < MM_AVX_NR && c0 < p->nr; c0 += strip) {
        const int pf_pass = first_group && c0 == 0;
        if (p->bw_out && first_group) mm_ukr2_pass(R, NV, 3, p, r0, c0, pf_pass);
        else if (p->bw_out) {
            mm_avx512_ukr_args_t q = *p; /* the first group widened this strip */
            q.bw = p->bw_out;
            mm_ukr2_pass(R, NV, 2, &q, r0, c0, pf_pass);
        } else if (p->bw) mm_ukr2_pass(R, NV, 2, p, r0, c0, pf_pass);
        else mm_ukr2_pass(R, NV, 1, p, r0, c0, pf_pass);
    }
}

#define MM_UKR2_GROUP_FN(R_)                                                                \
    MM_TARGET_AVX2 __attribute__((noinline)) static void mm_ukr2_g##R_(                     \
        const mm_avx512_ukr_args_t *p, int r0, int first_group)                             \
    {                                                                                       \
        mm_ukr2_group(R_, p, r0, first_group);                                              \
    }
MM_UKR2_GROUP_FN(1)
MM_UKR2_GROUP_FN(2)
MM_UKR2_GROUP_FN(3)
MM_UKR2_GROUP_FN(4)

void mm_avx2_ukernel(int mr, const mm_avx512_ukr_args_t *p)
{
    if (mr < 1) mr = 1;
    if (mr > MM_AVX_MR) mr = MM_AVX_MR;
    /* row groups: 1-4 rows in one, 5 = 3 + 2, 6 = 3 + 3 */
    const int g0 = mr <= 4 ? mr : 3, g1 = mr - g0;
    void (*const fn[5])(const mm_avx512_ukr_args_t *, int, int) = {NULL, mm_ukr2_g1, mm_ukr2_g2,
                                                                   mm_ukr2_g3, mm_ukr2_g4};
    fn[g0](p, 0, 1);
    if (g1 > 0) fn[g1](p, g0, 0);
}
#endif /* MM_X86 */
