/* Benchmarks as a library behind `megamoe bench` (UCX libperf style).
 *
 * Every benchmark prints ONE JSON object on stdout:
 *   {"bench": "<name>", "host": {"cores": n, "cpu": "...", "amx": bool, ...},
 *    "rows": [{case fields..., "impl": "...", metrics...}, ...]}
 * and a readable table plus a progress indicator on stderr. Timings are medians over repeats
 * after a warm-up; every comparison a bench makes runs in the same invocation.
 */
#ifndef MM_BENCH_H
#define MM_BENCH_H

#include <stdio.h>

/* Run benchmark `name` ("all" runs every one); argv[0] is the name. Returns an exit status. */
int megamoe_bench_run(const char *name, int argc, char **argv);
/* List the registered benchmarks with one line of help each. */
void megamoe_bench_list(FILE *out);
/* `megamoe bench report` (bench_report.c): runs the benchmarks and sweeps, writes an HTML page
 * with plots. Not a row-printing benchmark, so not part of "all". argv[0] = "report". */
int mm_bench_report_main(int argc, char **argv);

#endif
