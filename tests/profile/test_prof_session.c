/* Profiling sessions: creation rules, rings (capacity, drops, layout), begin/end numbering,
 * reset, totals, the process-wide registry and MEGAMOE_PROFILE retirement. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness/harness.h"
#include "megamoe/prof.h"
#include "profile/prof.h"

static const char *const stages[] = {"dispatch", "gmm1", "swiglu", "gmm2", "combine"};

static mm_prof_session_t *make(int rank, int n_cube, int n_vector, uint32_t cap)
{
    mm_prof_session_t *s = NULL;
    if (mm_prof_session_create(rank, n_cube, n_vector, cap, stages, 5, &s) != MEGAMOE_OK)
        return NULL;
    return s;
}

MM_TEST(create_rejects_bad_arguments)
{
    mm_prof_session_t *s = NULL;
    const char *const empty[] = {"a", ""};
    char long_name[80];
    memset(long_name, 'x', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    const char *const too_long[] = {long_name};
    ASSERT_STATUS(mm_prof_session_create(0, 0, 0, 16, stages, 5, &s), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "at least one worker");
    ASSERT_STATUS(mm_prof_session_create(0, -1, 1, 16, stages, 5, &s), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_prof_session_create(0, 1, 1, 0, stages, 5, &s), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "records_per_worker");
    ASSERT_STATUS(mm_prof_session_create(0, 1, 1, MM_PROF_MAX_RECORDS + 1, stages, 5, &s),
                  MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_prof_session_create(-1, 1, 1, 16, stages, 5, &s), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_prof_session_create(0, 1, 1, 16, stages, 0, &s), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_prof_session_create(0, 1, 1, 16, stages, 257, &s), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_prof_session_create(0, 1, 1, 16, NULL, 5, &s), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_prof_session_create(0, 1, 1, 16, empty, 2, &s), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "stage name 1 is empty");
    ASSERT_STATUS(mm_prof_session_create(0, 1, 1, 16, too_long, 1, &s), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_TRUE(s == NULL);
}

MM_TEST(rings_by_role_and_index)
{
    mm_prof_session_t *s = make(3, 2, 3, 8);
    ASSERT_TRUE(s != NULL);
    ASSERT_EQ_INT(mm_prof_rank(s), 3);
    ASSERT_EQ_INT(mm_prof_workers(s, MM_PROF_CUBE), 2);
    ASSERT_EQ_INT(mm_prof_workers(s, MM_PROF_VECTOR), 3);
    ASSERT_EQ_INT(mm_prof_capacity(s), 8);
    for (int i = 0; i < 2; i++) {
        mm_prof_ring_t *r = mm_prof_ring(s, MM_PROF_CUBE, i);
        ASSERT_TRUE(r != NULL);
        ASSERT_EQ_INT(r->role, MM_PROF_CUBE);
        ASSERT_EQ_INT(r->index, i);
        ASSERT_EQ_INT(r->capacity, 8);
        ASSERT_EQ_INT(r->count, 0);
    }
    for (int i = 0; i < 3; i++) {
        mm_prof_ring_t *r = mm_prof_ring(s, MM_PROF_VECTOR, i);
        ASSERT_TRUE(r != NULL);
        ASSERT_EQ_INT(r->role, MM_PROF_VECTOR);
        ASSERT_EQ_INT(r->index, i);
    }
    ASSERT_TRUE(mm_prof_ring(s, MM_PROF_CUBE, 2) == NULL);
    ASSERT_TRUE(mm_prof_ring(s, MM_PROF_VECTOR, 3) == NULL);
    ASSERT_TRUE(mm_prof_ring(s, MM_PROF_VECTOR, -1) == NULL);
    ASSERT_TRUE(mm_prof_ring(s, (mm_prof_role_t)7, 0) == NULL);
    /* Two workers' rings (their counts are bumped on every push) never share a cache line. */
    char *a = (char *)mm_prof_ring(s, MM_PROF_CUBE, 0), *b = (char *)mm_prof_ring(s, MM_PROF_CUBE, 1);
    ASSERT_EQ_INT(((uintptr_t)a) % 64, 0);
    ASSERT_TRUE(b - a >= 64);
    ASSERT_EQ_INT(sizeof(mm_prof_record_t), 32);
    mm_prof_session_destroy(s);
}

