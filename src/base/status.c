/* Status strings and the thread-local last-error text. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

#define MM_LAST_ERROR_MAX 1024

static _Thread_local char mm_last_error_text[MM_LAST_ERROR_MAX];
/* megamoe_fail_next_call(): the error the next collective call of this thread takes part with */
static _Thread_local megamoe_status_t mm_next_call_status;
static _Thread_local char mm_next_call_text[MM_LAST_ERROR_MAX];

const char *megamoe_status_str(megamoe_status_t status)
{
    switch (status) {
#define MM_STATUS_STR_(name, value, text) \
    case MEGAMOE_##name:                  \
        return text;
        MEGAMOE_STATUS_MAP(MM_STATUS_STR_)
#undef MM_STATUS_STR_
    }
    return "unknown status";
}

const char *megamoe_status_name(megamoe_status_t status)
{
    switch (status) {
#define MM_STATUS_NAME_(name, value, text) \
    case MEGAMOE_##name:                   \
        return #name;
        MEGAMOE_STATUS_MAP(MM_STATUS_NAME_)
#undef MM_STATUS_NAME_
    }
    return "UNKNOWN";
}

const char *megamoe_last_error(void) { return mm_last_error_text; }

void megamoe_clear_last_error(void) { mm_last_error_text[0] = '\0'; }

void mm_set_last_error(const char *text)
{
    snprintf(mm_last_error_text, sizeof mm_last_error_text, "%s", text);
}

static megamoe_status_t mm_error_v(megamoe_status_t status, int log, const char *fmt,
                                   va_list ap)
{
    int off = snprintf(mm_last_error_text, sizeof mm_last_error_text, "%s: ",
                       megamoe_status_name(status));
    if (off > 0 && (size_t)off < sizeof mm_last_error_text)
        vsnprintf(mm_last_error_text + off, sizeof mm_last_error_text - (size_t)off, fmt, ap);
    if (log) mm_log_emit(MEGAMOE_LOG_ERROR, "%s", mm_last_error_text);
    return status;
}

megamoe_status_t mm_error(megamoe_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    megamoe_status_t st = mm_error_v(status, mm_log_enabled(MEGAMOE_LOG_ERROR), fmt, ap);
    va_end(ap);
    return st;
}

megamoe_status_t mm_error_quiet(megamoe_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    megamoe_status_t st = mm_error_v(status, 0, fmt, ap);
    va_end(ap);
    return st;
}

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
