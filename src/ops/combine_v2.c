/* MoeDistributeCombineV2 and MoeDistributeCombineAddRmsNorm (A3 semantics, docs/ops.md).
 *
 * Expert side: optional TP partial-sum exchange (ReduceScatterV), then every received row i goes
 * back to its source (assist triple: rank, token, slot) with one put into the source's dense
 * slot t * (K + NS) + k' (plus a generation stamp), one signal per (expert rank, source).
 * Source side: the fixed fp32 order of spec §5.3 (k ascending with special experts in place,
 * then shared experts, then shared_expert_x), separate roundings, one rounding at the end.
 * Rows a rank returns to itself are read in place from expand_x (no copy) on the plain path.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/abi.h"
#include "base/error.h"
#include "combine_v2.h"
#include "ops/call_order.h"

#define MM_BAD(...) return mm_error(MEGAMOE_INVALID_ARGUMENT, __VA_ARGS__)

const uint8_t *mm_v2c_row(const mm_v2_combine_t *c, int64_t i)
{
    if (c->y) return c->y + (size_t)i * (size_t)c->c.h * c->c.xsize;
    return (const uint8_t *)c->a->expand_x.data + (size_t)i * (size_t)c->c.h * c->c.xsize;
}

const uint8_t *mm_v2c_payload(const mm_v2_combine_t *c, int64_t i, uint8_t *tmp)
{
    if (!c->c.comm_quant) return mm_v2c_row(c, i);
    mm_v2_cq_quant(c->c.cqmode, c->c.xtype, c->c.h, mm_v2c_row(c, i), tmp);
    return tmp;
}

void mm_v2c_accumulate(const mm_v2_combine_t *c, float *acc, const uint8_t *payload, float w,
                       int weighted, float *scratch)
{
    int64_t h = c->c.h;
    if (c->c.comm_quant) {
        mm_v2_cq_dequant_f32(c->c.cqmode, c->c.xtype, h, payload, scratch);
        mm_rows_axpy_f32(acc, scratch, weighted ? w : 1.0f, h);
    } else {
        mm_rows_axpy(c->c.xtype, acc, payload, weighted ? w : 1.0f, h);
    }
}

/* Softmax gates (p1, p2) of const expert ci for token t (A3 form, spec §5.3). */
static void mm_v2c_const_gates(const mm_v2_combine_t *c, int64_t t, int64_t ci, float *scratch,
                               float *p1, float *p2)
{
    const mm_v2_cfg_t *g = &c->c;
    const megamoe_combine_v2_args_t *a = c->a;
    int64_t h = g->h;
    size_t xrow = (size_t)h * g->xsize;
    float *xf = scratch, *tmp = scratch + h;
    mm_v2_widen(g->xtype, (const uint8_t *)a->ori_x.data + (size_t)t * xrow, xf, h);
    float alpha[2];
    const megamoe_tensor_t *al[2] = {&a->const_expert_alpha_1, &a->const_expert_alpha_2};
    for (int j = 0; j < 2; j++) {
        mm_v2_widen(g->xtype, (const uint8_t *)al[j]->data + (size_t)ci * xrow, tmp, h);
        for (int64_t i = 0; i < h; i++) tmp[i] = tmp[i] * xf[i];
        alpha[j] = mm_rows_sum16(tmp, h);
    }
    float m = alpha[0] > alpha[1] ? alpha[0] : alpha[1];
    float d0 = alpha[0] - m, d1 = alpha[1] - m;
    float e0 = (float)exp((double)d0), e1 = (float)exp((double)d1);
    float sum = e0 + e1;
    *p1 = e0 / sum;
    *p2 = e1 / sum;
}

