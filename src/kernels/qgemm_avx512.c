/* AVX-512 kernels of the quantised GEMMs (formats and the offset trick: qgemm_impl.h). Each
 * gives the bits of its C twin in qgemm_c.c.
 *
 * int8 A (vpdpbusd, AVX512-VNNI): an mr x 64 tile of int32 accumulators (mr x 4 zmm), per
 * quad 4 loads of B (64 columns x 4 k, unsigned bytes) and mr x 4 vpdpbusd, each with the
 * row's 4 signed A bytes (int8 weights: broadcast by the instruction from memory; int4: one
 * broadcast per row into a register). int4 weights are unpacked in registers, one 64-byte
 * load giving two quads (low nibbles: quad 2o, high nibbles: quad 2o+1; and / shift+and).
 * Zen 4 issues one zmm vpdpbusd every two cycles, so every tile shape keeps the loads and the
 * unpacking off the critical path; on Zen 5 (two per cycle) the 6 x 64 int4 tile still needs
 * only 10 loads per 24 (int8: 4 loads and 24 load-operand broadcasts of 4 bytes per 24). The
 * sums wrap in 32 bits, which is exact (qgemm_impl.h).
 *
 * bf16 A (weight-only, FMA): per k one weight vector per 16 columns, sign-extended from its
 * byte (or nibble), converted (exact), w' = w + offset (when given), then mr vfmadd231ps with
 * the row's fp32 value broadcast from the packed A. One FMA chain per element and K group, k
 * ascending, as fmaf in the twin; the group scale multiplies the sum afterwards (epilogue). */
#include "qgemm_impl.h"

#if MM_X86
#include <immintrin.h>

#include "simd.h"

#define MM_QK_INLINE static inline __attribute__((always_inline))

/* Prefetch the call's npf lines, `per` (<= 4) per step while any are left: no division in
 * the kernel's prologue (a decode call on one 64-column panel is a few thousand cycles). */
MM_QK_INLINE void mm_qk_pf(const char **pf, int64_t *left, const int per, int l2)
{
    if (*left <= 0) return;
    if (l2) {
        for (int i = 0; i < per; i++) _mm_prefetch(*pf + 64 * i, _MM_HINT_T1);
    } else {
        for (int i = 0; i < per; i++) _mm_prefetch(*pf + 64 * i, _MM_HINT_T0);
    }
    *pf += 64 * per;
    *left -= per;
}

/* ---- int8 A ------------------------------------------------------------------------------ */

/* vpdpbusd acc, u8, s8. Inline assembly: gcc 12 compiles the intrinsic in these loops with a
 * register copy of the accumulator around most of them (it does not tie the destructive
 * destination), and the M = 1 int4 loop spent a third of its time in those copies. */
MM_TARGET_AVX512VNNI MM_QK_INLINE __m512i mm_dpbusd(__m512i acc, __m512i u8, __m512i s8)
{
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8));
    return acc;
}

/* acc[r][j] += b_j . a_r for r < MR (b0..b3 the 4 column vectors of one quad, a the quad's
 * A dwords of the micro-panel). */
#define MM_QK_DOTS(ACC, A_, B0, B1, B2, B3)                                                 \
    _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++)                                   \
    {                                                                                       \
        const __m512i x_ = _mm512_set1_epi32((A_)[r]);                                      \
        ACC[r][0] = mm_dpbusd(ACC[r][0], B0, x_);                                           \
        ACC[r][1] = mm_dpbusd(ACC[r][1], B1, x_);                                           \
        ACC[r][2] = mm_dpbusd(ACC[r][2], B2, x_);                                           \
        ACC[r][3] = mm_dpbusd(ACC[r][3], B3, x_);                                           \
    }

