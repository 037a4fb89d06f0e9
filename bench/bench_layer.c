/* bench layer: MegaMoeExperts forward+backward, O0 and O1 on the same data in the same job
 * (iterations interleaved, moe_compare.c), for the seed shape (T=1024, H=512, I=128, E=4, K=2)
 * and a large one (T=4096, H=2048, I=1024, E=8, K=2), 2 ranks, 1 and 2 workers per rank, the
 * four routing patterns; the O1/O0 speed ratio, each O1 worker's wait share (from the trace)
 * and the profiling overhead; beside a pure-PyTorch expert-parallel MoE layer (torch 1.13 bf16
 * matmuls + gloo all_to_all_single, autograd) per shape. Times are the slowest rank's median.
 * TFLOP/s counts 18*H*I flops per (token, choice) over the whole job (forward 6HI, backward
 * 12HI). --tokens T1,T2,... runs each listed shape at every listed token count per rank
 * instead of its own (the token sweep of `megamoe bench report`); rows carry "tokens".
 * --gemm amx,onednn runs every job once per listed MEGAMOE_GEMM word (the ranks inherit it)
 * and compares the fwd+bwd times per schedule; rows carry "gemm" (the word, "auto" when the
 * variable is unset). Every schedule is also timed as a training step ("O1+step",
 * training_step: true): each step passes changed weights (a new version), so the forward
 * re-packs them as after an optimizer step; frozen rows carry training_step: false. Rows carry
 * pct_peak: TFLOP/s against the GEMM bench's probed per-core peak times the cores the job uses
 * (the target: the large shape's training step >= 85 %). The PyTorch baseline's output is
 * compared with megamoe's on every rank (rule 2 of moe_verify.h; same_output_as_megamoe; a
 * difference fails the run). Internal headers: the peak probe. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "megamoe/megamoe.h"

#include "bench_layer_dyn.h"
#include "bench_mem.h"
#include "bench_util.h"
#include "bench_wire.h"
#include "kernels/peak.h"
#include "moe_job.h"
#include "moe_verify.h"

typedef struct {
    const char *name;
    int64_t T, H, I, E, K;
} mm_layer_shape_t;

static const mm_layer_shape_t mm_layer_shapes[] = {
    {"seed", 1024, 512, 128, 4, 2},
    {"large", 4096, 2048, 1024, 8, 2},
};

/* bench/torch_moe_layer.py: installed, in the source tree, or ./bench (mm_bench_script) */
static int mm_torch_script(char *out, size_t len)
{
    return mm_bench_script("torch_moe_layer.py", out, len);
}

/* Run the PyTorch baseline on 2 ranks; fills ms (fwd+bwd) and checksum; with dump_dir every
 * rank writes its first output there (torch_out<rank>.bin). 0 on success. */
static int mm_run_torch(const mm_moe_job_opts_t *o, int threads, const char *script,
                        const char *dump_dir, double *ms, double *checksum)
{
    char dir[] = "/tmp/megamoe-torch-XXXXXX";
    if (mkdtemp(dir) == NULL) return -1;
    char outp[256], a[16][32];
    snprintf(outp, sizeof outp, "%s/torch.json", dir);
    const char *self = mm_bench_self_exe();
    snprintf(a[0], 32, "%d", o->ranks);
    snprintf(a[1], 32, "%lld", (long long)o->T);
    snprintf(a[2], 32, "%lld", (long long)o->H);
    snprintf(a[3], 32, "%lld", (long long)o->I);
    snprintf(a[4], 32, "%lld", (long long)o->E);
    snprintf(a[5], 32, "%lld", (long long)o->K);
    snprintf(a[6], 32, "%llu", (unsigned long long)o->seed);
    snprintf(a[7], 32, "%d", o->iters);
    snprintf(a[8], 32, "%d", o->warmup);
    snprintf(a[9], 32, "%d", threads);
    snprintf(a[10], 32, "%d", o->hosts > 0 ? o->hosts : 1);
    char *tail[] = {"--timeout", "1800", "--", (char *)mm_bench_python(), (char *)script, "--tokens",
                    a[1], "--hidden", a[2], "--intermediate", a[3], "--experts", a[4], "--top-k",
                    a[5], "--seed", a[6], "--iters", a[7], "--warmup", a[8], "--threads", a[9],
                    "--out", outp, dump_dir ? "--dump-dir" : NULL, (char *)dump_dir, NULL};
    char *argv[48] = {(char *)self, "launch", "-n", a[0]};
    int k = 4;
    if (o->hosts > 0) { /* the same simulated hosts as the megamoe side */
        argv[k++] = "--hosts";
        argv[k++] = a[10];
    }
    memcpy(argv + k, tail, sizeof tail);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("OMP_NUM_THREADS", a[9], 1);
        execv(self, argv);
        _exit(127);
    }
    int status = 0, rc = -1;
    if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        FILE *f = fopen(outp, "r");
        char buf[512] = "";
        if (f) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            buf[n] = '\0';
            fclose(f);
            const char *p = strstr(buf, "\"fwd_bwd_ms\":"), *q = strstr(buf, "\"checksum\":");
            if (p && q && sscanf(p + 13, "%lf", ms) == 1 && sscanf(q + 11, "%lf", checksum) == 1)
                rc = 0;
        }
    }
    unlink(outp);
    rmdir(dir);
    return rc;
}

