/* Validation of one mega_moe call (spec §4, §5, §8): every argument against the buffer, the
 * scene of the routed and of the shared experts, the resolved activation, and the settings
 * every rank must agree on. Local: the caller takes the status into the call's first
 * exchange, so an error of one rank is every rank's error before any data moves. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "serve/serve_impl.h"

#define MM_SV_BAD(...) mm_error(MEGAMOE_INVALID_ARGUMENT, "mega_moe: " __VA_ARGS__)

static const char *const mm_sv_scene_names[MM_SV_SCENES] = {
    "A16W16", "A8W8-INT", "A8W4-INT", "A8W8-FP", "A8W4-FP", "A4W4-FP"};

const char *mm_sv_scene_name(int scene)
{
    return scene >= 0 && scene < MM_SV_SCENES ? mm_sv_scene_names[scene] : "unknown";
}

static const char *mm_sv_shape(const megamoe_tensor_t *t, char buf[80])
{
    size_t off = 0;
    off += (size_t)snprintf(buf + off, 80 - off, "[");
    for (int i = 0; i < t->ndim && i < MEGAMOE_TENSOR_MAX_DIMS && off < 80; i++)
        off += (size_t)snprintf(buf + off, 80 - off, "%s%lld", i ? ", " : "",
                                (long long)t->shape[i]);
    if (off < 80) snprintf(buf + off, 80 - off, "]");
    return buf;
}

static int mm_sv_is_2d(const megamoe_tensor_t *t, int64_t d0, int64_t d1)
{
    return t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1;
}

/* ---- activation --------------------------------------------------------------------------- */

static megamoe_status_t mm_sv_parse_act(const megamoe_mega_moe_args_t *a, mm_sv_act_t *act,
                                        mm_sv_settings_t *set)
{
    const char *name = a->activation && a->activation[0] ? a->activation : "swiglu";
    int kind = -1;
    if (!strcmp(name, "swiglu")) kind = MM_SV_ACT_SWIGLU;
    else if (!strcmp(name, "swiglustep")) kind = MM_SV_ACT_SWIGLUSTEP;
    else if (!strcmp(name, "swigluoai") || !strcmp(name, "swiglu_gpt_oss")) kind = MM_SV_ACT_SWIGLUOAI;
    else if (!strcmp(name, "situglu") || !strcmp(name, "situ")) kind = MM_SV_ACT_SITUGLU;
    if (kind < 0)
        return MM_SV_BAD("activation '%.64s' is not supported; use \"swiglu\", \"swiglustep\", "
                         "\"swigluoai\" or \"situglu\"", name);
    const int allowed = kind == MM_SV_ACT_SWIGLUOAI ? (MEGAMOE_ACT_ALPHA | MEGAMOE_ACT_BETA)
                        : kind == MM_SV_ACT_SITUGLU ? (MEGAMOE_ACT_BETA | MEGAMOE_ACT_LINEAR_BETA)
                                                    : 0;
    const int ps = a->activation_params_set;
    static const char *const keys[3] = {"alpha", "beta", "linear_beta"};
    for (int i = 0; i < 3; i++)
        if ((ps >> i & 1) && !(allowed >> i & 1))
            return MM_SV_BAD("activation_params key '%s' is not allowed for activation \"%s\" "
                             "(%s)", keys[i], mm_sv_act_name(kind),
                             kind == MM_SV_ACT_SWIGLUOAI ? "allowed: alpha, beta"
                             : kind == MM_SV_ACT_SITUGLU ? "allowed: beta, linear_beta"
                                                         : "it takes no parameters");
    if (ps & ~7) return MM_SV_BAD("activation_params_set 0x%x has unknown bits", ps);
    const double c = a->activation_clamp;
    if (c != c || c < 0)
        return MM_SV_BAD("activation_clamp = %g must be None/0 (no clamp) or > 0", c);
    act->kind = kind;
    act->clamp = c == 0 ? INFINITY : (float)c;
    act->alpha = 1.702f;
    act->beta = 1.0f;
    act->linear_beta = 0.0f;
    if (kind == MM_SV_ACT_SWIGLUOAI) {
        if ((ps & MEGAMOE_ACT_ALPHA) && !isfinite(a->alpha))
            return MM_SV_BAD("activation_params alpha = %g must be finite (swigluoai)", a->alpha);
        if ((ps & MEGAMOE_ACT_BETA) && !isfinite(a->beta))
            return MM_SV_BAD("activation_params beta = %g must be finite (swigluoai)", a->beta);
        if (ps & MEGAMOE_ACT_ALPHA) act->alpha = (float)a->alpha;
        if (ps & MEGAMOE_ACT_BETA) act->beta = (float)a->beta;
    } else if (kind == MM_SV_ACT_SITUGLU) {
        if ((ps & MEGAMOE_ACT_BETA) && !(isfinite(a->beta) && a->beta > 0))
            return MM_SV_BAD("activation_params beta = %g must be finite and > 0 (situglu)",
                             a->beta);
        if ((ps & MEGAMOE_ACT_LINEAR_BETA) && !(isfinite(a->linear_beta) && a->linear_beta > 0))
            return MM_SV_BAD("activation_params linear_beta = %g must be finite and > 0 "
                             "(situglu; leave it out for no linear clamp)", a->linear_beta);
        if (ps & MEGAMOE_ACT_BETA) act->beta = (float)a->beta;
        if (ps & MEGAMOE_ACT_LINEAR_BETA) act->linear_beta = (float)a->linear_beta;
        act->clamp = INFINITY; /* ignored by situglu */
    }
    set->activation = kind;
    set->params_set = ps;
    set->clamp = c;
    set->alpha = (ps & MEGAMOE_ACT_ALPHA) ? a->alpha : 0;
    set->beta = (ps & MEGAMOE_ACT_BETA) ? a->beta : 0;
    set->linear_beta = (ps & MEGAMOE_ACT_LINEAR_BETA) ? a->linear_beta : 0;
    return MEGAMOE_OK;
}

