/* The own AMX-BF16 GEMM backend, BLIS style: the driver (gemm_amx.c) owns the loops, the
 * blocking, the packing (gemm_amx_pack.c) and the edges; the micro-kernel
 * (gemm_amx_ukernel.c) runs one row of 32 x 32 micro-tiles over one K block on packed
 * operands. Private to these files.
 *
 * Tiles (palette 1, every tile 16 rows x 64 bytes): a tdpbf16ps takes an A tile of 16 rows x
 * 32 bf16 (k contiguous), a B tile of 16 k pairs x 16 columns x 2 bf16 (VNNI pairs) and adds
 * into a 16 x 16 fp32 C tile. A micro-tile is 2 x 2 C tiles (32 rows x 32 columns) fed by two
 * A tiles and two B tiles per k-step of 32: 4 tile loads per 4 tdpbf16ps. Registers: C00 t0,
 * C01 t1, C10 t2, C11 t3, A0 t4, A1 t5, B0 t6, B1 t7.
 *
 * Packed formats (K padded with zeros to whole k-steps of 32, so a k-step is always full):
 *   A micro-panel  32 rows x all k-steps: [KS][32 rows][32 bf16]; k-step s at s * 2 KiB, its
 *                  rows 0-15 are tile A0 and rows 16-31 tile A1 (1 KiB each, stride 64 B).
 *                  Rows past the end and k past K are 0. A K block is a contiguous slice.
 *   B panel        32 columns x all k-steps: [KS][2][16 pairs][16 columns][2]; k-step s at
 *                  s * 2 KiB, columns 0-15 tile B0, 16-31 tile B1. Element (k, n) at
 *                  s*1024 + (n/16)*512 + ((k%32)/2)*32 + (n%16)*2 + k%2 (in bf16 units).
 *                  Columns past N and k past K are 0. A K block is a contiguous slice.
 *   C partials     one 32 x 32 fp32 block per micro-tile, 4 KiB: tiles C00, C01, C10, C11,
 *                  each [16][16] (stride 64 B).
 *
 * Determinism: every C element is one chain of tdpbf16ps over its k-steps in ascending order
 * from +0 (tilezero), whatever the micro-tile, row block, column block, K block or sub-block
 * it falls in, and tdpbf16ps computes every element of a tile independently of the others.
 * Between K blocks the fp32 partial sums are stored and re-loaded exactly. The fp32 sum is
 * then added to C_old (accumulate) and rounded once to bf16 (megamoe_fp32_to_bf16). So the
 * bits of an element depend only on its A row, its B column and K: not on M, on m0/m1/n0/n1,
 * on how workers split a product, or on the blocking. */
#ifndef MM_KERNELS_GEMM_AMX_H
#define MM_KERNELS_GEMM_AMX_H

#include <stdint.h>

#include "base/cpu.h"

#define MM_AMX_KSTEP 32                 /* k per tdpbf16ps */
#define MM_AMX_MR 32                    /* rows of a micro-tile (2 A tiles) */
#define MM_AMX_NR 32                    /* columns of a micro-tile and of a B panel */
#define MM_AMX_STEP_BYTES 2048          /* one k-step of an A micro-panel or a B panel */
#define MM_AMX_ACC_FLOATS (32 * 32)     /* one micro-tile's fp32 partial sums (4 KiB) */

/* k-steps of a K extent. */
static inline int64_t mm_amx_ksteps(int64_t K) { return (K + MM_AMX_KSTEP - 1) / MM_AMX_KSTEP; }

/* Blocking of one call (the driver's defaults; a test hook can change them). */
typedef struct mm_amx_blocking {
    int64_t kc_steps; /* k-steps per K block (A micro-panel of kc_steps * 2 KiB in L1) */
    int64_t nc_panels; /* B panels per column block (one row of micro-tiles per kernel call) */
    int64_t mc_panels; /* A micro-panels per row block (packed A of a row block) */
} mm_amx_blocking_t;

