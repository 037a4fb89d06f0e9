/* Activations and quantisers of include/megamoe/companion.h: npu_swiglu (+ gradient),
 * npu_clipped_swiglu, npu_dynamic_quant, npu_dequant_swiglu_quant. Rows are widened to fp32,
 * computed with the vector exp of vmath.h (scalar twins with libm expf may differ by one
 * ulp before rounding), and rounded once. */
#include <math.h>
#include <stdlib.h>

#include "companion_quant.h"
#include "base/abi.h"
#include "companion_util.h"
#include "vmath.h"

/* ---- fp32 row primitives ------------------------------------------------------------------ */

typedef struct mm_cx_glu {
    int clipped;
    float alpha, limit, bias;
} mm_cx_glu_t;

static inline float mm_cx_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* out[j] = silu(a[j]) * b[j], or the clipped form */
static void mm_cx_glu_row_c(const float *a, const float *b, int64_t n, const mm_cx_glu_t *f,
                            float *out)
{
    for (int64_t j = 0; j < n; j++) {
        float av = a[j], bv = b[j];
        if (f->clipped) {
            if (av > f->limit) av = f->limit;
            if (bv > f->limit) bv = f->limit;
            else if (bv < -f->limit) bv = -f->limit;
            out[j] = av * mm_cx_sigmoid(f->alpha * av) * (bv + f->bias);
        } else {
            out[j] = av * mm_cx_sigmoid(av) * bv;
        }
    }
}

#if MM_X86
MM_TARGET_AVX512 static void mm_cx_glu_row_avx512(const float *a, const float *b, int64_t n,
                                                  const mm_cx_glu_t *f, float *out)
{
    const __m512 L = _mm512_set1_ps(f->limit), nL = _mm512_set1_ps(-f->limit);
    const __m512 alpha = _mm512_set1_ps(f->alpha), bias = _mm512_set1_ps(f->bias);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = mm_tail_mask16(n - j);
        __m512 av = _mm512_maskz_loadu_ps(m, a + j), bv = _mm512_maskz_loadu_ps(m, b + j), r;
        if (f->clipped) {
            av = _mm512_mask_mov_ps(av, _mm512_cmp_ps_mask(av, L, _CMP_GT_OQ), L);
            bv = _mm512_mask_mov_ps(bv, _mm512_cmp_ps_mask(bv, L, _CMP_GT_OQ), L);
            bv = _mm512_mask_mov_ps(bv, _mm512_cmp_ps_mask(bv, nL, _CMP_LT_OQ), nL);
            r = _mm512_mul_ps(_mm512_mul_ps(av, mm_sigmoid_ps(_mm512_mul_ps(alpha, av))),
                              _mm512_add_ps(bv, bias));
        } else {
            r = _mm512_mul_ps(_mm512_mul_ps(av, mm_sigmoid_ps(av)), bv);
        }
        _mm512_mask_storeu_ps(out + j, m, r);
    }
}
#endif

static void mm_cx_glu_row(const float *a, const float *b, int64_t n, const mm_cx_glu_t *f,
                          float *out)
{
#if MM_X86
    if (mm_kernels_use_avx512()) {
        mm_cx_glu_row_avx512(a, b, n, f, out);
        return;
    }
#endif
    mm_cx_glu_row_c(a, b, n, f, out);
}

/* v[i] = (v[i] * s[i]) * c (s NULL: 1; c == 1: skipped), one fp32 rounding per multiply */
#if MM_X86
MM_TARGET_AVX512 static void mm_cx_scale_row_avx512(float *v, const float *s, float c, int64_t n)
{
    const __m512 cv = _mm512_set1_ps(c);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = mm_tail_mask16(n - i);
        __m512 x = _mm512_maskz_loadu_ps(m, v + i);
        if (s) x = _mm512_mul_ps(x, _mm512_maskz_loadu_ps(m, s + i));
        if (c != 1.0f) x = _mm512_mul_ps(x, cv);
        _mm512_mask_storeu_ps(v + i, m, x);
    }
}
#endif

