/* bench soak: a long MegaMoeExperts forward+backward run on 2 ranks with the routing changing
 * every step (balanced, zero, skew, single, then fresh random routing, in turn), sampling each
 * rank's resident memory (/proc/self/statm) and open descriptors (/proc/self/fd).
 *
 * Rows: one per sample and rank {"iter", "rank", "rss_mb", "fds"}, then per rank and for the
 * job {"rss_growth_pct", "fd_growth"}: growth from the end of the warm-up (the first tenth of
 * the steps, at least 10) to the largest later sample. Target: RSS growth <= 1 %, no fd
 * growth (--check makes a miss the exit status; under a sanitizer the RSS target is not
 * checked, the allocator's quarantine grows by design, descriptors and LeakSanitizer's verdict
 * at exit still are). --warmup-steps sets the warm-up (CTest bench_soak_rss: 1,500 steps
 * measured after 500). The four fixed patterns come back every 5 steps with the same routing,
 * so every output (forward output, grad hidden, grad topk_weights, grad gate_up, grad down)
 * must repeat bit for bit: a step that differs is an error (state leaking from one step into
 * the next). Public headers only, plus bench helpers. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "megamoe/megamoe.h"

#include "bench_util.h"
#include "moe_job.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MM_SOAK_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MM_SOAK_SANITIZED 1
#endif
#endif
#ifndef MM_SOAK_SANITIZED
#define MM_SOAK_SANITIZED 0
#endif

#define MM_SOAK_PATTERNS 5 /* the four of moe_data.h, then random */
#define MM_SOAK_MAX_SAMPLES 1000

/* RssAnon and RssShmem of /proc/self/status (private memory; touched shared heap pages). */
static void mm_soak_rss_parts(double *anon_mb, double *shmem_mb)
{
    *anon_mb = *shmem_mb = -1;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "RssAnon: %ld kB", &kb) == 1) *anon_mb = (double)kb / 1024.0;
        if (sscanf(line, "RssShmem: %ld kB", &kb) == 1) *shmem_mb = (double)kb / 1024.0;
    }
    if (f) fclose(f);
}

static double mm_soak_rss_mb(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = 0;
    if (f == NULL) return -1;
    int ok = fscanf(f, "%ld %ld", &size, &resident) == 2;
    fclose(f);
    return ok ? (double)resident * (double)sysconf(_SC_PAGESIZE) / 1048576.0 : -1;
}

static int mm_soak_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) n += de->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

