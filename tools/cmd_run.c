/* megamoe run — the main job: a multi-rank MegaMoE forward + backward, verified against the fp32
 * reference and timed per phase. The command starts its ranks itself (it re-executes the
 * megamoe binary through `megamoe launch`); each rank writes its results to a temporary
 * directory and this process prints the report. Public headers only (plus bench/moe_job.h,
 * which uses only public headers). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megamoe/megamoe.h"

#include "cli.h"
#include "moe_job.h"
#include "moe_tokens.h"

static void mm_run_usage(FILE *out)
{
    fprintf(out,
            "usage: megamoe run [options]\n"
            "A verified, timed MegaMoE forward+backward on local ranks (seed shapes by default).\n"
            "  -n, --ranks N            ranks to start (default 2)\n"
            "  --tokens T               tokens per rank, a multiple of 128 (1024)\n"
            "  --max-tokens T_cap       per-call token counts instead (docs/moe.md \"Dynamic\n"
            "                           tokens\"): a max_local_num_tokens = T_cap layer; every\n"
            "                           rank passes 0..T_cap rows per call, from --tokens-dist\n"
            "  --tokens-dist D          N | uniform:A-B | list:a,b,... (rank r at call c takes\n"
            "                           item (r + c) mod count); default uniform:0-T_cap\n"
            "  --hidden H               hidden size (512)\n"
            "  --intermediate I         expert intermediate size (128)\n"
            "  --experts E              global experts, a multiple of the ranks (4)\n"
            "  --top-k K                experts per token (2)\n"
            "  --capacity-factor F      0 = lossless (default); else >= 1\n"
            "  --dispatch-mode M        none (default: the fixed capacity above), push (the\n"
            "                           receive capacity grows collectively when a call needs\n"
            "                           more) or pull (owners fetch rows; no receive buffer)\n"
            "  --initial-capacity-factor F, --capacity-growth-factor G\n"
            "                           push: start at F x T*K rows, grow by G (0 = 1.25)\n"
            "  --swiglu-limit L         0 = off (default)\n"
            "  --replicas R             hot-expert replicas: R guest slots per rank (0 = off)\n"
            "  --routing R              balanced | zero | skew | single (balanced)\n"
            "  --schedule S             O1 (default: one fused launch per direction on the\n"
            "                           multicore executor) or O0 (host-scheduled phases)\n"
            "  --workers W              threads per rank (0 = cores / ranks; O1 splits them into\n"
            "                           cube and vector workers, MEGAMOE_CUBE_WORKERS/_VECTOR_)\n"
            "  --iters N --warmup N     timed iterations (5) after warm-up ones (1)\n"
            "  --seed S                 problem seed (1)\n"
            "  --verify auto|yes|no     compare with the fp32 reference (auto: unless it would\n"
            "                           take more than ~2 minutes)\n"
            "  --timeout S              stop the ranks after S seconds (600)\n"
            "  --hosts H                put the ranks on H simulated hosts, in blocks (megamoe\n"
            "                           launch --hosts; needs root; docs/multinode.md)\n"
            "Exit status: 0 verified (or verification skipped), 1 mismatch or failure, 2 usage.\n");
}

/* Seconds the plain fp32 reference needs for this job (measured ~3 GFLOP/s, fwd + bwd). */
static double mm_reference_seconds(const mm_moe_job_opts_t *o)
{
    return 36.0 * (double)o->ranks * (double)o->T * (double)o->K * (double)o->H *
           (double)o->I / 3.0e9;
}

static int mm_run_child(mm_moe_job_opts_t *o, const char *dir)
{
    mm_moe_job_result_t r;
    int rc = mm_moe_job_rank(o, &r);
    char path[512];
    snprintf(path, sizeof path, "%s/rank%d.txt", dir, r.rank);
    if (mm_moe_job_write(path, &r) != 0) {
        fprintf(stderr, "megamoe run: cannot write %s\n", path);
        return 1;
    }
    return rc; /* the parent prints r.error */
}

