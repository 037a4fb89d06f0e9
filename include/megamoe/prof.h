/* megamoe — MegaKernel profiling: what each worker did, when (docs/profiling.md).
 *
 * Model. A profile session belongs to one rank and one resource group (the worker threads
 * of a MegaMoeExperts layer, or of layers sharing one). It holds one bounded ring of
 * fixed-size records per worker: cube workers (GEMM) and vector workers (communication,
 * SwiGLU, reduce). Each record is a span (start, end in CLOCK_MONOTONIC nanoseconds) of one
 * kind: wait (for a dependency), compute (a task) or signal (a counter trigger), with the
 * stage, task index, owner expert, peer rank and invocation it belongs to. An invocation is
 * one launch (a forward or a backward). A full ring drops records and counts them.
 *
 * Three levels of use:
 *  1. The process-wide profiler (megamoe_profiler_*): start/stop recording in every session
 *     of this process (the executor creates a session per resource group on the first launch
 *     after the start), export one Chrome trace per rank, get totals. This is what the
 *     environment variable MEGAMOE_PROFILE=<dir> (trace written to <dir>/trace_<rank>.json
 *     when the group closes) and the Python context manager megamoe.profiler drive.
 *  2. A session handle (megamoe_profile_*): one group's session, or a session you create to
 *     record your own spans on the same time axis.
 *  3. Trace files (megamoe_trace_*): merge the per-rank files into one, print a per-stage
 *     summary, render an SVG timeline. The `megamoe trace` command wraps these.
 *
 * Trace file: Chrome Trace JSON that Perfetto (ui.perfetto.dev) and chrome://tracing open.
 * pid = rank ("rank N"), one track per worker ("cube 0", "vector 1") plus a "launch" track
 * with one span per invocation; records are complete events (ph "X", cat "MegaKernel",
 * name "<stage>:<kind>", ts/dur in microseconds with nanosecond digits) whose args carry
 * stage, kind, task, owner, peer (-1 = none), invocation and direction. The top-level object
 * "megaKernelTrace" carries schemaVersion 1, rank, invocationCount, recordCount,
 * droppedRecordCount, warnings, invocations and ranks.
 *
 * Threads: sessions are recorded by the executor's workers during a launch; every function
 * here must be called between launches (not concurrently with a forward/backward of the
 * layer whose session it touches). The process-wide functions are thread-safe among
 * themselves.
 */
#ifndef MEGAMOE_PROF_H
#define MEGAMOE_PROF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "megamoe/export.h"
#include "megamoe/status.h"

