/* bench layer --tokens-dist: MegaMoeExperts with per-call token counts (docs/moe.md "Dynamic
 * tokens") beside a fixed-T layer, one 2-rank job per (shape, distribution, workers, routing)
 * (moe_dyn_job.c runs the ranks). Rows carry tokens_dist, fwd_ms / bwd_ms / fwd_bwd_ms of the
 * dynamic layer (slowest rank's medians), the fixed layer's, the time per token of both over
 * the timed calls and their ratio, and the floor of the dynamic calls: floor_ms = a memcpy of
 * the rows the busiest rank moves (dispatched rows + returned results) + two signal round
 * trips; work_floor_ms = its GEMM at the probed peak or the read of its used experts' weights,
 * whichever is larger. Targets: per-token time within 1.1x of the fixed layer when every count
 * is >= 512; forward <= 2x floor_ms when every count is <= 64. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_layer_dyn.h"
#include "bench_util.h"
#include "moe_tokens.h"

typedef struct mm_dyn_target {
    char label[256];
    double value, target;
    int below; /* 1: met when value <= target */
} mm_dyn_target_t;

/* The job's time per token of variant v: the slowest rank's sum over the timed calls over the
 * tokens of those calls (every rank's). */
static double mm_dyn_per_token(const mm_moe_job_result_t *res, int ranks, int v, int fwd_only)
{
    double t = 0;
    for (int r = 0; r < ranks; r++) {
        const double s = fwd_only ? res[r].dyn.fwd_sum_s[v] : res[r].dyn.iter_sum_s[v];
        if (s > t) t = s;
    }
    return res[0].dyn.tokens_sum[v] > 0 ? t / res[0].dyn.tokens_sum[v] : 0;
}

static double mm_dyn_slowest(const mm_moe_job_result_t *res, int ranks, int v, int which)
{
    double t = 0;
    for (int r = 0; r < ranks; r++) {
        const mm_moe_job_variant_t *x = &res[r].variant[v];
        const double s = which == 0 ? x->iter_median_s : which == 1 ? x->fwd_median_s : x->bwd_median_s;
        if (s > t) t = s;
    }
    return t;
}

