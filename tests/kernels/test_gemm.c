/* GEMM: every form, every backend built here, against an fp64 reference at odd sizes; padded
 * strides, sub-blocks (cells outside must stay untouched), bf16 and fp32 C, accumulate,
 * packed weights and their re-pack on update, row lists, grouped products with empty groups,
 * concurrent calls, backend selection and argument errors. */
#include <dirent.h>
#include <pthread.h>
#include <stdlib.h>

#include "base/clock.h"
#include "base/cpu.h"
#include "harness/harness.h"
#include "kernels/gemm.h"
#include "kernels/gemm_avx512.h"
#include "megamoe/config.h"
#include "megamoe/dtype.h"
#include "megamoe/log.h"

#include "gemm_check.h"

/* ---- cases ------------------------------------------------------------------------------- */

MM_TEST(every_form_backend_size_dtype_and_mode)
{
    load_backends();
    ASSERT_TRUE(n_backends >= 1);
    static const int64_t Ms[] = {0, 1, 17, 48, 129};
    static const int64_t KN[][2] = {{33, 47}, {200, 100}, {1, 5}};
    int cases = 0;
    for (int b = 0; b < n_backends; b++)
        for (int f = 0; f < 3; f++)
            for (int mi = 0; mi < 5; mi++)
                for (int s = 0; s < 3; s++)
                    for (int ct = 0; ct < 2; ct++)
                        for (int acc = 0; acc < 2; acc++)
                            for (int packed = 0; packed < (f == MM_GEMM_TN ? 1 : 2); packed++) {
                                int pad = (mi + s + acc) % 2 ? 3 : 0;
                                ASSERT_TRUE(run_case(backends[b], (mm_gemm_form_t)f, Ms[mi], KN[s][1], KN[s][0],
                                                     ct ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32, acc,
                                                     packed, pad, 0, MM_GEMM_END, 0, MM_GEMM_END, 0));
                                cases++;
                            }
    fprintf(stderr, "  %d products on %d backends\n", cases, n_backends);
}

/* Sizes around the own AVX512-BF16 kernel's blocking: M around its 6-row micro-tiles (0, 1,
 * 15, 17, 129) and above its 384-row blocks, K above its 1024-pair K blocks (partial sums
 * carried in fp32 between blocks) and odd, N not a multiple of its 64-column panels; every
 * backend, both C types, accumulate, packed and plain, row lists, sub-blocks. */
MM_TEST(blocking_edges_long_k_and_odd_sizes)
{
    load_backends();
    static const int64_t Ms[] = {0, 1, 15, 17, 129};
    int cases = 0;
    for (int b = 0; b < n_backends; b++)
        for (int f = 0; f < 3; f++)
            for (int mi = 0; mi < 5; mi++)
                for (int v = 0; v < 4; v++) {
                    int64_t K = v < 2 && (v == 0 || mi < 3) ? 2101 : 95, N = v % 2 ? 130 : 47;
                    int packed = f != MM_GEMM_TN && (v + mi) % 2 == 0;
                    megamoe_dtype_t ct = (v + mi + f) % 2 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32;
                    int acc = (mi + f) % 2, rows = (v + f) % 3 == 0, pad = (mi % 2) * 5;
                    ASSERT_TRUE(run_case(backends[b], (mm_gemm_form_t)f, Ms[mi], N, K, ct, acc, packed,
                                         pad, 0, MM_GEMM_END, 0, MM_GEMM_END, rows));
                    cases++;
                }
    for (int b = 0; b < n_backends; b++)
        for (int f = 0; f < 3; f++)
            for (int packed = 0; packed < (f == MM_GEMM_TN ? 1 : 2); packed++) {
                /* sub-blocks over a long K: aligned (packed copy) and unaligned (source) n0 */
                ASSERT_TRUE(run_case(backends[b], (mm_gemm_form_t)f, 40, 150, 2049,
                                     MEGAMOE_DTYPE_BF16, 1, packed, 0, 5, 37, 64, 140, 0));
                ASSERT_TRUE(run_case(backends[b], (mm_gemm_form_t)f, 40, 150, 2049,
                                     MEGAMOE_DTYPE_FP32, 0, packed, 3, 7, 40, 3, 100, 1));
                /* more rows than one row block */
                ASSERT_TRUE(run_case(backends[b], (mm_gemm_form_t)f, 801, 70, 33, MEGAMOE_DTYPE_BF16,
                                     0, packed, 0, 0, MM_GEMM_END, 0, MM_GEMM_END, 1));
                cases += 3;
            }
    fprintf(stderr, "  %d products on %d backends\n", cases, n_backends);
}

/* The bits of every C element do not depend on how a product is split into calls (the
 * O1 == O0 property, tests/multicore/test_mc_plan.c) — here across the own kernel's K blocks
 * and micro-tiles: one call vs single rows, odd row ranges and 64-column blocks. */