static void mm_cx_scale_row(float *v, const float *s, float c, int64_t n)
{
#if MM_X86
    if (mm_kernels_use_avx512()) {
        mm_cx_scale_row_avx512(v, s, c, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) {
        if (s) v[i] *= s[i];
        if (c != 1.0f) v[i] *= c;
    }
}

/* Split span[cut * post] (for one leading index) into a and b (half * post each). */
static void mm_cx_split(const float *span, int64_t cut, int64_t post, int interleaved, float *a,
                        float *b)
{
    int64_t half = cut / 2;
    if (!interleaved) {
        memcpy(a, span, (size_t)(half * post) * sizeof *a);
        memcpy(b, span + half * post, (size_t)(half * post) * sizeof *b);
        return;
    }
    for (int64_t i = 0; i < half; i++) {
        memcpy(a + i * post, span + (2 * i) * post, (size_t)post * sizeof *a);
        memcpy(b + i * post, span + (2 * i + 1) * post, (size_t)post * sizeof *b);
    }
}

/* ---- npu_swiglu / npu_clipped_swiglu ------------------------------------------------------ */

static megamoe_swiglu_args_t mm_swiglu_defaults(void)
{
    megamoe_swiglu_args_t a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dim = -1;
    a.alpha = 1.702f;
    a.limit = 7.0f;
    a.bias = 1.0f;
    a.valid_rows = -1;
    a.threads = 1;
    return a;
}

megamoe_status_t megamoe_swiglu_args_init(megamoe_swiglu_args_t *p, size_t struct_size)
{
    megamoe_swiglu_args_t d = mm_swiglu_defaults();
    return mm_abi_init(p, struct_size, &d, sizeof d, "megamoe_swiglu_args_t");
}

typedef struct mm_cx_split_shape {
    int64_t pre, cut, post, dim;
} mm_cx_split_shape_t;

static megamoe_status_t mm_cx_swiglu_shape(const char *fn, const megamoe_swiglu_args_t *a,
                                           mm_cx_split_shape_t *s)
{
    const megamoe_tensor_t *x = &a->x;
    if (!mm_cx_present(x) && mm_cx_numel(x) > 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: x is required", fn);
    if (!mm_cx_is_float(x->dtype) || x->ndim < 1)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: x must be a float tensor (bf16, fp16, fp32)",
                        fn);
    int64_t d = a->dim < 0 ? a->dim + x->ndim : a->dim;
    if (d < 0 || d >= x->ndim)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: dim %lld is out of range for %d dims", fn,
                        (long long)a->dim, x->ndim);
    if (x->shape[d] % 2)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: size %lld of dim %lld is odd; it must split "
                        "into two halves", fn, (long long)x->shape[d], (long long)d);
    s->dim = d;
    s->pre = 1;
    s->post = 1;
    for (int i = 0; i < d; i++) s->pre *= x->shape[i];
    for (int i = (int)d + 1; i < x->ndim; i++) s->post *= x->shape[i];
    s->cut = x->shape[d];
    return MEGAMOE_OK;
}

static megamoe_status_t mm_cx_same_shape(const char *fn, const char *name,
                                         const megamoe_tensor_t *t, const megamoe_tensor_t *ref,
                                         int64_t dim, int halve, int want)
{
    int ok = t->ndim == ref->ndim && mm_cx_is_float(t->dtype) && (want < 0 || (int)t->dtype == want);
    for (int i = 0; ok && i < ref->ndim; i++)
        ok = t->shape[i] == (i == dim && halve ? ref->shape[i] / 2 : ref->shape[i]);
    if (ok && (t->data || mm_cx_numel(t) == 0)) return MEGAMOE_OK;
    char g[96], r[96];
    return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: %s is %s %s; expected the shape of %s%s", fn,
                    name, megamoe_dtype_name(t->dtype), mm_cx_shape_str(t, g, sizeof g),
                    mm_cx_shape_str(ref, r, sizeof r), halve ? " with dim halved" : "");
}

