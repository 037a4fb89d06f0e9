/* Hot-expert replicas of MegaMoeExperts: publication, guest weight copies, weight-gradient
 * partials and their sum (see moe_replicas.h). */
#include "moe/moe_replicas.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "ops/ep_exchange.h"

#define MM_REP_HEADER 64 /* the publication header line: its sequence number */

static size_t mm_rep_pub_stride(int64_t H, int64_t I)
{
    return mm_align_up(MM_REP_HEADER + (size_t)(3 * H * I) * 2, 4096);
}

size_t mm_moe_rep_heap_bytes(const mm_moe_config_t *c)
{
    if (c->replicas <= 0) return 0;
    const int64_t L = c->E / c->ep;
    return (size_t)L * mm_rep_pub_stride(c->H, c->I) +
           mm_align_up((size_t)c->replicas * (size_t)(3 * c->H * c->I) * 4, 4096);
}

/* ---- group areas ---------------------------------------------------------------------------- */

megamoe_status_t mm_moe_rep_group_create(mm_moe_group_t *g)
{
    const mm_moe_config_t *c = &g->cfg;
    if (c->replicas <= 0) return MEGAMOE_OK;
    mm_moe_rep_group_t *r = calloc(1, sizeof *r);
    megamoe_status_t st = r ? MEGAMOE_OK : mm_error(MEGAMOE_OUT_OF_MEMORY, "replica areas");
    if (st == MEGAMOE_OK) {
        r->R = c->replicas;
        r->L = c->E / c->ep;
        r->H = c->H;
        r->I = c->I;
        r->pub_stride = mm_rep_pub_stride(c->H, c->I);
        r->part_stride = (size_t)(3 * c->H * c->I);
        r->pub_of = calloc((size_t)r->L, sizeof *r->pub_of);
        r->hpart_tab = calloc((size_t)r->L, sizeof *r->hpart_tab);
        if (r->pub_of == NULL || r->hpart_tab == NULL)
            st = mm_error(MEGAMOE_OUT_OF_MEMORY, "replica publication table");
    }
    /* the symmetric allocations are collective: every rank takes part or none */
    st = mm_shmem_team_agree(g->team, st);
    void *pub = NULL, *part = NULL;
    if (st == MEGAMOE_OK) st = mm_shmem_team_malloc(g->team, (size_t)r->L * r->pub_stride, 4096, &pub);
    if (st == MEGAMOE_OK)
        st = mm_shmem_team_malloc(g->team, mm_align_up((size_t)r->R * r->part_stride * 4, 4096),
                                  4096, &part);
    if (st != MEGAMOE_OK) {
        if (part) mm_shmem_team_free(g->team, part);
        if (pub) mm_shmem_team_free(g->team, pub);
        if (r) free(r->pub_of);
        if (r) free(r->hpart_tab);
        free(r);
        return st;
    }
    r->pub = pub;
    r->part = part;
    /* headers 0: nothing published (a guest only reads after its home's ready signal) */
    for (int64_t j = 0; j < r->L; j++) memset(r->pub + (size_t)j * r->pub_stride, 0, MM_REP_HEADER);
    g->rep = r;
    return MEGAMOE_OK;
}

megamoe_status_t mm_moe_rep_group_destroy(mm_moe_group_t *g)
{
    mm_moe_rep_group_t *r = g->rep;
    if (r == NULL) return MEGAMOE_OK;
    megamoe_status_t st = mm_shmem_team_free(g->team, r->part); /* reverse order of allocation */
    megamoe_status_t s2 = mm_shmem_team_free(g->team, r->pub);
    if (st == MEGAMOE_OK) st = s2;
    mm_aligned_free(r->hpart);
    free(r->hpart_tab);
    free(r->pub_of);
    free(r);
    g->rep = NULL;
    return st;
}

/* ---- guest weight copies --------------------------------------------------------------------- */

void mm_moe_guest_ref(mm_moe_guest_w_t *gw)
{
    if (gw) atomic_fetch_add(&gw->refs, 1);
}

