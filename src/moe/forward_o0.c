/* O0 forward: route -> dispatch -> GMM1 -> SwiGLU -> GMM2 -> combine -> reduce, each phase one
 * data-parallel step of the group's worker pool, with the symmetric heap between ranks.
 *
 * Failure protocol: checks that can fail on one rank only (inputs, allocation, weight packing)
 * are agreed on before any data moves. A local failure after that (a GEMM backend error) does
 * not abandon the peers: the rank keeps sending (and signalling) its rows so nobody waits
 * for a timeout, and the failure is agreed on after the combine, before the output is written.
 * A lost peer or a timeout inside a wait marks the group broken (only close() remains).
 */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/error.h"
#include "moe/experts_impl.h"
#include "moe/moe_buffers.h"
#include "moe/moe_replicas.h"
#include "moe/moe_rows.h"

enum { FW_DISPATCH, FW_PULL, FW_FETCH, FW_GMM1, FW_SWIGLU, FW_GMM2, FW_COMBINE, FW_REDUCE };

typedef struct mm_fwd {
    mm_moe_fwd_ctx_t c;        /* gu, a: scratch [R, 2I], [R, I] for inference */
    int phase;
    int64_t R;
    const int64_t *group_rows; /* [S] rows per slot (local experts, then guest slots) */
    const mm_gemm_weight_t **w1, **w2; /* [S] packed weights per slot */
    uint16_t *y;               /* [R, H] */
    float *acc;                /* [workers, H] */
} mm_fwd_t;

static megamoe_status_t mm_fwd_gemm(mm_fwd_t *f, int worker, int nw, int second)
{
    mm_gemm_grouped_args_t g;
    mm_gemm_grouped_args_init(&g);
    g.form = MM_GEMM_NN;
    g.num_groups = (int)f->c.plan->S;
    g.group_rows = f->group_rows;
    g.c_type = MEGAMOE_DTYPE_BF16;
    if (!second) { /* [R,H] · gate_up[j] [H,2I] */
        g.K = f->c.H;
        g.N = 2 * f->c.I;
        g.A = f->c.recv;
        g.lda = f->c.H;
        g.weights = f->w1;
        g.C = f->c.gu;
        g.ldc = 2 * f->c.I;
    } else { /* [R,I] · down[j] [I,H] */
        g.K = f->c.I;
        g.N = f->c.H;
        g.A = f->c.a;
        g.lda = f->c.I;
        g.weights = f->w2;
        g.C = f->y;
        g.ldc = f->c.H;
    }
    int64_t align = mm_gemm_weight_n_align(g.weights[0]);
    return mm_moe_gemm_split(&g, worker, nw, align);
}

