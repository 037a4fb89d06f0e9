/* The O1 static plan (see mc_plan.h): task tables and queues of both directions. */
#include "multicore/mc_plan.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/env.h"
#include "base/error.h"
#include "multicore/mc_exec.h"

static void mm_mc_graph_free(mm_mc_graph_t *g)
{
    free(g->tasks);
    free(g->queue[0]);
    free(g->queue[1]);
    memset(g, 0, sizeof *g);
}

static megamoe_status_t mm_mc_graph_alloc(mm_mc_graph_t *g, int64_t n_cube, int64_t n_vector)
{
    int64_t n = n_cube + n_vector;
    if (n >= INT32_MAX)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "the O1 plan would need %lld tasks (more than 2^31); use fewer experts or "
                        "tokens per rank, or schedule \"O0\"",
                        (long long)n);
    g->tasks = calloc((size_t)n, sizeof *g->tasks);
    g->queue[MM_MC_CUBE] = calloc((size_t)(n_cube > 0 ? n_cube : 1), sizeof(int32_t));
    g->queue[MM_MC_VECTOR] = calloc((size_t)(n_vector > 0 ? n_vector : 1), sizeof(int32_t));
    if (!g->tasks || !g->queue[0] || !g->queue[1]) {
        mm_mc_graph_free(g);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate an O1 plan of %lld tasks",
                        (long long)n);
    }
    return MEGAMOE_OK;
}

static void mm_mc_push(mm_mc_graph_t *g, int type, int role, int peer, int64_t j, int64_t k)
{
    int32_t id = g->n_tasks++;
    mm_mc_task_t *t = &g->tasks[id];
    t->type = (uint8_t)type;
    t->role = (uint8_t)role;
    t->peer = (int16_t)peer;
    t->j = (int32_t)j;
    t->k = (int32_t)k;
    g->queue[role][g->n_queue[role]++] = id;
    if (type != MM_MC_DONE && type != MM_MC_REDUCE) g->n_counted++;
}

/* RATR order of the peers, host-aware. to[]: where this rank's tile goes, step by step: first
 * the ranks of the other hosts (their puts are the slow ones and do not block, so they drain
 * while the same-host copies run), host (h + a) for a = 1, 2, ..., then this host; inside a host
 * the member (l + b) mod n, where l is this rank's index on its own host. Ranks in step then
 * never hit the same destination (with equal hosts the steps form a Latin square). from[]: the
 * order this rank computes the source blocks: its own, the rest of its host (l - b), then host
 * (h - a) for a = 1, 2, ... (the remote data arrives last). Without a host map (one host) this
 * is plain RATR: to = me + i, from = me - i. Returns -1 when out of memory. */
static int mm_mc_rank_order(int ep, int me, const int *host, int *to, int *from)
{
    int *hosts = malloc(sizeof(int) * (size_t)ep), *mem = malloc(sizeof(int) * (size_t)ep);
    int *start = malloc(sizeof(int) * (size_t)(ep + 1));
    if (!hosts || !mem || !start) {
        free(hosts), free(mem), free(start);
        return -1;
    }
    /* distinct hosts in order of first member; members grouped by host, in member order */
    int nh = 0, my_h = 0, l = 0, k = 0;
    for (int i = 0; i < ep; i++) {
        int h = host ? host[i] : 0, seen = 0;
        for (int q = 0; q < nh && !seen; q++) seen = hosts[q] == h;
        if (!seen) hosts[nh++] = h;
    }
    for (int q = 0; q < nh; q++) {
        start[q] = k;
        for (int i = 0; i < ep; i++)
            if ((host ? host[i] : 0) == hosts[q]) {
                if (i == me) {
                    my_h = q;
                    l = k - start[q];
                }
                mem[k++] = i;
            }
    }
    start[nh] = k;
    int nt = 0, nf = 0;
    for (int a = 1; a <= nh; a++) { /* a = nh: this host, last */
        int q = (my_h + a) % nh, n = start[q + 1] - start[q];
        for (int b = 0; b < n; b++) to[nt++] = mem[start[q] + (l + b) % n];
    }
    for (int a = 0; a < nh; a++) {
        int q = (my_h - a + nh) % nh, n = start[q + 1] - start[q];
        for (int b = 0; b < n; b++) from[nf++] = mem[start[q] + ((l - b) % n + n) % n];
    }
    free(hosts), free(mem), free(start);
    return 0;
}

