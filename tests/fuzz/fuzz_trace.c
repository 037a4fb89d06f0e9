/* Fuzz target: the trace reader behind `megamoe trace merge|summary|svg` — the JSON parser
 * (src/profile/json.c), the trace model reader (trace_read.c) and what runs on what it
 * accepts: the summary (table and JSON), the SVG timeline and the merged-trace writer.
 *
 * The input is one to three trace files separated by the byte 0x1e (so merges of several
 * files, with colliding ranks and groups, are explored). Properties beyond "no crash, no UB":
 *   - every refusal has a message naming the file;
 *   - what megamoe writes, megamoe reads: the merged trace of an accepted input parses again
 *     and writing it once more gives the same bytes (merge is idempotent);
 *   - the JSON reader's accessors stay within what they promise (mm_json_int in range).
 */
#include <sys/mman.h>
#include <unistd.h>

#include "megamoe/status.h"

#include "fuzz.h"
#include "profile/json.h"
#include "profile/trace.h"

#define MM_FZ_MAX_FILES 3

/* A memfd holding bytes, opened again by path (/proc/self/fd/N) like a file on disk. */
static int mm_fz_memfd(const void *data, size_t len, char *path, size_t path_len)
{
    int fd = memfd_create("megamoe-fuzz-trace", MFD_CLOEXEC);
    FUZZ_CHECK(fd >= 0, "memfd_create failed");
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        FUZZ_CHECK(w > 0, "write to a memfd failed");
        p += w;
        len -= (size_t)w;
    }
    snprintf(path, path_len, "/proc/self/fd/%d", fd);
    return fd;
}

static void mm_fz_walk(const mm_json_value_t *v, int depth)
{
    FUZZ_CHECK(depth <= MM_JSON_MAX_DEPTH + 1, "depth %d beyond the limit", depth);
    int64_t i64;
    double d;
    switch (v->type) {
    case MM_JSON_NUMBER:
        if (mm_json_int(v, -1000, 1000, &i64)) FUZZ_CHECK(i64 >= -1000 && i64 <= 1000, "range");
        for (int dec = 0; dec <= 9; dec += 3) (void)mm_json_scaled(v, dec, &i64);
        (void)mm_json_double(v, &d);
        break;
    case MM_JSON_STRING:
        FUZZ_CHECK(strlen(v->u.str) == v->len, "a string holds a NUL");
        break;
    case MM_JSON_ARRAY:
        for (uint32_t i = 0; i < v->len; i++) mm_fz_walk(&v->u.items[i], depth + 1);
        break;
    case MM_JSON_OBJECT:
        for (uint32_t i = 0; i < v->len; i++) {
            FUZZ_CHECK(strlen(v->u.members[i].key) == v->u.members[i].key_len, "key");
            FUZZ_CHECK(mm_json_get(v, v->u.members[i].key) != NULL, "member lookup");
            mm_fz_walk(&v->u.members[i].value, depth + 1);
        }
        break;
    default:
        break;
    }
}

