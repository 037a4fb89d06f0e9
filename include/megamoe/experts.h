/* megamoe — MegaMoeExperts: the expert-parallel MoE-FFN layer (dispatch -> GMM1 -> SwiGLU ->
 * GMM2 -> combine), forward and backward, BF16 training (seed 000, docs/moe.md).
 *
 * Shapes are fixed at creation: every rank of the EP communicator has T tokens
 * (local_num_tokens, a multiple of 128), hidden size H, intermediate size I, E global experts
 * (a multiple of EP; rank r owns experts r*E/EP .. (r+1)*E/EP - 1) and top-k K. A layer made
 * with max_local_num_tokens = T_cap instead takes any count 0..T_cap per rank and call
 * (input.num_tokens; the backward uses its forward's counts), with buffers and capacity sized
 * from T_cap; when every rank passes T (a multiple of 128) the results are bit-identical to a
 * fixed layer of T. Creation,
 * forward, backward, share and close are collective over the EP communicator: every rank calls
 * them in the same order. The communicator must span the whole world of ranks.
 *
 * Math, per token t and choice k with e = topk_ids[t,k] (global id):
 *     [g|u] = x_t · gate_up[e]          gate_up [E/EP, H, 2I]: gate columns, then up columns
 *     g = min(g, limit), u = clamp(u, -limit, limit)     only when swiglu_limit > 0
 *     a = silu(g) * u,  y = a · down[e]  down [E/EP, I, H]
 *     out[t] = sum_k topk_weights[t,k] * y[t,k]          summed in fp32 at the token's rank
 * so grad topk_weights[t,k] = <grad_out[t], y[t,k]>. Data are bf16, every product and sum is
 * accumulated in fp32, activations are stored in bf16.
 *
 * Dispatch modes and capacity (docs/moe.md "Capacity and dispatch modes"); every mode keeps
 * every token:
 *  - dispatch_mode NULL (default, the seed): sources push rows into a fixed symmetric receive
 *    buffer of align128(EP*T*K) rows (expert_capacity_factor 0, lossless) or
 *    align128(ceil(T*K*f)) rows (a finite f >= 1); when any rank would receive more, every
 *    rank returns the same CAPACITY_OVERFLOW before any data moves.
 *  - "push": the receive buffer starts at align128(ceil(min(initial, EP)*T*K)) rows; when the
 *    exchanged counts say a call needs more, every rank grows it together (a collective
 *    re-allocation before data moves) to align128(max(need, ceil(capacity*growth))), at most
 *    the lossless bound, and the call runs. It never shrinks; get_info/get_growth report it.
 *  - "pull": no receive buffer in the symmetric heap; sources stage their rows in a symmetric
 *    T*K-row buffer, owners fetch the rows they need into ordinary memory (direct loads from a
 *    mapped peer, mm_shmem_get otherwise); results return as in push.
 * Saved activations are sized to the rows actually received, so routing may change from call
 * to call and several forwards may be outstanding before their backwards.
 *
 * Execution resources (symmetric buffers, worker threads) belong to a resource group; layers
 * of the same configuration can share one with megamoe_experts_share() before their first
 * forward (serial use only). A group acquires the private SHMEM runtime at its first forward
 * and releases it when its last layer is closed (heap sizing: docs/moe.md).
 *
 * Errors: every call returns megamoe_status_t; settings that differ between ranks are
 * CONFIG_MISMATCH on every rank; outputs are written only on success.
 */
#ifndef MEGAMOE_EXPERTS_H
#define MEGAMOE_EXPERTS_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/comm.h"
#include "megamoe/dtype.h"
#include "megamoe/export.h"
#include "megamoe/prof.h"
#include "megamoe/status.h"

