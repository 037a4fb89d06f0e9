/* The own AMX-BF16 backend: the BLIS-style driver. The micro-kernel (gemm_amx_ukernel.c)
 * runs one row of 32 x 32 micro-tiles over one K block; the packers (gemm_amx_pack.c) produce
 * the tile layouts; this file owns the loops, the blocking, the prefetch schedule, the edges,
 * the packed weights and the backend vtable. Formats and the determinism argument are in
 * gemm_amx.h.
 *
 * Loops of one call (rows [m0,m1) x columns [n0,n1) of C; single-threaded, args->threads is
 * ignored — workers split products with mm_gemm_split):
 *
 *   for each row block of <= mc_panels * 32 rows       pack A (all of K) into scratch
 *     for each column block of <= nc_panels B panels    (the C partial sums of the block: L2)
 *       for each K block of <= kc_steps k-steps         (plain B: pack this block)
 *         for each A micro-panel of the row block       micro-kernel: a row of micro-tiles
 *
 * Why: tdpbf16ps needs 1 KiB of tiles per 16 cycles. Fed from L1 it runs at ~83% of peak, from
 * L2 at ~60%, from L3/memory at 13-30% (machine_limits.md §2, re-measured here). The A
 * micro-panel of a K block (kc_steps * 2 KiB = 24 KiB) is re-read from L1 by every micro-tile
 * of its row; the B block (kc_steps * 2 KiB per panel, 384 KiB) and the C partial sums of the
 * column block (rows x 512 x 4 B) stay in L2; B comes from memory once per row block, A from
 * L3 once per column block. K blocks keep the A micro-panel in L1; fewer, longer ones would
 * save C partial-sum traffic (each K block stores and reloads the C tiles) but thrash L1.
 * The next B block is prefetched into L2 while the current one is computed (a share per
 * micro-tile and k-step), and the next A micro-panel while one row runs. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/cpu.h"
#include "base/error.h"
#include "gemm_amx.h"
#include "gemm_impl.h"

#if MM_X86
#include <immintrin.h>
#endif

/* Defaults: K blocks of 12 k-steps (384: 24 KiB A micro-panel), 16 B panels (512 columns)
 * per column block, 8 micro-panels (256 rows) per row block. See docs/kernels.md. */
static const mm_amx_blocking_t mm_amx_default_blocking = {12, 16, 8};
static mm_amx_blocking_t mm_amx_blk = {12, 16, 8};

void mm_amx_set_blocking(const mm_amx_blocking_t *b)
{
    mm_amx_blk = b ? *b : mm_amx_default_blocking;
    if (mm_amx_blk.kc_steps < 1) mm_amx_blk.kc_steps = 1;
    if (mm_amx_blk.nc_panels < 1) mm_amx_blk.nc_panels = 1;
    if (mm_amx_blk.mc_panels < 1) mm_amx_blk.mc_panels = 1;
}

void mm_amx_get_blocking(mm_amx_blocking_t *b) { *b = mm_amx_blk; }

/* Test hook (simulates a machine without AMX) and the count of tile sessions, which tests
 * use to show that no tile instruction ran. */
static atomic_int mm_amx_disabled;
static atomic_ullong mm_amx_sessions;

void mm_amx_test_disable(int disabled) { atomic_store(&mm_amx_disabled, disabled != 0); }
unsigned long long mm_amx_tile_sessions(void) { return atomic_load(&mm_amx_sessions); }

#if MM_X86
#define MM_AMX_STREAM_BYTES ((size_t)8 << 20)

static megamoe_status_t mm_amx_probe(void)
{
    if (atomic_load(&mm_amx_disabled))
        return mm_error_quiet(MEGAMOE_UNSUPPORTED, "AMX disabled by a test hook");
    if (!mm_cpu_has_amx_bf16())
        return mm_error_quiet(MEGAMOE_UNSUPPORTED, "this CPU has no AMX-BF16 (cpuid)");
    if (!mm_cpu_has_avx512())
        return mm_error_quiet(MEGAMOE_UNSUPPORTED,
                              "the amx backend also needs AVX-512 (packing, epilogue)");
    if (!mm_cpu_request_amx())
        return mm_error_quiet(MEGAMOE_UNSUPPORTED,
                              "the kernel refused AMX tile-data permission (arch_prctl)");
    return MEGAMOE_OK;
}

