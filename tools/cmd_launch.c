/* megamoe launch [-n N] [--hosts H [--per-host | --mpirun]] [--fault F]... [--timeout S]
 *                [--json] [--] CMD ARGS...
 *
 * Starts N ranks of CMD with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MEGAMOE_JOB_TOKEN,
 * HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT and MASTER_ADDR/MASTER_PORT (for torch.distributed);
 * a token or endpoint the user set is kept. Output lines are prefixed "[rank N] ". When a rank
 * fails (non-zero exit or signal) or the timeout passes, the other ranks get SIGTERM, then
 * SIGKILL after a grace period, and the launcher exits non-zero with a line naming the rank and
 * the cause. Each rank runs in its own process group (so its children are stopped too) and dies
 * with the launcher (PR_SET_PDEATHSIG).
 *
 * --hosts H places the ranks in blocks on H simulated hosts (launch_hosts.h) and adds
 * NODE_RANK, GROUP_RANK and NNODES; --per-host starts CMD once per host instead (for launchers
 * that start their own ranks, e.g. torchrun), --mpirun runs Open MPI's mpirun across the hosts.
 * --fault kill-host:I@S / cut-host:I@S inject host failures; with a fault the launcher does not
 * stop the survivors but waits for each to exit by itself and prints a summary
 * (launch_report.h). docs/multinode.md "Simulated hosts and fault injection" is the manual.
 *
 * Exit status: 0 when every rank exited 0; the failing rank's exit status (128+signal when it
 * was killed); 124 on timeout; 2 on bad usage (or --hosts without root). With --fault: 0 when
 * every fault was injected and every survivor exited by itself (any status) before the timeout.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "free_port.h"
#include "launch_hosts.h"
#include "launch_report.h"

#define MM_LAUNCH_GRACE_S 2.0
#define MM_LAUNCH_MAX_MPI_ARGS 32
/* Ports inside the simulated hosts: each job's namespaces are fresh, so the usual defaults
 * (torch's 29500, megamoe's 8662) are always free there. */
#define MM_HOSTS_MASTER_PORT 29500
#define MM_HOSTS_BOOT_PORT 8662

typedef struct mm_launch_cfg {
    int n, hosts, per_host, mpirun, json;
    double timeout;
    mm_launch_fault_t faults[MM_LAUNCH_MAX_FAULTS];
    int n_faults;
    char *mpi_args[MM_LAUNCH_MAX_MPI_ARGS];
    int n_mpi_args;
    char **cmd;
    int cmd_argc;
} mm_launch_cfg_t;

/* Variables one process gets (also the values of the {NAME} placeholders). */
typedef struct mm_env_list {
    int n;
    const char *key[24];
    char val[24][160];
} mm_env_list_t;

static volatile sig_atomic_t mm_launch_interrupted;
static mm_sim_hosts_t mm_launch_hosts; /* torn down on every way out (also atexit) */

static void mm_launch_on_signal(int sig) { mm_launch_interrupted = sig; }

static void mm_launch_atexit(void) { mm_sim_hosts_destroy(&mm_launch_hosts); }

static double mm_launch_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void mm_random_token(char *out, size_t hex_len)
{
    unsigned char raw[64];
    size_t n = hex_len / 2;
    if (n > sizeof raw) n = sizeof raw;
    if (getrandom(raw, n, 0) != (ssize_t)n) {
        /* getrandom cannot fail for small sizes after boot; fall back to time+pid mixing. */
        unsigned long long x = (unsigned long long)mm_launch_now() * 1000003ull ^ (unsigned long long)getpid();
        for (size_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            raw[i] = (unsigned char)(x >> 56);
        }
    }
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", raw[i]);
    out[2 * n] = '\0';
}

static void mm_env_add(mm_env_list_t *e, const char *key, const char *fmt, ...)
{
    if (e->n >= 24) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->val[e->n], sizeof e->val[0], fmt, ap);
    va_end(ap);
    e->key[e->n++] = key;
}

static const char *mm_env_get(const mm_env_list_t *e, const char *key)
{
    for (int i = 0; i < e->n; i++)
        if (strcmp(e->key[i], key) == 0) return e->val[i];
    return NULL;
}

/* ---- output ------------------------------------------------------------------------------- */

static void mm_note_err_line(mm_launch_proc_t *p, const char *line, size_t len)
{
    while (len && (line[len - 1] == '\r' || line[len - 1] == ' ')) len--;
    if (len == 0) return;
    if (len >= sizeof p->last_err) len = sizeof p->last_err - 1;
    memcpy(p->last_err, line, len);
    p->last_err[len] = '\0';
}

