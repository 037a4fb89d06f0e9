/* Internals of megamoe_grouped_matmul shared by the float path (gmm.c) and the quantised
 * paths (gmm_quant.c): the checked plan, the tiles threads share, the epilogue helpers. */
#ifndef MM_KERNELS_GMM_INTERNAL_H
#define MM_KERNELS_GMM_INTERNAL_H

#include <stdint.h>

#include "gemm.h"
#include "megamoe/companion.h"

typedef struct mm_gmm_plan {
    const megamoe_grouped_matmul_args_t *a;
    int64_t M, K, N, E;      /* N: logical columns (8 per int32 for int4 weights) */
    int64_t s_e, s_k, s_n;   /* element strides of the [E, K, N] weight view (stored elements) */
    int64_t *counts;         /* rows of each group [E] */
    int64_t *starts;         /* first row of each group [E + 1] */
    int64_t total;           /* rows the group list uses */
    int threads;
} mm_gmm_plan_t;

typedef struct mm_gmm_tile {
    int64_t g, m0, m1, n0, n1; /* rows [m0, m1) of group g (group-relative), columns [n0, n1) */
} mm_gmm_tile_t;

typedef megamoe_status_t (*mm_gmm_tile_fn_t)(const mm_gmm_plan_t *p, const mm_gmm_tile_t *t,
                                             void *ctx);

/* Base of group g's weight (stored elements; int4: int32 words). */
const void *mm_gmm_weight(const mm_gmm_plan_t *p, int64_t g);
/* Split the non-empty groups into tiles for p->threads workers (columns in multiples of
 * n_align); returns the count (-1 when out of memory) and a malloc'ed array. */
int64_t mm_gmm_tiles(const mm_gmm_plan_t *p, int64_t n_align, mm_gmm_tile_t **tiles_p);
/* Run fn on every tile (OpenMP over p->threads); the first failure wins. */
megamoe_status_t mm_gmm_run_tiles(const mm_gmm_plan_t *p, const mm_gmm_tile_t *tiles, int64_t n,
                                  mm_gmm_tile_fn_t fn, void *ctx);
void mm_gmm_zero_tail(const mm_gmm_plan_t *p);
/* y[row, n0:n1] = round(acc[0:n1-n0] + bias[g, n]) */
void mm_gmm_epilogue_row(const mm_gmm_plan_t *p, int64_t g, const float *acc, int64_t row,
                         int64_t n0, int64_t n1);

megamoe_status_t mm_gmm_float(const mm_gmm_plan_t *p, const mm_gemm_weight_t *const *packed);
/* int8 / int4 operands: W8A8 (int32 or dequantised y), W8A16, W4A8 (gmm_quant.c). */
megamoe_status_t mm_gmm_quant(const mm_gmm_plan_t *p);
/* Pack (or re-pack) quantised expert e into packs[e] (gmm_quant.c). */
megamoe_status_t mm_gmm_quant_pack(void **packs, int64_t e, const megamoe_grouped_matmul_args_t *a,
                                   const mm_gmm_plan_t *geo, const void *src, uint64_t version,
                                   int *repacked);
size_t mm_gmm_quant_packed_bytes(const void *pack);
void mm_gmm_quant_destroy(void *pack);

/* E, K, N and the element strides of args' weight view (p->E, K, N, s_*; nothing else). */
megamoe_status_t mm_gmm_geometry(const char *fn, const megamoe_grouped_matmul_args_t *args,
                                 mm_gmm_plan_t *p);
/* Packed weights (gmm_weights.c): INVALID_ARGUMENT unless they are p's weights' shape and type;
 * the bf16 packs per group (NULL for quantised weights), the quantised packs (void *: the
 * kernels' mm_qweight_t; NULL for bf16). */
megamoe_status_t mm_gmm_weights_check(const megamoe_gmm_weights_t *w, const mm_gmm_plan_t *p);
const mm_gemm_weight_t *const *mm_gmm_weights_bf16(const megamoe_gmm_weights_t *w);
void *const *mm_gmm_weights_quant(const megamoe_gmm_weights_t *w);

#endif /* MM_KERNELS_GMM_INTERNAL_H */