/* ---- weights ------------------------------------------------------------------------------ */

static int mm_sv_list_empty(const megamoe_tensor_list_t *l)
{
    if (l->count <= 0 || l->items == NULL) return 1;
    for (int64_t i = 0; i < l->count; i++)
        if (l->items[i].data != NULL && megamoe_tensor_numel(&l->items[i]) > 0) return 0;
    return 1;
}

/* The logical type of a weight carrier with the caller's weight*_type. */
static megamoe_status_t mm_sv_weight_type(const char *what, int carrier, int given, int *type_p)
{
    int t = -1;
    switch (carrier) {
    case MEGAMOE_DTYPE_BF16:
        if (given == MEGAMOE_SERVE_TYPE_NONE || given == MEGAMOE_SERVE_TYPE_BF16) t = MEGAMOE_SERVE_TYPE_BF16;
        break;
    case MEGAMOE_DTYPE_INT8:
        if (given == MEGAMOE_SERVE_TYPE_NONE || given == MEGAMOE_SERVE_TYPE_INT8) t = MEGAMOE_SERVE_TYPE_INT8;
        else if (given == MEGAMOE_SERVE_TYPE_INT4) t = MEGAMOE_SERVE_TYPE_INT4;
        break;
    case MEGAMOE_DTYPE_INT32:
        if (given == MEGAMOE_SERVE_TYPE_NONE || given == MEGAMOE_SERVE_TYPE_INT4) t = MEGAMOE_SERVE_TYPE_INT4;
        break;
    case MEGAMOE_DTYPE_UINT8:
        if (given == MEGAMOE_SERVE_TYPE_FP8_E4M3FN || given == MEGAMOE_SERVE_TYPE_FP8_E5M2 ||
            given == MEGAMOE_SERVE_TYPE_FP4_E2M1)
            t = given;
        break;
    case MEGAMOE_DTYPE_FP8_E4M3FN:
    case MEGAMOE_DTYPE_FP8_E5M2: {
        int f = carrier == MEGAMOE_DTYPE_FP8_E4M3FN ? MEGAMOE_SERVE_TYPE_FP8_E4M3FN
                                                    : MEGAMOE_SERVE_TYPE_FP8_E5M2;
        if (given == MEGAMOE_SERVE_TYPE_NONE || given == f) t = f;
        break;
    }
    default: break;
    }
    if (t < 0)
        return MM_SV_BAD("%s: a %s tensor with weight type %s is not a weight of any scene "
                         "(bf16; int8; int4 in int32 or int8 carriers; fp8; fp4 in uint8 with "
                         "weight type float4_e2m1fn_x2)",
                         what, megamoe_dtype_name((megamoe_dtype_t)carrier),
                         megamoe_serve_type_name(given));
    *type_p = t;
    return MEGAMOE_OK;
}

/* The 2-D shape (in-memory dims) of one expert's weight of `in` inputs, `out` outputs. */
static void mm_sv_weight_dims(int wtype, int carrier, int64_t in, int64_t out, int64_t *d0,
                              int64_t *d1)
{
    switch (wtype) {
    case MEGAMOE_SERVE_TYPE_INT4:
        *d0 = in;
        *d1 = carrier == MEGAMOE_DTYPE_INT32 ? out / 8 : out / 2;
        return;
    case MEGAMOE_SERVE_TYPE_FP8_E4M3FN:
    case MEGAMOE_SERVE_TYPE_FP8_E5M2:
        *d0 = out;
        *d1 = in;
        return;
    case MEGAMOE_SERVE_TYPE_FP4_E2M1:
        *d0 = out;
        *d1 = in / 2;
        return;
    default:
        *d0 = in;
        *d1 = out;
        return;
    }
}

/* A list of `want` (-1: any >= 1) experts' 2-D tensors or one 3-D stack: the expert count and
 * the per-expert dims. */
