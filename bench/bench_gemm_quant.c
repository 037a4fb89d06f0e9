/* bench gemm, quantised rows (see bench_gemm.h): impl "quant" = grouped W8A8 / W4A8 products
 * (kernels/qgemm.h) at M = 256 on the MoE shapes beside the packed bf16 grouped product of the
 * same shape; impl "decode" = M = 1, 4, 16 rows of one expert on the MoE weights (K x N =
 * 4096 x 2816 and 1408 x 4096) for bf16, w8a8 and w4a8 weights. Every case rotates through
 * distinct weight sets (packed copies of one source) whose total is at least twice the
 * last-level cache plus one set, so each call streams its weights from memory, as a model's
 * layers do; the three quantisations take turns call by call (drift from other load hits all
 * alike) and medians are reported. Scales are per output channel; activations int8 with
 * per-token scales (w8a8, w4a8) or bf16 (bf16), fp32 C.
 *
 * Row fields beside bench_gemm.c's: quant ("bf16", "w8a8", "w4a8"), pct_int8_peak (of the
 * probed INT8 peak x threads; null on bf16 rows), pct_roofline (of min(peak, flop / bytes x
 * the read bandwidth probed with the same number of threads); bytes = weights + A + C),
 * roofline_gflops, weight_sets. pct_peak stays "of the best BF16 unit" and is null on int8
 * rows. With 2 threads the two workers split the columns (mm_gemm_split, alignment 64). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/cpu.h"
#include "bench_gemm.h"
#include "bench_util.h"
#include "kernels/gemm.h"
#include "kernels/qgemm.h"
#include "megamoe/megamoe.h"

enum { Q_BF16, Q_W8A8, Q_W4A8, NQ };
static const char *const qb_name[NQ] = {"bf16", "w8a8", "w4a8"};
#define QB_MAX_SETS 48

typedef struct qb_shape {
    const char *name;
    const char *impl;
    int64_t M, K, N;
} qb_shape_t;

static const qb_shape_t qb_shapes[] = {
    {"moe_gmm1", "quant", 256, 4096, 2816}, {"moe_gmm2", "quant", 256, 1408, 4096},
    /* M: rows per expert of a decode call (8: 32 tokens per rank, top-8 of 64 experts, 2 ranks) */
    {"dec_gmm1", "decode", 1, 4096, 2816},  {"dec_gmm1", "decode", 4, 4096, 2816},
    {"dec_gmm1", "decode", 8, 4096, 2816},  {"dec_gmm1", "decode", 16, 4096, 2816},
    {"dec_gmm2", "decode", 1, 1408, 4096},  {"dec_gmm2", "decode", 4, 1408, 4096},
    {"dec_gmm2", "decode", 8, 1408, 4096},  {"dec_gmm2", "decode", 16, 1408, 4096},
};
#define QB_NSHAPES ((int)(sizeof qb_shapes / sizeof qb_shapes[0]))

/* Results kept for the targets: [shape][threads-1][quant] median GFLOP/s and roofline. */
static double qb_gf[QB_NSHAPES][2][NQ], qb_roof[QB_NSHAPES][2][NQ];

typedef struct qb_case {
    const qb_shape_t *s;
    int threads;
    uint16_t *src_bf16;
    int8_t *src_i8;
    uint8_t *src_i4;
    int nsets[NQ];
    mm_gemm_weight_t *wb[QB_MAX_SETS];
    mm_qweight_t *wq[2][QB_MAX_SETS];
    int cur[NQ];
    uint16_t *A16;
    int8_t *A8;
    float *xs, *ws, *C;
    int q;
    megamoe_status_t st;
} qb_case_t;

double mm_gemm_bench_roofline(double peak_per_core, int threads, double read_gbps, double flop,
                              double bytes)
{
    if (!(peak_per_core > 0) || !(read_gbps > 0) || !(bytes > 0)) return NAN;
    double compute = peak_per_core * threads, memory = flop / bytes * read_gbps;
    return compute < memory ? compute : memory;
}

static double qb_weight_bytes(const qb_shape_t *s, int q)
{
    const double kn = (double)s->K * (double)s->N;
    return q == Q_BF16 ? 2 * kn : q == Q_W8A8 ? kn : kn / 2;
}

