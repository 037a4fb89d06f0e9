/* The own AVX512-BF16 backend: a 6x64 register-blocked vdpbf16ps micro-kernel (24 fp32
 * accumulators) over B packed in 64-column VNNI panels, [ceil(K/2)][64][2] bf16 each, zero
 * padded. It reads A through row pointers, so a row list (gather) costs nothing extra.
 * Single-threaded per call (args->threads is ignored); no K blocking, so it is best where
 * the product is bound by reading the weights (small M), the case oneDNN handles worst.
 * Plain operands are packed into per-thread scratch per call (TN also transposes A). */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/cpu.h"
#include "base/error.h"
#include "gemm_impl.h"

#if MM_X86
#include <immintrin.h>

#define MM_AVX_NR 64 /* panel width: 4 zmm of fp32 */
#define MM_AVX_MR 6  /* rows per micro-tile */
#define MM_AVX_MC 240 /* TN: A columns transposed per chunk */

static megamoe_status_t mm_avx512_probe(void)
{
    if (!mm_cpu_has_avx512_bf16())
        return mm_error_quiet(MEGAMOE_UNSUPPORTED, "the avx512 GEMM backend needs AVX512-BF16");
    return MEGAMOE_OK;
}

static inline size_t mm_panel_elems(int64_t K) { return (size_t)((K + 1) / 2) * MM_AVX_NR * 2; }

/* Pack columns [n0, n1) of B (element (k, n) at src[k*sk + n*sn]) into panels at dst. */
static void mm_pack_panels(uint16_t *dst, const uint16_t *src, int64_t sk, int64_t sn, int64_t K,
                           int64_t n0, int64_t n1)
{
    size_t pe = mm_panel_elems(K);
    int64_t k2 = (K + 1) / 2;
    for (int64_t p = 0; n0 + p * MM_AVX_NR < n1; p++) {
        uint16_t *panel = dst + (size_t)p * pe;
        int64_t nb = n0 + p * MM_AVX_NR;
        int64_t w = n1 - nb < MM_AVX_NR ? n1 - nb : MM_AVX_NR;
        for (int64_t kp = 0; kp < k2; kp++) {
            uint16_t *row = panel + kp * MM_AVX_NR * 2;
            for (int64_t j = 0; j < MM_AVX_NR; j++) {
                int64_t k = 2 * kp;
                row[2 * j] = j < w ? src[k * sk + (nb + j) * sn] : 0;
                row[2 * j + 1] = j < w && k + 1 < K ? src[(k + 1) * sk + (nb + j) * sn] : 0;
            }
        }
    }
}

static inline uint32_t mm_pair(const uint16_t *row, int64_t k, int64_t K)
{
    uint32_t v;
    if (k + 1 < K) {
        memcpy(&v, row + k, 4);
    } else {
        v = row[k]; /* odd K: the partner is 0, never the (maybe NaN) element past the row */
    }
    return v;
}

/* out[r][0..64) = sum_k A[r][k] * panel(k, 0..64) for 6 row pointers. */
MM_TARGET_AVX512BF16 static void mm_tile_6x64(const uint16_t *const a[MM_AVX_MR], int64_t K,
                                             const uint16_t *panel, float *out)
{
    __m512 c[MM_AVX_MR][4];
    for (int r = 0; r < MM_AVX_MR; r++)
        for (int j = 0; j < 4; j++) c[r][j] = _mm512_setzero_ps();
    int64_t k2 = (K + 1) / 2;
    for (int64_t kp = 0; kp < k2; kp++) {
        const uint16_t *bp = panel + kp * MM_AVX_NR * 2;
        __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void *)bp);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512((const void *)(bp + 32));
        __m512bh b2 = (__m512bh)_mm512_loadu_si512((const void *)(bp + 64));
        __m512bh b3 = (__m512bh)_mm512_loadu_si512((const void *)(bp + 96));
#pragma GCC unroll 6
        for (int r = 0; r < MM_AVX_MR; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)mm_pair(a[r], 2 * kp, K));
            c[r][0] = _mm512_dpbf16_ps(c[r][0], av, b0);
            c[r][1] = _mm512_dpbf16_ps(c[r][1], av, b1);
            c[r][2] = _mm512_dpbf16_ps(c[r][2], av, b2);
            c[r][3] = _mm512_dpbf16_ps(c[r][3], av, b3);
        }
    }
    for (int r = 0; r < MM_AVX_MR; r++)
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(out + r * MM_AVX_NR + 16 * j, c[r][j]);
}

/* C rows [0, rows) (row r of A at rowp[r]) x columns [0, cols) from panels starting at the
 * block's first column. */
