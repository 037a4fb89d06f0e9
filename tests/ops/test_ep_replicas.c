/* The hot-expert replica planner (src/ops/ep_replicas.h): a pure function of the gathered
 * count matrix, so these tests need no ranks. They check that it moves nothing when the load
 * is balanced, respects the slot budget, the receive capacity and every source's counts,
 * never makes the slowest rank slower, gives the same plan for the same counts, balances the
 * routing patterns of `megamoe bench layer`, and prefers guests on the home's host. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/harness.h"
#include "moe_data.h"
#include "ops/ep_replicas.h"

static mm_ep_replica_plan_t *mm_planned(int ep, int64_t E, int R, const int32_t *counts,
                                        const int32_t *host_of, int64_t capacity)
{
    mm_ep_replica_plan_t *p = NULL;
    if (mm_ep_replica_plan_create(ep, E, R, &p) != MEGAMOE_OK) return NULL;
    mm_ep_replica_input_t in = {ep, E, R, counts, host_of, capacity, mm_ep_replica_cost_default()};
    if (mm_ep_replica_plan(&in, p) != MEGAMOE_OK) {
        mm_ep_replica_plan_destroy(p);
        return NULL;
    }
    return p;
}

static int64_t mm_max_of(const int64_t *v, int n)
{
    int64_t m = v[0];
    for (int i = 1; i < n; i++)
        if (v[i] > m) m = v[i];
    return m;
}

/* Every invariant of a plan for counts; 1 when all hold (prints the first violation). */
static int mm_plan_valid(const mm_ep_replica_plan_t *p, const int32_t *counts, int64_t capacity)
{
    const int ep = p->ep, R = p->R, n = ep * R;
    const int64_t E = p->E, L = p->L;
    int64_t *load = calloc((size_t)ep, sizeof *load), moved = 0;
    int guests = 0, ok = 1;
    for (int q = 0; q < n && ok; q++) {
        const int d = q / R;
        const int64_t e = p->slot_expert[q];
        if (e < 0) {
            for (int s = 0; s < ep; s++)
                if (p->take[(size_t)s * n + q] != 0) {
                    fprintf(stderr, "free slot %d takes rows from %d\n", q, s);
                    ok = 0;
                }
            continue;
        }
        guests++;
        if (e >= E || e / L == d) {
            fprintf(stderr, "slot %d of rank %d serves expert %lld (its own or invalid)\n", q, d,
                    (long long)e);
            ok = 0;
        }
        for (int g = 0; g < R; g++)
            if (d * R + g != q && p->slot_expert[d * R + g] == e) {
                fprintf(stderr, "rank %d hosts expert %lld twice\n", d, (long long)e);
                ok = 0;
            }
        for (int s = 0; s < ep; s++) {
            load[d] += p->take[(size_t)s * n + q];
            moved += p->take[(size_t)s * n + q];
        }
    }
    for (int64_t e = 0; e < E && ok; e++)
        for (int s = 0; s < ep; s++) {
            int64_t home = mm_ep_replica_home_rows(p, counts, s, e);
            if (home < 0) {
                fprintf(stderr, "source %d gives more rows of expert %lld than it has\n", s,
                        (long long)e);
                ok = 0;
            }
            load[e / L] += home;
        }
    for (int d = 0; d < ep && ok; d++) {
        if (load[d] != p->load[d]) {
            fprintf(stderr, "rank %d computes %lld rows, the plan says %lld\n", d,
                    (long long)load[d], (long long)p->load[d]);
            ok = 0;
        }
        if (capacity > 0 && p->load[d] > capacity && p->load[d] > p->load_plain[d]) {
            fprintf(stderr, "rank %d was given %lld rows over its capacity %lld\n", d,
                    (long long)p->load[d], (long long)capacity);
            ok = 0;
        }
    }
    if (ok && (guests != p->n_guests || moved != p->rows_moved)) {
        fprintf(stderr, "summary: %d guests / %lld moved, plan says %d / %lld\n", guests,
                (long long)moved, p->n_guests, (long long)p->rows_moved);
        ok = 0;
    }
    if (ok && mm_max_of(p->load, ep) > mm_max_of(p->load_plain, ep)) {
        fprintf(stderr, "the slowest rank got slower: %lld > %lld rows\n",
                (long long)mm_max_of(p->load, ep), (long long)mm_max_of(p->load_plain, ep));
        ok = 0;
    }
    free(load);
    return ok;
}

static uint64_t mm_rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

