/* bench prof: the cost of MegaKernel profiling on a worker's hot path (docs/profiling.md).
 *
 * Rows (ns per operation, medians):
 *   push          mm_prof_push into a ring with room (the record is written)
 *   push_full     mm_prof_push into a full ring (dropped and counted)
 *   clock         mm_now_ns() (clock_gettime(CLOCK_MONOTONIC), vDSO)
 *   task_on       what a task pays when recording: two clock reads + one push
 *   task_off      what a task pays when not recording: the `if (ring)` test on a NULL ring
 * End-to-end overhead on a launch is measured by `megamoe bench layer` (executor side). */
#include <stdlib.h>

#include "base/clock.h"
#include "profile/prof.h"

#include "bench_util.h"

typedef struct mm_prof_bench {
    mm_prof_session_t *session;
    mm_prof_ring_t *ring;
    mm_prof_ring_t *volatile maybe_ring; /* NULL: the "off" case, opaque to the compiler */
    uint32_t n;
    volatile uint64_t sink;
} mm_prof_bench_t;

static void mm_bench_push(void *arg)
{
    mm_prof_bench_t *b = arg;
    mm_prof_ring_t *r = b->ring;
    r->count = 0;
    for (uint32_t i = 0; i < b->n; i++)
        mm_prof_push(r, MM_PROF_COMPUTE, (uint8_t)(i & 3), (int32_t)i, 3, -1, 7, i, i + 5);
}

static void mm_bench_push_full(void *arg)
{
    mm_prof_bench_t *b = arg;
    mm_prof_ring_t *r = b->ring;
    r->count = r->capacity;
    for (uint32_t i = 0; i < b->n; i++)
        mm_prof_push(r, MM_PROF_COMPUTE, (uint8_t)(i & 3), (int32_t)i, 3, -1, 7, i, i + 5);
    r->dropped = 0;
}

static void mm_bench_clock(void *arg)
{
    mm_prof_bench_t *b = arg;
    uint64_t acc = 0;
    for (uint32_t i = 0; i < b->n; i++) acc += mm_now_ns();
    b->sink = acc;
}

static void mm_bench_task_on(void *arg)
{
    mm_prof_bench_t *b = arg;
    mm_prof_ring_t *r = b->ring;
    r->count = 0;
    for (uint32_t i = 0; i < b->n; i++) {
        uint64_t t0 = mm_now_ns();
        uint64_t t1 = mm_now_ns();
        mm_prof_push(r, MM_PROF_COMPUTE, 1, (int32_t)i, 3, -1, 7, t0, t1);
    }
}

static void mm_bench_task_off(void *arg)
{
    mm_prof_bench_t *b = arg;
    uint64_t acc = 0;
    for (uint32_t i = 0; i < b->n; i++) {
        mm_prof_ring_t *r = b->maybe_ring; /* re-read: the producer reads its ring per task */
        if (r != NULL) {
            uint64_t t0 = mm_now_ns();
            mm_prof_push(r, MM_PROF_COMPUTE, 1, (int32_t)i, 3, -1, 7, t0, t0);
        }
        acc += i;
    }
    b->sink = acc;
}

static int mm_bench_prof_main(int argc, char **argv)
{
    static const char *const stages[] = {"dispatch", "gmm1", "swiglu", "gmm2"};
    mm_prof_bench_t b = {0};
    b.n = (uint32_t)atol(mm_bench_opt(argc, argv, "--records", "65536"));
    if (b.n < 1024 || b.n > MM_PROF_MAX_RECORDS) {
        fprintf(stderr, "megamoe bench prof: --records must be in [1024, %u]\n", MM_PROF_MAX_RECORDS);
        return 2;
    }
    if (mm_prof_session_create(0, 1, 0, b.n, stages, 4, &b.session) != MEGAMOE_OK) return 1;
    b.ring = mm_prof_ring(b.session, MM_PROF_CUBE, 0);
    b.maybe_ring = NULL;
    static const struct {
        const char *op;
        void (*fn)(void *);
    } ops[] = {{"push", mm_bench_push},         {"push_full", mm_bench_push_full},
               {"clock", mm_bench_clock},       {"task_on", mm_bench_task_on},
               {"task_off", mm_bench_task_off}};
    int n_ops = (int)(sizeof ops / sizeof ops[0]);
    mm_bench_begin("prof");
    for (int i = 0; i < n_ops; i++) {
        mm_bench_progress(i + 1, n_ops, ops[i].op);
        double s = mm_bench_median(ops[i].fn, &b, 7, 0.2);
        mm_bench_row();
        mm_bench_str("op", ops[i].op);
        mm_bench_int("ops", (long long)b.n);
        mm_bench_num("ns_per_op", s / b.n * 1e9);
    }
    mm_bench_end();
    mm_prof_session_destroy(b.session);
    return 0;
}

const mm_bench_def_t mm_bench_prof_def = {"prof", "MegaKernel profiling cost per record/task",
                                          mm_bench_prof_main};
