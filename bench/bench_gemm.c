/* bench gemm: our grouped GEMM path (kernels/gemm.h) against a plain oneDNN call on the same
 * data, in the same run, with GFLOP/s and % of a peak measured by the built-in probe.
 *
 * Cases: the MoE shapes 256x4096x2816 and 256x1408x4096, the seed's GMM1/GMM2 (T*K/E = 512 rows
 * per local expert x 512 x 256 and x 128 x 512, 2 local experts, T=1024 K=2 E=4 EP=2) and
 * M in {16, 128, 512, 2048} at K=4096, N=2816.
 * impl   "grouped": mm_gemm_grouped() through the backend MEGAMOE_GEMM selects ("backend": with
 *                   auto, oneDNN for plain weights and, on CPUs without AMX, the own avx512
 *                   kernel for big packed weights — mm_gemm_backend_for_weight);
 *        "onednn":  one fixed-M oneDNN matmul primitive per shape, created before timing.
 * weights "packed": pre-packed once (ours: mm_gemm_weight; oneDNN: format `any` + reorder);
 *        "kn": plain [K,N] row-major.
 * threads 1: one call on the calling thread. 2: grouped = two workers (the calling thread and
 *        a helper) each computing half of the product as mm_gemm_split() divides it: half of
 *        the columns (at the packed weight's alignment) for big weights, half of the rows for
 *        small ones (the seed shapes); onednn = one call with 2 OpenMP threads.
 * Every case of one (shape, threads) runs interleaved round by round, so drift from other load
 * hits all four alike; the medians are reported. pct_peak is against the best BF16 unit the
 * probe measured (peak_unit) times the threads; pct_amx_peak is null without AMX.
 * Options: --quick (fewer, shorter rounds), --seconds S (time per case), --shape NAME (one
 * shape: moe_gmm1, moe_gmm2, seed_gmm1, seed_gmm2, m16, m128, m512, m2048), --no-probe.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
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
    int64_t M, K, N;
    int groups;
} gemm_shape_t;

static const gemm_shape_t mm_shapes[] = {
    {"moe_gmm1", 256, 4096, 2816, 1}, {"moe_gmm2", 256, 1408, 4096, 1},
    {"seed_gmm1", 512, 512, 256, 2},  {"seed_gmm2", 512, 128, 512, 2},
    {"m16", 16, 4096, 2816, 1},       {"m128", 128, 4096, 2816, 1},
    {"m512", 512, 4096, 2816, 1},     {"m2048", 2048, 4096, 2816, 1},
};
#define MM_NSHAPES ((int)(sizeof mm_shapes / sizeof mm_shapes[0]))

enum { GROUPED_PACKED, GROUPED_KN, ONEDNN_PACKED, ONEDNN_KN, NIMPL };
static const char *const mm_impl_name[NIMPL] = {"grouped", "grouped", "onednn", "onednn"};
static const char *const mm_weights_name[NIMPL] = {"packed", "kn", "packed", "kn"};

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

/* ---- one shape's data -------------------------------------------------------------------- */

typedef struct gemm_case {
    const gemm_shape_t *s;
    int threads;
    uint16_t *A, *B;        /* A [G*M, K]; B: G plain [K,N] weights */
    float *C;               /* [G*M, N] */
    int64_t rows[4];
    mm_gemm_weight_t *w[4]; /* ours, packed */
    mm_onednn_plain_t *plain[2]; /* oneDNN baseline: packed, kn */
    void *pw;               /* oneDNN packed weights, G of them */
    size_t pw_bytes;
    int64_t n_align;        /* packed weights' column alignment, for the 2-worker split */
    int impl;               /* the one being run */
    helper_t *helper;
    megamoe_status_t st;
} gemm_case_t;

static void grouped_job(void *p, int worker)
{
    gemm_case_t *c = p;
    mm_gemm_grouped_args_t a;
    mm_gemm_grouped_args_init(&a);
    a.form = MM_GEMM_NN;
    a.num_groups = c->s->groups;
    a.group_rows = c->rows;
    a.K = c->s->K, a.N = c->s->N;
    a.A = c->A, a.lda = c->s->K;
    if (c->impl == GROUPED_PACKED) a.weights = (const mm_gemm_weight_t *const *)c->w;
    else a.B = c->B, a.ldb = c->s->N, a.b_group_stride = c->s->K * c->s->N;
    a.C = c->C, a.ldc = c->s->N;
    if (c->threads == 2)
        mm_gemm_split(c->s->M * c->s->groups, c->s->N, c->s->K, c->n_align, worker, 2, &a.m0, &a.m1,
                      &a.n0, &a.n1);
    megamoe_status_t st = mm_gemm_grouped(&a);
    if (st != MEGAMOE_OK) c->st = st;
}

