/* Public profile sessions (megamoe_profile_*) and trace-file tools (megamoe_trace_*) of
 * include/megamoe/prof.h. A megamoe_profile_t is an mm_prof_session_t. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "megamoe/prof.h"

#include "base/clock.h"
#include "base/abi.h"
#include "base/env.h"
#include "base/error.h"

#include "prof_impl.h"
#include "trace.h"

static mm_prof_session_t *mm_prof_of(megamoe_profile_t *p) { return (mm_prof_session_t *)p; }
static const mm_prof_session_t *mm_prof_of_c(const megamoe_profile_t *p)
{
    return (const mm_prof_session_t *)p;
}

#define MM_PROF_NEED(p, fn)                                                                \
    do {                                                                                   \
        if ((p) == NULL)                                                                   \
            return mm_error(MEGAMOE_INVALID_ARGUMENT, fn ": profile is NULL");             \
    } while (0)

megamoe_status_t megamoe_profile_params_init(megamoe_profile_params_t *params,
                                             size_t struct_size)
{
    megamoe_profile_params_t p;
    memset(&p, 0, sizeof p);
    p.rank = -1;
    p.cube_workers = 1;
    p.vector_workers = 1;
    p.records_per_worker = 65536;
    return mm_abi_init(params, struct_size, &p, sizeof p, "megamoe_profile_params_t");
}

megamoe_status_t megamoe_profile_create(const megamoe_profile_params_t *caller_params,
                                        megamoe_profile_t **profile_p)
{
    if (caller_params == NULL || profile_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "megamoe_profile_create: params and profile_p are required (start from "
                        "megamoe_profile_params_default())");
    megamoe_profile_params_t copy = megamoe_profile_params_default(); /* version.h: extensible */
    const megamoe_profile_params_t *params = &copy;
    MM_CHECK(mm_abi_copy_in(&copy, sizeof copy, caller_params, "megamoe_profile_params_t"));
    int rank = params->rank;
    if (rank < 0) {
        int64_t r = 0;
        if (mm_env_is_set(MM_ENV_RANK)) MM_CHECK(mm_env_int(MM_ENV_RANK, &r));
        rank = (int)r;
    }
    mm_prof_session_t *s;
    MM_CHECK(mm_prof_session_create(rank, params->cube_workers, params->vector_workers,
                                    params->records_per_worker, params->stage_names,
                                    params->stage_count, &s));
    megamoe_status_t st = mm_prof_register(s);
    if (st != MEGAMOE_OK) {
        mm_prof_session_destroy(s);
        return st;
    }
    *profile_p = (megamoe_profile_t *)s;
    return MEGAMOE_OK;
}

void megamoe_profile_destroy(megamoe_profile_t *profile)
{
    mm_prof_session_destroy(mm_prof_of(profile));
}

int megamoe_profile_is_active(const megamoe_profile_t *profile)
{
    return mm_prof_on(mm_prof_of_c(profile));
}

void megamoe_profile_set_active(megamoe_profile_t *profile, int active)
{
    mm_prof_set_active(mm_prof_of(profile), active);
}