/* The inference graph of a tier (mc_plan.h). */
static megamoe_status_t mm_mc_build_infer(mm_mc_plan_t *p, int tier)
{
    const int ep = p->s.ep, me = p->s.me;
    const int64_t S = p->S, NT = p->tier_nt[tier], tt = p->TT;
    mm_mc_graph_t *g = &p->tiers[tier][MM_MC_INF];
    MM_CHECK(mm_mc_graph_alloc(g, p->local_tasks + S * ep * NT, S * ep * NT + 1 + tt));
    int *to = malloc(sizeof(int) * (size_t)ep), *from = malloc(sizeof(int) * (size_t)ep);
    if (!to || !from || mm_mc_rank_order(ep, me, p->s.host, to, from) != 0) {
        free(to), free(from);
        mm_mc_graph_free(g);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate the O1 plan's rank order");
    }
    for (int64_t j = 0; j < S; j++)
        for (int64_t k = 0; k < NT; k++)
            for (int i = 0; i < ep; i++) mm_mc_push(g, MM_MC_DISPATCH, MM_MC_VECTOR, to[i], j, k);
    mm_mc_push(g, MM_MC_DONE, MM_MC_VECTOR, -1, -1, 0);
    for (int64_t k = 0; k < tt; k++) mm_mc_push(g, MM_MC_REDUCE, MM_MC_VECTOR, -1, -1, k);
    for (int64_t k = 0; k < p->local_tasks; k++) mm_mc_push(g, MM_MC_LOCAL, MM_MC_CUBE, -1, -1, k);
    for (int64_t j = 0; j < S; j++)
        for (int64_t k = 0; k < ep * NT; k++) mm_mc_push(g, MM_MC_EXPERT_ALL, MM_MC_CUBE, -1, j, k);
    free(to);
    free(from);
    return MEGAMOE_OK;
}

static megamoe_status_t mm_mc_build(mm_mc_plan_t *p, int tier, int dir)
{
    const int ep = p->s.ep, me = p->s.me, R = p->s.R, bwd = dir == MM_MC_BWD;
    const int64_t L = p->L, S = p->S, NT = p->tier_nt[tier], tt = p->TT;
    int64_t n_vec = S * ep * NT + 1 + tt + (bwd ? R : 0);
    int64_t n_cube = S * ep * NT + (bwd ? 2 * S * p->wchunks : 0) + R +
                     (bwd && R > 0 ? L * p->wchunks : 0);
    mm_mc_graph_t *g = &p->tiers[tier][dir];
    MM_CHECK(mm_mc_graph_alloc(g, n_cube, n_vec));

    int *to = malloc(sizeof(int) * (size_t)ep), *from = malloc(sizeof(int) * (size_t)ep);
    if (!to || !from || mm_mc_rank_order(ep, me, p->s.host, to, from) != 0) {
        free(to), free(from);
        mm_mc_graph_free(g);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate the O1 plan's rank order");
    }

    /* vector: RATR dispatch (home slots, then guest slots), the guest slots' "partial done"
     * (backward), then DONE, then the source-side reduce */
    for (int64_t j = 0; j < S; j++)
        for (int64_t k = 0; k < NT; k++)
            for (int i = 0; i < ep; i++) mm_mc_push(g, MM_MC_DISPATCH, MM_MC_VECTOR, to[i], j, k);
    for (int k = 0; bwd && k < R; k++) mm_mc_push(g, MM_MC_SLOT_DONE, MM_MC_VECTOR, -1, L + k, k);
    mm_mc_push(g, MM_MC_DONE, MM_MC_VECTOR, -1, -1, 0);
    for (int64_t k = 0; k < tt; k++) mm_mc_push(g, MM_MC_REDUCE, MM_MC_VECTOR, -1, -1, k);

    /* cube: expert tiles in the order RATR makes them arrive (own block first); backward: the
     * weight gradients of expert j follow the tiles of expert j + 1, so they find j's tiles
     * done (no worker stalls on them) while X_j, dY_j and dGU_j are still in the caches */
    /* guest slots first (after their FETCH): a guest's weight-gradient partial is then done
     * early and its home's WSUM does not wait for the end of the guest's own work */
    for (int k = 0; k < R; k++) mm_mc_push(g, MM_MC_FETCH, MM_MC_CUBE, -1, L + k, k);
    for (int64_t i = 0; i <= S; i++) {
        const int64_t j = i < S ? (i < R ? L + i : i - R) : -1;         /* slot of position i */
        const int64_t prev = i == 0 ? -1 : (i - 1 < R ? L + i - 1 : i - 1 - R);
        for (int q = 0; j >= 0 && q < ep; q++)
            for (int64_t k = 0; k < NT; k++)
                mm_mc_push(g, MM_MC_EXPERT, MM_MC_CUBE, from[q], j, k);
        if (bwd && prev >= 0) {
            for (int64_t c = 0; c < p->wchunks; c++)
                mm_mc_push(g, MM_MC_WGRAD2, MM_MC_CUBE, -1, prev, c);
            for (int64_t c = 0; c < p->wchunks; c++)
                mm_mc_push(g, MM_MC_WGRAD1, MM_MC_CUBE, -1, prev, c);
        }
    }
    /* the home experts' gradients with their guests' partials, after every own task */
    for (int64_t j = 0; bwd && R > 0 && j < L; j++)
        for (int64_t c = 0; c < p->wchunks; c++) mm_mc_push(g, MM_MC_WSUM, MM_MC_CUBE, -1, j, c);
    free(to);
    free(from);
    return MEGAMOE_OK;
}

