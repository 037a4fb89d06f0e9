/* DispatchV2 with comm_alg "hierarchy": two hops through one leader per group of ranks.
 *
 * Ranks (compact ids) form groups of MEGAMOE_RANKS_PER_NODE consecutive ranks; the first rank of
 * a group is its leader. Hop 1: a source sends each token ONCE per destination group (a "unit":
 * the payload, quantised once, plus the list of (slot, destination, position) targets in that
 * group) to the group's leader. Hop 2: the leader writes the rows into the destinations' receive
 * regions exactly where a fullmesh source would have put them, and raises the data signal on
 * the source's behalf. Rows for the leader itself go straight to their final rows in the
 * outputs, like a fullmesh unit's; the other members collect theirs with the fullmesh receive
 * side, so every output is identical. With per-expert smoothing scales the payload differs per
 * expert, so a unit carries one pair.
 *
 * Order, so the transfer overlaps the local work: one pass over the tokens writes the own rows
 * and sends the units (the token's row is quantised once and hot); the leader then forwards the
 * sources in the order their units arrive.
 */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "dispatch_v2.h"

typedef struct {
    int32_t t, n, pad0, pad1;
} mm_v2h_head_t;

typedef struct {
    int16_t k, le; /* slot; local expert at the destination (0 for a shared-expert row) */
    int32_t dst, pos;
    float w;
} mm_v2h_target_t;

static int64_t mm_v2h_gs(const mm_v2_dispatch_t *d) { return d->c.hier_group; }
static int64_t mm_v2h_ngroups(const mm_v2_dispatch_t *d)
{
    return (d->c.eW + mm_v2h_gs(d) - 1) / mm_v2h_gs(d);
}

uint64_t mm_v2d_hier_stride(const mm_v2_dispatch_t *d)
{
    return mm_align_up(d->meta_off + sizeof(mm_v2h_head_t) +
                       (size_t)(d->c.K + d->c.NS) * sizeof(mm_v2h_target_t), 64);
}

/* Targets of token t in group g (destinations other than this rank), in slot order. */
static int mm_v2h_targets(const mm_v2_dispatch_t *d, int64_t t, int64_t g, mm_v2h_target_t *out)
{
    const mm_v2_cfg_t *c = &d->c;
    int64_t K = c->K, NS = c->NS, gs = mm_v2h_gs(d);
    const float *ws = d->a->expert_scales.data;
    const int32_t *ids = d->a->expert_ids.data;
    int n = 0;
    for (int64_t k = 0; k < K + NS; k++) {
        int64_t dst = k < K ? d->pdst[t * K + k] : d->sdst[t * NS + (k - K)];
        if (dst < 0 || dst == c->erank || dst / gs != g) continue;
        out[n].k = (int16_t)k;
        out[n].le = (int16_t)(k < K ? ids[t * K + k] % c->eL : 0);
        out[n].dst = (int32_t)dst;
        out[n].pos = k < K ? d->ppos[t * K + k] : d->spos[t * NS + (k - K)];
        out[n].w = k < K ? (ws ? ws[t * K + k] : 0.0f) : 1.0f;
        n++;
    }
    return n;
}

void mm_v2d_hier_units(mm_v2_dispatch_t *d, int32_t *units_to_pe)
{
    const mm_v2_cfg_t *c = &d->c;
    if (c->erank < 0) return;
    int64_t gs = mm_v2h_gs(d), ng = mm_v2h_ngroups(d);
    int per_token = mm_v2d_payload_per_token(d);
    mm_v2h_target_t tg[32];
    for (int64_t t = 0; t < c->bs; t++) {
        if (!d->active[t]) continue;
        for (int64_t g = 0; g < ng; g++) {
            if (g * gs == c->erank) continue; /* this rank leads the group: forwards directly */
            int n = mm_v2h_targets(d, t, g, tg);
            if (n) units_to_pe[mm_v2d_pe(d, g * gs)] += per_token ? 1 : n;
        }
    }
}

