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

#include "free_port.h"
#include "base/alloc.h"
#include "base/clock.h"
#include "base/cpu.h"
#include "bench_tcp.h"
#include "bench_ucx.h"
#include "bench_util.h"
#include "shmem/shmem.h"

#ifdef MEGAMOE_HAVE_MPI
#include <mpi.h>
#endif

#define MM_MAX_SIZES 8
#define MM_BIG (64u << 20)

/* put: mm_shmem_put + quiet (mapped peer: a copy; remote peer: megamoe's engine). memcpy: into
 * the peer's mapping (same host only). mpi_put: MPI_Put + MPI_Win_flush. engine: UCX's own
 * pipelined ucp_put_nbx + flush between the same buffers (remote peer only). tcp_stream: a
 * socket between the two ranks (remote peer only). */
enum { MM_IMPL_PUT, MM_IMPL_MEMCPY, MM_IMPL_MPI, MM_IMPL_ENGINE, MM_IMPL_TCP, MM_IMPLS };
static const char *const mm_impl_names[MM_IMPLS] = {"put", "memcpy", "mpi_put", "engine", "tcp_stream"};

static const size_t mm_sizes_full[] = {64u << 10, 256u << 10, 1u << 20, 4u << 20, 16u << 20, 64u << 20};
static const size_t mm_sizes_quick[] = {64u << 10, 1u << 20, 4u << 20};

typedef struct {
    const size_t *sizes;
    int n_sizes, trials;
    size_t trial_bytes;
    long rtt_iters, barrier_iters;
} mm_plan_t;

/* --sizes (a list, K/M suffixes) and --trials replace the plan's own. */
static size_t mm_sizes_opt[MM_MAX_SIZES];
static int mm_n_sizes_opt, mm_trials_opt;

static unsigned mm_impls_opt = ~0u; /* --impls: bit k for implementation k */

static int mm_plan_options(const char *sizes, const char *trials, const char *impls)
{
    if (impls) {
        mm_impls_opt = 0;
        char buf[128];
        snprintf(buf, sizeof buf, "%s", impls);
        for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
            int k = 0;
            while (k < MM_IMPLS && strcmp(t, mm_impl_names[k]) != 0) k++;
            if (k == MM_IMPLS) {
                fprintf(stderr, "bench shmem: --impls takes put,memcpy,mpi_put,engine,tcp_stream; "
                        "got '%s'\n", t);
                return -1;
            }
            mm_impls_opt |= 1u << k;
        }
    }
    for (const char *p = sizes; p && *p && mm_n_sizes_opt < MM_MAX_SIZES;) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (*end == 'K' || *end == 'k') v <<= 10, end++;
        else if (*end == 'M' || *end == 'm') v <<= 20, end++;
        if (v == 0 || v > MM_BIG || (*end && *end != ',')) {
            fprintf(stderr, "bench shmem: --sizes takes sizes up to 64M separated by commas "
                    "(e.g. 1M,4M), got '%s'\n", sizes);
            return -1;
        }
        mm_sizes_opt[mm_n_sizes_opt++] = (size_t)v;
        p = *end ? end + 1 : end;
    }
    if (trials && (atoi(trials) < 1 || atoi(trials) > 1000)) {
        fprintf(stderr, "bench shmem: --trials takes 1..1000, got '%s'\n", trials);
        return -1;
    }
    mm_trials_opt = trials ? atoi(trials) : 0;
    return 0;
}

/* remote: the peer is on another host, where a transfer costs ~1000x a mapped one. */
static mm_plan_t mm_bench_plan(int quick, int remote)
{
    mm_plan_t p;
    p.sizes = quick ? mm_sizes_quick : mm_sizes_full;
    p.n_sizes = quick ? 3 : 6;
    if (mm_n_sizes_opt) p.sizes = mm_sizes_opt, p.n_sizes = mm_n_sizes_opt;
    p.trials = quick ? 5 : 25; /* many short trials: medians resist bursts of other work */
    if (mm_trials_opt) p.trials = mm_trials_opt;
    p.trial_bytes = remote ? (quick ? 16u << 20 : 64u << 20) : 128u << 20;
    p.rtt_iters = remote ? (quick ? 200 : 2000) : quick ? 20000 : 200000;
    p.barrier_iters = remote ? (quick ? 200 : 2000) : quick ? 20000 : 200000;
    return p;
}

