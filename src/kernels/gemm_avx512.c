/* The own AVX-512 backend (AVX512-BF16, or fp32 FMAs without it): the BLIS-style driver.
 * The micro-kernel (gemm_avx512_ukernel.c) does an mr x 64 update over one K block; the packers
 * (gemm_avx512_pack.c) produce the panels; this file owns the loops, the blocking, the
 * prefetch schedule, the edges and the backend vtable. Formats and the determinism argument
 * are in gemm_avx512.h.
 *
 * Loops of one call (rows [m0,m1) x columns [n0,n1) of C; single-threaded, args->threads is
 * ignored — workers split products with mm_gemm_split):
 *
 *   for each row block of <= MM_AVX_MC rows            pack A (all of K) into scratch
 *     for each 64-column B panel                       (plain B: pack this panel)
 *       for each K block of <= MM_AVX_KCP k pairs      B slice = panel rows [p0, p0+kc)
 *         for each 6-row micro-tile of the block       micro-kernel
 *
 * The B slice (<= 256 KiB) is read from L2 by every micro-tile of the row block (the kernel
 * needs 256 bytes of B per 12 cycles: L2 delivers that, L3 and memory do not). So the next
 * slice must be in L2 before its first tile starts: the last MM_AVX_PF_TILES tiles of a
 * slice prefetch it, a share each, and every line MM_AVX_PF_DUP times over — under the B
 * stream from L2 this CPU drops many software prefetches (measured: one pass leaves about
 * half of a slice outside L2, three passes almost none). The first tile of a slice also
 * prefetches its own slice MM_AVX_PF_AHEAD bytes ahead of its loads. The A micro-panel
 * (<= 24 KiB per K block) streams in sequentially; while one micro-panel is packed, the rows
 * of the next are prefetched. Partial sums between K blocks stay fp32 in a per-thread tile
 * buffer (L2-resident: tiles x 1.5 KiB); the last K block writes C directly. Packed weights
 * of 4 MiB and more sit on transparent huge pages where the kernel allows (one TLB entry per
 * 2 MiB of B, and the hardware prefetchers do not stop every 4 KiB).
 *
 * Measured on Zen 5 (docs/kernels.md): 94-96% of the vdpbf16ps peak on the MoE shapes with
 * packed weights, one thread. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/cpu.h"
#include "base/error.h"
#include "gemm_avx512.h"
#include "gemm_impl.h"

#if MM_X86
#include <immintrin.h>

#define MM_AVX_KCP 1024      /* k pairs per K block: a B slice of <= 256 KiB, two fit in L2 */
#define MM_AVX_MC 384        /* rows per row block (packed A: MC x K bf16) */
#define MM_AVX_PF_TILES 12   /* tiles that prefetch the next B slice (the last ones of a slice) */
#define MM_AVX_PF_DUP 3      /* ... each line this many times */
#define MM_AVX_PF_AHEAD 4096 /* bytes the first tile of a slice prefetches ahead of its loads */
/* Calls of <= MM_AVX_DECODE_ROWS rows (decode: the weights are streamed from memory by the
 * first tile and are what bounds the call) prefetch into L1 just ahead instead: at M = 4 on
 * 4096 x 2816 weights from memory (Zen 4) 27-30 GB/s of weights instead of 19-20 with the
 * 4 KiB L2 prefetch (M = 1: 28-30 either way). Not on Intel, where the far L2 prefetch wins
 * (Xeon VM, family 6 model 207, FMA form, `bench gemm --quick --no-probe --shape dec_gmm1`,
 * alternated twice, GFLOP/s two threads, M = 1 / 4 / 8): 256 B into L1 24 / 73-74 / 118-119,
 * 1 KiB 25-26 / 86-87 / 129-132, 2 KiB 27 / 93-94 / 138-141, 4 KiB into L1 27-28 / 96-99 /
 * 144-149, 4 KiB into L2 29 / 105-106 / 145-150, 8 KiB into L2 28 / 105-106 / 149-151. */
