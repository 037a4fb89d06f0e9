/* Process-wide profiling control: the registry of sessions, MEGAMOE_PROFILE, and the public
 * megamoe_profiler_* functions (include/megamoe/prof.h). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "megamoe/prof.h"

#include "base/env.h"
#include "base/error.h"

#include "prof_impl.h"
#include "trace.h"

int mm_prof_requested_flag;

static pthread_mutex_t mm_prof_lock = PTHREAD_MUTEX_INITIALIZER;
static mm_prof_session_t *mm_prof_sessions; /* registered, newest first */
static int mm_prof_next_serial;
static int mm_prof_started;   /* megamoe_profiler_start(), or MEGAMOE_PROFILE seen */
static int mm_prof_env_seen;  /* MEGAMOE_PROFILE acted on (once per process) */

static void mm_prof_update_requested_locked(void)
{
    __atomic_store_n(&mm_prof_requested_flag, mm_prof_started, __ATOMIC_RELAXED);
}

const char *mm_prof_env_dir(void)
{
    const char *dir = "";
    if (mm_env_string(MM_ENV_PROFILE, &dir) != MEGAMOE_OK || dir == NULL) return "";
    return dir;
}

megamoe_status_t mm_prof_control_init(void)
{
    const char *dir = "";
    MM_CHECK(mm_env_string(MM_ENV_PROFILE, &dir));
    if (dir != NULL && dir[0] != '\0') {
        pthread_mutex_lock(&mm_prof_lock);
        if (!mm_prof_env_seen) {
            mm_prof_env_seen = 1;
            mm_prof_started = 1;
            mm_prof_update_requested_locked();
            MM_INFO("MegaKernel profiling on (MEGAMOE_PROFILE=%s): traces are written when each "
                    "resource group closes",
                    dir);
        }
        pthread_mutex_unlock(&mm_prof_lock);
    }
    return MEGAMOE_OK;
}

/* MEGAMOE_PROFILE set in the environment of the process: recording is requested from the
 * start, so the first launch of every resource group creates its session. */
__attribute__((constructor)) static void mm_prof_control_at_load(void)
{
    if (mm_prof_control_init() != MEGAMOE_OK) megamoe_clear_last_error();
}

