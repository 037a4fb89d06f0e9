/* What the wire must carry (issue 31): the --hosts rows of bench layer and bench dispatch
 * report the bytes a rank sends to other hosts per step, the engine messages and blocking
 * round trips behind them, and a wire floor: those bytes at the engine's own put rate at 1 MiB
 * plus a number of the engine's own signal round trips, both measured by `bench shmem --hosts`
 * in the same run. */
#ifndef MM_BENCH_WIRE_H
#define MM_BENCH_WIRE_H

#include <stdint.h>

#include "shmem/shmem.h"

/* Traffic to other hosts in some interval (per step when divided). */
typedef struct mm_bench_wire {
    double bytes;       /* data bytes put */
    double messages;    /* engine operations sent (puts, signals, requests) */
    double round_trips; /* blocking round trips: gets and quiets that waited */
} mm_bench_wire_t;

/* after - before, divided by steps. */
mm_bench_wire_t mm_bench_wire_delta(const mm_shmem_engine_stats_t *before,
                                    const mm_shmem_engine_stats_t *after, double steps);

/* UCX's own figures between two simulated hosts. */
typedef struct mm_bench_wire_engine {
    double put_gbps;      /* ucp_put_nbx + flush at 1 MiB, both ranks writing, per rank */
    double signal_rtt_us; /* an 8-byte ucp_put_nbx each way, the waiter progressing */
    int ok;
    int exit_status; /* the sub-run's wait status (diagnostics) */
} mm_bench_wire_engine_t;

/* Run `<self> bench shmem --hosts hosts --sizes 1M --impls engine` and read its engine rows
 * (about 10 s; up to 3 tries). ok = 0 (message printed) when every try failed. */
void mm_bench_wire_engine_measure(int hosts, mm_bench_wire_engine_t *out);

/* bytes at the engine's put rate plus round_trips engine signal round trips, in ms. */
double mm_bench_wire_floor_ms(const mm_bench_wire_engine_t *eng, double bytes, int round_trips);

/* Add bytes_to_other_hosts, engine_messages, engine_round_trips, wire_floor_ms and
 * over_wire_floor (= over_ms / wire_floor_ms; over_ms < 0: not written) to the current row. */
void mm_bench_wire_fields(const mm_bench_wire_engine_t *eng, const mm_bench_wire_t *w,
                          int floor_round_trips, double over_ms);

#endif
