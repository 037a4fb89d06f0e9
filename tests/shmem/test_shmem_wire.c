/* The inter-host engine's data path at the wire (run under `megamoe launch -n 3` with
 * MEGAMOE_SHMEM_INTRA_HOST=engine, once per protocol): coalesced row puts arrive with their
 * signal and in few messages, puts of several threads are covered by another thread's signal,
 * overlapping puts land in issue order (small ones coalesced, large ones chunked), a barrier
 * makes puts to any member visible without a signal, messages delivered out of order (test
 * seam) still apply in the source's order, and ranks with different protocols are refused. */
#include <stdio.h>
#include <stdlib.h>

#include <time.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "shmem/engine_test.h"
#include "shmem/shmem_internal.h"
#include "shmem/survive.h"
#include "shmem_test_util.h"

#define MM_ROWS 2000
#define MM_ROW 1000            /* odd: rows do not line up with anything */
#define MM_BIG (3u << 20)      /* above the staging limit: chunked zero-copy messages */

static int mm_am_protocol(void)
{
    const char *p = getenv("MEGAMOE_SHMEM_ENGINE_PROTOCOL");
    return p == NULL || *p == '\0' || strcmp(p, "am") == 0;
}

static uint64_t mm_messages(void)
{
    mm_shmem_engine_stats_t s;
    mm_shmem_engine_stats(&s);
    return s.messages;
}

/* Rank r sends rows to r+1: consecutive rows, then rows in a permuted order, each with an
 * 8-byte stamp in its slot's last bytes (the combine's pattern), one signal after each part. */
static void mm_rows_round(uint64_t tag, int check_messages)
{
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes(), next = (me + 1) % n, prev = (me + n - 1) % n;
    const size_t slot = MM_ROW + 24;
    uint8_t *recv = NULL, *src = malloc((size_t)MM_ROWS * MM_ROW);
    uint64_t *sig = NULL;
    ASSERT_OK(mm_shmem_calloc((size_t)MM_ROWS * slot, 64, (void **)&recv));
    ASSERT_OK(mm_shmem_calloc(64, 64, (void **)&sig));
    mm_t_fill(src, (size_t)MM_ROWS * MM_ROW, me, tag);
    uint64_t m0 = mm_messages();
    for (int r = 0; r < MM_ROWS; r++)
        ASSERT_OK(mm_shmem_put(recv + (size_t)r * MM_ROW, src + (size_t)r * MM_ROW, MM_ROW, next));
    ASSERT_OK(mm_shmem_signal_op(sig, 1, MM_SHMEM_SIGNAL_ADD, next));
    ASSERT_OK(mm_shmem_signal_wait_until(sig, MM_SHMEM_CMP_GE, 1, NULL));
    long bad = mm_t_check(recv, (size_t)MM_ROWS * MM_ROW, prev, tag);
    if (bad >= 0) MM_FAIL_("consecutive rows: byte %ld from rank %d wrong", bad, prev);
    ASSERT_OK(mm_shmem_barrier_all()); /* recv is reused below */
    uint64_t m1 = mm_messages();
    for (int i = 0; i < MM_ROWS; i++) {
        int r = (int)(((uint64_t)i * 1237u) % MM_ROWS); /* a permutation: 1237 is prime */
        uint8_t *to = recv + (size_t)r * slot;
        uint64_t stamp = tag * 100000u + (uint64_t)r;
        ASSERT_OK(mm_shmem_put(to, src + (size_t)r * MM_ROW, MM_ROW, next));
        ASSERT_OK(mm_shmem_put(to + slot - 8, &stamp, 8, next));
    }
    uint64_t one = 7;
    ASSERT_OK(mm_shmem_put_signal(recv + slot - 16, &one, 8, sig, 2, MM_SHMEM_SIGNAL_SET, next));
    uint64_t m2 = mm_messages();
    ASSERT_OK(mm_shmem_signal_wait_until(sig, MM_SHMEM_CMP_EQ, 2, NULL));
    uint8_t *want = malloc((size_t)MM_ROWS * MM_ROW);
    mm_t_fill(want, (size_t)MM_ROWS * MM_ROW, prev, tag);
    for (int r = 0; r < MM_ROWS; r++) {
        const uint8_t *got = recv + (size_t)r * slot;
        if (memcmp(got, want + (size_t)r * MM_ROW, MM_ROW) != 0)
            MM_FAIL_("permuted rows: row %d from rank %d wrong", r, prev);
        uint64_t stamp;
        memcpy(&stamp, got + slot - 8, 8);
        ASSERT_EQ_U64(stamp, tag * 100000u + (uint64_t)r);
    }
    uint64_t seven;
    memcpy(&seven, recv + slot - 16, 8);
    ASSERT_EQ_U64(seven, 7);
    if (check_messages && mm_am_protocol()) {
        /* 2 MB in rows of 1000 bytes: messages of up to 256 KiB, the signal in the last */
        ASSERT_LE_INT((long long)(m1 - m0), 16);
        /* 4000 pieces (rows and stamps), 256 per message at most */
        ASSERT_LE_INT((long long)(m2 - m1), 40);
    }
    free(want);
    free(src);
    ASSERT_OK(mm_shmem_barrier_all());
    ASSERT_OK(mm_shmem_free(recv));
    ASSERT_OK(mm_shmem_free(sig));
}

