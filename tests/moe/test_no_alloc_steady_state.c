/* Memory is planned, not allocated per call (docs/architecture.md "Buffer ownership"): after a
 * warm-up, repeated calls of the same shapes do no heap allocation. 2 ranks.
 *
 * The executable interposes malloc, calloc, realloc, aligned_alloc, posix_memalign, memalign,
 * valloc and pvalloc (they forward to glibc's __libc_* entry points) and counts every call made
 * on ANY thread of the process while counting is on: the calling threads, the executor's worker
 * threads and the SHMEM runtime's threads alike. Two counts: all callers, and "ours" = callers
 * inside this executable, i.e. libmegamoe (linked statically here; the test's own code
 * allocates nothing while counting). Not built under the sanitizers, which own malloc
 * themselves (CMake skips the target there).
 *
 * What must be zero:
 *  - DispatchV2 + CombineV2 (plain and quantised): every caller;
 *  - forward + backward (training) and inference forwards, O0 and O1, with the native GEMM
 *    backend (avx512 where the CPU has it, else ref): every caller;
 *  - the same with the default backend (oneDNN on CPUs without AMX): our callers only, since
 *    oneDNN allocates inside its own primitive execution (counted and printed, not asserted). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "megamoe/ops.h"
#include "moe_check.h"

/* ---- the counting allocator ---------------------------------------------------------- */

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

#define MM_CALLERS 32
/* (not inlined into this file's callers: the return address must be the real caller) */
#define MM_NOINLINE __attribute__((noinline))
static atomic_int mm_counting;
static atomic_long mm_allocs, mm_ours;
static void *mm_callers[MM_CALLERS];
extern char __executable_start[], etext[]; /* this executable's code (GNU ld) */

static void mm_note(void *caller)
{
    if (!atomic_load_explicit(&mm_counting, memory_order_relaxed)) return;
    long n = atomic_fetch_add(&mm_allocs, 1);
    if ((char *)caller >= __executable_start && (char *)caller < etext) {
        long k = atomic_fetch_add(&mm_ours, 1);
        if (k < MM_CALLERS) mm_callers[k] = caller;
    } else if (n < MM_CALLERS / 2 && atomic_load(&mm_ours) == 0)
        mm_callers[n] = caller; /* foreign callers, shown while none of ours came */
}

MM_NOINLINE void *malloc(size_t n)
{
    mm_note(__builtin_return_address(0));
    return __libc_malloc(n);
}
MM_NOINLINE void *calloc(size_t n, size_t s)
{
    mm_note(__builtin_return_address(0));
    return __libc_calloc(n, s);
}
MM_NOINLINE void *realloc(void *p, size_t n)
{
    mm_note(__builtin_return_address(0));
    return __libc_realloc(p, n);
}
void free(void *p) { __libc_free(p); }
MM_NOINLINE void *memalign(size_t a, size_t n)
{
    mm_note(__builtin_return_address(0));
    return __libc_memalign(a, n);
}
MM_NOINLINE void *aligned_alloc(size_t a, size_t n)
{
    mm_note(__builtin_return_address(0));
    return __libc_memalign(a, n);
}
MM_NOINLINE int posix_memalign(void **p, size_t a, size_t n)
{
    mm_note(__builtin_return_address(0));
    if (a < sizeof(void *) || (a & (a - 1)) != 0) return 22; /* EINVAL */
    void *q = __libc_memalign(a, n);
    if (q == NULL && n > 0) return 12; /* ENOMEM */
    *p = q;
    return 0;
}
MM_NOINLINE void *valloc(size_t n)
{
    mm_note(__builtin_return_address(0));
    return __libc_memalign(4096, n);
}
MM_NOINLINE void *pvalloc(size_t n)
{
    mm_note(__builtin_return_address(0));
    return __libc_memalign(4096, (n + 4095) & ~(size_t)4095);
}

static void mm_count_start(void)
{
    memset(mm_callers, 0, sizeof mm_callers);
    atomic_store(&mm_allocs, 0);
    atomic_store(&mm_ours, 0);
    atomic_store(&mm_counting, 1);
}

