/* One mega_moe call (see serve_impl.h for the data path): checks and counts, the first
 * exchange, dispatch, shared experts, the local experts, the combine. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/abi.h"
#include "base/alloc.h"
#include "base/env.h"
#include "base/error.h"
#include "kernels/quant.h"
#include "kernels/rows.h"
#include "serve/serve_o1.h"

enum { MM_SV_DISPATCH = 0, MM_SV_COMBINE = 1, MM_SV_READ = 2 };
/* scratch slots (0, 1: the expert sets' pointer arrays, serve_args.c) */
enum { SCR_PAYLOAD = 2, SCR_PLAN, SCR_PAIRS, SCR_PREP, SCR_TILES, SCR_SHARED, SCR_QX, SCR_FETCH,
       SCR_UNITS, SCR_ROWS, SCR_SPREP, SCR_STAGE, SCR_GETS, SCR_RET };

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

/* Rows for owners this rank cannot store into (another host) are staged in this rank's
 * order (expert, then pair order) and travel as one put per (owner, expert) block; the
 * combine brings them back the same way. */
static int mm_sv_remote(const megamoe_symm_buffer_t *b, int d)
{
    return mm_shmem_ptr(b->recv, b->pes[d]) == NULL;
}

/* This rank's pairs in its order (expert, then pair order), without moving data (the O1 path's
 * dispatch tasks move them): pair_row / pair_pos as mm_sv_dispatch, perm[pos] = the pair. */
static void mm_sv_pairs(const megamoe_symm_buffer_t *b, const mm_sv_call_t *c,
                        const mm_sv_plan_t *pl, int64_t *pair_row, int64_t *pair_pos,
                        int64_t *next, int64_t *prefix, int32_t *perm)
{
    const int32_t *mine = pl->rec[pl->part_of[b->me]]->counts;
    int64_t total = 0;
    for (int64_t e = 0; e < c->E; e++) {
        prefix[e] = total;
        total += mine[e];
    }
    memcpy(next, pl->dst_off, sizeof *next * (size_t)c->E);
    for (int64_t t = 0; t < c->n; t++) {
        const int act = mm_sv_active(c, t);
        for (int64_t k = 0; k < c->K; k++) {
            const int64_t i = t * c->K + k;
            pair_row[i] = -1;
            if (!act) continue;
            const int64_t e = mm_sv_id(c, i);
            if (next[e] < 0) continue;
            const int64_t r = next[e]++, pos = prefix[e] + (r - pl->dst_off[e]);
            pair_row[i] = ((int64_t)(e / c->L) << 40) | r;
            pair_pos[i] = pos;
            perm[pos] = (int32_t)i;
        }
    }
}

/* Send every active pair's row; pair_row[t*K+k] = (owner << 40) | row on the owner, or -1;
 * pair_pos[t*K+k] = its position in this rank's order (the staging row). */
static megamoe_status_t mm_sv_dispatch(megamoe_symm_buffer_t *b, const mm_sv_call_t *c,
                                       const mm_sv_plan_t *pl, int64_t *pair_row,
                                       int64_t *pair_pos, int64_t *next, int64_t *prefix,
                                       char **stage_p)
{
    const int atype = c->routed.atype;
    const size_t wire = atype == MEGAMOE_SERVE_TYPE_BF16
                            ? (size_t)c->H * 2
                            : b->row_bytes; /* quantised row + its scales */
    const size_t rb = b->row_bytes;
    void *qx = NULL;
    if (atype != MEGAMOE_SERVE_TYPE_BF16) MM_CHECK(mm_sv_scratch(b, SCR_QX, b->row_bytes, &qx));
    /* this rank's pairs per expert, and where each expert's pairs start in its order */
    const int32_t *mine = pl->rec[pl->part_of[b->me]]->counts;
    int64_t total = 0, remote = 0;
    for (int64_t e = 0; e < c->E; e++) {
        prefix[e] = total;
        total += mine[e];
        if (mine[e] && pl->dst_off[e] >= 0 && mm_sv_remote(b, (int)(e / c->L))) remote = 1;
    }
    char *stage = NULL;
    if (remote) MM_CHECK(mm_sv_scratch(b, SCR_STAGE, (size_t)(total > 0 ? total : 1) * rb, (void **)&stage));
    *stage_p = stage;
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
            const int64_t pos = prefix[e] + (r - pl->dst_off[e]);
            char *sym = (char *)b->recv + (size_t)r * rb;
            void *direct = mm_shmem_ptr(sym, b->pes[d]);
            memcpy(direct ? direct : stage + (size_t)pos * rb, row, wire);
            pair_row[i] = ((int64_t)d << 40) | r;
            pair_pos[i] = pos;
        }
    }
    for (int64_t e = 0; remote && e < c->E; e++) { /* one put per (owner, expert) block */
        if (mine[e] == 0 || pl->dst_off[e] < 0 || !mm_sv_remote(b, (int)(e / c->L))) continue;
        MM_CHECK(mm_shmem_put((char *)b->recv + (size_t)pl->dst_off[e] * rb,
                              stage + (size_t)prefix[e] * rb, (size_t)mine[e] * rb,
                              b->pes[e / c->L]));
    }
    return MEGAMOE_OK;
}

