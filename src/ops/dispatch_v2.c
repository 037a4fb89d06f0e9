/* MoeDistributeDispatchV2 (A3 semantics, docs/ops.md): plan, fullmesh send, receive, TP.
 *
 * Data path per rank: every source puts its per-local-expert counts into each destination's
 * mailbox (one put-with-signal), then puts each row, quantised on the way, straight into the
 * destination's receive region for this source (regions are packed by the counts of the
 * agreement record). Rows for itself go straight into expand_x at their final row once all
 * counts are in. The receiver copies each source's region into expand_x as soon as that
 * source's data signal arrives (expert-major, then source, then token order: spec §3.4).
 */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/abi.h"
#include "base/error.h"
#include "dispatch_v2.h"
#include "ops/call_order.h"

static void mm_v2d_free(mm_v2_dispatch_t *d)
{
    mm_v2_scratch_free(&d->scratch);
    mm_v2_call_end(&d->call);
}

int mm_v2d_payload_per_token(const mm_v2_dispatch_t *d)
{
    const megamoe_tensor_t *s = &d->a->scales;
    return d->c.pass || s->data == NULL || s->ndim == 1;
}

/* Row of the scales tensor for slot k' of token t (-1: no scales; 0 for 1-D scales). */
int64_t mm_v2d_scale_row(const mm_v2_dispatch_t *d, int64_t k_slot, int64_t t)
{
    const megamoe_tensor_t *s = &d->a->scales;
    if (s->data == NULL) return -1;
    if (d->c.pass) return t; /* a pre-quantised x: its own scales row */
    if (s->ndim == 1) return 0;
    if (k_slot >= d->c.K) return k_slot - d->c.K; /* shared expert j */
    const int32_t *ids = d->a->expert_ids.data;
    return d->c.NS + ids[t * d->c.K + k_slot];
}

void mm_v2d_make_row(const mm_v2_dispatch_t *d, int64_t t, int64_t srow, uint8_t *rec)
{
    const mm_v2_cfg_t *c = &d->c;
    const uint8_t *x = (const uint8_t *)d->a->x.data + (size_t)t * (size_t)c->h * c->xsize;
    const megamoe_tensor_t *s = &d->a->scales;
    const float *smooth = NULL;
    int64_t slen = 0;
    if (srow >= 0 && c->pass) { /* the token's scales travel as bytes */
        slen = (int64_t)c->scale_bytes;
        smooth = (const float *)((const uint8_t *)s->data + (size_t)srow * c->scale_bytes);
    } else if (srow >= 0) {
        slen = s->ndim == 1 ? s->shape[0] : c->h;
        smooth = (const float *)s->data + (s->ndim == 1 ? 0 : srow * c->h);
    }
    mm_v2_quant_row(c, x, smooth, slen, rec, rec + d->scale_off);
}

/* ---- plan ------------------------------------------------------------------------------ */

/* Bytes of the plan arrays (taken from the scratch buffer). */
static size_t mm_v2d_plan_bytes(const mm_v2_cfg_t *c)
{
    size_t bs = (size_t)c->bs, K = (size_t)c->K, NS = (size_t)c->NS, eW = (size_t)c->eW;
    size_t L = (size_t)c->eL;
    return mm_v2_piece(bs) + 2 * mm_v2_piece(bs * K * 4) + 2 * mm_v2_piece(bs * NS * 4) +
           3 * mm_v2_piece(eW * L * 4) + 3 * mm_v2_piece(eW * 8) + mm_v2_piece((size_t)c->W * 8);
}

