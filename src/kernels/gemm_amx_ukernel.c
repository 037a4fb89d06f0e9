/* AMX-BF16 micro-kernel of the own GEMM backend (formats in gemm_amx.h): one row of 32 x 32
 * micro-tiles over one K block, all sharing one A micro-panel.
 *
 * Why it is built this way (measured on a 2-core Sapphire-Rapids-class VM, tdpbf16ps peak
 * ~3.1 TFLOP/s per core; docs/kernels.md has the tables):
 *  - 2 x 2 C tiles per micro-tile: one 1 KiB tile load per tdpbf16ps, the fewest any shape
 *    allows with 8 tiles. The A micro-panel (ks * 2 KiB) stays in L1 across the row; the B
 *    slices come from L2 with the non-temporal hint (tileloaddt1), so they do not push the A
 *    micro-panel out of L1 (+5-10% at 12-16 k-steps per block).
 *  - Storing and re-loading the C tiles between micro-tiles costs about a tdpbf16ps each,
 *    in order: the transition from one micro-tile to the next is interleaved (store C00, start
 *    the next C00 with its first tdpbf16ps, store C01, ...), +8-12% at 8-12 k-steps.
 *  - The epilogue (bf16 rounding, accumulate, edges) of micro-tile j runs a few rows per k-step
 *    during micro-tile j+1, so the AVX-512 work overlaps the tile unit instead of stalling
 *    it; fp32 C without accumulate is stored straight from the tiles.
 *  - The next B block (and the next A micro-panel) are prefetched into L2 a share per k-step:
 *    without it the first row of a block waits for memory.
 * Only called after mm_cpu_request_amx() said yes (the driver checks). */
#include <string.h>

#include "gemm_amx.h"

#if MM_X86
#include <immintrin.h>

#include "simd.h"

#define MM_AMX_TARGET                                                                      \
    __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq")))

MM_AMX_TARGET void mm_amx_tiles_begin(void)
{
    mm_tilecfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    /* gcc 12 does not treat ldtilecfg as reading its operand and drops the stores above
     * (ldtilecfg then faults on a half-written configuration): make the memory escape. */
    __asm__ __volatile__("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}

/* Back to the init state: the OS then saves no tile data on a context switch. */
MM_AMX_TARGET void mm_amx_tiles_end(void) { _tile_release(); }

/* ---- epilogue: a 32 x 32 fp32 block (tile layout) -> C rows ------------------------------- */

typedef struct mm_amx_epi {
    const float *blk; /* 4 KiB block in tile layout, or NULL when nothing is pending */
    char *c;          /* C at the block's first element */
    int64_t ldc, cols;
    int row, rows;
    int bf16, accumulate;
    int stream; /* non-temporal stores where a row chunk is whole and aligned */
} mm_amx_epi_t;

/* Rows [e->row, min(e->row + n, e->rows)) of the pending block. */
MM_AMX_TARGET static inline void mm_amx_epi_rows(mm_amx_epi_t *e, int n)
{
    const int end = e->row + n < e->rows ? e->row + n : e->rows;
    const __mmask16 m0 = mm_tail_mask16(e->cols), m1 = mm_tail_mask16(e->cols > 16 ? e->cols - 16 : 0);
    for (int r = e->row; r < end; r++) {
        const float *t = e->blk + (r >> 4) * 512 + (r & 15) * 16; /* C_0 / C_1 tile row */
        __m512 v0 = _mm512_load_ps(t), v1 = _mm512_load_ps(t + 256);
        if (!e->bf16) {
            float *o = (float *)e->c + r * e->ldc;
            if (e->accumulate) {
                v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, o), v0);
                v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, o + 16), v1);
            }
            if (e->stream && e->cols == 32 && ((uintptr_t)o & 63) == 0) {
                _mm512_stream_ps(o, v0);
                _mm512_stream_ps(o + 16, v1);
            } else {
                _mm512_mask_storeu_ps(o, m0, v0);
                _mm512_mask_storeu_ps(o + 16, m1, v1);
            }
        } else {
            uint16_t *o = (uint16_t *)e->c + r * e->ldc;
            if (e->accumulate) {
                v0 = _mm512_add_ps(mm_load_bf16x16(o, m0), v0);
                v1 = _mm512_add_ps(mm_load_bf16x16(o + 16, m1), v1);
            }
            if (e->stream && e->cols == 32 && ((uintptr_t)o & 63) == 0) {
                _mm512_stream_si512((void *)o,
                                    _mm512_inserti64x4(_mm512_castsi256_si512(mm_cvt_bf16x16(v0)),
                                                       mm_cvt_bf16x16(v1), 1));
            } else {
                mm_store_bf16x16(o, m0, v0);
                mm_store_bf16x16(o + 16, m1, v1);
            }
        }
    }
    e->row = end;
}

/* ---- the kernel --------------------------------------------------------------------------- */

/* Where the four C tiles of a micro-tile go (or come from): base + off[t], row stride bytes. */
typedef struct mm_amx_cdst {
    float *base;
    int64_t off1, off2, off3; /* off0 = 0 */
    int64_t stride;
} mm_amx_cdst_t;

