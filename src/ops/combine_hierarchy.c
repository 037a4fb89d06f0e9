/* CombineV2 with comm_alg "hierarchy": two hops through one leader per group, with a partial
 * sum at the leader.
 *
 * Hop 0: every source sends its expert_scales, expert ids and masks to every leader (small).
 * Hop 1: every expert rank puts its rows (after the TP add / int8 transport, as fullmesh) into
 * its group leader's dense slots for (source, token, slot). The leader reduces, per (source,
 * token), the slots its group served in slot order into one fp32 partial (MoE rows weighted,
 * shared-expert rows with weight 1) and puts it to the source. Hop 2 done, the source adds the
 * partials of the groups in group order, then copy/const experts, then shared_expert_x, and
 * rounds once. This re-associates the fp32 sum of spec §5.3 (the order is by group instead of
 * by slot); everything else is the fullmesh computation.
 */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "combine_v2.h"

#define MM_V2H_MAX_TERMS 64 /* K + NS slots of a token */

static int64_t mm_v2h_gs(const mm_v2_combine_t *c) { return c->c.hier_group; }
static int64_t mm_v2h_ng(const mm_v2_combine_t *c)
{
    return (c->c.eW + mm_v2h_gs(c) - 1) / mm_v2h_gs(c);
}
static size_t mm_v2h_wbytes(const mm_v2_combine_t *c)
{
    return mm_align_up((size_t)(c->c.max_bs * c->c.K) * 9 + (size_t)c->c.max_bs, 64);
}
static size_t mm_v2h_pstride(const mm_v2_combine_t *c)
{
    return mm_align_up((size_t)c->c.h * 4 + 8, 64);
}

uint64_t mm_v2c_hier_seg(const mm_v2_combine_t *c, int seg)
{
    uint64_t srcs = (uint64_t)c->c.eW, mb = (uint64_t)c->c.max_bs;
    switch (seg) {
    case -1: return mm_v2h_wbytes(c); /* the weights staging buffer (scratch) */
    case MM_V2C_HSLOTS: return srcs * mb * (uint64_t)c->KS * c->cstride;
    case MM_V2C_HW: return srcs * mm_v2h_wbytes(c);
    case MM_V2C_PARTIAL: return (uint64_t)mm_v2h_ng(c) * mb * mm_v2h_pstride(c);
    default: return 0;
    }
}

/* Group of the rank that serves slot k of token t of source s; -1 when nothing is routed. */
static int64_t mm_v2h_slot_group(const mm_v2_combine_t *c, int64_t s, int64_t k, int32_t id,
                                 uint8_t active)
{
    const mm_v2_cfg_t *g = &c->c;
    if (k < g->K) {
        if (!active || id >= g->eE) return -1;
        return mm_v2_moe_dst(g, id) / mm_v2h_gs(c);
    }
    return mm_v2_shared_dst(g, s, k - g->K) / mm_v2h_gs(c);
}

static megamoe_status_t mm_v2h_send_weights(mm_v2_combine_t *c, const uint8_t *processed)
{
    const mm_v2_cfg_t *g = &c->c;
    const megamoe_combine_v2_args_t *a = c->a;
    size_t wb = mm_v2h_wbytes(c), nk = (size_t)(g->max_bs * g->K);
    uint8_t *buf = mm_v2_scratch_take(&c->scratch, wb);
    size_t n = (size_t)(g->bs * g->K);
    memcpy(buf, a->expert_scales.data, n * 4);
    memcpy(buf + nk * 4, a->expert_ids.data, n * 4);
    const uint8_t *mask = a->x_active_mask.data;
    for (int64_t t = 0; t < g->bs; t++)
        for (int64_t k = 0; k < g->K; k++)
            buf[nk * 8 + (size_t)(t * g->K + k)] =
                (uint8_t)(processed[t] && (g->mask_dim != 2 || mask[t * g->K + k]));
    memcpy(buf + nk * 9, processed, (size_t)g->bs);
    uint8_t *to = mm_v2_seg(&c->call, MM_V2C_HW) + (size_t)g->erank * wb;
    int64_t gs = mm_v2h_gs(c);
    for (int64_t l = 0; l < g->eW; l += gs) {
        int pe = mm_v2c_pe(c, l);
        if (l == g->erank) memcpy(to, buf, wb);
        else /* a failed transfer marks its peer lost (shmem.h): every rank's wait fails */
            MM_CHECK(mm_shmem_put_signal(to, buf, wb,
                                         mm_v2_sig(&c->call, MM_V2C_SIG, 2 * c->n + c->call.me),
                                         mm_v2_sigval(&c->call, MEGAMOE_OK), MM_SHMEM_SIGNAL_SET,
                                         mm_v2_wpe(&c->call, pe)));
    }
    return MEGAMOE_OK;
}

