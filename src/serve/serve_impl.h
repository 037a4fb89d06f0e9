/* The serving MegaMoE (include/megamoe/serve.h) — internals shared by the files of src/serve/:
 * the buffer, the validated form of one call, the per-expert math of every scene.
 *
 * Data path of one call (docs/serve.md "How a call runs"):
 *  1. local checks of every argument (serve_args.c) and the per-expert counts of this rank's
 *     active pairs; any failure is this rank's local status;
 *  2. the call's first exchange (ops/call_order.h: one allgather of a record per rank, on the
 *     team of the unmasked ranks): call order, every rank's status, n, the counts and the
 *     settings that must agree (serve_call.c). Nothing moved before it succeeded;
 *  3. dispatch: each active (token, k) pair's row — bf16, or quantised once per token for the
 *     scene — goes straight into its owner's receive rows (local expert, source rank, source
 *     order), then a SET of the call's generation on the owner's dispatch line for this source;
 *     shared experts run on the local tokens meanwhile;
 *  4. the owner computes each local expert's rows (serve_ffn.c) and writes the bf16 result over
 *     the input row (in place), then SETs the generation on every source's combine line;
 *  5. each source reads its rows back from the owners (direct loads on one host, gets across
 *     hosts) and sums them with the router weights in fp32, adds the shared experts, rounds once.
 * The receive rows are the buffer's only data memory: a source writes into them in call c+1
 * only after the exchange of c+1, which every rank enters after finishing call c.
 */
#ifndef MM_SERVE_SERVE_IMPL_H
#define MM_SERVE_SERVE_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "megamoe/serve.h"

#include "kernels/gemm.h"
#include "multicore/worker_pool.h"
#include "ops/call_order.h"
#include "shmem/shmem.h"

#define MM_SV_MAGIC 0x73796d6du
#define MM_SV_TILE 128   /* rows per compute tile */
#define MM_SV_MX_BLOCK 32
#define MM_SV_MAX_MASK_GROUPS 8 /* call-order groups kept for distinct masks */

/* Scenes of one expert set (spec §5), chosen by the weights' logical type. */
typedef enum mm_sv_scene {
    MM_SV_A16W16 = 0,
    MM_SV_A8W8_INT,
    MM_SV_A8W4_INT,
    MM_SV_A8W8_FP,
    MM_SV_A8W4_FP,
    MM_SV_A4W4_FP,
    MM_SV_SCENES
} mm_sv_scene_t;
const char *mm_sv_scene_name(int scene);

/* How weight scales are stored. */
enum { MM_SV_SF_NONE = 0, MM_SV_SF_FP32, MM_SV_SF_LOW32, MM_SV_SF_E8M0 };

/* One set of experts (the L routed ones, or the S shared ones) as the call passes them. */
typedef struct mm_sv_experts {
    int count;       /* experts in the set (0: none) */
    int scene;       /* mm_sv_scene_t */
    int wtype;       /* megamoe_serve_type_t of the weights */
    int atype;       /* activations' type on the wire / into GMM1 and GMM2: BF16, INT8,
                        FP8_E4M3FN, FP8_E5M2, FP4_E2M1 (MX) */
    int atype2;      /* GMM2 input (A4W4-FP re-quantises to MX fp8 e4m3fn) */
    int64_t H, I;
    int sf_kind;     /* MM_SV_SF_* */
    /* per expert: data of W1 / W2 (layout by wtype: bf16/int8 [in, out]; int4 packed along
     * out; fp8 [out, in]; fp4 [out, in/2]), the scales (fp32 or 64-bit per output channel;
     * e8m0 [out, ceil(in/64), 2]) and the A8W4 biases */
    const void **w1, **w2, **s1, **s2;
    const float **b1, **b2;
    int int4_carrier; /* MEGAMOE_DTYPE_INT32 or INT8 */
    uint64_t version, stamp; /* weights_version of the call; its weight-cache stamp */
} mm_sv_experts_t;

/* What every rank of a call must agree on (compared after the first exchange). */
typedef struct mm_sv_settings {
    int32_t activation;          /* MM_SV_ACT_* */
    int32_t params_set;
    double clamp, alpha, beta, linear_beta;
    int32_t quant_mode, quant_out; /* the buffer's attributes at the call */
    int32_t scene, wtype, count, layout;
    int64_t H, I;
    int32_t sh_scene, sh_wtype, sh_count, sh_atype;
    int64_t sh_I;
    int32_t combine_quant_mode;
    int32_t schedule;            /* MEGAMOE_SERVE_SCHEDULE: the path must be the same everywhere */
} mm_sv_settings_t;

enum { MM_SV_ACT_SWIGLU = 0, MM_SV_ACT_SWIGLUSTEP, MM_SV_ACT_SWIGLUOAI, MM_SV_ACT_SITUGLU };
const char *mm_sv_act_name(int act);

/* The activation of one call, resolved. */
typedef struct mm_sv_act {
    int kind;
    float clamp;        /* +inf: none */
    float alpha, beta;  /* swigluoai (1.702, 1), situglu beta (1) */
    float linear_beta;  /* situglu: 0 = not configured */
} mm_sv_act_t;

