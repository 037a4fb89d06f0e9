/* Internal pieces shared by the DispatchV2 / CombineV2 / CombineAddRmsNorm operators.
 *
 * One call of an operator runs in phases:
 *   1. validate locally (v2_validate.c) and derive the configuration (mm_v2_cfg_t);
 *   2. agree (v2_workspace.c): one allgather over the WORLD of a fixed-size record (local status,
 *      attributes, team membership, workspace needs, rows sent to every PE) — this is the
 *      count exchange, the CONFIG_MISMATCH check, the growth decision for the symmetric
 *      workspace, and the guard that makes buffer reuse safe (nobody writes into a buffer of
 *      call n+1 before its owner has finished call n);
 *   3. move data with one-sided puts into the peers' symmetric workspace and one signal per
 *      (source, destination) pair, valued with the call generation (monotone, never reset).
 */
#ifndef MM_OPS_V2_INTERNAL_H
#define MM_OPS_V2_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/ops.h"
#include "ops/call_order.h"

#include "kernels/rows.h"
#include "ops/v2_modes.h"
#include "shmem/comm_impl.h"
#include "shmem/shmem.h"

/* ---- configuration --------------------------------------------------------------------- */

typedef enum mm_v2_op { MM_V2_OP_DISPATCH = 1, MM_V2_OP_COMBINE = 2, MM_V2_OP_ADD_RMS_NORM = 3 } mm_v2_op_t;
/* comm_alg: "" and "fullmesh_v1", "fullmesh_v2", "hierarchy"; "fullmesh" is A2's spelling:
 * fullmesh with A2's assist_info layout (docs/ops.md "comm_alg fullmesh (A2)") */
typedef enum mm_v2_alg {
    MM_V2_ALG_FULLMESH = 0,
    MM_V2_ALG_FULLMESH_V2 = 1,
    MM_V2_ALG_HIERARCHY = 2,
    MM_V2_ALG_FULLMESH_A2 = 3
} mm_v2_alg_t;

/* Attributes that must be equal on every rank of an EP group (names in v2_validate.c). */
enum {
    MM_V2_ATTR_OP,
    MM_V2_ATTR_EP_WORLD,
    MM_V2_ATTR_MOE_EXPERTS,
    MM_V2_ATTR_SHARED_EXPERTS,
    MM_V2_ATTR_SHARED_RANKS,
    MM_V2_ATTR_SHARD_TYPE,
    MM_V2_ATTR_K,
    MM_V2_ATTR_H,
    MM_V2_ATTR_XTYPE,
    MM_V2_ATTR_QUANT,
    MM_V2_ATTR_YTYPE,
    MM_V2_ATTR_GLOBAL_BS,
    MM_V2_ATTR_TP_WORLD,
    MM_V2_ATTR_ALG,
    MM_V2_ATTR_ZERO,
    MM_V2_ATTR_COPY,
    MM_V2_ATTR_CONST,
    MM_V2_ATTR_COMM_QUANT,
    MM_V2_ATTR_ELASTIC,
    MM_V2_ATTR_HIER_GROUP,
    MM_V2_ATTR_PASS_SCALES,
    MM_V2_NATTR
};

typedef struct mm_v2_cfg {
    mm_v2_op_t op;
    /* shapes */
    int64_t bs, h, k;
    megamoe_dtype_t xtype;   /* token type (dispatch x, combine expand_x) */
    megamoe_dtype_t ytype;   /* dispatch expand_x type */
    size_t xsize, ysize;     /* element sizes */
    /* attributes (NS normalised: S == 0 && NS == 1 -> 0) */
    int64_t W, rank, E, S, NS, K, Z, Cp, Cn, quant, comm_quant, tp, tp_rank, T;
    const mm_v2_quant_mode_t *qmode;        /* the row of quant (dispatch) */
    const mm_v2_comm_quant_mode_t *cqmode;  /* the row of comm_quant (combine) */
    int64_t gbs_real, max_bs, A, L_moe, L_out, n_counts;
    mm_v2_alg_t alg;
    int mask_dim, ent_type;
    int hier_group;          /* ranks per hierarchy group */
    /* effective values (elastic_info with isScaled = 1 replaces W, S, E and the rank id) */
    int scaled;
    int64_t eW, eS, eE, erank; /* erank = compact id, -1 when this rank was removed */
    int64_t eL, rpse;          /* local experts of this rank's role; ranks per shared expert */
    int shared_role;
    const int32_t *table1, *table2; /* physical -> compact, compact -> physical */
    /* a pre-quantised x (int8 / fp8, quant_mode 0) travels as is, with its scales:
     * MM_V2_PASS_* (0: x is bf16 / fp16) */
    int pass;
    /* first assist_info entry of the (source, token, k) triples: 0, or BS * K with A2's
     * fullmesh (whose per-pair slot array comes first) */
    int64_t assist_off;
    /* rows of the dispatch payload */
    int64_t scale_elems;     /* per-row dynamic scale elements (0, 1, ceil(H/128), align2(H/32)) */
    size_t scale_bytes;      /* bytes of those */
    size_t row_bytes;        /* H * ysize */
    uint64_t elastic_hash;
} mm_v2_cfg_t;

