/* Sessions -> trace model (what an export writes), with the consistency warnings. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#include "prof_impl.h"
#include "trace.h"

static megamoe_status_t mm_trace_add_session(mm_trace_t *t, const mm_prof_session_t *s, int group)
{
    int pid = s->head.rank;
    mm_trace_rank_t *rank;
    MM_CHECK(mm_trace_rank(t, pid, &rank));
    MM_CHECK(mm_trace_intern(t, s->host, strlen(s->host), &rank->host));
    rank->invocations += s->n_inv;

    /* The launch track first, then the workers: cube 0.., vector 0.. */
    uint32_t launch;
    MM_CHECK(mm_trace_track(t, pid, group, MM_TRACK_LAUNCH, -1, 0, -1, &launch));
    (void)launch;

    uint32_t stored = s->n_inv < s->inv_cap ? s->n_inv : s->inv_cap;
    uint32_t *dir_ids = calloc(stored ? stored : 1, sizeof *dir_ids);
    if (dir_ids == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "trace: out of memory");
    megamoe_status_t st = MEGAMOE_OK;
    uint32_t unknown = 0, stage_ids[MM_PROF_MAX_STAGES];
    st = mm_trace_intern(t, "unknown", 7, &unknown);
    for (int i = 0; st == MEGAMOE_OK && i < s->n_stages; i++)
        st = mm_trace_intern(t, s->stage_names[i], strlen(s->stage_names[i]), &stage_ids[i]);
    for (uint32_t i = 0; st == MEGAMOE_OK && i < stored; i++) {
        const mm_prof_invocation_t *inv = &s->inv[i];
        st = mm_trace_intern(t, inv->direction, strlen(inv->direction), &dir_ids[i]);
        if (st != MEGAMOE_OK) break;
        mm_trace_invocation_t ti = {pid, group, i, dir_ids[i], (int64_t)inv->begin_ns,
                                    inv->end_ns ? (int64_t)inv->end_ns : -1, MM_TRACE_NO_NOTE};
        if (inv->note[0] != '\0')
            st = mm_trace_intern(t, inv->note, strlen(inv->note), &ti.note);
        if (st != MEGAMOE_OK) break;
        st = mm_trace_add_invocation(t, &ti);
        if (st == MEGAMOE_OK && inv->end_ns == 0)
            st = mm_trace_warn(t, "rank %d: invocation %u (%s) was begun but never ended", pid,
                               i, inv->direction);
    }
    if (st == MEGAMOE_OK && s->inv_lost)
        st = mm_trace_warn(t, "rank %d: %llu invocations have no begin/end times (out of memory "
                              "growing the invocation table)",
                           pid, (unsigned long long)s->inv_lost);
    if (st == MEGAMOE_OK && s->inv_unclosed)
        st = mm_trace_warn(t, "rank %d: %llu invocations were not ended before the next began",
                           pid, (unsigned long long)s->inv_unclosed);

    for (int w = 0; st == MEGAMOE_OK && w < mm_prof_ring_count(s); w++) {
        const mm_prof_ring_t *r = mm_prof_ring_at(s, w);
        int role = r->role == MM_PROF_CUBE ? MM_TRACK_CUBE : MM_TRACK_VECTOR;
        uint32_t track;
        st = mm_trace_track(t, pid, group, role, r->index, 0, -1, &track);
        if (st != MEGAMOE_OK) break;
        uint64_t prev_end = 0, overlaps = 0, backwards = 0, bad_stage = 0, bad_kind = 0;
        uint32_t count = mm_prof_ring_records(r);
        count = count < r->capacity ? count : r->capacity;
        const uint64_t dropped = mm_prof_ring_dropped(r);
        for (uint32_t i = 0; st == MEGAMOE_OK && i < count; i++) {
            const mm_prof_record_t *rec = &r->records[i];
            if (rec->kind >= MM_KIND_COUNT) {
                bad_kind++;
                continue;
            }
            mm_trace_event_t e;
            memset(&e, 0, sizeof e);
            e.ts_ns = (int64_t)rec->start_ns;
            if (rec->end_ns >= rec->start_ns) {
                e.dur_ns = (int64_t)(rec->end_ns - rec->start_ns);
            } else {
                e.dur_ns = 0;
                backwards++;
            }
            if (i > 0 && rec->start_ns < prev_end) overlaps++;
            if (rec->start_ns + (uint64_t)e.dur_ns > prev_end) prev_end = rec->start_ns + (uint64_t)e.dur_ns;
            e.track = track;
            if (rec->stage < s->n_stages) {
                e.stage = stage_ids[rec->stage];
            } else {
                char name[32];
                snprintf(name, sizeof name, "stage%u", (unsigned)rec->stage);
                st = mm_trace_intern(t, name, strlen(name), &e.stage);
                bad_stage++;
            }
            e.invocation = rec->invocation;
            e.direction = rec->invocation < stored ? dir_ids[rec->invocation] : unknown;
            e.task = rec->task;
            e.owner = rec->owner;
            e.peer = rec->peer == 0xffff ? -1 : rec->peer;
            e.kind = rec->kind;
            if (st == MEGAMOE_OK) st = mm_trace_add_event(t, &e);
        }
        rank->records += count;
        rank->dropped += dropped;
        const char *rn = mm_trace_role_name(role);
        if (st == MEGAMOE_OK && dropped)
            st = mm_trace_warn(t, "rank %d %s %d: %llu records dropped (ring of %u records full); "
                                  "raise records_per_worker",
                               pid, rn, r->index, (unsigned long long)dropped, r->capacity);
        if (st == MEGAMOE_OK && overlaps)
            st = mm_trace_warn(t, "rank %d %s %d: %llu spans overlap the previous span of the "
                                  "same worker (producer bug)",
                               pid, rn, r->index, (unsigned long long)overlaps);
        if (st == MEGAMOE_OK && backwards)
            st = mm_trace_warn(t, "rank %d %s %d: %llu spans end before they start (shown with "
                                  "duration 0)",
                               pid, rn, r->index, (unsigned long long)backwards);
        if (st == MEGAMOE_OK && bad_stage)
            st = mm_trace_warn(t, "rank %d %s %d: %llu records name a stage outside the table of "
                                  "%d names",
                               pid, rn, r->index, (unsigned long long)bad_stage, s->n_stages);
        if (st == MEGAMOE_OK && bad_kind)
            st = mm_trace_warn(t, "rank %d %s %d: %llu records of an unknown kind were left out",
                               pid, rn, r->index, (unsigned long long)bad_kind);
    }
    free(dir_ids);
    return st;
}

megamoe_status_t mm_trace_from_sessions(mm_trace_t *t, const mm_prof_session_t *const *sessions,
                                        int count)
{
    for (int i = 0; i < count; i++) {
        if (sessions[i] == NULL)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "trace export: session %d is NULL", i);
        int group = sessions[i]->serial >= 0 ? sessions[i]->serial : i;
        MM_CHECK(mm_trace_add_session(t, sessions[i], group));
    }
    return MEGAMOE_OK;
}
