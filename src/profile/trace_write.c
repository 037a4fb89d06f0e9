/* The trace model -> Chrome Trace JSON; session exports; directory creation.
 *
 * Output is valid JSON whatever the names hold (escaped; invalid UTF-8 -> U+FFFD) and
 * independent of the C locale: every number is printed with integer arithmetic. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"

#include "prof_impl.h"
#include "trace.h"

void mm_trace_fmt_us(char *buf, size_t size, int64_t ns)
{
    uint64_t a = ns < 0 ? (uint64_t)0 - (uint64_t)ns : (uint64_t)ns;
    snprintf(buf, size, "%s%" PRIu64 ".%03u", ns < 0 ? "-" : "", a / 1000, (unsigned)(a % 1000));
}

/* The characters of a JSON string literal (without the quotes). */
static void mm_trace_put_json_chars(FILE *out, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned char c = *p;
        if (c == '"' || c == '\\') {
            fputc('\\', out);
            fputc(c, out);
            p++;
        } else if (c < 0x20 || c == 0x7f) {
            switch (c) {
            case '\n': fputs("\\n", out); break;
            case '\t': fputs("\\t", out); break;
            case '\r': fputs("\\r", out); break;
            default: fprintf(out, "\\u%04x", c);
            }
            p++;
        } else if (c < 0x80) {
            fputc(c, out);
            p++;
        } else {
            int n = mm_trace_utf8_len(p, SIZE_MAX); /* the NUL ends an invalid sequence */
            if (n == 0) {
                fputs("\\ufffd", out);
                p++;
            } else {
                fwrite(p, 1, (size_t)n, out);
                p += n;
            }
        }
    }
}

void mm_trace_put_json_string(FILE *out, const char *s)
{
    fputc('"', out);
    mm_trace_put_json_chars(out, s);
    fputc('"', out);
}

/* End of the last event of an invocation that was never ended (its launch span). */
static int64_t mm_trace_open_end(const mm_trace_t *t, const mm_trace_invocation_t *inv)
{
    int64_t end = inv->begin_ns;
    for (size_t i = 0; i < t->n_events; i++) {
        const mm_trace_event_t *e = &t->events[i];
        const mm_trace_track_t *tr = &t->tracks[e->track];
        if (tr->pid == inv->pid && tr->group == inv->group && e->invocation == inv->index &&
            e->ts_ns + e->dur_ns > end)
            end = e->ts_ns + e->dur_ns;
    }
    return end;
}

/* Separator before every event but the first. */
static void mm_trace_sep(FILE *out, int *first)
{
    if (!*first) fputs(",\n", out);
    *first = 0;
}

static void mm_trace_put_meta(FILE *out, int *first, const char *name, int pid, int tid,
                              const char *key, const char *str_value, long long int_value)
{
    mm_trace_sep(out, first);
    fprintf(out, "{\"name\":\"%s\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"%s\":", name,
            pid, tid, key);
    if (str_value != NULL) mm_trace_put_json_string(out, str_value);
    else fprintf(out, "%lld", int_value);
    fputs("}}", out);
}

static void mm_trace_put_invocation_fields(FILE *out, const mm_trace_t *t,
                                           const mm_trace_invocation_t *inv)
{
    char ts[40], dur[40];
    int ended = inv->end_ns >= inv->begin_ns;
    int64_t end = ended ? inv->end_ns : mm_trace_open_end(t, inv);
    mm_trace_fmt_us(ts, sizeof ts, inv->begin_ns);
    mm_trace_fmt_us(dur, sizeof dur, end - inv->begin_ns);
    fprintf(out, "\"rank\":%d,\"group\":%d,\"invocation\":%" PRIu32 ",\"direction\":", inv->pid,
            inv->group, inv->index);
    mm_trace_put_json_string(out, mm_trace_str(t, inv->direction));
    fprintf(out, ",\"ts\":%s,\"dur\":%s,\"ended\":%s", ts, dur, ended ? "true" : "false");
    if (inv->note != MM_TRACE_NO_NOTE) {
        fputs(",\"note\":", out);
        mm_trace_put_json_string(out, mm_trace_str(t, inv->note));
    }
}