static megamoe_status_t mm_fwd_work(void *arg, int worker, int nw)
{
    mm_fwd_t *f = arg;
    const size_t rb = (size_t)f->c.H * 2;
    int64_t b, e;
    switch (f->phase) {
    case FW_DISPATCH: /* push: into the owners' receive rows; pull: into the own staging rows */
        mm_pool_split(f->c.T * f->c.K, worker, nw, 1, &b, &e);
        if (mm_moe_is_pull(&f->c.x->cfg))
            mm_ep_stage_rows(f->c.g->xbuf, f->c.plan, f->c.hidden, rb, 1, b, e);
        else
            mm_ep_dispatch_rows(f->c.g->xbuf, f->c.plan, f->c.hidden, rb, 1, b, e);
        return MEGAMOE_OK;
    case FW_PULL: /* pull: fetch the received rows from their sources */
        mm_pool_split(f->R, worker, nw, 1, &b, &e);
        if (e > b)
            mm_ep_pull_rows(f->c.g->xbuf, f->c.plan, (uint16_t *)f->c.recv + b * f->c.H, rb, b, e);
        return MEGAMOE_OK;
    case FW_FETCH: /* guest slots: the weights from their homes (worker w: slots w, w + n) */
        for (int64_t gs = worker; gs < f->c.plan->R; gs += nw) {
            const int64_t ex = f->c.plan->slot_expert[(int64_t)f->c.x->me * f->c.plan->S +
                                                      f->c.x->L + gs];
            if (ex >= 0) MM_CHECK(mm_moe_rep_fetch(f->c.x, (int)gs, ex));
        }
        return MEGAMOE_OK;
    case FW_GMM1:
        if (f->c.xsave && f->c.xsave != f->c.recv) { /* keep the received tokens for dW1 */
            mm_pool_split(f->R, worker, nw, 1, &b, &e);
            if (e > b) memcpy(f->c.xsave + b * f->c.H, f->c.recv + b * f->c.H, (size_t)(e - b) * rb);
        }
        return mm_fwd_gemm(f, worker, nw, 0);
    case FW_SWIGLU:
        mm_pool_split(f->R, worker, nw, 1, &b, &e);
        if (e <= b) return MEGAMOE_OK;
        return mm_swiglu_fwd(e - b, f->c.I, f->c.gu + b * 2 * f->c.I, 2 * f->c.I, f->c.a + b * f->c.I, f->c.I,
                             f->c.x->cfg.limit);
    case FW_GMM2:
        return mm_fwd_gemm(f, worker, nw, 1);
    case FW_COMBINE:
        mm_pool_split(f->R, worker, nw, 1, &b, &e);
        mm_ep_combine_rows(f->c.g->xbuf, f->c.plan, f->y, rb, b, e);
        return MEGAMOE_OK;
    case FW_REDUCE:
        /* ysave keeps the expert outputs for grad topk_weights = <dOut, y> */
        mm_pool_split(f->c.T, worker, nw, 1, &b, &e);
        mm_rows_reduce_tokens(f->c.out, f->c.ret, f->c.plan->slot_pos, f->c.w, f->c.ysave,
                              f->acc + (size_t)worker * (size_t)f->c.H, f->c.H, f->c.K, b, e);
        return MEGAMOE_OK;
    default:
        return mm_error(MEGAMOE_INTERNAL, "unknown forward phase %d", f->phase);
    }
}

/* Run one phase on the pool; timer >= 0 adds its time to that phase. */
static megamoe_status_t mm_fwd_phase(mm_fwd_t *f, int phase, int timer)
{
    uint64_t t0 = mm_now_ns();
    f->phase = phase;
    megamoe_status_t st = mm_pool_run(f->c.g->pool, mm_fwd_work, f);
    if (timer >= 0) f->c.x->phase_s[timer] += (double)(mm_now_ns() - t0) * 1e-9;
    return st;
}

/* The call's row count on this rank (T_r) from the input: a fixed layer's T (num_tokens 0, the
 * ABI scheme's zero for "not set", or T), a dynamic layer's 0..T_cap. */
static megamoe_status_t mm_moe_call_tokens(const megamoe_experts_t *x,
                                           const megamoe_experts_input_t *in, int64_t *tokens_p)
{
    const int64_t n = in->num_tokens, T = x->cfg.T;
    *tokens_p = T;
    if (!x->cfg.dynamic) {
        if (n != 0 && n != T)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "num_tokens = %lld but this layer has a fixed local_num_tokens (T) = "
                            "%lld; pass T rows (num_tokens 0 or T), or create the layer with "
                            "max_local_num_tokens for per-call counts",
                            (long long)n, (long long)T);
        return MEGAMOE_OK;
    }
    if (n < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "num_tokens = %lld: the call's row count must be in 0..%lld "
                        "(max_local_num_tokens, T_cap, of this layer)",
                        (long long)n, (long long)T);
    if (n > T)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "this call passes %lld tokens but max_local_num_tokens (T_cap) is %lld; "
                        "pass at most T_cap rows per rank and call, or create the layer with a "
                        "larger max_local_num_tokens",
                        (long long)n, (long long)T);
    *tokens_p = n;
    return MEGAMOE_OK;
}

static megamoe_status_t mm_moe_check_input(const megamoe_experts_t *x,
                                           const megamoe_experts_input_t *in, const void *output,
                                           int64_t *tokens_p)
{
    if (in == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "forward needs hidden_states, topk_ids, topk_weights and output");
    MM_CHECK(mm_moe_call_tokens(x, in, tokens_p));
    if (*tokens_p > 0 && (in->hidden_states == NULL || in->topk_ids == NULL ||
                          in->topk_weights == NULL || output == NULL))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "forward needs hidden_states, topk_ids, topk_weights and output");
    if (in->topk_ids_dtype != MEGAMOE_DTYPE_INT32 && in->topk_ids_dtype != MEGAMOE_DTYPE_INT64)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "topk_ids must be int32 or int64, got %s",
                        megamoe_dtype_name(in->topk_ids_dtype));
    if (in->topk_weights_dtype != MEGAMOE_DTYPE_FP32 && in->topk_weights_dtype != MEGAMOE_DTYPE_BF16)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "topk_weights must be fp32 or bf16, got %s",
                        megamoe_dtype_name(in->topk_weights_dtype));
    return MEGAMOE_OK;
}

