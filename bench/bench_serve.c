/* bench serve: the serving MegaMoE (`mega_moe`) against the unfused path a CPU user would write
 * today (DispatchV2 -> per-expert torch matmuls + SwiGLU -> CombineV2; `unfused_gmm`: the same
 * through the companion npu_grouped_matmul operators), in the same job on the
 * same weights, tokens and routing (bench/serve_bench.py on every rank), for decode (1, 8, 32,
 * 128 tokens per rank) and prefill (2048, 4096) on a DeepSeek-like shape sized to this machine
 * (H 4096, I 1024, E 64, K 8: 0.8 GB of bf16 expert weights per rank, far beyond the last-level
 * cache) and on the seed shape (H 512, I 128, E 4, K 2), for bf16, w8a8 and w4a8, optionally
 * on simulated hosts (--hosts 2, root).
 *
 * Each row carries its physical floor: the expert weight bytes the call touches on the slowest
 * rank at the per-core read bandwidth measured with as many concurrently streaming cores as
 * the job uses (ranks x threads, at most the cores), plus that rank's dispatch/combine bytes
 * at the per-core copy bandwidth measured the same way; `over_floor` = ms / floor_ms; prefill
 * rows carry `pct_peak`, the job's flops (6HI per received row) over the probed BF16 peak of
 * the cores used. `ms` is the median over iterations of the slowest rank's time per call
 * (iterations interleaved between the two implementations). Targets: docs/serve.md. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/cpu.h"
#include "kernels/peak.h"

#include "bench_util.h"
#include "bench_wire.h"

typedef struct {
    const char *name;
    int64_t H, I, E, K;
} mm_serve_shape_t;

static const mm_serve_shape_t mm_serve_shapes[] = {
    {"deepseek", 4096, 1024, 64, 8},
    {"seed", 512, 128, 4, 2},
    {"small", 256, 128, 8, 4}, /* --small: a quick check that the bench works */
};

/* ---- bandwidth probes: every thread streams its own buffer at the same time ------------------ */

typedef struct {
    size_t bytes;
    int copy;
    pthread_barrier_t *bar;
    double seconds;
    uint64_t sink;
} mm_bw_job_t;

static void *mm_bw_alloc(size_t bytes)
{
    void *p = aligned_alloc((size_t)2 << 20, bytes);
#ifdef MADV_HUGEPAGE
    if (p) (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

static void *mm_bw_thread(void *arg)
{
    mm_bw_job_t *j = arg;
    const size_t n = j->bytes / sizeof(uint64_t);
    /* on 2 MiB pages where the kernel gives them, as the weight caches are (on 4 KiB pages
     * the TLB misses held this probe below what the decode GEMMs stream: floors too high) */
    uint64_t *a = mm_bw_alloc(j->bytes), *b = j->copy ? mm_bw_alloc(j->bytes) : NULL;
    if (a == NULL || (j->copy && b == NULL)) {
        free(a);
        free(b);
        pthread_barrier_wait(j->bar);
        pthread_barrier_wait(j->bar);
        j->seconds = -1;
        return NULL;
    }
    for (size_t i = 0; i < n; i++) a[i] = i * 0x9e3779b97f4a7c15ull;
    if (b) memset(b, 1, j->bytes);
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) {
        pthread_barrier_wait(j->bar);
        uint64_t t0 = mm_now_ns();
        if (j->copy) {
            memcpy(b, a, j->bytes);
        } else {
            uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (size_t i = 0; i + 4 <= n; i += 4) {
                s0 += a[i];
                s1 ^= a[i + 1];
                s2 += a[i + 2];
                s3 ^= a[i + 3];
            }
            j->sink += s0 + s1 + s2 + s3;
        }
        double s = (double)(mm_now_ns() - t0) * 1e-9;
        if (rep > 0 && s < best) best = s; /* the first pass faults pages in */
        pthread_barrier_wait(j->bar);
    }
    j->seconds = best;
    free(a);
    free(b);
    return NULL;
}

/* Per-core GB/s with `threads` streaming at once (read: bytes read; copy: bytes copied). */
static double mm_bw_probe(int threads, int copy)
{
    pthread_t tid[256];
    mm_bw_job_t jobs[256];
    pthread_barrier_t bar;
    if (threads > 256) threads = 256;
    pthread_barrier_init(&bar, NULL, (unsigned)threads);
    for (int t = 0; t < threads; t++) {
        jobs[t] = (mm_bw_job_t){.bytes = (size_t)256 << 20, .copy = copy, .bar = &bar};
        pthread_create(&tid[t], NULL, mm_bw_thread, &jobs[t]);
    }
    double worst = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        if (jobs[t].seconds < 0) worst = -1;
        else if (worst >= 0 && jobs[t].seconds > worst) worst = jobs[t].seconds;
    }
    pthread_barrier_destroy(&bar);
    return worst > 0 ? (double)((size_t)256 << 20) / worst * 1e-9 : 0.0;
}

