/* DispatchV2 / CombineV2 from C on 2 ranks: the spec's worked example bit-exact, the identity
 * round trip, a validation error reaching both ranks, and workspace reuse without leaks.
 * The randomised cases against the numpy reference are in test_ops_v2.py. */
#include <stdlib.h>
#include <string.h>

#include "harness/harness.h"
#include "megamoe/comm.h"
#include "megamoe/log.h"
#include "megamoe/ops.h"
#include "shmem/shmem.h"

static megamoe_comm_t *g_world;

static megamoe_comm_t *world(void)
{
    if (g_world == NULL) {
        megamoe_comm_params_t p = megamoe_comm_params_default();
        p.heap_size = 256u << 20;
        p.timeout_sec = (int)(30 * mm_test_timeout_multiplier());
        if (megamoe_comm_create(&p, &g_world) != MEGAMOE_OK) return NULL;
    }
    return g_world;
}

static megamoe_tensor_t tens(void *data, megamoe_dtype_t t, int ndim, int64_t d0, int64_t d1)
{
    megamoe_tensor_t x = megamoe_tensor_none();
    x.data = data;
    x.dtype = t;
    x.ndim = ndim;
    x.shape[0] = d0;
    x.shape[1] = d1;
    return x;
}

enum { H = 16, BS = 2, K = 2, E = 4 };

/* x[t][h] of rank r: distinct bf16 values. */
static uint16_t xval(int r, int t, int h)
{
    return megamoe_fp32_to_bf16((float)(r * 100 + t * 10 + h) * 0.125f + 0.5f);
}

typedef struct {
    uint16_t x[BS * H];
    int32_t ids[BS * K];
    float ws[BS * K];
    uint16_t *expand_x;
    float *dyn;
    int32_t *assist;
    int64_t tok[E];
    int32_t counts[E * 2];
    float *escales;
    megamoe_dispatch_v2_args_t a;
} example_t;

static int example_dispatch(example_t *ex, int ent_type)
{
    int r = mm_test_rank();
    static const int32_t ids[2][BS * K] = {{1, 2, 0, 1}, {1, 3, 2, 1}};
    for (int t = 0; t < BS; t++)
        for (int h = 0; h < H; h++) ex->x[t * H + h] = xval(r, t, h);
    memcpy(ex->ids, ids[r], sizeof ex->ids);
    for (int i = 0; i < BS * K; i++) ex->ws[i] = 0.25f + 0.5f * (float)i + (float)r;
    megamoe_dispatch_v2_args_t *a = &ex->a;
    *a = megamoe_dispatch_v2_args_default();
    a->x = tens(ex->x, MEGAMOE_DTYPE_BF16, 2, BS, H);
    a->expert_ids = tens(ex->ids, MEGAMOE_DTYPE_INT32, 2, BS, K);
    a->group_ep = world();
    a->ep_world_size = 2;
    a->ep_rank_id = r;
    a->moe_expert_num = E;
    a->expert_token_nums_type = ent_type;
    if (megamoe_dispatch_v2_infer(a) != MEGAMOE_OK) return -1;
    int64_t rows = a->expand_x.shape[0];
    ex->expand_x = calloc((size_t)(rows * H), 2);
    ex->dyn = calloc((size_t)rows, 4);
    ex->assist = calloc((size_t)a->assist_info_for_combine.shape[0], 4);
    ex->escales = calloc((size_t)a->expand_scales.shape[0] + 1, 4);
    memset(ex->expand_x, 0x5a, (size_t)(rows * H) * 2); /* must be zeroed past the rows */
    a->expand_x.data = ex->expand_x;
    a->dynamic_scales.data = ex->dyn;
    a->assist_info_for_combine.data = ex->assist;
    a->expert_token_nums.data = ex->tok;
    a->ep_recv_counts.data = ex->counts;
    a->tp_recv_counts.data = NULL;
    a->expand_scales.data = ex->escales;
    return megamoe_dispatch_v2(a);
}

static void example_free(example_t *ex)
{
    free(ex->expand_x);
    free(ex->dyn);
    free(ex->assist);
    free(ex->escales);
}

