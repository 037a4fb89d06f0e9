/* MegaMoeExperts internals shared by the files of src/moe/ (layer, resource group, O0 and
 * O1 forward and backward). */
#ifndef MM_MOE_EXPERTS_IMPL_H
#define MM_MOE_EXPERTS_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "megamoe/experts.h"

#include "kernels/gemm.h"
#include "kernels/swiglu.h"
#include "multicore/mc_exec.h"
#include "multicore/mc_plan.h"
#include "multicore/worker_pool.h"
#include "ops/call_order.h"
#include "ops/ep_exchange.h"
#include "ops/ep_route.h"
#include "shmem/shmem.h"

/* Capacity policy / dispatch mode (docs/moe.md "Capacity and dispatch modes"): fixed is the
 * unset dispatch_mode, push and pull its words. */
typedef enum mm_moe_mode { MM_MOE_FIXED = 0, MM_MOE_PUSH = 1, MM_MOE_PULL = 2 } mm_moe_mode_t;
/* The schedules ("O0", "O1": mm_moe_schedule_name). */
typedef enum mm_moe_schedule { MM_MOE_O0 = 0, MM_MOE_O1 = 1 } mm_moe_schedule_t;
#define MM_MOE_SCHEDULE_DEFAULT MM_MOE_O1
const char *mm_moe_schedule_name(mm_moe_schedule_t s);

#define MM_MOE_MAX_REPLICAS 64 /* replica_slots_per_rank */

/* Everything that must be equal on every rank and between layers sharing a group. */
typedef struct mm_moe_config {
    int64_t T, H, I, E, K; /* T: the fixed token count, or T_cap of a dynamic layer */
    int64_t ep;
    double factor;   /* MM_MOE_FIXED: expert_capacity_factor (0 = lossless) */
    float limit;
    int64_t capacity; /* initial receive rows (pull: 0) */
    mm_moe_schedule_t schedule;
    mm_moe_mode_t mode;
    double initial, growth; /* MM_MOE_PUSH: resolved factors (else 0) */
    int32_t replicas; /* guest slots per rank (replica_slots_per_rank; 0 = off) */
    int32_t dynamic;  /* 1: max_local_num_tokens (T = T_cap, each call passes 0..T_cap rows) */
} mm_moe_config_t;

static inline int mm_moe_is_o1(const mm_moe_config_t *c) { return c->schedule == MM_MOE_O1; }
static inline int mm_moe_is_pull(const mm_moe_config_t *c) { return c->mode == MM_MOE_PULL; }
/* The lossless bound align128(EP*T*K): no rank can receive more. */
static inline int64_t mm_moe_bound_rows(const mm_moe_config_t *c)
{
    return (c->ep * c->T * c->K + 127) / 128 * 128;
}

/* Phases timed per layer (names in experts.c). */
enum {
    MM_PH_FWD_ROUTE,
    MM_PH_FWD_DISPATCH,
    MM_PH_FWD_GMM1,
    MM_PH_FWD_SWIGLU,
    MM_PH_FWD_GMM2,
    MM_PH_FWD_COMBINE,
    MM_PH_FWD_REDUCE,
    MM_PH_BWD_PREP,
    MM_PH_BWD_DISPATCH,
    MM_PH_BWD_GMM_DA,
    MM_PH_BWD_GMM_DW2,
    MM_PH_BWD_SWIGLU,
    MM_PH_BWD_GMM_DX,
    MM_PH_BWD_GMM_DW1,
    MM_PH_BWD_COMBINE,
    MM_PH_BWD_REDUCE,
    MM_PH_FWD_PREPARE, /* O1: checks, weight packing, buffers */
    MM_PH_FWD_LAUNCH,  /* O1: the fused forward launch */
    MM_PH_BWD_PREPARE,
    MM_PH_BWD_LAUNCH,
    MM_PH_BWD_FINISH,  /* O1: router-weight gradients out */
    MM_PH_COUNT
};

/* Per-call scratch that is not saved for backward; grown on demand, shared by the layers of a
 * group (they run serially). */