/* Repetitions so that one trial moves about trial_bytes (at least 2). */
static long mm_reps(size_t size, size_t trial_bytes)
{
    long r = (long)(trial_bytes / size);
    return r < 2 ? 2 : r;
}

/* ---- a rank: the implementations' trials interleaved on the same buffers ---- */

static int mm_fail(const char *what)
{
    fprintf(stderr, "bench shmem: rank %d: %s failed: %s\n", mm_shmem_my_pe(), what,
            megamoe_last_error());
    return 1;
}


typedef struct {
    uint8_t *dest, *remote, *src;
    int peer, me;
    mm_bucx_t *ucx;       /* engine: its region is dest (data, then the flag lines) */
    uint64_t ucx_seq;     /* engine: end-of-trial flags exchanged */
    int tcp;              /* tcp_stream: the connection, -1 when none */
#ifdef MEGAMOE_HAVE_MPI
    MPI_Win win;
#endif
} mm_bufs_t;

/* Flag lines of the engine baseline, after the data in dest. */
#define MM_FLAG_SYNC MM_BIG
#define MM_FLAG_PING (MM_BIG + 64)
#define MM_FLAG_BYTES 4096

static volatile uint64_t *mm_flag(const mm_bufs_t *b, uint64_t off)
{
    return (volatile uint64_t *)(b->dest + off);
}

/* One trial of impl: reps transfers of size bytes each way; returns its seconds, < 0 on error.
 * Ranks enter it right after a barrier. */
static double mm_process_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double mm_move(mm_bufs_t *b, int impl, size_t size, long reps, double *cpu_s)
{
    double c0 = mm_process_cpu_s();
    uint64_t t0 = mm_now_ns(), t1 = 0;
    if (impl == MM_IMPL_PUT) {
        for (long i = 0; i < reps; i++)
            if (mm_shmem_put(b->dest, b->src, size, b->peer) != MEGAMOE_OK) return -1;
        if (mm_shmem_quiet() != MEGAMOE_OK) return -1;
    } else if (impl == MM_IMPL_MEMCPY) {
        for (long i = 0; i < reps; i++) memcpy(b->remote, b->src, size);
        mm_shmem_quiet();
    } else if (impl == MM_IMPL_ENGINE) {
        /* the progress thread kept the worker going through the barrier; now this thread
         * drives it alone, as a UCX application would */
        mm_bucx_thread_stop(b->ucx);
        c0 = mm_process_cpu_s();
        t0 = mm_now_ns();
        for (long i = 0; i < reps; i++)
            if (mm_bucx_put(b->ucx, b->src, size, 0) != 0) return -1;
        if (mm_bucx_flush(b->ucx) != 0) return -1;
        t1 = mm_now_ns();
        *cpu_s = mm_process_cpu_s() - c0;
        /* the peer may still wait for its puts: progress until it says it is done too */
        b->ucx_seq++;
        if (mm_bucx_put_flag(b->ucx, MM_FLAG_SYNC, b->ucx_seq, 0) != 0 ||
            mm_bucx_wait_word(b->ucx, mm_flag(b, MM_FLAG_SYNC), b->ucx_seq, 120) != 0 ||
            mm_bucx_thread_start(b->ucx) != 0)
            return -1;
    } else if (impl == MM_IMPL_TCP) {
        if (mm_btcp_stream(b->tcp, b->src, b->dest, size, size * (size_t)reps) != 0) return -1;
    } else {
#ifdef MEGAMOE_HAVE_MPI
        for (long i = 0; i < reps; i++) {
            MPI_Put(b->src, (int)size, MPI_BYTE, b->peer, 0, (int)size, MPI_BYTE, b->win);
            MPI_Win_flush(b->peer, b->win);
        }
        t1 = mm_now_ns();
        *cpu_s = mm_process_cpu_s() - c0;
        MPI_Barrier(MPI_COMM_WORLD); /* the peer's last flush may need this rank's progress */
#endif
    }
    if (t1 == 0) {
        t1 = mm_now_ns();
        *cpu_s = mm_process_cpu_s() - c0;
    }
    return (double)(t1 - t0) * 1e-9;
}