/* The same for int8 weights: each vpdpbusd broadcasts the row's A dword from memory itself
 * ({1to16}, the signed operand), so no broadcast instruction and no register holds it, and the
 * row's 4 are one statement, which ties every accumulator to its register (one statement per
 * instruction left 6 register copies per quad in the 4- and 5-row loops). At M = 16 with the
 * weights from memory (1408 x 4096 / 4096 x 2816, development timings, one thread) this took
 * 80 / 82 % of the VNNI peak to 83 / 89 %, and M = 1 streams faster; with the weights in cache
 * both forms run at 90 %, so the gain is in overlapping the memory stream. int4 keeps
 * MM_QK_DOTS: this form was 3-7 % slower at M = 4, where its unpacking already competes. */
#define MM_QK_DOTS_MEM(ACC, A_, B0, B1, B2, B3)                                             \
    _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++)                                   \
        __asm__("vpdpbusd %4%{1to16%}, %5, %0\n\tvpdpbusd %4%{1to16%}, %6, %1\n\t"         \
                "vpdpbusd %4%{1to16%}, %7, %2\n\tvpdpbusd %4%{1to16%}, %8, %3"              \
                : "+v"(ACC[r][0]), "+v"(ACC[r][1]), "+v"(ACC[r][2]), "+v"(ACC[r][3])          \
                : "m"((A_)[r]), "v"(B0), "v"(B1), "v"(B2), "v"(B3));

/* int4 with MR <= 3: the high nibbles go to a second accumulator set, added at the end, so
 * the two dot products of an octet do not form one dependency chain (integer sums: the order
 * changes no bit). The same alternation of quads for int8 slowed M = 1 streaming from memory
 * (22.6 against 27 GB/s of weights at 1408 x 4096), so int8 keeps one set. */
MM_TARGET_AVX512VNNI MM_QK_INLINE void mm_qk_int(const int MR, const int INT4,
                                                 const mm_qk_ukr_args_t *p)
{
    const int SPLIT = MR <= 3 && INT4;
    const int64_t nq = p->nq;
    const int32_t *a = p->a;
    const uint8_t *b = p->b;
    int32_t *const tile = p->acc;
    const char *pf = p->pf;
    __m512i acc[MM_QK_MR][4], acc2[3][4];
    if (p->cont) {
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++)
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
                acc[r][j] = _mm512_loadu_si512(tile + r * MM_QK_NR + 16 * j);
    } else {
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++)
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_si512();
    }
    if (SPLIT) {
        for (int r = 0; r < MR && r < 3; r++)
            for (int j = 0; j < 4; j++) acc2[r][j] = _mm512_setzero_si512();
    }
    int64_t left = p->npf;
    const int l2 = p->pf_l2;
    if (!INT4) {
        for (int64_t q = 0; q < nq; q++) {
            mm_qk_pf(&pf, &left, 4, l2);
            const __m512i b0 = _mm512_load_si512(b), b1 = _mm512_load_si512(b + 64),
                          b2 = _mm512_load_si512(b + 128), b3 = _mm512_load_si512(b + 192);
            MM_QK_DOTS_MEM(acc, a, b0, b1, b2, b3)
            a += MM_QK_MR;
            b += 256;
        }
    } else {
        const __m512i m4 = _mm512_set1_epi8(15);
        const int64_t no = nq / 2;
        for (int64_t o = 0; o < no; o++) {
            mm_qk_pf(&pf, &left, 4, l2);
            const __m512i x0 = _mm512_load_si512(b), x1 = _mm512_load_si512(b + 64),
                          x2 = _mm512_load_si512(b + 128), x3 = _mm512_load_si512(b + 192);
            const __m512i v0 = _mm512_and_si512(x0, m4), v1 = _mm512_and_si512(x1, m4);
            const __m512i v2 = _mm512_and_si512(x2, m4), v3 = _mm512_and_si512(x3, m4);
            MM_QK_DOTS(acc, a, v0, v1, v2, v3)
            const __m512i h0 = _mm512_and_si512(_mm512_srli_epi16(x0, 4), m4);
            const __m512i h1 = _mm512_and_si512(_mm512_srli_epi16(x1, 4), m4);
            const __m512i h2 = _mm512_and_si512(_mm512_srli_epi16(x2, 4), m4);
            const __m512i h3 = _mm512_and_si512(_mm512_srli_epi16(x3, 4), m4);
            if (SPLIT) {
                MM_QK_DOTS(acc2, a + MM_QK_MR, h0, h1, h2, h3)
            } else {
                MM_QK_DOTS(acc, a + MM_QK_MR, h0, h1, h2, h3)
            }
            a += 2 * MM_QK_MR;
            b += 256;
        }
    }
    if (SPLIT) {
        for (int r = 0; r < MR && r < 3; r++)
            for (int j = 0; j < 4; j++) acc[r][j] = _mm512_add_epi32(acc[r][j], acc2[r][j]);
    }
    _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++)
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
            _mm512_storeu_si512(tile + r * MM_QK_NR + 16 * j, acc[r][j]);
}