MM_TEST(worked_example_bit_exact)
{
    ASSERT_TRUE(world() != NULL);
    int r = mm_test_rank();
    for (int ent = 0; ent < 2; ent++) {
        example_t ex;
        memset(&ex, 0, sizeof ex);
        ASSERT_OK(example_dispatch(&ex, ent));
        /* spec §3.6 worked example (rank 0) and its mirror for rank 1 */
        static const int src[2][5][3] = {{{0, 1, 0}, {0, 0, 0}, {0, 1, 1}, {1, 0, 0}, {1, 1, 1}},
                                         {{0, 0, 1}, {1, 1, 0}, {1, 0, 1}, {0, 0, 0}, {0, 0, 0}}};
        static const int n_rows[2] = {5, 3};
        static const int32_t counts[2][4] = {{1, 1, 3, 5}, {1, 2, 2, 3}};
        static const int64_t tok1[2][2] = {{1, 4}, {2, 1}}, tok0[2][2] = {{1, 5}, {2, 3}};
        ASSERT_EQ_INT(ex.a.expand_x.shape[0], 8); /* A = globalBS * min(L, K) = 4 * 2 */
        for (int i = 0; i < n_rows[r]; i++) {
            int s = src[r][i][0], t = src[r][i][1], k = src[r][i][2];
            for (int h = 0; h < H; h++) ASSERT_EQ_INT(ex.expand_x[i * H + h], xval(s, t, h));
            ASSERT_EQ_INT(ex.assist[3 * i], s);
            ASSERT_EQ_INT(ex.assist[3 * i + 1], t);
            ASSERT_EQ_INT(ex.assist[3 * i + 2], k);
        }
        for (int i = n_rows[r] * H; i < 8 * H; i++) ASSERT_EQ_INT(ex.expand_x[i], 0);
        for (int i = 3 * n_rows[r]; i < ex.a.assist_info_for_combine.shape[0]; i++)
            ASSERT_EQ_INT(ex.assist[i], 0);
        for (int b = 0; b < 4; b++) ASSERT_EQ_INT(ex.counts[b], counts[r][b]);
        for (int e = 0; e < 2; e++) ASSERT_EQ_INT(ex.tok[e], ent ? tok1[r][e] : tok0[r][e]);
        example_free(&ex);
    }
}

MM_TEST(identity_round_trip)
{
    ASSERT_TRUE(world() != NULL);
    example_t ex;
    memset(&ex, 0, sizeof ex);
    ASSERT_OK(example_dispatch(&ex, 1));
    megamoe_combine_v2_args_t c = megamoe_combine_v2_args_default();
    c.expand_x = ex.a.expand_x;
    c.expert_ids = ex.a.expert_ids;
    c.assist_info_for_combine = ex.a.assist_info_for_combine;
    c.ep_send_counts = ex.a.ep_recv_counts;
    c.expert_scales = tens(ex.ws, MEGAMOE_DTYPE_FP32, 2, BS, K);
    c.group_ep = world();
    c.ep_world_size = 2;
    c.ep_rank_id = mm_test_rank();
    c.moe_expert_num = E;
    ASSERT_OK(megamoe_combine_v2_infer(&c));
    uint16_t out[BS * H];
    c.x.data = out;
    ASSERT_OK(megamoe_combine_v2(&c));
    for (int t = 0; t < BS; t++)
        for (int h = 0; h < H; h++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) {
                float p = megamoe_bf16_to_fp32(ex.x[t * H + h]) * ex.ws[t * K + k];
                acc = acc + p;
            }
            ASSERT_EQ_INT(out[t * H + h], megamoe_fp32_to_bf16(acc));
        }
    example_free(&ex);
}

/* What the MX transport (comm_quant_mode 4, docs/ops.md) makes of one bf16 element x of a row
 * whose largest exponent field is E: fp8_e4m3fn(x * 2^(127 - s)) * 2^(s - 127), s = max(E, 8) - 8. */