MM_TEST(full_ring_drops_and_counts)
{
    mm_prof_session_t *s = make(0, 1, 1, 4);
    ASSERT_TRUE(s != NULL);
    mm_prof_ring_t *r = mm_prof_ring(s, MM_PROF_CUBE, 0);
    for (int i = 0; i < 10; i++)
        mm_prof_push(r, MM_PROF_COMPUTE, 1, i, 100 + i, i % 2 ? 1 : -1, 0, 1000 * (uint64_t)i,
                     1000 * (uint64_t)i + 500);
    ASSERT_EQ_INT(r->count, 4);
    ASSERT_EQ_INT(r->dropped, 6);
    /* The first records are kept, intact. */
    for (int i = 0; i < 4; i++) {
        const mm_prof_record_t *rec = &r->records[i];
        ASSERT_EQ_INT(rec->task, i);
        ASSERT_EQ_INT(rec->owner, 100 + i);
        ASSERT_EQ_INT(rec->peer, i % 2 ? 1 : 0xffff);
        ASSERT_EQ_U64(rec->start_ns, 1000 * (uint64_t)i);
        ASSERT_EQ_U64(rec->end_ns, 1000 * (uint64_t)i + 500);
        ASSERT_EQ_INT(rec->kind, MM_PROF_COMPUTE);
        ASSERT_EQ_INT(rec->stage, 1);
    }
    /* The other ring is untouched. */
    ASSERT_EQ_INT(mm_prof_ring(s, MM_PROF_VECTOR, 0)->count, 0);
    mm_prof_summary_t sum;
    mm_prof_summarize(s, &sum);
    ASSERT_EQ_INT(sum.records, 4);
    ASSERT_EQ_INT(sum.dropped, 6);
    mm_prof_reset(s);
    ASSERT_EQ_INT(r->count, 0);
    ASSERT_EQ_INT(r->dropped, 0);
    ASSERT_EQ_INT(r->capacity, 4);
    mm_prof_session_destroy(s);
}

MM_TEST(begin_end_numbering_and_reset)
{
    mm_prof_session_t *s = make(0, 1, 0, 16);
    ASSERT_TRUE(s != NULL);
    for (uint32_t i = 0; i < 200; i++) { /* beyond the initial table of 64: it grows */
        ASSERT_EQ_INT(mm_prof_begin(s, i % 2 ? "backward" : "forward"), i);
        mm_prof_end(s);
    }
    ASSERT_EQ_INT(mm_prof_invocation_count(s), 200);
    mm_prof_summary_t sum;
    mm_prof_summarize(s, &sum);
    ASSERT_EQ_INT(sum.invocations, 200);
    ASSERT_TRUE(sum.launch_ns > 0);
    mm_prof_reset(s);
    ASSERT_EQ_INT(mm_prof_invocation_count(s), 0);
    ASSERT_EQ_INT(mm_prof_begin(s, NULL), 0);
    ASSERT_EQ_INT(mm_prof_begin(s, "backward"), 1); /* the first one was never ended */
    mm_prof_end(s);
    mm_prof_end(s); /* a second end is harmless */
    ASSERT_EQ_INT(mm_prof_invocation_count(s), 2);
    mm_prof_session_destroy(s);
}

MM_TEST(active_flag_is_the_producer_switch)
{
    ASSERT_FALSE(mm_prof_on(NULL));
    mm_prof_session_t *s = make(0, 1, 0, 16);
    ASSERT_TRUE(s != NULL);
    ASSERT_TRUE(mm_prof_on(s)); /* a new session records */
    mm_prof_set_active(s, 0);
    ASSERT_FALSE(mm_prof_on(s));
    mm_prof_set_active(s, 5);
    ASSERT_TRUE(mm_prof_on(s));
    mm_prof_session_destroy(s);
}

