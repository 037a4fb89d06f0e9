/* The GEMM framework: argument checks, sub-block resolution, the backend registry and
 * selection, grouped products, packed-weight objects, per-thread scratch and the epilogue.
 * Backends (gemm_ref.c, gemm_onednn.c, gemm_avx512.c) only compute valid, non-empty blocks. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>

#include "base/alloc.h"
#include "base/cpu.h"
#include "base/env.h"
#include "base/error.h"
#include "gemm_avx512.h"
#include "gemm_impl.h"
#include "simd.h"

/* ---- registry ---------------------------------------------------------------------------- */

/* In preference order for auto: the own AMX kernel where it can run (1.8-2.2x oneDNN's packed
 * path on the MoE shapes, 5-7x on the weight gradients, and split-invariant, which oneDNN's
 * AMX kernels are not: docs/kernels.md), then oneDNN, the own AVX-512 kernel, plain C — except
 * on AVX-512 without AVX512-BF16, where the own kernel (its FMA form) comes before oneDNN
 * (mm_gemm_backend_of). */
static const mm_gemm_backend_ops_t *const mm_gemm_backends[] = {
#if MM_X86
    &mm_gemm_amx_ops,
#endif
#ifdef MM_HAVE_ONEDNN
    &mm_gemm_onednn_ops,
#endif
#if MM_X86
    &mm_gemm_avx512_ops,
#endif
    &mm_gemm_ref_ops,
};
#define MM_GEMM_BACKEND_COUNT ((int)(sizeof mm_gemm_backends / sizeof mm_gemm_backends[0]))

const mm_gemm_backend_ops_t *mm_gemm_backend_at(int index)
{
    return index >= 0 && index < MM_GEMM_BACKEND_COUNT ? mm_gemm_backends[index] : NULL;
}

static megamoe_status_t mm_gemm_probe(const mm_gemm_backend_ops_t *b)
{
    return b->probe ? b->probe() : MEGAMOE_OK;
}

const char *mm_gemm_choice_name(mm_gemm_choice_t choice)
{
    static const char *const names[MM_GEMM_CHOICE_COUNT] = {
#define MM_GEMM_CHOICE_NAME_(id) MM_GEMM_NAME_##id,
        MM_GEMM_CHOICES(MM_GEMM_CHOICE_NAME_)
#undef MM_GEMM_CHOICE_NAME_
    };
    return (int)choice >= 0 && choice < MM_GEMM_CHOICE_COUNT ? names[choice] : NULL;
}

/* UNSUPPORTED for amx where it cannot run, with the reason (the probe's text). */
static megamoe_status_t mm_gemm_amx_unsupported(const char *why)
{
    return mm_error(MEGAMOE_UNSUPPORTED,
                    "MEGAMOE_GEMM=" MM_GEMM_NAME_AMX ": %s; use MEGAMOE_GEMM=" MM_GEMM_NAME_ONEDNN
                    " (oneDNN uses AMX itself where present) or " MM_GEMM_NAME_AUTO,
                    why);
}