static float mx_e4m3(uint16_t x, unsigned E)
{
    unsigned s = (E > 8 ? E : 8) - 8;
    float r = 1.0f, back = 1.0f;
    for (unsigned i = 0; i < 127 - s; i++) r *= 2.0f;
    for (unsigned i = 0; i < 127 - s; i++) back *= 0.5f;
    return megamoe_fp8_e4m3fn_to_fp32(megamoe_fp32_to_fp8_e4m3fn(megamoe_bf16_to_fp32(x) * r, 1)) * back;
}

MM_TEST(mx_transport_and_add_rms_norm_comm_alg)
{
    ASSERT_TRUE(world() != NULL);
    example_t ex;
    memset(&ex, 0, sizeof ex);
    ASSERT_OK(example_dispatch(&ex, 1));
    megamoe_combine_add_rms_norm_args_t n = megamoe_combine_add_rms_norm_args_default();
    megamoe_combine_v2_args_t *c = &n.combine;
    c->expand_x = ex.a.expand_x;
    c->expert_ids = ex.a.expert_ids;
    c->assist_info_for_combine = ex.a.assist_info_for_combine;
    c->ep_send_counts = ex.a.ep_recv_counts;
    c->expert_scales = tens(ex.ws, MEGAMOE_DTYPE_FP32, 2, BS, K);
    c->group_ep = world();
    c->ep_world_size = 2;
    c->ep_rank_id = mm_test_rank();
    c->moe_expert_num = E;
    c->comm_quant_mode = 4;
    c->comm_alg = "fullmesh_v1";
    uint16_t resid[BS * H], gamma[H], y[BS * H], xo[BS * H], out[BS * H];
    float rstd[BS];
    for (int i = 0; i < BS * H; i++) resid[i] = megamoe_fp32_to_bf16((float)(i % 5) - 2.0f);
    for (int i = 0; i < H; i++) gamma[i] = megamoe_fp32_to_bf16(1.0f);
    n.residual_x = tens(resid, MEGAMOE_DTYPE_BF16, 3, BS, 1);
    n.residual_x.shape[2] = H;
    n.gamma = tens(gamma, MEGAMOE_DTYPE_BF16, 1, H, 0);
    ASSERT_OK(megamoe_combine_add_rms_norm_infer(&n));
    n.y.data = y;
    n.rstd.data = rstd;
    c->x.data = xo;
    ASSERT_OK(megamoe_combine_add_rms_norm(&n));
    /* plain combine with the same transport (x of [BS, H]) */
    megamoe_combine_v2_args_t p = *c;
    p.x = tens(out, MEGAMOE_DTYPE_BF16, 2, BS, H);
    ASSERT_OK(megamoe_combine_v2(&p));
    for (int t = 0; t < BS; t++) {
        unsigned Emax = 0; /* the token's row is one 16-element block, the same on every expert */
        for (int h = 0; h < H; h++) {
            unsigned e = (ex.x[t * H + h] >> 7) & 0xffu;
            if (e > Emax) Emax = e;
        }
        for (int h = 0; h < H; h++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) {
                float p1 = mx_e4m3(ex.x[t * H + h], Emax) * ex.ws[t * K + k];
                acc = acc + p1;
            }
            ASSERT_EQ_INT(out[t * H + h], megamoe_fp32_to_bf16(acc));
            float sres = acc + megamoe_bf16_to_fp32(resid[t * H + h]);
            ASSERT_EQ_INT(xo[t * H + h], megamoe_fp32_to_bf16(sres));
        }
    }
    example_free(&ex);
}

MM_TEST(invalid_argument_on_one_rank_reaches_both)
{
    ASSERT_TRUE(world() != NULL);
    example_t ex;
    memset(&ex, 0, sizeof ex);
    ASSERT_OK(example_dispatch(&ex, 1));
    megamoe_dispatch_v2_args_t a = ex.a;
    if (mm_test_rank() == 1) a.quant_mode = 7;
    megamoe_status_t st = megamoe_dispatch_v2(&a);
    ASSERT_STATUS(st, MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "quant_mode");
    if (mm_test_rank() == 0) ASSERT_CONTAINS(megamoe_last_error(), "rank 1");
    a = ex.a;
    if (mm_test_rank() == 1) a.zero_expert_num = 3;
    st = megamoe_dispatch_v2(&a);
    ASSERT_STATUS(st, MEGAMOE_CONFIG_MISMATCH);
    ASSERT_CONTAINS(megamoe_last_error(), "zero_expert_num");
    ASSERT_OK(megamoe_dispatch_v2(&ex.a)); /* and the next call works */
    example_free(&ex);
}

