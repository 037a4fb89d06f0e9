/* Shared between the GEMM framework (gemm.c) and its backends: the weight object, per-thread
 * scratch, the fp32 -> C epilogue and the bf16 helpers. Not for callers of gemm.h. */
#ifndef MM_KERNELS_GEMM_IMPL_H
#define MM_KERNELS_GEMM_IMPL_H

#include <string.h>

#include "base/cpu.h"
#include "gemm.h"

struct mm_gemm_weight {
    const mm_gemm_backend_ops_t *backend; /* the one that packed it */
    mm_gemm_form_t form;                  /* NN: src is [K,N]; NT: src is [N,K] */
    int64_t K, N;
    const uint16_t *src; /* caller-owned source */
    int64_t ld;
    uint64_t version;
    /* Set by backend->weight_pack: */
    int packed;      /* 1: data holds a packed copy the backend computes from */
    void *data;      /* the packed copy */
    size_t bytes;    /* its size */
    int64_t n_align; /* packed copy usable for sub-blocks with n0 % n_align == 0 */
    void *impl;      /* backend private (layout descriptors) */
};

extern const mm_gemm_backend_ops_t mm_gemm_ref_ops;
#if MM_X86
extern const mm_gemm_backend_ops_t mm_gemm_avx512_ops;
extern const mm_gemm_backend_ops_t mm_gemm_amx_ops;
#endif
#ifdef MM_HAVE_ONEDNN
extern const mm_gemm_backend_ops_t mm_gemm_onednn_ops;
#endif

/* Where packed weights start to get whole 2 MiB pages: bf16 from 4 MiB, quantised from 2 MiB
 * (the free must name the threshold the allocation used). */
#define MM_GEMM_HUGE_FROM_BF16 ((size_t)4 << 20)
#define MM_GEMM_HUGE_FROM_QUANT ((size_t)2 << 20)

/* A packed weight's buffer of at least `bytes` (*bytes_p: the size allocated), 64-byte aligned;
 * from 4 MiB on whole 2 MiB pages with MADV_HUGEPAGE asked for (+1-2% on the products: one TLB
 * entry per 2 MiB of B, hardware prefetchers not stopped every 4 KiB) in a mapping of its own
 * (fresh pages: see gemm.c). Free with mm_gemm_packed_free(p, *bytes_p). `what` names it in an
 * OUT_OF_MEMORY error. */
megamoe_status_t mm_gemm_packed_alloc(size_t bytes, const char *what, void **p, size_t *bytes_p);
void mm_gemm_packed_free(void *p, size_t bytes);
/* The same with whole 2 MiB pages from huge_from bytes on (quantised weights: from 2 MiB);
 * free with mm_gemm_packed_free_from(p, *bytes_p, the same huge_from). */
megamoe_status_t mm_gemm_packed_alloc_from(size_t bytes, size_t huge_from, const char *what,
                                           void **p, size_t *bytes_p);
void mm_gemm_packed_free_from(void *p, size_t bytes, size_t huge_from);

/* Per-thread scratch buffer `slot` (0..MM_GEMM_SCRATCH_SLOTS-1) of at least `bytes`, 64-byte
 * aligned; valid until the next request of that slot on the same thread; freed at thread
 * exit. NULL (after mm_error OUT_OF_MEMORY) when it cannot grow. */
#define MM_GEMM_SCRATCH_SLOTS 5
void *mm_gemm_scratch(int slot, size_t bytes);

/* C[r, 0..cols) for r < rows (C points at the sub-block's first element, row stride ldc, type
 * c_type) = acc (fp32, row stride ld_acc), or C_old + acc in fp32 with accumulate; one
 * rounding to bf16. Vectorised where AVX-512 is present; identical bits either way. */
void mm_gemm_epilogue(const float *acc, int64_t ld_acc, int64_t rows, int64_t cols, void *C,
                      int64_t ldc, megamoe_dtype_t c_type, int accumulate);

/* Zero (or leave, with accumulate) the sub-block: the K = 0 product. */
void mm_gemm_zero_block(void *C, int64_t ldc, megamoe_dtype_t c_type, int64_t rows, int64_t cols,
                        int accumulate);

/* Element pointer of C at (row, col). */
static inline void *mm_gemm_c_at(void *C, int64_t ldc, megamoe_dtype_t c_type, int64_t row,
                                 int64_t col)
{
    return (char *)C + (size_t)(row * ldc + col) * megamoe_dtype_size(c_type);
}

/* Row r of A as stored (row list or A + r * lda). */
static inline const uint16_t *mm_gemm_a_row(const mm_gemm_args_t *args, int64_t r)
{
    return args->a_rows ? args->a_rows[r] : args->A + r * args->lda;
}

static inline float mm_bf16_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif /* MM_KERNELS_GEMM_IMPL_H */
