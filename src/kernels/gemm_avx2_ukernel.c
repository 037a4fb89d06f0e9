/* The AVX2 form of the own GEMM's micro-kernel (CPUs with AVX2 and FMA but no AVX-512: Zen 2
 * and 3, Haswell to Comet Lake): the same arguments, packed formats and arithmetic as the FMA
 * form of gemm_avx512_ukernel.c — per k pair acc = fma(even_a, even_b, fma(odd_a, odd_b, acc)),
 * each product of two bf16 values exact in fp32 — so every element of C is the same chain of
 * fp32 FMAs over its k pairs in ascending order, and the same bits as the AVX-512 FMA form and
 * as any split of the product (gemm_avx512.h).
 *
 * Sixteen ymm registers do not hold an mr x 64 tile, so the tile is done in passes: row groups
 * of up to 4 rows (5 rows: 4 + 1, 6 rows: 4 + 2) times column strips (64 columns for one row,
 * each pass a whole run over the K block's pairs. Per k pair a pass loads its strip's B pairs
 * (one 32-byte load per 8 columns, split into the odd and even halves with an and and a shift),
 * broadcasts each row's two A halves from the widened A block and issues 2 FMAs per row and 8
 * columns: R x NV accumulators + B halves + broadcasts <= 15 registers. B strips after
 * the first are re-read from L1/L2 (the driver keeps the K block's slice there). The FMA
 * form's widened B slice (an fp32 copy read by all tiles) is not used: slower here (Zen 3,
 * `bench gemm --shape moe_gmm1 --no-quant`, M = 256 packed, one thread, this kernel's first version:
 * 36 GFLOP/s with it, 51 without; 2026-12-08, under load). The epilogue is the scalar one (megamoe_fp32_to_bf16's
 * rounding): once per tile and K chain, noise next to the K loop.
 *
 * Measured on an AMD EPYC Zen 3 VM (family 25 model 1, 2026-12-08, `megamoe bench gemm --shape
 * moe_gmm1 --no-quant`, M = 256 packed, the load of a parallel test run on the machine):
 * 53-58 GFLOP/s one thread, 91-107 two, of a probed ymm FMA peak of 89 per core: about 60 %.
 * K blocks of 128-512 pairs instead of 1024 measured the same within that noise. Not tuned
 * further (docs/kernels.md "AVX2 form"). */
#include "gemm_avx512.h"

#if MM_X86
#include <immintrin.h>

#include "gemm_impl.h"

#define MM_UKR2_INLINE static inline __attribute__((always_inline))

/* Rows [r0, r0 + R) x columns [c0, c0 + 8 NV) of the tile over the K block, B's halves made
 * in registers (the driver never hands this form a widened slice). pf_pass: this pass issues
 * the call's prefetches (the first pass). */
MM_TARGET_AVX2 MM_UKR2_INLINE void mm_ukr2_pass(const int R, const int NV,
                                                const mm_avx512_ukr_args_t *p, int r0, int c0,
                                                int pf_pass)
{
    const int64_t kp = p->kp;
    const float *a = (const float *)p->a + 2 * r0; /* widened A: [kp][MM_AVX_MR][2] fp32 */
    const uint16_t *b = p->b + 2 * c0;              /* [kp][64][2] bf16 */
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);

    /* Accumulators as named variables, not an array: gcc 12 kept an array's elements in memory
     * and stored every one of them on each k pair (half the FMA rate). Variables of rows or
     * strips the pass does not have (R, NV are constants) are dead code. */
#define MM2_ACC_INIT(r, v)                                                                  \
    __m256 c##r##_##v = _mm256_setzero_ps();                                                \
    if (R > r && NV > v && p->cont)                                                         \
        c##r##_##v = _mm256_loadu_ps(p->acc + (r0 + r) * MM_AVX_NR + c0 + 8 * v);
#define MM2_ACC_ROW(M, r) M(r, 0) M(r, 1) M(r, 2) M(r, 3) M(r, 4) M(r, 5) M(r, 6) M(r, 7)
#define MM2_ACC_ALL(M) MM2_ACC_ROW(M, 0) MM2_ACC_ROW(M, 1) MM2_ACC_ROW(M, 2) MM2_ACC_ROW(M, 3)
    MM2_ACC_ALL(MM2_ACC_INIT)

    int64_t k = 0, npf_k = 0, per = 0;
    const char *pf = p->pf;
    if (pf_pass && p->npf > 0) { /* one line per pair, up to 4 when the block is short */
        per = (p->npf + kp - 1) / kp;
        if (per > 4) per = 4;
        npf_k = (p->npf + per - 1) / per;
        if (npf_k > kp) npf_k = kp;
    }
#define MM2_HL(v)                                                                           \
    const __m256i x##v = _mm256_load_si256((const __m256i *)(b + 16 * v));                  \
    const __m256 h##v = _mm256_castsi256_ps(_mm256_and_si256(x##v, hi));                    \
    const __m256 l##v = _mm256_castsi256_ps(_mm256_slli_epi32(x##v, 16));
