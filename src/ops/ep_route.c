/* Routing plan: local counting sort, count exchange, offsets, capacity check. */
#include "ops/ep_route.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

megamoe_status_t mm_ep_plan_create(const mm_ep_shape_t *s, mm_ep_plan_t **plan_p)
{
    if (s->ep < 1 || s->me < 0 || s->me >= s->ep)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "rank %d / team size %d out of range", s->me,
                        s->ep);
    if (s->tokens < 1 || s->top_k < 1 || s->experts < 1 || s->experts % s->ep != 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "routing shape T=%lld K=%lld E=%lld EP=%d: need T, K >= 1 and E a "
                        "multiple of EP",
                        (long long)s->tokens, (long long)s->top_k, (long long)s->experts, s->ep);
    if (s->tokens * s->top_k >= INT32_MAX || s->experts >= INT32_MAX / s->ep)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "T*K = %lld rows exceeds 2^31 - 1",
                        (long long)(s->tokens * s->top_k));
    if (s->capacity < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "receive capacity %lld must be >= 0",
                        (long long)s->capacity);
    mm_ep_plan_t *p = calloc(1, sizeof *p);
    if (p == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate a routing plan");
    p->ep = s->ep;
    p->me = s->me;
    p->T = s->tokens;
    p->K = s->top_k;
    p->E = s->experts;
    p->L = s->experts / s->ep;
    p->capacity = s->capacity;
    p->capacity_factor = s->capacity_factor;
    size_t tk = (size_t)(p->T * p->K), e = (size_t)p->E, lb = (size_t)(p->L * p->ep);
    p->counts = calloc((size_t)p->ep * e, sizeof *p->counts);
    p->hist = calloc(e, sizeof *p->hist);
    p->src_off = calloc(e + 1, sizeof *p->src_off);
    p->perm_slot = calloc(tk, sizeof *p->perm_slot);
    p->slot_pos = calloc(tk, sizeof *p->slot_pos);
    p->dst_off = calloc(e, sizeof *p->dst_off);
    p->group_off = calloc((size_t)p->L + 1, sizeof *p->group_off);
    p->blk_off = calloc(lb, sizeof *p->blk_off);
    p->blk_rows = calloc(lb, sizeof *p->blk_rows);
    p->ret_off = calloc(lb, sizeof *p->ret_off);
    if (!p->counts || !p->hist || !p->src_off || !p->perm_slot || !p->slot_pos || !p->dst_off ||
        !p->group_off || !p->blk_off || !p->blk_rows || !p->ret_off) {
        mm_ep_plan_destroy(p);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate a routing plan for T*K=%zu rows",
                        tk);
    }
    *plan_p = p;
    return MEGAMOE_OK;
}

void mm_ep_plan_destroy(mm_ep_plan_t *p)
{
    if (p == NULL) return;
    free(p->counts);
    free(p->hist);
    free(p->src_off);
    free(p->perm_slot);
    free(p->slot_pos);
    free(p->dst_off);
    free(p->group_off);
    free(p->blk_off);
    free(p->blk_rows);
    free(p->ret_off);
    free(p);
}

/* Count slots per expert into hist (own row of counts), validating ids. */
static megamoe_status_t mm_ep_count(mm_ep_plan_t *p, const void *ids, megamoe_dtype_t dt,
                                    int32_t *hist)
{
    int64_t n = p->T * p->K;
    memset(hist, 0, (size_t)p->E * sizeof *hist);
    if (dt == MEGAMOE_DTYPE_INT32) {
        const int32_t *v = ids;
        for (int64_t i = 0; i < n; i++) {
            if (MM_UNLIKELY(v[i] < 0 || v[i] >= p->E))
                return mm_error(MEGAMOE_INVALID_ARGUMENT,
                                "topk_ids[%lld][%lld] = %d is not a global expert id in [0, %lld)",
                                (long long)(i / p->K), (long long)(i % p->K), (int)v[i],
                                (long long)p->E);
            hist[v[i]]++;
        }
    } else if (dt == MEGAMOE_DTYPE_INT64) {
        const int64_t *v = ids;
        for (int64_t i = 0; i < n; i++) {
            if (MM_UNLIKELY(v[i] < 0 || v[i] >= p->E))
                return mm_error(MEGAMOE_INVALID_ARGUMENT,
                                "topk_ids[%lld][%lld] = %lld is not a global expert id in [0, %lld)",
                                (long long)(i / p->K), (long long)(i % p->K), (long long)v[i],
                                (long long)p->E);
            hist[v[i]]++;
        }
    } else {
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "topk_ids must be int32 or int64, got %s",
                        megamoe_dtype_name(dt));
    }
    return MEGAMOE_OK;
}

