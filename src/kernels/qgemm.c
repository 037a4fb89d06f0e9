/* Quantised GEMMs (qgemm.h): weight packing, argument checks and the driver. The arithmetic
 * is in the micro-kernels and epilogues (qgemm_c.c, the definition; qgemm_avx512.c, the same
 * bits); formats and the offset trick are in qgemm_impl.h.
 *
 * Loops of one expert's rows (single-threaded; workers split products by columns or rows):
 *
 *   for each row block (<= 36 rows, int8 A with more rows: <= 192)
 *                                                   pack A: micro-panels of <= 6 rows
 *                                                   (int8: the quads, and per-group row sums;
 *                                                    bf16: widened to fp32)
 *     for each 64-column panel of [n0, n1)
 *       for each K chunk of the panel                (one chunk when the block has one tile)
 *         for each tile of <= 6 rows
 *           for each K-group segment of the chunk   micro-kernel (+ group flush)
 *       epilogue of every tile                      scales, biases, token scale, store
 *
 * A chunk of B (16 KiB) is read from memory by the block's first tile and from L1 by the
 * others, so every weight byte streams in once per row block: at decode sizes (1-36 rows of an
 * expert: one block) each panel is read once for all the rows. The next chunks are prefetched
 * in a linear stream (the panels of a product are contiguous) ahead of the first tile.
 * Accumulators between chunks stay in per-tile buffers (int32, exact; fp32 sums of K groups
 * and of bf16 A, stored and reloaded exactly), so the blocking never changes a bit. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/cpu.h"
#include "base/error.h"
#include "gemm_impl.h"
#include "qgemm_impl.h"
#include "simd.h"

#define MM_QK_RB_DECODE 36    /* up to this many rows: one row block (6 tiles of 6) */
#define MM_QK_RB_INT8 192     /* int8 A: row blocks of up to 32 tiles (B read once per 192 rows) */
#define MM_QK_MAX_TILES 32
#define MM_QK_CHUNK 16384     /* bytes of B per K chunk */
/* Single-tile blocks (<= 6 rows, bandwidth-bound): how far ahead of the loads the kernel
 * prefetches, and into which level. AMD (Zen 4), M = 1 (K x N = 4096 x 2816, weights from
 * memory; GB/s of weights, int8 / int4): none 26 / 22.5, 128-256 B ahead into L1 29-30 /
 * 27-27.5, 512 B 27 / 24, 1 KiB 25.5 / 25, 4 KiB into L2 (the bf16 kernel's choice) 23.5 / 20,
 * 8 KiB into L2 21 / 22: close prefetches keep more lines in flight without competing with the
 * hardware prefetcher's stream. Intel (Xeon VM, family 6 model 207, no AMX; `bench gemm --quick
 * --no-probe --shape dec_gmm1`, 2026-12-07, alternated twice, GOP/s two threads int8 / int4):
 * M = 4: 256 B into L1 (stop 43's first runs) 1.0 / 1.0x, 1 KiB into L1 207-214 / 346-353,
 * 2 KiB 222-229 / 388-401, 4 KiB 220-227 / 388-400, 4 KiB into L2 237-238 / 431, 8-16 KiB into
 * L2 the same; M = 1 equal within 3 %: Intel's L2 streamer wants the far, L2 prefetch. */
static int64_t mm_qk_pf_ahead(void) { return mm_cpu_is_intel() ? 4096 : 256; }
static int mm_qk_pf_into_l2(void) { return mm_cpu_is_intel(); }

/* ---- weights ----------------------------------------------------------------------------- */

static megamoe_status_t mm_qw_check_src(const char *fn, const mm_qweight_src_t *s)
{
    if (s == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: NULL source", fn);
    if (s->type != MM_QW_INT8 && s->type != MM_QW_INT4)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: type %d (MM_QW_INT8 or MM_QW_INT4)", fn,
                        (int)s->type);
    if (s->layout != MM_QW_KN && s->layout != MM_QW_NK)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: layout %d (MM_QW_KN or MM_QW_NK)", fn,
                        (int)s->layout);
    if (s->K < 1 || s->N < 1 || s->K > MM_QGEMM_MAX_K)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: K=%lld N=%lld (need 1 <= K <= %lld so that int8 sums stay exact in "
                        "int32, N >= 1)",
                        fn, (long long)s->K, (long long)s->N, (long long)MM_QGEMM_MAX_K);
    if (s->group_size < 0 || s->group_size % 8 != 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: group_size %lld (0 = per output channel, else a multiple of 8)", fn,
                        (long long)s->group_size);
    if (s->data == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: NULL data", fn);
    int64_t row = s->layout == MM_QW_KN ? s->N : s->K;
    if (s->type == MM_QW_INT4) row = (row + 1) / 2;
    if (s->ld < row)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: ld %lld bytes < a row's %lld bytes", fn,
                        (long long)s->ld, (long long)row);
    return MEGAMOE_OK;
}

