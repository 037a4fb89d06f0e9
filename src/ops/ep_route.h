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
 * Building a plan is collective over the team: each rank counts its slots per expert, the
 * counts are all-gathered (counts[s][e] on every rank), and every rank derives the same
 * offsets. Capacity: every destination's received rows are compared with the capacity on every
 * rank from the same gathered matrix, so an overflow is the same CAPACITY_OVERFLOW everywhere,
 * before any data moves. Invalid expert ids on any rank are INVALID_ARGUMENT on every rank.
 */
#ifndef MM_OPS_EP_ROUTE_H
#define MM_OPS_EP_ROUTE_H

#include <stdint.h>

#include "megamoe/dtype.h"
#include "megamoe/status.h"

#include "ops/call_order.h"
#include "shmem/shmem.h"

typedef struct mm_ep_shape {
    int ep;             /* ranks in the team */
    int me;             /* this rank's index in the team */
    int64_t tokens;     /* T */
    int64_t top_k;      /* K */
    int64_t experts;    /* E (global), divisible by ep */
    int64_t capacity;   /* receive rows per rank (the symmetric receive buffer) */
    double capacity_factor; /* for the overflow message only: 0 = lossless */
} mm_ep_shape_t;

typedef struct mm_ep_plan {
    int ep, me;
    int64_t T, K, E, L, capacity;
    double capacity_factor;

    int32_t *counts; /* [ep * E]: rows from source s to global expert e (counts[s*E + e]) */
    int32_t *hist;   /* [E]: this rank's own counts before the exchange */

    /* source side */
    int64_t *src_off;   /* [E + 1] */
    int32_t *perm_slot; /* [T*K] permuted position -> slot */
    int32_t *slot_pos;  /* [T*K] slot -> permuted position */
    int64_t *dst_off;   /* [E] first row in the destination's receive buffer */

    /* destination side */
    int64_t recv_rows;  /* rows this rank receives */
    int64_t *group_off; /* [L + 1] */
    int64_t *blk_off;   /* [L * ep] */
    int64_t *blk_rows;  /* [L * ep] */
    int64_t *ret_off;   /* [L * ep] row in source s's return buffer */

    /* whole team */
    int64_t max_recv;  /* the largest receive count of any rank */
    int max_recv_rank; /* which rank (lowest on ties) */
} mm_ep_plan_t;

/* Allocate a plan for fixed shapes. INVALID_ARGUMENT for shapes out of range (E % ep,
 * T*K >= 2^31, ...). */
megamoe_status_t mm_ep_plan_create(const mm_ep_shape_t *shape, mm_ep_plan_t **plan_p);
void mm_ep_plan_destroy(mm_ep_plan_t *plan);

/* Collective over team (ep members, this rank = plan->me): build the plan for topk_ids
 * [T, K] (INT32 or INT64 global ids). tokens_per_expert ([E], INT32 or INT64, may be NULL)
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
                             const void *topk_ids, megamoe_dtype_t ids_dtype,
                             const void *tokens_per_expert,
                             megamoe_dtype_t tpe_dtype, int check, megamoe_status_t local_status);

/* Tests: counting passes over topk_ids made by mm_ep_route on this process (none when a
 * histogram is given and check is 0). */
extern uint64_t mm_ep_count_passes;

/* Global expert of permuted position p on the source side (binary search over src_off). */
int64_t mm_ep_expert_of_pos(const mm_ep_plan_t *plan, int64_t p);

#endif /* MM_OPS_EP_ROUTE_H */
