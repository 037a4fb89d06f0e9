/* mega_moe from C on 2 ranks (include/megamoe/serve.h): a bf16 call checked against a plain C
 * model of the math, a zero-token rank, an argument error on one rank reaching both before any
 * data moves (and the next call working), destroy and use after destroy. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness/harness.h"
#include "megamoe/comm.h"
#include "megamoe/serve.h"

enum { H = 64, I = 32, E = 4, K = 2, NMAX = 8, W = 2, L = E / W };

static megamoe_comm_t *g_world;
static uint16_t g_w1[E][H * 2 * I], g_w2[E][I * H];

static megamoe_comm_t *world(void)
{
    if (g_world == NULL) {
        megamoe_comm_params_t p = megamoe_comm_params_default();
        p.heap_size = 64u << 20;
        p.timeout_sec = (int)(30 * mm_test_timeout_multiplier());
        if (megamoe_comm_create(&p, &g_world) != MEGAMOE_OK) return NULL;
    }
    return g_world;
}

static float frand(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xFFFF) / 65536.0f - 0.5f;
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

typedef struct {
    int n;
    uint16_t x[NMAX * H];
    int32_t ids[NMAX * K];
    float w[NMAX * K];
} tokens_t;

static void make_tokens(int rank, int n, tokens_t *t)
{
    uint32_t s = 77u + (uint32_t)rank;
    t->n = n;
    for (int i = 0; i < n * H; i++) t->x[i] = megamoe_fp32_to_bf16(frand(&s) * 2.0f);
    for (int i = 0; i < n; i++) {
        t->ids[i * K] = (i + rank) % E;
        t->ids[i * K + 1] = (i * 3 + 1 + rank) % E;
        if (t->ids[i * K + 1] == t->ids[i * K]) t->ids[i * K + 1] = (t->ids[i * K] + 1) % E;
        for (int k = 0; k < K; k++) t->w[i * K + k] = 0.25f + 0.5f * frand(&s);
    }
}

/* y = sum_k w * (silu(x W1_g) * (x W1_u)) W2 in fp64 */
static void model(const tokens_t *t, float *y)
{
    for (int i = 0; i < t->n; i++) {
        double acc[H] = {0};
        for (int k = 0; k < K; k++) {
            int e = t->ids[i * K + k];
            double h[2 * I] = {0}, a[I];
            for (int c = 0; c < 2 * I; c++)
                for (int j = 0; j < H; j++)
                    h[c] += (double)megamoe_bf16_to_fp32(t->x[i * H + j]) *
                            megamoe_bf16_to_fp32(g_w1[e][j * 2 * I + c]);
            for (int c = 0; c < I; c++) a[c] = h[c] / (1.0 + exp(-h[c])) * h[I + c];
            for (int o = 0; o < H; o++) {
                double f = 0;
                for (int c = 0; c < I; c++) f += a[c] * megamoe_bf16_to_fp32(g_w2[e][c * H + o]);
                acc[o] += t->w[i * K + k] * f;
            }
        }
        for (int o = 0; o < H; o++) y[i * H + o] = (float)acc[o];
    }
}

static megamoe_status_t call(megamoe_symm_buffer_t *b, tokens_t *t, uint16_t *y, int32_t *etn,
                             int break_ids)
{
    int r = mm_test_rank();
    megamoe_tensor_t w1[L], w2[L];
    for (int j = 0; j < L; j++) {
        w1[j] = tens(g_w1[r * L + j], MEGAMOE_DTYPE_BF16, 2, H, 2 * I);
        w2[j] = tens(g_w2[r * L + j], MEGAMOE_DTYPE_BF16, 2, I, H);
    }
    megamoe_mega_moe_args_t a = megamoe_mega_moe_args_default();
    a.x = tens(t->x, MEGAMOE_DTYPE_BF16, 2, t->n, H);
    a.topk_ids = tens(break_ids ? NULL : t->ids, MEGAMOE_DTYPE_INT32, 2, t->n, K);
    a.topk_weights = tens(t->w, MEGAMOE_DTYPE_FP32, 2, t->n, K);
    a.l1_weights = (megamoe_tensor_list_t){L, w1};
    a.l2_weights = (megamoe_tensor_list_t){L, w2};
    a.y = tens(y, MEGAMOE_DTYPE_BF16, 2, t->n, H);
    a.expert_token_nums = tens(etn, MEGAMOE_DTYPE_INT32, 1, L, 0);
    return megamoe_mega_moe(b, &a);
}

