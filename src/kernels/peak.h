/* Measured compute peaks of this CPU's BF16-capable units, for "% of peak" figures.
 *
 * Register-only loops, one thread, each unit that is present and usable:
 *   amx_bf16     tdpbf16ps on 4 accumulator tiles (16x16x32 each: 16384 FLOP / instruction);
 *                run only when cpuid reports AMX-BF16 and the kernel granted tile data
 *   avx512_bf16  vdpbf16ps zmm on 24 accumulators (64 FLOP / instruction)
 *   fp32_fma     vfmadd231ps zmm on 24 accumulators (32 FLOP / instruction); on CPUs
 *                without AVX-512, ymm on 12 (16 FLOP / instruction)
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
    /* INT8 (2 ops per multiply-add, GOP/s per core): */
    const char *int8_unit;     /* "amx_int8", "avx512_vnni" or "none" */
    double int8_gops;          /* per-core peak of int8_unit */
    double amx_int8_gops;      /* tdpbssd on 4 tiles (16x16x64: 32768 OP); 0 without AMX-INT8 */
    double avx512_vnni_gops;   /* vpdpbusd zmm on 24 accumulators (128 OP); 0 without VNNI */
} mm_peak_t;

/* Probe every present unit for about `seconds` each (best of 3 runs); >= 0.01. The vector
 * loops are inline assembly: compiled from intrinsics, gcc 12 spills the integer accumulators
 * of the vpdpbusd loop to the stack every iteration and the "peak" came out at half the rate
 * the GEMM kernel reaches. */
megamoe_status_t mm_kernels_peak_probe(double seconds, mm_peak_t *peak_p);

/* Read bandwidth from memory with `threads` threads at once (each streaming its own slice of
 * a buffer of 8x the last-level cache, 256 MiB to 1 GiB, with 64-byte vector loads), GB/s in total,
 * best of a few passes of about `seconds` in all. What a weight-streaming GEMM can get at
 * best; the roofline of `bench gemm` uses it. */
megamoe_status_t mm_kernels_read_bw_probe(int threads, double seconds, double *gbps_p);

#endif /* MM_KERNELS_PEAK_H */
