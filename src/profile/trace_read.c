/* Trace files -> trace model (merge, summary and svg read what trace_write.c wrote).
 *
 * Strict on our own events (a MegaKernel event without its fields is an error naming the
 * file, line and column), tolerant of others (foreign events are counted and left out). */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"

#include "json.h"
#include "trace.h"

typedef struct mm_group_map {
    int pid, file_group, group;
} mm_group_map_t;

typedef struct mm_tid_map {
    int pid, tid;
    uint32_t track;
} mm_tid_map_t;

typedef struct mm_reader {
    mm_trace_t *t;
    const char *path;
    size_t tracks_before; /* tracks of earlier files */
    size_t invs_before;
    mm_group_map_t *groups;
    size_t n_groups, cap_groups;
    mm_tid_map_t *tids;
    size_t n_tids, cap_tids;
    uint64_t foreign;
} mm_reader_t;

static megamoe_status_t mm_read_fail(const mm_reader_t *rd, const mm_json_value_t *at,
                                     const char *what)
{
    if (at != NULL)
        return mm_error_quiet(MEGAMOE_INVALID_ARGUMENT, "%s:%u:%u: %s", rd->path, at->line,
                              at->col, what);
    return mm_error_quiet(MEGAMOE_INVALID_ARGUMENT, "%s: %s", rd->path, what);
}

static megamoe_status_t mm_read_file_text(const char *path, char **text_p, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return mm_error_quiet(errno == ENOENT ? MEGAMOE_NOT_FOUND : MEGAMOE_IO,
                              "cannot open trace %s: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    megamoe_status_t st = MEGAMOE_OK;
    while (buf != NULL) {
        if (len == cap) {
            if (cap >= ((size_t)1 << 31)) {
                st = mm_error_quiet(MEGAMOE_INVALID_ARGUMENT,
                                    "trace %s is larger than 2 GiB; split it per rank", path);
                break;
            }
            char *g = realloc(buf, cap * 2);
            if (g == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = g;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f))
                st = mm_error_quiet(MEGAMOE_IO, "cannot read trace %s: %s", path, strerror(errno));
            break;
        }
    }
    fclose(f);
    if (buf == NULL && st == MEGAMOE_OK)
        st = mm_error_quiet(MEGAMOE_OUT_OF_MEMORY, "out of memory reading trace %s", path);
    if (st != MEGAMOE_OK) {
        free(buf);
        return st;
    }
    *text_p = buf;
    *len_p = len;
    return MEGAMOE_OK;
}

/* Model group of (pid, file_group): the same number unless an earlier file used it. */
static megamoe_status_t mm_read_group(mm_reader_t *rd, int pid, int file_group, int *group_p)
{
    for (size_t i = 0; i < rd->n_groups; i++)
        if (rd->groups[i].pid == pid && rd->groups[i].file_group == file_group) {
            *group_p = rd->groups[i].group;
            return MEGAMOE_OK;
        }
    int taken = 0, max_group = -1;
    for (size_t i = 0; i < rd->tracks_before; i++)
        if (rd->t->tracks[i].pid == pid) {
            if (rd->t->tracks[i].group == file_group) taken = 1;
            if (rd->t->tracks[i].group > max_group) max_group = rd->t->tracks[i].group;
        }
    for (size_t i = 0; i < rd->invs_before; i++)
        if (rd->t->invs[i].pid == pid) {
            if (rd->t->invs[i].group == file_group) taken = 1;
            if (rd->t->invs[i].group > max_group) max_group = rd->t->invs[i].group;
        }
    for (size_t i = 0; i < rd->n_groups; i++)
        if (rd->groups[i].pid == pid && rd->groups[i].group > max_group)
            max_group = rd->groups[i].group;
    int group = taken ? max_group + 1 : file_group;
    if (taken)
        MM_CHECK(mm_trace_warn(rd->t, "rank %d group %d of %s also appears in an earlier file; "
                                      "shown as group %d",
                               pid, file_group, rd->path, group));
    if (rd->n_groups == rd->cap_groups) {
        size_t cap = rd->cap_groups ? rd->cap_groups * 2 : 16;
        mm_group_map_t *g = realloc(rd->groups, cap * sizeof *g);
        if (g == NULL) return mm_error_quiet(MEGAMOE_OUT_OF_MEMORY, "out of memory");
        rd->groups = g;
        rd->cap_groups = cap;
    }
    rd->groups[rd->n_groups++] = (mm_group_map_t){pid, file_group, group};
    *group_p = group;
    return MEGAMOE_OK;
}