/* Hop 2 of one unit of source s (payload, its scales, n targets): rows for this rank go to their
 * final rows (blk: first row of each local expert's block of s, as the fullmesh receive side),
 * the others into their destinations' receive regions. A failed transfer marks its peer lost
 * (shmem.h): every rank's wait fails with it. */
static megamoe_status_t mm_v2h_forward(mm_v2_dispatch_t *d, const mm_v2d_out_t *o,
                                       const int64_t *blk, int64_t s, const uint8_t *payload,
                                       const uint8_t *scales, int32_t t, int32_t n,
                                       const mm_v2h_target_t *tg)
{
    const mm_v2_cfg_t *c = &d->c;
    for (int32_t i = 0; i < n; i++) {
        mm_v2h_target_t x;
        memcpy(&x, tg + i, sizeof x);
        mm_v2_meta_t meta = {t, x.k, x.w, 0};
        if (x.dst == c->erank) {
            mm_v2d_place(d, o, blk[x.le] + x.pos, payload, scales, s, &meta);
            continue;
        }
        int wpe = mm_v2_wpe(&d->call, mm_v2d_pe(d, x.dst));
        uint8_t *to = mm_v2d_rec(d, MM_V2D_RECV, mm_v2d_region(d, s, x.dst), x.pos);
        uint8_t *direct = mm_shmem_ptr(to, wpe); /* a group is on one host: usually direct */
        if (direct) {
            mm_v2_copy(direct, payload, c->row_bytes, d->stream);
            if (c->scale_bytes) memcpy(direct + d->scale_off, scales, c->scale_bytes);
            memcpy(direct + d->meta_off, &meta, sizeof meta);
        } else {
            MM_CHECK(mm_shmem_put(to, payload, c->row_bytes, wpe));
            if (c->scale_bytes) MM_CHECK(mm_shmem_put(to + d->scale_off, scales, c->scale_bytes, wpe));
            MM_CHECK(mm_shmem_put(to + d->meta_off, &meta, sizeof meta, wpe));
        }
    }
    return MEGAMOE_OK;
}

/* Data signals for source s to every other member of this leader's group but s itself. */
static megamoe_status_t mm_v2h_signal_group(mm_v2_dispatch_t *d, int64_t s)
{
    const mm_v2_cfg_t *c = &d->c;
    int64_t gs = mm_v2h_gs(d), g0 = c->erank / gs * gs;
    int line = d->n + mm_v2d_pe(d, s);
    if (gs == 1) return MEGAMOE_OK;
    MM_CHECK(mm_shmem_fence());
    for (int64_t dst = g0; dst < g0 + gs && dst < c->eW; dst++)
        if (dst != s && dst != c->erank)
            MM_CHECK(mm_shmem_signal_op(mm_v2_sig(&d->call, MM_V2D_SIG, line),
                                        mm_v2_sigval(&d->call, MEGAMOE_OK),
                                        MM_SHMEM_SIGNAL_SET,
                                        mm_v2_wpe(&d->call, mm_v2d_pe(d, dst))));
    return MEGAMOE_OK;
}

void mm_v2d_hier_poison(const mm_v2_dispatch_t *d, megamoe_status_t st)
{
    const mm_v2_cfg_t *c = &d->c;
    int64_t gs = mm_v2h_gs(d), me = c->erank, g0 = me / gs * gs;
    for (int64_t l = 0; l < c->eW; l += gs) /* hop 1 at every other leader */
        if (l != me) mm_v2_poison_line(&d->call, MM_V2D_SIG, 2 * d->n + d->call.me, mm_v2d_pe(d, l), st);
    if (me != g0) return;
    for (int64_t s = 0; s < c->eW; s++) /* a leader: hop 2 of every source, at its group */
        for (int64_t dst = g0; dst < g0 + gs && dst < c->eW; dst++)
            if (dst != s && dst != me)
                mm_v2_poison_line(&d->call, MM_V2D_SIG, d->n + mm_v2d_pe(d, s), mm_v2d_pe(d, dst), st);
}

/* First final row of each local expert's block of source s, less the block's start inside
 * s's region (a target's pos is relative to the region). */
