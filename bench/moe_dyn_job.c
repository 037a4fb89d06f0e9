/* Token-distribution jobs (`megamoe bench layer --tokens-dist`, moe_job.h): per schedule a
 * layer with per-call token counts (max_local_num_tokens = T_cap = the distribution's largest
 * count) beside a fixed-T layer, on the same data in one process per rank, iterations
 * interleaved, each dynamic call taking the distribution's count for (call, rank); then the
 * floor figures of the dynamic calls: a memcpy of the rows the rank moves in the call (the
 * rows it dispatches and the results it returns), a signal round trip between ranks 0 and 1,
 * and the GEMM and weight-read floors of the rows it computes (docs/moe.md "Dynamic tokens").
 * Uses internal headers for the round trip (symmetric signals) and the compute peak probe. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "megamoe/megamoe.h"

#include "base/clock.h"
#include "bench_util.h"
#include "kernels/peak.h"
#include "moe_job.h"
#include "moe_tokens.h"
#include "shmem/shmem.h"

#define MM_DYN_FAIL(...)                                                                   \
    do {                                                                                   \
        snprintf(r->error, sizeof r->error, __VA_ARGS__);                                  \
        goto out;                                                                          \
    } while (0)

static double mm_dyn_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Median seconds of a signal round trip between ranks 0 and 1 (others only take part in the
 * allocation): rank 0 adds 1 to rank 1's word and waits for its own, rank 1 answers. */
static int mm_dyn_rtt(int me, int ep, double *rtt_s)
{
    enum { BATCHES = 21, PER = 200 };
    uint64_t *sig = NULL;
    *rtt_s = 0;
    if (ep < 2) return 0;
    if (mm_shmem_calloc(64, 64, (void **)&sig) != MEGAMOE_OK) return -1;
    double t[BATCHES];
    uint64_t n = 0;
    int rc = 0;
    for (int b = 0; b < BATCHES && rc == 0; b++) {
        double t0 = mm_moe_job_now();
        for (int i = 0; i < PER && rc == 0 && me < 2; i++) {
            n++;
            if (me == 0) {
                if (mm_shmem_signal_op(sig, 1, MM_SHMEM_SIGNAL_ADD, 1) != MEGAMOE_OK ||
                    mm_shmem_signal_wait_until(sig, MM_SHMEM_CMP_GE, n, NULL) != MEGAMOE_OK)
                    rc = -1;
            } else {
                if (mm_shmem_signal_wait_until(sig, MM_SHMEM_CMP_GE, n, NULL) != MEGAMOE_OK ||
                    mm_shmem_signal_op(sig, 1, MM_SHMEM_SIGNAL_ADD, 0) != MEGAMOE_OK)
                    rc = -1;
            }
        }
        t[b] = (mm_moe_job_now() - t0) / PER;
    }
    if (mm_shmem_barrier_all() != MEGAMOE_OK || mm_shmem_free(sig) != MEGAMOE_OK) rc = -1;
    *rtt_s = mm_bench_median_of(t, BATCHES);
    return rc;
}

/* Bytes per second of a large memcpy (each byte read once and written once). */
static double mm_dyn_copy_rate(void)
{
    const size_t n = (size_t)64 << 20;
    char *a = malloc(n), *b = malloc(n);
    double best = 0;
    if (a && b) {
        memset(a, 1, n);
        memset(b, 2, n);
        for (int i = 0; i < 3; i++) {
            double t0 = mm_moe_job_now();
            memcpy(b, a, n);
            double s = mm_moe_job_now() - t0;
            if (s > 0 && (double)n / s > best) best = (double)n / s;
        }
    }
    free(a);
    free(b);
    return best;
}

