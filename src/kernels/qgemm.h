/* Quantised grouped matrix products: int8 activations x int8 / int4 weights (W8A8, W4A8) with
 * exact int32 accumulation, and bf16 activations x int8 / int4 weights dequantised in registers
 * (weight-only W8A16 / W4A16). The serving mega_moe operator and the companion
 * npu_grouped_matmul call these; docs/kernels.md ("Quantised GEMMs") has the design, the bounds
 * and the measurements.
 *
 * Weights: one expert's weight is the logical matrix W[K, N] (K = input features, N = output
 * features: mega_moe's and npu_grouped_matmul's [in, out] orientation). It is packed once into
 * an opaque mm_qweight_t (mm_qweight_create) and re-packed in place when its values change
 * (mm_qweight_update); the packed copy owns its bytes, so the source may be freed afterwards.
 * Integer values only: scales, offsets and biases are per-call arguments (caller-owned fp32
 * arrays), so changing a scale never needs a re-pack.
 *   int8: values in [-128, 127].
 *   int4: values in [-8, 7], two per byte, two's complement, the value with the even index in
 *         the low nibble (vLLM-Ascend's packing; mega_moe spec §6.3's CPU decision). The int32
 *         carrier (8 values per int32, value 8m+i in bits 4i..4i+3, little endian) is the same
 *         bytes: pass its data pointer.
 *   Source layout KN: row k holds the N values of input feature k (packed along N for int4);
 *   NK: row n holds the K values of output n (nn.Linear's [out, in]; packed along K for int4).
 *   group_size: the K-group of the weight scales: 0 = one group (per output channel), else a
 *   multiple of 8; then scales have G = ceil(K / group_size) rows (the last group may be short).
 *
 * Products (mm_qgemm): grouped over experts like the bf16 path. The stacked activation rows
 * [0, R), R = sum(group_rows), are split into consecutive groups (rows per group, zeros
 * allowed); group g multiplies its rows by experts[g].weight. Row r of A is A + r * lda, or
 * A + a_index[r] * lda with a gather list (repeats allowed: the dispatch layout's expanded
 * rows). Row r of C is C + r * ldc. Only the sub-block [m0, m1) x [n0, n1) of C is written
 * (n0 a multiple of MM_QGEMM_N_ALIGN), so workers split products like mm_gemm_split says.
 *
 * Arithmetic, for C row r (source row i = a_index ? a_index[r] : r), column n, K groups
 * k in [g*gs, min(K, (g+1)*gs)) (one group of all K when group_size == 0):
 *   int8 A (a_type INT8):
 *     acc_g = sum over the group's k of A[i][k] * W[k][n]         exact (int32; exact whenever
 *             K <= MM_QGEMM_MAX_K, which the call checks)
 *     c_type INT32 (one group only):  C = acc_0 + bias_i32[n]      (32-bit wrap-around add)
 *     c_type FP32 / BF16:
 *       one group:  s = (float)(acc_0 + bias_i32[n]) * w_scale[0][n]
 *       G groups:   s = (float)acc_0 * w_scale[0][n];  s = s + (float)acc_g * w_scale[g][n]
 *                   for g = 1 .. G-1 (in this order)
 *   bf16 / fp16 / fp32 A (a_type BF16, FP16, FP32: weight-only; A widened exactly to fp32):
 *       w'[k][n] = (float)W[k][n] + w_offset[g][n]   (g = k's group; exact for integer offsets)
 *       p_g = fma chain over the group's k ascending: p = fmaf(A[i][k], w'[k][n], p), from +0
 *       then s from the p_g exactly as from the (float)acc_g above (one group: s = p_0 *
 *       w_scale[0][n]; G groups: the same sum), i.e. the scale is applied to the group's sum
 *   then, for both:  s = s + bias_pre[n];  s = s * x_scale[i];  s = s + bias_post[n];
 *   C = s (FP32) or bf16 round-to-nearest-even of s (BF16).
 * Every step is one IEEE fp32 operation (no contraction); an absent (NULL) term is skipped
 * (absent w_scale = 1, w_offset = 0). The integer-to-float conversion rounds to nearest even.
 * The AVX-512 kernels (VNNI vpdpbusd for int8 A, FMA for bf16 A) and the portable C twins
 * give the same bits; so do all blockings, sub-blocks and thread splits.
 *
 * The parameter names follow the operators: mega_moe A8W8 is s = (acc * sigma[n]) * s_x
 * (w_scale = sigma, x_scale = s_x); A8W4 adds bias_pre[n] = B[n] - 8 * colsum(V (.) sigma)[n]
 * before the token scale (megamoe_quant_w4a8_bias_pre() computes it);
 * npu_grouped_matmul W8A8 uses w_scale = scale, x_scale = per_token_scale, a float bias as
 * bias_post and an int32 bias as bias_i32; int32 output is c_type INT32; W8A16 / W4A16 are
 * a_type BF16 with w_scale = antiquant_scale, w_offset = antiquant_offset and bias_post.
 */
#ifndef MM_KERNELS_QGEMM_H
#define MM_KERNELS_QGEMM_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/dtype.h"
#include "megamoe/status.h"