#define MM_AVX_DECODE_ROWS 36
/* The FMA form (no AVX512-BF16) makes B's fp32 halves in registers: 8 logic ops per 48 FMAs,
 * on the same two vector ports. Row blocks of at least this many tiles widen each B slice
 * once into an fp32 copy in L2 (twice the bytes, the same bits) that all their tiles read
 * instead. Xeon VM (family 6 model 207), `bench gemm --quick --no-probe --no-quant --shape
 * m2048 / m512`, alternated twice, GFLOP/s one / two threads: M = 2048 132-141 / 237-261 ->
 * 155 / 290-306 (89 % of the FMA peak with one thread), M = 512 122-136 / 231-240 -> 137-157 /
 * 271-272. Fewer tiles would not pay for the widening; decode calls never widen. The
 * slice's first tile widens it while it computes (it makes the halves in registers anyway;
 * the stores use other ports) instead of a separate pass before it: `bench gemm --seconds 2
 * --no-probe --no-quant`, packed, one thread, best GFLOP/s, three alternations: M = 128
 * 153 / 157 / 156 -> 159 / 159 / 160, M = 2048 161 / 162 / 162 -> 164 / 164 / 164. */
#define MM_AVX_WIDE_TILES 8
#define MM_AVX_PF_AHEAD_DECODE 256
/* Decode calls of several tiles (7..36 rows) spread their rows evenly over the tiles (8 rows:
 * 4 + 4, not 6 + 2) and use K blocks of this many pairs (a 12 KiB slice, in L1 for the tiles
 * after the first) instead of 256 KiB slices that the later tiles re-read from L2 while the
 * memory stream stalls. Same chains per element, so the same bits. Zen 5 (family 26),
 * `bench gemm --shape dec_gmm1 --seconds 0.3 --no-probe`, alternated twice, bf16 GFLOP/s one /
 * two threads: M = 8 116-121 / 212-226 -> 132-177 / 314-334, M = 16 216-234 / 395-420 ->
 * 245-304 / 524-600 (K blocks of 32 or 64 pairs: the same within the noise; 16 slower; those
 * runs' data not kept; the kept before/after runs: docs/results/zen5-2026-12-07c). */
#define MM_AVX_KCP_DECODE 48

static megamoe_status_t mm_avx512_probe(void)
{
    if (!mm_cpu_has_avx512() && !mm_cpu_has_avx2_fma())
        return mm_error_quiet(MEGAMOE_UNSUPPORTED, "the avx512 GEMM backend needs AVX-512 "
                              "(F, BW, VL, DQ), or AVX2 and FMA for its AVX2 form");
    return MEGAMOE_OK;
}

/* bf16 elements of one packed panel (all of K). */
static inline size_t mm_panel_elems(int64_t K) { return (size_t)((K + 1) / 2) * 2 * MM_AVX_NR; }

static inline int64_t mm_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t mm_max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* First row of tile t of a row block of mb rows in `tiles` tiles: MM_AVX_MR rows each (the
 * last takes the rest), or with `even` the rows spread evenly (decode: 8 rows are two tiles
 * of 4, not 6 + 2, so that no tile is a thin one re-reading the whole slice). */
static inline int64_t mm_avx_tile_row(int64_t mb, int64_t tiles, int64_t t, int even)
{
    if (even) return t * mb / tiles;
    return t * MM_AVX_MR < mb ? t * MM_AVX_MR : mb;
}
static inline int mm_avx_tile_rows(int64_t mb, int64_t tiles, int64_t t, int even)
{
    return (int)(mm_avx_tile_row(mb, tiles, t + 1, even) - mm_avx_tile_row(mb, tiles, t, even));
}

/* How one call is blocked. */
typedef struct mm_avx_plan {
    int64_t K2;       /* k pairs */
    int64_t nkb, kcp; /* K blocks and pairs per block (the last may be shorter) */
    int64_t mc;       /* rows per row block, a multiple of MM_AVX_MR */
} mm_avx_plan_t;

static void mm_avx_plan(int64_t rows, int64_t K, int decode, mm_avx_plan_t *pl)
{
    const int64_t kcp = decode && rows > MM_AVX_MR ? MM_AVX_KCP_DECODE : MM_AVX_KCP;
    pl->K2 = (K + 1) / 2;
    pl->nkb = (pl->K2 + kcp - 1) / kcp;
    pl->kcp = (pl->K2 + pl->nkb - 1) / pl->nkb; /* equal blocks */
    int64_t nib = (rows + MM_AVX_MC - 1) / MM_AVX_MC;
    int64_t mc = (rows + nib - 1) / nib;
    pl->mc = (mc + MM_AVX_MR - 1) / MM_AVX_MR * MM_AVX_MR;
}

