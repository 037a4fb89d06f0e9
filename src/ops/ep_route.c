/* Routing plan: local counting sort, count exchange, offsets, capacity check. */
#include "ops/ep_route.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/freelist.h"

/* Routing plans handed back (one per outstanding forward: the saved state owns its plan). */
static mm_freelist_t mm_ep_plan_blocks = MM_FREELIST_INIT;

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
    if (s->replica_slots < 0 || s->replica_slots > 1024)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "replica_slots_per_rank = %d must be in [0, 1024]", s->replica_slots);
    /* One zeroed block holds the plan and all its arrays, sized from the shape alone; blocks
     * are kept in mm_ep_plan_blocks, so a steady state of one shape allocates nothing. */
    const size_t S = (size_t)(s->experts / s->ep) + (size_t)s->replica_slots;
    const size_t tk = (size_t)(s->tokens * s->top_k), e = (size_t)s->experts;
    const size_t lb = S * (size_t)s->ep, slots = (size_t)s->ep * S, ep = (size_t)s->ep;
    const size_t sizes[] = {
        sizeof(mm_ep_plan_t),
        ep * e * sizeof(int32_t),        /* counts */
        (e + 1) * sizeof(int32_t),       /* hist, then T_r (the exchange's payload) */
        (e + 1) * sizeof(int64_t),       /* src_off */
        tk * sizeof(int32_t),            /* perm_slot */
        tk * sizeof(int32_t),            /* slot_pos */
        e * sizeof(int64_t),             /* dst_off */
        (S + 1) * sizeof(int64_t),       /* group_off */
        lb * sizeof(int64_t),            /* blk_off */
        lb * sizeof(int64_t),            /* blk_rows */
        lb * sizeof(int64_t),            /* ret_off */
        slots * sizeof(int32_t),         /* slot_expert */
        slots * sizeof(int64_t),         /* seg_pos */
        slots * sizeof(int64_t),         /* seg_rows */
        slots * sizeof(int64_t),         /* seg_dst */
        slots * sizeof(int32_t),         /* seg_order */
        slots * ep * sizeof(int64_t),    /* bcount */
        ep * (e + 1) * sizeof(int64_t),  /* src_prefix */
        s->host_of != NULL ? ep * sizeof(int32_t) : 0, /* host_of */
        ep * sizeof(int64_t),            /* tokens_of */
    };
    enum { NPARTS = sizeof sizes / sizeof sizes[0] };
    size_t total = 0;
    for (int i = 0; i < NPARTS; i++) total += mm_align_up(sizes[i], 64);
    char *blk = NULL;
    if (mm_freelist_get(&mm_ep_plan_blocks, total, 1, "routing plan", (void **)&blk) != MEGAMOE_OK)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate a routing plan for T*K=%zu rows",
                        tk);
    void *part[NPARTS];
    for (size_t i = 0, off = 0; i < NPARTS; off += mm_align_up(sizes[i], 64), i++)
        part[i] = sizes[i] > 0 ? blk + off : NULL;
    mm_ep_plan_t *p = part[0];
    p->ep = s->ep;
    p->me = s->me;
    p->T = s->tokens;
    p->T_cap = s->tokens;
    p->K = s->top_k;
    p->E = s->experts;
    p->L = s->experts / s->ep;
    p->capacity = s->capacity;
    p->capacity_factor = s->capacity_factor;
    p->R = s->replica_slots;
    p->S = p->L + p->R;
    p->replica_cost = s->replica_cost;
    p->counts = part[1];
    p->hist = part[2];
    p->src_off = part[3];
    p->perm_slot = part[4];
    p->slot_pos = part[5];
    p->dst_off = part[6];
    p->group_off = part[7];
    p->blk_off = part[8];
    p->blk_rows = part[9];
    p->ret_off = part[10];
    p->slot_expert = part[11];
    p->seg_pos = part[12];
    p->seg_rows = part[13];
    p->seg_dst = part[14];
    p->seg_order = part[15];
    p->bcount = part[16];
    p->src_prefix = part[17];
    p->host_of = part[18];
    p->tokens_of = part[19];
    if (p->host_of != NULL) memcpy(p->host_of, s->host_of, ep * sizeof *p->host_of);
    if (p->R > 0) {
        megamoe_status_t st = mm_ep_replica_plan_create(p->ep, p->E, p->R, &p->rep);
        if (st != MEGAMOE_OK) {
            mm_ep_plan_destroy(p);
            return st;
        }
    }
    *plan_p = p;
    return MEGAMOE_OK;
}