void mm_v2c_hier_poison(const mm_v2_combine_t *c, megamoe_status_t st)
{
    const mm_v2_cfg_t *g = &c->c;
    int64_t gs = mm_v2h_gs(c), leader = g->erank / gs * gs;
    for (int64_t l = 0; l < g->eW; l += gs) /* weights at every other leader */
        if (l != g->erank)
            mm_v2_poison_line(&c->call, MM_V2C_SIG, 2 * c->n + c->call.me, mm_v2c_pe(c, l), st);
    if (leader != g->erank) /* rows at its leader */
        mm_v2_poison_line(&c->call, MM_V2C_SIG, c->n + c->call.me, mm_v2c_pe(c, leader), st);
}

/* Rows to the group's leader: a member puts them into the leader's slots; the leader itself
 * reads its rows in place (own: the row of each (source, token, slot) it holds, -1 none), or
 * on the int8 transport path stores their transport records in its slots like a member. */
static megamoe_status_t mm_v2h_send_rows(mm_v2_combine_t *c, int32_t *own)
{
    const mm_v2_cfg_t *g = &c->c;
    const int32_t *tr = (const int32_t *)c->a->assist_info_for_combine.data + g->assist_off;
    int64_t leader = g->erank / mm_v2h_gs(c) * mm_v2h_gs(c);
    int pe = mm_v2c_pe(c, leader);
    size_t per_src = (size_t)(g->max_bs * c->KS);
    if (own) {
        for (int64_t i = 0; i < c->n_own; i++)
            own[(size_t)tr[3 * i] * per_src + (size_t)tr[3 * i + 1] * c->KS + tr[3 * i + 2]] = (int32_t)i;
        return MEGAMOE_OK;
    }
    uint8_t *tmp = mm_v2_scratch_take(&c->scratch, c->cstride);
    size_t stamp_off = c->cstride - 8;
    uint64_t gen = c->call.gen;
    for (int64_t i = 0; i < c->n_own; i++) {
        int64_t s = tr[3 * i], slot = (int64_t)tr[3 * i + 1] * c->KS + tr[3 * i + 2];
        const uint8_t *p = mm_v2c_payload(c, i, tmp);
        if (p != tmp) memcpy(tmp, p, c->pay);
        memcpy(tmp + stamp_off, &gen, 8);
        uint8_t *to = mm_v2c_slot(c, MM_V2C_HSLOTS, (int64_t)((size_t)s * per_src) + slot);
        if (leader == g->erank) memcpy(to, tmp, c->cstride);
        else MM_CHECK(mm_shmem_put(to, tmp, c->cstride, mm_v2_wpe(&c->call, pe)));
    }
    if (leader != g->erank) {
        MM_CHECK(mm_shmem_fence());
        MM_CHECK(mm_shmem_signal_op(mm_v2_sig(&c->call, MM_V2C_SIG, c->n + c->call.me),
                                    mm_v2_sigval(&c->call, MEGAMOE_OK), MM_SHMEM_SIGNAL_SET,
                                    mm_v2_wpe(&c->call, pe)));
    }
    return MEGAMOE_OK;
}

/* Leader: the terms of token t of source s that this group served, in slot order (*nt of
 * them; 0: none). own: the leader's own rows (NULL: all in its slots). */