static megamoe_status_t mm_sv_list_shape(const char *what, const megamoe_tensor_list_t *l,
                                         int64_t want, int64_t *count, int64_t *d0, int64_t *d1,
                                         int *dtype, int *stacked)
{
    char b[80], b2[80];
    if (l->count <= 0 || l->items == NULL)
        return MM_SV_BAD("%s is required (a list of %s2-D tensors or one 3-D tensor)", what,
                         want > 0 ? "one per local expert: " : "");
    const megamoe_tensor_t *t0 = &l->items[0];
    for (int64_t i = 0; i < l->count; i++)
        if (l->items[i].data == NULL)
            return MM_SV_BAD("%s[%lld] is missing", what, (long long)i);
    if (l->count == 1 && t0->ndim == 3) {
        *count = t0->shape[0];
        *d0 = t0->shape[1];
        *d1 = t0->shape[2];
        *stacked = 1;
    } else {
        for (int64_t i = 0; i < l->count; i++) {
            const megamoe_tensor_t *t = &l->items[i];
            if (t->ndim != 2)
                return MM_SV_BAD("%s[%lld] has shape %s; give one 2-D tensor per expert or a list "
                                 "holding one 3-D tensor [experts, rows, cols]",
                                 what, (long long)i, mm_sv_shape(t, b));
            if (t->dtype != t0->dtype || t->shape[0] != t0->shape[0] || t->shape[1] != t0->shape[1])
                return MM_SV_BAD("%s[%lld] (%s %s) differs from %s[0] (%s %s); every expert's "
                                 "weight has one dtype and shape",
                                 what, (long long)i, megamoe_dtype_name(t->dtype),
                                 mm_sv_shape(t, b), what, megamoe_dtype_name(t0->dtype),
                                 mm_sv_shape(t0, b2));
        }
        *count = l->count;
        *d0 = t0->shape[0];
        *d1 = t0->shape[1];
        *stacked = 0;
    }
    if (want > 0 && *count != want)
        return MM_SV_BAD("%s holds %lld experts but this rank owns %lld local experts (num_experts "
                         "/ group size); pass a list of %lld 2-D tensors or one 3-D tensor with "
                         "dim0 %lld",
                         what, (long long)*count, (long long)want, (long long)want,
                         (long long)want);
    *dtype = t0->dtype;
    return MEGAMOE_OK;
}

/* Per-expert pointers of a tensor list (per expert, or slices of one stack). */
static void mm_sv_list_ptrs(const megamoe_tensor_list_t *l, int count, int stacked,
                            size_t expert_bytes, const void **out)
{
    for (int e = 0; e < count; e++)
        out[e] = stacked ? (const char *)l->items[0].data + (size_t)e * expert_bytes
                         : l->items[e].data;
}

static size_t mm_sv_elem_bytes(int dtype)
{
    size_t s = megamoe_dtype_size((megamoe_dtype_t)dtype);
    return s ? s : 1;
}

/* Scales / biases: `per` values per expert, per expert tensors or one stack. */
static megamoe_status_t mm_sv_per_expert(const char *what, const megamoe_tensor_list_t *l,
                                         int count, int64_t per, const int *dtypes, int n_dtypes,
                                         const void **out, int *dtype_p)
{
    char b[80];
    int dt = l->items[0].dtype, ok = 0;
    for (int i = 0; i < n_dtypes; i++) ok |= dt == dtypes[i];
    if (!ok)
        return MM_SV_BAD("%s has dtype %s; it must be %s", what, megamoe_dtype_name((megamoe_dtype_t)dt),
                         n_dtypes == 1 ? megamoe_dtype_name((megamoe_dtype_t)dtypes[0])
                                       : "float32, or a 64-bit tensor holding the fp32 bits in "
                                         "its low 32 bits");
    for (int64_t i = 0; i < l->count; i++)
        if (l->items[i].data == NULL || (int)l->items[i].dtype != dt)
            return MM_SV_BAD("%s[%lld] is missing or of another dtype than %s[0]", what,
                             (long long)i, what);
    if (l->count == count) {
        for (int e = 0; e < count; e++)
            if (megamoe_tensor_numel(&l->items[e]) != per)
                return MM_SV_BAD("%s[%d] has shape %s (%lld values); each expert needs %lld",
                                 what, e, mm_sv_shape(&l->items[e], b),
                                 (long long)megamoe_tensor_numel(&l->items[e]), (long long)per);
        mm_sv_list_ptrs(l, count, 0, 0, out);
    } else if (l->count == 1) {
        if (megamoe_tensor_numel(&l->items[0]) != per * count || l->items[0].ndim < 2 ||
            l->items[0].shape[0] != count)
            return MM_SV_BAD("%s[0] has shape %s; a stacked tensor needs dim0 = %d experts and "
                             "%lld values per expert",
                             what, mm_sv_shape(&l->items[0], b), count, (long long)per);
        mm_sv_list_ptrs(l, count, 1, (size_t)per * mm_sv_elem_bytes(dt), out);
    } else {
        return MM_SV_BAD("%s holds %lld tensors; give one per expert (%d) or one stacked tensor",
                         what, (long long)l->count, count);
    }
    *dtype_p = dt;
    return MEGAMOE_OK;
}

static int mm_sv_scene_of(int wtype, int atype_given)
{
    switch (wtype) {
    case MEGAMOE_SERVE_TYPE_BF16: return MM_SV_A16W16;
    case MEGAMOE_SERVE_TYPE_INT8: return MM_SV_A8W8_INT;
    case MEGAMOE_SERVE_TYPE_INT4: return MM_SV_A8W4_INT;
    case MEGAMOE_SERVE_TYPE_FP4_E2M1:
        return atype_given == MEGAMOE_SERVE_TYPE_FP4_E2M1 ? MM_SV_A4W4_FP : MM_SV_A8W4_FP;
    default: return MM_SV_A8W8_FP;
    }
}