/* ---- one job ------------------------------------------------------------------------------ */

/* The rows a job wrote (flat JSON objects), kept to add fields before they are printed. */
#define MM_SERVE_MAX_ROWS 256
#define MM_SERVE_MAX_FIELDS 32
typedef struct {
    char key[48], str[64];
    double num;
    int kind; /* 1 string, 2 integer, 3 number */
} mm_serve_field_t;
typedef struct {
    mm_serve_field_t f[MM_SERVE_MAX_FIELDS];
    int nf;
} mm_serve_row_t;
typedef struct {
    mm_serve_row_t rows[MM_SERVE_MAX_ROWS];
    int n;
} mm_serve_rows_t;

static const mm_serve_field_t *mm_serve_get(const mm_serve_row_t *r, const char *key)
{
    for (int i = 0; i < r->nf; i++)
        if (!strcmp(r->f[i].key, key)) return &r->f[i];
    return NULL;
}

static void mm_serve_emit(const mm_serve_row_t *r)
{
    for (int i = 0; i < r->nf; i++) {
        const mm_serve_field_t *f = &r->f[i];
        if (f->kind == 1) mm_bench_str(f->key, f->str);
        else if (f->kind == 2) mm_bench_int(f->key, (long long)f->num);
        else mm_bench_num(f->key, f->num);
    }
}

/* What every job of the run shares: the placement and the probes behind the floors. */
typedef struct {
    int ranks, hosts, threads;
    int streams;          /* cores the read probe ran on at once (ranks x threads, at most cores) */
    double read_gbs;      /* per core, `streams` cores reading at once */
    double read_one_gbs;  /* one core reading alone */
    double copy_gbs, peak_gflops, int8_gops;
    const char *script;
    const mm_bench_wire_engine_t *eng;
    const char *between; /* --between: what runs before each timed fused call ("": nothing) */
} mm_serve_env_t;

/* One launch of bench/serve_bench.py. `paired` (hosts 2, 2 ranks): 4 ranks on the 2 hosts run
 * the one-host and the two-host group call by call (bench/serve_bench_paired.py); its rows of
 * hosts 1 go to `one`, the others to `out`. */