/* The engine and tcp_stream baselines: connect to the peer (remote peers only). */
static int mm_connect_baselines(mm_bufs_t *b)
{
    char desc[192], dev[64] = "";
    mm_shmem_engine_describe(desc, sizeof desc);
    const char *d = strstr(desc, "device "); /* megamoe's engine device: the same one */
    if (d && sscanf(d + 7, "%63[^) ,]", dev) == 1 && !strcmp(dev, "any")) dev[0] = '\0';
    b->ucx = mm_bucx_create(dev, b->dest, MM_BIG + MM_FLAG_BYTES);
    if (b->ucx == NULL) return mm_fail("UCX start-up");
    enum { BLOB = 4096 };
    uint8_t *mine = calloc(1, BLOB), *all = calloc(2, BLOB);
    size_t len = mm_bucx_blob(b->ucx, mine + 8, BLOB - 8);
    int port = -1, lfd = b->me == 0 ? mm_btcp_listen(&port) : -1;
    memcpy(mine, &len, 4);
    memcpy(mine + 4, &port, 4);
    if (len == 0 || mm_shmem_team_allgather(mm_shmem_team_world(), all, mine, BLOB) != MEGAMOE_OK)
        return mm_fail("address exchange");
    uint8_t *theirs = all + (size_t)b->peer * BLOB;
    uint32_t plen;
    memcpy(&plen, theirs, 4);
    if (mm_bucx_connect(b->ucx, theirs + 8, plen) != 0) return mm_fail("UCX connect");
    mm_bucx_thread_start(b->ucx);
    if (b->me == 0) {
        b->tcp = mm_btcp_accept(lfd, 60);
        close(lfd);
    } else {
        char host[128];
        int p0;
        memcpy(&p0, all + 4, 4);
        b->tcp = mm_btcp_rank0_host(host, sizeof host) == 0 ? mm_btcp_connect(host, p0, 60) : -1;
    }
    free(mine);
    free(all);
    if (b->tcp < 0) return mm_fail("TCP connection");
    return 0;
}