static void mm_v2h_blocks(const mm_v2_dispatch_t *d, const mm_v2d_out_t *o, int64_t s, int64_t *blk)
{
    const mm_v2_cfg_t *c = &d->c;
    int64_t L = mm_v2_local_experts(c, c->erank), acc = 0;
    for (int64_t le = 0; le < L; le++) {
        blk[le] = o->off[le * c->eW + s] - acc;
        acc += d->rcnt[s * d->Lmax + le];
    }
}

/* Leader: hop 2 of source s, whose units are in the staging segment. */
static megamoe_status_t mm_v2h_forward_source(mm_v2_dispatch_t *d, const mm_v2d_out_t *o,
                                              int64_t *blk, int64_t s)
{
    size_t hs = (size_t)mm_v2d_hier_stride(d);
    int pe = mm_v2d_pe(d, s);
    int64_t first = 0, count = mm_v2_rec_counts(&d->call, pe)[d->n + d->call.me];
    for (int p = 0; p < pe; p++) first += mm_v2_rec_counts(&d->call, p)[d->n + d->call.me];
    mm_v2h_blocks(d, o, s, blk);
    for (int64_t i = 0; i < count; i++) {
        const uint8_t *unit = mm_v2_seg(&d->call, MM_V2D_STAGE) + (size_t)(first + i) * hs;
        mm_v2h_head_t head;
        memcpy(&head, unit + d->meta_off, sizeof head);
        MM_CHECK(mm_v2h_forward(d, o, blk, s, unit, unit + d->scale_off, head.t, head.n,
                                (const mm_v2h_target_t *)(unit + d->meta_off + sizeof head)));
    }
    return mm_v2h_signal_group(d, s);
}

/* Leader: hop 2 for every other source of the EP group, in the order their units arrive. */
static megamoe_status_t mm_v2h_hop2(mm_v2_dispatch_t *d, const mm_v2d_out_t *o, uint64_t t0)
{
    const mm_v2_cfg_t *c = &d->c;
    int64_t eW = c->eW, me = c->erank, pending = 0;
    uint8_t *done = mm_v2_scratch_take(&d->scratch, (size_t)eW);
    int64_t *blk = mm_v2_scratch_take(&d->scratch, (size_t)d->Lmax * 8);
    for (int64_t s = 0; s < eW; s++) {
        done[s] = s == me;
        pending += s != me;
    }
    while (pending > 0) {
        int progressed = 0;
        for (int64_t s = 0; s < eW; s++) {
            if (done[s]) continue;
            int pe = mm_v2d_pe(d, s);
            uint64_t *sig = mm_v2_sig(&d->call, MM_V2D_SIG, 2 * d->n + pe);
            uint64_t v = mm_shmem_signal_fetch(sig);
            if (v < mm_v2_sigval(&d->call, MEGAMOE_OK)) continue;
            MM_CHECK(mm_v2_sig_status(&d->call, v, "hierarchy hop-1 units", pe));
            d->perf_us[mm_v2_phys(c, s)] += (int64_t)((mm_now_ns() - t0) / 1000);
            MM_CHECK(mm_v2h_forward_source(d, o, blk, s));
            done[s] = 1;
            pending--;
            progressed = 1;
        }
        if (progressed) continue;
        if (!d->rows_zeroed) {
            mm_v2d_zero_rows_early(d); /* nothing in yet: zero_fill's bulk meanwhile */
            if (d->rows_zeroed) continue;
        }
        for (int64_t s = 0; s < eW; s++)
            if (!done[s]) { /* nothing arrived: block on the first one still missing */
                int pe = mm_v2d_pe(d, s);
                MM_CHECK(mm_v2_wait(&d->call, mm_v2_sig(&d->call, MM_V2D_SIG, 2 * d->n + pe),
                                    "hierarchy hop-1 units", pe, NULL));
                break;
            }
    }
    return MEGAMOE_OK;
}

