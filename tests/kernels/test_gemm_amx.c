/* The own AMX-BF16 backend (src/kernels/gemm_amx*.c), beyond what test_gemm.c runs on every
 * backend: the bits of every element do not depend on the blocking, on sub-blocks, on row
 * chunks computed as separate products (O1 tiles) or on column splits, and repeat run to run;
 * gathered rows with repeats; every edge of the 32 x 32 micro-tile and the 32-wide k-step
 * against fp64; packed and plain B give the same bits; and a machine without AMX (simulated
 * with the test hook, and the real thing where there is no AMX) gets a clean UNSUPPORTED and
 * never a tile instruction. */
#include <stdlib.h>

#include "base/cpu.h"
#include "harness/harness.h"
#include "kernels/gemm.h"
#include "kernels/gemm_amx.h"
#include "megamoe/dtype.h"
#include "megamoe/log.h"

#include "gemm_check.h"

/* The amx backend when it is usable here, else NULL (the reason in amx_why: the cases that
 * need AMX skip with it; only the UNSUPPORTED path is tested then). */
static char amx_why[256];
static const mm_gemm_backend_ops_t *amx(void)
{
    const mm_gemm_backend_ops_t *b = NULL;
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    megamoe_status_t st = mm_gemm_backend_get("amx", &b);
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
    if (st == MEGAMOE_OK) return b;
    snprintf(amx_why, sizeof amx_why, "no usable AMX here (%s)", megamoe_last_error());
    return NULL;
}

/* The amx ops from the registry whether usable or not (what a caller holding the pointer
 * would call). */
static const mm_gemm_backend_ops_t *amx_ops(void)
{
    for (int i = 0; mm_gemm_backend_at(i); i++)
        if (strcmp(mm_gemm_backend_at(i)->name, "amx") == 0) return mm_gemm_backend_at(i);
    return NULL;
}

MM_TEST(without_amx_every_entry_is_a_clean_unsupported)
{
    const mm_gemm_backend_ops_t *ops = amx_ops(), *b = NULL;
    if (ops == NULL) {
        MM_SKIP("no x86 kernels in this build: amx is not registered");
    }
    const int real = amx() != NULL;
    mm_amx_test_disable(1); /* a machine without AMX, also where there is AMX */
    const unsigned long long sessions = mm_amx_tile_sessions();
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    setenv("MEGAMOE_GEMM", "amx", 1);
    ASSERT_STATUS(mm_gemm_backend_default(&b), MEGAMOE_UNSUPPORTED);
    ASSERT_CONTAINS(megamoe_last_error(), "MEGAMOE_GEMM=amx");
    ASSERT_CONTAINS(megamoe_last_error(), "onednn"); /* names the fix */
    ASSERT_STATUS(mm_gemm_backend_get("amx", &b), MEGAMOE_UNSUPPORTED);
    ASSERT_STATUS(mm_gemm_backend_for_weight(MM_GEMM_NN, 4096, 2816, &b), MEGAMOE_UNSUPPORTED);
    /* auto never picks it, for plain operands or for weights */
    setenv("MEGAMOE_GEMM", "auto", 1);
    ASSERT_OK(mm_gemm_backend_default(&b));
    ASSERT_TRUE(strcmp(b->name, "amx") != 0);
    for (int f = 0; f < 2; f++) {
        ASSERT_OK(mm_gemm_backend_for_weight((mm_gemm_form_t)f, 4096, 2816, &b));
        ASSERT_TRUE(strcmp(b->name, "amx") != 0);
    }
    unsetenv("MEGAMOE_GEMM");
    /* a caller holding the ops pointer gets UNSUPPORTED from the product and the packing */
    uint16_t *A = rand_bf16(64 * 64), *B = rand_bf16(64 * 64);
    float C[64 * 64];
    mm_gemm_args_t a;
    mm_gemm_args_init(&a);
    a.M = 64, a.N = 64, a.K = 64, a.A = A, a.lda = 64, a.B = B, a.ldb = 64, a.C = C, a.ldc = 64;
    a.backend = ops;
    for (int f = 0; f < 3; f++) {
        a.form = (mm_gemm_form_t)f;
        ASSERT_STATUS(mm_gemm(&a), MEGAMOE_UNSUPPORTED);
    }
    mm_gemm_weight_t *w = NULL;
    ASSERT_STATUS(mm_gemm_weight_create(ops, MM_GEMM_NN, 64, 64, B, 64, 1, &w),
                  MEGAMOE_UNSUPPORTED);
    ASSERT_TRUE(w == NULL);
    ASSERT_EQ_U64(mm_amx_tile_sessions(), sessions); /* no tile configured, none used */
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
    mm_amx_test_disable(0);
    free(A), free(B);
    fprintf(stderr, "  UNSUPPORTED path checked (%s)\n",
            real ? "simulated with the hook; this machine has AMX" : "this machine has no AMX");
}

