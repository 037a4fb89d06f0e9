/* The job secret under mpirun (run by `megamoe launch --hosts 2 --mpirun -n 2`, one case per
 * launch): without MEGAMOE_JOB_TOKEN, rank 0 of MPI_COMM_WORLD draws the secret and broadcasts
 * it over MPI before the bootstrap, so the job starts across the hosts (non-loopback
 * endpoint) with no user work; MPI stays the program's:
 *  - a program that never initialised MPI finds it finalised again when the runtime has
 *    started (no handler left for exit), and a second lifecycle reuses the secret;
 *  - a program that initialised MPI finds it as it was (still usable, not finalised);
 *  - when rank 0 cannot draw a secret, every rank fails with that reason (no rank waits in the
 *    broadcast). */
#include <mpi.h>
#include <stdio.h>

#include "shmem/boot_secret.h"
#include "shmem_test_util.h"

static mm_t_log_t mm_log = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void mm_setup(void)
{
    unsetenv("MEGAMOE_JOB_TOKEN");
    unsetenv("MEGAMOE_JOB_TOKEN_FILE");
    setenv("HYPER_PARALLEL_SHMEM_LOG_LEVEL", "1", 1);
}

MM_TEST(secret_arrives_over_mpi_and_mpi_is_not_left_initialised)
{
    ASSERT_TRUE(getenv("OMPI_COMM_WORLD_SIZE") != NULL); /* started by mpirun */
    mm_setup();
    megamoe_log_set_callback(mm_t_log_sink, &mm_log);
    mm_t_two_host_job();
    megamoe_log_set_callback(NULL, NULL);
    ASSERT_TRUE(mm_t_log_has(&mm_log, "(job secret: MPI (mpirun))"));
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    ASSERT_TRUE(inited && fin); /* used for the broadcast, finalised at once */
    mm_t_two_host_job();        /* a new lifecycle: the same secret, no MPI needed */
}

MM_TEST(mpi_initialised_by_the_program_is_left_to_it)
{
    ASSERT_TRUE(getenv("OMPI_COMM_WORLD_SIZE") != NULL);
    mm_setup();
    int provided = 0;
    ASSERT_EQ_INT(MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided), MPI_SUCCESS);
    megamoe_log_set_callback(mm_t_log_sink, &mm_log);
    mm_t_two_host_job();
    megamoe_log_set_callback(NULL, NULL);
    ASSERT_TRUE(mm_t_log_has(&mm_log, "(job secret: MPI (mpirun))"));
    int fin = 1;
    MPI_Finalized(&fin);
    ASSERT_EQ_INT(fin, 0);
    int one = 1, sum = 0; /* still the program's, and still working */
    ASSERT_EQ_INT(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD), MPI_SUCCESS);
    ASSERT_EQ_INT(sum, 2);
    ASSERT_EQ_INT(MPI_Finalize(), MPI_SUCCESS);
}

MM_TEST(no_rank_waits_when_rank_0_cannot_draw_the_secret)
{
    ASSERT_TRUE(getenv("OMPI_COMM_WORLD_SIZE") != NULL);
    mm_setup();
    if (atoi(getenv("OMPI_COMM_WORLD_RANK")) == 0) mm_boot_mpi_test_fail_random = 1;
    megamoe_log_set_level(MEGAMOE_LOG_OFF);
    mm_shmem_params_t p = mm_t_params();
    ASSERT_STATUS(mm_shmem_acquire(&p), MEGAMOE_IO);
    megamoe_log_set_level(MEGAMOE_LOG_WARN);
    ASSERT_CONTAINS(megamoe_last_error(), "could not draw the job secret (getrandom");
}
