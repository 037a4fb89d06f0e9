/* Agreement and symmetric workspaces of the v2 operators (see v2_internal.h).
 *
 * A call's ranks are its scope (v2_scope.c: the EP group, with TP its members' TP peers too).
 * The workspaces are pools of the scope (one per operator kind), allocated on the scope's
 * team: its members call the operators in the same order, each call starts with one allgather
 * of a fixed-size record over the scope, and every member derives the same decisions from the
 * same records — in particular whether a pool must grow and to what size (the scope's maximum
 * of what any member needs), so repeated calls with the same sizes never allocate. Segment 0
 * of a pool holds the signal lines; they are zeroed when a pool is (re)allocated and otherwise
 * only ever raised to the call generation.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/freelist.h"
#include "ops/call_order.h"
#include "v2_internal.h"

/* agreement records of ended calls, handed out again (one block per call in flight) */
static mm_freelist_t mm_v2_record_blocks = MM_FREELIST_INIT;

static const char *const mm_v2_attr_names[MM_V2_NATTR] = {
    "operator",        "ep_world_size",    "moe_expert_num",    "shared_expert_num",
    "shared_expert_rank_num", "expert_shard_type", "K (expert_ids dim 1)", "H",
    "token dtype",     "quant_mode",       "expand_x dtype",    "global_bs (BS * ep_world_size when 0)",
    "tp_world_size",   "comm_alg",         "zero_expert_num",   "copy_expert_num",
    "const_expert_num", "comm_quant_mode", "elastic_info",
    "MEGAMOE_RANKS_PER_NODE", "the scales layout of a pre-quantised x (scales / scales_dtype)"};

megamoe_status_t mm_v2_call_begin(mm_v2_call_t *call, mm_v2_ws_kind_t kind, megamoe_comm_t *ep,
                                  megamoe_comm_t *tp, int uses_tp)
{
    memset(call, 0, sizeof *call);
    call->kind = kind;
    if (!mm_shmem_is_running())
        return mm_error(MEGAMOE_INVALID_STATE, "the communication runtime is not running: create "
                        "a communicator (megamoe_comm_create) before calling the operators");
    mm_shmem_team_t *tp_team = tp ? mm_comm_team(tp) : NULL;
    mm_shmem_team_t *ep_team = ep ? mm_comm_team(ep) : NULL;
    /* a refused call or a dead group_ep: the groups are unknown; the scope of this rank's last
     * call (else the world's) is the best place to report the error to the others */
    if (!uses_tp && ep_team == NULL) call->scope = mm_v2_scope_guess();
    if (call->scope == NULL)
        MM_CHECK(mm_v2_scope_get(uses_tp || ep_team == NULL ? mm_shmem_team_world() : ep_team,
                                 &call->scope));
    call->n_world = call->scope->n;
    call->me = call->scope->me;
    call->rec_bytes = mm_align_up(sizeof(mm_v2_record_t) + 8u * (size_t)call->n_world, 8);
    if (mm_freelist_get(&mm_v2_record_blocks, (size_t)call->n_world * call->rec_bytes, 1,
                        "agreement records", (void **)&call->records) != MEGAMOE_OK)
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "no memory for %d agreement records", call->n_world);
    call->ep = ep ? mm_comm_team(ep) : NULL;
    call->tp = tp_team && mm_shmem_team_n_pes(tp_team) == 2 ? tp_team : NULL;
    mm_v2_record_t *r = mm_v2_rec(call, call->me);
    r->status = MEGAMOE_OK;
    r->ep_leader = r->tp_leader = -1;
    r->ep_rank = r->tp_rank = -1;
    r->pad = -1;
    if (call->ep) {
        r->ep_leader = mm_v2_ep_pe(call, 0);
        r->ep_rank = mm_shmem_team_my_pe(call->ep);
        r->ep_size = mm_shmem_team_n_pes(call->ep);
    }
    if (call->tp) {
        r->tp_rank = mm_shmem_team_my_pe(call->tp);
        r->tp_leader = call->scope->idx[mm_shmem_team_world_pe(call->tp, 0)];
        r->tp_size = 2;
        r->pad = mm_v2_tp_peer_pe(call, r->tp_rank); /* the peer's member index */
    }
    return MEGAMOE_OK;
}

void mm_v2_call_end(mm_v2_call_t *call)
{
    mm_freelist_put(&mm_v2_record_blocks, call->records);
    call->records = NULL;
}

