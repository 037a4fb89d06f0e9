/* megamoe — command-line tool. Subcommands live in cmd_<name>.c. */
#include <stdio.h>
#include <string.h>

#include "megamoe/megamoe.h"

#include "cli.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} mm_commands[] = {
    {"run", mm_cmd_run, "run the main job: a verified multi-rank MegaMoE forward+backward"},
    {"bench", mm_cmd_bench, "run a benchmark (JSON on stdout, table on stderr); 'bench list'"},
    {"launch", mm_cmd_launch, "start N ranks: launch -n N [--hosts H] [--timeout S] -- CMD ARGS..."},
    {"info", mm_cmd_info, "version, host and configuration (--config [--markdown])"},
    {"trace", mm_cmd_trace, "merge, summarise or draw MegaKernel traces (trace --help)"},
    {"netns-exec", mm_cmd_netns_exec, "run a command in a simulated host of 'launch --hosts'"},
};

static void mm_usage(FILE *out)
{
    fprintf(out, "usage: megamoe <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof mm_commands / sizeof mm_commands[0]; i++)
        fprintf(out, "  %-10s %s\n", mm_commands[i].name, mm_commands[i].help);
    fprintf(out, "\n'megamoe <command> --help' describes a command.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        mm_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("megamoe %s\n", megamoe_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof mm_commands / sizeof mm_commands[0]; i++)
        if (strcmp(argv[1], mm_commands[i].name) == 0) return mm_commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "megamoe: unknown command '%s'\n\n", argv[1]);
    mm_usage(stderr);
    return 2;
}
