/* megamoe — communicator.
 *
 * A communicator is a group of ranks (processes) that run one job together, on one host or
 * several. The first communicator of a process starts the private symmetric-memory runtime
 * underneath (bootstrap over TCP, a heap per rank: shared with the ranks of the same host,
 * reached through the inter-host engine (UCX) from the others); it stops when the last
 * communicator is destroyed. Creating, splitting, barriers and destroying are collective:
 * every rank of the (parent) communicator calls them in the same order — except
 * megamoe_comm_create_group, which only the listed ranks call.
 *
 * Settings come from the parameters, else from the environment (docs/env.md):
 * RANK/WORLD_SIZE (or Open MPI's variables), HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT,
 * HYPER_PARALLEL_SHMEM_HEAP_SIZE, HYPER_PARALLEL_SHMEM_TIMEOUT_SEC, MEGAMOE_JOB_TOKEN /
 * MEGAMOE_JOB_TOKEN_FILE.
 */
#ifndef MEGAMOE_COMM_H
#define MEGAMOE_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "megamoe/export.h"
#include "megamoe/status.h"

#ifdef __cplusplus
extern "C" {
#endif
MEGAMOE_API_BEGIN

typedef struct megamoe_comm megamoe_comm_t;

typedef struct megamoe_comm_params {
    size_t struct_size; /* set by megamoe_comm_params_default(): the caller's sizeof (megamoe/version.h) */
    int rank;             /* -1: from the environment */
    int world_size;       /* -1: from the environment */
    const char *endpoint; /* NULL: HYPER_PARALLEL_SHMEM_BOOTSTRAP_ENDPOINT ("tcp://host:port") */
    uint64_t heap_size;   /* 0: HYPER_PARALLEL_SHMEM_HEAP_SIZE (bytes per rank) */
    int timeout_sec;      /* 0: HYPER_PARALLEL_SHMEM_TIMEOUT_SEC */
    /* NULL: MEGAMOE_JOB_TOKEN, else MEGAMOE_JOB_TOKEN_FILE, else (under mpirun) a secret
     * broadcast over MPI. The same secret on every rank; required when the endpoint is not a
     * loopback address (unless MEGAMOE_BOOTSTRAP_INSECURE=1). Not kept after start-up. */
    const char *job_token;
} megamoe_comm_params_t;

/* All fields "from the environment" (extensible struct: megamoe/version.h). */
megamoe_status_t megamoe_comm_params_init(megamoe_comm_params_t *p, size_t struct_size);
static inline megamoe_comm_params_t megamoe_comm_params_default(void)
{
    megamoe_comm_params_t v;
    megamoe_comm_params_init(&v, sizeof v);
    return v;
}

/* Communicator of all ranks of the job (NULL params = defaults). While another communicator
 * is alive in the process the params must be defaults or equal to the running ones. */
megamoe_status_t megamoe_comm_create(const megamoe_comm_params_t *params,
                                     megamoe_comm_t **comm_p);

/* Ranks of parent with the same color >= 0 form a new communicator ordered by (key, parent
 * rank); color < 0 gives *comm_p = NULL. Collective over parent. */
megamoe_status_t megamoe_comm_split(megamoe_comm_t *parent, int color, int key,
                                    megamoe_comm_t **comm_p);

/* A communicator of the listed ranks of parent (n >= 1, distinct, in the new rank order),
 * collective over exactly those ranks: ranks of parent outside the list never call it (an
 * expert-parallel group of 2 in a world of 4 is made by its 2 members only). Every member
 * passes the same list (else CONFIG_MISMATCH on every member); the caller must be in it. */
megamoe_status_t megamoe_comm_create_group(megamoe_comm_t *parent, const int *ranks, int n,
                                           megamoe_comm_t **comm_p);

/* World rank (rank in the communicator of megamoe_comm_create) of rank i of comm, -1 when out
 * of range. */
int megamoe_comm_world_rank(const megamoe_comm_t *comm, int i);

/* Number of hosts the communicator's ranks run on, and the host of its rank i (hosts are
 * numbered by their lowest world rank; ranks of one host share memory). -1 on bad input. */
int megamoe_comm_num_hosts(const megamoe_comm_t *comm);
int megamoe_comm_host_of(const megamoe_comm_t *comm, int i);

/* Rank of the caller in comm and the number of ranks (-1 for a NULL or dead handle). */
int megamoe_comm_rank(const megamoe_comm_t *comm);
int megamoe_comm_size(const megamoe_comm_t *comm);

/* Returns when every rank of comm has entered; TIMEOUT / PEER_LOST instead of hanging. */
megamoe_status_t megamoe_comm_barrier(megamoe_comm_t *comm);

/* Collective. The last destroy in the process stops the runtime, which fails (INVALID_STATE,
 * naming them) while objects built on it are still alive; then comm stays valid so the caller
 * can free them and call destroy again. NULL is a no-op. */
megamoe_status_t megamoe_comm_destroy(megamoe_comm_t *comm);

/* ---- surviving a lost rank (docs/reliability.md) ------------------------------------------
 * When a rank dies or its host is cut off, the calls in flight fail with PEER_LOST on every
 * survivor, and the survivors agree among themselves (no rank is special) on who is gone. A
 * communicator holding a lost rank is broken: its collectives fail with PEER_LOST; destroy it
 * (local) and go on with the survivors. */

/* 1 while rank i of comm is not known lost here, 0 once it is (or for a bad i). Local. */
int megamoe_comm_rank_alive(const megamoe_comm_t *comm, int i);

/* A communicator of the ranks of comm still alive, in comm's order, collective over them (the
 * lost ones cannot take part). It waits until the survivors agreed on who is gone; PEER_LOST
 * on a rank that is out (declared lost by the others, or on the smaller side of a partition:
 * that side stops). comm itself stays broken. */
megamoe_status_t megamoe_comm_survivors(megamoe_comm_t *comm, megamoe_comm_t **survivors_p);

MEGAMOE_API_END
#ifdef __cplusplus
}
#endif

#endif /* MEGAMOE_COMM_H */