static megamoe_status_t mm_v2d_plan(mm_v2_dispatch_t *d)
{
    mm_v2_cfg_t *c = &d->c;
    int64_t bs = c->bs, K = c->K, NS = c->NS, eW = c->eW;
    d->Lmax = c->eL;
    mm_v2_scratch_t *sc = &d->scratch;
    d->active = mm_v2_scratch_take(sc, (size_t)bs);
    d->pdst = mm_v2_scratch_take(sc, (size_t)(bs * K) * 4);
    d->ppos = mm_v2_scratch_take(sc, (size_t)(bs * K) * 4);
    d->sdst = mm_v2_scratch_take(sc, (size_t)(bs * NS) * 4);
    d->spos = mm_v2_scratch_take(sc, (size_t)(bs * NS) * 4);
    d->cnt = mm_v2_scratch_take(sc, (size_t)(eW * d->Lmax) * 4);
    d->blk = mm_v2_scratch_take(sc, (size_t)(eW * d->Lmax) * 4);
    d->rcnt = mm_v2_scratch_take(sc, (size_t)(eW * d->Lmax) * 4);
    d->rows_to = mm_v2_scratch_take(sc, (size_t)eW * 8);
    d->units_to = mm_v2_scratch_take(sc, (size_t)eW * 8);
    d->src_region = mm_v2_scratch_take(sc, (size_t)eW * 8);
    d->perf_us = mm_v2_scratch_take(sc, (size_t)c->W * 8);
    for (int64_t i = 0; i < bs * K; i++) d->pdst[i] = -1;
    for (int64_t i = 0; i < bs * NS; i++) d->sdst[i] = -1;
    if (c->erank < 0) return MEGAMOE_OK; /* removed by elastic_info: sends nothing */
    const uint8_t *mask = d->a->x_active_mask.data;
    d->n_active = mm_v2_active_tokens(c, mask, d->active);
    const int32_t *ids = d->a->expert_ids.data;
    int64_t L = d->Lmax;
    /* pass 1: destinations and counts (special experts and masked pairs are not sent) */
    for (int64_t t = 0; t < bs; t++) {
        if (!d->active[t]) continue;
        for (int64_t k = 0; k < K; k++) {
            int64_t i = t * K + k, e = ids[i];
            if (c->mask_dim == 2 && !mask[i]) continue;
            if (e >= c->eE) continue;
            int64_t dst = mm_v2_moe_dst(c, e);
            if (mm_v2_lost(&d->call, mm_v2d_pe(d, dst))) continue; /* a lost rank's expert */
            d->pdst[i] = (int32_t)dst;
            d->cnt[dst * L + e % c->eL]++;
        }
        for (int64_t j = 0; j < NS; j++) {
            int64_t dst = mm_v2_shared_dst(c, c->erank, j);
            if (mm_v2_lost(&d->call, mm_v2d_pe(d, dst))) continue;
            d->sdst[t * NS + j] = (int32_t)dst;
            d->cnt[dst * L]++;
        }
    }
    /* block starts inside each destination's region: local expert, then token order */
    for (int64_t dst = 0; dst < eW; dst++) {
        int64_t acc = 0;
        for (int64_t le = 0; le < L; le++) {
            d->blk[dst * L + le] = (int32_t)acc;
            acc += d->cnt[dst * L + le];
        }
        d->rows_to[dst] = acc;
    }
    /* pass 2: positions (running counters reuse rcnt as scratch) */
    int32_t *run = d->rcnt;
    for (int64_t t = 0; t < bs; t++) {
        for (int64_t k = 0; k < K; k++) {
            int64_t i = t * K + k;
            if (d->pdst[i] < 0) continue;
            int64_t b = (int64_t)d->pdst[i] * L + ids[i] % c->eL;
            d->ppos[i] = d->blk[b] + run[b]++;
        }
        for (int64_t j = 0; j < NS; j++) {
            int64_t i = t * NS + j;
            if (d->sdst[i] < 0) continue;
            int64_t b = (int64_t)d->sdst[i] * L;
            d->spos[i] = d->blk[b] + run[b]++;
        }
    }
    memset(d->rcnt, 0, (size_t)(eW * L) * 4);
    /* fullmesh units: a token once per destination rank, or once per row when the payload
     * differs per expert (smoothing scales) */
    int per_token = mm_v2d_payload_per_token(d);
    for (int64_t t = 0; t < bs; t++) {
        for (int64_t k = 0; k < K + NS; k++) {
            int64_t dst = k < K ? d->pdst[t * K + k] : d->sdst[t * NS + (k - K)];
            if (dst < 0 || dst == c->erank) continue;
            int seen = 0;
            for (int64_t j = 0; j < k && per_token; j++) {
                int64_t o = j < K ? d->pdst[t * K + j] : d->sdst[t * NS + (j - K)];
                seen |= o == dst;
            }
            if (!seen) d->units_to[dst]++;
        }
    }
    return MEGAMOE_OK;
}

int64_t mm_v2d_region(const mm_v2_dispatch_t *d, int64_t s, int64_t dst)
{
    int ps = mm_v2d_pe(d, s), pd = mm_v2d_pe(d, dst);
    int64_t off = 0;
    for (int p = 0; p < ps; p++) off += mm_v2_rec_counts(&d->call, p)[pd];
    return off;
}

/* ---- outputs of one row ---------------------------------------------------------------- */

void mm_v2d_place(const mm_v2_dispatch_t *d, const mm_v2d_out_t *o, int64_t row,
                  const uint8_t *payload, const uint8_t *scales, int64_t s, const mm_v2_meta_t *meta)
{
    const mm_v2_cfg_t *c = &d->c;
    mm_v2_copy(o->xo + (size_t)row * c->row_bytes, payload, c->row_bytes, d->stream);
    if (o->so) memcpy(o->so + (size_t)row * c->scale_bytes, scales, c->scale_bytes);
    o->assist[3 * row] = (int32_t)s;
    o->assist[3 * row + 1] = meta->t;
    o->assist[3 * row + 2] = meta->k;
    if (o->escales) o->escales[row] = meta->w;
}

void mm_v2d_self_token(mm_v2_dispatch_t *d, const mm_v2d_out_t *o, int64_t t, uint8_t *rec,
                       int *cached)
{
    const mm_v2_cfg_t *c = &d->c;
    int64_t K = c->K, NS = c->NS, L = mm_v2_local_experts(c, c->erank), me = c->erank;
    const int32_t *ids = d->a->expert_ids.data;
    const float *ws = d->a->expert_scales.data;
    size_t xrow = (size_t)c->h * c->xsize;
    int per_token = mm_v2d_payload_per_token(d);
    for (int64_t k = 0; k < K + NS; k++) {
        int64_t dst = k < K ? d->pdst[t * K + k] : d->sdst[t * NS + (k - K)];
        if (dst != me) continue;
        int64_t pos = k < K ? d->ppos[t * K + k] : d->spos[t * NS + (k - K)];
        int64_t le = (k < K && L > 1) ? ids[t * K + k] % c->eL : 0;
        int64_t row = o->off[le * c->eW + me] + (pos - d->blk[me * d->Lmax + le]);
        const uint8_t *payload = (const uint8_t *)d->a->x.data + (size_t)t * xrow;
        if (c->quant || c->scale_bytes) { /* quantised here, or a pre-quantised row with scales */
            if (!(per_token && *cached)) mm_v2d_make_row(d, t, mm_v2d_scale_row(d, k, t), rec);
            *cached = per_token;
            payload = rec;
        }
        mm_v2_meta_t meta = {(int32_t)t, (int32_t)k, k < K ? (ws ? ws[t * K + k] : 0.0f) : 1.0f, 0};
        mm_v2d_place(d, o, row, payload, rec + d->scale_off, me, &meta);
    }
}

