/* The scalar/vector switch of the kernels layer (see simd.h). */
#include <stdatomic.h>

#include "simd.h"

static atomic_int mm_vector_enabled = 1;

int mm_kernels_use_avx512(void)
{
    return atomic_load_explicit(&mm_vector_enabled, memory_order_relaxed) && mm_cpu_has_avx512();
}

int mm_kernels_set_vector(int enabled)
{
    return atomic_exchange(&mm_vector_enabled, enabled ? 1 : 0);
}