static int check(const tokens_t *t, const uint16_t *y)
{
    float got[NMAX * H], want[NMAX * H];
    model(t, want);
    for (int i = 0; i < t->n * H; i++) got[i] = megamoe_bf16_to_fp32(y[i]);
    return t->n == 0 || mm_test_allclose("y", got, want, (size_t)(t->n * H), 2e-2, 2e-3);
}

MM_TEST(bf16_calls_errors_destroy)
{
    ASSERT_TRUE(world() != NULL);
    ASSERT_EQ_INT(megamoe_comm_size(world()), W);
    uint32_t s = 5;
    for (int e = 0; e < E; e++) {
        for (int i = 0; i < H * 2 * I; i++) g_w1[e][i] = megamoe_fp32_to_bf16(frand(&s) * 0.4f);
        for (int i = 0; i < I * H; i++) g_w2[e][i] = megamoe_fp32_to_bf16(frand(&s) * 0.4f);
    }
    megamoe_symm_buffer_params_t p = megamoe_symm_buffer_params_default();
    p.num_experts = E;
    p.num_max_tokens_per_rank = NMAX;
    p.num_topk = K;
    p.hidden = H;
    p.intermediate_hidden = 2 * I;
    megamoe_symm_buffer_t *b = NULL;
    ASSERT_OK(megamoe_symm_buffer_create(world(), &p, &b));
    megamoe_symm_buffer_info_t info;
    ASSERT_OK(megamoe_symm_buffer_get_info(b, &info));
    ASSERT_EQ_INT(info.local_experts, L);
    ASSERT_EQ_INT(info.max_recv_rows, NMAX * W * K);

    const int r = mm_test_rank();
    tokens_t t;
    uint16_t y[NMAX * H];
    int32_t etn[L];
    for (int round = 0; round < 3; round++) {
        /* round 1: rank 0 has no tokens; round 2: rank 1 passes no topk_ids */
        make_tokens(r, round == 1 && r == 0 ? 0 : 5 + r, &t);
        megamoe_status_t st = call(b, &t, y, etn, round == 2 && r == 1);
        if (round == 2) {
            ASSERT_EQ_INT(st, MEGAMOE_INVALID_ARGUMENT);
            ASSERT_TRUE(strstr(megamoe_last_error(), "topk_ids") != NULL);
            if (r == 0) ASSERT_TRUE(strstr(megamoe_last_error(), "rank 1:") != NULL);
            make_tokens(r, 3, &t); /* the next call works */
            ASSERT_OK(call(b, &t, y, etn, 0));
        } else {
            ASSERT_OK(st);
        }
        ASSERT_TRUE(check(&t, y));
        /* expert_token_nums: every rank's pairs for this rank's experts */
        for (int j = 0; j < L; j++) {
            int want = 0;
            for (int q = 0; q < W; q++) {
                tokens_t o;
                int n = round == 1 && q == 0 ? 0 : (round == 2 ? 3 : 5 + q);
                make_tokens(q, n, &o);
                for (int i = 0; i < n * K; i++) want += o.ids[i] == r * L + j;
            }
            ASSERT_EQ_INT(etn[j], want);
        }
    }
    ASSERT_OK(megamoe_symm_buffer_destroy(b));
    ASSERT_OK(megamoe_symm_buffer_destroy(b)); /* idempotent */
    ASSERT_EQ_INT(call(b, &t, y, etn, 0), MEGAMOE_INVALID_ARGUMENT);
    megamoe_symm_buffer_free(b);
    ASSERT_OK(megamoe_comm_destroy(g_world));
    g_world = NULL;
}
