/* The list of benchmarks. Add one line per bench_<name>.c. */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "bench_util.h"

/* Each bench file defines one of these. */
extern const mm_bench_def_t mm_bench_convert_def;
extern const mm_bench_def_t mm_bench_shmem_def;
extern const mm_bench_def_t mm_bench_layer_def;
extern const mm_bench_def_t mm_bench_gemm_def;
extern const mm_bench_def_t mm_bench_dispatch_def;
extern const mm_bench_def_t mm_bench_prof_def;
extern const mm_bench_def_t mm_bench_engines_def;
extern const mm_bench_def_t mm_bench_soak_def;
extern const mm_bench_def_t mm_bench_serve_def;
extern const mm_bench_def_t mm_bench_companion_def;

static const mm_bench_def_t *const mm_benches[] = {
    &mm_bench_convert_def,
    &mm_bench_shmem_def,
    &mm_bench_layer_def,
    &mm_bench_gemm_def,
    &mm_bench_dispatch_def,
    &mm_bench_prof_def,
    &mm_bench_engines_def,
    &mm_bench_soak_def,
    &mm_bench_serve_def,
    &mm_bench_companion_def,
};

#define MM_BENCH_COUNT (sizeof mm_benches / sizeof mm_benches[0])

void megamoe_bench_list(FILE *out)
{
    fprintf(out, "benchmarks:\n");
    for (size_t i = 0; i < MM_BENCH_COUNT; i++)
        fprintf(out, "  %-10s %s\n", mm_benches[i]->name, mm_benches[i]->help);
    fprintf(out, "  %-10s run every benchmark above in turn (but engines)\n", "all");
    fprintf(out, "  %-10s plots and tables of all of them on one HTML page: report --out DIR "
                 "[--quick] [--from DIR]\n", "report");
}

int megamoe_bench_run(const char *name, int argc, char **argv)
{
    if (strcmp(name, "all") == 0) {
        int rc = 0;
        for (size_t i = 0; i < MM_BENCH_COUNT; i++) {
            if (mm_benches[i] == &mm_bench_engines_def) { /* a study on simulated hosts */
                fprintf(stderr, "megamoe bench all: not running 'engines' (the engine study on "
                        "simulated hosts, root, minutes): run `megamoe bench engines`\n");
                continue;
            }
            char *sub_argv[] = {(char *)mm_benches[i]->name, NULL};
            int r = mm_benches[i]->main(1, sub_argv);
            if (r != 0) {
                fprintf(stderr, "megamoe bench: '%s' failed (status %d)\n", mm_benches[i]->name, r);
                rc = r;
            }
        }
        return rc;
    }
    if (strcmp(name, "report") == 0) return mm_bench_report_main(argc, argv);
    for (size_t i = 0; i < MM_BENCH_COUNT; i++)
        if (strcmp(name, mm_benches[i]->name) == 0) return mm_benches[i]->main(argc, argv);
    fprintf(stderr, "megamoe bench: unknown benchmark '%s'\n", name);
    megamoe_bench_list(stderr);
    return 2;
}