static int mm_serve_job(const mm_serve_env_t *env, int hosts, int paired, const mm_serve_shape_t *sh,
                        const char *tokens, const char *quant, const char *impl, int iters,
                        int warmup, mm_serve_rows_t *one, mm_serve_rows_t *out)
{
    const int ranks = env->ranks, threads = env->threads;
    const char *script = env->script;
    char dir[] = "/tmp/megamoe-serve-XXXXXX";
    if (mkdtemp(dir) == NULL) return -1;
    char outp[256], a[16][64];
    snprintf(outp, sizeof outp, "%s/rows.jsonl", dir);
    snprintf(a[0], 64, "%d", paired ? ranks * hosts : ranks);
    snprintf(a[1], 64, "%s:%lld:%lld:%lld:%lld", sh->name, (long long)sh->H, (long long)sh->I,
             (long long)sh->E, (long long)sh->K);
    snprintf(a[2], 64, "%d", iters);
    snprintf(a[3], 64, "%d", warmup);
    snprintf(a[4], 64, "%.4f", env->read_gbs);
    snprintf(a[5], 64, "%.4f", env->copy_gbs);
    snprintf(a[6], 64, "%.4f", env->peak_gflops);
    snprintf(a[7], 64, "%d", threads);
    snprintf(a[8], 64, "%d", hosts);
    snprintf(a[9], 64, "%.4f", env->read_one_gbs);
    snprintf(a[10], 64, "%d", env->streams);
    snprintf(a[11], 64, "%.4f", env->int8_gops);
    /* the heap: the largest call's receive rows (tokens x ranks x min(K, L)) plus room */
    long long max_tok = 0;
    for (const char *p = tokens; *p;) {
        long long t = atoll(p);
        if (t > max_tok) max_tok = t;
        const char *c = strchr(p, ',');
        if (!c) break;
        p = c + 1;
    }
    long long L = sh->E / ranks, mk = sh->K < L ? sh->K : L;
    long long row = ((sh->H * 2 + 63) / 64) * 64;
    long long heap = (max_tok * ranks * mk * row) + (256ll << 20);
    if (paired) heap *= 2; /* rank 0 holds a buffer in each group */
    heap = (heap + (64ll << 20) - 1) / (64ll << 20) * (64ll << 20);
    char heap_s[32];
    snprintf(heap_s, sizeof heap_s, "%lld", heap);
    const char *self = mm_bench_self_exe();
    char *argv[64] = {(char *)self, "launch", "-n", a[0]};
    int k = 4;
    if (hosts > 1) {
        argv[k++] = "--hosts";
        argv[k++] = a[8];
    }
    char *tail[] = {"--timeout", "3600", "--", (char *)mm_bench_python(), (char *)script,
                    "--shape", a[1], "--tokens", (char *)tokens, "--quant", (char *)quant,
                    "--impl", (char *)impl, "--iters", a[2], "--warmup", a[3], "--read-gbs", a[4],
                    "--copy-gbs", a[5], "--peak-gflops", a[6], "--threads", a[7], "--hosts", a[8],
                    "--read-one-gbs", a[9], "--streams", a[10], "--peak-int8-gops", a[11],
                    "--out", outp, "--between", (char *)env->between,
                    paired ? "--paired-hosts" : NULL, NULL};
    memcpy(argv + k, tail, sizeof tail);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE", heap_s, 0);
        setenv("MEGAMOE_THREADS", a[7], 0);
        setenv("OMP_NUM_THREADS", a[7], 1);
        setenv("MEGAMOE_LOG_LEVEL", "warn", 0);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, 1); /* the ranks' JSON lines: the file is the record */
        execv(self, argv);
        _exit(127);
    }
    int status = 0, rc = -1;
    if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        FILE *f = fopen(outp, "r");
        char line[2048];
        mm_serve_row_t scratch;
        while (f && fgets(line, sizeof line, f)) {
            mm_serve_row_t *row = &scratch;
            memset(row, 0, sizeof *row);
            /* flat JSON objects of strings and numbers, field by field */
            char *p = line;
            while ((p = strchr(p, '"')) != NULL && row->nf < MM_SERVE_MAX_FIELDS) {
                mm_serve_field_t *fd = &row->f[row->nf];
                char *e = strchr(p + 1, '"');
                if (!e || (size_t)(e - p - 1) >= sizeof fd->key) break;
                memcpy(fd->key, p + 1, (size_t)(e - p - 1));
                fd->key[e - p - 1] = '\0';
                p = e + 1;
                while (*p == ':' || *p == ' ') p++;
                if (*p == '"') {
                    char *q = strchr(p + 1, '"');
                    if (!q) break;
                    size_t n = (size_t)(q - p - 1) < sizeof fd->str - 1 ? (size_t)(q - p - 1) : sizeof fd->str - 1;
                    memcpy(fd->str, p + 1, n);
                    fd->str[n] = '\0';
                    fd->kind = 1;
                    p = q + 1;
                } else if (!strncmp(p, "null", 4)) {
                    p += 4;
                    continue;
                } else {
                    char *end;
                    fd->num = strtod(p, &end);
                    if (end == p) break;
                    fd->kind = 2;
                    for (char *c = p; c < end; c++) fd->kind = (*c >= '0' && *c <= '9') || *c == '-' ? fd->kind : 3;
                    p = end;
                }
                row->nf++;
            }
            const mm_serve_field_t *h = mm_serve_get(row, "hosts");
            mm_serve_rows_t *to = paired && h && h->num == 1 ? one : out;
            if (to->n < MM_SERVE_MAX_ROWS) to->rows[to->n++] = *row;
            rc = 0;
        }
        if (f) fclose(f);
    }
    unlink(outp);
    rmdir(dir);
    return rc;
}

