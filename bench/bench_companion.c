/* bench companion: a real caller's MoE block through megamoe.ops (torch_npu's companion
 * operators: gating_top_k, dispatch_v2, npu_grouped_matmul, npu_dequant_swiglu_quant,
 * combine_v2) against the same block as a CPU user writes it in plain torch (a per-expert loop
 * over F.linear with the weights dequantised to bf16 once at load, torch's bf16 matmul), in
 * one run on the same weights and routing: bench/companion_block.py on R ranks under
 * `megamoe launch`. Decode (few tokens per rank) and prefill phases; the slowest rank's median
 * per phase and implementation. The plain-torch block comes twice: with megamoe's dispatch /
 * combine (only the experts differ: the "torch" rows, the target's baseline) and all in torch
 * with gloo all_to_all ("torch_gloo").
 *
 * Target (issue 28): the vLLM-Ascend MC2 W8A8 block >= 2x faster than the plain-torch block
 * at decode and at prefill. Options: --block mc2_w8a8|mc2_bf16 (comma list), --ranks R,
 * --decode-tokens, --prefill-tokens, --hidden, --intermediate, --experts, --top-k, --iters,
 * --warmup, --impls, --threads (per rank), --quick (small shapes: a check that it runs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"

typedef struct {
    char block[32], phase[16], impl[16];
    long long tokens;
    double ms, err;
} mm_cb_row_t;

static const char *mm_cb_str(const char *line, const char *key, char *out, size_t len)
{
    char pat[48];
    snprintf(pat, sizeof pat, "\"%s\": \"", key);
    const char *p = strstr(line, pat);
    out[0] = '\0';
    if (!p) return out;
    p += strlen(pat);
    size_t n = 0;
    while (p[n] && p[n] != '"' && n + 1 < len) n++;
    memcpy(out, p, n);
    out[n] = '\0';
    return out;
}

static double mm_cb_num(const char *line, const char *key, double def)
{
    char pat[48];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(line, pat);
    double v;
    return p && sscanf(p + strlen(pat), "%lf", &v) == 1 ? v : def;
}

/* Run the block script on `ranks` ranks; rows appended to rows[*n]. 0 on success. */
static int mm_cb_run(const char *script, const char *block, int argc, char **argv, int quick,
                     mm_cb_row_t *rows, int *n, int cap)
{
    char dir[] = "/tmp/megamoe-companion-XXXXXX";
    if (mkdtemp(dir) == NULL) return -1;
    char outp[256];
    snprintf(outp, sizeof outp, "%s/rows.jsonl", dir);
    const char *ranks = mm_bench_opt(argc, argv, "--ranks", "2");
    const char *threads = mm_bench_opt(argc, argv, "--threads", "1");
    /* the shape: a DeepSeek-style layer scaled to the machine (quick: a smoke-sized one) */
    struct {
        const char *flag, *full, *small;
    } opts[] = {{"--decode-tokens", "16", "8"},   {"--prefill-tokens", "512", "64"},
                {"--hidden", "2048", "256"},      {"--intermediate", "1024", "128"},
                {"--experts", "64", "8"},         {"--top-k", "8", "2"},
                {"--iters", "10", "2"},           {"--warmup", "2", "1"},
                {"--impls", "megamoe,torch,torch_gloo", "megamoe,torch,torch_gloo"},
                {"--phases", "decode,prefill", "decode,prefill"}};
    char *av[64] = {(char *)mm_bench_self_exe(), "launch", "-n", (char *)ranks, "--timeout",
                    "3000", "--", (char *)mm_bench_python(), (char *)script, "--block",
                    (char *)block, "--threads", (char *)threads, "--out", outp};
    int k = 15;
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        av[k++] = (char *)opts[i].flag;
        av[k++] = (char *)mm_bench_opt(argc, argv, opts[i].flag, quick ? opts[i].small : opts[i].full);
    }
    av[k] = NULL;
    /* the Python package of a source checkout (an installed one is on the path already) */
    char pkg[1024];
    snprintf(pkg, sizeof pkg, "%s", script);
    char *slash = strrchr(pkg, '/');
    if (slash) {
        snprintf(slash, sizeof pkg - (size_t)(slash - pkg), "/../python");
        struct stat st;
        if (stat(pkg, &st) == 0) {
            const char *old = getenv("PYTHONPATH");
            char buf[4096];
            snprintf(buf, sizeof buf, "%s%s%s", pkg, old ? ":" : "", old ? old : "");
            setenv("PYTHONPATH", buf, 1);
        }
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("OMP_NUM_THREADS", threads, 1);
        execv(av[0], av);
        _exit(127);
    }
    int status = 0, rc = -1;
    if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
        WEXITSTATUS(status) == 0) {
        FILE *f = fopen(outp, "r");
        char line[2048];
        while (f && fgets(line, sizeof line, f) && *n < cap) {
            mm_cb_row_t *r = &rows[(*n)++];
            mm_cb_str(line, "block", r->block, sizeof r->block);
            mm_cb_str(line, "phase", r->phase, sizeof r->phase);
            mm_cb_str(line, "impl", r->impl, sizeof r->impl);
            r->tokens = (long long)mm_cb_num(line, "tokens", 0);
            r->ms = mm_cb_num(line, "ms", -1);
            r->err = mm_cb_num(line, "rel_l2_vs_torch", -1);
            rc = 0;
        }
        if (f) fclose(f);
    }
    unlink(outp);
    rmdir(dir);
    return rc;
}