/* ---- send ------------------------------------------------------------------------------ */

static uint64_t *mm_v2d_sig(const mm_v2_dispatch_t *d, int line)
{
    return mm_v2_sig(&d->call, MM_V2D_SIG, line);
}

static megamoe_status_t mm_v2d_send_counts(mm_v2_dispatch_t *d)
{
    const mm_v2_cfg_t *c = &d->c;
    int me = d->call.me;
    int32_t *box = (int32_t *)mm_v2_seg(&d->call, MM_V2D_MAILBOX) + (size_t)me * d->Lmax;
    for (int64_t dst = 0; dst < c->eW; dst++) {
        if (dst == c->erank || mm_v2_lost(&d->call, mm_v2d_pe(d, dst))) continue;
        /* a failed transfer marks its peer lost (shmem.h): every rank's wait fails with it */
        MM_CHECK(mm_shmem_put_signal(box, d->cnt + dst * d->Lmax,
                                     (size_t)mm_v2_local_experts(c, dst) * 4, mm_v2d_sig(d, me),
                                     mm_v2_sigval(&d->call, MEGAMOE_OK), MM_SHMEM_SIGNAL_SET,
                                     mm_v2_wpe(&d->call, mm_v2d_pe(d, dst))));
    }
    return MEGAMOE_OK;
}

/* Write one unit (payload, head, targets) into dst's receive region. */
static megamoe_status_t mm_v2d_put_unit(const mm_v2_dispatch_t *d, int pe, int64_t slot,
                                        const uint8_t *payload, const mm_v2_unit_head_t *head,
                                        const mm_v2_unit_target_t *tg)
{
    uint8_t *to = mm_v2_seg(&d->call, MM_V2D_RECV) + (size_t)slot * d->ustride;
    size_t n = d->c.quant || d->c.scale_bytes ? d->meta_off : d->c.row_bytes;
    size_t tb = (size_t)head->n * sizeof *tg;
    uint8_t *direct = mm_shmem_ptr(to,
        mm_v2_wpe(&d->call, pe)); /* same host: write straight into the peer */
    if (direct) {
        mm_v2_copy(direct, payload, n, d->stream);
        memcpy(direct + d->meta_off, head, sizeof *head);
        memcpy(direct + d->meta_off + sizeof *head, tg, tb);
    } else {
        MM_CHECK(mm_shmem_put(to, payload, n, mm_v2_wpe(&d->call, pe)));
        MM_CHECK(mm_shmem_put(to + d->meta_off, head, sizeof *head, mm_v2_wpe(&d->call, pe)));
        MM_CHECK(mm_shmem_put(to + d->meta_off + sizeof *head, tg, tb, mm_v2_wpe(&d->call, pe)));
    }
    return MEGAMOE_OK;
}

static megamoe_status_t mm_v2d_send_rows(mm_v2_dispatch_t *d, const mm_v2d_out_t *o, uint8_t *rec)
{
    const mm_v2_cfg_t *c = &d->c;
    int64_t K = c->K, NS = c->NS;
    int64_t *next = mm_v2_scratch_take(&d->scratch, (size_t)c->eW * 8);
    int *pes = mm_v2_scratch_take(&d->scratch, (size_t)c->eW * sizeof(int));
    for (int64_t dst = 0; dst < c->eW; dst++) {
        next[dst] = mm_v2d_region(d, c->erank, dst);
        pes[dst] = mm_v2d_pe(d, dst);
    }
    const float *ws = d->a->expert_scales.data;
    const int32_t *ids = d->a->expert_ids.data;
    const uint8_t *x = d->a->x.data;
    size_t xrow = (size_t)c->h * c->xsize;
    int per_token = mm_v2d_payload_per_token(d);
    int32_t dsts[32];
    mm_v2_unit_target_t tg[32];
    for (int64_t t = 0; t < c->bs; t++) {
        if (!d->active[t]) continue;
        int cached = 0;
        mm_v2d_self_token(d, o, t, rec, &cached); /* x[t] is hot: own rows first */
        uint8_t used[32] = {0};
        for (int64_t k = 0; k < K + NS; k++)
            dsts[k] = k < K ? d->pdst[t * K + k] : d->sdst[t * NS + (k - K)];
        for (int64_t k = 0; k < K + NS; k++) {
            int64_t dst = dsts[k];
            if (dst < 0 || dst == c->erank || used[k]) continue;
            /* the rows of this token at dst (all of them, or only this one per expert) */
            int n = 0;
            for (int64_t j = k; j < K + NS; j++) {
                if (dsts[j] != dst || used[j] || (!per_token && j != k)) continue;
                used[j] = 1;
                tg[n].k = (int32_t)j;
                tg[n].le = j < K ? (int32_t)(ids[t * K + j] % c->eL) : 0;
                tg[n].pos = j < K ? d->ppos[t * K + j] : d->spos[t * NS + (j - K)];
                tg[n].w = j < K ? (ws ? ws[t * K + j] : 0.0f) : 1.0f;
                n++;
            }
            const uint8_t *payload = x + (size_t)t * xrow;
            if (c->quant || c->scale_bytes) { /* quantised here, or a pre-quantised row with scales */
                if (!(per_token && cached)) mm_v2d_make_row(d, t, mm_v2d_scale_row(d, k, t), rec);
                cached = 1;
                payload = rec;
            }
            mm_v2_unit_head_t head = {(int32_t)t, n, 0, 0};
            MM_CHECK(mm_v2d_put_unit(d, pes[dst], next[dst]++, payload, &head, tg));
        }
    }
    MM_CHECK(mm_shmem_fence());
    int me = d->call.me;
    for (int64_t dst = 0; dst < c->eW; dst++)
        if (dst != c->erank && !mm_v2_lost(&d->call, pes[dst]))
            MM_CHECK(mm_shmem_signal_op(mm_v2d_sig(d, d->n + me), mm_v2_sigval(&d->call, MEGAMOE_OK),
                                        MM_SHMEM_SIGNAL_SET, mm_v2_wpe(&d->call, pes[dst])));
    return MEGAMOE_OK;
}

