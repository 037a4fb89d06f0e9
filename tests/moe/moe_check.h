/* Helpers of the MegaMoeExperts tests: run one forward + backward of a layer on this rank's
 * slice of a global problem (bench/moe_data.h) and compare every result with the reference
 * model (include/megamoe/reference.h) by the rule of bench/moe_verify.h. */
#ifndef MM_TESTS_MOE_CHECK_H
#define MM_TESTS_MOE_CHECK_H

#include <stdlib.h>
#include <string.h>

#include "harness/harness.h"
#include "megamoe/megamoe.h"
#include "moe_data.h"

/* Compare n values by the rule of bench/moe_verify.h (want: fp32 oracle, want16: reference with
 * bf16 intermediates, clamp: a SwiGLU clamp was active); prints one line with the metrics;
 * 1 when they pass. */
int mm_close_bf16(const char *what, const float *got, const float *want, const float *want16,
                  size_t n, int clamp);

/* The process-wide world communicator of a test executable (created on first use). */
megamoe_comm_t *mm_test_comm(void);

typedef struct mm_ref_result {
    float *out, *gh, *gp, *g1, *g2;           /* global, the fp32 oracle */
    float *out16, *gh16, *gp16, *g1_16, *g2_16; /* the same with bf16 intermediates */
    int clamp;                                /* limit > 0 */
} mm_ref_result_t;

/* Both references of the whole problem (limit as the layer's swiglu_limit). 0 on success. */
int mm_ref_compute(const mm_moe_problem_t *p, float limit, mm_ref_result_t *r);
void mm_ref_free(mm_ref_result_t *r);

/* This rank's results of one layer call, converted to fp32. */
typedef struct mm_layer_result {
    float *out, *gh, *gp, *g1, *g2; /* rank slice / local experts */
} mm_layer_result_t;

void mm_layer_result_free(mm_layer_result_t *r);

/* Input options of a call. */
typedef struct mm_call_opts {
    int ids64;      /* pass topk_ids as int64 */
    int probs_bf16; /* pass topk_weights as bf16 (the reference then gets the same values) */
    int tpe;        /* 0: no tokens_per_expert, 1: int32, 2: int64 */
} mm_call_opts_t;

/* Local experts' weights of rank me as layer weights (points into the global problem). */
megamoe_experts_weights_t mm_local_weights(const mm_moe_problem_t *p, int me, uint64_t version);

/* Build the input descriptor for rank me (buffers owned by the returned scratch, freed with
 * mm_input_free). */
typedef struct mm_input_buf {
    megamoe_experts_input_t in;
    void *ids, *probs, *tpe;
} mm_input_buf_t;
int mm_input_make(const mm_moe_problem_t *p, int me, const mm_call_opts_t *o, mm_input_buf_t *b);
void mm_input_free(mm_input_buf_t *b);

/* Compare this rank's layer results with the reference slice; returns 1 when all close (and
 * experts that received no token have exact zero weight grads). what names the case. */
int mm_compare(const char *what, const mm_moe_problem_t *p, int me, const mm_layer_result_t *got,
               const mm_ref_result_t *ref);

/* Fill *res from a forward output and backward grads (bf16 buffers of this rank). */
int mm_layer_result_from(const mm_moe_problem_t *p, const uint16_t *out, const uint16_t *gh,
                         const void *gp, int gp_bf16, const uint16_t *g1, const uint16_t *g2,
                         mm_layer_result_t *res);

/* The default layer parameters with the shapes of a test problem (schedule, workers and the
 * rest are the caller's). */
megamoe_experts_params_t mm_params_shape(int64_t T, int64_t H, int64_t I, int64_t E, int64_t K);

/* This rank's raw results of one forward + backward: bf16 output and grad hidden, fp32 grad
 * router weights, weight gradients with room for fp32 values. Sized from the problem (its E
 * experts split over its ep ranks); zero-filled. */
typedef struct mm_run {
    uint16_t *out, *gh, *g1, *g2;
    float *gp;
} mm_run_t;
int mm_run_alloc(mm_run_t *r, const mm_moe_problem_t *p);
void mm_run_free(mm_run_t *r);

/* One forward + backward of layer x on rank me with weights w (NULL: the problem's local
 * weights, version 1), weight grads of dtype wg; the layer's status (OUT_OF_MEMORY when the
 * input cannot be built). */
megamoe_status_t mm_run_fwd_bwd(megamoe_experts_t *x, const mm_moe_problem_t *p, int me,
                                const megamoe_experts_weights_t *w, megamoe_dtype_t wg,
                                mm_run_t *r);

/* Bitwise comparison of two runs (weight gradients of wsize bytes a value); prints the first
 * differing byte of each tensor that differs; 1 when all are equal. */
int mm_run_same_bits(const char *what, const mm_run_t *a, const mm_run_t *b,
                     const mm_moe_problem_t *p, size_t wsize);

/* Per-call token counts (max_local_num_tokens): rank r passes the first n[r] rows of its slice
 * of P (P->T = T_cap rows per rank). The references of such a call are those of the whole
 * problem with the output gradient of every absent row zeroed, which removes exactly their
 * contributions to the weight gradients (their rows are not compared). 0 on success. */
int mm_ref_compute_rows(const mm_moe_problem_t *P, const int64_t *n, mm_ref_result_t *ref);
/* Rank me's rows [0, n[me]) of got and its experts' weight gradients (bf16) against ref; an
 * expert no present token chose must have exact zero gradients. 1 when all pass. */
int mm_compare_rows(const char *what, const mm_moe_problem_t *P, int me, const int64_t *n,
                    const mm_run_t *got, const mm_ref_result_t *ref);

#endif /* MM_TESTS_MOE_CHECK_H */
