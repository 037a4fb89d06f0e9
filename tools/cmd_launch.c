/* megamoe launch -n N [--timeout S] [--] CMD ARGS...
 *
 * Starts N local ranks of CMD with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, a random
 * MEGAMOE_JOB_TOKEN, HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT on a free loopback port and
 * MASTER_ADDR/MASTER_PORT (for torch.distributed). Output lines are prefixed "[rank N] ".
 * When a rank fails (non-zero exit or signal) or the timeout passes, the other ranks get
 * SIGTERM, then SIGKILL after a grace period, and the launcher exits non-zero with a line
 * naming the rank and the cause. Each rank runs in its own process group (so its children are
 * stopped too) and dies with the launcher (PR_SET_PDEATHSIG).
 *
 * Exit status: 0 when every rank exited 0; the failing rank's exit status (128+signal when it
 * was killed); 124 on timeout; 2 on bad usage.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
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

#define MM_LAUNCH_MAX_RANKS 256
#define MM_LAUNCH_GRACE_S 2.0

typedef struct mm_rank_proc {
    pid_t pid;
    int out_fd, err_fd; /* read ends, -1 when closed */
    int exited;
    int status;
    char out_buf[8192], err_buf[8192];
    size_t out_len, err_len;
} mm_rank_proc_t;

static volatile sig_atomic_t mm_launch_interrupted;

static void mm_launch_on_signal(int sig) { mm_launch_interrupted = sig; }

static double mm_launch_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int mm_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
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

/* Write complete lines of buf with the rank prefix; keep a partial tail unless flush. */
static void mm_emit_lines(FILE *to, int rank, char *buf, size_t *len, int flush)
{
    size_t start = 0;
    for (size_t i = 0; i < *len; i++) {
        if (buf[i] == '\n') {
            fprintf(to, "[rank %d] %.*s\n", rank, (int)(i - start), buf + start);
            start = i + 1;
        }
    }
    if (flush && start < *len) {
        fprintf(to, "[rank %d] %.*s\n", rank, (int)(*len - start), buf + start);
        start = *len;
    }
    if (start == 0 && *len == 8192) { /* a single over-long line: emit it as is */
        fprintf(to, "[rank %d] %.*s\n", rank, (int)*len, buf);
        start = *len;
    }
    memmove(buf, buf + start, *len - start);
    *len -= start;
    fflush(to);
}

static void mm_drain(mm_rank_proc_t *p, int rank, int which, int flush)
{
    int *fd = which ? &p->err_fd : &p->out_fd;
    char *buf = which ? p->err_buf : p->out_buf;
    size_t *len = which ? &p->err_len : &p->out_len;
    FILE *to = which ? stderr : stdout;
    if (*fd < 0) return;
    for (;;) {
        ssize_t n = read(*fd, buf + *len, 8192 - *len);
        if (n > 0) {
            *len += (size_t)n;
            mm_emit_lines(to, rank, buf, len, 0);
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            close(*fd);
            *fd = -1;
            mm_emit_lines(to, rank, buf, len, 1);
        } else if (flush) {
            mm_emit_lines(to, rank, buf, len, 1);
        }
        return;
    }
}