typedef struct mm_moe_scratch {
    void *buf[10];
    size_t bytes[10];
} mm_moe_scratch_t;
enum {
    MM_SCR_GU,  /* [R, 2I] bf16 (inference forward) */
    MM_SCR_A,   /* [R, I]  bf16 (inference forward) */
    MM_SCR_Y,   /* [R, H]  bf16 expert outputs (forward) / dX (backward), receive order */
    MM_SCR_DY,  /* [T*K, H] bf16 grad rows to send, permuted order */
    MM_SCR_DA,  /* [R, I]  bf16 dA */
    MM_SCR_DGU, /* [R, 2I] bf16 d[gate|up] */
    MM_SCR_ACC, /* [workers, H] fp32 accumulators */
    MM_SCR_F32, /* [T*K] fp32 router weights / their gradients */
    MM_SCR_RECV, /* pull: [R, H] bf16 rows fetched from the sources (inference X, dY) */
    MM_SCR_LISTS, /* O0 group lists: [S] rows per slot, [2S] weight table, guest lists */
};

/* One resource group: symmetric exchange buffers, the worker pool, the SHMEM reference. */
typedef struct mm_moe_group {
    struct mm_moe_group *next; /* process-wide registry (heap sizing) */
    mm_call_group_t calls;     /* call order: id = the first layer's number (call_order.h) */
    mm_moe_config_t cfg;
    mm_shmem_team_t *team;
    int workers;
    int cube, vector; /* O1 roles (cube + vector == workers) */
    mm_gemm_choice_t gemm_choice;            /* MEGAMOE_GEMM at creation: packs the weights */
    const mm_gemm_backend_ops_t *gemm_plain; /* its backend for plain operands (TN dW) */
    int layers;      /* layers attached */
    int open_layers; /* attached and not closed */
    int used;        /* a forward ran (sharing is no longer allowed) */
    int ready;       /* SHMEM acquired, buffers allocated, pool running */
    int broken;      /* a collective step failed half-way: only close() is allowed */
    uint64_t fwd_gen; /* O0: successful forwards of the group (equal on every rank) */
    uint64_t forwards; /* forwards of the group that passed their first exchange (both
                          schedules; the same on every rank; names growth events) */
    size_t heap_bytes;   /* symmetric bytes the group holds now */
    size_t heap_reserve; /* what heap sizing reserves for it (push: its growth bound) */
    int64_t capacity;    /* receive rows now (push grows it; pull: 0) */
    megamoe_experts_growth_t *growth; /* growth events, oldest first */
    int n_growth, cap_growth;
    mm_ep_xbuf_t *xbuf; /* pull: recv is the T*K-row staging buffer of this rank's sources */
    mm_pool_t *pool;
    mm_mc_plan_t *plan; /* O1 static plan and executor */
    mm_mc_exec_t *exec;
    struct mm_moe_rep_group *rep; /* hot-expert replicas (moe_replicas.h); NULL when off */
    mm_moe_scratch_t scratch;
    atomic_int busy; /* serial use: a second thread is rejected */
} mm_moe_group_t;

/* Pre-packed copies of one layer's weights (per local expert). */
typedef struct mm_moe_packed {
    mm_gemm_weight_t **w1;  /* NN gate_up[j] [H, 2I]   forward GMM1 */
    mm_gemm_weight_t **w2;  /* NN down[j] [I, H]       forward GMM2 */
    mm_gemm_weight_t **w2t; /* NT down[j] as [N=I, K=H]   dA = dY · W2ᵀ */
    mm_gemm_weight_t **w1t; /* NT gate_up[j] as [N=H, K=2I]  dX = dGU · W1ᵀ */
} mm_moe_packed_t;