static megamoe_status_t mm_ep_check_hist(const mm_ep_plan_t *p, const int32_t *hist,
                                         const void *tpe, megamoe_dtype_t dt)
{
    if (dt != MEGAMOE_DTYPE_INT32 && dt != MEGAMOE_DTYPE_INT64)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "tokens_per_expert must be int32 or int64, got %s",
                        megamoe_dtype_name(dt));
    for (int64_t e = 0; e < p->E; e++) {
        int64_t given = dt == MEGAMOE_DTYPE_INT32 ? ((const int32_t *)tpe)[e]
                                                  : ((const int64_t *)tpe)[e];
        if (given != hist[e])
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "tokens_per_expert[%lld] = %lld but topk_ids route %d slots to expert "
                            "%lld (MEGAMOE_CHECK=1); pass the exact local histogram or omit it",
                            (long long)e, (long long)given, (int)hist[e], (long long)e);
    }
    return MEGAMOE_OK;
}

uint64_t mm_ep_count_passes;

/* The caller's histogram as this rank's counts (no pass over the ids): every entry in
 * [0, T*K] and the sum T*K; whether it matches the ids is checked by the permutation. */
static megamoe_status_t mm_ep_take_hist(mm_ep_plan_t *p, const void *tpe, megamoe_dtype_t dt)
{
    if (dt != MEGAMOE_DTYPE_INT32 && dt != MEGAMOE_DTYPE_INT64)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "tokens_per_expert must be int32 or int64, got %s",
                        megamoe_dtype_name(dt));
    const int64_t tk = p->T * p->K;
    int64_t sum = 0;
    for (int64_t e = 0; e < p->E; e++) {
        int64_t v = dt == MEGAMOE_DTYPE_INT32 ? ((const int32_t *)tpe)[e]
                                              : ((const int64_t *)tpe)[e];
        if (v < 0 || v > tk)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "tokens_per_expert[%lld] = %lld is not a slot count in [0, T*K = "
                            "%lld]; pass the exact local histogram of topk_ids or omit it",
                            (long long)e, (long long)v, (long long)tk);
        p->hist[e] = (int32_t)v;
        sum += v;
    }
    if (sum != tk)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "tokens_per_expert sums to %lld but topk_ids has T*K = %lld slots; pass "
                        "the exact local histogram of topk_ids or omit it",
                        (long long)sum, (long long)tk);
    return MEGAMOE_OK;
}

/* Stable counting sort of slots by expert (source side) from this rank's histogram.
 * checked != 0 (a histogram the ids were not counted for): ids outside [0, E) and an expert
 * receiving more slots than its count are INVALID_ARGUMENT; since the counts sum to T*K, no
 * overflow anywhere means every count is exact. */
static megamoe_status_t mm_ep_permute(mm_ep_plan_t *p, const void *ids, megamoe_dtype_t dt,
                                      int checked)
{
    const int32_t *hist = p->hist;
    p->src_off[0] = 0;
    for (int64_t e = 0; e < p->E; e++) p->src_off[e + 1] = p->src_off[e] + hist[e];
    int64_t n = p->T * p->K;
    int64_t *next = p->dst_off; /* scratch until the offsets are computed */
    for (int64_t e = 0; e < p->E; e++) next[e] = p->src_off[e];
    for (int64_t i = 0; i < n; i++) {
        int64_t e = dt == MEGAMOE_DTYPE_INT32 ? ((const int32_t *)ids)[i] : ((const int64_t *)ids)[i];
        if (checked && MM_UNLIKELY(e < 0 || e >= p->E))
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "topk_ids[%lld][%lld] = %lld is not a global expert id in [0, %lld)",
                            (long long)(i / p->K), (long long)(i % p->K), (long long)e,
                            (long long)p->E);
        if (checked && MM_UNLIKELY(next[e] >= p->src_off[e + 1]))
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "tokens_per_expert[%lld] = %d but topk_ids route more slots to expert "
                            "%lld (the first extra one is topk_ids[%lld][%lld]); pass the exact "
                            "local histogram or omit it (MEGAMOE_CHECK=1 compares every entry)",
                            (long long)e, (int)hist[e], (long long)e, (long long)(i / p->K),
                            (long long)(i % p->K));
        int64_t pos = next[e]++;
        p->perm_slot[pos] = (int32_t)i;
        p->slot_pos[i] = (int32_t)pos;
    }
    return MEGAMOE_OK;
}