/* A control signal every peer needs whatever failed: one more try (a failed one was not
 * applied), else the peer is declared lost rather than left waiting for the timeout. */
static void mm_sv_signal_to(megamoe_symm_buffer_t *b, uint64_t *line, uint64_t v, int pe)
{
    if (mm_shmem_signal_op(line, v, MM_SHMEM_SIGNAL_SET, pe) != MEGAMOE_OK &&
        mm_shmem_signal_op(line, v, MM_SHMEM_SIGNAL_SET, pe) != MEGAMOE_OK)
        mm_shmem_declare_lost(pe, "a mega_moe signal to it failed twice");
    (void)b;
}

/* SET this rank's line of dir on every participant to (gen << 8) | -status (0 when OK): a
 * failed put of the phase makes it a failure, so every participant fails the call with it. */
static void mm_sv_signal(megamoe_symm_buffer_t *b, const mm_sv_plan_t *pl, int dir, uint64_t gen,
                         megamoe_status_t status)
{
    /* No quiet: the runtime orders a signal after every earlier put of this thread to that PE
     * (across hosts it arrives behind them), and direct stores are ordered by the release
     * semantics of the signal update; a quiet would add a round trip per phase across hosts. */
    const uint64_t v = (gen << 8) | (uint64_t)((-(int)status) & 0xFF);
    for (int i = 0; i < pl->np; i++) {
        int p = (pl->part_of[b->me] + i) % pl->np, d = pl->member[p];
        mm_sv_signal_to(b, mm_sv_line(b, dir, b->me), v, b->pes[d]);
    }
}

/* Wait for every participant's line of dir; *failed = the lowest member whose value carries a
 * failure, *status its status (OK when none). */
static megamoe_status_t mm_sv_wait(megamoe_symm_buffer_t *b, const mm_sv_plan_t *pl, int dir,
                                   uint64_t gen, int *failed, megamoe_status_t *status)
{
    *failed = -1;
    *status = MEGAMOE_OK;
    for (int p = 0; p < pl->np; p++) {
        const int s = pl->member[p];
        uint64_t v = 0;
        megamoe_status_t st = mm_shmem_signal_wait_until(mm_sv_line(b, dir, s), MM_SHMEM_CMP_GE,
                                                         gen << 8, &v);
        if (st != MEGAMOE_OK) {
            b->broken = st != MEGAMOE_PEER_LOST; /* a loss: the survivors go on */
            return st;
        }
        if ((v & 0xFF) && *failed < 0) {
            *failed = s;
            *status = (megamoe_status_t)(-(int)(v & 0xFF));
        }
    }
    return MEGAMOE_OK;
}

/* ---- compute --------------------------------------------------------------------------- */

/* A unit of work: up to MM_SV_TILE rows of one expert (routed: receive rows r0..; shared:
 * active tokens r0.. of the token list, every shared expert in turn). */
typedef struct mm_sv_unit {
    int32_t e;
    int64_t r0, n;
} mm_sv_unit_t;

typedef struct mm_sv_work {
    megamoe_symm_buffer_t *b;
    const mm_sv_call_t *c;
    const mm_sv_experts_t *set;
    const mm_sv_prepared_t *pw; /* [set->count] (routed MX: the one expert being run) */
    const mm_sv_unit_t *units;
    int64_t n_units;
    char *base;        /* routed: the receive rows (ld bytes apart) */
    size_t ld;
    char *tiles;       /* per-worker tile scratch */
    size_t tile_bytes;
    float *acc;        /* shared: fp32 [active tokens, H] added to */
    const uint16_t *x; /* shared: bf16 token rows, quantised per tile when needed */
    const int64_t *tok; /* shared: the active tokens */
    int combine_q;     /* combine_quant_mode (routed results) */
    atomic_long next;
} mm_sv_work_t;

megamoe_status_t mm_sv_tile_shared(const megamoe_symm_buffer_t *b, const mm_sv_call_t *c,
                                   const mm_sv_prepared_t *pw, const int64_t *tok, int64_t r0,
                                   int64_t n, float *acc, char *tile)
{
    /* shared experts on local tokens: the token rows in the set's wire format */
    const mm_sv_experts_t *set = &c->shared;
    const int64_t H = set->H;
    char *q = tile + mm_sv_tile_bytes(set);
    const size_t rb = set->atype == MEGAMOE_SERVE_TYPE_BF16 ? (size_t)H * 2 : b->row_bytes;
    for (int64_t r = 0; r < n; r++) {
        const uint16_t *xr = c->x + tok[r0 + r] * H;
        if (set->atype == MEGAMOE_SERVE_TYPE_BF16) memcpy(q + (size_t)r * rb, xr, (size_t)H * 2);
        else mm_sv_row_quant(xr, set->atype, H, q + (size_t)r * rb);
    }
    for (int e = 0; e < set->count; e++)
        MM_CHECK(mm_sv_ffn_tile(set, &pw[e], &c->act, n, q, rb, tile, NULL, 0, acc + r0 * H));
    return MEGAMOE_OK;
}

