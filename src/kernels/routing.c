/* Routing kernels of include/megamoe/companion.h: npu_moe_init_routing_v2, token permute /
 * unpermute (and its gradient), finalize_routing. Row moves and fp32 weighted sums; the
 * orders are stable (counting sorts) so every output is deterministic. */
#include <stdlib.h>

#include "companion_quant.h"
#include "base/abi.h"
#include "companion_util.h"
#include "rows.h"

/* ---- stable sort of flat expert ids ------------------------------------------------------- */

/* order[j] = flat index of the j-th pair in a stable sort by key; keys outside [lo, hi) sort
 * after all others (in flat order) when tail_out_of_range, else the range must cover every
 * key. Counting sort over [lo, hi]. Returns the number of in-range keys (*avail). */
static megamoe_status_t mm_cx_sort_keys(const char *fn, const void *keys, megamoe_dtype_t kt,
                                        int64_t n, int64_t lo, int64_t hi, int64_t *order,
                                        int64_t *counts, int64_t *avail_p)
{
    int64_t buckets = hi - lo + 1; /* the last bucket holds the out-of-range keys */
    int64_t *start = calloc((size_t)buckets + 1, sizeof *start);
    if (!start) return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: sort buckets", fn);
    for (int64_t i = 0; i < n; i++) {
        int64_t key = mm_cx_index(keys, kt, i);
        int64_t b = key >= lo && key < hi ? key - lo : buckets - 1;
        start[b + 1]++;
    }
    if (counts)
        for (int64_t b = 0; b < buckets - 1; b++) counts[b] = start[b + 1];
    for (int64_t b = 0; b < buckets; b++) start[b + 1] += start[b];
    *avail_p = start[buckets - 1];
    for (int64_t i = 0; i < n; i++) {
        int64_t key = mm_cx_index(keys, kt, i);
        int64_t b = key >= lo && key < hi ? key - lo : buckets - 1;
        order[start[b]++] = i;
    }
    free(start);
    return MEGAMOE_OK;
}

/* ---- npu_moe_init_routing_v2 -------------------------------------------------------------- */

static const char *const mm_ir_fn = "megamoe_init_routing";

static megamoe_init_routing_args_t mm_init_routing_defaults(void)
{
    megamoe_init_routing_args_t a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.active_num = -1;
    a.expert_capacity = -1;
    a.expert_num = -1;
    a.quant_mode = -1;
    a.threads = 1;
    return a;
}

megamoe_status_t megamoe_init_routing_args_init(megamoe_init_routing_args_t *p, size_t struct_size)
{
    megamoe_init_routing_args_t d = mm_init_routing_defaults();
    return mm_abi_init(p, struct_size, &d, sizeof d, "megamoe_init_routing_args_t");
}

typedef struct mm_ir_shape {
    int64_t N, K, H, E, s, e, R, C;
} mm_ir_shape_t;