static void mm_run_report(const mm_moe_job_opts_t *o, const mm_moe_job_result_t *res)
{
    const int n = o->ranks;
    const mm_moe_job_result_t *r0 = &res[0];
    printf("\nper-phase wall time, ms per iteration (mean of %d)\n", o->iters);
    printf("  %-14s", "phase");
    for (int r = 0; r < n; r++) printf(" %9s%-2d", "rank ", r);
    printf("\n");
    double fwd[64] = {0}, bwd[64] = {0};
    for (int i = 0; i < r0->n_phases; i++) {
        printf("  %-14s", r0->phase[i]);
        for (int r = 0; r < n; r++) {
            double ms = i < res[r].n_phases ? res[r].phase_s[i] * 1e3 : NAN;
            printf(" %11.3f", ms);
            if (r < 64) *(strncmp(r0->phase[i], "fwd", 3) == 0 ? &fwd[r] : &bwd[r]) += ms;
        }
        printf("\n");
    }
    printf("  %-14s", "forward");
    for (int r = 0; r < n; r++) printf(" %11.3f", r < 64 ? fwd[r] : NAN);
    printf("\n  %-14s", "backward");
    for (int r = 0; r < n; r++) printf(" %11.3f", r < 64 ? bwd[r] : NAN);
    printf("\n  %-14s", "rows received");
    for (int r = 0; r < n; r++) printf(" %11lld", (long long)res[r].recv_rows);
    printf("\n");
    if (res[0].replica_slots > 0)
        printf("replicas: %d guest slot%s per rank; last forward: %d in use, %lld rows moved, "
               "slowest rank %lld -> %lld rows\n",
               res[0].replica_slots, res[0].replica_slots == 1 ? "" : "s", res[0].guests,
               (long long)res[0].rows_moved, (long long)res[0].max_rows_plain,
               (long long)res[0].max_rows);

    double t = 0, tf = 0, tb = 0;
    for (int r = 0; r < n; r++) { /* the job takes as long as its slowest rank */
        if (res[r].iter_median_s > t) t = res[r].iter_median_s;
        if (res[r].fwd_median_s > tf) tf = res[r].fwd_median_s;
        if (res[r].bwd_median_s > tb) tb = res[r].bwd_median_s;
    }
    double tokens = 0; /* every rank's mean tokens per call (T, or the per-call counts) */
    for (int r = 0; r < n; r++) tokens += res[r].tokens;
    double flops = mm_moe_flops(1, 1, o->H, o->I, o->K) * tokens;
    if (o->max_tokens > 0)
        printf("\ntokens per call (mean of the timed calls): %.1f per rank, %.0f in all\n",
               tokens / n, tokens);
    printf("\nforward+backward: %.3f ms median (forward %.3f ms, backward %.3f ms), slowest rank\n",
           t * 1e3, tf * 1e3, tb * 1e3);
    printf("throughput: %.0f tokens/s forward+backward (%.0f tokens/s forward), %.3f TFLOP/s "
           "(%.3f per rank)\n",
           tokens / t, tokens / tf, flops / t * 1e-12, flops / t * 1e-12 / n);
}

static int mm_run_verdict(const mm_moe_job_opts_t *o, const mm_moe_job_result_t *res)
{
    if (!res[0].verified) {
        printf("\nverification: skipped (--verify no, or the fp32 reference would take ~%.0f s; "
               "--verify yes forces it)\n",
               mm_reference_seconds(o));
        return 0;
    }
    const int clamp = o->swiglu_limit > 0 && isfinite(o->swiglu_limit);
    printf("\nverification (docs/moe.md \"Accuracy and verification\"): every element within rtol 2e-2\n"
           "and atol 2e-3 x scale of the reference with bf16 intermediates (scale = max(1, max|ref|));\n"
           "and against the fp32 oracle relative L2 <= 1%% and max|err| <= 2%% of max|ref|%s\n",
           clamp ? " (reported,\nnot binding: the SwiGLU clamp's gradient jumps at the limit)" : "");
    printf("  %-22s %4s %9s %14s %11s %7s %10s  %s\n", "tensor", "rank", "rel L2", "maxerr/maxref",
           "elementwise", "scale", "atol 2e-3", "verdict");
    int ok = 1;
    for (int r = 0; r < o->ranks; r++)
        for (int i = 0; i < res[r].n_checks; i++) {
            const mm_moe_job_check_t *c = &res[r].checks[i];
            printf("  %-22s %4d %8.3f%% %13.3f%% %10.2f%% %7.2f %9.2f%%  %s\n", c->name, r,
                   100 * c->rel_l2, 100 * c->rel_max, 100 * c->elementwise, c->scale,
                   100 * c->elementwise_abs, c->pass ? "ok" : "MISMATCH");
            ok &= c->pass;
        }
    printf("\n%s\n", ok ? "PASSED: output and every gradient match the reference"
                        : "FAILED: results differ from the reference");
    return ok ? 0 : 1;
}