megamoe_status_t mm_v2_call_agree(mm_v2_call_t *call, int call_kind)
{
    const char *op_name = mm_call_kind_name(call_kind);
    mm_v2_record_t *mine = mm_v2_rec(call, call->me);
    int kind = call->kind;
    mine->ws_size = call->scope->size[kind];
    mine->gen = call->scope->gen[kind];
    /* 1. the call order and every rank's local status, in the one scope exchange of the
     *    records (the descriptor travels with them): a failing rank keeps its own message,
     *    the others get "rank R: <its message>", before data moves. After a loss the exchange
     *    runs among the survivors and the lost members get stand-in records: this rank's
     *    attributes and workspace, no rows (v2_survive.c) */
    mm_shmem_team_t *xteam = NULL;
    mm_call_group_t *order = NULL;
    MM_CHECK(mm_v2_exchange_team(call, &xteam, &order));
    mm_call_t c;
    mm_call_begin(&c, order, call_kind, 0, 0);
    c.keep_own_error = 1;
    megamoe_status_t st = mm_call_exchange(&c, xteam, (megamoe_status_t)mine->status, mine,
                                           call->rec_bytes);
    for (int p = 0, m = 0; st == MEGAMOE_OK && p < call->n_world; p++) {
        uint8_t *rec = call->records + (size_t)p * call->rec_bytes;
        if (p == call->me) {
            m++;
            continue; /* mine stays (the exchange returned the same bytes) */
        }
        if (!mm_v2_lost(call, p)) {
            memcpy(rec, mm_call_payload(&c, m++), call->rec_bytes);
            continue;
        }
        memcpy(rec, mine, call->rec_bytes);
        mm_v2_record_t *r = (mm_v2_record_t *)(void *)rec;
        r->status = MEGAMOE_OK;
        memset(r->seg, 0, sizeof r->seg);
        memset(mm_v2_rec_counts(call, p), 0, sizeof(int32_t) * 2 * (size_t)call->n_world);
    }
    mm_call_end(&c);
    MM_CHECK(st);
    int n = call->n_world;
    /* 2. every rank has the same workspace history */
    for (int p = 0; p < n; p++) {
        mm_v2_record_t *r = mm_v2_rec(call, p);
        if (r->ws_size != mine->ws_size)
            return mm_error(MEGAMOE_CONFIG_MISMATCH, "%s: the operator workspaces differ between "
                            "world ranks %d and %d: every rank must call the operators in the same "
                            "order", op_name, mm_v2_wpe(call, p), mm_v2_wpe(call, call->me));
    }
    /* 3. attributes equal inside every EP group, TP peers compatible (checked for all groups,
     *    so every rank reaches the same verdict) */
    for (int p = 0; p < n; p++) {
        mm_v2_record_t *r = mm_v2_rec(call, p);
        if (r->ep_leader < 0 || r->ep_leader >= n)
            return mm_error(MEGAMOE_INTERNAL, "%s: world rank %d has no EP group", op_name,
                            mm_v2_wpe(call, p));
        mm_v2_record_t *l = mm_v2_rec(call, r->ep_leader);
        if (l->ep_leader != r->ep_leader || l->ep_size != r->ep_size)
            return mm_error(MEGAMOE_CONFIG_MISMATCH, "%s: world ranks %d and %d disagree about "
                            "their EP group (group_ep must be the same communicator on its ranks)",
                            op_name, mm_v2_wpe(call, p), mm_v2_wpe(call, r->ep_leader));
        for (int i = 0; i < MM_V2_NATTR; i++)
            if (r->attrs[i] != l->attrs[i])
                return mm_error(MEGAMOE_CONFIG_MISMATCH, "%s: %s differs inside an EP group: "
                                "world rank %d has %lld, world rank %d has %lld; pass the same "
                                "value on every rank", op_name, mm_v2_attr_names[i],
                                mm_v2_wpe(call, p), (long long)r->attrs[i],
                                mm_v2_wpe(call, r->ep_leader), (long long)l->attrs[i]);
        if (r->tp_size == 2) {
            int q = r->pad;
            mm_v2_record_t *o = (q >= 0 && q < n) ? mm_v2_rec(call, q) : NULL;
            if (o == NULL || o->tp_size != 2 || o->pad != p)
                return mm_error(MEGAMOE_CONFIG_MISMATCH, "%s: world rank %d and its TP peer %d "
                                "disagree about group_tp", op_name, mm_v2_wpe(call, p),
                                q >= 0 && q < n ? mm_v2_wpe(call, q) : -1);
            static const char *const tp_names[4] = {"H", "expand_x dtype", "quant_mode", "A"};
            for (int i = 0; i < 4; i++)
                if (r->tp_attrs[i] != o->tp_attrs[i])
                    return mm_error(MEGAMOE_CONFIG_MISMATCH, "%s: %s differs between TP peers "
                                    "(world ranks %d: %lld, %d: %lld)", op_name, tp_names[i],
                                    mm_v2_wpe(call, p), (long long)r->tp_attrs[i],
                                    mm_v2_wpe(call, q), (long long)o->tp_attrs[i]);
        }
    }
    return MEGAMOE_OK;
}