static megamoe_status_t mm_read_map_tid(mm_reader_t *rd, int pid, int tid, uint32_t track)
{
    for (size_t i = 0; i < rd->n_tids; i++)
        if (rd->tids[i].pid == pid && rd->tids[i].tid == tid) {
            rd->tids[i].track = track;
            return MEGAMOE_OK;
        }
    if (rd->n_tids == rd->cap_tids) {
        size_t cap = rd->cap_tids ? rd->cap_tids * 2 : 32;
        mm_tid_map_t *g = realloc(rd->tids, cap * sizeof *g);
        if (g == NULL) return mm_error_quiet(MEGAMOE_OUT_OF_MEMORY, "out of memory");
        rd->tids = g;
        rd->cap_tids = cap;
    }
    rd->tids[rd->n_tids++] = (mm_tid_map_t){pid, tid, track};
    return MEGAMOE_OK;
}

static int mm_read_find_tid(const mm_reader_t *rd, int pid, int tid, uint32_t *track_p)
{
    for (size_t i = 0; i < rd->n_tids; i++)
        if (rd->tids[i].pid == pid && rd->tids[i].tid == tid) {
            *track_p = rd->tids[i].track;
            return 1;
        }
    return 0;
}

static int mm_read_int(const mm_json_value_t *obj, const char *key, int64_t lo, int64_t hi,
                       int64_t def, int64_t *out)
{
    const mm_json_value_t *v = mm_json_get(obj, key);
    if (v == NULL || v->type == MM_JSON_NULL) {
        *out = def;
        return 1;
    }
    return mm_json_int(v, lo, hi, out);
}

/* A track declared by a thread_name metadata event. */
static megamoe_status_t mm_read_thread_name(mm_reader_t *rd, const mm_json_value_t *ev)
{
    const mm_json_value_t *args = mm_json_get(ev, "args");
    int64_t pid, tid, worker, file_group;
    if (!mm_read_int(ev, "pid", 0, INT32_MAX, -1, &pid) || pid < 0 ||
        !mm_read_int(ev, "tid", 0, INT32_MAX, -1, &tid) || tid < 0)
        return mm_read_fail(rd, ev, "thread_name event needs integer 'pid' and 'tid' >= 0");
    const mm_json_value_t *name = mm_json_get(args, "name");
    if (name == NULL || name->type != MM_JSON_STRING)
        return mm_read_fail(rd, ev, "thread_name event needs a string args.name");
    if (!mm_read_int(args, "worker", -1, INT32_MAX, -1, &worker) ||
        !mm_read_int(args, "group", 0, INT32_MAX, 0, &file_group))
        return mm_read_fail(rd, ev, "thread_name args 'worker'/'group' must be integers");
    const mm_json_value_t *rv = mm_json_get(args, "role");
    int role = MM_TRACK_OTHER;
    if (rv != NULL && rv->type == MM_JSON_STRING) {
        for (int r = 0; r <= MM_TRACK_OTHER; r++)
            if (strcmp(rv->u.str, mm_trace_role_name(r)) == 0) role = r;
    } else {
        /* A file of another writer: infer the role from the label. */
        int w = -1;
        char word[16];
        if (sscanf(name->u.str, "%15[a-z] %d", word, &w) == 2 && w >= 0) {
            if (strcmp(word, "cube") == 0) role = MM_TRACK_CUBE;
            if (strcmp(word, "vector") == 0) role = MM_TRACK_VECTOR;
            worker = w;
        } else if (strcmp(name->u.str, "launch") == 0) {
            role = MM_TRACK_LAUNCH;
        }
    }
    if ((role == MM_TRACK_CUBE || role == MM_TRACK_VECTOR) && worker < 0)
        return mm_read_fail(rd, ev, "a cube/vector track needs a worker index >= 0");
    int group;
    MM_CHECK(mm_read_group(rd, (int)pid, (int)file_group, &group));
    uint32_t name_id = 0, track;
    if (role == MM_TRACK_OTHER) {
        /* Keep the label without a "group G/" prefix this writer may have added. */
        const char *label = name->u.str, *slash = strchr(label, '/');
        if (strncmp(label, "group ", 6) == 0 && slash != NULL) label = slash + 1;
        MM_CHECK(mm_trace_intern(rd->t, label, strlen(label), &name_id));
    }
    MM_CHECK(mm_trace_track(rd->t, (int)pid, group, role, (int)worker, name_id, (int)tid, &track));
    return mm_read_map_tid(rd, (int)pid, (int)tid, track);
}

