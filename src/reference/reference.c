/* The plain reference model of the MegaMoE math (see include/megamoe/reference.h).
 *
 * Clarity over speed: every (token, choice) pair is computed on its own with straightforward
 * loops, in fp64, and results are rounded to fp32 once at the end. Loops run along the
 * contiguous (last) dimension of each weight so the oracle stays usable at test sizes.
 * Outputs are written only after every check and allocation has succeeded.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "megamoe/reference.h"

#include "base/abi.h"
#include "base/alloc.h"
#include "base/error.h"

/* Everything one call needs, with every input widened to fp32 (bf16 -> fp32 is exact). */
typedef struct mm_ref {
    size_t n, h, i, e, k; /* rows (EP*T), hidden, intermediate, experts, top_k */
    int clamp;            /* swiglu_limit > 0 */
    int mixed;            /* bf16_intermediates */
    double limit;
    const float *x, *probs, *gate_up, *down, *dout; /* fp32 views of the inputs */
    float *owned[5];                                /* widened copies of bf16 inputs */
    int64_t *ids;                                   /* [n*k], validated */
} mm_ref_t;

megamoe_status_t megamoe_reference_params_init(megamoe_reference_params_t *params,
                                               size_t struct_size)
{
    megamoe_reference_params_t p;
    memset(&p, 0, sizeof(p));
    p.swiglu_limit = 0.0f;
    p.hidden_dtype = MEGAMOE_DTYPE_FP32;
    p.ids_dtype = MEGAMOE_DTYPE_INT32;
    p.probs_dtype = MEGAMOE_DTYPE_FP32;
    p.weight_dtype = MEGAMOE_DTYPE_FP32;
    p.grad_dtype = MEGAMOE_DTYPE_FP32;
    return mm_abi_init(params, struct_size, &p, sizeof p, "megamoe_reference_params_t");
}

/* ---- validation ---------------------------------------------------------------------------- */

static megamoe_status_t mm_ref_check_float_dtype(const char *what, megamoe_dtype_t dtype)
{
    if (dtype == MEGAMOE_DTYPE_FP32 || dtype == MEGAMOE_DTYPE_BF16) return MEGAMOE_OK;
    return mm_error(MEGAMOE_INVALID_ARGUMENT,
                    "reference: %s dtype %s (%d) is not supported; pass MEGAMOE_DTYPE_FP32 or "
                    "MEGAMOE_DTYPE_BF16", what, megamoe_dtype_name(dtype), (int)dtype);
}

_Static_assert(sizeof(size_t) >= sizeof(int64_t), "the reference model needs a 64-bit size_t");

/* a*b*c as size_t, 0 when it does not fit. The bound leaves room for the scratch sizes, which
 * add a few such counts and multiply by sizeof(double), so none of them can wrap. */
static int mm_ref_mul(size_t *out, size_t a, size_t b, size_t c)
{
    size_t ab;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, out)) return 0;
    return *out <= SIZE_MAX / 64;
}

