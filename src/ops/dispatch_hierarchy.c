/* DispatchV2 with comm_alg "hierarchy": two hops through one leader per group of ranks.
 *
 * Ranks (compact ids) form groups of MEGAMOE_RANKS_PER_NODE consecutive ranks; the first rank of
 * a group is its leader. Hop 1: a source sends each token ONCE per destination group (a "unit":
 * the payload, quantised once, plus the list of (slot, destination, position) targets in that
 * group) to the group's leader. Hop 2: the leader writes the rows into the destinations' receive
 * regions exactly where a fullmesh source would have put them, and raises the data signal on
 * the source's behalf. The receive side is the fullmesh one, so every output is identical.
 * With per-expert smoothing scales the payload differs per expert, so a unit carries one pair.
 */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "dispatch_v2.h"

typedef struct {
    int32_t t, n, pad0, pad1;
} mm_v2h_head_t;

typedef struct {
    int32_t k, dst, pos;
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
    int n = 0;
    for (int64_t k = 0; k < K + NS; k++) {
        int64_t dst = k < K ? d->pdst[t * K + k] : d->sdst[t * NS + (k - K)];
        if (dst < 0 || dst == c->erank || dst / gs != g) continue;
        out[n].k = (int32_t)k;
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

/* Hop 2: write a unit's rows into the destinations' receive regions (source s). A failed
 * transfer marks its peer lost (shmem.h): every rank's wait fails with it. */
static megamoe_status_t mm_v2h_forward(mm_v2_dispatch_t *d, int64_t s, const uint8_t *unit)
{
    mm_v2h_head_t head;
    memcpy(&head, unit + d->meta_off, sizeof head);
    const mm_v2h_target_t *tg = (const mm_v2h_target_t *)(unit + d->meta_off + sizeof head);
    for (int32_t i = 0; i < head.n; i++) {
        mm_v2h_target_t x;
        memcpy(&x, tg + i, sizeof x);
        int pe = mm_v2d_pe(d, x.dst);
        uint8_t *to = mm_v2d_rec(d, MM_V2D_RECV, mm_v2d_region(d, s, x.dst), x.pos);
        mm_v2_meta_t meta = {head.t, x.k, x.w, 0};
        if (pe == d->call.me) {
            memcpy(to, unit, d->meta_off);
            memcpy(to + d->meta_off, &meta, sizeof meta);
        } else {
            MM_CHECK(mm_shmem_put(to, unit, d->meta_off, mm_v2_wpe(&d->call, pe)));
            MM_CHECK(mm_shmem_put(to + d->meta_off, &meta, sizeof meta, mm_v2_wpe(&d->call, pe)));
        }
    }
    return MEGAMOE_OK;
}

/* Data signals for source s to every destination of this leader's group but s itself. */
static megamoe_status_t mm_v2h_signal_group(mm_v2_dispatch_t *d, int64_t s)
{
    const mm_v2_cfg_t *c = &d->c;
    int64_t gs = mm_v2h_gs(d), g0 = c->erank / gs * gs;
    int line = d->n + mm_v2d_pe(d, s);
    MM_CHECK(mm_shmem_fence());
    for (int64_t dst = g0; dst < g0 + gs && dst < c->eW; dst++)
        if (dst != s)
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

megamoe_status_t mm_v2d_hier_send(mm_v2_dispatch_t *d)
{
    const mm_v2_cfg_t *c = &d->c;
    int64_t gs = mm_v2h_gs(d), ng = mm_v2h_ngroups(d), me = c->erank;
    size_t hs = (size_t)mm_v2d_hier_stride(d);
    int per_token = mm_v2d_payload_per_token(d);
    int64_t *next = mm_v2_scratch_take(&d->scratch, (size_t)ng * 8);
    int64_t *region = mm_v2_scratch_take(&d->scratch, (size_t)ng * 8);
    uint8_t *unit = mm_v2_scratch_take(&d->scratch, hs);
    for (int64_t g = 0; g < ng; g++) {
        int lpe = mm_v2d_pe(d, g * gs);
        for (int p = 0; p < d->call.me; p++) region[g] += mm_v2_rec_counts(&d->call, p)[d->n + lpe];
    }
    const uint8_t *x = d->a->x.data;
    size_t xrow = (size_t)c->h * c->xsize;
    mm_v2h_target_t tg[32];
    /* hop 1 (or hop 2 directly when this rank leads the destination group) */
    for (int64_t t = 0; t < c->bs; t++) {
        if (!d->active[t]) continue;
        int cached = 0;
        for (int64_t g = 0; g < ng; g++) {
            int n = mm_v2h_targets(d, t, g, tg);
            for (int u = 0; u < n; u += per_token ? n : 1) {
                int nt = per_token ? n : 1;
                if (c->quant || c->scale_bytes) {
                    if (!(per_token && cached)) mm_v2d_make_row(d, t, mm_v2d_scale_row(d, tg[u].k, t), unit);
                    cached = 1;
                } else if (!cached) {
                    memcpy(unit, x + (size_t)t * xrow, c->row_bytes);
                    cached = 1;
                }
                mm_v2h_head_t head = {(int32_t)t, nt, 0, 0};
                memcpy(unit + d->meta_off, &head, sizeof head);
                memcpy(unit + d->meta_off + sizeof head, tg + u, (size_t)nt * sizeof(mm_v2h_target_t));
                if (g * gs == me) {
                    MM_CHECK(mm_v2h_forward(d, me, unit));
                    continue;
                }
                uint8_t *to = mm_v2_seg(&d->call, MM_V2D_STAGE) + (size_t)(region[g] + next[g]++) * hs;
                MM_CHECK(mm_shmem_put(to, unit, d->meta_off + sizeof head +
                                                    (size_t)nt * sizeof(mm_v2h_target_t),
                                      mm_v2_wpe(&d->call, mm_v2d_pe(d, g * gs))));
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
    megamoe_status_t st = MEGAMOE_OK;
    if (me % gs == 0) {
        /* this leader's own rows are all in place */
        MM_CHECK(mm_v2h_signal_group(d, me));
        /* hop 2 for every other source of the EP group */
        for (int64_t s = 0; s < c->eW && st == MEGAMOE_OK; s++) {
            if (s == me) continue;
            int pe = mm_v2d_pe(d, s);
            st = mm_v2_wait(&d->call, mm_v2_sig(&d->call, MM_V2D_SIG, 2 * d->n + pe),
                            "hierarchy hop-1 units", pe, NULL);
            if (st != MEGAMOE_OK) break;
            int64_t first = 0, count = mm_v2_rec_counts(&d->call, pe)[d->n + d->call.me];
            for (int p = 0; p < pe; p++) first += mm_v2_rec_counts(&d->call, p)[d->n + d->call.me];
            for (int64_t i = 0; i < count && st == MEGAMOE_OK; i++)
                st = mm_v2h_forward(d, s, mm_v2_seg(&d->call, MM_V2D_STAGE) + (size_t)(first + i) * hs);
            if (st == MEGAMOE_OK) st = mm_v2h_signal_group(d, s);
        }
    }
    return st;
}