static inline int64_t mm_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t mm_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Pack the A micro-panels of rows [r0, r0 + mb) of the call (all of K) into dst. */
static void mm_amx_pack_a(const mm_gemm_args_t *a, int64_t r0, int64_t mb, char *dst)
{
    const int64_t KS = mm_amx_ksteps(a->K), ip = mm_cdiv(mb, MM_AMX_MR);
    const size_t pstride = (size_t)KS * MM_AMX_STEP_BYTES;
    if (a->form == MM_GEMM_TN) {
        for (int64_t i = 0; i < ip; i++)
            mm_amx_pack_a_cols(dst + (size_t)i * pstride, a->A, a->lda, a->a_rows,
                               a->m0 + r0 + i * MM_AMX_MR,
                               (int)mm_min64(MM_AMX_MR, mb - i * MM_AMX_MR), a->K);
        return;
    }
    const uint16_t *rowp[MM_AMX_MR], *nextp[MM_AMX_MR];
    int mr = (int)mm_min64(MM_AMX_MR, mb);
    for (int r = 0; r < mr; r++) rowp[r] = mm_gemm_a_row(a, a->m0 + r0 + r);
    for (int64_t i = 0; i < ip; i++) {
        const int64_t m = a->m0 + r0 + i * MM_AMX_MR;
        const int nmr = i + 1 < ip ? (int)mm_min64(MM_AMX_MR, mb - (i + 1) * MM_AMX_MR) : 0;
        for (int r = 0; r < nmr; r++) nextp[r] = mm_gemm_a_row(a, m + MM_AMX_MR + r);
        mm_amx_pack_a_rows(dst + (size_t)i * pstride, rowp, mr, a->K, nextp, nmr);
        for (int r = 0; r < nmr; r++) rowp[r] = nextp[r];
        mr = nmr;
    }
}

