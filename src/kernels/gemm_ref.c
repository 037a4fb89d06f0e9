/* The reference backend: plain C, fp32 accumulation with k ascending, every form and option.
 * It is the definition the tests hold the fast backends to and the fallback without oneDNN.
 * Its "packed" weight is a dense [K,N] bf16 copy (NT transposed), which exercises the
 * pack/update machinery on every machine. */
#include <stdlib.h>

#include "base/alloc.h"
#include "base/error.h"
#include "gemm_impl.h"

static megamoe_status_t mm_ref_gemm(const mm_gemm_args_t *args)
{
    mm_gemm_args_t a = *args;
    mm_gemm_form_t form = a.form;
    if (a.weight != NULL) { /* dense [K,N] copy: an NN product */
        a.B = a.weight->data;
        a.ldb = a.N;
        form = MM_GEMM_NN;
    }
    int64_t cols = a.n1 - a.n0;
    float *acc = mm_gemm_scratch(0, (size_t)cols * sizeof(float));
    if (acc == NULL) return MEGAMOE_OUT_OF_MEMORY;
    for (int64_t i = a.m0; i < a.m1; i++) {
        if (form == MM_GEMM_NT) {
            const uint16_t *ar = mm_gemm_a_row(&a, i);
            for (int64_t j = 0; j < cols; j++) {
                const uint16_t *br = a.B + (a.n0 + j) * a.ldb;
                float s = 0.0f;
                for (int64_t k = 0; k < a.K; k++) s += mm_bf16_f32(ar[k]) * mm_bf16_f32(br[k]);
                acc[j] = s;
            }
        } else {
            for (int64_t j = 0; j < cols; j++) acc[j] = 0.0f;
            const uint16_t *ar = form == MM_GEMM_NN ? mm_gemm_a_row(&a, i) : NULL;
            for (int64_t k = 0; k < a.K; k++) {
                float av = form == MM_GEMM_NN ? mm_bf16_f32(ar[k])
                                              : mm_bf16_f32(mm_gemm_a_row(&a, k)[i]);
                const uint16_t *br = a.B + k * a.ldb + a.n0;
                for (int64_t j = 0; j < cols; j++) acc[j] += av * mm_bf16_f32(br[j]);
            }
        }
        mm_gemm_epilogue(acc, cols, 1, cols, mm_gemm_c_at(a.C, a.ldc, a.c_type, i, a.n0), a.ldc,
                         a.c_type, a.accumulate);
    }
    return MEGAMOE_OK;
}

static megamoe_status_t mm_ref_weight_pack(mm_gemm_weight_t *w)
{
    void *p = NULL;
    size_t bytes = (size_t)w->K * (size_t)w->N * sizeof(uint16_t);
    MM_CHECK(mm_aligned_alloc(bytes, MM_CACHE_LINE, "reference packed weight", &p));
    uint16_t *d = p;
    for (int64_t k = 0; k < w->K; k++)
        for (int64_t n = 0; n < w->N; n++)
            d[k * w->N + n] = w->form == MM_GEMM_NT ? w->src[n * w->ld + k] : w->src[k * w->ld + n];
    w->data = p;
    w->bytes = bytes;
    w->packed = 1;
    w->n_align = 1;
    return MEGAMOE_OK;
}

static void mm_ref_weight_release(mm_gemm_weight_t *w) { mm_aligned_free(w->data); }

const mm_gemm_backend_ops_t mm_gemm_ref_ops = {
    .name = MM_GEMM_NAME_REF,
    .probe = NULL,
    .gemm = mm_ref_gemm,
    .weight_pack = mm_ref_weight_pack,
    .weight_release = mm_ref_weight_release,
    .gemm_grouped = NULL,
};