megamoe_status_t megamoe_swiglu(const megamoe_swiglu_args_t *in)
{
    const char *fn = "megamoe_swiglu";
    megamoe_swiglu_args_t a;
    MM_CX_ARGS("megamoe_swiglu_args_t", in, a, mm_swiglu_defaults());
    mm_cx_split_shape_t s;
    MM_CHECK(mm_cx_swiglu_shape(fn, &a, &s));
    MM_CHECK(mm_cx_same_shape(fn, "y", &a.y, &a.x, s.dim, 1, -1));
    mm_cx_glu_t f = {a.clipped, a.alpha, a.limit, a.bias};
    int64_t valid = a.valid_rows < 0 || a.valid_rows > s.pre ? s.pre : a.valid_rows;
    int64_t span = s.cut * s.post, half = span / 2;
    size_t xs = megamoe_dtype_size(a.x.dtype), ys = megamoe_dtype_size(a.y.dtype);
    int nt = mm_cx_threads(a.threads);
    int oom = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1 && valid > 1)
#endif
    {
        float *buf = malloc((size_t)(2 * span + 16) * sizeof *buf);
        if (!buf) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            oom = 1;
        } else {
            float *ab = buf + span; /* a: ab[0:half], b: ab[half:span]; out reuses buf */
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
            for (int64_t p = 0; p < valid; p++) {
                mm_cx_load_row(buf, (const char *)a.x.data + (size_t)(p * span) * xs, a.x.dtype,
                               span);
                mm_cx_split(buf, s.cut, s.post, a.interleaved, ab, ab + half);
                mm_cx_glu_row(ab, ab + half, half, &f, buf);
                mm_cx_store_row((char *)a.y.data + (size_t)(p * half) * ys, a.y.dtype, buf, half);
            }
            free(buf);
        }
    }
    (void)nt;
    if (oom) return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: row scratch", fn);
    if (valid < s.pre)
        memset((char *)a.y.data + (size_t)(valid * half) * ys, 0,
               (size_t)((s.pre - valid) * half) * ys);
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_swiglu_backward(const megamoe_swiglu_args_t *in,
                                         const megamoe_tensor_t *dy, megamoe_tensor_t *dx)
{
    const char *fn = "megamoe_swiglu_backward";
    megamoe_swiglu_args_t a;
    MM_CX_ARGS("megamoe_swiglu_args_t", in, a, mm_swiglu_defaults());
    if (a.clipped)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: the clipped form has no gradient here", fn);
    if (!dy || !dx) return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: dy and dx are required", fn);
    mm_cx_split_shape_t s;
    MM_CHECK(mm_cx_swiglu_shape(fn, &a, &s));
    MM_CHECK(mm_cx_same_shape(fn, "grad", dy, &a.x, s.dim, 1, -1));
    MM_CHECK(mm_cx_same_shape(fn, "dx", dx, &a.x, s.dim, 0, -1));
    int64_t span = s.cut * s.post, half = span / 2;
    size_t xs = megamoe_dtype_size(a.x.dtype), gs = megamoe_dtype_size(dy->dtype);
    size_t ds = megamoe_dtype_size(dx->dtype);
    float *buf = malloc((size_t)(4 * span + 16) * sizeof *buf);
    if (!buf) return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: row scratch", fn);
    float *av = buf + span, *bv = av + half, *d = bv + half, *out = d + half;
    for (int64_t p = 0; p < s.pre; p++) {
        mm_cx_load_row(buf, (const char *)a.x.data + (size_t)(p * span) * xs, a.x.dtype, span);
        mm_cx_split(buf, s.cut, s.post, a.interleaved, av, bv);
        mm_cx_load_row(d, (const char *)dy->data + (size_t)(p * half) * gs, dy->dtype, half);
        for (int64_t j = 0; j < half; j++) { /* the order of kernels/swiglu.c's backward */
            float sg = mm_cx_sigmoid(av[j]);
            float silu = av[j] * sg, dsilu = sg * (1.0f + av[j] * (1.0f - sg));
            float da = d[j] * bv[j] * dsilu, db = d[j] * silu;
            if (!a.interleaved) {
                out[j] = da;
                out[half + j] = db;
            } else {
                int64_t i = j / s.post, q = j % s.post;
                out[(2 * i) * s.post + q] = da;
                out[(2 * i + 1) * s.post + q] = db;
            }
        }
        mm_cx_store_row((char *)dx->data + (size_t)(p * span) * ds, dx->dtype, out, span);
    }
    free(buf);
    return MEGAMOE_OK;
}

