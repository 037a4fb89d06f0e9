/* `megamoe launch`: the processes it supervises, the faults it injects, and the end-of-job
 * summary (text lines on stderr, one JSON line on stdout with --json). */
#ifndef MM_TOOLS_LAUNCH_REPORT_H
#define MM_TOOLS_LAUNCH_REPORT_H

#include <stdio.h>
#include <sys/types.h>

#include "launch_hosts.h"

#define MM_LAUNCH_MAX_PROCS 256
#define MM_LAUNCH_MAX_FAULTS 16
/* Output is forwarded line by line with a prefix; a line up to this long stays one line (a
 * benchmark's one-line JSON result), a longer one is cut into pieces of this size. */
#define MM_LAUNCH_BUF 65536

/* One supervised process: a rank, a per-host launcher (--per-host) or mpirun (--mpirun). */
typedef struct mm_launch_proc {
    pid_t pid;
    int out_fd, err_fd; /* read ends, -1 when closed */
    int exited, status;
    int rank;    /* -1 in --per-host and --mpirun mode */
    int host;    /* -1 without --hosts */
    int victim;  /* killed by a kill-host or kill-rank fault */
    int stopped; /* signalled by the launcher (a failure elsewhere, the timeout, an interrupt) */
    double exit_s; /* seconds after the start when it was reaped */
    char prefix[48];   /* "[rank 2 @mm7-host1] " */
    char last_err[256]; /* its last non-empty stderr line */
    char out_buf[MM_LAUNCH_BUF], err_buf[MM_LAUNCH_BUF];
    size_t out_len, err_len;
} mm_launch_proc_t;

typedef enum { MM_FAULT_KILL_HOST, MM_FAULT_CUT_HOST, MM_FAULT_KILL_RANK } mm_fault_kind_t;

typedef struct mm_launch_fault {
    mm_fault_kind_t kind;
    int host; /* kill-host, cut-host: the host; kill-rank: the rank */
    double at_s;
    char spec[48]; /* as given: kill-host:1@2.5 */
    int injected;
    double injected_s;
    int processes; /* kill-host: processes signalled */
} mm_launch_fault_t;

/* Parse "kill-host:I@S", "cut-host:I@S" or "kill-rank:R@S"; 0, or -1 with a message printed. */
int mm_launch_parse_fault(const char *text, mm_launch_fault_t *f);

typedef struct mm_launch_outcome {
    const char *mode; /* "ranks", "per-host", "mpirun" */
    int hosts;        /* 0 without --hosts */
    double timeout_s, elapsed_s;
    int timed_out, interrupted;
    int exit_status;
} mm_launch_outcome_t;

/* "megamoe launch: summary: ..." lines on `to`, one per process, then the verdict. */
void mm_launch_summary(FILE *to, const mm_launch_proc_t *procs, int n,
                       const mm_launch_fault_t *faults, int n_faults, const mm_sim_hosts_t *hosts,
                       const mm_launch_outcome_t *o);
/* One JSON object on one line. */
void mm_launch_json(FILE *to, const mm_launch_proc_t *procs, int n,
                    const mm_launch_fault_t *faults, int n_faults, const mm_sim_hosts_t *hosts,
                    const mm_launch_outcome_t *o);

/* "exited with status 3" / "was killed by signal 9 (Killed)". */
void mm_launch_describe_status(int status, char *out, size_t len);

#endif
