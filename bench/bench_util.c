/* Result rows, JSON/table output, progress and median timing for the benchmarks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "megamoe/megamoe.h"

#include "base/clock.h"
#include "base/env.h"
#include "bench_util.h"

#ifndef MEGAMOE_DEFAULT_PYTHON
#define MEGAMOE_DEFAULT_PYTHON "/usr/bin/python3"
#endif

const char *mm_bench_python(void)
{
    const char *py = "";
    if (mm_env_string(MM_ENV_PYTHON, &py) != MEGAMOE_OK || py == NULL || *py == '\0')
        py = MEGAMOE_DEFAULT_PYTHON;
    return py;
}

#define MM_BENCH_MAX_ROWS 4096
#define MM_BENCH_MAX_FIELDS 48

typedef struct mm_bench_field {
    char key[32];
    char text[96]; /* JSON text of the value */
    int quoted;
} mm_bench_field_t;

typedef struct mm_bench_row {
    mm_bench_field_t fields[MM_BENCH_MAX_FIELDS];
    int count;
} mm_bench_row_t;

static char mm_bench_name[64];
static mm_bench_row_t *mm_rows;
static int mm_row_count;
static char mm_top_key[8][32], mm_top_json[8][1024];
static int mm_top_count;

void mm_bench_begin(const char *name)
{
    snprintf(mm_bench_name, sizeof mm_bench_name, "%s", name);
    if (mm_rows == NULL) mm_rows = calloc(MM_BENCH_MAX_ROWS, sizeof *mm_rows);
    mm_row_count = 0;
    mm_top_count = 0;
}

void mm_bench_top(const char *key, const char *json)
{
    if (mm_top_count >= 8) return;
    snprintf(mm_top_key[mm_top_count], sizeof mm_top_key[0], "%s", key);
    snprintf(mm_top_json[mm_top_count], sizeof mm_top_json[0], "%s", json);
    mm_top_count++;
}

void mm_bench_row(void)
{
    if (mm_rows == NULL || mm_row_count >= MM_BENCH_MAX_ROWS) return;
    mm_rows[mm_row_count++].count = 0;
}

static mm_bench_field_t *mm_bench_field(const char *key)
{
    if (mm_row_count == 0) return NULL;
    mm_bench_row_t *row = &mm_rows[mm_row_count - 1];
    if (row->count >= MM_BENCH_MAX_FIELDS) return NULL;
    mm_bench_field_t *f = &row->fields[row->count++];
    snprintf(f->key, sizeof f->key, "%s", key);
    return f;
}

void mm_bench_str(const char *key, const char *value)
{
    mm_bench_field_t *f = mm_bench_field(key);
    if (!f) return;
    size_t o = 0;
    for (const char *p = value; *p && o + 3 < sizeof f->text; p++) {
        if (*p == '"' || *p == '\\') f->text[o++] = '\\';
        f->text[o++] = (unsigned char)*p < 0x20 ? ' ' : *p;
    }
    f->text[o] = '\0';
    f->quoted = 1;
}

void mm_bench_int(const char *key, long long value)
{
    mm_bench_field_t *f = mm_bench_field(key);
    if (f) snprintf(f->text, sizeof f->text, "%lld", value), f->quoted = 0;
}

void mm_bench_num(const char *key, double value)
{
    mm_bench_field_t *f = mm_bench_field(key);
    if (!f) return;
    if (value != value) snprintf(f->text, sizeof f->text, "null");
    else snprintf(f->text, sizeof f->text, "%.6g", value);
    f->quoted = 0;
}

void mm_bench_bool(const char *key, int value)
{
    mm_bench_field_t *f = mm_bench_field(key);
    if (f) snprintf(f->text, sizeof f->text, "%s", value ? "true" : "false"), f->quoted = 0;
}