MM_TEST(coalesced_rows_arrive_with_their_signal)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    ASSERT_TRUE(mm_shmem_pe_remote((mm_shmem_my_pe() + 1) % mm_shmem_n_pes()));
    for (uint64_t tag = 1; tag <= 3; tag++) mm_rows_round(tag, 1);
    ASSERT_OK(mm_shmem_release());
}

typedef struct {
    uint8_t *recv;
    const uint8_t *src;
    int t, nt, pe;
    megamoe_status_t st;
} mm_thread_job_t;

static void *mm_thread_rows(void *arg)
{
    mm_thread_job_t *j = arg;
    for (int r = j->t; r < MM_ROWS && j->st == MEGAMOE_OK; r += j->nt)
        j->st = mm_shmem_put(j->recv + (size_t)r * MM_ROW, j->src + (size_t)r * MM_ROW, MM_ROW,
                             j->pe);
    return NULL;
}

/* The O0 pattern: worker threads put rows, the main thread's signal covers all of them. */
MM_TEST(worker_puts_covered_by_the_main_threads_signal)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes(), next = (me + 1) % n, prev = (me + n - 1) % n;
    uint8_t *recv = NULL, *src = malloc((size_t)MM_ROWS * MM_ROW);
    uint64_t *sig = NULL;
    ASSERT_OK(mm_shmem_calloc((size_t)MM_ROWS * MM_ROW, 64, (void **)&recv));
    ASSERT_OK(mm_shmem_calloc(64, 64, (void **)&sig));
    for (uint64_t round = 1; round <= 4; round++) {
        mm_t_fill(src, (size_t)MM_ROWS * MM_ROW, me, 100 + round);
        enum { NT = 4 };
        pthread_t th[NT];
        mm_thread_job_t jobs[NT];
        for (int t = 0; t < NT; t++) {
            jobs[t] = (mm_thread_job_t){recv, src, t, NT, next, MEGAMOE_OK};
            ASSERT_EQ_INT(pthread_create(&th[t], NULL, mm_thread_rows, &jobs[t]), 0);
        }
        for (int t = 0; t < NT; t++) {
            pthread_join(th[t], NULL);
            ASSERT_OK(jobs[t].st);
        }
        ASSERT_OK(mm_shmem_signal_op(sig, 1, MM_SHMEM_SIGNAL_ADD, next));
        ASSERT_OK(mm_shmem_signal_wait_until(sig, MM_SHMEM_CMP_GE, round, NULL));
        long bad = mm_t_check(recv, (size_t)MM_ROWS * MM_ROW, prev, 100 + round);
        if (bad >= 0) MM_FAIL_("round %llu: byte %ld from rank %d wrong", (unsigned long long)round,
                               bad, prev);
        ASSERT_OK(mm_shmem_barrier_all());
    }
    free(src);
    ASSERT_OK(mm_shmem_free(recv));
    ASSERT_OK(mm_shmem_free(sig));
    ASSERT_OK(mm_shmem_release());
}

