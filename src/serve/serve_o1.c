/* The O1 path of mega_moe: one launch of the multicore executor on its inference plan
 * (src/multicore/mc_plan.h, direction MM_MC_INF), with the serving bodies:
 *   DISPATCH   (vector)  a tile of this rank's pairs for one destination expert, in this rank's
 *                        expert order: each row (bf16, or the token quantised once before the
 *                        launch) straight into the owner's receive row (a put per tile for an
 *                        owner on another host); the executor raises the arrival counter
 *   LOCAL      (cube)    128 of this rank's active tokens through the shared experts (head of
 *                        the cube queue: they overlap the dispatch)
 *   EXPERT_ALL (cube)    128 rows of one local expert from every source (ready when every
 *                        source's rows arrived): the expert FFN, the result over the input row
 *   REDUCE     (vector)  nothing: the executor makes it wait for every rank's DONE; the caller
 *                        then sums the results (serve_call.c)
 * Same tile function, same rows, same sums as the host-scheduled path: the same bits. The host
 * path serves the calls this one does not (a rank mask, no token bound, the MX scenes). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "kernels/quant.h"
#include "serve/serve_o1.h"

struct mm_sv_o1 {
    mm_mc_plan_t *plan;
    mm_mc_exec_t *exec;
    mm_ep_plan_t *route;
    mm_shmem_team_t *team; /* the executor's (the buffer's at creation) */
};

megamoe_status_t mm_sv_o1_create(megamoe_symm_buffer_t *b, int cube, int vector)
{
    mm_sv_o1_t *o = calloc(1, sizeof *o);
    megamoe_status_t st = o ? MEGAMOE_OK : mm_error(MEGAMOE_OUT_OF_MEMORY, "mega_moe: O1 state");
    int *host = calloc((size_t)b->W, sizeof *host);
    if (st == MEGAMOE_OK && host == NULL) st = mm_error(MEGAMOE_OUT_OF_MEMORY, "mega_moe: host map");
    for (int i = 0; st == MEGAMOE_OK && i < b->W; i++) host[i] = mm_shmem_host_of(b->pes[i]);
    const int64_t T = b->p.num_max_tokens_per_rank;
    if (st == MEGAMOE_OK) {
        /* H and I only size the training graphs' weight-gradient chunks: not used here */
        mm_mc_shape_t sh = {b->W, b->me, T, b->p.hidden, 1, b->p.num_experts, b->p.num_topk,
                            cube, vector, host, 0};
        st = mm_mc_plan_create_infer(&sh, (T + MM_MC_TILE - 1) / MM_MC_TILE, &o->plan);
    }
    if (st == MEGAMOE_OK) {
        mm_ep_shape_t rs;
        memset(&rs, 0, sizeof rs);
        rs.ep = b->W;
        rs.me = b->me;
        rs.tokens = T;
        rs.top_k = b->p.num_topk;
        rs.experts = b->p.num_experts;
        rs.capacity = b->cap;
        st = mm_ep_plan_create(&rs, &o->route);
    }
    free(host);
    /* the executor's symmetric signal area is collective: every rank takes part or none */
    st = mm_shmem_team_agree(b->team, st);
    if (st == MEGAMOE_OK) st = mm_mc_exec_create(o->plan, b->team, b->pool, 64, &o->exec);
    if (st != MEGAMOE_OK) {
        if (o) {
            mm_ep_plan_destroy(o->route);
            mm_mc_plan_destroy(o->plan);
            free(o);
        }
        return st;
    }
    /* slots are home experts only (no replicas) */
    const int64_t L = b->L;
    for (int d = 0; d < b->W; d++)
        for (int64_t v = 0; v < L; v++) o->route->slot_expert[(int64_t)d * L + v] = (int32_t)(d * L + v);
    o->team = b->team;
    b->o1 = o;
    return MEGAMOE_OK;
}

static megamoe_status_t mm_sv_o1_free(mm_sv_o1_t *o, int collective);

megamoe_status_t mm_sv_o1_destroy(megamoe_symm_buffer_t *b, int collective)
{
    mm_sv_o1_t *o = b->o1;
    if (o == NULL) return MEGAMOE_OK;
    b->o1 = NULL;
    return mm_sv_o1_free(o, collective);
}

/* Executors left on their old teams by update_group, freed with those teams (or at the last
 * release: collective then as well). */
static pthread_mutex_t mm_sv_o1_lock = PTHREAD_MUTEX_INITIALIZER;
static mm_sv_o1_t *mm_sv_o1_retired[64];

