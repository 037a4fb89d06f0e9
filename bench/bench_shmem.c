/* bench shmem: the SHMEM runtime between two ranks on two cores.
 *
 * One invocation measures, for 64 KiB ... 64 MiB, the bandwidth of mm_shmem_put, of a plain
 * memcpy into the peer's mapping and of MPI_Put + MPI_Win_flush (Open MPI, a window from
 * MPI_Win_allocate) on the same source buffer, then the signal round-trip latency and the
 * 2-rank barrier latency. Both ranks move data at the same time, each to the other (as the
 * machine study before this project measured MPI); GB/s are per rank (bytes one rank writes
 * / its time). Each figure is the median of several trials, and the trials of the three copies are interleaved
 * in rotating order, so noise from other work on the machine hits them alike.
 *
 * The command starts its own two ranks: `mpirun -np 2 --bind-to core` running this binary as
 * `bench shmem --worker` (so the MPI_Put trials run in the same processes), joined to the
 * SHMEM runtime through a private endpoint and job token. mpirun stops the job when a rank
 * dies, and the run fails. Without MPI (MEGAMOE_WITH_MPI=OFF) the two ranks are forked
 * directly and the mpi_put rows are null.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/cpu.h"
#include "bench_util.h"
#include "shmem/shmem.h"

#ifdef MEGAMOE_HAVE_MPI
#include <mpi.h>
#endif

#define MM_MAX_SIZES 8
#define MM_BIG (64u << 20)

static const size_t mm_sizes_full[] = {64u << 10, 256u << 10, 1u << 20, 4u << 20, 16u << 20, 64u << 20};
static const size_t mm_sizes_quick[] = {64u << 10, 1u << 20, 4u << 20};

typedef struct {
    const size_t *sizes;
    int n_sizes, trials;
    long rtt_iters, barrier_iters;
} mm_plan_t;

static mm_plan_t mm_bench_plan(int quick)
{
    mm_plan_t p;
    p.sizes = quick ? mm_sizes_quick : mm_sizes_full;
    p.n_sizes = quick ? 3 : 6;
    p.trials = quick ? 5 : 25; /* many short trials: medians resist bursts of other work */
    p.rtt_iters = quick ? 20000 : 200000;
    p.barrier_iters = quick ? 20000 : 200000;
    return p;
}

/* Repetitions so that one trial moves about 128 MiB (at least 2). */
static long mm_reps(size_t size)
{
    long r = (long)((128u << 20) / size);
    return r < 2 ? 2 : r;
}

/* ---- a rank: SHMEM put, memcpy and MPI_Put trials interleaved on the same buffers ---- */

static int mm_fail(const char *what)
{
    fprintf(stderr, "bench shmem: rank %d: %s failed: %s\n", mm_shmem_my_pe(), what,
            megamoe_last_error());
    return 1;
}

enum { MM_IMPL_PUT, MM_IMPL_MEMCPY, MM_IMPL_MPI, MM_IMPLS };

typedef struct {
    uint8_t *dest, *remote, *src;
    int peer;
#ifdef MEGAMOE_HAVE_MPI
    MPI_Win win;
#endif
} mm_bufs_t;

static void mm_move(const mm_bufs_t *b, int impl, size_t size, long reps)
{
    if (impl == MM_IMPL_PUT) {
        for (long i = 0; i < reps; i++) mm_shmem_put(b->dest, b->src, size, b->peer);
        mm_shmem_quiet();
    } else if (impl == MM_IMPL_MEMCPY) {
        for (long i = 0; i < reps; i++) memcpy(b->remote, b->src, size);
        mm_shmem_quiet();
    } else {
#ifdef MEGAMOE_HAVE_MPI
        for (long i = 0; i < reps; i++) {
            MPI_Put(b->src, (int)size, MPI_BYTE, b->peer, 0, (int)size, MPI_BYTE, b->win);
            MPI_Win_flush(b->peer, b->win);
        }
#endif
    }
}

