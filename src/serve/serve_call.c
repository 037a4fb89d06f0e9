/* One mega_moe call (see serve_impl.h for the data path): checks and counts, the first
 * exchange, dispatch, shared experts, the local experts, the combine. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "kernels/quant.h"
#include "serve/serve_impl.h"

enum { MM_SV_DISPATCH = 0, MM_SV_COMBINE = 1 };
/* scratch slots (0, 1: the expert sets' pointer arrays, serve_args.c) */
enum { SCR_PAYLOAD = 2, SCR_PLAN, SCR_PAIRS, SCR_PREP, SCR_TILES, SCR_SHARED, SCR_QX, SCR_FETCH };

/* The record of the first exchange. */
typedef struct mm_sv_rec {
    uint64_t gen;
    int64_t n;
    mm_sv_settings_t set;
    int32_t counts[]; /* [E]: this rank's active pairs per global expert (masked ranks' dropped) */
} mm_sv_rec_t;

static inline uint64_t *mm_sv_line(const megamoe_symm_buffer_t *b, int dir, int src)
{
    return b->sig + ((size_t)dir * (size_t)b->W + (size_t)src) * 8;
}

static inline int64_t mm_sv_id(const mm_sv_call_t *c, int64_t i)
{
    return c->ids_dtype == MEGAMOE_DTYPE_INT64 ? ((const int64_t *)c->ids)[i]
                                               : ((const int32_t *)c->ids)[i];
}

static inline float mm_sv_w(const mm_sv_call_t *c, int64_t i)
{
    if (c->w_dtype == MEGAMOE_DTYPE_FP32) return ((const float *)c->weights)[i];
    return megamoe_bf16_to_fp32(((const uint16_t *)c->weights)[i]);
}

static inline int mm_sv_active(const mm_sv_call_t *c, int64_t t)
{
    return c->active == NULL || c->active[t] != 0;
}

/* This rank's per-expert counts of active pairs; ids of active tokens must be in [0, E). */
static megamoe_status_t mm_sv_count(const megamoe_symm_buffer_t *b, const mm_sv_call_t *c,
                                    int32_t *counts)
{
    memset(counts, 0, sizeof *counts * (size_t)c->E);
    for (int64_t t = 0; t < c->n; t++) {
        if (!mm_sv_active(c, t)) continue;
        for (int64_t k = 0; k < c->K; k++) {
            int64_t e = mm_sv_id(c, t * c->K + k);
            if (e < 0 || e >= c->E)
                return mm_error(MEGAMOE_INVALID_ARGUMENT, "mega_moe: topk_ids[%lld][%lld] = %lld is "
                                "outside [0, num_experts = %lld) (active token)",
                                (long long)t, (long long)k, (long long)e, (long long)c->E);
            if (b->mask && b->mask[e / c->L]) continue; /* a disabled rank's expert: dropped */
            counts[e]++;
        }
    }
    return MEGAMOE_OK;
}

/* ---- the plan of the call (identical on every participant) ----------------------------- */

typedef struct mm_sv_plan {
    int np;              /* participants */
    int *member;         /* [np] buffer member index of participant p */
    int *part_of;        /* [W] participant index of member m, -1 when masked */
    const mm_sv_rec_t **rec; /* [np] */
    int64_t *grp_off;    /* [L + 1] this rank's receive rows per local expert */
    int64_t *blk_off;    /* [L * np] row of block (j, p) on this rank */
    int64_t *dst_off;    /* [E] row of this rank's first pair of expert e on its owner */
    int64_t recv_rows;
} mm_sv_plan_t;