static void qb_job(void *p, int worker)
{
    qb_case_t *c = p;
    const qb_shape_t *s = c->s;
    int64_t m0 = 0, m1 = s->M, n0 = 0, n1 = s->N;
    if (c->threads > 1) mm_gemm_split(s->M, s->N, s->K, 64, worker, c->threads, &m0, &m1, &n0, &n1);
    if (m0 >= m1 || n0 >= n1) return;
    megamoe_status_t st;
    if (c->q == Q_BF16) {
        mm_gemm_grouped_args_t a;
        mm_gemm_grouped_args_init(&a);
        a.form = MM_GEMM_NN;
        a.num_groups = 1;
        a.group_rows = &s->M;
        a.K = s->K, a.N = s->N;
        a.A = c->A16, a.lda = s->K;
        const mm_gemm_weight_t *w = c->wb[c->cur[Q_BF16]];
        a.weights = &w;
        a.C = c->C, a.ldc = s->N, a.c_type = MEGAMOE_DTYPE_FP32;
        a.m0 = m0, a.m1 = m1, a.n0 = n0, a.n1 = n1;
        st = mm_gemm_grouped(&a);
    } else {
        mm_qgemm_expert_t e;
        memset(&e, 0, sizeof e);
        e.weight = c->wq[c->q - 1][c->cur[c->q]];
        e.w_scale = c->ws;
        mm_qgemm_args_t a;
        mm_qgemm_args_init(&a);
        a.num_groups = 1;
        a.group_rows = &s->M;
        a.experts = &e;
        a.K = s->K, a.N = s->N;
        a.a_type = MEGAMOE_DTYPE_INT8;
        a.A = c->A8, a.lda = s->K;
        a.x_scale = c->xs;
        a.C = c->C, a.ldc = s->N, a.c_type = MEGAMOE_DTYPE_FP32;
        a.m0 = m0, a.m1 = m1, a.n0 = n0, a.n1 = n1;
        st = mm_qgemm(&a);
    }
    if (st != MEGAMOE_OK) c->st = st;
}

static void qb_free(qb_case_t *c)
{
    for (int i = 0; i < QB_MAX_SETS; i++) {
        mm_gemm_weight_destroy(c->wb[i]);
        mm_qweight_destroy(c->wq[0][i]);
        mm_qweight_destroy(c->wq[1][i]);
    }
    free(c->src_bf16), free(c->src_i8), free(c->src_i4), free(c->A16), free(c->A8);
    free(c->xs), free(c->ws), free(c->C);
}

static uint32_t qb_rnd(uint32_t *x)
{
    *x = *x * 1664525u + 1013904223u;
    return *x >> 8;
}

/* 0 on success. */
static int qb_setup(qb_case_t *c, const qb_shape_t *s, int threads, size_t llc, int max_sets)
{
    memset(c, 0, sizeof *c);
    c->s = s;
    c->threads = threads;
    const int64_t K = s->K, N = s->N, M = s->M;
    c->src_bf16 = malloc((size_t)(K * N) * 2);
    c->src_i8 = malloc((size_t)(K * N));
    c->src_i4 = malloc((size_t)(K * ((N + 1) / 2)));
    c->A16 = malloc((size_t)(M * K) * 2);
    c->A8 = malloc((size_t)(M * K));
    c->xs = malloc((size_t)M * sizeof(float));
    c->ws = malloc((size_t)N * sizeof(float));
    c->C = malloc((size_t)(M * N) * sizeof(float));
    if (!c->src_bf16 || !c->src_i8 || !c->src_i4 || !c->A16 || !c->A8 || !c->xs || !c->ws || !c->C)
        return 1;
    uint32_t x = 12345;
    for (int64_t i = 0; i < K * N; i++) {
        c->src_bf16[i] = megamoe_fp32_to_bf16(((float)(qb_rnd(&x) % 2001) - 1000.0f) * 1e-4f);
        c->src_i8[i] = (int8_t)(qb_rnd(&x) & 0xff);
    }
    for (int64_t i = 0; i < K * ((N + 1) / 2); i++) c->src_i4[i] = (uint8_t)qb_rnd(&x);
    for (int64_t i = 0; i < M * K; i++) {
        c->A16[i] = megamoe_fp32_to_bf16(((float)(qb_rnd(&x) % 2001) - 1000.0f) * 1e-3f);
        c->A8[i] = (int8_t)(qb_rnd(&x) & 0xff);
    }
    for (int64_t i = 0; i < M; i++) c->xs[i] = 0.01f;
    for (int64_t i = 0; i < N; i++) c->ws[i] = 0.001f;
    for (int q = 0; q < NQ; q++) {
        const double wb = qb_weight_bytes(s, q);
        int n = (int)ceil(2.0 * (double)llc / wb) + 1;
        if (n > QB_MAX_SETS) n = QB_MAX_SETS;
        if (max_sets > 0 && n > max_sets) n = max_sets;
        c->nsets[q] = n;
        for (int i = 0; i < n; i++) {
            megamoe_status_t st;
            if (q == Q_BF16) {
                st = mm_gemm_weight_create(NULL, MM_GEMM_NN, K, N, c->src_bf16, N, 1, &c->wb[i]);
            } else {
                mm_qweight_src_t src = {q == Q_W8A8 ? MM_QW_INT8 : MM_QW_INT4, MM_QW_KN, K, N,
                                        q == Q_W8A8 ? (const void *)c->src_i8 : (const void *)c->src_i4,
                                        q == Q_W8A8 ? N : (N + 1) / 2, 0};
                st = mm_qweight_create(&src, 1, &c->wq[q - 1][i]);
            }
            if (st != MEGAMOE_OK) return 1;
        }
    }
    return 0;
}

