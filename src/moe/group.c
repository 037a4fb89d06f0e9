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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/env.h"
#include "base/error.h"
#include "moe/experts_impl.h"
#include "moe/moe_buffers.h"

#define MM_MOE_HEAP_SLACK ((size_t)16 << 20)
#define MM_MOE_HEAP_ROUND ((size_t)64 << 20)

static pthread_mutex_t mm_moe_registry_lock = PTHREAD_MUTEX_INITIALIZER;
static mm_moe_group_t *mm_moe_registry;

size_t mm_moe_heap_need(const mm_moe_config_t *c)
{
    size_t need = mm_ep_xbuf_heap_bytes((int)c->ep, c->capacity, c->T * c->K, (size_t)c->H * 2);
    if (mm_moe_is_o1(c)) need += mm_mc_heap_bytes((int)c->ep, c->E / c->ep);
    return need;
}

/* What to ask for when this process starts SHMEM with the heap size unset. */
static uint64_t mm_moe_heap_request(void)
{
    size_t total = 0;
    pthread_mutex_lock(&mm_moe_registry_lock);
    for (mm_moe_group_t *g = mm_moe_registry; g; g = g->next)
        if (g->open_layers > 0) total += g->heap_bytes;
    pthread_mutex_unlock(&mm_moe_registry_lock);
    return mm_align_up(total + MM_MOE_HEAP_SLACK, MM_MOE_HEAP_ROUND);
}

megamoe_status_t mm_moe_group_create(const mm_moe_config_t *cfg, mm_shmem_team_t *team,
                                     uint64_t id, int workers, int cube, int vector,
                                     mm_moe_group_t **group_p)
{
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
    g->layers = 1;
    g->open_layers = 1;
    g->heap_bytes = mm_moe_heap_need(cfg);
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
            st = mm_error(MEGAMOE_OUT_OF_MEMORY,
                          "the SHMEM heap is too small for this MegaMoeExperts resource group: it "
                          "needs %llu bytes (receive capacity %lld rows + T*K %lld rows of H %lld "
                          "bf16) but only %llu of %llu bytes are free; set "
                          "HYPER_PARALLEL_SHMEM_HEAP_SIZE=%s (or larger) on every rank before the "
                          "SHMEM runtime starts%s",
                          (unsigned long long)need, (long long)g->cfg.capacity,
                          (long long)(g->cfg.T * g->cfg.K), (long long)g->cfg.H,
                          (unsigned long long)free_bytes, (unsigned long long)ds->heap_size, want,
                          g->cfg.factor == 0 ? ", or set a finite expert_capacity_factor" : "");
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
        st = mm_ep_xbuf_create(g->team, g->cfg.capacity, g->cfg.T * g->cfg.K,
                               (size_t)g->cfg.H * 2, &g->xbuf);
    if (st == MEGAMOE_OK && mm_moe_is_o1(&g->cfg)) {
        /* O1: the static plan and the executor's signal area (collective) */
        mm_mc_shape_t sh = {mm_shmem_team_n_pes(g->team), mm_shmem_team_my_pe(g->team),
                            g->cfg.T, g->cfg.H, g->cfg.I, g->cfg.E, g->cfg.K, g->cube, g->vector};
        megamoe_status_t ps = mm_mc_plan_create(&sh, &g->plan);
        ps = mm_shmem_team_agree(g->team, ps);
        if (ps == MEGAMOE_OK)
            ps = mm_mc_exec_create(g->plan, g->team, g->pool, mm_moe_o1_scratch_bytes(&g->cfg),
                                   &g->exec);
        if (ps != MEGAMOE_OK) {
            char text[1024];
            snprintf(text, sizeof text, "%s", megamoe_last_error());
            mm_mc_plan_destroy(g->plan);
            g->plan = NULL;
            mm_ep_xbuf_destroy(g->xbuf); /* collective, like its creation */
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

megamoe_status_t mm_moe_scratch(mm_moe_group_t *g, int which, size_t bytes, void **ptr_p)
{
    mm_moe_scratch_t *s = &g->scratch;
    if (bytes == 0) bytes = 64;
    if (s->bytes[which] < bytes) {
        void *p = NULL;
        MM_CHECK(mm_aligned_alloc(bytes, 64, "MegaMoE scratch", &p));
        mm_aligned_free(s->buf[which]);
        s->buf[which] = p;
        s->bytes[which] = bytes;
    }
    *ptr_p = s->buf[which];
    return MEGAMOE_OK;
}