static megamoe_status_t mm_sv_make_plan(megamoe_symm_buffer_t *b, const mm_call_t *call,
                                        const mm_sv_call_t *c, mm_shmem_team_t *team,
                                        mm_sv_plan_t *pl)
{
    const int np = call->n, W = b->W;
    const int64_t L = c->L, E = c->E;
    size_t bytes = sizeof(int) * (size_t)(np + W) + sizeof(void *) * (size_t)np +
                   sizeof(int64_t) * (size_t)(L + 1 + L * np + E) + 256;
    void *p = NULL;
    MM_CHECK(mm_sv_scratch(b, SCR_PLAN, bytes, &p));
    char *q = p;
    pl->rec = (const mm_sv_rec_t **)(void *)q;
    q += sizeof(void *) * (size_t)np;
    pl->grp_off = (int64_t *)(void *)q;
    q += sizeof(int64_t) * (size_t)(L + 1);
    pl->blk_off = (int64_t *)(void *)q;
    q += sizeof(int64_t) * (size_t)(L * np);
    pl->dst_off = (int64_t *)(void *)q;
    q += sizeof(int64_t) * (size_t)E;
    pl->member = (int *)(void *)q;
    q += sizeof(int) * (size_t)np;
    pl->part_of = (int *)(void *)q;
    pl->np = np;
    for (int m = 0; m < W; m++) pl->part_of[m] = -1;
    for (int i = 0; i < np; i++) {
        pl->rec[i] = mm_call_payload(call, i);
        int pe = mm_shmem_team_world_pe(team, i), m = 0;
        while (m < W && b->pes[m] != pe) m++;
        pl->member[i] = m;
        pl->part_of[m] = i;
    }
    /* receive rows of every participant (the capacity check is the same everywhere) */
    for (int i = 0; i < np; i++) {
        const int d = pl->member[i];
        int64_t rows = 0;
        for (int s = 0; s < np; s++)
            for (int64_t j = 0; j < L; j++) rows += pl->rec[s]->counts[(int64_t)d * L + j];
        if (rows > b->cap)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "mega_moe: rank %d would receive %lld rows "
                            "but the buffer's receive capacity is %lld rows (max_recv_token_num, "
                            "or num_max_tokens_per_rank * group size * min(num_topk, local "
                            "experts)); create the buffer with a larger max_recv_token_num",
                            b->pes[d], (long long)rows, (long long)b->cap);
        if (d == b->me) pl->recv_rows = rows;
    }
    /* this rank's receive layout: local expert, then source participant, then source order */
    int64_t off = 0;
    for (int64_t j = 0; j < L; j++) {
        pl->grp_off[j] = off;
        for (int s = 0; s < np; s++) {
            pl->blk_off[j * np + s] = off;
            off += pl->rec[s]->counts[(int64_t)b->me * L + j];
        }
    }
    pl->grp_off[L] = off;
    /* where this rank's pairs of expert e start on its owner d */
    const int mine = pl->part_of[b->me];
    for (int64_t e = 0; e < E; e++) {
        const int d = (int)(e / L);
        const int64_t j = e % L;
        if (pl->part_of[d] < 0) {
            pl->dst_off[e] = -1;
            continue;
        }
        int64_t o = 0;
        for (int64_t jj = 0; jj < j; jj++)
            for (int s = 0; s < np; s++) o += pl->rec[s]->counts[(int64_t)d * L + jj];
        for (int s = 0; s < mine; s++) o += pl->rec[s]->counts[e];
        pl->dst_off[e] = o;
    }
    return MEGAMOE_OK;
}

/* ---- dispatch -------------------------------------------------------------------------- */

static void mm_sv_put(const megamoe_symm_buffer_t *b, int d, int64_t row, const void *src,
                      size_t bytes)
{
    char *sym = (char *)b->recv + (size_t)row * b->row_bytes;
    void *direct = mm_shmem_ptr(sym, b->pes[d]);
    if (direct) memcpy(direct, src, bytes);
    else mm_shmem_put(sym, src, bytes, b->pes[d]);
}

/* Send every active pair's row; pair_row[t*K+k] = (owner << 40) | row, or -1. */
static megamoe_status_t mm_sv_dispatch(megamoe_symm_buffer_t *b, const mm_sv_call_t *c,
                                       const mm_sv_plan_t *pl, int64_t *pair_row, int64_t *next)
{
    const int atype = c->routed.atype;
    const size_t wire = atype == MEGAMOE_SERVE_TYPE_BF16
                            ? (size_t)c->H * 2
                            : b->row_bytes; /* quantised row + its scales */
    void *qx = NULL;
    if (atype != MEGAMOE_SERVE_TYPE_BF16) MM_CHECK(mm_sv_scratch(b, SCR_QX, b->row_bytes, &qx));
    memcpy(next, pl->dst_off, sizeof *next * (size_t)c->E);
    for (int64_t t = 0; t < c->n; t++) {
        const int act = mm_sv_active(c, t);
        const uint16_t *xr = c->x + t * c->H;
        const void *row = xr;
        int quantised = 0;
        for (int64_t k = 0; k < c->K; k++) {
            const int64_t i = t * c->K + k;
            pair_row[i] = -1;
            if (!act) continue;
            const int64_t e = mm_sv_id(c, i);
            if (next[e] < 0) continue; /* owner masked */
            if (atype != MEGAMOE_SERVE_TYPE_BF16 && !quantised) { /* once per token */
                mm_sv_row_quant(xr, atype, c->H, qx);
                row = qx;
                quantised = 1;
            }
            const int d = (int)(e / c->L);
            const int64_t r = next[e]++;
            mm_sv_put(b, d, r, row, wire);
            pair_row[i] = ((int64_t)d << 40) | r;
        }
    }
    return MEGAMOE_OK;
}

