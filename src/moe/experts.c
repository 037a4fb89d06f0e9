/* MegaMoeExperts: creation and validation, cross-rank agreement, sharing, close, weights
 * packing, info and timing. The schedules live in forward_o0.c and backward_o0.c. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/abi.h"
#include "base/alloc.h"
#include "base/env.h"
#include "base/error.h"
#include "base/freelist.h"
#include "moe/experts_impl.h"
#include "moe/moe_buffers.h"
#include "moe/moe_replicas.h"
#include "moe/moe_rows.h"
#include "shmem/comm_impl.h"

static const char *const mm_moe_phase_names[MM_PH_COUNT] = {
    "fwd.route",    "fwd.dispatch", "fwd.gmm1",   "fwd.swiglu",  "fwd.gmm2",    "fwd.combine",
    "fwd.reduce",   "bwd.prep",     "bwd.dispatch", "bwd.gmm_da", "bwd.gmm_dw2", "bwd.swiglu",
    "bwd.gmm_dx",   "bwd.gmm_dw1",  "bwd.combine", "bwd.reduce",  "fwd.prepare", "fwd.launch",
    "bwd.prepare",  "bwd.launch",   "bwd.finish",
};
/* The phases each schedule times (O1: everything between route and return is one launch). */
static const int mm_moe_o0_phases[] = {
    MM_PH_FWD_ROUTE,   MM_PH_FWD_DISPATCH, MM_PH_FWD_GMM1,    MM_PH_FWD_SWIGLU,
    MM_PH_FWD_GMM2,    MM_PH_FWD_COMBINE,  MM_PH_FWD_REDUCE,  MM_PH_BWD_PREP,
    MM_PH_BWD_DISPATCH, MM_PH_BWD_GMM_DA,  MM_PH_BWD_GMM_DW2, MM_PH_BWD_SWIGLU,
    MM_PH_BWD_GMM_DX,  MM_PH_BWD_GMM_DW1,  MM_PH_BWD_COMBINE, MM_PH_BWD_REDUCE,
};
static const int mm_moe_o1_phases[] = {MM_PH_FWD_PREPARE, MM_PH_FWD_ROUTE, MM_PH_FWD_LAUNCH,
                                       MM_PH_BWD_PREPARE, MM_PH_BWD_LAUNCH, MM_PH_BWD_FINISH};

/* saved states handed back (one per outstanding forward) */
static mm_freelist_t mm_moe_saved_blocks = MM_FREELIST_INIT;
static atomic_uint_fast64_t mm_moe_serial = 1;
/* Layers this process created (their numbers, "layer #N", are agreed across ranks). */
static atomic_uint_fast64_t mm_moe_layer_count;

megamoe_status_t megamoe_experts_params_init(megamoe_experts_params_t *p, size_t struct_size)
{
    megamoe_experts_params_t d;
    memset(&d, 0, sizeof d);
    d.schedule = "O1";
    return mm_abi_init(p, struct_size, &d, sizeof d, "megamoe_experts_params_t");
}

megamoe_status_t megamoe_experts_input_init(megamoe_experts_input_t *in, size_t struct_size)
{
    megamoe_experts_input_t d;
    memset(&d, 0, sizeof d); /* num_tokens 0: a fixed layer's T (the ABI scheme's zero) */
    d.topk_ids_dtype = MEGAMOE_DTYPE_INT32;
    d.topk_weights_dtype = MEGAMOE_DTYPE_FP32;
    d.tokens_per_expert_dtype = MEGAMOE_DTYPE_INT32;
    return mm_abi_init(in, struct_size, &d, sizeof d, "megamoe_experts_input_t");
}

int64_t megamoe_experts_capacity_rows(int64_t ep, int64_t tokens, int64_t top_k, double factor)
{
    if (ep < 1 || tokens < 1 || top_k < 1 || !(factor == 0 || (isfinite(factor) && factor >= 1)))
        return 0;
    double rows = factor == 0 ? (double)ep * (double)tokens * (double)top_k
                              : ceil((double)tokens * (double)top_k * factor);
    if (rows > 1e15) return 0;
    return ((int64_t)rows + 127) / 128 * 128;
}

/* The dispatch mode of params (MM_MOE_*), -1 when it names none. */
/* The public words of the dispatch modes and schedules, indexed by their enums. */
static const char *const mm_moe_mode_words[] = {[MM_MOE_FIXED] = NULL, [MM_MOE_PUSH] = "push",
                                                [MM_MOE_PULL] = "pull"};
static const char *const mm_moe_schedule_words[] = {[MM_MOE_O0] = "O0", [MM_MOE_O1] = "O1"};

const char *mm_moe_schedule_name(mm_moe_schedule_t s)
{
    return (unsigned)s < sizeof mm_moe_schedule_words / sizeof mm_moe_schedule_words[0]
               ? mm_moe_schedule_words[s]
               : "?";
}

/* The schedule a name (NULL: the default) selects; -1 for an unknown one. */
static int mm_moe_schedule_of(const char *name)
{
    if (name == NULL) return MM_MOE_SCHEDULE_DEFAULT;
    for (int s = 0; s < (int)(sizeof mm_moe_schedule_words / sizeof mm_moe_schedule_words[0]); s++)
        if (strcmp(name, mm_moe_schedule_words[s]) == 0) return s;
    return -1;
}

/* The dispatch mode of the parameters (unset: fixed); -1 for an unknown word. */
static int mm_moe_mode_of(const megamoe_experts_params_t *p)
{
    if (p->dispatch_mode == NULL) return MM_MOE_FIXED;
    for (int m = 0; m < (int)(sizeof mm_moe_mode_words / sizeof mm_moe_mode_words[0]); m++)
        if (mm_moe_mode_words[m] && strcmp(p->dispatch_mode, mm_moe_mode_words[m]) == 0) return m;
    return -1;
}

#define MM_MOE_DEFAULT_FACTOR 1.25 /* push: initial and growth factor (HyperParallel's) */

/* Initial receive rows of a valid configuration (push: min(initial, EP) * T*K, the original's
 * rule; pull: none). */