/* The activation types (dispatch / GMM1 input, GMM2 input) of a scene. */
static void mm_sv_scene_atypes(int scene, int wtype, int *a1, int *a2)
{
    switch (scene) {
    case MM_SV_A16W16: *a1 = *a2 = MEGAMOE_SERVE_TYPE_BF16; return;
    case MM_SV_A8W8_INT:
    case MM_SV_A8W4_INT: *a1 = *a2 = MEGAMOE_SERVE_TYPE_INT8; return;
    case MM_SV_A8W8_FP: *a1 = *a2 = wtype; return;
    case MM_SV_A8W4_FP: *a1 = *a2 = MEGAMOE_SERVE_TYPE_FP8_E4M3FN; return;
    default: *a1 = MEGAMOE_SERVE_TYPE_FP4_E2M1; *a2 = MEGAMOE_SERVE_TYPE_FP8_E4M3FN; return;
    }
}

typedef struct mm_sv_set_args {
    const char *prefix; /* "" or "shared_" */
    const megamoe_tensor_list_t *w1, *w2, *s1, *s2, *b1, *b2;
    int t1, t2;         /* weight1_type, weight2_type */
    int64_t want;       /* L for the routed set; -1 for shared */
    int64_t H;
} mm_sv_set_args_t;

/* Validate one expert set; ptrs has room for 6 * count pointers. */
static megamoe_status_t mm_sv_parse_set(const mm_sv_set_args_t *sa, int atype_given,
                                        mm_sv_experts_t *set, const void **ptrs, int64_t max_count,
                                        int *layout_p)
{
    char n1[48], n2[48], b[80];
    snprintf(n1, sizeof n1, "%sl1_weights", sa->prefix);
    snprintf(n2, sizeof n2, "%sl2_weights", sa->prefix);
    int64_t c1, c2, a0, a1, e0, e1;
    int d1, d2, st1, st2;
    MM_CHECK(mm_sv_list_shape(n1, sa->w1, sa->want, &c1, &a0, &a1, &d1, &st1));
    MM_CHECK(mm_sv_list_shape(n2, sa->w2, sa->want, &c2, &e0, &e1, &d2, &st2));
    if (c1 != c2)
        return MM_SV_BAD("%s holds %lld experts but %s %lld", n1, (long long)c1, n2, (long long)c2);
    if (c1 > max_count || c1 < 1)
        return MM_SV_BAD("%s holds %lld experts (at most %lld)", n1, (long long)c1,
                         (long long)max_count);
    if (d1 != d2)
        return MM_SV_BAD("%s is %s but %s is %s; both layers of the experts have one dtype", n1,
                         megamoe_dtype_name((megamoe_dtype_t)d1), n2,
                         megamoe_dtype_name((megamoe_dtype_t)d2));
    if (sa->t1 != sa->t2)
        return MM_SV_BAD("%sweight1_type (%s) differs from %sweight2_type (%s); they must be equal",
                         sa->prefix, megamoe_serve_type_name(sa->t1), sa->prefix,
                         megamoe_serve_type_name(sa->t2));
    int wt;
    MM_CHECK(mm_sv_weight_type(n1, d1, sa->t1, &wt));
    const int64_t H = sa->H;
    /* I from l1, then the exact shapes of both */
    int64_t two_i;
    switch (wt) {
    case MEGAMOE_SERVE_TYPE_INT4: two_i = a1 * (d1 == MEGAMOE_DTYPE_INT32 ? 8 : 2); break;
    case MEGAMOE_SERVE_TYPE_FP8_E4M3FN:
    case MEGAMOE_SERVE_TYPE_FP8_E5M2:
    case MEGAMOE_SERVE_TYPE_FP4_E2M1: two_i = a0; break;
    default: two_i = a1; break;
    }
    if (two_i < 2 || two_i % 2)
        return MM_SV_BAD("%s has %lld output columns (2I: gate then up); it must be even and >= 2",
                         n1, (long long)two_i);
    const int64_t I = two_i / 2;
    int64_t x0, x1, y0, y1;
    mm_sv_weight_dims(wt, d1, H, 2 * I, &x0, &x1);
    mm_sv_weight_dims(wt, d1, I, H, &y0, &y1);
    const char *orient = (wt == MEGAMOE_SERVE_TYPE_FP8_E4M3FN || wt == MEGAMOE_SERVE_TYPE_FP8_E5M2 ||
                          wt == MEGAMOE_SERVE_TYPE_FP4_E2M1)
                             ? "[out, in]"
                             : "[in, out]";
    if (wt == MEGAMOE_SERVE_TYPE_INT4 && ((2 * I) % (d1 == MEGAMOE_DTYPE_INT32 ? 8 : 2) ||
                                          H % (d1 == MEGAMOE_DTYPE_INT32 ? 8 : 2)))
        return MM_SV_BAD("%s: int4 values packed %d per %s need 2I and H divisible by %d", n1,
                         d1 == MEGAMOE_DTYPE_INT32 ? 8 : 2, megamoe_dtype_name((megamoe_dtype_t)d1),
                         d1 == MEGAMOE_DTYPE_INT32 ? 8 : 2);
    if (wt == MEGAMOE_SERVE_TYPE_FP4_E2M1 && (H % 2 || I % 2))
        return MM_SV_BAD("%s: fp4 weights packed two per byte need even H and I", n1);
    if (a0 != x0 || a1 != x1)
        return MM_SV_BAD("%s has per-expert shape [%lld, %lld]; %s %s weights of hidden %lld "
                         "must be [%lld, %lld] (I = %lld)",
                         n1, (long long)a0, (long long)a1, megamoe_serve_type_name(wt), orient,
                         (long long)H, (long long)x0, (long long)x1, (long long)I);
    if (e0 != y0 || e1 != y1)
        return MM_SV_BAD("%s has per-expert shape [%lld, %lld]; with %s of I = %lld it must be "
                         "[%lld, %lld] (%s %s)",
                         n2, (long long)e0, (long long)e1, n1, (long long)I, (long long)y0,
                         (long long)y1, megamoe_serve_type_name(wt), orient);
    const int count = (int)c1;
    memset(set, 0, sizeof *set);
    set->count = count;
    set->wtype = wt;
    set->H = H;
    set->I = I;
    set->int4_carrier = d1;
    set->w1 = ptrs;
    set->w2 = ptrs + count;
    set->s1 = ptrs + 2 * count;
    set->s2 = ptrs + 3 * count;
    set->b1 = (const float **)(ptrs + 4 * count);
    set->b2 = (const float **)(ptrs + 5 * count);
    const size_t eb = megamoe_dtype_size((megamoe_dtype_t)d1) ? megamoe_dtype_size((megamoe_dtype_t)d1) : 1;
    mm_sv_list_ptrs(sa->w1, count, st1, (size_t)(x0 * x1) * eb, set->w1);
    mm_sv_list_ptrs(sa->w2, count, st2, (size_t)(y0 * y1) * eb, set->w2);
    set->scene = mm_sv_scene_of(wt, atype_given);
    mm_sv_scene_atypes(set->scene, wt, &set->atype, &set->atype2);
    *layout_p = st1 | st2 << 1;

    /* scales */
    char s1n[48], s2n[48], b1n[48], b2n[48];
    snprintf(s1n, sizeof s1n, "%sl1_weights_sf", sa->prefix);
    snprintf(s2n, sizeof s2n, "%sl2_weights_sf", sa->prefix);
    snprintf(b1n, sizeof b1n, "%sl1_bias", sa->prefix);
    snprintf(b2n, sizeof b2n, "%sl2_bias", sa->prefix);
    const int has_s = !mm_sv_list_empty(sa->s1) || !mm_sv_list_empty(sa->s2);
    if (set->scene == MM_SV_A16W16) {
        if (has_s)
            return MM_SV_BAD("%s / %s must be absent for bf16 weights (scene A16W16)", s1n, s2n);
    } else {
        if (mm_sv_list_empty(sa->s1) || mm_sv_list_empty(sa->s2))
            return MM_SV_BAD("%s and %s are required for %s weights (scene %s)", s1n, s2n,
                             megamoe_serve_type_name(wt), mm_sv_scene_name(set->scene));
        int sd1, sd2;
        if (set->scene <= MM_SV_A8W4_INT) {
            static const int okd[2] = {MEGAMOE_DTYPE_FP32, MEGAMOE_DTYPE_INT64};
            MM_CHECK(mm_sv_per_expert(s1n, sa->s1, count, 2 * I, okd, 2, set->s1, &sd1));
            MM_CHECK(mm_sv_per_expert(s2n, sa->s2, count, H, okd, 2, set->s2, &sd2));
            if (sd1 != sd2)
                return MM_SV_BAD("%s is %s but %s is %s; give both scales in one container", s1n,
                                 megamoe_dtype_name((megamoe_dtype_t)sd1), s2n,
                                 megamoe_dtype_name((megamoe_dtype_t)sd2));
            set->sf_kind = sd1 == MEGAMOE_DTYPE_FP32 ? MM_SV_SF_FP32 : MM_SV_SF_LOW32;
        } else {
            static const int okd[2] = {MEGAMOE_DTYPE_UINT8, MEGAMOE_DTYPE_E8M0};
            const int64_t per1 = 2 * I * 2 * ((H + 63) / 64), per2 = H * 2 * ((I + 63) / 64);
            MM_CHECK(mm_sv_per_expert(s1n, sa->s1, count, per1, okd, 2, set->s1, &sd1));
            MM_CHECK(mm_sv_per_expert(s2n, sa->s2, count, per2, okd, 2, set->s2, &sd2));
            set->sf_kind = MM_SV_SF_E8M0;
        }
    }
    /* biases */
    const int has_b = !mm_sv_list_empty(sa->b1) || !mm_sv_list_empty(sa->b2);
    if (sa->want < 0 && has_b)
        return MM_SV_BAD("%s / %s are not supported (as in CANN); leave them None", b1n, b2n);
    for (int e = 0; e < count; e++) set->b1[e] = set->b2[e] = NULL;
    if (set->scene == MM_SV_A8W4_INT && sa->want > 0) {
        if (mm_sv_list_empty(sa->b1) || mm_sv_list_empty(sa->b2))
            return MM_SV_BAD("%s and %s (fp32, the compensation of the int4 product: 8 * "
                             "colsum(V * scale) for plain int4 weights) are required with int4 "
                             "weights (scene A8W4-INT)", b1n, b2n);
        static const int okb[1] = {MEGAMOE_DTYPE_FP32};
        int bd;
        MM_CHECK(mm_sv_per_expert(b1n, sa->b1, count, 2 * I, okb, 1, (const void **)set->b1, &bd));
        MM_CHECK(mm_sv_per_expert(b2n, sa->b2, count, H, okb, 1, (const void **)set->b2, &bd));
    } else if (has_b) { /* (shared int4 experts: the plain int8 x int4 product, no bias) */
        return MM_SV_BAD("%s / %s are only used by int4 weights (scene A8W4-INT); they must be "
                         "absent for %s", b1n, b2n, mm_sv_scene_name(set->scene));
    }
    (void)b;
    return MEGAMOE_OK;
}