static int mm_worker(int quick)
{
    mm_plan_t plan = mm_bench_plan(quick);
    int rank = -1, impls = 2;
    mm_bufs_t b;
    memset(&b, 0, sizeof b);
#ifdef MEGAMOE_HAVE_MPI
    uint8_t *window = NULL;
    MPI_Init(NULL, NULL);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Win_allocate(MM_BIG, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &window, &b.win);
    memset(window, 0, MM_BIG);
    MPI_Win_lock_all(0, b.win);
    impls = 3;
#else
    const char *r = getenv("RANK");
    rank = r ? atoi(r) : 0;
#endif
    cpu_set_t set; /* mpirun binds too; without it, this keeps the ranks on different cores */
    CPU_ZERO(&set);
    CPU_SET(rank % mm_cpu_count(), &set);
    sched_setaffinity(0, sizeof set, &set);
    mm_shmem_params_t p = mm_shmem_params_default();
    p.rank = rank;
    p.world_size = 2;
    p.heap_size = MM_BIG + (16u << 20);
    p.timeout_sec = 120;
    if (mm_shmem_acquire(&p) != MEGAMOE_OK) return mm_fail("acquire");
    int me = mm_shmem_my_pe();
    b.peer = 1 - me;
    uint64_t *lines = NULL;
    if (mm_shmem_calloc(MM_BIG, 4096, (void **)&b.dest) != MEGAMOE_OK) return mm_fail("heap");
    if (mm_shmem_calloc(2 * 64, 64, (void **)&lines) != MEGAMOE_OK) return mm_fail("heap");
    if (mm_aligned_alloc(MM_BIG, 4096, "bench source", (void **)&b.src) != MEGAMOE_OK) return 1;
    memset(b.src, me + 1, MM_BIG);
    b.remote = mm_shmem_ptr(b.dest, b.peer);
    double *gbps = malloc(sizeof(double) * (size_t)plan.trials * MM_IMPLS);
    static const char *const names[] = {"put", "memcpy", "mpi_put"};
    for (int s = 0; s < plan.n_sizes; s++) {
        size_t size = plan.sizes[s];
        long reps = mm_reps(size);
        for (int k = 0; k < impls; k++) mm_move(&b, k, size, 2); /* touch pages, warm up */
        /* Trials rotate the order of the implementations, so a burst of machine noise does
         * not land on the same one every time. */
        for (int t = 0; t < plan.trials; t++)
            for (int j = 0; j < impls; j++) {
                int k = (j + t) % impls;
                if (mm_shmem_barrier_all() != MEGAMOE_OK) return mm_fail("barrier");
                uint64_t t0 = mm_now_ns();
                mm_move(&b, k, size, reps);
                double dt = (double)(mm_now_ns() - t0) * 1e-9;
                gbps[k * plan.trials + t] = (double)size * (double)reps / dt * 1e-9;
            }
        for (int k = 0; k < impls && me == 0; k++)
            printf("%s %zu %.4f\n", names[k], size, mm_bench_median_of(gbps + k * plan.trials, plan.trials));
        fflush(stdout);
    }
    /* signal round trip: ping on rank 1's line 0, pong on rank 0's line 1 */
    uint64_t *ping = &lines[0], *pong = &lines[8], value = 0;
    double *us = malloc(sizeof(double) * (size_t)plan.trials);
    for (int t = 0; t < plan.trials; t++) {
        if (mm_shmem_barrier_all() != MEGAMOE_OK) return mm_fail("barrier");
        uint64_t t0 = mm_now_ns();
        for (long i = 0; i < plan.rtt_iters; i++) {
            value++;
            if (me == 0) {
                mm_shmem_signal_op(ping, value, MM_SHMEM_SIGNAL_SET, 1);
                if (mm_shmem_signal_wait_until(pong, MM_SHMEM_CMP_GE, value, NULL) != MEGAMOE_OK)
                    return mm_fail("signal wait");
            } else {
                if (mm_shmem_signal_wait_until(ping, MM_SHMEM_CMP_GE, value, NULL) != MEGAMOE_OK)
                    return mm_fail("signal wait");
                mm_shmem_signal_op(pong, value, MM_SHMEM_SIGNAL_SET, 0);
            }
        }
        us[t] = (double)(mm_now_ns() - t0) * 1e-3 / (double)plan.rtt_iters;
    }
    if (me == 0) printf("signal_rtt %.4f\n", mm_bench_median_of(us, plan.trials));
    for (int t = 0; t < plan.trials; t++) {
        if (mm_shmem_barrier_all() != MEGAMOE_OK) return mm_fail("barrier");
        uint64_t t0 = mm_now_ns();
        for (long i = 0; i < plan.barrier_iters; i++)
            if (mm_shmem_barrier_all() != MEGAMOE_OK) return mm_fail("barrier");
        us[t] = (double)(mm_now_ns() - t0) * 1e-3 / (double)plan.barrier_iters;
    }
    if (me == 0) printf("barrier %.4f\n", mm_bench_median_of(us, plan.trials));
    fflush(stdout);
    free(us);
    free(gbps);
    mm_aligned_free(b.src);
    if (mm_shmem_free(b.dest) != MEGAMOE_OK || mm_shmem_free(lines) != MEGAMOE_OK) return mm_fail("free");
    if (mm_shmem_release() != MEGAMOE_OK) return mm_fail("release");
#ifdef MEGAMOE_HAVE_MPI
    MPI_Win_unlock_all(b.win);
    MPI_Win_free(&b.win);
    MPI_Finalize();
#endif
    return 0;
}

