/* Surviving a lost peer: who is gone, agreed by the survivors without any fixed coordinator
 * (rank 0 may be the one lost), and the view the survivors go on with (docs/shmem.md
 * "Surviving a lost rank").
 *
 * A loss is first an observation of one PE: a same-host peer's pidfd (the process is dead), a
 * closed bootstrap connection, an inter-host engine error, or heartbeats from a peer on
 * another host that stopped for MEGAMOE_SHMEM_PEER_TIMEOUT_MS (a cut or a dead host). From that
 * moment every wait and collective of this PE fails with PEER_LOST (the calls in flight), and
 * the monitor thread (liveness.c) tells every other PE (a report word per lost PE in every
 * segment, so a loss one PE sees reaches all) and takes part in the agreement: every PE posts
 * a digest of the set of lost PEs it knows into the segment of every PE it believes alive;
 * once every PE it believes alive posted the same digest, the set is decided. Losses only
 * grow, so the sets converge; a PE that decided and then learns of another loss decides again.
 *
 * The decided set splits the world: a side keeps serving only with more than half of the
 * ranks not known dead (a process whose death was seen — pidfd, a connection closed by the
 * peer's kernel — does not count), or exactly half including the lowest of them; the other
 * side (a host cut off, a PE others could not hear) stops: every later call on it is
 * PEER_LOST. Two sides can never both keep serving.
 *
 * The next collective on a survivor acknowledges the decided set (mm_surv_recover: it waits
 * for the decision covering every loss known here, then installs it): from then on waits no
 * longer fail for those PEs, teams that include one are broken (their collectives fail, they
 * can only be destroyed, their symmetric allocations are freed locally), and the lost PE's
 * mapping and connection are released.
 */
#ifndef MM_SHMEM_SURVIVE_H
#define MM_SHMEM_SURVIVE_H

#include <stdint.h>

#include "megamoe/status.h"

/* Kinds of a loss, in the order of certainty (a later observation only raises it). */
enum { MM_LOSS_NONE = 0, MM_LOSS_UNREACHABLE = 1, MM_LOSS_DEAD = 2 };

/* Lifecycle: state for n PEs of which this is me (start-up, before the engine starts); free
 * it at teardown. */
megamoe_status_t mm_surv_init(int n, int me);
void mm_surv_fini(void);

/* A loss of pe seen here (any thread, also inside UCX callbacks: it only records and wakes the
 * monitor). kind: MM_LOSS_UNREACHABLE / MM_LOSS_DEAD. */
void mm_surv_observe(int pe, int kind, const char *why);
/* The monitor's periodic work: reports of other PEs, heartbeats to peers on other hosts,
 * telling the others, the agreement. And how long it may sleep before the next tick. */
void mm_surv_tick(void);
int mm_surv_tick_ms(void);
/* Wake the monitor now (a new observation). Set by liveness.c: its eventfd. */
void mm_surv_set_kick(void (*kick)(void));

/* OK while no loss is pending here; else PEER_LOST naming the loss and `what` (a loss seen but
 * not acknowledged yet, or this PE stopped). */
megamoe_status_t mm_surv_check(const char *what);
/* Acknowledge every loss known here (see the file comment): OK when this PE serves on,
 * PEER_LOST when it is out (declared lost, or on the side that stops), TIMEOUT when the
 * survivors did not agree within HYPER_PARALLEL_SHMEM_TIMEOUT_SEC. Fast when nothing is
 * pending. */
megamoe_status_t mm_surv_recover(const char *what);
/* A PE with a pending loss (lowest), or when this PE stopped the first lost one; -1 when
 * nothing is pending. */
int mm_surv_pending_pe(void);
/* 1 when any PE was lost in this lifecycle (acknowledged or not); how many. */
int mm_surv_any_lost(void);
int mm_surv_lost_count(void);
/* 1 when this PE stopped (every later call fails). */
int mm_surv_stopped(void);
/* 1 when pe is in the installed view's lost set (acknowledged). */
int mm_surv_retired(int pe);
/* Kind of pe's loss as known here (MM_LOSS_*). */
int mm_surv_kind(int pe);
/* Installs so far (a wait that started in another view fails). */
uint64_t mm_surv_view_gen(void);
/* Number of PEs in the installed lost set: the tag of point-to-point messages (mailbox.c), so
 * a message of an exchange that failed before a loss is told apart from the current one. */
uint64_t mm_surv_view_tag(void);
/* The detection time of a silent peer (MEGAMOE_SHMEM_PEER_TIMEOUT_MS) in ns. */
uint64_t mm_surv_peer_timeout_ns(void);

/* Offsets, in every PE's segment, of the words other PEs write (shmem_internal.h layout). */
uint64_t mm_surv_report_off(int q);
uint64_t mm_surv_heartbeat_off(int p);
uint64_t mm_surv_proposal_off(int p);

#endif /* MM_SHMEM_SURVIVE_H */