int mm_bench_serve_loop(int argc, char **argv); /* bench_serve_loop.c */

/* One job (and, across hosts, its one-host twin first): its rows, with the wire fields. */

static int mm_serve_run(const mm_serve_env_t *env, const mm_serve_shape_t *sh, const char *tokens,
                        const char *quant, const char *impl, int iters, int warmup, int step,
                        int total)
{
    const int ranks = env->ranks, hosts = env->hosts;
    const mm_bench_wire_engine_t eng = *env->eng;
    int rc = 0;
    char label[200];
    snprintf(label, sizeof label, "serve %s (H %lld, I %lld, E %lld, K %lld), tokens %s, %d "
             "ranks, %d host%s", sh->name, (long long)sh->H, (long long)sh->I, (long long)sh->E,
             (long long)sh->K, tokens, ranks, hosts, hosts > 1 ? "s" : "");
    mm_bench_progress(step, total, label);
    static mm_serve_rows_t one, many;
    one.n = many.n = 0;
    /* across hosts, the reference of the wire's share is the same job on one host: with 2 ranks
     * on 2 hosts and only the fused call, both run in one job call by call (the drift of the
     * memory bandwidth between two jobs outweighed the wire); else the one-host job first */
    const int paired = hosts == 2 && ranks == 2 && !strcmp(impl, "mega_moe");
    if (hosts > 1 && !paired &&
        mm_serve_job(env, 1, 0, sh, tokens, quant, impl, iters, warmup, NULL, &one) != 0) {
        fprintf(stderr, "megamoe bench serve: the one-host job failed for %s\n", label);
        rc = 1;
    }
    if (mm_serve_job(env, hosts, paired, sh, tokens, quant, impl, iters, warmup, &one, &many) != 0) {
        fprintf(stderr, "megamoe bench serve: the job failed for %s\n", label);
        rc = 1;
    }
    for (int i = 0; i < one.n; i++) { /* the one-host rows too (hosts = 1) */
        mm_bench_row();
        mm_serve_emit(&one.rows[i]);
    }
    for (int i = 0; i < many.n; i++) {
        const mm_serve_row_t *r = &many.rows[i];
        mm_bench_row();
        mm_serve_emit(r);
        if (hosts <= 1) continue;
        /* over_wire_floor = the time over the same call on one host / the wire floor (issue
         * 31's: the bytes at the engine's put rate plus 4 engine round trips, as
         * dispatch+combine). The time over: the paired job's extra_ms (median of per-iteration
         * differences to the one-host twin made just before), else ms - ms on one host. */
        const mm_serve_field_t *ms = mm_serve_get(r, "ms"), *by = mm_serve_get(r, "bytes_to_other_hosts");
        const mm_serve_field_t *extra = mm_serve_get(r, "extra_ms");
        double ms1 = -1;
        for (int k = 0; k < one.n; k++) {
            const mm_serve_row_t *o = &one.rows[k];
            const mm_serve_field_t *a = mm_serve_get(o, "impl"), *b = mm_serve_get(r, "impl");
            const mm_serve_field_t *qa = mm_serve_get(o, "quant"), *qb = mm_serve_get(r, "quant");
            const mm_serve_field_t *ta = mm_serve_get(o, "tokens"), *tb = mm_serve_get(r, "tokens");
            if (a && b && qa && qb && ta && tb && !strcmp(a->str, b->str) &&
                !strcmp(qa->str, qb->str) && ta->num == tb->num)
                ms1 = mm_serve_get(o, "ms")->num;
        }
        if (eng.ok && ms && by && ms1 >= 0) {
            const double floor = mm_bench_wire_floor_ms(&eng, by->num, 4);
            mm_bench_num("ms_one_host", ms1);
            mm_bench_num("wire_floor_ms", floor);
            const double over = extra ? extra->num : ms->num - ms1;
            mm_bench_num("over_wire_floor", floor > 0 ? over / floor : 0);
        }
    }
    return rc;
}

