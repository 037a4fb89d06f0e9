/* O1 forward: route (collective count exchange), then one launch of the multicore executor
 * (src/multicore/mc_exec.h) whose task bodies are here:
 *   dispatch  token rows of one tile straight into their owner's receive rows (RATR order)
 *   expert    one received tile: keep X, GMM1, SwiGLU, GMM2 while the tile is in cache; GMM2
 *             writes the result rows straight into the source's return buffer
 *   reduce    the source sums the K returned rows of 128 tokens with the router weights
 * Same kernels, row sets and reduction orders as O0 (forward_o0.c), so the outputs are
 * bit-identical (docs/multicore.md "Determinism").
 *
 * Failures: checks and packing fail before the route (agreed there); an allocation failure
 * after it makes this rank take part in the launch without touching data, and every rank
 * returns it; the output is written only when every rank succeeded.
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

static size_t mm_o1_layout(const mm_moe_config_t *c, size_t off[5])
{
    const size_t tile = MM_MC_TILE;
    size_t sizes[5] = {tile * (size_t)(2 * c->I) * 2, tile * (size_t)c->I * 2,
                       tile * (size_t)c->H * 2, (size_t)c->H * 4,
                       mm_moe_is_pull(c) ? tile * (size_t)c->H * 2 : 0};
    size_t total = 0;
    for (int i = 0; i < 5; i++) {
        off[i] = total;
        total += mm_align_up(sizes[i], 64);
    }
    return total;
}

size_t mm_moe_o1_scratch_bytes(const mm_moe_config_t *c)
{
    size_t off[5];
    return mm_o1_layout(c, off);
}

mm_o1_scratch_t mm_moe_o1_scratch(const mm_moe_config_t *c, const mm_mc_worker_t *w)
{
    size_t off[5];
    mm_o1_layout(c, off);
    char *b = w->scratch;
    mm_o1_scratch_t s = {(uint16_t *)(void *)(b + off[0]), (uint16_t *)(void *)(b + off[1]),
                         (uint16_t *)(void *)(b + off[2]), (float *)(void *)(b + off[3]),
                         mm_moe_is_pull(c) ? (uint16_t *)(void *)(b + off[4]) : NULL};
    return s;
}

typedef struct mm_o1_fwd {
    mm_moe_fwd_ctx_t c; /* gu, a NULL for inference: they stay in the workers' tiles */
} mm_o1_fwd_t;


static megamoe_status_t mm_o1_fwd_dispatch(void *ctx, mm_mc_worker_t *w, const mm_mc_tile_t *t)
{
    (void)w;
    mm_o1_fwd_t *f = ctx;
    /* push: into the owner's receive rows; pull: into this rank's staging rows, which the
     * owner's EXPERT task fetches once the arrival signal is there */
    if (mm_moe_is_pull(&f->c.x->cfg))
        mm_ep_stage_rows(f->c.g->xbuf, f->c.plan, f->c.hidden, (size_t)f->c.H * 2, 1, t->row0,
                         t->row0 + t->rows);
    else /* a failed put fails the launch on every rank (the executor's DONE status) */
        return mm_ep_dispatch_rows(f->c.g->xbuf, f->c.plan, f->c.hidden, (size_t)f->c.H * 2, 1,
                                   t->row0, t->row0 + t->rows);
    return MEGAMOE_OK;
}

/* C of a product whose rows go to rows [row, row + n) of the source's return buffer: the
 * peer's mapping when it is load/store reachable, else the worker's tile (then put). */
void *mm_moe_o1_ret_dst(const mm_moe_group_t *g, int src, int64_t row, uint16_t *tile)
{
    void *d = mm_ep_force_puts ? NULL
                               : mm_shmem_ptr((char *)g->xbuf->ret + (size_t)row * g->xbuf->row_bytes,
                                              g->xbuf->pes[src]);
    return d ? d : tile;
}

megamoe_status_t mm_moe_o1_ret_put(const mm_moe_group_t *g, int src, int64_t row,
                                   const void *dst, const uint16_t *tile, int64_t n)
{
    if (dst != tile) return MEGAMOE_OK;
    return mm_shmem_put((char *)g->xbuf->ret + (size_t)row * g->xbuf->row_bytes, tile,
                        (size_t)n * g->xbuf->row_bytes, g->xbuf->pes[src]);
}

