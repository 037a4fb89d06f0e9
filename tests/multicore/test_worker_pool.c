/* Worker pool: every worker runs each phase once, results are visible to the caller, errors
 * come back with their text, threads park between phases, the static split covers [0, n). */
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness/harness.h"

#include "base/clock.h"
#include "base/error.h"
#include "multicore/worker_pool.h"

typedef struct {
    int64_t n;
    int64_t *data;
    atomic_int calls;
    int fail_worker;
} mm_job_t;

static megamoe_status_t mm_job_fill(void *arg, int w, int nw)
{
    mm_job_t *j = arg;
    atomic_fetch_add(&j->calls, 1);
    int64_t b, e;
    mm_pool_split(j->n, w, nw, 1, &b, &e);
    for (int64_t i = b; i < e; i++) j->data[i] += i + 1; /* plain writes: the pool orders them */
    if (w == j->fail_worker)
        return mm_error_quiet(MEGAMOE_IO, "worker %d failed on purpose", w);
    return MEGAMOE_OK;
}

MM_TEST(split_covers_range_with_alignment)
{
    for (int nw = 1; nw <= 7; nw++)
        for (int64_t n = 0; n < 300; n += 13)
            for (int64_t align = 1; align <= 64; align *= 4) {
                int64_t expect = 0;
                for (int w = 0; w < nw; w++) {
                    int64_t b, e;
                    mm_pool_split(n, w, nw, align, &b, &e);
                    ASSERT_EQ_INT(b, expect);
                    ASSERT_TRUE(e >= b);
                    if (e < n) ASSERT_EQ_INT(e % align, 0);
                    expect = e;
                }
                ASSERT_EQ_INT(expect, n);
            }
}

MM_TEST(every_worker_runs_each_phase_once)
{
    for (int nw = 1; nw <= 5; nw++) {
        mm_pool_t *pool = NULL;
        ASSERT_OK(mm_pool_create(nw, &pool));
        ASSERT_EQ_INT(mm_pool_size(pool), nw);
        mm_job_t j = {.n = 1000, .fail_worker = -1};
        j.data = calloc(1000, sizeof *j.data);
        atomic_init(&j.calls, 0);
        for (int rep = 0; rep < 200; rep++) ASSERT_OK(mm_pool_run(pool, mm_job_fill, &j));
        ASSERT_EQ_INT(atomic_load(&j.calls), 200 * nw);
        for (int64_t i = 0; i < 1000; i++) ASSERT_EQ_INT(j.data[i], 200 * (i + 1));
        ASSERT_EQ_INT(mm_pool_runs(pool), 200);
        free(j.data);
        mm_pool_destroy(pool);
    }
}

MM_TEST(failure_of_a_worker_reaches_the_caller_with_its_text)
{
    mm_pool_t *pool = NULL;
    ASSERT_OK(mm_pool_create(4, &pool));
    mm_job_t j = {.n = 64, .fail_worker = 2};
    j.data = calloc(64, sizeof *j.data);
    atomic_init(&j.calls, 0);
    megamoe_clear_last_error();
    ASSERT_STATUS(mm_pool_run(pool, mm_job_fill, &j), MEGAMOE_IO);
    ASSERT_CONTAINS(megamoe_last_error(), "worker 2 failed on purpose");
    /* the pool stays usable and the next phase starts clean */
    j.fail_worker = -1;
    ASSERT_OK(mm_pool_run(pool, mm_job_fill, &j));
    j.fail_worker = 0; /* the caller itself */
    ASSERT_STATUS(mm_pool_run(pool, mm_job_fill, &j), MEGAMOE_IO);
    ASSERT_CONTAINS(megamoe_last_error(), "worker 0 failed");
    free(j.data);
    mm_pool_destroy(pool);
}

static megamoe_status_t mm_job_nothing(void *arg, int w, int nw)
{
    (void)arg;
    (void)w;
    (void)nw;
    return MEGAMOE_OK;
}

static double mm_cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

MM_TEST(parked_workers_do_not_spin)
{
    mm_pool_t *pool = NULL;
    ASSERT_OK(mm_pool_create(4, &pool));
    ASSERT_OK(mm_pool_run(pool, mm_job_nothing, NULL));
    double c0 = mm_cpu_seconds();
    usleep(300 * 1000); /* 3 idle workers for 0.3 s */
    double used = mm_cpu_seconds() - c0;
    /* spinning would burn ~0.9 s of CPU; parked threads burn ~0 */
    ASSERT_TRUE(used < 0.05 * mm_test_timeout_multiplier());
    ASSERT_OK(mm_pool_run(pool, mm_job_nothing, NULL));
    mm_pool_destroy(pool);
}

MM_TEST(create_rejects_bad_counts_and_defaults_are_positive)
{
    mm_pool_t *pool = NULL;
    ASSERT_STATUS(mm_pool_create(0, &pool), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_pool_create(MM_POOL_MAX_WORKERS + 1, &pool), MEGAMOE_INVALID_ARGUMENT);
    int n = 0;
    ASSERT_OK(mm_pool_default_workers(&n));
    ASSERT_TRUE(n >= 1);
    setenv("MEGAMOE_THREADS", "3", 1);
    ASSERT_OK(mm_pool_default_workers(&n));
    ASSERT_EQ_INT(n, 3);
    unsetenv("MEGAMOE_THREADS");
    setenv("LOCAL_WORLD_SIZE", "1000000", 1);
    ASSERT_OK(mm_pool_default_workers(&n));
    ASSERT_EQ_INT(n, 1);
    setenv("LOCAL_WORLD_SIZE", "zero", 1);
    ASSERT_STATUS(mm_pool_default_workers(&n), MEGAMOE_INVALID_ARGUMENT);
    unsetenv("LOCAL_WORLD_SIZE");
    mm_pool_destroy(NULL);
}
