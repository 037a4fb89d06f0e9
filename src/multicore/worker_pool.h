/* A small persistent pool of worker threads: the cores a rank gives to one execution-resource
 * group (one MegaMoE workspace).
 *
 * Why: the O0 schedule runs each phase (dispatch, GMM1, SwiGLU, GMM2, combine, ...) as one
 * data-parallel step over the rank's cores. Creating threads per phase would cost more than
 * the small phases themselves, so the threads are created once with the group and parked on a
 * condition variable between phases (no spinning while idle; a parked pool costs nothing).
 *
 * Model: mm_pool_run(pool, fn, arg) calls fn(arg, w, n) once on each of the n workers and
 * returns when all have returned. Worker 0 is the calling thread, so a pool of 1 is just a
 * function call (no thread at all), which is what each rank gets by default when ranks fill
 * the cores. Everything written by a worker inside fn happens-before mm_pool_run returns, and
 * everything the caller wrote before mm_pool_run happens-before fn starts (mutex hand-off).
 *
 * Errors: fn returns a status; mm_pool_run returns OK when every worker did, else the failure
 * of the lowest-numbered failing worker, with that worker's megamoe_last_error() text moved to
 * the calling thread (the text is thread-local).
 *
 * Threads: one mm_pool_run at a time per pool (callers serialise: a resource group is used
 * serially). Workers keep their thread for the pool's life, so per-thread state (oneDNN's
 * OpenMP settings, AMX permission, scratch) is set up once.
 *
 * The O1 executor builds on this: its cube/vector workers are pool workers whose fn walks a
 * static task queue; mm_pool_split() is the static partition the O0 phases use.
 */
#ifndef MM_MULTICORE_WORKER_POOL_H
#define MM_MULTICORE_WORKER_POOL_H

#include <stdint.h>

#include "megamoe/status.h"

#define MM_POOL_MAX_WORKERS 1024

typedef struct mm_pool mm_pool_t;

/* Work of one phase, run on worker `worker` of `n_workers`. */
typedef megamoe_status_t (*mm_pool_fn_t)(void *arg, int worker, int n_workers);

/* n_workers in [1, MM_POOL_MAX_WORKERS]; starts n_workers - 1 threads. */
megamoe_status_t mm_pool_create(int n_workers, mm_pool_t **pool_p);
/* Stops and joins the threads; NULL is a no-op. Must not run concurrently with mm_pool_run. */
void mm_pool_destroy(mm_pool_t *pool);
int mm_pool_size(const mm_pool_t *pool);
/* Number of phases run so far (for tests and statistics). */
uint64_t mm_pool_runs(const mm_pool_t *pool);

megamoe_status_t mm_pool_run(mm_pool_t *pool, mm_pool_fn_t fn, void *arg);

/* Workers a rank should use: MEGAMOE_THREADS when set (> 0), else online cores divided by
 * LOCAL_WORLD_SIZE (ranks on this host, default 1), at least 1. INVALID_ARGUMENT for a bad
 * MEGAMOE_THREADS / LOCAL_WORLD_SIZE value. */
megamoe_status_t mm_pool_default_workers(int *n_p);

/* Static contiguous partition of [0, n) into n_workers parts whose boundaries are multiples
 * of align (the last part takes the rest): worker w gets [*begin_p, *end_p). */
static inline void mm_pool_split(int64_t n, int worker, int n_workers, int64_t align,
                                 int64_t *begin_p, int64_t *end_p)
{
    if (align < 1) align = 1;
    int64_t units = (n + align - 1) / align;
    int64_t per = units / n_workers, extra = units % n_workers;
    int64_t b = (int64_t)worker * per + (worker < extra ? worker : extra);
    int64_t e = b + per + (worker < extra ? 1 : 0);
    b *= align;
    e *= align;
    *begin_p = b < n ? b : n;
    *end_p = e < n ? e : n;
}

#endif /* MM_MULTICORE_WORKER_POOL_H */