static const mm_cb_row_t *mm_cb_find(const mm_cb_row_t *rows, int n, const char *block,
                                     const char *phase, const char *impl)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(rows[i].block, block) && !strcmp(rows[i].phase, phase) &&
            !strcmp(rows[i].impl, impl))
            return &rows[i];
    return NULL;
}

static int mm_bench_companion_main(int argc, char **argv)
{
    char script[1024];
    if (mm_bench_script("companion_block.py", script, sizeof script) != 0) {
        fprintf(stderr, "megamoe bench companion: bench/companion_block.py not found (run from "
                        "the source tree or an installed prefix)\n");
        return 1;
    }
    int quick = mm_bench_flag(argc, argv, "--quick");
    char blocks[256];
    snprintf(blocks, sizeof blocks, "%s", mm_bench_opt(argc, argv, "--block", "mc2_w8a8"));
    mm_cb_row_t rows[64];
    int n = 0;
    mm_bench_begin("companion");
    int rc = 0;
    for (char *b = strtok(blocks, ","); b; b = strtok(NULL, ",")) {
        mm_bench_progress(0, 1, b);
        if (mm_cb_run(script, b, argc, argv, quick, rows, &n, 64) != 0) {
            fprintf(stderr, "megamoe bench companion: the %s run failed\n", b);
            rc = 1;
        }
    }
    const char *ranks = mm_bench_opt(argc, argv, "--ranks", "2");
    for (int i = 0; i < n; i++) {
        const mm_cb_row_t *r = &rows[i];
        const mm_cb_row_t *base = mm_cb_find(rows, n, r->block, r->phase, "torch");
        mm_bench_row();
        mm_bench_str("block", r->block);
        mm_bench_str("phase", r->phase);
        mm_bench_str("impl", r->impl);
        mm_bench_int("ranks", atoi(ranks));
        mm_bench_int("tokens_per_rank", r->tokens);
        mm_bench_num("ms", r->ms);
        if (base && base->ms > 0 && r->ms > 0) mm_bench_num("speedup_vs_torch", base->ms / r->ms);
        if (r->err >= 0) mm_bench_num("rel_l2_vs_torch", r->err);
    }
    mm_bench_end();
    fprintf(stderr, "\nTarget (issue 28): the MC2 W8A8 block through megamoe.ops >= 2x the plain-"
                    "torch block (megamoe dispatch/combine + a per-expert bf16 loop):\n");
    for (int i = 0; i < n; i++) {
        const mm_cb_row_t *r = &rows[i];
        if (strcmp(r->impl, "megamoe")) continue;
        const mm_cb_row_t *base = mm_cb_find(rows, n, r->block, r->phase, "torch");
        if (!base || r->ms <= 0) continue;
        double s = base->ms / r->ms;
        int target = !strcmp(r->block, "mc2_w8a8");
        fprintf(stderr, "  %-9s %-8s %8.2f ms vs %8.2f ms: %5.2fx%s\n", r->block, r->phase, r->ms,
                base->ms, s, target ? (s >= 2.0 ? "  met" : "  NOT met") : "");
    }
    return rc;
}

const mm_bench_def_t mm_bench_companion_def = {
    "companion",
    "a caller's MoE block through megamoe.ops vs plain torch (vLLM-A MC2 W8A8; --quick)",
    mm_bench_companion_main,
};