static megamoe_status_t mm_v2h_token_terms(const mm_v2_combine_t *c, int64_t s, int64_t t,
                                           const int32_t *own, mm_v2c_term_t *terms, int *nt)
{
    const mm_v2_cfg_t *g = &c->c;
    int64_t grp = g->erank / mm_v2h_gs(c);
    size_t wb = mm_v2h_wbytes(c), nk = (size_t)(g->max_bs * g->K);
    size_t per_src = (size_t)(g->max_bs * c->KS), stamp_off = c->cstride - 8;
    const uint8_t *wbuf = mm_v2_seg(&c->call, MM_V2C_HW) + (size_t)s * wb;
    const float *w = (const float *)wbuf;
    const int32_t *ids = (const int32_t *)(wbuf + nk * 4);
    const uint8_t *act = wbuf + nk * 8;
    *nt = 0;
    for (int64_t k = 0; k < c->KS; k++) {
        int32_t id = k < g->K ? ids[t * g->K + k] : 0;
        uint8_t on = k < g->K ? act[t * g->K + k] : 1;
        if (mm_v2h_slot_group(c, s, k, id, on) != grp) continue;
        size_t slot = (size_t)s * per_src + (size_t)(t * c->KS + k);
        mm_v2c_term_t tm = {NULL, NULL, k < g->K ? w[t * g->K + k] : 1.0f, 0, 0,
                            k < g->K ? MM_V2C_ROW_W : MM_V2C_ROW};
        if (own && own[slot] >= 0) {
            tm.p = mm_v2c_row(c, own[slot]);
        } else {
            tm.p = mm_v2c_slot(c, MM_V2C_HSLOTS, (int64_t)slot);
            uint64_t stamp;
            memcpy(&stamp, tm.p + stamp_off, 8);
            if (stamp != c->call.gen)
                return mm_error(MEGAMOE_INVALID_ARGUMENT, "combine_v2 (hierarchy): no expert row "
                                "for source %lld token %lld slot %lld: the combine inputs must "
                                "be those of the matching dispatch_v2", (long long)s,
                                (long long)t, (long long)k);
            if (g->comm_quant) tm.kind = k < g->K ? MM_V2C_CQ_W : MM_V2C_CQ;
        }
        terms[(*nt)++] = tm;
    }
    return MEGAMOE_OK;
}

/* Leader: the partial sums of this group's rows for every token of source s (not this rank),
 * put into s's partial rows. acc: a partial row; tmp: 2 * H floats. */
static megamoe_status_t mm_v2h_partials(mm_v2_combine_t *c, int64_t s, const int32_t *own,
                                        float *acc, float *tmp)
{
    const mm_v2_cfg_t *g = &c->c;
    int64_t grp = g->erank / mm_v2h_gs(c);
    size_t ps = mm_v2h_pstride(c), nk = (size_t)(g->max_bs * g->K);
    const uint8_t *proc = mm_v2_seg(&c->call, MM_V2C_HW) + (size_t)s * mm_v2h_wbytes(c) + nk * 9;
    int wpe = mm_v2_wpe(&c->call, mm_v2c_pe(c, s));
    uint64_t gen = c->call.gen;
    mm_v2c_term_t terms[MM_V2H_MAX_TERMS];
    for (int64_t t = 0; t < g->max_bs; t++) {
        if (!proc[t]) continue;
        int nt;
        MM_CHECK(mm_v2h_token_terms(c, s, t, own, terms, &nt));
        if (!nt) continue;
        mm_v2c_sum_terms(c, terms, nt, acc, tmp);
        memcpy((uint8_t *)acc + ps - 8, &gen, 8);
        uint8_t *to = mm_v2_seg(&c->call, MM_V2C_PARTIAL) + (size_t)(grp * g->max_bs + t) * ps;
        MM_CHECK(mm_shmem_put(to, acc, ps, wpe));
    }
    return MEGAMOE_OK;
}

/* Leader: partial sums of this group's rows for every other source's tokens, each source as
 * soon as its weights are in (a failed transfer marks its peer lost, shmem.h: every rank's wait
 * fails with it). This rank's own tokens' partial is summed in the final pass, token by token
 * (mm_v2c_hier_run), while the other groups' partials for them are on the wire. */
