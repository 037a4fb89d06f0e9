/* Profiling sessions: rings, invocation brackets, reset and the totals. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"

#include "prof_impl.h"

megamoe_status_t mm_prof_session_create(int rank, int n_cube, int n_vector,
                                        uint32_t records_per_worker,
                                        const char *const *stage_names, int n_stages,
                                        mm_prof_session_t **session_p)
{
    if (session_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "profiling session: session_p is NULL");
    if (rank < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "profiling session: rank %d must be >= 0", rank);
    if (n_cube < 0 || n_vector < 0 || n_cube > MM_PROF_MAX_WORKERS ||
        n_vector > MM_PROF_MAX_WORKERS || n_cube + n_vector == 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "profiling session: %d cube and %d vector workers; each count must be in "
                        "[0, %d] with at least one worker in total",
                        n_cube, n_vector, MM_PROF_MAX_WORKERS);
    if (records_per_worker < 1 || records_per_worker > MM_PROF_MAX_RECORDS)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "profiling session: records_per_worker %u must be in [1, %u]",
                        records_per_worker, MM_PROF_MAX_RECORDS);
    if (n_stages < 1 || n_stages > MM_PROF_MAX_STAGES || stage_names == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "profiling session: %d stage names; pass a table of 1 to %d names",
                        n_stages, MM_PROF_MAX_STAGES);
    for (int i = 0; i < n_stages; i++) {
        if (stage_names[i] == NULL || stage_names[i][0] == '\0')
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "profiling session: stage name %d is empty; every stage needs a name",
                            i);
        if (strlen(stage_names[i]) >= MM_PROF_MAX_NAME)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "profiling session: stage name %d ('%.20s...') is longer than %d bytes",
                            i, stage_names[i], MM_PROF_MAX_NAME - 1);
    }

    mm_prof_session_t *s = calloc(1, sizeof *s);
    if (s == NULL)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate a profiling session");
    s->head.active = 1;
    s->head.rank = rank;
    s->n_cube = n_cube;
    s->n_vector = n_vector;
    s->capacity = records_per_worker;
    s->serial = -1;
    s->n_stages = n_stages;
    if (gethostname(s->host, sizeof s->host - 1) != 0) strcpy(s->host, "unknown");
    s->host[sizeof s->host - 1] = '\0';

    megamoe_status_t st = MEGAMOE_OK;
    s->stage_names = calloc((size_t)n_stages, sizeof *s->stage_names);
    if (s->stage_names == NULL) {
        st = mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate %d profiling stage names", n_stages);
        goto fail;
    }
    for (int i = 0; i < n_stages; i++) strcpy(s->stage_names[i], stage_names[i]);

    int n = n_cube + n_vector;
    st = mm_aligned_calloc((size_t)n * sizeof(mm_prof_ring_slot_t), MM_CACHE_LINE,
                           "profiling rings", (void **)&s->slots);
    if (st != MEGAMOE_OK) goto fail;
    for (int i = 0; i < n; i++) {
        mm_prof_ring_t *r = mm_prof_ring_at(s, i);
        r->capacity = records_per_worker;
        r->role = i < n_cube ? MM_PROF_CUBE : MM_PROF_VECTOR;
        r->index = i < n_cube ? i : i - n_cube;
    }
    for (int i = 0; i < n; i++) {
        mm_prof_ring_t *r = mm_prof_ring_at(s, i);
        size_t bytes = (size_t)records_per_worker * sizeof(mm_prof_record_t);
        st = mm_aligned_alloc(bytes, 4096, "profiling records", (void **)&r->records);
        if (st != MEGAMOE_OK) goto fail;
        /* Touch every page now so that pushes never take a page fault. */
        memset(r->records, 0, bytes);
    }
    s->inv_cap = 64;
    s->inv = calloc(s->inv_cap, sizeof *s->inv);
    if (s->inv == NULL) {
        st = mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate the profiling invocation table");
        goto fail;
    }
    *session_p = s;
    return MEGAMOE_OK;