static int64_t mm_moe_initial_rows(mm_moe_mode_t mode, int64_t ep, int64_t T, int64_t K, double factor,
                                   double initial)
{
    if (mode == MM_MOE_PULL) return 0;
    if (mode == MM_MOE_FIXED) return megamoe_experts_capacity_rows(ep, T, K, factor);
    double f = initial < (double)ep ? initial : (double)ep;
    return megamoe_experts_capacity_rows(ep, T, K, f);
}

size_t megamoe_experts_heap_bytes(const megamoe_experts_params_t *caller_p, int ep)
{
    if (caller_p == NULL || ep < 1) return 0;
    megamoe_experts_params_t params = megamoe_experts_params_default();
    const megamoe_experts_params_t *p = &params;
    if (mm_abi_copy_in(&params, sizeof params, caller_p, "megamoe_experts_params_t") != MEGAMOE_OK)
        return 0;
    if (p->local_num_tokens != 0 && p->max_local_num_tokens != 0) return 0; /* set one */
    mm_moe_config_t c;
    memset(&c, 0, sizeof c);
    c.T = p->max_local_num_tokens != 0 ? p->max_local_num_tokens : p->local_num_tokens;
    c.H = p->hidden_size;
    c.I = p->intermediate_size;
    c.E = p->num_experts;
    c.K = p->top_k;
    c.ep = ep;
    const int mode = mm_moe_mode_of(p);
    c.replicas = p->replica_slots_per_rank;
    if (mode < 0 || c.T < 1 || c.K < 1 || c.H < 1) return 0;
    c.mode = (mm_moe_mode_t)mode;
    if (c.replicas < 0 || c.replicas > MM_MOE_MAX_REPLICAS ||
        (c.replicas > 0 && (c.I < 1 || c.E < ep || c.E % ep != 0)))
        return 0;
    if (c.mode == MM_MOE_FIXED) {
        c.capacity = megamoe_experts_capacity_rows(ep, c.T, c.K, p->expert_capacity_factor);
        if (c.capacity == 0) return 0;
    } else {
        c.capacity = mm_moe_bound_rows(&c); /* push: what growth may reach; pull: unused */
    }
    return mm_moe_heap_need(&c, c.capacity);
}

/* Local validation: the rules of seed 000 "输入与权重", each error naming its rule. */
static megamoe_status_t mm_moe_validate(const megamoe_experts_params_t *p, int ep)
{
    const int64_t T = p->max_local_num_tokens != 0 ? p->max_local_num_tokens : p->local_num_tokens;
    if (p->local_num_tokens != 0 && p->max_local_num_tokens != 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "local_num_tokens = %lld and max_local_num_tokens = %lld are both set; "
                        "set exactly one: local_num_tokens for a fixed token count per rank, "
                        "max_local_num_tokens for per-call counts up to it",
                        (long long)p->local_num_tokens, (long long)p->max_local_num_tokens);
    if (p->max_local_num_tokens < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "max_local_num_tokens (T_cap) = %lld must be a positive integer (the "
                        "most tokens a rank passes to one call)",
                        (long long)p->max_local_num_tokens);
    if (p->max_local_num_tokens == 0 && (p->local_num_tokens < 128 || p->local_num_tokens % 128 != 0))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "local_num_tokens (T) = %lld must be a positive multiple of 128 (the "
                        "static 128-row communication tiling); for other or varying counts set "
                        "max_local_num_tokens instead",
                        (long long)p->local_num_tokens);
    if (p->hidden_size < 1 || p->intermediate_size < 1)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "hidden_size (H) = %lld and intermediate_size (I) = %lld must be >= 1",
                        (long long)p->hidden_size, (long long)p->intermediate_size);
    if (p->hidden_size > (1 << 20) || p->intermediate_size > (1 << 20))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "hidden_size and intermediate_size must be <= 1048576");
    if (p->num_experts < 1 || p->num_experts % ep != 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "num_experts (E) = %lld must be a positive multiple of the EP size %d "
                        "(every rank owns E/EP experts)",
                        (long long)p->num_experts, ep);
    if (p->num_experts >= INT32_MAX)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "num_experts (E) = %lld must stay below 2^31 (expert ids are 32-bit)",
                        (long long)p->num_experts);
    if (p->top_k < 1 || p->top_k > p->num_experts)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "top_k (K) = %lld must be in [1, E = %lld]",
                        (long long)p->top_k, (long long)p->num_experts);
    /* T, K <= E and EP are each checked before their product is formed (no int64 wrap) */
    if (T >= INT32_MAX || T * p->top_k > (INT32_MAX - 1) / ep)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "EP*T*K = %d*%lld*%lld rows must stay below 2^31", ep, (long long)T,
                        (long long)p->top_k);
    double f = p->expert_capacity_factor;
    if (!(f == 0 || (isfinite(f) && f >= 1)))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "expert_capacity_factor = %g must be unset/0 (lossless) or a finite "
                        "number >= 1",
                        f);
    const int mode = mm_moe_mode_of(p);
    if (mode < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "dispatch_mode \"%.16s\" is unknown; use \"push\" (growing receive "
                        "capacity), \"pull\" (owners fetch rows) or leave it unset (the fixed "
                        "capacity of expert_capacity_factor)",
                        p->dispatch_mode);
    const double gf[2] = {p->initial_capacity_factor, p->capacity_growth_factor};
    const char *const gn[2] = {"initial_capacity_factor", "capacity_growth_factor"};
    for (int i = 0; i < 2; i++) {
        if (gf[i] != 0 && mode != MM_MOE_PUSH)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s = %g applies to dispatch_mode \"push\" only (dispatch_mode is "
                            "%s%s%s)",
                            gn[i], gf[i], p->dispatch_mode ? "\"" : "",
                            p->dispatch_mode ? p->dispatch_mode : "unset",
                            p->dispatch_mode ? "\"" : "");
        if (!(gf[i] == 0 || (isfinite(gf[i]) && gf[i] >= 1)))
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "%s = %g must be 0 (the default 1.25) or a finite number >= 1", gn[i],
                            gf[i]);
    }
    if (f != 0 && mode != MM_MOE_FIXED)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "expert_capacity_factor = %g sets a fixed receive capacity, which "
                        "dispatch_mode \"%s\" does not have; use initial_capacity_factor / "
                        "capacity_growth_factor with \"push\", or leave dispatch_mode unset",
                        f, p->dispatch_mode);
    if (!(p->swiglu_limit == 0 || (isfinite(p->swiglu_limit) && p->swiglu_limit > 0)))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "swiglu_limit = %g must be unset/0 (no clamp) or a finite number > 0",
                        (double)p->swiglu_limit);
    if (p->replica_slots_per_rank < 0 || p->replica_slots_per_rank > MM_MOE_MAX_REPLICAS)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "replica_slots_per_rank = %d must be in [0, %d] (0 = no hot-expert "
                        "replicas)",
                        p->replica_slots_per_rank, MM_MOE_MAX_REPLICAS);
    if (mm_moe_schedule_of(p->schedule) < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "schedule \"%.16s\" is unknown; use \"O1\" (the multicore executor, "
                        "default) or \"O0\" (host-scheduled phases)",
                        p->schedule);
    if (p->workers < 0 || p->workers > MM_POOL_MAX_WORKERS)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "workers = %d must be in [0, %d] (0 = default)",
                        p->workers, MM_POOL_MAX_WORKERS);
    if (p->cube_workers < 0 || p->vector_workers < 0 ||
        p->cube_workers + p->vector_workers > MM_MC_MAX_WORKERS)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "cube_workers = %d and vector_workers = %d must be >= 0 with a sum of at "
                        "most %d (0 = derived)",
                        p->cube_workers, p->vector_workers, MM_MC_MAX_WORKERS);
    return MEGAMOE_OK;
}