void mm_moe_guest_unref(mm_moe_guest_w_t *gw)
{
    if (gw == NULL || atomic_fetch_sub(&gw->refs, 1) != 1) return;
    mm_gemm_weight_destroy(gw->nn1);
    mm_gemm_weight_destroy(gw->nn2);
    mm_gemm_weight_destroy(gw->nt1);
    mm_gemm_weight_destroy(gw->nt2);
    mm_aligned_free(gw->w1);
    mm_aligned_free(gw->w2);
    free(gw);
}

static megamoe_status_t mm_guest_w_new(int64_t H, int64_t I, mm_moe_guest_w_t **gw_p)
{
    mm_moe_guest_w_t *gw = calloc(1, sizeof *gw);
    if (gw == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "guest expert weights");
    atomic_init(&gw->refs, 1);
    gw->expert = -1;
    gw->H = H;
    gw->I = I;
    megamoe_status_t st =
        mm_aligned_alloc((size_t)(H * 2 * I) * 2, 64, "guest gate_up weights", (void **)&gw->w1);
    if (st == MEGAMOE_OK)
        st = mm_aligned_alloc((size_t)(I * H) * 2, 64, "guest down weights", (void **)&gw->w2);
    if (st != MEGAMOE_OK) {
        mm_moe_guest_unref(gw);
        return st;
    }
    *gw_p = gw;
    return MEGAMOE_OK;
}

megamoe_status_t mm_moe_rep_layer_create(megamoe_experts_t *x)
{
    const int R = x->cfg.replicas;
    if (R <= 0) return MEGAMOE_OK;
    mm_moe_rep_layer_t *r = calloc(1, sizeof *r);
    if (r == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "replica state");
    r->R = R;
    r->ep = x->ep;
    r->cache = calloc((size_t)R, sizeof *r->cache);
    r->cur = calloc((size_t)R, sizeof *r->cur);
    r->slot_expert = calloc((size_t)x->ep * (size_t)R, sizeof *r->slot_expert);
    r->slot_rows = calloc((size_t)x->ep * (size_t)R, sizeof *r->slot_rows);
    if (!r->cache || !r->cur || !r->slot_expert || !r->slot_rows) {
        x->rep = r;
        mm_moe_rep_layer_destroy(x);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "replica state");
    }
    for (int q = 0; q < x->ep * R; q++) r->slot_expert[q] = -1;
    int hosts = 0;
    for (int i = 0; i < x->ep; i++) {
        int h = mm_shmem_host_of(mm_shmem_team_world_pe(x->team, i));
        hosts |= h != mm_shmem_host_of(mm_shmem_team_world_pe(x->team, 0));
    }
    if (hosts) {
        r->host_of = calloc((size_t)x->ep, sizeof *r->host_of);
        if (r->host_of == NULL) {
            x->rep = r;
            mm_moe_rep_layer_destroy(x);
            return mm_error(MEGAMOE_OUT_OF_MEMORY, "replica host map");
        }
        for (int i = 0; i < x->ep; i++)
            r->host_of[i] = mm_shmem_host_of(mm_shmem_team_world_pe(x->team, i));
    }
    x->rep = r;
    return MEGAMOE_OK;
}

void mm_moe_rep_layer_destroy(megamoe_experts_t *x)
{
    mm_moe_rep_layer_t *r = x->rep;
    if (r == NULL) return;
    for (int g = 0; r->cache && g < r->R; g++) mm_moe_guest_unref(r->cache[g]);
    for (int g = 0; r->cur && g < r->R; g++) mm_moe_guest_unref(r->cur[g]);
    free(r->cache);
    free(r->cur);
    free(r->slot_expert);
    free(r->slot_rows);
    free(r->host_of);
    free(r);
    x->rep = NULL;
}

void mm_moe_rep_shape(const megamoe_experts_t *x, mm_ep_shape_t *shape)
{
    shape->replica_slots = x->cfg.replicas;
    shape->replica_cost = mm_ep_replica_cost_default();
    /* the SHMEM runtime's host of every EP member (NULL when they share one): the planner
     * charges the higher cross-host costs to guests on another host than their home */
    shape->host_of = x->rep ? x->rep->host_of : NULL;
}

/* ---- forward ---------------------------------------------------------------------------------- */