static megamoe_status_t mm_sv_o1_free(mm_sv_o1_t *o, int collective)
{
    megamoe_status_t st = MEGAMOE_OK;
    if (collective && mm_shmem_is_running()) st = mm_mc_exec_destroy(o->exec);
    else mm_mc_exec_destroy_local(o->exec); /* a survivor's local teardown leaks nothing */
    mm_ep_plan_destroy(o->route);
    mm_mc_plan_destroy(o->plan);
    free(o);
    return st;
}

void mm_sv_o1_retire(megamoe_symm_buffer_t *b)
{
    mm_sv_o1_t *o = b->o1;
    if (o == NULL) return;
    b->o1 = NULL;
    pthread_mutex_lock(&mm_sv_o1_lock);
    int kept = 0;
    for (int i = 0; i < 64 && !kept; i++)
        if (mm_sv_o1_retired[i] == NULL) {
            mm_sv_o1_retired[i] = o;
            kept = 1;
        }
    pthread_mutex_unlock(&mm_sv_o1_lock);
    if (!kept) { /* freed locally: its signal area stays allocated on the old team */
        MM_WARN("update_group: more than 64 executors wait for their old groups to go");
        mm_sv_o1_free(o, 0);
    }
}

megamoe_status_t mm_sv_o1_free_retired(mm_shmem_team_t *team)
{
    megamoe_status_t st = MEGAMOE_OK;
    for (int i = 0; i < 64; i++) {
        pthread_mutex_lock(&mm_sv_o1_lock);
        mm_sv_o1_t *o = mm_sv_o1_retired[i];
        if (o && (team == NULL || o->team == team)) mm_sv_o1_retired[i] = NULL;
        else o = NULL;
        pthread_mutex_unlock(&mm_sv_o1_lock);
        if (o) {
            megamoe_status_t s = mm_sv_o1_free(o, 1);
            if (st == MEGAMOE_OK) st = s;
        }
    }
    return st;
}

int mm_sv_o1_usable(const megamoe_symm_buffer_t *b)
{
    return b->o1 != NULL && !mm_mc_broken(b->o1->exec);
}

int mm_sv_o1_lost(const megamoe_symm_buffer_t *b)
{
    return b->o1 != NULL && mm_shmem_team_lost_member(b->o1->team) >= 0;
}

/* ---- the bodies ------------------------------------------------------------------------- */

typedef struct mm_sv_o1_ctx {
    megamoe_symm_buffer_t *b;
    const mm_sv_o1_call_t *k;
} mm_sv_o1_ctx_t;

static megamoe_status_t mm_sv_o1_dispatch(void *ctx, mm_mc_worker_t *w, const mm_mc_tile_t *t)
{
    (void)w;
    const mm_sv_o1_ctx_t *x = ctx;
    const megamoe_symm_buffer_t *b = x->b;
    const mm_sv_o1_call_t *k = x->k;
    const size_t rb = b->row_bytes;
    const int d = t->peer;
    char *sym = (char *)b->recv + (size_t)t->dst_row * rb;
    char *direct = mm_shmem_ptr(sym, b->pes[d]);
    for (int64_t r = 0; r < t->rows; r++) {
        const int64_t p = t->row0 + r, tok = k->perm[p] / k->c->K;
        const void *src = k->qx ? (const void *)(k->qx + (size_t)tok * rb)
                                : (const void *)(k->c->x + tok * k->c->H);
        memcpy(direct ? direct + (size_t)r * rb : k->stage + (size_t)p * rb, src, k->wire);
    }
    if (direct) return MEGAMOE_OK;
    return mm_shmem_put(sym, k->stage + (size_t)t->row0 * rb, (size_t)t->rows * rb, b->pes[d]);
}