/* ---- receive --------------------------------------------------------------------------- */


static void mm_v2d_copy_source(mm_v2_dispatch_t *d, const mm_v2d_out_t *o, int64_t s,
                               int64_t *blk)
{
    const mm_v2_cfg_t *c = &d->c;
    int64_t L = mm_v2_local_experts(c, c->erank), i = 0;
    if (c->alg != MM_V2_ALG_HIERARCHY) { /* units: every target row at its final place */
        int64_t acc = 0;
        for (int64_t le = 0; le < L; le++) {
            blk[le] = o->off[le * c->eW + s] - acc;
            acc += d->rcnt[s * d->Lmax + le];
        }
        int64_t n = mm_v2_rec_counts(&d->call, mm_v2d_pe(d, s))[d->call.me];
        const uint8_t *base = mm_v2_seg(&d->call, MM_V2D_RECV) + (size_t)d->src_region[s] * d->ustride;
        for (int64_t u = 0; u < n; u++) {
            const uint8_t *unit = base + (size_t)u * d->ustride;
            mm_v2_unit_head_t head;
            memcpy(&head, unit + d->meta_off, sizeof head);
            const uint8_t *tp = unit + d->meta_off + sizeof head;
            for (int32_t j = 0; j < head.n; j++) {
                mm_v2_unit_target_t tg;
                memcpy(&tg, tp + (size_t)j * sizeof tg, sizeof tg);
                mm_v2_meta_t meta = {head.t, tg.k, tg.w, 0};
                mm_v2d_place(d, o, blk[tg.le] + tg.pos, unit, unit + d->scale_off, s, &meta);
            }
        }
        return;
    }
    for (int64_t le = 0; le < L; le++) {
        int64_t n = d->rcnt[s * d->Lmax + le], row0 = o->off[le * c->eW + s];
        for (int64_t r = 0; r < n; r++, i++) {
            const uint8_t *rec = mm_v2d_rec(d, MM_V2D_RECV, d->src_region[s], i);
            mm_v2_meta_t meta;
            memcpy(&meta, rec + d->meta_off, sizeof meta);
            mm_v2d_place(d, o, row0 + r, rec, rec + d->scale_off, s, &meta);
        }
    }
}

/* Counts from every source, then the final block layout (spec §3.4, §3.6). */
static megamoe_status_t mm_v2d_layout(mm_v2_dispatch_t *d, const mm_v2d_out_t *o)
{
    const mm_v2_cfg_t *c = &d->c;
    const megamoe_dispatch_v2_args_t *a = d->a;
    int64_t eW = c->eW, me = c->erank, L = mm_v2_local_experts(c, me);
    int32_t *box = (int32_t *)mm_v2_seg(&d->call, MM_V2D_MAILBOX);
    for (int64_t s = 0; s < eW; s++) {
        if (s == me) {
            for (int64_t le = 0; le < L; le++) d->rcnt[s * d->Lmax + le] = d->cnt[me * d->Lmax + le];
            continue;
        }
        int pe = mm_v2d_pe(d, s);
        d->src_region[s] = mm_v2d_region(d, s, me);
        if (mm_v2_lost(&d->call, pe)) { /* a lost source: nothing comes */
            for (int64_t le = 0; le < L; le++) d->rcnt[s * d->Lmax + le] = 0;
            continue;
        }
        MM_CHECK(mm_v2_wait(&d->call, mm_v2d_sig(d, pe), "dispatch counts", pe, NULL));
        for (int64_t le = 0; le < L; le++)
            d->rcnt[s * d->Lmax + le] = box[(size_t)pe * d->Lmax + le];
    }
    int32_t *counts = a->ep_recv_counts.data;
    int64_t acc = 0;
    for (int64_t le = 0; le < L; le++)
        for (int64_t s = 0; s < eW; s++) {
            o->off[le * eW + s] = acc;
            acc += d->rcnt[s * d->Lmax + le];
            counts[le * eW + s] = (int32_t)acc;
        }
    d->n_own = acc;
    if (acc > a->expand_x.shape[0])
        return mm_error(MEGAMOE_INTERNAL, "dispatch_v2: %lld rows received exceed expand_x's %lld",
                        (long long)acc, (long long)a->expand_x.shape[0]);
    return MEGAMOE_OK;
}