static megamoe_status_t mm_read_record(mm_reader_t *rd, const mm_json_value_t *ev)
{
    const mm_json_value_t *args = mm_json_get(ev, "args");
    int64_t pid, tid, task, owner, peer, inv;
    mm_trace_event_t e;
    memset(&e, 0, sizeof e);
    if (!mm_read_int(ev, "pid", 0, INT32_MAX, -1, &pid) || pid < 0 ||
        !mm_read_int(ev, "tid", 0, INT32_MAX, -1, &tid) || tid < 0)
        return mm_read_fail(rd, ev, "MegaKernel event needs integer 'pid' and 'tid' >= 0");
    if (!mm_json_scaled(mm_json_get(ev, "ts"), 3, &e.ts_ns))
        return mm_read_fail(rd, ev, "MegaKernel event needs a numeric 'ts' (microseconds)");
    if (!mm_json_scaled(mm_json_get(ev, "dur"), 3, &e.dur_ns) || e.dur_ns < 0)
        return mm_read_fail(rd, ev, "MegaKernel event needs a numeric 'dur' >= 0");
    if (e.ts_ns < 0 || e.ts_ns > MM_TRACE_MAX_NS || e.dur_ns > MM_TRACE_MAX_NS)
        return mm_read_fail(rd, ev, "MegaKernel event 'ts' and 'dur' must be in [0, 2^61 ns] "
                                    "(CLOCK_MONOTONIC microseconds)");
    if (args == NULL || args->type != MM_JSON_OBJECT)
        return mm_read_fail(rd, ev, "MegaKernel event needs an 'args' object");
    const mm_json_value_t *stage = mm_json_get(args, "stage"), *kind = mm_json_get(args, "kind");
    if (stage == NULL || stage->type != MM_JSON_STRING)
        return mm_read_fail(rd, ev, "MegaKernel event needs a string args.stage");
    int k = -1;
    for (int i = 0; i < MM_KIND_COUNT; i++)
        if (mm_json_str_is(kind, mm_trace_kind_name(i))) k = i;
    if (k < 0)
        return mm_read_fail(rd, ev, "MegaKernel event args.kind must be \"wait\", \"compute\" or "
                                    "\"signal\"");
    if (!mm_read_int(args, "task", INT32_MIN, INT32_MAX, -1, &task) ||
        !mm_read_int(args, "owner", INT32_MIN, INT32_MAX, -1, &owner) ||
        !mm_read_int(args, "peer", -1, INT32_MAX, -1, &peer) ||
        !mm_read_int(args, "invocation", 0, UINT32_MAX, 0, &inv))
        return mm_read_fail(rd, ev, "MegaKernel event args task/owner/peer/invocation must be "
                                    "integers (peer >= -1, invocation >= 0)");
    const mm_json_value_t *dir = mm_json_get(args, "direction");
    const char *d = dir != NULL && dir->type == MM_JSON_STRING ? dir->u.str : "unknown";
    uint32_t track;
    if (!mm_read_find_tid(rd, (int)pid, (int)tid, &track)) {
        /* No thread_name for this tid: a track of its own. */
        char label[32];
        snprintf(label, sizeof label, "tid %d", (int)tid);
        uint32_t name_id;
        int group;
        MM_CHECK(mm_trace_intern(rd->t, label, strlen(label), &name_id));
        MM_CHECK(mm_read_group(rd, (int)pid, 0, &group));
        MM_CHECK(mm_trace_track(rd->t, (int)pid, group, MM_TRACK_OTHER, -1, name_id, (int)tid,
                                &track));
        MM_CHECK(mm_read_map_tid(rd, (int)pid, (int)tid, track));
    }
    e.track = track;
    e.kind = (uint8_t)k;
    e.task = (int32_t)task;
    e.owner = (int32_t)owner;
    e.peer = (int32_t)peer;
    e.invocation = (uint32_t)inv;
    MM_CHECK(mm_trace_intern(rd->t, stage->u.str, stage->len, &e.stage));
    MM_CHECK(mm_trace_intern(rd->t, d, strlen(d), &e.direction));
    return mm_trace_add_event(rd->t, &e);
}