/* Records of known durations: the totals are exact. */
MM_TEST(summary_of_known_durations)
{
    mm_prof_session_t *s = make(0, 2, 1, 64);
    ASSERT_TRUE(s != NULL);
    mm_prof_ring_t *c0 = mm_prof_ring(s, MM_PROF_CUBE, 0), *c1 = mm_prof_ring(s, MM_PROF_CUBE, 1);
    mm_prof_ring_t *v0 = mm_prof_ring(s, MM_PROF_VECTOR, 0);
    uint64_t t = 1000000;
    /* cube 0: wait 100, compute 300, wait 50, compute 200 */
    mm_prof_push(c0, MM_PROF_WAIT, 1, 0, 0, -1, 0, t, t + 100);
    mm_prof_push(c0, MM_PROF_COMPUTE, 1, 0, 0, -1, 0, t + 100, t + 400);
    mm_prof_push(c0, MM_PROF_WAIT, 3, 1, 0, -1, 0, t + 400, t + 450);
    mm_prof_push(c0, MM_PROF_COMPUTE, 3, 1, 0, -1, 0, t + 450, t + 650);
    /* cube 1: compute 1000 */
    mm_prof_push(c1, MM_PROF_COMPUTE, 1, 2, 1, -1, 0, t + 10, t + 1010);
    /* vector 0: compute 40, signal 7, signal 3 (ends last, at t + 2000) */
    mm_prof_push(v0, MM_PROF_COMPUTE, 0, 3, -1, 1, 0, t, t + 40);
    mm_prof_push(v0, MM_PROF_SIGNAL, 0, 3, -1, 1, 0, t + 40, t + 47);
    mm_prof_push(v0, MM_PROF_SIGNAL, 4, 4, -1, 1, 0, t + 1997, t + 2000);
    mm_prof_summary_t sum;
    mm_prof_summarize(s, &sum);
    ASSERT_EQ_INT(sum.wait_ns, 150);
    ASSERT_EQ_INT(sum.compute_ns, 300 + 200 + 1000 + 40);
    ASSERT_EQ_INT(sum.signal_ns, 10);
    ASSERT_EQ_INT(sum.wall_ns, 2000);
    ASSERT_EQ_INT(sum.records, 8);
    ASSERT_EQ_INT(sum.dropped, 0);
    ASSERT_EQ_INT(sum.workers, 3);
    mm_prof_summary_t w;
    ASSERT_OK(mm_prof_summarize_worker(s, MM_PROF_CUBE, 0, &w));
    ASSERT_EQ_INT(w.wait_ns, 150);
    ASSERT_EQ_INT(w.compute_ns, 500);
    ASSERT_EQ_INT(w.wall_ns, 650);
    ASSERT_EQ_INT(w.records, 4);
    ASSERT_EQ_INT(w.workers, 1);
    ASSERT_OK(mm_prof_summarize_worker(s, MM_PROF_VECTOR, 0, &w));
    ASSERT_EQ_INT(w.signal_ns, 10);
    ASSERT_STATUS(mm_prof_summarize_worker(s, MM_PROF_VECTOR, 1, &w), MEGAMOE_INVALID_ARGUMENT);
    mm_prof_session_destroy(s);
}

MM_TEST(registry_start_stop_and_serials)
{
    ASSERT_EQ_INT(megamoe_profiler_session_count(), 0);
    ASSERT_FALSE(mm_prof_requested());
    mm_prof_session_t *a = make(0, 1, 0, 8), *b = make(0, 0, 1, 8);
    ASSERT_TRUE(a != NULL && b != NULL);
    ASSERT_EQ_INT(mm_prof_serial(a), -1);
    ASSERT_OK(mm_prof_register(a));
    ASSERT_FALSE(mm_prof_on(a)); /* registered while not requested: paused */
    ASSERT_OK(megamoe_profiler_start());
    ASSERT_TRUE(mm_prof_requested());
    ASSERT_TRUE(megamoe_profiler_is_started());
    ASSERT_TRUE(mm_prof_on(a));
    ASSERT_OK(mm_prof_register(b));
    ASSERT_TRUE(mm_prof_on(b)); /* registered while requested: records */
    ASSERT_EQ_INT(mm_prof_serial(a), mm_prof_serial(b) - 1);
    ASSERT_EQ_INT(megamoe_profiler_session_count(), 2);
    mm_prof_push(mm_prof_ring(a, MM_PROF_CUBE, 0), MM_PROF_COMPUTE, 0, 0, 0, -1, 0, 10, 20);
    mm_prof_push(mm_prof_ring(b, MM_PROF_VECTOR, 0), MM_PROF_WAIT, 0, 0, 0, -1, 0, 30, 35);
    megamoe_profile_summary_t sum;
    ASSERT_OK(megamoe_profiler_get_summary(&sum));
    ASSERT_EQ_INT(sum.sessions, 2);
    ASSERT_EQ_INT(sum.records, 2);
    ASSERT_EQ_INT(sum.compute_ns, 10);
    ASSERT_EQ_INT(sum.wait_ns, 5);
    ASSERT_EQ_INT(sum.wall_ns, 25);
    ASSERT_OK(megamoe_profiler_stop());
    ASSERT_FALSE(mm_prof_on(a));
    ASSERT_FALSE(mm_prof_on(b));
    ASSERT_FALSE(mm_prof_requested());
    megamoe_profiler_reset();
    ASSERT_OK(megamoe_profiler_get_summary(&sum));
    ASSERT_EQ_INT(sum.records, 0);
    mm_prof_unregister(a);
    ASSERT_EQ_INT(megamoe_profiler_session_count(), 1);
    mm_prof_session_destroy(b); /* destroy unregisters */
    ASSERT_EQ_INT(megamoe_profiler_session_count(), 0);
    mm_prof_session_destroy(a);
}