/* One product into C (whole or sub-block), through a packed weight or plain B. */
typedef struct prod {
    mm_gemm_form_t form;
    int64_t M, N, K;
    const uint16_t *A, *B;
    const uint16_t *const *a_rows;
    megamoe_dtype_t ct;
    int accumulate;
    const mm_gemm_weight_t *w;
} prod_t;

static megamoe_status_t run_prod(const prod_t *p, void *C, int64_t m0, int64_t m1, int64_t n0,
                                 int64_t n1)
{
    mm_gemm_args_t a;
    mm_gemm_args_init(&a);
    a.form = p->form;
    a.M = p->M, a.N = p->N, a.K = p->K;
    a.A = p->a_rows ? NULL : p->A;
    a.a_rows = p->a_rows;
    a.lda = p->form == MM_GEMM_TN ? p->M : p->K;
    a.weight = p->w;
    a.B = p->w ? NULL : p->B;
    a.ldb = p->form == MM_GEMM_NT ? p->K : p->N;
    a.C = C, a.ldc = p->N, a.c_type = p->ct, a.accumulate = p->accumulate;
    a.m0 = m0, a.m1 = m1, a.n0 = n0, a.n1 = n1;
    a.backend = amx();
    return mm_gemm(&a);
}

static int same_bits(const char *what, const void *x, const void *y, size_t bytes)
{
    if (memcmp(x, y, bytes) == 0) return 1;
    fprintf(stderr, "%s: bits differ from the whole product\n", what);
    return 0;
}