/* The tile unit runs tile instructions in order, so an operand load issued right before its
 * tdpbf16ps exposes its latency (B comes from L2). The loops below are software-pipelined:
 * the operands of the next k-step are loaded as soon as the current one has consumed the
 * register (after dp01 A0 is free, after dp10 B0, after dp11 A1 and B1): 80-83% of peak with
 * B from L2 and no C traffic, against 70-74% loading right before use (measured).
 *
 * MM_AMX_DPS: the k-step whose operands are in t4-t7, preloading the k-step at (na, nb) when
 * ld (a compile-time 0/1) is set; with ld 0 na/nb are not read (any valid pointer: clang rejects
 * arithmetic on a NULL constant even in a dead branch). */
#define MM_AMX_DPS(AT, ld, na, nb)                                                          \
    do {                                                                                    \
        _tile_dpbf16ps(0, 4, 6);                                                            \
        _tile_dpbf16ps(1, 4, 7);                                                            \
        if (ld) _tile_loadd(4, (na), 64);                                                   \
        if ((AT) == 2) _tile_dpbf16ps(2, 5, 6);                                             \
        if (ld) _tile_stream_loadd(6, (nb), 64);                                            \
        if ((AT) == 2) {                                                                    \
            _tile_dpbf16ps(3, 5, 7);                                                        \
            if (ld) _tile_loadd(5, (na) + 1024, 64);                                        \
        }                                                                                   \
        if (ld) _tile_stream_loadd(7, (nb) + 1024, 64);                                     \
    } while (0)

/* Load the k-step at (a, b) into t4-t7. */
#define MM_AMX_LOAD_OPS(AT, a, b)                                                           \
    do {                                                                                    \
        _tile_loadd(4, (a), 64);                                                            \
        _tile_stream_loadd(6, (b), 64);                                                     \
        _tile_stream_loadd(7, (b) + 1024, 64);                                              \
        if ((AT) == 2) _tile_loadd(5, (a) + 1024, 64);                                      \
    } while (0)

/* C tiles from acc (cont) or zero. */
#define MM_AMX_INIT_C(t, src, off)                                                          \
    do {                                                                                    \
        if (cont) _tile_loadd(t, (src) + (off), 64);                                        \
        else _tile_zero(t);                                                                 \
    } while (0)

#define MM_AMX_STORE(t, d, o) _tile_stored(t, (d)->base + (o), (d)->stride)