megamoe_status_t mm_gemm_backend_of(mm_gemm_choice_t choice,
                                    const mm_gemm_backend_ops_t **backend_p)
{
    const char *name = mm_gemm_choice_name(choice);
    if (name == NULL || backend_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_gemm_backend_of: choice %d or NULL backend_p",
                        (int)choice);
    if (choice == MM_GEMM_CHOICE_AUTO) {
#if MM_X86
        /* AVX-512 without AVX512-BF16 (nor AMX): oneDNN's kernels there sum in an order that
         * depends on a call's row and column range (tests/kernels/test_gemm.c), so O1 would
         * not give O0's bits; the own kernel's FMA form does, on every form. */
        if (!mm_cpu_has_amx_bf16() && mm_avx512_kernel_is_fma() &&
            mm_gemm_probe(&mm_gemm_avx512_ops) == MEGAMOE_OK) {
            *backend_p = &mm_gemm_avx512_ops;
            return MEGAMOE_OK;
        }
#endif
        /* Registry order is preference order; ref always probes OK. */
        for (int i = 0; i < MM_GEMM_BACKEND_COUNT; i++)
            if (mm_gemm_probe(mm_gemm_backends[i]) == MEGAMOE_OK) {
                *backend_p = mm_gemm_backends[i];
                return MEGAMOE_OK;
            }
        return mm_error(MEGAMOE_INTERNAL, "no usable GEMM backend");
    }
    for (int i = 0; i < MM_GEMM_BACKEND_COUNT; i++) {
        if (strcmp(name, mm_gemm_backends[i]->name) != 0) continue;
        megamoe_status_t st = mm_gemm_probe(mm_gemm_backends[i]);
        if (st != MEGAMOE_OK && choice == MM_GEMM_CHOICE_AMX) {
            char why[256]; /* the probe's reason; the last-error text is rewritten below */
            snprintf(why, sizeof why, "%s", megamoe_last_error());
            return mm_gemm_amx_unsupported(why);
        }
        if (st != MEGAMOE_OK)
            return mm_error(st, "MEGAMOE_GEMM=%s is not usable here: %s; use " MM_GEMM_NAME_AUTO
                            " or " MM_GEMM_NAME_REF, name, megamoe_last_error());
        *backend_p = mm_gemm_backends[i];
        return MEGAMOE_OK;
    }
    if (choice == MM_GEMM_CHOICE_AMX)
        return mm_gemm_amx_unsupported("this build has no x86 kernels");
    if (choice == MM_GEMM_CHOICE_ONEDNN)
        return mm_error(MEGAMOE_UNSUPPORTED,
                        "MEGAMOE_GEMM=" MM_GEMM_NAME_ONEDNN ": this build has no oneDNN backend; "
                        "install libdnnl-dev (make deps) and configure with "
                        "-DMEGAMOE_WITH_ONEDNN=ON");
    return mm_error(MEGAMOE_UNSUPPORTED, "MEGAMOE_GEMM=%s: no such backend in this build", name);
}

