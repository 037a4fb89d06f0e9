/* bench layer: MegaMoeExperts forward+backward (this library, O0) beside a pure-PyTorch
 * expert-parallel MoE layer (torch 1.13 bf16 matmuls + gloo all_to_all_single, autograd) on the
 * same data in the same run, for the seed shape (T=1024, H=512, I=128, E=4, K=2) and a large one
 * (T=4096, H=2048, I=1024, E=8, K=2), 2 ranks. Each side runs in its own `megamoe launch -n 2`
 * job; times are the slowest rank's median. TFLOP/s counts 18*H*I flops per (token, choice)
 * over the whole job (forward 6HI, backward 12HI). Public headers only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "megamoe/megamoe.h"

#include "bench_util.h"
#include "moe_job.h"

typedef struct {
    const char *name;
    int64_t T, H, I, E, K;
} mm_layer_shape_t;

static const mm_layer_shape_t mm_layer_shapes[] = {
    {"seed", 1024, 512, 128, 4, 2},
    {"large", 4096, 2048, 1024, 8, 2},
};

/* <repo>/bench/torch_moe_layer.py from <repo>/build/<preset>/bin/megamoe, else ./bench/... */
static int mm_torch_script(char *out, size_t len)
{
    const char *self = mm_bench_self_exe();
    char dir[3072];
    snprintf(dir, sizeof dir, "%s", self);
    for (int up = 0; up < 4; up++) {
        char *slash = strrchr(dir, '/');
        if (slash == NULL) break;
        *slash = '\0';
        snprintf(out, len, "%.3000s/bench/torch_moe_layer.py", dir);
        if (access(out, R_OK) == 0) return 0;
    }
    snprintf(out, len, "bench/torch_moe_layer.py");
    return access(out, R_OK) == 0 ? 0 : -1;
}

/* Run the PyTorch baseline on 2 ranks; fills ms (fwd+bwd) and checksum. 0 on success. */
static int mm_run_torch(const mm_moe_job_opts_t *o, int threads, const char *script,
                        double *ms, double *checksum)
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
    char *argv[] = {(char *)self, "launch", "-n", a[0], "--timeout", "1800", "--",
                    "/usr/bin/python3", (char *)script, "--tokens", a[1], "--hidden", a[2],
                    "--intermediate", a[3], "--experts", a[4], "--top-k", a[5], "--seed", a[6],
                    "--iters", a[7], "--warmup", a[8], "--threads", a[9], "--out", outp, NULL};
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