/* The remote sources' rows, in arrival order. */
static megamoe_status_t mm_v2d_collect(mm_v2_dispatch_t *d, const mm_v2d_out_t *o, uint64_t t0)
{
    const mm_v2_cfg_t *c = &d->c;
    int64_t eW = c->eW, me = c->erank, pending = 0;
    uint8_t *done = mm_v2_scratch_take(&d->scratch, (size_t)eW);
    int64_t *blk = mm_v2_scratch_take(&d->scratch, (size_t)d->Lmax * 8);
    for (int64_t s = 0; s < eW; s++) {
        if (s == me || mm_v2_lost(&d->call, mm_v2d_pe(d, s))) done[s] = 1;
        else pending++;
    }
    megamoe_status_t st = MEGAMOE_OK;
    while (pending > 0 && st == MEGAMOE_OK) {
        int progressed = 0;
        for (int64_t s = 0; s < eW; s++) {
            if (done[s]) continue;
            int pe = mm_v2d_pe(d, s);
            uint64_t v = mm_shmem_signal_fetch(mm_v2d_sig(d, d->n + pe));
            if (v < mm_v2_sigval(&d->call, MEGAMOE_OK)) continue;
            if ((st = mm_v2_sig_status(&d->call, v, "dispatch data", pe)) != MEGAMOE_OK) break;
            d->perf_us[mm_v2_phys(c, s)] += (int64_t)((mm_now_ns() - t0) / 1000);
            mm_v2d_copy_source(d, o, s, blk);
            done[s] = 1;
            pending--;
            progressed = 1;
        }
        if (!progressed && st == MEGAMOE_OK && !d->rows_zeroed) {
            mm_v2d_zero_rows_early(d); /* nothing in yet: zero_fill's bulk meanwhile */
            if (d->rows_zeroed) continue;
        }
        if (!progressed && st == MEGAMOE_OK) {
            for (int64_t s = 0; s < eW; s++)
                if (!done[s]) {
                    int pe = mm_v2d_pe(d, s);
                    st = mm_v2_wait(&d->call, mm_v2d_sig(d, d->n + pe), "dispatch data", pe, NULL);
                    break;
                }
        }
    }
    return st;
}

/* A failure after the agreement (a transfer, a wait): every signal line this rank owns is set
 * with the error, so no peer reads rows that never came or waits for the timeout (each fails
 * with the same status; mm_v2_sigval). The lines are this rank's alone: a later call's value
 * cannot be overwritten. Everything sent before is complete first. */
static void mm_v2d_poison(const mm_v2_dispatch_t *d, megamoe_status_t st)
{
    const mm_v2_cfg_t *c = &d->c;
    (void)mm_shmem_quiet();
    if (c->erank >= 0) {
        for (int64_t dst = 0; dst < c->eW; dst++) {
            if (dst == c->erank || mm_v2_lost(&d->call, mm_v2d_pe(d, dst))) continue;
            mm_v2_poison_line(&d->call, MM_V2D_SIG, d->call.me, mm_v2d_pe(d, dst), st); /* counts */
            if (c->alg != MM_V2_ALG_HIERARCHY) /* data */
                mm_v2_poison_line(&d->call, MM_V2D_SIG, d->n + d->call.me, mm_v2d_pe(d, dst), st);
        }
        if (c->alg == MM_V2_ALG_HIERARCHY) mm_v2d_hier_poison(d, st);
    }
    if (c->tp == 2)
        mm_v2_poison_line(&d->call, MM_V2D_SIG, 3 * d->n, mm_v2_tp_peer_pe(&d->call, c->tp_rank), st);
    (void)mm_shmem_quiet();
}

/* ---- TP (tp_world_size 2): own rows first, then the peer's rows (spec §3.5) ------------- */

