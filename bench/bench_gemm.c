/* bench gemm: our grouped GEMM paths (kernels/gemm.h) against a plain oneDNN call on the same
 * data, in the same run, with GFLOP/s and % of a peak measured by the built-in probe.
 *
 * Cases: the MoE shapes 256x4096x2816 and 256x1408x4096, the seed's GMM1/GMM2 (T*K/E = 512 rows
 * per local expert x 512 x 256 and x 128 x 512, 2 local experts, T=1024 K=2 E=4 EP=2),
 * M in {16, 128, 512, 2048} at K=4096, N=2816, and the MoE shapes' weight gradients (form TN,
 * dW = Xᵀ·dY over 256 rows: moe_dw1 4096x256x2816, moe_dw2 1408x256x4096, bf16 C as the layer
 * stores them; every other case has fp32 C).
 * impl   "grouped": mm_gemm_grouped() through the backend MEGAMOE_GEMM selects ("backend": with
 *                   auto, amx where the CPU has usable AMX-BF16, else oneDNN for plain weights
 *                   and, without AMX, the own avx512 kernel for big packed weights —
 *                   mm_gemm_backend_for_weight); run with MEGAMOE_GEMM=onednn to have our
 *                   oneDNN path next to the amx rows;
 *        "amx":     the same through the own AMX backend (only where it is usable);
 *        "onednn":  one fixed-M oneDNN matmul primitive per shape, created before timing (NN).
 * weights "packed": pre-packed once (ours: mm_gemm_weight; oneDNN: format `any` + reorder);
 *        "kn": plain [K,N] row-major (TN: plain activations, the only kind).
 * threads 1: one call on the calling thread. 2: grouped/amx = two workers (the calling thread
 *        and a helper) each computing half of the product as mm_gemm_split() divides it: half
 *        of the columns (at the packed weight's alignment) for big weights, half of the rows
 *        for small ones (the seed shapes); onednn = one call with 2 OpenMP threads.
 * Every case of one (shape, threads) runs interleaved round by round (blocks of one impl's
 * calls, the two weight kinds alternating call by call inside a block), so drift from other
 * load hits all alike; the medians are reported. pct_peak is against the best BF16 unit the
 * probe measured (peak_unit) times the threads; pct_amx_peak is null without AMX.
 * Options: --quick (fewer, shorter rounds), --seconds S (time per case), --shape NAME (one
 * shape: moe_gmm1, moe_gmm2, seed_gmm1, seed_gmm2, m16, m128, m512, m2048, moe_dw1, moe_dw2),
 * --no-probe.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/cpu.h"
#include "bench_gemm.h"
#include "bench_util.h"
#include "kernels/gemm.h"
#include "kernels/gemm_onednn.h"
#include "kernels/peak.h"
#include "megamoe/megamoe.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MM_PAUSE() _mm_pause()
#else
#define MM_PAUSE() ((void)0)
#endif

typedef struct gemm_shape {
    const char *name;
    mm_gemm_form_t form; /* NN: C[M,N] = A[M,K]·B[K,N]; TN: C[M,N] = A[K,M]ᵀ·B[K,N] */
    int64_t M, K, N;
    int groups;
} gemm_shape_t;

static const gemm_shape_t mm_shapes[] = {
    {"moe_gmm1", MM_GEMM_NN, 256, 4096, 2816, 1}, {"moe_gmm2", MM_GEMM_NN, 256, 1408, 4096, 1},
    {"seed_gmm1", MM_GEMM_NN, 512, 512, 256, 2},  {"seed_gmm2", MM_GEMM_NN, 512, 128, 512, 2},
    {"m16", MM_GEMM_NN, 16, 4096, 2816, 1},       {"m128", MM_GEMM_NN, 128, 4096, 2816, 1},
    {"m512", MM_GEMM_NN, 512, 4096, 2816, 1},     {"m2048", MM_GEMM_NN, 2048, 4096, 2816, 1},
    {"moe_dw1", MM_GEMM_TN, 4096, 256, 2816, 1},  {"moe_dw2", MM_GEMM_TN, 1408, 256, 4096, 1},
};
#define MM_NSHAPES ((int)(sizeof mm_shapes / sizeof mm_shapes[0]))