int mm_moe_job_dyn_rank(const mm_moe_job_opts_t *o, mm_moe_job_result_t *r)
{
    memset(r, 0, sizeof *r);
    mm_moe_job_malloc_settings();
    megamoe_comm_t *comm = NULL;
    megamoe_experts_t *layer[MM_JOB_MAX_VARIANTS] = {NULL};
    int n_layers = 0;
    mm_moe_problem_t P;
    memset(&P, 0, sizeof P);
    uint16_t *out = NULL, *gh = NULL, *g1 = NULL, *g2 = NULL, *cpy_a = NULL, *cpy_b = NULL;
    float *gp = NULL;
    double *t_it = NULL, *t_fw = NULL, *t_bw = NULL, *t_cpu = NULL, *t_copy = NULL;
    double *t_work = NULL;
    megamoe_status_t st;
    mm_tokens_dist_t dist;
    if (mm_tokens_parse("--tokens-dist", o->tokens_dist, &dist) != 0)
        MM_DYN_FAIL("bad --tokens-dist '%s'", o->tokens_dist);
    /* T_cap: the distribution's largest count (or --max-tokens); the fixed layer's T: the mean
     * count rounded to a multiple of 128 (at least 128): the same total tokens, or the padded
     * layer a fixed T forces for small counts */
    const int64_t tcap = o->max_tokens > 0 ? o->max_tokens : mm_tokens_max(&dist);
    int64_t tfix = (int64_t)llround(mm_tokens_mean(&dist) / 128.0) * 128;
    if (tfix < 128) tfix = 128;
    const int64_t T = tcap > tfix ? tcap : tfix; /* the problem's rows per rank */
    if (tcap < 1) MM_DYN_FAIL("--tokens-dist '%s' never passes a token", o->tokens_dist);

    megamoe_experts_params_t prm[MM_JOB_MAX_VARIANTS];
    char list[sizeof o->schedule];
    snprintf(list, sizeof list, "%s", o->schedule);
    size_t heap = 16u << 20;
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok && n_layers + 2 <= 4;
         tok = strtok_r(NULL, ",", &save))
        for (int fixed = 0; fixed < 2; fixed++) {
            megamoe_experts_params_t p = mm_moe_job_layer_params(o);
            p.local_num_tokens = fixed ? tfix : 0;
            p.max_local_num_tokens = fixed ? 0 : tcap;
            p.expert_capacity_factor = o->capacity_factor;
            p.dispatch_mode = o->dispatch_mode[0] ? o->dispatch_mode : NULL;
            p.schedule = strcmp(tok, "O0") == 0 ? "O0" : strcmp(tok, "O1") == 0 ? "O1" : NULL;
            if (p.schedule == NULL) MM_DYN_FAIL("unknown schedule '%s' in '%s'", tok, o->schedule);
            snprintf(r->variant[n_layers].name, sizeof r->variant[0].name, "%s-%s", p.schedule,
                     fixed ? "fixed" : "dyn");
            prm[n_layers++] = p;
            heap += megamoe_experts_heap_bytes(&p, o->ranks);
        }
    r->n_variants = n_layers;
    megamoe_comm_params_t cp = megamoe_comm_params_default();
    mm_moe_job_size_heap(&cp, heap);
    if ((st = megamoe_comm_create(&cp, &comm)) != MEGAMOE_OK)
        MM_DYN_FAIL("creating the communicator: %s", megamoe_last_error());
    const int ep = megamoe_comm_size(comm), me = megamoe_comm_rank(comm);
    r->rank = me;
    r->ranks = ep;
    if (mm_moe_problem_create(&P, ep, T, o->H, o->I, o->E, o->K, o->route, o->seed) != 0)
        MM_DYN_FAIL("cannot build the problem (out of memory or invalid shapes)");
    for (int i = 0; i < n_layers; i++)
        if ((st = megamoe_experts_create(comm, &prm[i], &layer[i])) != MEGAMOE_OK)
            MM_DYN_FAIL("%s: %s", r->variant[i].name, megamoe_last_error());
    if (mm_dyn_rtt(me, ep, &r->dyn.rtt_s) != 0)
        MM_DYN_FAIL("signal round trip: %s", megamoe_last_error());
    mm_peak_t peak;
    if (mm_kernels_peak_probe(0.05, &peak) != MEGAMOE_OK) peak.gflops = 0;
    const double copy_rate = mm_dyn_copy_rate();
    r->dyn.peak_gflops = peak.gflops;
    r->dyn.copy_gbs = copy_rate * 1e-9;

    const int64_t H = o->H, I = o->I, K = o->K, L = o->E / ep, nv = n_layers;
    const size_t TH = (size_t)(T * H);
    out = malloc(TH * 2);
    gh = malloc(TH * 2);
    gp = malloc((size_t)(T * K) * 4);
    g1 = malloc((size_t)(L * H * 2 * I) * 2);
    g2 = malloc((size_t)(L * I * H) * 2);
    /* the copy floor's buffers: the most rows a rank moves in a call (K*T_cap + the most it
     * can receive) */
    const size_t cpy_rows = (size_t)(T * K) * (size_t)(ep + 1);
    cpy_a = malloc(cpy_rows * (size_t)H * 2);
    cpy_b = malloc(cpy_rows * (size_t)H * 2);
    t_it = calloc((size_t)(nv * o->iters), sizeof *t_it);
    t_fw = calloc((size_t)(nv * o->iters), sizeof *t_fw);
    t_bw = calloc((size_t)(nv * o->iters), sizeof *t_bw);
    t_cpu = calloc((size_t)(nv * o->iters), sizeof *t_cpu);
    t_copy = calloc((size_t)o->iters, sizeof *t_copy);
    t_work = calloc((size_t)o->iters, sizeof *t_work);
    if (!out || !gh || !gp || !g1 || !g2 || !cpy_a || !cpy_b || !t_it || !t_fw || !t_bw ||
        !t_cpu || !t_copy || !t_work)
        MM_DYN_FAIL("out of memory");
    memset(cpy_a, 1, cpy_rows * (size_t)H * 2);
    memset(cpy_b, 2, cpy_rows * (size_t)H * 2);
    megamoe_experts_input_t in = megamoe_experts_input_default();
    in.hidden_states = P.hidden + (size_t)me * TH;
    in.topk_ids = P.ids + (size_t)(me * T * K);
    in.topk_weights = P.probs + (size_t)(me * T * K);
    megamoe_experts_weights_t w = {P.gate_up + (size_t)(me * L * H * 2 * I),
                                   P.down + (size_t)(me * L * I * H), 1};
    megamoe_experts_grads_t g = {gh, gp, g1, g2, MEGAMOE_DTYPE_BF16};
    const uint16_t *dout = P.grad_out + (size_t)me * TH;

    for (int it = 0; it < o->warmup + o->iters; it++) {
        /* this call's counts, the same on every rank (every rank knows every count) */
        int64_t mine = mm_tokens_count(&dist, o->seed, it, me), all = 0;
        for (int q = 0; q < ep; q++) all += mm_tokens_count(&dist, o->seed, it, q);
        const int timed = it >= o->warmup;
        for (int q = 0; q < nv; q++) {
            const int v = (int)((q + it) % nv); /* rotating order */
            const int fixed = strstr(r->variant[v].name, "fixed") != NULL;
            in.num_tokens = fixed ? 0 : mine;
            megamoe_experts_saved_t *sv = NULL;
            double c0 = mm_dyn_cpu(), t0 = mm_moe_job_now();
            st = megamoe_experts_forward(layer[v], &w, &in, out, &sv);
            double t1 = mm_moe_job_now();
            if (st == MEGAMOE_OK) st = megamoe_experts_backward(layer[v], sv, &w, dout, &g);
            double t2 = mm_moe_job_now(), c2 = mm_dyn_cpu();
            megamoe_experts_saved_destroy(sv);
            if (st != MEGAMOE_OK) MM_DYN_FAIL("%s: %s", r->variant[v].name, megamoe_last_error());
            if (it == 0) {
                const int64_t rows = fixed ? tfix : mine;
                for (size_t i = 0; i < (size_t)(rows * H); i++)
                    r->variant[v].checksum += megamoe_bf16_to_fp32(out[i]);
            }
            if (!timed) continue;
            size_t k = (size_t)(v * o->iters + it - o->warmup);
            t_it[k] = t2 - t0;
            t_fw[k] = t1 - t0;
            t_bw[k] = t2 - t1;
            t_cpu[k] = c2 - c0;
            r->dyn.fwd_sum_s[v] += t1 - t0;
            r->dyn.iter_sum_s[v] += t2 - t0;
            r->dyn.tokens_sum[v] += fixed ? (double)(tfix * ep) : (double)all;
            if (!fixed && strcmp(prm[v].schedule, prm[0].schedule) == 0) {
                /* the floors of this dynamic call on this rank: copy the rows it dispatches
                 * and the results it returns; compute its rows and read the weights of its
                 * experts that got rows (from the forward's info) */
                megamoe_experts_info_t info;
                megamoe_experts_get_info(layer[v], &info);
                const size_t rows = (size_t)(mine * K + info.last_recv_rows);
                const size_t c = (size_t)(it - o->warmup);
                double s0 = mm_moe_job_now();
                memcpy(cpy_b, cpy_a, rows * (size_t)H * 2);
                t_copy[c] = mm_moe_job_now() - s0;
                const double flops = (double)info.last_recv_rows * 6.0 * (double)H * (double)I;
                int64_t used = 0; /* local experts some present token chose */
                for (int64_t j = 0; j < L; j++) {
                    int hit = 0;
                    for (int q = 0; q < ep && !hit; q++) {
                        const int32_t *ids = P.ids + (size_t)q * (size_t)(T * K);
                        const int64_t nq = mm_tokens_count(&dist, o->seed, it, q) * K;
                        for (int64_t i = 0; i < nq && !hit; i++) hit = ids[i] == me * L + j;
                    }
                    used += hit;
                }
                const double wbytes = (double)used * 6.0 * (double)H * (double)I;
                const double workers = info.workers > 0 ? info.workers : 1;
                const double tg = peak.gflops > 0 ? flops / (peak.gflops * 1e9 * workers) : 0;
                const double tw = copy_rate > 0 ? wbytes / (2.0 * copy_rate) : 0;
                t_work[c] = tg > tw ? tg : tw;
                r->dyn.recv_rows_mean += (double)info.last_recv_rows / o->iters;
                r->tokens += (double)mine / o->iters;
            }
        }
    }
    for (int v = 0; v < nv; v++) {
        mm_moe_job_variant_t *x = &r->variant[v];
        x->iter_median_s = mm_bench_median_of(t_it + v * o->iters, o->iters);
        x->fwd_median_s = mm_bench_median_of(t_fw + v * o->iters, o->iters);
        x->bwd_median_s = mm_bench_median_of(t_bw + v * o->iters, o->iters);
        x->cpu_median_s = mm_bench_median_of(t_cpu + v * o->iters, o->iters);
    }
    r->dyn.copy_median_s = mm_bench_median_of(t_copy, o->iters);
    r->dyn.work_median_s = mm_bench_median_of(t_work, o->iters);
    r->dyn.t_cap = tcap;
    r->dyn.t_fixed = tfix;
    megamoe_experts_info_t info;
    megamoe_experts_get_info(layer[0], &info);
    r->workers = info.workers;
    for (int i = 0; i < n_layers; i++) {
        if ((st = megamoe_experts_close(layer[i])) != MEGAMOE_OK)
            MM_DYN_FAIL("close: %s", megamoe_last_error());
        megamoe_experts_destroy(layer[i]);
        layer[i] = NULL;
    }
out:
    for (int i = 0; i < n_layers; i++)
        if (layer[i]) {
            if (r->error[0]) megamoe_experts_close(layer[i]); /* collective; peers fail alike */
            megamoe_experts_destroy(layer[i]);
        }
    if (comm && megamoe_comm_destroy(comm) != MEGAMOE_OK && !r->error[0])
        snprintf(r->error, sizeof r->error, "destroying the communicator: %s",
                 megamoe_last_error());
    mm_moe_problem_free(&P);
    free(out);
    free(gh);
    free(gp);
    free(g1);
    free(g2);
    free(cpy_a);
    free(cpy_b);
    free(t_it);
    free(t_fw);
    free(t_bw);
    free(t_cpu);
    free(t_copy);
    free(t_work);
    return r->error[0] ? 1 : 0;
}
