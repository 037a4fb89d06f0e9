/* CPU feature detection (cpuid), cached after the first call. */
#ifndef MM_BASE_CPU_H
#define MM_BASE_CPU_H

#include <stddef.h>

#include "arch.h" /* MM_X86, MM_TARGET_AVX512* */

/* AVX-512 F+BW+VL+DQ usable (CPU and OS state). */
int mm_cpu_has_avx512(void);
/* AVX2 and FMA usable (CPU and OS state): the own GEMM's AVX2 form (Zen 2/3, Haswell on). */
int mm_cpu_has_avx2_fma(void);
/* AVX512-BF16 (vdpbf16ps, vcvtne2ps2bf16). */
int mm_cpu_has_avx512_bf16(void);
/* AVX512-VNNI (vpdpbusd) with AVX-512 F/BW/VL/DQ usable. */
int mm_cpu_has_avx512_vnni(void);
/* AMX-TILE and AMX-INT8 reported by cpuid (tdpbssd; the permission is requested separately). */
int mm_cpu_has_amx_int8(void);
/* AMX-TILE and AMX-BF16 reported by cpuid (the kernel permission is requested separately). */
int mm_cpu_has_amx_bf16(void);
/* 1 when cpuid's vendor string is "GenuineIntel" (tuning choices measured per vendor). */
int mm_cpu_is_intel(void);
/* Brand string ("AMD EPYC ..."); never NULL. */
const char *mm_cpu_brand(void);
/* Bytes of the last-level cache (cpu0's; sysfs, else sysconf, else 32 MiB). */
size_t mm_cpu_llc_bytes(void);
/* Online logical cores. */
int mm_cpu_count(void);

/* Ask the kernel once per process for AMX tile-data permission (arch_prctl
 * ARCH_REQ_XCOMP_PERM). Returns 1 when AMX-BF16 may be used, 0 otherwise (never faults). */
int mm_cpu_request_amx(void);
#endif /* MM_BASE_CPU_H */