megamoe_status_t mm_sv_tile_routed(const megamoe_symm_buffer_t *b, const mm_sv_call_t *c,
                                   const mm_sv_prepared_t *pw, int64_t row0, int64_t n, char *tile)
{
    const mm_sv_experts_t *set = &c->routed;
    const int64_t H = set->H;
    const size_t ld = b->row_bytes;
    char *in = (char *)b->recv + (size_t)row0 * ld;
    MM_CHECK(mm_sv_ffn_tile(set, pw, &c->act, n, in, ld, tile, (uint16_t *)(void *)in, ld, NULL));
    const int cq = (int)b->p.combine_quant_mode;
    if (cq) { /* MX fp8 on the combine wire, in place */
        uint16_t *tmp = (uint16_t *)(void *)(tile + mm_sv_tile_bytes(set));
        const megamoe_dtype_t qt = cq == 3 ? MEGAMOE_DTYPE_FP8_E5M2 : MEGAMOE_DTYPE_FP8_E4M3FN;
        for (int64_t r = 0; r < n; r++) {
            uint8_t *row = (uint8_t *)in + (size_t)r * ld;
            memcpy(tmp, row, (size_t)H * 2);
            MM_CHECK(mm_quant_mx(tmp, MEGAMOE_DTYPE_BF16, H, qt, row, row + H));
        }
    }
    return MEGAMOE_OK;
}

static megamoe_status_t mm_sv_tiles(void *arg, int worker, int nw)
{
    (void)nw;
    mm_sv_work_t *w = arg;
    const mm_sv_experts_t *set = w->set;
    char *tile = w->tiles + (size_t)worker * w->tile_bytes;
    for (;;) {
        const int64_t u = atomic_fetch_add(&w->next, 1);
        if (u >= w->n_units) return MEGAMOE_OK;
        const mm_sv_unit_t *un = &w->units[u];
        if (w->acc)
            MM_CHECK(mm_sv_tile_shared(w->b, w->c, w->pw, w->tok, un->r0, un->n, w->acc, tile));
        else
            MM_CHECK(mm_sv_tile_routed(w->b, w->c, w->pw + (set->scene >= MM_SV_A8W8_FP ? 0 : un->e),
                                       un->r0, un->n, tile));
    }
}

size_t mm_sv_worker_bytes(const megamoe_symm_buffer_t *b, const mm_sv_experts_t *set)
{
    return mm_align_up(mm_sv_tile_bytes(set) + (size_t)MM_SV_TILE * b->row_bytes, 4096);
}

/* Tiles of `rows` rows from r0 for expert e into units (returns the new count). */
static int64_t mm_sv_cut(mm_sv_unit_t *units, int64_t n, int e, int64_t r0, int64_t rows)
{
    for (int64_t r = 0; r < rows; r += MM_SV_TILE) {
        units[n].e = e;
        units[n].r0 = r0 + r;
        units[n].n = rows - r < MM_SV_TILE ? rows - r : MM_SV_TILE;
        n++;
    }
    return n;
}

/* Run the units on the pool. */
static megamoe_status_t mm_sv_run(megamoe_symm_buffer_t *b, mm_sv_work_t *w)
{
    void *tiles = NULL;
    const size_t tb = mm_sv_worker_bytes(b, w->set);
    MM_CHECK(mm_sv_scratch(b, SCR_TILES, tb * (size_t)b->workers, &tiles));
    w->b = b;
    w->tiles = tiles;
    w->tile_bytes = tb;
    atomic_store(&w->next, 0);
    return mm_pool_run(b->pool, mm_sv_tiles, w);
}

/* Prepare the experts of a set that have rows (has_rows NULL: all): weight-cache lookups and
 * per-channel terms, on this thread. MX scenes decode whole weights: done per expert later. */
static megamoe_status_t mm_sv_prepare_all(megamoe_symm_buffer_t *b, const mm_sv_experts_t *set,
                                          const mm_gemm_backend_ops_t *gemm, int slot,
                                          const int64_t *rows, mm_sv_prepared_t **pw_p)
{
    const size_t per = mm_sv_prepare_bytes(set);
    void *mem = NULL;
    const size_t head = mm_align_up(sizeof(mm_sv_prepared_t) * (size_t)set->count, 64);
    MM_CHECK(mm_sv_scratch(b, slot, head + per * (size_t)set->count, &mem));
    mm_sv_prepared_t *pw = mem;
    for (int e = 0; e < set->count; e++) {
        pw[e].gemm = gemm;
        if (rows && rows[e] == 0) continue;
        MM_CHECK(mm_sv_prepare(set, e, (char *)mem + head + per * (size_t)e, &pw[e]));
    }
    *pw_p = pw;
    return MEGAMOE_OK;
}