/* Pairs (packed, kn) of one impl: a phase of the timing loop. */
enum { GROUPED_PACKED, GROUPED_KN, AMX_PACKED, AMX_KN, ONEDNN_PACKED, ONEDNN_KN, NIMPL };
static const char *const mm_impl_name[NIMPL] = {"grouped", "grouped", "amx", "amx", "onednn", "onednn"};
static const char *const mm_weights_name[NIMPL] = {"packed", "kn", "packed", "kn", "packed", "kn"};

/* ---- the second worker for threads = 2 --------------------------------------------------- */

typedef struct helper {
    pthread_t thread;
    atomic_int gen, done, stop, parked, want_park;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    void (*job)(void *ctx, int worker);
    void *ctx;
} helper_t;

/* Spins for jobs while a 2-worker case runs; parks (sleeps) while oneDNN's own OpenMP team
 * needs the second core. */
static void *helper_main(void *p)
{
    helper_t *h = p;
    int seen = 0;
    while (!atomic_load(&h->stop)) {
        if (atomic_load(&h->want_park)) {
            pthread_mutex_lock(&h->mu);
            atomic_store(&h->parked, 1);
            while (atomic_load(&h->want_park) && !atomic_load(&h->stop)) pthread_cond_wait(&h->cv, &h->mu);
            atomic_store(&h->parked, 0);
            pthread_mutex_unlock(&h->mu);
            continue;
        }
        int g = atomic_load_explicit(&h->gen, memory_order_acquire);
        if (g == seen) {
            MM_PAUSE();
            continue;
        }
        seen = g;
        h->job(h->ctx, 1);
        atomic_store_explicit(&h->done, g, memory_order_release);
    }
    return NULL;
}

static void helper_park(helper_t *h, int park)
{
    pthread_mutex_lock(&h->mu);
    atomic_store(&h->want_park, park);
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    while (atomic_load(&h->parked) != park) mm_sleep_ns(10000);
}

/* Run job on both workers and wait. */
static void helper_run(helper_t *h, void (*job)(void *, int), void *ctx)
{
    h->job = job;
    h->ctx = ctx;
    int g = atomic_fetch_add_explicit(&h->gen, 1, memory_order_release) + 1;
    job(ctx, 0);
    while (atomic_load_explicit(&h->done, memory_order_acquire) != g) MM_PAUSE();
}

/* The quantised rows' worker runner (bench_gemm.h): one worker, or the caller and the helper. */
typedef struct gb_runner {
    helper_t *helper;
    int threads;
} gb_runner_t;

static void gb_run(void *p, mm_gb_job_fn job, void *ctx)
{
    gb_runner_t *r = p;
    if (r->threads == 2) helper_run(r->helper, job, ctx);
    else job(ctx, 0);
}

/* ---- one shape's data -------------------------------------------------------------------- */

typedef struct gemm_case {
    const gemm_shape_t *s;
    int threads;
    uint16_t *A, *B;        /* NN: A [G*M, K], B: G plain [K,N] weights; TN: A [K, M], B [K, N] */
    void *C;                /* [G*M, N], fp32 (NN) or bf16 (TN) */
    int64_t rows[4];
    mm_gemm_weight_t *w[4]; /* ours, packed by MEGAMOE_GEMM's backend */
    mm_gemm_weight_t *wa[4]; /* the same packed by amx (NULL when it is not usable) */
    const mm_gemm_backend_ops_t *plain_be, *amx_be; /* for the kn products */
    mm_onednn_plain_t *plain[2]; /* oneDNN baseline: packed, kn */
    void *pw;               /* oneDNN packed weights, G of them */
    size_t pw_bytes;
    int64_t n_align, n_align_amx; /* packed weights' column alignment, for the 2-worker split */
    int avail[NIMPL];       /* which impls run for this shape here */
    int impl;               /* the one being run */
    helper_t *helper;
    megamoe_status_t st;
} gemm_case_t;

static megamoe_dtype_t case_c_type(const gemm_shape_t *s)
{
    return s->form == MM_GEMM_TN ? MEGAMOE_DTYPE_BF16 : MEGAMOE_DTYPE_FP32;
}

