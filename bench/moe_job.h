/* A multi-rank MegaMoeExperts job for `megamoe run` and `megamoe bench layer` (public headers
 * only). The parent re-executes the megamoe binary through `megamoe launch -n N`; every rank
 * builds the same global problem (moe_data.h), runs warm-up + timed forward+backward
 * iterations of its slice, optionally verifies the first iteration against the fp32
 * reference, and writes its results to <dir>/rank<r>.txt, which the parent reads back. */
#ifndef MM_BENCH_MOE_JOB_H
#define MM_BENCH_MOE_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/megamoe.h"
#include "moe_data.h"

#define MM_JOB_MAX_PHASES 20
#define MM_JOB_MAX_ITERS 100000

typedef struct mm_moe_job_opts {
    int ranks;
    int64_t T, H, I, E, K;
    double capacity_factor; /* 0 = lossless */
    char dispatch_mode[8];  /* "" (fixed capacity), "push" or "pull" */
    double initial_capacity_factor, capacity_growth_factor; /* push: 0 = 1.25 */
    float swiglu_limit;     /* 0 = off */
    char schedule[16];      /* "O1", "O0", or a comparison list "O0,O1" (bench layer) */
    int workers;            /* 0 = default */
    mm_route_pattern_t route;
    uint64_t seed;
    int iters, warmup;
    int verify;             /* 1 = compare the first iteration with the fp32 reference */
    int progress_fd;        /* rank 0 draws progress here; -1 = none */
    double timeout_s;       /* for the launcher; 0 = none */
    int hosts;              /* simulated hosts (megamoe launch --hosts); 0 = plain local ranks */
    char replicas[32];      /* replica_slots_per_rank: "" = 0; a comparison job takes a list
                               ("0,2": every schedule with and without) */
    int profile_variant;    /* comparison: also time O1 with the profiler recording */
    /* per-call token counts (docs/moe.md "Dynamic tokens"): max_tokens > 0 makes the layer a
     * max_local_num_tokens = max_tokens one (T is then max_tokens: the problem's rows per
     * rank) and each call's counts come from tokens_dist (moe_tokens.h; "" = uniform:0-T_cap) */
    int64_t max_tokens;
    char tokens_dist[96];
    /* comparison jobs: also time every schedule as a training step ("O1+step": its own layer,
     * the weights change every step, so each forward re-packs them, as after an optimizer
     * step) */
    int training_step;
    /* comparison jobs: this rank writes the first schedule's first output (bf16 [T, H]) to
     * <dump_dir>/megamoe_out<rank>.bin ("" = not) */
    char dump_dir[200];
} mm_moe_job_opts_t;

/* Defaults: 2 ranks, the seed's example shapes (T=1024, H=512, I=128, E=4, K=2), lossless,
 * O1, balanced routing, seed 1, 5 iterations after 1 warm-up, verification on. */
void mm_moe_job_defaults(mm_moe_job_opts_t *o);

/* Append "--name value" options describing o (for the child command line) to argv[*argc_p];
 * argv must have room for 50 more entries; strings live in store (>= 1024 bytes). */
void mm_moe_job_to_args(const mm_moe_job_opts_t *o, char **argv, int *argc_p, char *store,
                        size_t store_len);
/* Parse one "--name value" option at argv[*i] into o; 1 if consumed (and *i advanced past the
 * value), 0 if the option is not a job option, -1 (message printed) for a bad value. */
int mm_moe_job_parse_arg(mm_moe_job_opts_t *o, int argc, char **argv, int *i);

typedef struct mm_moe_job_check {
    char name[32];
    double rel_l2, rel_max; /* against the fp32 oracle */
    /* against the bf16-intermediate reference: the share of elements within rtol 2e-2 and
     * atol 2e-3 * scale (the rule), and within the literal atol 2e-3 */
    double elementwise, elementwise_abs;
    double scale; /* max(1, max |bf16-intermediate reference|) */
    int oracle_ok;          /* within the fp32 oracle's bounds */
    int pass;
} mm_moe_job_check_t;

#define MM_JOB_MAX_VARIANTS 12
#define MM_JOB_MAX_WAIT 16

/* One schedule of a comparison job ("O0", "O1", "O1+prof" = O1 while the profiler records). */
typedef struct mm_moe_job_variant {
    char name[16];
    double iter_median_s, fwd_median_s, bwd_median_s;
    double cpu_median_s; /* process CPU time per iteration (all threads): robust to preemption */
    double checksum; /* sum of the first output: equal bits give equal sums */
    /* per timed iteration, traffic through the inter-host engine (bench_wire.h): data bytes
     * put, messages, blocking round trips */
    double wire_bytes, wire_msgs, wire_rtts;
} mm_moe_job_variant_t;

