/* A job secret broadcast over MPI under mpirun (boot_secret.h).
 *
 * MPI belongs to the program: when it initialised MPI, the secret travels on a duplicate of
 * MPI_COMM_WORLD (none of the program's own messages can match it) and MPI is left exactly
 * as it was. When it did not, MPI is initialised here for the one broadcast and finalised
 * again at once: nothing stays behind the program's back (no atexit handler, no MPI state
 * after megamoe_comm_create returns); later lifecycles of the runtime in this process reuse
 * the secret. Rank 0 broadcasts a failure too (an empty secret with the reason), so no rank
 * waits in the broadcast for a secret that never comes. */
#include "boot_secret.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/env.h"
#include "shmem_log.h"

int mm_boot_mpi_test_fail_random;

#ifdef MEGAMOE_HAVE_MPI
#include <mpi.h>

/* The secret of this process's first broadcast (only when MPI was ours and is gone). */
static char mm_mpi_cached[65];

/* What rank 0 broadcasts: ok, then the secret or the reason it could not draw one. */
typedef struct mm_mpi_secret_msg {
    char ok;
    char text[191];
} mm_mpi_secret_msg_t;

static void mm_mpi_draw(mm_mpi_secret_msg_t *m)
{
    unsigned char raw[32];
    ssize_t got = mm_boot_mpi_test_fail_random ? (errno = EIO, -1)
                                                : getrandom(raw, sizeof raw, 0);
    if (got != (ssize_t)sizeof raw) {
        snprintf(m->text, sizeof m->text, "getrandom: %s",
                 got < 0 ? strerror(errno) : "short read");
        return;
    }
    for (int i = 0; i < 32; i++) snprintf(m->text + 2 * i, 3, "%02x", raw[i]);
    m->ok = 1;
}

megamoe_status_t mm_boot_mpi_secret(char *out, size_t cap)
{
    if (!mm_env_is_set(MM_ENV_OMPI_SIZE)) return MEGAMOE_NOT_FOUND;
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (fin || (!inited && mm_mpi_cached[0])) {
        if (!mm_mpi_cached[0]) return MEGAMOE_NOT_FOUND; /* the program finalised MPI */
        snprintf(out, cap, "%s", mm_mpi_cached);
        return MEGAMOE_OK;
    }
    const int ours = !inited;
    if (ours) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS)
            return mm_error(MEGAMOE_IO, "under mpirun, MPI_Init_thread failed while fetching "
                            "the job secret; set MEGAMOE_JOB_TOKEN on every rank instead");
    }
    MPI_Comm comm = MPI_COMM_NULL;
    megamoe_status_t st = MEGAMOE_OK;
    mm_mpi_secret_msg_t m;
    memset(&m, 0, sizeof m);
    if (MPI_Comm_dup(MPI_COMM_WORLD, &comm) != MPI_SUCCESS) {
        st = mm_error(MEGAMOE_IO, "under mpirun, MPI_Comm_dup(MPI_COMM_WORLD) failed while "
                      "fetching the job secret; set MEGAMOE_JOB_TOKEN on every rank instead");
    } else {
        int rank = 0;
        MPI_Comm_rank(comm, &rank);
        if (rank == 0) mm_mpi_draw(&m);
        if (MPI_Bcast(&m, (int)sizeof m, MPI_CHAR, 0, comm) != MPI_SUCCESS)
            st = mm_error(MEGAMOE_IO, "under mpirun, broadcasting the job secret failed; set "
                          "MEGAMOE_JOB_TOKEN on every rank instead");
        else if (!m.ok)
            st = mm_error(MEGAMOE_IO, "MPI rank 0 could not draw the job secret (%.*s); set "
                          "the same MEGAMOE_JOB_TOKEN on every rank instead",
                          (int)sizeof m.text, m.text);
        MPI_Comm_free(&comm);
    }
    if (ours) { /* the broadcast was all MPI was needed for */
        if (st == MEGAMOE_OK) memcpy(mm_mpi_cached, m.text, 64); /* 64 hex digits */
        MPI_Finalize();
    }
    if (st != MEGAMOE_OK) return st;
    m.text[sizeof m.text - 1] = '\0';
    snprintf(out, cap, "%s", m.text);
    return MEGAMOE_OK;
}
#else
megamoe_status_t mm_boot_mpi_secret(char *out, size_t cap)
{
    (void)out;
    (void)cap;
    return MEGAMOE_NOT_FOUND;
}
#endif
