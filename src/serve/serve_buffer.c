/* The symmetric buffer of the serving MegaMoE (CANN's SymmBuffer): parameters and their
 * agreement, the symmetric receive rows and signal lines on the group's team, the rank mask
 * and the call-order groups of its participant sets, the worker pool, per-call scratch, and
 * the hooks that free it when its team or the runtime goes. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/abi.h"
#include "base/alloc.h"
#include "base/error.h"
#include "serve/serve_o1.h"
#include "shmem/comm_impl.h"

static const char *const mm_sv_type_names[MEGAMOE_SERVE_TYPE_COUNT_] = {
    "none", "bf16", "int8", "int4", "fp8_e4m3fn", "fp8_e5m2", "fp4_e2m1"};

const char *megamoe_serve_type_name(int type)
{
    return type >= 0 && type < MEGAMOE_SERVE_TYPE_COUNT_ ? mm_sv_type_names[type] : "unknown";
}

megamoe_status_t megamoe_symm_buffer_params_init(megamoe_symm_buffer_params_t *p, size_t size)
{
    megamoe_symm_buffer_params_t d;
    memset(&d, 0, sizeof d);
    return mm_abi_init(p, size, &d, sizeof d, "megamoe_symm_buffer_params_t");
}

megamoe_status_t megamoe_mega_moe_args_init(megamoe_mega_moe_args_t *p, size_t size)
{
    megamoe_mega_moe_args_t d;
    memset(&d, 0, sizeof d);
    megamoe_tensor_t none = megamoe_tensor_none();
    d.x = d.topk_ids = d.topk_weights = d.x_active_mask = d.scales = d.y = d.expert_token_nums = none;
    return mm_abi_init(p, size, &d, sizeof d, "megamoe_mega_moe_args_t");
}

size_t mm_sv_row_bytes(int64_t H)
{
    size_t bf = (size_t)H * 2;
    size_t q = mm_align_up((size_t)H, 8) + 8 + (size_t)mm_sv_mx_blocks(H);
    return mm_align_up(bf > q ? bf : q, 64);
}

/* ---- registry (hooks free buffers whose team or runtime goes away) ------------------------ */

static pthread_mutex_t mm_sv_lock = PTHREAD_MUTEX_INITIALIZER;
static megamoe_symm_buffer_t *mm_sv_live[256];
static uint64_t mm_sv_count; /* buffers this process created (their numbers are agreed) */
static int mm_sv_hooked;

static void mm_sv_register(megamoe_symm_buffer_t *b, int on)
{
    pthread_mutex_lock(&mm_sv_lock);
    for (int i = 0; i < 256; i++) {
        if (on && mm_sv_live[i] == NULL) {
            mm_sv_live[i] = b;
            break;
        }
        if (!on && mm_sv_live[i] == b) {
            mm_sv_live[i] = NULL;
            break;
        }
    }
    pthread_mutex_unlock(&mm_sv_lock);
}

/* Free the symmetric memory and the mask teams (collective over the team, when running). */
static megamoe_status_t mm_sv_drop(megamoe_symm_buffer_t *b, int collective)
{
    megamoe_status_t st = MEGAMOE_OK;
    if (!b->alive) return MEGAMOE_OK;
    b->alive = 0;
    mm_sv_register(b, 0);
    if (b->o1) st = mm_sv_o1_destroy(b, collective);
    if (collective && mm_shmem_is_running()) {
        if (b->sig) {
            megamoe_status_t f = mm_shmem_team_free(b->team, b->sig);
            if (st == MEGAMOE_OK) st = f;
        }
        if (b->recv) {
            megamoe_status_t s = mm_shmem_team_free(b->team, b->recv);
            if (st == MEGAMOE_OK) st = s;
        }
    }
    b->sig = NULL;
    b->recv = NULL;
    /* mask teams in key order: one total order on every rank, so no two members wait for each
     * other in different teams' destroys */
    for (;;) {
        mm_sv_order_t *first = NULL;
        for (int i = 0; i < MM_SV_MAX_MASK_GROUPS; i++) {
            mm_sv_order_t *o = &b->orders[i];
            if (o->key && (first == NULL || o->key < first->key)) first = o;
        }
        if (first == NULL) break;
        mm_call_group_unregister(&first->calls);
        if (first->own_team && collective && mm_shmem_is_running()) {
            megamoe_status_t s = mm_shmem_team_destroy(first->team);
            if (st == MEGAMOE_OK) st = s;
        }
        memset(first, 0, sizeof *first);
    }
    return st;
}