/* What creation gathers: the configuration and the number this rank proposes for the layer. */
typedef struct mm_moe_create_rec {
    mm_moe_config_t cfg;
    uint64_t number;
} mm_moe_create_rec_t;

/* Same configuration on every rank, or CONFIG_MISMATCH everywhere naming the first difference.
 * *number: in, this rank's proposal; out, the layer's number (the largest proposal), so the
 * numbers in call descriptors are equal on every rank even if the ranks created different
 * numbers of layers before. */
static megamoe_status_t mm_moe_agree_config(mm_shmem_team_t *team, const mm_moe_config_t *c,
                                            uint64_t *number)
{
    int n = mm_shmem_team_n_pes(team);
    mm_moe_create_rec_t *recs = calloc((size_t)n + 1, sizeof *recs);
    megamoe_status_t st = recs ? MEGAMOE_OK : mm_error(MEGAMOE_OUT_OF_MEMORY, "config exchange");
    MM_CHECK(mm_shmem_team_agree(team, st));
    memset(&recs[n], 0, sizeof recs[n]);
    recs[n].cfg = *c;
    recs[n].number = *number;
    st = mm_shmem_team_allgather(team, recs, &recs[n], sizeof recs[n]);
    for (int r = 0; st == MEGAMOE_OK && r < n; r++)
        if (recs[r].number > *number) *number = recs[r].number;
    for (int r = 1; st == MEGAMOE_OK && r < n; r++) {
        const mm_moe_config_t *a = &recs[0].cfg, *b = &recs[r].cfg;
        const char *field = NULL;
        char va[64] = "", vb[64] = "";
#define MM_CMP_I(f, name)                                                                  \
    if (!field && a->f != b->f) {                                                          \
        field = name;                                                                      \
        snprintf(va, sizeof va, "%lld", (long long)a->f);                                  \
        snprintf(vb, sizeof vb, "%lld", (long long)b->f);                                  \
    }
#define MM_CMP_F(f, name)                                                                  \
    if (!field && memcmp(&a->f, &b->f, sizeof a->f) != 0) {                                \
        field = name;                                                                      \
        snprintf(va, sizeof va, "%g", (double)a->f);                                       \
        snprintf(vb, sizeof vb, "%g", (double)b->f);                                       \
    }
        if (!field && a->dynamic != b->dynamic) { /* fixed T on one rank, T_cap on another */
            field = "the token count (local_num_tokens: fixed, max_local_num_tokens: per call)";
            snprintf(va, sizeof va, "%s = %lld", a->dynamic ? "max_local_num_tokens" : "local_num_tokens",
                     (long long)a->T);
            snprintf(vb, sizeof vb, "%s = %lld", b->dynamic ? "max_local_num_tokens" : "local_num_tokens",
                     (long long)b->T);
        }
        MM_CMP_I(T, a->dynamic ? "max_local_num_tokens" : "local_num_tokens")
        MM_CMP_I(H, "hidden_size")
        MM_CMP_I(I, "intermediate_size")
        MM_CMP_I(E, "num_experts")
        MM_CMP_I(K, "top_k")
        MM_CMP_I(ep, "ep_size")
        MM_CMP_F(factor, "expert_capacity_factor")
        MM_CMP_F(limit, "swiglu_limit")
        MM_CMP_I(mode, "dispatch_mode (0 unset, 1 push, 2 pull)")
        MM_CMP_F(initial, "initial_capacity_factor")
        MM_CMP_F(growth, "capacity_growth_factor")
        MM_CMP_I(replicas, "replica_slots_per_rank")
        if (!field && a->schedule != b->schedule) {
            field = "schedule";
            snprintf(va, sizeof va, "%s", mm_moe_schedule_name(a->schedule));
            snprintf(vb, sizeof vb, "%s", mm_moe_schedule_name(b->schedule));
        }
#undef MM_CMP_I
#undef MM_CMP_F
        if (field)
            st = mm_error(MEGAMOE_CONFIG_MISMATCH,
                          "MegaMoeExperts settings differ between ranks: %s is %s on rank 0 but "
                          "%s on rank %d; every EP rank must construct the layer identically",
                          field, va, vb, r);
    }
    free(recs);
    return st;
}

