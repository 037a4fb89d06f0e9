/* The architecture-specific one-liners every layer needs: which ISA this is, the target
 * attributes of the AVX-512 code, the spin-wait pause and the fences. One place, so a port to
 * another ISA (or a sanitizer quirk) is one edit. Header only; needs libc and the compiler. */
#ifndef MM_BASE_ARCH_H
#define MM_BASE_ARCH_H

#if defined(__x86_64__) || defined(__i386__)
#define MM_X86 1
#include <immintrin.h>
#define MM_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define MM_TARGET_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#define MM_TARGET_AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define MM_TARGET_AVX2 __attribute__((target("avx2,fma")))
#else
#define MM_X86 0
#define MM_TARGET_AVX512
#define MM_TARGET_AVX512BF16
#define MM_TARGET_AVX512VNNI
#define MM_TARGET_AVX2
#endif

/* One iteration of a spin-wait: `pause` on x86 (frees the sibling hyper-thread and avoids the
 * memory-order flush on exit), a compiler barrier elsewhere. */
static inline void mm_cpu_pause(void)
{
#if MM_X86
    _mm_pause();
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

/* Orders earlier non-temporal (streaming) stores before later stores: needed before a signal
 * that publishes data written with them. Nothing to do where there are none. */
static inline void mm_store_fence(void)
{
#if MM_X86
    _mm_sfence();
#endif
}

/* A thread fence of the given __ATOMIC_* order: the same fence in every build. ThreadSanitizer
 * does not model fences (GCC says so with -Wtsan, silenced here: the fence is still emitted), so
 * its builds also annotate one (release and/or acquire on a per-file word: under TSan such
 * fences pair only within one file, as the RMA layer's do). */
#include "base/tsan.h"
static unsigned long mm_arch_fence_word __attribute__((unused));
#if defined(MM_TSAN) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wtsan"
#define MM_ARCH_FENCE_POP 1
#endif
static inline void mm_thread_fence(int order)
{
    switch (order) {
    case __ATOMIC_RELAXED:
        break;
    case __ATOMIC_CONSUME:
    case __ATOMIC_ACQUIRE:
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        MM_TSAN_ACQUIRE(&mm_arch_fence_word);
        break;
    case __ATOMIC_RELEASE:
        __atomic_thread_fence(__ATOMIC_RELEASE);
        MM_TSAN_RELEASE(&mm_arch_fence_word);
        break;
    case __ATOMIC_ACQ_REL:
        __atomic_thread_fence(__ATOMIC_ACQ_REL);
        MM_TSAN_RELEASE(&mm_arch_fence_word);
        MM_TSAN_ACQUIRE(&mm_arch_fence_word);
        break;
    default:
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        MM_TSAN_RELEASE(&mm_arch_fence_word);
        MM_TSAN_ACQUIRE(&mm_arch_fence_word);
        break;
    }
}
#ifdef MM_ARCH_FENCE_POP
#pragma GCC diagnostic pop
#undef MM_ARCH_FENCE_POP
#endif

#endif /* MM_BASE_ARCH_H */