int mm_bench_gemm_quant(const mm_gemm_bench_env_t *env)
{
    const int t = env->threads;
    const size_t llc = mm_cpu_llc_bytes();
    const mm_peak_t *pk = env->peak;
    for (int si = 0; si < QB_NSHAPES; si++)
        for (int q = 0; q < NQ; q++) qb_gf[si][t - 1][q] = qb_roof[si][t - 1][q] = NAN;
    for (int si = 0; si < QB_NSHAPES; si++) {
        const qb_shape_t *s = &qb_shapes[si];
        if (env->only && strcmp(env->only, s->name) != 0) continue;
        char label[96];
        snprintf(label, sizeof label, "%s %s M=%lld %lldx%lld, bf16/w8a8/w4a8, %d thread(s)",
                 s->impl, s->name, (long long)s->M, (long long)s->K, (long long)s->N, t);
        fprintf(stderr, "[quant] %s\n", label);
        qb_case_t c;
        if (qb_setup(&c, s, t, llc, env->max_sets) != 0) {
            fprintf(stderr, "bench gemm: quant setup failed: %s\n", megamoe_last_error());
            qb_free(&c);
            return 1;
        }
        enum { CAP = 8192 };
        double *times[NQ];
        int n[NQ] = {0};
        for (int q = 0; q < NQ; q++) times[q] = malloc(CAP * sizeof(double));
        /* Warm-up: one pass over every set (page faults, first-touch; the sets evict each
         * other, so the timed calls find their weights in memory). */
        for (int q = 0; q < NQ; q++) {
            c.q = q;
            for (int i = 0; i < c.nsets[q]; i++) {
                c.cur[q] = i;
                env->run(env->run_ctx, qb_job, &c);
            }
            c.cur[q] = 0;
        }
        double spent = 0;
        const int min_rounds = env->min_rounds > 3 ? env->min_rounds : 3;
        while ((spent < env->seconds * NQ || n[0] < min_rounds) && n[0] < CAP) {
            for (int q = 0; q < NQ; q++) {
                c.q = q;
                uint64_t t0 = mm_now_ns();
                env->run(env->run_ctx, qb_job, &c);
                double dt = (double)(mm_now_ns() - t0) * 1e-9;
                times[q][n[q]++] = dt;
                spent += dt;
                c.cur[q] = (c.cur[q] + 1) % c.nsets[q];
            }
        }
        if (c.st != MEGAMOE_OK) {
            fprintf(stderr, "bench gemm: %s\n", megamoe_last_error());
            for (int q = 0; q < NQ; q++) free(times[q]);
            qb_free(&c);
            return 1;
        }
        const double flop = 2.0 * (double)s->M * (double)s->K * (double)s->N;
        for (int q = 0; q < NQ; q++) {
            double best = times[q][0];
            for (int k = 1; k < n[q]; k++) best = times[q][k] < best ? times[q][k] : best;
            const double med = mm_bench_median_of(times[q], n[q]);
            const double g = flop / med * 1e-9;
            const int i8 = q != Q_BF16;
            const double bytes = qb_weight_bytes(s, q) + (double)(s->M * s->K) * (i8 ? 1 : 2) +
                                 (double)(s->M * s->N) * 4;
            const double peak_core = i8 ? pk->int8_gops : pk->gflops;
            const double roof = mm_gemm_bench_roofline(peak_core, t, env->read_gbps[t], flop, bytes);
            qb_gf[si][t - 1][q] = g;
            qb_roof[si][t - 1][q] = roof;
            mm_bench_row();
            mm_bench_str("impl", s->impl);
            mm_bench_str("weights", "packed");
            mm_bench_str("backend", i8 ? mm_qgemm_impl_name(MEGAMOE_DTYPE_INT8)
                                       : mm_gemm_weight_backend(c.wb[0])->name);
            mm_bench_str("quant", qb_name[q]);
            mm_bench_str("form", "NN");
            mm_bench_str("c", "fp32");
            mm_bench_int("M", s->M);
            mm_bench_int("K", s->K);
            mm_bench_int("N", s->N);
            mm_bench_int("groups", 1);
            mm_bench_int("threads", t);
            mm_bench_num("gflops", g);
            mm_bench_num("pct_amx_peak", !i8 && pk->amx_gflops > 0 ? 100.0 * g / (pk->amx_gflops * t) : NAN);
            mm_bench_num("pct_peak", !i8 && pk->gflops > 0 ? 100.0 * g / (pk->gflops * t) : NAN);
            mm_bench_num("pct_int8_peak", i8 && pk->int8_gops > 0 ? 100.0 * g / (pk->int8_gops * t) : NAN);
            mm_bench_num("pct_roofline", roof > 0 ? 100.0 * g / roof : NAN);
            mm_bench_num("roofline_gflops", roof);
            mm_bench_str("peak_unit", i8 ? pk->int8_unit ? pk->int8_unit : "none" : pk->unit);
            mm_bench_num("peak_gflops", peak_core > 0 ? peak_core : NAN);
            mm_bench_int("weight_sets", c.nsets[q]);
            mm_bench_num("gflops_best", flop / best * 1e-9);
            mm_bench_num("ms", med * 1e3);
            mm_bench_int("calls", n[q]);
        }
        for (int q = 0; q < NQ; q++) free(times[q]);
        qb_free(&c);
    }
    return 0;
}