megamoe_status_t megamoe_profile_begin(megamoe_profile_t *profile, const char *direction,
                                       uint32_t *invocation_p)
{
    MM_PROF_NEED(profile, "megamoe_profile_begin");
    uint32_t inv = mm_prof_begin(mm_prof_of(profile), direction);
    if (invocation_p != NULL) *invocation_p = inv;
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_profile_end(megamoe_profile_t *profile)
{
    MM_PROF_NEED(profile, "megamoe_profile_end");
    mm_prof_end(mm_prof_of(profile));
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_profile_record(megamoe_profile_t *profile, megamoe_profile_role_t role,
                                        int worker, const megamoe_profile_record_t *record)
{
    MM_PROF_NEED(profile, "megamoe_profile_record");
    mm_prof_session_t *s = mm_prof_of(profile);
    if (record == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_profile_record: record is NULL");
    mm_prof_ring_t *ring = mm_prof_ring(s, (mm_prof_role_t)role, worker);
    if (ring == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "megamoe_profile_record: no %s worker %d (the session has %d cube and %d "
                        "vector workers)",
                        role == MEGAMOE_PROFILE_CUBE     ? "cube"
                        : role == MEGAMOE_PROFILE_VECTOR ? "vector"
                                                         : "unknown-role",
                        worker, s->n_cube, s->n_vector);
    if ((int)record->kind < 0 || (int)record->kind > MEGAMOE_PROFILE_SIGNAL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "megamoe_profile_record: kind %d is not WAIT, COMPUTE or SIGNAL",
                        (int)record->kind);
    if (record->stage < 0 || record->stage >= s->n_stages)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "megamoe_profile_record: stage %d is outside the session's %d stage names",
                        record->stage, s->n_stages);
    if (record->peer < -1 || record->peer >= 0xffff)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "megamoe_profile_record: peer %d must be -1 (none) or a rank below 65535",
                        record->peer);
    if (record->end_ns < record->start_ns)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "megamoe_profile_record: end_ns is before start_ns");
    mm_prof_push(ring, (uint8_t)record->kind, (uint8_t)record->stage, record->task, record->owner,
                 record->peer, record->invocation, record->start_ns, record->end_ns);
    return MEGAMOE_OK;
}

uint64_t megamoe_profile_clock_ns(void) { return mm_now_ns(); }

static void mm_prof_public_summary(const mm_prof_summary_t *one, megamoe_profile_summary_t *out)
{
    memset(out, 0, sizeof *out);
    mm_prof_summary_to_public(one, out);
    out->wall_ns = one->wall_ns;
}