static void mm_qw_pack_all(mm_qweight_t *w, const mm_qweight_src_t *src)
{
    for (int64_t p = 0; p < w->panels; p++)
        mm_qk_pack_panel_c(w, src, p, w->data + (size_t)p * w->panel_bytes);
    w->src_data = src->data;
}

megamoe_status_t mm_qweight_create(const mm_qweight_src_t *src, uint64_t version,
                                   mm_qweight_t **weight_p)
{
    if (weight_p == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_qweight_create: NULL weight_p");
    *weight_p = NULL;
    MM_CHECK(mm_qw_check_src("mm_qweight_create", src));
    mm_qweight_t *w = calloc(1, sizeof *w);
    if (w == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "mm_qweight_create: out of memory");
    w->type = src->type;
    w->K = src->K;
    w->N = src->N;
    w->group_size = src->group_size;
    w->groups = src->group_size ? (src->K + src->group_size - 1) / src->group_size : 1;
    w->kq = src->type == MM_QW_INT8 ? (src->K + 3) / 4 : 2 * ((src->K + 7) / 8);
    w->panels = (src->N + MM_QK_NR - 1) / MM_QK_NR;
    w->panel_bytes = (size_t)w->kq * (src->type == MM_QW_INT8 ? 256 : 128);
    void *p = NULL;
    /* Huge pages from 2 MiB (the bf16 weights' rule is 4 MiB): decode streams the weights at
     * the memory's pace only on 2 MiB pages here; 1408 x 4096 int4 (2.9 MB) streamed at 12.7
     * GB/s on 4 KiB pages, 23 GB/s (of its 2.9 MB) on two huge pages. The rounding costs up to
     * 2 MiB per weight (45 % of that 2.75 MiB one). */
    megamoe_status_t st = mm_gemm_packed_alloc_from((size_t)w->panels * w->panel_bytes,
                                                    MM_GEMM_HUGE_FROM_QUANT, "quantised packed weight",
                                                    &p, &w->bytes);
    if (st != MEGAMOE_OK) {
        free(w);
        return st;
    }
    w->data = p;
    w->version = version;
    mm_qw_pack_all(w, src);
    *weight_p = w;
    return MEGAMOE_OK;
}

megamoe_status_t mm_qweight_update(mm_qweight_t *w, const mm_qweight_src_t *src, uint64_t version,
                                   int *repacked_p)
{
    if (repacked_p) *repacked_p = 0;
    if (w == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_qweight_update: NULL weight");
    MM_CHECK(mm_qw_check_src("mm_qweight_update", src));
    if (src->type != w->type || src->K != w->K || src->N != w->N || src->group_size != w->group_size)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "mm_qweight_update: the source (type %d, K=%lld, N=%lld, group_size %lld) "
                        "differs from the packed weight's (%d, %lld, %lld, %lld); create a new one",
                        (int)src->type, (long long)src->K, (long long)src->N,
                        (long long)src->group_size, (int)w->type, (long long)w->K,
                        (long long)w->N, (long long)w->group_size);
    if (version == w->version && src->data == w->src_data) return MEGAMOE_OK;
    mm_qw_pack_all(w, src);
    w->version = version;
    if (repacked_p) *repacked_p = 1;
    return MEGAMOE_OK;
}

void mm_qweight_destroy(mm_qweight_t *w)
{
    if (w == NULL) return;
    mm_gemm_packed_free_from(w->data, w->bytes, MM_GEMM_HUGE_FROM_QUANT);
    free(w);
}

int64_t mm_qweight_K(const mm_qweight_t *w) { return w ? w->K : 0; }
int64_t mm_qweight_N(const mm_qweight_t *w) { return w ? w->N : 0; }
mm_qw_type_t mm_qweight_type(const mm_qweight_t *w) { return w ? w->type : MM_QW_INT8; }
int64_t mm_qweight_group_size(const mm_qweight_t *w) { return w ? w->group_size : 0; }
int64_t mm_qweight_groups(const mm_qweight_t *w) { return w ? w->groups : 0; }
uint64_t mm_qweight_version(const mm_qweight_t *w) { return w ? w->version : 0; }
size_t mm_qweight_packed_bytes(const mm_qweight_t *w) { return w ? w->bytes : 0; }

/* ---- kernels ----------------------------------------------------------------------------- */

const mm_qk_kernels_t *mm_qk_kernels_for(megamoe_dtype_t a_type)
{
#if MM_X86
    if (mm_kernels_use_avx512() && (a_type != MEGAMOE_DTYPE_INT8 || mm_cpu_has_avx512_vnni()))
        return &mm_qk_kernels_avx512;
#endif
    (void)a_type;
    return &mm_qk_kernels_c;
}

const char *mm_qgemm_impl_name(megamoe_dtype_t a_type)
{
    if (mm_qk_kernels_for(a_type) == &mm_qk_kernels_c) return "c";
    return a_type == MEGAMOE_DTYPE_INT8 ? "avx512_vnni" : "avx512_fma";
}

/* ---- products ---------------------------------------------------------------------------- */

void mm_qgemm_args_init(mm_qgemm_args_t *a)
{
    memset(a, 0, sizeof *a);
    a->a_type = MEGAMOE_DTYPE_INT8;
    a->c_type = MEGAMOE_DTYPE_FP32;
    a->m1 = MM_QGEMM_END;
    a->n1 = MM_QGEMM_END;
}

static const float mm_qk_zeros[MM_QK_NR];

static megamoe_status_t mm_qgemm_check(const mm_qgemm_args_t *a, int64_t *R_p)
{
    const char *fn = "mm_qgemm";
    if (a == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: NULL args", fn);
    if (a->num_groups < 0 || (a->num_groups > 0 && (a->group_rows == NULL || a->experts == NULL)))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: num_groups %d needs group_rows and experts",
                        fn, a->num_groups);
    if (a->K < 1 || a->N < 1)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: K=%lld N=%lld must be >= 1", fn,
                        (long long)a->K, (long long)a->N);
    if (a->a_type != MEGAMOE_DTYPE_INT8 && a->a_type != MEGAMOE_DTYPE_BF16 &&
        a->a_type != MEGAMOE_DTYPE_FP16 && a->a_type != MEGAMOE_DTYPE_FP32)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: a_type %s (int8; or bf16, fp16, fp32 for weight-only products)", fn,
                        megamoe_dtype_name(a->a_type));
    if (a->c_type != MEGAMOE_DTYPE_INT32 && a->c_type != MEGAMOE_DTYPE_FP32 &&
        a->c_type != MEGAMOE_DTYPE_BF16)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: c_type %s (int32, fp32 or bf16)", fn,
                        megamoe_dtype_name(a->c_type));
    const int i32out = a->c_type == MEGAMOE_DTYPE_INT32, i8 = a->a_type == MEGAMOE_DTYPE_INT8;
    if (i32out && !i8)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: int32 output needs int8 activations", fn);
    if (i32out && a->x_scale)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: x_scale with int32 output (the caller applies its scales itself)", fn);
    int64_t R = 0;
    for (int g = 0; g < a->num_groups; g++) {
        if (a->group_rows[g] < 0)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: group_rows[%d] = %lld < 0", fn, g,
                            (long long)a->group_rows[g]);
        R += a->group_rows[g];
    }
    int64_t m0 = a->m0, m1 = a->m1 == MM_QGEMM_END ? R : a->m1;
    int64_t n0 = a->n0, n1 = a->n1 == MM_QGEMM_END ? a->N : a->n1;
    if (m0 < 0 || m0 > m1 || m1 > R || n0 < 0 || n0 > n1 || n1 > a->N)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: sub-block rows [%lld,%lld) cols [%lld,%lld) outside %lld x %lld", fn,
                        (long long)m0, (long long)m1, (long long)n0, (long long)n1, (long long)R,
                        (long long)a->N);
    if (n0 % MM_QGEMM_N_ALIGN != 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: n0 = %lld is not a multiple of %d (split columns with mm_gemm_split "
                        "and n_align %d)",
                        fn, (long long)n0, MM_QGEMM_N_ALIGN, MM_QGEMM_N_ALIGN);
    *R_p = R;
    if (m0 == m1 || n0 == n1) return MEGAMOE_OK;
    if (a->A == NULL || a->lda < a->K)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: A is NULL or lda %lld < K %lld", fn,
                        (long long)a->lda, (long long)a->K);
    if (a->C == NULL || a->ldc < a->N)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: C is NULL or ldc %lld < N %lld", fn,
                        (long long)a->ldc, (long long)a->N);
    if (a->a_index) {
        for (int64_t r = m0; r < m1; r++)
            if (a->a_index[r] < 0 || a->a_index[r] >= a->a_num_rows)
                return mm_error(MEGAMOE_INVALID_ARGUMENT,
                                "%s: a_index[%lld] = %d outside the %lld rows of A (a_num_rows)",
                                fn, (long long)r, (int)a->a_index[r], (long long)a->a_num_rows);
    }
    int64_t start = 0;
    for (int g = 0; g < a->num_groups; start += a->group_rows[g], g++) {
        if (start + a->group_rows[g] <= m0 || start >= m1) continue;
        const mm_qgemm_expert_t *e = &a->experts[g];
        const mm_qweight_t *w = e->weight;
        if (w == NULL)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: experts[%d].weight is NULL", fn, g);
        if (w->K != a->K || w->N != a->N)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: experts[%d].weight is %lld x %lld, the product's K x N %lld x %lld",
                            fn, g, (long long)w->K, (long long)w->N, (long long)a->K,
                            (long long)a->N);
        if (w->groups > 1 && (e->w_scale || e->w_offset) && e->ld_scale < a->N)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: experts[%d].ld_scale %lld < N %lld with %lld K groups", fn, g,
                            (long long)e->ld_scale, (long long)a->N, (long long)w->groups);
        if (i32out && (w->groups > 1 || e->w_scale || e->bias_pre || e->bias_post))
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: experts[%d]: int32 output takes only bias_i32 (no scales, float "
                            "biases or K groups: the caller dequantises)",
                            fn, g);
        if (e->bias_i32 && (!i8 || w->groups > 1))
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: experts[%d].bias_i32 needs int8 activations and one K group", fn, g);
        if (e->w_offset && i8)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: experts[%d].w_offset (antiquant offset) is for bf16 activations "
                            "only",
                            fn, g);
    }
    return MEGAMOE_OK;
}