megamoe_status_t mm_gemm_backend_get(const char *name, const mm_gemm_backend_ops_t **backend_p)
{
    if (name == NULL || backend_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_gemm_backend_get: NULL argument");
    for (int c = 0; c < MM_GEMM_CHOICE_COUNT; c++)
        if (strcasecmp(name, mm_gemm_choice_name((mm_gemm_choice_t)c)) == 0)
            return mm_gemm_backend_of((mm_gemm_choice_t)c, backend_p);
    return mm_error(MEGAMOE_UNSUPPORTED, "MEGAMOE_GEMM=%s: no such backend in this build", name);
}

megamoe_status_t mm_gemm_choice_from_env(mm_gemm_choice_t *choice_p)
{
    /* the env table lists MM_GEMM_CHOICES in the same order (tests/kernels/test_gemm.c) */
    int index = 0;
    megamoe_status_t st = mm_env_enum(MM_ENV_GEMM, &index);
    if (st == MEGAMOE_NOT_FOUND) index = MM_GEMM_CHOICE_AUTO;
    else if (st != MEGAMOE_OK) return st;
    if (index < 0 || index >= MM_GEMM_CHOICE_COUNT)
        return mm_error(MEGAMOE_INTERNAL, "MEGAMOE_GEMM choice %d out of range", index);
    *choice_p = (mm_gemm_choice_t)index;
    return MEGAMOE_OK;
}

megamoe_status_t mm_gemm_backend_default(const mm_gemm_backend_ops_t **backend_p)
{
    mm_gemm_choice_t choice = MM_GEMM_CHOICE_AUTO;
    MM_CHECK(mm_gemm_choice_from_env(&choice));
    return mm_gemm_backend_of(choice, backend_p);
}

megamoe_status_t mm_gemm_backend_for_weight_of(mm_gemm_choice_t choice, mm_gemm_form_t form,
                                               int64_t K, int64_t N,
                                               const mm_gemm_backend_ops_t **backend_p)
{
    if (backend_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_gemm_backend_for_weight: NULL backend_p");
#if MM_X86
    /* auto: big NN/NT weights on the own AVX512-BF16 kernel where it beats oneDNN's
     * avx512_core_bf16 brgemm (no AMX; docs/kernels.md has the numbers behind the bound). */
    if (choice == MM_GEMM_CHOICE_AUTO && (form == MM_GEMM_NN || form == MM_GEMM_NT) && K > 0 &&
        N >= MM_GEMM_AUTO_OWN_MIN_N && K * N >= MM_GEMM_AUTO_OWN_MIN_KN &&
        !mm_cpu_has_amx_bf16() && mm_gemm_avx512_ops.probe() == MEGAMOE_OK) {
        *backend_p = &mm_gemm_avx512_ops;
        return MEGAMOE_OK;
    }
#else
    (void)form, (void)K, (void)N;
#endif
    return mm_gemm_backend_of(choice, backend_p);
}

megamoe_status_t mm_gemm_backend_for_weight(mm_gemm_form_t form, int64_t K, int64_t N,
                                            const mm_gemm_backend_ops_t **backend_p)
{
    mm_gemm_choice_t choice = MM_GEMM_CHOICE_AUTO;
    MM_CHECK(mm_gemm_choice_from_env(&choice));
    return mm_gemm_backend_for_weight_of(choice, form, K, N, backend_p);
}

/* ---- per-thread scratch ------------------------------------------------------------------ */

typedef struct mm_gemm_scratch_set {
    void *ptr[MM_GEMM_SCRATCH_SLOTS];
    size_t size[MM_GEMM_SCRATCH_SLOTS];
} mm_gemm_scratch_set_t;

static pthread_key_t mm_scratch_key;
static pthread_once_t mm_scratch_once = PTHREAD_ONCE_INIT;
static _Thread_local mm_gemm_scratch_set_t *mm_scratch_tls;

static void mm_scratch_free(void *p)
{
    mm_gemm_scratch_set_t *set = p;
    for (int i = 0; i < MM_GEMM_SCRATCH_SLOTS; i++) mm_aligned_free(set->ptr[i]);
    free(set);
}

static void mm_scratch_key_init(void) { pthread_key_create(&mm_scratch_key, mm_scratch_free); }

void *mm_gemm_scratch(int slot, size_t bytes)
{
    if (slot < 0 || slot >= MM_GEMM_SCRATCH_SLOTS) return NULL;
    if (mm_scratch_tls == NULL) {
        pthread_once(&mm_scratch_once, mm_scratch_key_init);
        mm_scratch_tls = calloc(1, sizeof *mm_scratch_tls);
        if (mm_scratch_tls == NULL) {
            mm_error(MEGAMOE_OUT_OF_MEMORY, "GEMM scratch: out of memory");
            return NULL;
        }
        pthread_setspecific(mm_scratch_key, mm_scratch_tls);
    }
    mm_gemm_scratch_set_t *set = mm_scratch_tls;
    if (set->size[slot] < bytes || set->ptr[slot] == NULL) {
        /* grow to the next power of two (at least 64 KiB): in O1 any worker may run any tile,
         * so each thread meets the group's sizes in a different order; power-of-two steps
         * make the steady state come after a few calls instead of at the rare largest tile */
        size_t want = (size_t)64 << 10;
        while (want < bytes) want *= 2;
        void *p = NULL;
        if (mm_aligned_alloc(want, MM_CACHE_LINE, "GEMM scratch", &p) != MEGAMOE_OK) return NULL;
        mm_aligned_free(set->ptr[slot]);
        set->ptr[slot] = p;
        set->size[slot] = want;
    }
    return set->ptr[slot];
}

/* ---- epilogue ---------------------------------------------------------------------------- */

static inline uint16_t mm_f32_bf16(float f) { return megamoe_fp32_to_bf16(f); }

static void mm_epilogue_row_scalar(const float *acc, int64_t n, void *c, megamoe_dtype_t t,
                                   int accumulate)
{
    if (t == MEGAMOE_DTYPE_FP32) {
        float *o = c;
        if (accumulate)
            for (int64_t j = 0; j < n; j++) o[j] = o[j] + acc[j];
        else
            memcpy(o, acc, (size_t)n * sizeof(float));
    } else {
        uint16_t *o = c;
        for (int64_t j = 0; j < n; j++)
            o[j] = mm_f32_bf16(accumulate ? mm_bf16_f32(o[j]) + acc[j] : acc[j]);
    }
}

#if MM_X86
MM_TARGET_AVX512 static void mm_epilogue_row_avx512(const float *acc, int64_t n, void *c,
                                                   megamoe_dtype_t t, int accumulate)
{
    int64_t j = 0;
    if (t == MEGAMOE_DTYPE_FP32) {
        float *o = c;
        for (; j + 16 <= n; j += 16) {
            __m512 v = _mm512_loadu_ps(acc + j);
            if (accumulate) v = _mm512_add_ps(_mm512_loadu_ps(o + j), v);
            _mm512_storeu_ps(o + j, v);
        }
    } else {
        uint16_t *o = c;
        for (; j + 16 <= n; j += 16) {
            __m512 v = _mm512_loadu_ps(acc + j);
            if (accumulate) {
                __m512i old = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(o + j)));
                v = _mm512_add_ps(_mm512_castsi512_ps(_mm512_slli_epi32(old, 16)), v);
            }
            _mm256_storeu_si256((__m256i *)(o + j), mm_cvt_bf16x16(v));
        }
    }
    if (j < n)
        mm_epilogue_row_scalar(acc + j, n - j,
                               (char *)c + (size_t)j * megamoe_dtype_size(t), t, accumulate);
}
#endif