static void mm_describe_status(int status, char *out, size_t len)
{
    if (WIFEXITED(status))
        snprintf(out, len, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, len, "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(out, len, "stopped (status 0x%x)", status);
}

static void mm_signal_all(mm_rank_proc_t *procs, int n, int sig)
{
    for (int r = 0; r < n; r++)
        if (!procs[r].exited && procs[r].pid > 0) kill(-procs[r].pid, sig);
}

static void mm_reap(mm_rank_proc_t *procs, int n)
{
    for (int r = 0; r < n; r++) {
        if (procs[r].exited || procs[r].pid <= 0) continue;
        int st;
        pid_t w = waitpid(procs[r].pid, &st, WNOHANG);
        if (w == procs[r].pid) {
            procs[r].exited = 1;
            procs[r].status = st;
        }
    }
}

static int mm_all_exited(mm_rank_proc_t *procs, int n)
{
    for (int r = 0; r < n; r++)
        if (!procs[r].exited) return 0;
    return 1;
}

static void mm_pump_output(mm_rank_proc_t *procs, int n, int timeout_ms)
{
    struct pollfd pfd[2 * MM_LAUNCH_MAX_RANKS];
    int map[2 * MM_LAUNCH_MAX_RANKS];
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
        if (pfd[i].revents) mm_drain(&procs[map[i] / 2], map[i] / 2, map[i] % 2, 0);
}

static void mm_launch_usage(FILE *out)
{
    fprintf(out,
            "usage: megamoe launch -n N [--timeout S] [--] CMD ARGS...\n"
            "  -n N           number of local ranks (1..%d)\n"
            "  --timeout S    stop every rank after S seconds (exit 124); 0 = no limit\n"
            "Sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MEGAMOE_JOB_TOKEN,\n"
            "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT, MASTER_ADDR and MASTER_PORT for each rank.\n",
            MM_LAUNCH_MAX_RANKS);
}

int mm_cmd_launch(int argc, char **argv)
{
    int n = 0;
    double timeout = 0;
    int i = 1;
    for (; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        } else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > MM_LAUNCH_MAX_RANKS) {
                fprintf(stderr, "megamoe launch: -n must be an integer in [1, %d]\n",
                        MM_LAUNCH_MAX_RANKS);
                return 2;
            }
            n = (int)v;
        } else if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc) {
            char *end;
            const char *text = argv[++i];
            timeout = strtod(text, &end);
            if (*end || end == text || !isfinite(timeout) || timeout < 0) {
                fprintf(stderr, "megamoe launch: --timeout must be a finite number of seconds "
                                ">= 0 (0 = no limit), got '%s'\n",
                        text);
                return 2;
            }
        } else if (strcmp(argv[i], "--help") == 0) {
            mm_launch_usage(stdout);
            return 0;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "megamoe launch: unknown option '%s'\n", argv[i]);
            mm_launch_usage(stderr);
            return 2;
        } else {
            break;
        }
    }
    if (n == 0 || i >= argc) {
        mm_launch_usage(stderr);
        return 2;
    }
    char **cmd = argv + i;

    int port = mm_free_port(), master_port = mm_free_port();
    if (port < 0 || master_port < 0) {
        fprintf(stderr, "megamoe launch: cannot find a free loopback port: %s\n", strerror(errno));
        return 1;
    }
    char endpoint[64], token[65], sport[16], world[16];
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", port);
    snprintf(sport, sizeof sport, "%d", master_port);
    snprintf(world, sizeof world, "%d", n);
    mm_random_token(token, 64);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = mm_launch_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    static mm_rank_proc_t procs[MM_LAUNCH_MAX_RANKS];
    memset(procs, 0, sizeof procs);
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < n; r++) {
        int out[2], err[2];
        if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
            fprintf(stderr, "megamoe launch: pipe: %s\n", strerror(errno));
            mm_signal_all(procs, r, SIGKILL);
            return 1;
        }
        pid_t parent = getpid();
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "megamoe launch: fork: %s\n", strerror(errno));
            mm_signal_all(procs, r, SIGKILL);
            return 1;
        }
        if (pid == 0) {
            setpgid(0, 0);
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(127); /* the launcher died before prctl */
            dup2(out[1], STDOUT_FILENO);
            dup2(err[1], STDERR_FILENO);
            char rank[16];
            snprintf(rank, sizeof rank, "%d", r);
            setenv("RANK", rank, 1);
            setenv("LOCAL_RANK", rank, 1);
            setenv("WORLD_SIZE", world, 1);
            setenv("LOCAL_WORLD_SIZE", world, 1);
            setenv("MEGAMOE_JOB_TOKEN", token, 1);
            setenv("HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT", endpoint, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            setenv("MASTER_PORT", sport, 1);
            signal(SIGPIPE, SIG_DFL);
            execvp(cmd[0], cmd);
            fprintf(stderr, "megamoe launch: cannot run '%s': %s\n", cmd[0], strerror(errno));
            _exit(127);
        }
        setpgid(pid, pid);
        close(out[1]);
        close(err[1]);
        fcntl(out[0], F_SETFL, O_NONBLOCK);
        fcntl(err[0], F_SETFL, O_NONBLOCK);
        procs[r] = (mm_rank_proc_t){.pid = pid, .out_fd = out[0], .err_fd = err[0]};
    }

    double start = mm_launch_now(), stop_at = 0;
    int failed_rank = -1, timed_out = 0, killed_hard = 0;
    char why[160] = "";
    while (!mm_all_exited(procs, n)) {
        mm_pump_output(procs, n, 50);
        mm_reap(procs, n);
        if (failed_rank < 0 && !timed_out) {
            for (int r = 0; r < n; r++) {
                if (procs[r].exited &&
                    !(WIFEXITED(procs[r].status) && WEXITSTATUS(procs[r].status) == 0)) {
                    failed_rank = r;
                    mm_describe_status(procs[r].status, why, sizeof why);
                    break;
                }
            }
            if (failed_rank < 0 && timeout > 0 && mm_launch_now() - start > timeout) timed_out = 1;
            if (failed_rank < 0 && !timed_out && mm_launch_interrupted) {
                timed_out = -1;
            }
            if ((failed_rank >= 0 || timed_out) && !mm_all_exited(procs, n)) {
                if (failed_rank >= 0)
                    fprintf(stderr, "megamoe launch: rank %d %s; stopping the other ranks\n",
                            failed_rank, why);
                else if (timed_out > 0)
                    fprintf(stderr, "megamoe launch: timeout after %.0f s; stopping all ranks\n",
                            timeout);
                else
                    fprintf(stderr, "megamoe launch: interrupted (signal %d); stopping all ranks\n",
                            (int)mm_launch_interrupted);
                mm_signal_all(procs, n, SIGTERM);
                stop_at = mm_launch_now();
            }
        }
        if (stop_at > 0 && !killed_hard && mm_launch_now() - stop_at > MM_LAUNCH_GRACE_S) {
            mm_signal_all(procs, n, SIGKILL);
            killed_hard = 1;
        }
    }
    /* Ranks are gone; collect what is left in the pipes (descendants that kept them open
     * belong to the rank's process group and were signalled with it). */
    for (int r = 0; r < n; r++) {
        kill(-procs[r].pid, SIGKILL); /* leftover children of a rank that exited */
        mm_drain(&procs[r], r, 0, 1);
        mm_drain(&procs[r], r, 1, 1);
        if (procs[r].out_fd >= 0) close(procs[r].out_fd);
        if (procs[r].err_fd >= 0) close(procs[r].err_fd);
    }
    if (failed_rank < 0 && !timed_out) {
        for (int r = 0; r < n; r++) {
            if (!(WIFEXITED(procs[r].status) && WEXITSTATUS(procs[r].status) == 0)) {
                failed_rank = r;
                mm_describe_status(procs[r].status, why, sizeof why);
                break;
            }
        }
    }
    if (timed_out > 0) return 124;
    if (timed_out < 0) return 128 + (int)mm_launch_interrupted;
    if (failed_rank >= 0) {
        if (!killed_hard && stop_at == 0)
            fprintf(stderr, "megamoe launch: rank %d %s\n", failed_rank, why);
        int st = procs[failed_rank].status;
        if (WIFEXITED(st)) return WEXITSTATUS(st) ? WEXITSTATUS(st) : 1;
        if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
        return 1;
    }
    return 0;
}