/* Per-call state of one expert's rows. */
typedef struct mm_qk_run {
    const mm_qgemm_args_t *a;
    const mm_qk_kernels_t *k;
    const mm_qgemm_expert_t *e;
    const mm_qweight_t *w;
    int i8;
    int64_t n0, n1;
    int64_t kq_loop;   /* quads the micro-kernels run over */
    int64_t gq;        /* quads per K group (kq_loop when one group) */
    int kv_last;       /* bf16 A: valid k in the last quad */
} mm_qk_run_t;

/* Source row of stacked row r. */
static inline int64_t mm_qk_src_row(const mm_qgemm_args_t *a, int64_t r)
{
    return a->a_index ? a->a_index[r] : r;
}

/* Pack the rows [r0, r0 + rows) of a tile into its micro-panel; int8 A also gets off * the
 * row sums per K group into corr[6][G]. */
static void mm_qk_pack_tile(const mm_qk_run_t *u, int64_t r0, int rows, void *panel, int32_t *corr)
{
    const mm_qgemm_args_t *a = u->a;
    const int64_t K = a->K;
    if (u->i8) {
        const int64_t kq = u->w->kq;
        int8_t *d = panel;
        memset(d, 0, (size_t)kq * MM_QK_MR * 4);
        const uint32_t off = u->w->type == MM_QW_INT8 ? 128u : 8u;
        const int64_t gs = u->w->group_size ? u->w->group_size : K;
        const int64_t kfull = K / 4;
        for (int r = 0; r < rows; r++) {
            const int8_t *x = (const int8_t *)a->A + mm_qk_src_row(a, r0 + r) * a->lda;
            int8_t *dr = d + r * 4;
            for (int64_t q = 0; q < kfull; q++) memcpy(dr + q * MM_QK_MR * 4, x + 4 * q, 4);
            for (int64_t k = 4 * kfull; k < K; k++) dr[kfull * MM_QK_MR * 4 + (k & 3)] = x[k];
            for (int64_t g = 0; g < u->w->groups; g++) {
                const int64_t k1 = (g + 1) * gs < K ? (g + 1) * gs : K;
                corr[r * u->w->groups + g] = (int32_t)((uint32_t)u->k->rowsum(x + g * gs, k1 - g * gs) * off);
            }
        }
        return;
    }
    float *d = panel;
    const int64_t kp = u->kq_loop * 4;
    memset(d, 0, (size_t)kp * MM_QK_MR * sizeof(float));
    const size_t es = megamoe_dtype_size(a->a_type);
    for (int r = 0; r < rows; r++) { /* widened exactly to fp32 */
        const void *x = (const char *)a->A + (size_t)(mm_qk_src_row(a, r0 + r) * a->lda) * es;
        if (a->a_type == MEGAMOE_DTYPE_BF16)
            for (int64_t k = 0; k < K; k++) d[k * MM_QK_MR + r] = mm_bf16_f32(((const uint16_t *)x)[k]);
        else if (a->a_type == MEGAMOE_DTYPE_FP16)
            for (int64_t k = 0; k < K; k++)
                d[k * MM_QK_MR + r] = megamoe_fp16_to_fp32(((const uint16_t *)x)[k]);
        else
            for (int64_t k = 0; k < K; k++) d[k * MM_QK_MR + r] = ((const float *)x)[k];
    }
}

