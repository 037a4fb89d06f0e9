/* Memory figures of a benchmark rank (bench_mem.h). */
#include <stdio.h>
#include <string.h>

#include "bench_mem.h"
#include "bench_util.h"
#include "moe_job.h"
#include "shmem/shmem.h"

void mm_bench_mem_sample(mm_bench_mem_t *m)
{
    memset(m, 0, sizeof *m);
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        long kb;
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) m->peak_rss_mb = (double)kb / 1024.0;
    }
    if (f) fclose(f);
    mm_shmem_debug_state_t st;
    if (mm_shmem_debug_state(&st) == 0 && st.refcount > 0) {
        m->heap_reserved = st.heap_size;
        m->heap_alloc_peak = st.bytes_peak;
        m->heap_touched = mm_shmem_heap_touched_bytes();
    }
}

void mm_bench_mem_fields(const struct mm_moe_job_result *res, int ranks)
{
    double rss = 0;
    uint64_t reserved = 0, peak = 0, touched = 0;
    char per_rank[96] = "";
    for (int r = 0; r < ranks; r++) {
        const mm_moe_job_result_t *x = &res[r];
        if (x->peak_rss_mb > rss) rss = x->peak_rss_mb;
        if (x->heap_reserved > reserved) reserved = x->heap_reserved;
        if (x->heap_alloc_peak > peak) peak = x->heap_alloc_peak;
        if (x->heap_touched > touched) touched = x->heap_touched;
        size_t len = strlen(per_rank);
        snprintf(per_rank + len, sizeof per_rank - len, "%sr%d=%.0f", len ? " " : "", r,
                 x->peak_rss_mb);
    }
    mm_bench_num("peak_rss_mb", rss);
    mm_bench_str("peak_rss_mb_ranks", per_rank);
    mm_bench_num("heap_reserved_mb", (double)reserved / 1048576.0);
    mm_bench_num("heap_alloc_peak_mb", (double)peak / 1048576.0);
    mm_bench_num("heap_touched_mb", (double)touched / 1048576.0);
}