/* Memory a buffer left on its old team when update_group moved it (the old team's members
 * are not all in that call): freed when the old team goes, or by the last release. */
static struct {
    mm_shmem_team_t *team;
    void *ptr;
} mm_sv_retired[64];

static megamoe_status_t mm_sv_free_retired(mm_shmem_team_t *team)
{
    megamoe_status_t st = MEGAMOE_OK;
    for (int i = 0; i < 64; i++) {
        pthread_mutex_lock(&mm_sv_lock);
        void *p = mm_sv_retired[i].ptr;
        mm_shmem_team_t *t = mm_sv_retired[i].team;
        if (p && (team == NULL || t == team)) mm_sv_retired[i].ptr = NULL;
        else p = NULL;
        pthread_mutex_unlock(&mm_sv_lock);
        if (p && mm_shmem_is_running()) {
            megamoe_status_t s = mm_shmem_team_free(t, p);
            if (st == MEGAMOE_OK) st = s;
        }
    }
    return st;
}

static megamoe_status_t mm_sv_retire(mm_shmem_team_t *team, void *ptr)
{
    if (ptr == NULL) return MEGAMOE_OK;
    pthread_mutex_lock(&mm_sv_lock);
    int slot = -1;
    for (int i = 0; i < 64 && slot < 0; i++)
        if (mm_sv_retired[i].ptr == NULL) slot = i;
    if (slot >= 0) {
        mm_sv_retired[slot].team = team;
        mm_sv_retired[slot].ptr = ptr;
    }
    pthread_mutex_unlock(&mm_sv_lock);
    if (slot < 0)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "update_group: more than 64 buffer regions wait for "
                        "their old groups to be destroyed; destroy old communicators first");
    return MEGAMOE_OK;
}

static megamoe_status_t mm_sv_team_hook(mm_shmem_team_t *team, void *arg)
{
    (void)arg;
    megamoe_status_t st = mm_sv_free_retired(team), s0 = mm_sv_o1_free_retired(team);
    if (st == MEGAMOE_OK) st = s0;
    for (int i = 0; i < 256; i++) {
        pthread_mutex_lock(&mm_sv_lock);
        megamoe_symm_buffer_t *b = mm_sv_live[i];
        pthread_mutex_unlock(&mm_sv_lock);
        if (b && b->team == team) {
            megamoe_status_t s = mm_sv_drop(b, 1);
            if (st == MEGAMOE_OK) st = s;
        }
    }
    return st;
}

static megamoe_status_t mm_sv_release_hook(void *arg)
{
    (void)arg;
    megamoe_status_t st = mm_sv_free_retired(NULL), s0 = mm_sv_o1_free_retired(NULL);
    if (st == MEGAMOE_OK) st = s0;
    for (int i = 0; i < 256; i++) {
        pthread_mutex_lock(&mm_sv_lock);
        megamoe_symm_buffer_t *b = mm_sv_live[i];
        pthread_mutex_unlock(&mm_sv_lock);
        if (b) {
            megamoe_status_t s = mm_sv_drop(b, 1);
            if (st == MEGAMOE_OK) st = s;
        }
    }
    return st;
}

megamoe_status_t mm_sv_buffer_check(const megamoe_symm_buffer_t *b, const char *what)
{
    if (b == NULL || b->magic != MM_SV_MAGIC)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: not a symmetric buffer (NULL or freed)", what);
    if (!b->alive)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "%s: the symmetric buffer was destroyed (by "
                        "destroy(), or with its group's communicator); create a new one with "
                        "get_symm_buffer_for_mega_moe", what);
    if (b->broken)
        return mm_error(MEGAMOE_INVALID_STATE, "%s: the symmetric buffer's group failed in an "
                        "earlier call (a peer was lost or timed out); destroy it", what);
    return MEGAMOE_OK;
}

