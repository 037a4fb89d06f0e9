/* Micro-kernels of the own AVX-512 GEMM backend (see gemm_avx512.h): an mr x 64 tile
 * (mr <= 6) of fp32 accumulators in zmm registers (6 x 4 = 24 at mr = 6), updated per k pair
 * by 4 aligned loads of the B slice and mr 32-bit broadcasts of A pairs, mr x 4 vdpbf16ps.
 *
 * On Zen 5 vdpbf16ps issues twice per cycle, so 24 independent accumulators keep both pipes
 * busy; a k pair is 12 cycles at mr = 6, during which the kernel reads 256 bytes of B (from
 * L2: the driver keeps the B slice there) and 24 bytes of A. The driver hands each call a
 * share of the next B slice to prefetch into L2 (one line per k pair), so that the first
 * tile of every slice does not wait for L3 or memory.
 *
 * CPUs with AVX-512 but without AVX512-BF16 (Skylake-SP to Ice Lake, and VMs that hide the
 * bit) run the same kernel with each vdpbf16ps replaced by two fp32 FMAs on the widened
 * halves (the odd element of each pair first, as vdpbf16ps orders them): a product of two
 * bf16 values is exact in fp32, so each FMA rounds once, like each step of vdpbf16ps — the
 * bits agree with it except where vdpbf16ps flushes subnormals. The driver widens the A
 * block once (each pair to its two fp32 halves), so the kernel broadcasts each half straight
 * from memory; only B's halves are made in registers (8 logic ops per 48 FMAs at mr = 6).
 * Same chains per element as the BF16 form, so the split invariance holds (gemm_avx512.h).
 *
 * The tile starts from +0 or from the fp32 partial sums of an earlier K block (`cont`) and
 * ends with the partial sums stored back, or (`last`) with the epilogue: fp32 store, or one
 * round-to-nearest-even to bf16 (mm_cvt_bf16x16, the bits of megamoe_fp32_to_bf16), after
 * the fp32 addition of C_old with accumulate; columns past nr are masked. */
#include "gemm_avx512.h"

#if MM_X86
#include <immintrin.h>
#include <stdatomic.h>

#include "simd.h"

#define MM_UKR_INLINE static inline __attribute__((always_inline))

/* One k pair: acc[r][j] += A pair(r) . B(j) for r < MR_ (FMA_: two fp32 FMAs per pair, on B's
 * halves made in registers (1), read widened from bw (2), or made in registers and also
 * stored to bwo (3): the first tile of a slice widens it for the others while it computes). */
