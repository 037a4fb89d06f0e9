/* O1 backward (reference design §1.5) as one launch of the multicore executor; task bodies:
 *   dispatch  source: dY = w · dOut rows of one tile straight into the owner's receive rows,
 *             and grad w[t,k] = <dOut[t], y[t,k]>
 *   expert    owner, one received tile: dA = dY·W2ᵀ, dGU = SwiGLU'(dA, GU), dX = dGU·W1ᵀ
 *             straight into the source's return rows
 *   wgrad     owner, one expert (a chunk of output rows): dW2_j = A_jᵀ·dY_j once all of
 *             expert j's rows arrived, dW1_j = X_jᵀ·dGU_j once all its tiles are done; they
 *             run after every data-gradient tile, overlapping the peers' combine and reduce
 *   reduce    source: grad hidden[t] = sum_k dX[t,k] (fp32, k ascending)
 * The same kernels, row sets and orders as O0 (backward_o0.c): bit-identical results.
 * Every local check (saved state, weights, buffers) is taken into the call's first exchange
 * (call_order.h: also the call order and the saved states' forward numbers), before any data
 * moves; a failure inside the launch may leave the weight gradients partly written.
 */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "moe/experts_impl.h"
#include "moe/moe_replicas.h"
#include "moe/moe_rows.h"

typedef struct mm_o1_bwd {
    mm_moe_bwd_ctx_t c;
    int direct;    /* dY rows written in place into the owners' receive buffers */
    int pull;      /* dY rows staged in place in this rank's own buffer; owners fetch them
                      into c.recv (ordinary memory) in their EXPERT tasks */
    float *gw;     /* [T*K] grad router weights (fp32), slot order, or NULL */
    uint16_t *dgu; /* [R, 2I] */
} mm_o1_bwd_t;

static megamoe_status_t mm_o1_bwd_dispatch(void *ctx, mm_mc_worker_t *w, const mm_mc_tile_t *t)
{
    mm_o1_bwd_t *b = ctx;
    const int64_t H = b->c.H, K = b->c.K;
    const mm_ep_plan_t *p = b->c.plan;
    const mm_ep_xbuf_t *xb = b->c.g->xbuf;
    /* push: the tile's rows are contiguous on the owner: written in place, or staged and put;
     * pull: staged at their own permuted positions (the owner fetches them) */
    uint16_t *stage = mm_moe_o1_scratch(&b->c.x->cfg, w).rows;
    char *sym = (char *)xb->recv + (size_t)t->dst_row * xb->row_bytes;
    uint16_t *base = b->pull     ? mm_ep_stage_dst(xb, t->row0)
                     : b->direct ? mm_shmem_ptr(sym, xb->pes[t->peer])
                                 : stage;
    for (int64_t i = 0; i < t->rows; i++) {
        int64_t pos = t->row0 + i, slot = p->perm_slot[pos];
        const uint16_t *d = b->c.dout + (slot / K) * H;
        mm_rows_scale(base + i * H, d, b->c.sv->w[slot], (size_t)H);
        if (b->gw) b->gw[slot] = mm_rows_dot(d, b->c.sv->y + pos * H, (size_t)H);
    }
    if (!b->direct && !b->pull) /* a failure fails the launch on every rank (DONE status) */
        return mm_shmem_put(sym, stage, (size_t)t->rows * xb->row_bytes, xb->pes[t->peer]);
    return MEGAMOE_OK;
}

