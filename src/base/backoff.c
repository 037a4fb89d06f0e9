/* The slow phases of the back-off (see backoff.h). */
#include <sched.h>

#include "backoff.h"

void mm_backoff_wait(mm_backoff_t *b, uint64_t elapsed, uint64_t left)
{
    if (elapsed < b->spin_ns) {
        mm_cpu_pause();
        return;
    }
    if (elapsed < b->yield_ns) {
        sched_yield();
    } else {
        mm_sleep_ns(b->sleep_ns < left ? b->sleep_ns : left);
        if (b->sleep_ns < b->sleep_max_ns) b->sleep_ns *= 2;
    }
    b->spins = 31; /* slow phases: read the clock after every miss */
}
