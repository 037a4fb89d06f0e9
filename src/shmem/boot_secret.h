/* The bootstrap's job secret: where it comes from and when one is required.
 *
 * Threat model (docs/shmem.md): rank 0 listens on the bootstrap endpoint; any process that can
 * reach it and completes the handshake is admitted as a rank and then reads and writes every
 * rank's heap. On loopback only processes of this host can reach the port; on any other
 * address the ranks must prove a shared secret (HMAC challenge-response, bootstrap.c), so
 * without one the runtime refuses to start unless the user opts out explicitly.
 */
#ifndef MM_SHMEM_BOOT_SECRET_H
#define MM_SHMEM_BOOT_SECRET_H

#include <stddef.h>

#include "megamoe/status.h"

#include "boot_net.h"

#define MM_SECRET_MAX 1024

typedef enum mm_secret_source {
    MM_SECRET_NONE = 0,
    MM_SECRET_PARAM,    /* the API's job_token parameter (the Python binding under torch) */
    MM_SECRET_ENV,      /* MEGAMOE_JOB_TOKEN (megamoe launch sets it) */
    MM_SECRET_FILE,     /* MEGAMOE_JOB_TOKEN_FILE */
    MM_SECRET_MPI       /* broadcast over MPI_COMM_WORLD under mpirun */
} mm_secret_source_t;

const char *mm_secret_source_name(mm_secret_source_t s);

/* Resolve the secret (param, then MEGAMOE_JOB_TOKEN, then MEGAMOE_JOB_TOKEN_FILE, then MPI
 * when launched by mpirun) into out, and decide: a world of one needs none; a loopback
 * endpoint works without one (logged); any other endpoint without one is INVALID_ARGUMENT
 * naming the fixes, unless MEGAMOE_BOOTSTRAP_INSECURE=1 (then a warning on every rank). */
megamoe_status_t mm_boot_secret_resolve(const char *param, const mm_endpoint_t *ep, int world,
                                        char *out, size_t cap, mm_secret_source_t *src_p);

/* Under mpirun (Open MPI's OMPI_COMM_WORLD_SIZE set): a fresh random secret from MPI rank 0,
 * broadcast to every rank (boot_mpi.c: on a duplicate of the program's MPI_COMM_WORLD; when the
 * program has not initialised MPI, MPI is initialised for the broadcast and finalised at once,
 * and later lifecycles reuse that secret). IO on every rank when rank 0 cannot draw one.
 * NOT_FOUND when not under mpirun, after the program finalised MPI, or built without MPI. */
megamoe_status_t mm_boot_mpi_secret(char *out, size_t cap);
/* Test seam: nonzero makes rank 0's draw of the secret fail (as a failing getrandom). */
extern int mm_boot_mpi_test_fail_random;

#endif /* MM_SHMEM_BOOT_SECRET_H */