/* Term of a special expert e (zero: kind -1). */
static mm_v2c_term_t mm_v2c_special_term(const mm_v2_combine_t *c, int64_t t, int64_t e, float w,
                                         float *scratch)
{
    const mm_v2_cfg_t *g = &c->c;
    const megamoe_combine_v2_args_t *a = c->a;
    size_t xrow = (size_t)g->h * g->xsize;
    mm_v2c_term_t tm = {(const uint8_t *)a->ori_x.data + (size_t)t * xrow, NULL, w, 0, 0, -1};
    if (e < g->E + g->Z) return tm; /* zero expert */
    if (e < g->E + g->Z + g->Cp) {
        tm.kind = MM_V2C_ROW_W; /* copy expert */
        return tm;
    }
    int64_t ci = e - (g->E + g->Z + g->Cp);
    mm_v2c_const_gates(c, t, ci, scratch, &tm.p1, &tm.p2);
    tm.v = (const uint8_t *)a->const_expert_v.data + (size_t)ci * xrow;
    tm.kind = MM_V2C_CONST;
    return tm;
}

/* acc[0, n) += the term's elements [c0, c0 + n); tmp: 2 * n floats. */
static void mm_v2c_term_chunk(const mm_v2_combine_t *c, const mm_v2c_term_t *tm, float *acc,
                              int64_t c0, int64_t n, float *tmp)
{
    megamoe_dtype_t xt = c->c.xtype;
    size_t xs = c->c.xsize;
    switch (tm->kind) {
    case MM_V2C_ROW_W: mm_rows_axpy(xt, acc, tm->p + (size_t)c0 * xs, tm->w, n); break;
    case MM_V2C_ROW: mm_rows_axpy(xt, acc, tm->p + (size_t)c0 * xs, 1.0f, n); break;
    case MM_V2C_CQ_W:
    case MM_V2C_CQ:
        mm_v2_cq_dequant_range(c->c.cqmode, xt, c->c.h, tm->p, c0, n, tmp);
        mm_rows_axpy_f32(acc, tmp, tm->kind == MM_V2C_CQ_W ? tm->w : 1.0f, n);
        break;
    case MM_V2C_CONST: {
        float *xf = tmp, *vf = tmp + n;
        mm_v2_widen(xt, tm->p + (size_t)c0 * xs, xf, n);
        mm_v2_widen(xt, tm->v + (size_t)c0 * xs, vf, n);
        for (int64_t i = 0; i < n; i++) {
            float u = xf[i] * tm->p1, v = vf[i] * tm->p2;
            float sum = u + v;
            float p = sum * tm->w;
            acc[i] = acc[i] + p;
        }
        break;
    }
    default: break;
    }
}

void mm_v2c_sum_terms(const mm_v2_combine_t *c, const mm_v2c_term_t *terms, int nterms,
                      float *acc, float *tmp)
{
    int64_t h = c->c.h;
    for (int64_t c0 = 0; c0 < h; c0 += MM_V2C_CHUNK) {
        int64_t n = h - c0 < MM_V2C_CHUNK ? h - c0 : MM_V2C_CHUNK;
        memset(acc + c0, 0, (size_t)n * 4);
        for (int i = 0; i < nterms; i++) mm_v2c_term_chunk(c, &terms[i], acc + c0, c0, n, tmp);
    }
}

/* Copy and const experts (zero experts add nothing) onto acc. scratch: 3 * H floats. */
void mm_v2c_special(const mm_v2_combine_t *c, int64_t t, int64_t e, float w, float *acc,
                    float *scratch)
{
    mm_v2c_term_t tm = mm_v2c_special_term(c, t, e, w, scratch);
    for (int64_t c0 = 0; c0 < c->c.h && tm.kind >= 0; c0 += MM_V2C_CHUNK) {
        int64_t n = c->c.h - c0 < MM_V2C_CHUNK ? c->c.h - c0 : MM_V2C_CHUNK;
        mm_v2c_term_chunk(c, &tm, acc + c0, c0, n, scratch);
    }
}