MM_TEST(balanced_routing_moves_nothing)
{
    const int ep = 4;
    const int64_t E = 8;
    int32_t counts[4 * 8];
    for (int i = 0; i < ep * E; i++) counts[i] = 1024;
    mm_ep_replica_plan_t *p = mm_planned(ep, E, 2, counts, NULL, 0);
    ASSERT_TRUE(p != NULL);
    ASSERT_EQ_INT(p->n_guests, 0);
    ASSERT_EQ_INT(p->rows_moved, 0);
    for (int q = 0; q < ep * 2; q++) ASSERT_EQ_INT(p->slot_expert[q], -1);
    ASSERT_TRUE(mm_plan_valid(p, counts, 0));
    /* nearly balanced (a few percent, what a real router gives): not worth a guest either */
    uint64_t seed = 7;
    for (int i = 0; i < ep * E; i++) counts[i] = 1000 + (int32_t)(mm_rng(&seed) % 64);
    ASSERT_TRUE(mm_ep_replica_plan(&(mm_ep_replica_input_t){ep, E, 2, counts, NULL, 0,
                                                            mm_ep_replica_cost_default()},
                                   p) == MEGAMOE_OK);
    ASSERT_EQ_INT(p->n_guests, 0);
    mm_ep_replica_plan_destroy(p);
}

MM_TEST(plans_respect_slots_counts_and_capacity)
{
    uint64_t seed = 12345;
    const int eps[] = {2, 3, 4, 8};
    for (int t = 0; t < 400; t++) {
        const int ep = eps[t % 4], R = 1 + (int)(t / 4 % 3);
        const int64_t L = 1 + (int64_t)(mm_rng(&seed) % 4), E = L * ep;
        int32_t *counts = calloc((size_t)(ep * E), sizeof *counts);
        const int64_t hot = (int64_t)(mm_rng(&seed) % (uint64_t)E);
        for (int s = 0; s < ep; s++)
            for (int64_t e = 0; e < E; e++) {
                int64_t v = (int64_t)(mm_rng(&seed) % 300);
                if (e == hot) v += (int64_t)(mm_rng(&seed) % 3000);
                if (t % 5 == 0 && e / L != 0) v = 0; /* everything to rank 0 */
                counts[s * E + e] = (int32_t)v;
            }
        int64_t total = 0;
        for (int i = 0; i < ep * E; i++) total += counts[i];
        const int64_t capacity = t % 3 == 0 ? total / ep + 64 : 0;
        mm_ep_replica_plan_t *p = mm_planned(ep, E, R, counts, NULL, capacity);
        ASSERT_TRUE(p != NULL);
        if (!mm_plan_valid(p, counts, capacity)) {
            fprintf(stderr, "case %d: ep %d, E %lld, R %d\n", t, ep, (long long)E, R);
            ASSERT_TRUE(0);
        }
        free(counts);
        mm_ep_replica_plan_destroy(p);
    }
}

MM_TEST(same_counts_give_the_same_plan)
{
    const int ep = 4, R = 2;
    const int64_t E = 8;
    int32_t counts[4 * 8];
    uint64_t seed = 99;
    for (int i = 0; i < ep * E; i++) counts[i] = (int32_t)(mm_rng(&seed) % 200);
    counts[0 * E + 1] += 3000; /* expert 1 (rank 0) is hot at every source */
    counts[2 * E + 1] += 2000;
    mm_ep_replica_plan_t *a = mm_planned(ep, E, R, counts, NULL, 0);
    mm_ep_replica_plan_t *b = mm_planned(ep, E, R, counts, NULL, 0);
    ASSERT_TRUE(a && b);
    ASSERT_TRUE(a->n_guests > 0);
    ASSERT_TRUE(memcmp(a->slot_expert, b->slot_expert, (size_t)(ep * R) * sizeof(int32_t)) == 0);
    ASSERT_TRUE(memcmp(a->take, b->take, (size_t)(ep * ep * R) * sizeof(int32_t)) == 0);
    ASSERT_TRUE(memcmp(a->load, b->load, (size_t)ep * sizeof(int64_t)) == 0);
    /* planning again into a used plan gives the same result */
    mm_ep_replica_input_t in = {ep, E, R, counts, NULL, 0, mm_ep_replica_cost_default()};
    ASSERT_OK(mm_ep_replica_plan(&in, b));
    ASSERT_TRUE(memcmp(a->take, b->take, (size_t)(ep * ep * R) * sizeof(int32_t)) == 0);
    mm_ep_replica_plan_destroy(a);
    mm_ep_replica_plan_destroy(b);
}

/* The patterns of `megamoe bench layer` at its large shape (T=4096, E=8, K=2) on 2 ranks and
 * a 4-rank variant: the slowest rank ends within a few percent of the mean. */