/* ---- npu_dynamic_quant ------------------------------------------------------------------- */

static megamoe_dynamic_quant_args_t mm_dynamic_quant_defaults(void)
{
    megamoe_dynamic_quant_args_t a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.threads = 1;
    return a;
}

megamoe_status_t megamoe_dynamic_quant_args_init(megamoe_dynamic_quant_args_t *p, size_t struct_size)
{
    megamoe_dynamic_quant_args_t d = mm_dynamic_quant_defaults();
    return mm_abi_init(p, struct_size, &d, sizeof d, "megamoe_dynamic_quant_args_t");
}

/* int4 pack: 8 values of [-8, 7] per int32, element 8m + i in bits 4i..4i+3 */
static void mm_cx_pack_int4(const int8_t *q, int64_t n, int32_t *out)
{
    for (int64_t m = 0; m < n / 8; m++) {
        uint32_t w = 0;
        for (int i = 0; i < 8; i++) w |= (uint32_t)(q[8 * m + i] & 0xF) << (4 * i);
        out[m] = (int32_t)w;
    }
}

megamoe_status_t megamoe_dynamic_quant(const megamoe_dynamic_quant_args_t *in)
{
    const char *fn = "megamoe_dynamic_quant";
    megamoe_dynamic_quant_args_t a;
    MM_CX_ARGS("megamoe_dynamic_quant_args_t", in, a, mm_dynamic_quant_defaults());
    const megamoe_tensor_t *x = &a.x;
    if (!mm_cx_is_float(x->dtype) || x->ndim < 1 || (!x->data && mm_cx_numel(x) > 0))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: x must be a bf16, fp16 or fp32 tensor", fn);
    int64_t H = x->shape[x->ndim - 1], rows = H ? mm_cx_numel(x) / H : 0;
    int int4 = a.y.dtype == MEGAMOE_DTYPE_INT32;
    if (a.y.dtype != MEGAMOE_DTYPE_INT8 && !int4)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: y must be int8, or int32 (packed int4)", fn);
    if (int4 && H % 8)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: int4 output needs H %% 8 == 0, H = %lld", fn,
                        (long long)H);
    if (mm_cx_numel(&a.y) != (int4 ? rows * H / 8 : rows * H) || (!a.y.data && rows * H != 0))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: y must hold %lld %s elements", fn,
                        (long long)(int4 ? rows * H / 8 : rows * H), int4 ? "int32" : "int8");
    if (a.scale.dtype != MEGAMOE_DTYPE_FP32 || mm_cx_numel(&a.scale) != rows ||
        (!a.scale.data && rows))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: scale must be fp32 with %lld elements", fn,
                        (long long)rows);
    const megamoe_tensor_t *sm = &a.smooth_scales, *gi = &a.group_index;
    int64_t G = 0;
    int64_t *ends = NULL;
    if (mm_cx_present(gi)) {
        if (!mm_cx_present(sm) || sm->ndim != 2 || sm->shape[1] != H)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: group_index needs smooth_scales [G, H=%lld]", fn, (long long)H);
        G = sm->shape[0];
        int64_t counts_n = gi->ndim == 1 ? gi->shape[0] : -1;
        if (counts_n != G)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: group_index must be 1-D with one entry per smooth_scales row (%lld)",
                            fn, (long long)G);
        int64_t *counts = malloc(((size_t)G + 1) * sizeof *counts);
        ends = malloc(((size_t)G + 1) * sizeof *ends);
        megamoe_status_t st = counts && ends ? mm_cx_group_counts(fn, gi, 0, G, rows, counts, NULL)
                                             : MEGAMOE_OUT_OF_MEMORY;
        if (st == MEGAMOE_OK) {
            int64_t run = 0;
            for (int64_t g = 0; g < G; g++) ends[g] = run += counts[g];
        }
        free(counts);
        if (st != MEGAMOE_OK) {
            free(ends);
            return st == MEGAMOE_OUT_OF_MEMORY ? mm_error(st, "%s: group table", fn) : st;
        }
    } else if (mm_cx_present(sm)) {
        if (mm_cx_numel(sm) != H)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s: smooth_scales must be [H=%lld] without group_index", fn,
                            (long long)H);
    }
    if (mm_cx_present(sm) && !mm_cx_is_float(sm->dtype)) {
        free(ends);
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: smooth_scales must be a float tensor", fn);
    }
    size_t xs = megamoe_dtype_size(x->dtype), ss = mm_cx_present(sm) ? megamoe_dtype_size(sm->dtype) : 0;
    float *scale = a.scale.data;
    int nt = mm_cx_threads(a.threads), oom = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1 && rows > 1)
