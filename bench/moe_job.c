/* A multi-rank MegaMoeExperts job (see moe_job.h). Public headers only. */
#include "moe_job.h"
#include "moe_verify.h"

#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "megamoe/megamoe.h"

#include "bench_util.h"
#include "moe_tokens.h"

void mm_moe_job_defaults(mm_moe_job_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->ranks = 2;
    o->T = 1024;
    o->H = 512;
    o->I = 128;
    o->E = 4;
    o->K = 2;
    snprintf(o->schedule, sizeof o->schedule, "O1");
    o->route = MM_ROUTE_BALANCED;
    o->seed = 1;
    o->iters = 5;
    o->warmup = 1;
    o->verify = 1;
    o->progress_fd = -1;
    o->timeout_s = 600;
}

void mm_moe_job_to_args(const mm_moe_job_opts_t *o, char **argv, int *argc_p, char *store,
                        size_t store_len)
{
    size_t used = 0;
    int n = *argc_p;
#define MM_ARG(name, fmt, value)                                                           \
    do {                                                                                   \
        argv[n++] = (char *)(name);                                                        \
        int w_ = snprintf(store + used, store_len - used, fmt, value);                     \
        argv[n++] = store + used;                                                          \
        used += (size_t)w_ + 1;                                                            \
    } while (0)
    MM_ARG("--ranks", "%d", o->ranks);
    MM_ARG("--tokens", "%lld", (long long)o->T);
    MM_ARG("--hidden", "%lld", (long long)o->H);
    MM_ARG("--intermediate", "%lld", (long long)o->I);
    MM_ARG("--experts", "%lld", (long long)o->E);
    MM_ARG("--top-k", "%lld", (long long)o->K);
    MM_ARG("--capacity-factor", "%.17g", o->capacity_factor);
    MM_ARG("--dispatch-mode", "%s", o->dispatch_mode[0] ? o->dispatch_mode : "none");
    MM_ARG("--initial-capacity-factor", "%.17g", o->initial_capacity_factor);
    MM_ARG("--capacity-growth-factor", "%.17g", o->capacity_growth_factor);
    MM_ARG("--swiglu-limit", "%.9g", (double)o->swiglu_limit);
    MM_ARG("--schedule", "%s", o->schedule);
    MM_ARG("--workers", "%d", o->workers);
    MM_ARG("--routing", "%s", mm_route_name(o->route));
    MM_ARG("--seed", "%llu", (unsigned long long)o->seed);
    MM_ARG("--iters", "%d", o->iters);
    MM_ARG("--warmup", "%d", o->warmup);
    MM_ARG("--verify", "%s", o->verify ? "yes" : "no");
    MM_ARG("--progress-fd", "%d", o->progress_fd);
    MM_ARG("--profile-variant", "%s", o->profile_variant ? "yes" : "no");
    MM_ARG("--replicas", "%s", o->replicas[0] ? o->replicas : "0");
    if (o->max_tokens > 0) MM_ARG("--max-tokens", "%lld", (long long)o->max_tokens);
    if (o->tokens_dist[0]) MM_ARG("--tokens-dist", "%s", o->tokens_dist);
    MM_ARG("--training-step", "%s", o->training_step ? "yes" : "no");
    if (o->dump_dir[0]) MM_ARG("--dump-dir", "%s", o->dump_dir);
#undef MM_ARG
    *argc_p = n;
}

int mm_moe_job_replicas(const char *list, int *out, int max)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%s", list && list[0] ? list : "0");
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        long v = strtol(tok, &end, 10);
        if (*end || end == tok || v < 0 || v > 64 || n >= max) {
            fprintf(stderr, "megamoe: --replicas takes integers in [0, 64] (guest slots per "
                            "rank), at most %d, comma-separated; got '%s'\n",
                    max, list);
            return -1;
        }
        out[n++] = (int)v;
    }
    return n;
}

static int mm_parse_i64(const char *opt, const char *text, int64_t lo, int64_t hi, int64_t *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(text, &end, 10);
    if (errno || *end || end == text || x < lo || x > hi) {
        fprintf(stderr, "megamoe: %s must be an integer in [%lld, %lld], got '%s'\n", opt,
                (long long)lo, (long long)hi, text);
        return -1;
    }
    *v = x;
    return 0;
}

