/* Subcommands of the megamoe CLI. Each returns the process exit status:
 * 0 success, 1 failure of the work, 2 bad usage or configuration. */
#ifndef MM_TOOLS_CLI_H
#define MM_TOOLS_CLI_H

int mm_cmd_run(int argc, char **argv);
int mm_cmd_bench(int argc, char **argv);
int mm_cmd_launch(int argc, char **argv);
int mm_cmd_info(int argc, char **argv);
int mm_cmd_trace(int argc, char **argv);
int mm_cmd_netns_exec(int argc, char **argv);

/* Validate every environment variable; on a bad one print the error and return 2. */
int mm_cli_check_config(const char *command);

#endif