void mm_gemm_epilogue(const float *acc, int64_t ld_acc, int64_t rows, int64_t cols, void *C,
                      int64_t ldc, megamoe_dtype_t c_type, int accumulate)
{
#if MM_X86
    int vec = mm_kernels_use_avx512();
#endif
    for (int64_t r = 0; r < rows; r++) {
        void *c = mm_gemm_c_at(C, ldc, c_type, r, 0);
#if MM_X86
        if (vec) {
            mm_epilogue_row_avx512(acc + r * ld_acc, cols, c, c_type, accumulate);
            continue;
        }
#endif
        mm_epilogue_row_scalar(acc + r * ld_acc, cols, c, c_type, accumulate);
    }
}

void mm_gemm_zero_block(void *C, int64_t ldc, megamoe_dtype_t c_type, int64_t rows, int64_t cols,
                        int accumulate)
{
    if (accumulate) return;
    size_t es = megamoe_dtype_size(c_type);
    for (int64_t r = 0; r < rows; r++) memset(mm_gemm_c_at(C, ldc, c_type, r, 0), 0, (size_t)cols * es);
}

/* ---- single product ---------------------------------------------------------------------- */

void mm_gemm_args_init(mm_gemm_args_t *args)
{
    memset(args, 0, sizeof *args);
    args->c_type = MEGAMOE_DTYPE_FP32;
    args->m1 = MM_GEMM_END;
    args->n1 = MM_GEMM_END;
    args->threads = 1;
}

void mm_gemm_grouped_args_init(mm_gemm_grouped_args_t *args)
{
    memset(args, 0, sizeof *args);
    args->c_type = MEGAMOE_DTYPE_FP32;
    args->m1 = MM_GEMM_END;
    args->n1 = MM_GEMM_END;
    args->threads = 1;
}

static const char *const mm_form_names[] = {"NN", "NT", "TN"};

static megamoe_status_t mm_gemm_resolve_range(const char *what, int64_t *lo, int64_t *hi,
                                              int64_t dim)
{
    if (*hi == MM_GEMM_END) *hi = dim;
    if (*lo < 0 || *lo > *hi || *hi > dim)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "GEMM sub-block %s range [%lld, %lld) is not inside [0, %lld)", what,
                        (long long)*lo, (long long)*hi, (long long)dim);
    return MEGAMOE_OK;
}