/* ---- the call ----------------------------------------------------------------------------- */

static int mm_sv_quant_fits(int scene, int wtype, int64_t mode, int out)
{
    switch (scene) {
    case MM_SV_A16W16: return mode == 0 && out == MEGAMOE_SERVE_TYPE_NONE;
    case MM_SV_A8W8_INT:
    case MM_SV_A8W4_INT:
        return mode == 2 && (out == MEGAMOE_SERVE_TYPE_NONE || out == MEGAMOE_SERVE_TYPE_INT8);
    case MM_SV_A8W8_FP: return mode == 4 && out == wtype;
    case MM_SV_A8W4_FP: return mode == 4 && out == MEGAMOE_SERVE_TYPE_FP8_E4M3FN;
    default: return mode == 4 && out == MEGAMOE_SERVE_TYPE_FP4_E2M1;
    }
}

static const char *mm_sv_scene_needs(int scene)
{
    switch (scene) {
    case MM_SV_A16W16: return "dispatch_quant_mode 0 and dispatch_quant_out_dtype None";
    case MM_SV_A8W8_INT:
    case MM_SV_A8W4_INT: return "dispatch_quant_mode 2 and dispatch_quant_out_dtype int8 (or None)";
    case MM_SV_A8W8_FP: return "dispatch_quant_mode 4 and dispatch_quant_out_dtype = the weights' fp8 type";
    case MM_SV_A8W4_FP: return "dispatch_quant_mode 4 and dispatch_quant_out_dtype float8_e4m3fn";
    default: return "dispatch_quant_mode 4 and dispatch_quant_out_dtype float4_e2m1fn_x2";
    }
}