void mm_bench_gemm_quant_targets(const mm_gemm_bench_env_t *env)
{
    const mm_peak_t *pk = env->peak;
    const double ratio_peaks = pk->gflops > 0 ? pk->int8_gops / pk->gflops : NAN;
    fprintf(stderr,
            "\n== quantised GEMM targets (issue 25; INT8 peak %.0f GOP/s per core (%s), BF16 %.0f "
            "GFLOP/s (%s): ratio %.2f; read bandwidth %.1f GB/s with 1 thread, %.1f with 2) ==\n",
            pk->int8_gops, pk->int8_unit ? pk->int8_unit : "none", pk->gflops, pk->unit,
            ratio_peaks, env->read_gbps[1], env->read_gbps[2]);
    fprintf(stderr, "%-9s %-5s %-3s | %-8s %-8s %-8s | %-9s %-9s %-9s | %-8s %-8s | %-9s %-9s\n",
            "shape", "M", "thr", "bf16", "w8a8", "w4a8", "bf16 %rf", "w8a8 %rf", "w4a8 %rf",
            "w8a8 %pk", "w4a8 %pk", "w8a8/bf16", "w4a8/bf16");
    for (int si = 0; si < QB_NSHAPES; si++)
        for (int t = 0; t < 2; t++) {
            const double *g = qb_gf[si][t], *r = qb_roof[si][t];
            if (isnan(g[0])) continue;
            fprintf(stderr,
                    "%-9s %-5lld %-3d | %-8.1f %-8.1f %-8.1f | %-9.1f %-9.1f %-9.1f | %-8.1f %-8.1f | "
                    "%-9.2f %-9.2f\n",
                    qb_shapes[si].name, (long long)qb_shapes[si].M, t + 1, g[0], g[1], g[2],
                    100 * g[0] / r[0], 100 * g[1] / r[1], 100 * g[2] / r[2],
                    100 * g[1] / (pk->int8_gops * (t + 1)), 100 * g[2] / (pk->int8_gops * (t + 1)),
                    g[1] / g[0], g[2] / g[0]);
        }
    fprintf(stderr,
            "targets: M=256 (quant rows) w8a8 >= 85%% of the INT8 peak and >= 1.7x bf16 where the "
            "INT8/BF16 peak ratio is 2 (scale by ratio/2 elsewhere); decode rows each >= 80%% of "
            "their roofline (%%rf), at M <= 4 w8a8 >= 1.7x and w4a8 >= 3x bf16 where the rooflines "
            "allow (the roofline ratio bounds the speedup: compute-bound rows cannot gain from "
            "fewer bytes)\n");
}
