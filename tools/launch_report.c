/* `megamoe launch`: fault specifications and the end-of-job summary (launch_report.h). */
#include "launch_report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

int mm_launch_parse_fault(const char *text, mm_launch_fault_t *f)
{
    memset(f, 0, sizeof *f);
    snprintf(f->spec, sizeof f->spec, "%s", text);
    const char *rest = NULL;
    if (strncmp(text, "kill-host:", 10) == 0) {
        f->kind = MM_FAULT_KILL_HOST;
        rest = text + 10;
    } else if (strncmp(text, "cut-host:", 9) == 0) {
        f->kind = MM_FAULT_CUT_HOST;
        rest = text + 9;
    } else if (strncmp(text, "kill-rank:", 10) == 0) {
        f->kind = MM_FAULT_KILL_RANK;
        rest = text + 10;
    }
    char *end = NULL;
    long host = rest ? strtol(rest, &end, 10) : -1;
    double at = -1;
    if (rest && end != rest && *end == '@') {
        const char *t = end + 1;
        at = strtod(t, &end);
        if (end == t || *end || !isfinite(at)) at = -1;
    }
    const long max = f->kind == MM_FAULT_KILL_RANK ? MM_LAUNCH_MAX_PROCS : MM_SIM_HOSTS_MAX;
    if (!rest || host < 0 || host >= max || at < 0) {
        fprintf(stderr, "megamoe launch: --fault '%s': expected kill-host:I@S, cut-host:I@S or "
                        "kill-rank:R@S (host index I or rank R, S seconds after the start, e.g. "
                        "kill-host:1@2.5)\n", text);
        return -1;
    }
    f->host = (int)host;
    f->at_s = at;
    return 0;
}

void mm_launch_describe_status(int status, char *out, size_t len)
{
    if (WIFEXITED(status))
        snprintf(out, len, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, len, "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(out, len, "stopped (status 0x%x)", status);
}

static int mm_survivors_exited(const mm_launch_proc_t *p, int n)
{
    for (int i = 0; i < n; i++)
        if (!p[i].victim && (!p[i].exited || p[i].stopped)) return 0;
    return 1;
}

static const char *mm_host_name(const mm_sim_hosts_t *hosts, int h)
{
    return hosts && h >= 0 && h < hosts->n ? hosts->host[h].name : "local";
}

static void mm_proc_label(const mm_launch_proc_t *p, const mm_launch_outcome_t *o, char *out,
                          size_t len)
{
    if (p->rank >= 0) snprintf(out, len, "rank %d", p->rank);
    else if (strcmp(o->mode, "mpirun") == 0) snprintf(out, len, "mpirun");
    else snprintf(out, len, "host %d launcher", p->host);
}

void mm_launch_summary(FILE *to, const mm_launch_proc_t *procs, int n,
                       const mm_launch_fault_t *faults, int n_faults, const mm_sim_hosts_t *hosts,
                       const mm_launch_outcome_t *o)
{
    for (int i = 0; i < n; i++) {
        const mm_launch_proc_t *p = &procs[i];
        char label[32], what[128];
        mm_proc_label(p, o, label, sizeof label);
        if (!p->exited) snprintf(what, sizeof what, "still running");
        else mm_launch_describe_status(p->status, what, sizeof what);
        fprintf(to, "megamoe launch: summary: %s @%s (host %d): %s after %.2f s%s%s", label,
                mm_host_name(hosts, p->host), p->host, what, p->exit_s,
                p->victim ? " [killed by the fault]"
                : p->stopped ? (o->timed_out ? " [stopped at the timeout]" : " [stopped by the launcher]")
                             : "",
                p->last_err[0] ? ": " : "");
        if (p->last_err[0]) fprintf(to, "\"%s\"", p->last_err);
        fprintf(to, "\n");
    }
    for (int i = 0; i < n_faults; i++) {
        const mm_launch_fault_t *f = &faults[i];
        if (f->injected)
            fprintf(to, "megamoe launch: summary: fault %s injected at %.2f s\n", f->spec,
                    f->injected_s);
        else
            fprintf(to, "megamoe launch: summary: fault %s was NOT injected (the job had ended)\n",
                    f->spec);
    }
    if (hosts && hosts->shm_leftovers[0])
        fprintf(to, "megamoe launch: summary: left in /dev/shm: %s\n", hosts->shm_leftovers);
    if (o->timed_out)
        fprintf(to, "megamoe launch: summary: survivors still running at the timeout (%.0f s) "
                    "were stopped; exit status %d\n", o->timeout_s, o->exit_status);
    else if (o->interrupted)
        fprintf(to, "megamoe launch: summary: interrupted; exit status %d\n", o->exit_status);
    else
        fprintf(to, "megamoe launch: summary: %s within %.2f s; exit status %d\n",
                mm_survivors_exited(procs, n) ? "every survivor exited by itself"
                                              : "not every survivor exited by itself",
                o->elapsed_s, o->exit_status);
}

static void mm_json_str(FILE *to, const char *s)
{
    fputc('"', to);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(to, "\\%c", c);
        else if (c < 0x20) fprintf(to, "\\u%04x", c);
        else fputc(c, to);
    }
    fputc('"', to);
}