static int file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

MM_TEST(retire_writes_to_megamoe_profile_dir)
{
    char dir[] = "/tmp/mm_prof_retire_XXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    char sub[128], p0[160], p1[160];
    snprintf(sub, sizeof sub, "%s/a/b", dir); /* created on demand */
    setenv("MEGAMOE_PROFILE", sub, 1);
    ASSERT_OK(mm_prof_control_init());
    ASSERT_TRUE(mm_prof_requested());
    mm_prof_session_t *a = make(5, 1, 0, 8), *b = make(5, 1, 0, 8), *c = make(5, 1, 0, 8);
    ASSERT_TRUE(a != NULL && b != NULL && c != NULL);
    ASSERT_OK(mm_prof_register(a));
    ASSERT_OK(mm_prof_register(b));
    ASSERT_OK(mm_prof_register(c));
    ASSERT_TRUE(mm_prof_on(a));
    int sa = mm_prof_serial(a), sb = mm_prof_serial(b);
    mm_prof_push(mm_prof_ring(a, MM_PROF_CUBE, 0), MM_PROF_COMPUTE, 0, 0, 0, -1, 0, 10, 20);
    mm_prof_push(mm_prof_ring(b, MM_PROF_CUBE, 0), MM_PROF_COMPUTE, 0, 0, 0, -1, 0, 10, 20);
    ASSERT_OK(mm_prof_retire(a));
    ASSERT_OK(mm_prof_retire(b));
    ASSERT_OK(mm_prof_retire(c)); /* nothing recorded: no file */
    ASSERT_OK(mm_prof_retire(NULL));
    if (sa == 0) snprintf(p0, sizeof p0, "%s/trace_5.json", sub);
    else snprintf(p0, sizeof p0, "%s/trace_5.g%d.json", sub, sa);
    snprintf(p1, sizeof p1, "%s/trace_5.g%d.json", sub, sb);
    ASSERT_TRUE(file_exists(p0));
    ASSERT_TRUE(file_exists(p1));
    ASSERT_EQ_INT(megamoe_profiler_session_count(), 0);
    /* Both files of rank 5 read back as one rank with two groups. */
    megamoe_trace_summary_options_t o = {1, -1};
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    const char *in[] = {sub};
    ASSERT_OK(megamoe_trace_summary(in, 1, &o, mem));
    fclose(mem);
    char want[96];
    ASSERT_CONTAINS(text, "\"rank\":5");
    snprintf(want, sizeof want, "\"group %d/cube 0\"", sa);
    ASSERT_CONTAINS(text, want);
    snprintf(want, sizeof want, "\"group %d/cube 0\",\"role\":\"cube\",\"worker\":0,\"group\":%d", sb,
             sb);
    ASSERT_CONTAINS(text, want);
    free(text);
    /* An unwritable directory is an IO error naming the path (a file is in the way). */
    char blocker[160];
    snprintf(blocker, sizeof blocker, "%s/file", dir);
    FILE *f = fopen(blocker, "w");
    ASSERT_TRUE(f != NULL);
    fclose(f);
    char bad[200];
    snprintf(bad, sizeof bad, "%s/file/sub", dir);
    setenv("MEGAMOE_PROFILE", bad, 1);
    mm_prof_session_t *d = make(5, 1, 0, 8);
    ASSERT_TRUE(d != NULL);
    mm_prof_push(mm_prof_ring(d, MM_PROF_CUBE, 0), MM_PROF_COMPUTE, 0, 0, 0, -1, 0, 10, 20);
    ASSERT_STATUS(mm_prof_retire(d), MEGAMOE_IO);
    ASSERT_CONTAINS(megamoe_last_error(), "/file");
    ASSERT_OK(megamoe_profiler_stop());
    unsetenv("MEGAMOE_PROFILE");
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ASSERT_EQ_INT(system(cmd), 0);
}