megamoe_status_t mm_trace_write(const mm_trace_t *t, FILE *out)
{
    char ts[40], dur[40];
    int first = 1;
    /* Labels hold one interned string plus a short prefix or suffix: sized to the longest
     * string, so no name is cut (a cut name would read back as another name). */
    size_t label_size = 64;
    for (size_t i = 0; i < t->n_strings; i++) {
        size_t n = strlen(t->strings[i]) + 64;
        if (n > label_size) label_size = n;
    }
    char *label = malloc(label_size);
    if (label == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "trace: out of memory for a label");
    fputs("{\"traceEvents\":[\n", out);
    /* Metadata: process and track names, in rank then tid order. */
    for (size_t r = 0; r < t->n_ranks; r++) {
        int pid = t->ranks[r].rank;
        snprintf(label, label_size, "rank %d", pid);
        mm_trace_put_meta(out, &first, "process_name", pid, 0, "name", label, 0);
        mm_trace_put_meta(out, &first, "process_sort_index", pid, 0, "sort_index", NULL, pid);
    }
    for (size_t i = 0; i < t->n_tracks; i++) {
        const mm_trace_track_t *tr = &t->tracks[i];
        mm_trace_track_label(t, tr, label, label_size);
        mm_trace_sep(out, &first);
        fprintf(out, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":",
                tr->pid, tr->tid);
        mm_trace_put_json_string(out, label);
        fprintf(out, ",\"role\":\"%s\",\"worker\":%d,\"group\":%d}}",
                mm_trace_role_name(tr->role), tr->worker, tr->group);
        mm_trace_put_meta(out, &first, "thread_sort_index", tr->pid, tr->tid, "sort_index", NULL,
                          (long long)tr->group * 100000 + tr->tid);
    }
    /* One span per invocation on its group's launch track. */
    for (size_t i = 0; i < t->n_invs; i++) {
        const mm_trace_invocation_t *inv = &t->invs[i];
        int tid = -1;
        for (size_t k = 0; k < t->n_tracks && tid < 0; k++)
            if (t->tracks[k].pid == inv->pid && t->tracks[k].group == inv->group &&
                t->tracks[k].role == MM_TRACK_LAUNCH)
                tid = t->tracks[k].tid;
        if (tid < 0) continue;
        int ended = inv->end_ns >= inv->begin_ns;
        int64_t end = ended ? inv->end_ns : mm_trace_open_end(t, inv);
        mm_trace_fmt_us(ts, sizeof ts, inv->begin_ns);
        mm_trace_fmt_us(dur, sizeof dur, end - inv->begin_ns);
        snprintf(label, label_size, "%s #%" PRIu32, mm_trace_str(t, inv->direction), inv->index);
        mm_trace_sep(out, &first);
        fputs("{\"name\":", out);
        mm_trace_put_json_string(out, label);
        fprintf(out,
                ",\"cat\":\"MegaKernelLaunch\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%s,"
                "\"dur\":%s,\"args\":{\"invocation\":%" PRIu32 ",\"direction\":",
                inv->pid, tid, ts, dur, inv->index);
        mm_trace_put_json_string(out, mm_trace_str(t, inv->direction));
        if (inv->note != MM_TRACE_NO_NOTE) {
            fputs(",\"note\":", out);
            mm_trace_put_json_string(out, mm_trace_str(t, inv->note));
        }
        fputs("}}", out);
    }
    /* The records. */
    for (size_t i = 0; i < t->n_events; i++) {
        const mm_trace_event_t *e = &t->events[i];
        const mm_trace_track_t *tr = &t->tracks[e->track];
        const char *stage = mm_trace_str(t, e->stage), *kind = mm_trace_kind_name(e->kind);
        mm_trace_fmt_us(ts, sizeof ts, e->ts_ns);
        mm_trace_fmt_us(dur, sizeof dur, e->dur_ns);
        mm_trace_sep(out, &first);
        fputs("{\"name\":\"", out); /* "<stage>:<kind>", whole however long the stage */
        mm_trace_put_json_chars(out, stage);
        fprintf(out, ":%s\"", kind);
        fprintf(out,
                ",\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%s,\"dur\":%s,"
                "\"args\":{\"stage\":",
                tr->pid, tr->tid, ts, dur);
        mm_trace_put_json_string(out, stage);
        fprintf(out,
                ",\"kind\":\"%s\",\"task\":%" PRId32 ",\"owner\":%" PRId32 ",\"peer\":%" PRId32
                ",\"invocation\":%" PRIu32 ",\"direction\":",
                kind, e->task, e->owner, e->peer, e->invocation);
        mm_trace_put_json_string(out, mm_trace_str(t, e->direction));
        fputs("}}", out);
    }
    fputs("\n],\n", out);
    fputs("\"displayTimeUnit\":\"ns\",\n\"megaKernelTrace\":{\"schemaVersion\":1,", out);
    uint64_t invs = 0, recs = 0, dropped = 0;
    for (size_t r = 0; r < t->n_ranks; r++) {
        invs += t->ranks[r].invocations;
        recs += t->ranks[r].records;
        dropped += t->ranks[r].dropped;
    }
    if (t->n_ranks == 1) {
        fprintf(out, "\"rank\":%d,\"host\":", t->ranks[0].rank);
        mm_trace_put_json_string(out, mm_trace_str(t, t->ranks[0].host));
    } else {
        fputs("\"rank\":null,\"merged\":true", out);
    }
    fprintf(out,
            ",\"invocationCount\":%" PRIu64 ",\"recordCount\":%" PRIu64
            ",\"droppedRecordCount\":%" PRIu64 ",\n\"warnings\":[",
            invs, recs, dropped);
    for (size_t i = 0; i < t->n_warnings; i++) {
        if (i) fputc(',', out);
        mm_trace_put_json_string(out, mm_trace_str(t, t->warnings[i]));
    }
    fputs("],\n\"ranks\":[", out);
    for (size_t r = 0; r < t->n_ranks; r++) {
        const mm_trace_rank_t *rk = &t->ranks[r];
        fprintf(out, "%s{\"rank\":%d,\"host\":", r ? "," : "", rk->rank);
        mm_trace_put_json_string(out, mm_trace_str(t, rk->host));
        fprintf(out,
                ",\"invocationCount\":%" PRIu64 ",\"recordCount\":%" PRIu64
                ",\"droppedRecordCount\":%" PRIu64 "}",
                rk->invocations, rk->records, rk->dropped);
    }
    fputs("],\n\"invocations\":[", out);
    for (size_t i = 0; i < t->n_invs; i++) {
        fputs(i ? ",\n{" : "\n{", out);
        mm_trace_put_invocation_fields(out, t, &t->invs[i]);
        fputc('}', out);
    }
    fputs("]}}\n", out);
    free(label);
    return MEGAMOE_OK;
}

