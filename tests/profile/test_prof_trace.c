/* Trace export, read-back, merge, summary and svg: required fields, exact round trip,
 * escaping, per-track non-overlap, warnings, several ranks and groups, known statistics,
 * malformed files. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness/harness.h"
#include "megamoe/prof.h"
#include "profile/json.h"
#include "profile/prof.h"
#include "profile/trace.h"

static const char *const stages[] = {"dispatch", "gmm1", "swiglu", "gmm2", "combine"};

static char tmpdir[64];

static const char *tmp_path(const char *name)
{
    static char buf[4][256];
    static int k;
    if (tmpdir[0] == '\0') {
        strcpy(tmpdir, "/tmp/mm_prof_trace_XXXXXX");
        if (mkdtemp(tmpdir) == NULL) return NULL;
    }
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

__attribute__((destructor)) static void cleanup(void)
{
    if (tmpdir[0] == '\0') return;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", tmpdir);
}

/* A well-formed session: per invocation, every worker does wait -> compute -> signal per
 * task, back to back, at fixed offsets from base. */
static mm_prof_session_t *synthetic(int rank, int n_cube, int n_vector, int invocations,
                                    int tasks, uint64_t base)
{
    mm_prof_session_t *s;
    if (mm_prof_session_create(rank, n_cube, n_vector, 4096, stages, 5, &s) != MEGAMOE_OK)
        return NULL;
    for (int inv = 0; inv < invocations; inv++) {
        uint32_t id = mm_prof_begin(s, inv % 2 ? "backward" : "forward");
        for (int w = 0; w < n_cube + n_vector; w++) {
            mm_prof_ring_t *r = w < n_cube ? mm_prof_ring(s, MM_PROF_CUBE, w)
                                           : mm_prof_ring(s, MM_PROF_VECTOR, w - n_cube);
            uint64_t t = base + (uint64_t)inv * 1000000 + (uint64_t)w * 7;
            for (int k = 0; k < tasks; k++) {
                uint8_t stage = (uint8_t)(w < n_cube ? 1 + 2 * (k % 2) : (k % 2 ? 4 : 0));
                mm_prof_push(r, MM_PROF_WAIT, stage, k, k % 4, -1, id, t, t + 100 + (uint64_t)k);
                t += 100 + (uint64_t)k;
                mm_prof_push(r, MM_PROF_COMPUTE, stage, k, k % 4, -1, id, t, t + 1000);
                t += 1000;
                mm_prof_push(r, MM_PROF_SIGNAL, stage, k, k % 4, k % 3 == 2 ? -1 : k % 3, id, t,
                             t + 10);
                t += 10;
            }
        }
        mm_prof_end(s);
    }
    return s;
}

static char *export_text(const mm_prof_session_t *s, size_t *len_p)
{
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (mem == NULL) return NULL;
    megamoe_status_t st = mm_prof_export_chrome(s, mem);
    fclose(mem);
    if (st != MEGAMOE_OK) {
        free(text);
        return NULL;
    }
    if (len_p) *len_p = len;
    return text;
}

MM_TEST(export_has_the_required_fields)
{
    mm_prof_session_t *s = synthetic(2, 2, 1, 2, 3, 5000000000ull);
    ASSERT_TRUE(s != NULL);
    size_t len;
    char *text = export_text(s, &len);
    ASSERT_TRUE(text != NULL);
    mm_json_doc_t *doc;
    ASSERT_OK(mm_json_parse(text, len, "export", &doc));
    const mm_json_value_t *root = mm_json_root(doc);
    const mm_json_value_t *events = mm_json_get(root, "traceEvents");
    const mm_json_value_t *meta = mm_json_get(root, "megaKernelTrace");
    ASSERT_TRUE(events != NULL && events->type == MM_JSON_ARRAY);
    ASSERT_TRUE(meta != NULL && meta->type == MM_JSON_OBJECT);
    int64_t v;
    ASSERT_TRUE(mm_json_int(mm_json_get(meta, "schemaVersion"), 0, 9, &v) && v == 1);
    ASSERT_TRUE(mm_json_int(mm_json_get(meta, "rank"), 0, 9, &v) && v == 2);
    ASSERT_TRUE(mm_json_int(mm_json_get(meta, "invocationCount"), 0, 99, &v) && v == 2);
    ASSERT_TRUE(mm_json_int(mm_json_get(meta, "recordCount"), 0, 999, &v) && v == 3 * 2 * 3 * 3);
    ASSERT_TRUE(mm_json_int(mm_json_get(meta, "droppedRecordCount"), 0, 9, &v) && v == 0);
    ASSERT_EQ_INT(mm_json_get(meta, "warnings")->len, 0);
    ASSERT_EQ_INT(mm_json_get(meta, "invocations")->len, 2);
    int x = 0, names = 0, process = 0;
    for (uint32_t i = 0; i < events->len; i++) {
        const mm_json_value_t *e = &events->u.items[i];
        const mm_json_value_t *args = mm_json_get(e, "args");
        ASSERT_TRUE(mm_json_int(mm_json_get(e, "pid"), 0, 9, &v) && v == 2);
        if (mm_json_str_is(mm_json_get(e, "name"), "process_name")) {
            ASSERT_TRUE(mm_json_str_is(mm_json_get(args, "name"), "rank 2"));
            process++;
        }
        if (mm_json_str_is(mm_json_get(e, "name"), "thread_name")) {
            const char *n = mm_json_get(args, "name")->u.str;
            ASSERT_TRUE(strcmp(n, "cube 0") == 0 || strcmp(n, "cube 1") == 0 ||
                        strcmp(n, "vector 0") == 0 || strcmp(n, "launch") == 0);
            names++;
        }
        if (!mm_json_str_is(mm_json_get(e, "cat"), "MegaKernel")) continue;
        x++;
        ASSERT_TRUE(mm_json_str_is(mm_json_get(e, "ph"), "X"));
        ASSERT_TRUE(mm_json_get(e, "ts")->type == MM_JSON_NUMBER);
        ASSERT_TRUE(mm_json_get(e, "dur")->type == MM_JSON_NUMBER);
        const char *kind = mm_json_get(args, "kind")->u.str, *stage = mm_json_get(args, "stage")->u.str;
        char want[64];
        snprintf(want, sizeof want, "%s:%s", stage, kind);
        ASSERT_TRUE(mm_json_str_is(mm_json_get(e, "name"), want));
        const char *keys[] = {"task", "owner", "peer", "invocation"};
        for (int k = 0; k < 4; k++) ASSERT_TRUE(mm_json_get(args, keys[k])->type == MM_JSON_NUMBER);
        ASSERT_TRUE(mm_json_get(args, "direction")->type == MM_JSON_STRING);
    }
    ASSERT_EQ_INT(x, 54);
    ASSERT_EQ_INT(names, 4);
    ASSERT_EQ_INT(process, 1);
    /* Microseconds with nanosecond digits: the first record starts at 5000000000 ns. */
    ASSERT_TRUE(strstr(text, "\"ts\":5000000.000") != NULL);
    ASSERT_TRUE(strstr(text, "\"dur\":1.000") != NULL);
    mm_json_free(doc);
    free(text);
    mm_prof_session_destroy(s);
}