/* The local experts: every tile of every expert with rows, results in place. */
static megamoe_status_t mm_sv_run_routed(megamoe_symm_buffer_t *b, const mm_sv_call_t *c,
                                         const mm_sv_plan_t *pl,
                                         const mm_gemm_backend_ops_t *gemm)
{
    const mm_sv_experts_t *set = &c->routed;
    int64_t n_units = 0;
    for (int64_t j = 0; j < c->L; j++)
        n_units += (pl->grp_off[j + 1] - pl->grp_off[j] + MM_SV_TILE - 1) / MM_SV_TILE;
    mm_sv_unit_t *units = NULL;
    MM_CHECK(mm_sv_scratch(b, SCR_UNITS, sizeof *units * (size_t)(n_units + 1), (void **)&units));
    mm_sv_work_t w;
    memset(&w, 0, sizeof w);
    w.c = c;
    w.set = set;
    w.base = b->recv;
    w.ld = b->row_bytes;
    w.combine_q = (int)b->p.combine_quant_mode;
    if (set->scene >= MM_SV_A8W8_FP) { /* MX: decode one expert's weights at a time */
        void *prep = NULL;
        MM_CHECK(mm_sv_scratch(b, SCR_PREP, mm_sv_prepare_bytes(set), &prep));
        for (int64_t j = 0; j < c->L; j++) {
            const int64_t rows = pl->grp_off[j + 1] - pl->grp_off[j];
            if (rows == 0) continue;
            mm_sv_prepared_t pw;
            pw.gemm = gemm;
            MM_CHECK(mm_sv_prepare(set, (int)j, prep, &pw));
            w.pw = &pw;
            w.units = units;
            w.n_units = mm_sv_cut(units, 0, (int)j, pl->grp_off[j], rows);
            MM_CHECK(mm_sv_run(b, &w));
        }
        return MEGAMOE_OK;
    }
    int64_t *rows = NULL;
    MM_CHECK(mm_sv_scratch(b, SCR_ROWS, sizeof *rows * (size_t)c->L, (void **)&rows));
    for (int64_t j = 0; j < c->L; j++) rows[j] = pl->grp_off[j + 1] - pl->grp_off[j];
    mm_sv_prepared_t *pw = NULL;
    MM_CHECK(mm_sv_prepare_all(b, set, gemm, SCR_PREP, rows, &pw));
    int64_t n = 0;
    for (int64_t j = 0; j < c->L; j++) n = mm_sv_cut(units, n, (int)j, pl->grp_off[j], rows[j]);
    w.pw = pw;
    w.units = units;
    w.n_units = n;
    return mm_sv_run(b, &w);
}

/* The shared experts on this rank's active tokens, summed into shared (fp32 [n, H], token
 * rows; inactive rows unused). */
static megamoe_status_t mm_sv_run_shared(megamoe_symm_buffer_t *b, const mm_sv_call_t *c,
                                         const mm_gemm_backend_ops_t *gemm, float **shared_p)
{
    float *shared = NULL;
    MM_CHECK(mm_sv_scratch(b, SCR_SHARED, (size_t)c->n * (size_t)c->H * 4 + (size_t)c->n * 8 + 64,
                           (void **)&shared));
    int64_t *tok = (int64_t *)(void *)(shared + c->n * c->H);
    int64_t na = 0;
    for (int64_t t = 0; t < c->n; t++)
        if (mm_sv_active(c, t)) tok[na++] = t;
    memset(shared, 0, (size_t)na * (size_t)c->H * 4);
    *shared_p = shared;
    if (na == 0) return MEGAMOE_OK;
    mm_sv_prepared_t *pw = NULL;
    MM_CHECK(mm_sv_prepare_all(b, &c->shared, gemm, SCR_SPREP, NULL, &pw));
    mm_sv_unit_t *units = NULL;
    MM_CHECK(mm_sv_scratch(b, SCR_UNITS, sizeof *units * (size_t)(na / MM_SV_TILE + 2),
                           (void **)&units));
    mm_sv_work_t w;
    memset(&w, 0, sizeof w);
    w.c = c;
    w.set = &c->shared;
    w.pw = pw;
    w.units = units;
    w.n_units = mm_sv_cut(units, 0, 0, 0, na);
    w.acc = shared;
    w.x = c->x;
    w.tok = tok;
    MM_CHECK(mm_sv_run(b, &w));
    /* the active tokens' sums to their token rows (backwards: tok[i] >= i) */
    for (int64_t i = na - 1; i >= 0; i--)
        if (tok[i] != i) memmove(shared + tok[i] * c->H, shared + i * c->H, (size_t)c->H * 4);
    return MEGAMOE_OK;
}

/* ---- combine --------------------------------------------------------------------------- */