/* One call, validated (serve_args.c). */
typedef struct mm_sv_call {
    int64_t n, H, K, E, L;
    const uint16_t *x;      /* bf16 [n, H] */
    const void *ids;        /* [n, K] */
    int ids_dtype;
    const void *weights;    /* [n, K] */
    int w_dtype;
    const uint8_t *active;  /* [n] (int8 / bool bytes), NULL = all */
    mm_sv_act_t act;
    mm_sv_experts_t routed, shared;
    uint16_t *y;            /* bf16 [n, H] */
    int32_t *expert_token_nums; /* [L] */
    mm_sv_settings_t set;
} mm_sv_call_t;

typedef struct mm_sv_o1 mm_sv_o1_t; /* serve_o1.c: the executor and its inference plan */

/* A call-order group of the buffer for one set of participants (the unmasked ranks). */
typedef struct mm_sv_order {
    uint64_t key;            /* digest of the participants; 0 = unused slot */
    mm_shmem_team_t *team;   /* the participants' team (the buffer's own when none masked) */
    int own_team;            /* created for the mask (destroyed with the buffer) */
    mm_call_group_t calls;
} mm_sv_order_t;

struct megamoe_symm_buffer {
    uint32_t magic;
    megamoe_comm_t *comm;
    mm_shmem_team_t *team;
    int W, me, ranks_per_host;
    int *pes;                 /* [W] world PE of member i */
    megamoe_symm_buffer_params_t p; /* resolved; comm_alg -> "" */
    int64_t L, cap;           /* local experts; receive capacity (rows) */
    int64_t ret_rows;         /* rows after the receive rows where the O1 owners on other hosts
                                 put this rank's results back: num_max_tokens_per_rank * top-k
                                 when the group spans hosts, else 0 (serve_call.c) */
    size_t row_bytes;         /* bytes per receive row */
    void *recv;               /* symmetric [cap][row_bytes] */
    uint64_t *sig;            /* symmetric: [3][W] lines (dispatch from s, combine from s, s
                                 finished reading this rank's rows) */
    size_t sym_bytes;
    int alive, broken;
    uint64_t id;              /* the buffer's number (agreed at creation) */
    uint64_t gen;             /* generation of the last call (monotone, agreed per call) */
    /* the participants of this rank's last call that moved data and its generation: before
     * its next call this rank waits until each of them finished reading its rows (a rank the
     * next call's mask leaves out is not held back by that call's exchange) */
    int prev_n;
    int *prev;                /* [W] member indices */
    uint64_t prev_gen;
    int32_t *mask;            /* [W] or NULL before the first mask call */
    mm_sv_order_t orders[MM_SV_MAX_MASK_GROUPS];
    mm_pool_t *pool;
    int workers;
    mm_sv_o1_t *o1;           /* the O1 path (NULL without a token bound) */
    uint64_t calls, o1_calls;
    int64_t last_recv_rows;
    atomic_int busy;
    /* per-call scratch, grown to the largest call (serve_call.c) */
    void *scr[16];
    size_t scr_bytes[16];
};

/* ---- serve_buffer.c ---- */
megamoe_status_t mm_sv_buffer_check(const megamoe_symm_buffer_t *b, const char *what);
/* Grow scratch slot `which` to at least bytes (64-byte aligned). */
megamoe_status_t mm_sv_scratch(megamoe_symm_buffer_t *b, int which, size_t bytes, void **p);
/* The call-order group and team of the current participants (the unmasked members). Creating
 * a new one for a new mask is collective over the participants. */
megamoe_status_t mm_sv_order(megamoe_symm_buffer_t *b, mm_sv_order_t **order_p);
/* ---- serve_survive.c ---- */
/* Acknowledge the runtime's losses and mask the buffer's lost members (every call, first). */
megamoe_status_t mm_sv_runtime_mask(megamoe_symm_buffer_t *b);
/* Bytes per receive row for hidden size H (large enough for every scene's row). */
size_t mm_sv_row_bytes(int64_t H);

/* ---- serve_args.c ---- */
/* Validate args against the buffer (local): INVALID_ARGUMENT naming the argument and the rule.
 * On OK *c describes the call (pointer arrays in the buffer's scratch). */
megamoe_status_t mm_sv_args(megamoe_symm_buffer_t *b, const megamoe_mega_moe_args_t *a,
                            mm_sv_call_t *c);
/* Compare every rank's settings; INVALID_ARGUMENT naming the first field that differs. */
megamoe_status_t mm_sv_settings_agree(const mm_sv_settings_t *const *all, const int *world_rank,
                                      int n);

/* ---- serve_quant.c (the quantisation steps of spec §6, scalar definitions) ---- */
/* Per-token int8: s = max|v| / 127 (fp32), q = round(v / s) half away from zero, clipped to
 * [-127, 127]; an all-zero row gives s = 0, q = 0. */