struct megamoe_experts {
    uint64_t serial; /* identifies the layer in its saved states */
    uint64_t number; /* "layer #N" in call descriptors: agreed at creation, equal on every rank */
    uint64_t digest; /* of cfg: the settings every call of the layer must agree on */
    mm_moe_config_t cfg;
    megamoe_comm_t *comm;
    mm_shmem_team_t *team;
    int ep, me;
    int64_t L;
    int workers, cube, vector;
    int closed;
    mm_moe_group_t *group;
    mm_moe_packed_t packed;
    int64_t last_recv_rows;
    int64_t last_tokens; /* rows of the last forward on this rank (-1: none yet) */
    struct mm_moe_rep_layer *rep; /* guest weight copies, last plan (moe_replicas.h) */
    double phase_s[MM_PH_COUNT];
    uint64_t forwards, backwards;
};

struct megamoe_experts_saved {
    uint64_t layer_serial;
    mm_ep_plan_t *plan; /* plan->T: the forward's token count on this rank (T_r) */
    int64_t rows;   /* rows received (R) */
    uint16_t *x;    /* [max(R,1), H]   received tokens */
    uint16_t *gu;   /* [max(R,1), 2I]  GMM1 output */
    uint16_t *a;    /* [max(R,1), I]   SwiGLU output */
    uint16_t *y;    /* [T_r*K, H]      expert outputs returned to this rank, permuted order */
    float *w;       /* [T_r*K]         router weights (fp32), slot order */
    megamoe_dtype_t w_dtype;
    uint64_t gen;   /* the forward's number in its group (O1: launch generation; O0: fwd_gen);
                       a backward needs the same one on every rank */
    struct mm_moe_guest_w **guest; /* [n_guest] the guest weights this forward used (refs) */
    int n_guest;    /* R (0: no replicas) */
};

/* ---- group.c ---- */
megamoe_status_t mm_moe_group_create(const mm_moe_config_t *cfg, mm_shmem_team_t *team,
                                     uint64_t id, int workers, int cube, int vector,
                                     mm_moe_group_t **group_p);
/* Collective at a group's first forward: SHMEM acquire, heap check, buffers, pool. */
megamoe_status_t mm_moe_group_prepare(mm_moe_group_t *g);
/* Detach one layer; the last one frees the group (collective when it was prepared). */
megamoe_status_t mm_moe_group_detach(mm_moe_group_t *g);
/* A layer handle stops referring to its group (frees it once closed and unreferenced). */
void mm_moe_group_unref(mm_moe_group_t *g);
/* Grow scratch buffer `which` to at least bytes. */
megamoe_status_t mm_moe_scratch(mm_moe_group_t *g, int which, size_t bytes, void **ptr_p);
/* Heap bytes a group of this configuration needs with `rows` receive rows (pull: ignored). */
size_t mm_moe_heap_need(const mm_moe_config_t *cfg, int64_t rows);
/* Collective, after the routing exchange of a forward (plan identical on every rank in what it
 * says about the team): "push" grows the receive buffer when plan->max_recv exceeds it
 * (OUT_OF_MEMORY on every rank, buffer kept, when the heap has no room); else a no-op. */
megamoe_status_t mm_moe_group_fit(mm_moe_group_t *g, const mm_ep_plan_t *plan);

/* ---- experts.c ---- */
/* A call descriptor of kind for layer x (call_order.h): its group's sequence, its number. */
void mm_moe_call_begin(mm_call_t *c, const megamoe_experts_t *x, int kind);
/* Common entry checks of forward/backward (kind MM_CALL_*): open layer, usable group, serial
 * use. On OK the group is marked busy; mm_moe_leave() clears it, and marks the group broken
 * when the call returned PEER_LOST or TIMEOUT. A layer used after close still makes the call's
 * exchange (with its INVALID_STATE) while its communicator lives. */
megamoe_status_t mm_moe_enter(megamoe_experts_t *x, int kind);
void mm_moe_leave(megamoe_experts_t *x, megamoe_status_t st);
/* INVALID_ARGUMENT naming what[row][col] when p (rows x cols bf16 or fp32) holds a NaN or Inf,
 * unless MEGAMOE_CHECK_FINITE=0. Local: callers agree the status before data moves. */