static megamoe_status_t mm_read_meta(mm_reader_t *rd, const mm_json_value_t *meta)
{
    const mm_json_value_t *ver = mm_json_get(meta, "schemaVersion");
    int64_t version;
    if (ver == NULL || !mm_json_int(ver, 0, INT32_MAX, &version))
        return mm_read_fail(rd, meta, "megaKernelTrace has no integer schemaVersion");
    if (version != 1)
        return mm_read_fail(rd, ver, "unsupported megaKernelTrace schemaVersion (this tool reads "
                                     "version 1; update megamoe)");
    /* Ranks: the "ranks" list, else the top-level fields of a single-rank file. */
    const mm_json_value_t *ranks = mm_json_get(meta, "ranks");
    uint32_t n = ranks != NULL && ranks->type == MM_JSON_ARRAY ? ranks->len : 0;
    for (uint32_t i = 0; i <= n; i++) {
        const mm_json_value_t *r = i < n ? &ranks->u.items[i] : meta;
        if (i == n && n > 0) break;
        int64_t rank, invs, recs, dropped;
        if (!mm_read_int(r, "rank", 0, INT32_MAX, -1, &rank) ||
            !mm_read_int(r, "invocationCount", 0, INT64_MAX, 0, &invs) ||
            !mm_read_int(r, "recordCount", 0, INT64_MAX, 0, &recs) ||
            !mm_read_int(r, "droppedRecordCount", 0, INT64_MAX, 0, &dropped))
            return mm_read_fail(rd, r, "megaKernelTrace rank entry: rank and counts must be "
                                       "integers >= 0");
        if (rank < 0) {
            if (i < n) return mm_read_fail(rd, r, "megaKernelTrace rank entry without 'rank'");
            continue; /* merged file without a ranks list: ranks come from the events */
        }
        mm_trace_rank_t *rk;
        MM_CHECK(mm_trace_rank(rd->t, (int)rank, &rk));
        rk->invocations += (uint64_t)invs;
        rk->records += (uint64_t)recs;
        rk->dropped += (uint64_t)dropped;
        const mm_json_value_t *host = mm_json_get(r, "host");
        if (host != NULL && host->type == MM_JSON_STRING)
            MM_CHECK(mm_trace_intern(rd->t, host->u.str, host->len, &rk->host));
    }
    const mm_json_value_t *warnings = mm_json_get(meta, "warnings");
    if (warnings != NULL && warnings->type == MM_JSON_ARRAY)
        for (uint32_t i = 0; i < warnings->len; i++)
            if (warnings->u.items[i].type == MM_JSON_STRING)
                MM_CHECK(mm_trace_warn(rd->t, "%s", warnings->u.items[i].u.str));
    const mm_json_value_t *invs = mm_json_get(meta, "invocations");
    if (invs != NULL && invs->type == MM_JSON_ARRAY) {
        for (uint32_t i = 0; i < invs->len; i++) {
            const mm_json_value_t *v = &invs->u.items[i];
            int64_t rank, file_group, index, ts, dur;
            if (!mm_read_int(v, "rank", 0, INT32_MAX, -1, &rank) || rank < 0 ||
                !mm_read_int(v, "group", 0, INT32_MAX, 0, &file_group) ||
                !mm_read_int(v, "invocation", 0, UINT32_MAX, -1, &index) || index < 0 ||
                !mm_json_scaled(mm_json_get(v, "ts"), 3, &ts) ||
                !mm_json_scaled(mm_json_get(v, "dur"), 3, &dur) || dur < 0)
                return mm_read_fail(rd, v, "invocation entry needs integer rank and invocation "
                                           "and numeric ts and dur");
            if (ts < 0 || ts > MM_TRACE_MAX_NS || dur > MM_TRACE_MAX_NS)
                return mm_read_fail(rd, v, "invocation 'ts' and 'dur' must be in [0, 2^61 ns] "
                                           "(CLOCK_MONOTONIC microseconds)");
            const mm_json_value_t *dir = mm_json_get(v, "direction");
            const mm_json_value_t *ended = mm_json_get(v, "ended");
            mm_trace_invocation_t inv;
            inv.pid = (int)rank;
            MM_CHECK(mm_read_group(rd, (int)rank, (int)file_group, &inv.group));
            inv.index = (uint32_t)index;
            const char *d = dir != NULL && dir->type == MM_JSON_STRING ? dir->u.str : "unknown";
            MM_CHECK(mm_trace_intern(rd->t, d, strlen(d), &inv.direction));
            const mm_json_value_t *note = mm_json_get(v, "note");
            inv.note = MM_TRACE_NO_NOTE;
            if (note != NULL && note->type == MM_JSON_STRING)
                MM_CHECK(mm_trace_intern(rd->t, note->u.str, note->len, &inv.note));
            inv.begin_ns = ts;
            inv.end_ns = ended != NULL && ended->type == MM_JSON_FALSE ? -1 : ts + dur;
            MM_CHECK(mm_trace_add_invocation(rd->t, &inv));
        }
    }
    return MEGAMOE_OK;
}