megamoe_status_t mm_moe_rep_publish(megamoe_experts_t *x, const megamoe_experts_weights_t *w,
                                    const mm_ep_plan_t *plan, mm_mc_exec_t *exec)
{
    mm_moe_rep_group_t *r = x->group->rep;
    if (r == NULL || plan->rep == NULL) return MEGAMOE_OK;
    megamoe_status_t st = MEGAMOE_OK;
    const int nslots = x->ep * r->R;
    const int64_t H = r->H, I = r->I;
    const size_t b1 = (size_t)(H * 2 * I) * 2, b2 = (size_t)(I * H) * 2;
    for (int64_t j = 0; j < r->L; j++) {
        const int64_t e = (int64_t)x->me * r->L + j;
        int any = 0;
        for (int q = 0; q < nslots && !any; q++) any = plan->rep->slot_expert[q] == e;
        if (!any) continue;
        const char *w1 = (const char *)w->gate_up + (size_t)j * b1;
        const char *w2 = (const char *)w->down + (size_t)j * b2;
        struct mm_moe_pub_of *po = &r->pub_of[j];
        if (po->seq == 0 || po->layer != x->serial || po->version != w->version ||
            po->w1 != (const void *)w1 || po->w2 != (const void *)w2) {
            char *slot = r->pub + (size_t)j * r->pub_stride;
            memcpy(slot + MM_REP_HEADER, w1, b1);
            memcpy(slot + MM_REP_HEADER + b1, w2, b2);
            po->seq = ++r->seq;
            po->layer = x->serial;
            po->version = w->version;
            po->w1 = w1;
            po->w2 = w2;
            __atomic_store_n((uint64_t *)(void *)slot, po->seq, __ATOMIC_RELEASE);
        }
        if (exec == NULL) continue; /* O0: the dispatch exchange orders the copy */
        for (int q = 0; q < nslots; q++)
            if (plan->rep->slot_expert[q] == e) {
                megamoe_status_t s = mm_shmem_signal_op(
                    mm_mc_ready_line(exec, q % r->R), mm_mc_generation(exec) + 1,
                    MM_SHMEM_SIGNAL_SET, x->group->xbuf->pes[q / r->R]);
                if (st == MEGAMOE_OK) st = s;
            }
    }
    return st;
}

/* Read n bytes at offset off of home pe's publication slot j: direct loads when the peer heap
 * is mapped here, a one-sided get otherwise. */
static megamoe_status_t mm_rep_read_pub(const mm_moe_rep_group_t *r, int pe, int64_t j,
                                        size_t off, void *dst, size_t n)
{
    const char *sym = r->pub + (size_t)j * r->pub_stride + off;
    const char *mapped = mm_ep_force_puts ? NULL : mm_shmem_ptr(sym, pe);
    if (mapped) memcpy(dst, mapped, n);
    else return mm_shmem_get(dst, sym, n, pe);
    return MEGAMOE_OK;
}

