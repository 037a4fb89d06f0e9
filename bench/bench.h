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

#endif