static megamoe_status_t mm_o1_bwd_expert(void *ctx, mm_mc_worker_t *w, const mm_mc_tile_t *t)
{
    mm_o1_bwd_t *b = ctx;
    megamoe_experts_t *x = b->c.x;
    const int64_t H = b->c.H, I = b->c.I, r0 = t->row0, n = t->rows, e = t->e;
    mm_o1_scratch_t s = mm_moe_o1_scratch(&x->cfg, w);
    uint64_t t0 = w->ring ? mm_now_ns() : 0;
    if (b->pull) /* the tile's dY rows, kept for dW2 (which waits for every tile of j) */
        MM_CHECK(mm_ep_pull_rows(b->c.g->xbuf, b->c.plan, (uint16_t *)b->c.recv + r0 * H,
                                 (size_t)H * 2, r0, r0 + n));
    /* dA[n, I] = dY · down[j]ᵀ (the tile's dA lives only in the worker's scratch) */
    MM_CHECK(mm_moe_o1_tile_gemm(MM_GEMM_NT, mm_moe_slot_w2t(x, b->c.guest, t->j), n, H, I,
                                 b->c.recv + r0 * H, s.a));
    mm_moe_o1_stamp(w, MM_MC_ST_GMM_DA, e, t->peer, &t0);
    uint16_t *dgu = b->dgu + r0 * 2 * I;
    MM_CHECK(mm_swiglu_bwd(n, I, b->c.sv->gu + r0 * 2 * I, 2 * I, s.a, I, dgu, 2 * I, x->cfg.limit));
    mm_moe_o1_stamp(w, MM_MC_ST_SWIGLU_GRAD, e, t->peer, &t0);
    /* dX[n, H] = dGU · gate_up[j]ᵀ straight into the source's return rows */
    void *dst = mm_moe_o1_ret_dst(b->c.g, t->peer, t->ret_row, s.rows);
    MM_CHECK(mm_moe_o1_tile_gemm(MM_GEMM_NT, mm_moe_slot_w1t(x, b->c.guest, t->j), n, 2 * I, H,
                                 dgu, dst));
    MM_CHECK(mm_moe_o1_ret_put(b->c.g, t->peer, t->ret_row, dst, s.rows, n));
    mm_moe_o1_stamp(w, MM_MC_ST_GMM_DX, e, t->peer, &t0);
    return MEGAMOE_OK;
}

static megamoe_status_t mm_o1_bwd_wgrad(void *ctx, mm_mc_worker_t *w, int which, int64_t j,
                                        int64_t m0, int64_t m1)
{
    (void)w;
    mm_o1_bwd_t *b = ctx;
    const int64_t go = b->c.plan->group_off[j], rows = b->c.plan->group_off[j + 1] - go;
    mm_gemm_args_t g;
    mm_gemm_args_init(&g);
    g.K = rows; /* an expert without rows gets exact zeros */
    g.backend = b->c.g->gemm_plain; /* resolved at group creation, not here on a worker */
    g.m0 = m0;
    g.m1 = m1;
    /* the output, or (replicas) a home partial / a guest slot's partial in fp32 */
    mm_moe_rep_wgrad_args(&b->c, b->dgu, j, which, &g);
    return mm_gemm(&g);
}

/* Guest slot g: pack the forward's copy of its weights for dA and dX (once per copy). */
static megamoe_status_t mm_o1_bwd_fetch(void *ctx, mm_mc_worker_t *w, int g, int64_t e)
{
    (void)w;
    (void)e;
    mm_o1_bwd_t *b = ctx;
    if (b->c.guest == NULL || b->c.guest[g] == NULL)
        return mm_error(MEGAMOE_INTERNAL, "guest slot %d has no weights from its forward", g);
    return mm_moe_rep_pack_backward(b->c.guest[g]);
}

static megamoe_status_t mm_o1_bwd_wsum(void *ctx, mm_mc_worker_t *w, int64_t j, int64_t chunk,
                                       int64_t chunks, const int32_t *guests, int n)
{
    (void)w;
    mm_o1_bwd_t *b = ctx;
    return mm_moe_rep_wsum(&b->c, j, chunk, chunks, guests, n);
}

static megamoe_status_t mm_o1_bwd_reduce(void *ctx, mm_mc_worker_t *w, int64_t t0, int64_t t1)
{
    mm_o1_bwd_t *b = ctx;
    mm_rows_reduce_tokens(b->c.dhidden, b->c.ret, b->c.plan->slot_pos, NULL, NULL,
                          mm_moe_o1_scratch(&b->c.x->cfg, w).acc, b->c.H, b->c.K, t0, t1);
    return MEGAMOE_OK;
}

