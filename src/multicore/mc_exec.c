/* The O1 executor (see mc_exec.h): launch, worker loop, dependency checks, signals, the DONE
 * status protocol, waits with timeout and liveness, profiling records. */
#include "multicore/mc_exec.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/backoff.h"
#include "base/clock.h"
#include "base/cpu.h"
#include "base/error.h"

/* Waiting (base/backoff.h, from the first miss): spin, then yield (lets a thread sharing the
 * core run), then sleep up to MM_MC_SLEEP_MAX_NS, so an idle worker costs little and wakes
 * within ~0.2 ms.
 * When the job's workers outnumber the cores (every rank is on this host), a spinning or
 * yielding worker only steals time from the one computing on its core: it then spins
 * briefly and sleeps at once. */
#define MM_MC_SPIN_NS 50000ull
#define MM_MC_YIELD_NS 2000000ull
#define MM_MC_OVERSUB_SPIN_NS 5000ull
#define MM_MC_SLEEP_MAX_NS 200000ull

#define MM_MC_U64_PER_LINE 8
#define MM_MC_TEXT 512

const char *const mm_mc_stage_names[MM_MC_STAGES] = {
    "dispatch", "gmm1",   "swiglu",      "gmm2",    "combine", "done",      "reduce",
    "dispatch_grad", "gmm_da", "swiglu_grad", "gmm_dx",  "combine_grad", "dw2", "dw1",
    "done_grad", "reduce_grad", "fetch", "fetch_grad", "slot_done", "wsum", "expert", "local",
};

void (*mm_mc_test_task_hook)(int64_t tasks_run);

/* A rank's status for one launch, in every rank's slot table (written before done[me]). */
typedef struct mm_mc_slot {
    uint64_t gen;
    uint64_t tag;
    int32_t status;
    int32_t rank;
    char text[MM_MC_SLOT_BYTES - 24];
} mm_mc_slot_t;
_Static_assert(sizeof(mm_mc_slot_t) == MM_MC_SLOT_BYTES, "status slot size");

/* Private counter lines. */
enum { MM_PV_CURSOR = 0, MM_PV_WORK = 2, MM_PV_ABORT, MM_PV_RUN, MM_PV_LOCAL, MM_PV_EXPERT };
/* after the S expert lines: S wgrad lines, R fetched lines, then EP * S block lines */

struct mm_mc_exec {
    const mm_mc_plan_t *plan;
    mm_shmem_team_t *team;
    mm_pool_t *pool;
    int ep, me, n_workers;
    int *pes;
    uint8_t *remote;     /* [EP] 1: the peer is on another host (no mapping of its heap) */
    /* inference, peers on other hosts, this launch: 1 when all this rank's rows to peer d
     * (whole_to[d]) / all of source s's rows here (whole_from[s]) are few enough to travel
     * under one signal (MM_MC_WHOLE_ROWS) instead of one per block */
    uint8_t *whole_to, *whole_from;
    void *sym;           /* symmetric signal area */
    uint64_t *arrival;   /* [S * EP] lines */
    uint64_t *done;      /* [EP] lines */
    uint64_t *ready;     /* [R] lines: guest slot g's weights published (SET gen) */
    uint64_t *part;      /* [EP * R] lines: rank d's guest slot g partial done (SET gen) */
    uint64_t *whole;     /* [EP] lines: inference, every row of source s arrived (SET gen) */
    mm_mc_slot_t *slots; /* [2][EP] */
    uint64_t *priv;      /* private lines (MM_PV_*) */
    /* the current launch (written while the workers are parked) */
    uint64_t gen, arrival_target, done_target, expert_target, work_target, wgrad_target;
    const mm_mc_graph_t *graph; /* the launch's tier and direction */
    int64_t nt;                 /* its tile slots per block */
    int64_t tokens;             /* this rank's tokens in the call (the REDUCE tiles' end) */
    uint64_t qlen[2];           /* tasks of each queue this launch runs (REDUCE tail cut) */
    mm_mc_launch_t launch;
    int null_mode;
    int vector_first; /* no vector workers: cube workers take the vector queue first */
    /* failures of the current launch */
    pthread_mutex_t lock;
    megamoe_status_t local, fatal;
    char local_text[MM_MC_TEXT], fatal_text[MM_MC_TEXT];
    int broken;
    uint64_t timeout_ns;
    uint64_t spin_ns, yield_ns; /* back-off phases (shorter when oversubscribed) */
    mm_mc_worker_t *workers;
    void *scratch;
    mm_prof_session_t *prof;
};