void mm_v2_record_attrs(const mm_v2_cfg_t *c, mm_v2_record_t *r)
{
    int64_t *a = r->attrs;
    a[MM_V2_ATTR_OP] = c->op;
    a[MM_V2_ATTR_EP_WORLD] = c->W;
    a[MM_V2_ATTR_MOE_EXPERTS] = c->E;
    a[MM_V2_ATTR_SHARED_EXPERTS] = c->NS;
    a[MM_V2_ATTR_SHARED_RANKS] = c->S;
    a[MM_V2_ATTR_SHARD_TYPE] = 0;
    a[MM_V2_ATTR_K] = c->K;
    a[MM_V2_ATTR_H] = c->h;
    a[MM_V2_ATTR_XTYPE] = c->xtype;
    a[MM_V2_ATTR_YTYPE] = c->ytype;
    a[MM_V2_ATTR_QUANT] = c->quant;
    a[MM_V2_ATTR_GLOBAL_BS] = c->gbs_real;
    a[MM_V2_ATTR_TP_WORLD] = c->tp;
    a[MM_V2_ATTR_ALG] = c->alg;
    a[MM_V2_ATTR_ZERO] = c->Z;
    a[MM_V2_ATTR_COPY] = c->Cp;
    a[MM_V2_ATTR_CONST] = c->Cn;
    a[MM_V2_ATTR_COMM_QUANT] = c->comm_quant;
    a[MM_V2_ATTR_ELASTIC] = (int64_t)(c->elastic_hash >> 1);
    a[MM_V2_ATTR_HIER_GROUP] = c->hier_group;
    a[MM_V2_ATTR_PASS_SCALES] = c->pass;
    r->tp_attrs[0] = c->h;
    r->tp_attrs[1] = c->ytype;
    r->tp_attrs[2] = c->quant;
    r->tp_attrs[3] = c->A;
    r->bs = c->bs;
}

uint64_t mm_v2_call_segmax(const mm_v2_call_t *call, int s)
{
    uint64_t m = 0;
    for (int p = 0; p < call->n_world; p++)
        if (mm_v2_rec(call, p)->seg[s] > m) m = mm_v2_rec(call, p)->seg[s];
    return m;
}

megamoe_status_t mm_v2_call_layout(mm_v2_call_t *call, int nseg, const uint64_t *seg_bytes)
{
    int kind = call->kind;
    uint64_t off = 0;
    for (int s = 0; s < nseg; s++) {
        call->seg_off[s] = off;
        off += mm_align_up(seg_bytes[s] ? seg_bytes[s] : 64, 4096);
    }
    mm_v2_scope_t *sc = call->scope;
    /* after a loss the pool grows on the survivors' team (the scope's cannot allocate) */
    mm_shmem_team_t *team = call->lost ? sc->live : sc->team;
    if (off > sc->size[kind]) {
        /* grow: same decision on every member (the scope's maxima, same history) */
        uint64_t want = sc->size[kind] + sc->size[kind] / 2;
        if (want < off) want = off;
        want = mm_align_up(want, 2u << 20);
        if (sc->base[kind]) {
            MM_CHECK(mm_shmem_team_free(sc->pool_team[kind] ? sc->pool_team[kind] : sc->team,
                                        sc->base[kind]));
            sc->base[kind] = NULL;
            sc->size[kind] = 0;
        }
        void *p = NULL;
        megamoe_status_t st = mm_shmem_team_malloc(team, want, 4096, &p);
        if (st != MEGAMOE_OK)
            return mm_error(st, "%s; the dispatch/combine workspace needs %llu bytes of symmetric "
                            "heap: raise HYPER_PARALLEL_SHMEM_HEAP_SIZE", megamoe_last_error(),
                            (unsigned long long)want);
        sc->base[kind] = p;
        sc->size[kind] = want;
        sc->pool_team[kind] = team;
        /* The last SHMEM release frees the workspaces itself (no explicit call needed). */
        MM_CHECK(mm_shmem_add_release_hook(mm_v2_release_hook, NULL));
        memset(p, 0, call->seg_off[1] ? call->seg_off[1] : 4096); /* signal lines */
        MM_CHECK(mm_shmem_team_barrier(team));
    }
    call->base = sc->base[kind];
    /* the largest generation of any member, plus one: equal to the previous call's + 1 on
     * every member, also after members failed different calls at a loss */
    uint64_t gen = 0;
    for (int p = 0; p < call->n_world; p++)
        if (!mm_v2_lost(call, p) && mm_v2_rec(call, p)->gen > gen) gen = mm_v2_rec(call, p)->gen;
    call->gen = sc->gen[kind] = gen + 1;
    return MEGAMOE_OK;
}