static void mm_qk_block(const mm_qk_run_t *u, int64_t rb0, int64_t rows, void *apanels,
                        size_t apanel_elems, int32_t *corr, int32_t *ti, float *tf)
{
    const mm_qgemm_args_t *a = u->a;
    const mm_qgemm_expert_t *e = u->e;
    const mm_qweight_t *w = u->w;
    const int ntiles = (int)((rows + MM_QK_MR - 1) / MM_QK_MR);
    int trows[MM_QK_MAX_TILES], tstart[MM_QK_MAX_TILES];
    for (int t = 0, s = 0; t < ntiles; t++) { /* rows spread evenly: no 1-row tail tile */
        trows[t] = (int)(rows / ntiles + (t < rows % ntiles));
        tstart[t] = s;
        s += trows[t];
    }
    const size_t es = u->i8 ? 4 : sizeof(float) * 4; /* A bytes per quad and row */
    for (int t = 0; t < ntiles; t++)
        mm_qk_pack_tile(u, rb0 + tstart[t], trows[t], (char *)apanels + t * apanel_elems * 4,
                        corr + (size_t)t * MM_QK_MR * w->groups);

    const int64_t qbytes = w->type == MM_QW_INT8 ? 256 : 128; /* B bytes per quad */
    /* Decode-size blocks (<= 36 rows): chunks of B in L1 shared by the block's few tiles. Big
     * blocks: each tile runs all of K with its sums in registers, the panel (<= 256 KiB at
     * K = 4096) staying in L2 for the block's tiles (measured 0.88 vs 0.83 of the VNNI peak
     * with 16 KiB chunks at M = 256). */
    const int64_t chunk = ntiles == 1 || rows > MM_QK_RB_DECODE ? u->kq_loop : MM_QK_CHUNK / qbytes;
    const int64_t p0 = u->n0 / MM_QK_NR, p1 = (u->n1 + MM_QK_NR - 1) / MM_QK_NR;
    const char *stream_end = (const char *)w->data + (size_t)p1 * w->panel_bytes;
    void (*ukr)(int, const mm_qk_ukr_args_t *) =
        u->i8 ? (w->type == MM_QW_INT8 ? u->k->ukr_i8 : u->k->ukr_i4)
              : (w->type == MM_QW_INT8 ? u->k->ukr_w8 : u->k->ukr_w4);

    const char *pf_done = NULL; /* the multi-tile prefetch stream is issued up to here */
    for (int64_t p = p0; p < p1; p++) {
        const int64_t nc = p * MM_QK_NR; /* first column of the panel */
        const int64_t nr = u->n1 - nc < MM_QK_NR ? u->n1 - nc : MM_QK_NR;
        for (int64_t c0 = 0; c0 < u->kq_loop; c0 += chunk) {
            const int64_t c1 = c0 + chunk < u->kq_loop ? c0 + chunk : u->kq_loop;
            /* Several tiles: their calls on this chunk prefetch (into L2) the stream up to one
             * full chunk past its end, continuing where the last chunk's stopped: after a
             * panel's short last chunk the next panel's first chunk is still covered whole
             * (prefetching one chunk's length past each chunk left 8 KiB of every 1408-deep
             * panel to the demand misses of the first tile). */
            const char *pf_from = NULL, *pf_to = NULL;
            if (ntiles > 1) {
                const char *end = (const char *)mm_qw_quad(w, p, c0) + (c1 - c0) * qbytes;
                pf_from = pf_done > end ? pf_done : end;
                pf_to = end + chunk * qbytes < stream_end ? end + chunk * qbytes : stream_end;
                if (pf_to > pf_done) pf_done = pf_to;
            }
            for (int t = 0; t < ntiles; t++) {
                for (int64_t s0 = c0; s0 < c1;) {
                    const int64_t g = s0 / u->gq, gend = (g + 1) * u->gq;
                    const int64_t s1 = gend < c1 ? gend : c1;
                    mm_qk_ukr_args_t k;
                    k.nq = s1 - s0;
                    k.kv = (!u->i8 && s1 == u->kq_loop) ? u->kv_last : 4;
                    k.b = mm_qw_quad(w, p, s0);
                    k.a = (const char *)apanels + t * apanel_elems * 4 + (size_t)s0 * MM_QK_MR * es;
                    /* the tile's sums of this K group: int32, or fp32 (bf16 A) */
                    k.acc = ti + t * MM_QK_MR * MM_QK_NR;
                    k.cont = s0 > g * u->gq;
                    k.wo = mm_qk_zeros;
                    k.no_offset = e->w_offset == NULL;
                    float wo_pad[MM_QK_NR];
                    if (!u->i8 && e->w_offset) {
                        k.wo = e->w_offset + (w->groups > 1 ? g * e->ld_scale : 0) + nc;
                        if (nr < MM_QK_NR) { /* the kernel reads 64: pad past the last column */
                            memcpy(wo_pad, k.wo, (size_t)nr * sizeof(float));
                            for (int64_t c = nr; c < MM_QK_NR; c++) wo_pad[c] = 0.0f;
                            k.wo = wo_pad;
                        }
                    }
                    /* One tile: prefetch into L1 as far ahead as it reads. Several: the
                     * tiles of a chunk share the next chunk's lines, into L2 (L1 holds the
                     * current chunk, which every tile re-reads). */
                    k.pf = NULL;
                    k.npf = 0;
                    k.pf_l2 = ntiles > 1 || mm_qk_pf_into_l2();
                    if (ntiles == 1) {
                        const char *at = (const char *)k.b + mm_qk_pf_ahead();
                        int64_t bytes = (s1 - s0) * qbytes;
                        if (at + bytes > stream_end) bytes = stream_end - at;
                        if (bytes > 0) k.pf = at, k.npf = bytes / 64;
                    } else if (s0 == c0 && pf_to > pf_from) {
                        const int64_t per = ((pf_to - pf_from) / 64 + ntiles - 1) / ntiles;
                        const char *at = pf_from + t * per * 64;
                        int64_t n = per;
                        if (at + n * 64 > pf_to) n = (pf_to - at) / 64;
                        if (n > 0) k.pf = at, k.npf = n;
                    }
                    ukr(trows[t], &k);
                    if (w->groups > 1 && (s1 == gend || s1 == u->kq_loop)) {
                        mm_qk_epi_args_t f;
                        memset(&f, 0, sizeof f);
                        f.mr = trows[t];
                        f.nr = nr;
                        f.fp_acc = !u->i8;
                        f.i32 = ti + t * MM_QK_MR * MM_QK_NR;
                        f.f32 = tf + t * MM_QK_MR * MM_QK_NR;
                        int32_t cg[MM_QK_MR] = {0};
                        for (int r = 0; u->i8 && r < trows[t]; r++)
                            cg[r] = corr[((size_t)t * MM_QK_MR + r) * w->groups + g];
                        f.corr = cg;
                        f.ws = e->w_scale ? e->w_scale + g * e->ld_scale + nc : NULL;
                        f.first = g == 0;
                        u->k->flush(&f);
                    }
                    s0 = s1;
                }
            }
        }
        for (int t = 0; t < ntiles; t++) {
            mm_qk_epi_args_t f;
            memset(&f, 0, sizeof f);
            f.mr = trows[t];
            f.nr = nr;
            f.i32 = ti + t * MM_QK_MR * MM_QK_NR;
            f.f32 = tf + t * MM_QK_MR * MM_QK_NR;
            f.fp_acc = !u->i8;
            f.groups_mode = w->groups > 1;
            int32_t cg[MM_QK_MR];
            float xs[MM_QK_MR];
            for (int r = 0; r < trows[t]; r++) {
                cg[r] = u->i8 ? corr[((size_t)t * MM_QK_MR + r) * w->groups] : 0;
                if (a->x_scale) xs[r] = a->x_scale[mm_qk_src_row(a, rb0 + tstart[t] + r)];
            }
            f.corr = cg;
            f.ws = f.groups_mode == 0 && e->w_scale ? e->w_scale + nc : NULL;
            f.bias_i32 = e->bias_i32 ? e->bias_i32 + nc : NULL;
            f.bias_pre = e->bias_pre ? e->bias_pre + nc : NULL;
            f.bias_post = e->bias_post ? e->bias_post + nc : NULL;
            f.xs = a->x_scale ? xs : NULL;
            f.c_type = a->c_type;
            f.ldc = a->ldc;
            f.c = (char *)a->C + ((size_t)(rb0 + tstart[t]) * a->ldc + nc) * megamoe_dtype_size(a->c_type);
            u->k->epilogue(&f);
        }
    }
}

