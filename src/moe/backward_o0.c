/* O0 backward (the graph of docs/moe.md "Semantics"), each phase one step of the group's worker pool:
 *   source:  dY[t,k] = w[t,k] · dOut[t] (bf16 rows, permuted order) and
 *            grad w[t,k] = <dOut[t], y[t,k]>           (fp32, y saved by the forward)
 *   dispatch dY rows to the expert owners (the forward's plan, receive order)
 *   owner:   dA  = dY · W2ᵀ          dW2 = Aᵀ · dY       (A saved)
 *            dGU = SwiGLU'(dA, GU)                       (GU saved)
 *            dX  = dGU · W1ᵀ         dW1 = Xᵀ · dGU      (X saved)
 *   combine dX rows back to the token's rank;  grad hidden[t] = sum_k dX[t,k] (fp32).
 * The owner finishes every read of the received dY before it sends its combine rows, which is
 * what lets a peer reuse that buffer for its next exchange (ep_exchange.h).
 * Failure protocol as in forward_o0.c. A failure after data started to move (lost peer,
 * timeout, a GEMM error on some rank) may leave the weight-gradient outputs partly written.
 */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "moe/experts_impl.h"
#include "moe/moe_replicas.h"
#include "moe/moe_rows.h"

enum { BW_PREP, BW_DISPATCH, BW_PULL, BW_GMM_DA, BW_GMM_DW2, BW_SWIGLU, BW_GMM_DX, BW_GMM_DW1, BW_COMBINE,
       BW_REDUCE, BW_PACK, BW_WSUM };

typedef struct mm_bwd {
    mm_moe_bwd_ctx_t c;
    int phase;
    int64_t R;
    const int64_t *group_rows; /* [S] */
    const mm_gemm_weight_t **w2t, **w1t; /* [S] packed weights per slot */
    uint16_t *dy;  /* [T*K, H] permuted order (to send) */
    float *gw;     /* [T*K] grad router weights (fp32), slot order, or NULL */
    uint16_t *da;  /* [R, I] */
    uint16_t *dgu; /* [R, 2I] */
    uint16_t *dx;  /* [R, H] */
    float *acc;
    int direct; /* dY written in place into the owners' receive buffers */
    int pull;   /* dY staged in this rank's own buffer, fetched by the owners (BW_PULL) */
    int32_t *guests; /* [workers][ep * R] scratch (BW_WSUM guest lists) */
} mm_bwd_t;

/* Replicas: one TN product per slot into where its gradient goes (the output, a home expert's
 * fp32 partial, or a guest slot's fp32 partial), split by columns like the grouped call. */
static megamoe_status_t mm_bwd_wgrad_slots(mm_bwd_t *b, int which, int worker, int nw)
{
    for (int64_t j = 0; j < b->c.plan->S; j++) {
        if (b->c.plan->slot_expert[(int64_t)b->c.x->me * b->c.plan->S + j] < 0) continue;
        mm_gemm_args_t g;
        mm_gemm_args_init(&g);
        g.K = b->group_rows[j]; /* no rows: exact zeros */
        mm_moe_rep_wgrad_args(&b->c, b->dgu, j, which, &g);
        mm_pool_split(g.N, worker, nw, 1, &g.n0, &g.n1);
        if (g.n0 >= g.n1) continue;
        MM_CHECK(mm_gemm(&g));
    }
    return MEGAMOE_OK;
}

