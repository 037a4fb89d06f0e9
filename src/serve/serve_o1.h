/* Shared between the two paths of a mega_moe call: the host-scheduled one (serve_call.c) and
 * the O1 one (serve_o1.c, the executor's inference plan). */
#ifndef MM_SERVE_SERVE_O1_H
#define MM_SERVE_SERVE_O1_H

#include "multicore/mc_exec.h"
#include "multicore/mc_plan.h"
#include "ops/ep_route.h"
#include "serve/serve_impl.h"

/* The record of the first exchange. */
typedef struct mm_sv_rec {
    uint64_t gen;
    int64_t n;
    mm_sv_settings_t set;
    int32_t counts[]; /* [E]: this rank's active pairs per global expert (masked ranks' dropped) */
} mm_sv_rec_t;

typedef struct mm_sv_plan {
    int np;              /* participants */
    int *member;         /* [np] buffer member index of participant p */
    int *part_of;        /* [W] participant index of member m, -1 when masked */
    const mm_sv_rec_t **rec; /* [np] */
    int64_t *grp_off;    /* [L + 1] this rank's receive rows per local expert */
    int64_t *blk_off;    /* [L * np] row of block (j, p) on this rank */
    int64_t *dst_off;    /* [E] row of this rank's first pair of expert e on its owner */
    int64_t recv_rows;
} mm_sv_plan_t;

/* One call's state for the O1 launch. */
typedef struct mm_sv_o1_call {
    const mm_sv_call_t *c;
    const mm_sv_plan_t *pl;
    const int32_t *mine;      /* [E] this rank's pairs per expert */
    const int64_t *prefix;    /* [E] where expert e's pairs start in this rank's order */
    const int32_t *perm;      /* [pairs] position in this rank's order -> pair index t*K+k */
    const char *qx;           /* quantised token rows ([n][row_bytes]) or NULL (bf16 rows) */
    size_t wire;              /* bytes of a dispatched row */
    char *stage;              /* rows for owners on other hosts, in this rank's order */
    const int64_t *ret;       /* [np * L] row on participant q of its first pair of local
                                 expert j where this rank puts the results back, or -1 */
    const mm_sv_prepared_t *pw;  /* [L] routed experts */
    const mm_sv_prepared_t *spw; /* [S] shared experts or NULL */
    const int64_t *tok;       /* active tokens */
    int64_t n_active;
    float *acc;               /* shared experts' sums [n_active, H] */
    char *tiles;              /* per-worker tile scratch */
    size_t tile_bytes;
} mm_sv_o1_call_t;

/* The executor, its inference plan and the routing view it reads (collective: buffer
 * creation, only with a token bound). */
megamoe_status_t mm_sv_o1_create(megamoe_symm_buffer_t *b, int cube, int vector);
megamoe_status_t mm_sv_o1_destroy(megamoe_symm_buffer_t *b, int collective);
/* update_group moved the buffer to another team: the executor stays with the old one (freed
 * when that team goes, or by the last release) and the buffer's calls take the host path. */
void mm_sv_o1_retire(megamoe_symm_buffer_t *b);
megamoe_status_t mm_sv_o1_free_retired(mm_shmem_team_t *team); /* NULL: every one */
int mm_sv_o1_usable(const megamoe_symm_buffer_t *b);
/* The executor's team holds a rank the survivors agreed is lost (drop it: mm_sv_o1_destroy). */
int mm_sv_o1_lost(const megamoe_symm_buffer_t *b);
/* The launch (local: this rank's failure so far, every rank then returns it). */
megamoe_status_t mm_sv_o1_run(megamoe_symm_buffer_t *b, const mm_sv_o1_call_t *k,
                              megamoe_status_t local);

/* The tile bodies both paths run. */
megamoe_status_t mm_sv_tile_routed(const megamoe_symm_buffer_t *b, const mm_sv_call_t *c,
                                   const mm_sv_prepared_t *pw, int64_t row0, int64_t n, char *tile);
megamoe_status_t mm_sv_tile_shared(const megamoe_symm_buffer_t *b, const mm_sv_call_t *c,
                                   const mm_sv_prepared_t *pw, const int64_t *tok, int64_t r0,
                                   int64_t n, float *acc, char *tile);
size_t mm_sv_worker_bytes(const megamoe_symm_buffer_t *b, const mm_sv_experts_t *set);

#endif /* MM_SERVE_SERVE_O1_H */