static megamoe_status_t mm_ir_shape(const megamoe_init_routing_args_t *a, mm_ir_shape_t *sh)
{
    const char *fn = mm_ir_fn;
    if (!mm_cx_present(&a->x) || a->x.ndim != 2)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: x must be a 2-D [N, H] tensor", fn);
    if (!mm_cx_is_float(a->x.dtype) && a->x.dtype != MEGAMOE_DTYPE_INT8)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: x dtype %s; use bf16, fp16, fp32 or int8", fn,
                        megamoe_dtype_name(a->x.dtype));
    if (!mm_cx_present(&a->expert_idx) || a->expert_idx.ndim != 2 ||
        a->expert_idx.shape[0] != a->x.shape[0] ||
        (a->expert_idx.dtype != MEGAMOE_DTYPE_INT32 && a->expert_idx.dtype != MEGAMOE_DTYPE_INT64))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: expert_idx must be int32 [N=%lld, K] (x's rows)", fn,
                        (long long)a->x.shape[0]);
    sh->N = a->x.shape[0];
    sh->H = a->x.shape[1];
    sh->K = a->expert_idx.shape[1];
    sh->E = a->expert_num;
    if (a->range_end > a->range_start) {
        sh->s = a->range_start;
        sh->e = a->range_end;
        if (sh->s < 0)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: active_expert_range starts below 0", fn);
        if (sh->E <= 0) sh->E = sh->e;
    } else {
        if (sh->E <= 0)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: expert_num must be > 0 without an active_expert_range", fn);
        sh->s = 0;
        sh->e = sh->E;
    }
    if (a->drop_pad_mode != 0 && a->drop_pad_mode != 1)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: drop_pad_mode %lld; use 0 or 1", fn,
                        (long long)a->drop_pad_mode);
    if (a->quant_mode < -1 || a->quant_mode > 1)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: quant_mode %lld; use -1 (none), 0 (static int8) or 1 (dynamic int8); "
                        "the MX/fp8 modes are Ascend 950 only", fn, (long long)a->quant_mode);
    if (a->quant_mode >= 0 && a->x.dtype == MEGAMOE_DTYPE_INT8)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: int8 x cannot be quantised again (quant_mode "
                        "%lld); pass quant_mode=-1 with its per-token scale", fn,
                        (long long)a->quant_mode);
    if (a->expert_tokens_num_type < 0 || a->expert_tokens_num_type > 2)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: expert_tokens_num_type %lld; use 0, 1 or 2",
                        fn, (long long)a->expert_tokens_num_type);
    if (a->row_idx_type != 0 && a->row_idx_type != 1)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: row_idx_type %lld; use 0 (gather) or 1",
                        fn, (long long)a->row_idx_type);
    if (a->drop_pad_mode == 1) {
        if (a->expert_capacity <= 0)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: drop_pad_mode 1 needs expert_capacity > 0", fn);
        if (a->row_idx_type != 0)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: drop_pad_mode 1 gives the gather row index only (row_idx_type 0)",
                            fn);
        sh->C = a->expert_capacity;
        sh->R = (sh->e - sh->s) * sh->C;
    } else {
        int64_t nk = sh->N * sh->K;
        sh->R = a->active_num > 0 && a->active_num < nk ? a->active_num : nk;
        sh->C = 0;
    }
    /* scale / offset */
    const megamoe_tensor_t *sc = &a->scale;
    if (mm_cx_present(sc)) {
        if (sc->dtype != MEGAMOE_DTYPE_FP32)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: scale must be fp32", fn);
        int64_t L = sh->e - sh->s;
        int ok;
        if (a->quant_mode == -1) ok = sc->ndim == 1 && sc->shape[0] == sh->N;
        else if (a->quant_mode == 1)
            ok = sc->ndim == 2 && (sc->shape[0] == L || sc->shape[0] == 1) && sc->shape[1] == sh->H;
        else
            ok = (sc->ndim == 1 && (sc->shape[0] == L || sc->shape[0] == 1)) ||
                 (sc->ndim == 2 && (sc->shape[0] == L || sc->shape[0] == 1) &&
                  (sc->shape[1] == sh->H || sc->shape[1] == 1));
        if (!ok) {
            char got[96];
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: scale has shape %s; quant_mode -1 takes [N] per-token scales, 1 "
                            "smooth scales [e - s, H] or [1, H], 0 static scales [e - s] / [e - s, "
                            "H | 1] (or one row)", fn, mm_cx_shape_str(sc, got, sizeof got));
        }
    } else if (a->quant_mode == 0) {
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: quant_mode 0 (static) needs scale", fn);
    }
    if (mm_cx_present(&a->offset)) {
        if (a->quant_mode != 0 || a->offset.dtype != MEGAMOE_DTYPE_FP32 ||
            mm_cx_numel(&a->offset) != mm_cx_numel(sc))
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: offset is an fp32 tensor of scale's shape, for quant_mode 0 only",
                            fn);
    }
    return MEGAMOE_OK;
}

static int mm_ir_has_scale_out(const megamoe_init_routing_args_t *a)
{
    return a->quant_mode == 1 || (a->quant_mode == -1 && mm_cx_present(&a->scale));
}