static void mm_sv_signal(megamoe_symm_buffer_t *b, const mm_sv_plan_t *pl, int dir, uint64_t v)
{
    mm_shmem_quiet(); /* puts through the runtime complete before the signals */
    for (int i = 0; i < pl->np; i++) {
        int p = (pl->part_of[b->me] + i) % pl->np, d = pl->member[p];
        mm_shmem_signal_op(mm_sv_line(b, dir, b->me), v, MM_SHMEM_SIGNAL_SET, b->pes[d]);
    }
}

/* Wait for every participant's line of dir; *failed = the lowest member whose value carries
 * the failure bit (-1: none). */
static megamoe_status_t mm_sv_wait(megamoe_symm_buffer_t *b, const mm_sv_plan_t *pl, int dir,
                                   uint64_t gen, int *failed)
{
    *failed = -1;
    for (int p = 0; p < pl->np; p++) {
        const int s = pl->member[p];
        uint64_t v = 0;
        megamoe_status_t st = mm_shmem_signal_wait_until(mm_sv_line(b, dir, s), MM_SHMEM_CMP_GE,
                                                         gen << 1, &v);
        if (st != MEGAMOE_OK) {
            b->broken = 1;
            return st;
        }
        if ((v & 1) && *failed < 0) *failed = s;
    }
    return MEGAMOE_OK;
}

/* ---- compute --------------------------------------------------------------------------- */

typedef struct mm_sv_work {
    megamoe_symm_buffer_t *b;
    const mm_sv_call_t *c;
    const mm_sv_experts_t *set;
    const mm_sv_prepared_t *pw;
    char *base;        /* rows [0, rows) of ld bytes */
    size_t ld;
    int64_t rows;
    char *tiles;       /* per-worker tile scratch */
    size_t tile_bytes;
    float *acc;        /* shared experts: fp32 [rows, H] added to; NULL: results in place */
    const uint16_t *x; /* shared experts: bf16 token rows (quantised per tile when needed) */
    const int64_t *tok; /* shared: active token list */
    int combine_q;     /* combine_quant_mode (in-place results only) */
    atomic_long next;
} mm_sv_work_t;

static megamoe_status_t mm_sv_tiles(void *arg, int worker, int nw)
{
    (void)nw;
    mm_sv_work_t *w = arg;
    const mm_sv_experts_t *set = w->set;
    char *tile = w->tiles + (size_t)worker * w->tile_bytes;
    const int64_t H = set->H;
    for (;;) {
        int64_t r0 = atomic_fetch_add(&w->next, MM_SV_TILE);
        if (r0 >= w->rows) return MEGAMOE_OK;
        int64_t n = w->rows - r0 < MM_SV_TILE ? w->rows - r0 : MM_SV_TILE;
        if (w->acc) {
            /* shared experts on local tokens: the token rows in the set's wire format */
            char *q = tile + mm_sv_tile_bytes(set);
            size_t rb = set->atype == MEGAMOE_SERVE_TYPE_BF16 ? (size_t)H * 2 : w->b->row_bytes;
            for (int64_t r = 0; r < n; r++) {
                const uint16_t *xr = w->x + w->tok[r0 + r] * H;
                if (set->atype == MEGAMOE_SERVE_TYPE_BF16) memcpy(q + (size_t)r * rb, xr, (size_t)H * 2);
                else mm_sv_row_quant(xr, set->atype, H, q + (size_t)r * rb);
            }
            float *acc = w->acc + r0 * H;
            MM_CHECK(mm_sv_ffn_tile(set, w->pw, &w->c->act, n, q, rb, tile, NULL, 0, acc));
        } else {
            char *in = w->base + (size_t)r0 * w->ld;
            MM_CHECK(mm_sv_ffn_tile(set, w->pw, &w->c->act, n, in, w->ld, tile, (uint16_t *)(void *)in,
                                    w->ld, NULL));
            if (w->combine_q) { /* MX fp8 on the combine wire, in place */
                uint16_t *tmp = (uint16_t *)(void *)(tile + mm_sv_tile_bytes(set));
                const megamoe_dtype_t qt = w->combine_q == 3 ? MEGAMOE_DTYPE_FP8_E5M2
                                                             : MEGAMOE_DTYPE_FP8_E4M3FN;
                for (int64_t r = 0; r < n; r++) {
                    uint8_t *row = (uint8_t *)in + (size_t)r * w->ld;
                    memcpy(tmp, row, (size_t)H * 2);
                    MM_CHECK(mm_quant_mx(tmp, MEGAMOE_DTYPE_BF16, H, qt, row, row + H));
                }
            }
        }
    }
}

