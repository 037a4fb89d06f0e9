/* Memory figures of a benchmark rank: peak RSS and the symmetric heap's use, for sizing
 * HYPER_PARALLEL_SHMEM_HEAP_SIZE. */
#ifndef MM_BENCH_MEM_H
#define MM_BENCH_MEM_H

#include <stdint.h>

typedef struct mm_bench_mem {
    double peak_rss_mb;       /* VmHWM: the process's peak resident set (shared heap pages it
                                 touched included) */
    uint64_t heap_reserved;   /* HYPER_PARALLEL_SHMEM_HEAP_SIZE of this lifecycle */
    uint64_t heap_alloc_peak; /* the symmetric allocator's high-water mark */
    uint64_t heap_touched;    /* pages of this rank's heap backed by memory (mincore) */
} mm_bench_mem_t;

/* Sample now (the runtime must be running for the heap figures, else they are 0). */
void mm_bench_mem_sample(mm_bench_mem_t *m);

/* Add the job's memory fields to the current bench row: peak_rss_mb (largest rank) and
 * peak_rss_mb_ranks ("r0=.. r1=.."), heap_reserved_mb, heap_alloc_peak_mb and
 * heap_touched_mb (largest rank). */
struct mm_moe_job_result;
void mm_bench_mem_fields(const struct mm_moe_job_result *res, int ranks);

#endif