megamoe_status_t megamoe_init_routing_infer(megamoe_init_routing_args_t *in)
{
    if (in == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s_infer: NULL args", mm_ir_fn);
    megamoe_init_routing_args_t a;
    MM_CX_ARGS("megamoe_init_routing_args_t", in, a, mm_init_routing_defaults());
    mm_ir_shape_t sh;
    MM_CHECK(mm_ir_shape(&a, &sh));
    megamoe_tensor_t *ex = &in->expanded_x;
    ex->dtype = a.quant_mode >= 0 ? MEGAMOE_DTYPE_INT8 : a.x.dtype;
    if (a.drop_pad_mode == 1) {
        ex->ndim = 3;
        ex->shape[0] = sh.e - sh.s;
        ex->shape[1] = sh.C;
        ex->shape[2] = sh.H;
    } else {
        ex->ndim = 2;
        ex->shape[0] = sh.R;
        ex->shape[1] = sh.H;
    }
    in->expanded_row_idx.dtype = MEGAMOE_DTYPE_INT32;
    in->expanded_row_idx.ndim = 1;
    in->expanded_row_idx.shape[0] = sh.N * sh.K;
    in->expert_tokens.dtype = MEGAMOE_DTYPE_INT64;
    if (a.expert_tokens_num_type == 2) {
        in->expert_tokens.ndim = 2;
        in->expert_tokens.shape[0] = sh.E;
        in->expert_tokens.shape[1] = 2;
    } else {
        in->expert_tokens.ndim = 1;
        in->expert_tokens.shape[0] = sh.e - sh.s;
    }
    in->expanded_scale.dtype = MEGAMOE_DTYPE_FP32;
    in->expanded_scale.ndim = 1;
    in->expanded_scale.shape[0] = sh.R;
    return MEGAMOE_OK;
}

static megamoe_status_t mm_ir_check_out(const char *name, const megamoe_tensor_t *got,
                                        const megamoe_tensor_t *want)
{
    int ok = got->data != NULL && got->dtype == want->dtype && got->ndim == want->ndim;
    for (int i = 0; ok && i < want->ndim; i++) ok = got->shape[i] == want->shape[i];
    if (ok) return MEGAMOE_OK;
    char g[96], w[96];
    return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: %s must be %s %s (megamoe_init_routing_infer), "
                    "got %s %s", mm_ir_fn, name, megamoe_dtype_name(want->dtype),
                    mm_cx_shape_str(want, w, sizeof w), megamoe_dtype_name(got->dtype),
                    mm_cx_shape_str(got, g, sizeof g));
}

/* One expanded row from token t for a pair of expert `ex` (range-relative): copy, static or
 * dynamic int8 (smooth row ex or 0). scratch: fp32 [H]. Returns the row's scale. */
static float mm_ir_row(const megamoe_init_routing_args_t *a, const mm_ir_shape_t *sh, int64_t t,
                       int64_t ex, void *dst, float *scratch)
{
    size_t es = megamoe_dtype_size(a->x.dtype);
    const char *src = (const char *)a->x.data + (size_t)(t * sh->H) * es;
    if (a->quant_mode == -1) {
        memcpy(dst, src, (size_t)sh->H * es);
        return mm_cx_present(&a->scale) ? ((const float *)a->scale.data)[t] : 0.0f;
    }
    mm_cx_load_row(scratch, src, a->x.dtype, sh->H);
    const megamoe_tensor_t *sc = &a->scale;
    if (a->quant_mode == 1) {
        if (mm_cx_present(sc)) {
            const float *sm = (const float *)sc->data + (sc->shape[0] == 1 ? 0 : ex) * sh->H;
            for (int64_t h = 0; h < sh->H; h++) scratch[h] *= sm[h];
        }
        return mm_cx_quant_row_f32(scratch, sh->H, dst, 127.0f);
    }
    /* static: round(x * scale + offset), scale per expert (a row, one value, or broadcast) */
    int64_t rows = sc->shape[0], cols = sc->ndim == 2 ? sc->shape[1] : 1;
    int64_t base = (rows == 1 ? 0 : ex) * cols;
    const float *sv = sc->data, *ov = mm_cx_present(&a->offset) ? a->offset.data : NULL;
    for (int64_t h = 0; h < sh->H; h++) {
        int64_t i = base + (cols == 1 ? 0 : h);
        float v = scratch[h] * sv[i];
        if (ov) v += ov[i];
        ((int8_t *)dst)[h] = megamoe_fp32_to_int8(v);
    }
    return 0.0f;
}