fail:
    mm_prof_session_destroy(s);
    return st;
}

void mm_prof_session_destroy(mm_prof_session_t *s)
{
    if (s == NULL) return;
    mm_prof_unregister(s);
    if (s->slots != NULL) {
        for (int i = 0; i < mm_prof_ring_count(s); i++)
            mm_aligned_free(mm_prof_ring_at(s, i)->records);
        mm_aligned_free(s->slots);
    }
    free(s->stage_names);
    free(s->inv);
    free(s);
}

mm_prof_ring_t *mm_prof_ring(mm_prof_session_t *s, mm_prof_role_t role, int index)
{
    if (s == NULL || index < 0) return NULL;
    if (role == MM_PROF_CUBE) return index < s->n_cube ? mm_prof_ring_at(s, index) : NULL;
    if (role == MM_PROF_VECTOR)
        return index < s->n_vector ? mm_prof_ring_at(s, s->n_cube + index) : NULL;
    return NULL;
}

uint32_t mm_prof_begin(mm_prof_session_t *s, const char *direction)
{
    uint64_t now = mm_now_ns();
    if (s->inv_open) {
        /* The previous launch never ended (its caller failed before mm_prof_end): close it
         * here so its spans still have a window, and let the export warn. */
        s->inv_unclosed++;
        if (s->n_inv > 0 && s->n_inv <= s->inv_cap) s->inv[s->n_inv - 1].end_ns = now;
    }
    uint32_t index = s->n_inv;
    if (index == s->inv_cap && s->inv_cap < UINT32_MAX / 2) {
        /* Growth happens between launches, never on the push path. */
        mm_prof_invocation_t *grown = realloc(s->inv, (size_t)s->inv_cap * 2 * sizeof *grown);
        if (grown != NULL) {
            memset(grown + s->inv_cap, 0, (size_t)s->inv_cap * sizeof *grown);
            s->inv = grown;
            s->inv_cap *= 2;
        }
    }
    if (index < s->inv_cap) {
        mm_prof_invocation_t *inv = &s->inv[index];
        inv->begin_ns = now;
        inv->end_ns = 0;
        const char *d = direction != NULL && direction[0] != '\0' ? direction : "unknown";
        size_t len = strlen(d);
        if (len >= MM_PROF_MAX_NAME) len = MM_PROF_MAX_NAME - 1;
        memcpy(inv->direction, d, len);
        inv->direction[len] = '\0';
        inv->note[0] = '\0';
    } else {
        s->inv_lost++;
    }
    s->n_inv = index + 1;
    s->inv_open = 1;
    return index;
}

void mm_prof_end(mm_prof_session_t *s)
{
    if (!s->inv_open) return;
    uint64_t now = mm_now_ns();
    if (s->n_inv > 0 && s->n_inv <= s->inv_cap) {
        mm_prof_invocation_t *inv = &s->inv[s->n_inv - 1];
        inv->end_ns = now > inv->begin_ns ? now : inv->begin_ns + 1;
    }
    s->inv_open = 0;
}

void mm_prof_note(mm_prof_session_t *s, const char *text)
{
    if (s == NULL || !s->inv_open || text == NULL || s->n_inv == 0 || s->n_inv > s->inv_cap)
        return;
    mm_prof_invocation_t *inv = &s->inv[s->n_inv - 1];
    size_t len = strlen(text);
    if (len >= MM_PROF_MAX_NOTE) len = MM_PROF_MAX_NOTE - 1;
    memcpy(inv->note, text, len);
    inv->note[len] = '\0';
}

void mm_prof_set_active(mm_prof_session_t *s, int active)
{
    if (s != NULL) __atomic_store_n(&s->head.active, active ? 1 : 0, __ATOMIC_RELAXED);
}

int mm_prof_rank(const mm_prof_session_t *s) { return s->head.rank; }

int mm_prof_workers(const mm_prof_session_t *s, mm_prof_role_t role)
{
    return role == MM_PROF_CUBE ? s->n_cube : role == MM_PROF_VECTOR ? s->n_vector : 0;
}