megamoe_status_t mm_moe_forward_begin(megamoe_experts_t *x, mm_call_t *call,
                                      megamoe_status_t local, const megamoe_experts_weights_t *wts,
                                      const megamoe_experts_input_t *in, const void *output,
                                      int prepare_phase, mm_ep_plan_t **plan_p)
{
    uint64_t t0 = mm_now_ns();
    *plan_p = NULL;
    megamoe_status_t st = local;
    int64_t tokens = 0; /* this call's rows on this rank */
    if (st == MEGAMOE_OK) st = mm_moe_check_input(x, in, output, &tokens);
    if (st == MEGAMOE_OK)
        st = mm_moe_check_finite("hidden_states", in->hidden_states, MEGAMOE_DTYPE_BF16, tokens,
                                 x->cfg.H);
    if (st == MEGAMOE_OK)
        st = mm_moe_check_finite("topk_weights", in->topk_weights, in->topk_weights_dtype,
                                 tokens, x->cfg.K);
    if (st == MEGAMOE_OK) st = mm_moe_pack_weights(x, wts, 0);
    int check = 0;
    if (st == MEGAMOE_OK) {
        megamoe_status_t cs = mm_env_bool(MM_ENV_CHECK, &check);
        if (cs != MEGAMOE_OK && cs != MEGAMOE_NOT_FOUND) st = cs;
    }
    mm_ep_plan_t *plan = NULL;
    /* push and pull cannot overflow: the route checks against the lossless bound */
    mm_ep_shape_t shape;
    memset(&shape, 0, sizeof shape);
    shape.ep = x->ep;
    shape.me = x->me;
    shape.tokens = x->cfg.T;
    shape.top_k = x->cfg.K;
    shape.experts = x->cfg.E;
    shape.capacity = x->cfg.mode == MM_MOE_FIXED ? x->cfg.capacity : mm_moe_bound_rows(&x->cfg);
    shape.capacity_factor = x->cfg.factor;
    mm_moe_rep_shape(x, &shape);
    if (st == MEGAMOE_OK) st = mm_ep_plan_create(&shape, &plan);
    uint64_t t1 = mm_now_ns();
    x->phase_s[prepare_phase] += (double)(t1 - t0) * 1e-9;
    if (plan != NULL)
        st = mm_ep_route(plan, x->team, call, st == MEGAMOE_OK ? tokens : 0,
                         st == MEGAMOE_OK ? in->topk_ids : NULL,
                         st == MEGAMOE_OK ? in->topk_ids_dtype : MEGAMOE_DTYPE_INT32,
                         st == MEGAMOE_OK ? in->tokens_per_expert : NULL,
                         st == MEGAMOE_OK ? in->tokens_per_expert_dtype : MEGAMOE_DTYPE_INT32,
                         check, st);
    else /* no plan: still take part in the exchange so peers do not wait */
        st = mm_call_exchange(call, x->team, st, NULL, 0);
    /* counted once the call's exchange passed: the same number on every rank */
    if (st == MEGAMOE_OK) x->group->forwards++;
    /* push: grow the receive buffer now if the exchanged counts say so (collective) */
    if (st == MEGAMOE_OK) st = mm_moe_group_fit(x->group, plan);
    x->phase_s[MM_PH_FWD_ROUTE] += (double)(mm_now_ns() - t1) * 1e-9;
    if (st != MEGAMOE_OK) {
        mm_ep_plan_destroy(plan);
        return st;
    }
    *plan_p = plan;
    return MEGAMOE_OK;
}

