/* megamoe run: placeholder until MegaMoeExperts exists; shows the host. */
#include <stdio.h>

#include "cli.h"

int mm_cmd_run(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "megamoe run: the MegaMoE layer is not built yet; showing 'megamoe info'\n");
    char *info_argv[] = {"info", NULL};
    return mm_cmd_info(1, info_argv);
}