MM_TEST(bits_do_not_depend_on_blocking_splits_or_row_chunks)
{
    const mm_gemm_backend_ops_t *be = amx();
    if (!be) MM_SKIP("%s", amx_why);
    const int64_t M = 75, N = 101, K = 1000; /* 32 k-steps, the last partial */
    static const mm_amx_blocking_t blk[] = {{1, 1, 1}, {3, 2, 1}, {7, 3, 2}, {32, 4, 3}};
    int checked = 0;
    for (int f = 0; f < 3; f++)
        for (int v = 0; v < 4; v++) {
            const megamoe_dtype_t ct = v % 2 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32;
            const int acc = v / 2, packed = f != MM_GEMM_TN && v != 1;
            const size_t es = megamoe_dtype_size(ct), cb = (size_t)(M * N) * es;
            const int64_t a_n = f == MM_GEMM_TN ? K * M : M * K;
            uint16_t *A = rand_bf16((size_t)a_n), *B = rand_bf16((size_t)(K * N));
            void *C0 = make_c(M, N, ct, 1), *Cs = malloc(cb + es), *Cw = malloc(cb + es);
            memcpy(Cs, C0, cb);
            prod_t p = {(mm_gemm_form_t)f, M, N, K, A, B, NULL, ct, acc, NULL};
            mm_gemm_weight_t *w = NULL;
            if (packed) ASSERT_OK(mm_gemm_weight_create(be, p.form, K, N, B, f == MM_GEMM_NT ? K : N, 1, &w));
            p.w = w;
            ASSERT_OK(run_prod(&p, Cs, 0, MM_GEMM_END, 0, MM_GEMM_END)); /* default blocking */
            char what[160];
            /* again: run to run */
            memcpy(Cw, C0, cb);
            ASSERT_OK(run_prod(&p, Cw, 0, MM_GEMM_END, 0, MM_GEMM_END));
            snprintf(what, sizeof what, "form %d v %d: second run", f, v);
            ASSERT_TRUE(same_bits(what, Cs, Cw, cb));
            for (size_t bi = 0; bi < sizeof blk / sizeof blk[0]; bi++) {
                mm_amx_set_blocking(&blk[bi]);
                /* the whole product */
                memcpy(Cw, C0, cb);
                ASSERT_OK(run_prod(&p, Cw, 0, MM_GEMM_END, 0, MM_GEMM_END));
                snprintf(what, sizeof what, "form %d v %d blocking {%lld,%lld,%lld}", f, v,
                         (long long)blk[bi].kc_steps, (long long)blk[bi].nc_panels,
                         (long long)blk[bi].mc_panels);
                ASSERT_TRUE(same_bits(what, Cs, Cw, cb));
                /* a grid of sub-blocks: odd row cuts, columns at 32-multiples and off them (a
                 * packed weight then computes from its source) */
                static const int64_t rc[] = {0, 1, 16, 17, 40, 75}, cc[] = {0, 32, 33, 64, 100, 101};
                memcpy(Cw, C0, cb);
                for (int i = 0; i < 5; i++)
                    for (int j = 0; j < 5; j++)
                        ASSERT_OK(run_prod(&p, Cw, rc[i], rc[i + 1], cc[j], cc[j + 1]));
                snprintf(what, sizeof what, "form %d v %d blocking %zu: sub-blocks", f, v, bi);
                ASSERT_TRUE(same_bits(what, Cs, Cw, cb));
                /* row chunks as products of their own (an O1 tile: M = its rows, A from the
                 * chunk's first row; TN: the chunk's first column of A) */
                memcpy(Cw, C0, cb);
                for (int i = 0; i < 5; i++) {
                    prod_t q = p;
                    q.M = rc[i + 1] - rc[i];
                    q.A = f == MM_GEMM_TN ? A + rc[i] : A + rc[i] * K;
                    mm_gemm_args_t a;
                    mm_gemm_args_init(&a);
                    a.form = q.form, a.M = q.M, a.N = N, a.K = K, a.A = q.A;
                    a.lda = f == MM_GEMM_TN ? M : K;
                    a.weight = w, a.B = w ? NULL : B, a.ldb = f == MM_GEMM_NT ? K : N;
                    a.C = (char *)Cw + (size_t)(rc[i] * N) * es, a.ldc = N, a.c_type = ct;
                    a.accumulate = acc, a.backend = be;
                    ASSERT_OK(mm_gemm(&a));
                }
                snprintf(what, sizeof what, "form %d v %d blocking %zu: row chunks", f, v, bi);
                ASSERT_TRUE(same_bits(what, Cs, Cw, cb));
                checked += 3;
            }
            mm_amx_set_blocking(NULL);
            /* and it is the right product */
            op_t o = {p.form, M, N, K, A, B, f == MM_GEMM_TN ? M : K, f == MM_GEMM_NT ? K : N, NULL};
            snprintf(what, sizeof what, "form %d v %d vs fp64", f, v);
            ASSERT_TRUE(check_c(what, &o, Cs, C0, N, ct, acc, 0, M, 0, N));
            mm_gemm_weight_destroy(w);
            free(A), free(B), free(C0), free(Cs), free(Cw);
        }
    fprintf(stderr, "  %d split products identical to the whole\n", checked);
}

MM_TEST(gathered_rows_with_repeats)
{
    const mm_gemm_backend_ops_t *be = amx();
    if (!be) MM_SKIP("%s", amx_why);
    for (int f = 0; f < 3; f++)
        for (int packed = 0; packed < (f == MM_GEMM_TN ? 1 : 2); packed++) {
            /* NN/NT: 45 rows of C read 11 source rows, many more than once; TN: 70 k rows */
            const int64_t M = 45, N = 70, K = f == MM_GEMM_TN ? 70 : 83, src_rows = 11;
            const int64_t cols = f == MM_GEMM_TN ? M : K, list = f == MM_GEMM_TN ? K : M;
            uint16_t *S = rand_bf16((size_t)(src_rows * cols)), *B = rand_bf16((size_t)(K * N));
            uint16_t *Ad = malloc((size_t)(list * cols) * 2); /* the gather done by hand */
            const uint16_t **rows = malloc((size_t)list * sizeof *rows);
            for (int64_t r = 0; r < list; r++) {
                rows[r] = S + ((r * 7) % src_rows) * cols;
                memcpy(Ad + r * cols, rows[r], (size_t)cols * 2);
            }
            mm_gemm_weight_t *w = NULL;
            if (packed) ASSERT_OK(mm_gemm_weight_create(be, (mm_gemm_form_t)f, K, N, B, f == MM_GEMM_NT ? K : N, 1, &w));
            for (int ct = 0; ct < 2; ct++) {
                megamoe_dtype_t t = ct ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32;
                size_t cb = (size_t)(M * N) * megamoe_dtype_size(t);
                void *C0 = make_c(M, N, t, 1), *Cg = malloc(cb + 4), *Cd = malloc(cb + 4);
                memcpy(Cg, C0, cb), memcpy(Cd, C0, cb);
                prod_t p = {(mm_gemm_form_t)f, M, N, K, NULL, B, rows, t, ct, w};
                ASSERT_OK(run_prod(&p, Cg, 0, MM_GEMM_END, 0, MM_GEMM_END));
                p.a_rows = NULL, p.A = Ad;
                ASSERT_OK(run_prod(&p, Cd, 0, MM_GEMM_END, 0, MM_GEMM_END));
                ASSERT_TRUE(same_bits("gather vs copied rows", Cd, Cg, cb));
                op_t o = {(mm_gemm_form_t)f, M, N, K, NULL, B, cols, f == MM_GEMM_NT ? K : N, rows};
                char what[64];
                snprintf(what, sizeof what, "gather form %d packed %d ct %d", f, packed, ct);
                ASSERT_TRUE(check_c(what, &o, Cg, C0, N, t, ct, 0, M, 0, N));
                free(C0), free(Cg), free(Cd);
            }
            mm_gemm_weight_destroy(w);
            free(S), free(B), free(Ad), free(rows);
        }
}