void mm_sv_quant_int8_f32(const float *v, int64_t h, int8_t *q, float *s_p);
void mm_sv_quant_int8_bf16(const uint16_t *v, int64_t h, int8_t *q, float *s_p);
/* MX blocks of 32 along the row: e8m0 scale per block (OCP: the largest element's exponent
 * minus the element type's emax), elements fp8 e4m3fn / e5m2 (RNE, saturating) or fp4 e2m1
 * (RNE, saturating at 6; two per byte, element 2j in the low nibble). */
void mm_sv_quant_mx_bf16(const uint16_t *v, int64_t h, int type, uint8_t *q, uint8_t *scales);
/* Decoders (exact values). */
float mm_sv_fp4_to_f32(uint8_t nibble);
float mm_sv_fp8_to_f32(uint8_t byte, int type);
float mm_sv_e8m0_to_f32(uint8_t e);
/* Bytes of a quantised row of h elements of type (without scales), and of its MX scales. */
size_t mm_sv_q_bytes(int type, int64_t h);
static inline int64_t mm_sv_mx_blocks(int64_t h) { return (h + MM_SV_MX_BLOCK - 1) / MM_SV_MX_BLOCK; }
/* A dispatched row (type atype: BF16, INT8, FP8_*, FP4_E2M1) -> its exact bf16 image. */
void mm_sv_row_to_bf16(const void *row, int atype, int64_t h, uint16_t *out, float *s_int8_p);
/* Quantise a bf16 token row into the wire format of atype (the inverse layout). */
void mm_sv_row_quant(const uint16_t *x, int atype, int64_t h, void *row);

/* ---- serve_act.c ---- */
/* a[r, i] = act(h[r, i], h[r, I + i]) in fp32 (spec §6.2). */
void mm_sv_activation(const mm_sv_act_t *act, int64_t rows, int64_t I, const float *h,
                      int64_t ldh, float *a, int64_t lda);

/* ---- serve_wcache.c ---- */
/* Start a call's use of the packed-weight cache: a stamp (entries it touches are kept). */
uint64_t mm_sv_wcache_begin(void);
/* The packed NN copy of bf16 src [K, N] (row stride ld elements) for this call. */
megamoe_status_t mm_sv_wcache_bf16(const mm_gemm_backend_ops_t *backend, const uint16_t *src,
                                   int64_t K, int64_t N, int64_t ld, uint64_t version,
                                   uint64_t stamp, const mm_gemm_weight_t **weight_p);
/* The packed copy of int8 or int4 (packed two per byte along N) KN weight src (ld_bytes per
 * row), and for int4 its column sums (sum over k of the values). */
struct mm_qweight;
megamoe_status_t mm_sv_wcache_q(int int4, const void *src, int64_t K, int64_t N, int64_t ld_bytes,
                                uint64_t version, uint64_t stamp, const struct mm_qweight **weight_p,
                                const int32_t **colsum_p);
void mm_sv_wcache_stats(size_t *bytes, uint64_t *hits, uint64_t *misses);
void mm_sv_wcache_clear(void);

/* ---- serve_ffn.c ---- */
/* The weights of expert e of a set, ready for the bf16 GEMMs: exact bf16 images of quantised
 * values ([in, out] "NN" or [out, in] "NT") plus the per-column epilogue terms. */
typedef struct mm_sv_prepared {
    const uint16_t *w1, *w2; /* bf16 */
    int64_t ld1, ld2;        /* row strides */
    int nt;                  /* 1: stored [out, in] (NT products) */
    const float *sig1, *sig2; /* per-channel scales (integer scenes; NULL otherwise) */
    const float *off1, *off2; /* A8W4: B - 8 colsum(V o sigma) per channel (else NULL) */
    const mm_gemm_backend_ops_t *gemm; /* resolved once per call (MEGAMOE_GEMM) */
    const mm_gemm_weight_t *pk1, *pk2; /* packed copies from the weight cache (bf16), or NULL */
    const struct mm_qweight *q1, *q2;  /* integer scenes: packed int8 / int4 weights (qgemm) */
} mm_sv_prepared_t;
/* Scratch bytes one expert's preparation needs (0 for bf16 weights). */
size_t mm_sv_prepare_bytes(const mm_sv_experts_t *set);
/* Prepare expert e into scratch (mm_sv_prepare_bytes bytes). */
megamoe_status_t mm_sv_prepare(const mm_sv_experts_t *set, int e, void *scratch,
                               mm_sv_prepared_t *pw);
/* Per-worker tile scratch of one set. */
size_t mm_sv_tile_bytes(const mm_sv_experts_t *set);
/* F(x) for `rows` (<= MM_SV_TILE) input rows of the set's wire type (row stride ld bytes),
 * results as bf16 rows (stride ldo bytes; may alias the input rows) or added into fp32 acc
 * (stride H; for the shared experts: acc += F). */
megamoe_status_t mm_sv_ffn_tile(const mm_sv_experts_t *set, const mm_sv_prepared_t *pw,
                                const mm_sv_act_t *act, int64_t rows, const void *in, size_t ld,
                                void *scratch, uint16_t *out, size_t ldo, float *acc);

#endif /* MM_SERVE_SERVE_IMPL_H */
