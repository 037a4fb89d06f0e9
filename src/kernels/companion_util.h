/* Helpers shared by the companion operators (include/megamoe/companion.h): element access by
 * dtype, tensor checks with messages that name the parameter, the struct_size rule, and the
 * OpenMP seam. Internal to the kernels layer. */
#ifndef MM_KERNELS_COMPANION_UTIL_H
#define MM_KERNELS_COMPANION_UTIL_H

#include <stdint.h>
#include <string.h>

#include "base/abi.h"
#include "base/error.h"
#include "megamoe/companion.h"
#include "megamoe/dtype.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Copy a caller's args struct (type: its C name) into a local holding the defaults, by the
 * caller's struct_size (base/abi.h: older callers' missing fields keep the defaults). */
#define MM_CX_ARGS(type, in, local, defaults)                                                    \
    do {                                                                                         \
        (local) = (defaults);                                                                    \
        MM_CHECK(mm_abi_copy_in(&(local), sizeof(local), (in), (type)));                         \
    } while (0)

static inline int mm_cx_present(const megamoe_tensor_t *t) { return t != NULL && t->data != NULL; }

static inline int64_t mm_cx_numel(const megamoe_tensor_t *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

static inline int mm_cx_is_float(megamoe_dtype_t d)
{
    return d == MEGAMOE_DTYPE_FP32 || d == MEGAMOE_DTYPE_BF16 || d == MEGAMOE_DTYPE_FP16;
}

/* Element i of a float array (fp32, bf16, fp16) as fp32, exactly. */
static inline float mm_cx_load(const void *p, megamoe_dtype_t d, int64_t i)
{
    switch (d) {
    case MEGAMOE_DTYPE_BF16: return megamoe_bf16_to_fp32(((const uint16_t *)p)[i]);
    case MEGAMOE_DTYPE_FP16: return megamoe_fp16_to_fp32(((const uint16_t *)p)[i]);
    case MEGAMOE_DTYPE_INT8: return (float)((const int8_t *)p)[i];
    case MEGAMOE_DTYPE_INT32: return (float)((const int32_t *)p)[i];
    default: return ((const float *)p)[i];
    }
}

/* Store fp32 v as element i of a float array, rounded to nearest even once. */
static inline void mm_cx_store(void *p, megamoe_dtype_t d, int64_t i, float v)
{
    switch (d) {
    case MEGAMOE_DTYPE_BF16: ((uint16_t *)p)[i] = megamoe_fp32_to_bf16(v); break;
    case MEGAMOE_DTYPE_FP16: ((uint16_t *)p)[i] = megamoe_fp32_to_fp16(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

/* An int64 or int32 element as int64. */
static inline int64_t mm_cx_index(const void *p, megamoe_dtype_t d, int64_t i)
{
    return d == MEGAMOE_DTYPE_INT64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
}

/* A float scale stored as fp32, bf16, fp16, or as int64 holding the fp32 bits in its low 32
 * bits (torch_npu's int64-coded scales). */
static inline float mm_cx_scale(const void *p, megamoe_dtype_t d, int64_t i)
{
    if (d == MEGAMOE_DTYPE_INT64) {
        uint32_t bits = (uint32_t)((const uint64_t *)p)[i];
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    return mm_cx_load(p, d, i);
}

/* Shape check: ndim and, where want[i] >= 0, the size of dim i. */
megamoe_status_t mm_cx_check_shape(const char *fn, const char *name, const megamoe_tensor_t *t,
                                   int ndim, const int64_t *want);
/* "[a, b, c]" of a tensor's shape into buf. */
const char *mm_cx_shape_str(const megamoe_tensor_t *t, char *buf, size_t len);

/* Row counts of a group list (megamoe_group_list_counts without the public struct checks). */
megamoe_status_t mm_cx_group_counts(const char *fn, const megamoe_tensor_t *group_list,
                                    int64_t type, int64_t groups, int64_t max_rows,
                                    int64_t *counts, int64_t *total_p);

static inline int mm_cx_threads(int threads) { return threads > 1 ? threads : 1; }

#endif /* MM_KERNELS_COMPANION_UTIL_H */