megamoe_status_t mm_moe_o1_tile_gemm(mm_gemm_form_t form, const mm_gemm_weight_t *weight,
                                     int64_t M, int64_t K, int64_t N, const uint16_t *A, void *C)
{
    mm_gemm_args_t g;
    mm_gemm_args_init(&g);
    g.form = form;
    g.M = M;
    g.K = K;
    g.N = N;
    g.A = A;
    g.lda = K;
    g.weight = weight;
    g.C = C;
    g.ldc = N;
    g.c_type = MEGAMOE_DTYPE_BF16;
    return mm_gemm(&g);
}

void mm_moe_o1_stamp(mm_mc_worker_t *w, int stage, int64_t e, int peer, uint64_t *t0)
{
    if (!w->ring) return;
    uint64_t t1 = mm_now_ns();
    mm_mc_trace(w, stage, e, peer, *t0, t1);
    *t0 = t1;
}

static megamoe_status_t mm_o1_fwd_expert(void *ctx, mm_mc_worker_t *w, const mm_mc_tile_t *t)
{
    mm_o1_fwd_t *f = ctx;
    const int64_t H = f->c.H, I = f->c.I, r0 = t->row0, n = t->rows;
    const int64_t e = t->e;
    mm_o1_scratch_t s = mm_moe_o1_scratch(&f->c.x->cfg, w);
    uint64_t t0 = w->ring ? mm_now_ns() : 0;
    const uint16_t *xin;
    if (mm_moe_is_pull(&f->c.x->cfg)) { /* fetch the tile: into the saved rows or a tile */
        uint16_t *dst = f->c.xsave ? f->c.xsave + r0 * H : s.x;
        MM_CHECK(mm_ep_pull_rows(f->c.g->xbuf, f->c.plan, dst, (size_t)H * 2, r0, r0 + n));
        xin = dst;
    } else {
        xin = f->c.recv + r0 * H;
        if (f->c.xsave) { /* kept for dW1 = Xᵀ·dGU; GMM1 then reads the copy, hot in cache */
            memcpy(f->c.xsave + r0 * H, xin, (size_t)(n * H) * 2);
            xin = f->c.xsave + r0 * H;
        }
    }
    uint16_t *gu = f->c.gu ? f->c.gu + r0 * 2 * I : s.gu;
    uint16_t *a = f->c.a ? f->c.a + r0 * I : s.a;
    MM_CHECK(mm_moe_o1_tile_gemm(MM_GEMM_NN, mm_moe_slot_w1(f->c.x, f->c.guest, t->j), n, H,
                                 2 * I, xin, gu));
    mm_moe_o1_stamp(w, MM_MC_ST_GMM1, e, t->peer, &t0);
    MM_CHECK(mm_swiglu_fwd(n, I, gu, 2 * I, a, I, f->c.x->cfg.limit));
    mm_moe_o1_stamp(w, MM_MC_ST_SWIGLU, e, t->peer, &t0);
    /* GMM2 straight into the source's return rows: the combine needs no copy */
    void *dst = mm_moe_o1_ret_dst(f->c.g, t->peer, t->ret_row, s.rows);
    MM_CHECK(mm_moe_o1_tile_gemm(MM_GEMM_NN, mm_moe_slot_w2(f->c.x, f->c.guest, t->j), n, I, H, a,
                                 dst));
    MM_CHECK(mm_moe_o1_ret_put(f->c.g, t->peer, t->ret_row, dst, s.rows, n));
    mm_moe_o1_stamp(w, MM_MC_ST_GMM2, e, t->peer, &t0);
    return MEGAMOE_OK;
}

/* Guest slot g: its home published the weights (the executor waited for the ready line). */
static megamoe_status_t mm_o1_fwd_fetch(void *ctx, mm_mc_worker_t *w, int g, int64_t e)
{
    (void)w;
    mm_o1_fwd_t *f = ctx;
    return mm_moe_rep_fetch(f->c.x, g, e);
}

static megamoe_status_t mm_o1_fwd_reduce(void *ctx, mm_mc_worker_t *w, int64_t t0, int64_t t1)
{
    mm_o1_fwd_t *f = ctx;
    mm_rows_reduce_tokens(f->c.out, f->c.ret, f->c.plan->slot_pos, f->c.w, f->c.ysave,
                          mm_moe_o1_scratch(&f->c.x->cfg, w).acc, f->c.H, f->c.K, t0, t1);
    return MEGAMOE_OK;
}

