/* Teams and communicators (run under `megamoe launch -n 4`): split order, team barrier,
 * allgather (small and chunked), broadcast, agree, nested and concurrent teams, the team slot
 * limit, and the public megamoe_comm_* API. */
#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "megamoe/comm.h"
#include "shmem/comm_impl.h"
#include "shmem_test_util.h"

MM_TEST(world_team_collectives)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    mm_shmem_team_t *w = mm_shmem_team_world();
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes();
    ASSERT_EQ_INT(mm_shmem_team_my_pe(w), me);
    ASSERT_EQ_INT(mm_shmem_team_n_pes(w), n);
    ASSERT_EQ_INT(mm_shmem_team_world_pe(w, n - 1), n - 1);
    ASSERT_EQ_INT(mm_shmem_team_world_pe(w, n), -1);
    /* allgather large enough to need several outbox rounds, in place */
    const size_t per = 150000;
    uint8_t *all = malloc(per * (size_t)n);
    mm_t_fill(all + per * (size_t)me, per, me, 3);
    ASSERT_OK(mm_shmem_team_allgather(w, all, all + per * (size_t)me, per));
    for (int r = 0; r < n; r++) ASSERT_EQ_INT(mm_t_check(all + per * (size_t)r, per, r, 3), -1);
    /* broadcast from every root, small and large */
    for (int root = 0; root < n; root++) {
        uint64_t v = me == root ? 1000 + (uint64_t)root : 0;
        ASSERT_OK(mm_shmem_team_broadcast(w, &v, sizeof v, root));
        ASSERT_EQ_U64(v, 1000 + (uint64_t)root);
        memset(all, 0, per);
        if (me == root) mm_t_fill(all, per, root, 4);
        ASSERT_OK(mm_shmem_team_broadcast(w, all, per, root));
        ASSERT_EQ_INT(mm_t_check(all, per, root, 4), -1);
    }
    ASSERT_STATUS(mm_shmem_team_broadcast(w, all, 8, n), MEGAMOE_INVALID_ARGUMENT);
    free(all);
    /* agree: all OK, then the lowest failing rank's status and text reach everyone */
    ASSERT_OK(mm_shmem_team_agree(w, MEGAMOE_OK));
    megamoe_status_t local = MEGAMOE_OK;
    if (me == 2) local = mm_error(MEGAMOE_CAPACITY_OVERFLOW, "expert 7 got 300 rows > 256");
    if (me == 3) local = mm_error(MEGAMOE_INVALID_ARGUMENT, "a later rank's failure");
    ASSERT_STATUS(mm_shmem_team_agree(w, local), MEGAMOE_CAPACITY_OVERFLOW);
    ASSERT_EQ_STR(megamoe_last_error(), "rank 2: CAPACITY_OVERFLOW: expert 7 got 300 rows > 256");
    ASSERT_OK(mm_shmem_barrier_all());
    ASSERT_OK(mm_shmem_release());
}

MM_TEST(split_order_nesting_and_concurrent_teams)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    mm_shmem_team_t *w = mm_shmem_team_world();
    int me = mm_shmem_my_pe(), n = mm_shmem_n_pes();
    ASSERT_EQ_INT(n, 4);
    /* color = parity, key = -rank: members in decreasing world order */
    mm_shmem_team_t *half = NULL;
    ASSERT_OK(mm_shmem_team_split(w, me % 2, -me, &half));
    ASSERT_TRUE(half != NULL);
    ASSERT_EQ_INT(mm_shmem_team_n_pes(half), 2);
    ASSERT_EQ_INT(mm_shmem_team_my_pe(half), me < 2 ? 1 : 0);
    ASSERT_EQ_INT(mm_shmem_team_world_pe(half, 0), me % 2 + 2);
    ASSERT_EQ_INT(mm_shmem_team_world_pe(half, 1), me % 2);
    int32_t mine[2] = {me, mm_shmem_team_my_pe(half)}, got[4];
    ASSERT_OK(mm_shmem_team_allgather(half, got, mine, sizeof mine));
    ASSERT_EQ_INT(got[0], me % 2 + 2);
    ASSERT_EQ_INT(got[1], 0);
    ASSERT_EQ_INT(got[2], me % 2);
    ASSERT_EQ_INT(got[3], 1);
    /* one rank out (color < 0), the rest in a team of 3 */
    mm_shmem_team_t *three = NULL;
    ASSERT_OK(mm_shmem_team_split(w, me == 1 ? -1 : 5, 0, &three));
    ASSERT_EQ_INT(three == NULL, me == 1);
    /* nested split of a sub-team */
    mm_shmem_team_t *solo = NULL;
    ASSERT_OK(mm_shmem_team_split(half, mm_shmem_team_my_pe(half), 0, &solo));
    ASSERT_EQ_INT(mm_shmem_team_n_pes(solo), 1);
    ASSERT_EQ_INT(mm_shmem_team_world_pe(solo, 0), me);
    /* interleave barriers and collectives of overlapping teams */
    for (int i = 0; i < 200; i++) {
        ASSERT_OK(mm_shmem_team_barrier(half));
        if (three) {
            uint64_t v = (uint64_t)i * 10 + (mm_shmem_team_my_pe(three) == 2 ? 7 : 0);
            ASSERT_OK(mm_shmem_team_broadcast(three, &v, sizeof v, 2));
            ASSERT_EQ_U64(v, (uint64_t)i * 10 + 7);
        }
        ASSERT_OK(mm_shmem_barrier_all());
        ASSERT_OK(mm_shmem_team_barrier(solo));
        megamoe_status_t local = MEGAMOE_OK;
        if (i == 100 && mm_shmem_team_my_pe(half) == 1)
            local = mm_error(MEGAMOE_INVALID_ARGUMENT, "half member 1 fails at %d", i);
        megamoe_status_t agreed = mm_shmem_team_agree(half, local);
        ASSERT_STATUS(agreed, i == 100 ? MEGAMOE_INVALID_ARGUMENT : MEGAMOE_OK);
        if (i == 100) {
            char want[96];
            snprintf(want, sizeof want, "rank %d: INVALID_ARGUMENT: half member 1 fails at 100", me % 2);
            ASSERT_EQ_STR(megamoe_last_error(), want);
        }
    }
    ASSERT_STATUS(mm_shmem_team_destroy(w), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_OK(mm_shmem_team_destroy(solo));
    if (three) ASSERT_OK(mm_shmem_team_destroy(three));
    ASSERT_OK(mm_shmem_team_destroy(half));
    ASSERT_OK(mm_shmem_release());
}