int mm_moe_job_parse_arg(mm_moe_job_opts_t *o, int argc, char **argv, int *i)
{
    const char *opt = argv[*i];
    static const char *const known[] = {
        "--ranks", "-n", "--tokens", "--hidden", "--intermediate", "--experts", "--top-k",
        "--capacity-factor", "--swiglu-limit", "--schedule", "--workers", "--routing", "--seed",
        "--iters", "--warmup", "--verify", "--progress-fd", "--timeout", "--profile-variant",
        "--hosts", "--dispatch-mode", "--initial-capacity-factor", "--capacity-growth-factor",
        "--replicas", "--max-tokens", "--tokens-dist", "--training-step", "--dump-dir"};
    int found = 0;
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) found |= strcmp(opt, known[k]) == 0;
    if (!found) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "megamoe: %s needs a value\n", opt);
        return -1;
    }
    const char *val = argv[++*i];
    int64_t v = 0;
    int rc = 0;
    if (!strcmp(opt, "--ranks") || !strcmp(opt, "-n")) {
        rc = mm_parse_i64(opt, val, 1, 64, &v);
        o->ranks = (int)v;
    } else if (!strcmp(opt, "--tokens")) {
        rc = mm_parse_i64(opt, val, 128, 1 << 24, &v);
        o->T = v;
    } else if (!strcmp(opt, "--max-tokens")) {
        rc = mm_parse_i64(opt, val, 1, 1 << 24, &v);
        o->max_tokens = v;
    } else if (!strcmp(opt, "--tokens-dist")) {
        mm_tokens_dist_t d;
        if (strlen(val) >= sizeof o->tokens_dist || mm_tokens_parse(opt, val, &d) != 0) return -1;
        snprintf(o->tokens_dist, sizeof o->tokens_dist, "%s", val);
    } else if (!strcmp(opt, "--hidden")) {
        rc = mm_parse_i64(opt, val, 1, 1 << 20, &v);
        o->H = v;
    } else if (!strcmp(opt, "--intermediate")) {
        rc = mm_parse_i64(opt, val, 1, 1 << 20, &v);
        o->I = v;
    } else if (!strcmp(opt, "--experts")) {
        rc = mm_parse_i64(opt, val, 1, 1 << 16, &v);
        o->E = v;
    } else if (!strcmp(opt, "--top-k")) {
        rc = mm_parse_i64(opt, val, 1, 1 << 16, &v);
        o->K = v;
    } else if (!strcmp(opt, "--workers")) {
        rc = mm_parse_i64(opt, val, 0, 1024, &v);
        o->workers = (int)v;
    } else if (!strcmp(opt, "--seed")) {
        rc = mm_parse_i64(opt, val, 0, INT64_MAX, &v);
        o->seed = (uint64_t)v;
    } else if (!strcmp(opt, "--iters")) {
        rc = mm_parse_i64(opt, val, 1, MM_JOB_MAX_ITERS, &v);
        o->iters = (int)v;
    } else if (!strcmp(opt, "--warmup")) {
        rc = mm_parse_i64(opt, val, 0, 1000, &v);
        o->warmup = (int)v;
    } else if (!strcmp(opt, "--hosts")) {
        rc = mm_parse_i64(opt, val, 1, 64, &v);
        o->hosts = (int)v;
    } else if (!strcmp(opt, "--progress-fd")) {
        rc = mm_parse_i64(opt, val, -1, 1 << 20, &v);
        o->progress_fd = (int)v;
    } else if (!strcmp(opt, "--replicas")) {
        int tmp[MM_JOB_MAX_VARIANTS];
        if (strlen(val) >= sizeof o->replicas || mm_moe_job_replicas(val, tmp, MM_JOB_MAX_VARIANTS) < 0)
            return -1;
        snprintf(o->replicas, sizeof o->replicas, "%s", val);
    } else if (!strcmp(opt, "--dispatch-mode")) {
        if (strcmp(val, "push") != 0 && strcmp(val, "pull") != 0 && strcmp(val, "none") != 0) {
            fprintf(stderr, "megamoe: --dispatch-mode must be push, pull or none, got '%s'\n",
                    val);
            return -1;
        }
        snprintf(o->dispatch_mode, sizeof o->dispatch_mode, "%s",
                 strcmp(val, "none") == 0 ? "" : val);
    } else if (!strcmp(opt, "--capacity-factor") || !strcmp(opt, "--swiglu-limit") ||
               !strcmp(opt, "--timeout") || !strcmp(opt, "--initial-capacity-factor") ||
               !strcmp(opt, "--capacity-growth-factor")) {
        char *end;
        double d = strtod(val, &end);
        if (*end || end == val || !isfinite(d) || d < 0) {
            fprintf(stderr, "megamoe: %s must be a finite number >= 0, got '%s'\n", opt, val);
            return -1;
        }
        if (!strcmp(opt, "--capacity-factor")) o->capacity_factor = d;
        else if (!strcmp(opt, "--initial-capacity-factor")) o->initial_capacity_factor = d;
        else if (!strcmp(opt, "--capacity-growth-factor")) o->capacity_growth_factor = d;
        else if (!strcmp(opt, "--swiglu-limit")) o->swiglu_limit = (float)d;
        else o->timeout_s = d;
    } else if (!strcmp(opt, "--schedule")) {
        snprintf(o->schedule, sizeof o->schedule, "%s", val);
    } else if (!strcmp(opt, "--dump-dir")) {
        if (strlen(val) >= sizeof o->dump_dir) {
            fprintf(stderr, "megamoe: --dump-dir is longer than %zu bytes\n", sizeof o->dump_dir - 1);
            return -1;
        }
        snprintf(o->dump_dir, sizeof o->dump_dir, "%s", val);
    } else if (!strcmp(opt, "--routing")) {
        int r = mm_route_parse(val);
        if (r < 0 || r == MM_ROUTE_FLOOD) {
            fprintf(stderr, "megamoe: --routing must be balanced, zero, skew or single, got '%s'\n",
                    val);
            return -1;
        }
        o->route = (mm_route_pattern_t)r;
    } else if (!strcmp(opt, "--verify") || !strcmp(opt, "--profile-variant") ||
               !strcmp(opt, "--training-step")) {
        int *flag = !strcmp(opt, "--verify")          ? &o->verify
                    : !strcmp(opt, "--training-step") ? &o->training_step
                                                      : &o->profile_variant;
        if (!strcmp(val, "yes") || !strcmp(val, "1")) *flag = 1;
        else if (!strcmp(val, "no") || !strcmp(val, "0")) *flag = 0;
        else {
            fprintf(stderr, "megamoe: %s must be yes or no, got '%s'\n", opt, val);
            return -1;
        }
    }
    return rc < 0 ? -1 : 1;
}