/* The layer's shape rules (docs/moe.md "Semantics"), checked before any rank starts so that a
 * bad combination is a usage error naming the option, not a failure of every rank. */
static int mm_run_check_shape(const mm_moe_job_opts_t *o)
{
    const char *bad = NULL;
    char msg[256];
    mm_tokens_dist_t d;
    if (o->tokens_dist[0] && o->max_tokens == 0) {
        snprintf(msg, sizeof msg, "--tokens-dist needs --max-tokens (a layer with per-call "
                 "token counts)");
        bad = msg;
    } else if (o->tokens_dist[0] && mm_tokens_parse("--tokens-dist", o->tokens_dist, &d) == 0 &&
               mm_tokens_max(&d) > o->max_tokens) {
        snprintf(msg, sizeof msg, "--tokens-dist %s reaches %lld tokens, more than --max-tokens "
                 "%lld", o->tokens_dist, (long long)mm_tokens_max(&d), (long long)o->max_tokens);
        bad = msg;
    } else if (o->max_tokens == 0 && o->T % 128 != 0) {
        snprintf(msg, sizeof msg, "--tokens %lld must be a multiple of 128", (long long)o->T);
        bad = msg;
    } else if (o->E % o->ranks != 0) {
        snprintf(msg, sizeof msg, "--experts %lld must be a multiple of --ranks %d",
                 (long long)o->E, o->ranks);
        bad = msg;
    } else if (o->K > o->E) {
        snprintf(msg, sizeof msg, "--top-k %lld must be at most --experts %lld", (long long)o->K,
                 (long long)o->E);
        bad = msg;
    } else if (o->capacity_factor != 0 && o->capacity_factor < 1) {
        snprintf(msg, sizeof msg, "--capacity-factor %g must be 0 (lossless) or >= 1",
                 o->capacity_factor);
        bad = msg;
    } else if (o->hosts > 0 && o->ranks % o->hosts != 0) {
        snprintf(msg, sizeof msg, "--ranks %d must be a multiple of --hosts %d", o->ranks, o->hosts);
        bad = msg;
    } else if ((o->initial_capacity_factor != 0 && o->initial_capacity_factor < 1) ||
               (o->capacity_growth_factor != 0 && o->capacity_growth_factor < 1)) {
        snprintf(msg, sizeof msg, "--initial-capacity-factor and --capacity-growth-factor must "
                 "be 0 (1.25) or >= 1");
        bad = msg;
    } else if ((o->initial_capacity_factor != 0 || o->capacity_growth_factor != 0) &&
               strcmp(o->dispatch_mode, "push") != 0) {
        snprintf(msg, sizeof msg, "--initial-capacity-factor and --capacity-growth-factor need "
                 "--dispatch-mode push");
        bad = msg;
    } else if (o->capacity_factor != 0 && o->dispatch_mode[0]) {
        snprintf(msg, sizeof msg, "--capacity-factor (a fixed capacity) and --dispatch-mode "
                 "cannot be combined");
        bad = msg;
    } else if (strchr(o->replicas, ',') != NULL) {
        snprintf(msg, sizeof msg, "--replicas takes one value for megamoe run (lists are for "
                 "megamoe bench layer)");
        bad = msg;
    } else if (strcmp(o->schedule, "O0") != 0 && strcmp(o->schedule, "O1") != 0) {
        snprintf(msg, sizeof msg, "--schedule must be O0 or O1, got '%s'", o->schedule);
        bad = msg;
    }
    if (bad == NULL) return 0;
    fprintf(stderr, "megamoe run: %s\n", bad);
    return 2;
}