megamoe_status_t mm_moe_forward_o1(megamoe_experts_t *x, mm_call_t *call, megamoe_status_t local,
                                   const megamoe_experts_weights_t *wts,
                                   const megamoe_experts_input_t *in, void *output,
                                   megamoe_experts_saved_t **saved_p)
{
    mm_moe_group_t *g = x->group;

    /* ---- local checks and packing, agreed in the collective routing plan ---- */
    mm_ep_plan_t *plan = NULL;
    megamoe_status_t st =
        mm_moe_forward_begin(x, call, local, wts, in, output, MM_PH_FWD_PREPARE, &plan);
    if (st != MEGAMOE_OK) return st;
    const size_t TK = (size_t)(plan->T * x->cfg.K); /* this call's slots on this rank */
    const int64_t R = plan->recv_rows;
    uint64_t t0 = mm_now_ns();
    /* replicas: publish the weights of local experts with guests and tell the guests first
     * (their FETCH waits for it; a local failure below does not skip it) */
    megamoe_status_t published = mm_moe_rep_publish(x, wts, plan, g->exec);

    /* ---- buffers (saved ones sized to the rows actually received) ---- */
    mm_o1_fwd_t f;
    mm_moe_fwd_ctx_init(&f.c, x, plan, in, output, NULL);
    megamoe_experts_saved_t *sv = NULL;
    if (saved_p != NULL) {
        st = mm_moe_saved_create(x, plan, in->topk_weights_dtype, &sv);
        if (st == MEGAMOE_OK) mm_moe_fwd_ctx_init(&f.c, x, plan, in, output, sv);
    } else if (in->topk_weights_dtype == MEGAMOE_DTYPE_FP32) {
        f.c.w = in->topk_weights; /* inference: GMM1/SwiGLU outputs stay in the workers' tiles */
    } else {
        void *p = NULL;
        st = mm_moe_scratch(g, MM_SCR_F32, TK * sizeof(float), &p);
        f.c.w = p;
    }
    if (st == MEGAMOE_OK && f.c.w != in->topk_weights) /* fp32 router weights in slot order */
        st = megamoe_convert((float *)f.c.w, MEGAMOE_DTYPE_FP32, in->topk_weights,
                             in->topk_weights_dtype, TK);
    if (x->rep) f.c.guest = x->rep->cur;
    if (st == MEGAMOE_OK) st = published; /* a failed ready signal fails the launch */
    x->phase_s[MM_PH_FWD_PREPARE] += (double)(mm_now_ns() - t0) * 1e-9;

    /* ---- the launch (a local failure above: this rank only signals, all ranks fail) ---- */
    t0 = mm_now_ns();
    mm_mc_launch_t l;
    memset(&l, 0, sizeof l);
    l.dir = MM_MC_FWD;
    l.route = plan;
    l.local = st;
    l.pull = mm_moe_is_pull(&x->cfg);
    l.body.ctx = &f;
    l.body.dispatch = mm_o1_fwd_dispatch;
    l.body.expert = mm_o1_fwd_expert;
    l.body.reduce = mm_o1_fwd_reduce;
    l.body.fetch = x->rep ? mm_o1_fwd_fetch : NULL;
    char note[MM_PROF_MAX_NOTE];
    mm_moe_rep_note(plan, note, sizeof note);
    l.note = note[0] ? note : NULL;
    st = mm_mc_run(g->exec, &l);
    x->phase_s[MM_PH_FWD_LAUNCH] += (double)(mm_now_ns() - t0) * 1e-9;
    if (mm_mc_broken(g->exec)) g->broken = 1;
    mm_moe_rep_forward_done(x, plan, sv, st == MEGAMOE_OK);
    if (st != MEGAMOE_OK) {
        if (sv) sv->plan = NULL;
        megamoe_experts_saved_destroy(sv);
        mm_ep_plan_destroy(plan);
        return st;
    }
    x->last_recv_rows = R;
    x->last_tokens = plan->T;
    x->forwards++;
    if (saved_p) {
        sv->gen = mm_mc_generation(g->exec);
        *saved_p = sv;
    } else {
        mm_ep_plan_destroy(plan);
    }
    return MEGAMOE_OK;
}
