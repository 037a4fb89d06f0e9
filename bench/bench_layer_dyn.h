/* bench layer --tokens-dist (bench_layer_dyn.c; the ranks: moe_dyn_job.c). */
#ifndef MM_BENCH_LAYER_DYN_H
#define MM_BENCH_LAYER_DYN_H

#include <stdint.h>

#include "moe_job.h"

typedef struct mm_dyn_shape {
    const char *name;
    int64_t H, I, E, K;
} mm_dyn_shape_t;

/* One job per (listed shape, distribution, workers, routing); rows and the targets' table.
 * base: the job options (ranks, schedule list, iterations, seed, ...). 0, or 1 when a job
 * failed, 2 for a bad distribution. */
int mm_bench_layer_dyn(const mm_moe_job_opts_t *base, const mm_dyn_shape_t *shapes, int n_shapes,
                       const char *shape_list, char *const *dists, int n_dists,
                       char *const *workers, int n_workers, char *const *routes, int n_routes);

#endif /* MM_BENCH_LAYER_DYN_H */