megamoe_status_t megamoe_experts_create(megamoe_comm_t *comm,
                                        const megamoe_experts_params_t *caller_p,
                                        megamoe_experts_t **experts_p)
{
    if (experts_p == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "experts_p is NULL");
    if (comm == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "the EP communicator is NULL");
    mm_shmem_team_t *team = mm_comm_team(comm);
    if (team == NULL)
        return mm_error(MEGAMOE_INVALID_STATE,
                        "the EP communicator is not usable (destroyed, or SHMEM not running)");
    int ep = mm_shmem_team_n_pes(team), me = mm_shmem_team_my_pe(team);
    megamoe_status_t st = MEGAMOE_OK;
    /* the library's full copy (version.h: extensible structs); p stays NULL when refused */
    megamoe_experts_params_t params = megamoe_experts_params_default();
    const megamoe_experts_params_t *p = NULL;
    if (caller_p == NULL)
        st = mm_error(MEGAMOE_INVALID_ARGUMENT,
                      "params is NULL; start from megamoe_experts_params_default() and set the "
                      "shapes");
    else if ((st = mm_abi_copy_in(&params, sizeof params, caller_p,
                                  "megamoe_experts_params_t")) == MEGAMOE_OK)
        p = &params;
    /* The EP communicator may be any group of ranks (the current HyperParallel accepts an EP
     * subgroup, e.g. 2 data-parallel replicas x EP 2): its symmetric buffers and collectives
     * are the group's own, so ranks outside it never call into it. */
    if (st == MEGAMOE_OK) st = mm_moe_validate(p, ep);
    int workers = 0, cube = 0, vector = 0;
    const int o1 = st == MEGAMOE_OK && mm_moe_schedule_of(p->schedule) == MM_MOE_O1;
    if (st == MEGAMOE_OK) {
        workers = p->workers;
        if (workers == 0) st = mm_pool_default_workers(&workers);
    }
    if (st == MEGAMOE_OK && o1) {
        st = mm_mc_workers(workers, p->workers > 0, p->cube_workers, p->vector_workers, &cube,
                           &vector);
        workers = cube + vector;
    }
    megamoe_experts_t *x = NULL;
    if (st == MEGAMOE_OK) {
        x = calloc(1, sizeof *x);
        if (x == NULL) st = mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate a layer");
    }
    /* A failure on any rank stops every rank here, before the config exchange. */
    st = mm_shmem_team_agree(team, st);
    if (st != MEGAMOE_OK) {
        free(x);
        return st;
    }
    mm_moe_config_t c;
    memset(&c, 0, sizeof c); /* padding too: the struct is compared bytewise across ranks */
    c.dynamic = p->max_local_num_tokens != 0;
    c.T = c.dynamic ? p->max_local_num_tokens : p->local_num_tokens;
    c.H = p->hidden_size;
    c.I = p->intermediate_size;
    c.E = p->num_experts;
    c.K = p->top_k;
    c.ep = ep;
    c.factor = p->expert_capacity_factor;
    c.limit = p->swiglu_limit;
    c.mode = (mm_moe_mode_t)mm_moe_mode_of(p);
    if (c.mode == MM_MOE_PUSH) {
        c.initial = p->initial_capacity_factor != 0 ? p->initial_capacity_factor
                                                    : MM_MOE_DEFAULT_FACTOR;
        c.growth = p->capacity_growth_factor != 0 ? p->capacity_growth_factor
                                                  : MM_MOE_DEFAULT_FACTOR;
    }
    c.capacity = mm_moe_initial_rows(c.mode, ep, c.T, c.K, c.factor, c.initial);
    c.schedule = (mm_moe_schedule_t)mm_moe_schedule_of(p->schedule);
    c.replicas = p->replica_slots_per_rank;
    uint64_t number = atomic_load(&mm_moe_layer_count) + 1;
    st = mm_moe_agree_config(team, &c, &number);
    if (st == MEGAMOE_OK) st = mm_moe_group_create(&c, team, number, workers, o1 ? cube : workers,
                                                   o1 ? vector : 0, &x->group);
    st = mm_shmem_team_agree(team, st);
    if (st != MEGAMOE_OK) {
        if (x->group) {
            mm_moe_group_detach(x->group); /* never prepared: local */
            mm_moe_group_unref(x->group);
        }
        free(x);
        return st;
    }
    x->serial = atomic_fetch_add(&mm_moe_serial, 1);
    /* later layers of this process get higher numbers than every rank's so far */
    uint_fast64_t seen = atomic_load(&mm_moe_layer_count);
    while (seen < number && !atomic_compare_exchange_weak(&mm_moe_layer_count, &seen, number)) {
    }
    x->number = number;
    x->digest = mm_call_digest(&c, sizeof c, 0);
    x->cfg = c;
    x->comm = comm;
    x->team = team;
    x->ep = ep;
    x->me = me;
    x->L = c.E / ep;
    x->workers = workers;
    x->cube = o1 ? cube : workers;
    x->vector = o1 ? vector : 0;
    x->last_recv_rows = -1;
    x->last_tokens = -1;
    st = mm_moe_rep_layer_create(x);
    st = mm_shmem_team_agree(team, st);
    if (st != MEGAMOE_OK) {
        mm_moe_rep_layer_destroy(x);
        mm_moe_group_detach(x->group); /* never prepared: local */
        mm_moe_group_unref(x->group);
        free(x);
        return st;
    }
    *experts_p = x;
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_experts_share(megamoe_experts_t *const *layers, size_t count)
{
    megamoe_status_t st = mm_take_next_call_error();
    if (layers == NULL || count == 0)
        return st != MEGAMOE_OK
                   ? st
                   : mm_error(MEGAMOE_INVALID_ARGUMENT, "share needs a non-empty list of layers");
    megamoe_experts_t *first = layers[0];
    for (size_t i = 0; i < count && st == MEGAMOE_OK; i++) {
        megamoe_experts_t *x = layers[i];
        if (x == NULL) {
            st = mm_error(MEGAMOE_INVALID_ARGUMENT, "layer %zu of the share list is NULL", i);
        } else if (x->closed) {
            st = mm_error(MEGAMOE_INVALID_STATE,
                          "layer %zu of the share list is closed; MegaMoeExperts used after close()",
                          i);
        } else if (x->group->used) {
            st = mm_error(MEGAMOE_INVALID_STATE,
                          "share_execution_resources must be called before the first forward; "
                          "layer %zu has already run one",
                          i);
        } else if (x->team != first->team) {
            st = mm_error(MEGAMOE_INVALID_ARGUMENT,
                          "layer %zu uses a different EP communicator than layer 0; shared layers "
                          "need the same one",
                          i);
        } else if (memcmp(&x->cfg, &first->cfg, sizeof x->cfg) != 0) {
            st = mm_error(MEGAMOE_INVALID_ARGUMENT,
                          "layer %zu has a different configuration than layer 0 (T or "
                          "max_local_num_tokens, H, I, E, K, EP, expert_capacity_factor, swiglu_limit, schedule, dispatch_mode, "
                          "initial_capacity_factor, capacity_growth_factor and "
                          "replica_slots_per_rank must match to share execution resources)",
                          i);
        }
    }
    if (first == NULL) return st; /* no team to agree on */
    /* Every rank must share the same layers, or their symmetric allocations would diverge:
     * the descriptor names the list (first exchange of the call, in the first layer's group). */
    mm_call_t call;
    mm_moe_call_begin(&call, first, MM_CALL_SHARE);
    size_t off = (size_t)snprintf(call.what, sizeof call.what, "share_execution_resources of "
                                  "layers ");
    uint64_t digest = mm_call_digest(&count, sizeof count, 0);
    for (size_t i = 0; i < count; i++) {
        uint64_t no = layers[i] ? layers[i]->number : 0;
        digest = mm_call_digest(&no, sizeof no, digest);
        if (off < sizeof call.what)
            off += (size_t)snprintf(call.what + off, sizeof call.what - off, "%s#%llu",
                                    i ? ", " : "", (unsigned long long)no);
    }
    if (off >= sizeof call.what) memcpy(call.what + sizeof call.what - 4, "...", 4);
    call.digest = digest;
    st = mm_call_exchange(&call, first->team, st, NULL, 0);
    mm_call_end(&call);
    if (st != MEGAMOE_OK) return st;
    mm_moe_group_t *g = first->group;
    for (size_t i = 1; i < count; i++) {
        megamoe_experts_t *x = layers[i];
        if (x->group == g) continue; /* listed twice or shared before */
        mm_moe_group_t *old = x->group; /* never used, so nothing allocated but the struct */
        x->group = g;
        g->layers++;
        g->open_layers++;
        old->open_layers--;
        if (old->open_layers == 0) mm_call_group_unregister(&old->calls);
        mm_moe_group_unref(old);
    }
    return MEGAMOE_OK;
}

static void mm_moe_packed_free(megamoe_experts_t *x)
{
    mm_gemm_weight_t **sets[4] = {x->packed.w1, x->packed.w2, x->packed.w2t, x->packed.w1t};
    for (int s = 0; s < 4; s++) {
        if (sets[s] == NULL) continue;
        for (int64_t j = 0; j < x->L; j++) mm_gemm_weight_destroy(sets[s][j]);
        free(sets[s]);
    }
    memset(&x->packed, 0, sizeof x->packed);
}

megamoe_status_t megamoe_experts_close(megamoe_experts_t *x)
{
    if (x == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "close: layer is NULL");
    if (x->closed) return MEGAMOE_OK;
    int expected = 0;
    if (!atomic_compare_exchange_strong(&x->group->busy, &expected, 1))
        return mm_error(MEGAMOE_INVALID_STATE,
                        "close() while another thread runs a layer of this resource group; close "
                        "after all forward/backward calls returned");
    /* Collective (its first exchange is the call check): a rank that closes while a peer calls
     * something else gets CALL_MISMATCH like the peer, and its layer stays open (close it again
     * in step). A group that lost a peer, or a runtime already stopped, closes locally. */
    megamoe_status_t st = mm_take_next_call_error();
    if (!x->group->broken && mm_shmem_is_running()) {
        mm_call_t call;
        mm_moe_call_begin(&call, x, MM_CALL_CLOSE);
        st = mm_call_exchange(&call, x->team, st, NULL, 0);
        mm_call_end(&call);
        if (st == MEGAMOE_PEER_LOST || st == MEGAMOE_TIMEOUT) x->group->broken = 1;
    }
    if (st != MEGAMOE_OK && !x->group->broken) {
        atomic_store(&x->group->busy, 0);
        return st;
    }
    x->closed = 1;
    mm_moe_packed_free(x);
    mm_moe_rep_layer_destroy(x); /* copies still used by saved states live on in them */
    megamoe_status_t ds = mm_moe_group_detach(x->group);
    atomic_store(&x->group->busy, 0);
    return st != MEGAMOE_OK ? st : ds;
}

void megamoe_experts_destroy(megamoe_experts_t *x)
{
    if (x == NULL) return;
    if (!x->closed)
        MM_WARN("a MegaMoeExperts layer was destroyed without close(); its resource group stays "
                "allocated until the process exits");
    mm_moe_packed_free(x);
    mm_moe_rep_layer_destroy(x);
    mm_moe_group_unref(x->group);
    free(x);
}

megamoe_status_t mm_moe_saved_create(const megamoe_experts_t *x, mm_ep_plan_t *plan,
                                     megamoe_dtype_t w_dtype, megamoe_experts_saved_t **saved_p)
{
    const int64_t H = x->cfg.H, I = x->cfg.I, R = plan->recv_rows, Rb = R > 0 ? R : 1;
    /* this call's slots (one placeholder when the rank passed no token) */
    const size_t TK = plan->T > 0 ? (size_t)plan->T * (size_t)x->cfg.K : 1;
    /* the state and its guest table in one block, kept in mm_moe_saved_blocks when destroyed */
    const size_t head = mm_align_up(sizeof(megamoe_experts_saved_t), 64);
    megamoe_experts_saved_t *sv = NULL;
    MM_CHECK(mm_freelist_get(&mm_moe_saved_blocks,
                             head + (size_t)x->cfg.replicas * sizeof *sv->guest, 1, "saved state",
                             (void **)&sv));
    sv->layer_serial = x->serial;
    sv->rows = R;
    sv->w_dtype = w_dtype;
    /* Sized to the rows actually received (one placeholder row when none). */
    megamoe_status_t st =
        mm_moe_buf_alloc((size_t)Rb * (size_t)H * 2, "saved tokens", (void **)&sv->x);
    if (st == MEGAMOE_OK)
        st = mm_moe_buf_alloc((size_t)Rb * (size_t)(2 * I) * 2, "saved GMM1 output",
                              (void **)&sv->gu);
    if (st == MEGAMOE_OK)
        st = mm_moe_buf_alloc((size_t)Rb * (size_t)I * 2, "saved activation", (void **)&sv->a);
    if (st == MEGAMOE_OK)
        st = mm_moe_buf_alloc(TK * (size_t)H * 2, "saved expert outputs", (void **)&sv->y);
    if (st == MEGAMOE_OK)
        st = mm_moe_buf_alloc(TK * sizeof(float), "saved router weights", (void **)&sv->w);
    if (st == MEGAMOE_OK && x->cfg.replicas > 0) {
        sv->guest = (void *)((char *)sv + head);
        sv->n_guest = x->cfg.replicas;
    }
    if (st != MEGAMOE_OK) {
        megamoe_experts_saved_destroy(sv); /* plan is still the caller's */
        return st;
    }
    sv->plan = plan; /* owned by the saved state from here on */
    *saved_p = sv;
    return MEGAMOE_OK;
}

void megamoe_experts_saved_destroy(megamoe_experts_saved_t *s)
{
    if (s == NULL) return;
    mm_moe_rep_saved_release(s);
    mm_ep_plan_destroy(s->plan);
    mm_moe_buf_free(s->x);
    mm_moe_buf_free(s->gu);
    mm_moe_buf_free(s->a);
    mm_moe_buf_free(s->y);
    mm_moe_buf_free(s->w);
    mm_freelist_put(&mm_moe_saved_blocks, s);
}

megamoe_status_t mm_moe_enter(megamoe_experts_t *x, int kind)
{
    const char *what = mm_call_kind_name(kind);
    if (x == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: layer is NULL", what);
    if (x->closed) {
        megamoe_status_t st = mm_error(MEGAMOE_INVALID_STATE,
                                       "%s: MegaMoeExperts used after close(); create a new "
                                       "layer", what);
        /* Still a collective call while the communicator lives: a peer that calls another
         * layer meanwhile fails at once (CALL_MISMATCH) instead of waiting for this rank. */
        if (!mm_shmem_is_running() || mm_comm_team(x->comm) != x->team) return st;
        mm_call_t call;
        mm_moe_call_begin(&call, x, kind);
        st = mm_call_exchange(&call, x->team, st, NULL, 0);
        mm_call_end(&call);
        return st;
    }
    if (x->group->broken)
        return mm_error(MEGAMOE_INVALID_STATE,
                        "%s: this layer's resource group failed in an earlier call (a peer was "
                        "lost or timed out) and can only be closed",
                        what);
    int expected = 0;
    if (!atomic_compare_exchange_strong(&x->group->busy, &expected, 1))
        return mm_error(MEGAMOE_INVALID_STATE,
                        "%s: another thread is running a layer of this resource group; shared "
                        "execution resources allow serial use only",
                        what);
    return MEGAMOE_OK;
}

void mm_moe_leave(megamoe_experts_t *x, megamoe_status_t st)
{
    /* A lost peer or a timeout leaves the ranks out of step wherever it struck (the routing
     * exchange as much as a launch): only close() may follow, the same answer on every rank. */
    if (st == MEGAMOE_PEER_LOST || st == MEGAMOE_TIMEOUT) x->group->broken = 1;
    atomic_store(&x->group->busy, 0);
}

/* Create or refresh one set of packed weights (one per local expert). */
static megamoe_status_t mm_moe_pack_set(megamoe_experts_t *x, mm_gemm_weight_t ***set,
                                        mm_gemm_form_t form, int64_t K, int64_t N,
                                        const uint16_t *base, int64_t ld, int64_t stride,
                                        uint64_t version)
{
    if (*set == NULL) {
        *set = calloc((size_t)x->L, sizeof **set);
        if (*set == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "packed weight table");
    }
    for (int64_t j = 0; j < x->L; j++) {
        const uint16_t *src = base + j * stride;
        if ((*set)[j] == NULL) {
            const mm_gemm_backend_ops_t *be = NULL;
            MM_CHECK(mm_gemm_backend_for_weight_of(x->group->gemm_choice, form, K, N, &be));
            MM_CHECK(mm_gemm_weight_create(be, form, K, N, src, ld, version, &(*set)[j]));
        }
        else
            MM_CHECK(mm_gemm_weight_update((*set)[j], src, ld, version, NULL));
    }
    return MEGAMOE_OK;
}

void mm_moe_fwd_ctx_init(mm_moe_fwd_ctx_t *c, megamoe_experts_t *x, const mm_ep_plan_t *plan,
                         const megamoe_experts_input_t *in, void *output,
                         const megamoe_experts_saved_t *sv)
{
    memset(c, 0, sizeof *c);
    c->x = x;
    c->g = x->group;
    c->plan = plan;
    c->T = plan->T;
    c->H = x->cfg.H;
    c->I = x->cfg.I;
    c->K = x->cfg.K;
    c->hidden = in->hidden_states;
    /* pull: the schedule fetches the rows into ordinary memory and points recv there */
    c->recv = mm_moe_is_pull(&x->cfg) ? NULL : x->group->xbuf->recv;
    c->ret = x->group->xbuf->ret;
    c->out = output;
    if (sv != NULL) {
        c->xsave = sv->x;
        c->gu = sv->gu;
        c->a = sv->a;
        c->ysave = sv->y;
        c->w = sv->w;
    }
}

void mm_moe_bwd_ctx_init(mm_moe_bwd_ctx_t *c, megamoe_experts_t *x,
                         const megamoe_experts_saved_t *sv, const void *dout,
                         const megamoe_experts_grads_t *gr)
{
    memset(c, 0, sizeof *c);
    c->x = x;
    c->g = x->group;
    c->sv = sv;
    c->plan = sv->plan;
    c->T = sv->plan->T;
    c->H = x->cfg.H;
    c->I = x->cfg.I;
    c->K = x->cfg.K;
    c->dout = dout;
    c->recv = mm_moe_is_pull(&x->cfg) ? NULL : x->group->xbuf->recv;
    c->ret = x->group->xbuf->ret;
    c->dhidden = gr->hidden_states;
    c->dw1 = gr->gate_up;
    c->dw2 = gr->down;
    c->wg_type = gr->weight_grad_dtype;
}

megamoe_status_t mm_moe_check_finite(const char *what, const void *p, megamoe_dtype_t dtype,
                                     int64_t rows, int64_t cols)
{
    int on = 1;
    megamoe_status_t st = mm_env_bool(MM_ENV_CHECK_FINITE, &on);
    if (st != MEGAMOE_OK && st != MEGAMOE_NOT_FOUND) return st;
    if (st == MEGAMOE_NOT_FOUND) on = 1;
    if (!on || rows <= 0 || cols <= 0) return MEGAMOE_OK;
    int64_t i = mm_rows_first_nonfinite(p, dtype == MEGAMOE_DTYPE_BF16, (size_t)(rows * cols));
    if (i < 0) return MEGAMOE_OK;
    uint32_t bits = 0;
    if (dtype == MEGAMOE_DTYPE_BF16) bits = (uint32_t)((const uint16_t *)p)[i] << 16;
    else memcpy(&bits, (const char *)p + i * 4, 4);
    return mm_error(MEGAMOE_INVALID_ARGUMENT,
                    "%s[%lld][%lld] is %s: MegaMoeExperts refuses non-finite inputs (find where "
                    "it first appears upstream; MEGAMOE_CHECK_FINITE=0 lets them through)",
                    what, (long long)(i / cols), (long long)(i % cols),
                    (bits & 0x007fffffu) ? "NaN" : (bits >> 31) ? "-Inf" : "+Inf");
}

megamoe_status_t mm_moe_pack_weights(megamoe_experts_t *x, const megamoe_experts_weights_t *w,
                                     int backward)
{
    if (w == NULL || w->gate_up == NULL || w->down == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "weights (gate_up [E/EP, H, 2I] and down [E/EP, I, H], bf16) are required");
    const int64_t H = x->cfg.H, I = x->cfg.I;
    const uint16_t *w1 = w->gate_up, *w2 = w->down;
    if (!backward) {
        /* GMM1: [rows,H] · gate_up[j] [H,2I];  GMM2: [rows,I] · down[j] [I,H] */
        MM_CHECK(mm_moe_pack_set(x, &x->packed.w1, MM_GEMM_NN, H, 2 * I, w1, 2 * I, H * 2 * I,
                                 w->version));
        MM_CHECK(mm_moe_pack_set(x, &x->packed.w2, MM_GEMM_NN, I, H, w2, H, I * H, w->version));
    } else {
        /* dA = dY · down[j]ᵀ: B = down[j] read as [N=I, K=H];
         * dX = dGU · gate_up[j]ᵀ: B = gate_up[j] read as [N=H, K=2I]. */
        MM_CHECK(mm_moe_pack_set(x, &x->packed.w2t, MM_GEMM_NT, H, I, w2, H, I * H, w->version));
        MM_CHECK(mm_moe_pack_set(x, &x->packed.w1t, MM_GEMM_NT, 2 * I, H, w1, 2 * I, H * 2 * I,
                                 w->version));
    }
    return MEGAMOE_OK;
}

megamoe_status_t mm_moe_gemm_split(mm_gemm_grouped_args_t *g, int worker, int n_workers,
                                   int64_t n_align)
{
    int64_t n0, n1;
    mm_pool_split(g->N, worker, n_workers, n_align, &n0, &n1);
    if (n0 >= n1) return MEGAMOE_OK;
    g->n0 = n0;
    g->n1 = n1;
    g->threads = 1;
    return mm_gemm_grouped(g);
}

void mm_moe_call_begin(mm_call_t *c, const megamoe_experts_t *x, int kind)
{
    mm_call_begin(c, &x->group->calls, kind, x->number, x->digest);
}

megamoe_status_t megamoe_experts_forward(megamoe_experts_t *x,
                                         const megamoe_experts_weights_t *weights,
                                         const megamoe_experts_input_t *caller_input,
                                         void *output, megamoe_experts_saved_t **saved_p)
{
    MM_CHECK(mm_moe_enter(x, MM_CALL_FORWARD));
    megamoe_status_t st = mm_take_next_call_error();
    /* the library's full copy of the input (version.h: extensible structs); a bad struct_size
     * is this rank's argument error, agreed in the call's first exchange like any other */
    megamoe_experts_input_t in_copy = megamoe_experts_input_default();
    const megamoe_experts_input_t *input = caller_input == NULL ? NULL : &in_copy;
    if (caller_input != NULL && st == MEGAMOE_OK)
        st = mm_abi_copy_in(&in_copy, sizeof in_copy, caller_input, "megamoe_experts_input_t");
    mm_call_t call;
    mm_moe_call_begin(&call, x, MM_CALL_FORWARD);
    if (!x->group->ready) {
        /* the first forward: check the call before the group's collective preparation */
        st = mm_call_exchange(&call, x->team, st, NULL, 0);
        if (st == MEGAMOE_OK) st = mm_moe_group_prepare(x->group);
    }
    if (st == MEGAMOE_OK || x->group->ready) {
        if (x->group->ready) x->group->used = 1;
        st = mm_moe_is_o1(&x->cfg)
                 ? mm_moe_forward_o1(x, &call, st, weights, input, output, saved_p)
                 : mm_moe_forward_o0(x, &call, st, weights, input, output, saved_p);
    }
    mm_call_end(&call);
    mm_moe_leave(x, st);
    return st;
}

megamoe_status_t megamoe_experts_backward(megamoe_experts_t *x, megamoe_experts_saved_t *saved,
                                          const megamoe_experts_weights_t *weights,
                                          const void *grad_output,
                                          const megamoe_experts_grads_t *grads)
{
    MM_CHECK(mm_moe_enter(x, MM_CALL_BACKWARD));
    megamoe_status_t st = mm_take_next_call_error();
    mm_call_t call;
    mm_moe_call_begin(&call, x, MM_CALL_BACKWARD);
    st = mm_moe_is_o1(&x->cfg)
             ? mm_moe_backward_o1(x, &call, st, saved, weights, grad_output, grads)
             : mm_moe_backward_o0(x, &call, st, saved, weights, grad_output, grads);
    mm_call_end(&call);
    mm_moe_leave(x, st);
    return st;
}

megamoe_status_t megamoe_experts_get_info_sized(const megamoe_experts_t *x,
                                                megamoe_experts_info_t *info_p, size_t info_size)
{
    if (x == NULL || info_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "get_info: NULL argument");
    megamoe_experts_info_t in;
    memset(&in, 0, sizeof in);
    in.tokens = x->cfg.T;
    in.hidden = x->cfg.H;
    in.intermediate = x->cfg.I;
    in.num_experts = x->cfg.E;
    in.top_k = x->cfg.K;
    in.ep = x->ep;
    in.rank = x->me;
    in.local_experts = x->L;
    in.capacity = x->group->capacity;
    in.capacity_factor = x->cfg.factor;
    static const char *const modes[3][2] = {{"push", "fixed"}, {"push", "grow"}, {"pull", "none"}};
    snprintf(in.dispatch_mode, sizeof in.dispatch_mode, "%s", modes[x->cfg.mode][0]);
    snprintf(in.capacity_policy, sizeof in.capacity_policy, "%s", modes[x->cfg.mode][1]);
    in.initial_capacity_factor = x->cfg.initial;
    in.capacity_growth_factor = x->cfg.growth;
    in.max_capacity = x->cfg.mode == MM_MOE_PULL ? 0 : mm_moe_bound_rows(&x->cfg);
    in.growth_events = x->group->n_growth;
    if (mm_shmem_is_running()) {
        mm_shmem_debug_state_t *ds = malloc(sizeof *ds);
        if (ds != NULL && mm_shmem_debug_state(ds) == MEGAMOE_OK) in.shmem_heap_size = ds->heap_size;
        free(ds);
    }
    in.swiglu_limit = x->cfg.limit;
    snprintf(in.schedule, sizeof in.schedule, "%s", mm_moe_schedule_name(x->cfg.schedule));
    in.workers = x->group->workers;
    in.cube_workers = x->group->cube;
    in.vector_workers = x->group->vector;
    in.heap_bytes = x->group->heap_bytes;
    in.group_layers = x->group->layers;
    in.closed = x->closed;
    in.last_recv_rows = x->last_recv_rows;
    in.max_local_num_tokens = x->cfg.dynamic ? x->cfg.T : 0;
    in.last_tokens = x->last_tokens;
    in.replica_slots = x->cfg.replicas;
    if (x->rep) {
        in.last_guests = x->rep->n_guests;
        in.last_rows_moved = x->rep->rows_moved;
        in.last_max_rows_plain = x->rep->max_rows_plain;
        in.last_max_rows = x->rep->max_rows;
    }
    return mm_abi_copy_out(info_p, info_size, &in, sizeof in, "megamoe_experts_info_t");
}

megamoe_status_t megamoe_experts_get_growth(const megamoe_experts_t *x, int index,
                                            megamoe_experts_growth_t *growth_p)
{
    if (x == NULL || growth_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "get_growth: NULL argument");
    if (index < 0 || index >= x->group->n_growth)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "get_growth: event %d does not exist (the resource group grew %d times)",
                        index, x->group->n_growth);
    *growth_p = x->group->growth[index];
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_experts_get_replicas(const megamoe_experts_t *x,
                                              megamoe_experts_replica_t *out, size_t max,
                                              size_t *count_p)
{
    if (x == NULL || count_p == NULL || (out == NULL && max > 0))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "get_replicas: NULL argument");
    size_t n = 0;
    const mm_moe_rep_layer_t *r = x->rep;
    for (int q = 0; r && q < r->ep * r->R; q++) {
        if (r->slot_expert[q] < 0) continue;
        if (n < max) {
            megamoe_experts_replica_t *o = &out[n];
            o->rank = q / r->R;
            o->slot = q % r->R;
            o->expert = r->slot_expert[q];
            o->home = (int)(o->expert / x->L);
            o->rows = r->slot_rows[q];
        }
        n++;
    }
    *count_p = n;
    return MEGAMOE_OK;
}

uint64_t megamoe_experts_layer_number(const megamoe_experts_t *x) { return x ? x->number : 0; }

megamoe_status_t megamoe_experts_get_timing(const megamoe_experts_t *x,
                                            megamoe_experts_timing_t *timing_p)
{
    if (x == NULL || timing_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "get_timing: NULL argument");
    megamoe_experts_timing_t t;
    memset(&t, 0, sizeof t);
    const int o1 = mm_moe_is_o1(&x->cfg);
    const int *ph = o1 ? mm_moe_o1_phases : mm_moe_o0_phases;
    t.count = o1 ? (int)(sizeof mm_moe_o1_phases / sizeof *ph)
                 : (int)(sizeof mm_moe_o0_phases / sizeof *ph);
    for (int i = 0; i < t.count; i++) {
        t.name[i] = mm_moe_phase_names[ph[i]];
        t.seconds[i] = x->phase_s[ph[i]];
    }
    t.forwards = x->forwards;
    t.backwards = x->backwards;
    *timing_p = t;
    return MEGAMOE_OK;
}

void megamoe_experts_reset_timing(megamoe_experts_t *x)
{
    if (x == NULL) return;
    memset(x->phase_s, 0, sizeof x->phase_s);
    x->forwards = x->backwards = 0;
}

megamoe_profile_t *megamoe_experts_get_profile(const megamoe_experts_t *x)
{
    if (x == NULL || x->group == NULL || x->group->exec == NULL) return NULL;
    /* a megamoe_profile_t is an mm_prof_session_t (src/profile/prof_api.c) */
    return (megamoe_profile_t *)(void *)mm_mc_profile(x->group->exec);
}