/* The sums of tokens [t0, t1), on a pool worker (acc, deq: its [H] fp32 rows). */
typedef struct mm_sv_red {
    const megamoe_symm_buffer_t *b;
    const mm_sv_call_t *c;
    const int64_t *pair_row, *pair_pos;
    const char *stage;
    const float *shared;
    float *acc; /* [workers][2][H] */
} mm_sv_red_t;

static megamoe_status_t mm_sv_reduce_part(void *arg, int worker, int nw)
{
    const mm_sv_red_t *r = arg;
    const megamoe_symm_buffer_t *b = r->b;
    const mm_sv_call_t *c = r->c;
    const int64_t H = c->H, K = c->K, hs = (int64_t)mm_align_up((size_t)H, 16);
    const size_t rb = b->row_bytes;
    const int cq = (int)b->p.combine_quant_mode;
    float *acc = r->acc + (size_t)worker * 2 * (size_t)hs, *deq = acc + hs;
    int64_t t0, t1;
    mm_pool_split(c->n, worker, nw, 1, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        uint16_t *y = c->y + t * H;
        if (!mm_sv_active(c, t)) {
            memset(y, 0, (size_t)H * 2);
            continue;
        }
        for (int64_t h = 0; h < H; h++) acc[h] = 0.0f;
        for (int64_t k = 0; k < K; k++) { /* k ascending, then the shared experts */
            const int64_t pr = r->pair_row[t * K + k];
            if (pr < 0) continue;
            const int d = (int)(pr >> 40);
            const int64_t row = pr & (((int64_t)1 << 40) - 1);
            const uint8_t *src = mm_shmem_ptr((const char *)b->recv + (size_t)row * rb, b->pes[d]);
            if (src == NULL) src = (const uint8_t *)r->stage + (size_t)r->pair_pos[t * K + k] * rb;
            const float w = mm_sv_w(c, t * K + k);
            if (cq) {
                MM_CHECK(mm_comm_dequant_mx_f32(src, src + H,
                                                cq == 3 ? MEGAMOE_DTYPE_FP8_E5M2
                                                        : MEGAMOE_DTYPE_FP8_E4M3FN,
                                                H, deq));
                mm_rows_axpy_f32(acc, deq, w, H);
            } else { /* acc += w * row: one fp32 multiply and add per element (rows.h) */
                mm_rows_axpy(MEGAMOE_DTYPE_BF16, acc, src, w, H);
            }
        }
        if (r->shared) mm_rows_axpy_f32(acc, r->shared + t * H, 1.0f, H);
        MM_CHECK(megamoe_convert(y, MEGAMOE_DTYPE_BF16, acc, MEGAMOE_DTYPE_FP32, (size_t)H));
    }
    return MEGAMOE_OK;
}

static megamoe_status_t mm_sv_reduce(megamoe_symm_buffer_t *b, const mm_sv_call_t *c,
                                     const mm_sv_plan_t *pl, const int64_t *pair_row,
                                     const int64_t *pair_pos, const int64_t *prefix, char *stage,
                                     int pushed, const float *shared)
{
    const size_t rb = b->row_bytes;
    /* results of owners on other hosts: one get per (owner, expert) block into the staging
     * rows, all in flight together (one after another, each cost a round trip: at 8 tokens per
     * rank ~24 of them) */
    const int32_t *mine = pl->rec[pl->part_of[b->me]]->counts;
    if (stage && !pushed) {
        mm_shmem_get_op_t *gets = NULL;
        MM_CHECK(mm_sv_scratch(b, SCR_GETS, sizeof *gets * (size_t)c->E, (void **)&gets));
        int ng = 0;
        for (int64_t e = 0; e < c->E; e++) {
            if (mine[e] == 0 || pl->dst_off[e] < 0 || !mm_sv_remote(b, (int)(e / c->L))) continue;
            gets[ng++] = (mm_shmem_get_op_t){stage + (size_t)prefix[e] * rb,
                                             (char *)b->recv + (size_t)pl->dst_off[e] * rb,
                                             (size_t)mine[e] * rb, b->pes[e / c->L]};
        }
        MM_CHECK(mm_shmem_get_many(gets, ng));
    }
    /* then the sums, tokens split over the pool (each token's order fixed: the same bits) */
    const size_t hs = mm_align_up((size_t)c->H, 16);
    mm_sv_red_t r = {b, c, pair_row, pair_pos, stage, shared, NULL};
    MM_CHECK(mm_sv_scratch(b, SCR_FETCH, sizeof(float) * 2 * hs * (size_t)b->workers,
                           (void **)&r.acc));
    if (c->n == 0) return MEGAMOE_OK;
    return mm_pool_run(b->pool, mm_sv_reduce_part, &r);
}

/* ---- the call -------------------------------------------------------------------------- */