/* Pack rows [r0, r0 + mb) of the call's A (all of K) as K blocks of micro-panels. While one
 * micro-panel is packed, the rows of the next one are prefetched: A usually comes from L3 or
 * memory here, and six short row streams do not train the hardware prefetchers. */
static void mm_avx_pack_a(const mm_gemm_args_t *a, const mm_avx_plan_t *pl, int64_t r0,
                          int64_t mb, int even, uint32_t *dst)
{
    if (a->form == MM_GEMM_TN) {
        mm_avx512_pack_a_cols(dst, a->A, a->lda, a->a_rows, a->m0 + r0, mb, a->K, pl->kcp);
        return;
    }
    const int64_t tiles = (mb + MM_AVX_MR - 1) / MM_AVX_MR;
    const uint16_t *rowp[MM_AVX_MR], *nextp[MM_AVX_MR];
    int mr = mm_avx_tile_rows(mb, tiles, 0, even);
    for (int r = 0; r < mr; r++) rowp[r] = mm_gemm_a_row(a, a->m0 + r0 + r);
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t mn = a->m0 + r0 + mm_avx_tile_row(mb, tiles, t + 1, even);
        const int nmr = t + 1 < tiles ? mm_avx_tile_rows(mb, tiles, t + 1, even) : 0;
        for (int r = 0; r < nmr; r++) nextp[r] = mm_gemm_a_row(a, mn + r);
        for (int64_t p0 = 0; p0 < pl->K2; p0 += pl->kcp) {
            const int64_t kc = mm_min64(pl->kcp, pl->K2 - p0);
            uint32_t *o = dst + (size_t)(p0 * tiles + t * kc) * MM_AVX_MR;
            mm_avx512_pack_a_rows(o, rowp, mr, a->K, p0, kc, nmr ? nextp : NULL, nmr);
        }
        for (int r = 0; r < nmr; r++) rowp[r] = nextp[r];
        mr = nmr;
    }
}

/* The FMA form's A block: every packed pair (A[2p] | A[2p+1] << 16) becomes the fp32 bits of
 * its odd element, then of its even one, in place (backwards: element i moves to 2i and 2i+1,
 * never over one not yet read). The micro-kernel then broadcasts each half straight from
 * memory (a load, not a shuffle-port operation per row and pair). */
static void mm_avx_widen_a(uint32_t *abuf, size_t n)
{
    for (size_t i = n; i-- > 0;) {
        const uint32_t x = abuf[i];
        abuf[2 * i + 1] = x << 16;
        abuf[2 * i] = x & 0xffff0000u;
    }
}

