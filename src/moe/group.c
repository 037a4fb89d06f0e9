/* Execution-resource groups: the symmetric exchange buffers, worker pool and SHMEM reference
 * that one or more layers of the same configuration use serially.
 *
 * Lifecycle (seed "资源共享与关闭"): a group acquires SHMEM once, at its first forward, and
 * releases it once, when its last layer is closed, after freeing every symmetric buffer.
 *
 * Heap sizing: when this process starts the SHMEM runtime and HYPER_PARALLEL_SHMEM_HEAP_SIZE
 * is unset, the heap is sized for every open group of the process (prepared or not):
 * sum of (capacity + T*K) * H * 2 bytes + signal lines, page-rounded, plus 16 MiB of slack for
 * the runtime's own control buffers, rounded up to 64 MiB. When the heap is already fixed (set
 * by the variable, or started earlier) and too small, the error names the variable and the
 * size needed.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/env.h"
#include "base/error.h"
#include "moe/experts_impl.h"
#include "moe/moe_buffers.h"
#include "moe/moe_replicas.h"

#define MM_MOE_HEAP_SLACK ((size_t)16 << 20)
#define MM_MOE_HEAP_ROUND ((size_t)64 << 20)

static pthread_mutex_t mm_moe_registry_lock = PTHREAD_MUTEX_INITIALIZER;
static mm_moe_group_t *mm_moe_registry;

size_t mm_moe_heap_need(const mm_moe_config_t *c, int64_t rows)
{
    const int64_t tk = c->T * c->K;
    if (mm_moe_is_pull(c)) rows = tk; /* the sources' staging buffer replaces the receive one */
    size_t need = mm_ep_xbuf_heap_bytes((int)c->ep, rows, tk, (size_t)c->H * 2);
    if (mm_moe_is_o1(c)) need += mm_mc_heap_bytes((int)c->ep, c->E / c->ep, c->replicas);
    return need + mm_moe_rep_heap_bytes(c);
}

/* What to ask for when this process starts SHMEM with the heap size unset. */
static uint64_t mm_moe_heap_request(void)
{
    size_t total = 0;
    pthread_mutex_lock(&mm_moe_registry_lock);
    for (mm_moe_group_t *g = mm_moe_registry; g; g = g->next)
        if (g->open_layers > 0) total += g->heap_reserve;
    pthread_mutex_unlock(&mm_moe_registry_lock);
    return mm_align_up(total + MM_MOE_HEAP_SLACK, MM_MOE_HEAP_ROUND);
}

