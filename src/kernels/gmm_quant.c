/* Quantised variants of megamoe_grouped_matmul on the quantised GEMM kernels (qgemm.h):
 *   W8A8, int32 out:   x int8, weight int8, y int32: the exact sums (+ an int32 bias).
 *   W8A8, dequantised: x int8, weight int8, scale [E, N] (fp32 / bf16 / int64-coded fp32),
 *                      per_token_scale [M] fp32, y bf16 / fp16 / fp32:
 *                      ((acc + int32 bias) * scale) * per_token (+ float bias after).
 *   W8A16 / W4A16:     x bf16, weight int8 or int4, antiquant_scale / antiquant_offset [E, N]
 *                      or per K-group [E, G, N]: x @ ((W + offset) * scale) (+ bias).
 *   A8W4:              x int8, weight int4 (int32 carrier), scale [E, N] or [E, G, N],
 *                      per_token_scale, bias [E, N] fp32: the device's
 *                      ((x - 8) @ (W * scale) + bias) * per_token, i.e. bias_pre = bias -
 *                      8 * colsum(W * scale) added before the token scale.
 * Weights come packed (megamoe_gmm_weights) or are packed for the call. */
#include <stdlib.h>

#include "companion_util.h"
#include "gmm_internal.h"
#include "megamoe/layout.h"
#include "qgemm.h"

static const char *const mm_gq_fn = "megamoe_grouped_matmul";

/* K-group size of a per-group scale tensor [E, G, N] (0: per channel). */
static megamoe_status_t mm_gq_group_size(const megamoe_tensor_t *s, int64_t K, int64_t *gs)
{
    *gs = 0;
    if (!mm_cx_present(s) || s->ndim != 3 || s->shape[1] <= 1) return MEGAMOE_OK;
    int64_t G = s->shape[1];
    int64_t size = (K + G - 1) / G;
    if (size % 8 != 0 || (K + size - 1) / size != G)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: %lld K-groups of a K = %lld weight: the group size %lld must be a "
                        "multiple of 8", mm_gq_fn, (long long)G, (long long)K, (long long)size);
    *gs = size;
    return MEGAMOE_OK;
}

/* The tensor whose [E, G, N] shape fixes the weights' K groups. */
static const megamoe_tensor_t *mm_gq_group_tensor(const megamoe_grouped_matmul_args_t *a)
{
    return mm_cx_present(&a->antiquant_scale) ? &a->antiquant_scale : &a->scale;
}

typedef struct mm_gq_pack {
    mm_qweight_t *w;
    int64_t group_size;
    /* int4 weights: the exact column sums of each K group, [G][N] (G = 1 for per-channel
     * scales), for A8W4's bias_pre = bias - 8 sum_g s[g] colsum_g(W): made with the pack, so a
     * call costs G x N instead of a K x N pass over the weights per expert (which, column by
     * column, took longer than the products themselves). */
    int32_t *colsum;
    int64_t groups;
    size_t colsum_bytes;
} mm_gq_pack_t;

/* colsum [G][N] of an int4 KN weight (two values per byte, low nibble first; rows ld bytes). */
static void mm_gq_int4_colsums(const uint8_t *w, int64_t ld, int64_t K, int64_t N, int64_t gs,
                               int32_t *colsum)
{
    const int64_t g_len = gs > 0 ? gs : (K > 0 ? K : 1);
    const int64_t G = (K + g_len - 1) / g_len;
    memset(colsum, 0, (size_t)(G * N) * sizeof *colsum);
    for (int64_t k = 0; k < K; k++) {
        const uint8_t *row = w + k * ld;
        int32_t *cs = colsum + (k / g_len) * N;
        for (int64_t n = 0; n < N; n++) {
            const int v = (n & 1) ? row[n / 2] >> 4 : row[n / 2] & 15;
            cs[n] += v >= 8 ? v - 16 : v;
        }
    }
}

