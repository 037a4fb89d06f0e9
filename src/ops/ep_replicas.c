/* Hot-expert replica planner (see ep_replicas.h). */
#include "ops/ep_replicas.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/freelist.h"

static mm_freelist_t mm_ep_replica_blocks = MM_FREELIST_INIT;

mm_ep_replica_cost_t mm_ep_replica_cost_default(void)
{
    mm_ep_replica_cost_t c;
    c.guest_rows[0] = 128;
    c.guest_rows[1] = 128 + 64;
    c.home_rows[0] = 64;
    c.home_rows[1] = 64 + 128;
    c.min_rows = 128;
    return c;
}

megamoe_status_t mm_ep_replica_plan_create(int ep, int64_t E, int R, mm_ep_replica_plan_t **plan_p)
{
    if (ep < 1 || E < 1 || E % ep != 0 || R < 1 || R > 1024 || E >= INT32_MAX ||
        (int64_t)ep * ep * R >= INT32_MAX)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "replica plan: EP %d, E %lld, %d guest slots per rank out of range", ep,
                        (long long)E, R);
    /* One zeroed block for the plan and its arrays, kept in mm_ep_replica_blocks when handed
     * back: a steady state of one shape allocates nothing. */
    const size_t slots = (size_t)ep * (size_t)R, n = (size_t)ep;
    const size_t sizes[] = {
        sizeof(mm_ep_replica_plan_t),
        slots * sizeof(int32_t),     /* slot_expert */
        slots * n * sizeof(int32_t), /* take */
        n * sizeof(int64_t),         /* load_plain */
        n * sizeof(int64_t),         /* load */
        (size_t)E * sizeof(int64_t), /* w_home */
        n * sizeof(int64_t),         /* w_eff */
        slots * sizeof(int64_t),     /* w_slot_rows */
        n * sizeof(int64_t),         /* w_left */
        (slots + 1) * sizeof(int64_t), /* w_quota */
        (slots + 1) * sizeof(int32_t), /* w_parts */
    };
    enum { NPARTS = sizeof sizes / sizeof sizes[0] };
    size_t total = 0;
    for (int i = 0; i < NPARTS; i++) total += mm_align_up(sizes[i], 64);
    char *blk = NULL;
    if (mm_freelist_get(&mm_ep_replica_blocks, total, 1, "replica plan", (void **)&blk) !=
        MEGAMOE_OK)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "replica plan for %zu guest slots", slots);
    void *part[NPARTS];
    for (size_t i = 0, off = 0; i < NPARTS; off += mm_align_up(sizes[i], 64), i++) part[i] = blk + off;
    mm_ep_replica_plan_t *p = part[0];
    p->ep = ep;
    p->R = R;
    p->E = E;
    p->L = E / ep;
    p->slot_expert = part[1];
    p->take = part[2];
    p->load_plain = part[3];
    p->load = part[4];
    p->w_home = part[5];
    p->w_eff = part[6];
    p->w_slot_rows = part[7];
    p->w_left = part[8];
    p->w_quota = part[9];
    p->w_parts = part[10];
    *plan_p = p;
    return MEGAMOE_OK;
}

void mm_ep_replica_plan_destroy(mm_ep_replica_plan_t *p)
{
    mm_freelist_put(&mm_ep_replica_blocks, p); /* the arrays live in the same block */
}

int64_t mm_ep_replica_home_rows(const mm_ep_replica_plan_t *p, const int32_t *counts, int s,
                                int64_t e)
{
    const int n = p->ep * p->R;
    int64_t rows = counts[(size_t)s * (size_t)p->E + (size_t)e];
    for (int q = 0; q < n; q++)
        if (p->slot_expert[q] == e) rows -= p->take[(size_t)s * (size_t)n + (size_t)q];
    return rows;
}

int mm_ep_replica_guests_of(const mm_ep_replica_plan_t *p, int64_t e, int32_t *out)
{
    int k = 0;
    for (int q = 0; q < p->ep * p->R; q++)
        if (p->slot_expert[q] == e) out[k++] = q;
    return k;
}

static inline int64_t mm_min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t mm_max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Split expert e's rows between its home (quota home_quota) and its guest slots (quotas
 * slot_rows) source by source, as ep_replicas.h says; take[] gets the guests' shares. */
static megamoe_status_t mm_ep_replica_split(const mm_ep_replica_input_t *in,
                                            mm_ep_replica_plan_t *p, int64_t e,
                                            int64_t home_quota, const int64_t *slot_rows,
                                            int64_t *left, int64_t *quota, int32_t *parts)
{
    const int ep = p->ep, nslots = ep * p->R;
    const int h = (int)(e / p->L);
    int np = 0;
    parts[np] = -1; /* the home */
    quota[np++] = home_quota;
    for (int q = 0; q < nslots; q++)
        if (p->slot_expert[q] == e) {
            parts[np] = q;
            quota[np++] = slot_rows[q];
        }
    for (int s = 0; s < ep; s++) left[s] = in->counts[(size_t)s * (size_t)p->E + (size_t)e];
    for (int pass = 0; pass < 3; pass++)
        for (int i = 0; i < np; i++) {
            const int rank = parts[i] < 0 ? h : parts[i] / p->R;
            for (int s = 0; s < ep && quota[i] > 0; s++) {
                if (pass == 0 && s != rank) continue; /* its own rows: no transfer */
                if (pass == 1 && in->host_of && in->host_of[s] != in->host_of[rank]) continue;
                int64_t x = mm_min64(quota[i], left[s]);
                if (x <= 0) continue;
                quota[i] -= x;
                left[s] -= x;
                if (parts[i] >= 0) p->take[(size_t)s * (size_t)nslots + (size_t)parts[i]] += (int32_t)x;
            }
        }
    for (int i = 0; i < np; i++)
        if (quota[i] != 0)
            return mm_error(MEGAMOE_INTERNAL, "replica plan: expert %lld split left %lld rows",
                            (long long)e, (long long)quota[i]);
    return MEGAMOE_OK;
}