MM_AMX_TARGET static inline __attribute__((always_inline)) void
mm_amx_row(const int AT, const mm_amx_ukr_args_t *p)
{
    /* Everything into locals: the project builds with -fno-strict-aliasing, so fields read
     * through p after a store to C would be re-loaded. */
    const char *const a = p->a;
    const char *const b0 = p->b;
    const int64_t bs = p->b_stride, ks = p->ks, nj = p->nj;
    float *const acc = p->acc;
    const int cont = p->cont, last = p->last;
    const int64_t ldc = p->ldc, cols = p->cols, es = p->c_bf16 ? 2 : 4;
    char *const c = p->c;
    float *const ebuf = p->ebuf;
    const char *const pf0 = p->pf;
    const int64_t pf_stride = p->pf_stride, pf_nj = p->pf_nj, npf = p->npf;
    const char *apf = p->apf;
    const int64_t napf = p->napf;
    const int64_t SB = MM_AMX_STEP_BYTES;
    /* prefetch lines per k-step, and epilogue rows per k-step (a pending block is done by the
     * end of the next micro-tile) */
    const int64_t pf_per = (npf + ks - 1) / ks;
    const int epi_per = ks > 2 ? (int)((p->rows + ks - 3) / (ks - 2)) : (int)p->rows;

    mm_amx_epi_t epi = {NULL, NULL, ldc, 0, 0, (int)p->rows, p->c_bf16, p->accumulate, p->stream};

#define MM_AMX_SRC(j) (acc + (j) * MM_AMX_ACC_FLOATS)
    MM_AMX_INIT_C(0, MM_AMX_SRC(0), 0);
    MM_AMX_INIT_C(1, MM_AMX_SRC(0), 256);
    if (AT == 2) {
        MM_AMX_INIT_C(2, MM_AMX_SRC(0), 512);
        MM_AMX_INIT_C(3, MM_AMX_SRC(0), 768);
    }
    MM_AMX_LOAD_OPS(AT, a, b0);
    int64_t s0 = 0; /* first k-step of micro-tile j still to run (1 after a fused start) */
    for (int64_t j = 0; j < nj; j++) {
        const char *b = b0 + j * bs;
        int64_t pf_left = j < pf_nj && pf0 ? npf : 0;
        const char *pf = pf_left ? pf0 + j * pf_stride : NULL;
        const int64_t a0 = napf * j / nj, a1 = napf * (j + 1) / nj;
        for (int64_t l = a0; l < a1; l++) _mm_prefetch(apf + 64 * l, _MM_HINT_T1);
        /* the next micro-tile's partial sums into L1: its transition reloads them in order */
        const char *cpf = cont && j + 1 < nj ? (const char *)MM_AMX_SRC(j + 1) : NULL;
        int64_t cpf_left = cpf ? MM_AMX_ACC_FLOATS * 4 / 64 : 0;
        const int64_t cpf_per = (cpf_left + ks - 1) / ks;
        /* k-steps s0 .. ks-2 (operands of step s in t4-t7, step s+1 preloaded) */
        for (int64_t s = s0; s < ks - 1; s++) {
            MM_AMX_DPS(AT, 1, a + (s + 1) * SB, b + (s + 1) * SB);
            for (int64_t q = 0; q < pf_per && pf_left > 0; q++, pf_left--, pf += 64)
                _mm_prefetch(pf, _MM_HINT_T1);
            for (int64_t q = 0; q < cpf_per && cpf_left > 0; q++, cpf_left--, cpf += 64)
                _mm_prefetch(cpf, _MM_HINT_T0);
            if (epi.blk) mm_amx_epi_rows(&epi, epi_per);
        }
        /* the last k-step, preloading the next micro-tile's first */
        const int more = j + 1 < nj;
        const char *nb = b + bs;
        if (more) MM_AMX_DPS(AT, 1, a, nb);
        else MM_AMX_DPS(AT, 0, a, b);
        for (; pf_left > 0; pf_left--, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
        for (; cpf_left > 0; cpf_left--, cpf += 64) _mm_prefetch(cpf, _MM_HINT_T0);

        /* where this micro-tile's C tiles go */
        const int64_t jc = cols - j * MM_AMX_NR; /* valid columns of this micro-tile */
        mm_amx_cdst_t d;
        int via_epi = 0;
        if (!last) {
            d = (mm_amx_cdst_t){acc + j * MM_AMX_ACC_FLOATS, 256, 512, 768, 64};
        } else { /* never straight to C: a tile store that misses waits in order (TN fp32
                    dW 495 -> 603 GFLOP/s through the epilogue) */
            if (epi.blk) mm_amx_epi_rows(&epi, 32); /* finish the pending block first */
            d = (mm_amx_cdst_t){ebuf + (j & 1) * MM_AMX_ACC_FLOATS, 256, 512, 768, 64};
            via_epi = 1;
        }
        if (more && ks > 1) {
            /* store this micro-tile while the next one runs its first k-step (preloaded
             * above), which preloads its second */
            const float *ns = MM_AMX_SRC(j + 1);
            const char *na = a + SB, *nb1 = nb + SB;
            MM_AMX_STORE(0, &d, 0);
            MM_AMX_INIT_C(0, ns, 0);
            _tile_dpbf16ps(0, 4, 6);
            MM_AMX_STORE(1, &d, d.off1);
            MM_AMX_INIT_C(1, ns, 256);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(4, na, 64);
            if (AT == 2) {
                MM_AMX_STORE(2, &d, d.off2);
                MM_AMX_INIT_C(2, ns, 512);
                _tile_dpbf16ps(2, 5, 6);
            }
            _tile_stream_loadd(6, nb1, 64);
            if (AT == 2) {
                MM_AMX_STORE(3, &d, d.off3);
                MM_AMX_INIT_C(3, ns, 768);
                _tile_dpbf16ps(3, 5, 7);
                _tile_loadd(5, na + 1024, 64);
            }
            _tile_stream_loadd(7, nb1 + 1024, 64);
            s0 = 1;
        } else {
            MM_AMX_STORE(0, &d, 0);
            MM_AMX_STORE(1, &d, d.off1);
            if (AT == 2) {
                MM_AMX_STORE(2, &d, d.off2);
                MM_AMX_STORE(3, &d, d.off3);
            }
            if (more) { /* ks == 1: the next micro-tile's operands are loaded; start its C */
                const float *ns = MM_AMX_SRC(j + 1);
                MM_AMX_INIT_C(0, ns, 0);
                MM_AMX_INIT_C(1, ns, 256);
                if (AT == 2) {
                    MM_AMX_INIT_C(2, ns, 512);
                    MM_AMX_INIT_C(3, ns, 768);
                }
            }
            s0 = 0;
        }
        if (via_epi) { /* through the epilogue, during the next micro-tile */
            epi.blk = d.base;
            epi.c = c + j * MM_AMX_NR * es;
            epi.cols = jc < MM_AMX_NR ? jc : MM_AMX_NR;
            epi.row = 0;
        }
    }
    if (epi.blk) mm_amx_epi_rows(&epi, 32);
#undef MM_AMX_SRC
}

MM_AMX_TARGET __attribute__((noinline)) static void mm_amx_row2(const mm_amx_ukr_args_t *p)
{
    mm_amx_row(2, p);
}

MM_AMX_TARGET __attribute__((noinline)) static void mm_amx_row1(const mm_amx_ukr_args_t *p)
{
    mm_amx_row(1, p);
}

void mm_amx_ukernel(const mm_amx_ukr_args_t *p)
{
    if (p->a_tiles == 2) mm_amx_row2(p);
    else mm_amx_row1(p);
}
#endif /* MM_X86 */