#endif
    {
        float *v = malloc((size_t)(2 * H + 16) * sizeof *v);
        int8_t *q = int4 ? malloc((size_t)H + 16) : NULL;
        if (!v || (int4 && !q)) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            oom = 1;
        } else {
            float *smv = v + H;
            int64_t loaded = -1;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
            for (int64_t r = 0; r < rows; r++) {
                int64_t g = 0;
                if (ends) {
                    while (g < G && r >= ends[g]) g++;
                    if (g == G) { /* past the last group: zero */
                        if (int4) memset((int32_t *)a.y.data + r * (H / 8), 0, (size_t)(H / 8) * 4);
                        else memset((int8_t *)a.y.data + r * H, 0, (size_t)H);
                        scale[r] = 0.0f;
                        continue;
                    }
                }
                mm_cx_load_row(v, (const char *)x->data + (size_t)(r * H) * xs, x->dtype, H);
                if (mm_cx_present(sm)) {
                    if (loaded != g) {
                        mm_cx_load_row(smv, (const char *)sm->data + (size_t)(g * H) * ss, sm->dtype, H);
                        loaded = g;
                    }
                    for (int64_t h = 0; h < H; h++) v[h] *= smv[h];
                }
                if (int4) {
                    scale[r] = mm_cx_quant_row_f32(v, H, q, 7.0f);
                    mm_cx_pack_int4(q, H, (int32_t *)a.y.data + r * (H / 8));
                } else {
                    scale[r] = mm_cx_quant_row_f32(v, H, (int8_t *)a.y.data + r * H, 127.0f);
                }
            }
        }
        free(v);
        free(q);
    }
    (void)nt;
    free(ends);
    if (oom) return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: row scratch", fn);
    return MEGAMOE_OK;
}

/* ---- npu_dequant_swiglu_quant ------------------------------------------------------------- */

static megamoe_dequant_swiglu_quant_args_t mm_dequant_swiglu_quant_defaults(void)
{
    megamoe_dequant_swiglu_quant_args_t a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.group_index_type = 1;
    a.quant_mode = 1;
    a.clamp_limit = 7.0f;
    a.glu_alpha = 1.702f;
    a.glu_bias = 1.0f;
    a.threads = 1;
    return a;
}

megamoe_status_t megamoe_dequant_swiglu_quant_args_init(megamoe_dequant_swiglu_quant_args_t *p, size_t struct_size)
{
    megamoe_dequant_swiglu_quant_args_t d = mm_dequant_swiglu_quant_defaults();
    return mm_abi_init(p, struct_size, &d, sizeof d, "megamoe_dequant_swiglu_quant_args_t");
}