static megamoe_status_t mm_avx512_gemm(const mm_gemm_args_t *a)
{
    const int64_t rows = a->m1 - a->m0, cols = a->n1 - a->n0;
    /* Decode sizes: the first tile streams the weights from memory at the memory's pace. */
    const int decode = rows <= MM_AVX_DECODE_ROWS && !mm_cpu_is_intel();
    const int even = decode && a->form != MM_GEMM_TN;
    mm_avx_plan_t pl;
    mm_avx_plan(rows, a->K, decode, &pl);
    const size_t pe = mm_panel_elems(a->K);
    const int64_t np = (cols + MM_AVX_NR - 1) / MM_AVX_NR;
    const int64_t tiles_max = pl.mc / MM_AVX_MR;

    /* Packed weight: its panels from column n0 (a multiple of 64, checked by the framework).
     * Plain B read by one row block: one panel at a time into scratch, packed right before
     * use (hot in L2). Plain B read by several row blocks: all panels packed once up front
     * and then read like a packed weight (with its prefetch schedule) — packing each panel
     * again for every row block cost ~5% on the weight-gradient shapes. */
    const uint16_t *wpanels = NULL;
    uint16_t *bbuf = NULL;
    if (a->weight) {
        wpanels = (const uint16_t *)a->weight->data + (size_t)(a->n0 / MM_AVX_NR) * pe;
    } else if (rows > pl.mc) {
        uint16_t *all = mm_gemm_scratch(1, (size_t)np * pe * sizeof(uint16_t));
        if (all == NULL) return MEGAMOE_OUT_OF_MEMORY;
        for (int64_t p = 0; p < np; p++)
            mm_avx512_pack_b_panel(all + (size_t)p * pe, a->B, a->ldb, a->form == MM_GEMM_NT,
                                   a->K, a->n0 + p * MM_AVX_NR,
                                   mm_min64(MM_AVX_NR, cols - p * MM_AVX_NR));
        wpanels = all;
    } else {
        bbuf = mm_gemm_scratch(1, pe * sizeof(uint16_t));
        if (bbuf == NULL) return MEGAMOE_OUT_OF_MEMORY;
    }
    /* the FMA form reads each A pair as its two widened halves (mm_avx_widen_a) */
    const int fma = mm_avx512_kernel_is_fma();
    const size_t a_elems = (size_t)(tiles_max * MM_AVX_MR * pl.K2);
    uint32_t *abuf = mm_gemm_scratch(2, (fma ? 2 : 1) * a_elems * sizeof(uint32_t));
    if (abuf == NULL) return MEGAMOE_OUT_OF_MEMORY;
    /* the FMA form's widened B slice (MM_AVX_WIDE_TILES) */
    float *bwide = NULL;
    if (fma && tiles_max >= MM_AVX_WIDE_TILES && !mm_avx512_form_is_avx2()) {
        bwide = mm_gemm_scratch(4, (size_t)pl.kcp * 2 * MM_AVX_NR * sizeof(float));
        if (bwide == NULL) return MEGAMOE_OUT_OF_MEMORY;
    }
    float *acc = NULL;
    if (pl.nkb > 1) {
        acc = mm_gemm_scratch(3, (size_t)(tiles_max * MM_AVX_MR * MM_AVX_NR) * sizeof(float));
        if (acc == NULL) return MEGAMOE_OUT_OF_MEMORY;
    }

    void *C = mm_gemm_c_at(a->C, a->ldc, a->c_type, a->m0, a->n0);
    mm_avx512_ukr_args_t u;
    memset(&u, 0, sizeof u);
    u.ldc = a->ldc;
    u.c_bf16 = a->c_type == MEGAMOE_DTYPE_BF16;
    u.accumulate = a->accumulate;
    const int nt = a->form == MM_GEMM_NT;
    const int64_t first_lines = mm_min64(pl.kcp, pl.K2) * 4; /* lines of a call's first slice */

    for (int64_t r0 = 0; r0 < rows; r0 += pl.mc) {
        const int64_t mb = mm_min64(pl.mc, rows - r0);
        const int64_t tiles = (mb + MM_AVX_MR - 1) / MM_AVX_MR;
        mm_avx_pack_a(a, &pl, r0, mb, even, abuf);
        if (fma) mm_avx_widen_a(abuf, (size_t)(tiles * MM_AVX_MR * pl.K2));
        for (int64_t p = 0; p < np; p++) {
            const uint16_t *panel;
            if (wpanels) {
                panel = wpanels + (size_t)p * pe;
            } else {
                mm_avx512_pack_b_panel(bbuf, a->B, a->ldb, nt, a->K, a->n0 + p * MM_AVX_NR,
                                       mm_min64(MM_AVX_NR, cols - p * MM_AVX_NR));
                panel = bbuf;
            }
            u.nr = mm_min64(MM_AVX_NR, cols - p * MM_AVX_NR);
            for (int64_t p0 = 0; p0 < pl.K2; p0 += pl.kcp) {
                const int64_t kc = mm_min64(pl.kcp, pl.K2 - p0);
                /* The slice read next (this panel's next K block, the next panel's first,
                 * or the first of the next row block), for the prefetches below. */
                const char *next = NULL;
                int64_t lines = 0;
                if (wpanels) {
                    if (p0 + kc < pl.K2) {
                        next = (const char *)(panel + (size_t)(p0 + kc) * 2 * MM_AVX_NR);
                        lines = mm_min64(pl.kcp, pl.K2 - p0 - kc) * 4;
                    } else if (p + 1 < np) {
                        next = (const char *)(wpanels + (size_t)(p + 1) * pe);
                        lines = first_lines;
                    } else if (r0 + mb < rows) {
                        next = (const char *)wpanels;
                        lines = first_lines;
                    }
                }
                /* ... by the last MM_AVX_PF_TILES tiles but the first, MM_AVX_PF_DUP rounds
                 * of consecutive tiles over the whole slice. */
                const int64_t pf_first = tiles > MM_AVX_PF_TILES + 1 ? tiles - MM_AVX_PF_TILES
                                         : tiles > 1                  ? 1
                                                                      : 0;
                const int64_t pf_dup = mm_min64(MM_AVX_PF_DUP, tiles - pf_first);
                const int64_t pf_round = (tiles - pf_first + pf_dup - 1) / pf_dup;
                const int64_t per_tile = (lines + pf_round - 1) / pf_round;
                u.kp = kc;
                u.b = panel + (size_t)p0 * 2 * MM_AVX_NR;
                /* the first tile widens the slice while it computes, the others read it */
                const int widen = bwide && tiles >= MM_AVX_WIDE_TILES;
                u.cont = p0 > 0;
                u.last = p0 + kc >= pl.K2;
                for (int64_t t = 0; t < tiles; t++) {
                    const int mr = mm_avx_tile_rows(mb, tiles, t, even);
                    u.a = abuf + (size_t)(p0 * tiles + t * kc) * MM_AVX_MR * (fma ? 2 : 1);
                    u.acc = acc ? acc + (size_t)t * MM_AVX_MR * MM_AVX_NR : NULL;
                    const int64_t tr = r0 + mm_avx_tile_row(mb, tiles, t, even);
                    u.c = mm_gemm_c_at(C, a->ldc, a->c_type, tr, p * MM_AVX_NR);
                    u.pf = NULL;
                    u.npf = 0;
                    u.pf_l1 = 0;
                    u.bw = widen && t > 0 ? bwide : NULL;
                    u.bw_out = widen && t == 0 ? bwide : NULL;
                    if (t == 0) { /* the slice's first tile: its own slice, ahead of its loads */
                        const int64_t ahead = decode ? MM_AVX_PF_AHEAD_DECODE : MM_AVX_PF_AHEAD;
                        u.pf_l1 = decode;
                        u.pf = (const char *)u.b + ahead;
                        u.npf = mm_max64(kc * 4 - ahead / 64, 0);
                    } else if (next && t >= pf_first) { /* a share of the next slice */
                        const int64_t l0 = ((t - pf_first) % pf_round) * per_tile;
                        if (l0 < lines) {
                            u.pf = next + l0 * 64;
                            u.npf = mm_min64(per_tile, lines - l0);
                        }
                    }
                    mm_avx512_ukernel(mr, &u);
                }
            }
        }
    }
    return MEGAMOE_OK;
}