megamoe_status_t mm_moe_check_finite(const char *what, const void *p, megamoe_dtype_t dtype,
                                     int64_t rows, int64_t cols);
/* Bring the packed weights up to date (local). backward != 0 also packs the NT copies. */
megamoe_status_t mm_moe_pack_weights(megamoe_experts_t *x, const megamoe_experts_weights_t *w,
                                     int backward);

/* A forward's saved state for the rows plan says this rank receives; it takes ownership of
 * plan only on success. */
megamoe_status_t mm_moe_saved_create(const megamoe_experts_t *x, mm_ep_plan_t *plan,
                                     megamoe_dtype_t w_dtype, megamoe_experts_saved_t **saved_p);

/* ---- what both schedules' forward and backward bodies share (experts.c) ---- */
typedef struct mm_moe_fwd_ctx {
    megamoe_experts_t *x;
    mm_moe_group_t *g;
    const mm_ep_plan_t *plan;
    int64_t T, H, I, K;       /* T: this call's rows on this rank (plan->T) */
    const uint16_t *hidden;   /* [T, H] */
    const uint16_t *recv;     /* [R, H] received rows (symmetric) */
    const uint16_t *ret;      /* [T*K, H] returned rows (symmetric), permuted order */
    uint16_t *out;            /* [T, H] */
    uint16_t *xsave, *gu, *a; /* saved [R, H], [R, 2I], [R, I]; NULL for inference */
    uint16_t *ysave;          /* [T*K, H] or NULL */
    const float *w;           /* [T*K] router weights (fp32), slot order */
    struct mm_moe_guest_w **guest; /* [R] guest slots' weights of this call (replicas) */
} mm_moe_fwd_ctx_t;
/* The shared fields of a forward over plan; with sv (training) its saved buffers. */
void mm_moe_fwd_ctx_init(mm_moe_fwd_ctx_t *c, megamoe_experts_t *x, const mm_ep_plan_t *plan,
                         const megamoe_experts_input_t *in, void *output,
                         const megamoe_experts_saved_t *sv);

typedef struct mm_moe_bwd_ctx {
    megamoe_experts_t *x;
    mm_moe_group_t *g;
    const megamoe_experts_saved_t *sv;
    const mm_ep_plan_t *plan;
    int64_t T, H, I, K;    /* T: the forward's rows on this rank (plan->T) */
    const uint16_t *dout;  /* [T, H] */
    const uint16_t *recv;  /* [R, H] received dY */
    const uint16_t *ret;   /* [T*K, H] returned dX, permuted order */
    uint16_t *dhidden;     /* [T, H] */
    void *dw1, *dw2;
    megamoe_dtype_t wg_type;
    struct mm_moe_guest_w **guest; /* [R] the forward's guest weights (replicas) */
    float **hpart;  /* [L] fp32 weight-gradient partial of a local expert with guests when
                       the output is bf16 (else NULL entries): WSUM adds the guests' to it */
} mm_moe_bwd_ctx_t;
void mm_moe_bwd_ctx_init(mm_moe_bwd_ctx_t *c, megamoe_experts_t *x,
                         const megamoe_experts_saved_t *sv, const void *dout,
                         const megamoe_experts_grads_t *gr);

/* ---- forward_o0.c / backward_o0.c ----
 * call: the call's descriptor (its first exchange is the routing count exchange, forward, or
 * the saved-state check, backward); local: a failure before the call (a binding's argument
 * check), still taken into that exchange. */
megamoe_status_t mm_moe_forward_o0(megamoe_experts_t *x, mm_call_t *call, megamoe_status_t local,
                                   const megamoe_experts_weights_t *w,
                                   const megamoe_experts_input_t *in, void *output,
                                   megamoe_experts_saved_t **saved_p);
megamoe_status_t mm_moe_backward_o0(megamoe_experts_t *x, mm_call_t *call, megamoe_status_t local,
                                    megamoe_experts_saved_t *saved,
                                    const megamoe_experts_weights_t *w, const void *grad_output,
                                    const megamoe_experts_grads_t *grads);

