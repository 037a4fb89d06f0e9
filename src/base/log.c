/* Logging: level from MEGAMOE_LOG_LEVEL (read once), rank prefix, user callback. */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "env.h"
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
    int index = MEGAMOE_LOG_WARN;
    if (mm_env_enum(MM_ENV_LOG_LEVEL, &index) != MEGAMOE_OK) {
        /* The bad value was recorded as last error; fall back to the default so the error
         * itself can still be shown. */
        index = MEGAMOE_LOG_WARN;
    }
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
        const char *env_rank = getenv("RANK");
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
