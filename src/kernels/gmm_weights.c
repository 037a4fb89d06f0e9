/* Packed expert weights of megamoe_grouped_matmul (megamoe_gmm_weights_*): one packed copy
 * per expert in the GEMM backend's layout (bf16; the quantised kernels' layout for int8 /
 * int4), made once and re-packed in place when the caller's version changes. */
#include <stdlib.h>

#include "companion_util.h"
#include "gemm.h"
#include "gmm_internal.h"

struct megamoe_gmm_weights {
    mm_gmm_plan_t geo;            /* E, K, N, strides of the weights packed */
    megamoe_dtype_t dtype;
    int int4;
    mm_gemm_weight_t **bf16;      /* [E] (bf16 weights) */
    void **quant;                 /* [E] (int8 / int4 weights) */
    uint16_t **dense;             /* [E] dense copies of weights whose view needs one, or NULL */
    const void **src;             /* [E] the caller's weights last packed */
    uint64_t version;
};

static const char *const mm_gw_fn = "megamoe_gmm_weights";

static const void *mm_gw_src(const megamoe_grouped_matmul_args_t *a, const mm_gmm_plan_t *g,
                             int64_t e)
{
    size_t es = a->weight_int4 ? 4 : megamoe_dtype_size(a->weight.dtype);
    if (a->weight_list) return a->weight_list[e];
    return (const char *)a->weight.data + (size_t)(e * g->s_e) * es;
}

/* (re)pack expert e of a bf16 weight */
static megamoe_status_t mm_gw_pack_bf16(megamoe_gmm_weights_t *w, int64_t e, const uint16_t *src,
                                        uint64_t version, int *repacked)
{
    const mm_gmm_plan_t *g = &w->geo;
    mm_gemm_form_t form;
    int64_t ld;
    const uint16_t *from = src;
    if (g->s_n == 1 && g->s_k >= g->N) {
        form = MM_GEMM_NN;
        ld = g->s_k;
    } else if (g->s_k == 1 && g->s_n >= g->K) {
        form = MM_GEMM_NT;
        ld = g->s_n;
    } else { /* another view: a dense [K, N] copy the packed weight can fall back to */
        if (!w->dense[e]) w->dense[e] = malloc((size_t)(g->K * g->N) * sizeof(uint16_t) + 1);
        if (!w->dense[e]) return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: dense copy", mm_gw_fn);
        for (int64_t k = 0; k < g->K; k++)
            for (int64_t n = 0; n < g->N; n++) w->dense[e][k * g->N + n] = src[k * g->s_k + n * g->s_n];
        form = MM_GEMM_NN;
        ld = g->N;
        from = w->dense[e];
        version = 0; /* repacked below whenever we get here (the copy may have changed) */
        if (w->bf16[e]) {
            mm_gemm_weight_destroy(w->bf16[e]);
            w->bf16[e] = NULL;
        }
    }
    if (w->bf16[e]) return mm_gemm_weight_update(w->bf16[e], from, ld, version, repacked);
    const mm_gemm_backend_ops_t *backend;
    MM_CHECK(mm_gemm_backend_for_weight(form, g->K, g->N, &backend));
    if (repacked) *repacked = 1;
    return mm_gemm_weight_create(backend, form, g->K, g->N, from, ld, version, &w->bf16[e]);
}