megamoe_status_t megamoe_init_routing(const megamoe_init_routing_args_t *in)
{
    megamoe_init_routing_args_t a;
    MM_CX_ARGS("megamoe_init_routing_args_t", in, a, mm_init_routing_defaults());
    mm_ir_shape_t sh;
    MM_CHECK(mm_ir_shape(&a, &sh));
    megamoe_init_routing_args_t want = a;
    MM_CHECK(megamoe_init_routing_infer(&want));
    MM_CHECK(mm_ir_check_out("expanded_x", &a.expanded_x, &want.expanded_x));
    MM_CHECK(mm_ir_check_out("expanded_row_idx", &a.expanded_row_idx, &want.expanded_row_idx));
    MM_CHECK(mm_ir_check_out("expert_tokens", &a.expert_tokens, &want.expert_tokens));
    int scale_out = mm_ir_has_scale_out(&a) && a.drop_pad_mode == 0;
    if (mm_cx_present(&a.expanded_scale) || scale_out)
        MM_CHECK(mm_ir_check_out("expanded_scale", &a.expanded_scale, &want.expanded_scale));
    int64_t nk = sh.N * sh.K, L = sh.e - sh.s;
    int64_t *order = malloc(((size_t)nk + 1) * sizeof *order);
    int64_t *counts = calloc((size_t)L + 1, sizeof *counts);
    float *scratch = malloc(((size_t)sh.H + 16) * sizeof *scratch);
    megamoe_status_t st = order && counts && scratch ? MEGAMOE_OK
                          : mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: routing tables", mm_ir_fn);
    int64_t avail = 0;
    if (st == MEGAMOE_OK)
        st = mm_cx_sort_keys(mm_ir_fn, a.expert_idx.data, a.expert_idx.dtype, nk, sh.s, sh.e,
                             order, counts, &avail);
    if (st != MEGAMOE_OK) {
        free(order), free(counts), free(scratch);
        return st;
    }
    int32_t *row_idx = a.expanded_row_idx.data;
    size_t row_bytes = (size_t)sh.H * megamoe_dtype_size(a.expanded_x.dtype);
    char *ex = a.expanded_x.data;
    float *escale = mm_cx_present(&a.expanded_scale) ? a.expanded_scale.data : NULL;
    if (a.drop_pad_mode == 0) {
        int64_t rows = avail < sh.R ? avail : sh.R;
        for (int64_t i = 0; i < nk; i++) row_idx[i] = -1;
        for (int64_t j = 0; j < rows; j++) {
            int64_t pair = order[j], t = pair / sh.K;
            int64_t e = mm_cx_index(a.expert_idx.data, a.expert_idx.dtype, pair) - sh.s;
            float s = mm_ir_row(&a, &sh, t, e, ex + (size_t)j * row_bytes, scratch);
            if (escale) escale[j] = s;
            if (a.row_idx_type == 0) row_idx[pair] = (int32_t)j;
            else row_idx[j] = (int32_t)pair;
        }
        /* scatter index: every in-range pair, also those past active_num (their rows are not
         * in expanded_x); the rest -1 */
        if (a.row_idx_type == 1)
            for (int64_t j = rows; j < avail; j++) row_idx[j] = (int32_t)order[j];
        memset(ex + (size_t)rows * row_bytes, 0, (size_t)(sh.R - rows) * row_bytes);
        if (escale)
            for (int64_t j = rows; j < sh.R; j++) escale[j] = 0.0f;
    } else { /* capacity: the first C pairs of each expert, zero padding, dropped pairs -1 */
        memset(ex, 0, (size_t)sh.R * row_bytes);
        for (int64_t i = 0; i < nk; i++) row_idx[i] = -1;
        if (escale)
            for (int64_t j = 0; j < sh.R; j++) escale[j] = 0.0f;
        int64_t j = 0;
        for (int64_t e = 0; e < L; e++) {
            for (int64_t c = 0; c < counts[e]; c++, j++) {
                if (c >= sh.C) continue;
                int64_t pair = order[j], t = pair / sh.K, row = e * sh.C + c;
                float s = mm_ir_row(&a, &sh, t, e, ex + (size_t)row * row_bytes, scratch);
                if (escale) escale[row] = s;
                row_idx[pair] = (int32_t)row;
            }
        }
    }
    /* expert_tokens over every in-range pair (not truncated by active_num / capacity) */
    int64_t *tok = a.expert_tokens.data;
    if (a.expert_tokens_num_type == 2) {
        memset(tok, 0, (size_t)sh.E * 2 * sizeof *tok);
        int64_t used = 0;
        for (int64_t e = 0; e < L; e++)
            if (counts[e] > 0) {
                tok[2 * used] = sh.s + e;
                tok[2 * used + 1] = counts[e];
                used++;
            }
    } else {
        int64_t run = 0;
        for (int64_t e = 0; e < L; e++) {
            run += counts[e];
            tok[e] = a.expert_tokens_num_type == 0 ? run : counts[e];
        }
    }
    free(order), free(counts), free(scratch);
    return MEGAMOE_OK;
}