void mm_bench_end(void)
{
    megamoe_host_info_t host;
    megamoe_host_info(&host);
    printf("{\"bench\": \"%s\", \"version\": \"%s\", \"host\": {\"cores\": %d, \"cpu\": \"%s\", "
           "\"avx512\": %s, \"avx512_bf16\": %s, \"amx\": %s}, ",
           mm_bench_name, megamoe_version(), host.cores, host.cpu, host.avx512 ? "true" : "false",
           host.avx512_bf16 ? "true" : "false", host.amx_usable ? "true" : "false");
    for (int i = 0; i < mm_top_count; i++) printf("\"%s\": %s, ", mm_top_key[i], mm_top_json[i]);
    printf("\"rows\": [");
    for (int r = 0; r < mm_row_count; r++) {
        printf("%s\n  {", r ? "," : "");
        for (int i = 0; i < mm_rows[r].count; i++) {
            const mm_bench_field_t *f = &mm_rows[r].fields[i];
            printf("%s\"%s\": %s%s%s", i ? ", " : "", f->key, f->quoted ? "\"" : "", f->text,
                   f->quoted ? "\"" : "");
        }
        printf("}");
    }
    printf("\n]}\n");
    fflush(stdout);

    /* Table: one column per key, in first-seen order. */
    char keys[64][32];
    int widths[64], nkeys = 0;
    for (int r = 0; r < mm_row_count; r++)
        for (int i = 0; i < mm_rows[r].count; i++) {
            int k = 0;
            while (k < nkeys && strcmp(keys[k], mm_rows[r].fields[i].key) != 0) k++;
            if (k == nkeys && nkeys < 64) {
                snprintf(keys[nkeys], sizeof keys[nkeys], "%s", mm_rows[r].fields[i].key);
                widths[nkeys] = (int)strlen(keys[nkeys]);
                nkeys++;
            }
            if (k < nkeys && (int)strlen(mm_rows[r].fields[i].text) > widths[k])
                widths[k] = (int)strlen(mm_rows[r].fields[i].text);
        }
    fprintf(stderr, "\n== %s ==\n", mm_bench_name);
    for (int k = 0; k < nkeys; k++) fprintf(stderr, "%-*s  ", widths[k], keys[k]);
    fprintf(stderr, "\n");
    for (int r = 0; r < mm_row_count; r++) {
        for (int k = 0; k < nkeys; k++) {
            const char *text = "-";
            for (int i = 0; i < mm_rows[r].count; i++)
                if (strcmp(mm_rows[r].fields[i].key, keys[k]) == 0) text = mm_rows[r].fields[i].text;
            fprintf(stderr, "%-*s  ", widths[k], text);
        }
        fprintf(stderr, "\n");
    }
    fflush(stderr);
}

void mm_bench_progress(int done, int total, const char *label)
{
    if (isatty(STDERR_FILENO)) {
        fprintf(stderr, "\r[%3d/%3d] %-60.60s", done, total, label);
        if (done == total) fprintf(stderr, "\n");
    } else {
        fprintf(stderr, "[%3d/%3d] %s\n", done, total, label);
    }
    fflush(stderr);
}

static int mm_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double mm_bench_median_of(double *values, int n)
{
    if (n <= 0) return 0;
    qsort(values, (size_t)n, sizeof *values, mm_cmp_double);
    return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double mm_bench_median(void (*fn)(void *arg), void *arg, int min_reps, double min_seconds)
{
    enum { MAX_REPS = 100000 };
    static double times[MAX_REPS];
    fn(arg); /* warm-up */
    int n = 0;
    double total = 0;
    while (n < MAX_REPS && (n < min_reps || total < min_seconds)) {
        uint64_t t0 = mm_now_ns();
        fn(arg);
        double dt = (double)(mm_now_ns() - t0) * 1e-9;
        times[n++] = dt;
        total += dt;
    }
    return mm_bench_median_of(times, n);
}

const char *mm_bench_self_exe(void)
{
    static char path[4096];
    if (path[0] == '\0') {
        ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
        if (n <= 0) snprintf(path, sizeof path, "megamoe");
        else path[n] = '\0';
    }
    return path;
}

int mm_bench_script(const char *name, char *out, size_t len)
{
    char dir[3072];
    snprintf(dir, sizeof dir, "%s", mm_bench_self_exe());
    char *slash = strrchr(dir, '/');
    if (slash) { /* the installed layout first: <prefix>/bin/megamoe -> <prefix>/share/... */
        *slash = '\0';
        snprintf(out, len, "%.3000s/../share/megamoe/bench/%s", dir, name);
        if (access(out, R_OK) == 0) return 0;
        *slash = '/';
    }
    for (int up = 0; up < 4; up++) { /* the source tree above the build directory */
        slash = strrchr(dir, '/');
        if (slash == NULL) break;
        *slash = '\0';
        snprintf(out, len, "%.3000s/bench/%s", dir, name);
        if (access(out, R_OK) == 0) return 0;
    }
    snprintf(out, len, "bench/%s", name);
    return access(out, R_OK) == 0 ? 0 : -1;
}

const char *mm_bench_opt(int argc, char **argv, const char *name, const char *def)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return argv[i + 1];
    return def;
}

int mm_bench_flag(int argc, char **argv, const char *name)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], name) == 0) return 1;
    return 0;
}