static inline uint64_t *mm_mc_line(uint64_t *base, int64_t i)
{
    return base + (size_t)i * MM_MC_U64_PER_LINE;
}
static inline uint64_t mm_mc_load(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline uint64_t *mm_mc_arrival(mm_mc_exec_t *x, int64_t j, int s)
{
    return mm_mc_line(x->arrival, j * x->ep + s);
}
static inline uint64_t *mm_mc_wgrad_line(mm_mc_exec_t *x, int64_t j)
{
    return mm_mc_line(x->priv, MM_PV_EXPERT + x->plan->S + j);
}
static inline uint64_t *mm_mc_fetched_line(mm_mc_exec_t *x, int g)
{
    return mm_mc_line(x->priv, MM_PV_EXPERT + 2 * x->plan->S + g);
}
/* DISPATCH tile slots of block (slot j of peer) run so far (peers on other hosts). */
static inline uint64_t *mm_mc_block_line(mm_mc_exec_t *x, int peer, int64_t j)
{
    return mm_mc_line(x->priv, MM_PV_EXPERT + 2 * x->plan->S + x->plan->s.R +
                                   (int64_t)peer * x->plan->S + j);
}

/* DISPATCH tasks to peer run so far (inference, peers on other hosts). */
static inline uint64_t *mm_mc_peer_line(mm_mc_exec_t *x, int peer)
{
    return mm_mc_line(x->priv, MM_PV_EXPERT + 2 * x->plan->S + x->plan->s.R +
                                   (int64_t)x->ep * x->plan->S + peer);
}

uint64_t *mm_mc_ready_line(mm_mc_exec_t *x, int g) { return mm_mc_line(x->ready, g); }

/* Inference across hosts: up to this many rows from one source to one owner travel under one
 * signal after the source's last DISPATCH task to it (decode: the blocks are a few rows each,
 * so per-block signals were most of the messages); more keep a signal per block, so an
 * owner's first experts start while later blocks are still on the wire. */
#define MM_MC_WHOLE_ROWS 64

/* ---- creation -------------------------------------------------------------------------------- */

megamoe_status_t mm_mc_exec_create(const mm_mc_plan_t *plan, mm_shmem_team_t *team,
                                   mm_pool_t *pool, size_t worker_scratch, mm_mc_exec_t **exec_p)
{
    const int ep = plan->s.ep, nw = plan->s.cube + plan->s.vector;
    megamoe_status_t st = MEGAMOE_OK;
    mm_mc_exec_t *x = calloc(1, sizeof *x);
    if (x == NULL) st = mm_error(MEGAMOE_OUT_OF_MEMORY, "O1 executor");
    else pthread_mutex_init(&x->lock, NULL);
    if (st == MEGAMOE_OK && mm_pool_size(pool) != nw)
        st = mm_error(MEGAMOE_INTERNAL, "O1 executor: pool has %d workers, plan %d",
                      mm_pool_size(pool), nw);
    if (st == MEGAMOE_OK) {
        x->plan = plan;
        x->team = team;
        x->pool = pool;
        x->ep = ep;
        x->me = plan->s.me;
        x->n_workers = nw;
        x->vector_first = plan->s.vector == 0;
        x->timeout_ns = mm_shmem_timeout_ns();
        const int oversubscribed = (int64_t)ep * nw > mm_cpu_count();
        x->spin_ns = oversubscribed ? MM_MC_OVERSUB_SPIN_NS : MM_MC_SPIN_NS;
        x->yield_ns = oversubscribed ? MM_MC_OVERSUB_SPIN_NS : MM_MC_YIELD_NS;
        st = mm_prof_control_init(); /* MEGAMOE_PROFILE */
        x->pes = calloc((size_t)ep, sizeof *x->pes);
        x->remote = calloc((size_t)ep, sizeof *x->remote);
        x->whole_to = calloc((size_t)ep * 2, 1);
        x->whole_from = x->whole_to ? x->whole_to + ep : NULL;
        x->workers = calloc((size_t)nw, sizeof *x->workers);
        size_t stride = mm_align_up(worker_scratch > 0 ? worker_scratch : 64, 4096);
        if (x->pes == NULL || x->remote == NULL || x->workers == NULL || x->whole_to == NULL)
            st = mm_error(MEGAMOE_OUT_OF_MEMORY, "O1 executor tables");
        if (st == MEGAMOE_OK)
            st = mm_aligned_calloc((size_t)(MM_PV_EXPERT + 2 * plan->S + plan->s.R +
                                            (int64_t)ep * plan->S + ep) * 64,
                                   64, "O1 counters", (void **)&x->priv);
        if (st == MEGAMOE_OK)
            st = mm_aligned_alloc(stride * (size_t)nw, 4096, "O1 worker scratch", &x->scratch);
        for (int w = 0; st == MEGAMOE_OK && w < nw; w++) {
            mm_mc_worker_t *k = &x->workers[w];
            k->index = w;
            k->role = w < plan->s.cube ? MM_MC_CUBE : MM_MC_VECTOR;
            k->role_index = w < plan->s.cube ? w : w - plan->s.cube;
            k->scratch = (char *)x->scratch + stride * (size_t)w;
        }
        for (int i = 0; st == MEGAMOE_OK && i < ep; i++) x->pes[i] = mm_shmem_team_world_pe(team, i);
    }
    /* The symmetric allocation is collective: agree first so every rank takes part or none. */
    st = mm_shmem_team_agree(team, st);
    if (st == MEGAMOE_OK) {
        const size_t bytes = mm_mc_heap_bytes(ep, plan->L, plan->s.R);
        st = mm_shmem_team_malloc(team, bytes, 4096, &x->sym);
        if (st == MEGAMOE_OK) {
            memset(x->sym, 0, bytes);
            x->arrival = x->sym;
            x->done = mm_mc_line(x->arrival, plan->S * ep);
            x->ready = mm_mc_line(x->done, ep);
            x->part = mm_mc_line(x->ready, plan->s.R);
            x->whole = mm_mc_line(x->part, (int64_t)ep * plan->s.R);
            x->slots = (mm_mc_slot_t *)(void *)mm_mc_line(x->whole, ep);
            for (int i = 0; i < ep; i++)
                x->remote[i] = mm_shmem_ptr(x->arrival, x->pes[i]) == NULL;
            /* nobody signals before every rank zeroed its counters */
            st = mm_shmem_team_barrier(team);
        }
    }
    if (st != MEGAMOE_OK) {
        if (x) {
            if (x->sym) mm_shmem_team_free(x->team, x->sym); /* every rank got here the same way */
            x->sym = NULL;
            mm_mc_exec_destroy(x);
        }
        return st;
    }
    *exec_p = x;
    return MEGAMOE_OK;
}

megamoe_status_t mm_mc_exec_destroy(mm_mc_exec_t *x)
{
    if (x == NULL) return MEGAMOE_OK;
    megamoe_status_t st = MEGAMOE_OK;
    if (x->sym) st = mm_shmem_team_free(x->team, x->sym);
    if (x->prof) {
        mm_prof_retire(x->prof); /* exports to MEGAMOE_PROFILE when set */
        x->prof = NULL;
    }
    pthread_mutex_destroy(&x->lock);
    mm_aligned_free(x->priv);
    mm_aligned_free(x->scratch);
    free(x->workers);
    free(x->remote);
    free(x->whole_to);
    free(x->pes);
    free(x);
    return st;
}

void mm_mc_exec_destroy_local(mm_mc_exec_t *x)
{
    if (x == NULL) return;
    if (x->sym && mm_shmem_is_running() && mm_shmem_team_lost_member(x->team) >= 0)
        (void)mm_shmem_team_free(x->team, x->sym); /* local on a broken team */
    x->sym = NULL;
    (void)mm_mc_exec_destroy(x);
}

uint64_t mm_mc_generation(const mm_mc_exec_t *x) { return x->gen; }
int mm_mc_broken(const mm_mc_exec_t *x) { return x->broken; }

mm_prof_session_t *mm_mc_profile(const mm_mc_exec_t *x) { return x->prof; }

/* ---- failures -------------------------------------------------------------------------------- */

static void mm_mc_local_fail(mm_mc_exec_t *x, megamoe_status_t st, const char *text)
{
    pthread_mutex_lock(&x->lock);
    if (x->local == MEGAMOE_OK) {
        x->local = st;
        snprintf(x->local_text, sizeof x->local_text, "%s", text);
        __atomic_store_n(mm_mc_line(x->priv, MM_PV_LOCAL), 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&x->lock);
}

static void mm_mc_fatal(mm_mc_exec_t *x, megamoe_status_t st)
{
    pthread_mutex_lock(&x->lock);
    if (x->fatal == MEGAMOE_OK) {
        x->fatal = st;
        snprintf(x->fatal_text, sizeof x->fatal_text, "%s", megamoe_last_error());
    }
    pthread_mutex_unlock(&x->lock);
    __atomic_store_n(mm_mc_line(x->priv, MM_PV_ABORT), 1, __ATOMIC_RELEASE);
}

/* The launch's verdict from every rank's status slot (identical on every rank). OK when all
 * are OK and the tags agree; else the lowest failing rank's status with "rank R: text". */
static megamoe_status_t mm_mc_decide(mm_mc_exec_t *x, char *text, size_t len, int *rank_p)
{
    *rank_p = -1;
    const mm_mc_slot_t *s = x->slots + (size_t)(x->gen & 1) * (size_t)x->ep;
    for (int r = 0; r < x->ep; r++) {
        if (s[r].gen != x->gen) {
            snprintf(text, len, "O1: rank %d's status slot holds launch %llu, expected %llu "
                     "(internal error)", r, (unsigned long long)s[r].gen,
                     (unsigned long long)x->gen);
            return MEGAMOE_INTERNAL;
        }
        if (s[r].status != MEGAMOE_OK) {
            char t[sizeof s[r].text];
            memcpy(t, s[r].text, sizeof t);
            t[sizeof t - 1] = '\0';
            if (t[0]) snprintf(text, len, "rank %d: %s", r, t);
            else snprintf(text, len, "rank %d: %s (that rank gave no message)", r,
                          megamoe_status_name((megamoe_status_t)s[r].status));
            *rank_p = r;
            return (megamoe_status_t)s[r].status;
        }
    }
    if (x->launch.tag_what)
        for (int r = 1; r < x->ep; r++)
            if (s[r].tag != s[0].tag) {
                snprintf(text, len, "%s: rank 0 passed #%llu but rank %d passed #%llu; pass "
                         "every rank the same one", x->launch.tag_what,
                         (unsigned long long)s[0].tag, r, (unsigned long long)s[r].tag);
                return MEGAMOE_INVALID_ARGUMENT;
            }
    return MEGAMOE_OK;
}

/* ---- profiling ------------------------------------------------------------------------------- */

void mm_mc_trace(mm_mc_worker_t *w, int stage, int64_t owner, int peer, uint64_t t0, uint64_t t1)
{
    if (w->ring)
        mm_prof_push(w->ring, MM_PROF_COMPUTE, (uint8_t)stage, w->task, (int32_t)owner, peer,
                     w->invocation, t0, t1);
}

static int mm_mc_stage_of(const mm_mc_exec_t *x, const mm_mc_task_t *t)
{
    const int bwd = x->launch.dir == MM_MC_BWD;
    switch (t->type) {
    case MM_MC_DISPATCH: return bwd ? MM_MC_ST_DISPATCH_GRAD : MM_MC_ST_DISPATCH;
    case MM_MC_EXPERT: return bwd ? MM_MC_ST_GMM_DA : MM_MC_ST_GMM1;
    case MM_MC_WGRAD2: return MM_MC_ST_DW2;
    case MM_MC_WGRAD1: return MM_MC_ST_DW1;
    case MM_MC_DONE: return bwd ? MM_MC_ST_DONE_GRAD : MM_MC_ST_DONE;
    case MM_MC_FETCH: return bwd ? MM_MC_ST_FETCH_GRAD : MM_MC_ST_FETCH;
    case MM_MC_SLOT_DONE: return MM_MC_ST_SLOT_DONE;
    case MM_MC_WSUM: return MM_MC_ST_WSUM;
    case MM_MC_EXPERT_ALL: return MM_MC_ST_EXPERT;
    case MM_MC_LOCAL: return MM_MC_ST_LOCAL;
    default: return bwd ? MM_MC_ST_REDUCE_GRAD : MM_MC_ST_REDUCE;
    }
}

/* Global expert a task works for (the trace's owner): slots map to experts through the
 * routing plan of the launch (guest slots change from call to call). */
static int64_t mm_mc_owner_of(const mm_mc_exec_t *x, const mm_mc_task_t *t)
{
    const int64_t L = x->plan->L, S = x->plan->S;
    const mm_ep_plan_t *r = x->null_mode ? NULL : x->launch.route;
    switch (t->type) {
    case MM_MC_DISPATCH:
        if (t->j >= L) return r ? r->slot_expert[(int64_t)t->peer * S + t->j] : -1;
        return (int64_t)t->peer * L + t->j;
    case MM_MC_EXPERT:
    case MM_MC_EXPERT_ALL:
    case MM_MC_WGRAD2:
    case MM_MC_WGRAD1:
    case MM_MC_FETCH:
    case MM_MC_SLOT_DONE:
        if (t->j >= L) return r ? r->slot_expert[(int64_t)x->me * S + t->j] : -1;
        return (int64_t)x->me * L + t->j;
    case MM_MC_WSUM: return (int64_t)x->me * L + t->j;
    default: return -1;
    }
}

/* ---- dependencies ---------------------------------------------------------------------------- */

/* Runtime geometry of a tile slot: rows (0 = empty) and how much it signals (1 for a tile,
 * the remaining slots of its block for the first empty slot, else 0). */
static void mm_mc_slot_geometry(int64_t count, int64_t k, int64_t NT, int64_t *rows_p,
                                uint64_t *amount_p)
{
    int64_t nt = (count + MM_MC_TILE - 1) / MM_MC_TILE;
    if (k < nt) {
        int64_t left = count - k * MM_MC_TILE;
        *rows_p = left < MM_MC_TILE ? left : MM_MC_TILE;
        *amount_p = 1;
    } else {
        *rows_p = 0;
        *amount_p = k == nt ? (uint64_t)(NT - nt) : 0;
    }
}

/* Inference: source s's rows of slot j are here. A source on another host signals only a
 * block with rows (route->blk_rows, known to every rank from the call's count exchange), by
 * setting the line to the launch's generation; the others count tile slots up. */
static int mm_mc_inf_arrived(mm_mc_exec_t *x, const mm_ep_plan_t *r, int64_t j, int s)
{
    if (!x->remote[s]) return mm_mc_load(mm_mc_arrival(x, j, s)) >= x->arrival_target;
    if (r->blk_rows[j * x->ep + s] == 0) return 1;
    return mm_mc_load(x->whole_from[s] ? mm_mc_line(x->whole, s) : mm_mc_arrival(x, j, s)) >=
           x->gen;
}

/* 1 when task t may run now; fills its tile and signal amount. */
static int mm_mc_ready(mm_mc_exec_t *x, const mm_mc_task_t *t, mm_mc_tile_t *tl,
                       uint64_t *amount)
{
    const mm_mc_plan_t *p = x->plan;
    const mm_ep_plan_t *r = x->launch.route;
    *amount = 0;
    tl->rows = 0;
    switch (t->type) {
    case MM_MC_DISPATCH:
        if (x->null_mode) {
            *amount = t->k == 0 ? (uint64_t)x->nt : 0;
            return 1;
        }
        {
            const int64_t dv = (int64_t)t->peer * p->S + t->j; /* destination slot */
            tl->j = t->j;
            tl->peer = t->peer;
            tl->e = r->slot_expert[dv];
            mm_mc_slot_geometry(r->seg_rows[dv], t->k, x->nt, &tl->rows, amount);
            tl->row0 = r->seg_pos[dv] + (int64_t)t->k * MM_MC_TILE;
            tl->dst_row = r->seg_dst[dv] + (int64_t)t->k * MM_MC_TILE;
        }
        return 1;
    case MM_MC_EXPERT: {
        if (x->null_mode) {
            *amount = t->k == 0 ? (uint64_t)x->nt : 0;
            return 1;
        }
        int64_t b = (int64_t)t->j * x->ep + t->peer;
        tl->j = t->j;
        tl->peer = t->peer;
        tl->e = r->slot_expert[(int64_t)x->me * p->S + t->j];
        mm_mc_slot_geometry(r->blk_rows[b], t->k, x->nt, &tl->rows, amount);
        tl->row0 = r->blk_off[b] + (int64_t)t->k * MM_MC_TILE;
        tl->ret_row = r->ret_off[b] + (int64_t)t->k * MM_MC_TILE;
        if (tl->rows == 0) return 1;
        if (t->j >= p->L && mm_mc_load(mm_mc_fetched_line(x, (int)(t->j - p->L))) < x->gen)
            return 0; /* a guest slot's weights are not there yet */
        return mm_mc_load(mm_mc_arrival(x, t->j, t->peer)) >= x->arrival_target;
    }
    case MM_MC_EXPERT_ALL: { /* tile k of slot j over every source's rows (receive order) */
        *amount = 1;
        if (x->null_mode) return 1;
        const int64_t R = r->group_off[t->j + 1] - r->group_off[t->j], r0 = (int64_t)t->k * MM_MC_TILE;
        tl->j = t->j;
        tl->peer = -1;
        tl->e = r->slot_expert[(int64_t)x->me * p->S + t->j];
        tl->row0 = r->group_off[t->j] + r0;
        tl->rows = R - r0 <= 0 ? 0 : (R - r0 < MM_MC_TILE ? R - r0 : MM_MC_TILE);
        tl->ret_row = -1;
        if (tl->rows == 0) return 1;
        for (int s = 0; s < x->ep; s++)
            if (!mm_mc_inf_arrived(x, r, t->j, s)) return 0;
        return 1;
    }
    case MM_MC_LOCAL:
        return 1;
    case MM_MC_FETCH: {
        if (x->null_mode || x->launch.dir == MM_MC_BWD) return 1;
        if (r->slot_expert[(int64_t)x->me * p->S + t->j] < 0) return 1; /* unused slot */
        return mm_mc_load(mm_mc_line(x->ready, t->k)) >= x->gen;
    }
    case MM_MC_SLOT_DONE:
        return mm_mc_load(mm_mc_wgrad_line(x, t->j)) >= x->wgrad_target;
    case MM_MC_WSUM: {
        if (mm_mc_load(mm_mc_wgrad_line(x, t->j)) < x->wgrad_target) return 0;
        if (x->null_mode) return 1;
        const int nslots = x->ep * p->s.R;
        for (int q = 0; q < nslots; q++)
            if (r->rep->slot_expert[q] == (int64_t)x->me * p->L + t->j &&
                mm_mc_load(mm_mc_line(x->part, q)) < x->gen)
                return 0;
        return 1;
    }
    case MM_MC_WGRAD2:
        if (x->null_mode) return 1;
        if (x->launch.pull)
            return mm_mc_load(mm_mc_line(x->priv, MM_PV_EXPERT + t->j)) >= x->expert_target;
        for (int s = 0; s < x->ep; s++)
            if (mm_mc_load(mm_mc_arrival(x, t->j, s)) < x->arrival_target) return 0;
        return 1;
    case MM_MC_WGRAD1:
        return mm_mc_load(mm_mc_line(x->priv, MM_PV_EXPERT + t->j)) >= x->expert_target;
    case MM_MC_DONE:
        return mm_mc_load(mm_mc_line(x->priv, MM_PV_WORK)) >= x->work_target;
    default: /* REDUCE */
        for (int s = 0; s < x->ep; s++)
            if (mm_mc_load(mm_mc_line(x->done, s)) < x->done_target) return 0;
        return 1;
    }
}

/* What the head task t waits for, for a timeout message. */
static void mm_mc_describe_wait(mm_mc_exec_t *x, const mm_mc_task_t *t, char *buf, size_t len)
{
    switch (t->type) {
    case MM_MC_EXPERT:
    case MM_MC_EXPERT_ALL:
    case MM_MC_WGRAD2: {
        if (t->type == MM_MC_WGRAD2 && x->launch.pull) {
            snprintf(buf, len, "the data-gradient tiles of local expert %d (they fetch its rows)",
                     t->j);
            return;
        }
        const int inf = t->type == MM_MC_EXPERT_ALL && !x->null_mode;
        int s = t->type == MM_MC_EXPERT ? t->peer : 0;
        for (int q = 0; t->type != MM_MC_EXPERT && q < x->ep; q++)
            if (inf ? !mm_mc_inf_arrived(x, x->launch.route, t->j, q)
                    : mm_mc_load(mm_mc_arrival(x, t->j, q)) < x->arrival_target) {
                s = q;
                break;
            }
        const int whole = inf && x->remote[s] && x->whole_from[s];
        snprintf(buf, len, "the rows of rank %d for local expert %d (%s counter %llu, "
                 "needs %llu)", s, t->j, whole ? "all-rows" : "arrival",
                 (unsigned long long)mm_mc_load(whole ? mm_mc_line(x->whole, s)
                                                      : mm_mc_arrival(x, t->j, s)),
                 (unsigned long long)(inf && x->remote[s] ? x->gen : x->arrival_target));
        return;
    }
    case MM_MC_REDUCE:
        for (int s = 0; s < x->ep; s++)
            if (mm_mc_load(mm_mc_line(x->done, s)) < x->done_target) {
                snprintf(buf, len, "rank %d to finish its part (done counter %llu, needs %llu)", s,
                         (unsigned long long)mm_mc_load(mm_mc_line(x->done, s)),
                         (unsigned long long)x->done_target);
                return;
            }
        break;
    case MM_MC_WGRAD1:
        snprintf(buf, len, "the data-gradient tiles of local expert %d", t->j);
        return;
    case MM_MC_FETCH:
        snprintf(buf, len, "the home of the expert guest slot %d serves to publish its weights "
                 "(ready line %llu, needs %llu)", t->k,
                 (unsigned long long)mm_mc_load(mm_mc_line(x->ready, t->k)),
                 (unsigned long long)x->gen);
        return;
    case MM_MC_SLOT_DONE:
        snprintf(buf, len, "the weight-gradient chunks of guest slot %d", t->k);
        return;
    case MM_MC_WSUM:
        for (int q = 0; x->launch.route && x->launch.route->rep && q < x->ep * x->plan->s.R; q++)
            if (x->launch.route->rep->slot_expert[q] == (int64_t)x->me * x->plan->L + t->j &&
                mm_mc_load(mm_mc_line(x->part, q)) < x->gen) {
                snprintf(buf, len, "rank %d's weight-gradient partial of local expert %d (guest "
                         "slot %d)", q / x->plan->s.R, t->j, q % x->plan->s.R);
                return;
            }
        snprintf(buf, len, "the weight gradients of local expert %d", t->j);
        return;
    default:
        break;
    }
    snprintf(buf, len, "this rank's own tasks (%llu of %llu done)",
             (unsigned long long)mm_mc_load(mm_mc_line(x->priv, MM_PV_WORK)),
             (unsigned long long)x->work_target);
}

/* ---- running a task -------------------------------------------------------------------------- */

/* A failed transfer fails this rank's launch (every rank learns it from the DONE status). */
static void mm_mc_rma_check(mm_mc_exec_t *x, megamoe_status_t st)
{
    if (st != MEGAMOE_OK) mm_mc_local_fail(x, st, megamoe_last_error());
}

/* A signal to a peer: after a failure (the launch fails) the peer still needs it to reach its
 * DONE decision, so one more try (a failed one was not applied), else the peer is declared
 * lost rather than left waiting for the timeout. */
static void mm_mc_remote_signal(mm_mc_exec_t *x, uint64_t *sig, uint64_t value, int op, int peer)
{
    megamoe_status_t st = mm_shmem_signal_op(sig, value, op, x->pes[peer]);
    if (st == MEGAMOE_OK) return;
    mm_mc_rma_check(x, st);
    if (mm_shmem_signal_op(sig, value, op, x->pes[peer]) != MEGAMOE_OK)
        mm_shmem_declare_lost(x->pes[peer], "an O1 signal to it failed twice");
}

static void mm_mc_signal(mm_mc_exec_t *x, mm_mc_worker_t *w, uint64_t *sig, uint64_t amount,
                         int peer, int stage, int64_t owner)
{
    uint64_t t0 = w->ring ? mm_now_ns() : 0;
    if (peer < 0) __atomic_fetch_add(sig, amount, __ATOMIC_RELEASE);
    else mm_mc_remote_signal(x, sig, amount, MM_SHMEM_SIGNAL_ADD, peer);
    if (w->ring)
        mm_prof_push(w->ring, MM_PROF_SIGNAL, (uint8_t)stage, w->task, (int32_t)owner, peer,
                     w->invocation, t0, mm_now_ns());
}

/* The same, setting the peer's line to value (SET). */
static void mm_mc_signal_set(mm_mc_exec_t *x, mm_mc_worker_t *w, uint64_t *sig, uint64_t value,
                             int peer, int stage, int64_t owner)
{
    uint64_t t0 = w->ring ? mm_now_ns() : 0;
    mm_mc_remote_signal(x, sig, value, MM_SHMEM_SIGNAL_SET, peer);
    if (w->ring)
        mm_prof_push(w->ring, MM_PROF_SIGNAL, (uint8_t)stage, w->task, (int32_t)owner, peer,
                     w->invocation, t0, mm_now_ns());
}

static void mm_mc_publish(mm_mc_exec_t *x, mm_mc_worker_t *w)
{
    mm_mc_slot_t s;
    memset(&s, 0, sizeof s);
    s.gen = x->gen;
    s.tag = x->launch.tag;
    s.rank = x->me;
    pthread_mutex_lock(&x->lock);
    s.status = x->local;
    size_t n = strnlen(x->local_text, sizeof s.text - 1);
    memcpy(s.text, x->local_text, n); /* truncated to the slot */
    pthread_mutex_unlock(&x->lock);
    mm_mc_slot_t *mine = x->slots + (size_t)(x->gen & 1) * (size_t)x->ep + x->me;
    const int stage = x->launch.dir == MM_MC_BWD ? MM_MC_ST_DONE_GRAD : MM_MC_ST_DONE;
    for (int i = 0; i < x->ep; i++) {
        int d = (x->me + i) % x->ep;
        void *remote = mm_shmem_ptr(mine, x->pes[d]);
        if (remote == NULL) { /* another host: the slot and the count in one message */
            uint64_t t0 = w->ring ? mm_now_ns() : 0, *line = mm_mc_line(x->done, x->me);
            if (mm_shmem_put_signal(mine, &s, sizeof s, line, 1, MM_SHMEM_SIGNAL_ADD,
                                    x->pes[d]) != MEGAMOE_OK &&
                mm_shmem_put_signal(mine, &s, sizeof s, line, 1, MM_SHMEM_SIGNAL_ADD,
                                    x->pes[d]) != MEGAMOE_OK) /* as a signal */
                mm_shmem_declare_lost(x->pes[d], "an O1 status put to it failed twice");
            if (w->ring)
                mm_prof_push(w->ring, MM_PROF_SIGNAL, (uint8_t)stage, w->task, -1, d,
                             w->invocation, t0, mm_now_ns());
            continue;
        }
        memcpy(remote, &s, sizeof s);
        /* the slot is visible before the count (same thread, release) */
        mm_mc_signal(x, w, mm_mc_line(x->done, x->me), 1, d, stage, -1);
    }
}

static void mm_mc_execute(mm_mc_exec_t *x, mm_mc_worker_t *w, int32_t id, const mm_mc_task_t *t,
                          const mm_mc_tile_t *tl, uint64_t amount)
{
    const mm_mc_plan_t *p = x->plan;
    const mm_mc_body_t *b = &x->launch.body;
    const int stage = mm_mc_stage_of(x, t);
    const int64_t owner = mm_mc_owner_of(x, t);
    /* after a local failure only the signals go on (the peers must not wait for nothing) */
    const int skip = x->null_mode || __atomic_load_n(mm_mc_line(x->priv, MM_PV_LOCAL),
                                                     __ATOMIC_ACQUIRE) != 0;
    megamoe_status_t st = MEGAMOE_OK;
    w->task = id;
    uint64_t t0 = w->ring ? mm_now_ns() : 0;
    /* A body's failure is recorded before the task's completion is published: a dependent task
     * another worker starts on that completion must see the skip flag, never the half-made
     * state (a failed FETCH leaves its guest slot without weights). */
#define MM_MC_BODY(call)                                                                           \
    do {                                                                                           \
        st = (call);                                                                               \
        if (st != MEGAMOE_OK) mm_mc_local_fail(x, st, megamoe_last_error());                       \
    } while (0)
    switch (t->type) {
    case MM_MC_DISPATCH:
        if (tl->rows > 0 && !skip) {
            MM_MC_BODY(b->dispatch(b->ctx, w, tl));
            if (w->ring) mm_mc_trace(w, stage, owner, t->peer, t0, mm_now_ns());
        }
        if (x->remote[t->peer]) {
            /* a peer on another host waits for whole blocks (EXPERT and WGRAD2 need the
             * block's every tile), so the block's last tile slot signals them all at once: one
             * message per block carries its rows and the signal, not one per tile */
            if (__atomic_add_fetch(mm_mc_block_line(x, t->peer, t->j), 1, __ATOMIC_ACQ_REL) !=
                x->arrival_target) {
            } else if (x->launch.dir != MM_MC_INF) {
                mm_mc_signal(x, w, mm_mc_arrival(x, t->j, x->me), (uint64_t)x->nt, t->peer,
                             stage, owner);
            } else if (x->null_mode ||
                       (!x->whole_to[t->peer] &&
                        x->launch.route->seg_rows[(int64_t)t->peer * p->S + t->j] > 0)) {
                /* inference: the peer knows every block's rows from the call's count exchange
                 * and waits only for blocks with rows, so an empty block sends nothing (at
                 * decode most of a peer's blocks are empty); the line takes the launch's
                 * generation (SET): it is not counted up in the launches it is skipped */
                mm_mc_signal_set(x, w, mm_mc_arrival(x, t->j, x->me), x->gen, t->peer, stage,
                                 owner);
            }
            /* few rows to that peer: one signal after its last DISPATCH task covers them all
             * (after a local failure: both kinds, the peer waits for the one it expects) */
            if (x->launch.dir == MM_MC_INF &&
                __atomic_add_fetch(mm_mc_peer_line(x, t->peer), 1, __ATOMIC_ACQ_REL) ==
                    (uint64_t)p->S * x->arrival_target &&
                (x->null_mode || x->whole_to[t->peer]))
                mm_mc_signal_set(x, w, mm_mc_line(x->whole, x->me), x->gen, t->peer, stage, -1);
        } else if (amount > 0) {
            mm_mc_signal(x, w, mm_mc_arrival(x, t->j, x->me), amount, t->peer, stage, owner);
        }
        break;
    case MM_MC_EXPERT:
    case MM_MC_EXPERT_ALL:
        if (tl->rows > 0 && !skip) MM_MC_BODY(b->expert(b->ctx, w, tl)); /* records its sub-stages */
        if (amount > 0)
            __atomic_fetch_add(mm_mc_line(x->priv, MM_PV_EXPERT + t->j), amount, __ATOMIC_RELEASE);
        break;
    case MM_MC_LOCAL:
        if (!skip && b->local) {
            MM_MC_BODY(b->local(b->ctx, w, t->k));
            if (w->ring) mm_mc_trace(w, stage, owner, -1, t0, mm_now_ns());
        }
        break;
    case MM_MC_WGRAD2:
    case MM_MC_WGRAD1: {
        int which = t->type == MM_MC_WGRAD1 ? 1 : 2;
        int64_t m0, m1;
        mm_pool_split(which == 1 ? p->s.H : p->s.I, t->k, (int)p->wchunks, 16, &m0, &m1);
        if (m1 > m0 && !skip && owner >= 0) { /* an unused guest slot has no partial */
            MM_MC_BODY(b->wgrad(b->ctx, w, which, t->j, m0, m1));
            if (w->ring) mm_mc_trace(w, stage, owner, -1, t0, mm_now_ns());
        }
        __atomic_fetch_add(mm_mc_wgrad_line(x, t->j), 1, __ATOMIC_RELEASE);
        break;
    }
    case MM_MC_FETCH:
        if (!skip && owner >= 0 && b->fetch) {
            MM_MC_BODY(b->fetch(b->ctx, w, t->k, owner));
            if (w->ring) mm_mc_trace(w, stage, owner, (int)(owner / p->L), t0, mm_now_ns());
        }
        __atomic_store_n(mm_mc_fetched_line(x, t->k), x->gen, __ATOMIC_RELEASE);
        break;
    case MM_MC_SLOT_DONE: {
        /* every rank learns that this guest slot's partial (if any) is complete */
        uint64_t *line = mm_mc_line(x->part, (int64_t)x->me * p->s.R + t->k);
        uint64_t s0 = w->ring ? mm_now_ns() : 0;
        for (int i = 0; i < x->ep; i++) {
            int d = (x->me + i) % x->ep;
            if (d == x->me) __atomic_store_n(line, x->gen, __ATOMIC_RELEASE);
            else mm_mc_remote_signal(x, line, x->gen, MM_SHMEM_SIGNAL_SET, d);
        }
        if (w->ring)
            mm_prof_push(w->ring, MM_PROF_SIGNAL, (uint8_t)stage, w->task, (int32_t)owner, -1,
                         w->invocation, s0, mm_now_ns());
        break;
    }
    case MM_MC_WSUM:
        if (!skip && b->wsum) {
            int32_t guests[MM_MC_MAX_GUESTS];
            int n = 0;
            const mm_ep_replica_plan_t *rp = x->launch.route->rep;
            for (int q = 0; q < x->ep * p->s.R && n < MM_MC_MAX_GUESTS; q++)
                if (rp->slot_expert[q] == owner) guests[n++] = q;
            if (n > 0) {
                MM_MC_BODY(b->wsum(b->ctx, w, t->j, t->k, p->wchunks, guests, n));
                if (w->ring) mm_mc_trace(w, stage, owner, -1, t0, mm_now_ns());
            }
        }
        break;
    case MM_MC_DONE:
        mm_mc_publish(x, w);
        break;
    default: { /* REDUCE */
        char text[MM_MC_TEXT];
        int64_t a = (int64_t)t->k * MM_MC_TILE, e = a + MM_MC_TILE;
        int failed_rank;
        if (!x->null_mode && a < x->tokens &&
            mm_mc_decide(x, text, sizeof text, &failed_rank) == MEGAMOE_OK) {
            MM_MC_BODY(b->reduce(b->ctx, w, a, e < x->tokens ? e : x->tokens));
            if (w->ring) mm_mc_trace(w, stage, owner, -1, t0, mm_now_ns());
        }
        break;
    }
    }
#undef MM_MC_BODY
    (void)st;
    if (t->type != MM_MC_DONE && t->type != MM_MC_REDUCE)
        __atomic_fetch_add(mm_mc_line(x->priv, MM_PV_WORK), 1, __ATOMIC_RELEASE);
    uint64_t n = __atomic_add_fetch(mm_mc_line(x->priv, MM_PV_RUN), 1, __ATOMIC_RELAXED);
    if (MM_UNLIKELY(mm_mc_test_task_hook != NULL)) mm_mc_test_task_hook((int64_t)n);
}

/* ---- the worker loop ------------------------------------------------------------------------- */

static megamoe_status_t mm_mc_worker_main(void *arg, int index, int n_workers)
{
    (void)n_workers;
    mm_mc_exec_t *x = arg;
    mm_mc_worker_t *w = &x->workers[index];
    const mm_mc_graph_t *g = x->graph;
    int order[2] = {w->role, 1 - w->role};
    if (x->vector_first) {
        order[0] = MM_MC_VECTOR;
        order[1] = MM_MC_CUBE;
    }
    mm_backoff_t b;
    mm_backoff_init(&b, x->spin_ns, x->yield_ns, MM_MC_SLEEP_MAX_NS);
    int32_t waited_for = -1;
    for (;;) {
        if (__atomic_load_n(mm_mc_line(x->priv, MM_PV_ABORT), __ATOMIC_ACQUIRE)) return MEGAMOE_OK;
        int open = 0, retry = 0;
        waited_for = -1;
        for (int qi = 0; qi < 2; qi++) {
            const int q = order[qi];
            uint64_t *cursor = mm_mc_line(x->priv, MM_PV_CURSOR + q);
            uint64_t c = mm_mc_load(cursor);
            if (c >= x->qlen[q]) continue;
            open = 1;
            const int32_t id = g->queue[q][c];
            const mm_mc_task_t *t = &g->tasks[id];
            mm_mc_tile_t tile;
            uint64_t amount;
            if (!mm_mc_ready(x, t, &tile, &amount)) {
                if (waited_for < 0) waited_for = id;
                continue;
            }
            if (!__atomic_compare_exchange_n(cursor, &c, c + 1, 0, __ATOMIC_ACQ_REL,
                                             __ATOMIC_ACQUIRE)) {
                retry = 1; /* another worker took it: look again at once */
                break;
            }
            if (b.start != 0) { /* it waited: record the wait, start afresh */
                if (w->ring)
                    mm_prof_push(w->ring, MM_PROF_WAIT, (uint8_t)mm_mc_stage_of(x, t), id,
                                 (int32_t)mm_mc_owner_of(x, t), t->peer, w->invocation, b.start,
                                 mm_now_ns());
                mm_backoff_reset(&b);
            }
            mm_mc_execute(x, w, id, t, &tile, amount);
            retry = 1;
            break;
        }
        if (!open) return MEGAMOE_OK;
        if (retry) continue;
        /* nothing ready: back off, watching the clock, the peers and the timeout */
        uint64_t elapsed;
        if (!mm_backoff_miss(&b, &elapsed)) continue;
        megamoe_status_t st = mm_shmem_check_liveness();
        if (st == MEGAMOE_OK && elapsed >= x->timeout_ns) {
            char what[256];
            const mm_mc_task_t *t = &g->tasks[waited_for];
            mm_mc_describe_wait(x, t, what, sizeof what);
            st = mm_error(MEGAMOE_TIMEOUT,
                          "O1 %s: worker %d waited %.1f s for %s; a peer is stuck or never "
                          "signals; raise HYPER_PARALLEL_SHMEM_TIMEOUT_SEC if the work "
                          "legitimately takes longer",
                          x->launch.dir == MM_MC_BWD ? "backward" : "forward", index,
                          (double)elapsed * 1e-9, what);
        }
        if (st != MEGAMOE_OK) {
            mm_mc_fatal(x, st);
            return st;
        }
        mm_backoff_wait(&b, elapsed, UINT64_MAX);
    }
}

/* ---- launch ---------------------------------------------------------------------------------- */

megamoe_status_t mm_mc_run(mm_mc_exec_t *x, const mm_mc_launch_t *l)
{
    if (x->broken)
        return mm_error(MEGAMOE_INVALID_STATE,
                        "this MegaMoeExperts resource group failed in an earlier call (a peer was "
                        "lost or timed out) and can only be closed");
    const mm_mc_plan_t *p = x->plan;
    if ((l->dir == MM_MC_INF) != (p->infer != 0) || l->dir < 0 || l->dir > MM_MC_INF)
        return mm_error(MEGAMOE_INTERNAL, "O1 launch of direction %d on a plan built %s", l->dir,
                        p->infer ? "for inference" : "for training");
    x->launch = *l;
    /* The tier: every rank picks the same one from the gathered counts (the largest block of
     * the call), so every counter moves by the same amount everywhere; targets accumulate. */
    const int tier = l->route ? mm_mc_plan_tier(p, l->route->max_block_rows) : 0;
    x->graph = &p->tiers[tier][l->dir];
    x->nt = p->tier_nt[tier];
    x->tokens = l->route ? l->route->T : 0;
    const int64_t n_reduce = x->tokens > 0 ? (x->tokens + MM_MC_TILE - 1) / MM_MC_TILE : 1;
    x->qlen[MM_MC_CUBE] = (uint64_t)x->graph->n_queue[MM_MC_CUBE];
    x->qlen[MM_MC_VECTOR] = (uint64_t)(x->graph->n_queue[MM_MC_VECTOR] - p->TT + n_reduce);
    x->gen++;
    x->arrival_target += (uint64_t)x->nt;
    x->done_target = x->gen;
    x->expert_target += (uint64_t)(x->ep * x->nt);
    x->work_target += (uint64_t)x->graph->n_counted;
    if (l->dir == MM_MC_BWD) x->wgrad_target += (uint64_t)(2 * p->wchunks);
    x->null_mode = l->local != MEGAMOE_OK || l->route == NULL;
    if (l->dir == MM_MC_INF && !x->null_mode) /* the same rows seen from both ends */
        for (int d = 0; d < x->ep; d++) {
            int64_t to = 0, from = 0;
            for (int64_t j = 0; j < p->S; j++) {
                to += l->route->seg_rows[(int64_t)d * p->S + j];
                from += l->route->blk_rows[j * x->ep + d];
            }
            x->whole_to[d] = x->remote[d] && to > 0 && to <= MM_MC_WHOLE_ROWS;
            x->whole_from[d] = x->remote[d] && from <= MM_MC_WHOLE_ROWS;
        }
    x->local = l->local;
    x->fatal = MEGAMOE_OK;
    x->local_text[0] = x->fatal_text[0] = '\0';
    if (l->local != MEGAMOE_OK) snprintf(x->local_text, sizeof x->local_text, "%s", megamoe_last_error());
    else if (l->route == NULL) {
        x->local = MEGAMOE_INTERNAL;
        snprintf(x->local_text, sizeof x->local_text, "O1 launch without a routing plan");
    }
    __atomic_store_n(mm_mc_line(x->priv, MM_PV_LOCAL), x->local != MEGAMOE_OK, __ATOMIC_RELAXED);
    __atomic_store_n(mm_mc_line(x->priv, MM_PV_CURSOR + 0), 0, __ATOMIC_RELAXED);
    __atomic_store_n(mm_mc_line(x->priv, MM_PV_CURSOR + 1), 0, __ATOMIC_RELAXED);
    __atomic_store_n(mm_mc_line(x->priv, MM_PV_RUN), 0, __ATOMIC_RELAXED);

    /* profiling: a session per executor, created when profiling is first requested */
    if (MM_UNLIKELY(mm_prof_requested()) && x->prof == NULL) {
        mm_prof_session_t *s = NULL;
        if (mm_prof_session_create(mm_shmem_my_pe(), p->s.cube, p->s.vector, 1u << 16,
                                   mm_mc_stage_names, MM_MC_STAGES, &s) == MEGAMOE_OK) {
            if (mm_prof_register(s) == MEGAMOE_OK) x->prof = s;
            else mm_prof_session_destroy(s);
        }
    }
    const int on = mm_prof_on(x->prof);
    uint32_t inv = on ? mm_prof_begin(x->prof, l->dir == MM_MC_BWD   ? "backward"
                                               : l->dir == MM_MC_INF ? "inference"
                                                                     : "forward")
                      : 0;
    if (on && l->note) mm_prof_note(x->prof, l->note);
    for (int i = 0; i < x->n_workers; i++) {
        mm_mc_worker_t *w = &x->workers[i];
        w->ring = on ? mm_prof_ring(x->prof, (mm_prof_role_t)w->role, w->role_index) : NULL;
        w->invocation = inv;
        w->task = -1;
    }

    megamoe_status_t st = mm_pool_run(x->pool, mm_mc_worker_main, x);
    if (on) mm_prof_end(x->prof);
    if (x->fatal != MEGAMOE_OK || st != MEGAMOE_OK) {
        x->broken = 1;
        if (x->fatal != MEGAMOE_OK) {
            mm_set_last_error(x->fatal_text);
            return x->fatal;
        }
        return st;
    }
    char text[MM_MC_TEXT + 32];
    int failed_rank;
    st = mm_mc_decide(x, text, sizeof text, &failed_rank);
    if (st != MEGAMOE_OK) {
        if (failed_rank != x->me) MM_LOG(MEGAMOE_LOG_ERROR, "%s", text); /* ours was logged */
        mm_set_last_error(text);
    }
    return st;
}