static megamoe_status_t mm_ref_check_shape(const megamoe_reference_shape_t *s,
                                           const megamoe_reference_params_t *p, mm_ref_t *r)
{
    if (s == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "reference: shape is NULL; pass a filled megamoe_reference_shape_t");
    const struct { const char *name; int64_t v; } dims[] = {
        {"ep", s->ep}, {"tokens_per_rank", s->tokens_per_rank}, {"hidden", s->hidden},
        {"intermediate", s->intermediate}, {"num_experts", s->num_experts},
        {"top_k", s->top_k}};
    for (size_t d = 0; d < sizeof(dims) / sizeof(dims[0]); d++)
        if (dims[d].v < 1)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "reference: %s = %lld must be >= 1", dims[d].name,
                            (long long)dims[d].v);
    if (s->num_experts % s->ep != 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "reference: num_experts %lld is not divisible by ep %lld; every rank must "
                        "own E/EP experts, so choose E as a multiple of EP",
                        (long long)s->num_experts, (long long)s->ep);
    if (s->top_k > s->num_experts)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "reference: top_k %lld must be in [1, num_experts = %lld]",
                        (long long)s->top_k, (long long)s->num_experts);
    if (p->ids_dtype != MEGAMOE_DTYPE_INT32 && p->ids_dtype != MEGAMOE_DTYPE_INT64)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "reference: topk_ids dtype %s (%d) is not supported; pass "
                        "MEGAMOE_DTYPE_INT32 or MEGAMOE_DTYPE_INT64",
                        megamoe_dtype_name(p->ids_dtype), (int)p->ids_dtype);
    MM_CHECK(mm_ref_check_float_dtype("hidden_states", p->hidden_dtype));
    MM_CHECK(mm_ref_check_float_dtype("topk_weights", p->probs_dtype));
    MM_CHECK(mm_ref_check_float_dtype("weight", p->weight_dtype));
    MM_CHECK(mm_ref_check_float_dtype("grad_out", p->grad_dtype));
    if (isnan(p->swiglu_limit))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "reference: swiglu_limit is NaN; pass a positive limit, or <= 0 for none");

    size_t n, eh, count; /* every element count used below must fit */
    if (!mm_ref_mul(&n, (size_t)s->ep, (size_t)s->tokens_per_rank, 1) ||
        !mm_ref_mul(&count, n, (size_t)s->hidden, 1) ||
        !mm_ref_mul(&count, n, (size_t)s->top_k, 1) ||
        !mm_ref_mul(&eh, (size_t)s->num_experts, (size_t)s->hidden, 1) ||
        !mm_ref_mul(&count, eh, (size_t)s->intermediate, 2))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "reference: shape ep=%lld T=%lld H=%lld I=%lld E=%lld is too large to "
                        "address; use smaller shapes for the reference model",
                        (long long)s->ep, (long long)s->tokens_per_rank, (long long)s->hidden,
                        (long long)s->intermediate, (long long)s->num_experts);
    r->n = n;
    r->h = (size_t)s->hidden;
    r->i = (size_t)s->intermediate;
    r->e = (size_t)s->num_experts;
    r->k = (size_t)s->top_k;
    r->clamp = p->swiglu_limit > 0.0f;
    r->mixed = p->bf16_intermediates != 0;
    r->limit = (double)p->swiglu_limit;
    return MEGAMOE_OK;
}

static megamoe_status_t mm_ref_check_ptr(const void *ptr, const char *name)
{
    if (ptr != NULL) return MEGAMOE_OK;
    return mm_error(MEGAMOE_INVALID_ARGUMENT, "reference: %s is NULL; pass a buffer of the "
                    "documented shape (see megamoe/reference.h)", name);
}

static int64_t mm_ref_id(const void *ids, megamoe_dtype_t dtype, size_t idx)
{
    return dtype == MEGAMOE_DTYPE_INT64 ? ((const int64_t *)ids)[idx]
                                        : (int64_t)((const int32_t *)ids)[idx];
}

/* Every id must name one of the E global experts; checked before anything is allocated. */
static megamoe_status_t mm_ref_check_ids(const mm_ref_t *r, const void *ids,
                                         megamoe_dtype_t dtype)
{
    for (size_t idx = 0; idx < r->n * r->k; idx++) {
        int64_t id = mm_ref_id(ids, dtype, idx);
        if (id < 0 || (uint64_t)id >= r->e)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "reference: topk_ids[%zu, %zu] = %lld is not a global expert id in "
                            "[0, %zu); fix the router output (ids are global, not rank-local)",
                            idx / r->k, idx % r->k, (long long)id, r->e);
    }
    return MEGAMOE_OK;
}

/* ---- setup --------------------------------------------------------------------------------- */

/* fp32 view of an input: the buffer itself, or an exact fp32 copy of a bf16 buffer. */
static megamoe_status_t mm_ref_widen(mm_ref_t *r, int slot, const void *src,
                                     megamoe_dtype_t dtype, size_t count, const char *what,
                                     const float **view_p)
{
    if (dtype == MEGAMOE_DTYPE_FP32) {
        *view_p = (const float *)src;
        return MEGAMOE_OK;
    }
    void *copy;
    MM_CHECK(mm_aligned_alloc(count * sizeof(float), MM_CACHE_LINE, what, &copy));
    r->owned[slot] = copy;
    const uint16_t *bits = (const uint16_t *)src;
    for (size_t j = 0; j < count; j++) r->owned[slot][j] = megamoe_bf16_to_fp32(bits[j]);
    *view_p = r->owned[slot];
    return MEGAMOE_OK;
}

