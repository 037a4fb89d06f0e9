/* The plain BF16 expert-parallel routing plan: who sends which token row where.
 *
 * Every rank has T tokens, each routed to K global experts (topk_ids [T, K]); the E experts
 * are spread over the EP ranks of the team, L = E / EP per rank, expert e on rank e / L in
 * local slot e % L. A "slot" is one (token t, choice k) pair, index t*K + k.
 *
 * Layouts (docs/architecture.md "Data layout"):
 *  - Source side, "permuted order": this rank's T*K slots sorted by global expert, ties in
 *    slot order (stable). Expert e's rows are [src_off[e], src_off[e+1]). Rows that come back
 *    from the experts (combine) land in a T*K-row buffer in this order.
 *  - Destination side, "receive order": rows grouped by local expert j, then by source rank s,
 *    then in the source's permuted order. Local expert j is the row range
 *    [group_off[j], group_off[j+1]) (one grouped-GEMM group); block (j, s) is the contiguous
 *    range [blk_off[j*EP+s], +blk_rows[j*EP+s]).
 *  Row i of this rank's expert-e block goes to row dst_off[e] + i of rank e/L's receive buffer,
 *  and row i of block (j, s) returns to row ret_off[j*EP+s] + i of rank s's return buffer.
 *
 * Hot-expert replicas (shape.replica_slots = R > 0, ep_replicas.h): every rank also has R
 * guest slots, so the destination side has S = L + R slots per rank: slot v < L is local
 * expert v, slot L + g is guest slot g, serving the expert slot_expert[d*S + v] (-1 when
 * unused in this call). The routing plan then splits a hot expert's rows: source s sends the
 * first rows of its expert-e block to e's home and the next ones to each guest slot of e in
 * slot order, so every (destination slot, source) pair is still one contiguous range on both
 * sides. With R = 0, S = L and every slot is its home expert (the layout above).
 *
 * Per-call token counts: a plan is sized for T_cap tokens per rank (shape.tokens) and each call
 * routes T_r <= T_cap rows on this rank (any count, 0 included, different on every rank). T_r
 * travels with the counts in the one exchange (tokens_of[s] on every rank), so every rank also
 * knows every peer's count and the largest block of the call (max_block_rows: what the O1
 * executor sizes its tiles by) without another round trip.
 *
 * Building a plan is collective over the team: each rank counts its slots per expert, the
 * counts are all-gathered (counts[s][e] on every rank), every rank runs the replica planner on
 * them (R > 0) and derives the same offsets. Capacity: every destination's received rows
 * (with the replica plan's split) are compared with the capacity on every rank from the same
 * gathered matrix, so an overflow is the same CAPACITY_OVERFLOW everywhere, before any data
 * moves. Invalid expert ids on any rank are INVALID_ARGUMENT on every rank.
 */
#ifndef MM_OPS_EP_ROUTE_H
#define MM_OPS_EP_ROUTE_H

#include <stdint.h>

#include "megamoe/dtype.h"
#include "megamoe/status.h"

#include "ops/call_order.h"
#include "ops/ep_replicas.h"
#include "shmem/shmem.h"

typedef struct mm_ep_shape {
    int ep;             /* ranks in the team */
    int me;             /* this rank's index in the team */
    int64_t tokens;     /* T_cap: the most tokens per rank a call may route (sizes the plan) */
    int64_t top_k;      /* K */
    int64_t experts;    /* E (global), divisible by ep */
    int64_t capacity;   /* receive rows per rank (the symmetric receive buffer) */
    double capacity_factor; /* for the overflow message only: 0 = lossless */
    int replica_slots;  /* R guest slots per rank (0 = no replicas) */
    const int32_t *host_of; /* [ep] host of each rank for the replica costs; NULL = one host */
    mm_ep_replica_cost_t replica_cost; /* used when replica_slots > 0 */
} mm_ep_shape_t;