void mm_v2c_emit(const mm_v2_combine_t *c, int64_t t, float *acc, float *scratch)
{
    const mm_v2_cfg_t *g = &c->c;
    int64_t h = g->h;
    size_t xrow = (size_t)h * g->xsize;
    uint8_t *x = (uint8_t *)c->a->x.data + (size_t)t * xrow;
    if (!c->arn) {
        mm_v2_narrow(g->xtype, acc, x, h);
        return;
    }
    /* add + RMSNorm (spec §5.4): s = acc + residual (acc not rounded first) */
    const megamoe_combine_add_rms_norm_args_t *r = c->arn;
    float *tmp = scratch;
    mm_rows_axpy(g->xtype, acc, (const uint8_t *)r->residual_x.data + (size_t)t * xrow, 1.0f, h);
    mm_v2_narrow(g->xtype, acc, x, h);
    float inv_h = 1.0f / (float)h;
    for (int64_t i = 0; i < h; i++) {
        float sq = acc[i] * acc[i];
        tmp[i] = sq * inv_h;
    }
    float ms = mm_rows_sum16(tmp, h) + (float)r->norm_eps;
    float rstd = 1.0f / sqrtf(ms);
    ((float *)r->rstd.data)[t] = rstd;
    for (int64_t i = 0; i < h; i++) tmp[i] = acc[i] * rstd;
    uint8_t *y = (uint8_t *)r->y.data + (size_t)t * xrow;
    mm_v2_narrow(g->xtype, tmp, y, h); /* bf16(s * rstd) */
    mm_v2_widen(g->xtype, y, tmp, h);
    float *gam = acc; /* acc is no longer needed */
    mm_v2_widen(g->xtype, r->gamma.data, gam, h);
    for (int64_t i = 0; i < h; i++) tmp[i] = tmp[i] * gam[i];
    mm_v2_narrow(g->xtype, tmp, y, h);
}

/* ---- local checks ---------------------------------------------------------------------- */

static megamoe_status_t mm_v2c_local(mm_v2_combine_t *c, mm_v2_op_t op)
{
    const megamoe_combine_v2_args_t *a = c->a;
    MM_CHECK(mm_v2_combine_config(a, op, &c->c));
    mm_v2_cfg_t *g = &c->c;
    MM_CHECK(mm_v2_check_ids_mask(g, &a->expert_ids, &a->x_active_mask,
                                  op == MM_V2_OP_COMBINE ? "combine_v2" : "combine_add_rms_norm"));
    c->KS = g->K + g->NS;
    /* outputs */
    if (c->arn) {
        const megamoe_combine_add_rms_norm_args_t *r = c->arn;
        megamoe_tensor_t row3 = mm_v2_tensor(g->xtype, 3, g->bs, 1, g->h);
        if (r->residual_x.data == NULL) MM_BAD("residual_x is required");
        if (r->residual_x.dtype != g->xtype || r->residual_x.ndim != 3 ||
            r->residual_x.shape[0] != g->bs || r->residual_x.shape[1] != 1 ||
            r->residual_x.shape[2] != g->h)
            MM_BAD("residual_x must be [BS, 1, H] = [%lld, 1, %lld] of the expand_x dtype",
                   (long long)g->bs, (long long)g->h);
        if (r->gamma.data == NULL || r->gamma.dtype != g->xtype || r->gamma.ndim != 1 ||
            r->gamma.shape[0] != g->h)
            MM_BAD("gamma must be [H] = [%lld] of the expand_x dtype", (long long)g->h);
        if (!isfinite(r->norm_eps)) MM_BAD("norm_eps must be finite");
        MM_CHECK(mm_v2_check_out(&a->x, &row3, "x", 0));
        MM_CHECK(mm_v2_check_out(&r->y, &row3, "y", 0));
        megamoe_tensor_t rs = mm_v2_tensor(MEGAMOE_DTYPE_FP32, 3, g->bs, 1, 1);
        MM_CHECK(mm_v2_check_out(&r->rstd, &rs, "rstd", 0));
    } else {
        megamoe_tensor_t want = mm_v2_tensor(g->xtype, 2, g->bs, g->h, 0);
        MM_CHECK(mm_v2_check_out(&a->x, &want, "x", 0));
    }
    if (g->erank < 0) return MEGAMOE_OK; /* removed: returns nothing, receives nothing */
    /* own rows and their routing (spec §5.1) */
    const int32_t *cnt = a->ep_send_counts.data;
    int64_t L = mm_v2_local_experts(g, g->erank);
    c->n_own = cnt[L * g->eW - 1];
    int64_t rows = a->expand_x.shape[0];
    if (c->n_own < 0 || c->n_own > g->A || c->n_own > rows)
        MM_BAD("ep_send_counts[%lld] = %lld (rows this rank received) must be in [0, min(A = %lld, "
               "expand_x rows %lld)]", (long long)(L * g->eW - 1), (long long)c->n_own,
               (long long)g->A, (long long)rows);
    if (g->tp == 2) {
        c->n_peer = ((const int32_t *)a->tp_send_counts.data)[1 - g->tp_rank];
        /* the peer's TP buffer holds A rows: more would be written past it */
        if (c->n_peer < 0 || c->n_peer > g->A)
            MM_BAD("tp_send_counts[%lld] = %lld (rows of the TP peer) must be in [0, A = %lld]",
                   (long long)(1 - g->tp_rank), (long long)c->n_peer, (long long)g->A);
        if (c->n_own + c->n_peer > rows)
            MM_BAD("tp_send_counts[%lld] = %lld: own rows %lld plus the rows of the TP peer "
                   "exceed expand_x's %lld rows", (long long)(1 - g->tp_rank),
                   (long long)c->n_peer, (long long)c->n_own, (long long)rows);
    }
    if (a->assist_info_for_combine.shape[0] < g->assist_off + 3 * c->n_own)
        MM_BAD("assist_info_for_combine has fewer than %lld entries (3 per received row%s)",
               (long long)(g->assist_off + 3 * c->n_own),
               g->assist_off ? ", after comm_alg fullmesh's BS * K slots" : "");
    const int32_t *tr = (const int32_t *)a->assist_info_for_combine.data + g->assist_off;
    for (int64_t i = 0; i < c->n_own; i++) {
        int32_t s = tr[3 * i], t = tr[3 * i + 1], k = tr[3 * i + 2];
        if (s < 0 || s >= g->eW || t < 0 || t >= g->max_bs || k < 0 || k >= c->KS)
            MM_BAD("assist_info_for_combine row %lld = (%d, %d, %d) is not a (rank < %lld, "
                   "token < %lld, slot < %lld) triple from dispatch_v2", (long long)i, s, t, k,
                   (long long)g->eW, (long long)g->max_bs, (long long)c->KS);
    }
    return MEGAMOE_OK;
}