megamoe_status_t mm_moe_backward_o1(megamoe_experts_t *x, mm_call_t *call, megamoe_status_t local,
                                    megamoe_experts_saved_t *sv,
                                    const megamoe_experts_weights_t *wts, const void *dout,
                                    const megamoe_experts_grads_t *gr)
{
    mm_moe_group_t *g = x->group;
    const int64_t I = x->cfg.I, K = x->cfg.K;
    size_t TK = 0; /* the forward's slots on this rank (known once the saved state is checked) */
    uint64_t t0 = mm_now_ns();
    megamoe_status_t st = local;
    if (st == MEGAMOE_OK && !g->ready) /* no forward ran: no executor */
        st = mm_error(MEGAMOE_INVALID_STATE, "backward before any forward of this layer");
    if (!g->ready) return mm_call_exchange(call, x->team, st, NULL, 0);
    if (st == MEGAMOE_OK) st = mm_moe_check_backward(x, sv, dout, gr);
    if (st == MEGAMOE_OK && sv->gen == 0)
        st = mm_error(MEGAMOE_INVALID_ARGUMENT,
                      "the saved state does not come from an O1 forward of this layer");
    if (st == MEGAMOE_OK) st = mm_moe_pack_weights(x, wts, 1);
    mm_o1_bwd_t b;
    memset(&b, 0, sizeof b);
    if (st == MEGAMOE_OK) {
        const int64_t Rb = sv->rows > 0 ? sv->rows : 1;
        TK = (size_t)(sv->plan->T * K);
        mm_moe_bwd_ctx_init(&b.c, x, sv, dout, gr);
        b.pull = mm_moe_is_pull(&x->cfg);
        b.direct = !b.pull && mm_ep_dispatch_direct(g->xbuf) && !mm_ep_force_puts;
        void *p = NULL;
        st = mm_moe_scratch(g, MM_SCR_DGU, (size_t)Rb * (size_t)(2 * I) * 2, &p);
        b.dgu = p;
        if (st == MEGAMOE_OK && b.pull) {
            st = mm_moe_scratch(g, MM_SCR_RECV, (size_t)Rb * (size_t)x->cfg.H * 2, &p);
            b.c.recv = p;
        }
        if (st == MEGAMOE_OK && gr->topk_weights != NULL) {
            st = mm_moe_scratch(g, MM_SCR_F32, TK * sizeof(float), &p);
            b.gw = p;
        }
        if (st == MEGAMOE_OK) st = mm_moe_rep_backward_begin(&b.c);
    }
    /* The first exchange, before any data moves: the call order, every rank's checks and the
     * saved states' forward numbers (a peer in another call fails here, not in the launch). */
    st = mm_moe_backward_agree(x, call, st, sv);
    uint64_t t1 = mm_now_ns();
    x->phase_s[MM_PH_BWD_PREPARE] += (double)(t1 - t0) * 1e-9;
    if (st != MEGAMOE_OK) return st;

    mm_mc_launch_t l;
    memset(&l, 0, sizeof l);
    l.dir = MM_MC_BWD;
    l.route = sv->plan;
    l.local = MEGAMOE_OK;
    l.tag = sv->gen;
    l.pull = mm_moe_is_pull(&x->cfg);
    l.tag_what = "backward needs the saved state of the same forward call on every rank "
                 "(forward launch numbers differ)";
    l.body.ctx = &b;
    l.body.dispatch = mm_o1_bwd_dispatch;
    l.body.expert = mm_o1_bwd_expert;
    l.body.wgrad = mm_o1_bwd_wgrad;
    l.body.reduce = mm_o1_bwd_reduce;
    l.body.fetch = x->rep ? mm_o1_bwd_fetch : NULL;
    l.body.wsum = x->rep ? mm_o1_bwd_wsum : NULL;
    char note[MM_PROF_MAX_NOTE];
    mm_moe_rep_note(l.route, note, sizeof note);
    l.note = note[0] ? note : NULL;
    st = mm_mc_run(g->exec, &l);
    t0 = mm_now_ns();
    x->phase_s[MM_PH_BWD_LAUNCH] += (double)(t0 - t1) * 1e-9;
    if (mm_mc_broken(g->exec)) g->broken = 1;
    if (st != MEGAMOE_OK) return st;
    if (gr->topk_weights != NULL)
        st = megamoe_convert(gr->topk_weights, sv->w_dtype, b.gw, MEGAMOE_DTYPE_FP32, TK);
    x->phase_s[MM_PH_BWD_FINISH] += (double)(mm_now_ns() - t0) * 1e-9;
    if (st == MEGAMOE_OK) x->backwards++;
    return st;
}