/* A per-group row parameter [G, n] (or [n] / [1, n] for one group): its row g, or NULL. */
static megamoe_status_t mm_cx_group_param(const char *fn, const char *name,
                                          const megamoe_tensor_t *t, int64_t G, int64_t n,
                                          int allow_int)
{
    if (!mm_cx_present(t)) return MEGAMOE_OK;
    int ok = (t->ndim == 2 && t->shape[0] == G && t->shape[1] == n) ||
             (G == 1 && mm_cx_numel(t) == n);
    if (!ok || !(mm_cx_is_float(t->dtype) || (allow_int && t->dtype == MEGAMOE_DTYPE_INT32))) {
        char g[96];
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: %s is %s %s; expected a float [%lld, %lld]",
                        fn, name, megamoe_dtype_name(t->dtype), mm_cx_shape_str(t, g, sizeof g),
                        (long long)G, (long long)n);
    }
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_dequant_swiglu_quant(const megamoe_dequant_swiglu_quant_args_t *in)
{
    const char *fn = "megamoe_dequant_swiglu_quant";
    megamoe_dequant_swiglu_quant_args_t a;
    MM_CX_ARGS("megamoe_dequant_swiglu_quant_args_t", in, a, mm_dequant_swiglu_quant_defaults());
    const megamoe_tensor_t *x = &a.x;
    if (x->ndim != 2 || (!mm_cx_is_float(x->dtype) && x->dtype != MEGAMOE_DTYPE_INT32) ||
        x->shape[1] % 2 || (!x->data && mm_cx_numel(x)))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: x must be int32, bf16, fp16 or fp32 [T, 2H] (an even last dim)", fn);
    if (a.swiglu_mode < 0 || a.swiglu_mode > 2)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: swiglu_mode %lld; use 0, 1 or 2", fn,
                        (long long)a.swiglu_mode);
    if (a.quant_mode != 0 && a.quant_mode != 1)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%s: quant_mode %lld; use 1 (dynamic) or 0 (static)", fn,
                        (long long)a.quant_mode);
    int64_t T = x->shape[0], H2 = x->shape[1], H = H2 / 2;
    if (a.y.dtype != MEGAMOE_DTYPE_INT8 || a.y.ndim != 2 || a.y.shape[0] != T ||
        a.y.shape[1] != H || (!a.y.data && T * H != 0))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: y must be int8 [T=%lld, H=%lld]", fn,
                        (long long)T, (long long)H);
    if (a.scale.dtype != MEGAMOE_DTYPE_FP32 || mm_cx_numel(&a.scale) != T || (!a.scale.data && T))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: scale must be fp32 [T=%lld]", fn,
                        (long long)T);
    int64_t G = 1, *counts = NULL, total = T;
    if (mm_cx_present(&a.group_index)) {
        G = mm_cx_numel(&a.group_index);
        if (mm_cx_present(&a.bias))
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: bias is not supported with group_index",
                            fn);
        counts = malloc(((size_t)G + 1) * sizeof *counts);
        if (!counts) return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: group table", fn);
        megamoe_status_t st = a.group_index.ndim != 1
                                  ? mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: group_index must be 1-D", fn)
                                  : mm_cx_group_counts(fn, &a.group_index, a.group_index_type, G,
                                                       T, counts, &total);
        if (st != MEGAMOE_OK) {
            free(counts);
            return st;
        }
    }
    megamoe_status_t st = mm_cx_group_param(fn, "weight_scale", &a.weight_scale, G, H2, 0);
    if (st == MEGAMOE_OK) st = mm_cx_group_param(fn, "bias", &a.bias, 1, H2, 1);
    if (st == MEGAMOE_OK) st = mm_cx_group_param(fn, "quant_scale", &a.quant_scale, G, H, 0);
    if (st == MEGAMOE_OK) st = mm_cx_group_param(fn, "quant_offset", &a.quant_offset, G, H, 0);
    if (st == MEGAMOE_OK && mm_cx_present(&a.activation_scale) &&
        (a.activation_scale.dtype != MEGAMOE_DTYPE_FP32 || mm_cx_numel(&a.activation_scale) != T))
        st = mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: activation_scale must be fp32 [T] or [T, 1]",
                      fn);
    if (st == MEGAMOE_OK && a.quant_mode == 0 && !mm_cx_present(&a.quant_scale))
        st = mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: quant_mode 0 (static) needs quant_scale", fn);
    if (st != MEGAMOE_OK) {
        free(counts);
        return st;
    }
    mm_cx_glu_t f = {a.swiglu_mode != 0, a.swiglu_mode == 0 ? 1.0f : a.glu_alpha, a.clamp_limit,
                     a.glu_bias};
    const float *act = mm_cx_present(&a.activation_scale) ? a.activation_scale.data : NULL;
    size_t xs = megamoe_dtype_size(x->dtype);
    int8_t *y = a.y.data;
    float *scale = a.scale.data;
    int nt = mm_cx_threads(a.threads), oom = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(nt) if (nt > 1 && total > 1)