#ifdef __cplusplus
extern "C" {
#endif
MEGAMOE_API_BEGIN

typedef enum megamoe_profile_kind {
    MEGAMOE_PROFILE_WAIT = 0,    /* waiting for a dependency counter */
    MEGAMOE_PROFILE_COMPUTE = 1, /* running a task */
    MEGAMOE_PROFILE_SIGNAL = 2   /* triggering a counter (local or remote) */
} megamoe_profile_kind_t;

typedef enum megamoe_profile_role {
    MEGAMOE_PROFILE_CUBE = 0,  /* GEMM workers */
    MEGAMOE_PROFILE_VECTOR = 1 /* communication / elementwise workers */
} megamoe_profile_role_t;

/* Totals over sessions (or one session): nanoseconds per kind summed over all workers. */
typedef struct megamoe_profile_summary {
    uint64_t wait_ns, compute_ns, signal_ns;
    uint64_t wall_ns;      /* first record start to last record end */
    uint64_t launch_ns;    /* sum over invocations of their duration */
    uint64_t records;      /* records kept */
    uint64_t dropped;      /* records dropped because a ring was full */
    uint64_t invocations;
    int workers;
    int sessions;
} megamoe_profile_summary_t;

/* ---- 1. process-wide profiler ------------------------------------------------------------ */

/* Start recording in every session of this process, now and in sessions created later.
 * Keeps what was recorded before (call megamoe_profiler_reset() to drop it). */
megamoe_status_t megamoe_profiler_start(void);
/* Stop recording (sessions keep their records for export). */
megamoe_status_t megamoe_profiler_stop(void);
/* 1 while started (also when MEGAMOE_PROFILE requested it), else 0. */
int megamoe_profiler_is_started(void);
/* Drop the records and invocations of every session (capacities stay). */
void megamoe_profiler_reset(void);
/* Sessions currently registered in this process. */
int megamoe_profiler_session_count(void);
/* Totals over every session (zeros and sessions = 0 when there is none). */
megamoe_status_t megamoe_profiler_get_summary(megamoe_profile_summary_t *summary_p);
/* Write every session of this process into one Chrome trace at path (an empty trace with a
 * warning when there is none; rank from RANK, else 0). Parent directories are created. */
megamoe_status_t megamoe_profiler_export(const char *path);
/* Same, to <dir>/trace_<rank>.json. */
megamoe_status_t megamoe_profiler_export_dir(const char *dir);

/* ---- 2. sessions ------------------------------------------------------------------------- */

typedef struct megamoe_profile megamoe_profile_t;

typedef struct megamoe_profile_params {
    size_t struct_size; /* set by megamoe_profile_params_default(): the caller's sizeof (megamoe/version.h) */
    int rank;                        /* pid in the trace; -1 = RANK from the environment, else 0 */
    int cube_workers;                /* >= 0 */
    int vector_workers;              /* >= 0; at least one worker in total */
    uint32_t records_per_worker;     /* ring capacity, 1 .. 2^26 */
    const char *const *stage_names;  /* stage_count names (copied), each < 64 bytes */
    int stage_count;                 /* 1 .. 256 */
} megamoe_profile_params_t;

/* rank -1, one cube and one vector worker, 65536 records each, no stages (set them). */
megamoe_status_t megamoe_profile_params_init(megamoe_profile_params_t *p, size_t struct_size);
static inline megamoe_profile_params_t megamoe_profile_params_default(void)
{
    megamoe_profile_params_t v;
    megamoe_profile_params_init(&v, sizeof v);
    return v;
}

/* Create a session and register it with the process-wide profiler (it records while the
 * profiler is started; megamoe_profile_set_active overrides that). */
megamoe_status_t megamoe_profile_create(const megamoe_profile_params_t *params,
                                        megamoe_profile_t **profile_p);
/* Unregister and free a session made by megamoe_profile_create. NULL is a no-op. */
void megamoe_profile_destroy(megamoe_profile_t *profile);

int megamoe_profile_is_active(const megamoe_profile_t *profile);
void megamoe_profile_set_active(megamoe_profile_t *profile, int active);

/* Bracket one launch (direction "forward", "backward", ...); invocation_p (may be NULL)
 * receives its number: 0, 1, ... since creation or reset. */
megamoe_status_t megamoe_profile_begin(megamoe_profile_t *profile, const char *direction,
                                       uint32_t *invocation_p);
megamoe_status_t megamoe_profile_end(megamoe_profile_t *profile);

typedef struct megamoe_profile_record {
    uint64_t start_ns, end_ns;   /* megamoe_profile_clock_ns() time base */
    megamoe_profile_kind_t kind;
    int stage;                   /* index into the session's stage names */
    int32_t task;                /* task index, -1 = none */
    int32_t owner;               /* owner (global expert id), -1 = none */
    int peer;                    /* peer rank, -1 = none */
    uint32_t invocation;
} megamoe_profile_record_t;

/* Append a record to worker `worker` of `role` (the producer's own spans; the executor uses
 * an inline path). A full ring drops it and counts it (still OK). INVALID_ARGUMENT for an
 * unknown worker, kind or stage. */
megamoe_status_t megamoe_profile_record(megamoe_profile_t *profile, megamoe_profile_role_t role,
                                        int worker, const megamoe_profile_record_t *record);

/* The clock of the records: CLOCK_MONOTONIC in nanoseconds (same on every rank of a host). */
uint64_t megamoe_profile_clock_ns(void);

megamoe_status_t megamoe_profile_get_summary(const megamoe_profile_t *profile,
                                             megamoe_profile_summary_t *summary_p);
/* One worker's totals (workers = 1); wait share = wait_ns / launch_ns. */
megamoe_status_t megamoe_profile_get_worker_summary(const megamoe_profile_t *profile,
                                                    megamoe_profile_role_t role, int worker,
                                                    megamoe_profile_summary_t *summary_p);
void megamoe_profile_reset(megamoe_profile_t *profile);
/* Chrome trace of this session to a file / to <dir>/trace_<rank>.json. */
megamoe_status_t megamoe_profile_export(const megamoe_profile_t *profile, const char *path);
megamoe_status_t megamoe_profile_export_dir(const megamoe_profile_t *profile, const char *dir);

/* ---- 3. trace files ---------------------------------------------------------------------- *
 * inputs: files, or directories (every trace_*.json inside, in name order). Files of the same
 * rank (several resource groups) keep their tracks apart. Input errors (unreadable or
 * malformed file: INVALID_ARGUMENT / IO / NOT_FOUND naming the file, line and column) are not
 * logged: the text is in megamoe_last_error() for the caller to show. */

/* Merge into one trace at output (all ranks on one time axis; CLOCK_MONOTONIC stamps of
 * one host are directly comparable, the merge warns when the files come from several hosts). */
megamoe_status_t megamoe_trace_merge(const char *const *inputs, size_t count,
                                     const char *output);

typedef struct megamoe_trace_summary_options {
    int json;            /* 1: one JSON object instead of the table */
    int64_t invocation;  /* only this invocation (-1 = all) */
} megamoe_trace_summary_options_t;

/* Per rank and role, a per-stage table (count, total, mean, p50, p99, share of launch time),
 * the wait share of every worker, and the warnings (dropped records...). options NULL =
 * table of all invocations. */
megamoe_status_t megamoe_trace_summary(const char *const *inputs, size_t count,
                                       const megamoe_trace_summary_options_t *options, FILE *out);

typedef struct megamoe_trace_svg_options {
    int width;           /* picture width in pixels (0 = 1600; 400 .. 20000) */
    int64_t invocation;  /* only this invocation's time window (-1 = everything) */
} megamoe_trace_svg_options_t;

/* Timeline picture: one row per rank/worker, spans coloured by stage, waits grey and
 * hatched, signals as dark ticks, invocations on each rank's launch row. */
megamoe_status_t megamoe_trace_svg(const char *const *inputs, size_t count,
                                   const megamoe_trace_svg_options_t *options,
                                   const char *output);

MEGAMOE_API_END
#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_PROF_H */