/* The host-scheduled path: dispatch, shared experts, the local experts, each a phase. */
static megamoe_status_t mm_sv_call_host(megamoe_symm_buffer_t *b, mm_sv_call_t *cp,
                                        const mm_sv_plan_t *plp, const mm_gemm_backend_ops_t *gemm,
                                        uint64_t gen, megamoe_status_t work, int64_t *pair_row,
                                        int64_t *pair_pos, int64_t *next, int64_t *prefix,
                                        char **stage_p, float **shared_p, int *waited_p)
{
    mm_sv_call_t c = *cp;
    const mm_sv_plan_t pl = *plp;
    megamoe_status_t st;
    *waited_p = 0;
    /* ---- dispatch; shared experts overlap the peers' dispatch ---- */
    if (work == MEGAMOE_OK)
        work = mm_sv_dispatch(b, &c, &pl, pair_row, pair_pos, next, prefix, stage_p);
    mm_sv_signal(b, &pl, MM_SV_DISPATCH, gen, work);
    if (work == MEGAMOE_OK && c.shared.count > 0 && c.n > 0)
        work = mm_sv_run_shared(b, &c, gemm, shared_p);
    int failed = -1;
    megamoe_status_t fst = MEGAMOE_OK;
    st = mm_sv_wait(b, &pl, MM_SV_DISPATCH, gen, &failed, &fst);
    if (st != MEGAMOE_OK) return st;

    /* ---- the local experts, results in place ---- */
    if (work == MEGAMOE_OK && failed < 0) {
        for (int64_t j = 0; j < c.L; j++)
            c.expert_token_nums[j] = (int32_t)(pl.grp_off[j + 1] - pl.grp_off[j]);
        work = mm_sv_run_routed(b, &c, &pl, gemm);
        cp->expert_token_nums = c.expert_token_nums;
    }
    mm_sv_signal(b, &pl, MM_SV_COMBINE, gen, work != MEGAMOE_OK ? work : fst);
    int failed2 = -1;
    megamoe_status_t fst2 = MEGAMOE_OK;
    st = mm_sv_wait(b, &pl, MM_SV_COMBINE, gen, &failed2, &fst2);
    *waited_p = st == MEGAMOE_OK; /* (after a lost peer or a timeout the group is broken) */
    if (st == MEGAMOE_OK && failed < 0 && failed2 >= 0) {
        failed = failed2;
        fst = fst2;
    }
    if (st == MEGAMOE_OK && work != MEGAMOE_OK) st = work; /* our own message */
    else if (st == MEGAMOE_OK && failed >= 0)
        st = mm_error(fst, "mega_moe: rank %d failed after the exchange with %s (its log names the "
                      "cause); no output was written", b->pes[failed], megamoe_status_name(fst));
    return st;
}

