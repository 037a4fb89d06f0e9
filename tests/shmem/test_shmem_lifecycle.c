/* Lifecycle and collective failures across ranks (run under `megamoe launch -n 2`): leak
 * detection at the last release, heap-size mismatch, diverging allocations, heap exhaustion
 * (same error text on every rank), wait timeout, reopening with a new endpoint. */
#include <stdio.h>
#include <stdlib.h>

#include "shmem_test_util.h"

/* Every rank passes its last error text; 1 when they are all identical. Needs a running
 * runtime. */
static int mm_same_text_everywhere(const char *text)
{
    char mine[512];
    memset(mine, 0, sizeof mine);
    snprintf(mine, sizeof mine, "%s", text);
    int n = mm_shmem_n_pes();
    char *all = malloc(sizeof mine * (size_t)n);
    if (mm_shmem_team_allgather(mm_shmem_team_world(), all, mine, sizeof mine) != MEGAMOE_OK) {
        free(all);
        return 0;
    }
    int same = 1;
    for (int r = 1; r < n; r++)
        if (strcmp(all, all + (size_t)r * sizeof mine) != 0) same = 0;
    free(all);
    return same;
}

MM_TEST(leaks_block_the_last_release)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    ASSERT_OK(mm_shmem_acquire(NULL));
    void *a = NULL, *b = NULL;
    ASSERT_OK(mm_shmem_malloc(100, 0, &a));
    ASSERT_OK(mm_shmem_malloc(5000, 1024, &b));
    mm_shmem_team_t *team = NULL;
    ASSERT_OK(mm_shmem_team_split(mm_shmem_team_world(), 0, 0, &team));
    ASSERT_OK(mm_shmem_release()); /* not the last: only counts down */
    ASSERT_EQ_INT(mm_shmem_refcount(), 1);
    ASSERT_STATUS(mm_shmem_release(), MEGAMOE_INVALID_STATE);
    const char *e = megamoe_last_error();
    ASSERT_CONTAINS(e, "2 symmetric allocation(s) and 1 team(s)");
    ASSERT_CONTAINS(e, "asked 100");
    ASSERT_CONTAINS(e, "asked 5000, align 1024");
    ASSERT_CONTAINS(e, "test_shmem_lifecycle.c:");
    ASSERT_EQ_INT(mm_shmem_refcount(), 1);
    ASSERT_TRUE(mm_shmem_is_running());
    ASSERT_OK(mm_shmem_barrier_all()); /* still fully usable */
    ASSERT_OK(mm_shmem_team_destroy(team));
    ASSERT_OK(mm_shmem_free(a));
    ASSERT_STATUS(mm_shmem_release(), MEGAMOE_INVALID_STATE);
    ASSERT_CONTAINS(megamoe_last_error(), "1 symmetric allocation(s) and 0 team(s)");
    ASSERT_OK(mm_shmem_free(b));
    ASSERT_OK(mm_shmem_release());
    ASSERT_EQ_INT(mm_shmem_refcount(), 0);
    ASSERT_FALSE(mm_shmem_is_running());
}

MM_TEST(heap_size_mismatch_fails_on_every_rank)
{
    mm_shmem_params_t p = mm_t_params();
    p.heap_size = (uint64_t)(32 + 16 * mm_test_rank()) << 20;
    ASSERT_STATUS(mm_shmem_acquire(&p), MEGAMOE_CONFIG_MISMATCH);
    char text[512];
    snprintf(text, sizeof text, "%s", megamoe_last_error());
    ASSERT_CONTAINS(text, "HYPER_PARALLEL_SHMEM_HEAP_SIZE=50331648, rank 0 has 33554432");
    ASSERT_CONTAINS(text, "rank 1 has");
    ASSERT_EQ_INT(mm_shmem_refcount(), 0);
    ASSERT_FALSE(mm_shmem_is_running());
    /* a failed first acquire leaves nothing behind and can be retried */
    p.heap_size = 32u << 20;
    ASSERT_OK(mm_shmem_acquire(&p));
    ASSERT_TRUE(mm_same_text_everywhere(text));
    ASSERT_OK(mm_shmem_release());
}