/* Stops counting; prints the counts and where the first (our) allocations came from. Returns
 * the count of every caller (all != 0) or of ours. */
static long mm_count_stop(const char *what, int all)
{
    atomic_store(&mm_counting, 0);
    long n = atomic_load(&mm_allocs), k = atomic_load(&mm_ours);
    printf("rank %d %s: %ld heap allocations in the steady state, %ld of them by libmegamoe\n",
           mm_test_rank(), what, n, k);
    for (long i = 0; i < MM_CALLERS && mm_callers[i] != NULL; i++) {
        Dl_info d;
        if (dladdr(mm_callers[i], &d) && d.dli_fname)
            printf("  from %s (%s+0x%lx)\n", d.dli_sname ? d.dli_sname : "?", d.dli_fname,
                   (unsigned long)((char *)mm_callers[i] - (char *)d.dli_fbase));
        else
            printf("  from %p\n", mm_callers[i]);
    }
    return all ? n : k;
}

/* The counter sees allocations of every kind, from this thread and from another one (so a
 * zero below means none happened, not that nothing was counted). */
static void *mm_alloc_on_thread(void *arg)
{
    (void)arg;
    void *volatile p = malloc(24);
    free(p);
    return NULL;
}

MM_TEST(counter_sees_every_allocation)
{
    pthread_t th;
    void *volatile keep[6]; /* volatile: the compiler may not drop the pairs */
    mm_count_start();
    keep[0] = malloc(16);
    keep[1] = calloc(2, 8);
    keep[2] = realloc(NULL, 32);
    keep[3] = aligned_alloc(64, 64);
    void *e = NULL;
    int rc = posix_memalign(&e, 64, 128);
    keep[4] = e;
    keep[5] = memalign(64, 32);
    int ok = pthread_create(&th, NULL, mm_alloc_on_thread, NULL) == 0;
    if (ok) pthread_join(th, NULL);
    atomic_store(&mm_counting, 0);
    long n = atomic_load(&mm_allocs); /* pthread_create may allocate a little itself */
    long ours = atomic_load(&mm_ours);
    for (int i = 0; i < 6; i++) free(keep[i]);
    printf("counter check: %ld allocations, %ld by this executable (%p..%p, first %p)\n", n, ours,
           (void *)__executable_start, (void *)etext, mm_callers[0]);
    ASSERT_TRUE(ok);
    ASSERT_EQ_INT(rc, 0);
    ASSERT_TRUE(n >= 7);
    ASSERT_TRUE(ours >= 7); /* this file's calls are callers inside the executable */
}

/* ---- the layer ---------------------------------------------------------------------- */

/* WARM: per-thread scratch grows when a worker first meets a size (in O1 any worker may run
 * any tile, in an order that depends on timing), so the warm-up is a few calls, not one. */
enum { T_ = 128, H_ = 128, I_ = 64, E_ = 8, K_ = 2, WARM = 6, REPS = 4 };