/* Layouts of a pre-quantised dispatch x's scales (cfg.pass). */
enum {
    MM_V2_PASS_OFF = 0,    /* x bf16 / fp16 */
    MM_V2_PASS_BARE = 1,   /* no scales */
    MM_V2_PASS_TOKEN = 2,  /* fp32 [BS] (or [BS, 1]): one per token */
    MM_V2_PASS_GROUP = 3,  /* fp32 [BS, ceil(H / 128)] */
    MM_V2_PASS_MX = 4      /* e8m0 [BS, align2(ceil(H / 32))] */
};

/* Derive the configuration from dispatch / combine arguments; INVALID_ARGUMENT naming the
 * parameter and the rule for every semantic rule of the spec (validation only, no
 * communication). For the checks that read whole tensors (ids, masks, NaN) see below. */
megamoe_status_t mm_v2_dispatch_config(const megamoe_dispatch_v2_args_t *a, mm_v2_cfg_t *cfg);
megamoe_status_t mm_v2_combine_config(const megamoe_combine_v2_args_t *a, mm_v2_op_t op,
                                      mm_v2_cfg_t *cfg);
/* Data checks of the inputs common to both operators: id range (and elastic holes), mask
 * shape/type/prefix rule. n_active_p: tokens processed (all, prefix, or any-true rows). */
megamoe_status_t mm_v2_check_ids_mask(const mm_v2_cfg_t *cfg, const megamoe_tensor_t *ids,
                                      const megamoe_tensor_t *mask, const char *op_name);
/* 1 when the fp32 array holds a NaN. */
int mm_v2_has_nan(const float *v, int64_t n);
/* Expected output descriptors (shapes as torch_npu allocates them). */
void mm_v2_dispatch_out_shapes(const mm_v2_cfg_t *cfg, megamoe_dispatch_v2_args_t *a);
/* Check that a caller's output tensor matches (dtype, rank, dims with >= for capacities). */
megamoe_status_t mm_v2_check_out(const megamoe_tensor_t *got, const megamoe_tensor_t *want,
                                 const char *name, int dim0_at_least);
megamoe_tensor_t mm_v2_tensor(megamoe_dtype_t dtype, int ndim, int64_t d0, int64_t d1,
                              int64_t d2);

/* Routing helpers (compact id space). */
static inline int64_t mm_v2_moe_dst(const mm_v2_cfg_t *c, int64_t e) { return c->eS + e / c->eL; }
static inline int64_t mm_v2_shared_dst(const mm_v2_cfg_t *c, int64_t src, int64_t j)
{
    return src % c->rpse + j * c->rpse;
}
/* Compact id -> physical EP rank. */
static inline int64_t mm_v2_phys(const mm_v2_cfg_t *c, int64_t compact)
{
    return c->scaled ? c->table2[compact] : compact;
}
/* Local experts of the rank with compact id r (1 on shared ranks). */
static inline int64_t mm_v2_local_experts(const mm_v2_cfg_t *c, int64_t r)
{
    return r < c->eS ? 1 : c->eL;
}
/* Tokens processed by the source under the mask (all / prefix / rows with any true). */
int64_t mm_v2_active_tokens(const mm_v2_cfg_t *cfg, const uint8_t *mask, uint8_t *active);

/* ---- agreement and workspace ----------------------------------------------------------- */

/* The two workspace pools (and call kinds): dispatch's and combine's (+ add_rms_norm). */
typedef enum mm_v2_ws_kind { MM_V2_WS_DISPATCH = 0, MM_V2_WS_COMBINE = 1 } mm_v2_ws_kind_t;
#define MM_V2_WS_COUNT 2
#define MM_V2_MAX_SEGS 8

/* ---- scopes (v2_scope.c): the ranks a call involves, their team, call order and pools ---- */
#define MM_V2_MAX_SCOPES 32