static int mm_worker(int quick)
{
    int rank = -1, have_mpi = 0;
    mm_bufs_t b;
    memset(&b, 0, sizeof b);
    b.tcp = -1;
#ifdef MEGAMOE_HAVE_MPI
    uint8_t *window = NULL;
    MPI_Init(NULL, NULL);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Win_allocate(MM_BIG, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &window, &b.win);
    memset(window, 0, MM_BIG);
    MPI_Win_lock_all(0, b.win);
    have_mpi = 1;
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
    b.me = me;
    b.peer = 1 - me;
    const int remote = mm_shmem_pe_remote(b.peer);
    mm_plan_t plan = mm_bench_plan(quick, remote);
    uint64_t *lines = NULL;
    if (mm_shmem_calloc(MM_BIG + MM_FLAG_BYTES, 4096, (void **)&b.dest) != MEGAMOE_OK) return mm_fail("heap");
    if (mm_shmem_calloc(2 * 64, 64, (void **)&lines) != MEGAMOE_OK) return mm_fail("heap");
    if (mm_aligned_alloc(MM_BIG, 4096, "bench source", (void **)&b.src) != MEGAMOE_OK) return 1;
    memset(b.src, me + 1, MM_BIG);
    b.remote = mm_shmem_ptr(b.dest, b.peer);
    int on[MM_IMPLS] = {1, !remote && b.remote != NULL, have_mpi, remote, remote};
    for (int k = 0; k < MM_IMPLS; k++) on[k] &= (mm_impls_opt >> k) & 1;
    if (remote && mm_connect_baselines(&b) != 0) return 1;
    if (me == 0) {
        char desc[192];
        mm_shmem_engine_describe(desc, sizeof desc);
        printf("remote %d\nvia_put %s\n", remote, remote ? desc : "load/store into the mapped peer heap");
        if (remote) printf("via_engine %s\n", mm_bucx_describe(b.ucx));
    }
    int impls[MM_IMPLS], n_impls = 0;
    for (int k = 0; k < MM_IMPLS; k++)
        if (on[k]) impls[n_impls++] = k;
    double *gbps = malloc(sizeof(double) * (size_t)plan.trials * MM_IMPLS);
    double *cpu = malloc(sizeof(double) * (size_t)plan.trials * MM_IMPLS);
    for (int s = 0; s < plan.n_sizes; s++) {
        size_t size = plan.sizes[s];
        long reps = mm_reps(size, plan.trial_bytes);
        for (int j = 0; j < n_impls; j++) { /* touch pages, warm up */
            if (mm_shmem_barrier_all() != MEGAMOE_OK) return mm_fail("barrier");
            double c;
            if (mm_move(&b, impls[j], size, 2, &c) < 0) return mm_fail(mm_impl_names[impls[j]]);
        }
        /* Trials rotate the order of the implementations, so a burst of machine noise does
         * not land on the same one every time. */
        for (int t = 0; t < plan.trials; t++)
            for (int j = 0; j < n_impls; j++) {
                int k = impls[(j + t) % n_impls];
                if (mm_shmem_barrier_all() != MEGAMOE_OK) return mm_fail("barrier");
                double c = 0, dt = mm_move(&b, k, size, reps, &c);
                if (dt < 0) return mm_fail(mm_impl_names[k]);
                gbps[k * plan.trials + t] = (double)size * (double)reps / dt * 1e-9;
                /* GB per second of this process's CPU time (all its threads) */
                cpu[k * plan.trials + t] = (double)size * (double)reps / (c > 1e-9 ? c : 1e-9) * 1e-9;
            }
        for (int j = 0; j < n_impls && me == 0; j++) {
            printf("%s %zu %.4f\n", mm_impl_names[impls[j]], size,
                   mm_bench_median_of(gbps + impls[j] * plan.trials, plan.trials));
            printf("cpu_%s %zu %.4f\n", mm_impl_names[impls[j]], size,
                   mm_bench_median_of(cpu + impls[j] * plan.trials, plan.trials));
        }
        fflush(stdout);
    }
    /* signal round trip: ping on rank 1's line 0, pong on rank 0's line 1 */
    uint64_t *ping = &lines[0], *pong = &lines[8], value = 0;
    double *us = malloc(sizeof(double) * (size_t)plan.trials * 3);
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
        if (!remote) continue;
        /* the engine's own: an 8-byte flag put each way, the waiter progressing */
        if (mm_shmem_barrier_all() != MEGAMOE_OK) return mm_fail("barrier");
        mm_bucx_thread_stop(b.ucx);
        volatile uint64_t *mine = mm_flag(&b, MM_FLAG_PING);
        /* the flag's value so far is the same count on both ranks (reading the word instead
         * would race with the peer's first ping, which the progress thread may have landed) */
        uint64_t base = (uint64_t)t * (uint64_t)plan.rtt_iters, t1 = mm_now_ns();
        int bad = 0;
        for (long i = 1; i <= plan.rtt_iters && !bad; i++) {
            if (me == 0)
                bad = mm_bucx_put_flag(b.ucx, MM_FLAG_PING, base + i, 0) != 0 ||
                      mm_bucx_wait_word(b.ucx, mine, base + i, 120) != 0;
            else
                bad = mm_bucx_wait_word(b.ucx, mine, base + i, 120) != 0 ||
                      mm_bucx_put_flag(b.ucx, MM_FLAG_PING, base + i, 0) != 0;
        }
        us[plan.trials + t] = (double)(mm_now_ns() - t1) * 1e-3 / (double)plan.rtt_iters;
        if (bad || mm_bucx_thread_start(b.ucx) != 0) return mm_fail("engine round trip");
        /* and a socket's: 8 bytes each way */
        if (mm_shmem_barrier_all() != MEGAMOE_OK) return mm_fail("barrier");
        t1 = mm_now_ns();
        if (mm_btcp_pingpong(b.tcp, me == 0, plan.rtt_iters) != 0) return mm_fail("TCP round trip");
        us[2 * plan.trials + t] = (double)(mm_now_ns() - t1) * 1e-3 / (double)plan.rtt_iters;
    }
    if (me == 0) {
        printf("signal_rtt %.4f\n", mm_bench_median_of(us, plan.trials));
        if (remote) {
            printf("engine_signal_rtt %.4f\n", mm_bench_median_of(us + plan.trials, plan.trials));
            printf("tcp_rtt %.4f\n", mm_bench_median_of(us + 2 * plan.trials, plan.trials));
        }
    }
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
    free(cpu);
    /* the engine baseline's last flags may still need the peer: everyone is past them here */
    if (mm_shmem_barrier_all() != MEGAMOE_OK) return mm_fail("barrier");
    mm_bucx_destroy(b.ucx);
    if (b.tcp >= 0) close(b.tcp);
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

