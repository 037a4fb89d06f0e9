/* Hot-expert replica planner: from the count matrix every rank already exchanged, decide which
 * hot experts get guest copies on which ranks and how every source's rows of such an expert
 * split between its home and its guests (docs/moe.md "Load balance: hot-expert replicas").
 *
 * Model. Rank d owns (is the home of) experts d*L .. d*L+L-1 and has R guest slots; a guest
 * slot serves one expert of another rank for the call. A rank's load is the number of rows it
 * computes (home rows kept plus guest rows, forward and backward cost the same per row) plus
 * fixed costs in row units: a guest slot costs its rank `guest_rows` (fetching and packing
 * the weights, returning an fp32 weight-gradient partial), and every guest costs the expert's
 * home `home_rows` (adding that partial in). Both are larger when home and guest are on
 * different hosts (the weights and the partial cross the network): index [1] of the cost
 * pairs, chosen through the host map.
 *
 * Plan. Greedy and deterministic (integers only, ties broken by the lowest index): while the
 * most loaded rank h can be relieved, take the move that lowers max(load_h, load_d) the most
 * among (hot expert e of h with rows left at home, rank d != h that already hosts e or has a
 * free slot): m rows of e move from h to d, m chosen to equalise the two loads but never
 * filling d beyond the mean load (so the receivers of a very hot rank share it instead of
 * the first one taking half), at most e's home rows, at most what d's receive capacity
 * allows, and at least `min_rows` (a move below one tile is not worth its fixed cost). Guest
 * slots are filled in index order. Balanced loads never move anything (every move costs more
 * than it gains).
 *
 * Row split. For an expert with guests, each part (home first, then its guest slots in slot
 * order) takes its quota from the sources: first the rows of its own rank (no transfer), then
 * rows of sources on its own host, then any, sources in ascending order. A source's rows of
 * the expert stay contiguous in its permuted order: the home's share first, then each guest
 * slot's share in slot order.
 *
 * Every rank runs the planner on the same gathered matrix, so every rank derives the same plan
 * (nothing depends on the calling rank). */
#ifndef MM_OPS_EP_REPLICAS_H
#define MM_OPS_EP_REPLICAS_H

#include <stdint.h>

#include "megamoe/status.h"

/* Fixed costs in rows ([0] home and guest on one host, [1] on different hosts). */
typedef struct mm_ep_replica_cost {
    int64_t guest_rows[2]; /* charged to the guest's rank for each slot it fills */
    int64_t home_rows[2];  /* charged to the home for each guest of one of its experts */
    int64_t min_rows;      /* the smallest share worth moving */
} mm_ep_replica_cost_t;

/* Defaults (docs/moe.md): one row of forward + backward is 18 H I flops and an expert's
 * weights are 6 H I bytes, so these costs do not depend on H and I, only on the machine's
 * flops per byte. Measured at the large shape (H=2048, I=1024; ~85 us per row): a guest
 * copying and packing new weights (once per weight version, i.e. per training step) 13-20 ms
 * = 150-210 rows, ~0 while they do not change: 128; the home adding one fp32 partial 2.5-3 ms
 * = 30-35 rows, plus its fp32 weight-gradient writes: 64. Across hosts (~2.5 GB/s) the
 * weights cost ~64 rows more to move and the fp32 partial ~128. */
mm_ep_replica_cost_t mm_ep_replica_cost_default(void);

typedef struct mm_ep_replica_input {
    int ep;                 /* ranks */
    int64_t E;              /* global experts, a multiple of ep */
    int R;                  /* guest slots per rank (>= 1) */
    const int32_t *counts;  /* [ep * E]: rows source s routes to expert e (counts[s*E + e]) */
    const int32_t *host_of; /* [ep] host index of each rank; NULL = all on one host */
    int64_t capacity;       /* rows a rank can receive (its receive buffer); <= 0: no limit */
    mm_ep_replica_cost_t cost;
} mm_ep_replica_input_t;

typedef struct mm_ep_replica_plan {
    int ep, R;
    int64_t E, L;
    int32_t *slot_expert; /* [ep * R]: expert served by guest slot (d, g), index d*R + g; -1 free */
    int32_t *take;        /* [ep * ep * R]: rows source s sends to slot (d, g): take[s*ep*R + d*R + g] */
    int64_t *load_plain;  /* [ep]: rows each rank computes without replicas */
    int64_t *load;        /* [ep]: rows each rank computes (= receives) with the plan */
    int64_t rows_moved;   /* rows computed by guests */
    int n_guests;         /* guest slots in use */
    /* scratch of mm_ep_replica_plan (allocated here, so planning itself cannot fail on one
     * rank only) */
    int64_t *w_home, *w_eff, *w_slot_rows, *w_left, *w_quota;
    int32_t *w_parts;
} mm_ep_replica_plan_t;

/* Allocate a plan for ep ranks, E experts and R slots (INVALID_ARGUMENT on bad shapes). */
megamoe_status_t mm_ep_replica_plan_create(int ep, int64_t E, int R, mm_ep_replica_plan_t **plan_p);
void mm_ep_replica_plan_destroy(mm_ep_replica_plan_t *plan);

/* Compute the plan for in (its ep/E/R must be the plan's). Pure: the same input gives the same
 * plan bit for bit. */
megamoe_status_t mm_ep_replica_plan(const mm_ep_replica_input_t *in, mm_ep_replica_plan_t *plan);

/* Rows source s keeps at the home of expert e under the plan. */
int64_t mm_ep_replica_home_rows(const mm_ep_replica_plan_t *plan, const int32_t *counts, int s,
                                int64_t e);
/* Guest slots (index d*R + g) hosting expert e, in slot order, into out[] (room for ep*R);
 * returns how many. */
int mm_ep_replica_guests_of(const mm_ep_replica_plan_t *plan, int64_t e, int32_t *out);

#endif /* MM_OPS_EP_REPLICAS_H */
