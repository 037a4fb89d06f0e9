/* Logging: level from MEGAMOE_LOG_LEVEL (read once), rank prefix, user callback.
 *
 * Below env.c (which logs its errors): the level is read straight from the table's row
 * (env_ids.h), and a bad value only records the error (status.c) and keeps the default. */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "env_ids.h"
#include "error.h"

static atomic_int mm_log_level = -1; /* -1: not yet read from the environment */
static atomic_int mm_log_rank = -1;
static pthread_mutex_t mm_log_lock = PTHREAD_MUTEX_INITIALIZER;
static megamoe_log_func_t mm_log_func;
static void *mm_log_user;

static const char *const mm_level_names[] = {"trace", "debug", "info", "warn", "error", "off"};

const char *megamoe_log_level_name(megamoe_log_level_t level)
{
    if ((int)level < 0 || level > MEGAMOE_LOG_OFF) return "unknown";
    return mm_level_names[level];
}

static int mm_log_level_resolve(void)
{
    int level = atomic_load_explicit(&mm_log_level, memory_order_relaxed);
    if (level >= 0) return level;
    const char *name = mm_env_row_name(MM_ENV_LOG_LEVEL);
    const char *choices = mm_env_row_choices(MM_ENV_LOG_LEVEL); /* = mm_level_names' order */
    const char *text = getenv(name);
    int index = mm_env_choice_index(choices, mm_env_row_default(MM_ENV_LOG_LEVEL));
    if (text != NULL) {
        int chosen = mm_env_choice_index(choices, text);
        if (chosen >= 0) index = chosen;
        else /* recorded, not logged (that would recurse); the default lets it be shown */
            mm_error_quiet(MEGAMOE_INVALID_ARGUMENT, "%s='%s' is not accepted; use one of %s",
                           name, text, choices);
    }
    if (index < 0) index = MEGAMOE_LOG_WARN;
    int expected = -1;
    atomic_compare_exchange_strong(&mm_log_level, &expected, index);
    return atomic_load(&mm_log_level);
}

void megamoe_log_set_level(megamoe_log_level_t level)
{
    if ((int)level < 0 || level > MEGAMOE_LOG_OFF) return;
    atomic_store(&mm_log_level, (int)level);
}

megamoe_log_level_t megamoe_log_get_level(void) { return (megamoe_log_level_t)mm_log_level_resolve(); }

void megamoe_log_set_rank(int rank) { atomic_store(&mm_log_rank, rank); }

void megamoe_log_set_callback(megamoe_log_func_t func, void *user_data)
{
    pthread_mutex_lock(&mm_log_lock);
    mm_log_func = func;
    mm_log_user = user_data;
    pthread_mutex_unlock(&mm_log_lock);
}

int mm_log_enabled(megamoe_log_level_t level) { return (int)level >= mm_log_level_resolve(); }

static void mm_log_emit_v(megamoe_log_level_t level, const char *fmt, va_list ap)
{
    char line[2048];
    int rank = atomic_load_explicit(&mm_log_rank, memory_order_relaxed);
    size_t off;
    if (rank >= 0) {
        off = (size_t)snprintf(line, sizeof line, "[megamoe][rank %d][%s] ", rank,
                               megamoe_log_level_name(level));
    } else {
        const char *env_rank = getenv(mm_env_row_name(MM_ENV_RANK));
        if (env_rank && *env_rank)
            off = (size_t)snprintf(line, sizeof line, "[megamoe][rank %.16s][%s] ", env_rank,
                                   megamoe_log_level_name(level));
        else
            off = (size_t)snprintf(line, sizeof line, "[megamoe][%s] ",
                                   megamoe_log_level_name(level));
    }
    if (off < sizeof line) vsnprintf(line + off, sizeof line - off, fmt, ap);
    pthread_mutex_lock(&mm_log_lock);
    if (mm_log_func) {
        mm_log_func(level, line, mm_log_user);
    } else {
        fprintf(stderr, "%s\n", line);
        fflush(stderr);
    }
    pthread_mutex_unlock(&mm_log_lock);
}

void mm_log_emit(megamoe_log_level_t level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mm_log_emit_v(level, fmt, ap);
    va_end(ap);
}

void megamoe_log(megamoe_log_level_t level, const char *fmt, ...)
{
    if (!mm_log_enabled(level)) return;
    va_list ap;
    va_start(ap, fmt);
    mm_log_emit_v(level, fmt, ap);
    va_end(ap);
}