void mm_launch_json(FILE *to, const mm_launch_proc_t *procs, int n,
                    const mm_launch_fault_t *faults, int n_faults, const mm_sim_hosts_t *hosts,
                    const mm_launch_outcome_t *o)
{
    fprintf(to, "{\"launch\": \"summary\", \"mode\": \"%s\", \"hosts\": %d, \"timeout_s\": %g, "
                "\"elapsed_s\": %.3f, \"timed_out\": %s, \"interrupted\": %s, ",
            o->mode, o->hosts > 0 ? o->hosts : 1, o->timeout_s, o->elapsed_s,
            o->timed_out ? "true" : "false", o->interrupted ? "true" : "false");
    if (hosts && hosts->n > 0) {
        fprintf(to, "\"subnet\": \"%s\", \"bridge\": \"%s\", ", hosts->subnet, hosts->bridge);
    }
    fprintf(to, "\"faults\": [");
    for (int i = 0; i < n_faults; i++) {
        const mm_launch_fault_t *f = &faults[i];
        fprintf(to, "%s{\"spec\": ", i ? ", " : "");
        mm_json_str(to, f->spec);
        if (f->kind == MM_FAULT_KILL_RANK)
            fprintf(to, ", \"kind\": \"kill-rank\", \"rank\": %d, \"at_s\": %g, \"injected\": %s",
                    f->host, f->at_s, f->injected ? "true" : "false");
        else
            fprintf(to, ", \"kind\": \"%s\", \"host\": %d, \"at_s\": %g, \"injected\": %s",
                    f->kind == MM_FAULT_KILL_HOST ? "kill-host" : "cut-host", f->host, f->at_s,
                    f->injected ? "true" : "false");
        if (f->injected) fprintf(to, ", \"injected_at_s\": %.3f", f->injected_s);
        if (f->kind != MM_FAULT_CUT_HOST) fprintf(to, ", \"processes_killed\": %d", f->processes);
        fprintf(to, "}");
    }
    fprintf(to, "], \"procs\": [");
    for (int i = 0; i < n; i++) {
        const mm_launch_proc_t *p = &procs[i];
        fprintf(to, "%s{", i ? ", " : "");
        if (p->rank >= 0) fprintf(to, "\"rank\": %d, ", p->rank);
        else fprintf(to, "\"rank\": null, ");
        fprintf(to, "\"host\": %d, \"hostname\": ", p->host);
        mm_json_str(to, mm_host_name(hosts, p->host));
        if (hosts && p->host >= 0 && p->host < hosts->n)
            fprintf(to, ", \"ip\": \"%s\"", hosts->host[p->host].ip);
        fprintf(to, ", \"exited\": %s", p->exited ? "true" : "false");
        if (p->exited && WIFEXITED(p->status))
            fprintf(to, ", \"exit_status\": %d, \"signal\": null", WEXITSTATUS(p->status));
        else if (p->exited && WIFSIGNALED(p->status))
            fprintf(to, ", \"exit_status\": null, \"signal\": %d", WTERMSIG(p->status));
        else
            fprintf(to, ", \"exit_status\": null, \"signal\": null");
        fprintf(to, ", \"elapsed_s\": %.3f, \"victim\": %s, \"stopped\": %s, \"last_stderr\": ",
                p->exit_s, p->victim ? "true" : "false", p->stopped ? "true" : "false");
        mm_json_str(to, p->last_err);
        fprintf(to, "}");
    }
    fprintf(to, "], \"survivors_exited\": %s, \"shm_leftovers\": [",
            mm_survivors_exited(procs, n) && !o->timed_out ? "true" : "false");
    if (hosts && hosts->shm_leftovers[0]) {
        char copy[sizeof hosts->shm_leftovers];
        snprintf(copy, sizeof copy, "%s", hosts->shm_leftovers);
        int k = 0;
        for (char *t = strtok(copy, " "); t; t = strtok(NULL, " ")) {
            fprintf(to, "%s", k++ ? ", " : "");
            mm_json_str(to, t);
        }
    }
    fprintf(to, "], \"cleanup_ok\": %s, \"exit_status\": %d}\n",
            hosts && hosts->cleanup_failed ? "false" : "true", o->exit_status);
    fflush(to);
}