/* ---- child side ---------------------------------------------------------------------------- */

double mm_moe_job_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

megamoe_experts_params_t mm_moe_job_layer_params(const mm_moe_job_opts_t *o)
{
    megamoe_experts_params_t p = megamoe_experts_params_default();
    p.local_num_tokens = o->max_tokens > 0 ? 0 : o->T;
    p.max_local_num_tokens = o->max_tokens;
    p.hidden_size = o->H;
    p.intermediate_size = o->I;
    p.num_experts = o->E;
    p.top_k = o->K;
    p.schedule = o->schedule;
    p.workers = o->workers;
    return p;
}

void mm_moe_job_size_heap(megamoe_comm_params_t *cp, uint64_t need)
{
    if (getenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE") == NULL)
        cp->heap_size = (need + (64ull << 20) - 1) / (64ull << 20) * (64ull << 20);
}

static void mm_progress(int fd, int done, int total, const char *what)
{
    if (fd < 0) return;
    char line[160];
    int width = 30, fill = total ? done * width / total : width;
    int n;
    if (isatty(fd)) {
        n = snprintf(line, sizeof line, "\r  [%-*.*s] %d/%d %s%s", width, fill,
                     "##############################", done, total, what,
                     done == total ? "\n" : "");
    } else {
        if (done != total && done % (total / 4 > 0 ? total / 4 : 1) != 0) return;
        n = snprintf(line, sizeof line, "  %d/%d %s\n", done, total, what);
    }
    if (n > 0) {
        ssize_t w = write(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        (void)w;
    }
}

/* One tensor of the layer, by the rule of moe_verify.h. */
static void mm_check(mm_moe_job_result_t *r, int clamp, const char *name, const void *got,
                     int got_bf16, const float *want, const float *want16, size_t n)
{
    if (r->n_checks >= 8) return;
    mm_moe_job_check_t *c = &r->checks[r->n_checks++];
    snprintf(c->name, sizeof c->name, "%s", name);
    mm_verify_t v;
    /* the fp32 oracle's relative L2 / max bounds are statistics: they decide from 1024 values
     * on (a call of a few tokens has a few router-weight gradients, docs/moe.md) */
    mm_verify(got, got_bf16, want, want16, n, clamp || n < 1024, &v);
    c->rel_l2 = v.rel_l2;
    c->rel_max = v.rel_max;
    c->elementwise = v.elementwise;
    c->elementwise_abs = v.elementwise_abs;
    c->scale = v.scale;
    c->oracle_ok = v.oracle_ok;
    c->pass = v.pass;
}

/* The reference results of the whole job (every rank's tokens, every expert): out, grad
 * hidden, grad topk_weights, grad gate_up, grad down; fp32 oracle or bf16 intermediates.
 * counts (per-call token counts, else NULL): rank r passed its first counts[r] rows, so the
 * output gradient of the others is zeroed (their contributions to the weight gradients go;
 * their rows are not compared). */
static int mm_job_reference(const mm_moe_job_opts_t *o, const mm_moe_problem_t *P, int ep,
                            int bf16_intermediates, const int64_t *counts, float *set[5])
{
    const size_t N = (size_t)ep * (size_t)o->T, H = (size_t)o->H, I = (size_t)o->I;
    const size_t E = (size_t)o->E, K = (size_t)o->K;
    const size_t n[5] = {N * H, N * H, N * K, E * H * 2 * I, E * I * H};
    for (int i = 0; i < 5; i++)
        if ((set[i] = malloc(n[i] * sizeof(float))) == NULL) return -1;
    megamoe_reference_shape_t s = {ep, o->T, o->H, o->I, o->E, o->K};
    megamoe_reference_params_t rp = megamoe_reference_params_default();
    rp.swiglu_limit = o->swiglu_limit;
    rp.hidden_dtype = rp.weight_dtype = rp.grad_dtype = MEGAMOE_DTYPE_BF16;
    rp.bf16_intermediates = bf16_intermediates;
    uint16_t *grad = NULL;
    if (counts != NULL) {
        if ((grad = malloc(N * H * 2)) == NULL) return -1;
        memcpy(grad, P->grad_out, N * H * 2);
        for (int r = 0; r < ep; r++)
            memset(grad + ((size_t)r * (size_t)o->T + (size_t)counts[r]) * H, 0,
                   (size_t)(o->T - counts[r]) * H * 2);
    }
    int rc = 0;
    if (megamoe_reference_forward(&s, &rp, P->hidden, P->ids, P->probs, P->gate_up, P->down,
                                  set[0]) != MEGAMOE_OK ||
        megamoe_reference_backward(&s, &rp, grad ? grad : P->grad_out, P->hidden, P->ids,
                                   P->probs, P->gate_up, P->down, set[1], set[2], set[3],
                                   set[4]) != MEGAMOE_OK)
        rc = -1;
    free(grad);
    return rc;
}

#define MM_JOB_FAIL(...)                                                                   \
    do {                                                                                   \
        snprintf(r->error, sizeof r->error, __VA_ARGS__);                                  \
        goto out;                                                                          \
    } while (0)

void mm_moe_job_malloc_settings(void)
{
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
}

int mm_moe_job_rank(const mm_moe_job_opts_t *o, mm_moe_job_result_t *r)
{
    memset(r, 0, sizeof *r);
    mm_moe_job_malloc_settings();
    megamoe_comm_t *comm = NULL;
    megamoe_experts_t *x = NULL;
    mm_moe_problem_t P;
    memset(&P, 0, sizeof P);
    uint16_t *out = NULL, *gh = NULL, *g1 = NULL, *g2 = NULL;
    float *gp = NULL;
    double *it_s = NULL, *fw_s = NULL, *bw_s = NULL;
    float *ro = NULL, *ref[5] = {0}, *ref16[5] = {0};
    megamoe_status_t st;

    megamoe_experts_params_t p = mm_moe_job_layer_params(o);
    p.expert_capacity_factor = o->capacity_factor;
    p.dispatch_mode = o->dispatch_mode[0] ? o->dispatch_mode : NULL;
    int reps[MM_JOB_MAX_VARIANTS];
    p.replica_slots_per_rank = mm_moe_job_replicas(o->replicas, reps, MM_JOB_MAX_VARIANTS) > 0 ? reps[0] : 0;
    p.initial_capacity_factor = o->initial_capacity_factor;
    p.capacity_growth_factor = o->capacity_growth_factor;
    p.swiglu_limit = o->swiglu_limit;

    /* Heap sizing when the variable is unset: what this job's one resource group needs,
     * plus slack, rounded to 64 MiB (docs/moe.md). */
    megamoe_comm_params_t cp = megamoe_comm_params_default();
    mm_moe_job_size_heap(&cp, megamoe_experts_heap_bytes(&p, o->ranks) + (16ull << 20));
    if ((st = megamoe_comm_create(&cp, &comm)) != MEGAMOE_OK)
        MM_JOB_FAIL("creating the communicator: %s", megamoe_last_error());
    const int ep = megamoe_comm_size(comm), me = megamoe_comm_rank(comm);
    r->rank = me;
    r->ranks = ep;
    if (ep != o->ranks) MM_JOB_FAIL("expected %d ranks, the communicator has %d", o->ranks, ep);
    if (mm_moe_problem_create(&P, ep, o->T, o->H, o->I, o->E, o->K, o->route, o->seed) != 0)
        MM_JOB_FAIL("cannot build the problem (out of memory or invalid shapes)");
    if ((st = megamoe_experts_create(comm, &p, &x)) != MEGAMOE_OK)
        MM_JOB_FAIL("%s", megamoe_last_error());

    const int64_t T = o->T, H = o->H, I = o->I, K = o->K, L = o->E / ep;
    const size_t TH = (size_t)(T * H), W1 = (size_t)(L * H * 2 * I), W2 = (size_t)(L * I * H);
    /* per-call token counts: rank r passes the first count(call, r) rows of its T_cap */
    mm_tokens_dist_t dist;
    char dist_spec[128];
    snprintf(dist_spec, sizeof dist_spec, "%s", o->tokens_dist);
    if (o->max_tokens > 0 && !dist_spec[0])
        snprintf(dist_spec, sizeof dist_spec, "uniform:0-%lld", (long long)o->max_tokens);
    if (o->max_tokens > 0 && mm_tokens_parse("--tokens-dist", dist_spec, &dist) != 0)
        MM_JOB_FAIL("bad --tokens-dist '%s'", dist_spec);
    int64_t counts0[64];
    for (int r = 0; r < ep && r < 64; r++)
        counts0[r] = o->max_tokens > 0 ? mm_tokens_count(&dist, o->seed, 0, r) : T;
    r->tokens = 0;
    out = malloc(TH * 2);
    gh = malloc(TH * 2);
    gp = malloc((size_t)(T * K) * 4);
    g1 = malloc(W1 * 2);
    g2 = malloc(W2 * 2);
    int total = o->warmup + o->iters;
    it_s = calloc((size_t)o->iters, sizeof *it_s);
    fw_s = calloc((size_t)o->iters, sizeof *fw_s);
    bw_s = calloc((size_t)o->iters, sizeof *bw_s);
    if (!out || !gh || !gp || !g1 || !g2 || !it_s || !fw_s || !bw_s) MM_JOB_FAIL("out of memory");

    megamoe_experts_input_t in = megamoe_experts_input_default();
    in.hidden_states = P.hidden + (size_t)me * TH;
    in.topk_ids = P.ids + (size_t)(me * T * K);
    in.topk_weights = P.probs + (size_t)(me * T * K);
    megamoe_experts_weights_t w = {P.gate_up + (size_t)me * W1, P.down + (size_t)me * W2, 1};
    megamoe_experts_grads_t g = {gh, gp, g1, g2, MEGAMOE_DTYPE_BF16};
    const uint16_t *dout = P.grad_out + (size_t)me * TH;
    double t_start = mm_moe_job_now();
    for (int it = 0; it < total; it++) {
        if (it == o->warmup) megamoe_experts_reset_timing(x);
        megamoe_experts_saved_t *sv = NULL;
        if (o->max_tokens > 0) in.num_tokens = mm_tokens_count(&dist, o->seed, it, me);
        const int64_t nt = o->max_tokens > 0 ? in.num_tokens : T; /* this call's rows */
        if (it >= o->warmup) r->tokens += (double)nt / o->iters;
        double t0 = mm_moe_job_now();
        if ((st = megamoe_experts_forward(x, &w, &in, out, &sv)) != MEGAMOE_OK)
            MM_JOB_FAIL("forward: %s", megamoe_last_error());
        double t1 = mm_moe_job_now();
        st = megamoe_experts_backward(x, sv, &w, dout, &g);
        megamoe_experts_saved_destroy(sv);
        if (st != MEGAMOE_OK) MM_JOB_FAIL("backward: %s", megamoe_last_error());
        double t2 = mm_moe_job_now();
        if (it >= o->warmup) {
            it_s[it - o->warmup] = t2 - t0;
            fw_s[it - o->warmup] = t1 - t0;
            bw_s[it - o->warmup] = t2 - t1;
        }
        if (me == 0 && mm_moe_job_now() - t_start > 1.0) mm_progress(o->progress_fd, it + 1, total, "iterations");
        if (it == 0)
            for (size_t i = 0; i < (size_t)(nt * H); i++) r->checksum += megamoe_bf16_to_fp32(out[i]);
        if (it == 0 && o->verify) { /* keep the first results for the check (T_cap rows) */
            ro = calloc(1, TH * 2 + TH * 2 + (size_t)(T * K) * 4 + W1 * 2 + W2 * 2);
            if (ro == NULL) MM_JOB_FAIL("out of memory");
            char *q = (char *)ro;
            memcpy(q, out, (size_t)(nt * H) * 2);
            memcpy(q + TH * 2, gh, (size_t)(nt * H) * 2);
            memcpy(q + TH * 4, gp, (size_t)(nt * K) * 4);
            memcpy(q + TH * 4 + (size_t)(T * K) * 4, g1, W1 * 2);
            memcpy(q + TH * 4 + (size_t)(T * K) * 4 + W1 * 2, g2, W2 * 2);
        }
    }
    megamoe_experts_timing_t tm;
    megamoe_experts_info_t info;
    megamoe_experts_get_timing(x, &tm);
    megamoe_experts_get_info(x, &info);
    r->workers = info.workers;
    r->capacity = info.capacity;
    r->recv_rows = info.last_recv_rows;
    r->replica_slots = info.replica_slots;
    r->guests = info.last_guests;
    r->rows_moved = info.last_rows_moved;
    r->max_rows_plain = info.last_max_rows_plain;
    r->max_rows = info.last_max_rows;
    r->n_phases = tm.count < MM_JOB_MAX_PHASES ? tm.count : MM_JOB_MAX_PHASES;
    for (int i = 0; i < r->n_phases; i++) {
        snprintf(r->phase[i], sizeof r->phase[i], "%s", tm.name[i]);
        r->phase_s[i] = tm.seconds[i] / (double)o->iters;
    }
    r->iter_median_s = mm_bench_median_of(it_s, o->iters);
    r->iter_min_s = it_s[0];
    r->fwd_median_s = mm_bench_median_of(fw_s, o->iters);
    r->bwd_median_s = mm_bench_median_of(bw_s, o->iters);
    if ((st = megamoe_experts_close(x)) != MEGAMOE_OK) MM_JOB_FAIL("close: %s", megamoe_last_error());

    if (o->verify) {
        if (me == 0 && o->progress_fd >= 0 && isatty(o->progress_fd))
            mm_progress(o->progress_fd, 0, 1, "verifying against the fp32 reference");
        const int64_t *cnt = o->max_tokens > 0 ? counts0 : NULL;
        if (ep > 64 && cnt) MM_JOB_FAIL("verification of per-call counts supports 64 ranks");
        if (mm_job_reference(o, &P, ep, 0, cnt, ref) != 0 ||
            mm_job_reference(o, &P, ep, 1, cnt, ref16) != 0)
            MM_JOB_FAIL("reference: %s", megamoe_last_error()[0] ? megamoe_last_error()
                                                                 : "out of memory");
        const char *q = (const char *)ro;
        const int clamp = o->swiglu_limit > 0 && isfinite(o->swiglu_limit);
        const size_t off[5] = {(size_t)me * TH, (size_t)me * TH, (size_t)(me * T * K),
                               (size_t)me * W1, (size_t)me * W2};
        const int64_t n0 = me < 64 ? counts0[me] : T; /* the verified call's rows here */
        mm_check(r, clamp, "output", q, 1, ref[0] + off[0], ref16[0] + off[0], (size_t)(n0 * H));
        mm_check(r, clamp, "grad hidden_states", q + TH * 2, 1, ref[1] + off[1], ref16[1] + off[1],
                 (size_t)(n0 * H));
        mm_check(r, clamp, "grad topk_weights", q + TH * 4, 0, ref[2] + off[2], ref16[2] + off[2],
                 (size_t)(n0 * K));
        mm_check(r, clamp, "grad gate_up_weight", q + TH * 4 + (size_t)(T * K) * 4, 1, ref[3] + off[3],
                 ref16[3] + off[3], W1);
        mm_check(r, clamp, "grad down_weight", q + TH * 4 + (size_t)(T * K) * 4 + W1 * 2, 1,
                 ref[4] + off[4], ref16[4] + off[4], W2);
        r->verified = 1;
        if (me == 0 && o->progress_fd >= 0 && isatty(o->progress_fd))
            mm_progress(o->progress_fd, 1, 1, "verified");
    }
out:
    if (x) {
        if (r->error[0]) megamoe_experts_close(x); /* collective; peers fail the same way */
        megamoe_experts_destroy(x);
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
    free(it_s);
    free(fw_s);
    free(bw_s);
    free(ro);
    for (int i = 0; i < 5; i++) {
        free(ref[i]);
        free(ref16[i]);
    }
    return r->error[0] ? 1 : 0;
}

/* ---- result files -------------------------------------------------------------------------- */

int mm_moe_job_write(const char *path, const mm_moe_job_result_t *r)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) return -1;
    fprintf(f, "replicas %d %d %lld %lld %lld\n", r->replica_slots, r->guests,
            (long long)r->rows_moved, (long long)r->max_rows_plain, (long long)r->max_rows);
    fprintf(f, "tokens %.17g\n", r->tokens);
    const struct mm_moe_job_dyn *d = &r->dyn;
    fprintf(f, "dyn %.9g %.9g %.9g %.9g %.9g %.9g %.9g %lld %lld\n", d->copy_median_s,
            d->work_median_s, d->rtt_s, d->recv_rows_mean, d->peak_gflops, d->copy_gbs,
            0.0, (long long)d->t_cap, (long long)d->t_fixed);
    for (int i = 0; i < r->n_variants; i++)
        fprintf(f, "dynvar %d %.9g %.9g %.17g\n", i, d->fwd_sum_s[i], d->iter_sum_s[i],
                d->tokens_sum[i]);
    fprintf(f, "rank %d\nranks %d\nworkers %d\ncapacity %lld\nrecv_rows %lld\n", r->rank,
            r->ranks, r->workers, (long long)r->capacity, (long long)r->recv_rows);
    fprintf(f, "iter %.9g %.9g %.9g %.9g\n", r->iter_median_s, r->iter_min_s, r->fwd_median_s,
            r->bwd_median_s);
    for (int i = 0; i < r->n_phases; i++) fprintf(f, "phase %s %.9g\n", r->phase[i], r->phase_s[i]);
    fprintf(f, "checksum %.17g\nverified %d\n", r->checksum, r->verified);
    for (int i = 0; i < r->n_checks; i++) {
        const mm_moe_job_check_t *c = &r->checks[i];
        /* names contain spaces: '|' on disk */
        char name[32];
        snprintf(name, sizeof name, "%s", c->name);
        for (char *s = name; *s; s++)
            if (*s == ' ') *s = '|';
        fprintf(f, "check %s %.9g %.9g %.9g %.9g %.9g %d %d\n", name, c->rel_l2, c->rel_max,
                c->elementwise, c->elementwise_abs, c->scale, c->oracle_ok, c->pass);
    }
    for (int i = 0; i < r->n_variants; i++)
        fprintf(f, "variant %s %.9g %.9g %.9g %.17g %.9g\n", r->variant[i].name,
                r->variant[i].iter_median_s, r->variant[i].fwd_median_s,
                r->variant[i].bwd_median_s, r->variant[i].checksum, r->variant[i].cpu_median_s);
    for (int i = 0; i < r->n_variants; i++)
        fprintf(f, "wire %s %.9g %.9g %.9g\n", r->variant[i].name, r->variant[i].wire_bytes,
                r->variant[i].wire_msgs, r->variant[i].wire_rtts);
    for (int i = 0; i < r->n_wait; i++)
        fprintf(f, "wait %s %.9g\n", r->wait_name[i], r->wait_share[i]);
    fprintf(f, "trace %llu %llu\n", (unsigned long long)r->trace_records,
            (unsigned long long)r->trace_dropped);
    fprintf(f, "memory %.6f %llu %llu %llu\n", r->peak_rss_mb, (unsigned long long)r->heap_reserved,
            (unsigned long long)r->heap_alloc_peak, (unsigned long long)r->heap_touched);
    if (r->error[0]) fprintf(f, "error %s\n", r->error);
    int rc = fclose(f);
    return rc == 0 ? 0 : -1;
}

int mm_moe_job_read(const char *path, mm_moe_job_result_t *r)
{
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        long long a, b;
        char name[64];
        double x, y, z, u, cpu;
        unsigned long long mem[3];
        int pass, oracle;
        long long tc = 0, tf = 0;
        double d1, d2, d3, d4, d5, d6, d7;
        int vi;
        if (sscanf(line, "tokens %lg", &x) == 1) r->tokens = x;
        else if (sscanf(line, "dyn %lg %lg %lg %lg %lg %lg %lg %lld %lld", &d1, &d2, &d3, &d4,
                        &d5, &d6, &d7, &tc, &tf) == 9) {
            r->dyn.copy_median_s = d1;
            r->dyn.work_median_s = d2;
            r->dyn.rtt_s = d3;
            r->dyn.recv_rows_mean = d4;
            r->dyn.peak_gflops = d5;
            r->dyn.copy_gbs = d6;
            r->dyn.t_cap = tc;
            r->dyn.t_fixed = tf;
        } else if (sscanf(line, "dynvar %d %lg %lg %lg", &vi, &d1, &d2, &d3) == 4 && vi >= 0 &&
                   vi < MM_JOB_MAX_VARIANTS) {
            r->dyn.fwd_sum_s[vi] = d1;
            r->dyn.iter_sum_s[vi] = d2;
            r->dyn.tokens_sum[vi] = d3;
        }
        else if (sscanf(line, "rank %lld", &a) == 1) r->rank = (int)a;
        else if (sscanf(line, "ranks %lld", &a) == 1) r->ranks = (int)a;
        else if (sscanf(line, "workers %lld", &a) == 1) r->workers = (int)a;
        else if (sscanf(line, "capacity %lld", &a) == 1) r->capacity = a;
        else if (sscanf(line, "recv_rows %lld", &b) == 1) r->recv_rows = b;
        else if (strncmp(line, "replicas ", 9) == 0) {
            long long m = 0, pl = 0, mx = 0;
            int rs = 0, gs = 0;
            if (sscanf(line, "replicas %d %d %lld %lld %lld", &rs, &gs, &m, &pl, &mx) == 5) {
                r->replica_slots = rs;
                r->guests = gs;
                r->rows_moved = m;
                r->max_rows_plain = pl;
                r->max_rows = mx;
            }
        }
        else if (sscanf(line, "iter %lg %lg %lg %lg", &x, &y, &z, &u) == 4) {
            r->iter_median_s = x;
            r->iter_min_s = y;
            r->fwd_median_s = z;
            r->bwd_median_s = u;
        } else if (sscanf(line, "phase %23s %lg", name, &x) == 2 && r->n_phases < MM_JOB_MAX_PHASES) {
            snprintf(r->phase[r->n_phases], sizeof r->phase[0], "%.23s", name);
            r->phase_s[r->n_phases++] = x;
        } else if (sscanf(line, "checksum %lg", &x) == 1) r->checksum = x;
        else if (sscanf(line, "verified %lld", &a) == 1) r->verified = (int)a;
        else if (sscanf(line, "check %31s %lg %lg %lg %lg %lg %d %d", name, &x, &y, &z, &u, &cpu,
                        &oracle, &pass) == 8 &&
                 r->n_checks < 8) {
            mm_moe_job_check_t *c = &r->checks[r->n_checks++];
            for (char *s = name; *s; s++)
                if (*s == '|') *s = ' ';
            snprintf(c->name, sizeof c->name, "%.31s", name);
            c->rel_l2 = x;
            c->rel_max = y;
            c->elementwise = z;
            c->elementwise_abs = u;
            c->scale = cpu;
            c->oracle_ok = oracle;
            c->pass = pass;
        } else if (sscanf(line, "variant %15s %lg %lg %lg %lg %lg", name, &x, &y, &z, &u, &cpu) ==
                       6 &&
                   r->n_variants < MM_JOB_MAX_VARIANTS) {
            mm_moe_job_variant_t *v = &r->variant[r->n_variants++];
            v->cpu_median_s = cpu;
            snprintf(v->name, sizeof v->name, "%.15s", name);
            v->iter_median_s = x;
            v->fwd_median_s = y;
            v->bwd_median_s = z;
            v->checksum = u;
        } else if (sscanf(line, "wire %15s %lg %lg %lg", name, &x, &y, &z) == 4) {
            for (int i = 0; i < r->n_variants; i++)
                if (strcmp(r->variant[i].name, name) == 0) {
                    r->variant[i].wire_bytes = x;
                    r->variant[i].wire_msgs = y;
                    r->variant[i].wire_rtts = z;
                }
        } else if (sscanf(line, "wait %15s %lg", name, &x) == 2 && r->n_wait < MM_JOB_MAX_WAIT) {
            snprintf(r->wait_name[r->n_wait], sizeof r->wait_name[0], "%.15s", name);
            r->wait_share[r->n_wait++] = x;
        } else if (sscanf(line, "memory %lg %llu %llu %llu", &x, &mem[0], &mem[1], &mem[2]) == 4) {
            r->peak_rss_mb = x;
            r->heap_reserved = mem[0];
            r->heap_alloc_peak = mem[1];
            r->heap_touched = mem[2];
        } else if (sscanf(line, "trace %lld %lld", &a, &b) == 2) {
            r->trace_records = (uint64_t)a;
            r->trace_dropped = (uint64_t)b;
        } else if (strncmp(line, "error ", 6) == 0) {
            snprintf(r->error, sizeof r->error, "%.511s", line + 6);
            r->error[strcspn(r->error, "\n")] = '\0';
        }
    }
    fclose(f);
    return 0;
}