/* gemm: the MEGAMOE_GEMM setting for the layer (NULL: the default); all: count every caller. */
static void layer_case(const char *schedule, const char *gemm, int all)
{
    if (gemm) setenv("MEGAMOE_GEMM", gemm, 1); /* read when the layer's group is made */
    else unsetenv("MEGAMOE_GEMM");
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    ASSERT_TRUE(comm != NULL);
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, T_, H_, I_, E_, K_, MM_ROUTE_SKEW, 7), 0);
    megamoe_experts_params_t prm = megamoe_experts_params_default();
    prm.local_num_tokens = T_;
    prm.hidden_size = H_;
    prm.intermediate_size = I_;
    prm.num_experts = E_;
    prm.top_k = K_;
    prm.schedule = schedule;
    prm.workers = 2; /* worker threads are counted too */
    megamoe_experts_t *x = NULL;
    megamoe_status_t cst = megamoe_experts_create(comm, &prm, &x);
    unsetenv("MEGAMOE_GEMM");
    ASSERT_OK(cst);
    mm_input_buf_t ib;
    ASSERT_EQ_INT(mm_input_make(&P, me, NULL, &ib), 0);
    const int64_t L = E_ / ep;
    uint16_t *out = malloc((size_t)T_ * H_ * 2), *gh = malloc((size_t)T_ * H_ * 2);
    float *gp = malloc((size_t)T_ * K_ * 4);
    uint16_t *g1 = malloc((size_t)L * H_ * 2 * I_ * 2), *g2 = malloc((size_t)L * I_ * H_ * 2);
    ASSERT_TRUE(out && gh && gp && g1 && g2);
    megamoe_experts_weights_t w = mm_local_weights(&P, me, 1);
    megamoe_experts_grads_t g = {gh, gp, g1, g2, MEGAMOE_DTYPE_BF16};
    const uint16_t *gout = P.grad_out + (size_t)me * T_ * H_;
    int ok = 1;
    for (int i = 0; i < WARM + REPS && ok; i++) {
        if (i == WARM) mm_count_start();
        megamoe_experts_saved_t *sv = NULL;
        ok = megamoe_experts_forward(x, &w, &ib.in, out, &sv) == MEGAMOE_OK &&
             megamoe_experts_backward(x, sv, &w, gout, &g) == MEGAMOE_OK;
        megamoe_experts_saved_destroy(sv);
        ok = ok && megamoe_experts_forward(x, &w, &ib.in, out, NULL) == MEGAMOE_OK;
    }
    char what[64];
    snprintf(what, sizeof what, "%s forward+backward (GEMM %s)", schedule, gemm ? gemm : "default");
    long n = mm_count_stop(what, all);
    if (!ok) printf("call failed: %s\n", megamoe_last_error());
    /* the counted calls still give the right answer */
    mm_ref_result_t ref;
    ASSERT_EQ_INT(mm_ref_compute(&P, 0.0f, &ref), 0);
    mm_layer_result_t res;
    ASSERT_EQ_INT(mm_layer_result_from(&P, out, gh, gp, 0, g1, g2, &res), 0);
    int close = mm_compare(what, &P, me, &res, &ref);
    mm_layer_result_free(&res);
    mm_ref_free(&ref);
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    mm_input_free(&ib);
    free(out);
    free(gh);
    free(gp);
    free(g1);
    free(g2);
    mm_moe_problem_free(&P);
    ASSERT_TRUE(ok);
    ASSERT_TRUE(close);
    ASSERT_EQ_INT(n, 0);
}

/* Per-call token counts (max_local_num_tokens = T_cap): calls alternate between two count
 * vectors (rank 0 full / the others few, then rank 0 empty / the others a non-multiple of 128),
 * so the routing plan, the O1 tile tier, the saved-state buffers and the scratch change from
 * call to call; after a warm-up that saw both, no call allocates. */
enum { TCAP_ = 300 };

