/* BF16 matrix products with fp32 accumulation: one internal interface, run-time backends.
 *
 * Forms (every matrix row-major; ld* = row stride in elements, >= the row length):
 *   NN   C[M,N] = A[M,K] · B[K,N]       forward GMM1/GMM2 (B = gate_up[e] [H,2I], down[e] [I,H])
 *   NT   C[M,N] = A[M,K] · B[N,K]ᵀ      data grads through the weights: dX = dH · W1ᵀ, W1 [H,2I]
 *   TN   C[M,N] = A[R,M]ᵀ · B[R,N]      weight grads over a group's rows: dW = Xᵀ · dY (K = R)
 *
 * Semantics, for every backend:
 *  - A and B are bf16; every product is accumulated in fp32 (the order is the backend's; the
 *    reference sums k ascending). C is fp32 or bf16; bf16 is rounded once, to nearest even.
 *  - accumulate = 0: C = A·B.  accumulate = 1: C = round(C_old + A·B), the addition done in
 *    fp32 on the fp32 sum (one rounding for bf16 C).  K = 0 gives C = 0 (or C unchanged).
 *  - Only the sub-block rows [m0,m1) x columns [n0,n1) of C is computed, read or written, so
 *    workers can split one product (mm_gemm_args_init() sets the full range; MM_GEMM_END = to
 *    the end). Rows m of C need rows m of A (NN/NT) or columns m of A (TN).
 *  - Calls are thread-safe and independent; each call runs on the calling thread only, unless
 *    args.threads > 1 lets the backend use that many OpenMP threads inside the call. The
 *    calling thread's OpenMP settings are restored on return.
 *
 * Weights (NN and NT only) may be pre-packed once into the backend's preferred layout
 * (mm_gemm_weight_create) and re-packed only when the caller says they changed
 * (mm_gemm_weight_update with a new version, e.g. after an optimizer step). A packed weight
 * keeps a pointer to its caller-owned source: a column sub-block whose n0 is not a multiple
 * of mm_gemm_weight_n_align() falls back to the source (correct, slower).
 *
 * Backends: MEGAMOE_GEMM = auto | amx | avx512 | onednn | ref (MM_GEMM_CHOICES below; the same
 * words, in the same order, as src/base/env_table.h, which a test checks). The variable is read
 * once by whoever owns a set of products (a MegaMoE resource group at creation, a packed weight
 * at creation, a benchmark at start) and the resolved backend is passed in the arguments, so
 * worker threads never read the environment (which another thread, e.g. Python's os.environ,
 * may be changing).
 *   ref     plain C, fp32 accumulate, k ascending; every form and option (tests, no oneDNN).
 *   onednn  oneDNN 2.6 matmul: packed (and small dense plain) weights run fixed-M brgemm
 *           primitives on row chunks; other plain operands run one runtime-shape primitive
 *           per (form, C type, accumulate); all cached process-wide. See docs/kernels.md for
 *           the numbers behind this choice.
 *   avx512  own AVX512-BF16 (vdpbf16ps) BLIS-style GEMM: 6x64 micro-kernel, K blocks of
 *           1024 pairs, B in 64-column VNNI panels (packed weights or per call), A packed
 *           per call; single-threaded per call; 94-96% of the vdpbf16ps peak on the MoE
 *           shapes (gemm_avx512*.c, docs/kernels.md); needs AVX512-BF16.
 *   amx     own AMX-BF16 (tdpbf16ps) BLIS-style GEMM: rows of 32x32 micro-tiles (2x2 tiles)
 *           over K blocks of 384, A and B packed into tile layouts (packed weights, or per
 *           call; A gathered through row lists while packing), every form and option;
 *           single-threaded per call; split-invariant bits (gemm_amx*.c, docs/kernels.md);
 *           needs AMX-BF16, the kernel's tile permission and AVX-512 (UNSUPPORTED otherwise,
 *           with the reason; no tile instruction runs then).
 *   auto    amx where it is usable, else onednn when built, else avx512 when the CPU has it,
 *           else ref; except that big packed weights go to avx512 on CPUs with AVX512-BF16
 *           and no AMX (mm_gemm_backend_for_weight).
 * A backend is a struct mm_gemm_backend_ops (BLIS/ggml style vtable, optional members marked);
 * a new one is one more entry in gemm.c's registry and needs no change in callers.
 */