megamoe_status_t mm_qgemm(const mm_qgemm_args_t *a)
{
    int64_t R = 0;
    MM_CHECK(mm_qgemm_check(a, &R));
    const int64_t m0 = a->m0, m1 = a->m1 == MM_QGEMM_END ? R : a->m1;
    const int64_t n0 = a->n0, n1 = a->n1 == MM_QGEMM_END ? a->N : a->n1;
    if (m0 == m1 || n0 == n1) return MEGAMOE_OK;

    mm_qk_run_t u;
    memset(&u, 0, sizeof u);
    u.a = a;
    u.k = mm_qk_kernels_for(a->a_type);
    u.i8 = a->a_type == MEGAMOE_DTYPE_INT8;
    u.n0 = n0;
    u.n1 = n1;
    int64_t start = 0;
    for (int g = 0; g < a->num_groups; start += a->group_rows[g], g++) {
        const int64_t r0 = start > m0 ? start : m0;
        const int64_t r1 = start + a->group_rows[g] < m1 ? start + a->group_rows[g] : m1;
        if (r0 >= r1) continue;
        u.e = &a->experts[g];
        u.w = u.e->weight;
        const mm_qweight_t *w = u.w;
        u.kq_loop = u.i8 ? w->kq : (a->K + 3) / 4;
        u.gq = w->groups > 1 ? w->group_size / 4 : u.kq_loop;
        u.kv_last = (int)(a->K - 4 * (u.kq_loop - 1));
        /* Scratch: A micro-panels of the block's tiles, row-sum corrections, tile buffers. */
        const size_t apanel_elems = (size_t)(u.i8 ? w->kq : u.kq_loop * 4) * MM_QK_MR;
        const int64_t rows = r1 - r0;
        const int64_t rb = rows <= MM_QK_RB_DECODE || !u.i8 ? MM_QK_RB_DECODE : MM_QK_RB_INT8;
        const int64_t nb = (rows + rb - 1) / rb;
        const int64_t maxt = (rows / nb + 1 + MM_QK_MR - 1) / MM_QK_MR;
        void *apanels = mm_gemm_scratch(0, apanel_elems * 4 * (size_t)maxt);
        int32_t *corr = mm_gemm_scratch(1, (size_t)maxt * MM_QK_MR * w->groups * sizeof(int32_t));
        int32_t *ti = mm_gemm_scratch(2, (size_t)maxt * MM_QK_MR * MM_QK_NR * sizeof(int32_t));
        float *tf = mm_gemm_scratch(3, (size_t)maxt * MM_QK_MR * MM_QK_NR * sizeof(float));
        if (!apanels || !corr || !ti || !tf) return MEGAMOE_OUT_OF_MEMORY;
        for (int64_t b = 0, rb0 = r0; b < nb; b++) { /* blocks of equal size */
            const int64_t br = rows / nb + (b < rows % nb);
            mm_qk_block(&u, rb0, br, apanels, apanel_elems, corr, ti, tf);
            rb0 += br;
        }
    }
    return MEGAMOE_OK;
}
