/* The scope of the v2 operators: the ranks one call involves (v2_internal.h).
 *
 * Without TP a call involves its EP group only, and only its members take part: two
 * data-parallel replicas with an EP group each run their operators independently. With
 * tp_world_size 2 (or a group_tp given) the call involves the EP group and every member's TP
 * peer, which in every deployment we know of is the whole world; the scope is then the world
 * team, so every world rank calls the TP operators in the same order (a rank whose TP arguments
 * are wrong still finds the same scope and reports its error to all). A scope is its team —
 * the EP communicator's own, so a layer and an operator called out of order on the same group
 * meet in the same exchange (call_order.h) — its operators' call order and the symmetric
 * workspace pools of its calls, allocated on that team. Scopes are cached by the team's id
 * (never reused, unlike its address) and live until the last SHMEM release (or
 * megamoe_ops_release) or until their team is destroyed: a team-destroy hook frees the pools
 * on it first (destroy is collective, and so are the frees).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "v2_internal.h"

static mm_v2_scope_t mm_v2_scopes[MM_V2_MAX_SCOPES];

static void mm_v2_scope_forget(mm_v2_scope_t *s)
{
    if (s->order == &s->calls) mm_call_group_unregister(&s->calls);
    free(s->wpe);
    free(s->idx);
    free(s->lost);
    memset(s, 0, sizeof *s);
}

static mm_v2_scope_t *mm_v2_last_scope;
static megamoe_status_t mm_v2_team_hook(mm_shmem_team_t *team, void *arg);

megamoe_status_t mm_v2_scope_get(mm_shmem_team_t *team, mm_v2_scope_t **scope_p)
{
    if (team == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "group_ep is not a valid communicator "
                        "(destroyed, or the runtime is not running)");
    uint64_t uid = mm_shmem_team_uid(team);
    mm_v2_scope_t *free_slot = NULL;
    for (int i = 0; i < MM_V2_MAX_SCOPES; i++) {
        mm_v2_scope_t *s = &mm_v2_scopes[i];
        if (s->team && s->uid == uid) {
            *scope_p = mm_v2_last_scope = s;
            return MEGAMOE_OK;
        }
        if (!s->team && !free_slot) free_slot = s;
    }
    if (free_slot == NULL)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "more than %d operator scopes (distinct group_ep "
                        "communicators) in one SHMEM lifecycle; reuse communicators",
                        MM_V2_MAX_SCOPES);
    MM_CHECK(mm_shmem_add_team_destroy_hook(mm_v2_team_hook, NULL));
    MM_CHECK(mm_shmem_add_release_hook(mm_v2_release_hook, NULL));
    mm_v2_scope_t *s = free_slot;
    memset(s, 0, sizeof *s);
    int n = mm_shmem_team_n_pes(team), nw = mm_shmem_n_pes();
    s->wpe = malloc(sizeof(int) * (size_t)n);
    s->idx = malloc(sizeof(int) * (size_t)nw);
    if (s->wpe == NULL || s->idx == NULL) {
        free(s->wpe), free(s->idx);
        memset(s, 0, sizeof *s);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "operator scope: out of memory");
    }
    s->team = team;
    s->uid = uid;
    s->n = n;
    s->me = mm_shmem_team_my_pe(team);
    for (int p = 0; p < nw; p++) s->idx[p] = -1;
    for (int i = 0; i < n; i++) {
        s->wpe[i] = mm_shmem_team_world_pe(team, i);
        s->idx[s->wpe[i]] = i;
    }
    /* its call order: on the world team the operators' group of the process (always
     * registered, so a rank that never called an operator keeps in step); else an id the
     * members agree on (their list), never a layer's number */
    if (team == mm_shmem_team_world()) {
        s->order = &mm_call_operators;
    } else {
        uint64_t id = mm_call_digest(s->wpe, sizeof(int) * (size_t)n, 0) | (1ull << 63);
        if (id == MM_CALL_GROUP_OPERATORS) id--;
        s->calls = (mm_call_group_t){.id = id, .calls = 0, .noun = NULL};
        mm_call_group_register(&s->calls);
        s->order = &s->calls;
    }
    *scope_p = mm_v2_last_scope = s;
    return MEGAMOE_OK;
}

mm_v2_scope_t *mm_v2_scope_guess(void)
{
    if (mm_v2_last_scope && mm_v2_last_scope->team) return mm_v2_last_scope;
    uint64_t wu = mm_shmem_team_uid(mm_shmem_team_world());
    for (int i = 0; i < MM_V2_MAX_SCOPES; i++)
        if (mm_v2_scopes[i].team && mm_v2_scopes[i].uid == wu) return &mm_v2_scopes[i];
    return NULL;
}

/* Free the scope's pools and its own team (collective over its members). */
static megamoe_status_t mm_v2_scope_drop(mm_v2_scope_t *s)
{
    megamoe_status_t st = MEGAMOE_OK;
    for (int k = 0; k < MM_V2_WS_COUNT; k++) {
        if (s->base[k] && mm_shmem_is_running()) {
            megamoe_status_t f =
                mm_shmem_team_free(s->pool_team[k] ? s->pool_team[k] : s->team, s->base[k]);
            if (st == MEGAMOE_OK) st = f;
        }
        s->base[k] = NULL;
    }
    megamoe_status_t l = mm_v2_scope_live_drop(s); /* the survivors' team, after its pools */
    if (st == MEGAMOE_OK) st = l;
    if (mm_v2_last_scope == s) mm_v2_last_scope = NULL;
    mm_v2_scope_forget(s);
    return st;
}

/* A team is being destroyed: drop its scope first (the frees are collective, so is destroy). */
static megamoe_status_t mm_v2_team_hook(mm_shmem_team_t *team, void *arg)
{
    (void)arg;
    uint64_t u = mm_shmem_team_uid(team);
    megamoe_status_t st = MEGAMOE_OK;
    for (int i = 0; i < MM_V2_MAX_SCOPES; i++) {
        mm_v2_scope_t *s = &mm_v2_scopes[i];
        if (s->team && s->uid == u) {
            megamoe_status_t d = mm_v2_scope_drop(s);
            if (st == MEGAMOE_OK) st = d;
        }
    }
    return st;
}

megamoe_status_t mm_v2_scopes_release(void)
{
    megamoe_status_t st = MEGAMOE_OK;
    for (int i = 0; i < MM_V2_MAX_SCOPES; i++)
        if (mm_v2_scopes[i].team) {
            megamoe_status_t d = mm_v2_scope_drop(&mm_v2_scopes[i]);
            if (st == MEGAMOE_OK) st = d;
        }
    mm_v2_last_scope = NULL;
    return st;
}