static void mm_ref_release(mm_ref_t *r)
{
    for (size_t s = 0; s < sizeof(r->owned) / sizeof(r->owned[0]); s++)
        mm_aligned_free(r->owned[s]);
    mm_aligned_free(r->ids);
}

/* Validate everything (grad_out only for the backward), then widen the inputs. */
static megamoe_status_t mm_ref_setup(mm_ref_t *r, const megamoe_reference_shape_t *shape,
                                     const megamoe_reference_params_t *params, int backward,
                                     const void *grad_out, const void *hidden_states,
                                     const void *topk_ids, const void *topk_weights,
                                     const void *gate_up_weight, const void *down_weight)
{
    memset(r, 0, sizeof(*r));
    megamoe_reference_params_t p = megamoe_reference_params_default();
    if (params) MM_CHECK(mm_abi_copy_in(&p, sizeof p, params, "megamoe_reference_params_t"));
    MM_CHECK(mm_ref_check_shape(shape, &p, r));
    if (backward) MM_CHECK(mm_ref_check_ptr(grad_out, "grad_out"));
    MM_CHECK(mm_ref_check_ptr(hidden_states, "hidden_states"));
    MM_CHECK(mm_ref_check_ptr(topk_ids, "topk_ids"));
    MM_CHECK(mm_ref_check_ptr(topk_weights, "topk_weights"));
    MM_CHECK(mm_ref_check_ptr(gate_up_weight, "gate_up_weight"));
    MM_CHECK(mm_ref_check_ptr(down_weight, "down_weight"));
    MM_CHECK(mm_ref_check_ids(r, topk_ids, p.ids_dtype));

    megamoe_status_t st;
    void *ids;
    st = mm_aligned_alloc(r->n * r->k * sizeof(int64_t), MM_CACHE_LINE, "reference topk_ids",
                          &ids);
    if (st != MEGAMOE_OK) return st;
    r->ids = ids;
    for (size_t idx = 0; idx < r->n * r->k; idx++)
        r->ids[idx] = mm_ref_id(topk_ids, p.ids_dtype, idx);

    size_t gu = r->e * r->h * 2 * r->i, dn = r->e * r->i * r->h;
    st = mm_ref_widen(r, 0, hidden_states, p.hidden_dtype, r->n * r->h, "reference hidden",
                      &r->x);
    if (st == MEGAMOE_OK)
        st = mm_ref_widen(r, 1, topk_weights, p.probs_dtype, r->n * r->k, "reference weights",
                          &r->probs);
    if (st == MEGAMOE_OK)
        st = mm_ref_widen(r, 2, gate_up_weight, p.weight_dtype, gu, "reference gate_up",
                          &r->gate_up);
    if (st == MEGAMOE_OK)
        st = mm_ref_widen(r, 3, down_weight, p.weight_dtype, dn, "reference down", &r->down);
    if (st == MEGAMOE_OK && backward)
        st = mm_ref_widen(r, 4, grad_out, p.grad_dtype, r->n * r->h, "reference grad_out",
                          &r->dout);
    if (st != MEGAMOE_OK) mm_ref_release(r);
    return st;
}

/* ---- math ---------------------------------------------------------------------------------- */

static double mm_sigmoid(double v) { return 1.0 / (1.0 + exp(-v)); }

/* v as an intermediate tensor element: unchanged, or rounded to bf16 (via fp32, as a kernel
 * with an fp32 accumulator rounds it) with bf16_intermediates. */
static double mm_ref_store(const mm_ref_t *r, double v)
{
    return r->mixed ? (double)megamoe_bf16_to_fp32(megamoe_fp32_to_bf16((float)v)) : v;
}

/* One expert applied to one token row x [H]: the pre-activation h [2I] (before clamping),
 * the activation a [I] and the expert output y [H]. */
