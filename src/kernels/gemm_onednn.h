/* A plain oneDNN matmul exactly as a user would call it: the baseline `megamoe bench gemm`
 * holds the GEMM backends to, kept here so oneDNN stays behind gemm_onednn.c.
 * One fixed-M primitive created up front (bf16 x bf16 -> fp32), weights either plain [K,N]
 * (`ab`) or in the primitive's preferred layout (`any`, filled by a reorder); OpenMP threads
 * as given at creation. UNSUPPORTED in builds without oneDNN. */
#ifndef MM_KERNELS_GEMM_ONEDNN_H
#define MM_KERNELS_GEMM_ONEDNN_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/status.h"

typedef struct mm_onednn_plain mm_onednn_plain_t;

megamoe_status_t mm_onednn_plain_create(int64_t M, int64_t K, int64_t N, int packed_weights,
                                        int threads, mm_onednn_plain_t **plain_p);
/* Bytes of one weight in the primitive's layout. */
size_t mm_onednn_plain_weight_bytes(const mm_onednn_plain_t *plain);
/* Fill dst (weight_bytes) from B [K,N] row-major: a reorder, or a copy for plain weights. */
megamoe_status_t mm_onednn_plain_pack(const mm_onednn_plain_t *plain, const uint16_t *B, void *dst);
/* C[M,N] = A[M,K] · W. */
megamoe_status_t mm_onednn_plain_run(const mm_onednn_plain_t *plain, const uint16_t *A,
                                     const void *W, float *C);
/* The implementation oneDNN chose ("brg:avx512_core_bf16"). */
const char *mm_onednn_plain_impl(const mm_onednn_plain_t *plain);
void mm_onednn_plain_destroy(mm_onednn_plain_t *plain);

#endif /* MM_KERNELS_GEMM_ONEDNN_H */