megamoe_status_t mm_sv_scratch(megamoe_symm_buffer_t *b, int which, size_t bytes, void **p)
{
    if (bytes == 0) bytes = 64;
    if (b->scr_bytes[which] < bytes) {
        void *n = NULL;
        size_t want = bytes + bytes / 4;
        MM_CHECK(mm_aligned_alloc(want, 64, "mega_moe scratch", &n));
        mm_aligned_free(b->scr[which]);
        b->scr[which] = n;
        b->scr_bytes[which] = want;
    }
    *p = b->scr[which];
    return MEGAMOE_OK;
}

/* ---- creation ---------------------------------------------------------------------------- */

static megamoe_status_t mm_sv_check_params(const megamoe_symm_buffer_params_t *p, int W)
{
#define MM_SV_PBAD(...) mm_error(MEGAMOE_INVALID_ARGUMENT, "get_symm_buffer_for_mega_moe: " __VA_ARGS__)
    if (p->num_experts <= 0 || p->num_experts % W != 0 || p->num_experts > (1 << 20))
        return MM_SV_PBAD("num_experts = %lld must be positive and a multiple of the group size "
                          "%d (each rank owns num_experts / %d experts)",
                          (long long)p->num_experts, W, W);
    if (p->num_max_tokens_per_rank < 0 || p->num_max_tokens_per_rank > (1 << 24))
        return MM_SV_PBAD("num_max_tokens_per_rank = %lld must be >= 0 (0 = no bound)",
                          (long long)p->num_max_tokens_per_rank);
    if (p->num_topk < 1 || p->num_topk > 1024)
        return MM_SV_PBAD("num_topk = %lld must be in [1, 1024]", (long long)p->num_topk);
    if (p->hidden < 1 || p->hidden > (1 << 20))
        return MM_SV_PBAD("hidden = %lld must be in [1, 2^20]", (long long)p->hidden);
    if (p->intermediate_hidden < 0)
        return MM_SV_PBAD("intermediate_hidden = %lld must be >= 0 (it is informational)",
                          (long long)p->intermediate_hidden);
    if (p->max_recv_token_num < 0)
        return MM_SV_PBAD("max_recv_token_num = %lld must be >= 0 (0 = automatic)",
                          (long long)p->max_recv_token_num);
    if (p->num_max_tokens_per_rank == 0 && p->max_recv_token_num == 0)
        return MM_SV_PBAD("num_max_tokens_per_rank and max_recv_token_num are both 0: give a bound "
                          "on the tokens per rank, or the rows one rank may receive per call "
                          "(max_recv_token_num), so the buffer can be sized");
    const int64_t m = p->dispatch_quant_mode;
    const int o = p->dispatch_quant_out_dtype;
    if (m != 0 && m != 2 && m != 4)
        return MM_SV_PBAD("dispatch_quant_mode = %lld is not supported; use 0 (none), 2 (per-token "
                          "int8) or 4 (MX)", (long long)m);
    if (o < 0 || o >= MEGAMOE_SERVE_TYPE_COUNT_ || o == MEGAMOE_SERVE_TYPE_BF16 ||
        o == MEGAMOE_SERVE_TYPE_INT4)
        return MM_SV_PBAD("dispatch_quant_out_dtype %s is not a dispatch type (None, int8, "
                          "float8_e4m3fn, float8_e5m2, float4_e2m1fn_x2)",
                          megamoe_serve_type_name(o));
    if (m == 2 && o != MEGAMOE_SERVE_TYPE_NONE && o != MEGAMOE_SERVE_TYPE_INT8)
        return MM_SV_PBAD("dispatch_quant_mode 2 quantises to int8; dispatch_quant_out_dtype %s "
                          "does not fit (use int8 or None)", megamoe_serve_type_name(o));
    if (m == 4 && (o == MEGAMOE_SERVE_TYPE_NONE || o == MEGAMOE_SERVE_TYPE_INT8))
        return MM_SV_PBAD("dispatch_quant_mode 4 (MX) needs dispatch_quant_out_dtype "
                          "float8_e4m3fn, float8_e5m2 or float4_e2m1fn_x2, not %s",
                          megamoe_serve_type_name(o));
    if (p->combine_quant_mode != 0 && p->combine_quant_mode != 3 && p->combine_quant_mode != 4)
        return MM_SV_PBAD("combine_quant_mode = %lld is not supported; use 0, 3 (MX fp8 e5m2) or "
                          "4 (MX fp8 e4m3fn)", (long long)p->combine_quant_mode);
    if (p->comm_alg && p->comm_alg[0])
        return MM_SV_PBAD("comm_alg '%.32s' is reserved; only \"\" is accepted", p->comm_alg);
    if (p->combine_comm_mode != 0 && p->combine_comm_mode != 1)
        return MM_SV_PBAD("combine_comm_mode = %lld must be 0 or 1", (long long)p->combine_comm_mode);
    if (p->topk_weights_type != 0 && p->topk_weights_type != 1)
        return MM_SV_PBAD("topk_weights_type = %lld must be 0 or 1", (long long)p->topk_weights_type);
#undef MM_SV_PBAD
    return MEGAMOE_OK;
}