/* ---- bf16 A (weight-only) ---------------------------------------------------------------- */

/* The 16 weights of column vector j at k kk of quad q (relative to b's first, even quad). */
MM_TARGET_AVX512 MM_QK_INLINE __m512 mm_qk_wvec(const int INT4, const uint8_t *b, int64_t q,
                                                int kk, int j, int off, const float *wo)
{
    __m512i w;
    if (!INT4) {
        const __m512i x = _mm512_xor_si512(_mm512_load_si512(b + q * 256 + 64 * j),
                                           _mm512_set1_epi32((int)0x80808080u));
        w = _mm512_srai_epi32(_mm512_slli_epi32(x, 24 - 8 * kk), 24);
    } else {
        const __m512i x = _mm512_load_si512(b + (q / 2) * 256 + 64 * j);
        const unsigned sh = (unsigned)(8 * kk + 4 * (int)(q & 1));
        w = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(x, sh), _mm512_set1_epi32(15)),
                             _mm512_set1_epi32(8));
    }
    const __m512 f = _mm512_cvtepi32_ps(w);
    return off ? _mm512_add_ps(f, _mm512_loadu_ps(wo + 16 * j)) : f;
}

MM_TARGET_AVX512 MM_QK_INLINE void mm_qk_wo(const int MR, const int INT4, const mm_qk_ukr_args_t *p)
{
    const int64_t nq = p->nq;
    const float *a = p->a;
    const uint8_t *b = p->b;
    float *const tile = p->acc;
    const float *wo = p->wo;
    const char *pf = p->pf;
    __m512 acc[MM_QK_MR][4];
    if (p->cont) {
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++)
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
                acc[r][j] = _mm512_loadu_ps(tile + r * MM_QK_NR + 16 * j);
    } else {
        _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++)
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    }
    int64_t left = p->npf;
    const int l2 = p->pf_l2;
    const int off = !p->no_offset;
    /* Whole quads: per column vector one load of its 4 k (int4: of 8), then the 4 weight
     * vectors extracted in registers, dequantised and fed to the rows' FMAs. Per element the
     * FMA chain still runs k ascending (the column vectors are independent elements). */
    const int64_t nfull = p->kv == 4 ? nq : nq - 1;
    int64_t q = 0;
    for (; q < nfull; q++) {
        mm_qk_pf(&pf, &left, INT4 ? 2 : 4, l2);
        const float *aq = a + q * 4 * MM_QK_MR;
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
        {
            __m512i x;
            if (!INT4) {
                x = _mm512_xor_si512(_mm512_load_si512(b + q * 256 + 64 * j),
                                     _mm512_set1_epi32((int)0x80808080u));
            } else {
                x = _mm512_load_si512(b + (q / 2) * 256 + 64 * j);
                if (q & 1) x = _mm512_srli_epi32(x, 4);
            }
            const __m512 oj = off ? _mm512_loadu_ps(wo + 16 * j) : _mm512_setzero_ps();
            _Pragma("GCC unroll 4") for (int kk = 0; kk < 4; kk++)
            {
                __m512i w;
                if (!INT4)
                    w = kk == 3 ? _mm512_srai_epi32(x, 24)
                                : _mm512_srai_epi32(_mm512_slli_epi32(x, 24 - 8 * kk), 24);
                else
                    w = _mm512_sub_epi32(_mm512_and_si512(kk ? _mm512_srli_epi32(x, 8 * kk) : x,
                                                          _mm512_set1_epi32(15)),
                                         _mm512_set1_epi32(8));
                __m512 f = _mm512_cvtepi32_ps(w);
                if (off) f = _mm512_add_ps(f, oj);
                _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++)
                    acc[r][j] = _mm512_fmadd_ps(_mm512_set1_ps(aq[kk * MM_QK_MR + r]), f, acc[r][j]);
            }
        }
    }
    for (; q < nq; q++) { /* the last, partial quad of K */
        const int kmax = q == nq - 1 ? p->kv : 4;
        for (int kk = 0; kk < kmax; kk++) {
            const float *ak = a + (q * 4 + kk) * MM_QK_MR;
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
            {
                const __m512 wv = mm_qk_wvec(INT4, b, q, kk, j, off, wo);
                _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++)
                    acc[r][j] = _mm512_fmadd_ps(_mm512_set1_ps(ak[r]), wv, acc[r][j]);
            }
        }
    }
    _Pragma("GCC unroll 6") for (int r = 0; r < MR; r++)
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)
            _mm512_storeu_ps(tile + r * MM_QK_NR + 16 * j, acc[r][j]);
}