MM_TEST(split_calls_give_identical_bits_over_k_blocks)
{
    load_backends();
    const int64_t M = 100, N = 130, K = 2101;
    for (int b = 0; b < n_backends; b++) {
        if (strcmp(backends[b]->name, "onednn") == 0 &&
            (mm_cpu_has_amx_bf16() || !mm_cpu_has_avx512_bf16())) {
            /* oneDNN 2.6's AMX kernels (brg:avx512_core_amx_bf16), and its bf16 kernels on
             * AVX-512 without AVX512-BF16, sum in an order that depends on the row count and
             * column range of a call: 600x256x4096 split in two row or column halves differs
             * in 1-5% of the elements (AMX). Known and documented (docs/kernels.md); auto puts
             * products on the split-invariant amx or avx512 backend there. */
            fprintf(stderr, "  onednn on %s: not split-invariant (skipped, see docs/kernels.md)\n",
                    mm_cpu_has_amx_bf16() ? "AMX" : "AVX-512 without AVX512-BF16");
            continue;
        }
        for (int f = 0; f < 2; f++)
            for (int ct = 0; ct < 2; ct++) {
                megamoe_dtype_t t = ct ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32;
                size_t es = megamoe_dtype_size(t);
                uint16_t *A = rand_bf16((size_t)(M * K)), *B = rand_bf16((size_t)(N * K));
                void *C0 = make_c(M, N, t, 1), *C1 = malloc((size_t)(M * N + 1) * es);
                memcpy(C1, C0, (size_t)(M * N + 1) * es);
                mm_gemm_weight_t *w = NULL;
                ASSERT_OK(mm_gemm_weight_create(backends[b], (mm_gemm_form_t)f, K, N, B,
                                                f == MM_GEMM_NT ? K : N, 1, &w));
                mm_gemm_args_t a;
                mm_gemm_args_init(&a);
                a.form = (mm_gemm_form_t)f;
                a.M = M, a.N = N, a.K = K, a.A = A, a.lda = K, a.weight = w, a.ldc = N;
                a.c_type = t, a.accumulate = 1, a.backend = backends[b];
                a.C = C0;
                ASSERT_OK(mm_gemm(&a));
                a.C = C1;
                static const int64_t cuts[] = {0, 1, 2, 9, 16, 17, 61, 100};
                for (int i = 0; i + 1 < 8; i++)
                    for (int64_t n0 = 0; n0 < N; n0 += 64) {
                        a.m0 = cuts[i], a.m1 = cuts[i + 1], a.n0 = n0, a.n1 = n0 + 64 < N ? n0 + 64 : N;
                        ASSERT_OK(mm_gemm(&a));
                    }
                if (memcmp(C0, C1, (size_t)(M * N) * es) != 0) {
                    fprintf(stderr, "%s %s %s: split calls differ from one call\n", backends[b]->name,
                            f ? "NT" : "NN", megamoe_dtype_name(t));
                    ASSERT_TRUE(0);
                }
                mm_gemm_weight_destroy(w);
                free(A), free(B), free(C0), free(C1);
            }
    }
}

/* The own kernel's AVX2 form (CPUs without AVX-512) computes the FMA form's chains, which agree
 * with vdpbf16ps's on normal values: forced on an AVX-512 CPU it gives the default form's bits,
 * on every form, C type, accumulate, packed or plain B, decode sizes (even tiles, short K
 * blocks), several K blocks and the widened-slice path (>= 8 tiles). Without AVX-512 both runs
 * are the AVX2 form (the cases above hold it to the fp64 reference there). */
MM_TEST(avx2_form_gives_the_avx512_forms_bits)
{
    const mm_gemm_backend_ops_t *own = NULL;
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    megamoe_status_t st = mm_gemm_backend_get("avx512", &own);
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
    if (st != MEGAMOE_OK || !mm_cpu_has_avx2_fma()) {
        MM_SKIP("no AVX2/FMA: the own kernel has no AVX2 form to compare");
    }
    static const int64_t shapes[][3] = {{1, 200, 700},  {5, 130, 96},  {8, 256, 1500},
                                        {13, 70, 2101}, {36, 64, 300}, {100, 150, 2101}};
    for (int si = 0; si < 6; si++)
        for (int f = 0; f < 3; f++)
            for (int v = 0; v < 4; v++) {
                const int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
                const megamoe_dtype_t t = v % 2 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32;
                const int accumulate = v / 2, packed = f != MM_GEMM_TN && (si + v) % 2;
                const size_t es = megamoe_dtype_size(t);
                const int64_t lda = f == MM_GEMM_TN ? M : K, ldb = f == MM_GEMM_NT ? K : N;
                uint16_t *A = rand_bf16((size_t)(M * K)), *B = rand_bf16((size_t)(N * K));
                void *C0 = make_c(M, N, t, 1), *C1 = malloc((size_t)(M * N + 1) * es);
                memcpy(C1, C0, (size_t)(M * N + 1) * es);
                mm_gemm_weight_t *w = NULL;
                if (packed)
                    ASSERT_OK(mm_gemm_weight_create(own, (mm_gemm_form_t)f, K, N, B, ldb, 1, &w));
                mm_gemm_args_t a;
                mm_gemm_args_init(&a);
                a.form = (mm_gemm_form_t)f;
                a.M = M, a.N = N, a.K = K, a.A = A, a.lda = lda, a.ldc = N;
                a.B = packed ? NULL : B, a.ldb = ldb, a.weight = w;
                a.c_type = t, a.accumulate = accumulate, a.backend = own;
                a.C = C0;
                ASSERT_OK(mm_gemm(&a));
                ASSERT_TRUE(mm_avx512_force_avx2(1) >= 0);
                a.C = C1;
                megamoe_status_t st1 = mm_gemm(&a);
                mm_avx512_force_avx2(0);
                ASSERT_OK(st1);
                if (memcmp(C0, C1, (size_t)(M * N) * es) != 0) {
                    fprintf(stderr, "M=%lld N=%lld K=%lld form %d %s acc %d packed %d: the AVX2 "
                            "form differs\n", (long long)M, (long long)N, (long long)K, f,
                            megamoe_dtype_name(t), accumulate, packed);
                    ASSERT_TRUE(0);
                }
                mm_gemm_weight_destroy(w);
                free(A), free(B), free(C0), free(C1);
            }
}