static void mm_ref_expert_forward(const mm_ref_t *r, const float *x, size_t e, double *h,
                                  double *a, double *y)
{
    const float *w1 = r->gate_up + e * r->h * 2 * r->i; /* [H, 2I] */
    const float *w2 = r->down + e * r->i * r->h;        /* [I, H] */
    for (size_t j = 0; j < 2 * r->i; j++) h[j] = 0.0;
    for (size_t c = 0; c < r->h; c++)
        for (size_t j = 0; j < 2 * r->i; j++) h[j] += (double)x[c] * w1[c * 2 * r->i + j];
    for (size_t j = 0; j < 2 * r->i; j++) h[j] = mm_ref_store(r, h[j]);
    for (size_t j = 0; j < r->i; j++) {
        double g = h[j], u = h[r->i + j];
        if (r->clamp) {
            g = fmin(g, r->limit);
            u = fmax(fmin(u, r->limit), -r->limit);
        }
        a[j] = mm_ref_store(r, g * mm_sigmoid(g) * u);
    }
    for (size_t c = 0; c < r->h; c++) y[c] = 0.0;
    for (size_t j = 0; j < r->i; j++)
        for (size_t c = 0; c < r->h; c++) y[c] += a[j] * w2[j * r->h + c];
    for (size_t c = 0; c < r->h; c++) y[c] = mm_ref_store(r, y[c]);
}