MM_TEST(export_reads_back_exactly)
{
    /* Stamps above 2^53 ns (a host up for 104+ days): still exact through the file. */
    mm_prof_session_t *s = synthetic(0, 1, 1, 3, 4, 9100000000000123ull);
    ASSERT_TRUE(s != NULL);
    const char *path = tmp_path("roundtrip/trace_0.json");
    ASSERT_OK(mm_prof_export_file((const mm_prof_session_t *const *)&s, 1, path));
    mm_trace_t a, b;
    mm_trace_init(&a);
    mm_trace_init(&b);
    ASSERT_OK(mm_trace_from_sessions(&a, (const mm_prof_session_t *const *)&s, 1));
    ASSERT_OK(mm_trace_read_file(&b, path));
    ASSERT_EQ_INT(a.n_events, b.n_events);
    ASSERT_EQ_INT(a.n_invs, b.n_invs);
    ASSERT_EQ_INT(a.n_tracks, b.n_tracks);
    for (size_t i = 0; i < a.n_events; i++) {
        const mm_trace_event_t *x = &a.events[i], *y = &b.events[i];
        ASSERT_EQ_INT(x->ts_ns, y->ts_ns);
        ASSERT_EQ_INT(x->dur_ns, y->dur_ns);
        ASSERT_EQ_INT(x->kind, y->kind);
        ASSERT_EQ_INT(x->task, y->task);
        ASSERT_EQ_INT(x->owner, y->owner);
        ASSERT_EQ_INT(x->peer, y->peer);
        ASSERT_EQ_INT(x->invocation, y->invocation);
        ASSERT_EQ_STR(mm_trace_str(&a, x->stage), mm_trace_str(&b, y->stage));
        ASSERT_EQ_STR(mm_trace_str(&a, x->direction), mm_trace_str(&b, y->direction));
        ASSERT_EQ_INT(a.tracks[x->track].role, b.tracks[y->track].role);
        ASSERT_EQ_INT(a.tracks[x->track].worker, b.tracks[y->track].worker);
    }
    for (size_t i = 0; i < a.n_invs; i++) {
        ASSERT_EQ_INT(a.invs[i].begin_ns, b.invs[i].begin_ns);
        ASSERT_EQ_INT(a.invs[i].end_ns, b.invs[i].end_ns);
    }
    mm_trace_free(&a);
    mm_trace_free(&b);
    mm_prof_session_destroy(s);
}

MM_TEST(names_are_escaped)
{
    const char *const odd[] = {"quote\"back\\slash", "new\nline\ttab", "ctl\x01\x1f",
                               "bad utf8 \xff\xc3", "ok \xc3\xa9\xe4\xb8\xad", "</svg>&<x>"};
    mm_prof_session_t *s;
    ASSERT_OK(mm_prof_session_create(0, 1, 0, 16, odd, 6, &s));
    uint32_t inv = mm_prof_begin(s, "dir\"ection\x02");
    for (int i = 0; i < 6; i++)
        mm_prof_push(mm_prof_ring(s, MM_PROF_CUBE, 0), MM_PROF_COMPUTE, (uint8_t)i, i, -1, -1, inv,
                     100 * (uint64_t)i, 100 * (uint64_t)i + 50);
    mm_prof_end(s);
    const char *path = tmp_path("escape.json");
    ASSERT_OK(mm_prof_export_file((const mm_prof_session_t *const *)&s, 1, path));
    mm_trace_t t;
    mm_trace_init(&t);
    ASSERT_OK(mm_trace_read_file(&t, path));
    ASSERT_EQ_INT(t.n_events, 6);
    ASSERT_EQ_STR(mm_trace_str(&t, t.events[0].stage), odd[0]);
    ASSERT_EQ_STR(mm_trace_str(&t, t.events[1].stage), odd[1]);
    ASSERT_EQ_STR(mm_trace_str(&t, t.events[2].stage), odd[2]);
    ASSERT_EQ_STR(mm_trace_str(&t, t.events[3].stage), "bad utf8 \xef\xbf\xbd\xef\xbf\xbd");
    ASSERT_EQ_STR(mm_trace_str(&t, t.events[4].stage), odd[4]);
    ASSERT_EQ_STR(mm_trace_str(&t, t.events[0].direction), "dir\"ection\x02");
    /* The SVG escapes them too (xml.etree parses it in the Python test). */
    const char *in[] = {path};
    const char *svg = tmp_path("escape.svg");
    ASSERT_OK(megamoe_trace_svg(in, 1, NULL, svg));
    FILE *f = fopen(svg, "r");
    ASSERT_TRUE(f != NULL);
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    ASSERT_CONTAINS(buf, "&lt;/svg&gt;&amp;&lt;x&gt;");
    ASSERT_TRUE(strstr(buf, "</svg>&") == NULL);
    mm_trace_free(&t);
    mm_prof_session_destroy(s);
}