megamoe_status_t mm_gmm_quant_pack(void **packs, int64_t e, const megamoe_grouped_matmul_args_t *a,
                                   const mm_gmm_plan_t *g, const void *src, uint64_t version,
                                   int *repacked)
{
    int64_t gs;
    MM_CHECK(mm_gq_group_size(mm_gq_group_tensor(a), g->K, &gs));
    mm_qweight_src_t s;
    memset(&s, 0, sizeof s);
    s.type = a->weight_int4 ? MM_QW_INT4 : MM_QW_INT8;
    s.K = g->K;
    s.N = g->N;
    s.group_size = gs;
    void *dense = NULL;
    if (a->weight_int4) { /* int32 words of 8 values along N: the KN byte layout */
        if (g->s_n != 1 || g->s_k != g->N / 8)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: an int4 weight (int32, 8 values per "
                            "element along N) must be dense [E, K, N / 8]", mm_gq_fn);
        s.layout = MM_QW_KN;
        s.data = src;
        s.ld = g->s_k * 4;
    } else if (g->s_n == 1 && g->s_k >= g->N) {
        s.layout = MM_QW_KN;
        s.data = src;
        s.ld = g->s_k;
    } else if (g->s_k == 1 && g->s_n >= g->K) {
        s.layout = MM_QW_NK;
        s.data = src;
        s.ld = g->s_n;
    } else { /* another view: a dense [K, N] copy to pack from */
        dense = malloc((size_t)(g->K * g->N) + 1);
        if (!dense) return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: weight copy", mm_gq_fn);
        for (int64_t k = 0; k < g->K; k++)
            for (int64_t n = 0; n < g->N; n++)
                ((int8_t *)dense)[k * g->N + n] = ((const int8_t *)src)[k * g->s_k + n * g->s_n];
        s.layout = MM_QW_KN;
        s.data = dense;
        s.ld = g->N;
        version = ~version; /* the copy is new: always re-pack */
    }
    mm_gq_pack_t *p = packs[e];
    megamoe_status_t st;
    if (p && p->group_size != gs) { /* another K grouping: a new pack */
        mm_gmm_quant_destroy(p);
        packs[e] = p = NULL;
    }
    int fresh = 0;
    if (p) {
        st = mm_qweight_update(p->w, &s, version, &fresh);
    } else {
        p = calloc(1, sizeof *p);
        st = p ? mm_qweight_create(&s, version, &p->w)
               : mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: packed weight", mm_gq_fn);
        if (st == MEGAMOE_OK) {
            p->group_size = gs;
            packs[e] = p;
            fresh = 1;
        } else {
            free(p);
            p = NULL;
        }
    }
    if (st == MEGAMOE_OK && a->weight_int4 && (fresh || !p->colsum)) {
        const int64_t g_len = gs > 0 ? gs : (g->K > 0 ? g->K : 1);
        const int64_t G = (g->K + g_len - 1) / g_len;
        if (!p->colsum || p->groups != G) {
            free(p->colsum);
            p->colsum_bytes = (size_t)(G * g->N) * sizeof *p->colsum;
            p->colsum = malloc(p->colsum_bytes + 1);
            p->groups = G;
        }
        if (p->colsum)
            mm_gq_int4_colsums(s.data, s.ld, g->K, g->N, gs, p->colsum);
        else /* the pack stays valid; the next call retries */
            st = mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: int4 column sums", mm_gq_fn);
    }
    if (fresh && repacked) *repacked = 1;
    free(dense);
    return st;
}

size_t mm_gmm_quant_packed_bytes(const void *pack)
{
    const mm_gq_pack_t *p = pack;
    return p ? mm_qweight_packed_bytes(p->w) + (p->colsum ? p->colsum_bytes : 0) : 0;
}

void mm_gmm_quant_destroy(void *pack)
{
    mm_gq_pack_t *p = pack;
    if (p) {
        mm_qweight_destroy(p->w);
        free(p->colsum);
    }
    free(p);
}

/* ---- per-call parameters ------------------------------------------------------------------ */

typedef struct mm_gq_ctx {
    megamoe_dtype_t a_type, c_type;
    mm_qgemm_expert_t *ex;  /* [E] */
    float *params;          /* the fp32 copies the experts point into */
    const float *x_scale;   /* [M] or NULL */
    int fp16_out;           /* y fp16: computed in fp32, rounded in the epilogue */
} mm_gq_ctx_t;

/* fp32 copy of a per-group parameter ([E, N], [E, 1, N], [E, G, N] or [N] for one group),
 * G rows per expert; any float dtype or int64-coded fp32. */
static void mm_gq_param(const megamoe_tensor_t *t, int64_t E, int64_t G, int64_t N, float *out)
{
    for (int64_t i = 0; i < E * G * N; i++) out[i] = mm_cx_scale(t->data, t->dtype, i);
}