/* Later puts over earlier ones win, however they travel (coalesced pieces, zero-copy chunks). */
static void mm_overlap_round(uint64_t tag)
{
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes(), next = (me + 1) % n, prev = (me + n - 1) % n;
    uint8_t *recv = NULL, *a = malloc(MM_BIG), *b = malloc(MM_BIG), *want = malloc(MM_BIG);
    uint64_t *sig = NULL;
    ASSERT_OK(mm_shmem_calloc(MM_BIG, 64, (void **)&recv));
    ASSERT_OK(mm_shmem_calloc(64, 64, (void **)&sig));
    /* one layer after another: [0, 4096) A, [1000, 3000) B, [2000, 2100) A', then a large put
     * over [4096, 4096 + 3 MiB - 8192) B' and a small one inside it A'' */
    const size_t layers[][3] = {{0, 4096, 0}, {1000, 2000, 1}, {2000, 100, 0},
                                {4096, MM_BIG - 8192, 1}, {5000, 333, 0}};
    mm_t_fill(a, MM_BIG, me, tag);
    mm_t_fill(b, MM_BIG, me, tag + 1000);
    uint8_t *mine = malloc(MM_BIG);
    memset(mine, 0, MM_BIG);
    for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++) {
        const uint8_t *s = layers[i][2] ? b : a;
        ASSERT_OK(mm_shmem_put(recv + layers[i][0], s + layers[i][0], layers[i][1], next));
        memcpy(mine + layers[i][0], s + layers[i][0], layers[i][1]);
    }
    ASSERT_OK(mm_shmem_signal_op(sig, tag, MM_SHMEM_SIGNAL_SET, next));
    /* what prev sent: the same layers of its patterns */
    mm_t_fill(a, MM_BIG, prev, tag);
    mm_t_fill(b, MM_BIG, prev, tag + 1000);
    memset(want, 0, MM_BIG);
    for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++)
        memcpy(want + layers[i][0], (layers[i][2] ? b : a) + layers[i][0], layers[i][1]);
    ASSERT_OK(mm_shmem_signal_wait_until(sig, MM_SHMEM_CMP_EQ, tag, NULL));
    for (size_t i = 0; i < MM_BIG; i++)
        if (recv[i] != want[i]) MM_FAIL_("byte %zu from rank %d wrong", i, prev);
    free(mine);
    free(a), free(b), free(want);
    ASSERT_OK(mm_shmem_barrier_all());
    ASSERT_OK(mm_shmem_free(recv));
    ASSERT_OK(mm_shmem_free(sig));
}

MM_TEST(overlapping_puts_land_in_issue_order)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    for (uint64_t tag = 1; tag <= 3; tag++) mm_overlap_round(tag);
    ASSERT_OK(mm_shmem_release());
}

/* No signal: a barrier alone makes every member's puts to this rank visible, also from the
 * members it exchanges nothing else with (rank r puts to r + 2), and an agree does too. */
MM_TEST(barrier_and_agree_cover_puts_to_any_member)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes();
    int to = (me + 2) % n, from = (me + 2 * n - 2) % n;
    uint8_t *recv = NULL, *src = malloc(200000);
    ASSERT_OK(mm_shmem_calloc(200000, 64, (void **)&recv));
    for (uint64_t round = 1; round <= 6; round++) {
        size_t size = round % 2 ? 777 : 200000;
        mm_t_fill(src, size, me, round);
        ASSERT_OK(mm_shmem_put(recv, src, size, to));
        if (round % 3) ASSERT_OK(mm_shmem_barrier_all());
        else ASSERT_OK(mm_shmem_team_agree(mm_shmem_team_world(), MEGAMOE_OK));
        long bad = mm_t_check(recv, size, from, round);
        if (bad >= 0) MM_FAIL_("round %llu: byte %ld from rank %d wrong", (unsigned long long)round,
                               bad, from);
        ASSERT_OK(mm_shmem_barrier_all()); /* everyone checked before the next round's puts */
    }
    free(src);
    ASSERT_OK(mm_shmem_free(recv));
    ASSERT_OK(mm_shmem_release());
}

/* The target puts messages back in order: every other data message overtakes its successor. */
MM_TEST(messages_out_of_order_apply_in_the_sources_order)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    mm_shmem_engine_test_reorder(1);
    mm_rows_round(11, 0);
    mm_overlap_round(12);
    /* quiet, then a barrier: the held-back message is out before the acknowledgements */
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes();
    uint8_t *recv = NULL, src[512];
    ASSERT_OK(mm_shmem_calloc(sizeof src, 64, (void **)&recv));
    mm_t_fill(src, sizeof src, me, 13);
    ASSERT_OK(mm_shmem_put(recv, src, sizeof src, (me + 1) % n));
    ASSERT_OK(mm_shmem_quiet());
    ASSERT_OK(mm_shmem_barrier_all());
    ASSERT_EQ_INT(mm_t_check(recv, sizeof src, (me + n - 1) % n, 13), -1);
    ASSERT_OK(mm_shmem_barrier_all());
    mm_shmem_engine_test_reorder(0);
    ASSERT_OK(mm_shmem_free(recv));
    ASSERT_OK(mm_shmem_release());
}

