/* The own AVX-512 GEMM backend (vdpbf16ps, or fp32 FMAs where AVX512-BF16 is missing, or the
 * same FMAs in ymm registers where AVX-512 is missing: the AVX2 form), BLIS
 * style: the driver (gemm_avx512.c) owns the loops, the blocking, the packing
 * (gemm_avx512_pack.c) and the edges; the micro-kernels (gemm_avx512_ukernel.c) only do an
 * mr x 64 rank-kp update on packed panels with a fixed signature. Private to these three files, except the B panel packer, which also fills
 * oneDNN's BA16a64b2a packed weights (the same layout; gemm_onednn.c).
 *
 * Packed formats (bf16 pairs along k, the operand layout of vdpbf16ps):
 *   B panel   64 columns x all of K: [ceil(K/2)][64][2] bf16, zero padded past K and past the
 *             last column; 64-byte aligned. Element (k, j) at panel[(k/2)*128 + 2*j + k%2].
 *             A K block [p0, p0+kp) of pairs is the contiguous slice at panel + p0*128.
 *   A block   rows of one row block, K block by K block: for each K block of kp pairs, its
 *             micro-panels (MM_AVX_MR rows each) one after the other, each [kp][MM_AVX_MR]
 *             uint32 = (A[r][2p] | A[r][2p+1] << 16); rows past the block's end and k past K
 *             are 0.
 *
 * Determinism: every element of C is one chain of vdpbf16ps (or of its two FMAs per pair)
 * over its k pairs in ascending order, started from +0, whatever the row/column sub-block,
 * the tile it falls in or the K blocking (partial sums are kept in fp32, never rounded, between
 * K blocks). The fp32 sum is then added to C_old (accumulate) and rounded once to bf16. So the bits of an element do not
 * depend on how a product is split between calls. */
#ifndef MM_KERNELS_GEMM_AVX512_H
#define MM_KERNELS_GEMM_AVX512_H

#include <stdint.h>

#include "base/cpu.h"
#include "megamoe/dtype.h"

#define MM_AVX_MR 6  /* rows of a micro-tile (6 x 4 = 24 zmm accumulators) */
#define MM_AVX_NR 64 /* columns of a micro-tile and of a B panel (4 zmm of fp32) */

/* One micro-kernel call: C_tile[mr][nr] (+)= A_panel · B_panel over kp pairs. */
typedef struct mm_avx512_ukr_args {
    int64_t kp;        /* k pairs, > 0 */
    const uint32_t *a; /* A micro-panel [kp][MM_AVX_MR]; the FMA form's [kp][MM_AVX_MR][2]:
                          the fp32 bits of each pair's odd element, then of its even one */
    const uint16_t *b; /* B slice [kp][64][2], 64-byte aligned */
    /* The FMA form's widened slice, [kp][8][16] fp32 (per pair the 4 vectors of odd
     * elements, then the 4 of even ones; 64-byte aligned): read from bw (else the halves are
     * made in registers), or made in registers and also written to bw_out. NULL: neither. */
    const float *bw;
    float *bw_out;
    /* fp32 partial sums of the tile, [MM_AVX_MR][64] contiguous: read first when `cont`
     * (continue a K chain), written at the end unless `last`. */
    float *acc;
    int cont, last;
    /* When last: C rows [0, mr) x columns [0, nr) (nr <= 64) at c, row stride ldc (elements),
     * fp32 or bf16, C = sum or C = round(C_old + sum) with accumulate. */
    void *c;
    int64_t ldc;
    int c_bf16, accumulate;
    int64_t nr;
    /* L2 prefetch of what the next calls read: npf 64-byte lines from pf (may be 0). */
    const char *pf;
    int64_t npf;
    int pf_l1; /* ... into L1 (hint T0) instead of L2 (T1) */
} mm_avx512_ukr_args_t;

#if MM_X86
/* The micro-kernel for mr rows (1..MM_AVX_MR): vdpbf16ps where the CPU has AVX512-BF16,
 * else two fp32 FMAs per pair (mm_avx512_kernel_is_fma). */
void mm_avx512_ukernel(int mr, const mm_avx512_ukr_args_t *args);
/* Its AVX2 form (gemm_avx2_ukernel.c): the FMA form's arithmetic in ymm registers, for CPUs
 * with AVX2 and FMA but no AVX-512; mm_avx512_ukernel calls it there. */
void mm_avx2_ukernel(int mr, const mm_avx512_ukr_args_t *args);
/* Run the AVX2 form even where AVX-512 is present (on = 1) or not (0), for every later call in
 * the process: tests compare its bits with the AVX-512 forms'. Returns the previous setting, or
 * -1 (nothing changed) where the CPU has no AVX2/FMA. Not to be switched during products. */
int mm_avx512_force_avx2(int on);
/* 1 where products run the AVX2 form (no AVX-512, or forced). It never widens B slices
 * (bw/bw_out stay NULL): measured slower there (Zen 3, below). */
int mm_avx512_form_is_avx2(void);
int mm_avx512_kernel_is_fma(void);

/* Pack pairs [p0, p0 + kp) of rows [0, rows) (rows <= MM_AVX_MR; row r starts at rowp[r],
 * K valid elements) into one A micro-panel [kp][MM_AVX_MR]; missing rows are 0. The same
 * range of the next_rows rows at next[] (NULL: none) is prefetched meanwhile. */
void mm_avx512_pack_a_rows(uint32_t *dst, const uint16_t *const *rowp, int rows, int64_t K,
                           int64_t p0, int64_t kp, const uint16_t *const *next, int next_rows);
/* TN: the A block (all of K, K blocks of kcp pairs, the last shorter) of C rows
 * [m, m + mb), which are columns of A ([K, *], row k at a_rows[k], or A + k*lda when a_rows is
 * NULL); same layout as the row packer's; columns past mb are 0. */
void mm_avx512_pack_a_cols(uint32_t *dst, const uint16_t *A, int64_t lda,
                           const uint16_t *const *a_rows, int64_t m, int64_t mb, int64_t K,
                           int64_t kcp);
/* One B panel (all of K) from columns [n0, n0 + cols) (cols <= 64) of a [K, *] matrix (NN,
 * row k at src + k*ld) or of an [N, K] matrix read transposed (NT, column n at src + n*ld). */
void mm_avx512_pack_b_panel(uint16_t *dst, const uint16_t *src, int64_t ld, int nt, int64_t K,
                            int64_t n0, int64_t cols);
#endif

#endif /* MM_KERNELS_GEMM_AVX512_H */