megamoe_status_t mm_ep_replica_plan(const mm_ep_replica_input_t *in, mm_ep_replica_plan_t *p)
{
    if (in == NULL || in->counts == NULL || in->ep != p->ep || in->E != p->E || in->R != p->R)
        return mm_error(MEGAMOE_INTERNAL, "replica plan: input does not match the plan's shape");
    const int ep = p->ep, R = p->R, nslots = ep * R;
    const int64_t E = p->E, L = p->L;
    const mm_ep_replica_cost_t *c = &in->cost;
    memset(p->take, 0, (size_t)nslots * (size_t)ep * sizeof *p->take);
    for (int q = 0; q < nslots; q++) p->slot_expert[q] = -1;
    p->rows_moved = 0;
    p->n_guests = 0;

    int64_t *home = p->w_home;           /* rows of e computed at home */
    int64_t *eff = p->w_eff;             /* load + fixed costs */
    int64_t *slot_rows = p->w_slot_rows; /* rows of each guest slot */
    memset(slot_rows, 0, (size_t)nslots * sizeof *slot_rows);
    megamoe_status_t st = MEGAMOE_OK;
    for (int d = 0; d < ep; d++) p->load_plain[d] = 0;
    for (int64_t e = 0; e < E; e++) {
        int64_t n = 0;
        for (int s = 0; s < ep; s++) n += in->counts[(size_t)s * (size_t)E + (size_t)e];
        home[e] = n;
        p->load_plain[e / L] += n;
    }
    for (int d = 0; d < ep; d++) eff[d] = p->load[d] = p->load_plain[d];

    /* Each move strictly lowers the pair it touches below the old maximum; the bound only
     * guards against a cost model that would make that slow. */
    const int64_t max_moves = 16 * (int64_t)(nslots + ep) + E;
    for (int64_t it = 0; it < max_moves; it++) {
        int h = 0;
        int64_t total = eff[0];
        for (int d = 1; d < ep; d++) {
            total += eff[d];
            if (eff[d] > eff[h]) h = d;
        }
        const int64_t avg = total / ep; /* a receiver is filled up to the mean, not beyond */
        int64_t best_gain = 0, best_m = 0, best_e = -1;
        int best_q = -1, best_new = 0;
        for (int d = 0; d < ep; d++) {
            if (d == h) continue;
            const int far = in->host_of != NULL && in->host_of[d] != in->host_of[h];
            for (int64_t e = (int64_t)h * L; e < (int64_t)(h + 1) * L; e++) {
                if (home[e] <= 0) continue;
                int q = -1, is_new = 0;
                for (int g = 0; g < R; g++)
                    if (p->slot_expert[d * R + g] == e) q = d * R + g;
                if (q < 0) {
                    for (int g = 0; g < R && q < 0; g++)
                        if (p->slot_expert[d * R + g] < 0) q = d * R + g;
                    if (q < 0) continue; /* no free slot on d */
                    is_new = 1;
                }
                const int64_t gc = is_new ? c->guest_rows[far] : 0;
                const int64_t hc = is_new ? c->home_rows[far] : 0;
                int64_t m = (eff[h] + hc - eff[d] - gc) / 2; /* equalises the two */
                m = mm_min64(m, avg - eff[d]);
                m = mm_min64(m, home[e]);
                if (in->capacity > 0) m = mm_min64(m, in->capacity - p->load[d]);
                if (m < c->min_rows || m <= 0) continue;
                const int64_t gain = eff[h] - mm_max64(eff[h] - m + hc, eff[d] + m + gc);
                if (gain > best_gain) {
                    best_gain = gain;
                    best_m = m;
                    best_e = e;
                    best_q = q;
                    best_new = is_new;
                }
            }
        }
        if (best_e < 0) break;
        const int d = best_q / R;
        const int far = in->host_of != NULL && in->host_of[d] != in->host_of[h];
        if (best_new) {
            p->slot_expert[best_q] = (int32_t)best_e;
            p->n_guests++;
            eff[d] += c->guest_rows[far];
            eff[h] += c->home_rows[far];
        }
        home[best_e] -= best_m;
        slot_rows[best_q] += best_m;
        eff[h] -= best_m;
        eff[d] += best_m;
        p->load[h] -= best_m;
        p->load[d] += best_m;
        p->rows_moved += best_m;
    }

    for (int64_t e = 0; e < E && st == MEGAMOE_OK; e++) {
        int hosted = 0;
        for (int q = 0; q < nslots; q++) hosted |= p->slot_expert[q] == e;
        if (hosted)
            st = mm_ep_replica_split(in, p, e, home[e], slot_rows, p->w_left, p->w_quota,
                                     p->w_parts);
    }
    return st;
}
