/* The O1 static plan (one process): task counts, RATR order (a rotated Latin square across
 * ranks, local expert 0 first), arrival-ordered expert tiles, worker-role rules, and the GEMM
 * property O1's bit-identity with O0 rests on: a product's bits do not depend on how its rows
 * or columns are split into calls, for every backend built here. */
#include <stdlib.h>
#include <string.h>

#include "harness/harness.h"
#include "kernels/gemm.h"
#include "megamoe/dtype.h"
#include "multicore/mc_exec.h"
#include "multicore/mc_plan.h"

static mm_mc_plan_t *mm_plan_r(int ep, int me, int64_t T, int64_t E, int64_t K, int cube,
                               int vector, int R)
{
    mm_mc_shape_t s = {ep, me, T, 64, 32, E, K, cube, vector, NULL, R};
    mm_mc_plan_t *p = NULL;
    if (mm_mc_plan_create(&s, &p) != MEGAMOE_OK) return NULL;
    return p;
}

static mm_mc_plan_t *mm_plan(int ep, int me, int64_t T, int64_t E, int64_t K, int cube, int vector)
{
    mm_mc_shape_t s = {ep, me, T, 64, 32, E, K, cube, vector, NULL, 0};
    mm_mc_plan_t *p = NULL;
    if (mm_mc_plan_create(&s, &p) != MEGAMOE_OK) return NULL;
    return p;
}

MM_TEST(task_counts_and_queue_contents)
{
    mm_mc_plan_t *p = mm_plan(4, 1, 256, 8, 2, 2, 1);
    ASSERT_TRUE(p != NULL);
    ASSERT_EQ_INT(p->L, 2);
    ASSERT_EQ_INT(p->NT, 4); /* T*K / 128 */
    for (int dir = 0; dir < 2; dir++) {
        const mm_mc_graph_t *g = &p->graph[dir];
        ASSERT_EQ_INT(g->n_queue[MM_MC_VECTOR], 8 * 4 + 1 + 2); /* E*NT dispatch, DONE, T/128 */
        ASSERT_EQ_INT(g->n_queue[MM_MC_CUBE], 2 * 4 * 4 + (dir ? 2 * 2 * p->wchunks : 0));
        ASSERT_EQ_INT(g->n_tasks, g->n_queue[0] + g->n_queue[1]);
        ASSERT_EQ_INT(g->n_counted, g->n_tasks - 1 - 2);
        int done_at = -1;
        for (int i = 0; i < g->n_queue[MM_MC_VECTOR]; i++) {
            const mm_mc_task_t *t = &g->tasks[g->queue[MM_MC_VECTOR][i]];
            ASSERT_EQ_INT(t->role, MM_MC_VECTOR);
            if (t->type == MM_MC_DONE) done_at = i;
            if (t->type == MM_MC_REDUCE) ASSERT_TRUE(done_at >= 0 && i > done_at);
            if (t->type == MM_MC_DISPATCH) ASSERT_TRUE(done_at < 0);
        }
        ASSERT_EQ_INT(done_at, 8 * 4);
        for (int i = 0; i < g->n_queue[MM_MC_CUBE]; i++)
            ASSERT_EQ_INT(g->tasks[g->queue[MM_MC_CUBE][i]].role, MM_MC_CUBE);
    }
    mm_mc_plan_destroy(p);
}

/* Per-call token counts: the graphs exist per tile tier 1, 2, 4, ..., NT (T_cap need not be
 * a multiple of 128); a call runs the smallest tier that holds its largest block; every tier
 * has the same task kinds, with nt tile slots per block and TT = ceil(T_cap/128) REDUCE tasks. */