#ifdef __cplusplus
extern "C" {
#endif
MEGAMOE_API_BEGIN

typedef struct megamoe_experts megamoe_experts_t;      /* one layer */
typedef struct megamoe_experts_saved megamoe_experts_saved_t; /* one forward's saved state */

typedef struct megamoe_experts_params {
    size_t struct_size; /* set by megamoe_experts_params_default(): the caller's sizeof (megamoe/version.h) */
    int64_t local_num_tokens;      /* T: tokens per rank, a positive multiple of 128 (0 when
                                      max_local_num_tokens is set) */
    int64_t hidden_size;           /* H >= 1 */
    int64_t intermediate_size;     /* I >= 1 */
    int64_t num_experts;           /* E: global experts, a positive multiple of EP */
    int64_t top_k;                 /* K in [1, E] */
    double expert_capacity_factor; /* dispatch_mode NULL only: 0 = lossless (default, the
                                      sentinel for the seed's None); else finite and >= 1 */
    float swiglu_limit;            /* 0 = no clamp (default); else finite and > 0 */
    const char *schedule;          /* "O1" (default; also when NULL): one persistent launch
                                      per direction on the multicore executor; "O0": one
                                      host-scheduled phase after another (docs/multicore.md) */
    int workers;                   /* threads per rank; 0 = MEGAMOE_THREADS, else
                                      online cores / LOCAL_WORLD_SIZE (default) */
    int cube_workers;              /* O1: GEMM workers; 0 = MEGAMOE_CUBE_WORKERS, else derived */
    int vector_workers;            /* O1: communication / elementwise workers; 0 =
                                      MEGAMOE_VECTOR_WORKERS, else derived. With both 0 a
                                      rank with one worker runs both queues on it; n >= 2
                                      workers give max(1, n/4) vector workers. When set, their
                                      sum is the rank's thread count. */
    const char *dispatch_mode;     /* NULL (default): fixed capacity (expert_capacity_factor);
                                      "push": growing receive capacity; "pull": owners fetch
                                      rows (no receive buffer in the symmetric heap) */
    double initial_capacity_factor; /* "push" only: 0 = 1.25; else finite and >= 1 */
    double capacity_growth_factor;  /* "push" only: 0 = 1.25; else finite and >= 1 (1 grows to
                                       exactly the rows the call needs) */
    int replica_slots_per_rank;    /* hot-expert replicas: R guest slots per rank (0 = off,
                                      default; at most 64). Per call a planner gives the
                                      hottest experts guest copies on lighter ranks (see
                                      docs/moe.md "Load balance: hot-expert replicas") */
    int64_t max_local_num_tokens;  /* T_cap: per-call token counts (docs/moe.md "Dynamic
                                      tokens"): each call passes 0..T_cap rows per rank in
                                      megamoe_experts_input_t.num_tokens, any count on any rank;
                                      buffers and capacity are sized from T_cap (any positive
                                      integer). 0 (default): a fixed layer of local_num_tokens.
                                      Set exactly one of the two. */
} megamoe_experts_params_t;

/* All fields zero except schedule = "O1": the caller must set the five shapes. Extensible
 * (megamoe/version.h): new fields go at the end, their zero meaning the old behaviour. */
megamoe_status_t megamoe_experts_params_init(megamoe_experts_params_t *p, size_t struct_size);
static inline megamoe_experts_params_t megamoe_experts_params_default(void)
{
    megamoe_experts_params_t v;
    megamoe_experts_params_init(&v, sizeof v);
    return v;
}

/* The layer's weights, owned by the caller (e.g. torch parameters), bf16 and contiguous:
 * gate_up [E/EP, H, 2I] and down [E/EP, I, H]. version is the caller's counter for their
 * contents: the layer keeps pre-packed copies and re-packs only when the pointers or the
 * version changed since the last call (bump it after every optimizer step). */
typedef struct megamoe_experts_weights {
    const void *gate_up;
    const void *down;
    uint64_t version;
} megamoe_experts_weights_t;

typedef struct megamoe_experts_input {
    size_t struct_size; /* set by megamoe_experts_input_default(): the caller's sizeof (megamoe/version.h) */
    const void *hidden_states;           /* bf16 [T, H] */
    const void *topk_ids;                /* [T, K] global expert ids */
    megamoe_dtype_t topk_ids_dtype;      /* INT32 or INT64 */
    const void *topk_weights;            /* [T, K] router weights */
    megamoe_dtype_t topk_weights_dtype;  /* FP32 or BF16 */
    const void *tokens_per_expert;       /* optional [E] exact local histogram of topk_ids:
                                            routed by as given (no counting pass); one the ids
                                            contradict is INVALID_ARGUMENT on every rank */
    megamoe_dtype_t tokens_per_expert_dtype; /* INT32 or INT64 */
    int64_t num_tokens;                  /* rows of this call (T_r). A fixed layer: 0 (default)
                                            or its local_num_tokens. A layer made with
                                            max_local_num_tokens: 0..T_cap, 0 meaning no token
                                            on this rank (it sends nothing but still serves its
                                            experts; the pointers may then be NULL).
                                            hidden_states [T_r, H], topk_ids / topk_weights
                                            [T_r, K], output [T_r, H]. */
} megamoe_experts_input_t;

/* Input descriptor with int32 ids, fp32 weights, no histogram and num_tokens 0 (extensible). */
megamoe_status_t megamoe_experts_input_init(megamoe_experts_input_t *p, size_t struct_size);
static inline megamoe_experts_input_t megamoe_experts_input_default(void)
{
    megamoe_experts_input_t v;
    megamoe_experts_input_init(&v, sizeof v);
    return v;
}

/* Output gradients of one backward; all bf16 unless stated. */
typedef struct megamoe_experts_grads {
    void *hidden_states;         /* [T, H] */
    void *topk_weights;          /* [T, K] in the forward's topk_weights_dtype; NULL = skip */
    void *gate_up;               /* [E/EP, H, 2I], weight_grad_dtype */
    void *down;                  /* [E/EP, I, H], weight_grad_dtype */
    megamoe_dtype_t weight_grad_dtype; /* BF16 (default) or FP32 */
} megamoe_experts_grads_t;

/* Collective: validate params (INVALID_ARGUMENT naming the rule), compare them across the
 * ranks of ep (CONFIG_MISMATCH on every rank when they differ) and create the layer. ep must
 * outlive the layer. params NULL is invalid (shapes required). */
megamoe_status_t megamoe_experts_create(megamoe_comm_t *ep, const megamoe_experts_params_t *params,
                                        megamoe_experts_t **experts_p);

/* Call order (docs/moe.md): share, forward, backward and close are collective calls; every
 * rank makes the same ones in the same order (which layer, which kind). A call that differs
 * from a peer's is CALL_MISMATCH on every rank, naming what each rank called ("rank 0 called
 * forward of layer #2 (call 17), rank 1 called forward of layer #1 (call 17)"), before any
 * data moves: no output is written, and calls made in the same order work again. A bad
 * argument of one rank is that rank's error on every rank ("rank R: ..."). */

/* Let layers share one resource group (workspace, threads, SHMEM reference). Collective; call
 * before the first forward of any of them, with layers of identical configuration (else
 * INVALID_ARGUMENT / INVALID_STATE naming the layer; another list on another rank is
 * CALL_MISMATCH). Parameters, gradients and saved activations stay per layer; shared layers
 * must be used serially (a concurrent call from another thread is INVALID_STATE). */
megamoe_status_t megamoe_experts_share(megamoe_experts_t *const *layers, size_t count);

/* Forward. output: bf16 [T_r, H] (T_r = input.num_tokens, or T). saved_p != NULL: keep what the backward needs and return it
 * (free it with megamoe_experts_saved_destroy, after or instead of the backward); NULL:
 * inference, nothing kept. Collective. */
megamoe_status_t megamoe_experts_forward(megamoe_experts_t *experts,
                                         const megamoe_experts_weights_t *weights,
                                         const megamoe_experts_input_t *input, void *output,
                                         megamoe_experts_saved_t **saved_p);

/* Backward of the forward that produced saved, for grad_output bf16 [T_r, H] (T_r: that
 * forward's row count; grads.hidden_states [T_r, H], grads.topk_weights [T_r, K]). weights must hold
 * the same values as in that forward. The saved state stays valid (free it afterwards).
 * Collective. */
megamoe_status_t megamoe_experts_backward(megamoe_experts_t *experts,
                                          megamoe_experts_saved_t *saved,
                                          const megamoe_experts_weights_t *weights,
                                          const void *grad_output,
                                          const megamoe_experts_grads_t *grads);

/* Free one forward's saved state (local; any time, also after close). NULL is a no-op. */
void megamoe_experts_saved_destroy(megamoe_experts_saved_t *saved);

/* Close the layer: collective (call it on every rank in the same order, after all backwards;
 * a peer making another call meanwhile is CALL_MISMATCH on both, and the layer stays open);
 * when it is the last open layer of its resource group the group's symmetric memory is freed
 * and its SHMEM reference released. A second close is a local no-op; after a lost peer close
 * is local. Later forward/backward/share calls are INVALID_STATE. */
megamoe_status_t megamoe_experts_close(megamoe_experts_t *experts);

/* Free the handle (local). Closes nothing: a layer destroyed before close() keeps its group's
 * resources alive until process exit (as dropping the module does in the original), and the
 * last SHMEM release will report them. NULL is a no-op. */
void megamoe_experts_destroy(megamoe_experts_t *experts);

/* Filled by the library: the caller's sizeof travels with the call (the macro below). */
typedef struct megamoe_experts_info {
    int64_t tokens, hidden, intermediate, num_experts, top_k;
    int ep, rank;
    int64_t local_experts;
    int64_t capacity;        /* receive capacity in rows now (pull: 0, no receive buffer) */
    double capacity_factor;  /* expert_capacity_factor (0: lossless or not the fixed policy) */
    float swiglu_limit;
    char schedule[8];
    int workers;             /* threads per rank (O1: cube + vector workers) */
    size_t heap_bytes;       /* symmetric heap bytes of this layer's resource group */
    int group_layers;        /* layers sharing the resource group */
    int closed;
    int64_t last_recv_rows;  /* rows this rank received in the last forward (-1: none yet) */
    int cube_workers, vector_workers; /* O1 roles (O0: workers, 0) */
    char dispatch_mode[8];   /* "push" (also the default fixed policy) or "pull" */
    char capacity_policy[8]; /* "fixed" (expert_capacity_factor), "grow" (push), "none" (pull) */
    double initial_capacity_factor, capacity_growth_factor; /* push: resolved; else 0 */
    int64_t max_capacity;    /* rows growth stops at: the lossless bound align128(EP*T*K) */
    int growth_events;       /* capacity growths of the resource group so far */
    uint64_t shmem_heap_size; /* bytes per rank of the running SHMEM heap (0: not running) */
    /* hot-expert replicas: the plan of the last forward (the same on every rank) */
    int replica_slots;              /* replica_slots_per_rank */
    int last_guests;                /* guest slots in use (0: nothing moved) */
    int64_t last_rows_moved;        /* rows computed by guests instead of their homes */
    int64_t last_max_rows_plain;    /* the most rows a rank would compute without replicas */
    int64_t last_max_rows;          /* ... with the plan */
    /* per-call token counts */
    int64_t max_local_num_tokens;   /* T_cap of a dynamic layer (then tokens == T_cap); 0 for
                                       a fixed one */
    int64_t last_tokens;            /* rows this rank passed in the last forward (-1: none) */
} megamoe_experts_info_t;

megamoe_status_t megamoe_experts_get_info_sized(const megamoe_experts_t *experts,
                                                megamoe_experts_info_t *info_p, size_t info_size);
#define megamoe_experts_get_info(experts, info_p)                                          \
    megamoe_experts_get_info_sized((experts), (info_p), sizeof *(info_p))

/* One growth of the receive capacity ("push"), identical on every rank. */
typedef struct megamoe_experts_growth {
    uint64_t forward;            /* the group's forward (1-based) that grew it */
    int64_t demand;              /* rows the fullest rank had to receive in that call */
    int64_t rows_before, rows_after;
    size_t heap_bytes_before, heap_bytes_after; /* the group's symmetric bytes */
    uint64_t heap_used_before, heap_used_after; /* SHMEM heap bytes in use on this rank */
} megamoe_experts_growth_t;

/* Growth event index (0 = first) of the layer's resource group; INVALID_ARGUMENT when index is
 * not below info.growth_events. */
megamoe_status_t megamoe_experts_get_growth(const megamoe_experts_t *experts, int index,
                                            megamoe_experts_growth_t *growth_p);
/* One guest slot of the last forward's replica plan. */
typedef struct megamoe_experts_replica {
    int rank;        /* the guest's rank */
    int slot;        /* its guest slot, 0 .. replica_slots_per_rank - 1 */
    int64_t expert;  /* the global expert it served */
    int home;        /* that expert's home rank */
    int64_t rows;    /* rows it computed (from every source) */
} megamoe_experts_replica_t;

/* The guest slots in use in the last forward (every rank's, ordered by rank then slot) into
 * out[0 .. max); *count_p = how many there are (may exceed max). OK with 0 when replicas are
 * off or nothing moved. */
megamoe_status_t megamoe_experts_get_replicas(const megamoe_experts_t *experts,
                                              megamoe_experts_replica_t *out, size_t max,
                                              size_t *count_p);

/* The layer's number N in call descriptors and CALL_MISMATCH messages ("layer #N"): layers are
 * numbered in creation order, the same on every rank (0 for NULL). */
uint64_t megamoe_experts_layer_number(const megamoe_experts_t *experts);

/* Per-phase wall time accumulated by this layer's forward and backward calls on this rank. */
#define MEGAMOE_EXPERTS_MAX_PHASES 20
typedef struct megamoe_experts_timing {
    int count;                                  /* phases listed */
    const char *name[MEGAMOE_EXPERTS_MAX_PHASES]; /* "fwd.dispatch", "bwd.gmm_dx", ... */
    double seconds[MEGAMOE_EXPERTS_MAX_PHASES];
    uint64_t forwards, backwards;               /* calls accumulated */
} megamoe_experts_timing_t;

megamoe_status_t megamoe_experts_get_timing(const megamoe_experts_t *experts,
                                            megamoe_experts_timing_t *timing_p);
void megamoe_experts_reset_timing(megamoe_experts_t *experts);

/* O1 profiling session of the layer's resource group on this rank (docs/profiling.md): it
 * exists once a launch ran while profiling was requested (MEGAMOE_PROFILE=<dir>, or
 * megamoe_profiler_start()), and records while the profiler is started; NULL before that and
 * for O0. Use megamoe_profile_get_worker_summary() & co. on it between calls; it belongs to
 * the group (do not destroy it); it is exported to MEGAMOE_PROFILE and freed when the group
 * closes. */
megamoe_profile_t *megamoe_experts_get_profile(const megamoe_experts_t *experts);

/* Symmetric heap bytes one resource group of this configuration needs on every rank:
 * (capacity + T*K) rows of H bf16 plus signal lines, each buffer rounded to 4 KiB; capacity is
 * the fixed one, for "push" the lossless bound growth may reach, for "pull" T*K (the staged
 * source rows). The heap
 * must have that much free at the group's first forward (see docs/moe.md "Heap sizing");
 * a process that starts SHMEM itself can pass align64MiB(sum + 16 MiB) as the heap size.
 * 0 for invalid params. */
size_t megamoe_experts_heap_bytes(const megamoe_experts_params_t *params, int ep_size);

/* Receive capacity in rows for the given settings (the rule above); 0 for invalid input. */
int64_t megamoe_experts_capacity_rows(int64_t ep, int64_t tokens, int64_t top_k,
                                      double capacity_factor);

MEGAMOE_API_END
#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_EXPERTS_H */