/* ---- TP: ReduceScatterV of the partial results (spec §5.1) ----------------------------- */

static megamoe_status_t mm_v2c_tp(mm_v2_combine_t *c)
{
    const mm_v2_cfg_t *g = &c->c;
    size_t xrow = (size_t)g->h * g->xsize;
    int peer = mm_v2_tp_peer_pe(&c->call, g->tp_rank);
    uint8_t *buf = mm_v2_seg(&c->call, MM_V2C_TPDATA);
    const uint8_t *ex = c->a->expand_x.data;
    /* a failed transfer marks its peer lost (shmem.h): every rank's wait fails with it */
    if (c->n_peer > 0)
        MM_CHECK(mm_shmem_put(buf + 64, ex + (size_t)c->n_own * xrow, (size_t)c->n_peer * xrow,
                              mm_v2_wpe(&c->call, peer)));
    int64_t head = c->n_peer;
    uint64_t *sig = mm_v2_sig(&c->call, MM_V2C_SIG, 3 * c->n);
    MM_CHECK(mm_shmem_put_signal(buf, &head, 8, sig, mm_v2_sigval(&c->call, MEGAMOE_OK),
                                 MM_SHMEM_SIGNAL_SET,
                                 mm_v2_wpe(&c->call, peer)));
    MM_CHECK(mm_v2_wait(&c->call, sig, "the TP peer's partial rows", peer, NULL));
    int64_t got;
    memcpy(&got, buf, 8);
    if (got != c->n_own)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "combine_v2: the TP peer sends %lld partial rows "
                        "but this rank received %lld (tp_send_counts / ep_send_counts do not "
                        "match the dispatch)", (long long)got, (long long)c->n_own);
    c->y = mm_v2_scratch_take(&c->scratch, (size_t)c->n_own * xrow);
    for (int64_t i = 0; i < c->n_own; i++)
        mm_v2_tp_add(g->xtype, ex + (size_t)i * xrow, buf + 64 + (size_t)i * xrow,
                     c->y + (size_t)i * xrow, g->h);
    return MEGAMOE_OK;
}