MM_TEST(tile_tiers_for_per_call_counts)
{
    mm_mc_plan_t *p = mm_plan(2, 0, 1000, 4, 3, 1, 1); /* T_cap 1000, K 3: NT = 24 */
    ASSERT_TRUE(p != NULL);
    ASSERT_EQ_INT(p->NT, 24);
    ASSERT_EQ_INT(p->TT, 8);
    ASSERT_EQ_INT(p->n_tiers, 6);
    const int64_t want[6] = {1, 2, 4, 8, 16, 24};
    for (int t = 0; t < 6; t++) ASSERT_EQ_INT(p->tier_nt[t], want[t]);
    ASSERT_TRUE(p->graph == p->tiers[5]);
    ASSERT_EQ_INT(mm_mc_plan_tier(p, 0), 0);
    ASSERT_EQ_INT(mm_mc_plan_tier(p, 1), 0);
    ASSERT_EQ_INT(mm_mc_plan_tier(p, 128), 0);
    ASSERT_EQ_INT(mm_mc_plan_tier(p, 129), 1);
    ASSERT_EQ_INT(mm_mc_plan_tier(p, 257), 2);
    ASSERT_EQ_INT(mm_mc_plan_tier(p, 2048), 4);
    ASSERT_EQ_INT(mm_mc_plan_tier(p, 2049), 5);
    ASSERT_EQ_INT(mm_mc_plan_tier(p, 3000), 5);
    ASSERT_EQ_INT(mm_mc_plan_tier(p, 1 << 30), 5);
    for (int t = 0; t < p->n_tiers; t++)
        for (int dir = 0; dir < 2; dir++) {
            const mm_mc_graph_t *g = &p->tiers[t][dir];
            const int64_t nt = p->tier_nt[t];
            /* S = 2 slots x EP 2 blocks x nt dispatch tiles, DONE, 8 REDUCE */
            ASSERT_EQ_INT(g->n_queue[MM_MC_VECTOR], 2 * 2 * nt + 1 + 8);
            ASSERT_EQ_INT(g->n_queue[MM_MC_CUBE], 2 * 2 * nt + (dir ? 2 * 2 * p->wchunks : 0));
            ASSERT_EQ_INT(g->n_counted, g->n_tasks - 1 - 8);
            const mm_mc_task_t *last = &g->tasks[g->queue[MM_MC_VECTOR][g->n_queue[MM_MC_VECTOR] - 1]];
            ASSERT_EQ_INT(last->type, MM_MC_REDUCE);
            ASSERT_EQ_INT(last->k, 7);
        }
    mm_mc_plan_destroy(p);
    p = mm_plan(2, 1, 1, 2, 1, 1, 0); /* the smallest: one token */
    ASSERT_TRUE(p != NULL);
    ASSERT_EQ_INT(p->NT, 1);
    ASSERT_EQ_INT(p->n_tiers, 1);
    ASSERT_EQ_INT(p->TT, 1);
    mm_mc_plan_destroy(p);
}

/* Reference design §3: rank r sends for j, for k, for i: destination (r + i) mod EP. So at any
 * queue position the ranks' destinations form a permutation, and local expert 0 goes first. */
