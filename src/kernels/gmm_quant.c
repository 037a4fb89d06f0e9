/* Quantised variants of megamoe_grouped_matmul: W8A8 (int32 output, or per-channel x
 * per-token dequantised output), W8A16 and W4A8, on the quantised GEMM kernels. */
#include "companion_util.h"
#include "gmm_internal.h"

megamoe_status_t mm_gmm_quant(const mm_gmm_plan_t *p)
{
    return mm_error(MEGAMOE_UNSUPPORTED,
                    "megamoe_grouped_matmul: x of type %s: the quantised variants (W8A8, W4A8) "
                    "need the quantised GEMM kernels, which this build does not have yet",
                    megamoe_dtype_name(p->a->x.dtype));
}

megamoe_status_t mm_gmm_quant_pack(void **packs, int64_t e, const megamoe_grouped_matmul_args_t *a,
                                   const mm_gmm_plan_t *geo, const void *src, uint64_t version,
                                   int *repacked)
{
    (void)packs, (void)e, (void)a, (void)geo, (void)src, (void)version, (void)repacked;
    return mm_error(MEGAMOE_UNSUPPORTED, "megamoe_gmm_weights: int8 / int4 weights need the "
                    "quantised GEMM kernels, which this build does not have yet");
}

size_t mm_gmm_quant_packed_bytes(const void *pack)
{
    (void)pack;
    return 0;
}

void mm_gmm_quant_destroy(void *pack) { (void)pack; }
