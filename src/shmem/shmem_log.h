/* SHMEM logging, gated by HYPER_PARALLEL_SHMEM_LOG_LEVEL (0 debug incl. allocation call sites,
 * 1 info, 2 error) in addition to the library level: a line is written when either allows it.
 * Errors always go through mm_error() (src/base/error.h). The level is re-read at every first
 * acquire (mm_shmem_log_reload), so a new lifecycle picks up a changed variable. */
#ifndef MM_SHMEM_LOG_H
#define MM_SHMEM_LOG_H

#include "base/error.h"

enum { MM_SHMEM_LOG_DEBUG = 0, MM_SHMEM_LOG_INFO = 1, MM_SHMEM_LOG_ERROR = 2 };

/* Re-read HYPER_PARALLEL_SHMEM_LOG_LEVEL (a bad value is reported and returned). */
megamoe_status_t mm_shmem_log_reload(void);
/* 1 when a SHMEM line of this level (MM_SHMEM_LOG_*) should be written. */
int mm_shmem_log_on(int level);

#define MM_SHMEM_DEBUG(...)                                                                \
    do {                                                                                   \
        if (mm_shmem_log_on(MM_SHMEM_LOG_DEBUG)) mm_log_emit(MEGAMOE_LOG_DEBUG, "shmem: " __VA_ARGS__); \
    } while (0)
#define MM_SHMEM_INFO(...)                                                                 \
    do {                                                                                   \
        if (mm_shmem_log_on(MM_SHMEM_LOG_INFO)) mm_log_emit(MEGAMOE_LOG_INFO, "shmem: " __VA_ARGS__); \
    } while (0)
/* Security and robustness events (rejected connections): always at warn level, they are
 * rare and an operator needs to see them. */
#define MM_SHMEM_WARN(...)                                                                 \
    do {                                                                                   \
        if (mm_shmem_log_on(MM_SHMEM_LOG_ERROR) || mm_log_enabled(MEGAMOE_LOG_WARN))       \
            mm_log_emit(MEGAMOE_LOG_WARN, "shmem: " __VA_ARGS__);                         \
    } while (0)

#endif /* MM_SHMEM_LOG_H */