static int mm_bench_layer_main(int argc, char **argv)
{
    mm_moe_job_opts_t o;
    mm_moe_job_defaults(&o);
    o.iters = 3;
    o.verify = 0;
    const char *job_dir = NULL, *shapes = "seed,large", *torch = "yes";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            printf("usage: megamoe bench layer [--shapes seed,large] [--torch yes|no] "
                   "[--iters N] [--warmup N] [--workers W] [--routing balanced] [--schedule O0]\n"
                   "MegaMoE forward+backward vs a pure-PyTorch EP layer, 2 ranks, same data.\n");
            return 0;
        }
        if (!strcmp(argv[i], "--job-dir") && i + 1 < argc) job_dir = argv[++i];
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) shapes = argv[++i];
        else if (!strcmp(argv[i], "--torch") && i + 1 < argc) torch = argv[++i];
        else {
            int rc = mm_moe_job_parse_arg(&o, argc, argv, &i);
            if (rc <= 0) {
                if (rc == 0) fprintf(stderr, "megamoe bench layer: unknown option '%s'\n", argv[i]);
                return 2;
            }
        }
    }
    if (job_dir) { /* one rank of the megamoe side */
        mm_moe_job_result_t r;
        int rc = mm_moe_job_rank(&o, &r);
        char path[512];
        snprintf(path, sizeof path, "%s/rank%d.txt", job_dir, r.rank);
        if (mm_moe_job_write(path, &r) != 0) return 1;
        return rc;
    }
    char script[4096];
    int with_torch = strcmp(torch, "no") != 0;
    if (with_torch && mm_torch_script(script, sizeof script) != 0) {
        fprintf(stderr, "megamoe bench layer: bench/torch_moe_layer.py not found (run from the "
                        "repository or pass --torch no)\n");
        return 2;
    }
    mm_bench_begin("layer");
    int n_shapes = (int)(sizeof mm_layer_shapes / sizeof mm_layer_shapes[0]), step = 0, rc = 0;
    int total = 0;
    for (int s = 0; s < n_shapes; s++) total += strstr(shapes, mm_layer_shapes[s].name) ? 1 + with_torch : 0;
    for (int s = 0; s < n_shapes; s++) {
        const mm_layer_shape_t *sh = &mm_layer_shapes[s];
        if (!strstr(shapes, sh->name)) continue;
        mm_moe_job_opts_t jo = o;
        jo.T = sh->T;
        jo.H = sh->H;
        jo.I = sh->I;
        jo.E = sh->E;
        jo.K = sh->K;
        double flops = mm_moe_flops(jo.ranks, jo.T, jo.H, jo.I, jo.K);
        char label[96];
        snprintf(label, sizeof label, "megamoe %s shape", sh->name);
        mm_bench_progress(++step, total, label);
        mm_moe_job_result_t res[64];
        const char *sub[] = {"bench", "layer", NULL};
        if (jo.ranks > 64 || mm_moe_job_launch(&jo, sub, res) != 0) {
            fprintf(stderr, "megamoe bench layer: the megamoe job failed for shape %s\n", sh->name);
            rc = 1;
            continue;
        }
        double t = 0;
        for (int r = 0; r < jo.ranks; r++)
            if (res[r].iter_median_s > t) t = res[r].iter_median_s;
        double t_torch = 0, checksum = 0;
        int have_torch = 0;
        if (with_torch) {
            snprintf(label, sizeof label, "torch %s shape", sh->name);
            mm_bench_progress(++step, total, label);
            have_torch = mm_run_torch(&jo, res[0].workers, script, &t_torch, &checksum) == 0;
            if (!have_torch) {
                fprintf(stderr, "megamoe bench layer: the PyTorch baseline failed for shape %s\n",
                        sh->name);
                rc = 1;
            }
        }
        mm_bench_row();
        mm_bench_str("impl", "megamoe");
        mm_bench_str("schedule", jo.schedule);
        mm_bench_str("shape", sh->name);
        mm_bench_str("routing", mm_route_name(jo.route));
        mm_bench_int("ep", jo.ranks);
        mm_bench_int("workers", res[0].workers);
        mm_bench_num("fwd_bwd_ms", t * 1e3);
        mm_bench_num("tflops", flops / t * 1e-12);
        if (have_torch) mm_bench_num("speedup_vs_torch", t_torch * 1e-3 / t);
        if (have_torch) {
            mm_bench_row();
            mm_bench_str("impl", "torch");
            mm_bench_str("schedule", "-");
            mm_bench_str("shape", sh->name);
            mm_bench_str("routing", mm_route_name(jo.route));
            mm_bench_int("ep", jo.ranks);
            mm_bench_int("workers", res[0].workers);
            mm_bench_num("fwd_bwd_ms", t_torch);
            mm_bench_num("tflops", flops / (t_torch * 1e-3) * 1e-12);
            /* same data: the rank-0 output sums of the two implementations agree to bf16
             * rounding noise */
            mm_bench_num("out_sum_torch", checksum);
            mm_bench_num("out_sum_megamoe", res[0].checksum);
        }
    }
    mm_bench_end();
    return rc;
}

const mm_bench_def_t mm_bench_layer_def = {
    "layer", "MegaMoE forward+backward vs a pure-PyTorch EP layer (2 ranks, same data)",
    mm_bench_layer_main};