static megamoe_status_t mm_bwd_gemm(mm_bwd_t *b, int worker, int nw)
{
    const int64_t H = b->c.H, I = b->c.I;
    mm_gemm_grouped_args_t g;
    mm_gemm_grouped_args_init(&g);
    g.num_groups = (int)b->c.plan->S;
    g.group_rows = b->group_rows;
    int64_t align = 1;
    switch (b->phase) {
    case BW_GMM_DA: /* dA[R,I] = dY[R,H] · down[j]ᵀ */
        g.form = MM_GEMM_NT;
        g.K = H;
        g.N = I;
        g.A = b->c.recv;
        g.lda = H;
        g.weights = b->w2t;
        g.C = b->da;
        g.ldc = I;
        g.c_type = MEGAMOE_DTYPE_BF16;
        align = mm_gemm_weight_n_align(g.weights[0]);
        break;
    case BW_GMM_DW2: /* dW2_j[I,H] = A_jᵀ · dY_j */
        if (b->c.plan->R > 0) return mm_bwd_wgrad_slots(b, 2, worker, nw);
        g.form = MM_GEMM_TN;
        g.M = I;
        g.N = H;
        g.A = b->c.sv->a;
        g.lda = I;
        g.B = b->c.recv;
        g.ldb = H;
        g.C = b->c.dw2;
        g.ldc = H;
        g.c_group_stride = I * H;
        g.c_type = b->c.wg_type;
        g.backend = b->c.g->gemm_plain;
        break;
    case BW_GMM_DX: /* dX[R,H] = dGU[R,2I] · gate_up[j]ᵀ */
        g.form = MM_GEMM_NT;
        g.K = 2 * I;
        g.N = H;
        g.A = b->dgu;
        g.lda = 2 * I;
        g.weights = b->w1t;
        g.C = b->dx;
        g.ldc = H;
        g.c_type = MEGAMOE_DTYPE_BF16;
        align = mm_gemm_weight_n_align(g.weights[0]);
        break;
    case BW_GMM_DW1: /* dW1_j[H,2I] = X_jᵀ · dGU_j */
        if (b->c.plan->R > 0) return mm_bwd_wgrad_slots(b, 1, worker, nw);
        g.form = MM_GEMM_TN;
        g.M = H;
        g.N = 2 * I;
        g.A = b->c.sv->x;
        g.lda = H;
        g.B = b->dgu;
        g.ldb = 2 * I;
        g.C = b->c.dw1;
        g.ldc = 2 * I;
        g.c_group_stride = H * 2 * I;
        g.c_type = b->c.wg_type;
        g.backend = b->c.g->gemm_plain;
        break;
    default:
        return mm_error(MEGAMOE_INTERNAL, "phase %d is not a GEMM", b->phase);
    }
    return mm_moe_gemm_split(&g, worker, nw, align);
}

static megamoe_status_t mm_bwd_work(void *arg, int worker, int nw)
{
    mm_bwd_t *b = arg;
    const int64_t H = b->c.H, K = b->c.K;
    const size_t rb = (size_t)H * 2;
    int64_t lo, hi;
    switch (b->phase) {
    case BW_PREP: {
        /* dY rows go straight into their owners' receive rows when those are mapped here
         * (same host), else into the staging buffer that BW_DISPATCH then puts */
        mm_pool_split(b->c.T * K, worker, nw, 1, &lo, &hi);
        for (int64_t p = lo; p < hi; p++) {
            int64_t slot = b->c.plan->perm_slot[p];
            const uint16_t *d = b->c.dout + (slot / K) * H;
            uint16_t *dst = b->pull     ? mm_ep_stage_dst(b->c.g->xbuf, p)
                            : b->direct ? mm_ep_dispatch_dst(b->c.g->xbuf, b->c.plan, p)
                                        : b->dy + p * H;
            mm_rows_scale(dst, d, b->c.sv->w[slot], (size_t)H);
            if (b->gw) b->gw[slot] = mm_rows_dot(d, b->c.sv->y + p * H, (size_t)H);
        }
        return MEGAMOE_OK;
    }
    case BW_DISPATCH:
        mm_pool_split(b->c.T * K, worker, nw, 1, &lo, &hi);
        mm_ep_dispatch_rows(b->c.g->xbuf, b->c.plan, b->dy, rb, 0, lo, hi);
        return MEGAMOE_OK;
    case BW_PULL:
        mm_pool_split(b->R, worker, nw, 1, &lo, &hi);
        if (hi > lo)
            mm_ep_pull_rows(b->c.g->xbuf, b->c.plan, (uint16_t *)b->c.recv + lo * H, rb, lo, hi);
        return MEGAMOE_OK;
    case BW_GMM_DA:
    case BW_GMM_DW2:
    case BW_GMM_DX:
    case BW_GMM_DW1:
        return mm_bwd_gemm(b, worker, nw);
    case BW_SWIGLU:
        mm_pool_split(b->R, worker, nw, 1, &lo, &hi);
        if (hi <= lo) return MEGAMOE_OK;
        return mm_swiglu_bwd(hi - lo, b->c.I, b->c.sv->gu + lo * 2 * b->c.I, 2 * b->c.I,
                             b->da + lo * b->c.I, b->c.I, b->dgu + lo * 2 * b->c.I, 2 * b->c.I,
                             b->c.x->cfg.limit);
    case BW_COMBINE:
        mm_pool_split(b->R, worker, nw, 1, &lo, &hi);
        mm_ep_combine_rows(b->c.g->xbuf, b->c.plan, b->dx, rb, lo, hi);
        return MEGAMOE_OK;
    case BW_PACK: /* guest slots: pack the forward's weight copies for dA and dX */
        for (int64_t gs = worker; gs < b->c.plan->R; gs += nw)
            if (b->c.guest[gs]) MM_CHECK(mm_moe_rep_pack_backward(b->c.guest[gs]));
        return MEGAMOE_OK;
    case BW_WSUM: { /* local experts with guests: own partial + theirs (chunk = worker) */
        int32_t *q = b->guests + (size_t)worker * (size_t)(b->c.x->ep * b->c.plan->R);
        for (int64_t j = 0; j < b->c.x->L; j++) {
            int n = mm_ep_guests_of_local(b->c.plan, j, q);
            if (n > 0) MM_CHECK(mm_moe_rep_wsum(&b->c, j, worker, nw, q, n));
        }
        return MEGAMOE_OK;
    }
    case BW_REDUCE: {
        mm_pool_split(b->c.T, worker, nw, 1, &lo, &hi);
        mm_rows_reduce_tokens(b->c.dhidden, b->c.ret, b->c.plan->slot_pos, NULL, NULL,
                              b->acc + (size_t)worker * (size_t)H, H, K, lo, hi);
        return MEGAMOE_OK;
    }
    default:
        return mm_error(MEGAMOE_INTERNAL, "unknown backward phase %d", b->phase);
    }
}