static megamoe_status_t mm_gq_check_param(const char *name, const megamoe_tensor_t *t, int64_t E,
                                          int64_t G, int64_t N)
{
    if (!mm_cx_present(t)) return MEGAMOE_OK;
    int ok = (t->ndim == 2 && t->shape[0] == E && t->shape[1] == N && G == 1) ||
             (t->ndim == 3 && t->shape[0] == E && t->shape[1] == G && t->shape[2] == N) ||
             (t->ndim == 1 && E == 1 && G == 1 && t->shape[0] == N);
    if (!ok || !(mm_cx_is_float(t->dtype) || t->dtype == MEGAMOE_DTYPE_INT64)) {
        char got[96];
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: %s is %s %s; expected a float (or "
                        "int64-coded fp32) [E=%lld, %sN=%lld]", mm_gq_fn, name,
                        megamoe_dtype_name(t->dtype), mm_cx_shape_str(t, got, sizeof got),
                        (long long)E, G > 1 ? "G, " : "", (long long)N);
    }
    return MEGAMOE_OK;
}

static megamoe_status_t mm_gq_tile(const mm_gmm_plan_t *p, const mm_gmm_tile_t *t, void *vctx)
{
    const mm_gq_ctx_t *c = vctx;
    const megamoe_grouped_matmul_args_t *a = p->a;
    int64_t rows = t->m1 - t->m0, start = p->starts[t->g] + t->m0;
    size_t xs = megamoe_dtype_size(a->x.dtype);
    mm_qgemm_args_t q;
    mm_qgemm_args_init(&q);
    q.num_groups = 1;
    q.group_rows = &rows;
    q.experts = &c->ex[t->g];
    q.K = p->K;
    q.N = p->N;
    q.a_type = c->a_type;
    q.A = (const char *)a->x.data + (size_t)(start * p->K) * xs;
    q.lda = p->K;
    q.x_scale = c->x_scale ? c->x_scale + start : NULL;
    q.n0 = t->n0;
    q.n1 = t->n1;
    if (!c->fp16_out) {
        q.c_type = c->c_type;
        q.C = (char *)a->y.data + (size_t)(start * p->N) * megamoe_dtype_size(c->c_type);
        q.ldc = p->N;
        return mm_qgemm(&q);
    }
    float *acc = malloc((size_t)(rows * p->N) * sizeof *acc + 1);
    if (!acc) return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: tile", mm_gq_fn);
    q.c_type = MEGAMOE_DTYPE_FP32;
    q.C = acc;
    q.ldc = p->N;
    megamoe_status_t st = mm_qgemm(&q);
    for (int64_t r = 0; st == MEGAMOE_OK && r < rows; r++)
        for (int64_t n = t->n0; n < t->n1; n++)
            ((uint16_t *)a->y.data)[(start + r) * p->N + n] = megamoe_fp32_to_fp16(acc[r * p->N + n]);
    free(acc);
    return st;
}