#ifndef MM_KERNELS_GEMM_H
#define MM_KERNELS_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/dtype.h"
#include "megamoe/status.h"

#define MM_GEMM_END INT64_MAX /* range end meaning "to the end of the dimension" */

/* The MEGAMOE_GEMM words, the one list: the enum, the registry names (each backend's `name` is
 * its MM_GEMM_NAME_*), messages and the benchmark's rows come from it. */
#define MM_GEMM_NAME_AUTO "auto"
#define MM_GEMM_NAME_AMX "amx"
#define MM_GEMM_NAME_AVX512 "avx512"
#define MM_GEMM_NAME_ONEDNN "onednn"
#define MM_GEMM_NAME_REF "ref"
#define MM_GEMM_CHOICES(X) X(AUTO) X(AMX) X(AVX512) X(ONEDNN) X(REF)

typedef enum mm_gemm_choice {
#define MM_GEMM_CHOICE_ENUM_(id) MM_GEMM_CHOICE_##id,
    MM_GEMM_CHOICES(MM_GEMM_CHOICE_ENUM_)
#undef MM_GEMM_CHOICE_ENUM_
        MM_GEMM_CHOICE_COUNT
} mm_gemm_choice_t;

/* "auto", "amx", ...; NULL out of range. */
const char *mm_gemm_choice_name(mm_gemm_choice_t choice);
/* MEGAMOE_GEMM now (unset: auto; a bad word: INVALID_ARGUMENT naming the accepted ones). Call
 * it on the thread that owns the products, once, not on workers. */
megamoe_status_t mm_gemm_choice_from_env(mm_gemm_choice_t *choice_p);

typedef enum mm_gemm_form {
    MM_GEMM_NN = 0,
    MM_GEMM_NT = 1,
    MM_GEMM_TN = 2,
} mm_gemm_form_t;

typedef struct mm_gemm_backend_ops mm_gemm_backend_ops_t;
typedef struct mm_gemm_weight mm_gemm_weight_t; /* opaque packed weight */

/* One product. Initialise with mm_gemm_args_init() and set what you need: fields added later
 * (epilogues, B row lists) default to "off" that way. */
typedef struct mm_gemm_args {
    mm_gemm_form_t form;
    int64_t M, N, K;
    const uint16_t *A; /* bf16: [M,K] (NN/NT) or [K,M] (TN), row stride lda */
    int64_t lda;
    /* (optional) row list: row r of A is a_rows[r] (r in [0,M) for NN/NT, [0,K) for TN), A is
     * then unused. The gather a dispatch layout would otherwise need a copy for. */
    const uint16_t *const *a_rows;
    const uint16_t *B; /* bf16: [K,N] (NN), [N,K] (NT), [K,N] (TN); NULL when weight is set */
    int64_t ldb;
    const mm_gemm_weight_t *weight; /* (optional, NN/NT) packed B; form must match its form */
    void *C;                        /* [M,N], row stride ldc */
    int64_t ldc;
    megamoe_dtype_t c_type; /* MEGAMOE_DTYPE_FP32 or MEGAMOE_DTYPE_BF16 */
    int accumulate;
    int64_t m0, m1, n0, n1; /* sub-block of C; ends may be MM_GEMM_END */
    int threads;            /* OpenMP threads allowed inside the call; <= 1: the caller only */
    /* NULL: the weight's backend, else MEGAMOE_GEMM read now (tests and tools only: owners of
     * products running on workers resolve it once, mm_gemm_backend_of) */
    const mm_gemm_backend_ops_t *backend;
} mm_gemm_args_t;