/* The O1 path: everything the launch needs, the launch, the shared experts' rows in place. */
static megamoe_status_t mm_sv_call_o1(megamoe_symm_buffer_t *b, const mm_sv_call_t *c,
                                      const mm_sv_plan_t *pl, const mm_gemm_backend_ops_t *gemm,
                                      megamoe_status_t local, int64_t *pair_row, int64_t *pair_pos,
                                      int64_t *next, int64_t *prefix, char **stage_p,
                                      int *pushed_p, float **shared_p)
{
    const size_t rb = b->row_bytes;
    const int atype = c->routed.atype;
    mm_sv_o1_call_t k;
    memset(&k, 0, sizeof k);
    k.c = c;
    k.pl = pl;
    k.mine = pl->rec[pl->part_of[b->me]]->counts;
    k.prefix = prefix;
    k.wire = atype == MEGAMOE_SERVE_TYPE_BF16 ? (size_t)c->H * 2 : rb;
    int32_t *perm = (int32_t *)(void *)(prefix + c->E);
    k.perm = perm;
    if (local == MEGAMOE_OK) mm_sv_pairs(b, c, pl, pair_row, pair_pos, next, prefix, perm);
    /* tokens quantised once, before the dispatch tiles read them */
    if (local == MEGAMOE_OK && atype != MEGAMOE_SERVE_TYPE_BF16 && c->n > 0) {
        char *qx = NULL;
        local = mm_sv_scratch(b, SCR_QX, (size_t)c->n * rb, (void **)&qx);
        for (int64_t t = 0; local == MEGAMOE_OK && t < c->n; t++)
            if (mm_sv_active(c, t)) mm_sv_row_quant(c->x + t * c->H, atype, c->H, qx + (size_t)t * rb);
        k.qx = qx;
    }
    int64_t total = 0, remote = 0;
    for (int64_t e = 0; e < c->E; e++) {
        total += k.mine[e];
        if (k.mine[e] && pl->dst_off[e] >= 0 && mm_sv_remote(b, (int)(e / c->L))) remote = 1;
    }
    if (local == MEGAMOE_OK && remote)
        local = mm_sv_scratch(b, SCR_STAGE, (size_t)(total > 0 ? total : 1) * rb, (void **)stage_p);
    k.stage = *stage_p;
    /* Across hosts the owners put the results of a source's rows back into the source's
     * return rows (after its receive rows, laid out as its staging rows: its order) before
     * their DONE, which the engine applies after them, so the source finds every result in
     * its own memory when the launch ends: no round trip after it. ret[q * L + j]: the row on
     * participant q (on another host) of its first pair of local expert j, else -1. */
    *pushed_p = 0;
    int64_t *ret = NULL;
    const int64_t L = c->L;
    if (local == MEGAMOE_OK)
        local = mm_sv_scratch(b, SCR_RET, sizeof *ret * (size_t)(pl->np * L), (void **)&ret);
    for (int q = 0; local == MEGAMOE_OK && q < pl->np; q++) {
        const int d = pl->member[q];
        const int back = b->ret_rows > 0 && d != b->me && mm_sv_remote(b, d);
        int64_t at = b->cap; /* + q's pairs of the experts before local expert j */
        for (int64_t e = 0; e < (int64_t)b->me * L; e++) at += pl->rec[q]->counts[e];
        for (int64_t j = 0; j < L; j++) {
            ret[q * L + j] = back ? at : -1;
            at += pl->rec[q]->counts[(int64_t)b->me * L + j];
        }
    }
    if (local == MEGAMOE_OK && remote && b->ret_rows > 0) { /* (pairs <= n * K <= ret_rows) */
        *pushed_p = 1; /* read them there: the same layout as the staging rows */
        *stage_p = (char *)b->recv + (size_t)b->cap * rb;
    }
    k.ret = ret;
    /* the weights: cache lookups and per-channel terms, on this thread */
    int64_t *rows = NULL;
    if (local == MEGAMOE_OK) local = mm_sv_scratch(b, SCR_ROWS, sizeof *rows * (size_t)c->L, (void **)&rows);
    for (int64_t j = 0; local == MEGAMOE_OK && j < c->L; j++) rows[j] = pl->grp_off[j + 1] - pl->grp_off[j];
    mm_sv_prepared_t *pw = NULL, *spw = NULL;
    if (local == MEGAMOE_OK) local = mm_sv_prepare_all(b, &c->routed, gemm, SCR_PREP, rows, &pw);
    k.pw = pw;
    size_t tb = mm_sv_worker_bytes(b, &c->routed);
    if (local == MEGAMOE_OK && c->shared.count > 0 && c->n > 0) {
        float *acc = NULL;
        local = mm_sv_scratch(b, SCR_SHARED, (size_t)c->n * (size_t)c->H * 4 + (size_t)c->n * 8 + 64,
                              (void **)&acc);
        if (local == MEGAMOE_OK) {
            int64_t *tok = (int64_t *)(void *)(acc + c->n * c->H), na = 0;
            for (int64_t t = 0; t < c->n; t++)
                if (mm_sv_active(c, t)) tok[na++] = t;
            memset(acc, 0, (size_t)na * (size_t)c->H * 4);
            k.acc = acc;
            k.tok = tok;
            k.n_active = na;
            *shared_p = acc;
            local = mm_sv_prepare_all(b, &c->shared, gemm, SCR_SPREP, NULL, &spw);
            k.spw = spw;
            const size_t sb = mm_sv_worker_bytes(b, &c->shared);
            if (sb > tb) tb = sb;
        }
    }
    char *tiles = NULL;
    if (local == MEGAMOE_OK) local = mm_sv_scratch(b, SCR_TILES, tb * (size_t)b->workers, (void **)&tiles);
    k.tiles = tiles;
    k.tile_bytes = tb;
    megamoe_status_t st = mm_sv_o1_run(b, &k, local);
    if (st != MEGAMOE_OK) return st;
    for (int64_t j = 0; j < c->L; j++)
        c->expert_token_nums[j] = (int32_t)(pl->grp_off[j + 1] - pl->grp_off[j]);
    if (k.acc) /* the active tokens' sums to their token rows (backwards: tok[i] >= i) */
        for (int64_t i = k.n_active - 1; i >= 0; i--)
            if (k.tok[i] != i) memmove(k.acc + k.tok[i] * c->H, k.acc + i * c->H, (size_t)c->H * 4);
    return MEGAMOE_OK;
}

/* Before this rank's rows take new data: every participant of its last call finished reading
 * them. A lost peer reads nothing more; a participant of this call too enters this call's
 * exchange only after it finished the last one (nobody writes before the exchange). */
static megamoe_status_t mm_sv_wait_readers(megamoe_symm_buffer_t *b)
{
    for (int i = 0; i < b->prev_n; i++) {
        const int s = b->prev[i];
        if (!mm_shmem_pe_alive(b->pes[s]) || !(b->mask && b->mask[s])) continue;
        megamoe_status_t st = mm_shmem_signal_wait_until(mm_sv_line(b, MM_SV_READ, s),
                                                         MM_SHMEM_CMP_GE, b->prev_gen, NULL);
        if (st != MEGAMOE_OK) {
            b->broken = st != MEGAMOE_PEER_LOST;
            return st;
        }
    }
    b->prev_n = 0;
    return MEGAMOE_OK;
}