megamoe_status_t mm_gmm_quant(const mm_gmm_plan_t *p)
{
    const megamoe_grouped_matmul_args_t *a = p->a;
    megamoe_dtype_t xt = a->x.dtype, wt = a->weight.dtype, yt = a->y.dtype;
    int int4 = a->weight_int4;
    if (int4 && wt != MEGAMOE_DTYPE_INT32)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: an int4 weight is an int32 tensor of 8 "
                        "values each", mm_gq_fn);
    if (!int4 && wt != MEGAMOE_DTYPE_INT8)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: x is %s but weight is %s: quantised "
                        "products take int8 (or int4-in-int32) weights", mm_gq_fn,
                        megamoe_dtype_name(xt), megamoe_dtype_name(wt));
    mm_gq_ctx_t c;
    memset(&c, 0, sizeof c);
    int weight_only = mm_cx_is_float(xt);
    if (weight_only) { /* W8A16 / W4A16 */
        if (xt != MEGAMOE_DTYPE_BF16)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: int8 / int4 weights with %s x: the "
                            "weight-only products take bf16 activations", mm_gq_fn,
                            megamoe_dtype_name(xt));
        if (!mm_cx_present(&a->antiquant_scale))
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: bf16 x with int8 / int4 weights needs "
                            "antiquant_scale (W8A16 / W4A16)", mm_gq_fn);
        if (mm_cx_present(&a->scale) || mm_cx_present(&a->per_token_scale))
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: W8A16 / W4A16 take antiquant_scale / "
                            "antiquant_offset, not scale / per_token_scale", mm_gq_fn);
        c.a_type = MEGAMOE_DTYPE_BF16;
    } else {
        if (xt != MEGAMOE_DTYPE_INT8)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: x dtype %s; use int8 (W8A8 / A8W4) or "
                            "bf16 (W8A16)", mm_gq_fn, megamoe_dtype_name(xt));
        if (mm_cx_present(&a->antiquant_scale) || mm_cx_present(&a->antiquant_offset))
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: antiquant_scale / antiquant_offset are "
                            "for bf16 x (W8A16); int8 x takes scale and per_token_scale", mm_gq_fn);
        c.a_type = MEGAMOE_DTYPE_INT8;
    }
    int int32_out = yt == MEGAMOE_DTYPE_INT32;
    if (int32_out) {
        if (weight_only || int4 || mm_cx_present(&a->scale) || mm_cx_present(&a->per_token_scale) ||
            (mm_cx_present(&a->bias) && a->bias.dtype != MEGAMOE_DTYPE_INT32))
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: int32 output is W8A8's exact sums: int8 "
                            "x and weight, no scale / per_token_scale, an int32 bias at most",
                            mm_gq_fn);
        c.c_type = MEGAMOE_DTYPE_INT32;
    } else if (yt == MEGAMOE_DTYPE_BF16 || yt == MEGAMOE_DTYPE_FP32) {
        c.c_type = yt;
    } else if (yt == MEGAMOE_DTYPE_FP16) {
        c.c_type = MEGAMOE_DTYPE_FP32;
        c.fp16_out = 1;
    } else {
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: output dtype %s; use int32, bf16, fp16 or "
                        "fp32", mm_gq_fn, megamoe_dtype_name(yt));
    }
    if (!int32_out && !weight_only && !mm_cx_present(&a->scale))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: int8 x with a %s output needs scale "
                        "(per-channel [E, N]); for the raw sums ask for int32", mm_gq_fn,
                        megamoe_dtype_name(yt));
    if (int4 && !weight_only && !mm_cx_present(&a->per_token_scale))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: A8W4 needs per_token_scale", mm_gq_fn);
    const megamoe_tensor_t *gt = mm_gq_group_tensor(a);
    int64_t G = mm_cx_present(gt) && gt->ndim == 3 ? gt->shape[1] : 1, gs;
    MM_CHECK(mm_gq_group_size(gt, p->K, &gs));
    if (G > 1 && !weight_only && !int4)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: per-K-group scales are for int4 weights "
                        "and the weight-only products; W8A8 scales are per channel [E, N]",
                        mm_gq_fn);
    const char *sname = weight_only ? "antiquant_scale" : "scale";
    MM_CHECK(mm_gq_check_param(sname, weight_only ? &a->antiquant_scale : &a->scale, p->E, G, p->N));
    MM_CHECK(mm_gq_check_param("antiquant_offset", &a->antiquant_offset, p->E, G, p->N));
    int i32_bias = mm_cx_present(&a->bias) && a->bias.dtype == MEGAMOE_DTYPE_INT32;
    if (i32_bias && (weight_only || G > 1))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: an int32 bias joins W8A8's int32 sums (per "
                        "channel); use a float bias here", mm_gq_fn);
    /* fp32 copies of the per-call parameters, one block per kind */
    int64_t EGN = p->E * G * p->N, EN = p->E * p->N;
    c.params = malloc((size_t)(2 * EGN + 2 * EN) * sizeof(float) + 16);
    c.ex = calloc((size_t)p->E, sizeof *c.ex);
    void **tmp_packs = NULL;
    megamoe_status_t st = c.params && c.ex ? MEGAMOE_OK
                                           : mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: parameters", mm_gq_fn);
    float *wscale = c.params, *woff = wscale + EGN, *bias = woff + EGN, *pre = bias + EN;
    const megamoe_tensor_t *sc = weight_only ? &a->antiquant_scale : &a->scale;
    if (st == MEGAMOE_OK && mm_cx_present(sc)) mm_gq_param(sc, p->E, G, p->N, wscale);
    if (st == MEGAMOE_OK && mm_cx_present(&a->antiquant_offset))
        mm_gq_param(&a->antiquant_offset, p->E, G, p->N, woff);
    if (st == MEGAMOE_OK && mm_cx_present(&a->bias) && !i32_bias) mm_gq_param(&a->bias, p->E, 1, p->N, bias);
    /* the packed weights: the caller's, or made for this call */
    void *const *packs = a->packed ? mm_gmm_weights_quant(a->packed) : NULL;
    if (st == MEGAMOE_OK && packs) {
        for (int64_t e = 0; e < p->E && st == MEGAMOE_OK; e++)
            if (packs[e] && ((const mm_gq_pack_t *)packs[e])->group_size != gs)
                st = mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: the packed weights have K groups of "
                              "%lld, the call's scales %lld", mm_gq_fn,
                              (long long)((const mm_gq_pack_t *)packs[e])->group_size, (long long)gs);
    } else if (st == MEGAMOE_OK) {
        tmp_packs = calloc((size_t)p->E, sizeof *tmp_packs);
        if (!tmp_packs) st = mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: packs", mm_gq_fn);
        for (int64_t e = 0; e < p->E && st == MEGAMOE_OK; e++)
            if (p->counts[e]) st = mm_gmm_quant_pack(tmp_packs, e, a, p, mm_gmm_weight(p, e), 0, NULL);
        packs = tmp_packs;
    }
    for (int64_t e = 0; e < p->E && st == MEGAMOE_OK; e++) {
        mm_qgemm_expert_t *x = &c.ex[e];
        if (!p->counts[e]) continue;
        x->weight = packs[e] ? ((const mm_gq_pack_t *)packs[e])->w : NULL;
        if (!x->weight) {
            st = mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: expert %lld has rows but no packed weight",
                          mm_gq_fn, (long long)e);
            break;
        }
        x->ld_scale = p->N;
        if (mm_cx_present(sc)) x->w_scale = wscale + e * G * p->N;
        if (mm_cx_present(&a->antiquant_offset)) x->w_offset = woff + e * G * p->N;
        if (i32_bias) x->bias_i32 = (const int32_t *)a->bias.data + e * p->N;
        if (int4 && !weight_only) { /* A8W4: bias_pre = bias - 8 colsum(W * scale) */
            const mm_gq_pack_t *pk = packs[e];
            if (!pk->colsum || pk->groups != G) {
                st = mm_error(pk->colsum ? MEGAMOE_INVALID_ARGUMENT : MEGAMOE_OUT_OF_MEMORY,
                              "%s: expert %lld's packed int4 weight has %s column sums for the "
                              "call's %lld K groups (its packing %s); re-pack the weights", mm_gq_fn,
                              (long long)e, pk->colsum ? "other" : "no", (long long)G,
                              pk->colsum ? "saw other scales" : "could not allocate them");
                break;
            }
            /* the sum of megamoe_quant_w4a8_bias_pre, group by group: each group's products
             * are exact in double there, so the two agree */
            const float *sc_e = wscale + e * G * p->N;
            const float *b_e = mm_cx_present(&a->bias) ? bias + e * p->N : NULL;
            float *pre_e = pre + e * p->N;
            for (int64_t n = 0; n < p->N; n++) {
                double sum = 0;
                for (int64_t gi = 0; gi < G; gi++)
                    sum += (double)pk->colsum[gi * p->N + n] * sc_e[gi * p->N + n];
                pre_e[n] = (float)((b_e ? (double)b_e[n] : 0.0) - 8.0 * sum);
            }
            x->bias_pre = pre_e;
        } else if (mm_cx_present(&a->bias) && !i32_bias) {
            x->bias_post = bias + e * p->N;
        }
    }
    c.x_scale = mm_cx_present(&a->per_token_scale) ? a->per_token_scale.data : NULL;
    mm_gmm_tile_t *tiles = NULL;
    if (st == MEGAMOE_OK) {
        int64_t n = mm_gmm_tiles(p, MM_QGEMM_N_ALIGN, &tiles);
        st = n < 0 ? mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: tiles", mm_gq_fn)
                   : mm_gmm_run_tiles(p, tiles, n, mm_gq_tile, &c);
    }
    if (st == MEGAMOE_OK) mm_gmm_zero_tail(p);
    free(tiles);
    if (tmp_packs) {
        for (int64_t e = 0; e < p->E; e++) mm_gmm_quant_destroy(tmp_packs[e]);
        free(tmp_packs);
    }
    free(c.params);
    free(c.ex);
    return st;
}