megamoe_status_t mm_v2_sig_status(const mm_v2_call_t *call, uint64_t value, const char *what,
                                  int peer)
{
    int code = (int)(value & 0xff);
    if (code == 0 || (value >> 8) != call->gen) return MEGAMOE_OK;
    megamoe_status_t st = (megamoe_status_t)-code;
    return mm_error(st, "%s: world rank %d failed this call (%s) and sent nothing more; every "
                    "rank of the call returns it", what, mm_v2_wpe(call, peer),
                    megamoe_status_name(st));
}

megamoe_status_t mm_v2_wait(const mm_v2_call_t *call, uint64_t *sig, const char *what, int peer,
                            int64_t *waited_us)
{
    uint64_t t0 = waited_us ? mm_now_ns() : 0, value = 0;
    megamoe_status_t st =
        mm_shmem_signal_wait_until(sig, MM_SHMEM_CMP_GE, mm_v2_sigval(call, MEGAMOE_OK), &value);
    if (st != MEGAMOE_OK)
        return mm_error(st, "waiting for %s from world rank %d: %s", what,
                        mm_v2_wpe(call, peer), megamoe_last_error());
    if (waited_us) *waited_us += (int64_t)((mm_now_ns() - t0) / 1000);
    return mm_v2_sig_status(call, value, what, peer);
}

void mm_v2_poison_line(const mm_v2_call_t *call, int s, int line, int pe, megamoe_status_t st)
{
    uint64_t *sig = mm_v2_sig(call, s, line);
    for (int i = 0; i < 2; i++)
        if (mm_shmem_signal_op(sig, mm_v2_sigval(call, st), MM_SHMEM_SIGNAL_SET,
                               mm_v2_wpe(call, pe)) == MEGAMOE_OK)
            return;
    /* the peer would wait for the timeout: a broken connection, every rank learns it */
    mm_shmem_declare_lost(mm_v2_wpe(call, pe), "a call's failure could not be signalled to it");
}

int mm_v2_ep_pe(const mm_v2_call_t *call, int64_t ep_rank)
{
    return call->scope->idx[mm_shmem_team_world_pe(call->ep, (int)ep_rank)];
}

int mm_v2_tp_peer_pe(const mm_v2_call_t *call, int64_t tp_rank)
{
    return call->scope->idx[mm_shmem_team_world_pe(call->tp, (int)(1 - tp_rank))];
}

megamoe_status_t mm_v2_release_hook(void *arg)
{
    (void)arg;
    return megamoe_ops_release();
}

megamoe_status_t megamoe_ops_release(void)
{
    mm_v2_scratch_release();
    /* every scope's pools and team (collective per scope); generations and call numbers
     * restart with the next scope, whose signal lines start at 0 on every member */
    megamoe_status_t st = mm_v2_scopes_release();
    mm_call_operators.calls = 0;
    mm_call_forget_seen();
    return st;
}

megamoe_status_t mm_v2_call_refuse(int call_kind, megamoe_status_t st)
{
    if (!mm_shmem_is_running()) return st; /* nobody to tell */
    char text[1024];
    snprintf(text, sizeof text, "%s", megamoe_last_error());
    mm_v2_call_t call;
    megamoe_status_t bs = mm_v2_call_begin(&call, MM_V2_WS_DISPATCH, NULL, NULL, 0);
    if (bs == MEGAMOE_OK) bs = mm_v2_survivors(&call); /* to the survivors after a loss */
    if (bs != MEGAMOE_OK) {
        mm_v2_call_end(&call);
        return bs;
    }
    mm_set_last_error(text);
    mm_v2_rec(&call, call.me)->status = st;
    megamoe_status_t agreed = mm_v2_call_agree(&call, call_kind);
    mm_v2_call_end(&call);
    return agreed;
}
