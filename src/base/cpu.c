/* CPU feature detection. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "megamoe/config.h"

#include "base/abi.h"
#include "base/error.h"
#include "cpu.h"

#if MM_X86
#include <cpuid.h>

static void mm_cpuid(unsigned leaf, unsigned sub, unsigned r[4])
{
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
}

static unsigned long long mm_xgetbv0(void)
{
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

int mm_cpu_has_avx512(void)
{
#if MM_X86
    static atomic_int cached = -1; /* racing first calls compute the same value */
    int c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (c >= 0) return c;
    unsigned r[4];
    mm_cpuid(1, 0, r);
    int osxsave = (r[2] >> 27) & 1;
    int ok = 0;
    if (osxsave && (mm_xgetbv0() & 0xe6) == 0xe6) { /* XMM, YMM, opmask, ZMM state enabled */
        mm_cpuid(7, 0, r);
        int f = (r[1] >> 16) & 1, dq = (r[1] >> 17) & 1, bw = (r[1] >> 30) & 1,
            vl = (r[1] >> 31) & 1;
        ok = f && dq && bw && vl;
    }
    atomic_store_explicit(&cached, ok, memory_order_relaxed);
    return ok;
#else
    return 0;
#endif
}

int mm_cpu_has_avx2_fma(void)
{
#if MM_X86
    static atomic_int cached = -1; /* racing first calls compute the same value */
    int c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (c >= 0) return c;
    unsigned r[4];
    mm_cpuid(1, 0, r);
    int osxsave = (r[2] >> 27) & 1, fma = (r[2] >> 12) & 1;
    int ok = 0;
    if (osxsave && fma && (mm_xgetbv0() & 0x6) == 0x6) { /* XMM and YMM state enabled */
        mm_cpuid(7, 0, r);
        ok = (r[1] >> 5) & 1; /* EBX bit 5: AVX2 */
    }
    atomic_store_explicit(&cached, ok, memory_order_relaxed);
    return ok;
#else
    return 0;
#endif
}

int mm_cpu_is_intel(void)
{
#if MM_X86
    static atomic_int cached = -1; /* racing first calls compute the same value */
    int c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (c >= 0) return c;
    unsigned r[4];
    mm_cpuid(0, 0, r); /* vendor in EBX, EDX, ECX */
    char v[13];
    memcpy(v, &r[1], 4);
    memcpy(v + 4, &r[3], 4);
    memcpy(v + 8, &r[2], 4);
    v[12] = '\0';
    int is = strcmp(v, "GenuineIntel") == 0;
    atomic_store_explicit(&cached, is, memory_order_relaxed);
    return is;
#else
    return 0;
#endif
}

int mm_cpu_has_avx512_bf16(void)
{
#if MM_X86
    static atomic_int cached = -1; /* racing first calls compute the same value */
    int c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (c >= 0) return c;
    unsigned r[4];
    mm_cpuid(7, 1, r);
    int v = mm_cpu_has_avx512() && ((r[0] >> 5) & 1);
    atomic_store_explicit(&cached, v, memory_order_relaxed);
    return v;
#else
    return 0;
#endif
}

int mm_cpu_has_amx_bf16(void)
{
#if MM_X86
    static atomic_int cached = -1; /* racing first calls compute the same value */
    int c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (c >= 0) return c;
    unsigned r[4];
    mm_cpuid(7, 0, r);
    int v = ((r[3] >> 24) & 1) && ((r[3] >> 22) & 1); /* AMX-TILE, AMX-BF16 */
    atomic_store_explicit(&cached, v, memory_order_relaxed);
    return v;
#else
    return 0;
#endif
}

int mm_cpu_has_avx512_vnni(void)
{
#if MM_X86
    static atomic_int cached = -1; /* racing first calls compute the same value */
    int c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (c >= 0) return c;
    unsigned r[4];
    mm_cpuid(7, 0, r);
    int v = mm_cpu_has_avx512() && ((r[2] >> 11) & 1); /* ECX bit 11: AVX512_VNNI */
    atomic_store_explicit(&cached, v, memory_order_relaxed);
    return v;
#else
    return 0;
#endif
}

