/* Internal error and logging helpers.
 *
 * Rule (UCX style): an error is logged once, where it is decided, with a message that names the
 * fix; callers above only propagate the status. mm_error() logs at error level, stores the text
 * as the thread's megamoe_last_error() and returns the status, so the usual form is
 *     return mm_error(MEGAMOE_INVALID_ARGUMENT, "top_k %d must be in [1, %d]", k, e);
 *
 * Inside base the files call downwards only (docs/architecture.md): status.c (strings, the
 * last-error text, mm_error_quiet) < log.c (level, prefix, callback) < error.c (mm_error) <
 * env.c and the rest. The log reads its own variable without env.c, whose errors it logs.
 */
#ifndef MM_BASE_ERROR_H
#define MM_BASE_ERROR_H

#include <stdarg.h>

#include "megamoe/log.h"
#include "megamoe/status.h"

#if defined(__GNUC__)
#define MM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MM_PRINTF(a, b)
#endif

/* Log at error level, remember as last error, return status. */
megamoe_status_t mm_error(megamoe_status_t status, const char *fmt, ...) MM_PRINTF(2, 3);

/* Same, but the message is only remembered, not logged (for errors the caller expects and
 * handles, e.g. probing). */
megamoe_status_t mm_error_quiet(megamoe_status_t status, const char *fmt, ...) MM_PRINTF(2, 3);

/* While this thread tolerates `status` (the caller will accept it as an outcome, e.g. a send
 * to a member that may already have left), mm_error() logs that status at debug level instead
 * of error level; the text is still remembered. Returns the status tolerated before (restore
 * it when done); MEGAMOE_OK tolerates nothing. */
megamoe_status_t mm_error_tolerate(megamoe_status_t status);

/* mm_error_quiet with a va_list. */
megamoe_status_t mm_error_vquiet(megamoe_status_t status, const char *fmt, va_list ap);

/* The error megamoe_fail_next_call() left for this thread's next collective call (consumed:
 * the text becomes the last error), or OK. Every collective entry calls it first and takes
 * part in its first exchange with the result as its local status. */
megamoe_status_t mm_take_next_call_error(void);

/* Remember an error without changing the text when one was already set by a lower layer. */
void mm_set_last_error(const char *text);

int mm_log_enabled(megamoe_log_level_t level);
void mm_log_emit(megamoe_log_level_t level, const char *fmt, ...) MM_PRINTF(2, 3);

#define MM_LOG(level, ...)                                                                 \
    do {                                                                                   \
        if (mm_log_enabled(level)) mm_log_emit(level, __VA_ARGS__);                        \
    } while (0)
#define MM_TRACE(...) MM_LOG(MEGAMOE_LOG_TRACE, __VA_ARGS__)
#define MM_DEBUG(...) MM_LOG(MEGAMOE_LOG_DEBUG, __VA_ARGS__)
#define MM_INFO(...) MM_LOG(MEGAMOE_LOG_INFO, __VA_ARGS__)
#define MM_WARN(...) MM_LOG(MEGAMOE_LOG_WARN, __VA_ARGS__)

/* Propagate a failing status. */
#define MM_CHECK(expr)                                                                     \
    do {                                                                                   \
        megamoe_status_t mm_check_status_ = (expr);                                        \
        if (mm_check_status_ != MEGAMOE_OK) return mm_check_status_;                       \
    } while (0)

#define MM_UNUSED(x) (void)(x)
#define MM_LIKELY(x) __builtin_expect(!!(x), 1)
#define MM_UNLIKELY(x) __builtin_expect(!!(x), 0)

#endif /* MM_BASE_ERROR_H */