megamoe_status_t mm_sv_args(megamoe_symm_buffer_t *b, const megamoe_mega_moe_args_t *a,
                            mm_sv_call_t *c)
{
    char s[80];
    memset(c, 0, sizeof *c);
    if (a == NULL) return MM_SV_BAD("args is NULL");
    const int64_t H = b->p.hidden, K = b->p.num_topk, E = b->p.num_experts, L = b->L;
    c->H = H;
    c->K = K;
    c->E = E;
    c->L = L;
    const int64_t mode = b->p.dispatch_quant_mode;
    const int out = b->p.dispatch_quant_out_dtype;
    if (mode != 0 && mode != 2 && mode != 4)
        return MM_SV_BAD("the buffer's dispatch_quant_mode = %lld is not supported; use 0 (none), "
                         "2 (per-token int8) or 4 (MX)", (long long)mode);
    if (mode == 0 && out != MEGAMOE_SERVE_TYPE_NONE)
        return MM_SV_BAD("dispatch_quant_mode 0 with dispatch_quant_out_dtype %s is the pass-through "
                         "scene (x already quantised): not implemented yet (phase 3); set "
                         "dispatch_quant_out_dtype None", megamoe_serve_type_name(out));
    /* x */
    const megamoe_tensor_t *x = &a->x;
    if (x->data == NULL) return MM_SV_BAD("x is required: bf16 [n, hidden]");
    if (x->ndim != 2 || x->dtype != MEGAMOE_DTYPE_BF16 || x->shape[1] != H)
        return MM_SV_BAD("x is %s %s; it must be bf16 [n, %lld] (hidden = %lld)",
                         megamoe_dtype_name(x->dtype), mm_sv_shape(x, s), (long long)H,
                         (long long)H);
    const int64_t n = x->shape[0];
    if (n < 0) return MM_SV_BAD("x has %lld rows", (long long)n);
    if (b->p.num_max_tokens_per_rank > 0 && n > b->p.num_max_tokens_per_rank)
        return MM_SV_BAD("x has %lld tokens but the buffer's num_max_tokens_per_rank is %lld",
                         (long long)n, (long long)b->p.num_max_tokens_per_rank);
    c->n = n;
    c->x = x->data;
    if (a->topk_ids.data == NULL || !mm_sv_is_2d(&a->topk_ids, n, K) ||
        (a->topk_ids.dtype != MEGAMOE_DTYPE_INT32 && a->topk_ids.dtype != MEGAMOE_DTYPE_INT64))
        return MM_SV_BAD("topk_ids is %s %s; it must be int32 (or int64) [n, num_topk] = [%lld, "
                         "%lld]", a->topk_ids.data ? megamoe_dtype_name(a->topk_ids.dtype) : "absent",
                         mm_sv_shape(&a->topk_ids, s), (long long)n, (long long)K);
    if (a->topk_weights.data == NULL || !mm_sv_is_2d(&a->topk_weights, n, K) ||
        (a->topk_weights.dtype != MEGAMOE_DTYPE_FP32 && a->topk_weights.dtype != MEGAMOE_DTYPE_BF16))
        return MM_SV_BAD("topk_weights is %s %s; it must be float32 (or bf16) [n, num_topk] = "
                         "[%lld, %lld]",
                         a->topk_weights.data ? megamoe_dtype_name(a->topk_weights.dtype) : "absent",
                         mm_sv_shape(&a->topk_weights, s), (long long)n, (long long)K);
    c->ids = a->topk_ids.data;
    c->ids_dtype = a->topk_ids.dtype;
    c->weights = a->topk_weights.data;
    c->w_dtype = a->topk_weights.dtype;
    if (a->x_active_mask.data != NULL) {
        const megamoe_tensor_t *m = &a->x_active_mask;
        if (m->ndim != 1 || m->shape[0] != n ||
            (m->dtype != MEGAMOE_DTYPE_INT8 && m->dtype != MEGAMOE_DTYPE_BOOL &&
             m->dtype != MEGAMOE_DTYPE_UINT8))
            return MM_SV_BAD("x_active_mask is %s %s; it must be int8 (or bool) [n] = [%lld]",
                             megamoe_dtype_name(m->dtype), mm_sv_shape(m, s), (long long)n);
        c->active = m->data;
    }
    if (a->scales.data != NULL)
        return MM_SV_BAD("scales is only used by the pass-through scene (dispatch_quant_mode 0 with "
                         "an fp8/fp4 dispatch_quant_out_dtype); leave it None");
    MM_CHECK(mm_sv_parse_act(a, &c->act, &c->set));

    /* routed experts */
    void *pr = NULL;
    MM_CHECK(mm_sv_scratch(b, 0, sizeof(void *) * 6 * (size_t)L, &pr));
    mm_sv_set_args_t ra = {"", &a->l1_weights, &a->l2_weights, &a->l1_weights_sf,
                           &a->l2_weights_sf, &a->l1_bias, &a->l2_bias, a->weight1_type,
                           a->weight2_type, L, H};
    int layout = 0;
    MM_CHECK(mm_sv_parse_set(&ra, out, &c->routed, (const void **)pr, L, &layout));
    if (!mm_sv_quant_fits(c->routed.scene, c->routed.wtype, mode, out))
        return MM_SV_BAD("the buffer's dispatch_quant_mode %lld / dispatch_quant_out_dtype %s do "
                         "not match %s weights: scene %s needs %s (assign the buffer's attributes "
                         "before the call)",
                         (long long)mode, megamoe_serve_type_name(out),
                         megamoe_serve_type_name(c->routed.wtype),
                         mm_sv_scene_name(c->routed.scene), mm_sv_scene_needs(c->routed.scene));
    /* shared experts */
    const int has_shared = !mm_sv_list_empty(&a->shared_l1_weights) ||
                           !mm_sv_list_empty(&a->shared_l2_weights);
    if (has_shared) {
        int64_t sc = a->shared_l1_weights.count;
        if (sc == 1 && a->shared_l1_weights.items && a->shared_l1_weights.items[0].ndim == 3)
            sc = a->shared_l1_weights.items[0].shape[0];
        if (sc < 1 || sc > 1024) return MM_SV_BAD("shared_l1_weights: %lld shared experts (1..1024)", (long long)sc);
        void *ps = NULL;
        MM_CHECK(mm_sv_scratch(b, 1, sizeof(void *) * 6 * (size_t)sc, &ps));
        int sq = a->shared_expert_quant_out_dtype;
        mm_sv_set_args_t sa = {"shared_", &a->shared_l1_weights, &a->shared_l2_weights,
                               &a->shared_l1_weights_sf, &a->shared_l2_weights_sf,
                               &a->shared_l1_bias, &a->shared_l2_bias, a->shared_weight1_type,
                               a->shared_weight2_type, -1, H};
        int sl = 0;
        /* fp4 shared weights are A4W4 when asked for, or when the routed tokens travel as fp4 */
        int hint = sq != MEGAMOE_SERVE_TYPE_NONE ? sq : c->routed.atype;
        MM_CHECK(mm_sv_parse_set(&sa, hint, &c->shared, (const void **)ps, sc, &sl));
        if (sq != MEGAMOE_SERVE_TYPE_NONE && sq != c->shared.atype)
            return MM_SV_BAD("shared_expert_quant_out_dtype %s does not fit the shared experts' %s "
                             "weights (scene %s quantises activations to %s); leave it None",
                             megamoe_serve_type_name(sq), megamoe_serve_type_name(c->shared.wtype),
                             mm_sv_scene_name(c->shared.scene),
                             megamoe_serve_type_name(c->shared.atype));
        c->set.sh_scene = c->shared.scene;
        c->set.sh_wtype = c->shared.wtype;
        c->set.sh_count = c->shared.count;
        c->set.sh_atype = c->shared.atype;
        c->set.sh_I = c->shared.I;
    } else {
        if (!mm_sv_list_empty(&a->shared_l1_bias) || !mm_sv_list_empty(&a->shared_l2_bias))
            return MM_SV_BAD("shared_l1_bias / shared_l2_bias are not supported (as in CANN); "
                             "leave them None");
        if (!mm_sv_list_empty(&a->shared_l1_weights_sf) || !mm_sv_list_empty(&a->shared_l2_weights_sf))
            return MM_SV_BAD("shared_l1_weights_sf / shared_l2_weights_sf given without shared "
                             "experts");
        c->set.sh_scene = -1;
    }
    /* outputs */
    if (a->y.data == NULL || a->y.dtype != MEGAMOE_DTYPE_BF16 || !mm_sv_is_2d(&a->y, n, H))
        return MM_SV_BAD("output y is %s %s; it must be bf16 [%lld, %lld]",
                         a->y.data ? megamoe_dtype_name(a->y.dtype) : "absent",
                         mm_sv_shape(&a->y, s), (long long)n, (long long)H);
    if (a->expert_token_nums.data == NULL || a->expert_token_nums.dtype != MEGAMOE_DTYPE_INT32 ||
        a->expert_token_nums.ndim != 1 || a->expert_token_nums.shape[0] != L)
        return MM_SV_BAD("output expert_token_nums is %s %s; it must be int32 [%lld]",
                         a->expert_token_nums.data ? megamoe_dtype_name(a->expert_token_nums.dtype)
                                                   : "absent",
                         mm_sv_shape(&a->expert_token_nums, s), (long long)L);
    c->y = a->y.data;
    c->expert_token_nums = a->expert_token_nums.data;
    c->set.quant_mode = (int32_t)mode;
    c->set.quant_out = out;
    c->set.scene = c->routed.scene;
    c->set.wtype = c->routed.wtype;
    c->set.count = c->routed.count;
    c->set.layout = layout;
    c->set.H = H;
    c->set.I = c->routed.I;
    c->set.combine_quant_mode = (int32_t)b->p.combine_quant_mode;
    return MEGAMOE_OK;
}