megamoe_status_t mm_moe_rep_fetch(megamoe_experts_t *x, int g, int64_t e)
{
    mm_moe_rep_group_t *r = x->group->rep;
    mm_moe_rep_layer_t *lr = x->rep;
    const int64_t H = r->H, I = r->I, j = e % r->L;
    const int pe = x->group->xbuf->pes[e / r->L];
    uint64_t seq = 0;
    {
        const char *sym = r->pub + (size_t)j * r->pub_stride;
        const uint64_t *mapped = mm_ep_force_puts ? NULL : mm_shmem_ptr(sym, pe);
        if (mapped) seq = __atomic_load_n(mapped, __ATOMIC_ACQUIRE);
        else MM_CHECK(mm_shmem_get(&seq, sym, sizeof seq, pe));
    }
    mm_moe_guest_w_t *gw = lr->cache[g];
    if (gw == NULL || gw->expert != e || gw->seq != seq || gw->nn1 == NULL || gw->nn2 == NULL) {
        if (gw == NULL || atomic_load(&gw->refs) > 1) { /* a saved state still uses it */
            mm_moe_guest_w_t *fresh = NULL;
            MM_CHECK(mm_guest_w_new(H, I, &fresh));
            mm_moe_guest_unref(gw);
            lr->cache[g] = gw = fresh;
        }
        const size_t b1 = (size_t)(H * 2 * I) * 2, b2 = (size_t)(I * H) * 2;
        gw->expert = -1; /* invalid until packed (a failed read leaves it so) */
        MM_CHECK(mm_rep_read_pub(r, pe, j, MM_REP_HEADER, gw->w1, b1));
        MM_CHECK(mm_rep_read_pub(r, pe, j, MM_REP_HEADER + b1, gw->w2, b2));
        if (gw->nn1 == NULL)
            MM_CHECK(mm_gemm_weight_create(NULL, MM_GEMM_NN, H, 2 * I, gw->w1, 2 * I, seq, &gw->nn1));
        else
            MM_CHECK(mm_gemm_weight_update(gw->nn1, gw->w1, 2 * I, seq, NULL));
        if (gw->nn2 == NULL)
            MM_CHECK(mm_gemm_weight_create(NULL, MM_GEMM_NN, I, H, gw->w2, H, seq, &gw->nn2));
        else
            MM_CHECK(mm_gemm_weight_update(gw->nn2, gw->w2, H, seq, NULL));
        gw->expert = e;
        gw->seq = seq;
    }
    mm_moe_guest_ref(gw);
    lr->cur[g] = gw;
    return MEGAMOE_OK;
}

megamoe_status_t mm_moe_rep_pack_backward(mm_moe_guest_w_t *gw)
{
    const int64_t H = gw->H, I = gw->I;
    /* dA = dY · down[e]ᵀ: down read as [N=I, K=H]; dX = dGU · gate_up[e]ᵀ: [N=H, K=2I] */
    if (gw->nt2 == NULL)
        MM_CHECK(mm_gemm_weight_create(NULL, MM_GEMM_NT, H, I, gw->w2, H, gw->seq, &gw->nt2));
    else
        MM_CHECK(mm_gemm_weight_update(gw->nt2, gw->w2, H, gw->seq, NULL));
    if (gw->nt1 == NULL)
        MM_CHECK(mm_gemm_weight_create(NULL, MM_GEMM_NT, 2 * I, H, gw->w1, 2 * I, gw->seq, &gw->nt1));
    else
        MM_CHECK(mm_gemm_weight_update(gw->nt1, gw->w1, 2 * I, gw->seq, NULL));
    return MEGAMOE_OK;
}

megamoe_status_t mm_moe_rep_forward_done(megamoe_experts_t *x, const mm_ep_plan_t *plan,
                                         megamoe_experts_saved_t *sv, int ok)
{
    mm_moe_rep_layer_t *lr = x->rep;
    if (lr == NULL) return MEGAMOE_OK;
    for (int g = 0; g < lr->R; g++) {
        if (ok && sv != NULL && sv->guest != NULL) sv->guest[g] = lr->cur[g]; /* its reference */
        else mm_moe_guest_unref(lr->cur[g]);
        lr->cur[g] = NULL;
    }
    if (!ok || plan == NULL || plan->rep == NULL) return MEGAMOE_OK;
    const mm_ep_replica_plan_t *rp = plan->rep;
    const int nslots = rp->ep * rp->R;
    lr->n_guests = rp->n_guests;
    lr->rows_moved = rp->rows_moved;
    lr->max_rows_plain = lr->max_rows = 0;
    for (int d = 0; d < rp->ep; d++) {
        if (rp->load_plain[d] > lr->max_rows_plain) lr->max_rows_plain = rp->load_plain[d];
        if (rp->load[d] > lr->max_rows) lr->max_rows = rp->load[d];
    }
    for (int q = 0; q < nslots; q++) {
        lr->slot_expert[q] = rp->slot_expert[q];
        int64_t rows = 0;
        for (int s = 0; s < rp->ep; s++) rows += rp->take[(size_t)s * (size_t)nslots + (size_t)q];
        lr->slot_rows[q] = rows;
    }
    return MEGAMOE_OK;
}