#define MM2_FMA(r, v)                                                                       \
    if (R > r && NV > v)                                                                    \
        c##r##_##v = _mm256_fmadd_ps(al##r, l##v, _mm256_fmadd_ps(ah##r, h##v, c##r##_##v));
#define MM2_BCAST(r)                                                                        \
    const __m256 ah##r = _mm256_broadcast_ss(a + 2 * r);                                    \
    const __m256 al##r = _mm256_broadcast_ss(a + 2 * r + 1);
    /* Per k pair each accumulator takes two dependent FMAs (the FMA form's chain), so a pass
     * needs >= 8 accumulators to keep two FMA pipes of 4 cycles' latency busy: R x NV = 8 for
     * 1, 2 and 4 rows (6 for 3). One or two rows: the A halves are broadcast once and each B
     * vector is split right before its FMAs (NV 8 or 4); three or four rows: both B vectors are
     * split first and each row's halves broadcast before its FMAs (NV 2). */
#define MM2_VEC(v)                                                                          \
    if (NV > v) {                                                                           \
        MM2_HL(v)                                                                           \
        MM2_FMA(0, v) MM2_FMA(1, v)                                                         \
    }
#define MM2_ROW(r)                                                                          \
    if (R > r) {                                                                            \
        MM2_BCAST(r)                                                                        \
        MM2_FMA(r, 0) MM2_FMA(r, 1)                                                         \
    }
    for (; k < kp; k++) {
        if (k < npf_k) {
            for (int64_t q = 0; q < per; q++) {
                if (p->pf_l1) _mm_prefetch(pf + 64 * q, _MM_HINT_T0);
                else _mm_prefetch(pf + 64 * q, _MM_HINT_T1);
            }
            pf += 64 * per;
        }
        if (R <= 2) {
            MM2_BCAST(0)
            const __m256 ah1 = R > 1 ? _mm256_broadcast_ss(a + 2) : ah0;
            const __m256 al1 = R > 1 ? _mm256_broadcast_ss(a + 3) : al0;
            MM2_VEC(0) MM2_VEC(1) MM2_VEC(2) MM2_VEC(3) MM2_VEC(4) MM2_VEC(5) MM2_VEC(6)
            MM2_VEC(7)
        } else {
            MM2_HL(0) MM2_HL(1)
            MM2_ROW(0) MM2_ROW(1) MM2_ROW(2) MM2_ROW(3)
        }
        a += 2 * MM_AVX_MR;
        b += 2 * MM_AVX_NR;
    }
    __m256 acc[4][8]; /* once, for the stores below */
#define MM2_ACC_OUT(r, v) acc[r][v] = c##r##_##v;
    MM2_ACC_ALL(MM2_ACC_OUT)
#undef MM2_ACC_INIT
#undef MM2_ACC_ROW
#undef MM2_ACC_ALL
#undef MM2_HL
#undef MM2_FMA
#undef MM2_BCAST
#undef MM2_VEC
#undef MM2_ROW
#undef MM2_ACC_OUT

    if (!p->last) {
        for (int r = 0; r < R; r++)
            for (int v = 0; v < NV; v++)
                _mm256_storeu_ps(p->acc + (r0 + r) * MM_AVX_NR + c0 + 8 * v, acc[r][v]);
        return;
    }
    for (int r = 0; r < R; r++) {
        float s[64] __attribute__((aligned(32)));
        for (int v = 0; v < NV; v++) _mm256_store_ps(s + 8 * v, acc[r][v]);
        int64_t n = p->nr - c0 < 8 * NV ? p->nr - c0 : 8 * NV;
        if (n <= 0) continue;
        void *o = mm_gemm_c_at(p->c, p->ldc, p->c_bf16 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32,
                               r0 + r, c0);
        mm_gemm_epilogue(s, 0, 1, n, o, p->ldc,
                         p->c_bf16 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32, p->accumulate);
    }
}

/* One tile: its row groups times its column strips; the first pass issues the prefetches. */
MM_TARGET_AVX2 MM_UKR2_INLINE void mm_ukr2_group(const int R, const mm_avx512_ukr_args_t *p,
                                                 int r0, int first_group)
{
    const int NV = R == 1 ? 8 : R == 2 ? 4 : 2, strip = 8 * NV;
    /* strips past nr are never stored (every tile of a slice has the same nr) */
    for (int c0 = 0; c0 < MM_AVX_NR && c0 < p->nr; c0 += strip)
        mm_ukr2_pass(R, NV, p, r0, c0, first_group && c0 == 0);
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
    /* row groups: 1-4 rows in one, 5 = 4 + 1, 6 = 4 + 2 */
    const int g0 = mr <= 4 ? mr : 4, g1 = mr - g0;
    void (*const fn[5])(const mm_avx512_ukr_args_t *, int, int) = {NULL, mm_ukr2_g1, mm_ukr2_g2,
                                                                   mm_ukr2_g3, mm_ukr2_g4};
    fn[g0](p, 0, 1);
    if (g1 > 0) fn[g1](p, g0, 0);
}
#endif /* MM_X86 */