static void grouped_job(void *p, int worker)
{
    gemm_case_t *c = p;
    const gemm_shape_t *s = c->s;
    const int amx = c->impl == AMX_PACKED || c->impl == AMX_KN;
    const int packed = c->impl == GROUPED_PACKED || c->impl == AMX_PACKED;
    mm_gemm_grouped_args_t a;
    mm_gemm_grouped_args_init(&a);
    a.form = s->form;
    a.num_groups = s->groups;
    a.group_rows = c->rows;
    a.N = s->N;
    a.C = c->C, a.ldc = s->N, a.c_type = case_c_type(s);
    int64_t align = 1;
    if (s->form == MM_GEMM_TN) { /* dW = Xᵀ·dY over the group's K rows */
        a.M = s->M;
        a.A = c->A, a.lda = s->M;
        a.B = c->B, a.ldb = s->N;
        a.c_group_stride = s->M * s->N;
        a.backend = amx ? c->amx_be : c->plain_be;
    } else {
        a.K = s->K;
        a.A = c->A, a.lda = s->K;
        if (packed) {
            a.weights = (const mm_gemm_weight_t *const *)(amx ? c->wa : c->w);
            align = amx ? c->n_align_amx : c->n_align;
        } else {
            a.B = c->B, a.ldb = s->N, a.b_group_stride = s->K * s->N;
            a.backend = amx ? c->amx_be : c->plain_be;
        }
    }
    if (c->threads == 2)
        mm_gemm_split(s->form == MM_GEMM_TN ? s->M : s->M * s->groups, s->N, s->K, align, worker,
                      2, &a.m0, &a.m1, &a.n0, &a.n1);
    megamoe_status_t st = mm_gemm_grouped(&a);
    if (st != MEGAMOE_OK) c->st = st;
}

static void run_once(void *p)
{
    gemm_case_t *c = p;
    if (c->impl < ONEDNN_PACKED) {
        if (c->threads == 2) helper_run(c->helper, grouped_job, c);
        else grouped_job(c, 0);
        return;
    }
    const mm_onednn_plain_t *pl = c->plain[c->impl == ONEDNN_PACKED ? 0 : 1];
    const gemm_shape_t *s = c->s;
    for (int g = 0; g < s->groups; g++) {
        const void *W = c->impl == ONEDNN_PACKED ? (const char *)c->pw + (size_t)g * c->pw_bytes
                                                 : (const void *)(c->B + g * s->K * s->N);
        megamoe_status_t st = mm_onednn_plain_run(pl, c->A + g * s->M * s->K, W,
                                                  (float *)c->C + g * s->M * s->N);
        if (st != MEGAMOE_OK) c->st = st;
    }
}

static uint16_t *rand_bf16(size_t n, uint32_t seed)
{
    uint16_t *p = malloc(n * sizeof *p);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n && p; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = megamoe_fp32_to_bf16(((float)(x >> 8) / 16777216.0f - 0.5f) * 0.25f);
    }
    return p;
}

/* 1: ready; 0: failed; oneDNN-less builds and CPUs without AMX simply lose those rows. */
static int case_setup(gemm_case_t *c, const gemm_shape_t *s, int threads,
                      const mm_gemm_backend_ops_t *plain_be, const mm_gemm_backend_ops_t *amx_be)
{
    memset(c, 0, sizeof *c);
    c->s = s;
    c->threads = threads;
    c->plain_be = plain_be;
    c->amx_be = amx_be;
    const size_t G = (size_t)s->groups;
    const int nn = s->form == MM_GEMM_NN;
    c->A = rand_bf16(G * (size_t)(s->M * s->K), 1);
    c->B = rand_bf16(G * (size_t)(s->K * s->N), 2);
    c->C = malloc(G * (size_t)(s->M * s->N) * megamoe_dtype_size(case_c_type(s)));
    if (!c->A || !c->B || !c->C) return 0;
    c->avail[GROUPED_KN] = 1;
    c->avail[AMX_KN] = amx_be != NULL;
    for (int g = 0; g < s->groups; g++) c->rows[g] = nn ? s->M : s->K;
    if (!nn) return 1; /* TN multiplies activations: nothing to pack, no oneDNN baseline */
    c->avail[GROUPED_PACKED] = 1;
    c->avail[AMX_PACKED] = amx_be != NULL;
    for (int g = 0; g < s->groups; g++) {
        const uint16_t *Bg = c->B + g * s->K * s->N;
        if (mm_gemm_weight_create(NULL, MM_GEMM_NN, s->K, s->N, Bg, s->N, 1, &c->w[g]) != MEGAMOE_OK)
            return 0;
        if (amx_be && mm_gemm_weight_create(amx_be, MM_GEMM_NN, s->K, s->N, Bg, s->N, 1, &c->wa[g]) != MEGAMOE_OK)
            return 0;
    }
    c->n_align = mm_gemm_weight_n_align(c->w[0]);
    c->n_align_amx = c->wa[0] ? mm_gemm_weight_n_align(c->wa[0]) : 1;
    for (int k = 0; k < 2; k++)
        if (mm_onednn_plain_create(s->M, s->K, s->N, k == 0, threads, &c->plain[k]) != MEGAMOE_OK)
            return 1; /* no oneDNN in this build */
    c->pw_bytes = mm_onednn_plain_weight_bytes(c->plain[0]);
    c->pw = malloc(G * c->pw_bytes);
    if (!c->pw) return 0;
    for (int g = 0; g < s->groups; g++)
        if (mm_onednn_plain_pack(c->plain[0], c->B + g * s->K * s->N, (char *)c->pw + (size_t)g * c->pw_bytes) != MEGAMOE_OK)
            return 0;
    c->avail[ONEDNN_PACKED] = c->avail[ONEDNN_KN] = 1;
    return 1;
}