int mm_bench_layer_dyn(const mm_moe_job_opts_t *base, const mm_dyn_shape_t *shapes, int n_shapes,
                       const char *shape_list, char *const *dists, int n_dists,
                       char *const *workers, int n_workers, char *const *routes, int n_routes)
{
    int total = 0, step = 0, rc = 0;
    for (int s = 0; s < n_shapes; s++)
        if (strstr(shape_list, shapes[s].name)) total += n_dists * n_workers * n_routes;
    mm_dyn_target_t targets[128];
    int n_targets = 0;
    mm_bench_begin("layer");
    for (int s = 0; s < n_shapes; s++) {
        const mm_dyn_shape_t *sh = &shapes[s];
        if (!strstr(shape_list, sh->name)) continue;
        for (int di = 0; di < n_dists; di++)
            for (int wi = 0; wi < n_workers; wi++)
                for (int ri = 0; ri < n_routes; ri++) {
                    mm_moe_job_opts_t jo = *base;
                    mm_tokens_dist_t d;
                    if (mm_tokens_parse("--tokens-dist", dists[di], &d) != 0) return 2;
                    snprintf(jo.tokens_dist, sizeof jo.tokens_dist, "%s", dists[di]);
                    jo.T = mm_tokens_max(&d) > 128 ? mm_tokens_max(&d) : 128; /* (child: T_cap) */
                    jo.H = sh->H;
                    jo.I = sh->I;
                    jo.E = sh->E;
                    jo.K = sh->K;
                    /* unless given: enough calls for a stable median against a 10 % bound —
                     * 20 calls of a ~5 ms seed-shape step read 1.07-1.13x where 200 read
                     * 1.03-1.05x (docs/results/zen4-2026-12-06c/dyn_README.md) */
                    if (jo.iters <= 0) jo.iters = sh->H * sh->I < ((int64_t)1 << 20) ? 200 : 20;
                    jo.workers = atoi(workers[wi]);
                    jo.route = (mm_route_pattern_t)mm_route_parse(routes[ri]);
                    char label[160];
                    snprintf(label, sizeof label, "megamoe %s shape, tokens %s, %s workers, %s",
                             sh->name, dists[di], workers[wi], routes[ri]);
                    mm_bench_progress(++step, total, label);
                    mm_moe_job_result_t *res = calloc(64, sizeof *res);
                    const char *sub[] = {"bench", "layer", NULL};
                    if (res == NULL || jo.ranks > 64 || mm_moe_job_launch(&jo, sub, res) != 0) {
                        fprintf(stderr, "megamoe bench layer: the job failed for %s:", label);
                        for (int r = 0; res && r < jo.ranks && r < 64; r++)
                            if (res[r].error[0]) fprintf(stderr, " rank %d: %s;", r, res[r].error);
                        fprintf(stderr, "\n");
                        free(res);
                        rc = 1;
                        continue;
                    }
                    const int n = jo.ranks;
                    double floor_copy = 0, work = 0, tokens = 0, recv = 0;
                    for (int r = 0; r < n; r++) {
                        if (res[r].dyn.copy_median_s > floor_copy) floor_copy = res[r].dyn.copy_median_s;
                        if (res[r].dyn.work_median_s > work) work = res[r].dyn.work_median_s;
                        if (res[r].dyn.recv_rows_mean > recv) recv = res[r].dyn.recv_rows_mean;
                        tokens += res[r].tokens / n;
                    }
                    const double rtt = res[0].dyn.rtt_s;
                    const double floor_s = floor_copy + 2 * rtt;
                    for (int v = 0; v + 1 < res[0].n_variants; v += 2) { /* "Ox-dyn", "Ox-fixed" */
                        const int f = v + 1;
                        char sched[8];
                        snprintf(sched, sizeof sched, "%.2s", res[0].variant[v].name);
                        const double fwd = mm_dyn_slowest(res, n, v, 1);
                        const double pt = mm_dyn_per_token(res, n, v, 0);
                        const double ptf = mm_dyn_per_token(res, n, f, 0);
                        const double pt_fwd = mm_dyn_per_token(res, n, v, 1);
                        const double ptf_fwd = mm_dyn_per_token(res, n, f, 1);
                        mm_bench_row();
                        mm_bench_str("impl", "megamoe");
                        mm_bench_str("schedule", sched);
                        mm_bench_str("shape", sh->name);
                        mm_bench_str("tokens_dist", dists[di]);
                        mm_bench_int("t_cap", res[0].dyn.t_cap);
                        mm_bench_num("tokens_mean", tokens);
                        mm_bench_int("hidden", jo.H);
                        mm_bench_int("intermediate", jo.I);
                        mm_bench_int("experts", jo.E);
                        mm_bench_int("top_k", jo.K);
                        mm_bench_str("routing", routes[ri]);
                        mm_bench_int("ep", n);
                        mm_bench_int("workers", res[0].workers);
                        mm_bench_num("fwd_ms", fwd * 1e3);
                        mm_bench_num("bwd_ms", mm_dyn_slowest(res, n, v, 2) * 1e3);
                        mm_bench_num("fwd_bwd_ms", mm_dyn_slowest(res, n, v, 0) * 1e3);
                        mm_bench_int("fixed_tokens", res[0].dyn.t_fixed);
                        mm_bench_num("fixed_fwd_ms", mm_dyn_slowest(res, n, f, 1) * 1e3);
                        mm_bench_num("fixed_fwd_bwd_ms", mm_dyn_slowest(res, n, f, 0) * 1e3);
                        mm_bench_num("us_per_token", pt * 1e6);
                        mm_bench_num("fixed_us_per_token", ptf * 1e6);
                        mm_bench_num("per_token_over_fixed", ptf > 0 ? pt / ptf : 0);
                        mm_bench_num("fwd_per_token_over_fixed", ptf_fwd > 0 ? pt_fwd / ptf_fwd : 0);
                        mm_bench_num("recv_rows_max", recv);
                        mm_bench_num("floor_ms", floor_s * 1e3);
                        mm_bench_num("copy_ms", floor_copy * 1e3);
                        mm_bench_num("rtt_us", rtt * 1e6);
                        mm_bench_num("work_floor_ms", work * 1e3);
                        mm_bench_num("fwd_over_floor", floor_s > 0 ? fwd / floor_s : 0);
                        mm_bench_num("fwd_over_floor_and_work",
                                     floor_s + work > 0 ? fwd / (floor_s + work) : 0);
                        mm_bench_num("peak_gflops", res[0].dyn.peak_gflops);
                        mm_bench_num("copy_gbs", res[0].dyn.copy_gbs);
                        if (n_targets + 2 > 128) continue;
                        char what[160];
                        snprintf(what, sizeof what, "%s %s %s, %d worker%s, %s", sh->name, sched,
                                 dists[di], res[0].workers, res[0].workers == 1 ? "" : "s",
                                 routes[ri]);
                        if (mm_tokens_min(&d) >= 512) {
                            mm_dyn_target_t *t = &targets[n_targets++];
                            snprintf(t->label, sizeof t->label, "%s: time/token vs fixed T=%lld (fwd+bwd)",
                                     what, (long long)res[0].dyn.t_fixed);
                            t->value = ptf > 0 ? pt / ptf : 0;
                            t->target = 1.1;
                            t->below = 1;
                            t = &targets[n_targets++];
                            snprintf(t->label, sizeof t->label, "%s: time/token vs fixed T=%lld (fwd)",
                                     what, (long long)res[0].dyn.t_fixed);
                            t->value = ptf_fwd > 0 ? pt_fwd / ptf_fwd : 0;
                            t->target = 1.1;
                            t->below = 1;
                        }
                        if (mm_tokens_max(&d) <= 64) {
                            mm_dyn_target_t *t = &targets[n_targets++];
                            snprintf(t->label, sizeof t->label, "%s: fwd / (copy + 2 rtt)", what);
                            t->value = floor_s > 0 ? fwd / floor_s : 0;
                            t->target = 2.0;
                            t->below = 1;
                            t = &targets[n_targets++];
                            snprintf(t->label, sizeof t->label, "%s: fwd / (copy + 2 rtt + work)",
                                     what);
                            t->value = floor_s + work > 0 ? fwd / (floor_s + work) : 0;
                            t->target = 2.0;
                            t->below = 1;
                        }
                    }
                    free(res);
                }
    }
    mm_bench_end();
    if (n_targets) {
        fprintf(stderr, "\nper-call token counts (slowest rank; time/token over the timed calls, "
                        "medians for fwd; floor = memcpy of the busiest rank's rows + 2 signal "
                        "round trips, work = its GEMM at the probed peak or its experts' weight "
                        "read):\n");
        for (int i = 0; i < n_targets; i++)
            fprintf(stderr, "  %-78s %6.2fx  target %s %.2fx  %s\n", targets[i].label,
                    targets[i].value, targets[i].below ? "<=" : ">=", targets[i].target,
                    (targets[i].below ? targets[i].value <= targets[i].target
                                      : targets[i].value >= targets[i].target)
                        ? "met"
                        : "NOT met");
    }
    return rc;
}