/* ---- npu_moe_token_permute ---------------------------------------------------------------- */

megamoe_status_t megamoe_token_permute(const megamoe_tensor_t *tokens,
                                       const megamoe_tensor_t *indices, int64_t num_out_tokens,
                                       megamoe_tensor_t *permuted,
                                       megamoe_tensor_t *sorted_indices, int threads)
{
    const char *fn = "megamoe_token_permute";
    (void)threads;
    if (!tokens || !mm_cx_present(tokens) || tokens->ndim < 1 || !indices ||
        !mm_cx_present(indices) || !permuted || !sorted_indices)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: tokens, indices and the outputs are required",
                        fn);
    if (indices->dtype != MEGAMOE_DTYPE_INT32 && indices->dtype != MEGAMOE_DTYPE_INT64)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: indices must be int32 or int64", fn);
    int64_t T = tokens->shape[0];
    int64_t nk = mm_cx_numel(indices);
    if (indices->ndim < 1 || indices->ndim > 2 || indices->shape[0] != T || (T == 0 && nk != 0))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: indices must be [T=%lld, K] or [T]", fn,
                        (long long)T);
    int64_t K = T ? nk / T : 1;
    int64_t H = T ? mm_cx_numel(tokens) / T : 0;
    if (T == 0) H = 1;
    int64_t n = num_out_tokens;
    int64_t R = n > 0 ? (n < nk ? n : nk) : n + nk;
    if (R < 0) R = 0;
    if (permuted->dtype != tokens->dtype || permuted->shape[0] != R ||
        mm_cx_numel(permuted) != R * (tokens->ndim > 1 ? H : 1) || (permuted->data == NULL && R > 0))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: permuted_tokens must be %s [%lld, ...] (num_out_tokens %lld)", fn,
                        megamoe_dtype_name(tokens->dtype), (long long)R, (long long)n);
    if (sorted_indices->dtype != MEGAMOE_DTYPE_INT32 || mm_cx_numel(sorted_indices) != nk ||
        (sorted_indices->data == NULL && nk > 0))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: sorted_indices must be int32 [%lld]", fn,
                        (long long)nk);
    if (nk == 0) return MEGAMOE_OK;
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int64_t i = 0; i < nk; i++) {
        int64_t v = mm_cx_index(indices->data, indices->dtype, i);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    if (hi - lo > (int64_t)64 * nk + 65536)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: expert ids span [%lld, %lld], far more than the %lld pairs: pass "
                        "expert ids, not arbitrary keys", fn, (long long)lo, (long long)hi,
                        (long long)nk);
    int64_t *order = malloc((size_t)nk * sizeof *order), avail;
    if (!order) return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: order", fn);
    megamoe_status_t st = mm_cx_sort_keys(fn, indices->data, indices->dtype, nk, lo, hi + 1, order,
                                          NULL, &avail);
    if (st == MEGAMOE_OK) {
        int32_t *si = sorted_indices->data;
        size_t row = (size_t)H * megamoe_dtype_size(tokens->dtype);
        for (int64_t j = 0; j < nk; j++) {
            si[order[j]] = (int32_t)j;
            if (j < R)
                memcpy((char *)permuted->data + (size_t)j * row,
                       (const char *)tokens->data + (size_t)(order[j] / K) * row, row);
        }
    }
    free(order);
    return st;
}

/* ---- weighted gathers: unpermute, finalize ------------------------------------------------ */

/* acc[0:H] += w * row (row of type rt) */
static inline void mm_cx_axpy(float *acc, const void *row, megamoe_dtype_t rt, float w, int64_t H,
                              float *tmp)
{
    if (rt == MEGAMOE_DTYPE_FP32) {
        mm_rows_axpy_f32(acc, row, w, H);
    } else if (rt == MEGAMOE_DTYPE_BF16 || rt == MEGAMOE_DTYPE_FP16) {
        mm_rows_axpy(rt, acc, row, w, H);
    } else {
        mm_cx_load_row(tmp, row, rt, H);
        mm_rows_axpy_f32(acc, tmp, w, H);
    }
}

