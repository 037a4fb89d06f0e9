/* megamoe — logging.
 *
 * Lines look like "[megamoe][rank 1][warn] message". The level comes from MEGAMOE_LOG_LEVEL
 * (read once, on first use) unless megamoe_log_set_level() was called. A callback replaces the
 * default writer (stderr); it receives the already formatted line without the trailing newline.
 */
#ifndef MEGAMOE_LOG_H
#define MEGAMOE_LOG_H

#include "megamoe/export.h"

#ifdef __cplusplus
extern "C" {
#endif
MEGAMOE_API_BEGIN

typedef enum megamoe_log_level {
    MEGAMOE_LOG_TRACE = 0,
    MEGAMOE_LOG_DEBUG = 1,
    MEGAMOE_LOG_INFO = 2,
    MEGAMOE_LOG_WARN = 3,
    MEGAMOE_LOG_ERROR = 4,
    MEGAMOE_LOG_OFF = 5
} megamoe_log_level_t;

typedef void (*megamoe_log_func_t)(megamoe_log_level_t level, const char *line, void *user_data);

/* Install a callback (NULL restores the stderr writer). Thread-safe. */
void megamoe_log_set_callback(megamoe_log_func_t func, void *user_data);

/* Override the level taken from MEGAMOE_LOG_LEVEL. */
void megamoe_log_set_level(megamoe_log_level_t level);
megamoe_log_level_t megamoe_log_get_level(void);

/* Rank shown in the prefix; -1 (the default until a communicator exists) shows RANK from the
 * environment when set, else no rank. */
void megamoe_log_set_rank(int rank);

/* Name of a level ("warn"); never NULL. */
const char *megamoe_log_level_name(megamoe_log_level_t level);

/* Emit a line from outside the library (tools, bindings). */
void megamoe_log(megamoe_log_level_t level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

MEGAMOE_API_END
#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_LOG_H */
