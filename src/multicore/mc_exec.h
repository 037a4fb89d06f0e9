/* The O1 executor: one persistent launch per direction on the rank's worker threads, walking
 * the static plan (mc_plan.h) with dependency counters (docs/multicore.md).
 *
 * Workers. The group's worker pool runs every launch: worker w < cube is a cube worker, the
 * others vector workers. Each worker serves its role's queue first and the other queue when
 * its own head is not ready (so one worker runs both, and nobody idles while a ready task
 * waits). Queues are shared by the workers of a role: a worker takes the head only when its
 * dependencies hold (an atomic cursor; order is kept, a claimed task never waits). Between
 * launches the threads are parked in the pool (no spinning).
 *
 * Counters (all monotone for the group's life, so no launch zeroes anything):
 *   symmetric, written by peers  arrival[j][s]  + NT per launch (block (j, s) of source s)
 *                                done[s]        + 1 per launch (rank s will write no more)
 *   private                      expert[j]      + EP*NT per launch (tiles of expert j done)
 *                                work           + n_counted of the graph (tasks before DONE)
 * Thresholds are the launch generation times the static amount, identical on every rank
 * because launches are collective and in the same order. A DISPATCH tile slot adds its amount
 * to a same-host peer's arrival line at once; for a peer on another host the block's last tile
 * slot to run adds the whole block's (private block[peer][j] counts the slots), since the
 * owner's EXPERT and WGRAD2 tasks wait for whole blocks: one signal per block crosses the wire
 * (riding in the last tile's coalesced message) instead of one per tile.
 *
 * End of a launch. DONE runs after every other task of the rank: it writes the rank's status
 * (OK, or the first local failure with its text) into a status slot on every rank, then adds
 * 1 to done[me] there. REDUCE waits for done from every rank. So when a launch returns, no
 * peer writes into this rank's buffers any more (all of their rows and signals precede
 * their DONE), and every rank sees the same set of statuses: the call fails identically on
 * every rank ("rank R: <text>" of the lowest failing rank) without any extra collective,
 * and outputs written by REDUCE are written only when every status is OK. The next launch's
 * rows cannot overwrite data a peer still reads, because every read of a receive buffer
 * happens before its owner's DONE, which every rank waited for. Status slots alternate by
 * generation parity (a peer can be at most one launch ahead).
 *
 * Hot-expert replicas (R guest slots, plan->S = L + R slots). Symmetric lines written by peers:
 * ready[g] (SET to the launch generation by the home of the expert guest slot g serves, once
 * it published the weights; FETCH g waits for it in the forward) and part[d][g] (SET to the
 * generation by rank d when guest slot g's weight-gradient partial is complete, or at once
 * when the slot is unused or the rank takes part without data; WSUM of a home expert waits
 * for its guests' lines). Every rank sets all of its part lines in every backward, so nothing
 * waits for a line the plan of another rank does not know about. Private: fetched[g] (the
 * generation whose weights FETCH g made ready; EXPERT tiles of slot L + g wait for it) and
 * wgrad[j] (+1 per WGRAD chunk of slot j; SLOT_DONE and WSUM wait for 2 * wchunks more).
 *
 * Failure. A lost peer or a timeout in any wait (HYPER_PARALLEL_SHMEM_TIMEOUT_SEC without
 * progress) stops every worker of the rank and returns PEER_LOST/TIMEOUT; the executor is
 * then broken (only destroy remains). Every surviving rank waits for the lost rank's DONE, so
 * every survivor notices. A local failure before the launch (e.g. allocation) is passed in
 * `local`: the rank then takes part without touching data (it signals every counter by the
 * static amounts), and every rank returns that failure.
 */
#ifndef MM_MULTICORE_MC_EXEC_H
#define MM_MULTICORE_MC_EXEC_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/status.h"

#include "multicore/mc_plan.h"
#include "multicore/worker_pool.h"
#include "ops/ep_route.h"
#include "profile/prof.h"
#include "shmem/shmem.h"

#define MM_MC_MAX_WORKERS 1024 /* the worker pool's limit */
#define MM_MC_SLOT_BYTES 256
#define MM_MC_MAX_GUESTS 4096 /* guests of one expert passed to a WSUM body */

