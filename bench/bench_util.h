/* Shared pieces of the benchmarks: result rows (JSON on stdout, table on stderr), progress,
 * median timing. Single-threaded use (one bench at a time per process). */
#ifndef MM_BENCH_UTIL_H
#define MM_BENCH_UTIL_H

#include <stddef.h>
#include <stdint.h>

typedef struct mm_bench_def {
    const char *name;
    const char *help;
    int (*main)(int argc, char **argv); /* argv[0] = name; returns an exit status */
} mm_bench_def_t;

/* Start a report for bench `name` (resets the row store). */
void mm_bench_begin(const char *name);
/* Add a row; then set its fields in order. Keys are copied. */
void mm_bench_row(void);
void mm_bench_str(const char *key, const char *value);
void mm_bench_int(const char *key, long long value);
void mm_bench_num(const char *key, double value);
void mm_bench_bool(const char *key, int value);
/* A top-level member of the JSON object besides "rows" (e.g. "probes"): key and its JSON text,
 * copied; printed in the order given. At most 8 per report. */
void mm_bench_top(const char *key, const char *json);
/* Print the JSON object (stdout) and the table (stderr). */
void mm_bench_end(void);

/* "[ 3/12] label" on stderr (carriage return on a terminal, a line otherwise). */
void mm_bench_progress(int done, int total, const char *label);

/* Time fn(arg): one warm-up call, then repeats until at least min_reps calls and min_seconds
 * of total time; returns the median seconds per call. */
double mm_bench_median(void (*fn)(void *arg), void *arg, int min_reps, double min_seconds);

/* Median of an array (sorted in place). */
double mm_bench_median_of(double *values, int n);

/* Path of the running megamoe executable (for benches that start their own ranks). */
const char *mm_bench_self_exe(void);

/* Find a script shipped with the benchmarks (torch_moe_layer.py, report.py, ...): installed
 * beside the CLI's data (<prefix>/share/megamoe/bench/<name>, from <prefix>/bin/megamoe), in
 * the source tree (<repo>/bench/<name>, from <repo>/build/<preset>/bin/megamoe), else
 * ./bench/<name>. Returns 0 with the path in out, -1 when none is readable. */
int mm_bench_script(const char *name, char *out, size_t len);
/* The Python interpreter for the benchmarks' Python parts: $MEGAMOE_PYTHON, else the build's
 * choice (CMake MEGAMOE_PYTHON, default /usr/bin/python3). */
const char *mm_bench_python(void);

/* Option parsing helpers: "--name value" lookups in argv; return the default when absent. */
const char *mm_bench_opt(int argc, char **argv, const char *name, const char *def);
int mm_bench_flag(int argc, char **argv, const char *name);

#endif
