/* SHMEM log level (HYPER_PARALLEL_SHMEM_LOG_LEVEL). */
#include <stdatomic.h>
#include <stdint.h>

#include "base/env.h"
#include "shmem_log.h"

static atomic_int mm_shmem_log_level = -1; /* -1: not read yet */

megamoe_status_t mm_shmem_log_reload(void)
{
    int64_t v = MM_SHMEM_LOG_ERROR;
    megamoe_status_t st = mm_env_int(MM_ENV_SHMEM_LOG_LEVEL, &v);
    atomic_store(&mm_shmem_log_level, st == MEGAMOE_OK ? (int)v : MM_SHMEM_LOG_ERROR);
    return st;
}

int mm_shmem_log_on(int level)
{
    int threshold = atomic_load_explicit(&mm_shmem_log_level, memory_order_relaxed);
    if (threshold < 0) {
        int64_t v = MM_SHMEM_LOG_ERROR;
        if (mm_env_int(MM_ENV_SHMEM_LOG_LEVEL, &v) != MEGAMOE_OK) v = MM_SHMEM_LOG_ERROR;
        threshold = (int)v;
        atomic_store_explicit(&mm_shmem_log_level, threshold, memory_order_relaxed);
    }
    if (level >= threshold) return 1;
    /* The library level still applies: MEGAMOE_LOG_LEVEL=debug shows SHMEM debug lines. */
    megamoe_log_level_t lib = level == MM_SHMEM_LOG_DEBUG  ? MEGAMOE_LOG_DEBUG
                              : level == MM_SHMEM_LOG_INFO ? MEGAMOE_LOG_INFO
                                                           : MEGAMOE_LOG_ERROR;
    return mm_log_enabled(lib);
}
