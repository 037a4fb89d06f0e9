/* DispatchV2 / CombineV2 / CombineAddRmsNorm through a lost rank: the runtime's elastic mask
 * (docs/ops.md "Through a lost rank").
 *
 * The operators' calls are collective over their scope (the EP group). When the survivors of a
 * loss agreed on who is gone (shmem/survive.h), the next call on every survivor acknowledges
 * it, marks the scope's lost members, and runs its exchange on a team of the survivors (made
 * once per set of survivors, collective over them). The lost members' records are stand-ins
 * (this rank's attributes, no rows), so the agreement, the layout and every index keep the
 * physical EP ranks: ep_world_size, ep_rank_id and the output layouts are unchanged, a lost
 * source sends nothing (its blocks are empty), and a (token, k) pair routed to a lost rank's
 * experts is not sent, not counted and adds nothing in the combine — nothing is renormalised.
 * The symmetric workspaces stay where they are; one that must grow is allocated anew on the
 * survivors' team. Unsupported with a lost member, on every survivor alike: tp_world_size 2,
 * comm_alg hierarchy and fullmesh_v2, elastic_info with isScaled 1.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "v2_internal.h"

megamoe_status_t mm_v2_survivors(mm_v2_call_t *call)
{
    call->lost = NULL;
    MM_CHECK(mm_shmem_recover());
    mm_v2_scope_t *s = call->scope;
    int any = 0;
    for (int i = 0; i < s->n; i++) any |= !mm_shmem_pe_alive(s->wpe[i]);
    if (!any) return MEGAMOE_OK;
    if (s->lost == NULL && (s->lost = calloc((size_t)s->n, 1)) == NULL)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "operators: out of memory");
    for (int i = 0; i < s->n; i++) s->lost[i] = (uint8_t)!mm_shmem_pe_alive(s->wpe[i]);
    call->lost = s->lost;
    return MEGAMOE_OK;
}

megamoe_status_t mm_v2_scope_live_drop(mm_v2_scope_t *s)
{
    if (s->live == NULL) return MEGAMOE_OK;
    mm_call_group_unregister(&s->live_calls);
    /* collective over the survivors (local when one of them was lost since) */
    megamoe_status_t st = mm_shmem_is_running() ? mm_shmem_team_destroy(s->live) : MEGAMOE_OK;
    s->live = NULL;
    return st;
}

megamoe_status_t mm_v2_exchange_team(mm_v2_call_t *call, mm_shmem_team_t **team_p,
                                     mm_call_group_t **order_p)
{
    mm_v2_scope_t *s = call->scope;
    if (call->lost == NULL) {
        *team_p = s->team;
        *order_p = s->order;
        return MEGAMOE_OK;
    }
    if (s->live && mm_shmem_team_lost_member(s->live) >= 0) { /* another loss since: local */
        for (int k = 0; k < MM_V2_WS_COUNT; k++)
            if (s->base[k] && s->pool_team[k] == s->live) { /* its pools go with it (local) */
                (void)mm_shmem_team_free(s->live, s->base[k]);
                s->base[k] = NULL;
                s->size[k] = 0;
                s->pool_team[k] = NULL;
            }
        (void)mm_v2_scope_live_drop(s);
    }
    if (s->live == NULL) {
        int *pes = malloc(sizeof(int) * (size_t)s->n), k = 0;
        if (pes == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "operators: out of memory");
        for (int i = 0; i < s->n; i++)
            if (!s->lost[i]) pes[k++] = s->wpe[i];
        /* keyed by the scope (its members): not paired with another team of the survivors */
        uint64_t key = mm_call_digest(s->wpe, sizeof(int) * (size_t)s->n, 0x76325f6c697665ull);
        megamoe_status_t st = mm_shmem_team_create_keyed(pes, k, key, &s->live);
        uint64_t id = mm_call_digest(pes, sizeof(int) * (size_t)k, 0) | (3ull << 62);
        free(pes);
        MM_CHECK(st);
        if (id == MM_CALL_GROUP_OPERATORS) id--;
        s->live_calls = (mm_call_group_t){.id = id, .calls = 0, .noun = NULL};
        mm_call_group_register(&s->live_calls);
    }
    *team_p = s->live;
    *order_p = &s->live_calls;
    return MEGAMOE_OK;
}

megamoe_status_t mm_v2_lost_unsupported(const mm_v2_call_t *call, const mm_v2_cfg_t *c,
                                        const char *op_name)
{
    if (call->lost == NULL) return MEGAMOE_OK;
    const char *what = c->tp == 2                        ? "tp_world_size 2"
                       : c->alg == MM_V2_ALG_HIERARCHY   ? "comm_alg hierarchy"
                       : c->alg == MM_V2_ALG_FULLMESH_V2 ? "comm_alg fullmesh_v2"
                       : c->scaled                       ? "elastic_info with isScaled 1"
                                                         : NULL;
    if (what == NULL) return MEGAMOE_OK;
    int q = 0;
    while (q < call->n_world && !call->lost[q]) q++;
    return mm_error(MEGAMOE_INVALID_STATE, "%s: world rank %d of the EP group was lost; the "
                    "survivors run the operators with the lost ranks masked, but not with %s: "
                    "use comm_alg fullmesh_v1 (\"\") without TP and without a scaled "
                    "elastic_info, or restart with the survivors", op_name,
                    q < call->n_world ? call->scope->wpe[q] : -1, what);
}
