/* Internals of a profiling session shared by the files of src/profile/ (never included by
 * producers: they see prof.h only). */
#ifndef MM_PROFILE_PROF_IMPL_H
#define MM_PROFILE_PROF_IMPL_H

#include "base/alloc.h"

#include "prof.h"

/* One ring per cache line pair: the count a worker bumps on every push never shares a line
 * with another worker's ring. */
typedef struct mm_prof_ring_slot {
    mm_prof_ring_t ring;
    char pad[2 * MM_CACHE_LINE - sizeof(mm_prof_ring_t)];
} mm_prof_ring_slot_t;

typedef struct mm_prof_invocation {
    uint64_t begin_ns, end_ns; /* end_ns 0 while open */
    char direction[MM_PROF_MAX_NAME];
    char note[MM_PROF_MAX_NOTE]; /* "" = none */
} mm_prof_invocation_t;

struct mm_prof_session {
    mm_prof_session_head_t head; /* first member: mm_prof_on() reads it */
    int n_cube, n_vector;
    uint32_t capacity;
    mm_prof_ring_slot_t *slots;  /* n_cube cube rings, then n_vector vector rings */
    int n_stages;
    char (*stage_names)[MM_PROF_MAX_NAME];

    /* Invocations: written by the launching thread between launches only. */
    mm_prof_invocation_t *inv;
    uint32_t n_inv, inv_cap;
    int inv_open;
    uint64_t inv_lost;       /* begun but not stored (table growth failed) */
    uint64_t inv_unclosed;   /* closed by the next begin instead of an end */

    /* Process-wide registry (prof_control.c). */
    int serial;              /* -1 until registered */
    int registered;
    struct mm_prof_session *next;
    char host[64];
};

static inline mm_prof_ring_t *mm_prof_ring_at(const mm_prof_session_t *s, int i)
{
    return &s->slots[i].ring;
}
static inline int mm_prof_ring_count(const mm_prof_session_t *s) { return s->n_cube + s->n_vector; }

/* Add one session's totals to a public summary (sessions++, wall_ns untouched). */
struct megamoe_profile_summary;
void mm_prof_summary_to_public(const mm_prof_summary_t *in, struct megamoe_profile_summary *out);

#endif /* MM_PROFILE_PROF_IMPL_H */
