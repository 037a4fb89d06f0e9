/* Hot-expert replicas of MegaMoeExperts (replica_slots_per_rank = R > 0; docs/moe.md
 * "Load balance: hot-expert replicas"): the data paths around the routing plan's guest slots.
 *
 * Per call the replica planner (ops/ep_replicas.h, run inside the routing exchange) gives some
 * hot experts guest slots on lighter ranks. Then:
 *  - forward, home: the weights of each local expert with guests are copied (bf16, once per
 *    weight version) into this rank's publication area in the symmetric heap; O1 then SETs
 *    the guest's ready line (O0: the dispatch exchange orders it);
 *  - forward, guest: FETCH copies the weights one-sided from the home's publication area
 *    (direct loads through mm_shmem_ptr when the peer heap is mapped, mm_shmem_get otherwise)
 *    into a private, reference-counted copy and packs it for GMM1/GMM2; a copy whose home
 *    publication (sequence number) did not change is reused from call to call, and a forward's
 *    saved state keeps the copies it used, so the backward never fetches again;
 *  - backward, guest: packs the same copy for dA and dX (once), computes the slot's weight
 *    gradients in fp32 into its partial area in the symmetric heap and says SLOT_DONE;
 *  - backward, home: its own rows' weight gradient in fp32 (bf16 output: scratch; fp32 output:
 *    in place), then WSUM adds the guests' partials in slot order and writes the output — the
 *    same order on every run, so results are deterministic; they differ from the layer without
 *    replicas only by that fp32 summation order (outputs, grad hidden and grad router weights
 *    are row-wise, hence bit-identical).
 *
 * Symmetric heap per rank: the publication area, L slots of (64 + 6 H I) bytes, and the
 * partial area, R slots of 12 H I bytes (each page-rounded); only the slots in use get
 * touched. Private memory per layer: R weight copies of 6 H I bytes plus their packings. */
#ifndef MM_MOE_REPLICAS_H
#define MM_MOE_REPLICAS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "moe/experts_impl.h"

/* One guest copy of a home expert's weights (private, reference counted: the layer's cache
 * and every saved state that used it). */
typedef struct mm_moe_guest_w {
    atomic_int refs;
    int64_t expert; /* global expert */
    uint64_t seq;   /* the home's publication it was copied from */
    int64_t H, I;
    uint16_t *w1;   /* [H, 2I] gate_up */
    uint16_t *w2;   /* [I, H]  down */
    mm_gemm_weight_t *nn1, *nn2; /* forward GMM1 / GMM2 */
    mm_gemm_weight_t *nt2, *nt1; /* backward dA / dX (packed on first use) */
} mm_moe_guest_w_t;

void mm_moe_guest_ref(mm_moe_guest_w_t *gw);
void mm_moe_guest_unref(mm_moe_guest_w_t *gw);

/* Group: the symmetric areas and the publication bookkeeping. */
typedef struct mm_moe_rep_group {
    int R;
    int64_t L, H, I;
    char *pub;          /* symmetric [L][pub_stride]: header line, gate_up, down */
    size_t pub_stride;
    float *part;        /* symmetric [R][3 H I] fp32 partials (gate_up then down) */
    size_t part_stride; /* floats */
    uint64_t seq;       /* publications this rank made */
    struct mm_moe_pub_of {
        uint64_t layer, version;
        const void *w1, *w2;
        uint64_t seq; /* 0: empty */
    } *pub_of;          /* [L] what publication slot j holds */
    float *hpart;       /* home fp32 partials scratch, grown on demand */
    size_t hpart_bytes;
    float **hpart_tab;  /* [L] the backward's home partial of each local expert, or NULL */
} mm_moe_rep_group_t;

/* Layer: its guest weight cache and what the last forward's plan was (info()). */
typedef struct mm_moe_rep_layer {
    int R;
    mm_moe_guest_w_t **cache; /* [R] the copy each guest slot used last */
    mm_moe_guest_w_t **cur;   /* [R] this call's (a reference each while the call runs) */
    /* the last forward's plan */
    int ep;
    int32_t *slot_expert;     /* [ep * R] */
    int64_t *slot_rows;       /* [ep * R] */
    int64_t max_rows_plain, max_rows, rows_moved;
    int n_guests;
    int32_t *host_of;         /* [ep] host of every member when they are on several, else NULL */
} mm_moe_rep_layer_t;

/* Symmetric bytes of both areas (0 when cfg->replicas == 0). */
size_t mm_moe_rep_heap_bytes(const mm_moe_config_t *cfg);
/* Collective at group prepare (after the exchange buffers): allocate the areas. */
megamoe_status_t mm_moe_rep_group_create(mm_moe_group_t *g);
/* Collective (symmetric free); NULL rep is a no-op. */
megamoe_status_t mm_moe_rep_group_destroy(mm_moe_group_t *g);