/* ---- fullmesh: rows back to their sources ---------------------------------------------- */

/* A failure after the agreement: every signal line this rank owns is set with the error (as
 * dispatch's mm_v2d_poison), after everything sent before is complete. */
static void mm_v2c_poison(const mm_v2_combine_t *c, megamoe_status_t st)
{
    const mm_v2_cfg_t *g = &c->c;
    (void)mm_shmem_quiet();
    if (g->erank >= 0) {
        for (int64_t s = 0; s < g->eW; s++) /* rows (fullmesh), partials (hierarchy leader) */
            if (s != g->erank && !mm_v2_lost(&c->call, mm_v2c_pe(c, s)))
                mm_v2_poison_line(&c->call, MM_V2C_SIG, c->call.me, mm_v2c_pe(c, s), st);
        if (g->alg == MM_V2_ALG_HIERARCHY) mm_v2c_hier_poison(c, st);
    }
    if (g->tp == 2)
        mm_v2_poison_line(&c->call, MM_V2C_SIG, 3 * c->n, mm_v2_tp_peer_pe(&c->call, g->tp_rank), st);
    (void)mm_shmem_quiet();
}

static megamoe_status_t mm_v2c_send(mm_v2_combine_t *c)
{
    const mm_v2_cfg_t *g = &c->c;
    const int32_t *tr = (const int32_t *)c->a->assist_info_for_combine.data + g->assist_off;
    int plain_self = !g->comm_quant && c->y == NULL;
    uint8_t *tmp = mm_v2_scratch_take(&c->scratch, c->cstride);
    size_t stamp_off = c->cstride - 8;
    uint64_t gen = c->call.gen;
    int stream = (uint64_t)c->n_own * c->pay > (64u << 20);
    for (int64_t i = 0; i < c->n_own; i++) {
        int64_t s = tr[3 * i], slot = (int64_t)tr[3 * i + 1] * c->KS + tr[3 * i + 2];
        if (s == g->erank && plain_self) {
            c->selfrow[slot] = (int32_t)i;
            continue;
        }
        const uint8_t *p = mm_v2c_payload(c, i, tmp);
        uint8_t *to = mm_v2c_slot(c, MM_V2C_SLOTS, slot);
        if (s == g->erank) {
            if (p != tmp) memcpy(tmp, p, c->pay);
            memcpy(tmp + stamp_off, &gen, 8);
            memcpy(to, tmp, c->cstride);
            continue;
        }
        int pe = mm_v2c_pe(c, s);
        if (mm_v2_lost(&c->call, pe)) continue; /* a lost source takes nothing back */
        uint8_t *direct = mm_shmem_ptr(to,
            mm_v2_wpe(&c->call, pe)); /* same host: write straight into the peer */
        if (direct) {
            mm_v2_copy(direct, p, c->pay, stream);
            memcpy(direct + stamp_off, &gen, 8);
        } else {
            MM_CHECK(mm_shmem_put(to, p, c->pay, mm_v2_wpe(&c->call, pe)));
            MM_CHECK(mm_shmem_put(to + stamp_off, &gen, 8, mm_v2_wpe(&c->call, pe)));
        }
    }
    MM_CHECK(mm_shmem_fence());
    for (int64_t s = 0; s < g->eW; s++)
        if (s != g->erank && !mm_v2_lost(&c->call, mm_v2c_pe(c, s)))
            MM_CHECK(mm_shmem_signal_op(mm_v2_sig(&c->call, MM_V2C_SIG, c->call.me),
                                        mm_v2_sigval(&c->call, MEGAMOE_OK), MM_SHMEM_SIGNAL_SET,
                                        mm_v2_wpe(&c->call, mm_v2c_pe(c, s))));
    return MEGAMOE_OK;
}