/* Write complete lines of buf with the process's prefix; keep a partial tail unless flush. */
static void mm_emit_lines(FILE *to, mm_launch_proc_t *p, int is_err, char *buf, size_t *len,
                          int flush)
{
    size_t start = 0;
    for (size_t i = 0; i < *len; i++) {
        if (buf[i] == '\n') {
            fprintf(to, "%s%.*s\n", p->prefix, (int)(i - start), buf + start);
            if (is_err) mm_note_err_line(p, buf + start, i - start);
            start = i + 1;
        }
    }
    if ((flush && start < *len) || (start == 0 && *len == MM_LAUNCH_BUF)) {
        /* the tail at the end, or a single over-long line: emit it as is */
        fprintf(to, "%s%.*s\n", p->prefix, (int)(*len - start), buf + start);
        if (is_err) mm_note_err_line(p, buf + start, *len - start);
        start = *len;
    }
    memmove(buf, buf + start, *len - start);
    *len -= start;
    fflush(to);
}

static void mm_drain(mm_launch_proc_t *p, int which, int flush)
{
    int *fd = which ? &p->err_fd : &p->out_fd;
    char *buf = which ? p->err_buf : p->out_buf;
    size_t *len = which ? &p->err_len : &p->out_len;
    FILE *to = which ? stderr : stdout;
    if (*fd < 0) return;
    for (;;) {
        ssize_t n = read(*fd, buf + *len, MM_LAUNCH_BUF - *len);
        if (n > 0) {
            *len += (size_t)n;
            mm_emit_lines(to, p, which, buf, len, 0);
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            close(*fd);
            *fd = -1;
            mm_emit_lines(to, p, which, buf, len, 1);
        } else if (flush) {
            mm_emit_lines(to, p, which, buf, len, 1);
        }
        return;
    }
}

static void mm_pump_output(mm_launch_proc_t *procs, int n, int timeout_ms)
{
    struct pollfd pfd[2 * MM_LAUNCH_MAX_PROCS];
    int map[2 * MM_LAUNCH_MAX_PROCS];
    int k = 0;
    for (int r = 0; r < n; r++) {
        if (procs[r].out_fd >= 0) {
            pfd[k] = (struct pollfd){procs[r].out_fd, POLLIN, 0};
            map[k++] = 2 * r;
        }
        if (procs[r].err_fd >= 0) {
            pfd[k] = (struct pollfd){procs[r].err_fd, POLLIN, 0};
            map[k++] = 2 * r + 1;
        }
    }
    if (k == 0) {
        usleep((useconds_t)timeout_ms * 1000);
        return;
    }
    int rc = poll(pfd, (nfds_t)k, timeout_ms);
    if (rc <= 0) return;
    for (int i = 0; i < k; i++)
        if (pfd[i].revents) mm_drain(&procs[map[i] / 2], map[i] % 2, 0);
}

/* ---- processes ---------------------------------------------------------------------------- */

static void mm_signal_all(mm_launch_proc_t *procs, int n, int sig, int mark_stopped)
{
    for (int r = 0; r < n; r++)
        if (!procs[r].exited && procs[r].pid > 0) {
            kill(-procs[r].pid, sig);
            if (mark_stopped && !procs[r].victim) procs[r].stopped = 1;
        }
}

static void mm_reap(mm_launch_proc_t *procs, int n, double start)
{
    for (int r = 0; r < n; r++) {
        if (procs[r].exited || procs[r].pid <= 0) continue;
        int st;
        pid_t w = waitpid(procs[r].pid, &st, WNOHANG);
        if (w == procs[r].pid) {
            procs[r].exited = 1;
            procs[r].status = st;
            procs[r].exit_s = mm_launch_now() - start;
        }
    }
}

static int mm_all_exited(const mm_launch_proc_t *procs, int n)
{
    for (int r = 0; r < n; r++)
        if (!procs[r].exited) return 0;
    return 1;
}

static void mm_free_argv(char **a, int argc)
{
    if (a == NULL) return;
    for (int i = 0; i < argc; i++) free(a[i]);
    free(a);
}

/* argv with the {NAME} placeholders replaced (only with --hosts; see the usage text). */
static char **mm_expand_argv(char **cmd, int argc, const mm_env_list_t *env, const char *hostname,
                             const char *host_ip)
{
    static const char *const names[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                        "NODE_RANK", "NNODES", "MASTER_ADDR", "MASTER_PORT",
                                        "HOSTNAME", "HOST_IP"};
    char **out = calloc((size_t)argc + 1, sizeof *out);
    if (out == NULL) return NULL;
    for (int i = 0; i < argc; i++) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);
        if (f == NULL) {
            mm_free_argv(out, i);
            return NULL;
        }
        for (const char *s = cmd[i]; *s;) {
            const char *val = NULL;
            size_t klen = 0;
            if (*s == '{') {
                for (size_t k = 0; k < sizeof names / sizeof names[0] && !val; k++) {
                    size_t l = strlen(names[k]);
                    if (strncmp(s + 1, names[k], l) == 0 && s[1 + l] == '}') {
                        val = !strcmp(names[k], "HOSTNAME") ? hostname
                              : !strcmp(names[k], "HOST_IP") ? host_ip
                                                               : mm_env_get(env, names[k]);
                        klen = l + 2;
                    }
                }
            }
            if (val) {
                fputs(val, f);
                s += klen;
            } else {
                fputc(*s++, f);
            }
        }
        if (fclose(f) != 0 || buf == NULL) {
            free(buf);
            mm_free_argv(out, i);
            return NULL;
        }
        out[i] = buf;
    }
    return out;
}

