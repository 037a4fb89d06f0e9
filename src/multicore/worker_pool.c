/* Persistent worker pool: threads parked on a condition variable between phases. */
#include "multicore/worker_pool.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/env.h"
#include "base/error.h"

typedef struct mm_pool_worker {
    mm_pool_t *pool;
    int index;
    pthread_t thread;
} mm_pool_worker_t;

struct mm_pool {
    int n;
    pthread_mutex_t lock;
    pthread_cond_t start; /* generation changed or stop */
    pthread_cond_t done;  /* pending reached 0 */
    uint64_t generation;  /* phases started; workers run a phase when it moves */
    int stop;
    int pending; /* threads (not the caller) still running the current phase */
    mm_pool_fn_t fn;
    void *arg;
    /* first failure of the current phase (lowest worker index wins) */
    int fail_worker;
    megamoe_status_t fail_status;
    char fail_text[1024];
    mm_pool_worker_t *workers; /* [n]; index 0 unused (the caller) */
    int started;               /* threads successfully created */
};

static void mm_pool_record(mm_pool_t *pool, int worker, megamoe_status_t status)
{
    /* called with the lock held */
    if (status == MEGAMOE_OK) return;
    if (pool->fail_worker >= 0 && pool->fail_worker < worker) return;
    pool->fail_worker = worker;
    pool->fail_status = status;
    snprintf(pool->fail_text, sizeof pool->fail_text, "%s", megamoe_last_error());
}

static void *mm_pool_main(void *p)
{
    mm_pool_worker_t *self = p;
    mm_pool_t *pool = self->pool;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (!pool->stop && pool->generation == seen) pthread_cond_wait(&pool->start, &pool->lock);
        if (pool->stop) break;
        seen = pool->generation;
        mm_pool_fn_t fn = pool->fn;
        void *arg = pool->arg;
        pthread_mutex_unlock(&pool->lock);

        megamoe_status_t st = fn(arg, self->index, pool->n);

        pthread_mutex_lock(&pool->lock);
        mm_pool_record(pool, self->index, st);
        if (--pool->pending == 0) pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

megamoe_status_t mm_pool_create(int n_workers, mm_pool_t **pool_p)
{
    if (n_workers < 1 || n_workers > MM_POOL_MAX_WORKERS)
        return mm_error(MEGAMOE_INVALID_ARGUMENT, "worker count %d must be in [1, %d]", n_workers,
                        MM_POOL_MAX_WORKERS);
    mm_pool_t *pool = calloc(1, sizeof *pool);
    if (pool == NULL) return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate a worker pool");
    pool->n = n_workers;
    pool->fail_worker = -1;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->start, NULL);
    pthread_cond_init(&pool->done, NULL);
    /* The CPU feature probes cache their answer in plain statics on first use; answer them here,
     * before any worker exists, so workers only ever read them (no race, TSan-clean). */
    (void)mm_cpu_has_avx512();
    (void)mm_cpu_has_avx512_bf16();
    (void)mm_cpu_has_amx_bf16();
    pool->workers = calloc((size_t)n_workers, sizeof *pool->workers);
    if (pool->workers == NULL) {
        mm_pool_destroy(pool);
        return mm_error(MEGAMOE_OUT_OF_MEMORY, "cannot allocate %d workers", n_workers);
    }
    for (int w = 1; w < n_workers; w++) {
        pool->workers[w].pool = pool;
        pool->workers[w].index = w;
        int rc = pthread_create(&pool->workers[w].thread, NULL, mm_pool_main, &pool->workers[w]);
        if (rc != 0) {
            mm_pool_destroy(pool);
            return mm_error(MEGAMOE_IO,
                            "cannot start worker thread %d of %d: %s; lower MEGAMOE_THREADS", w,
                            n_workers, strerror(rc));
        }
        pool->started = w;
    }
    *pool_p = pool;
    return MEGAMOE_OK;
}

void mm_pool_destroy(mm_pool_t *pool)
{
    if (pool == NULL) return;
    pthread_mutex_lock(&pool->lock);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->start);
    pthread_mutex_unlock(&pool->lock);
    for (int w = 1; w <= pool->started; w++) pthread_join(pool->workers[w].thread, NULL);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->start);
    pthread_mutex_destroy(&pool->lock);
    free(pool->workers);
    free(pool);
}

int mm_pool_size(const mm_pool_t *pool) { return pool ? pool->n : 0; }

uint64_t mm_pool_runs(const mm_pool_t *pool)
{
    if (pool == NULL) return 0;
    pthread_mutex_lock((pthread_mutex_t *)&pool->lock);
    uint64_t g = pool->generation;
    pthread_mutex_unlock((pthread_mutex_t *)&pool->lock);
    return g;
}

megamoe_status_t mm_pool_run(mm_pool_t *pool, mm_pool_fn_t fn, void *arg)
{
    if (pool->n == 1) {
        pool->generation++; /* single-threaded: nobody else reads it */
        return fn(arg, 0, 1);
    }
    pthread_mutex_lock(&pool->lock);
    pool->fn = fn;
    pool->arg = arg;
    pool->pending = pool->n - 1;
    pool->fail_worker = -1;
    pool->fail_status = MEGAMOE_OK;
    pool->generation++;
    pthread_cond_broadcast(&pool->start);
    pthread_mutex_unlock(&pool->lock);

    megamoe_status_t own = fn(arg, 0, pool->n);

    pthread_mutex_lock(&pool->lock);
    while (pool->pending > 0) pthread_cond_wait(&pool->done, &pool->lock);
    megamoe_status_t st = pool->fail_status;
    char text[sizeof pool->fail_text];
    memcpy(text, pool->fail_text, sizeof text);
    pthread_mutex_unlock(&pool->lock);
    if (own != MEGAMOE_OK) return own; /* worker 0 is the lowest index; its text is here */
    if (st != MEGAMOE_OK) mm_set_last_error(text);
    return st;
}

megamoe_status_t mm_pool_default_workers(int *n_p)
{
    int64_t threads = 0;
    megamoe_status_t st = mm_env_int(MM_ENV_THREADS, &threads);
    if (st != MEGAMOE_OK && st != MEGAMOE_NOT_FOUND) return st;
    if (st == MEGAMOE_OK && threads > 0) {
        *n_p = threads > MM_POOL_MAX_WORKERS ? MM_POOL_MAX_WORKERS : (int)threads;
        return MEGAMOE_OK;
    }
    int64_t local = 1;
    st = mm_env_int(MM_ENV_LOCAL_WORLD_SIZE, &local);
    if (st == MEGAMOE_NOT_FOUND) local = 1;
    else if (st != MEGAMOE_OK) return st;
    int cores = mm_cpu_count();
    int64_t n = cores / (local > 0 ? local : 1);
    if (n < 1) n = 1;
    if (n > MM_POOL_MAX_WORKERS) n = MM_POOL_MAX_WORKERS;
    *n_p = (int)n;
    return MEGAMOE_OK;
}