/* Every panel of w->src into w->data (allocated by the pack below, same K and N). */
static megamoe_status_t mm_avx512_weight_refresh(mm_gemm_weight_t *w)
{
    size_t pe = mm_panel_elems(w->K);
    int64_t np = (w->N + MM_AVX_NR - 1) / MM_AVX_NR;
    for (int64_t i = 0; i < np; i++)
        mm_avx512_pack_b_panel((uint16_t *)w->data + (size_t)i * pe, w->src, w->ld,
                               w->form == MM_GEMM_NT, w->K, i * MM_AVX_NR,
                               mm_min64(MM_AVX_NR, w->N - i * MM_AVX_NR));
    return MEGAMOE_OK;
}

static megamoe_status_t mm_avx512_weight_pack(mm_gemm_weight_t *w)
{
    size_t pe = mm_panel_elems(w->K);
    int64_t np = (w->N + MM_AVX_NR - 1) / MM_AVX_NR;
    size_t bytes = 0;
    void *p = NULL;
    MM_CHECK(mm_gemm_packed_alloc((size_t)np * pe * sizeof(uint16_t), "avx512 packed weight", &p,
                                  &bytes));
    w->data = p;
    w->bytes = bytes;
    w->packed = 1;
    w->n_align = MM_AVX_NR;
    return mm_avx512_weight_refresh(w);
}

static void mm_avx512_weight_release(mm_gemm_weight_t *w)
{
    mm_gemm_packed_free(w->data, w->bytes);
}

const mm_gemm_backend_ops_t mm_gemm_avx512_ops = {
    .name = MM_GEMM_NAME_AVX512,
    .probe = mm_avx512_probe,
    .gemm = mm_avx512_gemm,
    .weight_pack = mm_avx512_weight_pack,
    .weight_release = mm_avx512_weight_release,
    .gemm_grouped = NULL,
    .weight_refresh = mm_avx512_weight_refresh,
};
#endif /* MM_X86 */