/* Workspaces are cached: repeated calls with the same sizes allocate nothing. */
MM_TEST(repeated_calls_do_not_allocate)
{
    ASSERT_TRUE(world() != NULL);
    example_t ex;
    memset(&ex, 0, sizeof ex);
    ASSERT_OK(example_dispatch(&ex, 1));
    mm_shmem_debug_state_t s0, s1;
    ASSERT_OK(mm_shmem_debug_state(&s0));
    for (int i = 0; i < 5; i++) ASSERT_OK(megamoe_dispatch_v2(&ex.a));
    ASSERT_OK(mm_shmem_debug_state(&s1));
    ASSERT_EQ_INT(s1.live_allocations, s0.live_allocations);
    ASSERT_EQ_U64(s1.bytes_used, s0.bytes_used);
    example_free(&ex);
}

/* The output-shape rules (spec §6) can only be broken through the C API. */
MM_TEST(output_shapes_checked_on_every_rank)
{
    ASSERT_TRUE(world() != NULL);
    example_t ex;
    memset(&ex, 0, sizeof ex);
    ASSERT_OK(example_dispatch(&ex, 1));
    static const char *const keys[] = {"expand_x dim 0", "expand_x dim 1", "expand_x dtype",
                                       "dynamic_scales", "assist_info_for_combine",
                                       "expert_token_nums", "ep_recv_counts", "expand_scales"};
    for (int c = 0; c < 8; c++) {
        megamoe_dispatch_v2_args_t a = ex.a;
        float ws[BS * K] = {0};
        if (mm_test_rank() == 1) {
            switch (c) {
            case 0: a.expand_x.shape[0] = 7; break;
            case 1: a.expand_x.shape[1] = H + 1; break;
            case 2: a.expand_x.dtype = MEGAMOE_DTYPE_INT8; break;
            case 3: a.dynamic_scales.shape[0] = 3; break;
            case 4: a.assist_info_for_combine.shape[0] = 3 * 8 - 1; break;
            case 5: a.expert_token_nums.shape[0] = 3; break;
            case 6: a.ep_recv_counts.shape[0] = 3; break;
            default:
                a.expert_scales = tens(ws, MEGAMOE_DTYPE_FP32, 2, BS, K);
                a.expand_scales.shape[0] = 7;
                break;
            }
        }
        ASSERT_STATUS(megamoe_dispatch_v2(&a), MEGAMOE_INVALID_ARGUMENT);
        ASSERT_CONTAINS(megamoe_last_error(), keys[c]);
    }
    ASSERT_OK(megamoe_dispatch_v2(&ex.a));
    example_free(&ex);
}

/* megamoe_quant_mode_info() is the table infer and validation use: every mode's accepted
 * expand_x dtypes give that dtype and its dynamic_scales layout, others are replaced by the
 * mode's default (infer) and rejected (the call). */