MM_TEST(zero_k_gives_zero_or_keeps_c)
{
    load_backends();
    for (int b = 0; b < n_backends; b++)
        for (int f = 0; f < 3; f++)
            for (int acc = 0; acc < 2; acc++)
                ASSERT_TRUE(run_case(backends[b], (mm_gemm_form_t)f, 5, 9, 0, MEGAMOE_DTYPE_FP32, acc, 0,
                                     1, 0, MM_GEMM_END, 0, MM_GEMM_END, 0));
}

MM_TEST(sub_blocks_touch_only_their_cells)
{
    load_backends();
    /* n0 multiples of 64 keep the packed copy in use; others fall back to the source. */
    static const int64_t blocks[][4] = {{0, 300, 64, 128}, {0, 300, 64, 100}, {17, 290, 128, 320},
                                        {255, 300, 0, 320}, {3, 4, 5, 6}, {0, 300, 192, 320},
                                        {100, 100, 0, 320}, {0, 300, 256, 257}};
    load_backends();
    for (int b = 0; b < n_backends; b++)
        for (int f = 0; f < 3; f++)
            for (int i = 0; i < 8; i++)
                for (int packed = 0; packed < (f == MM_GEMM_TN ? 1 : 2); packed++)
                    ASSERT_TRUE(run_case(backends[b], (mm_gemm_form_t)f, 300, 320, 96,
                                         i % 2 ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32, i % 3 == 0,
                                         packed, 0, blocks[i][0], blocks[i][1], blocks[i][2],
                                         blocks[i][3], 0));
}

MM_TEST(row_lists_gather_a)
{
    load_backends();
    for (int b = 0; b < n_backends; b++)
        for (int f = 0; f < 3; f++)
            for (int packed = 0; packed < (f == MM_GEMM_TN ? 1 : 2); packed++) {
                ASSERT_TRUE(run_case(backends[b], (mm_gemm_form_t)f, 37, 70, 45, MEGAMOE_DTYPE_FP32, 0,
                                     packed, 2, 0, MM_GEMM_END, 0, MM_GEMM_END, 1));
                ASSERT_TRUE(run_case(backends[b], (mm_gemm_form_t)f, 300, 70, 45, MEGAMOE_DTYPE_BF16, 1,
                                     packed, 0, 10, 290, 0, MM_GEMM_END, 1));
            }
}

MM_TEST(long_m_crosses_row_chunks)
{
    /* 600 rows: two full fixed-M chunks and a padded tail in the oneDNN packed path. */
    load_backends();
    for (int b = 0; b < n_backends; b++)
        for (int packed = 0; packed < 2; packed++)
            for (int ct = 0; ct < 2; ct++)
                ASSERT_TRUE(run_case(backends[b], MM_GEMM_NN, 600, 130, 64,
                                     ct ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32, 0, packed, 0, 0,
                                     MM_GEMM_END, 0, MM_GEMM_END, 0));
}

MM_TEST(multithreaded_onednn_call)
{
    load_backends();
    for (int b = 0; b < n_backends; b++) {
        /* threads = 2 through run_case's defaults is not reachable; build the call here. */
        int64_t M = 130, N = 200, K = 70;
        uint16_t *A = rand_bf16((size_t)(M * K)), *B = rand_bf16((size_t)(K * N));
        float *C = calloc((size_t)(M * N) + 1, 4), *C0 = calloc((size_t)(M * N) + 1, 4);
        mm_gemm_weight_t *w = NULL;
        ASSERT_OK(mm_gemm_weight_create(backends[b], MM_GEMM_NN, K, N, B, N, 1, &w));
        mm_gemm_args_t a;
        mm_gemm_args_init(&a);
        a.M = M, a.N = N, a.K = K, a.A = A, a.lda = K, a.weight = w, a.C = C, a.ldc = N;
        a.threads = 2;
        ASSERT_OK(mm_gemm(&a));
        op_t o = {MM_GEMM_NN, M, N, K, A, B, K, N, NULL};
        ASSERT_TRUE(check_c("threads=2", &o, C, C0, N, MEGAMOE_DTYPE_FP32, 0, 0, M, 0, N));
        mm_gemm_weight_destroy(w);
        free(A), free(B), free(C), free(C0);
    }
}

/* ---- grouped ----------------------------------------------------------------------------- */

