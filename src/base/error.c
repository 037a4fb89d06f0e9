/* mm_error(): record the error (status.c), then log it once (log.c); and the error a binding
 * leaves for the next collective call (megamoe_fail_next_call), logged when taken. Above both,
 * so neither the log nor the status strings depend on the other. */
#include <stdarg.h>
#include <stdio.h>

#include "error.h"

static _Thread_local megamoe_status_t mm_tolerated; /* OK: none */

megamoe_status_t mm_error_tolerate(megamoe_status_t status)
{
    megamoe_status_t prev = mm_tolerated;
    mm_tolerated = status;
    return prev;
}

megamoe_status_t mm_error(megamoe_status_t status, const char *fmt, ...)
{
    const megamoe_log_level_t level =
        status != MEGAMOE_OK && status == mm_tolerated ? MEGAMOE_LOG_DEBUG : MEGAMOE_LOG_ERROR;
    const int log = mm_log_enabled(level); /* may record a bad log level: first */
    va_list ap;
    va_start(ap, fmt);
    megamoe_status_t st = mm_error_vquiet(status, fmt, ap);
    va_end(ap);
    if (log) mm_log_emit(level, "%s", megamoe_last_error());
    return st;
}

/* megamoe_fail_next_call(): the error the next collective call of this thread takes part with */
static _Thread_local megamoe_status_t mm_next_call_status;
static _Thread_local char mm_next_call_text[1024];

megamoe_status_t megamoe_fail_next_call(megamoe_status_t status, const char *message)
{
    if (status >= 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_fail_next_call: status %d is not an "
                        "error", (int)status);
    mm_next_call_status = status;
    snprintf(mm_next_call_text, sizeof mm_next_call_text, "%s: %s", megamoe_status_name(status),
             message && message[0] ? message : megamoe_status_str(status));
    return MEGAMOE_OK;
}

void megamoe_clear_next_call_error(void) { mm_next_call_status = MEGAMOE_OK; }

megamoe_status_t mm_take_next_call_error(void)
{
    megamoe_status_t st = mm_next_call_status;
    if (st == MEGAMOE_OK) return MEGAMOE_OK;
    mm_next_call_status = MEGAMOE_OK;
    mm_set_last_error(mm_next_call_text);
    MM_LOG(MEGAMOE_LOG_ERROR, "%s", mm_next_call_text); /* decided here, by the binding */
    return st;
}