static megamoe_status_t mm_v2h_leader(mm_v2_combine_t *c, const int32_t *own)
{
    const mm_v2_cfg_t *g = &c->c;
    int64_t gs = mm_v2h_gs(c), grp = g->erank / gs, h = g->h, pending = 0;
    for (int64_t d = grp * gs; d < (grp + 1) * gs && d < g->eW; d++) {
        if (d == g->erank) continue;
        int pe = mm_v2c_pe(c, d);
        MM_CHECK(mm_v2_wait(&c->call, mm_v2_sig(&c->call, MM_V2C_SIG, c->n + pe),
                            "hierarchy rows from the group", pe, NULL));
    }
    float *acc = mm_v2_scratch_take(&c->scratch, mm_v2h_pstride(c) + (size_t)h * 8);
    float *tmp = (float *)((uint8_t *)acc + mm_v2h_pstride(c));
    uint8_t *done = mm_v2_scratch_take(&c->scratch, (size_t)g->eW);
    for (int64_t s = 0; s < g->eW; s++) {
        done[s] = s == g->erank;
        pending += s != g->erank;
    }
    while (pending > 0) {
        int progressed = 0;
        for (int64_t s = 0; s < g->eW; s++) {
            if (done[s]) continue;
            int pe = mm_v2c_pe(c, s);
            uint64_t v = mm_shmem_signal_fetch(mm_v2_sig(&c->call, MM_V2C_SIG, 2 * c->n + pe));
            if (v < mm_v2_sigval(&c->call, MEGAMOE_OK)) continue;
            MM_CHECK(mm_v2_sig_status(&c->call, v, "hierarchy weights", pe));
            MM_CHECK(mm_v2h_partials(c, s, own, acc, tmp));
            done[s] = 1;
            pending--;
            progressed = 1;
        }
        if (progressed) continue;
        for (int64_t s = 0; s < g->eW; s++)
            if (!done[s]) { /* none in: wait for the first one missing */
                int pe = mm_v2c_pe(c, s);
                MM_CHECK(mm_v2_wait(&c->call, mm_v2_sig(&c->call, MM_V2C_SIG, 2 * c->n + pe),
                                    "hierarchy weights", pe, NULL));
                break;
            }
    }
    MM_CHECK(mm_shmem_fence());
    for (int64_t s = 0; s < g->eW; s++)
        if (s != g->erank)
            MM_CHECK(mm_shmem_signal_op(mm_v2_sig(&c->call, MM_V2C_SIG, c->call.me),
                                        mm_v2_sigval(&c->call, MEGAMOE_OK), MM_SHMEM_SIGNAL_SET,
                                        mm_v2_wpe(&c->call, mm_v2c_pe(c, s))));
    return MEGAMOE_OK;
}

/* Bytes of the leader's own-row index (mm_v2h_send_rows). */
size_t mm_v2c_hier_own_bytes(const mm_v2_combine_t *c)
{
    return (size_t)c->c.eW * (size_t)c->c.max_bs * (size_t)c->KS * 4;
}

/* The groups whose partials token t of this rank needs (need[group] = 1). */
static const uint8_t *mm_v2h_need(const mm_v2_combine_t *c, int64_t t, uint8_t *need)
{
    const mm_v2_cfg_t *g = &c->c;
    const int32_t *ids = c->a->expert_ids.data;
    const uint8_t *mask = c->a->x_active_mask.data;
    memset(need, 0, (size_t)mm_v2h_ng(c));
    for (int64_t k = 0; k < c->KS; k++) {
        int32_t id = k < g->K ? ids[t * g->K + k] : 0;
        uint8_t on = k < g->K ? (uint8_t)(g->mask_dim != 2 || mask[t * g->K + k]) : 1;
        int64_t grp = mm_v2h_slot_group(c, g->erank, k, id, on);
        if (grp >= 0) need[grp] = 1;
    }
    return need;
}