MM_TEST(grouped_forms_with_empty_groups)
{
    load_backends();
    static const int64_t rows[] = {0, 17, 0, 129, 1, 0};
    const int G = 6;
    int64_t T = 0;
    for (int g = 0; g < G; g++) T += rows[g];
    const int64_t K = 40, N = 70;
    for (int b = 0; b < n_backends; b++)
        for (int f = 0; f < 2; f++)
            for (int packed = 0; packed < 2; packed++)
                for (int sub = 0; sub < 2; sub++) {
                    uint16_t *A = rand_bf16((size_t)(T * K)), *B = rand_bf16((size_t)(G * K * N));
                    float *C = (float *)make_c(T, N, MEGAMOE_DTYPE_FP32, 1);
                    float *C0 = malloc((size_t)(T * N + 1) * 4);
                    memcpy(C0, C, (size_t)(T * N + 1) * 4);
                    mm_gemm_weight_t *w[6] = {0};
                    for (int g = 0; g < G && packed; g++)
                        ASSERT_OK(mm_gemm_weight_create(backends[b], (mm_gemm_form_t)f, K, N,
                                                        B + g * K * N, f == MM_GEMM_NT ? K : N, 1, &w[g]));
                    mm_gemm_grouped_args_t a;
                    mm_gemm_grouped_args_init(&a);
                    a.form = (mm_gemm_form_t)f;
                    a.num_groups = G;
                    a.group_rows = rows;
                    a.K = K, a.N = N, a.A = A, a.lda = K;
                    a.B = packed ? NULL : B;
                    a.ldb = f == MM_GEMM_NT ? K : N;
                    a.b_group_stride = K * N;
                    a.weights = packed ? (const mm_gemm_weight_t *const *)w : NULL;
                    a.C = C, a.ldc = N, a.backend = backends[b];
                    int64_t m0 = sub ? 10 : 0, m1 = sub ? 140 : T, n0 = sub ? 64 : 0, n1 = sub ? 69 : N;
                    a.m0 = m0, a.m1 = m1, a.n0 = n0, a.n1 = n1;
                    ASSERT_OK(mm_gemm_grouped(&a));
                    int64_t start = 0;
                    for (int g = 0; g < G; start += rows[g], g++) {
                        op_t o = {(mm_gemm_form_t)f, rows[g], N, K, A + start * K, B + g * K * N, K,
                                  f == MM_GEMM_NT ? K : N, NULL};
                        int64_t lo = m0 > start ? m0 - start : 0;
                        int64_t hi = m1 < start + rows[g] ? m1 - start : rows[g];
                        if (hi < lo) hi = lo;
                        char what[96];
                        snprintf(what, sizeof what, "%s grouped %s packed=%d sub=%d group %d",
                                 backends[b]->name, f ? "NT" : "NN", packed, sub, g);
                        ASSERT_TRUE(check_c(what, &o, C + start * N, C0 + start * N, N,
                                            MEGAMOE_DTYPE_FP32, 0, lo, hi, n0, n1));
                    }
                    for (int g = 0; g < G; g++) mm_gemm_weight_destroy(w[g]);
                    free(A), free(B), free(C), free(C0);
                }
}

MM_TEST(grouped_tn_weight_grads)
{
    load_backends();
    static const int64_t rows[] = {5, 0, 33, 0};
    const int G = 4;
    const int64_t M = 45, N = 38, T = 38;
    for (int b = 0; b < n_backends; b++)
        for (int acc = 0; acc < 2; acc++) {
            uint16_t *X = rand_bf16((size_t)(T * M)), *dY = rand_bf16((size_t)(T * N));
            float *C = (float *)make_c(G * M, N, MEGAMOE_DTYPE_FP32, 1);
            float *C0 = malloc((size_t)(G * M * N + 1) * 4);
            memcpy(C0, C, (size_t)(G * M * N + 1) * 4);
            mm_gemm_grouped_args_t a;
            mm_gemm_grouped_args_init(&a);
            a.form = MM_GEMM_TN;
            a.num_groups = G;
            a.group_rows = rows;
            a.M = M, a.N = N, a.A = X, a.lda = M, a.B = dY, a.ldb = N;
            a.C = C, a.ldc = N, a.c_group_stride = M * N, a.accumulate = acc, a.backend = backends[b];
            ASSERT_OK(mm_gemm_grouped(&a));
            int64_t start = 0;
            for (int g = 0; g < G; start += rows[g], g++) {
                op_t o = {MM_GEMM_TN, M, N, rows[g], X + start * M, dY + start * N, M, N, NULL};
                char what[64];
                snprintf(what, sizeof what, "%s TN group %d acc %d", backends[b]->name, g, acc);
                ASSERT_TRUE(check_c(what, &o, C + g * M * N, C0 + g * M * N, N, MEGAMOE_DTYPE_FP32,
                                    acc, 0, M, 0, N));
            }
            free(X), free(dY), free(C), free(C0);
        }
}

/* ---- packed weights ---------------------------------------------------------------------- */

