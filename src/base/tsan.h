/* ThreadSanitizer annotations. The shipped synchronisation runs under TSan unchanged; these
 * only tell TSan what it cannot see (fences, and memory written by uninstrumented libraries),
 * and compile to nothing in every other build. */
#ifndef MM_BASE_TSAN_H
#define MM_BASE_TSAN_H

#if defined(__SANITIZE_THREAD__)
#define MM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MM_TSAN 1
#endif
#endif

#ifdef MM_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
/* A happens-before edge from every MM_TSAN_RELEASE(addr) to a later MM_TSAN_ACQUIRE(addr). */
#define MM_TSAN_ACQUIRE(addr) __tsan_acquire((void *)(addr))
#define MM_TSAN_RELEASE(addr) __tsan_release((void *)(addr))
/* The calling thread's memory accesses between the two are not recorded. */
#define MM_TSAN_IGNORE_BEGIN() __tsan_ignore_thread_begin()
#define MM_TSAN_IGNORE_END() __tsan_ignore_thread_end()
#else
#define MM_TSAN_ACQUIRE(addr) ((void)(addr))
#define MM_TSAN_RELEASE(addr) ((void)(addr))
#define MM_TSAN_IGNORE_BEGIN() ((void)0)
#define MM_TSAN_IGNORE_END() ((void)0)
#endif

#endif /* MM_BASE_TSAN_H */