megamoe_status_t mm_v2c_hier_run(mm_v2_combine_t *c, const uint8_t *processed)
{
    const mm_v2_cfg_t *g = &c->c;
    const megamoe_combine_v2_args_t *a = c->a;
    int64_t gs = mm_v2h_gs(c), ng = mm_v2h_ng(c), h = g->h;
    int lead = g->erank % gs == 0;
    int32_t *own = NULL; /* a leader without the int8 transport reads its own rows in place */
    if (lead && !g->comm_quant) {
        own = mm_v2_scratch_take(&c->scratch, mm_v2c_hier_own_bytes(c));
        memset(own, 0xff, mm_v2c_hier_own_bytes(c));
    }
    MM_CHECK(mm_v2h_send_weights(c, processed));
    MM_CHECK(mm_v2h_send_rows(c, own));
    if (lead) MM_CHECK(mm_v2h_leader(c, own));
    size_t ps = mm_v2h_pstride(c), xrow = (size_t)h * g->xsize;
    float *acc = mm_v2_scratch_take(&c->scratch, (size_t)h * 16);
    float *scratch = acc + h;
    float *mine = lead ? mm_v2_scratch_take(&c->scratch, (size_t)h * 4) : NULL;
    uint8_t *early = lead ? mm_v2_scratch_take(&c->scratch, (size_t)g->bs) : NULL;
    const int32_t *ids = a->expert_ids.data;
    const uint8_t *mask = a->x_active_mask.data;
    const float *w = a->expert_scales.data;
    uint8_t *need = mm_v2_scratch_take(&c->scratch, (size_t)ng);
    mm_v2c_term_t terms[MM_V2H_MAX_TERMS];
    int64_t my_grp = g->erank / gs, t_early = 0;
    int nt;
    /* the other groups' partials; while they are not all in, a leader sums its own group's
     * partial of its tokens in order into its PARTIAL row (the rest are summed inline below) */
    for (int64_t l = 0; l < g->eW; l += gs) {
        if (l == g->erank) continue;
        int pe = mm_v2c_pe(c, l);
        uint64_t *sig = mm_v2_sig(&c->call, MM_V2C_SIG, pe);
        while (lead && t_early < g->bs && mm_shmem_signal_fetch(sig) < mm_v2_sigval(&c->call, MEGAMOE_OK)) {
            int64_t t = t_early++;
            if (!processed[t] || !mm_v2h_need(c, t, need)[my_grp]) continue;
            MM_CHECK(mm_v2h_token_terms(c, g->erank, t, own, terms, &nt));
            mm_v2c_sum_terms(c, terms, nt,
                             (float *)(mm_v2_seg(&c->call, MM_V2C_PARTIAL) + (size_t)(my_grp * g->max_bs + t) * ps),
                             scratch);
            early[t] = 1;
        }
        MM_CHECK(mm_v2_wait(&c->call, sig, "hierarchy partials", pe, &c->perf_us[mm_v2_phys(g, l)]));
    }
    megamoe_status_t st = MEGAMOE_OK;
    for (int64_t t = 0; t < g->bs && st == MEGAMOE_OK; t++) {
        if (!processed[t]) continue;
        mm_v2h_need(c, t, need);
        const float *my_part = mine;
        if (lead && need[my_grp] && early[t]) {
            my_part = (const float *)(mm_v2_seg(&c->call, MM_V2C_PARTIAL) + (size_t)(my_grp * g->max_bs + t) * ps);
        } else if (lead && need[my_grp]) { /* this group's partial, as the leader sums it for others */
            st = mm_v2h_token_terms(c, g->erank, t, own, terms, &nt);
            if (st != MEGAMOE_OK) break;
            mm_v2c_sum_terms(c, terms, nt, mine, scratch);
        }
        memset(acc, 0, (size_t)h * 4);
        for (int64_t grp = 0; grp < ng; grp++) {
            if (!need[grp]) continue;
            if (lead && grp == my_grp) {
                mm_rows_axpy_f32(acc, my_part, 1.0f, h);
                continue;
            }
            const uint8_t *p = mm_v2_seg(&c->call, MM_V2C_PARTIAL) + (size_t)(grp * g->max_bs + t) * ps;
            uint64_t stamp;
            memcpy(&stamp, p + ps - 8, 8);
            if (stamp != c->call.gen) {
                st = mm_error(MEGAMOE_INTERNAL, "combine_v2 (hierarchy): no partial from group %lld "
                              "for token %lld", (long long)grp, (long long)t);
                break;
            }
            mm_rows_axpy_f32(acc, (const float *)p, 1.0f, h);
        }
        if (st != MEGAMOE_OK) break;
        for (int64_t k = 0; k < g->K; k++) {
            if (g->mask_dim == 2 && !mask[t * g->K + k]) continue;
            if (ids[t * g->K + k] >= g->E) mm_v2c_special(c, t, ids[t * g->K + k], w[t * g->K + k], acc, scratch);
        }
        if (a->shared_expert_x.data)
            mm_rows_axpy(g->xtype, acc,
                         (const uint8_t *)a->shared_expert_x.data + (size_t)t * xrow, 1.0f, h);
        mm_v2c_emit(c, t, acc, scratch);
    }
    return st;
}