static void layer_dyn_case(const char *schedule, const char *gemm, int all)
{
    if (gemm) setenv("MEGAMOE_GEMM", gemm, 1);
    else unsetenv("MEGAMOE_GEMM");
    const int ep = mm_test_world(), me = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    ASSERT_TRUE(comm != NULL);
    mm_moe_problem_t P;
    ASSERT_EQ_INT(mm_moe_problem_create(&P, ep, TCAP_, H_, I_, E_, K_, MM_ROUTE_SKEW, 8), 0);
    megamoe_experts_params_t prm = mm_params_shape(0, H_, I_, E_, K_);
    prm.max_local_num_tokens = TCAP_;
    prm.schedule = schedule;
    prm.workers = 2;
    megamoe_experts_t *x = NULL;
    megamoe_status_t cst = megamoe_experts_create(comm, &prm, &x);
    unsetenv("MEGAMOE_GEMM");
    ASSERT_OK(cst);
    int64_t counts[2][64];
    for (int r = 0; r < ep; r++) {
        counts[0][r] = r == 0 ? TCAP_ : 3 + r;
        counts[1][r] = r == 0 ? 0 : 129 + 64 * r;
    }
    mm_input_buf_t ib;
    ASSERT_EQ_INT(mm_input_make(&P, me, NULL, &ib), 0);
    mm_run_t run;
    ASSERT_EQ_INT(mm_run_alloc(&run, &P), 0);
    megamoe_experts_weights_t w = mm_local_weights(&P, me, 1);
    megamoe_experts_grads_t g = {run.gh, run.gp, run.g1, run.g2, MEGAMOE_DTYPE_BF16};
    const uint16_t *gout = P.grad_out + (size_t)me * TCAP_ * H_;
    int ok = 1, last = 0;
    for (int i = 0; i < WARM + REPS && ok; i++) {
        if (i == WARM) mm_count_start();
        last = i % 2;
        ib.in.num_tokens = counts[last][me];
        megamoe_experts_saved_t *sv = NULL;
        ok = megamoe_experts_forward(x, &w, &ib.in, run.out, &sv) == MEGAMOE_OK &&
             megamoe_experts_backward(x, sv, &w, gout, &g) == MEGAMOE_OK;
        megamoe_experts_saved_destroy(sv);
        ib.in.num_tokens = counts[1 - last][me]; /* an inference call with the other counts */
        ok = ok && megamoe_experts_forward(x, &w, &ib.in, run.out,
                                           NULL) == MEGAMOE_OK;
        if (ok) { /* the training call's output again, for the check below */
            ib.in.num_tokens = counts[last][me];
            ok = megamoe_experts_forward(x, &w, &ib.in, run.out, NULL) == MEGAMOE_OK;
        }
    }
    char what[80];
    snprintf(what, sizeof what, "%s alternating per-call counts (GEMM %s)", schedule,
             gemm ? gemm : "default");
    long n = mm_count_stop(what, all);
    if (!ok) printf("call failed: %s\n", megamoe_last_error());
    mm_ref_result_t ref;
    ASSERT_EQ_INT(mm_ref_compute_rows(&P, counts[last], &ref), 0);
    int close = mm_compare_rows(what, &P, me, counts[last], &run, &ref);
    mm_ref_free(&ref);
    ASSERT_OK(megamoe_experts_close(x));
    megamoe_experts_destroy(x);
    mm_input_free(&ib);
    mm_run_free(&run);
    mm_moe_problem_free(&P);
    ASSERT_TRUE(ok);
    ASSERT_TRUE(close);
    ASSERT_EQ_INT(n, 0);
}

static const char *native_gemm(void) { return mm_cpu_has_avx512() ? "avx512" : "ref"; }

MM_TEST(forward_backward_o0_native_gemm) { layer_case("O0", native_gemm(), 1); }
MM_TEST(forward_backward_o1_native_gemm) { layer_case("O1", native_gemm(), 1); }
MM_TEST(forward_backward_o0_default_gemm) { layer_case("O0", NULL, 0); }
MM_TEST(forward_backward_o1_default_gemm) { layer_case("O1", NULL, 0); }
MM_TEST(alternating_counts_o0_native_gemm) { layer_dyn_case("O0", native_gemm(), 1); }
MM_TEST(alternating_counts_o1_native_gemm) { layer_dyn_case("O1", native_gemm(), 1); }
MM_TEST(alternating_counts_o1_default_gemm) { layer_dyn_case("O1", NULL, 0); }

/* ---- DispatchV2 + CombineV2 ---------------------------------------------------------- */

static megamoe_tensor_t tens(void *data, megamoe_dtype_t t, int ndim, int64_t d0, int64_t d1)
{
    megamoe_tensor_t v = megamoe_tensor_none();
    v.data = data;
    v.dtype = t;
    v.ndim = ndim;
    v.shape[0] = d0;
    v.shape[1] = d1;
    return v;
}

