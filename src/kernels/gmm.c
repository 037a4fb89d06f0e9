/* megamoe_grouped_matmul (include/megamoe/companion.h): torch_npu's npu_grouped_matmul with
 * groups along M, on megamoe's GEMM backends.
 *
 * The float variant with bf16 operands runs each group as one (or, with threads, several)
 * mm_gemm calls of the backend MEGAMOE_GEMM picks: a weight view whose N stride is 1 is the NN
 * form with ldb = its K stride, one whose K stride is 1 (w.transpose(1, 2) of a dense
 * [E, N, K] tensor, vLLM's w13ᵀ) is the NT form with ldb = its N stride — no copy either way;
 * other strides are packed per tile. fp16 / fp32 operands (no caller uses them with MoE
 * weights, but torch_npu accepts them) take a plain AVX-512 fp32 kernel. Quantised inputs are
 * gmm_quant.c. Bias is added to the fp32 accumulator and the sum rounded once. */
#include <stdlib.h>

#include "base/arch.h"
#include "base/cpu.h"
#include "base/abi.h"
#include "companion_util.h"
#include "gemm.h"
#include "gemm_impl.h"
#include "gmm_internal.h"
#include "simd.h"

static megamoe_grouped_matmul_args_t mm_grouped_matmul_defaults(void)
{
    megamoe_grouped_matmul_args_t a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.threads = 1;
    return a;
}

megamoe_status_t megamoe_grouped_matmul_args_init(megamoe_grouped_matmul_args_t *p, size_t struct_size)
{
    megamoe_grouped_matmul_args_t d = mm_grouped_matmul_defaults();
    return mm_abi_init(p, struct_size, &d, sizeof d, "megamoe_grouped_matmul_args_t");
}

/* ---- plan: shapes, strides and groups, checked once ------------------------------------- */

static const char *const mm_gmm_fn = "megamoe_grouped_matmul";

