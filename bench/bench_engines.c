/* bench engines: the inter-host engine study (issue 12 item 2, docs/shmem.md "Choosing the
 * engine"). Two ranks on two simulated hosts (megamoe launch --hosts 2 --mpirun), one rank
 * writing to the other, for each candidate:
 *
 *   ucx         UCX UCP directly: ucp_put_nbx (all posted, then one ucp_ep_flush_nbx) into a
 *               registered region; megamoe's UCX configuration (bench_ucx.c);
 *   mpi_rma     MPI-3 RMA: MPI_Put (all posted) + MPI_Win_flush on a passive-target window
 *               (MPI_Win_allocate, MPI_Win_lock_all), with the osc component named by --osc
 *               (one mpirun per component: ucx and pt2pt; Open MPI 5 has no pt2pt: rdma);
 *   two_sided   MPI_Isend to an agent thread on the target that receives (MPI_Probe +
 *               MPI_Recv) into the target's memory and acknowledges a flush message: one-sided
 *               emulated by a progress agent (MPI_THREAD_MULTIPLE, pml ob1, btl tcp);
 *   megamoe     the chosen engine through megamoe: mm_shmem_put + mm_shmem_quiet.
 *
 * Three measurements: bandwidth (64 KiB .. 64 MiB, GB/s of the writer's wall time, and GB per
 * CPU-second of both ranks), the signal round trip (an 8-byte data put + an ordered flag,
 * answered the same way), and progress while the target computes: the target runs bf16 GEMMs
 * (the project's kernels) for 50 ms in its main thread while the writer, 5 ms in, puts 16 MiB
 * and waits for completion; the row says when it completed (ms after the put began; a
 * candidate without progress on the target completes only after the GEMMs end) and how many
 * GEMMs the target finished (against a run without transfer). "ucx+thread" is UCX with a
 * progress thread on the target that sleeps on the worker's event fd, as megamoe's engine.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/cpu.h"
#include "bench_ucx.h"
#include "bench_util.h"
#include "kernels/gemm.h"
#include "shmem/shmem.h"

#ifdef MEGAMOE_HAVE_MPI
#include <mpi.h>

/* The osc components compared by default: Open MPI 5 removed pt2pt; its rdma runs over TCP. */
#if defined(OMPI_MAJOR_VERSION) && OMPI_MAJOR_VERSION >= 5
#define MM_BE_OSCS "ucx,rdma"
#else
#define MM_BE_OSCS "ucx,pt2pt"
#endif

#define MM_BE_BIG (64u << 20)
#define MM_BE_FLAGS 4096          /* flag lines after the data */
#define MM_BE_FLAG_SYNC MM_BE_BIG /* end of a trial */
#define MM_BE_FLAG_PING (MM_BE_BIG + 64)
#define MM_BE_BUSY_BYTES (16u << 20)
#define MM_BE_BUSY_MS 50.0
#define MM_BE_BUSY_START_MS 5.0

enum { MM_BE_UCX, MM_BE_RMA, MM_BE_TWO, MM_BE_MEGAMOE, MM_BE_N };
static const char *const mm_be_names[MM_BE_N] = {"ucx", "mpi_rma", "two_sided", "megamoe"};

static const size_t mm_be_sizes[] = {64u << 10, 256u << 10, 1u << 20, 4u << 20, 16u << 20, 64u << 20};
static const size_t mm_be_sizes_quick[] = {64u << 10, 1u << 20};

/* tags of the two-sided emulation: data tags carry the target offset in 64-byte lines */
#define MM_BE_TAG_FLUSH 0x7ffff0
#define MM_BE_TAG_STOP 0x7ffff1
#define MM_BE_TAG_ACK 1

typedef struct {
    int me, peer, quick, trials;
    unsigned mask; /* candidates to run */
    uint8_t *src;
    /* ucx */
    uint8_t *ucx_region;
    mm_bucx_t *ucx;
    uint64_t ucx_seq;
    /* mpi_rma */
    uint8_t *win_base;
    MPI_Win win;
    int have_win;
    /* two_sided: data and flush on agent_comm (the agent's), acks on reply_comm */
    uint8_t *two_region;
    MPI_Comm agent_comm, reply_comm;
    pthread_t agent;
    int agent_running;
    atomic_uint agent_flushes; /* flush messages the agent answered */
    unsigned flushes_seen;
    /* megamoe */
    uint8_t *mm_dest;
    uint64_t *mm_lines;
    uint64_t mm_seq;
    uint64_t rtt_done[MM_BE_N]; /* round trips so far: the flags' values, the same on both ranks */
    /* GEMM operands of the busy target */
    uint16_t *ga, *gb;
    float *gc;
} mm_be_t;

static double mm_be_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int mm_be_fail(const mm_be_t *b, const char *what)
{
    fprintf(stderr, "bench engines: rank %d: %s failed%s%s\n", b->me, what,
            megamoe_last_error()[0] ? ": " : "", megamoe_last_error());
    return 1;
}

/* ---- two-sided: the agent thread ---- */