static megamoe_status_t mm_mc_plan_make(const mm_mc_shape_t *s, int infer, int64_t local_tasks,
                                        mm_mc_plan_t **plan_p);

megamoe_status_t mm_mc_plan_create(const mm_mc_shape_t *s, mm_mc_plan_t **plan_p)
{
    return mm_mc_plan_make(s, 0, 0, plan_p);
}

megamoe_status_t mm_mc_plan_create_infer(const mm_mc_shape_t *s, int64_t local_tasks,
                                         mm_mc_plan_t **plan_p)
{
    if (s->R != 0 || local_tasks < 0 || local_tasks >= INT32_MAX)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "O1 inference plan: %d guest slots and %lld "
                        "local tasks (0 and [0, 2^31) expected)", s->R, (long long)local_tasks);
    return mm_mc_plan_make(s, 1, local_tasks, plan_p);
}

static megamoe_status_t mm_mc_plan_make(const mm_mc_shape_t *s, int infer, int64_t local_tasks,
                                        mm_mc_plan_t **plan_p)
{
    if (s->ep < 1 || s->ep > INT16_MAX || s->me < 0 || s->me >= s->ep || s->T < 1 ||
        s->T >= INT32_MAX || s->H < 1 || s->I < 1 || s->K < 1 || s->K >= INT32_MAX / s->T ||
        s->E < 1 || s->E % s->ep != 0 || s->cube < 0 || s->vector < 0 ||
        s->cube + s->vector < 1 || s->R < 0 || s->R > 1024)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "O1 plan: invalid shape (EP %d, rank %d, T %lld, H %lld, I %lld, E %lld, K "
                        "%lld, %d cube + %d vector workers)",
                        s->ep, s->me, (long long)s->T, (long long)s->H, (long long)s->I,
                        (long long)s->E, (long long)s->K, s->cube, s->vector);
    mm_mc_plan_t *p = calloc(1, sizeof *p);
    if (p == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate an O1 plan");
    p->s = *s;
    p->infer = infer;
    p->local_tasks = local_tasks;
    p->s.host = s->host; /* used by the build below only */
    p->L = s->E / s->ep;
    p->S = p->L + s->R;
    p->NT = (s->T * s->K + MM_MC_TILE - 1) / MM_MC_TILE;
    p->TT = (s->T + MM_MC_TILE - 1) / MM_MC_TILE;
    /* Enough weight-gradient chunks that every worker can take part; results do not depend
     * on the chunking (each element is one product over all the expert's rows). */
    p->wchunks = s->cube + s->vector;
    for (int64_t nt = 1;; nt *= 2) { /* tiers 1, 2, 4, ... and NT last */
        p->tier_nt[p->n_tiers++] = nt < p->NT ? nt : p->NT;
        if (nt >= p->NT) break;
    }
    p->graph = p->tiers[p->n_tiers - 1];
    megamoe_status_t st = MEGAMOE_OK;
    for (int t = 0; t < p->n_tiers && st == MEGAMOE_OK; t++) {
        if (p->infer) {
            st = mm_mc_build_infer(p, t);
            continue;
        }
        st = mm_mc_build(p, t, MM_MC_FWD);
        if (st == MEGAMOE_OK) st = mm_mc_build(p, t, MM_MC_BWD);
    }
    p->s.host = NULL; /* the caller's array need not outlive this call */
    if (st != MEGAMOE_OK) {
        mm_mc_plan_destroy(p);
        return st;
    }
    *plan_p = p;
    return MEGAMOE_OK;
}