#endif
    {
        float *buf = malloc((size_t)(5 * H2 + 16) * sizeof *buf);
        if (!buf) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            oom = 1;
        } else {
            float *ab = buf + H2, *out = ab + H2, *wsv = out + H, *qsv = wsv + H2, *qov = qsv + H;
            int64_t loaded = -1;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
            for (int64_t t = 0; t < total; t++) {
                int64_t g = 0;
                if (counts) {
                    int64_t run = counts[0];
                    while (t >= run) run += counts[++g];
                }
                if (loaded != g) { /* the group's rows of the per-group parameters, once */
                    if (mm_cx_present(&a.weight_scale))
                        mm_cx_load_row(wsv, (const float *)a.weight_scale.data + g * H2,
                                       MEGAMOE_DTYPE_FP32, H2);
                    if (mm_cx_present(&a.quant_scale))
                        mm_cx_load_row(qsv, (const char *)a.quant_scale.data +
                                                (size_t)(g * H) * megamoe_dtype_size(a.quant_scale.dtype),
                                       a.quant_scale.dtype, H);
                    if (mm_cx_present(&a.quant_offset))
                        mm_cx_load_row(qov, (const char *)a.quant_offset.data +
                                                (size_t)(g * H) * megamoe_dtype_size(a.quant_offset.dtype),
                                       a.quant_offset.dtype, H);
                    loaded = g;
                }
                const char *row = (const char *)x->data + (size_t)(t * H2) * xs;
                if (mm_cx_present(&a.bias) && a.bias.dtype == MEGAMOE_DTYPE_INT32 &&
                    x->dtype == MEGAMOE_DTYPE_INT32) { /* int32 bias joins the int32 sum */
                    const int32_t *xi = (const int32_t *)row, *bi = a.bias.data;
                    for (int64_t i = 0; i < H2; i++) buf[i] = (float)(xi[i] + bi[i]);
                } else {
                    mm_cx_load_row(buf, row, x->dtype, H2);
                    if (mm_cx_present(&a.bias))
                        for (int64_t i = 0; i < H2; i++)
                            buf[i] += mm_cx_load(a.bias.data, a.bias.dtype, i);
                }
                mm_cx_scale_row(buf, mm_cx_present(&a.weight_scale) ? wsv : NULL,
                                act ? act[t] : 1.0f, H2);
                float *av = ab, *bv = ab + H;
                if (a.swiglu_mode == 1) {
                    mm_cx_split(buf, H2, 1, 1, av, bv);
                } else if (a.activate_left) {
                    av = buf, bv = buf + H;
                } else {
                    av = buf + H, bv = buf;
                }
                mm_cx_glu_row(av, bv, H, &f, out);
                if (a.quant_mode == 1) {
                    if (mm_cx_present(&a.quant_scale)) mm_cx_scale_row(out, qsv, 1.0f, H);
                    scale[t] = mm_cx_quant_row_f32(out, H, y + t * H, 127.0f);
                } else {
                    for (int64_t i = 0; i < H; i++) {
                        float v = out[i] * qsv[i];
                        if (mm_cx_present(&a.quant_offset)) v += qov[i];
                        y[t * H + i] = megamoe_fp32_to_int8(v);
                    }
                    scale[t] = 0.0f;
                }
            }
            free(buf);
        }
    }
    (void)nt;
    free(counts);
    if (oom) return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: row scratch", fn);
    if (total < T) {
        memset(y + total * H, 0, (size_t)((T - total) * H));
        for (int64_t t = total; t < T; t++) scale[t] = 0.0f;
    }
    return MEGAMOE_OK;
}
