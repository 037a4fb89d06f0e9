/* The trace model: what a Chrome trace of ours holds, built from sessions (export) or read
 * back from files (merge, summary, svg). One writer (trace_write.c) serialises it.
 *
 * Times are int64 nanoseconds on the CLOCK_MONOTONIC axis; files carry them as microseconds
 * with exactly three decimals, so a write/read round trip is exact. */
#ifndef MM_PROFILE_TRACE_H
#define MM_PROFILE_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "megamoe/status.h"

#include "prof.h"

enum { MM_TRACK_CUBE = 0, MM_TRACK_VECTOR = 1, MM_TRACK_LAUNCH = 2, MM_TRACK_OTHER = 3 };

/* Largest timestamp and duration a trace may hold (2^61 ns, 73 years of CLOCK_MONOTONIC): a
 * read file outside [0, this] is refused, so ts + dur and differences of ends never overflow
 * int64 (the fuzzer found the overflows). Sums of many durations still saturate. */
#define MM_TRACE_MAX_NS (INT64_C(1) << 61)
static inline int64_t mm_trace_sat_add(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? (b > 0 ? INT64_MAX : INT64_MIN) : r;
}
static inline int64_t mm_trace_sat_mul(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? ((a < 0) != (b < 0) ? INT64_MIN : INT64_MAX) : r;
}
enum { MM_KIND_COUNT = 3 };

typedef struct mm_trace_track {
    int pid;       /* rank */
    int tid;       /* unique within the pid */
    int group;     /* resource group (session serial) within the rank */
    int role;      /* MM_TRACK_* */
    int worker;    /* index within the role (cube/vector), else -1 */
    uint32_t name; /* string id of the label for MM_TRACK_OTHER */
} mm_trace_track_t;

typedef struct mm_trace_event {
    int64_t ts_ns, dur_ns;
    uint32_t track;      /* index into tracks */
    uint32_t stage;      /* string id */
    uint32_t direction;  /* string id */
    uint32_t invocation;
    int32_t task, owner, peer; /* -1 = none */
    uint8_t kind;        /* mm_prof_kind_t */
} mm_trace_event_t;

typedef struct mm_trace_invocation {
    int pid, group;
    uint32_t index;
    uint32_t direction;  /* string id */
    int64_t begin_ns, end_ns; /* end_ns < begin_ns: never ended */
    uint32_t note;       /* string id of the producer's note; MM_TRACE_NO_NOTE = none */
} mm_trace_invocation_t;
#define MM_TRACE_NO_NOTE UINT32_MAX

typedef struct mm_trace_rank {
    int rank;
    uint32_t host;       /* string id */
    uint64_t records, dropped, invocations;
} mm_trace_rank_t;

typedef struct mm_trace {
    mm_trace_track_t *tracks;
    size_t n_tracks, cap_tracks;
    mm_trace_event_t *events;
    size_t n_events, cap_events;
    mm_trace_invocation_t *invs;
    size_t n_invs, cap_invs;
    mm_trace_rank_t *ranks;
    size_t n_ranks, cap_ranks;
    uint32_t *warnings;  /* string ids */
    size_t n_warnings, cap_warnings;
    /* Interned strings. */
    char **strings;
    size_t n_strings, cap_strings;
    uint32_t *hash;      /* open addressing: string id + 1, 0 = empty */
    size_t hash_cap;
} mm_trace_t;

void mm_trace_init(mm_trace_t *t);
void mm_trace_free(mm_trace_t *t);

/* Length of the valid UTF-8 sequence at s (at most avail bytes), 0 when invalid. */
int mm_trace_utf8_len(const unsigned char *s, size_t avail);
/* String id of s (len bytes), interned. Invalid UTF-8 bytes become U+FFFD (as the writer
 * prints them), so a written trace reads back to the same strings. */
megamoe_status_t mm_trace_intern(mm_trace_t *t, const char *s, size_t len, uint32_t *id_p);
static inline const char *mm_trace_str(const mm_trace_t *t, uint32_t id) { return t->strings[id]; }
megamoe_status_t mm_trace_warn(mm_trace_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Track of (pid, group, role, worker) (role OTHER: keyed by name), added when missing; a
 * new track gets want_tid when that is free in the pid, else the next free tid. */
megamoe_status_t mm_trace_track(mm_trace_t *t, int pid, int group, int role, int worker,
                                uint32_t name, int want_tid, uint32_t *index_p);
/* Rank entry of pid, added (zeroed, host "unknown") when missing. */
megamoe_status_t mm_trace_rank(mm_trace_t *t, int pid, mm_trace_rank_t **rank_p);
megamoe_status_t mm_trace_add_event(mm_trace_t *t, const mm_trace_event_t *e);
megamoe_status_t mm_trace_add_invocation(mm_trace_t *t, const mm_trace_invocation_t *inv);
/* Groups (distinct) of a pid. */
int mm_trace_group_count(const mm_trace_t *t, int pid);
/* Invocation (pid, group, index) or NULL. */
const mm_trace_invocation_t *mm_trace_find_invocation(const mm_trace_t *t, int pid, int group,
                                                      uint32_t index);

/* Label of a track ("cube 0", "vector 1", "launch"; prefixed "group G/" when the rank has
 * several groups) into buf. */
void mm_trace_track_label(const mm_trace_t *t, const mm_trace_track_t *tr, char *buf,
                          size_t size);
const char *mm_trace_kind_name(int kind);
const char *mm_trace_role_name(int role);

/* ---- building (trace_build.c) ---- */
/* Append sessions (one process) to the model; each is a group numbered by its serial (or
 * its position when unregistered). Checks per-track overlaps and warns. */
megamoe_status_t mm_trace_from_sessions(mm_trace_t *t, const mm_prof_session_t *const *sessions,
                                        int count);

/* ---- reading (trace_read.c) ---- */
/* Append the trace in file `path` (errors name it; not logged). */
megamoe_status_t mm_trace_read_file(mm_trace_t *t, const char *path);
/* Expand inputs (files or directories of trace_*.json) and read them all. */
megamoe_status_t mm_trace_read_inputs(mm_trace_t *t, const char *const *inputs, size_t count);

/* ---- writing (trace_write.c) ---- */
megamoe_status_t mm_trace_write(const mm_trace_t *t, FILE *out);
/* Write to path via <path>.tmp + rename, creating parent directories; errors name path. */
megamoe_status_t mm_trace_write_file(const mm_trace_t *t, const char *path);
/* mkdir -p (errors name the path). */
megamoe_status_t mm_prof_mkdirs(const char *dir);
/* Exact "<us>.<3 digits>" of a nanosecond count. */
void mm_trace_fmt_us(char *buf, size_t size, int64_t ns);
/* JSON string literal of s (escaped; invalid UTF-8 bytes become U+FFFD). */
void mm_trace_put_json_string(FILE *out, const char *s);

/* ---- analysis (trace_summary.c, trace_svg.c) ---- */
/* Events sorted by (track, ts): an index array of n_events entries (caller frees). */
megamoe_status_t mm_trace_sorted_events(const mm_trace_t *t, uint32_t **order_p);
megamoe_status_t mm_trace_print_summary(const mm_trace_t *t, int json, int64_t invocation,
                                        FILE *out);
megamoe_status_t mm_trace_render_svg(const mm_trace_t *t, int width, int64_t invocation,
                                     FILE *out);

#endif /* MM_PROFILE_TRACE_H */