MM_TEST(ratr_order_is_a_rotated_latin_square)
{
    const int ep = 4;
    mm_mc_plan_t *p[4];
    for (int r = 0; r < ep; r++) ASSERT_TRUE((p[r] = mm_plan(ep, r, 256, 8, 2, 1, 0)) != NULL);
    const mm_mc_graph_t *g0 = &p[0]->graph[MM_MC_FWD];
    const int n_dispatch = (int)(p[0]->s.E * p[0]->NT);
    for (int pos = 0; pos < n_dispatch; pos++) {
        int seen = 0;
        for (int r = 0; r < ep; r++) {
            const mm_mc_graph_t *g = &p[r]->graph[MM_MC_FWD];
            const mm_mc_task_t *t = &g->tasks[g->queue[MM_MC_VECTOR][pos]];
            ASSERT_EQ_INT(t->type, MM_MC_DISPATCH);
            const int i = pos % ep, k = (pos / ep) % (int)p[r]->NT, j = pos / ep / (int)p[r]->NT;
            ASSERT_EQ_INT(t->peer, (r + i) % ep);
            ASSERT_EQ_INT(t->k, k);
            ASSERT_EQ_INT(t->j, j);
            seen |= 1 << t->peer;
        }
        ASSERT_EQ_INT(seen, (1 << ep) - 1); /* no two ranks hit the same destination */
    }
    /* expert tiles: for j, the own block first, then source r-1, r-2, ... (arrival order);
     * backward: expert j's weight gradients (dW2 chunks, then dW1) after expert j+1's tiles */
    for (int r = 0; r < ep; r++) {
        for (int dir = 0; dir < 2; dir++) {
            const mm_mc_graph_t *g = &p[r]->graph[dir];
            const int nt = (int)p[r]->NT, wc = (int)p[r]->wchunks, per = ep * nt;
            int pos = 0, tiles = 0;
            for (int j = 0; j <= (int)p[r]->L; j++) {
                for (int q = 0; j < (int)p[r]->L && q < per; q++, pos++, tiles++) {
                    const mm_mc_task_t *t = &g->tasks[g->queue[MM_MC_CUBE][pos]];
                    ASSERT_EQ_INT(t->type, MM_MC_EXPERT);
                    ASSERT_EQ_INT(t->j, j);
                    ASSERT_EQ_INT(t->peer, (r - q / nt + ep) % ep);
                    ASSERT_EQ_INT(t->k, q % nt);
                }
                for (int c = 0; dir == MM_MC_BWD && j >= 1 && c < 2 * wc; c++, pos++) {
                    const mm_mc_task_t *t = &g->tasks[g->queue[MM_MC_CUBE][pos]];
                    ASSERT_EQ_INT(t->type, c < wc ? MM_MC_WGRAD2 : MM_MC_WGRAD1);
                    ASSERT_EQ_INT(t->j, j - 1);
                    ASSERT_EQ_INT(t->k, c % wc);
                }
            }
            ASSERT_EQ_INT(pos, g->n_queue[MM_MC_CUBE]);
            ASSERT_EQ_INT(tiles, (int)p[r]->L * per);
        }
    }
    (void)g0;
    for (int r = 0; r < ep; r++) mm_mc_plan_destroy(p[r]);
}

/* Across hosts: remote destinations first, still never two ranks on one destination at a step;
 * the own block, then the same host, then the remote sources. */
MM_TEST(ratr_order_across_hosts)
{
    const int ep = 6, host[6] = {0, 0, 0, 1, 1, 1};
    mm_mc_plan_t *p[6];
    for (int r = 0; r < ep; r++) {
        mm_mc_shape_t s = {ep, r, 256, 64, 32, 12, 2, 1, 0, host, 0};
        ASSERT_OK(mm_mc_plan_create(&s, &p[r]));
    }
    for (int step = 0; step < ep; step++) {
        int seen = 0;
        for (int r = 0; r < ep; r++) {
            const mm_mc_graph_t *g = &p[r]->graph[MM_MC_FWD];
            const mm_mc_task_t *t = &g->tasks[g->queue[MM_MC_VECTOR][step]];
            ASSERT_EQ_INT(t->type, MM_MC_DISPATCH);
            ASSERT_EQ_INT(host[t->peer] != host[r], step < 3); /* the other host first */
            seen |= 1 << t->peer;
        }
        ASSERT_EQ_INT(seen, (1 << ep) - 1);
    }
    for (int r = 0; r < ep; r++) {
        const mm_mc_graph_t *g = &p[r]->graph[MM_MC_FWD];
        const int nt = (int)p[r]->NT;
        for (int q = 0; q < ep; q++) {
            const mm_mc_task_t *t = &g->tasks[g->queue[MM_MC_CUBE][q * nt]];
            if (q == 0) ASSERT_EQ_INT(t->peer, r);
            ASSERT_EQ_INT(host[t->peer] != host[r], q >= 3);
        }
    }
    for (int r = 0; r < ep; r++) mm_mc_plan_destroy(p[r]);
}

