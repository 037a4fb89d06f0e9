/* megamoe netns-exec HOST [--] CMD ARGS...
 * megamoe netns-exec --rsh HOST WORDS...
 *
 * Runs CMD inside simulated host HOST of a running `megamoe launch --hosts` job: it joins the
 * host's network, UTS and mount namespaces (found through the host's holder process, whose
 * name is the hostname) and execs CMD, so exit status and signals are CMD's own. --rsh is the
 * form Open MPI's plm_rsh_agent uses (`megamoe launch --mpirun` sets it): like ssh, it joins
 * WORDS with spaces and runs them with /bin/sh -c. Needs root. Exit status 2 when the host is
 * not found or cannot be joined, 127 when CMD cannot run.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "launch_hosts.h"

static void mm_netns_exec_usage(FILE *out)
{
    fprintf(out, "usage: megamoe netns-exec HOST [--] CMD ARGS...\n"
                 "       megamoe netns-exec --rsh HOST WORDS...   (Open MPI's rsh agent)\n"
                 "Runs CMD in simulated host HOST (e.g. mm7-host1) of a running\n"
                 "'megamoe launch --hosts' job: its network, UTS and mount namespaces. Needs root.\n");
}

int mm_cmd_netns_exec(int argc, char **argv)
{
    int i = 1, rsh = 0;
    if (i < argc && (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))) {
        mm_netns_exec_usage(stdout);
        return 0;
    }
    if (i < argc && !strcmp(argv[i], "--rsh")) {
        rsh = 1;
        i++;
        while (i < argc && argv[i][0] == '-') i++; /* ssh-style options an agent may be given */
    }
    if (i >= argc) {
        mm_netns_exec_usage(stderr);
        return 2;
    }
    const char *host = argv[i++];
    if (!rsh && i < argc && !strcmp(argv[i], "--")) i++;
    if (i >= argc) {
        mm_netns_exec_usage(stderr);
        return 2;
    }
    pid_t holder = mm_sim_host_find(host);
    if (holder < 0) {
        fprintf(stderr, "megamoe netns-exec: no simulated host named '%s' is running (the hosts of "
                        "a running 'megamoe launch --hosts' job are named mm<S>-host<h>)\n", host);
        return 2;
    }
    char cwd[4096], err[256];
    if (getcwd(cwd, sizeof cwd) == NULL) snprintf(cwd, sizeof cwd, "/");
    if (mm_sim_host_enter_pid(holder, host, cwd, err, sizeof err) != 0) {
        fprintf(stderr, "megamoe netns-exec: %s: %s\n", host, err);
        return 2;
    }
    if (rsh) {
        size_t len = 1;
        for (int k = i; k < argc; k++) len += strlen(argv[k]) + 1;
        char *line = malloc(len);
        if (line == NULL) return 2;
        line[0] = '\0';
        for (int k = i; k < argc; k++) {
            if (k > i) strcat(line, " ");
            strcat(line, argv[k]);
        }
        execl("/bin/sh", "sh", "-c", line, (char *)NULL);
        fprintf(stderr, "megamoe netns-exec: cannot run /bin/sh: %s\n", strerror(errno));
        return 127;
    }
    execvp(argv[i], argv + i);
    fprintf(stderr, "megamoe netns-exec: cannot run '%s': %s\n", argv[i], strerror(errno));
    return 127;
}
