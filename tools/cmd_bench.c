/* megamoe bench <name>|all|list [options] — the benchmarks live in bench/ (a library). */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "cli.h"

int mm_cmd_bench(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "list") == 0) {
        printf("usage: megamoe bench <name>|all [options]   ('megamoe bench <name> --help')\n\n");
        megamoe_bench_list(stdout);
        return argc < 2 ? 2 : 0;
    }
    int rc = mm_cli_check_config("bench");
    if (rc) return rc;
    return megamoe_bench_run(argv[1], argc - 1, argv + 1);
}