megamoe_status_t mm_gmm_geometry(const char *fn, const megamoe_grouped_matmul_args_t *a,
                                  mm_gmm_plan_t *p)
{
    if (a->weight.ndim != 2 && a->weight.ndim != 3)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: weight must be [E, K, N] or [K, N], got %d dims", fn, a->weight.ndim);
    if (!mm_cx_present(&a->weight) && a->weight_list == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: weight has no data and no weight_list", fn);
    int three = a->weight.ndim == 3;
    p->E = three ? a->weight.shape[0] : 1;
    p->K = a->weight.shape[three];
    int64_t n_stored = a->weight.shape[three + 1];
    p->N = a->weight_int4 ? n_stored * 8 : n_stored;
    if (p->E < 1 || p->K < 0 || n_stored < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: weight shape has a bad size", fn);
    /* strides of the [E, K, N] view (a 2-D weight is one group: its E stride is unused) */
    const int64_t *s = a->weight_stride;
    if (s[0] == 0 && s[1] == 0 && s[2] == 0) {
        p->s_n = 1;
        p->s_k = n_stored;
        p->s_e = p->K * n_stored;
    } else {
        p->s_e = three ? s[0] : 0;
        p->s_k = three ? s[1] : s[0];
        p->s_n = three ? s[2] : s[1];
        if (!three && s[2] != 0)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: a 2-D weight takes weight_stride {K stride, N stride, 0}", fn);
        if (p->s_k < 0 || p->s_n < 0 || p->s_e < 0)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: negative weight stride", fn);
    }
    return MEGAMOE_OK;
}

static megamoe_status_t mm_gmm_plan(const megamoe_grouped_matmul_args_t *a, mm_gmm_plan_t *p)
{
    const char *fn = mm_gmm_fn;
    memset(p, 0, sizeof *p);
    p->a = a;
    if (!mm_cx_present(&a->x) || a->x.ndim != 2)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: x must be a 2-D [M, K] tensor", fn);
    if (!mm_cx_present(&a->y) || a->y.ndim != 2)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: y must be a 2-D [M, N] output", fn);
    MM_CHECK(mm_gmm_geometry(fn, a, p));
    p->M = a->x.shape[0];
    if (a->x.shape[1] != p->K)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: x is [%lld, %lld] but weight's K is %lld", fn, (long long)p->M,
                        (long long)a->x.shape[1], (long long)p->K);
    if (a->y.shape[0] != p->M || a->y.shape[1] != p->N)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: y is [%lld, %lld], expected [%lld, %lld]",
                        fn, (long long)a->y.shape[0], (long long)a->y.shape[1], (long long)p->M,
                        (long long)p->N);
    p->counts = calloc((size_t)p->E + 1, sizeof *p->counts);
    p->starts = calloc((size_t)p->E + 1, sizeof *p->starts);
    if (!p->counts || !p->starts) return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: group table", fn);
    if (mm_cx_present(&a->group_list)) {
        MM_CHECK(mm_cx_group_counts(fn, &a->group_list, a->group_list_type, p->E, p->M,
                                    p->counts, &p->total));
    } else {
        if (p->E != 1)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: %lld weights need a group_list (which rows go to which weight)",
                            fn, (long long)p->E);
        p->counts[0] = p->total = p->M;
    }
    for (int64_t g = 0; g < p->E; g++) p->starts[g + 1] = p->starts[g] + p->counts[g];
    /* per-group [E, N] parameters: [N] is accepted for one group; an int4 weight's scale may
     * also be per K group, [E, G, N] (A8W4 per-group dequantisation; gmm_quant.c checks G) */
    const megamoe_tensor_t *per_n[] = {&a->bias, &a->scale};
    const char *per_n_name[] = {"bias", "scale"};
    for (int i = 0; i < 2; i++) {
        const megamoe_tensor_t *t = per_n[i];
        if (!mm_cx_present(t)) continue;
        const int k_groups = i == 1 && a->weight_int4;
        int ok = (t->ndim == 2 && t->shape[0] == p->E && t->shape[1] == p->N) ||
                 (t->ndim == 3 && t->shape[0] == p->E && (t->shape[1] == 1 || k_groups) &&
                  t->shape[2] == p->N) ||
                 (t->ndim == 1 && p->E == 1 && t->shape[0] == p->N);
        if (!ok) {
            char got[96];
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: %s has shape %s, expected [%lld, %lld]%s",
                            fn, per_n_name[i], mm_cx_shape_str(t, got, sizeof got),
                            (long long)p->E, (long long)p->N,
                            k_groups ? " (or [E, G, N] per K group)" : "");
        }
    }
    if (mm_cx_present(&a->bias) && !mm_cx_is_float(a->bias.dtype) &&
        a->bias.dtype != MEGAMOE_DTYPE_INT32)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: bias dtype %s; use fp32, bf16, fp16 or int32",
                        fn, megamoe_dtype_name(a->bias.dtype));
    if (mm_cx_present(&a->per_token_scale)) {
        const megamoe_tensor_t *t = &a->per_token_scale;
        int ok = (t->ndim == 1 && t->shape[0] == p->M) ||
                 (t->ndim == 2 && t->shape[0] == p->M && t->shape[1] == 1);
        if (!ok || t->dtype != MEGAMOE_DTYPE_FP32)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: per_token_scale must be fp32 [M=%lld]", fn, (long long)p->M);
    }
    p->threads = mm_cx_threads(a->threads);
    return MEGAMOE_OK;
}

static void mm_gmm_plan_free(mm_gmm_plan_t *p)
{
    free(p->counts);
    free(p->starts);
}

const void *mm_gmm_weight(const mm_gmm_plan_t *p, int64_t g)
{
    const megamoe_grouped_matmul_args_t *a = p->a;
    size_t es = a->weight_int4 ? 4 : megamoe_dtype_size(a->weight.dtype);
    if (a->weight_list) return a->weight_list[g];
    return (const char *)a->weight.data + (size_t)(g * p->s_e) * es;
}

/* ---- tiles: (group, rows, columns) pieces the threads share ------------------------------ */