megamoe_status_t mm_sv_settings_agree(const mm_sv_settings_t *const *all, const int *wr, int n)
{
    const mm_sv_settings_t *r = all[0];
    for (int i = 1; i < n; i++) {
        const mm_sv_settings_t *o = all[i];
#define MM_SV_DIFF(field, label, fmt, conv)                                                       \
        if (memcmp(&o->field, &r->field, sizeof r->field) != 0)                                   \
            return mm_error(MEGAMOE_INVALID_ARGUMENT,                                             \
                            "mega_moe: %s differs between ranks: rank %d passed " fmt             \
                            ", rank %d passed " fmt "; every rank passes the same (only n, the "   \
                            "tokens and x_active_mask may differ)",                               \
                            label, wr[0], conv(r->field), wr[i], conv(o->field));
#define MM_SV_I(v) (long long)(v)
#define MM_SV_D(v) (double)(v)
        MM_SV_DIFF(activation, "activation", "%s", mm_sv_act_name)
        MM_SV_DIFF(params_set, "the set of activation_params keys", "0x%llx", MM_SV_I)
        MM_SV_DIFF(clamp, "activation_clamp", "%g", MM_SV_D)
        MM_SV_DIFF(alpha, "activation_params alpha", "%g", MM_SV_D)
        MM_SV_DIFF(beta, "activation_params beta", "%g", MM_SV_D)
        MM_SV_DIFF(linear_beta, "activation_params linear_beta", "%g", MM_SV_D)
        MM_SV_DIFF(quant_mode, "the buffer's dispatch_quant_mode", "%lld", MM_SV_I)
        MM_SV_DIFF(quant_out, "the buffer's dispatch_quant_out_dtype", "%s", megamoe_serve_type_name)
        MM_SV_DIFF(wtype, "the routed weights' type", "%s", megamoe_serve_type_name)
        MM_SV_DIFF(scene, "the routed scene", "%s", mm_sv_scene_name)
        MM_SV_DIFF(I, "the routed experts' intermediate size I", "%lld", MM_SV_I)
        MM_SV_DIFF(sh_count, "the number of shared experts", "%lld", MM_SV_I)
        MM_SV_DIFF(sh_wtype, "the shared weights' type", "%s", megamoe_serve_type_name)
        MM_SV_DIFF(sh_scene, "the shared scene", "%s", mm_sv_scene_name)
        MM_SV_DIFF(sh_I, "the shared experts' intermediate size", "%lld", MM_SV_I)
        MM_SV_DIFF(sh_atype, "shared_expert_quant_out_dtype", "%s", megamoe_serve_type_name)
        MM_SV_DIFF(combine_quant_mode, "combine_quant_mode", "%lld", MM_SV_I)
        MM_SV_DIFF(schedule, "MEGAMOE_SERVE_SCHEDULE (0 auto, 1 o1, 2 host)", "%lld", MM_SV_I)
#undef MM_SV_DIFF
#undef MM_SV_I
#undef MM_SV_D
    }
    return MEGAMOE_OK;
}