/* The rest of the line "<key> <text>" in text (after a launcher prefix), "" when missing. */
static void mm_find_text(const char *text, const char *key, char *out, size_t len)
{
    char k[64];
    snprintf(k, sizeof k, "%s ", key);
    out[0] = '\0';
    for (const char *p = text; (p = strstr(p, k)) != NULL; p++)
        if (p == text || p[-1] == '\n' || (p - text >= 2 && p[-1] == ' ' && p[-2] == ']')) {
            p += strlen(k);
            size_t n = strcspn(p, "\n");
            if (n >= len) n = len - 1;
            memcpy(out, p, n);
            out[n] = '\0';
            return;
        }
}

static int mm_bench_shmem_main(int argc, char **argv)
{
    int quick = mm_bench_flag(argc, argv, "--quick");
    const char *impls_opt = mm_bench_opt(argc, argv, "--impls", NULL);
    if (mm_plan_options(mm_bench_opt(argc, argv, "--sizes", NULL),
                        mm_bench_opt(argc, argv, "--trials", NULL), impls_opt) != 0)
        return 2;
    if (mm_bench_flag(argc, argv, "--worker")) return mm_worker(quick);
    const char *hosts = mm_bench_opt(argc, argv, "--hosts", NULL);
    if (mm_bench_flag(argc, argv, "--help")) {
        printf("usage: megamoe bench shmem [--quick] [--hosts H] [--sizes 1M,4M] [--trials N]\n"
               "                           [--osc COMPONENT] [--impls put,engine,...]\n"
               "  put / memcpy / MPI_Put bandwidth (64 KiB .. 64 MiB), signal round trip and\n"
               "  barrier latency between two ranks pinned to two cores (--quick: fewer sizes)\n"
               "  --hosts H: the two ranks on H simulated hosts (megamoe launch --hosts; root);\n"
               "  rows carry \"hosts\" (1 without it). With the peer on another host (or\n"
               "  MEGAMOE_SHMEM_INTRA_HOST=engine) put goes through megamoe's engine, memcpy is\n"
               "  not measured, and \"engine\" (UCX's own pipelined ucp_put_nbx + flush between\n"
               "  the same buffers) and \"tcp_stream\" (one socket) rows come beside it.\n"
               "  --osc: Open MPI's one-sided component for mpi_put (default ucx across hosts,\n"
               "  Open MPI's choice on one). Across hosts every row also has GB_per_cpu_s: bytes per\n"
               "  second of the rank's CPU time (all its threads), which noise from other work\n"
               "  on the machine disturbs less than GBps\n");
        return 0;
    }
    if (hosts && atoi(hosts) != 1 && atoi(hosts) != 2) {
        fprintf(stderr, "bench shmem: --hosts must be 1 or 2 (two ranks), got '%s'\n", hosts);
        return 2;
    }
    const int n_hosts = hosts ? atoi(hosts) : 1;
    const char *osc = mm_bench_opt(argc, argv, "--osc", n_hosts > 1 ? "ucx" : NULL);
    const char *sizes_opt = mm_bench_opt(argc, argv, "--sizes", NULL);
    const char *trials_opt = mm_bench_opt(argc, argv, "--trials", NULL);
    const char *self = mm_bench_self_exe();
    char *text = calloc(1, 1 << 16);
    uint8_t raw[16];
    char token[40], endpoint[64];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) memset(raw, 7, sizeof raw);
    for (int i = 0; i < 16; i++) sprintf(token + 2 * i, "%02x", raw[i]);
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", mm_free_loopback_port());
    mm_bench_progress(1, 1, "2 ranks: put, memcpy, MPI_Put, signal round trip, barrier");
    int failed;
    /* the workers' own arguments */
    char *wk[12] = {(char *)self, "bench", "shmem", "--worker"};
    int nw = 4;
    if (quick) wk[nw++] = "--quick";
    if (sizes_opt) wk[nw++] = "--sizes", wk[nw++] = (char *)sizes_opt;
    if (trials_opt) wk[nw++] = "--trials", wk[nw++] = (char *)trials_opt;
    if (impls_opt) wk[nw++] = "--impls", wk[nw++] = (char *)impls_opt;
    wk[nw] = NULL;
    const double limit_s = hosts ? 1800 : 600;
    char *av[64];
    int na = 0;
