/* megamoe trace: placeholder until the profiling layer exists. */
#include <stdio.h>

#include "cli.h"

int mm_cmd_trace(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "megamoe trace: not available yet (comes with the profiling layer)\n");
    return 2;
}