/* ---- the driver: start the ranks, collect their lines, run the MPI baseline ---- */

typedef struct {
    pid_t pid;
    int out; /* read end of its stdout, -1 when none */
} mm_child_t;

static int mm_spawn(char *const argv[], char *const env_set[], int capture, mm_child_t *c)
{
    int fds[2] = {-1, -1};
    if (capture && pipe2(fds, O_CLOEXEC) != 0) return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        for (int i = 0; env_set && env_set[i]; i += 2) setenv(env_set[i], env_set[i + 1], 1);
        if (capture) dup2(fds[1], STDOUT_FILENO);
        else dup2(STDERR_FILENO, STDOUT_FILENO);
        execvp(argv[0], argv);
        fprintf(stderr, "bench shmem: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    if (capture) close(fds[1]);
    c->pid = pid;
    c->out = capture ? fds[0] : -1;
    return 0;
}

/* Wait for the children, appending child 0's output to text; if one fails, stop the rest. */
static int mm_supervise(mm_child_t *c, int n, char *text, size_t cap, double timeout_s,
                        const char *what)
{
    size_t len = strlen(text);
    int alive = n, failed = 0;
    int *done = calloc((size_t)n, sizeof *done);
    double end = mm_now_s() + timeout_s;
    while (alive > 0) {
        if (c[0].out >= 0) {
            struct pollfd pf = {c[0].out, POLLIN, 0};
            if (poll(&pf, 1, 50) > 0) {
                ssize_t k = read(c[0].out, text + len, cap - 1 - len);
                if (k > 0) len += (size_t)k;
                else {
                    close(c[0].out);
                    c[0].out = -1;
                }
                text[len] = '\0';
            }
        } else {
            mm_sleep_ns(20000000ull);
        }
        for (int i = 0; i < n; i++) {
            int st;
            if (done[i] || waitpid(c[i].pid, &st, WNOHANG) != c[i].pid) continue;
            done[i] = 1;
            alive--;
            if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && !failed) {
                failed = 1;
                char who[96];
                if (n > 1) snprintf(who, sizeof who, "%s %d", what, i);
                else snprintf(who, sizeof who, "%s", what);
                if (WIFSIGNALED(st))
                    fprintf(stderr, "bench shmem: %s was killed by signal %d; stopping the run\n",
                            who, WTERMSIG(st));
                else
                    fprintf(stderr, "bench shmem: %s exited with status %d (a rank failed or "
                            "died); stopping the run\n", who, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
                for (int j = 0; j < n; j++)
                    if (!done[j]) kill(c[j].pid, SIGKILL);
            }
        }
        if (!failed && mm_now_s() > end) {
            fprintf(stderr, "bench shmem: %s did not finish within %.0f s; stopping the run\n", what,
                    timeout_s);
            failed = 1;
            for (int j = 0; j < n; j++)
                if (!done[j]) kill(c[j].pid, SIGKILL);
        }
    }
    if (c[0].out >= 0) {
        ssize_t k;
        while ((k = read(c[0].out, text + len, cap - 1 - len)) > 0) len += (size_t)k;
        text[len] = '\0';
        close(c[0].out);
    }
    free(done);
    return failed ? 1 : 0;
}

static int mm_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* Value of "<impl> <size> <x>" (size 0: "<impl> <x>") in text, NaN when missing. */
static double mm_find(const char *text, const char *impl, size_t size)
{
    char key[64];
    if (size) snprintf(key, sizeof key, "%s %zu ", impl, size);
    else snprintf(key, sizeof key, "%s ", impl);
    for (const char *p = text; (p = strstr(p, key)) != NULL; p++) /* at a line's start, or */
        if (p == text || p[-1] == '\n' || (p - text >= 2 && p[-1] == ' ' && p[-2] == ']'))
            return strtod(p + strlen(key), NULL); /* after the "[... @host] " of megamoe launch */
    return 0.0 / 0.0;
}

static int mm_bench_shmem_main(int argc, char **argv)
{
    int quick = mm_bench_flag(argc, argv, "--quick");
    if (mm_bench_flag(argc, argv, "--worker")) return mm_worker(quick);
    const char *hosts = mm_bench_opt(argc, argv, "--hosts", NULL);
    if (mm_bench_flag(argc, argv, "--help")) {
        printf("usage: megamoe bench shmem [--quick] [--hosts H]\n"
               "  put / memcpy / MPI_Put bandwidth (64 KiB .. 64 MiB), signal round trip and\n"
               "  barrier latency between two ranks pinned to two cores (--quick: fewer sizes)\n"
               "  --hosts H: the two ranks on H simulated hosts (megamoe launch --hosts; root);\n"
               "  rows carry \"hosts\" (1 without it)\n");
        return 0;
    }
    if (hosts && atoi(hosts) != 1 && atoi(hosts) != 2) {
        fprintf(stderr, "bench shmem: --hosts must be 1 or 2 (two ranks), got '%s'\n", hosts);
        return 2;
    }
    const int n_hosts = hosts ? atoi(hosts) : 1;
    mm_plan_t plan = mm_bench_plan(quick);
    const char *self = mm_bench_self_exe();
    char *text = calloc(1, 1 << 16);
    uint8_t raw[16];
    char token[40], endpoint[64];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) memset(raw, 7, sizeof raw);
    for (int i = 0; i < 16; i++) sprintf(token + 2 * i, "%02x", raw[i]);
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", mm_free_port());
    mm_bench_progress(1, 1, "2 ranks: put, memcpy, MPI_Put, signal round trip, barrier");
    int failed;
#ifdef MEGAMOE_HAVE_MPI
    /* mpirun starts the two ranks (bound to two cores) so the MPI_Put trials run in the same
     * processes, interleaved with the SHMEM ones; it stops the job if a rank dies. */
    mm_child_t job;
    char *argv_mpi[] = {"mpirun", "--allow-run-as-root", "-np", "2", "--bind-to", "core",
                        "-x", "MEGAMOE_JOB_TOKEN", "-x", "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT",
                        (char *)self, "bench", "shmem", "--worker", quick ? "--quick" : NULL, NULL};
    char *env[] = {"MEGAMOE_JOB_TOKEN", token, "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT", endpoint,
                   NULL};
    /* on simulated hosts the launcher runs mpirun across them and makes endpoint and token */
    char *argv_hosts[] = {(char *)self, "launch", "--hosts", (char *)hosts, "--mpirun", "-n", "2",
                          "--mpi-arg", "--bind-to", "--mpi-arg", "core", "--timeout", "600", "--",
                          (char *)self, "bench", "shmem", "--worker", quick ? "--quick" : NULL, NULL};
    if (mm_spawn(hosts ? argv_hosts : argv_mpi, hosts ? NULL : env, 1, &job) != 0) {
        fprintf(stderr, "bench shmem: cannot start mpirun: %s (make deps installs Open MPI)\n",
                strerror(errno));
        free(text);
        return 1;
    }
    failed = mm_supervise(&job, 1, text, 1 << 16, 600, "mpirun (the 2-rank job)");
#else
    mm_child_t ranks[2];
    char *wargv[] = {(char *)self, "bench", "shmem", "--worker", quick ? "--quick" : NULL, NULL};
    if (hosts) { /* the launcher starts both ranks on the simulated hosts */
        char *largv[] = {(char *)self, "launch", "--hosts", (char *)hosts, "-n", "2", "--timeout",
                         "600", "--", (char *)self, "bench", "shmem", "--worker",
                         quick ? "--quick" : NULL, NULL};
        if (mm_spawn(largv, NULL, 1, &ranks[0]) != 0) {
            fprintf(stderr, "bench shmem: cannot start the launcher: %s\n", strerror(errno));
            free(text);
            return 1;
        }
        failed = mm_supervise(ranks, 1, text, 1 << 16, 660, "megamoe launch (the 2-rank job)");
    }
    for (int r = 0; r < 2 && !hosts; r++) {
        char rs[8];
        snprintf(rs, sizeof rs, "%d", r);
        char *env[] = {"RANK", rs, "WORLD_SIZE", "2", "MEGAMOE_JOB_TOKEN", token,
                       "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT", endpoint, NULL};
        if (mm_spawn(wargv, env, r == 0, &ranks[r]) != 0) {
            fprintf(stderr, "bench shmem: cannot start rank %d: %s\n", r, strerror(errno));
            if (r == 1) kill(ranks[0].pid, SIGKILL), waitpid(ranks[0].pid, NULL, 0);
            free(text);
            return 1;
        }
    }
    if (!hosts) failed = mm_supervise(ranks, 2, text, 1 << 16, 600, "rank");
    fprintf(stderr, "bench shmem: built without MPI: no mpi_put figures\n");
#endif
    if (failed) {
        free(text);
        return 1;
    }

    mm_bench_begin("shmem");
    static const char *const impls[] = {"put", "memcpy", "mpi_put"};
    int ok = 1;
    for (int k = 0; k < 3; k++)
        for (int s = 0; s < plan.n_sizes; s++) {
            double v = mm_find(text, impls[k], plan.sizes[s]);
#ifdef MEGAMOE_HAVE_MPI
            ok &= v == v;
#endif
            mm_bench_row();
            mm_bench_str("impl", impls[k]);
            mm_bench_int("hosts", n_hosts);
            mm_bench_int("size_bytes", (long long)plan.sizes[s]);
            mm_bench_num("GBps", v);
        }
    double rtt = mm_find(text, "signal_rtt", 0), bar = mm_find(text, "barrier", 0);
    ok &= rtt == rtt && bar == bar;
    mm_bench_row();
    mm_bench_str("impl", "signal_rtt");
    mm_bench_int("hosts", n_hosts);
    mm_bench_num("us", rtt);
    mm_bench_row();
    mm_bench_str("impl", "barrier");
    mm_bench_int("hosts", n_hosts);
    mm_bench_int("ranks", 2);
    mm_bench_num("us", bar);
    mm_bench_end();

    /* targets (issue 3) on stderr */
    fprintf(stderr, "\ntargets: put >= 0.85 x memcpy (>= 1 MiB), put >= 1.0 x MPI_Put, signal "
            "round trip <= 1 us, barrier <= 2 us\n");
    for (int s = 0; s < plan.n_sizes; s++) {
        size_t z = plan.sizes[s];
        double put = mm_find(text, "put", z), cpy = mm_find(text, "memcpy", z),
               mpi = mm_find(text, "mpi_put", z);
        fprintf(stderr, "  %8zu B: put/memcpy %.2f%s", z, put / cpy,
                z >= (1u << 20) ? (put >= 0.85 * cpy ? " ok" : " MISSED") : "");
        if (mpi == mpi) fprintf(stderr, "  put/mpi_put %.2f%s\n", put / mpi, put >= mpi ? " ok" : " MISSED");
        else fprintf(stderr, "  put/mpi_put n/a\n");
    }
    fprintf(stderr, "  signal round trip %.3f us%s, barrier %.3f us%s\n", rtt,
            rtt <= 1.0 ? " ok" : " MISSED", bar, bar <= 2.0 ? " ok" : " MISSED");
    free(text);
    if (!ok) fprintf(stderr, "bench shmem: some figures are missing from the ranks' output\n");
    return ok ? 0 : 1;
}

const mm_bench_def_t mm_bench_shmem_def = {
    "shmem", "SHMEM put/memcpy/MPI_Put bandwidth, signal round trip, barrier (2 ranks)",
    mm_bench_shmem_main};