static void run_once(void *p)
{
    gemm_case_t *c = p;
    if (c->impl == GROUPED_PACKED || c->impl == GROUPED_KN) {
        if (c->threads == 2) helper_run(c->helper, grouped_job, c);
        else grouped_job(c, 0);
        return;
    }
    const mm_onednn_plain_t *pl = c->plain[c->impl == ONEDNN_PACKED ? 0 : 1];
    const gemm_shape_t *s = c->s;
    for (int g = 0; g < s->groups; g++) {
        const void *W = c->impl == ONEDNN_PACKED ? (const char *)c->pw + (size_t)g * c->pw_bytes
                                                 : (const void *)(c->B + g * s->K * s->N);
        megamoe_status_t st = mm_onednn_plain_run(pl, c->A + g * s->M * s->K, W, c->C + g * s->M * s->N);
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

static int case_setup(gemm_case_t *c, const gemm_shape_t *s, int threads)
{
    memset(c, 0, sizeof *c);
    c->s = s;
    c->threads = threads;
    size_t G = (size_t)s->groups;
    c->A = rand_bf16(G * (size_t)(s->M * s->K), 1);
    c->B = rand_bf16(G * (size_t)(s->K * s->N), 2);
    c->C = malloc(G * (size_t)(s->M * s->N) * sizeof(float));
    if (!c->A || !c->B || !c->C) return 0;
    for (int g = 0; g < s->groups; g++) {
        c->rows[g] = s->M;
        if (mm_gemm_weight_create(NULL, MM_GEMM_NN, s->K, s->N, c->B + g * s->K * s->N, s->N, 1, &c->w[g]) != MEGAMOE_OK)
            return 0;
    }
    c->n_align = mm_gemm_weight_n_align(c->w[0]);
    for (int k = 0; k < 2; k++)
        if (mm_onednn_plain_create(s->M, s->K, s->N, k == 0, threads, &c->plain[k]) != MEGAMOE_OK) return -1;
    c->pw_bytes = mm_onednn_plain_weight_bytes(c->plain[0]);
    c->pw = malloc(G * c->pw_bytes);
    if (!c->pw) return 0;
    for (int g = 0; g < s->groups; g++)
        if (mm_onednn_plain_pack(c->plain[0], c->B + g * s->K * s->N, (char *)c->pw + (size_t)g * c->pw_bytes) != MEGAMOE_OK)
            return 0;
    return 1;
}

static void case_free(gemm_case_t *c)
{
    for (int g = 0; g < 4; g++) mm_gemm_weight_destroy(c->w[g]);
    for (int k = 0; k < 2; k++) mm_onednn_plain_destroy(c->plain[k]);
    free(c->A), free(c->B), free(c->C), free(c->pw);
}

/* ---- main -------------------------------------------------------------------------------- */

static int mm_bench_gemm_main(int argc, char **argv)
{
    if (mm_bench_flag(argc, argv, "--help")) {
        printf("megamoe bench gemm [--quick] [--seconds S] [--shape NAME] [--no-probe]\n"
               "  --quick       short rounds (~8 s in all)\n"
               "  --seconds S   timed seconds per implementation and case (default 0.4)\n"
               "  --shape NAME  one of moe_gmm1 moe_gmm2 seed_gmm1 seed_gmm2 m16 m128 m512 m2048\n"
               "  --no-probe    skip the peak probe (pct_peak becomes null)\n"
               "MEGAMOE_GEMM picks the backend of the 'grouped' rows (default auto).\n");
        return 0;
    }
    int quick = mm_bench_flag(argc, argv, "--quick");
    double seconds = atof(mm_bench_opt(argc, argv, "--seconds", quick ? "0.05" : "0.4"));
    int min_rounds = quick ? 2 : 5;
    const char *only = mm_bench_opt(argc, argv, "--shape", NULL);
    double block = quick ? 0.03 : 0.1; /* seconds of one phase block */
    megamoe_log_set_level(MEGAMOE_LOG_WARN);

    mm_peak_t peak;
    memset(&peak, 0, sizeof peak);
    peak.unit = "none";
    if (!mm_bench_flag(argc, argv, "--no-probe")) {
        mm_bench_progress(0, 1, "peak probe");
        mm_kernels_peak_probe(quick ? 0.05 : 0.3, &peak);
        fprintf(stderr, "peak per core: %s %.0f GFLOP/s (avx512_bf16 %.0f, fp32_fma %.0f, amx %.0f)\n",
                peak.unit, peak.gflops, peak.avx512_bf16_gflops, peak.fp32_fma_gflops, peak.amx_gflops);
    }
    const mm_gemm_backend_ops_t *be = NULL;
    if (mm_gemm_backend_default(&be) != MEGAMOE_OK) {
        fprintf(stderr, "bench gemm: %s\n", megamoe_last_error());
        return 1;
    }

    mm_bench_begin("gemm");
    double gf[MM_NSHAPES][2][NIMPL], gfb[MM_NSHAPES][2][NIMPL]; /* median, best call */
    const char *packed_be[MM_NSHAPES] = {0};                    /* backend of our packed weights */
    int have_onednn = 1, step = 0, total = (only ? 1 : MM_NSHAPES) * 2;
    helper_t helper;
    for (int t = 1; t <= 2; t++) {
        memset(&helper, 0, sizeof helper);
        pthread_mutex_init(&helper.mu, NULL);
        pthread_cond_init(&helper.cv, NULL);
        if (t == 2 && pthread_create(&helper.thread, NULL, helper_main, &helper) != 0) return 1;
        for (int si = 0; si < MM_NSHAPES; si++) {
            const gemm_shape_t *s = &mm_shapes[si];
            if (only && strcmp(only, s->name) != 0) {
                for (int i = 0; i < NIMPL; i++) gf[si][t - 1][i] = gfb[si][t - 1][i] = NAN;
                continue;
            }
            char label[96];
            snprintf(label, sizeof label, "%s %lldx%lldx%lld x%d, %d thread(s)", s->name, (long long)s->M,
                     (long long)s->K, (long long)s->N, s->groups, t);
            mm_bench_progress(++step, total, label);
            gemm_case_t c;
            int ok = case_setup(&c, s, t);
            if (ok == 0) {
                fprintf(stderr, "bench gemm: setup failed: %s\n", megamoe_last_error());
                case_free(&c);
                return 1;
            }
            have_onednn = ok > 0;
            packed_be[si] = mm_gemm_weight_backend(c.w[0])->name;
            c.helper = &helper;
            int nimpl = have_onednn ? NIMPL : ONEDNN_PACKED;
            enum { CAP = 4096 };
            double *times[NIMPL];
            int n[NIMPL] = {0};
            for (int i = 0; i < nimpl; i++) times[i] = malloc(CAP * sizeof(double));
            for (int i = 0; i < nimpl; i++) { /* warm-up: primitives, caches */
                if (t == 2) helper_park(&helper, i >= ONEDNN_PACKED);
                c.impl = i;
                run_once(&c);
            }
            /* Blocks of a phase (ours, then oneDNN's) alternate; inside a block the two weight
             * kinds alternate call by call. At a switch to ours with 2 threads, oneDNN's OpenMP
             * worker is given time to stop spinning (libgomp spins ~ms before sleeping). */
            double spent = 0;
            for (int cycle = 0; spent < seconds * nimpl || n[0] < min_rounds || n[nimpl - 1] < min_rounds; cycle++) {
                for (int phase = 0; phase * 2 < nimpl; phase++) {
                    if (t == 2) {
                        helper_park(&helper, phase == 1);
                        if (phase == 0 && nimpl > 2) mm_sleep_ns(30000000);
                    }
                    double block_spent = 0;
                    int reps = 0;
                    while ((block_spent < block || reps < min_rounds) && n[2 * phase] < CAP && n[2 * phase + 1] < CAP) {
                        for (int i = 2 * phase; i < 2 * phase + 2; i++) {
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
                if (n[0] >= CAP || n[nimpl - 1] >= CAP) break;
            }
            if (c.st != MEGAMOE_OK) {
                fprintf(stderr, "bench gemm: %s\n", megamoe_last_error());
                return 1;
            }
            double flop = 2.0 * (double)s->groups * (double)s->M * (double)s->K * (double)s->N;
            for (int i = 0; i < NIMPL; i++) {
                gf[si][t - 1][i] = gfb[si][t - 1][i] = 0;
                if (i >= nimpl) continue;
                double best = times[i][0];
                for (int k = 1; k < n[i]; k++) best = times[i][k] < best ? times[i][k] : best;
                double med = mm_bench_median_of(times[i], n[i]);
                double g = flop / med * 1e-9;
                gf[si][t - 1][i] = g;
                gfb[si][t - 1][i] = flop / best * 1e-9;
                mm_bench_row();
                mm_bench_str("impl", mm_impl_name[i]);
                mm_bench_str("weights", mm_weights_name[i]);
                mm_bench_str("backend", i == GROUPED_PACKED ? mm_gemm_weight_backend(c.w[0])->name
                                        : i == GROUPED_KN   ? be->name
                                                            : "onednn");
                mm_bench_int("M", s->M);
                mm_bench_int("K", s->K);
                mm_bench_int("N", s->N);
                mm_bench_int("groups", s->groups);
                mm_bench_int("threads", t);
                mm_bench_num("gflops", g);
                mm_bench_num("pct_amx_peak", peak.amx_gflops > 0 ? 100.0 * g / (peak.amx_gflops * t) : NAN);
                mm_bench_num("pct_peak", peak.gflops > 0 ? 100.0 * g / (peak.gflops * t) : NAN);
                mm_bench_str("peak_unit", peak.unit);
                mm_bench_num("peak_gflops", peak.gflops > 0 ? peak.gflops : NAN); /* per core */
                mm_bench_num("gflops_best", flop / best * 1e-9);
                mm_bench_num("ms", med * 1e3);
                mm_bench_int("calls", n[i]);
            }
            for (int i = 0; i < nimpl; i++) free(times[i]);
            case_free(&c);
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

    /* The targets, from the same run: grouped >= 0.95 x oneDNN (same weights kind), and
     * packed >= 1.2 x plain [K,N] weights (our packed path vs oneDNN with [K,N] weights). */
    if (have_onednn) {
        double load[3] = {0, 0, 0};
        FILE *f = fopen("/proc/loadavg", "r");
        if (f) {
            if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
            fclose(f);
        }
        fprintf(stderr, "\n== gemm targets (plain operands on backend %s, packed weights on the "
                        "one named per shape; load average now %.2f: other load makes the "
                        "2-thread medians unreliable, the best-call ratios less so) ==\n"
                        "%-10s %-7s %-7s %-14s %-14s %-14s | best call: %-8s %-8s %-8s\n",
                be->name, load[0], "shape", "packed", "threads", "grp/dnn packed", "grp/dnn kn",
                "packed/kn", "packed", "kn", "pk/kn");
        for (int si = 0; si < MM_NSHAPES; si++)
            for (int t = 0; t < 2; t++) {
                double *g = gf[si][t], *b = gfb[si][t];
                if (isnan(g[0])) continue;
                fprintf(stderr, "%-10s %-7s %-7d %-14.3f %-14.3f %-14.3f |            %-8.3f %-8.3f %-8.3f\n",
                        mm_shapes[si].name, packed_be[si] ? packed_be[si] : "?", t + 1,
                        g[GROUPED_PACKED] / g[ONEDNN_PACKED],
                        g[GROUPED_KN] / g[ONEDNN_KN], g[GROUPED_PACKED] / g[ONEDNN_KN],
                        b[GROUPED_PACKED] / b[ONEDNN_PACKED], b[GROUPED_KN] / b[ONEDNN_KN],
                        b[GROUPED_PACKED] / b[ONEDNN_KN]);
            }
    }
    return 0;
}

const mm_bench_def_t mm_bench_gemm_def = {
    "gemm", "BF16 grouped GEMM vs plain oneDNN, GFLOP/s and % of the probed peak (--quick)",
    mm_bench_gemm_main};