/* This call read (or will read) nothing more from the participants' rows: tell each. */
static void mm_sv_done_reading(megamoe_symm_buffer_t *b, const mm_sv_plan_t *pl, uint64_t gen)
{
    for (int i = 0; i < pl->np; i++) {
        int p = (pl->part_of[b->me] + i) % pl->np, d = pl->member[p];
        mm_sv_signal_to(b, mm_sv_line(b, MM_SV_READ, b->me), gen, b->pes[d]);
    }
    for (int i = 0; i < pl->np; i++) b->prev[i] = pl->member[i];
    b->prev_n = pl->np;
    b->prev_gen = gen;
}

static megamoe_status_t mm_sv_body(megamoe_symm_buffer_t *b, const megamoe_mega_moe_args_t *a)
{
    MM_CHECK(mm_sv_runtime_mask(b)); /* lost ranks (serve_survive.c) */
    mm_sv_order_t *order = NULL;
    MM_CHECK(mm_sv_order(b, &order)); /* a masked rank's own mistake: local */
    MM_CHECK(mm_sv_wait_readers(b));
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
        int sched = 0;
        if (mm_env_enum(MM_ENV_SERVE_SCHEDULE, &sched) != MEGAMOE_OK) sched = 0;
        c.set.schedule = sched;
        mine->n = c.n;
        mine->set = c.set;
        local = mm_sv_count(b, &c, mine->counts);
    }
    /* the first exchange: order, statuses, counts, settings */
    mm_call_t call;
    mm_call_begin(&call, &order->calls, MM_CALL_MEGA_MOE, b->id, 0);
    megamoe_status_t st = mm_call_exchange(&call, order->team, local, mine, pbytes);
    if (st == MEGAMOE_TIMEOUT) b->broken = 1; /* a loss: the next call runs among the survivors */
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
    /* the path: the same on every rank (from agreed facts: the participants, the scene, the
     * schedule setting compared above, the buffer's executor made collectively) */
    const int use_o1 = c.set.schedule != 2 && mm_sv_o1_usable(b) && order->team == b->team &&
                       c.routed.scene < MM_SV_A8W8_FP;
    c.routed.version = c.shared.version = a->weights_version;
    c.routed.stamp = c.shared.stamp = mm_sv_wcache_begin();

    int64_t *pair_row = NULL;
    char *stage = NULL;
    megamoe_status_t work = mm_sv_scratch(b, SCR_PAIRS,
                                          sizeof(int64_t) * (size_t)(2 * c.n * c.K + 2 * E) +
                                              sizeof(int32_t) * (size_t)(c.n * c.K) + 64,
                                          (void **)&pair_row);
    int64_t *pair_pos = pair_row + c.n * c.K, *next = pair_pos + c.n * c.K, *prefix = next + E;
    float *shared = NULL;
    int waited = 0, pushed = 0;
    if (use_o1) {
        st = mm_sv_call_o1(b, &c, &pl, gemm, work, pair_row, pair_pos, next, prefix, &stage,
                           &pushed, &shared);
        waited = st == MEGAMOE_OK || !b->broken;
    } else {
        st = mm_sv_call_host(b, &c, &pl, gemm, gen, work, pair_row, pair_pos, next, prefix,
                             &stage, &shared, &waited);
    }
    if (st == MEGAMOE_OK) st = mm_sv_reduce(b, &c, &pl, pair_row, pair_pos, prefix, stage, pushed, shared);
    /* it reads nothing more of this call, also after a failure (a lost peer included: the
     * survivors go on); not after a timeout (the buffer is broken) */
    if (waited || !b->broken) mm_sv_done_reading(b, &pl, gen);
    if (st == MEGAMOE_OK) {
        b->calls++;
        b->o1_calls += (uint64_t)use_o1;
        b->last_recv_rows = pl.recv_rows;
    }
    mm_call_end(&call);
    return st;
}

megamoe_status_t megamoe_mega_moe(megamoe_symm_buffer_t *b, const megamoe_mega_moe_args_t *caller)
{
    MM_CHECK(mm_sv_buffer_check(b, "mega_moe"));
    int idle = 0;
    if (!atomic_compare_exchange_strong(&b->busy, &idle, 1))
        return mm_error(MEGAMOE_INVALID_STATE, "mega_moe: the buffer is in use by another thread; "
                        "calls on one buffer are serialised by the caller");
    /* the caller's struct by its struct_size (a bad one is this rank's argument error, taken
     * into the call's exchange like any other) */
    megamoe_mega_moe_args_t copy = megamoe_mega_moe_args_default();
    const megamoe_mega_moe_args_t *a = NULL;
    if (caller != NULL && mm_abi_copy_in(&copy, sizeof copy, caller, "megamoe_mega_moe_args_t") == MEGAMOE_OK)
        a = &copy;
    else if (caller != NULL)
        megamoe_fail_next_call(MEGAMOE_INVALID_ARGUMENT, megamoe_last_error());
    megamoe_status_t st = mm_sv_body(b, a);
    atomic_store(&b->busy, 0);
    return st;
}