static megamoe_status_t mm_v2d_tp(mm_v2_dispatch_t *d, const mm_v2d_out_t *o, int64_t *n_peer_p)
{
    const mm_v2_cfg_t *c = &d->c;
    const megamoe_dispatch_v2_args_t *a = d->a;
    int peer = mm_v2_tp_peer_pe(&d->call, c->tp_rank);
    uint64_t *sig = mm_v2d_sig(d, 3 * d->n);
    uint8_t *tpd = mm_v2_seg(&d->call, MM_V2D_TPDATA);
    int32_t *meta = (int32_t *)mm_v2_seg(&d->call, MM_V2D_TPMETA);
    for (int64_t i = 0; i < d->n_own; i++) {
        MM_CHECK(mm_shmem_put(tpd + (size_t)i * d->stride, o->xo + (size_t)i * c->row_bytes,
                              c->row_bytes, mm_v2_wpe(&d->call, peer)));
        if (o->so)
            MM_CHECK(mm_shmem_put(tpd + (size_t)i * d->stride + d->scale_off,
                                  o->so + (size_t)i * c->scale_bytes, c->scale_bytes,
                                  mm_v2_wpe(&d->call, peer)));
    }
    int32_t head = (int32_t)d->n_own;
    MM_CHECK(mm_shmem_put(meta, &head, 4, mm_v2_wpe(&d->call, peer)));
    MM_CHECK(mm_shmem_put_signal(meta + 16, a->ep_recv_counts.data, (size_t)c->W * 4, sig,
                                 mm_v2_sigval(&d->call, MEGAMOE_OK), MM_SHMEM_SIGNAL_SET,
                                 mm_v2_wpe(&d->call, peer)));
    MM_CHECK(mm_v2_wait(&d->call, sig, "the TP peer's rows", peer, NULL));
    int64_t n_peer = meta[0];
    if (d->n_own + n_peer > a->expand_x.shape[0])
        return mm_error(MEGAMOE_INTERNAL, "dispatch_v2: own + TP peer rows %lld exceed expand_x",
                        (long long)(d->n_own + n_peer));
    for (int64_t i = 0; i < n_peer; i++) {
        int64_t row = d->n_own + i;
        memcpy(o->xo + (size_t)row * c->row_bytes, tpd + (size_t)i * d->stride, c->row_bytes);
        if (o->so)
            memcpy(o->so + (size_t)row * c->scale_bytes, tpd + (size_t)i * d->stride + d->scale_off,
                   c->scale_bytes);
    }
    memcpy((int32_t *)a->ep_recv_counts.data + c->W, meta + 16, (size_t)c->W * 4);
    *n_peer_p = n_peer;
    return MEGAMOE_OK;
}

/* ---- outputs --------------------------------------------------------------------------- */

static void mm_zero_tail(void *p, size_t elem, int64_t from, int64_t numel)
{
    if (p && from < numel) memset((uint8_t *)p + (size_t)from * elem, 0, (size_t)(numel - from) * elem);
}

/* zero_fill: expand_x's and dynamic_scales' rows from `rows` on (the bulk of zero_fill). */
static void mm_v2d_zero_rows(const mm_v2_dispatch_t *d, int64_t rows)
{
    const mm_v2_cfg_t *c = &d->c;
    const megamoe_dispatch_v2_args_t *a = d->a;
    mm_zero_tail(a->expand_x.data, c->row_bytes, rows, a->expand_x.shape[0]);
    int64_t sn = megamoe_tensor_numel(&a->dynamic_scales);
    size_t se = megamoe_dtype_size(a->dynamic_scales.dtype);
    mm_zero_tail(a->dynamic_scales.data, se, c->scale_elems ? rows * c->scale_elems : 0, sn);
}

void mm_v2d_zero_rows_early(mm_v2_dispatch_t *d)
{
    if (!d->a->zero_fill || d->c.tp == 2 || d->rows_zeroed) return; /* TP: rows known later */
    mm_v2d_zero_rows(d, d->n_own);
    d->rows_zeroed = 1;
}

static void mm_v2d_finish(mm_v2_dispatch_t *d, int64_t n_peer)
{
    const mm_v2_cfg_t *c = &d->c;
    const megamoe_dispatch_v2_args_t *a = d->a;
    int64_t L = c->erank >= 0 ? mm_v2_local_experts(c, c->erank) : 0, eW = c->eW;
    int64_t *tok = a->expert_token_nums.data;
    int32_t *counts = a->ep_recv_counts.data;
    int64_t cum = 0;
    for (int64_t le = 0; le < L; le++) {
        int64_t n = counts[le * eW + eW - 1] - (le ? counts[le * eW - 1] : 0);
        if (c->tp == 2) n += n_peer; /* L == 1 */
        cum += n;
        tok[le] = c->ent_type == 0 ? cum : n;
    }
    if (c->tp == 2) {
        int32_t *tpc = a->tp_recv_counts.data;
        tpc[c->tp_rank] = (int32_t)d->n_own;
        tpc[1 - c->tp_rank] = (int32_t)n_peer;
    }
    if (a->performance_info.data) {
        int64_t *perf = a->performance_info.data;
        for (int64_t r = 0; r < c->W; r++) perf[r] += d->perf_us[r];
    }
    if (c->alg == MM_V2_ALG_FULLMESH_A2) { /* A2's per-pair slot array ahead of the triples */
        int32_t *slot = a->assist_info_for_combine.data;
        const int32_t *ids = a->expert_ids.data;
        for (int64_t i = 0; i < c->bs * c->K; i++) {
            int64_t dst = c->erank >= 0 ? d->pdst[i] : -1;
            slot[i] = dst < 0 ? 0 : d->ppos[i] - d->blk[dst * d->Lmax + ids[i] % c->eL];
        }
    }
    if (!a->zero_fill) return;
    if (!d->rows_zeroed) mm_v2d_zero_rows(d, d->n_own + n_peer);
    mm_zero_tail(a->assist_info_for_combine.data, 4, c->assist_off + 3 * d->n_own,
                 megamoe_tensor_numel(&a->assist_info_for_combine));
    mm_zero_tail(tok, 8, L, megamoe_tensor_numel(&a->expert_token_nums));
    int64_t cn = megamoe_tensor_numel(&a->ep_recv_counts);
    if (c->tp == 2) mm_zero_tail(counts, 4, 2 * c->W, cn);
    else mm_zero_tail(counts, 4, L * eW, cn);
    if (c->tp != 2) mm_zero_tail(a->tp_recv_counts.data, 4, 0, megamoe_tensor_numel(&a->tp_recv_counts));
    mm_zero_tail(a->expand_scales.data, 4, a->expert_scales.data ? d->n_own : 0,
                 megamoe_tensor_numel(&a->expand_scales));
}

