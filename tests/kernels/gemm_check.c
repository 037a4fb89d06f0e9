/* GEMM test helpers (gemm_check.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_check.h"
#include "megamoe/status.h"

/* ---- data and reference ------------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

uint16_t *rand_bf16(size_t n)
{
    uint16_t *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = megamoe_fp32_to_bf16(((float)(rnd() % 20001) - 10000.0f) / 7000.0f);
    return p;
}

double bf(uint16_t b) { return megamoe_bf16_to_fp32(b); }

double a_at(const op_t *o, int64_t m, int64_t k)
{
    if (o->form == MM_GEMM_TN) return o->a_rows ? bf(o->a_rows[k][m]) : bf(o->A[k * o->lda + m]);
    return o->a_rows ? bf(o->a_rows[m][k]) : bf(o->A[m * o->lda + k]);
}

double b_at(const op_t *o, int64_t k, int64_t n)
{
    return o->form == MM_GEMM_NT ? bf(o->B[n * o->ldb + k]) : bf(o->B[k * o->ldb + n]);
}

/* C (as stored before the call: c_old) vs fp64 product on [m0,m1) x [n0,n1); everything else
 * must still hold c_old. Bound: fp32 accumulation (2K ulps of sum |a*b|) + one bf16 rounding. */
int check_c(const char *what, const op_t *o, const void *C, const void *c_old, int64_t ldc,
            megamoe_dtype_t ct, int accumulate, int64_t m0, int64_t m1, int64_t n0, int64_t n1)
{
    for (int64_t m = 0; m < o->M; m++)
        for (int64_t n = 0; n < ldc; n++) {
            size_t i = (size_t)(m * ldc + n);
            double got = ct == MEGAMOE_DTYPE_FP32 ? ((const float *)C)[i] : bf(((const uint16_t *)C)[i]);
            double old = ct == MEGAMOE_DTYPE_FP32 ? ((const float *)c_old)[i]
                                                  : bf(((const uint16_t *)c_old)[i]);
            int inside = m >= m0 && m < m1 && n >= n0 && n < n1;
            if (!inside) {
                if (memcmp((const char *)C + i * megamoe_dtype_size(ct),
                           (const char *)c_old + i * megamoe_dtype_size(ct), megamoe_dtype_size(ct))) {
                    fprintf(stderr, "%s: C[%lld,%lld] outside the sub-block changed: %g -> %g\n",
                            what, (long long)m, (long long)n, old, got);
                    return 0;
                }
                continue;
            }
            double want = accumulate ? old : 0.0, mag = accumulate ? fabs(old) : 0.0;
            for (int64_t k = 0; k < o->K; k++) {
                double p = a_at(o, m, k) * b_at(o, k, n);
                want += p;
                mag += fabs(p);
            }
            double tol = 2.0 * (double)(o->K + 1) * 0x1p-24 * mag + 1e-30;
            if (ct == MEGAMOE_DTYPE_BF16) tol += 0x1p-8 * fabs(want);
            if (!(fabs(got - want) <= tol)) {
                fprintf(stderr, "%s: C[%lld,%lld] = %.9g, want %.9g (tol %.3g)\n", what,
                        (long long)m, (long long)n, got, want, tol);
                return 0;
            }
        }
    return 1;
}

void *make_c(int64_t M, int64_t ldc, megamoe_dtype_t ct, int random)
{
    size_t n = (size_t)(M * ldc) + 1;
    void *c = malloc(n * megamoe_dtype_size(ct));
    for (size_t i = 0; i < n; i++) {
        float v = random ? ((float)(rnd() % 2001) - 1000.0f) / 300.0f : SENTINEL;
        if (ct == MEGAMOE_DTYPE_FP32) ((float *)c)[i] = v;
        else ((uint16_t *)c)[i] = megamoe_fp32_to_bf16(v);
    }
    return c;
}

const mm_gemm_backend_ops_t *backends[8];
int n_backends;

void load_backends(void)
{
    if (n_backends) return;
    for (int i = 0; mm_gemm_backend_at(i); i++) {
        const mm_gemm_backend_ops_t *b;
        if (mm_gemm_backend_get(mm_gemm_backend_at(i)->name, &b) == MEGAMOE_OK) backends[n_backends++] = b;
        else fprintf(stderr, "backend %s not usable here: %s\n", mm_gemm_backend_at(i)->name,
                     megamoe_last_error());
    }
}

