/* A failed one-sided transfer inside a mega_moe call reaches the call's status on every rank,
 * never an OK with wrong numbers and never a hang (the RMA rule of issue 30, for the serving
 * operator). Run by `megamoe launch -n 3` with MEGAMOE_SHMEM_INTRA_HOST=engine (every transfer
 * goes through mm_shmem_put/get/signal, as between hosts), one case per launch; the failure is
 * injected on rank 1 with the shmem test seam at the middle transfer of its kind:
 *   dispatch_put       transient (IO): every rank fails the call with IO; the next call works
 *                      and gives the clean run's bits
 *   dispatch_put_lost  a broken connection at rank 1's first put: every rank fails with
 *                      PEER_LOST
 *   late_put_lost_K    a broken connection at rank 1's K-th put from the end (1, 2: its DONE
 *                      status slots; 3: its last result put on the O1 schedule): rank 1 fails
 *                      with PEER_LOST; another rank may have had every result before the loss
 *                      and returns OK with the clean bits, else PEER_LOST. Then teardown on
 *                      every rank returns at once with OK or PEER_LOST (an OK rank destroys
 *                      its buffer collectively first): a member that tore down locally must
 *                      not leave the others' last release waiting out the runtime timeout.
 *   signal             a transient signal failure is retried: the call is OK, the clean bits
 *   combine_get        (host schedule) transient: the rank whose get failed fails (IO) and
 *                      writes nothing, the others are OK (their results are complete); the next
 *                      call works
 *   result_put         (O1 schedule: owners put the results back to sources on other hosts)
 *                      transient, at rank 1's last result put (its last two puts are its DONE
 *                      status slots): every rank fails with IO naming rank 1; the next call
 *                      works and gives the clean bits. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "harness/harness.h"
#include "megamoe/comm.h"
#include "megamoe/serve.h"
#include "shmem/shmem.h"

enum { H = 64, I = 32, E = 6, K = 2, N = 9, W = 3, L = E / W };

static uint16_t g_w1[E][H * 2 * I], g_w2[E][I * H];

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

static uint16_t g_x[N * H];
static int32_t g_ids[N * K];
static float g_w[N * K];

static megamoe_status_t call(megamoe_symm_buffer_t *b, uint16_t *y)
{
    const int r = mm_test_rank();
    megamoe_tensor_t w1[L], w2[L];
    for (int j = 0; j < L; j++) {
        w1[j] = tens(g_w1[r * L + j], MEGAMOE_DTYPE_BF16, 2, H, 2 * I);
        w2[j] = tens(g_w2[r * L + j], MEGAMOE_DTYPE_BF16, 2, I, H);
    }
    int32_t etn[L];
    megamoe_mega_moe_args_t a = megamoe_mega_moe_args_default();
    a.x = tens(g_x, MEGAMOE_DTYPE_BF16, 2, N, H);
    a.topk_ids = tens(g_ids, MEGAMOE_DTYPE_INT32, 2, N, K);
    a.topk_weights = tens(g_w, MEGAMOE_DTYPE_FP32, 2, N, K);
    a.l1_weights = (megamoe_tensor_list_t){L, w1};
    a.l2_weights = (megamoe_tensor_list_t){L, w2};
    a.y = tens(y, MEGAMOE_DTYPE_BF16, 2, N, H);
    a.expert_token_nums = tens(etn, MEGAMOE_DTYPE_INT32, 1, L, 0);
    return megamoe_mega_moe(b, &a);
}

static void run_case(const char *g_case)
{
    const int me = mm_test_rank();
    ASSERT_EQ_INT(mm_test_world(), W);
    uint32_t s = 11;
    for (int e = 0; e < E; e++) {
        for (int i = 0; i < H * 2 * I; i++) g_w1[e][i] = megamoe_fp32_to_bf16(frand(&s) * 0.4f);
        for (int i = 0; i < I * H; i++) g_w2[e][i] = megamoe_fp32_to_bf16(frand(&s) * 0.4f);
    }
    s = 100u + (uint32_t)me;
    for (int i = 0; i < N * H; i++) g_x[i] = megamoe_fp32_to_bf16(frand(&s) * 2.0f);
    for (int t = 0; t < N; t++) {
        g_ids[t * K] = (t + me) % E;
        g_ids[t * K + 1] = (t * 5 + 2 + me) % E;
        if (g_ids[t * K + 1] == g_ids[t * K]) g_ids[t * K + 1] = (g_ids[t * K] + 1) % E;
        for (int k = 0; k < K; k++) g_w[t * K + k] = 0.5f + frand(&s);
    }
    megamoe_comm_params_t cp = megamoe_comm_params_default();
    cp.heap_size = 64u << 20;
    megamoe_comm_t *comm = NULL;
    ASSERT_OK(megamoe_comm_create(&cp, &comm));
    megamoe_symm_buffer_params_t p = megamoe_symm_buffer_params_default();
    p.num_experts = E;
    p.num_max_tokens_per_rank = N;
    p.num_topk = K;
    p.hidden = H;
    megamoe_symm_buffer_t *b = NULL;
    ASSERT_OK(megamoe_symm_buffer_create(comm, &p, &b));

    unsigned op = MM_SHMEM_RMA_PUT;
    int lose = 0;
    const int late = !strncmp(g_case, "late_put_lost_", 14) ? atoi(g_case + 14) : 0;
    if (!strcmp(g_case, "dispatch_put_lost") || late) lose = 1;
    else if (!strcmp(g_case, "signal")) op = MM_SHMEM_RMA_SIGNAL;
    else if (!strcmp(g_case, "combine_get")) op = MM_SHMEM_RMA_GET;
    const int result_put = !strcmp(g_case, "result_put");
    /* the clean run, counting rank 1's transfers of the kind */
    uint16_t clean[N * H], y[N * H];
    if (me == 1) mm_shmem_test_fail_rma(op, LONG_MAX, lose);
    ASSERT_OK(call(b, clean));
    unsigned long n = me == 1 ? mm_shmem_test_rma_count(op) : 0;
    if (me == 1) {
        ASSERT_TRUE(n > (result_put ? 3u : late ? (unsigned)late : 0u));
        /* lost: rank 1's first put (a dispatch put: its result puts need rows that arrived
         * from the others; a connection lost that late is learnt by the others only from the
         * monitor's report, after the call) */
        mm_shmem_test_fail_rma(op, result_put ? (long)n - 3 : late ? (long)n - late
                                   : lose ? 0 : (long)n / 2, lose);
    }
    memset(y, 0xAB, sizeof y);
    megamoe_status_t st = call(b, y);
    if (me == 1) {
        ASSERT_TRUE(mm_shmem_test_rma_fired());
        mm_shmem_test_fail_rma(0, 0, 0);
    }
    if (late) {
        fprintf(stderr, "rank %d: the call returned %s\n", me, megamoe_status_name(st));
        ASSERT_TRUE(st == MEGAMOE_PEER_LOST || (st == MEGAMOE_OK && me != 1));
        if (st == MEGAMOE_OK) {
            ASSERT_TRUE(memcmp(y, clean, sizeof y) == 0);
            st = megamoe_symm_buffer_destroy(b); /* collective: meets the loss */
            ASSERT_TRUE(st == MEGAMOE_OK || st == MEGAMOE_PEER_LOST);
        }
        megamoe_symm_buffer_free(b);
        const double t0 = mm_now_s();
        st = megamoe_comm_destroy(comm);
        ASSERT_TRUE(st == MEGAMOE_OK || st == MEGAMOE_PEER_LOST);
        ASSERT_TRUE(mm_now_s() - t0 < 10.0); /* the runtime timeout here is 30 s */
        return;
    }
    if (lose) {
        ASSERT_EQ_INT(st, MEGAMOE_PEER_LOST);
        megamoe_symm_buffer_free(b); /* local after the loss: leaks nothing (LeakSanitizer) */
        st = megamoe_comm_destroy(comm);
        ASSERT_TRUE(st == MEGAMOE_OK || st == MEGAMOE_PEER_LOST);
        return;
    }
    if (!strcmp(g_case, "signal")) {
        ASSERT_OK(st);
        ASSERT_TRUE(memcmp(y, clean, sizeof y) == 0);
    } else if (!strcmp(g_case, "combine_get")) {
        if (me == 1) ASSERT_EQ_INT(st, MEGAMOE_IO);
        else ASSERT_OK(st);
    } else {
        ASSERT_EQ_INT(st, MEGAMOE_IO);
        if (me != 1) ASSERT_TRUE(strstr(megamoe_last_error(), "rank 1") != NULL);
    }
    /* the next call works and gives the clean bits */
    ASSERT_OK(call(b, y));
    ASSERT_TRUE(memcmp(y, clean, sizeof y) == 0);
    ASSERT_OK(megamoe_symm_buffer_destroy(b));
    megamoe_symm_buffer_free(b);
    ASSERT_OK(megamoe_comm_destroy(comm));
}

MM_TEST(dispatch_put) { run_case("dispatch_put"); }
MM_TEST(dispatch_put_lost) { run_case("dispatch_put_lost"); }
MM_TEST(late_put_lost_1) { run_case("late_put_lost_1"); }
MM_TEST(late_put_lost_2) { run_case("late_put_lost_2"); }
MM_TEST(late_put_lost_3) { run_case("late_put_lost_3"); }
MM_TEST(signal) { run_case("signal"); }
MM_TEST(combine_get) { run_case("combine_get"); }
MM_TEST(result_put) { run_case("result_put"); }