int64_t mm_gmm_tiles(const mm_gmm_plan_t *p, int64_t n_align, mm_gmm_tile_t **tiles_p)
{
    int workers = p->threads;
    int64_t cap = 0;
    for (int64_t g = 0; g < p->E; g++) cap += p->counts[g] ? (int64_t)workers * 4 : 0;
    mm_gmm_tile_t *t = malloc(((size_t)cap + 1) * sizeof *t);
    if (!t) return -1;
    int64_t n = 0;
    for (int64_t g = 0; g < p->E; g++) {
        int64_t rows = p->counts[g];
        if (rows == 0) continue;
        if (workers == 1) {
            t[n++] = (mm_gmm_tile_t){g, 0, rows, 0, p->N};
            continue;
        }
        /* rows when every worker gets a dense block of them, else column stripes */
        if (rows >= 64 * (int64_t)workers) {
            for (int w = 0; w < workers; w++) {
                int64_t lo = rows * w / workers / 16 * 16, hi = rows * (w + 1) / workers / 16 * 16;
                if (w == workers - 1) hi = rows;
                if (hi > lo) t[n++] = (mm_gmm_tile_t){g, lo, hi, 0, p->N};
            }
        } else {
            int64_t units = (p->N + n_align - 1) / n_align;
            int parts = workers * 2 < units ? workers * 2 : (int)units;
            if (parts < 1) parts = 1;
            for (int w = 0; w < parts; w++) {
                int64_t lo = units * w / parts * n_align, hi = units * (w + 1) / parts * n_align;
                if (hi > p->N) hi = p->N;
                if (hi > lo) t[n++] = (mm_gmm_tile_t){g, 0, rows, lo, hi};
            }
        }
    }
    *tiles_p = t;
    return n;
}

megamoe_status_t mm_gmm_run_tiles(const mm_gmm_plan_t *p, const mm_gmm_tile_t *tiles, int64_t n,
                                  mm_gmm_tile_fn_t fn, void *ctx)
{
    megamoe_status_t st = MEGAMOE_OK;
#ifdef _OPENMP
    if (p->threads > 1 && n > 1) {
        int prev = omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(p->threads)
        for (int64_t i = 0; i < n; i++) {
            megamoe_status_t s;
#pragma omp atomic read
            s = st;
            if (s != MEGAMOE_OK) continue;
            s = fn(p, &tiles[i], ctx);
            if (s != MEGAMOE_OK) {
#pragma omp atomic write
                st = s; /* any failure will do: every tile's is a real one */
            }
        }
        omp_set_num_threads(prev);
        return st;
    }
#endif
    for (int64_t i = 0; i < n && st == MEGAMOE_OK; i++) st = fn(p, &tiles[i], ctx);
    return st;
}

/* y rows [total, M) = 0 (the device leaves them undefined; docs/ops.md) */
void mm_gmm_zero_tail(const mm_gmm_plan_t *p)
{
    const megamoe_tensor_t *y = &p->a->y;
    size_t es = megamoe_dtype_size(y->dtype);
    if (p->total < p->M)
        memset((char *)y->data + (size_t)(p->total * p->N) * es, 0,
               (size_t)((p->M - p->total) * p->N) * es);
}

/* y[r, n0:n1] = round(acc[r] + bias[g, n]) for one row of a tile (bias may be absent). */
void mm_gmm_epilogue_row(const mm_gmm_plan_t *p, int64_t g, const float *acc, int64_t row,
                         int64_t n0, int64_t n1)
{
    const megamoe_grouped_matmul_args_t *a = p->a;
    const megamoe_tensor_t *b = &a->bias;
    int has_bias = mm_cx_present(b);
    int64_t boff = g * p->N;
    for (int64_t n = n0; n < n1; n++) {
        float v = acc[n - n0];
        if (has_bias) v += mm_cx_load(b->data, b->dtype, boff + n);
        mm_cx_store(a->y.data, a->y.dtype, row * p->N + n, v);
    }
}