/* Fork one process: own process group, dies with the launcher, output into pipes, env set,
 * inside its simulated host when p->host >= 0. 0 or -1 (message printed). */
static int mm_spawn(mm_launch_proc_t *p, char *const *argv, const mm_env_list_t *env,
                    const mm_sim_hosts_t *hosts, const char *cwd)
{
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) {
        fprintf(stderr, "megamoe launch: pipe: %s\n", strerror(errno));
        return -1;
    }
    if (pipe2(err, O_CLOEXEC) != 0) {
        fprintf(stderr, "megamoe launch: pipe: %s\n", strerror(errno));
        close(out[0]);
        close(out[1]);
        return -1;
    }
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "megamoe launch: fork: %s\n", strerror(errno));
        close(out[0]);
        close(out[1]);
        close(err[0]);
        close(err[1]);
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127); /* the launcher died before prctl */
        dup2(out[1], STDOUT_FILENO);
        dup2(err[1], STDERR_FILENO);
        for (int i = 0; i < env->n; i++) setenv(env->key[i], env->val[i], 1);
        if (hosts && p->host >= 0 && mm_sim_host_enter(hosts, p->host, cwd) != 0) {
            fprintf(stderr, "megamoe launch: cannot enter simulated host %s: %s\n",
                    hosts->host[p->host].name, strerror(errno));
            _exit(127);
        }
        signal(SIGPIPE, SIG_DFL);
        execvp(argv[0], argv);
        fprintf(stderr, "megamoe launch: cannot run '%s': %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid);
    close(out[1]);
    close(err[1]);
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    p->pid = pid;
    p->out_fd = out[0];
    p->err_fd = err[0];
    return 0;
}

/* ---- usage and options -------------------------------------------------------------------- */

static void mm_launch_usage(FILE *out)
{
    fprintf(out,
            "usage: megamoe launch -n N [--hosts H] [--timeout S] [--] CMD ARGS...\n"
            "       megamoe launch --hosts H --per-host [--timeout S] [--] CMD ARGS...\n"
            "       megamoe launch --hosts H --mpirun -n N [--mpi-arg ARG]... [--] PROG ARGS...\n"
            "  -n N            number of ranks (1..%d)\n"
            "  --timeout S     stop every rank after S seconds (exit 124); 0 = no limit\n"
            "  --hosts H       place the ranks on H simulated hosts (needs root): a network, UTS\n"
            "                  and mount namespace each, hostname mm<S>-host<h> (also mmhost<h>),\n"
            "                  address 10.x.y.<h+1> on a private bridge; ranks in blocks of N/H\n"
            "  --per-host      start CMD once per host (torchrun --nnodes H style launchers)\n"
            "  --mpirun        run 'mpirun -np N --host <hosts>' from host 0, ranks in blocks\n"
            "  --mpi-arg ARG   one more mpirun argument (repeatable), e.g. --mpi-arg --bind-to\n"
            "  --fault F       kill-rank:R@S (SIGKILL rank R and its children at S seconds),\n"
            "                  kill-host:I@S (SIGKILL every process of host I) or cut-host:I@S\n"
            "                  (host I's link down; the host faults need --hosts); repeatable;\n"
            "                  needs --timeout; survivors are not stopped, a summary is printed;\n"
            "                  the ranks get MEGAMOE_LAUNCH_T0_NS (CLOCK_MONOTONIC at the start)\n"
            "                  and MEGAMOE_LAUNCH_FAULTS (the specs)\n"
            "  --json          print a JSON summary line on stdout at the end\n"
            "Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MEGAMOE_JOB_TOKEN,\n"
            "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT, MASTER_ADDR and MASTER_PORT (a token or\n"
            "endpoint already set is kept); with --hosts also NODE_RANK, GROUP_RANK and NNODES,\n"
            "and MASTER_ADDR / the endpoint name host 0's address. With --hosts, the strings\n"
            "{RANK} {LOCAL_RANK} {WORLD_SIZE} {LOCAL_WORLD_SIZE} {NODE_RANK} {NNODES}\n"
            "{MASTER_ADDR} {MASTER_PORT} {HOSTNAME} {HOST_IP} in CMD's arguments are replaced.\n"
            "Exit status: 0 when every rank exited 0 (with --fault: every fault injected and\n"
            "every survivor exited by itself); else the first failing rank's status (128+signal),\n"
            "124 on timeout, 2 on bad usage or --hosts without root.\n"
            "docs/multinode.md \"Simulated hosts and fault injection\" has the details.\n",
            MM_LAUNCH_MAX_PROCS);
}