static size_t mm_sv_worker_bytes(const megamoe_symm_buffer_t *b, const mm_sv_experts_t *set)
{
    return mm_align_up(mm_sv_tile_bytes(set) + (size_t)MM_SV_TILE * b->row_bytes, 4096);
}

static megamoe_status_t mm_sv_run_set(megamoe_symm_buffer_t *b, const mm_sv_call_t *c,
                                      const mm_sv_experts_t *set, int e,
                                      const mm_gemm_backend_ops_t *gemm, mm_sv_work_t *w)
{
    void *prep = NULL, *tiles = NULL;
    MM_CHECK(mm_sv_scratch(b, SCR_PREP, mm_sv_prepare_bytes(set), &prep));
    mm_sv_prepared_t pw;
    pw.gemm = gemm;
    MM_CHECK(mm_sv_prepare(set, e, prep, &pw));
    const size_t tb = mm_sv_worker_bytes(b, set);
    MM_CHECK(mm_sv_scratch(b, SCR_TILES, tb * (size_t)b->workers, &tiles));
    w->b = b;
    w->c = c;
    w->set = set;
    w->pw = &pw;
    w->tiles = tiles;
    w->tile_bytes = tb;
    atomic_store(&w->next, 0);
    return mm_pool_run(b->pool, mm_sv_tiles, w);
}

/* ---- combine --------------------------------------------------------------------------- */

static megamoe_status_t mm_sv_reduce(megamoe_symm_buffer_t *b, const mm_sv_call_t *c,
                                     const int64_t *pair_row, const float *shared)
{
    const int64_t H = c->H, K = c->K;
    const int cq = (int)b->p.combine_quant_mode;
    float *acc = NULL;
    void *fetch = NULL;
    MM_CHECK(mm_sv_scratch(b, SCR_FETCH, (size_t)H * 4 + b->row_bytes + 64, &fetch));
    acc = fetch;
    uint8_t *tmp = (uint8_t *)fetch + mm_align_up((size_t)H * 4, 64);
    float *deq = NULL;
    if (cq) MM_CHECK(mm_sv_scratch(b, SCR_QX, (size_t)H * 4, (void **)&deq));
    for (int64_t t = 0; t < c->n; t++) {
        uint16_t *y = c->y + t * H;
        if (!mm_sv_active(c, t)) {
            memset(y, 0, (size_t)H * 2);
            continue;
        }
        for (int64_t h = 0; h < H; h++) acc[h] = 0.0f;
        for (int64_t k = 0; k < K; k++) {
            const int64_t pr = pair_row[t * K + k];
            if (pr < 0) continue;
            const int d = (int)(pr >> 40);
            const int64_t row = pr & (((int64_t)1 << 40) - 1);
            const char *sym = (const char *)b->recv + (size_t)row * b->row_bytes;
            const uint8_t *src = mm_shmem_ptr(sym, b->pes[d]);
            const size_t bytes = cq ? (size_t)H + (size_t)mm_quant_mx_scale_count(H) : (size_t)H * 2;
            if (src == NULL) {
                MM_CHECK(mm_shmem_get(tmp, sym, bytes, b->pes[d]));
                src = tmp;
            }
            const float w = mm_sv_w(c, t * K + k);
            if (cq) {
                MM_CHECK(mm_comm_dequant_mx_f32(src, src + H,
                                                cq == 3 ? MEGAMOE_DTYPE_FP8_E5M2
                                                        : MEGAMOE_DTYPE_FP8_E4M3FN,
                                                H, deq));
                for (int64_t h = 0; h < H; h++) acc[h] = acc[h] + w * deq[h];
            } else {
                const uint16_t *r = (const uint16_t *)(const void *)src;
                for (int64_t h = 0; h < H; h++) acc[h] = acc[h] + w * megamoe_bf16_to_fp32(r[h]);
            }
        }
        if (shared) {
            const float *s = shared + t * H;
            for (int64_t h = 0; h < H; h++) acc[h] = acc[h] + s[h];
        }
        for (int64_t h = 0; h < H; h++) y[h] = megamoe_fp32_to_bf16(acc[h]);
    }
    return MEGAMOE_OK;
}