static megamoe_status_t mm_amx_gemm(const mm_gemm_args_t *a)
{
    /* never a tile instruction without cpuid's AMX-BF16 and the kernel's permission */
    if (mm_amx_probe() != MEGAMOE_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", megamoe_last_error());
        return mm_error(MEGAMOE_UNSUPPORTED, "amx GEMM: %s; use MEGAMOE_GEMM=" MM_GEMM_NAME_ONEDNN
                                             " or " MM_GEMM_NAME_AUTO, why);
    }
    const mm_amx_blocking_t bl = mm_amx_blk;
    const int64_t rows = a->m1 - a->m0, cols = a->n1 - a->n0;
    const int64_t KS = mm_amx_ksteps(a->K);
    const int64_t nkb = mm_cdiv(KS, bl.kc_steps), kcs = mm_cdiv(KS, nkb); /* equal K blocks */
    const int64_t ip_all = mm_cdiv(rows, MM_AMX_MR);
    /* one K block: no partial sums in L2, so row blocks twice as tall (TN dW 4096x256x2816:
     * +20%) */
    const int64_t mcp = nkb > 1 ? bl.mc_panels : 2 * bl.mc_panels;
    const int64_t nrb = mm_cdiv(ip_all, mcp), ipb = mm_cdiv(ip_all, nrb);
    const int64_t np = mm_cdiv(cols, MM_AMX_NR);
    const int64_t ncp = mm_min64(bl.nc_panels, np);
    const size_t pstride = (size_t)KS * MM_AMX_STEP_BYTES; /* one panel / micro-panel, all K */
    const int nt = a->form == MM_GEMM_NT;

    /* B: a packed weight's panels from column n0 (a multiple of 32, checked by the
     * framework); plain B read by one row block: each (column block, K block) packed right
     * before use (hot in L2); plain B read by several row blocks: all of it packed up front. */
    const char *wpan = NULL;
    char *bblk = NULL;
    if (a->weight) {
        wpan = (const char *)a->weight->data + (size_t)(a->n0 / MM_AMX_NR) * pstride;
    } else if (nrb > 1) {
        char *all = mm_gemm_scratch(1, (size_t)np * pstride);
        if (all == NULL) return MEGAMOE_OUT_OF_MEMORY;
        for (int64_t p = 0; p < np; p++)
            mm_amx_pack_b(all + (size_t)p * pstride, a->B, a->ldb, nt, a->K, 0, KS,
                          a->n0 + p * MM_AMX_NR, mm_min64(MM_AMX_NR, cols - p * MM_AMX_NR));
        wpan = all;
    } else {
        bblk = mm_gemm_scratch(1, (size_t)(ncp * kcs) * MM_AMX_STEP_BYTES);
        if (bblk == NULL) return MEGAMOE_OUT_OF_MEMORY;
    }
    char *abuf = mm_gemm_scratch(2, (size_t)ipb * pstride);
    float *acc = NULL;
    if (nkb > 1) {
        acc = mm_gemm_scratch(3, (size_t)(ipb * ncp) * MM_AMX_ACC_FLOATS * sizeof(float));
        if (acc == NULL) return MEGAMOE_OUT_OF_MEMORY;
    }
    float *ebuf = mm_gemm_scratch(0, 2 * MM_AMX_ACC_FLOATS * sizeof(float));
    if (abuf == NULL || ebuf == NULL) return MEGAMOE_OUT_OF_MEMORY;

    mm_amx_ukr_args_t u;
    memset(&u, 0, sizeof u);
    u.ldc = a->ldc;
    u.c_bf16 = a->c_type == MEGAMOE_DTYPE_BF16;
    u.accumulate = a->accumulate;
    u.ebuf = ebuf;
    const size_t es = megamoe_dtype_size(a->c_type);
    /* A C block far bigger than L2 (weight gradients: 23-46 MB) is written with
     * non-temporal stores: no read-for-ownership, and it does not evict the operands. Smaller
     * outputs (the forward's, read next by SwiGLU or the combine) stay cached. */
    u.stream = !a->accumulate && (size_t)(rows * cols) * es >= MM_AMX_STREAM_BYTES;

    atomic_fetch_add_explicit(&mm_amx_sessions, 1, memory_order_relaxed);
    mm_amx_tiles_begin();
    for (int64_t r0 = 0; r0 < rows; r0 += ipb * MM_AMX_MR) {
        const int64_t mb = mm_min64(ipb * MM_AMX_MR, rows - r0), ip = mm_cdiv(mb, MM_AMX_MR);
        mm_amx_pack_a(a, r0, mb, abuf);
        for (int64_t p0 = 0; p0 < np; p0 += ncp) {
            const int64_t jn = mm_min64(ncp, np - p0);
            for (int64_t s0 = 0; s0 < KS; s0 += kcs) {
                const int64_t ks = mm_min64(kcs, KS - s0);
                const char *b;
                int64_t bs;
                /* The block read next (this column block's next K block, the next column
                 * block's first, or the first of the next row block), prefetched into L2 by
                 * the micro-tiles of this one: micro-panel i takes share i of every slice. */
                const char *next = NULL;
                int64_t next_ks = 0, next_jn = 0;
                if (wpan) {
                    b = wpan + (size_t)p0 * pstride + (size_t)s0 * MM_AMX_STEP_BYTES;
                    bs = (int64_t)pstride;
                    if (s0 + ks < KS) {
                        next = b + (size_t)ks * MM_AMX_STEP_BYTES;
                        next_ks = mm_min64(kcs, KS - s0 - ks), next_jn = jn;
                    } else if (p0 + jn < np) {
                        next = wpan + (size_t)(p0 + jn) * pstride;
                        next_ks = mm_min64(kcs, KS), next_jn = mm_min64(ncp, np - p0 - jn);
                    } else if (r0 + mb < rows) {
                        next = wpan;
                        next_ks = mm_min64(kcs, KS), next_jn = mm_min64(ncp, np);
                    }
                } else {
                    for (int64_t j = 0; j < jn; j++)
                        mm_amx_pack_b(bblk + (size_t)(j * kcs) * MM_AMX_STEP_BYTES, a->B, a->ldb,
                                      nt, a->K, s0, ks, a->n0 + (p0 + j) * MM_AMX_NR,
                                      mm_min64(MM_AMX_NR, cols - (p0 + j) * MM_AMX_NR));
                    b = bblk;
                    bs = kcs * MM_AMX_STEP_BYTES;
                }
                const int64_t lines = next_ks * (MM_AMX_STEP_BYTES / 64);
                u.b = b;
                u.b_stride = bs;
                u.ks = ks;
                u.nj = jn;
                u.cont = s0 > 0;
                u.last = s0 + ks >= KS;
                u.cols = mm_min64(jn * MM_AMX_NR, cols - p0 * MM_AMX_NR);
                u.pf_stride = (int64_t)pstride;
                u.pf_nj = next_jn;
                for (int64_t i = 0; i < ip; i++) {
                    const int64_t ri = mm_min64(MM_AMX_MR, mb - i * MM_AMX_MR);
                    u.a = abuf + (size_t)i * pstride + (size_t)s0 * MM_AMX_STEP_BYTES;
                    u.a_tiles = ri > 16 ? 2 : 1;
                    u.rows = ri;
                    u.acc = acc ? acc + (size_t)(i * ncp) * MM_AMX_ACC_FLOATS : NULL;
                    u.c = (char *)a->C + ((size_t)(a->m0 + r0 + i * MM_AMX_MR) * (size_t)a->ldc +
                                          (size_t)(a->n0 + p0 * MM_AMX_NR)) * es;
                    const int64_t l0 = lines * i / ip, l1 = lines * (i + 1) / ip;
                    u.pf = next ? next + l0 * 64 : NULL;
                    u.npf = l1 - l0;
                    /* the next micro-panel of this K block, or the first of the next */
                    u.apf = NULL;
                    u.napf = 0;
                    if (i + 1 < ip) {
                        u.apf = u.a + pstride;
                        u.napf = ks * (MM_AMX_STEP_BYTES / 64);
                    } else if (s0 + ks < KS) {
                        u.apf = abuf + (size_t)(s0 + ks) * MM_AMX_STEP_BYTES;
                        u.napf = mm_min64(kcs, KS - s0 - ks) * (MM_AMX_STEP_BYTES / 64);
                    } else if (p0 + jn < np) { /* the next column block starts over */
                        u.apf = abuf;
                        u.napf = mm_min64(kcs, KS) * (MM_AMX_STEP_BYTES / 64);
                    }
                    mm_amx_ukernel(&u);
                }
            }
        }
    }
    mm_amx_tiles_end();
    if (u.stream) _mm_sfence(); /* the non-temporal stores are visible before we return */
    return MEGAMOE_OK;
}