/* ---- bf16 operands: the GEMM backends ----------------------------------------------------- */

typedef struct mm_gmm_bf16_ctx {
    const mm_gemm_backend_ops_t *backend;
    const mm_gemm_weight_t *const *packed; /* megamoe packed weights per group, or NULL */
} mm_gmm_bf16_ctx_t;

static mm_gemm_form_t mm_gmm_form_of(const mm_gemm_weight_t *w) { return w->form; }

static megamoe_status_t mm_gmm_tile_bf16(const mm_gmm_plan_t *p, const mm_gmm_tile_t *t, void *vctx)
{
    const mm_gmm_bf16_ctx_t *ctx = vctx;
    const megamoe_grouped_matmul_args_t *a = p->a;
    int64_t rows = t->m1 - t->m0, cols = t->n1 - t->n0, start = p->starts[t->g];
    mm_gemm_args_t ga;
    mm_gemm_args_init(&ga);
    ga.K = p->K;
    ga.backend = ctx->backend;
    ga.M = rows;
    ga.A = (const uint16_t *)a->x.data + (size_t)((start + t->m0) * p->K);
    ga.lda = p->K;
    const uint16_t *w = mm_gmm_weight(p, t->g);
    uint16_t *copy = NULL;
    /* full: the product spans all N columns and the tile is its sub-block (packed weights
     * serve only their full width); else a product of the tile's own columns */
    int full = ctx->packed && ctx->packed[t->g];
    if (full) {
        ga.form = mm_gmm_form_of(ctx->packed[t->g]);
        ga.weight = ctx->packed[t->g];
        ga.backend = NULL;
        ga.N = p->N;
        ga.n0 = t->n0;
        ga.n1 = t->n1;
    } else {
        ga.N = cols;
        if (p->s_n == 1 && p->s_k >= p->N) {
            ga.form = MM_GEMM_NN;
            ga.B = w + t->n0;
            ga.ldb = p->s_k;
        } else if (p->s_k == 1 && p->s_n >= p->K) {
            ga.form = MM_GEMM_NT;
            ga.B = w + t->n0 * p->s_n;
            ga.ldb = p->s_n;
        } else { /* any other view: a dense copy of the tile's columns */
            copy = malloc((size_t)(p->K * cols) * sizeof *copy);
            if (!copy) return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: weight tile copy", mm_gmm_fn);
            for (int64_t k = 0; k < p->K; k++)
                for (int64_t n = 0; n < cols; n++)
                    copy[k * cols + n] = w[k * p->s_k + (t->n0 + n) * p->s_n];
            ga.form = MM_GEMM_NN;
            ga.B = copy;
            ga.ldb = cols;
        }
    }
    megamoe_status_t st;
    int direct = !mm_cx_present(&a->bias) &&
                 (a->y.dtype == MEGAMOE_DTYPE_BF16 || a->y.dtype == MEGAMOE_DTYPE_FP32);
    if (direct) {
        size_t es = megamoe_dtype_size(a->y.dtype);
        ga.c_type = a->y.dtype;
        ga.ldc = p->N;
        ga.C = (char *)a->y.data + (size_t)((start + t->m0) * p->N + (full ? 0 : t->n0)) * es;
        st = mm_gemm(&ga);
    } else {
        int64_t width = full ? p->N : cols;
        float *acc = malloc((size_t)(rows * width) * sizeof *acc);
        if (!acc) {
            free(copy);
            return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: accumulator tile", mm_gmm_fn);
        }
        ga.c_type = MEGAMOE_DTYPE_FP32;
        ga.C = acc;
        ga.ldc = width;
        st = mm_gemm(&ga);
        if (st == MEGAMOE_OK)
            for (int64_t r = 0; r < rows; r++)
                mm_gmm_epilogue_row(p, t->g, acc + r * width + (full ? t->n0 : 0),
                                    start + t->m0 + r, t->n0, t->n1);
        free(acc);
    }
    free(copy);
    return st;
}

/* ---- fp16 / fp32 operands: a plain fp32 kernel -------------------------------------------- */