typedef struct mm_v2_scope {
    mm_shmem_team_t *team;       /* NULL: free slot; the EP communicator's team (or the world) */
    uint64_t uid;                /* the cache key: the team's id */
    int n, me;                   /* members, this rank's index */
    int *wpe;                    /* [n] world rank of member i */
    int *idx;                    /* [world] member index of a world rank, -1 outside */
    mm_call_group_t calls;       /* the call order of the operators on a subgroup scope */
    mm_call_group_t *order;      /* &calls, or the process's operators group on the world */
    void *base[MM_V2_WS_COUNT];  /* workspace pools (symmetric over the scope's team) */
    uint64_t size[MM_V2_WS_COUNT];
    uint64_t gen[MM_V2_WS_COUNT];
    /* after a lost member (v2_survive.c): the survivors' team, its call order, the lost
     * members (by member index) and the team each pool was allocated on */
    mm_shmem_team_t *live;
    mm_call_group_t live_calls;
    uint8_t *lost;
    mm_shmem_team_t *pool_team[MM_V2_WS_COUNT];
} mm_v2_scope_t;

/* The scope of a team (the EP communicator's, or the world's for TP calls): cached; local. */
megamoe_status_t mm_v2_scope_get(mm_shmem_team_t *team, mm_v2_scope_t **scope_p);
/* For a call that cannot name its groups (args NULL): the scope of this rank's last call, else
 * the world's if it exists (NULL: the caller makes the world's, the common job's). */
mm_v2_scope_t *mm_v2_scope_guess(void);
/* Free every scope's pools and team (collective per scope; the last release). */
megamoe_status_t mm_v2_scopes_release(void);
/* The SHMEM release hook of the operators (megamoe_ops_release): registered by the first scope
 * of a lifecycle, so scopes whose calls never got a pool are released too. */
megamoe_status_t mm_v2_release_hook(void *arg);

typedef struct mm_v2_record {
    int32_t status;      /* local status (MEGAMOE_OK when this rank can proceed) */
    int32_t ep_leader;   /* scope member index of EP rank 0 (-1 unknown) */
    int32_t ep_rank, ep_size;
    int32_t tp_leader, tp_rank, tp_size;
    int32_t pad;         /* scope member index of the TP peer */
    int64_t attrs[MM_V2_NATTR];
    int64_t tp_attrs[4]; /* H, ytype, quant, A: must match between TP peers */
    int64_t bs;
    uint64_t ws_size;    /* this rank's current pool size (lockstep check) */
    uint64_t gen;        /* this rank's last call generation of the pool (the call takes the
                            maximum + 1: members that failed different calls realign) */
    uint64_t seg[MM_V2_MAX_SEGS];
    int64_t aux[4];      /* operator-specific small values */
    /* followed by int32 counts[2 * n_world]: rows to each member, hop-1 units to each */
} mm_v2_record_t;

/* A call. Its "PEs" are the scope's member indices (0..n_world-1): records, counts and signal
 * lines are indexed by them; mm_v2_wpe() turns one into the world rank the SHMEM calls take. */
typedef struct mm_v2_call {
    mm_v2_ws_kind_t kind;
    int n_world, me;            /* members of the scope and my index */
    mm_v2_scope_t *scope;
    mm_shmem_team_t *ep, *tp;   /* NULL when absent */
    size_t rec_bytes;
    uint8_t *records;           /* n_world records (a kept block, v2_workspace.c) */
    uint64_t gen;               /* this call's generation (>= 1) */
    uint8_t *base;              /* my symmetric pool */
    uint64_t seg_off[MM_V2_MAX_SEGS];
    const uint8_t *lost;        /* [n_world] members the survivors found lost; NULL: none */
} mm_v2_call_t;

/* ---- a lost rank in the scope (v2_survive.c) ---- */
/* 1 when scope member pe of the call is lost (its rows are neither sent nor waited for; pairs
 * routed to its experts contribute nothing and are not counted). */
static inline int mm_v2_lost(const mm_v2_call_t *call, int pe)
{
    return call->lost != NULL && call->lost[pe];
}
/* Acknowledge the runtime's losses and mark the scope's lost members in call->lost (the call
 * then runs among the survivors). PEER_LOST when this rank is out. */
megamoe_status_t mm_v2_survivors(mm_v2_call_t *call);
/* The team and call order of the call's exchange: the scope's, or its survivors' team (made on
 * first use, collective over them). */
megamoe_status_t mm_v2_exchange_team(mm_v2_call_t *call, mm_shmem_team_t **team_p,
                                     mm_call_group_t **order_p);
/* Why a call with a lost member cannot run (TP, hierarchy, fullmesh_v2, scaled elastic_info),
 * as the local status; OK otherwise. */