/* One product through mm_gemm, checked. pad > 0 adds that many columns to every stride. */
int run_case(const mm_gemm_backend_ops_t *be, mm_gemm_form_t form, int64_t M, int64_t N,
             int64_t K, megamoe_dtype_t ct, int accumulate, int packed, int pad, int64_t m0,
             int64_t m1, int64_t n0, int64_t n1, int use_rows)
{
    op_t o = {form, M, N, K, NULL, NULL, 0, 0, NULL};
    int64_t a_r = form == MM_GEMM_TN ? K : M, a_c = form == MM_GEMM_TN ? M : K;
    int64_t b_r = form == MM_GEMM_NT ? N : K, b_c = form == MM_GEMM_NT ? K : N;
    o.lda = a_c + pad;
    o.ldb = b_c + pad;
    int64_t ldc = N + pad;
    uint16_t *A = rand_bf16((size_t)(a_r * o.lda)), *B = rand_bf16((size_t)(b_r * o.ldb));
    o.A = A;
    o.B = B;
    const uint16_t **rows = NULL;
    if (use_rows) { /* reversed row order through the list */
        rows = malloc((size_t)(a_r ? a_r : 1) * sizeof *rows);
        uint16_t *Ar = rand_bf16((size_t)(a_r * o.lda));
        for (int64_t r = 0; r < a_r; r++) {
            memcpy(Ar + (a_r - 1 - r) * o.lda, A + r * o.lda, (size_t)o.lda * 2);
            rows[r] = Ar + (a_r - 1 - r) * o.lda;
        }
        o.a_rows = rows;
        free(A);
        A = Ar;
        o.A = NULL;
    }
    void *C = make_c(M, ldc, ct, 1), *C0 = make_c(M, ldc, ct, 0);
    memcpy(C0, C, (size_t)(M * ldc + 1) * megamoe_dtype_size(ct));
    mm_gemm_weight_t *w = NULL;
    int ok = 1;
    if (packed && mm_gemm_weight_create(be, form, K, N, B, o.ldb, 7, &w) != MEGAMOE_OK) {
        fprintf(stderr, "weight_create: %s\n", megamoe_last_error());
        ok = 0;
    }
    mm_gemm_args_t a;
    mm_gemm_args_init(&a);
    a.form = form;
    a.M = M;
    a.N = N;
    a.K = K;
    a.A = o.A;
    a.lda = o.lda;
    a.a_rows = o.a_rows;
    a.B = packed ? NULL : B;
    a.ldb = o.ldb;
    a.weight = w;
    a.C = C;
    a.ldc = ldc;
    a.c_type = ct;
    a.accumulate = accumulate;
    a.m0 = m0;
    a.m1 = m1;
    a.n0 = n0;
    a.n1 = n1;
    a.backend = be;
    char what[200];
    snprintf(what, sizeof what, "%s %s M=%lld N=%lld K=%lld %s acc=%d packed=%d pad=%d rows=%d [%lld,%lld)x[%lld,%lld)",
             be->name, form == MM_GEMM_NN ? "NN" : form == MM_GEMM_NT ? "NT" : "TN", (long long)M,
             (long long)N, (long long)K, megamoe_dtype_name(ct), accumulate, packed, pad, use_rows,
             (long long)m0, (long long)(m1 == MM_GEMM_END ? M : m1), (long long)n0,
             (long long)(n1 == MM_GEMM_END ? N : n1));
    if (ok) {
        megamoe_status_t st = mm_gemm(&a);
        if (st != MEGAMOE_OK) {
            fprintf(stderr, "%s: %s\n", what, megamoe_last_error());
            ok = 0;
        }
    }
    if (ok)
        ok = check_c(what, &o, C, C0, ldc, ct, accumulate, m0, m1 == MM_GEMM_END ? M : m1, n0,
                     n1 == MM_GEMM_END ? N : n1);
    mm_gemm_weight_destroy(w);
    free(A);
    free(B);
    free(rows);
    free(C);
    free(C0);
    return ok;
}