static megamoe_status_t mm_v2c_reduce(mm_v2_combine_t *c, const uint8_t *processed)
{
    const mm_v2_cfg_t *g = &c->c;
    const megamoe_combine_v2_args_t *a = c->a;
    uint64_t t0 = mm_now_ns();
    for (int64_t d = 0; d < g->eW; d++) {
        if (d == g->erank) continue;
        int pe = mm_v2c_pe(c, d);
        if (mm_v2_lost(&c->call, pe)) continue; /* a lost expert rank: its pairs add nothing */
        MM_CHECK(mm_v2_wait(&c->call, mm_v2_sig(&c->call, MM_V2C_SIG, pe), "combine rows", pe, NULL));
        c->perf_us[mm_v2_phys(g, d)] += (int64_t)((mm_now_ns() - t0) / 1000);
    }
    int64_t h = g->h, K = g->K;
    float *acc = mm_v2_scratch_take(&c->scratch, (size_t)h * 16);
    float *scratch = acc + h; /* 3 * H */
    mm_v2c_term_t terms[16 + 4 + 1];
    const int32_t *ids = a->expert_ids.data;
    const uint8_t *mask = a->x_active_mask.data;
    const float *w = a->expert_scales.data;
    size_t stamp_off = c->cstride - 8;
    size_t xrow = (size_t)h * g->xsize;
    int cq = g->comm_quant != 0;
    megamoe_status_t st = MEGAMOE_OK;
    for (int64_t t = 0; t < g->bs && st == MEGAMOE_OK; t++) {
        if (!processed[t]) continue;
        int nt = 0;
        for (int64_t k = 0; k < c->KS; k++) {
            int64_t slot = t * c->KS + k;
            if (k < K) {
                if (g->mask_dim == 2 && !mask[t * K + k]) continue;
                int64_t e = ids[t * K + k];
                if (e >= g->E) {
                    mm_v2c_term_t tm = mm_v2c_special_term(c, t, e, w[t * K + k], scratch);
                    if (tm.kind >= 0) terms[nt++] = tm;
                    continue;
                }
                if (mm_v2_lost(&c->call, mm_v2c_pe(c, mm_v2_moe_dst(g, e)))) continue;
            } else if (mm_v2_lost(&c->call, mm_v2c_pe(c, mm_v2_shared_dst(g, g->erank, k - K)))) {
                continue; /* a lost shared-expert rank */
            }
            mm_v2c_term_t tm = {NULL, NULL, k < K ? w[t * K + k] : 1.0f, 0, 0, 0};
            if (c->selfrow && c->selfrow[slot] >= 0) {
                tm.p = (const uint8_t *)a->expand_x.data + (size_t)c->selfrow[slot] * xrow;
                tm.kind = k < K ? MM_V2C_ROW_W : MM_V2C_ROW;
            } else {
                tm.p = mm_v2c_slot(c, MM_V2C_SLOTS, slot);
                uint64_t stamp;
                memcpy(&stamp, tm.p + stamp_off, 8);
                if (stamp != c->call.gen) {
                    st = mm_error(MEGAMOE_INVALID_ARGUMENT, "combine_v2: no expert row came back "
                                  "for token %lld slot %lld: expert_ids, x_active_mask, "
                                  "assist_info_for_combine and ep_send_counts must be those of "
                                  "the matching dispatch_v2", (long long)t, (long long)k);
                    break;
                }
                tm.kind = cq ? (k < K ? MM_V2C_CQ_W : MM_V2C_CQ) : (k < K ? MM_V2C_ROW_W : MM_V2C_ROW);
            }
            terms[nt++] = tm;
        }
        if (st != MEGAMOE_OK) break;
        if (a->shared_expert_x.data) {
            mm_v2c_term_t tm = {(const uint8_t *)a->shared_expert_x.data + (size_t)t * xrow, NULL,
                                1.0f, 0, 0, MM_V2C_ROW};
            terms[nt++] = tm;
        }
        mm_v2c_sum_terms(c, terms, nt, acc, scratch);
        mm_v2c_emit(c, t, acc, scratch);
    }
    return st;
}

/* ---- entry ----------------------------------------------------------------------------- */