megamoe_status_t mm_moe_rep_layer_create(megamoe_experts_t *x);
void mm_moe_rep_layer_destroy(megamoe_experts_t *x);

/* The routing-plan fields of the shape for this layer (replica slots, cost model). */
void mm_moe_rep_shape(const megamoe_experts_t *x, mm_ep_shape_t *shape);

/* Forward, after the routing plan: publish the weights of local experts that have guests
 * (copy if the pointers or version changed); with exec (O1) also SET each guest's ready line
 * to the next launch generation (every line, also after a failed one, whose status is
 * returned: its peer is marked lost, so the guest's wait fails too). */
megamoe_status_t mm_moe_rep_publish(megamoe_experts_t *x, const megamoe_experts_weights_t *w,
                        const mm_ep_plan_t *plan, mm_mc_exec_t *exec);
/* Forward: make guest slot g's weights for global expert e ready in x->rep->cur[g] (fetch
 * from the home unless the cached copy is current; pack for the forward). Thread-safe for
 * different g. */
megamoe_status_t mm_moe_rep_fetch(megamoe_experts_t *x, int g, int64_t e);
/* Backward: pack the forward's copy for dA / dX (once per copy). */
megamoe_status_t mm_moe_rep_pack_backward(mm_moe_guest_w_t *gw);
/* After a successful forward: remember its plan (info) and give the saved state (if any)
 * references to this call's guest copies; always drops the call's own references. */
megamoe_status_t mm_moe_rep_forward_done(megamoe_experts_t *x, const mm_ep_plan_t *plan,
                                         megamoe_experts_saved_t *sv, int ok);
/* The plan as one line for the trace ("replicas: expert 0 (rank 0) on rank 1 slot 0: 3106
 * rows; slowest rank 11298 -> 8192 rows"); "" without replicas. */
void mm_moe_rep_note(const mm_ep_plan_t *plan, char *buf, size_t len);
/* A saved state's references (from megamoe_experts_saved_destroy). */
void mm_moe_rep_saved_release(megamoe_experts_saved_t *sv);

/* Backward set-up: c->hpart (a local expert with guests gets an fp32 partial in the group's
 * scratch when the weight-gradient output is bf16) and c->guest (the forward's copies). */
megamoe_status_t mm_moe_rep_backward_begin(mm_moe_bwd_ctx_t *c);

/* Where slot j's weight gradient `which` (1: dW1 [H, 2I], 2: dW2 [I, H]) is written: the
 * output (local expert without guests), the fp32 home partial (local expert with guests,
 * bf16 output) or the slot's fp32 partial in the symmetric heap (guest slot). */
void *mm_moe_rep_wgrad_dst(const mm_moe_bwd_ctx_t *c, int64_t j, int which,
                           megamoe_dtype_t *type_p);
/* The TN product of slot j's weight gradient `which` (the rows of its group: saved activations
 * or inputs times dY or dGU, into mm_moe_rep_wgrad_dst); the caller sets K and the split. */
void mm_moe_rep_wgrad_args(const mm_moe_bwd_ctx_t *c, const uint16_t *dgu, int64_t j, int which,
                           mm_gemm_args_t *g);
/* WSUM chunk of local expert j: its weight gradients = own partial + the partials of guests[n]
 * (slot indices d*R + g, ascending), written to the outputs. Rows [m0, m1) of dW1 and
 * [n0, n1) of dW2 per the chunk. */
megamoe_status_t mm_moe_rep_wsum(const mm_moe_bwd_ctx_t *c, int64_t j, int64_t chunk,
                                 int64_t chunks, const int32_t *guests, int n);

/* The packed weights of slot j (local expert or guest slot) for GMM1/GMM2/dA/dX. */
static inline const mm_gemm_weight_t *mm_moe_slot_w1(const megamoe_experts_t *x,
                                                     mm_moe_guest_w_t *const *guest, int64_t j)
{
    return j < x->L ? x->packed.w1[j] : guest[j - x->L]->nn1;
}
static inline const mm_gemm_weight_t *mm_moe_slot_w2(const megamoe_experts_t *x,
                                                     mm_moe_guest_w_t *const *guest, int64_t j)
{
    return j < x->L ? x->packed.w2[j] : guest[j - x->L]->nn2;
}
static inline const mm_gemm_weight_t *mm_moe_slot_w2t(const megamoe_experts_t *x,
                                                      mm_moe_guest_w_t *const *guest, int64_t j)
{
    return j < x->L ? x->packed.w2t[j] : guest[j - x->L]->nt2;
}
static inline const mm_gemm_weight_t *mm_moe_slot_w1t(const megamoe_experts_t *x,
                                                      mm_moe_guest_w_t *const *guest, int64_t j)
{
    return j < x->L ? x->packed.w1t[j] : guest[j - x->L]->nt1;
}

#endif /* MM_MOE_REPLICAS_H */