static void mm_avx512_block(const uint16_t *const *rowp, int64_t rows, int64_t K,
                            const uint16_t *panels, int64_t cols, void *C, int64_t ldc,
                            megamoe_dtype_t c_type, int accumulate)
{
    float tile[MM_AVX_MR * MM_AVX_NR];
    size_t pe = mm_panel_elems(K);
    for (int64_t p = 0; p * MM_AVX_NR < cols; p++) {
        int64_t w = cols - p * MM_AVX_NR < MM_AVX_NR ? cols - p * MM_AVX_NR : MM_AVX_NR;
        for (int64_t r0 = 0; r0 < rows; r0 += MM_AVX_MR) {
            int64_t mr = rows - r0 < MM_AVX_MR ? rows - r0 : MM_AVX_MR;
            const uint16_t *a[MM_AVX_MR];
            for (int r = 0; r < MM_AVX_MR; r++) a[r] = rowp[r0 + (r < mr ? r : 0)];
            mm_tile_6x64(a, K, panels + (size_t)p * pe, tile);
            mm_gemm_epilogue(tile, MM_AVX_NR, mr, w,
                             mm_gemm_c_at(C, ldc, c_type, r0, p * MM_AVX_NR), ldc, c_type,
                             accumulate);
        }
    }
}

static megamoe_status_t mm_avx512_gemm(const mm_gemm_args_t *a)
{
    int64_t rows = a->m1 - a->m0, cols = a->n1 - a->n0;
    const uint16_t *panels;
    if (a->weight) {
        panels = (const uint16_t *)a->weight->data + (size_t)(a->n0 / MM_AVX_NR) * mm_panel_elems(a->K);
    } else {
        size_t np = (size_t)((cols + MM_AVX_NR - 1) / MM_AVX_NR);
        uint16_t *buf = mm_gemm_scratch(1, np * mm_panel_elems(a->K) * sizeof(uint16_t));
        if (buf == NULL) return MEGAMOE_OUT_OF_MEMORY;
        if (a->form == MM_GEMM_NT) mm_pack_panels(buf, a->B, 1, a->ldb, a->K, a->n0, a->n1);
        else mm_pack_panels(buf, a->B, a->ldb, 1, a->K, a->n0, a->n1);
        panels = buf;
    }
    void *C = mm_gemm_c_at(a->C, a->ldc, a->c_type, a->m0, a->n0);
    if (a->form != MM_GEMM_TN) {
        /* Row pointers in chunks so the list stays on the stack. */
        const uint16_t *rowp[MM_AVX_MC];
        for (int64_t m = 0; m < rows; m += MM_AVX_MC) {
            int64_t n = rows - m < MM_AVX_MC ? rows - m : MM_AVX_MC;
            for (int64_t r = 0; r < n; r++) rowp[r] = mm_gemm_a_row(a, a->m0 + m + r);
            mm_avx512_block(rowp, n, a->K, panels, cols, mm_gemm_c_at(C, a->ldc, a->c_type, m, 0),
                            a->ldc, a->c_type, a->accumulate);
        }
        return MEGAMOE_OK;
    }
    /* TN: rows of C are columns of A; transpose a chunk of them into scratch. */
    uint16_t *at = mm_gemm_scratch(2, (size_t)(MM_AVX_MC * a->K) * sizeof(uint16_t));
    if (at == NULL) return MEGAMOE_OUT_OF_MEMORY;
    const uint16_t *rowp[MM_AVX_MC];
    for (int64_t m = 0; m < rows; m += MM_AVX_MC) {
        int64_t n = rows - m < MM_AVX_MC ? rows - m : MM_AVX_MC;
        for (int64_t k = 0; k < a->K; k++) {
            const uint16_t *src = mm_gemm_a_row(a, k) + a->m0 + m;
            for (int64_t r = 0; r < n; r++) at[r * a->K + k] = src[r];
        }
        for (int64_t r = 0; r < n; r++) rowp[r] = at + r * a->K;
        mm_avx512_block(rowp, n, a->K, panels, cols, mm_gemm_c_at(C, a->ldc, a->c_type, m, 0),
                        a->ldc, a->c_type, a->accumulate);
    }
    return MEGAMOE_OK;
}

static megamoe_status_t mm_avx512_weight_pack(mm_gemm_weight_t *w)
{
    size_t np = (size_t)((w->N + MM_AVX_NR - 1) / MM_AVX_NR);
    size_t bytes = np * mm_panel_elems(w->K) * sizeof(uint16_t);
    void *p = NULL;
    MM_CHECK(mm_aligned_alloc(bytes, MM_CACHE_LINE, "avx512 packed weight", &p));
    if (w->form == MM_GEMM_NT) mm_pack_panels(p, w->src, 1, w->ld, w->K, 0, w->N);
    else mm_pack_panels(p, w->src, w->ld, 1, w->K, 0, w->N);
    w->data = p;
    w->bytes = bytes;
    w->packed = 1;
    w->n_align = MM_AVX_NR;
    return MEGAMOE_OK;
}

static void mm_avx512_weight_release(mm_gemm_weight_t *w) { mm_aligned_free(w->data); }

const mm_gemm_backend_ops_t mm_gemm_avx512_ops = {
    .name = "avx512",
    .probe = mm_avx512_probe,
    .gemm = mm_avx512_gemm,
    .weight_pack = mm_avx512_weight_pack,
    .weight_release = mm_avx512_weight_release,
    .gemm_grouped = NULL,
};
#endif /* MM_X86 */