#define MM_UKR_STEP(MR_, FMA_)                                                              \
    do {                                                                                    \
        if (FMA_) {                                                                         \
            __m512 h0_, h1_, h2_, h3_, l0_, l1_, l2_, l3_;                                  \
            if ((FMA_) == 2) {                                                              \
                h0_ = _mm512_load_ps(bw), h1_ = _mm512_load_ps(bw + 16);                    \
                h2_ = _mm512_load_ps(bw + 32), h3_ = _mm512_load_ps(bw + 48);               \
                l0_ = _mm512_load_ps(bw + 64), l1_ = _mm512_load_ps(bw + 80);               \
                l2_ = _mm512_load_ps(bw + 96), l3_ = _mm512_load_ps(bw + 112);              \
                bw += 2 * MM_AVX_NR;                                                        \
            } else {                                                                        \
                const __m512i hi_ = _mm512_set1_epi32((int)0xffff0000u);                    \
                const __m512i b0_ = _mm512_load_si512((const void *)b);                     \
                const __m512i b1_ = _mm512_load_si512((const void *)(b + 32));              \
                const __m512i b2_ = _mm512_load_si512((const void *)(b + 64));              \
                const __m512i b3_ = _mm512_load_si512((const void *)(b + 96));              \
                h0_ = _mm512_castsi512_ps(_mm512_and_si512(b0_, hi_));                      \
                h1_ = _mm512_castsi512_ps(_mm512_and_si512(b1_, hi_));                      \
                h2_ = _mm512_castsi512_ps(_mm512_and_si512(b2_, hi_));                      \
                h3_ = _mm512_castsi512_ps(_mm512_and_si512(b3_, hi_));                      \
                l0_ = _mm512_castsi512_ps(_mm512_slli_epi32(b0_, 16));                      \
                l1_ = _mm512_castsi512_ps(_mm512_slli_epi32(b1_, 16));                      \
                l2_ = _mm512_castsi512_ps(_mm512_slli_epi32(b2_, 16));                      \
                l3_ = _mm512_castsi512_ps(_mm512_slli_epi32(b3_, 16));                      \
                if ((FMA_) == 3) {                                                          \
                    _mm512_store_ps(bwo, h0_), _mm512_store_ps(bwo + 16, h1_);              \
                    _mm512_store_ps(bwo + 32, h2_), _mm512_store_ps(bwo + 48, h3_);         \
                    _mm512_store_ps(bwo + 64, l0_), _mm512_store_ps(bwo + 80, l1_);         \
                    _mm512_store_ps(bwo + 96, l2_), _mm512_store_ps(bwo + 112, l3_);        \
                    bwo += 2 * MM_AVX_NR;                                                   \
                }                                                                           \
            }                                                                               \
            _Pragma("GCC unroll 6") for (int r_ = 0; r_ < (MR_); r_++)                     \
            {                                                                               \
                const __m512 ah_ = _mm512_castsi512_ps(_mm512_set1_epi32((int)a[2 * r_]));  \
                const __m512 al_ = _mm512_castsi512_ps(_mm512_set1_epi32((int)a[2 * r_ + 1])); \
                acc[r_][0] = _mm512_fmadd_ps(al_, l0_, _mm512_fmadd_ps(ah_, h0_, acc[r_][0])); \
                acc[r_][1] = _mm512_fmadd_ps(al_, l1_, _mm512_fmadd_ps(ah_, h1_, acc[r_][1])); \
                acc[r_][2] = _mm512_fmadd_ps(al_, l2_, _mm512_fmadd_ps(ah_, h2_, acc[r_][2])); \
                acc[r_][3] = _mm512_fmadd_ps(al_, l3_, _mm512_fmadd_ps(ah_, h3_, acc[r_][3])); \
            }                                                                               \
        } else {                                                                            \
            const __m512i b0_ = _mm512_load_si512((const void *)b);                         \
            const __m512i b1_ = _mm512_load_si512((const void *)(b + 32));                  \
            const __m512i b2_ = _mm512_load_si512((const void *)(b + 64));                  \
            const __m512i b3_ = _mm512_load_si512((const void *)(b + 96));                  \
            _Pragma("GCC unroll 6") for (int r_ = 0; r_ < (MR_); r_++)                     \
            {                                                                               \
                const __m512bh a_ = (__m512bh)_mm512_set1_epi32((int)a[r_]);                \
                acc[r_][0] = _mm512_dpbf16_ps(acc[r_][0], (__m512bh)b0_, a_);               \
                acc[r_][1] = _mm512_dpbf16_ps(acc[r_][1], (__m512bh)b1_, a_);               \
                acc[r_][2] = _mm512_dpbf16_ps(acc[r_][2], (__m512bh)b2_, a_);               \
                acc[r_][3] = _mm512_dpbf16_ps(acc[r_][3], (__m512bh)b3_, a_);               \
            }                                                                               \
        }                                                                                   \
        a += (FMA_) ? 2 * MM_AVX_MR : MM_AVX_MR;                                            \
        b += 2 * MM_AVX_NR;                                                                 \
    } while (0)

/* FMA_ is a compile-time constant at every call: the two kernels share this body. Both are
 * compiled for the AVX512-BF16 target so that the body inlines into either; with FMA_ = 1 no
 * BF16 instruction is left (the epilogue's conversions are integer code, simd.h), which the
 * FMA kernels' tests on a CPU without AVX512-BF16 would show as SIGILL. */