/* ---- entry ----------------------------------------------------------------------------- */

static megamoe_status_t mm_v2d_local(mm_v2_dispatch_t *d)
{
    const megamoe_dispatch_v2_args_t *a = d->a;
    MM_CHECK(mm_v2_dispatch_config(a, &d->c));
    mm_v2_cfg_t *c = &d->c;
    MM_CHECK(mm_v2_check_ids_mask(c, &a->expert_ids, &a->x_active_mask, "dispatch_v2"));
    megamoe_dispatch_v2_args_t want = *a;
    mm_v2_dispatch_out_shapes(c, &want);
    MM_CHECK(mm_v2_check_out(&a->expand_x, &want.expand_x, "expand_x", 1));
    MM_CHECK(mm_v2_check_out(&a->dynamic_scales, &want.dynamic_scales, "dynamic_scales", 1));
    megamoe_tensor_t assist = want.assist_info_for_combine;
    if (c->alg == MM_V2_ALG_FULLMESH_A2) c->assist_off = c->bs * c->K;
    assist.shape[0] = c->assist_off + 3 * c->A;
    MM_CHECK(mm_v2_check_out(&a->assist_info_for_combine, &assist, "assist_info_for_combine", 1));
    MM_CHECK(mm_v2_check_out(&a->expert_token_nums, &want.expert_token_nums, "expert_token_nums", 0));
    megamoe_tensor_t counts = want.ep_recv_counts;
    counts.shape[0] = c->n_counts;
    MM_CHECK(mm_v2_check_out(&a->ep_recv_counts, &counts, "ep_recv_counts", 1));
    if (c->tp == 2) MM_CHECK(mm_v2_check_out(&a->tp_recv_counts, &want.tp_recv_counts, "tp_recv_counts", 0));
    if (a->expert_scales.data)
        MM_CHECK(mm_v2_check_out(&a->expand_scales, &want.expand_scales, "expand_scales", 1));
    d->scale_off = mm_align_up(c->row_bytes, 16);
    d->meta_off = d->scale_off + mm_align_up(c->scale_bytes, 16);
    d->stride = mm_align_up(d->meta_off + sizeof(mm_v2_meta_t), 64);
    d->ustride = mm_align_up(d->meta_off + sizeof(mm_v2_unit_head_t) +
                             (size_t)(c->K + c->NS) * sizeof(mm_v2_unit_target_t), 64);
    /* outputs far beyond the last-level cache are written with streaming stores */
    d->stream = (uint64_t)c->T * (uint64_t)c->A * c->row_bytes > (64u << 20);
    size_t eW = (size_t)c->eW, ng = (size_t)(c->hier_group ? (c->eW + c->hier_group - 1) / c->hier_group : 0);
    size_t need = mm_v2d_plan_bytes(c) + 2 * mm_v2_piece(d->stride) +
                  2 * mm_v2_piece((size_t)c->eL * eW * 8) + mm_v2_piece(eW * 8) +
                  mm_v2_piece(eW * sizeof(int)) + mm_v2_piece(eW);
    if (c->alg == MM_V2_ALG_HIERARCHY) /* mm_v2d_hier_send */
        need += 2 * mm_v2_piece(ng * 8) + mm_v2_piece((size_t)mm_v2d_hier_stride(d)) +
                mm_v2_piece(mm_v2d_hier_stride(d) - d->meta_off) + mm_v2_piece((size_t)c->eL * 8) +
                mm_v2_piece(eW);
    return mm_v2_scratch_init(&d->scratch, MM_V2_WS_DISPATCH, need);
}

