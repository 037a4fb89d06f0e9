/* Copies of the data path. Large puts use non-temporal AVX-512 stores: glibc's memcpy keeps
 * regular stores up to 3/4 of the reported L3 (hundreds of MiB here), which costs a read for
 * ownership per line and evicts the writer's cache; streaming stores write the lines straight
 * out (machine_limits.md section 4.1: ~14 vs ~9-13 GB/s at 64 MiB). */
#include <string.h>

#include "base/cpu.h"
#include "shmem_internal.h"

#if MM_X86
#include <immintrin.h>

MM_TARGET_AVX512 static void mm_copy_nt_avx512(void *dst, const void *src, size_t n)
{
    char *d = dst;
    const char *s = src;
    size_t head = (size_t)(-(uintptr_t)d & 63);
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
    _mm_sfence(); /* streaming stores are weakly ordered: fence before any signal */
}
#endif

void mm_shmem_copy(void *dst, const void *src, size_t n)
{
#if MM_X86
    static int avx512 = -1;
    if (n >= MM_SHMEM_NT_THRESHOLD) {
        int has = __atomic_load_n(&avx512, __ATOMIC_RELAXED);
        if (has < 0) {
            has = mm_cpu_has_avx512();
            __atomic_store_n(&avx512, has, __ATOMIC_RELAXED);
        }
        if (has) {
            mm_copy_nt_avx512(dst, src, n);
            return;
        }
    }
#endif
    memcpy(dst, src, n);
}