/* Rank 1 asks for the other protocol: every rank is refused with the same text, naming both
 * settings; with the same setting everywhere the retry runs. */
MM_TEST(different_protocols_are_refused_on_every_rank)
{
    const char *was = getenv("MEGAMOE_SHMEM_ENGINE_PROTOCOL");
    char saved[16];
    snprintf(saved, sizeof saved, "%s", was ? was : "");
    if (mm_test_rank() == 1) setenv("MEGAMOE_SHMEM_ENGINE_PROTOCOL", mm_am_protocol() ? "rma" : "am", 1);
    mm_shmem_params_t p = mm_t_params();
    ASSERT_STATUS(mm_shmem_acquire(&p), MEGAMOE_CONFIG_MISMATCH);
    ASSERT_CONTAINS(megamoe_last_error(), "MEGAMOE_SHMEM_ENGINE_PROTOCOL");
    ASSERT_CONTAINS(megamoe_last_error(), "set the same value on every rank");
    ASSERT_EQ_INT(mm_shmem_refcount(), 0);
    if (saved[0]) setenv("MEGAMOE_SHMEM_ENGINE_PROTOCOL", saved, 1);
    else unsetenv("MEGAMOE_SHMEM_ENGINE_PROTOCOL");
    ASSERT_OK(mm_shmem_acquire(&p));
    ASSERT_OK(mm_shmem_barrier_all());
    ASSERT_OK(mm_shmem_release());
}



typedef struct {
    uint8_t *dst;
    int pe;
    pthread_barrier_t *bar;
    megamoe_status_t st;
} mm_idle_job_t;

/* One small put, then idle until the main thread is done: its coalesced put holds a staging
 * ring reservation that must not block the main thread's stream of puts. */
static void *mm_idle_cork(void *arg)
{
    mm_idle_job_t *j = arg;
    uint64_t v = 0x5eed;
    j->st = mm_shmem_put(j->dst, &v, sizeof v, j->pe);
    pthread_barrier_wait(j->bar); /* put done */
    pthread_barrier_wait(j->bar); /* the main thread streamed and signalled */
    return NULL;
}

MM_TEST(an_idle_threads_coalesced_put_does_not_block_the_staging_ring)
{
    mm_shmem_params_t p = mm_t_params();
    p.heap_size = 96u << 20;
    ASSERT_OK(mm_shmem_acquire(&p));
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes(), next = (me + 1) % n, prev = (me + n - 1) % n;
    const size_t piece = 512u << 10, total = 48u << 20; /* more than the 32 MiB ring */
    uint8_t *recv = NULL, *src = malloc(piece);
    uint64_t *sig = NULL;
    ASSERT_OK(mm_shmem_calloc(total + 64, 64, (void **)&recv));
    ASSERT_OK(mm_shmem_calloc(64, 64, (void **)&sig));
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    mm_idle_job_t job = {recv + total, next, &bar, MEGAMOE_OK};
    pthread_t th;
    ASSERT_EQ_INT(pthread_create(&th, NULL, mm_idle_cork, &job), 0);
    pthread_barrier_wait(&bar);
    mm_t_fill(src, piece, me, 21);
    for (size_t o = 0; o < total; o += piece) ASSERT_OK(mm_shmem_put(recv + o, src, piece, next));
    ASSERT_OK(mm_shmem_signal_op(sig, 1, MM_SHMEM_SIGNAL_SET, next));
    pthread_barrier_wait(&bar);
    pthread_join(th, NULL);
    pthread_barrier_destroy(&bar);
    ASSERT_OK(job.st);
    ASSERT_OK(mm_shmem_signal_wait_until(sig, MM_SHMEM_CMP_EQ, 1, NULL));
    for (size_t o = 0; o < total; o += piece)
        ASSERT_EQ_INT(mm_t_check(recv + o, piece, prev, 21), -1);
    uint64_t v;
    memcpy(&v, recv + total, 8);
    ASSERT_EQ_U64(v, 0x5eed); /* the idle thread's put: covered by the main thread's signal */
    free(src);
    ASSERT_OK(mm_shmem_barrier_all());
    ASSERT_OK(mm_shmem_free(recv));
    ASSERT_OK(mm_shmem_free(sig));
    ASSERT_OK(mm_shmem_release());
}

