/* The O1 static plan: the MegaMoE forward and backward graphs as task tables and ordered
 * queues, built once per resource group from the fixed shapes (T, H, I, E, K, EP; T is T_cap
 * for a layer with per-call token counts) and the worker counts (docs/multicore.md).
 *
 * Tiles. Rows travel and are computed in tiles of MM_MC_TILE (128) rows. A block is what one
 * source rank s sends to one local expert j of an owner: the contiguous rows of (j, s) in the
 * owner's receive buffer (docs/architecture.md "Data layout"). A block can hold up to T*K
 * rows (a token may choose an expert more than once), so at most NT = ceil(T*K/128) tiles.
 *
 * Tiers. The graphs exist once per tile tier nt = 1, 2, 4, ..., NT (the last one NT): in tier
 * nt every block has nt tile slots. A launch runs the smallest tier whose slots hold the
 * call's largest block (mm_ep_plan_t.max_block_rows: known on every rank from the gathered
 * counts, so every rank picks the same tier), so a call with few rows walks few empty slots
 * whatever T_cap is, and the graphs are built once (all tiers at creation: at most twice the
 * largest one, nothing built or allocated per call). Which slots of a block hold rows is
 * runtime metadata (the routing plan of the call); empty slots cost a metadata check, and the
 * first empty slot of a block signals on behalf of all of them, so every counter moves by the
 * tier's static amount in every launch, on every rank.
 *
 * REDUCE tasks (the queue's tail) exist for TT = ceil(T/128) token tiles; a launch runs the
 * first max(1, ceil(T_r/128)) of them (T_r: this rank's tokens in the call): at least one,
 * because REDUCE is where a rank waits for every peer's DONE.
 *
 * Task types (role = the queue a task sits in):
 *   DISPATCH (vector)  tile k of this rank's rows for local expert j of destination peer:
 *                      fwd token rows, bwd weighted grad rows (+ router-weight grads)
 *   EXPERT   (cube)    tile k of block (j, peer = source): fwd GMM1 + SwiGLU + GMM2, bwd
 *                      dA + SwiGLU' + dX; results go straight into the source's return rows
 *   WGRAD2   (cube)    bwd dW2_j = A_jᵀ·dY_j, chunk k of the I rows of dW2_j
 *   WGRAD1   (cube)    bwd dW1_j = X_jᵀ·dGU_j, chunk k of the H rows of dW1_j
 *   FETCH    (cube)    hot-expert replicas: guest slot k's weights (forward: once its home
 *                      published them; backward: the NT packing of the forward's copy)
 *   SLOT_DONE (vector) bwd: guest slot k's weight-gradient partial is complete: tell every rank
 *   WSUM     (cube)    bwd: expert j's weight gradient = own partial + its guests' partials,
 *                      chunk k (after the guests said SLOT_DONE)
 *   DONE     (vector)  publish this rank's status and tell every rank it will write no more
 *   REDUCE   (vector)  source side: sum the K returned rows of tokens [128k, 128k + 128)
 *
 * Slots. With R guest slots per rank (hot-expert replicas, ops/ep_replicas.h) a rank has
 * S = L + R slots: j < L is local expert j, j = L + g is guest slot g; DISPATCH, EXPERT and
 * WGRAD tasks exist for every slot (empty slots cost one metadata check), so the graph stays
 * static while the plan of the call decides which expert a guest slot serves.
 *
 * Queues. Vector: DISPATCH tiles in RATR order (rank r: for local expert j, for tile k, for
 * i in 0..EP-1, destination (r + i) mod EP, the original scheduler's RATR rule), then DONE, then REDUCE.
 * Cube: EXPERT tiles in arrival order (for j, for i, source (r - i) mod EP, for k); in the
 * backward WGRAD2/WGRAD1 of expert j follow the tiles of expert j + 1 (one expert of lag: their
 * inputs are done and still in cache, and they overlap the next expert's data gradients and
 * the peers' combine). With replicas the cube queue starts with the R FETCH tasks (they
 * overlap the dispatch), then takes the guest slots before the local experts (a guest's
 * partial is then ready early), and the backward ends with the WSUM chunks; the backward
 * vector queue has the R SLOT_DONE tasks between the dispatch and DONE.
 */
/* The inference plan (shape.infer; the serving MegaMoE, src/serve/): forward only, nothing
 * saved, and each expert computed over every source's rows at once, so a decode step reads each
 * expert weight once (the training plan's tiles are one source's block each: W passes over a
 * weight per call). Per tier, direction MM_MC_INF:
 *   vector: the DISPATCH tiles (as forward), DONE, REDUCE (its body may do nothing: the
 *           caller reduces after the launch; REDUCE is where a rank waits for every DONE)
 *   cube:   LOCAL k (k < local_tasks; no dependency: work on this rank's own tokens that
 *           overlaps the dispatch, e.g. shared experts), then EXPERT_ALL (j, k) for every slot
 *           j and k < EP * nt: tile k of slot j's rows in receive order (every source's block,
 *           contiguous), ready when every source's rows of slot j arrived.
 */