megamoe_status_t megamoe_reference_forward(const megamoe_reference_shape_t *shape,
                                           const megamoe_reference_params_t *params,
                                           const void *hidden_states, const void *topk_ids,
                                           const void *topk_weights, const void *gate_up_weight,
                                           const void *down_weight, float *out_p)
{
    mm_ref_t r;
    MM_CHECK(mm_ref_setup(&r, shape, params, 0, NULL, hidden_states, topk_ids, topk_weights,
                          gate_up_weight, down_weight));
    megamoe_status_t st = mm_ref_check_ptr(out_p, "out_p");
    /* One fp64 scratch block: h [2I], a [I], y [H], and the output accumulator [N, H]. */
    void *mem = NULL;
    if (st == MEGAMOE_OK)
        st = mm_aligned_calloc((3 * r.i + r.h + r.n * r.h) * sizeof(double), MM_CACHE_LINE,
                               "reference forward scratch", &mem);
    if (st != MEGAMOE_OK) {
        mm_ref_release(&r);
        return st;
    }
    double *h = mem, *a = h + 2 * r.i, *y = a + r.i, *acc = y + r.h;

    for (size_t t = 0; t < r.n; t++) {
        for (size_t k = 0; k < r.k; k++) {
            size_t e = (size_t)r.ids[t * r.k + k];
            double w = r.probs[t * r.k + k];
            mm_ref_expert_forward(&r, r.x + t * r.h, e, h, a, y);
            for (size_t c = 0; c < r.h; c++) acc[t * r.h + c] += w * y[c];
        }
    }
    for (size_t idx = 0; idx < r.n * r.h; idx++) out_p[idx] = (float)acc[idx];

    mm_aligned_free(mem);
    mm_ref_release(&r);
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_reference_backward(const megamoe_reference_shape_t *shape,
                                            const megamoe_reference_params_t *params,
                                            const void *grad_out, const void *hidden_states,
                                            const void *topk_ids, const void *topk_weights,
                                            const void *gate_up_weight, const void *down_weight,
                                            float *grad_hidden_p, float *grad_topk_weights_p,
                                            float *grad_gate_up_p, float *grad_down_p)
{
    mm_ref_t r;
    MM_CHECK(mm_ref_setup(&r, shape, params, 1, grad_out, hidden_states, topk_ids, topk_weights,
                          gate_up_weight, down_weight));
    megamoe_status_t st = mm_ref_check_ptr(grad_hidden_p, "grad_hidden_p");
    if (st == MEGAMOE_OK) st = mm_ref_check_ptr(grad_topk_weights_p, "grad_topk_weights_p");
    if (st == MEGAMOE_OK) st = mm_ref_check_ptr(grad_gate_up_p, "grad_gate_up_p");
    if (st == MEGAMOE_OK) st = mm_ref_check_ptr(grad_down_p, "grad_down_p");

    /* fp64 scratch: per pair h [2I], a [I], y [H], dy [H], da [I], dh [2I]; accumulators
     * dx [N, H], dprobs [N, K], dW1 [E, H, 2I], dW2 [E, I, H] (zeroed, so experts that get
     * no token keep exact zero grads). */
    size_t gu = r.e * r.h * 2 * r.i, dn = r.e * r.i * r.h;
    size_t count = 6 * r.i + 2 * r.h + r.n * r.h + r.n * r.k + gu + dn;
    void *mem = NULL;
    if (st == MEGAMOE_OK)
        st = mm_aligned_calloc(count * sizeof(double), MM_CACHE_LINE,
                               "reference backward scratch", &mem);
    if (st != MEGAMOE_OK) {
        mm_ref_release(&r);
        return st;
    }
    double *h = mem, *a = h + 2 * r.i, *y = a + r.i, *dy = y + r.h, *da = dy + r.h;
    double *dh = da + r.i, *dx = dh + 2 * r.i, *dprobs = dx + r.n * r.h;
    double *dw1 = dprobs + r.n * r.k, *dw2 = dw1 + gu;

    for (size_t t = 0; t < r.n; t++) {
        const float *x = r.x + t * r.h, *g_out = r.dout + t * r.h;
        for (size_t k = 0; k < r.k; k++) {
            size_t e = (size_t)r.ids[t * r.k + k];
            double w = r.probs[t * r.k + k];
            const float *w1 = r.gate_up + e * r.h * 2 * r.i, *w2 = r.down + e * r.i * r.h;
            double *gw1 = dw1 + e * r.h * 2 * r.i, *gw2 = dw2 + e * r.i * r.h;
            mm_ref_expert_forward(&r, x, e, h, a, y);

            /* out[t] += w * y:  d w = <dout, y>,  dy = w * dout. */
            double dot = 0.0;
            for (size_t c = 0; c < r.h; c++) {
                dot += (double)g_out[c] * y[c];
                dy[c] = mm_ref_store(&r, w * g_out[c]);
            }
            dprobs[t * r.k + k] = dot;

            /* y = a · W2:  dW2 += a^T dy,  da = W2 dy. */
            for (size_t j = 0; j < r.i; j++) {
                double s = 0.0;
                for (size_t c = 0; c < r.h; c++) {
                    gw2[j * r.h + c] += a[j] * dy[c];
                    s += (double)w2[j * r.h + c] * dy[c];
                }
                da[j] = mm_ref_store(&r, s);
            }

            /* a = silu(g') * u' with g' = min(g, L), u' = clamp(u, -L, L):
             * d u = da * silu(g') [u inside the limit],
             * d g = da * u' * silu'(g') [g <= L], silu'(v) = s (1 + v (1 - s)). */
            for (size_t j = 0; j < r.i; j++) {
                double g = h[j], u = h[r.i + j];
                int g_pass = 1, u_pass = 1;
                if (r.clamp) {
                    g_pass = g <= r.limit;
                    u_pass = u >= -r.limit && u <= r.limit;
                    g = fmin(g, r.limit);
                    u = fmax(fmin(u, r.limit), -r.limit);
                }
                double sg = mm_sigmoid(g);
                dh[j] = g_pass ? mm_ref_store(&r, da[j] * u * sg * (1.0 + g * (1.0 - sg))) : 0.0;
                dh[r.i + j] = u_pass ? mm_ref_store(&r, da[j] * g * sg) : 0.0;
            }

            /* h = x · W1:  dW1 += x^T dh,  dx += W1 dh. */
            for (size_t c = 0; c < r.h; c++) {
                double s = 0.0;
                for (size_t j = 0; j < 2 * r.i; j++) {
                    gw1[c * 2 * r.i + j] += (double)x[c] * dh[j];
                    s += (double)w1[c * 2 * r.i + j] * dh[j];
                }
                dx[t * r.h + c] += mm_ref_store(&r, s);
            }
        }
    }

    for (size_t idx = 0; idx < r.n * r.h; idx++) grad_hidden_p[idx] = (float)dx[idx];
    for (size_t idx = 0; idx < r.n * r.k; idx++) grad_topk_weights_p[idx] = (float)dprobs[idx];
    for (size_t idx = 0; idx < gu; idx++) grad_gate_up_p[idx] = (float)dw1[idx];
    for (size_t idx = 0; idx < dn; idx++) grad_down_p[idx] = (float)dw2[idx];

    mm_aligned_free(mem);
    mm_ref_release(&r);
    return MEGAMOE_OK;
}