static megamoe_status_t mm_cx_float_rows(const char *fn, const char *name,
                                         const megamoe_tensor_t *t)
{
    if (!mm_cx_present(t) && mm_cx_numel(t) > 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: %s is required", fn, name);
    if (!mm_cx_is_float(t->dtype))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: %s dtype %s; use bf16, fp16 or fp32", fn,
                        name, megamoe_dtype_name(t->dtype));
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_token_unpermute(const megamoe_tensor_t *rows,
                                         const megamoe_tensor_t *index,
                                         const megamoe_tensor_t *probs, megamoe_tensor_t *out,
                                         int threads)
{
    const char *fn = "megamoe_token_unpermute";
    if (!rows || !index || !out)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: rows, index and out are required", fn);
    MM_CHECK(mm_cx_float_rows(fn, "permuted_tokens", rows));
    MM_CHECK(mm_cx_float_rows(fn, "out", out));
    if (index->dtype != MEGAMOE_DTYPE_INT32 && index->dtype != MEGAMOE_DTYPE_INT64)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: sorted_indices must be int32 or int64", fn);
    int64_t R = rows->ndim ? rows->shape[0] : 0, T = out->ndim ? out->shape[0] : 0;
    int64_t H = R ? mm_cx_numel(rows) / R : (T ? mm_cx_numel(out) / T : 0);
    int64_t nk = mm_cx_numel(index);
    if (T ? mm_cx_numel(out) != T * H : 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: out rows must have the rows' width %lld", fn,
                        (long long)H);
    int64_t K = T ? nk / T : 1;
    if (T * K != nk)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: sorted_indices has %lld entries, not a multiple of the %lld output rows",
                        fn, (long long)nk, (long long)T);
    int has_probs = probs && mm_cx_present(probs);
    if (has_probs && (!mm_cx_is_float(probs->dtype) || mm_cx_numel(probs) != nk))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: probs must be a float [%lld, %lld] tensor",
                        fn, (long long)T, (long long)K);
    size_t rb = (size_t)H * megamoe_dtype_size(rows->dtype);
    int nt = mm_cx_threads(threads);
    megamoe_status_t st = MEGAMOE_OK;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1 && T > 1)
#endif
    {
        float *acc = malloc((size_t)(2 * H + 16) * sizeof *acc);
        if (!acc) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            st = MEGAMOE_OUT_OF_MEMORY;
        } else {
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
            for (int64_t t = 0; t < T; t++) {
                memset(acc, 0, (size_t)H * sizeof *acc);
                for (int64_t k = 0; k < K; k++) {
                    int64_t r = mm_cx_index(index->data, index->dtype, t * K + k);
                    if (r < 0 || r >= R) continue;
                    float w = has_probs ? mm_cx_load(probs->data, probs->dtype, t * K + k) : 1.0f;
                    mm_cx_axpy(acc, (const char *)rows->data + (size_t)r * rb, rows->dtype, w, H,
                               acc + H);
                }
                mm_cx_store_row((char *)out->data + (size_t)(t * H) * megamoe_dtype_size(out->dtype),
                                out->dtype, acc, H);
            }
            free(acc);
        }
    }
    (void)nt;
    if (st != MEGAMOE_OK) return mm_error(st, "%s: row scratch", fn);
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_token_unpermute_backward(const megamoe_tensor_t *rows,
                                                  const megamoe_tensor_t *index,
                                                  const megamoe_tensor_t *probs,
                                                  const megamoe_tensor_t *d_out,
                                                  megamoe_tensor_t *d_rows,
                                                  megamoe_tensor_t *d_probs, int threads)
{
    const char *fn = "megamoe_token_unpermute_backward";
    (void)threads;
    if (!index || !d_out || !d_rows)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: index, d_out and d_rows are required", fn);
    MM_CHECK(mm_cx_float_rows(fn, "grad_output", d_out));
    MM_CHECK(mm_cx_float_rows(fn, "d_permuted_tokens", d_rows));
    int64_t T = d_out->ndim ? d_out->shape[0] : 0, R = d_rows->ndim ? d_rows->shape[0] : 0;
    int64_t H = T ? mm_cx_numel(d_out) / T : (R ? mm_cx_numel(d_rows) / R : 0);
    int64_t nk = mm_cx_numel(index), K = T ? nk / T : 1;
    if (T * K != nk || (R && mm_cx_numel(d_rows) != R * H))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: shapes of index, grad and rows disagree", fn);
    int has_probs = probs && mm_cx_present(probs);
    int want_dprobs = d_probs && mm_cx_present(d_probs);
    if (want_dprobs && (!has_probs || !rows || !mm_cx_present(rows) ||
                        mm_cx_numel(d_probs) != nk || !mm_cx_is_float(d_probs->dtype)))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: d_probs [T, K] needs probs and the forward rows", fn);
    size_t ob = megamoe_dtype_size(d_out->dtype), db = megamoe_dtype_size(d_rows->dtype);
    /* destinations hit more than once accumulate in fp32 in flat pair order */
    int32_t *hits = calloc((size_t)R + 1, sizeof *hits);
    float *acc = calloc((size_t)(R * H) + 1, sizeof *acc);
    float *v = malloc((size_t)(2 * H + 16) * sizeof *v);
    if (!hits || !acc || !v) {
        free(hits), free(acc), free(v);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: scratch", fn);
    }
    for (int64_t i = 0; i < nk; i++) {
        int64_t r = mm_cx_index(index->data, index->dtype, i);
        if (r >= 0 && r < R) hits[r]++;
    }
    for (int64_t t = 0; t < T; t++) {
        const char *g = (const char *)d_out->data + (size_t)(t * H) * ob;
        for (int64_t k = 0; k < K; k++) {
            int64_t r = mm_cx_index(index->data, index->dtype, t * K + k);
            float w = has_probs ? mm_cx_load(probs->data, probs->dtype, t * K + k) : 1.0f;
            if (want_dprobs) {
                float dot = 0.0f;
                if (r >= 0 && r < R) {
                    int64_t rw = mm_cx_numel(rows) / (rows->shape[0] ? rows->shape[0] : 1);
                    mm_cx_load_row(v, (const char *)rows->data +
                                          (size_t)(r * rw) * megamoe_dtype_size(rows->dtype),
                                   rows->dtype, H);
                    mm_cx_load_row(v + H, g, d_out->dtype, H);
                    for (int64_t h = 0; h < H; h++) v[h] *= v[H + h];
                    dot = mm_rows_sum16(v, H);
                }
                mm_cx_store(d_probs->data, d_probs->dtype, t * K + k, dot);
            }
            if (r < 0 || r >= R) continue;
            mm_cx_axpy(acc + r * H, g, d_out->dtype, w, H, v);
        }
    }
    for (int64_t r = 0; r < R; r++)
        mm_cx_store_row((char *)d_rows->data + (size_t)(r * H) * db, d_rows->dtype, acc + r * H, H);
    free(hits), free(acc), free(v);
    return MEGAMOE_OK;
}