/* Offsets from the gathered counts (identical on every rank). */
static void mm_ep_offsets(mm_ep_plan_t *p)
{
    const int ep = p->ep, me = p->me;
    const int64_t E = p->E, L = p->L;
    const int32_t *c = p->counts;
    /* Source side: where my block for expert e starts on its owner. */
    for (int64_t e = 0; e < E; e++) {
        int64_t d = e / L, j = e % L, off = 0;
        for (int64_t jj = 0; jj < j; jj++)
            for (int s = 0; s < ep; s++) off += c[(size_t)s * E + (size_t)(d * L + jj)];
        for (int s = 0; s < me; s++) off += c[(size_t)s * E + (size_t)e];
        p->dst_off[e] = off;
    }
    /* Destination side. */
    int64_t row = 0;
    for (int64_t j = 0; j < L; j++) {
        int64_t e = (int64_t)me * L + j;
        p->group_off[j] = row;
        for (int s = 0; s < ep; s++) {
            int64_t n = c[(size_t)s * E + (size_t)e], ret = 0;
            for (int64_t ee = 0; ee < e; ee++) ret += c[(size_t)s * E + (size_t)ee];
            p->blk_off[j * ep + s] = row;
            p->blk_rows[j * ep + s] = n;
            p->ret_off[j * ep + s] = ret;
            row += n;
        }
    }
    p->group_off[L] = row;
    p->recv_rows = row;
    /* Whole team: the largest receive count. */
    p->max_recv = -1;
    p->max_recv_rank = 0;
    for (int d = 0; d < ep; d++) {
        int64_t r = 0;
        for (int s = 0; s < ep; s++)
            for (int64_t e = (int64_t)d * L; e < (int64_t)(d + 1) * L; e++) r += c[(size_t)s * E + (size_t)e];
        if (r > p->max_recv) {
            p->max_recv = r;
            p->max_recv_rank = d;
        }
    }
}

megamoe_status_t mm_ep_route(mm_ep_plan_t *p, mm_shmem_team_t *team, mm_call_t *call,
                             const void *ids, megamoe_dtype_t ids_dtype, const void *tpe,
                             megamoe_dtype_t tpe_dtype, int check, megamoe_status_t local_status)
{
    int32_t *hist = p->hist;
    megamoe_status_t st = local_status;
    if (st == MEGAMOE_OK && ids == NULL)
        st = mm_error(MEGAMOE_INVALID_ARGUMENT, "topk_ids is NULL");
    if (st == MEGAMOE_OK && tpe != NULL && !check) {
        /* the router's exact histogram spares the counting pass (seed 000): the permutation
         * is the only pass over the ids, and it refuses a histogram they contradict */
        st = mm_ep_take_hist(p, tpe, tpe_dtype);
        if (st == MEGAMOE_OK) st = mm_ep_permute(p, ids, ids_dtype, 1);
    } else if (st == MEGAMOE_OK) {
        mm_ep_count_passes++;
        st = mm_ep_count(p, ids, ids_dtype, hist);
        if (st == MEGAMOE_OK && tpe != NULL) st = mm_ep_check_hist(p, hist, tpe, tpe_dtype);
        if (st == MEGAMOE_OK) st = mm_ep_permute(p, ids, ids_dtype, 0);
    }
    /* One exchange: the call's descriptor and every rank's status with the counts, so calls
     * made out of order and a failure of any rank stop every rank before data moves. */
    const size_t cb = (size_t)p->E * sizeof *hist;
    MM_CHECK(mm_call_exchange(call, team, st, hist, cb));
    for (int s = 0; s < p->ep; s++)
        memcpy(p->counts + (size_t)s * (size_t)p->E, mm_call_payload(call, s), cb);

    mm_ep_offsets(p);
    if (p->max_recv > p->capacity) {
        int64_t tk = p->T * p->K;
        double need = (double)p->max_recv / (double)tk;
        if (p->capacity_factor > 0)
            return mm_error(MEGAMOE_CAPACITY_OVERFLOW,
                            "MegaMoe receive capacity overflow: rank %d would receive %lld rows "
                            "but the receive capacity is %lld rows (expert_capacity_factor %g, "
                            "T*K = %lld); raise expert_capacity_factor to at least %.4f or leave "
                            "it unset for the lossless capacity align128(EP*T*K)",
                            p->max_recv_rank, (long long)p->max_recv, (long long)p->capacity,
                            p->capacity_factor, (long long)tk, need);
        return mm_error(MEGAMOE_CAPACITY_OVERFLOW,
                        "MegaMoe receive capacity overflow: rank %d would receive %lld rows but "
                        "the receive capacity is %lld rows",
                        p->max_recv_rank, (long long)p->max_recv, (long long)p->capacity);
    }
    return MEGAMOE_OK;
}

int64_t mm_ep_expert_of_pos(const mm_ep_plan_t *p, int64_t pos)
{
    int64_t lo = 0, hi = p->E - 1; /* largest e with src_off[e] <= pos */
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (p->src_off[mid] <= pos) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}