static megamoe_status_t mm_read_doc(mm_reader_t *rd, const mm_json_value_t *root)
{
    if (root->type != MM_JSON_OBJECT)
        return mm_read_fail(rd, root, "a Chrome trace is a JSON object; this is not one");
    const mm_json_value_t *events = mm_json_get(root, "traceEvents");
    const mm_json_value_t *meta = mm_json_get(root, "megaKernelTrace");
    if (events == NULL || events->type != MM_JSON_ARRAY)
        return mm_read_fail(rd, root, "no \"traceEvents\" array: not a Chrome trace");
    if (meta == NULL || meta->type != MM_JSON_OBJECT)
        return mm_read_fail(rd, root, "no \"megaKernelTrace\" object: not a MegaKernel trace "
                                      "written by megamoe");
    MM_CHECK(mm_read_meta(rd, meta));
    /* Tracks first (metadata may follow the events in other writers' files). */
    for (uint32_t i = 0; i < events->len; i++) {
        const mm_json_value_t *ev = &events->u.items[i];
        if (ev->type != MM_JSON_OBJECT) return mm_read_fail(rd, ev, "trace event is not an object");
        if (mm_json_str_is(mm_json_get(ev, "ph"), "M") &&
            mm_json_str_is(mm_json_get(ev, "name"), "thread_name"))
            MM_CHECK(mm_read_thread_name(rd, ev));
    }
    for (uint32_t i = 0; i < events->len; i++) {
        const mm_json_value_t *ev = &events->u.items[i];
        const mm_json_value_t *ph = mm_json_get(ev, "ph"), *cat = mm_json_get(ev, "cat");
        if (mm_json_str_is(ph, "M")) continue;
        if (mm_json_str_is(cat, "MegaKernel")) {
            if (!mm_json_str_is(ph, "X"))
                return mm_read_fail(rd, ev, "MegaKernel event must be a complete event (ph \"X\")");
            MM_CHECK(mm_read_record(rd, ev));
        } else if (!mm_json_str_is(cat, "MegaKernelLaunch")) {
            rd->foreign++;
        }
    }
    if (rd->foreign)
        MM_CHECK(mm_trace_warn(rd->t, "%s: %llu events not written by megamoe were left out",
                               rd->path, (unsigned long long)rd->foreign));
    return MEGAMOE_OK;
}

megamoe_status_t mm_trace_read_file(mm_trace_t *t, const char *path)
{
    char *text = NULL;
    size_t len = 0;
    MM_CHECK(mm_read_file_text(path, &text, &len));
    mm_json_doc_t *doc;
    megamoe_status_t st = mm_json_parse(text, len, path, &doc);
    if (st != MEGAMOE_OK) {
        free(text);
        return st;
    }
    mm_reader_t rd;
    memset(&rd, 0, sizeof rd);
    rd.t = t;
    rd.path = path;
    rd.tracks_before = t->n_tracks;
    rd.invs_before = t->n_invs;
    st = mm_read_doc(&rd, mm_json_root(doc));
    free(rd.groups);
    free(rd.tids);
    mm_json_free(doc);
    free(text);
    return st;
}