/* Every panel of w->src into w->data (allocated by the pack below; same K and N). */
static megamoe_status_t mm_amx_weight_refresh(mm_gemm_weight_t *w)
{
    const int64_t KS = mm_amx_ksteps(w->K), np = mm_cdiv(w->N, MM_AMX_NR);
    const size_t pstride = (size_t)KS * MM_AMX_STEP_BYTES;
    for (int64_t i = 0; i < np; i++)
        mm_amx_pack_b((char *)w->data + (size_t)i * pstride, w->src, w->ld,
                      w->form == MM_GEMM_NT, w->K, 0, KS, i * MM_AMX_NR,
                      mm_min64(MM_AMX_NR, w->N - i * MM_AMX_NR));
    return MEGAMOE_OK;
}

static megamoe_status_t mm_amx_weight_pack(mm_gemm_weight_t *w)
{
    if (mm_amx_probe() != MEGAMOE_OK) { /* the packers need AVX-512; keep one rule for all */
        char why[256];
        snprintf(why, sizeof why, "%s", megamoe_last_error());
        return mm_error(MEGAMOE_UNSUPPORTED, "amx packed weight: %s; use MEGAMOE_GEMM="
                                             MM_GEMM_NAME_ONEDNN " or " MM_GEMM_NAME_AUTO, why);
    }
    const int64_t KS = mm_amx_ksteps(w->K), np = mm_cdiv(w->N, MM_AMX_NR);
    const size_t pstride = (size_t)KS * MM_AMX_STEP_BYTES;
    size_t bytes = 0;
    void *p = NULL;
    MM_CHECK(mm_gemm_packed_alloc((size_t)np * pstride, "amx packed weight", &p, &bytes));
    w->data = p;
    w->bytes = bytes;
    w->packed = 1;
    w->n_align = MM_AMX_NR;
    return mm_amx_weight_refresh(w);
}

static void mm_amx_weight_release(mm_gemm_weight_t *w) { mm_gemm_packed_free(w->data, w->bytes); }

const mm_gemm_backend_ops_t mm_gemm_amx_ops = {
    .name = MM_GEMM_NAME_AMX,
    .probe = mm_amx_probe,
    .gemm = mm_amx_gemm,
    .weight_pack = mm_amx_weight_pack,
    .weight_release = mm_amx_weight_release,
    .gemm_grouped = NULL,
    .weight_refresh = mm_amx_weight_refresh,
};
#endif /* MM_X86 */