/* The merged trace as written by megamoe (into a memfd); returns its fd, path in path. */
static int mm_fz_write_model(const mm_trace_t *t, char *path, size_t path_len, char **bytes,
                             size_t *len)
{
    int fd = mm_fz_memfd("", 0, path, path_len);
    FILE *f = fdopen(dup(fd), "w");
    FUZZ_CHECK(f != NULL, "fdopen");
    FUZZ_CHECK(mm_trace_write(t, f) == MEGAMOE_OK, "writing an accepted trace failed: %s",
               megamoe_last_error());
    FUZZ_CHECK(fclose(f) == 0, "fclose");
    off_t end = lseek(fd, 0, SEEK_END);
    *len = (size_t)end;
    *bytes = malloc(*len + 1);
    FUZZ_CHECK(*bytes != NULL && pread(fd, *bytes, *len, 0) == (ssize_t)*len, "read back");
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *devnull;
    if (devnull == NULL) devnull = fopen("/dev/null", "w");
    /* split into files */
    size_t start[MM_FZ_MAX_FILES], len[MM_FZ_MAX_FILES];
    int n = 0;
    size_t s = 0;
    for (size_t i = 0; i <= size && n < MM_FZ_MAX_FILES; i++) {
        if (i == size || (data[i] == 0x1e && n < MM_FZ_MAX_FILES - 1)) {
            start[n] = s;
            len[n++] = i - s;
            s = i + 1;
        }
    }
    /* the JSON reader alone, on the first file */
    mm_json_doc_t *doc = NULL;
    if (mm_json_parse((const char *)data + start[0], len[0], "fuzz.json", &doc) == MEGAMOE_OK) {
        mm_fz_walk(mm_json_root(doc), 0);
        mm_json_free(doc);
    } else {
        FUZZ_CHECK(strstr(megamoe_last_error(), "fuzz.json") != NULL, "JSON error without the "
                   "source: %s", megamoe_last_error());
    }
    /* the trace reader on all files, as `megamoe trace` reads them */
    int fds[MM_FZ_MAX_FILES];
    char paths[MM_FZ_MAX_FILES][64];
    const char *inputs[MM_FZ_MAX_FILES];
    for (int i = 0; i < n; i++) {
        fds[i] = mm_fz_memfd(data + start[i], len[i], paths[i], sizeof paths[i]);
        inputs[i] = paths[i];
    }
    mm_trace_t t;
    mm_trace_init(&t);
    megamoe_status_t st = mm_trace_read_inputs(&t, inputs, (size_t)n);
    if (st != MEGAMOE_OK) {
        FUZZ_CHECK(strstr(megamoe_last_error(), "/proc/self/fd/") != NULL, "a refused trace "
                   "without the file's name: %s", megamoe_last_error());
    } else {
        int64_t inv = t.n_invs ? (int64_t)t.invs[0].index : t.n_events ? t.events[0].invocation : 0;
        FUZZ_CHECK(mm_trace_print_summary(&t, 0, -1, devnull) == MEGAMOE_OK, "summary: %s",
                   megamoe_last_error());
        FUZZ_CHECK(mm_trace_print_summary(&t, 1, inv, devnull) == MEGAMOE_OK, "summary --json: %s",
                   megamoe_last_error());
        FUZZ_CHECK(mm_trace_render_svg(&t, 400 + (int)(size % 1000), -1, devnull) == MEGAMOE_OK,
                   "svg: %s", megamoe_last_error());
        FUZZ_CHECK(mm_trace_render_svg(&t, 1600, inv, devnull) == MEGAMOE_OK, "svg --invocation: %s",
                   megamoe_last_error());
        /* merge, read the merged file back, merge again: the same bytes */
        char p1[64], p2[64], *b1 = NULL, *b2 = NULL;
        size_t l1 = 0, l2 = 0;
        int f1 = mm_fz_write_model(&t, p1, sizeof p1, &b1, &l1);
        mm_trace_t t2;
        mm_trace_init(&t2);
        const char *again[1] = {p1};
        FUZZ_CHECK(mm_trace_read_inputs(&t2, again, 1) == MEGAMOE_OK,
                   "megamoe cannot read the trace it merged: %s", megamoe_last_error());
        int f2 = mm_fz_write_model(&t2, p2, sizeof p2, &b2, &l2);
        if (getenv("MM_FUZZ_VERBOSE") && (l1 != l2 || memcmp(b1, b2, l1) != 0)) {
            mm_fz_save("/tmp", "mm_fuzz_merge1.json", b1, l1);
            mm_fz_save("/tmp", "mm_fuzz_merge2.json", b2, l2);
        }
        FUZZ_CHECK(l1 == l2 && memcmp(b1, b2, l1) == 0, "merging a merged trace changed it "
                   "(%zu -> %zu bytes)", l1, l2);
        mm_trace_free(&t2);
        free(b1);
        free(b2);
        close(f1);
        close(f2);
    }
    mm_trace_free(&t);
    for (int i = 0; i < n; i++) close(fds[i]);
    return 0;
}

/* ---- seeds: real traces in the shape trace_write.c produces, and pieces of them ---- */

