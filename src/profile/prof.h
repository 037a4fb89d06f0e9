/* MegaKernel profiling: per-worker bounded rings of fixed-size records, and export.
 *
 * Contract between the executor (src/multicore, the producer) and this layer:
 *  - A session belongs to one rank and one resource group; it has one ring per worker
 *    (cube and vector roles), each with a fixed record capacity chosen at creation. Records
 *    are appended by the ring's own worker only (no atomics on the hot path); a full ring
 *    drops the record and counts it.
 *  - The producer reads the enabled flag once per task: when profiling is off the cost is one
 *    predictable branch per task (mm_prof_on() is an inline load).
 *  - An invocation (one launch: a forward or a backward) is bracketed by begin/end on the
 *    launching thread while no worker is appending (workers are parked or about to start).
 *  - Timestamps are CLOCK_MONOTONIC nanoseconds (mm_now_ns), comparable across the ranks of
 *    a host, so per-rank traces can be merged on one time axis.
 *
 * Export: Chrome Trace JSON ("traceEvents" complete events, ph "X", ts/dur in microseconds)
 * that Perfetto and chrome://tracing open; pid = rank, one tid (track) per role/worker with
 * thread_name metadata ("cube 0", "vector 1"); args carry stage, task, owner expert, peer,
 * invocation and direction; a top-level "megaKernelTrace" object carries schemaVersion,
 * rank, invocationCount, recordCount and droppedRecordCount.
 */
#ifndef MM_PROFILE_PROF_H
#define MM_PROFILE_PROF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "megamoe/status.h"

typedef enum mm_prof_kind {
    MM_PROF_WAIT = 0,    /* waiting for a dependency counter */
    MM_PROF_COMPUTE = 1, /* running a task */
    MM_PROF_SIGNAL = 2   /* triggering a counter (local or remote) */
} mm_prof_kind_t;

typedef enum mm_prof_role { MM_PROF_CUBE = 0, MM_PROF_VECTOR = 1 } mm_prof_role_t;

/* 32 bytes. */
typedef struct mm_prof_record {
    uint64_t start_ns;
    uint64_t end_ns;
    uint8_t kind;   /* mm_prof_kind_t */
    uint8_t stage;  /* index into the session's stage-name table */
    uint16_t peer;  /* peer rank, 0xffff = none */
    int32_t task;   /* task index in the plan */
    int32_t owner;  /* owner (global expert id), -1 = none */
    uint32_t invocation;
} mm_prof_record_t;

typedef struct mm_prof_ring {
    mm_prof_record_t *records;
    uint32_t capacity;
    uint32_t count;
    uint64_t dropped;
    mm_prof_role_t role;
    int index; /* worker index within its role */
} mm_prof_ring_t;

typedef struct mm_prof_session mm_prof_session_t;

/* stage_names: table indexed by mm_prof_record.stage (copied). */
megamoe_status_t mm_prof_session_create(int rank, int n_cube, int n_vector,
                                        uint32_t records_per_worker,
                                        const char *const *stage_names, int n_stages,
                                        mm_prof_session_t **session_p);
void mm_prof_session_destroy(mm_prof_session_t *session);

/* Ring of worker `index` of a role; NULL when out of range. */
mm_prof_ring_t *mm_prof_ring(mm_prof_session_t *session, mm_prof_role_t role, int index);

/* Bracket one launch ("forward"/"backward"); returns the invocation number. */
uint32_t mm_prof_begin(mm_prof_session_t *session, const char *direction);
void mm_prof_end(mm_prof_session_t *session);

static inline void mm_prof_push(mm_prof_ring_t *ring, uint8_t kind, uint8_t stage, int32_t task,
                                int32_t owner, int peer, uint32_t invocation,
                                uint64_t start_ns, uint64_t end_ns)
{
    if (ring->count < ring->capacity) {
        mm_prof_record_t *r = &ring->records[ring->count++];
        r->start_ns = start_ns;
        r->end_ns = end_ns;
        r->kind = kind;
        r->stage = stage;
        r->peer = (uint16_t)(peer < 0 ? 0xffff : peer);
        r->task = task;
        r->owner = owner;
        r->invocation = invocation;
    } else {
        ring->dropped++;
    }
}

/* Write the session as Chrome Trace JSON. */
megamoe_status_t mm_prof_export_chrome(const mm_prof_session_t *session, FILE *out);
/* Write to <dir>/trace_<rank>.json (dir is created if missing). */
megamoe_status_t mm_prof_export_dir(const mm_prof_session_t *session, const char *dir);

/* Totals for the benchmark's wait share: nanoseconds spent in each kind over all workers. */
typedef struct mm_prof_summary {
    uint64_t wait_ns, compute_ns, signal_ns;
    uint64_t wall_ns; /* first start to last end over all workers and invocations */
    uint64_t records, dropped;
    int workers;
} mm_prof_summary_t;
void mm_prof_summarize(const mm_prof_session_t *session, mm_prof_summary_t *summary_p);

/* Drop all records (keeps capacity and names). */
void mm_prof_reset(mm_prof_session_t *session);

#endif /* MM_PROFILE_PROF_H */