megamoe_status_t mm_gemm(const mm_gemm_args_t *in)
{
    if (in == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_gemm: NULL args");
    mm_gemm_args_t a = *in;
    if ((int)a.form < 0 || a.form > MM_GEMM_TN)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_gemm: form %d is not NN, NT or TN", (int)a.form);
    const char *fn = mm_form_names[a.form];
    if (a.M < 0 || a.N < 0 || a.K < 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_gemm %s: negative size M=%lld N=%lld K=%lld",
                        fn, (long long)a.M, (long long)a.N, (long long)a.K);
    if (a.c_type != MEGAMOE_DTYPE_FP32 && a.c_type != MEGAMOE_DTYPE_BF16)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_gemm %s: C type %s; use fp32 or bf16", fn,
                        megamoe_dtype_name(a.c_type));
    MM_CHECK(mm_gemm_resolve_range("row", &a.m0, &a.m1, a.M));
    MM_CHECK(mm_gemm_resolve_range("column", &a.n0, &a.n1, a.N));
    if (a.threads < 1) a.threads = 1;
    if (a.m0 == a.m1 || a.n0 == a.n1) return MEGAMOE_OK;
    if (a.C == NULL || a.ldc < a.N)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_gemm %s: C is NULL or ldc %lld < N %lld", fn,
                        (long long)a.ldc, (long long)a.N);
    if (a.K == 0) {
        mm_gemm_zero_block(mm_gemm_c_at(a.C, a.ldc, a.c_type, a.m0, a.n0), a.ldc, a.c_type,
                           a.m1 - a.m0, a.n1 - a.n0, a.accumulate);
        return MEGAMOE_OK;
    }
    int64_t a_cols = a.form == MM_GEMM_TN ? a.M : a.K;
    if (a.a_rows == NULL && (a.A == NULL || a.lda < a_cols))
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_gemm %s: A is NULL or lda %lld < %lld", fn,
                        (long long)a.lda, (long long)a_cols);
    if (a.weight != NULL) {
        const mm_gemm_weight_t *w = a.weight;
        if (a.form == MM_GEMM_TN || w->form != a.form || w->K != a.K || w->N != a.N)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "mm_gemm %s: packed weight is %s K=%lld N=%lld, call is K=%lld N=%lld",
                            fn, mm_form_names[w->form], (long long)w->K, (long long)w->N,
                            (long long)a.K, (long long)a.N);
        if (a.backend != NULL && a.backend != w->backend)
            return mm_error(MEGAMOE_INVALID_ARGUMENT,
                            "mm_gemm %s: weight was packed by backend '%s', call asks for '%s'", fn,
                            w->backend->name, a.backend->name);
        a.backend = w->backend;
        if (!w->packed || a.n0 % w->n_align != 0) { /* compute from the source, unpacked */
            a.B = w->src;
            a.ldb = w->ld;
            a.weight = NULL;
        }
    }
    if (a.weight == NULL) {
        int64_t b_cols = a.form == MM_GEMM_NT ? a.K : a.N;
        if (a.B == NULL || a.ldb < b_cols)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_gemm %s: B is NULL or ldb %lld < %lld",
                            fn, (long long)a.ldb, (long long)b_cols);
    }
    if (a.backend == NULL) MM_CHECK(mm_gemm_backend_default(&a.backend));
    return a.backend->gemm(&a);
}

/* ---- grouped product --------------------------------------------------------------------- */

megamoe_status_t mm_gemm_grouped(const mm_gemm_grouped_args_t *in)
{
    if (in == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_gemm_grouped: NULL args");
    mm_gemm_grouped_args_t g = *in;
    if ((int)g.form < 0 || g.form > MM_GEMM_TN)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_gemm_grouped: form %d is not NN, NT or TN",
                        (int)g.form);
    if (g.num_groups < 0 || (g.num_groups > 0 && g.group_rows == NULL))
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "mm_gemm_grouped: %d groups with a NULL group list", g.num_groups);
    int64_t total = 0;
    for (int i = 0; i < g.num_groups; i++) {
        if (g.group_rows[i] < 0)
            return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_gemm_grouped: group %d has %lld rows",
                            i, (long long)g.group_rows[i]);
        total += g.group_rows[i];
    }
    int tn = g.form == MM_GEMM_TN;
    MM_CHECK(mm_gemm_resolve_range("row", &g.m0, &g.m1, tn ? g.M : total));
    MM_CHECK(mm_gemm_resolve_range("column", &g.n0, &g.n1, g.N));
    if (g.backend == NULL && g.weights != NULL) {
        for (int i = 0; i < g.num_groups && g.backend == NULL; i++)
            if (g.weights[i]) g.backend = g.weights[i]->backend;
    }
    if (g.backend == NULL) MM_CHECK(mm_gemm_backend_default(&g.backend));
    if (g.backend->gemm_grouped) return g.backend->gemm_grouped(&g);

    size_t es = megamoe_dtype_size(g.c_type);
    int64_t start = 0;
    for (int i = 0; i < g.num_groups; start += g.group_rows[i], i++) {
        int64_t rows = g.group_rows[i];
        mm_gemm_args_t a;
        mm_gemm_args_init(&a);
        a.form = g.form;
        a.N = g.N;
        a.lda = g.lda;
        a.ldb = g.ldb;
        a.ldc = g.ldc;
        a.c_type = g.c_type;
        a.accumulate = g.accumulate;
        a.n0 = g.n0;
        a.n1 = g.n1;
        a.threads = g.threads;
        a.backend = g.backend;
        if (tn) {
            a.M = g.M;
            a.K = rows;
            a.m0 = g.m0;
            a.m1 = g.m1;
            a.A = g.A ? g.A + start * g.lda : NULL;
            a.a_rows = g.a_rows ? g.a_rows + start : NULL;
            a.B = g.B ? g.B + start * g.ldb : NULL;
            a.C = g.C ? (char *)g.C + (size_t)(i * g.c_group_stride) * es : NULL;
        } else {
            int64_t lo = g.m0 > start ? g.m0 : start;
            int64_t hi = g.m1 < start + rows ? g.m1 : start + rows;
            if (lo >= hi) continue;
            a.M = rows;
            a.K = g.K;
            a.m0 = lo - start;
            a.m1 = hi - start;
            a.A = g.A ? g.A + start * g.lda : NULL;
            a.a_rows = g.a_rows ? g.a_rows + start : NULL;
            a.weight = g.weights ? g.weights[i] : NULL;
            a.B = a.weight ? NULL : (g.B ? g.B + i * g.b_group_stride : NULL);
            a.C = g.C ? (char *)g.C + (size_t)(start * g.ldc) * es : NULL;
        }
        megamoe_status_t st = mm_gemm(&a);
        if (st != MEGAMOE_OK) return st;
    }
    return MEGAMOE_OK;
}