MM_TEST(weight_repacks_only_on_new_version)
{
    load_backends();
    const int64_t M = 20, N = 90, K = 50;
    for (int b = 0; b < n_backends; b++)
        for (int f = 0; f < 2; f++) {
            uint16_t *A = rand_bf16((size_t)(M * K)), *B = rand_bf16((size_t)(K * N));
            uint16_t *Bold = malloc((size_t)(K * N) * 2);
            memcpy(Bold, B, (size_t)(K * N) * 2);
            int64_t ldb = f == MM_GEMM_NT ? K : N;
            float *C = calloc((size_t)(M * N) + 1, 4), *C0 = calloc((size_t)(M * N) + 1, 4);
            mm_gemm_weight_t *w = NULL;
            ASSERT_OK(mm_gemm_weight_create(backends[b], (mm_gemm_form_t)f, K, N, B, ldb, 1, &w));
            /* oneDNN keeps B as it is where its kernels take it plain (AVX-512 without
             * AVX512-BF16): then the weight reads B in place, and sees the step at once */
            const int packed = mm_gemm_weight_packed_bytes(w) > 0;
            ASSERT_TRUE(packed || (strcmp(backends[b]->name, "onednn") == 0 &&
                                   !mm_cpu_has_avx512_bf16()));
            ASSERT_EQ_INT(mm_gemm_weight_version(w), 1);
            /* An optimizer step changes B in place ... */
            for (int64_t i = 0; i < K * N; i++) B[i] = megamoe_fp32_to_bf16(-megamoe_bf16_to_fp32(B[i]) + 0.25f);
            mm_gemm_args_t a;
            mm_gemm_args_init(&a);
            a.form = (mm_gemm_form_t)f, a.M = M, a.N = N, a.K = K, a.A = A, a.lda = K;
            a.weight = w, a.C = C, a.ldc = N;
            /* ... without a new version the packed copy still holds the old weights ... */
            int repacked = -1;
            ASSERT_OK(mm_gemm_weight_update(w, B, ldb, 1, &repacked));
            ASSERT_EQ_INT(repacked, 0);
            ASSERT_OK(mm_gemm(&a));
            op_t o = {(mm_gemm_form_t)f, M, N, K, A, packed ? Bold : B, K, ldb, NULL};
            ASSERT_TRUE(check_c("before update", &o, C, C0, N, MEGAMOE_DTYPE_FP32, 0, 0, M, 0, N));
            /* ... and the bumped version re-packs. */
            ASSERT_OK(mm_gemm_weight_update(w, B, ldb, 2, &repacked));
            ASSERT_EQ_INT(repacked, 1);
            ASSERT_EQ_INT(mm_gemm_weight_version(w), 2);
            ASSERT_OK(mm_gemm(&a));
            o.B = B;
            ASSERT_TRUE(check_c("after update", &o, C, C0, N, MEGAMOE_DTYPE_FP32, 0, 0, M, 0, N));
            mm_gemm_weight_destroy(w);
            free(A), free(B), free(Bold), free(C), free(C0);
        }
}

/* Training re-packs every weight after every optimizer step, in place where the backend can
 * (weight_refresh): the refreshed copy must compute exactly what a fresh pack of the new
 * contents computes, also from a new address with another row stride, at odd K and N (the
 * padding past K and N must be rewritten as zeros). */
MM_TEST(refresh_in_place_equals_a_fresh_pack)
{
    load_backends();
    static const int64_t shapes[][2] = {{50, 90}, {2101, 130}, {1024, 1024}, {31, 65}};
    const int64_t M = 37;
    for (int b = 0; b < n_backends; b++)
        for (int f = 0; f < 2; f++)
            for (int s = 0; s < 4; s++) {
                const int64_t K = shapes[s][0], N = shapes[s][1];
                const int64_t ld1 = f == MM_GEMM_NT ? K : N, ld2 = ld1 + 3;
                const int64_t rows = f == MM_GEMM_NT ? N : K;
                uint16_t *A = rand_bf16((size_t)(M * K)), *B1 = rand_bf16((size_t)(rows * ld1));
                uint16_t *B2 = rand_bf16((size_t)(rows * ld2));
                float *C1 = calloc((size_t)(M * N), 4), *C2 = calloc((size_t)(M * N), 4);
                float *C0 = calloc((size_t)(M * N) + 1, 4);
                mm_gemm_weight_t *w = NULL, *fresh = NULL;
                ASSERT_OK(mm_gemm_weight_create(backends[b], (mm_gemm_form_t)f, K, N, B1, ld1, 1, &w));
                size_t bytes = mm_gemm_weight_packed_bytes(w);
                int repacked = 0;
                ASSERT_OK(mm_gemm_weight_update(w, B2, ld2, 2, &repacked));
                ASSERT_EQ_INT(repacked, 1);
                ASSERT_TRUE(mm_gemm_weight_packed_bytes(w) == bytes);
                ASSERT_OK(mm_gemm_weight_create(backends[b], (mm_gemm_form_t)f, K, N, B2, ld2, 2, &fresh));
                mm_gemm_args_t a;
                mm_gemm_args_init(&a);
                a.form = (mm_gemm_form_t)f, a.M = M, a.N = N, a.K = K, a.A = A, a.lda = K;
                a.ldc = N, a.backend = backends[b];
                a.weight = w, a.C = C1;
                ASSERT_OK(mm_gemm(&a));
                a.weight = fresh, a.C = C2;
                ASSERT_OK(mm_gemm(&a));
                if (memcmp(C1, C2, (size_t)(M * N) * 4) != 0) {
                    fprintf(stderr, "%s %s K=%lld N=%lld: refreshed != fresh pack\n",
                            backends[b]->name, f ? "NT" : "NN", (long long)K, (long long)N);
                    ASSERT_TRUE(0);
                }
                op_t o = {(mm_gemm_form_t)f, M, N, K, A, B2, K, ld2, NULL};
                ASSERT_TRUE(check_c("refreshed", &o, C1, C0, N, MEGAMOE_DTYPE_FP32, 0, 0, M, 0, N));
                mm_gemm_weight_destroy(w);
                mm_gemm_weight_destroy(fresh);
                free(A), free(B1), free(B2), free(C1), free(C2), free(C0);
            }
}