megamoe_status_t mm_v2_lost_unsupported(const mm_v2_call_t *call, const mm_v2_cfg_t *cfg,
                                        const char *op_name);
/* Forget the survivors' team of a scope (its drop). */
megamoe_status_t mm_v2_scope_live_drop(mm_v2_scope_t *s);

static inline mm_v2_record_t *mm_v2_rec(const mm_v2_call_t *call, int pe)
{
    return (mm_v2_record_t *)(call->records + (size_t)pe * call->rec_bytes);
}
static inline int32_t *mm_v2_rec_counts(const mm_v2_call_t *call, int pe)
{
    return (int32_t *)((uint8_t *)mm_v2_rec(call, pe) + sizeof(mm_v2_record_t));
}

/* Start a call: requires the runtime to run. Finds the scope (uses_tp: the world, else ep's
 * team), fills n_world/me and allocates the records. */
megamoe_status_t mm_v2_call_begin(mm_v2_call_t *call, mm_v2_ws_kind_t kind, megamoe_comm_t *ep,
                                  megamoe_comm_t *tp, int uses_tp);
/* Exchange the records (mine = mm_v2_rec(call, call->me), filled by the caller) as the first
 * exchange of a call of call_kind (MM_CALL_DISPATCH_V2, ... in ops/call_order.h: the call
 * order is checked with it, CALL_MISMATCH), decide collectively: the first failing rank's
 * status (a failing rank keeps its own message, the others get "rank R: <message>"),
 * CONFIG_MISMATCH for attributes that differ inside an EP group or between TP peers. */
megamoe_status_t mm_v2_call_agree(mm_v2_call_t *call, int call_kind);
/* A call of call_kind that failed before it could build its record (args NULL, a binding's
 * argument check): take part in the exchange with st so every rank returns it. */
megamoe_status_t mm_v2_call_refuse(int call_kind, megamoe_status_t st);
/* The library's full copy of the caller's add_rms_norm args (megamoe/version.h; the embedded
 * combine args located by their struct_size). */
megamoe_status_t mm_v2_arn_copy_in(megamoe_combine_add_rms_norm_args_t *dst,
                                   const megamoe_combine_add_rms_norm_args_t *src);
/* World maximum of record field seg[s]. */
uint64_t mm_v2_call_segmax(const mm_v2_call_t *call, int s);
/* Lay the segments out (sizes must be world maxima, so every PE gets the same offsets), grow
 * the pool when needed (collective, same decision everywhere) and start the generation. */
megamoe_status_t mm_v2_call_layout(mm_v2_call_t *call, int nseg, const uint64_t *seg_bytes);
void mm_v2_call_end(mm_v2_call_t *call);
/* Address of segment s in MY pool (symmetric: the same offset on every PE). */
static inline uint8_t *mm_v2_seg(const mm_v2_call_t *call, int s)
{
    return call->base + call->seg_off[s];
}
/* Signal line i of a signal segment. */
static inline uint64_t *mm_v2_sig(const mm_v2_call_t *call, int s, int i)
{
    return (uint64_t *)(mm_v2_seg(call, s) + (size_t)i * 64);
}
/* Signal words carry (generation << 8) | the sender's error (-status; 0 = OK). A rank whose
 * call fails after the agreement (a transfer that failed, a peer that timed out) still sets
 * every line it owns, with its error (mm_v2d_poison / mm_v2c_poison), so each peer waiting on
 * it fails at once with the same status instead of reading rows that never came or waiting for
 * the timeout; the next call's generation is larger whatever the low byte holds. */
static inline uint64_t mm_v2_sigval(const mm_v2_call_t *call, megamoe_status_t st)
{
    return (call->gen << 8) | (uint64_t)(st < 0 ? -(int)st & 0xff : 0);
}
/* The status a signal word of this call carries (OK, or its sender's error, logged naming the
 * sender); the word must have reached the call's generation. */
megamoe_status_t mm_v2_sig_status(const mm_v2_call_t *call, uint64_t value, const char *what,
                                  int peer);
/* Wait for a signal to reach this call's generation; its sender's error when it carries one;
 * adds the wait to *waited_us when given. */
megamoe_status_t mm_v2_wait(const mm_v2_call_t *call, uint64_t *sig, const char *what,
                            int peer, int64_t *waited_us);
/* SET line `line` of signal segment s on scope member pe to this call's value with status st
 * (the failure path); a line that cannot be set even on a second try declares pe lost. */