MM_TARGET_AVX512BF16 MM_UKR_INLINE void mm_ukr(const int MR_, const int FMA_,
                                               const mm_avx512_ukr_args_t *p)
{
    /* Every argument into a local first: the project builds with -fno-strict-aliasing, so
     * fields read through p after a store to C would be re-loaded from memory. */
    const int64_t kp = p->kp, ldc = p->ldc, nr = p->nr;
    const uint32_t *a = p->a;
    const uint16_t *b = p->b;
    const float *bw = p->bw;
    float *bwo = p->bw_out;
    float *const tile = p->acc;
    const int last = p->last, c_bf16 = p->c_bf16, accumulate = p->accumulate;
    void *const cv = p->c;
    const char *pf = p->pf;
    const int64_t npf = p->npf;

    /* Start from +0 or from the partial sums. (Not a load under an all-zero mask: the tile
     * pointer may be NULL then, and a masked-off load from an unmapped page costs a
     * microcode assist per instruction on this CPU.) */
    __m512 acc[MM_AVX_MR][4];
    if (p->cont) {
        _Pragma("GCC unroll 6") for (int r = 0; r < MR_; r++)
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
                acc[r][j] = _mm512_loadu_ps(tile + r * MM_AVX_NR + 16 * j);
    } else {
        _Pragma("GCC unroll 6") for (int r = 0; r < MR_; r++)
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    }

    int64_t k = 0;
    if (npf > 0) {
        /* Prefetch npf lines over the first k pairs: one per pair, up to 4 when the tile is
         * short for its share. */
        int64_t per = (npf + kp - 1) / kp;
        if (per > 4) per = 4;
        int64_t n = (npf + per - 1) / per;
        if (n > kp) n = kp;
        if (p->pf_l1) {
            for (; k < n; k++) {
                _mm_prefetch(pf, _MM_HINT_T0);
                if (per > 1) {
                    _mm_prefetch(pf + 64, _MM_HINT_T0);
                    if (per > 2) {
                        _mm_prefetch(pf + 128, _MM_HINT_T0);
                        _mm_prefetch(pf + 192, _MM_HINT_T0);
                    }
                }
                pf += 64 * per;
                MM_UKR_STEP(MR_, FMA_);
            }
        }
        for (; k < n; k++) {
            _mm_prefetch(pf, _MM_HINT_T1);
            if (per > 1) {
                _mm_prefetch(pf + 64, _MM_HINT_T1);
                if (per > 2) {
                    _mm_prefetch(pf + 128, _MM_HINT_T1);
                    _mm_prefetch(pf + 192, _MM_HINT_T1);
                }
            }
            pf += 64 * per;
            MM_UKR_STEP(MR_, FMA_);
        }
    }
    for (; k < kp; k++) MM_UKR_STEP(MR_, FMA_);

    if (!last) {
        _Pragma("GCC unroll 6") for (int r = 0; r < MR_; r++)
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
                _mm512_storeu_ps(tile + r * MM_AVX_NR + 16 * j, acc[r][j]);
        return;
    }
    if (nr == MM_AVX_NR) { /* full tile: plain loads and stores */
        if (!c_bf16) {
            float *c = cv;
            _Pragma("GCC unroll 6") for (int r = 0; r < MR_; r++)
                _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
                    float *o = c + r * ldc + 16 * j;
                    __m512 v = acc[r][j];
                    if (accumulate) v = _mm512_add_ps(_mm512_loadu_ps(o), v);
                    _mm512_storeu_ps(o, v);
                }
        } else {
            uint16_t *c = cv;
            _Pragma("GCC unroll 6") for (int r = 0; r < MR_; r++)
                _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
                    uint16_t *o = c + r * ldc + 16 * j;
                    __m512 v = acc[r][j];
                    if (accumulate) v = _mm512_add_ps(mm_load_bf16x16(o, 0xffff), v);
                    _mm256_storeu_si256((__m256i *)o, mm_cvt_bf16x16(v));
                }
        }
        return;
    }
    __mmask16 m[4];
    for (int j = 0; j < 4; j++) m[j] = mm_tail_mask16(nr - 16 * j > 0 ? nr - 16 * j : 0);
    if (!c_bf16) {
        float *c = cv;
        _Pragma("GCC unroll 6") for (int r = 0; r < MR_; r++)
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
                float *o = c + r * ldc + 16 * j;
                __m512 v = acc[r][j];
                if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m[j], o), v);
                _mm512_mask_storeu_ps(o, m[j], v);
            }
    } else {
        uint16_t *c = cv;
        _Pragma("GCC unroll 6") for (int r = 0; r < MR_; r++)
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
                uint16_t *o = c + r * ldc + 16 * j;
                __m512 v = acc[r][j];
                if (accumulate) v = _mm512_add_ps(mm_load_bf16x16(o, m[j]), v);
                mm_store_bf16x16(o, m[j], v);
            }
    }
}