static int mm_bench_serve_main(int argc, char **argv)
{
    if (mm_bench_opt(argc, argv, "--loop", NULL) && !mm_bench_flag(argc, argv, "--help"))
        return mm_bench_serve_loop(argc, argv);
    if (mm_bench_flag(argc, argv, "--help")) {
        fprintf(stderr,
                "megamoe bench serve [--shapes deepseek,seed] [--tokens 1,8,32,128,2048,4096]\n"
                "    [--quant bf16,w8a8,w4a8] [--impl mega_moe,unfused,unfused_gmm] [--ranks 2]\n"
                "    [--hosts 1]\n"
                "    [--threads T] [--iters 5] [--warmup 1] [--small] [--acceptance]\n"
                "    [--prefill-iters 3] [--between spin:MS|stream:MB|fault:MB]\n"
                "  the serving MegaMoE against the unfused paths, rows with floor_ms, over_floor,\n"
                "  cpu_ms, sys_ms, minflt, speedup_vs_*, pct_peak (prefill); --small: a tiny\n"
                "  shape, decode sizes (checks the bench works); --acceptance: only the rows\n"
                "  issue 27's targets read (deepseek decode 1,8,32 every impl + prefill 4096\n"
                "  mega_moe; with --hosts 2 the decode rows of mega_moe); --between: before\n"
                "  each timed mega_moe call, busy-wait MS ms, read an MB-MiB array, or map,\n"
                "  touch and unmap MB MiB of fresh pages (what a long call before it does to\n"
                "  the fused call)\n"
                "megamoe launch -n N [--fault kill-rank:R@S] --timeout T -- megamoe bench serve\n"
                "    --loop SECONDS [--shape tiny|small|H:I:E:K] [--tokens 8] [--out FILE]\n"
                "  one rank of a serving loop through lost ranks (bench/bench_serve_loop.c): a\n"
                "  JSON row per surviving rank (calls_before, failed_calls, recover_ms,\n"
                "  calls_after, wrong_outputs; docs/reliability.md)\n");
        return 0;
    }
    const int small = mm_bench_flag(argc, argv, "--small");
    const int acceptance = mm_bench_flag(argc, argv, "--acceptance");
    const int prefill_iters = atoi(mm_bench_opt(argc, argv, "--prefill-iters", "3"));
    const char *shapes = mm_bench_opt(argc, argv, "--shapes", small ? "small" : "deepseek,seed");
    const char *tokens = mm_bench_opt(argc, argv, "--tokens", small ? "1,8,32" : "1,8,32,128,2048,4096");
    const char *quant = mm_bench_opt(argc, argv, "--quant", "bf16,w8a8,w4a8");
    const char *impl = mm_bench_opt(argc, argv, "--impl", "mega_moe,unfused,unfused_gmm");
    const int ranks = atoi(mm_bench_opt(argc, argv, "--ranks", "2"));
    const int hosts = atoi(mm_bench_opt(argc, argv, "--hosts", "1"));
    const int iters = atoi(mm_bench_opt(argc, argv, "--iters", small ? "3" : "5"));
    const int warmup = atoi(mm_bench_opt(argc, argv, "--warmup", "1"));
    const char *between = mm_bench_opt(argc, argv, "--between", "");
    int cores = mm_cpu_count();
    int threads = atoi(mm_bench_opt(argc, argv, "--threads", "0"));
    if (threads <= 0) threads = cores / ranks > 0 ? cores / ranks : 1;
    char script[4096];
    if (mm_bench_script("serve_bench.py", script, sizeof script) != 0) {
        fprintf(stderr, "megamoe bench serve: bench/serve_bench.py not found (run from the "
                        "repository or an installed prefix)\n");
        return 2;
    }
    /* probes: as many streaming cores as the job uses (ranks x threads, at most the cores) —
     * with --hosts too: the simulated hosts share this machine's memory system, and probing one
     * host's cores alone gave a per-core rate twice what each rank gets while all stream (the
     * one-host twin's floors then came out 2x too low) */
    int streams = ranks * threads < cores ? ranks * threads : cores;
    if (streams < 1) streams = 1;
    mm_bench_progress(0, 1, "probing read and copy bandwidth, BF16 peak");
    const double read_gbs = mm_bw_probe(streams, 0), copy_gbs = mm_bw_probe(streams, 1);
    /* one core alone: what the rank with the most weights gets once the others are done */
    const double read_one_gbs = streams > 1 ? mm_bw_probe(1, 0) : read_gbs;
    mm_peak_t peak;
    memset(&peak, 0, sizeof peak);
    const int peak_ok = mm_kernels_peak_probe(0.2, &peak) == 0;
    double peak_gflops = peak_ok ? peak.gflops : 0.0, int8_gops = peak_ok ? peak.int8_gops : 0.0;
    fprintf(stderr, "bench serve: %d streaming cores: read %.2f GB/s per core (one core alone "
            "%.2f), copy %.2f GB/s per core; BF16 peak %.1f GFLOP/s per core (%s), INT8 %.1f "
            "GOP/s\n", streams, read_gbs, read_one_gbs, copy_gbs, peak_gflops, peak.unit,
            int8_gops);
    mm_bench_wire_engine_t eng;
    memset(&eng, 0, sizeof eng);
    if (hosts > 1) mm_bench_wire_engine_measure(hosts, &eng); /* UCX's own put rate and RTT */
    mm_bench_begin("serve");
    const mm_serve_env_t env = {ranks,        hosts,    threads,     streams,   read_gbs,
                                read_one_gbs, copy_gbs, peak_gflops, int8_gops, script,
                                &eng,         between};
    int rc = 0;
    const int n_shapes = (int)(sizeof mm_serve_shapes / sizeof mm_serve_shapes[0]);
    if (acceptance) {
        /* the rows issue 27's targets read, nothing else: the DeepSeek-like shape's decode
         * (1, 8, 32 per rank; every implementation on one host, the fused call across hosts)
         * and, on one host, its prefill at 4096 (the fused call: pct_peak, w8a8 vs bf16) */
        const mm_serve_shape_t *ds = &mm_serve_shapes[0];
        const int total = hosts > 1 ? 1 : 2;
        rc |= mm_serve_run(&env, ds, "1,8,32", quant, hosts > 1 ? "mega_moe" : impl, iters,
                           warmup, 1, total);
        if (hosts <= 1)
            rc |= mm_serve_run(&env, ds, "4096", quant, "mega_moe", prefill_iters, 1, 2, total);
    } else {
        int step = 0, total = 0;
        for (int s = 0; s < n_shapes; s++) total += strstr(shapes, mm_serve_shapes[s].name) != NULL;
        for (int s = 0; s < n_shapes; s++)
            if (strstr(shapes, mm_serve_shapes[s].name))
                rc |= mm_serve_run(&env, &mm_serve_shapes[s], tokens, quant, impl, iters, warmup,
                                   ++step, total);
    }
    mm_bench_row();
    mm_bench_str("impl", "probe");
    if (hosts > 1 && eng.ok) {
        mm_bench_num("engine_put_gbps", eng.put_gbps);
        mm_bench_num("engine_signal_rtt_us", eng.signal_rtt_us);
    }
    mm_bench_int("streaming_cores", streams);
    mm_bench_num("read_gbs_per_core", read_gbs);
    mm_bench_num("read_gbs_one_core", read_one_gbs);
    mm_bench_num("copy_gbs_per_core", copy_gbs);
    mm_bench_num("bf16_peak_gflops_per_core", peak_gflops);
    mm_bench_num("int8_peak_gops_per_core", int8_gops);
    mm_bench_str("peak_unit", peak.unit ? peak.unit : "none");
    /* "none" without AVX512-VNNI or AMX-INT8 (an AVX2 CPU): the quantised floors are then
     * memory-only (their plain-C kernels have no unit to be measured against) */
    mm_bench_str("int8_unit", peak_ok && peak.int8_unit ? peak.int8_unit : "none");
    mm_bench_end();
    return rc;
}

const mm_bench_def_t mm_bench_serve_def = {
    "serve", "mega_moe vs the unfused path: decode and prefill, bf16/w8a8/w4a8, with floors",
    mm_bench_serve_main};