static int mm_parse_count(const char *opt, const char *text, int max, int *out)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (*text == '\0' || *end || v < 1 || v > max) {
        fprintf(stderr, "megamoe launch: %s must be an integer in [1, %d]\n", opt, max);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* Faults that need simulated hosts (kill-host, cut-host). */
static int mm_host_faults(const mm_launch_cfg_t *c)
{
    int n = 0;
    for (int f = 0; f < c->n_faults; f++) n += c->faults[f].kind != MM_FAULT_KILL_RANK;
    return n;
}

/* 0 parsed, 1 --help printed, 2 bad usage (message printed). */
static int mm_launch_parse(int argc, char **argv, mm_launch_cfg_t *c)
{
    memset(c, 0, sizeof *c);
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        } else if (strcmp(a, "-n") == 0 && has) {
            if (mm_parse_count("-n", argv[++i], MM_LAUNCH_MAX_PROCS, &c->n)) return 2;
        } else if (strcmp(a, "--hosts") == 0 && has) {
            if (mm_parse_count("--hosts", argv[++i], MM_SIM_HOSTS_MAX, &c->hosts)) return 2;
        } else if (strcmp(a, "--timeout") == 0 && has) {
            char *end;
            const char *text = argv[++i];
            c->timeout = strtod(text, &end);
            if (*end || end == text || !isfinite(c->timeout) || c->timeout < 0) {
                fprintf(stderr, "megamoe launch: --timeout must be a finite number of seconds "
                                ">= 0 (0 = no limit), got '%s'\n",
                        text);
                return 2;
            }
        } else if (strcmp(a, "--fault") == 0 && has) {
            if (c->n_faults == MM_LAUNCH_MAX_FAULTS) {
                fprintf(stderr, "megamoe launch: at most %d --fault options\n", MM_LAUNCH_MAX_FAULTS);
                return 2;
            }
            if (mm_launch_parse_fault(argv[++i], &c->faults[c->n_faults++])) return 2;
        } else if (strcmp(a, "--mpi-arg") == 0 && has) {
            if (c->n_mpi_args == MM_LAUNCH_MAX_MPI_ARGS) {
                fprintf(stderr, "megamoe launch: at most %d --mpi-arg options\n", MM_LAUNCH_MAX_MPI_ARGS);
                return 2;
            }
            c->mpi_args[c->n_mpi_args++] = argv[++i];
        } else if (strcmp(a, "--per-host") == 0) {
            c->per_host = 1;
        } else if (strcmp(a, "--mpirun") == 0) {
            c->mpirun = 1;
        } else if (strcmp(a, "--json") == 0) {
            c->json = 1;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            mm_launch_usage(stdout);
            return 1;
        } else if (a[0] == '-') {
            fprintf(stderr, "megamoe launch: unknown option '%s'%s\n", a,
                    has ? "" : " (or an option without its value)");
            mm_launch_usage(stderr);
            return 2;
        } else {
            break;
        }
    }
    c->cmd = argv + i;
    c->cmd_argc = argc - i;
    const char *bad = NULL;
    char msg[200];
    if (c->cmd_argc <= 0) bad = "no command given";
    else if ((c->per_host || c->mpirun || mm_host_faults(c)) && c->hosts == 0)
        bad = mm_host_faults(c) ? "--fault kill-host / cut-host needs --hosts"
              : c->per_host     ? "--per-host needs --hosts"
                                : "--mpirun needs --hosts";
    else if (c->n_faults > mm_host_faults(c) && (c->per_host || c->mpirun))
        bad = "--fault kill-rank needs the launcher's own ranks (not --per-host or --mpirun)";
    else if (c->per_host && c->mpirun) bad = "--per-host and --mpirun exclude each other";
    else if (c->per_host && c->n)
        bad = "--per-host starts one process per host; give the ranks per host to the command "
              "(e.g. torchrun --nproc_per_node), not -n";
    else if (!c->per_host && c->n == 0) bad = "-n N is required";
    else if (c->n_mpi_args && !c->mpirun) bad = "--mpi-arg needs --mpirun";
    else if (c->n_faults && c->timeout <= 0)
        bad = "--fault needs --timeout S (the launcher waits up to S seconds for the survivors)";
    else if (c->hosts && !c->per_host && (c->n < c->hosts || c->n % c->hosts)) {
        snprintf(msg, sizeof msg, "-n %d must be a multiple of --hosts %d (ranks go in blocks of "
                                  "N/H per host)", c->n, c->hosts);
        bad = msg;
    }
    for (int f = 0; !bad && f < c->n_faults; f++)
        if (c->faults[f].kind == MM_FAULT_KILL_RANK && c->faults[f].host >= c->n) {
            snprintf(msg, sizeof msg, "--fault %s names rank %d, but there are %d ranks (0..%d)",
                     c->faults[f].spec, c->faults[f].host, c->n, c->n - 1);
            bad = msg;
        } else if (c->faults[f].kind != MM_FAULT_KILL_RANK && c->faults[f].host >= c->hosts) {
            snprintf(msg, sizeof msg, "--fault %s names host %d, but there are %d hosts (0..%d)",
                     c->faults[f].spec, c->faults[f].host, c->hosts, c->hosts - 1);
            bad = msg;
        }
    if (bad) {
        fprintf(stderr, "megamoe launch: %s\n", bad);
        if (c->cmd_argc <= 0 || c->n == 0) mm_launch_usage(stderr);
        return 2;
    }
    return 0;
}

