/* A job secret broadcast over MPI under mpirun (boot_secret.h). */
#include "boot_secret.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/env.h"
#include "shmem_log.h"

#ifdef MEGAMOE_HAVE_MPI
#include <mpi.h>

static void mm_mpi_finalize_at_exit(void)
{
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

megamoe_status_t mm_boot_mpi_secret(char *out, size_t cap)
{
    if (!mm_env_is_set(MM_ENV_OMPI_SIZE)) return MEGAMOE_NOT_FOUND;
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (fin) return MEGAMOE_NOT_FOUND;
    if (!inited) {
        /* The program did not initialise MPI: do it (it may still call MPI itself after this,
         * with MPI_Initialized true), and finalise it at exit so mpirun sees a clean end. */
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return mm_error(MEGAMOE_IO, "under mpirun, MPI_Init_thread failed while fetching "
                            "the job secret; set MEGAMOE_JOB_TOKEN on every rank instead");
        atexit(mm_mpi_finalize_at_exit);
    }
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char secret[65] = "";
    if (rank == 0) {
        unsigned char raw[32];
        if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
            return mm_error(MEGAMOE_IO, "getrandom failed for the job secret");
        for (int i = 0; i < 32; i++) snprintf(secret + 2 * i, 3, "%02x", raw[i]);
    }
    if (MPI_Bcast(secret, sizeof secret, MPI_CHAR, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        return mm_error(MEGAMOE_IO, "under mpirun, broadcasting the job secret over "
                        "MPI_COMM_WORLD failed; set MEGAMOE_JOB_TOKEN on every rank instead");
    secret[64] = '\0';
    snprintf(out, cap, "%s", secret);
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