/* Grouped product over local experts: the group list (rows per group, zeros allowed, groups
 * consecutive from row 0) selects contiguous row ranges of the activation matrices, the
 * layout dispatch produces. Group g covers rows [start_g, start_g + rows[g]).
 *   NN/NT: C[rows_g, N] = A[rows_g, K] · B_g, B_g = weights[g] when set (non-NULL entry),
 *          else the plain matrix at B + g * b_group_stride ([K,N] NN, [N,K] NT).
 *          The sub-block rows [m0,m1) are rows of the stacked matrix [0, sum rows).
 *   TN:    C_g[M, N] = A[rows_g, M]ᵀ · B[rows_g, N], C_g at C + g * c_group_stride; an empty
 *          group gives C_g = 0 (unchanged with accumulate). The sub-block applies to every C_g.
 */
typedef struct mm_gemm_grouped_args {
    mm_gemm_form_t form;
    int num_groups;
    const int64_t *group_rows;
    int64_t M, N, K; /* NN/NT: K, N of every expert (M unused); TN: M, N (K = rows_g) */
    const uint16_t *A;
    int64_t lda;
    const uint16_t *const *a_rows; /* (optional) row list over the stacked rows */
    const uint16_t *B;
    int64_t ldb;
    int64_t b_group_stride;                 /* NN/NT plain weights: elements between experts */
    const mm_gemm_weight_t *const *weights; /* (optional, NN/NT) one per group */
    void *C;
    int64_t ldc;
    int64_t c_group_stride; /* TN: elements between the C_g */
    megamoe_dtype_t c_type;
    int accumulate;
    int64_t m0, m1, n0, n1;
    int threads;
    const mm_gemm_backend_ops_t *backend;
} mm_gemm_grouped_args_t;

void mm_gemm_args_init(mm_gemm_args_t *args);
void mm_gemm_grouped_args_init(mm_gemm_grouped_args_t *args);

/* Compute the product (validates; INVALID_ARGUMENT names the bad field). */
megamoe_status_t mm_gemm(const mm_gemm_args_t *args);
megamoe_status_t mm_gemm_grouped(const mm_gemm_grouped_args_t *args);

/* How worker `worker` of `workers` should share a product of `rows` x N (reduction K) whose
 * packed weight has column alignment n_align (1 for plain weights): its sub-block
 * [*m0,*m1) x [*n0,*n1) (possibly empty). Rows (in multiples of 16) when every worker can
 * afford to read all the weights (K*N <= 512 Ki elements) and gets >= 64 rows: the blocks stay
 * dense, which the fast oneDNN path needs; columns (at multiples of n_align) otherwise, so each
 * worker reads only its share of big weights. */
void mm_gemm_split(int64_t rows, int64_t N, int64_t K, int64_t n_align, int worker, int workers,
                   int64_t *m0, int64_t *m1, int64_t *n0, int64_t *n1);

/* ---- packed weights ---------------------------------------------------------------------- */

/* Pack B for form NN ([K,N] at src, row stride ld) or NT ([N,K] at src) with `backend` (NULL:
 * MEGAMOE_GEMM). src stays owned by the caller and must outlive the weight. version is the
 * caller's counter for the contents of src. */
megamoe_status_t mm_gemm_weight_create(const mm_gemm_backend_ops_t *backend, mm_gemm_form_t form,
                                       int64_t K, int64_t N, const uint16_t *src, int64_t ld,
                                       uint64_t version, mm_gemm_weight_t **weight_p);
/* Re-pack from src when version or src differ from the packed ones (else nothing). Must not
 * run concurrently with products that use the weight. *repacked_p (may be NULL) tells. */
megamoe_status_t mm_gemm_weight_update(mm_gemm_weight_t *weight, const uint16_t *src, int64_t ld,
                                       uint64_t version, int *repacked_p);
uint64_t mm_gemm_weight_version(const mm_gemm_weight_t *weight);
/* Column alignment of sub-blocks that use the packed copy (1 when any n0 does). */
int64_t mm_gemm_weight_n_align(const mm_gemm_weight_t *weight);
/* Bytes of the backend's packed copy (0 when it computes from the source directly). */
size_t mm_gemm_weight_packed_bytes(const mm_gemm_weight_t *weight);
const mm_gemm_backend_ops_t *mm_gemm_weight_backend(const mm_gemm_weight_t *weight);
/* Accepts NULL. */
void mm_gemm_weight_destroy(mm_gemm_weight_t *weight);