megamoe_status_t megamoe_gmm_weights_update(megamoe_gmm_weights_t *w,
                                            const megamoe_grouped_matmul_args_t *in,
                                            uint64_t version, int *repacked_p)
{
    if (w == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s_update: NULL weights", mm_gw_fn);
    megamoe_grouped_matmul_args_t a;
    MM_CX_ARGS("megamoe_grouped_matmul_args_t", in, a, megamoe_grouped_matmul_args_default());
    mm_gmm_plan_t g;
    memset(&g, 0, sizeof g);
    MM_CHECK(mm_gmm_geometry(mm_gw_fn, &a, &g));
    if (g.E != w->geo.E || g.K != w->geo.K || g.N != w->geo.N || a.weight.dtype != w->dtype ||
        (a.weight_int4 != 0) != (w->int4 != 0))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s_update: the weights are not of the packed "
                        "shape and type (E %lld, K %lld, N %lld)", mm_gw_fn, (long long)w->geo.E,
                        (long long)w->geo.K, (long long)w->geo.N);
    w->geo.s_e = g.s_e, w->geo.s_k = g.s_k, w->geo.s_n = g.s_n;
    int any = 0;
    for (int64_t e = 0; e < g.E; e++) {
        const void *src = mm_gw_src(&a, &g, e);
        if (src == w->src[e] && version == w->version && (w->bf16 ? w->bf16[e] != NULL : 1))
            continue;
        int rep = 0;
        if (w->dtype == MEGAMOE_DTYPE_BF16) MM_CHECK(mm_gw_pack_bf16(w, e, src, version, &rep));
        else MM_CHECK(mm_gmm_quant_pack(w->quant, e, &a, &g, src, version, &rep));
        w->src[e] = src;
        any |= rep;
    }
    w->version = version;
    if (repacked_p) *repacked_p = any;
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_gmm_weights_create(const megamoe_grouped_matmul_args_t *in,
                                            uint64_t version, megamoe_gmm_weights_t **weights_p)
{
    if (weights_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s_create: NULL weights_p", mm_gw_fn);
    megamoe_grouped_matmul_args_t a;
    MM_CX_ARGS("megamoe_grouped_matmul_args_t", in, a, megamoe_grouped_matmul_args_default());
    mm_gmm_plan_t g;
    memset(&g, 0, sizeof g);
    MM_CHECK(mm_gmm_geometry(mm_gw_fn, &a, &g));
    int quant = a.weight_int4 || a.weight.dtype == MEGAMOE_DTYPE_INT8;
    if (!quant && a.weight.dtype != MEGAMOE_DTYPE_BF16)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s_create: weight dtype %s; bf16, int8 and int4 "
                        "weights are packed (fp16 / fp32 products use them as they are)",
                        mm_gw_fn, megamoe_dtype_name(a.weight.dtype));
    megamoe_gmm_weights_t *w = calloc(1, sizeof *w);
    if (!w) return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s_create", mm_gw_fn);
    w->geo = g;
    w->dtype = a.weight.dtype;
    w->int4 = a.weight_int4;
    w->src = calloc((size_t)g.E, sizeof *w->src);
    w->dense = calloc((size_t)g.E, sizeof *w->dense);
    if (quant) w->quant = calloc((size_t)g.E, sizeof *w->quant);
    else w->bf16 = calloc((size_t)g.E, sizeof *w->bf16);
    if (!w->src || !w->dense || (!w->quant && !w->bf16)) {
        megamoe_gmm_weights_destroy(w);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s_create", mm_gw_fn);
    }
    w->version = ~version; /* every expert packs below */
    megamoe_status_t st = megamoe_gmm_weights_update(w, &a, version, NULL);
    if (st != MEGAMOE_OK) {
        megamoe_gmm_weights_destroy(w);
        return st;
    }
    *weights_p = w;
    return MEGAMOE_OK;
}

size_t megamoe_gmm_weights_bytes(const megamoe_gmm_weights_t *w)
{
    size_t n = 0;
    for (int64_t e = 0; w && e < w->geo.E; e++) {
        if (w->bf16 && w->bf16[e]) n += mm_gemm_weight_packed_bytes(w->bf16[e]);
        if (w->quant && w->quant[e]) n += mm_gmm_quant_packed_bytes(w->quant[e]);
        if (w->dense[e]) n += (size_t)(w->geo.K * w->geo.N) * 2;
    }
    return n;
}

void megamoe_gmm_weights_destroy(megamoe_gmm_weights_t *w)
{
    if (w == NULL) return;
    for (int64_t e = 0; e < w->geo.E; e++) {
        if (w->bf16) mm_gemm_weight_destroy(w->bf16[e]);
        if (w->quant) mm_gmm_quant_destroy(w->quant[e]);
        if (w->dense) free(w->dense[e]);
    }
    free(w->bf16), free(w->quant), free(w->dense), free(w->src);
    free(w);
}

megamoe_status_t mm_gmm_weights_check(const megamoe_gmm_weights_t *w, const mm_gmm_plan_t *p)
{
    const megamoe_grouped_matmul_args_t *a = p->a;
    if (w->geo.E != p->E || w->geo.K != p->K || w->geo.N != p->N || w->dtype != a->weight.dtype ||
        (w->int4 != 0) != (a->weight_int4 != 0))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_grouped_matmul: the packed weights are "
                        "E %lld K %lld N %lld %s, the call's weight is E %lld K %lld N %lld %s",
                        (long long)w->geo.E, (long long)w->geo.K, (long long)w->geo.N,
                        megamoe_dtype_name(w->dtype), (long long)p->E, (long long)p->K,
                        (long long)p->N, megamoe_dtype_name(a->weight.dtype));
    return MEGAMOE_OK;
}

const mm_gemm_weight_t *const *mm_gmm_weights_bf16(const megamoe_gmm_weights_t *w)
{
    return (const mm_gemm_weight_t *const *)w->bf16;
}

void *const *mm_gmm_weights_quant(const megamoe_gmm_weights_t *w) { return w->quant; }