#ifndef MM_MULTICORE_MC_PLAN_H
#define MM_MULTICORE_MC_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/status.h"

#define MM_MC_TILE 128

enum { MM_MC_FWD = 0, MM_MC_BWD = 1, MM_MC_INF = 2 /* inference (shape.infer) */ };
enum { MM_MC_CUBE = 0, MM_MC_VECTOR = 1 };

typedef enum mm_mc_type {
    MM_MC_DISPATCH = 0,
    MM_MC_EXPERT,
    MM_MC_WGRAD2,
    MM_MC_WGRAD1,
    MM_MC_DONE,
    MM_MC_REDUCE,
    MM_MC_FETCH,
    MM_MC_SLOT_DONE,
    MM_MC_WSUM,
    MM_MC_EXPERT_ALL,
    MM_MC_LOCAL,
    MM_MC_TYPES
} mm_mc_type_t;

typedef struct mm_mc_task {
    uint8_t type;  /* mm_mc_type_t */
    uint8_t role;  /* queue it sits in */
    int16_t peer;  /* DISPATCH: destination; EXPERT: source; else -1 */
    int32_t j;     /* slot (of the destination for DISPATCH): local expert or L + guest slot;
                      -1 when none */
    int32_t k;     /* tile slot, weight-gradient chunk, token tile or guest slot */
} mm_mc_task_t;

typedef struct mm_mc_graph {
    mm_mc_task_t *tasks;
    int32_t n_tasks;
    int32_t *queue[2]; /* task indices, MM_MC_CUBE / MM_MC_VECTOR */
    int32_t n_queue[2];
    int64_t n_counted; /* tasks DONE waits for (everything but DONE and REDUCE) */
} mm_mc_graph_t;

typedef struct mm_mc_shape {
    int ep, me;
    int64_t T, H, I, E, K;
    int cube, vector; /* workers of each role (one may be 0: the others serve its queue) */
    const int *host;  /* [ep] host index of each member, for the host-aware RATR order (NULL:
                       * one host); only read while the plan is built */
    int R;            /* guest slots per rank (hot-expert replicas; 0 = none) */
} mm_mc_shape_t;

#define MM_MC_MAX_TIERS 40 /* tiers 1, 2, 4, ...: NT < 2^31 needs at most 33 */

typedef struct mm_mc_plan {
    mm_mc_shape_t s;
    int64_t L;       /* local experts */
    int64_t S;       /* slots: L + R */
    int64_t NT;      /* tile slots per block of the largest tier: ceil(T*K / 128) */
    int64_t TT;      /* REDUCE tasks of every graph: ceil(T / 128) */
    int64_t wchunks; /* weight-gradient chunks per expert and product */
    int n_tiers;
    int64_t tier_nt[MM_MC_MAX_TIERS];        /* tile slots per block: 1, 2, 4, ..., NT */
    mm_mc_graph_t tiers[MM_MC_MAX_TIERS][3]; /* [tier][MM_MC_FWD / MM_MC_BWD / MM_MC_INF] */
    mm_mc_graph_t *graph; /* the largest tier's pair (tiers[n_tiers - 1]) */
    int infer;            /* an inference plan: only MM_MC_INF graphs (mm_mc_plan_create_infer) */
    int64_t local_tasks;  /* its LOCAL tasks per graph */
} mm_mc_plan_t;

megamoe_status_t mm_mc_plan_create(const mm_mc_shape_t *shape, mm_mc_plan_t **plan_p);
/* The inference plan (above; shape.R must be 0): MM_MC_INF graphs per tier with local_tasks
 * LOCAL tasks each. */
megamoe_status_t mm_mc_plan_create_infer(const mm_mc_shape_t *shape, int64_t local_tasks,
                                         mm_mc_plan_t **plan_p);
void mm_mc_plan_destroy(mm_mc_plan_t *plan);

/* The tier of a call whose largest block holds block_rows rows: the smallest nt with
 * nt * 128 >= block_rows (at least tier 0); the last tier for anything larger. */
int mm_mc_plan_tier(const mm_mc_plan_t *plan, int64_t block_rows);

/* Worker counts of a rank. Explicit cube/vector (> 0, from the API) win, then
 * MEGAMOE_CUBE_WORKERS / MEGAMOE_VECTOR_WORKERS, else `total` workers (the rank's cores)
 * split as: 1 -> one cube worker that also runs the vector queue; n >= 2 -> max(1, n/4)
 * vector workers and the rest cube. At least one worker in total; INVALID_ARGUMENT for a bad
 * environment value or explicit counts whose sum differs from an explicit total. */
megamoe_status_t mm_mc_workers(int total, int explicit_total, int cube, int vector, int *cube_p,
                               int *vector_p);

/* Symmetric heap bytes of the executor's signal area (counters and status slots) for
 * local_experts and R guest slots per rank. */
size_t mm_mc_heap_bytes(int ep, int64_t local_experts, int R);

#endif /* MM_MULTICORE_MC_PLAN_H */
