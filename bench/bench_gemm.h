/* Shared between bench_gemm.c (the BF16 rows, the probes, the workers) and
 * bench_gemm_quant.c (the quantised and decode rows). */
#ifndef MM_BENCH_GEMM_H
#define MM_BENCH_GEMM_H

#include "kernels/peak.h"

typedef void (*mm_gb_job_fn)(void *ctx, int worker);

typedef struct mm_gemm_bench_env {
    const mm_peak_t *peak;       /* all zero with --no-probe */
    double read_gbps[3];         /* [threads]: probed read bandwidth, 0 when not probed */
    double seconds;              /* timed seconds per implementation and case */
    int min_rounds;
    int quick;
    const char *only;            /* --shape, or NULL */
    int max_sets;                /* --weight-sets: cap on the rotating weight sets (0: none) */
    int threads;                 /* workers of this pass: 1 or 2 */
    /* Run job(ctx, w) on workers w = 0 .. threads-1 and wait. */
    void (*run)(void *run_ctx, mm_gb_job_fn job, void *ctx);
    void *run_ctx;
} mm_gemm_bench_env_t;

/* min(peak x threads, flop / bytes x read bandwidth of `threads`) in GFLOP/s (NAN when either
 * side is unknown). */
double mm_gemm_bench_roofline(double peak_per_core, int threads, double read_gbps, double flop,
                              double bytes);

/* The quantised rows of one pass (env->threads workers): W8A8 / W4A8 grouped products at
 * M = 256 next to the packed bf16 product of the same shape, and decode rows (M = 1, 4, 16) of
 * bf16, w8a8 and w4a8 with weights rotating through more distinct sets than the last-level
 * cache holds. Adds rows; keeps what the targets table needs. Returns 0, or 1 on a failure
 * (message printed). */
int mm_bench_gemm_quant(const mm_gemm_bench_env_t *env);
/* The targets of those rows (stderr), after both passes. */
void mm_bench_gemm_quant_targets(const mm_gemm_bench_env_t *env);

#endif