static void mm_v2c_zero_unprocessed(const mm_v2_combine_t *c, const uint8_t *processed)
{
    const mm_v2_cfg_t *g = &c->c;
    size_t xrow = (size_t)g->h * g->xsize;
    for (int64_t t = 0; t < g->bs; t++) {
        if (processed && processed[t]) continue;
        memset((uint8_t *)c->a->x.data + (size_t)t * xrow, 0, xrow);
        if (c->arn) {
            memset((uint8_t *)c->arn->y.data + (size_t)t * xrow, 0, xrow);
            ((float *)c->arn->rstd.data)[t] = 0.0f;
        }
    }
}

static megamoe_status_t mm_v2c_run(mm_v2_combine_t *c, mm_v2_op_t op)
{
    const megamoe_combine_v2_args_t *a = c->a;
    megamoe_status_t local = mm_take_next_call_error();
    if (local == MEGAMOE_OK) local = mm_v2c_local(c, op);
    const mm_v2_cfg_t *g = &c->c;
    int tp2 = local == MEGAMOE_OK && g->tp == 2;
    int uses_tp = a->tp_world_size > 1 || a->group_tp != NULL; /* same answer on a bad rank */
    MM_CHECK(mm_v2_call_begin(&c->call, MM_V2_WS_COMBINE, a->group_ep, tp2 ? a->group_tp : NULL,
                              uses_tp));
    c->n = c->call.n_world;
    MM_CHECK(mm_v2_survivors(&c->call)); /* the lost members (the runtime's mask) */
    if (local == MEGAMOE_OK)
        local = mm_v2_lost_unsupported(&c->call, g, op == MM_V2_OP_COMBINE ? "combine_v2"
                                                                          : "combine_add_rms_norm");
    if (local == MEGAMOE_OK) {
        c->pay = g->comm_quant ? mm_v2_cq_bytes(g->cqmode, g->h, g->xsize) : (size_t)g->h * g->xsize;
        c->cstride = mm_align_up(mm_align_up(c->pay, 8) + 8, 64);
        size_t h = (size_t)g->h, bs = (size_t)g->bs, xrow = h * g->xsize;
        size_t need = mm_v2_piece(bs) + mm_v2_piece((size_t)g->W * 8) +
                      mm_v2_piece(bs * (size_t)c->KS * 4) + 2 * mm_v2_piece(c->cstride) +
                      2 * mm_v2_piece(h * 16) + mm_v2_piece((size_t)c->n_own * xrow);
        if (g->alg == MM_V2_ALG_HIERARCHY)
            need += mm_v2_piece(mm_v2c_hier_seg(c, -1)) + mm_v2_piece(mm_align_up(h * 4 + 8, 64) + h * 8) +
                    2 * mm_v2_piece((size_t)g->eW) + mm_v2_piece(mm_v2c_hier_own_bytes(c)) +
                    mm_v2_piece(h * 4) + mm_v2_piece(bs);
        local = mm_v2_scratch_init(&c->scratch, MM_V2_WS_COMBINE, need);
    }
    mm_v2_record_t *r = mm_v2_rec(&c->call, c->call.me);
    r->status = local;
    if (local == MEGAMOE_OK) {
        mm_v2_record_attrs(g, r);
        r->seg[MM_V2C_SIG] = (uint64_t)c->n * 4 * 64;
        r->seg[MM_V2C_SLOTS] = (uint64_t)g->max_bs * (uint64_t)c->KS * c->cstride;
        r->seg[MM_V2C_TPDATA] = g->tp == 2 ? 64 + (uint64_t)g->A * (uint64_t)g->h * g->xsize : 0;
        for (int s = MM_V2C_HSLOTS; s < MM_V2C_NSEG; s++)
            r->seg[s] = g->alg == MM_V2_ALG_HIERARCHY ? mm_v2c_hier_seg(c, s) : 0;
    }
    megamoe_status_t st = mm_v2_call_agree(&c->call, op == MM_V2_OP_COMBINE
                                                         ? MM_CALL_COMBINE_V2
                                                         : MM_CALL_COMBINE_ADD_RMS_NORM);
    if (st == MEGAMOE_OK) {
        uint64_t seg[MM_V2C_NSEG];
        for (int s = 0; s < MM_V2C_NSEG; s++) seg[s] = mm_v2_call_segmax(&c->call, s);
        st = mm_v2_call_layout(&c->call, MM_V2C_NSEG, seg);
    }
    if (st != MEGAMOE_OK) return st;
    uint8_t *processed = mm_v2_scratch_take(&c->scratch, (size_t)g->bs);
    c->perf_us = mm_v2_scratch_take(&c->scratch, (size_t)g->W * 8);
    if (g->erank >= 0) mm_v2_active_tokens(g, a->x_active_mask.data, processed);
    if (g->erank >= 0 && g->tp == 2) st = mm_v2c_tp(c);
    if (st == MEGAMOE_OK && g->erank >= 0) {
        if (g->alg == MM_V2_ALG_HIERARCHY) {
            st = mm_v2c_hier_run(c, processed);
        } else {
            if (!g->comm_quant && c->y == NULL) {
                size_t nslot = (size_t)(g->bs * c->KS);
                c->selfrow = mm_v2_scratch_take(&c->scratch, nslot * 4);
                memset(c->selfrow, 0xff, nslot * 4);
            }
            if (st == MEGAMOE_OK) st = mm_v2c_send(c);
            if (st == MEGAMOE_OK) st = mm_v2c_reduce(c, processed);
        }
    }
    if (st != MEGAMOE_OK) mm_v2c_poison(c, st);
    if (st == MEGAMOE_OK) {
        if (a->zero_fill) mm_v2c_zero_unprocessed(c, processed);
        if (a->performance_info.data)
            for (int64_t p = 0; p < g->W; p++)
                ((int64_t *)a->performance_info.data)[p] += c->perf_us[p];
    }
    return st;
}

