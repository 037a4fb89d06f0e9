/* GEMM test helpers shared by test_gemm.c and test_gemm_amx.c: random bf16 data, the fp64
 * reference check of a product (cells outside the sub-block must be untouched), C buffers,
 * the usable backends, and one checked product through mm_gemm. */
#ifndef MM_TEST_GEMM_CHECK_H
#define MM_TEST_GEMM_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/gemm.h"
#include "megamoe/dtype.h"

#define SENTINEL 12345.0f

/* xorshift stream shared by the helpers (deterministic per test binary). */
uint32_t rnd(void);
/* n bf16 values in about [-1.43, 1.43] (malloc'd; at least one element). */
uint16_t *rand_bf16(size_t n);
double bf(uint16_t b);

/* The operands of one product as mm_gemm sees them. */
typedef struct op {
    mm_gemm_form_t form;
    int64_t M, N, K;
    const uint16_t *A, *B;
    int64_t lda, ldb;
    const uint16_t *const *a_rows;
} op_t;

double a_at(const op_t *o, int64_t m, int64_t k);
double b_at(const op_t *o, int64_t k, int64_t n);
/* C (c_old before the call) vs the fp64 product on [m0,m1) x [n0,n1); every other cell must
 * still hold c_old. Bound: fp32 accumulation (2K ulps of sum |a*b|) + one bf16 rounding. */
int check_c(const char *what, const op_t *o, const void *C, const void *c_old, int64_t ldc,
            megamoe_dtype_t ct, int accumulate, int64_t m0, int64_t m1, int64_t n0, int64_t n1);
/* An M x ldc (+1) C buffer: random values, or SENTINEL everywhere. */
void *make_c(int64_t M, int64_t ldc, megamoe_dtype_t ct, int random);

/* The backends built here that are usable on this machine (load_backends fills them). */
extern const mm_gemm_backend_ops_t *backends[8];
extern int n_backends;
void load_backends(void);

/* One product through mm_gemm, checked against fp64. pad > 0 adds that many columns to every
 * stride; use_rows reads A through a reversed row list. */
int run_case(const mm_gemm_backend_ops_t *be, mm_gemm_form_t form, int64_t M, int64_t N,
             int64_t K, megamoe_dtype_t ct, int accumulate, int packed, int pad, int64_t m0,
             int64_t m1, int64_t n0, int64_t n1, int use_rows);

#endif /* MM_TEST_GEMM_CHECK_H */