/* ---- backends ---------------------------------------------------------------------------- */

/* The backend vtable. The framework (gemm.c) validates arguments, resolves MM_GEMM_END,
 * handles empty ranges and K = 0, and turns a packed-weight call whose n0 is not aligned into
 * a plain call on the weight's source, so `gemm` only sees non-empty, valid sub-blocks. */
struct mm_gemm_backend_ops {
    const char *name; /* the MEGAMOE_GEMM word: MM_GEMM_NAME_* */
    /* (optional) OK when usable here; else UNSUPPORTED via mm_error_quiet() with the reason. */
    megamoe_status_t (*probe)(void);
    /* Compute the sub-block. Plain operands, or args->weight packed by this backend. */
    megamoe_status_t (*gemm)(const mm_gemm_args_t *args);
    /* (optional) Pack weight->src into a private copy; called on create and on a version
     * change (after weight_release). Without it the framework uses the source as plain B. */
    megamoe_status_t (*weight_pack)(mm_gemm_weight_t *weight);
    /* (optional) Free what weight_pack made. */
    void (*weight_release)(mm_gemm_weight_t *weight);
    /* (optional) A grouped product in one go; without it the framework calls gemm per group. */
    megamoe_status_t (*gemm_grouped)(const mm_gemm_grouped_args_t *args);
    /* (optional) Re-pack weight->src (new contents, maybe a new address and ld; same form, K
     * and N) into the packed copy weight_pack made, in place. Training re-packs every weight
     * after every optimizer step: without it the framework releases and packs from scratch
     * (a new buffer, whose pages the kernel zeroes and maps again). A failure leaves the
     * weight released. */
    megamoe_status_t (*weight_refresh)(mm_gemm_weight_t *weight);
};

/* Backend by MEGAMOE_GEMM word ("ref", "onednn", ...; "auto" resolves). UNSUPPORTED (message
 * names the reason and the alternative) when not built or not usable on this CPU. */
megamoe_status_t mm_gemm_backend_get(const char *name, const mm_gemm_backend_ops_t **backend_p);
/* The backend a choice gives plain operands and TN (auto: the first usable in the registry). */
megamoe_status_t mm_gemm_backend_of(mm_gemm_choice_t choice,
                                    const mm_gemm_backend_ops_t **backend_p);
/* The backend a choice packs a weight of form [K,N] with: as mm_gemm_backend_of (so amx where
 * it is usable), except that auto puts big weights (K*N >= MM_GEMM_AUTO_OWN_MIN_KN,
 * N >= MM_GEMM_AUTO_OWN_MIN_N) on the own avx512 backend when the CPU has AVX512-BF16 and no
 * AMX-BF16: there it beats oneDNN's avx512_core_bf16 kernel by 3-27% (1.08x on the MoE
 * shapes), and on smaller weights oneDNN is up to 8% faster (docs/kernels.md). Products
 * through the weight use its backend. */
#define MM_GEMM_AUTO_OWN_MIN_KN ((int64_t)2 * 1024 * 1024)
#define MM_GEMM_AUTO_OWN_MIN_N 512
megamoe_status_t mm_gemm_backend_for_weight_of(mm_gemm_choice_t choice, mm_gemm_form_t form,
                                               int64_t K, int64_t N,
                                               const mm_gemm_backend_ops_t **backend_p);
/* The same two with MEGAMOE_GEMM read now (mm_gemm_choice_from_env): the default of
 * mm_gemm() and mm_gemm_weight_create() called without a backend. */
megamoe_status_t mm_gemm_backend_default(const mm_gemm_backend_ops_t **backend_p);
megamoe_status_t mm_gemm_backend_for_weight(mm_gemm_form_t form, int64_t K, int64_t N,
                                            const mm_gemm_backend_ops_t **backend_p);
/* Backends built into this library, in registry order; NULL past the end. */
const mm_gemm_backend_ops_t *mm_gemm_backend_at(int index);

#endif /* MM_KERNELS_GEMM_H */