/* ---- threads (this file also runs under ThreadSanitizer: label tsan) ---- */
#include <pthread.h>

typedef struct {
    mm_prof_session_t *s;
    int worker;
} push_arg_t;

static void *push_worker(void *p)
{
    push_arg_t *a = p;
    mm_prof_ring_t *r = mm_prof_ring(a->s, a->worker % 2 ? MM_PROF_VECTOR : MM_PROF_CUBE, a->worker / 2);
    for (int i = 0; i < 3000; i++)
        if (mm_prof_on(a->s))
            mm_prof_push(r, MM_PROF_COMPUTE, 0, i, a->worker, -1, 0, (uint64_t)i * 10,
                         (uint64_t)i * 10 + 5);
    return NULL;
}

MM_TEST(workers_push_into_their_own_rings_concurrently)
{
    mm_prof_session_t *s = make(0, 2, 2, 2048);
    ASSERT_TRUE(s != NULL);
    pthread_t th[4];
    push_arg_t args[4];
    uint32_t inv = mm_prof_begin(s, "forward"); /* before the workers start, as the contract says */
    for (int w = 0; w < 4; w++) {
        args[w] = (push_arg_t){s, w};
        ASSERT_EQ_INT(pthread_create(&th[w], NULL, push_worker, &args[w]), 0);
    }
    for (int w = 0; w < 4; w++) pthread_join(th[w], NULL);
    mm_prof_end(s);
    ASSERT_EQ_INT(inv, 0);
    mm_prof_summary_t sum;
    mm_prof_summarize(s, &sum);
    ASSERT_EQ_INT(sum.records, 4 * 2048);
    ASSERT_EQ_INT(sum.dropped, 4 * (3000 - 2048));
    for (int w = 0; w < 4; w++) {
        mm_prof_ring_t *r = mm_prof_ring(s, w % 2 ? MM_PROF_VECTOR : MM_PROF_CUBE, w / 2);
        for (uint32_t i = 0; i < r->count; i++) ASSERT_EQ_INT(r->records[i].owner, w);
    }
    mm_prof_session_destroy(s);
}

static void *registry_churn(void *p)
{
    (void)p;
    for (int i = 0; i < 200; i++) {
        mm_prof_session_t *s = make(1, 1, 0, 16);
        if (s == NULL) return (void *)1;
        if (mm_prof_register(s) != MEGAMOE_OK) return (void *)1;
        if (mm_prof_on(s)) mm_prof_push(mm_prof_ring(s, MM_PROF_CUBE, 0), MM_PROF_WAIT, 0, 0, 0, -1, 0, 1, 2);
        mm_prof_session_destroy(s);
    }
    return NULL;
}

static void *profiler_toggle(void *p)
{
    const char *path = p;
    for (int i = 0; i < 50; i++) {
        megamoe_profiler_start();
        megamoe_profile_summary_t sum;
        megamoe_profiler_get_summary(&sum);
        if (i % 10 == 0 && megamoe_profiler_export(path) != MEGAMOE_OK) return (void *)1;
        megamoe_profiler_reset();
        megamoe_profiler_stop();
    }
    return NULL;
}

MM_TEST(process_wide_calls_are_thread_safe)
{
    char dir[] = "/tmp/mm_prof_threads_XXXXXX";
    ASSERT_TRUE(mkdtemp(dir) != NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/t.json", dir);
    pthread_t a, b, c;
    ASSERT_EQ_INT(pthread_create(&a, NULL, registry_churn, NULL), 0);
    ASSERT_EQ_INT(pthread_create(&b, NULL, registry_churn, NULL), 0);
    ASSERT_EQ_INT(pthread_create(&c, NULL, profiler_toggle, path), 0);
    void *ra, *rb, *rc;
    pthread_join(a, &ra);
    pthread_join(b, &rb);
    pthread_join(c, &rc);
    ASSERT_TRUE(ra == NULL && rb == NULL && rc == NULL);
    ASSERT_EQ_INT(megamoe_profiler_session_count(), 0);
    ASSERT_FALSE(mm_prof_requested());
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ASSERT_EQ_INT(system(cmd), 0);
}
