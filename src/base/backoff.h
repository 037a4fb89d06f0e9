/* The back-off of every wait in the library: a SHMEM wait on a word a peer writes
 * (shmem/wait.c) and an O1 worker waiting for a ready task (multicore/mc_exec.c).
 *
 * Phases from the first miss: spin with a pause instruction up to spin_ns (a flag written by a
 * peer on another core arrives in ~0.1-0.3 us), then sched_yield up to yield_ns (lets a thread
 * sharing this core run), then sleep, from 20 us doubling to sleep_max_ns, so an idle waiter
 * costs almost no CPU. The clock is read every 32 misses while spinning and at every miss
 * after that; at each read the caller checks its own conditions (timeout, peer liveness).
 *
 *     mm_backoff_t b;
 *     mm_backoff_init(&b, spin_ns, yield_ns, sleep_max_ns);
 *     while (!ready()) {
 *         uint64_t elapsed;
 *         if (!mm_backoff_miss(&b, &elapsed)) continue;   // paused; no clock read
 *         ...check timeout / peers with elapsed...
 *         mm_backoff_wait(&b, elapsed, timeout - elapsed); // pause, yield or sleep
 *     }
 */
#ifndef MM_BASE_BACKOFF_H
#define MM_BASE_BACKOFF_H

#include <stdint.h>

#include "arch.h"
#include "clock.h"

#define MM_BACKOFF_SLEEP_MIN_NS 20000ull

typedef struct mm_backoff {
    uint64_t spin_ns, yield_ns, sleep_max_ns; /* phase ends and the longest sleep */
    uint64_t start;                           /* clock at the first miss, 0 before */
    uint64_t sleep_ns;                        /* the next sleep */
    unsigned spins;                           /* misses since the clock was last read */
} mm_backoff_t;

static inline void mm_backoff_reset(mm_backoff_t *b)
{
    b->start = 0;
    b->sleep_ns = MM_BACKOFF_SLEEP_MIN_NS;
    b->spins = 0;
}

static inline void mm_backoff_init(mm_backoff_t *b, uint64_t spin_ns, uint64_t yield_ns,
                                   uint64_t sleep_max_ns)
{
    b->spin_ns = spin_ns;
    b->yield_ns = yield_ns;
    b->sleep_max_ns = sleep_max_ns;
    mm_backoff_reset(b);
}

/* One miss. 0: paused, nothing else to do (the cheap case). 1: *elapsed_p holds the time
 * since the first miss; the caller checks its conditions, then calls mm_backoff_wait(). */
static inline int mm_backoff_miss(mm_backoff_t *b, uint64_t *elapsed_p)
{
    if (b->start == 0) b->start = mm_now_ns();
    if (++b->spins < 32) {
        mm_cpu_pause();
        return 0;
    }
    b->spins = 0;
    *elapsed_p = mm_now_ns() - b->start;
    return 1;
}

/* Pause (spin phase), yield, or sleep (at most left ns) according to elapsed. */
void mm_backoff_wait(mm_backoff_t *b, uint64_t elapsed, uint64_t left);

#endif /* MM_BASE_BACKOFF_H */