/* ---- splitting a product between workers ------------------------------------------------ */

static void mm_split_range(int64_t n, int64_t align, int w, int workers, int64_t *lo, int64_t *hi)
{
    int64_t units = (n + align - 1) / align; /* whole aligned units, the last may be short */
    int64_t a = units * w / workers, b = units * (w + 1) / workers;
    *lo = a * align < n ? a * align : n;
    *hi = b * align < n ? b * align : n;
}

void mm_gemm_split(int64_t rows, int64_t N, int64_t K, int64_t n_align, int worker, int workers,
                   int64_t *m0, int64_t *m1, int64_t *n0, int64_t *n1)
{
    if (workers < 1) workers = 1;
    if (n_align < 1) n_align = 1;
    *m0 = 0, *m1 = rows, *n0 = 0, *n1 = N;
    if (K * N <= (int64_t)512 * 1024 && rows >= 64 * (int64_t)workers)
        mm_split_range(rows, 16, worker, workers, m0, m1);
    else
        mm_split_range(N, n_align, worker, workers, n0, n1);
}

/* ---- packed weights ---------------------------------------------------------------------- */

megamoe_status_t mm_gemm_packed_alloc(size_t bytes, const char *what, void **p, size_t *bytes_p)
{
    return mm_gemm_packed_alloc_from(bytes, MM_GEMM_HUGE_FROM_BF16, what, p, bytes_p);
}

megamoe_status_t mm_gemm_packed_alloc_from(size_t bytes, size_t huge_from, const char *what,
                                           void **p, size_t *bytes_p)
{
    const size_t huge = (size_t)2 << 20;
    *p = NULL;
    if (bytes >= huge_from) { /* whole huge pages, and ask for them */
        bytes = (bytes + huge - 1) / huge * huge;
        /* A mapping of its own, not the heap: memory the allocator hands back again (a heap
         * the caller's framework filled and freed) keeps the 4 KiB pages it was first touched
         * with, hint or not — decode weights there streamed at ~60 % of their rate on huge
         * pages (2026-12-06). Fresh pages, hinted before the packing first touches them. */
        char *m = mmap(NULL, bytes + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
        if (m == MAP_FAILED)
            return mm_error(MEGAMOE_OUT_OF_MEMORY, "%s: cannot map %zu bytes (%s)", what, bytes,
                            strerror(errno));
        char *a = (char *)(((uintptr_t)m + huge - 1) & ~(uintptr_t)(huge - 1));
        if (a > m) munmap(m, (size_t)(a - m));
        munmap(a + bytes, huge - (size_t)(a - m)); /* the tail: never empty (a - m < huge) */
#ifdef MADV_HUGEPAGE
        (void)madvise(a, bytes, MADV_HUGEPAGE); /* a hint: without it, 4 KiB pages */
#endif
        *p = a;
    } else {
        MM_CHECK(mm_aligned_alloc(bytes, MM_CACHE_LINE, what, p));
    }
    *bytes_p = bytes;
    return MEGAMOE_OK;
}

void mm_gemm_packed_free_from(void *p, size_t bytes, size_t huge_from)
{
    if (p == NULL) return;
    if (bytes >= huge_from) munmap(p, bytes); /* mapped whole by mm_gemm_packed_alloc_from */
    else mm_aligned_free(p);
}

void mm_gemm_packed_free(void *p, size_t bytes)
{
    mm_gemm_packed_free_from(p, bytes, MM_GEMM_HUGE_FROM_BF16);
}

static megamoe_status_t mm_weight_pack(mm_gemm_weight_t *w)
{
    w->packed = 0;
    w->data = NULL;
    w->bytes = 0;
    w->n_align = 1;
    w->impl = NULL;
    if (w->backend->weight_pack == NULL) return MEGAMOE_OK;
    return w->backend->weight_pack(w);
}

static void mm_weight_release(mm_gemm_weight_t *w)
{
    if (w->backend->weight_release) w->backend->weight_release(w);
    w->packed = 0;
    w->data = NULL;
    w->impl = NULL;
}

static megamoe_status_t mm_weight_check_src(mm_gemm_form_t form, int64_t K, int64_t N,
                                            const uint16_t *src, int64_t ld)
{
    int64_t cols = form == MM_GEMM_NT ? K : N;
    if (src == NULL || ld < cols)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "packed weight: source is NULL or ld %lld < %lld", (long long)ld,
                        (long long)cols);
    return MEGAMOE_OK;
}