/* ---- npu_moe_finalize_routing ------------------------------------------------------------- */

static megamoe_finalize_routing_args_t mm_finalize_routing_defaults(void)
{
    megamoe_finalize_routing_args_t a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.k = 1;
    a.threads = 1;
    return a;
}

megamoe_status_t megamoe_finalize_routing_args_init(megamoe_finalize_routing_args_t *p, size_t struct_size)
{
    megamoe_finalize_routing_args_t d = mm_finalize_routing_defaults();
    return mm_abi_init(p, struct_size, &d, sizeof d, "megamoe_finalize_routing_args_t");
}

megamoe_status_t megamoe_finalize_routing(const megamoe_finalize_routing_args_t *in)
{
    const char *fn = "megamoe_finalize_routing";
    megamoe_finalize_routing_args_t a;
    MM_CX_ARGS("megamoe_finalize_routing_args_t", in, a, mm_finalize_routing_defaults());
    const megamoe_tensor_t *rows = &a.expanded_permuted_rows;
    MM_CHECK(mm_cx_float_rows(fn, "expanded_permuted_rows", rows));
    MM_CHECK(mm_cx_float_rows(fn, "out", &a.out));
    if (a.out.ndim != 2)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: out must be [N, H]", fn);
    int64_t N = a.out.shape[0], H = a.out.shape[1];
    int64_t nrows = rows->ndim == 3 ? rows->shape[0] * rows->shape[1] : rows->shape[0];
    if ((rows->ndim != 2 && rows->ndim != 3) || rows->shape[rows->ndim - 1] != H)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: expanded_permuted_rows must be [R, H=%lld] (or [E, C, H])", fn,
                        (long long)H);
    if (a.drop_pad_mode < 0 || a.drop_pad_mode > 3)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: drop_pad_mode %lld; use 0..3", fn,
                        (long long)a.drop_pad_mode);
    int64_t K = mm_cx_present(&a.scales) ? (a.scales.ndim == 2 ? a.scales.shape[1] : -1) : a.k;
    if (K < 1 || (mm_cx_present(&a.scales) &&
                  (a.scales.shape[0] != N || !mm_cx_is_float(a.scales.dtype))))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: scales must be a float [N=%lld, K] tensor (without scales, k >= 1)",
                        fn, (long long)N);
    const megamoe_tensor_t *map = &a.expanded_src_to_dst_row;
    if (!mm_cx_present(map) || mm_cx_numel(map) != N * K ||
        (map->dtype != MEGAMOE_DTYPE_INT32 && map->dtype != MEGAMOE_DTYPE_INT64))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: expanded_src_to_dst_row must be int32 [N * K = %lld]", fn,
                        (long long)(N * K));
    const megamoe_tensor_t *skips[2] = {&a.skip1, &a.skip2};
    for (int i = 0; i < 2; i++)
        if (mm_cx_present(skips[i]) &&
            (!mm_cx_is_float(skips[i]->dtype) || mm_cx_numel(skips[i]) != N * H))
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: skip%d must be a float [N, H] tensor", fn,
                            i + 1);
    if (mm_cx_present(&a.skip2) && !mm_cx_present(&a.skip1))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: skip2 needs skip1", fn);
    const megamoe_tensor_t *efr = &a.expert_for_source_row;
    int has_bias = mm_cx_present(&a.bias);
    if (has_bias) {
        if (a.bias.ndim != 2 || a.bias.shape[1] != H || !mm_cx_is_float(a.bias.dtype))
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: bias must be a float [E, H] tensor", fn);
        if (!mm_cx_present(efr) || mm_cx_numel(efr) != N * K ||
            (efr->dtype != MEGAMOE_DTYPE_INT32 && efr->dtype != MEGAMOE_DTYPE_INT64))
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: bias needs export_for_source_row int32 [N, K]", fn);
        for (int64_t i = 0; i < N * K; i++) {
            int64_t e = mm_cx_index(efr->data, efr->dtype, i);
            if (e < 0 || e >= a.bias.shape[0])
                return mm_error(MEGAMOE_INVALID_ARGUMENT,
                                "%s: export_for_source_row[%lld] = %lld is not a row of bias [%lld, H]",
                                fn, (long long)i, (long long)e, (long long)a.bias.shape[0]);
        }
    }
    int token_major = a.drop_pad_mode >= 2;
    size_t rb = (size_t)H * megamoe_dtype_size(rows->dtype), sb = megamoe_dtype_size(a.out.dtype);
    size_t bb = (size_t)H * (has_bias ? megamoe_dtype_size(a.bias.dtype) : 0);
    int nt = mm_cx_threads(a.threads);
    megamoe_status_t st = MEGAMOE_OK;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1 && N > 1)