megamoe_status_t mm_prof_mkdirs(const char *dir)
{
    if (dir == NULL || dir[0] == '\0')
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "trace directory is empty; pass a path");
    size_t len = strlen(dir);
    char *path = malloc(len + 1);
    if (path == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "out of memory");
    memcpy(path, dir, len + 1);
    megamoe_status_t st = MEGAMOE_OK;
    for (size_t i = 1; i <= len && st == MEGAMOE_OK; i++) {
        if (path[i] != '/' && path[i] != '\0') continue;
        char keep = path[i];
        path[i] = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) {
            st = mm_error(MEGAMOE_IO, "cannot create trace directory %s: %s", path,
                          strerror(errno));
        } else {
            struct stat sb;
            if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
                st = mm_error(MEGAMOE_IO, "cannot create trace directory %s: a file of that "
                                          "name exists",
                              path);
        }
        path[i] = keep;
    }
    free(path);
    return st;
}

megamoe_status_t mm_trace_write_file(const mm_trace_t *t, const char *path)
{
    if (path == NULL || path[0] == '\0')
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "trace output path is empty; pass a file name");
    const char *slash = strrchr(path, '/');
    if (slash != NULL && slash != path) {
        size_t n = (size_t)(slash - path);
        char *dir = malloc(n + 1);
        if (dir == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "out of memory");
        memcpy(dir, path, n);
        dir[n] = '\0';
        megamoe_status_t st = mm_prof_mkdirs(dir);
        free(dir);
        MM_CHECK(st);
    }
    size_t n = strlen(path) + 16;
    char *tmp = malloc(n);
    if (tmp == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "out of memory");
    snprintf(tmp, n, "%s.tmp%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        megamoe_status_t st = mm_error(MEGAMOE_IO, "cannot write trace %s: %s", tmp,
                                       strerror(errno));
        free(tmp);
        return st;
    }
    megamoe_status_t st = mm_trace_write(t, f);
    int werr = ferror(f);
    if (fclose(f) != 0 || werr) {
        if (st == MEGAMOE_OK)
            st = mm_error(MEGAMOE_IO, "cannot write trace %s: %s (disk full?)", tmp,
                          strerror(errno ? errno : EIO));
    }
    if (st == MEGAMOE_OK && rename(tmp, path) != 0)
        st = mm_error(MEGAMOE_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (st != MEGAMOE_OK) unlink(tmp);
    free(tmp);
    return st;
}