MM_TEST(spans_do_not_overlap_per_track_and_overlaps_warn)
{
    mm_prof_session_t *s = synthetic(0, 2, 2, 2, 5, 1000);
    ASSERT_TRUE(s != NULL);
    mm_trace_t t;
    mm_trace_init(&t);
    ASSERT_OK(mm_trace_from_sessions(&t, (const mm_prof_session_t *const *)&s, 1));
    ASSERT_EQ_INT(t.n_warnings, 0);
    uint32_t *order;
    ASSERT_OK(mm_trace_sorted_events(&t, &order));
    for (size_t i = 1; i < t.n_events; i++) {
        const mm_trace_event_t *p = &t.events[order[i - 1]], *e = &t.events[order[i]];
        if (p->track == e->track) ASSERT_LE_INT(p->ts_ns + p->dur_ns, e->ts_ns);
    }
    free(order);
    mm_trace_free(&t);
    /* A producer bug (a span starting inside the previous one) is reported. */
    mm_prof_ring_t *r = mm_prof_ring(s, MM_PROF_VECTOR, 1);
    mm_prof_push(r, MM_PROF_COMPUTE, 0, 99, -1, -1, 1, 2000000, 2000100);
    mm_prof_push(r, MM_PROF_COMPUTE, 0, 100, -1, -1, 1, 2000050, 2000200);
    mm_prof_push(r, MM_PROF_COMPUTE, 0, 101, -1, -1, 1, 2000300, 2000250); /* ends before start */
    mm_prof_push(r, MM_PROF_COMPUTE, 77, 102, -1, -1, 1, 2000400, 2000500); /* unknown stage */
    mm_trace_init(&t);
    ASSERT_OK(mm_trace_from_sessions(&t, (const mm_prof_session_t *const *)&s, 1));
    ASSERT_EQ_INT(t.n_warnings, 3);
    ASSERT_CONTAINS(mm_trace_str(&t, t.warnings[0]), "rank 0 vector 1: 1 spans overlap");
    ASSERT_CONTAINS(mm_trace_str(&t, t.warnings[1]), "end before they start");
    ASSERT_CONTAINS(mm_trace_str(&t, t.warnings[2]), "outside the table of 5 names");
    mm_trace_free(&t);
    mm_prof_session_destroy(s);
}

MM_TEST(dropped_records_and_open_invocations_warn)
{
    mm_prof_session_t *s;
    ASSERT_OK(mm_prof_session_create(1, 1, 0, 3, stages, 5, &s));
    uint32_t inv = mm_prof_begin(s, "forward");
    for (int i = 0; i < 5; i++)
        mm_prof_push(mm_prof_ring(s, MM_PROF_CUBE, 0), MM_PROF_COMPUTE, 1, i, -1, -1, inv,
                     10 * (uint64_t)i, 10 * (uint64_t)i + 5);
    /* never ended */
    size_t len;
    char *text = export_text(s, &len);
    ASSERT_TRUE(text != NULL);
    ASSERT_CONTAINS(text, "\"droppedRecordCount\":2");
    ASSERT_CONTAINS(text, "rank 1 cube 0: 2 records dropped (ring of 3 records full); raise "
                          "records_per_worker");
    ASSERT_CONTAINS(text, "invocation 0 (forward) was begun but never ended");
    ASSERT_CONTAINS(text, "\"ended\":false");
    mm_json_doc_t *doc;
    ASSERT_OK(mm_json_parse(text, len, "export", &doc));
    mm_json_free(doc);
    free(text);
    mm_prof_session_destroy(s);
}

/* Writes ranks 0..n-1 to dir/trace_<rank>.json. */
static megamoe_status_t write_ranks(const char *dir, int n, uint64_t base)
{
    for (int r = 0; r < n; r++) {
        mm_prof_session_t *s = synthetic(r, 1, 1, 2, 2, base + (uint64_t)r * 50);
        if (s == NULL) return MEGAMOE_INTERNAL;
        megamoe_status_t st = mm_prof_export_dir(s, dir);
        mm_prof_session_destroy(s);
        if (st != MEGAMOE_OK) return st;
    }
    return MEGAMOE_OK;
}