#endif
    {
        float *acc = malloc((size_t)(2 * H + 16) * sizeof *acc);
        if (!acc) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            st = MEGAMOE_OUT_OF_MEMORY;
        } else {
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
            for (int64_t n = 0; n < N; n++) {
                memset(acc, 0, (size_t)H * sizeof *acc);
                for (int i = 0; i < 2; i++)
                    if (mm_cx_present(skips[i]))
                        mm_cx_axpy(acc, (const char *)skips[i]->data +
                                            (size_t)(n * H) * megamoe_dtype_size(skips[i]->dtype),
                                   skips[i]->dtype, 1.0f, H, acc + H);
                for (int64_t k = 0; k < K; k++) {
                    int64_t r = mm_cx_index(map->data, map->dtype, token_major ? n * K + k : k * N + n);
                    float w = mm_cx_present(&a.scales) ? mm_cx_load(a.scales.data, a.scales.dtype,
                                                                    n * K + k)
                                                       : 1.0f;
                    if (r >= 0 && r < nrows)
                        mm_cx_axpy(acc, (const char *)rows->data + (size_t)r * rb, rows->dtype, w, H,
                                   acc + H);
                    if (has_bias) {
                        int64_t e = mm_cx_index(efr->data, efr->dtype, n * K + k);
                        mm_cx_axpy(acc, (const char *)a.bias.data + (size_t)e * bb, a.bias.dtype, w,
                                   H, acc + H);
                    }
                }
                mm_cx_store_row((char *)a.out.data + (size_t)(n * H) * sb, a.out.dtype, acc, H);
            }
            free(acc);
        }
    }
    (void)nt;
    if (st != MEGAMOE_OK) return mm_error(st, "%s: row scratch", fn);
    return MEGAMOE_OK;
}