typedef struct mm_mc_exec mm_mc_exec_t;

/* What a task body sees of its worker. */
typedef struct mm_mc_worker {
    int index;          /* pool worker index */
    int role;           /* MM_MC_CUBE / MM_MC_VECTOR (its primary queue) */
    int role_index;     /* index within its role (its trace track) */
    void *scratch;      /* worker_scratch bytes, 64-byte aligned, private to the worker */
    mm_prof_ring_t *ring; /* NULL when not recording */
    uint32_t invocation;
    int32_t task;       /* index of the running task in the graph */
} mm_mc_worker_t;

/* Runtime geometry of a DISPATCH or EXPERT tile (from the routing plan). */
typedef struct mm_mc_tile {
    int64_t j;       /* local expert (on the destination for DISPATCH) */
    int64_t e;       /* global expert */
    int peer;        /* destination (DISPATCH) or source (EXPERT) */
    int64_t row0;    /* DISPATCH: first permuted position; EXPERT: first receive row */
    int64_t rows;    /* 1..128 */
    int64_t ret_row; /* EXPERT: first row of the tile in the source's return buffer */
    int64_t dst_row; /* DISPATCH: first row of the tile in the destination's receive buffer */
} mm_mc_tile_t;

/* The math of one launch (provided by the layer). Bodies run on any worker, concurrently with
 * other bodies; a failing body returns its status with the text in megamoe_last_error(). */
typedef struct mm_mc_body {
    void *ctx;
    megamoe_status_t (*dispatch)(void *ctx, mm_mc_worker_t *w, const mm_mc_tile_t *t);
    megamoe_status_t (*expert)(void *ctx, mm_mc_worker_t *w, const mm_mc_tile_t *t);
    /* which = 1 (dW1_j, rows [m0, m1) of H) or 2 (dW2_j, rows [m0, m1) of I) */
    megamoe_status_t (*wgrad)(void *ctx, mm_mc_worker_t *w, int which, int64_t j, int64_t m0,
                              int64_t m1);
    /* tokens [t0, t1); called only when every rank's status is OK */
    megamoe_status_t (*reduce)(void *ctx, mm_mc_worker_t *w, int64_t t0, int64_t t1);
    /* hot-expert replicas (NULL when the layer has no guest slots): guest slot g serves
     * `expert` this launch (forward: its home published the weights; backward: pack NT) */
    megamoe_status_t (*fetch)(void *ctx, mm_mc_worker_t *w, int g, int64_t expert);
    /* backward: local expert j's weight gradients = its own partial + the guests' partials,
     * chunk `chunk` of `chunks`; guests[n] are the slots (d*R + g) that served j */
    megamoe_status_t (*wsum)(void *ctx, mm_mc_worker_t *w, int64_t j, int64_t chunk,
                             int64_t chunks, const int32_t *guests, int n);
    /* inference (MM_MC_INF): LOCAL task k (work on this rank's own tokens; may be NULL).
     * EXPERT_ALL tiles go to `expert` with peer -1 (rows of every source, receive order). */
    megamoe_status_t (*local)(void *ctx, mm_mc_worker_t *w, int64_t k);
} mm_mc_body_t;

typedef struct mm_mc_launch {
    int dir;                   /* MM_MC_FWD / MM_MC_BWD / MM_MC_INF (an inference plan) */
    const mm_ep_plan_t *route; /* routing plan of the call; ignored when local != OK
                                  (inference: seg_*, group_off, and blk_rows[j * EP + s] =
                                  source s's rows of local slot j, every source, equal to
                                  what that source sends: a source on another host signals
                                  only blocks with rows) */
    megamoe_status_t local;    /* failure on this rank before the launch (text: last error) */
    uint64_t tag;              /* must be equal on every rank (backward: forward generation) */
    const char *tag_what;      /* what a tag mismatch means, for the error text */
    const char *note;          /* (optional) recorded with the launch's trace invocation */
    int pull;                  /* rows reach the owner through its EXPERT tasks (they fetch
                                  them), not with the arrival signals: WGRAD2 then waits for
                                  expert j's tiles like WGRAD1 */
    mm_mc_body_t body;
} mm_mc_launch_t;