enum { MM_GMM_KC = 256, MM_GMM_NC = 64, MM_GMM_MR = 4 };

#if MM_X86
/* c[r][0:nc] += sum_k a[r][k] * b[k][0:nc], rows <= 4, nc <= 64 (b packed [kc][64]) */
MM_TARGET_AVX512 static void mm_gmm_f32_ukernel(const float *a, int rows, const float *b, int kc,
                                                float *c, int64_t ldc, int nc)
{
    __m512 acc[MM_GMM_MR][4];
    __mmask16 m[4];
    for (int j = 0; j < 4; j++) {
        int left = nc - 16 * j;
        m[j] = left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
    }
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = _mm512_maskz_loadu_ps(m[j], c + r * ldc + 16 * j);
    for (int k = 0; k < kc; k++) {
        __m512 b0 = _mm512_loadu_ps(b + k * MM_GMM_NC), b1 = _mm512_loadu_ps(b + k * MM_GMM_NC + 16);
        __m512 b2 = _mm512_loadu_ps(b + k * MM_GMM_NC + 32);
        __m512 b3 = _mm512_loadu_ps(b + k * MM_GMM_NC + 48);
        for (int r = 0; r < rows; r++) {
            __m512 av = _mm512_set1_ps(a[r * kc + k]);
            acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(av, b2, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(av, b3, acc[r][3]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < 4; j++) _mm512_mask_storeu_ps(c + r * ldc + 16 * j, m[j], acc[r][j]);
}
#endif

static void mm_gmm_f32_ukernel_c(const float *a, int rows, const float *b, int kc, float *c,
                                 int64_t ldc, int nc)
{
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < kc; k++) {
            float av = a[r * kc + k];
            for (int n = 0; n < nc; n++) c[r * ldc + n] += av * b[k * MM_GMM_NC + n];
        }
}

static megamoe_status_t mm_gmm_tile_f32(const mm_gmm_plan_t *p, const mm_gmm_tile_t *t, void *vctx)
{
    (void)vctx;
    const megamoe_grouped_matmul_args_t *a = p->a;
    int64_t rows = t->m1 - t->m0, cols = t->n1 - t->n0, start = p->starts[t->g];
    const void *w = mm_gmm_weight(p, t->g);
    float *acc = calloc((size_t)(rows * cols), sizeof *acc);
    float *bp = malloc((size_t)MM_GMM_KC * MM_GMM_NC * sizeof *bp);
    float *ap = malloc((size_t)MM_GMM_MR * MM_GMM_KC * sizeof *ap);
    if (!acc || !bp || !ap) {
        free(acc), free(bp), free(ap);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: fp32 tile scratch", mm_gmm_fn);
    }
    int vec = 0;
#if MM_X86
    vec = mm_kernels_use_avx512();
#endif
    for (int64_t k0 = 0; k0 < p->K; k0 += MM_GMM_KC) {
        int kc = (int)(p->K - k0 < MM_GMM_KC ? p->K - k0 : MM_GMM_KC);
        for (int64_t n0 = 0; n0 < cols; n0 += MM_GMM_NC) {
            int nc = (int)(cols - n0 < MM_GMM_NC ? cols - n0 : MM_GMM_NC);
            for (int k = 0; k < kc; k++)
                for (int n = 0; n < MM_GMM_NC; n++)
                    bp[k * MM_GMM_NC + n] =
                        n < nc ? mm_cx_load(w, a->weight.dtype,
                                            (k0 + k) * p->s_k + (t->n0 + n0 + n) * p->s_n)
                               : 0.0f;
            for (int64_t r0 = 0; r0 < rows; r0 += MM_GMM_MR) {
                int mr = (int)(rows - r0 < MM_GMM_MR ? rows - r0 : MM_GMM_MR);
                for (int r = 0; r < mr; r++)
                    for (int k = 0; k < kc; k++)
                        ap[r * kc + k] = mm_cx_load(a->x.data, a->x.dtype,
                                                    (start + t->m0 + r0 + r) * p->K + k0 + k);
                float *c = acc + r0 * cols + n0;
#if MM_X86
                if (vec) {
                    mm_gmm_f32_ukernel(ap, mr, bp, kc, c, cols, nc);
                    continue;
                }
#endif
                mm_gmm_f32_ukernel_c(ap, mr, bp, kc, c, cols, nc);
            }
        }
    }
    (void)vec;
    for (int64_t r = 0; r < rows; r++)
        mm_gmm_epilogue_row(p, t->g, acc + r * cols, start + t->m0 + r, t->n0, t->n1);
    free(acc), free(bp), free(ap);
    return MEGAMOE_OK;
}

/* ---- entry -------------------------------------------------------------------------------- */

megamoe_status_t mm_gmm_float(const mm_gmm_plan_t *p, const mm_gemm_weight_t *const *packed)
{
    const megamoe_grouped_matmul_args_t *a = p->a;
    if (a->weight.dtype != a->x.dtype)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: x is %s but weight is %s; float products need equal types (int8 "
                        "weights with float x take antiquant_scale: W8A16)",
                        mm_gmm_fn, megamoe_dtype_name(a->x.dtype),
                        megamoe_dtype_name(a->weight.dtype));
    if (!mm_cx_is_float(a->y.dtype))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: y dtype %s; float x gives bf16, fp16 or fp32",
                        mm_gmm_fn, megamoe_dtype_name(a->y.dtype));
    if (mm_cx_present(&a->scale) || mm_cx_present(&a->per_token_scale))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: scale / per_token_scale apply to int8 x (W8A8); float x takes none",
                        mm_gmm_fn);
    if (mm_cx_present(&a->bias) && !mm_cx_is_float(a->bias.dtype))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: bias of float x must be fp32, bf16 or fp16",
                        mm_gmm_fn);
    mm_gmm_tile_t *tiles = NULL;
    megamoe_status_t st;
    if (a->x.dtype == MEGAMOE_DTYPE_BF16) {
        mm_gmm_bf16_ctx_t ctx = {NULL, packed};
        MM_CHECK(mm_gemm_backend_default(&ctx.backend));
        int64_t align = 64;
        for (int64_t g = 0; packed && g < p->E; g++)
            if (packed[g] && mm_gemm_weight_n_align(packed[g]) > align)
                align = mm_gemm_weight_n_align(packed[g]);
        int64_t n = mm_gmm_tiles(p, align, &tiles);
        if (n < 0) return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: tiles", mm_gmm_fn);
        st = mm_gmm_run_tiles(p, tiles, n, mm_gmm_tile_bf16, &ctx);
    } else {
        int64_t n = mm_gmm_tiles(p, MM_GMM_NC, &tiles);
        if (n < 0) return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: tiles", mm_gmm_fn);
        st = mm_gmm_run_tiles(p, tiles, n, mm_gmm_tile_f32, NULL);
    }
    free(tiles);
    if (st == MEGAMOE_OK) mm_gmm_zero_tail(p);
    return st;
}

megamoe_status_t megamoe_grouped_matmul(const megamoe_grouped_matmul_args_t *in)
{
    megamoe_grouped_matmul_args_t a;
    MM_CX_ARGS("megamoe_grouped_matmul_args_t", in, a, mm_grouped_matmul_defaults());
    mm_gmm_plan_t p;
    megamoe_status_t st = mm_gmm_plan(&a, &p);
    if (st == MEGAMOE_OK && a.packed) st = mm_gmm_weights_check(a.packed, &p);
    if (st == MEGAMOE_OK) {
        if (mm_cx_is_float(a.x.dtype) && !a.weight_int4 && a.weight.dtype != MEGAMOE_DTYPE_INT8)
            st = mm_gmm_float(&p, a.packed ? mm_gmm_weights_bf16(a.packed) : NULL);
        else
            st = mm_gmm_quant(&p);
    }
    mm_gmm_plan_free(&p);
    return st;
}