MM_TEST(micro_tile_and_k_step_edges_against_fp64)
{
    const mm_gemm_backend_ops_t *be = amx();
    if (!be) MM_SKIP("%s", amx_why);
    static const int64_t Ms[] = {0, 1, 15, 16, 17, 31, 32, 33, 129};
    static const int64_t Ks[] = {1, 2, 31, 33, 64, 95};
    static const int64_t Ns[] = {1, 16, 17, 33};
    int cases = 0;
    for (int f = 0; f < 3; f++)
        for (int mi = 0; mi < 9; mi++)
            for (int ki = 0; ki < 6; ki++)
                for (int ni = 0; ni < 4; ni++) {
                    const int v = mi + ki + ni;
                    ASSERT_TRUE(run_case(be, (mm_gemm_form_t)f, Ms[mi], Ns[ni], Ks[ki],
                                         v % 2 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32, (v / 2) % 2,
                                         f != MM_GEMM_TN && v % 3 != 0, v % 4 == 1 ? 3 : 0, 0,
                                         MM_GEMM_END, 0, MM_GEMM_END, v % 5 == 2));
                    cases++;
                }
    /* several K blocks, row blocks and column blocks at the default blocking */
    for (int f = 0; f < 3; f++)
        for (int ct = 0; ct < 2; ct++) {
            ASSERT_TRUE(run_case(be, (mm_gemm_form_t)f, 300, 600, 1100,
                                 ct ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32, ct, f != MM_GEMM_TN,
                                 0, 0, MM_GEMM_END, 0, MM_GEMM_END, 0));
            cases++;
        }
    fprintf(stderr, "  %d products\n", cases);
}

MM_TEST(packed_weights_give_the_bits_of_plain_b)
{
    const mm_gemm_backend_ops_t *be = amx();
    if (!be) MM_SKIP("%s", amx_why);
    const int64_t M = 50, N = 200, K = 300;
    for (int f = 0; f < 2; f++) {
        uint16_t *A = rand_bf16((size_t)(M * K)), *B = rand_bf16((size_t)(K * N));
        mm_gemm_weight_t *w = NULL;
        ASSERT_OK(mm_gemm_weight_create(be, (mm_gemm_form_t)f, K, N, B, f == MM_GEMM_NT ? K : N, 5, &w));
        ASSERT_EQ_INT(mm_gemm_weight_n_align(w), 32);
        ASSERT_TRUE(mm_gemm_weight_packed_bytes(w) >= (size_t)(K * N) * 2);
        float *Cp = calloc((size_t)(M * N), 4), *Cq = calloc((size_t)(M * N), 4);
        prod_t p = {(mm_gemm_form_t)f, M, N, K, A, B, NULL, MEGAMOE_DTYPE_FP32, 0, w};
        ASSERT_OK(run_prod(&p, Cp, 0, MM_GEMM_END, 0, MM_GEMM_END));
        p.w = NULL;
        ASSERT_OK(run_prod(&p, Cq, 0, MM_GEMM_END, 0, MM_GEMM_END));
        ASSERT_TRUE(same_bits("packed vs plain", Cp, Cq, (size_t)(M * N) * 4));
        mm_gemm_weight_destroy(w);
        free(A), free(B), free(Cp), free(Cq);
    }
}