MM_TEST(bench_routing_patterns_get_balanced)
{
    const mm_route_pattern_t pats[] = {MM_ROUTE_ZERO, MM_ROUTE_SKEW, MM_ROUTE_SINGLE};
    for (int ep = 2; ep <= 4; ep += 2)
        for (int i = 0; i < 3; i++) {
            mm_moe_problem_t P;
            ASSERT_TRUE(mm_moe_problem_create(&P, ep, 4096, 8, 8, 8, 2, pats[i], 1) == 0);
            const int64_t E = 8, N = (int64_t)ep * 4096 * 2;
            int32_t *counts = calloc((size_t)(ep * E), sizeof *counts);
            for (int64_t k = 0; k < N; k++) counts[(k / (4096 * 2)) * E + P.ids[k]]++;
            mm_moe_problem_free(&P);
            const int R = ep == 2 ? 2 : 2;
            mm_ep_replica_plan_t *p = mm_planned(ep, E, R, counts, NULL, 0);
            ASSERT_TRUE(p != NULL);
            ASSERT_TRUE(mm_plan_valid(p, counts, 0));
            const int64_t mean = N / ep, mx = mm_max_of(p->load, ep);
            printf("%s ep %d: slowest rank %lld -> %lld rows (mean %lld), %d guests, %lld rows "
                   "moved\n",
                   mm_route_name(pats[i]), ep, (long long)mm_max_of(p->load_plain, ep),
                   (long long)mx, (long long)mean, p->n_guests, (long long)p->rows_moved);
            ASSERT_LE_INT(mx, mean + mean / 20);
            free(counts);
            mm_ep_replica_plan_destroy(p);
        }
}

MM_TEST(guests_prefer_the_homes_host_and_their_own_rows)
{
    const int ep = 4, R = 1;
    const int64_t E = 4; /* one expert per rank */
    int32_t counts[4 * 4] = {0};
    for (int s = 0; s < ep; s++) counts[s * E + 0] = 1000; /* expert 0 (rank 0) gets it all */
    const int32_t hosts[4] = {1, 0, 1, 0};                  /* rank 2 shares rank 0's host */
    mm_ep_replica_plan_t *p = mm_planned(ep, E, R, counts, hosts, 0);
    ASSERT_TRUE(p != NULL && mm_plan_valid(p, counts, 0));
    ASSERT_TRUE(p->n_guests >= 1);
    /* the first guest goes to the same-host rank although rank 1 is as light */
    ASSERT_EQ_INT(p->slot_expert[2 * R + 0], 0);
    /* and it takes its own rows first: no transfer for those */
    int64_t slot_rows = 0;
    for (int s = 0; s < ep; s++) slot_rows += p->take[s * ep * R + 2 * R + 0];
    ASSERT_EQ_INT(p->take[2 * ep * R + 2 * R + 0], slot_rows < 1000 ? slot_rows : 1000);
    mm_ep_replica_plan_destroy(p);
    /* one host: the lower rank index wins the tie */
    p = mm_planned(ep, E, R, counts, NULL, 0);
    ASSERT_TRUE(p != NULL && mm_plan_valid(p, counts, 0));
    ASSERT_EQ_INT(p->slot_expert[1 * R + 0], 0);
    mm_ep_replica_plan_destroy(p);
}

MM_TEST(small_imbalance_below_the_cost_stays)
{
    const int ep = 2, R = 1;
    const int64_t E = 2;
    /* 200 rows more on rank 0: moving 100 would save less than the guest's fixed costs */
    int32_t counts[2 * 2] = {600, 500, 600, 500};
    mm_ep_replica_plan_t *p = mm_planned(ep, E, R, counts, NULL, 0);
    ASSERT_TRUE(p != NULL);
    ASSERT_EQ_INT(p->n_guests, 0);
    mm_ep_replica_plan_destroy(p);
    /* capacity: a guest never takes more than its receive buffer holds */
    int32_t hot[2 * 2] = {4000, 0, 4000, 0};
    p = mm_planned(ep, E, R, hot, NULL, 1000);
    ASSERT_TRUE(p != NULL && mm_plan_valid(p, hot, 1000));
    ASSERT_LE_INT(p->load[1], 1000);
    ASSERT_TRUE(p->load[1] > 0);
    mm_ep_replica_plan_destroy(p);
}

MM_TEST(bad_shapes_are_refused)
{
    mm_ep_replica_plan_t *p = NULL;
    ASSERT_STATUS(mm_ep_replica_plan_create(2, 3, 1, &p), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_ep_replica_plan_create(2, 4, 0, &p), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_STATUS(mm_ep_replica_plan_create(0, 4, 1, &p), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_OK(mm_ep_replica_plan_create(2, 4, 1, &p));
    int32_t counts[8] = {0};
    mm_ep_replica_input_t in = {2, 4, 2, counts, NULL, 0, mm_ep_replica_cost_default()};
    ASSERT_STATUS(mm_ep_replica_plan(&in, p), MEGAMOE_INTERNAL); /* R differs */
    mm_ep_replica_plan_destroy(p);
}