void mm_v2_poison_line(const mm_v2_call_t *call, int s, int line, int pe, megamoe_status_t st);
/* Fill the attribute fields of a record from a configuration. */
void mm_v2_record_attrs(const mm_v2_cfg_t *cfg, mm_v2_record_t *rec);

/* Scope member index of EP rank r / of the TP peer. */
int mm_v2_ep_pe(const mm_v2_call_t *call, int64_t ep_rank);
int mm_v2_tp_peer_pe(const mm_v2_call_t *call, int64_t tp_rank);
/* World rank of scope member i (what mm_shmem_put & co. take). */
static inline int mm_v2_wpe(const mm_v2_call_t *call, int i) { return call->scope->wpe[i]; }

/* ---- per-call scratch ------------------------------------------------------------------
 * Everything a call needs after the agreement is reserved before it, so a rank can never fail
 * (and leave its peers waiting) once data moves. */
typedef struct mm_v2_scratch {
    uint8_t *base;
    size_t size, used;
} mm_v2_scratch_t;

/* Bytes to reserve for a piece of n bytes (64-byte aligned pieces). */
static inline size_t mm_v2_piece(size_t n) { return ((n ? n : 1) + 63) / 64 * 64; }
megamoe_status_t mm_v2_scratch_init(mm_v2_scratch_t *s, mm_v2_ws_kind_t kind, size_t bytes);
/* A zeroed piece of n bytes (the reservation must cover it). */
void *mm_v2_scratch_take(mm_v2_scratch_t *s, size_t n);
void mm_v2_scratch_free(mm_v2_scratch_t *s);
/* Free the cached scratch buffers (megamoe_ops_release). */
void mm_v2_scratch_release(void);

/* ---- row transforms (v2_modes.c: the one place that calls the kernels' quantisers) ------- */

/* Quantise (or copy) one token row for dispatch into out (row_bytes) and scale_out
 * (scale_bytes), as cfg's quant_mode says. smooth: the scales row for this expert (NULL:
 * none); for quant_mode 1 with a [1] / [H] scales tensor the caller passes that. */
static inline void mm_v2_quant_row(const mm_v2_cfg_t *cfg, const void *x, const float *smooth,
                                   int64_t smooth_len, void *out, void *scale_out)
{
    cfg->qmode->row(cfg, x, smooth, smooth_len, out, scale_out);
}
/* Combine transport records (mode: a comm_quant_mode row with a block, i.e. not "none"):
 * q[H] (int8, or fp8 for MX), then at an 8-aligned offset the scales (per 8 elements in the
 * row type for int8, per 32 as E8M0 for MX); mm_v2_cq_bytes(mode, h, xsize) bytes. */
size_t mm_v2_cq_bytes(const mm_v2_comm_quant_mode_t *mode, int64_t h, size_t xsize);
void mm_v2_cq_quant(const mm_v2_comm_quant_mode_t *mode, megamoe_dtype_t xtype, int64_t h,
                    const void *y, void *rec);
/* Dequantise a record to fp32 (y' of the spec: int8 rounds to XType first, the MX modes do
 * not); out has room for 2 * h floats (the second half is scratch). */
void mm_v2_cq_dequant_f32(const mm_v2_comm_quant_mode_t *mode, megamoe_dtype_t xtype, int64_t h,
                          const void *rec, float *out);
/* The same for elements [c0, c0 + n) of the row (c0 a multiple of 32; out: 2 * n floats). */
void mm_v2_cq_dequant_range(const mm_v2_comm_quant_mode_t *mode, megamoe_dtype_t xtype,
                            int64_t h, const void *rec, int64_t c0, int64_t n, float *out);

/* ---- small numeric helpers (exact; see docs/ops.md) ------------------------------------ */

/* memcpy, or with non-temporal stores (ending with sfence) when stream is set: for large
 * write-once destinations (expand_x, a peer's receive region) that would only evict caches. */
void mm_v2_copy(void *dst, const void *src, size_t n, int stream);
/* Widen n XType values to fp32. */
void mm_v2_widen(megamoe_dtype_t t, const void *src, float *dst, int64_t n);
/* Round n fp32 values to XType (RNE). */
void mm_v2_narrow(megamoe_dtype_t t, const float *src, void *dst, int64_t n);
/* (Accumulating rows and the fixed 16-lane sums: kernels/rows.h.) */
/* XType(a + b) rounded once from the exact sum (bf16: fp32 add then RNE, as the device). */
void mm_v2_tp_add(megamoe_dtype_t t, const void *a, const void *b, void *out, int64_t n);

#endif /* MM_OPS_V2_INTERNAL_H */