static megamoe_status_t mm_bwd_phase(mm_bwd_t *b, int phase, int timer)
{
    uint64_t t0 = mm_now_ns();
    b->phase = phase;
    megamoe_status_t st = mm_pool_run(b->c.g->pool, mm_bwd_work, b);
    if (timer >= 0) b->c.x->phase_s[timer] += (double)(mm_now_ns() - t0) * 1e-9;
    return st;
}

megamoe_status_t mm_moe_check_backward(const megamoe_experts_t *x,
                                       const megamoe_experts_saved_t *sv, const void *dout,
                                       const megamoe_experts_grads_t *gr)
{
    if (sv == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "backward needs the saved state of a forward");
    if (sv->layer_serial != x->serial)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "the saved state belongs to another MegaMoeExperts layer");
    const int64_t T = sv->plan ? sv->plan->T : 0; /* the forward's rows (none: NULL allowed) */
    if (gr == NULL || gr->gate_up == NULL || gr->down == NULL ||
        (T > 0 && (dout == NULL || gr->hidden_states == NULL)))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "backward needs grad_output and the grads of hidden_states, gate_up and "
                        "down");
    if (gr->weight_grad_dtype != MEGAMOE_DTYPE_BF16 && gr->weight_grad_dtype != MEGAMOE_DTYPE_FP32)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "weight_grad_dtype must be bf16 or fp32, got %s",
                        megamoe_dtype_name(gr->weight_grad_dtype));
    return mm_moe_check_finite("grad_output", dout, MEGAMOE_DTYPE_BF16, T, x->cfg.H);
}

megamoe_status_t mm_moe_backward_agree(megamoe_experts_t *x, mm_call_t *call,
                                       megamoe_status_t local,
                                       const megamoe_experts_saved_t *sv)
{
    /* Every rank must pass the saved state of the same forward: their routing plans (row
     * counts and offsets) differ otherwise, and the exchange would mix rows of different
     * calls into wrong gradients. Decided from the gathered numbers: identical everywhere. */
    call->aux = local == MEGAMOE_OK ? sv->gen : 0;
    MM_CHECK(mm_call_exchange(call, x->team, local, NULL, 0));
    return mm_call_aux_agree(call, MEGAMOE_INVALID_ARGUMENT,
                             "backward needs the saved state of the same forward call on every "
                             "rank (forward numbers differ)");
}