#ifdef MEGAMOE_HAVE_MPI
    /* mpirun starts the two ranks (bound to two cores) so the MPI_Put trials run in the same
     * processes, interleaved with the SHMEM ones; it stops the job if a rank dies. On simulated
     * hosts the launcher runs mpirun across them and makes endpoint and token. */
    mm_child_t job;
    char *env[] = {"MEGAMOE_JOB_TOKEN", token, "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT", endpoint,
                   NULL};
    if (hosts) {
        char *head[] = {(char *)self, "launch", "--hosts", (char *)hosts, "--mpirun", "-n", "2",
                        "--mpi-arg", "--bind-to", "--mpi-arg", "core", "--timeout", "1800"};
        memcpy(av, head, sizeof head);
        na = (int)(sizeof head / sizeof head[0]);
        if (osc) { /* Open MPI 4.1's default (osc rdma) cannot make a window over btl tcp */
            char *mca[] = {"--mpi-arg", "--mca", "--mpi-arg", "osc", "--mpi-arg", (char *)osc,
                           /* the network, not UCX's shared-memory transports, and megamoe's
                            * TCP segment sizes (engine_ucx.c) for osc ucx too */
                           "--mpi-arg", "-x", "--mpi-arg", "UCX_TLS=^sm", "--mpi-arg", "-x",
                           "--mpi-arg", "UCX_TCP_TX_SEG_SIZE=64k", "--mpi-arg", "-x", "--mpi-arg",
                           "UCX_TCP_RX_SEG_SIZE=256k",
                           /* UCX >= 1.16's protocols v2 have no software atomics over TCP,
                            * which osc ucx needs as well (engine_ucx.c) */
                           "--mpi-arg", "-x", "--mpi-arg", "UCX_PROTO_ENABLE=n",
                           /* Open MPI 5's osc ucx declines devices other than mlx* unless told */
                           "--mpi-arg", "--mca", "--mpi-arg", "osc_ucx_tls", "--mpi-arg", "any",
                           "--mpi-arg", "--mca", "--mpi-arg", "osc_ucx_devices", "--mpi-arg", "any"};
            memcpy(av + na, mca, sizeof mca);
            na += (int)(sizeof mca / sizeof mca[0]);
        }
        av[na++] = "--";
    } else {
        char *head[] = {"mpirun", "--allow-run-as-root", "-np", "2", "--bind-to", "core",
                        "-x", "MEGAMOE_JOB_TOKEN", "-x", "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT"};
        memcpy(av, head, sizeof head);
        na = (int)(sizeof head / sizeof head[0]);
        if (osc) av[na++] = "--mca", av[na++] = "osc", av[na++] = (char *)osc;
    }
    memcpy(av + na, wk, (size_t)(nw + 1) * sizeof(char *));
    if (mm_spawn(av, hosts ? NULL : env, 1, &job) != 0) {
        fprintf(stderr, "bench shmem: cannot start mpirun: %s (make deps installs Open MPI)\n",
                strerror(errno));
        free(text);
        return 1;
    }
    failed = mm_supervise(&job, 1, text, 1 << 16, limit_s, "mpirun (the 2-rank job)");