/* A serving loop's small calls, each drained by a quiet: the staging ring starts again at its
 * beginning whenever it is empty, so the resident set stays that of one call's burst. Before,
 * the head walked round the whole 32 MiB ring and every rank's RSS crept up by it. */
MM_TEST(a_drained_staging_ring_keeps_its_resident_set)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes(), next = (me + 1) % n;
    const size_t piece = 16u << 10;
    const int calls = 2560; /* 40 MiB through the ring, one "call" at a time */
    uint8_t *recv = NULL, *src = malloc(piece);
    ASSERT_OK(mm_shmem_calloc(piece, 64, (void **)&recv));
    mm_t_fill(src, piece, me, 22);
    for (int c = 0; c < 16; c++) { /* warm-up: the first burst's pages, UCX's pools */
        ASSERT_OK(mm_shmem_put(recv, src, piece, next));
        ASSERT_OK(mm_shmem_quiet());
    }
    const double rss0 = mm_resident_mb();
    for (int c = 0; c < calls; c++) {
        ASSERT_OK(mm_shmem_put(recv, src, piece, next));
        ASSERT_OK(mm_shmem_quiet());
    }
    const double grew = mm_resident_mb() - rss0;
    fprintf(stderr, "rank %d: resident set %+.1f MB over %d drained calls\n", me, grew, calls);
    ASSERT_TRUE(grew < 8.0);
    free(src);
    ASSERT_OK(mm_shmem_barrier_all());
    ASSERT_OK(mm_shmem_free(recv));
    ASSERT_OK(mm_shmem_release());
}

/* Rank 0 sends no heartbeats (test seam) but streams data at the others for four peer
 * timeouts: its arrivals are its signs of life, so no rank declares it lost. Before, a rank
 * whose heartbeats waited behind its own stream (a full staging ring under load) was declared
 * unreachable while its data kept arriving. */
MM_TEST(a_peer_whose_data_keeps_arriving_is_alive_without_heartbeats)
{
    if (!mm_am_protocol())
        MM_SKIP("the rma protocol's one-sided puts raise nothing at the target to count");
    setenv("MEGAMOE_SHMEM_PEER_TIMEOUT_MS", "1000", 1);
    mm_shmem_params_t p = mm_t_params();
    megamoe_status_t acq = mm_shmem_acquire(&p);
    unsetenv("MEGAMOE_SHMEM_PEER_TIMEOUT_MS");
    ASSERT_OK(acq);
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes();
    const size_t piece = 4u << 10;
    uint8_t *recv = NULL, *src = malloc(piece);
    ASSERT_OK(mm_shmem_calloc(piece, 64, (void **)&recv));
    mm_t_fill(src, piece, me, 23);
    ASSERT_OK(mm_shmem_barrier_all());
    if (me == 0) {
        mm_shmem_engine_test_hold_heartbeats(1);
        const uint64_t t0 = mm_now_ns();
        long sent = 0;
        while (mm_now_ns() - t0 < 4000000000ull) { /* 4 timeouts */
            for (int pe = 1; pe < n; pe++) ASSERT_OK(mm_shmem_put(recv, src, piece, pe));
            ASSERT_OK(mm_shmem_quiet());
            sent++;
            struct timespec ts = {0, 2000000}; /* a stream, not a spin: 2 ms between rounds */
            nanosleep(&ts, NULL);
        }
        mm_shmem_engine_test_hold_heartbeats(0);
        fprintf(stderr, "rank 0: %ld rounds without heartbeats\n", sent);
    }
    ASSERT_OK(mm_shmem_barrier_all());
    ASSERT_EQ_INT(mm_surv_lost_count(), 0);
    if (me != 0) ASSERT_EQ_INT(mm_t_check(recv, piece, 0, 23), -1);
    free(src);
    ASSERT_OK(mm_shmem_free(recv));
    ASSERT_OK(mm_shmem_release());
}