/* ---- parent side --------------------------------------------------------------------------- */

int mm_moe_job_launch(const mm_moe_job_opts_t *o, const char *const *subcommand,
                      mm_moe_job_result_t *results)
{
    char dir[] = "/tmp/megamoe-job-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        fprintf(stderr, "megamoe: cannot create a temporary directory: %s\n", strerror(errno));
        return 1;
    }
    /* rank 0 draws progress on our stderr: a descriptor that survives both exec()s */
    mm_moe_job_opts_t co = *o;
    co.progress_fd = dup(STDERR_FILENO);
    const char *self = mm_bench_self_exe();
    char *argv[96], store[2048], nbuf[16], tbuf[32], hbuf[16];
    int n = 0;
    snprintf(nbuf, sizeof nbuf, "%d", o->ranks);
    snprintf(tbuf, sizeof tbuf, "%.0f", o->timeout_s);
    snprintf(hbuf, sizeof hbuf, "%d", o->hosts);
    argv[n++] = (char *)self;
    argv[n++] = "launch";
    argv[n++] = "-n";
    argv[n++] = nbuf;
    if (o->hosts > 0) {
        argv[n++] = "--hosts";
        argv[n++] = hbuf;
    }
    argv[n++] = "--timeout";
    argv[n++] = tbuf;
    argv[n++] = "--";
    argv[n++] = (char *)self;
    for (int i = 0; subcommand[i] && n < 40; i++) argv[n++] = (char *)subcommand[i];
    mm_moe_job_to_args(&co, argv, &n, store, sizeof store);
    argv[n++] = "--job-dir";
    argv[n++] = dir;
    argv[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        execv(self, argv);
        fprintf(stderr, "megamoe: cannot run %s: %s\n", self, strerror(errno));
        _exit(127);
    }
    int status = 0, rc = 1;
    if (pid > 0 && waitpid(pid, &status, 0) == pid)
        rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (co.progress_fd >= 0) close(co.progress_fd);
    for (int r = 0; r < o->ranks; r++) {
        char path[256];
        snprintf(path, sizeof path, "%s/rank%d.txt", dir, r);
        if (mm_moe_job_read(path, &results[r]) != 0) {
            memset(&results[r], 0, sizeof results[r]);
            results[r].rank = r;
            snprintf(results[r].error, sizeof results[r].error, "no result (the rank failed)");
            if (rc == 0) rc = 1;
        }
        unlink(path);
    }
    rmdir(dir);
    return rc;
}