#define MM_UKR_DEF(MR_)                                                                     \
    MM_TARGET_AVX512BF16 __attribute__((noinline)) static void mm_ukr_bf16_##MR_(         \
        const mm_avx512_ukr_args_t *p)                                                      \
    {                                                                                       \
        mm_ukr(MR_, 0, p);                                                                  \
    }                                                                                       \
    MM_TARGET_AVX512BF16 __attribute__((noinline)) static void mm_ukr_fma_##MR_(           \
        const mm_avx512_ukr_args_t *p)                                                      \
    {                                                                                       \
        mm_ukr(MR_, 1, p);                                                                  \
    }                                                                                       \
    MM_TARGET_AVX512BF16 __attribute__((noinline)) static void mm_ukr_fmaw_##MR_(          \
        const mm_avx512_ukr_args_t *p)                                                      \
    {                                                                                       \
        mm_ukr(MR_, 2, p);                                                                  \
    }                                                                                       \
    MM_TARGET_AVX512BF16 __attribute__((noinline)) static void mm_ukr_fmas_##MR_(          \
        const mm_avx512_ukr_args_t *p)                                                      \
    {                                                                                       \
        mm_ukr(MR_, 3, p);                                                                  \
    }
MM_UKR_DEF(1)
MM_UKR_DEF(2)
MM_UKR_DEF(3)
MM_UKR_DEF(4)
MM_UKR_DEF(5)
MM_UKR_DEF(6)

typedef void (*mm_ukr_fn)(const mm_avx512_ukr_args_t *);
static const mm_ukr_fn mm_ukr_bf16[MM_AVX_MR] = {mm_ukr_bf16_1, mm_ukr_bf16_2, mm_ukr_bf16_3,
                                                 mm_ukr_bf16_4, mm_ukr_bf16_5, mm_ukr_bf16_6};
static const mm_ukr_fn mm_ukr_fma[MM_AVX_MR] = {mm_ukr_fma_1, mm_ukr_fma_2, mm_ukr_fma_3,
                                                mm_ukr_fma_4, mm_ukr_fma_5, mm_ukr_fma_6};
static const mm_ukr_fn mm_ukr_fmaw[MM_AVX_MR] = {mm_ukr_fmaw_1, mm_ukr_fmaw_2, mm_ukr_fmaw_3,
                                                 mm_ukr_fmaw_4, mm_ukr_fmaw_5, mm_ukr_fmaw_6};
static const mm_ukr_fn mm_ukr_fmas[MM_AVX_MR] = {mm_ukr_fmas_1, mm_ukr_fmas_2, mm_ukr_fmas_3,
                                                 mm_ukr_fmas_4, mm_ukr_fmas_5, mm_ukr_fmas_6};

static atomic_int mm_avx2_forced; /* mm_avx512_force_avx2 (tests and benchmarks) */

int mm_avx512_force_avx2(int on)
{
    if (on && !mm_cpu_has_avx2_fma()) return -1;
    return atomic_exchange_explicit(&mm_avx2_forced, on ? 1 : 0, memory_order_relaxed);
}

int mm_avx512_form_is_avx2(void)
{
    return !mm_cpu_has_avx512() || atomic_load_explicit(&mm_avx2_forced, memory_order_relaxed);
}

void mm_avx512_ukernel(int mr, const mm_avx512_ukr_args_t *p)
{
    /* the AVX2 form: CPUs without AVX-512 (the backend's probe allows no other), or forced */
    if (mm_avx512_form_is_avx2()) {
        mm_avx2_ukernel(mr, p);
        return;
    }
    const int i = (mr < 1 ? 1 : mr > MM_AVX_MR ? MM_AVX_MR : mr) - 1;
    (p->bw_out ? mm_ukr_fmas
     : p->bw   ? mm_ukr_fmaw
     : mm_avx512_kernel_is_fma() ? mm_ukr_fma
                                 : mm_ukr_bf16)[i](p);
}

int mm_avx512_kernel_is_fma(void)
{
    return !mm_cpu_has_avx512_bf16() || atomic_load_explicit(&mm_avx2_forced, memory_order_relaxed);
}
#endif /* MM_X86 */