#else
    mm_child_t ranks[2];
    if (hosts) { /* the launcher starts both ranks on the simulated hosts */
        char *head[] = {(char *)self, "launch", "--hosts", (char *)hosts, "-n", "2", "--timeout",
                        "1800", "--"};
        memcpy(av, head, sizeof head);
        na = (int)(sizeof head / sizeof head[0]);
        memcpy(av + na, wk, (size_t)(nw + 1) * sizeof(char *));
        if (mm_spawn(av, NULL, 1, &ranks[0]) != 0) {
            fprintf(stderr, "bench shmem: cannot start the launcher: %s\n", strerror(errno));
            free(text);
            return 1;
        }
        failed = mm_supervise(ranks, 1, text, 1 << 16, limit_s + 60, "megamoe launch (the 2-rank job)");
    }
    for (int r = 0; r < 2 && !hosts; r++) {
        char rs[8];
        snprintf(rs, sizeof rs, "%d", r);
        char *env[] = {"RANK", rs, "WORLD_SIZE", "2", "MEGAMOE_JOB_TOKEN", token,
                       "HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT", endpoint, NULL};
        if (mm_spawn(wk, env, r == 0, &ranks[r]) != 0) {
            fprintf(stderr, "bench shmem: cannot start rank %d: %s\n", r, strerror(errno));
            if (r == 1) kill(ranks[0].pid, SIGKILL), waitpid(ranks[0].pid, NULL, 0);
            free(text);
            return 1;
        }
    }
    if (!hosts) failed = mm_supervise(ranks, 2, text, 1 << 16, limit_s, "rank");
    fprintf(stderr, "bench shmem: built without MPI: no mpi_put figures\n");
