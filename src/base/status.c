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

/* Both writers format into a local buffer first: callers pass the previous message as an
 * argument ("...: %s", megamoe_last_error()) to wrap the cause, and formatting straight into
 * the buffer that argument points to overwrote the cause before it was read. */
void mm_set_last_error(const char *text)
{
    char tmp[MM_LAST_ERROR_MAX];
    snprintf(tmp, sizeof tmp, "%s", text);
    memcpy(mm_last_error_text, tmp, sizeof tmp);
}

megamoe_status_t mm_error_vquiet(megamoe_status_t status, const char *fmt, va_list ap)
{
    char tmp[MM_LAST_ERROR_MAX];
    int off = snprintf(tmp, sizeof tmp, "%s: ", megamoe_status_name(status));
    if (off > 0 && (size_t)off < sizeof tmp) vsnprintf(tmp + off, sizeof tmp - (size_t)off, fmt, ap);
    memcpy(mm_last_error_text, tmp, sizeof tmp);
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