typedef struct mm_moe_job_result {
    int rank, ranks, workers;
    int64_t capacity, recv_rows;
    int n_phases;
    char phase[MM_JOB_MAX_PHASES][24];
    double phase_s[MM_JOB_MAX_PHASES]; /* mean seconds per iteration */
    double iter_median_s, iter_min_s, fwd_median_s, bwd_median_s;
    double checksum; /* sum of this rank's first output (fp64), to compare implementations */
    int verified; /* 0: skipped */
    int n_checks;
    mm_moe_job_check_t checks[8];
    char error[512]; /* non-empty when the rank failed */
    /* comparison jobs (moe_compare.c) */
    int n_variants;
    mm_moe_job_variant_t variant[MM_JOB_MAX_VARIANTS];
    int n_wait; /* O1 workers: share of launch time spent waiting (profiled iterations) */
    char wait_name[MM_JOB_MAX_WAIT][16];
    double wait_share[MM_JOB_MAX_WAIT];
    uint64_t trace_records, trace_dropped;
    /* memory (comparison jobs, bench_mem.h): peak RSS, symmetric heap reserved / allocator
     * peak / touched, bytes */
    double peak_rss_mb;
    uint64_t heap_reserved, heap_alloc_peak, heap_touched;
    /* hot-expert replicas: the last forward's plan (the job's first replica setting) */
    int replica_slots, guests;
    int64_t rows_moved, max_rows_plain, max_rows;
    double tokens; /* this rank's mean tokens per timed call (per-call counts; else T) */
    /* token-distribution jobs (mm_moe_job_dyn_rank): per variant ("O1-dyn", "O1-fixed", ...)
     * this rank's sums over the timed calls and every rank's tokens in them; the floors of
     * this rank's dynamic calls (the first schedule's) */
    struct mm_moe_job_dyn {
        double fwd_sum_s[MM_JOB_MAX_VARIANTS], iter_sum_s[MM_JOB_MAX_VARIANTS];
        double tokens_sum[MM_JOB_MAX_VARIANTS];
        double copy_median_s; /* memcpy of the rows it dispatches and returns, per call */
        double work_median_s; /* max(GEMM at the probed peak, weight read of used experts) */
        double rtt_s;         /* signal round trip between ranks 0 and 1 (median) */
        double recv_rows_mean, peak_gflops, copy_gbs;
        int64_t t_cap, t_fixed;
    } dyn;
} mm_moe_job_result_t;

/* The integers of a --replicas list into out[max]; the count, or -1 (message printed) when an
 * item is not an integer in [0, 64]. "" is one 0. */
int mm_moe_job_replicas(const char *list, int *out, int max);

/* Child side: run this rank (RANK/WORLD_SIZE/endpoint from the environment). Returns 0 on
 * success (verification failures are in the result, not the return value). */
int mm_moe_job_rank(const mm_moe_job_opts_t *o, mm_moe_job_result_t *r);

/* Child side of a comparison job (o->schedule a list such as "O0,O1"): one layer per schedule
 * on the same data, iterations interleaved (rotating order) so load drifts hit every
 * schedule alike; then, for O1, profiled iterations give each worker's wait share. With
 * o->profile_variant, "O1+prof" (O1 while the profiler records) is timed as well. */
int mm_moe_job_compare_rank(const mm_moe_job_opts_t *o, mm_moe_job_result_t *r);

/* Child side of a token-distribution job (o->tokens_dist set; bench layer --tokens-dist,
 * moe_dyn_job.c): per listed schedule a layer with per-call counts (T_cap = o->max_tokens, or
 * the distribution's largest count) and a fixed layer of T = the mean count rounded to 128
 * (at least 128), iterations interleaved; fills variant[] and dyn. */
int mm_moe_job_dyn_rank(const mm_moe_job_opts_t *o, mm_moe_job_result_t *r);

/* Rank processes of these jobs keep freed heap memory mapped (glibc trim threshold 1 GiB,
 * mmap threshold 32 MiB), as a training process with a caching allocator does. Without it,
 * glibc returns the ~1.5 MiB that oneDNN's runtime-shape GEMM (the weight gradients)
 * allocates inside every call to the kernel and faults it in again on the next call, a cost
 * (~1,500 page faults per step at the seed shape) that lands on O0 or O1 depending only on
 * the heap layout (docs/multicore.md "Measuring"). */
void mm_moe_job_malloc_settings(void);

/* Seconds on CLOCK_MONOTONIC: the wall clock of the rank processes' timings. */
double mm_moe_job_now(void);

/* Heap sizing when HYPER_PARALLEL_SHMEM_HEAP_SIZE is unset: cp->heap_size = need rounded up
 * to 64 MiB (docs/moe.md); with the variable set, cp is left as it is. */
void mm_moe_job_size_heap(megamoe_comm_params_t *cp, uint64_t need);
/* Layer parameters with the job's shapes (T, H, I, E, K), schedule and workers; every other
 * field at its default (callers add the settings their job varies). */
megamoe_experts_params_t mm_moe_job_layer_params(const mm_moe_job_opts_t *o);

int mm_moe_job_write(const char *path, const mm_moe_job_result_t *r);
int mm_moe_job_read(const char *path, mm_moe_job_result_t *r);

/* Parent side: run `<self> launch -n ranks [--hosts h] --timeout s -- <self> <subcommand...> <job args>
 * --job-dir DIR`, wait, and read every rank's result into results[ranks]. *dir_p gets the
 * temporary directory (removed by mm_moe_job_cleanup). Returns the launcher's exit status
 * (0 when every rank succeeded and wrote its result). */
int mm_moe_job_launch(const mm_moe_job_opts_t *o, const char *const *subcommand,
                      mm_moe_job_result_t *results);


#endif /* MM_BENCH_MOE_JOB_H */