MM_TEST(merge_puts_ranks_on_one_time_axis)
{
    char dir[256];
    snprintf(dir, sizeof dir, "%s", tmp_path("ranks"));
    ASSERT_OK(write_ranks(dir, 3, 1000000));
    /* A second resource group of rank 1, named as mm_prof_retire names it. */
    mm_prof_session_t *g = synthetic(1, 1, 0, 1, 1, 9000000);
    ASSERT_TRUE(g != NULL);
    char gpath[300];
    snprintf(gpath, sizeof gpath, "%s/trace_1.g1.json", dir);
    ASSERT_OK(mm_prof_export_file((const mm_prof_session_t *const *)&g, 1, gpath));
    mm_prof_session_destroy(g);
    const char *out = tmp_path("merged/all.json");
    const char *in[] = {dir};
    ASSERT_OK(megamoe_trace_merge(in, 1, out));
    mm_trace_t t;
    mm_trace_init(&t);
    ASSERT_OK(mm_trace_read_file(&t, out));
    ASSERT_EQ_INT(t.n_ranks, 3);
    ASSERT_EQ_INT(t.n_events, 3 * 2 * 2 * 2 * 3 + 3);
    ASSERT_EQ_INT(t.n_invs, 3 * 2 + 1);
    ASSERT_EQ_INT(mm_trace_group_count(&t, 1), 2);
    ASSERT_EQ_INT(mm_trace_group_count(&t, 0), 1);
    /* Rank r's first record starts at base + r*50: the axis is shared, not re-based. */
    int64_t first[3] = {INT64_MAX, INT64_MAX, INT64_MAX};
    for (size_t i = 0; i < t.n_events; i++) {
        int pid = t.tracks[t.events[i].track].pid;
        if (t.events[i].ts_ns < first[pid]) first[pid] = t.events[i].ts_ns;
    }
    for (int r = 0; r < 3; r++) ASSERT_EQ_INT(first[r], 1000000 + 50 * r);
    /* Tracks of one pid have distinct tids. */
    for (size_t i = 0; i < t.n_tracks; i++)
        for (size_t j = i + 1; j < t.n_tracks; j++)
            if (t.tracks[i].pid == t.tracks[j].pid) ASSERT_NE_INT(t.tracks[i].tid, t.tracks[j].tid);
    char label[160];
    int grouped = 0;
    for (size_t i = 0; i < t.n_tracks; i++) {
        mm_trace_track_label(&t, &t.tracks[i], label, sizeof label);
        grouped += strncmp(label, "group 1/", 8) == 0;
    }
    ASSERT_EQ_INT(grouped, 2); /* launch and cube 0 of rank 1's second group */
    mm_trace_free(&t);
    /* Merging the merged file with a rank file again keeps groups apart (no silent mixing). */
    char r0[300];
    snprintf(r0, sizeof r0, "%s/trace_0.json", dir);
    const char *in2[] = {out, r0};
    const char *out2 = tmp_path("merged2.json");
    ASSERT_OK(megamoe_trace_merge(in2, 2, out2));
    mm_trace_init(&t);
    ASSERT_OK(mm_trace_read_file(&t, out2));
    ASSERT_EQ_INT(mm_trace_group_count(&t, 0), 2);
    int warned = 0;
    for (size_t i = 0; i < t.n_warnings; i++)
        warned |= strstr(mm_trace_str(&t, t.warnings[i]), "also appears in an earlier file") != NULL;
    ASSERT_TRUE(warned);
    mm_trace_free(&t);
}

static const char *write_file(const char *name, const char *text)
{
    const char *path = tmp_path(name);
    FILE *f = fopen(path, "w");
    if (f == NULL) return NULL;
    fputs(text, f);
    fclose(f);
    return path;
}

static char *summary_json(const char *path, int64_t invocation)
{
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    megamoe_trace_summary_options_t o = {1, invocation};
    const char *in[] = {path};
    megamoe_status_t st = megamoe_trace_summary(in, 1, &o, mem);
    fclose(mem);
    if (st != MEGAMOE_OK) {
        free(text);
        return NULL;
    }
    return text;
}

/* A hand-written trace: two invocations of 1000 ns and 3000 ns on rank 0, so every
 * statistic is known. cube 0: gmm1 compute 100, 200, 300, 400, 1000; wait 500 and 250.
 * vector 0: dispatch compute 50; signal 10. */
static const char *known_trace =
    "{\"traceEvents\":[\n"
    "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":1,\"args\":{\"name\":\"cube 0\",\"role\":\"cube\",\"worker\":0,\"group\":0}},\n"
    "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":2,\"args\":{\"name\":\"vector 0\"}},\n"
    "{\"name\":\"g\",\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":10.0,\"dur\":0.1,\"args\":{\"stage\":\"gmm1\",\"kind\":\"compute\",\"invocation\":0}},\n"
    "{\"name\":\"g\",\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":10.1,\"dur\":0.2,\"args\":{\"stage\":\"gmm1\",\"kind\":\"compute\",\"invocation\":0}},\n"
    "{\"name\":\"w\",\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":10.3,\"dur\":0.5,\"args\":{\"stage\":\"gmm1\",\"kind\":\"wait\",\"invocation\":0}},\n"
    "{\"name\":\"g\",\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":20.0,\"dur\":0.3,\"args\":{\"stage\":\"gmm1\",\"kind\":\"compute\",\"invocation\":1}},\n"
    "{\"name\":\"g\",\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":20.3,\"dur\":0.4,\"args\":{\"stage\":\"gmm1\",\"kind\":\"compute\",\"invocation\":1}},\n"
    "{\"name\":\"w\",\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":20.7,\"dur\":0.25,\"args\":{\"stage\":\"gmm1\",\"kind\":\"wait\",\"invocation\":1}},\n"
    "{\"name\":\"g\",\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":21.0,\"dur\":1,\"args\":{\"stage\":\"gmm1\",\"kind\":\"compute\",\"invocation\":1}},\n"
    "{\"name\":\"d\",\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":2,\"ts\":10.0,\"dur\":0.05,\"args\":{\"stage\":\"dispatch\",\"kind\":\"compute\",\"invocation\":0,\"peer\":1}},\n"
    "{\"name\":\"s\",\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":2,\"ts\":10.05,\"dur\":0.01,\"args\":{\"stage\":\"dispatch\",\"kind\":\"signal\",\"invocation\":0,\"peer\":1}},\n"
    "{\"name\":\"other tool\",\"ph\":\"X\",\"pid\":0,\"tid\":9,\"ts\":1,\"dur\":1}\n"
    "],\"megaKernelTrace\":{\"schemaVersion\":1,\"rank\":0,\"host\":\"h\",\"invocationCount\":2,"
    "\"recordCount\":9,\"droppedRecordCount\":4,\"warnings\":[\"rank 0 cube 0: 4 records dropped\"],"
    "\"invocations\":[{\"rank\":0,\"group\":0,\"invocation\":0,\"direction\":\"forward\",\"ts\":10,\"dur\":1},"
    "{\"rank\":0,\"group\":0,\"invocation\":1,\"direction\":\"backward\",\"ts\":20,\"dur\":3}]}}\n";