static const char mm_seed_trace[] =
    "{\"traceEvents\":[\n"
    " {\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"rank 0\"}},\n"
    " {\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"launch\","
    "\"role\":\"launch\",\"worker\":-1,\"group\":0}},\n"
    " {\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":1,\"args\":{\"name\":\"cube 0\","
    "\"role\":\"cube\",\"worker\":0,\"group\":0}},\n"
    " {\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":2,\"args\":{\"name\":\"vector 0\","
    "\"role\":\"vector\",\"worker\":0,\"group\":0}},\n"
    " {\"name\":\"forward #0\",\"cat\":\"MegaKernelLaunch\",\"ph\":\"X\",\"pid\":0,\"tid\":0,"
    "\"ts\":100.000,\"dur\":50.500,\"args\":{\"invocation\":0,\"direction\":\"forward\"}},\n"
    " {\"name\":\"dispatch:compute\",\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":2,"
    "\"ts\":100.100,\"dur\":10.000,\"args\":{\"stage\":\"dispatch\",\"kind\":\"compute\","
    "\"task\":0,\"owner\":0,\"peer\":1,\"invocation\":0,\"direction\":\"forward\"}},\n"
    " {\"name\":\"gmm1:wait\",\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":1,"
    "\"ts\":100.200,\"dur\":12.000,\"args\":{\"stage\":\"gmm1\",\"kind\":\"wait\",\"task\":1,"
    "\"owner\":0,\"peer\":-1,\"invocation\":0,\"direction\":\"forward\"}},\n"
    " {\"name\":\"gmm1:compute\",\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":1,"
    "\"ts\":112.300,\"dur\":30.000,\"args\":{\"stage\":\"gmm1\",\"kind\":\"compute\",\"task\":1,"
    "\"owner\":0,\"peer\":-1,\"invocation\":0,\"direction\":\"forward\"}},\n"
    " {\"name\":\"reduce:signal\",\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":2,"
    "\"ts\":145.000,\"dur\":0.001,\"args\":{\"stage\":\"reduce\",\"kind\":\"signal\",\"task\":2,"
    "\"owner\":1,\"peer\":1,\"invocation\":0,\"direction\":\"forward\"}},\n"
    " {\"name\":\"other\",\"cat\":\"user\",\"ph\":\"i\",\"pid\":0,\"tid\":5,\"ts\":1}\n"
    "],\n"
    "\"displayTimeUnit\":\"ns\",\n"
    "\"megaKernelTrace\":{\"schemaVersion\":1,\"rank\":0,\"host\":\"vm\",\"invocationCount\":1,"
    "\"recordCount\":4,\"droppedRecordCount\":0,\"warnings\":[\"a warning \\u00e9\\ud83d\\ude00\"],"
    "\"ranks\":[{\"rank\":0,\"host\":\"vm\",\"invocationCount\":1,\"recordCount\":4,"
    "\"droppedRecordCount\":0}],\"invocations\":[{\"rank\":0,\"group\":0,\"invocation\":0,"
    "\"direction\":\"forward\",\"ts\":100.000,\"dur\":50.500,\"ended\":true}]}}\n";

int mm_fuzz_write_seeds(const char *dir)
{
    int rc = 0, count = 0;
    size_t n = strlen(mm_seed_trace);
    rc |= mm_fz_save(dir, "trace_rank0", mm_seed_trace, n), count++;
    /* the same trace as rank 1 of another host, merged with rank 0 */
    char *two = malloc(2 * n + 2);
    if (two == NULL) return -1;
    memcpy(two, mm_seed_trace, n);
    two[n] = 0x1e;
    memcpy(two + n + 1, mm_seed_trace, n);
    rc |= mm_fz_save(dir, "two_files_same_rank", two, 2 * n + 1), count++;
    free(two);
    static const char *const bits[] = {
        "{\"traceEvents\":[],\"megaKernelTrace\":{\"schemaVersion\":1}}",
        "{\"traceEvents\":[],\"megaKernelTrace\":{\"schemaVersion\":2}}",
        ("{\"traceEvents\":[{\"cat\":\"MegaKernel\",\"ph\":\"X\",\"pid\":0,\"tid\":1,"
         "\"ts\":9223372036854775.807,\"dur\":9223372036854775.807,\"args\":{\"stage\":\"s\","
         "\"kind\":\"wait\"}}],\"megaKernelTrace\":{\"schemaVersion\":1,\"rank\":0}}"),
        ("{\"traceEvents\":[],\"megaKernelTrace\":{\"schemaVersion\":1,\"invocations\":[{\"rank\":0,"
         "\"invocation\":1,\"ts\":-5,\"dur\":1e3,\"ended\":false}]}}"),
        "[1, -0.5e-3, 1E+2, \"\\u0041\\n\", true, false, null, {\"a\":{\"b\":[]}}]",
        "{\"a\":\"\\ud800\"}",
    };
    for (size_t i = 0; i < sizeof bits / sizeof *bits; i++) {
        char name[32];
        snprintf(name, sizeof name, "piece_%zu", i);
        rc |= mm_fz_save(dir, name, bits[i], strlen(bits[i]));
        count++;
    }
    return rc ? -1 : count;
}
