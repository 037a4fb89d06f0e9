/* Monotonic clocks. */
#ifndef MM_BASE_CLOCK_H
#define MM_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t mm_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline double mm_now_s(void) { return (double)mm_now_ns() * 1e-9; }

/* Sleep for ns nanoseconds (restarts on EINTR). */
void mm_sleep_ns(uint64_t ns);

#endif /* MM_BASE_CLOCK_H */