/* The largest K whose int8 sums always fit int32 (|a*w| <= 128*128, K * 2^14 < 2^31). */
#define MM_QGEMM_MAX_K ((int64_t)131071)
/* Column alignment of sub-block starts (the packed panel width). */
#define MM_QGEMM_N_ALIGN 64

typedef enum mm_qw_type {
    MM_QW_INT8 = 0,
    MM_QW_INT4 = 1,
} mm_qw_type_t;

typedef enum mm_qw_layout {
    MM_QW_KN = 0, /* row k: N values ([in, out]) */
    MM_QW_NK = 1, /* row n: K values ([out, in], nn.Linear) */
} mm_qw_layout_t;

/* Where a weight's values come from (create and update). */
typedef struct mm_qweight_src {
    mm_qw_type_t type;
    mm_qw_layout_t layout;
    int64_t K, N;
    const void *data; /* int8 values, or int4 packed two per byte (int32 carrier: same bytes) */
    int64_t ld;       /* bytes between rows: >= N (KN int8), >= K (NK int8), >= ceil(N/2) (KN
                       * int4), >= ceil(K/2) (NK int4) */
    int64_t group_size; /* 0: per output channel; else a multiple of 8 */
} mm_qweight_src_t;

typedef struct mm_qweight mm_qweight_t; /* opaque packed weight */

/* Pack. version is the caller's counter for the values (see update). */
megamoe_status_t mm_qweight_create(const mm_qweight_src_t *src, uint64_t version,
                                   mm_qweight_t **weight_p);
/* Re-pack in place from src (same type, K, N, group_size; any layout, data and ld) when
 * version or src->data differ from the packed ones; *repacked_p (may be NULL) tells. Must not
 * run concurrently with products that use the weight. */
megamoe_status_t mm_qweight_update(mm_qweight_t *weight, const mm_qweight_src_t *src,
                                   uint64_t version, int *repacked_p);
void mm_qweight_destroy(mm_qweight_t *weight); /* accepts NULL */
int64_t mm_qweight_K(const mm_qweight_t *weight);
int64_t mm_qweight_N(const mm_qweight_t *weight);
mm_qw_type_t mm_qweight_type(const mm_qweight_t *weight);
int64_t mm_qweight_group_size(const mm_qweight_t *weight); /* 0: per channel */
int64_t mm_qweight_groups(const mm_qweight_t *weight);     /* scale rows G (1 per channel) */
uint64_t mm_qweight_version(const mm_qweight_t *weight);
size_t mm_qweight_packed_bytes(const mm_qweight_t *weight);

/* One expert's weight and its per-call parameters (fp32, caller-owned; NULL = absent). */
typedef struct mm_qgemm_expert {
    const mm_qweight_t *weight; /* may be NULL only for a group without rows */
    const float *w_scale;       /* [G][ld_scale]: per output channel (G = 1) or per K group */
    const float *w_offset;      /* [G][ld_scale], bf16 A only (antiquant offset) */
    int64_t ld_scale;           /* elements between scale rows (>= N); unused when G == 1 */
    const int32_t *bias_i32;    /* [N], int8 A with G == 1: added to the int32 sum */
    const float *bias_pre;      /* [N]: added before the token scale */
    const float *bias_post;     /* [N]: added after it */
} mm_qgemm_expert_t;

/* A grouped product; initialise with mm_qgemm_args_init() (fields added later default off). */
typedef struct mm_qgemm_args {
    int num_groups;
    const int64_t *group_rows;         /* [num_groups] rows per group (>= 0) */
    const mm_qgemm_expert_t *experts;  /* [num_groups] */
    int64_t K, N;                      /* of every expert's weight */
    megamoe_dtype_t a_type;            /* INT8; or BF16, FP16, FP32 (weight-only) */
    const void *A;                     /* rows of K elements, row stride lda (elements) */
    int64_t lda;
    const int32_t *a_index;            /* (optional) gather: row r of A is a_index[r] */
    int64_t a_num_rows;                /* rows of A, with a_index: every index must be below */
    const float *x_scale;              /* (optional) per row of A (indexed like A's rows) */
    void *C;                           /* [R, N], row stride ldc (elements) */
    int64_t ldc;
    megamoe_dtype_t c_type;            /* MEGAMOE_DTYPE_INT32, _FP32 or _BF16 */
    int64_t m0, m1, n0, n1;            /* sub-block; ends may be MM_QGEMM_END */
} mm_qgemm_args_t;

#define MM_QGEMM_END INT64_MAX

void mm_qgemm_args_init(mm_qgemm_args_t *args);
/* Validates (INVALID_ARGUMENT names the field) and computes on the calling thread. */
megamoe_status_t mm_qgemm(const mm_qgemm_args_t *args);

/* Which implementation runs: the AVX-512 kernels when the CPU has them (AVX512-VNNI for int8
 * A, AVX-512F for bf16 A) and mm_kernels_set_vector() allows, else the C twins. */
const char *mm_qgemm_impl_name(megamoe_dtype_t a_type);

#endif /* MM_KERNELS_QGEMM_H */