/* One kernel call: a row of `nj` micro-tiles sharing the A micro-panel, over one K block. */
typedef struct mm_amx_ukr_args {
    const char *a;    /* A micro-panel at the K block: ks k-steps of 2 KiB */
    int a_tiles;      /* 2, or 1 when the micro-panel has <= 16 rows (A1 not used) */
    const char *b;    /* B slice of the first micro-tile: ks k-steps of 2 KiB */
    int64_t b_stride; /* bytes between the slices of consecutive micro-tiles */
    int64_t ks;       /* k-steps, > 0 */
    int64_t nj;       /* micro-tiles, > 0 */
    /* fp32 partial sums, MM_AMX_ACC_FLOATS per micro-tile, consecutive: read first when
     * `cont`, written at the end unless `last`. */
    float *acc;
    int cont, last;
    /* When last: C rows [0, rows) x columns [0, cols) (rows <= 32, cols <= nj * 32) at c,
     * row stride ldc (elements), fp32 or bf16; C = sum, or round(C_old + sum) with
     * accumulate. */
    void *c;
    int64_t ldc;
    int c_bf16, accumulate;
    int64_t rows, cols;
    int stream; /* C far bigger than the caches: non-temporal stores (the caller fences) */
    float *ebuf; /* 2 x 4 KiB scratch, 64-byte aligned: tiles on their way to the epilogue */
    /* L2 prefetch of what later calls read: micro-tile j (< pf_nj) prefetches npf lines from
     * pf + j * pf_stride; and the call prefetches napf lines from apf (the next A panel). */
    const char *pf;
    int64_t pf_stride, pf_nj, npf;
    const char *apf;
    int64_t napf;
} mm_amx_ukr_args_t;

#if MM_X86
/* Load the tile configuration (every tile 16 x 64 B) on this thread / release the tiles.
 * Only after mm_cpu_request_amx() said yes. */
void mm_amx_tiles_begin(void);
void mm_amx_tiles_end(void);

/* The micro-kernel row (tiles configured by mm_amx_tiles_begin). */
void mm_amx_ukernel(const mm_amx_ukr_args_t *args);

/* Pack one A micro-panel from rows rowp[0..rows) (rows <= 32, each K valid bf16; missing rows
 * are 0): all KS = ksteps(K) k-steps into dst (KS * 2 KiB, 64-byte aligned). The rows at
 * next[0..next_rows) (the next micro-panel's) are prefetched meanwhile. */
void mm_amx_pack_a_rows(char *dst, const uint16_t *const *rowp, int rows, int64_t K,
                        const uint16_t *const *next, int next_rows);
/* TN: the A micro-panel of C rows [m, m + rows) (rows <= 32), which are columns of A ([K, *],
 * row k at a_rows[k], or A + k * lda when a_rows is NULL). */
void mm_amx_pack_a_cols(char *dst, const uint16_t *A, int64_t lda, const uint16_t *const *a_rows,
                        int64_t m, int rows, int64_t K);
/* One B panel slice: k-steps [s0, s0 + ks) of columns [n0, n0 + cols) (cols <= 32) of a [K, *]
 * matrix (NN: row k at src + k * ld) or of an [N, K] matrix read transposed (NT: column n at
 * src + n * ld), into dst (ks * 2 KiB, 64-byte aligned). */
void mm_amx_pack_b(char *dst, const uint16_t *src, int64_t ld, int nt, int64_t K, int64_t s0,
                   int64_t ks, int64_t n0, int64_t cols);
#endif

/* Test hook: the blocking of later calls on all threads (NULL: the defaults). Not thread-safe
 * against running products. */
void mm_amx_set_blocking(const mm_amx_blocking_t *blocking);
void mm_amx_get_blocking(mm_amx_blocking_t *blocking);
/* Test hook: 1 makes the backend behave as on a machine without AMX (probe UNSUPPORTED, no
 * tile instruction); 0 restores. And the number of tile sessions (calls that configured the
 * tiles) so far in this process. */
void mm_amx_test_disable(int disabled);
unsigned long long mm_amx_tile_sessions(void);

#endif /* MM_KERNELS_GEMM_AMX_H */
