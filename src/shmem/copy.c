/* Copies of the data path, chosen by size (measured on the 2-core EPYC, both ranks copying into
 * each other's heap at once):
 *  - below 64 KiB: memcpy (glibc is best for short copies);
 *  - from 64 KiB: `rep movsb` when the CPU has ERMS. The microcoded string copy matched memcpy
 *    in cache and beat glibc's vector loop from 1 MiB on (+2-8 % at 1-4 MiB, +30-90 % at 8-16
 *    MiB), presumably because it writes whole lines without reading them first;
 *  - from mm_shmem_nt_threshold() bytes (half the L3 the kernel reports, 16 MiB here):
 *    non-temporal AVX-512 stores. Below that, source and destination stay in cache and
 *    streaming stores lose (0.5-0.7x of memcpy at 2-8 MiB); above it they win (1.1-1.6x).
 * glibc keeps regular stores up to 3/4 of the L3 that cpuid reports (hundreds of MiB on this
 * VM), which is why the threshold is derived from the kernel's figure instead.
 * Sanitizer builds use memcpy for the middle range: inline assembly is invisible to them.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/cpu.h"
#include "shmem_internal.h"

#if MM_X86 && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define MM_USE_MOVSB 1
#else
#define MM_USE_MOVSB 0
#endif

#if MM_USE_MOVSB
#include <cpuid.h>

/* Enhanced REP MOVSB (cpuid leaf 7, EBX bit 9). */
static int mm_cpu_has_erms(void)
{
    static int cached = -1;
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        unsigned a, b, c, d;
        v = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b >> 9 & 1);
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}

static void mm_copy_movsb(void *dst, const void *src, size_t n)
{
    __asm__ __volatile__("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}
#endif

#if MM_X86
MM_TARGET_AVX512 static void mm_copy_nt_avx512(void *dst, const void *src, size_t n)
{
    char *d = dst;
    const char *s = src;
    size_t head = (size_t)(-(uintptr_t)d & 63);
    if (head > n) head = n;
    if (head) {
        memcpy(d, s, head);
        d += head;
        s += head;
        n -= head;
    }
    while (n >= 256) {
        __m512i a = _mm512_loadu_si512((const void *)s);
        __m512i b = _mm512_loadu_si512((const void *)(s + 64));
        __m512i c = _mm512_loadu_si512((const void *)(s + 128));
        __m512i e = _mm512_loadu_si512((const void *)(s + 192));
        _mm512_stream_si512((void *)d, a);
        _mm512_stream_si512((void *)(d + 64), b);
        _mm512_stream_si512((void *)(d + 128), c);
        _mm512_stream_si512((void *)(d + 192), e);
        d += 256;
        s += 256;
        n -= 256;
    }
    while (n >= 64) {
        _mm512_stream_si512((void *)d, _mm512_loadu_si512((const void *)s));
        d += 64;
        s += 64;
        n -= 64;
    }
    if (n) memcpy(d, s, n);
    mm_store_fence(); /* streaming stores are weakly ordered: fence before any signal */
}
#endif

/* L3 size from sysfs ("32768K"), 0 when unknown. */
static uint64_t mm_l3_bytes(void)
{
    for (int i = 0; i < 8; i++) {
        char path[96], buf[32];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) break;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0 || atoi((buf[n] = '\0', buf)) != 3) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) return 0;
        n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0) return 0;
        buf[n] = '\0';
        char *end;
        uint64_t v = strtoull(buf, &end, 10);
        if (*end == 'K') v <<= 10;
        else if (*end == 'M') v <<= 20;
        return v;
    }
    return 0;
}

size_t mm_shmem_nt_threshold(void)
{
    static size_t threshold; /* 0: not decided yet (racing first calls decide the same) */
    size_t t = __atomic_load_n(&threshold, __ATOMIC_RELAXED);
    if (t) return t;
    t = SIZE_MAX; /* no AVX-512: always memcpy */
#if MM_X86
    if (mm_cpu_has_avx512()) {
        uint64_t l3 = mm_l3_bytes();
        t = l3 ? (size_t)(l3 / 2) : MM_SHMEM_NT_DEFAULT;
        if (t < MM_SHMEM_NT_MIN) t = MM_SHMEM_NT_MIN;
    }
#endif
    __atomic_store_n(&threshold, t, __ATOMIC_RELAXED);
    return t;
}

void mm_shmem_copy_streaming(void *dst, const void *src, size_t n)
{
#if MM_X86
    if (mm_cpu_has_avx512()) {
        mm_copy_nt_avx512(dst, src, n);
        return;
    }
#endif
    memcpy(dst, src, n);
}

void mm_shmem_copy(void *dst, const void *src, size_t n)
{
    if (n < MM_SHMEM_MOVSB_MIN) {
        memcpy(dst, src, n);
        return;
    }
    if (n >= MM_SHMEM_NT_MIN && n >= mm_shmem_nt_threshold()) {
        mm_shmem_copy_streaming(dst, src, n);
        return;
    }
#if MM_USE_MOVSB
    if (mm_cpu_has_erms()) {
        mm_copy_movsb(dst, src, n);
        return;
    }
#endif
    memcpy(dst, src, n);
}