/* ---- session exports (prof.h) --------------------------------------------------------------- */

/* Model of the sessions; with none, an empty trace that still names its rank. */
static megamoe_status_t mm_prof_build(mm_trace_t *t, const mm_prof_session_t *const *sessions,
                                      int count)
{
    MM_CHECK(mm_trace_from_sessions(t, sessions, count));
    if (count > 0) return MEGAMOE_OK;
    int64_t rank = 0;
    if (mm_env_is_set(MM_ENV_RANK) && mm_env_int(MM_ENV_RANK, &rank) != MEGAMOE_OK) rank = 0;
    mm_trace_rank_t *rk;
    MM_CHECK(mm_trace_rank(t, (int)rank, &rk));
    return mm_trace_warn(t, "no MegaKernel launch was recorded (no profiling session in this "
                            "process)");
}

megamoe_status_t mm_prof_export_chrome_many(const mm_prof_session_t *const *sessions, int count,
                                            FILE *out)
{
    if (out == NULL || (count > 0 && sessions == NULL) || count < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "trace export: no output or no sessions");
    mm_trace_t t;
    mm_trace_init(&t);
    megamoe_status_t st = mm_prof_build(&t, sessions, count);
    if (st == MEGAMOE_OK) st = mm_trace_write(&t, out);
    mm_trace_free(&t);
    return st;
}

megamoe_status_t mm_prof_export_chrome(const mm_prof_session_t *session, FILE *out)
{
    if (session == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "trace export: session is NULL");
    return mm_prof_export_chrome_many(&session, 1, out);
}

megamoe_status_t mm_prof_export_file(const mm_prof_session_t *const *sessions, int count,
                                     const char *path)
{
    if (count < 0 || (count > 0 && sessions == NULL))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "trace export: no sessions");
    mm_trace_t t;
    mm_trace_init(&t);
    megamoe_status_t st = mm_prof_build(&t, sessions, count);
    if (st == MEGAMOE_OK) st = mm_trace_write_file(&t, path);
    mm_trace_free(&t);
    return st;
}

megamoe_status_t mm_prof_export_dir(const mm_prof_session_t *session, const char *dir)
{
    if (session == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "trace export: session is NULL");
    if (dir == NULL || dir[0] == '\0')
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "trace export: directory is empty; pass a path");
    size_t n = strlen(dir) + 32;
    char *path = malloc(n);
    if (path == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "out of memory");
    snprintf(path, n, "%s/trace_%d.json", dir, session->head.rank);
    megamoe_status_t st = mm_prof_mkdirs(dir);
    if (st == MEGAMOE_OK) st = mm_prof_export_file(&session, 1, path);
    free(path);
    return st;
}