MM_TEST(worker_roles)
{
    int c, v;
    unsetenv("MEGAMOE_CUBE_WORKERS");
    unsetenv("MEGAMOE_VECTOR_WORKERS");
    ASSERT_OK(mm_mc_workers(1, 0, 0, 0, &c, &v));
    ASSERT_TRUE(c == 1 && v == 0); /* one worker runs both queues */
    ASSERT_OK(mm_mc_workers(2, 0, 0, 0, &c, &v));
    ASSERT_TRUE(c == 1 && v == 1);
    ASSERT_OK(mm_mc_workers(8, 0, 0, 0, &c, &v));
    ASSERT_TRUE(c == 6 && v == 2);
    ASSERT_OK(mm_mc_workers(4, 0, 3, 2, &c, &v)); /* explicit roles win over the derived total */
    ASSERT_TRUE(c == 3 && v == 2);
    ASSERT_STATUS(mm_mc_workers(4, 1, 3, 2, &c, &v), MEGAMOE_INVALID_ARGUMENT);
    setenv("MEGAMOE_CUBE_WORKERS", "3", 1);
    ASSERT_OK(mm_mc_workers(2, 0, 0, 0, &c, &v)); /* environment over the cores' share */
    ASSERT_TRUE(c == 3 && v == 0);
    ASSERT_OK(mm_mc_workers(2, 1, 0, 0, &c, &v)); /* an explicit total over the environment */
    ASSERT_TRUE(c == 1 && v == 1);
    setenv("MEGAMOE_VECTOR_WORKERS", "nope", 1);
    ASSERT_STATUS(mm_mc_workers(2, 0, 0, 0, &c, &v), MEGAMOE_INVALID_ARGUMENT);
    unsetenv("MEGAMOE_CUBE_WORKERS");
    unsetenv("MEGAMOE_VECTOR_WORKERS");
    mm_mc_shape_t bad = {2, 0, 0, 64, 32, 4, 2, 1, 0, NULL, 0};
    mm_mc_plan_t *p = NULL;
    ASSERT_STATUS(mm_mc_plan_create(&bad, &p), MEGAMOE_INVALID_ARGUMENT); /* T = 0 */
    bad.T = 128;
    bad.E = 3; /* not a multiple of EP */
    ASSERT_STATUS(mm_mc_plan_create(&bad, &p), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_TRUE(mm_mc_heap_bytes(2, 4, 0) % 4096 == 0);
    ASSERT_TRUE(mm_mc_heap_bytes(2, 4, 0) >= (size_t)(4 * 2 + 2) * 64 + 2 * 2 * MM_MC_SLOT_BYTES);
    /* guest slots: their arrival lines, ready lines and every rank's partial lines */
    ASSERT_TRUE(mm_mc_heap_bytes(2, 4, 2) >=
                (size_t)((4 + 2) * 2 + 2 + 2 + 2 * 2) * 64 + 2 * 2 * MM_MC_SLOT_BYTES);
}

/* Hot-expert replicas: S = L + R slots get dispatch, expert and weight-gradient tasks; FETCH
 * heads the cube queue, the backward's SLOT_DONE sits between the dispatch and DONE, WSUM of
 * every local expert ends the cube queue. */
MM_TEST(replica_slots_in_the_plan)
{
    const int R = 2;
    mm_mc_plan_t *p = mm_plan_r(2, 1, 256, 8, 2, 2, 1, R);
    ASSERT_TRUE(p != NULL);
    ASSERT_EQ_INT(p->L, 4);
    ASSERT_EQ_INT(p->S, 6);
    const int64_t NT = p->NT, wc = p->wchunks;
    for (int dir = 0; dir < 2; dir++) {
        const mm_mc_graph_t *g = &p->graph[dir];
        ASSERT_EQ_INT(g->n_queue[MM_MC_VECTOR], 6 * 2 * NT + (dir ? R : 0) + 1 + 2);
        ASSERT_EQ_INT(g->n_queue[MM_MC_CUBE],
                      R + 6 * 2 * NT + (dir ? 2 * 6 * wc + 4 * wc : 0));
        for (int k = 0; k < R; k++) {
            const mm_mc_task_t *t = &g->tasks[g->queue[MM_MC_CUBE][k]];
            ASSERT_EQ_INT(t->type, MM_MC_FETCH);
            ASSERT_EQ_INT(t->k, k);
            ASSERT_EQ_INT(t->j, 4 + k);
        }
        /* then the guest slots' tiles, then the local experts' */
        ASSERT_EQ_INT(g->tasks[g->queue[MM_MC_CUBE][R]].type, MM_MC_EXPERT);
        ASSERT_EQ_INT(g->tasks[g->queue[MM_MC_CUBE][R]].j, 4);
        ASSERT_EQ_INT(g->tasks[g->queue[MM_MC_CUBE][R + 2 * 2 * NT + (dir ? 2 * wc : 0)]].j, 0);
        int slot_done = 0, done_at = -1, dispatch_j_max = -1;
        for (int i = 0; i < g->n_queue[MM_MC_VECTOR]; i++) {
            const mm_mc_task_t *t = &g->tasks[g->queue[MM_MC_VECTOR][i]];
            if (t->type == MM_MC_DISPATCH && t->j > dispatch_j_max) dispatch_j_max = t->j;
            if (t->type == MM_MC_SLOT_DONE) {
                ASSERT_TRUE(done_at < 0);
                slot_done++;
            }
            if (t->type == MM_MC_DONE) done_at = i;
        }
        ASSERT_EQ_INT(dispatch_j_max, 5);
        ASSERT_EQ_INT(slot_done, dir ? R : 0);
        int wsum = 0;
        for (int i = 0; i < g->n_queue[MM_MC_CUBE]; i++) {
            const mm_mc_task_t *t = &g->tasks[g->queue[MM_MC_CUBE][i]];
            if (t->type == MM_MC_WSUM) {
                wsum++;
                ASSERT_TRUE(i >= g->n_queue[MM_MC_CUBE] - 4 * wc); /* the tail */
            }
        }
        ASSERT_EQ_INT(wsum, dir ? 4 * wc : 0);
        ASSERT_EQ_INT(g->n_counted, g->n_tasks - 1 - 2);
    }
    mm_mc_plan_destroy(p);
}

/* ---- the GEMM property behind "O1 bits == O0 bits" ----------------------------------------- */

static uint64_t mm_rng = 0x2545f4914f6cdd1dull;
static uint16_t *mm_rand_bf16(size_t n)
{
    uint16_t *p = malloc(n * 2 + 2);
    for (size_t i = 0; p && i < n; i++) {
        mm_rng ^= mm_rng << 13;
        mm_rng ^= mm_rng >> 7;
        mm_rng ^= mm_rng << 17;
        p[i] = megamoe_fp32_to_bf16((float)((int64_t)(mm_rng % 20001) - 10000) / 6000.0f);
    }
    return p;
}

/* NN/NT with a packed weight: the whole product in one call vs O1-style row tiles (128 rows
 * at block offsets) vs an O0-style split into column halves at the packing alignment. */
static int mm_rows_cols_invariant(const mm_gemm_backend_ops_t *b, mm_gemm_form_t form, int64_t M,
                                  int64_t K, int64_t N)
{
    uint16_t *A = mm_rand_bf16((size_t)(M * K)), *B = mm_rand_bf16((size_t)(K * N));
    uint16_t *C[3];
    for (int i = 0; i < 3; i++) C[i] = calloc((size_t)(M * N), 2);
    mm_gemm_weight_t *w = NULL;
    int ok = A && B && C[0] && C[1] && C[2] &&
             mm_gemm_weight_create(b, form, K, N, B, form == MM_GEMM_NN ? N : K, 1, &w) == MEGAMOE_OK;
    mm_gemm_args_t a;
    mm_gemm_args_init(&a);
    a.form = form;
    a.M = M;
    a.K = K;
    a.N = N;
    a.A = A;
    a.lda = K;
    a.weight = w;
    a.ldc = N;
    a.c_type = MEGAMOE_DTYPE_BF16;
    a.C = C[0];
    ok = ok && mm_gemm(&a) == MEGAMOE_OK;
    const int64_t blocks[] = {0, 37, 300, 301, M};
    for (int bi = 0; ok && bi + 1 < 5; bi++)
        for (int64_t m = blocks[bi]; ok && m < blocks[bi + 1]; m += 128) {
            mm_gemm_args_t t = a;
            t.C = C[1];
            t.m0 = m;
            t.m1 = m + 128 < blocks[bi + 1] ? m + 128 : blocks[bi + 1];
            ok = mm_gemm(&t) == MEGAMOE_OK;
        }
    int64_t nc = (N / 2) / mm_gemm_weight_n_align(w) * mm_gemm_weight_n_align(w);
    for (int h = 0; ok && h < 2; h++) {
        mm_gemm_args_t t = a;
        t.C = C[2];
        t.n0 = h ? nc : 0;
        t.n1 = h ? N : nc;
        ok = mm_gemm(&t) == MEGAMOE_OK;
    }
    ok = ok && memcmp(C[0], C[1], (size_t)(M * N) * 2) == 0 && memcmp(C[0], C[2], (size_t)(M * N) * 2) == 0;
    if (!ok) fprintf(stderr, "%s form %d %lldx%lldx%lld: split calls differ\n", b->name, form,
                     (long long)M, (long long)K, (long long)N);
    mm_gemm_weight_destroy(w);
    free(A);
    free(B);
    for (int i = 0; i < 3; i++) free(C[i]);
    return ok;
}

/* TN (weight gradients over R rows): whole vs output-row chunks (O1's wgrad chunks) vs column
 * halves (O0's split), bf16 and fp32 C. */
static int mm_tn_invariant(const mm_gemm_backend_ops_t *b, int64_t R, int64_t M, int64_t N,
                           megamoe_dtype_t ct)
{
    uint16_t *A = mm_rand_bf16((size_t)(R * M)), *B = mm_rand_bf16((size_t)(R * N));
    size_t es = megamoe_dtype_size(ct), bytes = (size_t)(M * N) * es;
    char *C[3];
    for (int i = 0; i < 3; i++) C[i] = calloc(bytes, 1);
    int ok = A && B && C[0] && C[1] && C[2];
    mm_gemm_args_t a;
    mm_gemm_args_init(&a);
    a.form = MM_GEMM_TN;
    a.M = M;
    a.N = N;
    a.K = R;
    a.A = A;
    a.lda = M;
    a.B = B;
    a.ldb = N;
    a.ldc = N;
    a.c_type = ct;
    a.backend = b;
    a.C = C[0];
    ok = ok && mm_gemm(&a) == MEGAMOE_OK;
    for (int c = 0; ok && c < 3; c++) {
        mm_gemm_args_t t = a;
        t.C = C[1];
        t.m0 = M * c / 3 / 16 * 16;
        t.m1 = c == 2 ? M : M * (c + 1) / 3 / 16 * 16;
        ok = mm_gemm(&t) == MEGAMOE_OK;
    }
    for (int h = 0; ok && h < 2; h++) {
        mm_gemm_args_t t = a;
        t.C = C[2];
        t.n0 = h ? N / 2 : 0;
        t.n1 = h ? N : N / 2;
        ok = mm_gemm(&t) == MEGAMOE_OK;
    }
    ok = ok && memcmp(C[0], C[1], bytes) == 0 && memcmp(C[0], C[2], bytes) == 0;
    if (!ok) fprintf(stderr, "%s TN R=%lld %lldx%lld: split calls differ\n", b->name,
                     (long long)R, (long long)M, (long long)N);
    free(A);
    free(B);
    for (int i = 0; i < 3; i++) free(C[i]);
    return ok;
}

MM_TEST(gemm_bits_do_not_depend_on_the_split)
{
    int tested = 0;
    for (int i = 0; mm_gemm_backend_at(i) != NULL; i++) {
        const mm_gemm_backend_ops_t *b = mm_gemm_backend_at(i);
        if (b->probe && b->probe() != MEGAMOE_OK) continue;
        tested++;
        ASSERT_TRUE(mm_rows_cols_invariant(b, MM_GEMM_NN, 600, 96, 256));  /* GMM1-like */
        ASSERT_TRUE(mm_rows_cols_invariant(b, MM_GEMM_NN, 600, 128, 192)); /* GMM2-like */
        ASSERT_TRUE(mm_rows_cols_invariant(b, MM_GEMM_NT, 600, 192, 128)); /* dA */
        ASSERT_TRUE(mm_rows_cols_invariant(b, MM_GEMM_NT, 450, 256, 320)); /* dX */
        ASSERT_TRUE(mm_tn_invariant(b, 777, 128, 192, MEGAMOE_DTYPE_BF16)); /* dW2 */
        ASSERT_TRUE(mm_tn_invariant(b, 1000, 192, 256, MEGAMOE_DTYPE_FP32)); /* dW1 */
        ASSERT_TRUE(mm_tn_invariant(b, 0, 64, 64, MEGAMOE_DTYPE_BF16)); /* an idle expert */
    }
    ASSERT_TRUE(tested >= 1);
}