void mm_ep_plan_destroy(mm_ep_plan_t *p)
{
    if (p == NULL) return;
    mm_ep_replica_plan_destroy(p->rep);
    mm_freelist_put(&mm_ep_plan_blocks, p); /* the arrays live in the same block */
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

/* Offsets from the gathered counts and the replica plan (identical on every rank). */
static void mm_ep_offsets(mm_ep_plan_t *p)
{
    const int ep = p->ep, me = p->me, R = p->R, nslots = ep * R;
    const int64_t E = p->E, L = p->L, S = p->S;
    const int32_t *c = p->counts;
    const mm_ep_replica_plan_t *rp = p->rep;
    int64_t *B = p->bcount, *pre = p->src_prefix;
    /* source s's permuted offset of each expert */
    for (int s = 0; s < ep; s++) {
        int64_t *ps = pre + (size_t)s * (size_t)(E + 1);
        ps[0] = 0;
        for (int64_t e = 0; e < E; e++) ps[e + 1] = ps[e] + c[(size_t)s * (size_t)E + (size_t)e];
    }
    /* slot map and the rows of every block (d, v, s) */
    for (int d = 0; d < ep; d++)
        for (int64_t v = 0; v < S; v++) {
            const size_t dv = (size_t)d * (size_t)S + (size_t)v;
            const int64_t e = v < L ? (int64_t)d * L + v : rp->slot_expert[d * R + (v - L)];
            p->slot_expert[dv] = (int32_t)e;
            for (int s = 0; s < ep; s++) {
                int64_t n = 0;
                if (v < L) n = rp ? mm_ep_replica_home_rows(rp, c, s, e) : c[(size_t)s * (size_t)E + (size_t)e];
                else if (e >= 0) n = rp->take[(size_t)s * (size_t)nslots + (size_t)(d * R + (v - L))];
                B[dv * (size_t)ep + (size_t)s] = n;
            }
        }
    /* where source s's share for slot (d, v) starts in its permuted order: after the home's
     * share and the shares of the guest slots of the same expert before it */
#define MM_PART_POS(s_, d_, v_, out_)                                                      \
    do {                                                                                   \
        const int64_t e_ = p->slot_expert[(size_t)(d_) * (size_t)S + (size_t)(v_)];          \
        int64_t pos_ = pre[(size_t)(s_) * (size_t)(E + 1) + (size_t)e_];                    \
        if ((v_) >= L) {                                                                   \
            const int hd_ = (int)(e_ / L);                                                 \
            pos_ += B[((size_t)hd_ * (size_t)S + (size_t)(e_ % L)) * (size_t)ep + (size_t)(s_)]; \
            const int q_ = (d_) * R + (int)((v_) - L);                                     \
            for (int qq_ = 0; qq_ < q_; qq_++)                                             \
                if (rp->slot_expert[qq_] == e_)                                            \
                    pos_ += rp->take[(size_t)(s_) * (size_t)nslots + (size_t)qq_];         \
        }                                                                                  \
        (out_) = pos_;                                                                     \
    } while (0)
    /* destination side */
    int64_t row = 0;
    for (int64_t v = 0; v < S; v++) {
        p->group_off[v] = row;
        for (int s = 0; s < ep; s++) {
            const int64_t n = B[((size_t)me * (size_t)S + (size_t)v) * (size_t)ep + (size_t)s];
            int64_t ret = 0;
            if (p->slot_expert[(size_t)me * (size_t)S + (size_t)v] >= 0) MM_PART_POS(s, me, v, ret);
            p->blk_off[v * ep + s] = row;
            p->blk_rows[v * ep + s] = n;
            p->ret_off[v * ep + s] = ret;
            row += n;
        }
    }
    p->group_off[S] = row;
    p->recv_rows = row;
    /* source side: this rank's share of every slot, and the segments in permuted order */
    for (int d = 0; d < ep; d++) {
        int64_t off = 0;
        for (int64_t v = 0; v < S; v++) {
            const size_t dv = (size_t)d * (size_t)S + (size_t)v;
            int64_t before = 0;
            for (int s = 0; s < me; s++) before += B[dv * (size_t)ep + (size_t)s];
            p->seg_rows[dv] = B[dv * (size_t)ep + (size_t)me];
            p->seg_dst[dv] = off + before;
            p->seg_pos[dv] = 0;
            if (p->slot_expert[dv] >= 0) MM_PART_POS(me, d, v, p->seg_pos[dv]);
            for (int s = 0; s < ep; s++) off += B[dv * (size_t)ep + (size_t)s];
        }
    }
#undef MM_PART_POS
    p->n_seg = 0;
    for (int64_t e = 0; e < E; e++) {
        const int hd = (int)(e / L);
        const int32_t home = (int32_t)((int64_t)hd * S + e % L);
        p->dst_off[e] = p->seg_dst[home];
        if (p->seg_rows[home] > 0) p->seg_order[p->n_seg++] = home;
        for (int q = 0; rp && q < nslots; q++)
            if (rp->slot_expert[q] == e) {
                const int32_t dv = (int32_t)((int64_t)(q / R) * S + L + q % R);
                if (p->seg_rows[dv] > 0) p->seg_order[p->n_seg++] = dv;
            }
    }
    /* Whole team: the largest block (what the O1 executor sizes its tiles by) */
    p->max_block_rows = 0;
    for (size_t i = 0; i < (size_t)ep * (size_t)S * (size_t)ep; i++)
        if (B[i] > p->max_block_rows) p->max_block_rows = B[i];
    /* ... and the largest receive count. */
    p->max_recv = -1;
    p->max_recv_rank = 0;
    for (int d = 0; d < ep; d++) {
        int64_t r = 0;
        for (size_t i = (size_t)d * (size_t)S * (size_t)ep; i < (size_t)(d + 1) * (size_t)S * (size_t)ep; i++)
            r += B[i];
        if (r > p->max_recv) {
            p->max_recv = r;
            p->max_recv_rank = d;
        }
    }
}

megamoe_status_t mm_ep_route(mm_ep_plan_t *p, mm_shmem_team_t *team, mm_call_t *call,
                             int64_t tokens, const void *ids, megamoe_dtype_t ids_dtype,
                             const void *tpe, megamoe_dtype_t tpe_dtype, int check,
                             megamoe_status_t local_status)
{
    int32_t *hist = p->hist;
    megamoe_status_t st = local_status;
    p->T = 0; /* until the count is known to fit the plan's arrays */
    if (st == MEGAMOE_OK && (tokens < 0 || tokens > p->T_cap))
        st = mm_error(MEGAMOE_INVALID_ARGUMENT,
                      "this call routes %lld tokens but the routing plan holds 0..%lld",
                      (long long)tokens, (long long)p->T_cap);
    if (st == MEGAMOE_OK) p->T = tokens;
    if (st == MEGAMOE_OK && ids == NULL && tokens > 0)
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
    /* One exchange: the call's descriptor and every rank's status with the counts and the
     * call's token count, so calls made out of order and a failure of any rank stop every
     * rank before data moves, and every rank learns every peer's T_r. */
    const size_t cb = (size_t)p->E * sizeof *hist;
    hist[p->E] = (int32_t)p->T;
    MM_CHECK(mm_call_exchange(call, team, st, hist, cb + sizeof *hist));
    p->max_tokens = 0;
    for (int s = 0; s < p->ep; s++) {
        const int32_t *rec = mm_call_payload(call, s);
        memcpy(p->counts + (size_t)s * (size_t)p->E, rec, cb);
        p->tokens_of[s] = rec[p->E];
        if (p->tokens_of[s] > p->max_tokens) p->max_tokens = p->tokens_of[s];
    }

    if (p->rep != NULL) {
        /* identical input on every rank, so the same plan everywhere */
        mm_ep_replica_input_t in = {p->ep, p->E, p->R, p->counts, p->host_of, p->capacity,
                                    p->replica_cost};
        MM_CHECK(mm_ep_replica_plan(&in, p->rep));
    }
    mm_ep_offsets(p);
    if (p->max_recv > p->capacity) {
        int64_t tk = p->T_cap * p->K; /* what the capacity was sized from */
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

int32_t mm_ep_seg_of_pos(const mm_ep_plan_t *p, int64_t pos)
{
    int32_t lo = 0, hi = p->n_seg - 1; /* last segment starting at or before pos */
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (p->seg_pos[p->seg_order[mid]] <= pos) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

int mm_ep_guests_of_local(const mm_ep_plan_t *p, int64_t j, int32_t *out)
{
    if (p->rep == NULL) return 0;
    return mm_ep_replica_guests_of(p->rep, (int64_t)p->me * p->L + j, out);
}
