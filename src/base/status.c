/* Status strings and the thread-local last-error text: the bottom of base (libc only; the log
 * and everything above record errors here, error.c adds the logging). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

#define MM_LAST_ERROR_MAX 1024

static _Thread_local char mm_last_error_text[MM_LAST_ERROR_MAX];

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

megamoe_status_t mm_error_vquiet(megamoe_status_t status, const char *fmt, va_list ap)
{
    int off = snprintf(mm_last_error_text, sizeof mm_last_error_text, "%s: ",
                       megamoe_status_name(status));
    if (off > 0 && (size_t)off < sizeof mm_last_error_text)
        vsnprintf(mm_last_error_text + off, sizeof mm_last_error_text - (size_t)off, fmt, ap);
    return status;
}

megamoe_status_t mm_error_quiet(megamoe_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    megamoe_status_t st = mm_error_vquiet(status, fmt, ap);
    va_end(ap);
    return st;
}