int mm_cmd_run(int argc, char **argv)
{
    mm_moe_job_opts_t o;
    mm_moe_job_defaults(&o);
    const char *job_dir = NULL;
    int verify_auto = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            mm_run_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--job-dir") && i + 1 < argc) {
            job_dir = argv[++i];
            continue;
        }
        if (!strcmp(argv[i], "--verify") && i + 1 < argc && !strcmp(argv[i + 1], "auto")) {
            verify_auto = 1;
            i++;
            continue;
        }
        if (!strcmp(argv[i], "--verify")) verify_auto = 0;
        int rc = mm_moe_job_parse_arg(&o, argc, argv, &i);
        if (rc == 0) {
            fprintf(stderr, "megamoe run: unknown option '%s'\n", argv[i]);
            mm_run_usage(stderr);
            return 2;
        }
        if (rc < 0) return 2;
    }
    int rc = mm_cli_check_config("run");
    if (rc) return rc;
    if (job_dir) return mm_run_child(&o, job_dir);
    if ((rc = mm_run_check_shape(&o)) != 0) return rc;
    if (o.max_tokens > 0) o.T = o.max_tokens; /* the problem's rows per rank: T_cap */

    if (verify_auto) o.verify = mm_reference_seconds(&o) <= 120.0;
    char cap[64];
    int64_t rows = megamoe_experts_capacity_rows(o.ranks, o.T, o.K, o.capacity_factor);
    if (!strcmp(o.dispatch_mode, "pull"))
        snprintf(cap, sizeof cap, "none (dispatch mode pull)");
    else if (!strcmp(o.dispatch_mode, "push"))
        snprintf(cap, sizeof cap, "push, from %g x T*K growing by %g",
                 o.initial_capacity_factor ? o.initial_capacity_factor : 1.25,
                 o.capacity_growth_factor ? o.capacity_growth_factor : 1.25);
    else if (o.capacity_factor == 0)
        snprintf(cap, sizeof cap, "lossless, %lld rows", (long long)rows);
    else snprintf(cap, sizeof cap, "factor %g, %lld rows", o.capacity_factor, (long long)rows);
    megamoe_host_info_t host;
    megamoe_host_info(&host);
    char where[48] = "";
    if (o.hosts > 0) snprintf(where, sizeof where, " on %d simulated hosts", o.hosts);
    printf("megamoe run: MegaMoE forward+backward, %d ranks%s, schedule %s, %s\n", o.ranks, where,
           o.schedule, host.cpu);
    char tokens[160];
    if (o.max_tokens > 0)
        snprintf(tokens, sizeof tokens, "T_cap=%lld (per-call counts %s)", (long long)o.T,
                 o.tokens_dist[0] ? o.tokens_dist : "uniform:0-T_cap");
    else snprintf(tokens, sizeof tokens, "T=%lld", (long long)o.T);
    printf("shape per rank: %s H=%lld I=%lld E=%lld K=%lld; routing %s; receive capacity %s; "
           "seed %llu\n",
           tokens, (long long)o.H, (long long)o.I, (long long)o.E, (long long)o.K,
           mm_route_name(o.route), cap, (unsigned long long)o.seed);
    printf("%d timed iterations after %d warm-up; verification %s\n", o.iters, o.warmup,
           o.verify ? "on" : "off");
    fflush(stdout);

    mm_moe_job_result_t *res = calloc((size_t)o.ranks, sizeof *res);
    if (res == NULL) return 1;
    const char *sub[] = {"run", NULL};
    rc = mm_moe_job_launch(&o, sub, res);
    for (int r = 0; r < o.ranks; r++)
        if (res[r].error[0]) fprintf(stderr, "megamoe run: rank %d: %s\n", r, res[r].error);
    if (rc != 0) {
        fprintf(stderr, "megamoe run: the job failed (status %d)\n", rc);
        free(res);
        return 1;
    }
    printf("workers per rank: %d\n", res[0].workers);
    mm_run_report(&o, res);
    rc = mm_run_verdict(&o, res);
    free(res);
    return rc;
}