#define MM_QK_DEF(NAME, BODY, TARGET)                                                       \
    TARGET __attribute__((noinline)) static void NAME##_1(const mm_qk_ukr_args_t *p) { BODY(1, p); } \
    TARGET __attribute__((noinline)) static void NAME##_2(const mm_qk_ukr_args_t *p) { BODY(2, p); } \
    TARGET __attribute__((noinline)) static void NAME##_3(const mm_qk_ukr_args_t *p) { BODY(3, p); } \
    TARGET __attribute__((noinline)) static void NAME##_4(const mm_qk_ukr_args_t *p) { BODY(4, p); } \
    TARGET __attribute__((noinline)) static void NAME##_5(const mm_qk_ukr_args_t *p) { BODY(5, p); } \
    TARGET __attribute__((noinline)) static void NAME##_6(const mm_qk_ukr_args_t *p) { BODY(6, p); } \
    static void NAME(int mr, const mm_qk_ukr_args_t *p)                                      \
    {                                                                                       \
        switch (mr) {                                                                       \
        case 1: NAME##_1(p); break;                                                         \
        case 2: NAME##_2(p); break;                                                         \
        case 3: NAME##_3(p); break;                                                         \
        case 4: NAME##_4(p); break;                                                         \
        case 5: NAME##_5(p); break;                                                         \
        default: NAME##_6(p); break;                                                        \
        }                                                                                   \
    }

#define MM_QK_I8(MR, p) mm_qk_int(MR, 0, p)
#define MM_QK_I4(MR, p) mm_qk_int(MR, 1, p)
#define MM_QK_W8(MR, p) mm_qk_wo(MR, 0, p)
#define MM_QK_W4(MR, p) mm_qk_wo(MR, 1, p)
MM_QK_DEF(mm_qk_ukr_i8_avx512, MM_QK_I8, MM_TARGET_AVX512VNNI)
MM_QK_DEF(mm_qk_ukr_i4_avx512, MM_QK_I4, MM_TARGET_AVX512VNNI)
MM_QK_DEF(mm_qk_ukr_w8_avx512, MM_QK_W8, MM_TARGET_AVX512)
MM_QK_DEF(mm_qk_ukr_w4_avx512, MM_QK_W4, MM_TARGET_AVX512)

/* ---- flush and epilogue ------------------------------------------------------------------ */