/* What creation compares across the members (comm_alg left out: only "" passes the check). */
typedef struct mm_sv_create_rec {
    int64_t v[11];
    uint64_t number;
} mm_sv_create_rec_t;

static const char *const mm_sv_param_names[11] = {
    "num_experts", "num_max_tokens_per_rank", "num_topk", "hidden", "intermediate_hidden",
    "max_recv_token_num", "dispatch_quant_mode", "dispatch_quant_out_dtype", "combine_quant_mode",
    "combine_comm_mode", "topk_weights_type"};

static void mm_sv_rec_fill(mm_sv_create_rec_t *r, const megamoe_symm_buffer_params_t *p)
{
    int64_t v[11] = {p->num_experts, p->num_max_tokens_per_rank, p->num_topk, p->hidden,
                     p->intermediate_hidden, p->max_recv_token_num, p->dispatch_quant_mode,
                     p->dispatch_quant_out_dtype, p->combine_quant_mode, p->combine_comm_mode,
                     p->topk_weights_type};
    memcpy(r->v, v, sizeof v);
}

/* Allocate the receive rows and signal lines on team (collective over its members). */
static megamoe_status_t mm_sv_alloc(megamoe_symm_buffer_t *b, mm_shmem_team_t *team)
{
    /* the receive rows, then (a group spanning hosts, a token bound) the return rows */
    const int spans = b->ranks_per_host < b->W;
    b->ret_rows = spans ? b->p.num_max_tokens_per_rank * b->p.num_topk : 0;
    const size_t recv = (size_t)(b->cap + b->ret_rows) * b->row_bytes,
                 sig = (size_t)3 * (size_t)b->W * 64;
    void *r = NULL, *s = NULL;
    megamoe_status_t st = mm_shmem_team_malloc(team, recv > 0 ? recv : 64, 4096, &r);
    if (st == MEGAMOE_OK) st = mm_shmem_team_malloc(team, sig, 4096, &s);
    if (st == MEGAMOE_OK) {
        memset(s, 0, sig);
        st = mm_shmem_team_barrier(team); /* nobody signals before every rank zeroed its lines */
    }
    if (st != MEGAMOE_OK) {
        /* every member failed the same collective step, so the frees are symmetric */
        if (s) mm_shmem_team_free(team, s);
        if (r) mm_shmem_team_free(team, r);
        if (st == MEGAMOE_OUT_OF_MEMORY)
            return mm_error(st, "get_symm_buffer_for_mega_moe: the SHMEM heap has no room for "
                            "%zu bytes of receive rows (%lld rows of %zu bytes: max_recv_token_num, "
                            "or num_max_tokens_per_rank * group size * min(num_topk, local "
                            "experts); a group spanning hosts adds num_max_tokens_per_rank * "
                            "num_topk = %lld rows for results coming back); set "
                            "HYPER_PARALLEL_SHMEM_HEAP_SIZE larger on every rank before the "
                            "runtime starts, or lower the bounds",
                            recv, (long long)(b->cap + b->ret_rows), b->row_bytes,
                            (long long)b->ret_rows);
        return st;
    }
    b->recv = r;
    b->sig = s;
    b->sym_bytes = mm_align_up(recv, 4096) + mm_align_up(sig, 4096);
    return MEGAMOE_OK;
}