/* With --hosts, a user-set endpoint must name host 0 (where rank 0 listens). 0 or 2. */
static int mm_check_user_endpoint(const char *ep, const mm_sim_hosts_t *s)
{
    const mm_sim_host_t *h0 = &s->host[0];
    char host[256] = "";
    const char *p = strncmp(ep, "tcp://", 6) == 0 ? ep + 6 : NULL;
    const char *colon = p ? strrchr(p, ':') : NULL;
    if (p && colon && colon > p && (size_t)(colon - p) < sizeof host) {
        memcpy(host, p, (size_t)(colon - p));
        host[colon - p] = '\0';
    }
    int ok = host[0] && (!strcmp(host, h0->ip) || !strcmp(host, h0->name) || !strcmp(host, h0->alias));
    if (!ok && s->n == 1) /* one host: every rank shares its loopback */
        ok = !strcmp(host, "127.0.0.1") || !strcmp(host, "localhost");
    if (ok) return 0;
    fprintf(stderr, "megamoe launch: HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT=%s does not name host "
                    "0 of the simulated hosts, where rank 0 listens: use tcp://%s:PORT (or "
                    "tcp://%s:PORT, tcp://%s:PORT), or unset it and the launcher uses tcp://%s:%d\n",
            ep, h0->alias, h0->name, h0->ip, h0->ip, MM_HOSTS_BOOT_PORT);
    return 2;
}

/* ---- faults ------------------------------------------------------------------------------- */

/* Where the injection times go (MEGAMOE_LAUNCH_FAULT_LOG: "spec ns" lines, CLOCK_MONOTONIC),
 * so a rank measures from the real injection even when the launcher ran late. */
static char mm_fault_log[64];

static void mm_fault_logged(const mm_launch_fault_t *f)
{
    if (!mm_fault_log[0]) return;
    FILE *fp = fopen(mm_fault_log, "a");
    if (fp == NULL) return;
    fprintf(fp, "%s %.0f\n", f->spec, mm_launch_now() * 1e9);
    fclose(fp);
}

static void mm_inject_due(mm_launch_cfg_t *c, mm_launch_proc_t *procs, int n, double t)
{
    for (int i = 0; i < c->n_faults; i++) {
        mm_launch_fault_t *f = &c->faults[i];
        if (f->injected || t < f->at_s || mm_all_exited(procs, n)) continue;
        f->injected_s = t;
        if (f->kind == MM_FAULT_KILL_RANK) {
            mm_launch_proc_t *p = &procs[f->host];
            f->injected = 1;
            f->processes = 0;
            if (!p->exited) { /* the rank and its children (its own process group) */
                kill(-p->pid, SIGKILL);
                p->victim = 1;
                f->processes = 1;
            }
            mm_fault_logged(f);
            fprintf(stderr, "megamoe launch: fault %s: SIGKILL to rank %d%s at %.3f s\n", f->spec,
                    f->host, p->exited ? " (already exited)" : "", t);
            continue;
        }
        mm_sim_host_t *h = &mm_launch_hosts.host[f->host];
        if (f->kind == MM_FAULT_KILL_HOST) {
            /* everything in the host's namespace (ranks and their children), then the ranks'
             * process groups in case one was between fork and joining the host */
            f->processes = mm_sim_host_kill(&mm_launch_hosts, f->host);
            for (int r = 0; r < n; r++)
                if (procs[r].host == f->host && !procs[r].exited) {
                    kill(-procs[r].pid, SIGKILL);
                    procs[r].victim = 1;
                }
            f->injected = 1;
            mm_fault_logged(f);
            fprintf(stderr, "megamoe launch: fault %s: SIGKILL to %d process(es) of %s at %.2f s\n",
                    f->spec, f->processes, h->name, t);
        } else if (mm_sim_host_cut(&mm_launch_hosts, f->host) == 0) {
            f->injected = 1;
            mm_fault_logged(f);
            fprintf(stderr, "megamoe launch: fault %s: link %s of %s (%s) set down at %.2f s\n",
                    f->spec, h->veth, h->name, h->ip, t);
        } else {
            f->at_s = INFINITY; /* do not retry every poll */
            fprintf(stderr, "megamoe launch: fault %s: could not set link %s down\n", f->spec, h->veth);
        }
    }
}