MM_TARGET_AVX512 static void mm_qk_flush_avx512(const mm_qk_epi_args_t *e)
{
    for (int r = 0; r < e->mr; r++) {
        const __m512i corr = _mm512_set1_epi32(e->corr[r]);
        for (int j = 0; 16 * j < e->nr; j++) {
            const __mmask16 m = mm_tail_mask16(e->nr - 16 * j);
            const int64_t o = r * MM_QK_NR + 16 * j;
            __m512 t = e->fp_acc ? _mm512_loadu_ps((const float *)(e->i32 + o))
                                 : _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(e->i32 + o), corr));
            if (e->ws) t = _mm512_mul_ps(t, _mm512_maskz_loadu_ps(m, e->ws + 16 * j));
            if (!e->first) t = _mm512_add_ps(_mm512_loadu_ps(e->f32 + o), t);
            _mm512_storeu_ps(e->f32 + o, t);
        }
    }
}

MM_TARGET_AVX512 static void mm_qk_epilogue_avx512(const mm_qk_epi_args_t *e)
{
    for (int r = 0; r < e->mr; r++) {
        const __m512i corr = _mm512_set1_epi32(e->corr[r]);
        const __m512 xs = _mm512_set1_ps(e->xs ? e->xs[r] : 1.0f);
        for (int j = 0; 16 * j < e->nr; j++) {
            const __mmask16 m = mm_tail_mask16(e->nr - 16 * j);
            const int64_t o = r * MM_QK_NR + 16 * j, co = r * e->ldc + 16 * j;
            __m512 s;
            if (e->groups_mode == 0 && e->fp_acc) {
                s = _mm512_loadu_ps((const float *)(e->i32 + o));
                if (e->ws) s = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, e->ws + 16 * j));
            } else if (e->groups_mode == 0) {
                __m512i v = _mm512_sub_epi32(_mm512_loadu_si512(e->i32 + o), corr);
                if (e->bias_i32)
                    v = _mm512_add_epi32(v, _mm512_maskz_loadu_epi32(m, e->bias_i32 + 16 * j));
                if (e->c_type == MEGAMOE_DTYPE_INT32) {
                    _mm512_mask_storeu_epi32((int32_t *)e->c + co, m, v);
                    continue;
                }
                s = _mm512_cvtepi32_ps(v);
                if (e->ws) s = _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, e->ws + 16 * j));
            } else {
                s = _mm512_loadu_ps(e->f32 + o);
            }
            if (e->bias_pre) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(m, e->bias_pre + 16 * j));
            if (e->xs) s = _mm512_mul_ps(s, xs);
            if (e->bias_post) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(m, e->bias_post + 16 * j));
            if (e->c_type == MEGAMOE_DTYPE_FP32) _mm512_mask_storeu_ps((float *)e->c + co, m, s);
            else mm_store_bf16x16((uint16_t *)e->c + co, m, s);
        }
    }
}

/* Sum of n signed bytes: sign-extended to 32 bits 16 at a time (AVX-512F/BW only, so the
 * bf16-A kernel table can share it on CPUs without VNNI). */
MM_TARGET_AVX512 static int32_t mm_qk_rowsum_avx512(const int8_t *x, int64_t n)
{
    __m512i s = _mm512_setzero_si512();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = mm_tail_mask16(n - i);
        s = _mm512_add_epi32(s, _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, x + i)));
    }
    return _mm512_reduce_add_epi32(s);
}

const mm_qk_kernels_t mm_qk_kernels_avx512 = {
    .ukr_i8 = mm_qk_ukr_i8_avx512,
    .ukr_i4 = mm_qk_ukr_i4_avx512,
    .ukr_w8 = mm_qk_ukr_w8_avx512,
    .ukr_w4 = mm_qk_ukr_w4_avx512,
    .flush = mm_qk_flush_avx512,
    .epilogue = mm_qk_epilogue_avx512,
    .rowsum = mm_qk_rowsum_avx512,
};
#endif /* MM_X86 */