static int mm_read_name_cmp(const void *a, const void *b)
{
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    /* trace_<rank>...: numeric rank order, then the name. */
    char *ex, *ey;
    long rx = strtol(x + 6, &ex, 10), ry = strtol(y + 6, &ey, 10);
    if (rx != ry) return rx < ry ? -1 : 1;
    /* trace_<rank>.json (the first group) before trace_<rank>.g<serial>.json. */
    int mx = strcmp(ex, ".json") == 0, my = strcmp(ey, ".json") == 0;
    if (mx != my) return mx ? -1 : 1;
    long gx = strncmp(ex, ".g", 2) == 0 ? strtol(ex + 2, NULL, 10) : 0;
    long gy = strncmp(ey, ".g", 2) == 0 ? strtol(ey + 2, NULL, 10) : 0;
    if (gx != gy) return gx < gy ? -1 : 1;
    return strcmp(x, y);
}

static int mm_read_is_trace_name(const char *name)
{
    size_t n = strlen(name);
    return n > 11 && strncmp(name, "trace_", 6) == 0 && name[6] >= '0' && name[6] <= '9' &&
           strcmp(name + n - 5, ".json") == 0;
}

static megamoe_status_t mm_read_dir(mm_trace_t *t, const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return mm_error_quiet(MEGAMOE_IO, "cannot list trace directory %s: %s", dir,
                              strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    megamoe_status_t st = MEGAMOE_OK;
    struct dirent *de;
    while (st == MEGAMOE_OK && (de = readdir(d)) != NULL) {
        if (!mm_read_is_trace_name(de->d_name)) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **g = realloc(names, cap * sizeof *g);
            if (g == NULL) {
                st = mm_error_quiet(MEGAMOE_OUT_OF_MEMORY, "out of memory");
                break;
            }
            names = g;
        }
        names[n] = strdup(de->d_name);
        if (names[n] == NULL) st = mm_error_quiet(MEGAMOE_OUT_OF_MEMORY, "out of memory");
        else n++;
    }
    closedir(d);
    if (st == MEGAMOE_OK && n == 0)
        st = mm_error_quiet(MEGAMOE_NOT_FOUND,
                            "trace directory %s holds no trace_<rank>.json file (was the run "
                            "profiled with MEGAMOE_PROFILE=%s?)",
                            dir, dir);
    if (st == MEGAMOE_OK) qsort(names, n, sizeof *names, mm_read_name_cmp);
    for (size_t i = 0; i < n && st == MEGAMOE_OK; i++) {
        size_t len = strlen(dir) + strlen(names[i]) + 2;
        char *path = malloc(len);
        if (path == NULL) {
            st = mm_error_quiet(MEGAMOE_OUT_OF_MEMORY, "out of memory");
            break;
        }
        snprintf(path, len, "%s/%s", dir, names[i]);
        st = mm_trace_read_file(t, path);
        free(path);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return st;
}

megamoe_status_t mm_trace_read_inputs(mm_trace_t *t, const char *const *inputs, size_t count)
{
    if (inputs == NULL || count == 0)
        return mm_error_quiet(MEGAMOE_INVALID_ARGUMENT,
                              "no trace given: pass trace files or directories of "
                              "trace_<rank>.json files");
    for (size_t i = 0; i < count; i++) {
        if (inputs[i] == NULL || inputs[i][0] == '\0')
            return mm_error_quiet(MEGAMOE_INVALID_ARGUMENT, "trace input %zu is empty", i);
        struct stat sb;
        if (stat(inputs[i], &sb) != 0)
            return mm_error_quiet(errno == ENOENT ? MEGAMOE_NOT_FOUND : MEGAMOE_IO,
                                  "trace %s: %s", inputs[i], strerror(errno));
        MM_CHECK(S_ISDIR(sb.st_mode) ? mm_read_dir(t, inputs[i])
                                     : mm_trace_read_file(t, inputs[i]));
    }
    /* Timelines of different hosts do not share a clock. */
    uint32_t first_host = UINT32_MAX;
    uint32_t unknown;
    MM_CHECK(mm_trace_intern(t, "unknown", 7, &unknown));
    for (size_t r = 0; r < t->n_ranks; r++) {
        uint32_t h = t->ranks[r].host;
        if (h == unknown) continue;
        if (first_host == UINT32_MAX) first_host = h;
        else if (h != first_host)
            return mm_trace_warn(t, "ranks come from several hosts (%s, %s, ...): CLOCK_MONOTONIC "
                                    "differs between hosts, so their timelines are not aligned",
                                 mm_trace_str(t, first_host), mm_trace_str(t, h));
    }
    return MEGAMOE_OK;
}