MM_TEST(team_slot_limit_fails_on_every_rank)
{
    mm_shmem_params_t p = mm_t_params();
    ASSERT_OK(mm_shmem_acquire(&p));
    mm_shmem_team_t *teams[80];
    int made = 0;
    megamoe_status_t st = MEGAMOE_OK;
    while (made < 80) {
        st = mm_shmem_team_split(mm_shmem_team_world(), 0, 0, &teams[made]);
        if (st != MEGAMOE_OK) break;
        made++;
    }
    ASSERT_STATUS(st, MEGAMOE_OUT_OF_MEMORY);
    ASSERT_CONTAINS(megamoe_last_error(), "destroy unused teams");
    ASSERT_EQ_INT(made, 63); /* 64 slots, the world team holds one */
    ASSERT_OK(mm_shmem_team_barrier(teams[62]));
    for (int i = made - 1; i >= 0; i--) ASSERT_OK(mm_shmem_team_destroy(teams[i]));
    /* slots are reusable after destroy */
    mm_shmem_team_t *again = NULL;
    ASSERT_OK(mm_shmem_team_split(mm_shmem_team_world(), 1, 0, &again));
    ASSERT_OK(mm_shmem_team_barrier(again));
    ASSERT_OK(mm_shmem_team_destroy(again));
    ASSERT_OK(mm_shmem_release());
}

MM_TEST(public_communicator)
{
    ASSERT_EQ_INT(megamoe_comm_rank(NULL), -1);
    ASSERT_OK(megamoe_comm_destroy(NULL));
    megamoe_comm_params_t cp = megamoe_comm_params_default();
    ASSERT_EQ_INT(cp.rank, -1);
    cp.heap_size = 32u << 20;
    cp.timeout_sec = (int)(30 * mm_test_timeout_multiplier());
    megamoe_comm_t *world = NULL, *pair = NULL, *none = NULL;
    ASSERT_OK(megamoe_comm_create(&cp, &world));
    int me = megamoe_comm_rank(world), n = megamoe_comm_size(world);
    ASSERT_EQ_INT(me, mm_test_rank());
    ASSERT_EQ_INT(n, mm_test_world());
    ASSERT_TRUE(mm_comm_team(world) == mm_shmem_team_world());
    ASSERT_OK(megamoe_comm_barrier(world));
    ASSERT_OK(megamoe_comm_split(world, me / 2, me, &pair));
    ASSERT_EQ_INT(megamoe_comm_size(pair), 2);
    ASSERT_EQ_INT(megamoe_comm_rank(pair), me % 2);
    ASSERT_OK(megamoe_comm_split(world, -1, 0, &none));
    ASSERT_TRUE(none == NULL);
    ASSERT_OK(megamoe_comm_barrier(pair));
    ASSERT_EQ_INT(mm_shmem_refcount(), 2);
    /* an object left on the runtime keeps the last destroy from tearing down */
    void *leak = NULL;
    ASSERT_OK(mm_shmem_malloc(64, 0, &leak));
    ASSERT_OK(megamoe_comm_destroy(pair));
    ASSERT_STATUS(megamoe_comm_destroy(world), MEGAMOE_INVALID_STATE);
    ASSERT_EQ_INT(megamoe_comm_size(world), n); /* still valid */
    ASSERT_OK(megamoe_comm_barrier(world));
    ASSERT_OK(mm_shmem_free(leak));
    ASSERT_OK(megamoe_comm_destroy(world));
    ASSERT_EQ_INT(mm_shmem_refcount(), 0);
    ASSERT_FALSE(mm_shmem_is_running());
}