static void ops_case(int64_t quant_mode)
{
    enum { BS = 32, H = 128, K = 2, E = 8 };
    const int ep = mm_test_world(), r = mm_test_rank();
    megamoe_comm_t *comm = mm_test_comm();
    ASSERT_TRUE(comm != NULL);
    uint16_t x[BS * H], out[BS * H];
    int32_t ids[BS * K];
    float ws[BS * K];
    for (int i = 0; i < BS * H; i++) x[i] = megamoe_fp32_to_bf16((float)((i * 7 + r) % 13) * 0.25f - 1.5f);
    for (int t = 0; t < BS; t++)
        for (int k = 0; k < K; k++) {
            ids[t * K + k] = (t * 3 + k * 5 + r) % E;
            if (k == 1 && ids[t * K + 1] == ids[t * K]) ids[t * K + 1] = (ids[t * K] + 1) % E;
            ws[t * K + k] = 0.5f + 0.25f * (float)k;
        }
    megamoe_dispatch_v2_args_t a = megamoe_dispatch_v2_args_default();
    a.x = tens(x, MEGAMOE_DTYPE_BF16, 2, BS, H);
    a.expert_ids = tens(ids, MEGAMOE_DTYPE_INT32, 2, BS, K);
    a.group_ep = comm;
    a.ep_world_size = ep;
    a.ep_rank_id = r;
    a.moe_expert_num = E;
    a.quant_mode = quant_mode;
    a.expert_token_nums_type = 1;
    ASSERT_OK(megamoe_dispatch_v2_infer(&a));
    const int64_t rows = a.expand_x.shape[0];
    void *expand_x = calloc((size_t)(rows * H), 2);
    void *dyn = calloc((size_t)(a.dynamic_scales.shape[0] * (a.dynamic_scales.ndim == 2 ? a.dynamic_scales.shape[1] : 1) + 1), 4);
    int32_t *assist = calloc((size_t)a.assist_info_for_combine.shape[0], 4);
    int64_t *tok = calloc((size_t)a.expert_token_nums.shape[0] + 1, 8);
    int32_t *counts = calloc((size_t)a.ep_recv_counts.shape[0] + 1, 4);
    float *escales = calloc((size_t)a.expand_scales.shape[0] + 1, 4);
    uint16_t *rows_bf16 = malloc((size_t)(rows * H) * 2);
    ASSERT_TRUE(expand_x && dyn && assist && tok && counts && escales && rows_bf16);
    for (int64_t i = 0; i < rows * H; i++) rows_bf16[i] = megamoe_fp32_to_bf16((float)(i % 9) * 0.125f);
    a.expand_x.data = expand_x;
    a.dynamic_scales.data = dyn;
    a.assist_info_for_combine.data = assist;
    a.expert_token_nums.data = tok;
    a.ep_recv_counts.data = counts;
    a.expand_scales.data = escales;
    megamoe_combine_v2_args_t c = megamoe_combine_v2_args_default();
    int ok = 1;
    for (int i = 0; i < WARM + REPS && ok; i++) {
        if (i == WARM) mm_count_start();
        ok = megamoe_dispatch_v2(&a) == MEGAMOE_OK;
        if (!ok) break;
        if (i == 0) { /* the plain case combines expand_x itself, the quantised one bf16 rows
                         of the same shape with an int8 transport (comm_quant_mode 2) */
            c.expand_x = a.expand_x;
            if (quant_mode != 0) {
                c.expand_x.dtype = MEGAMOE_DTYPE_BF16;
                c.expand_x.data = rows_bf16;
            }
            c.expert_ids = a.expert_ids;
            c.assist_info_for_combine = a.assist_info_for_combine;
            c.ep_send_counts = a.ep_recv_counts;
            c.expert_scales = tens(ws, MEGAMOE_DTYPE_FP32, 2, BS, K);
            c.group_ep = comm;
            c.ep_world_size = ep;
            c.ep_rank_id = r;
            c.moe_expert_num = E;
            c.comm_quant_mode = quant_mode == 0 ? 0 : 2;
            ok = megamoe_combine_v2_infer(&c) == MEGAMOE_OK;
            c.x.data = out;
        }
        ok = ok && megamoe_combine_v2(&c) == MEGAMOE_OK;
    }
    char what[64];
    snprintf(what, sizeof what, "DispatchV2 quant_mode %d + CombineV2 comm_quant_mode %d", (int)quant_mode, (int)c.comm_quant_mode);
    long n = mm_count_stop(what, 1);
    if (!ok) printf("call failed: %s\n", megamoe_last_error());
    free(expand_x);
    free(dyn);
    free(assist);
    free(tok);
    free(counts);
    free(escales);
    free(rows_bf16);
    ASSERT_TRUE(ok);
    ASSERT_EQ_INT(n, 0);
}

MM_TEST(dispatch_combine_plain) { ops_case(0); }
MM_TEST(dispatch_per_token_quant) { ops_case(2); }