/* ---- concurrency ------------------------------------------------------------------------- */

typedef struct worker {
    const mm_gemm_backend_ops_t *be;
    const mm_gemm_weight_t *w;
    const uint16_t *A;
    float *C;
    int64_t M, N, K, n0, n1;
    int iters;
    megamoe_status_t st;
} worker_t;

static void *worker_main(void *p)
{
    worker_t *w = p;
    for (int i = 0; i < w->iters && w->st == MEGAMOE_OK; i++) {
        mm_gemm_args_t a;
        mm_gemm_args_init(&a);
        a.M = w->M, a.N = w->N, a.K = w->K, a.A = w->A, a.lda = w->K, a.weight = w->w;
        a.C = w->C, a.ldc = w->N, a.n0 = w->n0, a.n1 = w->n1, a.m0 = i % 3, a.m1 = w->M;
        w->st = mm_gemm(&a);
    }
    return NULL;
}

static int count_threads(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* A joined thread's task can still be listed for a moment: pthread_join returns once the
 * kernel cleared the thread's tid, before the task is reaped (seen under CI's parallel load:
 * one thread too many right after the joins). The count once it no longer falls: read until
 * two reads 20 ms apart agree (at most 2 s). */
static int count_threads_settled(void)
{
    int n = count_threads();
    for (int i = 0; i < 100; i++) {
        mm_sleep_ns(20000000ull);
        int m = count_threads();
        if (m == n) break;
        n = m;
    }
    return n;
}

MM_TEST(concurrent_calls_share_weights_and_spawn_no_threads)
{
    load_backends();
    const int64_t M = 70, N = 256, K = 96;
    for (int b = 0; b < n_backends; b++) {
        uint16_t *A = rand_bf16((size_t)(M * K)), *B = rand_bf16((size_t)(K * N));
        float *C = calloc((size_t)(M * N) + 1, 4), *C0 = calloc((size_t)(M * N) + 1, 4);
        mm_gemm_weight_t *w = NULL;
        ASSERT_OK(mm_gemm_weight_create(backends[b], MM_GEMM_NN, K, N, B, N, 1, &w));
        worker_t ws[4];
        pthread_t t[4];
        /* a first thread can start sanitizer helpers; count after one has come and gone */
        pthread_t dummy;
        worker_t idle = {.iters = 0};
        ASSERT_EQ_INT(pthread_create(&dummy, NULL, worker_main, &idle), 0);
        pthread_join(dummy, NULL);
        int before = count_threads_settled();
        for (int i = 0; i < 4; i++) {
            ws[i] = (worker_t){backends[b], w, A, C, M, N, K, i * 64, i * 64 + 64, 6, MEGAMOE_OK};
            ASSERT_EQ_INT(pthread_create(&t[i], NULL, worker_main, &ws[i]), 0);
        }
        for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
        for (int i = 0; i < 4; i++) ASSERT_OK(ws[i].st);
        /* The workers are gone; anything else alive now was started by a backend. */
        ASSERT_EQ_INT(count_threads_settled(), before);
        op_t o = {MM_GEMM_NN, M, N, K, A, B, K, N, NULL};
        ASSERT_TRUE(check_c("concurrent", &o, C, C0, N, MEGAMOE_DTYPE_FP32, 0, 0, M, 0, N));
        mm_gemm_weight_destroy(w);
        free(A), free(B), free(C), free(C0);
    }
}

/* ---- selection and errors ---------------------------------------------------------------- */