/* splitmix64 of (seed, stream, index) */
static uint64_t mm_soak_mix(uint64_t seed, uint64_t stream, uint64_t i)
{
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + stream * 0xD1B54A32D192ED03ull + i + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Fresh random routing for the whole job: K distinct experts per token, softmax weights
 * (every rank computes the same global table). */
static void mm_soak_random_route(mm_moe_problem_t *P, uint64_t seed)
{
    const int64_t N = P->ep * P->T, E = P->E, K = P->K;
    for (int64_t n = 0; n < N; n++) {
        int32_t *row = P->ids + n * K;
        for (int64_t k = 0; k < K; k++) {
            int32_t e;
            int dup;
            uint64_t r = mm_soak_mix(seed, 1 + (uint64_t)k, (uint64_t)n);
            do {
                e = (int32_t)(r % (uint64_t)E);
                dup = 0;
                for (int64_t j = 0; j < k; j++) dup |= row[j] == e;
                r = r * 6364136223846793005ull + 1442695040888963407ull;
            } while (dup && K <= E);
            row[k] = e;
        }
        double w[64], sum = 0;
        for (int64_t k = 0; k < K && k < 64; k++) {
            w[k] = exp((double)(mm_soak_mix(seed, 100 + (uint64_t)k, (uint64_t)n) >> 11) * 0x1.0p-53);
            sum += w[k];
        }
        for (int64_t k = 0; k < K; k++) P->probs[n * K + k] = (float)(k < 64 ? w[k] / sum : 0);
    }
}

/* FNV-1a of n bytes, continuing from h (chained over every output of a step). */
static uint64_t mm_soak_hash(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* --test-perturb NAME (tests only: CTest bench_soak_hash_*): flip one bit of that output at
 * step 5, which repeats step 0's routing, so the repeat check must report it. */
static const char *const mm_soak_outputs[] = {"out", "grad_hidden", "grad_topk_weights",
                                              "grad_gate_up", "grad_down"};
static int mm_soak_perturb = -1;

#define MM_SOAK_FAIL(...)                                                                  \
    do {                                                                                   \
        snprintf(r->error, sizeof r->error, __VA_ARGS__);                                  \
        goto out;                                                                          \
    } while (0)

/* One rank: the steps, a sample every `every` steps into samples_path ("iter rss_mb fds"). */
static int mm_soak_rank(const mm_moe_job_opts_t *o, int every, const char *samples_dir,
                        mm_moe_job_result_t *r)
{
    memset(r, 0, sizeof *r);
    mm_moe_job_malloc_settings();
    megamoe_comm_t *comm = NULL;
    megamoe_experts_t *x = NULL;
    mm_moe_problem_t P;
    memset(&P, 0, sizeof P);
    uint16_t *out = NULL, *gh = NULL, *g1 = NULL, *g2 = NULL;
    float *gp = NULL;
    FILE *samples = NULL;
    megamoe_status_t st;
    megamoe_experts_params_t p = mm_moe_job_layer_params(o);
    megamoe_comm_params_t cp = megamoe_comm_params_default();
    mm_moe_job_size_heap(&cp, megamoe_experts_heap_bytes(&p, o->ranks) + (16ull << 20));
    if ((st = megamoe_comm_create(&cp, &comm)) != MEGAMOE_OK)
        MM_SOAK_FAIL("creating the communicator: %s", megamoe_last_error());
    const int ep = megamoe_comm_size(comm), me = megamoe_comm_rank(comm);
    r->rank = me;
    r->ranks = ep;
    char path[512];
    snprintf(path, sizeof path, "%s/samples%d.txt", samples_dir, me);
    if ((samples = fopen(path, "w")) == NULL) MM_SOAK_FAIL("cannot write %.400s", path);
    if (mm_moe_problem_create(&P, ep, o->T, o->H, o->I, o->E, o->K, MM_ROUTE_BALANCED, o->seed) != 0)
        MM_SOAK_FAIL("cannot build the problem (out of memory or invalid shapes)");
    if ((st = megamoe_experts_create(comm, &p, &x)) != MEGAMOE_OK) MM_SOAK_FAIL("%s", megamoe_last_error());
    const int64_t T = o->T, H = o->H, I = o->I, K = o->K, L = o->E / ep;
    const size_t TH = (size_t)(T * H), W1 = (size_t)(L * H * 2 * I), W2 = (size_t)(L * I * H);
    out = malloc(TH * 2);
    gh = malloc(TH * 2);
    gp = malloc((size_t)(T * K) * 4);
    g1 = malloc(W1 * 2);
    g2 = malloc(W2 * 2);
    if (!out || !gh || !gp || !g1 || !g2) MM_SOAK_FAIL("out of memory");
    megamoe_experts_input_t in = megamoe_experts_input_default();
    in.hidden_states = P.hidden + (size_t)me * TH;
    in.topk_ids = P.ids + (size_t)(me * T * K);
    in.topk_weights = P.probs + (size_t)(me * T * K);
    megamoe_experts_weights_t w = {P.gate_up + (size_t)me * W1, P.down + (size_t)me * W2, 1};
    megamoe_experts_grads_t g = {gh, gp, g1, g2, MEGAMOE_DTYPE_BF16};
    const uint16_t *dout = P.grad_out + (size_t)me * TH;
    uint64_t first_hash[MM_SOAK_PATTERNS] = {0};
    double t0 = mm_moe_job_now();
    for (int it = 0; it < o->iters; it++) {
        int pattern = it % MM_SOAK_PATTERNS;
        if (pattern < 4) mm_moe_problem_route(&P, (mm_route_pattern_t)pattern, o->seed);
        else mm_soak_random_route(&P, o->seed * 1000003u + (uint64_t)it);
        megamoe_experts_saved_t *sv = NULL;
        if ((st = megamoe_experts_forward(x, &w, &in, out, &sv)) != MEGAMOE_OK)
            MM_SOAK_FAIL("step %d (%s routing): forward: %s", it,
                         pattern < 4 ? mm_route_name((mm_route_pattern_t)pattern) : "random",
                         megamoe_last_error());
        st = megamoe_experts_backward(x, sv, &w, dout, &g);
        megamoe_experts_saved_destroy(sv);
        if (st != MEGAMOE_OK) MM_SOAK_FAIL("step %d: backward: %s", it, megamoe_last_error());
        if (pattern < 4) { /* the same routing as 5 steps ago: the same bits, every output */
            if (it == MM_SOAK_PATTERNS && mm_soak_perturb >= 0) {
                void *bufs[] = {out, gh, gp, g1, g2};
                ((uint8_t *)bufs[mm_soak_perturb])[3] ^= 1;
            }
            uint64_t h = 1469598103934665603ull;
            h = mm_soak_hash(h, out, TH * 2);
            h = mm_soak_hash(h, gh, TH * 2);
            h = mm_soak_hash(h, gp, (size_t)(T * K) * 4);
            h = mm_soak_hash(h, g1, W1 * 2);
            h = mm_soak_hash(h, g2, W2 * 2);
            if (it < MM_SOAK_PATTERNS) first_hash[pattern] = h;
            else if (h != first_hash[pattern])
                MM_SOAK_FAIL("step %d (%s routing): the outputs differ from step %d with the same "
                             "routing (state left over from another step?)",
                             it, mm_route_name((mm_route_pattern_t)pattern), pattern);
        }
        if (it % every == 0 || it == o->iters - 1) {
            double anon, shm;
            mm_soak_rss_parts(&anon, &shm);
            fprintf(samples, "%d %.4f %d %.4f %.4f\n", it + 1, mm_soak_rss_mb(), mm_soak_fds(), anon,
                    shm);
            fflush(samples);
        }
        if (me == 0 && o->progress_fd >= 0 && (it + 1) % (o->iters / 10 > 0 ? o->iters / 10 : 1) == 0) {
            char line[96];
            int n = snprintf(line, sizeof line, "  soak: %d/%d steps, %.1f s\n", it + 1, o->iters,
                             mm_moe_job_now() - t0);
            if (write(o->progress_fd, line, (size_t)n) < 0) { /* progress only */ }
        }
    }
    r->iter_median_s = (mm_moe_job_now() - t0) / o->iters;
    if ((st = megamoe_experts_close(x)) != MEGAMOE_OK) MM_SOAK_FAIL("close: %s", megamoe_last_error());
out:
    if (samples) fclose(samples);
    if (x) {
        if (r->error[0]) megamoe_experts_close(x);
        megamoe_experts_destroy(x);
    }
    if (comm && megamoe_comm_destroy(comm) != MEGAMOE_OK && !r->error[0])
        snprintf(r->error, sizeof r->error, "destroying the communicator: %s", megamoe_last_error());
    mm_moe_problem_free(&P);
    free(out);
    free(gh);
    free(gp);
    free(g1);
    free(g2);
    return r->error[0] ? 1 : 0;
}

typedef struct mm_soak_sample {
    int iter, fds;
    double rss_mb, anon_mb, shmem_mb;
} mm_soak_sample_t;

static int mm_soak_read(const char *path, mm_soak_sample_t *s, int max)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    int n = 0;
    while (n < max && fscanf(f, "%d %lf %d %lf %lf", &s[n].iter, &s[n].rss_mb, &s[n].fds,
                             &s[n].anon_mb, &s[n].shmem_mb) == 5)
        n++;
    fclose(f);
    return n;
}

static int mm_bench_soak_main(int argc, char **argv)
{
    mm_moe_job_opts_t o;
    mm_moe_job_defaults(&o);
    o.iters = 10000;
    o.verify = 0;
    o.timeout_s = 0;
    int n_samples = 100, check = 0; /* 1: every target, 2: descriptors only */
    int warmup_steps = -1;           /* -1: the first tenth, at least 10 */
    double rss_target = 1.0;
    const char *job_dir = NULL, *samples_dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            printf("usage: megamoe bench soak [--iters N] [--samples N] [--check|--check-fds]\n"
                   "       [--ranks N] [--warmup-steps N]\n"
                   "       [--tokens T --hidden H --intermediate I --experts E --top-k K]\n"
                   "       [--schedule O1|O0] [--workers W] [--seed S]\n"
                   "MegaMoE forward+backward for N steps (10000) on 2 ranks at the seed shape,\n"
                   "the routing changing every step (balanced, zero, skew, single, random);\n"
                   "each rank's RSS and open descriptors sampled N times (100). Rows: every\n"
                   "sample, then rss_growth_pct and fd_growth after the warm-up (the first\n"
                   "tenth, or --warmup-steps N). --check: exit 1 when RSS grew more than 1 %% or descriptors grew\n"
                   "(RSS not checked in sanitizer builds); --check-fds: descriptors only (short\n"
                   "runs, whose RSS is still warming up).\n");
            return 0;
        }
        if (!strcmp(argv[i], "--job-dir") && i + 1 < argc) job_dir = argv[++i];
        else if (!strcmp(argv[i], "--samples-dir") && i + 1 < argc) samples_dir = argv[++i];
        else if (!strcmp(argv[i], "--samples") && i + 1 < argc) n_samples = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--check")) check = 1;
        else if (!strcmp(argv[i], "--warmup-steps") && i + 1 < argc) warmup_steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--test-perturb") && i + 1 < argc) {
            const char *name = argv[++i];
            for (int k = 0; k < 5; k++)
                if (!strcmp(name, mm_soak_outputs[k])) mm_soak_perturb = k;
            if (mm_soak_perturb < 0) {
                fprintf(stderr, "megamoe bench soak: --test-perturb takes out, grad_hidden, "
                        "grad_topk_weights, grad_gate_up or grad_down\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--check-fds")) check = 2;
        else {
            int rc = mm_moe_job_parse_arg(&o, argc, argv, &i);
            if (rc <= 0) {
                if (rc == 0) fprintf(stderr, "megamoe bench soak: unknown option '%s'\n", argv[i]);
                return 2;
            }
        }
    }
    if (n_samples < 2 || n_samples > MM_SOAK_MAX_SAMPLES) {
        fprintf(stderr, "megamoe bench soak: --samples must be in [2, %d]\n", MM_SOAK_MAX_SAMPLES);
        return 2;
    }
    if (warmup_steps >= o.iters) {
        fprintf(stderr, "megamoe bench soak: --warmup-steps must be below --iters\n");
        return 2;
    }
    int every = o.iters / n_samples > 0 ? o.iters / n_samples : 1;
    if (job_dir) { /* one rank */
        mm_moe_job_result_t r;
        int rc = mm_soak_rank(&o, every, samples_dir ? samples_dir : job_dir, &r);
        char path[512];
        snprintf(path, sizeof path, "%s/rank%d.txt", job_dir, r.rank);
        if (mm_moe_job_write(path, &r) != 0) return 1;
        return rc;
    }
    if (o.ranks > 64) {
        fprintf(stderr, "megamoe bench soak: at most 64 ranks\n");
        return 2;
    }
    if (o.timeout_s == 0) o.timeout_s = 600 + 0.2 * o.iters; /* generous: a shared machine */
    char dir[] = "/tmp/megamoe-soak-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        fprintf(stderr, "megamoe bench soak: cannot create a temporary directory\n");
        return 1;
    }
    char every_s[16];
    snprintf(every_s, sizeof every_s, "%d", n_samples);
    const char *sub[] = {"bench", "soak", "--samples-dir", dir, "--samples", every_s,
                         mm_soak_perturb >= 0 ? "--test-perturb" : NULL,
                         mm_soak_perturb >= 0 ? mm_soak_outputs[mm_soak_perturb] : NULL, NULL};
    mm_moe_job_result_t res[64];
    fprintf(stderr, "megamoe bench soak: %d steps on %d ranks (T=%lld H=%lld I=%lld E=%lld K=%lld, "
            "%s)\n", o.iters, o.ranks, (long long)o.T, (long long)o.H, (long long)o.I,
            (long long)o.E, (long long)o.K, o.schedule);
    int rc = mm_moe_job_launch(&o, sub, res);
    mm_bench_begin("soak");
    double worst_rss = 0;
    int worst_fd = 0, missing = 0;
    static mm_soak_sample_t s[64][MM_SOAK_MAX_SAMPLES + 2];
    int ns[64];
    for (int r = 0; r < o.ranks; r++) {
        char path[512];
        snprintf(path, sizeof path, "%s/samples%d.txt", dir, r);
        ns[r] = mm_soak_read(path, s[r], MM_SOAK_MAX_SAMPLES + 2);
        unlink(path);
        if (ns[r] < 2) missing = 1;
        for (int i = 0; i < ns[r]; i++) {
            mm_bench_row();
            mm_bench_int("iter", s[r][i].iter);
            mm_bench_int("rank", r);
            mm_bench_num("rss_mb", s[r][i].rss_mb);
            mm_bench_int("fds", s[r][i].fds);
            mm_bench_num("rss_anon_mb", s[r][i].anon_mb);
            mm_bench_num("rss_shmem_mb", s[r][i].shmem_mb);
        }
    }
    rmdir(dir);
    int warm = warmup_steps >= 0 ? warmup_steps : o.iters / 10 > 10 ? o.iters / 10 : 10;
    for (int r = 0; r < o.ranks && !missing; r++) {
        int b = 0; /* the first sample at or after the warm-up */
        while (b + 1 < ns[r] && s[r][b].iter < warm) b++;
        double rss_max = s[r][b].rss_mb;
        int fd_max = s[r][b].fds;
        for (int i = b; i < ns[r]; i++) {
            if (s[r][i].rss_mb > rss_max) rss_max = s[r][i].rss_mb;
            if (s[r][i].fds > fd_max) fd_max = s[r][i].fds;
        }
        double growth = (rss_max - s[r][b].rss_mb) / s[r][b].rss_mb * 100.0;
        mm_bench_row();
        mm_bench_int("rank", r);
        mm_bench_int("iters", o.iters);
        mm_bench_int("warmup_iter", s[r][b].iter);
        mm_bench_num("rss_warm_mb", s[r][b].rss_mb);
        mm_bench_num("rss_max_mb", rss_max);
        mm_bench_num("rss_end_mb", s[r][ns[r] - 1].rss_mb);
        mm_bench_num("rss_growth_pct", growth);
        mm_bench_int("fds_warm", s[r][b].fds);
        mm_bench_int("fd_growth", fd_max - s[r][b].fds);
        mm_bench_num("ms_per_step", res[r].iter_median_s * 1e3);
        if (growth > worst_rss) worst_rss = growth;
        if (fd_max - s[r][b].fds > worst_fd) worst_fd = fd_max - s[r][b].fds;
    }
    int rss_ok = worst_rss <= rss_target, fd_ok = worst_fd == 0;
    if (!missing) {
        mm_bench_row();
        mm_bench_str("summary", "job");
        mm_bench_num("rss_growth_pct", worst_rss);
        mm_bench_int("fd_growth", worst_fd);
        mm_bench_bool("rss_target_met", rss_ok);
        mm_bench_bool("rss_checked", !MM_SOAK_SANITIZED);
        mm_bench_bool("fd_target_met", fd_ok);
    }
    mm_bench_end();
    if (rc != 0 || missing) {
        fprintf(stderr, "megamoe bench soak: the job failed:");
        for (int r = 0; r < o.ranks; r++)
            if (res[r].error[0]) fprintf(stderr, " rank %d: %s;", r, res[r].error);
        fprintf(stderr, "\n");
        return 1;
    }
    fprintf(stderr, "\nsoak: RSS growth after warm-up %.2f %% (target <= %.0f %%%s): %s; descriptor "
            "growth %d (target 0): %s\n", worst_rss, rss_target,
            MM_SOAK_SANITIZED ? ", not checked under a sanitizer" : "", rss_ok ? "met" : "NOT met",
            worst_fd, fd_ok ? "met" : "NOT met");
    if (check && (!fd_ok || (check == 1 && !rss_ok && !MM_SOAK_SANITIZED))) return 1;
    return 0;
}

const mm_bench_def_t mm_bench_soak_def = {
    "soak", "long fwd+bwd run, routing changing every step: RSS and descriptor growth per rank",
    mm_bench_soak_main};