MM_TEST(diverging_allocations_fail_on_every_rank)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    int me = mm_shmem_my_pe();
    void *x = NULL;
    ASSERT_STATUS(mm_shmem_malloc(me == 0 ? 4096 : 8192, 0, &x), MEGAMOE_CONFIG_MISMATCH);
    char text[512];
    snprintf(text, sizeof text, "%s", megamoe_last_error());
    ASSERT_CONTAINS(text, "rank 0 called mm_shmem_malloc(size 4096");
    ASSERT_CONTAINS(text, "rank 1 called mm_shmem_malloc(size 8192");
    ASSERT_TRUE(mm_same_text_everywhere(text));
    mm_shmem_debug_state_t ds;
    ASSERT_OK(mm_shmem_debug_state(&ds));
    ASSERT_EQ_INT(ds.live_allocations, 0);
    /* one rank allocates while the other frees */
    ASSERT_OK(mm_shmem_malloc(256, 0, &x));
    if (me == 0) ASSERT_STATUS(mm_shmem_free(x), MEGAMOE_CONFIG_MISMATCH);
    else ASSERT_STATUS(mm_shmem_malloc(64, 0, &x), MEGAMOE_CONFIG_MISMATCH);
    snprintf(text, sizeof text, "%s", megamoe_last_error());
    ASSERT_TRUE(mm_same_text_everywhere(text));
    /* a double free on one rank only is reported on both */
    void *y = NULL;
    ASSERT_OK(mm_shmem_malloc(64, 0, &y));
    ASSERT_OK(mm_shmem_free(y));
    ASSERT_STATUS(mm_shmem_free(me == 1 ? y : x), MEGAMOE_INVALID_ARGUMENT);
    snprintf(text, sizeof text, "%s", megamoe_last_error());
    ASSERT_CONTAINS(text, "rank 1 passed a pointer that is not a live symmetric allocation");
    ASSERT_TRUE(mm_same_text_everywhere(text));
    /* exhaustion: same decision and text everywhere */
    ASSERT_STATUS(mm_shmem_malloc(100u << 20, 0, &y), MEGAMOE_OUT_OF_MEMORY);
    snprintf(text, sizeof text, "%s", megamoe_last_error());
    ASSERT_CONTAINS(text, "raise HYPER_PARALLEL_SHMEM_HEAP_SIZE to at least 101M");
    ASSERT_TRUE(mm_same_text_everywhere(text));
    ASSERT_OK(mm_shmem_free(x));
    ASSERT_OK(mm_shmem_release());
}

MM_TEST(wait_timeout_between_ranks)
{
    mm_shmem_params_t p = mm_t_params();
    p.timeout_sec = 1;
    ASSERT_OK(mm_shmem_acquire(&p));
    uint64_t *sig = NULL;
    ASSERT_OK(mm_shmem_calloc(64, 64, (void **)&sig));
    if (mm_shmem_my_pe() == 0) {
        double t0 = mm_now_s();
        ASSERT_STATUS(mm_shmem_signal_wait_until(sig, MM_SHMEM_CMP_EQ, 1, NULL), MEGAMOE_TIMEOUT);
        double dt = mm_now_s() - t0;
        ASSERT_TRUE(dt >= 0.99 && dt < 1.6);
        ASSERT_CONTAINS(megamoe_last_error(), "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC");
    } else {
        mm_sleep_ns(1200000000ull); /* never signals; arrives at the barrier after the timeout */
    }
    ASSERT_OK(mm_shmem_barrier_all());
    ASSERT_OK(mm_shmem_free(sig));
    ASSERT_OK(mm_shmem_release());
}

MM_TEST(reopen_with_new_endpoint_and_heap_size)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    int port = mm_shmem_my_pe() == 0 ? mm_t_free_port() : 0;
    ASSERT_OK(mm_shmem_team_broadcast(mm_shmem_team_world(), &port, sizeof port, 0));
    ASSERT_TRUE(port > 0);
    ASSERT_OK(mm_shmem_release());
    ASSERT_FALSE(mm_shmem_is_running());

    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", port);
    mm_shmem_params_t q = mm_t_params();
    q.endpoint = endpoint;
    q.heap_size = 48u << 20;
    ASSERT_OK(mm_shmem_acquire(&q));
    mm_shmem_debug_state_t ds;
    ASSERT_OK(mm_shmem_debug_state(&ds));
    ASSERT_EQ_U64(ds.heap_size, 48u << 20);
    /* the new heaps work: exchange a block */
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes();
    uint8_t *buf = NULL, src[4096];
    uint64_t *sig = NULL;
    ASSERT_OK(mm_shmem_calloc(sizeof src, 64, (void **)&buf));
    ASSERT_OK(mm_shmem_calloc(64, 64, (void **)&sig));
    mm_t_fill(src, sizeof src, me, 5);
    mm_shmem_put_signal(buf, src, sizeof src, sig, 1, MM_SHMEM_SIGNAL_ADD, (me + 1) % n);
    ASSERT_OK(mm_shmem_signal_wait_until(sig, MM_SHMEM_CMP_EQ, 1, NULL));
    ASSERT_EQ_INT(mm_t_check(buf, sizeof src, (me + n - 1) % n, 5), -1);
    ASSERT_OK(mm_shmem_barrier_all());
    ASSERT_OK(mm_shmem_free(buf));
    ASSERT_OK(mm_shmem_free(sig));
    ASSERT_OK(mm_shmem_release());
}
