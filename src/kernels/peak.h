/* Measured compute peaks of this CPU's BF16-capable units, for "% of peak" figures.
 *
 * Register-only loops, one thread, each unit that is present and usable:
 *   amx_bf16     tdpbf16ps on 4 accumulator tiles (16x16x32 each: 16384 FLOP / instruction);
 *                run only when cpuid reports AMX-BF16 and the kernel granted tile data
 *   avx512_bf16  vdpbf16ps zmm on 24 accumulators (64 FLOP / instruction)
 *   fp32_fma     vfmadd231ps zmm on 24 accumulators (32 FLOP / instruction)
 * `unit` names the best BF16 unit present (amx_bf16 > avx512_bf16 > fp32_fma; fp32 FMA is
 * what bf16 data costs without a bf16 unit), `gflops` its per-core peak. Multiply by the
 * thread count for a multi-core peak (the units of different cores did not interfere on the
 * machines measured: two cores' loops at once ran as fast as one alone). */
#ifndef MM_KERNELS_PEAK_H
#define MM_KERNELS_PEAK_H

#include "megamoe/status.h"

typedef struct mm_peak {
    const char *unit;          /* "amx_bf16", "avx512_bf16", "fp32_fma" or "none" */
    double gflops;             /* per-core peak of `unit` */
    double amx_gflops;         /* 0 when not measured (no AMX) */
    double avx512_bf16_gflops; /* 0 when not present */
    double fp32_fma_gflops;    /* 0 when not present */
} mm_peak_t;

/* Probe every present unit for about `seconds` each (best of 3 runs); >= 0.01. */
megamoe_status_t mm_kernels_peak_probe(double seconds, mm_peak_t *peak_p);

#endif /* MM_KERNELS_PEAK_H */
