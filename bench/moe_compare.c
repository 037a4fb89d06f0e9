/* Comparison jobs (moe_job.h): several schedules of MegaMoeExperts on the same data in one
 * process per rank, iterations interleaved, plus the O1 workers' wait shares from the trace
 * and the rank's memory figures. With o->training_step every schedule is timed again as a
 * training step ("O1+step", a layer of its own): each step passes other weights (two buffers
 * of slightly different values, taken in turn, and a new version), so every forward re-packs
 * them, as the first forward after an optimizer step does. Public headers only (and
 * bench_mem.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "megamoe/megamoe.h"

#include "bench_mem.h"
#include "bench_util.h"
#include "bench_wire.h"
#include "moe_job.h"

static double mm_cmp_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define MM_CMP_FAIL(...)                                                                   \
    do {                                                                                   \
        snprintf(r->error, sizeof r->error, __VA_ARGS__);                                  \
        goto out;                                                                          \
    } while (0)

int mm_moe_job_compare_rank(const mm_moe_job_opts_t *o, mm_moe_job_result_t *r)
{
    memset(r, 0, sizeof *r);
    mm_moe_job_malloc_settings();
    megamoe_comm_t *comm = NULL;
    megamoe_experts_t *layer[MM_JOB_MAX_VARIANTS] = {NULL};
    int layer_of[MM_JOB_MAX_VARIANTS], profiled[MM_JOB_MAX_VARIANTS] = {0};
    int stepped[MM_JOB_MAX_VARIANTS] = {0}; /* a training-step variant */
    uint16_t *alt1 = NULL, *alt2 = NULL;     /* the other weights of the training steps */
    uint64_t step_version = 1;
    int n_layers = 0, nv = 0, o1 = -1;
    mm_moe_problem_t P;
    memset(&P, 0, sizeof P);
    uint16_t *out = NULL, *gh = NULL, *g1 = NULL, *g2 = NULL;
    float *gp = NULL;
    double *t_it = NULL, *t_fw = NULL, *t_bw = NULL, *t_cpu = NULL;
    megamoe_status_t st;

    /* one layer per listed schedule and replica setting, all on the same communicator */
    megamoe_experts_params_t prm[MM_JOB_MAX_VARIANTS];
    char names[MM_JOB_MAX_VARIANTS][16];
    int reps[MM_JOB_MAX_VARIANTS], n_reps = mm_moe_job_replicas(o->replicas, reps, MM_JOB_MAX_VARIANTS);
    if (n_reps < 1) MM_CMP_FAIL("bad --replicas list '%s'", o->replicas);
    size_t heap = 16u << 20;
    char list[sizeof o->schedule];
    snprintf(list, sizeof list, "%s", o->schedule);
    int rep_layer = -1; /* the first layer with replicas: its plan goes into the result */
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save))
        for (int ri = 0; ri < n_reps && n_layers < MM_JOB_MAX_VARIANTS - 1; ri++) {
        megamoe_experts_params_t p = mm_moe_job_layer_params(o);
        p.expert_capacity_factor = o->capacity_factor;
        p.swiglu_limit = o->swiglu_limit;
        p.schedule = strcmp(tok, "O0") == 0 ? "O0" : strcmp(tok, "O1") == 0 ? "O1" : NULL;
        if (p.schedule == NULL) MM_CMP_FAIL("unknown schedule '%s' in '%s'", tok, o->schedule);
        p.replica_slots_per_rank = reps[ri];
        /* "O1" (no replicas) or "O1+r2": the profiled wait shares are the plain O1 layer's */
        if (reps[ri] == 0) snprintf(names[n_layers], sizeof names[0], "%s", p.schedule);
        else snprintf(names[n_layers], sizeof names[0], "%s+r%d", p.schedule, reps[ri]);
        if (strcmp(tok, "O1") == 0 && (o1 < 0 || reps[ri] == 0)) o1 = n_layers;
        if (reps[ri] > 0 && rep_layer < 0) rep_layer = n_layers;
        prm[n_layers++] = p;
        heap += megamoe_experts_heap_bytes(&p, o->ranks);
    }
    const int n_plain = n_layers;
    for (int i = 0; o->training_step && i < n_plain && n_layers < MM_JOB_MAX_VARIANTS - 1; i++) {
        prm[n_layers] = prm[i]; /* the same schedule as a training step, in a layer of its own */
        char base[sizeof names[0]]; /* a copy: GCC cannot tell names[i] from names[n_layers] */
        memcpy(base, names[i], sizeof base);
        snprintf(names[n_layers], sizeof names[0], "%.10s+step", base);
        heap += megamoe_experts_heap_bytes(&prm[i], o->ranks);
        n_layers++;
    }
    megamoe_comm_params_t cp = megamoe_comm_params_default();
    mm_moe_job_size_heap(&cp, heap);
    if ((st = megamoe_comm_create(&cp, &comm)) != MEGAMOE_OK)
        MM_CMP_FAIL("creating the communicator: %s", megamoe_last_error());
    const int ep = megamoe_comm_size(comm), me = megamoe_comm_rank(comm);
    r->rank = me;
    r->ranks = ep;
    if (mm_moe_problem_create(&P, ep, o->T, o->H, o->I, o->E, o->K, o->route, o->seed) != 0)
        MM_CMP_FAIL("cannot build the problem (out of memory or invalid shapes)");
    for (int i = 0; i < n_layers; i++) {
        if ((st = megamoe_experts_create(comm, &prm[i], &layer[i])) != MEGAMOE_OK)
            MM_CMP_FAIL("%s: %s", prm[i].schedule, megamoe_last_error());
        snprintf(r->variant[nv].name, sizeof r->variant[0].name, "%s", names[i]);
        stepped[nv] = i >= n_plain;
        layer_of[nv++] = i;
    }
    if (o1 >= 0 && o->profile_variant) {
        snprintf(r->variant[nv].name, sizeof r->variant[0].name, "O1+prof");
        profiled[nv] = 1;
        layer_of[nv++] = o1;
    }
    r->n_variants = nv;

    const int64_t T = o->T, H = o->H, I = o->I, K = o->K, L = o->E / ep;
    const size_t TH = (size_t)(T * H);
    out = malloc(TH * 2);
    gh = malloc(TH * 2);
    gp = malloc((size_t)(T * K) * 4);
    g1 = malloc((size_t)(L * H * 2 * I) * 2);
    g2 = malloc((size_t)(L * I * H) * 2);
    t_it = calloc((size_t)(nv * o->iters), sizeof *t_it);
    t_fw = calloc((size_t)(nv * o->iters), sizeof *t_fw);
    t_bw = calloc((size_t)(nv * o->iters), sizeof *t_bw);
    t_cpu = calloc((size_t)(nv * o->iters), sizeof *t_cpu);
    if (!out || !gh || !gp || !g1 || !g2 || !t_it || !t_fw || !t_bw || !t_cpu)
        MM_CMP_FAIL("out of memory");
    megamoe_experts_input_t in = megamoe_experts_input_default();
    in.hidden_states = P.hidden + (size_t)me * TH;
    in.topk_ids = P.ids + (size_t)(me * T * K);
    in.topk_weights = P.probs + (size_t)(me * T * K);
    megamoe_experts_weights_t w = {P.gate_up + (size_t)(me * L * H * 2 * I),
                                   P.down + (size_t)(me * L * I * H), 1};
    const size_t W1 = (size_t)(L * H * 2 * I), W2 = (size_t)(L * I * H);
    if (n_layers > n_plain) { /* the lowest mantissa bit flipped: other values, same scale */
        alt1 = malloc(W1 * 2);
        alt2 = malloc(W2 * 2);
        if (!alt1 || !alt2) MM_CMP_FAIL("out of memory");
        for (size_t i = 0; i < W1; i++) alt1[i] = ((const uint16_t *)w.gate_up)[i] ^ 1u;
        for (size_t i = 0; i < W2; i++) alt2[i] = ((const uint16_t *)w.down)[i] ^ 1u;
    }
    megamoe_experts_grads_t g = {gh, gp, g1, g2, MEGAMOE_DTYPE_BF16};
    const uint16_t *dout = P.grad_out + (size_t)me * TH;

    /* warm-up (the profiled variant creates the trace session), then interleaved timing */
    for (int it = 0; it < o->warmup + o->iters; it++) {
        if (it == o->warmup) megamoe_profiler_reset();
        for (int q = 0; q < nv; q++) {
            int v = (q + it) % nv; /* rotating order */
            megamoe_experts_t *x = layer[layer_of[v]];
            megamoe_experts_weights_t wv = w; /* frozen: the same weights, version 1 */
            if (stepped[v]) { /* the weights an optimizer step left: re-packed in the forward */
                const int odd = (int)(++step_version & 1);
                wv.gate_up = odd ? alt1 : w.gate_up;
                wv.down = odd ? alt2 : w.down;
                wv.version = step_version;
            }
            if (profiled[v]) megamoe_profiler_start();
            megamoe_experts_saved_t *sv = NULL;
            mm_shmem_engine_stats_t e0, e1;
            mm_shmem_engine_stats(&e0);
            double c0 = mm_cmp_cpu(), t0 = mm_moe_job_now();
            st = megamoe_experts_forward(x, &wv, &in, out, &sv);
            double t1 = mm_moe_job_now();
            if (st == MEGAMOE_OK) st = megamoe_experts_backward(x, sv, &wv, dout, &g);
            double t2 = mm_moe_job_now(), c2 = mm_cmp_cpu();
            mm_shmem_engine_stats(&e1);
            megamoe_experts_saved_destroy(sv);
            if (profiled[v]) megamoe_profiler_stop();
            if (st != MEGAMOE_OK)
                MM_CMP_FAIL("%s: %s", r->variant[v].name, megamoe_last_error());
            if (it == 0)
                for (size_t i = 0; i < TH; i++) r->variant[v].checksum += megamoe_bf16_to_fp32(out[i]);
            if (it == 0 && v == 0 && o->dump_dir[0]) { /* for the comparison with PyTorch */
                char path[256];
                snprintf(path, sizeof path, "%s/megamoe_out%d.bin", o->dump_dir, me);
                FILE *f = fopen(path, "wb");
                if (f == NULL || fwrite(out, 2, TH, f) != TH) {
                    if (f) fclose(f);
                    MM_CMP_FAIL("cannot write %s", path);
                }
                fclose(f);
            }
            if (it >= o->warmup) {
                size_t k = (size_t)(v * o->iters + it - o->warmup);
                t_it[k] = t2 - t0;
                t_fw[k] = t1 - t0;
                t_bw[k] = t2 - t1;
                t_cpu[k] = c2 - c0;
                mm_bench_wire_t wd = mm_bench_wire_delta(&e0, &e1, o->iters);
                r->variant[v].wire_bytes += wd.bytes;
                r->variant[v].wire_msgs += wd.messages;
                r->variant[v].wire_rtts += wd.round_trips;
            }
        }
    }
    for (int v = 0; v < nv; v++) {
        r->variant[v].iter_median_s = mm_bench_median_of(t_it + (size_t)(v * o->iters), o->iters);
        r->variant[v].fwd_median_s = mm_bench_median_of(t_fw + (size_t)(v * o->iters), o->iters);
        r->variant[v].bwd_median_s = mm_bench_median_of(t_bw + (size_t)(v * o->iters), o->iters);
        r->variant[v].cpu_median_s = mm_bench_median_of(t_cpu + (size_t)(v * o->iters), o->iters);
    }
    megamoe_experts_info_t info;
    if (megamoe_experts_get_info(layer[0], &info) == MEGAMOE_OK) r->workers = info.workers;
    if (rep_layer >= 0 && megamoe_experts_get_info(layer[rep_layer], &info) == MEGAMOE_OK) {
        r->replica_slots = info.replica_slots;
        r->guests = info.last_guests;
        r->rows_moved = info.last_rows_moved;
        r->max_rows_plain = info.last_max_rows_plain;
        r->max_rows = info.last_max_rows;
    }

    /* O1 wait shares: from the profiled timed iterations, or two extra profiled ones */
    if (o1 >= 0) {
        megamoe_experts_t *x = layer[o1];
        if (!o->profile_variant) {
            megamoe_profiler_reset();
            megamoe_profiler_start();
            for (int it = 0; it < 2 && st == MEGAMOE_OK; it++) {
                megamoe_experts_saved_t *sv = NULL;
                st = megamoe_experts_forward(x, &w, &in, out, &sv);
                if (st == MEGAMOE_OK) st = megamoe_experts_backward(x, sv, &w, dout, &g);
                megamoe_experts_saved_destroy(sv);
            }
            megamoe_profiler_stop();
            if (st != MEGAMOE_OK) MM_CMP_FAIL("O1 (profiled): %s", megamoe_last_error());
        }
        megamoe_profile_t *prof = megamoe_experts_get_profile(x);
        megamoe_experts_info_t xi;
        if (prof && megamoe_experts_get_info(x, &xi) == MEGAMOE_OK) {
            for (int role = 0; role < 2; role++) {
                int n = role == 0 ? xi.cube_workers : xi.vector_workers;
                for (int i = 0; i < n && r->n_wait < MM_JOB_MAX_WAIT; i++) {
                    megamoe_profile_summary_t s;
                    if (megamoe_profile_get_worker_summary(prof, (megamoe_profile_role_t)role, i,
                                                           &s) != MEGAMOE_OK || s.launch_ns == 0)
                        continue;
                    snprintf(r->wait_name[r->n_wait], sizeof r->wait_name[0], "%s%u",
                             role == 0 ? "cube" : "vector", (unsigned)i % 1000u);
                    r->wait_share[r->n_wait++] = (double)s.wait_ns / (double)s.launch_ns;
                    r->trace_records += s.records;
                    r->trace_dropped += s.dropped;
                }
            }
        }
    }
    /* memory after every iteration, before the layers release their heap workspaces */
    mm_bench_mem_t mem;
    mm_bench_mem_sample(&mem);
    r->peak_rss_mb = mem.peak_rss_mb;
    r->heap_reserved = mem.heap_reserved;
    r->heap_alloc_peak = mem.heap_alloc_peak;
    r->heap_touched = mem.heap_touched;
    for (int i = 0; i < n_layers; i++)
        if ((st = megamoe_experts_close(layer[i])) != MEGAMOE_OK)
            MM_CMP_FAIL("close: %s", megamoe_last_error());
out:
    for (int i = 0; i < n_layers; i++) {
        if (layer[i] && r->error[0]) megamoe_experts_close(layer[i]);
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
    free(t_it);
    free(t_fw);
    free(t_bw);
    free(t_cpu);
    free(alt1);
    free(alt2);
    return r->error[0] ? 1 : 0;
}