typedef struct mm_ep_plan {
    int ep, me;
    int64_t T;      /* this call's tokens on this rank (T_r, set by mm_ep_route) */
    int64_t T_cap;  /* shape.tokens: what the arrays are sized for */
    int64_t K, E, L, capacity;
    double capacity_factor;

    int32_t *counts; /* [ep * E]: rows from source s to global expert e (counts[s*E + e]) */
    int32_t *hist;   /* [E + 1]: this rank's own counts before the exchange, then T_r */
    int64_t *tokens_of; /* [ep]: every rank's T_r in this call */
    int64_t max_tokens; /* the largest T_r of the call */
    int64_t max_block_rows; /* the largest block (slot, source) of the call, any rank */

    /* source side */
    int64_t *src_off;   /* [E + 1] */
    int32_t *perm_slot; /* [T*K] permuted position -> slot */
    int32_t *slot_pos;  /* [T*K] slot -> permuted position */
    int64_t *dst_off;   /* [E] first row of the home's share in the home's receive buffer */

    /* slots (hot-expert replicas) */
    int R;                /* guest slots per rank */
    int64_t S;            /* slots per rank: L + R */
    int32_t *slot_expert; /* [ep * S]: global expert served by slot (d, v); -1 = unused */
    mm_ep_replica_plan_t *rep; /* the replica plan of the call; NULL when R == 0 */
    int32_t *host_of;     /* [ep] copy of the shape's host map, or NULL */
    mm_ep_replica_cost_t replica_cost;
    int64_t *bcount;      /* [ep * S * ep] rows of block (d, v, s), index (d*S + v)*ep + s */
    int64_t *src_prefix;  /* [ep * (E + 1)] source s's permuted offset of expert e */
    /* source side by destination slot (d, v), index d*S + v: this rank's rows for it */
    int64_t *seg_pos;   /* [ep * S] first permuted position */
    int64_t *seg_rows;  /* [ep * S] */
    int64_t *seg_dst;   /* [ep * S] first row in d's receive buffer */
    int32_t *seg_order; /* non-empty (d, v) in permuted order */
    int32_t n_seg;

    /* destination side (blocks of slots: (v, s), index v * ep + s) */
    int64_t recv_rows;  /* rows this rank receives */
    int64_t *group_off; /* [S + 1] */
    int64_t *blk_off;   /* [S * ep] */
    int64_t *blk_rows;  /* [S * ep] */
    int64_t *ret_off;   /* [S * ep] row in source s's return buffer (its permuted position) */

    /* whole team */
    int64_t max_recv;  /* the largest receive count of any rank */
    int max_recv_rank; /* which rank (lowest on ties) */
} mm_ep_plan_t;

/* Allocate a plan for fixed shapes. INVALID_ARGUMENT for shapes out of range (E % ep,
 * T*K >= 2^31, ...). */
megamoe_status_t mm_ep_plan_create(const mm_ep_shape_t *shape, mm_ep_plan_t **plan_p);
void mm_ep_plan_destroy(mm_ep_plan_t *plan);

/* Collective over team (ep members, this rank = plan->me): build the plan for this call's
 * tokens rows (0 <= tokens <= shape.tokens; larger is INVALID_ARGUMENT) of topk_ids
 * [tokens, K] (INT32 or INT64 global ids). tokens_per_expert ([E], INT32 or INT64, may be NULL)
 * is the caller's exact local histogram. Without it the ids are counted first (one pass), then
 * permuted (a second); with it the histogram is exchanged as given and the permutation is the
 * only pass over the ids, which also proves the histogram right: entries outside [0, T*K], a
 * sum other than T*K or an expert getting more slots than its entry are INVALID_ARGUMENT on
 * every rank before the exchange, so a wrong histogram can never move data out of bounds.
 * check != 0 (MEGAMOE_CHECK=1) counts anyway and names the first entry that differs. A failure
 * of the caller's own earlier step can be passed as local_status so that every rank returns
 * the same error without deadlock. The count exchange is the first exchange of call
 * (call_order.h): calls made out of order are CALL_MISMATCH on every rank before anything
 * else. */
megamoe_status_t mm_ep_route(mm_ep_plan_t *plan, mm_shmem_team_t *team, mm_call_t *call,
                             int64_t tokens, const void *topk_ids, megamoe_dtype_t ids_dtype,
                             const void *tokens_per_expert,
                             megamoe_dtype_t tpe_dtype, int check, megamoe_status_t local_status);

/* Tests: counting passes over topk_ids made by mm_ep_route on this process (none when a
 * histogram is given and check is 0). */
extern uint64_t mm_ep_count_passes;

/* Global expert of permuted position p on the source side (binary search over src_off). */
int64_t mm_ep_expert_of_pos(const mm_ep_plan_t *plan, int64_t p);
/* Index into seg_order of the segment holding permuted position p (binary search). */
int32_t mm_ep_seg_of_pos(const mm_ep_plan_t *plan, int64_t p);
/* Destination rank and receive row of this rank's permuted position p. */
static inline int64_t mm_ep_dst_row(const mm_ep_plan_t *plan, int64_t p, int *dest_p)
{
    const int32_t q = plan->seg_order[mm_ep_seg_of_pos(plan, p)];
    *dest_p = (int)(q / plan->S);
    return plan->seg_dst[q] + (p - plan->seg_pos[q]);
}
/* Slots hosting a guest of local expert j of this rank (index d*R + g of the replica plan)
 * into out[] (room for ep*R); 0 when none or R == 0. */
int mm_ep_guests_of_local(const mm_ep_plan_t *plan, int64_t j, int32_t *out);

#endif /* MM_OPS_EP_ROUTE_H */
