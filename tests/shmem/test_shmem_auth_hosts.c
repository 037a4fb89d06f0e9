/* The bootstrap across simulated hosts (run under `megamoe launch --hosts 2 -n 2`): rank 0
 * listens on host 0's address,
 * which is not a loopback address, so a job secret is required.
 *
 *  impostor_is_refused_and_the_job_completes: before the real rank 1 joins, a process on
 *    host 1 that speaks the protocol but holds the wrong secret (and one with none) claims
 *    rank 1; rank 0 refuses both with a logged reason, then the job starts and moves data.
 *  no_secret_is_refused_on_every_rank / opt_out_warns_on_every_rank: without a secret the
 *    start is refused before any connection; MEGAMOE_BOOTSTRAP_INSECURE=1 starts and warns.
 * test_shmem_auth_mpi.c is the mpirun path.
 */
#include <stdio.h>
#include <sys/wait.h>

#include "shmem_test_util.h"

static mm_t_log_t mm_log = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int mm_rank(void)
{
    const char *r = getenv("RANK");
    if (r == NULL) r = getenv("OMPI_COMM_WORLD_RANK");
    return r ? atoi(r) : -1;
}

/* A process on this host claiming rank 1 with the given secret ("" = none, which a
 * non-loopback endpoint refuses locally, so it goes through the insecure opt-out). */
static int mm_impostor(const char *secret)
{
    pid_t pid = fork();
    if (pid == 0) {
        mm_shmem_params_t p = mm_t_params();
        p.rank = 1;
        p.world_size = 2;
        p.timeout_sec = 5;
        if (*secret) p.job_token = secret;
        else setenv("MEGAMOE_BOOTSTRAP_INSECURE", "1", 1);
        unsetenv("MEGAMOE_JOB_TOKEN");
        megamoe_status_t st = mm_shmem_acquire(&p);
        int refused = st != MEGAMOE_OK && strstr(megamoe_last_error(), "rejected this process");
        fprintf(stderr, "impostor (%s): %s: %s\n", *secret ? "wrong secret" : "no secret",
                megamoe_status_name(st), megamoe_last_error());
        _exit(refused ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
}

MM_TEST(impostor_is_refused_and_the_job_completes)
{
    int me = mm_rank();
    if (me == 0) megamoe_log_set_callback(mm_t_log_sink, &mm_log);
    if (me == 1) {
        ASSERT_EQ_INT(mm_impostor("not-the-job-secret"), 0);
        ASSERT_EQ_INT(mm_impostor(""), 0);
    }
    mm_t_two_host_job();
    if (me == 0) {
        megamoe_log_set_callback(NULL, NULL);
        ASSERT_TRUE(mm_t_log_has(&mm_log, "authentication failed: the peer does not hold this "
                                          "job's MEGAMOE_JOB_TOKEN"));
        ASSERT_TRUE(mm_t_log_has(&mm_log, "closed connection from 10."));
    }
}

MM_TEST(no_secret_is_refused_on_every_rank)
{
    char *saved = strdup(getenv("MEGAMOE_JOB_TOKEN") ? getenv("MEGAMOE_JOB_TOKEN") : "");
    unsetenv("MEGAMOE_JOB_TOKEN");
    mm_shmem_params_t p = mm_t_params();
    ASSERT_STATUS(mm_shmem_acquire(&p), MEGAMOE_INVALID_ARGUMENT);
    ASSERT_CONTAINS(megamoe_last_error(), "is not a loopback address, and no job secret");
    setenv("MEGAMOE_JOB_TOKEN", saved, 1);
    free(saved);
}

MM_TEST(opt_out_warns_on_every_rank)
{
    char *saved = strdup(getenv("MEGAMOE_JOB_TOKEN") ? getenv("MEGAMOE_JOB_TOKEN") : "");
    unsetenv("MEGAMOE_JOB_TOKEN");
    setenv("MEGAMOE_BOOTSTRAP_INSECURE", "1", 1);
    megamoe_log_set_callback(mm_t_log_sink, &mm_log);
    mm_t_two_host_job();
    megamoe_log_set_callback(NULL, NULL);
    ASSERT_TRUE(mm_t_log_has(&mm_log, "MEGAMOE_BOOTSTRAP_INSECURE=1: the bootstrap at tcp://10."));
    unsetenv("MEGAMOE_BOOTSTRAP_INSECURE");
    setenv("MEGAMOE_JOB_TOKEN", saved, 1);
    free(saved);
}