/* ---- the call -------------------------------------------------------------------------- */

static megamoe_status_t mm_sv_body(megamoe_symm_buffer_t *b, const megamoe_mega_moe_args_t *a)
{
    mm_sv_order_t *order = NULL;
    MM_CHECK(mm_sv_order(b, &order)); /* a masked rank's own mistake: local */
    mm_sv_call_t c;
    memset(&c, 0, sizeof c);
    megamoe_status_t local = mm_take_next_call_error();
    if (local == MEGAMOE_OK) local = mm_sv_args(b, a, &c);
    const mm_gemm_backend_ops_t *gemm = NULL;
    if (local == MEGAMOE_OK) {
        mm_gemm_choice_t choice;
        local = mm_gemm_choice_from_env(&choice);
        if (local == MEGAMOE_OK) local = mm_gemm_backend_of(choice, &gemm);
    }
    const int64_t E = b->p.num_experts;
    const size_t pbytes = sizeof(mm_sv_rec_t) + sizeof(int32_t) * (size_t)E;
    mm_sv_rec_t *mine = NULL;
    megamoe_status_t s2 = mm_sv_scratch(b, SCR_PAYLOAD, pbytes, (void **)&mine);
    if (s2 != MEGAMOE_OK) return s2;
    memset(mine, 0, pbytes);
    mine->gen = b->gen + 1;
    if (local == MEGAMOE_OK) {
        mine->n = c.n;
        mine->set = c.set;
        local = mm_sv_count(b, &c, mine->counts);
    }
    /* the first exchange: order, statuses, counts, settings */
    mm_call_t call;
    mm_call_begin(&call, &order->calls, MM_CALL_MEGA_MOE, b->id, 0);
    megamoe_status_t st = mm_call_exchange(&call, order->team, local, mine, pbytes);
    if (st == MEGAMOE_PEER_LOST || st == MEGAMOE_TIMEOUT) b->broken = 1;
    if (st != MEGAMOE_OK) {
        mm_call_end(&call);
        return st;
    }
    mm_sv_plan_t pl;
    st = mm_sv_make_plan(b, &call, &c, order->team, &pl);
    uint64_t gen = 0;
    if (st == MEGAMOE_OK) {
        const mm_sv_settings_t *sets[1024];
        int wr[1024];
        for (int i = 0; i < pl.np; i++) {
            sets[i] = &pl.rec[i]->set;
            wr[i] = b->pes[pl.member[i]];
            if (pl.rec[i]->gen > gen) gen = pl.rec[i]->gen;
        }
        st = mm_sv_settings_agree(sets, wr, pl.np);
    }
    if (st != MEGAMOE_OK) { /* decided from the same records on every rank */
        mm_call_end(&call);
        return st;
    }
    b->gen = gen;
    for (int64_t j = 0; j < c.L; j++) c.expert_token_nums[j] = 0;
    c.routed.version = c.shared.version = a->weights_version;
    c.routed.stamp = c.shared.stamp = mm_sv_wcache_begin();

    /* ---- dispatch; shared experts overlap the peers' dispatch ---- */
    int64_t *pair_row = NULL;
    megamoe_status_t work = mm_sv_scratch(b, SCR_PAIRS,
                                          sizeof(int64_t) * (size_t)(c.n * c.K + E) + 64,
                                          (void **)&pair_row);
    if (work == MEGAMOE_OK) work = mm_sv_dispatch(b, &c, &pl, pair_row, pair_row + c.n * c.K);
    mm_sv_signal(b, &pl, MM_SV_DISPATCH, (gen << 1) | (work != MEGAMOE_OK));
    float *shared = NULL;
    if (work == MEGAMOE_OK && c.shared.count > 0 && c.n > 0) {
        int64_t *tok = NULL;
        work = mm_sv_scratch(b, SCR_SHARED, (size_t)c.n * (size_t)c.H * 4 + (size_t)c.n * 8 + 64,
                             (void **)&shared);
        if (work == MEGAMOE_OK) {
            tok = (int64_t *)(void *)(shared + c.n * c.H);
            int64_t na = 0;
            for (int64_t t = 0; t < c.n; t++)
                if (mm_sv_active(&c, t)) tok[na++] = t;
            memset(shared, 0, (size_t)na * (size_t)c.H * 4);
            for (int e = 0; work == MEGAMOE_OK && e < c.shared.count && na > 0; e++) {
                mm_sv_work_t w;
                memset(&w, 0, sizeof w);
                w.rows = na;
                w.acc = shared;
                w.x = c.x;
                w.tok = tok;
                work = mm_sv_run_set(b, &c, &c.shared, e, gemm, &w);
            }
            /* scatter the active tokens' sums to their token rows (inactive rows stay unused) */
            for (int64_t i = na - 1; work == MEGAMOE_OK && i >= 0; i--)
                if (tok[i] != i)
                    memmove(shared + tok[i] * c.H, shared + i * c.H, (size_t)c.H * 4);
        }
    }
    int failed = -1;
    st = mm_sv_wait(b, &pl, MM_SV_DISPATCH, gen, &failed);
    if (st != MEGAMOE_OK) {
        mm_call_end(&call);
        return st;
    }

    /* ---- the local experts, results in place ---- */
    if (work == MEGAMOE_OK && failed < 0) {
        for (int64_t j = 0; work == MEGAMOE_OK && j < c.L; j++) {
            const int64_t rows = pl.grp_off[j + 1] - pl.grp_off[j];
            c.expert_token_nums[j] = (int32_t)rows;
            if (rows == 0) continue;
            mm_sv_work_t w;
            memset(&w, 0, sizeof w);
            w.base = (char *)b->recv + (size_t)pl.grp_off[j] * b->row_bytes;
            w.ld = b->row_bytes;
            w.rows = rows;
            w.combine_q = (int)b->p.combine_quant_mode;
            work = mm_sv_run_set(b, &c, &c.routed, (int)j, gemm, &w);
        }
    }
    mm_sv_signal(b, &pl, MM_SV_COMBINE, (gen << 1) | (work != MEGAMOE_OK || failed >= 0));
    int failed2 = -1;
    st = mm_sv_wait(b, &pl, MM_SV_COMBINE, gen, &failed2);
    if (st == MEGAMOE_OK && failed < 0 && failed2 >= 0) failed = failed2;
    if (st == MEGAMOE_OK && work != MEGAMOE_OK) st = work; /* our own message */
    else if (st == MEGAMOE_OK && failed >= 0)
        st = mm_error(MEGAMOE_INTERNAL, "mega_moe: rank %d failed after the exchange (its log "
                      "names the cause); no output was written", b->pes[failed]);
    if (st == MEGAMOE_OK) st = mm_sv_reduce(b, &c, pair_row, shared);
    if (st == MEGAMOE_OK) {
        b->calls++;
        b->last_recv_rows = pl.recv_rows;
    }
    mm_call_end(&call);
    return st;
}

megamoe_status_t megamoe_mega_moe(megamoe_symm_buffer_t *b, const megamoe_mega_moe_args_t *a)
{
    MM_CHECK(mm_sv_buffer_check(b, "mega_moe"));
    int idle = 0;
    if (!atomic_compare_exchange_strong(&b->busy, &idle, 1))
        return mm_error(MEGAMOE_INVALID_STATE, "mega_moe: the buffer is in use by another thread; "
                        "calls on one buffer are serialised by the caller");
    megamoe_status_t st = mm_sv_body(b, a);
    atomic_store(&b->busy, 0);
    return st;
}