void mm_mc_plan_destroy(mm_mc_plan_t *p)
{
    if (p == NULL) return;
    for (int t = 0; t < p->n_tiers; t++) {
        mm_mc_graph_free(&p->tiers[t][0]);
        mm_mc_graph_free(&p->tiers[t][1]);
        mm_mc_graph_free(&p->tiers[t][2]);
    }
    free(p);
}

int mm_mc_plan_tier(const mm_mc_plan_t *p, int64_t block_rows)
{
    int t = 0;
    while (t + 1 < p->n_tiers && p->tier_nt[t] * MM_MC_TILE < block_rows) t++;
    return t;
}

static megamoe_status_t mm_mc_env_count(mm_env_id_t id, int *n_p)
{
    int64_t v = 0;
    megamoe_status_t st = mm_env_int(id, &v);
    if (st == MEGAMOE_NOT_FOUND) v = 0;
    else if (st != MEGAMOE_OK) return st;
    *n_p = (int)v;
    return MEGAMOE_OK;
}

megamoe_status_t mm_mc_workers(int total, int explicit_total, int cube, int vector, int *cube_p,
                               int *vector_p)
{
    if (cube < 0 || vector < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "cube_workers = %d and vector_workers = %d must be >= 0 (0 = derived)",
                        cube, vector);
    if (cube == 0 && vector == 0) {
        MM_CHECK(mm_mc_env_count(MM_ENV_CUBE_WORKERS, &cube));
        MM_CHECK(mm_mc_env_count(MM_ENV_VECTOR_WORKERS, &vector));
        if (explicit_total) cube = vector = 0; /* an explicit total beats the environment */
    } else if (explicit_total && cube + vector != total) {
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "workers = %d but cube_workers + vector_workers = %d + %d; set workers "
                        "to 0 or to their sum",
                        total, cube, vector);
    }
    if (cube == 0 && vector == 0) {
        if (total < 1) total = 1;
        vector = total >= 2 ? (total / 4 > 1 ? total / 4 : 1) : 0;
        cube = total - vector;
    }
    if (cube + vector > MM_MC_MAX_WORKERS)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "%d cube + %d vector workers exceed the limit of %d per rank", cube, vector,
                        MM_MC_MAX_WORKERS);
    *cube_p = cube;
    *vector_p = vector;
    return MEGAMOE_OK;
}

size_t mm_mc_heap_bytes(int ep, int64_t L, int R)
{
    /* arrival [S][EP], done [EP], weights ready [R], guest partial done [EP][R], all rows
     * arrived [EP] (inference) */
    size_t lines = (size_t)((L + R) * ep + ep + R + (int64_t)ep * R + ep) * 64;
    return mm_align_up(lines + (size_t)2 * (size_t)ep * MM_MC_SLOT_BYTES, 4096);
}