int mm_cpu_has_amx_int8(void)
{
#if MM_X86
    static atomic_int cached = -1; /* racing first calls compute the same value */
    int c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (c >= 0) return c;
    unsigned r[4];
    mm_cpuid(7, 0, r);
    int v = ((r[3] >> 24) & 1) && ((r[3] >> 25) & 1); /* AMX-TILE, AMX-INT8 */
    atomic_store_explicit(&cached, v, memory_order_relaxed);
    return v;
#else
    return 0;
#endif
}

/* The last-level cache of cpu0 from sysfs (what lscpu shows), else sysconf, else 32 MiB. Some
 * VMs report the host's L3 through cpuid (sysconf), 10x the guest's: sysfs first. */
static size_t mm_llc_read(void)
{
    size_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 8; i++) {
        char path[96], buf[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(path, "r");
        if (f == NULL) break;
        int level = 0;
        int ok = fscanf(f, "%d", &level) == 1;
        fclose(f);
        if (!ok || level < best_level) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        f = fopen(path, "r");
        if (f == NULL) continue;
        if (fgets(buf, sizeof buf, f)) {
            char *end = NULL;
            unsigned long long v = strtoull(buf, &end, 10);
            if (end && (*end == 'K' || *end == 'k')) v <<= 10;
            else if (end && (*end == 'M' || *end == 'm')) v <<= 20;
            if (v > 0) best = (size_t)v, best_level = level;
        }
        fclose(f);
    }
    if (best == 0) {
        long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
        if (v > 0) best = (size_t)v;
    }
    return best ? best : (size_t)32 << 20;
}

size_t mm_cpu_llc_bytes(void)
{
    static atomic_size_t cached;
    size_t v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v == 0) {
        v = mm_llc_read();
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}

static char mm_brand[49];

static void mm_cpu_brand_init(void)
{
    char *brand = mm_brand;
#if MM_X86
    {
        unsigned r[4];
        mm_cpuid(0x80000000u, 0, r);
        if (r[0] >= 0x80000004u) {
            for (unsigned i = 0; i < 3; i++) {
                mm_cpuid(0x80000002u + i, 0, r);
                memcpy(brand + 16 * i, r, 16);
            }
            brand[48] = '\0';
        } else {
            strcpy(brand, "x86-64");
        }
        /* trim trailing blanks */
        for (int i = (int)strlen(brand) - 1; i >= 0 && brand[i] == ' '; i--) brand[i] = '\0';
    }
#else
    strcpy(brand, "unknown");
#endif
}

const char *mm_cpu_brand(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, mm_cpu_brand_init);
    return mm_brand;
}

int mm_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}


#define MM_ARCH_REQ_XCOMP_PERM 0x1023
#define MM_XFEATURE_XTILEDATA 18

static int mm_amx_granted;
static pthread_once_t mm_amx_once = PTHREAD_ONCE_INIT;

static void mm_amx_request_once(void)
{
#if MM_X86 && defined(SYS_arch_prctl)
    if (!mm_cpu_has_amx_bf16()) return;
    mm_amx_granted = syscall(SYS_arch_prctl, MM_ARCH_REQ_XCOMP_PERM, MM_XFEATURE_XTILEDATA) == 0;
#endif
}

int mm_cpu_request_amx(void)
{
    pthread_once(&mm_amx_once, mm_amx_request_once);
    return mm_amx_granted;
}

megamoe_status_t megamoe_host_info_sized(megamoe_host_info_t *info_p, size_t info_size)
{
    if (info_p == NULL) return mm_error(MEGAMOE_INVALID_ARGUMENT, "host_info: NULL output");
    megamoe_host_info_t in;
    memset(&in, 0, sizeof in);
    snprintf(in.cpu, sizeof in.cpu, "%s", mm_cpu_brand());
    in.cores = mm_cpu_count();
    in.avx512 = mm_cpu_has_avx512();
    in.avx512_bf16 = mm_cpu_has_avx512_bf16();
    in.amx_bf16 = mm_cpu_has_amx_bf16();
    in.amx_usable = mm_cpu_request_amx();
    return mm_abi_copy_out(info_p, info_size, &in, sizeof in, "megamoe_host_info_t");
}