#endif
    if (failed) {
        free(text);
        return 1;
    }

    const int remote = mm_find(text, "remote", 0) == 1.0;
    mm_plan_t plan = mm_bench_plan(quick, remote);
    char via_put[96], via_engine[96], via_mpi[96];
    mm_find_text(text, "via_put", via_put, sizeof via_put);
    mm_find_text(text, "via_engine", via_engine, sizeof via_engine);
    snprintf(via_mpi, sizeof via_mpi, "MPI_Put + MPI_Win_flush, osc %s", osc ? osc : "Open MPI's choice");
    mm_bench_begin("shmem");
    int ok = 1;
    for (int k = 0; k < MM_IMPLS; k++) {
        /* memcpy needs the peer's heap mapped; engine and tcp_stream are the baselines of a
         * remote peer; mpi_put needs MPI */
        int on = k == MM_IMPL_MEMCPY ? !remote : k == MM_IMPL_ENGINE || k == MM_IMPL_TCP ? remote : 1;
        if (!((mm_impls_opt >> k) & 1)) continue;
#ifndef MEGAMOE_HAVE_MPI
        if (k == MM_IMPL_MPI) on = 0;
#endif
        if (!on) {
            if (k == MM_IMPL_MEMCPY) { /* say why it is missing, once */
                mm_bench_row();
                mm_bench_str("impl", "memcpy");
                mm_bench_int("hosts", n_hosts);
                mm_bench_num("GBps", 0.0 / 0.0);
                mm_bench_str("note", "not measured: the peer's heap is not mapped (another host)");
            }
            continue;
        }
        for (int s = 0; s < plan.n_sizes; s++) {
            double v = mm_find(text, mm_impl_names[k], plan.sizes[s]);
            ok &= v == v;
            mm_bench_row();
            mm_bench_str("impl", mm_impl_names[k]);
            mm_bench_int("hosts", n_hosts);
            mm_bench_int("size_bytes", (long long)plan.sizes[s]);
            mm_bench_num("GBps", v);
            if (!remote) continue; /* the single-host rows stay as they were */
            char ck[32];
            snprintf(ck, sizeof ck, "cpu_%s", mm_impl_names[k]);
            mm_bench_num("GB_per_cpu_s", mm_find(text, ck, plan.sizes[s]));
            if (k == MM_IMPL_PUT) mm_bench_str("via", via_put);
            if (k == MM_IMPL_ENGINE) mm_bench_str("via", via_engine);
            if (k == MM_IMPL_MPI) mm_bench_str("via", via_mpi);
            if (k == MM_IMPL_TCP) mm_bench_str("via", "one TCP socket, both directions, 4 MiB buffers");
        }
    }
    double rtt = mm_find(text, "signal_rtt", 0), bar = mm_find(text, "barrier", 0);
    double ertt = mm_find(text, "engine_signal_rtt", 0), trtt = mm_find(text, "tcp_rtt", 0);
    ok &= rtt == rtt && bar == bar && (!remote || (ertt == ertt && trtt == trtt));
    mm_bench_row();
    mm_bench_str("impl", "signal_rtt");
    mm_bench_int("hosts", n_hosts);
    mm_bench_num("us", rtt);
    if (remote) mm_bench_num("over_engine", rtt / ertt); /* issue 31: <= 1.2 */
    if (remote) {
        mm_bench_row();
        mm_bench_str("impl", "engine_signal_rtt");
        mm_bench_int("hosts", n_hosts);
        mm_bench_num("us", ertt);
        mm_bench_str("via", "8-byte ucp_put_nbx each way, the waiter progressing");
        mm_bench_row();
        mm_bench_str("impl", "tcp_rtt");
        mm_bench_int("hosts", n_hosts);
        mm_bench_num("us", trtt);
        mm_bench_str("via", "8 bytes each way on the TCP socket");
    }
    mm_bench_row();
    mm_bench_str("impl", "barrier");
    mm_bench_int("hosts", n_hosts);
    mm_bench_int("ranks", 2);
    mm_bench_num("us", bar);
    mm_bench_end();

    if (remote) { /* targets (issue 12) on stderr */
        fprintf(stderr, "\ntarget: put >= 0.9 x engine (UCX's own pipelined put), from 1 MiB\n");
        for (int s = 0; s < plan.n_sizes; s++) {
            size_t z = plan.sizes[s];
            double put = mm_find(text, "put", z), eng = mm_find(text, "engine", z),
                   tcp = mm_find(text, "tcp_stream", z), mpi = mm_find(text, "mpi_put", z);
            fprintf(stderr, "  %8zu B: put/engine %.2f%s  put/tcp_stream %.2f  put/mpi_put %.2f\n", z,
                    put / eng, z >= (1u << 20) ? (put >= 0.9 * eng ? " ok" : " MISSED") : "",
                    put / tcp, put / mpi);
        }
        fprintf(stderr, "  signal round trip %.1f us (engine's own %.1f us, TCP %.1f us), barrier "
                "%.1f us\n", rtt, ertt, trtt, bar);
        fprintf(stderr, "target: signal round trip <= 1.2 x the engine's own: %.2fx %s\n",
                rtt / ertt, rtt <= 1.2 * ertt ? "met" : "NOT met");
        free(text);
        if (!ok) fprintf(stderr, "bench shmem: some figures are missing from the ranks' output\n");
        return ok ? 0 : 1;
    }
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