void mm_moe_rep_note(const mm_ep_plan_t *plan, char *buf, size_t len)
{
    if (len == 0) return;
    buf[0] = '\0';
    const mm_ep_replica_plan_t *rp = plan ? plan->rep : NULL;
    if (rp == NULL) return;
    int64_t plain = 0, mx = 0;
    for (int d = 0; d < rp->ep; d++) {
        if (rp->load_plain[d] > plain) plain = rp->load_plain[d];
        if (rp->load[d] > mx) mx = rp->load[d];
    }
    size_t n = (size_t)snprintf(buf, len, "replicas:");
    const int nslots = rp->ep * rp->R;
    for (int q = 0; q < nslots && n < len; q++) {
        if (rp->slot_expert[q] < 0) continue;
        int64_t rows = 0;
        for (int s = 0; s < rp->ep; s++) rows += rp->take[(size_t)s * (size_t)nslots + (size_t)q];
        n += (size_t)snprintf(buf + n, len - n, " expert %d (rank %lld) on rank %d slot %d: %lld rows;",
                              (int)rp->slot_expert[q], (long long)(rp->slot_expert[q] / rp->L),
                              q / rp->R, q % rp->R, (long long)rows);
    }
    if (n < len)
        snprintf(buf + n, len - n, "%s slowest rank %lld -> %lld rows", rp->n_guests ? "" : " none;",
                 (long long)plain, (long long)mx);
}

void mm_moe_rep_saved_release(megamoe_experts_saved_t *sv)
{
    if (sv->guest == NULL) return;
    for (int g = 0; g < sv->n_guest; g++) mm_moe_guest_unref(sv->guest[g]);
    sv->guest = NULL; /* the table lives in the saved state's own block */
}

/* ---- backward --------------------------------------------------------------------------------- */

megamoe_status_t mm_moe_rep_backward_begin(mm_moe_bwd_ctx_t *c)
{
    megamoe_experts_t *x = c->x;
    mm_moe_rep_group_t *r = x->group->rep;
    c->guest = c->sv->guest;
    c->hpart = NULL;
    if (r == NULL || c->plan->rep == NULL) return MEGAMOE_OK;
    float **hpart_table = r->hpart_tab;
    for (int64_t j = 0; j < r->L; j++) hpart_table[j] = NULL;
    c->hpart = hpart_table;
    if (c->wg_type == MEGAMOE_DTYPE_FP32) return MEGAMOE_OK; /* partials go to the output */
    int32_t n_with = 0;
    const int nslots = x->ep * r->R;
    for (int64_t j = 0; j < r->L; j++)
        for (int q = 0; q < nslots; q++)
            if (c->plan->rep->slot_expert[q] == (int64_t)x->me * r->L + j) {
                n_with++;
                break;
            }
    if (n_with == 0) return MEGAMOE_OK;
    const size_t need = (size_t)n_with * r->part_stride * 4;
    if (r->hpart_bytes < need) {
        float *p = NULL;
        MM_CHECK(mm_aligned_alloc(need, 64, "home weight-gradient partials", (void **)&p));
        mm_aligned_free(r->hpart);
        r->hpart = p;
        r->hpart_bytes = need;
    }
    int32_t k = 0;
    for (int64_t j = 0; j < r->L; j++)
        for (int q = 0; q < nslots; q++)
            if (c->plan->rep->slot_expert[q] == (int64_t)x->me * r->L + j) {
                hpart_table[j] = r->hpart + (size_t)k++ * r->part_stride;
                break;
            }
    return MEGAMOE_OK;
}

void *mm_moe_rep_wgrad_dst(const mm_moe_bwd_ctx_t *c, int64_t j, int which,
                           megamoe_dtype_t *type_p)
{
    const megamoe_experts_t *x = c->x;
    const int64_t H = c->H, I = c->I, L = x->L;
    const size_t off = which == 1 ? 0 : (size_t)(H * 2 * I); /* floats into a partial */
    if (j >= L) {
        *type_p = MEGAMOE_DTYPE_FP32;
        return x->group->rep->part + (size_t)(j - L) * x->group->rep->part_stride + off;
    }
    if (c->hpart && c->hpart[j]) {
        *type_p = MEGAMOE_DTYPE_FP32;
        return c->hpart[j] + off;
    }
    *type_p = c->wg_type;
    const size_t es = megamoe_dtype_size(c->wg_type);
    return which == 1 ? (char *)c->dw1 + (size_t)(j * H * 2 * I) * es
                      : (char *)c->dw2 + (size_t)(j * I * H) * es;
}