static megamoe_status_t mm_v2c_entry(const megamoe_combine_v2_args_t *a,
                                     const megamoe_combine_add_rms_norm_args_t *arn, mm_v2_op_t op)
{
    mm_v2_combine_t c;
    memset(&c, 0, sizeof c);
    c.a = a;
    c.arn = arn;
    megamoe_status_t st = mm_v2c_run(&c, op);
    mm_v2_scratch_free(&c.scratch);
    mm_v2_call_end(&c.call);
    return st;
}

/* The library's full copies of the args (megamoe/version.h); an unusable struct_size is
 * refused like NULL args: this rank's error on every rank. */
megamoe_status_t megamoe_combine_v2(const megamoe_combine_v2_args_t *args)
{
    megamoe_combine_v2_args_t copy = megamoe_combine_v2_args_default();
    megamoe_status_t cs = args == NULL ? MEGAMOE_INVALID_ARGUMENT
                                       : mm_abi_copy_in(&copy, sizeof copy, args,
                                                        "megamoe_combine_v2_args_t");
    if (cs != MEGAMOE_OK) {
        megamoe_status_t st = mm_take_next_call_error();
        if (st == MEGAMOE_OK)
            st = args == NULL ? mm_error(MEGAMOE_INVALID_ARGUMENT, "combine_v2: args is NULL")
                              : cs;
        return mm_v2_call_refuse(MM_CALL_COMBINE_V2, st);
    }
    return mm_v2c_entry(&copy, NULL, MM_V2_OP_COMBINE);
}

megamoe_status_t megamoe_combine_add_rms_norm(const megamoe_combine_add_rms_norm_args_t *args)
{
    megamoe_combine_add_rms_norm_args_t copy;
    megamoe_status_t cs =
        args == NULL ? MEGAMOE_INVALID_ARGUMENT : mm_v2_arn_copy_in(&copy, args);
    if (cs != MEGAMOE_OK) {
        megamoe_status_t st = mm_take_next_call_error();
        if (st == MEGAMOE_OK)
            st = args == NULL
                     ? mm_error(MEGAMOE_INVALID_ARGUMENT, "combine_add_rms_norm: args is NULL")
                     : cs;
        return mm_v2_call_refuse(MM_CALL_COMBINE_ADD_RMS_NORM, st);
    }
    return mm_v2c_entry(&copy.combine, &copy, MM_V2_OP_ADD_RMS_NORM);
}