static megamoe_status_t mm_sv_o1_expert(void *ctx, mm_mc_worker_t *w, const mm_mc_tile_t *t)
{
    const mm_sv_o1_ctx_t *x = ctx;
    const mm_sv_o1_call_t *k = x->k;
    const megamoe_symm_buffer_t *b = x->b;
    const int64_t expert = (int64_t)b->me * k->c->L + t->j;
    uint64_t s0 = w->ring ? mm_now_ns() : 0;
    MM_CHECK(mm_sv_tile_routed(b, k->c, &k->pw[t->j], t->row0, t->rows,
                               k->tiles + (size_t)w->index * k->tile_bytes));
    if (w->ring) { /* the MegaKernel trace: the tile's FFN, then its result puts (below) */
        const uint64_t s1 = mm_now_ns();
        mm_mc_trace(w, MM_MC_ST_EXPERT, expert, -1, s0, s1);
        s0 = s1;
    }
    /* the results of rows from participants on other hosts go back now (serve_call.c,
     * mm_sv_call_o1): the tile's part of each such source's block, one put */
    const mm_sv_plan_t *pl = k->pl;
    const int64_t L = k->c->L, t0 = t->row0, t1 = t->row0 + t->rows;
    const size_t rb = b->row_bytes;
    for (int q = 0; q < pl->np; q++) {
        const int64_t at = k->ret[q * L + t->j];
        if (at < 0) continue;
        const int64_t b0 = pl->blk_off[t->j * pl->np + q];
        const int64_t b1 = b0 + pl->rec[q]->counts[(int64_t)b->me * L + t->j];
        const int64_t r0 = b0 > t0 ? b0 : t0, r1 = b1 < t1 ? b1 : t1;
        if (r1 <= r0) continue;
        MM_CHECK(mm_shmem_put((char *)b->recv + (size_t)(at + r0 - b0) * rb,
                              (const char *)b->recv + (size_t)r0 * rb, (size_t)(r1 - r0) * rb,
                              b->pes[pl->member[q]]));
        if (w->ring) {
            const uint64_t s1 = mm_now_ns();
            mm_mc_trace(w, MM_MC_ST_COMBINE, expert, pl->member[q], s0, s1);
            s0 = s1;
        }
    }
    return MEGAMOE_OK;
}

static megamoe_status_t mm_sv_o1_local(void *ctx, mm_mc_worker_t *w, int64_t i)
{
    const mm_sv_o1_ctx_t *x = ctx;
    const mm_sv_o1_call_t *k = x->k;
    const int64_t r0 = i * MM_SV_TILE;
    if (k->spw == NULL || r0 >= k->n_active) return MEGAMOE_OK;
    const int64_t n = k->n_active - r0 < MM_SV_TILE ? k->n_active - r0 : MM_SV_TILE;
    return mm_sv_tile_shared(x->b, k->c, k->spw, k->tok, r0, n, k->acc,
                             k->tiles + (size_t)w->index * k->tile_bytes);
}

static megamoe_status_t mm_sv_o1_reduce(void *ctx, mm_mc_worker_t *w, int64_t t0, int64_t t1)
{
    (void)ctx, (void)w, (void)t0, (void)t1; /* the caller reduces after the launch */
    return MEGAMOE_OK;
}

megamoe_status_t mm_sv_o1_run(megamoe_symm_buffer_t *b, const mm_sv_o1_call_t *k,
                              megamoe_status_t local)
{
    mm_sv_o1_t *o = b->o1;
    const mm_sv_call_t *c = k->c;
    const mm_sv_plan_t *pl = k->pl;
    mm_ep_plan_t *r = o->route;
    const int64_t L = c->L;
    if (local == MEGAMOE_OK) { /* the executor's view of the call: my segments, my receive rows */
        r->T = c->n;
        int64_t maxb = 0;
        for (int d = 0; d < b->W; d++)
            for (int64_t v = 0; v < L; v++) {
                const int64_t e = (int64_t)d * L + v, dv = e;
                r->seg_rows[dv] = k->mine[e];
                r->seg_pos[dv] = k->prefix[e];
                r->seg_dst[dv] = pl->dst_off[e];
                for (int s = 0; s < pl->np; s++)
                    if (pl->rec[s]->counts[e] > maxb) maxb = pl->rec[s]->counts[e];
            }
        for (int64_t j = 0; j <= L; j++) r->group_off[j] = pl->grp_off[j];
        /* every source's rows per local expert: the executor waits only for a block with rows
         * from a source on another host (which signals nothing for an empty one) */
        for (int64_t j = 0; j < L; j++)
            for (int s = 0; s < b->W; s++) {
                const int q = pl->part_of[s];
                r->blk_rows[j * b->W + s] = q < 0 ? 0 : pl->rec[q]->counts[(int64_t)b->me * L + j];
            }
        r->max_block_rows = maxb;
    }
    mm_sv_o1_ctx_t x = {b, k};
    mm_mc_launch_t l;
    memset(&l, 0, sizeof l);
    l.dir = MM_MC_INF;
    l.route = r;
    l.local = local;
    l.body.ctx = &x;
    l.body.dispatch = mm_sv_o1_dispatch;
    l.body.expert = mm_sv_o1_expert;
    l.body.reduce = mm_sv_o1_reduce;
    l.body.local = mm_sv_o1_local;
    megamoe_status_t st = mm_mc_run(o->exec, &l);
    /* a lost peer breaks the executor, not the buffer: the next call masks the lost rank
     * and drops the executor (serve_survive.c); the host path serves from then on */
    if (mm_mc_broken(o->exec) && st != MEGAMOE_PEER_LOST) b->broken = 1;
    return st;
}