megamoe_status_t mm_prof_register(mm_prof_session_t *s)
{
    if (s == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_prof_register: session is NULL");
    pthread_mutex_lock(&mm_prof_lock);
    if (!s->registered) {
        s->serial = mm_prof_next_serial++;
        s->registered = 1;
        s->next = mm_prof_sessions;
        mm_prof_sessions = s;
    }
    mm_prof_set_active(s, mm_prof_started);
    pthread_mutex_unlock(&mm_prof_lock);
    return MEGAMOE_OK;
}

void mm_prof_unregister(mm_prof_session_t *s)
{
    if (s == NULL) return;
    pthread_mutex_lock(&mm_prof_lock);
    if (s->registered) {
        for (mm_prof_session_t **p = &mm_prof_sessions; *p != NULL; p = &(*p)->next)
            if (*p == s) {
                *p = s->next;
                break;
            }
        s->registered = 0;
        s->next = NULL;
    }
    pthread_mutex_unlock(&mm_prof_lock);
}

int mm_prof_serial(const mm_prof_session_t *s) { return s != NULL ? s->serial : -1; }

static int mm_prof_has_records(const mm_prof_session_t *s)
{
    if (s->n_inv > 0) return 1;
    for (int i = 0; i < mm_prof_ring_count(s); i++)
        if (mm_prof_ring_records(mm_prof_ring_at(s, i)) > 0 ||
            mm_prof_ring_dropped(mm_prof_ring_at(s, i)) > 0)
            return 1;
    return 0;
}

megamoe_status_t mm_prof_retire(mm_prof_session_t *s)
{
    if (s == NULL) return MEGAMOE_OK;
    megamoe_status_t st = MEGAMOE_OK;
    const char *dir = mm_prof_env_dir();
    if (dir[0] != '\0' && mm_prof_has_records(s)) {
        size_t n = strlen(dir) + 48;
        char *path = malloc(n);
        if (path == NULL) {
            st = mm_error(MEGAMOE_OUT_OF_MEMORY, "out of memory");
        } else {
            if (s->serial <= 0)
                snprintf(path, n, "%s/trace_%d.json", dir, s->head.rank);
            else
                snprintf(path, n, "%s/trace_%d.g%d.json", dir, s->head.rank, s->serial);
            const mm_prof_session_t *one = s;
            st = mm_prof_mkdirs(dir);
            if (st == MEGAMOE_OK) st = mm_prof_export_file(&one, 1, path);
            if (st == MEGAMOE_OK) MM_INFO("MegaKernel trace written to %s", path);
            free(path);
        }
    }
    mm_prof_session_destroy(s); /* unregisters */
    return st;
}

/* ---- public: process-wide profiler ------------------------------------------------------- */

megamoe_status_t megamoe_profiler_start(void)
{
    pthread_mutex_lock(&mm_prof_lock);
    mm_prof_started = 1;
    mm_prof_update_requested_locked();
    for (mm_prof_session_t *s = mm_prof_sessions; s != NULL; s = s->next) mm_prof_set_active(s, 1);
    pthread_mutex_unlock(&mm_prof_lock);
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_profiler_stop(void)
{
    pthread_mutex_lock(&mm_prof_lock);
    mm_prof_started = 0; /* also ends recording that MEGAMOE_PROFILE started */
    mm_prof_update_requested_locked();
    for (mm_prof_session_t *s = mm_prof_sessions; s != NULL; s = s->next) mm_prof_set_active(s, 0);
    pthread_mutex_unlock(&mm_prof_lock);
    return MEGAMOE_OK;
}

int megamoe_profiler_is_started(void) { return mm_prof_requested(); }

void megamoe_profiler_reset(void)
{
    pthread_mutex_lock(&mm_prof_lock);
    for (mm_prof_session_t *s = mm_prof_sessions; s != NULL; s = s->next) mm_prof_reset(s);
    pthread_mutex_unlock(&mm_prof_lock);
}

int megamoe_profiler_session_count(void)
{
    int n = 0;
    pthread_mutex_lock(&mm_prof_lock);
    for (mm_prof_session_t *s = mm_prof_sessions; s != NULL; s = s->next) n++;
    pthread_mutex_unlock(&mm_prof_lock);
    return n;
}

void mm_prof_summary_to_public(const mm_prof_summary_t *in, megamoe_profile_summary_t *out)
{
    out->wait_ns += in->wait_ns;
    out->compute_ns += in->compute_ns;
    out->signal_ns += in->signal_ns;
    out->launch_ns += in->launch_ns;
    out->records += in->records;
    out->dropped += in->dropped;
    out->invocations += in->invocations;
    out->workers += in->workers;
    out->sessions++;
}

megamoe_status_t megamoe_profiler_get_summary(megamoe_profile_summary_t *summary_p)
{
    if (summary_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_profiler_get_summary: summary_p is NULL");
    megamoe_profile_summary_t sum;
    memset(&sum, 0, sizeof sum);
    uint64_t first = UINT64_MAX, last = 0;
    pthread_mutex_lock(&mm_prof_lock);
    for (mm_prof_session_t *s = mm_prof_sessions; s != NULL; s = s->next) {
        mm_prof_summary_t one;
        mm_prof_summarize(s, &one);
        mm_prof_summary_to_public(&one, &sum);
        /* Wall over all sessions: from their own first/last records. */
        for (int i = 0; i < mm_prof_ring_count(s); i++) {
            const mm_prof_ring_t *r = mm_prof_ring_at(s, i);
            const uint32_t n = mm_prof_ring_records(r);
            for (uint32_t k = 0; k < n; k++) {
                if (r->records[k].start_ns < first) first = r->records[k].start_ns;
                if (r->records[k].end_ns > last) last = r->records[k].end_ns;
            }
        }
    }
    pthread_mutex_unlock(&mm_prof_lock);
    sum.wall_ns = last > first ? last - first : 0;
    *summary_p = sum;
    return MEGAMOE_OK;
}

/* The registered sessions, oldest first, while holding the lock. */
static megamoe_status_t mm_prof_export_locked(const char *path)
{
    int n = 0;
    for (mm_prof_session_t *s = mm_prof_sessions; s != NULL; s = s->next) n++;
    const mm_prof_session_t **list = calloc(n ? (size_t)n : 1, sizeof *list);
    if (list == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "out of memory");
    int i = n;
    for (mm_prof_session_t *s = mm_prof_sessions; s != NULL; s = s->next) list[--i] = s;
    megamoe_status_t st = mm_prof_export_file(list, n, path);
    free(list);
    return st;
}

megamoe_status_t megamoe_profiler_export(const char *path)
{
    if (path == NULL || path[0] == '\0')
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_profiler_export: path is empty");
    pthread_mutex_lock(&mm_prof_lock);
    megamoe_status_t st = mm_prof_export_locked(path);
    pthread_mutex_unlock(&mm_prof_lock);
    return st;
}

megamoe_status_t megamoe_profiler_export_dir(const char *dir)
{
    if (dir == NULL || dir[0] == '\0')
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_profiler_export_dir: dir is empty");
    pthread_mutex_lock(&mm_prof_lock);
    int rank = -1;
    for (mm_prof_session_t *s = mm_prof_sessions; s != NULL; s = s->next) rank = s->head.rank;
    if (rank < 0) {
        int64_t r = 0;
        if (mm_env_is_set(MM_ENV_RANK) && mm_env_int(MM_ENV_RANK, &r) != MEGAMOE_OK) r = 0;
        rank = (int)r;
    }
    size_t n = strlen(dir) + 32;
    char *path = malloc(n);
    megamoe_status_t st;
    if (path == NULL) {
        st = mm_error(MEGAMOE_OUT_OF_MEMORY, "out of memory");
    } else {
        snprintf(path, n, "%s/trace_%d.json", dir, rank);
        st = mm_prof_mkdirs(dir);
        if (st == MEGAMOE_OK) st = mm_prof_export_locked(path);
        free(path);
    }
    pthread_mutex_unlock(&mm_prof_lock);
    return st;
}