static const mm_json_value_t *find_row(const mm_json_value_t *stages_v, const char *stage,
                                       const char *kind)
{
    for (uint32_t i = 0; i < stages_v->len; i++)
        if (mm_json_str_is(mm_json_get(&stages_v->u.items[i], "stage"), stage) &&
            mm_json_str_is(mm_json_get(&stages_v->u.items[i], "kind"), kind))
            return &stages_v->u.items[i];
    return NULL;
}

static int64_t num(const mm_json_value_t *obj, const char *key, int decimals)
{
    int64_t v = -999;
    if (!mm_json_scaled(mm_json_get(obj, key), decimals, &v)) return -999;
    return v;
}

MM_TEST(summary_numbers_of_a_known_trace)
{
    const char *path = write_file("known.json", known_trace);
    ASSERT_TRUE(path != NULL);
    char *text = summary_json(path, -1);
    ASSERT_TRUE(text != NULL);
    mm_json_doc_t *doc;
    ASSERT_OK(mm_json_parse(text, strlen(text), "summary", &doc));
    const mm_json_value_t *rank = &mm_json_get(mm_json_root(doc), "ranks")->u.items[0];
    ASSERT_EQ_INT(num(rank, "launchNs", 0), 4000);
    ASSERT_EQ_INT(num(rank, "dropped", 0), 4);
    ASSERT_EQ_INT(num(rank, "records", 0), 9);
    const mm_json_value_t *st = mm_json_get(rank, "stages");
    const mm_json_value_t *g = find_row(st, "gmm1", "compute");
    ASSERT_TRUE(g != NULL);
    ASSERT_EQ_INT(num(g, "count", 0), 5);
    ASSERT_EQ_INT(num(g, "totalNs", 0), 2000);
    ASSERT_EQ_INT(num(g, "meanNs", 0), 400);
    ASSERT_EQ_INT(num(g, "p50Ns", 0), 300);
    ASSERT_EQ_INT(num(g, "p99Ns", 0), 1000);
    ASSERT_EQ_INT(num(g, "share", 6), 500000); /* 2000 / (4000 * 1 cube worker) */
    const mm_json_value_t *w = find_row(st, "gmm1", "wait");
    ASSERT_EQ_INT(num(w, "totalNs", 0), 750);
    ASSERT_EQ_INT(num(w, "p50Ns", 0), 250);
    const mm_json_value_t *d = find_row(st, "dispatch", "signal");
    ASSERT_TRUE(d != NULL && mm_json_str_is(mm_json_get(d, "role"), "vector"));
    ASSERT_EQ_INT(num(d, "totalNs", 0), 10);
    const mm_json_value_t *workers = mm_json_get(rank, "workers");
    ASSERT_EQ_INT(workers->len, 2); /* cube 0, vector 0 (the foreign event makes no track) */
    const mm_json_value_t *c0 = &workers->u.items[0];
    ASSERT_TRUE(mm_json_str_is(mm_json_get(c0, "name"), "cube 0"));
    ASSERT_EQ_INT(num(c0, "waitNs", 0), 750);
    ASSERT_EQ_INT(num(c0, "waitShare", 6), 187500); /* 750 / 4000 */
    const mm_json_value_t *v0 = &workers->u.items[1];
    ASSERT_TRUE(mm_json_str_is(mm_json_get(v0, "role"), "vector")); /* inferred from the name */
    const mm_json_value_t *warn = mm_json_get(mm_json_root(doc), "warnings");
    ASSERT_EQ_INT(warn->len, 2);
    ASSERT_CONTAINS(warn->u.items[1].u.str, "1 events not written by megamoe were left out");
    mm_json_free(doc);
    free(text);
    /* One invocation only: invocation 1 lasted 3000 ns. */
    text = summary_json(path, 1);
    ASSERT_TRUE(text != NULL);
    ASSERT_OK(mm_json_parse(text, strlen(text), "summary", &doc));
    rank = &mm_json_get(mm_json_root(doc), "ranks")->u.items[0];
    ASSERT_EQ_INT(num(rank, "launchNs", 0), 3000);
    g = find_row(mm_json_get(rank, "stages"), "gmm1", "compute");
    ASSERT_EQ_INT(num(g, "count", 0), 3);
    ASSERT_EQ_INT(num(g, "totalNs", 0), 1700);
    ASSERT_TRUE(find_row(mm_json_get(rank, "stages"), "dispatch", "compute") == NULL);
    mm_json_free(doc);
    free(text);
    /* The table form has the same numbers. */
    char *table = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&table, &len);
    const char *in[] = {path};
    ASSERT_OK(megamoe_trace_summary(in, 1, NULL, mem));
    fclose(mem);
    ASSERT_CONTAINS(table, "rank 0 (host h): 2 invocations (forward 1, backward 1), launch time 0.004 ms");
    ASSERT_CONTAINS(table, "gmm1");
    ASSERT_CONTAINS(table, "   50.0%");
    ASSERT_CONTAINS(table, "   18.8%"); /* cube 0 wait share 18.75% */
    ASSERT_CONTAINS(table, "4 records dropped");
    free(table);
    /* The table of one invocation counts only its launches. */
    mem = open_memstream(&table, &len);
    megamoe_trace_summary_options_t one = {0, 1};
    ASSERT_OK(megamoe_trace_summary(in, 1, &one, mem));
    fclose(mem);
    ASSERT_CONTAINS(table, "rank 0 (host h): 1 invocation (backward 1), launch time 0.003 ms");
    free(table);
}