megamoe_status_t mm_moe_group_create(const mm_moe_config_t *cfg, mm_shmem_team_t *team,
                                     uint64_t id, int workers, int cube, int vector,
                                     mm_moe_group_t **group_p)
{
    /* MEGAMOE_GEMM once for the group, here on the caller's thread: its workers never read
     * the environment (docs/kernels.md "Backends and selection") */
    mm_gemm_choice_t gemm = MM_GEMM_CHOICE_AUTO;
    const mm_gemm_backend_ops_t *gemm_plain = NULL;
    MM_CHECK(mm_gemm_choice_from_env(&gemm));
    MM_CHECK(mm_gemm_backend_of(gemm, &gemm_plain));
    mm_moe_group_t *g = calloc(1, sizeof *g);
    if (g == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate a resource group");
    g->calls.id = id;
    g->calls.noun = "layer";
    mm_call_group_register(&g->calls);
    g->cfg = *cfg;
    g->team = team;
    g->workers = workers;
    g->cube = cube;
    g->vector = vector;
    g->gemm_choice = gemm;
    g->gemm_plain = gemm_plain;
    g->layers = 1;
    g->open_layers = 1;
    g->capacity = cfg->capacity;
    g->heap_bytes = mm_moe_heap_need(cfg, cfg->capacity);
    /* push: room for growth up to the lossless bound when this process sizes the heap */
    g->heap_reserve = cfg->mode == MM_MOE_PUSH ? mm_moe_heap_need(cfg, mm_moe_bound_rows(cfg))
                                               : g->heap_bytes;
    atomic_init(&g->busy, 0);
    pthread_mutex_lock(&mm_moe_registry_lock);
    g->next = mm_moe_registry;
    mm_moe_registry = g;
    pthread_mutex_unlock(&mm_moe_registry_lock);
    *group_p = g;
    return MEGAMOE_OK;
}

static void mm_moe_unregister(mm_moe_group_t *g)
{
    pthread_mutex_lock(&mm_moe_registry_lock);
    for (mm_moe_group_t **p = &mm_moe_registry; *p; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            break;
        }
    int last = mm_moe_registry == NULL;
    pthread_mutex_unlock(&mm_moe_registry_lock);
    if (last) mm_moe_buf_trim(); /* no layer left: give cached saved-state buffers back */
}

/* Free a group that was never prepared (merged away by share) or is fully torn down. */
static void mm_moe_group_free(mm_moe_group_t *g)
{
    mm_moe_unregister(g);
    /* (a closed group keeps its call numbers while a layer handle refers to it: a use after
     * close is still a call of the group, docs/moe.md "Call order") */
    mm_call_group_unregister(&g->calls);
    for (int i = 0; i < (int)(sizeof g->scratch.buf / sizeof g->scratch.buf[0]); i++)
        mm_aligned_free(g->scratch.buf[i]);
    free(g->growth);
    free(g);
}

static char *mm_moe_fmt_bytes(uint64_t b, char *out, size_t n)
{
    if (b >= (1ull << 30) && b % (1ull << 30) == 0) snprintf(out, n, "%lluG", (unsigned long long)(b >> 30));
    else snprintf(out, n, "%lluM", (unsigned long long)((b + (1ull << 20) - 1) >> 20));
    return out;
}

static megamoe_status_t mm_moe_heap_check(const mm_moe_group_t *g)
{
    mm_shmem_debug_state_t *ds = malloc(sizeof *ds);
    if (ds == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate the SHMEM state");
    megamoe_status_t st = mm_shmem_debug_state(ds);
    if (st == MEGAMOE_OK) {
        uint64_t free_bytes = ds->heap_size > ds->bytes_used ? ds->heap_size - ds->bytes_used : 0;
        /* a little room for the allocator's alignment of each buffer */
        uint64_t need = g->heap_bytes + 3 * 4096;
        if (free_bytes < need) {
            char want[32];
            mm_moe_fmt_bytes(mm_align_up(ds->bytes_used + need + MM_MOE_HEAP_SLACK, MM_MOE_HEAP_ROUND),
                             want, sizeof want);
            const int pull = mm_moe_is_pull(&g->cfg);
            st = mm_error(MEGAMOE_OUT_OF_MEMORY,
                          "the SHMEM heap is too small for this MegaMoeExperts resource group: it "
                          "needs %llu bytes (%s %lld rows + T*K %lld rows of H %lld "
                          "bf16) but only %llu of %llu bytes are free; set "
                          "HYPER_PARALLEL_SHMEM_HEAP_SIZE=%s (or larger) on every rank before the "
                          "SHMEM runtime starts%s",
                          (unsigned long long)need, pull ? "staged source" : "receive capacity",
                          (long long)(pull ? g->cfg.T * g->cfg.K : g->capacity),
                          (long long)(g->cfg.T * g->cfg.K), (long long)g->cfg.H,
                          (unsigned long long)free_bytes, (unsigned long long)ds->heap_size, want,
                          g->cfg.mode == MM_MOE_FIXED && g->cfg.factor == 0
                              ? ", or set a finite expert_capacity_factor"
                          : g->cfg.mode == MM_MOE_PUSH ? ", or lower initial_capacity_factor"
                                                       : "");
        }
    }
    free(ds);
    return st;
}

megamoe_status_t mm_moe_group_prepare(mm_moe_group_t *g)
{
    if (g->ready) return MEGAMOE_OK;
    mm_shmem_params_t sp = mm_shmem_params_default();
    if (!mm_shmem_is_running() && !mm_env_is_set(MM_ENV_SHMEM_HEAP_SIZE))
        sp.heap_size = mm_moe_heap_request();
    MM_CHECK(mm_shmem_acquire(&sp));

    megamoe_status_t st = mm_moe_heap_check(g);
    if (st == MEGAMOE_OK) st = mm_pool_create(g->workers, &g->pool);
    st = mm_shmem_team_agree(g->team, st);
    if (st == MEGAMOE_OK)
        st = mm_ep_xbuf_create(g->team,
                               mm_moe_is_pull(&g->cfg) ? g->cfg.T * g->cfg.K : g->capacity,
                               g->cfg.T * g->cfg.K, (size_t)g->cfg.H * 2, &g->xbuf);
    if (st == MEGAMOE_OK) {
        /* hot-expert replicas: publication and partial areas (collective) */
        st = mm_moe_rep_group_create(g);
        if (st != MEGAMOE_OK) {
            char text[1024];
            snprintf(text, sizeof text, "%s", megamoe_last_error());
            mm_ep_xbuf_destroy(g->xbuf); /* collective, like its creation */
            g->xbuf = NULL;
            mm_set_last_error(text);
        }
    }
    if (st == MEGAMOE_OK && mm_moe_is_o1(&g->cfg)) {
        /* O1: the static plan and the executor's signal area (collective) */
        int n = mm_shmem_team_n_pes(g->team);
        int *host = malloc(sizeof(int) * (size_t)n);
        for (int i = 0; host && i < n; i++)
            host[i] = mm_shmem_host_of(mm_shmem_team_world_pe(g->team, i));
        mm_mc_shape_t sh = {n, mm_shmem_team_my_pe(g->team), g->cfg.T, g->cfg.H, g->cfg.I,
                            g->cfg.E, g->cfg.K, g->cube, g->vector, host, g->cfg.replicas};
        megamoe_status_t ps = mm_mc_plan_create(&sh, &g->plan);
        free(host);
        ps = mm_shmem_team_agree(g->team, ps);
        if (ps == MEGAMOE_OK)
            ps = mm_mc_exec_create(g->plan, g->team, g->pool, mm_moe_o1_scratch_bytes(&g->cfg),
                                   &g->exec);
        if (ps != MEGAMOE_OK) {
            char text[1024];
            snprintf(text, sizeof text, "%s", megamoe_last_error());
            mm_mc_plan_destroy(g->plan);
            g->plan = NULL;
            mm_moe_rep_group_destroy(g); /* collective, like its creation */
            mm_ep_xbuf_destroy(g->xbuf);
            g->xbuf = NULL;
            mm_set_last_error(text);
            st = ps;
        }
    }
    if (st != MEGAMOE_OK) {
        mm_pool_destroy(g->pool);
        g->pool = NULL;
        char text[1024];
        snprintf(text, sizeof text, "%s", megamoe_last_error());
        mm_shmem_release(); /* pairs with the acquire above; keep the first error's text */
        mm_set_last_error(text);
        return st;
    }
    g->ready = 1;
    return MEGAMOE_OK;
}

megamoe_status_t mm_moe_group_detach(mm_moe_group_t *g)
{
    if (--g->open_layers > 0) return MEGAMOE_OK;
    megamoe_status_t st = MEGAMOE_OK;
    if (g->ready) {
        /* Symmetric memory first (collective, reverse order of allocation), then the
         * reference that kept the heap alive. */
        st = mm_mc_exec_destroy(g->exec);
        g->exec = NULL;
        mm_mc_plan_destroy(g->plan);
        g->plan = NULL;
        megamoe_status_t rs0 = mm_moe_rep_group_destroy(g);
        if (st == MEGAMOE_OK) st = rs0;
        megamoe_status_t xs = mm_ep_xbuf_destroy(g->xbuf);
        if (st == MEGAMOE_OK) st = xs;
        g->xbuf = NULL;
        mm_pool_destroy(g->pool);
        g->pool = NULL;
        megamoe_status_t rs = mm_shmem_release();
        if (st == MEGAMOE_OK) st = rs;
        g->ready = 0;
    }
    for (int i = 0; i < (int)(sizeof g->scratch.buf / sizeof g->scratch.buf[0]); i++) {
        mm_aligned_free(g->scratch.buf[i]);
        g->scratch.buf[i] = NULL;
        g->scratch.bytes[i] = 0;
    }
    mm_moe_unregister(g);
    return st;
}

void mm_moe_group_unref(mm_moe_group_t *g)
{
    if (g == NULL) return;
    if (--g->layers > 0) return;
    if (g->open_layers > 0) return; /* never closed: resources stay (documented) */
    mm_moe_group_free(g);
}

/* Heap bytes in use now and the heap's size (identical on every rank: symmetric allocation). */
static megamoe_status_t mm_moe_heap_state(uint64_t *used_p, uint64_t *size_p)
{
    mm_shmem_debug_state_t *ds = malloc(sizeof *ds);
    if (ds == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate the SHMEM state");
    megamoe_status_t st = mm_shmem_debug_state(ds);
    *used_p = ds->bytes_used;
    *size_p = ds->heap_size;
    free(ds);
    return st;
}

static size_t mm_moe_recv_block(const mm_moe_group_t *g, int64_t rows)
{
    return mm_align_up((size_t)rows * g->xbuf->row_bytes, 4096);
}

/* Growth (push): decided from the gathered counts, so every rank takes the same branch and
 * makes the same allocations (the allocator is deterministic). Nothing reads or writes the
 * receive buffer here: every peer finished the previous exchange before the count all-gather
 * of this call (ep_exchange.h "Buffer reuse"), and none starts this one before the collective
 * allocation below. */
megamoe_status_t mm_moe_group_fit(mm_moe_group_t *g, const mm_ep_plan_t *plan)
{
    if (g->cfg.mode != MM_MOE_PUSH || plan->max_recv <= g->capacity) return MEGAMOE_OK;
    const int64_t bound = mm_moe_bound_rows(&g->cfg), old = g->capacity;
    const int64_t exact = (plan->max_recv + 127) / 128 * 128;
    double grown = ceil((double)old * g->cfg.growth);
    int64_t rows = grown > (double)plan->max_recv ? (int64_t)grown : plan->max_recv;
    rows = (rows + 127) / 128 * 128;
    if (rows > bound) rows = bound;
    if (g->n_growth == g->cap_growth) {
        int n = g->cap_growth ? 2 * g->cap_growth : 4;
        megamoe_experts_growth_t *a = realloc(g->growth, (size_t)n * sizeof *a);
        megamoe_status_t st = a ? MEGAMOE_OK
                                : mm_error(MEGAMOE_OUT_OF_MEMORY, "growth event table");
        /* (a host allocation can fail on one rank only: agree before the collective part) */
        st = mm_shmem_team_agree(g->team, st);
        if (st != MEGAMOE_OK) return st;
        g->growth = a;
        g->cap_growth = n;
    }
    uint64_t used = 0, heap = 0;
    MM_CHECK(mm_shmem_team_agree(g->team, mm_moe_heap_state(&used, &heap)));
    /* free bytes once the old buffer is given back; one page of slack for alignment */
    const uint64_t room = heap - used + mm_moe_recv_block(g, old);
    if (rows > exact && room < mm_moe_recv_block(g, rows) + 4096) rows = exact;
    if (room < mm_moe_recv_block(g, rows) + 4096) {
        char want[32];
        mm_moe_fmt_bytes(mm_align_up(used + mm_moe_recv_block(g, rows) + MM_MOE_HEAP_SLACK,
                                     MM_MOE_HEAP_ROUND),
                         want, sizeof want);
        return mm_error(MEGAMOE_OUT_OF_MEMORY,
                        "MegaMoeExperts (dispatch_mode \"push\") must grow its receive capacity "
                        "from %lld to %lld rows (rank %d receives %lld rows in this call) but the "
                        "SHMEM heap has only %llu of %llu bytes free for it; set "
                        "HYPER_PARALLEL_SHMEM_HEAP_SIZE=%s (or larger) on every rank before the "
                        "SHMEM runtime starts, or raise initial_capacity_factor",
                        (long long)old, (long long)rows, plan->max_recv_rank,
                        (long long)plan->max_recv, (unsigned long long)room,
                        (unsigned long long)heap, want);
    }
    megamoe_experts_growth_t ev;
    memset(&ev, 0, sizeof ev);
    ev.forward = g->forwards;
    ev.demand = plan->max_recv;
    ev.rows_before = old;
    ev.heap_bytes_before = g->heap_bytes;
    ev.heap_used_before = used;
    MM_CHECK(mm_shmem_team_free(g->xbuf->team, g->xbuf->recv));
    g->xbuf->recv = NULL;
    void *p = NULL;
    mm_shmem_team_t *team = g->xbuf->team;
    megamoe_status_t st = mm_shmem_team_malloc(team, (size_t)rows * g->xbuf->row_bytes, 4096, &p);
    if (st != MEGAMOE_OK && rows > exact) { /* fragmented: the rows this call needs */
        rows = exact;
        st = mm_shmem_team_malloc(team, (size_t)rows * g->xbuf->row_bytes, 4096, &p);
    }
    if (st != MEGAMOE_OK) {
        char text[1024];
        snprintf(text, sizeof text, "%s", megamoe_last_error());
        /* the old size fits where the old buffer was: the layer stays usable */
        megamoe_status_t rs =
            mm_shmem_team_malloc(team, (size_t)old * g->xbuf->row_bytes, 4096, &p);
        if (rs != MEGAMOE_OK) return rs;
        g->xbuf->recv = p;
        mm_set_last_error(text);
        return st;
    }
    g->xbuf->recv = p;
    g->xbuf->capacity = rows;
    g->capacity = rows;
    g->heap_bytes = mm_moe_heap_need(&g->cfg, rows);
    ev.rows_after = rows;
    ev.heap_bytes_after = g->heap_bytes;
    if (mm_moe_heap_state(&ev.heap_used_after, &heap) != MEGAMOE_OK) ev.heap_used_after = 0;
    g->growth[g->n_growth++] = ev;
    MM_INFO("MegaMoeExperts: receive capacity grew from %lld to %lld rows (forward %llu needed "
            "%lld rows on rank %d)",
            (long long)old, (long long)rows, (unsigned long long)ev.forward,
            (long long)plan->max_recv, plan->max_recv_rank);
    return MEGAMOE_OK;
}

megamoe_status_t mm_moe_scratch(mm_moe_group_t *g, int which, size_t bytes, void **ptr_p)
{
    mm_moe_scratch_t *s = &g->scratch;
    if (bytes == 0) bytes = 64;
    if (s->bytes[which] < bytes) {
        /* Rows per call vary with the routing: grow with a quarter of slack so that later,
         * slightly larger loads fit (an exact-size buffer regrew at every new largest load,
         * each time leaving the old one as a hole in the heap: docs/reliability.md, Soak). */
        size_t want = bytes + bytes / 4;
        mm_aligned_free(s->buf[which]); /* contents are scratch: nothing to keep */
        s->buf[which] = NULL;
        s->bytes[which] = 0;
        void *p = NULL;
        MM_CHECK(mm_aligned_alloc(want, 64, "MegaMoE scratch", &p));
        s->buf[which] = p;
        s->bytes[which] = want;
    }
    *ptr_p = s->buf[which];
    return MEGAMOE_OK;
}
