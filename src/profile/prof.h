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

/* The part of a session the producer's inline checks read: every session starts with it. */
typedef struct mm_prof_session_head {
    int active; /* recording; set between launches, read with a relaxed atomic load */
    int rank;
} mm_prof_session_head_t;

/* Producer check, once per launch (or per task): a NULL session or a paused one is "off".
 * Costs one load and one predictable branch. */
static inline int mm_prof_on(const mm_prof_session_t *session)
{
    return session != NULL &&
           __atomic_load_n(&((const mm_prof_session_head_t *)(const void *)session)->active,
                           __ATOMIC_RELAXED) != 0;
}

/* Limits checked by mm_prof_session_create (INVALID_ARGUMENT beyond them). */
#define MM_PROF_MAX_WORKERS 4096              /* per role */
#define MM_PROF_MAX_RECORDS (1u << 26)        /* per worker (2 GiB of records) */
#define MM_PROF_MAX_STAGES 256                /* mm_prof_record.stage is a uint8_t */
#define MM_PROF_MAX_NAME 64                   /* stage and direction names, with the NUL */
#define MM_PROF_MAX_NOTE 256                  /* an invocation's note, with the NUL */

/* stage_names: table indexed by mm_prof_record.stage (copied; 1..256 names, each shorter
 * than MM_PROF_MAX_NAME). n_cube, n_vector >= 0 with at least one worker; records_per_worker
 * in [1, MM_PROF_MAX_RECORDS]. Records are allocated and touched here, never on the push
 * path. The session starts active (recording); a producer that wants it off pauses it. */
megamoe_status_t mm_prof_session_create(int rank, int n_cube, int n_vector,
                                        uint32_t records_per_worker,
                                        const char *const *stage_names, int n_stages,
                                        mm_prof_session_t **session_p);
void mm_prof_session_destroy(mm_prof_session_t *session);

/* The public handle of a session (megamoe_profile_t of include/megamoe/prof.h) is the
 * session itself: hand it out with this cast. */
struct megamoe_profile;
static inline struct megamoe_profile *mm_prof_public(mm_prof_session_t *session)
{
    return (struct megamoe_profile *)(void *)session;
}

/* Ring of worker `index` of a role; NULL when out of range. */
mm_prof_ring_t *mm_prof_ring(mm_prof_session_t *session, mm_prof_role_t role, int index);

/* Bracket one launch ("forward"/"backward"); returns the invocation number: 0, 1, 2, ...
 * since creation or the last reset. A begin while the previous invocation is still open
 * closes it there (and the export warns). The direction is copied (truncated to
 * MM_PROF_MAX_NAME - 1 bytes; NULL = "unknown"). */
uint32_t mm_prof_begin(mm_prof_session_t *session, const char *direction);
void mm_prof_end(mm_prof_session_t *session);
/* Attach a note to the open invocation (e.g. the plan a launch ran: "replicas: expert 0 on
 * rank 1 (3106 rows)"); exported as the invocation's "note" and shown by `megamoe trace`.
 * Copied, truncated to MM_PROF_MAX_NOTE - 1 bytes; call between begin and end on the
 * launching thread. A NULL session or no open invocation: no-op. */
void mm_prof_note(mm_prof_session_t *session, const char *text);

/* Pause (0) or resume (1) recording; the producer sees it at its next mm_prof_on(). Call
 * between launches. */
void mm_prof_set_active(mm_prof_session_t *session, int active);
int mm_prof_rank(const mm_prof_session_t *session);
int mm_prof_workers(const mm_prof_session_t *session, mm_prof_role_t role);
uint32_t mm_prof_capacity(const mm_prof_session_t *session);
/* Invocations begun since creation or the last reset. */
uint32_t mm_prof_invocation_count(const mm_prof_session_t *session);
/* Stage name of index `stage` ("stage<N>" style names are never invented: NULL when out of
 * range). */
const char *mm_prof_stage_name(const mm_prof_session_t *session, int stage);

/* One producer per ring; readers (summaries, exports) may run at the same time and see a
 * consistent prefix: the record is written first, then the count is published (release);
 * readers take the count with acquire (mm_prof_ring_records) and read only below it. On x86
 * both are plain moves. */
static inline uint32_t mm_prof_ring_records(const mm_prof_ring_t *ring)
{
    return __atomic_load_n(&ring->count, __ATOMIC_ACQUIRE);
}
static inline uint64_t mm_prof_ring_dropped(const mm_prof_ring_t *ring)
{
    return __atomic_load_n(&ring->dropped, __ATOMIC_RELAXED);
}

static inline void mm_prof_push(mm_prof_ring_t *ring, uint8_t kind, uint8_t stage, int32_t task,
                                int32_t owner, int peer, uint32_t invocation,
                                uint64_t start_ns, uint64_t end_ns)
{
    const uint32_t n = __atomic_load_n(&ring->count, __ATOMIC_RELAXED);
    if (n < ring->capacity) {
        mm_prof_record_t *r = &ring->records[n];
        r->start_ns = start_ns;
        r->end_ns = end_ns;
        r->kind = kind;
        r->stage = stage;
        r->peer = (uint16_t)(peer < 0 ? 0xffff : peer);
        r->task = task;
        r->owner = owner;
        r->invocation = invocation;
        __atomic_store_n(&ring->count, n + 1, __ATOMIC_RELEASE);
    } else {
        __atomic_store_n(&ring->dropped, __atomic_load_n(&ring->dropped, __ATOMIC_RELAXED) + 1,
                         __ATOMIC_RELAXED);
    }
}