MM_TEST(backend_selection_by_environment)
{
    const mm_gemm_backend_ops_t *b = NULL;
    setenv("MEGAMOE_GEMM", "ref", 1);
    ASSERT_OK(mm_gemm_backend_default(&b));
    ASSERT_EQ_STR(b->name, "ref");
    setenv("MEGAMOE_GEMM", "amx", 1);
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    if (mm_cpu_has_amx_bf16() && mm_cpu_has_avx512() && mm_cpu_request_amx()) {
        ASSERT_OK(mm_gemm_backend_default(&b));
        ASSERT_EQ_STR(b->name, "amx");
    } else { /* the reason and the alternative (test_gemm_amx.c covers this path in full) */
        ASSERT_STATUS(mm_gemm_backend_default(&b), MEGAMOE_UNSUPPORTED);
        ASSERT_CONTAINS(megamoe_last_error(), "MEGAMOE_GEMM=amx");
    }
    setenv("MEGAMOE_GEMM", "blas", 1);
    ASSERT_STATUS(mm_gemm_backend_default(&b), MEGAMOE_INVALID_ARGUMENT);
    setenv("MEGAMOE_GEMM", "auto", 1);
    ASSERT_OK(mm_gemm_backend_default(&b));
    if (mm_cpu_has_amx_bf16() && mm_cpu_has_avx512() && mm_cpu_request_amx())
        ASSERT_EQ_STR(b->name, "amx"); /* auto: the own AMX kernel wherever it can run */
    else if (mm_cpu_has_avx512() && !mm_cpu_has_avx512_bf16())
        ASSERT_EQ_STR(b->name, "avx512"); /* ... its FMA form where oneDNN's is not invariant */
    else if (!mm_cpu_has_avx512() && mm_cpu_has_avx2_fma())
        ASSERT_EQ_STR(b->name, "avx512"); /* ... its AVX2 form (no bf16 in oneDNN 2.x here) */
#ifdef MM_TEST_HAVE_ONEDNN
    else
        ASSERT_EQ_STR(b->name, "onednn");
#endif
    unsetenv("MEGAMOE_GEMM");
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
}

MM_TEST(backend_names_come_from_one_list)
{
    /* the env table's words for MEGAMOE_GEMM are MM_GEMM_CHOICES, in order (the choice is
     * read as an index into them) */
    char want[128] = "one of ";
    for (int c = 0; c < MM_GEMM_CHOICE_COUNT; c++) {
        if (c) strcat(want, "|");
        strcat(want, mm_gemm_choice_name((mm_gemm_choice_t)c));
    }
    int found = 0;
    for (size_t i = 0; i < megamoe_config_count(); i++) {
        megamoe_config_entry_t e;
        ASSERT_OK(megamoe_config_entry(i, &e));
        if (strcmp(e.name, "MEGAMOE_GEMM") != 0) continue;
        ASSERT_EQ_STR(e.accepted, want);
        found = 1;
    }
    ASSERT_TRUE(found);
    ASSERT_TRUE(mm_gemm_choice_name(MM_GEMM_CHOICE_COUNT) == NULL);
    /* every registered backend is named by a word of the list, and that word selects it */
    for (int i = 0; mm_gemm_backend_at(i) != NULL; i++) {
        const mm_gemm_backend_ops_t *b = mm_gemm_backend_at(i), *got = NULL;
        int listed = 0;
        for (int c = 0; c < MM_GEMM_CHOICE_COUNT; c++)
            if (strcmp(b->name, mm_gemm_choice_name((mm_gemm_choice_t)c)) == 0) {
                listed = 1;
                if (mm_gemm_backend_of((mm_gemm_choice_t)c, &got) == MEGAMOE_OK)
                    ASSERT_TRUE(got == b);
            }
        ASSERT_TRUE(listed);
    }
}

MM_TEST(the_choice_is_read_once_by_its_owner)
{
    /* a resolved choice does not follow later changes of the variable */
    mm_gemm_choice_t c = MM_GEMM_CHOICE_AUTO;
    const mm_gemm_backend_ops_t *plain = NULL, *w = NULL;
    setenv("MEGAMOE_GEMM", "ref", 1);
    ASSERT_OK(mm_gemm_choice_from_env(&c));
    ASSERT_EQ_INT(c, MM_GEMM_CHOICE_REF);
    setenv("MEGAMOE_GEMM", "auto", 1);
    ASSERT_OK(mm_gemm_backend_of(c, &plain));
    ASSERT_OK(mm_gemm_backend_for_weight_of(c, MM_GEMM_NN, 4096, 4096, &w));
    ASSERT_EQ_STR(plain->name, "ref");
    ASSERT_EQ_STR(w->name, "ref");
    unsetenv("MEGAMOE_GEMM");
    ASSERT_OK(mm_gemm_choice_from_env(&c));
    ASSERT_EQ_INT(c, MM_GEMM_CHOICE_AUTO);
}