uint32_t mm_prof_capacity(const mm_prof_session_t *s) { return s->capacity; }

uint32_t mm_prof_invocation_count(const mm_prof_session_t *s) { return s->n_inv; }

const char *mm_prof_stage_name(const mm_prof_session_t *s, int stage)
{
    return stage >= 0 && stage < s->n_stages ? s->stage_names[stage] : NULL;
}

void mm_prof_reset(mm_prof_session_t *s)
{
    if (s == NULL) return;
    for (int i = 0; i < mm_prof_ring_count(s); i++) {
        mm_prof_ring_t *r = mm_prof_ring_at(s, i);
        __atomic_store_n(&r->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&r->dropped, 0, __ATOMIC_RELAXED);
    }
    s->n_inv = 0;
    s->inv_open = 0;
    s->inv_lost = 0;
    s->inv_unclosed = 0;
}

static uint64_t mm_prof_launch_ns(const mm_prof_session_t *s)
{
    uint64_t total = 0;
    uint32_t n = s->n_inv < s->inv_cap ? s->n_inv : s->inv_cap;
    for (uint32_t i = 0; i < n; i++)
        if (s->inv[i].end_ns > s->inv[i].begin_ns) total += s->inv[i].end_ns - s->inv[i].begin_ns;
    return total;
}

static void mm_prof_add_ring(const mm_prof_ring_t *r, mm_prof_summary_t *sum, uint64_t *first,
                             uint64_t *last)
{
    const uint32_t n = mm_prof_ring_records(r);
    for (uint32_t i = 0; i < n; i++) {
        const mm_prof_record_t *rec = &r->records[i];
        uint64_t d = rec->end_ns > rec->start_ns ? rec->end_ns - rec->start_ns : 0;
        if (rec->kind == MM_PROF_WAIT) sum->wait_ns += d;
        else if (rec->kind == MM_PROF_COMPUTE) sum->compute_ns += d;
        else if (rec->kind == MM_PROF_SIGNAL) sum->signal_ns += d;
        if (rec->start_ns < *first) *first = rec->start_ns;
        uint64_t end = rec->end_ns > rec->start_ns ? rec->end_ns : rec->start_ns;
        if (end > *last) *last = end;
    }
    sum->records += n;
    sum->dropped += mm_prof_ring_dropped(r);
}

void mm_prof_summarize(const mm_prof_session_t *s, mm_prof_summary_t *summary_p)
{
    mm_prof_summary_t sum;
    memset(&sum, 0, sizeof sum);
    uint64_t first = UINT64_MAX, last = 0;
    for (int i = 0; i < mm_prof_ring_count(s); i++)
        mm_prof_add_ring(mm_prof_ring_at(s, i), &sum, &first, &last);
    sum.wall_ns = last > first ? last - first : 0;
    sum.workers = mm_prof_ring_count(s);
    sum.launch_ns = mm_prof_launch_ns(s);
    sum.invocations = s->n_inv;
    *summary_p = sum;
}

megamoe_status_t mm_prof_summarize_worker(const mm_prof_session_t *s, mm_prof_role_t role,
                                          int index, mm_prof_summary_t *summary_p)
{
    const mm_prof_ring_t *r = mm_prof_ring((mm_prof_session_t *)s, role, index);
    if (r == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "profiling session has no %s worker %d (it has %d)",
                        role == MM_PROF_CUBE ? "cube" : "vector", index,
                        mm_prof_workers(s, role));
    mm_prof_summary_t sum;
    memset(&sum, 0, sizeof sum);
    uint64_t first = UINT64_MAX, last = 0;
    mm_prof_add_ring(r, &sum, &first, &last);
    sum.wall_ns = last > first ? last - first : 0;
    sum.workers = 1;
    sum.launch_ns = mm_prof_launch_ns(s);
    sum.invocations = s->n_inv;
    *summary_p = sum;
    return MEGAMOE_OK;
}
