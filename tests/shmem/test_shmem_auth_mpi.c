/* The job secret under mpirun (run by `megamoe launch --hosts 2 --mpirun -n 2`): without
 * MEGAMOE_JOB_TOKEN, rank 0 of MPI_COMM_WORLD draws the secret and broadcasts it over MPI before
 * the bootstrap, so the job starts across the hosts (non-loopback endpoint) with no user work. */
#include <stdio.h>

#include "shmem_test_util.h"

static mm_t_log_t mm_log = {.lock = PTHREAD_MUTEX_INITIALIZER};

MM_TEST(secret_arrives_over_mpi)
{
    ASSERT_TRUE(getenv("OMPI_COMM_WORLD_SIZE") != NULL); /* started by mpirun */
    unsetenv("MEGAMOE_JOB_TOKEN");
    setenv("HYPER_PARALLEL_SHMEM_LOG_LEVEL", "1", 1);
    megamoe_log_set_callback(mm_t_log_sink, &mm_log);
    mm_t_two_host_job();
    megamoe_log_set_callback(NULL, NULL);
    ASSERT_TRUE(mm_t_log_has(&mm_log, "(job secret: MPI (mpirun))"));
}