static void mm_sv_bind(megamoe_symm_buffer_t *b, megamoe_comm_t *comm, mm_shmem_team_t *team)
{
    b->comm = comm;
    b->team = team;
    b->me = mm_shmem_team_my_pe(team);
    int host = mm_shmem_host_of(mm_shmem_team_world_pe(team, b->me)), same = 0;
    for (int i = 0; i < b->W; i++) {
        b->pes[i] = mm_shmem_team_world_pe(team, i);
        same += mm_shmem_host_of(b->pes[i]) == host;
    }
    b->ranks_per_host = same;
}

megamoe_status_t megamoe_symm_buffer_create(megamoe_comm_t *group,
                                            const megamoe_symm_buffer_params_t *caller_params,
                                            megamoe_symm_buffer_t **buffer_p)
{
    megamoe_symm_buffer_params_t copy = megamoe_symm_buffer_params_default();
    const megamoe_symm_buffer_params_t *params = NULL;
    mm_shmem_team_t *team = mm_comm_team(group);
    if (team == NULL || buffer_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "get_symm_buffer_for_mega_moe: the group is not "
                        "a live communicator (destroyed, or the runtime stopped) or buffer_p is "
                        "NULL");
    const int W = mm_shmem_team_n_pes(team);
    megamoe_status_t st = mm_take_next_call_error();
    if (st == MEGAMOE_OK && caller_params == NULL)
        st = mm_error(MEGAMOE_INVALID_ARGUMENT, "get_symm_buffer_for_mega_moe: params is NULL");
    if (st == MEGAMOE_OK)
        st = mm_abi_copy_in(&copy, sizeof copy, caller_params, "megamoe_symm_buffer_params_t");
    if (st == MEGAMOE_OK) params = &copy;
    if (st == MEGAMOE_OK) st = mm_sv_check_params(params, W);
    megamoe_symm_buffer_t *b = NULL;
    int cube = 1, vector = 0;
    if (st == MEGAMOE_OK) {
        b = calloc(1, sizeof *b);
        int *pes = calloc((size_t)W, sizeof *pes), *prev = calloc((size_t)W, sizeof *prev);
        int workers = 1;
        if (b == NULL || pes == NULL || prev == NULL) {
            free(b);
            free(pes);
            free(prev);
            b = NULL;
            st = mm_error(MEGAMOE_OUT_OF_MEMORY, "get_symm_buffer_for_mega_moe: out of memory");
        } else {
            b->pes = pes;
            b->prev = prev;
            st = mm_pool_default_workers(&workers);
            if (st == MEGAMOE_OK) st = mm_mc_workers(workers, 0, 0, 0, &cube, &vector);
            if (st == MEGAMOE_OK) st = mm_pool_create(cube + vector, &b->pool);
            b->workers = cube + vector;
        }
    }
    /* every member learns every member's failure, then the parameters are compared */
    st = mm_shmem_team_agree(team, st);
    mm_sv_create_rec_t mine, *all = NULL;
    if (st == MEGAMOE_OK) {
        memset(&mine, 0, sizeof mine);
        mm_sv_rec_fill(&mine, params);
        mine.number = __atomic_load_n(&mm_sv_count, __ATOMIC_RELAXED) + 1;
        all = calloc((size_t)W, sizeof *all);
        st = mm_shmem_team_agree(team, all ? MEGAMOE_OK
                                           : mm_error(MEGAMOE_OUT_OF_MEMORY, "get_symm_buffer: out of memory"));
    }
    if (st == MEGAMOE_OK) st = mm_shmem_team_allgather(team, all, &mine, sizeof mine);
    uint64_t number = 0;
    for (int r = 0; st == MEGAMOE_OK && r < W; r++) {
        for (int f = 0; f < 11; f++)
            if (all[r].v[f] != all[0].v[f]) {
                st = mm_error(MEGAMOE_INVALID_ARGUMENT, "get_symm_buffer_for_mega_moe: %s differs "
                              "between the group's ranks: rank %d passed %lld, rank %d passed "
                              "%lld; every member passes the same arguments",
                              mm_sv_param_names[f], mm_shmem_team_world_pe(team, 0),
                              (long long)all[0].v[f], mm_shmem_team_world_pe(team, r),
                              (long long)all[r].v[f]);
                break;
            }
        if (all[r].number > number) number = all[r].number;
    }
    free(all);
    if (st == MEGAMOE_OK) {
        b->magic = MM_SV_MAGIC;
        b->W = W;
        b->p = *params;
        b->p.comm_alg = "";
        b->L = params->num_experts / W;
        const int64_t K = params->num_topk, mk = K < b->L ? K : b->L;
        b->cap = params->max_recv_token_num > 0 ? params->max_recv_token_num
                                                : params->num_max_tokens_per_rank * W * mk;
        b->row_bytes = mm_sv_row_bytes(params->hidden);
        b->id = number;
        b->last_recv_rows = -1;
        mm_sv_bind(b, group, team);
        st = mm_sv_alloc(b, team);
        /* the O1 path needs a token bound (its graphs are sized by it) */
        if (st == MEGAMOE_OK && params->num_max_tokens_per_rank > 0) {
            st = mm_sv_o1_create(b, cube, vector);
            if (st != MEGAMOE_OK) { /* every member failed the same collective step */
                mm_shmem_team_free(team, b->sig);
                mm_shmem_team_free(team, b->recv);
            }
        }
    }
    if (st == MEGAMOE_OK && !mm_sv_hooked) {
        st = mm_shmem_add_team_destroy_hook(mm_sv_team_hook, NULL);
        if (st == MEGAMOE_OK) st = mm_shmem_add_release_hook(mm_sv_release_hook, NULL);
        mm_sv_hooked = st == MEGAMOE_OK;
    }
    if (st != MEGAMOE_OK) {
        if (b) {
            mm_pool_destroy(b->pool);
            free(b->pes);
            free(b->prev);
            free(b);
        }
        return st;
    }
    uint64_t seen = __atomic_load_n(&mm_sv_count, __ATOMIC_RELAXED);
    while (seen < number &&
           !__atomic_compare_exchange_n(&mm_sv_count, &seen, number, 0, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
    b->alive = 1;
    mm_sv_register(b, 1);
    *buffer_p = b;
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_symm_buffer_destroy(megamoe_symm_buffer_t *b)
{
    if (b == NULL || b->magic != MM_SV_MAGIC)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "destroy: not a symmetric buffer");
    if (!b->alive) return MEGAMOE_OK;
    /* collective: every member frees in the same order (a peer still in a call would meet the
     * free's agreement as another collective and both fail) */
    return mm_sv_drop(b, !b->broken);
}

void megamoe_symm_buffer_free(megamoe_symm_buffer_t *b)
{
    if (b == NULL || b->magic != MM_SV_MAGIC) return;
    if (b->alive) mm_sv_drop(b, 0); /* not destroyed: the memory stays until the team goes */
    b->magic = 0;
    if (b->o1) mm_sv_o1_destroy(b, 0); /* local: host memory freed (its signal area too on a broken team) */
    for (int i = 0; i < 16; i++) mm_aligned_free(b->scr[i]);
    mm_pool_destroy(b->pool);
    free(b->mask);
    free(b->pes);
    free(b->prev);
    free(b);
}

megamoe_status_t megamoe_symm_buffer_set_quant(megamoe_symm_buffer_t *b, int64_t mode, int out)
{
    MM_CHECK(mm_sv_buffer_check(b, "set_quant"));
    /* validated by the next call (CANN's attributes are plain Python attributes) */
    b->p.dispatch_quant_mode = mode;
    b->p.dispatch_quant_out_dtype = out;
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_symm_buffer_update_group(megamoe_symm_buffer_t *b, megamoe_comm_t *group)
{
    MM_CHECK(mm_sv_buffer_check(b, "update_group"));
    mm_shmem_team_t *team = mm_comm_team(group);
    if (team == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "update_group: the group is not a live "
                        "communicator");
    const int W = mm_shmem_team_n_pes(team);
    megamoe_status_t st = MEGAMOE_OK;
    if (W != b->W)
        st = mm_error(MEGAMOE_INVALID_ARGUMENT, "update_group: the new group has %d ranks but the "
                      "buffer was made for %d; a buffer moves only to a group of the same size",
                      W, b->W);
    st = mm_shmem_team_agree(team, st);
    if (st != MEGAMOE_OK) return st;
    int same = 1;
    for (int i = 0; i < W; i++) same &= mm_shmem_team_world_pe(team, i) == b->pes[i];
    if (same && team == b->team) {
        b->comm = group;
        return MEGAMOE_OK;
    }
    /* fresh memory on the new team; the old team's is freed when that team goes (its members
     * are not all part of this call) — until then it stays allocated on the old team */
    void *old_recv = b->recv, *old_sig = b->sig;
    mm_shmem_team_t *old_team = b->team;
    mm_sv_o1_retire(b); /* its signal area is the old team's: calls take the host path */
    mm_sv_register(b, 0);
    for (int i = 0; i < MM_SV_MAX_MASK_GROUPS; i++) mm_call_group_unregister(&b->orders[i].calls);
    memset(b->orders, 0, sizeof b->orders);
    mm_sv_bind(b, group, team);
    b->recv = NULL;
    b->sig = NULL;
    st = mm_sv_alloc(b, team);
    /* (a full table only leaks the old region until exit; the buffer itself is fine) */
    if (mm_sv_retire(old_team, old_recv) != MEGAMOE_OK || mm_sv_retire(old_team, old_sig) != MEGAMOE_OK)
        MM_WARN("update_group: the old group's buffer memory stays allocated until exit");
    if (st != MEGAMOE_OK) {
        b->alive = 0; /* the allocation failed on every member: nothing to free */
        return st;
    }
    b->gen = 0;
    b->prev_n = 0; /* the new memory has no readers yet */
    mm_sv_register(b, 1);
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_symm_buffer_get_info_sized(const megamoe_symm_buffer_t *b,
                                                    megamoe_symm_buffer_info_t *caller_info,
                                                    size_t info_size)
{
    if (b == NULL || b->magic != MM_SV_MAGIC || caller_info == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "symm_buffer_get_info: not a buffer, or info NULL");
    megamoe_symm_buffer_info_t full, *info = &full;
    memset(info, 0, sizeof *info);
    info->rank = b->me;
    info->world_size = b->W;
    info->ranks_per_host = b->ranks_per_host;
    info->alive = b->alive;
    info->params = b->p;
    info->local_experts = b->L;
    info->max_recv_rows = b->cap;
    info->symmetric_bytes = b->alive ? b->sym_bytes : 0;
    info->local_bytes = b->alive ? (size_t)b->cap * b->row_bytes : 0;
    info->calls = b->calls;
    info->last_recv_rows = b->last_recv_rows;
    info->id = b->id;
    info->o1_calls = b->o1_calls;
    return mm_abi_copy_out(caller_info, info_size, info, sizeof *info, "megamoe_symm_buffer_info_t");
}

megamoe_status_t megamoe_symm_buffer_local(megamoe_symm_buffer_t *b, void **ptr_p, size_t *bytes_p)
{
    MM_CHECK(mm_sv_buffer_check(b, "get_local_buffer_tensor"));
    if (ptr_p == NULL || bytes_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "get_local_buffer_tensor: NULL output pointer");
    *ptr_p = b->recv;
    *bytes_p = (size_t)b->cap * b->row_bytes;
    return MEGAMOE_OK;
}

/* ---- the rank mask ---------------------------------------------------------------------- */

megamoe_status_t megamoe_symm_buffer_mask(megamoe_symm_buffer_t *b, int32_t **mask_p)
{
    if (b == NULL || b->magic != MM_SV_MAGIC || mask_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mask: not a buffer, or mask_p NULL");
    if (b->mask == NULL) {
        b->mask = calloc((size_t)b->W, sizeof *b->mask);
        if (b->mask == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "mask: out of memory");
    }
    *mask_p = b->mask;
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_symm_buffer_mask_set(megamoe_symm_buffer_t *b, int rank, int masked)
{
    int32_t *m;
    MM_CHECK(megamoe_symm_buffer_mask(b, &m));
    if (rank < 0 || rank >= b->W)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "update_mask_buffer: rank %d is outside [0, %d)",
                        rank, b->W);
    m[rank] = masked ? 1 : 0;
    return MEGAMOE_OK;
}

megamoe_status_t megamoe_symm_buffer_mask_clear(megamoe_symm_buffer_t *b)
{
    int32_t *m;
    MM_CHECK(megamoe_symm_buffer_mask(b, &m));
    memset(m, 0, sizeof *m * (size_t)b->W);
    return MEGAMOE_OK;
}

megamoe_status_t mm_sv_order(megamoe_symm_buffer_t *b, mm_sv_order_t **order_p)
{
    int n = 0, me_masked = 0;
    int pes[1024];
    if (b->W > 1024) return mm_error(MEGAMOE_INVALID_ARGUMENT, "mega_moe: more than 1024 ranks");
    for (int i = 0; i < b->W; i++) {
        if (b->mask && b->mask[i]) {
            me_masked |= i == b->me;
            continue;
        }
        pes[n++] = b->pes[i];
    }
    if (me_masked)
        return mm_error(MEGAMOE_INVALID_STATE, "mega_moe: this rank (%d) is disabled in the "
                        "buffer's rank mask; masked ranks do not call mega_moe (the call is "
                        "collective over the unmasked ranks)", b->me);
    if (n == 0) return mm_error(MEGAMOE_INVALID_STATE, "mega_moe: every rank is masked");
    const uint64_t key = mm_call_digest(pes, sizeof(int) * (size_t)n, 0) | 1;
    mm_sv_order_t *slot = NULL;
    for (int i = 0; i < MM_SV_MAX_MASK_GROUPS; i++) {
        if (b->orders[i].key == key) {
            *order_p = &b->orders[i];
            return MEGAMOE_OK;
        }
        if (!b->orders[i].key && !slot) slot = &b->orders[i];
    }
    if (slot == NULL)
        return mm_error(MEGAMOE_INVALID_STATE, "mega_moe: more than %d distinct rank masks used "
                        "with one buffer; create a new buffer", MM_SV_MAX_MASK_GROUPS);
    mm_shmem_team_t *team = b->team;
    int own = 0;
    if (n != b->W) { /* collective over the participants */
        MM_CHECK(mm_shmem_team_create_keyed(pes, n, (1ull << 62) | b->id, &team));
        own = 1;
    }
    memset(slot, 0, sizeof *slot);
    slot->key = key;
    slot->team = team;
    slot->own_team = own;
    /* its own call sequence: the participants' numbers stay equal while others sit out */
    uint64_t id = (1ull << 62) | (b->id << 16) | (n == b->W ? 0 : (key & 0xFFFF) | 1);
    slot->calls = (mm_call_group_t){.id = id, .calls = 0, .noun = "symm_buffer"};
    mm_call_group_register(&slot->calls);
    *order_p = slot;
    return MEGAMOE_OK;
}