megamoe_status_t megamoe_dispatch_v2(const megamoe_dispatch_v2_args_t *caller_args)
{
    megamoe_status_t local = mm_take_next_call_error();
    if (caller_args == NULL && local == MEGAMOE_OK)
        local = mm_error(MEGAMOE_INVALID_ARGUMENT, "dispatch_v2: args is NULL");
    /* the library's full copy (megamoe/version.h); an unusable struct_size is refused like
     * NULL args: this rank's error on every rank */
    megamoe_dispatch_v2_args_t copy = megamoe_dispatch_v2_args_default();
    const megamoe_dispatch_v2_args_t *a = NULL;
    if (caller_args != NULL) {
        megamoe_status_t cs =
            mm_abi_copy_in(&copy, sizeof copy, caller_args, "megamoe_dispatch_v2_args_t");
        if (cs == MEGAMOE_OK) a = &copy;
        else if (local == MEGAMOE_OK) local = cs;
    }
    if (a == NULL) return mm_v2_call_refuse(MM_CALL_DISPATCH_V2, local);
    mm_v2_dispatch_t d;
    memset(&d, 0, sizeof d);
    d.a = a;
    if (local == MEGAMOE_OK) local = mm_v2d_local(&d);
    int tp2 = local == MEGAMOE_OK && d.c.tp == 2;
    int uses_tp = a->tp_world_size > 1 || a->group_tp != NULL; /* same answer on a bad rank */
    megamoe_status_t st = mm_v2_call_begin(&d.call, MM_V2_WS_DISPATCH, a->group_ep,
                                           tp2 ? a->group_tp : NULL, uses_tp);
    if (st != MEGAMOE_OK) {
        mm_v2d_free(&d);
        return st;
    }
    d.n = d.call.n_world;
    /* the lost members of the group (the runtime's mask), then the plan around them */
    st = mm_v2_survivors(&d.call);
    if (st != MEGAMOE_OK) {
        mm_v2d_free(&d);
        return st; /* this rank is out */
    }
    if (local == MEGAMOE_OK) local = mm_v2_lost_unsupported(&d.call, &d.c, "dispatch_v2");
    if (local == MEGAMOE_OK) local = mm_v2d_plan(&d);
    mm_v2_record_t *r = mm_v2_rec(&d.call, d.call.me);
    r->status = local;
    if (local == MEGAMOE_OK) {
        mm_v2_record_attrs(&d.c, r);
        int32_t *rows = mm_v2_rec_counts(&d.call, d.call.me);
        int hier = d.c.alg == MM_V2_ALG_HIERARCHY;
        for (int64_t dst = 0; dst < d.c.eW && d.c.erank >= 0; dst++)
            if (dst != d.c.erank)
                rows[mm_v2d_pe(&d, dst)] = (int32_t)(hier ? d.rows_to[dst] : d.units_to[dst]);
        if (d.c.alg == MM_V2_ALG_HIERARCHY) mm_v2d_hier_units(&d, rows + d.n);
        r->aux[0] = (int64_t)(d.c.alg == MM_V2_ALG_HIERARCHY ? d.stride : d.ustride);
        r->seg[MM_V2D_SIG] = (uint64_t)d.n * 4 * 64;
        r->seg[MM_V2D_MAILBOX] = (uint64_t)d.n * (uint64_t)d.Lmax * 4;
        r->seg[MM_V2D_TPDATA] = d.c.tp == 2 ? (uint64_t)d.c.A * d.stride : 0;
        r->seg[MM_V2D_TPMETA] = (uint64_t)(d.c.W + 16) * 4;
        r->aux[1] = d.c.alg == MM_V2_ALG_HIERARCHY ? (int64_t)mm_v2d_hier_stride(&d) : 0;
    }
    st = mm_v2_call_agree(&d.call, MM_CALL_DISPATCH_V2);
    if (st == MEGAMOE_OK) {
        uint64_t seg[MM_V2D_NSEG];
        for (int s = 0; s < MM_V2D_NSEG; s++) seg[s] = mm_v2_call_segmax(&d.call, s);
        for (int p = 0; p < d.n; p++) { /* receive and staging regions from everyone's counts */
            uint64_t rows = 0, units = 0;
            for (int q = 0; q < d.n; q++) {
                rows += (uint64_t)mm_v2_rec_counts(&d.call, q)[p];
                units += (uint64_t)mm_v2_rec_counts(&d.call, q)[d.n + p];
            }
            uint64_t rb = rows * (uint64_t)mm_v2_rec(&d.call, p)->aux[0];
            uint64_t sb = units * (uint64_t)mm_v2_rec(&d.call, p)->aux[1];
            if (rb > seg[MM_V2D_RECV]) seg[MM_V2D_RECV] = rb;
            if (sb > seg[MM_V2D_STAGE]) seg[MM_V2D_STAGE] = sb;
        }
        st = mm_v2_call_layout(&d.call, MM_V2D_NSEG, seg);
    }
    if (st != MEGAMOE_OK) {
        mm_v2d_free(&d);
        return st;
    }
    /* data phase */
    const mm_v2_cfg_t *c = &d.c;
    mm_v2d_out_t o = {a->expand_x.data, c->scale_bytes ? a->dynamic_scales.data : NULL,
                      (int32_t *)a->assist_info_for_combine.data + c->assist_off,
                      a->expert_scales.data ? a->expand_scales.data : NULL, NULL};
    int64_t n_peer = 0;
    uint8_t *rec = mm_v2_scratch_take(&d.scratch, d.stride);
    o.off = mm_v2_scratch_take(&d.scratch, (size_t)(d.Lmax * c->eW) * 8);
    if (c->erank >= 0) {
        uint64_t t0 = mm_now_ns();
        /* counts first (everyone sends them before waiting), then one pass over the tokens
         * writes the own rows and sends the others' (fullmesh: a unit per destination rank;
         * hierarchy: a unit per destination group, forwarded by its leader) */
        st = mm_v2d_send_counts(&d);
        if (st == MEGAMOE_OK) st = mm_v2d_layout(&d, &o);
        int hier = c->alg == MM_V2_ALG_HIERARCHY;
        if (st == MEGAMOE_OK) st = hier ? mm_v2d_hier_send(&d, &o, t0) : mm_v2d_send_rows(&d, &o, rec);
        if (st == MEGAMOE_OK && !(hier && mm_v2d_hier_leads(&d))) st = mm_v2d_collect(&d, &o, t0);
    }
    if (st == MEGAMOE_OK && c->tp == 2) st = mm_v2d_tp(&d, &o, &n_peer);
    if (st == MEGAMOE_OK) mm_v2d_finish(&d, n_peer);
    else mm_v2d_poison(&d, st);
    mm_v2d_free(&d);
    return st;
}