void mm_moe_rep_wgrad_args(const mm_moe_bwd_ctx_t *c, const uint16_t *dgu, int64_t j, int which,
                           mm_gemm_args_t *g)
{
    const int64_t H = c->H, I = c->I, go = c->plan->group_off[j];
    g->form = MM_GEMM_TN;
    g->C = mm_moe_rep_wgrad_dst(c, j, which, &g->c_type);
    if (which == 2) { /* dW2_j[I, H] = A_jᵀ · dY_j */
        g->M = I;
        g->N = H;
        g->A = c->sv->a + go * I;
        g->lda = I;
        g->B = c->recv + go * H;
        g->ldb = H;
        g->ldc = H;
    } else { /* dW1_j[H, 2I] = X_jᵀ · dGU_j */
        g->M = H;
        g->N = 2 * I;
        g->A = c->sv->x + go * H;
        g->lda = H;
        g->B = dgu + go * 2 * I;
        g->ldb = 2 * I;
        g->ldc = 2 * I;
    }
}

/* acc[0..n) += the same floats of guest slot q's partial (rank q / R) at float offset off. A
 * failed get adds nothing from its piece (never an uninitialised buffer) and is returned. */
static megamoe_status_t mm_rep_add_partial(const megamoe_experts_t *x, float *acc, int q,
                                           size_t off, size_t n)
{
    const mm_moe_rep_group_t *r = x->group->rep;
    const float *sym = r->part + (size_t)(q % r->R) * r->part_stride + off;
    const int pe = x->group->xbuf->pes[q / r->R];
    const float *mapped = mm_ep_force_puts ? NULL : mm_shmem_ptr(sym, pe);
    if (mapped) {
        for (size_t i = 0; i < n; i++) acc[i] += mapped[i];
        return MEGAMOE_OK;
    }
    float buf[4096]; /* not mapped here: one-sided gets in pieces */
    for (size_t a = 0; a < n; a += 4096) {
        size_t k = n - a < 4096 ? n - a : 4096;
        MM_CHECK(mm_shmem_get(buf, sym + a, k * sizeof(float), pe));
        for (size_t i = 0; i < k; i++) acc[a + i] += buf[i];
    }
    return MEGAMOE_OK;
}

megamoe_status_t mm_moe_rep_wsum(const mm_moe_bwd_ctx_t *c, int64_t j, int64_t chunk,
                                 int64_t chunks, const int32_t *guests, int n)
{
    const megamoe_experts_t *x = c->x;
    const int64_t H = c->H, I = c->I;
    for (int which = 1; which <= 2; which++) {
        /* rows of dW1 [H, 2I] or dW2 [I, H] in this chunk (as the WGRAD chunks split them) */
        const int64_t rows = which == 1 ? H : I, cols = which == 1 ? 2 * I : H;
        int64_t m0, m1;
        mm_pool_split(rows, (int)chunk, (int)chunks, 16, &m0, &m1);
        if (m1 <= m0) continue;
        const size_t base = which == 1 ? 0 : (size_t)(H * 2 * I); /* floats into a partial */
        const size_t off = (size_t)(m0 * cols), cnt = (size_t)((m1 - m0) * cols);
        const size_t es = megamoe_dtype_size(c->wg_type);
        char *out = which == 1 ? (char *)c->dw1 + (size_t)(j * H * 2 * I) * es
                               : (char *)c->dw2 + (size_t)(j * I * H) * es;
        float *acc = c->wg_type == MEGAMOE_DTYPE_FP32 ? (float *)(void *)out + off
                                                      : c->hpart[j] + base + off;
        for (int i = 0; i < n; i++) MM_CHECK(mm_rep_add_partial(x, acc, guests[i], base + off, cnt));
        if (c->wg_type != MEGAMOE_DTYPE_FP32)
            MM_CHECK(megamoe_convert(out + off * es, c->wg_type, acc, MEGAMOE_DTYPE_FP32, cnt));
    }
    return MEGAMOE_OK;
}