megamoe_status_t megamoe_profile_get_summary(const megamoe_profile_t *profile,
                                             megamoe_profile_summary_t *summary_p)
{
    MM_PROF_NEED(profile, "megamoe_profile_get_summary");
    if (summary_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "megamoe_profile_get_summary: summary_p is NULL");
    mm_prof_summary_t one;
    mm_prof_summarize(mm_prof_of_c(profile), &one);
    mm_prof_public_summary(&one, summary_p);
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_profile_get_worker_summary(const megamoe_profile_t *profile,
                                                    megamoe_profile_role_t role, int worker,
                                                    megamoe_profile_summary_t *summary_p)
{
    MM_PROF_NEED(profile, "megamoe_profile_get_worker_summary");
    if (summary_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "megamoe_profile_get_worker_summary: summary_p is NULL");
    mm_prof_summary_t one;
    MM_CHECK(mm_prof_summarize_worker(mm_prof_of_c(profile), (mm_prof_role_t)role, worker, &one));
    mm_prof_public_summary(&one, summary_p);
    return MEGAMOE_OK;
}

void megamoe_profile_reset(megamoe_profile_t *profile) { mm_prof_reset(mm_prof_of(profile)); }

megamoe_status_t megamoe_profile_export(const megamoe_profile_t *profile, const char *path)
{
    MM_PROF_NEED(profile, "megamoe_profile_export");
    const mm_prof_session_t *s = mm_prof_of_c(profile);
    return mm_prof_export_file(&s, 1, path);
}

megamoe_status_t megamoe_profile_export_dir(const megamoe_profile_t *profile, const char *dir)
{
    MM_PROF_NEED(profile, "megamoe_profile_export_dir");
    return mm_prof_export_dir(mm_prof_of_c(profile), dir);
}

/* ---- trace files -------------------------------------------------------------------------- */

megamoe_status_t megamoe_trace_merge(const char *const *inputs, size_t count, const char *output)
{
    if (output == NULL || output[0] == '\0')
        return mm_error_quiet(MEGAMOE_INVALID_ARGUMENT,
                              "trace merge: no output file (pass -o merged.json)");
    mm_trace_t t;
    mm_trace_init(&t);
    megamoe_status_t st = mm_trace_read_inputs(&t, inputs, count);
    if (st == MEGAMOE_OK) st = mm_trace_write_file(&t, output);
    mm_trace_free(&t);
    return st;
}

megamoe_status_t megamoe_trace_summary(const char *const *inputs, size_t count,
                                       const megamoe_trace_summary_options_t *options, FILE *out)
{
    if (out == NULL) return mm_error_quiet(MEGAMOE_INVALID_ARGUMENT, "trace summary: out is NULL");
    megamoe_trace_summary_options_t o = {0, -1};
    if (options != NULL) o = *options;
    mm_trace_t t;
    mm_trace_init(&t);
    megamoe_status_t st = mm_trace_read_inputs(&t, inputs, count);
    if (st == MEGAMOE_OK) st = mm_trace_print_summary(&t, o.json, o.invocation < 0 ? -1 : o.invocation, out);
    if (st == MEGAMOE_OK && ferror(out))
        st = mm_error_quiet(MEGAMOE_IO, "trace summary: cannot write the output: %s",
                            strerror(errno ? errno : EIO));
    mm_trace_free(&t);
    return st;
}

megamoe_status_t megamoe_trace_svg(const char *const *inputs, size_t count,
                                   const megamoe_trace_svg_options_t *options, const char *output)
{
    if (output == NULL || output[0] == '\0')
        return mm_error_quiet(MEGAMOE_INVALID_ARGUMENT,
                              "trace svg: no output file (pass -o timeline.svg)");
    megamoe_trace_svg_options_t o = {0, -1};
    if (options != NULL) o = *options;
    if (o.width != 0 && (o.width < 400 || o.width > 20000))
        return mm_error_quiet(MEGAMOE_INVALID_ARGUMENT,
                              "trace svg: width %d must be in [400, 20000] pixels", o.width);
    mm_trace_t t;
    mm_trace_init(&t);
    megamoe_status_t st = mm_trace_read_inputs(&t, inputs, count);
    if (st == MEGAMOE_OK && o.invocation >= 0) {
        int found = 0;
        for (size_t i = 0; i < t.n_invs && !found; i++) found = t.invs[i].index == o.invocation;
        for (size_t i = 0; i < t.n_events && !found; i++)
            found = t.events[i].invocation == o.invocation;
        if (!found)
            st = mm_error_quiet(MEGAMOE_NOT_FOUND,
                                "trace svg: invocation %lld is not in the trace (see `megamoe "
                                "trace summary` for the invocations it holds)",
                                (long long)o.invocation);
    }
    if (st == MEGAMOE_OK) {
        size_t n = strlen(output) + 16;
        char *tmp = malloc(n);
        FILE *f = NULL;
        if (tmp == NULL) {
            st = mm_error_quiet(MEGAMOE_OUT_OF_MEMORY, "out of memory");
        } else {
            snprintf(tmp, n, "%s.tmp", output);
            f = fopen(tmp, "w");
            if (f == NULL)
                st = mm_error_quiet(MEGAMOE_IO, "cannot write %s: %s", tmp, strerror(errno));
        }
        if (f != NULL) {
            st = mm_trace_render_svg(&t, o.width, o.invocation < 0 ? -1 : o.invocation, f);
            int werr = ferror(f);
            if (fclose(f) != 0 || werr) {
                if (st == MEGAMOE_OK)
                    st = mm_error_quiet(MEGAMOE_IO, "cannot write %s (disk full?)", tmp);
            }
            if (st == MEGAMOE_OK && rename(tmp, output) != 0)
                st = mm_error_quiet(MEGAMOE_IO, "cannot rename %s to %s: %s", tmp, output,
                                    strerror(errno));
            if (st != MEGAMOE_OK) remove(tmp);
        }
        free(tmp);
    }
    mm_trace_free(&t);
    return st;
}