static void *mm_be_agent_main(void *arg)
{
    mm_be_t *b = arg;
    for (;;) {
        MPI_Status st;
        int flag = 0;
        /* Open MPI's blocking probe spins inside the library, holding its lock against the
         * rank's own thread on the same core; polling and yielding leaves that thread room */
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, b->agent_comm, &flag, &st);
        if (!flag) {
            sched_yield();
            continue;
        }
        int n = 0;
        MPI_Get_count(&st, MPI_BYTE, &n);
        if (st.MPI_TAG == MM_BE_TAG_STOP || st.MPI_TAG == MM_BE_TAG_FLUSH) {
            char c;
            MPI_Recv(&c, 1, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, b->agent_comm, MPI_STATUS_IGNORE);
            if (st.MPI_TAG == MM_BE_TAG_STOP) break;
            MPI_Send(&c, 1, MPI_BYTE, st.MPI_SOURCE, MM_BE_TAG_ACK, b->reply_comm);
            atomic_fetch_add(&b->agent_flushes, 1);
            continue;
        }
        /* a put: the data lands where the tag says; a flag word is written last by the
         * sender as its own message, so message order gives "data before flag" */
        uint8_t *dst = b->two_region + (size_t)st.MPI_TAG * 64u;
        MPI_Recv(dst, n, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, b->agent_comm, MPI_STATUS_IGNORE);
    }
    return NULL;
}

static void mm_be_agent_start(mm_be_t *b)
{
    if (!b->agent_running && pthread_create(&b->agent, NULL, mm_be_agent_main, b) == 0)
        b->agent_running = 1;
}

static void mm_be_agent_stop(mm_be_t *b)
{
    if (!b->agent_running) return;
    char c = 0;
    MPI_Send(&c, 1, MPI_BYTE, b->me, MM_BE_TAG_STOP, b->agent_comm);
    pthread_join(b->agent, NULL);
    b->agent_running = 0;
}

/* Put n bytes to the peer's region at off (a multiple of 64) through its agent. */
static void mm_be_two_put(mm_be_t *b, const void *src, size_t n, size_t off, MPI_Request *req)
{
    MPI_Isend(src, (int)n, MPI_BYTE, b->peer, (int)(off / 64u), b->agent_comm, req);
}

static void mm_be_two_flush(mm_be_t *b)
{
    char c = 0;
    MPI_Send(&c, 1, MPI_BYTE, b->peer, MM_BE_TAG_FLUSH, b->agent_comm);
    MPI_Recv(&c, 1, MPI_BYTE, b->peer, MM_BE_TAG_ACK, b->reply_comm, MPI_STATUS_IGNORE);
}

/* A barrier during which the raw UCX worker is progressed by its thread: a rank that leaves a
 * UCX phase first must still serve the peer's last operations (on TCP a target progresses for
 * a put to land), and MPI's barrier does not progress our worker. */
static void mm_be_sync(mm_be_t *b)
{
    if (b->ucx) mm_bucx_thread_start(b->ucx);
    MPI_Barrier(MPI_COMM_WORLD);
    if (b->ucx) mm_bucx_thread_stop(b->ucx);
}

/* ---- bandwidth: rank 0 writes, rank 1 is the target ---- */

/* One trial: reps puts of size bytes from rank 0; returns rank 0's seconds (rank 1: 0), and
 * the process CPU seconds of this rank in *cpu_s; < 0 on error. */