MM_TEST(malformed_traces_are_clear_errors)
{
    struct {
        const char *name, *text, *want;
        megamoe_status_t status;
    } cases[] = {
        {"trunc.json", "{\"traceEvents\":[{\"ph\":\"X\"", "trunc.json:1:", MEGAMOE_INVALID_ARGUMENT},
        {"array.json", "[1,2]", "not one", MEGAMOE_INVALID_ARGUMENT},
        {"noevents.json", "{\"megaKernelTrace\":{\"schemaVersion\":1}}", "traceEvents",
         MEGAMOE_INVALID_ARGUMENT},
        {"foreign.json", "{\"traceEvents\":[]}", "not a MegaKernel trace", MEGAMOE_INVALID_ARGUMENT},
        {"version.json", "{\"traceEvents\":[],\"megaKernelTrace\":{\"schemaVersion\":2}}",
         "schemaVersion", MEGAMOE_INVALID_ARGUMENT},
        {"nots.json",
         "{\"traceEvents\":[{\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"dur\":1,"
         "\"args\":{\"stage\":\"a\",\"kind\":\"wait\"}}],\"megaKernelTrace\":{\"schemaVersion\":1}}",
         "nots.json:1:17: MegaKernel event needs a numeric 'ts'", MEGAMOE_INVALID_ARGUMENT},
        {"kind.json",
         "{\"traceEvents\":[{\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":1,"
         "\"dur\":1,\"args\":{\"stage\":\"a\",\"kind\":\"nap\"}}],\"megaKernelTrace\":{\"schemaVersion\":1}}",
         "args.kind must be", MEGAMOE_INVALID_ARGUMENT},
        {"negdur.json",
         "{\"traceEvents\":[{\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":1,"
         "\"dur\":-1,\"args\":{\"stage\":\"a\",\"kind\":\"wait\"}}],\"megaKernelTrace\":{\"schemaVersion\":1}}",
         "'dur' >= 0", MEGAMOE_INVALID_ARGUMENT},
        {"pid.json",
         "{\"traceEvents\":[{\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":\"0\",\"tid\":1,\"ts\":1,"
         "\"dur\":1,\"args\":{\"stage\":\"a\",\"kind\":\"wait\"}}],\"megaKernelTrace\":{\"schemaVersion\":1}}",
         "integer 'pid'", MEGAMOE_INVALID_ARGUMENT},
        {"empty.json", "", "a value was expected", MEGAMOE_INVALID_ARGUMENT},
        /* found by fuzzing: ts + dur overflowed int64 in summary and svg (UB) */
        {"hugets.json",
         "{\"traceEvents\":[{\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":1,"
         "\"ts\":9223372036854775.807,\"dur\":9223372036854775.807,\"args\":{\"stage\":\"a\","
         "\"kind\":\"wait\"}}],\"megaKernelTrace\":{\"schemaVersion\":1}}",
         "'ts' and 'dur' must be in [0, 2^61 ns]", MEGAMOE_INVALID_ARGUMENT},
        {"negts.json",
         "{\"traceEvents\":[{\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":-1,"
         "\"dur\":1,\"args\":{\"stage\":\"a\",\"kind\":\"wait\"}}],\"megaKernelTrace\":{\"schemaVersion\":1}}",
         "'ts' and 'dur' must be in", MEGAMOE_INVALID_ARGUMENT},
        {"hugeinv.json",
         "{\"traceEvents\":[],\"megaKernelTrace\":{\"schemaVersion\":1,\"invocations\":[{\"rank\":0,"
         "\"invocation\":0,\"ts\":1,\"dur\":2305843009213694.000}]}}",
         "invocation 'ts' and 'dur' must be in", MEGAMOE_INVALID_ARGUMENT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path = write_file(cases[i].name, cases[i].text);
        ASSERT_TRUE(path != NULL);
        const char *in[] = {path};
        megamoe_status_t st = megamoe_trace_merge(in, 1, tmp_path("never.json"));
        if (st != cases[i].status)
            MM_FAIL_("%s: status %d (%s)", cases[i].name, st, megamoe_last_error());
        if (strstr(megamoe_last_error(), cases[i].want) == NULL)
            MM_FAIL_("%s: error '%s' lacks '%s'", cases[i].name, megamoe_last_error(), cases[i].want);
        ASSERT_CONTAINS(megamoe_last_error(), cases[i].name);
        ASSERT_STATUS(megamoe_trace_summary(in, 1, NULL, stdout), cases[i].status);
        ASSERT_STATUS(megamoe_trace_svg(in, 1, NULL, tmp_path("never.svg")), cases[i].status);
    }
    ASSERT_TRUE(access(tmp_path("never.json"), F_OK) != 0);
    ASSERT_TRUE(access(tmp_path("never.svg"), F_OK) != 0);
    /* Missing inputs, empty directories, no inputs. */
    const char *missing[] = {"/nonexistent/trace_0.json"};
    ASSERT_STATUS(megamoe_trace_merge(missing, 1, tmp_path("x.json")), MEGAMOE_NOT_FOUND);
    ASSERT_CONTAINS(megamoe_last_error(), "/nonexistent/trace_0.json");
    char empty[256];
    snprintf(empty, sizeof empty, "%s", tmp_path("emptydir"));
    ASSERT_EQ_INT(mkdir(empty, 0777), 0);
    const char *ed[] = {empty};
    ASSERT_STATUS(megamoe_trace_merge(ed, 1, tmp_path("x.json")), MEGAMOE_NOT_FOUND);
    ASSERT_CONTAINS(megamoe_last_error(), "holds no trace_<rank>.json");
    ASSERT_STATUS(megamoe_trace_merge(NULL, 0, tmp_path("x.json")), MEGAMOE_INVALID_ARGUMENT);
    const char *good[] = {write_file("good.json", known_trace)};
    ASSERT_STATUS(megamoe_trace_merge(good, 1, ""), MEGAMOE_INVALID_ARGUMENT);
    megamoe_trace_svg_options_t bad_width = {50, -1};
    ASSERT_STATUS(megamoe_trace_svg(good, 1, &bad_width, tmp_path("w.svg")), MEGAMOE_INVALID_ARGUMENT);
    megamoe_trace_svg_options_t bad_inv = {0, 7};
    ASSERT_STATUS(megamoe_trace_svg(good, 1, &bad_inv, tmp_path("w.svg")), MEGAMOE_NOT_FOUND);
}

/* A merged trace merges to the same bytes (found by fuzzing: a launch track whose worker was
 * not -1 became a second launch track; invalid UTF-8 and long stage names changed names on
 * the second merge). */
MM_TEST(merge_of_a_merged_trace_is_the_same)
{
    char stage[200];
    memset(stage, 'g', sizeof stage - 1);
    stage[sizeof stage - 1] = '\0';
    for (int i = 10; i < 100; i++) stage[i] = (char)0xff; /* invalid UTF-8 */
    char text[2048];
    snprintf(text, sizeof text,
             "{\"traceEvents\":[{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,"
             "\"args\":{\"name\":\"launch\",\"role\":\"launch\",\"worker\":-1}},"
             "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":3,\"args\":{\"name\":"
             "\"launch\",\"role\":\"launch\",\"worker\":0}},{\"cat\":\"MegaKernel\",\"ph\":\"X\","
             "\"pid\":0,\"tid\":1,\"ts\":1,\"dur\":1,\"args\":{\"stage\":\"%s\",\"kind\":\"wait\"}}],"
             "\"megaKernelTrace\":{\"schemaVersion\":1,\"rank\":0}}", stage);
    const char *in[] = {write_file("odd.json", text)};
    ASSERT_OK(megamoe_trace_merge(in, 1, tmp_path("m1.json")));
    const char *again[] = {tmp_path("m1.json")};
    ASSERT_OK(megamoe_trace_merge(again, 1, tmp_path("m2.json")));
    size_t n1 = 0, n2 = 0;
    char *a = NULL, *b = NULL;
    FILE *f = fopen(tmp_path("m1.json"), "rb");
    ASSERT_TRUE(f != NULL);
    a = malloc(1 << 16);
    n1 = fread(a, 1, 1 << 16, f);
    fclose(f);
    f = fopen(tmp_path("m2.json"), "rb");
    ASSERT_TRUE(f != NULL);
    b = malloc(1 << 16);
    n2 = fread(b, 1, 1 << 16, f);
    fclose(f);
    int same = n1 == n2 && memcmp(a, b, n1) == 0;
    a[n1 < (1 << 16) ? n1 : (1 << 16) - 1] = '\0';
    int launch_tracks = 0;
    for (const char *p = a; (p = strstr(p, "\"role\":\"launch\"")) != NULL; p++) launch_tracks++;
    free(a);
    free(b);
    ASSERT_TRUE(same);
    ASSERT_EQ_INT(launch_tracks, 1);
}

MM_TEST(svg_has_a_row_per_worker)
{
    char dir[256];
    snprintf(dir, sizeof dir, "%s", tmp_path("svgranks"));
    ASSERT_OK(write_ranks(dir, 2, 5000));
    const char *in[] = {dir};
    const char *svg = tmp_path("t.svg");
    megamoe_trace_svg_options_t o = {1200, 1};
    ASSERT_OK(megamoe_trace_svg(in, 1, &o, svg));
    FILE *f = fopen(svg, "r");
    ASSERT_TRUE(f != NULL);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    ASSERT_TRUE(strncmp(buf, "<?xml", 5) == 0);
    ASSERT_CONTAINS(buf, "width=\"1200\"");
    ASSERT_CONTAINS(buf, ">rank 0</text>");
    ASSERT_CONTAINS(buf, ">rank 1</text>");
    ASSERT_CONTAINS(buf, ">vector 0</text>");
    ASSERT_CONTAINS(buf, "fill=\"url(#wait)\"");
    ASSERT_CONTAINS(buf, "backward #1");
    ASSERT_TRUE(strstr(buf, "forward #0") == NULL); /* only invocation 1 is shown */
    ASSERT_CONTAINS(buf, "</svg>\n");
}

MM_TEST(public_session_api)
{
    megamoe_profile_params_t p = megamoe_profile_params_default();
    megamoe_profile_t *prof = NULL;
    ASSERT_STATUS(megamoe_profile_create(&p, &prof), MEGAMOE_INVALID_ARGUMENT); /* no stages */
    p.rank = 4;
    p.stage_names = stages;
    p.stage_count = 5;
    p.records_per_worker = 2;
    ASSERT_OK(megamoe_profile_create(&p, &prof));
    ASSERT_EQ_INT(megamoe_profiler_session_count(), 1);
    ASSERT_FALSE(megamoe_profile_is_active(prof)); /* profiler not started */
    ASSERT_OK(megamoe_profiler_start());
    ASSERT_TRUE(megamoe_profile_is_active(prof));
    uint32_t inv = 99;
    ASSERT_OK(megamoe_profile_begin(prof, "forward", &inv));
    ASSERT_EQ_INT(inv, 0);
    uint64_t t0 = megamoe_profile_clock_ns();
    megamoe_profile_record_t r = {t0, t0 + 100, MEGAMOE_PROFILE_COMPUTE, 1, 3, 2, -1, inv};
    ASSERT_OK(megamoe_profile_record(prof, MEGAMOE_PROFILE_VECTOR, 0, &r));
    r.kind = MEGAMOE_PROFILE_WAIT;
    ASSERT_OK(megamoe_profile_record(prof, MEGAMOE_PROFILE_VECTOR, 0, &r));
    ASSERT_OK(megamoe_profile_record(prof, MEGAMOE_PROFILE_VECTOR, 0, &r)); /* dropped */
    ASSERT_STATUS(megamoe_profile_record(prof, MEGAMOE_PROFILE_VECTOR, 1, &r), MEGAMOE_INVALID_ARGUMENT);
    r.stage = 5;
    ASSERT_STATUS(megamoe_profile_record(prof, MEGAMOE_PROFILE_CUBE, 0, &r), MEGAMOE_INVALID_ARGUMENT);
    r.stage = 0;
    r.kind = (megamoe_profile_kind_t)3;
    ASSERT_STATUS(megamoe_profile_record(prof, MEGAMOE_PROFILE_CUBE, 0, &r), MEGAMOE_INVALID_ARGUMENT);
    r.kind = MEGAMOE_PROFILE_SIGNAL;
    r.end_ns = r.start_ns - 1;
    ASSERT_STATUS(megamoe_profile_record(prof, MEGAMOE_PROFILE_CUBE, 0, &r), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_OK(megamoe_profile_end(prof));
    megamoe_profile_summary_t sum;
    ASSERT_OK(megamoe_profile_get_summary(prof, &sum));
    ASSERT_EQ_INT(sum.records, 2);
    ASSERT_EQ_INT(sum.dropped, 1);
    ASSERT_EQ_INT(sum.compute_ns, 100);
    ASSERT_EQ_INT(sum.invocations, 1);
    ASSERT_EQ_INT(sum.sessions, 1);
    ASSERT_OK(megamoe_profile_get_worker_summary(prof, MEGAMOE_PROFILE_VECTOR, 0, &sum));
    ASSERT_EQ_INT(sum.wait_ns, 100);
    const char *file = tmp_path("public/x.json");
    ASSERT_OK(megamoe_profile_export(prof, file));
    ASSERT_OK(megamoe_profile_export_dir(prof, tmp_path("publicdir")));
    ASSERT_OK(megamoe_profiler_export(tmp_path("process.json")));
    ASSERT_OK(megamoe_profiler_export_dir(tmp_path("processdir")));
    ASSERT_TRUE(access(tmp_path("publicdir/trace_4.json"), F_OK) == 0);
    ASSERT_TRUE(access(tmp_path("processdir/trace_4.json"), F_OK) == 0);
    mm_trace_t t;
    mm_trace_init(&t);
    ASSERT_OK(mm_trace_read_file(&t, tmp_path("process.json")));
    ASSERT_EQ_INT(t.n_events, 2);
    ASSERT_EQ_INT(t.ranks[0].rank, 4);
    mm_trace_free(&t);
    megamoe_profile_reset(prof);
    ASSERT_OK(megamoe_profile_get_summary(prof, &sum));
    ASSERT_EQ_INT(sum.records, 0);
    ASSERT_OK(megamoe_profiler_stop());
    megamoe_profile_destroy(prof);
    ASSERT_EQ_INT(megamoe_profiler_session_count(), 0);
    /* No session: an empty trace that says so. */
    ASSERT_OK(megamoe_profiler_export(tmp_path("none.json")));
    mm_trace_init(&t);
    ASSERT_OK(mm_trace_read_file(&t, tmp_path("none.json")));
    ASSERT_EQ_INT(t.n_events, 0);
    ASSERT_EQ_INT(t.n_warnings, 1);
    ASSERT_CONTAINS(mm_trace_str(&t, t.warnings[0]), "no MegaKernel launch was recorded");
    mm_trace_free(&t);
    ASSERT_STATUS(megamoe_profile_begin(NULL, "x", NULL), MEGAMOE_INVALID_ARGUMENT);
    megamoe_profile_destroy(NULL);
}

/* A producer's note (e.g. the replica plan of a launch) travels with its invocation: export,
 * read back, write again (same bytes), and the summary prints it. */
MM_TEST(invocation_notes_travel_with_the_trace)
{
    mm_prof_session_t *s;
    ASSERT_OK(mm_prof_session_create(0, 1, 0, 64, stages, 5, &s));
    mm_prof_note(s, "ignored: no open invocation");
    uint32_t id = mm_prof_begin(s, "forward");
    mm_prof_note(s, "replicas: expert 0 (rank 0) on rank 1 slot 0: 833 rows \"q\"");
    mm_prof_push(mm_prof_ring(s, MM_PROF_CUBE, 0), MM_PROF_COMPUTE, 1, 0, 0, -1, id, 100, 200);
    mm_prof_end(s);
    mm_prof_begin(s, "backward"); /* no note */
    mm_prof_end(s);
    const char *path = tmp_path("notes/trace_0.json");
    ASSERT_OK(mm_prof_export_file((const mm_prof_session_t *const *)&s, 1, path));
    mm_trace_t a;
    mm_trace_init(&a);
    ASSERT_OK(mm_trace_read_file(&a, path));
    ASSERT_EQ_INT(a.n_invs, 2);
    ASSERT_TRUE(a.invs[0].note != MM_TRACE_NO_NOTE);
    ASSERT_EQ_STR(mm_trace_str(&a, a.invs[0].note),
                  "replicas: expert 0 (rank 0) on rank 1 slot 0: 833 rows \"q\"");
    ASSERT_TRUE(a.invs[1].note == MM_TRACE_NO_NOTE);
    char *t1 = NULL, *t2 = NULL;
    size_t n1 = 0, n2 = 0;
    FILE *m = open_memstream(&t1, &n1);
    ASSERT_OK(mm_trace_write(&a, m));
    fclose(m);
    mm_trace_t b;
    mm_trace_init(&b);
    const char *again = tmp_path("notes/again.json");
    ASSERT_OK(mm_trace_write_file(&a, again));
    ASSERT_OK(mm_trace_read_file(&b, again));
    m = open_memstream(&t2, &n2);
    ASSERT_OK(mm_trace_write(&b, m));
    fclose(m);
    ASSERT_EQ_INT(n1, n2);
    ASSERT_TRUE(memcmp(t1, t2, n1) == 0);
    char *sum = NULL;
    size_t ns = 0;
    m = open_memstream(&sum, &ns);
    ASSERT_OK(mm_trace_print_summary(&a, 0, -1, m));
    fclose(m);
    ASSERT_CONTAINS(sum, "forward #0: replicas: expert 0 (rank 0) on rank 1 slot 0: 833 rows");
    free(sum);
    free(t1);
    free(t2);
    mm_trace_free(&a);
    mm_trace_free(&b);
    mm_prof_session_destroy(s);
}