MM_TEST(quant_mode_table_drives_infer)
{
    ASSERT_TRUE(world() != NULL);
    example_t ex;
    memset(&ex, 0, sizeof ex);
    ASSERT_OK(example_dispatch(&ex, 1));
    float scales[(E + 0) * H];
    for (int i = 0; i < E * H; i++) scales[i] = 1.0f;
    megamoe_quant_mode_info_t q;
    int n = 0;
    for (; megamoe_quant_mode_info(MEGAMOE_QUANT_DISPATCH, n, &q) == MEGAMOE_OK; n++) {
        for (int t = 0; t < MEGAMOE_DTYPE_COUNT_; t++) {
            megamoe_dispatch_v2_args_t a = ex.a;
            a.quant_mode = q.mode;
            a.scales = q.smoothing == MEGAMOE_SCALES_NONE ? megamoe_tensor_none()
                                                          : tens(scales, MEGAMOE_DTYPE_FP32, 2, E, H);
            a.expand_x.dtype = (megamoe_dtype_t)t;
            a.expand_x.data = NULL; /* infer keeps a fitting dtype, replaces another */
            const int fits = q.same_as_input ? t == MEGAMOE_DTYPE_BF16 : (q.out_dtypes >> t) & 1;
            ASSERT_OK(megamoe_dispatch_v2_infer(&a));
            if (fits) ASSERT_EQ_INT(a.expand_x.dtype, t);
            else ASSERT_TRUE(q.same_as_input ? a.expand_x.dtype == MEGAMOE_DTYPE_BF16
                                             : ((q.out_dtypes >> a.expand_x.dtype) & 1) != 0);
            const int64_t per_row = q.scale_group == 0 ? 0
                                    : q.scale_group < 0 ? 1
                                                        : (H + q.scale_group - 1) / q.scale_group;
            if (a.dynamic_scales.ndim == 2) {
                ASSERT_TRUE(q.scale_group > 0); /* per group / block: [rows, groups (MX: even)] */
                ASSERT_TRUE(a.dynamic_scales.shape[1] >= per_row && a.dynamic_scales.shape[1] <= per_row + 1);
                ASSERT_EQ_INT(a.dynamic_scales.dtype, q.scale_dtype);
            } else {
                ASSERT_EQ_INT(a.dynamic_scales.dtype, MEGAMOE_DTYPE_FP32);
            }
            if (!fits && t != MEGAMOE_DTYPE_BF16) { /* a caller's wrong dtype is refused */
                megamoe_dispatch_v2_args_t b = ex.a;
                b.quant_mode = q.mode;
                b.scales = a.scales;
                b.expand_x.dtype = (megamoe_dtype_t)t;
                megamoe_log_set_level(MEGAMOE_LOG_OFF);
                ASSERT_STATUS(megamoe_dispatch_v2(&b), MEGAMOE_INVALID_ARGUMENT);
                megamoe_log_set_level(MEGAMOE_LOG_WARN);
                ASSERT_CONTAINS(megamoe_last_error(), "does not fit quant_mode");
                ASSERT_CONTAINS(megamoe_last_error(), q.name);
            }
        }
    }
    ASSERT_EQ_INT(n, 5);
    ASSERT_STATUS(megamoe_quant_mode_info(MEGAMOE_QUANT_DISPATCH, n, &q), MEGAMOE_NOT_FOUND);
    int m = 0;
    while (megamoe_quant_mode_info(MEGAMOE_QUANT_COMBINE, m, &q) == MEGAMOE_OK) m++;
    ASSERT_EQ_INT(m, 4); /* 0, 2, 3, 4 */
    ASSERT_STATUS(megamoe_quant_mode_info(7, 0, &q), MEGAMOE_INVALID_ARGUMENT);
    example_free(&ex);
}

MM_TEST(zz_release_then_destroy)
{
    ASSERT_TRUE(world() != NULL);
    mm_shmem_debug_state_t s0, s1;
    ASSERT_OK(mm_shmem_debug_state(&s0));
    ASSERT_TRUE(s0.live_allocations > 0);
    ASSERT_OK(megamoe_ops_release()); /* explicit early release frees the workspaces */
    ASSERT_OK(mm_shmem_debug_state(&s1));
    ASSERT_TRUE(s1.live_allocations < s0.live_allocations);
    /* A later call allocates them again; destroying the last communicator then frees them
     * itself (release hook), no explicit megamoe_ops_release needed. */
    example_t ex;
    memset(&ex, 0, sizeof ex);
    ASSERT_OK(example_dispatch(&ex, 1));
    example_free(&ex);
    ASSERT_OK(megamoe_comm_destroy(g_world));
    g_world = NULL;
    ASSERT_EQ_INT(mm_shmem_is_running(), 0);
}