megamoe_status_t mm_moe_forward_o0(megamoe_experts_t *x, mm_call_t *call, megamoe_status_t local,
                                   const megamoe_experts_weights_t *wts,
                                   const megamoe_experts_input_t *in, void *output,
                                   megamoe_experts_saved_t **saved_p)
{
    mm_moe_group_t *g = x->group;
    const int64_t H = x->cfg.H, I = x->cfg.I, K = x->cfg.K, L = x->L;

    /* ---- local checks and packing, then the collective routing plan ---- */
    mm_ep_plan_t *plan = NULL;
    megamoe_status_t st =
        mm_moe_forward_begin(x, call, local, wts, in, output, MM_PH_FWD_ROUTE, &plan);
    if (st != MEGAMOE_OK) return st;
    const size_t TK = (size_t)(plan->T * K); /* this call's slots on this rank */
    const int64_t R = plan->recv_rows, Rb = R > 0 ? R : 1; /* one placeholder row when none */

    /* ---- buffers: saved ones sized to the rows actually received ---- */
    mm_fwd_t f;
    memset(&f, 0, sizeof f);
    mm_moe_fwd_ctx_init(&f.c, x, plan, in, output, NULL);
    f.R = R;
    megamoe_experts_saved_t *sv = NULL;
    const int64_t S = plan->S;
    /* the group lists live in the group's scratch (zeroed: unused guest entries stay NULL) */
    int64_t *group_rows = NULL;
    const mm_gemm_weight_t **wtab = NULL;
    {
        const size_t rows_bytes = mm_align_up((size_t)S * sizeof *group_rows, 64);
        void *lists = NULL;
        st = mm_moe_scratch(g, MM_SCR_LISTS, rows_bytes + (size_t)(2 * S) * sizeof *wtab, &lists);
        if (st == MEGAMOE_OK) {
            memset(lists, 0, rows_bytes + (size_t)(2 * S) * sizeof *wtab);
            group_rows = lists;
            wtab = (const mm_gemm_weight_t **)(void *)((char *)lists + rows_bytes);
        }
    }
    if (st == MEGAMOE_OK)
        for (int64_t j = 0; j < S; j++) group_rows[j] = plan->group_off[j + 1] - plan->group_off[j];
    f.group_rows = group_rows;
    f.w1 = wtab;
    f.w2 = wtab ? wtab + S : NULL;
    for (int64_t j = 0; wtab && j < L; j++) {
        wtab[j] = x->packed.w1[j];
        wtab[S + j] = x->packed.w2[j];
    }
    if (st == MEGAMOE_OK && saved_p != NULL) {
        st = mm_moe_saved_create(x, plan, in->topk_weights_dtype, &sv);
        if (st == MEGAMOE_OK) mm_moe_fwd_ctx_init(&f.c, x, plan, in, output, sv);
    } else if (st == MEGAMOE_OK) {
        void *p = NULL;
        st = mm_moe_scratch(g, MM_SCR_GU, (size_t)Rb * (size_t)(2 * I) * 2, &p);
        f.c.gu = p;
        if (st == MEGAMOE_OK) st = mm_moe_scratch(g, MM_SCR_A, (size_t)Rb * (size_t)I * 2, &p);
        f.c.a = p;
        if (st == MEGAMOE_OK && in->topk_weights_dtype == MEGAMOE_DTYPE_FP32) f.c.w = in->topk_weights;
        else if (st == MEGAMOE_OK) {
            st = mm_moe_scratch(g, MM_SCR_F32, TK * sizeof(float), &p);
            f.c.w = p;
        }
    }
    void *p = NULL;
    if (st == MEGAMOE_OK && mm_moe_is_pull(&x->cfg)) {
        /* pull: the rows are fetched into ordinary memory, the saved copy when training */
        if (sv != NULL) f.c.recv = sv->x;
        else if ((st = mm_moe_scratch(g, MM_SCR_RECV, (size_t)Rb * (size_t)H * 2, &p)) ==
                 MEGAMOE_OK)
            f.c.recv = p;
    }
    if (st == MEGAMOE_OK) st = mm_moe_scratch(g, MM_SCR_Y, (size_t)Rb * (size_t)H * 2, &p);
    f.y = p;
    if (st == MEGAMOE_OK)
        st = mm_moe_scratch(g, MM_SCR_ACC, (size_t)mm_pool_size(g->pool) * (size_t)H * 4, &p);
    f.acc = p;
    if (st == MEGAMOE_OK && f.c.w != in->topk_weights) /* fp32 router weights in slot order */
        st = megamoe_convert((float *)f.c.w, MEGAMOE_DTYPE_FP32, in->topk_weights,
                             in->topk_weights_dtype, TK);
    /* Nothing has moved yet: a failure anywhere stops every rank here. */
    st = mm_shmem_team_agree(x->team, st);
    if (st != MEGAMOE_OK) {
        if (sv) sv->plan = NULL;
        megamoe_experts_saved_destroy(sv);
        mm_ep_plan_destroy(plan);
        return st;
    }
    /* replicas: publish what guests will fetch; its completion travels with the dispatch
     * signals (they follow it) */
    mm_moe_rep_publish(x, wts, plan, NULL);

    /* ---- dispatch: token rows straight into their final receive rows ---- */
    megamoe_status_t later = MEGAMOE_OK; /* a failure that must not strand the peers */
    uint64_t tw = mm_now_ns();
    mm_ep_begin(g->xbuf, MM_EP_DISPATCH);
    st = mm_fwd_phase(&f, FW_DISPATCH, -1);
    mm_ep_done(g->xbuf, MM_EP_DISPATCH);
    if (st == MEGAMOE_OK) st = mm_ep_wait(g->xbuf, MM_EP_DISPATCH);
    if (st == MEGAMOE_OK && mm_moe_is_pull(&x->cfg)) st = mm_fwd_phase(&f, FW_PULL, -1);
    x->phase_s[MM_PH_FWD_DISPATCH] += (double)(mm_now_ns() - tw) * 1e-9;
    if (st != MEGAMOE_OK) goto broken;

    /* ---- guest slots' weights (the homes published them before their dispatch signals) ---- */
    if (plan->R > 0) {
        later = mm_fwd_phase(&f, FW_FETCH, MM_PH_FWD_DISPATCH);
        for (int64_t gs = 0; later == MEGAMOE_OK && gs < plan->R; gs++) {
            mm_moe_guest_w_t *gw = x->rep->cur[gs];
            wtab[L + gs] = gw ? gw->nn1 : x->packed.w1[0]; /* an unused slot has no rows */
            wtab[S + L + gs] = gw ? gw->nn2 : x->packed.w2[0];
        }
    }

    /* ---- expert compute on the received rows ---- */
    if (later == MEGAMOE_OK) later = mm_fwd_phase(&f, FW_GMM1, MM_PH_FWD_GMM1);
    if (later == MEGAMOE_OK) later = mm_fwd_phase(&f, FW_SWIGLU, MM_PH_FWD_SWIGLU);
    if (later == MEGAMOE_OK) later = mm_fwd_phase(&f, FW_GMM2, MM_PH_FWD_GMM2);

    /* ---- combine: results back to each token's rank ---- */
    tw = mm_now_ns();
    mm_ep_begin(g->xbuf, MM_EP_COMBINE);
    st = mm_fwd_phase(&f, FW_COMBINE, -1);
    mm_ep_done(g->xbuf, MM_EP_COMBINE);
    if (st != MEGAMOE_OK) {
        g->broken = 1;
        goto fail;
    }
    st = mm_ep_wait(g->xbuf, MM_EP_COMBINE);
    if (later == MEGAMOE_OK) later = mm_ep_failure(g->xbuf); /* a transfer: every rank fails */
    if (st != MEGAMOE_OK) g->broken = 1;
    else st = mm_shmem_team_agree(x->team, later);
    x->phase_s[MM_PH_FWD_COMBINE] += (double)(mm_now_ns() - tw) * 1e-9;
    if (st != MEGAMOE_OK) goto fail;

    /* ---- reduce the K copies of each token with its router weights ---- */
    st = mm_fwd_phase(&f, FW_REDUCE, MM_PH_FWD_REDUCE);
    if (st != MEGAMOE_OK) goto fail;

    mm_moe_rep_forward_done(x, plan, sv, 1);
    x->last_recv_rows = R;
    x->last_tokens = plan->T;
    x->forwards++;
    g->fwd_gen++; /* every rank got here (the combine was agreed): the same number everywhere */
    if (saved_p) {
        sv->gen = g->fwd_gen;
        *saved_p = sv;
    } else {
        mm_ep_plan_destroy(plan);
    }
    return MEGAMOE_OK;

broken:
    g->broken = 1;
fail:
    mm_moe_rep_forward_done(x, plan, NULL, 0);
    if (sv) sv->plan = NULL;
    megamoe_experts_saved_destroy(sv);
    mm_ep_plan_destroy(plan);
    return st;
}