MM_TEST(auto_puts_big_weights_on_the_own_kernel_without_amx)
{
    const mm_gemm_backend_ops_t *def = NULL, *b = NULL;
    setenv("MEGAMOE_GEMM", "auto", 1);
    ASSERT_OK(mm_gemm_backend_default(&def));
    int own = mm_cpu_has_avx512() && !mm_cpu_has_amx_bf16(); /* BF16 or FMA form */
    for (int f = 0; f < 2; f++) {
        ASSERT_OK(mm_gemm_backend_for_weight((mm_gemm_form_t)f, 2048, 1024, &b));
        ASSERT_EQ_STR(b->name, own ? "avx512" : def->name);
        ASSERT_OK(mm_gemm_backend_for_weight((mm_gemm_form_t)f, 1024, 1024, &b)); /* small */
        ASSERT_EQ_STR(b->name, def->name);
        ASSERT_OK(mm_gemm_backend_for_weight((mm_gemm_form_t)f, 16384, 256, &b)); /* narrow */
        ASSERT_EQ_STR(b->name, def->name);
    }
    ASSERT_OK(mm_gemm_backend_for_weight(MM_GEMM_TN, 4096, 4096, &b));
    ASSERT_EQ_STR(b->name, def->name);
    /* weight_create(NULL, ...) follows the rule; an explicit choice wins */
    uint16_t *B = calloc((size_t)2048 * 1024, 2);
    mm_gemm_weight_t *w = NULL;
    ASSERT_OK(mm_gemm_weight_create(NULL, MM_GEMM_NN, 2048, 1024, B, 1024, 1, &w));
    ASSERT_EQ_STR(mm_gemm_weight_backend(w)->name, own ? "avx512" : def->name);
    mm_gemm_weight_destroy(w);
    setenv("MEGAMOE_GEMM", "ref", 1);
    ASSERT_OK(mm_gemm_weight_create(NULL, MM_GEMM_NN, 2048, 1024, B, 1024, 1, &w));
    ASSERT_EQ_STR(mm_gemm_weight_backend(w)->name, "ref");
    mm_gemm_weight_destroy(w);
    free(B);
    unsetenv("MEGAMOE_GEMM");
}

MM_TEST(bad_arguments_are_rejected)
{
    load_backends();
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    uint16_t A[64] = {0}, B[64] = {0};
    float C[64];
    mm_gemm_args_t a;
    mm_gemm_args_init(&a);
    a.M = 4, a.N = 4, a.K = 4, a.A = A, a.lda = 4, a.B = B, a.ldb = 4, a.C = C, a.ldc = 4;
    a.backend = &(*backends[0]);
    ASSERT_OK(mm_gemm(&a));
    a.ldc = 3;
    ASSERT_STATUS(mm_gemm(&a), MEGAMOE_INVALID_ARGUMENT);
    a.ldc = 4, a.m1 = 5;
    ASSERT_STATUS(mm_gemm(&a), MEGAMOE_INVALID_ARGUMENT);
    a.m1 = MM_GEMM_END, a.c_type = MEGAMOE_DTYPE_FP16;
    ASSERT_STATUS(mm_gemm(&a), MEGAMOE_INVALID_ARGUMENT);
    a.c_type = MEGAMOE_DTYPE_FP32, a.B = NULL;
    ASSERT_STATUS(mm_gemm(&a), MEGAMOE_INVALID_ARGUMENT);
    mm_gemm_weight_t *w = NULL;
    ASSERT_OK(mm_gemm_weight_create(backends[0], MM_GEMM_NN, 4, 4, B, 4, 0, &w));
    a.form = MM_GEMM_NT, a.weight = w;
    ASSERT_STATUS(mm_gemm(&a), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_gemm_weight_create(backends[0], MM_GEMM_TN, 4, 4, B, 4, 0, &w), MEGAMOE_INVALID_ARGUMENT);
    mm_gemm_weight_destroy(w);
    int64_t rows[2] = {2, -1};
    mm_gemm_grouped_args_t g;
    mm_gemm_grouped_args_init(&g);
    g.num_groups = 2, g.group_rows = rows;
    ASSERT_STATUS(mm_gemm_grouped(&g), MEGAMOE_INVALID_ARGUMENT);
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
}

MM_TEST(split_tiles_the_product_exactly)
{
    static const int64_t cases[][4] = {/* rows, N, K, n_align */
                                       {1024, 256, 512, 64}, {256, 2816, 4096, 64}, {16, 2816, 4096, 64},
                                       {100, 70, 33, 1},     {0, 64, 64, 64},       {5000, 512, 128, 64}};
    for (int c = 0; c < 6; c++)
        for (int workers = 1; workers <= 5; workers++) {
            int64_t rows = cases[c][0], N = cases[c][1], K = cases[c][2], al = cases[c][3];
            unsigned char *cover = calloc((size_t)(rows * N) + 1, 1);
            int by_rows = -1;
            for (int w = 0; w < workers; w++) {
                int64_t m0, m1, n0, n1;
                mm_gemm_split(rows, N, K, al, w, workers, &m0, &m1, &n0, &n1);
                ASSERT_TRUE(0 <= m0 && m0 <= m1 && m1 <= rows && 0 <= n0 && n0 <= n1 && n1 <= N);
                int rowwise = !(m0 == 0 && m1 == rows) || (n0 == 0 && n1 == N && workers == 1);
                if (m1 > m0 && n1 > n0) {
                    if (rowwise) ASSERT_EQ_INT(m0 % 16, 0);
                    else ASSERT_EQ_INT(n0 % al, 0);
                }
                if (by_rows < 0 && m1 > m0 && n1 > n0 && workers > 1) by_rows = rowwise;
                for (int64_t m = m0; m < m1; m++)
                    for (int64_t n = n0; n < n1; n++) cover[m * N + n]++;
            }
            for (int64_t i = 0; i < rows * N; i++) ASSERT_EQ_INT(cover[i], 1);
            /* small weights with enough rows split by rows, big weights by columns */
            if (workers == 2 && rows > 0) ASSERT_EQ_INT(by_rows, K * N <= 512 * 1024 && rows >= 128);
            free(cover);
        }
}