/* Write the session as Chrome Trace JSON. */
megamoe_status_t mm_prof_export_chrome(const mm_prof_session_t *session, FILE *out);
/* Write to <dir>/trace_<rank>.json (dir is created if missing). */
megamoe_status_t mm_prof_export_dir(const mm_prof_session_t *session, const char *dir);
/* Several sessions of one process (resource groups) in one trace: each keeps its tracks
 * (thread names get a "group <serial>/" prefix when a rank has more than one). */
megamoe_status_t mm_prof_export_chrome_many(const mm_prof_session_t *const *sessions, int count,
                                            FILE *out);
/* Same, to a file (written to <path>.tmp, then renamed: readers never see half a trace). */
megamoe_status_t mm_prof_export_file(const mm_prof_session_t *const *sessions, int count,
                                     const char *path);

/* Totals for the benchmark's wait share: nanoseconds spent in each kind over all workers. */
typedef struct mm_prof_summary {
    uint64_t wait_ns, compute_ns, signal_ns;
    uint64_t wall_ns; /* first start to last end over all workers and invocations */
    uint64_t records, dropped;
    int workers;
    /* Added after the first contract (fields above unchanged): */
    uint64_t launch_ns;   /* sum over closed invocations of end - begin */
    uint32_t invocations; /* begun since creation or the last reset */
} mm_prof_summary_t;
void mm_prof_summarize(const mm_prof_session_t *session, mm_prof_summary_t *summary_p);
/* One worker's totals (workers = 1; wall_ns over its own records; launch_ns and invocations
 * of the session). INVALID_ARGUMENT when out of range. Wait share = wait_ns / launch_ns. */
megamoe_status_t mm_prof_summarize_worker(const mm_prof_session_t *session, mm_prof_role_t role,
                                          int index, mm_prof_summary_t *summary_p);

/* Drop all records (keeps capacity and names). */
void mm_prof_reset(mm_prof_session_t *session);

/* ---- process-wide control (prof_control.c) ------------------------------------------------
 * The Python profiler (megamoe.profiler), MEGAMOE_PROFILE and the public megamoe_profiler_*
 * functions act on every session registered here. Producer checklist (one resource group):
 *   (MEGAMOE_PROFILE is read when the library loads; mm_prof_control_init() reads it again
 *    for a value set later, e.g. by a test)
 *   before each launch    if (MM_UNLIKELY(mm_prof_requested()) && !group->prof) {
 *                             mm_prof_session_create(rank, n_cube, n_vector, cap, names, n,
 *                                                    &group->prof);
 *                             mm_prof_register(group->prof); }
 *                         on = mm_prof_on(group->prof);  inv = on ? mm_prof_begin(..) : 0;
 *   in the workers        ring = on ? mm_prof_ring(..) : NULL; per task: if (ring) push
 *   after the launch      if (on) mm_prof_end(group->prof);
 *   at group close        mm_prof_retire(group->prof) (exports to MEGAMOE_PROFILE, frees)
 * A registered session starts active when profiling is requested, paused otherwise. */

/* 1 while profiling is requested for this process (MEGAMOE_PROFILE set, or
 * megamoe_profiler_start() called and not stopped). One relaxed load. */
extern int mm_prof_requested_flag;
static inline int mm_prof_requested(void)
{
    return __atomic_load_n(&mm_prof_requested_flag, __ATOMIC_RELAXED) != 0;
}
/* Read MEGAMOE_PROFILE: the first call that finds it non-empty starts profiling (once per
 * process; megamoe_profiler_stop() ends it for good).
 * INVALID_ARGUMENT for a bad value of the variable. */
megamoe_status_t mm_prof_control_init(void);
/* The MEGAMOE_PROFILE directory, "" when unset. */
const char *mm_prof_env_dir(void);
/* Make a session reachable by the process-wide calls and give it its serial (0, 1, ...
 * in registration order; it names the group in traces). Sets it active iff requested. */
megamoe_status_t mm_prof_register(mm_prof_session_t *session);
/* Remove it (no-op when not registered). */
void mm_prof_unregister(mm_prof_session_t *session);
/* Serial given by mm_prof_register, -1 when never registered. */
int mm_prof_serial(const mm_prof_session_t *session);
/* End of a producer's session: when MEGAMOE_PROFILE is set and the session holds records,
 * write <dir>/trace_<rank>.json (serial 0) or <dir>/trace_<rank>.g<serial>.json; then
 * unregister and destroy it (also on error; the status is the export's). NULL is a no-op. */
megamoe_status_t mm_prof_retire(mm_prof_session_t *session);

#endif /* MM_PROFILE_PROF_H */