static double mm_be_bw_trial(mm_be_t *b, int c, size_t size, long reps, double *cpu_s)
{
    mm_be_sync(b);
    double c0 = mm_be_cpu_s();
    uint64_t t0 = mm_now_ns(), t1 = t0;
    int w = b->me == 0;
    if (c == MM_BE_UCX) {
        b->ucx_seq++;
        if (w) {
            for (long i = 0; i < reps; i++)
                if (mm_bucx_put(b->ucx, b->src, size, 0) != 0) return -1;
            if (mm_bucx_flush(b->ucx) != 0) return -1;
            t1 = mm_now_ns();
            if (mm_bucx_put_flag(b->ucx, MM_BE_FLAG_SYNC, b->ucx_seq, 0) != 0) return -1;
        } else if (mm_bucx_wait_word(b->ucx, (volatile uint64_t *)(b->ucx_region + MM_BE_FLAG_SYNC),
                                     b->ucx_seq, 300) != 0) {
            return -1;
        }
    } else if (c == MM_BE_RMA) {
        if (w) {
            for (long i = 0; i < reps; i++)
                MPI_Put(b->src, (int)size, MPI_BYTE, b->peer, 0, (int)size, MPI_BYTE, b->win);
            MPI_Win_flush(b->peer, b->win);
            t1 = mm_now_ns();
        }
        MPI_Barrier(MPI_COMM_WORLD); /* the target progresses in here */
    } else if (c == MM_BE_TWO) {
        if (w) {
            MPI_Request *rq = malloc(sizeof *rq * (size_t)reps);
            for (long i = 0; i < reps; i++) mm_be_two_put(b, b->src, size, 0, &rq[i]);
            mm_be_two_flush(b);
            MPI_Waitall((int)reps, rq, MPI_STATUSES_IGNORE);
            t1 = mm_now_ns();
            free(rq);
        } else {
            /* the target's own thread does not call MPI meanwhile (it would compete with the
             * agent for Open MPI's lock on this core): it sleeps until the agent saw the flush */
            b->flushes_seen++;
            while (atomic_load(&b->agent_flushes) < b->flushes_seen) mm_sleep_ns(50000);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    } else {
        b->mm_seq++;
        if (w) {
            for (long i = 0; i < reps; i++)
                if (mm_shmem_put(b->mm_dest, b->src, size, b->peer) != MEGAMOE_OK) return -1;
            if (mm_shmem_quiet() != MEGAMOE_OK) return -1;
            t1 = mm_now_ns();
            if (mm_shmem_signal_op(&b->mm_lines[0], b->mm_seq, MM_SHMEM_SIGNAL_SET, b->peer) != MEGAMOE_OK)
                return -1;
        } else if (mm_shmem_signal_wait_until(&b->mm_lines[0], MM_SHMEM_CMP_GE, b->mm_seq, NULL) != MEGAMOE_OK) {
            return -1;
        }
    }
    *cpu_s = mm_be_cpu_s() - c0;
    return (double)(t1 - t0) * 1e-9;
}

/* ---- signal round trip: 8-byte data + flag each way ---- */

/* Wait for a word of the window that a peer's MPI_Put sets; MPI_Iprobe drives MPI's progress
 * (a passive target must progress for osc pt2pt, and for osc ucx on TCP). */
static void mm_be_rma_wait(mm_be_t *b, volatile uint64_t *word, uint64_t want)
{
    int flag;
    for (;;) {
        MPI_Win_sync(b->win);
        if (*word >= want) return;
        MPI_Iprobe(MPI_ANY_SOURCE, 999, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    }
}

static double mm_be_rtt_trial(mm_be_t *b, int c, long iters)
{
    static uint64_t data[2];
    mm_be_sync(b);
    uint64_t t0 = mm_now_ns();
    int first = b->me == 0;
    if (c == MM_BE_UCX) {
        volatile uint64_t *mine = (volatile uint64_t *)(b->ucx_region + MM_BE_FLAG_PING);
        uint64_t base = b->rtt_done[c];
        for (long i = 1; i <= iters; i++) {
            if (!first && mm_bucx_wait_word(b->ucx, mine, base + i, 120) != 0) return -1;
            data[0] = base + i;
            if (mm_bucx_put(b->ucx, data, 8, 4096) != 0 ||
                mm_bucx_put_flag(b->ucx, MM_BE_FLAG_PING, base + i, 1) != 0)
                return -1;
            if (first && mm_bucx_wait_word(b->ucx, mine, base + i, 120) != 0) return -1;
        }
    } else if (c == MM_BE_RMA) {
        volatile uint64_t *mine = (volatile uint64_t *)(b->win_base + MM_BE_FLAG_PING);
        uint64_t base = b->rtt_done[c];
        for (long i = 1; i <= iters; i++) {
            uint64_t want = base + i;
            if (!first) mm_be_rma_wait(b, mine, want);
            data[0] = data[1] = want;
            MPI_Put(&data[0], 8, MPI_BYTE, b->peer, 4096, 8, MPI_BYTE, b->win);
            MPI_Win_flush(b->peer, b->win); /* MPI orders nothing between two puts */
            MPI_Put(&data[1], 8, MPI_BYTE, b->peer, MM_BE_FLAG_PING, 8, MPI_BYTE, b->win);
            MPI_Win_flush(b->peer, b->win);
            if (first) mm_be_rma_wait(b, mine, want);
        }
    } else if (c == MM_BE_TWO) {
        volatile uint64_t *mine = (volatile uint64_t *)(b->two_region + MM_BE_FLAG_PING);
        uint64_t base = b->rtt_done[c];
        for (long i = 1; i <= iters; i++) {
            uint64_t want = base + i;
            while (!first && *mine < want) sched_yield();
            data[0] = want;
            data[1] = want;
            MPI_Request rq[2];
            mm_be_two_put(b, &data[0], 8, 4096, &rq[0]);
            mm_be_two_put(b, &data[1], 8, MM_BE_FLAG_PING, &rq[1]); /* message order */
            MPI_Waitall(2, rq, MPI_STATUSES_IGNORE);
            while (first && *mine < want) sched_yield();
        }
    } else {
        uint64_t *sig = &b->mm_lines[8];
        uint64_t base = b->rtt_done[c];
        for (long i = 1; i <= iters; i++) {
            uint64_t want = base + i;
            if (!first && mm_shmem_signal_wait_until(sig, MM_SHMEM_CMP_GE, want, NULL) != MEGAMOE_OK)
                return -1;
            data[0] = want;
            if (mm_shmem_put_signal(b->mm_dest + 4096, data, 8, sig, want, MM_SHMEM_SIGNAL_SET,
                                    b->peer) != MEGAMOE_OK)
                return -1;
            if (first && mm_shmem_signal_wait_until(sig, MM_SHMEM_CMP_GE, want, NULL) != MEGAMOE_OK)
                return -1;
        }
    }
    double us = (double)(mm_now_ns() - t0) * 1e-3 / (double)iters;
    b->rtt_done[c] += (uint64_t)iters;
    mm_be_sync(b);
    return us;
}

/* ---- progress while the target computes ---- */

/* GEMMs on the calling thread for ms milliseconds of wall time; returns how many. */
static int mm_be_gemms(mm_be_t *b, double ms)
{
    mm_gemm_args_t g;
    mm_gemm_args_init(&g);
    g.form = MM_GEMM_NN;
    g.M = 128;
    g.N = 512;
    g.K = 512;
    g.A = b->ga;
    g.lda = 512;
    g.B = b->gb;
    g.ldb = 512;
    g.C = b->gc;
    g.ldc = 512;
    g.c_type = MEGAMOE_DTYPE_FP32;
    uint64_t end = mm_now_ns() + (uint64_t)(ms * 1e6);
    int n = 0;
    do {
        if (mm_gemm(&g) != MEGAMOE_OK) return -1;
        n++;
    } while (mm_now_ns() < end);
    return n;
}

/* One run: c < 0 = no transfer (the GEMM count alone); thread: ucx with the target's progress
 * thread; idle: the target waits for the data at once instead of computing first (the
 * transfer time without the GEMMs). Rank 0 gets (completion ms after its put began, target
 * GEMM count). */
static double mm_be_gemm_ms = MM_BE_BUSY_MS;

static int mm_be_busy_trial(mm_be_t *b, int c, int thread, int idle, double *done_ms, int *gemms)
{
    if (c == MM_BE_TWO && b->me == 1) mm_be_agent_start(b);
    mm_be_sync(b);
    if (c == MM_BE_UCX && thread && b->me == 1 && mm_bucx_thread_start(b->ucx) != 0) return -1;
    uint64_t t0 = mm_now_ns();
    double ms = 0;
    int n = 0;
    if (b->me == 1) {
        n = idle ? 0 : mm_be_gemms(b, mm_be_gemm_ms);
        if (c == MM_BE_UCX && thread) mm_bucx_thread_stop(b->ucx);
        b->ucx_seq++;
        if (c == MM_BE_UCX &&
            mm_bucx_wait_word(b->ucx, (volatile uint64_t *)(b->ucx_region + MM_BE_FLAG_SYNC),
                              b->ucx_seq, 120) != 0)
            return -1;
        b->mm_seq++;
        if (c == MM_BE_MEGAMOE &&
            mm_shmem_signal_wait_until(&b->mm_lines[0], MM_SHMEM_CMP_GE, b->mm_seq, NULL) != MEGAMOE_OK)
            return -1;
        if (c == MM_BE_TWO) { /* as in the bandwidth trial: sleep until the agent saw it all */
            b->flushes_seen++;
            while (atomic_load(&b->agent_flushes) < b->flushes_seen) mm_sleep_ns(50000);
        }
    } else {
        while (mm_now_ns() - t0 < (uint64_t)(MM_BE_BUSY_START_MS * 1e6)) {
        }
        uint64_t t1 = mm_now_ns();
        b->ucx_seq++;
        b->mm_seq++;
        if (c == MM_BE_UCX) {
            if (mm_bucx_put(b->ucx, b->src, MM_BE_BUSY_BYTES, 0) != 0 || mm_bucx_flush(b->ucx) != 0)
                return -1;
            ms = (double)(mm_now_ns() - t1) * 1e-6;
            if (mm_bucx_put_flag(b->ucx, MM_BE_FLAG_SYNC, b->ucx_seq, 0) != 0) return -1;
        } else if (c == MM_BE_RMA) {
            MPI_Put(b->src, MM_BE_BUSY_BYTES, MPI_BYTE, b->peer, 0, MM_BE_BUSY_BYTES, MPI_BYTE, b->win);
            MPI_Win_flush(b->peer, b->win);
            ms = (double)(mm_now_ns() - t1) * 1e-6;
        } else if (c == MM_BE_TWO) {
            MPI_Request rq;
            mm_be_two_put(b, b->src, MM_BE_BUSY_BYTES, 0, &rq);
            mm_be_two_flush(b);
            MPI_Wait(&rq, MPI_STATUS_IGNORE);
            ms = (double)(mm_now_ns() - t1) * 1e-6;
        } else if (c == MM_BE_MEGAMOE) {
            if (mm_shmem_put(b->mm_dest, b->src, MM_BE_BUSY_BYTES, b->peer) != MEGAMOE_OK ||
                mm_shmem_quiet() != MEGAMOE_OK)
                return -1;
            ms = (double)(mm_now_ns() - t1) * 1e-6;
            if (mm_shmem_signal_op(&b->mm_lines[0], b->mm_seq, MM_SHMEM_SIGNAL_SET, b->peer) != MEGAMOE_OK)
                return -1;
        }
    }
    mm_be_sync(b);
    if (c == MM_BE_TWO && b->me == 1) mm_be_agent_stop(b);
    int got = 0;
    if (b->me == 1) MPI_Send(&n, 1, MPI_INT, 0, 7, MPI_COMM_WORLD);
    else MPI_Recv(&got, 1, MPI_INT, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    *done_ms = ms;
    *gemms = got;
    return 0;
}

/* ---- the worker ---- */

static int mm_be_setup(mm_be_t *b)
{
    size_t region = MM_BE_BIG + MM_BE_FLAGS;
    if (mm_aligned_alloc(MM_BE_BIG, 4096, "source", (void **)&b->src) != MEGAMOE_OK) return 1;
    memset(b->src, b->me + 1, MM_BE_BIG);
    if (b->mask & (1u << MM_BE_RMA)) {
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        if (MPI_Win_allocate((MPI_Aint)region, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &b->win_base,
                             &b->win) != MPI_SUCCESS) {
            fprintf(stderr, "bench engines: MPI_Win_allocate failed (the osc component cannot "
                    "make a window here)\n");
            return 1;
        }
        memset(b->win_base, 0, region);
        MPI_Win_lock_all(0, b->win);
        b->have_win = 1;
    }
    if (b->mask & (1u << MM_BE_TWO)) {
        if (mm_aligned_calloc(region, 4096, "two-sided region", (void **)&b->two_region) != MEGAMOE_OK)
            return 1;
        MPI_Comm_dup(MPI_COMM_WORLD, &b->agent_comm);
        MPI_Comm_dup(MPI_COMM_WORLD, &b->reply_comm);
    }
    if (b->mask & (1u << MM_BE_MEGAMOE)) {
        mm_shmem_params_t p = mm_shmem_params_default();
        p.rank = b->me;
        p.world_size = 2;
        p.heap_size = MM_BE_BIG + (16u << 20);
        if (mm_shmem_acquire(&p) != MEGAMOE_OK) return mm_be_fail(b, "SHMEM start-up");
        if (!mm_shmem_pe_remote(b->peer))
            fprintf(stderr, "bench engines: the peer is on this host: megamoe maps it (run with "
                    "--hosts 2 or MEGAMOE_SHMEM_INTRA_HOST=engine)\n");
        if (mm_shmem_calloc(region, 4096, (void **)&b->mm_dest) != MEGAMOE_OK ||
            mm_shmem_calloc(2 * 64, 64, (void **)&b->mm_lines) != MEGAMOE_OK)
            return mm_be_fail(b, "SHMEM allocation");
    }
    if (b->mask & (1u << MM_BE_UCX)) {
        if (mm_aligned_calloc(region, 4096, "ucx region", (void **)&b->ucx_region) != MEGAMOE_OK)
            return 1;
        b->ucx = mm_bucx_create("eth0", b->ucx_region, region);
        if (b->ucx == NULL) return 1;
        enum { BLOB = 4096 };
        uint8_t *mine = calloc(1, BLOB), *all = calloc(2, BLOB);
        uint32_t len = (uint32_t)mm_bucx_blob(b->ucx, mine + 4, BLOB - 4);
        memcpy(mine, &len, 4);
        MPI_Allgather(mine, BLOB, MPI_BYTE, all, BLOB, MPI_BYTE, MPI_COMM_WORLD);
        memcpy(&len, all + (size_t)b->peer * BLOB, 4);
        int rc = mm_bucx_connect(b->ucx, all + (size_t)b->peer * BLOB + 4, len);
        free(mine);
        free(all);
        if (rc != 0) return 1;
        mm_be_sync(b); /* the peer's wire-up may still need this rank's progress */
    }
    if (mm_aligned_calloc(128 * 512 * 2, 64, "gemm a", (void **)&b->ga) != MEGAMOE_OK ||
        mm_aligned_calloc(512 * 512 * 2, 64, "gemm b", (void **)&b->gb) != MEGAMOE_OK ||
        mm_aligned_calloc(128 * 512 * 4, 64, "gemm c", (void **)&b->gc) != MEGAMOE_OK)
        return 1;
    for (int i = 0; i < 128 * 512; i++) b->ga[i] = megamoe_fp32_to_bf16((float)(i % 7) * 0.1f);
    for (int i = 0; i < 512 * 512; i++) b->gb[i] = megamoe_fp32_to_bf16((float)(i % 5) * 0.1f);
    return 0;
}

static void mm_be_teardown(mm_be_t *b)
{
    if (b->ucx) {
        mm_bucx_thread_start(b->ucx); /* the peer may still need this side's progress */
        MPI_Barrier(MPI_COMM_WORLD);
        mm_bucx_destroy(b->ucx);
    }
    if (b->have_win) {
        MPI_Win_unlock_all(b->win);
        MPI_Win_free(&b->win);
    }
    if (b->mm_dest) {
        mm_shmem_free(b->mm_dest);
        mm_shmem_free(b->mm_lines);
        mm_shmem_release();
    }
    if (b->two_region) {
        MPI_Comm_free(&b->agent_comm);
        MPI_Comm_free(&b->reply_comm);
    }
    mm_aligned_free(b->two_region);
    mm_aligned_free(b->ucx_region);
    mm_aligned_free(b->src);
    mm_aligned_free(b->ga);
    mm_aligned_free(b->gb);
    mm_aligned_free(b->gc);
}

static int mm_be_worker(unsigned mask, int quick)
{
    int prov = 0;
    /* the agent needs MPI_THREAD_MULTIPLE, which osc pt2pt refuses: its run asks for less */
    int want = (mask & (1u << MM_BE_TWO)) ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE;
    MPI_Init_thread(NULL, NULL, want, &prov);
    mm_be_t b;
    memset(&b, 0, sizeof b);
    MPI_Comm_rank(MPI_COMM_WORLD, &b.me);
    b.peer = 1 - b.me;
    b.mask = mask;
    b.quick = quick;
    b.trials = quick ? 2 : 7;
    if ((mask & (1u << MM_BE_TWO)) && prov < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "bench engines: MPI gives thread level %d, the agent needs "
                "MPI_THREAD_MULTIPLE\n", prov);
        b.mask &= ~(1u << MM_BE_TWO);
    }
    cpu_set_t set; /* mpirun binds too; this keeps the ranks on different cores without it */
    CPU_ZERO(&set);
    CPU_SET(b.me % mm_cpu_count(), &set);
    sched_setaffinity(0, sizeof set, &set);
    int rc = mm_be_setup(&b);
    int all = 0;
    MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (all) {
        MPI_Finalize();
        return 1;
    }
    const size_t *sizes = quick ? mm_be_sizes_quick : mm_be_sizes;
    int n_sizes = quick ? 2 : 6;
    size_t trial_bytes = quick ? 4u << 20 : 32u << 20;
    double *gb = malloc(sizeof(double) * (size_t)b.trials), *eff = malloc(sizeof(double) * (size_t)b.trials);
    for (int c = 0; c < MM_BE_N && rc == 0; c++) {
        if (!(b.mask & (1u << c))) continue;
        if (c == MM_BE_TWO && b.me == 1) mm_be_agent_start(&b);
        for (int s = 0; s < n_sizes && rc == 0; s++) {
            size_t size = sizes[s];
            long reps = (long)(trial_bytes / size);
            if (reps < 2) reps = 2;
            double cpu = 0;
            if (mm_be_bw_trial(&b, c, size, 2, &cpu) < 0) rc = 1; /* warm-up */
            for (int t = 0; t < b.trials && rc == 0; t++) {
                double dt = mm_be_bw_trial(&b, c, size, reps, &cpu), both = 0;
                if (dt < 0) {
                    fprintf(stderr, "bench engines: rank %d: the %s bandwidth trial failed\n", b.me,
                            mm_be_names[c]);
                    rc = 1;
                }
                MPI_Reduce(&cpu, &both, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
                gb[t] = (double)size * (double)reps / (dt > 0 ? dt : 1e-9) * 1e-9;
                eff[t] = (double)size * (double)reps / (both > 1e-9 ? both : 1e-9) * 1e-9;
            }
            if (b.me == 0 && rc == 0)
                printf("bw %s %zu %.4f %.4f\n", mm_be_names[c], size, mm_bench_median_of(gb, b.trials),
                       mm_bench_median_of(eff, b.trials));
            fflush(stdout);
        }
        if (c == MM_BE_TWO) mm_be_agent_stop(&b);
    }
    /* round trips */
    long iters = quick ? 20 : 300;
    for (int c = 0; c < MM_BE_N && rc == 0; c++) {
        if (!(b.mask & (1u << c))) continue;
        if (c == MM_BE_TWO) mm_be_agent_start(&b);
        for (int t = 0; t < b.trials && rc == 0; t++) {
            gb[t] = mm_be_rtt_trial(&b, c, iters);
            if (gb[t] < 0) {
                fprintf(stderr, "bench engines: rank %d: the %s round trip failed\n", b.me, mm_be_names[c]);
                rc = 1;
            }
        }
        if (c == MM_BE_TWO) {
            MPI_Barrier(MPI_COMM_WORLD);
            mm_be_agent_stop(&b);
        }
        if (b.me == 0 && rc == 0) printf("rtt %s %.2f\n", mm_be_names[c], mm_bench_median_of(gb, b.trials));
        fflush(stdout);
    }
    /* progress while the target computes: the GEMM count alone first */
    for (int c = -1; c < MM_BE_N + 1 && rc == 0; c++) {
        int cand = c == MM_BE_N ? MM_BE_UCX : c, thread = c == MM_BE_N;
        if (cand >= 0 && !(b.mask & (1u << cand))) continue;
        double *ms = gb, *idle_ms = eff;
        double gem[16];
        for (int t = 0; t < b.trials && rc == 0; t++) {
            int n = 0;
            if (mm_be_busy_trial(&b, cand, thread, 0, &ms[t], &n) != 0 ||
                (cand >= 0 && mm_be_busy_trial(&b, cand, thread, 1, &idle_ms[t], &(int){0}) != 0)) {
                fprintf(stderr, "bench engines: rank %d: the busy-target run of %s failed\n", b.me,
                        cand < 0 ? "none" : mm_be_names[cand]);
                rc = 1;
            }
            if (cand < 0) idle_ms[t] = 0;
            gem[t] = n;
        }
        if (b.me == 0 && rc == 0)
            printf("busy %s %.2f %.0f %.2f\n", c < 0 ? "none" : thread ? "ucx+thread" : mm_be_names[cand],
                   mm_bench_median_of(ms, b.trials), mm_bench_median_of(gem, b.trials),
                   mm_bench_median_of(idle_ms, b.trials));
        fflush(stdout);
    }
    free(gb);
    free(eff);
    if (rc) fprintf(stderr, "bench engines: rank %d: a measurement failed\n", b.me);
    mm_be_teardown(&b);
    MPI_Finalize();
    return rc;
}

/* ---- the driver ---- */

static int mm_be_run_job(const char *hosts, const char *osc, const char *cands, int quick,
                         const char *gemm_ms, const char *out_path)
{
    const char *self = mm_bench_self_exe();
    char *av[64] = {(char *)self, "launch", "--hosts", (char *)hosts, "--mpirun", "-n", "2",
                    "--mpi-arg", "--bind-to", "--mpi-arg", "core", "--mpi-arg", "--mca",
                    "--mpi-arg", "osc", "--mpi-arg", (char *)osc,
                    /* UCX (osc ucx, and ours) on the network, not its shared-memory transports,
                     * with megamoe's TCP segment sizes for every UCX user (engine_ucx.c) */
                    "--mpi-arg", "-x", "--mpi-arg", "UCX_TLS=^sm", "--mpi-arg", "-x", "--mpi-arg",
                    "UCX_TCP_TX_SEG_SIZE=64k", "--mpi-arg", "-x", "--mpi-arg",
                    "UCX_TCP_RX_SEG_SIZE=256k",
                    /* UCX >= 1.16's protocols v2 have no software atomics over TCP (engine_ucx.c) */
                    "--mpi-arg", "-x", "--mpi-arg", "UCX_PROTO_ENABLE=n",
                    /* Open MPI 5's osc ucx declines devices other than mlx* unless told */
                    "--mpi-arg", "--mca", "--mpi-arg", "osc_ucx_tls", "--mpi-arg", "any",
                    "--mpi-arg", "--mca", "--mpi-arg", "osc_ucx_devices", "--mpi-arg", "any",
                    "--timeout", "1200", "--",
                    (char *)self, "bench", "engines", "--worker", (char *)cands, "--gemm-ms",
                    (char *)gemm_ms};
    int n = 55;
    if (quick) av[n++] = "--quick";
    av[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = freopen(out_path, "a", stdout);
        (void)f;
        execv(self, av);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static unsigned mm_be_mask(const char *list)
{
    unsigned m = 0;
    for (int c = 0; c < MM_BE_N; c++) {
        const char *p = strstr(list, mm_be_names[c]);
        size_t l = strlen(mm_be_names[c]);
        if (p && (p == list || p[-1] == ',') && (p[l] == ',' || p[l] == '\0')) m |= 1u << c;
    }
    return m;
}

/* "<key> ... " lines of the job's output (after the launcher's "[mpirun @host] " prefix). */
static const char *mm_be_line(const char *text, const char *key, const char *name, const char **end)
{
    char k[64];
    snprintf(k, sizeof k, "%s %s ", key, name);
    for (const char *p = text; (p = strstr(p, k)) != NULL; p++)
        if (p == text || p[-1] == '\n' || p[-1] == ' ') {
            *end = p + strlen(k);
            return p;
        }
    return NULL;
}

static int mm_be_main(int argc, char **argv)
{
    int quick = mm_bench_flag(argc, argv, "--quick");
    const char *worker = mm_bench_opt(argc, argv, "--worker", NULL);
    mm_be_gemm_ms = atof(mm_bench_opt(argc, argv, "--gemm-ms", "50"));
    if (worker) return mm_be_worker(mm_be_mask(worker), quick);
    const char *hosts = mm_bench_opt(argc, argv, "--hosts", "2");
    const char *oscs = mm_bench_opt(argc, argv, "--osc", MM_BE_OSCS);
    const char *impls = mm_bench_opt(argc, argv, "--impls", "ucx,mpi_rma,two_sided,megamoe");
    const char *gemm_ms = mm_bench_opt(argc, argv, "--gemm-ms", "50");
    if (atof(gemm_ms) < 1 || atof(gemm_ms) > 5000) {
        fprintf(stderr, "bench engines: --gemm-ms takes 1..5000, got '%s'\n", gemm_ms);
        return 2;
    }
    if (mm_bench_flag(argc, argv, "--help")) {
        printf("usage: megamoe bench engines [--hosts 2] [--quick] [--osc " MM_BE_OSCS "]\n"
               "       [--impls ucx,mpi_rma,two_sided,megamoe] [--gemm-ms 50]\n"
               "The inter-host engine study: UCX UCP put + flush, MPI-3 RMA (MPI_Put +\n"
               "MPI_Win_flush, passive target, one run per osc component), two-sided MPI with a\n"
               "progress agent, and megamoe's engine, between two ranks on two simulated hosts\n"
               "(megamoe launch --hosts 2 --mpirun; root): bandwidth 64 KiB .. 64 MiB, the\n"
               "signal round trip (8-byte put + flag), and when a 16 MiB put completes while\n"
               "the target runs 50 ms (--gemm-ms) of bf16 GEMMs, beside the same put to an idle\n"
               "target (put_idle_ms).\n");
        return 0;
    }
    if (atoi(hosts) != 2 && atoi(hosts) != 1) {
        fprintf(stderr, "bench engines: --hosts must be 1 or 2 (two ranks), got '%s'\n", hosts);
        return 2;
    }
    char dir[] = "/tmp/megamoe-bench-engines-XXXXXX";
    if (mkdtemp(dir) == NULL) return 1;
    char out[256];
    snprintf(out, sizeof out, "%s/out.txt", dir);
    char list[64];
    snprintf(list, sizeof list, "%s", oscs);
    int rc = 0, step = 0;
    char *osc_names[4];
    int n_osc = 0;
    for (char *t = strtok(list, ","); t && n_osc < 4; t = strtok(NULL, ",")) osc_names[n_osc++] = t;
    /* The runs: [0] every candidate but two_sided with the first osc, [1, n_osc) MPI RMA alone
     * with each other osc (osc pt2pt refuses MPI_THREAD_MULTIPLE), [n_osc] two_sided alone: its
     * agent needs MPI_THREAD_MULTIPLE, with which Open MPI 5's osc ucx progresses UCX from the
     * agent's thread and trips UCX 1.18's owner-thread assertion (Debian 13). */
    char first[96] = "", texts[5][8192];
    for (const char *p = impls; *p;) {
        size_t len = strcspn(p, ",");
        if (!(len == 9 && !strncmp(p, "two_sided", 9)) && len < sizeof first - strlen(first) - 1)
            snprintf(first + strlen(first), sizeof first - strlen(first), "%s%.*s",
                     first[0] ? "," : "", (int)len, p);
        p += len + (p[len] == ',');
    }
    const int two_run = n_osc > 0 && (mm_be_mask(impls) & (1u << MM_BE_TWO)) ? n_osc : -1;
    const int n_runs = n_osc + (two_run >= 0);
    for (int i = 0; i < n_runs; i++) {
        const char *cands = i == two_run ? "two_sided" : i == 0 ? first : "mpi_rma";
        const char *osc = i == two_run ? osc_names[0] : osc_names[i];
        texts[i][0] = '\0';
        if (!cands[0]) continue;
        char label[192];
        snprintf(label, sizeof label, "osc %s: %s", osc, cands);
        mm_bench_progress(++step, n_runs, label);
        unlink(out);
        int r = mm_be_run_job(hosts, osc, cands, quick, gemm_ms, out);
        if (r != 0) {
            fprintf(stderr, "bench engines: the run of %s with osc %s failed (status %d)\n", cands,
                    osc, r);
            rc = 1;
        }
        FILE *f = fopen(out, "r");
        if (f) {
            size_t n = fread(texts[i], 1, sizeof texts[i] - 1, f);
            texts[i][n] = '\0';
            fclose(f);
        }
    }
    unlink(out);
    rmdir(dir);
    mm_bench_begin("engines");
    const size_t *sizes = quick ? mm_be_sizes_quick : mm_be_sizes;
    int n_sizes = quick ? 2 : 6;
    static const char *const busy_names[] = {"none", "ucx", "ucx+thread", "mpi_rma", "two_sided", "megamoe"};
    for (int i = 0; i < n_runs; i++) {
        const char *t = texts[i];
        const char *osc = i == two_run ? osc_names[0] : osc_names[i];
        for (int c = 0; c < MM_BE_N; c++) {
            if (i == two_run ? c != MM_BE_TWO : (i > 0 && c != MM_BE_RMA)) continue;
            char impl[48];
            snprintf(impl, sizeof impl, "%s", mm_be_names[c]);
            for (int s = 0; s < n_sizes; s++) {
                char nm[64];
                const char *e;
                snprintf(nm, sizeof nm, "%s %zu", mm_be_names[c], sizes[s]);
                if (!mm_be_line(t, "bw", nm, &e)) continue;
                double g = 0, eff = 0;
                sscanf(e, "%lf %lf", &g, &eff);
                mm_bench_row();
                mm_bench_str("measure", "bandwidth");
                mm_bench_str("impl", impl);
                mm_bench_int("hosts", atoi(hosts));
                if (c == MM_BE_RMA || c == MM_BE_TWO) mm_bench_str("osc", osc);
                mm_bench_int("size_bytes", (long long)sizes[s]);
                mm_bench_num("GBps", g);
                mm_bench_num("GB_per_cpu_s", eff);
            }
            const char *e;
            if (mm_be_line(t, "rtt", mm_be_names[c], &e)) {
                mm_bench_row();
                mm_bench_str("measure", "signal_rtt");
                mm_bench_str("impl", impl);
                mm_bench_int("hosts", atoi(hosts));
                if (c == MM_BE_RMA || c == MM_BE_TWO) mm_bench_str("osc", osc);
                mm_bench_num("us", strtod(e, NULL));
            }
        }
        for (size_t k = 0; k < sizeof busy_names / sizeof busy_names[0]; k++) {
            const char *e;
            if (i == two_run ? strcmp(busy_names[k], "two_sided") != 0
                             : i > 0 && strcmp(busy_names[k], "mpi_rma") != 0)
                continue;
            if (!mm_be_line(t, "busy", busy_names[k], &e)) continue;
            double ms = 0, gemms = 0, idle = 0;
            sscanf(e, "%lf %lf %lf", &ms, &gemms, &idle);
            mm_bench_row();
            mm_bench_str("measure", "busy_target");
            mm_bench_str("impl", busy_names[k]);
            mm_bench_int("hosts", atoi(hosts));
            if (!strcmp(busy_names[k], "mpi_rma") || !strcmp(busy_names[k], "two_sided"))
                mm_bench_str("osc", osc);
            mm_bench_int("size_bytes", k == 0 ? 0 : MM_BE_BUSY_BYTES);
            mm_bench_num("put_done_ms", k == 0 ? 0.0 / 0.0 : ms);
            mm_bench_num("put_idle_ms", k == 0 ? 0.0 / 0.0 : idle);
            mm_bench_num("gemm_ms", atof(gemm_ms));
            mm_bench_num("put_start_ms", MM_BE_BUSY_START_MS);
            mm_bench_num("target_gemms", gemms);
        }
    }
    mm_bench_end();
    return rc;
}

#else /* without MPI there is no MPI to compare with */

static int mm_be_main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "bench engines: built without MPI (MEGAMOE_WITH_MPI=OFF): the study compares "
            "MPI with UCX and needs it\n");
    return 2;
}

#endif

const mm_bench_def_t mm_bench_engines_def = {
    "engines", "inter-host engine study: UCX, MPI RMA, two-sided MPI, megamoe (2 hosts)",
    mm_be_main};