megamoe_status_t mm_v2d_hier_send(mm_v2_dispatch_t *d, const mm_v2d_out_t *o, uint64_t t0)
{
    const mm_v2_cfg_t *c = &d->c;
    int64_t gs = mm_v2h_gs(d), ng = mm_v2h_ngroups(d), me = c->erank;
    size_t hs = (size_t)mm_v2d_hier_stride(d);
    int per_token = mm_v2d_payload_per_token(d);
    int64_t *next = mm_v2_scratch_take(&d->scratch, (size_t)ng * 8);
    int64_t *region = mm_v2_scratch_take(&d->scratch, (size_t)ng * 8);
    uint8_t *unit = mm_v2_scratch_take(&d->scratch, hs); /* payload + scales */
    uint8_t *ht = mm_v2_scratch_take(&d->scratch, hs - d->meta_off); /* head + targets */
    for (int64_t g = 0; g < ng; g++) {
        int lpe = mm_v2d_pe(d, g * gs);
        for (int p = 0; p < d->call.me; p++) region[g] += mm_v2_rec_counts(&d->call, p)[d->n + lpe];
    }
    const uint8_t *x = d->a->x.data;
    size_t xrow = (size_t)c->h * c->xsize;
    int quant = c->quant || c->scale_bytes; /* quantised here, or pre-quantised with scales */
    size_t pay = quant ? d->meta_off : c->row_bytes;
    mm_v2h_target_t *tg = (mm_v2h_target_t *)(ht + sizeof(mm_v2h_head_t));
    /* one pass: the token's own rows, then a unit per destination group (hop 1, or hop 2
     * directly when this rank leads the group) */
    for (int64_t t = 0; t < c->bs; t++) {
        if (!d->active[t]) continue;
        int cached = 0;
        mm_v2d_self_token(d, o, t, unit, &cached);
        for (int64_t g = 0; g < ng; g++) {
            int n = mm_v2h_targets(d, t, g, tg);
            for (int u = 0; u < n; u += per_token ? n : 1) {
                int nt = per_token ? n : 1;
                const uint8_t *payload = x + (size_t)t * xrow;
                if (quant) {
                    if (!(per_token && cached)) mm_v2d_make_row(d, t, mm_v2d_scale_row(d, tg[u].k, t), unit);
                    cached = 1;
                    payload = unit;
                }
                if (g * gs == me) {
                    MM_CHECK(mm_v2h_forward(d, o, NULL, me, payload, unit + d->scale_off,
                                            (int32_t)t, nt, tg + u));
                    continue;
                }
                mm_v2h_head_t head = {(int32_t)t, nt, 0, 0};
                memcpy(ht, &head, sizeof head);
                if (u) memmove(tg, tg + u, sizeof *tg); /* one pair per unit: its target first */
                int wpe = mm_v2_wpe(&d->call, mm_v2d_pe(d, g * gs));
                uint8_t *to = mm_v2_seg(&d->call, MM_V2D_STAGE) + (size_t)(region[g] + next[g]++) * hs;
                MM_CHECK(mm_shmem_put(to, payload, pay, wpe));
                MM_CHECK(mm_shmem_put(to + d->meta_off, ht,
                                      sizeof head + (size_t)nt * sizeof(mm_v2h_target_t), wpe));
            }
        }
    }
    MM_CHECK(mm_shmem_fence());
    int hop1 = 2 * d->n + d->call.me;
    for (int64_t g = 0; g < ng; g++)
        if (g * gs != me)
            MM_CHECK(mm_shmem_signal_op(mm_v2_sig(&d->call, MM_V2D_SIG, hop1),
                                        mm_v2_sigval(&d->call, MEGAMOE_OK),
                                        MM_SHMEM_SIGNAL_SET,
                                        mm_v2_wpe(&d->call, mm_v2d_pe(d, g * gs))));
    if (me % gs != 0) return MEGAMOE_OK; /* a member: its leader forwards, collect receives */
    MM_CHECK(mm_v2h_signal_group(d, me)); /* this leader's own rows are all in place */
    return mm_v2h_hop2(d, o, t0);
}
