/* megamoe info [--config [--markdown]] */
#include <stdio.h>
#include <string.h>

#include "megamoe/megamoe.h"

#include "cli.h"

int mm_cli_check_config(const char *command)
{
    megamoe_status_t st = megamoe_config_validate();
    if (st != MEGAMOE_OK) {
        fprintf(stderr, "megamoe %s: %s\n", command, megamoe_last_error());
        return 2;
    }
    return 0;
}

int mm_cmd_info(int argc, char **argv)
{
    int config = 0, markdown = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0) config = 1;
        else if (strcmp(argv[i], "--markdown") == 0) markdown = 1;
        else if (strcmp(argv[i], "--help") == 0) {
            printf("usage: megamoe info [--config [--markdown]]\n"
                   "  --config    list every environment variable with value, default, help\n"
                   "  --markdown  print the table as markdown (docs/env.md)\n");
            return 0;
        } else {
            fprintf(stderr, "megamoe info: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (markdown && !config) {
        fprintf(stderr, "megamoe info: --markdown needs --config\n");
        return 2;
    }
    if (config && markdown) return megamoe_config_print(stdout, 1) == MEGAMOE_OK ? 0 : 1;
    int rc = mm_cli_check_config("info");
    if (rc) return rc;
    if (config) return megamoe_config_print(stdout, 0) == MEGAMOE_OK ? 0 : 1;

    megamoe_host_info_t host;
    megamoe_host_info(&host);
    printf("megamoe %s (ABI %d)\n", megamoe_version(), megamoe_abi_version());
    printf("cpu: %s, %d cores\n", host.cpu, host.cores);
    printf("isa: avx512 %s, avx512_bf16 %s, amx_bf16 %s%s\n", host.avx512 ? "yes" : "no",
           host.avx512_bf16 ? "yes" : "no", host.amx_bf16 ? "yes" : "no",
           host.amx_bf16 ? (host.amx_usable ? " (permission granted)" : " (permission refused)")
                         : "");
    printf("log level: %s\n", megamoe_log_level_name(megamoe_log_get_level()));
    printf("run 'megamoe info --config' for every environment variable\n");
    return 0;
}