/* Symmetric line guest slot g of this rank waits on for its weights (the home sets it to the
 * generation of the launch that will fetch them: mm_mc_generation() + 1 before a forward). */
uint64_t *mm_mc_ready_line(mm_mc_exec_t *exec, int g);

/* Collective over team (symmetric allocation of the signal area, zeroed, then a barrier).
 * pool must have plan->s.cube + plan->s.vector workers; worker_scratch bytes per worker. */
megamoe_status_t mm_mc_exec_create(const mm_mc_plan_t *plan, mm_shmem_team_t *team,
                                   mm_pool_t *pool, size_t worker_scratch, mm_mc_exec_t **exec_p);
/* Collective (symmetric free); after a lost peer it only frees local memory. NULL: no-op. */
megamoe_status_t mm_mc_exec_destroy(mm_mc_exec_t *exec);
/* Without a collective (an owner torn down by one rank, e.g. after a loss): frees the host
 * memory, and the symmetric signal area where that free is local (the team is broken, or the
 * runtime is gone); on a healthy team the area stays until the heap goes. NULL: no-op. */
void mm_mc_exec_destroy_local(mm_mc_exec_t *exec);

/* Run one launch: returns when every task of this rank ran and every rank signalled DONE.
 * OK, the agreed failure (identical on every rank), or PEER_LOST / TIMEOUT (executor broken).
 * Serial use only. */
megamoe_status_t mm_mc_run(mm_mc_exec_t *exec, const mm_mc_launch_t *launch);

/* Generation of the last launch (0 before the first). */
uint64_t mm_mc_generation(const mm_mc_exec_t *exec);
/* Non-zero once a launch failed with PEER_LOST / TIMEOUT. */
int mm_mc_broken(const mm_mc_exec_t *exec);

/* Profiling: the executor's session: created at the first launch while profiling is requested
 * (MEGAMOE_PROFILE, megamoe_profiler_start), registered with the process-wide profiler,
 * retired (exported to MEGAMOE_PROFILE) when the executor is destroyed. NULL until then. */
mm_prof_session_t *mm_mc_profile(const mm_mc_exec_t *exec);

/* Stage names of the trace (index = stage of the records). */
enum {
    MM_MC_ST_DISPATCH,
    MM_MC_ST_GMM1,
    MM_MC_ST_SWIGLU,
    MM_MC_ST_GMM2,
    MM_MC_ST_COMBINE,
    MM_MC_ST_DONE,
    MM_MC_ST_REDUCE,
    MM_MC_ST_DISPATCH_GRAD,
    MM_MC_ST_GMM_DA,
    MM_MC_ST_SWIGLU_GRAD,
    MM_MC_ST_GMM_DX,
    MM_MC_ST_COMBINE_GRAD,
    MM_MC_ST_DW2,
    MM_MC_ST_DW1,
    MM_MC_ST_DONE_GRAD,
    MM_MC_ST_REDUCE_GRAD,
    MM_MC_ST_FETCH,
    MM_MC_ST_FETCH_GRAD,
    MM_MC_ST_SLOT_DONE,
    MM_MC_ST_WSUM,
    MM_MC_ST_EXPERT, /* inference: an expert tile over every source's rows (bodies stamp gmm1 ...) */
    MM_MC_ST_LOCAL,  /* inference: work on the rank's own tokens (shared experts) */
    MM_MC_STAGES
};
extern const char *const mm_mc_stage_names[MM_MC_STAGES];

/* A compute span of the running task (bodies that record their own sub-stages). */
void mm_mc_trace(mm_mc_worker_t *w, int stage, int64_t owner, int peer, uint64_t t0, uint64_t t1);

/* Tests: called after every task a worker runs, with the number of tasks this rank ran in
 * the launch so far (NULL = off). Set between launches. */
extern void (*mm_mc_test_task_hook)(int64_t tasks_run);

#endif /* MM_MULTICORE_MC_EXEC_H */