/* Remove a scratch directory of plain files. */
static void mm_bench_rmdir_files(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* The PyTorch baseline's first output against megamoe's (the same problem, balanced routing),
 * rank by rank, by rule 2 of bench/moe_verify.h (relative L2 <= 1 %, max |err| <= 2 % of max
 * |ref|): PyTorch's bf16 layer rounds at other places (its SwiGLU runs in bf16), so rule 1,
 * made for the reference with megamoe's bf16 intermediates, does not apply. Fills the worst
 * rank's relative L2 and max error; 1 when every rank passes, 0 when one does not, -1 when an
 * output is missing. */
static int mm_torch_compare(const char *dir, int ranks, size_t n, double *rel_l2, double *rel_max)
{
    uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
    float *want = malloc(n * 4);
    int ok = a && b && want ? 1 : -1;
    *rel_l2 = *rel_max = 0;
    for (int r = 0; r < ranks && ok >= 0; r++) {
        char pm[512], pt[512];
        snprintf(pm, sizeof pm, "%s/megamoe_out%d.bin", dir, r);
        snprintf(pt, sizeof pt, "%s/torch_out%d.bin", dir, r);
        FILE *fm = fopen(pm, "rb"), *ft = fopen(pt, "rb");
        if (!fm || !ft || fread(a, 2, n, fm) != n || fread(b, 2, n, ft) != n) ok = -1;
        if (fm) fclose(fm);
        if (ft) fclose(ft);
        unlink(pm);
        unlink(pt);
        if (ok < 0) break;
        for (size_t i = 0; i < n; i++) want[i] = megamoe_bf16_to_fp32(b[i]);
        mm_verify_t v;
        mm_verify(a, 1, want, want, n, 0, &v);
        if (v.rel_l2 > *rel_l2) *rel_l2 = v.rel_l2;
        if (v.rel_max > *rel_max) *rel_max = v.rel_max;
        if (!v.finite || !v.oracle_ok) ok = 0;
    }
    free(a);
    free(b);
    free(want);
    return ok;
}

/* Split a comma list into at most n items (in place); returns the count. */
static int mm_split_list(char *text, char **items, int n)
{
    int k = 0;
    for (char *tok = strtok(text, ","); tok && k < n; tok = strtok(NULL, ",")) items[k++] = tok;
    return k;
}

/* The job's time: its slowest rank. */
static double mm_job_time(const mm_moe_job_result_t *res, int ranks, int v, int which)
{
    double t = 0;
    for (int r = 0; r < ranks; r++) {
        const mm_moe_job_variant_t *x = &res[r].variant[v];
        double s = which == 0 ? x->iter_median_s : which == 1 ? x->fwd_median_s : x->bwd_median_s;
        if (s > t) t = s;
    }
    return t;
}

/* The layer's dimensions in a row (tokens per rank precede them), for figures made from rows. */
static void mm_bench_dims(const mm_moe_job_opts_t *o)
{
    mm_bench_int("hidden", o->H);
    mm_bench_int("intermediate", o->I);
    mm_bench_int("experts", o->E);
    mm_bench_int("top_k", o->K);
}

typedef struct mm_target_row {
    char label[96];
    double ratio, target;
    int over_floor; /* wire targets: 1 = over the wire floor, 0 = over one host, 2 = O1 / O0 */
} mm_target_row_t;

/* Replica setting of a variant name ("O1" -> 0, "O1+r2" -> 2, "O1+prof" -> 0). */
static int mm_variant_replicas(const char *name)
{
    const char *r = strstr(name, "+r");
    return r ? atoi(r + 2) : 0;
}

/* Balanced-routing times measured so far, to report every routing against them. */
typedef struct mm_balanced_time {
    char key[80]; /* shape/tokens/hosts/workers/variant */
    double t;
} mm_balanced_time_t;

static int mm_bench_layer_main(int argc, char **argv)
{
    mm_moe_job_opts_t o;
    mm_moe_job_defaults(&o);
    o.iters = 3;
    o.verify = 0;
    o.profile_variant = 1;
    o.training_step = 1; /* also "O1+step": weights changed every step (--training-step no) */
    int probe = 1;
    snprintf(o.schedule, sizeof o.schedule, "O0,O1");
    const char *job_dir = NULL, *shapes = "seed,large", *torch = "yes";
    char workers_list[64] = "1,2", routing_list[96] = "balanced,zero,skew,single";
    char tokens_list[160] = ""; /* empty: each shape's own T */
    char gemm_list[64] = "";    /* empty: MEGAMOE_GEMM as set (or auto), not touched */
    char *dists[16];            /* --tokens-dist (repeatable): per-call token counts */
    int n_dists = 0, iters_given = 0, sched_given = 0;
    for (int i = 1; i + 1 < argc; i++) /* a job's rank: every option is the job's own */
        if (!strcmp(argv[i], "--job-dir")) job_dir = argv[i + 1];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            printf("usage: megamoe bench layer [--shapes seed,large] [--schedule O0,O1]\n"
                   "       [--workers 1,2] [--routing balanced,zero,skew,single] [--torch yes|no]\n"
                   "       [--iters N] [--warmup N] [--profile-variant yes|no] [--hosts H]\n"
                   "       [--ranks N] [--tokens T1,T2,...] [--gemm amx,onednn]\n"
                   "       [--tokens-dist D [--tokens-dist D2 ...]] [--training-step yes|no]\n"
                   "       [--no-probe]\n"
                   "MegaMoE forward+backward on 2 ranks, same data: each listed schedule in one\n"
                   "job per (shape, workers, routing) with interleaved iterations, the O1/O0\n"
                   "speed ratio, each O1 worker's wait share (from the trace), the profiling\n"
                   "overhead (O1+prof), and a pure-PyTorch EP layer per shape (balanced).\n"
                   "--tokens runs every listed shape at each token count per rank (a sweep).\n"
                   "Every schedule also runs as a training step (\"O1+step\": changed weights\n"
                   "every step, re-pack included; rows carry training_step) unless\n"
                   "--training-step no; pct_peak is against the probed per-core peak of the\n"
                   "cores used (--no-probe: null). The PyTorch row's output is compared with\n"
                   "megamoe's on every rank (same_output_as_megamoe).\n"
                   "--gemm runs every job once per listed MEGAMOE_GEMM word and compares them\n"
                   "(rows carry \"gemm\"; the AMX target: amx >= 1.3x faster than onednn).\n"
                   "--hosts H runs both sides on H simulated hosts (megamoe launch --hosts; root);\n"
                   "every row carries \"hosts\" (1 without it). With H > 1 each megamoe job also\n"
                   "runs on one host first, and the H-host rows carry over_single_host (their\n"
                   "fwd+bwd time over the single-host one's).\n"
                   "--replicas 0,2 also runs every schedule with replica_slots_per_rank=2 in the\n"
                   "same job (variant \"O1+r2\"); rows carry \"replicas\", the plan (guests, rows\n"
                   "moved, slowest rank's rows before/after), \"replicas_over_off\" (time against\n"
                   "the same schedule without replicas, same job) and \"over_balanced\" (time\n"
                   "against the variant's balanced-routing row of the run).\n"
                   "--tokens-dist D (repeatable; N, uniform:A-B or list:a,b,...): per-call token\n"
                   "counts instead (docs/moe.md \"Dynamic tokens\"): a max_local_num_tokens layer\n"
                   "(T_cap = the largest count) beside a fixed layer of the mean count rounded to\n"
                   "128, same job; rows carry tokens_dist, fwd_ms, floor_ms (memcpy of the busiest\n"
                   "rank's rows + 2 signal round trips), work_floor_ms and the time per token of\n"
                   "both (schedule O1 unless given; 200 iterations at the seed shape, 20 at the\n"
                   "large one unless --iters is given).\n");
            return 0;
        }
        if (!strcmp(argv[i], "--job-dir") && i + 1 < argc) job_dir = argv[++i];
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) shapes = argv[++i];
        else if (!strcmp(argv[i], "--torch") && i + 1 < argc) torch = argv[++i];
        else if (!job_dir && !strcmp(argv[i], "--workers") && i + 1 < argc)
            snprintf(workers_list, sizeof workers_list, "%s", argv[++i]);
        else if (!job_dir && !strcmp(argv[i], "--routing") && i + 1 < argc)
            snprintf(routing_list, sizeof routing_list, "%s", argv[++i]);
        else if (!job_dir && !strcmp(argv[i], "--tokens") && i + 1 < argc)
            snprintf(tokens_list, sizeof tokens_list, "%s", argv[++i]);
        else if (!job_dir && !strcmp(argv[i], "--no-probe")) probe = 0;
        else if (!job_dir && !strcmp(argv[i], "--gemm") && i + 1 < argc)
            snprintf(gemm_list, sizeof gemm_list, "%s", argv[++i]);
        else if (!job_dir && !strcmp(argv[i], "--tokens-dist") && i + 1 < argc && n_dists < 16)
            dists[n_dists++] = argv[++i];
        else {
            iters_given |= !strcmp(argv[i], "--iters");
            sched_given |= !strcmp(argv[i], "--schedule");
            int rc = mm_moe_job_parse_arg(&o, argc, argv, &i);
            if (rc <= 0) {
                if (rc == 0) fprintf(stderr, "megamoe bench layer: unknown option '%s'\n", argv[i]);
                return 2;
            }
        }
    }
    if (job_dir) { /* one rank of the megamoe side */
        mm_moe_job_result_t r;
        int rc = o.tokens_dist[0]          ? mm_moe_job_dyn_rank(&o, &r)
                 : strchr(o.schedule, ',') ? mm_moe_job_compare_rank(&o, &r)
                                           : mm_moe_job_rank(&o, &r);
        char path[512];
        snprintf(path, sizeof path, "%s/rank%d.txt", job_dir, r.rank);
        if (mm_moe_job_write(path, &r) != 0) return 1;
        return rc;
    }
    char *workers[8], *routes[8], sched_copy[16];
    int n_workers = mm_split_list(workers_list, workers, 8);
    int n_routes = mm_split_list(routing_list, routes, 8);
    if (n_dists > 0) { /* per-call token counts: their own jobs and rows (bench_layer_dyn.c) */
        for (int i = 0; i < n_routes; i++)
            if (mm_route_parse(routes[i]) < 0) {
                fprintf(stderr, "megamoe bench layer: unknown routing '%s'\n", routes[i]);
                return 2;
            }
        if (!iters_given) o.iters = 0; /* per shape (bench_layer_dyn.c) */
        if (!sched_given) snprintf(o.schedule, sizeof o.schedule, "O1");
        mm_dyn_shape_t dshapes[8];
        const int n_sh = (int)(sizeof mm_layer_shapes / sizeof mm_layer_shapes[0]);
        for (int s = 0; s < n_sh && s < 8; s++) {
            dshapes[s].name = mm_layer_shapes[s].name;
            dshapes[s].H = mm_layer_shapes[s].H;
            dshapes[s].I = mm_layer_shapes[s].I;
            dshapes[s].E = mm_layer_shapes[s].E;
            dshapes[s].K = mm_layer_shapes[s].K;
        }
        return mm_bench_layer_dyn(&o, dshapes, n_sh < 8 ? n_sh : 8, shapes, dists, n_dists,
                                  workers, n_workers, routes, n_routes);
    }
    /* the GEMM backends to run: the listed MEGAMOE_GEMM words, or the one already set */
    const char *env_gemm = getenv("MEGAMOE_GEMM");
    char env_gemm_copy[32], *gemms[4];
    snprintf(env_gemm_copy, sizeof env_gemm_copy, "%s", env_gemm && env_gemm[0] ? env_gemm : "auto");
    int n_gemms = gemm_list[0] ? mm_split_list(gemm_list, gemms, 4) : 0;
    const int set_gemm = n_gemms > 0;
    if (!set_gemm) gemms[0] = env_gemm_copy, n_gemms = 1;
    char *token_items[16];
    int64_t tokens[16];
    int n_tokens = tokens_list[0] ? mm_split_list(tokens_list, token_items, 16) : 0;
    for (int i = 0; i < n_tokens; i++) { /* the job's own rule for --tokens, before any rank */
        char *tok_argv[] = {"--tokens", token_items[i]};
        int at = 0;
        mm_moe_job_opts_t t = o;
        if (mm_moe_job_parse_arg(&t, 2, tok_argv, &at) != 1) return 2;
        tokens[i] = t.T;
    }
    snprintf(sched_copy, sizeof sched_copy, "%s", o.schedule);
    if (strchr(o.schedule, ',') == NULL) { /* a single schedule: still a comparison job */
        snprintf(o.schedule, sizeof o.schedule, "%.14s,", sched_copy);
    }
    for (int i = 0; i < n_routes; i++)
        if (mm_route_parse(routes[i]) < 0) {
            fprintf(stderr, "megamoe bench layer: unknown routing '%s'\n", routes[i]);
            return 2;
        }
    char script[4096];
    int with_torch = strcmp(torch, "no") != 0;
    if (with_torch && mm_torch_script(script, sizeof script) != 0) {
        fprintf(stderr, "megamoe bench layer: bench/torch_moe_layer.py not found (run from the "
                        "repository or pass --torch no)\n");
        return 2;
    }
    /* the compute peak per core (the GEMM bench's probe), for pct_peak */
    mm_peak_t peak;
    memset(&peak, 0, sizeof peak);
    if (probe && mm_kernels_peak_probe(0.3, &peak) != MEGAMOE_OK) peak.gflops = 0;
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    mm_bench_begin("layer");
    const int n_shapes = (int)(sizeof mm_layer_shapes / sizeof mm_layer_shapes[0]);
    int total = 0, step = 0, rc = 0;
    const int n_points = n_tokens ? n_tokens : 1; /* token counts per shape */
    for (int s = 0; s < n_shapes; s++)
        if (strstr(shapes, mm_layer_shapes[s].name)) total += n_points * (n_workers * n_routes * n_gemms * (o.hosts > 1 ? 2 : 1) + with_torch);
    struct {
        char key[96]; /* shape/routing/variant/workers */
        int g;        /* index into gemms */
        double t;     /* fwd+bwd */
    } by_gemm[128];
    int n_by_gemm = 0;
    mm_target_row_t targets[64], host_targets[64];
    int n_targets = 0, n_host_targets = 0;
    mm_balanced_time_t balanced[64];
    int n_balanced = 0;
    mm_target_row_t rep_targets[64];
    int n_rep_targets = 0;
    mm_target_row_t peak_targets[16]; /* the training-step rows of the large shape */
    int n_peak_targets = 0;
    const int n_host_runs = o.hosts > 1 ? 2 : 1; /* across hosts: also the single-host job */
    double single[MM_JOB_MAX_VARIANTS];
    /* across hosts: the engine's own put rate and round trip, for the wire floor (issue 31) */
    mm_bench_wire_engine_t eng;
    memset(&eng, 0, sizeof eng);
    mm_target_row_t wire_targets[64];
    int n_wire_targets = 0;
    if (o.hosts > 1) {
        mm_bench_progress(step, total, "the engine's own put and round trip (bench shmem)");
        mm_bench_wire_engine_measure(o.hosts, &eng);
    }
    for (int sp = 0; sp < n_shapes * n_points; sp++) { /* (shape, token count) pairs */
        const mm_layer_shape_t *sh = &mm_layer_shapes[sp / n_points];
        const int64_t T = n_tokens ? tokens[sp % n_points] : sh->T;
        if (!strstr(shapes, sh->name)) continue;
        /* the first balanced megamoe job of the pair leaves its outputs for the PyTorch
         * comparison */
        char dump[] = "/tmp/megamoe-cmp-XXXXXX";
        int dumped = 0, dump_ok = with_torch && mkdtemp(dump) != NULL;
        for (int wi = 0; wi < n_workers; wi++)
            for (int ri = 0; ri < n_routes; ri++)
                for (int gi = 0; gi < n_gemms; gi++) /* the GEMM backends, one job each */
                    for (int hr = 0; hr < n_host_runs; hr++) {
                        if (set_gemm) setenv("MEGAMOE_GEMM", gemms[gi], 1); /* the ranks inherit it */
                        mm_moe_job_opts_t jo = o;
                        /* across hosts, the same job on one host first: the reference of the ratio */
                        jo.hosts = n_host_runs == 2 && hr == 0 ? 0 : o.hosts;
                        jo.T = T;
                        jo.H = sh->H;
                        jo.I = sh->I;
                        jo.E = sh->E;
                        jo.K = sh->K;
                        jo.workers = atoi(workers[wi]);
                        jo.route = (mm_route_pattern_t)mm_route_parse(routes[ri]);
                        const int dump_here = dump_ok && !dumped && jo.route == MM_ROUTE_BALANCED &&
                                              jo.hosts <= 1;
                        if (dump_here) snprintf(jo.dump_dir, sizeof jo.dump_dir, "%s", dump);
                        double flops = mm_moe_flops(jo.ranks, jo.T, jo.H, jo.I, jo.K);
                        char label[128];
                        snprintf(label, sizeof label, "megamoe %s shape T=%lld, %s workers, %s, %d host%s, gemm %s",
                                 sh->name, (long long)T, workers[wi], routes[ri], jo.hosts > 0 ? jo.hosts : 1,
                                 jo.hosts > 1 ? "s" : "", gemms[gi]);
                        mm_bench_progress(++step, total, label);
                        mm_moe_job_result_t res[64];
                        const char *sub[] = {"bench", "layer", NULL};
                        if (dump_here) dumped = 1;
                        if (jo.ranks > 64 || mm_moe_job_launch(&jo, sub, res) != 0) {
                            fprintf(stderr, "megamoe bench layer: the job failed for %s:", label);
                            for (int r = 0; r < jo.ranks && r < 64; r++)
                                if (res[r].error[0]) fprintf(stderr, " rank %d: %s;", r, res[r].error);
                            fprintf(stderr, "\n");
                            rc = 1;
                            continue;
                        }
                        if (hr == 0)
                            for (int v = 0; v < MM_JOB_MAX_VARIANTS; v++) single[v] = 0;
                        int v0 = -1, v1 = -1, vp = -1;
                        for (int v = 0; v < res[0].n_variants; v++) {
                            if (!strcmp(res[0].variant[v].name, "O0")) v0 = v;
                            if (!strcmp(res[0].variant[v].name, "O1")) v1 = v;
                            if (!strcmp(res[0].variant[v].name, "O1+prof")) vp = v;
                        }
                        for (int v = 0; v < res[0].n_variants; v++) {
                            double t = mm_job_time(res, jo.ranks, v, 0);
                            mm_bench_row();
                            mm_bench_str("impl", "megamoe");
                            mm_bench_str("schedule", res[0].variant[v].name);
                            mm_bench_str("shape", sh->name);
                            mm_bench_int("tokens", jo.T);
                            mm_bench_dims(&jo);
                            mm_bench_str("routing", routes[ri]);
                            mm_bench_str("gemm", gemms[gi]);
                            mm_bench_int("ep", jo.ranks);
                            mm_bench_int("hosts", jo.hosts > 0 ? jo.hosts : 1);
                            mm_bench_int("workers", res[0].workers);
                            mm_bench_num("fwd_bwd_ms", t * 1e3);
                            mm_bench_num("fwd_ms", mm_job_time(res, jo.ranks, v, 1) * 1e3);
                            mm_bench_num("bwd_ms", mm_job_time(res, jo.ranks, v, 2) * 1e3);
                            mm_bench_num("tflops", flops / t * 1e-12);
                            {
                                /* against the probed peak of the cores the job used */
                                long cores = (long)jo.ranks * (res[0].workers > 0 ? res[0].workers : 1);
                                if (online > 0 && cores > online) cores = online;
                                const double pct = peak.gflops > 0
                                                       ? 100.0 * flops / t / (peak.gflops * 1e9 * (double)cores)
                                                       : NAN;
                                mm_bench_num("pct_peak", pct);
                                mm_bench_str("peak_unit", peak.gflops > 0 ? peak.unit : "none");
                                /* the target row: the large shape's training step (bf16) */
                                if (strstr(res[0].variant[v].name, "+step") && n_peak_targets < 16 &&
                                    !strcmp(sh->name, "large") && jo.route == MM_ROUTE_BALANCED) {
                                    mm_target_row_t *tr = &peak_targets[n_peak_targets++];
                                    snprintf(tr->label, sizeof tr->label, "large T=%lld %s, %d worker%s/rank",
                                             (long long)T, res[0].variant[v].name, res[0].workers,
                                             res[0].workers == 1 ? "" : "s");
                                    tr->ratio = pct;
                                    tr->target = 85;
                                }
                            }
                            mm_bench_bool("training_step",
                                          strstr(res[0].variant[v].name, "+step") != NULL);
                            double cpu = 0; /* the busiest rank's CPU time per iteration */
                            for (int r = 0; r < jo.ranks; r++)
                                if (res[r].variant[v].cpu_median_s > cpu) cpu = res[r].variant[v].cpu_median_s;
                            mm_bench_num("cpu_ms", cpu * 1e3);
                            mm_bench_mem_fields(res, jo.ranks); /* job-wide: every schedule in one process */
                            const char *vname = res[0].variant[v].name;
                            const int nrep = mm_variant_replicas(vname);
                            mm_bench_int("replicas", nrep);
                            if (nrep > 0) {
                                /* the plan of the last forward (the same on every rank) */
                                mm_bench_int("guests", res[0].guests);
                                mm_bench_int("rows_moved", res[0].rows_moved);
                                mm_bench_int("max_rows_plain", res[0].max_rows_plain);
                                mm_bench_int("max_rows", res[0].max_rows);
                                char base[16];
                                snprintf(base, sizeof base, "%.*s", (int)(strstr(vname, "+r") - vname), vname);
                                for (int u = 0; u < res[0].n_variants; u++)
                                    if (!strcmp(res[0].variant[u].name, base))
                                        mm_bench_num("replicas_over_off", t / mm_job_time(res, jo.ranks, u, 0));
                            }
                            char key[80];
                            snprintf(key, sizeof key, "%s/%lld/%d/%d/%s/%s", sh->name, (long long)T,
                                     jo.hosts, res[0].workers, vname, gemms[gi]);
                            if (n_gemms > 1 && n_by_gemm < 128) {
                                snprintf(by_gemm[n_by_gemm].key, sizeof by_gemm[0].key, "%s %s %s, %d worker%s",
                                         sh->name, routes[ri], vname, res[0].workers,
                                         res[0].workers == 1 ? "" : "s");
                                by_gemm[n_by_gemm].g = gi;
                                by_gemm[n_by_gemm++].t = t;
                            }
                            if (jo.route == MM_ROUTE_BALANCED && n_balanced < 64) {
                                snprintf(balanced[n_balanced].key, sizeof balanced[0].key, "%s", key);
                                balanced[n_balanced++].t = t;
                            }
                            for (int b = 0; b < n_balanced; b++)
                                if (!strcmp(balanced[b].key, key)) {
                                    mm_bench_num("over_balanced", t / balanced[b].t);
                                    if (n_rep_targets < 64 && strstr(vname, "prof") == NULL) {
                                        mm_target_row_t *tr = &rep_targets[n_rep_targets++];
                                        snprintf(tr->label, sizeof tr->label, "%s %s, %d worker%s/rank, %s",
                                                 sh->name, routes[ri], res[0].workers,
                                                 res[0].workers == 1 ? "" : "s", vname);
                                        tr->ratio = t / balanced[b].t;
                                        tr->target = nrep > 0 && res[0].workers == 1 &&
                                                             !strcmp(sh->name, "large")
                                                         ? 1.2
                                                         : 0;
                                    }
                                }
                            if (hr == 1 && v < MM_JOB_MAX_VARIANTS && single[v] > 0) {
                                mm_bench_num("over_single_host", t / single[v]);
                                /* what crossed hosts per step (the busiest rank) and the wire
                                 * floor: those bytes at the engine's put rate plus two engine
                                 * round trips per dispatch and per combine (forward and
                                 * backward: 4 exchanges) */
                                mm_bench_wire_t w = {0, 0, 0};
                                for (int r = 0; r < jo.ranks; r++) {
                                    const mm_moe_job_variant_t *rv = &res[r].variant[v];
                                    if (rv->wire_bytes > w.bytes) w.bytes = rv->wire_bytes;
                                    if (rv->wire_msgs > w.messages) w.messages = rv->wire_msgs;
                                    if (rv->wire_rtts > w.round_trips) w.round_trips = rv->wire_rtts;
                                }
                                const double extra_ms = (t - single[v]) * 1e3;
                                mm_bench_wire_fields(&eng, &w, 8, extra_ms > 0 ? extra_ms : 0);
                                const double floor = mm_bench_wire_floor_ms(&eng, w.bytes, 8);
                                if (n_wire_targets < 64 && strstr(res[0].variant[v].name, "prof") == NULL) {
                                    mm_target_row_t *tr = &wire_targets[n_wire_targets++];
                                    const int large = !strcmp(sh->name, "large");
                                    snprintf(tr->label, sizeof tr->label, "%s %s %s, %d worker%s/rank",
                                             sh->name, routes[ri], res[0].variant[v].name, res[0].workers,
                                             res[0].workers == 1 ? "" : "s");
                                    /* large: extra time over the wire floor; seed: over one host */
                                    tr->ratio = large ? (extra_ms > 0 ? extra_ms : 0) / floor : t / single[v];
                                    tr->target = res[0].workers != 1 || jo.route != MM_ROUTE_BALANCED ? 0
                                                 : large ? 1.3 : !strcmp(sh->name, "seed") ? 2.0 : 0;
                                    tr->over_floor = large;
                                }
                                if (n_host_targets < 64) {
                                    mm_target_row_t *tr = &host_targets[n_host_targets++];
                                    snprintf(tr->label, sizeof tr->label, "%s %s %s, %d worker%s/rank",
                                             sh->name, routes[ri], res[0].variant[v].name, res[0].workers,
                                             res[0].workers == 1 ? "" : "s");
                                    tr->ratio = t / single[v];
                                    tr->target = 1.15;
                                }
                            }
                            if (n_host_runs == 2 && hr == 0 && v < MM_JOB_MAX_VARIANTS) single[v] = t;
                            if (v == v1 && v0 >= 0) {
                                double ratio = mm_job_time(res, jo.ranks, v0, 0) / t;
                                mm_bench_num("o1_over_o0_speed", ratio);
                                if (hr == 1 && n_wire_targets < 64) { /* issue 31: O1 never slower */
                                    mm_target_row_t *tr = &wire_targets[n_wire_targets++];
                                    snprintf(tr->label, sizeof tr->label, "%s %s O1 time / O0 time, %d worker%s/rank",
                                             sh->name, routes[ri], res[0].workers, res[0].workers == 1 ? "" : "s");
                                    tr->ratio = 1.0 / ratio;
                                    tr->target = res[0].workers == 1 && !strcmp(sh->name, "large") ? 1.0 : 0;
                                    tr->over_floor = 2;
                                }
                                /* bit-identical outputs give identical sums on every rank */
                                int same = 1;
                                for (int r = 0; r < jo.ranks; r++)
                                    same &= res[r].variant[v1].checksum == res[r].variant[v0].checksum;
                                mm_bench_bool("same_output_as_o0", same);
                                if (n_targets < 64) {
                                    mm_target_row_t *tr = &targets[n_targets++];
                                    snprintf(tr->label, sizeof tr->label, "%s T=%lld %s, %d worker%s/rank, %d host%s",
                                             sh->name, (long long)T, routes[ri], res[0].workers,
                                             res[0].workers == 1 ? "" : "s", jo.hosts > 0 ? jo.hosts : 1,
                                             jo.hosts > 1 ? "s" : "");
                                    tr->ratio = ratio;
                                    tr->target = res[0].workers != 1 ? 0
                                                 : jo.route == MM_ROUTE_BALANCED ? 1.15
                                                 : jo.route == MM_ROUTE_SKEW     ? 1.30
                                                                                 : 0;
                                }
                            }
                            if (v == v1) {
                                /* share of launch time each O1 worker waited (all ranks' workers) */
                                char detail[96] = "";
                                double sum = 0, mx = 0;
                                int n = 0;
                                for (int r = 0; r < jo.ranks; r++)
                                    for (int k = 0; k < res[r].n_wait; k++) {
                                        double ws = res[r].wait_share[k];
                                        sum += ws;
                                        if (ws > mx) mx = ws;
                                        n++;
                                        size_t len = strlen(detail);
                                        snprintf(detail + len, sizeof detail - len, "%sr%d.%s=%.2f",
                                                 len ? " " : "", r, res[r].wait_name[k], ws);
                                    }
                                if (n) {
                                    mm_bench_num("wait_share", sum / n);
                                    mm_bench_num("wait_share_max", mx);
                                    mm_bench_str("wait_share_workers", detail);
                                }
                            }
                            if (v == vp && v1 >= 0)
                                mm_bench_num("profiling_overhead", t / mm_job_time(res, jo.ranks, v1, 0) - 1);
                        }
                    }
        if (with_torch) {
            mm_moe_job_opts_t jo = o;
            jo.T = T;
            jo.H = sh->H;
            jo.I = sh->I;
            jo.E = sh->E;
            jo.K = sh->K;
            jo.route = MM_ROUTE_BALANCED;
            int threads = atoi(workers[0]) > 0 ? atoi(workers[0]) : 1;
            char label[96];
            snprintf(label, sizeof label, "torch %s shape T=%lld", sh->name, (long long)T);
            mm_bench_progress(++step, total, label);
            double t_torch = 0, checksum = 0;
            if (mm_run_torch(&jo, threads, script, dumped ? dump : NULL, &t_torch, &checksum) != 0) {
                fprintf(stderr, "megamoe bench layer: the PyTorch baseline failed for shape %s\n",
                        sh->name);
                rc = 1;
                if (dump_ok) mm_bench_rmdir_files(dump);
                continue;
            }
            /* its output against megamoe's, on every rank (the same problem) */
            double cmp_l2 = NAN, cmp_max = NAN;
            int same = dumped ? mm_torch_compare(dump, jo.ranks, (size_t)(jo.T * jo.H), &cmp_l2,
                                                 &cmp_max)
                              : -1;
            if (dump_ok) mm_bench_rmdir_files(dump);
            if (same == 0) {
                fprintf(stderr, "megamoe bench layer: shape %s: the PyTorch baseline's output "
                        "differs from megamoe's (relative L2 %.3g, max %.3g of max |ref|)\n",
                        sh->name, cmp_l2, cmp_max);
                rc = 1;
            }
            mm_bench_row();
            mm_bench_str("impl", "torch");
            mm_bench_str("schedule", "-");
            mm_bench_str("shape", sh->name);
            mm_bench_int("tokens", jo.T);
            mm_bench_dims(&jo);
            mm_bench_str("routing", "balanced");
            mm_bench_int("ep", jo.ranks);
            mm_bench_int("hosts", jo.hosts > 0 ? jo.hosts : 1);
            mm_bench_int("workers", threads);
            mm_bench_num("fwd_bwd_ms", t_torch);
            mm_bench_num("tflops", mm_moe_flops(jo.ranks, jo.T, jo.H, jo.I, jo.K) /
                                       (t_torch * 1e-3) * 1e-12);
            mm_bench_num("out_sum_torch", checksum);
            if (same >= 0) {
                mm_bench_bool("same_output_as_megamoe", same == 1);
                mm_bench_num("output_rel_l2_vs_megamoe", cmp_l2);
                mm_bench_num("output_rel_max_vs_megamoe", cmp_max);
            }
        }
    }
    mm_bench_end();
    if (set_gemm) { /* as found */
        if (env_gemm) setenv("MEGAMOE_GEMM", env_gemm_copy, 1);
        else unsetenv("MEGAMOE_GEMM");
    }
    if (n_gemms > 1) {
        fprintf(stderr, "\nfwd+bwd, MEGAMOE_GEMM=%s against =%s (slowest rank, medians, separate "
                        "jobs; target, large shape, amx against onednn: >= 1.30x faster):\n", gemms[0], gemms[1]);
        const int amx_first = !strcmp(gemms[0], "amx") && !strcmp(gemms[1], "onednn");
        for (int i = 0; i < n_by_gemm; i++)
            for (int j = 0; j < n_by_gemm; j++) {
                if (by_gemm[i].g != 0 || by_gemm[j].g != 1 || strcmp(by_gemm[i].key, by_gemm[j].key))
                    continue;
                const double speed = by_gemm[j].t / by_gemm[i].t; /* > 1: gemms[0] is faster */
                /* the target is the large shape's (GEMM-bound); the seed shape is mostly
                 * dispatch, combine and call overheads */
                const int target = amx_first && !strncmp(by_gemm[i].key, "large ", 6);
                fprintf(stderr, "  %-40s %7.1f ms vs %7.1f ms  %5.2fx%s\n", by_gemm[i].key,
                        by_gemm[i].t * 1e3, by_gemm[j].t * 1e3, speed,
                        target ? (speed >= 1.3 ? "  met" : "  NOT met") : "");
            }
    }
    if (n_rep_targets) {
        fprintf(stderr, "\nfwd+bwd against the same variant with balanced routing (slowest rank, "
                        "medians; target with replicas, 1 worker per rank, large shape):\n");
        for (int i = 0; i < n_rep_targets; i++) {
            const mm_target_row_t *t = &rep_targets[i];
            if (t->target > 0)
                fprintf(stderr, "  %-52s %5.2fx  target <= %.2fx  %s\n", t->label, t->ratio,
                        t->target, t->ratio <= t->target ? "met" : "NOT met");
            else
                fprintf(stderr, "  %-52s %5.2fx\n", t->label, t->ratio);
        }
    }
    if (n_peak_targets) {
        fprintf(stderr, "\ntraining step (weights changed every step, re-pack included), large shape, "
                        "against the probed %s peak of the cores used (target >= 85 %%):\n",
                peak.gflops > 0 ? peak.unit : "(no probe)");
        for (int i = 0; i < n_peak_targets; i++) {
            const mm_target_row_t *t = &peak_targets[i];
            fprintf(stderr, "  %-40s %5.1f %%  %s\n", t->label, t->ratio,
                    t->ratio >= t->target ? "met" : "NOT met");
        }
    }
    if (n_targets) {
        fprintf(stderr, "\nO1/O0 speed (fwd+bwd, slowest rank, medians of interleaved "
                        "iterations; targets at 1 worker per rank):\n");
        for (int i = 0; i < n_targets; i++) {
            const mm_target_row_t *t = &targets[i];
            if (t->target > 0)
                fprintf(stderr, "  %-40s %5.2fx  target >= %.2fx  %s\n", t->label, t->ratio,
                        t->target, t->ratio >= t->target ? "met" : "NOT met");
            else
                fprintf(stderr, "  %-40s %5.2fx\n", t->label, t->ratio);
        }
    }
    if (n_wire_targets) {
        fprintf(stderr, "\nacross hosts at the wire's speed (issue 31; engine's own put %.2f GB/s at 1 "
                "MiB, round trip %.1f us): large shape: extra time over one host / wire floor <= "
                "1.3; seed shape: over one host <= 2.0; 1 worker, balanced:\n", eng.put_gbps,
                eng.signal_rtt_us);
        for (int i = 0; i < n_wire_targets; i++) {
            const mm_target_row_t *t = &wire_targets[i];
            fprintf(stderr, "  %-46s %5.2fx %s%s\n", t->label, t->ratio,
                    t->over_floor == 1 ? "of the wire floor" : t->over_floor == 2 ? "" : "of one host",
                    t->target > 0 ? (t->ratio <= t->target ? "  met" : "  NOT met") : "");
        }
    }
    if (n_host_targets) {
        fprintf(stderr, "\nfwd+bwd on %d hosts x %d rank%s over the same job on 1 host (slowest rank; "
                "target <= 1.15x):\n", o.hosts, o.ranks / o.hosts, o.ranks / o.hosts == 1 ? "" : "s");
        for (int i = 0; i < n_host_targets; i++) {
            const mm_target_row_t *t = &host_targets[i];
            fprintf(stderr, "  %-40s %5.2fx  %s\n", t->label, t->ratio,
                    t->ratio <= t->target ? "met" : "NOT met");
        }
    }
    return rc;
}

const mm_bench_def_t mm_bench_layer_def = {
    "layer", "MegaMoE forward+backward vs a pure-PyTorch EP layer (2 ranks, same data)",
    mm_bench_layer_main};