/* ---- the launcher ------------------------------------------------------------------------- */

static const char *mm_self_exe(char *buf, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", buf, len - 1);
    if (n <= 0) return "megamoe";
    buf[n] = '\0';
    return buf;
}

int mm_cmd_launch(int argc, char **argv)
{
    static mm_launch_cfg_t c;
    int rc = mm_launch_parse(argc, argv, &c);
    if (rc) return rc == 1 ? 0 : rc;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = mm_launch_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* a token or endpoint the user set is kept (issue 21); otherwise the launcher makes them */
    char endpoint[256], token[256], master_addr[64], master_port[16];
    const char *user_ep = getenv("HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT");
    const char *user_tok = getenv("MEGAMOE_JOB_TOKEN");
    if (user_tok && *user_tok) snprintf(token, sizeof token, "%s", user_tok);
    else mm_random_token(token, 64);
    mm_sim_hosts_t *hosts = NULL;
    if (c.hosts) {
        static int registered;
        if (!registered && atexit(mm_launch_atexit) == 0) registered = 1;
        rc = mm_sim_hosts_create(&mm_launch_hosts, c.hosts, &mm_launch_interrupted);
        if (rc == -1) {
            fprintf(stderr, "megamoe launch: interrupted (signal %d) while creating the hosts\n",
                    (int)mm_launch_interrupted);
            return 128 + (int)mm_launch_interrupted;
        }
        if (rc) return rc;
        hosts = &mm_launch_hosts;
        if (user_ep && *user_ep && mm_check_user_endpoint(user_ep, hosts)) {
            mm_sim_hosts_destroy(hosts);
            return 2;
        }
        snprintf(master_addr, sizeof master_addr, "%.15s", hosts->host[0].ip);
        snprintf(master_port, sizeof master_port, "%d", MM_HOSTS_MASTER_PORT);
        if (user_ep && *user_ep) snprintf(endpoint, sizeof endpoint, "%s", user_ep);
        else snprintf(endpoint, sizeof endpoint, "tcp://%.15s:%d", hosts->host[0].ip, MM_HOSTS_BOOT_PORT);
    } else {
        int port = user_ep && *user_ep ? 0 : mm_free_loopback_port(), mport = mm_free_loopback_port();
        for (int i = 0; i < 8 && mport == port && mport > 0; i++) mport = mm_free_loopback_port();
        if (port < 0 || mport < 0) {
            fprintf(stderr, "megamoe launch: cannot find a free loopback port: %s\n", strerror(errno));
            return 1;
        }
        snprintf(master_addr, sizeof master_addr, "127.0.0.1");
        snprintf(master_port, sizeof master_port, "%d", mport);
        if (user_ep && *user_ep) snprintf(endpoint, sizeof endpoint, "%s", user_ep);
        else snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", port);
    }

    char cwd[4096];
    if (getcwd(cwd, sizeof cwd) == NULL) snprintf(cwd, sizeof cwd, "/");
    char self[4096];
    mm_self_exe(self, sizeof self);
    const char *mode = c.mpirun ? "mpirun" : c.per_host ? "per-host" : "ranks";
    int n = c.mpirun ? 1 : c.per_host ? c.hosts : c.n;
    int per = c.hosts && !c.per_host ? c.n / c.hosts : 1;

    static mm_launch_proc_t procs[MM_LAUNCH_MAX_PROCS];
    memset(procs, 0, sizeof procs);
    int started = 0, spawn_failed = 0;
    /* the faults' clock starts here; the ranks get it (and the faults) to measure from it */
    const double t0 = mm_launch_now();
    if (c.n_faults) { /* the injection times, for the ranks (removed at the end) */
        snprintf(mm_fault_log, sizeof mm_fault_log, "/tmp/megamoe-faults-XXXXXX");
        int fd = mkstemp(mm_fault_log);
        if (fd >= 0) close(fd);
        else mm_fault_log[0] = '\0';
    }
    char fault_list[160] = "";
    for (int f = 0; f < c.n_faults; f++)
        snprintf(fault_list + strlen(fault_list), sizeof fault_list - strlen(fault_list), "%s%s",
                 f ? "," : "", c.faults[f].spec);
    for (int r = 0; r < n && !spawn_failed && !mm_launch_interrupted; r++) {
        mm_launch_proc_t *p = &procs[r];
        mm_env_list_t env;
        memset(&env, 0, sizeof env);
        p->out_fd = p->err_fd = -1;
        p->rank = c.per_host || c.mpirun ? -1 : r;
        p->host = !hosts ? -1 : c.per_host ? r : c.mpirun ? 0 : r / per;
        const char *hname = hosts ? hosts->host[p->host].name : "";
        if (!hosts) snprintf(p->prefix, sizeof p->prefix, "[rank %d] ", r);
        else if (c.mpirun) snprintf(p->prefix, sizeof p->prefix, "[mpirun @%s] ", hname);
        else if (c.per_host) snprintf(p->prefix, sizeof p->prefix, "[host %d @%s] ", r, hname);
        else snprintf(p->prefix, sizeof p->prefix, "[rank %d @%s] ", r, hname);
        if (p->rank >= 0) {
            mm_env_add(&env, "RANK", "%d", r);
            mm_env_add(&env, "LOCAL_RANK", "%d", hosts ? r % per : r);
            mm_env_add(&env, "WORLD_SIZE", "%d", c.n);
            mm_env_add(&env, "LOCAL_WORLD_SIZE", "%d", hosts ? per : c.n);
        }
        if (hosts && !c.mpirun) {
            mm_env_add(&env, "NODE_RANK", "%d", p->host);
            mm_env_add(&env, "GROUP_RANK", "%d", p->host);
        }
        if (hosts) mm_env_add(&env, "NNODES", "%d", c.hosts);
        mm_env_add(&env, "MEGAMOE_JOB_TOKEN", "%s", token);
        mm_env_add(&env, "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT", "%s", endpoint);
        mm_env_add(&env, "MASTER_ADDR", "%s", master_addr);
        mm_env_add(&env, "MASTER_PORT", "%s", master_port);
        mm_env_add(&env, "MEGAMOE_LAUNCH_T0_NS", "%.0f", t0 * 1e9);
        if (c.n_faults) mm_env_add(&env, "MEGAMOE_LAUNCH_FAULTS", "%s", fault_list);
        if (mm_fault_log[0]) mm_env_add(&env, "MEGAMOE_LAUNCH_FAULT_LOG", "%s", mm_fault_log);

        char **args = NULL;
        int nargs = c.cmd_argc;
        if (c.mpirun) {
            /* mpirun in host 0; its rsh agent enters the other hosts (megamoe netns-exec) */
            static char np[16], hostlist[MM_SIM_HOSTS_MAX * 24], agent[4200];
            snprintf(np, sizeof np, "%d", c.n);
            size_t hl = 0;
            for (int h = 0; h < c.hosts; h++)
                hl += (size_t)snprintf(hostlist + hl, sizeof hostlist - hl, "%s%s:%d", h ? "," : "",
                                       hosts->host[h].name, per);
            snprintf(agent, sizeof agent, "%s netns-exec --rsh", self);
            char *pre[] = {"mpirun", "--allow-run-as-root", "-np", np, "--host", hostlist,
                           "--mca", "plm_rsh_agent", agent, "--mca", "plm_rsh_no_tree_spawn", "1",
                           "--mca", "oob_tcp_if_include", "eth0", "--mca", "btl_tcp_if_include",
                           "eth0", "-x", "MEGAMOE_JOB_TOKEN", "-x",
                           "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT", "-x", "MASTER_ADDR", "-x",
                           "MASTER_PORT", "-x", "NNODES"};
            int npre = (int)(sizeof pre / sizeof pre[0]);
            nargs = npre + c.n_mpi_args + c.cmd_argc;
            char **joined = calloc((size_t)nargs + 1, sizeof *joined);
            if (joined) {
                memcpy(joined, pre, sizeof pre);
                memcpy(joined + npre, c.mpi_args, (size_t)c.n_mpi_args * sizeof *joined);
                memcpy(joined + npre + c.n_mpi_args, c.cmd, (size_t)c.cmd_argc * sizeof *joined);
                args = mm_expand_argv(joined, nargs, &env, hname, hosts->host[0].ip);
                free(joined);
            }
        } else if (hosts) {
            args = mm_expand_argv(c.cmd, nargs, &env, hname, hosts->host[p->host].ip);
        }
        if (hosts && args == NULL) {
            fprintf(stderr, "megamoe launch: out of memory\n");
            spawn_failed = 1;
            break;
        }
        if (mm_spawn(p, args ? args : c.cmd, &env, hosts, cwd) != 0) spawn_failed = 1;
        else started++;
        mm_free_argv(args, nargs);
    }
    n = started;

    double start = t0, stop_at = 0;
    int failed_rank = -1, timed_out = 0, killed_hard = 0;
    char why[160] = "";
    if (spawn_failed || mm_launch_interrupted) { /* stop what was started */
        mm_signal_all(procs, n, SIGKILL, 1);
        stop_at = start;
        killed_hard = 1;
        if (mm_launch_interrupted) timed_out = -1;
    }
    const int fault_mode = c.n_faults > 0;
    while (!mm_all_exited(procs, n)) {
        /* wake for the next fault on time (a 50 ms poll would shift it by up to 50 ms) */
        int wait_ms = 50;
        for (int f = 0; f < c.n_faults && stop_at == 0; f++) {
            double due = (c.faults[f].at_s - (mm_launch_now() - start)) * 1e3;
            if (!c.faults[f].injected && due < wait_ms) wait_ms = due < 0 ? 0 : (int)due;
        }
        mm_pump_output(procs, n, wait_ms);
        mm_reap(procs, n, start);
        double t = mm_launch_now() - start;
        if (stop_at == 0 && fault_mode) mm_inject_due(&c, procs, n, t);
        if (stop_at == 0) {
            for (int r = 0; !fault_mode && r < n; r++) {
                if (procs[r].exited &&
                    !(WIFEXITED(procs[r].status) && WEXITSTATUS(procs[r].status) == 0)) {
                    failed_rank = r;
                    mm_launch_describe_status(procs[r].status, why, sizeof why);
                    break;
                }
            }
            if (failed_rank < 0 && c.timeout > 0 && t > c.timeout) timed_out = 1;
            if (failed_rank < 0 && !timed_out && mm_launch_interrupted) timed_out = -1;
            if ((failed_rank >= 0 || timed_out) && !mm_all_exited(procs, n)) {
                if (failed_rank >= 0)
                    fprintf(stderr, "megamoe launch: %.*s %s; stopping the others\n",
                            (int)strlen(procs[failed_rank].prefix) - 3, procs[failed_rank].prefix + 1,
                            why);
                else if (timed_out > 0)
                    fprintf(stderr, "megamoe launch: timeout after %.0f s; stopping all ranks\n",
                            c.timeout);
                else
                    fprintf(stderr, "megamoe launch: interrupted (signal %d); stopping all ranks\n",
                            (int)mm_launch_interrupted);
                mm_signal_all(procs, n, SIGTERM, 1);
                stop_at = mm_launch_now();
            }
        }
        if (stop_at > 0 && !killed_hard && mm_launch_now() - stop_at > MM_LAUNCH_GRACE_S) {
            mm_signal_all(procs, n, SIGKILL, 1);
            killed_hard = 1;
        }
    }
    double elapsed = mm_launch_now() - start;
    if (mm_fault_log[0]) unlink(mm_fault_log);
    /* Ranks are gone; collect what is left in the pipes (descendants that kept them open
     * belong to the rank's process group and were signalled with it). */
    for (int r = 0; r < n; r++) {
        kill(-procs[r].pid, SIGKILL); /* leftover children of a rank that exited */
        mm_drain(&procs[r], 0, 1);
        mm_drain(&procs[r], 1, 1);
        if (procs[r].out_fd >= 0) close(procs[r].out_fd);
        if (procs[r].err_fd >= 0) close(procs[r].err_fd);
    }
    if (hosts) {
        mm_sim_hosts_destroy(hosts);
        if (hosts->shm_leftovers[0])
            fprintf(stderr, "megamoe launch: left in the hosts' private /dev/shm (removed with "
                            "them): %s\n", hosts->shm_leftovers);
    }

    if (!fault_mode && failed_rank < 0 && !timed_out) {
        for (int r = 0; r < n; r++) {
            if (!(WIFEXITED(procs[r].status) && WEXITSTATUS(procs[r].status) == 0)) {
                failed_rank = r;
                mm_launch_describe_status(procs[r].status, why, sizeof why);
                break;
            }
        }
    }
    int status = 0;
    if (spawn_failed) status = 1;
    else if (timed_out > 0) status = 124;
    else if (timed_out < 0) status = 128 + (int)mm_launch_interrupted;
    else if (fault_mode) {
        for (int f = 0; f < c.n_faults; f++)
            if (!c.faults[f].injected) {
                fprintf(stderr, "megamoe launch: fault %s was not injected: every process had "
                                "ended at %.2f s\n", c.faults[f].spec, elapsed);
                status = 1;
            }
    } else if (failed_rank >= 0) {
        if (!killed_hard && stop_at == 0)
            fprintf(stderr, "megamoe launch: %.*s %s\n", (int)strlen(procs[failed_rank].prefix) - 3,
                    procs[failed_rank].prefix + 1, why);
        int st = procs[failed_rank].status;
        status = WIFEXITED(st) ? (WEXITSTATUS(st) ? WEXITSTATUS(st) : 1)
                 : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 1;
    }
    if (status == 0 && hosts && hosts->cleanup_failed) status = 1;
    mm_launch_outcome_t o = {mode, c.hosts, c.timeout, elapsed, timed_out > 0, timed_out < 0, status};
    if (fault_mode) mm_launch_summary(stderr, procs, n, c.faults, c.n_faults, hosts, &o);
    if (c.json) mm_launch_json(stdout, procs, n, c.faults, c.n_faults, hosts, &o);
    return status;
}