megamoe_status_t mm_moe_backward_o0(megamoe_experts_t *x, mm_call_t *call, megamoe_status_t local,
                                    megamoe_experts_saved_t *sv,
                                    const megamoe_experts_weights_t *wts, const void *dout,
                                    const megamoe_experts_grads_t *gr)
{
    mm_moe_group_t *g = x->group;
    const int64_t H = x->cfg.H, I = x->cfg.I, K = x->cfg.K, L = x->L;
    size_t TK = 0; /* the forward's slots on this rank (known once the saved state is checked) */
    megamoe_status_t st = local;
    if (st == MEGAMOE_OK) st = mm_moe_check_backward(x, sv, dout, gr);
    if (st == MEGAMOE_OK && !g->ready)
        st = mm_error(MEGAMOE_INVALID_STATE, "backward before any forward of this layer");
    if (st == MEGAMOE_OK) st = mm_moe_pack_weights(x, wts, 1);
    mm_bwd_t b;
    memset(&b, 0, sizeof b);
    int64_t *group_rows = NULL;
    const mm_gemm_weight_t **wtab = NULL;
    if (st == MEGAMOE_OK) {
        const int64_t R = sv->rows, Rb = R > 0 ? R : 1, S = sv->plan->S;
        TK = (size_t)(sv->plan->T * K);
        mm_moe_bwd_ctx_init(&b.c, x, sv, dout, gr);
        b.R = R;
        /* the group lists live in the group's scratch (zeroed, as the guest lists need) */
        const size_t rows_bytes = mm_align_up((size_t)S * sizeof *group_rows, 64);
        const size_t wtab_bytes = mm_align_up((size_t)(2 * S) * sizeof *wtab, 64);
        const size_t guest_bytes = sv->plan->R > 0 ? (size_t)mm_pool_size(g->pool) *
                                                         (size_t)(x->ep * sv->plan->R) *
                                                         sizeof *b.guests
                                                   : 0;
        void *lists = NULL;
        st = mm_moe_scratch(g, MM_SCR_LISTS, rows_bytes + wtab_bytes + guest_bytes, &lists);
        if (st == MEGAMOE_OK) {
            memset(lists, 0, rows_bytes + wtab_bytes + guest_bytes);
            group_rows = lists;
            wtab = (const mm_gemm_weight_t **)(void *)((char *)lists + rows_bytes);
            if (guest_bytes > 0) b.guests = (void *)((char *)lists + rows_bytes + wtab_bytes);
        }
        if (st == MEGAMOE_OK)
            for (int64_t j = 0; j < S; j++)
                group_rows[j] = sv->plan->group_off[j + 1] - sv->plan->group_off[j];
        b.group_rows = group_rows;
        b.w2t = wtab;
        b.w1t = wtab ? wtab + S : NULL;
        for (int64_t j = 0; wtab && j < S; j++) { /* guest slots: after BW_PACK */
            wtab[j] = x->packed.w2t[j < L ? j : 0];
            wtab[S + j] = x->packed.w1t[j < L ? j : 0];
        }
        if (st == MEGAMOE_OK) st = mm_moe_rep_backward_begin(&b.c);
        void *p = NULL;
        b.pull = mm_moe_is_pull(&x->cfg);
        b.direct = !b.pull && mm_ep_dispatch_direct(g->xbuf);
        if (st == MEGAMOE_OK && b.pull) {
            st = mm_moe_scratch(g, MM_SCR_RECV, (size_t)Rb * (size_t)H * 2, &p);
            b.c.recv = p;
        }
        if (st == MEGAMOE_OK && !b.direct && !b.pull)
            st = mm_moe_scratch(g, MM_SCR_DY, TK * (size_t)H * 2, &p);
        b.dy = b.direct || b.pull ? NULL : p;
        if (st == MEGAMOE_OK) st = mm_moe_scratch(g, MM_SCR_DA, (size_t)Rb * (size_t)I * 2, &p);
        b.da = p;
        if (st == MEGAMOE_OK) st = mm_moe_scratch(g, MM_SCR_DGU, (size_t)Rb * (size_t)(2 * I) * 2, &p);
        b.dgu = p;
        if (st == MEGAMOE_OK) st = mm_moe_scratch(g, MM_SCR_Y, (size_t)Rb * (size_t)H * 2, &p);
        b.dx = p;
        if (st == MEGAMOE_OK)
            st = mm_moe_scratch(g, MM_SCR_ACC, (size_t)mm_pool_size(g->pool) * (size_t)H * 4, &p);
        b.acc = p;
        if (st == MEGAMOE_OK && gr->topk_weights != NULL) {
            st = mm_moe_scratch(g, MM_SCR_F32, TK * sizeof(float), &p);
            b.gw = p;
        }
    }
    /* Nothing has moved yet: the call order, a failure anywhere and the saved states' forward
     * numbers are decided in this one exchange, on every rank alike. */
    st = mm_moe_backward_agree(x, call, st, sv);
    if (st != MEGAMOE_OK) {
        return st;
    }
    megamoe_status_t later = MEGAMOE_OK; /* a failure that must not strand the peers */

    /* ---- source: weighted grad rows and router-weight grads; dispatch to the owners ---- */
    mm_ep_begin(g->xbuf, MM_EP_DISPATCH);
    st = mm_bwd_phase(&b, BW_PREP, MM_PH_BWD_PREP);
    if (st != MEGAMOE_OK) later = st;
    uint64_t tw = mm_now_ns();
    st = b.direct || b.pull ? MEGAMOE_OK : mm_bwd_phase(&b, BW_DISPATCH, -1);
    mm_ep_done(g->xbuf, MM_EP_DISPATCH);
    if (st == MEGAMOE_OK) st = mm_ep_wait(g->xbuf, MM_EP_DISPATCH);
    if (st == MEGAMOE_OK && b.pull) st = mm_bwd_phase(&b, BW_PULL, -1);
    x->phase_s[MM_PH_BWD_DISPATCH] += (double)(mm_now_ns() - tw) * 1e-9;
    if (st != MEGAMOE_OK) goto broken;

    /* ---- guest slots: the forward's weight copies packed for dA and dX ---- */
    if (local == MEGAMOE_OK && sv->plan->R > 0) {
        local = mm_bwd_phase(&b, BW_PACK, MM_PH_BWD_GMM_DA);
        for (int64_t gs = 0; local == MEGAMOE_OK && gs < sv->plan->R; gs++)
            if (b.c.guest[gs]) {
                wtab[L + gs] = b.c.guest[gs]->nt2;
                wtab[sv->plan->S + L + gs] = b.c.guest[gs]->nt1;
            }
    }

    /* ---- owner: data grads and weight grads ---- */
    if (later == MEGAMOE_OK) later = mm_bwd_phase(&b, BW_GMM_DA, MM_PH_BWD_GMM_DA);
    if (later == MEGAMOE_OK) later = mm_bwd_phase(&b, BW_GMM_DW2, MM_PH_BWD_GMM_DW2);
    if (later == MEGAMOE_OK) later = mm_bwd_phase(&b, BW_SWIGLU, MM_PH_BWD_SWIGLU);
    if (later == MEGAMOE_OK) later = mm_bwd_phase(&b, BW_GMM_DX, MM_PH_BWD_GMM_DX);
    if (later == MEGAMOE_OK) later = mm_bwd_phase(&b, BW_GMM_DW1, MM_PH_BWD_GMM_DW1);

    /* ---- combine dX back to the tokens' ranks ---- */
    tw = mm_now_ns();
    mm_ep_begin(g->xbuf, MM_EP_COMBINE);
    st = mm_bwd_phase(&b, BW_COMBINE, -1);
    mm_ep_done(g->xbuf, MM_EP_COMBINE);
    if (st == MEGAMOE_OK) st = mm_ep_wait(g->xbuf, MM_EP_COMBINE);
    if (st != MEGAMOE_OK) goto broken;
    if (later == MEGAMOE_OK) later = mm_ep_failure(g->xbuf); /* a transfer: every rank fails */
    st = mm_shmem_team_agree(x->team, later);
    x->phase_s[MM_PH_BWD_COMBINE] += (double)(mm_now_ns() - tw) * 1e-9;
    if (st != MEGAMOE_OK) goto fail;

    /* ---- replicas: every guest finished its partial before its combine signals ---- */
    if (sv->plan->R > 0) { /* its gets may fail: agreed, so every rank returns it */
        st = mm_shmem_team_agree(x->team, mm_bwd_phase(&b, BW_WSUM, MM_PH_BWD_GMM_DW1));
        if (st != MEGAMOE_OK) goto fail;
    }

    st = mm_bwd_phase(&b, BW_REDUCE, MM_PH_BWD_REDUCE);
    if (st == MEGAMOE_OK && gr->topk_weights != NULL)
        st = megamoe_convert(gr->topk_weights, sv->w_dtype, b.gw, MEGAMOE_DTYPE_FP32, TK);
    if (st != MEGAMOE_OK) goto fail;
    x->backwards++;
    return MEGAMOE_OK;

broken:
    g->broken = 1;
fail:
    return st;
}