static void case_free(gemm_case_t *c)
{
    for (int g = 0; g < 4; g++) mm_gemm_weight_destroy(c->w[g]), mm_gemm_weight_destroy(c->wa[g]);
    for (int k = 0; k < 2; k++) mm_onednn_plain_destroy(c->plain[k]);
    free(c->A), free(c->B), free(c->C), free(c->pw);
}

/* ---- main -------------------------------------------------------------------------------- */

static int mm_bench_gemm_main(int argc, char **argv)
{
    if (mm_bench_flag(argc, argv, "--help")) {
        printf("megamoe bench gemm [--quick] [--seconds S] [--shape NAME] [--no-probe]\n"
               "  --quick       short rounds (~15 s in all)\n"
               "  --seconds S   timed seconds per implementation and case (default 0.4)\n"
               "  --shape NAME  one of moe_gmm1 moe_gmm2 seed_gmm1 seed_gmm2 m16 m128 m512 m2048\n"
               "                moe_dw1 moe_dw2\n"
               "                (the quantised rows: moe_gmm1 moe_gmm2 dec_gmm1 dec_gmm2)\n"
               "  --no-quant    skip the quantised (w8a8, w4a8) and decode rows\n"
               "  --weight-sets N  at most N rotating weight sets per quantised case (default:\n"
               "                enough to exceed twice the last-level cache; a smaller N lets\n"
               "                the weights sit in cache: for smoke tests only)\n"
               "  --no-probe    skip the peak and bandwidth probes (pct_* become null)\n"
               "MEGAMOE_GEMM picks the backend of the 'grouped' rows (default auto); the 'amx'\n"
               "rows use the own AMX backend where it is usable (MEGAMOE_GEMM=onednn puts our\n"
               "oneDNN path next to them).\n");
        return 0;
    }
    int quick = mm_bench_flag(argc, argv, "--quick");
    double seconds = atof(mm_bench_opt(argc, argv, "--seconds", quick ? "0.05" : "0.4"));
    int min_rounds = quick ? 2 : 5;
    const char *only = mm_bench_opt(argc, argv, "--shape", NULL);
    double block = quick ? 0.03 : 0.1; /* seconds of one phase block */
    megamoe_log_set_level(MEGAMOE_LOG_WARN);

    mm_peak_t peak;
    double read_gbps[3] = {0, 0, 0};
    const int no_quant = mm_bench_flag(argc, argv, "--no-quant");
    memset(&peak, 0, sizeof peak);
    peak.unit = "none";
    if (!mm_bench_flag(argc, argv, "--no-probe")) {
        mm_bench_progress(0, 1, "peak probe");
        mm_kernels_peak_probe(quick ? 0.05 : 0.3, &peak);
        fprintf(stderr, "peak per core: %s %.0f GFLOP/s (avx512_bf16 %.0f, fp32_fma %.0f, amx %.0f); "
                        "int8 %s %.0f GOP/s (avx512_vnni %.0f, amx_int8 %.0f)\n",
                peak.unit, peak.gflops, peak.avx512_bf16_gflops, peak.fp32_fma_gflops,
                peak.amx_gflops, peak.int8_unit, peak.int8_gops, peak.avx512_vnni_gops,
                peak.amx_int8_gops);
        for (int t = 1; t <= 2 && t <= mm_cpu_count(); t++) {
            if (mm_kernels_read_bw_probe(t, quick ? 0.1 : 0.5, &read_gbps[t]) != MEGAMOE_OK)
                read_gbps[t] = 0;
            fprintf(stderr, "read bandwidth, %d thread(s): %.1f GB/s\n", t, read_gbps[t]);
        }
    }
    if (peak.int8_unit == NULL) peak.int8_unit = "none";
    const mm_gemm_backend_ops_t *be = NULL, *amx_be = NULL;
    if (mm_gemm_backend_default(&be) != MEGAMOE_OK) {
        fprintf(stderr, "bench gemm: %s\n", megamoe_last_error());
        return 1;
    }
    megamoe_log_set_level(MEGAMOE_LOG_OFF); /* no AMX here: the amx rows are left out */
    if (mm_gemm_backend_get(MM_GEMM_NAME_AMX, &amx_be) != MEGAMOE_OK) {
        fprintf(stderr, "bench gemm: no amx rows: %s\n", megamoe_last_error());
        amx_be = NULL;
    }
    megamoe_log_set_level(MEGAMOE_LOG_WARN);

    mm_bench_begin("gemm");
    {
        char probes[512];
        char b1[32], b2[32];
        snprintf(b1, sizeof b1, read_gbps[1] > 0 ? "%.2f" : "null", read_gbps[1]);
        snprintf(b2, sizeof b2, read_gbps[2] > 0 ? "%.2f" : "null", read_gbps[2]);
        snprintf(probes, sizeof probes,
                 "{\"peak_bf16_gflops\": %.1f, \"peak_unit\": \"%s\", \"peak_int8_gops\": %.1f, "
                 "\"int8_unit\": \"%s\", \"peak_fp32_fma_gflops\": %.1f, \"read_gbps\": {\"1\": %s, "
                 "\"2\": %s}, \"llc_bytes\": %ld}",
                 peak.gflops, peak.unit, peak.int8_gops, peak.int8_unit, peak.fp32_fma_gflops, b1,
                 b2, (long)mm_cpu_llc_bytes());
        mm_bench_top("probes", probes);
    }
    mm_gemm_bench_env_t qenv;
    memset(&qenv, 0, sizeof qenv);
    qenv.peak = &peak;
    memcpy(qenv.read_gbps, read_gbps, sizeof read_gbps);
    qenv.seconds = seconds;
    qenv.min_rounds = min_rounds;
    qenv.quick = quick;
    qenv.only = only;
    qenv.max_sets = atoi(mm_bench_opt(argc, argv, "--weight-sets", "0"));
    double gf[MM_NSHAPES][2][NIMPL], gfb[MM_NSHAPES][2][NIMPL]; /* median, best call; NAN: none */
    const char *packed_be[MM_NSHAPES] = {0};                    /* backend of our packed weights */
    int step = 0, total = (only ? 1 : MM_NSHAPES) * 2;
    helper_t helper;
    for (int t = 1; t <= 2; t++) {
        memset(&helper, 0, sizeof helper);
        pthread_mutex_init(&helper.mu, NULL);
        pthread_cond_init(&helper.cv, NULL);
        if (t == 2 && pthread_create(&helper.thread, NULL, helper_main, &helper) != 0) return 1;
        for (int si = 0; si < MM_NSHAPES; si++) {
            const gemm_shape_t *s = &mm_shapes[si];
            for (int i = 0; i < NIMPL; i++) gf[si][t - 1][i] = gfb[si][t - 1][i] = NAN;
            if (only && strcmp(only, s->name) != 0) continue;
            char label[96];
            snprintf(label, sizeof label, "%s %s %lldx%lldx%lld x%d, %d thread(s)", s->name,
                     s->form == MM_GEMM_TN ? "TN" : "NN", (long long)s->M, (long long)s->K,
                     (long long)s->N, s->groups, t);
            mm_bench_progress(++step, total, label);
            gemm_case_t c;
            if (!case_setup(&c, s, t, be, amx_be)) {
                fprintf(stderr, "bench gemm: setup failed: %s\n", megamoe_last_error());
                case_free(&c);
                return 1;
            }
            if (c.w[0]) packed_be[si] = mm_gemm_weight_backend(c.w[0])->name;
            c.helper = &helper;
            enum { CAP = 4096 };
            double *times[NIMPL] = {0};
            int n[NIMPL] = {0};
            for (int i = 0; i < NIMPL; i++)
                if (c.avail[i]) times[i] = malloc(CAP * sizeof(double));
            for (int i = 0; i < NIMPL; i++) { /* warm-up: primitives, caches */
                if (!c.avail[i]) continue;
                if (t == 2) helper_park(&helper, i >= ONEDNN_PACKED);
                c.impl = i;
                run_once(&c);
            }
            /* Phases (grouped, amx, oneDNN) take turns in blocks; inside a block the two
             * weight kinds alternate call by call. At a switch to ours with 2 threads, oneDNN's
             * OpenMP worker is given time to stop spinning (libgomp spins ~ms before
             * sleeping). */
            int navail = 0;
            for (int i = 0; i < NIMPL; i++) navail += c.avail[i];
            double spent = 0;
            for (;;) {
                int enough = spent >= seconds * navail, full = 0;
                for (int i = 0; i < NIMPL; i++) {
                    if (c.avail[i] && n[i] < min_rounds) enough = 0;
                    if (c.avail[i] && n[i] >= CAP) full = 1;
                }
                if (enough || full) break;
                for (int phase = 0; phase < NIMPL / 2; phase++) {
                    const int i0 = 2 * phase, i1 = 2 * phase + 1;
                    if (!c.avail[i0] && !c.avail[i1]) continue;
                    if (t == 2) {
                        helper_park(&helper, i0 >= ONEDNN_PACKED);
                        if (i0 < ONEDNN_PACKED && c.avail[ONEDNN_PACKED]) mm_sleep_ns(30000000);
                    }
                    double block_spent = 0;
                    int reps = 0;
                    while ((block_spent < block || reps < min_rounds) && n[i0] < CAP && n[i1] < CAP) {
                        for (int i = i0; i <= i1; i++) {
                            if (!c.avail[i]) continue;
                            c.impl = i;
                            uint64_t t0 = mm_now_ns();
                            run_once(&c);
                            double dt = (double)(mm_now_ns() - t0) * 1e-9;
                            times[i][n[i]++] = dt;
                            block_spent += dt;
                        }
                        reps++;
                    }
                    spent += block_spent;
                }
            }
            if (c.st != MEGAMOE_OK) {
                fprintf(stderr, "bench gemm: %s\n", megamoe_last_error());
                return 1;
            }
            double flop = 2.0 * (double)s->groups * (double)s->M * (double)s->K * (double)s->N;
            for (int i = 0; i < NIMPL; i++) {
                if (!c.avail[i]) continue;
                double best = times[i][0];
                for (int k = 1; k < n[i]; k++) best = times[i][k] < best ? times[i][k] : best;
                double med = mm_bench_median_of(times[i], n[i]);
                double g = flop / med * 1e-9;
                gf[si][t - 1][i] = g;
                gfb[si][t - 1][i] = flop / best * 1e-9;
                const char *bname = i == GROUPED_PACKED ? mm_gemm_weight_backend(c.w[0])->name
                                    : i == GROUPED_KN   ? be->name
                                    : i < ONEDNN_PACKED ? MM_GEMM_NAME_AMX
                                                        : "onednn";
                mm_bench_row();
                mm_bench_str("impl", mm_impl_name[i]);
                mm_bench_str("weights", mm_weights_name[i]);
                mm_bench_str("backend", bname);
                mm_bench_str("quant", "bf16");
                mm_bench_str("form", s->form == MM_GEMM_TN ? "TN" : "NN");
                mm_bench_str("c", megamoe_dtype_name(case_c_type(s)));
                mm_bench_int("M", s->M);
                mm_bench_int("K", s->K);
                mm_bench_int("N", s->N);
                mm_bench_int("groups", s->groups);
                mm_bench_int("threads", t);
                mm_bench_num("gflops", g);
                mm_bench_num("pct_amx_peak", peak.amx_gflops > 0 ? 100.0 * g / (peak.amx_gflops * t) : NAN);
                mm_bench_num("pct_peak", peak.gflops > 0 ? 100.0 * g / (peak.gflops * t) : NAN);
                mm_bench_num("pct_int8_peak", NAN);
                {   /* bytes a call moves at least: A, B, C (bf16 operands) */
                    const double csz = (double)megamoe_dtype_size(case_c_type(s));
                    const double bytes = (double)s->groups *
                                         (2.0 * (double)(s->M * s->K) + 2.0 * (double)(s->K * s->N) +
                                          csz * (double)(s->M * s->N));
                    const double roof = mm_gemm_bench_roofline(peak.gflops, t, read_gbps[t], flop, bytes);
                    mm_bench_num("pct_roofline", roof > 0 ? 100.0 * g / roof : NAN);
                }
                mm_bench_str("peak_unit", peak.unit);
                mm_bench_num("peak_gflops", peak.gflops > 0 ? peak.gflops : NAN); /* per core */
                mm_bench_num("gflops_best", flop / best * 1e-9);
                mm_bench_num("ms", med * 1e3);
                mm_bench_int("calls", n[i]);
            }
            for (int i = 0; i < NIMPL; i++) free(times[i]);
            case_free(&c);
        }
        if (!no_quant) {
            if (t == 2) helper_park(&helper, 0);
            gb_runner_t runner = {&helper, t};
            qenv.threads = t;
            qenv.run = gb_run;
            qenv.run_ctx = &runner;
            if (mm_bench_gemm_quant(&qenv) != 0) return 1;
        }
        if (t == 2) {
            helper_park(&helper, 0);
            atomic_store(&helper.stop, 1);
            pthread_join(helper.thread, NULL);
        }
        pthread_mutex_destroy(&helper.mu);
        pthread_cond_destroy(&helper.cv);
    }
    mm_bench_end();

    /* The targets, from the same run. Issue 4: grouped >= 0.95 x oneDNN (same weights kind),
     * packed >= 1.2 x plain [K,N] weights (our packed path vs oneDNN with [K,N] weights).
     * Issue 8: amx packed >= 1.5 x pre-packed oneDNN (the primitive, and our grouped path when
     * it runs oneDNN) and >= 45% of the AMX peak single-threaded on the MoE forward shapes. */
    double load[3] = {0, 0, 0};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
        fclose(f);
    }
    fprintf(stderr, "\n== gemm targets (grouped: plain operands on backend %s, packed weights on "
                    "the one named per shape; load average now %.2f: other load makes the "
                    "2-thread medians unreliable, the best-call ratios less so) ==\n"
                    "%-10s %-7s %-3s %-8s %-8s %-8s | %-8s %-8s %-8s %-8s %-9s %-9s %-7s\n",
            be->name, load[0], "shape", "packed", "thr", "grp/dnn", "grp/dnn", "pk/kn",
            "amx/dnn", "amx/grp", "amx/dnn", "amx/grp", "amx pk/kn", "amx pk/", "amx %");
    fprintf(stderr, "%-10s %-7s %-3s %-8s %-8s %-8s | %-8s %-8s %-8s %-8s %-9s %-9s %-7s\n", "", "",
            "", "packed", "kn", "", "packed", "packed", "kn", "kn", "", "dnn kn", "peak");
    for (int si = 0; si < MM_NSHAPES; si++)
        for (int t = 0; t < 2; t++) {
            double *g = gf[si][t];
            if (isnan(g[GROUPED_KN])) continue;
            const double amx = isnan(g[AMX_PACKED]) ? g[AMX_KN] : g[AMX_PACKED]; /* TN: kn */
            fprintf(stderr,
                    "%-10s %-7s %-3d %-8.3f %-8.3f %-8.3f | %-8.3f %-8.3f %-8.3f %-8.3f %-9.3f %-9.3f "
                    "%-7.1f\n",
                    mm_shapes[si].name, packed_be[si] ? packed_be[si] : "-", t + 1,
                    g[GROUPED_PACKED] / g[ONEDNN_PACKED], g[GROUPED_KN] / g[ONEDNN_KN],
                    g[GROUPED_PACKED] / g[ONEDNN_KN], g[AMX_PACKED] / g[ONEDNN_PACKED],
                    g[AMX_PACKED] / g[GROUPED_PACKED], g[AMX_KN] / g[ONEDNN_KN],
                    g[AMX_KN] / g[GROUPED_KN], g[AMX_PACKED] / g[AMX_KN],
                    g[AMX_PACKED] / g[ONEDNN_KN],
                    peak.amx_gflops > 0 ? 100.0 * amx / (peak.amx_gflops * (t + 1)) : NAN);
        }
    fprintf(stderr, "(amx %% peak: the packed product, or for TN the plain one)\n");
    if (!no_quant) mm_bench_gemm_quant_targets(&qenv);
    return 0;
}

const mm_bench_def_t mm_bench_gemm_def = {
    "gemm", "BF16 grouped GEMM vs plain oneDNN, GFLOP/s and % of the probed peak (--quick)",
    mm_bench_gemm_main};