/* ---- forward_o1.c / backward_o1.c ---- */
megamoe_status_t mm_moe_forward_o1(megamoe_experts_t *x, mm_call_t *call, megamoe_status_t local,
                                   const megamoe_experts_weights_t *w,
                                   const megamoe_experts_input_t *in, void *output,
                                   megamoe_experts_saved_t **saved_p);
megamoe_status_t mm_moe_backward_o1(megamoe_experts_t *x, mm_call_t *call, megamoe_status_t local,
                                    megamoe_experts_saved_t *saved,
                                    const megamoe_experts_weights_t *w, const void *grad_output,
                                    const megamoe_experts_grads_t *grads);
/* Per-worker scratch an O1 group needs (tiles of 128 rows), and its parts. */
size_t mm_moe_o1_scratch_bytes(const mm_moe_config_t *cfg);
typedef struct mm_o1_scratch {
    uint16_t *gu;   /* [128, 2I] GMM1 output (inference) */
    uint16_t *a;    /* [128, I]  SwiGLU output (inference) / dA (backward) */
    uint16_t *rows; /* [128, H]  rows for peers that are not load/store reachable */
    float *acc;     /* [H]       reduce accumulator */
    uint16_t *x;    /* [128, H]  pull: a fetched tile of received rows (inference); else NULL */
} mm_o1_scratch_t;
mm_o1_scratch_t mm_moe_o1_scratch(const mm_moe_config_t *cfg, const mm_mc_worker_t *w);
/* Where a product writes rows [row, row + n) of source src's return buffer: the peer's
 * mapping when reachable, else tile; then mm_moe_o1_ret_put() sends the tile if needed. */
void *mm_moe_o1_ret_dst(const mm_moe_group_t *g, int src, int64_t row, uint16_t *tile);
megamoe_status_t mm_moe_o1_ret_put(const mm_moe_group_t *g, int src, int64_t row,
                                   const void *dst, const uint16_t *tile, int64_t n);
/* One tile's product through a packed weight: dense A [M, K] -> bf16 C [M, N]. */
megamoe_status_t mm_moe_o1_tile_gemm(mm_gemm_form_t form, const mm_gemm_weight_t *weight,
                                     int64_t M, int64_t K, int64_t N, const uint16_t *A, void *C);
/* With a trace ring: record stage from *t0 to now and move *t0 there. */
void mm_moe_o1_stamp(mm_mc_worker_t *w, int stage, int64_t e, int peer, uint64_t *t0);
/* The start of a forward, shared by both schedules (forward_o0.c): input checks, weight packing
 * (time added to prepare_phase), then the collective routing plan (MM_PH_FWD_ROUTE) — the
 * call's first exchange, which checks the call order and agrees any local failure so every
 * rank returns the same status. On OK *plan_p is the plan. */
megamoe_status_t mm_moe_forward_begin(megamoe_experts_t *x, mm_call_t *call,
                                      megamoe_status_t local, const megamoe_experts_weights_t *wts,
                                      const megamoe_experts_input_t *in, const void *output,
                                      int prepare_phase, mm_ep_plan_t **plan_p);
/* The backward's first exchange (both schedules): the call order, every rank's local status,
 * and that every rank passes the saved state of the same forward (INVALID_ARGUMENT). */
megamoe_status_t mm_moe_backward_agree(megamoe_experts_t *x, mm_call_t *call,
                                       megamoe_status_t local,
                                       const megamoe_experts_saved_t *sv);
megamoe_status_t mm_moe_check_backward(const megamoe_experts_t *x,
                                       const megamoe_experts_saved_t *sv, const void *dout,
                                       const megamoe_experts_grads_t *gr);

/* Column split of a grouped GEMM across pool workers (n_align: packed-weight alignment). */
megamoe_status_t mm_moe_gemm_split(mm_gemm_grouped_args_t *g, int worker, int n_workers,
                                   int64_t n_align);

#endif /* MM_MOE_EXPERTS_IMPL_H */