megamoe_status_t mm_gemm_weight_create(const mm_gemm_backend_ops_t *backend, mm_gemm_form_t form,
                                       int64_t K, int64_t N, const uint16_t *src, int64_t ld,
                                       uint64_t version, mm_gemm_weight_t **weight_p)
{
    if (weight_p == NULL)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_gemm_weight_create: NULL weight_p");
    if (form != MM_GEMM_NN && form != MM_GEMM_NT)
        return mm_error(MEGAMOE_INVALID_ARGUMENT,
                        "packed weights are for forms NN and NT (TN multiplies activations)");
    if (K <= 0 || N <= 0)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "packed weight: K=%lld N=%lld must be > 0",
                        (long long)K, (long long)N);
    MM_CHECK(mm_weight_check_src(form, K, N, src, ld));
    if (backend == NULL) MM_CHECK(mm_gemm_backend_for_weight(form, K, N, &backend));
    mm_gemm_weight_t *w = calloc(1, sizeof *w);
    if (w == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "packed weight: out of memory");
    w->backend = backend;
    w->form = form;
    w->K = K;
    w->N = N;
    w->src = src;
    w->ld = ld;
    w->version = version;
    megamoe_status_t st = mm_weight_pack(w);
    if (st != MEGAMOE_OK) {
        mm_weight_release(w);
        free(w);
        return st;
    }
    *weight_p = w;
    return MEGAMOE_OK;
}

megamoe_status_t mm_gemm_weight_update(mm_gemm_weight_t *w, const uint16_t *src, int64_t ld,
                                       uint64_t version, int *repacked_p)
{
    if (repacked_p) *repacked_p = 0;
    if (w == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "mm_gemm_weight_update: NULL weight");
    MM_CHECK(mm_weight_check_src(w->form, w->K, w->N, src, ld));
    if (version == w->version && src == w->src && ld == w->ld) return MEGAMOE_OK;
    const int in_place = w->packed && w->backend->weight_refresh != NULL;
    if (!in_place) mm_weight_release(w);
    w->src = src;
    w->ld = ld;
    w->version = version;
    megamoe_status_t st = in_place ? w->backend->weight_refresh(w) : mm_weight_pack(w);
    if (st != MEGAMOE_OK) {
        mm_weight_release(w); /* usable unpacked: products fall back to the source */
        return st;
    }
    if (repacked_p) *repacked_p = 1;
    return MEGAMOE_OK;
}

uint64_t mm_gemm_weight_version(const mm_gemm_weight_t *w) { return w ? w->version : 0; }

int64_t mm_gemm_weight_n_align(const mm_gemm_weight_t *w)
{
    return w && w->packed ? w->n_align : 1;
}

size_t mm_gemm_weight_packed_bytes(const mm_gemm_weight_t *w)
{
    return w && w->packed ? w->bytes : 0;
}

const mm_gemm_backend_ops_t *mm_gemm_weight_backend(const mm_gemm_weight_t *w)
{
    return w ? w->backend : NULL;
}

void mm_gemm_weight_destroy(mm_gemm_weight_t *w)
{
    if (w == NULL) return;
    mm_weight_release(w);
    free(w);
}
